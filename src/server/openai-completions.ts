// POST /v1/completions (OpenAI legacy completions): raw prompts, no chat template. `prompt` is a
// string, a list of strings, a list of token ids, or a list of token-id lists; each prompt gets
// n choices (choice index = prompt index * n + i).

import { badRequest } from './errors.ts';
import { Fields, type Json, type JsonObject } from './fields.ts';
import { sendJson } from './http-io.ts';
import { newId, nowSeconds, type HandlerContext } from './context.ts';
import { cachedTokensOf } from './run.ts';
import { completeChoices, streamChoices } from './openai-choices.ts';
import { legacyLogprobs } from './logprobs-format.ts';
import { checkModel, finishReasonOf, parseGenerationParams, planSequences, stopReasonOf, usageOf } from './openai-params.ts';
import type { ServedModel } from './served-model.ts';
import { compileConstraint } from './structured.ts';

const MAX_PROMPTS = 256;

function tokenIds(list: Json[], where: string, vocab: number): number[] {
  if (list.length === 0) throw badRequest(`${where} must not be empty`, 'prompt');
  return list.map((id, k) => {
    if (typeof id !== 'number' || !Number.isInteger(id)) throw badRequest(`${where}[${k}] must be an integer token id`, 'prompt');
    if (id < 0 || id >= vocab) throw badRequest(`${where}[${k}] = ${id} is outside the vocabulary [0, ${vocab})`, 'prompt');
    return id;
  });
}

/** every accepted prompt form -> token id lists (text prompts tokenized off the event loop when large: ServedModel.encodePrompts) */
export async function parsePrompts(raw: Json | undefined, model: ServedModel, signal?: AbortSignal): Promise<number[][]> {
  if (raw === undefined) throw badRequest('prompt is required', 'prompt');
  const shape = 'prompt must be a string, an array of strings, an array of token ids, or an array of token-id arrays';
  if (typeof raw === 'string') return model.encodePrompts([raw], signal);
  if (!Array.isArray(raw)) throw badRequest(shape, 'prompt');
  if (raw.length === 0) throw badRequest('prompt must not be empty', 'prompt');
  // a flat list of numbers is ONE prompt of token ids (as long as the context allows)
  if (raw.every((x) => typeof x === 'number')) return [tokenIds(raw, 'prompt', model.vocabSize)];
  if (raw.length > MAX_PROMPTS) throw badRequest(`prompt has ${raw.length} prompts; at most ${MAX_PROMPTS} are allowed`, 'prompt');
  if (raw.every((x) => typeof x === 'string')) return model.encodePrompts(raw as string[], signal);
  if (raw.every((x) => Array.isArray(x))) return (raw as Json[][]).map((ids, i) => tokenIds(ids, `prompt[${i}]`, model.vocabSize));
  throw badRequest(shape, 'prompt');
}

export async function handleCompletions(ctx: HandlerContext, body: JsonObject): Promise<void> {
  const f = new Fields(body);
  checkModel(f, ctx.model);
  const p = parseGenerationParams(f, ctx.model, 'completions');
  const prompts = await parsePrompts(f.raw('prompt'), ctx.model, ctx.signal);
  const grammar = p.constraint ? await compileConstraint(ctx.model, p.constraint) : undefined;
  try {
    await respond(ctx, p, prompts, planSequences(prompts, p, ctx.model, grammar));
  } finally {
    grammar?.release();
  }
}

async function respond(ctx: HandlerContext, p: ReturnType<typeof parseGenerationParams>, prompts: number[][], plans: ReturnType<typeof planSequences>): Promise<void> {
  const model = ctx.model;
  const promptTokens = prompts.reduce((a, ids) => a + ids.length, 0);

  if (!p.stream) {
    const results = await completeChoices(ctx, plans);
    if (!results) return;
    let completionTokens = 0;
    const choices = results.map((r, index) => {
      completionTokens += r.completionTokens;
      return {
        index,
        text: r.text,
        logprobs: p.topLogprobs === undefined ? null : legacyLogprobs(model.tokens, r.logprobs, r.textOffsets),
        finish_reason: finishReasonOf(r.finishReason),
        stop_reason: stopReasonOf(model, plans[index].request, r.tokenIds, r.text, r.finishReason),
      };
    });
    sendJson(ctx.res, 200, {
      id: newId('cmpl-'), object: 'text_completion', created: nowSeconds(), model: model.name, choices,
      usage: usageOf(promptTokens, completionTokens, cachedTokensOf(plans, results.map((r) => r.cachedTokens))),
    });
    return;
  }

  await streamChoices(ctx, plans, {
    route: 'POST /v1/completions (stream)', idPrefix: 'cmpl-', object: 'text_completion', includeUsage: p.includeUsage, promptTokens,
    token: (index, e, so) => {
      const logprobs = p.topLogprobs !== undefined && e.logprobs ? legacyLogprobs(model.tokens, [e.logprobs], [so.text.length]) : null;
      return e.text || logprobs ? { index, text: e.text, logprobs, finish_reason: null } : undefined;
    },
    finish: (index, e, so) => ({
      index, text: e.text, logprobs: null,
      finish_reason: finishReasonOf(e.finishReason),
      stop_reason: stopReasonOf(model, plans[index].request, so.tokenIds, so.text, e.finishReason),
    }),
  });
}
