// The seam between CudaBackend (cuda-backend.ts) and the modules split out of it (weight loading,
// read-back and KV block copies, the fused decode ops): what they need of the backend as one
// object, so none of them reaches into its private state, plus the dtype sets and launch geometry
// that every CUDA op shares. Separate so those modules depend on this small file, not on the class.
import type { DType, Tensor } from '../../contracts/backend.ts';
import type { OpChecks } from '../common/op-shapes.ts';
import type { CudaSettings } from './cuda-settings.ts';
import type { CudaTensor } from './cuda-tensor.ts';
import type { DevicePool } from './device-pool.ts';
import type { KernelName } from './kernels.ts';
import type { CudaRuntime } from './runtime.ts';

export const I32: readonly DType[] = ['i32'];
/** float tensors an op accepts as activations */
export const ACTS: readonly DType[] = ['bf16', 'f32'];
export const FLOAT: readonly DType[] = ['f32', 'f16', 'bf16'];
/**
 * matmul weights: any float dtype, or 'fp8' (an FP8 matrix with its scales, CudaFp8Tensor), which
 * the fused decode ops take through their unfused path (cuda-fp8-weights.ts)
 */
export const WEIGHTS: readonly DType[] = [...FLOAT, 'fp8'];
export const ANY: readonly DType[] = ['f32', 'f16', 'bf16', 'i32'];

export const ELEMWISE_THREADS = 256;
export const MAX_GRID_X = 1 << 20; // grid-stride loops cover the rest
export const MAX_GRID_Y = 65535;

export function elementwiseGrid(n: number): [number, number, number] {
  return [Math.min(Math.ceil(n / ELEMWISE_THREADS), MAX_GRID_X), 1, 1];
}

/** What CudaBackend hands its op modules (each a thin delegate to the backend's own helper). */
export interface CudaOpContext {
  readonly rt: CudaRuntime;
  readonly pool: DevicePool;
  /** what the backend was created with (cuda-settings.ts): which kernels and fusions each op takes */
  readonly settings: CudaSettings;
  /** device int[4]: first kernel error (code, a, b, c); 0 = none */
  readonly errWord: number;
  /** whether the backend was closed */
  isClosed(): boolean;
  assertOpen(op: string): void;
  assertNotCapturing(op: string): void;
  /** `t` as a live tensor of this backend, of rank `rank` (if given) and one of `dtypes` */
  arg(op: string, name: string, t: Tensor | undefined, dtypes: readonly DType[], rank?: number): CudaTensor;
  /** the backend's tensors as the op rules check them (common/op-shapes.ts) */
  readonly checks: OpChecks<CudaTensor>;
  /** A new owning tensor; `scoped`: adopt into the innermost scope. */
  make(shape: readonly number[], dtype: DType, scoped: boolean, exact?: boolean): CudaTensor;
  /** a new bf16 (or `dtype`) tensor of the innermost scope */
  out(shape: readonly number[], dtype?: DType): CudaTensor;
  /** gives an owning tensor's memory back to the pool (stream-ordered) */
  release(t: CudaTensor): void;
  /** Enqueues dst = src converted between float dtypes (n elements). */
  convert(src: number, sdt: DType, dst: number, ddt: DType, n: number): void;
  kernelResources(name: KernelName): { registers: number; localBytes: number; sharedBytes: number };
  matmul(x: Tensor, w: Tensor, bias?: Tensor): Tensor;
  free(t: Tensor): void;
}
