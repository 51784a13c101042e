/**
 * `distillery teacher-cache`: runs the teacher once over the packed windows of the data (the same tokenizer, chat
 * rendering, packing and window ids as `distill`) and stores the sparse representation of its next-token distribution
 * at every counted position (src/cache/sparse.ts, format.ts), shard by shard (src/cache/store.ts).
 *
 * Continuing: the manifest is written before the first shard with what the cache is of; a rerun of the same command
 * verifies the shards already listed (size and SHA-256; a damaged or missing one is computed again) and computes the
 * rest. Sample draws are a hash of (seed, window, position, draw), so a continued cache equals an uninterrupted one.
 * A rerun with other parameters (another teacher, data, seq, temperature, representation, ...) is refused with what
 * differs, unless --overwrite.
 *
 * Several processes (--gpus N, or torchrun's variables) share the shards left: rank 0 owns the folder and the manifest
 * and decides (src/cache/job-ranks.ts), the others note their shards beside them (src/cache/ledger.ts).
 */
import { weightsHash } from '../model/weights-hash.js';
import { parameterLayout } from '../model/params.js';
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Backend } from '../backend/backend.js';
import { createBackend, type CudaOptions } from '../backend/create.js';
import { readCheckpoint } from '../model/checkpoint.js';
import { parameterCount, toHfConfig } from '../model/config.js';
import { Transformer, type Precision } from '../model/transformer.js';
import { describePacking, packForJob, type PackingChoice } from '../data/index.js';
import { stackWindows } from '../data/index.js';
import { chatFormatOf, DEFAULT_CHAT_FORMAT } from '../tokenizer/chat.js';
import { lossVocabulary, tokenizerHash } from '../tokenizer/identity.js';
import { writeFileAtomic } from '../io/atomic.js';
import { Progress } from '../report/progress.js';
import { DistilleryError, InputError, fileError } from '../util/errors.js';
import { jobClosures } from '../train/kernel-plan.js';
import { resolvePrecision, type PrecisionFlag } from '../train/precision.js';
import { modelExtras, readData } from '../train/run-data.js';
import { removeIfEmpty } from '../train/run-start.js';
import { hashDocs, lockRunFolder } from '../train/run-folder.js';
import { BitWriter, recordLayout, writeRow } from './format.js';
import { cacheUniform, formatSparse, type SparseRep } from './sparse.js';
import {
  CACHE_FORMAT, CACHE_VERSION, identityDifferences, readManifest, sha256, shardBytes, shardName, writeTeacherHeader,
  type CacheIdentity, type CacheManifest, type ShardInfo,
} from './store.js';
import { TeacherPass, rowIds, type PassRows } from './teacher-pass.js';
import type { FrozenDtype } from '../model/frozen.js';
import { LocalComm, type Communicator } from '../parallel/comm.js';
import { distEnv } from '../parallel/env.js';
import { commTimeoutMs } from '../parallel/host-comm.js';
import { ShardLedger, shardIntact } from './ledger.js';
import { checkSameInputs, DAY_MS, fromRank0, jobFigures } from './job-ranks.js';
import { StopRequests } from '../train/stop-requests.js';

export interface CacheJobOptions {
  teacher: string;
  data: string[];
  out: string;
  seq: number;
  /** Windows per teacher forward. */
  batch: number;
  sparse: SparseRep;
  temperature: number;
  /** Seed of the sample draws (and the split distill would use with it). */
  seed: number;
  valFraction: number;
  lossOn: 'assistant' | 'all';
  /** How documents fill the windows (as distill's --packing; 'auto' or unset: resolved on the data). */
  packing?: PackingChoice | undefined;
  chatTemplateKwargs?: string | undefined;
  maxChars: number;
  device: 'cpu' | 'cuda';
  precision: PrecisionFlag;
  /** Storage of the teacher's projection matrices: the compute dtype (default), or NF4 (src/model/frozen.ts). */
  teacherDtype?: FrozenDtype | undefined;
  threads: number;
  /** Windows per shard file. */
  shardWindows: number;
  overwrite: boolean;
  quiet: boolean;
}

export const DEFAULT_SHARD_WINDOWS = 256;

