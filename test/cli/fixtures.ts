/**
 * Test fixtures for the CLI: a tiny random checkpoint folder (config.json, model.safetensors, tokenizer.json
 * with a BPE trained on a few sentences), written with writeCheckpoint into a temp folder, and an Io that
 * collects what a command prints.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import assert from 'node:assert/strict';
import { UsageError, type Io } from '../../src/cli/args.js';
import { main } from '../../src/cli/main.js';
import { writeCheckpoint } from '../../src/model/checkpoint.js';
import type { ModelConfig } from '../../src/model/config.js';
import { initialWeights, parameterLayout } from '../../src/model/params.js';
import { trainBpe } from '../../src/tokenizer/train-bpe.js';
import type { Tokenizer } from '../../src/tokenizer/bpe.js';
import { Rng } from '../../src/util/rng.js';

export const TEXT = [
  'The teacher model predicts the next token; the student learns to match it.',
  'Distillation trains a small model on the soft targets of a larger one.',
  'A tokenizer splits text into pieces, and the model reads the pieces in order.',
  'The quick brown fox jumps over the lazy dog, and the dog does not mind.',
];

let cachedTok: Tokenizer | null = null;
export function tinyTokenizer(): Tokenizer {
  cachedTok ??= trainBpe(TEXT, { vocabSize: 300, specialTokens: ['<|endoftext|>', '<|im_start|>', '<|im_end|>'] });
  return cachedTok;
}

export function tinyConfig(vocabSize: number, over: Partial<ModelConfig> = {}): ModelConfig {
  return {
    architecture: 'qwen2', vocabSize, hiddenSize: 16, intermediateSize: 32, numLayers: 2, numHeads: 4, numKvHeads: 2,
    headDim: 4, rope: { type: 'default', theta: 10000 }, rmsNormEps: 1e-6, tieWordEmbeddings: false, maxPositionEmbeddings: 256, qkvBias: true, qkNorm: false, noRopeLayers: [], ...over,
  };
}

/**
 * Writes a random checkpoint into `dir` and returns its config. `flat`: zero the final norm, so every logit is 0
 * and greedy decoding always picks token id 0.
 */
export function writeTinyCheckpoint(dir: string, seed = 1, over: Partial<ModelConfig> = {}, flat = false): ModelConfig {
  const tok = tinyTokenizer();
  const config = tinyConfig(tok.vocabSize, over);
  const layout = parameterLayout(config);
  const weights = initialWeights(layout, config, new Rng(seed), 0.5);
  if (flat) weights.fill(0, layout.finalNorm.offset, layout.finalNorm.offset + layout.finalNorm.size);
  writeCheckpoint(dir, config, weights, { dtype: 'f32', tokenizerJson: tok.toJSON() });
  return config;
}

/** Runs the CLI in-process: its exit code and what it printed. */
export async function runCli(argv: string[]): Promise<{ code: number; out: string; err: string }> {
  const io = capture();
  const code = await main(argv, io);
  return { code, out: io.stdout(), err: io.stderr() };
}

export function tempDir(): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-cli-'));
}

/** Every file under dir: its path relative to dir → its bytes. */
export function treeBytes(dir: string): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  const walk = (d: string): void => {
    for (const f of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, f.name);
      if (f.isDirectory()) walk(p); else out.set(path.relative(dir, p), fs.readFileSync(p));
    }
  };
  walk(dir);
  return out;
}

export interface Captured extends Io {
  stdout: () => string;
  stderr: () => string;
  /** The pieces written to out, in order (to check streaming). */
  outPieces: string[];
}

export function capture(): Captured {
  const out: string[] = [], err: string[] = [];
  return {
    out: (s) => { out.push(s); },
    err: (s) => { err.push(s); },
    stdout: () => out.join(''),
    stderr: () => err.join(''),
    outPieces: out,
  };
}

/** Asserts that fn throws a UsageError whose message (and hint, if given) match. */
export function usageError(fn: () => unknown, re: RegExp, hint?: RegExp): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof UsageError, `expected a UsageError, got ${String(e)}`);
    assert.match(e.message, re);
    if (hint) assert.match(e.hint ?? '', hint);
    return true;
  });
}
