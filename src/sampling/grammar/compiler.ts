// Grammar compilation, one compiler per tokenizer, with a cache keyed by the spec's content hash.
//
// Where the time goes: compiling a spec is (1) parsing it (a JSON schema becomes EBNF) and (2)
// building xgrammar's adaptive token-mask cache, a pass over the vocabulary for every grammar
// position. (2) is nearly all of it: measured on the 2-core VM, a 40-field schema takes 2 ms
// for (1) and 90 / 250 / 970 ms for (2) with an 8k / 32k / 128k vocabulary.
//
// Why (2) stays on this thread: the matchers that give each row its per-step mask must live in
// the same WebAssembly instance as the compiled grammar, and @mlc-ai/web-xgrammar 0.1.27 (the
// only release after 0.1.0) cannot move a compiled grammar between instances: its binding's
// CompiledGrammar has only GetGrammar() and GetTokenizerInfo() (no serialisation, unlike the
// Python package), and an instance's memory is its own (no shared-memory build). Running the
// matchers in a worker would put a thread hop into every decode step, so they stay here and so
// does the final compile.
//
// What the compile worker (compile-worker.ts) takes off this thread: every new spec is parsed
// and validated there, then compiled once in the worker's own instance (a trial compile, thrown
// away). So an invalid schema, regex or grammar never costs this thread anything and never
// aborts the instance that holds live matchers; a spec that fails while compiling fails there;
// and a spec whose trial compile runs past `compileTimeoutMs` is refused (GrammarTimeoutError,
// a GrammarSpecError: the server's 400) and the worker is terminated mid-compile. This thread
// then compiles only specs known to compile, within that bound (the same work on the same
// vocabulary): the blocking per new spec is bounded, and paid once thanks to the cache.
// Without worker threads (`worker: false`, or the worker fails to start) specs are checked here
// in a throwaway validator instance: the same checks, on this thread.
//
// Should the main instance fail anyway, it is replaced: rows still matching on it end with a
// GrammarRowError, later requests get a fresh instance.

import { performance } from 'node:perf_hooks';
import { XGrammarError, type XgCompiledGrammar } from './xgrammar-runtime.ts';
import { RowGrammar } from './matcher.ts';
import { describeGrammar, grammarKey, type GrammarSpec } from './spec.ts';
import type { GrammarVocab } from './vocab.ts';
import { Utf8Guard } from './utf8.ts';
import { compilePrepared, GrammarSpecError, type Prepared } from './prepare.ts';
import { newCompilerState, SpecChecker, vocabData, type CompilerState, type SpecCheck } from './checker.ts';
import { GrammarTimeoutError, WorkerChecker, WorkerStartError } from './compile-worker-client.ts';

export { GrammarSpecError, fixStringRules } from './prepare.ts';
export { GrammarTimeoutError } from './compile-worker-client.ts';

export interface GrammarCompilerOptions {
  /** compiled grammars kept (least recently used ones are freed); default 64 */
  cacheSize?: number;
  /** check and trial-compile new specs on a worker thread (default true) */
  worker?: boolean;
  /**
   * with the worker: a spec whose trial compile takes longer is refused with a
   * GrammarTimeoutError, which bounds how long this thread then compiles it (default 10 000 ms;
   * 0 = no limit)
   */
  compileTimeoutMs?: number;
  /**
   * with the worker: compile each new spec there once before compiling it here (default true).
   * It doubles the first request's compile latency for a new spec; without it the worker only
   * parses and validates, and nothing bounds how long this thread compiles.
   */
  trialCompile?: boolean;
}

export const DEFAULT_COMPILE_TIMEOUT_MS = 10_000;

export interface GrammarCompilerStats {
  compiles: number;
  cacheHits: number;
  /** spec rejected as invalid (timeouts included) */
  invalid: number;
  /** specs refused because their trial compile ran past compileTimeoutMs */
  timeouts: number;
  /** milliseconds the last compile blocked this thread (the final compile) */
  lastCompileMs: number;
  /** milliseconds the last new spec spent being checked (and trial-compiled) before that */
  lastCheckMs: number;
  /** true while specs are checked on the worker thread */
  offThread: boolean;
}

