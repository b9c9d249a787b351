// The CUDA driver API, NVRTC and cuBLASLt through koffi, located at run time (no compile step at
// install). Handles and device pointers cross the boundary as plain numbers (x86-64 addresses fit
// in 53 bits); out-parameters are one-element typed arrays.
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import koffi, { type LibraryHandle } from 'koffi';

export class CudaUnavailableError extends Error {}

/**
 * The koffi stack that an asynchronous call's native code runs on (koffi switches to its own stack
 * for every call: 2 MiB for synchronous calls, 128 KiB by default for asynchronous ones). NVRTC
 * compiles on an asynchronous call (nvrtc.ts) and needs far more than 128 KiB: NVRTC 11.8 compiling
 * the attention module crashed (SIGSEGV) with 64 KiB. 8 MiB is 4x what synchronous compiles have
 * always had; it is address space, touched only as deep as a call goes.
 */
export const NVRTC_ASYNC_STACK_BYTES = 8 * 1024 * 1024;
// koffi takes configuration only before its first library is loaded, so this runs when this module
// is imported (every koffi.load of the project is later, inside a function). When something loaded a
// library first, the setting is refused and nvrtc.ts compiles synchronously instead.
try {
  if ((koffi.config().async_stack_size ?? 0) < NVRTC_ASYNC_STACK_BYTES) koffi.config({ async_stack_size: NVRTC_ASYNC_STACK_BYTES });
} catch {
  // refused: see asyncStackBytes()
}

/** The stack koffi gives asynchronous calls in this process. */
export function asyncStackBytes(): number {
  return koffi.config().async_stack_size ?? 0;
}

/** A koffi function that can also run on the libuv thread pool: `f.async(...args, callback)`. */
export type AsyncCallable<F extends (...args: never[]) => unknown> = F & {
  async(...args: [...Parameters<F>, (err: unknown, result: ReturnType<F>) => void]): void;
};

/** Directories searched for libnvrtc / libcublasLt (and libcuda when the loader cannot find it). */
export function cudaLibraryDirs(): string[] {
  const dirs: string[] = [];
  for (const home of [process.env.CUDA_HOME, process.env.CUDA_PATH, '/usr/local/cuda']) {
    if (!home) continue;
    dirs.push(join(home, 'lib64'), join(home, 'targets/x86_64-linux/lib'), join(home, 'lib'));
  }
  for (const d of (process.env.LD_LIBRARY_PATH ?? '').split(':')) if (d) dirs.push(d);
  dirs.push('/usr/local/nvidia/lib64', '/usr/lib/x86_64-linux-gnu', '/usr/lib64', '/lib/x86_64-linux-gnu');
  return [...new Set(dirs)];
}

/** `lib<stem>.so[.N[.M...]]` files in `dirs`, highest version first (never a stub library). */
function candidates(stem: string, dirs: string[]): string[] {
  const re = new RegExp(`^lib${stem}\\.so((?:\\.\\d+)*)$`);
  const found: { path: string; version: number[] }[] = [];
  for (const dir of dirs) {
    if (dir.includes('/stubs') || !existsSync(dir)) continue;
    let names: string[];
    try {
      names = readdirSync(dir);
    } catch {
      continue;
    }
    for (const n of names) {
      const m = re.exec(n);
      if (m) found.push({ path: join(dir, n), version: m[1]!.split('.').filter(Boolean).map(Number) });
    }
  }
  const cmp = (a: number[], b: number[]) => {
    for (let i = 0; i < Math.max(a.length, b.length); i++) if ((a[i] ?? -1) !== (b[i] ?? -1)) return (b[i] ?? -1) - (a[i] ?? -1);
    return 0;
  };
  return found.sort((a, b) => cmp(a.version, b.version)).map((f) => f.path);
}

