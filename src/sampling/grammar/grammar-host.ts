// A grammar host's work: one serving xgrammar instance over the vocabulary, the grammars compiled
// in it and the matchers of the rows using them. Runs on a host thread (grammar-host-worker.ts,
// driven by messages) or, without workers, on the calling thread (grammar-host-client.ts
// InlineHost calls it directly): one implementation either way.
//
// A row's answers go into its slot, a buffer the row shares with the host (a SharedArrayBuffer
// across threads): after each operation (the matcher's creation, a batch of accepted tokens) the
// host writes the status (accepted?, terminated, the jump-forward string) and publishes its
// sequence number in S_STATUS, then the next token bitmask and publishes it in S_MASK. The row
// waits on those words (Atomics.wait) only when it needs an answer that is not there yet.
//
// Never asked of a terminated matcher: its token mask and its jump-forward string (xgrammar
// 0.1.27 aborts the instance for either); a terminated row's mask reads as empty.
//
// Memory: a compile runs with the instance's heap capped at its size plus the grammar budget
// (and room for the measuring probe), and is weighed as the bytes in use below the heap's top
// after it less before it (xgrammar-runtime.ts heapUsed), wherever the allocator put them; a
// grammar heavier than the budget is refused. Between compiles the heap is capped at
// `heapCapBytes` past its start.

import { performance } from 'node:perf_hooks';
import { HEAP_PROBE_BYTES, XGrammarError, type XgCompiledGrammar, type XgMatcher } from './xgrammar-runtime.ts';
import { newCompilerState, freeCompilerState, type CompilerState, type VocabData } from './checker.ts';
import { compilePrepared, compilerReason, type Prepared } from './prepare.ts';

/** slot words: the sequence number whose status is written */
export const S_STATUS = 0;
/** the sequence number whose mask is written */
export const S_MASK = 1;
/** F_* bits of the status */
export const S_FLAGS = 2;
/** the token the grammar rejected (F_REJECTED) */
export const S_TOKEN = 3;
/** bytes of text written: the jump-forward string, or the failure's message */
export const S_TEXT = 4;
const HEADER_WORDS = 8;
/** the most text a slot holds (a longer jump-forward string is cut at a character; the rest is found next time) */
export const TEXT_BYTES = 16 * 1024;
/** the matcher failed (engine failure): the text says why; every later answer is this one */
export const F_FAILED = 1;
/** the grammar rejected S_TOKEN: the row cannot go on */
export const F_REJECTED = 2;
export const F_TERMINATED = 4;
/** the sequence number of a failed slot: every wait ends */
export const ALL_DONE = 0x7fffffff;

export const maskWords = (vocabSize: number): number => (vocabSize + 31) >>> 5;

/**
 * Views of one row's slot. Across threads it is one SharedArrayBuffer: header words, mask words,
 * then the text as UTF-8 (at most TEXT_BYTES). On one thread (`shared` false) the text is kept
 * as a string instead: nothing to encode, no size limit.
 */
export class Slot {
  readonly words: Int32Array;
  readonly mask: Int32Array;
  private readonly textBytes?: Uint8Array;
  private textValue = '';

  constructor(
    readonly buffer: SharedArrayBuffer | ArrayBuffer,
    vocabSize: number,
  ) {
    const n = maskWords(vocabSize);
    this.words = new Int32Array(buffer, 0, HEADER_WORDS);
    this.mask = new Int32Array(buffer, HEADER_WORDS * 4, n);
    if (buffer.byteLength >= Slot.bytes(vocabSize, true)) this.textBytes = new Uint8Array(buffer, (HEADER_WORDS + n) * 4, TEXT_BYTES);
  }

  /** the buffer a slot needs: with room for the text when it crosses threads */
  static bytes(vocabSize: number, shared: boolean): number {
    return (HEADER_WORDS + maskWords(vocabSize)) * 4 + (shared ? TEXT_BYTES : 0);
  }

