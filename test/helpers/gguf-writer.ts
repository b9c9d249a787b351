// A small GGUF writer for tests: builds real files byte by byte (magic, version, counts, typed
// metadata, tensor infos, aligned data), with knobs to break each part on purpose.

import fs from 'node:fs';

export type MetaValue =
  | { type: 'u8' | 'i8' | 'u16' | 'i16' | 'u32' | 'i32' | 'f32' | 'f64'; value: number }
  | { type: 'u64' | 'i64'; value: bigint | number }
  | { type: 'bool'; value: boolean }
  | { type: 'string'; value: string }
  | { type: 'array'; elem: 'u8' | 'i8' | 'u16' | 'i16' | 'u32' | 'i32' | 'f32' | 'f64' | 'u64' | 'i64' | 'bool' | 'string' | 'array'; value: unknown[] };

const TYPE_ID: Record<string, number> = { u8: 0, i8: 1, u16: 2, i16: 3, u32: 4, i32: 5, f32: 6, bool: 7, string: 8, array: 9, u64: 10, i64: 11, f64: 12 };

export interface TensorDef {
  name: string;
  /** ggml dims, fastest first */
  dims: number[];
  /** ggml type id (0 F32, 1 F16, 8 Q8_0, ...) */
  type: number;
  /** raw bytes of the tensor */
  data: Uint8Array;
  /** override the offset written in the tensor info (relative to the data section) */
  offset?: number;
}

export interface GgufSpec {
  version?: number;
  magic?: string;
  metadata?: [string, MetaValue][];
  tensors?: TensorDef[];
  alignment?: number;
  /** cut the file to this many bytes */
  truncateTo?: number;
}

class Bytes {
  private parts: Buffer[] = [];
  length = 0;
  push(b: Buffer): void {
    this.parts.push(b);
    this.length += b.length;
  }
  u32(v: number): void {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v >>> 0);
    this.push(b);
  }
  u64(v: bigint | number): void {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(v));
    this.push(b);
  }
  str(s: string): void {
    const b = Buffer.from(s, 'utf8');
    this.u64(b.length);
    this.push(b);
  }
  scalar(type: string, v: unknown): void {
    const b = Buffer.alloc(type === 'u64' || type === 'i64' || type === 'f64' ? 8 : type === 'u32' || type === 'i32' || type === 'f32' ? 4 : type === 'u16' || type === 'i16' ? 2 : 1);
    switch (type) {
      case 'u8': b.writeUInt8(v as number); break;
      case 'i8': b.writeInt8(v as number); break;
      case 'u16': b.writeUInt16LE(v as number); break;
      case 'i16': b.writeInt16LE(v as number); break;
      case 'u32': b.writeUInt32LE(v as number); break;
      case 'i32': b.writeInt32LE(v as number); break;
      case 'f32': b.writeFloatLE(v as number); break;
      case 'f64': b.writeDoubleLE(v as number); break;
      case 'u64': b.writeBigUInt64LE(BigInt(v as number)); break;
      case 'i64': b.writeBigInt64LE(BigInt(v as number)); break;
      case 'bool': b.writeUInt8(v ? 1 : 0); break;
    }
    this.push(b);
  }
  value(m: MetaValue): void {
    if (m.type === 'string') this.str(m.value);
    else if (m.type === 'array') {
      this.u32(TYPE_ID[m.elem]!);
      this.u64(m.value.length);
      for (const x of m.value) {
        if (m.elem === 'string') this.str(x as string);
        else if (m.elem === 'array') {
          const inner = x as MetaValue & { type: 'array' };
          this.u32(TYPE_ID[inner.elem]!);
          this.u64(inner.value.length);
          for (const y of inner.value) this.scalar(inner.elem, y);
        } else this.scalar(m.elem, x);
      }
    } else this.scalar(m.type, m.value);
  }
  concat(): Buffer {
    return Buffer.concat(this.parts);
  }
}

/** Encodes a GGUF file. Tensors are laid out in order, each at the next aligned offset. */
export function encodeGguf(spec: GgufSpec): Buffer {
  const align = spec.alignment ?? 32;
  const meta = [...(spec.metadata ?? [])];
  if (spec.alignment !== undefined) meta.push(['general.alignment', { type: 'u32', value: align }]);
  const tensors = spec.tensors ?? [];
  const w = new Bytes();
  w.push(Buffer.from(spec.magic ?? 'GGUF', 'latin1'));
  w.u32(spec.version ?? 3);
  w.u64(tensors.length);
  w.u64(meta.length);
  for (const [k, v] of meta) {
    w.str(k);
    w.u32(TYPE_ID[v.type]!);
    w.value(v);
  }
  let off = 0;
  const offsets: number[] = [];
  for (const t of tensors) {
    offsets.push(t.offset ?? off);
    off = Math.ceil((off + t.data.length) / align) * align;
    w.str(t.name);
    w.u32(t.dims.length);
    for (const d of t.dims) w.u64(d);
    w.u32(t.type);
    w.u64(t.offset ?? offsets[offsets.length - 1]!);
  }
  const headerEnd = w.length;
  const dataStart = Math.ceil(headerEnd / align) * align;
  w.push(Buffer.alloc(dataStart - headerEnd));
  const data = Buffer.alloc(off);
  tensors.forEach((t, i) => {
    if (t.offset === undefined) Buffer.from(t.data.buffer, t.data.byteOffset, t.data.length).copy(data, offsets[i]!);
  });
  w.push(data);
  const out = w.concat();
  return spec.truncateTo !== undefined ? out.subarray(0, spec.truncateTo) : out;
}

export function writeGguf(file: string, spec: GgufSpec): string {
  fs.writeFileSync(file, encodeGguf(spec));
  return file;
}

export function f32Bytes(values: number[]): Uint8Array {
  return new Uint8Array(new Float32Array(values).buffer);
}
