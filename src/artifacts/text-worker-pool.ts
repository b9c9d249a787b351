// A few worker threads (text-worker.ts) that tokenize and render chat templates off the calling
// thread, so a large or pathological input (BPE on a long run of one character grows faster than
// its length) costs its own request's time and never the event loop's. Each worker loads the same
// tokenizer and template as the caller (the tokenizer's fingerprint is checked) and runs one job
// at a time; jobs wait in one FIFO queue.
//
//  - Cancellation: a job whose signal aborts leaves the queue, or, when running, its worker is
//    terminated (a tokenization cannot be interrupted any other way) and replaced on demand.
//  - A worker that dies (crash, out of memory) fails the job it was running with a
//    TextWorkerError; the next job gets a fresh worker.
//  - A worker that cannot start (its files changed on disk, a thread limit) fails its jobs with a
//    TextWorkerStartError: the caller may run them on its own thread instead.
//  - Workers start on first use and are unref'd while idle, so the pool never keeps a process alive.
//  - Custom jobs run the pool's extension module (TextWorkerPoolOptions.extension) on the same
//    workers, in the same queue. One that transfers memory (a request body's bytes) goes only to
//    a worker that has started: a worker that fails to start would take that memory with it, and
//    the caller could not run the job itself instead.

import { Worker, type ResourceLimits } from 'node:worker_threads';
import os from 'node:os';
import { ChatTemplateError } from './chat-template.ts';
import type { ChatTemplate } from './chat-template.ts';
import { ContinueFinalError, type ChatJob, type EncodeJob, type TextJob } from './prompt-jobs.ts';
import { PromptTooLongError } from './token-bound.ts';
import type { TextTokenizer } from './tokenizer.ts';
import type { CustomJob, SerializedError, TextReply, TextRequest, TextWorkerData, TextWorkerExtensionSpec } from './text-worker.ts';

/** A text worker failed (crashed, ran out of memory, or threw something unexpected) on this job. */
export class TextWorkerError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'TextWorkerError';
  }
}

/** No text worker could be started; the job never ran. */
export class TextWorkerStartError extends TextWorkerError {
  constructor(message: string) {
    super(`the text worker could not start: ${message}`);
    this.name = 'TextWorkerStartError';
  }
}

/** The job's signal aborted before it finished. */
export class TextJobAbortedError extends Error {
  constructor() {
    super('the text job was cancelled');
    this.name = 'TextJobAbortedError';
  }
}

export interface TextWorkerPoolOptions {
  /** workers at most (default 2, or 1 on a one-CPU machine) */
  size?: number;
  /** each worker's heap limits (default: Node's) */
  resourceLimits?: ResourceLimits;
  /** the module that runs custom jobs (text-worker.ts TextWorkerExtension), and the data its workers start it with */
  extension?: TextWorkerExtensionSpec;
}

export interface PoolStats {
  /** live workers (starting or started) */
  workers: number;
  /** jobs running now */
  running: number;
  /** jobs waiting for a worker */
  queued: number;
  /** workers started since the pool was made */
  started: number;
  /** workers that died on their own (not terminated by the pool) */
  died: number;
}

interface Job {
  job: TextJob | CustomJob;
  /** moved to the worker with the job (never copied) */
  transfer?: ArrayBuffer[];
  resolve(reply: Extract<TextReply, { type: 'result'; ok: true }>): void;
  reject(err: Error): void;
  signal?: AbortSignal;
  onAbort?: () => void;
}

interface Slot {
  worker: Worker;
  ready: boolean;
  current?: { id: number; job: Job };
}

const ENTRY = new URL('./text-worker.mjs', import.meta.url);

export class TextWorkerPool {
  private readonly size: number;
  private readonly data: TextWorkerData;
  private readonly slots: Slot[] = [];
  private readonly waiting: Job[] = [];
  private nextId = 1;
  private closed = false;
  private startedCount = 0;
  private diedCount = 0;

  constructor(tokenizer: TextTokenizer, template: ChatTemplate | undefined, private readonly opts: TextWorkerPoolOptions = {}) {
    this.size = Math.max(1, opts.size ?? Math.min(2, os.availableParallelism()));
    this.data = {
      tokenizer: tokenizer.source,
      fingerprint: tokenizer.fingerprint,
      ...(template ? { template: { sources: { ...template.sources }, origin: template.origin } } : {}),
      ...(opts.extension ? { extension: opts.extension } : {}),
    };
  }

