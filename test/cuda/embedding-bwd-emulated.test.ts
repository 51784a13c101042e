/**
 * OPT-IN (DISTILLERY_EMULATE_CUDA=1, g++): the GENERATED embedding backward (src/backend/cuda/kernels/elementwise.ts,
 * embedding_bwd) compiled for the host on the emulator of ./emulator.ts: with ids that repeat (a small vocabulary, the
 * first row's id again at the end, one id only once) and rows wider than a block (several columns per thread, a partial
 * last one; or one id in 9 rows of 10, as a padded batch), the table it leaves is bit-for-bit the CPU backend's
 * sequential float32 loop, for f32 and bf16 dout.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { embeddingBackward } from '../../src/backend/cuda/kernels/elementwise.js';
import { embeddingBackward as cpuEmbeddingBackward } from '../../src/backend/cpu/kernels/elementwise.js';
import { packBf16, roundBf16InPlace } from '../../src/backend/bf16.js';
import { build, cleanUp, skip, workDir } from './emulator.js';
import { rng } from './helpers.js';

const BLOCK = 64, n = 150, vocab = 9, c = 150;

test('emulated CUDA: embedding backward with repeated ids equals the CPU backend bit for bit (f32 and bf16 dout; ids spread, or one id in 9 rows of 10: more rows per window than it loads at once)', { skip, timeout: 300_000 }, () => {
  const r = rng(11);
  const spread = Int32Array.from({ length: n }, (_, i) => (i === n - 1 ? 0 : i === 7 ? vocab - 1 : Math.floor(r() * (vocab - 1))));
  spread[0] = 0;
  const padded = Int32Array.from({ length: n }, (_, i) => (i % 10 === 3 ? 1 + (i % (vocab - 1)) : 0));
  const table = Float32Array.from({ length: vocab * c }, () => r() - 0.5);
  for (const [dt, ids] of [['f32', spread], ['bf16', spread], ['f32', padded], ['bf16', padded]] as const) {
    const dout = Float32Array.from({ length: n * c }, () => (r() - 0.5) * 3);
    if (dt === 'bf16') roundBf16InPlace(dout);
    writeFileSync(join(workDir(), 'ids'), ids); writeFileSync(join(workDir(), 'table'), table);
    writeFileSync(join(workDir(), 'dout'), dt === 'bf16' ? packBf16(dout) : dout);
    const per = Math.ceil(c / BLOCK);
    const spec = embeddingBackward.make({ dout: dt, per, block: BLOCK });
    const T = dt === 'bf16' ? 'bf16' : 'float';
    const exe = build(spec, `int main() { const char* d = "${workDir()}";
  auto ids = readf<int>(d, "ids", ${n}); auto t = readf<float>(d, "table", ${vocab * c}); auto g = readf<${T}>(d, "dout", ${n * c});
  launch({${n}, 1, 1}, ${BLOCK}, 0, [&] { embedding_bwd(t.data(), g.data(), ids.data(), ${n}, ${c}); });
  writef(d, "out", t); }`);
    execFileSync(exe);
    const b = readFileSync(join(workDir(), 'out'));
    const got = new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
    const want = Float32Array.from(table);
    cpuEmbeddingBackward(want, dout, ids, n, c);
    let diff = 0;
    for (let i = 0; i < want.length; i++) if (got[i] !== want[i]) diff++;
    assert.equal(diff, 0, `${dt}: ${diff} of ${want.length} table values differ from the sequential loop`);
    assert.notDeepEqual(Array.from(want), Array.from(table), 'the backward changed the table');
  }
  cleanUp();
});
