// The request parameters /v1/chat/completions and /v1/completions share: sampling, stop, n,
// streaming options, token limits, and the parameters this build refuses because it does not
// implement them yet (refused with a 400, never silently ignored).

import { resolveSpeculative, type SpeculativeOptions } from '../execution/methods/speculative.ts';
import type { EngineRequest } from '../execution/sequence.ts';
import { validatedLogitBias, validateSamplingParams, type SamplingParamsInput } from '../sampling/index.ts';
import { HttpError, badRequest, notSupported } from './http-error.ts';
import { isObject, type Fields, type Json } from './fields.ts';
import type { ServedModel } from './served-model.ts';
import { idList, type ModelFacts, type PromptIds } from './request-model.ts';
import type { SeqPlan } from './run.ts';
import type { CompiledGrammar } from '../sampling/grammar/index.ts';
import { parseConstraint, type Constraint } from './structured.ts';
import type { SpeculationCounts } from '../execution/methods/method.ts';

export const MAX_N = 128;
export const MAX_STOPS = 64;
export const MAX_TOP_LOGPROBS = 20;
/** sequences one request may start (n x prompts) */
export const MAX_SEQUENCES_PER_REQUEST = 256;

export interface GenerationParams {
  n: number;
  stream: boolean;
  includeUsage: boolean;
  /** explicit limit (max_completion_tokens or max_tokens); undefined = up to the context */
  maxTokens?: number;
  sampling: SamplingParamsInput;
  stop: string[];
  ignoreEos: boolean;
  /** undefined = no logprobs */
  topLogprobs?: number;
  /** vLLM's return_tokens_as_token_ids: logprobs name tokens as "token_id:N" */
  tokensAsIds?: boolean;
  /** response_format / guided_* / structured_outputs */
  constraint?: Constraint;
  /** llmts's `speculative`: this request's speculative decoding, or false for none (default: the server's) */
  speculative?: SpeculativeOptions | false;
}

/** `model` may be omitted (the one served model); otherwise it must be the served name. */
export function checkModel(f: Fields, model: Pick<ModelFacts, 'name'>): void {
  const name = f.string('model');
  if (name !== undefined && name !== model.name)
    throw new HttpError(404, `the model "${name}" does not exist; this server serves "${model.name}"`, { param: 'model', code: 'model_not_found' });
}

/** Parameters the contract names (or clients commonly send) that this build cannot honour yet. */
function refuseUnsupported(f: Fields, kind: 'chat' | 'completions'): void {
  // chat reads tools, tool_choice, functions (refused there) in structured.ts
  if (kind === 'completions') {
    const tools = f.raw('tools');
    if (tools !== undefined) {
      if (!Array.isArray(tools)) throw badRequest('tools must be an array', 'tools');
      if (tools.length > 0) throw badRequest('tools are only supported on /v1/chat/completions', 'tools');
    }
    const toolChoice = f.raw('tool_choice');
    if (toolChoice !== undefined && toolChoice !== 'none') throw badRequest('tool_choice is only supported on /v1/chat/completions', 'tool_choice');
    for (const p of ['functions', 'function_call']) if (f.has(p)) throw notSupported(p, p);
  }
  for (const p of ['prompt_logprobs', 'audio'])
    if (f.has(p)) throw notSupported(p, p);
  checkPrediction(f.raw('prediction'));
  const stopIds = f.array('stop_token_ids');
  if (stopIds && stopIds.length > 0) throw notSupported('stop_token_ids', 'stop_token_ids');
  if ((f.number('min_tokens', { integer: true, min: 0 }) ?? 0) > 0) throw notSupported('min_tokens', 'min_tokens');
  if (f.boolean('use_beam_search')) throw notSupported('use_beam_search', 'use_beam_search');
  if (f.boolean('include_stop_str_in_output')) throw notSupported('include_stop_str_in_output', 'include_stop_str_in_output');
  if (f.boolean('skip_special_tokens') === false) throw notSupported('skip_special_tokens: false', 'skip_special_tokens');
  if (f.boolean('echo')) throw notSupported('echo', 'echo');
  const modalities = f.array('modalities');
  if (modalities && modalities.some((m) => m !== 'text')) throw notSupported('modalities other than "text"', 'modalities');
  if (kind === 'completions') {
    const suffix = f.string('suffix');
    if (suffix) throw notSupported('suffix', 'suffix');
  }
}

