// CUDA source of the skinny-GEMM ("GEMV") kernels: y[M, N] = x[M, K] · w[N, K]^T, bf16 in and out,
// f32 accumulation, for decode shapes (M <= 8 rows). Its own NVRTC module (kernelModules in
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
//
// Two families: gemv_rows (k_gemv_*: one block per row group, loads once, exits) and the
// persistent, software-pipelined gemvp_rows (k_gemvp_*: a resident grid that loops over the row
// groups with its next loads always in flight; why and how where their section starts below). The tuner times
// both; the fused GLU / norm paths use the persistent twins, which make their x once per block.

export const GEMV_KERNEL_SOURCE = String.raw`
// (without __CUDA_ARCH__: plain loads, for the host warp simulator of test/backends/cuda-sim)
// GEMV_L2_EVICT_FIRST ($LLMTS_CUDA_GEMV_DEFINES; 1 by default, 0 for plain streaming loads): the weight
// loads ask L2 to evict their lines first (a fractional createpolicy, sm_80+), so that a layer's
// ~440 MB of weights streaming through the 50 MB L2 do not push out what the step reads again: the
// kernels' code (at one row the decode attention fetches its instructions anew each layer, a round
// trip a cache line in its chain), the activations and part of the KV cache. On the H200
// (Llama-3.1-8B shapes, B=1, a 32k table): +2.1% at 512 tokens, +1.6% at 4k (TUNING.md).
#ifndef GEMV_L2_EVICT_FIRST
#define GEMV_L2_EVICT_FIRST 1
#endif
__device__ __forceinline__ uint4 gemv_ld_stream(const uint4* p) {
#ifdef __CUDA_ARCH__
  uint4 v;
#if GEMV_L2_EVICT_FIRST
  unsigned long long pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
#else
  // volatile: kept in program order before PDL_ENTRY's volatile wait (a plain asm may be sunk past it)
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#endif
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
  int gluI;         // > 0 (k_gemvp_normglu_*): output row n is act(w[n] . x) (w[gluI + n] . x)
  int gluAct;       //   with ACT_* gluAct, as k_glu_packed makes it from the packed gate/up product
  // ropeD > 0 (k_gemvp_normrope_*): w is packed q/k/v rows [(H + 2 KVH) D, K], and the outputs go
  // where k_rope_qkv puts them (gemv_rope_row, gemv_store_rope_row): q heads roped to qOut [M, H, D],
  // k heads roped and v heads as they are to the bf16 pools at slots[m] (-1: skip; >= numSlots: error 2)
  int ropeD, ropeHalf, ropeH, ropeKVH, invStride;
  const int* pos;
  const float* invFreq;
  float scaling;
  u16* kpool;
  u16* vpool;
  const int* slots;
  i64 numSlots;
  int* err;
};

// Rope-out: the units are, per q or k head, its ropeHalf rotated pairs of rows (j, j + half), then
// its D - 2 half unrotated rows, then every v row; a unit's first half of warps sums its first row,
// the second half its pair's second row (none for a single). The weight row of unit u's half
// "second", or -1.
__device__ __forceinline__ int gemv_rope_row(const GemvIn& in, int u, bool second) {
  const int D = in.ropeD, half = in.ropeHalf, per = D - half, qk = (in.ropeH + in.ropeKVH) * per;
  if (u < qk) {
    const int hh = u / per, r = u - hh * per;
    if (r < half) return hh * D + r + (second ? half : 0);
    return second ? -1 : hh * D + half + r; // dim 2 half + (r - half)
  }
  return second ? -1 : (in.ropeH + in.ropeKVH) * D + (u - qk);
}

// rope-out units of a q/k/v row layout: GemvIn's ropeD, ropeHalf, ropeH, ropeKVH
__device__ __forceinline__ int gemv_rope_units(const GemvIn& in) {
  return (in.ropeH + in.ropeKVH) * (in.ropeD - in.ropeHalf) + in.ropeKVH * in.ropeD;
}

// MODE 2's new residual, one chunk: bf16(x + rScale r) of 8 values (k_add_rmsnorm's sum)
__device__ __forceinline__ uint4 gemv_sum8(const GemvIn& in, const uint4& xv, const uint4& rv) {
  const unsigned* x2 = (const unsigned*)&xv;
  const unsigned* r2 = (const unsigned*)&rv;
  uint4 o;
  unsigned* o2 = (unsigned*)&o;
  #pragma unroll
  for (int k = 0; k < 4; k++) {
    const u16 lo = f2bf(__uint_as_float(x2[k] << 16) + in.rScale * __uint_as_float(r2[k] << 16));
    const u16 hi = f2bf(__uint_as_float(x2[k] & 0xffff0000u) + in.rScale * __uint_as_float(r2[k] & 0xffff0000u));
    o2[k] = (unsigned)lo | ((unsigned)hi << 16);
  }
  return o;
}

// MODE 2's normed chunk c of a sum chunk: bf16(sum inv (off + nw)) (k_add_rmsnorm's normed)
__device__ __forceinline__ uint4 gemv_norm8(const GemvIn& in, const uint4& sv, int c, float inv) {
  const unsigned* s2 = (const unsigned*)&sv;
  uint4 o;
  unsigned* o2 = (unsigned*)&o;
  #pragma unroll
  for (int k = 0; k < 4; k++) {
    const float lo = __uint_as_float(s2[k] << 16) * inv * (in.off + ld(in.nw, in.nwdt, c * 8 + 2 * k));
    const float hi = __uint_as_float(s2[k] & 0xffff0000u) * inv * (in.off + ld(in.nw, in.nwdt, c * 8 + 2 * k + 1));
    o2[k] = (unsigned)f2bf(lo) | ((unsigned)f2bf(hi) << 16);
  }
  return o;
}

// chunk c (8 values) of row m of what the GEMV multiplies; inv: MODE 2's 1 / rms of row m
template <int MODE>
__device__ __forceinline__ uint4 gemv_x(const GemvIn& in, int nch, int m, int c, float inv) {
  const uint4* xr = (const uint4*)in.x;
  if (MODE == 0) return gemv_ld_cached(xr + (i64)m * nch + c);
  if (MODE == 1) {
    uint4 o;
    unsigned* o2 = (unsigned*)&o;
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
  return gemv_norm8(in, gemv_sum8(in, xv, rv), c, inv);
}

// MODE 2, by the whole block once its weight loads are in flight: every row's 1 / rms (each block
// recomputes it from x and r, which stay in L2), block 0 storing the new residual. xs (the
// persistent kernels' shared copy of x, or null): where each thread also keeps the sum chunks it
// makes, [M, nch].
template <int MMAX>
__device__ __forceinline__ void gemv_norm_rows(const GemvIn& in, int M, int nch, int K, float* inv, uint4* xs) {
  __shared__ float part[8][MMAX];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float ss[MMAX];
  #pragma unroll
  for (int m = 0; m < MMAX; m++) ss[m] = 0.0f;
  for (int c = threadIdx.x; c < nch; c += blockDim.x) {
    #pragma unroll
    for (int m = 0; m < MMAX; m++) {
      if (m >= M) continue;
      const uint4 o = gemv_sum8(in, gemv_ld_cached((const uint4*)in.x + (i64)m * nch + c),
                                gemv_ld_cached((const uint4*)in.r + (i64)m * nch + c));
      const unsigned* o2 = (const unsigned*)&o;
      #pragma unroll
      for (int k = 0; k < 4; k++) {
        const float lo = bf2f((u16)(o2[k] & 0xffffu)), hi = bf2f((u16)(o2[k] >> 16));
        ss[m] += lo * lo + hi * hi;
      }
      if (blockIdx.x == 0) ((uint4*)in.sum)[(i64)m * nch + c] = o;
      if (xs) xs[m * nch + c] = o;
    }
  }
  #pragma unroll
  for (int m = 0; m < MMAX; m++) {
    const float v = warp_sum(ss[m]);
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

// The end of an output row n: each warp's sums over its lanes, then (WPR > 1) over the row's warps
// through red (one barrier; the persistent kernels alternate two reds, so one barrier a group
// suffices: a group's red is rewritten two groups later, after every warp passed the barrier
// between), stored as bf16; acc is zeroed for the next row.
template <int MMAX>
__device__ __forceinline__ void gemv_store_row(float* acc, float (*red)[MMAX], u16* __restrict__ y, int M, int N, int n,
                                               int WPR) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  #pragma unroll
  for (int m = 0; m < MMAX; m++) acc[m] = warp_sum(acc[m]);
  if (WPR == 1) {
    if (lane == 0 && n < N) {
      #pragma unroll
      for (int m = 0; m < MMAX; m++) if (m < M) y[(i64)m * N + n] = f2bf(acc[m]);
    }
  } else {
    if (lane == 0) {
      #pragma unroll
      for (int m = 0; m < MMAX; m++) red[warp][m] = acc[m];
    }
    __syncthreads();
    if (warp % WPR == 0 && lane == 0 && n < N) {
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
  #pragma unroll
  for (int m = 0; m < MMAX; m++) acc[m] = 0.0f;
}

// Each warp's sums over its lanes into red[warp] (acc zeroed for the next row), then a barrier.
template <int MMAX>
__device__ __forceinline__ void gemv_sums_to_red(float* acc, float (*red)[MMAX]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  #pragma unroll
  for (int m = 0; m < MMAX; m++) {
    const float v = warp_sum(acc[m]);
    if (lane == 0) red[warp][m] = v;
    acc[m] = 0.0f;
  }
  __syncthreads();
}

// The end of a GLU-out row n (GemvIn.gluI): warps [0, WPR / 2) of the row summed its gate row,
// the others its up row; stored as k_glu_packed stores it from the bf16 gate/up product: bf16(act(g) u)
// of the bf16-rounded sums. acc is zeroed for the next row.
template <int MMAX>
__device__ __forceinline__ void gemv_store_glu_row(float* acc, float (*red)[MMAX], u16* __restrict__ y, int M, int N,
                                                   int n, int WPR, int act) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, half = WPR / 2;
  gemv_sums_to_red<MMAX>(acc, red);
  if (warp % WPR == 0 && lane == 0 && n < N) {
    #pragma unroll
    for (int m = 0; m < MMAX; m++) {
      if (m < M) {
        float g = 0.0f, u = 0.0f;
        for (int p = 0; p < half; p++) {
          g += red[warp + p][m];
          u += red[warp + half + p][m];
        }
        y[(i64)m * N + n] = f2bf(activate(bf2f(f2bf(g)), act) * bf2f(f2bf(u)));
      }
    }
  }
}

// The end of rope-out unit u (GemvIn.ropeD): the bf16-rounded sums of its rows (a: the first half of
// its warps, b: the second), roped as k_rope_qkv ropes them, to qOut or the pools. acc is zeroed.
template <int MMAX>
__device__ __forceinline__ void gemv_store_rope_row(float* acc, float (*red)[MMAX], const GemvIn& in, u16* __restrict__ qOut,
                                                    int M, int U, int u, int WPR) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, half2 = WPR / 2;
  gemv_sums_to_red<MMAX>(acc, red);
  if (warp % WPR != 0 || lane != 0 || u >= U) return;
  const int D = in.ropeD, half = in.ropeHalf, per = D - half, qk = (in.ropeH + in.ropeKVH) * per;
  const int H = in.ropeH, KVH = in.ropeKVH;
  int hh, dA, dB = -1; // head (q heads, then k heads, then v heads), the dims written
  if (u < qk) {
    hh = u / per;
    const int r = u - hh * per;
    if (r < half) {
      dA = r;
      dB = r + half;
    } else {
      dA = half + r;
    }
  } else {
    hh = H + KVH + (u - qk) / D;
    dA = (u - qk) % D;
  }
  #pragma unroll
  for (int m = 0; m < MMAX; m++) {
    if (m >= M) continue;
    float sa = 0.0f, sb = 0.0f;
    for (int p = 0; p < half2; p++) {
      sa += red[warp + p][m];
      sb += red[warp + half2 + p][m];
    }
    const float a = bf2f(f2bf(sa)), b = bf2f(f2bf(sb));
    float ya = a, yb = 0.0f;
    if (dB >= 0) {
      const float ang = __fmul_rn((float)in.pos[m], in.invFreq[(i64)m * in.invStride + dA]);
      const float c = cosf(ang) * in.scaling, s = sinf(ang) * in.scaling;
      ya = a * c - b * s;
      yb = b * c + a * s;
    }
    if (hh < H) {
      qOut[((i64)m * H + hh) * D + dA] = f2bf(ya);
      if (dB >= 0) qOut[((i64)m * H + hh) * D + dB] = f2bf(yb);
      continue;
    }
    const int slot = in.slots[m];
    const bool isK = hh < H + KVH;
    if (isK && slot >= in.numSlots) report(in.err, 2, m, slot, (int)in.numSlots);
    if (slot < 0 || slot >= in.numSlots) continue;
    const int kh = isK ? hh - H : hh - H - KVH;
    u16* pool = isK ? in.kpool : in.vpool;
    pool[((i64)slot * KVH + kh) * D + dA] = f2bf(ya);
    if (dB >= 0) pool[((i64)slot * KVH + kh) * D + dB] = f2bf(yb);
  }
}

// WPR warps share one output row (each takes a contiguous 1/WPR of its chunks; shared memory adds
// their sums), so a lane holds at most UNR chunks of a row up to K = WPR * 32 * UNR * 8 and issues
// all its weight loads at once. Weights are loaded before PDL_ENTRY: they do not depend on the
// kernel before, so with programmatic dependent launch their fetch overlaps that kernel's tail.
// (Its fused twins, which made the GLU or the norm per weight chunk of every row, were
// compute-bound: 2.6x and 1.8x slower than the unfused ops at one row on the H200; the fused ops
// use the persistent kernels below, which make x once per block.)
template <int MMAX, int UNR>
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
        #pragma unroll
        for (int m = 0; m < MMAX; m++) {
          if (m < M) acc[m] += gemv_dot8(wv[u], gemv_x<0>(in, nch, m, c, 1.0f));
        }
      }
    }
  }
  gemv_store_row<MMAX>(acc, red, y, M, N, n, WPR);
}

#define GEMV_KERNEL(MMAX, UNR) \
extern "C" __global__ void __launch_bounds__(256) k_gemv_m##MMAX##_u##UNR(const u16* w, const u16* x, u16* y, \
    int M, int N, int K, int WPR) { \
  GemvIn in = GemvIn(); \
  in.x = x; \
  gemv_rows<MMAX, UNR>(w, in, y, M, N, K, WPR); \
}
GEMV_KERNEL(1, 16)
GEMV_KERNEL(1, 8)
GEMV_KERNEL(2, 16)
GEMV_KERNEL(4, 8)
GEMV_KERNEL(8, 4)

// ---- the persistent, software-pipelined kernels (k_gemvp_*) ----------------------------------------
//
// Why: a gemv_rows block issues its loads once, multiplies and exits, so a launch runs as ~3 waves
// of latency-bound blocks plus ramp and tail, and HBM idles between a block's last load landing and
// its successor's first being issued (q/k/v, o streamed at ~2.2 TB/s of the H200's 4.3). Here a grid
// the host sizes to stay resident (min(row groups, SMs x 1 or 2)) walks the row groups
// g = blockIdx.x, g + gridDim.x, ...; a group is 8 / WPR output rows, each split over WPR warps as
// in gemv_rows (same chunks per lane, same summation order: MODE 0's sums are gemv_rows' bits). A
// warp's work is the sequence of passes (32 UNR chunks) of its row in each of its groups, and its
// loads run one pass ahead of its math: a lane's UNR registers of weights form a ring, slot u
// refilled with the next pass's chunk u (the same row's next pass, or the pass 0 of the row in
// group g + gridDim.x) right after its current chunk is multiplied. So every lane keeps UNR
// 16-byte loads in flight from its first pass to its last, across group boundaries and WPR > 1's
// one barrier per group: 256 x UNR x 16 B = 32 KB (UNR 8) or 64 KB (UNR 16) a block, at one or
// two blocks an SM (the tuner picks), instead of a burst per block. (Slots past a warp's share of
// a row stay empty, so the host gives a warp at least 32 UNR chunks a row where K allows:
// persistentWarpsPerRow.)
//
// Registers, not cp.async into shared memory: each weight chunk is read once, by the lane that
// multiplies it, so staging through shared memory only adds its traffic and cp.async group waits;
// a ring refilled slot by slot keeps as many bytes in flight as two alternating buffers of twice
// the registers (4 UNR registers a lane: 32 at UNR 8, 64 at UNR 16). __launch_bounds__(256, 2)
// caps a thread at 128 registers so that two blocks an SM stay resident (ptxas 13 for sm_90: 80-111,
// no spills); a block that could not be resident would run after the others, a second wave.
//
// MODE 1 / 2 (gluMatmul, addRmsnormMatmul): gemv_rows' twins recompute the transformed x for every
// weight chunk of every row (N x K activations or norm products: compute-bound, slower than the
// two unfused kernels). Here each block makes it once after PDL_ENTRY, M rows of K bf16 into
// dynamic shared memory (the host launches them only when M K 2 bytes <= 48 KiB, which needs no
// opt-in attribute), and the loop reads x chunks from there. MODE 0 reads x as gemv_rows does
// (through L1, where it stays: the weight loads do not allocate there).

// MODE 1 / 2's staged x, [M, K / 8] chunks: the block's dynamic shared memory
__device__ __forceinline__ uint4* gemvp_xs() { return dyn_smem(); }

// A warp's share of the row groups (the same in every warp of a block, except row and cBegin)
struct GemvpLayout {
  int G;      // row groups: ceil(N / rpb)
  int rpb;    // output rows per group: 8 / WPR
  int row;    // this warp's row in a group
  int nch;    // 16-byte chunks per row: K / 8
  int per;    // chunks per warp of a row: ceil(nch / WPR) (GLU-out: ceil(nch / (WPR / 2)))
  int cBegin; // this warp's first chunk of a row
  bool second; // GLU- and rope-out: the warp is in the second half of its row's warps
};

// One pass of a warp over its row of a group: chunks c0 + 32 u + lane below cEnd (none past the
// last group or N)
struct GemvpPass {
  const uint4* wr;
  int c0, cEnd;
};

__device__ __forceinline__ GemvpPass gemvp_pass(const GemvpLayout& L, const GemvIn& in, const u16* w, int N, int K, int g, int p,
                                             int UNR) {
  const int n = g * L.rpb + L.row;
  // this warp's weight row: output row n; GLU-out: n's gate or up row; rope-out: a row of unit n or none
  const int row = g >= L.G || n >= N ? -1
    : in.ropeD > 0 ? gemv_rope_row(in, n, L.second) : n + (L.second ? in.gluI : 0);
  GemvpPass s;
  s.wr = (const uint4*)(w + (i64)(row >= 0 ? row : 0) * K);
  s.c0 = L.cBegin + p * 32 * UNR;
  s.cEnd = row >= 0 ? min(L.nch, L.cBegin + L.per) : 0;
  return s;
}

__device__ __forceinline__ uint4 gemvp_load(const GemvpPass& s, int u, int lane) {
  const int c = s.c0 + u * 32 + lane;
  return c < s.cEnd ? gemv_ld_stream(s.wr + c) : make_uint4(0u, 0u, 0u, 0u);
}

// chunk c of row m of what the GEMV multiplies: MODE 0 from x, MODE 1 / 2 from the staged copy
template <int MODE>
__device__ __forceinline__ uint4 gemvp_x(const GemvIn& in, const uint4* xs, int nch, int m, int c) {
  if (MODE == 0) return gemv_ld_cached((const uint4*)in.x + (i64)m * nch + c);
  return xs[m * nch + c];
}

// MODE 1 / 2, by the whole block after PDL_ENTRY: the M rows the GEMV multiplies, the bf16 values
// k_glu_packed / k_add_rmsnorm would store, into xs (MODE 2: block 0 also stores the new residual).
// MODE 2's second loop reads back only the sum chunks the same thread wrote in the first.
template <int MMAX, int MODE>
__device__ __forceinline__ void gemvp_stage_x(const GemvIn& in, int M, int nch, int K, uint4* xs) {
  float inv[MMAX];
  #pragma unroll
  for (int m = 0; m < MMAX; m++) inv[m] = 1.0f;
  if (MODE == 2) gemv_norm_rows<MMAX>(in, M, nch, K, inv, xs);
  #pragma unroll
  for (int m = 0; m < MMAX; m++) {
    if (m >= M) continue;
    for (int c = threadIdx.x; c < nch; c += blockDim.x) {
      xs[m * nch + c] = MODE == 2 ? gemv_norm8(in, xs[m * nch + c], c, inv[m]) : gemv_x<MODE>(in, nch, m, c, 1.0f);
    }
  }
  __syncthreads();
}


template <int MMAX, int UNR, int MODE>
__device__ __forceinline__ void gemvp_rows(const u16* __restrict__ w, const GemvIn& in, u16* __restrict__ y,
                                           int M, int N, int K, int WPR) {
  __shared__ float red[2][8][MMAX];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  GemvpLayout L;
  L.rpb = 8 / WPR;
  L.row = warp / WPR;
  L.nch = K >> 3;
  // a GLU- or rope-out row is two weight rows (gate and up; a rotated pair), each over half of the
  // row's warps
  const int span = in.gluI > 0 || in.ropeD > 0 ? WPR / 2 : WPR;
  L.per = (L.nch + span - 1) / span;
  L.cBegin = (warp % WPR % span) * L.per;
  L.second = warp % WPR >= span;
  L.G = (N + L.rpb - 1) / L.rpb;
  const int passes = (L.per + 32 * UNR - 1) / (32 * UNR); // the same in every warp: barriers stay uniform
  // the ring's first fill, before PDL_ENTRY: weights do not depend on the kernel before
  GemvpPass next = gemvp_pass(L, in, w, N, K, blockIdx.x, 0, UNR);
  uint4 wv[UNR];
  #pragma unroll
  for (int u = 0; u < UNR; u++) wv[u] = gemvp_load(next, u, lane);
  PDL_ENTRY();
  uint4* xs = gemvp_xs();
  if (MODE != 0) gemvp_stage_x<MMAX, MODE>(in, M, L.nch, K, xs);
  float acc[MMAX];
  #pragma unroll
  for (int m = 0; m < MMAX; m++) acc[m] = 0.0f;
  int parity = 0;
  for (int g = blockIdx.x; g < L.G; g += gridDim.x) {
    for (int p = 0; p < passes; p++) {
      const GemvpPass cur = next;
      // the pass after this one: the row's next, else pass 0 of this warp's row in the block's next group
      next = p + 1 < passes ? gemvp_pass(L, in, w, N, K, g, p + 1, UNR) : gemvp_pass(L, in, w, N, K, g + gridDim.x, 0, UNR);
      #pragma unroll
      for (int u = 0; u < UNR; u++) {
        const int c = cur.c0 + u * 32 + lane;
        if (c < cur.cEnd) {
          #pragma unroll
          for (int m = 0; m < MMAX; m++) {
            if (m < M) acc[m] += gemv_dot8(wv[u], gemvp_x<MODE>(in, xs, L.nch, m, c));
          }
        }
        wv[u] = gemvp_load(next, u, lane); // the ring: slot u's chunk of the next pass, in flight from now
      }
    }
    if (in.ropeD > 0) gemv_store_rope_row<MMAX>(acc, red[parity], in, y, M, N, g * L.rpb + L.row, WPR);
    else if (in.gluI > 0) gemv_store_glu_row<MMAX>(acc, red[parity], y, M, N, g * L.rpb + L.row, WPR, in.gluAct);
    else gemv_store_row<MMAX>(acc, red[parity], y, M, N, g * L.rpb + L.row, WPR);
    parity ^= 1;
  }
}

// MODE 2's inputs (the add + rmsnorm twins' arguments)
__device__ __forceinline__ GemvIn gemv_norm_in(const u16* x, const u16* r, float rScale, const void* nw, int nwdt, float eps,
                                               float off, u16* sum) {
  GemvIn in = GemvIn();
  in.x = x;
  in.r = r;
  in.rScale = rScale;
  in.nw = nw;
  in.nwdt = nwdt;
  in.eps = eps;
  in.off = off;
  in.sum = sum;
  return in;
}

// Tuning macros ($LLMTS_CUDA_GEMV_DEFINES): GEMVP_MINB, the resident blocks an SM the persistent
// kernels are compiled for (__launch_bounds__; 2: up to 128 registers a thread); GEMVP_M1_UNR, the
// one-row kernels' loads in flight a lane (their names keep u16; the host plans warps per row for 16)
#ifndef GEMVP_MINB
#define GEMVP_MINB 2
#endif
#ifndef GEMVP_M1_UNR
#define GEMVP_M1_UNR 16
#endif
#define GEMVP_KERNEL(MMAX, NAMEUNR, UNR) \
extern "C" __global__ void __launch_bounds__(256, GEMVP_MINB) k_gemvp_m##MMAX##_u##NAMEUNR(const u16* w, const u16* x, u16* y, \
    int M, int N, int K, int WPR) { \
  GemvIn in = GemvIn(); \
  in.x = x; \
  gemvp_rows<MMAX, UNR, 0>(w, in, y, M, N, K, WPR); \
} \
extern "C" __global__ void __launch_bounds__(256, GEMVP_MINB) k_gemvp_glu_m##MMAX##_u##NAMEUNR(const u16* w, const u16* gu, u16* y, \
    int M, int N, int K, int WPR, int act) { \
  GemvIn in = GemvIn(); \
  in.x = gu; \
  in.act = act; \
  gemvp_rows<MMAX, UNR, 1>(w, in, y, M, N, K, WPR); \
} \
extern "C" __global__ void __launch_bounds__(256, GEMVP_MINB) k_gemvp_norm_m##MMAX##_u##NAMEUNR(const u16* w, const u16* x, \
    const u16* r, float rScale, const void* nw, int nwdt, float eps, float off, u16* sum, u16* y, int M, int N, int K, \
    int WPR) { \
  gemvp_rows<MMAX, UNR, 2>(w, gemv_norm_in(x, r, rScale, nw, nwdt, eps, off, sum), y, M, N, K, WPR); \
} \
extern "C" __global__ void __launch_bounds__(256, GEMVP_MINB) k_gemvp_normglu_m##MMAX##_u##NAMEUNR(const u16* w, const u16* x, \
    const u16* r, float rScale, const void* nw, int nwdt, float eps, float off, u16* sum, u16* y, int M, int N, int K, \
    int WPR, int act) { \
  GemvIn in = gemv_norm_in(x, r, rScale, nw, nwdt, eps, off, sum); \
  in.gluI = N; \
  in.gluAct = act; \
  gemvp_rows<MMAX, UNR, 2>(w, in, y, M, N, K, WPR); \
} \
extern "C" __global__ void __launch_bounds__(256, GEMVP_MINB) k_gemvp_normrope_m##MMAX##_u##NAMEUNR(const u16* w, const u16* x, \
    const u16* r, float rScale, const void* nw, int nwdt, float eps, float off, u16* sum, u16* qOut, int M, int K, \
    int WPR, int H, int KVH, int D, int half, const int* pos, const float* invFreq, int invStride, float scaling, \
    u16* kpool, u16* vpool, const int* slots, i64 numSlots, int* err) { \
  GemvIn in = gemv_norm_in(x, r, rScale, nw, nwdt, eps, off, sum); \
  in.ropeD = D; \
  in.ropeHalf = half; \
  in.ropeH = H; \
  in.ropeKVH = KVH; \
  in.pos = pos; \
  in.invFreq = invFreq; \
  in.invStride = invStride; \
  in.scaling = scaling; \
  in.kpool = kpool; \
  in.vpool = vpool; \
  in.slots = slots; \
  in.numSlots = numSlots; \
  in.err = err; \
  gemvp_rows<MMAX, UNR, 2>(w, in, qOut, M, gemv_rope_units(in), K, WPR); \
}
GEMVP_KERNEL(1, 16, GEMVP_M1_UNR)
GEMVP_KERNEL(2, 16, 16)
GEMVP_KERNEL(4, 8, 8)
GEMVP_KERNEL(8, 8, 8)
`;

