// Runs the sequences of one HTTP request on the engine: all n choices (times every prompt of a
// completions request) are submitted together, all-or-nothing: when one is refused (queue full,
// never fits) the ones already queued are cancelled and the refusal becomes the response. One
// AbortSignal per request (aborted when the client disconnects) cancels every sequence of it.

import type { RequestUsage } from './access.ts';
import { performance } from 'node:perf_hooks';
import type { Engine } from '../execution/engine.ts';
import type { EngineRequest, FinishEvent, FinishReason, SequenceEvent, TokenLogprob } from '../execution/sequence.ts';
import type { SpeculationCounts } from '../execution/methods/method.ts';
import { badRequest, clientErrorOf } from './errors.ts';
import type { ServerMetrics } from './metrics.ts';

/** One sequence to run: which prompt it continues (completions with several prompts) and how. */
export interface SeqPlan {
  promptIndex: number;
  request: EngineRequest;
}

/** Everything a finished sequence produced. */
export interface SeqResult {
  tokenIds: number[];
  text: string;
  /** per token: the length of `text` before that token's text was appended (legacy text_offset) */
  textOffsets: number[];
  /** where the text held back until the end (the finish event's) begins in `text` */
  finishTextOffset: number;
  logprobs: TokenLogprob[];
  finishReason: FinishReason;
  promptTokens: number;
  completionTokens: number;
  /** prompt tokens served from the prefix cache */
  cachedTokens: number;
  /** draft tokens verified and accepted, when the sequence speculated */
  speculation?: SpeculationCounts;
  error?: string;
  /** 'grammar': the row's grammar failed; the choice ends with finish_reason "error", siblings go on */
  errorKind?: 'grammar';
}

/** Latency metrics of one sequence, observed as its tokens reach the server. */
export class SeqObserver {
  private last?: number;

  constructor(
    private readonly metrics: ServerMetrics,
    private readonly startedAt: number,
    private readonly usage?: RequestUsage,
  ) {}

  token(): void {
    if (this.usage) this.usage.completionTokens++;
    const now = performance.now();
    if (this.last === undefined) this.metrics.ttft.observe((now - this.startedAt) / 1000);
    else this.metrics.itl.observe((now - this.last) / 1000);
    this.last = now;
    this.metrics.generatedTokens.inc();
  }

  finish(e: FinishEvent): void {
    this.metrics.finished.inc({ reason: e.finishReason });
    this.metrics.e2e.observe((performance.now() - this.startedAt) / 1000);
  }
}

export interface RunContext {
  engine: Engine;
  metrics: ServerMetrics;
  /** aborted when the client goes away; cancels every sequence of the request */
  signal: AbortSignal;
  /** cancels every sequence of the request (used when one of them is refused) */
  abort(): void;
  /** performance.now() at request arrival */
  startedAt: number;
  /** the request's tokens, counted as its sequences are submitted and produce (its log line) */
  usage?: RequestUsage;
}

/** Submits `plans` in order; on a refusal cancels what was queued and throws (an HttpError when the client caused it). */
function submitAll<T>(ctx: RunContext, plans: readonly SeqPlan[], submit: (plan: SeqPlan) => T): T[] {
  // all of a request's sequences wait together, so more than the queue holds is never admitted:
  // a 400, where a queue full of other requests' sequences is a 429
  const limit = ctx.engine.maxQueued;
  if (plans.length > limit)
    throw badRequest(
      `n x prompts = ${plans.length} sequence${plans.length === 1 ? '' : 's'} exceed${plans.length === 1 ? 's' : ''} --max-queued ${limit}; the request can never be admitted`,
      'n', 'too_many_sequences');
  const out: T[] = [];
  try {
    for (const plan of plans) {
      out.push(submit(plan));
      ctx.metrics.promptTokens.inc(plan.request.promptIds.length);
      if (ctx.usage) ctx.usage.promptTokens += plan.request.promptIds.length;
    }
  } catch (err) {
    ctx.abort();
    throw clientErrorOf(err, true) ?? err;
  }
  return out;
}

