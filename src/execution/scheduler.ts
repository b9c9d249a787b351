// Decides what every step computes, by the catch-up rule (vLLM v1): each running sequence is
// owed `known - computed` tokens; a step hands them out under a token budget, decode rows and
// prefill chunks alike, in one flattened batch. There is no separate prefill phase.
//
// Admission is queue-don't-OOM: a sequence is admitted only when its worst case (prompt +
// max_tokens, per KV group) fits beside the worst cases already promised, so a running sequence
// can never run out of blocks and nothing is ever preempted. One that could never fit is
// refused when it arrives.
//
// Prefix reuse: an admitted sequence first takes the cached blocks of its prompt's longest cached
// prefix (KvCache.attachPrefix) and starts with computed = those tokens; the catch-up rule then
// computes only the rest. The promise stays the full worst case, so a block shared by several
// sequences is counted in each of their promises (conservative), and evictable cached blocks count
// as free (allocation evicts them): a running sequence still never runs out of blocks.
//
// Drafts: a row that reaches the end of its known tokens may also compute tokens its decoding
// method proposes after them (methods/), as deep as the draft planner allows under the budget
// left, never past the sequence's last position (so its worst case covers their KV, plus the
// method's kvLookahead). Each draft token has a logit row of its own: STEP_DRAFT_TOKENS bounds
// them per step, so a step's logits stay within a few dozen rows of a plain step's.

import { blocksPerSequence, type KvCache } from '../state/kv-cache.ts';
import type { Draft } from './methods/method.ts';
import type { Sequence } from './sequence.ts';

/** draft tokens one step computes at most, over all its rows */
export const STEP_DRAFT_TOKENS = 64;

export interface SchedulerOptions {
  /** rows decoding together */
  maxBatch: number;
  /** sequences waiting for admission before new ones get QueueFullError */
  maxQueued: number;
  /** tokens computed per step (decode rows + prefill chunks) */
  tokenBudget: number;
  /** how deep the rows that propose drafts draft (undefined: no row drafts) */
  drafts?: DraftPlanning;
}

/** A row about to compute its sequence's next token, with what its method proposes after it. */
export interface DraftAsk {
  row: ScheduledRow;
  draft: Draft;
}

/** Decides the depth of each proposed draft of a step (methods/draft-depth.ts). */
export interface DraftPlanning {
  /**
   * Per ask, how many of its draft's tokens the row computes (0 .. its length), `budget` tokens
   * at most in all; `rows` is the step as scheduled without drafts.
   */
  depths(asks: readonly DraftAsk[], rows: readonly ScheduledRow[], budget: number): number[];
}

export interface ScheduledRow {
  seq: Sequence;
  start: number;
  count: number;
  /** true when this row reaches the end of its known tokens, so it samples the next one */
  sample: boolean;
  /**
   * Tokens computed after the known ones (count includes them): a draft its method verifies.
   * Each has a logit row of its own, after the one of the last known position.
   */
  draft?: Draft;
}

/** Logit rows a scheduled row needs: its last known position and each draft token (0: a prefill chunk). */
export function logitRowsOf(row: ScheduledRow): number {
  return row.sample ? 1 + (row.draft?.tokens.length ?? 0) : 0;
}

/** Prefix-cache outcomes of admitted sequences (for metrics). */
export interface PrefixCounters {
  /** admitted sequences whose prompt had at least one reusable block */
  queries: number;
  /** of those, how many reused something, and how many of them restored blocks from the SSD tier */
  hits: number;
  ssdHits: number;
  /** prompt tokens served from cache, by tier */
  ramTokens: number;
  ssdTokens: number;
}

export class QueueFullError extends Error {}
export class NeverFitsError extends Error {}

export class Scheduler {
  readonly waiting: Sequence[] = [];
  readonly running: Sequence[] = [];
  /** blocks promised to running sequences, per KV group */
  private readonly promised: number[];
  readonly prefix: PrefixCounters = { queries: 0, hits: 0, ssdHits: 0, ramTokens: 0, ssdTokens: 0 };

  constructor(
    private readonly kv: KvCache,
    readonly opts: SchedulerOptions,
  ) {
    this.promised = kv.groups.map(() => 0);
  }

  /** Worst-case blocks per group for a sequence's whole life (with what its method may compute past it). */
  private worstCase(seq: Sequence): number[] {
    const bs = this.kv.shape.blockSize;
    const tokens = seq.maxTokensTotal + seq.method.kvLookahead;
    return this.kv.groups.map((g) => blocksPerSequence(g.spec.window, tokens, bs, this.opts.tokenBudget));
  }

  /** Queues a sequence, or throws when it can never fit or the queue is full. */
  add(seq: Sequence): void {
    const need = this.worstCase(seq);
    need.forEach((n, g) => {
      const cap = this.kv.groups[g].pool.numBlocks;
      if (n > cap)
        throw new NeverFitsError(
          `the request needs ${seq.maxTokensTotal} tokens of KV cache (prompt ${seq.prompt.length} + max_tokens ${seq.maxTokensTotal - seq.prompt.length}); the cache holds ${cap * this.kv.shape.blockSize}`,
        );
    });
    if (this.waiting.length >= this.opts.maxQueued) throw new QueueFullError(`queue full (${this.opts.maxQueued} waiting)`);
    this.waiting.push(seq);
  }

  get hasWork(): boolean {
    return this.waiting.length > 0 || this.running.length > 0;
  }

  /** true when `need` blocks per group fit beside what is promised */
  private fits(need: readonly number[]): boolean {
    return need.every((n, g) => this.promised[g] + n <= this.kv.groups[g].pool.numBlocks);
  }

