// CUDA source of the FP8 (e4m3) weight kernels: y[M, N] = x[M, K] · (w[N, K] ⊙ scale)^T for decode
// shapes (the CUDA-core k_gemv_fp8_m* to M 8, the tensor-core k_gemv_fp8_tc_n* to M 16), and the dequantization into bf16 that larger M multiply with
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

import { GEMV_THREADS } from './gemv-kernels.ts';

/** the most warps a tensor-core GEMV block takes (its shared sums are sized for them) */
export const GEMV_FP8_TC_MAX_WARPS = 16;

export const FP8_KERNEL_SOURCE = String.raw`
#define GEMV_FP8_TC_MAX_WARPS ${GEMV_FP8_TC_MAX_WARPS}
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

// The tensor-core GEMV (k_gemv_fp8_tc_n*): y^T = (w ⊙ scale) · x^T as mma.sync m16n8k16 tiles with
// the weights as the 16-row A operand and x as the 8-column B operand (NT tiles of 8 x rows), so
// the multiplies run on the tensor cores and the CUDA cores only widen bytes. Why: the CUDA-core
// kernel above is bound by its conversions (cvt.f16x2.e4m3x2 and f16 -> f32 run at a quarter of
// the FMA rate), and at 8 rows its FMAs cost three bf16 decode steps.
//
// A block is 4, 8 or 16 warps over the same 16 weight rows, each warp a share of the 64-column chunks; a
// lane of fragment row g (lane / 4) and column group q (lane % 4) loads 16 bytes of rows g and g + 8
// and the 16 bf16 of x row 8t + g at columns 64c + 16q .. + 16. The dot product does not care in
// which order its k run, so mma step s takes the lanes' bytes 4s .. 4s + 3 as its k 2q, 2q + 1,
// 2q + 8, 2q + 9, for A and B alike: the loads stay 16-byte vectors. Bytes widen exactly to bf16:
// an e4m3 byte's magnitude bits moved under bf16's exponent and mantissa make the bf16 of 2^-120
// times its value (subnormals too), and one bf16x2 multiply by 2^120 makes it exact. A chunk's
// product (f32 in the tensor core) is scaled once (a scale covers 64 columns or more: colShift >= 6)
// and added to the lane's sums; the warps' sums meet in shared memory in warp order.
// Each element of y sums its own row and column only, in an order fixed by K: a row of x gets the
// same bits at any M and with either tile count. Requirements (cuda-fp8-weights.ts): K % 16 == 0,
// colShift >= 6, w rows and x 16-byte aligned, M <= 8 NT.

// e4m3 bytes 0, 1 (lo) or 2, 3 (hi) of v as a bf16x2, the first in the low half, exactly
__device__ __forceinline__ unsigned fp8x2_to_bf16x2(unsigned v, bool hi) {
  // each byte to the top of its 16-bit half (prmt; the selector's 4s pick zero bytes)
#if defined(__CUDA_ARCH__)
  const unsigned p = __byte_perm(v, 0u, hi ? 0x3424u : 0x1404u);
#else
  const unsigned p = hi ? ((v >> 8) & 0xff00u) | (v & 0xff000000u) : ((v & 0xffu) << 8) | ((v & 0xff00u) << 16);
#endif
  // sign kept at bit 15 (31), the 7 magnitude bits down to bits 10..4 (26..20): the bf16 bits of
  // 2^-120 times the value
  const unsigned t = ((p >> 4) & 0x07f007f0u) | (p & 0x80008000u);
#if defined(__CUDA_ARCH__)
  unsigned r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(t), "r"(0x7b807b80u), "r"(0x80008000u)); // * 2^120 + (-0)
  return r;
#else
  auto up = [](unsigned b) { return (unsigned)((__float_as_uint(__uint_as_float(b << 16) * 0x1p120f)) >> 16); };
  return up(t & 0xffffu) | (up(t >> 16) << 16);
#endif
}

// chunks a pass of loads takes (two tiles of x rows hold twice the x registers: half as many)
#ifndef FP8_TC_UNR
#define FP8_TC_UNR 4
#endif
#ifndef FP8_TC_UNR_N2
#define FP8_TC_UNR_N2 2
#endif

// 16 bytes of x, the previous kernel's output: a volatile, coherent load (not ld.global.nc, which
// declares the data unchanging for the kernel's life, nor a plain asm, which the compiler may move
// ahead of PDL_ENTRY's wait)
__device__ __forceinline__ uint4 fp8_ld_x(const uint4* p) {
#ifdef __CUDA_ARCH__
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
#else
  return *p;
#endif
}

template <int NT, int UNR>
__device__ __forceinline__ void gemv_fp8_tc(const unsigned char* __restrict__ w, const float* __restrict__ scales, int KB, int colShift,
                                            const u16* __restrict__ x, const void* bias, int bdt, void* y, int ydt,
                                            int M, int N, int K) {
  __shared__ float red[GEMV_FP8_TC_MAX_WARPS - 1][32][4 * NT];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int n0 = blockIdx.x * 16;
  const bool v0 = n0 + g < N, v1 = n0 + g + 8 < N;
  const i64 row0 = v0 ? n0 + g : 0, row1 = v1 ? n0 + g + 8 : 0;
  const int nch = (K + 63) >> 6;
  const int per = (nch + warps - 1) / warps;
  const int cBegin = warp * per, cEnd = min(nch, cBegin + per);
  const int shift = colShift - 6;
  const unsigned char* w0 = w + row0 * K + 16 * q;
  const unsigned char* w1 = w + row1 * K + 16 * q;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  float acc[NT][4];
  #pragma unroll
  for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
  bool waited = false;
  for (int c0 = cBegin; c0 < cEnd || !waited; c0 += UNR) {
    uint4 wa[UNR], wb[UNR];
    #pragma unroll
    for (int u = 0; u < UNR; u++) {
      const int c = c0 + u;
      const bool in = c < cEnd && 64 * c + 16 * q < K;
      wa[u] = in && v0 ? gemv_ld_stream((const uint4*)(w0 + 64 * (i64)c)) : zero;
      wb[u] = in && v1 ? gemv_ld_stream((const uint4*)(w1 + 64 * (i64)c)) : zero;
    }
    if (!waited) {
      PDL_ENTRY();
      waited = true;
    }
    // every x load of the pass in flight before the first multiply waits on one
    uint4 xv[UNR][NT][2];
    #pragma unroll
    for (int u = 0; u < UNR; u++) {
      const int col = 64 * (c0 + u) + 16 * q;
      const bool in = c0 + u < cEnd && col < K;
      #pragma unroll
      for (int t = 0; t < NT; t++) {
        const int m = 8 * t + g;
        const uint4* xr = (const uint4*)(x + (i64)m * K + col);
        xv[u][t][0] = in && m < M ? fp8_ld_x(xr) : zero;
        xv[u][t][1] = in && m < M ? fp8_ld_x(xr + 1) : zero;
      }
    }
    #pragma unroll
    for (int u = 0; u < UNR; u++) {
      const int c = c0 + u;
      if (c >= cEnd) continue;
      float part[NT][4];
      #pragma unroll
      for (int t = 0; t < NT; t++) part[t][0] = part[t][1] = part[t][2] = part[t][3] = 0.0f;
      const unsigned* a0 = (const unsigned*)&wa[u];
      const unsigned* a1 = (const unsigned*)&wb[u];
      #pragma unroll
      for (int s = 0; s < 4; s++) {
        const unsigned a[4] = { fp8x2_to_bf16x2(a0[s], false), fp8x2_to_bf16x2(a1[s], false),
                                fp8x2_to_bf16x2(a0[s], true), fp8x2_to_bf16x2(a1[s], true) };
        #pragma unroll
        for (int t = 0; t < NT; t++) {
          const unsigned* b = (const unsigned*)&xv[u][t][s >> 1];
          att_mma(part[t], a, b[2 * (s & 1)], b[2 * (s & 1) + 1]);
        }
      }
      const float s0 = v0 ? scales[row0 * KB + (c >> shift)] : 0.0f;
      const float s1 = v1 ? scales[row1 * KB + (c >> shift)] : 0.0f;
      #pragma unroll
      for (int t = 0; t < NT; t++) {
        acc[t][0] += s0 * part[t][0];
        acc[t][1] += s0 * part[t][1];
        acc[t][2] += s1 * part[t][2];
        acc[t][3] += s1 * part[t][3];
      }
    }
  }
  if (warp > 0) {
    #pragma unroll
    for (int t = 0; t < NT; t++) {
      #pragma unroll
      for (int e = 0; e < 4; e++) red[warp - 1][lane][4 * t + e] = acc[t][e];
    }
  }
  __syncthreads();
  if (warp > 0) return;
  #pragma unroll
  for (int t = 0; t < NT; t++) {
    #pragma unroll
    for (int e = 0; e < 4; e++) {
      float v = acc[t][e];
      for (int p = 0; p < warps - 1; p++) v += red[p][lane][4 * t + e];
      // fragment element e: weight row g (+8 for e >= 2), x row 8t + 2q (+1 for odd e)
      const int n = n0 + g + (e >= 2 ? 8 : 0), m = 8 * t + 2 * q + (e & 1);
      if (n < N && m < M) st(y, ydt, (i64)m * N + n, v + (bdt >= 0 ? ld(bias, bdt, n) : 0.0f));
    }
  }
}

#define GEMV_FP8_TC_KERNEL(NT, UNR) \
extern "C" __global__ void __launch_bounds__(32 * GEMV_FP8_TC_MAX_WARPS) k_gemv_fp8_tc_n##NT(const unsigned char* w, const float* scales, \
    int KB, int colShift, const u16* x, const void* bias, int bdt, void* y, int ydt, int M, int N, int K, int WPR) { \
  (void)WPR; \
  gemv_fp8_tc<NT, UNR>(w, scales, KB, colShift, x, bias, bdt, y, ydt, M, N, K); \
}
GEMV_FP8_TC_KERNEL(1, FP8_TC_UNR)
GEMV_FP8_TC_KERNEL(2, FP8_TC_UNR_N2)

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

/** the CUDA-core FP8 decode GEMVs, by the most x rows each takes (1, 2, 4, 8) */
export const GEMV_FP8_KERNEL_NAMES = ['k_gemv_fp8_m1', 'k_gemv_fp8_m2', 'k_gemv_fp8_m4', 'k_gemv_fp8_m8'] as const;
/** the tensor-core FP8 GEMVs, by their tiles of 8 x rows (at most 8 or 16 rows) */
export const GEMV_FP8_TC_KERNEL_NAMES = ['k_gemv_fp8_tc_n1', 'k_gemv_fp8_tc_n2'] as const;
export const FP8_KERNEL_NAMES = [...GEMV_FP8_KERNEL_NAMES, ...GEMV_FP8_TC_KERNEL_NAMES, 'k_fp8_dequant'] as const;
export type GemvFp8KernelName = (typeof GEMV_FP8_KERNEL_NAMES)[number] | (typeof GEMV_FP8_TC_KERNEL_NAMES)[number];

/** the most x rows an FP8 GEMV takes (the tensor-core one; the CUDA-core one takes 8); more multiply the dequantized weights (cuBLASLt) */
export const GEMV_FP8_MAX_M = 16;
const GEMV_FP8_CUDA_CORE_MAX_M = 8;
const UNROLL: Record<(typeof GEMV_FP8_KERNEL_NAMES)[number], number> = { k_gemv_fp8_m1: 8, k_gemv_fp8_m2: 8, k_gemv_fp8_m4: 8, k_gemv_fp8_m8: 4 };
/** blocks below which a launch takes more warps a row (so fewer rows a block, more blocks) */
const MIN_BLOCKS = 264;

export type Fp8GemvEngine = 'tensor-core' | 'cuda-core';

export interface Fp8GemvLaunch {
  kernel: GemvFp8KernelName;
  /** the CUDA-core kernel's warps a row (1 for the tensor-core one) */
  warpsPerRow: number;
  grid: number;
  threads: number;
}

/**
 * The FP8 GEMV launch for M rows of x over an [N, K] weight whose scales cover 2^colShift columns;
 * undefined where M or K rule every one out. The tensor-core kernel (`engine` 'tensor-core'; the
 * settings' default too) where scales cover 64 columns or more: one tile of 8 x rows to M 8, two to 16, a block
 * of `tcWarps` warps a 16 weight rows. Otherwise the CUDA-core kernel to M 8: the smallest that holds M rows, the
 * fewest warps a row (1, 2, 4 or 8) that give each lane one pass of loads, then more while the
 * grid would be under MIN_BLOCKS (two blocks an SM of the H200): more bytes in flight for the
 * small matrices.
 */
export function gemvFp8Choice(M: number, N: number, K: number, colShift: number, engine: Fp8GemvEngine = 'tensor-core', tcWarps = 4):
  Fp8GemvLaunch | undefined {
  if (!Number.isInteger(M) || M < 1 || !Number.isInteger(K) || K < 16 || K % 16 !== 0 || N < 1) return undefined;
  if (engine === 'tensor-core' && colShift >= 6 && M <= GEMV_FP8_MAX_M) {
    return { kernel: GEMV_FP8_TC_KERNEL_NAMES[M <= 8 ? 0 : 1], warpsPerRow: 1, grid: Math.ceil(N / 16), threads: 32 * tcWarps };
  }
  if (M > GEMV_FP8_CUDA_CORE_MAX_M) return undefined;
  const kernel = GEMV_FP8_KERNEL_NAMES.find((k) => Number(k.slice('k_gemv_fp8_m'.length)) >= M)!;
  const chunks = K / 16;
  let wpr = 1;
  while (wpr < 8 && wpr * 32 * UNROLL[kernel] < chunks) wpr *= 2;
  while (wpr < 8 && Math.ceil(N / (8 / wpr)) < MIN_BLOCKS) wpr *= 2;
  return { kernel, warpsPerRow: wpr, grid: Math.ceil(N / (8 / wpr)), threads: GEMV_THREADS };
}
