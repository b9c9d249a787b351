// One draw from unnormalised float64 weights by inverse CDF: u ~ U[0,1) scaled by the float64
// total, then the first candidate whose cumulative sum exceeds it. Summing in float64 keeps the
// tail of a 256k-token distribution from vanishing into float32 rounding.

export interface UniformSource {
  /** uniform double in [0, 1) */
  nextFloat64(): number;
}

/**
 * Draws a token id. Candidates are ids[0..n), or the ids 0..n-1 themselves when `ids` is null;
 * `w` is indexed by token id. P(id) = w[id] / total; zero weights are never drawn.
 */
export function drawToken(w: Float64Array, ids: Int32Array | null, n: number, rng: UniformSource, total?: number): number {
  let z = total ?? 0;
  if (total === undefined) for (let j = 0; j < n; j++) z += w[ids === null ? j : ids[j]!]!;
  const u = rng.nextFloat64() * z;
  let cum = 0;
  let lastPositive = -1;
  for (let j = 0; j < n; j++) {
    const id = ids === null ? j : ids[j]!;
    const wj = w[id]!;
    if (!(wj > 0)) continue;
    cum += wj;
    lastPositive = id;
    if (cum > u) return id;
  }
  // Rounding can leave u >= the re-accumulated sum: the last positive weight takes the remainder.
  if (lastPositive < 0) throw new Error('cannot sample: every candidate has zero probability');
  return lastPositive;
}
