/**
 * The process group of a data-parallel run, from the variables every launcher sets (torchrun, Slurm and Kubernetes
 * wrappers, and `distillery ... --gpus N`): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT. Absent (or
 * WORLD_SIZE 1): a single process. Anything inconsistent is refused by name before any work starts. distillery's
 * rendezvous listens on MASTER_PORT + 1 (or DISTILLERY_MASTER_PORT), since torchrun's agent holds MASTER_PORT.
 */
import { InputError } from '../util/errors.js';

export interface DistEnv {
  rank: number;
  world: number;
  /** The rank on this host: the GPU this process uses. */
  localRank: number;
  masterAddr: string;
  masterPort: number;
  /**
   * The port rank 0 listens on for distillery's own rendezvous: DISTILLERY_MASTER_PORT, else MASTER_PORT + 1 (torchrun's
   * agent already serves its store on MASTER_PORT).
   */
  commPort: number;
}

/** The process group, or null for a single process. */
export function distEnv(env: NodeJS.ProcessEnv = process.env): DistEnv | null {
  const ws = env.WORLD_SIZE;
  if (ws === undefined || ws === '' || ws === '1') return null;
  const int = (name: string, v: string | undefined, min: number, max?: number): number => {
    const x = Number(v);
    if (v === undefined || v === '' || !Number.isInteger(x) || x < min || (max !== undefined && x > max)) {
      throw new InputError(`${name}=${v ?? '(unset)'} is not valid for a run of WORLD_SIZE ${ws}`,
        `set ${name} to an integer${max !== undefined ? ` from ${min} to ${max}` : ` >= ${min}`} (as torchrun does), or unset WORLD_SIZE for a single process`);
    }
    return x;
  };
  const world = int('WORLD_SIZE', ws, 2);
  const rank = int('RANK', env.RANK, 0, world - 1);
  const localRank = int('LOCAL_RANK', env.LOCAL_RANK ?? String(rank), 0, world - 1);
  const masterAddr = env.MASTER_ADDR ?? '';
  if (masterAddr === '') throw new InputError('MASTER_ADDR is not set for a run of several processes', 'set MASTER_ADDR to the host of rank 0 (e.g. 127.0.0.1 on one machine)');
  const masterPort = int('MASTER_PORT', env.MASTER_PORT, 1, 65535);
  const commPort = env.DISTILLERY_MASTER_PORT !== undefined ? int('DISTILLERY_MASTER_PORT', env.DISTILLERY_MASTER_PORT, 1, 65535)
    : masterPort < 65535 ? masterPort + 1 : masterPort - 1;
  return { rank, world, localRank, masterAddr, masterPort, commPort };
}

/** A timeout or grace period set in seconds by env[name], in milliseconds; undefined where unset or not a positive number. */
export function envSecondsMs(name: string, env: NodeJS.ProcessEnv = process.env): number | undefined {
  const s = Number(env[name]);
  return Number.isFinite(s) && s > 0 ? s * 1000 : undefined;
}