  /** Writes the text (cut at a character when it does not fit) and its length. */
  writeText(text: string): void {
    if (!this.textBytes) {
      this.textValue = text;
      this.words[S_TEXT] = text.length;
    } else this.words[S_TEXT] = text.length === 0 ? 0 : utf8.encodeInto(text, this.textBytes).written;
  }

  /** the text written */
  readText(): string {
    const n = Atomics.load(this.words, S_TEXT);
    if (n === 0) return '';
    if (!this.textBytes) return this.textValue;
    return Buffer.from(this.textBytes.buffer, this.textBytes.byteOffset, n).toString('utf8');
  }
}

/** What a compile gave: a grammar ready for matchers, or why not. */
export type CompileReply =
  | { ok: true; gid: number; bytes: number; compileMs: number; top: number }
  /** refused: the spec's fault (a 400); broken: the instance failed and the host must be replaced */
  | { ok: false; refused: boolean; message: string; broken: boolean; top: number };

export interface HostCoreOptions {
  /** the heap's cap between compiles, past its size once the vocabulary is indexed */
  heapCapBytes: number;
}

/** a hole smaller than this counts as used when weighing a grammar */
const HOLE_BYTES = 1024;
const utf8 = new TextEncoder();
const mib = (bytes: number): string => (bytes / 2 ** 20).toFixed(1);

interface Row {
  m: XgMatcher;
  slot: Slot;
  jump: boolean;
  /** operations applied (creation is the first) */
  seq: number;
  /** the sequence numbers whose status and mask are written */
  status: number;
  masked: number;
  rejected?: number;
  /** a stop token was accepted (what xgrammar's IsTerminated says, kept here) */
  terminated: boolean;
  failed: boolean;
}

export class HostCore {
  private readonly grammars = new Map<number, XgCompiledGrammar>();
  private readonly rows = new Map<number, Row>();
  private nextGid = 1;
  /** why the instance failed (every row failed with it) */
  failure?: string;

  private constructor(
    private readonly state: CompilerState,
    readonly vocabSize: number,
    private readonly stops: ReadonlySet<number>,
    /** heap bytes once the vocabulary is indexed and the measuring probe placed */
    readonly baseHeap: number,
    /** where the heap's top was then (xgrammar-runtime.ts heapTop) */
    readonly baseTop: number,
    private readonly servingCap: number,
  ) {
    this.top = baseTop;
  }

  /** Loads the serving instance and indexes the vocabulary (~30 ms plus ~0.5 us per token). */
  static async start(vocab: VocabData, opts: HostCoreOptions): Promise<HostCore> {
    const state = await newCompilerState(vocab);
    // the first heapTop probe grows the heap once: part of the start, not of the first grammar
    const top = state.inst.heapTop() ?? state.inst.heapBytes();
    const base = state.inst.heapBytes();
    const cap = base + opts.heapCapBytes;
    state.inst.setMaxHeapBytes(cap);
    return new HostCore(state, vocab.vocabSize, new Set(vocab.stopTokenIds), base, top, cap);
  }

  get broken(): boolean {
    return this.state.inst.broken;
  }

  heapBytes(): number {
    return this.state.inst.heapBytes();
  }

  /**
   * Where the heap's top stood after the last compile: how far its allocations ever reached
   * (live grammars, and holes nothing could reuse), unlike heapBytes, which also counts the
   * measuring probe's room and the growth steps emscripten rounds up to.
   */
  top: number;

  /** live matchers */
  get matchers(): number {
    return this.rows.size;
  }

