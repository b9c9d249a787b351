// Temperature and the truncation transforms (top-k, top-p, min-p) on one logit row.
//
// Representation: a candidate set = ids[0..n) (any order) with float64 weights indexed by id,
// w[id] = exp((x[id] - xmax) / T): softmax numerators after max-subtraction, so the best token
// has w = 1 exactly and probabilities within a set are w / sum(w). No transform needs the set
// sorted: top-k is a threshold on the k-th value, top-p a weighted selection, min-p a threshold
// on w, and the draw only needs the weights; so nothing here is O(V log V).
//
// Order follows the brief (vLLM v0 / HF transformers warpers): temperature, top-k, top-p,
// min-p. vLLM v1 applies min-p before top-k/top-p; the kept set differs only in what top-p
// renormalises over, because min-p's rule p_i >= minP * p_max does not depend on normalisation.
// Ties are broken as everywhere in sampling/: higher value first, then lower id.

import { kthLargestValue, median3, topIndices } from './select.ts';

/**
 * Up to this k a bounded heap beats quickselect (one compare per element, no copy); measured at
 * V = 256k: heap 0.2 ms (k = 64) to 2.5 ms (k = 5000), quickselect ~2.5 ms for any k.
 */
const HEAP_TOP_K_LIMIT = 4096;

/** Top-p over a whole row first tries this many best tokens (one heap scan, ~0.2 ms at 256k). */
const TOP_P_HEAD = 64;

/** Sum of w[ids[j]] for j < n after setting w[id] = exp((x[id] - xmax) / T). */
export function setCandidateWeights(x: Float32Array, ids: Int32Array, n: number, xmax: number, T: number, w: Float64Array): number {
  let z = 0;
  for (let j = 0; j < n; j++) {
    const id = ids[j]!;
    const e = Math.exp((x[id]! - xmax) / T);
    w[id] = e;
    z += e;
  }
  return z;
}

/** The same over the whole row (w.length >= x.length); returns the float64 sum. */
export function setRowWeights(x: Float32Array, xmax: number, T: number, w: Float64Array): number {
  let z = 0;
  for (let i = 0; i < x.length; i++) {
    const e = Math.exp((x[i]! - xmax) / T);
    w[i] = e;
    z += e;
  }
  return z;
}

/**
 * Top-k ids. Like HF and vLLM (mask = logits < k-th value) every token tied with the k-th
 * value is kept, so more than k ids may come back. Small k: best first; large k: id order.
 */
export function topKIds(x: Float32Array, k: number): Int32Array {
  if (k <= HEAP_TOP_K_LIMIT) {
    const ids = topIndices(x, k);
    if (ids.length === 0 || ids.length >= x.length) return ids;
    const last = ids[ids.length - 1]!;
    const kth = x[last]!;
    // Under the (value desc, id asc) order the tied ids left out are exactly those above `last`.
    let extra = 0;
    for (let i = last + 1; i < x.length; i++) if (x[i] === kth) extra++;
    if (extra === 0) return ids;
    const out = new Int32Array(ids.length + extra);
    out.set(ids);
    let j = ids.length;
    for (let i = last + 1; i < x.length; i++) if (x[i] === kth) out[j++] = i;
    return out;
  }
  const kth = kthLargestValue(x, k);
  let count = 0;
  for (let i = 0; i < x.length; i++) if (x[i]! >= kth) count++;
  const out = new Int32Array(count);
  for (let i = 0, j = 0; i < x.length; i++) if (x[i]! >= kth) out[j++] = i;
  return out;
}

/**
 * Top-p: reorders ids[0..n) so that ids[0..r) are the kept tokens and returns r (>= 1 when
 * n >= 1). In (value desc, id asc) order a token is kept while the mass before it is < target
 * (= topP * mass of the set): vLLM's "ascending cumsum <= 1 - p is removed", stated from the top;
 * the best token is always kept.
 * Weighted quickselect: partition by a pivot value; if the part above the pivot already holds the
 * target mass, the cut lies inside it, else that part is all kept and the search continues
 * below. O(n) expected, and peaked LLM rows settle in a few partitions of a shrinking part.
 */
export function topPSelect(x: Float32Array, w: Float64Array, ids: Int32Array, n: number, target: number): number {
  let lo = 0;
  let hi = n;
  let before = 0; // mass of ids[0..lo), all kept; invariant: before < target or lo === 0
  while (lo < hi) {
    const pv = median3(x[ids[lo]!]!, x[ids[(lo + hi) >>> 1]!]!, x[ids[hi - 1]!]!);
    // 3-way partition of ids[lo..hi): [lo, gt) above pv, [gt, lt) equal, [lt, hi) below
    let gt = lo;
    let i = lo;
    let lt = hi;
    let massAbove = 0;
    while (i < lt) {
      const id = ids[i]!;
      const v = x[id]!;
      if (v > pv) {
        ids[i] = ids[gt]!;
        ids[gt++] = id;
        massAbove += w[id]!;
        i++;
      } else if (v < pv) {
        ids[i] = ids[--lt]!;
        ids[lt] = id;
      } else i++;
    }
    if (gt > lo && before + massAbove >= target) {
      hi = gt; // the cut is among the tokens above the pivot
      continue;
    }
    before += massAbove;
    // Tokens equal to the pivot, in id order (the tie rule); keep while the mass before < target.
    ids.subarray(gt, lt).sort();
    for (let j = gt; j < lt; j++) {
      if (before >= target) return j;
      before += w[ids[j]!]!;
    }
    if (before >= target) return lt;
    lo = lt;
  }
  if (hi === n) return n;
  // A partition's sum (another order, another rounding) reached the target, but adding the tokens
  // below it one by one fell short: the rule goes on past them, in value order (rare: the mass is
  // within rounding of the target).
  const rest = Array.from(ids.subarray(hi, n)).sort((a, b) => x[b]! - x[a]! || a - b);
  ids.set(rest, hi);
  for (let j = hi; j < n; j++) {
    if (before >= target) return j;
    before += w[ids[j]!]!;
  }
  return n;
}

/**
 * Top-p over a whole row, fast path: peaked LLM rows usually reach the mass within a few dozen
 * tokens, which one heap scan finds without touching the rest of the row. Returns the kept ids
 * (best first), or null when the head is too light and `topPSelect` must run.
 */
export function topPHead(x: Float32Array, w: Float64Array, target: number): Int32Array | null {
  const head = topIndices(x, TOP_P_HEAD);
  let before = 0;
  for (let j = 0; j < head.length; j++) {
    if (before >= target) return head.subarray(0, j);
    before += w[head[j]!]!;
  }
  return before >= target || head.length === x.length ? head : null;
}

/**
 * Min-p on a candidate set that contains the best token (w = 1): keeps ids with
 * w >= minP (p >= minP * p_max), compacting ids[0..n) in place; returns the new count.
 */
export function minPFilter(w: Float64Array, ids: Int32Array, n: number, minP: number): number {
  let r = 0;
  for (let j = 0; j < n; j++) {
    const id = ids[j]!;
    if (w[id]! >= minP) ids[r++] = id;
  }
  return r;
}