/**
 * A request's usage.prompt_tokens_details.cached_tokens: per prompt (usage counts each prompt
 * once, however many choices it has), the most any of its choices took from the prefix cache.
 */
export function cachedTokensOf(plans: readonly SeqPlan[], perSeq: readonly number[]): number {
  const best = new Map<number, number>();
  plans.forEach((p, i) => best.set(p.promptIndex, Math.max(best.get(p.promptIndex) ?? 0, perSeq[i] ?? 0)));
  return [...best.values()].reduce((a, b) => a + b, 0);
}

/**
 * A request's usage.speculation: the draft tokens its sequences verified and accepted, summed;
 * undefined when none of them speculated.
 */
export function speculationOf(perSeq: readonly (SpeculationCounts | undefined)[]): SpeculationCounts | undefined {
  const given = perSeq.filter((s): s is SpeculationCounts => s !== undefined);
  if (given.length === 0) return undefined;
  return given.reduce((a, s) => ({ draftTokens: a.draftTokens + s.draftTokens, acceptedTokens: a.acceptedTokens + s.acceptedTokens }), { draftTokens: 0, acceptedTokens: 0 });
}

/** Non-streaming: runs every plan to its end. */
export function runToCompletion(ctx: RunContext, plans: readonly SeqPlan[]): Promise<SeqResult[]> {
  const pending = submitAll(ctx, plans, (plan) => {
    const r: SeqResult = {
      tokenIds: [], text: '', textOffsets: [], finishTextOffset: 0, logprobs: [], finishReason: 'length',
      promptTokens: plan.request.promptIds.length, completionTokens: 0, cachedTokens: 0,
    };
    const obs = new SeqObserver(ctx.metrics, ctx.startedAt, ctx.usage);
    let resolve!: (r: SeqResult) => void;
    const done = new Promise<SeqResult>((res) => (resolve = res));
    ctx.engine.submit(plan.request, (e) => {
      if (e.type === 'token') {
        obs.token();
        r.tokenIds.push(e.tokenId);
        r.textOffsets.push(r.text.length);
        r.text += e.text;
        if (e.logprobs) r.logprobs.push(e.logprobs);
        return;
      }
      obs.finish(e);
      r.finishTextOffset = r.text.length;
      r.text += e.text;
      r.finishReason = e.finishReason;
      r.promptTokens = e.promptTokens;
      r.completionTokens = e.completionTokens;
      r.cachedTokens = e.cachedTokens;
      r.speculation = e.speculation;
      r.error = e.error;
      r.errorKind = e.errorKind;
      resolve(r);
    }, ctx.signal);
    return done;
  });
  return Promise.all(pending);
}

/**
 * Streaming: submits every plan (throwing before anything is written when one is refused), then
 * returns a function that consumes all streams concurrently, calling `onEvent` for each event and
 * awaiting it, so a slow client slows its sequences (the engine pauses them). When `onEvent`
 * throws (the client is gone) every sequence of the request is cancelled. Resolves when all
 * streams have ended; rejects with the first error that was not the client leaving.
 */
export function startStreams(
  ctx: RunContext,
  plans: readonly SeqPlan[],
): (onEvent: (index: number, e: SequenceEvent) => Promise<void>, isClientGone: (err: unknown) => boolean) => Promise<void> {
  const streams = submitAll(ctx, plans, (plan) => ctx.engine.generate(plan.request, { signal: ctx.signal }));
  return async (onEvent, isClientGone) => {
    const results = await Promise.allSettled(streams.map(async (stream, index) => {
      const obs = new SeqObserver(ctx.metrics, ctx.startedAt, ctx.usage);
      let finished = false;
      try {
        for await (const e of stream) {
          if (e.type === 'token') obs.token();
          else {
            finished = true;
            obs.finish(e);
          }
          await onEvent(index, e);
        }
      } catch (err) {
        ctx.abort();
        throw err;
      } finally {
        // left before the finish event arrived (client gone): the engine cancels the sequence
        if (!finished) ctx.metrics.finished.inc({ reason: 'cancelled' });
      }
    }));
    for (const r of results) if (r.status === 'rejected' && !isClientGone(r.reason)) throw r.reason;
  };
}
