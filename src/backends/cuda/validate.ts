// Argument checks run before an op is enqueued: a bad call throws here, naming the op and the
// shapes, and nothing reaches the stream.
import type { DType, Tensor } from '../../contracts/backend.ts';
import { CudaTensor } from './cuda-tensor.ts';

export function opError(op: string, message: string): Error {
  return new Error(`cuda backend ${op}: ${message}`);
}

export function describe(t: Tensor): string {
  return `${t.dtype}[${t.shape.join(', ')}]`;
}

export function checkShape(op: string, shape: readonly number[]): void {
  for (const d of shape) {
    if (!Number.isSafeInteger(d) || d < 0) throw opError(op, `invalid shape [${shape.join(', ')}]`);
  }
}

/** `t` as a live CudaTensor of backend `backendId`, of rank `rank` (if given) and one of `dtypes`. */
export function tensorArg(op: string, name: string, t: Tensor | undefined, backendId: number,
  dtypes: readonly DType[], rank?: number): CudaTensor {
  if (!(t instanceof CudaTensor)) throw opError(op, `${name} is not a CUDA backend tensor`);
  if (t.backendId !== backendId) throw opError(op, `${name} belongs to another backend instance`);
  if (!t.alive) throw opError(op, `${name} ${describe(t)} was already freed`);
  if (!dtypes.includes(t.dtype)) {
    throw opError(op, `${name} must be ${dtypes.join(' or ')}, got ${describe(t)}`);
  }
  if (rank !== undefined && t.shape.length !== rank) {
    throw opError(op, `${name} must have rank ${rank}, got ${describe(t)}`);
  }
  return t;
}

export function sameShape(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((d, i) => d === b[i]);
}

/** `context` describes the shapes involved; it is only evaluated on failure (hot path). */
export function expectDim(op: string, what: string, actual: number, expected: number, context: () => string): void {
  if (actual !== expected) throw opError(op, `${what} is ${actual} but must be ${expected} (${context()})`);
}

export function expectFinite(op: string, name: string, v: number): void {
  if (!Number.isFinite(v)) throw opError(op, `${name} must be a finite number, got ${v}`);
}