export function parseGenerationParams(f: Fields, model: Pick<ModelFacts, 'vocabSize' | 'samplingDefaults' | 'grammarLimits'>, kind: 'chat' | 'completions'): GenerationParams {
  refuseUnsupported(f, kind);
  const n = f.number('n', { integer: true, min: 1, max: MAX_N }) ?? 1;
  if (kind === 'completions') {
    const bestOf = f.number('best_of', { integer: true, min: 1 });
    if (bestOf !== undefined && bestOf !== n) throw notSupported('best_of other than n', 'best_of');
  }
  const stream = f.boolean('stream') ?? false;
  const opts = f.object('stream_options');
  if (opts && !stream) throw badRequest('stream_options is only allowed when stream is true', 'stream_options');
  const includeUsage = opts?.boolean('include_usage') ?? false;
  opts?.boolean('continuous_usage_stats');

  const limit = { integer: true, min: 1 };
  const maxTokens = f.number('max_completion_tokens', limit) ?? f.number('max_tokens', limit);

  let topLogprobs: number | undefined;
  if (kind === 'chat') {
    const logprobs = f.boolean('logprobs') ?? false;
    const top = f.number('top_logprobs', { integer: true, min: 0, max: MAX_TOP_LOGPROBS });
    if (top !== undefined && !logprobs) throw badRequest('top_logprobs requires logprobs to be true', 'top_logprobs');
    topLogprobs = logprobs ? (top ?? 0) : undefined;
  } else {
    topLogprobs = f.number('logprobs', { integer: true, min: 0, max: MAX_TOP_LOGPROBS });
  }

  const num = (name: string, integer = false) => f.number(name, { integer });
  const bias = f.raw('logit_bias');
  if (bias !== undefined && !isObject(bias)) throw badRequest('logit_bias must be an object mapping token ids to biases', 'logit_bias');
  // each token once at most: a longer map is refused before its entries are checked one by one
  const biased = bias === undefined ? 0 : Object.keys(bias).length;
  if (biased > model.vocabSize) throw badRequest(`logit_bias has ${biased} entries; the vocabulary has ${model.vocabSize} tokens`, 'logit_bias');
  const explicit: SamplingParamsInput = {
    temperature: num('temperature'),
    topP: num('top_p'),
    topK: num('top_k', true),
    minP: num('min_p'),
    presencePenalty: num('presence_penalty'),
    frequencyPenalty: num('frequency_penalty'),
    repetitionPenalty: num('repetition_penalty'),
    seed: num('seed', true),
    logitBias: bias as Record<string, number> | undefined,
  };
  const sampling: SamplingParamsInput = { ...model.samplingDefaults };
  for (const [k, v] of Object.entries(explicit)) if (v !== undefined) (sampling as Record<string, unknown>)[k] = v;
  const issues = validateSamplingParams(sampling, model.vocabSize);
  if (issues.length > 0) throw badRequest(issuesText(issues), issues[0].param);
  // resolved once: the request's sequences share it (their Samplers neither check nor copy it again)
  if (sampling.logitBias !== undefined) sampling.logitBias = validatedLogitBias(sampling.logitBias, model.vocabSize);

  return {
    n, stream, includeUsage, maxTokens, sampling,
    stop: f.stringList('stop', MAX_STOPS) ?? [],
    ignoreEos: f.boolean('ignore_eos') ?? false,
    topLogprobs,
    ...(f.boolean('return_tokens_as_token_ids') ? { tokensAsIds: true } : {}),
    ...speculativeParam(f.raw('speculative')),
    constraint: parseConstraint(f, model.grammarLimits),
  };
}

/**
 * `speculative`: false (no speculation for this request), or `{ "proposer": "ngram" | "draft" |
 * "eagle3", "num_draft_tokens": N | "adaptive", "ngram_min": N, "ngram_max": N }` (each field
 * optional; the proposer is "ngram" unless given). A proposer the server has no
 * drafter for is refused at submit.
 */
export function speculativeParam(raw: unknown): { speculative?: SpeculativeOptions | false } {
  if (raw === undefined || raw === null) return {};
  if (raw === false) return { speculative: false };
  if (!isObject(raw)) throw badRequest('speculative must be false or an object ({"proposer", "num_draft_tokens", "ngram_min", "ngram_max"})', 'speculative');
  const known = ['proposer', 'num_draft_tokens', 'ngram_min', 'ngram_max'];
  const unknown = Object.keys(raw).filter((k) => !known.includes(k));
  if (unknown.length > 0) throw badRequest(`speculative: unknown field ${JSON.stringify(unknown[0])} (known: ${known.join(', ')})`, 'speculative');
  const r = raw as Record<string, unknown>;
  if (r.proposer !== undefined && r.proposer !== 'ngram' && r.proposer !== 'draft' && r.proposer !== 'eagle3')
    throw badRequest(`speculative.proposer must be "ngram", "draft" or "eagle3", got ${JSON.stringify(r.proposer)}`, 'speculative');
  const o = {
    proposer: (r.proposer ?? 'ngram') as 'ngram' | 'draft' | 'eagle3',
    ...(r.num_draft_tokens !== undefined ? { numDraftTokens: r.num_draft_tokens as number | 'adaptive' } : {}),
    ...(r.ngram_min !== undefined ? { ngramMin: r.ngram_min as number } : {}),
    ...(r.ngram_max !== undefined ? { ngramMax: r.ngram_max as number } : {}),
  };
  try {
    resolveSpeculative(o);
  } catch (err) {
    const msg = (err as Error).message.replace('numDraftTokens', 'num_draft_tokens').replace(/ngramMin/g, 'ngram_min').replace(/ngramMax/g, 'ngram_max');
    throw badRequest(msg, 'speculative');
  }
  return { speculative: o };
}

