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

// FP8_WIDEN (LLMTS_CUDA_GEMV_DEFINES): how the GEMV widens its weights. 0: fp8x2_to_f32 (the
// conversion instructions); 1: integer ops alone, each byte's bits moved into an f32 of 2^-120 times
// its value (subnormal for e4m3 subnormals: exact without flush-to-zero, which NVRTC leaves off),
// the 2^120 applied to each chunk's sum (two factors of 2^60: exact, and no overflow).
#ifndef FP8_WIDEN
#define FP8_WIDEN 0
#endif

// a chunk's 16 e4m3 weights as f32 (FP8_WIDEN 1: times 2^-120)
__device__ __forceinline__ void fp8_widen16(const uint4& w, float* f) {
  const unsigned* u = (const unsigned*)&w;
  #pragma unroll
  for (int j = 0; j < 4; j++) {
#if FP8_WIDEN == 1
    const unsigned v = u[j];
    f[4 * j] = __uint_as_float(((v & 0x80u) << 24) | ((v & 0x7fu) << 20));
    f[4 * j + 1] = __uint_as_float(((v & 0x8000u) << 16) | ((v & 0x7f00u) << 12));
    f[4 * j + 2] = __uint_as_float(((v & 0x800000u) << 8) | ((v & 0x7f0000u) << 4));
    f[4 * j + 3] = __uint_as_float((v & 0x80000000u) | ((v & 0x7f000000u) >> 4));
#else
    fp8x2_to_f32(u[j] & 0xffffu, f[4 * j], f[4 * j + 1]);
    fp8x2_to_f32(u[j] >> 16, f[4 * j + 2], f[4 * j + 3]);
#endif
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
        // FP8_WIDEN 1: the 2^120 in two halves, so that no scale up to f32's largest overflows
        const float s = sr[(c << 4) >> colShift] * (FP8_WIDEN == 1 ? 1.152921504606847e18f : 1.0f);
        #pragma unroll
        for (int m = 0; m < MMAX; m++) {
          if (m < M) {
            const float d = fp8_dot16(f, gemv_ld_cached(xr + (i64)m * xch + 2 * c), gemv_ld_cached(xr + (i64)m * xch + 2 * c + 1));
            acc[m] += s * (FP8_WIDEN == 1 ? d * 1.152921504606847e18f : d); // 2^60 each
          }
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
export const FP8_KERNEL_NAMES = [...GEMV_FP8_KERNEL_NAMES, 'k_fp8_dequant'] as const;
export type GemvFp8KernelName = (typeof GEMV_FP8_KERNEL_NAMES)[number];

/** the most x rows the FP8 GEMV takes; more multiply the dequantized weights (cuBLASLt) */
export const GEMV_FP8_MAX_M = 8;
const UNROLL: Record<GemvFp8KernelName, number> = { k_gemv_fp8_m1: 8, k_gemv_fp8_m2: 8, k_gemv_fp8_m4: 8, k_gemv_fp8_m8: 4 };
/** blocks below which a launch takes more warps a row (so fewer rows a block, more blocks) */
const MIN_BLOCKS = 264;

/**
 * The FP8 GEMV launch for M rows of x over an [N, K] weight: the smallest kernel that holds M rows,
 * the fewest warps a row (1, 2, 4 or 8) that give each lane one pass of loads, then more while the
 * grid would be under MIN_BLOCKS (two blocks an SM of the H200) — more bytes in flight for the
 * small matrices; undefined where M or K rule it out.
 */
export function gemvFp8Choice(M: number, N: number, K: number): { kernel: GemvFp8KernelName; warpsPerRow: number; grid: number } | undefined {
  if (!Number.isInteger(M) || M < 1 || M > GEMV_FP8_MAX_M || !Number.isInteger(K) || K < 16 || K % 16 !== 0 || N < 1) return undefined;
  const kernel = GEMV_FP8_KERNEL_NAMES.find((k) => Number(k.slice('k_gemv_fp8_m'.length)) >= M)!;
  const chunks = K / 16;
  let wpr = 1;
  while (wpr < 8 && wpr * 32 * UNROLL[kernel] < chunks) wpr *= 2;
  while (wpr < 8 && Math.ceil(N / (8 / wpr)) < MIN_BLOCKS) wpr *= 2;
  return { kernel, warpsPerRow: wpr, grid: Math.ceil(N / (8 / wpr)) };
}
