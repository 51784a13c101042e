/**
 * Requests to stop a run after its current step: SIGINT and SIGTERM, and, for a rank that `--gpus N` started
 * (DISTILLERY_LAUNCHER_PID), its launcher's death (killed with SIGKILL, its terminal gone: the rank is re-parented),
 * which counts as a SIGTERM so the rank does not train on alone, writing the run folder. A second signal stops at once;
 * one within 2 s of the first is the same stop delivered twice (a terminal's Ctrl-C reaches both a launcher and its
 * ranks; Slurm signals every process), not a second request.
 */
export type StopSignal = 'SIGINT' | 'SIGTERM';

export class StopRequests {
  /** The stop requested (with several ranks: rank 0's, once the loop has shared it), null while none is. */
  signal: StopSignal | null = null;
  private at = 0;
  private readonly handler = (s: NodeJS.Signals): void => this.request(s === 'SIGINT' ? 'SIGINT' : 'SIGTERM');
  private watch: NodeJS.Timeout | null = null;

  /**
   * `finishing`: what the job does before it stops, for the line logged on the first request (a training run's by
   * default).
   */
  constructor(private readonly log: (line: string) => void, env: NodeJS.ProcessEnv = process.env, pollMs = 1000,
    private readonly finishing = 'finishing the current step, then writing a checkpoint, the summary and the plot') {
    process.on('SIGINT', this.handler);
    process.on('SIGTERM', this.handler);
    const launcher = Number(env.DISTILLERY_LAUNCHER_PID);
    if (Number.isInteger(launcher) && launcher > 1) {
      this.watch = setInterval(() => {
        if (process.ppid === launcher) return;
        this.stopWatching();
        this.log(`\nthe launcher (pid ${launcher}) is gone`);
        this.request('SIGTERM');
      }, pollMs);
      this.watch.unref();
    }
  }

  private request(s: StopSignal): void {
    if (this.signal !== null && Date.now() - this.at > 2000) process.exit(s === 'SIGINT' ? 130 : 143);
    if (this.signal !== null) return;
    this.at = Date.now();
    this.signal = s;
    this.log(`\n${s}: ${this.finishing} (send it again to stop at once)`);
  }

  private stopWatching(): void {
    if (this.watch) clearInterval(this.watch);
    this.watch = null;
  }

  dispose(): void {
    process.off('SIGINT', this.handler);
    process.off('SIGTERM', this.handler);
    this.stopWatching();
  }
}
