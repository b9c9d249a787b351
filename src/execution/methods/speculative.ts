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
// time (appendTokens). Rows with a grammar do not draft (their jump-forward already appends what
// the grammar forces); nor do rows of models whose rope depends on the sequence length (the
// engine gives them the autoregressive method).
//
// Depth: a fixed number of draft tokens, or adaptive (draft-depth.ts), from the row's recent
// acceptance per draft token. A row whose drafting does not pay is a plain row (and pipelines):
// it still checks what its proposer would have proposed against the token it got, so its
// acceptance follows the text, and drafting resumes when the text turns repetitive.

import { isGreedy, processLogits, samplingDistribution, topLogprobs, verifyDraftToken } from '../../sampling/index.ts';
import { appendTokens, type FinishFn, type RunToken } from '../append-tokens.ts';
import type { ScheduledRow } from '../scheduler.ts';
import type { Sequence } from '../sequence.ts';
import type { TokenSource } from '../token-accept.ts';
import { AUTOREGRESSIVE, takeToken } from './autoregressive.ts';
import type { DraftPlanner } from './draft-depth.ts';
import type { DecodingMethod, Draft, Proposer, SpeculationCounts } from './method.ts';
import { NgramProposer } from './ngram.ts';

/** How a request speculates: where its drafts come from and how deep they go. */
export interface SpeculativeOptions {
  /**
   * where drafts come from: 'ngram' = prompt lookup over the prompt and the output so far
   * (ngram.ts); or a function making each sequence its own proposer
   */
  proposer: 'ngram' | (() => Proposer);
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
  if (o.proposer !== 'ngram' && typeof o.proposer !== 'function') throw new RangeError(`speculative.proposer must be 'ngram', got ${JSON.stringify(o.proposer)}`);
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

/** The method of a sequence that speculates with `o` (resolved). */
export function speculativeMethod(o: Required<SpeculativeOptions>, planner: DraftPlanner): Speculative {
  const proposer = o.proposer === 'ngram' ? new NgramProposer(o.ngramMin, o.ngramMax) : o.proposer();
  return new Speculative(proposer, o.numDraftTokens, planner);
}

/** the deepest an adaptive row drafts */
export const ADAPTIVE_MAX_DRAFT = 16;
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
  /** the first token last proposed, and the position it was for (a plain row checks it) */
  private guess?: { at: number; token: number };
  /** adaptive: the row's drafting does not pay now */
  private off = false;

  constructor(
    private readonly proposer: Proposer,
    /** draft tokens per step, or 'adaptive' */
    private readonly depth: number | 'adaptive',
    private readonly planner: DraftPlanner,
  ) {
    if (depth !== 'adaptive' && !(Number.isInteger(depth) && depth >= 1)) throw new RangeError(`draft tokens must be an integer >= 1 or 'adaptive', got ${depth}`);
  }

  get acceptance(): number | undefined {
    return this.depth === 'adaptive' ? this.rate : undefined;
  }

  propose(seq: Sequence, max: number): Draft | undefined {
    if (seq.grammar) return undefined;
    const draft = this.proposer.propose(seq, Math.min(max, this.depth === 'adaptive' ? ADAPTIVE_MAX_DRAFT : this.depth));
    this.guess = draft && draft.tokens.length > 0 ? { at: seq.known, token: draft.tokens[0]! } : undefined;
    return draft;
  }

  pipelinable(_seq: Sequence, plain: boolean): boolean {
    return plain && this.depth === 'adaptive' && this.off;
  }

  verify(seq: Sequence, row: ScheduledRow, sources: readonly TokenSource[]): number {
    this.pending = undefined;
    const draft = row.draft;
    if (!draft) return row.count;
    const d = draft.tokens.length;
    const run: RunToken[] = [];
    let accepted = 0;
    const length = seq.history.outputLength;
    try {
      for (let j = 0; j <= d; j++) {
        const src = sources[j]!;
        const x = draft.tokens[j];
        const q = draft.probs?.[j];
        const token = x !== undefined && q && 'logits' in src && !isGreedy(seq.sampler.params)
          ? this.rejectionStep(seq, src.logits, x, q)
          : takeToken(seq, src);
        run.push(token);
        if (token.id !== x) break; // rejected here, or the bonus token after the whole draft
        seq.history.push(x); // the penalties at the next position count it
        accepted++;
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
    this.counts.draftTokens += d;
    this.counts.acceptedTokens += accepted;
    this.planner.recordVerify(d, accepted);
    for (let j = 0; j < accepted; j++) this.observe(true);
    if (accepted < d) this.observe(false);
    return row.count - d + accepted;
  }

  accept(seq: Sequence, row: ScheduledRow, sources: readonly TokenSource[], finish: FinishFn): void {
    const run = this.pending;
    this.pending = undefined;
    if (run) {
      appendTokens(seq, run, finish);
      return;
    }
    // a plain row: its token is what the proposer's guess for this position is judged against
    const at = seq.known;
    const guess = this.guess?.at === at ? this.guess.token : undefined;
    this.guess = undefined;
    AUTOREGRESSIVE.accept(seq, row, sources, finish);
    if (guess !== undefined && seq.known > at) this.observe(seq.tokenAt(at) === guess);
    // a row that pipelines is not scheduled (nor asked to propose): it guesses here, for its next token
    if (this.off && !seq.finished && !seq.grammar) {
      const next = this.proposer.propose(seq, 1);
      if (next && next.tokens.length > 0) this.guess = { at: seq.known, token: next.tokens[0]! };
    }
  }

  advance(seq: Sequence, finish: FinishFn): void {
    AUTOREGRESSIVE.advance(seq, finish);
  }

  /** One draft token judged (kept or not): the row's acceptance moves toward it. */
  private observe(kept: boolean): void {
    this.rate += ACCEPTANCE_RATE * ((kept ? 1 : 0) - this.rate);
    if (this.depth === 'adaptive') this.off = !this.planner.drafts(this.rate);
  }

  /** Draft token `x`, drawn from `q`, judged against the target's logits by rejection sampling. */
  private rejectionStep(seq: Sequence, logits: Float32Array, x: number, q: Float32Array): RunToken {
    const params = seq.sampler.params;
    const p = samplingDistribution(processLogits(logits, params, seq.history), params);
    const { id } = verifyDraftToken(p, x, q, { nextFloat64: () => seq.sampler.nextUniform() });
    const k = seq.request.topLogprobs;
    if (k === undefined) return { id };
    const r = topLogprobs(logits, k, id);
    return { id, logprobs: { token_id: id, logprob: r.logprob, top: r.top.map((t) => ({ token_id: t.tokenId, logprob: t.logprob })) } };
  }
}
