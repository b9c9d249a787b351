// CUDA source of the FP8 (e4m3) weight kernels: y[M, N] = x[M, K] · (w[N, K] ⊙ scale)^T for decode
// shapes (M <= 8 rows, k_gemv_fp8_*), and the dequantization into bf16 that larger M multiply with
// cuBLASLt's bf16 GEMM (k_fp8_dequant). They follow GEMV_KERNEL_SOURCE in the 'gemv' module
// (kernels.ts), whose streaming loads (gemv_ld_stream, gemv_ld_cached) they use.
//
// The weight layout (cuda-fp8-weights.ts): e4m3 bytes, rows of K, and an f32 scale per row per
// 2^colShift columns (16 or more), [N, KB = ceil(K / 2^colShift)], which every checkpoint layout
// maps onto exactly (one scale a tensor or a row: one column of scales; blocks of a power-of-two
// width, such as 128 x 128: each row of a block repeats its scale).
//
// Why our own GEMV: a decode step reads every weight once, so at one row the product is a stream of
// the weight bytes, and FP8 halves them against bf16. One warp (or WPR warps) per output row; each
// lane streams 16-byte chunks (16 e4m3 values, inside one scale column since it is 16 or more wide) with
// UNR loads in flight, widens them exactly to f32 (sm_89+: cvt.rn.f16x2.e4m3x2, then f16 -> f32;
// elsewhere, and in the host warp simulator, the same values from the bits) and multiplies them by
// the matching 16 bf16 of each x row. A chunk's 16 products are summed in order, then scaled and
// added to the row's sum: every sum in f32, the scale applied once a chunk. Requirements (checked
// by cuda-fp8-weights.ts): K % 16 == 0, w rows and x 16-byte aligned, M <= 8.
//
// NaN bytes (0x7f, 0xff) are no weight a quantizer writes: the hardware widens them to NaN, the
// portable path to a finite value.