/** Loads the first library that loads: bare loader names first, then files found in `dirs`. */
function loadFirst(what: string, loaderNames: string[], stem: string, hint: string): { lib: LibraryHandle; path: string } {
  const tried: string[] = [];
  for (const p of [...loaderNames, ...candidates(stem, cudaLibraryDirs())]) {
    try {
      return { lib: koffi.load(p), path: p };
    } catch (e) {
      tried.push(`${p}: ${(e as Error).message.split('\n')[0]}`);
    }
  }
  throw new CudaUnavailableError(`${what} could not be loaded (${hint}; tried ${tried.length ? tried.join('; ') : 'nothing'})`);
}

type P = number; // an address or opaque handle

export interface Driver {
  path: string;
  cuInit(flags: number): number;
  cuDriverGetVersion(out: Int32Array): number;
  cuDeviceGetCount(out: Int32Array): number;
  cuDeviceGet(out: Int32Array, ordinal: number): number;
  cuDeviceGetAttribute(out: Int32Array, attr: number, dev: number): number;
  cuDeviceGetName(buf: Uint8Array, len: number, dev: number): number;
  cuDevicePrimaryCtxRetain(out: BigUint64Array, dev: number): number;
  cuDevicePrimaryCtxRelease_v2(dev: number): number;
  cuCtxSetCurrent(ctx: P): number;
  cuStreamCreate(out: BigUint64Array, flags: number): number;
  cuStreamDestroy_v2(s: P): number;
  cuStreamSynchronize(s: P): number;
  cuEventCreate(out: BigUint64Array, flags: number): number;
  cuEventRecord(e: P, s: P): number;
  cuEventRecordWithFlags(e: P, s: P, flags: number): number;
  cuEventQuery(e: P): number;
  cuEventSynchronize(e: P): number;
  cuEventDestroy_v2(e: P): number;
  cuEventElapsedTime(ms: Float32Array, start: P, end: P): number;
  cuStreamBeginCapture_v2(s: P, mode: number): number;
  cuStreamEndCapture(s: P, graph: BigUint64Array): number;
  cuGraphInstantiateWithFlags(exec: BigUint64Array, graph: P, flags: number): number;
  cuGraphLaunch(exec: P, s: P): number;
  cuGraphExecDestroy(exec: P): number;
  cuGraphDestroy(graph: P): number;
  cuFuncSetAttribute(f: P, attr: number, value: number): number;
  cuFuncGetAttribute(out: Int32Array, attr: number, f: P): number;
  cuMemAlloc_v2(out: BigUint64Array, bytes: number): number;
  cuMemFree_v2(p: P): number;
  cuMemGetInfo_v2(free: BigUint64Array, total: BigUint64Array): number;
  cuMemHostAlloc(out: BigUint64Array, bytes: number, flags: number): number;
  cuMemFreeHost(p: P): number;
  /** from a JS typed array (pageable: the driver stages it before returning) */
  cuMemcpyHtoDAsync_v2(dst: P, src: ArrayBufferView, bytes: number, s: P): number;
  /** from a pinned host address */
  cuMemcpyHtoDAsyncPinned(dst: P, src: P, bytes: number, s: P): number;
  cuMemcpyDtoHAsync_v2(dst: P, src: P, bytes: number, s: P): number;
  cuMemcpyDtoDAsync_v2(dst: P, src: P, bytes: number, s: P): number;
  cuMemsetD8Async(dst: P, value: number, n: number, s: P): number;
  cuMemsetD32Async(dst: P, value: number, n: number, s: P): number;
  cuModuleLoadData(out: BigUint64Array, image: Uint8Array): number;
  cuModuleUnload(m: P): number;
  cuModuleGetFunction(out: BigUint64Array, m: P, name: string): number;
  /** a module's __device__ variable: its address and size */
  cuModuleGetGlobal_v2(dptr: BigUint64Array, bytes: BigUint64Array, m: P, name: string): number;
  cuLaunchKernel(f: P, gx: number, gy: number, gz: number, bx: number, by: number, bz: number, shmem: number, s: P,
    params: P, extra: P): number;
  /** config: the address of a CUlaunchConfig in host memory (pdl.ts writes it) */
  cuLaunchKernelEx(config: P, f: P, params: P, extra: P): number;
  cuProfilerStart(): number;
  cuProfilerStop(): number;
  cuGetErrorString(code: number, out: (string | null)[]): number;
}

