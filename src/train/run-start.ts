/**
 * Opening a run's folder (`--out`) before anything is computed: creating it (an input error when the path cannot be
 * a folder the user may write), what it may hold (not a model or a teacher cache; an earlier run only with --resume
 * or --overwrite, and a run that never reached a checkpoint only with --overwrite), interrupted folder swaps
 * recovered, and --resume's saved state checked against this run (options, --steps, the number of processes).
 * The lock (run-folder.ts) is taken between the two steps by the caller, which also releases it.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { recoverDir } from '../io/atomic.js';
import { DistilleryError, InputError, fileError } from '../util/errors.js';
import type { Communicator } from '../parallel/comm.js';
import type { RunOptions } from './options.js';
import { checkNoSymlinks, clearRun, holdsRun } from './run-folder.js';
import { checkResumeCompatible, readSavedState, type SavedState } from './run-state.js';

/** Creates `--out` (with its parents); `created`: it was not there (a run that fails before writing removes it). */
export function createRunFolder(o: Pick<RunOptions, 'out'>, root: boolean): { out: string; created: boolean } {
  const out = path.resolve(o.out);
  // a folder this run creates and that is still empty when it fails (bad data, no CUDA) is removed again
  const created = root && !fs.existsSync(out);
  try { fs.mkdirSync(out, { recursive: true }); } catch (e) {
    const f = fileError(e, `--out ${o.out}: cannot create the run folder`, 'pass a folder path you can write to, e.g. --out runs/my-run');
    // A path that cannot be a folder, or one the user may not write, is bad input (exit 2); a full disk is not.
    const input = ['ENOTDIR', 'EEXIST', 'EACCES', 'EPERM', 'EROFS'].includes(String((e as NodeJS.ErrnoException).code));
    throw input && f instanceof DistilleryError ? new InputError(f.message, f.hint) : f;
  }
  return { out, created };
}

/**
 * What the folder holds, checked (see the module comment); `replaceOld` removes an earlier run under --overwrite (the
 * run calls it before its first write, so that a bad input does not cost the previous run); `saved` is --resume's
 * state. Every rank returns after rank 0 prepared the folder.
 */
export function openRunFolder(o: RunOptions, comm: Communicator, out: string, log: (s: string) => void):
  { latest: string; saved: SavedState | null; replaceOld: () => void } {
  const root = comm.rank === 0;
  checkNoSymlinks(out);
  // a model folder or a teacher cache is not a run folder: writing a run into it would replace its tokenizer.json or
  // mix the run into it, --overwrite or not
  const other = ['config.json', 'model.safetensors', 'model.safetensors.index.json', 'adapter_config.json', 'manifest.json']
    .find((f) => fs.existsSync(path.join(out, f)));
  if (root && other) {
    throw new InputError(`--out ${out} holds ${other === 'manifest.json' ? 'a teacher cache' : 'a model'} (${other}), not a run`,
      'pass a folder for the run, e.g. --out runs/my-run (a model to start from goes to --init)');
  }
  const holdsOld = root && !o.resume && holdsRun(out);
  if (root && !o.resume && !holdsOld && !o.overwrite && fs.existsSync(path.join(out, 'tokenizer.json'))) {
    // not a run's (a run's folder holds its metrics by then): the run would write its own tokenizer.json over it
    throw new InputError(`--out ${out} holds a tokenizer.json but no run: the run would write its own over it`,
      'move the file elsewhere (pass it with --tokenizer to train with it), use another --out, or pass --overwrite to replace it');
  }
  if (holdsOld) {
    if (!o.overwrite) {
      // a run that stopped before its first checkpoint cannot be continued: --resume would only say so
      const resumable = fs.existsSync(path.join(out, 'checkpoints', 'latest'));
      throw new DistilleryError(`${out} already holds a run (checkpoints, metrics or a final model)${resumable ? '' : ' that stopped before its first checkpoint'}`,
        resumable ? 'continue it with --resume, start afresh with --overwrite (deletes its checkpoints, metrics and final model), or use another --out'
          : 'start afresh with --overwrite (deletes its metrics and files), or use another --out');
    }
    // the old run is removed once this one has read its data and models and is about to write (a bad input must
    // not cost the previous run): runWithBackend calls replaceOld() before its first write
  }
  const replaceOld = holdsOld
    ? (): void => { clearRun(out); log(`--overwrite: removed the previous run's files in ${out}`); } : (): void => {};
  const latest = path.join(out, 'checkpoints', 'latest');
  if (root) {
    recoverDir(latest);
    recoverDir(path.join(out, 'checkpoints', 'best'));
  }
  // every rank past here sees the folder rank 0 prepared
  comm.barrier();
  let saved: SavedState | null = null;
  if (o.resume) {
    const statePath = path.join(latest, 'state.json');
    if (!fs.existsSync(statePath)) {
      if (fs.existsSync(latest)) {
        throw new DistilleryError(`--resume: the checkpoint ${latest} has no state.json (it is damaged)`,
          'restore the file from a copy of the run, or start afresh with --overwrite');
      }
      throw new DistilleryError(`--resume: no checkpoint at ${latest}`, holdsRun(out)
        ? 'the run stopped before its first checkpoint: start it afresh with --overwrite instead of --resume'
        : 'run without --resume to start fresh, or point --out at the run folder');
    }
    saved = readSavedState(statePath);
    checkResumeCompatible(saved.options, o, log);
    if (saved.step > o.steps) {
      throw new DistilleryError(`--resume: the checkpoint is at step ${saved.step}, past --steps ${o.steps}`,
        `pass --steps ${saved.step} or more (the run's was ${saved.options.steps})`);
    }
    const was = saved.world ?? 1;
    if (was !== comm.world) {
      throw new DistilleryError(`--resume: the checkpoint was written by a run of ${was} process${was > 1 ? 'es' : ''}, this one has ${comm.world}`,
        `resume with WORLD_SIZE ${was} (the data order and the optimizer's shards depend on it), or start a new run in another --out`);
    }
  }
  return { latest, saved, replaceOld };
}

/** Removes a folder that holds nothing (or only the run lock, released already). */
export function removeIfEmpty(dir: string): void {
  try { if (fs.readdirSync(dir).length === 0) fs.rmdirSync(dir); } catch { /* kept: it is not empty, or is gone */ }
}

/**
 * Runs `read` over --resume's checkpoint; an error reading it (a missing or corrupt file, whatever the reader calls
 * it) is a damaged checkpoint: exit 1 (docs/cli.md), with the hint that fits a run folder, not a model folder.
 */
export function damagedCheckpoint<T>(read: () => T): T {
  try {
    return read();
  } catch (e) {
    if (!(e instanceof DistilleryError)) throw e;
    throw new DistilleryError(`--resume: the checkpoint is damaged: ${e.message}`,
      'restore the checkpoint from a copy of the run, or start afresh with --overwrite');
  }
}