  /**
   * Compiles a prepared spec into this instance. Only ever called with no live matchers (the
   * compiler's placement rule), so an abort here costs no row: the host is then replaced.
   */
  compile(prepared: Prepared, what: string, maxBytes: number): CompileReply {
    const inst = this.state.inst;
    const refuse = (message: string): CompileReply => ({ ok: false, refused: true, message, broken: inst.broken, top: this.readTop() });
    const tooBig = (bytes?: number) => refuse(`${what} is too large: its compiled grammar needs ${bytes === undefined ? 'more than ' : ''}` +
      `${mib(bytes ?? maxBytes)} MiB, more than the grammar cache holds (${mib(maxBytes)} MiB)`);
    if (inst.broken) return { ok: false, refused: false, message: this.failure ?? 'the grammar engine instance failed earlier', broken: true, top: this.readTop() };
    const used0 = inst.heapUsed(HOLE_BYTES);
    // room for the grammar, and for the probe that measures it
    inst.setMaxHeapBytes(Math.min(this.servingCap, inst.heapBytes() + maxBytes + HEAP_PROBE_BYTES));
    const t0 = performance.now();
    let compiled: XgCompiledGrammar;
    try {
      compiled = compilePrepared(inst, this.state.compiler, prepared);
    } catch (err) {
      if (!inst.broken) inst.setMaxHeapBytes(this.servingCap);
      if (err instanceof XGrammarError && err.outOfMemory) return tooBig();
      if (err instanceof XGrammarError) return refuse(`invalid ${what}: ${compilerReason(err.message)}`);
      return { ok: false, refused: false, message: (err as Error).message ?? String(err), broken: inst.broken, top: this.readTop() };
    }
    const compileMs = performance.now() - t0;
    const used1 = inst.heapUsed(HOLE_BYTES);
    inst.setMaxHeapBytes(this.servingCap);
    const drop = (r: CompileReply): CompileReply => {
      if (!inst.broken) compiled.delete();
      return r;
    };
    // a probe that did not fit means the grammar took (nearly) all the room the cap left
    if (used1 === undefined || used0 === undefined) return drop(tooBig());
    const bytes = Math.max(0, used1 - used0);
    if (bytes > maxBytes) return drop(tooBig(bytes));
    try {
      if (!this.startsWithAToken(compiled)) return drop(refuse(`invalid ${what}: no token of the vocabulary can start its output`));
    } catch (err) {
      return drop({ ok: false, refused: false, message: (err as Error).message, broken: inst.broken, top: this.readTop() });
    }
    const gid = this.nextGid++;
    this.grammars.set(gid, compiled);
    return { ok: true, gid, bytes, compileMs, top: this.readTop() };
  }

  private readTop(): number {
    if (!this.broken) this.top = this.state.inst.heapTop() ?? this.state.inst.heapBytes();
    return this.top;
  }

  /** Frees a compiled grammar (its matchers keep what they use). */
  drop(gid: number): void {
    const g = this.grammars.get(gid);
    this.grammars.delete(gid);
    if (g && !this.broken) g.delete();
  }

  /** Starts a matcher of grammar `gid` answering into `slot` (operation 1 of the row). */
  create(mid: number, gid: number, slot: Slot, jump: boolean): void {
    const g = this.grammars.get(gid);
    const row: Row = { m: undefined as unknown as XgMatcher, slot, jump, seq: 1, status: 0, masked: 0, terminated: false, failed: false };
    if (this.broken) return this.fail(row, this.failure ?? 'the grammar engine instance failed earlier');
    if (!g) return this.fail(row, 'the compiled grammar was already released');
    const m = this.call(row, (b) => new b.GrammarMatcher(g, undefined, false, -1));
    if (m === undefined) return;
    row.m = m;
    this.rows.set(mid, row);
  }

  /** Advances row `mid` over `ids` (one operation); stops at the first token the grammar rejects. */
  accept(mid: number, ids: readonly number[]): void {
    const row = this.rows.get(mid);
    if (!row) return;
    row.seq++;
    if (row.failed || row.rejected !== undefined) return;
    for (const id of ids) {
      const ok = this.call(row, () => row.m.AcceptToken(id, false));
      if (ok === undefined) return;
      if (!ok) {
        row.rejected = id;
        return;
      }
      if (this.stops.has(id)) row.terminated = true;
    }
  }

