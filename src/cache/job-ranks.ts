/**
 * How the ranks of a teacher-cache job of several processes agree (src/cache/build.ts): rank 0 decides what concerns
 * the folder and tells the others — or tells them why it stopped, so that they stop with its reason and exit code
 * instead of a lost connection; every rank checks it read what rank 0 read; and the job's figures are summed at the
 * end. One process (world 1) runs the same code with no collective.
 */
import type { Communicator } from '../parallel/comm.js';
import { DistilleryError, InputError } from '../util/errors.js';
import { identityDifferences, type CacheIdentity } from './store.js';

/** How long the other ranks wait for rank 0's decisions (it may be verifying a large cache's shards first). */
export const DAY_MS = 86_400_000;

type Decision<P> = { ok: P } | { error: string; hint: string | null; input: boolean };

/**
 * Rank 0 runs `decide`; every rank returns its result. If it throws, rank 0 rethrows and the others throw its
 * message ("rank 0 stopped: ...", as an InputError where rank 0's was one: the same exit code, so a launcher reports it
 * once).
 */
export function fromRank0<P>(comm: Communicator, decide: () => P): P {
  if (comm.world === 1) return decide();
  let mine: Decision<P> | null = null, thrown: unknown = null;
  if (comm.rank === 0) {
    try { mine = { ok: decide() }; } catch (e) {
      thrown = e;
      mine = { error: e instanceof Error ? e.message : String(e), hint: e instanceof DistilleryError ? e.hint ?? null : null, input: e instanceof InputError };
    }
  }
  comm.barrier(DAY_MS);
  const got = JSON.parse(Buffer.from(comm.broadcast(mine ? Buffer.from(JSON.stringify(mine)) : new Uint8Array())).toString('utf8')) as Decision<P>;
  if (thrown !== null) throw thrown;
  if ('error' in got) {
    const msg = `rank 0 stopped: ${got.error}`, hint = got.hint ?? undefined;
    throw got.input ? new InputError(msg, hint) : new DistilleryError(msg, hint);
  }
  return got.ok;
}

/**
 * Every rank compares what the cache is of as it read it (`mine`) with rank 0's; the job stops on every rank if one
 * differs (another teacher, tokenizer, data or setting on some rank would put other bytes under rank 0's manifest).
 */
export function checkSameInputs(comm: Communicator, rank0: CacheIdentity, mine: CacheIdentity): void {
  if (comm.world === 1) return;
  const diffs = identityDifferences(rank0, mine);
  if (rank0.windows !== mine.windows) diffs.push(`windows: ${rank0.windows} vs ${mine.windows}`);
  const flags = new Float64Array(comm.world);
  flags[comm.rank] = diffs.length ? 1 : 0;
  const odd = [...comm.allReduceHost(flags)].flatMap((f, r) => (f > 0 ? [r] : []));
  const hint = 'every rank must be started with the same options and read the same teacher and data files (on several hosts: the same paths on a shared file system)';
  // the odd rank's refusal is an input error (exit 2), so a launcher shows it beside rank 0's (exit 1)
  if (diffs.length) throw new InputError(`rank ${comm.rank}: the job's inputs differ from rank 0's (${diffs.join('; ')})`, hint);
  if (odd.length) throw new DistilleryError(`rank ${comm.rank}: rank${odd.length > 1 ? 's' : ''} ${odd.join(', ')} read other inputs than rank 0 (${odd.length > 1 ? 'their errors name' : 'its error names'} what differs)`, hint);
}

/** A rank's share of the job's figures. */
export interface RankFigures { written: number; tokens: number; seconds: number; steadyTokens: number; steadySeconds: number; stopped: boolean }

/**
 * The job's figures: shards written and tokens summed over ranks; the rates are the tokens over the longest rank's
 * time (the ranks run side by side; an uneven split of the shards makes one rank the last); `stopped`: any rank stopped
 * on a signal. A steady rate exists only if every rank that computed has one.
 */
export function jobFigures(comm: Communicator, f: RankFigures): { written: number; tokensPerSecond: number; steadyTokensPerSecond: number | null; stopped: boolean } {
  const { world, rank } = comm;
  const x = new Float64Array(4 + 2 * world);
  x[0] = f.written; x[1] = f.tokens; x[2] = f.steadyTokens; x[3] = f.stopped ? 1 : 0;
  x[4 + rank] = f.seconds;
  // a rank that computed nothing has no steady time and no say in the steady rate; one that computed and has none, -1
  x[4 + world + rank] = f.steadySeconds > 0 ? f.steadySeconds : f.tokens > 0 ? -1 : 0;
  const s = world === 1 ? x : comm.allReduceHost(x);
  const seconds = Math.max(...s.subarray(4, 4 + world)), steady = s.subarray(4 + world);
  const steadySeconds = Math.max(...steady), missing = steady.some((v) => v < 0);
  return {
    written: s[0]!, tokensPerSecond: s[1]! / Math.max(seconds, 1e-9),
    steadyTokensPerSecond: !missing && steadySeconds > 0 ? s[2]! / steadySeconds : null, stopped: s[3]! > 0,
  };
}