export interface Nvrtc {
  path: string;
  nvrtcVersion(major: Int32Array, minor: Int32Array): number;
  nvrtcCreateProgram(out: BigUint64Array, src: string, name: string, n: number, headers: null, names: null): number;
  /** slow (seconds): nvrtc.ts calls it with `.async`, on the libuv thread pool */
  nvrtcCompileProgram: AsyncCallable<(prog: P, n: number, options: string[]) => number>;
  nvrtcGetProgramLogSize(prog: P, out: BigUint64Array): number;
  nvrtcGetProgramLog(prog: P, buf: Uint8Array): number;
  nvrtcGetCUBINSize(prog: P, out: BigUint64Array): number;
  nvrtcGetCUBIN(prog: P, buf: Uint8Array): number;
  nvrtcDestroyProgram(prog: BigUint64Array): number;
  nvrtcGetErrorString(code: number): string;
}

export interface CublasLt {
  path: string;
  cublasLtGetVersion(): number;
  cublasLtCreate(out: BigUint64Array): number;
  cublasLtDestroy(h: P): number;
  cublasLtMatmulDescCreate(out: BigUint64Array, computeType: number, scaleType: number): number;
  cublasLtMatmulDescDestroy(d: P): number;
  cublasLtMatmulDescSetAttribute(d: P, attr: number, buf: ArrayBufferView, size: number): number;
  cublasLtMatrixLayoutCreate(out: BigUint64Array, type: number, rows: number, cols: number, ld: number): number;
  cublasLtMatrixLayoutDestroy(l: P): number;
  cublasLtMatmulPreferenceCreate(out: BigUint64Array): number;
  cublasLtMatmulPreferenceDestroy(p: P): number;
  cublasLtMatmulPreferenceSetAttribute(p: P, attr: number, buf: ArrayBufferView, size: number): number;
  cublasLtMatmulAlgoGetHeuristic(h: P, op: P, a: P, b: P, c: P, d: P, pref: P, requested: number, results: Uint8Array,
    count: Int32Array): number;
  cublasLtMatmulAlgoCheck(h: P, op: P, a: P, b: P, c: P, d: P, algo: Uint8Array, result: Uint8Array): number;
  cublasLtMatmul(h: P, op: P, alpha: Float32Array, a: P, aDesc: P, b: P, bDesc: P, beta: Float32Array, c: P, cDesc: P,
    d: P, dDesc: P, algo: Uint8Array, ws: P, wsBytes: number, stream: P): number;
}

const u64 = 'uint64_t';

function traced(name: string, f: (...args: unknown[]) => unknown, slowMs: number): (...args: unknown[]) => unknown {
  const g = (...args: unknown[]): unknown => {
    const t0 = performance.now();
    const r = f(...args);
    const ms = performance.now() - t0;
    if (ms >= slowMs) {
      const stack = (new Error().stack ?? '').split('\n').slice(2, 9).join('\n');
      process.stderr.write(`[llmts] slow CUDA call ${name}: ${ms.toFixed(1)} ms\n${stack}\n`);
    }
    return r;
  };
  return Object.assign(g, { async: (f as { async?: unknown }).async });
}

/**
 * `lib` (a driver, NVRTC or cuBLASLt binding) with every synchronous call that holds the calling
 * thread `slowMs` ms or more reported on stderr with the JS stack that made it
 * (CudaRuntimeSettings.slowCallMs; 0: `lib` itself). A diagnostic for event-loop stalls: a call that
 * waits for the device (cuMemFree, cuStreamSynchronize, a full launch queue) blocks the whole
 * server while the GPU finishes what is queued.
 */
