// Transforms that act on raw logits before temperature: logit bias and the three penalties.
//
// Order (vLLM v1): logit bias, then repetition, frequency, presence penalty. The order matters
// only for repetition penalty, which scales: bias first means a biased token is scaled along
// with its bias, as in vLLM. All of them touch only the listed ids, never the whole vocab.
// They write into `logits` in place: callers pass a scratch copy, never the model's raw row
// (logprobs are computed from the raw row).

import type { SamplingParams } from './params.ts';
import type { TokenHistory } from './history.ts';

/** logits[id] += bias for every entry; ids outside the row are ignored (validation rejects them). */
export function applyLogitBias(logits: Float32Array, bias: ReadonlyMap<number, number>): void {
  for (const [id, b] of bias) {
    if (id >= 0 && id < logits.length) logits[id] = logits[id]! + b;
  }
}

/**
 * HF RepetitionPenaltyLogitsProcessor: for every id seen in prompt or output,
 * logit > 0 ? logit / p : logit * p (p > 1 discourages repeats either way).
 */
export function applyRepetitionPenalty(logits: Float32Array, seen: ReadonlySet<number>, penalty: number): void {
  for (const id of seen) {
    if (id < 0 || id >= logits.length) continue;
    const l = logits[id]!;
    logits[id] = l > 0 ? l / penalty : l * penalty;
  }
}

/** OpenAI: logit -= frequency * count + presence * (count > 0), over generated tokens only. */
export function applyFrequencyPresencePenalty(
  logits: Float32Array,
  counts: Iterable<[number, number]>,
  frequency: number,
  presence: number,
): void {
  for (const [id, count] of counts) {
    if (id < 0 || id >= logits.length) continue;
    logits[id] = logits[id]! - frequency * count - presence;
  }
}

/** True when any of bias/penalties would change the logits (so the raw row can be used as is). */
/** Whether a repetition, frequency or presence penalty applies (the next token depends on the history). */
export function hasPenalties(p: Pick<SamplingParams, 'repetitionPenalty' | 'frequencyPenalty' | 'presencePenalty'>): boolean {
  return p.repetitionPenalty !== 1 || p.frequencyPenalty !== 0 || p.presencePenalty !== 0;
}

export function needsLogitProcessing(p: SamplingParams): boolean {
  return p.logitBias.size > 0 || p.repetitionPenalty !== 1 || p.presencePenalty !== 0 || p.frequencyPenalty !== 0;
}

/** Applies bias and every active penalty, in the order above, to `logits` in place. */
export function applyBiasAndPenalties(logits: Float32Array, p: SamplingParams, history: TokenHistory | undefined): void {
  if (p.logitBias.size > 0) applyLogitBias(logits, p.logitBias);
  if (!hasPenalties(p)) return;
  // Silently skipping the penalties would be a wrong-output bug that no error reveals.
  if (history === undefined) throw new Error('penalties are set but no TokenHistory was passed to sample()');
  if (p.repetitionPenalty !== 1) applyRepetitionPenalty(logits, history.seen(), p.repetitionPenalty);
  if (p.frequencyPenalty !== 0 || p.presencePenalty !== 0) {
    applyFrequencyPresencePenalty(logits, history.outputCountEntries(), p.frequencyPenalty, p.presencePenalty);
  }
}
