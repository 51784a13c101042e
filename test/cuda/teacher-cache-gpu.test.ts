/**
 * GPU-only (skips cleanly without libcuda or a GPU): the teacher-cache job on CUDA stores what the CPU job stores —
 * the same draws (ids) at nearly every position and log-probabilities within the format's step — for a sample and a
 * top-K cache. The job runs the whole batch's chunks on the device and reads the results once (src/cache/teacher-pass.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { createCudaBackend } from '../../src/backend/cuda/index.js';
import { buildTeacherCache, type CacheJobOptions } from '../../src/cache/build.js';
import { LOGQ_SCALE } from '../../src/cache/format.js';
import { TeacherCache, readManifest } from '../../src/cache/store.js';
import type { SparseRep } from '../../src/cache/sparse.js';
import { TEXT, tempDir, writeTinyCheckpoint } from '../cli/fixtures.js';

let reason = '';
try { createCudaBackend({ strict: false }).dispose(); } catch (e) { reason = (e as Error).message || 'no CUDA'; }
const skip = reason ? `no CUDA GPU here (${reason})` : false;

for (const sparse of [{ kind: 'sample', n: 8 }, { kind: 'top', k: 5 }] as SparseRep[]) {
  test(`teacher-cache on CUDA equals the CPU job (${sparse.kind}): ids at ≥ 98% of positions, log-probabilities within a step`, { skip }, async () => {
    const dir = tempDir();
    const teacher = path.join(dir, 'teacher');
    writeTinyCheckpoint(teacher, 11);
    const data = path.join(dir, 'data.txt');
    fs.writeFileSync(data, Array.from({ length: 40 }, (_, i) => TEXT[i % TEXT.length]).join(' '));
    const job = (device: 'cpu' | 'cuda'): CacheJobOptions => ({
      teacher, data: [data], out: path.join(dir, device), seq: 16, batch: 4, sparse, temperature: 2, seed: 5, valFraction: 0.2,
      lossOn: 'assistant', maxChars: 0, device, precision: 'fp32', threads: 2, shardWindows: 8, overwrite: false, quiet: true,
    });
    await buildTeacherCache(job('cpu'), { log: () => {} });
    await buildTeacherCache(job('cuda'), { log: () => {} });
    const a = readManifest(path.join(dir, 'cpu'))!, b = readManifest(path.join(dir, 'cuda'))!;
    assert.equal(b.windows, a.windows);
    assert.equal(b.shards.reduce((x, s) => x + s.positions, 0), a.shards.reduce((x, s) => x + s.positions, 0));
    const ca = TeacherCache.open(path.join(dir, 'cpu')), cb = TeacherCache.open(path.join(dir, 'cuda'));
    let same = 0, total = 0, worst = 0;
    for (let w = 0; w < a.windows; w++) {
      const ea = ca.entries(w), eb = cb.entries(w);
      assert.equal(eb.length, ea.length, `window ${w}`);
      ea.forEach((x, p) => {
        total++;
        const y = eb[p]!;
        if (JSON.stringify(x.ids) !== JSON.stringify(y.ids)) return;
        same++;
        x.logq.forEach((l, k) => { worst = Math.max(worst, Math.abs(l - y.logq[k]!)); });
      });
    }
    assert.ok(total > 100, `${total} positions`);
    assert.ok(same >= 0.98 * total, `${same} of ${total} positions drew the same ids`);
    assert.ok(worst <= 1 / LOGQ_SCALE + 1e-9, `log-probabilities differ by ${worst}`);
    console.log(`# [teacher-cache cuda vs cpu] ${sparse.kind}: ${same} of ${total} positions identical ids, log q within ${worst}`);
  });
}