export function traceSlowCalls<T extends object>(lib: T, slowMs: number): T {
  if (slowMs <= 0) return lib;
  const out: Record<string, unknown> = {};
  for (const [name, v] of Object.entries(lib)) out[name] = typeof v === 'function' ? traced(name, v as (...args: unknown[]) => unknown, slowMs) : v;
  return out as T;
}

function bind<T>(lib: LibraryHandle, path: string, decls: Record<string, string>): T {
  const out: Record<string, unknown> = { path };
  for (const [name, decl] of Object.entries(decls)) out[name] = lib.func(decl);
  return out as T;
}

let driver: Driver | null = null;
let driverError: Error | null = null;

/** libcuda, loaded once per process; throws CudaUnavailableError when absent. */
export function loadDriver(): Driver {
  if (driver) return driver;
  if (driverError) throw driverError;
  try {
    const { lib, path } = loadFirst('the NVIDIA driver library libcuda.so.1', ['libcuda.so.1'], 'cuda',
      'is an NVIDIA driver installed?');
    driver = bind<Driver>(lib, path, {
      cuInit: 'int cuInit(unsigned int)',
      cuDriverGetVersion: 'int cuDriverGetVersion(void *)',
      cuDeviceGetCount: 'int cuDeviceGetCount(void *)',
      cuDeviceGet: 'int cuDeviceGet(void *, int)',
      cuDeviceGetAttribute: 'int cuDeviceGetAttribute(void *, int, int)',
      cuDeviceGetName: 'int cuDeviceGetName(void *, int, int)',
      cuDevicePrimaryCtxRetain: 'int cuDevicePrimaryCtxRetain(void *, int)',
      cuDevicePrimaryCtxRelease_v2: 'int cuDevicePrimaryCtxRelease_v2(int)',
      cuCtxSetCurrent: `int cuCtxSetCurrent(${u64})`,
      cuStreamCreate: 'int cuStreamCreate(void *, unsigned int)',
      cuStreamDestroy_v2: `int cuStreamDestroy_v2(${u64})`,
      cuStreamSynchronize: `int cuStreamSynchronize(${u64})`,
      cuEventCreate: 'int cuEventCreate(void *, unsigned int)',
      cuEventRecord: `int cuEventRecord(${u64}, ${u64})`,
      cuEventRecordWithFlags: `int cuEventRecordWithFlags(${u64}, ${u64}, unsigned int)`,
      cuEventQuery: `int cuEventQuery(${u64})`,
      cuEventSynchronize: `int cuEventSynchronize(${u64})`,
      cuEventDestroy_v2: `int cuEventDestroy_v2(${u64})`,
      cuEventElapsedTime: `int cuEventElapsedTime(void *, ${u64}, ${u64})`,
      cuStreamBeginCapture_v2: `int cuStreamBeginCapture_v2(${u64}, int)`,
      cuStreamEndCapture: `int cuStreamEndCapture(${u64}, void *)`,
      cuGraphInstantiateWithFlags: `int cuGraphInstantiateWithFlags(void *, ${u64}, unsigned long long)`,
      cuGraphLaunch: `int cuGraphLaunch(${u64}, ${u64})`,
      cuGraphExecDestroy: `int cuGraphExecDestroy(${u64})`,
      cuGraphDestroy: `int cuGraphDestroy(${u64})`,
      cuFuncSetAttribute: `int cuFuncSetAttribute(${u64}, int, int)`,
      cuFuncGetAttribute: `int cuFuncGetAttribute(void *, int, ${u64})`,
      cuMemAlloc_v2: 'int cuMemAlloc_v2(void *, size_t)',
      cuMemFree_v2: `int cuMemFree_v2(${u64})`,
      cuMemGetInfo_v2: 'int cuMemGetInfo_v2(void *, void *)',
      cuMemHostAlloc: 'int cuMemHostAlloc(void *, size_t, unsigned int)',
      cuMemFreeHost: `int cuMemFreeHost(${u64})`,
      cuMemcpyHtoDAsync_v2: `int cuMemcpyHtoDAsync_v2(${u64}, const void *, size_t, ${u64})`,
      cuMemcpyHtoDAsyncPinned: `int cuMemcpyHtoDAsync_v2(${u64}, ${u64}, size_t, ${u64})`,
      cuMemcpyDtoHAsync_v2: `int cuMemcpyDtoHAsync_v2(${u64}, ${u64}, size_t, ${u64})`,
      cuMemcpyDtoDAsync_v2: `int cuMemcpyDtoDAsync_v2(${u64}, ${u64}, size_t, ${u64})`,
      cuMemsetD8Async: `int cuMemsetD8Async(${u64}, unsigned char, size_t, ${u64})`,
      cuMemsetD32Async: `int cuMemsetD32Async(${u64}, unsigned int, size_t, ${u64})`,
      cuModuleLoadData: 'int cuModuleLoadData(void *, const void *)',
      cuModuleUnload: `int cuModuleUnload(${u64})`,
      cuModuleGetFunction: `int cuModuleGetFunction(void *, ${u64}, const char *)`,
      cuModuleGetGlobal_v2: `int cuModuleGetGlobal_v2(void *, void *, ${u64}, const char *)`,
      cuLaunchKernel: `int cuLaunchKernel(${u64}, unsigned int, unsigned int, unsigned int, unsigned int, ` +
        `unsigned int, unsigned int, unsigned int, ${u64}, ${u64}, ${u64})`,
      cuLaunchKernelEx: `int cuLaunchKernelEx(${u64}, ${u64}, ${u64}, ${u64})`,
      cuGetErrorString: 'int cuGetErrorString(int, _Out_ const char **)',
      cuProfilerStart: 'int cuProfilerStart()',
      cuProfilerStop: 'int cuProfilerStop()',
    });
    return driver;
  } catch (e) {
    driverError = e instanceof CudaUnavailableError ? e : new CudaUnavailableError(`loading libcuda: ${(e as Error).message}`);
    throw driverError;
  }
}

