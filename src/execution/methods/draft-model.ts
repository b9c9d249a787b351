// Draft-model proposals: a small model that shares the target's vocabulary drafts each speculative
// row's next tokens greedily, in a phase of its own before each schedule (Engine.loop calls
// prepare), batched over every row that will decode in the coming step. The speculative method
// then verifies them in the target's step like any other draft (speculative.ts): the output is
// the target's whatever the draft says, so greedy drafts serve sampled rows too (a point-mass
// draft, as an n-gram's).
//
// The draft model keeps its own paged KV (its own KvCache, as many tokens as the target's) per
// target sequence. A round for a row at n known tokens:
//   catch-up  the tokens its KV lacks, [computed, n), in chunks under the step budget (the whole
//             prompt the first time; after a verify, the accepted tokens and the target's own);
//             the last one's logits give draft token 1;
//   chain     draft token k fed at position n + k - 1 gives token k + 1, one token a row a step
//             (decode steps: on a GPU they replay the draft model's captured graphs).
// The KV of the draft tokens stays: next round, the positions whose token the target accepted are
// already computed. A draft step that fails turns drafting off for the engine's life (rows decode
// plainly) rather than failing any request.

import type { KvAccess } from '../../models/kv-access.ts';
import { argmax } from '../../sampling/index.ts';
import { KvCache, type StepRow } from '../../state/kv-cache.ts';
import type { LoadedModel } from '../load-model.ts';
import type { Sequence } from '../sequence.ts';
import { DeferredDrafter, type DrafterRow } from './deferred-drafter.ts';

export interface DraftModelOptions {
  /** rows drafting together at most (the target's maxBatch) */
  maxBatch: number;
  /** longest sequence (the target's maxModelLen) */
  maxModelLen: number;
  /** tokens of KV the draft's full-attention layers hold in all (the target's) */
  kvTokens: number;
  /** tokens a catch-up step computes at most */
  tokenBudget: number;
  blockSize: number;
  /** StepBatch.graphWidth of the chain steps (undefined: op by op) */
  graphWidth?: number;
}

interface RowState extends DrafterRow {
  /** positions of the draft's KV that hold the sequence's own tokens (the last round's draft's KV is in too, but its last token's) */
  computed: number;
}

/** Checks that `draft` can propose for `target`: one vocabulary, one tokenizer. */
export function checkDraftModel(target: Pick<LoadedModel, 'config' | 'encode'>, draft: Pick<LoadedModel, 'config' | 'encode' | 'dir'>): void {
  if (draft.config.vocabSize !== target.config.vocabSize) {
    throw new RangeError(`the draft model (${draft.dir}) has a vocabulary of ${draft.config.vocabSize} tokens, the target ${target.config.vocabSize}: ` +
      'a draft model must share the target\'s tokenizer');
  }
  const probe = 'def draft(x):\n    return "speculative" + str(x) # 0123456789 çé中文';
  const a = target.encode(probe), b = draft.encode(probe);
  if (a.length !== b.length || a.some((t, i) => t !== b[i])) {
    throw new RangeError(`the draft model (${draft.dir}) tokenizes text differently from the target: a draft model must share the target's tokenizer`);
  }
}

export class DraftModelRunner extends DeferredDrafter<RowState> {
  constructor(
    readonly draft: LoadedModel,
    private readonly opts: DraftModelOptions,
  ) {
    const cfg = draft.config, bs = opts.blockSize;
    super(new KvCache(draft.model.backend, cfg.layers.map((l) => l.window), {
      numKvHeads: cfg.numKvHeads, headDim: cfg.headDim, blockSize: bs,
    }, () => Math.max(1, Math.ceil(opts.kvTokens / bs)) + opts.maxBatch * 2), false);
  }

