// An EAGLE-3 draft head on a backend (its checkpoint: artifacts/eagle3.ts). One draft step over a
// flattened batch, each token at its own position of its row, the head's one layer reading and
// writing its own paged KV (one layer, the target's rows' positions):
//
//   h        the hidden state: fc(concat(low, mid, high)) of the target's states entering the
//            fused layers, for a context pair; the head's own previous output, for a chained draft
//   x        concat(input_layernorm(embed(token)), hidden_norm(h))
//   r        h + o_proj(attention(q(x), k(x), v(x)))          (hidden_norm(h) + ... with norm_before_residual)
//   out      r + mlp(post_attention_layernorm(r))              the next draft step's hidden state
//   logits   lm_head(norm(out)) over the draft vocabulary; draft id d is target id draftToTarget[d]
//
// The pair at position p is (the target's hidden state at p, the token at p + 1) and predicts the
// token at p + 2. There is no concat op: each half of q/k/v (each third of fc) is its own matrix
// (artifacts/eagle3.ts columnSource) and the products add.

import type { Backend, Tensor } from '../contracts/backend.ts';
import { columnSource, type Eagle3Config, type Eagle3Dir } from '../artifacts/eagle3.ts';
import type { KvAccess, RowSpan } from './kv-access.ts';
import { RopeTables } from './rope-tables.ts';

export interface Eagle3Weights {
  /** fc's column blocks, one per fused target layer (low, mid, high): [hidden, targetHidden] */
  fc: readonly [Tensor, Tensor, Tensor];
  hiddenNorm: Tensor;
  inputNorm: Tensor;
  /** q/k/v's halves over the embedding (E) and over the hidden state (H): [out, hidden] */
  qE: Tensor; qH: Tensor; kE: Tensor; kH: Tensor; vE: Tensor; vH: Tensor;
  o: Tensor;
  postAttnNorm: Tensor;
  gate: Tensor; up: Tensor; down: Tensor;
  norm: Tensor;
  /** [draftVocab, hidden] */
  lmHead: Tensor;
  /** the token embedding: the head's own, or the target's */
  embed: Tensor;
}

/** Where a draft step's hidden states come from, one row of them per batch token. */
export type Eagle3Hidden =
  /** the target's states entering the fused layers (DecoderModel's StepBatch.hidden), [n, targetHidden] each; `index`: which row per token (default 0..T-1) */
  | { kind: 'target'; states: readonly [Tensor, Tensor, Tensor]; index?: readonly number[] }
  /** an earlier draft step's output (Eagle3PendingStep.hidden), [n, hidden]; `index` as above */
  | { kind: 'draft'; state: Tensor; index?: readonly number[] };

export interface Eagle3Batch<Row extends RowSpan> {
  /** target token ids, one per token of the rows (for a context pair: the token after its hidden state's position) */
  tokens: Int32Array;
  /** rows in order; row r owns tokens [sum of earlier counts, + count), at positions of the head's KV */
  rows: Row[];
  /** indices into `tokens` whose draft logits are wanted */
  logitTokens: number[];
  hidden: Eagle3Hidden;
  /** read back only the device argmax of each logit row (as target ids), not the logits */
  argmaxOnly?: boolean;
}

export interface Eagle3StepResult {
  /** f32 [logit rows, draftVocab] (empty with argmaxOnly); Eagle3Head.targetLogits maps them */
  logits: Float32Array;
  /** with argmaxOnly: each logit row's greedy draft, as a target id */
  tokens?: Int32Array;
}

export interface Eagle3PendingStep {
  result: Promise<Eagle3StepResult>;
  /** the step's output [T, hidden] on the device, the next step's hidden state; valid until release */
  hidden: Tensor;
  /** frees `hidden` (idempotent) */
  release(): void;
}

