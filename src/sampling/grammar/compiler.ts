// Grammar compilation, one compiler per tokenizer, with a cache keyed by the spec's content hash,
// and the grammar hosts that compile grammars and serve the matchers of the rows using them.
//
// Where the time goes: compiling a spec is (1) parsing it (a JSON schema becomes EBNF) and (2)
// building xgrammar's adaptive token-mask cache, a pass over the vocabulary for every grammar
// position. (2) is nearly all of it: measured on the 2-core VM, a 40-field schema takes 2 ms
// for (1) and 90 / 250 / 970 ms for (2) with an 8k / 32k / 128k vocabulary; hostile but valid
// specs (a huge enum, 500 properties, `.{0,65535}`) take seconds.
//
// Why hosts: the matchers that give each row its per-step mask must live in the WebAssembly
// instance that compiled their grammar, and @mlc-ai/web-xgrammar 0.1.27 can neither serialise a
// compiled grammar (its binding's CompiledGrammar has only GetGrammar() and GetTokenizerInfo())
// nor share an instance's memory between threads. So the instance moves off the event loop
// instead: a grammar host (grammar-host.ts) is a worker thread owning one serving instance, the
// grammars compiled in it and the matchers of its rows; this thread holds no xgrammar instance.
// RowGrammar (matcher.ts) stays synchronous for the engine: a row's calls go to its host by
// message and its answers come back through a shared slot, computed ahead (the next mask while
// this thread does the rest of the step), waited for with Atomics.wait only when not there yet,
// and bounded (`answerTimeoutMs`: a host that does not answer is declared dead).
//
// Placement, so that a row's wait never sits behind a compile: a compile runs only on an idle
// host (no live matchers, and no lease handed out in the last LEASE_HOLD_MS that has not started
// its rows yet: a request's rows start right after it gets its grammar). A new spec goes to an
// idle host without cached grammars; else to a new host, while fewer than `maxHosts` exist; else
// to the idle host whose grammars were used least recently (its cached grammars wait while it
// compiles); else it waits (asynchronously: a request that waits costs its own time, never the
// event loop's) and the host with the fewest live matchers is marked draining: it takes no new
// lease (requests for its cached grammars wait too) until it is idle, then it compiles, then
// serves again. Concurrent requests for one new spec share one compile. A lease kept without
// starting rows (a library caller's) stops holding its host after LEASE_HOLD_MS; a matcher it
// starts later on a host that is compiling waits behind the compile (within its deadline).
//
// Safety. Every new spec is first parsed, validated and prepared in a throwaway validator
// instance, on the check worker (compile-worker.ts; on this thread without workers), so an
// invalid schema, regex or grammar never reaches a host. One check worker rather than a validator
// in every host: a check never waits for a host to drain (an invalid spec, or a tool schema
// checked alone, is answered while every host is busy) and a host holds one instance, not two.
// The prepared spec is then compiled
// directly in the chosen host's serving instance, not in a trial instance first: the placement
// rule means that instance holds no live matcher, so an abort there costs no row, only the
// host's cached grammars (the host is replaced); and a new spec's first request pays one compile,
// not two. A compile past `compileTimeoutMs` is refused (GrammarTimeoutError, a GrammarSpecError:
// the server's 400) and its host terminated mid-compile (it has no live matchers). A host that
// dies (crash, OOM, an instance that aborted while matching, no answer in time) ends its rows
// with GrammarRowError and drops its cached grammars; later requests recompile on a fresh host.
// Without worker threads (`worker: false`, or a host thread cannot start) the same hosts run
// inline on this thread (InlineHost: the same HostCore, called directly), as does the check.
//
// Memory. Before anything compiles, a spec is refused when it is too big, too deep or can never
// be finished (GrammarLimits, precheck.ts; prepare.ts reads every grammar back to check it), and
// when the first step would allow no token. The cache holds at most `cacheBytes` of compiled
// grammars across all hosts, each weighed as its compile grew the bytes in use in its host's
// heap, and evicts the least recently used; a grammar heavier than the whole budget is refused
// (its compile runs with the heap capped at the budget past its size). A wasm heap never
// shrinks, so an evicted grammar's bytes are reused for the host's next one, not returned. A
// host's growth is read off its heap's top (HostCore.top: how far its allocations reached, not
// the measuring probe's room or emscripten's rounded-up growth steps): one whose top grew by more
// than INSTANCE_HEAP_BUDGETS budgets (grammars evicted while rows still match on them,
// fragmentation) retires (its grammars leave the cache, compiles go elsewhere) and is terminated
// once its last matcher and lease are released; one whose refused compile moved its top by more
// than REFUSAL_HEAP_SLACK is replaced at once. Terminating a host thread returns its whole heap.
// Between compiles a host's heap is capped at INSTANCE_HEAP_BUDGETS + 1 budgets past its start.
// The check worker is replaced once it holds more than the budget plus WORKER_RECYCLE_SLACK.

