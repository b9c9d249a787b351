// The GrammarCompiler's side of the check worker (compile-worker.ts): sends one spec at a time,
// bounds each by a deadline, and replaces the worker when it runs past it, dies, or is closed.
//
// The worker is started lazily and unref'd while idle (it never keeps a process alive); it is
// ref'd while it starts or works, so an awaited check always completes.
//
// Memory: the worker's validator is dropped once its heap grew, but a dropped heap goes back to
// the system only when collected; a worker that reports holding more than `recycleBytes` after a
// check is terminated (which frees its whole heap at once) and a fresh one started.

import { Worker } from 'node:worker_threads';
import { GrammarSpecError } from './prepare.ts';
import { describeGrammar, type GrammarSpec } from './spec.ts';
import type { CheckResult, SpecCheck, SpecCheckerOptions } from './checker.ts';
import type { CheckReply, CheckRequest, WorkerInit } from './compile-worker.ts';

/** A worker could not be started (the caller does its work on its own thread instead). */
export class WorkerStartError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'WorkerStartError';
  }
}

/** Checking or compiling a spec ran past the deadline (a 400, like any other spec the compiler refuses). */
export class GrammarTimeoutError extends GrammarSpecError {
  constructor(spec: GrammarSpec, timeoutMs: number) {
    super(`${describeGrammar(spec)} is too complex: compiling it took longer than ${timeoutMs} ms`);
    this.name = 'GrammarTimeoutError';
  }
}

interface Job {
  spec: GrammarSpec;
  resolve(r: CheckResult): void;
  reject(err: Error): void;
}

const ENTRY = new URL('./compile-worker.mjs', import.meta.url);

export class WorkerChecker implements SpecCheck {
  private worker?: Worker;
  private ready?: Promise<void>;
  private isReady = false;
  private current?: { job: Job; id: number; timer?: NodeJS.Timeout };
  private readonly waiting: Job[] = [];
  private nextId = 1;
  private closed = false;
  /** workers replaced because they held more than recycleBytes */
  recycled = 0;

  constructor(
    /** 0 = no deadline */
    private readonly timeoutMs: number,
    private readonly opts: SpecCheckerOptions & {
      /** a worker holding more external memory than this after a check is replaced (default: never) */
      recycleBytes?: number;
    } = {},
  ) {}

  warm(): Promise<void> {
    return this.start();
  }

  check(spec: GrammarSpec): Promise<CheckResult> {
    if (this.closed) return Promise.reject(new Error('the grammar compiler was closed'));
    return new Promise((resolve, reject) => {
      this.waiting.push({ spec, resolve, reject });
      this.pump();
    });
  }

  async close(): Promise<void> {
    this.closed = true;
    const err = new Error('the grammar compiler was closed');
    this.failAll(err);
    const w = this.worker;
    this.forget();
    await w?.terminate();
  }

  private start(): Promise<void> {
    if (this.ready) return this.ready;
    if (this.closed) return Promise.reject(new Error('the grammar compiler was closed'));
    let w: Worker;
    try {
      const init: WorkerInit = { limits: this.opts.limits };
      w = new Worker(ENTRY, { workerData: init });
    } catch (err) {
      return Promise.reject(new WorkerStartError((err as Error).message));
    }
    this.worker = w;
    this.isReady = false;
    const ready = new Promise<void>((resolve, reject) => {
      w.on('message', (m: CheckReply) => {
        if (w !== this.worker) return;
        if (m.type === 'ready') {
          this.isReady = true;
          this.updateRef();
          resolve();
        } else if (m.type === 'fatal') {
          this.forget();
          void w.terminate();
          reject(new WorkerStartError(m.message));
        } else this.onResult(m);
      });
      const died = (why: string) => {
        if (w !== this.worker) return; // one we replaced or closed
        if (!this.isReady) {
          this.forget();
          reject(new WorkerStartError(why));
          return;
        }
        this.forget();
        const cur = this.current;
        this.current = undefined;
        if (cur) {
          clearTimeout(cur.timer);
          cur.job.reject(new GrammarSpecError(`the grammar checker failed on this ${describeGrammar(cur.job.spec)}: ${why}`));
        }
        this.pump();
      };
      w.on('error', (err) => died(err.message));
      w.on('exit', (code) => died(`the check worker exited (code ${code})`));
    });
    this.ready = ready;
    this.updateRef();
    return ready;
  }

  /** Sends the next waiting job when none is in flight. */
  private pump(): void {
    if (this.current || this.waiting.length === 0 || this.closed) {
      this.updateRef();
      return;
    }
    const job = this.waiting.shift()!;
    const id = this.nextId++;
    const cur: { job: Job; id: number; timer?: NodeJS.Timeout } = { job, id };
    this.current = cur;
    this.updateRef();
    this.start().then(() => {
      if (this.current !== cur) return;
      if (this.timeoutMs > 0) cur.timer = setTimeout(() => this.timedOut(cur), this.timeoutMs);
      this.worker!.postMessage({ id, spec: job.spec } satisfies CheckRequest);
    }, (err: Error) => this.failAll(err instanceof WorkerStartError ? err : new WorkerStartError(err.message)));
  }

  private onResult(m: Extract<CheckReply, { type: 'result' }>): void {
    const cur = this.current;
    if (!cur || cur.id !== m.id) return;
    clearTimeout(cur.timer);
    this.current = undefined;
    if (m.ok) cur.job.resolve({ prepared: m.prepared });
    else cur.job.reject(m.invalid ? new GrammarSpecError(m.message) : new Error(`grammar check worker: ${m.message}`));
    if (this.opts.recycleBytes !== undefined && m.externalBytes > this.opts.recycleBytes) this.recycle();
    this.pump();
  }

  /** Terminates the idle worker (its heap is freed with it) and starts a fresh one in the background. */
  private recycle(): void {
    const w = this.worker;
    this.forget();
    this.recycled++;
    void w?.terminate();
    if (!this.closed) this.start().catch(() => {}); // a start failure shows again on the next check
  }

  /** The deadline passed: the worker is terminated mid-compile and a fresh one takes the next job. */
  private timedOut(cur: { job: Job; id: number }): void {
    if (this.current !== cur) return;
    this.current = undefined;
    const w = this.worker;
    this.forget();
    void w?.terminate();
    cur.job.reject(new GrammarTimeoutError(cur.job.spec, this.timeoutMs));
    this.pump();
  }

  private failAll(err: Error): void {
    const cur = this.current;
    this.current = undefined;
    if (cur) {
      clearTimeout(cur.timer);
      cur.job.reject(err);
    }
    for (const job of this.waiting.splice(0)) job.reject(err);
  }

  private forget(): void {
    this.worker = undefined;
    this.ready = undefined;
    this.isReady = false;
  }

  private updateRef(): void {
    const w = this.worker;
    if (!w) return;
    if (!this.isReady || this.current || this.waiting.length > 0) w.ref();
    else w.unref();
  }
}
