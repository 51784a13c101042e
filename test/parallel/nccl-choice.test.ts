/** Which transport a run's device collectives take (ncclWanted): NCCL by default on CUDA with several ranks. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ncclWanted } from '../../src/parallel/comm.js';

test('NCCL carries the device collectives of a CUDA run of several ranks by default; DISTILLERY_NCCL=0 sends them through the host, =1 uses NCCL on one rank too; the CPU never', () => {
  assert.equal(ncclWanted('cuda', 2, {}), true);
  assert.equal(ncclWanted('cuda', 8, { DISTILLERY_NCCL: '' }), true);
  assert.equal(ncclWanted('cuda', 1, {}), false, 'one rank has nothing to exchange: the plain path');
  assert.equal(ncclWanted('cuda', 2, { DISTILLERY_NCCL: '0' }), false);
  assert.equal(ncclWanted('cuda', 1, { DISTILLERY_NCCL: '1' }), true);
  assert.equal(ncclWanted('cpu', 2, {}), false);
  assert.equal(ncclWanted('cpu', 2, { DISTILLERY_NCCL: '1' }), false);
});
