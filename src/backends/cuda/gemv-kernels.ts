// CUDA source of the skinny-GEMM ("GEMV") kernels: y[M, N] = x[M, K] · w[N, K]^T, bf16 in and out,
// f32 accumulation, for decode shapes (M <= 8 rows). Its own NVRTC module (KERNEL_MODULES in
// kernels.ts) after KERNEL_PRELUDE's helpers (bf2f, f2bf, u16, i64).
//
// Why our own: a decode step reads every weight once, so a decode GEMM is a pure memory stream.
// cuBLASLt's best algorithm for M = 1 read the 8B model's q/k/v (50 MB) and o (33 MB) weights at
// 2.2-2.5 TB/s on the H200 (copy bandwidth 4.3 TB/s). These kernels are offered to the GEMM tuner
// (gemm.ts) as extra candidates next to cuBLASLt's algorithms and are used only for the shapes where
// they time faster with the weights streaming from HBM.
//
// Layout: one warp per output row n. Each lane streams 16-byte chunks (8 bf16) of w's row n with
// UNR independent loads in flight (the loads bypass L1: every weight byte is read once), and reads
// the matching chunk of each x row through the read-only path (x is small and shared by every
// warp, so it stays in L1/L2). Requirements (checked by gemm.ts): K % 8 == 0 and w, x 16-byte
// aligned. Rows of x beyond M are never read; M <= MMAX.
export const GEMV_KERNEL_SOURCE = String.raw`
// (without __CUDA_ARCH__: plain loads, for the host warp simulator of test/backends/cuda-sim)
__device__ __forceinline__ uint4 gemv_ld_stream(const uint4* p) {
#ifdef __CUDA_ARCH__
  uint4 v;
  // volatile: kept in program order before PDL_ENTRY's volatile wait (a plain asm may be sunk past it)
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
#else
  return *p;
#endif
}

__device__ __forceinline__ uint4 gemv_ld_cached(const uint4* p) {
#ifdef __CUDA_ARCH__
  uint4 v;
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
#else
  return *p;
#endif
}

__device__ __forceinline__ float gemv_dot8(const uint4& a, const uint4& b) {
  const unsigned* ua = (const unsigned*)&a;
  const unsigned* ub = (const unsigned*)&b;
  float s = 0.0f;
  #pragma unroll
  for (int k = 0; k < 4; k++) {
    s += __uint_as_float(ua[k] << 16) * __uint_as_float(ub[k] << 16);
    s += __uint_as_float(ua[k] & 0xffff0000u) * __uint_as_float(ub[k] & 0xffff0000u);
  }
  return s;
}

// What the GEMV multiplies by w (MODE 0: x itself; 1: the GLU of packed gate/up rows, as
// k_glu_packed makes it; 2: add + rmsnorm of x and r, as k_add_rmsnorm makes it), so a fused path
// multiplies the same bf16 values the unfused one reads.
struct GemvIn {
  const u16* x;     // [M, K]; MODE 1: packed gate/up rows [M, 2K]
  int act;          // MODE 1: ACT_* of the gate
  const u16* r;     // MODE 2: the residual branch [M, K], added as x + rScale r
  const void* nw;   // MODE 2: the norm weight [K] (nwdt), applied as (off + nw)
  int nwdt;
  float rScale, eps, off;
  u16* sum;         // MODE 2: where block 0 stores bf16(x + rScale r) [M, K] (the new residual)
};

// chunk c (8 values) of row m of what the GEMV multiplies; inv: MODE 2's 1 / rms of row m
template <int MODE>
__device__ __forceinline__ uint4 gemv_x(const GemvIn& in, int nch, int m, int c, float inv) {
  const uint4* xr = (const uint4*)in.x;
  if (MODE == 0) return gemv_ld_cached(xr + (i64)m * nch + c);
  uint4 o;
  unsigned* o2 = (unsigned*)&o;
  if (MODE == 1) {
    const uint4 gv = gemv_ld_cached(xr + (i64)m * 2 * nch + c), uv = gemv_ld_cached(xr + (i64)m * 2 * nch + nch + c);
    const unsigned* g2 = (const unsigned*)&gv;
    const unsigned* u2 = (const unsigned*)&uv;
    #pragma unroll
    for (int k = 0; k < 4; k++) {
      const float lo = activate(__uint_as_float(g2[k] << 16), in.act) * __uint_as_float(u2[k] << 16);
      const float hi = activate(__uint_as_float(g2[k] & 0xffff0000u), in.act) * __uint_as_float(u2[k] & 0xffff0000u);
      o2[k] = (unsigned)f2bf(lo) | ((unsigned)f2bf(hi) << 16);
    }
    return o;
  }
  const uint4 xv = gemv_ld_cached(xr + (i64)m * nch + c), rv = gemv_ld_cached((const uint4*)in.r + (i64)m * nch + c);
  const unsigned* x2 = (const unsigned*)&xv;
  const unsigned* r2 = (const unsigned*)&rv;
  #pragma unroll
  for (int k = 0; k < 4; k++) {
    const float slo = bf2f(f2bf(__uint_as_float(x2[k] << 16) + in.rScale * __uint_as_float(r2[k] << 16)));
    const float shi = bf2f(f2bf(__uint_as_float(x2[k] & 0xffff0000u) + in.rScale * __uint_as_float(r2[k] & 0xffff0000u)));
    const float lo = slo * inv * (in.off + ld(in.nw, in.nwdt, c * 8 + 2 * k));
    const float hi = shi * inv * (in.off + ld(in.nw, in.nwdt, c * 8 + 2 * k + 1));
    o2[k] = (unsigned)f2bf(lo) | ((unsigned)f2bf(hi) << 16);
  }
  return o;
}

// MODE 2, by the whole block once its weight loads are in flight: every row's 1 / rms (each block
// recomputes it from x and r, which stay in L2), block 0 storing the new residual.
template <int MMAX>
__device__ __forceinline__ void gemv_norm_rows(const GemvIn& in, int M, int nch, int K, float* inv) {
  __shared__ float part[8][MMAX];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float ss[MMAX];
  #pragma unroll
  for (int m = 0; m < MMAX; m++) ss[m] = 0.0f;
  for (int c = threadIdx.x; c < nch; c += blockDim.x) {
    #pragma unroll
    for (int m = 0; m < MMAX; m++) {
      if (m >= M) continue;
      const uint4 xv = gemv_ld_cached((const uint4*)in.x + (i64)m * nch + c);
      const uint4 rv = gemv_ld_cached((const uint4*)in.r + (i64)m * nch + c);
      const unsigned* x2 = (const unsigned*)&xv;
      const unsigned* r2 = (const unsigned*)&rv;
      uint4 o;
      unsigned* o2 = (unsigned*)&o;
      #pragma unroll
      for (int k = 0; k < 4; k++) {
        const u16 lo = f2bf(__uint_as_float(x2[k] << 16) + in.rScale * __uint_as_float(r2[k] << 16));
        const u16 hi = f2bf(__uint_as_float(x2[k] & 0xffff0000u) + in.rScale * __uint_as_float(r2[k] & 0xffff0000u));
        ss[m] += bf2f(lo) * bf2f(lo) + bf2f(hi) * bf2f(hi);
        o2[k] = (unsigned)lo | ((unsigned)hi << 16);
      }
      if (blockIdx.x == 0) ((uint4*)in.sum)[(i64)m * nch + c] = o;
    }
  }
  #pragma unroll
  for (int m = 0; m < MMAX; m++) {
    float v = ss[m];
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) part[warp][m] = v;
  }
  __syncthreads();
  #pragma unroll
  for (int m = 0; m < MMAX; m++) {
    float v = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) v += part[w][m];
    inv[m] = rsqrtf(v / (float)K + in.eps);
  }
}

// WPR warps share one output row (each takes a contiguous 1/WPR of its chunks; shared memory adds
// their sums), so a lane holds at most UNR chunks of a row up to K = WPR * 32 * UNR * 8 and issues
// all its weight loads at once. Weights are loaded before PDL_ENTRY: they do not depend on the
// kernel before, so with programmatic dependent launch their fetch overlaps that kernel's tail
// (and MODE 2's norm pass).
template <int MMAX, int UNR, int MODE>
__device__ __forceinline__ void gemv_rows(const u16* __restrict__ w, const GemvIn& in, u16* __restrict__ y,
                                          int M, int N, int K, int WPR) {
  __shared__ float red[8][MMAX];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n = blockIdx.x * (8 / WPR) + warp / WPR;
  const int part = warp % WPR;
  const int nch = K >> 3;
  const int per = (nch + WPR - 1) / WPR;
  const int cBegin = part * per;
  const int cEnd = n < N ? min(nch, cBegin + per) : cBegin; // rows past N: no chunks, same barriers
  const uint4* wr = (const uint4*)(w + (i64)(n < N ? n : 0) * K);
  float acc[MMAX], inv[MMAX];
  #pragma unroll
  for (int m = 0; m < MMAX; m++) {
    acc[m] = 0.0f;
    inv[m] = 1.0f;
  }
  bool waited = false;
  for (int c0 = cBegin; c0 < cEnd || !waited; c0 += 32 * UNR) {
    uint4 wv[UNR];
    #pragma unroll
    for (int u = 0; u < UNR; u++) {
      const int c = c0 + u * 32 + lane;
      if (c < cEnd) wv[u] = gemv_ld_stream(wr + c);
      else wv[u] = make_uint4(0u, 0u, 0u, 0u);
    }
    if (!waited) {
      PDL_ENTRY();
      waited = true;
      if (MODE == 2) gemv_norm_rows<MMAX>(in, M, nch, K, inv);
    }
    #pragma unroll
    for (int u = 0; u < UNR; u++) {
      const int c = c0 + u * 32 + lane;
      if (c < cEnd) {
        #pragma unroll
        for (int m = 0; m < MMAX; m++) {
          if (m < M) acc[m] += gemv_dot8(wv[u], gemv_x<MODE>(in, nch, m, c, inv[m]));
        }
      }
    }
  }
  #pragma unroll
  for (int m = 0; m < MMAX; m++) {
    float v = acc[m];
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    acc[m] = v;
  }
  if (WPR == 1) {
    if (lane == 0 && n < N) {
      #pragma unroll
      for (int m = 0; m < MMAX; m++) if (m < M) y[(i64)m * N + n] = f2bf(acc[m]);
    }
    return;
  }
  if (lane == 0) {
    #pragma unroll
    for (int m = 0; m < MMAX; m++) red[warp][m] = acc[m];
  }
  __syncthreads();
  if (part == 0 && lane == 0 && n < N) {
    #pragma unroll
    for (int m = 0; m < MMAX; m++) {
      if (m < M) {
        float v = 0.0f;
        for (int p = 0; p < WPR; p++) v += red[warp + p][m];
        y[(i64)m * N + n] = f2bf(v);
      }
    }
  }
}

#define GEMV_KERNEL(MMAX, UNR) \
extern "C" __global__ void __launch_bounds__(256) k_gemv_m##MMAX##_u##UNR(const u16* w, const u16* x, u16* y, \
    int M, int N, int K, int WPR) { \
  GemvIn in; \
  in.x = x; \
  gemv_rows<MMAX, UNR, 0>(w, in, y, M, N, K, WPR); \
} \
extern "C" __global__ void __launch_bounds__(256) k_gemv_glu_m##MMAX##_u##UNR(const u16* w, const u16* gu, u16* y, \
    int M, int N, int K, int WPR, int act) { \
  GemvIn in; \
  in.x = gu; \
  in.act = act; \
  gemv_rows<MMAX, UNR, 1>(w, in, y, M, N, K, WPR); \
} \
extern "C" __global__ void __launch_bounds__(256) k_gemv_norm_m##MMAX##_u##UNR(const u16* w, const u16* x, \
    const u16* r, float rScale, const void* nw, int nwdt, float eps, float off, u16* sum, u16* y, int M, int N, int K, \
    int WPR) { \
  GemvIn in; \
  in.x = x; \
  in.r = r; \
  in.rScale = rScale; \
  in.nw = nw; \
  in.nwdt = nwdt; \
  in.eps = eps; \
  in.off = off; \
  in.sum = sum; \
  gemv_rows<MMAX, UNR, 2>(w, in, y, M, N, K, WPR); \
}
GEMV_KERNEL(1, 16)
GEMV_KERNEL(2, 16)
GEMV_KERNEL(4, 8)
GEMV_KERNEL(8, 4)
`;

