// What the CUDA backend reports about itself (CudaBackend.info, describe()): the device, each
// kernel module's state and where its cubin came from, the GEMM engine. Separate from
// cuda-backend.ts because it only reads the runtime, for logs and tests; no op depends on it.
import type { CudaRuntime } from './runtime.ts';

/** One kernel module of CudaBackendInfo. */
export interface CudaKernelModuleInfo {
  name: string;
  /** where its cubin came from once loaded; 'compiling' or 'failed' before */
  kernels: 'cache' | 'nvrtc' | 'compiling' | 'failed';
  /** time in NVRTC (0 from the cache) */
  compileMs: number;
  /** ms from the start of the kernel build until the module was loaded */
  readyMs?: number;
  cachePath?: string;
}

export interface CudaBackendInfo {
  device: string;
  arch: string;
  sms: number;
  driverVersion: number;
  /** '' until a module has been compiled or read from the cache */
  nvrtcVersion: string;
  /** 'cache' when every module came from the disk cache */
  kernels: 'cache' | 'nvrtc';
  /**
   * ms from the start of the kernel build until every module was loaded (the modules compile
   * concurrently, so this is about the slowest one, not the sum); undefined while they build
   */
  kernelCompileMs: number | undefined;
  /** the cache directory (one file per module: kernelModules[].cachePath) */
  kernelCachePath: string;
  /** 'async' (NVRTC on the libuv thread pool) or 'sync (why)' */
  kernelCompile: string;
  kernelModules: CudaKernelModuleInfo[];
  /** 'cublaslt <version>' or 'simple (<why>)' */
  gemm: string;
}

/** Device, kernel modules (as they are now: they may still be compiling) and GEMM engine (`gemmNote`). */
export function backendInfo(rt: CudaRuntime, gemmNote: string): CudaBackendInfo {
  const modules: CudaKernelModuleInfo[] = rt.modules.map((m) => ({
    name: m.name, kernels: m.state === 'loaded' ? m.compiled!.source : m.state,
    compileMs: m.compiled?.compileMs ?? 0, readyMs: m.readyMs, cachePath: m.compiled?.cachePath,
  }));
  return {
    device: rt.deviceName, arch: rt.arch, sms: rt.smCount, driverVersion: rt.driverVersion,
    nvrtcVersion: rt.nvrtcVersion(),
    kernels: modules.every((m) => m.kernels === 'cache') ? 'cache' : 'nvrtc', kernelCompileMs: rt.kernelsMs,
    kernelCachePath: rt.cacheDir, kernelCompile: rt.compileMode, kernelModules: modules, gemm: gemmNote,
  };
}

/**
 * One line for logs: device, kernel modules (how long until all were loaded; per module its NVRTC
 * time or 'cache'), GEMM engine.
 */
export function describeInfo(i: CudaBackendInfo): string {
  const mods = i.kernelModules.map((m) =>
    `${m.name} ${m.kernels === 'nvrtc' ? `${m.compileMs.toFixed(0)} ms` : m.kernels}`).join(', ');
  const kernels = i.kernelCompileMs === undefined ? `kernels building: ${mods}`
    : `kernels ${i.kernelCompileMs.toFixed(0)} ms: ${i.kernels === 'cache' ? `${i.kernelModules.length} modules from cache`
      : `${mods}; NVRTC ${i.kernelCompile}`}`;
  return `cuda: ${i.device} (${i.arch}, ${i.sms} SMs), driver ${i.driverVersion}, NVRTC ${i.nvrtcVersion || '?'} ` +
    `(${kernels}), gemm ${i.gemm}`;
}
