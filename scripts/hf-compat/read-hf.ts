/**
 * Reads every checkpoint hf-writes.py made with transformers' own save_pretrained and compares distillery's logits
 * with transformers' (max |ours − theirs| / max |theirs| ≤ 1e-5) on the CPU backend and, when a GPU is present, on
 * the CUDA backend (the `--device cuda` path: createBackend, pre-warm of the evaluation's kernels, strict mode).
 * Prints a table (case, dtype, shards, baked parameters as read, max relative error CPU and CUDA, verdict) and
 * exits 1 if any case fails (a read error is a failure). Without a GPU the CUDA column says why it was skipped.
 *
 * Usage: node dist/scripts/hf-compat/read-hf.js <dir written by hf-writes.py> [--no-cuda]
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Backend } from '../../src/backend/backend.js';
import { createBackend } from '../../src/backend/create.js';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { readCheckpoint, type LoadedCheckpoint } from '../../src/model/checkpoint.js';
import { describeBaked } from '../../src/model/config.js';
import { Transformer } from '../../src/model/transformer.js';
import { jobClosures } from '../../src/train/kernel-plan.js';
import { relErr } from '../../test/util/compare.js';

const TOL = 1e-5;

interface Case { name: string; dir: string; dtype: string; shards: number; ids: number[]; logits: number[] }

function logitsOn(be: Backend, ck: LoadedCheckpoint, ids: number[]): Float32Array | Float64Array {
  const m = new Transformer(be, ck.config, { batch: 1, seq: ids.length, training: false });
  m.setWeights(ck.weights);
  return be.download(m.forward(Int32Array.from(ids), 1, ids.length));
}

async function main(): Promise<number> {
  const root = process.argv[2];
  if (!root) { process.stderr.write('usage: node dist/scripts/hf-compat/read-hf.js <dir> [--no-cuda]\n'); return 2; }
  const man = JSON.parse(fs.readFileSync(path.join(root, 'manifest.json'), 'utf8')) as { transformers?: string; cases: Case[] };
  process.stdout.write(`checkpoints written by transformers ${man.transformers ?? '?'}; tolerance ${TOL} (max-abs relative)\n`);
  const rows: Array<{ c: Case; baked: string; cpu: number | string; cuda: number | string }> = [];
  const loaded = new Map<string, LoadedCheckpoint>();
  const cpu = createCpuBackend({ threads: 1 });
  for (const c of man.cases) {
    try {
      const ck = readCheckpoint(path.join(root, c.dir));
      loaded.set(c.name, ck);
      rows.push({ c, baked: describeBaked(ck.config), cpu: relErr(logitsOn(cpu, ck, c.ids), c.logits), cuda: 'n/a' });
    } catch (e) {
      rows.push({ c, baked: `READ ERROR: ${(e as Error).message}`, cpu: 'read error', cuda: 'read error' });
    }
  }
  cpu.dispose();

  let cudaNote = '';
  if (process.argv.includes('--no-cuda')) cudaNote = 'skipped (--no-cuda)';
  else {
    let cuda: Backend | null = null;
    try {
      cuda = await createBackend({ device: 'cuda', strict: true });
    } catch (e) {
      cudaNote = `skipped (no CUDA: ${(e as Error).message.split('\n')[0]})`;
    }
    if (cuda) {
      try {
        const cks = [...loaded.entries()];
        await cuda.prepare?.(cks.flatMap(([name, ck]) => jobClosures({
          student: ck.config, batch: 1, seq: man.cases.find((c) => c.name === name)!.ids.length, evaluate: true,
        })));
        for (const r of rows) {
          const ck = loaded.get(r.c.name);
          if (!ck) continue;
          try {
            r.cuda = relErr(logitsOn(cuda, ck, r.c.ids), r.c.logits);
          } catch (e) {
            r.cuda = `error: ${(e as Error).message}`;
          }
        }
      } finally {
        cuda.dispose();
      }
    }
  }

  const fmt = (v: number | string): string => (typeof v === 'number' ? v.toExponential(2) : v);
  const pass = (v: number | string, required: boolean): boolean => (typeof v === 'number' ? v <= TOL : !required);
  const cudaRequired = cudaNote === '';
  const w = Math.max(4, ...rows.map((r) => r.c.name.length));
  process.stdout.write(`${'case'.padEnd(w)}  dtype  shards  ${'cpu'.padEnd(9)}  ${'cuda'.padEnd(9)}  verdict  baked (as distillery read it)\n`);
  let ok = true;
  for (const r of rows) {
    const good = pass(r.cpu, true) && pass(r.cuda, cudaRequired);
    ok &&= good;
    process.stdout.write(`${r.c.name.padEnd(w)}  ${r.c.dtype.padEnd(5)}  ${String(r.c.shards).padEnd(6)}  ${fmt(r.cpu).padEnd(9)}  ` +
      `${fmt(r.cuda).padEnd(9)}  ${good ? 'PASS   ' : 'FAIL   '}  ${r.baked}\n`);
  }
  if (cudaNote) process.stdout.write(`cuda: ${cudaNote}\n`);
  process.stdout.write(`${ok ? 'all' : 'NOT all'} ${rows.length} checkpoints read by distillery match transformers\n`);
  return ok ? 0 : 1;
}

main().then((code) => { process.exitCode = code; }, (e: unknown) => {
  process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
  process.exitCode = 1;
});
