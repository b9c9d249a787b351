// Log-probabilities as the API reports them: log-softmax of the RAW logits (before bias,
// penalties, temperature or truncation), which is what OpenAI and vLLM's default
// "raw_logprobs" mode return.
//
// Stable form: log p_i = x_i - (xmax + log(sum_j exp(x_j - xmax))), with the sum in float64.
// Cost: one max pass, one exp pass, and a bounded-heap selection of the k best.

import { maxValue, topIndices } from './select.ts';

export interface TopLogprob {
  tokenId: number;
  logprob: number;
}

export interface TokenLogprobs {
  /** the chosen (sampled) token */
  tokenId: number;
  logprob: number;
  /** the k most likely tokens, best first (ties: lower id first) */
  top: TopLogprob[];
}

/** log(sum(exp(x))) over the row, computed stably in float64. -Infinity for a fully masked row. */
export function logSumExp(x: Float32Array): number {
  const m = maxValue(x);
  if (m === -Infinity || m === Infinity) return m;
  let s = 0;
  for (let i = 0; i < x.length; i++) s += Math.exp(x[i]! - m);
  return m + Math.log(s);
}

/** The chosen token's logprob and the k best (token, logprob) pairs of one raw logit row. */
export function topLogprobs(rawLogits: Float32Array, k: number, chosenId: number): TokenLogprobs {
  if (!Number.isInteger(chosenId) || chosenId < 0 || chosenId >= rawLogits.length) {
    throw new RangeError(`chosen token id ${chosenId} is outside the vocabulary [0, ${rawLogits.length})`);
  }
  const lse = logSumExp(rawLogits);
  const top: TopLogprob[] = [];
  if (k > 0) for (const id of topIndices(rawLogits, k)) top.push({ tokenId: id, logprob: rawLogits[id]! - lse });
  return { tokenId: chosenId, logprob: rawLogits[chosenId]! - lse, top };
}
