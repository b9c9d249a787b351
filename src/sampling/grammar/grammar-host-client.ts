// The GrammarCompiler's side of a grammar host (grammar-host.ts): a host thread (WorkerHost) or,
// without workers, the same work on the calling thread (InlineHost). A host compiles (by message,
// bounded by a deadline: past it the host is terminated mid-compile) and serves its rows' matchers
// through their slots (RowLink): operations are posted and return at once; a row that needs an
// answer not yet written waits for it with Atomics.wait, at most `answerTimeoutMs` (longer while
// the host compiles: only a matcher started on it then waits behind the compile). A host that does
// not answer in time is declared dead and terminated; so is one whose instance failed. A dead
// host's rows fail with a GrammarRowError at their next call, and the compiler drops its grammars.
//
// A host thread is ref'd only while it starts or compiles: it never keeps a process alive.

import { Worker } from 'node:worker_threads';
import { performance } from 'node:perf_hooks';
import { HostCore, S_STATUS, Slot, type CompileReply } from './grammar-host.ts';
import { WorkerStartError } from './compile-worker-client.ts';
import type { Prepared } from './prepare.ts';
import type { HostInit, HostReply, HostRequest } from './grammar-host-worker.ts';
import type { VocabData } from './checker.ts';

/** A compile ran past its deadline (its host was terminated). */
export class CompileDeadlineError extends Error {
  constructor() {
    super('the compile ran past its deadline');
    this.name = 'CompileDeadlineError';
  }
}

/** The host died (crashed, failed, stopped answering or was closed) before it answered. */
export class HostDiedError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'HostDiedError';
  }
}

/** Atomics.waitAsync (Node 16+; TypeScript's ES2022 library does not declare it) */
const atomicsWaitAsync = (Atomics as unknown as {
  waitAsync(a: Int32Array, index: number, value: number, timeoutMs: number): { async: false; value: string } | { async: true; value: Promise<string> };
}).waitAsync;

/** One row's channel to its host. */
export interface RowLink {
  accept(ids: number[]): void;
  dispose(): void;
  /** Waits until slot word `word` (S_STATUS or S_MASK) reaches `want`; returns why it could not. */
  wait(word: number, want: number): string | undefined;
  /**
   * The same without blocking the thread: undefined when the word is there already, or when the
   * answer is computed on demand (no host thread); else resolves once it is, or once the host is
   * declared dead for not answering in time (wait then fails at once).
   */
  waitAsync(word: number, want: number): Promise<void> | undefined;
  /** why the host is gone, if it is */
  dead(): string | undefined;
}

export interface HostOptions {
  /** the serving heap's cap between compiles, past its start */
  heapCapBytes: number;
  answerTimeoutMs: number;
}

let hostIds = 0;

export abstract class GrammarHost {
  readonly id = ++hostIds;
  /** why the host stopped (set once) */
  deadReason?: string;
  /** heap bytes once its vocabulary was indexed */
  baseHeap = 0;
  /** the heap's top then (HostCore.top) */
  baseTop = 0;
  isReady = false;
  /** called once when the host dies (the compiler drops what it held there); `expected`: stopped on purpose */
  onDeath?: (host: GrammarHost, reason: string, expected: boolean) => void;
  private starting?: Promise<void>;

  abstract readonly inline: boolean;
  abstract heapBytes(): number;
  /** the heap's top after its last compile (HostCore.top) */
  abstract top(): number;
  /** Compiles `prepared` (only on a host with no live matchers); rejects CompileDeadlineError or HostDiedError. */
  abstract compile(prepared: Prepared, what: string, maxBytes: number, timeoutMs: number): Promise<CompileReply>;
  /** Frees grammar `gid` on the host. */
  abstract drop(gid: number): void;
  /** Starts a matcher of grammar `gid` answering into `slot`. */
  abstract link(gid: number, slot: Slot, jump: boolean): RowLink;
  protected abstract doStart(): Promise<void>;
  protected abstract stop(): void;

  get dead(): boolean {
    return this.deadReason !== undefined;
  }

  /** Starts the host once; rejects WorkerStartError when a host thread cannot start. */
  start(): Promise<void> {
    this.starting ??= this.doStart().then(() => {
      this.isReady = true;
    });
    return this.starting;
  }

  /** Stops the host for good; its rows fail with `reason`. `expected`: stopped on purpose, not a failure. */
  kill(reason: string, expected = false): void {
    if (this.dead) return;
    this.deadReason = reason;
    this.stop();
    this.onDeath?.(this, reason, expected);
  }
}

const ENTRY = new URL('./grammar-host-worker.mjs', import.meta.url);

