/** Test data shared by the run tests (test/train/run.test.ts, test/train/run-folder.test.ts, test/train/run-choices.test.ts). */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Rng } from '../../src/util/rng.js';
import { DEFAULT_RUN_OPTIONS, type RunOptions } from '../../src/train/options.js';

/** A small text corpus file: real sentences from the doc corpus would do, but a file keeps the test self-contained. */
export function corpusFile(dir: string): string {
  const words = ['the', 'model', 'learns', 'to', 'predict', 'next', 'token', 'from', 'text', 'and', 'a', 'teacher', 'helps', 'student'];
  const rng = new Rng(3);
  const lines: string[] = [];
  for (let d = 0; d < 60; d++) {
    const n = 20 + rng.int(20);
    lines.push(Array.from({ length: n }, (_, i) => words[(i * 3 + d + rng.int(2)) % words.length]).join(' ') + '.');
  }
  const f = path.join(dir, 'corpus.txt');
  fs.writeFileSync(f, lines.join('\n\n'));
  return f;
}

/** A tiny quiet one-thread training run on corpusFile(dir) in dir/run (8 steps at 4 × 16, evaluating and saving every 4), with `over`. */
export function tinyRunOptions(dir: string, over: Partial<RunOptions>): RunOptions {
  return {
    ...DEFAULT_RUN_OPTIONS, mode: 'train', out: path.join(dir, 'run'), data: [corpusFile(dir)], model: 'tiny',
    vocabSize: 300, batch: 4, seq: 16, steps: 8, evalEvery: 4, saveEvery: 4, warmup: 2, quiet: true, threads: 1, ...over,
  };
}
