// Checks a spec before any instance that serves matchers sees it: parses it in a throwaway
// validator instance (a bad spec aborts the instance that parses it, which is then replaced) and
// prepares what gets compiled (prepare.ts: plain strings, which cross threads as they are). Runs
// inside the check worker (compile-worker.ts) and, as the fallback, on the calling thread.
//
// The validator is replaced once its heap grew past VALIDATOR_HEAP_BYTES (a heap never shrinks:
// only dropping the instance gives its memory back) and is capped at VALIDATOR_MAX_HEAP_BYTES.
// Also here: loading an instance with the vocabulary indexed, what a grammar host serves from
// (grammar-host.ts).
import { loadXGrammarInstance, type XgCompiler, type XgInstance, type XgTokenizerInfo } from './xgrammar-runtime.ts';
import { checkIn, prepareSpec, type Prepared } from './prepare.ts';
import { DEFAULT_GRAMMAR_LIMITS, type GrammarLimits } from './precheck.ts';
import type { GrammarSpec } from './spec.ts';
import type { GrammarVocab } from './vocab.ts';

/** a validator whose heap grew past this is replaced after the check (a fresh one takes ~16 MiB) */
export const VALIDATOR_HEAP_BYTES = 128 * 2 ** 20;
/** a validator's heap cap: converting one spec may not take more */
const VALIDATOR_MAX_HEAP_BYTES = 512 * 2 ** 20;

/** The vocabulary's data (GrammarVocab without its functions): what a grammar host is started with. */
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
export async function newCompilerState(vocab: VocabData, opts: { maxHeapBytes?: number } = {}): Promise<CompilerState> {
  const inst = await loadXGrammarInstance(opts);
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
}

export interface SpecCheckerOptions {
  limits?: Readonly<GrammarLimits>;
}

/** The checking side of a GrammarCompiler: in the check worker, or on the calling thread. */
export interface SpecCheck {
  /** Throws GrammarSpecError (the compiler's message) for an invalid spec. */
  check(spec: GrammarSpec): Promise<CheckResult>;
  warm(): Promise<void>;
  close(): Promise<void>;
}

export class SpecChecker implements SpecCheck {
  private validator?: Promise<XgInstance>;
  private readonly limits: Readonly<GrammarLimits>;

  constructor(opts: SpecCheckerOptions = {}) {
    this.limits = opts.limits ?? DEFAULT_GRAMMAR_LIMITS;
  }

  async warm(): Promise<void> {
    await this.validatorInstance();
  }

  async check(spec: GrammarSpec): Promise<CheckResult> {
    const v = await this.validatorInstance();
    try {
      return { prepared: prepareSpec(spec, checkIn(v, spec), this.limits) };
    } finally {
      // replaced on next use: after an abort, or once its heap grew (it never shrinks)
      if (v.broken || v.heapBytes() > VALIDATOR_HEAP_BYTES) this.validator = undefined;
    }
  }

  async close(): Promise<void> {
    this.validator = undefined;
  }

  private validatorInstance(): Promise<XgInstance> {
    this.validator ??= loadXGrammarInstance({ maxHeapBytes: VALIDATOR_MAX_HEAP_BYTES });
    const p = this.validator;
    p.catch(() => {
      if (this.validator === p) this.validator = undefined;
    });
    return p;
  }
}
