// The weight prefetch hint (Backend.prefetchWeights) on CUDA: k_l2_prefetch asks L2 to fetch the
// weights the next ops will read, by bulk prefetches (cp.async.bulk.prefetch.L2) spread over the
// SMs. At B=1 the decode attention (~12.5 us a layer on the H200 for 2 MB of KV: a latency-bound
// chain on 40 SMs) leaves HBM idle while the o projection behind it waits; o's weights (33.5 MB at
// Llama-3.1-8B shapes; the H200's L2 is 50 MB) fetched meanwhile make o an L2 read. An experiment,
// off by default: $LLMTS_CUDA_L2_PREFETCH_MB=N prefetches up to N MB, the weights in order (o, then
// the MLP's packed gate/up), at one-row steps on sm_90+ with NVRTC 12+ (arch.ts).
//
// In a PDL chain the kernel lets the next one launch at once and waits for the one before only at
// its end, so it completes after that one: the next kernel's wait still orders it after the kernel
// before the prefetch.
import { envInt } from '../common/env.ts';
import { Setting } from '../common/setting.ts';

/** bytes the hint may prefetch ($LLMTS_CUDA_L2_PREFETCH_MB; 0: none, the default) */
export const L2_PREFETCH_BYTES = new Setting<number>(envInt('LLMTS_CUDA_L2_PREFETCH_MB', 0, { min: 0, max: 4096 }) * 1024 * 1024);

/** Sets the prefetch budget in bytes for later hints (tests); returns the old one. */
export function setCudaL2PrefetchBytes(bytes: number): number {
  return L2_PREFETCH_BYTES.set(bytes);
}

/** the most token rows a step may have for the hint to launch: at more the attention is no longer the idle gap */
export const L2_PREFETCH_MAX_ROWS = 1;

/**
 * How many leading bytes of each weight (sizes in bytes) a budget covers: the weights in order,
 * whole while the budget lasts, the one it ends in cut to a multiple of 16 bytes (the bulk
 * prefetch's unit), none after it.
 */
export function l2PrefetchPrefixes(sizes: readonly number[], budget: number): number[] {
  let left = Math.max(0, Math.floor(budget));
  return sizes.map((size) => {
    const take = Math.min(Math.floor(size / 16) * 16, Math.floor(left / 16) * 16);
    left -= take;
    return take;
  });
}

export const L2_PREFETCH_KERNEL_SOURCE = String.raw`
// Asks L2 for [p1, p1 + n1) then [p2, p2 + n2) (bytes: multiples of 16, 16-byte aligned), each
// block's thread 0 its share in bulk prefetches of at most 64 KiB (sm_90+ and CUDA 12+; elsewhere nothing). No
// value depends on it. launch_dependents first (the next kernel starts at once), the wait last
// (this kernel completes only after the one before it: l2-prefetch.ts).
extern "C" __global__ void k_l2_prefetch(const unsigned char* p1, i64 n1, const unsigned char* p2, i64 n2) {
  pdl_launch_dependents();
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && (__CUDACC_VER_MAJOR__ >= 12)
  if (threadIdx.x == 0) {
    const i64 total = n1 + n2, per = ((total + gridDim.x - 1) / gridDim.x + 15) / 16 * 16;
    const i64 end = min(total, (i64)(blockIdx.x + 1) * per);
    for (i64 o = (i64)blockIdx.x * per; o < end;) {
      const bool first = o < n1; // a piece stays within one range
      const unsigned bytes = (unsigned)min(min(end, first ? n1 : total) - o, (i64)65536);
      const unsigned char* p = first ? p1 + o : p2 + (o - n1);
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(p), "r"(bytes) : "memory");
      o += bytes;
    }
  }
#endif
  pdl_wait();
}
`;
