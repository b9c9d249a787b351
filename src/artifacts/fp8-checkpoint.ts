// FP8 (e4m3) checkpoints: the weights of `quantization_config` with quant_method "fp8"
// (transformers' FineGrainedFP8: `<name>.weight` F8_E4M3 beside `<name>.weight_scale_inv`, f32
// scales of `weight_block_size` blocks) or "compressed-tensors" with 8-bit float weights (its
// float-quantized format: `<name>.weight` F8_E4M3 beside `<name>.weight_scale`, one scale for the
// tensor, one per output row, or one per block of `block_structure`). Each such matrix offers its
// e4m3 bytes and scales (WeightSource.fp8) to a backend that multiplies FP8 (CUDA), and loads
// dequantized everywhere else, as transformers dequantizes one on a machine without an FP8 GPU:
// value = f32(e4m3) * f32(scale), one f32 multiply, then rounded (nearest even) into the dtype the
// load asks for (bf16 by default, or f32: then the values are exactly transformers' in fp32). A static activation scale (`input_scale`) is not applied: activations
// stay in the backend's float dtype, as in transformers' dequantized model.

import { closeSync, openSync } from 'node:fs';

import { encodeHalf } from '../backends/common/half.ts';
import type { Fp8Matrix, WeightSource } from '../contracts/backend.ts';
import { ArtifactError } from './errors.ts';
import { readExactly, type TensorEntry } from './safetensors-header.ts';
import { WeightIndex } from './safetensors.ts';
import { readSourceValues } from './source-values.ts';

/** How a checkpoint's FP8 matrices are scaled, from its quantization_config. */
export interface Fp8Scheme {
  /** "fp8" (FineGrainedFP8) or "compressed-tensors" */
  method: 'fp8' | 'compressed-tensors';
  /** the name suffix of a weight's scale tensor: `${weight}_scale_inv` or `${weight}_scale` */
  scaleSuffix: '_scale_inv' | '_scale';
  /** rows x columns of a scale block when the config states one ([128, 128] in most checkpoints) */
  block?: readonly [number, number];
}

/** quant_method values this module reads (others fail with one line naming what is supported) */
const SUPPORTED = 'quant_method "fp8" (e4m3), or "compressed-tensors" with 8-bit float weights';

/**
 * The checkpoint's FP8 scheme, or undefined when config.json states no quantization_config.
 * Any other quantization (AWQ, GPTQ, bitsandbytes, int weights of compressed-tensors, e5m2)
 * fails here with one line, before a tensor is read.
 */
export function fp8SchemeOf(rawConfig: Record<string, unknown>, file: string): Fp8Scheme | undefined {
  const q = rawConfig.quantization_config;
  if (q === undefined || q === null) return undefined;
  const fail = (why: string) => new ArtifactError(`${file}: quantization_config: ${why}; supported: ${SUPPORTED}`, file);
  if (typeof q !== 'object' || Array.isArray(q)) throw fail('is not an object');
  const c = q as Record<string, unknown>;
  const method = c.quant_method;
  if (method === 'fp8') {
    if (c.fmt !== undefined && c.fmt !== 'e4m3') throw fail(`fmt ${JSON.stringify(c.fmt)} is not loadable (e4m3 is)`);
    return { method, scaleSuffix: '_scale_inv', block: blockOf(c.weight_block_size, 'weight_block_size', fail) };
  }
  if (method === 'compressed-tensors') {
    const groups = c.config_groups;
    if (!groups || typeof groups !== 'object' || Object.keys(groups).length === 0) throw fail('config_groups is missing or empty');
    let block: readonly [number, number] | undefined;
    for (const [name, g] of Object.entries(groups as Record<string, unknown>)) {
      const w = (g as Record<string, unknown> | null)?.weights as Record<string, unknown> | undefined;
      if (!w || w.type !== 'float' || w.num_bits !== 8) {
        throw fail(`config_groups.${name}.weights is ${JSON.stringify(w ?? null)}, not 8-bit float weights`);
      }
      if (w.symmetric === false) throw fail(`config_groups.${name}.weights is asymmetric (a zero point): fp8 weights are symmetric`);
      if (!['tensor', 'channel', 'block'].includes(String(w.strategy))) {
        throw fail(`config_groups.${name}.weights.strategy ${JSON.stringify(w.strategy)} is not tensor, channel or block`);
      }
      if (w.strategy === 'block') block = blockOf(w.block_structure, `config_groups.${name}.weights.block_structure`, fail);
    }
    const format = c.format;
    if (format !== undefined && format !== 'float-quantized' && format !== 'naive-quantized') {
      throw fail(`format ${JSON.stringify(format)} is not loadable (float-quantized is)`);
    }
    return { method, scaleSuffix: '_scale', block };
  }
  throw fail(`quant_method ${JSON.stringify(method)} is not loadable`);
}

