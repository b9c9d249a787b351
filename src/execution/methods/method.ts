// How a sequence produces its tokens: its decoding method. Every method shares the continuous
// batch, its queueing, prefill, KV cache and prefix cache; a step may hold rows of several
// methods. Per step a method says what its row computes beyond the known tokens (a draft: tokens
// proposed after them, each with a logit row of its own), and after the forward it judges the
// outcome: which of the row's tokens are taken, and how many of the row's KV positions hold
// verified tokens (the rest are rolled back: `computed` advances only over those, and the slots
// of the others are written again by a later step).
//
// One file per method: autoregressive.ts (one token per step), speculative.ts (a proposer's
// drafts verified in one forward). The engine's step stays schedule / run / postprocess:
//   schedule     Scheduler.schedule asks each sampling row's method for a draft (propose), the
//                DraftPlanner (draft-depth.ts) decides how deep each row drafts, the scheduler
//                grows the row's KV over the drafted positions;
//   run          StepLauncher.launch feeds the drafts after the known tokens and asks for logits
//                (or a device pick) at the row's last known position and at every draft;
//   postprocess  TokenAcceptor: verify (how many positions are kept) -> commit the kept KV to
//                the prefix cache -> accept (append the tokens) -> advance (grammar jump-forward).

import type { ScheduledRow } from '../scheduler.ts';
import type { Sequence } from '../sequence.ts';
import type { FinishFn } from '../append-tokens.ts';
import type { TokenSource } from '../token-accept.ts';

/** Tokens a method proposes after a row's known tokens, verified by the step's forward. */
export interface Draft {
  readonly tokens: readonly number[];
  /**
   * Per token, the distribution over the vocabulary the proposer drew it from (a draft model's);
   * absent: the tokens were chosen deterministically (a point mass on each), as an n-gram match
   * chooses them. Rejection sampling needs them to keep the target's distribution.
   */
  readonly probs?: readonly Float32Array[];
}

/** A sequence's counts of drafted and accepted tokens (generate --json, usage.speculation). */
export interface SpeculationCounts {
  /** draft tokens verified */
  draftTokens: number;
  /** of those, tokens accepted (equal to what the target produced there) */
  acceptedTokens: number;
}

export interface DecodingMethod {
  readonly name: string;
  /**
   * KV positions past the sequence's last one (maxTokensTotal) a row of this method may compute;
   * admission reserves them beside its worst case.
   */
  readonly kvLookahead: number;
  /**
   * A draft for the row about to compute `seq`'s next token: at most `max` tokens (the step's
   * budget and the sequence's last position bound it). Undefined or empty: a plain row.
   */
  propose(seq: Sequence, max: number): Draft | undefined;
  /**
   * Whether the step after this one may be enqueued before this one's token reaches the host
   * (pipeline.ts): only when the method will not draft for it. `plain` is the autoregressive
   * answer (the row's pick and sampling allow it).
   */
  pipelinable(seq: Sequence, plain: boolean): boolean;
  /**
   * After the forward, before the row's KV is committed: decides the row's tokens from its
   * sources (one per logit row: the last known position, then each draft) and returns how many
   * of its `row.count` positions hold verified tokens. Throws for a row that fails (it ends alone).
   */
  verify(seq: Sequence, row: ScheduledRow, sources: readonly TokenSource[]): number;
  /** Then appends the tokens verify decided (or ends the row), through appendTokens. */
  accept(seq: Sequence, row: ScheduledRow, sources: readonly TokenSource[], finish: FinishFn): void;
  /** After every row of the step was accepted: tokens known without sampling (grammar jump-forward). */
  advance(seq: Sequence, finish: FinishFn): void;
  /** Drafted and accepted tokens so far (undefined: the method never drafts). */
  readonly counts?: SpeculationCounts;
  /**
   * For a method whose draft depth adapts (draft-depth.ts): its recent acceptance per draft
   * token, 0..1. Undefined: its drafts are computed whole.
   */
  readonly acceptance?: number;
}

/**
 * Where a speculative method's drafts come from (an n-gram match, a draft model, EAGLE heads): it
 * gets the sequence (prompt and output so far) and returns at most `max` tokens to follow them,
 * with the distributions it drew them from when it drew them at random.
 */
export interface Proposer {
  propose(seq: Sequence, max: number): Draft | undefined;
  /**
   * The drafts come from a phase of their own before each schedule (a draft model's steps,
   * draft-model.ts), so what it would draft for a position is known only then: the method asks
   * at schedule time only, and takes a row of a fixed depth (or an adaptive one whose drafting
   * pays) as drafting, never pipelined.
   */
  readonly deferred?: boolean;
  /**
   * The proposer reads every step of its row (an EAGLE-3 head reads the target's hidden states at
   * each computed position): the row is never pipelined.
   */
  readonly everyStep?: boolean;
}
