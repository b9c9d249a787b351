// The engine: one loop owns the device. Each step is three moves (nano-vllm): schedule (the
// catch-up rule), run (one forward over the flattened batch), postprocess (sample the rows that
// reached their end, emit events, retire finished sequences). A lone request takes this same
// path. A failure in one row (sampler error, cancel, abandoned stream) ends that row only.
//
// This file keeps the public API, the loop and the request lifecycle (submit, cancel, finish);
// the step mechanics live beside it: step-launch.ts (building a step and its rows' picks, device
// sampling), pipeline.ts (the decode step enqueued ahead), token-accept.ts (a step's results
// into tokens, events and finishes), stale-kv.ts (the LongRoPE recompute rule), methods/ (each
// sequence's decoding method: autoregressive, or speculative with its drafts and their depth).

import type { DecoderModel, StepResult } from '../models/decoder.ts';
import type { Backend, DType } from '../contracts/backend.ts';
import { oneOf } from '../backends/common/op-shapes.ts';
import { derivedContextLength } from '../artifacts/context-length.ts';
import { KvCache, blocksPerSequence } from '../state/kv-cache.ts';
import type { SpillResult } from '../state/ssd-tier.ts';
import type { DecodeFn } from '../generation/detokenizer.ts';
import { EventStream } from './event-stream.ts';
import { Scheduler, type ScheduledRow } from './scheduler.ts';
import { Sequence, type EngineRequest, type FinishReason, type SequenceEvent, type TokenLogprob } from './sequence.ts';
import { PrefixReuse, openSsdTier, prefixOptionsFor, type PrefixCacheSettings, type PrefixCacheStats } from './prefix-reuse.ts';
import { StepLauncher, returnDraws, type InFlight } from './step-launch.ts';
import { DecodePipeline } from './pipeline.ts';
import { TokenAcceptor } from './token-accept.ts';
import { recomputeStaleKv } from './stale-kv.ts';
import { type EngineSettings, engineSettingsFrom } from './engine-settings.ts';
import type { ModelConfig } from '../contracts/model-config.ts';
import { AUTOREGRESSIVE } from './methods/autoregressive.ts';
import { DraftPlanner, type SpeculationStats } from './methods/draft-depth.ts';
import type { DecodingMethod, SpeculationCounts } from './methods/method.ts';
import { ADAPTIVE_MAX_DEFERRED, resolveSpeculative, speculativeMethod, type SpeculativeOptions } from './methods/speculative.ts';
import { checkDraftModel, DraftModelRunner } from './methods/draft-model.ts';
import { Eagle3Runner } from './methods/eagle3.ts';
import type { Eagle3Head } from '../models/eagle3.ts';
import type { LoadedModel } from './load-model.ts';

/** `pipeline`, `deviceSampling`, `graphs` (engine-settings.ts): set here, they win over the environment. */
export interface EngineOptions extends Partial<EngineSettings> {
  /** rows decoding together (default 16) */
  maxBatch?: number;
  /** sequences waiting for admission before new ones are refused (default 256) */
  maxQueued?: number;
  /** tokens per step, decode rows + prefill chunks (default 512) */
  tokenBudget?: number;
  /** tokens of KV the full-attention layers can hold in all (default: maxBatch * maxModelLen) */
  kvTokens?: number;
  /** longest sequence (prompt + output); default derivedContextLength(config) */
  maxModelLen?: number;
  blockSize?: number;
  /**
   * what the KV cache holds (default: the backend's activation dtype); one of the backend's
   * kvDtypes (the CPU backend: f32 or bf16)
   */
  kvDtype?: DType;
  /** events buffered per stream before its sequence pauses (default 256) */
  streamBuffer?: number;
  /** a full stream unread this long cancels its sequence (default 60 s; 0 = never) */
  idleTimeoutMs?: number;
  /** prefix cache: RAM size, namespace, SSD tier (default: on, the whole KV pool, no SSD tier) */
  prefixCache?: PrefixCacheSettings;
  /**
   * speculative decoding for every request that does not say otherwise (EngineRequest.speculative;
   * default: none). Checked here: a RangeError names the bad field.
   */
  speculative?: SpeculativeOptions;
  /**
   * the draft model of `speculative: { proposer: 'draft' }` (draft-model.ts): loaded on the same
   * backend, sharing the target's tokenizer (checked here). The engine keeps its KV; the model
   * belongs to whoever loaded it.
   */
  draftModel?: LoadedModel;
  /**
   * the EAGLE-3 head of `speculative: { proposer: 'eagle3' }` (eagle3.ts), loaded for this model
   * (Eagle3Head.load with its embedding). The engine keeps its KV; the head belongs to whoever
   * loaded it.
   */
  draftHead?: Eagle3Head;
}