interface Entry {
  key: string;
  handle: XgCompiledGrammar;
  /** the main instance the handle lives in */
  main: CompilerState;
  compileMs: number;
}

/** A compiled grammar, ready to start matchers; `release()` when no more rows will be started. */
export class CompiledGrammar {
  private released = false;

  constructor(
    private readonly handle: XgCompiledGrammar,
    private readonly main: CompilerState,
    private readonly vocab: GrammarVocab,
    private readonly utf8: Utf8Guard,
    readonly key: string,
    /** milliseconds this thread spent compiling it; 0 when it came from the cache */
    readonly compileMs: number,
  ) {}

  /** A fresh matcher for one row (synchronous: the engine calls it when the row is created). */
  createMatcher(opts: { jumpForward?: boolean } = {}): RowGrammar {
    if (this.released) throw new Error('createMatcher on a released CompiledGrammar');
    const b = this.main.inst.binding;
    const m = this.main.inst.call(() => new b.GrammarMatcher(this.handle, undefined, false, -1));
    return new RowGrammar(this.main.inst, m, this.vocab, this.utf8, opts.jumpForward ?? true);
  }

  release(): void {
    if (this.released) return;
    this.released = true;
    if (!this.main.inst.broken) this.handle.delete();
  }
}

/** how many schemas checkJsonSchema remembers as valid */
const VALID_MEMORY = 256;

export class GrammarCompiler {
  readonly stats: GrammarCompilerStats = { compiles: 0, cacheHits: 0, invalid: 0, timeouts: 0, lastCompileMs: 0, lastCheckMs: 0, offThread: false };
  private main?: Promise<CompilerState>;
  /** what `main` resolved to */
  private current?: CompilerState;
  private checker: SpecCheck;
  /** whether `checker` is the worker (a trial compile is worth it only there) */
  private viaWorker: boolean;
  private readonly trialCompile: boolean;
  private readonly cache = new Map<string, Entry>();
  /** compiles in flight by key: concurrent requests for one new spec share one compile */
  private readonly inflight = new Map<string, Promise<Entry>>();
  /** keys of JSON schemas checkJsonSchema found valid (insertion-ordered, bounded) */
  private readonly valid = new Set<string>();
  private readonly cacheSize: number;
  private readonly utf8: Utf8Guard;

  constructor(
    readonly vocab: GrammarVocab,
    opts: GrammarCompilerOptions = {},
  ) {
    this.cacheSize = Math.max(1, opts.cacheSize ?? 64);
    this.utf8 = new Utf8Guard(vocab);
    this.viaWorker = opts.worker ?? true;
    this.trialCompile = opts.trialCompile ?? true;
    // without trial compiles the worker's deadline would only bound parsing: none then
    const timeoutMs = this.trialCompile ? Math.max(0, opts.compileTimeoutMs ?? DEFAULT_COMPILE_TIMEOUT_MS) : 0;
    this.checker = this.viaWorker ? new WorkerChecker(this.trialCompile ? vocabData(vocab) : undefined, timeoutMs) : new SpecChecker();
    this.stats.offThread = this.viaWorker;
  }

  /** Loads the main instance and starts the checker now (otherwise the first compile does). */
  async warm(): Promise<void> {
    await Promise.all([this.mainState(), this.withChecker((c) => c.warm())]);
  }

  /** Stops the compile worker. Compiled grammars and live matchers stay usable. */
  async close(): Promise<void> {
    await this.checker.close();
  }

  /**
   * Only checks a JSON schema (no compilation here): a GrammarSpecError names what is wrong. Lets a
   * caller blame one schema of many (a tool's parameters) before compiling them together.
   */
  async checkJsonSchema(schema: unknown): Promise<void> {
    const spec: GrammarSpec = { type: 'json_schema', schema };
    const key = grammarKey(spec);
    if (this.valid.has(key)) return;
    await this.check(spec, false);
    this.valid.add(key);
    if (this.valid.size > VALID_MEMORY) this.valid.delete(this.valid.values().next().value as string);
  }

