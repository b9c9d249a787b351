// CUDA source and host layout of the bulk-streamed one-row GEMV, k_gemvt_m1: y[1, N] = x[1, K] · w[N, K]^T
// with each SM's share of w streamed through a ring of shared memory by the copy engine (TMA bulk
// copies, cp.async.bulk, completing on mbarriers), and its add + rmsnorm twins k_gemvt_norm_m1 (the
// q/k/v projection's addRmsnormMatmul) and k_gemvt_normglu_m1 (gate/up with the GLU,
// addRmsnormGateUpGlu). Part of the gemv module (kernels.ts), after gemv-kernels.ts' loaders and norm
// staging. An experiment: used only with $LLMTS_CUDA_GEMV_BULK=on (the GEMM tuner times k_gemvt_m1
// beside the other one-row GEMVs; the two fused ops take their twins untimed at one row).
//
// Why: our one-row GEMVs and cuBLASLt lose ~6 us a kernel to bandwidth on the H200 (o, 33.5 MB:
// 14.5-15.3 us alone against 7.8 at copy bandwidth), the ramp and the tail of blocks that each load
// a little and exit. Here one 256-thread block an SM owns a contiguous run of rows and keeps its
// ring full from start to end: thread 0 asks the copy engine for whole row chunks (16-28 KB each,
// up to ~200 KB in flight an SM, 26 MB on 132 SMs), before the PDL wait as far as the ring reaches,
// and refills a stage as soon as the block has read it; the warps only wait on the stage's mbarrier
// and multiply. (Session 8's staged GEMV held its rows with per-thread cp.async and lost: a block an
// SM issuing 16-byte copies could not keep HBM busy; bulk copies are one instruction a chunk.)
//
// Layout (gemvtLayout): block b takes rows [b R, b R + R) (R = ceil(N / SMs)); chunk c of its rows is
// rows c C .. c C + C - 1 (C rows of K, ~16 KB or one row), in stage c % S of the ring (S stages,
// within GEMVT_SHARED_BYTES). Thread t holds x's 16-byte chunks t, t + 256, ... in registers (K <=
// 16384); a row's sum is each thread's, then the warp's, then the 8 warps' in shared memory: a fixed
// order, the same bits every run. Requires K % 8 == 0 and 16-byte aligned w and x (gemm.ts checks).
//
// Compiled for sm_90 with PTX 8.0 (CUDA 12) and newer; elsewhere the kernels trap and the host
// never offers them (gemvBulkRuns). Without __CUDA_ARCH__ (the host warp simulator) the copies and
// barriers are the simulator's: a stage is poisoned when its copy is issued and filled when a
// thread waits on its barrier, so reading a stage early, or (under its warp-first schedule)
// refilling one other warps still read, fails.
//
// Unmeasured cost to watch: one barrier a chunk (its rows' sums double-buffered in shared memory)
// and a warp reduction a row; a 16 KB chunk's bytes arrive in ~0.5 us at an SM's share of HBM, so
// the block has about that long for its arithmetic, reductions and barrier.
//
// With PDL a block of the next kernel starts on an SM as soon as this kernel's block there exits
// (~200 KB of shared memory leaves no room beside it) and fills its ring before its wait: one SM's
// tail overlaps the next kernel's head SM by SM.
import { envSwitch } from '../common/env.ts';
import { Setting } from '../common/setting.ts';

/** threads a block */
export const GEMVT_THREADS = 256;
/** x's 16-byte chunks a thread holds in registers */
const GEMVT_XMAX = 8;
/** the most K a block's registers hold x for: GEMVT_XMAX chunks of 8 a thread */
export const GEMVT_MAX_K = GEMVT_XMAX * GEMVT_THREADS * 8;
/** most outputs a chunk (gemvtLayout caps rowsPerChunk; the kernels' reduction array holds that many) */
const GEMVT_CHUNK_ROWS = 16;

