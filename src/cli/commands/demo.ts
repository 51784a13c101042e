/**
 * `distillery demo`: the embedded end-to-end example (src/demo.ts): train a teacher on the built-in corpus,
 * distill a student from it, train the same student without a teacher, and compare their validation loss.
 */
import { formatHelp, parseArgs, UsageError, type FlagSpec } from '../args.js';
import { threadsProblem } from '../../backend/create.js';
import { checkOutDir } from '../options.js';
import { realFs } from './train.js';
import type { Command, Deps } from '../command.js';

const FLAGS: FlagSpec[] = [
  { name: 'out', kind: 'string', metavar: '<dir>', description: 'folder for the three runs and the report', defaultText: 'runs/demo' },
  { name: 'quick', kind: 'boolean', description: 'a much shorter run (smoke test, about a minute)' },
  { name: 'threads', kind: 'integer', description: 'CPU threads (0 = all cores)', defaultText: '0' },
];

const defaultRunDemo: NonNullable<Deps['runDemo']> = async (o) => {
  const { runDemo } = await import('../../demo.js');
  return runDemo(o);
};

const help = (): string => formatHelp({
  usage: 'distillery demo [--out runs/demo] [--quick] [--threads <n>]',
  description: 'Trains a teacher on the built-in corpus (documentation comments of TypeScript\'s lib files), distills a smaller student from it, trains the same student without a teacher, and prints the validation loss of all three. CPU only, no download.',
  flags: FLAGS,
  examples: ['distillery demo', 'distillery demo --quick --out /tmp/demo'],
});

export const demoCommand: Command = {
  name: 'demo',
  summary: 'train a teacher, distill a student, compare with training from scratch',
  help,
  async run(argv, io, deps) {
    const parsed = parseArgs(argv, FLAGS, 'demo');
    if (parsed.help) { io.out(help()); return 0; }
    if (parsed.positionals.length) throw new UsageError(`demo: unexpected argument '${parsed.positionals[0]}'`, 'the output folder goes after --out');
    const threads = (parsed.values.threads as number | undefined) ?? 0;
    const threadsBad = threadsProblem(threads);
    if (threadsBad !== null) throw new UsageError(`--threads must be ${threadsBad}, got ${threads}`, 'use 0 for all cores');
    const out = (parsed.values.out as string | undefined) ?? 'runs/demo';
    checkOutDir(realFs, out, '--out');
    try {
      await (deps.runDemo ?? defaultRunDemo)({
        out,
        quick: parsed.values.quick === true,
        threads,
        log: (line) => io.err(`${line}\n`),
      });
    } catch (e) {
      // Ctrl-C / SIGTERM during a run: that run wrote its checkpoint; the demo stops there with the signal's code
      const { DemoInterrupted } = await import('../../demo.js');
      if (!(e instanceof DemoInterrupted)) throw e;
      io.err(`${e.message}; run the demo again to start it afresh\n`);
      return e.signal === 'SIGINT' ? 130 : 143;
    }
    return 0;
  },
};
