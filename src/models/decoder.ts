// A model's steps: DecoderModel launches one step over a flattened batch, op by op or as a
// captured decode graph's replay, with each logit row's pick (its logits read back, a device
// argmax, or device sampling), and enqueues the reads the caller awaits. The graph of a step is
// step-body.ts; a layer's maths is layer.ts, attention-block.ts and mlp-block.ts.

import type { Backend, HostStepLayout, Tensor } from '../contracts/backend.ts';
import type { ModelConfig } from '../contracts/model-config.ts';
import type { DeviceSampleRow } from '../contracts/device-sampling.ts';
import { RopeTables, type RopeTable } from './rope-tables.ts';
import { canCaptureGraphs, DecodeGraphs, GraphCaptureError, MULTI_TOKEN_GRAPH_MAX_TOKENS, type GraphBackend } from './decode-graphs.ts';
import { gatherDeviceIds, type DeviceIds } from './device-ids.ts';
import type { KvAccess, RowSpan } from './kv-access.ts';
import { modelParts, type ModelParts } from './model-parts.ts';
import { enqueueForward, enqueueStep } from './step-body.ts';
import type { ModelWeights } from './weights.ts';

export type { KvAccess, RowSpan } from './kv-access.ts';

export interface StepBatch<Row extends RowSpan> {
  /** token ids of every row, concatenated in row order: i32 [T] (only its length counts with `deviceIds`) */
  tokens: Int32Array;
  /**
   * Every token id of the step taken on the device instead (index one entry per token): an
   * earlier step's greedy picks that were never read back (PendingStep.deviceTokens).
   */
  deviceIds?: DeviceIds;
  /** rows in order; row r owns tokens [sum of earlier counts, + count) */
  rows: Row[];
  /** indices into `tokens` whose logits are wanted (usually each row's last token) */
  logitTokens: number[];
  /**
   * Block-table width (blocks of the longest sequence the caller allows). Given, a step with
   * logits for every token (decode rows, verify chunks) may replay a captured graph on backends
   * that capture them; omitted, every step runs op by op.
   */
  graphWidth?: number;
  /** hidden states the step hands out beside its logits (a step with them runs op by op) */
  hidden?: HiddenRequest;
}

/**
 * Hidden states wanted from a step (an EAGLE-3 head reads the target's): for each of `layers`, the
 * residual stream entering that layer (transformers' output_hidden_states[l]; 0 is the embedding
 * output) at the step's tokens `tokens`. They stay on the device (PendingStep.hidden) until the
 * step is released, and come back to the host too with `read` (StepResult.hidden).
 */
export interface HiddenRequest {
  /** layer ids in [0, numLayers), any order */
  layers: readonly number[];
  /** indices into StepBatch.tokens, as logitTokens */
  tokens: readonly number[];
  read?: boolean;
}

/**
 * How one logit row's token is taken: 'logits' reads its logits back (the host samples);
 * 'argmax' reads back the device's greedy pick (Backend.argmax); 'sample' reads back the row's
 * Backend.sampleRows result (token and logprobs).
 */
export type RowPick = 'logits' | 'argmax' | 'sample';

/** What a step computes per logit row beyond its logits (DecoderModel.launch). */
export interface StepPicks {
  /** one per logit row; 'argmax' becomes 'logits' on a backend without a device argmax */
  rows: readonly RowPick[];
  /**
   * Builds the Backend.sampleRows rows, one per 'sample' row, in order. Called once the forward
   * is enqueued and before the reads, so the host work it does (grammar masks, the uniforms it
   * draws) overlaps the device; a graph replay is enqueued by then, the op follows it.
   */
  sampleRows?: () => readonly DeviceSampleRow[];
  /** keep the step's device tokens for a later step's ids (PendingStep.deviceTokens) */
  keep?: boolean;
}

/** What a step reads back (DecoderModel.step). */
export interface StepResult {
  /** greedy token per logit row, picked on the device (when some row was 'argmax') */
  tokens?: Int32Array;
  /** f32 logits [rows that wanted them ('logits'), vocab], in logit-row order */
  logits: Float32Array;
  /** the sampleRows result of the 'sample' rows, i32 [those rows, 2 + 2K], in logit-row order */
  samples?: Int32Array;
  /** with StepBatch.hidden.read: per requested layer, f32 [hidden tokens, hiddenSize] */
  hidden?: Float32Array[];
}

