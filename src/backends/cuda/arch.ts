// What a device and the NVRTC that compiles for it can run, where kernels compile a feature out
// below it (and the host must not launch them expecting it).

/**
 * Whether a device and NVRTC run the TMA bulk-async instructions (cp.async.bulk, its L2 prefetch,
 * mbarrier transaction counts): sm_90+ with NVRTC 12+ (PTX 8.0). Kernels using them compile them
 * out elsewhere (gemv-bulk-kernels.ts: a trap; l2-prefetch.ts: nothing).
 */
export function bulkAsyncRuns(arch: string, nvrtcVersion: string): boolean {
  return Number(/^sm_(\d+)/.exec(arch)?.[1] ?? 0) >= 90 && Number(nvrtcVersion.split('.')[0]) >= 12;
}