function blockOf(v: unknown, what: string, fail: (why: string) => Error): readonly [number, number] | undefined {
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v) || v.length !== 2 || !v.every((x) => Number.isInteger(x) && x > 0)) {
    throw fail(`${what} ${JSON.stringify(v)} is not two positive integers`);
  }
  return [v[0], v[1]];
}

/** e4m3 (the "fn" variant: no infinities, 0x7f / 0xff NaN, largest 448) bits -> value */
export const E4M3_VALUES: Float32Array = (() => {
  const t = new Float32Array(256);
  for (let b = 0; b < 256; b++) {
    const sign = b & 0x80 ? -1 : 1, e = (b >> 3) & 0xf, m = b & 7;
    if (e === 15 && m === 7) t[b] = NaN;
    else t[b] = sign * (e === 0 ? (m / 8) * 2 ** -6 : (1 + m / 8) * 2 ** (e - 7));
  }
  return t;
})();

/** Scale of element (r, c): the grid a scale tensor of `scaleShape` lays over an [N, K] matrix. */
export interface ScaleGrid { rowsPerScale: number; colsPerScale: number; cols: number }

function scaleGrid(w: TensorEntry, s: TensorEntry, block: Fp8Scheme['block']): ScaleGrid {
  const [N, K] = w.shape as [number, number];
  const n = s.shape.reduce((a, b) => a * b, 1);
  const fail = (why: string) => new ArtifactError(
    `tensor "${s.name}" in ${s.file} has shape [${s.shape.join(', ')}]: ${why} for "${w.name}" [${N}, ${K}]`, s.file);
  if (n === 1) return { rowsPerScale: N, colsPerScale: K, cols: 1 }; // per tensor
  if ((s.shape.length === 1 && s.shape[0] === N) || (s.shape.length === 2 && s.shape[0] === N && s.shape[1] === 1)) {
    return { rowsPerScale: 1, colsPerScale: K, cols: 1 }; // per output row
  }
  if (s.shape.length !== 2) throw fail('not one scale, one a row, or a 2-D grid of blocks');
  const [R, C] = s.shape as [number, number];
  // blocks of the config's size (the last row / column of blocks may be partial), else blocks that
  // divide the matrix exactly, as transformers derives them from the grid
  const [bm, bn] = block ?? [N / R, K / C];
  if (!Number.isInteger(bm) || !Number.isInteger(bn) || Math.ceil(N / bm) !== R || Math.ceil(K / bn) !== C) {
    throw fail(block ? `not the grid of ${block[0]} x ${block[1]} blocks` : 'blocks that do not divide the matrix');
  }
  return { rowsPerScale: bm, colsPerScale: bn, cols: C };
}

/** A scale tensor's values as f32 (through the index, which reads F32, BF16 and F16). */
function readScales(index: WeightIndex, s: TensorEntry): Float32Array {
  if (s.dtype !== 'F32' && s.dtype !== 'BF16' && s.dtype !== 'F16') {
    throw new ArtifactError(`tensor "${s.name}" in ${s.file} has dtype ${s.dtype}; FP8 scales load from F32, BF16 or F16`, s.file);
  }
  return readSourceValues(index.get(s.name));
}

/** An [N, K] e4m3 matrix's values, each times its block's scale in f32. */
export function dequantizeFp8(bits: Uint8Array, scales: Float32Array, grid: ScaleGrid, N: number, K: number): Float32Array {
  const out = new Float32Array(N * K);
  for (let r = 0; r < N; r++) {
    const srow = Math.floor(r / grid.rowsPerScale) * grid.cols;
    for (let c = 0; c < K; c++) {
      out[r * K + c] = E4M3_VALUES[bits[r * K + c]!]! * scales[srow + Math.floor(c / grid.colsPerScale)]!; // stored: one f32 rounding
    }
  }
  return out;
}

/**
 * Whether a matrix of this grid keeps its FP8 form for a backend that multiplies it
 * (WeightSource.fp8): K a multiple of 16 (the kernels' chunks) and one scale a row, or blocks of a
 * power-of-two width of 16 or more (a chunk of 16 columns then never straddles two scales).
 */
