/**
 * `--gpus N` of the commands that run as several processes (train, distill, teacher-cache): the flag's checks, and
 * the launch of N ranks of the same command on this host (src/parallel/launcher.ts).
 */
import { UsageError } from './args.js';
import type { LaunchIo } from '../parallel/launcher.js';

/** The validated --gpus value (1 when absent); refused inside a process group a launcher already started. */
export function gpusOf(values: Record<string, unknown>, env: NodeJS.ProcessEnv = process.env): number {
  const gpus = (values.gpus as number | undefined) ?? 1;
  if (!(Number.isInteger(gpus) && gpus >= 1 && gpus <= 1024)) throw new UsageError(`--gpus must be an integer from 1 to 1024, got ${gpus}`, 'e.g. --gpus 8 for every GPU of the host');
  if (gpus > 1 && env.WORLD_SIZE !== undefined && env.WORLD_SIZE !== '1') {
    throw new UsageError(`--gpus ${gpus} starts its own processes, but this one is already rank ${env.RANK ?? '?'} of WORLD_SIZE ${env.WORLD_SIZE}`,
      'drop --gpus when a launcher (torchrun, Slurm) starts the ranks');
  }
  return gpus;
}

/** Runs `distillery <command> <argv without --gpus>` as `gpus` ranks and resolves with the launcher's exit code. */
export async function launchGpus(command: string, argv: readonly string[], gpus: number, io: LaunchIo): Promise<number> {
  const { launchRanks, withoutGpusFlag } = await import('../parallel/launcher.js');
  const script = process.argv[1];
  if (!script) throw new UsageError('--gpus: cannot find the distillery script to start the ranks with', 'start the ranks with torchrun\'s variables instead');
  return launchRanks(script, [command, ...withoutGpusFlag(argv)], gpus, io);
}
