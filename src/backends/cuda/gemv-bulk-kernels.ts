// CUDA source and host layout of the bulk-streamed one-row GEMV, k_gemvt_m1: y[1, N] = x[1, K] · w[N, K]^T
// with each SM's share of w streamed through rings of shared memory by the copy engine (TMA bulk
// copies, cp.async.bulk, completing on mbarriers) and multiplied on the tensor cores, and its add +
// rmsnorm twins k_gemvt_norm_m1 (the q/k/v projection's addRmsnormMatmul) and k_gemvt_normglu_m1
// (gate/up with the GLU, addRmsnormGateUpGlu). Part of the gemv module (kernels.ts), after
// gemv-kernels.ts' loaders and norm staging. An experiment: used only with $LLMTS_CUDA_GEMV_BULK=on
// (the GEMM tuner times k_gemvt_m1 beside the other one-row GEMVs; the two fused ops take their
// twins untimed at one row).
//
// Why: our one-row GEMVs and cuBLASLt lose ~6 us a kernel to bandwidth on the H200 (o, 33.5 MB:
// 14.5-15.3 us alone against 7.8 at copy bandwidth), the ramp and the tail of blocks that each load
// a little and exit. Here one 256-thread block an SM owns a contiguous run of rows and keeps its
// rings full from start to end, the first fill before the PDL wait.
//
// Session 10's first version (one ring a block, 8 warps reducing each chunk's rows together with
// a block barrier a chunk, CUDA-core dot products) measured 22.6 us for the o shape: Nsight
// Compute showed an instruction-bound block (31.7k warp instructions an SM, 0.9 issued a cycle,
// 1.3 TB/s). This one has no barrier in its loop and ~6 instructions a KB of weights:
// - each warp streams on its own: units of 16 rows x P columns (GLU: 16 outputs' gate rows, then
//   their up rows), its share of the block's units in order, through its own ring of S slots (one
//   mbarrier a slot; its lanes issue a unit's row copies, one a lane, and once the warp has read a
//   slot, the copies of the unit S further on into it);
// - a 32-column step is 3 16-byte shared loads and 2 mma.sync m16n8k16 (f32 accumulation): lane
//   (g, c) loads columns 8c .. 8c + 7 of rows g and g + 8 as A fragments for two k-steps, and the
//   same 8 x values as B (k permuted alike in A and B: the products are unchanged; every B column
//   is x, so every C column is the rows' sums);
// - a slot's rows sit 16 bytes apart beyond their P columns, so the 32 lanes' loads spread over
//   the banks (4 wavefronts for 512 bytes).
// A warp's units cover whole 16-row groups but for its first and last: those partial sums go to
// shared memory and, after the block's one barrier, are added in warp order (the same bits every
// run).
//
// Layout (gemvtLayout): block b takes rows [b R, b R + R) (R a multiple of 16); a block's units
// are its groups' column parts in order, warp w takes units [w U / 8, (w + 1) U / 8). Dynamic
// shared memory: 8 warps x S slots x 16 (GLU 32) rows of 2 P + 16 bytes, then 8 S mbarriers, then
// x (or the normed x) as K bf16, then the partial sums [8][2][16 (GLU 32)] floats. Rows past N
// are copied as N - 1 again (their sums are never stored). Requires K % 8 == 0 and 16-byte aligned
// w and x (gemm.ts checks).
//
// Compiled for sm_90 with PTX 8.0 (CUDA 12) and newer; elsewhere the kernels trap and the host
// never offers them (arch.ts bulkAsyncRuns). Without __CUDA_ARCH__ (the host warp simulator) the copies and
// barriers are the simulator's: a slot is poisoned when its copy is issued and filled when a
// thread waits on its barrier, so reading a slot early, or refilling one before the warp has read
// it, fails.
//
// With PDL a block of the next kernel starts on an SM as soon as this kernel's block there exits
// (~220 KB of shared memory leaves no room beside it) and fills its rings before its wait: one SM's
// tail overlaps the next kernel's head SM by SM.
import { envInt, envSwitch } from '../common/env.ts';
import { Setting } from '../common/setting.ts';