/**
 * one-shot GEMVs; k_gemv_m1_u8 is the one-row kernel at half the loads in flight a lane: fewer
 * registers, so three blocks an SM instead of two (more bytes in flight an SM where a warp's share
 * of a row is a single pass, as for the 8B's o and q/k/v rows at 2 warps a row). The tuner times it
 * beside k_gemv_m1_u16 (gemvCandidates).
 */
export const GEMV_KERNEL_NAMES = ['k_gemv_m1_u16', 'k_gemv_m1_u8', 'k_gemv_m2_u16', 'k_gemv_m4_u8', 'k_gemv_m8_u4'] as const;
/** the persistent, software-pipelined kernels (same arguments as GEMV_KERNEL_NAMES; grid gemvpGrid) */
export const GEMVP_KERNEL_NAMES = ['k_gemvp_m1_u16', 'k_gemvp_m2_u16', 'k_gemvp_m4_u8', 'k_gemvp_m8_u8'] as const;
/** their GLU twins: x staged once per block in dynamic shared memory (gluMatmul; gemvFusedChoice) */
export const GEMVP_GLU_KERNEL_NAMES = ['k_gemvp_glu_m1_u16', 'k_gemvp_glu_m2_u16', 'k_gemvp_glu_m4_u8', 'k_gemvp_glu_m8_u8'] as const;
/** their add + rmsnorm twins, x staged the same way (addRmsnormMatmul; gemvFusedChoice) */
export const GEMVP_NORM_KERNEL_NAMES = ['k_gemvp_norm_m1_u16', 'k_gemvp_norm_m2_u16', 'k_gemvp_norm_m4_u8', 'k_gemvp_norm_m8_u8'] as const;
/**
 * the add + rmsnorm twins with the GLU in their epilogue (addRmsnormGateUpGlu): w is packed gate/up
 * rows [2N, K], output row n the GLU of rows n and N + n, over an even number of warps a row
 */
