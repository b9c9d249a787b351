// Range checks for sampling parameters, with messages fit to return in a 400 response.
//
// Ranges follow OpenAI where OpenAI defines the parameter (presence/frequency penalty, logit
// bias) and vLLM otherwise (top_k, min_p, repetition_penalty). Each issue names the wire
// parameter (snake_case) so the server can fill the OpenAI error's `param` field.

import { isValidatedBias, markValidatedBias, resolveSamplingParams, type SamplingParams, type SamplingParamsInput } from './params.ts';

export interface SamplingParamIssue {
  /** the OpenAI/vLLM wire name, e.g. "top_p" */
  param: string;
  message: string;
}

/** Thrown by `assertValidSamplingParams`; `issues` lists every problem, not only the first. */
export class SamplingParamsError extends Error {
  readonly issues: readonly SamplingParamIssue[];
  constructor(issues: readonly SamplingParamIssue[]) {
    super(issues.map((i) => i.message).join('; '));
    this.name = 'SamplingParamsError';
    this.issues = issues;
  }
}

/** a token id as a JSON object key: decimal digits, no sign, spaces or leading zeros */
const CANONICAL_ID = /^(?:0|[1-9]\d*)$/;

// JSON text for anything but numbers: String() of a request's object throws when its own keys
// shadow toString and valueOf ({"toString": 1}), and [object Object] says nothing anyway
const show = (v: unknown): string => (typeof v === 'number' ? String(v) : JSON.stringify(v) ?? String(v));

/**
 * Returns every problem with `input` (empty array = valid). `vocabSize`, when known, bounds the
 * token ids of logit_bias; without it only their integrality is checked.
 */
export function validateSamplingParams(input: SamplingParamsInput, vocabSize?: number): SamplingParamIssue[] {
  const issues: SamplingParamIssue[] = [];
  // Checks one optional numeric field: undefined means "use the default" and is always fine.
  const num = (value: unknown, param: string, ok: (v: number) => boolean, range: string): void => {
    if (value === undefined) return;
    if (typeof value !== 'number' || !Number.isFinite(value)) {
      issues.push({ param, message: `${param} must be a finite number, got ${show(value)}` });
    } else if (!ok(value)) {
      issues.push({ param, message: `${param} must be ${range}, got ${value}` });
    }
  };

  num(input.temperature, 'temperature', (v) => v >= 0, '>= 0 (0 = greedy)');
  num(input.topP, 'top_p', (v) => v > 0 && v <= 1, 'in (0, 1]');
  num(input.topK, 'top_k', (v) => Number.isInteger(v) && v >= -1, 'an integer >= -1 (0 or -1 = disabled)');
  num(input.minP, 'min_p', (v) => v >= 0 && v <= 1, 'in [0, 1]');
  num(input.presencePenalty, 'presence_penalty', (v) => v >= -2 && v <= 2, 'in [-2, 2]');
  num(input.frequencyPenalty, 'frequency_penalty', (v) => v >= -2 && v <= 2, 'in [-2, 2]');
  num(input.repetitionPenalty, 'repetition_penalty', (v) => v > 0, '> 0 (1 = disabled)');
  num(input.seed, 'seed', (v) => Number.isSafeInteger(v), 'an integer within +-(2^53 - 1)');

  const bias = input.logitBias;
  if (bias !== undefined && !isValidatedBias(bias, vocabSize)) {
    if (bias === null || typeof bias !== 'object') {
      issues.push({ param: 'logit_bias', message: `logit_bias must be an object mapping token ids to biases` });
    } else {
      const entries: Iterable<[unknown, unknown]> = bias instanceof Map ? bias.entries() : Object.entries(bias);
      // token id -> the key that named it: "01" and "1" (or 1 and "1" in a Map) are one token
      const seen = new Map<number, unknown>();
      for (const [key, value] of entries) {
        const id = typeof key === 'number' ? key : typeof key === 'string' && CANONICAL_ID.test(key) ? Number(key) : NaN;
        if (typeof key === 'string' && !CANONICAL_ID.test(key)) {
          issues.push({
            param: 'logit_bias',
            message: `logit_bias key ${show(key)} is not an integer token id in canonical form (decimal digits, no sign, spaces or leading zeros)`,
          });
        } else if (!Number.isSafeInteger(id)) {
          issues.push({ param: 'logit_bias', message: `logit_bias key ${show(key)} is not an integer token id` });
        } else if (seen.has(id)) {
          issues.push({ param: 'logit_bias', message: `logit_bias names token id ${id} twice (keys ${show(seen.get(id))} and ${show(key)})` });
        } else if (id < 0 || (vocabSize !== undefined && id >= vocabSize)) {
          const range = vocabSize !== undefined ? `[0, ${vocabSize - 1}]` : '>= 0';
          issues.push({ param: 'logit_bias', message: `logit_bias token id ${id} is out of range ${range}` });
        }
        if (Number.isSafeInteger(id) && !seen.has(id)) seen.set(id, key);
        if (typeof value !== 'number' || !Number.isFinite(value) || value < -100 || value > 100) {
          issues.push({
            param: 'logit_bias',
            message: `logit_bias value for token ${show(key)} must be a number in [-100, 100], got ${show(value)}`,
          });
        }
      }
    }
  }
  return issues;
}

/** Validates then resolves; throws SamplingParamsError listing every issue. */
export function assertValidSamplingParams(input: SamplingParamsInput, vocabSize?: number): SamplingParams {
  const issues = validateSamplingParams(input, vocabSize);
  if (issues.length > 0) throw new SamplingParamsError(issues);
  const params = resolveSamplingParams(input);
  if (params.logitBias.size > 0) markValidatedBias(params.logitBias, vocabSize);
  return params;
}

/**
 * The resolved map of a logit_bias that validateSamplingParams found valid against `vocabSize`,
 * marked so: the sequences of one request (n, several prompts) then share it, and their Samplers
 * neither validate nor copy it again.
 */
export function validatedLogitBias(bias: NonNullable<SamplingParamsInput['logitBias']>, vocabSize: number | undefined): ReadonlyMap<number, number> {
  if (isValidatedBias(bias, vocabSize)) return bias;
  const map = resolveSamplingParams({ logitBias: bias }).logitBias;
  markValidatedBias(map, vocabSize);
  return map;
}
