// The CUDA backend's weight loading (Backend.loadWeight, loadWeightRows, loadStacked, loadConcat):
// checks the sources, makes the (unscoped, exactly sized) tensor, streams each byte range into it
// and converts on the device when the stored dtype is not the one asked for. FP8 checkpoint
// matrices load as FP8 (their bytes and scales, CudaFp8Tensor) unless the settings say otherwise. Separate from
// cuda-backend.ts because it is the only asynchronous file I/O the backend does; how the bytes
// travel (file -> pinned chunks -> device) is weight-staging.ts, which this drives.
import { open } from 'node:fs/promises';

import type { DType, Tensor, WeightSource } from '../../contracts/backend.ts';
import { dtypeBytes, numel } from '../../contracts/backend.ts';
import { type CudaOpContext, FLOAT } from './cuda-op-context.ts';
import { fp8ColShift } from './cuda-fp8-weights.ts';
import { CudaFp8Tensor } from './cuda-tensor.ts';
import { checkShape, opError, sameShape, weightRows } from './validate.ts';
import { StagingChunks, uploadFileRange, uploadHostRange } from './weight-staging.ts';

export class CudaWeightLoader {
  private chunks: StagingChunks | null = null;

  constructor(private readonly c: CudaOpContext) {}

  async loadWeight(src: WeightSource, as: 'keep' | 'f32'): Promise<Tensor> {
    const n = src.shape[0] ?? 1;
    if (this.keepsFp8([src], as)) return this.loadFp8('loadWeight', [{ src, rowStart: 0, rows: n }], src.shape);
    return this.loadRows('loadWeight', src, 0, src.shape.length === 0 ? 1 : n, as, src.shape);
  }

  async loadWeightRows(src: WeightSource, rowStart: number, rows: number, as: 'keep' | 'f32'): Promise<Tensor> {
    const shape = weightRows(src, rowStart, rows);
    if (this.keepsFp8([src], as)) return this.loadFp8('loadWeightRows', [{ src, rowStart, rows }], shape);
    return this.loadRows('loadWeightRows', src, rowStart, rows, as, shape);
  }

  /**
   * Whether these sources load as one FP8 matrix (CudaFp8Tensor): kept in their stored dtype, every
   * one an FP8 matrix that offers its bytes (WeightSource.fp8), and CudaGemvSettings.fp8Weights on.
   * Otherwise they load their dequantized values (WeightSource.decode).
   */
  private keepsFp8(srcs: WeightSource[], as: 'keep' | 'f32'): boolean {
    return as === 'keep' && this.c.settings.gemv.fp8Weights && srcs.every((s) => s.fp8 !== undefined && s.shape.length === 2);
  }

  /** Rows of FP8 sources, one after another, as one FP8 matrix of `shape` with its scales. */
  private async loadFp8(op: string, parts: { src: WeightSource; rowStart: number; rows: number }[], shape: readonly number[]): Promise<Tensor> {
    this.c.assertOpen(op);
    this.c.rt.throwIfKernelsFailed();
    for (const p of parts) this.checkSource(op, p.src);
    const [N, K] = shape as [number, number];
    const first = parts[0]!.src.fp8!();
    const colShift = fp8ColShift(first.scaleCols);
    const KB = Math.ceil(K / first.scaleCols);
    const w = this.c.make([N, K], 'fp8', false, true);
    const scales = this.c.make([N, KB], 'f32', false, true);
    try {
      this.chunks ??= new StagingChunks(this.c.rt);
      let row = 0;
      for (const [i, { src, rowStart, rows }] of parts.entries()) {
        const { bits, scales: s, scaleCols } = i === 0 ? first : src.fp8!();
        const n = src.shape[0]!;
        if (scaleCols !== first.scaleCols) {
          throw opError(op, `${src.name}: its FP8 scales cover ${scaleCols} columns, ${parts[0]!.src.name}'s ${first.scaleCols}`);
        }
        if (src.shape[1] !== K || bits.length !== n * K || s.length !== n * KB) {
          throw opError(op, `${src.name}: ${bits.length} FP8 bytes and ${s.length} scales for [${src.shape.join(', ')}] ` +
            `(want ${n * K} and ${n * KB})`);
        }
        const stillOpen = () => this.c.assertOpen(op);
        await uploadHostRange(this.c.rt, this.chunks, bits.subarray(rowStart * K, (rowStart + rows) * K), w.addr + row * K, stillOpen);
        await uploadHostRange(this.c.rt, this.chunks, new Uint8Array(s.buffer, s.byteOffset + rowStart * KB * 4, rows * KB * 4),
          scales.addr + row * KB * 4, stillOpen);
        row += rows;
      }
    } catch (e) {
      this.c.release(w);
      this.c.release(scales);
      throw e;
    }
    return new CudaFp8Tensor(w.shape, w.addr, w.bytes, null, w.backendId, scales, colShift);
  }

  private async loadRows(op: string, src: WeightSource, rowStart: number, rows: number, as: 'keep' | 'f32',
    shape: readonly number[]): Promise<Tensor> {
    this.c.assertOpen(op);
    this.c.rt.throwIfKernelsFailed(); // a background build that failed: stop loading now
    this.checkSource(op, src);
    const rowElems = numel(src.shape.slice(1));
    const dtype: DType = as === 'keep' ? src.dtype : 'f32';
    const t = this.c.make(shape, dtype, false, true);
    try {
      const sz = dtypeBytes[src.dtype];
      await this.loadInto(src, src.offset + rowStart * rowElems * sz, rows * rowElems * sz, t.addr, dtype);
    } catch (e) {
      this.c.release(t);
      throw e;
    }
    return t;
  }

