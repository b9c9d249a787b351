// The sampling pipeline for one row of already biased/penalised logits:
// temperature -> top-k -> top-p -> min-p -> categorical draw (or argmax when temperature = 0).
//
// Cost on a V-token row (see truncation.ts): one max pass; then top-k = a heap scan (or
// quickselect for large k) and exps for the k survivors only; without top-k, one exp pass over
// the row, plus for top-p a heap scan for a short head, or an O(V) weighted quickselect when
// the head is too light. Never a sort of the row.
// Consumes exactly one rng.nextFloat64() per random draw and none when greedy, so a seed
// reproduces a whole request.

import { drawToken, type UniformSource } from './categorical.ts';
import type { SamplingParams } from './params.ts';
import { topKActive } from './params.ts';
import { argmax, maxValue } from './select.ts';
import { minPFilter, setCandidateWeights, setRowWeights, topKIds, topPHead, topPSelect } from './truncation.ts';

export type TruncationParams = Pick<SamplingParams, 'temperature' | 'topK' | 'topP' | 'minP'>;

/** Survivors: ids[0..n) (or 0..n-1 when ids is null) with weights w indexed by id. */
interface CandidateSet {
  ids: Int32Array | null;
  n: number;
  w: Float64Array;
  /** sum of the survivors' weights when known */
  total?: number;
}

// Row-sized scratch shared by all calls: sampling is synchronous, so no two calls overlap, and
// a 256k-vocab row would otherwise allocate 2-3 MB per token.
let weightScratch = new Float64Array(0);
let idScratch = new Int32Array(0);

function weightBuffer(n: number): Float64Array {
  if (weightScratch.length < n) weightScratch = new Float64Array(n);
  return weightScratch;
}

function allIds(n: number): Int32Array {
  if (idScratch.length < n) idScratch = new Int32Array(n);
  for (let i = 0; i < n; i++) idScratch[i] = i;
  return idScratch;
}

/** Requires temperature > 0. The result aliases the shared scratch. */
function candidateSet(x: Float32Array, p: TruncationParams): CandidateSet {
  const T = p.temperature;
  const w = weightBuffer(x.length);
  let ids: Int32Array | null = null;
  let n = x.length;
  let total: number;
  if (topKActive(p.topK, x.length)) {
    // The best token is among the survivors, so their max is the row max: no full-row pass.
    ids = topKIds(x, p.topK);
    n = ids.length;
    let xmax = -Infinity;
    for (let j = 0; j < n; j++) xmax = Math.max(xmax, x[ids[j]!]!);
    checkFinite(xmax);
    total = setCandidateWeights(x, ids, n, xmax, T, w);
  } else {
    const xmax = maxValue(x);
    checkFinite(xmax);
    total = setRowWeights(x, xmax, T, w);
  }
  if (p.topP < 1) {
    const target = p.topP * total;
    const head = ids === null ? topPHead(x, w, target) : null;
    if (head !== null) {
      ids = head;
      n = head.length;
    } else {
      ids ??= allIds(x.length);
      n = topPSelect(x, w, ids, n, target);
    }
    return { ids, n: p.minP > 0 ? minPFilter(w, ids, n, p.minP) : n, w };
  }
  if (p.minP > 0) {
    if (ids !== null) return { ids, n: minPFilter(w, ids, n, p.minP), w };
    // Whole row: zeroing is cheaper than building an id list.
    total = 0;
    for (let i = 0; i < x.length; i++) {
      if (w[i]! < p.minP) w[i] = 0;
      else total += w[i]!;
    }
  }
  return { ids, n, w, total };
}

const MASKED = 'cannot sample: every logit is -Infinity or NaN';

/**
 * A -Infinity max means nothing can be drawn. +Infinity would turn every weight into NaN; it
 * only comes from a broken model or processor, so it is an error rather than a guess.
 */
function checkFinite(xmax: number): void {
  if (xmax === -Infinity) throw new Error(MASKED);
  if (xmax === Infinity) throw new Error('cannot sample: a logit is +Infinity');
}

function greedy(x: Float32Array): number {
  const id = argmax(x);
  if (id < 0) throw new Error(MASKED);
  return id;
}

let markScratch = new Uint8Array(0);

/**
 * Puts ids[0..n) (distinct ids below V) in ascending order: a typed-array sort for a few, one
 * marking pass over the row for many (cheaper than n log n once n is a sizeable part of V).
 */
export function sortIdsAscending(ids: Int32Array, n: number, V: number): void {
  if (n < 2) return;
  if (n * 32 < V) {
    ids.subarray(0, n).sort();
    return;
  }
  if (markScratch.length < V) markScratch = new Uint8Array(V);
  const mark = markScratch;
  for (let j = 0; j < n; j++) mark[ids[j]!] = 1;
  let k = 0;
  for (let i = 0; i < V; i++) {
    if (mark[i]) {
      mark[i] = 0;
      ids[k++] = i;
    }
  }
}

/**
 * Draws a token id from processed logits `x` under `p`. Throws when every logit is -Infinity.
 * The draw walks the survivors in ascending token id order (the canonical order the device
 * sampler walks too, contracts/device-sampling.ts), so one uniform picks the same token on both.
 */
export function sampleRow(x: Float32Array, p: TruncationParams, rng: UniformSource): number {
  if (p.temperature === 0) return greedy(x);
  const c = candidateSet(x, p);
  if (c.ids !== null) sortIdsAscending(c.ids, c.n, x.length); // the truncations leave them in value or partition order
  return drawToken(c.w, c.ids, c.n, rng, c.total);
}

/**
 * The exact distribution `sampleRow` draws from: token id -> probability, zero-probability
 * tokens omitted. For tests, debugging and tools, not the decode loop.
 */
export function samplingDistribution(x: Float32Array, p: TruncationParams): Map<number, number> {
  if (p.temperature === 0) return new Map([[greedy(x), 1]]);
  const c = candidateSet(x, p);
  const idAt = (j: number): number => (c.ids === null ? j : c.ids[j]!);
  let z = 0;
  for (let j = 0; j < c.n; j++) z += c.w[idAt(j)]!;
  const out = new Map<number, number>();
  for (let j = 0; j < c.n; j++) if (c.w[idAt(j)]! > 0) out.set(idAt(j), c.w[idAt(j)]! / z);
  return out;
}
