// The engine: one loop owns the device. Each step is three moves (nano-vllm): schedule (the
// catch-up rule), run (one forward over the flattened batch), postprocess (sample the rows that
// reached their end, emit events, retire finished sequences). A lone request takes this same
// path. A failure in one row (sampler error, cancel, abandoned stream) ends that row only.
//
// Device sampling: on a backend with Backend.sampleRows, a row that is not a plain greedy pick
// (temperature, top-k/p, min-p, penalties, bias, logprobs up to 20, a grammar mask) takes its token
// and logprobs from that op instead of reading its logits back. The request's RNG stays here: the
// row's uniform is drawn when the op is enqueued, one per sampled token as the host sampler draws
// it, so a seed gives the same tokens either way (EngineOptions.deviceSampling switches it).
//
// Pipelined decode: when every row of step N takes its token on the device (a greedy pick, or a
// device-sampled row whose next draw needs nothing of N's token: no penalty, no grammar), and the
// schedule after N would be a plain decode of those same sequences, step N+1 is enqueued before
// N's tokens are read back, its ids N's tokens copied on the device; N's bookkeeping then runs
// while N+1 computes. At most one step is in flight beyond the one being postprocessed. A row
// that ends at N has one extra token computed by N+1, which is dropped: never emitted, counted or
// hashed (a sampled row drew one uniform for it, which nothing later uses). Its KV write goes to a
// block the row still held when N+1 was enqueued, at a position no block hash covers; a step that
// gets the block later is enqueued later, so (ops run in enqueue order) it writes each position
// before reading it.

import type { DecoderModel, PendingStep, RowPick, StepResult } from '../models/decoder.ts';
import type { DeviceIds } from '../models/device-ids.ts';
import type { DeviceSampleRow } from '../contracts/device-sampling.ts';
import { derivedContextLength } from '../artifacts/context-length.ts';
import { KvCache, blocksPerSequence } from '../state/kv-cache.ts';
import {
  decodeDeviceSamples, deviceSamplable, deviceSampleRow, isGreedy, needsLogitProcessing, topLogprobs,
  type DeviceSampleOutcome, type SamplingParams, type TokenLogprobs,
} from '../sampling/index.ts';
import { GrammarRowError, type RowGrammar } from '../sampling/grammar/index.ts';
import type { DecodeFn } from '../generation/detokenizer.ts';
import { EventStream } from './event-stream.ts';
import { Scheduler, type ScheduledRow } from './scheduler.ts';
import { Sequence, type EngineRequest, type FinishReason, type SequenceEvent, type TokenLogprob } from './sequence.ts';
import { PrefixReuse, openSsdTier, prefixOptionsFor, type PrefixCacheSettings, type PrefixCacheStats } from './prefix-reuse.ts';

export interface EngineOptions {
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
  /** events buffered per stream before its sequence pauses (default 256) */
  streamBuffer?: number;
  /** a full stream unread this long cancels its sequence (default 60 s; 0 = never) */
  idleTimeoutMs?: number;
  /** prefix cache: RAM size, namespace, SSD tier (default: on, the whole KV pool, no SSD tier) */
  prefixCache?: PrefixCacheSettings;
  /**
   * enqueue decode steps one ahead of reading their tokens back (default true; env
   * LLMTS_PIPELINE=off turns it off): steps of greedy rows, and of device-sampled rows without
   * penalties or grammar; needs a backend with a device argmax
   */
  pipeline?: boolean;
  /**
   * sample non-greedy rows on the device (Backend.sampleRows) instead of reading their logits back
   * (default true when the backend has the op; env LLMTS_DEVICE_SAMPLING=off turns it off)
   */
  deviceSampling?: boolean;
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
  error?: string;
  /** 'grammar': the row's grammar failed */
  errorKind?: 'grammar';
}

/** what a sampling row's token comes from (Engine.accept) */
type TokenSource =
  | { logits: Float32Array }
  | { greedy: number }
  | { device: DeviceSampleOutcome }
  | { failed: unknown };

/** a sampleRows row that draws nothing and whose result is not used (a row that samples no token) */
const IDLE_ROW: DeviceSampleRow = {
  temperature: 0, topK: 0, topP: 1, minP: 0, u: 0, repetitionPenalty: 1, frequencyPenalty: 0, presencePenalty: 0,
};

const hasPenalties = (p: SamplingParams): boolean => p.repetitionPenalty !== 1 || p.frequencyPenalty !== 0 || p.presencePenalty !== 0;