  async loadStacked(srcs: WeightSource[], as: 'keep' | 'f32'): Promise<Tensor> {
    this.c.assertOpen('loadStacked');
    if (srcs.length === 0) throw opError('loadStacked', 'no sources');
    const first = srcs[0]!;
    for (const s of srcs) {
      if (!sameShape(s.shape, first.shape) || (as === 'keep' && s.dtype !== first.dtype)) {
        throw opError('loadStacked', `${s.name} is ${s.dtype}[${s.shape.join(', ')}] but ${first.name} is ` +
          `${first.dtype}[${first.shape.join(', ')}]`);
      }
    }
    return this.loadParts('loadStacked', srcs, as, [srcs.length, ...first.shape]);
  }

  async loadConcat(srcs: WeightSource[], as: 'keep' | 'f32'): Promise<Tensor> {
    this.c.assertOpen('loadConcat');
    if (srcs.length === 0) throw opError('loadConcat', 'no sources');
    const first = srcs[0]!;
    if (first.shape.length === 0) throw opError('loadConcat', `${first.name} is a scalar`);
    for (const s of srcs) {
      if (s.shape.length !== first.shape.length || !sameShape(s.shape.slice(1), first.shape.slice(1)) ||
        (as === 'keep' && s.dtype !== first.dtype)) {
        throw opError('loadConcat', `${s.name} is ${s.dtype}[${s.shape.join(', ')}] but ${first.name} is ` +
          `${first.dtype}[${first.shape.join(', ')}] (only dim 0 may differ)`);
      }
    }
    const shape = [srcs.reduce((a, s) => a + s.shape[0]!, 0), ...first.shape.slice(1)];
    if (this.keepsFp8(srcs, as)) return this.loadFp8('loadConcat', srcs.map((src) => ({ src, rowStart: 0, rows: src.shape[0]! })), shape);
    return this.loadParts('loadConcat', srcs, as, shape);
  }

  /** Loads each source whole, one after another, into one new tensor of `shape`. */
  private async loadParts(op: string, srcs: WeightSource[], as: 'keep' | 'f32', shape: number[]): Promise<Tensor> {
    this.c.rt.throwIfKernelsFailed();
    for (const s of srcs) this.checkSource(op, s);
    const dtype: DType = as === 'keep' ? srcs[0]!.dtype : 'f32';
    const t = this.c.make(shape, dtype, false, true);
    try {
      let at = t.addr;
      await Promise.all(srcs.map((s) => {
        const dst = at;
        at += numel(s.shape) * dtypeBytes[dtype];
        return this.loadInto(s, s.offset, numel(s.shape) * dtypeBytes[s.dtype], dst, dtype);
      }));
    } catch (e) {
      this.c.release(t);
      throw e;
    }
    return t;
  }

  private checkSource(op: string, src: WeightSource): void {
    checkShape(op, src.shape);
    if (!FLOAT.includes(src.dtype)) throw opError(op, `${src.name}: unsupported stored dtype ${src.dtype}`);
    if (!Number.isSafeInteger(src.offset) || src.offset < 0) throw opError(op, `${src.name}: bad offset ${src.offset}`);
  }

  /** Reads `nbytes` of `src` at `fileOffset` to device `dst`, converting to `dtype` on the device. */
  private async loadInto(src: WeightSource, fileOffset: number, nbytes: number, dst: number, dtype: DType): Promise<void> {
    if (dtype === src.dtype) return this.copyFile(src, fileOffset, nbytes, dst);
    const raw = this.c.pool.alloc(nbytes).addr;
    try {
      await this.copyFile(src, fileOffset, nbytes, raw);
      await this.c.rt.moduleReady('k_convert'); // kernels may still be compiling (kernels: 'background')
      this.c.assertOpen('loadWeight');
      this.c.convert(raw, src.dtype, dst, dtype, nbytes / dtypeBytes[src.dtype]);
    } finally {
      this.c.pool.release(raw, nbytes); // stream order: the conversion enqueued above runs first
    }
  }

  /** File bytes -> pinned chunks (positioned reads) -> device, copies overlapping the next read. */
  private async copyFile(src: WeightSource, fileOffset: number, nbytes: number, dst: number): Promise<void> {
    if (nbytes === 0) return;
    this.chunks ??= new StagingChunks(this.c.rt);
    if (src.decode) {
      // values computed on the host (GGUF): the same byte range of the tensor in its dtype
      const start = fileOffset - src.offset;
      const bytes = src.decode(src.dtype).subarray(start, start + nbytes);
      if (bytes.length !== nbytes) throw new Error(`loading weight ${src.name}: decoded too few bytes for ${start}..${start + nbytes}`);
      await uploadHostRange(this.c.rt, this.chunks, bytes, dst, () => this.c.assertOpen('loadWeight'));
      return;
    }
    const fh = await open(src.path, 'r');
    try {
      await uploadFileRange(this.c.rt, this.chunks, fh, fileOffset, nbytes, dst,
        `${src.name} (${src.dtype}[${src.shape.join(', ')}]) from ${src.path}`, () => this.c.assertOpen('loadWeight'));
    } finally {
      await fh.close();
    }
  }

  /** Frees the pinned chunks; after the stream is idle (CudaBackend.close). */
  close(): void {
    this.chunks?.close();
  }
}