/** Loads a head's weights; `targetEmbed` is the target's token embedding (DecoderModel.weights.embed). */
export async function loadEagle3Weights(backend: Backend, dir: Eagle3Dir, targetEmbed: Tensor): Promise<Eagle3Weights> {
  const { names, weights: w, config } = dir;
  const D = config.layer.hiddenSize, Dt = config.targetHiddenSize;
  const matrix = (src: ReturnType<typeof w.get>) => backend.loadWeight(src, 'keep', 'matmul');
  const vector = (name: string) => backend.loadWeight(w.get(name), 'f32');
  const halves = async (name: string): Promise<[Tensor, Tensor]> => {
    const src = w.get(name);
    return [await matrix(columnSource(src, 0, D)), await matrix(columnSource(src, D, D))];
  };
  const fcSrc = w.get(names.fc);
  const fc: [Tensor, Tensor, Tensor] = [
    await matrix(columnSource(fcSrc, 0, Dt)), await matrix(columnSource(fcSrc, Dt, Dt)), await matrix(columnSource(fcSrc, 2 * Dt, Dt)),
  ];
  const [qE, qH] = await halves(names.q);
  const [kE, kH] = await halves(names.k);
  const [vE, vH] = await halves(names.v);
  return {
    fc, qE, qH, kE, kH, vE, vH,
    hiddenNorm: await vector(names.hiddenNorm),
    inputNorm: await vector(names.inputNorm),
    o: await matrix(w.get(names.o)),
    postAttnNorm: await vector(names.postAttnNorm),
    gate: await matrix(w.get(names.gate)),
    up: await matrix(w.get(names.up)),
    down: await matrix(w.get(names.down)),
    norm: await vector(names.norm),
    lmHead: await matrix(w.get(names.lmHead)),
    embed: names.embed ? await matrix(w.get(names.embed)) : targetEmbed,
  };
}

export class Eagle3Head {
  /** the KV layout its cache needs: one full-attention layer */
  static readonly layerWindows: readonly number[] = [0];
  private readonly rope: RopeTables;
  private readonly ownsEmbed: boolean;

  constructor(
    readonly backend: Backend,
    readonly config: Eagle3Config,
    readonly weights: Eagle3Weights,
    /** target id of each draft id */
    readonly draftToTarget: Int32Array,
    targetEmbed?: Tensor,
  ) {
    this.rope = new RopeTables(backend, [config.layer.layers[0]!.rope]);
    this.ownsEmbed = weights.embed !== targetEmbed;
  }

  /** Loads the head of `dir` onto `backend` beside its target, whose embedding it shares. */
  static async load(backend: Backend, dir: Eagle3Dir, targetEmbed: Tensor): Promise<Eagle3Head> {
    return new Eagle3Head(backend, dir.config, await loadEagle3Weights(backend, dir, targetEmbed), dir.draftToTarget, targetEmbed);
  }

  /** the target layers whose states a step's hidden input needs (StepBatch.hidden.layers) */
  get targetLayers(): readonly number[] {
    return this.config.targetLayers;
  }

  /**
   * Enqueues one draft step and the read of its results; returns without waiting. No backend
   * scope may be open. Throws what it cannot enqueue.
   */
  launch<Row extends RowSpan>(batch: Eagle3Batch<Row>, kv: KvAccess<Row>): Eagle3PendingStep {
    const b = this.backend, c = this.config.layer, w = this.weights;
    const T = batch.tokens.length, P = batch.logitTokens.length;
    const total = batch.rows.reduce((a, r) => a + r.count, 0);
    if (total !== T) throw new Error(`eagle3 step: rows cover ${total} tokens, batch has ${T}`);
    if (!batch.rows.every((r) => kv.isAllocated(r))) throw new Error('eagle3 step: KV blocks not allocated (grow first)');
    if (batch.logitTokens.some((t) => !Number.isInteger(t) || t < 0 || t >= T)) throw new Error(`eagle3 step: logit tokens must be in [0, ${T})`);
    for (const t of batch.tokens) {
      if (!(t >= 0 && t < this.config.vocabSize)) throw new Error(`eagle3 step: token id ${t} is outside the vocabulary of ${this.config.vocabSize}`);
    }
    const index = batch.hidden.index;
    if (index && index.length !== T) throw new Error(`eagle3 step: hidden.index needs one row per token (${index.length} for ${T})`);
    const ropePlan = this.rope.plan(batch.rows.map((r) => ({ length: r.ropeLength ?? r.start + r.count, count: r.count })));
    let out: Tensor | undefined;
    let result: Promise<Eagle3StepResult>;
    b.beginScope();
    try {
      const [rope] = ropePlan();
      const [layout] = kv.layouts(batch.rows);
      const rows = index ? b.upload(Int32Array.from(index), [T]) : undefined;
      const take = (t: Tensor) => (rows ? b.gatherRows(t, rows) : t);
      const h = batch.hidden.kind === 'target'
        ? this.fuse(batch.hidden.states.map(take) as [Tensor, Tensor, Tensor])
        : take(batch.hidden.state);
      if (h.shape[0] !== T) throw new Error(`eagle3 step: ${h.shape[0]} hidden rows for ${T} tokens`);
      const eps = c.rmsNormEps;
      const e = b.rmsnorm(b.embedding(w.embed, b.upload(batch.tokens, [T]), 1), w.inputNorm, eps, 0);
      const hn = b.rmsnorm(h, w.hiddenNorm, eps, 0);
      const two = (x: Tensor, y: Tensor) => b.add(x, y, 1);
      const q = b.reshape(two(b.matmul(e, w.qE), b.matmul(hn, w.qH)), [T, c.numHeads, c.headDim]);
      const k = b.reshape(two(b.matmul(e, w.kE), b.matmul(hn, w.kH)), [T, c.numKvHeads, c.headDim]);
      const v = b.reshape(two(b.matmul(e, w.vE), b.matmul(hn, w.vH)), [T, c.numKvHeads, c.headDim]);
      const paged = kv.kvOfLayer(0);
      b.writeKv(paged, b.rope(k, layout.tokenPos, rope.invFreq, rope.attentionScaling), v, layout);
      const att = b.attention(b.rope(q, layout.tokenPos, rope.invFreq, rope.attentionScaling), paged, layout,
        { scale: c.attentionScale, window: 0, softcap: 0 });
      const r = b.add(this.config.normBeforeResidual ? hn : h, b.matmul(b.reshape(att, [T, c.numHeads * c.headDim]), w.o), 1);
      const m = b.rmsnorm(r, w.postAttnNorm, eps, 0);
      out = b.add(r, b.matmul(b.glu(b.matmul(m, w.gate), b.matmul(m, w.up), c.activation), w.down), 1);
      const pick = b.upload(Int32Array.from(batch.logitTokens), [P]);
      const logits = b.matmul(b.rmsnorm(b.gatherRows(out, pick), w.norm, eps, 0), w.lmHead);
      result = this.collect(logits, batch.argmaxOnly === true);
    } finally {
      b.endScope(out ? [out] : []);
    }
    result.catch(() => undefined); // its owner awaits it later
    const hidden = out!;
    let released = false;
    return {
      result, hidden,
      release: () => {
        if (released) return;
        released = true;
        b.free(hidden);
      },
    };
  }

