// Argument checks run before an op is enqueued: a bad call throws here, naming the backend, the
// op and the shapes, and nothing reaches the device queue/stream. Shared by the native backends;
// each binds it to its own tensor class and name (see cpu/validate.ts, cuda/validate.ts).
import type { AttentionParams, DType, Tensor, WeightSource } from '../../contracts/backend.ts';

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
    /** attention's scalars: a finite scale, an integer window >= 0, a soft-cap >= 0 */
    attentionParams(op: string, params: AttentionParams): void {
      const { scale, window, softcap } = params;
      if (!Number.isFinite(scale)) throw opError(op, `params.scale must be a finite number, got ${scale}`);
      if (!Number.isSafeInteger(window) || window < 0) throw opError(op, `params.window must be an integer >= 0, got ${window}`);
      if (!Number.isFinite(softcap) || softcap < 0) throw opError(op, `params.softcap must be >= 0, got ${softcap}`);
    },
    /**
     * moeFfn's shapes: x [T, D], routing weights and experts [T, topK], gate and up [E, I, D], down
     * [E, D, I]; returns { T, D, E, I, K }.
     */
    moeShapes(op: string, x: Tensor, rw: Tensor, re: Tensor, gate: Tensor, up: Tensor, down: Tensor):
      { T: number; D: number; E: number; I: number; K: number } {
      const [T, D] = x.shape as [number, number];
      const [E, I, Dg] = gate.shape as [number, number, number];
      if (!sameShape(rw.shape, re.shape) || rw.shape[0] !== T) {
        throw opError(op, `routing weights ${describe(rw)} / experts ${describe(re)} must both be [${T}, topK]`);
      }
      if (Dg !== D) throw opError(op, `gate ${describe(gate)} must be [E, I, ${D}] for x ${describe(x)}`);
      if (!sameShape(up.shape, gate.shape)) throw opError(op, `up ${describe(up)} must match gate ${describe(gate)}`);
      if (!sameShape(down.shape, [E, D, I])) throw opError(op, `down ${describe(down)} must be [${E}, ${D}, ${I}]`);
      return { T, D, E, I, K: rw.shape[1]! };
    },
  };
}
