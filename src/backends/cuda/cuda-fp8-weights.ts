// The CUDA backend's FP8 (e4m3) matmul weights (CudaFp8Tensor: the bytes, and an f32 scale per row
// per power-of-two run of columns): which product a matmul with one runs, and the row views of one. At decode rows
// (at most CudaGemvSettings.fp8GemvMaxRows, bf16 x) an FP8 GEMV (fp8-kernels.ts: the tensor-core
// one, or the CUDA-core one as CudaGemvSettings.fp8Gemv says) reads the FP8 bytes once, half the bf16 bytes; more rows dequantize the matrix into a bf16 scratch
// (k_fp8_dequant: the loader's bf16 values) for the backend's bf16 matmul, as do batch-invariant
// mode's (one cuBLASLt algorithm per weight shape, no GEMVs). Separate from cuda-backend.ts
// because it is the one weight layout that is not a plain dtype.
import { type CudaOpContext, ELEMWISE_THREADS, elementwiseGrid } from './cuda-op-context.ts';
import { CudaFp8Tensor, CudaTensor, DT_CODE } from './cuda-tensor.ts';
import { gemvFp8Choice } from './fp8-kernels.ts';

/** y [M, N] = a [M, K] · w^T (+ bias) with bf16 weights w: the backend's plain matmul, into y */
export type Bf16MatmulInto = (a: CudaTensor, w: CudaTensor, bias: CudaTensor | null, y: CudaTensor, M: number, N: number, K: number) => void;

/** log2 of a power of two of 16 or more (the columns one scale covers); throws otherwise */
export function fp8ColShift(scaleCols: number): number {
  const shift = Math.log2(scaleCols);
  if (!Number.isInteger(shift) || shift < 4 || shift > 30) throw new Error(`FP8 scales must cover a power of two (>= 16) of columns, got ${scaleCols}`);
  return shift;
}

/** Enqueues y = a · (w ⊙ scales)^T (+ bias) for an FP8 matrix w (bf16 y [M, N]). */
export function fp8Matmul(c: CudaOpContext, a: CudaTensor, w: CudaFp8Tensor, bias: CudaTensor | null, y: CudaTensor,
  M: number, N: number, K: number, bf16Into: Bf16MatmulInto): void {
  const KB = w.scales.shape[1]!;
  const gemv = a.dtype === 'bf16' && !c.settings.batchInvariant && M <= c.settings.gemv.fp8GemvMaxRows && a.addr % 16 === 0 &&
    w.addr % 16 === 0 ? gemvFp8Choice(M, N, K, w.colShift, c.settings.gemv.fp8Gemv, c.settings.gemv.fp8TcWarps) : undefined;
  if (gemv) {
    c.rt.launch(gemv.kernel, [gemv.grid, 1, 1], gemv.threads, 0, [
      ['p', w.addr], ['p', w.scales.addr], ['i', KB], ['i', w.colShift], ['p', a.addr], ['p', bias ? bias.addr : 0], ['i', bias ? DT_CODE[bias.dtype] : -1],
      ['p', y.addr], ['i', DT_CODE[y.dtype]], ['i', M], ['i', N], ['i', K], ['i', gemv.warpsPerRow]]);
    return;
  }
  const bytes = N * K * 2;
  const scratch = c.pool.alloc(bytes).addr;
  try {
    c.rt.launch('k_fp8_dequant', elementwiseGrid((N * K) / 4), ELEMWISE_THREADS, 0, [
      ['p', w.addr], ['p', w.scales.addr], ['i', KB], ['i', w.colShift], ['p', scratch], ['p', N], ['i', K]]);
    bf16Into(a, new CudaTensor(Object.freeze([N, K]), 'bf16', scratch, bytes, null, w.backendId), bias, y, M, N, K);
  } finally {
    c.pool.release(scratch, bytes); // stream-ordered: the product enqueued above reads it first
  }
}

/** Rows [start, start + rows) of an FP8 matrix: a view of its bytes and of its scales. */
export function fp8RowView(w: CudaFp8Tensor, start: number, rows: number): CudaFp8Tensor {
  const [, K] = w.shape as [number, number];
  const s = w.scales;
  const KB = s.shape[1]!;
  const scales = new CudaTensor(Object.freeze([rows, KB]), 'f32', s.addr + start * KB * 4, rows * KB * 4, s.owner, s.backendId);
  return new CudaFp8Tensor(Object.freeze([rows, K]), w.addr + start * K, rows * K, w.owner as CudaFp8Tensor, w.backendId, scales,
    w.colShift);
}
