// One GGUF file's header (versions 2 and 3, little-endian), read with positioned reads: magic
// "GGUF", version u32, tensor count u64, metadata count u64, the metadata (key string, value type
// u32, value), then each tensor's info (name, n_dims u32, dims u64 fastest-first, ggml type u32,
// offset u64 into the data section), then, at the next multiple of general.alignment (default 32),
// the data section. Tensor data is never read here; readTensorBytes reads one tensor's raw bytes
// (its blocks) when asked.
//
// Everything a load would trip over is checked at open, each problem one line naming the file and
// the key or tensor: bad magic, an unknown version, a truncated header or data section, a string or
// array longer than the file, an unknown value or tensor type, a partial block, dims whose product
// overflows, a tensor past the end of the file, two tensors that overlap, misaligned offsets.

import fs from 'node:fs';
import { ArtifactError } from '../errors.ts';
import { GGML_TYPES, type GgmlType } from './ggml-types.ts';

export const GGUF_MAGIC = 0x46554747; // "GGUF" read as a little-endian u32
export const GGUF_DEFAULT_ALIGNMENT = 32;
/** ggml's GGML_MAX_DIMS */
const MAX_DIMS = 4;

/** Metadata value types (gguf-py GGUFValueType). */
export const GgufValueType = {
  UINT8: 0, INT8: 1, UINT16: 2, INT16: 3, UINT32: 4, INT32: 5, FLOAT32: 6, BOOL: 7, STRING: 8, ARRAY: 9,
  UINT64: 10, INT64: 11, FLOAT64: 12,
} as const;

const SCALAR_BYTES: Record<number, number> = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };

/**
 * A metadata value: numbers (64-bit integers as numbers when they are safe integers, else bigint),
 * booleans, strings; arrays of numbers as typed arrays (64-bit ones as number[]), other arrays as
 * plain arrays.
 */
export type GgufValue =
  | number | bigint | boolean | string
  | Uint8Array | Int8Array | Uint16Array | Int16Array | Uint32Array | Int32Array | Float32Array | Float64Array
  | GgufValue[];

export interface GgufTensorInfo {
  name: string;
  type: GgmlType;
  /** ggml's ne: dimensions fastest-varying first, as stored */
  dims: number[];
  /** row-major shape (dims reversed): [rows, ..., elements per row] */
  shape: number[];
  elements: number;
  /** absolute byte offset of the first block in `file` */
  offset: number;
  byteLength: number;
  file: string;
}

export interface GgufHeader {
  file: string;
  fileSize: number;
  version: number;
  metadata: Map<string, GgufValue>;
  tensors: GgufTensorInfo[];
  alignment: number;
  /** absolute offset of the data section */
  dataStart: number;
}

/** Buffered positioned reads over an open file, failing with "truncated" past its end. */
class Cursor {
  pos = 0;
  private buf = Buffer.alloc(0);
  private bufStart = 0;

  constructor(private readonly fd: number, readonly size: number, private readonly fail: (m: string) => Error) {}

  /** makes bytes [pos, pos + n) available and returns the buffer offset of pos */
  private need(n: number, what: string): number {
    if (this.pos + n > this.size) {
      throw this.fail(`is truncated: ${what} needs bytes ${this.pos}..${this.pos + n}, but the file has ${this.size}`);
    }
    if (this.pos < this.bufStart || this.pos + n > this.bufStart + this.buf.length) {
      const len = Math.min(Math.max(n, 1 << 20), this.size - this.pos);
      const b = Buffer.alloc(len);
      let done = 0;
      while (done < len) {
        const got = fs.readSync(this.fd, b, done, len - done, this.pos + done);
        if (got === 0) throw this.fail(`is truncated: ${what} ends at byte ${this.pos + done}`);
        done += got;
      }
      this.buf = b;
      this.bufStart = this.pos;
    }
    return this.pos - this.bufStart;
  }

