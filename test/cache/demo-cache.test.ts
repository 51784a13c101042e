/**
 * The check on the demo's teacher and data (the full `npm start` recipe, src/demo.ts): a student distilled from
 * a sample cache of the teacher (the default representation) ends within 0.02 nats of the online-distilled student's
 * validation cross-entropy, and both below the scratch student. The cache's bytes per token are printed.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { demoRecipe } from '../../src/demo.js';
import { runTraining } from '../../src/train/run.js';
import { buildTeacherCache } from '../../src/cache/build.js';
import { DEFAULT_SPARSE } from '../../src/cache/sparse.js';
import { DEFAULT_SHARD_WINDOWS } from '../../src/cache/build.js';

test('demo: a student distilled from the default sample cache ends within 0.02 nats of the online-distilled one, both below scratch', async (t) => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-demo-cache-'));
  const r = demoRecipe(out, false, 2);
  const quiet = { quiet: true } as const;
  const log = (): void => {};
  await runTraining({ ...r.teacher, ...quiet }, { log });
  const online = await runTraining({ ...r.distilled, ...quiet }, { log });
  const scratch = await runTraining({ ...r.scratch, ...quiet }, { log });
  const d = r.distilled;
  const cacheDir = path.join(out, 'cache');
  const c = await buildTeacherCache({
    teacher: d.teacher!, data: d.data, out: cacheDir, seq: d.seq, batch: d.batch, sparse: DEFAULT_SPARSE, temperature: d.temperature,
    seed: d.seed, valFraction: d.valFraction, lossOn: d.lossOn, maxChars: d.maxChars, device: 'cpu', precision: 'fp32', threads: 2,
    shardWindows: DEFAULT_SHARD_WINDOWS, overwrite: false, quiet: true,
  }, { log });
  const cached = await runTraining({ ...d, ...quiet, teacher: undefined, teacherCache: cacheDir, out: path.join(out, 'cached') }, { log });
  const line = `validation CE: online ${online.finalValCe.toFixed(4)}, cached ${cached.finalValCe.toFixed(4)} ` +
    `(sample:${DEFAULT_SPARSE.kind === 'sample' ? DEFAULT_SPARSE.n : '?'}, ${c.bytesPerToken.toFixed(1)} bytes per token), scratch ${scratch.finalValCe.toFixed(4)}`;
  t.diagnostic(line);
  process.stderr.write(`[demo-cache] ${line}\n`);
  assert.ok(c.complete);
  assert.ok(Math.abs(cached.finalValCe - online.finalValCe) <= 0.02, line);
  assert.ok(online.finalValCe < scratch.finalValCe && cached.finalValCe < scratch.finalValCe, line);
  assert.equal(cached.teacherParameters, online.teacherParameters);
  fs.rmSync(out, { recursive: true, force: true });
});
