// Checks a spec before the compiler that holds live matchers ever sees it: parses it in a
// throwaway validator instance (a bad spec aborts the instance that parses it, which is then
// replaced), prepares what gets compiled, and optionally compiles it once in a separate "trial"
// instance with the same vocabulary, so a spec that fails or runs away while compiling does so
// here. Runs inside the compile worker (compile-worker.ts) and, as the fallback, on the calling
// thread (without the trial compile there, which would only double the blocking).

import { performance } from 'node:perf_hooks';
import { loadXGrammarInstance, XGrammarError, type XgCompiler, type XgInstance, type XgTokenizerInfo } from './xgrammar-runtime.ts';
import { checkIn, compilePrepared, GrammarSpecError, prepareSpec, type Prepared } from './prepare.ts';
import { describeGrammar, type GrammarSpec } from './spec.ts';
import type { GrammarVocab } from './vocab.ts';

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

/** Loads a fresh instance and indexes the vocabulary in it (~50 ms plus ~0.5 us per token). */
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

export interface CheckResult {
  prepared: Prepared;
  /** milliseconds the trial compile took (absent without one) */
  trialMs?: number;
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
  private trial?: Promise<CompilerState>;

  /** `vocab`: what trial compiles index (none: no trial compiles) */
  constructor(private readonly vocab?: VocabData) {}

  async warm(): Promise<void> {
    await Promise.all([this.validatorInstance(), ...(this.vocab ? [this.trialState()] : [])]);
  }

  async check(spec: GrammarSpec, trial: boolean): Promise<CheckResult> {
    const v = await this.validatorInstance();
    let prepared: Prepared;
    try {
      prepared = prepareSpec(spec, checkIn(v, spec));
    } finally {
      if (v.broken) this.validator = undefined; // replaced on next use
    }
    if (!trial || !this.vocab) return { prepared };
    const t = await this.trialState();
    const t0 = performance.now();
    try {
      compilePrepared(t.inst, t.compiler, prepared).delete();
    } catch (err) {
      if (t.inst.broken) this.trial = undefined;
      if (err instanceof XGrammarError) throw new GrammarSpecError(`invalid ${describeGrammar(spec)}: ${err.message}`);
      throw err;
    }
    return { prepared, trialMs: performance.now() - t0 };
  }

  async close(): Promise<void> {
    this.validator = undefined;
    this.trial = undefined;
  }

  private validatorInstance(): Promise<XgInstance> {
    this.validator ??= loadXGrammarInstance();
    const p = this.validator;
    p.catch(() => {
      if (this.validator === p) this.validator = undefined;
    });
    return p;
  }

  private trialState(): Promise<CompilerState> {
    this.trial ??= newCompilerState(this.vocab!);
    const p = this.trial;
    p.catch(() => {
      if (this.trial === p) this.trial = undefined;
    });
    return p;
  }
}
