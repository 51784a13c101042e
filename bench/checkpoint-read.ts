/**
 * What reading a checkpoint folder costs on the host, without a GPU: readCheckpoint into one flat float32 array (what a
 * model that trains takes, `--init`), and tensor by tensor as bf16 bits (what a model that is only uploaded takes: a
 * teacher, generate's and eval's models). Each way runs in a process of its own, so that its peak memory (max RSS) is
 * its own. Prints ms and max RSS per way.
 *
 *   node dist/bench/checkpoint-read.js <model folder> [flat|bits] (both by default)
 */
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { readCheckpoint } from '../src/model/checkpoint.js';
import { TensorWeights } from '../src/model/params.js';

const [dir, way] = process.argv.slice(2);
if (!dir) {
  process.stderr.write('usage: checkpoint-read.js <model folder> [flat|bits]\n');
  process.exit(2);
}
if (way === undefined) {
  for (const w of ['flat', 'bits']) process.stdout.write(execFileSync(process.execPath, [fileURLToPath(import.meta.url), dir, w], { encoding: 'utf8' }));
} else {
  const t0 = performance.now();
  let values = 0;
  if (way === 'flat') values = readCheckpoint(dir).weights.length;
  else {
    const w = readCheckpoint(dir, { tensorByTensor: true }).weights as TensorWeights;
    for (const t of w.layout.tensors) values += w.bf16(t).length; // what setWeights uploads, one tensor at a time
  }
  const ms = performance.now() - t0;
  console.log(`${way.padEnd(4)}  ${(values / 1e6).toFixed(1)}M values  ${ms.toFixed(0).padStart(6)} ms  max RSS ${(process.resourceUsage().maxRSS / 1024).toFixed(0)} MiB`);
}
