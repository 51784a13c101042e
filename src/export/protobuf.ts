/**
 * A minimal protocol-buffers writer: just what the ONNX exporter needs (varint, 32-bit float, length-delimited
 * fields). A message is kept as a list of byte chunks plus their total length, so large tensor payloads are
 * never copied: they are referenced as views and written to the file chunk by chunk.
 */

const enc = new TextEncoder();

/** Wire types. */
const VARINT = 0, LEN = 2, I32 = 5;

function varintBytes(v: bigint): Uint8Array {
  // int64 fields hold negative numbers as their 64-bit two's complement (10 bytes), as protobuf does.
  let u = BigInt.asUintN(64, v);
  const out: number[] = [];
  do {
    let b = Number(u & 0x7fn);
    u >>= 7n;
    if (u !== 0n) b |= 0x80;
    out.push(b);
  } while (u !== 0n);
  return Uint8Array.from(out);
}

function smallVarint(n: number): Uint8Array {
  if (n >= 0 && n < 0x80) return Uint8Array.of(n);
  return varintBytes(BigInt(n));
}

export class Message {
  readonly chunks: Uint8Array[] = [];
  length = 0;

  private push(b: Uint8Array): void {
    if (b.length === 0) return;
    this.chunks.push(b);
    this.length += b.length;
  }
  private tag(field: number, wire: number): void {
    this.push(smallVarint((field << 3) | wire));
  }

  /** An integer field (int32, int64, enum, bool). */
  int(field: number, v: number | bigint): this {
    if (typeof v === 'number' && !Number.isSafeInteger(v)) throw new RangeError(`protobuf: ${v} is not an integer`);
    this.tag(field, VARINT);
    this.push(varintBytes(BigInt(v)));
    return this;
  }
  /** A repeated int64 field, packed (proto3 default; accepted for proto2 `repeated int64` by every parser). */
  packedInts(field: number, vs: readonly number[]): this {
    if (vs.length === 0) return this;
    const body = vs.map((v) => varintBytes(BigInt(v)));
    this.tag(field, LEN);
    this.push(smallVarint(body.reduce((a, b) => a + b.length, 0)));
    for (const b of body) this.push(b);
    return this;
  }
  /** A 32-bit float field. */
  float(field: number, v: number): this {
    this.tag(field, I32);
    const b = new Uint8Array(4);
    new DataView(b.buffer).setFloat32(0, v, true);
    this.push(b);
    return this;
  }
  string(field: number, s: string): this {
    return this.bytes(field, enc.encode(s));
  }
  /** A bytes field; the payload is referenced, not copied. */
  bytes(field: number, b: Uint8Array): this {
    this.tag(field, LEN);
    this.push(smallVarint(b.length));
    this.push(b);
    return this;
  }
  /** An embedded message field. */
  message(field: number, m: Message): this {
    this.tag(field, LEN);
    this.push(smallVarint(m.length));
    for (const c of m.chunks) this.push(c);
    return this;
  }

  /** The whole message as one buffer (small messages and tests). */
  toBytes(): Uint8Array {
    const out = new Uint8Array(this.length);
    let o = 0;
    for (const c of this.chunks) { out.set(c, o); o += c.length; }
    return out;
  }
}
