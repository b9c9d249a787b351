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
import { GrammarSpecError } from '../sampling/grammar/index.ts';
import { checkToolSchemas, compileConstraint, parseAnthropicTools, planTools, toolMessages, type Constraint, type ToolPlan } from './structured.ts';
import type { ToolCallParser } from '../generation/tool-calls/index.ts';

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

/** a tool_result's content: a string or text blocks */
function toolResultText(v: Json | undefined, where: string): string {
  if (v === undefined || v === null) return '';
  return blocksText(v, where, 'messages');
}

/**
 * One Anthropic message as template messages: text blocks joined; an assistant's tool_use blocks
 * become OpenAI-style tool_calls; a user's tool_result blocks become `tool` messages (before the
 * user's own text, as Anthropic requires results to come first).
 */
function convertMessage(role: 'user' | 'assistant', content: Json | undefined, where: string): ChatMessage[] {
  if (typeof content === 'string') return [{ role, content }];
  if (!Array.isArray(content)) throw badRequest(`${where} must be a string or an array of content blocks, got ${kind(content)}`, 'messages');
  const texts: string[] = [];
  const calls: unknown[] = [];
  const results: ChatMessage[] = [];
  content.forEach((b, j) => {
    const at = `${where}[${j}]`;
    if (!isObject(b) || typeof b.type !== 'string') throw badRequest(`${at} must be a content block object with a "type"`, 'messages');
    if (b.type === 'text') {
      if (typeof b.text !== 'string') throw badRequest(`${at}.text must be a string, got ${kind(b.text)}`, 'messages');
      texts.push(b.text);
    } else if (b.type === 'tool_use' && role === 'assistant') {
      if (typeof b.id !== 'string' || typeof b.name !== 'string') throw badRequest(`${at} (tool_use) needs a string id and name`, 'messages');
      calls.push({ id: b.id, type: 'function', function: { name: b.name, arguments: JSON.stringify(b.input ?? {}) } });
    } else if (b.type === 'tool_result' && role === 'user') {
      if (typeof b.tool_use_id !== 'string') throw badRequest(`${at}.tool_use_id must be a string`, 'messages');
      const text = toolResultText(b.content, `${at}.content`);
      results.push({ role: 'tool', tool_call_id: b.tool_use_id, content: b.is_error === true ? `Error: ${text}` : text });
    } else throw notSupported(`content block type "${b.type}" in a ${role} message (${at})`, 'messages');
  });
  const out: ChatMessage[] = [...results];
  if (calls.length > 0) out.push({ role, content: texts.join('\n'), tool_calls: calls });
  else if (texts.length > 0 || results.length === 0) out.push({ role, content: texts.join('\n') });
  return out;
}

export interface MessagesRequest {
  messages: ChatMessage[];
  /** the last message is an assistant prefill */
  prefill: boolean;
  maxTokens: number;
  sampling: SamplingParamsInput;
  stop: string[];
  stream: boolean;
  tools?: ToolPlan;
  /** output_config.format, or the tools' forcing grammar */
  constraint?: Constraint;
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
    messages.push(...convertMessage(m.role, m.content, `${where}.content`));
  });
  const last = messages[messages.length - 1];
  let prefill = last.role === 'assistant' && last.tool_calls === undefined;
  if (prefill && (messages[messages.length - 1].content as string).trim() === '') {
    messages.pop(); // an empty prefill is no prefill
    prefill = false;
  }
  if (messages.length === 0 || messages.every((m) => m.role === 'system')) throw badRequest('messages must contain a user message', 'messages');

  const tools = planTools(model, parseAnthropicTools(f));
  let constraint: Constraint | undefined = tools?.constraint;
  const thinking = f.object('thinking');
  const mode = thinking?.raw('type');
  if (thinking && mode !== 'disabled' && mode !== 'adaptive') throw notSupported(`thinking ${JSON.stringify(mode ?? null)}`, 'thinking');
  const format = f.object('output_config')?.object('format');
  if (format) {
    if (format.raw('type') !== 'json_schema') throw badRequest('output_config.format.type must be "json_schema"', 'output_config');
    const schema = format.raw('schema');
    if (!isObject(schema)) throw badRequest('output_config.format.schema must be a JSON schema object', 'output_config');
    if (constraint) throw badRequest('output_config.format cannot be combined with a tool_choice that forces a tool', 'output_config');
    constraint = { spec: { type: 'json_schema', schema }, param: 'output_config' };
  }
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
  return { messages, prefill, maxTokens, sampling, stop, stream: f.boolean('stream') ?? false, tools, constraint };
}