import { availableParallelism } from 'node:os';
import { performance } from 'node:perf_hooks';
import { HEAP_PROBE_BYTES } from './xgrammar-runtime.ts';
import { RowGrammar } from './matcher.ts';
import { describeGrammar, grammarKey, specText, type GrammarSpec } from './spec.ts';
import type { GrammarVocab } from './vocab.ts';
import { Utf8Guard } from './utf8.ts';
import { GrammarSpecError } from './prepare.ts';
import { SpecChecker, vocabData, type SpecCheck } from './checker.ts';
import { GrammarTimeoutError, WorkerChecker, WorkerStartError } from './compile-worker-client.ts';
import { CompileDeadlineError, HostDiedError, InlineHost, WorkerHost, type GrammarHost, type HostOptions, type RowLink } from './grammar-host-client.ts';
import { Slot } from './grammar-host.ts';
import { DEFAULT_GRAMMAR_LIMITS, specSizeReason, type GrammarLimits } from './precheck.ts';

export { GrammarSpecError, fixStringRules } from './prepare.ts';
export { GrammarTimeoutError } from './compile-worker-client.ts';
export { DEFAULT_GRAMMAR_LIMITS, type GrammarLimits } from './precheck.ts';

export interface GrammarCompilerOptions {
  /** compiled grammars kept (least recently used ones are freed); default 64 */
  cacheSize?: number;
  /**
   * bytes of compiled grammars kept, across all hosts (least recently used ones are freed; a
   * grammar that alone needs more is refused); default: grammarDefaults().cacheBytes, 256 MiB unless set
   */
  cacheBytes?: number;
  /** limits on the specs compiled (default: grammarDefaults().limits) */
  limits?: Partial<GrammarLimits>;
  /** run the grammar hosts and the checks on worker threads (default true) */
  worker?: boolean;
  /**
   * with workers: a spec whose check or compile takes longer is refused with a
   * GrammarTimeoutError and the thread doing it terminated (default 10 000 ms; 0 = no limit)
   */
  compileTimeoutMs?: number;
  /** the most grammar hosts (default: min(4, available CPUs), at least 1) */
  maxHosts?: number;
  /**
   * with workers: how long a row waits for an answer its host has not written yet before the
   * host is declared dead (its rows end with a GrammarRowError); default 5 000 ms
   */
  answerTimeoutMs?: number;
}

export const DEFAULT_COMPILE_TIMEOUT_MS = 10_000;
export const DEFAULT_ANSWER_TIMEOUT_MS = 5_000;
export const DEFAULT_GRAMMAR_CACHE_BYTES = 256 * 2 ** 20;
/** the smallest cacheBytes: room for a small grammar over a large vocabulary */
export const MIN_GRAMMAR_CACHE_BYTES = 2 ** 20;
/**
 * a host is replaced once its heap grew by more than this many budgets: the cache's own,
 * grammars evicted while matchers still use them, and fragmentation
 */
