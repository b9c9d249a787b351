// Loads @mlc-ai/web-xgrammar (0.1.27, pinned) and exposes the raw embind binding it wraps.
//
// Why not `import`: the package says ESM but its file is a UMD bundle that calls `require`, so
// Node refuses it. We evaluate lib/index.js as CommonJS (module, exports, require, __filename,
// __dirname in scope), patched at one place so the emscripten module gets our `printErr`: the C++
// side reports a bad schema/regex/grammar only on stderr ("[FATAL] file:line: message") and then
// aborts. An abort leaves that WASM instance corrupted (measured: a later matcher call reads out
// of bounds), so every evaluation here is a separate instance, and callers keep failing inputs
// away from the instance that holds live matchers (see compiler.ts).
//
// The wrapper's own classes are async only because they await the binding's initialisation; the
// binding itself is synchronous, which is what a per-step sampler needs, so we call it directly.

import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);

/** The embind objects we use (a C++ object must be `delete()`d). */
export interface XgHandle {
  delete(): void;
  isDeleted(): boolean;
  clone(): this;
}
export interface XgVectorInt extends XgHandle {
  size(): number;
  get(i: number): number;
}
export interface XgGrammar extends XgHandle {
  ToString(): string;
}
export interface XgCompiledGrammar extends XgHandle {}
export interface XgTokenizerInfo extends XgHandle {
  GetVocabSize(): number;
}
export interface XgCompiler extends XgHandle {
  CompileJSONSchema(schema: string, anyWhitespace: boolean, indent: number | undefined, separators: { first: string; second: string } | undefined, strict: boolean, maxWhitespace: number | undefined): XgCompiledGrammar;
  CompileBuiltinJSONGrammar(): XgCompiledGrammar;
  CompileGrammar(grammar: XgGrammar): XgCompiledGrammar;
  CompileStructuralTag(json: string): XgCompiledGrammar;
}
export interface XgMatcher extends XgHandle {
  AcceptToken(id: number, verbose: boolean): boolean;
  GetNextTokenBitmask(vocabSize: number): XgVectorInt;
  IsTerminated(): boolean;
  Reset(): void;
  FindJumpForwardString(): string;
  Rollback(n: number): void;
}
export interface XgBinding {
  vecStringFromJSArray(a: string[]): XgHandle;
  vecIntFromJSArray(a: number[]): XgVectorInt;
  vecIntToView(v: XgVectorInt): Int32Array;
  TokenizerInfo: new (vocab: XgHandle, vocabType: string, vocabSize: number | undefined, stopIds: XgVectorInt | undefined, prependSpace: boolean) => XgTokenizerInfo;
  GrammarCompiler: new (info: XgTokenizerInfo, maxThreads: number, cache: boolean) => XgCompiler;
  GrammarMatcher: new (compiled: XgCompiledGrammar, stopIds: XgVectorInt | undefined, terminateWithoutStop: boolean, maxRollback: number) => XgMatcher;
  Grammar: {
    FromEBNF: new (ebnf: string, root: string) => XgGrammar;
    FromJSONSchema: new (schema: string, anyWhitespace: boolean, indent: number | undefined, separators: { first: string; second: string } | undefined, strict: boolean, maxWhitespace: number | undefined, print: boolean) => XgGrammar;
    FromStructuralTag(json: string): XgGrammar;
  };
}

/** One WASM instance of xgrammar and the stderr lines it wrote. */
export interface XgInstance {
  readonly binding: XgBinding;
  /** true once a call aborted: the instance must not be used again */
  broken: boolean;
  /**
   * Runs `fn`; when the C++ side aborts, marks the instance broken and throws an
   * XGrammarError carrying the compiler's message.
   */
  call<T>(fn: (b: XgBinding) => T): T;
}

/** A failure reported by xgrammar's C++ code; `message` is the compiler's own text. */
export class XGrammarError extends Error {
  constructor(message: string, readonly aborted: boolean) {
    super(message);
    this.name = 'XGrammarError';
  }
}

const PATCH_FROM = 'binding = await Module();';
const PATCH_TO = 'binding = await Module(__moduleArg);';

let source: { file: string; code: string } | undefined;

function bundleSource(): { file: string; code: string } {
  if (source) return source;
  const file = require.resolve('@mlc-ai/web-xgrammar');
  const code = fs.readFileSync(file, 'utf8');
  if (code.split(PATCH_FROM).length !== 2)
    throw new Error(`${file}: unexpected @mlc-ai/web-xgrammar build (expected version 0.1.27); cannot load it`);
  source = { file, code: code.replace(PATCH_FROM, PATCH_TO) };
  return source;
}

/** "[FATAL] /path/json_schema_converter.cc:885: Check failed: (...) is false: Type should be a string" -> the message */
export function cleanCompilerMessage(line: string): string {
  let m = line.replace(/^\s*\[FATAL\]\s*/, '').replace(/^\S+\.(?:cc|h|cpp):\d+:\s*/, '');
  m = m.replace(/^Check failed: \(.*?\) is false:\s*/, '');
  return m.trim();
}

/** Evaluates a fresh copy of the bundle: a new, independent WASM instance (~50 ms). */
export async function loadXGrammarInstance(): Promise<XgInstance> {
  const { file, code } = bundleSource();
  const stderr: string[] = [];
  const moduleArg: Record<string, unknown> = {
    print: () => {},
    printErr: (line: string) => {
      stderr.push(String(line));
      if (stderr.length > 64) stderr.shift();
    },
  };
  const mod: { exports: Record<string, any> } = { exports: {} };
  // eslint-disable-next-line @typescript-eslint/no-implied-eval
  const factory = new Function('module', 'exports', 'require', '__filename', '__dirname', '__moduleArg', code);
  factory(mod, mod.exports, require, file, path.dirname(file), moduleArg);
  // Any async entry point initialises the binding; emscripten then fills moduleArg with it.
  const g = await (mod.exports.Grammar as { builtinJSONGrammar(): Promise<{ dispose(): void }> }).builtinJSONGrammar();
  g.dispose();
  const binding = moduleArg as unknown as XgBinding;
  if (typeof binding.GrammarMatcher !== 'function') throw new Error('@mlc-ai/web-xgrammar did not initialise its binding');
  const inst: XgInstance = {
    binding,
    broken: false,
    call<T>(fn: (b: XgBinding) => T): T {
      if (inst.broken) throw new XGrammarError('the grammar engine instance failed earlier', true);
      stderr.length = 0;
      try {
        return fn(binding);
      } catch (err) {
        const fatal = stderr.find((l) => l.includes('[FATAL]')) ?? stderr.find((l) => !/^Aborted\(/.test(l));
        const aborted = err instanceof WebAssembly.RuntimeError || /Aborted\(/.test(String((err as Error)?.message ?? err));
        if (aborted) inst.broken = true;
        if (fatal) throw new XGrammarError(cleanCompilerMessage(fatal), aborted);
        if (err instanceof RangeError && /call stack/i.test(err.message)) {
          inst.broken = true;
          throw new XGrammarError('the grammar is nested too deeply', true);
        }
        throw new XGrammarError(err instanceof Error ? err.message : String(err), aborted);
      }
    },
  };
  return inst;
}
