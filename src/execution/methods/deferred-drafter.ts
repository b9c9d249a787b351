// What the engine's drafters (a draft model, draft-model.ts; an EAGLE-3 head, eagle3.ts) share: a
// KV cache of their own with one SequenceKv per target sequence they draft for, the draft each
// round made for a sequence's next position, the proposer every such sequence's speculative method
// asks (Proposer.deferred: the drafts are made outside the schedule), and turning drafting off for
// the engine's life when a drafter's step fails.

import type { KvCache, SequenceKv } from '../../state/kv-cache.ts';
import type { Sequence } from '../sequence.ts';
import type { Draft, Proposer } from './method.ts';

/** What a drafter drafts for: the depth a row asks for (speculative.ts's Speculative). */
export interface DeferredDrafting {
  /** draft tokens this row wants a round */
  readonly draftDepth: number;
  readonly proposer: Proposer;
  /** the row stopped drafting for good (Speculative.gaveUp) */
  readonly gaveUp?: boolean;
}

/** A sequence's state in a drafter: its KV there, and the last round's draft. */
export interface DrafterRow {
  kv: SequenceKv;
  /** tokens for positions at, at + 1, ... (the sequence's next ones when at === known) */
  draft?: { at: number; tokens: number[] };
}

export abstract class DeferredDrafter<Row extends DrafterRow> {
  protected readonly rows = new Map<Sequence, Row>();
  /** why drafting stopped (a drafter step failed), once it has */
  off?: string;
  /** drafter steps run (tests, logs) */
  steps = 0;

  protected constructor(
    protected readonly kv: KvCache,
    /** the proposer reads every step of its rows (Proposer.everyStep) */
    private readonly everyStep: boolean,
  ) {}

  /** The proposer of a sequence that drafts with this drafter: the draft its last round made for the next position. */
  proposer(): Proposer {
    return new DeferredProposer(this, this.everyStep);
  }

  /** The draft made for `seq`'s next token (at most `max` tokens), if the last round made one. */
  draftFor(seq: Sequence, max: number): Draft | undefined {
    const d = this.rows.get(seq)?.draft;
    if (!d || d.at !== seq.known || max <= 0) return undefined;
    return { tokens: d.tokens.slice(0, max) };
  }

  /** blocks of the drafter's KV that sequences hold (tests: 0 once every sequence is done) */
  get usedBlocks(): number {
    return this.kv.usedBlocks;
  }

  /** Frees the drafter's KV of `seq` (finished, or no longer drafting). */
  forget(seq: Sequence): void {
    const st = this.rows.get(seq);
    if (!st) return;
    this.kv.release(st.kv);
    this.rows.delete(seq);
  }

  dispose(): void {
    for (const seq of [...this.rows.keys()]) this.forget(seq);
    this.kv.dispose();
  }

  /** `seq`'s method, when it drafts with this drafter and has not stopped for good. */
  protected drafting(seq: Sequence): DeferredDrafting | undefined {
    const m = seq.method as Partial<DeferredDrafting>;
    return m.proposer instanceof DeferredProposer && m.proposer.drafter === this && m.draftDepth !== undefined && !m.gaveUp
      ? m as DeferredDrafting : undefined;
  }

  /** A drafter step failed (`what` names it): no row drafts from now on, none of `seqs` keeps its KV here. */
  protected turnOff(what: string, err: unknown, seqs: readonly Sequence[]): void {
    this.off = `${what} failed: ${(err as Error).message}`;
    console.error(`llmts: speculative drafts are off (${this.off}); rows decode plainly`);
    for (const seq of seqs) this.forget(seq);
  }
}

/** A sequence's view of a drafter: whatever its last round drafted for the next position. */
class DeferredProposer implements Proposer {
  readonly deferred = true;

  constructor(
    readonly drafter: DeferredDrafter<DrafterRow>,
    readonly everyStep: boolean,
  ) {}

  propose(seq: Sequence, max: number): Draft | undefined {
    return this.drafter.draftFor(seq, max);
  }
}