export const INSTANCE_HEAP_BUDGETS = 3;
/** a host whose refused compile moved its heap's top by more than this is replaced at once */
export const REFUSAL_HEAP_SLACK = 64 * 2 ** 20;
/** the check worker is replaced once it holds more than the budget plus this */
export const WORKER_RECYCLE_SLACK = 256 * 2 ** 20;
/** how long a lease that has started no matcher keeps its host from compiling */
export const LEASE_HOLD_MS = 1_000;

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
  /** specs refused because checking or compiling them ran past compileTimeoutMs */
  timeouts: number;
  /** milliseconds the last compile took on its host */
  lastCompileMs: number;
  /** milliseconds the last new spec spent being checked before that */
  lastCheckMs: number;
  /** true while grammar hosts and checks run on worker threads */
  offThread: boolean;
  /** compiled grammars in the cache */
  cacheEntries: number;
  /** their bytes, as their compiles measured them */
  cacheBytes: number;
  /** the cache's byte budget */
  cacheCapacityBytes: number;
  /** grammars evicted from the cache (count or byte budget, or their host replaced or lost) */
  evictions: number;
  /** heap bytes of the grammar hosts' xgrammar instances (as the hosts last published them) */
  heapBytes: number;
  /** grammar hosts replaced because their heap outgrew the budget (or a refused compile grew it) */
  instanceReplacements: number;
  /** check workers replaced because they held too much memory */
  workerReplacements: number;
  /** grammar hosts running */
  hosts: number;
  /** grammar hosts lost: crashed, failed, or did not answer in time (compile timeouts not included) */
  hostFailures: number;
}

/** One grammar host as GrammarCompiler.hostStates reports it. */
export interface GrammarHostState {
  id: number;
  /** on this thread (no worker threads) */
  inline: boolean;
  matchers: number;
  compiling: boolean;
  draining: boolean;
  retiring: boolean;
  /** its compiled grammars (cached, or evicted but still leased) */
  grammars: number;
  heapBytes: number;
}

/** A host as the compiler sees it. */
interface Host {
  h: GrammarHost;
  /** live matchers */
  matchers: number;
  /** leases that have started no matcher yet (and compiles whose callers have not leased yet), by when they stop holding */
  holds: Map<object, number>;
  /** reserved by a compile (or starting for one) */
  compiling: boolean;
  /** marked for a waiting compile: no new lease until it is idle */
  draining: boolean;
  /** its heap outgrew the budget: replaced once idle, no new lease meanwhile */
  retiring: boolean;
  /** its grammars (cached, or evicted but still leased) */
  entries: Set<Entry>;
  /** when one of its grammars was last leased */
  lastUsed: number;
}

interface Entry {
  key: string;
  host: Host;
  /** the grammar's id on its host */
  gid: number;
  compileMs: number;
  /** what it weighs against the cache's budget */
  bytes: number;
  cached: boolean;
  leases: number;
  /** holds the host from its compile until its first caller leases it */
  pending?: object;
}

/** A compiled grammar, ready to start matchers; `release()` when no more rows will be started. */
export class CompiledGrammar {
  private released = false;

  constructor(
    private readonly entry: Entry,
    private readonly owner: GrammarCompiler,
    readonly key: string,
    /** milliseconds its host spent compiling it; 0 when it came from the cache */
    readonly compileMs: number,
  ) {}

  /** the grammar host it lives on (GrammarCompiler.hostStates) */
  get hostId(): number {
    return this.entry.host.h.id;
  }

  /** A fresh matcher for one row (synchronous: the engine calls it when the row is created). */
  createMatcher(opts: { jumpForward?: boolean } = {}): RowGrammar {
    if (this.released) throw new Error('createMatcher on a released CompiledGrammar');
    return this.owner.startMatcher(this.entry, this, opts.jumpForward ?? true);
  }