/**
 * The dtype a KV cache on `backend` holds: `requested`, or the backend's activation dtype; throws
 * naming what the backend keeps (Backend.kvDtypes) when it does not keep `requested`.
 */
export function resolveKvDtype(backend: Backend, requested?: DType): DType {
  const kvDtype = requested ?? backend.activationDtype;
  const kept = backend.kvDtypes ?? [backend.activationDtype];
  if (!kept.includes(kvDtype)) throw new Error(`the ${backend.name} backend keeps its KV cache in ${oneOf(kept)}, not ${kvDtype}`);
  return kvDtype;
}

export interface TextCodec {
  eosIds: readonly number[];
  decode: DecodeFn;
}

export interface Completion {
  tokenIds: number[];
  text: string;
  finishReason: FinishReason;
  logprobs?: TokenLogprob[];
  promptTokens: number;
  completionTokens: number;
  /** prompt tokens served from the prefix cache */
  cachedTokens: number;
  /** draft tokens verified and accepted, when the request speculated */
  speculation?: SpeculationCounts;
  error?: string;
  /** 'grammar': the row's grammar failed */
  errorKind?: 'grammar';
}

/** longest time the loop may hold the event loop when the backend never leaves the thread */
const YIELD_EVERY_MS = 5;

export class ContextLengthError extends Error {}

/** prompt tokens a step prefills at most, unless EngineOptions.tokenBudget says otherwise */
export const DEFAULT_TOKEN_BUDGET = 512;

export class EngineClosedError extends Error {}

export interface EngineStats {
  running: number;
  waiting: number;
  kvBlocksUsed: number;
  kvBlocksTotal: number;
  /** evictable blocks kept for prefix reuse (held by no sequence) */
  kvBlocksCached: number;
  steps: number;
  /** of those, steps enqueued behind the previous one, before its tokens were read back */
  pipelinedSteps: number;
  prefixCache: PrefixCacheStats;
  /** draft tokens verified and accepted, verify rows and their accepted lengths (all requests so far) */
  speculation: SpeculationStats;
}

/**
 * Why a model's sequences cannot speculate losslessly, or undefined when they can: a verify
 * chunk computes its positions with the rope of the row's whole length, where plain decoding
 * computes each with its own (length-dependent rope), or its KV may be recomputed past a length.
 */
export function speculationBlocker(cfg: Pick<ModelConfig, 'layers' | 'recomputeKvPastLength'>): string | undefined {
  const rope = cfg.layers.find((l) => l.rope.type === 'dynamic' || l.rope.type === 'longrope')?.rope.type;
  if (rope) return `the model's ${rope} rope depends on the sequence length`;
  if (cfg.recomputeKvPastLength !== undefined) return 'the model recomputes KV past a length';
  return undefined;
}

interface Handle {
  stream?: EventStream<SequenceEvent>;
  cancelled?: string;
  /** removes the abort listener from the caller's signal (which may outlive the request) */
  detach?: () => void;
}

