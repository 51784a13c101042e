/**
 * `--precision bf16|tf32|fp32` (and the older `--tf32`): what a job stores and multiplies in.
 * - bf16: bf16 weights copy, activations and their gradients, bf16 tensor-core products with fp32 accumulation, fp32
 *   master weights, gradients and AdamW moments; the teacher is stored once, in bf16 (src/model/transformer.ts).
 * - tf32: fp32 buffers, cuBLAS TF32 tensor-core products (~1e-3 relative) — what `--tf32` meant before.
 * - fp32: fp32 everywhere (parity tests and the CPU).
 * Default ('auto'): bf16 on CUDA (every GPU the kernels target, sm_80 and newer, has bf16 tensor cores), fp32 on the
 * CPU (which can emulate bf16 exactly, for tests, but gains nothing from it).
 */
import type { Precision } from '../model/transformer.js';
import { InputError } from '../util/errors.js';

export const PRECISION_CHOICES = ['auto', 'bf16', 'tf32', 'fp32'] as const;
export type PrecisionFlag = (typeof PRECISION_CHOICES)[number];

export interface ResolvedPrecision {
  /** What the run reports: bf16, tf32 or fp32. */
  name: 'bf16' | 'tf32' | 'fp32';
  /** The models' storage precision. */
  model: Precision;
  /** cuBLAS TF32 math mode for fp32 products. */
  tf32: boolean;
}

export const LOGITS_CHOICES = ['auto', 'bf16', 'f32'] as const;
export type LogitsFlag = (typeof LOGITS_CHOICES)[number];

/**
 * The LM heads' logits dtype from --logits and the models' precision: auto is bf16 with bf16 models (the product's
 * output dtype in transformers and under PyTorch autocast, what a PyTorch distillation script computes its loss from),
 * else f32; bf16 with fp32 models is refused (an fp32 product writes fp32).
 */
export function resolveLogits(flag: LogitsFlag | undefined, model: Precision): 'bf16' | 'f32' {
  const f = flag ?? 'auto';
  if (!(LOGITS_CHOICES as readonly string[]).includes(f)) {
    throw new InputError(`--logits must be one of ${LOGITS_CHOICES.join(', ')}, got ${String(f)}`, 'auto picks bf16 with bf16 models');
  }
  if (f === 'bf16' && model !== 'bf16') throw new InputError('--logits bf16 needs bf16 models', 'add --precision bf16, or drop --logits');
  return f === 'auto' ? (model === 'bf16' ? 'bf16' : 'f32') : f;
}

/** The precision of a job from --precision, --tf32 and the device; --tf32 with another explicit precision is refused. */
export function resolvePrecision(flag: PrecisionFlag | undefined, tf32Flag: boolean | undefined, device: 'cpu' | 'cuda'): ResolvedPrecision {
  const f = flag ?? 'auto';
  if (!(PRECISION_CHOICES as readonly string[]).includes(f)) {
    throw new InputError(`--precision must be one of ${PRECISION_CHOICES.join(', ')}, got ${String(f)}`, 'bf16 is the GPU default, fp32 the CPU one');
  }
  if (tf32Flag === true && f !== 'auto' && f !== 'tf32') {
    throw new InputError(`--tf32 contradicts --precision ${f}`, 'drop --tf32 (it means --precision tf32)');
  }
  const name = tf32Flag === true ? 'tf32' : f === 'auto' ? (device === 'cuda' ? 'bf16' : 'fp32') : f;
  return { name, model: name === 'bf16' ? 'bf16' : 'fp32', tf32: name === 'tf32' };
}