  release(): void {
    if (this.released) return;
    this.released = true;
    this.owner.releaseLease(this.entry, this);
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

/** a link to a host that is gone: the row fails at its first call */
const goneLink = (why: string): RowLink => ({ accept() {}, dispose() {}, wait: () => why, waitAsync: () => undefined, dead: () => why });

export class GrammarCompiler {
  private readonly s: GrammarCompilerStats;
  private readonly hosts: Host[] = [];
  private checker: SpecCheck;
  /** hosts and checks on worker threads (false once one could not start) */
  private useWorkers: boolean;
  private readonly cache = new Map<string, Entry>();
  private cachedBytes = 0;
  /** compiles in flight by key: concurrent requests for one new spec share one compile */
  private readonly inflight = new Map<string, Promise<Entry>>();
  /** keys of JSON schemas checkJsonSchema found valid (insertion-ordered, bounded) */
  private readonly valid = new Set<string>();
  private readonly cacheSize: number;
  private readonly cacheBytes: number;
  private readonly timeoutMs: number;
  readonly maxHosts: number;
  private readonly hostOpts: HostOptions;
  readonly limits: Readonly<GrammarLimits>;
  private readonly utf8: Utf8Guard;
  /** the vocabulary as host threads read it (built on first use) */
  private vocabShared?: SharedArrayBuffer;
  /** compiles waiting for a host */
  private waiting = 0;
  /** resolved (and replaced) whenever a host's state changes */
  private change?: { promise: Promise<void>; resolve: () => void };
  private wakeTimer?: NodeJS.Timeout;
  private closed = false;

  constructor(
    readonly vocab: GrammarVocab,
    opts: GrammarCompilerOptions = {},
  ) {
    this.cacheSize = Math.max(1, opts.cacheSize ?? 64);
    this.cacheBytes = opts.cacheBytes ?? defaults.cacheBytes;
    checkCacheBytes(this.cacheBytes, 'cacheBytes');
    this.limits = { ...defaults.limits, ...opts.limits };
    checkLimits(this.limits);
    this.maxHosts = opts.maxHosts ?? Math.max(1, Math.min(4, availableParallelism()));
    if (!Number.isSafeInteger(this.maxHosts) || this.maxHosts < 1) throw new RangeError(`maxHosts must be a positive integer, got ${opts.maxHosts}`);
    const answer = opts.answerTimeoutMs ?? DEFAULT_ANSWER_TIMEOUT_MS;
    if (!(answer > 0)) throw new RangeError(`answerTimeoutMs must be positive, got ${opts.answerTimeoutMs}`);
    this.utf8 = new Utf8Guard(vocab);
    this.useWorkers = opts.worker ?? true;
    this.timeoutMs = Math.max(0, opts.compileTimeoutMs ?? DEFAULT_COMPILE_TIMEOUT_MS);
    this.hostOpts = {
      heapCapBytes: Math.min(2 ** 31, (INSTANCE_HEAP_BUDGETS + 1) * this.cacheBytes + 2 * HEAP_PROBE_BYTES),
      answerTimeoutMs: answer,
    };
    this.checker = this.useWorkers
      ? new WorkerChecker(this.timeoutMs, { limits: this.limits, recycleBytes: this.cacheBytes + WORKER_RECYCLE_SLACK })
      : new SpecChecker({ limits: this.limits });
    this.s = {
      compiles: 0, cacheHits: 0, invalid: 0, timeouts: 0, lastCompileMs: 0, lastCheckMs: 0, offThread: this.useWorkers,
      cacheEntries: 0, cacheBytes: 0, cacheCapacityBytes: this.cacheBytes, evictions: 0, heapBytes: 0, instanceReplacements: 0, workerReplacements: 0,
      hosts: 0, hostFailures: 0,
    };
    const ref = new WeakRef(this);
    compilers.add(ref);
    forget.register(this, ref);
  }

  /** The counters, and the cache's and hosts' memory as of now. */
  get stats(): GrammarCompilerStats {
    const s = this.s;
    s.cacheEntries = this.cache.size;
    s.cacheBytes = this.cachedBytes;
    s.heapBytes = this.hosts.reduce((n, h) => n + h.h.heapBytes(), 0);
    s.hosts = this.hosts.length;
    s.workerReplacements = this.checker instanceof WorkerChecker ? this.checker.recycled : s.workerReplacements;
    s.offThread = this.useWorkers;
    return s;
  }

  /** The grammar hosts running now. */
  hostStates(): GrammarHostState[] {
    return this.hosts.map((h) => ({
      id: h.h.id, inline: h.h.inline, matchers: h.matchers, compiling: h.compiling, draining: h.draining, retiring: h.retiring,
      grammars: h.entries.size, heapBytes: h.h.heapBytes(),
    }));
  }

  /** Starts the checker and one grammar host now (otherwise the first compile does). */
  async warm(): Promise<void> {
    await Promise.all([
      this.withChecker((c) => c.warm()),
      this.hosts.length > 0 ? undefined : this.startHost(false).then(() => this.changed()),
    ]);
  }

  /** Stops the grammar hosts (their rows end with a GrammarRowError at their next call) and the check worker. */
  async close(): Promise<void> {
    this.closed = true;
    for (const h of [...this.hosts]) h.h.kill('the grammar compiler was closed', true);
    this.changed();
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
    await this.check(spec);
    this.valid.add(key);
    if (this.valid.size > VALID_MEMORY) this.valid.delete(this.valid.values().next().value as string);
  }

  /** Compiles (or finds in the cache) `spec`; throws GrammarSpecError for an invalid one. */
  async compile(spec: GrammarSpec): Promise<CompiledGrammar> {
    const key = this.keyOf(spec);
    for (;;) {
      if (this.closed) throw new Error('the grammar compiler was closed');
      const hit = this.cache.get(key);
      if (hit) {
        if (!this.servable(hit.host)) {
          await this.nextChange(); // its host compiles, drains or starts: serves again later
          continue;
        }
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
      // evicted, or its host lost or compiling again, while this caller waited: look again
      if (!entry.cached || entry.host.h.dead || entry.host.compiling || entry.host.retiring) continue;
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
    const host = e.host;
    if (e.pending) {
      host.holds.delete(e.pending);
      e.pending = undefined;
    }
    e.leases++;
    host.lastUsed = performance.now();
    const g = new CompiledGrammar(e, this, e.key, compileMs);
    if (!host.h.inline) host.holds.set(g, performance.now() + LEASE_HOLD_MS);
    return g;
  }

  /** CompiledGrammar.createMatcher: a row's matcher on the grammar's host. */
  startMatcher(e: Entry, lease: CompiledGrammar, jump: boolean): RowGrammar {
    const host = e.host;
    host.holds.delete(lease); // its rows start: they hold the host now
    const V = this.vocab.vocabSize;
    const slot = new Slot(host.h.inline ? new ArrayBuffer(Slot.bytes(V, false)) : new SharedArrayBuffer(Slot.bytes(V, true)), V);
    if (host.h.dead) return new RowGrammar(goneLink(host.h.deadReason!), slot, this.vocab, this.utf8, jump);
    const link = host.h.link(e.gid, slot, jump);
    host.matchers++;
    const row = new RowGrammar(link, slot, this.vocab, this.utf8, jump, () => {
      host.matchers--;
      this.unuse(host);
    });
    return row;
  }

  /** CompiledGrammar.release. */
  releaseLease(e: Entry, lease: CompiledGrammar): void {
    e.leases--;
    e.host.holds.delete(lease);
    if (!e.cached && e.leases === 0 && !e.host.h.dead) this.dropGrammar(e);
    this.unuse(e.host);
  }

  /** Checks `spec`, finds it an idle host and compiles it there. */
  private async compileNew(spec: GrammarSpec, key: string): Promise<Entry> {
    const what = describeGrammar(spec);
    const t0 = performance.now();
    let checked;
    try {
      checked = await this.check(spec);
    } finally {
      this.s.lastCheckMs = performance.now() - t0;
    }
    const host = await this.acquireHost();
    try {
      const top0 = host.h.top();
      let reply;
      try {
        reply = await host.h.compile(checked.prepared, what, this.cacheBytes, this.timeoutMs);
      } catch (err) {
        if (err instanceof CompileDeadlineError) {
          this.s.invalid++;
          this.s.timeouts++;
          throw new GrammarTimeoutError(spec, this.timeoutMs);
        }
        if (err instanceof HostDiedError) {
          this.s.invalid++;
          throw new GrammarSpecError(`the grammar compiler failed on this ${what}: ${err.message}`);
        }
        throw err;
      }
      if (!reply.ok) {
        if (reply.broken) this.stopHost(host, `the grammar host's instance failed while compiling: ${reply.message}`);
        else if (reply.top - top0 > REFUSAL_HEAP_SLACK) {
          this.s.instanceReplacements++;
          this.stopHost(host, 'replaced: a refused grammar grew its heap');
        }
        if (reply.refused) {
          this.s.invalid++;
          throw new GrammarSpecError(reply.message);
        }
        throw new Error(`grammar host: ${reply.message}`);
      }
      this.s.compiles++;
      this.s.lastCompileMs = reply.compileMs;
      const entry: Entry = { key, host, gid: reply.gid, compileMs: reply.compileMs, bytes: reply.bytes, cached: true, leases: 0, pending: {} };
      // the host stays held for the callers about to lease it
      host.holds.set(entry.pending!, performance.now() + LEASE_HOLD_MS);
      host.entries.add(entry);
      this.cache.set(key, entry);
      this.cachedBytes += reply.bytes;
      // the newest stays (its caller leases it next), however heavy
      for (const [, old] of this.cache) {
        if (this.cache.size <= this.cacheSize && this.cachedBytes <= this.cacheBytes) break;
        if (old === entry) continue;
        this.evict(old);
      }
      return entry;
    } finally {
      host.compiling = false;
      this.changed();
    }
  }

  /** Drops a cache entry (leases and matchers hold the grammar on its host until they are done). */
  private evict(e: Entry): void {
    if (!e.cached) return;
    e.cached = false;
    this.cache.delete(e.key);
    this.cachedBytes -= e.bytes;
    this.s.evictions++;
    if (e.leases === 0 && !e.host.h.dead) this.dropGrammar(e);
  }

  private dropGrammar(e: Entry): void {
    e.host.entries.delete(e);
    if (e.pending) e.host.holds.delete(e.pending);
    e.host.h.drop(e.gid);
  }

  /** whether requests may lease `host`'s grammars now */
  private servable(host: Host): boolean {
    return host.h.isReady && !host.h.dead && !host.compiling && !host.draining && !host.retiring;
  }

  private idle(host: Host, now: number): boolean {
    if (!host.h.isReady || host.h.dead || host.compiling || host.retiring || host.matchers > 0) return false;
    let held = false;
    for (const [k, until] of host.holds) {
      if (until > now) held = true;
      else host.holds.delete(k); // expired: a lease kept without rows holds nothing
    }
    return !held;
  }

  /**
   * Reserves a host for a compile (see the header: idle, new, least recently used idle, or wait
   * for one to drain).
   */
  private async acquireHost(): Promise<Host> {
    this.waiting++;
    try {
      for (;;) {
        if (this.closed) throw new Error('the grammar compiler was closed');
        const now = performance.now();
        for (const h of [...this.hosts]) if (this.idle(h, now) && this.outgrown(h)) this.unuse(h);
        const idle = this.hosts.filter((h) => this.idle(h, now));
        let pick = idle.find((h) => h.entries.size === 0);
        if (!pick && this.hosts.filter((h) => !h.retiring).length < this.maxHosts) {
          const h = await this.startHost(true);
          if (h) return h;
          continue; // it could not start here (now inline), or died starting: choose again
        }
        pick ??= idle.reduce<Host | undefined>((a, b) => (a && a.lastUsed <= b.lastUsed ? a : b), undefined);
        if (pick) {
          pick.compiling = true;
          pick.draining = false;
          return pick;
        }
        this.markDraining(now);
        await this.nextChange();
      }
    } finally {
      this.waiting--;
      this.trimDraining();
    }
  }

  /** Marks hosts draining until there are as many as compiles waiting (the fewest live matchers first). */
  private markDraining(now: number): void {
    const usable = this.hosts.filter((h) => h.h.isReady && !h.h.dead && !h.compiling && !h.retiring);
    let marked = usable.filter((h) => h.draining).length;
    const candidates = usable.filter((h) => !h.draining).sort((a, b) => a.matchers - b.matchers || a.lastUsed - b.lastUsed);
    for (const h of candidates) {
      if (marked >= this.waiting) break;
      h.draining = true;
      marked++;
    }
    // a hold that expires makes its host idle: look again then
    let soonest = Infinity;
    for (const h of usable) for (const until of h.holds.values()) if (until > now) soonest = Math.min(soonest, until);
    if (soonest !== Infinity && !this.wakeTimer) {
      this.wakeTimer = setTimeout(() => {
        this.wakeTimer = undefined;
        this.changed();
      }, Math.max(1, soonest - now + 1));
    }
  }

  /** Clears draining marks no waiting compile needs (the hosts with the most matchers first). */
  private trimDraining(): void {
    const draining = this.hosts.filter((h) => h.draining).sort((a, b) => b.matchers - a.matchers);
    let cleared = false;
    for (let i = 0; i < draining.length - this.waiting; i++) {
      draining[i]!.draining = false;
      cleared = true;
    }
    if (cleared) this.changed();
  }

  /** A new host (reserved for the caller's compile when `reserve`); undefined when it could not start. */
  private async startHost(reserve: boolean): Promise<Host | undefined> {
    const h: GrammarHost = this.useWorkers
      ? new WorkerHost(this.vocabShared ??= sharedVocab(this.vocab), this.hostOpts)
      : new InlineHost(vocabData(this.vocab), this.hostOpts);
    const host: Host = { h, matchers: 0, holds: new Map(), compiling: reserve, draining: false, retiring: false, entries: new Set(), lastUsed: 0 };
    h.onDeath = (_h, _reason, expected) => this.lost(host, expected);
    this.hosts.push(host);
    try {
      await h.start();
    } catch (err) {
      this.forgetHost(host);
      if (err instanceof WorkerStartError && this.useWorkers) {
        // no host threads here: the hosts run on this thread from now on
        this.useWorkers = false;
        this.s.offThread = false;
        h.kill(err.message, true);
        return undefined;
      }
      throw err;
    } finally {
      if (!reserve || h.dead) host.compiling = false;
      this.changed();
    }
    if (h.dead) return undefined;
    return reserve ? host : undefined;
  }

  private outgrown(host: Host): boolean {
    return host.h.top() > host.h.baseTop + INSTANCE_HEAP_BUDGETS * this.cacheBytes;
  }

  /**
   * A host that outgrew its heap bound retires: its grammars leave the cache (new compiles go to
   * a fresh host), and it goes once its last matcher and lease are released.
   */
  private retireIfOutgrown(host: Host): void {
    if (host.retiring || host.compiling || host.h.dead || !this.outgrown(host)) return;
    host.retiring = true;
    this.s.instanceReplacements++;
    for (const e of [...host.entries]) this.evict(e);
  }

  /** A lease or matcher of `host` was released (or it retired): a retired host goes once nothing uses it. */
  private unuse(host: Host): void {
    if (host.h.dead) return;
    this.retireIfOutgrown(host);
    if (host.retiring && host.matchers === 0 && [...host.entries].every((e) => e.leases === 0)) this.stopHost(host, 'replaced: its heap outgrew the budget');
    else this.changed();
  }

  private stopHost(host: Host, reason: string): void {
    host.h.kill(reason, true);
  }

  /** A host died: its grammars leave the cache; its rows fail at their next call. */
  private lost(host: Host, expected: boolean): void {
    if (!expected && !this.closed) this.s.hostFailures++;
    this.forgetHost(host);
    for (const e of [...host.entries]) {
      this.evict(e);
      if (e.pending) host.holds.delete(e.pending);
    }
    host.entries.clear();
    this.changed();
  }

  private forgetHost(host: Host): void {
    const i = this.hosts.indexOf(host);
    if (i >= 0) this.hosts.splice(i, 1);
  }

  /** Wakes everything waiting for a host's state to change. */
  private changed(): void {
    const c = this.change;
    this.change = undefined;
    c?.resolve();
  }

  private nextChange(): Promise<void> {
    if (!this.change) {
      let resolve!: () => void;
      const promise = new Promise<void>((r) => (resolve = r));
      this.change = { promise, resolve };
    }
    return this.change.promise;
  }

  /** The checker's verdict; counts refusals. */
  private async check(spec: GrammarSpec) {
    try {
      return await this.withChecker((c) => c.check(spec));
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
        this.checker = new SpecChecker({ limits: this.limits });
      }
      return fn(this.checker);
    }
  }
}

/** The vocabulary's data as UTF-8 JSON in shared memory: every host thread reads it without a copy per host. */
function sharedVocab(v: GrammarVocab): SharedArrayBuffer {
  const bytes = Buffer.from(JSON.stringify(vocabData(v)), 'utf8');
  const sab = new SharedArrayBuffer(bytes.length);
  new Uint8Array(sab).set(bytes);
  return sab;
}
