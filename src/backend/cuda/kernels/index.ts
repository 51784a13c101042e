/** The registry of every kernel family (for the mutation test, the compile gate and diagnostics). */
import type { KernelFamily, ParamRecord } from './spec.js';
import { addRmsnormForward, rmsnormBackward, rmsnormForward, rmsnormRowsBackward, rmsnormRowsForward } from './norm.js';
import {
  ropeBackward, ropeForward, ropeKvForward, ropeLinearBackward, ropeLinearForward, ropeLinearKvForward, ropeLlama3Backward, ropeLlama3Forward,
  ropeLlama3KvForward, ropeYarnBackward, ropeYarnForward, ropeYarnKvForward,
} from './rope.js';
import { attentionBackward, attentionBackwardKv, attentionBackwardPre, attentionDkvReduce, attentionForward } from './attention.js';
import { attentionCached, attentionCachedGqa, kvCacheWrite } from './attention-cached.js';
import { attentionCachedMma } from './attention-cached-mma.js';
import {
  attentionBackwardDkvBf16, attentionBackwardDkvDsBf16, attentionBackwardDqBf16, attentionBackwardDqDsBf16, attentionForwardBf16,
} from './attention-bf16.js';
import { attentionForwardMma } from './attention-tf32.js';
import {
  accumulateKernel, adamwKernel, adamwMultiKernel, addKernel, biasAdd, copyColumnsKernel, biasGrad, colReduce, convertKernel, embeddingBackward, embeddingForward, scaleKernel,
  sumSquares, swigluBackward, swigluBackwardRows, swigluBackwardSet, swigluForward, swigluForwardRows,
} from './elementwise.js';
import { lossKernel } from './loss.js';
import { sparseLossKernel } from './sparse-loss.js';
import { sampleRowsKernel, topRowsKernel } from './sparse-rows.js';
import { decodeAdvanceKernel, sampleTokensKernel } from './sample.js';
import { dequantNf4 } from './quant.js';

export * from './spec.js';
export * from './norm.js';
export * from './rope.js';
export * from './attention.js';
export * from './attention-cached.js';
export * from './attention-cached-mma.js';
export * from './attention-bf16.js';
export * from './attention-tf32.js';
export * from './elementwise.js';
export * from './loss.js';
export * from './sparse-loss.js';
export * from './sparse-rows.js';
export * from './sample.js';
export * from './quant.js';

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type AnyFamily = KernelFamily<any>;

export const ALL_FAMILIES: readonly AnyFamily[] = [
  rmsnormForward, addRmsnormForward, rmsnormBackward, rmsnormRowsForward, rmsnormRowsBackward, ropeForward, ropeBackward,
  ropeLinearForward, ropeLinearBackward, ropeLlama3Forward, ropeLlama3Backward, ropeYarnForward, ropeYarnBackward,
  ropeKvForward, ropeLinearKvForward, ropeLlama3KvForward, ropeYarnKvForward,
  attentionForward, attentionForwardMma, attentionBackwardPre, attentionBackward, attentionBackwardKv, attentionDkvReduce, kvCacheWrite, attentionCached, attentionCachedGqa, attentionCachedMma,
  attentionForwardBf16, attentionBackwardDqBf16, attentionBackwardDkvBf16, attentionBackwardDkvDsBf16, attentionBackwardDqDsBf16,
  addKernel, accumulateKernel, scaleKernel, sumSquares, biasAdd, biasGrad, colReduce,
  swigluForward, swigluBackward, swigluBackwardSet, swigluForwardRows, swigluBackwardRows, embeddingForward, embeddingBackward, lossKernel, sparseLossKernel, sampleRowsKernel, topRowsKernel, sampleTokensKernel, decodeAdvanceKernel, adamwKernel, adamwMultiKernel, convertKernel, copyColumnsKernel,
  dequantNf4,
];

/** Families no default code path launches (opt-in experiments; still compile-gated and mutation-tested). */
export const EXPERIMENTAL_FAMILIES: ReadonlySet<string> = new Set([attentionForwardMma.name]);

export function familyByName(name: string): KernelFamily<ParamRecord> | undefined {
  return ALL_FAMILIES.find((f) => f.name === name);
}
