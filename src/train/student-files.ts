/**
 * What a run writes of its student and reads back. A full run writes Hugging Face model folders; a LoRA run
 * (--lora-rank) writes PEFT adapter folders (src/model/adapter.ts) that name the frozen base (--init) and the SHA-256
 * of its weights. checkpoints/latest holds the float32 weights for --resume under model/ or adapter/; best/ and final/
 * hold them in --save-dtype. The run's tokenizer and chat files go with every folder.
 */
import * as path from 'node:path';
import type { ModelConfig } from '../model/config.js';
import { readCheckpoint, sideConfigs, writeCheckpoint, type SaveCheckpointOptions } from '../model/checkpoint.js';
import type { Transformer } from '../model/transformer.js';
import { readAdapterHeader, readAdapterWeights, writeAdapter, type BaseRef } from '../model/adapter.js';
import type { LoraAdapters, LoraLayout } from '../model/lora.js';
import { float32Of } from '../model/params.js';
import { DistilleryError } from '../util/errors.js';
import type { Trainable } from './optimizer.js';

/** The tokenizer and chat files a run carries into the folders it writes. */
export type Carry = Pick<SaveCheckpointOptions, 'tokenizerJson' | 'tokenizerConfig' | 'chatTemplate' | 'generationConfig'>;

/**
 * How checkpoints/latest's weights folder is written, as plain data (no device, no closures): a worker thread writes a
 * checkpoint from it and a host snapshot of the weights (src/train/checkpoint-writer.ts).
 */
export type ResumeWriter =
  | { kind: 'model'; cfg: ModelConfig; carry: Carry }
  | { kind: 'adapter'; layout: LoraLayout; base: BaseRef; baseName?: string | undefined; files: Record<string, string> };

/** Writes the float32 weights --resume reads into `dir`: host work only. */
export function writeResumeFiles(dir: string, w: ResumeWriter, weights: Float32Array): void {
  if (w.kind === 'model') writeCheckpoint(dir, w.cfg, weights, { dtype: 'f32', ...w.carry });
  else writeAdapter(dir, w.layout, weights, { dtype: 'f32', base: w.base, baseName: w.baseName, extraFiles: w.files });
}

export interface StudentFiles {
  /** The folder under checkpoints/latest that holds the weights. */
  readonly resumeDir: 'model' | 'adapter';
  /** How checkpoints/latest's weights folder is written (writeResumeFiles; also on the checkpoint writer's thread). */
  readonly resumeWriter: ResumeWriter;
  /**
   * The host snapshot of the weights that folder holds (`weights`: the whole masters when the model keeps a shard of
   * them): a full model's is the array Transformer.checkpointWeights keeps (valid until the next snapshot), an adapter's
   * a new one.
   */
  resumeWeights(weights?: Float32Array): Float32Array;
  /** The host arrays resumeWeights fills again at each save, where the student keeps them (a full model's); else []. */
  keptArrays(): Float32Array[];
  /** What the optimizer trains (and what a checkpoint's moments and finiteness check cover). */
  readonly trainable: Trainable;
  /** Writes the folder users load (best/, final/) in `dtype`, with extra files (best.json). */
  writeUser(dir: string, dtype: 'f32' | 'bf16', extraFiles?: Record<string, string>, weights?: Float32Array): void;
  /** Loads the weights writeResumeFiles wrote. */
  restore(dir: string): void;
}

/** A run that trains every weight of the student. */
export function fullStudentFiles(student: Transformer, cfg: ModelConfig, carry: Carry): StudentFiles {
  const resumeWriter: ResumeWriter = { kind: 'model', cfg, carry };
  return {
    resumeDir: 'model',
    trainable: student,
    resumeWriter,
    resumeWeights: (weights) => weights ?? student.checkpointWeights(),
    keptArrays: () => { const w = student.keptWeights(); return w ? [w] : []; },
    writeUser: (dir, dtype, extraFiles, weights) => writeCheckpoint(dir, cfg, weights ?? student.checkpointWeights(), { dtype, ...carry, ...(extraFiles ? { extraFiles } : {}) }),
    restore: (dir) => student.setWeights(readCheckpoint(dir).weights),
  };
}

/** The tokenizer files of a folder, as text by file name (what writeCheckpoint writes beside the weights). */
function carriedFiles(cfg: ModelConfig, carry: Carry): Record<string, string> {
  const files: Record<string, string> = {};
  const { tokenizerConfig, generationConfig } = sideConfigs(cfg, carry);
  if (carry.tokenizerJson) files['tokenizer.json'] = JSON.stringify(carry.tokenizerJson);
  if (tokenizerConfig) files['tokenizer_config.json'] = JSON.stringify(tokenizerConfig, null, 2) + '\n';
  if (generationConfig) files['generation_config.json'] = JSON.stringify(generationConfig, null, 2) + '\n';
  return files;
}

/** A LoRA run: the adapters train, the base (whose reference and hash every folder records) stays frozen. */
export function loraStudentFiles(student: Transformer, cfg: ModelConfig, carry: Carry, base: BaseRef, baseName?: string): StudentFiles {
  const lora: LoraAdapters | null = student.lora;
  if (!lora) throw new Error('loraStudentFiles: the student has no adapters');
  const files = carriedFiles(cfg, carry);
  const write = (dir: string, dtype: 'f32' | 'bf16', extra?: Record<string, string>): void =>
    writeAdapter(dir, lora.layout, lora.getWeights(), { dtype, base, baseName, extraFiles: { ...files, ...extra } });
  const resumeWriter: ResumeWriter = { kind: 'adapter', layout: lora.layout, base, baseName, files };
  return {
    resumeDir: 'adapter',
    trainable: lora,
    resumeWriter,
    resumeWeights: () => float32Of(lora.getWeights()),
    keptArrays: () => [],
    writeUser: (dir, dtype, extraFiles) => write(dir, dtype, extraFiles),
    restore: (dir) => {
      const h = readAdapterHeader(dir);
      if (h.base && h.base.weights_sha256 !== base.weights_sha256) {
        throw new DistilleryError(`--resume: the checkpoint's adapter was trained on a base with other weights than --init ${base.path}`,
          `resume with the --init the run was started with (${h.base.path})`);
      }
      const { weights } = readAdapterWeights(dir, h.spec, cfg);
      const run = lora.layout.spec;
      if (weights.length !== lora.layout.total || h.spec.rank !== run.rank || h.spec.alpha !== run.alpha || h.spec.targets.join() !== run.targets.join()) {
        throw new DistilleryError(`--resume: the checkpoint's adapter (rank ${h.spec.rank}, alpha ${h.spec.alpha}, ${h.spec.targets.join(',')}) is not the run's (rank ${run.rank}, alpha ${run.alpha}, ${run.targets.join(',')})`,
          'resume with the same --lora-rank, --lora-alpha and --lora-targets');
      }
      lora.setWeights(weights);
    },
  };
}

/** checkpoints/latest/<resumeDir>. */
export function resumeWeightsDir(latest: string, f: Pick<StudentFiles, 'resumeDir'>): string {
  return path.join(latest, f.resumeDir);
}
