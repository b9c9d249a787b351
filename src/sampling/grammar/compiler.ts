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
//
// Memory. Before anything compiles, a spec is refused when it is too big, too deep or can never
// be finished (GrammarLimits, precheck.ts; prepare.ts reads every grammar back to check it), and
// when the first step would allow no token (the trial compile). The cache holds at most
// `cacheBytes` of compiled grammars, each weighed as the trial compile measured it in a fresh
// instance (checker.ts), and evicts the least recently used; a grammar heavier than the whole
// budget is refused. A wasm heap never shrinks, so an evicted grammar's bytes are reused for the
// next one, not returned; the main instance is replaced once its heap grew by more than
// INSTANCE_HEAP_BUDGETS budgets (grammars evicted while rows still match on them, fragmentation):
// new compiles go to a fresh one, the old one's cached grammars are dropped, and it is freed when
// its last lease and matcher are. The worker drops each trial instance after use and is itself
// replaced once it holds more than the budget plus WORKER_RECYCLE_SLACK.

import { performance } from 'node:perf_hooks';
import { XGrammarError, type XgCompiledGrammar, type XgInstance } from './xgrammar-runtime.ts';
import { RowGrammar } from './matcher.ts';
import { describeGrammar, grammarKey, specText, type GrammarSpec } from './spec.ts';
import type { GrammarVocab } from './vocab.ts';
import { Utf8Guard } from './utf8.ts';
import { compilePrepared, GrammarSpecError, type Prepared } from './prepare.ts';
import { freeCompilerState, newCompilerState, SpecChecker, vocabData, type CompilerState, type SpecCheck } from './checker.ts';
import { GrammarTimeoutError, WorkerChecker, WorkerStartError } from './compile-worker-client.ts';
import { DEFAULT_GRAMMAR_LIMITS, specSizeReason, type GrammarLimits } from './precheck.ts';

export { GrammarSpecError, fixStringRules } from './prepare.ts';
export { GrammarTimeoutError } from './compile-worker-client.ts';
export { DEFAULT_GRAMMAR_LIMITS, type GrammarLimits } from './precheck.ts';

export interface GrammarCompilerOptions {
  /** compiled grammars kept (least recently used ones are freed); default 64 */
  cacheSize?: number;
  /**
   * bytes of compiled grammars kept (least recently used ones are freed; a grammar that alone
   * needs more is refused); default: grammarDefaults().cacheBytes, 256 MiB unless set
   */
  cacheBytes?: number;
  /** limits on the specs compiled (default: grammarDefaults().limits) */
  limits?: Partial<GrammarLimits>;
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
export const DEFAULT_GRAMMAR_CACHE_BYTES = 256 * 2 ** 20;
/** the smallest cacheBytes: room for a small grammar over a large vocabulary */
export const MIN_GRAMMAR_CACHE_BYTES = 2 ** 20;
/**
 * a main instance is replaced once its heap grew by more than this many budgets: the cache's
 * own, grammars evicted while matchers still use them, and fragmentation
 */
export const INSTANCE_HEAP_BUDGETS = 3;
/** a worker is replaced once it holds more than the budget plus this */
export const WORKER_RECYCLE_SLACK = 256 * 2 ** 20;

/** What a GrammarCompiler created without options uses (process-wide; setGrammarDefaults). */
export interface GrammarDefaults {
  cacheBytes: number;
  limits: Readonly<GrammarLimits>;
}

let defaults: GrammarDefaults = { cacheBytes: DEFAULT_GRAMMAR_CACHE_BYTES, limits: DEFAULT_GRAMMAR_LIMITS };

export function grammarDefaults(): Readonly<GrammarDefaults> {
  return defaults;
}

/**
 * Sets what grammar compilers created from now on use when their options do not say (the
 * server's --grammar-cache). Throws on a value a compiler would refuse.
 */
export function setGrammarDefaults(d: { cacheBytes?: number; limits?: Partial<GrammarLimits> }): void {
  const next = { cacheBytes: d.cacheBytes ?? defaults.cacheBytes, limits: { ...defaults.limits, ...d.limits } };
  checkCacheBytes(next.cacheBytes, 'cacheBytes');
  checkLimits(next.limits);
  defaults = next;
}

function checkCacheBytes(v: number, name: string): void {
  if (!Number.isSafeInteger(v) || v < MIN_GRAMMAR_CACHE_BYTES) throw new RangeError(`${name} must be a whole number of bytes, at least ${MIN_GRAMMAR_CACHE_BYTES} (1 MiB), got ${v}`);
}

function checkLimits(l: GrammarLimits): void {
  for (const k of ['maxSpecBytes', 'maxDepth', 'maxShortestChars'] as const)
    if (!Number.isSafeInteger(l[k]) || l[k] < 1) throw new RangeError(`grammar limit ${k} must be a positive integer, got ${l[k]}`);
}

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
  /** compiled grammars in the cache */
  cacheEntries: number;
  /** their bytes, as the trial compiles measured them */
  cacheBytes: number;
  /** the cache's byte budget */
  cacheCapacityBytes: number;
  /** grammars evicted from the cache (count or byte budget, or their instance replaced) */
  evictions: number;
  /** heap bytes of this thread's xgrammar instances (the current one, and replaced ones still held by matchers) */
  heapBytes: number;
  /** main instances replaced because their heap outgrew the budget */
  instanceReplacements: number;
  /** compile workers replaced because they held too much memory */
  workerReplacements: number;
}