  /** One step, awaited; its output hidden state is freed (launch keeps it for a chained step). */
  async step<Row extends RowSpan>(batch: Eagle3Batch<Row>, kv: KvAccess<Row>): Promise<Eagle3StepResult> {
    const pending = this.launch(batch, kv);
    try {
      return await pending.result;
    } finally {
      pending.release();
    }
  }

  /** fc over the target's three hidden states [n, targetHidden] each: [n, hidden]. */
  fuse(states: readonly [Tensor, Tensor, Tensor]): Tensor {
    const b = this.backend, fc = this.weights.fc;
    return b.add(b.add(b.matmul(states[0], fc[0]), b.matmul(states[1], fc[1]), 1), b.matmul(states[2], fc[2]), 1);
  }

  private collect(logits: Tensor, argmaxOnly: boolean): Promise<Eagle3StepResult> {
    const b = this.backend;
    if (argmaxOnly && b.argmax) {
      return b.read(b.argmax(logits)).then((ids) => ({ logits: new Float32Array(0), tokens: Int32Array.from(ids, (d) => this.draftToTarget[d]!) }));
    }
    return b.read(logits).then((l) => {
      const f = l as Float32Array;
      if (!argmaxOnly) return { logits: f };
      const Vd = this.config.draftVocabSize, P = f.length / Vd;
      const tokens = new Int32Array(P);
      for (let p = 0; p < P; p++) {
        let best = 0;
        for (let d = 1; d < Vd; d++) if (f[p * Vd + d]! > f[p * Vd + best]!) best = d;
        tokens[p] = this.draftToTarget[best]!;
      }
      return { logits: new Float32Array(0), tokens };
    });
  }

  /**
   * Draft logits [P, draftVocab] over target ids [P, vocab]: each draft id's logit at its target
   * id, -Infinity at ids outside the draft vocabulary (their draft probability is 0).
   */
  targetLogits(draft: Float32Array): Float32Array {
    const Vd = this.config.draftVocabSize, V = this.config.vocabSize, P = draft.length / Vd;
    const out = new Float32Array(P * V).fill(-Infinity);
    for (let p = 0; p < P; p++) for (let d = 0; d < Vd; d++) out[p * V + this.draftToTarget[d]!] = draft[p * Vd + d]!;
    return out;
  }

  dispose(): void {
    const w = this.weights, b = this.backend;
    for (const t of [...w.fc, w.hiddenNorm, w.inputNorm, w.qE, w.qH, w.kE, w.kH, w.vE, w.vH, w.o, w.postAttnNorm, w.gate, w.up, w.down, w.norm, w.lmHead]) b.free(t);
    if (this.ownsEmbed) b.free(w.embed);
    this.rope.dispose();
  }
}