export const FP8_KERNEL_SOURCE = String.raw`
// two e4m3 values (the low byte first) as f32, exactly
__device__ __forceinline__ void fp8x2_to_f32(unsigned v, float& lo, float& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((unsigned short)v));
  lo = h2f((u16)(h & 0xffffu));
  hi = h2f((u16)(h >> 16));
#else
  // an e4m3 byte's sign, exponent and mantissa moved into f16 bits: the f16 of value 2^-8 times the
  // e4m3 value (exponent bias 15 against 7; subnormals included), so times 256 is it exactly
  lo = h2f((u16)(((v & 0x80u) << 8) | ((v & 0x7fu) << 7))) * 256.0f;
  hi = h2f((u16)((v & 0x8000u) | ((v & 0x7f00u) >> 1))) * 256.0f;
#endif
}

// a chunk's 16 e4m3 weights as f32
__device__ __forceinline__ void fp8_widen16(const uint4& w, float* f) {
  const unsigned* u = (const unsigned*)&w;
  #pragma unroll
  for (int j = 0; j < 4; j++) {
    fp8x2_to_f32(u[j] & 0xffffu, f[4 * j], f[4 * j + 1]);
    fp8x2_to_f32(u[j] >> 16, f[4 * j + 2], f[4 * j + 3]);
  }
}

// sum over 16 k, in order, of f[k] times the bf16 x values in xa (k 0..7) and xb (k 8..15)
__device__ __forceinline__ float fp8_dot16(const float* f, const uint4& xa, const uint4& xb) {
  const unsigned* a = (const unsigned*)&xa;
  const unsigned* b = (const unsigned*)&xb;
  float s = 0.0f;
  #pragma unroll
  for (int k = 0; k < 4; k++) {
    s += f[2 * k] * __uint_as_float(a[k] << 16);
    s += f[2 * k + 1] * __uint_as_float(a[k] & 0xffff0000u);
  }
  #pragma unroll
  for (int k = 0; k < 4; k++) {
    s += f[8 + 2 * k] * __uint_as_float(b[k] << 16);
    s += f[8 + 2 * k + 1] * __uint_as_float(b[k] & 0xffff0000u);
  }
  return s;
}

// WPR warps share one output row (each takes a contiguous 1/WPR of its chunks; shared memory adds
// their sums in warp order). y = sum (+ bias[n], bias dtype bdt, or bdt < 0: none), stored in ydt.
template <int MMAX, int UNR>
__device__ __forceinline__ void gemv_fp8_rows(const unsigned char* __restrict__ w, const float* __restrict__ scales, int KB, int colShift,
                                              const u16* __restrict__ x, const void* bias, int bdt, void* y, int ydt,
                                              int M, int N, int K, int WPR) {
  __shared__ float red[8][MMAX];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n = blockIdx.x * (8 / WPR) + warp / WPR;
  const int part = warp % WPR;
  const int nch = K >> 4, xch = K >> 3;
  const int per = (nch + WPR - 1) / WPR;
  const int cBegin = part * per;
  const int cEnd = n < N ? min(nch, cBegin + per) : cBegin; // rows past N: no chunks, same barriers
  const i64 row = n < N ? n : 0;
  const uint4* wr = (const uint4*)(w + row * K);
  const float* sr = scales + row * KB;
  const uint4* xr = (const uint4*)x;
  float acc[MMAX];
  #pragma unroll
  for (int m = 0; m < MMAX; m++) acc[m] = 0.0f;
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
    }
    #pragma unroll
    for (int u = 0; u < UNR; u++) {
      const int c = c0 + u * 32 + lane;
      if (c < cEnd) {
        float f[16];
        fp8_widen16(wv[u], f);
        const float s = sr[(c << 4) >> colShift];
        #pragma unroll
        for (int m = 0; m < MMAX; m++) {
          if (m < M) acc[m] += s * fp8_dot16(f, gemv_ld_cached(xr + (i64)m * xch + 2 * c), gemv_ld_cached(xr + (i64)m * xch + 2 * c + 1));
        }
      }
    }
  }
  #pragma unroll
  for (int m = 0; m < MMAX; m++) acc[m] = warp_sum(acc[m]);
  if (WPR > 1) {
    if (lane == 0) {
      #pragma unroll
      for (int m = 0; m < MMAX; m++) red[warp][m] = acc[m];
    }
    __syncthreads();
    #pragma unroll
    for (int m = 0; m < MMAX; m++) {
      float v = 0.0f;
      for (int p = 0; p < WPR; p++) v += red[warp - part + p][m];
      acc[m] = v;
    }
  }
  if (part != 0 || lane != 0 || n >= N) return;
  const float b = bdt >= 0 ? ld(bias, bdt, n) : 0.0f;
  #pragma unroll
  for (int m = 0; m < MMAX; m++) if (m < M) st(y, ydt, (i64)m * N + n, acc[m] + b);
}

#define GEMV_FP8_KERNEL(MMAX, UNR) \
extern "C" __global__ void __launch_bounds__(256) k_gemv_fp8_m##MMAX(const unsigned char* w, const float* scales, int KB, \
    int colShift, const u16* x, const void* bias, int bdt, void* y, int ydt, int M, int N, int K, int WPR) { \
  gemv_fp8_rows<MMAX, UNR>(w, scales, KB, colShift, x, bias, bdt, y, ydt, M, N, K, WPR); \
}
GEMV_FP8_KERNEL(1, 8)
GEMV_FP8_KERNEL(2, 8)
GEMV_FP8_KERNEL(4, 8)
GEMV_FP8_KERNEL(8, 4)

// The persistent, software-pipelined twin (k_gemvp_fp8_*): a grid of at most a few blocks an SM
// whose warps each take rows gw, gw + W, ... (W warps in all), a row in passes of 32 UNR chunks, the
// next pass's loads issued before this pass's arithmetic. Why: the one-shot kernel's blocks run as
// one wave that loads, then widens and multiplies while the memory idles; here loading and
// arithmetic overlap across passes and rows. A lane sums the same chunks in the same order as the
// one-shot kernel at one warp a row: the same bits.
template <int MMAX, int UNR>
__device__ __forceinline__ void gemvp_fp8_rows(const unsigned char* __restrict__ w, const float* __restrict__ scales, int KB,
                                               int colShift, const u16* __restrict__ x, const void* bias, int bdt, void* y,
                                               int ydt, int M, int N, int K) {
  const int lane = threadIdx.x & 31;
  const int gw = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), W = gridDim.x * (blockDim.x >> 5);
  const int nch = K >> 4, xch = K >> 3;
  const int passes = (nch + 32 * UNR - 1) / (32 * UNR);
  const int rows = gw < N ? (N - 1 - gw) / W + 1 : 0;
  const i64 items = (i64)rows * passes;
  const uint4* xr = (const uint4*)x;
  uint4 cur[UNR], nxt[UNR];
  #pragma unroll
  for (int u = 0; u < UNR; u++) {
    const int c = u * 32 + lane;
    cur[u] = items > 0 && c < nch ? gemv_ld_stream((const uint4*)(w + (i64)gw * K) + c) : make_uint4(0u, 0u, 0u, 0u);
  }
  PDL_ENTRY();
  float acc[MMAX];
  #pragma unroll
  for (int m = 0; m < MMAX; m++) acc[m] = 0.0f;
  for (i64 it = 0; it < items; it++) {
    const int n = gw + (int)(it / passes) * W, p = (int)(it % passes);
    if (it + 1 < items) {
      const int n1 = gw + (int)((it + 1) / passes) * W, p1 = (int)((it + 1) % passes);
      #pragma unroll
      for (int u = 0; u < UNR; u++) {
        const int c = p1 * 32 * UNR + u * 32 + lane;
        nxt[u] = c < nch ? gemv_ld_stream((const uint4*)(w + (i64)n1 * K) + c) : make_uint4(0u, 0u, 0u, 0u);
      }
    }
    const float* sr = scales + (i64)n * KB;
    #pragma unroll
    for (int u = 0; u < UNR; u++) {
      const int c = p * 32 * UNR + u * 32 + lane;
      if (c < nch) {
        float f[16];
        fp8_widen16(cur[u], f);
        const float s = sr[(c << 4) >> colShift];
        #pragma unroll
        for (int m = 0; m < MMAX; m++) {
          if (m < M) acc[m] += s * fp8_dot16(f, gemv_ld_cached(xr + (i64)m * xch + 2 * c), gemv_ld_cached(xr + (i64)m * xch + 2 * c + 1));
        }
      }
    }
    if (p == passes - 1) {
      #pragma unroll
      for (int m = 0; m < MMAX; m++) {
        const float v = warp_sum(acc[m]);
        acc[m] = 0.0f;
        if (lane == 0 && m < M) st(y, ydt, (i64)m * N + n, v + (bdt >= 0 ? ld(bias, bdt, n) : 0.0f));
      }
    }
    #pragma unroll
    for (int u = 0; u < UNR; u++) cur[u] = nxt[u];
  }
}

#define GEMVP_FP8_KERNEL(MMAX, UNR) \
extern "C" __global__ void __launch_bounds__(256) k_gemvp_fp8_m##MMAX(const unsigned char* w, const float* scales, int KB, \
    int colShift, const u16* x, const void* bias, int bdt, void* y, int ydt, int M, int N, int K, int WPR) { \
  (void)WPR; \
  gemvp_fp8_rows<MMAX, UNR>(w, scales, KB, colShift, x, bias, bdt, y, ydt, M, N, K); \
}
GEMVP_FP8_KERNEL(1, 4)
GEMVP_FP8_KERNEL(2, 4)
GEMVP_FP8_KERNEL(4, 4)
GEMVP_FP8_KERNEL(8, 2)

// out[N, K] = bf16(f32(w) * scale), four values a thread: what the checkpoint loader's bf16
// dequantization stores (one f32 multiply, then round to nearest even), so a product of more rows
// multiplies the same bf16 weights the dequantized model has. K % 4 == 0.
extern "C" __global__ void k_fp8_dequant(const unsigned char* w, const float* scales, int KB, int colShift, u16* out, i64 N, int K) {
  const i64 quads = N * (i64)(K >> 2);
  GRID_STRIDE(i, quads) {
    const i64 e = i * 4;
    const i64 n = e / K;
    const int k = (int)(e - n * K);
    const float s = scales[n * KB + (k >> colShift)];
    const unsigned v = ((const unsigned*)w)[i];
    float f[4];
    fp8x2_to_f32(v & 0xffffu, f[0], f[1]);
    fp8x2_to_f32(v >> 16, f[2], f[3]);
    unsigned* o = (unsigned*)out + 2 * i;
    o[0] = (unsigned)f2bf(f[0] * s) | ((unsigned)f2bf(f[1] * s) << 16);
    o[1] = (unsigned)f2bf(f[2] * s) | ((unsigned)f2bf(f[3] * s) << 16);
  }
}
`;

