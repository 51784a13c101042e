/**
 * Threads per block of the CUDA backend's kernels. Each is baked into the specs that take it (a `block` parameter):
 * changing one changes those kernels' source and so their cache keys, never silently reuses a kernel.
 */
import { MAX_DECODE_SEQUENCES } from '../backend.js';

export const ELEM_BLOCK = 256;
/** Threads per block of embedding_bwd (one block per token row; each thread keeps ceil(c / this) columns). */
export const EMB_BWD_BLOCK = 256;
export const ROW_BLOCK = 256;
export const ATTN_BLOCK = 128;
export const LOSS_BLOCK = 512;
/** Threads per block of sample_rows (one row a block; 64 registers a thread: four blocks an SM at 256). */
export const SAMPLE_ROWS_BLOCK = 256;
/** decode_advance: one block, a thread per sequence of a generation batch (MAX_DECODE_SEQUENCES, the most it takes). */
export const DECODE_ADVANCE_BLOCK = MAX_DECODE_SEQUENCES;
