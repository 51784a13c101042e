/**
 * The safetensors format (https://github.com/huggingface/safetensors): an 8-byte little-endian header length N,
 * N bytes of JSON `{ name: { dtype, shape, data_offsets: [begin, end] }, __metadata__?: {string: string} }`, then
 * the tensor bytes (offsets are relative to the end of the header).
 *
 * Reading accepts F32, F16 and BF16 and always returns Float32Array data; any other dtype is rejected. The file is
 * validated before a byte of tensor data is trusted: header length vs file size, JSON, per-tensor dtype / shape /
 * offsets, offsets in range, contiguous and non-overlapping (as the format requires), and
 * shape product × dtype size = byte length. Every problem throws a DistilleryError naming the file.
 * Writing produces F32 or BF16 (round-to-nearest-even), with the header padded to 8 bytes, atomically.
 */
import * as fs from 'node:fs';
import { DistilleryError } from '../util/errors.js';
import { MAX_IO_BYTES, writeAll, writeFileAtomicWith } from './atomic.js';
import { packBf16 } from '../backend/bf16.js';

export type SafetensorsDtype = 'F32' | 'F16' | 'BF16';

export interface Tensor {
  /** dtype as stored in the file (data is always converted to float32). */
  dtype: SafetensorsDtype;
  shape: number[];
  data: Float32Array;
}

export interface SafetensorsFile {
  tensors: Map<string, Tensor>;
  /** The `__metadata__` object (string → string), empty when the file has none. */
  metadata: Record<string, string>;
}

export interface TensorInfo {
  dtype: string;
  shape: number[];
  /** Absolute byte offsets in the file. */
  begin: number;
  end: number;
}

export interface SafetensorsHeader {
  tensors: Map<string, TensorInfo>;
  metadata: Record<string, string>;
  /** Byte offset of the data section. */
  dataStart: number;
  /** The file's identity when the header was read (fileStamp): a later read of its tensors checks it is the same file. */
  stamp: string;
}

/**
 * A file's identity: device, inode, size and modification time (ns). A file replaced (a new inode) or written to (a new
 * modification time) since gets another stamp.
 */
function fileStamp(fd: number): string {
  const st = fs.fstatSync(fd, { bigint: true });
  return `${st.dev}:${st.ino}:${st.size}:${st.mtimeNs}`;
}

const DTYPE_SIZE: Record<string, number> = {
  F64: 8, F32: 4, F16: 2, BF16: 2, I64: 8, I32: 4, I16: 2, I8: 1, U64: 8, U32: 4, U16: 2, U8: 1, BOOL: 1,
  F8_E4M3: 1, F8_E5M2: 1,
};
const READABLE = new Set(['F32', 'F16', 'BF16']);
/** Headers larger than this are refused (the reference implementation uses 100 MB). */
const MAX_HEADER = 100_000_000;

if (new Uint8Array(new Uint16Array([1]).buffer)[0] !== 1) {
  throw new Error('distillery assumes a little-endian machine');
}

function corrupt(file: string, problem: string): DistilleryError {
  return new DistilleryError(`${file}: not a valid safetensors file: ${problem}`,
    'the file is truncated or corrupt; re-download or re-save it');
}

/** Fills buf from the file at `position` (loops over short reads, at most `maxChunk` bytes per call: see MAX_IO_BYTES). */
export function readExactly(fd: number, buf: Uint8Array, position: number, file: string, maxChunk = MAX_IO_BYTES): void {
  let off = 0;
  while (off < buf.byteLength) {
    const n = fs.readSync(fd, buf, off, Math.min(maxChunk, buf.byteLength - off), position + off);
    if (n === 0) throw corrupt(file, `unexpected end of file at byte ${position + off}`);
    off += n;
  }
}

