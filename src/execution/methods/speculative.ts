// Speculative decoding: a proposer's draft tokens are computed after the row's known tokens in one
// forward, and the target's own token at every position judges them. Position j's logits are
// those a plain step would have computed there once drafts 0..j-1 are in (the CPU backend computes
// a chunk's rows as it computes decode rows, bit for bit), and the row takes its token there with
// the pick it takes alone (the device argmax, the device sampler with the uniform it would draw,
// or the host sampler). The draft is kept up to the first token that differs from the target's;
// the target's token there (or after the whole draft, the bonus token) follows. So:
// - greedy rows produce exactly the tokens plain greedy decoding produces;
// - sampled rows with a deterministic draft (n-gram) draw their tokens as plain sampling does,
//   one uniform per token in the same order (the uniforms drawn for positions past a rejection go
//   back to the sequence), so a seed gives the same tokens with speculation on or off, and the
//   distribution is the target's: keeping x when the target's draw is x is rejection sampling
//   with a point-mass draft (sampling/rejection.ts);
// - a draft drawn at random with its distribution q (a draft model's) is judged by rejection
//   sampling proper, on the host: a seed then reproduces a run only where the drafts do;
// - logprobs are the target's at each position taken.
// Stop strings, EOS and max_tokens inside the run end the row where they would one token at a
// time (appendTokens). Rows of models whose rope depends on the sequence length do not draft (the
// engine gives them the autoregressive method).
//
// A row with a grammar drafts too, and is verified as it would decode: at each position the
// target's token is taken under the grammar's mask of the state after the tokens before it (the
// matcher accepts each token taken, in order), so a draft token the grammar refuses is never
// kept; a grammar that allows only a stop token there ends the row, and where the plain path
// would append forced text (jump-forward) after a kept draft token, the run ends at that token and
// the forced tokens follow it as they would. Such a row's positions all take host logits (the
// masks after the drafts are not known before the step). A draft is cut before its first token
// when the mask is in already and refuses it.
//
// Depth: a fixed number of draft tokens, or adaptive (draft-depth.ts), from the row's recent
// acceptance per draft token. After each plain token the row asks its proposer what it would
// draft next: with nothing to draft, or (adaptive) drafting that does not pay, its next step is a
// plain one and may be pipelined; the guess is checked against the token that comes, so the
// acceptance follows the text, and drafting resumes when the text turns repetitive.

import { isGreedy, processLogits, samplingDistribution, topLogprobs, verifyDraftToken } from '../../sampling/index.ts';
import { appendTokens, type FinishFn, type RunToken } from '../append-tokens.ts';
import { trimDraft, type ScheduledRow } from '../scheduler.ts';
import type { Sequence } from '../sequence.ts';
import type { TokenSource } from '../token-accept.ts';
import { AUTOREGRESSIVE, takeToken } from './autoregressive.ts';
import type { DraftPlanner } from './draft-depth.ts';
import type { DecodingMethod, Draft, Proposer, SpeculationCounts } from './method.ts';
import type { DraftModelRunner } from './draft-model.ts';
import type { Eagle3Runner } from './eagle3.ts';
import { NgramProposer } from './ngram.ts';

/** How a request speculates: where its drafts come from and how deep they go. */
export interface SpeculativeOptions {
  /**
   * where drafts come from: 'ngram' = prompt lookup over the prompt and the output so far
   * (ngram.ts); 'draft' = the engine's draft model (EngineOptions.draftModel, draft-model.ts);
   * 'eagle3' = the engine's EAGLE-3 head (EngineOptions.draftHead, eagle3.ts); or a function
   * making each sequence its own proposer
   */
  proposer: 'ngram' | 'draft' | 'eagle3' | (() => Proposer);
  /** draft tokens per step: a fixed number, or 'adaptive' (default: per row, from its acceptance and the measured step costs) */
  numDraftTokens?: number | 'adaptive';
  /** n-gram: the shortest suffix of the sequence a match may have (default 2) */
  ngramMin?: number;
  /** n-gram: the longest (default 5) */
  ngramMax?: number;
}