  dispose(mid: number): void {
    const row = this.rows.get(mid);
    if (!row) return;
    this.rows.delete(mid);
    if (!this.broken && !row.failed) row.m.delete();
  }

  /** Writes row `mid`'s status for its latest operation, unless written. */
  status(mid: number): void {
    const row = this.rows.get(mid);
    if (!row || row.failed || row.status === row.seq) return;
    const w = row.slot.words;
    let flags = 0, text = '';
    if (row.rejected !== undefined) {
      flags = F_REJECTED;
      w[S_TOKEN] = row.rejected;
    } else {
      if (row.terminated) flags = F_TERMINATED;
      else if (row.jump) {
        const s = this.call(row, () => row.m.FindJumpForwardString());
        if (s === undefined) return;
        text = s;
      }
    }
    w[S_FLAGS] = flags;
    row.slot.writeText(text);
    row.status = row.seq;
    Atomics.store(w, S_STATUS, row.seq);
    Atomics.notify(w, S_STATUS);
  }

  /** Writes row `mid`'s next token bitmask for its latest operation (after its status), unless written. */
  mask(mid: number): void {
    const row = this.rows.get(mid);
    if (!row || row.failed || row.masked === row.seq) return;
    this.status(mid);
    if (row.failed) return;
    const w = row.slot.words;
    if (row.rejected === undefined && !row.terminated) {
      const ok = this.call(row, (b) => {
        const v = row.m.GetNextTokenBitmask(this.vocabSize);
        try {
          row.slot.mask.set(b.vecIntToView(v).subarray(0, row.slot.mask.length));
        } finally {
          v.delete();
        }
        return true;
      });
      if (ok === undefined) return;
    } else row.slot.mask.fill(0);
    row.masked = row.seq;
    Atomics.store(w, S_MASK, row.seq);
    Atomics.notify(w, S_MASK);
  }

  /** Frees the instance's objects (the instance goes with its last reference). */
  close(): void {
    for (const mid of [...this.rows.keys()]) this.dispose(mid);
    for (const gid of [...this.grammars.keys()]) this.drop(gid);
    freeCompilerState(this.state);
  }

  /**
   * Runs a matcher call; a failure fails the row (undefined is returned), and an instance that
   * aborted fails every row of this host.
   */
  private call<T>(row: Row, fn: (b: CompilerState['inst']['binding']) => T): T | undefined {
    try {
      return this.state.inst.call(fn);
    } catch (err) {
      const message = `grammar engine failure: ${(err as Error).message}`;
      if (this.broken) {
        this.failure ??= message;
        for (const r of this.rows.values()) this.fail(r, message);
      }
      this.fail(row, message);
      return undefined;
    }
  }

  private fail(row: Row, message: string): void {
    if (row.failed) return;
    row.failed = true;
    const w = row.slot.words;
    w[S_FLAGS] = F_FAILED;
    row.slot.writeText(message);
    Atomics.store(w, S_STATUS, ALL_DONE);
    Atomics.store(w, S_MASK, ALL_DONE);
    Atomics.notify(w, S_STATUS);
    Atomics.notify(w, S_MASK);
  }

  /** whether a fresh matcher of `compiled` allows any token at all (stop tokens included) */
  private startsWithAToken(compiled: XgCompiledGrammar): boolean {
    const inst = this.state.inst;
    return inst.call((b) => {
      const m = new b.GrammarMatcher(compiled, undefined, false, -1);
      try {
        const v = m.GetNextTokenBitmask(this.vocabSize);
        try {
          const words = b.vecIntToView(v);
          const n = Math.min(words.length, maskWords(this.vocabSize));
          for (let w = 0; w < n; w++) if (words[w] !== 0) return true;
          return false;
        } finally {
          v.delete();
        }
      } finally {
        m.delete();
      }
    });
  }
}
