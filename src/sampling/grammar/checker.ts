// Checks a spec before the compiler that holds live matchers ever sees it: parses it in a
// throwaway validator instance (a bad spec aborts the instance that parses it, which is then
// replaced), prepares what gets compiled, and optionally compiles it once in a separate "trial"
// instance with the same vocabulary, so a spec that fails or runs away while compiling does so
// here. Runs inside the compile worker (compile-worker.ts) and, as the fallback, on the calling
// thread (without the trial compile there, which would only double the blocking).
//
// Each trial compile runs in a fresh instance (loaded ahead, while idle) that is dropped after
// it, for two reasons: the compiled grammar's size is measured only in a heap nothing else has
// used (its holes filled, the allocator's top before and after, less the holes the compile left:
// xgrammar-runtime.ts heapTop, fillHoles), and a heap never shrinks, so only dropping the
// instance gives its memory back. The trial heap is capped
// at the measured start plus `trialMaxBytes`: a grammar that needs more is refused while it
// compiles, before it can take the process's memory. The validator is replaced once its heap
// grew past VALIDATOR_HEAP_BYTES, for the same reason.
import { performance } from 'node:perf_hooks';
import { HEAP_PROBE_BYTES, loadXGrammarInstance, XGrammarError, type XgCompiler, type XgInstance, type XgTokenizerInfo } from './xgrammar-runtime.ts';
import { checkIn, compilePrepared, GrammarSpecError, prepareSpec, type Prepared } from './prepare.ts';
import { DEFAULT_GRAMMAR_LIMITS, type GrammarLimits } from './precheck.ts';
import { describeGrammar, type GrammarSpec } from './spec.ts';
import type { GrammarVocab } from './vocab.ts';

/** a validator whose heap grew past this is replaced after the check (a fresh one takes ~16 MiB) */
export const VALIDATOR_HEAP_BYTES = 128 * 2 ** 20;
/** the smallest hole a trial instance fills before measuring (what is left below it goes unmeasured) */
const HOLE_BYTES = 1024;
/** a validator's heap cap: converting one spec may not take more */
const VALIDATOR_MAX_HEAP_BYTES = 512 * 2 ** 20;

/** The vocabulary's data (GrammarVocab without its functions): what a worker is started with. */
export type VocabData = Pick<GrammarVocab, 'tokens' | 'vocabType' | 'prependSpace' | 'vocabSize' | 'stopTokenIds'>;

export function vocabData(v: GrammarVocab): VocabData {
  return { tokens: v.tokens, vocabType: v.vocabType, prependSpace: v.prependSpace, vocabSize: v.vocabSize, stopTokenIds: v.stopTokenIds };
}

/** An instance with the vocabulary indexed and a compiler over it. */
export interface CompilerState {
  inst: XgInstance;
  info: XgTokenizerInfo;
  compiler: XgCompiler;
}

/** Loads a fresh instance and indexes the vocabulary in it (~30 ms plus ~0.5 us per token). */
export async function newCompilerState(vocab: VocabData): Promise<CompilerState> {
  const inst = await loadXGrammarInstance();
  return inst.call((b) => {
    const tokens = b.vecStringFromJSArray(vocab.tokens);
    const stops = b.vecIntFromJSArray(vocab.stopTokenIds);
    try {
      const info = new b.TokenizerInfo(tokens, vocab.vocabType.toUpperCase(), vocab.vocabSize, stops, vocab.prependSpace);
      // our own cache (bounded, freed) instead of xgrammar's unbounded one
      const compiler = new b.GrammarCompiler(info, 1, false);
      return { inst, info, compiler };
    } finally {
      tokens.delete();
      stops.delete();
    }
  });
}

/** Frees what a compiler state holds in its instance (the instance itself goes with its last reference). */
export function freeCompilerState(state: CompilerState): void {
  if (state.inst.broken) return;
  state.compiler.delete();
  state.info.delete();
}

export interface CheckResult {
  prepared: Prepared;
  /** milliseconds the trial compile took (absent without one) */
  trialMs?: number;
  /** bytes the compiled grammar took in the trial instance's heap (absent without a trial compile) */
  trialBytes?: number;
}

export interface SpecCheckerOptions {
  limits?: Readonly<GrammarLimits>;
  /** the most heap bytes a trial-compiled grammar may take (default: no cap but the build's) */
  trialMaxBytes?: number;
}

/** The checking side of a GrammarCompiler: in a worker thread, or on the calling thread. */
export interface SpecCheck {
  /** Throws GrammarSpecError (the compiler's message) for an invalid spec. */
  check(spec: GrammarSpec, trial: boolean): Promise<CheckResult>;
  warm(): Promise<void>;
  close(): Promise<void>;
}