  /**
   * Drafts for every running sequence that drafts with this model and computes its next token in
   * the coming step (its prompt done), and frees what finished sequences held.
   */
  async prepare(running: readonly Sequence[]): Promise<void> {
    this.sweep(running);
    if (this.off) return;
    const work: { seq: Sequence; st: RowState; n: number; depth: number; fed: number; tokens: number[] }[] = [];
    for (const seq of running) {
      const m = this.drafting(seq);
      if (!m) continue;
      if (seq.finished || !seq.kv || seq.computed !== seq.known - 1) continue;
      const n = seq.known;
      let st = this.rows.get(seq);
      if (st?.draft?.at === n) continue; // drafted for this position already
      const depth = Math.min(m.draftDepth, seq.maxTokensTotal - n, this.opts.maxModelLen - n);
      if (depth < 1) continue;
      if (!st) {
        st = { kv: this.kv.newSequence(), computed: 0 };
        this.rows.set(seq, st);
      }
      this.revalidate(seq, st, n);
      if (!this.kv.canGrow(st.kv, st.computed, n + depth - 1)) continue; // no room this round: a plain row
      this.kv.grow(st.kv, st.computed, n + depth - 1);
      work.push({ seq, st, n, depth, fed: st.computed, tokens: [] });
    }
    if (work.length === 0) return;
    try {
      // catch-up: each row's missing tokens, the last one's logits giving its first draft token
      for (let left = work; left.length > 0; left = left.filter((w) => w.fed < w.n)) {
        let budget = this.opts.tokenBudget;
        const parts: { w: (typeof work)[number]; count: number }[] = [];
        for (const w of left) {
          const count = Math.min(w.n - w.fed, budget);
          if (count <= 0) break;
          parts.push({ w, count });
          budget -= count;
        }
        const ids: number[] = [];
        const logitOf: (typeof work)[number][] = [];
        const logitTokens: number[] = [];
        for (const { w, count } of parts) {
          for (let p = w.fed; p < w.fed + count; p++) ids.push(w.seq.tokenAt(p));
          if (w.fed + count === w.n) {
            logitTokens.push(ids.length - 1);
            logitOf.push(w);
          }
        }
        const picked = await this.step(ids, parts.map(({ w, count }) => ({ seq: w.st.kv, start: w.fed, count })), logitTokens, false);
        for (const { w, count } of parts) w.fed += count;
        logitOf.forEach((w, i) => w.tokens.push(picked[i]!));
      }
      // the chain: draft token k at position n + k - 1 gives token k + 1
      for (let k = 1; ; k++) {
        const chain = work.filter((w) => w.depth > k);
        if (chain.length === 0) break;
        const picked = await this.step(chain.map((w) => w.tokens[k - 1]!), chain.map((w) => ({ seq: w.st.kv, start: w.n + k - 1, count: 1 })),
          chain.map((_, i) => i), true);
        chain.forEach((w, i) => w.tokens.push(picked[i]!));
      }
    } catch (err) {
      this.turnOff('a draft-model step', err, work.map((w) => w.seq));
      return;
    }
    for (const w of work) {
      w.st.computed = w.n;
      w.st.draft = { at: w.n, tokens: w.tokens };
    }
  }

  override dispose(): void {
    this.draft.model.releaseGraphs(this.kv); // the chain steps' graphs replay into this KV's pools
    super.dispose();
  }

  /** The positions after the last round's first drafted one whose token the target kept are computed already. */
  private revalidate(seq: Sequence, st: RowState, n: number): void {
    const d = st.draft;
    if (d) {
      let p = d.at;
      // the KV holds draft tokens 0 .. length - 2 (the last was never fed)
      while (p < n - 1 && p - d.at < d.tokens.length - 1 && seq.tokenAt(p) === d.tokens[p - d.at]) p++;
      st.computed = p;
      st.draft = undefined;
    }
    st.computed = Math.min(st.computed, n - 1);
  }

  private sweep(running: readonly Sequence[]): void {
    if (this.rows.size === 0) return;
    const live = new Set(running);
    for (const seq of [...this.rows.keys()]) if (seq.finished || !live.has(seq)) this.forget(seq);
  }

  /** One draft-model step; the greedy token of each logit row. */
  private async step(ids: number[], rows: StepRow[], logitTokens: number[], decode: boolean): Promise<number[]> {
    this.steps++;
    const res = await this.draft.model.step({
      tokens: Int32Array.from(ids), rows, logitTokens, graphWidth: decode ? this.opts.graphWidth : undefined,
    }, this.kv as KvAccess<StepRow>, logitTokens.map(() => false));
    if (res.tokens) return Array.from(res.tokens.subarray(0, logitTokens.length));
    const V = this.draft.config.vocabSize;
    // a row of nothing but -Infinity / NaN drafts token 0 (the target judges it like any other)
    return logitTokens.map((_, i) => Math.max(0, argmax(res.logits.subarray(i * V, (i + 1) * V))));
  }
}
