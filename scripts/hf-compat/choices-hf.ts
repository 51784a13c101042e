/**
 * Compares distillery's multiple-choice scoring (`eval --choices`, src/eval/choices.ts) with what hf-choices.py
 * recorded from transformers and lm-evaluation-harness's rules, for each of its model folders (`model`: Qwen Instruct's
 * special tokens, no BOS; `model-bos`: a tokenizer that adds a BOS, as Llama 3's does): every continuation's context and
 * continuation token ids (the ChoiceEncoder over the folder's tokenizer.json and tokenizer_config.json), every
 * log-likelihood (fp32: relative error ≤ 1e-4; bf16 on CUDA: ≤ 3e-2, the documented bound of bf16 logits) and the
 * predictions behind acc and acc_norm (fp32: identical), through `evaluate` as the CLI runs it, on the CPU backend and,
 * when a GPU is present, the CUDA backend in fp32 and bf16.
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
import { ChoiceEncoder, encodeForModel, readChoiceItems } from '../../src/eval/choices.js';

interface Row { item: number; choice: number; ctx: number[]; cont: number[]; loglik: number; cut: boolean }
interface Recorded {
  transformers: string; seq: number; delimiter: string; prefix: number; rows: Row[];
  results: Array<{ logliks: number[]; pred: number; pred_norm: number }>; acc: number; acc_norm: number;
}
interface Sample { logliks: number[]; pred: number; pred_norm: number }

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
        + `acc ${res.choices!.acc.toFixed(4)} / transformers ${rec.acc.toFixed(4)}, acc_norm ${res.choices!.accNorm.toFixed(4)} / ${rec.acc_norm.toFixed(4)}\n`);
      if (!(worst <= tol)) fail(`${where}: log-likelihoods differ by ${worst} (relative) > ${tol}`);
      if (precision === 'fp32' && (predsSame !== samples.length || res.choices!.acc !== rec.acc || res.choices!.accNorm !== rec.acc_norm)) fail(`${where}: predictions differ`);
    }
  }
  process.stdout.write(failed ? `choices-hf: ${failed} check(s) FAILED\n` : 'choices-hf: all checks pass\n');
  return failed ? 1 : 0;
}

main().then((c) => { process.exitCode = c; }, (e: unknown) => { process.stderr.write(`${(e as Error).stack ?? String(e)}\n`); process.exitCode = 1; });
