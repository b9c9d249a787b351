// Per-request sampling parameters: the engine-side, fully resolved form.
//
// Wire formats (OpenAI snake_case, CLI flags) are mapped onto this by the server/CLI; this layer
// only knows camelCase fields with their "off" values spelled out, so every transform can test
// "is it on?" without knowing which API the request came from.

/** Fully resolved parameters. Every field has a concrete value; "off" values are listed per field. */
export interface SamplingParams {
  /** 0 = greedy (argmax of the penalised/biased logits). */
  temperature: number;
  /** 0 or -1 = off; otherwise keep the k highest logits (ties with the k-th are kept too). */
  topK: number;
  /** 1 = off; otherwise keep the smallest head of the distribution whose mass reaches topP. */
  topP: number;
  /** 0 = off; otherwise drop tokens whose probability is below minP * (probability of the best). */
  minP: number;
  /** 1 = off. HF semantics over prompt+output tokens: logit > 0 ? logit / p : logit * p. */
  repetitionPenalty: number;
  /** 0 = off. OpenAI semantics over generated tokens only: logit -= presence * (count > 0). */
  presencePenalty: number;
  /** 0 = off. OpenAI semantics over generated tokens only: logit -= frequency * count. */
  frequencyPenalty: number;
  /** token id -> bias added to the raw logit. Empty = off. */
  logitBias: ReadonlyMap<number, number>;
  /** Same seed -> same tokens for the same logits. Undefined = seeded from crypto randomness. */
  seed?: number;
}

/** What callers may pass: any subset, logit bias as a Map or a JSON-style record. */
export type SamplingParamsInput = Partial<Omit<SamplingParams, 'logitBias'>> & {
  logitBias?: ReadonlyMap<number, number> | Readonly<Record<string | number, number>>;
};

/** OpenAI's defaults: temperature 1 and every other transform off. */
export const DEFAULT_SAMPLING_PARAMS: Readonly<SamplingParams> = Object.freeze({
  temperature: 1,
  topK: 0,
  topP: 1,
  minP: 0,
  repetitionPenalty: 1,
  presencePenalty: 0,
  frequencyPenalty: 0,
  logitBias: new Map<number, number>(),
});

/**
 * Fills defaults and normalises logit bias keys to numbers. Does not validate: call
 * `validateSamplingParams` on the result (the Sampler constructor does).
 * A record key that is not an integer string becomes NaN, which validation then reports.
 */
/**
 * Resolved logit_bias maps whose entries were validated, and the vocabulary size they were
 * validated against (undefined: integrality only). Such a map is never changed (SamplingParams
 * hands it out read-only), so the n sequences of one request, each with its own Sampler, share
 * it: neither validated nor copied again (a whole-vocabulary bias on n 16 was 16 passes of both).
 */
const validatedBiases = new WeakMap<ReadonlyMap<number, number>, number | undefined>();

/** Marks `map` as validated against `vocabSize` (validate.ts, or a text worker that validated the request). */
export function markValidatedBias(map: ReadonlyMap<number, number>, vocabSize: number | undefined): void {
  validatedBiases.set(map, vocabSize);
}

/** True when `bias` is a resolved map validated against `vocabSize`. */
export function isValidatedBias(bias: unknown, vocabSize: number | undefined): bias is ReadonlyMap<number, number> {
  return bias instanceof Map && validatedBiases.has(bias) && validatedBiases.get(bias) === vocabSize;
}

export function resolveSamplingParams(input: SamplingParamsInput = {}): SamplingParams {
  const out: SamplingParams = { ...DEFAULT_SAMPLING_PARAMS, logitBias: new Map() };
  for (const key of Object.keys(input) as (keyof SamplingParamsInput)[]) {
    const v = input[key];
    if (v === undefined || key === 'logitBias') continue;
    (out as unknown as Record<string, unknown>)[key] = v;
  }
  const bias = input.logitBias;
  if (bias instanceof Map && validatedBiases.has(bias)) out.logitBias = bias;
  else if (bias !== undefined) {
    const map = new Map<number, number>();
    const entries: Iterable<[string | number, number]> =
      bias instanceof Map ? bias.entries() : Object.entries(bias);
    for (const [k, v] of entries) map.set(typeof k === 'number' ? k : /^-?\d+$/.test(k) ? Number(k) : NaN, v);
    out.logitBias = map;
  }
  return out;
}

/** True when sampling reduces to argmax. */
export function isGreedy(p: SamplingParams): boolean {
  return p.temperature === 0;
}

/** True when top-k keeps fewer than `vocabSize` tokens. */
export function topKActive(topK: number, vocabSize: number): boolean {
  return topK > 0 && topK < vocabSize;
}
