// The response scaffolding /v1/completions and /v1/chat/completions share: run every choice to
// the end (non-streamed), or stream their events as SSE chunks with the usage chunk and [DONE]
// (streamed). Each route supplies only how a token or a finish becomes a choice object.

import type { FinishEvent, TokenEvent } from '../execution/sequence.ts';
import { newId, nowSeconds, streamFailed, type HandlerContext } from './context.ts';
import { ClientGoneError, SseWriter } from './http-io.ts';
import { usageOf } from './openai-params.ts';
import { cachedTokensOf, runToCompletion, speculationOf, startStreams, type SeqPlan, type SeqResult } from './run.ts';
import type { SpeculationCounts } from '../execution/methods/method.ts';

/**
 * Every choice run to its end. Undefined when the client left (its rows were cancelled); throws
 * when a row failed other than by its grammar (a grammar failure is that choice's own result).
 */
export async function completeChoices(ctx: HandlerContext, plans: readonly SeqPlan[]): Promise<SeqResult[] | undefined> {
  const results = await runToCompletion(ctx, plans);
  const failed = results.find((r) => r.finishReason === 'error' && r.errorKind !== 'grammar');
  if (failed) throw new Error(`generation failed: ${failed.error ?? 'unknown error'}`);
  if (ctx.signal.aborted && results.some((r) => r.finishReason === 'cancelled')) return undefined;
  return results;
}

/** What a choice has streamed so far. */
export interface StreamedChoice {
  tokenIds: number[];
  text: string;
}

export interface ChoiceStreamSpec {
  /** for logs: 'POST /v1/completions (stream)' */
  route: string;
  /** id prefix and chunk object: 'cmpl-' / 'text_completion' */
  idPrefix: string;
  object: string;
  includeUsage: boolean;
  promptTokens: number;
  /** a chunk's choice sent for every index before any token (chat's role delta), if any */
  opening?: (index: number) => unknown;
  /** a token event's choice, or undefined to send nothing; `so` is before this token */
  token: (index: number, e: TokenEvent, so: Readonly<StreamedChoice>) => unknown;
  /** the finishing choice; `so` includes the finish event's text */
  finish: (index: number, e: FinishEvent, so: Readonly<StreamedChoice>) => unknown;
}

/** Streams every choice of `plans` as one SSE response. */
export async function streamChoices(ctx: HandlerContext, plans: readonly SeqPlan[], spec: ChoiceStreamSpec): Promise<void> {
  const id = newId(spec.idPrefix);
  const created = nowSeconds();
  const run = startStreams(ctx, plans);
  const sse = new SseWriter(ctx.res);
  sse.start();
  const chunk = (choices: unknown[], usage?: unknown) => ({
    id, object: spec.object, created, model: ctx.model.name, choices,
    ...(spec.includeUsage ? { usage: usage ?? null } : {}),
  });
  const states: StreamedChoice[] = plans.map(() => ({ tokenIds: [], text: '' }));
  let completionTokens = 0;
  const cached = plans.map(() => 0);
  const speculation: (SpeculationCounts | undefined)[] = plans.map(() => undefined);
  try {
    if (spec.opening) for (let index = 0; index < plans.length; index++) await sse.send(chunk([spec.opening(index)]));
    await run(async (index, e) => {
      const so = states[index]!;
      if (e.type === 'token') {
        const choice = spec.token(index, e, so);
        so.tokenIds.push(e.tokenId);
        so.text += e.text;
        if (choice !== undefined) await sse.send(chunk([choice]));
        return;
      }
      completionTokens += e.completionTokens;
      cached[index] = e.cachedTokens;
      speculation[index] = e.speculation;
      if (e.finishReason === 'error' && e.errorKind !== 'grammar') {
        ctx.logError(spec.route, new Error(e.error ?? 'generation failed'));
        await sse.send({ error: { message: `generation failed: ${e.error ?? 'unknown error'}`, type: 'server_error', param: null, code: null } });
        return;
      }
      so.text += e.text;
      await sse.send(chunk([spec.finish(index, e, so)]));
    }, (err) => err instanceof ClientGoneError);
    if (spec.includeUsage) await sse.send(chunk([], usageOf(spec.promptTokens, completionTokens, cachedTokensOf(plans, cached), speculationOf(speculation))));
    await sse.raw('data: [DONE]\n\n');
  } catch (err) {
    await streamFailed(ctx, sse, spec.route, err);
  } finally {
    sse.end();
  }
}