export class Engine {
  readonly kv: KvCache;
  readonly scheduler: Scheduler;
  readonly maxModelLen: number;
  /**
   * Sequences that may wait for admission at once. A request's sequences are all queued before
   * any is admitted, so one with more of them than this can never be admitted.
   */
  get maxQueued(): number {
    return this.opts.maxQueued;
  }
  private readonly handles = new Map<Sequence, Handle>();
  private nextId = 1;
  private looping = false;
  private closed = false;
  private wake?: () => void;
  private steps = 0;
  private pipelinedSteps = 0;
  /** when the last step's postprocess ended (a pipelined step's interval starts there) */
  private lastStepDone?: number;
  private readonly opts: Required<Omit<EngineOptions, 'kvTokens' | 'maxModelLen' | 'prefixCache' | keyof EngineSettings | 'kvDtype' | 'speculative' | 'draftModel' | 'draftHead'>>;
  /** the requests' default speculation (EngineOptions.speculative), resolved */
  readonly speculative?: Required<SpeculativeOptions>;
  /**
   * why no sequence speculates on this model (speculationBlocker); requests that ask for it
   * decode plainly
   */
  readonly speculationOff?: string;
  /** the draft depth of speculating rows, and the measurements it follows */
  private readonly drafts = new DraftPlanner();
  /** the draft model's steps and KV (EngineOptions.draftModel) */
  readonly draftModel?: DraftModelRunner;
  /** the EAGLE-3 head's steps and KV (EngineOptions.draftHead) */
  readonly draftHead?: Eagle3Runner;
  /** what the engine was created with (EngineOptions over the environment) */
  readonly settings: EngineSettings;
  private readonly prefix: PrefixReuse;
  /** whether decode steps may be enqueued one ahead (EngineOptions.pipeline) */
  readonly pipeline: boolean;
  /** whether non-greedy rows are sampled on the device (EngineOptions.deviceSampling) */
  readonly deviceSampling: boolean;
  private readonly launcher: StepLauncher;
  private readonly decodePipeline: DecodePipeline;
  private readonly acceptor: TokenAcceptor;

  constructor(
    readonly model: DecoderModel,
    private readonly codec: TextCodec,
    options: EngineOptions = {},
  ) {
    const cfg = model.config;
    this.opts = {
      maxBatch: options.maxBatch ?? 16,
      maxQueued: options.maxQueued ?? 256,
      tokenBudget: options.tokenBudget ?? DEFAULT_TOKEN_BUDGET,
      blockSize: options.blockSize ?? 16,
      streamBuffer: options.streamBuffer ?? 256,
      idleTimeoutMs: options.idleTimeoutMs ?? 60_000,
    };
    this.maxModelLen = options.maxModelLen ?? derivedContextLength(cfg);
    this.speculative = options.speculative === undefined ? undefined : resolveSpeculative(options.speculative);
    this.speculationOff = speculationBlocker(cfg);
    this.settings = engineSettingsFrom(process.env, options); // its pipeline, deviceSampling and graphs, over the environment
    this.pipeline = this.settings.pipeline && typeof model.backend.argmax === 'function';
    this.deviceSampling = this.settings.deviceSampling && typeof model.backend.sampleRows === 'function';
    const bs = this.opts.blockSize;
    const kvTokens = options.kvTokens ?? this.opts.maxBatch * this.maxModelLen;
    const kvDtype = resolveKvDtype(model.backend, options.kvDtype);
    const settings = options.prefixCache ?? {};
    const prefix = prefixOptionsFor(cfg, {
      dtype: kvDtype, blockSize: bs, numLayers: cfg.numLayers, numKvHeads: cfg.numKvHeads, headDim: cfg.headDim,
    }, settings);
    this.kv = new KvCache(model.backend, cfg.layers.map((l) => l.window), {
      numKvHeads: cfg.numKvHeads, headDim: cfg.headDim, blockSize: bs, dtype: kvDtype,
    }, (spec) => spec.window === 0
      ? Math.max(1, Math.ceil(kvTokens / bs))
      // sliding layers: every row at its bounded worst case, never more than full layers hold
      : Math.min(Math.ceil(kvTokens / bs), this.opts.maxBatch * blocksPerSequence(spec.window, this.maxModelLen, bs, this.opts.tokenBudget)),
    prefix.options);
    const ssd = openSsdTier(this.kv, settings);
    this.prefix = new PrefixReuse(this.kv, ssd.ssd, () => this.kick(), prefix.off, ssd.off);
    this.scheduler = new Scheduler(this.kv, {
      maxBatch: this.opts.maxBatch, maxQueued: this.opts.maxQueued, tokenBudget: this.opts.tokenBudget, drafts: this.drafts,
    });
    this.launcher = new StepLauncher(model, this.kv, {
      // decode-only steps may replay a captured graph: tables as wide as the longest sequence
      graphWidth: this.settings.graphs ? Math.ceil(this.maxModelLen / bs) + 1 : undefined,
      keepDeviceTokens: this.pipeline,
      deviceSampling: this.deviceSampling,
      ...(options.draftHead ? { hiddenFor: (rows: readonly ScheduledRow[]) => this.draftHead?.hiddenRequest(rows) } : {}),
    }, (cur, err) => this.dropFailedStep(cur, err));
    if (options.draftModel) {
      if (!('encode' in codec)) throw new RangeError('a draft model needs the target\'s tokenizer (the engine\'s codec: its LoadedModel)');
      checkDraftModel({ config: cfg, encode: (text) => (codec as unknown as LoadedModel).encode(text) }, options.draftModel);
      this.draftModel = new DraftModelRunner(options.draftModel, {
        maxBatch: this.opts.maxBatch, maxModelLen: this.maxModelLen, kvTokens, tokenBudget: this.opts.tokenBudget, blockSize: bs,
        graphWidth: this.settings.graphs ? Math.ceil(this.maxModelLen / bs) + 1 : undefined,
      });
    }
    if (options.draftHead) {
      const h = options.draftHead;
      if (h.config.vocabSize !== cfg.vocabSize || h.config.targetHiddenSize !== cfg.hiddenSize || h.config.targetLayers.some((l) => l >= cfg.numLayers)) {
        throw new RangeError(`the EAGLE-3 head (vocabulary ${h.config.vocabSize}, hidden ${h.config.targetHiddenSize}, layers ${h.config.targetLayers.join(', ')}) ` +
          `was not made for this model (vocabulary ${cfg.vocabSize}, hidden ${cfg.hiddenSize}, ${cfg.numLayers} layers)`);
      }
      this.draftHead = new Eagle3Runner(h, { maxBatch: this.opts.maxBatch, kvTokens, blockSize: bs, maxDepth: ADAPTIVE_MAX_DEFERRED });
    }
    if (this.speculative?.proposer === 'draft' && !this.draftModel) {
      throw new RangeError("speculative.proposer 'draft' needs a draft model (EngineOptions.draftModel, --draft-model)");
    }
    if (this.speculative?.proposer === 'eagle3' && !this.draftHead) {
      throw new RangeError("speculative.proposer 'eagle3' needs an EAGLE-3 head (EngineOptions.draftHead, --draft-model)");
    }
    this.decodePipeline = new DecodePipeline(this.launcher, this.scheduler, this.kv, cfg, (seq) => this.handles.get(seq));
    this.acceptor = new TokenAcceptor(this.kv, cfg, (seq, reason, error, errorKind) => this.finish(seq, reason, error, errorKind));
  }

