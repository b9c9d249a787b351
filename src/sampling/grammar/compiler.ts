// Grammar compilation, one compiler per tokenizer, with a cache keyed by the spec's content hash.
//
// Two xgrammar instances (see xgrammar-runtime.ts for why): the *validator* parses every new spec
// first (and turns JSON schemas inside structural tags into compact EBNF); a bad schema, regex or
// grammar aborts only that instance, which is thrown away and replaced, and the compiler's message
// becomes a GrammarSpecError (the server's 400). Only specs that parsed reach the *main* instance,
// which compiles them against the vocabulary and holds every live matcher. Should the main instance
// fail anyway, it is replaced too: rows still matching on it end with a GrammarRowError, later
// requests get a fresh instance.
//
// JSON is compact and on one line (separators ", " and ": "): grammars that allow any whitespace
// let small models loop on blank space, and a fixed layout gives jump-forward longer spans.
//
// Compilation runs on the event loop (xgrammar's binding is synchronous): tens of milliseconds for
// a typical schema, once per distinct spec thanks to the cache.

import { performance } from 'node:perf_hooks';
import { loadXGrammarInstance, XGrammarError, type XgCompiledGrammar, type XgCompiler, type XgInstance, type XgTokenizerInfo } from './xgrammar-runtime.ts';
import { RowGrammar } from './matcher.ts';
import { describeGrammar, grammarKey, type GrammarSpec, type StructuralFormat } from './spec.ts';
import type { GrammarVocab } from './vocab.ts';
import { Utf8Guard } from './utf8.ts';

/** The request's schema, regex or grammar is invalid; `message` is the compiler's. */
export class GrammarSpecError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'GrammarSpecError';
  }
}

export interface GrammarCompilerOptions {
  /** compiled grammars kept (least recently used ones are freed); default 64 */
  cacheSize?: number;
}

export interface GrammarCompilerStats {
  compiles: number;
  cacheHits: number;
  /** spec rejected as invalid */
  invalid: number;
  /** milliseconds the last compile took (validation included) */
  lastCompileMs: number;
}

/** What the main instance compiles, once the validator accepted the spec. */
type Prepared =
  | { kind: 'ebnf'; grammar: string; root: string }
  | { kind: 'structural_tag'; json: string };

interface MainState {
  inst: XgInstance;
  info: XgTokenizerInfo;
  compiler: XgCompiler;
}

interface Entry {
  key: string;
  handle: XgCompiledGrammar;
  /** the main instance the handle lives in */
  main: MainState;
  compileMs: number;
}

const JSON_OBJECT_SCHEMA = '{"type": "object"}';

/** A compiled grammar, ready to start matchers; `release()` when no more rows will be started. */
export class CompiledGrammar {
  private released = false;