export const GEMVT_KERNEL_SOURCE = String.raw`
#define GEMVT_THREADS ${GEMVT_THREADS}
#define GEMVT_XMAX ${GEMVT_XMAX}
#define GEMVT_CHUNK_ROWS ${GEMVT_CHUNK_ROWS}

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && (__CUDACC_VER_MAJOR__ >= 12)
#define GEMVT_BULK 1
__device__ __forceinline__ unsigned gemvt_smem(const void* p) { return att_smem(p); } // ATTENTION_PRIMITIVES' (the gemv module has them)
__device__ __forceinline__ void gemvt_bar_init(unsigned long long* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(gemvt_smem(bar)) : "memory");
}
__device__ __forceinline__ void gemvt_bar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// the phase's one arrival (thread 0), expecting the bytes its copies will bring
__device__ __forceinline__ void gemvt_expect(unsigned long long* bar, unsigned bytes) {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); // the block's reads of this stage come first
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(gemvt_smem(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void gemvt_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
    :: "r"(gemvt_smem(dst)), "l"(src), "r"(bytes), "r"(gemvt_smem(bar)) : "memory");
}
__device__ __forceinline__ void gemvt_wait(unsigned long long* bar, unsigned parity) {
  unsigned done = 0;
  while (!done) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
      : "=r"(done) : "r"(gemvt_smem(bar)), "r"(parity) : "memory");
  }
}
#elif !defined(__CUDA_ARCH__)
#define GEMVT_BULK 1
inline void gemvt_bar_init(unsigned long long* bar) { sim_bar_init(bar); }
inline void gemvt_bar_fence_init() {}
inline void gemvt_expect(unsigned long long* bar, unsigned bytes) { sim_bar_expect(bar, bytes); }
inline void gemvt_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) { sim_bulk_load(dst, src, bytes, bar); }
inline void gemvt_wait(unsigned long long* bar, unsigned parity) { sim_bar_wait(bar, parity); }
#else
#define GEMVT_BULK 0
#endif

// rowsPerBlock R (outputs), rowsPerChunk C, stages S (gemvtLayout). Dynamic shared memory: S stages of
// C rows of K bf16 (GLU: C gate rows, then C up rows), then S 8-byte mbarriers, then (MODE 2) the
// normed x, K bf16 at the next 16-byte boundary. MODE 0: x as given; MODE 2: add + rmsnorm of x and r
// (gemv-kernels.ts gemvp_stage_x, block 0 storing the new residual), as k_gemvp_norm_* makes it.
// GLU: w is packed gate/up rows [2N, K]; output n is act(bf16(gate n)) bf16(up n), rounded as
// k_gemvp_normglu_* rounds it; a chunk's gate and up rows travel as two copies on one barrier.
template <int MODE, bool GLU>
__device__ __forceinline__ void gemvt_rows(const u16* __restrict__ w, const GemvIn& in, u16* __restrict__ y, int N, int K,
    int rowsPerBlock, int rowsPerChunk, int stages, int act) {
#if GEMVT_BULK
  // [chunk parity][sum: a row's, or an output's gate then up][warp]: one barrier a chunk, the next
  // chunk's sums in the other half while the last ones are read
  __shared__ float red[2][2 * GEMVT_CHUNK_ROWS][8];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const i64 chunkElems = (i64)rowsPerChunk * K * (GLU ? 2 : 1);
  u16* const ring = (u16*)dyn_smem();
  unsigned long long* const bars = (unsigned long long*)(ring + stages * chunkElems);
  uint4* const xs = (uint4*)(bars + ((stages + 1) & ~1)); // 16-byte aligned: an even count of 8-byte barriers
  const int r0 = blockIdx.x * rowsPerBlock;
  const int rows = max(0, min(rowsPerBlock, N - r0));
  const int nChunks = (rows + rowsPerChunk - 1) / rowsPerChunk;
  // chunk c of the block's rows into stage st: its rows (GLU: and their up rows, C rows further on)
#define GEMVT_ISSUE(c, st) do { \
    const int nr_ = min(rowsPerChunk, rows - (c) * rowsPerChunk); \
    const unsigned bytes_ = (unsigned)(nr_ * K * 2); \
    const i64 row_ = (i64)r0 + (i64)(c) * rowsPerChunk; \
    u16* const dst_ = ring + (st) * chunkElems; \
    gemvt_expect(&bars[st], GLU ? 2u * bytes_ : bytes_); \
    gemvt_copy(dst_, w + row_ * K, bytes_, &bars[st]); \
    if (GLU) gemvt_copy(dst_ + (i64)rowsPerChunk * K, w + ((i64)N + row_) * K, bytes_, &bars[st]); \
  } while (0)
  // the weights do not depend on the kernel before: the ring fills before the PDL wait
  if (tid == 0) {
    for (int s = 0; s < stages; s++) gemvt_bar_init(&bars[s]);
    gemvt_bar_fence_init();
    for (int c = 0; c < nChunks && c < stages; c++) GEMVT_ISSUE(c, c);
  }
  __syncthreads(); // the barriers exist before anyone waits on them
  PDL_ENTRY();
  const int nch = K >> 3;
  if (MODE == 2) gemvp_stage_x<1, 2>(in, 1, nch, K, xs); // ends with a barrier
  uint4 xr[GEMVT_XMAX];
#pragma unroll
  for (int j = 0; j < GEMVT_XMAX; j++) {
    const int c = tid + j * GEMVT_THREADS;
    xr[j] = c >= nch ? make_uint4(0u, 0u, 0u, 0u) : MODE == 2 ? xs[c] : gemv_ld_cached((const uint4*)in.x + c);
  }
  for (int c = 0; c < nChunks; c++) {
    const int stage = c % stages, par = c & 1;
    gemvt_wait(&bars[stage], (unsigned)((c / stages) & 1));
    const u16* const ch = ring + stage * chunkElems;
    const int nr = min(rowsPerChunk, rows - c * rowsPerChunk);
    // two weight rows at a time (two sums in flight): rows rr and rr + 1, or output rr's gate and up
    for (int rr = 0; rr < nr; rr += GLU ? 1 : 2) {
      const bool two = GLU || rr + 1 < nr;
      float a0 = 0.0f, a1 = 0.0f;
      const uint4* const row0 = (const uint4*)(ch + (i64)rr * K);
      const uint4* const row1 = (const uint4*)(ch + (i64)(GLU ? rowsPerChunk + rr : rr + 1) * K);
#pragma unroll
      for (int j = 0; j < GEMVT_XMAX; j++) {
        const int k = tid + j * GEMVT_THREADS;
        if (k < nch) {
          a0 += gemv_dot8(row0[k], xr[j]);
          if (two) a1 += gemv_dot8(row1[k], xr[j]);
        }
      }
      a0 = warp_sum(a0);
      a1 = warp_sum(a1);
      if (lane == 0) {
        const int i0 = GLU ? 2 * rr : rr; // a row's sum, or the output's gate sum (its up sum follows)
        red[par][i0][warp] = a0;
        if (two) red[par][i0 + 1][warp] = a1;
      }
    }
    __syncthreads(); // the chunk's sums are in red; the stage is read
    if (tid < nr) {
      if (GLU) {
        float g = 0.0f, u = 0.0f;
        for (int q = 0; q < 8; q++) {
          g += red[par][2 * tid][q];
          u += red[par][2 * tid + 1][q];
        }
        y[r0 + c * rowsPerChunk + tid] = f2bf(activate(bf2f(f2bf(g)), act) * bf2f(f2bf(u)));
      } else {
        float v = 0.0f;
        for (int q = 0; q < 8; q++) v += red[par][tid][q];
        y[r0 + c * rowsPerChunk + tid] = f2bf(v);
      }
    }
    if (tid == 0 && c + stages < nChunks) GEMVT_ISSUE(c + stages, stage); // the stage is free
    // no second barrier: the next chunk writes red[!par], and the one after can only write red[par]
    // once every thread has passed the next chunk's barrier, i.e. finished reading these sums
  }
#undef GEMVT_ISSUE
#else
  __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(GEMVT_THREADS, 1) k_gemvt_m1(const u16* w, const u16* x, u16* y, int N, int K,
    int rowsPerBlock, int rowsPerChunk, int stages) {
  GemvIn in = GemvIn();
  in.x = x;
  gemvt_rows<0, false>(w, in, y, N, K, rowsPerBlock, rowsPerChunk, stages, 0);
}

// addRmsnormMatmul at one row: y = rmsnorm(x + rScale r) · w^T and the new residual sum (block 0)
extern "C" __global__ void __launch_bounds__(GEMVT_THREADS, 1) k_gemvt_norm_m1(const u16* w, const u16* x, const u16* r,
    float rScale, const void* nw, int nwdt, float eps, float off, u16* sum, u16* y, int N, int K, int rowsPerBlock,
    int rowsPerChunk, int stages) {
  gemvt_rows<2, false>(w, gemv_norm_in(x, r, rScale, nw, nwdt, eps, off, sum), y, N, K, rowsPerBlock, rowsPerChunk, stages, 0);
}

// addRmsnormGateUpGlu at one row: y [N] = glu(rmsnorm(x + rScale r) · w^T) over packed gate/up rows w [2N, K]
extern "C" __global__ void __launch_bounds__(GEMVT_THREADS, 1) k_gemvt_normglu_m1(const u16* w, const u16* x, const u16* r,
    float rScale, const void* nw, int nwdt, float eps, float off, u16* sum, u16* y, int N, int K, int rowsPerBlock,
    int rowsPerChunk, int stages, int act) {
  gemvt_rows<2, true>(w, gemv_norm_in(x, r, rScale, nw, nwdt, eps, off, sum), y, N, K, rowsPerBlock, rowsPerChunk, stages, act);
}
`;