export const SPECULATIVE_DEFAULTS = { numDraftTokens: 'adaptive', ngramMin: 2, ngramMax: 5 } as const;
/** the most draft tokens a fixed depth may ask for */
export const MAX_DRAFT_TOKENS = 64;
/** the longest n-gram a match may have */
export const MAX_NGRAM = 64;

/** SpeculativeOptions with their defaults, checked; a RangeError names the field at fault. */
export function resolveSpeculative(o: SpeculativeOptions): Required<SpeculativeOptions> {
  if (o === null || typeof o !== 'object') throw new RangeError('speculative must be an object with a proposer');
  if (o.proposer !== 'ngram' && o.proposer !== 'draft' && o.proposer !== 'eagle3' && typeof o.proposer !== 'function')
    throw new RangeError(`speculative.proposer must be 'ngram', 'draft' or 'eagle3', got ${JSON.stringify(o.proposer)}`);
  const depth = o.numDraftTokens ?? SPECULATIVE_DEFAULTS.numDraftTokens;
  if (depth !== 'adaptive' && !(Number.isInteger(depth) && depth >= 1 && depth <= MAX_DRAFT_TOKENS))
    throw new RangeError(`speculative.numDraftTokens must be 'adaptive' or an integer from 1 to ${MAX_DRAFT_TOKENS}, got ${JSON.stringify(depth)}`);
  const ngramMin = o.ngramMin ?? Math.min(SPECULATIVE_DEFAULTS.ngramMin, o.ngramMax ?? Infinity);
  const ngramMax = o.ngramMax ?? Math.max(SPECULATIVE_DEFAULTS.ngramMax, ngramMin);
  for (const [field, n] of [['ngramMin', ngramMin], ['ngramMax', ngramMax]] as const) {
    if (!(Number.isInteger(n) && n >= 1 && n <= MAX_NGRAM)) throw new RangeError(`speculative.${field} must be an integer from 1 to ${MAX_NGRAM}, got ${JSON.stringify(n)}`);
  }
  if (ngramMin > ngramMax) throw new RangeError(`speculative.ngramMin (${ngramMin}) must not be above speculative.ngramMax (${ngramMax})`);
  return { proposer: o.proposer, numDraftTokens: depth, ngramMin, ngramMax };
}

/** The method of a sequence that speculates with `o` (resolved); 'draft' needs the engine's draft model. */
export function speculativeMethod(o: Required<SpeculativeOptions>, planner: DraftPlanner,
  drafters: { draftModel?: DraftModelRunner; draftHead?: Eagle3Runner } = {}): Speculative {
  let proposer: Proposer;
  if (o.proposer === 'ngram') proposer = new NgramProposer(o.ngramMin, o.ngramMax);
  else if (o.proposer === 'draft') {
    if (!drafters.draftModel) throw new RangeError("speculative.proposer 'draft' needs a draft model (EngineOptions.draftModel, --draft-model)");
    proposer = drafters.draftModel.proposer();
  } else if (o.proposer === 'eagle3') {
    if (!drafters.draftHead) throw new RangeError("speculative.proposer 'eagle3' needs an EAGLE-3 head (EngineOptions.draftHead, --draft-model)");
    proposer = drafters.draftHead.proposer();
  } else proposer = o.proposer();
  return new Speculative(proposer, o.numDraftTokens, planner);
}

/** the deepest an adaptive row drafts */
export const ADAPTIVE_MAX_DRAFT = 16;
/** the deepest an adaptive row asks a deferred proposer (a draft model: each token is a step of it) for */
export const ADAPTIVE_MAX_DEFERRED = 8;
/** an adaptive row asks a deferred proposer for tokens while the last one is kept with at least this probability */
const DEFERRED_MIN_GAIN = 0.3;
/** draft tokens an adaptive row whose proposer reads every step has verified before it may stop for good */
const GIVE_UP_AFTER_DRAFTS = 16;
/** an adaptive row's acceptance before it has drafted */
const ACCEPTANCE_PRIOR = 0.5;
/** how far one observed draft token moves a row's acceptance */
const ACCEPTANCE_RATE = 0.1;