  /** rows decoding together at most (EngineOptions.maxBatch) */
  get maxBatch(): number {
    return this.opts.maxBatch;
  }

  get stats(): EngineStats {
    return {
      running: this.scheduler.running.length,
      waiting: this.scheduler.waiting.length,
      kvBlocksUsed: this.kv.usedBlocks,
      kvBlocksTotal: this.kv.groups.reduce((a, g) => a + g.pool.numBlocks, 0),
      kvBlocksCached: this.kv.cachedBlockCount,
      steps: this.steps,
      pipelinedSteps: this.pipelinedSteps,
      prefixCache: this.prefix.stats(this.scheduler.prefix),
      speculation: { ...this.drafts.stats, acceptedLengths: [...this.drafts.stats.acceptedLengths] },
    };
  }

  /**
   * Writes every prefix waiting for the SSD tier, and the computed prefix of every running
   * sequence, now. Resolves to what was written (nothing without an SSD tier).
   */
  flushPrefixCache(): Promise<SpillResult> {
    return this.prefix.flush(this.scheduler.running);
  }

  /** Restore-from-SSD or recompute, with the rates it measured (restore-policy.ts). */
  get restorePolicy(): PrefixReuse['policy'] {
    return this.prefix.policy;
  }

  /** Forgets the cached blocks no sequence holds (the RAM tier); returns how many. */
  dropPrefixCache(): number {
    return this.kv.dropCachedBlocks();
  }