/**
 * The engine requests for prompts x n choices. Choice index = promptIndex * n + i (OpenAI); with a
 * seed, choice i of a prompt uses seed + i so the choices differ yet repeat run to run. Without
 * max_tokens a sequence may fill the context; an explicit max_tokens is capped to it.
 */
export function planSequences(prompts: readonly PromptIds[], p: GenerationParams, model: Pick<ModelFacts, 'contextLen'>, grammar?: CompiledGrammar): SeqPlan[] {
  if (prompts.length * p.n > MAX_SEQUENCES_PER_REQUEST)
    throw badRequest(`the request asks for ${prompts.length * p.n} sequences (prompts x n); at most ${MAX_SEQUENCES_PER_REQUEST} are allowed`, 'n');
  const plans: SeqPlan[] = [];
  prompts.forEach((ids, promptIndex) => {
    if (ids.length === 0) throw badRequest('the prompt is empty', 'prompt');
    const room = model.contextLen - ids.length;
    if (room < 1) throw promptTooLong(ids.length, model.contextLen);
    // converted only now: a prompt refused above is never copied into a list
    const promptIds = idList(ids);
    for (let i = 0; i < p.n; i++) {
      const seed = p.sampling.seed;
      const request: EngineRequest = {
        promptIds,
        maxTokens: Math.min(p.maxTokens ?? room, room),
        sampling: seed === undefined ? p.sampling : { ...p.sampling, seed: seed + i },
        stop: p.stop,
        ignoreEos: p.ignoreEos,
        topLogprobs: p.topLogprobs,
        ...(p.speculative !== undefined ? { speculative: p.speculative } : {}),
        // one matcher per sequence, started when the engine creates it
        ...(grammar ? { grammar: { createMatcher: () => grammar.createMatcher() } } : {}),
      };
      plans.push({ promptIndex, request });
    }
  });
  return plans;
}

/** The 400 for a prompt that leaves the context no room for a generated token. */
export function promptTooLong(tokens: number, contextLen: number, param?: string): HttpError {
  return badRequest(`the prompt has ${tokens} tokens, but this model's context holds ${contextLen} tokens (prompt + at least 1 generated token)`,
    param, 'context_length_exceeded');
}

/** vLLM's stop_reason: the stop string or eos token id that ended a 'stop' finish, else null */
export function stopReasonOf(
  model: ServedModel, request: EngineRequest, tokenIds: readonly number[], text: string, finish: string,
): string | number | null {
  if (finish !== 'stop') return null;
  const last = tokenIds[tokenIds.length - 1];
  if (last !== undefined && !request.ignoreEos && model.eosIds.has(last)) return last;
  const stops = (request.stop ?? []).filter((s) => s.length > 0);
  if (stops.length === 0) return null;
  const full = model.decode(tokenIds);
  const rest = full.startsWith(text) ? full.slice(text.length) : full;
  return stops.find((s) => rest.startsWith(s)) ?? stops.find((s) => rest.includes(s)) ?? stops[0];
}

export const finishReasonOf = (reason: string): string => (reason === 'cancelled' ? 'abort' : reason);

/**
 * OpenAI usage; `cachedTokens`: prompt tokens served from the prefix cache (run.ts cachedTokensOf);
 * `speculation`: draft tokens verified and accepted (run.ts speculationOf), when the request speculated
 */
export function usageOf(promptTokens: number, completionTokens: number, cachedTokens = 0, speculation?: SpeculationCounts) {
  return {
    prompt_tokens: promptTokens,
    completion_tokens: completionTokens,
    total_tokens: promptTokens + completionTokens,
    prompt_tokens_details: { cached_tokens: cachedTokens },
    ...(speculation ? { speculation: { draft_tokens: speculation.draftTokens, accepted_tokens: speculation.acceptedTokens } } : {}),
  };
}

/** The first few issues' messages (a map of thousands of bad logit_bias entries is not echoed whole). */
function issuesText(issues: readonly { message: string }[], most = 10): string {
  const shown = issues.slice(0, most).map((i) => i.message).join('; ');
  return issues.length > most ? `${shown}; and ${issues.length - most} more` : shown;
}

/**
 * prediction (OpenAI's predicted outputs: `{"type": "content", "content": text or text parts}`):
 * checked and accepted; it only ever changes speed, and llmts does not draft from it yet.
 */
function checkPrediction(v: Json | undefined): void {
  if (v === undefined || v === null) return;
  if (!isObject(v) || v.type !== 'content') throw badRequest('prediction must be {"type": "content", "content": ...}', 'prediction');
  const c = v.content;
  const ok = typeof c === 'string' || (Array.isArray(c) && c.every((p) => isObject(p) && p.type === 'text' && typeof p.text === 'string'));
  if (!ok) throw badRequest('prediction.content must be a string or an array of text parts', 'prediction');
}
