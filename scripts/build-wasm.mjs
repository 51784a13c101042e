// Assembles the CPU backend's WebAssembly kernels: src/backend/cpu/wasm/*.wat -> dist/src/backend/cpu/wasm/*.wasm
// (next to the compiled wasm.js that loads them), with the wabt package (a devDependency: the .wasm is a build
// output, the readable .wat is the source). Run by `npm run build` after tsc. Fails the build on a syntax or
// validation error.
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { stdout } from 'node:process';
import { fileURLToPath } from 'node:url';
import wabtInit from 'wabt';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const srcDir = join(root, 'src/backend/cpu/wasm');
const outDir = join(root, 'dist/src/backend/cpu/wasm');
const wabt = await wabtInit();
mkdirSync(outDir, { recursive: true });
for (const f of readdirSync(srcDir).filter((x) => x.endsWith('.wat'))) {
  const features = { simd: true, threads: true };
  const mod = wabt.parseWat(f, readFileSync(join(srcDir, f), 'utf8'), features);
  try {
    mod.resolveNames();
    mod.validate(features);
    const { buffer } = mod.toBinary({ log: false, write_debug_names: true });
    const out = join(outDir, f.replace(/\.wat$/, '.wasm'));
    writeFileSync(out, buffer);
    stdout.write(`build-wasm: ${f} -> ${out.slice(root.length + 1)} (${buffer.length} bytes)\n`);
  } finally {
    mod.destroy();
  }
}
