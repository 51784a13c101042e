/**
 * Models kept tensor by tensor (TensorWeights, src/model/params.ts): what a checkpoint above one typed array
 * (MAX_FLAT_WEIGHTS parameters: Qwen2.5-7B, Llama-3-8B, Qwen3-8B) loads as. A small model read with a small threshold
 * takes that path: its tensors hash, unpack, write, merge a LoRA adapter and load into a model (fp32, bf16, nf4 and
 * sharded masters) exactly as its flat array does; what needs one array refuses it by name; `distill` with such a
 * teacher (DISTILLERY_MAX_FLAT_WEIGHTS) trains exactly as with the flat one.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { createCpuBackend } from '../../src/backend/cpu/cpu-backend.js';
import { presetConfig } from '../../src/model/config.js';
import { MAX_FLAT_WEIGHTS, TensorWeights, flatWeights, initialWeights, packWeights, parameterLayout, unpackWeights } from '../../src/model/params.js';
import { firstNonFiniteBf16, readCheckpoint, writeCheckpoint } from '../../src/model/checkpoint.js';
import { Transformer, type Precision } from '../../src/model/transformer.js';
import { loraInitialWeights, loraLayout, mergeLora } from '../../src/model/lora.js';
import { weightsHash } from '../../src/model/weights-hash.js';
import { DistilleryError } from '../../src/util/errors.js';
import { Rng } from '../../src/util/rng.js';
import { packBf16 } from '../../src/backend/bf16.js';
import { readSafetensorsHeader } from '../../src/io/safetensors.js';

const tmp = (): string => fs.mkdtempSync(path.join(os.tmpdir(), 'distillery-tw-'));
const cfg = presetConfig('tiny', 300);
const layout = parameterLayout(cfg);
const flat = initialWeights(layout, cfg, new Rng(7));
const named = unpackWeights(layout, flat);

test('a model above the threshold is kept tensor by tensor (no copy); it hashes, unpacks and writes as its flat array does', () => {
  assert.equal(MAX_FLAT_WEIGHTS, 2 ** 32 - 1);
  const tw = packWeights(layout, named, 'src', layout.total - 1);
  assert.ok(tw instanceof TensorWeights);
  assert.equal(tw.length, layout.total);
  assert.ok(packWeights(layout, named, 'src') instanceof Float32Array, 'at or under the threshold: one flat array');
  const t0 = layout.tensors[3]!;
  assert.equal(tw.tensor(t0), named.get(t0.name)!.data, 'the tensor is the one read, not a copy');
  assert.equal(weightsHash(tw, layout), weightsHash(flat, layout));
  for (const [name, v] of unpackWeights(layout, tw)) assert.deepEqual(v.data, named.get(name)!.data, name);
  const a = tmp(), b = tmp();
  writeCheckpoint(path.join(a, 'm'), cfg, flat, { dtype: 'bf16' });
  writeCheckpoint(path.join(b, 'm'), cfg, tw, { dtype: 'bf16' });
  assert.ok(fs.readFileSync(path.join(a, 'm', 'model.safetensors')).equals(fs.readFileSync(path.join(b, 'm', 'model.safetensors'))));
  const back = readCheckpoint(path.join(b, 'm'), { maxFlat: 1000 });
  assert.ok(back.weights instanceof TensorWeights);
  assert.equal(weightsHash(back.weights, layout), weightsHash(readCheckpoint(path.join(a, "m")).weights, layout));
  assert.throws(() => flatWeights(tw, 'training every weight'), (e: unknown) => e instanceof DistilleryError && /training every weight needs the model's \d+ parameters in one float32 array/.test(e.message));
});

test('a LoRA adapter merges into a base kept tensor by tensor exactly as into its flat array (the base untouched)', () => {
  const lay = loraLayout(cfg, { rank: 2, alpha: 4, targets: ['q_proj', 'down_proj'] });
  const ad = loraInitialWeights(lay, new Rng(3));
  for (let i = 0; i < ad.length; i++) if (ad[i] === 0) ad[i] = ((i % 5) - 2) * 1e-2;
  const tw = packWeights(layout, named, 'src', 1);
  const before = weightsHash(tw, layout);
  const m = mergeLora(tw, layout.layers, lay, ad);
  assert.ok(m instanceof TensorWeights);
  assert.deepEqual(flatWeights(packWeights(layout, unpackWeights(layout, m), 'm'), 'm'), mergeLora(flat, layout.layers, lay, ad));
  assert.equal(weightsHash(tw, layout), before);
});

for (const [precision, frozen, sharded] of [['fp32', 'auto', false], ['bf16', 'auto', false], ['bf16', 'nf4', false], ['bf16', 'auto', true]] as Array<[Precision, 'auto' | 'nf4', boolean]>) {
  test(`setWeights tensor by tensor equals setWeights of the flat array: ${precision}${frozen === 'nf4' ? ', nf4' : ''}${sharded ? ', sharded masters (training)' : ''}`, () => {
    const be = createCpuBackend({ threads: 1 });
    const training = sharded;
    const mk = (): Transformer => new Transformer(be, cfg, {
      batch: 2, seq: 8, training, precision, frozenDtype: frozen,
      ...(sharded ? { masterRange: { begin: 1000, end: 5000 } } : {}),
    });
    const a = mk(), b = mk();
    a.setWeights(flat);
    b.setWeights(packWeights(layout, named, 'src', 1));
    const ids = Int32Array.from({ length: 16 }, (_, i) => (i * 37 + 5) % 300);
    assert.deepEqual(be.download(b.forward(ids, 2, 8)), be.download(a.forward(ids, 2, 8)));
    if (sharded) assert.deepEqual(be.download(b.params), be.download(a.params), 'the masters of the shard');
    else assert.deepEqual(b.getWeights(), a.getWeights());
    be.dispose();
  });
}

test('a checkpoint read tensor by tensor checks each tensor as it is read: a non-finite value is refused by name then', () => {
  const dir = tmp();
  const bad = Float32Array.from(flat);
  const t = layout.tensors[5]!;
  bad[t.offset + 2] = NaN;
  writeCheckpoint(path.join(dir, 'm'), cfg, bad, { dtype: 'f32' });
  assert.throws(() => readCheckpoint(path.join(dir, 'm')), new RegExp(`tensor "${t.name.replace(/\./g, '\\.')}" holds a non-finite value \\(NaN at element 2\\)`));
  const ck = readCheckpoint(path.join(dir, 'm'), { maxFlat: 1000 });
  assert.ok(ck.weights instanceof TensorWeights);
  const w = ck.weights;
  assert.deepEqual(w.tensor(layout.tensors[0]!), named.get(layout.tensors[0]!.name)!.data);
  const be = createCpuBackend({ threads: 1 });
  const m = new Transformer(be, cfg, { batch: 1, seq: 4, training: false });
  assert.throws(() => m.setWeights(w), (e: unknown) => e instanceof DistilleryError && e.message.includes(`tensor "${t.name}" holds a non-finite value (NaN at element 2)`));
  be.dispose();
});

test('writing a model kept tensor by tensor reads each tensor once, when it is written (one tensor in memory at a time)', () => {
  const reads = new Map<string, number>();
  const tw = new TensorWeights(layout, (t) => { reads.set(t.name, (reads.get(t.name) ?? 0) + 1); return Float32Array.from(named.get(t.name)!.data); });
  const views = unpackWeights(layout, tw);
  assert.equal(reads.size, 0, 'unpacking reads nothing');
  assert.deepEqual(views.get(layout.tensors[1]!.name)!.data, named.get(layout.tensors[1]!.name)!.data);
  reads.clear();
  const dir = tmp();
  writeCheckpoint(path.join(dir, 'm'), cfg, tw, { dtype: 'bf16', maxShardBytes: 20000 });
  assert.deepEqual([...reads.values()].every((n) => n === 1) && reads.size === layout.tensors.length, true, JSON.stringify([...reads]));
  assert.equal(weightsHash(readCheckpoint(path.join(dir, "m")).weights, layout), weightsHash(readCheckpoint(path.join(dir, "m"), { maxFlat: 1 }).weights, layout));
  const flatDir = tmp();
  writeCheckpoint(path.join(flatDir, 'm'), cfg, flat, { dtype: 'bf16', maxShardBytes: 20000 });
  const files = fs.readdirSync(path.join(dir, 'm')).filter((f) => f.endsWith('.safetensors'));
  assert.ok(files.length > 1, 'sharded');
  for (const f of files) assert.ok(fs.readFileSync(path.join(dir, 'm', f)).equals(fs.readFileSync(path.join(flatDir, 'm', f))), f);
});

test('unpackWeights: a float32 array\'s tensors are views of it (a save copies nothing); float64 weights are converted', () => {
  const f32 = Float32Array.from(flat), u = unpackWeights(layout, f32);
  for (const t of layout.tensors) {
    const d = u.get(t.name)!.data;
    assert.equal(d.buffer, f32.buffer, `${t.name} is a view`);
    assert.equal(d.byteOffset, t.offset * 4);
    assert.equal(d.length, t.size);
  }
  const f64 = Float64Array.from(flat), u64 = unpackWeights(layout, f64);
  for (const t of layout.tensors) {
    const d = u64.get(t.name)!.data;
    assert.ok(d instanceof Float32Array);
    assert.deepEqual(d, f32.subarray(t.offset, t.offset + t.size), t.name);
  }
});

test('a checkpoint read tensor by tensor (readCheckpoint tensorByTensor) puts its bf16 bits into bf16 weights as they are stored, and loads as its flat array does', () => {
  for (const dtype of ['bf16', 'f32'] as const) {
    const dir = path.join(tmp(), 'm');
    writeCheckpoint(dir, cfg, flat, { dtype, maxShardBytes: 30000 });
    const ck = readCheckpoint(dir, { tensorByTensor: true });
    const w = ck.weights;
    assert.ok(w instanceof TensorWeights && w.hasBf16, dtype);
    const flatCk = readCheckpoint(dir).weights as Float32Array;
    assert.ok(flatCk instanceof Float32Array);
    for (const t of layout.tensors) {
      assert.deepEqual(w.bf16(t), packBf16(flatCk.subarray(t.offset, t.offset + t.size)), `${dtype} ${t.name}: bits`);
      assert.deepEqual(w.tensor(t), flatCk.subarray(t.offset, t.offset + t.size), `${dtype} ${t.name}: values`);
    }
    for (const precision of ['bf16', 'fp32'] as const) {
      const be = createCpuBackend({ threads: 1 });
      let bits = 0;
      const up = be.uploadBf16.bind(be);
      be.uploadBf16 = (dst, b) => { bits++; up(dst, b); };
      const mk = (): Transformer => new Transformer(be, cfg, { batch: 2, seq: 8, training: false, precision });
      const a = mk(), b = mk();
      a.setWeights(flatCk);
      assert.equal(bits, 0);
      b.setWeights(w);
      assert.equal(bits, precision === 'bf16' ? layout.tensors.length : 0, `${dtype} ${precision}: every tensor as bits into bf16 weights, none into f32`);
      assert.deepEqual(be.download(b.params), be.download(a.params), `${dtype} ${precision}: the weights`);
      be.dispose();
    }
  }
  // a bf16 file's bits are the file's own bytes
  const dir = path.join(tmp(), 'm');
  writeCheckpoint(dir, cfg, flat, { dtype: 'bf16' });
  const t = layout.tensors[4]!, raw = readSafetensorsHeader(path.join(dir, 'model.safetensors'));
  const info = raw.tensors.get(t.name)!, bytes = fs.readFileSync(path.join(dir, 'model.safetensors')).subarray(info.begin, info.end);
  assert.deepEqual(new Uint8Array((readCheckpoint(dir, { tensorByTensor: true }).weights as TensorWeights).bf16(t).buffer), new Uint8Array(bytes));
});

test('a bf16 checkpoint read tensor by tensor refuses a non-finite value by name when its bits are read', () => {
  for (const [value, shown] of [[NaN, 'NaN'], [-Infinity, '-Infinity']] as const) {
    const bad = Float32Array.from(flat);
    const t = layout.tensors[6]!;
    bad[t.offset + 3] = value;
    const dir = path.join(tmp(), 'm');
    writeCheckpoint(dir, cfg, bad, { dtype: 'bf16' });
    const w = readCheckpoint(dir, { tensorByTensor: true }).weights as TensorWeights;
    const be = createCpuBackend({ threads: 1 });
    const m = new Transformer(be, cfg, { batch: 1, seq: 4, training: false, precision: 'bf16' });
    assert.throws(() => m.setWeights(w), (e: unknown) => e instanceof DistilleryError && e.message.includes(`tensor "${t.name}" holds a non-finite value (${shown} at element 3)`));
    be.dispose();
  }
});

test('firstNonFiniteBf16 (two patterns a word) finds what the one-pattern rule finds, for every bf16 pattern at every place', () => {
  const rule = (bits: Uint16Array): number => { for (let i = 0; i < bits.length; i++) if ((bits[i]! & 0x7f80) === 0x7f80) return i; return -1; };
  let checked = 0;
  for (let p = 0; p < 65536; p++) {
    const cases = [new Uint16Array([p, 0x3f80, 0x3f80]), new Uint16Array([0x3f80, p, 0x3f80]), new Uint16Array([0x3f80, 0x3f80, p]),
      new Uint16Array([p, p]), new Uint16Array(5).fill(0xc000).subarray(1, 4)]; // the last one unaligned for a word view
    cases[4]![1] = p;
    for (const c of cases) { assert.equal(firstNonFiniteBf16(c), rule(c), `pattern ${p.toString(16)} in [${[...c].map((x) => x.toString(16))}]`); checked++; }
  }
  assert.equal(checked, 5 * 65536);
  assert.equal(firstNonFiniteBf16(new Uint16Array([0x3f80, 0x3f80, 0x3f80, 0x7f80])), 3, '+Infinity in the second word\'s high half');
});

test('a float32 checkpoint\'s finite value past bfloat16\'s range is refused for bf16 weights as what it is (not as a non-finite value in the file)', () => {
  const big = Float32Array.from(flat);
  const t = layout.tensors[2]!;
  big[t.offset + 1] = 3.4e38;
  const dir = path.join(tmp(), 'm');
  writeCheckpoint(dir, cfg, big, { dtype: 'f32' });
  const w = readCheckpoint(dir, { tensorByTensor: true }).weights as TensorWeights;
  const be = createCpuBackend({ threads: 1 });
  const m = new Transformer(be, cfg, { batch: 1, seq: 4, training: false, precision: 'bf16' });
  assert.throws(() => m.setWeights(w), (e: unknown) => e instanceof DistilleryError && e.message.includes(`tensor "${t.name}" holds ${Math.fround(3.4e38)} at element 1, beyond bfloat16's range`) && /--precision fp32/.test(e.hint ?? ''));
  const f32 = new Transformer(be, cfg, { batch: 1, seq: 4, training: false, precision: 'fp32' });
  f32.setWeights(w); // float32 weights hold it
  be.dispose();
});