  /** Compiles (or finds in the cache) `spec`; throws GrammarSpecError for an invalid one. */
  async compile(spec: GrammarSpec): Promise<CompiledGrammar> {
    const key = grammarKey(spec);
    for (;;) {
      const main = await this.liveMain();
      const hit = this.cache.get(key);
      if (hit && hit.main === main) {
        this.cache.delete(key); // LRU: re-insert as the newest
        this.cache.set(key, hit);
        this.stats.cacheHits++;
        return this.lease(hit, 0);
      }
      const shared = this.inflight.get(key);
      const p = shared ?? this.compileNew(spec, key);
      if (!shared) {
        this.inflight.set(key, p);
        const clear = () => {
          if (this.inflight.get(key) === p) this.inflight.delete(key);
        };
        p.then(clear, clear);
      }
      const entry = await p;
      // evicted or its instance failed while this caller waited: look again
      if (entry.handle.isDeleted() || entry.main.inst.broken) continue;
      if (shared) this.stats.cacheHits++;
      return this.lease(entry, shared ? 0 : entry.compileMs);
    }
  }

  private lease(e: Entry, compileMs: number): CompiledGrammar {
    return new CompiledGrammar(e.handle.clone(), e.main, this.vocab, this.utf8, e.key, compileMs);
  }

  /** Checks `spec` (on the worker: with a trial compile), then compiles it on this thread. */
  private async compileNew(spec: GrammarSpec, key: string): Promise<Entry> {
    const t0 = performance.now();
    let prepared: Prepared;
    try {
      ({ prepared } = await this.check(spec, true));
    } finally {
      this.stats.lastCheckMs = performance.now() - t0;
    }
    const main = await this.liveMain();
    const t1 = performance.now();
    let handle: XgCompiledGrammar;
    try {
      handle = compilePrepared(main.inst, main.compiler, prepared);
    } catch (err) {
      if (main.inst.broken) this.dropMain(main);
      if (err instanceof XGrammarError) {
        this.stats.invalid++;
        throw new GrammarSpecError(`invalid ${describeGrammar(spec)}: ${err.message}`);
      }
      throw err;
    }
    const compileMs = performance.now() - t1;
    this.stats.compiles++;
    this.stats.lastCompileMs = compileMs;
    const entry: Entry = { key, handle, main, compileMs };
    this.cache.set(key, entry);
    while (this.cache.size > this.cacheSize) {
      const [oldKey, old] = this.cache.entries().next().value as [string, Entry];
      this.cache.delete(oldKey);
      if (!old.main.inst.broken) old.handle.delete(); // matchers and leases hold their own references
    }
    return entry;
  }

  /** The checker's verdict; counts refusals. */
  private async check(spec: GrammarSpec, trial: boolean) {
    try {
      return await this.withChecker((c) => c.check(spec, trial && this.viaWorker && this.trialCompile));
    } catch (err) {
      if (err instanceof GrammarSpecError) {
        this.stats.invalid++;
        if (err instanceof GrammarTimeoutError) this.stats.timeouts++;
      }
      throw err;
    }
  }

  /** Runs `fn` on the checker; a worker that cannot start is replaced by checking on this thread. */
  private async withChecker<T>(fn: (c: SpecCheck) => Promise<T>): Promise<T> {
    const c = this.checker;
    try {
      return await fn(c);
    } catch (err) {
      if (!(err instanceof WorkerStartError)) throw err;
      if (this.checker === c) {
        void c.close();
        this.checker = new SpecChecker();
        this.viaWorker = false;
        this.stats.offThread = false;
      }
      return fn(this.checker);
    }
  }

  private async liveMain(): Promise<CompilerState> {
    let main = await this.mainState();
    if (main.inst.broken) {
      this.dropMain(main);
      main = await this.mainState();
    }
    return main;
  }

  private mainState(): Promise<CompilerState> {
    this.main ??= newCompilerState(this.vocab).then((state) => {
      this.current = state;
      return state;
    });
    const p = this.main;
    p.catch(() => {
      if (this.main === p) this.main = undefined;
    });
    return p;
  }

  private dropMain(main: CompilerState): void {
    if (this.current === main) {
      this.main = undefined; // the next compile loads a fresh instance
      this.current = undefined;
    }
    for (const [k, e] of this.cache) if (e.main === main) this.cache.delete(k);
  }
}