  /**
   * Validates and queues a request; events go to `emit`. Throws (nothing queued) for a prompt
   * that does not fit the context, bad sampling parameters, a full queue, or a request that can
   * never fit the KV cache.
   */
  submit(req: EngineRequest, emit: (e: SequenceEvent) => void, signal?: AbortSignal): Sequence {
    if (this.closed) throw new EngineClosedError('the engine is shutting down');
    const n = req.promptIds.length;
    if (n === 0) throw new ContextLengthError('the prompt is empty');
    if (n >= this.maxModelLen)
      throw new ContextLengthError(`the prompt has ${n} tokens; the context holds ${this.maxModelLen} (prompt + at least 1 generated token)`);
    if (!Number.isInteger(req.maxTokens) || req.maxTokens < 1) throw new RangeError(`max_tokens must be a positive integer, got ${req.maxTokens}`);
    const vocab = this.model.config.vocabSize;
    for (const id of req.promptIds) if (!Number.isInteger(id) || id < 0 || id >= vocab) throw new RangeError(`prompt token id ${id} is outside the vocabulary [0, ${vocab})`);
    const seq = new Sequence(this.nextId++, req, this.maxModelLen, vocab, this.codec.eosIds, this.codec.decode, emit, this.methodOf(req));
    try {
      this.scheduler.add(seq);
    } catch (err) {
      seq.grammar?.dispose(); // never queued: nobody else will free its matcher
      throw err;
    }
    this.prefix.onSubmit(seq);
    const handle: Handle = {};
    this.handles.set(seq, handle);
    if (signal) {
      if (signal.aborted) this.cancel(seq, 'aborted');
      else {
        const onAbort = () => this.cancel(seq, 'aborted');
        signal.addEventListener('abort', onAbort, { once: true });
        handle.detach = () => signal.removeEventListener('abort', onAbort);
      }
    }
    this.kick();
    return seq;
  }

  /** How a request's sequence decodes: speculatively when it (or the engine, by default) asks and the model allows. */
  private methodOf(req: EngineRequest): DecodingMethod {
    const o = req.speculative === undefined ? this.speculative : req.speculative === false ? undefined : resolveSpeculative(req.speculative);
    return o && !this.speculationOff ? speculativeMethod(o, this.drafts, { draftModel: this.draftModel, draftHead: this.draftHead }) : AUTOREGRESSIVE;
  }

  /** Streams a request's events; breaking out of the loop cancels it. */
  generate(req: EngineRequest, opts: { signal?: AbortSignal } = {}): AsyncIterable<SequenceEvent> {
    let seq: Sequence | undefined;
    const stream = new EventStream<SequenceEvent>(
      this.opts.streamBuffer,
      this.opts.idleTimeoutMs,
      (why) => seq && this.cancel(seq, why),
      () => this.kick(),
    );
    seq = this.submit(req, (e) => {
      stream.push(e);
      if (e.type === 'finish') stream.end();
    }, opts.signal);
    // a signal already aborted finished the request inside submit: its handle is gone, the stream ended
    const h = this.handles.get(seq);
    if (h) h.stream = stream;
    return stream;
  }

  /** Runs a request to the end and returns everything it produced. */
  complete(req: EngineRequest, opts: { signal?: AbortSignal } = {}): Promise<Completion> {
    return new Promise((resolve, reject) => {
      const tokenIds: number[] = [];
      const logprobs: TokenLogprob[] | undefined = req.topLogprobs === undefined ? undefined : [];
      let text = '';
      try {
        this.submit(req, (e) => {
          if (e.type === 'token') {
            tokenIds.push(e.tokenId);
            text += e.text;
            if (logprobs && e.logprobs) logprobs.push(e.logprobs);
            return;
          }
          text += e.text;
          resolve({
            tokenIds, text, finishReason: e.finishReason, logprobs,
            promptTokens: e.promptTokens, completionTokens: e.completionTokens, cachedTokens: e.cachedTokens,
            ...(e.speculation ? { speculation: e.speculation } : {}), error: e.error, errorKind: e.errorKind,
          });
        }, opts.signal);
      } catch (err) {
        reject(err);
      }
    });
  }

  /** Stops a sequence at the next step boundary (or now, when it is not running). */
  cancel(seq: Sequence, why = 'cancelled'): void {
    const h = this.handles.get(seq);
    if (!h || seq.finished) return;
    h.cancelled = why;
    if (!this.scheduler.running.includes(seq)) this.finish(seq, 'cancelled');
    this.kick();
  }

