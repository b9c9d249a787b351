// POST /v1/chat/completions (OpenAI). Messages are rendered with the model's chat template; the
// output's <think> block goes to reasoning_content when the template knows <think>.

import type { ChatMessage } from '../artifacts/chat-template.ts';
import { badRequest, notSupported } from './errors.ts';
import { Fields, isObject, type Json, type JsonObject } from './fields.ts';
import { ClientGoneError, SseWriter, sendJson } from './http-io.ts';
import { newId, nowSeconds, streamFailed, type HandlerContext } from './context.ts';
import { runToCompletion, startStreams } from './run.ts';
import { chatLogprob } from './logprobs-format.ts';
import { ThinkSplitter, promptOpensThink, splitThink, type SplitText } from './reasoning.ts';
import { checkModel, finishReasonOf, parseGenerationParams, planSequences, stopReasonOf, usageOf } from './openai-params.ts';

const ROLES = ['system', 'developer', 'user', 'assistant', 'tool'];
const kind = (v: unknown): string => (v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v);

/** message content: a string or a list of text parts; null only where OpenAI allows it */
export function contentText(v: Json | undefined, where: string, nullable: boolean): string {
  if (typeof v === 'string') return v;
  if ((v === null || v === undefined) && nullable) return '';
  if (!Array.isArray(v)) throw badRequest(`${where} must be a string or an array of content parts, got ${kind(v)}`, 'messages');
  return v.map((part, j) => {
    if (!isObject(part) || typeof part.type !== 'string') throw badRequest(`${where}[${j}] must be a content part object with a "type"`, 'messages');
    if (part.type !== 'text') throw notSupported(`content part type "${part.type}" (${where}[${j}])`, 'messages');
    if (typeof part.text !== 'string') throw badRequest(`${where}[${j}].text must be a string, got ${kind(part.text)}`, 'messages');
    return part.text;
  }).join('\n');
}

/** OpenAI messages -> template messages. `developer` is rendered as `system` (templates predate it). */
export function parseChatMessages(raw: Json[] | undefined): ChatMessage[] {
  if (raw === undefined) throw badRequest('messages is required', 'messages');
  if (raw.length === 0) throw badRequest('messages must not be empty', 'messages');
  return raw.map((m, i) => {
    const where = `messages[${i}]`;
    if (!isObject(m)) throw badRequest(`${where} must be an object, got ${kind(m)}`, 'messages');
    if (typeof m.role !== 'string' || !ROLES.includes(m.role))
      throw badRequest(`${where}.role must be one of ${ROLES.join(', ')}, got ${JSON.stringify(m.role ?? null)}`, 'messages');
    if (m.name !== undefined && m.name !== null && typeof m.name !== 'string') throw badRequest(`${where}.name must be a string`, 'messages');
    const content = contentText(m.content, `${where}.content`, m.role === 'assistant');
    const out: ChatMessage = { ...(m as JsonObject), role: m.role === 'developer' ? 'system' : m.role, content };
    for (const k of Object.keys(out)) if (out[k] === null) delete out[k];
    return out;
  });
}

