// Argument checks run before an op is enqueued: a bad call throws here, naming the backend, the
// op and the shapes, and nothing reaches the device queue/stream. Shared by the native backends;
// each binds it to its own tensor class and name (see cpu/validate.ts, cuda/validate.ts).
import type { DType, Tensor } from '../../contracts/backend.ts';

/** What the checks need from a backend's tensor class. */
export interface CheckedTensor extends Tensor {
  readonly backendId: number;
  readonly alive: boolean;
}

export function describe(t: Tensor): string {
  return `${t.dtype}[${t.shape.join(', ')}]`;
}

export function sameShape(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((d, i) => d === b[i]);
}

export function validators<T extends CheckedTensor>(
  /** "cpu", "cuda": prefixes every message */
  backend: string,
  tensorClass: abstract new (...args: never[]) => T,
) {
  const label = backend.toUpperCase();
  function opError(op: string, message: string): Error {
    return new Error(`${backend} backend ${op}: ${message}`);
  }
  return {
    opError,
    describe,
    sameShape,
    checkShape(op: string, shape: readonly number[]): void {
      for (const d of shape) {
        if (!Number.isSafeInteger(d) || d < 0) throw opError(op, `invalid shape [${shape.join(', ')}]`);
      }
    },
    /** `t` as a live tensor of backend `backendId`, of rank `rank` (if given) and one of `dtypes`. */
    tensorArg(op: string, name: string, t: Tensor | undefined, backendId: number,
      dtypes: readonly DType[], rank?: number): T {
      if (!(t instanceof tensorClass)) throw opError(op, `${name} is not a ${label} backend tensor`);
      if (t.backendId !== backendId) throw opError(op, `${name} belongs to another backend instance`);
      if (!t.alive) throw opError(op, `${name} ${describe(t)} was already freed`);
      if (!dtypes.includes(t.dtype)) throw opError(op, `${name} must be ${dtypes.join(' or ')}, got ${describe(t)}`);
      if (rank !== undefined && t.shape.length !== rank) throw opError(op, `${name} must have rank ${rank}, got ${describe(t)}`);
      return t;
    },
    /** `context` describes the shapes involved; it is only evaluated on failure (hot path). */
    expectDim(op: string, what: string, actual: number, expected: number, context: () => string): void {
      if (actual !== expected) throw opError(op, `${what} is ${actual} but must be ${expected} (${context()})`);
    },
    expectFinite(op: string, name: string, v: number): void {
      if (!Number.isFinite(v)) throw opError(op, `${name} must be a finite number, got ${v}`);
    },
  };
}