type StopReason = 'end_turn' | 'max_tokens' | 'stop_sequence' | 'tool_use';

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

/** Anthropic usage: input_tokens excludes the prompt tokens read from the prefix cache (cache_read_input_tokens) */
const usage = (input: number, output: number, cached = 0) => ({
  input_tokens: input - cached, output_tokens: output, cache_creation_input_tokens: 0, cache_read_input_tokens: cached,
});

/** The conversation as the model's template renders it, tools included. */
function renderMessages(model: ServedModel, req: MessagesRequest, signal: AbortSignal): Promise<{ ids: number[]; text: string }> {
  const { messages, tools } = toolMessages(model, req.messages, req.tools);
  return model.renderChat(messages, { continueFinal: req.prefill, tools }, signal);
}

/** A tool_use block's input: the arguments object (an unparsable one, e.g. cut by max_tokens, is {}). */
function toolInput(args: string): unknown {
  try {
    const v = JSON.parse(args);
    return v !== null && typeof v === 'object' && !Array.isArray(v) ? v : {};
  } catch {
    return {};
  }
}

/**
 * The schema checks of /v1/messages, shared with count_tokens so both refuse the same requests:
 * each offered tool's input_schema, and (`outputFormat`: for count_tokens, which compiles
 * nothing; /v1/messages compiles it, which checks it) output_config.format's schema.
 */
async function checkSchemas(model: ServedModel, req: MessagesRequest, outputFormat: boolean): Promise<void> {
  if (req.tools && req.tools.offered.length > 0) await checkToolSchemas(model, req.tools.offered, (i) => `tools[${i}].input_schema`);
  const c = req.constraint;
  if (outputFormat && c && c.param === 'output_config' && c.spec.type === 'json_schema') {
    try {
      await (await model.grammarCompiler()).checkJsonSchema(c.spec.schema);
    } catch (err) {
      if (err instanceof GrammarSpecError) throw badRequest(`output_config.format.schema: ${err.message}`, 'output_config', 'invalid_grammar');
      throw err;
    }
  }
}

export async function handleMessages(ctx: HandlerContext, body: JsonObject): Promise<void> {
  const model = ctx.model;
  const req = parseMessagesRequest(body, model);
  await checkSchemas(model, req, false);
  const rendered = await renderMessages(model, req, ctx.signal);
  const promptIds = rendered.ids;
  const room = model.contextLen - promptIds.length;
  if (promptIds.length === 0) throw badRequest('the prompt is empty', 'messages');
  if (room < 1)
    throw badRequest(`the prompt has ${promptIds.length} tokens, but this model's context holds ${model.contextLen} tokens (prompt + at least 1 generated token)`, 'messages');
  const grammar = req.constraint ? await compileConstraint(model, req.constraint) : undefined;
  try {
    const request: EngineRequest = {
      promptIds, maxTokens: Math.min(req.maxTokens, room), sampling: req.sampling, stop: req.stop,
      ...(grammar ? { grammar: { createMatcher: () => grammar.createMatcher() } } : {}),
    };
    await respondMessages(ctx, req, request);
  } finally {
    grammar?.release();
  }
}