/** the FP8 decode GEMVs, by the most x rows each takes (1, 2, 4, 8) */
export const GEMV_FP8_KERNEL_NAMES = ['k_gemv_fp8_m1', 'k_gemv_fp8_m2', 'k_gemv_fp8_m4', 'k_gemv_fp8_m8'] as const;
/** their persistent, pipelined twins (same arguments; one warp a row; grid gemvpFp8Grid) */
export const GEMVP_FP8_KERNEL_NAMES = ['k_gemvp_fp8_m1', 'k_gemvp_fp8_m2', 'k_gemvp_fp8_m4', 'k_gemvp_fp8_m8'] as const;
export const FP8_KERNEL_NAMES = [...GEMV_FP8_KERNEL_NAMES, ...GEMVP_FP8_KERNEL_NAMES, 'k_fp8_dequant'] as const;
export type GemvFp8KernelName = (typeof GEMV_FP8_KERNEL_NAMES)[number] | (typeof GEMVP_FP8_KERNEL_NAMES)[number];

/** the most x rows the FP8 GEMV takes; more multiply the dequantized weights (cuBLASLt) */
export const GEMV_FP8_MAX_M = 8;
const UNROLL: Record<(typeof GEMV_FP8_KERNEL_NAMES)[number], number> = { k_gemv_fp8_m1: 8, k_gemv_fp8_m2: 8, k_gemv_fp8_m4: 8, k_gemv_fp8_m8: 4 };
/** resident blocks an SM the persistent grid is sized for */
export const GEMVP_FP8_BLOCKS_PER_SM = 3;
/** blocks below which a launch takes more warps a row (so fewer rows a block, more blocks) */
const MIN_BLOCKS = 264;