let nvrtc: Nvrtc | null = null;

export function loadNvrtc(): Nvrtc {
  if (nvrtc) return nvrtc;
  const { lib, path } = loadFirst('NVRTC (libnvrtc.so)', [], 'nvrtc', 'set CUDA_HOME to a CUDA toolkit');
  nvrtc = bind<Nvrtc>(lib, path, {
    nvrtcVersion: 'int nvrtcVersion(void *, void *)',
    nvrtcCreateProgram: 'int nvrtcCreateProgram(void *, const char *, const char *, int, void *, void *)',
    nvrtcCompileProgram: `int nvrtcCompileProgram(${u64}, int, const char **)`,
    nvrtcGetProgramLogSize: `int nvrtcGetProgramLogSize(${u64}, void *)`,
    nvrtcGetProgramLog: `int nvrtcGetProgramLog(${u64}, void *)`,
    nvrtcGetCUBINSize: `int nvrtcGetCUBINSize(${u64}, void *)`,
    nvrtcGetCUBIN: `int nvrtcGetCUBIN(${u64}, void *)`,
    nvrtcDestroyProgram: 'int nvrtcDestroyProgram(void *)',
    nvrtcGetErrorString: 'const char *nvrtcGetErrorString(int)',
  });
  return nvrtc;
}

let cublasLt: CublasLt | null = null;

