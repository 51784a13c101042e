/**
 * distillery WRITES a LoRA adapter and its merged export, transformers/PEFT READ them: a small random Qwen2 base (and a
 * Qwen3 one), a real `train --lora-rank` run on the built-in corpus (a few steps, so B ≠ 0), `export --merge`, and the
 * logits distillery's CPU backend computes for fixed ids from (a) the base with the adapter (unmerged LoRA) and (b) the
 * merged folder. lora-check.py loads the merged folder with transformers, the adapter with PEFT on the base, and
 * compares. Usage: node dist/scripts/hf-compat/lora-make.js <out-dir>
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { Transformer } from '../../src/model/transformer.js';
import { readCheckpoint, writeCheckpoint } from '../../src/model/checkpoint.js';
import { readAdapterOnBase } from '../../src/model/adapter.js';
import { runTraining } from '../../src/train/run.js';
import { DEFAULT_RUN_OPTIONS } from '../../src/train/options.js';
import { exportCommand } from '../../src/cli/commands/export.js';
import { trainBpe } from '../../src/tokenizer/train-bpe.js';
import { loadDocCorpus } from '../../src/data/index.js';
import { Rng } from '../../src/util/rng.js';

const out = path.resolve(process.argv[2] ?? 'lora-compat-out');
fs.mkdirSync(out, { recursive: true });
const corpus = loadDocCorpus({ maxChars: 60_000 });
const tok = trainBpe(corpus.documents, { vocabSize: 400, specialTokens: ['<|endoftext|>', '<|im_start|>', '<|im_end|>'] });
const q2: ModelConfig = {
  architecture: 'qwen2', vocabSize: tok.vocabSize, hiddenSize: 64, intermediateSize: 160, numLayers: 2, numHeads: 4,
  numKvHeads: 2, headDim: 16, rope: { type: 'default', theta: 1e6 }, rmsNormEps: 1e-6, tieWordEmbeddings: true, maxPositionEmbeddings: 256, qkvBias: true, qkNorm: false, noRopeLayers: [],
};
const cases: Array<[string, ModelConfig, string, number]> = [
  ['qwen2-all-r8', q2, 'all', 8],
  ['qwen3-qv-r4', { ...q2, architecture: 'qwen3', qkvBias: false, qkNorm: true, headDim: 32, tieWordEmbeddings: false }, 'q_proj,v_proj', 4],
];
const ids = Int32Array.from({ length: 24 }, (_, i) => (i * 37 + 11) % tok.vocabSize);
const be = createCpuBackend({ threads: 1 });
const logitsOf = (m: Transformer): number[] => Array.from(be.download(m.forward(ids, 1, ids.length)));
const data = path.join(out, 'corpus.txt');
fs.writeFileSync(data, corpus.documents.join('\n\n'));
const manifest: Array<Record<string, unknown>> = [];
for (const [name, cfg, targets, rank] of cases) {
  const base = path.join(out, name, 'base');
  writeCheckpoint(base, cfg, initialWeights(parameterLayout(cfg), cfg, new Rng(42), 0.2), { dtype: 'f32', tokenizerJson: tok.toJSON() });
  const s = await runTraining({
    ...DEFAULT_RUN_OPTIONS, mode: 'train', out: path.join(out, name, 'run'), data: [data], init: base, loraRank: rank, loraTargets: targets,
    loraAlpha: 3 * rank, batch: 4, seq: 32, steps: 20, warmup: 2, lr: 1e-2, evalEvery: 10, saveEvery: 10, quiet: true, threads: 1, overwrite: true,
  }, { log: () => {} });
  const merged = path.join(out, name, 'merged');
  fs.rmSync(merged, { recursive: true, force: true });
  await exportCommand.run([s.finalDir!, '--merge', '--out', merged], { out: () => {}, err: () => {} }, {});
  const a = readAdapterOnBase(s.finalDir!);
  const lora = new Transformer(be, cfg, { batch: 1, seq: ids.length, training: false, lora: a.layout });
  lora.setWeights(a.base.weights); lora.lora!.setWeights(a.adapter.weights);
  const plain = new Transformer(be, cfg, { batch: 1, seq: ids.length, training: false });
  plain.setWeights(readCheckpoint(merged).weights);
  manifest.push({ name, base, adapter: s.finalDir, merged, ids: Array.from(ids), lora_logits: logitsOf(lora), merged_logits: logitsOf(plain) });
  process.stderr.write(`lora-make ${name}: adapter ${s.finalDir}, merged ${merged}\n`);
}
fs.writeFileSync(path.join(out, 'manifest.json'), JSON.stringify({ cases: manifest }));
be.dispose();
