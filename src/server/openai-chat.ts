// POST /v1/chat/completions (OpenAI). Messages are rendered with the model's chat template; the
// output's <think> block goes to reasoning_content when the template knows <think>.

import type { ChatMessage } from '../artifacts/chat-template.ts';
import { badRequest, notSupported } from './errors.ts';
import { Fields, isObject, type Json, type JsonObject } from './fields.ts';
import { sendJson } from './http-io.ts';
import { newId, nowSeconds, type HandlerContext } from './context.ts';
import { cachedTokensOf } from './run.ts';
import { completeChoices, streamChoices } from './openai-choices.ts';
import { chatLogprob } from './logprobs-format.ts';
import { ThinkSplitter, promptOpensThink, type SplitText } from './reasoning.ts';
import { checkModel, finishReasonOf, parseGenerationParams, planSequences, stopReasonOf, usageOf } from './openai-params.ts';
import { checkToolSchemas, compileConstraint, parseOpenAiTools, planTools, toolMessages, type ToolPlan } from './structured.ts';
import type { ToolCallParser } from '../generation/tool-calls/index.ts';
import type { ServedModel } from './served-model.ts';

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

/** An OpenAI delta (also what a non-streamed message is assembled from). */
interface ChatDelta {
  reasoning_content?: string;
  content?: string;
  tool_calls?: { index: number; id?: string; type?: 'function'; function: { name?: string; arguments: string } }[];
}

/**
 * One choice's output as it streams: reasoning split off first (when the template thinks), then
 * tool calls parsed out of the content (when tools are on). The non-streamed response runs the
 * same pieces through the same object, so both agree exactly.
 */
class ChoiceOutput {
  private readonly split?: ThinkSplitter;
  readonly parser?: ToolCallParser;

  constructor(model: ServedModel, startsInside: boolean, tools: ToolPlan | undefined) {
    if (model.thinks) this.split = new ThinkSplitter(startsInside);
    if (tools?.parse) this.parser = tools.format.createParser({ forced: tools.forced, triggerTokens: model.toolTriggerTokens });
  }

  /** a token's text (`tokenId` lets the tool parser see control tokens) */
  push(text: string, tokenId?: number): ChatDelta {
    const s: SplitText = this.split ? this.split.push(text) : { reasoning: '', content: text };
    return this.delta(s, this.parser?.push(s.content, tokenId));
  }

  /** the text held back until the end */
  end(text: string): ChatDelta {
    let s: SplitText = this.split ? this.split.push(text) : { reasoning: '', content: text };
    if (this.split) {
      const t = this.split.flush();
      s = { reasoning: s.reasoning + t.reasoning, content: s.content + t.content };
    }
    if (!this.parser) return this.delta(s, undefined);
    const a = this.parser.push(s.content);
    const b = this.parser.finish();
    return this.delta(s, { content: a.content + b.content, calls: [...a.calls, ...b.calls] });
  }

  private delta(s: SplitText, parsed: { content: string; calls: { index: number; id?: string; name?: string; arguments: string }[] } | undefined): ChatDelta {
    const d: ChatDelta = {};
    if (s.reasoning) d.reasoning_content = s.reasoning;
    const content = parsed ? parsed.content : s.content;
    if (content) d.content = content;
    if (parsed && parsed.calls.length > 0) {
      d.tool_calls = parsed.calls.map((c) => c.id !== undefined
        ? { index: c.index, id: c.id, type: 'function' as const, function: { name: c.name, arguments: c.arguments } }
        : { index: c.index, function: { arguments: c.arguments } });
    }
    return d;
  }

  get hasCalls(): boolean {
    return (this.parser?.calls.length ?? 0) > 0;
  }
}

/** finish_reason: "tool_calls" when the choice called tools and stopped normally */
const chatFinishReason = (reason: string, out: ChoiceOutput): string =>
  reason === 'stop' && out.hasCalls ? 'tool_calls' : finishReasonOf(reason);