export class SpecChecker implements SpecCheck {
  private validator?: Promise<XgInstance>;
  /** the fresh instance the next trial compile takes */
  private spare?: Promise<CompilerState>;
  private readonly limits: Readonly<GrammarLimits>;
  private readonly trialMaxBytes?: number;

  /** `vocab`: what trial compiles index (none: no trial compiles) */
  constructor(
    private readonly vocab?: VocabData,
    opts: SpecCheckerOptions = {},
  ) {
    this.limits = opts.limits ?? DEFAULT_GRAMMAR_LIMITS;
    this.trialMaxBytes = opts.trialMaxBytes;
  }

  async warm(): Promise<void> {
    await Promise.all([this.validatorInstance(), ...(this.vocab ? [this.spareState()] : [])]);
  }

  async check(spec: GrammarSpec, trial: boolean): Promise<CheckResult> {
    const v = await this.validatorInstance();
    let prepared: Prepared;
    try {
      prepared = prepareSpec(spec, checkIn(v, spec), this.limits);
    } finally {
      // replaced on next use: after an abort, or once its heap grew (it never shrinks)
      if (v.broken || v.heapBytes() > VALIDATOR_HEAP_BYTES) this.validator = undefined;
    }
    if (!trial || !this.vocab) return { prepared };
    const t = await this.spareState();
    this.spare = undefined;
    try {
      return { prepared, ...this.trialCompile(t, spec, prepared) };
    } finally {
      freeCompilerState(t);
      void this.spareState().catch(() => {}); // loaded while idle, for the next one
    }
  }

  /** Compiles `prepared` in the fresh instance `t`: its size, and whether any token can start it. */
  private trialCompile(t: CompilerState, spec: GrammarSpec, prepared: Prepared): { trialMs: number; trialBytes: number } {
    const what = describeGrammar(spec);
    const inst = t.inst;
    inst.fillHoles(HOLE_BYTES); // what the vocabulary's indexing freed would hide small grammars from heapTop
    const top0 = inst.heapTop() ?? inst.heapBytes();
    const max = this.trialMaxBytes;
    // room for the grammar, and for the probe that measures it
    if (max !== undefined) inst.setMaxHeapBytes(inst.heapBytes() + max + HEAP_PROBE_BYTES);
    const tooBig = (bytes?: number) =>
      new GrammarSpecError(`${what} is too large: its compiled grammar needs ${bytes === undefined ? 'more than ' : ''}` +
        `${mib(bytes ?? max!)} MiB, more than the grammar cache holds (${mib(max!)} MiB)`);
    const t0 = performance.now();
    let compiled;
    try {
      compiled = compilePrepared(inst, t.compiler, prepared);
    } catch (err) {
      if (err instanceof XGrammarError && err.outOfMemory && max !== undefined) throw tooBig();
      if (err instanceof XGrammarError) throw new GrammarSpecError(`invalid ${what}: ${err.message}`);
      throw err;
    }
    const trialMs = performance.now() - t0;
    try {
      const top1 = inst.heapTop();
      // what the compile freed below its last allocation is not the grammar's: filled and subtracted;
      // a probe that did not fit means the grammar took (nearly) all the room the cap left
      const trialBytes = top1 === undefined ? inst.heapBytes() - top0 : Math.max(0, top1 - top0 - inst.fillHoles(HOLE_BYTES));
      if (max !== undefined && trialBytes > max) throw tooBig(trialBytes);
      if (!startsWithAToken(inst, compiled, this.vocab!.vocabSize))
        throw new GrammarSpecError(`invalid ${what}: no token of the vocabulary can start its output`);
      return { trialMs, trialBytes };
    } finally {
      if (!inst.broken) compiled.delete();
    }
  }

  async close(): Promise<void> {
    this.validator = undefined;
    this.spare = undefined;
  }

  private validatorInstance(): Promise<XgInstance> {
    this.validator ??= loadXGrammarInstance({ maxHeapBytes: VALIDATOR_MAX_HEAP_BYTES });
    const p = this.validator;
    p.catch(() => {
      if (this.validator === p) this.validator = undefined;
    });
    return p;
  }

  private spareState(): Promise<CompilerState> {
    this.spare ??= newCompilerState(this.vocab!);
    const p = this.spare;
    p.catch(() => {
      if (this.spare === p) this.spare = undefined;
    });
    return p;
  }
}

const mib = (bytes: number): string => (bytes / 2 ** 20).toFixed(1);

/** whether a fresh matcher of `compiled` allows any token at all (stop tokens included) */
function startsWithAToken(inst: XgInstance, compiled: import('./xgrammar-runtime.ts').XgCompiledGrammar, vocabSize: number): boolean {
  return inst.call((b) => {
    const m = new b.GrammarMatcher(compiled, undefined, false, -1);
    try {
      const v = m.GetNextTokenBitmask(vocabSize);
      try {
        const words = b.vecIntToView(v);
        const n = Math.min(words.length, (vocabSize + 31) >>> 5);
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