export const GEMVP_NORMGLU_KERNEL_NAMES = ['k_gemvp_normglu_m1_u16', 'k_gemvp_normglu_m2_u16', 'k_gemvp_normglu_m4_u8',
  'k_gemvp_normglu_m8_u8'] as const;
/**
 * the add + rmsnorm twins with rope and the KV write in their epilogue (addRmsnormQkvRope): w is
 * packed q/k/v rows, outputs where k_rope_qkv puts them (no qk-norm; bf16 pools)
 */
export const GEMVP_NORMROPE_KERNEL_NAMES = ['k_gemvp_normrope_m1_u16', 'k_gemvp_normrope_m2_u16', 'k_gemvp_normrope_m4_u8',
  'k_gemvp_normrope_m8_u8'] as const;

/** the kernels a GemvChoice names (MODE 0: y = x · w^T) */
export type GemvKernelName = (typeof GEMV_KERNEL_NAMES)[number] | (typeof GEMVP_KERNEL_NAMES)[number];
export type GemvFusedKernelName = (typeof GEMVP_GLU_KERNEL_NAMES)[number] | (typeof GEMVP_NORM_KERNEL_NAMES)[number] |
  (typeof GEMVP_NORMGLU_KERNEL_NAMES)[number] | (typeof GEMVP_NORMROPE_KERNEL_NAMES)[number];