/** A main instance: the compiler state, its heap when it started, what still uses it. */
interface MainState {
  state: CompilerState;
  /** state.inst */
  inst: XgInstance;
  /** heap bytes once the vocabulary was indexed */
  baseHeap: number;
  /** leases and matchers not yet released */
  live: number;
  /** no longer the current instance: freed when `live` reaches 0 */
  retired: boolean;
}

interface Entry {
  key: string;
  handle: XgCompiledGrammar;
  /** the main instance the handle lives in */
  main: MainState;
  compileMs: number;
  /** what it weighs against the cache's budget */
  bytes: number;
}

/** A compiled grammar, ready to start matchers; `release()` when no more rows will be started. */
export class CompiledGrammar {
  private released = false;

  constructor(
    private readonly handle: XgCompiledGrammar,
    private readonly main: MainState,
    private readonly vocab: GrammarVocab,
    private readonly utf8: Utf8Guard,
    readonly key: string,
    /** milliseconds this thread spent compiling it; 0 when it came from the cache */
    readonly compileMs: number,
    /** the compiler's bookkeeping: called once per matcher freed and once at release */
    private readonly done: (main: MainState) => void,
  ) {
    main.live++;
  }

  /** A fresh matcher for one row (synchronous: the engine calls it when the row is created). */
  createMatcher(opts: { jumpForward?: boolean } = {}): RowGrammar {
    if (this.released) throw new Error('createMatcher on a released CompiledGrammar');
    const inst = this.main.inst;
    const b = inst.binding;
    const m = inst.call(() => new b.GrammarMatcher(this.handle, undefined, false, -1));
    this.main.live++;
    return new RowGrammar(inst, m, this.vocab, this.utf8, opts.jumpForward ?? true, () => this.done(this.main));
  }

  release(): void {
    if (this.released) return;
    this.released = true;
    if (!this.main.inst.broken) this.handle.delete();
    this.done(this.main);
  }
}

/** how many schemas checkJsonSchema remembers as valid */
const VALID_MEMORY = 256;

/** the compilers alive in this process (for metrics: grammarCompilerStats) */
const compilers = new Set<WeakRef<GrammarCompiler>>();
const forget = new FinalizationRegistry<WeakRef<GrammarCompiler>>((ref) => compilers.delete(ref));

/** The stats of every grammar compiler alive in this process (one per served model). */
export function grammarCompilerStats(): GrammarCompilerStats[] {
  const out: GrammarCompilerStats[] = [];
  for (const ref of compilers) {
    const c = ref.deref();
    if (c) out.push(c.stats);
  }
  return out;
}

export class GrammarCompiler {
  private readonly s: GrammarCompilerStats;
  private main?: Promise<MainState>;
  /** what `main` resolved to */
  private current?: MainState;
  /** replaced main instances still held by leases or matchers */
  private readonly retired = new Set<MainState>();
  private checker: SpecCheck;
  /** whether `checker` is the worker (a trial compile is worth it only there) */
  private viaWorker: boolean;
  private readonly trialCompile: boolean;
  private readonly cache = new Map<string, Entry>();
  private cachedBytes = 0;
  /** compiles in flight by key: concurrent requests for one new spec share one compile */
  private readonly inflight = new Map<string, Promise<Entry>>();
  /** keys of JSON schemas checkJsonSchema found valid (insertion-ordered, bounded) */
  private readonly valid = new Set<string>();
  private readonly cacheSize: number;
  private readonly cacheBytes: number;
  readonly limits: Readonly<GrammarLimits>;
  private readonly utf8: Utf8Guard;

