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
//
// Memory: an instance's heap is one WebAssembly.Memory, which grows (up to 2 GiB) and never
// shrinks; freeing C++ objects only makes room inside it. So the heap is measured here
// (heapBytes, heapTop) and capped per instance (setMaxHeapBytes: a second patch, of the bundle's
// getHeapMax), and memory goes back to the system only when a whole instance is dropped. The
// wasm module is compiled once per thread and instantiated through emscripten's instantiateWasm
// hook, which is also how we reach the module's malloc and free (to find the heap's top).

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
  /** bytes of the instance's WebAssembly memory (what it takes from the process) */
  heapBytes(): number;
  /**
   * Where the allocator's unused top of the heap begins (bytes from the heap's start): a block
   * of HEAP_PROBE_BYTES is allocated and freed, so it lands past every smaller hole. The first
   * call grows the heap by up to that much. undefined when the probe cannot be allocated.
   */
  heapTop(): number | undefined;
  /**
   * Bytes in use below the heap's top: heapTop less the free holes under it of `minBytes` or
   * more (found by allocating them, then freed again, so the heap is left as it was). Two
   * readings around a compile give what the compiled grammar keeps, wherever the allocator put
   * it. undefined when the probe cannot be allocated.
   */
  heapUsed(minBytes: number): number | undefined;
  /** caps the heap's growth (bytes; at most 2 GiB): an allocation past it fails, and the call with it */
  setMaxHeapBytes(bytes: number): void;
  /** the current cap */
  readonly maxHeapBytes: number;
  /**
   * Runs `fn`; when the C++ side aborts, marks the instance broken and throws an
   * XGrammarError carrying the compiler's message.
   */
  call<T>(fn: (b: XgBinding) => T): T;
}

/** A failure reported by xgrammar's C++ code; `message` is the compiler's own text. */
export class XGrammarError extends Error {
  constructor(
    message: string,
    readonly aborted: boolean,
    /** the call failed because the instance's heap reached its cap (setMaxHeapBytes) */
    readonly outOfMemory = false,
  ) {
    super(message);
    this.name = 'XGrammarError';
  }
}

/** what emscripten's heap may grow to in this build (its getHeapMax) */
export const XG_HEAP_LIMIT = 2 ** 31;
/** the heapTop probe's size: larger than any hole a compile leaves behind */
export const HEAP_PROBE_BYTES = 32 * 2 ** 20;
/** heapUsed counts at most this many holes (the rest count as used) */
const MAX_HOLES = 200_000;

/** [from, to]: each `from` must occur exactly once in the bundle */
const PATCHES: [string, string][] = [
  ['binding = await Module();', 'binding = await Module(__moduleArg);'],
  [`var getHeapMax=()=>${XG_HEAP_LIMIT};`, `var getHeapMax=()=>__moduleArg.maxHeapBytes??${XG_HEAP_LIMIT};`],
  // remembers a growth the cap refused, so the abort that follows can say why
  ['var maxHeapSize=getHeapMax();if(requestedSize>maxHeapSize){return false}', 'var maxHeapSize=getHeapMax();if(requestedSize>maxHeapSize){__moduleArg.heapRefused=requestedSize;return false}'],
];

interface Bundle {
  file: string;
  code: string;
  /** the wasm module, compiled once per thread */
  wasm: WebAssembly.Module;
  /** the minified export names of the memory, malloc and free */
  exports: { memory: string; malloc: string; free: string };
}

let bundle: Bundle | undefined;

function bundleSource(): Bundle {
  if (bundle) return bundle;
  const file = require.resolve('@mlc-ai/web-xgrammar');
  let code = fs.readFileSync(file, 'utf8');
  const unexpected = () => new Error(`${file}: unexpected @mlc-ai/web-xgrammar build (expected version 0.1.27); cannot load it`);
  for (const [from, to] of PATCHES) {
    if (code.split(from).length !== 2) throw unexpected();
    code = code.replace(from, to);
  }
  const wasm64 = /wasmBinaryFile="data:application\/octet-stream;base64,([A-Za-z0-9+/=]+)"/.exec(code)?.[1];
  const memory = /wasmMemory=wasmExports\["(\w+)"\]/.exec(code)?.[1];
  const malloc = /var _malloc=a0=>\(_malloc=wasmExports\["(\w+)"\]\)\(a0\)/.exec(code)?.[1];
  const free = /var _free=a0=>\(_free=wasmExports\["(\w+)"\]\)\(a0\)/.exec(code)?.[1];
  if (!wasm64 || !memory || !malloc || !free) throw unexpected();
  bundle = { file, code, wasm: new WebAssembly.Module(Buffer.from(wasm64, 'base64')), exports: { memory, malloc, free } };
  return bundle;
}