/** A step handed to the backend (DecoderModel.launch) whose results are still on their way. */
export interface PendingStep {
  /** what the step reads back; never an unhandled rejection while nobody awaits it yet */
  result: Promise<StepResult>;
  /** per logit row, how its token is taken (the picks asked for, resolved); undefined: every row's logits */
  picks?: readonly RowPick[];
  /**
   * The step's tokens on the device when it was asked to keep them: its sampleRows result when
   * some row was 'sample', else its greedy picks. A later step can take its ids from them
   * (StepBatch.deviceIds). Valid until release.
   */
  deviceTokens?: Tensor;
  /** per logit row: the element of deviceTokens (read flat) that holds its token; -1: not there */
  deviceTokenAt?: Int32Array;
  /** StepBatch.hidden's states on the device, [hidden tokens, hiddenSize] per requested layer; valid until release */
  hidden?: readonly Tensor[];
  /** host milliseconds spent enqueuing the step */
  enqueueMs: number;
  /**
   * The step captured a graph (the first of its bucket): its time holds the one-off eager run and
   * capture, no measure of what such a step costs.
   */
  captured?: boolean;
  /** frees what the step kept; call once every step reading deviceTokens is enqueued (idempotent) */
  release(): void;
}

export class DecoderModel {
  private readonly rope: RopeTables;
  /** host milliseconds the last forward took to enqueue its ops (before waiting for the device) */
  lastEnqueueMs = 0;
  /** why graph capture was turned off (a capture failed), if it was */
  graphsOff?: string;
  /** captured decode graphs per KV cache (its pools are baked into them) and table width */
  private readonly graphs = new Map<KvAccess<RowSpan>, DecodeGraphs>();

  /** what the step body and the layers read */
  private readonly parts: ModelParts;

  constructor(
    readonly backend: Backend,
    readonly config: ModelConfig,
    readonly weights: ModelWeights,
  ) {
    this.rope = new RopeTables(backend, config.layers.map((l) => l.rope));
    this.parts = modelParts(backend, config, weights);
  }

  /** Runs one step; resolves to logits, f32 [logitTokens.length * vocabSize]. */
  async forward<Row extends RowSpan>(batch: StepBatch<Row>, kv: KvAccess<Row>): Promise<Float32Array> {
    return (await this.step(batch, kv)).logits;
  }

  /**
   * Runs one step. `wantLogits[i]` false: logit row i only needs its greedy token, which the
   * backend picks on the device when it can (StepResult.tokens); the logits come back only for
   * the rows that want them. Omitted: every row's logits, no tokens. Or per-row picks (StepPicks).
   */
  async step<Row extends RowSpan>(batch: StepBatch<Row>, kv: KvAccess<Row>, wantLogits?: readonly boolean[] | StepPicks): Promise<StepResult> {
    const pending = this.launch(batch, kv, wantLogits);
    try {
      return await pending.result;
    } finally {
      pending.release();
    }
  }

  /**
   * Enqueues one step and its read-backs, and returns without waiting for them (what `step`
   * awaits): the caller may enqueue the next step first. `picks`: what each logit row needs (as
   * for `step`); `keepTokens` (with a boolean[]): keep the greedy picks on the device for a later
   * step's ids (PendingStep.deviceTokens). Throws what it cannot enqueue. No backend scope may be
   * open (the step's scopes close before this returns).
   */
  launch<Row extends RowSpan>(batch: StepBatch<Row>, kv: KvAccess<Row>, picks?: readonly boolean[] | StepPicks, keepTokens = false): PendingStep {
    const T = batch.tokens.length;
    const total = batch.rows.reduce((a, r) => a + r.count, 0);
    if (total !== T) throw new Error(`forward: rows cover ${total} tokens, batch has ${T}`);
    if (!batch.rows.every((r) => kv.isAllocated(r))) throw new Error('forward: KV blocks not allocated (grow first)');
    if (batch.deviceIds && batch.deviceIds.index.length !== T) throw new Error('step: deviceIds needs one index per token');
    if (batch.hidden?.tokens.some((t) => !Number.isInteger(t) || t < 0 || t >= T)) throw new Error(`step: hidden token indices must be in [0, ${T})`);
    const resolved = this.resolvePicks(picks, keepTokens, batch.logitTokens.length);
    const ropePlan = this.rope.plan(batch.rows.map((r) => ({ length: r.ropeLength ?? r.start + r.count, count: r.count })));
    const t0 = performance.now();
    if (this.graphable(batch)) {
      const host = kv.hostLayouts(batch.rows);
      if (host.every((h) => h.maxBlocks <= batch.graphWidth!)) return this.launchGraphed(batch, kv, host, ropePlan, resolved, t0);
      // a row longer than the width promised: this step runs op by op
    }
    return this.launchEager(batch, kv, ropePlan, resolved, t0);
  }