  /**
   * Stops admitting; lets running and queued sequences finish for up to `graceMs`, then cancels
   * what is left. Resolves when the loop is idle.
   */
  async close(graceMs = 30_000): Promise<void> {
    this.closed = true;
    const deadline = Date.now() + graceMs;
    while (this.scheduler.hasWork && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    for (const seq of [...this.scheduler.running, ...this.scheduler.waiting]) this.finish(seq, 'cancelled');
    while (this.looping) await new Promise((r) => setTimeout(r, 5));
    await this.prefix.settle();
    await this.prefix.flush([]); // the SSD tier keeps what the RAM tier held
    this.model.releaseGraphs(this.kv); // they replay into this KV's pools
    this.draftModel?.dispose();
    this.draftHead?.dispose();
    this.kv.dispose(); // the model belongs to whoever loaded it; the engine only owned its KV
  }

  private kick(): void {
    const w = this.wake;
    this.wake = undefined;
    w?.();
    if (!this.looping) void this.loop();
  }

  private isPaused = (seq: Sequence): boolean => this.handles.get(seq)?.stream?.isFull ?? false;

  private async loop(): Promise<void> {
    this.looping = true;
    let lastYield = performance.now();
    let inFlight: InFlight | undefined;
    try {
      while (inFlight || this.scheduler.hasWork) {
        if (!inFlight) {
          this.reapCancelled();
          recomputeStaleKv(this.scheduler.running, this.kv, this.model.config.recomputeKvPastLength);
          const plannedAt = performance.now();
          // the draft model's steps for the rows about to decode: their drafts are part of the step's cost
          if (this.draftModel) await this.draftModel.prepare(this.scheduler.running);
          const rows = this.scheduler.schedule(this.isPaused);
          if (rows.length === 0) {
            if (!this.scheduler.hasWork) break;
            // everyone left is paused by a slow reader, or waiting for room: sleep until kicked
            // (the next step's interval would hold the sleep)
            this.lastStepDone = undefined;
            await new Promise<void>((resolve) => (this.wake = resolve));
            continue;
          }
          // a constrained row's mask is computed on its grammar host while this thread works:
          // wait for any not in yet without holding the event loop
          const answers = grammarAnswers(rows);
          if (answers) await answers;
          inFlight = this.launcher.launch(rows);
          if (!inFlight) continue;
          // a step's cost, schedule to postprocess, is what the draft depth weighs (not when it waited for a grammar host)
          if (!answers) inFlight.plannedAt = plannedAt;
        }
        // step N+1 goes to the device before step N's tokens are read, when it can
        const next = this.decodePipeline.launchAhead(inFlight);
        const ok = await this.readBack(inFlight);
        if (next && !ok) next.discard = true;
        inFlight = next;
        // the boundary before the step already in flight: a cancel that came meanwhile ends its
        // row here, as it would before a schedule (the row's token from that step is dropped)
        if (inFlight) this.reapCancelled();
        // A device backend's read waits on another thread, so I/O (health checks, disconnects,
        // new requests) runs during every step; a backend that answers on this thread (the
        // reference backend) would starve it, so yield at least every few milliseconds.
        if (performance.now() - lastYield > YIELD_EVERY_MS) {
          await new Promise<void>((resolve) => setImmediate(resolve));
          lastYield = performance.now();
        }
      }
    } finally {
      inFlight?.step.release(); // only when an error escaped the loop
      this.looping = false;
      this.lastStepDone = undefined; // an idle engine's next step is not one interval after this one
      if (!this.closed) this.prefix.onIdle(() => this.scheduler.hasWork); // close() flushes itself
    }
  }

  private reapCancelled(): void {
    for (const seq of [...this.scheduler.running]) if (this.handles.get(seq)?.cancelled) this.finish(seq, 'cancelled');
  }

  /** Waits for a step's results and postprocesses them; false when the step failed. */
  private async readBack(cur: InFlight): Promise<boolean> {
    let result: StepResult;
    // the hidden states an EAGLE-3 head reads stay on the device until its steps after this one's postprocess
    const hidden = this.draftHead ? cur.step.hidden : undefined;
    try {
      result = await cur.step.result;
    } catch (err) {
      // A pipelined step is only a head start: its rows are still owed that token, which the
      // normal schedule computes again (and a failure that lasts ends them there). A scheduled
      // step's rows cannot continue; everyone else can.
      if (hidden) cur.step.release();
      this.dropFailedStep(cur, err);
      return false;
    } finally {
      if (!hidden) cur.step.release(); // the step behind it, if any, is already enqueued
    }
    if (cur.discard) {
      if (hidden) cur.step.release();
      returnDraws(cur);
      return false;
    }
    // a pipelined step overlapped host work: its wait is no measure of compute; nor is a step
    // that captured a graph (its time holds the one-off capture)
    const measured = !cur.step.captured;
    if (!cur.pipelined && measured) this.prefix.policy.recordStep(cur.tokens, performance.now() - cur.launchedAt + cur.step.enqueueMs);
    this.steps++;
    if (cur.pipelined) this.pipelinedSteps++;
    const knownBefore = cur.rows.reduce((n, r) => n + (r.sample ? r.seq.known : 0), 0);
    this.acceptor.postprocess(cur, result);
    const emitted = cur.rows.reduce((n, r) => n + (r.sample ? r.seq.known : 0), 0) - knownBefore;
    if (hidden) {
      try {
        await this.draftHead!.afterStep(cur.rows, hidden);
      } finally {
        cur.step.release();
      }
    }
    const done = performance.now();
    // the step costs drafting weighs are those of decode and verify rows (a prefill chunk's tokens cost less: no logits)
    if (measured && cur.plannedAt !== undefined && cur.rows.every((r) => r.sample && r.count === 1 + (r.draft?.tokens.length ?? 0))) {
      this.drafts.recordStep(cur.tokens, cur.rows.length, done - cur.plannedAt);
    }
    if (measured && cur.pipelined && this.lastStepDone !== undefined) this.drafts.recordPipelined(cur.rows.length, done - this.lastStepDone);
    // what steps with and without drafts emit in wall time, decode steps only (a prefill chunk's time buys no token)
    if (measured && this.lastStepDone !== undefined && cur.rows.every((r) => r.sample)) {
      this.drafts.recordEmitted(cur.rows.length, emitted, done - this.lastStepDone, cur.rows.some((r) => r.draft !== undefined && r.draft.tokens.length > 0));
    }
    this.lastStepDone = done;
    return true;
  }

  /**
   * A step that failed: a scheduled step's rows cannot continue and end with the error (everyone
   * else can); a pipelined step's rows are still owed their token, and get back the uniforms it drew.
   */
  private dropFailedStep(cur: InFlight, err: unknown): void {
    if (!cur.pipelined) for (const row of cur.rows) this.finish(row.seq, 'error', (err as Error).message);
    else returnDraws(cur);
  }

  private finish(seq: Sequence, reason: FinishReason, error?: string, errorKind?: 'grammar'): void {
    if (seq.finished) return;
    seq.finished = reason;
    seq.grammar?.dispose();
    this.draftModel?.forget(seq);
    this.draftHead?.forget(seq);
    this.prefix.onFinish(seq);
    this.scheduler.retire(seq);
    this.handles.get(seq)?.detach?.();
    this.handles.delete(seq);
    let tail = '';
    if (reason === 'stop' || reason === 'length') tail = seq.stops.stopped ? '' : seq.stops.feed(seq.detok.flush()).text + seq.stops.flush();
    try {
      const c = seq.method.counts;
      seq.emit({
        type: 'finish', finishReason: reason, text: tail,
        promptTokens: seq.prompt.length, completionTokens: seq.output.length, cachedTokens: seq.cachedTokens,
        ...(c ? { speculation: { ...c } } : {}), error, errorKind,
      });
    } catch {
      // a consumer's callback failing on the last event concerns only that consumer
    }
  }
}

/** The grammar hosts' answers the sampling rows of a step still wait for (undefined: none). */
function grammarAnswers(rows: readonly ScheduledRow[]): Promise<unknown> | undefined {
  let waits: Promise<void>[] | undefined;
  for (const r of rows) {
    if (!r.sample || !r.seq.grammar || r.seq.finished) continue;
    const w = r.seq.grammar.whenAnswered();
    if (w) (waits ??= []).push(w);
  }
  return waits && Promise.all(waits);
}
