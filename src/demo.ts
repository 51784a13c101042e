/**
 * The embedded default (`npm start` / `distillery demo`): the whole job on the CPU with no download.
 *
 * 1. Train a teacher on a real corpus already on the machine after `npm install`: the documentation comments
 *    of TypeScript's own lib .d.ts files (a dependency of this project), with a byte-level BPE trained on it.
 * 2. Distill a smaller student from that teacher (online teacher, KL at temperature T mixed with cross-entropy).
 * 3. Train the same student from the same initial weights, on the same data and steps, without a teacher.
 * 4. Print the teacher's, the distilled student's and the scratch student's validation cross-entropy on the same
 *    held-out windows, on lines labelled `teacher`, `distilled` and `scratch`.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { runTraining, type RunSummary } from './train/run.js';
import { DEFAULT_RUN_OPTIONS, type RunOptions } from './train/options.js';
import { holdsRun } from './train/run-folder.js';
import { InputError } from './util/errors.js';

export interface DemoOptions {
  out: string;
  /** A much shorter run (for tests and smoke checks). */
  quick?: boolean;
  threads?: number;
  log?: (line: string) => void;
}

export interface DemoResult {
  teacher: RunSummary;
  distilled: RunSummary;
  scratch: RunSummary;
  table: string;
}

/** The file that marks a folder as the demo's: its three runs may be replaced by the next demo. */
export const DEMO_MARKER = '.distillery-demo';

/**
 * Refuses an --out whose teacher/, distilled/ or scratch/ holds a run the demo did not make (the demo replaces its own
 * runs; it used to replace anyone's), then marks the folder as the demo's.
 */
function claimDemoFolder(out: string, names: readonly string[]): void {
  // (a folder with the report of an earlier demo, demo.txt with the demo's verdict line, is the demo's too; a file of
  // that name that is not the demo's report proves nothing)
  if (!fs.existsSync(path.join(out, DEMO_MARKER)) && !isDemoReport(path.join(out, 'demo.txt'))) {
    const taken = names.filter((n) => fs.existsSync(path.join(out, n)) && holdsRun(path.join(out, n)));
    const files = ['demo.txt', 'demo.json'].filter((f) => fs.existsSync(path.join(out, f)));
    if (taken.length > 0 || files.length > 0) {
      const what = [...taken.map((n) => `${n}/`), ...files];
      throw new InputError(`--out ${out}: ${what.join(', ')} ${what.length > 1 ? 'are' : 'is'} not the demo's (the demo would replace ${what.length > 1 ? 'them' : 'it'})`,
        'pick another --out: the demo replaces only its own runs and reports');
    }
  }
  fs.writeFileSync(path.join(out, DEMO_MARKER), 'made by distillery demo: its teacher/, distilled/ and scratch/ runs are replaced by the next demo\n');
}

