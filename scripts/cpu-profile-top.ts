/**
 * Summarizes V8 CPU profiles (node --cpu-prof): the functions with the most self time and the most inclusive time, and
 * the garbage collector's, idle and program shares. For finding where a run's host time goes (e.g. a host stall between
 * GPU regions) without a profiler UI.
 *
 *   node dist/scripts/cpu-profile-top.js FILE.cpuprofile [more files] [--top N]
 */
import { readFileSync } from 'node:fs';
import { basename } from 'node:path';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface CpuProfile { nodes: ProfileNode[]; samples: number[]; timeDeltas: number[]; startTime: number; endTime: number }

function frameName(n: ProfileNode): string {
  const f = n.callFrame;
  const fn = f.functionName || '(anonymous)';
  return f.url ? `${fn} ${basename(f.url)}:${f.lineNumber + 1}` : fn;
}

function summarize(file: string, top: number): void {
  const p = JSON.parse(readFileSync(file, 'utf8')) as CpuProfile;
  const byId = new Map<number, ProfileNode>();
  const parent = new Map<number, number>();
  for (const n of p.nodes) byId.set(n.id, n);
  for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const self = new Map<string, number>(), incl = new Map<string, number>();
  let total = 0;
  // timeDeltas[i] is the time before sample i; the sample's weight is the gap to the next one (the last: its own delta)
  for (let i = 0; i < p.samples.length; i++) {
    const us = i + 1 < p.timeDeltas.length ? p.timeDeltas[i + 1]! : p.timeDeltas[i]!;
    total += us;
    const leaf = byId.get(p.samples[i]!);
    if (!leaf) continue;
    const name = frameName(leaf);
    self.set(name, (self.get(name) ?? 0) + us);
    const seen = new Set<string>();
    for (let id: number | undefined = leaf.id; id !== undefined; id = parent.get(id)) {
      const nm = frameName(byId.get(id)!);
      if (seen.has(nm)) continue;
      seen.add(nm);
      incl.set(nm, (incl.get(nm) ?? 0) + us);
    }
  }
  const ms = (us: number): string => (us / 1000).toFixed(1).padStart(9);
  const pct = (us: number): string => `${((100 * us) / Math.max(total, 1)).toFixed(1).padStart(5)}%`;
  console.log(`== ${file}: ${(total / 1000).toFixed(1)} ms sampled, ${p.samples.length} samples`);
  for (const [title, m] of [['self', self], ['inclusive', incl]] as const) {
    console.log(`-- top ${top} by ${title} time (ms, share)`);
    for (const [name, us] of [...m].sort((a, b) => b[1] - a[1]).slice(0, top)) console.log(`${ms(us)} ${pct(us)}  ${name}`);
  }
}

const args = process.argv.slice(2);
const ti = args.indexOf('--top');
const top = ti >= 0 ? Number(args.splice(ti, 2)[1]) : 30;
if (args.length === 0 || !Number.isInteger(top) || top <= 0) {
  console.error('usage: node dist/scripts/cpu-profile-top.js FILE.cpuprofile [more files] [--top N]');
  process.exit(2);
}
for (const f of args) summarize(f, top);