/** "[FATAL] /path/json_schema_converter.cc:885: Check failed: (...) is false: Type should be a string" -> the message */
export function cleanCompilerMessage(line: string): string {
  let m = line.replace(/^\s*\[FATAL\]\s*/, '').replace(/^\S+\.(?:cc|h|cpp):\d+:\s*/, '');
  m = m.replace(/^Check failed: \(.*?\) is false:\s*/, '');
  return m.trim();
}

/**
 * Evaluates a fresh copy of the bundle: a new, independent WASM instance (~30 ms; the module is
 * compiled once). `maxHeapBytes` caps its heap from the start (default: the build's 2 GiB).
 */
export async function loadXGrammarInstance(opts: { maxHeapBytes?: number } = {}): Promise<XgInstance> {
  const { file, code, wasm, exports: names } = bundleSource();
  const stderr: string[] = [];
  let wasmExports: WebAssembly.Exports | undefined;
  const moduleArg: Record<string, unknown> = {
    print: () => {},
    printErr: (line: string) => {
      stderr.push(String(line));
      if (stderr.length > 64) stderr.shift();
    },
    maxHeapBytes: heapCap(opts.maxHeapBytes ?? XG_HEAP_LIMIT),
    // emscripten's hook: instantiate our compiled module, keep its exports
    instantiateWasm(imports: WebAssembly.Imports, receive: (instance: WebAssembly.Instance, module: WebAssembly.Module) => unknown) {
      void WebAssembly.instantiate(wasm, imports).then((instance) => {
        wasmExports = instance.exports;
        receive(instance, wasm);
      });
      return {};
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
  if (typeof binding.GrammarMatcher !== 'function' || !wasmExports) throw new Error('@mlc-ai/web-xgrammar did not initialise its binding');
  const memory = wasmExports[names.memory] as WebAssembly.Memory;
  const malloc = wasmExports[names.malloc] as (n: number) => number;
  const free = wasmExports[names.free] as (p: number) => void;
  const inst: XgInstance = {
    binding,
    broken: false,
    heapBytes: () => memory.buffer.byteLength,
    heapTop(): number | undefined {
      if (inst.broken) return undefined;
      const p = malloc(HEAP_PROBE_BYTES) >>> 0;
      if (p === 0) return undefined;
      free(p);
      return p;
    },
    heapUsed(minBytes: number): number | undefined {
      const top = inst.heapTop();
      if (top === undefined) return undefined;
      const holes: number[] = [];
      let holeBytes = 0;
      try {
        for (let size = HEAP_PROBE_BYTES / 2; size >= minBytes && holes.length < MAX_HOLES; size /= 2) {
          while (holes.length < MAX_HOLES) {
            const p = malloc(size) >>> 0;
            if (p === 0) break;
            // from the top (not a hole): given back, and the next smaller size is tried
            if (p >= top) {
              free(p);
              break;
            }
            holes.push(p);
            holeBytes += size;
          }
        }
      } finally {
        for (const p of holes) free(p);
      }
      return top - holeBytes;
    },
    setMaxHeapBytes(bytes: number): void {
      moduleArg.maxHeapBytes = heapCap(bytes);
    },
    get maxHeapBytes(): number {
      return moduleArg.maxHeapBytes as number;
    },
    call<T>(fn: (b: XgBinding) => T): T {
      if (inst.broken) throw new XGrammarError('the grammar engine instance failed earlier', true);
      stderr.length = 0;
      moduleArg.heapRefused = 0;
      try {
        return fn(binding);
      } catch (err) {
        const fatal = stderr.find((l) => l.includes('[FATAL]')) ?? stderr.find((l) => !/^Aborted\(/.test(l));
        const aborted = err instanceof WebAssembly.RuntimeError || /Aborted\(/.test(String((err as Error)?.message ?? err));
        if (aborted) inst.broken = true;
        // an allocation the heap's cap refused (emscripten then aborts without a message)
        if (moduleArg.heapRefused) {
          inst.broken = true;
          throw new XGrammarError(`the grammar engine's memory cap (${Math.round((moduleArg.maxHeapBytes as number) / 2 ** 20)} MiB) was reached`, true, true);
        }
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

/** a heap cap: whole 64 KiB pages, at most the build's limit */
function heapCap(bytes: number): number {
  return Math.min(XG_HEAP_LIMIT, Math.max(2 ** 16, Math.floor(bytes / 2 ** 16) * 2 ** 16));
}