  constructor(
    readonly vocab: GrammarVocab,
    opts: GrammarCompilerOptions = {},
  ) {
    this.cacheSize = Math.max(1, opts.cacheSize ?? 64);
    this.cacheBytes = opts.cacheBytes ?? defaults.cacheBytes;
    checkCacheBytes(this.cacheBytes, 'cacheBytes');
    this.limits = { ...defaults.limits, ...opts.limits };
    checkLimits(this.limits);
    this.utf8 = new Utf8Guard(vocab);
    this.viaWorker = opts.worker ?? true;
    this.trialCompile = opts.trialCompile ?? true;
    // without trial compiles the worker's deadline would only bound parsing: none then
    const timeoutMs = this.trialCompile ? Math.max(0, opts.compileTimeoutMs ?? DEFAULT_COMPILE_TIMEOUT_MS) : 0;
    this.checker = this.viaWorker
      ? new WorkerChecker(this.trialCompile ? vocabData(vocab) : undefined, timeoutMs, {
        limits: this.limits, trialMaxBytes: this.cacheBytes, recycleBytes: this.cacheBytes + WORKER_RECYCLE_SLACK,
      })
      : new SpecChecker(undefined, { limits: this.limits });
    this.s = {
      compiles: 0, cacheHits: 0, invalid: 0, timeouts: 0, lastCompileMs: 0, lastCheckMs: 0, offThread: this.viaWorker,
      cacheEntries: 0, cacheBytes: 0, cacheCapacityBytes: this.cacheBytes, evictions: 0, heapBytes: 0, instanceReplacements: 0, workerReplacements: 0,
    };
    const ref = new WeakRef(this);
    compilers.add(ref);
    forget.register(this, ref);
  }

  /** The counters, and the cache's and instances' memory as of now. */
  get stats(): GrammarCompilerStats {
    const s = this.s;
    s.cacheEntries = this.cache.size;
    s.cacheBytes = this.cachedBytes;
    let heap = this.current && !this.current.retired ? this.current.inst.heapBytes() : 0;
    for (const m of this.retired) heap += m.inst.heapBytes();
    s.heapBytes = heap;
    s.workerReplacements = this.checker instanceof WorkerChecker ? this.checker.recycled : s.workerReplacements;
    return s;
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
    const key = this.keyOf(spec);
    if (this.valid.has(key)) return;
    await this.check(spec, false);
    this.valid.add(key);
    if (this.valid.size > VALID_MEMORY) this.valid.delete(this.valid.values().next().value as string);
  }