export class Speculative implements DecodingMethod {
  readonly name = 'speculative';
  /** drafts end at the sequence's last position at the latest (Scheduler.addDrafts) */
  readonly kvLookahead = 0;
  readonly counts: SpeculationCounts = { draftTokens: 0, acceptedTokens: 0 };
  private rate = ACCEPTANCE_PRIOR;
  /** the tokens verify took, for accept */
  private pending?: RunToken[];
  /** verify's run ended where the grammar allows only a stop token: accept ends the row after it */
  private stopAfterRun = false;
  /** verify's run ended at a kept draft token the grammar forces text after (its KV is not kept) */
  private forcedAfterRun = false;
  /** the proposal last made, and the position its first token is for (a plain row checks that token) */
  private last?: { at: number; draft: Draft | undefined };
  /** the row would draft for its next token: its next step waits for this one's (not pipelined) */
  private drafting = true;
  /**
   * An adaptive row whose proposer reads every step (an EAGLE-3 head) stops for good the first
   * time drafting does not pay once GIVE_UP_AFTER_DRAFTS of its drafts were judged: from then on
   * it is a plain row, pipelined, and its proposer no longer runs for it (its head could not
   * catch up on the steps it would miss).
   */
  gaveUp = false;

  constructor(
    readonly proposer: Proposer,
    /** draft tokens per step, or 'adaptive' */
    private readonly depth: number | 'adaptive',
    private readonly planner: DraftPlanner,
  ) {
    if (depth !== 'adaptive' && !(Number.isInteger(depth) && depth >= 1)) throw new RangeError(`draft tokens must be an integer >= 1 or 'adaptive', got ${depth}`);
  }

  get acceptance(): number | undefined {
    return this.depth === 'adaptive' ? this.rate : undefined;
  }

  /**
   * Draft tokens a deferred proposer makes for this row a round: the fixed depth, or (adaptive) as
   * many as keep the last one's chance of being kept (acceptance^k) at DEFERRED_MIN_GAIN or more.
   */
  get draftDepth(): number {
    if (this.depth !== 'adaptive') return this.depth;
    let k = 1;
    for (let g = this.rate * this.rate; k < ADAPTIVE_MAX_DEFERRED && g >= DEFERRED_MIN_GAIN; g *= this.rate) k++;
    return k;
  }

  propose(seq: Sequence, max: number): Draft | undefined {
    let draft: Draft | undefined;
    if (this.proposer.deferred) draft = this.gaveUp ? undefined : this.proposer.propose(seq, max);
    else {
      const deepest = this.depth === 'adaptive' ? ADAPTIVE_MAX_DRAFT : this.depth;
      // accept() proposed for this position already, as deep as the method drafts
      draft = this.last?.at === seq.known ? this.last.draft : this.proposer.propose(seq, deepest);
      this.last = { at: seq.known, draft };
    }
    // a first token the grammar refuses would be rejected at once: the row is a plain one
    if (draft && seq.grammar && draft.tokens.length > 0 && seq.grammar.allowsNow(draft.tokens[0]!) === false) return undefined;
    return draft && draft.tokens.length > max ? trimDraft(draft, max) : draft;
  }

  pipelinable(_seq: Sequence, plain: boolean): boolean {
    return plain && !this.drafting && (!this.proposer.everyStep || this.gaveUp);
  }