/** threads per block: 8 warps */
export const GEMV_THREADS = 256;
export const GEMV_MAX_M = 8;
/**
 * The most shared memory a fused persistent block uses, its staged x (M K bf16, dynamic) and its
 * own static arrays together: 48 KiB, the default limit, above which a kernel would need
 * cuFuncSetAttribute; beyond it the fused ops run unfused (gemvFusedChoice checks x alone, the
 * backend the sum with the kernel's static bytes).
 */
export const GEMVP_MAX_SHARED_BYTES = 48 * 1024;

interface Variant {
  name: GemvKernelName; mmax: number; unroll: number; glu?: GemvFusedKernelName; norm?: GemvFusedKernelName;
  normGlu?: GemvFusedKernelName;
  normRope?: GemvFusedKernelName;
}

const VARIANTS: Variant[] = [
  { name: 'k_gemv_m1_u16', mmax: 1, unroll: 16 }, { name: 'k_gemv_m1_u8', mmax: 1, unroll: 8 },
  { name: 'k_gemv_m2_u16', mmax: 2, unroll: 16 },
  { name: 'k_gemv_m4_u8', mmax: 4, unroll: 8 }, { name: 'k_gemv_m8_u4', mmax: 8, unroll: 4 },
];
/** the persistent kernels: UNR 16 where M's math leaves the registers (ring 64 of 128), else 8 */
const PERSISTENT: Variant[] = [
  { name: 'k_gemvp_m1_u16', mmax: 1, unroll: 16, glu: 'k_gemvp_glu_m1_u16', norm: 'k_gemvp_norm_m1_u16',
    normGlu: 'k_gemvp_normglu_m1_u16', normRope: 'k_gemvp_normrope_m1_u16' },
  { name: 'k_gemvp_m2_u16', mmax: 2, unroll: 16, glu: 'k_gemvp_glu_m2_u16', norm: 'k_gemvp_norm_m2_u16',
    normGlu: 'k_gemvp_normglu_m2_u16', normRope: 'k_gemvp_normrope_m2_u16' },
  { name: 'k_gemvp_m4_u8', mmax: 4, unroll: 8, glu: 'k_gemvp_glu_m4_u8', norm: 'k_gemvp_norm_m4_u8',
    normGlu: 'k_gemvp_normglu_m4_u8', normRope: 'k_gemvp_normrope_m4_u8' },
  { name: 'k_gemvp_m8_u8', mmax: 8, unroll: 8, glu: 'k_gemvp_glu_m8_u8', norm: 'k_gemvp_norm_m8_u8',
    normGlu: 'k_gemvp_normglu_m8_u8', normRope: 'k_gemvp_normrope_m8_u8' },
];