interface PendingCompile {
  resolve(r: CompileReply): void;
  reject(err: Error): void;
  timer?: NodeJS.Timeout;
  /** performance.now() past which it is cut off (Infinity: no deadline) */
  deadline: number;
}

export class WorkerHost extends GrammarHost {
  readonly inline = false;
  private worker?: Worker;
  private readonly heapWord = new Int32Array(new SharedArrayBuffer(8));
  private readonly compiles = new Map<number, PendingCompile>();
  private nextId = 1;
  private nextMid = 1;

  constructor(
    private readonly vocab: SharedArrayBuffer,
    private readonly opts: HostOptions,
  ) {
    super();
  }

  protected doStart(): Promise<void> {
    let w: Worker;
    try {
      const init: HostInit = { vocab: this.vocab, heapCapBytes: this.opts.heapCapBytes, heap: this.heapWord.buffer as SharedArrayBuffer };
      w = new Worker(ENTRY, { workerData: init });
    } catch (err) {
      return Promise.reject(new WorkerStartError((err as Error).message));
    }
    this.worker = w;
    return new Promise<void>((resolve, reject) => {
      w.on('message', (m: HostReply) => {
        switch (m.type) {
          case 'ready':
            this.baseHeap = m.baseHeap;
            this.baseTop = m.baseTop;
            this.isReady = true;
            this.updateRef();
            resolve();
            break;
          case 'fatal':
            reject(new WorkerStartError(m.message));
            this.kill(`the grammar host could not start: ${m.message}`);
            break;
          case 'compiled': {
            const c = this.compiles.get(m.id);
            if (!c) break;
            this.compiles.delete(m.id);
            clearTimeout(c.timer);
            this.updateRef();
            const { type: _t, id: _i, ...reply } = m;
            c.resolve(reply as CompileReply);
            break;
          }
          case 'broken':
            this.kill(`grammar host failure: ${m.message}`);
            break;
        }
      });
      const died = (why: string) => {
        if (!this.isReady) reject(new WorkerStartError(why));
        this.kill(why);
      };
      w.on('error', (err) => died(`the grammar host failed: ${err.message}`));
      w.on('exit', (code) => died(`the grammar host exited (code ${code})`));
      this.updateRef();
    });
  }

  heapBytes(): number {
    return this.dead ? 0 : Atomics.load(this.heapWord, 0) * 65536;
  }

  top(): number {
    return Atomics.load(this.heapWord, 1);
  }

  compile(prepared: Prepared, what: string, maxBytes: number, timeoutMs: number): Promise<CompileReply> {
    if (this.dead) return Promise.reject(new HostDiedError(this.deadReason!));
    const id = this.nextId++;
    return new Promise<CompileReply>((resolve, reject) => {
      const c: PendingCompile = { resolve, reject, deadline: timeoutMs > 0 ? performance.now() + timeoutMs : Infinity };
      if (timeoutMs > 0) {
        c.timer = setTimeout(() => {
          this.compiles.delete(id);
          reject(new CompileDeadlineError());
          this.kill(`the grammar host was stopped: compiling a grammar took longer than ${timeoutMs} ms`, true);
        }, timeoutMs);
      }
      this.compiles.set(id, c);
      this.updateRef();
      this.post({ op: 'compile', id, prepared, what, maxBytes });
    });
  }

  drop(gid: number): void {
    this.post({ op: 'drop', gid });
  }

  link(gid: number, slot: Slot, jump: boolean): RowLink {
    const mid = this.nextMid++;
    this.post({ op: 'create', mid, gid, slot: slot.buffer as SharedArrayBuffer, jump });
    return new WorkerRowLink(this, mid, slot.words);
  }

  /** WorkerRowLink.wait: until `words[word]` reaches `want`, within the answer deadline (later while it compiles). */
  waitFor(words: Int32Array, word: number, want: number): string | undefined {
    if (this.dead) return this.deadReason;
    let until = performance.now() + this.opts.answerTimeoutMs;
    for (const c of this.compiles.values()) if (c.deadline !== Infinity) until = Math.max(until, c.deadline + this.opts.answerTimeoutMs);
    for (;;) {
      const v = Atomics.load(words, word);
      if (v >= want) return undefined;
      const left = until - performance.now();
      if (left <= 0) break;
      Atomics.wait(words, word, v, left);
    }
    const why = `the grammar host did not answer within ${this.opts.answerTimeoutMs} ms`;
    this.kill(why);
    return why;
  }

