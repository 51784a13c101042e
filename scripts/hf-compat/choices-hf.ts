/**
 * Compares distillery's multiple-choice scoring (`eval --choices`, src/eval/choices.ts) with what hf-choices.py
 * recorded from transformers and lm-evaluation-harness's rules, for each of its model folders (`model`: Qwen Instruct's
 * special tokens, no BOS; `model-bos`: a tokenizer that adds a BOS, as Llama 3's does): every continuation's context and
 * continuation token ids (the ChoiceEncoder over the folder's tokenizer.json and tokenizer_config.json), every
 * log-likelihood (fp32: relative error ≤ 1e-4; bf16 on CUDA: ≤ 3e-2, the documented bound of bf16 logits) and the
 * predictions behind acc and acc_norm (fp32: identical), through `evaluate` as the CLI runs it, on the CPU backend and,
 * when a GPU is present, the CUDA backend in fp32 and bf16; then the loglikelihood items (`"continuation"`): their split,
 * log-likelihoods, is_greedy (fp32: identical wherever the top-2 logit gap exceeds NEAR_TIE), acc and perplexity; then
 * the text items (`"text"`): their rolling windows' tokens, each text's summed log-likelihood and the word and byte
 * perplexities and bits per byte.
 * Prints one line per check and exits 1 if any fails.
 *
 * Usage: node dist/scripts/hf-compat/choices-hf.js <dir written by hf-choices.py> [--no-cuda]
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { evaluate } from '../../src/cli/commands/eval.js';
import { createBackend } from '../../src/backend/create.js';
import { readCheckpoint } from '../../src/model/checkpoint.js';
import { chatFormatOf } from '../../src/tokenizer/chat.js';
import { readChoiceItems } from '../../src/eval/items.js';
import { ChoiceEncoder, encodeForModel } from '../../src/eval/encode.js';

interface Row { item: number; choice: number; ctx: number[]; cont: number[]; loglik: number; cut: boolean }
interface Recorded {
  transformers: string; seq: number; delimiter: string; prefix: number; rows: Row[];
  results: Array<{ logliks: number[]; pred: number; pred_norm: number }>; acc: number; acc_norm: number;
  cont: { rows: Array<{ ctx: number[]; cont: number[]; loglik: number; greedy: boolean; margin: number }>; acc: number; perplexity: number };
  text: { rows: Array<{ windows: Array<[number[], number[]]>; loglik: number; words: number; bytes: number }>; word_perplexity: number; byte_perplexity: number; bits_per_byte: number };
}
interface Sample { logliks: number[]; pred: number; pred_norm: number }
interface ContSample { loglik: number; greedy: boolean }
/** Below this top-1/top-2 logit gap a position's argmax may flip between two correct float32 implementations. */
const NEAR_TIE = 1e-3;