  constructor(
    private readonly handle: XgCompiledGrammar,
    private readonly main: MainState,
    private readonly vocab: GrammarVocab,
    private readonly utf8: Utf8Guard,
    readonly key: string,
    /** 0 when it came from the cache */
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

export class GrammarCompiler {
  readonly stats: GrammarCompilerStats = { compiles: 0, cacheHits: 0, invalid: 0, lastCompileMs: 0 };
  private main?: Promise<MainState>;
  /** what `main` resolved to */
  private current?: MainState;
  private validator?: Promise<XgInstance>;
  private readonly cache = new Map<string, Entry>();
  private readonly cacheSize: number;
  /** serialises compiles: the binding is synchronous, and one at a time keeps the cache simple */
  private queue: Promise<unknown> = Promise.resolve();
  private readonly utf8: Utf8Guard;

  constructor(
    readonly vocab: GrammarVocab,
    opts: GrammarCompilerOptions = {},
  ) {
    this.cacheSize = Math.max(1, opts.cacheSize ?? 64);
    this.utf8 = new Utf8Guard(vocab);
  }

  /** Loads both instances now (otherwise the first compile does). */
  async warm(): Promise<void> {
    await Promise.all([this.mainState(), this.validatorInstance()]);
  }

  /**
   * Only checks a JSON schema (no compilation): a GrammarSpecError names what is wrong. Lets a
   * caller blame one schema of many (a tool's parameters) before compiling them together.
   */
  checkJsonSchema(schema: unknown): Promise<void> {
    const run = this.queue.then(async () => {
      await this.prepare({ type: 'json_schema', schema });
    });
    this.queue = run.catch(() => {});
    return run;
  }

  /** Compiles (or finds in the cache) `spec`; throws GrammarSpecError for an invalid one. */
  compile(spec: GrammarSpec): Promise<CompiledGrammar> {
    const run = this.queue.then(() => this.compileNow(spec));
    this.queue = run.catch(() => {});
    return run;
  }

  private async compileNow(spec: GrammarSpec): Promise<CompiledGrammar> {
    const key = grammarKey(spec);
    let main = await this.mainState();
    if (main.inst.broken) {
      this.dropMain(main);
      main = await this.mainState();
    }
    const hit = this.cache.get(key);
    if (hit && hit.main === main) {
      this.cache.delete(key); // LRU: re-insert as the newest
      this.cache.set(key, hit);
      this.stats.cacheHits++;
      return new CompiledGrammar(hit.handle.clone(), main, this.vocab, this.utf8, key, 0);
    }
    const t0 = performance.now();
    const prepared = await this.prepare(spec);
    let handle: XgCompiledGrammar;
    try {
      handle = main.inst.call((b) => {
        switch (prepared.kind) {
          case 'ebnf': {
            const g = new b.Grammar.FromEBNF(prepared.grammar, prepared.root);
            try {
              return main.compiler.CompileGrammar(g);
            } finally {
              g.delete();
            }
          }
          case 'structural_tag':
            return main.compiler.CompileStructuralTag(prepared.json);
        }
      });
    } catch (err) {
      if (main.inst.broken) this.dropMain(main);
      if (err instanceof XGrammarError) {
        this.stats.invalid++;
        throw new GrammarSpecError(`invalid ${describeGrammar(spec)}: ${err.message}`);
      }
      throw err;
    }
    const compileMs = performance.now() - t0;
    this.stats.compiles++;
    this.stats.lastCompileMs = compileMs;
    this.cache.set(key, { key, handle, main, compileMs });
    while (this.cache.size > this.cacheSize) {
      const [oldKey, old] = this.cache.entries().next().value as [string, Entry];
      this.cache.delete(oldKey);
      if (!old.main.inst.broken) old.handle.delete(); // matchers and leases hold their own references
    }
    return new CompiledGrammar(handle.clone(), main, this.vocab, this.utf8, key, compileMs);
  }

  /** Checks the spec in the validator instance and produces what the main instance compiles. */
  private async prepare(spec: GrammarSpec): Promise<Prepared> {
    const what = describeGrammar(spec);
    const invalid = (message: string): never => {
      this.stats.invalid++;
      throw new GrammarSpecError(`invalid ${what}: ${message}`);
    };
    const v = await this.validatorInstance();
    const check = <T>(fn: Parameters<XgInstance['call']>[0]): T => {
      try {
        return v.call(fn) as T;
      } catch (err) {
        if (v.broken) this.validator = undefined; // replaced on next use
        if (err instanceof XGrammarError) return invalid(err.message);
        throw err;
      }
    };
    /** compact JSON for a schema, as EBNF (see jsonSchemaEbnf) */
    const jsonEbnf = (schema: string, strict: boolean): string => check<string>((b) => {
      const g = new b.Grammar.FromJSONSchema(schema, false, undefined, undefined, strict, undefined, false);
      try {
        return fixStringRules(g.ToString());
      } finally {
        g.delete();
      }
    });
    switch (spec.type) {
      case 'json_object':
        return { kind: 'ebnf', grammar: jsonEbnf(JSON_OBJECT_SCHEMA, false), root: 'root' };
      case 'json_schema':
        return { kind: 'ebnf', grammar: jsonEbnf(schemaText(spec.schema, invalid), true), root: 'root' };
      case 'ebnf': {
        if (typeof spec.grammar !== 'string' || spec.grammar.trim() === '') invalid('the grammar is empty');
        const root = spec.root ?? 'root';
        check((b) => new b.Grammar.FromEBNF(spec.grammar, root).delete());
        return { kind: 'ebnf', grammar: spec.grammar, root };
      }
      case 'regex': {
        if (typeof spec.pattern !== 'string' || spec.pattern === '') invalid('the pattern is empty');
        const json = JSON.stringify({ type: 'structural_tag', format: { type: 'regex', pattern: spec.pattern } });
        check((b) => b.Grammar.FromStructuralTag(json).delete());
        return { kind: 'structural_tag', json };
      }
      case 'choice': {
        if (!Array.isArray(spec.choices) || spec.choices.length === 0) invalid('the list of choices is empty');
        if (spec.choices.some((c) => typeof c !== 'string' || c === '')) invalid('every choice must be a non-empty string');
        const elements = [...new Set(spec.choices)].map((value) => ({ type: 'const_string', value }));
        const format = elements.length === 1 ? elements[0] : { type: 'or', elements };
        const json = JSON.stringify({ type: 'structural_tag', format });
        check((b) => b.Grammar.FromStructuralTag(json).delete());
        return { kind: 'structural_tag', json };
      }
      case 'structural_tag': {
        const format = compactJsonNodes(spec.format, (schema) => jsonEbnf(schemaText(schema, invalid), true));
        const json = JSON.stringify({ type: 'structural_tag', format });
        check((b) => b.Grammar.FromStructuralTag(json).delete());
        return { kind: 'structural_tag', json };
      }
    }
  }

  private mainState(): Promise<MainState> {
    this.main ??= (async () => {
      const inst = await loadXGrammarInstance();
      const vocab = this.vocab;
      return inst.call((b) => {
        const tokens = b.vecStringFromJSArray(vocab.tokens);
        const stops = b.vecIntFromJSArray(vocab.stopTokenIds);
        try {
          const info = new b.TokenizerInfo(tokens, vocab.vocabType.toUpperCase(), vocab.vocabSize, stops, vocab.prependSpace);
          // our own cache (bounded, freed) instead of xgrammar's unbounded one
          const compiler = new b.GrammarCompiler(info, 1, false);
          const state: MainState = { inst, info, compiler };
          this.current = state;
          return state;
        } finally {
          tokens.delete();
          stops.delete();
        }
      });
    })();
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
    for (const [k, e] of this.cache) if (e.main === main) this.cache.delete(k);
  }

  private validatorInstance(): Promise<XgInstance> {
    this.validator ??= loadXGrammarInstance();
    const p = this.validator;
    p.catch(() => {
      if (this.validator === p) this.validator = undefined;
    });
    return p;
  }
}

/**
 * xgrammar 0.1.27 writes length-limited strings (minLength/maxLength) with the character class
 * [^"\\\r\n], which lets raw control characters (U+0000-U+001F) into a JSON string, where
 * JSON.parse rejects them; its unlimited strings exclude them. Same exclusion here.
 */
export function fixStringRules(ebnf: string): string {
  return ebnf.split('[^\\"\\\\\\r\\n]').join('[^\\0-\\x1f\\"\\\\\\r\\n]');
}

/** A schema as xgrammar takes it: JSON text of an object or a boolean. */
function schemaText(schema: unknown, invalid: (m: string) => never): string {
  if (typeof schema === 'boolean') return JSON.stringify(schema);
  if (schema === null || typeof schema !== 'object' || Array.isArray(schema)) return invalid('the schema must be a JSON object');
  return JSON.stringify(schema);
}

/** Replaces every {type: "json_schema", json_schema} node with {type: "grammar", grammar: EBNF}. */
function compactJsonNodes(node: unknown, toEbnf: (schema: unknown) => string): unknown {
  if (Array.isArray(node)) return node.map((n) => compactJsonNodes(n, toEbnf));
  if (node === null || typeof node !== 'object') return node;
  const obj = node as StructuralFormat;
  if (obj.type === 'json_schema' && 'json_schema' in obj) return { type: 'grammar', grammar: toEbnf(obj.json_schema) };
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(obj)) out[k] = compactJsonNodes(v, toEbnf);
  return out;
}