function parseHeader(file: string, fd: number): SafetensorsHeader {
  const size = fs.fstatSync(fd).size;
  if (size < 8) throw corrupt(file, `file is ${size} bytes, shorter than the 8-byte header length`);
  const lenBuf = Buffer.alloc(8);
  readExactly(fd, lenBuf, 0, file);
  const n64 = lenBuf.readBigUInt64LE(0);
  if (n64 > BigInt(size - 8)) throw corrupt(file, `header length ${n64} exceeds the file size (${size} bytes)`);
  const n = Number(n64);
  if (n > MAX_HEADER) throw corrupt(file, `header length ${n} is larger than the 100 MB limit`);
  if (n < 2) throw corrupt(file, `header length ${n} is too small for a JSON object`);
  const hbuf = Buffer.alloc(n);
  readExactly(fd, hbuf, 8, file);
  let text: string;
  // strict UTF-8, as the format requires (a lenient decode turned a damaged tensor name into U+FFFD)
  try { text = new TextDecoder('utf-8', { fatal: true }).decode(hbuf); } catch { throw corrupt(file, 'header is not valid UTF-8'); }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw corrupt(file, `header is not valid JSON (${(e as Error).message})`);
  }
  if (typeof json !== 'object' || json === null || Array.isArray(json)) throw corrupt(file, 'header is not a JSON object');
  const dataStart = 8 + n;
  const dataLen = size - dataStart;
  const metadata: Record<string, string> = {};
  const tensors = new Map<string, TensorInfo>();
  for (const [name, v] of Object.entries(json as Record<string, unknown>)) {
    if (name === '__metadata__') {
      if (typeof v !== 'object' || v === null || Array.isArray(v)) throw corrupt(file, '__metadata__ is not an object');
      for (const [k, mv] of Object.entries(v as Record<string, unknown>)) {
        if (typeof mv !== 'string') throw corrupt(file, `__metadata__.${k} is not a string`);
        metadata[k] = mv;
      }
      continue;
    }
    if (typeof v !== 'object' || v === null) throw corrupt(file, `entry "${name}" is not an object`);
    const e = v as Record<string, unknown>;
    const dtype = e.dtype;
    if (typeof dtype !== 'string' || !(dtype in DTYPE_SIZE)) throw corrupt(file, `tensor "${name}" has unknown dtype ${JSON.stringify(dtype)}`);
    const shape = e.shape;
    if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && (d as number) >= 0)) {
      throw corrupt(file, `tensor "${name}" has an invalid shape ${JSON.stringify(shape)}`);
    }
    const offs = e.data_offsets;
    if (!Array.isArray(offs) || offs.length !== 2 || !offs.every((o) => Number.isSafeInteger(o) && (o as number) >= 0)) {
      throw corrupt(file, `tensor "${name}" has invalid data_offsets ${JSON.stringify(offs)}`);
    }
    const [b, en] = offs as [number, number];
    if (b > en) throw corrupt(file, `tensor "${name}" has data_offsets [${b}, ${en}] with begin > end`);
    if (en > dataLen) {
      throw corrupt(file, `tensor "${name}" ends at data byte ${en} but the file has only ${dataLen} data bytes (truncated?)`);
    }
    const numel = (shape as number[]).reduce((a, d) => a * d, 1);
    const expect = numel * DTYPE_SIZE[dtype]!;
    if (expect !== en - b) {
      throw corrupt(file, `tensor "${name}" has shape [${shape.join(', ')}] ${dtype} = ${expect} bytes but data_offsets span ${en - b} bytes`);
    }
    tensors.set(name, { dtype, shape: (shape as number[]).slice(), begin: dataStart + b, end: dataStart + en });
  }
  // The format requires the tensors to tile the data section exactly: sorted by offset, no gaps, no overlaps.
  const sorted = [...tensors.entries()].sort((x, y) => x[1].begin - y[1].begin || x[1].end - y[1].end);
  let pos = dataStart;
  for (const [name, t] of sorted) {
    if (t.begin < pos) throw corrupt(file, `tensor "${name}" overlaps the previous tensor (starts at data byte ${t.begin - dataStart}, previous ends at ${pos - dataStart})`);
    if (t.begin > pos) throw corrupt(file, `gap in the data before tensor "${name}" (data bytes ${pos - dataStart}..${t.begin - dataStart} belong to no tensor)`);
    pos = t.end;
  }
  if (pos !== size) throw corrupt(file, `${size - pos} trailing bytes after the last tensor`);
  return { tensors, metadata, dataStart, stamp: fileStamp(fd) };
}

function openForRead(file: string): number {
  try {
    return fs.openSync(file, 'r');
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw new DistilleryError(`${file}: no such file`, 'check the path');
    if (code === 'EISDIR') throw new DistilleryError(`${file} is a folder, not a safetensors file`, 'point at the .safetensors file inside it');
    throw new DistilleryError(`${file}: cannot open (${(e as Error).message})`, 'check the path and its permissions');
  }
}

/** Reads and validates only the header (no tensor data). */
export function readSafetensorsHeader(file: string): SafetensorsHeader {
  const fd = openForRead(file);
  try { return parseHeader(file, fd); } finally { fs.closeSync(fd); }
}

let halfTable: Float32Array | null = null;
/** float16 bits → float32 value, for all 65536 bit patterns. */
function halfToFloatTable(): Float32Array {
  if (halfTable) return halfTable;
  const t = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const s = h & 0x8000 ? -1 : 1;
    const e = (h >> 10) & 0x1f;
    const m = h & 0x3ff;
    let v: number;
    if (e === 0) v = m * 2 ** -24;
    else if (e === 31) v = m ? NaN : Infinity;
    else v = (1 + m / 1024) * 2 ** (e - 15);
    t[h] = s * v;
  }
  halfTable = t;
  return t;
}