export function keepsFp8(grid: ScaleGrid, K: number): boolean {
  const w = grid.colsPerScale;
  return K % 16 === 0 && (grid.cols === 1 || (w >= 16 && (w & (w - 1)) === 0));
}

/** rowBlockScales' scaleCols for a keepsFp8 grid over K columns */
export function rowBlockScaleCols(grid: ScaleGrid, K: number): number {
  return grid.cols === 1 ? 2 ** Math.max(4, Math.ceil(Math.log2(Math.max(K, 1)))) : grid.colsPerScale;
}

/**
 * The grid's scales as one a row per scaleCols columns (keepsFp8 grids): the block width, or for
 * one scale a row the smallest power of two (>= 16) that covers K, a single column.
 */
export function rowBlockScales(scales: Float32Array, grid: ScaleGrid, N: number, K: number): Pick<Fp8Matrix, 'scales' | 'scaleCols'> {
  const scaleCols = rowBlockScaleCols(grid, K);
  const KB = Math.ceil(K / scaleCols);
  const out = new Float32Array(N * KB);
  for (let r = 0; r < N; r++) {
    const srow = Math.floor(r / grid.rowsPerScale) * grid.cols;
    for (let b = 0; b < KB; b++) out[r * KB + b] = scales[srow + Math.floor((b * scaleCols) / grid.colsPerScale)]!;
  }
  return { scales: out, scaleCols };
}

/**
 * A checkpoint's weights with its FP8 matrices dequantized as they load: each F8_E4M3 weight is a
 * source of `dtype` values (WeightSource.decode); its scale tensor (and a static `input_scale`)
 * leave the index, being part of it. Every other tensor loads as it is.
 */
export class Fp8WeightIndex extends WeightIndex {
  constructor(private readonly base: WeightIndex, readonly scheme: Fp8Scheme, readonly dtype: 'bf16' | 'f32') {
    const entries = new Map(base.names().map((n) => [n, base.entry(n)]));
    for (const [name, e] of entries) {
      if (e.dtype === 'F8_E5M2') {
        throw new ArtifactError(`tensor "${name}" in ${e.file} is F8_E5M2; FP8 weights load from e4m3 (F8_E4M3)`, e.file);
      }
      if (e.dtype !== 'F8_E4M3') continue;
      const scale = entries.get(name + scheme.scaleSuffix);
      if (!scale) {
        throw new ArtifactError(`tensor "${name}" in ${e.file} is F8_E4M3 without its scale "${name}${scheme.scaleSuffix}" ` +
          `(quant_method ${scheme.method})`, e.file);
      }
      if (e.shape.length !== 2) throw new ArtifactError(`tensor "${name}" in ${e.file} is F8_E4M3 of ${e.shape.length} dimensions; FP8 weights are matrices`, e.file);
      scaleGrid(e, scale, scheme.block); // a scale of the wrong shape fails at open, naming both tensors
      entries.delete(name + scheme.scaleSuffix);
      if (name.endsWith('weight')) for (const a of ['input_scale', 'activation_scale']) entries.delete(name.replace(/weight$/, a));
    }
    super(base.source, base.files, entries);
  }

  override get(name: string): WeightSource {
    const e = this.entry(name);
    if (e.dtype !== 'F8_E4M3') return this.base.get(name);
    const s = this.base.entry(name + this.scheme.scaleSuffix);
    const grid = scaleGrid(e, s, this.scheme.block);
    const [N, K] = e.shape as [number, number];
    const read = <T>(what: (fd: number) => T): T => {
      const fd = openSync(e.file, 'r');
      try {
        return what(fd);
      } catch (err) {
        throw err instanceof ArtifactError ? err : new ArtifactError(`${e.file}: tensor ${name}: ${(err as Error).message}`, e.file);
      } finally {
        closeSync(fd);
      }
    };
    const bits = (fd: number) => readExactly(fd, e.offset, e.byteLength);
    return {
      path: e.file, offset: e.offset, dtype: this.dtype, shape: [N, K], name,
      decode: (want) => {
        const f = read((fd) => dequantizeFp8(bits(fd), readScales(this.base, s), grid, N, K));
        return want === 'f32' ? new Uint8Array(f.buffer) : new Uint8Array(encodeHalf(f, want).buffer);
      },
      fp8: keepsFp8(grid, K)
        ? () => read((fd) => ({ bits: bits(fd), ...rowBlockScales(readScales(this.base, s), grid, N, K) }))
        : undefined,
      fp8ScaleCols: keepsFp8(grid, K) ? rowBlockScaleCols(grid, K) : undefined,
    };
  }
}