/**
 * The FP8 GEMV launch for M rows of x over an [N, K] weight; undefined where M or K rule it out.
 * One-shot (`persistent` false): the smallest kernel that holds M rows, the fewest warps a row (1,
 * 2, 4 or 8) that give each lane one pass of loads, then more while the grid would be under
 * MIN_BLOCKS (two blocks an SM of the H200) — more bytes in flight for the small matrices.
 * Persistent: its pipelined twin at one warp a row, min(row groups, GEMVP_FP8_BLOCKS_PER_SM x
 * smCount) blocks.
 */
export function gemvFp8Choice(M: number, N: number, K: number, persistent = false, smCount = 132):
  { kernel: GemvFp8KernelName; warpsPerRow: number; grid: number } | undefined {
  if (!Number.isInteger(M) || M < 1 || M > GEMV_FP8_MAX_M || !Number.isInteger(K) || K < 16 || K % 16 !== 0 || N < 1) return undefined;
  const i = GEMV_FP8_KERNEL_NAMES.findIndex((k) => Number(k.slice('k_gemv_fp8_m'.length)) >= M);
  if (persistent) return { kernel: GEMVP_FP8_KERNEL_NAMES[i]!, warpsPerRow: 1, grid: Math.min(Math.ceil(N / 8), GEMVP_FP8_BLOCKS_PER_SM * smCount) };
  const kernel = GEMV_FP8_KERNEL_NAMES[i]!;
  const chunks = K / 16;
  let wpr = 1;
  while (wpr < 8 && wpr * 32 * UNROLL[kernel] < chunks) wpr *= 2;
  while (wpr < 8 && Math.ceil(N / (8 / wpr)) < MIN_BLOCKS) wpr *= 2;
  return { kernel, warpsPerRow: wpr, grid: Math.ceil(N / (8 / wpr)) };
}