export function loadCublasLt(): CublasLt {
  if (cublasLt) return cublasLt;
  const { lib, path } = loadFirst('cuBLASLt (libcublasLt.so)', [], 'cublasLt', 'set CUDA_HOME to a CUDA toolkit');
  cublasLt = bind<CublasLt>(lib, path, {
    cublasLtGetVersion: 'size_t cublasLtGetVersion()',
    cublasLtCreate: 'int cublasLtCreate(void *)',
    cublasLtDestroy: `int cublasLtDestroy(${u64})`,
    cublasLtMatmulDescCreate: 'int cublasLtMatmulDescCreate(void *, int, int)',
    cublasLtMatmulDescDestroy: `int cublasLtMatmulDescDestroy(${u64})`,
    cublasLtMatmulDescSetAttribute: `int cublasLtMatmulDescSetAttribute(${u64}, int, const void *, size_t)`,
    cublasLtMatrixLayoutCreate: `int cublasLtMatrixLayoutCreate(void *, int, uint64_t, uint64_t, int64_t)`,
    cublasLtMatrixLayoutDestroy: `int cublasLtMatrixLayoutDestroy(${u64})`,
    cublasLtMatmulPreferenceCreate: 'int cublasLtMatmulPreferenceCreate(void *)',
    cublasLtMatmulPreferenceDestroy: `int cublasLtMatmulPreferenceDestroy(${u64})`,
    cublasLtMatmulPreferenceSetAttribute: `int cublasLtMatmulPreferenceSetAttribute(${u64}, int, const void *, size_t)`,
    cublasLtMatmulAlgoGetHeuristic: `int cublasLtMatmulAlgoGetHeuristic(${u64}, ${u64}, ${u64}, ${u64}, ${u64}, ` +
      `${u64}, ${u64}, int, void *, void *)`,
    cublasLtMatmulAlgoCheck: `int cublasLtMatmulAlgoCheck(${u64}, ${u64}, ${u64}, ${u64}, ${u64}, ${u64}, const void *, void *)`,
    cublasLtMatmul: `int cublasLtMatmul(${u64}, ${u64}, const void *, ${u64}, ${u64}, ${u64}, ${u64}, const void *, ` +
      `${u64}, ${u64}, ${u64}, ${u64}, const void *, ${u64}, size_t, ${u64})`,
  });
  return cublasLt;
}

/** "CUDA_ERROR_X (code): text" for a driver result code. */
export function describeCuResult(code: number): string {
  try {
    const d = loadDriver();
    const out: (string | null)[] = [null];
    if (d.cuGetErrorString(code, out) === 0 && out[0]) return `${out[0]} (CUresult ${code})`;
  } catch {
    // fall through
  }
  return `CUresult ${code}`;
}

/** Throws a readable error unless `rc` is CUDA_SUCCESS. */
export function check(rc: number, what: string): void {
  if (rc !== 0) throw new Error(`cuda backend: ${what} failed: ${describeCuResult(rc)}`);
}

export const CUDA_ERROR_NOT_READY = 600;
export const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
export const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
export const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
export const CU_STREAM_NON_BLOCKING = 1;
export const CU_EVENT_DISABLE_TIMING = 2;

/** A one-element out-parameter read as a number. */
export function out64(): BigUint64Array {
  return new BigUint64Array(1);
}
export function num(a: BigUint64Array): number {
  return Number(a[0]!);
}

export interface CudaProbe {
  ok: boolean;
  /** why CUDA is not usable (when !ok) */
  reason?: string;
  driverVersion?: number;
  devices?: number;
}

/**
 * Whether CUDA is usable here: libcuda loads, cuInit succeeds, and there is a device. Cheap and
 * side-effect free apart from cuInit; never throws.
 */
export function probeCuda(): CudaProbe {
  let d: Driver;
  try {
    d = loadDriver();
  } catch (e) {
    return { ok: false, reason: (e as Error).message };
  }
  const rc = d.cuInit(0);
  if (rc !== 0) return { ok: false, reason: `cuInit failed: ${describeCuResult(rc)}` };
  const v = new Int32Array(1);
  d.cuDriverGetVersion(v);
  const n = new Int32Array(1);
  const rc2 = d.cuDeviceGetCount(n);
  if (rc2 !== 0) return { ok: false, reason: `cuDeviceGetCount failed: ${describeCuResult(rc2)}` };
  if (n[0] === 0) return { ok: false, reason: 'no CUDA device is visible', driverVersion: v[0] };
  return { ok: true, driverVersion: v[0], devices: n[0] };
}