/** threads a block */
export const GEMVT_THREADS = 256;
const GEMVT_WARPS = GEMVT_THREADS / 32;
/** the most K: x (K bf16) lives in shared memory beside the rings */
export const GEMVT_MAX_K = 16384;

export const GEMVT_KERNEL_SOURCE = String.raw`
#define GEMVT_WARPS ${GEMVT_WARPS}

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && (__CUDACC_VER_MAJOR__ >= 12)
#define GEMVT_BULK 1
__device__ __forceinline__ unsigned gemvt_smem(const void* p) { return att_smem(p); } // ATTENTION_PRIMITIVES' (the gemv module has them)
__device__ __forceinline__ void gemvt_bar_init(unsigned long long* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(gemvt_smem(bar)) : "memory");
}
__device__ __forceinline__ void gemvt_bar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// this thread's reads of shared memory before the copy engine's later writes
__device__ __forceinline__ void gemvt_fence_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// the phase's one arrival (lane 0), expecting the bytes its copies will bring
__device__ __forceinline__ void gemvt_expect(unsigned long long* bar, unsigned bytes) {
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
inline void gemvt_fence_async() {}
inline void gemvt_expect(unsigned long long* bar, unsigned bytes) { sim_bar_expect(bar, bytes); }
inline void gemvt_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) { sim_bulk_load(dst, src, bytes, bar); }
inline void gemvt_wait(unsigned long long* bar, unsigned parity) { sim_bar_wait(bar, parity); }
#else
#define GEMVT_BULK 0
#endif

#if GEMVT_BULK
// The block's unit u (group u / ppg, column part u % ppg) into a slot, by the whole warp: a copy a
// row from lanes 0-15 (GLU: lanes 16-31 copy the up rows, N rows further on), all on the slot's
// barrier, whose arrival (lane 0) comes first. (Session 10: lane 0 issuing all 16 copies held
// the warp ~1-2k cycles a unit, the down projection's 16 units a warp 43 us against 33.6.)
__device__ __forceinline__ void gemvt_issue(const u16* __restrict__ w, int N, int K, int r0, int rows, int P, int ppg, int u,
    unsigned char* slot, int rowStride, unsigned long long* bar, bool glu, int lane) {
  const int g = u / ppg, c0 = (u - g * ppg) * P;
  const unsigned bytes = (unsigned)(min(P, K - c0) * 2);
  gemvt_fence_async(); // this lane's reads of the slot come first
  if (lane == 0) gemvt_expect(bar, bytes * (glu ? 32u : 16u));
  __syncwarp();
  if (lane < (glu ? 32 : 16)) {
    const i64 row = (i64)r0 + min(g * 16 + (lane & 15), rows - 1); // a row past the block's last repeats it
    gemvt_copy(slot + lane * rowStride, w + (lane < 16 ? row : (i64)N + row) * K + c0, bytes, bar);
  }
}

// y for rows g 16 + rr (rr < 16, or GLU: output g 16 + rr from its gate and up sums), where the block has them
__device__ __forceinline__ void gemvt_store(u16* __restrict__ y, int r0, int rows, int g, int rr, float v, float up, bool glu, int act) {
  const int row = g * 16 + rr;
  if (row < rows) y[r0 + row] = glu ? f2bf(activate(bf2f(f2bf(v)), act) * bf2f(f2bf(up))) : f2bf(v);
}
#endif

// rowsPerBlock R (a multiple of 16 unless one block holds all N), partCols P (a multiple of 32),
// slots S a warp (gemvtLayout). MODE 0: x as given; MODE 2: add + rmsnorm of x and r
// (gemv-kernels.ts gemvp_stage_x, block 0 storing the new residual), as k_gemvp_norm_* makes it.
// GLU: w is packed gate/up rows [2N, K]; output n is act(bf16(gate n)) bf16(up n), rounded as
// k_gemvp_normglu_* rounds it.
template <int MODE, bool GLU>
__device__ __forceinline__ void gemvt_rows(const u16* __restrict__ w, const GemvIn& in, u16* __restrict__ y, int N, int K,
    int rowsPerBlock, int P, int S, int act) {
#if GEMVT_BULK
  constexpr int UR = GLU ? 32 : 16; // weight rows a unit
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gl = lane >> 2, cl = lane & 3;
  const int rowStride = 2 * P + 16;
  const int slotBytes = UR * rowStride;
  unsigned char* const ring = (unsigned char*)dyn_smem();
  unsigned long long* const bars = (unsigned long long*)(ring + (i64)GEMVT_WARPS * S * slotBytes);
  uint4* const xs = (uint4*)(bars + GEMVT_WARPS * S); // 16-byte aligned: 8 S barriers of 8 bytes
  float* const part = (float*)(xs + K / 8);            // [warp][its first group, its last][UR]
  const int r0 = blockIdx.x * rowsPerBlock;
  const int rows = max(0, min(rowsPerBlock, N - r0));
  const int ppg = (K + P - 1) / P, U = (rows + 15) / 16 * ppg;
  const int u0 = warp * U / GEMVT_WARPS, u1 = (warp + 1) * U / GEMVT_WARPS, n = u1 - u0;
  unsigned char* const myRing = ring + (i64)warp * S * slotBytes;
  unsigned long long* const myBars = bars + warp * S;
  // the weights do not depend on the kernel before: the rings fill before the PDL wait
  if (lane == 0) {
    for (int s = 0; s < S; s++) gemvt_bar_init(&myBars[s]);
    gemvt_bar_fence_init();
  }
  __syncwarp(); // the barriers exist before the warp uses them
  for (int i = 0; i < n && i < S; i++) gemvt_issue(w, N, K, r0, rows, P, ppg, u0 + i, myRing + i * slotBytes, rowStride, &myBars[i], GLU, lane);
  PDL_ENTRY();
  const int nch = K >> 3;
  if (MODE == 2) {
    gemvp_stage_x<1, 2>(in, 1, nch, K, xs); // ends with a barrier
  } else {
    for (int c = threadIdx.x; c < nch; c += blockDim.x) xs[c] = gemv_ld_cached((const uint4*)in.x + c);
    __syncthreads();
  }
  const int g0 = u0 / ppg;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, accU[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  // the group's sums: y where this warp read all of the group's columns, else its partial sums
#define GEMVT_FLUSH(g) do { \
    if ((g) * ppg >= u0 && ((g) + 1) * ppg <= u1) { \
      if (cl == 0) gemvt_store(y, r0, rows, (g), gl, acc[0], accU[0], GLU, act); \
      if (cl == 1) gemvt_store(y, r0, rows, (g), gl + 8, acc[2], accU[2], GLU, act); \
    } else if (cl == 0) { \
      float* const p_ = part + (warp * 2 + ((g) == g0 ? 0 : 1)) * UR; \
      p_[gl] = acc[0]; \
      p_[gl + 8] = acc[2]; \
      if (GLU) { p_[16 + gl] = accU[0]; p_[16 + gl + 8] = accU[2]; } \
    } \
  } while (0)
  int gcur = g0;
  for (int i = 0; i < n; i++) {
    const int u = u0 + i, s = i % S, g = u / ppg;
    if (g != gcur) {
      GEMVT_FLUSH(gcur);
      for (int e = 0; e < 4; e++) acc[e] = accU[e] = 0.0f;
      gcur = g;
    }
    const int c0 = (u - g * ppg) * P, cols = min(P, K - c0);
    gemvt_wait(&myBars[s], (unsigned)((i / S) & 1));
    const unsigned char* const slot = myRing + s * slotBytes;
    const unsigned char* const ra = slot + gl * rowStride + cl * 16; // row gl, this lane's 8 columns of a step
    const unsigned char* const rb = ra + 8 * rowStride;               // row gl + 8
    const uint4* const xp = xs + (c0 >> 3) + cl;
    for (int k = 0; k < cols; k += 32) {
      const bool on = k + 8 * cl < cols; // the last step of a part may be short
      const uint4 z = make_uint4(0u, 0u, 0u, 0u);
      const uint4 a = on ? *(const uint4*)(ra + 2 * k) : z, b = on ? *(const uint4*)(rb + 2 * k) : z, xv = on ? xp[k >> 3] : z;
      // k-step 0: columns 8c, 8c + 1 as A's (2c, 2c + 1) and 8c + 2, 8c + 3 as (2c + 8, 2c + 9); step 1 the next four
      const unsigned a0[4] = {a.x, b.x, a.y, b.y}, a1[4] = {a.z, b.z, a.w, b.w};
      att_mma(acc, a0, xv.x, xv.y);
      att_mma(acc, a1, xv.z, xv.w);
      if (GLU) {
        const uint4 ua = on ? *(const uint4*)(ra + 16 * rowStride + 2 * k) : z, ub = on ? *(const uint4*)(rb + 16 * rowStride + 2 * k) : z;
        const unsigned u0f[4] = {ua.x, ub.x, ua.y, ub.y}, u1f[4] = {ua.z, ub.z, ua.w, ub.w};
        att_mma(accU, u0f, xv.x, xv.y);
        att_mma(accU, u1f, xv.z, xv.w);
      }
    }
    // the slot is read (gemvt_issue fences each lane's reads before its copies): the unit S further on
    if (i + S < n) gemvt_issue(w, N, K, r0, rows, P, ppg, u + S, myRing + s * slotBytes, rowStride, &myBars[s], GLU, lane);
  }
  if (n > 0) GEMVT_FLUSH(gcur);
#undef GEMVT_FLUSH
  __syncthreads(); // every partial sum is in part
  // groups split between warps: their partial sums in warp order
  for (int e = threadIdx.x; e < (rows + 15) / 16 * 16; e += blockDim.x) {
    const int g = e >> 4, rr = e & 15;
    float v = 0.0f, up = 0.0f;
    int covering = 0;
    for (int q = 0; q < GEMVT_WARPS; q++) {
      const int q0 = q * U / GEMVT_WARPS, q1 = (q + 1) * U / GEMVT_WARPS;
      if (q0 >= q1 || q1 <= g * ppg || q0 >= (g + 1) * ppg) continue; // no unit of this group
      const float* const p = part + (q * 2 + (g == q0 / ppg ? 0 : 1)) * UR;
      v += p[rr];
      if (GLU) up += p[16 + rr];
      covering++;
    }
    if (covering > 1) gemvt_store(y, r0, rows, g, rr, v, up, GLU, act);
  }
#else
  __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(GEMVT_WARPS * 32, 1) k_gemvt_m1(const u16* w, const u16* x, u16* y, int N, int K,
    int rowsPerBlock, int partCols, int slots) {
  GemvIn in = GemvIn();
  in.x = x;
  gemvt_rows<0, false>(w, in, y, N, K, rowsPerBlock, partCols, slots, 0);
}

// addRmsnormMatmul at one row: y = rmsnorm(x + rScale r) · w^T and the new residual sum (block 0)
extern "C" __global__ void __launch_bounds__(GEMVT_WARPS * 32, 1) k_gemvt_norm_m1(const u16* w, const u16* x, const u16* r,
    float rScale, const void* nw, int nwdt, float eps, float off, u16* sum, u16* y, int N, int K, int rowsPerBlock,
    int partCols, int slots) {
  gemvt_rows<2, false>(w, gemv_norm_in(x, r, rScale, nw, nwdt, eps, off, sum), y, N, K, rowsPerBlock, partCols, slots, 0);
}

// addRmsnormGateUpGlu at one row: y [N] = glu(rmsnorm(x + rScale r) · w^T) over packed gate/up rows w [2N, K]
extern "C" __global__ void __launch_bounds__(GEMVT_WARPS * 32, 1) k_gemvt_normglu_m1(const u16* w, const u16* x, const u16* r,
    float rScale, const void* nw, int nwdt, float eps, float off, u16* sum, u16* y, int N, int K, int rowsPerBlock,
    int partCols, int slots, int act) {
  gemvt_rows<2, true>(w, gemv_norm_in(x, r, rScale, nw, nwdt, eps, off, sum), y, N, K, rowsPerBlock, partCols, slots, act);
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

/** dynamic shared memory a block: sm_90's 227 KiB a block less 4 KiB for the kernels' static arrays (the norm staging's) */
export const GEMVT_SHARED_BYTES = 232448 - 4096;
/**
 * a unit's columns at most: 256 by default, 16 rows of 512 bytes, 8 KB (the GLU twin takes half: 32
 * rows, the same bytes); $LLMTS_CUDA_GEMVT_PART_COLS for experiments
 */
const GEMVT_PART_COLS = envInt('LLMTS_CUDA_GEMVT_PART_COLS', 256, { min: 64, max: 2048, multipleOf: 64 });
/** slots a warp, at most */
const GEMVT_MAX_SLOTS = 8;

export interface GemvtLayout {
  grid: number;
  /** rows (GLU: outputs) a block, a multiple of 16 unless one block holds all N */
  rowsPerBlock: number;
  /** P: a unit's columns, a multiple of 32 (a row's last part may be shorter) */
  partCols: number;
  /** S: a warp's ring of units */
  slots: number;
  /** dynamic shared memory a block: the rings, their mbarriers, x, the partial sums */
  sharedBytes: number;
}

/**
 * How the bulk-streamed kernels cover N rows (glu: N outputs of packed gate/up rows [2N, K]) of
 * inner size K on smCount SMs: one block an SM over a contiguous run of rows (ceil(N / SMs) rounded
 * up to whole 16-row groups), units of the widest part (a multiple of 32 columns, at most
 * partTarget) for which every warp gets 3 slots within sharedBudget, else 2; no more slots than a
 * warp has units. Null where K rules it out or 2 slots do not fit. (The budget and the part are
 * parameters for the simulator's tests, which wrap small rings many times.)
 */
export function gemvtLayout(N: number, K: number, smCount: number, glu = false, sharedBudget = GEMVT_SHARED_BYTES,
    partTarget = GEMVT_PART_COLS / (glu ? 2 : 1)): GemvtLayout | null {
  if (!Number.isInteger(N) || N < 1 || !Number.isInteger(K) || K < 8 || K % 8 !== 0 || K > GEMVT_MAX_K) return null;
  const unitRows = glu ? 32 : 16;
  const rowsPerBlock = Math.ceil(Math.ceil(N / Math.max(1, smCount)) / 16) * 16;
  const fixed = K * 2 + GEMVT_WARPS * 2 * unitRows * 4; // x, the partial sums
  const slotBytes = (P: number) => unitRows * (2 * P + 16) + 8; // and its mbarrier
  const slotsFor = (P: number) => Math.floor((sharedBudget - fixed) / (GEMVT_WARPS * slotBytes(P)));
  const widest = Math.min(Math.floor(partTarget / 32) * 32, Math.ceil(K / 32) * 32);
  let P = 0;
  for (const want of [3, 2]) {
    for (let p = widest; p >= 32 && !P; p -= 32) if (slotsFor(p) >= want) P = p;
    if (P) break;
  }
  if (!P) return null;
  const unitsPerWarp = Math.ceil(Math.ceil(Math.min(rowsPerBlock, N) / 16) * Math.ceil(K / P) / GEMVT_WARPS);
  const slots = Math.max(1, Math.min(GEMVT_MAX_SLOTS, slotsFor(P), unitsPerWarp));
  return { grid: Math.ceil(N / rowsPerBlock), rowsPerBlock, partCols: P, slots, sharedBytes: GEMVT_WARPS * slots * slotBytes(P) + fixed };
}
