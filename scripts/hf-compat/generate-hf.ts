/**
 * Compares distillery's generation with what hf-generate.py recorded from transformers' generate():
 *   greedy (repetition_penalty above, below and at 1): the same ids from the unbatched Generator and from the batched
 *     generator with the backend's sampler (Backend.sampleTokens; on CUDA the sample_tokens kernel with its seen-token
 *     bitmask), on the CPU backend and, when a GPU is present, the CUDA backend (fp32 weights: transformers ran in fp32);
 *   sampled (temperature, top-k, top-p, min-p, repetition_penalty): at every step, distillery's rule on transformers' raw
 *     logits with the sequence so far seen (sampleDistribution) keeps the tokens transformers' processed scores keep,
 *     with their probabilities (max |Δp| ≤ 1e-6); and distillery's own logits of that sequence (CPU) are transformers'
 *     (max-abs relative error ≤ 1e-5).
 * Prints one line per check and exits 1 if any fails.
 *
 * Usage: node dist/scripts/hf-compat/generate-hf.js <dir written by hf-generate.py> [--no-cuda]
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Backend, SampleParams } from '../../src/backend/backend.js';
import { createBackend } from '../../src/backend/create.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { sampleDistribution } from '../../src/backend/cpu/kernels/sample.js';
import { readCheckpoint, type LoadedCheckpoint } from '../../src/model/checkpoint.js';
import { Transformer } from '../../src/model/transformer.js';
import { Generator, seenOf } from '../../src/model/generate.js';
import { BatchGenerator } from '../../src/model/batch-generate.js';
import { jobClosures } from '../../src/train/kernel-plan.js';
import { relErr } from '../../test/util/compare.js';

interface Greedy { prompt: number[]; repetition_penalty: number; ids: number[] }
interface Sampled {
  prompt: number[]; ids: number[];
  settings: { temperature: number; top_k: number; top_p: number; min_p: number | null; repetition_penalty: number };
  steps: Array<{ logits: number[]; probs: number[] }>;
}
interface Recorded { transformers: string; vocab: number; greedy: Greedy[]; sampled: Sampled[] }

const P_TOL = 1e-6, LOGIT_TOL = 1e-5;

function greedyChecks(be: Backend, ck: LoadedCheckpoint, rec: Recorded, where: string, fail: (msg: string) => void): void {
  const m = new Transformer(be, ck.config, { batch: 1, seq: 1, training: false, precision: 'fp32' });
  m.setWeights(ck.weights);
  const maxLen = Math.max(...rec.greedy.map((g) => g.prompt.length + g.ids.length)) + 1;
  const solo = new Generator(m, maxLen);
  for (const pen of [...new Set(rec.greedy.map((g) => g.repetition_penalty))]) {
    const cases = rec.greedy.filter((g) => g.repetition_penalty === pen);
    const opts = { temperature: 0, topP: 1, topK: 0, repetitionPenalty: pen, maxNewTokens: cases[0]!.ids.length };
    const batch = new BatchGenerator(m, cases.length, maxLen).generateOnDevice(cases.map((c) => c.prompt), opts);
    cases.forEach((c, b) => {
      const ours = solo.generate(c.prompt, opts), dev = batch.tokens[b]!;
      const same = JSON.stringify(ours) === JSON.stringify(c.ids) && JSON.stringify(dev) === JSON.stringify(c.ids);
      process.stdout.write(`${where}  greedy repetition_penalty ${pen} prompt ${c.prompt.length} tokens: ${same ? 'same ids' : 'DIFFERENT'} (${c.ids.length} tokens, ${new Set(c.ids).size} distinct)\n`);
      if (!same) fail(`${where} greedy ${pen}: transformers ${c.ids.join(' ')} | Generator ${ours.join(' ')} | batched ${dev.join(' ')}`);
    });
  }
}

function sampledChecks(ck: LoadedCheckpoint, rec: Recorded, fail: (msg: string) => void): void {
  const be = createCpuBackend({ threads: 1 }), V = rec.vocab;
  const full = new Transformer(be, ck.config, { batch: 1, seq: 64, training: false });
  full.setWeights(ck.weights);
  for (const c of rec.sampled) {
    const s: SampleParams = {
      temperature: c.settings.temperature, topK: c.settings.top_k, topP: c.settings.top_p,
      minP: c.settings.min_p ?? 0, repetitionPenalty: c.settings.repetition_penalty,
    };
    const seq = [...c.prompt];
    let worstP = 0, worstLogit = 0, keptSame = true, kept = 0;
    c.steps.forEach((st, i) => {
      const p = sampleDistribution(st.logits, 0, V, s, seenOf([seq], V, s), 0);
      for (let j = 0; j < V; j++) {
        if ((p[j]! > 0) !== (st.probs[j]! > 0)) keptSame = false;
        worstP = Math.max(worstP, Math.abs(p[j]! - st.probs[j]!));
        if (st.probs[j]! > 0) kept++;
      }
      const z = be.download(full.forward(Int32Array.from(seq), 1, seq.length));
      worstLogit = Math.max(worstLogit, relErr(z.subarray((seq.length - 1) * V, seq.length * V), st.logits));
      seq.push(c.ids[i]!);
    });
    const ok = keptSame && worstP <= P_TOL && worstLogit <= LOGIT_TOL;
    process.stdout.write(`cpu   sampled ${JSON.stringify(c.settings)} prompt ${c.prompt.length}: ${c.steps.length} steps, ${(kept / c.steps.length).toFixed(1)} kept a step, `
      + `kept sets ${keptSame ? 'equal' : 'DIFFER'}, max |dp| ${worstP.toExponential(2)}, logits ${worstLogit.toExponential(2)}: ${ok ? 'ok' : 'FAIL'}\n`);
    if (!ok) fail(`sampled ${JSON.stringify(c.settings)}`);
  }
  be.dispose();
}

async function main(): Promise<number> {
  const root = process.argv[2];
  if (!root) { process.stderr.write('usage: node dist/scripts/hf-compat/generate-hf.js <dir> [--no-cuda]\n'); return 2; }
  const rec = JSON.parse(fs.readFileSync(path.join(root, 'generate.json'), 'utf8')) as Recorded;
  const ck = readCheckpoint(path.join(root, 'model'));
  process.stdout.write(`generations recorded from transformers ${rec.transformers}\n`);
  const failures: string[] = [];
  const fail = (m: string): void => { failures.push(m); };
  const cpu = createCpuBackend({ threads: 1 });
  greedyChecks(cpu, ck, rec, 'cpu ', fail);
  cpu.dispose();
  sampledChecks(ck, rec, fail);
  if (!process.argv.includes('--no-cuda')) {
    let cuda: Backend | null = null;
    try { cuda = await createBackend({ device: 'cuda', strict: true }); } catch (e) { process.stdout.write(`cuda  skipped (${(e as Error).message.split('\n')[0]})\n`); }
    if (cuda) {
      try {
        const maxLen = Math.max(...rec.greedy.map((g) => g.prompt.length + g.ids.length)) + 1;
        await cuda.prepare?.(jobClosures({ student: ck.config, batch: 1, seq: 1, generateLen: maxLen, generateBatch: 3, precision: 'fp32' }));
        greedyChecks(cuda, ck, rec, 'cuda', fail);
      } finally { cuda.dispose(); }
    }
  }
  for (const f of failures) process.stdout.write(`FAIL ${f}\n`);
  process.stdout.write(failures.length ? `${failures.length} checks failed\n` : 'all checks passed\n');
  return failures.length ? 1 : 0;
}

main().then((c) => process.exit(c), (e: unknown) => { process.stderr.write(`${(e as Error).stack ?? String(e)}\n`); process.exit(1); });