export const GEMVT_KERNEL_NAMES = ['k_gemvt_m1', 'k_gemvt_norm_m1', 'k_gemvt_normglu_m1'] as const;

/**
 * $LLMTS_CUDA_GEMV_BULK=on: the GEMM tuner also times k_gemvt_m1 for one-row shapes (gemm.ts
 * gemvChoices) and takes it where it wins as our other GEMVs do, and a one-row addRmsnormMatmul
 * runs k_gemvt_norm_m1, a one-row addRmsnormGateUpGlu k_gemvt_normglu_m1. Off by default: not yet
 * run on a GPU (session 9 wrote them and tested them on the warp simulator only).
 */
export const GEMV_BULK = new Setting<boolean>(envSwitch('LLMTS_CUDA_GEMV_BULK', false));

/** Turns the bulk-streamed GEMVs on or off for backends' later plans (tests); returns the old setting. */
export function setCudaGemvBulk(on: boolean): boolean {
  return GEMV_BULK.set(on);
}

/** Whether a device and NVRTC run the bulk-streamed kernels: sm_90+ and NVRTC 12+ (elsewhere they are compiled as a trap). */
export function gemvBulkRuns(arch: string, nvrtcVersion: string): boolean {
  return Number(/^sm_(\d+)/.exec(arch)?.[1] ?? 0) >= 90 && Number(nvrtcVersion.split('.')[0]) >= 12;
}

