// Order statistics over a logit row without sorting the vocabulary.
//
// Every function orders tokens by (value descending, id ascending): a total order, so ties
// always resolve to the lowest id and results never depend on sort stability. NaN counts as
// -Infinity (never selected over a real value).
//
// `topIndices` is a bounded min-heap scan: O(V) compares plus O(log m) per heap replacement.
// On a logit row only a tiny fraction of the V elements beat the heap's worst after the first
// few thousand, so for m << V this is close to a single pass (a full sort of 256k ids is
// ~100x slower).

/** Index of the largest value, lowest index on ties; -1 when no value exceeds -Infinity. */
export function argmax(values: Float32Array): number {
  let best = -1;
  let bestV = -Infinity;
  for (let i = 0; i < values.length; i++) {
    const v = values[i]!;
    if (v > bestV) {
      bestV = v;
      best = i;
    }
  }
  return best;
}

/** Largest value (NaN ignored); -Infinity for an empty or fully masked row. */
export function maxValue(values: Float32Array): number {
  let m = -Infinity;
  for (let i = 0; i < values.length; i++) if (values[i]! > m) m = values[i]!;
  return m;
}

/** The m best ids (m clamped to values.length), best first. */
export function topIndices(values: Float32Array, m: number): Int32Array {
  // `| 0` (not Math.floor) keeps n, and so the scan's loop counter, a small integer to V8;
  // a double-typed counter made every element access slow (measured 3x at V = 256k).
  const n = Math.min(Math.max(0, m | 0), values.length);
  if (n === 0) return new Int32Array(0);
  // Min-heap on (value, -id): the root is the worst of the kept n.
  const hv = new Float64Array(n);
  const hi = new Int32Array(n);
  const out = new Int32Array(n);
  for (let i = 0; i < n; i++) {
    const v = values[i]!;
    hv[i] = v === v ? v : -Infinity;
    hi[i] = i;
  }
  for (let i = (n >> 1) - 1; i >= 0; i--) siftDown(hv, hi, i, n);
  // Later ids have higher indices, so an equal value never beats the root: strict > suffices.
  // `worst` mirrors hv[0] in a local so the hot loop is one load and one compare per element.
  let worst = hv[0]!;
  for (let i = n; i < values.length; i++) {
    const v = values[i]!;
    if (v > worst) {
      hv[0] = v;
      hi[0] = i;
      siftDown(hv, hi, 0, n);
      worst = hv[0]!;
    }
  }
  // Pop worst-first into the back of the output: best first overall.
  for (let size = n; size > 0; size--) {
    out[size - 1] = hi[0]!;
    hv[0] = hv[size - 1]!;
    hi[0] = hi[size - 1]!;
    siftDown(hv, hi, 0, size - 1);
  }
  return out;
}

// Heap helpers are module-level functions so V8 can inline them into the scan.
function worse(hv: Float64Array, hi: Int32Array, a: number, b: number): boolean {
  return hv[a]! < hv[b]! || (hv[a] === hv[b] && hi[a]! > hi[b]!);
}

function siftDown(hv: Float64Array, hi: Int32Array, start: number, size: number): void {
  let i = start;
  for (;;) {
    const l = 2 * i + 1;
    if (l >= size) return;
    const r = l + 1;
    const c = r < size && worse(hv, hi, r, l) ? r : l;
    if (!worse(hv, hi, c, i)) return;
    const tv = hv[i]!;
    const ti = hi[i]!;
    hv[i] = hv[c]!;
    hi[i] = hi[c]!;
    hv[c] = tv;
    hi[c] = ti;
    i = c;
  }
}

/**
 * The k-th largest value (k >= 1, clamped to the row), NaN counted as -Infinity. Quickselect
 * (3-way partition, median-of-3 pivot) on a scratch copy: O(V) expected, for k too large for
 * the heap of `topIndices` to stay cheap.
 */
export function kthLargestValue(values: Float32Array, k: number): number {
  const n = values.length;
  if (n === 0) return -Infinity;
  if (valueScratch.length < n) valueScratch = new Float32Array(n);
  const a = valueScratch;
  for (let i = 0; i < n; i++) {
    const v = values[i]!;
    a[i] = v === v ? v : -Infinity;
  }
  let want = Math.min(Math.max(1, k | 0), n) - 1; // index into the descending order
  let lo = 0;
  let hi = n;
  for (;;) {
    const pv = median3(a[lo]!, a[(lo + hi) >>> 1]!, a[hi - 1]!);
    // [lo, gt) > pv, [gt, i) == pv, [lt, hi) < pv
    let gt = lo;
    let i = lo;
    let lt = hi;
    while (i < lt) {
      const v = a[i]!;
      if (v > pv) {
        a[i] = a[gt]!;
        a[gt++] = v;
        i++;
      } else if (v < pv) {
        a[i] = a[--lt]!;
        a[lt] = v;
      } else i++;
    }
    if (want < gt - lo) hi = gt;
    else if (want < lt - lo) return pv;
    else {
      want -= lt - lo;
      lo = lt;
    }
  }
}

let valueScratch = new Float32Array(0);

export function median3(a: number, b: number, c: number): number {
  return a < b ? (b < c ? b : a < c ? c : a) : a < c ? a : b < c ? c : b;
}
