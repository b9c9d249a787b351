// The CUDA backend's tensor: a shape and dtype over a device address.
import type { DType, Tensor } from '../../contracts/backend.ts';

/**
 * dtype codes shared with the kernels (DT_* in kernels.ts); the row-scaled KV dtypes have none
 * (-1): the CUDA backend keeps no such pools, and resolveKvDtype refuses them before any op
 */
export const DT_CODE: Record<DType, number> = { f32: 0, f16: 1, bf16: 2, i32: 3, int8: -1, fp8: -1 };
export const ACT_CODE = { silu: 0, gelu_tanh: 1, gelu: 2 } as const;

export class CudaTensor implements Tensor {
  /** set once the memory is released (explicitly or by its scope); any later use is an error */
  freed = false;

  constructor(
    readonly shape: readonly number[],
    readonly dtype: DType,
    /** device address of element 0 */
    readonly addr: number,
    /** bytes of the elements (numel * dtype size) */
    readonly bytes: number,
    /** the tensor owning the memory when this is a view (reshape); null when this owns it */
    readonly base: CudaTensor | null,
    /** identity of the backend that made it (tensors must not cross backends) */
    readonly backendId: number,
  ) {}

  get isView(): boolean {
    return this.base !== null;
  }

  get owner(): CudaTensor {
    return this.base ?? this;
  }

  /** a view is usable while the memory it looks at is */
  get alive(): boolean {
    return !this.owner.freed;
  }

  toString(): string {
    return `${this.dtype}[${this.shape.join(', ')}]`;
  }
}

/**
 * An FP8 (e4m3) matrix [N, K]: a byte an element (dtype 'fp8'), rows of K, and `scales`, f32
 * [N, ceil(K / 2^colShift)], each row's scale for each 2^colShift of its columns (fp8-kernels.ts).
 * A row view (rowView) views both; freeing the owner frees both.
 */
export class CudaFp8Tensor extends CudaTensor {
  constructor(shape: readonly number[], addr: number, bytes: number, base: CudaFp8Tensor | null, backendId: number,
    /** f32 [N, ceil(K / 2^colShift)]: a view of the owner's scales in a row view */
    readonly scales: CudaTensor,
    /** log2 of the columns a scale covers (4 or more) */
    readonly colShift: number) {
    super(shape, 'fp8', addr, bytes, base, backendId);
  }
}
