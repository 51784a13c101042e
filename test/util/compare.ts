import assert from 'node:assert/strict';

/**
 * Shared comparison for tests that check one implementation against another (GPU vs CPU, ONNX vs CPU):
 * max |got − ref| / max |ref|, Infinity as soon as `got` holds a non-finite value or the lengths differ.
 * Also used by scripts/hf-compat/read-hf.ts.
 */
export function relErr(got: ArrayLike<number>, ref: ArrayLike<number>): number {
  if (got.length !== ref.length) return Infinity;
  let d = 0, m = 0;
  for (let i = 0; i < ref.length; i++) {
    if (!Number.isFinite(got[i]!)) return Infinity;
    d = Math.max(d, Math.abs(got[i]! - ref[i]!));
    m = Math.max(m, Math.abs(ref[i]!));
  }
  return m === 0 ? d : d / m;
}

/** Asserts max |got − want| ≤ tol · max |want| (what names the compared values in the message). */
export function assertNear(got: ArrayLike<number>, want: ArrayLike<number>, tol: number, what: string): void {
  let worst = 0, scale = 0;
  for (let i = 0; i < want.length; i++) { worst = Math.max(worst, Math.abs(got[i]! - want[i]!)); scale = Math.max(scale, Math.abs(want[i]!)); }
  assert.ok(worst <= tol * scale, `${what}: largest difference ${worst} against values up to ${scale}`);
}

/** Relative Frobenius error ‖got − ref‖ / ‖ref‖ (the absolute norm when ref is all zeros). */
export function relFrob(got: ArrayLike<number>, ref: ArrayLike<number>): number {
  let d = 0, n = 0;
  for (let i = 0; i < ref.length; i++) { d += (got[i]! - ref[i]!) ** 2; n += ref[i]! ** 2; }
  return n === 0 ? Math.sqrt(d) : Math.sqrt(d / n);
}
