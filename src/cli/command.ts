/**
 * What a CLI command is: a name, a one-line summary for `distillery --help`, its help text, and a run function
 * that takes its arguments (after the command name), where to write, and the functions it calls into the rest of
 * distillery (injectable, so tests can run a command without training a model).
 */
import type { RunOptions } from '../train/options.js';
import type { Io } from './args.js';

export interface Deps {
  /** src/train/run.ts */
  runTraining?: (opts: RunOptions, hooks: { log: (line: string) => void }) => Promise<unknown>;
  /** src/demo.ts */
  runDemo?: (opts: { out: string; quick?: boolean; threads?: number; log?: (line: string) => void }) => Promise<unknown>;
  /** src/backend/cuda/cli.ts; null means "not in this build". */
  kernelsCommand?: ((sub: string, args: Record<string, unknown>) => Promise<number>) | null;
}

export interface Command {
  name: string;
  summary: string;
  help(): string;
  /** Returns the exit code; throws UsageError (exit 2) or DistilleryError (exit 1) on failure. */
  run(argv: string[], io: Io, deps: Deps): Promise<number>;
}