export async function handleChat(ctx: HandlerContext, body: JsonObject): Promise<void> {
  const f = new Fields(body);
  checkModel(f, ctx.model);
  const messages = parseChatMessages(f.array('messages'));
  const p = parseGenerationParams(f, ctx.model, 'chat');
  const variables = f.object('chat_template_kwargs')?.body;
  const continueFinal = f.boolean('continue_final_message') ?? false;
  const addGenerationPrompt = f.boolean('add_generation_prompt') ?? true;
  if (continueFinal && messages[messages.length - 1].role !== 'assistant')
    throw badRequest('continue_final_message requires the last message to be from the assistant', 'continue_final_message');
  const rendered = ctx.model.renderChat(messages, { continueFinal, addGenerationPrompt, variables });
  const plans = planSequences([rendered.ids], p, ctx.model);
  const startsInside = ctx.model.thinks && promptOpensThink(rendered.text);
  const model = ctx.model;
  const id = newId('chatcmpl-');
  const created = nowSeconds();
  const promptTokens = rendered.ids.length;

  if (!p.stream) {
    const results = await runToCompletion(ctx, plans);
    const failed = results.find((r) => r.finishReason === 'error');
    if (failed) throw new Error(`generation failed: ${failed.error ?? 'unknown error'}`);
    if (ctx.signal.aborted && results.some((r) => r.finishReason === 'cancelled')) return; // the client left
    let completionTokens = 0;
    const choices = results.map((r, index) => {
      completionTokens += r.completionTokens;
      const message: Record<string, unknown> = { role: 'assistant' };
      if (model.thinks) {
        const s = splitThink(r.text, startsInside);
        message.content = s.content;
        message.reasoning_content = s.reasoning === '' ? null : s.reasoning;
      } else {
        message.content = r.text;
      }
      return {
        index,
        message,
        logprobs: p.topLogprobs === undefined ? null : { content: r.logprobs.map((lp) => chatLogprob(model.tokens, lp)) },
        finish_reason: finishReasonOf(r.finishReason),
        stop_reason: stopReasonOf(model, plans[index].request, r.tokenIds, r.text, r.finishReason),
      };
    });
    sendJson(ctx.res, 200, { id, object: 'chat.completion', created, model: model.name, choices, usage: usageOf(promptTokens, completionTokens) });
    return;
  }

  const run = startStreams(ctx, plans);
  const sse = new SseWriter(ctx.res);
  sse.start();
  const chunk = (choices: unknown[], usage?: unknown) => ({
    id, object: 'chat.completion.chunk', created, model: model.name, choices,
    ...(p.includeUsage ? { usage: usage ?? null } : {}),
  });
  const states = plans.map(() => ({
    split: model.thinks ? new ThinkSplitter(startsInside) : undefined,
    tokenIds: [] as number[],
    text: '',
  }));
  const deltaOf = (st: (typeof states)[number], text: string, end: boolean): Record<string, string> => {
    let s: SplitText = { reasoning: '', content: text };
    if (st.split) {
      s = st.split.push(text);
      if (end) {
        const tail = st.split.flush();
        s = { reasoning: s.reasoning + tail.reasoning, content: s.content + tail.content };
      }
    }
    const d: Record<string, string> = {};
    if (s.reasoning) d.reasoning_content = s.reasoning;
    if (s.content) d.content = s.content;
    return d;
  };
  let completionTokens = 0;
  try {
    for (let index = 0; index < plans.length; index++)
      await sse.send(chunk([{ index, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }]));
    await run(async (index, e) => {
      const st = states[index];
      if (e.type === 'token') {
        st.tokenIds.push(e.tokenId);
        st.text += e.text;
        const delta = deltaOf(st, e.text, false);
        const logprobs = p.topLogprobs !== undefined && e.logprobs ? { content: [chatLogprob(model.tokens, e.logprobs)] } : null;
        if (Object.keys(delta).length > 0 || logprobs) await sse.send(chunk([{ index, delta, logprobs, finish_reason: null }]));
        return;
      }
      completionTokens += e.completionTokens;
      if (e.finishReason === 'error') {
        ctx.logError('POST /v1/chat/completions (stream)', new Error(e.error ?? 'generation failed'));
        await sse.send({ error: { message: `generation failed: ${e.error ?? 'unknown error'}`, type: 'server_error', param: null, code: null } });
        return;
      }
      st.text += e.text;
      await sse.send(chunk([{
        index, delta: deltaOf(st, e.text, true), logprobs: null,
        finish_reason: finishReasonOf(e.finishReason),
        stop_reason: stopReasonOf(model, plans[index].request, st.tokenIds, st.text, e.finishReason),
      }]));
    }, (err) => err instanceof ClientGoneError);
    if (p.includeUsage) await sse.send(chunk([], usageOf(promptTokens, completionTokens)));
    await sse.raw('data: [DONE]\n\n');
  } catch (err) {
    await streamFailed(ctx, sse, 'POST /v1/chat/completions (stream)', err);
  } finally {
    sse.end();
  }
}