/** Whether `f` is a demo's report (its verdict line names the distilled and the scratch student). */
function isDemoReport(f: string): boolean {
  try { return /distillation (helped|did not help in this run): the distilled student's validation loss/.test(fs.readFileSync(f, 'utf8')); } catch { return false; }
}

/** A run that ended on SIGINT / SIGTERM: the demo stops after it (the next step would need its final model). */
export class DemoInterrupted extends Error {
  constructor(readonly signal: 'SIGINT' | 'SIGTERM', readonly stage: string) { super(`the demo stopped during its ${stage} (${signal})`); }
}

/** The recipe. Kept in one place so the README, the CLI and the tests describe the same run. */
export function demoRecipe(out: string, quick: boolean, threads: number): { teacher: RunOptions; distilled: RunOptions; scratch: RunOptions } {
  const common: RunOptions = {
    ...DEFAULT_RUN_OPTIONS,
    mode: 'train', out, data: ['builtin:docs'], threads,
    maxChars: quick ? 150_000 : 600_000,
    vocabSize: quick ? 384 : 512,
    batch: 8, seq: quick ? 32 : 64,
    seed: 7, valFraction: 0.05, evalBatches: quick ? 4 : 16,
    quiet: false,
    overwrite: true, // a demo run starts afresh: it replaces the previous demo's runs in its folder
  };
  const teacherSteps = quick ? 40 : 300, studentSteps = quick ? 30 : 150;
  const teacher: RunOptions = {
    ...common, out: path.join(out, 'teacher'), model: quick ? 'tiny' : 'small', steps: teacherSteps,
    lr: 3e-3, warmup: Math.round(teacherSteps * 0.05), evalEvery: Math.max(10, Math.round(teacherSteps / 5)), saveEvery: teacherSteps,
  };
  const tokenizer = path.join(out, 'teacher', 'tokenizer.json');
  const student: RunOptions = {
    ...common, model: 'tiny', steps: studentSteps, tokenizer, lr: 3e-3, warmup: Math.round(studentSteps * 0.05),
    evalEvery: Math.max(10, Math.round(studentSteps / 5)), saveEvery: studentSteps,
  };
  // alpha 0.9 with T = 1 won a sweep over alpha ∈ {0.5, 0.7, 0.9, 1} × T ∈ {1, 2, 4} and the reverse-KL/JSD losses
  // (docs/measurements/demo-sweep.txt): higher temperatures and reverse KL hurt this small student.
  return {
    teacher,
    distilled: { ...student, mode: 'distill', out: path.join(out, 'distilled'), teacher: path.join(out, 'teacher', 'final'),
      loss: 'kl', alpha: 0.9, temperature: 1 },
    scratch: { ...student, mode: 'train', out: path.join(out, 'scratch') },
  };
}

export function formatTable(r: Omit<DemoResult, 'table'>): string {
  const rows: Array<[string, RunSummary]> = [['teacher', r.teacher], ['distilled', r.distilled], ['scratch', r.scratch]];
  const lines = ['model      parameters  steps  val loss (CE)  val perplexity  tokens/s'];
  for (const [name, s] of rows) {
    lines.push(`${name.padEnd(10)} ${String(s.parameters).padStart(10)}  ${String(s.steps).padStart(5)}  ${s.finalValCe.toFixed(4).padStart(13)}  ${s.finalValPerplexity.toFixed(2).padStart(14)}  ${String(Math.round(s.tokensPerSecond)).padStart(8)}`);
  }
  return lines.join('\n');
}

export async function runDemo(o: DemoOptions): Promise<DemoResult> {
  const log = o.log ?? ((s: string) => process.stderr.write(s + '\n'));
  const out = path.resolve(o.out);
  fs.mkdirSync(out, { recursive: true });
  const recipe = demoRecipe(out, Boolean(o.quick), o.threads ?? 0);
  claimDemoFolder(out, ['teacher', 'distilled', 'scratch']);
  const started = Date.now();
  const stage = async (name: string, opts: RunOptions): Promise<RunSummary> => {
    const s = await runTraining(opts, { log });
    if (s.signal) throw new DemoInterrupted(s.signal, name);
    return s;
  };
  log(`== 1/3 teacher: ${recipe.teacher.model}, ${recipe.teacher.steps} steps on builtin:docs ==`);
  const teacher = await stage('teacher', recipe.teacher);
  log(`== 2/3 distilled student: ${recipe.distilled.model}, ${recipe.distilled.steps} steps, ${recipe.distilled.loss} at T=${recipe.distilled.temperature}, alpha=${recipe.distilled.alpha} ==`);
  const distilled = await stage('distilled student', recipe.distilled);
  log(`== 3/3 scratch student: ${recipe.scratch.model}, ${recipe.scratch.steps} steps, same data and initial weights, no teacher ==`);
  const scratch = await stage('scratch student', recipe.scratch);
  const table = formatTable({ teacher, distilled, scratch });
  const gain = scratch.finalValCe - distilled.finalValCe;
  const verdict = gain > 0
    ? `distillation helped: the distilled student's validation loss is ${gain.toFixed(4)} lower than the scratch student's`
    : `distillation did not help in this run: the distilled student's validation loss is ${(-gain).toFixed(4)} higher than the scratch student's`;
  const report = `${table}\n\n${verdict} (validation cross-entropy on the same held-out windows; ${((Date.now() - started) / 1000).toFixed(0)}s in all)\n`;
  process.stdout.write('\n' + report);
  fs.writeFileSync(path.join(out, 'demo.txt'), report);
  fs.writeFileSync(path.join(out, 'demo.json'), JSON.stringify({ teacher, distilled, scratch }, null, 2) + '\n');
  return { teacher, distilled, scratch, table };
}
