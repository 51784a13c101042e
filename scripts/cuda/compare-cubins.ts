/**
 * Whether a change to kernel generators changes the machine code: compiles every gate spec (test/cuda/helpers.ts's
 * gateSpecs: the real plans, the representative set and the toy steps) whose description matches --family, from this
 * tree and from another built tree (its dist/test/cuda/helpers.js), with nvcc for one architecture, and compares the
 * cubins byte for byte, with ptxas' registers and spills of each side. A refactor of kernel source into __device__
 * helpers that leaves every cubin identical cannot have changed numerics or speed on that architecture (the GPU suite
 * still runs the NVRTC build the backend uses). Prints a line per spec that differs and a summary; needs nvcc, no GPU.
 *   node dist/scripts/cuda/compare-cubins.js --other /tmp/oldtree [--family '^attention_\w+_bf16 '] [--arch sm_90]
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { spawnSync } from 'node:child_process';
import { findNvcc } from '../../src/backend/cuda/nvcc.js';
import { gateSpecs } from '../../test/cuda/helpers.js';

interface Spec { describe(): string; source(): string }

function arg(name: string, dflt?: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
}

/** The cubin's bytes and ptxas' resource lines of one source. */
function compile(nvcc: string, arch: string, dir: string, tag: string, src: string): { cubin: Buffer | null; info: string } {
  const cu = join(dir, `${tag}.cu`), out = join(dir, `${tag}.cubin`);
  writeFileSync(cu, src);
  const r = spawnSync(nvcc, ['-std=c++17', `-arch=${arch}`, '-cubin', '-o', out, '-Xptxas', '-v', cu], { encoding: 'utf8' });
  const info = `${r.stderr}${r.stdout}`.split('\n').filter((l) => /Used \d+ registers|spill stores/.test(l))
    .map((l) => l.replace(/^ptxas info\s*:\s*/, '').trim()).join('; ');
  return { cubin: r.status === 0 ? readFileSync(out) : null, info: r.status === 0 ? info : `nvcc failed: ${r.stderr.trim().split('\n').slice(-2).join(' ')}` };
}

async function main(): Promise<void> {
  const other = arg('other');
  if (!other) { console.error('compare-cubins: --other <a built tree (with dist/test/cuda/helpers.js)> is required'); process.exit(2); }
  const family = new RegExp(arg('family', '.')!), arch = arg('arch', 'sm_90')!;
  const nvcc = findNvcc();
  if (!nvcc) { console.error('compare-cubins: nvcc not found'); process.exit(2); }
  const theirs = (await import(resolve(other, 'dist/test/cuda/helpers.js')) as { gateSpecs: () => { specs: Spec[] } }).gateSpecs().specs;
  const byName = new Map(theirs.map((s) => [s.describe(), s]));
  const mine = (gateSpecs().specs as Spec[]).filter((s) => family.test(s.describe()));
  const dir = mkdtempSync(join(tmpdir(), 'compare-cubins-'));
  let same = 0, differ = 0, onlyHere = 0;
  try {
    for (const s of mine) {
      const o = byName.get(s.describe());
      if (!o) { onlyHere++; console.log(`only in this tree: ${s.describe()}`); continue; }
      if (o.source() === s.source()) { same++; continue; }
      const a = compile(nvcc.path, arch, dir, 'other', o.source()), b = compile(nvcc.path, arch, dir, 'this', s.source());
      if (a.cubin && b.cubin && a.cubin.equals(b.cubin)) { same++; continue; }
      differ++;
      console.log(`differs: ${s.describe()}\n  other: ${a.info}\n  this:  ${b.info}`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  const here = new Set(mine.map((s) => s.describe()));
  const onlyThere = theirs.filter((s) => family.test(s.describe()) && !here.has(s.describe()));
  for (const s of onlyThere) console.log(`only in the other tree: ${s.describe()}`);
  console.log(`${mine.length} specs matching ${family} (${arch}, nvcc ${nvcc.version}): ${same} identical cubins, ${differ} differ ` +
    `(or failed to compile), ${onlyHere} only in this tree, ${onlyThere.length} only in the other`);
}

await main();
