// POST /v1/chat/completions (OpenAI): the request as chat-request.ts prepared it (validated, its
// messages rendered with the model's chat template) has its tool schemas and output constraint
// checked and compiled, then runs; the output's <think> block goes to reasoning_content when the
// template knows <think>.

import { sendJson } from './http-io.ts';
import { newId, nowSeconds, type HandlerContext } from './context.ts';
import { cachedTokensOf, speculationOf } from './run.ts';
import { completeChoices, streamChoices } from './openai-choices.ts';
import { chatLogprob } from './logprobs-format.ts';
import { ThinkSplitter, type SplitText } from './reasoning.ts';
import { finishReasonOf, planSequences, stopReasonOf, usageOf } from './openai-params.ts';
import { checkToolSchemas, compileConstraint, type ToolPlan } from './structured.ts';
import type { ToolCallParser } from '../generation/tool-calls/index.ts';
import type { ServedModel } from './served-model.ts';
import type { PreparedChat } from './chat-request.ts';

export { contentText, parseChatMessages } from './chat-request.ts';

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

  /** the text held back until the end (`truncated`: max_tokens cut the output, see ToolCallParser.finish) */
  end(text: string, truncated = false): ChatDelta {
    let s: SplitText = this.split ? this.split.push(text) : { reasoning: '', content: text };
    if (this.split) {
      const t = this.split.flush();
      s = { reasoning: s.reasoning + t.reasoning, content: s.content + t.content };
    }
    if (!this.parser) return this.delta(s, undefined);
    const a = this.parser.push(s.content);
    const b = this.parser.finish(truncated);
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

/** A prepared chat request (chat-request.ts) checked against the grammar compiler, run, and answered. */
export async function handleChat(ctx: HandlerContext, prepared: PreparedChat): Promise<void> {
  const { params: p, tools } = prepared;
  if (tools && tools.offered.length > 0) await checkToolSchemas(ctx.model, tools.offered, (i) => `tools[${i}].function.parameters`);
  const constraint = tools?.constraint ?? p.constraint;
  const grammar = constraint ? await compileConstraint(ctx.model, constraint) : undefined;
  try {
    await respond(ctx, p, prepared, tools, planSequences([prepared.ids], p, ctx.model, grammar));
  } finally {
    grammar?.release();
  }
}

async function respond(
  ctx: HandlerContext, p: PreparedChat['params'], prepared: PreparedChat, tools: ToolPlan | undefined, plans: ReturnType<typeof planSequences>,
): Promise<void> {
  const startsInside = prepared.opensThink;
  const model = ctx.model;
  const promptTokens = prepared.ids.length;
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
      deltas.push(out.end(r.text.slice(r.finishTextOffset), r.finishReason === 'length'));
      const reasoning = deltas.map((d) => d.reasoning_content ?? '').join('');
      const content = deltas.map((d) => d.content ?? '').join('');
      const message: Record<string, unknown> = { role: 'assistant' };
      message.content = out.hasCalls && content === '' ? null : content;
      if (model.thinks) message.reasoning_content = reasoning === '' ? null : reasoning;
      if (out.hasCalls) message.tool_calls = out.parser!.calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } }));
      return {
        index,
        message,
        logprobs: p.topLogprobs === undefined ? null : { content: r.logprobs.map((lp) => chatLogprob(model.tokens, lp, p.tokensAsIds)) },
        finish_reason: chatFinishReason(r.finishReason, out),
        stop_reason: stopReasonOf(model, plans[index].request, r.tokenIds, r.text, r.finishReason),
      };
    });
    sendJson(ctx.res, 200, {
      id: newId('chatcmpl-'), object: 'chat.completion', created: nowSeconds(), model: model.name, choices,
      usage: usageOf(promptTokens, completionTokens, cachedTokensOf(plans, results.map((r) => r.cachedTokens)), speculationOf(results.map((r) => r.speculation))),
    });
    return;
  }

  await streamChoices(ctx, plans, {
    route: 'POST /v1/chat/completions (stream)', idPrefix: 'chatcmpl-', object: 'chat.completion.chunk', includeUsage: p.includeUsage,
    promptTokens,
    opening: (index) => ({ index, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }),
    token: (index, e) => {
      const delta = outputs[index].push(e.text, e.tokenId);
      const logprobs = p.topLogprobs !== undefined && e.logprobs ? { content: [chatLogprob(model.tokens, e.logprobs, p.tokensAsIds)] } : null;
      return Object.keys(delta).length > 0 || logprobs ? { index, delta, logprobs, finish_reason: null } : undefined;
    },
    finish: (index, e, so) => ({
      index, delta: outputs[index].end(e.text, e.finishReason === 'length'), logprobs: null,
      finish_reason: chatFinishReason(e.finishReason, outputs[index]),
      stop_reason: stopReasonOf(model, plans[index].request, so.tokenIds, so.text, e.finishReason),
    }),
  });
}
