// Rejection sampling of a draft token (speculative decoding: Leviathan et al. 2023, "Fast
// Inference from Transformers via Speculative Decoding"; Chen et al. 2023, "Accelerating Large
// Language Model Decoding with Speculative Sampling"). A token x drawn from the draft distribution
// q is kept with probability min(1, p(x) / q(x)), p the target's sampling distribution; when it is
// not, the token is drawn from the residual max(0, p - q), renormalised. Either way the token is
// distributed exactly as p.
//
// A draft chosen deterministically (q a point mass on x, as an n-gram match chooses) needs none of
// this: keeping x with probability p(x), else drawing from p without x, is the same as drawing from
// p and comparing with x, which the engine does with the plain sampler (one uniform per token, the
// stream a request without drafts consumes).

import type { UniformSource } from './categorical.ts';

export interface DraftVerdict {
  /** the token taken at this position: x when kept, else the residual's draw */
  id: number;
  accepted: boolean;
}

/**
 * Judges draft token `x` (drawn from `q`, indexed by token id) against the target distribution
 * `p` (token id -> probability, zero-probability tokens omitted: samplingDistribution). Draws one
 * uniform to judge x, and one more when it is rejected.
 */
export function verifyDraftToken(p: ReadonlyMap<number, number>, x: number, q: ArrayLike<number>, rng: UniformSource): DraftVerdict {
  const px = p.get(x) ?? 0;
  const qx = q[x] ?? 0;
  const u = rng.nextFloat64();
  // u < p(x) / q(x), without the division (a q(x) of 0 keeps any x the target can produce)
  if (px > 0 && u * qx < px) return { id: x, accepted: true };
  let total = 0;
  for (const [id, pi] of p) total += Math.max(0, pi - (q[id] ?? 0));
  const v = rng.nextFloat64() * total;
  let cum = 0;
  let last = -1;
  for (const [id, pi] of p) {
    const r = Math.max(0, pi - (q[id] ?? 0));
    if (!(r > 0)) continue;
    cum += r;
    last = id;
    if (cum > v) return { id, accepted: false };
  }
  if (last >= 0) return { id: last, accepted: false };
  // no residual mass: x was rejected only by rounding (p and q agree where p has mass); the most probable token stands in
  let best = -1, bestP = -1;
  for (const [id, pi] of p) if (pi > bestP) (best = id), (bestP = pi);
  if (best < 0) throw new Error('cannot sample: the target distribution is empty');
  return { id: best, accepted: best === x };
}