export interface CacheJobSummary {
  out: string;
  windows: number;
  /** Counted positions (those the distillation loss reads) and the shards' bytes. */
  positions: number;
  bytes: number;
  bytesPerToken: number;
  shardsWritten: number;
  shardsKept: number;
  seconds: number;
  /**
   * Teacher tokens (every position of every window computed in this call) per second of the job's loop: the teacher's
   * passes, the records and the shards' writes (not loading the teacher).
   */
  tokensPerSecond: number;
  /**
   * The same once warm: over the batches after the job's first two (the first runs op by op, the second captures the
   * CUDA graph), i.e. the rate of a long job, comparable with a forward timed after warm-up; null when the job ran no
   * such batch.
   */
  steadyTokensPerSecond: number | null;
  complete: boolean;
  signal: 'SIGINT' | 'SIGTERM' | null;
  /** Processes of the job (teacher-cache --gpus N); the rates are every rank's tokens over the slowest rank's time. */
  ranks: number;
}

export interface CacheJobHooks {
  log?: (line: string) => void;
  backend?: Backend;
  backendOptions?: CudaOptions;
  /** Called after each shard is listed in the manifest (tests stop a job here, as a kill between shards would). */
  afterShard?: (index: number) => void;
  /** The process group (tests); by default one process, or the group torchrun's variables (or --gpus N) describe. */
  comm?: Communicator;
}

export async function buildTeacherCache(o: CacheJobOptions, hooks: CacheJobHooks = {}): Promise<CacheJobSummary> {
  const group = hooks.comm ? null : distEnv();
  const rank = hooks.comm?.rank ?? group?.rank ?? 0;
  const log = rank === 0 ? hooks.log ?? ((s: string) => process.stderr.write(s + '\n')) : (): void => {};
  let comm: Communicator = hooks.comm ?? new LocalComm();
  let failed = true;
  try {
    if (group) {
      const { HostComm } = await import('../parallel/host-comm.js');
      comm = await HostComm.connect(group);
    }
    const s = await buildOnRank(o, hooks, comm, group?.localRank, log);
    failed = false;
    return s;
  } catch (e) {
    // a collective that failed (a rank died or hangs) names the rank; the way on is a rerun, which continues
    if (comm.world > 1 && e instanceof DistilleryError && !(e instanceof InputError) && /^rank \d+: .* (failed|waited)/.test(e.message)) {
      throw new DistilleryError(e.message, 'a rank stopped: rerun the same command; it keeps every shard already written');
    }
    throw e;
  } finally {
    if (!hooks.comm) comm.close(failed);
  }
}

async function buildOnRank(o: CacheJobOptions, hooks: CacheJobHooks, comm: Communicator, localRank: number | undefined,
  log: (s: string) => void): Promise<CacheJobSummary> {
  const out = path.resolve(o.out);
  // rank 0 owns the folder: it creates and locks it and decides what is left to do; the others only add shards to it
  let lock: { release(): void } | null = null;
  let existing: CacheManifest | null = null;
  // a folder this job creates and that is still empty when it fails (bad data, no CUDA) is removed again
  const created = comm.rank === 0 && !fs.existsSync(out);
  try {
    fromRank0(comm, () => {
      try { fs.mkdirSync(out, { recursive: true }); } catch (e) {
        const f = fileError(e, `--out ${o.out}: cannot create the cache folder`, 'pass a folder path you can write to');
        throw f instanceof DistilleryError ? new InputError(f.message, f.hint) : f;
      }
      lock = lockRunFolder(out);
      existing = readManifest(out);
      if (!existing) {
        // --overwrite replaces a teacher cache, never other files (a training run, a model folder): they would mix
        const foreign = fs.readdirSync(out).filter((f) => f !== 'run.lock');
        if (foreign.length) {
          throw new InputError(`--out ${out} holds files that are not a teacher cache (${foreign.slice(0, 3).join(', ')}${foreign.length > 3 ? ', …' : ''})`,
            'use an empty or new folder for the cache');
        }
      }
      return null;
    });
    const prec = resolvePrecision(o.precision, undefined, o.device);
    const backend = hooks.backend ?? await createBackend({
      ...hooks.backendOptions, tf32: prec.tf32, device: o.device, threads: o.threads,
      ...(localRank !== undefined && o.device === 'cuda' ? { ordinal: localRank } : {}),
    });
    try {
      return await buildWith(o, hooks, backend, log, out, existing, prec.model, comm);
    } finally {
      if (!hooks.backend) backend.dispose();
    }
  } catch (e) {
    (lock as { release(): void } | null)?.release();
    if (created) removeIfEmpty(out);
    throw e;
  } finally {
    (lock as { release(): void } | null)?.release();
  }
}

