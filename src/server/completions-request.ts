// A /v1/completions body, validated and turned into prompt ids: the parameters, and every
// accepted prompt form as token ids (texts tokenized). The same code runs on the event loop for a
// small body and on a text worker for a large one (request-prep.ts), so both refuse with the same
// 400s.

import { badRequest } from './http-error.ts';
import { Fields, type Json, type JsonObject } from './fields.ts';
import { checkModel, parseGenerationParams, type GenerationParams } from './openai-params.ts';
import type { PromptIds, RequestModel } from './request-model.ts';

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
export async function parsePrompts(raw: Json | undefined, model: Pick<RequestModel, 'vocabSize' | 'encodePrompts'>, signal?: AbortSignal): Promise<PromptIds[]> {
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

export interface PreparedCompletions {
  route: 'completions';
  params: GenerationParams;
  prompts: PromptIds[];
}

/** Everything about a completions request that needs neither the grammar compiler nor the engine. */
export async function prepareCompletions(body: JsonObject, model: RequestModel, signal?: AbortSignal): Promise<PreparedCompletions> {
  const f = new Fields(body);
  checkModel(f, model);
  const params = parseGenerationParams(f, model, 'completions');
  const prompts = await parsePrompts(f.raw('prompt'), model, signal);
  return { route: 'completions', params, prompts };
}
