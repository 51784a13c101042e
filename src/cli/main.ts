/**
 * The `distillery` command line: dispatches to a command, prints its errors, and returns the exit code
 * (bin/distillery.js sets process.exitCode from it).
 *
 * Exit codes: 0 success; 2 bad usage or input (UsageError, InputError: unknown command or option, bad value, missing
 * or unreadable file, an --out that is a file);
 * 1 a failure while running (any other DistilleryError, printed as `error: <message>` and `  hint: <hint>`
 * without a stack). Anything else is a bug: its stack is printed, exit 1.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { didYouMean, UsageError, type Io } from './args.js';
import type { Command, Deps } from './command.js';
import { DistilleryError, InputError } from '../util/errors.js';
import { trainCommand, distillCommand } from './commands/train.js';
import { generateCommand } from './commands/generate.js';
import { evalCommand } from './commands/eval.js';
import { inspectCommand } from './commands/inspect.js';
import { demoCommand } from './commands/demo.js';
import { kernelsCommand } from './commands/kernels.js';
import { exportCommand } from './commands/export.js';
import { teacherCacheCommand } from './commands/teacher-cache.js';

export const COMMANDS: readonly Command[] = [
  trainCommand, distillCommand, teacherCacheCommand, generateCommand, evalCommand, inspectCommand, demoCommand, kernelsCommand, exportCommand,
];

/** The version field of distillery's package.json (found upward from this file, in src/ or dist/src/). */
export function version(): string {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 6; i++) {
    const p = path.join(dir, 'package.json');
    if (fs.existsSync(p)) {
      const pkg = JSON.parse(fs.readFileSync(p, 'utf8')) as { name?: string; version?: string };
      if (pkg.name === 'distillery' && pkg.version) return pkg.version;
    }
    dir = path.dirname(dir);
  }
  return 'unknown';
}

export function globalHelp(): string {
  const w = Math.max(...COMMANDS.map((c) => c.name.length)) + 2;
  return [
    'usage: distillery <command> [options]',
    '',
    'Train transformer language models and distill a teacher into a smaller student.',
    '',
    'commands:',
    ...COMMANDS.map((c) => `  ${c.name.padEnd(w)}${c.summary}`),
    '',
    'options:',
    '  -h, --help     show this help (or a command\'s: distillery <command> --help)',
    '  --version      print the version',
    '',
    'Full reference: docs/cli.md',
    '',
  ].join('\n');
}

let pipeGuard = false;
/** `distillery inspect x | head` closes stdout early: stop quietly instead of crashing on EPIPE. */
function guardPipes(): void {
  if (pipeGuard) return;
  pipeGuard = true;
  process.stdout.on('error', (e: NodeJS.ErrnoException) => {
    if (e.code === 'EPIPE') process.exit(typeof process.exitCode === 'number' ? process.exitCode : 0);
    throw e;
  });
}

const processIo: Io = {
  out: (s) => { guardPipes(); process.stdout.write(s); },
  err: (s) => { process.stderr.write(s); },
};

/** Prints an error as the CLI shows it and returns its exit code. */
export function reportError(e: unknown, io: Io): number {
  if (e instanceof DistilleryError) {
    io.err(`error: ${e.message}\n`);
    if (e.hint) io.err(`  hint: ${e.hint}\n`);
    return e instanceof InputError ? 2 : 1;
  }
  io.err(`${e instanceof Error ? (e.stack ?? String(e)) : String(e)}\n`);
  return 1;
}

/** Runs the CLI on argv (without `node` and the script); returns the exit code. */
export async function main(argv: string[], io: Io = processIo, deps: Deps = {}): Promise<number> {
  if (io === processIo) guardPipes(); // every command's stdout, including those that write to it directly
  try {
    const [first, ...rest] = argv;
    if (first === undefined) { io.err(globalHelp()); return 2; }
    if (first === '-h' || first === '--help' || first === 'help') {
      const target = first === 'help' ? rest[0] : undefined;
      const cmd = target !== undefined ? COMMANDS.find((c) => c.name === target) : undefined;
      if (target !== undefined && !cmd) throw unknownCommand(target);
      io.out(cmd ? cmd.help() : globalHelp());
      return 0;
    }
    if (first === '--version' || first === '-v' || first === 'version') { io.out(`distillery ${version()}\n`); return 0; }
    const cmd = COMMANDS.find((c) => c.name === first);
    if (!cmd) throw unknownCommand(first);
    return await cmd.run(rest, io, deps);
  } catch (e) {
    return reportError(e, io);
  }
}

function unknownCommand(name: string): UsageError {
  const names = COMMANDS.map((c) => c.name);
  if (name.startsWith('-')) return new UsageError(`unknown option ${name}`, "options go after the command: distillery <command> [options]; see 'distillery --help'");
  return new UsageError(`unknown command '${name}'`, didYouMean(name, names, `commands: ${names.join(', ')}`, (s) => `'distillery ${s}'`));
}