/** longest stretch the loop may hold the event loop when the backend never leaves the thread */
const YIELD_EVERY_MS = 5;

export class ContextLengthError extends Error {}
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
}

interface Handle {
  seq: Sequence;
  stream?: EventStream<SequenceEvent>;
  cancelled?: string;
}

/** A row handed to Backend.sampleRows. */
interface DeviceRow {
  row: DeviceSampleRow;
  /** it could not be built (its grammar failed): the row ends with this, its result unused */
  failed?: { error: unknown };
}

/** A step handed to the model whose results have not been postprocessed yet. */
interface InFlight {
  rows: ScheduledRow[];
  step: PendingStep;
  /** the step's 'sample' rows, in logit-row order (filled when the step is enqueued) */
  sampled: DeviceRow[];
  /** uniforms its sampled rows drew, in order: handed back to their sequences if it is dropped */
  draws: { seq: Sequence; u: number }[];
  /** tokens the step computes, and when its enqueue ended (restore policy) */
  tokens: number;
  launchedAt: number;
  /** enqueued behind the step before it, its ids that step's device picks */
  pipelined: boolean;
  /** the step before it failed: nothing of this one is taken */
  discard?: boolean;
}

export class Engine {
  readonly kv: KvCache;
  readonly scheduler: Scheduler;
  readonly maxModelLen: number;
  private readonly handles = new Map<Sequence, Handle>();
  private nextId = 1;
  private looping = false;
  private closed = false;
  private wake?: () => void;
  private steps = 0;
  private pipelinedSteps = 0;
  private readonly opts: Required<Omit<EngineOptions, 'kvTokens' | 'maxModelLen' | 'prefixCache' | 'pipeline' | 'deviceSampling'>>;
  private readonly prefix: PrefixReuse;
  /** whether decode steps may be enqueued one ahead (EngineOptions.pipeline) */
  readonly pipeline: boolean;
  /** whether non-greedy rows are sampled on the device (EngineOptions.deviceSampling) */
  readonly deviceSampling: boolean;

