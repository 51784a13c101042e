/**
 * Python's `random.Random` as far as lm-evaluation-harness's few-shot sampler uses it: the Mersenne Twister (MT19937)
 * seeded from a non-negative integer as CPython seeds it (`init_by_array` over the integer's 32-bit words), and
 * `sample(population, k)`, whose draws decide which items become a context's examples. Following CPython draw for draw
 * is what makes `--fewshot` contexts the harness's own (test/fixtures/py-random.json holds CPython's output).
 */

const N = 624, M = 397;

export class PyRandom {
  private readonly mt = new Uint32Array(N);
  private mti = N + 1;

  /** `random.Random(seed)` for an integer 0 <= seed < 2^53. */
  constructor(seed: number) {
    if (!Number.isSafeInteger(seed) || seed < 0) throw new RangeError(`PyRandom: the seed must be an integer in [0, 2^53), got ${seed}`);
    // CPython: the absolute value's 32-bit words, least significant first ([0] for 0)
    const key = seed < 2 ** 32 ? [seed] : [seed % 2 ** 32, Math.floor(seed / 2 ** 32)];
    this.initByArray(key);
  }

  private initGenrand(s: number): void {
    const mt = this.mt;
    mt[0] = s >>> 0;
    for (let i = 1; i < N; i++) {
      const p = mt[i - 1]! ^ (mt[i - 1]! >>> 30);
      mt[i] = (Math.imul(1812433253, p) + i) >>> 0;
    }
    this.mti = N;
  }

  private initByArray(key: readonly number[]): void {
    const mt = this.mt;
    this.initGenrand(19650218);
    let i = 1, j = 0;
    for (let k = Math.max(N, key.length); k > 0; k--) {
      const p = mt[i - 1]! ^ (mt[i - 1]! >>> 30);
      mt[i] = ((mt[i]! ^ Math.imul(p, 1664525)) + key[j]! + j) >>> 0;
      i++; j++;
      if (i >= N) { mt[0] = mt[N - 1]!; i = 1; }
      if (j >= key.length) j = 0;
    }
    for (let k = N - 1; k > 0; k--) {
      const p = mt[i - 1]! ^ (mt[i - 1]! >>> 30);
      mt[i] = ((mt[i]! ^ Math.imul(p, 1566083941)) - i) >>> 0;
      i++;
      if (i >= N) { mt[0] = mt[N - 1]!; i = 1; }
    }
    mt[0] = 0x80000000;
  }

  /** The next 32-bit output (genrand_uint32). */
  uint32(): number {
    const mt = this.mt;
    if (this.mti >= N) {
      for (let kk = 0; kk < N; kk++) {
        const y = (mt[kk]! & 0x80000000) | (mt[(kk + 1) % N]! & 0x7fffffff);
        mt[kk] = mt[(kk + M) % N]! ^ (y >>> 1) ^ (y & 1 ? 0x9908b0df : 0);
      }
      this.mti = 0;
    }
    let y = mt[this.mti++]!;
    y ^= y >>> 11;
    y ^= (y << 7) & 0x9d2c5680;
    y ^= (y << 15) & 0xefc60000;
    y ^= y >>> 18;
    return y >>> 0;
  }

  /** `getrandbits(k)` for 0 <= k <= 32. */
  getrandbits(k: number): number {
    if (!(Number.isInteger(k) && k >= 0 && k <= 32)) throw new RangeError(`PyRandom.getrandbits: k must be in [0, 32], got ${k}`);
    return k === 0 ? 0 : this.uint32() >>> (32 - k);
  }

  /** `_randbelow(n)`: uniform in [0, n) by rejection over n's bit length (n >= 1, below 2^32). */
  randbelow(n: number): number {
    const k = 32 - Math.clz32(n);
    let r = this.getrandbits(k);
    while (r >= n) r = this.getrandbits(k);
    return r;
  }

  /**
   * `sample(range(n), k)`: k distinct indices of [0, n) in CPython's order. Like CPython it draws from a shrinking pool
   * when n is small against k (the size of a k-element set), else by rejection against the indices already taken.
   */
  sample(n: number, k: number): number[] {
    if (!(Number.isInteger(k) && k >= 0 && k <= n)) throw new RangeError(`PyRandom.sample: k must be in [0, ${n}], got ${k}`);
    const out: number[] = [];
    let setsize = 21;
    if (k > 5) setsize += 4 ** Math.ceil(Math.log(k * 3) / Math.log(4));
    if (n <= setsize) {
      const pool = Array.from({ length: n }, (_, i) => i);
      for (let i = 0; i < k; i++) {
        const j = this.randbelow(n - i);
        out.push(pool[j]!);
        pool[j] = pool[n - i - 1]!;
      }
    } else {
      const taken = new Set<number>();
      for (let i = 0; i < k; i++) {
        let j = this.randbelow(n);
        while (taken.has(j)) j = this.randbelow(n);
        taken.add(j);
        out.push(j);
      }
    }
    return out;
  }
}