  get stats(): PoolStats {
    return {
      workers: this.slots.length, running: this.slots.filter((s) => s.current).length, queued: this.waiting.length,
      started: this.startedCount, died: this.diedCount,
    };
  }

  /** Encodes each text; rejects with PromptTooLongError for a text that cannot fit job.contextLen. */
  async encode(job: Omit<EncodeJob, 'kind'>, signal?: AbortSignal): Promise<number[][]> {
    const r = await this.run({ kind: 'encode', ...job }, signal);
    return r.ids.map(numbers);
  }

  /** Renders and encodes a conversation (prompt-jobs.ts runChat); rejects as runChat throws. */
  async chat(job: Omit<ChatJob, 'kind'>, signal?: AbortSignal): Promise<{ ids: number[]; text: string }> {
    const r = await this.run({ kind: 'chat', ...job }, signal);
    return { ids: numbers(r.ids[0]), text: r.text ?? '' };
  }

  /**
   * Runs `payload` with the pool's extension on a worker; resolves with what the extension's
   * runner returned. `transfer`: buffers of the payload moved to the worker (unusable here from
   * then on, unless the job is cancelled before a worker takes it or no worker can start).
   */
  async custom(payload: unknown, transfer: ArrayBuffer[] = [], signal?: AbortSignal): Promise<unknown> {
    if (!this.opts.extension) throw new TextWorkerError('the text worker pool has no extension for custom jobs');
    const r = await this.run({ kind: 'custom', payload }, signal, transfer);
    return r.value;
  }

  /** Terminates every worker; waiting and running jobs reject. */
  async close(): Promise<void> {
    this.closed = true;
    const err = new TextWorkerError('the text worker pool was closed');
    for (const j of this.waiting.splice(0)) this.settle(j, err);
    const slots = this.slots.splice(0);
    for (const s of slots) if (s.current) this.settle(s.current.job, err);
    await Promise.all(slots.map((s) => s.worker.terminate()));
  }

  private run(job: TextJob | CustomJob, signal?: AbortSignal, transfer?: ArrayBuffer[]): Promise<Extract<TextReply, { type: 'result'; ok: true }>> {
    if (this.closed) return Promise.reject(new TextWorkerError('the text worker pool was closed'));
    if (signal?.aborted) return Promise.reject(new TextJobAbortedError());
    return new Promise((resolve, reject) => {
      const j: Job = { job, resolve, reject, signal, ...(transfer && transfer.length > 0 ? { transfer } : {}) };
      if (signal) {
        j.onAbort = () => this.abort(j);
        signal.addEventListener('abort', j.onAbort, { once: true });
      }
      this.waiting.push(j);
      this.pump();
    });
  }

  /** Gives waiting jobs to idle workers, starting workers up to the pool's size. */
  private pump(): void {
    while (this.waiting.length > 0 && !this.closed) {
      const next = this.waiting[0]!;
      let slot = this.slots.find((s) => !s.current && (s.ready || !next.transfer));
      if (!slot) {
        // a job that moves memory waits for an idle worker to be ready ('ready' pumps again)
        if (next.transfer && this.slots.some((s) => !s.current && !s.ready)) break;
        if (this.slots.length >= this.size) break;
        const started = this.spawn();
        if (!started) return; // spawn failed: every waiting job was rejected
        if (next.transfer) break;
        slot = started;
      }
      const job = this.waiting.shift()!;
      const id = this.nextId++;
      slot.current = { id, job };
      slot.worker.ref();
      try {
        slot.worker.postMessage({ id, job: job.job } satisfies TextRequest, job.transfer ?? []);
      } catch (err) {
        // the job cannot be sent (e.g. a value structured clone refuses): it alone fails
        slot.current = undefined;
        this.settle(job, new TextWorkerError(`the text job could not be sent to a worker: ${(err as Error).message}`));
      }
    }
    // an idle worker is unref'd, but for one starting while a job waits for it
    const awaited = this.waiting.length > 0;
    for (const s of this.slots) {
      if (s.current) continue;
      if (awaited && !s.ready) s.worker.ref();
      else s.worker.unref();
    }
  }

