/**
 * One rank of the data-parallel run tests (test/parallel/data-parallel.test.ts spawns it with the process-group
 * variables and DP_OPTS, the RunOptions as JSON): runs runTraining and prints its summary as one JSON line. Without
 * WORLD_SIZE (as `node --test dist/test/` runs every file) it does nothing.
 */
import { runTraining } from '../../src/train/run.js';
import type { RunOptions } from '../../src/train/options.js';

if (process.env.WORLD_SIZE && process.env.DP_OPTS) {
  try {
    const s = await runTraining(JSON.parse(process.env.DP_OPTS) as RunOptions, { log: () => {} });
    process.stdout.write(JSON.stringify(s) + '\n');
  } catch (e) {
    process.stdout.write(JSON.stringify({ error: (e as Error).message }) + '\n');
    process.exitCode = 1;
  }
}
