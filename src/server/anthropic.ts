// POST /v1/messages (Anthropic Messages API), streaming and not, and count_tokens: the request as
// anthropic-request.ts prepared it (validated, rendered) has its schemas checked and its
// constraint compiled, then runs. A final assistant message is a prefill that the reply continues
// (its text is not repeated in the reply). Errors use Anthropic's shape (see server.ts).

import type { EngineRequest } from '../execution/sequence.ts';
import { badRequest } from './errors.ts';
import { SseWriter, sendJson } from './http-io.ts';
import { newId, streamFailed, type HandlerContext } from './context.ts';
import { runToCompletion, startStreams, type SeqPlan } from './run.ts';
import { ClientGoneError } from './http-io.ts';
import type { ServedModel } from './served-model.ts';
import { GrammarSpecError } from '../sampling/grammar/index.ts';
import { checkToolSchemas, compileConstraint } from './structured.ts';
import type { ToolCallParser } from '../generation/tool-calls/index.ts';
import { idList } from './request-model.ts';
import { promptTooLong } from './openai-params.ts';
import type { MessagesParams, PreparedCountTokens, PreparedMessages } from './anthropic-request.ts';
import type { SpeculationCounts } from '../execution/methods/method.ts';

export { parseMessagesRequest, type MessagesRequest } from './anthropic-request.ts';

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

/**
 * Anthropic usage: input_tokens excludes the prompt tokens read from the prefix cache
 * (cache_read_input_tokens); speculation: draft tokens verified and accepted, when the request speculated
 */
const usage = (input: number, output: number, cached = 0, speculation?: SpeculationCounts) => ({
  input_tokens: input - cached, output_tokens: output, cache_creation_input_tokens: 0, cache_read_input_tokens: cached,
  ...speculationUsage(speculation),
});
const speculationUsage = (s?: SpeculationCounts) => (s ? { speculation: { draft_tokens: s.draftTokens, accepted_tokens: s.acceptedTokens } } : {});

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
async function checkSchemas(model: ServedModel, req: MessagesParams, outputFormat: boolean): Promise<void> {
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

/** A prepared /v1/messages request (anthropic-request.ts): schemas checked, constraint compiled, run, and answered. */
export async function handleMessages(ctx: HandlerContext, prepared: PreparedMessages): Promise<void> {
  const model = ctx.model;
  const { req, ids } = prepared;
  await checkSchemas(model, req, false);
  const room = model.contextLen - ids.length;
  if (ids.length === 0) throw badRequest('the prompt is empty', 'messages');
  if (room < 1) throw promptTooLong(ids.length, model.contextLen, 'messages');
  const grammar = req.constraint ? await compileConstraint(model, req.constraint) : undefined;
  try {
    const request: EngineRequest = {
      promptIds: idList(ids), maxTokens: Math.min(req.maxTokens, room), sampling: req.sampling, stop: req.stop,
      ...(req.speculative !== undefined ? { speculative: req.speculative } : {}),
      ...(grammar ? { grammar: { createMatcher: () => grammar.createMatcher() } } : {}),
    };
    await respondMessages(ctx, req, request);
  } finally {
    grammar?.release();
  }
}

async function respondMessages(ctx: HandlerContext, req: MessagesParams, request: EngineRequest): Promise<void> {
  const model = ctx.model;
  const promptIds = request.promptIds;
  const plans: SeqPlan[] = [{ promptIndex: 0, request }];
  const id = newId('msg_');
  const message = (content: unknown[], stop: { stop_reason: StopReason | null; stop_sequence: string | null }, out: number, cached = 0, speculation?: SpeculationCounts) => ({
    id, type: 'message', role: 'assistant', model: model.name, content, ...stop, usage: usage(promptIds.length, out, cached, speculation),
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
      sendJson(ctx.res, 200, message([{ type: 'text', text: r.text }], anthropicStop(model, request, r.tokenIds, r.text, r.finishReason), r.completionTokens, r.cachedTokens, r.speculation));
      return;
    }
    // the pieces the stream would have carried, through the same parser
    let text = '';
    r.tokenIds.forEach((tok, k) => (text += parser.push(r.text.slice(r.textOffsets[k], r.textOffsets[k + 1] ?? r.finishTextOffset), tok).content));
    text += parser.push(r.text.slice(r.finishTextOffset)).content;
    text += parser.finish(r.finishReason === 'length').content;
    const content: unknown[] = [];
    if (text !== '' || parser.calls.length === 0) content.push({ type: 'text', text });
    for (const c of parser.calls) content.push({ type: 'tool_use', id: c.id, name: c.name, input: toolInput(c.arguments) });
    sendJson(ctx.res, 200, message(content, stopOf(r.tokenIds, r.text, r.finishReason), r.completionTokens, r.cachedTokens, r.speculation));
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
        await emitParsed(parser.finish(e.finishReason === 'length'));
        if (index < 0) await startBlock({ type: 'text', text: '' }, 'text');
      } else await textDelta(e.text);
      await sse.send({ type: 'content_block_stop', index }, 'content_block_stop');
      const stop = e.finishReason === 'cancelled'
        ? { stop_reason: 'end_turn' as const, stop_sequence: null }
        : stopOf(tokenIds, text, e.finishReason);
      await sse.send({ type: 'message_delta', delta: stop, usage: { output_tokens: e.completionTokens, input_tokens: promptIds.length - e.cachedTokens, cache_read_input_tokens: e.cachedTokens, ...speculationUsage(e.speculation) } }, 'message_delta');
      await sse.send({ type: 'message_stop' }, 'message_stop');
    }, (err) => err instanceof ClientGoneError);
  } catch (err) {
    await streamFailed(ctx, sse, 'POST /v1/messages (stream)', err, true);
  } finally {
    sse.end();
  }
}

/** POST /v1/messages/count_tokens: the prompt's length as /v1/messages would render it (anthropic-request.ts), its schemas checked */
export async function handleCountTokens(ctx: HandlerContext, prepared: PreparedCountTokens): Promise<void> {
  await checkSchemas(ctx.model, prepared.req, true);
  sendJson(ctx.res, 200, { input_tokens: prepared.inputTokens });
}
