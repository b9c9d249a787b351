// EAGLE-3 proposals: the engine's EAGLE-3 head (models/eagle3.ts) drafts each speculative row's
// next tokens from the target's own hidden states. Every target step hands out, for the rows that
// draft with the head, the residual stream entering the head's three fused layers at each of
// their tokens (StepBatch.hidden; such a step runs op by op). Once the step is postprocessed
// (Engine.readBack), the head runs over every row at once:
//   pairs  for each position p the step kept (verified), the pair (target state at p, token at
//          p + 1) at head KV position p: the head's KV mirrors the target's computed positions, so
//          a rejected draft's slots are simply written again by the next step's pairs;
//   chain  a row about to decode (its last pair predicts its next token) drafts on: draft token k
//          at position known - 2 + k, with the head's own output as its hidden state, gives
//          token k + 1.
// Drafts are greedy over the head's draft vocabulary (mapped to target ids), a deterministic draft
// for sampled rows too. The head must see every step of its rows, so they are never pipelined
// (Proposer.everyStep). A head step that fails turns drafting off for the engine's life.

import type { Tensor } from '../../contracts/backend.ts';
import type { HiddenRequest } from '../../models/decoder.ts';
import type { Eagle3Head, Eagle3Hidden, Eagle3PendingStep } from '../../models/eagle3.ts';
import type { KvAccess } from '../../models/kv-access.ts';
import { KvCache, type StepRow } from '../../state/kv-cache.ts';
import type { ScheduledRow } from '../scheduler.ts';
import type { Sequence } from '../sequence.ts';
import { DeferredDrafter, type DrafterRow } from './deferred-drafter.ts';

export interface Eagle3RunnerOptions {
  maxBatch: number;
  /** tokens of KV the head holds in all (the target's full-attention KV tokens) */
  kvTokens: number;
  blockSize: number;
  /** the most draft tokens a row asks for a round */
  maxDepth: number;
}

export class Eagle3Runner extends DeferredDrafter<DrafterRow> {
  /** the rows whose hidden states the last step asked for, in order (afterStep reads them so) */
  private requested = new Set<Sequence>();

  constructor(
    readonly head: Eagle3Head,
    opts: Eagle3RunnerOptions,
  ) {
    const c = head.config.layer, bs = opts.blockSize;
    // one full-attention layer (Eagle3Head.layerWindows); the head reads every step of its rows
    super(new KvCache(head.backend, [0], { numKvHeads: c.numKvHeads, headDim: c.headDim, blockSize: bs },
      () => Math.max(1, Math.ceil(opts.kvTokens / bs)) + opts.maxBatch * (Math.ceil(opts.maxDepth / bs) + 1)), true);
  }

  /** The hidden states a target step must hand out: every token of its rows that draft with this head. */
  hiddenRequest(rows: readonly ScheduledRow[]): HiddenRequest | undefined {
    if (this.off) return undefined;
    const tokens: number[] = [];
    this.requested = new Set();
    let at = 0;
    for (const row of rows) {
      if (this.drafting(row.seq)) {
        for (let j = 0; j < row.count; j++) tokens.push(at + j);
        this.requested.add(row.seq);
      }
      at += row.count;
    }
    return tokens.length > 0 ? { layers: this.head.targetLayers, tokens } : undefined;
  }