/** The float32 values of 16-bit patterns (BF16: the high half of each; F16: by the half-float table) into `out`. */
function widen(bits: Uint16Array, dtype: 'F16' | 'BF16', out: Float32Array): void {
  const n = bits.length;
  if (dtype === 'BF16') {
    const o32 = new Uint32Array(out.buffer, out.byteOffset, n);
    for (let i = 0; i < n; i++) o32[i] = bits[i]! << 16;
  } else {
    const tab = halfToFloatTable();
    for (let i = 0; i < n; i++) out[i] = tab[bits[i]!]!;
  }
}

export interface ReadOptions {
  /** Load only the tensors for which this returns true (all by default). */
  filter?: (name: string) => boolean;
}

/** A tensor of a safetensors file not yet read: its dtype and shape, and read() for its values (each call reads). */
export interface LazyTensor {
  dtype: SafetensorsDtype;
  shape: number[];
  read(): Float32Array;
  /** read()'s values into `out` (as many as the tensor has), with no array of its own. */
  readInto(out: Float32Array): void;
  /**
   * The values' bfloat16 bit patterns: a BF16 tensor's own bytes, as stored (no conversion); F32 and F16 values rounded
   * to nearest even, as packBf16 rounds them (what uploading read() into a bf16 buffer stores).
   */
  readBf16(): Uint16Array;
}

/**
 * A safetensors file's header, with each tensor (F32/F16/BF16) read as a Float32Array only when asked: what loads a
 * model tensor by tensor without the whole of it in memory (a 7B teacher). A read finding the file replaced or written
 * to since the header was read is refused (DistilleryError naming the file): the tensors of one model, however often
 * read (a teacher cache's hash of the weights, then their upload), are the same bytes.
 */
export function lazySafetensors(file: string, opts: ReadOptions = {}): { tensors: Map<string, LazyTensor>; metadata: Record<string, string> } {
  const header = readSafetensorsHeader(file);
  const tensors = new Map<string, LazyTensor>();
  for (const [name, info] of header.tensors) {
    if (opts.filter && !opts.filter(name)) continue;
    if (!READABLE.has(info.dtype)) {
      throw new DistilleryError(`${file}: tensor "${name}" has dtype ${info.dtype}; distillery reads only F32, F16 and BF16`,
        'convert the checkpoint to float32, float16 or bfloat16 (e.g. model.to(torch.bfloat16) then save_pretrained)');
    }
    const dtype = info.dtype as SafetensorsDtype;
    const numel = info.shape.reduce((a, d) => a * d, 1);
    const bytesInto = (bytes: Uint8Array): void => {
      const fd = openForRead(file);
      try {
        // every tensor comes from the file whose header placed it (a model hashed, then uploaded, is read twice)
        if (fileStamp(fd) !== header.stamp) {
          throw new DistilleryError(`${file} changed while distillery was reading it (replaced or written to since its header was read)`,
            'do not overwrite a checkpoint that a run is reading; run the command again once the file is complete');
        }
        readExactly(fd, bytes, info.begin, file);
      } finally { fs.closeSync(fd); }
    };
    /** A 16-bit tensor's patterns, read into an array of their own (aligned). */
    const bits16 = (): Uint16Array => { const b = new Uint16Array(numel); bytesInto(new Uint8Array(b.buffer)); return b; };
    const readInto = (out: Float32Array): void => {
      if (out.length !== numel) throw new Error(`${file}: tensor "${name}" has ${numel} values, read into ${out.length}`);
      if (dtype === 'F32') bytesInto(new Uint8Array(out.buffer, out.byteOffset, numel * 4));
      else widen(bits16(), dtype, out);
    };
    const read = (): Float32Array => { const out = new Float32Array(numel); readInto(out); return out; };
    tensors.set(name, {
      dtype, shape: info.shape, read, readInto,
      readBf16: () => (dtype === 'BF16' ? bits16() : packBf16(read())),
    });
  }
  return { tensors, metadata: header.metadata };
}

/** Reads a safetensors file; F32/F16/BF16 tensors are returned as Float32Array. */
export function readSafetensors(file: string, opts: ReadOptions = {}): SafetensorsFile {
  const { tensors, metadata } = lazySafetensors(file, opts);
  return { tensors: readTensors(tensors), metadata };
}

/** Every tensor of a lazy map read now. */
export function readTensors(lazy: ReadonlyMap<string, LazyTensor>): Map<string, Tensor> {
  const tensors = new Map<string, Tensor>();
  for (const [name, t] of lazy) tensors.set(name, { dtype: t.dtype, shape: t.shape, data: t.read() });
  return tensors;
}

/** Elements a bf16 write converts at a time (writeSafetensors). */
export const BF16_WRITE_CHUNK = 1 << 22;

