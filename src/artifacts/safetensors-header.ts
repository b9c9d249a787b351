// One safetensors file's header: 8-byte little-endian length N, then N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}; tensor bytes follow,
// offsets relative to byte 8 + N. Only the header is read (positioned reads); tensor data never
// enters the JS heap. Everything a later load would trip over is checked here, so a bad file
// fails at open time with a message naming the file and tensor.

import fs from 'node:fs';
import { ArtifactError } from './errors.ts';

/** bits per element of every dtype the format defines (sizes are validated for all of them) */
const DTYPE_BITS: Record<string, number> = {
  BOOL: 8, U8: 8, I8: 8, F8_E5M2: 8, F8_E4M3: 8, F8_E8M0: 8,
  I16: 16, U16: 16, F16: 16, BF16: 16,
  I32: 32, U32: 32, F32: 32,
  I64: 64, U64: 64, F64: 64, C64: 64,
  F4: 4, F6_E2M3: 6, F6_E3M2: 6,
};

/** the format's own limit on header size (100 MB) */
const MAX_HEADER_BYTES = 100_000_000;

export interface TensorEntry {
  name: string;
  /** safetensors dtype name, e.g. "BF16" (may be one the engine cannot load; see WeightIndex.get) */
  dtype: string;
  shape: number[];
  /** absolute byte offset of the first element */
  offset: number;
  byteLength: number;
  file: string;
}

export interface SafetensorsHeader {
  file: string;
  fileSize: number;
  /** absolute offset of the data section (8 + header length) */
  dataStart: number;
  tensors: Map<string, TensorEntry>;
  metadata: Record<string, unknown>;
}

export function readSafetensorsHeader(file: string): SafetensorsHeader {
  const fail = (msg: string) => new ArtifactError(`safetensors file ${file}: ${msg}`, file);
  let fd: number;
  try {
    fd = fs.openSync(file, 'r');
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw fail(code === 'ENOENT' ? 'is missing' : `cannot be opened (${code ?? (e as Error).message})`);
  }
  let json: string;
  let fileSize: number;
  let headerLength: number;
  try {
    fileSize = fs.fstatSync(fd).size;
    if (fileSize < 8) throw fail(`is ${fileSize} bytes, too small to hold a header`);
    const lengthBytes = readExactly(fd, 0, 8);
    const n = lengthBytes.readBigUInt64LE(0);
    if (n === 0n || n > BigInt(MAX_HEADER_BYTES) || n > BigInt(fileSize - 8)) {
      throw fail(`header length ${n} is invalid (file is ${fileSize} bytes; limit ${MAX_HEADER_BYTES})`);
    }
    headerLength = Number(n);
    try {
      json = new TextDecoder('utf-8', { fatal: true }).decode(readExactly(fd, 8, headerLength));
    } catch {
      throw fail('header is not valid UTF-8');
    }
  } finally {
    fs.closeSync(fd);
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(json);
  } catch (e) {
    throw fail(`header is not valid JSON (${(e as Error).message})`);
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) throw fail('header is not a JSON object');

  const dataStart = 8 + headerLength;
  const tensors = new Map<string, TensorEntry>();
  let metadata: Record<string, unknown> = {};
  for (const [name, v] of Object.entries(parsed as Record<string, any>)) {
    if (name === '__metadata__') {
      if (v !== null && typeof v === 'object') metadata = v;
      continue;
    }
    tensors.set(name, parseEntry(name, v, file, dataStart, fileSize, fail));
  }
  checkNoOverlap([...tensors.values()], fail);
  return { file, fileSize, dataStart, tensors, metadata };
}

function parseEntry(
  name: string, v: any, file: string, dataStart: number, fileSize: number, fail: (m: string) => Error,
): TensorEntry {
  if (v === null || typeof v !== 'object') throw fail(`tensor "${name}" has no {dtype, shape, data_offsets} entry`);
  const bits = DTYPE_BITS[v.dtype];
  if (bits === undefined) throw fail(`tensor "${name}" has unknown dtype ${JSON.stringify(v.dtype)}`);
  const shape = v.shape;
  if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
    throw fail(`tensor "${name}" has an invalid shape ${JSON.stringify(shape)}`);
  }
  const offs = v.data_offsets;
  if (!Array.isArray(offs) || offs.length !== 2 || !offs.every((o) => Number.isSafeInteger(o) && o >= 0) || offs[1] < offs[0]) {
    throw fail(`tensor "${name}" has invalid data_offsets ${JSON.stringify(offs)}`);
  }
  const elements = shape.reduce((a: number, d: number) => a * d, 1);
  const needed = (elements * bits) / 8;
  const [begin, end] = offs as [number, number];
  if (end - begin !== needed) {
    throw fail(
      `tensor "${name}" data_offsets [${begin}, ${end}] span ${end - begin} bytes, ` +
        `but shape [${shape.join(', ')}] of ${v.dtype} needs ${needed}`,
    );
  }
  if (dataStart + end > fileSize) {
    throw fail(
      `is truncated: tensor "${name}" needs bytes up to ${dataStart + end}, but the file has ${fileSize}`,
    );
  }
  return { name, dtype: v.dtype, shape, offset: dataStart + begin, byteLength: end - begin, file };
}

function checkNoOverlap(entries: TensorEntry[], fail: (m: string) => Error): void {
  const sorted = entries.filter((e) => e.byteLength > 0).sort((a, b) => a.offset - b.offset);
  for (let i = 1; i < sorted.length; i++) {
    const prev = sorted[i - 1];
    if (sorted[i].offset < prev.offset + prev.byteLength) {
      throw fail(`tensors "${prev.name}" and "${sorted[i].name}" overlap`);
    }
  }
}

/** `length` bytes of `fd` from `position` (throws on a short read) */
export function readExactly(fd: number, position: number, length: number): Buffer {
  const buf = Buffer.alloc(length);
  let done = 0;
  while (done < length) {
    const n = fs.readSync(fd, buf, done, length - done, position + done);
    if (n === 0) break;
    done += n;
  }
  if (done !== length) throw new Error(`short read: ${done} of ${length} bytes`);
  return buf;
}
