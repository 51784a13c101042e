/**
 * A run's writes of its model: checkpoints/latest (the exact-resume checkpoint, written only when the weights are
 * good: see run.ts's module comment), checkpoints/best and final/, and the waits that keep the ranks of a data-parallel
 * run together around them. checkpoints/latest is written on a worker thread while training goes on
 * (checkpoint-writer.ts); on the run's thread with DISTILLERY_BACKGROUND_CHECKPOINTS=0 or a test's
 * duringCheckpointWrite hook (it runs inside the write). The training loop (run.ts) says when and what state to save.
 */
import type { Backend } from '../backend/backend.js';
import type { Communicator } from '../parallel/comm.js';
import { commTimeoutMs } from '../parallel/host-comm.js';
import { BackgroundCheckpoints, PREFAULT_STEP, writeLatest, type LatestCheckpoint } from './checkpoint-writer.js';
import type { StudentFiles } from './student-files.js';
import type { Optimizer } from './optimizer.js';
import type { Batch, StepRunner } from './step.js';
import type { SavedState } from './run-state.js';

/** The test hooks of the writes (RunHooks' own). */
export interface CheckpointHooks {
  duringCheckpointWrite?: (tmpDir: string, step: number) => void;
  checkpointWriteDelayMs?: number;
  afterCheckpointWrite?: (step: number, latestDir: string) => void;
}

export interface RunCheckpointsDeps {
  backend: Backend;
  comm: Communicator;
  log: (s: string) => void;
  hooks: CheckpointHooks;
  /** checkpoints/latest. */
  latest: string;
  files: StudentFiles;
  opt: Optimizer;
  runner: StepRunner;
  /** The fp32 masters gathered from every rank's shard (undefined when this rank holds them all). */
  gatheredMasters: () => Float32Array | undefined;
  saveDtype: 'f32' | 'bf16';
  /** The step of the checkpoint latest holds when the run starts (a resume's), else null. */
  lastGoodStep: number | null;
}

export class RunCheckpoints {
  /** The step of the last checkpoint written whole to latest (null before the first). */
  lastGoodStep: number | null;
  private readonly root: boolean;
  private readonly writer: BackgroundCheckpoints | null;

  constructor(private readonly d: RunCheckpointsDeps) {
    this.root = d.comm.rank === 0;
    this.lastGoodStep = d.lastGoodStep;
    const background = this.root && !d.hooks.duringCheckpointWrite && process.env.DISTILLERY_BACKGROUND_CHECKPOINTS !== '0';
    this.writer = background ? new BackgroundCheckpoints(d.files.resumeWriter, d.hooks.checkpointWriteDelayMs) : null;
    // A first download into new host arrays pays a page fault per page (12 bytes per parameter: seconds for a 0.5B
    // model): the worker maps the arrays the saves download into while the first steps run.
    const kept = d.opt.keptMoments?.();
    this.writer?.prefault([...d.files.keptArrays(), ...(kept ? [kept.m, kept.v] : [])]);
  }

  /** The other ranks wait for rank 0's file writes (checkpoints, best/, final/) without the collectives' timeout. */
  waitForRootIo(): void {
    if (this.d.comm.world > 1) this.d.comm.barrier(Math.max(commTimeoutMs(), 3_600_000));
  }

  /** Waits for the write in flight on rank 0 (a failed one throws); a written checkpoint is the last good one from then on. */
  finishWrite(): { step: number; seconds: number; waited: number } | null {
    const j = this.writer?.join() ?? null;
    if (j && j.step !== PREFAULT_STEP) { this.lastGoodStep = j.step; this.d.hooks.afterCheckpointWrite?.(j.step, this.d.latest); }
    return j;
  }

  /**
   * Every rank at the same point: rank 0 waits for its write in flight (saying so when training had to wait for the
   * disk, but for the run's last write), the others for rank 0 without the collectives' timeout (the collective that
   * follows — a gather of the sharded masters or moments — would otherwise time out while rank 0 waits for its disk).
   */
  join(atEnd = false): void {
    const j = this.finishWrite();
    if (j && j.step !== PREFAULT_STEP && j.waited >= 0.1 && !atEnd) {
      this.d.log(`checkpoint: writing step ${j.step}'s took ${j.seconds.toFixed(1)}s; the run waited ${j.waited.toFixed(1)}s for it (raise --save-every to hide the writes behind training)`);
    }
    this.waitForRootIo();
  }

  /**
   * Writes checkpoints/latest with `state` if the weights after `step` are good; `lossOnWeights` is a loss computed
   * from the current weights when one is at hand, else the loss of `probe` is. Returns why they are not good instead
   * of writing, or null.
   */
  saveLatest(step: number, state: () => SavedState, lossOnWeights: number | null, probe: Batch): string | null {
    const { backend, comm, files, runner, opt } = this.d;
    const ss = backend.sumSquares(files.trainable.params, files.trainable.masterLength ?? files.trainable.layout.total);
    let why: string | null = null;
    if (!Number.isFinite(ss)) why = `the update of step ${step} made the weights non-finite (sum of squares ${ss})`;
    else {
      const lossNow = lossOnWeights ?? runner.evaluate([probe]).meanLoss;
      if (!Number.isFinite(lossNow)) why = `the weights after step ${step} give a non-finite loss (${lossNow})`;
    }
    // With several ranks the probe batch is each rank's own: every rank takes the same verdict (any rank's failure).
    if (comm.world > 1) {
      const failed = comm.allReduceHost([why === null ? 0 : 1])[0]!;
      if (failed > 0 && why === null) why = `the weights after step ${step} give a non-finite loss on ${failed} of ${comm.world} ranks' batches`;
    }
    if (why !== null) return why;
    const s = state();
    this.join(); // the previous write reads the arrays the snapshot downloads into
    const { m, v } = opt.gatherMoments(); // a collective with data parallelism: every rank gets here at the same step
    const masters = this.d.gatheredMasters();
    if (this.root) {
      const c: LatestCheckpoint = { latest: this.d.latest, resumeDir: files.resumeDir, weights: files.resumeWeights(masters), m, v, state: JSON.stringify(s, null, 1), step };
      if (this.writer) this.writer.submit(c);
      else { writeLatest(c, files.resumeWriter, this.d.hooks.duringCheckpointWrite); this.d.hooks.afterCheckpointWrite?.(step, this.d.latest); }
    }
    this.waitForRootIo();
    if (!this.writer) this.lastGoodStep = step; // a background write counts once it is done (finishWrite)
    return null;
  }

  /**
   * The model as a user's folder (best/, final/) with any extra files, on rank 0; every rank takes part. The caller
   * joins the write in flight first (join): the folder downloads into the arrays it may still read.
   */
  writeUser(dir: string, extra?: Record<string, string>): void {
    const masters = this.d.gatheredMasters();
    if (this.root) this.d.files.writeUser(dir, this.d.saveDtype, extra, masters);
    this.waitForRootIo();
  }

  /** Ends the writer (after an error: its own failure is only logged, the run's error is the one that counts). */
  close(afterError = false): void {
    if (!afterError) { this.writer?.close(); return; }
    try { this.writer?.close(); } catch (w) { this.d.log(`warning: writing ${this.d.latest} failed too: ${w instanceof Error ? w.message : String(w)}`); }
  }
}
