// The reference backend's on-device sampling (Backend.sampleRows): the semantics of
// contracts/device-sampling.ts written out the obvious way, in float64 (backends may not import
// sampling/, so this restates the host pipeline rather than calling it; the tests hold the two
// equal, token for token). The rows go through the same packed buffer the CUDA backend uploads,
// so CPU CI exercises packSampleRows / unpackSampleRows too.

import {
  type DeviceSampleRow, packSampleRows, SAMPLE_ERR_INF, SAMPLE_ERR_MASKED, sampleResultWidth, unpackSampleRows,
} from '../../contracts/device-sampling.ts';

/** -> i32 [P, 2 + 2K] as Backend.sampleRows returns it. `logits` is [P, V]. */
export function referenceSampleRows(logits: Float32Array, V: number, rows: readonly DeviceSampleRow[]): { data: Int32Array; width: number } {
  const P = rows.length;
  if (logits.length !== P * V) throw new Error(`sampleRows: ${logits.length} logits for ${P} rows of ${V}`);
  const { words } = packSampleRows(rows, V);
  const { k: K, rows: unpacked } = unpackSampleRows(words);
  const W = sampleResultWidth(K);
  const data = new Int32Array(P * W);
  const f = new Float32Array(data.buffer);
  for (let i = 0; i < P; i++) {
    const raw = logits.subarray(i * V, (i + 1) * V);
    const r = unpacked[i]!;
    const o = i * W;
    const token = sampleOne(raw, r);
    data[o] = token;
    f[o + 1] = NaN;
    for (let j = 0; j < K; j++) {
      data[o + 2 + 2 * j] = -1;
      f[o + 3 + 2 * j] = NaN;
    }
    if (r.topLogprobs === undefined || token < 0) continue;
    const lse = logSumExp(raw);
    f[o + 1] = raw[token]! - lse;
    const top = bestIds(raw, r.topLogprobs);
    for (let j = 0; j < top.length; j++) {
      data[o + 2 + 2 * j] = top[j]!;
      f[o + 3 + 2 * j] = raw[top[j]!]! - lse;
    }
  }
  return { data, width: W };
}

/** NaN sorts as -Infinity */
const val = (x: Float32Array, i: number): number => (x[i]! === x[i]! ? x[i]! : -Infinity);

/** ids by (value desc, id asc) */
function order(x: Float32Array, ids: Int32Array): Int32Array {
  return ids.sort((a, b) => val(x, b) - val(x, a) || a - b);
}

function bestIds(x: Float32Array, k: number): Int32Array {
  return order(x, Int32Array.from({ length: x.length }, (_, i) => i)).slice(0, Math.min(k, x.length));
}

function logSumExp(x: Float32Array): number {
  let m = -Infinity;
  for (let i = 0; i < x.length; i++) if (x[i]! > m) m = x[i]!;
  if (m === -Infinity || m === Infinity) return m;
  let s = 0;
  for (let i = 0; i < x.length; i++) s += Math.exp(x[i]! - m);
  return m + Math.log(s);
}

function sampleOne(raw: Float32Array, r: DeviceSampleRow): number {
  const V = raw.length;
  // 1. bias, then repetition, then frequency/presence penalty (float64 maths, float32 stores),
  //    then the mask
  const x = Float32Array.from(raw);
  if (r.biasIds) for (let j = 0; j < r.biasIds.length; j++) x[r.biasIds[j]!] = x[r.biasIds[j]!]! + r.biasValues![j]!;
  if (r.penaltyIds) {
    const ids = r.penaltyIds, counts = r.outputCounts!;
    if (r.repetitionPenalty !== 1) {
      for (const id of ids) x[id] = x[id]! > 0 ? x[id]! / r.repetitionPenalty : x[id]! * r.repetitionPenalty;
    }
    if (r.frequencyPenalty !== 0 || r.presencePenalty !== 0) {
      for (let j = 0; j < ids.length; j++) {
        if (counts[j]! > 0) x[ids[j]!] = x[ids[j]!]! - r.frequencyPenalty * counts[j]! - r.presencePenalty;
      }
    }
  }
  if (r.mask) {
    for (let i = 0; i < V; i++) {
      const w = i >>> 5;
      if (w >= r.mask.length || ((r.mask[w]! >>> (i & 31)) & 1) === 0) x[i] = -Infinity;
    }
  }
  for (let i = 0; i < V; i++) if (x[i] !== x[i]) x[i] = -Infinity;

  // 2. greedy: the argmax, lowest id on ties
  let best = -1;
  let xmax = -Infinity;
  for (let i = 0; i < V; i++) {
    if (x[i]! > xmax) {
      xmax = x[i]!;
      best = i;
    }
  }
  if (r.temperature === 0) return best;
  if (xmax === -Infinity) return SAMPLE_ERR_MASKED;
  if (xmax === Infinity) return SAMPLE_ERR_INF;

  // 3. temperature, top-k (every value >= the k-th largest), top-p (value desc, id asc: keep
  //    while the mass before < topP * mass), min-p (w >= minP)
  const w = new Float64Array(V);
  for (let i = 0; i < V; i++) w[i] = Math.exp((x[i]! - xmax) / r.temperature);
  let cand: Int32Array;
  if (r.topK > 0 && r.topK < V) {
    const kth = Float32Array.from(x).sort()[V - r.topK]!;
    cand = Int32Array.from({ length: V }, (_, i) => i).filter((i) => x[i]! >= kth);
  } else {
    cand = Int32Array.from({ length: V }, (_, i) => i);
  }
  if (r.topP < 1) {
    let total = 0;
    for (const id of cand) total += w[id]!;
    const target = r.topP * total;
    const sorted = order(x, cand.slice());
    let before = 0;
    let n = 0;
    while (n < sorted.length && before < target) before += w[sorted[n++]!]!;
    cand = sorted.slice(0, n).sort();
  }
  if (r.minP > 0) cand = cand.filter((id) => w[id]! >= r.minP);

  // 4. the draw, in ascending id order
  let z = 0;
  for (const id of cand) z += w[id]!;
  const target = r.u * z;
  let cum = 0;
  let last = -1;
  for (const id of cand) {
    if (!(w[id]! > 0)) continue;
    cum += w[id]!;
    last = id;
    if (cum > target) return id;
  }
  return last;
}
