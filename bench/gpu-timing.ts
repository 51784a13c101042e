/** GPU micro-benchmark timing: µs per call of f over `reps` launches between two synchronizes (one warm-up call first). */
export function usPerCall(be: { synchronize(): void }, f: () => void, reps = 20): number {
  f(); be.synchronize();
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < reps; i++) f();
  be.synchronize();
  return Number(process.hrtime.bigint() - t0) / 1e3 / reps;
}
