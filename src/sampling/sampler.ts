// The per-request sampler the engine calls once per row per step.
//
// Usage (one Sampler and one TokenHistory per sequence):
//   const sampler = new Sampler(params, { vocabSize });      // throws SamplingParamsError
//   const history = new TokenHistory(promptTokens);
//   each step: const id = sampler.sample(row, history); history.push(id);
// The raw row is never modified (logprobs are taken from it); bias and penalties are applied
// to a shared scratch copy, and only when some are active.

import { applyBiasAndPenalties, needsLogitProcessing } from './penalties.ts';
import { applyTokenBitmask } from './grammar/mask.ts';
import type { TokenHistory } from './history.ts';
import type { SamplingParams, SamplingParamsInput } from './params.ts';
import { createRng, type Xoshiro128StarStar } from './prng.ts';
import { sampleRow } from './sample-row.ts';
import { assertValidSamplingParams } from './validate.ts';

let processedScratch = new Float32Array(0);

/**
 * Returns `logits` itself when no bias/penalty/mask is active, else a processed copy in a shared
 * scratch buffer (valid until the next call). `mask` (a grammar's token bitmask, bit id set =
 * allowed) is the last processor: every disallowed logit becomes -Infinity.
 */
export function processLogits(logits: Float32Array, p: SamplingParams, history?: TokenHistory, mask?: Int32Array): Float32Array {
  if (!needsLogitProcessing(p) && mask === undefined) return logits;
  if (processedScratch.length < logits.length) processedScratch = new Float32Array(logits.length);
  const x = processedScratch.subarray(0, logits.length);
  x.set(logits);
  applyBiasAndPenalties(x, p, history);
  if (mask !== undefined) applyTokenBitmask(x, mask);
  return x;
}

export interface SamplerOptions {
  /** bounds logit_bias ids at construction; without it out-of-vocab ids are ignored at sample time */
  vocabSize?: number;
}

export class Sampler {
  readonly params: SamplingParams;
  private readonly rng: Xoshiro128StarStar;

  constructor(params: SamplingParamsInput = {}, opts: SamplerOptions = {}) {
    this.params = assertValidSamplingParams(params, opts.vocabSize);
    this.rng = createRng(this.params.seed);
  }

  /**
   * Next token for this request from one row of raw logits [V]. `history` carries the prompt
   * and accepted output tokens for penalties (required when a penalty is set); the caller
   * pushes the returned id into it once the token is accepted. `mask`: the row's grammar
   * bitmask, when it has a grammar.
   */
  sample(logits: Float32Array, history?: TokenHistory, mask?: Int32Array): number {
    return sampleRow(processLogits(logits, this.params, history, mask), this.params, this.rng);
  }

  /**
   * The uniform draw `sample` would consume for a non-greedy row, for sampling on the device
   * (device-sampling.ts): call it exactly once per token where `sample` would have been called.
   */
  nextUniform(): number {
    return this.rng.nextFloat64();
  }
}
