// Argument checks run before an op is enqueued: a bad call throws here, naming the backend, the
// op and the shapes, and nothing reaches the device queue/stream. Shared by the native backends;
// each binds it to its own tensor class, name and dtype sets (see cpu/validate.ts,
// cuda/validate.ts). The ops' rules themselves are op-shapes.ts's, which these checks plug into.
import type { DType, Tensor, WeightSource } from '../../contracts/backend.ts';
import {
  checkDtypeRank, checkShape, describe, expectDim, expectFinite, type OpChecks, type OpDtypes, type OpErrors, sameShape,
} from './op-shapes.ts';

/** What the checks need from a backend's tensor class. */
export interface CheckedTensor extends Tensor {
  readonly backendId: number;
  readonly alive: boolean;
}

export { describe, sameShape };

export function validators<T extends CheckedTensor>(
  /** "cpu", "cuda": prefixes every message */
  backend: string,
  tensorClass: abstract new (...args: never[]) => T,
  dtypes: OpDtypes,
) {
  const label = backend.toUpperCase();
  function opError(op: string, message: string): Error {
    return new Error(`${backend} backend ${op}: ${message}`);
  }
  const errors: OpErrors = { error: opError };
  /** `t` as a live tensor of backend `backendId`, of rank `rank` (if given) and one of `dtypes`. */
  function tensorArg(op: string, name: string, t: Tensor | undefined, backendId: number,
    dtypes: readonly DType[], rank?: number): T {
    if (!(t instanceof tensorClass)) throw opError(op, `${name} is not a ${label} backend tensor`);
    if (t.backendId !== backendId) throw opError(op, `${name} belongs to another backend instance`);
    if (!t.alive) throw opError(op, `${name} ${describe(t)} was already freed`);
    checkDtypeRank(errors, op, name, t, dtypes, rank);
    return t;
  }
  return {
    opError,
    describe,
    sameShape,
    tensorArg,
    /**
     * What the op rules (op-shapes.ts) check the tensors of backend `backendId` with; `open`
     * throws while that backend can take no op (closed).
     */
    opChecks(backendId: number, open: (op: string) => void): OpChecks<T> {
      return {
        dtypes,
        error: opError,
        open,
        arg: (op, name, t, dts, rank) => tensorArg(op, name, t, backendId, dts, rank),
      };
    },
    checkShape(op: string, shape: readonly number[]): void {
      checkShape(errors, op, shape);
    },
    /** `context` describes the shapes involved; it is only evaluated on failure (hot path). */
    expectDim(op: string, what: string, actual: number, expected: number, context: () => string): void {
      expectDim(errors, op, what, actual, expected, context);
    },
    expectFinite(op: string, name: string, v: number): void {
      expectFinite(errors, op, name, v);
    },
    /** loadWeightRows' range: rows [rowStart, rowStart + rows) of a weight with rows; its shape */
    weightRows(src: WeightSource, rowStart: number, rows: number): number[] {
      if (src.shape.length === 0) throw opError('loadWeightRows', `${src.name} is a scalar`);
      const total = src.shape[0]!;
      if (!Number.isSafeInteger(rowStart) || !Number.isSafeInteger(rows) || rowStart < 0 || rows < 0 ||
        rowStart + rows > total) {
        throw opError('loadWeightRows', `rows [${rowStart}, ${rowStart + rows}) outside [0, ${total}) of ${src.name}`);
      }
      return [rows, ...src.shape.slice(1)];
    },
  };
}
