/**
 * GPU-only (skips cleanly without libcuda or a GPU): uploads from a page-locked host staging (Backend.hostStaging) put
 * the bytes the arrays held when the upload was issued, from any offset of the staging, into float and int buffers;
 * after settle() the arrays can be rewritten without touching what was uploaded; a pageable upload beside them still works.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createCudaBackend } from '../../src/backend/cuda/index.js';

let reason = '';
try { createCudaBackend({ strict: false }).dispose(); } catch (e) { reason = (e as Error).message || 'no CUDA'; }
const skip = reason ? `no CUDA GPU here (${reason})` : false;

test('uploads from a host staging carry the values at their issue, from any offset, and settle() frees the arrays', { skip }, () => {
  const be = createCudaBackend({ strict: false });
  try {
    const n = 1 << 20;
    const st = be.hostStaging(8 * n + 64, 'test staging');
    const f = new Float32Array(st.buffer, 0, n), ints = new Int32Array(st.buffer, 4 * n + 16, n);
    for (let i = 0; i < n; i++) { f[i] = i * 0.5 - 3; ints[i] = 7 * i - 11; }
    const df = be.alloc(n, 'floats'), di = be.allocInt(n, 'ints'), dp = be.alloc(4, 'pageable');
    be.upload(df, f.subarray(3), 3);
    be.upload(df, f.subarray(0, 3));
    be.uploadInt(di, ints);
    be.upload(dp, [1, 2, 3, 4]);
    st.settle();
    const want = Float32Array.from(f), wantI = Int32Array.from(ints);
    f.fill(NaN); ints.fill(-1);
    assert.deepEqual(be.download(df), want);
    assert.deepEqual(be.downloadInt(di), wantI);
    assert.deepEqual([...be.download(dp)], [1, 2, 3, 4]);
    st.settle(); // nothing queued since: returns at once
  } finally {
    be.dispose();
  }
});