  /**
   * The picks as this backend runs them: 'argmax' without a device argmax reads logits; a step
   * where no row skips its logits makes no device tokens (undefined: every row's logits).
   */
  private resolvePicks(picks: readonly boolean[] | StepPicks | undefined, keepTokens: boolean, P: number): StepPicks | undefined {
    if (!picks) return undefined;
    const given: StepPicks = 'rows' in picks
      ? picks
      : { rows: (picks as readonly boolean[]).map((w): RowPick => (w ? 'logits' : 'argmax')), keep: keepTokens };
    if (given.rows.length !== P) throw new Error('step: wantLogits needs one entry per logit row');
    const rows = given.rows.map((r): RowPick => (r === 'argmax' && !this.backend.argmax ? 'logits' : r));
    if (rows.includes('sample') && (!this.backend.sampleRows || !given.sampleRows)) {
      throw new Error(this.backend.sampleRows ? 'step: sampled rows need StepPicks.sampleRows' : `the ${this.backend.name} backend cannot sample on the device`);
    }
    if (rows.every((r) => r === 'logits')) return undefined;
    return { ...given, rows };
  }

  private launchEager<Row extends RowSpan>(batch: StepBatch<Row>, kv: KvAccess<Row>, ropePlan: () => RopeTable[],
    picks: StepPicks | undefined, t0: number): PendingStep {
    const b = this.backend, T = batch.tokens.length, P = batch.logitTokens.length;
    let kept: DeviceTokens | undefined;
    let hidden: Tensor[] = [];
    let result: Promise<StepResult>;
    b.beginScope();
    try {
      const ropes = ropePlan();
      const layouts = kv.layouts(batch.rows);
      const ids = batch.deviceIds ? gatherDeviceIds(b, batch.deviceIds) : b.upload(batch.tokens, [T]);
      const pick = b.upload(Int32Array.from(batch.logitTokens), [P]);
      const capture = batch.hidden && { layers: batch.hidden.layers, tokens: b.upload(Int32Array.from(batch.hidden.tokens), [batch.hidden.tokens.length]) };
      const fwd = enqueueForward(this.parts, ids, layouts, pick, ropes, kv, capture);
      const logits = fwd.logits;
      hidden = fwd.hidden;
      const tokens = picks?.rows.includes('argmax') ? b.argmax!(logits) : undefined;
      const samples = picks ? this.enqueueSampling(logits, P, picks) : undefined;
      result = this.collect(logits, tokens, samples, P, picks?.rows, batch.hidden?.read ? hidden : undefined);
      kept = picks?.keep ? deviceTokensOf(tokens, samples, picks.rows) : undefined;
    } finally {
      // The reads are enqueued, and later ops cannot change what they return: the step's tensors
      // may go now, all but the tokens kept for a later step and the hidden states handed out
      // (they leave the scope unowned).
      b.endScope([...(kept ? [kept.tensor] : []), ...hidden]);
    }
    const own = [...(kept ? [kept.tensor] : []), ...hidden];
    return this.pending(result, picks?.rows, kept, own.length > 0 ? () => own.forEach((t) => b.free(t)) : undefined, t0, hidden);
  }