  /**
   * After a target step whose hidden states (`hidden`, one tensor per fused layer, rows in the
   * order hiddenRequest listed the tokens) are still on the device, and its rows postprocessed:
   * the head's pairs over each row's kept positions, then the chain of drafts for the rows about
   * to decode.
   */
  async afterStep(rows: readonly ScheduledRow[], hidden: readonly Tensor[]): Promise<void> {
    if (this.off) return;
    const work: { seq: Sequence; st: DrafterRow; start: number; kept: number; hiddenAt: number; depth: number; tokens: number[] }[] = [];
    let h = 0;
    for (const row of rows) {
      if (!this.requested.has(row.seq)) continue;
      const hiddenAt = h;
      h += row.count;
      const seq = row.seq;
      const m = this.drafting(seq);
      if (!m) {
        this.forget(seq); // it stopped drafting for good in this step's postprocess: no head KV from now on
        continue;
      }
      if (seq.finished) {
        this.forget(seq);
        continue;
      }
      const kept = seq.computed - row.start;
      if (kept <= 0) continue;
      const n = seq.known;
      // the last pair predicts token n only when it sits at n - 2 (the row decodes next)
      const decodes = row.start + kept === n - 1;
      const depth = decodes ? Math.max(0, Math.min(m.draftDepth, seq.maxTokensTotal - n)) : 0;
      let st = this.rows.get(seq);
      if (!st) {
        st = { kv: this.kv.newSequence() };
        this.rows.set(seq, st);
      }
      st.draft = undefined;
      const end = Math.max(row.start + kept, n - 2 + depth);
      if (!this.kv.canGrow(st.kv, row.start, end)) {
        // no room: the head's KV would miss these pairs, so the row stops drafting
        this.forget(seq);
        continue;
      }
      this.kv.grow(st.kv, row.start, end);
      work.push({ seq, st, start: row.start, kept, hiddenAt, depth, tokens: [] });
    }
    if (work.length === 0) return;
    const pending: Eagle3PendingStep[] = [];
    try {
      // the pairs: (target state at p, token at p + 1) for every kept position p
      const ids: number[] = [], index: number[] = [], logitTokens: number[] = [];
      const drafting: (typeof work)[number][] = [];
      const lastPair: number[] = [];
      for (const w of work) {
        for (let j = 0; j < w.kept; j++) {
          ids.push(w.seq.tokenAt(w.start + j + 1));
          index.push(w.hiddenAt + j);
        }
        if (w.depth > 0) {
          logitTokens.push(ids.length - 1);
          drafting.push(w);
          lastPair.push(ids.length - 1);
        }
      }
      const states = [hidden[0]!, hidden[1]!, hidden[2]!] as const;
      let step = this.launch(Int32Array.from(ids), work.map((w) => ({ seq: w.st.kv, start: w.start, count: w.kept })), logitTokens,
        { kind: 'target', states, index });
      pending.push(step);
      let picked = (await step.result).tokens!;
      drafting.forEach((w, i) => w.tokens.push(picked[i]!));
      // the chain: draft token k at position n - 2 + k, the head's own output as its hidden state
      let chain = drafting, from = lastPair;
      for (let k = 1; ; k++) {
        const next = chain.map((w, i) => ({ w, i })).filter(({ w }) => w.depth > k);
        if (next.length === 0) break;
        step = this.launch(Int32Array.from(next.map(({ w }) => w.tokens[k - 1]!)),
          next.map(({ w }) => ({ seq: w.st.kv, start: w.seq.known - 2 + k, count: 1 })), next.map((_, i) => i),
          { kind: 'draft', state: step.hidden, index: next.map(({ i }) => from[i]!) });
        pending.push(step);
        picked = (await step.result).tokens!;
        next.forEach(({ w }, i) => w.tokens.push(picked[i]!));
        chain = next.map(({ w }) => w);
        from = next.map((_, i) => i);
      }
    } catch (err) {
      this.turnOff('an EAGLE-3 head step', err, work.map((w) => w.seq));
      return;
    } finally {
      for (const p of pending) p.release();
    }
    for (const w of work) if (w.depth > 0) w.st.draft = { at: w.seq.known, tokens: w.tokens };
  }

  private launch(tokens: Int32Array, rows: StepRow[], logitTokens: number[], hidden: Eagle3Hidden): Eagle3PendingStep {
    this.steps++;
    return this.head.launch({ tokens, rows, logitTokens, hidden, argmaxOnly: true }, this.kv as KvAccess<StepRow>);
  }
}