/**
 * One way to run a GEMV: the kernel, how many warps share an output row (1, 2, 4 or 8) and, for
 * the persistent kernels (k_gemvp_*), how many blocks an SM the grid holds.
 */
export interface GemvChoice {
  kernel: GemvKernelName;
  warpsPerRow: number;
  /** persistent kernels only: grid = min(row groups, SMs x this) (gemvLaunchGrid) */
  blocksPerSm?: number;
}

export function gemvLabel(c: GemvChoice): string {
  return `${c.kernel}/w${c.warpsPerRow}${c.blocksPerSm ? `/b${c.blocksPerSm}` : ''}`;
}

function fits(M: number, K: number): boolean {
  return Number.isInteger(M) && Number.isInteger(K) && M >= 1 && M <= GEMV_MAX_M && K >= 8 && K % 8 === 0;
}

/**
 * The persistent choices' warps per row: 1 (8 rows a group, no barrier), and the most (up to 8)
 * that still fill a lane's ring (32 UNR chunks a warp's share of a row): more row groups for
 * small N at no loss of bytes in flight.
 */
function persistentWarpsPerRow(v: Variant, K: number): number[] {
  const chunks = K / 8;
  let wpr = 1;
  while (wpr < 8 && chunks / (wpr * 2) >= 32 * v.unroll) wpr *= 2;
  return [...new Set([1, wpr])];
}

