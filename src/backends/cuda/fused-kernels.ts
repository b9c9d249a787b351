// CUDA source of the fused decode kernels (the Backend contract's optional fused ops). Its own NVRTC module (kernelModules in kernels.ts) after KERNEL_PRELUDE: bf2f/f2bf,
// ld/st, report, block_sum, warp_sum, activate, GRID_STRIDE.
//
// Each fused kernel rounds to bf16 exactly where the plain ops it replaces store bf16 (the sum
// before its norm, the normed q/k before rope), so fused and plain paths compute the same values.

export const FUSED_KERNEL_SOURCE = String.raw`
// 8 bf16 values from one 16-byte load
__device__ __forceinline__ void unpack8(uint4 v, float* f) {
  const unsigned* u = (const unsigned*)&v;
  #pragma unroll
  for (int k = 0; k < 4; k++) { f[2 * k] = __uint_as_float(u[k] << 16); f[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u); }
}

// sum = bf16(a + bScale * b); normed = bf16(sum * rsqrt(mean(sum^2) + eps) * (off + w)); one block per row.
extern "C" __global__ void k_add_rmsnorm(const void* a, int adt, const void* b, int bdt, float bScale, const void* w,
                                         int wdt, u16* sum, u16* normed, i64 rows, int D, float eps, float off) {
  PDL_ENTRY();
  __shared__ float red[32];
  const bool vec = adt == DT_BF16 && bdt == DT_BF16 && (D & 7) == 0;
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    const i64 base = r * D;
    float ss = 0.0f;
    if (vec) {
      for (int d8 = threadIdx.x; d8 < (D >> 3); d8 += blockDim.x) {
        float av[8], bv[8];
        unpack8(((const uint4*)((const u16*)a + base))[d8], av);
        unpack8(((const uint4*)((const u16*)b + base))[d8], bv);
        uint4 out;
        u16* o = (u16*)&out;
        #pragma unroll
        for (int k = 0; k < 8; k++) {
          o[k] = f2bf(av[k] + bScale * bv[k]);
          float h = bf2f(o[k]);
          ss += h * h;
        }
        ((uint4*)(sum + base))[d8] = out;
      }
    } else {
      for (int d = threadIdx.x; d < D; d += blockDim.x) {
        u16 h = f2bf(ld(a, adt, base + d) + bScale * ld(b, bdt, base + d));
        sum[base + d] = h;
        float v = bf2f(h);
        ss += v * v;
      }
    }
    ss = block_sum(ss, red);
    const float inv = rsqrtf(ss / (float)D + eps);
    // each thread reads back only the elements it wrote above
    if (vec) {
      for (int d8 = threadIdx.x; d8 < (D >> 3); d8 += blockDim.x) {
        float sv[8];
        unpack8(((const uint4*)(sum + base))[d8], sv);
        uint4 out;
        u16* o = (u16*)&out;
        #pragma unroll
        for (int k = 0; k < 8; k++) o[k] = f2bf(sv[k] * inv * (off + ld(w, wdt, d8 * 8 + k)));
        ((uint4*)(normed + base))[d8] = out;
      }
    } else {
      for (int d = threadIdx.x; d < D; d += blockDim.x)
        normed[base + d] = f2bf(bf2f(sum[base + d]) * inv * (off + ld(w, wdt, d)));
    }
  }
}

// out[t, j] = act(gu[t, j]) * gu[t, I + j] for gu [T, 2I]
extern "C" __global__ void k_glu_packed(const void* gu, int gdt, u16* out, i64 T, i64 I, int act) {
  PDL_ENTRY();
  if (gdt == DT_BF16 && (I & 7) == 0) {
    const i64 I8 = I >> 3;
    GRID_STRIDE(i, T * I8) {
      i64 t = i / I8, j8 = i - t * I8;
      const uint4* row = (const uint4*)((const u16*)gu + t * 2 * I);
      float g[8], u[8];
      unpack8(row[j8], g);
      unpack8(row[I8 + j8], u);
      uint4 o;
      u16* op = (u16*)&o;
      #pragma unroll
      for (int k = 0; k < 8; k++) op[k] = f2bf(activate(g[k], act) * u[k]);
      ((uint4*)out)[i] = o;
    }
    return;
  }
  GRID_STRIDE(i, T * I) {
    i64 t = i / I, j = i - t * I;
    out[i] = f2bf(activate(ld(gu, gdt, t * 2 * I + j), act) * ld(gu, gdt, t * 2 * I + I + j));
  }
}

// One block per (token, q or k head) of qkv [T, (H + 2 KVH) * D]: optional per-head rmsnorm
// (weights [D]), rotate-half rope on the first 2*half dims, q to qOut [T, H, D]; a k head's block
// also writes its k and the matching v head to the pools at slots[t] (-1 = skip).
//
// ROPE_EARLY=1 (the default; $LLMTS_CUDA_FUSED_DEFINES=ROPE_EARLY=0 reads them after the wait): with
// programmatic dependent launch, the position, the slot and the angle of the thread's first dim are
// read and made before the wait for the kernel before (the q/k/v GEMV): they are step inputs the
// host uploads, which no kernel of the step writes, and every kernel before the one this waits on
// has completed when this one starts (PDL_ENTRY). At one row the kernel is a chain of global round
// trips; these are two of its three.
// ROPE_TIMING_SKIP=1: return after the wait (wrong outputs): only for timing what the kernel costs
// in a decode step.
#define ROPE_MAX_D 512
#ifndef ROPE_EARLY
#define ROPE_EARLY 1
#endif
// ROPE_V_EARLY=1 (the default; =0 loads it where it stores it, to measure it): a k head's block
// loads the thread's first value of its v head beside its key: one round trip of the kernel's chain
// less (the warp simulator checks both bit for bit; its GPU time is unmeasured).
#ifndef ROPE_V_EARLY
#define ROPE_V_EARLY 1
#endif
#ifndef ROPE_TIMING_SKIP
#define ROPE_TIMING_SKIP 0
#endif
// ROPE_TRIGGER=1 (0 by default): the next kernel (the decode attention) launches when this one's
// blocks exit, not after their wait, so its blocks are not resident beside this chain. H200, B=1:
// 0.7% slower at 512 (the attention's early reads then come after rope), even at 4k.
#ifndef ROPE_TRIGGER
#define ROPE_TRIGGER 0
#endif
#define ROPE_WAIT() PDL_WAIT(!ROPE_TRIGGER)
extern "C" __global__ void k_rope_qkv(const void* qkv, int xdt, const int* pos, const float* invFreq, int invStride,
                                      float scaling, const void* qnw, const void* knw, int nwdt, float eps, float off,
                                      u16* qOut, void* kpool, void* vpool, int pdt, const int* slots, int T, int H,
                                      int KVH, int D, int half, i64 numSlots, int* err) {
  __shared__ float xs[ROPE_MAX_D];
  __shared__ float red[32];
  const int t = blockIdx.x, hh = blockIdx.y;
  const bool isQ = hh < H;
#if ROPE_EARLY
  // the first dim's angle (d = threadIdx.x), as the loop below makes it
  const int d0 = threadIdx.x, j0 = d0 < half ? d0 : d0 - half;
  const float p = (float)pos[t];
  const int slot = isQ ? -1 : slots[t];
  float c0 = 0.0f, s0 = 0.0f;
  if (d0 < 2 * half) {
    const float ang = __fmul_rn(p, invFreq[(i64)t * invStride + j0]);
    c0 = cosf(ang) * scaling;
    s0 = sinf(ang) * scaling;
  }
  ROPE_WAIT();
#else
  ROPE_WAIT();
#endif
  if (ROPE_TIMING_SKIP) return;
  const i64 W = (i64)(H + 2 * KVH) * D;
  const i64 src = (i64)t * W + (i64)hh * D; // q heads, then k heads: head hh starts at hh * D
  const int kh = hh - H;
  // a k head's block also copies its v head (ROPE_V_EARLY: the thread's first value travels with its key)
  const i64 vsrc = (i64)t * W + (i64)(H + KVH + kh) * D;
  const bool vEarly = ROPE_V_EARLY && !isQ && (int)threadIdx.x < D;
  const float v0 = vEarly ? ld(qkv, xdt, vsrc + threadIdx.x) : 0.0f;
  for (int d = threadIdx.x; d < D; d += blockDim.x) xs[d] = ld(qkv, xdt, src + d);
  const void* nw = isQ ? qnw : knw;
  if (nw) {
    float ss = 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) ss += xs[d] * xs[d];
    ss = block_sum(ss, red);
    const float inv = rsqrtf(ss / (float)D + eps);
    for (int d = threadIdx.x; d < D; d += blockDim.x) xs[d] = bf2f(f2bf(xs[d] * inv * (off + ld(nw, nwdt, d))));
  }
  __syncthreads();
#if !ROPE_EARLY
  const float p = (float)pos[t];
  const int slot = isQ ? -1 : slots[t];
#endif
  if (!isQ && slot >= numSlots) {
    if (threadIdx.x == 0) report(err, 2, t, slot, (int)numSlots);
  }
  const bool write = !isQ && slot >= 0 && slot < numSlots;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float y = xs[d];
    if (d < 2 * half) {
      const int j = d < half ? d : d - half;
      float c, s;
#if ROPE_EARLY
      if (d == d0) {
        c = c0;
        s = s0;
      } else
#endif
      {
        const float ang = __fmul_rn(p, invFreq[(i64)t * invStride + j]);
        c = cosf(ang) * scaling;
        s = sinf(ang) * scaling;
      }
      const float a = xs[j], b = xs[j + half];
      y = d < half ? a * c - b * s : b * c + a * s;
    }
    const u16 yb = f2bf(y);
    if (isQ) {
      qOut[((i64)t * H + hh) * D + d] = yb;
    } else if (write) {
      const i64 dst = ((i64)slot * KVH + kh) * D + d;
      st(kpool, pdt, dst, bf2f(yb));
      st(vpool, pdt, dst, vEarly && d == (int)threadIdx.x ? v0 : ld(qkv, xdt, vsrc + d));
    }
  }
}

// Row argmax in two passes so a single row (decode at batch 1) still spreads over many blocks:
// k_argmax_part: block (s, r) scans chunk s of row r -> (value, index) partials;
// k_argmax_final: one warp per row reduces its S partials. Order: larger value, then lower index;
// NaN is never chosen; -1 when nothing exceeds -inf.
__device__ __forceinline__ void argmax_merge(float& best, int& idx, float v, int i) {
  if (i >= 0 && (idx < 0 || v > best || (v == best && i < idx))) { best = v; idx = i; }
}
extern "C" __global__ void k_argmax_part(const void* x, int xdt, float* pv, int* pi, int V, int chunk) {
  PDL_ENTRY();
  __shared__ float sv[32];
  __shared__ int si[32];
  const int s = blockIdx.x, r = blockIdx.y, S = gridDim.x;
  const int lo = s * chunk, hi = min(V, lo + chunk);
  const i64 base = (i64)r * V;
  float best = NEG_INF;
  int idx = -1;
  if (xdt == DT_BF16 && (V & 7) == 0 && (chunk & 7) == 0) {
    const uint4* row = (const uint4*)((const u16*)x + base);
    for (int k8 = (lo >> 3) + threadIdx.x; k8 < (hi >> 3); k8 += blockDim.x) {
      float f[8];
      unpack8(row[k8], f);
      #pragma unroll
      for (int k = 0; k < 8; k++) if (f[k] > best) { best = f[k]; idx = k8 * 8 + k; }
    }
  } else {
    for (int k = lo + threadIdx.x; k < hi; k += blockDim.x) {
      const float v = ld(x, xdt, base + k);
      if (v > best) { best = v; idx = k; }
    }
  }
  for (int o = 16; o > 0; o >>= 1) argmax_merge(best, idx, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, idx, o));
  const int w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  if ((threadIdx.x & 31) == 0) { sv[w] = best; si[w] = idx; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < nw; i++) argmax_merge(best, idx, sv[i], si[i]);
    pv[(i64)r * S + s] = best;
    pi[(i64)r * S + s] = idx;
  }
}
extern "C" __global__ void k_argmax_final(const float* pv, const int* pi, int* out, int R, int S) {
  PDL_ENTRY();
  const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (r >= R) return;
  float best = NEG_INF;
  int idx = -1;
  for (int s = lane; s < S; s += 32) argmax_merge(best, idx, pv[(i64)r * S + s], pi[(i64)r * S + s]);
  for (int o = 16; o > 0; o >>= 1) argmax_merge(best, idx, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, idx, o));
  if (lane == 0) out[r] = idx;
}

// KV blocks between a pool and a packed buffer (the prefix cache's spill and restore), in units
// of 16 bytes (or 2 when a block is not a multiple of 16): gather dst[k] = src[idx[k]],
// scatter dst[idx[k]] = src[k]; one launch for any number of blocks.
extern "C" __global__ void k_copy_blocks(const void* src, void* dst, const int* idx, i64 n, i64 units, int wide,
                                         int scatter) {
  GRID_STRIDE(i, n * units) {
    const i64 k = i / units, e = i - k * units;
    const i64 from = (scatter ? k : (i64)idx[k]) * units + e, to = (scatter ? (i64)idx[k] : k) * units + e;
    if (wide) ((uint4*)dst)[to] = ((const uint4*)src)[from];
    else ((u16*)dst)[to] = ((const u16*)src)[from];
  }
}
`;

export const FUSED_KERNEL_NAMES = [
  'k_add_rmsnorm', 'k_glu_packed', 'k_rope_qkv', 'k_argmax_part', 'k_argmax_final', 'k_copy_blocks',
] as const;

/** the largest head dim k_rope_qkv handles (its shared row) */
export const ROPE_QKV_MAX_HEAD_DIM = 512;