  verify(seq: Sequence, row: ScheduledRow, sources: readonly TokenSource[]): number {
    this.pending = undefined;
    this.stopAfterRun = this.forcedAfterRun = false;
    const draft = row.draft;
    if (!draft) return row.count;
    const d = draft.tokens.length;
    const run: RunToken[] = [];
    let accepted = 0;
    let rejected = false;
    const grammar = seq.grammar;
    const length = seq.history.outputLength;
    try {
      for (let j = 0; j <= d; j++) {
        // a complete grammar that allows nothing but a stop token: the row ends here (accept)
        if (grammar?.onlyStopAllowed()) {
          this.stopAfterRun = true;
          break;
        }
        const src = sources[j]!;
        const x = draft.tokens[j];
        const q = draft.probs?.[j];
        const token = x !== undefined && q && 'logits' in src && !isGreedy(seq.sampler.params)
          ? this.rejectionStep(seq, src.logits, x, q)
          : takeToken(seq, src);
        run.push(token);
        grammar?.accept(token.id);
        if (token.id !== x) {
          rejected = x !== undefined;
          break; // rejected here, or the bonus token after the whole draft
        }
        seq.history.push(x); // the penalties at the next position count it
        accepted++;
        // the plain path appends the text the grammar forces after this token without sampling:
        // the run ends with it (its KV is computed again with the forced tokens, as a chunk)
        if (grammar && j < d && seq.request.topLogprobs === undefined && grammar.forcedTokens(seq.maxTokensTotal - seq.known - run.length).length > 0) {
          accepted--;
          this.forcedAfterRun = true;
          break;
        }
      }
    } finally {
      seq.history.truncate(length);
    }
    // uniforms the device rows past the run drew go back first, in order: the next tokens take them
    const unused: number[] = [];
    for (let j = run.length; j <= d; j++) {
      const src = sources[j];
      if (src && 'device' in src && src.u !== undefined) unused.push(src.u);
    }
    if (unused.length > 0) seq.uniformsBack.unshift(...unused);
    this.pending = run;
    // a run the grammar ended keeps every token it took: the draft tokens among them were accepted
    const kept = this.forcedAfterRun ? accepted + 1 : accepted;
    this.counts.draftTokens += d;
    this.counts.acceptedTokens += kept;
    this.planner.recordVerify(d, kept);
    for (let j = 0; j < kept; j++) this.observe(true);
    if (rejected) this.observe(false);
    return row.count - d + accepted;
  }

  accept(seq: Sequence, row: ScheduledRow, sources: readonly TokenSource[], finish: FinishFn): void {
    const run = this.pending;
    const stop = this.stopAfterRun;
    this.pending = undefined;
    this.stopAfterRun = this.forcedAfterRun = false;
    if (run) {
      appendTokens(seq, run, finish);
      if (stop && !seq.finished) finish(seq, 'stop');
      return;
    }
    // a plain row: its token is what the proposer's guess for this position is judged against
    const at = seq.known;
    const guess = this.last?.at === at ? this.last.draft?.tokens[0] : undefined;
    AUTOREGRESSIVE.accept(seq, row, sources, finish);
    if (guess !== undefined && seq.known > at) this.observe(seq.tokenAt(at) === guess);
    // what it would draft next, now that its token is in: nothing (or nothing that pays) lets its
    // next step pipeline; a pipelined row is not scheduled, so it proposes (and guesses) here
    this.drafting = false;
    // (a row with a grammar is never pipelined: it proposes at schedule time, with its mask in)
    if (seq.finished || seq.grammar) return;
    if (this.proposer.deferred) {
      if (this.gaveUp) return;
      this.drafting = this.depth !== 'adaptive' || this.planner.drafts(this.rate, this.draftDepth);
      // giving up is for good: only once the row's own drafts have been judged
      if (!this.drafting && this.proposer.everyStep) {
        if (this.counts.draftTokens >= GIVE_UP_AFTER_DRAFTS) this.gaveUp = true;
        else this.drafting = true;
      }
      return;
    }
    const next = this.propose(seq, Infinity);
    this.drafting = !!next && next.tokens.length > 0 && (this.depth !== 'adaptive' || this.planner.drafts(this.rate, next.tokens.length));
  }

  advance(seq: Sequence, finish: FinishFn): void {
    AUTOREGRESSIVE.advance(seq, finish);
  }

  /** One draft token judged (kept or not): the row's acceptance moves toward it. */
  private observe(kept: boolean): void {
    this.rate += ACCEPTANCE_RATE * ((kept ? 1 : 0) - this.rate);
  }

  /** Draft token `x`, drawn from `q`, judged against the target's logits by rejection sampling. */
  private rejectionStep(seq: Sequence, logits: Float32Array, x: number, q: Float32Array): RunToken {
    const params = seq.sampler.params;
    const p = samplingDistribution(processLogits(logits, params, seq.history, seq.grammar?.mask()), params);
    const { id } = verifyDraftToken(p, x, q, { nextFloat64: () => seq.sampler.nextUniform() });
    const k = seq.request.topLogprobs;
    if (k === undefined) return { id };
    const r = topLogprobs(logits, k, id);
    return { id, logprobs: { token_id: id, logprob: r.logprob, top: r.top.map((t) => ({ token_id: t.tokenId, logprob: t.logprob })) } };
  }
}
