/**
 * `distillery train|distill --gpus N` on one host: starts N processes of the same command (without --gpus), each with
 * the process-group variables torchrun would set (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR 127.0.0.1, a free
 * MASTER_PORT, which distillery's rendezvous uses itself: DISTILLERY_MASTER_PORT) and NCCL_NVLS_ENABLE=0, so that every
 * rank is an ordinary rank of a launcher-started run; each in its own process group, so a terminal's Ctrl-C reaches the
 * launcher only, which passes it on once. Rank 0's
 * output is the command's; another rank's stderr is shown when it fails. SIGINT and SIGTERM are passed to every rank
 * (rank 0 decides the step they stop at); a rank that fails makes the others fail at their next collective, and the
 * launcher waits for all of them, then exits with rank 0's code (or the first failing rank's). A rank still running
 * `stopGraceMs` after another failed (one that hangs: it reaches no collective, answers no signal) is killed
 * (SIGKILL), so the launcher always ends within a bounded time of a failure.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import * as net from 'node:net';
import { envSecondsMs } from './env.js';

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => { const p = (s.address() as net.AddressInfo).port; s.close(() => resolve(p)); });
  });
}

/** Removes `--gpus N` / `--gpus=N` from argv. */
export function withoutGpusFlag(argv: readonly string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--gpus') { i++; continue; }
    if (argv[i]!.startsWith('--gpus=')) continue;
    out.push(argv[i]!);
  }
  return out;
}

export interface LaunchIo { err: (s: string) => void }

/** How long the ranks still running may take to stop after one failed: DISTILLERY_STOP_GRACE_S seconds, else 60. */
export function stopGraceMs(env: NodeJS.ProcessEnv = process.env): number {
  return envSecondsMs('DISTILLERY_STOP_GRACE_S', env) ?? 60_000;
}

/** Runs `script args` as `n` ranks; resolves with the exit code the launcher should return. */
export async function launchRanks(script: string, args: readonly string[], n: number, io: LaunchIo, env: NodeJS.ProcessEnv = process.env): Promise<number> {
  const port = await freePort();
  const kids: ChildProcess[] = [];
  const codes: Array<number | null> = new Array<number | null>(n).fill(null);
  const errTail: string[] = new Array<string>(n).fill('');
  let signalled = false;
  const forward = (sig: NodeJS.Signals): void => { signalled = true; for (const k of kids) if (k.exitCode === null) k.kill(sig); };
  const onInt = (): void => forward('SIGINT'), onTerm = (): void => forward('SIGTERM');
  process.on('SIGINT', onInt);
  process.on('SIGTERM', onTerm);
  // after the first failure, the ranks still running get a grace period, then SIGKILL (a hung rank stops no other way)
  const grace = stopGraceMs(env);
  let killer: NodeJS.Timeout | null = null;
  const killed = new Set<number>();
  const failed = (rank: number, code: number): void => {
    // a rank stopped by the signal passed on (130/143) is no failure: rank 0 may still be writing its checkpoint
    if (code === 0 || killer !== null || (signalled && (code === 130 || code === 143))) return;
    killer = setTimeout(() => {
      kids.forEach((k, r) => {
        if (k.exitCode !== null || k.signalCode !== null) return;
        killed.add(r);
        io.err(`rank ${r} was still running ${grace / 1000} s after rank ${rank} failed: stopping it (SIGKILL)\n`);
        k.kill('SIGKILL');
      });
    }, grace);
    killer.unref();
  };
  try {
    await Promise.all(Array.from({ length: n }, (_, rank) => new Promise<void>((resolve) => {
      // the launcher's own Node options (--max-old-space-size, ...) hold for every rank, but a debugger's or a watcher's
      // (N ranks on one inspector port, or each waiting for a debugger)
      const k = spawn(process.execPath, [...process.execArgv.filter((a) => !/^--(inspect|debug|watch)/.test(a)), script, ...args], {
        env: {
          ...env, RANK: String(rank), LOCAL_RANK: String(rank), WORLD_SIZE: String(n), LOCAL_WORLD_SIZE: String(n),
          MASTER_ADDR: '127.0.0.1', MASTER_PORT: String(port), DISTILLERY_MASTER_PORT: String(port), NCCL_NVLS_ENABLE: '0',
          // a rank whose launcher is gone (SIGKILL) stops as on SIGTERM (src/train/stop-requests.ts)
          DISTILLERY_LAUNCHER_PID: String(process.pid),
        },
        stdio: rank === 0 ? 'inherit' : ['ignore', 'ignore', 'pipe'],
        // their own process group: a terminal's Ctrl-C reaches the launcher, which passes it on once
        detached: true,
      });
      kids.push(k);
      k.stderr?.on('data', (d: Buffer) => { errTail[rank] = (errTail[rank] + d.toString()).slice(-4000); });
      k.on('close', (code, sig) => {
        codes[rank] = code ?? (sig === 'SIGINT' ? 130 : sig === 'SIGTERM' ? 143 : 1);
        failed(rank, codes[rank]!);
        resolve();
      });
    })));
  } finally {
    process.off('SIGINT', onInt);
    process.off('SIGTERM', onTerm);
    if (killer !== null) clearTimeout(killer);
  }
  // a failing rank's own words, unless rank 0 failed the same way by itself (its message, on the console, says it)
  const rank0Failed = codes[0] !== 0 && !killed.has(0);
  for (let r = 1; r < n; r++) {
    if (codes[r] !== 0 && !killed.has(r) && !(rank0Failed && codes[r] === codes[0])) io.err(`rank ${r} exited with ${codes[r]}:\n${errTail[r]!.split('\n').slice(-12).map((l) => `  [rank ${r}] ${l}`).join('\n')}\n`);
  }
  // rank 0's code, or the first failing rank's; a rank the launcher killed does not speak for the run
  const own = codes.map((c, r) => (killed.has(r) ? 0 : c!));
  return own[0] !== 0 ? own[0]! : own.find((c) => c !== 0) ?? (killed.size > 0 ? 1 : 0);
}