async function respondMessages(ctx: HandlerContext, req: MessagesRequest, request: EngineRequest): Promise<void> {
  const model = ctx.model;
  const promptIds = request.promptIds;
  const plans: SeqPlan[] = [{ promptIndex: 0, request }];
  const id = newId('msg_');
  const message = (content: unknown[], stop: { stop_reason: StopReason | null; stop_sequence: string | null }, out: number, cached = 0) => ({
    id, type: 'message', role: 'assistant', model: model.name, content, ...stop, usage: usage(promptIds.length, out, cached),
  });
  const tools = req.tools?.parse ? req.tools : undefined;
  const parser: ToolCallParser | undefined = tools?.format.createParser({ forced: tools.forced, triggerTokens: model.toolTriggerTokens });
  const stopOf = (tokenIds: readonly number[], text: string, finish: string) => {
    const s = anthropicStop(model, request, tokenIds, text, finish);
    return parser && parser.calls.length > 0 && s.stop_reason === 'end_turn' ? { stop_reason: 'tool_use' as const, stop_sequence: null } : s;
  };

  if (!req.stream) {
    const [r] = await runToCompletion(ctx, plans);
    if (r.finishReason === 'error' && r.errorKind !== 'grammar') throw new Error(`generation failed: ${r.error ?? 'unknown error'}`);
    if (r.finishReason === 'cancelled' && ctx.signal.aborted) return;
    if (!parser) {
      sendJson(ctx.res, 200, message([{ type: 'text', text: r.text }], anthropicStop(model, request, r.tokenIds, r.text, r.finishReason), r.completionTokens, r.cachedTokens));
      return;
    }
    // the pieces the stream would have carried, through the same parser
    let text = '';
    r.tokenIds.forEach((tok, k) => (text += parser.push(r.text.slice(r.textOffsets[k], r.textOffsets[k + 1] ?? r.finishTextOffset), tok).content));
    text += parser.push(r.text.slice(r.finishTextOffset)).content;
    text += parser.finish().content;
    const content: unknown[] = [];
    if (text !== '' || parser.calls.length === 0) content.push({ type: 'text', text });
    for (const c of parser.calls) content.push({ type: 'tool_use', id: c.id, name: c.name, input: toolInput(c.arguments) });
    sendJson(ctx.res, 200, message(content, stopOf(r.tokenIds, r.text, r.finishReason), r.completionTokens, r.cachedTokens));
    return;
  }

  const run = startStreams(ctx, plans);
  const sse = new SseWriter(ctx.res);
  sse.start();
  const tokenIds: number[] = [];
  let text = '';
  // content blocks: without tools one text block at index 0, opened at once; with tools, blocks
  // open as text or calls arrive (text, then tool_use blocks, in output order)
  let index = -1;
  let open: 'text' | 'tool' | undefined;
  const startBlock = async (block: unknown, kindOf: 'text' | 'tool') => {
    if (open) await sse.send({ type: 'content_block_stop', index }, 'content_block_stop');
    index++;
    open = kindOf;
    await sse.send({ type: 'content_block_start', index, content_block: block }, 'content_block_start');
  };
  const textDelta = async (t: string) => {
    if (t === '') return;
    if (open !== 'text') await startBlock({ type: 'text', text: '' }, 'text');
    await sse.send({ type: 'content_block_delta', index, delta: { type: 'text_delta', text: t } }, 'content_block_delta');
  };
  const emitParsed = async (piece: { content: string; calls: { index: number; id?: string; name?: string; arguments: string }[] }) => {
    await textDelta(piece.content);
    for (const d of piece.calls) {
      if (d.id !== undefined) await startBlock({ type: 'tool_use', id: d.id, name: d.name, input: {} }, 'tool');
      if (d.arguments !== '') await sse.send({ type: 'content_block_delta', index, delta: { type: 'input_json_delta', partial_json: d.arguments } }, 'content_block_delta');
    }
  };
  try {
    await sse.send({ type: 'message_start', message: message([], { stop_reason: null, stop_sequence: null }, 0) }, 'message_start');
    if (!parser) await startBlock({ type: 'text', text: '' }, 'text');
    await sse.send({ type: 'ping' }, 'ping');
    await run(async (_i, e) => {
      if (e.type === 'token') {
        tokenIds.push(e.tokenId);
        text += e.text;
        if (parser) await emitParsed(parser.push(e.text, e.tokenId));
        else await textDelta(e.text);
        return;
      }
      if (e.finishReason === 'error' && e.errorKind !== 'grammar') {
        ctx.logError('POST /v1/messages (stream)', new Error(e.error ?? 'generation failed'));
        await sse.send({ type: 'error', error: { type: 'api_error', message: `generation failed: ${e.error ?? 'unknown error'}` } }, 'error');
        return;
      }
      text += e.text;
      if (parser) {
        await emitParsed(parser.push(e.text));
        await emitParsed(parser.finish());
        if (index < 0) await startBlock({ type: 'text', text: '' }, 'text');
      } else await textDelta(e.text);
      await sse.send({ type: 'content_block_stop', index }, 'content_block_stop');
      const stop = e.finishReason === 'cancelled'
        ? { stop_reason: 'end_turn' as const, stop_sequence: null }
        : stopOf(tokenIds, text, e.finishReason);
      await sse.send({ type: 'message_delta', delta: stop, usage: { output_tokens: e.completionTokens, input_tokens: promptIds.length - e.cachedTokens, cache_read_input_tokens: e.cachedTokens } }, 'message_delta');
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
  await checkSchemas(ctx.model, req, true);
  const { ids } = await renderMessages(ctx.model, req, ctx.signal);
  sendJson(ctx.res, 200, { input_tokens: ids.length });
}