async function buildWith(o: CacheJobOptions, hooks: CacheJobHooks, backend: Backend, log: (s: string) => void, out: string,
  existing: CacheManifest | null, precision: Precision, comm: Communicator): Promise<CacheJobSummary> {
  const { rank, world } = comm;
  const started = Date.now();
  const ck = readCheckpoint(o.teacher, { tensorByTensor: true }); // only uploaded and hashed
  if (!ck.tokenizer) throw new DistilleryError(`the teacher folder ${o.teacher} has no tokenizer.json`, 'copy the teacher\'s tokenizer.json into it');
  const tokenizer = ck.tokenizer;
  if (o.seq > ck.config.maxPositionEmbeddings) {
    throw new InputError(`--seq ${o.seq} exceeds the teacher's max_position_embeddings (${ck.config.maxPositionEmbeddings})`, `use --seq ${ck.config.maxPositionEmbeddings} or less`);
  }
  const extras = modelExtras({ teacher: o.teacher }, ck, null);
  const chat = extras ? chatFormatOf(extras.chatTemplate, extras.from, extras.tokenizerConfig) : DEFAULT_CHAT_FORMAT;
  const docs = readData(o, log, chat);
  const dataHash = hashDocs(docs);
  const { packed, packing } = packForJob(tokenizer, docs, chat, { ...o, tokenizerOf: `the teacher ${o.teacher}` }, log);
  const windows = packed.windows;
  if (windows.length === 0) throw new DistilleryError('the data packs into no windows', `add data, or lower --seq (${o.seq})`);
  // 'bfd' windows hold documents that attend only to themselves (Window.positions)
  const documents = windows[0]!.positions !== undefined;
  const { lossVocab, note } = lossVocabulary(tokenizer.vocabSize, [{ name: 'teacher', vocabSize: ck.config.vocabSize }]);
  if (note) log(note);
  const rep = o.sparse;
  const identity: CacheIdentity = {
    teacher: {
      path: path.resolve(o.teacher), architecture: ck.config.architecture, parameters: parameterCount(ck.config), vocab_size: ck.config.vocabSize,
      weights_sha256: weightsHash(ck.weights, parameterLayout(ck.config)), config: toHfConfig(ck.config) as Record<string, unknown>,
    },
    tokenizer_sha256: tokenizerHash(tokenizer),
    data: {
      files: o.data, sha256: dataHash, documents: docs.length, tokens: packed.totalTokens, loss_tokens: packed.targetTokens,
      max_chars: o.maxChars, loss_on: o.lossOn, chat_template_kwargs: o.chatTemplateKwargs ?? null,
    },
    seq: o.seq, packing: describePacking(packing, tokenizer), windows: windows.length, split: { val_fraction: o.valFraction, seed: o.seed },
    temperature: o.temperature, sparse: formatSparse(rep), loss_vocab: lossVocab, sample_seed: o.seed, precision,
    ...(o.teacherDtype === 'nf4' ? { teacher_dtype: 'nf4' as const } : {}),
  };
  const manifestOf = (shardWindows: number) => (shards: ShardInfo[], complete: boolean): CacheManifest => {
    const pos = shards.reduce((a, s) => a + s.positions, 0), bytes = shards.reduce((a, s) => a + s.bytes, 0);
    return {
      format: CACHE_FORMAT, version: CACHE_VERSION, ...identity, windows_per_shard: shardWindows, shards, complete,
      bytes_per_token: pos > 0 ? +(bytes / pos).toFixed(2) : null,
    };
  };
  // rank 0 continues or starts the cache (its decisions reach the others), then every rank checks it read the same
  let rank0Ledger: ShardLedger | null = null;
  const decided = fromRank0(comm, () => {
    const r = continueOrStart(o, out, existing, identity, windows.length, manifestOf, log);
    writeTeacherHeader(out, ck);
    r.ledger.write();
    rank0Ledger = r.ledger;
    return { identity, shardWindows: r.ledger.shardWindows, todo: r.todo };
  });
  checkSameInputs(comm, decided.identity, identity);
  const book: ShardLedger = rank0Ledger ?? new ShardLedger(out, rank, windows.length, decided.shardWindows, manifestOf(decided.shardWindows));
  const { todo } = decided, shardWindows = book.shardWindows, nShards = book.nShards;
  // this rank's shards: every world-th of those left, so ranks share them evenly
  const mine = todo.filter((_, k) => k % world === rank);

  const B = o.batch, T = o.seq;
  let teacher: Transformer | null = null, pass: TeacherPass | null = null;
  if (mine.length) {
    if (backend.prepare) {
      await backend.prepare(jobClosures({ student: ck.config, teacher: ck.config, batch: B, seq: T, lossVocab, precision, cacheTeacher: rep, teacherFrozen: o.teacherDtype }));
    }
    teacher = new Transformer(backend, ck.config, { batch: B, seq: T, training: false, label: 'teacher', precision, frozenDtype: o.teacherDtype, documents });
    teacher.setWeights(ck.weights);
    pass = new TeacherPass(teacher, lossVocab, o.temperature, rep);
  }
  if (todo.length) {
    log(`teacher cache: ${formatSparse(rep)} at temperature ${o.temperature} over ${windows.length} windows of ${T} ` +
      `(${packed.targetTokens} counted positions), ${nShards} shards of ${shardWindows} windows; teacher ${ck.config.architecture} ` +
      `${(parameterCount(ck.config) / 1e6).toFixed(1)}M on ${backend.name} (${precision}${o.teacherDtype === 'nf4' ? ', projection matrices in nf4' : ''})` +
      (world > 1 ? `; ${world} ranks share the ${todo.length} shards left` : ''));
  }
  const lay = recordLayout(rep, lossVocab);
  const quiet = o.quiet || rank !== 0;
  const progress = new Progress(windows.length, 'teacher-cache', Math.max(1, Math.floor(nShards / 20)), process.stderr, book.windowsDone());
  // The batches of every shard to compute, in order (a batch never spans two shards).
  interface ShardWork { si: number; w0: number; w1: number; records: Uint8Array[]; counts: number[]; left: number }
  interface BatchWork { shard: ShardWork; b0: number; nb: number }
  const batches: BatchWork[] = [];
  for (const si of mine) {
    const w0 = si * shardWindows, w1 = Math.min(windows.length, w0 + shardWindows);
    const shard: ShardWork = { si, w0, w1, records: new Array<Uint8Array>(w1 - w0), counts: new Array<number>(w1 - w0).fill(0), left: 0 };
    for (let b0 = w0; b0 < w1; b0 += B) { batches.push({ shard, b0, nb: Math.min(B, w1 - b0) }); shard.left++; }
  }
  let written = 0, computedTokens = 0;
  // the steady rate: two passes are queued at a time, so the time between two collects is one batch's on the device
  let batchesCollected = 0, steadyTokens = 0, steadySeconds = 0, lastCollect: bigint | null = null;
  const writer = new BitWriter();
  /** Host work of a collected batch, while the device runs the next: each window's record, from the pass's arrays. */
  const take = (h: PassRows, bw: BatchWork): void => {
    const S = h.slots;
    for (let b = 0; b < bw.nb; b++) {
      const win = windows[bw.b0 + b]!;
      writer.reset();
      let positions = 0;
      for (let p = 0; p < T; p++) {
        if (!(win.mask[p]! > 0)) continue;
        const r = b * T + p;
        writeRow(writer, lay, h.ids, h.logq, r * S, rowIds(h, r), h.tail[r]!, h.argmax[r]!);
        positions++;
      }
      bw.shard.records[bw.b0 + b - bw.shard.w0] = writer.bytes();
      bw.shard.counts[bw.b0 + b - bw.shard.w0] = positions;
    }
  };
  const writeShard = (sw: ShardWork): void => {
    const bytes = shardBytes(sw.w0, sw.records, sw.counts);
    const file = shardName(sw.si);
    try { writeFileAtomic(path.join(out, file), bytes); } catch (e) {
      throw fileError(e, `cannot write the shard ${path.join(out, file)}`, 'free disk space, then rerun the command: it continues where it stopped');
    }
    book.record(sw.si, { file, first_window: sw.w0, windows: sw.w1 - sw.w0, positions: sw.counts.reduce((a, c) => a + c, 0), bytes: bytes.length, sha256: sha256(bytes) });
    if (rank === 0 && world > 1) book.fold(false); // and what the other ranks have finished meanwhile
    written++;
  };
  // SIGINT / SIGTERM (or, for a rank --gpus started, its launcher's death) during the shards: the job stops after its
  // shard. Only here: a handler cannot run while the main thread waits in a collective (Atomics.wait), so there a
  // signal keeps its default action and ends the process at once, which loses nothing a rerun does not recover.
  const stops = new StopRequests(log, process.env, 1000, 'finishing the current shard; rerunning the command continues');
  const t0 = process.hrtime.bigint();
  let loopSeconds = 0;
  try {
    // Batch k + 1 is queued before batch k is collected: the device never waits for the host's share of a batch
    // (staging, its rows' records, a shard's write) while a queued batch remains.
    const inflight: BatchWork[] = [];
    let next = 0;
    while (inflight.length > 0 || next < batches.length) {
      if (next < batches.length && inflight.length < 2) {
        const bw = batches[next++]!, { b0, nb } = bw;
        // a short last batch repeats its last window (its rows count nothing)
        const stacked = stackWindows(Array.from({ length: B }, (_, b) => windows[b0 + Math.min(b, nb - 1)]!), T);
        const ids = stacked.inputs, positions = stacked.positions ?? null;
        const counted = (r: number): boolean => Math.floor(r / T) < nb && windows[b0 + Math.floor(r / T)]!.mask[r % T]! > 0;
        // Row r is window b0 + r / T, position r % T; its draws come from the counter-based uniform of (seed, window, position).
        pass!.start(ids, B, T, (r) => cacheUniform(o.seed, b0 + Math.min(Math.floor(r / T), nb - 1), r % T, 0),
          (r0, rows) => { for (let r = r0; r < r0 + rows; r++) if (counted(r)) return true; return false; }, positions);
        inflight.push(bw);
        if (inflight.length < 2 && next < batches.length) continue;
      }
      const bw = inflight.shift()!, h = pass!.collect()!;
      const now = process.hrtime.bigint();
      if (lastCollect !== null && batchesCollected >= 2) { steadySeconds += Number(now - lastCollect) / 1e9; steadyTokens += bw.nb * T; }
      batchesCollected++;
      lastCollect = now;
      take(h, bw);
      computedTokens += bw.nb * T;
      if (--bw.shard.left > 0) continue;
      writeShard(bw.shard);
      hooks.afterShard?.(bw.shard.si);
      loopSeconds = Number(process.hrtime.bigint() - t0) / 1e9;
      if (!quiet) progress.update(book.windowsDone(), { 'tok/s': Math.round(world * computedTokens / Math.max(loopSeconds, 1e-9)) });
      await new Promise<void>((resolve) => setImmediate(resolve)); // let a signal in
      // a stop (only seen here) comes after this shard: the next one's batches already queued are dropped
      if (stops.signal !== null) { while (pass!.collect()); break; }
    }
  } finally {
    stops.dispose();
    if (!quiet) progress.done();
  }
  const ownSignal = stops.signal;
  // a rank waits for the slowest (a shard or two behind), then rank 0 lists the others' last shards
  const mineFigures = { written, tokens: computedTokens, seconds: loopSeconds, steadyTokens, steadySeconds, stopped: ownSignal !== null };
  let total: ReturnType<typeof jobFigures>;
  try {
    if (world > 1) comm.barrier(commTimeoutMs() + (computedTokens > 0 ? 2 * Number(process.hrtime.bigint() - t0) / 1e6 : DAY_MS));
    total = jobFigures(comm, mineFigures);
  } catch (e) {
    // stopping on a signal, a rank that took the signal's default action at the barrier is no failure: what it wrote is
    // noted, and listed now or by the rerun
    if (ownSignal === null || !(e instanceof DistilleryError)) throw e;
    log(`teacher cache: a rank ended at the job's end (${e.message})`);
    total = jobFigures(new LocalComm(), mineFigures);
    if (rank === 0) book.fold(false);
  }
  if (rank === 0 && world > 1 && !total.stopped) await foldEveryShard(book, nShards - todo.length + total.written, out);
  else if (rank === 0 && world > 1) book.fold(false);
  const signal = ownSignal ?? (total.stopped ? 'SIGTERM' : null);
  if (signal !== null && ownSignal === null) log('teacher cache: another rank stopped on a signal');
  const m = book.manifest();
  const positions = m.shards.reduce((a, s) => a + s.positions, 0), bytes = m.shards.reduce((a, s) => a + s.bytes, 0);
  const summary: CacheJobSummary = {
    out, windows: windows.length, positions, bytes, bytesPerToken: bytes / Math.max(positions, 1), shardsWritten: total.written,
    shardsKept: nShards - todo.length, seconds: (Date.now() - started) / 1000, tokensPerSecond: total.tokensPerSecond,
    steadyTokensPerSecond: total.steadyTokensPerSecond, complete: m.complete, signal, ranks: world,
  };
  log(`teacher cache: ${m.complete ? 'complete' : `${m.shards.length} of ${nShards} shards`}, ${positions} positions, ` +
    `${(bytes / 2 ** 20).toFixed(2)} MiB, ${summary.bytesPerToken.toFixed(1)} bytes per token (${formatSparse(rep)}); ` +
    `${summary.shardsWritten} shards written${world > 1 ? ` by ${world} ranks` : ''}${summary.shardsKept ? `, ${summary.shardsKept} kept` : ''}; teacher ${Math.round(summary.tokensPerSecond)} tokens/s` +
    (summary.steadyTokensPerSecond !== null ? ` (${Math.round(summary.steadyTokensPerSecond)} once warm: after the first two batches)` : ''));
  if (signal !== null) log(`${signal}: stopped with ${m.shards.length} of ${nShards} shards listed; rerun the same command to continue`);
  return summary;
}