/** float32 → bfloat16 bits with round-to-nearest-even (NaN stays a quiet NaN), into `into` when given (src.length of it). */
export function f32ToBf16Bits(src: Float32Array, into?: Uint16Array): Uint16Array {
  const u32 = new Uint32Array(src.buffer, src.byteOffset, src.length);
  const out = into ?? new Uint16Array(src.length);
  for (let i = 0; i < src.length; i++) {
    const u = u32[i]!;
    if ((u & 0x7f800000) === 0x7f800000 && (u & 0x7fffff) !== 0) out[i] = ((u >>> 16) & 0x8000) | 0x7fc0;
    else out[i] = ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
  }
  return out;
}

export interface WriteTensor {
  shape: readonly number[];
  data: Float32Array;
}

export interface WriteOptions {
  /** Storage dtype for every tensor (default 'f32'). */
  dtype?: 'f32' | 'bf16';
  /** `__metadata__` (string values only), e.g. { format: 'pt' }. */
  metadata?: Record<string, string>;
}

/**
 * Writes tensors (a Map or a plain object, in insertion order) to a safetensors file, atomically
 * (temp file + fsync + rename). Throws DistilleryError when a shape does not match its data length.
 */
export function writeSafetensors(
  file: string,
  tensors: Map<string, WriteTensor> | Record<string, WriteTensor>,
  opts: WriteOptions = {},
): void {
  const dtype = opts.dtype ?? 'f32';
  if (dtype !== 'f32' && dtype !== 'bf16') {
    throw new DistilleryError(`safetensors: cannot write dtype ${JSON.stringify(dtype)}`, "use 'f32' or 'bf16'");
  }
  const entries = tensors instanceof Map ? [...tensors.entries()] : Object.entries(tensors);
  const esize = dtype === 'f32' ? 4 : 2;
  const header: Record<string, unknown> = {};
  if (opts.metadata) {
    for (const [k, v] of Object.entries(opts.metadata)) {
      if (typeof v !== 'string') throw new DistilleryError(`safetensors: metadata "${k}" must be a string`, 'convert metadata values to strings');
    }
    header.__metadata__ = opts.metadata;
  }
  // the conversion buffer of a bf16 write fits the file's largest tensor (up to BF16_WRITE_CHUNK): sized by the first
  // tensor, an empty or small first one (a norm opening a shard) made every later tensor go out a few bytes per write
  let off = 0, largest = 0;
  for (const [name, t] of entries) {
    if (name === '__metadata__') throw new DistilleryError('safetensors: a tensor cannot be named "__metadata__"', 'rename the tensor');
    // the sizes from the shapes: a tensor whose data is read when it is written (a getter) is read once, there
    const numel = t.shape.reduce((a, d) => a * d, 1);
    if (!t.shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      throw new DistilleryError(`safetensors: tensor "${name}" has shape [${t.shape.join(', ')}]`, 'pass a shape of non-negative integers');
    }
    header[name] = { dtype: dtype === 'f32' ? 'F32' : 'BF16', shape: [...t.shape], data_offsets: [off, off + numel * esize] };
    off += numel * esize;
    largest = Math.max(largest, numel);
  }
  let hjson = JSON.stringify(header);
  const hlen = Buffer.byteLength(hjson, 'utf8');
  hjson += ' '.repeat((8 - ((8 + hlen) % 8)) % 8);
  const hbytes = Buffer.from(hjson, 'utf8');
  const prefix = Buffer.alloc(8);
  prefix.writeBigUInt64LE(BigInt(hbytes.byteLength), 0);
  let chunk: Uint16Array | null = null;
  writeFileAtomicWith(file, (fd) => {
    writeAll(fd, prefix);
    writeAll(fd, hbytes);
    for (const [name, t] of entries) {
      const data = t.data, numel = t.shape.reduce((a, d) => a * d, 1);
      if (data.length !== numel) {
        throw new DistilleryError(`safetensors: tensor "${name}" has shape [${t.shape.join(', ')}] but ${data.length} values`,
          'pass a shape whose product equals the data length');
      }
      if (dtype === 'f32') { writeAll(fd, new Uint8Array(data.buffer, data.byteOffset, data.byteLength)); continue; }
      // bf16: converted and written a chunk at a time through one buffer (not a new half-size copy of every tensor,
      // whose fresh pages cost as much as the conversion: 1 GB for a 0.5B model's bf16 folder)
      chunk ??= new Uint16Array(Math.min(BF16_WRITE_CHUNK, Math.max(1, largest)));
      for (let i = 0; i < numel; i += chunk.length) {
        const n = Math.min(chunk.length, numel - i), bits = f32ToBf16Bits(data.subarray(i, i + n), chunk.subarray(0, n));
        writeAll(fd, new Uint8Array(bits.buffer, bits.byteOffset, bits.byteLength));
      }
    }
  });
}
