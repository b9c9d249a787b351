// The CPU backend's tensor: a shape and dtype over a native address.
import type { DType, Tensor } from '../../contracts/backend.ts';

/** how a CPU tensor's bytes are laid out: row-major, or one of the matmul weight layouts */
export type CpuLayout = 'rows' | 'p16' | 'q8_0' | 'q4_0' | 'q4_k' | 'q6_k' | 'q5_k' | 'iq4_xs' | 'q4_1' | 'q5_1';

export class CpuTensor implements Tensor {
  /** set once the memory is released (explicitly or by its scope); any later use is an error */
  freed = false;

  constructor(
    readonly shape: readonly number[],
    readonly dtype: DType,
    /** native address of element 0 */
    readonly addr: number,
    /** bytes of the elements (numel * dtype size) */
    readonly bytes: number,
    /** the tensor owning the memory when this is a view (reshape); null when this owns it */
    readonly base: CpuTensor | null,
    /** pool size class of the block (0 = not pooled: freed exactly); meaningless for views */
    readonly blockClass: number,
    /** identity of the backend that made it (tensors must not cross backends) */
    readonly backendId: number,
    /**
     * 'p16': a bf16 matmul weight stored in 16-row panels of k pairs (native/weight_pack.c); only
     * matmul (as w), embedding (as the table), read and free take it; 'q8_0' / 'q4_0' / 'q4_k' / 'q6_k' / 'q5_k' / 'iq4_xs' / 'q4_1' / 'q5_1': a
     * GGUF Q8_0 / Q4_0 / Q4_K / Q6_K / Q5_K / IQ4_XS / Q4_1 / Q5_1 matmul weight kept quantized in 16-row panels (native/quant_pack.c), dtype and
     * shape those of its dequantized values, taken by the same ops
     */
    readonly layout: CpuLayout = 'rows',
  ) {}

  get isView(): boolean {
    return this.base !== null;
  }

  get owner(): CpuTensor {
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