export const GEMV_KERNEL_NAMES = ['k_gemv_m1_u16', 'k_gemv_m2_u16', 'k_gemv_m4_u8', 'k_gemv_m8_u4'] as const;
/** the same kernels with the GLU of packed gate/up rows fused into their x (gluMatmul) */
export const GEMV_GLU_KERNEL_NAMES = ['k_gemv_glu_m1_u16', 'k_gemv_glu_m2_u16', 'k_gemv_glu_m4_u8', 'k_gemv_glu_m8_u4'] as const;
/** the same kernels with add + rmsnorm fused into their x (addRmsnormMatmul) */
export const GEMV_NORM_KERNEL_NAMES = ['k_gemv_norm_m1_u16', 'k_gemv_norm_m2_u16', 'k_gemv_norm_m4_u8', 'k_gemv_norm_m8_u4'] as const;

export type GemvKernelName = (typeof GEMV_KERNEL_NAMES)[number];

/** threads per block: 8 warps */
export const GEMV_THREADS = 256;
export const GEMV_MAX_M = 8;

const VARIANTS: { name: GemvKernelName; mmax: number; unroll: number }[] = [
  { name: 'k_gemv_m1_u16', mmax: 1, unroll: 16 }, { name: 'k_gemv_m2_u16', mmax: 2, unroll: 16 },
  { name: 'k_gemv_m4_u8', mmax: 4, unroll: 8 }, { name: 'k_gemv_m8_u4', mmax: 8, unroll: 4 },
];

