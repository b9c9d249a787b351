// A GGUF model's tensors under their Hugging Face names, as a WeightIndex: what models/weights.ts
// and the fit planner read. F32 / F16 / BF16 tensors stored as llmts keeps them are plain file
// ranges, read by the backends exactly as safetensors payloads are; the rest carry a `decode`
// that the backend calls when it loads the tensor: quantized blocks are dequantized (dequant.ts)
// into `quantizedDtype`, and llama.cpp's q/k row permutation is undone. Q8_0, Q4_0, Q4_1, Q5_1, Q4_K, Q5_K, Q6_K and IQ4_XS matrices also
// carry their raw blocks (`quantized`, rows permuted back the same way), which the CPU backend keeps
// as they are for its integer matmuls (native/quant_pack.c); Q5_0, IQ4_NL and Q3_K matrices carry
// theirs rewritten, value for value, into Q8_0 or Q6_K blocks (transcode.ts).

import type { QuantizedType, WeightSource } from '../../contracts/backend.ts';
import { ArtifactError } from '../errors.ts';
import { WeightIndex } from '../safetensors.ts';
import type { TensorEntry } from '../safetensors-header.ts';
import type { TensorRef } from './arch.ts';
import { dequantize, dequantizeToBf16 } from './dequant.ts';
import { isPlainFloat, LOADABLE_TYPE_NAMES } from './ggml-types.ts';
import { readTensorBytes } from './reader.ts';
import { TRANSCODED, transcodeBlocks } from './transcode.ts';

export type FloatDtype = 'f32' | 'f16' | 'bf16';

const PLAIN: Record<string, FloatDtype> = { F32: 'f32', F16: 'f16', BF16: 'bf16' };
const BYTES: Record<FloatDtype, number> = { f32: 4, f16: 2, bf16: 2 };

export class GgufWeightIndex extends WeightIndex {
  constructor(
    source: string,
    files: readonly string[],
    private readonly refs: Map<string, TensorRef>,
    /** what quantized tensors dequantize into */
    readonly quantizedDtype: 'bf16' | 'f32',
  ) {
    super(source, files, new Map([...refs].map(([name, ref]) => [name, entryOf(name, ref)])));
  }

  /** The GGUF tensor (and slice / permutation) behind a Hugging Face name. */
  ref(name: string): TensorRef {
    this.entry(name); // throws naming the tensor when absent
    return this.refs.get(name)!;
  }

  override get(name: string): WeightSource {
    const e = this.entry(name);
    const ref = this.refs.get(name)!;
    const t = ref.info;
    if (!t.type.dequantizable) {
      throw new ArtifactError(
        `tensor "${t.name}" (for ${name}) in ${t.file} has ggml type ${t.type.name}; supported: ${LOADABLE_TYPE_NAMES.join(', ')}`,
        t.file,
      );
    }
    const plain = isPlainFloat(t.type);
    const dtype: FloatDtype = plain ? PLAIN[t.type.name]! : this.quantizedDtype;
    const src: WeightSource = { path: t.file, offset: e.offset, dtype, shape: [...e.shape], name };
    if (plain && ref.unpermuteHeads === undefined) return src; // the file's bytes as they are
    const decoded: WeightSource = { ...src, decode: (want) => decodeRef(ref, e, dtype, want) };
    if (e.shape.length !== 2) return decoded;
    if (KEPT_QUANTIZED.has(t.type.name)) {
      return { ...decoded, quantized: { type: t.type.name as QuantizedType, blocks: () => rawBlocks(ref, e) } };
    }
    const to = TRANSCODED[t.type.name];
    if (!to) return decoded;
    return { ...decoded, quantized: { type: to, blocks: () => transcodeBlocks(t.type.name, rawBlocks(ref, e)) } };
  }
}

