// Autoregressive decoding: one token per step, sampled from the logits of the row's last known
// position (or the device's pick or sample of them), then the tokens its grammar forces after it
// (jump-forward), which the catch-up rule computes with the next step as one chunk.

import { topLogprobs, type TokenLogprobs } from '../../sampling/index.ts';
import type { RowGrammar } from '../../sampling/grammar/index.ts';
import { appendTokens, type FinishFn, type RunToken } from '../append-tokens.ts';
import type { ScheduledRow } from '../scheduler.ts';
import type { Sequence } from '../sequence.ts';
import type { TokenSource } from '../token-accept.ts';
import type { DecodingMethod, Draft } from './method.ts';

/**
 * The token `src` gives: sampled from its logits, the device's sample, or its greedy pick; with
 * the logprobs asked for.
 */
export function takeToken(seq: Sequence, src: TokenSource): RunToken {
  let id: number;
  let r: TokenLogprobs | undefined;
  if ('logits' in src) {
    id = seq.sampler.sample(src.logits, seq.history, seq.grammar?.mask());
    if (seq.request.topLogprobs !== undefined) r = topLogprobs(src.logits, seq.request.topLogprobs, id);
  } else if ('device' in src) {
    if ('error' in src.device) throw new Error(src.device.error);
    id = src.device.tokenId;
    r = src.device.logprobs;
  } else if ('failed' in src) throw src.failed;
  else if (src.greedy >= 0) id = src.greedy;
  else throw new Error('cannot sample: every logit is -Infinity or NaN');
  return { id, logprobs: r && { token_id: id, logprob: r.logprob, top: r.top.map((t) => ({ token_id: t.tokenId, logprob: t.logprob })) } };
}

export class Autoregressive implements DecodingMethod {
  readonly name = 'autoregressive';
  readonly kvLookahead = 0;

  propose(): Draft | undefined {
    return undefined;
  }

  pipelinable(_seq: Sequence, plain: boolean): boolean {
    return plain;
  }

  verify(_seq: Sequence, row: ScheduledRow): number {
    return row.count;
  }

  /** Takes one token of `seq` from its source (advancing its grammar over it) and appends it. */
  accept(seq: Sequence, _row: ScheduledRow, sources: readonly TokenSource[], finish: FinishFn): void {
    const grammar = seq.grammar;
    // a complete grammar that allows nothing but a stop token: end here, no token to sample
    if (grammar?.onlyStopAllowed()) return finish(seq, 'stop');
    const token = takeToken(seq, sources[0]!);
    grammar?.accept(token.id);
    appendTokens(seq, [token], finish);
  }

  advance(seq: Sequence, finish: FinishFn): void {
    if (seq.grammar) advanceGrammar(seq, seq.grammar, finish);
  }
}

/** The method of every sequence that does not speculate (it keeps no state of its own). */
export const AUTOREGRESSIVE = new Autoregressive();

/**
 * After a grammar row's token: when the grammar forces the next characters, they are appended
 * without sampling (jump-forward; the matcher has accepted them), and the catch-up rule computes
 * them with the next step as one chunk. Not with logprobs: forced tokens have no logits of their
 * own to report.
 */
function advanceGrammar(seq: Sequence, grammar: RowGrammar, finish: FinishFn): void {
  if (seq.request.topLogprobs !== undefined) return;
  const forced = grammar.jumpForward(seq.maxTokensTotal - seq.known);
  if (forced.length > 0) appendTokens(seq, forced.map((id) => ({ id })), finish);
}