/** the ring's budget a block: ~200 KiB of the H200's 227 KiB of shared memory a block */
export const GEMVT_SHARED_BYTES = 200 * 1024;
/** a chunk's target size (a chunk is whole rows: at least one) */
const GEMVT_CHUNK_BYTES = 16 * 1024;
const GEMVT_MAX_STAGES = 16;

export interface GemvtLayout {
  grid: number;
  rowsPerBlock: number;
  rowsPerChunk: number;
  stages: number;
  /** dynamic shared memory a block: the ring, then one 8-byte mbarrier a stage */
  sharedBytes: number;
}

/**
 * How k_gemvt_m1 covers N rows of inner size K on smCount SMs: one block an SM over a contiguous
 * run of ceil(N / SMs) rows, chunks of whole rows of about GEMVT_CHUNK_BYTES (at most a block's
 * rows), as many stages as fit the ring's budget (at most GEMVT_MAX_STAGES and a block's chunks, at
 * least 2); null where K rules it out or the ring holds fewer than 2 chunks. (The
 * ring and chunk sizes are parameters for the simulator's tests, which wrap small rings many times.)
 */
export function gemvtLayout(N: number, K: number, smCount: number, ringBytes = GEMVT_SHARED_BYTES,
    chunkTarget = GEMVT_CHUNK_BYTES, weightRowsPerOutput: 1 | 2 = 1): GemvtLayout | null {
  if (!Number.isInteger(N) || N < 1 || !Number.isInteger(K) || K < 8 || K % 8 !== 0 || K > GEMVT_MAX_K) return null;
  const rowBytes = K * 2 * weightRowsPerOutput; // an output's weight rows (GLU: its gate and up rows)
  const rowsPerBlock = Math.ceil(N / Math.max(1, smCount));
  const rowsPerChunk = Math.min(rowsPerBlock, GEMVT_CHUNK_ROWS, Math.max(1, Math.floor(chunkTarget / rowBytes)));
  const chunkBytes = rowsPerChunk * rowBytes;
  const fit = Math.floor(ringBytes / chunkBytes);
  if (fit < 2) return null;
  // no more stages than a block has chunks (but two: a ring)
  const stages = Math.min(GEMVT_MAX_STAGES, fit, Math.max(2, Math.ceil(rowsPerBlock / rowsPerChunk)));
  return { grid: Math.ceil(N / rowsPerBlock), rowsPerBlock, rowsPerChunk, stages, sharedBytes: stages * chunkBytes + stages * 8 };
}

/**
 * k_gemvt_norm_m1's layout (weightRowsPerOutput 2: k_gemvt_normglu_m1's, N outputs of packed gate/up
 * rows [2N, K], a chunk's gate rows and then its up rows): gemvtLayout's within the ring's budget less
 * the normed row (K bf16), which follows the barriers (rounded to an even count: 16-byte alignment).
 */
export function gemvtNormLayout(N: number, K: number, smCount: number, ringBytes = GEMVT_SHARED_BYTES,
    chunkTarget = GEMVT_CHUNK_BYTES, weightRowsPerOutput: 1 | 2 = 1): GemvtLayout | null {
  const l = gemvtLayout(N, K, smCount, ringBytes - K * 2, chunkTarget, weightRowsPerOutput);
  if (!l) return null;
  const ring = l.stages * l.rowsPerChunk * K * 2 * weightRowsPerOutput;
  return { ...l, sharedBytes: ring + ((l.stages + 1) & ~1) * 8 + K * 2 };
}
