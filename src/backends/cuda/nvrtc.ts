// Compiles one kernel module (kernels.ts) with NVRTC for one GPU architecture, caching the cubin on
// disk under the backend's CudaRuntimeSettings.cacheDir ($LLMTS_CACHE_DIR/cuda, $XDG_CACHE_HOME/llmts/cuda
// or ~/.cache/llmts/cuda), one file per module, `<module>-<key>.cubin` with key = sha256(source, arch, NVRTC version, options): a second
// start loads the cubin without compiling. A cache that cannot be written is no error (the compile
// result is used anyway); files appear by atomic rename, so a concurrent start never reads half one.
//
// Threads: nvrtcCompileProgram, the slow call (seconds), runs as a koffi asynchronous call on the
// libuv thread pool, so the Node event loop keeps running while modules compile; NVRTC is
// thread-safe for distinct programs, so modules compile concurrently. At most nvrtcJobs() compile at
// once (the pool also serves file reads, e.g. weight loading, which must not wait behind every
// compile). Everything else here is quick and runs on the calling (main) thread. No CUDA context is
// needed: loading the cubin (cuModuleLoadData) is runtime.ts's, on the main thread.
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { asyncStackBytes, loadNvrtc, NVRTC_ASYNC_STACK_BYTES, type Nvrtc, num, out64 } from './cuda-lib.ts';

/** What NVRTC compiles: a module's name (names the cache file) and its whole source. */
export interface ModuleSource {
  readonly name: string;
  readonly source: string;
}

export interface CompiledModule {
  /** the module's name */
  name: string;
  cubin: Uint8Array;
  /** where the cubin came from */
  source: 'cache' | 'nvrtc';
  cachePath: string;
  nvrtcVersion: string;
  /** time in nvrtcCompileProgram and around it (0 from the cache); excludes waiting for a job slot */
  compileMs: number;
}

/** Compiles (or finds cached) one module for `arch` ("sm_90"); runtime.ts's `deps.compile` has this shape. */
export type CompileModule = (mod: ModuleSource, arch: string) => Promise<CompiledModule>;

export function kernelCompileOptions(arch: string): string[] {
  return [`--gpu-architecture=${arch}`];
}

/** sha256(source, arch, NVRTC version, options), hex: the module's cache key. */
export function moduleCacheKey(source: string, arch: string, nvrtcVersion: string, options: readonly string[]): string {
  return createHash('sha256').update(source).update('\0').update(arch).update('\0').update(nvrtcVersion)
    .update('\0').update(options.join(' ')).digest('hex');
}

export function nvrtcVersionOf(nv: Nvrtc): string {
  const major = new Int32Array(1);
  const minor = new Int32Array(1);
  nv.nvrtcVersion(major, minor);
  return `${major[0]}.${minor[0]}`;
}

/**
 * How many compiles run at once: one thread of the libuv pool (UV_THREADPOOL_SIZE, 4 by default)
 * is left to file reads. Modules beyond it wait for a slot.
 */
export function nvrtcJobs(): number {
  const pool = Number(process.env.UV_THREADPOOL_SIZE);
  return Math.max(1, (Number.isInteger(pool) && pool > 0 ? Math.min(pool, 1024) : 4) - 1);
}

/**
 * 'async' when nvrtcCompileProgram can run on the thread pool; otherwise 'sync (why)': the compile
 * blocks the calling thread, as it always did. That happens only when koffi refused the larger
 * asynchronous stack (cuda-lib.ts: some library was loaded through koffi before cuda-lib.ts was
 * imported): NVRTC would overflow koffi's default one.
 */
export function nvrtcCompileMode(): string {
  const stack = asyncStackBytes();
  return stack >= NVRTC_ASYNC_STACK_BYTES ? 'async'
    : `sync (koffi's async stack is ${stack >> 10} KiB, NVRTC needs ${NVRTC_ASYNC_STACK_BYTES >> 10} KiB)`;
}

/** Runs at most `limit` tasks at once, the rest in call order. */
class JobSlots {
  private running = 0;
  private readonly queue: (() => void)[] = [];
  constructor(private readonly limit: () => number) {}

  async run<T>(task: () => Promise<T>): Promise<T> {
    if (this.running >= this.limit()) await new Promise<void>((r) => this.queue.push(r));
    else this.running++;
    try {
      return await task();
    } finally {
      const next = this.queue.shift();
      if (next) next(); // the slot passes straight on
      else this.running--;
    }
  }
}

const slots = new JobSlots(nvrtcJobs);

/** One entry per cache file: a module compiles once per process, however many runtimes ask. */
const memo = new Map<string, Promise<CompiledModule>>();