/** ggml types a backend may keep quantized (WeightSource.quantized) */
const KEPT_QUANTIZED: ReadonlySet<string> = new Set<QuantizedType>(['Q8_0', 'Q4_0', 'Q4_K', 'Q6_K', 'Q5_K', 'IQ4_XS', 'Q4_1', 'Q5_1']);

/** The tensor's ggml blocks, rows in Hugging Face order (llama.cpp's q/k permutation undone). */
function rawBlocks(ref: TensorRef, e: TensorEntry): Uint8Array {
  const raw = readTensorBytes(ref.info, e.offset - ref.info.offset, e.byteLength);
  if (ref.unpermuteHeads === undefined) return raw;
  const rows = e.shape[0]!;
  return unpermuteRows(raw, rows, e.byteLength / rows, ref.unpermuteHeads, e.name);
}

function entryOf(name: string, ref: TensorRef): TensorEntry {
  const t = ref.info;
  if (!ref.slice) return { name, dtype: t.type.name, shape: [...t.shape], offset: t.offset, byteLength: t.byteLength, file: t.file };
  const part = t.byteLength / ref.slice.count;
  return { name, dtype: t.type.name, shape: t.shape.slice(1), offset: t.offset + ref.slice.index * part, byteLength: part, file: t.file };
}

/** The tensor's values in `want` (the stored plain dtype, or any float dtype after dequantizing). */
function decodeRef(ref: TensorRef, e: TensorEntry, stored: FloatDtype, want: FloatDtype): Uint8Array {
  const t = ref.info;
  const raw = readTensorBytes(t, e.offset - t.offset, e.byteLength);
  const rows = e.shape[0] ?? 1;
  const rowElems = e.shape.length > 1 ? e.shape.slice(1).reduce((a, b) => a * b, 1) : 1;
  // same dtype as stored (a plain float tensor): permute the bytes, no conversion
  if (isPlainFloat(t.type) && want === stored) {
    return ref.unpermuteHeads === undefined ? raw : unpermuteRows(raw, rows, rowElems * BYTES[want], ref.unpermuteHeads, e.name);
  }
  if (want === 'bf16') {
    const h = new Uint16Array(rows * rowElems);
    dequantizeToBf16(t.type, raw, h);
    const b = new Uint8Array(h.buffer);
    return ref.unpermuteHeads === undefined ? b : unpermuteRows(b, rows, rowElems * 2, ref.unpermuteHeads, e.name);
  }
  let values: Float32Array = new Float32Array(rows * rowElems);
  dequantize(t.type, raw, values);
  if (ref.unpermuteHeads !== undefined) {
    const b = unpermuteRows(new Uint8Array(values.buffer), rows, rowElems * 4, ref.unpermuteHeads, e.name);
    values = new Float32Array(b.buffer, b.byteOffset, rows * rowElems);
  }
  if (want === 'f32') return new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
  throw new Error(`${e.name}: cannot decode ${t.type.name} into ${want}`);
}

/**
 * Undoes llama.cpp's convert_hf_to_gguf permute(): within each head of `rows / heads` rows, the
 * file holds Hugging Face row (j * half + i) at row (2i + j), for i < half, j in {0, 1}.
 */
export function unpermuteRows(src: Uint8Array, rows: number, rowBytes: number, heads: number, name: string): Uint8Array {
  if (rows % heads !== 0 || (rows / heads) % 2 !== 0) {
    throw new ArtifactError(`tensor ${name}: ${rows} rows do not split into ${heads} heads of an even size (llama.cpp's q/k permutation)`);
  }
  const hd = rows / heads, half = hd / 2;
  const out = new Uint8Array(src.length);
  for (let h = 0; h < heads; h++) {
    for (let i = 0; i < half; i++) {
      for (let j = 0; j < 2; j++) {
        const from = (h * hd + 2 * i + j) * rowBytes;
        out.set(src.subarray(from, from + rowBytes), (h * hd + j * half + i) * rowBytes);
      }
    }
  }
  return out;
}
