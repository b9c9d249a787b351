// POST /v1/messages (Anthropic Messages API), streaming and not. The system prompt becomes a
// leading system message; a final assistant message is a prefill that the reply continues (its
// text is not repeated in the reply). Errors use Anthropic's shape (see server.ts).

import type { ChatMessage } from '../artifacts/chat-template.ts';
import type { EngineRequest } from '../execution/sequence.ts';
import { validateSamplingParams, type SamplingParamsInput } from '../sampling/index.ts';
import { badRequest, notSupported } from './errors.ts';
import { Fields, isObject, type Json, type JsonObject } from './fields.ts';
import { SseWriter, sendJson } from './http-io.ts';
import { newId, streamFailed, type HandlerContext } from './context.ts';
import { runToCompletion, startStreams, type SeqPlan } from './run.ts';
import { ClientGoneError } from './http-io.ts';
import { checkModel, MAX_STOPS } from './openai-params.ts';
import type { ServedModel } from './served-model.ts';

const kind = (v: unknown): string => (v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v);

/** a string or a list of text blocks -> text */
function blocksText(v: Json | undefined, where: string, param: string): string {
  if (typeof v === 'string') return v;
  if (!Array.isArray(v)) throw badRequest(`${where} must be a string or an array of content blocks, got ${kind(v)}`, param);
  return v.map((b, j) => {
    if (!isObject(b) || typeof b.type !== 'string') throw badRequest(`${where}[${j}] must be a content block object with a "type"`, param);
    if (b.type !== 'text') throw notSupported(`content block type "${b.type}" (${where}[${j}])`, param);
    if (typeof b.text !== 'string') throw badRequest(`${where}[${j}].text must be a string, got ${kind(b.text)}`, param);
    return b.text;
  }).join('\n');
}

export interface MessagesRequest {
  messages: ChatMessage[];
  /** the last message is an assistant prefill */
  prefill: boolean;
  maxTokens: number;
  sampling: SamplingParamsInput;
  stop: string[];
  stream: boolean;
}

export function parseMessagesRequest(body: JsonObject, model: ServedModel): MessagesRequest {
  const f = new Fields(body);
  checkModel(f, model);
  const maxTokens = f.number('max_tokens', { integer: true, min: 1 });
  if (maxTokens === undefined) throw badRequest('max_tokens is required', 'max_tokens');
  const raw = f.array('messages');
  if (raw === undefined) throw badRequest('messages is required', 'messages');
  if (raw.length === 0) throw badRequest('messages must not be empty', 'messages');
  const messages: ChatMessage[] = [];
  const system = f.raw('system');
  if (system !== undefined) messages.push({ role: 'system', content: blocksText(system, 'system', 'system') });
  raw.forEach((m, i) => {
    const where = `messages[${i}]`;
    if (!isObject(m)) throw badRequest(`${where} must be an object, got ${kind(m)}`, 'messages');
    if (m.role !== 'user' && m.role !== 'assistant') throw badRequest(`${where}.role must be "user" or "assistant", got ${JSON.stringify(m.role ?? null)}`, 'messages');
    messages.push({ role: m.role, content: blocksText(m.content, `${where}.content`, 'messages') });
  });
  let prefill = messages[messages.length - 1].role === 'assistant';
  if (prefill && (messages[messages.length - 1].content as string).trim() === '') {
    messages.pop(); // an empty prefill is no prefill
    prefill = false;
  }
  if (messages.length === 0 || messages.every((m) => m.role === 'system')) throw badRequest('messages must contain a user message', 'messages');

  const tools = f.array('tools');
  if (tools && tools.length > 0) throw notSupported('tools', 'tools');
  const toolChoice = f.object('tool_choice');
  if (toolChoice && toolChoice.raw('type') !== 'none') throw notSupported(`tool_choice ${JSON.stringify(toolChoice.raw('type') ?? null)}`, 'tool_choice');
  const thinking = f.object('thinking');
  const mode = thinking?.raw('type');
  if (thinking && mode !== 'disabled' && mode !== 'adaptive') throw notSupported(`thinking ${JSON.stringify(mode ?? null)}`, 'thinking');
  if (f.object('output_config')?.has('format')) throw notSupported('output_config.format (structured outputs)', 'output_config');
  f.object('metadata');

  const explicit: SamplingParamsInput = {
    temperature: f.number('temperature', { min: 0, max: 1 }),
    topP: f.number('top_p'),
    topK: f.number('top_k', { integer: true, min: 0 }),
  };
  const sampling: SamplingParamsInput = { ...model.samplingDefaults };
  for (const [k, v] of Object.entries(explicit)) if (v !== undefined) (sampling as Record<string, unknown>)[k] = v;
  const issues = validateSamplingParams(sampling, model.vocabSize);
  if (issues.length > 0) throw badRequest(issues.map((i) => i.message).join('; '), issues[0].param);
  const stopRaw = f.array('stop_sequences') ?? [];
  if (stopRaw.length > MAX_STOPS) throw badRequest(`stop_sequences has ${stopRaw.length} entries; at most ${MAX_STOPS} are allowed`, 'stop_sequences');
  const stop = stopRaw.map((s, i) => {
    if (typeof s !== 'string') throw badRequest(`stop_sequences[${i}] must be a string, got ${kind(s)}`, 'stop_sequences');
    return s;
  });
  return { messages, prefill, maxTokens, sampling, stop, stream: f.boolean('stream') ?? false };
}

