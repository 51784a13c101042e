/** Which transport a run's device collectives take (ncclWanted): NCCL by default on CUDA with several ranks. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ncclWanted, type Communicator } from '../../src/parallel/comm.js';
import { NcclComm } from '../../src/parallel/nccl.js';
import { openLibrary } from '../../src/backend/cuda/ffi/libfind.js';
import type { CudaBackend } from '../../src/backend/cuda/cuda-backend.js';
import { DistilleryError } from '../../src/util/errors.js';

test('NCCL carries the device collectives of a CUDA run of several ranks by default; DISTILLERY_NCCL=0 sends them through the host, =1 uses NCCL on one rank too; the CPU never', () => {
  assert.equal(ncclWanted('cuda', 2, {}), true);
  assert.equal(ncclWanted('cuda', 8, { DISTILLERY_NCCL: '' }), true);
  assert.equal(ncclWanted('cuda', 1, {}), false, 'one rank has nothing to exchange: the plain path');
  assert.equal(ncclWanted('cuda', 2, { DISTILLERY_NCCL: '0' }), false);
  assert.equal(ncclWanted('cuda', 1, { DISTILLERY_NCCL: '1' }), true);
  assert.equal(ncclWanted('cpu', 2, {}), false);
  assert.equal(ncclWanted('cpu', 2, { DISTILLERY_NCCL: '1' }), false);
});

test('without libnccl, a GPU run of several ranks stops with one sentence naming NCCL and the DISTILLERY_NCCL=0 way around it', { skip: openLibrary('nccl').found ? 'NCCL is installed here' : false }, async () => {
  const host = { rank: 1, world: 2 } as unknown as Communicator;
  await assert.rejects(NcclComm.create(host, {} as unknown as CudaBackend), (e: unknown) => e instanceof DistilleryError
    && /^rank 1: data parallel on GPUs uses NCCL \(libnccl\.so\.2\), which was not found on this machine$/.test(e.message) && /DISTILLERY_NCCL=0/.test(e.hint ?? ''));
});