  constructor(
    readonly model: DecoderModel,
    private readonly codec: TextCodec,
    options: EngineOptions = {},
  ) {
    const cfg = model.config;
    this.opts = {
      maxBatch: options.maxBatch ?? 16,
      maxQueued: options.maxQueued ?? 256,
      tokenBudget: options.tokenBudget ?? 512,
      blockSize: options.blockSize ?? 16,
      streamBuffer: options.streamBuffer ?? 256,
      idleTimeoutMs: options.idleTimeoutMs ?? 60_000,
    };
    this.maxModelLen = options.maxModelLen ?? derivedContextLength(cfg);
    this.pipeline = (options.pipeline ?? true) && process.env.LLMTS_PIPELINE !== 'off' && typeof model.backend.argmax === 'function';
    this.deviceSampling = (options.deviceSampling ?? true) && process.env.LLMTS_DEVICE_SAMPLING !== 'off' &&
      typeof model.backend.sampleRows === 'function';
    const bs = this.opts.blockSize;
    const kvTokens = options.kvTokens ?? this.opts.maxBatch * this.maxModelLen;
    const settings = options.prefixCache ?? {};
    const prefix = prefixOptionsFor(cfg, {
      dtype: model.backend.activationDtype, blockSize: bs, numLayers: cfg.numLayers, numKvHeads: cfg.numKvHeads, headDim: cfg.headDim,
    }, settings);
    this.kv = new KvCache(model.backend, cfg.layers.map((l) => l.window), {
      numKvHeads: cfg.numKvHeads, headDim: cfg.headDim, blockSize: bs,
    }, (spec) => spec.window === 0
      ? Math.max(1, Math.ceil(kvTokens / bs))
      // sliding layers: every row at its bounded worst case, never more than full layers hold
      : Math.min(Math.ceil(kvTokens / bs), this.opts.maxBatch * blocksPerSequence(spec.window, this.maxModelLen, bs, this.opts.tokenBudget)),
    prefix.options);
    const ssd = openSsdTier(this.kv, settings);
    this.prefix = new PrefixReuse(this.kv, ssd.ssd, () => this.kick(), prefix.off, ssd.off);
    this.scheduler = new Scheduler(this.kv, {
      maxBatch: this.opts.maxBatch, maxQueued: this.opts.maxQueued, tokenBudget: this.opts.tokenBudget,
    });
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
    };
  }

  /**
   * Writes every prefix waiting for the SSD tier, and the computed prefix of every running
   * sequence, now. Resolves to what was written (nothing without an SSD tier).
   */
  flushPrefixCache(): Promise<{ files: number; bytes: number }> {
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
    const seq = new Sequence(this.nextId++, req, this.maxModelLen, vocab, this.codec.eosIds, this.codec.decode, emit);
    try {
      this.scheduler.add(seq);
    } catch (err) {
      seq.grammar?.dispose(); // never queued: nobody else will free its matcher
      throw err;
    }
    this.prefix.onSubmit(seq);
    const handle: Handle = { seq };
    this.handles.set(seq, handle);
    if (signal) {
      if (signal.aborted) this.cancel(seq, 'aborted');
      else signal.addEventListener('abort', () => this.cancel(seq, 'aborted'), { once: true });
    }
    this.kick();
    return seq;
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
    this.handles.get(seq)!.stream = stream;
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
            promptTokens: e.promptTokens, completionTokens: e.completionTokens, cachedTokens: e.cachedTokens, error: e.error, errorKind: e.errorKind,
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
          this.recomputeStaleKv();
          const rows = this.scheduler.schedule(this.isPaused);
          if (rows.length === 0) {
            if (!this.scheduler.hasWork) break;
            // everyone left is paused by a slow reader, or waiting for room: sleep until kicked
            await new Promise<void>((resolve) => (this.wake = resolve));
            continue;
          }
          inFlight = this.launch(rows);
          if (!inFlight) continue;
        }
        // step N+1 goes to the device before step N's tokens are read, when it can
        const next = this.launchAhead(inFlight);
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
      if (!this.closed) this.prefix.onIdle(() => this.scheduler.hasWork); // close() flushes itself
    }
  }

  /**
   * A model may declare that KV computed below some length goes stale once a sequence grows past
   * it (phi3 LongRoPE switches rope factors; transformers then re-prefills). Such a sequence
   * starts over: the catch-up rule recomputes all its known tokens, then it samples as usual.
   */
  private recomputeStaleKv(): void {
    const limit = this.model.config.recomputeKvPastLength;
    if (limit === undefined) return;
    for (const seq of this.scheduler.running) {
      // once per sequence: the recompute itself may be chunked below the limit
      if (!seq.kvRecomputed && seq.computed > 0 && seq.computed <= limit && seq.known > limit) {
        this.kv.release(seq.kv!);
        seq.computed = 0;
        seq.kvRecomputed = true;
      }
    }
  }

  private reapCancelled(): void {
    for (const seq of [...this.scheduler.running]) if (this.handles.get(seq)?.cancelled) this.finish(seq, 'cancelled');
  }

  /**
   * Hands a step to the model. `ahead`: the rows' ids are an earlier step's picks still on the
   * device (a pipelined step). Returns undefined when it could not be enqueued: a scheduled
   * step's rows then end with the error; a pipelined step's rows are simply still owed their token.
   */
  private launch(rows: ScheduledRow[], ahead?: DeviceIds): InFlight | undefined {
    const tokens: number[] = [];
    const logitTokens: number[] = [];
    const picks: RowPick[] = [];
    const samplers: Sequence[] = [];
    for (const row of rows) {
      // a pipelined row's token is not on the host yet (the device supplies it)
      for (let p = row.start; p < row.start + row.count; p++) tokens.push(ahead ? 0 : row.seq.tokenAt(p));
      if (row.sample) {
        logitTokens.push(tokens.length - 1);
        picks.push(this.pickOf(row.seq));
      }
    }
    // A step that samples on the device takes its greedy rows' tokens from the same op (an argmax
    // there): the step's tokens are then one tensor, which a pipelined next step takes its ids from.
    const sampling = picks.includes('sample');
    let li = 0;
    for (const row of rows) {
      if (!row.sample) continue;
      if (sampling && picks[li] === 'argmax') picks[li] = 'sample';
      if (picks[li++] === 'sample') samplers.push(row.seq);
    }
    const cur: InFlight = { rows, step: undefined!, sampled: [], draws: [], tokens: tokens.length, launchedAt: 0, pipelined: !!ahead };
    try {
      cur.step = this.model.launch({
        tokens: Int32Array.from(tokens),
        // a pipelined row reaches one past the known tokens: its own input is still arriving
        rows: rows.map((r) => ({ seq: r.seq.kv!, start: r.start, count: r.count, ropeLength: Math.max(r.seq.known, r.start + r.count) })),
        logitTokens,
        // decode-only steps may replay a captured graph: tables as wide as the longest sequence
        graphWidth: Math.ceil(this.maxModelLen / this.opts.blockSize) + 1,
        deviceIds: ahead,
      }, this.kv, {
        rows: picks,
        // called once the forward is enqueued: masks and uniforms while the device computes
        sampleRows: () => {
          cur.sampled = samplers.map((seq) => this.deviceRow(seq, cur.draws));
          return cur.sampled.map((d) => d.row);
        },
        keep: this.pipeline,
      });
    } catch (err) {
      // The device step failed: its rows cannot continue; everyone else can. A pipelined step's
      // rows are still owed their token: the uniforms drawn for it go back to them.
      if (!ahead) for (const row of rows) this.finish(row.seq, 'error', (err as Error).message);
      else this.returnDraws(cur);
      return undefined;
    }
    cur.launchedAt = performance.now();
    this.prepareGrammarMasks(rows, cur.step.picks); // host-sampled rows, while the device runs the step
    return cur;
  }

  /** How `seq`'s next token is taken: the device's greedy pick, the device's sampleRows, or its logits. */
  private pickOf(seq: Sequence): RowPick {
    if (this.greedyOnly(seq)) return 'argmax';
    return this.deviceSampling && deviceSamplable(this.model.backend, seq.request.topLogprobs) ? 'sample' : 'logits';
  }

  /**
   * The sampleRows row of `seq`'s next token, as accept() would sample it on the host: its grammar
   * mask, then one uniform drawn (none when greedy), recorded in `draws`. A grammar row that may
   * only stop, or whose mask fails, draws nothing: accept() ends it as it would on the host.
   */
  private deviceRow(seq: Sequence, draws: InFlight['draws']): DeviceRow {
    try {
      let mask: Int32Array | undefined;
      if (seq.grammar) {
        if (seq.grammar.onlyStopAllowed()) return { row: IDLE_ROW };
        mask = seq.grammar.mask();
      }
      const sampler = { params: seq.sampler.params, nextUniform: () => seq.uniformsBack.shift() ?? seq.sampler.nextUniform() };
      const row = deviceSampleRow({ sampler, history: seq.history, mask, topLogprobs: seq.request.topLogprobs });
      if (!isGreedy(seq.sampler.params)) draws.push({ seq, u: row.u });
      return { row };
    } catch (error) {
      return { row: IDLE_ROW, failed: { error } };
    }
  }

  /**
   * A pipelined step that is dropped (it failed, or the one before it did) computed nothing its
   * rows keep: the uniforms it drew go back to them, in order, so the step that computes those
   * tokens again draws the same ones (a seeded row's tokens do not depend on a device fault).
   */
  private returnDraws(cur: InFlight): void {
    for (const { seq, u } of cur.draws) if (!seq.finished) seq.uniformsBack.push(u);
    cur.draws = [];
  }

  /**
   * Enqueues step N+1 behind `cur` (step N) before N's tokens are read back: a decode of each of
   * N's sequences, its id N's token on the device (greedy pick or sampled), gathered there. Only
   * when every row's next token needs nothing of N's but its id (pipelinable) and the schedule
   * after N would plan exactly these rows; undefined otherwise (the pipeline drains: N is read
   * back and the scheduler plans the next step).
   */
  private launchAhead(cur: InFlight): InFlight | undefined {
    const ids = cur.step.deviceTokens, at = cur.step.deviceTokenAt;
    if (!ids || !at || cur.discard) return undefined;
    const next: { seq: Sequence; start: number; pick: number }[] = [];
    let ending = false;
    let li = 0; // logit row of `row` in cur (every row of a pipelinable step samples)
    for (const row of cur.rows) {
      const seq = row.seq;
      if (!row.sample) return undefined; // a prefill chunk follows
      const pick = at[li++]!;
      if (seq.finished) continue; // ended while cur was in flight: its token is dropped
      if (pick < 0 || !this.pipelinable(seq) || !this.staysDecoding(seq, row)) return undefined;
      if (seq.known + 1 >= seq.maxTokensTotal) {
        ending = true; // cur's token ends it (length): the schedule after cur drops it too
        continue;
      }
      const start = row.start + row.count;
      if (this.kv.passesUnhashed(seq.kv!, start)) return undefined; // cur's commit must hash what the window passes
      next.push({ seq, start, pick });
    }
    if (next.length === 0 || !this.scheduleWouldMatch(cur, next.length, ending)) return undefined;
    return this.launch(this.scheduler.scheduleAhead(next), { ids, index: Int32Array.from(next, (n) => n.pick) });
  }

  /**
   * A row whose next token may be computed before its current one reaches the host: one the
   * device picks or samples, whose next draw depends on the current token only through its id
   * (and its RNG, which stays in order: one draw per token). Penalties need the token in the
   * history and a grammar needs it accepted, so those rows are not (no on-device counts).
   */
  private pipelinable(seq: Sequence): boolean {
    if (this.greedyOnly(seq)) return true;
    return this.pickOf(seq) === 'sample' && !seq.grammar && !hasPenalties(seq.sampler.params);
  }

  /**
   * false when the schedule after `row`'s step would not plan a plain decode of `seq`: it was
   * cancelled, its stream is full once that step's token is in, or its KV is about to be
   * recomputed (recomputeStaleKv).
   */
  private staysDecoding(seq: Sequence, row: ScheduledRow): boolean {
    const h = this.handles.get(seq);
    if (!h || h.cancelled) return false;
    if (h.stream && h.stream.room <= 1) return false;
    const limit = this.model.config.recomputeKvPastLength, computed = row.start + row.count;
    return limit === undefined || seq.kvRecomputed || computed > limit || seq.known + 1 <= limit;
  }

  /**
   * true when the scheduler, run after `cur`, would plan a decode of its `rows` continuing
   * sequences and nothing else: no other running sequence is owed tokens (paused, left out by
   * the budget) and the queue's head would not be admitted (nor could it be once a row `ending`
   * frees its room).
   */
  private scheduleWouldMatch(cur: InFlight, rows: number, ending: boolean): boolean {
    const inCur = new Set(cur.rows.map((r) => r.seq));
    if (this.scheduler.running.some((s) => !inCur.has(s))) return false;
    return this.scheduler.waiting.length === 0 || (!ending && !this.scheduler.wouldAdmit(rows));
  }

  /** Waits for a step's results and postprocesses them; false when the step failed. */
  private async readBack(cur: InFlight): Promise<boolean> {
    let result: StepResult;
    try {
      result = await cur.step.result;
    } catch (err) {
      // A pipelined step is only a head start: its rows are still owed that token, which the
      // normal schedule computes again (and a failure that lasts ends them there). A scheduled
      // step's rows cannot continue; everyone else can.
      if (!cur.pipelined) for (const row of cur.rows) this.finish(row.seq, 'error', (err as Error).message);
      else this.returnDraws(cur);
      return false;
    } finally {
      cur.step.release(); // the step behind it, if any, is already enqueued
    }
    if (cur.discard) {
      this.returnDraws(cur);
      return false;
    }
    // a pipelined step overlapped host work: its wait is no measure of compute
    if (!cur.pipelined) this.prefix.policy.recordStep(cur.tokens, performance.now() - cur.launchedAt + cur.step.enqueueMs);
    this.steps++;
    if (cur.pipelined) this.pipelinedSteps++;
    this.postprocess(cur, result);
    return true;
  }

  /** Takes a step's results: computed KV (and its block hashes), then each sampling row's token. */
  private postprocess({ rows, step, sampled }: InFlight, result: StepResult): void {
    const V = this.model.config.vocabSize;
    const outcomes = result.samples ? decodeDeviceSamples(result.samples, sampled.map((d) => d.row)) : [];
    let li = 0, hi = 0, si = 0;
    for (const row of rows) {
      row.seq.computed += row.count;
      if (!row.seq.finished) this.kv.commit(row.seq.kv!, row.seq.computed, (p) => row.seq.tokenAt(p));
      if (!row.sample) continue;
      // where this row's token comes from: its logits (when they came back), the device's greedy
      // pick, or its sampleRows result
      const pick = step.picks?.[li] ?? 'logits';
      let src: TokenSource;
      if (pick === 'logits') src = { logits: result.logits.subarray(hi * V, ++hi * V) };
      else if (pick === 'argmax') src = { greedy: result.tokens![li]! };
      else {
        const d = sampled[si]!;
        src = d.failed ? { failed: d.failed.error } : { device: outcomes[si]! };
        si++;
      }
      li++;
      if (row.seq.finished) continue;
      try {
        this.accept(row.seq, src);
      } catch (err) {
        this.finish(row.seq, 'error', (err as Error).message, err instanceof GrammarRowError ? 'grammar' : undefined);
      }
    }
  }

  /**
   * A row whose next token is the plain argmax of its logits (greedy; no penalty, bias, grammar
   * or logprobs): the device may pick it, and its logits need not come back.
   */
  private greedyOnly(seq: Sequence): boolean {
    const p = seq.sampler.params;
    return isGreedy(p) && !needsLogitProcessing(p) && !seq.grammar && seq.request.topLogprobs === undefined;
  }

  /**
   * Grammar rows about to sample on the host need their token bitmask; computing it here, after
   * the step was handed to the device and before its logits are awaited, takes it off the critical
   * path (device-sampled rows computed theirs before their op was enqueued). A failure is left for
   * accept() to report (the mask is recomputed there).
   */
  private prepareGrammarMasks(rows: ScheduledRow[], picks: readonly RowPick[] | undefined): void {
    let li = 0;
    for (const row of rows) {
      if (!row.sample) continue;
      if ((picks?.[li++] ?? 'logits') !== 'logits' || !row.seq.grammar || row.seq.finished) continue;
      try {
        row.seq.grammar.mask();
      } catch {
        // accept() ends the row with the error
      }
    }
  }

  /**
   * Samples (or takes the device's greedy pick or sampled token), records and emits one token of
   * `seq`, finishing it when a stop condition holds.
   */
  private accept(seq: Sequence, src: TokenSource): void {
    const grammar = seq.grammar;
    // a complete grammar that allows nothing but a stop token: end here, no token to sample
    if (grammar?.onlyStopAllowed()) return this.finish(seq, 'stop');
    let id: number;
    let r: TokenLogprobs | undefined;
    if ('logits' in src) {
      id = seq.sampler.sample(src.logits, seq.history, grammar?.mask());
      if (seq.request.topLogprobs !== undefined) r = topLogprobs(src.logits, seq.request.topLogprobs, id);
    } else if ('device' in src) {
      if ('error' in src.device) throw new Error(src.device.error);
      id = src.device.tokenId;
      r = src.device.logprobs;
    } else if ('failed' in src) throw src.failed;
    else if (src.greedy >= 0) id = src.greedy;
    else throw new Error('cannot sample: every logit is -Infinity or NaN');
    grammar?.accept(id);
    seq.history.push(id);
    seq.output.push(id);
    seq.firstTokenAt ??= performance.now();
    const lp: TokenLogprob | undefined = r && { token_id: id, logprob: r.logprob, top: r.top.map((t) => ({ token_id: t.tokenId, logprob: t.logprob })) };
    if (seq.eos.has(id)) {
      seq.emit({ type: 'token', tokenId: id, text: '', logprobs: lp });
      return this.finish(seq, 'stop');
    }
    const fed = seq.stops.feed(seq.detok.push(id));
    seq.emit({ type: 'token', tokenId: id, text: fed.text, logprobs: lp });
    if (fed.stopped) return this.finish(seq, 'stop');
    if (seq.known >= seq.maxTokensTotal) return this.finish(seq, 'length');
    if (grammar) this.advanceGrammar(seq, grammar);
  }

  /**
   * After a grammar row's token: when the grammar forces the next characters, they are appended
   * without sampling (jump-forward), and the catch-up rule computes them with the next step as one
   * chunk. Not with logprobs: forced tokens have no logits of their own to report.
   */
  private advanceGrammar(seq: Sequence, grammar: RowGrammar): void {
    if (seq.request.topLogprobs !== undefined) return;
    const forced = grammar.jumpForward(seq.maxTokensTotal - seq.known);
    for (const id of forced) {
      seq.history.push(id);
      seq.output.push(id);
      const fed = seq.stops.feed(seq.detok.push(id));
      seq.emit({ type: 'token', tokenId: id, text: fed.text });
      if (fed.stopped) return this.finish(seq, 'stop');
      if (seq.known >= seq.maxTokensTotal) return this.finish(seq, 'length');
    }
  }

  private finish(seq: Sequence, reason: FinishReason, error?: string, errorKind?: 'grammar'): void {
    if (seq.finished) return;
    seq.finished = reason;
    seq.grammar?.dispose();
    this.prefix.onFinish(seq);
    this.scheduler.retire(seq);
    this.handles.delete(seq);
    let tail = '';
    if (reason === 'stop' || reason === 'length') tail = seq.stops.stopped ? '' : seq.stops.feed(seq.detok.flush()).text + seq.stops.flush();
    try {
      seq.emit({
        type: 'finish', finishReason: reason, text: tail,
        promptTokens: seq.prompt.length, completionTokens: seq.output.length, cachedTokens: seq.cachedTokens, error, errorKind,
      });
    } catch {
      // a consumer's callback failing on the last event concerns only that consumer
    }
  }
}