/**
 * The GEMV launches that can compute an M-row product with inner size K (none when M or K rule them
 * out): the smallest kernels that hold M rows (one row: both unrolls), each with the fewest warps per
 * row that give each lane one pass of loads, and twice that; then the smallest persistent kernel that holds M rows, at one and
 * two blocks an SM, with each of persistentWarpsPerRow.
 */
export function gemvCandidates(M: number, K: number): GemvChoice[] {
  if (!fits(M, K)) return [];
  const mmax = VARIANTS.find((x) => x.mmax >= M)!.mmax;
  const chunks = K / 8;
  const out: GemvChoice[] = [];
  for (const v of VARIANTS.filter((x) => x.mmax === mmax)) {
    let wpr = 1;
    while (wpr < 8 && wpr * 32 * v.unroll < chunks) wpr *= 2;
    out.push(...[...new Set([wpr, Math.min(8, wpr * 2)])].map((w) => ({ kernel: v.name, warpsPerRow: w })));
  }
  const p = PERSISTENT.find((x) => x.mmax >= M)!;
  for (const w of persistentWarpsPerRow(p, K)) {
    for (const b of [1, 2]) out.push({ kernel: p.name, warpsPerRow: w, blocksPerSm: b });
  }
  return out;
}

/**
 * The most weight bytes a fused launch streams: beyond it the persistent loop's deficit against
 * the tuned GEMM outweighs the kernel it saves (on the H200, lm_head's 1 GB ran 12 us slower in
 * k_gemvp than in cuBLASLt, where the add + rmsnorm kernel it would save takes a few us; the 8B's
 * gate/up, 235 MB, gained).
 */