  /** WorkerRowLink.waitAsync: waitFor's deadline, awaited with Atomics.waitAsync. */
  waitForAsync(words: Int32Array, word: number, want: number): Promise<void> | undefined {
    if (this.dead || Atomics.load(words, word) >= want) return undefined;
    let until = performance.now() + this.opts.answerTimeoutMs;
    for (const c of this.compiles.values()) if (c.deadline !== Infinity) until = Math.max(until, c.deadline + this.opts.answerTimeoutMs);
    // a pending Atomics.waitAsync does not keep the process alive (and idle hosts are unref'd):
    // a timer does, until the answer or the deadline
    const keepAlive = setInterval(() => {}, 60_000);
    return (async () => {
      try {
        for (;;) {
          if (this.dead) return;
          const v = Atomics.load(words, word);
          if (v >= want) return;
          const left = until - performance.now();
          if (left <= 0) break;
          const r = atomicsWaitAsync(words, word, v, left);
          if (r.async) await r.value;
        }
        this.kill(`the grammar host did not answer within ${this.opts.answerTimeoutMs} ms`);
      } finally {
        clearInterval(keepAlive);
      }
    })();
  }

  protected stop(): void {
    const w = this.worker;
    this.worker = undefined;
    for (const [id, c] of this.compiles) {
      this.compiles.delete(id);
      clearTimeout(c.timer);
      c.reject(new HostDiedError(this.deadReason!));
    }
    void w?.terminate();
  }

  post(req: HostRequest): void {
    if (!this.dead) this.worker?.postMessage(req);
  }

  private updateRef(): void {
    const w = this.worker;
    if (!w) return;
    if (!this.isReady || this.compiles.size > 0) w.ref();
    else w.unref();
  }
}

/** The same work on the calling thread: compiles block it, answers are computed when asked for. */
export class InlineHost extends GrammarHost {
  readonly inline = true;
  private core?: HostCore;
  private nextMid = 1;

  constructor(
    private readonly vocab: VocabData,
    private readonly opts: HostOptions,
  ) {
    super();
  }

  protected async doStart(): Promise<void> {
    this.core = await HostCore.start(this.vocab, { heapCapBytes: this.opts.heapCapBytes });
    this.baseHeap = this.core.baseHeap;
    this.baseTop = this.core.baseTop;
  }

  top(): number {
    return this.core?.top ?? 0;
  }

  heapBytes(): number {
    return this.dead || !this.core ? 0 : this.core.heapBytes();
  }

  async compile(prepared: Prepared, what: string, maxBytes: number): Promise<CompileReply> {
    if (this.dead) throw new HostDiedError(this.deadReason!);
    return this.core!.compile(prepared, what, maxBytes);
  }

  drop(gid: number): void {
    if (!this.dead) this.core!.drop(gid);
  }

  link(gid: number, slot: Slot, jump: boolean): RowLink {
    const mid = this.nextMid++;
    this.core!.create(mid, gid, slot, jump);
    this.checkBroken();
    return new InlineRowLink(this, this.core!, mid);
  }

  protected stop(): void {
    const core = this.core;
    this.core = undefined;
    if (core && !core.broken) core.close();
  }

  /** the core rows of this host talk to, while the host is up */
  current(): HostCore | undefined {
    return this.core;
  }

  /** an instance that aborted while matching: its rows have failed; the host goes */
  checkBroken(): void {
    const core = this.core;
    if (core?.broken && !this.dead) {
      const reason = core.failure ?? 'the grammar engine instance failed';
      this.deadReason = reason;
      this.onDeath?.(this, reason, false);
    }
  }
}

class WorkerRowLink implements RowLink {
  constructor(
    private readonly host: WorkerHost,
    private readonly mid: number,
    private readonly words: Int32Array,
  ) {}

  accept(ids: number[]): void {
    this.host.post({ op: 'accept', mid: this.mid, ids });
  }

  dispose(): void {
    this.host.post({ op: 'dispose', mid: this.mid });
  }

  wait(word: number, want: number): string | undefined {
    return this.host.waitFor(this.words, word, want);
  }

  waitAsync(word: number, want: number): Promise<void> | undefined {
    return this.host.waitForAsync(this.words, word, want);
  }

  dead(): string | undefined {
    return this.host.deadReason;
  }
}

class InlineRowLink implements RowLink {
  constructor(
    private readonly host: InlineHost,
    private readonly core: HostCore,
    private readonly mid: number,
  ) {}

  accept(ids: number[]): void {
    if (this.host.dead) return;
    this.core.accept(this.mid, ids);
    this.host.checkBroken();
  }

  dispose(): void {
    if (this.host.current() === this.core) this.core.dispose(this.mid);
  }

  waitAsync(): undefined {
    return undefined; // computed on demand, by wait
  }

  wait(word: number): string | undefined {
    if (this.host.dead) return this.host.deadReason;
    if (word === S_STATUS) this.core.status(this.mid);
    else this.core.mask(this.mid);
    this.host.checkBroken();
    return undefined; // a failure is written in the slot
  }

  dead(): string | undefined {
    return this.host.deadReason;
  }
}
