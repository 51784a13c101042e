/**
 * Seeded, serializable pseudo-random numbers (xoshiro128**, seeded through splitmix32).
 * Every random choice in distillery (weight init, data shuffle, sampling) draws from an Rng so that a run is
 * reproducible from its seed, and a checkpoint stores `state()` so that a resumed run draws the same numbers.
 */
export class Rng {
  private s: Uint32Array;
  private spare: number | null = null;

  constructor(seed: number) {
    this.s = new Uint32Array(4);
    let x = seed >>> 0;
    for (let i = 0; i < 4; i++) {
      // splitmix32
      x = (x + 0x9e3779b9) >>> 0;
      let z = x;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
      this.s[i] = (z ^ (z >>> 16)) >>> 0;
    }
    if (this.s.every((v) => v === 0)) this.s[0] = 1;
  }

  /** A uniformly distributed 32-bit unsigned integer. */
  nextU32(): number {
    const s = this.s;
    const result = Math.imul(rotl(Math.imul(s[1]!, 5) >>> 0, 7), 9) >>> 0;
    const t = (s[1]! << 9) >>> 0;
    s[2]! ^= s[0]!; s[3]! ^= s[1]!; s[1]! ^= s[2]!; s[0]! ^= s[3]!;
    s[2]! ^= t;
    s[3] = rotl(s[3]!, 11);
    return result;
  }

  /** Uniform in [0, 1) with 53 random bits. */
  next(): number {
    const hi = this.nextU32() >>> 5, lo = this.nextU32() >>> 6;
    return (hi * 67108864 + lo) / 9007199254740992;
  }

  /** Uniform integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.next() * n);
  }

  /** Standard normal (Box-Muller; the spare value is part of the state). */
  normal(): number {
    if (this.spare !== null) { const v = this.spare; this.spare = null; return v; }
    let u = 0;
    while (u === 0) u = this.next();
    const v = this.next();
    const r = Math.sqrt(-2 * Math.log(u));
    this.spare = r * Math.sin(2 * Math.PI * v);
    return r * Math.cos(2 * Math.PI * v);
  }

  /** Fisher-Yates shuffle in place. */
  shuffle<T>(a: T[] | Int32Array | Uint32Array): void {
    for (let i = a.length - 1; i > 0; i--) {
      const j = this.int(i + 1);
      const t = a[i]!; a[i] = a[j]!; a[j] = t;
    }
  }

  /** The full generator state, for checkpoints. */
  state(): RngState {
    return { s: Array.from(this.s), spare: this.spare };
  }

  static fromState(st: RngState): Rng {
    const r = new Rng(0);
    r.s = Uint32Array.from(st.s);
    r.spare = st.spare;
    return r;
  }
}

export interface RngState {
  s: number[];
  spare: number | null;
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

function fmix32(h: number): number {
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

/**
 * A uniform in [0, 1) that is a pure function of (seed, a, b, c): murmur3's finalizer chained over the counters.
 * Counter-based draws (a teacher cache's samples, the device sampler's per-sequence, per-step uniforms) do not depend
 * on the order in which they are made, so work split, batched or resumed differently draws the same numbers.
 */
export function hashUniform(seed: number, a: number, b: number, c: number): number {
  let h = fmix32((seed >>> 0) ^ 0x9e3779b9);
  h = fmix32(h ^ Math.imul(a + 1, 0x9e3779b1));
  h = fmix32(h ^ Math.imul(b + 1, 0x85ebca77));
  h = fmix32(h ^ Math.imul(c + 1, 0xc2b2ae3d));
  return (h + 0.5) / 4294967296;
}