  private admit(seq: Sequence): boolean {
    if (seq.restoring) return false; // its prefix is being read back from the SSD tier
    const need = this.worstCase(seq);
    if (!this.fits(need)) return false;
    need.forEach((n, g) => (this.promised[g] += n));
    seq.reservedBlocks = need;
    seq.kv = this.kv.newSequence();
    this.attachPrefix(seq);
    this.running.push(seq);
    return true;
  }

  private attachPrefix(seq: Sequence): void {
    if (seq.prefixHashes.length === 0) return;
    let got;
    try {
      got = this.kv.attachPrefix(seq.kv!, seq.prefixHashes, seq.restored);
    } catch {
      // restored data the backend would not take: compute the prompt instead
      this.kv.release(seq.kv!);
      got = this.kv.attachPrefix(seq.kv!, seq.prefixHashes);
    }
    seq.restored = undefined;
    seq.computed = got.tokens;
    seq.cachedTokens = got.tokens;
    const bs = this.kv.shape.blockSize;
    const c = this.prefix;
    c.queries++;
    if (got.tokens > 0) c.hits++;
    if (got.ssdBlocks > 0) c.ssdHits++;
    c.ramTokens += got.ramBlocks * bs;
    c.ssdTokens += got.ssdBlocks * bs;
  }

  /** Removes a finished or cancelled sequence and returns its blocks and promise. */
  retire(seq: Sequence): void {
    const r = this.running.indexOf(seq);
    if (r >= 0) {
      this.running.splice(r, 1);
      seq.reservedBlocks.forEach((n, g) => (this.promised[g] -= n));
      seq.reservedBlocks = [];
      if (seq.kv) this.kv.release(seq.kv);
      return;
    }
    const w = this.waiting.indexOf(seq);
    if (w >= 0) this.waiting.splice(w, 1);
  }

  /**
   * true when schedule(), with `tokens` of the budget taken by running sequences, would admit the
   * queue's head now (the engine's pipelined decode drains for it).
   */
  wouldAdmit(tokens: number): boolean {
    const head = this.waiting[0];
    if (!head || head.restoring || this.running.length >= this.opts.maxBatch || tokens >= this.opts.tokenBudget) return false;
    return this.fits(this.worstCase(head));
  }

  /**
   * Plans a decode step ahead of the engine's bookkeeping (its pipelined decode): each sequence
   * computes the one position `start` whose token a step still in flight is producing. Allocates
   * the blocks as schedule() does; the position is below the sequence's worst case, so its promise
   * covers them.
   */
  scheduleAhead(next: readonly { seq: Sequence; start: number }[]): ScheduledRow[] {
    return next.map(({ seq, start }) => {
      if (start >= seq.maxTokensTotal) throw new Error(`scheduleAhead: position ${start} is past the sequence's ${seq.maxTokensTotal} tokens`);
      this.kv.grow(seq.kv!, start, start + 1);
      return { seq, start, count: 1, sample: true };
    });
  }

  /**
   * Plans one step. `isPaused` lets a sequence whose reader lags sit out (its KV stays).
   * Allocates the blocks the planned rows need.
   */
  schedule(isPaused: (seq: Sequence) => boolean = () => false): ScheduledRow[] {
    const rows: ScheduledRow[] = [];
    let budget = this.opts.tokenBudget;
    const take = (seq: Sequence) => {
      const owed = seq.known - seq.computed;
      const count = Math.min(owed, budget);
      if (count <= 0) return;
      this.kv.grow(seq.kv!, seq.computed, seq.computed + count);
      rows.push({ seq, start: seq.computed, count, sample: seq.computed + count === seq.known });
      budget -= count;
    };
    for (const seq of this.running) {
      if (rows.length >= this.opts.maxBatch || budget <= 0) break;
      if (!isPaused(seq)) take(seq);
    }
    while (this.waiting.length > 0 && this.running.length < this.opts.maxBatch && budget > 0) {
      if (!this.admit(this.waiting[0])) break; // FIFO: the head waits for room, nobody overtakes it
      take(this.waiting.shift()!);
    }
    if (budget > 0 && this.opts.drafts) this.addDrafts(rows, Math.min(budget, STEP_DRAFT_TOKENS), this.opts.drafts);
    return rows;
  }

  /**
   * Extends each sampling row by the draft its method proposes, as deep as `planner` decides,
   * under the `budget` left; allocates the blocks of the drafted positions. A draft never passes
   * the sequence's last position, so the sequence's promise covers them.
   */
  private addDrafts(rows: ScheduledRow[], budget: number, planner: DraftPlanning): void {
    const asks: DraftAsk[] = [];
    for (const row of rows) {
      if (!row.sample) continue;
      const seq = row.seq;
      const room = Math.min(budget, seq.maxTokensTotal + seq.method.kvLookahead - seq.known);
      if (room <= 0) continue;
      const draft = seq.method.propose(seq, room);
      if (draft && draft.tokens.length > 0) asks.push({ row, draft: draft.tokens.length > room ? trimDraft(draft, room) : draft });
    }
    if (asks.length === 0) return;
    const depths = planner.depths(asks, rows, budget);
    asks.forEach(({ row, draft }, i) => {
      const d = Math.min(depths[i] ?? 0, draft.tokens.length, budget);
      if (d <= 0) return;
      budget -= d;
      this.kv.grow(row.seq.kv!, row.start, row.start + row.count + d);
      row.count += d;
      row.draft = d === draft.tokens.length ? draft : trimDraft(draft, d);
    });
  }
}

/** The first `n` tokens of a draft (and their distributions). */
export function trimDraft(draft: Draft, n: number): Draft {
  return { tokens: draft.tokens.slice(0, n), ...(draft.probs ? { probs: draft.probs.slice(0, n) } : {}) };
}