export async function handleChat(ctx: HandlerContext, body: JsonObject): Promise<void> {
  const f = new Fields(body);
  checkModel(f, ctx.model);
  const parsedMessages = parseChatMessages(f.array('messages'));
  const p = parseGenerationParams(f, ctx.model, 'chat');
  const tools = planTools(ctx.model, parseOpenAiTools(f));
  if (tools?.forced && p.constraint)
    throw badRequest(`${p.constraint.param} cannot be combined with tool_choice "required" or a named function`, p.constraint.param);
  const variables = f.object('chat_template_kwargs')?.body;
  const continueFinal = f.boolean('continue_final_message') ?? false;
  const addGenerationPrompt = f.boolean('add_generation_prompt') ?? true;
  if (continueFinal && parsedMessages[parsedMessages.length - 1].role !== 'assistant')
    throw badRequest('continue_final_message requires the last message to be from the assistant', 'continue_final_message');
  if (tools && tools.offered.length > 0) await checkToolSchemas(ctx.model, tools.offered, (i) => `tools[${i}].function.parameters`);
  const { messages, tools: templateTools } = toolMessages(ctx.model, parsedMessages, tools);
  const rendered = await ctx.model.renderChat(messages, { continueFinal, addGenerationPrompt, variables, tools: templateTools }, ctx.signal);
  const constraint = tools?.constraint ?? p.constraint;
  const grammar = constraint ? await compileConstraint(ctx.model, constraint) : undefined;
  try {
    await respond(ctx, p, rendered, tools, planSequences([rendered.ids], p, ctx.model, grammar));
  } finally {
    grammar?.release();
  }
}

async function respond(
  ctx: HandlerContext, p: ReturnType<typeof parseGenerationParams>, rendered: { ids: number[]; text: string },
  tools: ToolPlan | undefined, plans: ReturnType<typeof planSequences>,
): Promise<void> {
  const startsInside = ctx.model.thinks && promptOpensThink(rendered.text);
  const model = ctx.model;
  const promptTokens = rendered.ids.length;
  const outputs = plans.map(() => new ChoiceOutput(model, startsInside, tools));

  if (!p.stream) {
    const results = await completeChoices(ctx, plans);
    if (!results) return;
    let completionTokens = 0;
    const choices = results.map((r, index) => {
      completionTokens += r.completionTokens;
      // the same pieces the stream would have carried, through the same parser
      const out = outputs[index];
      const deltas: ChatDelta[] = r.tokenIds.map((tok, k) => out.push(r.text.slice(r.textOffsets[k], r.textOffsets[k + 1] ?? r.finishTextOffset), tok));
      deltas.push(out.end(r.text.slice(r.finishTextOffset)));
      const reasoning = deltas.map((d) => d.reasoning_content ?? '').join('');
      const content = deltas.map((d) => d.content ?? '').join('');
      const message: Record<string, unknown> = { role: 'assistant' };
      message.content = out.hasCalls && content === '' ? null : content;
      if (model.thinks) message.reasoning_content = reasoning === '' ? null : reasoning;
      if (out.hasCalls) message.tool_calls = out.parser!.calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } }));
      return {
        index,
        message,
        logprobs: p.topLogprobs === undefined ? null : { content: r.logprobs.map((lp) => chatLogprob(model.tokens, lp)) },
        finish_reason: chatFinishReason(r.finishReason, out),
        stop_reason: stopReasonOf(model, plans[index].request, r.tokenIds, r.text, r.finishReason),
      };
    });
    sendJson(ctx.res, 200, {
      id: newId('chatcmpl-'), object: 'chat.completion', created: nowSeconds(), model: model.name, choices,
      usage: usageOf(promptTokens, completionTokens, cachedTokensOf(plans, results.map((r) => r.cachedTokens))),
    });
    return;
  }

  await streamChoices(ctx, plans, {
    route: 'POST /v1/chat/completions (stream)', idPrefix: 'chatcmpl-', object: 'chat.completion.chunk', includeUsage: p.includeUsage,
    promptTokens,
    opening: (index) => ({ index, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }),
    token: (index, e) => {
      const delta = outputs[index].push(e.text, e.tokenId);
      const logprobs = p.topLogprobs !== undefined && e.logprobs ? { content: [chatLogprob(model.tokens, e.logprobs)] } : null;
      return Object.keys(delta).length > 0 || logprobs ? { index, delta, logprobs, finish_reason: null } : undefined;
    },
    finish: (index, e, so) => ({
      index, delta: outputs[index].end(e.text), logprobs: null,
      finish_reason: chatFinishReason(e.finishReason, outputs[index]),
      stop_reason: stopReasonOf(model, plans[index].request, so.tokenIds, so.text, e.finishReason),
    }),
  });
}