  /**
   * Enqueues Backend.sampleRows over the 'sample' rows of logits (whose first P rows are the
   * step's), with the rows `picks.sampleRows` builds now; undefined when no row samples.
   */
  private enqueueSampling(logits: Tensor, P: number, picks: StepPicks): Tensor | undefined {
    const b = this.backend;
    const at = picks.rows.flatMap((r, i) => (r === 'sample' ? [i] : []));
    if (at.length === 0) return undefined;
    const rows = picks.sampleRows!();
    if (rows.length !== at.length) throw new Error(`step: ${rows.length} sampled rows built for ${at.length} 'sample' rows`);
    const src = at.length === P ? rowsOf(b, logits, P) : b.gatherRows(logits, b.upload(Int32Array.from(at), [at.length]));
    return b.sampleRows!(src, rows);
  }

  /** The PendingStep of a step whose reads are enqueued. */
  private pending(result: Promise<StepResult>, picks: readonly RowPick[] | undefined, kept: DeviceTokens | undefined,
    free: (() => void) | undefined, t0: number, hidden?: readonly Tensor[]): PendingStep {
    result.catch(() => undefined); // its owner awaits it later, maybe after other awaits
    this.lastEnqueueMs = performance.now() - t0;
    let released = false;
    return {
      result, picks, deviceTokens: kept?.tensor, deviceTokenAt: kept?.at, enqueueMs: this.lastEnqueueMs,
      hidden: hidden && hidden.length > 0 ? hidden : undefined,
      release: () => {
        if (released) return;
        released = true;
        free?.();
      },
    };
  }

  /**
   * Enqueues the reads of a step's results: the greedy tokens of every row, when computed, the
   * sampleRows result, when computed, and the logits of the rows that want them (`logits` and
   * `tokens` may hold more rows than the P asked for), and the hidden states to read back.
   * Everything is enqueued before this returns.
   */
  private collect(logits: Tensor, tokens: Tensor | undefined, samples: Tensor | undefined, P: number,
    picks: readonly RowPick[] | undefined, hidden?: readonly Tensor[]): Promise<StepResult> {
    const b = this.backend;
    let logitsRead: Promise<Float32Array | Int32Array> | undefined;
    const host = picks ? picks.flatMap((r, i) => (r === 'logits' ? [i] : [])) : undefined;
    if (!host) logitsRead = b.read(rowsOf(b, logits, P));
    else if (host.length === P) logitsRead = b.read(rowsOf(b, logits, P));
    else if (host.length > 0) logitsRead = b.read(b.gatherRows(logits, b.upload(Int32Array.from(host), [host.length])));
    const tokensRead = tokens ? b.read(rowsOf(b, tokens, P)) : undefined;
    const samplesRead = samples ? b.read(samples) : undefined;
    const hiddenRead = hidden ? Promise.all(hidden.map((h) => b.read(h))) : undefined;
    // awaited together: no rejection goes unhandled while another is pending
    return Promise.all([tokensRead, logitsRead, samplesRead, hiddenRead]).then(([t, l, s, h]) => ({
      tokens: t as Int32Array | undefined,
      logits: (l as Float32Array | undefined) ?? new Float32Array(0),
      samples: s as Int32Array | undefined,
      ...(h ? { hidden: h as Float32Array[] } : {}),
    }));
  }

  /**
   * A step on a backend that captures graphs, with static rope tables, logits for every token in
   * order: a decode step (one token a row), or a multi-token one (verify steps: a row's token and
   * its drafts) of at most MULTI_TOKEN_GRAPH_MAX_TOKENS tokens with its ids on the host.
   */
  private graphable<Row extends RowSpan>(batch: StepBatch<Row>): boolean {
    if (batch.graphWidth === undefined || batch.hidden || this.graphsOff !== undefined || !canCaptureGraphs(this.backend) ||
      !this.rope.lengthIndependent) return false;
    const T = batch.tokens.length;
    if (batch.logitTokens.length !== T || !batch.logitTokens.every((t, i) => t === i)) return false;
    if (T === batch.rows.length) return !batch.deviceIds || !!this.backend.copyTensor;
    return !batch.deviceIds && T <= MULTI_TOKEN_GRAPH_MAX_TOKENS;
  }