async function main(): Promise<number> {
  const root = process.argv[2];
  if (!root) { process.stderr.write('usage: node dist/scripts/hf-compat/choices-hf.js <dir> [--no-cuda]\n'); return 2; }
  const itemsFile = path.join(root, 'items.jsonl');
  const items = readChoiceItems([itemsFile]);
  let failed = 0;
  const fail = (msg: string): void => { failed++; process.stdout.write(`FAIL ${msg}\n`); };
  const devices: Array<['cpu' | 'cuda', 'fp32' | 'bf16', number]> = [['cpu', 'fp32', 1e-4]];
  if (!process.argv.includes('--no-cuda')) {
    try { (await createBackend({ device: 'cuda' })).dispose(); devices.push(['cuda', 'fp32', 1e-4], ['cuda', 'bf16', 3e-2]); } catch (e) {
      process.stdout.write(`cuda  skipped (${(e as Error).message.split('\n')[0]})\n`);
    }
  }
  for (const name of ['model', 'model-bos']) {
    const rec = JSON.parse(fs.readFileSync(path.join(root, `${name}.transformers.json`), 'utf8')) as Recorded;
    const model = path.join(root, name);
    // The split into tokens: distillery's ChoiceEncoder against transformers' tokenizer and the harness's rules.
    const ck = readCheckpoint(model);
    const format = chatFormatOf(ck.chatTemplate, name, ck.tokenizerConfig);
    const enc = new ChoiceEncoder(ck.tokenizer!, format);
    const ours = encodeForModel(ck.tokenizer!, format, items, { chat: false, delimiter: rec.delimiter });
    let same = 0;
    rec.rows.forEach((r, i) => {
      const got = ours[i]!;
      if (got.item === r.item && got.choice === r.choice && JSON.stringify(got.ctx) === JSON.stringify(r.ctx) && JSON.stringify(got.cont) === JSON.stringify(r.cont)) same++;
      else fail(`${name} item ${r.item} choice ${r.choice}: tokens ${JSON.stringify({ ctx: got.ctx, cont: got.cont })} against transformers' ${JSON.stringify({ ctx: r.ctx, cont: r.cont })}`);
    });
    const prefix = enc.prefixToken()?.id;
    if (prefix !== rec.prefix) fail(`${name}: prefix token ${prefix} against the harness's ${rec.prefix}`);
    process.stdout.write(`${name}: tokens: ${same}/${rec.rows.length} continuations split as transformers' tokenizer and the harness split them `
      + `(prefix token ${prefix}, the harness's ${rec.prefix}; ${rec.rows.filter((r) => r.cut).length} cut to ${rec.seq})\n`);
    for (const [device, precision, tol] of devices) {
      const out = path.join(root, `${name}-ours-${device}-${precision}.jsonl`);
      const res = await evaluate({ model, data: [], choices: [itemsFile], choicesOut: out, seq: rec.seq, batch: 4, maxChars: 0, device, threads: 0,
        json: true, lossOn: 'all', precision, ...(device === 'cuda' ? { cuda: { strict: true } } : {}) });
      const samples = fs.readFileSync(out, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Sample);
      let worst = 0, predsSame = 0;
      samples.forEach((s, i) => {
        const t = rec.results[i]!;
        s.logliks.forEach((v, k) => { worst = Math.max(worst, Math.abs(v - t.logliks[k]!) / Math.max(1, Math.abs(t.logliks[k]!))); });
        if (s.pred === t.pred && s.pred_norm === t.pred_norm) predsSame++;
      });
      const where = `${name} ${device} ${precision}`;
      process.stdout.write(`${where}: log-likelihoods max relative error ${worst.toExponential(2)} (bound ${tol}); predictions equal for ${predsSame}/${samples.length} items; `
        + `acc ${res.choices!.acc!.toFixed(4)} / transformers ${rec.acc.toFixed(4)}, acc_norm ${res.choices!.accNorm!.toFixed(4)} / ${rec.acc_norm.toFixed(4)}\n`);
      if (!(worst <= tol)) fail(`${where}: log-likelihoods differ by ${worst} (relative) > ${tol}`);
      if (precision === 'fp32' && (predsSame !== samples.length || res.choices!.acc !== rec.acc || res.choices!.accNorm !== rec.acc_norm)) fail(`${where}: predictions differ`);
      // loglikelihood items (scored as written: the default delimiter must not go before them): the token split, each
      // log-likelihood, is_greedy, and the task's acc and perplexity
      const contFile = path.join(root, `${name}-cont-items.jsonl`), contOut = path.join(root, `${name}-cont-ours-${device}-${precision}.jsonl`);
      if (device === 'cpu') {
        const ct = encodeForModel(ck.tokenizer!, format, readChoiceItems([contFile]), { chat: false });
        const split = rec.cont.rows.filter((r, i) => JSON.stringify([ct[i]!.ctx, ct[i]!.cont]) === JSON.stringify([r.ctx, r.cont])).length;
        process.stdout.write(`${name}: continuation items: ${split}/${rec.cont.rows.length} split as the harness split them\n`);
        if (split !== rec.cont.rows.length) fail(`${name}: continuation items split otherwise`);
      }
      const cres = await evaluate({ model, data: [], choices: [contFile], choicesOut: contOut, seq: rec.seq, batch: 4, maxChars: 0, device, threads: 0,
        json: true, lossOn: 'all', precision, ...(device === 'cuda' ? { cuda: { strict: true } } : {}) });
      const cs = fs.readFileSync(contOut, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as ContSample);
      let cworst = 0, greedySame = 0, clear = 0, clearSame = 0;
      cs.forEach((c, i) => {
        const t = rec.cont.rows[i]!;
        cworst = Math.max(cworst, Math.abs(c.loglik - t.loglik) / Math.max(1, Math.abs(t.loglik)));
        if (c.greedy === t.greedy) greedySame++;
        if (t.margin > NEAR_TIE) { clear++; if (c.greedy === t.greedy) clearSame++; }
      });
      const g = cres.choices!.greedy!;
      process.stdout.write(`${where}: continuation items: log-likelihoods max relative error ${cworst.toExponential(2)}; is_greedy equal for ${greedySame}/${cs.length} `
        + `(${clearSame}/${clear} without a near-tie, top-2 gap > ${NEAR_TIE}; transformers: ${rec.cont.rows.filter((r) => r.greedy).length} greedy); `
        + `acc ${g.acc.toFixed(4)} / transformers ${rec.cont.acc.toFixed(4)}, perplexity ${g.perplexity.toFixed(4)} / ${rec.cont.perplexity.toFixed(4)}\n`);
      if (!(cworst <= tol)) fail(`${where}: continuation log-likelihoods differ by ${cworst} (relative) > ${tol}`);
      if (precision === 'fp32' && clearSame !== clear) fail(`${where}: is_greedy differs where the argmax is clear`);
      if (!(Math.abs(g.perplexity - rec.cont.perplexity) <= tol * 10 * rec.cont.perplexity)) fail(`${where}: perplexity ${g.perplexity} against ${rec.cont.perplexity}`);
      // text items: the rolling windows (CPU: the tokens), each text's log-likelihood, the word / byte metrics
      const textFile = path.join(root, 'text-items.jsonl'), textOut = path.join(root, `${name}-text-ours-${device}-${precision}.jsonl`);
      if (device === 'cpu') {
        const tw = encodeForModel(ck.tokenizer!, format, readChoiceItems([textFile]), { chat: false, rollingWindow: rec.seq });
        const want = rec.text.rows.flatMap((r) => r.windows);
        const same = want.filter((w, i) => JSON.stringify([tw[i]?.ctx, tw[i]?.cont]) === JSON.stringify(w)).length;
        process.stdout.write(`${name}: text items: ${same}/${want.length} rolling windows of ${rec.seq} as the harness cuts them (ours: ${tw.length})\n`);
        if (same !== want.length || tw.length !== want.length) fail(`${name}: text items' windows differ`);
      }
      const tres = await evaluate({ model, data: [], choices: [textFile], choicesOut: textOut, seq: rec.seq, batch: 4, maxChars: 0, device, threads: 0,
        json: true, lossOn: 'all', precision, ...(device === 'cuda' ? { cuda: { strict: true } } : {}) });
      const ts = fs.readFileSync(textOut, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { loglik: number; words: number; bytes: number });
      let tworst = 0, counts = 0;
      ts.forEach((t, i) => {
        const r = rec.text.rows[i]!;
        tworst = Math.max(tworst, Math.abs(t.loglik - r.loglik) / Math.max(1, Math.abs(r.loglik)));
        if (t.words === r.words && t.bytes === r.bytes) counts++;
      });
      const rm = tres.choices!.rolling!;
      const rel = (a: number, b: number): number => Math.abs(a - b) / Math.abs(b);
      const mworst = Math.max(rel(rm.wordPerplexity, rec.text.word_perplexity), rel(rm.bytePerplexity, rec.text.byte_perplexity), rel(rm.bitsPerByte, rec.text.bits_per_byte));
      process.stdout.write(`${where}: text items: log-likelihoods max relative error ${tworst.toExponential(2)}; words and bytes equal for ${counts}/${ts.length}; `
        + `word ppl ${rm.wordPerplexity.toFixed(4)} / transformers ${rec.text.word_perplexity.toFixed(4)}, byte ppl ${rm.bytePerplexity.toFixed(5)} / ${rec.text.byte_perplexity.toFixed(5)}, `
        + `bits/byte ${rm.bitsPerByte.toFixed(5)} / ${rec.text.bits_per_byte.toFixed(5)} (max relative error ${mworst.toExponential(2)})\n`);
      if (!(tworst <= tol)) fail(`${where}: text log-likelihoods differ by ${tworst} (relative) > ${tol}`);
      if (counts !== ts.length) fail(`${where}: word or byte counts differ`);
      if (!(mworst <= tol * 10)) fail(`${where}: text metrics differ by ${mworst} (relative)`);
    }
  }
  process.stdout.write(failed ? `choices-hf: ${failed} check(s) FAILED\n` : 'choices-hf: all checks pass\n');
  return failed ? 1 : 0;
}

main().then((c) => { process.exitCode = c; }, (e: unknown) => { process.stderr.write(`${(e as Error).stack ?? String(e)}\n`); process.exitCode = 1; });