  u8(what: string): number {
    const o = this.need(1, what);
    this.pos += 1;
    return this.buf[o]!;
  }
  u32(what: string): number {
    const o = this.need(4, what);
    this.pos += 4;
    return this.buf.readUInt32LE(o);
  }
  u64(what: string): bigint {
    const o = this.need(8, what);
    this.pos += 8;
    return this.buf.readBigUInt64LE(o);
  }
  /** a u64 that must fit a safe integer no larger than `max` */
  count(what: string, max: number): number {
    const v = this.u64(what);
    if (v > BigInt(max)) throw this.fail(`${what} is ${v}, more than the file can hold (${max})`);
    return Number(v);
  }
  bytes(n: number, what: string): Buffer {
    const o = this.need(n, what);
    this.pos += n;
    return this.buf.subarray(o, o + n);
  }
  string(what: string): string {
    const n = this.count(`the length of ${what}`, this.size - this.pos - 8);
    const b = this.bytes(n, what);
    try {
      return new TextDecoder('utf-8', { fatal: true }).decode(b);
    } catch {
      throw this.fail(`${what} is not valid UTF-8`);
    }
  }
  scalar(type: number, what: string): GgufValue {
    const o = this.need(SCALAR_BYTES[type]!, what);
    const b = this.buf;
    this.pos += SCALAR_BYTES[type]!;
    switch (type) {
      case GgufValueType.UINT8: return b.readUInt8(o);
      case GgufValueType.INT8: return b.readInt8(o);
      case GgufValueType.UINT16: return b.readUInt16LE(o);
      case GgufValueType.INT16: return b.readInt16LE(o);
      case GgufValueType.UINT32: return b.readUInt32LE(o);
      case GgufValueType.INT32: return b.readInt32LE(o);
      case GgufValueType.FLOAT32: return b.readFloatLE(o);
      case GgufValueType.FLOAT64: return b.readDoubleLE(o);
      case GgufValueType.BOOL: {
        const v = b.readUInt8(o);
        if (v > 1) throw this.fail(`${what} is a bool stored as ${v}`);
        return v === 1;
      }
      case GgufValueType.UINT64: return safe(b.readBigUInt64LE(o));
      default: return safe(b.readBigInt64LE(o));
    }
  }
}

const safe = (v: bigint): number | bigint => (v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= -BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v);

const TYPED: Record<number, { new(buf: ArrayBuffer): Exclude<GgufValue, number | bigint | boolean | string | GgufValue[]> }> = {
  0: Uint8Array, 1: Int8Array, 2: Uint16Array, 3: Int16Array, 4: Uint32Array, 5: Int32Array, 6: Float32Array, 12: Float64Array,
};

function readValue(c: Cursor, type: number, what: string, fail: (m: string) => Error, depth = 0): GgufValue {
  if (type === GgufValueType.STRING) return c.string(what);
  if (type === GgufValueType.ARRAY) {
    if (depth > 8) throw fail(`${what} nests arrays more than 8 deep`);
    const elem = c.u32(`the element type of ${what}`);
    if (elem !== GgufValueType.STRING && elem !== GgufValueType.ARRAY && SCALAR_BYTES[elem] === undefined) {
      throw fail(`${what} is an array of unknown value type ${elem}`);
    }
    // every element takes at least its scalar size (strings and arrays at least their 8-byte length)
    const minBytes = SCALAR_BYTES[elem] ?? (elem === GgufValueType.ARRAY ? 12 : 8);
    const n = c.count(`the length of ${what}`, Math.floor((c.size - c.pos - 8) / minBytes));
    const Typed = TYPED[elem];
    if (Typed) {
      const raw = c.bytes(n * minBytes, what);
      const copy = new ArrayBuffer(raw.length);
      new Uint8Array(copy).set(raw);
      return new Typed(copy);
    }
    const out: GgufValue[] = new Array(n);
    for (let i = 0; i < n; i++) out[i] = readValue(c, elem, `${what}[${i}]`, fail, depth + 1);
    return out;
  }
  if (SCALAR_BYTES[type] === undefined) throw fail(`${what} has unknown value type ${type}`);
  return c.scalar(type, what);
}

