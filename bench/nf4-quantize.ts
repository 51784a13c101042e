/**
 * NF4 quantization throughput on this machine: one thread (quantizeNf4) against every core (Nf4Quantizer), over a
 * tensor the size of a 7B model's largest projection matrix (18944 × 3584), and what a 7B model's 6.5 billion matrix
 * weights would take at each rate. Usage: node dist/bench/nf4-quantize.js [threads]
 */
import { availableParallelism } from 'node:os';
import { quantizeNf4 } from '../src/quant/nf4.js';
import { Nf4Quantizer } from '../src/quant/nf4-parallel.js';

const n = 18944 * 3584, threads = Number(process.argv[2] ?? Math.min(16, availableParallelism()));
const x = new Float32Array(n);
for (let i = 0; i < n; i++) x[i] = Math.sin(i * 1.37) * 0.02 * (1 + (i % 5));
const time = (f: () => void): number => { const t = process.hrtime.bigint(); f(); return Number(process.hrtime.bigint() - t) / 1e9; };
quantizeNf4(x.subarray(0, 1 << 20));
const one = time(() => quantizeNf4(x));
const q = new Nf4Quantizer(threads);
q.quantize(x.subarray(0, 1 << 22));
const many = time(() => q.quantize(x));
q.dispose();
const weights7b = 6.53e9;
console.log(`NF4 quantization of ${(n / 1e6).toFixed(1)}M weights: 1 thread ${(n / one / 1e6).toFixed(1)}M/s (${one.toFixed(2)} s), `
  + `${threads} threads ${(n / many / 1e6).toFixed(1)}M/s (${many.toFixed(2)} s); a 7B model's matrices: ${(weights7b / (n / one)).toFixed(0)} s vs ${(weights7b / (n / many)).toFixed(0)} s`);
