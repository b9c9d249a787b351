// Naive float64 reference implementations the tests compare the fast paths against.
// Deliberately the obvious way: full sort, explicit softmax, no shortcuts.

import { mulberry32 } from '../helpers/mulberry32.ts';

export interface RefParams {
  temperature: number;
  topK: number;
  topP: number;
  minP: number;
}

/** Best-first ids under (value desc, id asc) by a full sort. */
export function refOrder(x: ArrayLike<number>): number[] {
  return Array.from({ length: x.length }, (_, i) => i).sort((a, b) => x[b]! - x[a]! || a - b);
}

/** Token id -> probability after temperature, top-k, top-p, min-p (in that order). */
export function refDistribution(x: ArrayLike<number>, p: RefParams): Map<number, number> {
  const s = Array.from(x, (v) => v / p.temperature);
  let ids = refOrder(s);
  if (p.topK > 0 && p.topK < ids.length) {
    const kth = s[ids[p.topK - 1]!]!;
    ids = ids.filter((i) => s[i]! >= kth);
  }
  const softmax = (set: number[]): number[] => {
    const m = set.reduce((acc, i) => Math.max(acc, s[i]!), -Infinity);
    const e = set.map((i) => Math.exp(s[i]! - m));
    const z = e.reduce((a, b) => a + b, 0);
    return e.map((v) => v / z);
  };
  let probs = softmax(ids);
  if (p.topP < 1) {
    let cum = 0;
    let keep = 0;
    while (keep < ids.length && (keep === 0 || cum < p.topP)) cum += probs[keep++]!;
    ids = ids.slice(0, keep);
    probs = softmax(ids);
  }
  if (p.minP > 0) {
    const thr = p.minP * probs[0]!;
    ids = ids.filter((_, j) => probs[j]! >= thr);
    probs = softmax(ids);
  }
  return new Map(ids.map((id, j) => [id, probs[j]!]));
}

/** Naive log-softmax in float64. */
export function refLogSoftmax(x: ArrayLike<number>): number[] {
  let m = -Infinity;
  for (let i = 0; i < x.length; i++) m = Math.max(m, x[i]!);
  let z = 0;
  for (let i = 0; i < x.length; i++) z += Math.exp(x[i]! - m);
  return Array.from(x, (v) => v - m - Math.log(z));
}

/** Logits shaped like a model's: roughly normal, scaled. */
export function randomLogits(n: number, seed: number, scale = 3): Float32Array {
  const r = mulberry32(seed);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = scale * (r() + r() + r() + r() - 2);
  return out;
}

/** Pearson chi-square of observed counts against expected probabilities. */
export function chiSquare(counts: Map<number, number>, expected: Map<number, number>, n: number): number {
  let chi = 0;
  for (const [id, p] of expected) {
    const e = n * p;
    const o = counts.get(id) ?? 0;
    chi += ((o - e) * (o - e)) / e;
  }
  return chi;
}

export function assertClose(actual: number, expected: number, tol: number, what = ''): void {
  if (!(Math.abs(actual - expected) <= tol)) {
    throw new Error(`${what} expected ${expected} +- ${tol}, got ${actual}`);
  }
}

/** Deterministic test data (test/helpers/mulberry32.ts). */
export const testRandom = mulberry32;