export const GEMVP_FUSED_MAX_WEIGHT_BYTES = 256 * 1024 * 1024;

/**
 * The persistent launch gluMatmul / addRmsnormMatmul fuse into an [M, K] x [N, K]^T product
 * (untimed: the most warps a row that fill a lane's ring, as persistentWarpsPerRow, at
 * `blocksPerSm` resident blocks an SM, CudaGemvSettings.fusedBlocksPerSm: two keep 2 x 256 x UNR x
 * 16 B in flight an SM), with its kernels and dynamic shared memory (M K 2 bytes); undefined where
 * M or K rule the GEMV out, x would not fit GEMVP_MAX_SHARED_BYTES or the weights pass
 * GEMVP_FUSED_MAX_WEIGHT_BYTES (the caller runs the two ops).
 */
export function gemvFusedChoice(M: number, N: number, K: number, blocksPerSm: number):
  { choice: GemvChoice; glu: GemvFusedKernelName; norm: GemvFusedKernelName; sharedBytes: number } | undefined {
  if (!fits(M, K) || M * K * 2 > GEMVP_MAX_SHARED_BYTES || N * K * 2 > GEMVP_FUSED_MAX_WEIGHT_BYTES) return undefined;
  const p = PERSISTENT.find((x) => x.mmax >= M)!;
  const warpsPerRow = Math.max(...persistentWarpsPerRow(p, K));
  return { choice: { kernel: p.name, warpsPerRow, blocksPerSm }, glu: p.glu!, norm: p.norm!,
    sharedBytes: M * K * 2 };
}