  /** Compiles (or finds in the cache) `spec`; throws GrammarSpecError for an invalid one. */
  async compile(spec: GrammarSpec): Promise<CompiledGrammar> {
    const key = this.keyOf(spec);
    for (;;) {
      const main = await this.liveMain();
      const hit = this.cache.get(key);
      if (hit && hit.main === main) {
        this.cache.delete(key); // LRU: re-insert as the newest
        this.cache.set(key, hit);
        this.s.cacheHits++;
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
      if (shared) this.s.cacheHits++;
      return this.lease(entry, shared ? 0 : entry.compileMs);
    }
  }

  /** The spec's cache key, after refusing a spec larger than the limit (measured here: nothing is sent for it). */
  private keyOf(spec: GrammarSpec): string {
    const text = specText(spec);
    const big = specSizeReason(text, describeGrammar(spec), this.limits);
    if (big !== undefined) {
      this.s.invalid++;
      throw new GrammarSpecError(`invalid ${describeGrammar(spec)}: ${big}`);
    }
    return grammarKey(spec, text);
  }

  private lease(e: Entry, compileMs: number): CompiledGrammar {
    return new CompiledGrammar(e.handle.clone(), e.main, this.vocab, this.utf8, e.key, compileMs, (m) => this.unuse(m));
  }

  /** Checks `spec` (on the worker: with a trial compile), then compiles it on this thread. */
  private async compileNew(spec: GrammarSpec, key: string): Promise<Entry> {
    const t0 = performance.now();
    let checked: { prepared: Prepared; trialBytes?: number };
    try {
      checked = await this.check(spec, true);
    } finally {
      this.s.lastCheckMs = performance.now() - t0;
    }
    let main = await this.liveMain();
    if (main.inst.heapBytes() > main.baseHeap + INSTANCE_HEAP_BUDGETS * this.cacheBytes) {
      this.replaceMain(main);
      main = await this.liveMain();
    }
    const inst = main.inst;
    const heap0 = inst.heapBytes();
    const t1 = performance.now();
    let handle: XgCompiledGrammar;
    try {
      handle = compilePrepared(inst, main.state.compiler, checked.prepared);
    } catch (err) {
      if (inst.broken) this.dropMain(main);
      if (err instanceof XGrammarError) {
        this.s.invalid++;
        throw new GrammarSpecError(`invalid ${describeGrammar(spec)}: ${err.message}`);
      }
      throw err;
    }
    const compileMs = performance.now() - t1;
    this.s.compiles++;
    this.s.lastCompileMs = compileMs;
    // without a trial compile the grammar is weighed by how much it grew this heap (0 when it fit in freed room)
    const bytes = checked.trialBytes ?? Math.max(0, inst.heapBytes() - heap0);
    const entry: Entry = { key, handle, main, compileMs, bytes };
    this.cache.set(key, entry);
    this.cachedBytes += bytes;
    // the newest stays (its caller leases it next), however heavy
    for (const [oldKey, old] of this.cache) {
      if (this.cache.size <= this.cacheSize && this.cachedBytes <= this.cacheBytes) break;
      if (old === entry) continue;
      this.evict(oldKey, old);
    }
    return entry;
  }

  /** Drops a cache entry (matchers and leases hold their own references to the grammar). */
  private evict(key: string, e: Entry): void {
    this.cache.delete(key);
    this.cachedBytes -= e.bytes;
    this.s.evictions++;
    if (!e.main.inst.broken) e.handle.delete();
  }

  /** The main instance outgrew its bound: later compiles load a fresh one; this one is freed once unused. */
  private replaceMain(main: MainState): void {
    if (this.current !== main) return;
    this.s.instanceReplacements++;
    this.main = undefined;
    this.current = undefined;
    for (const [k, e] of this.cache) if (e.main === main) this.evict(k, e);
    this.retire(main);
  }

  private retire(main: MainState): void {
    main.retired = true;
    this.retired.add(main);
    this.unuse(main, 0);
  }

  /** A lease or matcher of `main` was released; a retired instance goes once nothing uses it. */
  private unuse(main: MainState, n = 1): void {
    main.live -= n;
    if (main.retired && main.live <= 0 && this.retired.delete(main)) freeCompilerState(main.state);
  }

  /** The checker's verdict; counts refusals. */
  private async check(spec: GrammarSpec, trial: boolean) {
    try {
      return await this.withChecker((c) => c.check(spec, trial && this.viaWorker && this.trialCompile));
    } catch (err) {
      if (err instanceof GrammarSpecError) {
        this.s.invalid++;
        if (err instanceof GrammarTimeoutError) this.s.timeouts++;
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
        if (c instanceof WorkerChecker) this.s.workerReplacements = c.recycled;
        this.checker = new SpecChecker(undefined, { limits: this.limits });
        this.viaWorker = false;
        this.s.offThread = false;
      }
      return fn(this.checker);
    }
  }

  private async liveMain(): Promise<MainState> {
    let main = await this.mainState();
    if (main.inst.broken) {
      this.dropMain(main);
      main = await this.mainState();
    }
    return main;
  }

  private mainState(): Promise<MainState> {
    this.main ??= newCompilerState(this.vocab).then((state) => {
      const m: MainState = { state, inst: state.inst, baseHeap: state.inst.heapBytes(), live: 0, retired: false };
      this.current = m;
      return m;
    });
    const p = this.main;
    p.catch(() => {
      if (this.main === p) this.main = undefined;
    });
    return p;
  }

  private dropMain(main: MainState): void {
    if (this.current === main) {
      this.main = undefined; // the next compile loads a fresh instance
      this.current = undefined;
    }
    for (const [k, e] of this.cache) if (e.main === main) this.evict(k, e);
    if (!main.retired) this.retire(main);
  }
}