/** One way to run a GEMV: the kernel and how many warps share an output row (1, 2, 4 or 8). */
export interface GemvChoice {
  kernel: GemvKernelName;
  warpsPerRow: number;
}

export function gemvLabel(c: GemvChoice): string {
  return `${c.kernel}/w${c.warpsPerRow}`;
}

/**
 * The GEMV launches that can compute an M-row product with inner size K (none when M or K rule them
 * out): the smallest kernel that holds M rows, with the fewest warps per row that give each lane one
 * pass of loads, and twice that.
 */
export function gemvCandidates(M: number, K: number): GemvChoice[] {
  if (M < 1 || M > GEMV_MAX_M || K < 8 || K % 8 !== 0) return [];
  const v = VARIANTS.find((x) => x.mmax >= M)!;
  const chunks = K / 8;
  let wpr = 1;
  while (wpr < 8 && wpr * 32 * v.unroll < chunks) wpr *= 2;
  return [...new Set([wpr, Math.min(8, wpr * 2)])].map((w) => ({ kernel: v.name, warpsPerRow: w }));
}

/** grid x of a GEMV launch over N output rows */
export function gemvGrid(N: number, warpsPerRow: number): number {
  return Math.ceil(N / (GEMV_THREADS / 32 / warpsPerRow));
}