type StopReason = 'end_turn' | 'max_tokens' | 'stop_sequence';

/** Anthropic's stop_reason and stop_sequence for a finished sequence */
export function anthropicStop(model: ServedModel, request: EngineRequest, tokenIds: readonly number[], text: string, finish: string): { stop_reason: StopReason; stop_sequence: string | null } {
  if (finish === 'length') return { stop_reason: 'max_tokens', stop_sequence: null };
  const last = tokenIds[tokenIds.length - 1];
  const stops = (request.stop ?? []).filter((s) => s.length > 0);
  if (finish !== 'stop' || stops.length === 0 || (last !== undefined && model.eosIds.has(last))) return { stop_reason: 'end_turn', stop_sequence: null };
  const full = model.decode(tokenIds);
  const rest = full.startsWith(text) ? full.slice(text.length) : full;
  const hit = stops.find((s) => rest.startsWith(s)) ?? stops.find((s) => rest.includes(s)) ?? stops[0];
  return { stop_reason: 'stop_sequence', stop_sequence: hit };
}

const usage = (input: number, output: number) => ({
  input_tokens: input, output_tokens: output, cache_creation_input_tokens: 0, cache_read_input_tokens: 0,
});

export async function handleMessages(ctx: HandlerContext, body: JsonObject): Promise<void> {
  const model = ctx.model;
  const req = parseMessagesRequest(body, model);
  const rendered = model.renderChat(req.messages, { continueFinal: req.prefill });
  const promptIds = rendered.ids;
  const room = model.contextLen - promptIds.length;
  if (promptIds.length === 0) throw badRequest('the prompt is empty', 'messages');
  if (room < 1)
    throw badRequest(`the prompt has ${promptIds.length} tokens, but this model's context holds ${model.contextLen} tokens (prompt + at least 1 generated token)`, 'messages');
  const request: EngineRequest = { promptIds, maxTokens: Math.min(req.maxTokens, room), sampling: req.sampling, stop: req.stop };
  const plans: SeqPlan[] = [{ promptIndex: 0, request }];
  const id = newId('msg_');
  const message = (content: unknown[], stop: { stop_reason: StopReason | null; stop_sequence: string | null }, out: number) => ({
    id, type: 'message', role: 'assistant', model: model.name, content, ...stop, usage: usage(promptIds.length, out),
  });

  if (!req.stream) {
    const [r] = await runToCompletion(ctx, plans);
    if (r.finishReason === 'error') throw new Error(`generation failed: ${r.error ?? 'unknown error'}`);
    if (r.finishReason === 'cancelled' && ctx.signal.aborted) return;
    sendJson(ctx.res, 200, message([{ type: 'text', text: r.text }], anthropicStop(model, request, r.tokenIds, r.text, r.finishReason), r.completionTokens));
    return;
  }

  const run = startStreams(ctx, plans);
  const sse = new SseWriter(ctx.res);
  sse.start();
  const tokenIds: number[] = [];
  let text = '';
  try {
    await sse.send({ type: 'message_start', message: message([], { stop_reason: null, stop_sequence: null }, 0) }, 'message_start');
    await sse.send({ type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }, 'content_block_start');
    await sse.send({ type: 'ping' }, 'ping');
    const delta = (t: string) => sse.send({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: t } }, 'content_block_delta');
    await run(async (_i, e) => {
      if (e.type === 'token') {
        tokenIds.push(e.tokenId);
        text += e.text;
        if (e.text) await delta(e.text);
        return;
      }
      if (e.finishReason === 'error') {
        ctx.logError('POST /v1/messages (stream)', new Error(e.error ?? 'generation failed'));
        await sse.send({ type: 'error', error: { type: 'api_error', message: `generation failed: ${e.error ?? 'unknown error'}` } }, 'error');
        return;
      }
      text += e.text;
      if (e.text) await delta(e.text);
      await sse.send({ type: 'content_block_stop', index: 0 }, 'content_block_stop');
      const stop = e.finishReason === 'cancelled'
        ? { stop_reason: 'end_turn' as const, stop_sequence: null }
        : anthropicStop(model, request, tokenIds, text, e.finishReason);
      await sse.send({ type: 'message_delta', delta: stop, usage: { output_tokens: e.completionTokens } }, 'message_delta');
      await sse.send({ type: 'message_stop' }, 'message_stop');
    }, (err) => err instanceof ClientGoneError);
  } catch (err) {
    await streamFailed(ctx, sse, 'POST /v1/messages (stream)', err, true);
  } finally {
    sse.end();
  }
}

/** POST /v1/messages/count_tokens: the prompt's length as /v1/messages would render it */
export async function handleCountTokens(ctx: HandlerContext, body: JsonObject): Promise<void> {
  const req = parseMessagesRequest({ max_tokens: 1, ...body }, ctx.model);
  const { ids } = ctx.model.renderChat(req.messages, { continueFinal: req.prefill });
  sendJson(ctx.res, 200, { input_tokens: ids.length });
}