  private launchGraphed<Row extends RowSpan>(batch: StepBatch<Row>, kv: KvAccess<Row>, host: HostStepLayout[],
    ropePlan: () => RopeTable[], picks: StepPicks | undefined, t0: number): PendingStep {
    const b = this.backend as GraphBackend;
    const width = batch.graphWidth!;
    const access = kv as unknown as KvAccess<RowSpan>;
    let graphs = this.graphs.get(access);
    if (graphs && graphs.width !== width) {
      graphs.dispose();
      graphs = undefined;
    }
    if (!graphs) {
      graphs = new DecodeGraphs(b, kv.groupCount, width, host[0]?.blockSize ?? 1);
      this.graphs.set(access, graphs);
    }
    const ropes = ropePlan(); // static tables: uploaded once, before any capture
    // the greedy ids are part of every graph when the backend can pick them (cheap beside a step)
    let outputs: readonly Tensor[];
    try {
      outputs = graphs.run(batch.tokens, batch.rows.length, host, (inp) => {
        const logits = enqueueStep(this.parts, inp.ids, inp.layouts, inp.pick, ropes, access);
        return b.argmax ? [logits, b.argmax(logits)] : [logits];
      }, batch.deviceIds);
    } catch (err) {
      // A capture that fails (out of memory, a driver refusal) turns graphs off for this model:
      // every later step runs op by op, and this one too. The eager run before the capture
      // already wrote this step's KV; running it again writes the same values.
      if (!(err instanceof GraphCaptureError)) throw err;
      this.graphsOff = (err as Error).message;
      console.error(`llmts: decode graphs are off (${this.graphsOff}); steps run op by op`);
      return this.launchEager(batch, kv, ropePlan, picks, t0);
    }
    const P = batch.logitTokens.length; // every token's, in order (graphable)
    const tokens = picks?.rows.includes('argmax') ? outputs[1] : undefined;
    let result: Promise<StepResult>;
    let kept: DeviceTokens | undefined;
    b.beginScope();
    try {
      // sampleRows uploads its rows, so it cannot be captured: it follows the replay
      const samples = picks ? this.enqueueSampling(outputs[0]!, P, picks) : undefined;
      result = this.collect(outputs[0]!, tokens, samples, P, picks?.rows);
      kept = picks?.keep ? deviceTokensOf(tokens, samples, picks.rows) : undefined;
    } finally {
      b.endScope(kept && kept.tensor !== tokens ? [kept.tensor] : []);
    }
    // Kept greedy picks are the graph's output: nothing to free, and the next replay of this
    // bucket, which rewrites them, is enqueued after any step that reads them. A kept sampleRows
    // result is the step's own, freed on release.
    const own = kept && kept.tensor !== tokens ? kept.tensor : undefined;
    const step = this.pending(result, picks?.rows, kept, own ? () => b.free(own) : undefined, t0);
    if (graphs.lastRunCaptured) step.captured = true;
    return step;
  }

  /** Frees the graphs captured over `kv` (its owner is closing it). */
  releaseGraphs(kv: object): void {
    const g = this.graphs.get(kv as KvAccess<RowSpan>);
    g?.dispose();
    this.graphs.delete(kv as KvAccess<RowSpan>);
  }

  dispose(): void {
    for (const g of this.graphs.values()) g.dispose();
    this.graphs.clear();
    this.rope.dispose();
  }
}

/** A step's tokens kept on the device, and where each logit row's token sits in them (flat). */
interface DeviceTokens {
  tensor: Tensor;
  at: Int32Array;
}

/**
 * What a step keeps for a later step's ids: its sampleRows result [S, W] when some row sampled
 * (row j's token at j * W; rows that did not sample have none), else its greedy picks [>= P] (one
 * per logit row).
 */
function deviceTokensOf(tokens: Tensor | undefined, samples: Tensor | undefined, picks: readonly RowPick[]): DeviceTokens | undefined {
  if (samples) {
    const W = samples.shape[1]!;
    let j = 0;
    return { tensor: samples, at: Int32Array.from(picks, (r) => (r === 'sample' ? W * j++ : -1)) };
  }
  if (tokens) return { tensor: tokens, at: Int32Array.from(picks, (_, i) => i) };
  return undefined;
}

/** The first P rows of t (a graph's outputs hold the whole bucket). */
function rowsOf(b: Backend, t: Tensor, P: number): Tensor {
  return t.shape[0] === P ? t : b.rowView!(t, 0, P);
}
