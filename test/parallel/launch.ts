/** Starting the ranks of a multi-process test on this machine, as torchrun would (the process-group variables). */
import { spawn } from 'node:child_process';
import { freePort } from '../../src/parallel/launcher.js';

export { freePort };

/** Runs `world` ranks of a script; resolves with each rank's stdout lines and exit code. */
export async function launch(script: string, world: number, extra: NodeJS.ProcessEnv = {}): Promise<Array<{ code: number | null; out: string; err: string }>> {
  const port = await freePort();
  return Promise.all(Array.from({ length: world }, (_, rank) => new Promise<{ code: number | null; out: string; err: string }>((resolve) => {
    const p = spawn(process.execPath, [script], {
      env: { ...process.env, ...extra, RANK: String(rank), LOCAL_RANK: String(rank), WORLD_SIZE: String(world), MASTER_ADDR: '127.0.0.1', MASTER_PORT: String(port), DISTILLERY_MASTER_PORT: String(port) },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '', err = '';
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { err += d; });
    p.on('close', (code) => resolve({ code, out, err }));
  })));
}