  private spawn(): Slot | undefined {
    let worker: Worker;
    try {
      worker = new Worker(ENTRY, { workerData: this.data, ...(this.opts.resourceLimits ? { resourceLimits: this.opts.resourceLimits } : {}) });
    } catch (err) {
      const e = new TextWorkerStartError((err as Error).message);
      for (const j of this.waiting.splice(0)) this.settle(j, e);
      return undefined;
    }
    this.startedCount++;
    const slot: Slot = { worker, ready: false };
    this.slots.push(slot);
    worker.on('message', (m: TextReply) => this.onMessage(slot, m));
    worker.on('error', (err) => this.died(slot, err.message));
    worker.on('exit', (code) => this.died(slot, `it exited with code ${code}`));
    return slot;
  }

  private onMessage(slot: Slot, m: TextReply): void {
    if (!this.slots.includes(slot)) return;
    if (m.type === 'ready') {
      slot.ready = true;
      this.pump();
      return;
    }
    if (m.type === 'fatal') {
      this.remove(slot);
      void slot.worker.terminate();
      const err = new TextWorkerStartError(m.message);
      if (slot.current) this.settle(slot.current.job, err);
      // the same failure awaits every job: none is left waiting for a worker that cannot start
      for (const j of this.waiting.splice(0)) this.settle(j, err);
      this.pump();
      return;
    }
    const cur = slot.current;
    if (!cur || cur.id !== m.id) return;
    slot.current = undefined;
    if (m.ok) this.settle(cur.job, undefined, m);
    else this.settle(cur.job, errorFrom(m.error));
    this.pump();
  }

  /** The worker died on its own: its job fails; a fresh worker takes the next one. */
  private died(slot: Slot, why: string): void {
    if (!this.slots.includes(slot)) return; // one the pool terminated
    this.remove(slot);
    this.diedCount++;
    void slot.worker.terminate();
    const cur = slot.current;
    if (cur) {
      const err = slot.ready
        ? new TextWorkerError(`the text worker died while working on this request: ${why}`)
        : new TextWorkerStartError(why);
      this.settle(cur.job, err);
    } else if (!slot.ready) {
      // the jobs that waited for it to start would wait for the next one the same way
      const err = new TextWorkerStartError(why);
      for (const j of this.waiting.filter((w) => w.transfer)) {
        this.waiting.splice(this.waiting.indexOf(j), 1);
        this.settle(j, err);
      }
    }
    this.pump();
  }

  private abort(j: Job): void {
    const at = this.waiting.indexOf(j);
    if (at >= 0) {
      this.waiting.splice(at, 1);
      this.settle(j, new TextJobAbortedError());
      return;
    }
    const slot = this.slots.find((s) => s.current?.job === j);
    if (!slot) return;
    // the only way to stop a tokenization mid-way; the slot is refilled on demand
    this.remove(slot);
    void slot.worker.terminate();
    this.settle(j, new TextJobAbortedError());
    this.pump();
  }

  private remove(slot: Slot): void {
    const at = this.slots.indexOf(slot);
    if (at >= 0) this.slots.splice(at, 1);
  }

  private settle(j: Job, err: Error | undefined, reply?: Extract<TextReply, { type: 'result'; ok: true }>): void {
    if (j.signal && j.onAbort) j.signal.removeEventListener('abort', j.onAbort);
    j.onAbort = undefined;
    if (err) j.reject(err);
    else j.resolve(reply!);
  }
}

/** A worker's ids as a list (a loop: Array.from of an Int32Array is several times slower). */
function numbers(ids: Int32Array): number[] {
  const out = new Array<number>(ids.length);
  for (let i = 0; i < ids.length; i++) out[i] = ids[i]!;
  return out;
}

/** The worker's error as the class the calling thread's code expects. */
function errorFrom(e: SerializedError): Error {
  if (e.name === 'PromptTooLongError' && e.tooLong) return new PromptTooLongError(e.tooLong.chars, e.tooLong.perToken, e.tooLong.contextLen);
  if (e.name === 'ContinueFinalError') return new ContinueFinalError();
  if (e.name === 'ChatTemplateError') return new ChatTemplateError(e.message);
  return new TextWorkerError(`the text worker failed: ${e.message}`);
}