/**
 * A persistent fused launch whose output rows each sum two weight rows, over twice the warps a plain
 * row of the same K takes (half on each): `kernel` of the M-row variant; undefined where
 * gemvFusedChoice would be for `rows` weight rows (the caller runs the ops).
 */
function pairedChoice(M: number, rows: number, K: number, blocksPerSm: number, kernel: (v: Variant) => GemvFusedKernelName | undefined):
  { choice: GemvChoice; kernel: GemvFusedKernelName; sharedBytes: number } | undefined {
  const f = gemvFusedChoice(M, rows, K, blocksPerSm);
  if (!f) return undefined;
  const p = PERSISTENT.find((x) => x.mmax >= M)!;
  return { choice: { ...f.choice, warpsPerRow: Math.min(8, 2 * f.choice.warpsPerRow) }, kernel: kernel(p)!, sharedBytes: f.sharedBytes };
}

/**
 * The launch addRmsnormGateUpGlu fuses into: add + rmsnorm of [M, K] rows, their product with packed
 * gate/up rows [2I, K] and the GLU (k_gemvp_normglu_*: an output row per GLU value, its gate row
 * and its up row over the two halves of its warps).
 */
export function gemvNormGluChoice(M: number, I: number, K: number, blocksPerSm: number) {
  return pairedChoice(M, 2 * I, K, blocksPerSm, (v) => v.normGlu);
}

/**
 * The launch addRmsnormQkvRope fuses into: add + rmsnorm of [M, K] rows, their product with packed
 * q/k/v rows [rows, K], rope and the KV write (k_gemvp_normrope_*: an output unit per rotated pair
 * of rows, or per other row).
 */
export function gemvNormRopeChoice(M: number, rows: number, K: number, blocksPerSm: number) {
  return pairedChoice(M, rows, K, blocksPerSm, (v) => v.normRope);
}

/** rope-out units of q/k/v rows (gemv_rope_units): each q/k head's rotated pairs and other dims, every v dim */
export function gemvRopeUnits(H: number, KVH: number, D: number, half: number): number {
  return (H + KVH) * (D - half) + KVH * D;
}

/** grid x of a (one-shot) GEMV launch over N output rows: one block per row group */
export function gemvGrid(N: number, warpsPerRow: number): number {
  return Math.ceil(N / (GEMV_THREADS / 32 / warpsPerRow));
}

/** grid x of a persistent GEMV launch: the row groups, at most blocksPerSm resident blocks on each of smCount SMs */
export function gemvpGrid(N: number, warpsPerRow: number, smCount: number, blocksPerSm: number): number {
  return Math.min(gemvGrid(N, warpsPerRow), Math.max(1, smCount) * blocksPerSm);
}

/** grid x of a GemvChoice's launch over N output rows on a device of smCount SMs */
export function gemvLaunchGrid(c: GemvChoice, N: number, smCount: number): number {
  return c.blocksPerSm ? gemvpGrid(N, c.warpsPerRow, smCount, c.blocksPerSm) : gemvGrid(N, c.warpsPerRow);
}
