// POST /v1/completions (OpenAI legacy completions): raw prompts, no chat template. `prompt` is a
// string, a list of strings, a list of token ids, or a list of token-id lists; each prompt gets
// n choices (choice index = prompt index * n + i).

import { sendJson } from './http-io.ts';
import { newId, nowSeconds, type HandlerContext } from './context.ts';
import { cachedTokensOf, speculationOf } from './run.ts';
import { completeChoices, streamChoices } from './openai-choices.ts';
import { legacyLogprobs } from './logprobs-format.ts';
import { finishReasonOf, planSequences, stopReasonOf, usageOf } from './openai-params.ts';
import { compileConstraint } from './structured.ts';
import type { PreparedCompletions } from './completions-request.ts';
import type { PromptIds } from './request-model.ts';

export { parsePrompts } from './completions-request.ts';

/** A prepared completions request (completions-request.ts): its output constraint compiled, run, and answered. */
export async function handleCompletions(ctx: HandlerContext, prepared: PreparedCompletions): Promise<void> {
  const { params: p, prompts } = prepared;
  const grammar = p.constraint ? await compileConstraint(ctx.model, p.constraint) : undefined;
  try {
    await respond(ctx, p, prompts, planSequences(prompts, p, ctx.model, grammar));
  } finally {
    grammar?.release();
  }
}

async function respond(ctx: HandlerContext, p: PreparedCompletions['params'], prompts: readonly PromptIds[], plans: ReturnType<typeof planSequences>): Promise<void> {
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
        logprobs: p.topLogprobs === undefined ? null : legacyLogprobs(model.tokens, r.logprobs, r.textOffsets, p.tokensAsIds),
        finish_reason: finishReasonOf(r.finishReason),
        stop_reason: stopReasonOf(model, plans[index].request, r.tokenIds, r.text, r.finishReason),
      };
    });
    sendJson(ctx.res, 200, {
      id: newId('cmpl-'), object: 'text_completion', created: nowSeconds(), model: model.name, choices,
      usage: usageOf(promptTokens, completionTokens, cachedTokensOf(plans, results.map((r) => r.cachedTokens)), speculationOf(results.map((r) => r.speculation))),
    });
    return;
  }

  await streamChoices(ctx, plans, {
    route: 'POST /v1/completions (stream)', idPrefix: 'cmpl-', object: 'text_completion', includeUsage: p.includeUsage, promptTokens,
    token: (index, e, so) => {
      const logprobs = p.topLogprobs !== undefined && e.logprobs ? legacyLogprobs(model.tokens, [e.logprobs], [so.text.length], p.tokensAsIds) : null;
      return e.text || logprobs ? { index, text: e.text, logprobs, finish_reason: null } : undefined;
    },
    finish: (index, e, so) => ({
      index, text: e.text, logprobs: null,
      finish_reason: finishReasonOf(e.finishReason),
      stop_reason: stopReasonOf(model, plans[index].request, so.tokenIds, so.text, e.finishReason),
    }),
  });
}