/** Reads and checks a GGUF file's header. Throws ArtifactError with one line naming the problem. */
export function readGgufHeader(file: string): GgufHeader {
  const fail = (msg: string) => new ArtifactError(`GGUF file ${file}: ${msg}`, file);
  let fd: number;
  try {
    fd = fs.openSync(file, 'r');
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw fail(code === 'ENOENT' ? 'is missing' : `cannot be opened (${code ?? (e as Error).message})`);
  }
  try {
    const fileSize = fs.fstatSync(fd).size;
    const c = new Cursor(fd, fileSize, fail);
    if (fileSize < 4) throw fail(`is ${fileSize} bytes, too small to hold a header`);
    const magic = c.u32('the magic');
    if (magic !== GGUF_MAGIC) {
      const shown = Buffer.alloc(4);
      shown.writeUInt32LE(magic);
      throw fail(`is not a GGUF file (magic ${JSON.stringify(shown.toString('latin1'))}, expected "GGUF")`);
    }
    const version = c.u32('the version');
    if (version !== 2 && version !== 3) {
      const swapped = ((version & 0xff) << 24 | (version & 0xff00) << 8 | (version >>> 8) & 0xff00 | version >>> 24) >>> 0;
      if (swapped === 2 || swapped === 3) throw fail(`is a big-endian GGUF (version ${swapped}); only little-endian files are supported`);
      throw fail(`has GGUF version ${version}; supported: 2, 3`);
    }
    // a tensor info takes at least 4 + 8 + 4 + 8 + 8 bytes, a key-value pair at least 8 + 4 + 1
    const tensorCount = c.count('the tensor count', Math.floor(fileSize / 32));
    const kvCount = c.count('the metadata count', Math.floor(fileSize / 13));

    const metadata = new Map<string, GgufValue>();
    for (let i = 0; i < kvCount; i++) {
      const key = c.string(`metadata key ${i}`);
      if (metadata.has(key)) throw fail(`metadata key "${key}" appears twice`);
      const type = c.u32(`the value type of "${key}"`);
      metadata.set(key, readValue(c, type, `metadata "${key}"`, fail));
    }

    const alignValue = metadata.get('general.alignment') ?? GGUF_DEFAULT_ALIGNMENT;
    if (typeof alignValue !== 'number' || !Number.isInteger(alignValue) || alignValue <= 0 || (alignValue & (alignValue - 1)) !== 0) {
      throw fail(`general.alignment is ${String(alignValue)}; it must be a power of two`);
    }
    const alignment = alignValue;

    const infos: Omit<GgufTensorInfo, 'offset'>[] = [];
    const relOffsets: number[] = [];
    const names = new Set<string>();
    for (let i = 0; i < tensorCount; i++) {
      const name = c.string(`the name of tensor ${i}`);
      if (names.has(name)) throw fail(`tensor "${name}" appears twice`);
      names.add(name);
      const nDims = c.u32(`the dimension count of tensor "${name}"`);
      if (nDims < 1 || nDims > MAX_DIMS) throw fail(`tensor "${name}" has ${nDims} dimensions; ggml allows 1..${MAX_DIMS}`);
      const dims: number[] = [];
      let elements = 1;
      for (let d = 0; d < nDims; d++) {
        const v = c.u64(`dimension ${d} of tensor "${name}"`);
        if (v === 0n) throw fail(`tensor "${name}" has a zero dimension`);
        if (v > BigInt(Number.MAX_SAFE_INTEGER) || elements * Number(v) > Number.MAX_SAFE_INTEGER) {
          throw fail(`tensor "${name}" has dimensions whose product overflows (dimension ${d} is ${v})`);
        }
        dims.push(Number(v));
        elements *= Number(v);
      }
      const typeId = c.u32(`the type of tensor "${name}"`);
      const type = GGML_TYPES.get(typeId);
      if (!type) throw fail(`tensor "${name}" has unknown ggml type ${typeId}`);
      if (dims[0]! % type.blockSize !== 0) {
        throw fail(`tensor "${name}" has rows of ${dims[0]} elements, not a multiple of the ${type.name} block size ${type.blockSize}`);
      }
      const rel = c.u64(`the offset of tensor "${name}"`);
      if (rel > BigInt(Number.MAX_SAFE_INTEGER)) throw fail(`tensor "${name}" has offset ${rel}, past the end of the file`);
      if (Number(rel) % alignment !== 0) throw fail(`tensor "${name}" has offset ${rel}, not a multiple of the alignment ${alignment}`);
      const byteLength = (elements / type.blockSize) * type.typeSize;
      infos.push({ name, type, dims, shape: [...dims].reverse(), elements, byteLength, file });
      relOffsets.push(Number(rel));
    }
    const dataStart = Math.ceil(c.pos / alignment) * alignment;
    const tensors: GgufTensorInfo[] = infos.map((t, i) => ({ ...t, offset: dataStart + relOffsets[i]! }));
    for (const t of tensors) {
      if (t.offset + t.byteLength > fileSize) {
        throw fail(`is truncated: tensor "${t.name}" (${t.type.name} [${t.dims.join(', ')}]) needs bytes up to ${t.offset + t.byteLength}, but the file has ${fileSize}`);
      }
    }
    const sorted = [...tensors].sort((a, b) => a.offset - b.offset);
    for (let i = 1; i < sorted.length; i++) {
      const prev = sorted[i - 1]!;
      if (sorted[i]!.offset < prev.offset + prev.byteLength) throw fail(`tensors "${prev.name}" and "${sorted[i]!.name}" overlap`);
    }
    return { file, fileSize, version, metadata, tensors, alignment, dataStart };
  } finally {
    fs.closeSync(fd);
  }
}

/** The raw bytes (ggml blocks) of `t`, or of its byte range [start, start + length). */
export function readTensorBytes(t: GgufTensorInfo, start = 0, length = t.byteLength - start): Uint8Array {
  if (start < 0 || length < 0 || start + length > t.byteLength) {
    throw new Error(`readTensorBytes: bytes [${start}, ${start + length}) outside tensor "${t.name}" (${t.byteLength} bytes)`);
  }
  const out = new Uint8Array(length);
  const fd = fs.openSync(t.file, 'r');
  try {
    let done = 0;
    while (done < length) {
      const got = fs.readSync(fd, out, done, length - done, t.offset + start + done);
      if (got === 0) throw new ArtifactError(`GGUF file ${t.file} ends inside tensor "${t.name}"`, t.file);
      done += got;
    }
  } finally {
    fs.closeSync(fd);
  }
  return out;
}