/**
 * Rank 0 at the end of a job of several ranks: lists every shard the ranks wrote (`expected` with those kept), waiting
 * a little for notes a shared file system shows late; a shard it cannot see is an error (the ranks wrote different
 * folders), not a silently incomplete cache.
 */
async function foldEveryShard(book: ShardLedger, expected: number, out: string): Promise<void> {
  for (let i = 0; ; i++) {
    book.fold(false);
    if (book.done.size >= expected || i >= 50) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  if (book.done.size < expected) {
    throw new DistilleryError(`rank 0 sees ${book.done.size} of the ${expected} shards the ranks wrote in ${out}`,
      'every rank must write the same folder (on several hosts: --out on a shared file system); rerun the same command: it adopts the shards it finds');
  }
}

/**
 * Rank 0, before any shard is computed: continue a cache of the same identity (its listed shards verified, a stopped
 * job's noted shards adopted), refuse one of other settings unless --overwrite, and clear the folder of what no
 * manifest will list (half-written files, unlisted shards). Returns the ledger and the shards left to compute.
 */
function continueOrStart(o: CacheJobOptions, out: string, existing: CacheManifest | null, identity: CacheIdentity, windows: number,
  manifestOf: (shardWindows: number) => (shards: ShardInfo[], complete: boolean) => CacheManifest, log: (s: string) => void): { ledger: ShardLedger; todo: number[] } {
  let shardWindows = o.shardWindows;
  const kept: ShardInfo[] = [];
  if (existing) {
    const diffs = identityDifferences(existing, identity);
    if (diffs.length && !o.overwrite) {
      throw new DistilleryError(`--out ${out} holds a teacher cache of other settings (${diffs.join('; ')})`,
        'rerun with the settings it was made with to continue it, use another --out, or --overwrite to replace it');
    }
    if (diffs.length) {
      for (const s of existing.shards) fs.rmSync(path.join(out, s.file), { force: true });
      log(`--overwrite: removed the previous cache's ${existing.shards.length} shards in ${out}`);
    } else {
      shardWindows = existing.windows_per_shard;
      for (const s of existing.shards) {
        if (shardIntact(out, s)) kept.push(s);
        else log(`teacher cache: shard ${s.file} is missing or damaged; computing it again`);
      }
    }
  }
  const ledger = new ShardLedger(out, 0, windows, shardWindows, manifestOf(shardWindows));
  for (const s of kept) ledger.done.set(Math.floor(s.first_window / shardWindows), s);
  // shards the other ranks of a stopped job wrote and noted, but rank 0 had not listed yet (only with the same settings)
  if (existing && !identityDifferences(existing, identity).length) ledger.fold(true);
  if (ledger.done.size) log(`teacher cache: continuing ${out}: ${ledger.done.size} shards verified`);
  // Leftovers of an interrupted write, notes, and shards the manifest does not list, go.
  const listed = new Set([...ledger.done.values()].map((s) => s.file));
  for (const f of fs.readdirSync(out)) {
    if ((f.startsWith('.') && f.includes('.tmp')) || /^shard-\d+\.json$/.test(f) || (/^shard-\d+\.bin$/.test(f) && !listed.has(f))) {
      fs.rmSync(path.join(out, f), { force: true });
    }
  }
  return { ledger, todo: Array.from({ length: ledger.nShards }, (_, i) => i).filter((i) => !ledger.done.has(i)) };
}