/** Forgets the in-process results (tests: the next call reads the disk cache or compiles). */
export function forgetCompiledModules(): void {
  memo.clear();
}

export interface CompileDeps {
  /** the NVRTC binding (default: libnvrtc through cuda-lib.ts) */
  nvrtc?: Nvrtc;
  /** where cubins are cached (CudaRuntimeSettings.cacheDir) */
  cacheDir: string;
  /** default nvrtcCompileMode() === 'async' */
  async?: boolean;
}

/**
 * Compiles `mod` for `arch`, or loads it from the disk cache. Rejects with NVRTC's error and log
 * (the caller adds the module's name).
 */
export function compileModule(mod: ModuleSource, arch: string, deps: CompileDeps): Promise<CompiledModule> {
  const nv = deps.nvrtc ?? loadNvrtc();
  const version = nvrtcVersionOf(nv);
  const options = kernelCompileOptions(arch);
  const dir = deps.cacheDir;
  const cachePath = join(dir, `${mod.name}-${moduleCacheKey(mod.source, arch, version, options)}.cubin`);
  let p = memo.get(cachePath);
  if (!p) {
    p = build(nv, mod, arch, version, options, dir, cachePath, deps.async ?? nvrtcCompileMode() === 'async');
    memo.set(cachePath, p);
    p.catch(() => memo.delete(cachePath)); // a failed compile is retried by the next caller
  }
  return p;
}

async function build(nv: Nvrtc, mod: ModuleSource, arch: string, version: string, options: string[], dir: string,
  cachePath: string, useAsync: boolean): Promise<CompiledModule> {
  try {
    const cubin = new Uint8Array(readFileSync(cachePath));
    if (cubin.length > 0) return { name: mod.name, cubin, source: 'cache', cachePath, nvrtcVersion: version, compileMs: 0 };
  } catch {
    // not cached yet
  }
  const { cubin, ms } = await slots.run(() => nvrtcCompile(nv, mod, arch, version, options, useAsync));
  try {
    mkdirSync(dir, { recursive: true });
    const tmp = `${cachePath}.${process.pid}.${Math.random().toString(36).slice(2)}.tmp`;
    writeFileSync(tmp, cubin);
    renameSync(tmp, cachePath); // atomic: a concurrent start never reads half a file
  } catch {
    // an unwritable cache only costs the next start a compile
  }
  return { name: mod.name, cubin, source: 'nvrtc', cachePath, nvrtcVersion: version, compileMs: ms };
}

async function nvrtcCompile(nv: Nvrtc, mod: ModuleSource, arch: string, version: string, options: string[],
  useAsync: boolean): Promise<{ cubin: Uint8Array; ms: number }> {
  const t0 = performance.now();
  const prog = out64();
  const rcCreate = nv.nvrtcCreateProgram(prog, mod.source, `llmts_${mod.name}.cu`, 0, null, null);
  if (rcCreate !== 0) throw new Error(`nvrtcCreateProgram failed: ${nv.nvrtcGetErrorString(rcCreate)}`);
  const h = num(prog);
  try {
    const rc = useAsync
      ? await new Promise<number>((resolve, reject) => {
        // runs on a libuv pool thread; `options` is copied into koffi's call memory before this returns
        nv.nvrtcCompileProgram.async(h, options.length, options, (err, res) => (err ? reject(err) : resolve(res)));
      })
      : nv.nvrtcCompileProgram(h, options.length, options);
    const logSize = out64();
    nv.nvrtcGetProgramLogSize(h, logSize);
    const logBuf = new Uint8Array(Math.max(1, num(logSize)));
    nv.nvrtcGetProgramLog(h, logBuf);
    const log = Buffer.from(logBuf).toString('utf8').replace(/\0+$/, '').trim();
    if (rc !== 0) {
      throw new Error(`compiling for ${arch} with NVRTC ${version} failed: ${nv.nvrtcGetErrorString(rc)}\n${log}`);
    }
    const size = out64();
    const rcSize = nv.nvrtcGetCUBINSize(h, size);
    if (rcSize !== 0 || num(size) === 0) {
      throw new Error(`NVRTC ${version} produced no cubin for ${arch}: ${nv.nvrtcGetErrorString(rcSize)}`);
    }
    const cubin = new Uint8Array(num(size));
    const rcGet = nv.nvrtcGetCUBIN(h, cubin);
    if (rcGet !== 0) throw new Error(`nvrtcGetCUBIN failed: ${nv.nvrtcGetErrorString(rcGet)}`);
    return { cubin, ms: performance.now() - t0 };
  } finally {
    nv.nvrtcDestroyProgram(prog); // after the compile: the await above has its result
  }
}
