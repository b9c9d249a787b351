// Fitting the decode constants of constants.ts to measured decode steps (bench/fit-accuracy.ts
// --calibrate on the CPU, bench/fit-cuda.ts on a GPU). Every term of decode-model.ts is a known
// unit times one constant (or divided by it), so the measured step time is linear in one
// coefficient per constant: the fit is a non-negative least squares on relative errors, and each
// sample's held-out error (fitted without it) says how well the model predicts what it has not seen.

import type { ConstantName } from './constants.ts';
import { termSeconds, type DecodeTerm } from './decode-model.ts';

export interface DecodeSample {
  name: string;
  /** the terms of the step (decode-model.ts decodeTerms), averaged over the measured positions */
  terms: DecodeTerm[];
  /** measured seconds per step */
  seconds: number;
}

export interface DecodeFit {
  /** fitted value of each constant (undefined: no sample had its term, left as it was) */
  values: Partial<Record<ConstantName, number>>;
  rows: { name: string; measured: number; fitted: number; error: number; heldOut: number; heldOutError: number }[];
}

/** Averages the terms of several steps (same constants, units averaged). */
export function meanTerms(steps: readonly DecodeTerm[][]): DecodeTerm[] {
  const by = new Map<ConstantName, DecodeTerm>();
  for (const terms of steps) {
    for (const t of terms) {
      const x = by.get(t.constant);
      if (x) x.unit += t.unit / steps.length;
      else by.set(t.constant, { ...t, unit: t.unit / steps.length });
    }
  }
  return [...by.values()];
}

/**
 * Lawson-Hanson non-negative least squares: min |A x - b| subject to x >= 0 (A is m x n, small n).
 */
export function nnls(A: number[][], b: number[]): number[] {
  const m = A.length, n = A[0]?.length ?? 0;
  const x = new Array<number>(n).fill(0);
  const passive = new Set<number>();
  const gradient = () => Array.from({ length: n }, (_, j) => A.reduce((s, row, i) => s + row[j]! * (b[i]! - dot(row, x)), 0));
  const solvePassive = (): number[] => {
    const P = [...passive];
    const z = new Array<number>(n).fill(0);
    if (P.length === 0) return z;
    const sol = leastSquares(A.map((row) => P.map((j) => row[j]!)), b);
    P.forEach((j, k) => (z[j] = sol[k]!));
    return z;
  };
  for (let iter = 0; iter < 3 * n + 10; iter++) {
    const w = gradient();
    let best = -1;
    for (let j = 0; j < n; j++) if (!passive.has(j) && w[j]! > 1e-12 * (1 + Math.abs(w[j]!)) && (best < 0 || w[j]! > w[best]!)) best = j;
    if (best < 0) break;
    passive.add(best);
    for (;;) {
      const z = solvePassive();
      const neg = [...passive].filter((j) => z[j]! <= 0);
      if (neg.length === 0) {
        for (let j = 0; j < n; j++) x[j] = z[j]!;
        break;
      }
      let alpha = 1;
      for (const j of neg) alpha = Math.min(alpha, x[j]! / (x[j]! - z[j]!));
      for (let j = 0; j < n; j++) x[j] = x[j]! + alpha * (z[j]! - x[j]!);
      for (const j of [...passive]) if (x[j]! <= 1e-15) (passive.delete(j), (x[j] = 0));
      if (passive.size === 0) break;
    }
  }
  void m;
  return x;
}

function dot(a: number[], b: number[]): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i]! * b[i]!;
  return s;
}

/** min |X b - y| by the normal equations with partial pivoting (X is m x n, small n). */
export function leastSquares(X: number[][], y: number[]): number[] {
  const n = X[0]!.length;
  const A = Array.from({ length: n }, (_, i) => Array.from({ length: n }, (_, j) => X.reduce((s, r) => s + r[i]! * r[j]!, 0)));
  const b = Array.from({ length: n }, (_, i) => X.reduce((s, r, k) => s + r[i]! * y[k]!, 0));
  for (let i = 0; i < n; i++) {
    let p = i;
    for (let r = i + 1; r < n; r++) if (Math.abs(A[r]![i]!) > Math.abs(A[p]![i]!)) p = r;
    [A[i], A[p]] = [A[p]!, A[i]!];
    [b[i], b[p]] = [b[p]!, b[i]!];
    if (A[i]![i] === 0) continue;
    for (let r = i + 1; r < n; r++) {
      const f = A[r]![i]! / A[i]![i]!;
      for (let c = i; c < n; c++) A[r]![c]! -= f * A[i]![c]!;
      b[r]! -= f * b[i]!;
    }
  }
  const x = new Array<number>(n).fill(0);
  for (let i = n - 1; i >= 0; i--) {
    let s = b[i]!;
    for (let c = i + 1; c < n; c++) s -= A[i]![c]! * x[c]!;
    x[i] = A[i]![i] === 0 ? 0 : s / A[i]![i]!;
  }
  return x;
}

/** Coefficients (seconds per unit) of `names` fitted to `samples`, relative error weighted. */
function coefficients(samples: readonly DecodeSample[], names: readonly ConstantName[]): number[] {
  const A = samples.map((s) => names.map((n) => s.terms.filter((t) => t.constant === n).reduce((a, t) => a + t.unit, 0) / s.seconds));
  return nnls(A, samples.map(() => 1));
}

const predict = (s: DecodeSample, names: readonly ConstantName[], c: number[]) =>
  names.reduce((a, n, j) => a + s.terms.filter((t) => t.constant === n).reduce((x, t) => x + t.unit, 0) * c[j]!, 0);

/**
 * Fits the constants named in the samples' terms, but for `fixed` ones (measured apart: their
 * terms are taken at their current values and subtracted). A constant whose term is zero in every
 * sample is not determined (left out of `values`); one fitted to a zero coefficient costs nothing
 * (an efficiency or rate of Infinity, an overhead of 0). The fitted and held-out times include the
 * fixed terms.
 */
export function fitDecodeConstants(all: readonly DecodeSample[], opts: { fixed?: readonly ConstantName[] } = {}): DecodeFit {
  const fixed = new Set(opts.fixed ?? []);
  const fixedSeconds = all.map((s) => s.terms.filter((t) => fixed.has(t.constant)).reduce((a, t) => a + termSeconds(t), 0));
  const samples = all.map((s, i) => ({
    name: s.name, terms: s.terms.filter((t) => !fixed.has(t.constant)), seconds: Math.max(s.seconds - fixedSeconds[i]!, 1e-3 * s.seconds),
  }));
  const inverse = new Map<ConstantName, boolean>();
  for (const s of samples) for (const t of s.terms) if (t.unit !== 0) inverse.set(t.constant, t.inverse);
  const names = [...inverse.keys()];
  const c = coefficients(samples, names);
  const values: Partial<Record<ConstantName, number>> = {};
  names.forEach((n, j) => (values[n] = inverse.get(n) ? (c[j]! > 0 ? 1 / c[j]! : Infinity) : c[j]!));
  const rows = samples.map((s, i) => {
    const measured = all[i]!.seconds;
    const fitted = predict(s, names, c) + fixedSeconds[i]!;
    const rest = samples.filter((_, k) => k !== i);
    const heldOut = rest.length >= names.length ? predict(s, names, coefficients(rest, names)) + fixedSeconds[i]! : NaN;
    return { name: s.name, measured, fitted, error: fitted / measured - 1, heldOut, heldOutError: heldOut / measured - 1 };
  });
  return { values, rows };
}
