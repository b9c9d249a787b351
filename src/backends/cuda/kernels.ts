// CUDA C++ source of every kernel the CUDA backend launches, as separate NVRTC modules
// (kernelModules at the end): each module is KERNEL_PRELUDE + its own kernels, compiled at run time
// for the device's architecture on its own, concurrently with the others and off the main thread,
// and cached on disk by source hash (nvrtc.ts, runtime.ts). Changing one module recompiles only it.
//
// The source includes no headers (NVRTC then needs no CUDA include directory): 16-bit floats are
// handled as raw `unsigned short` bits with explicit conversions. Math is f32 throughout; values
// are stored in their tensor's dtype. Dtype codes (DT_*) match DT_CODE in cuda-tensor.ts.
//
// Index errors inside kernels (token id outside the table, a KV position without a block, an
// expert id outside [0, E)) do not fault: the kernel writes zeros for that element and records
// the first error in `err` (int[4]: code, op-specific a, b, c), which read/sync turn into a
// rejected promise.

import { ATTENTION_KERNEL_NAMES, ATTENTION_PRIMITIVES, attentionKernelSource } from './attention-kernels.ts';
import { CUDA_DEFAULTS, type CudaSettings, type KernelDefines } from './cuda-settings.ts';
import { FP8_KERNEL_NAMES, FP8_KERNEL_SOURCE } from './fp8-kernels.ts';
import { FUSED_KERNEL_NAMES, FUSED_KERNEL_SOURCE } from './fused-kernels.ts';
import {
  GEMV_KERNEL_NAMES, GEMV_KERNEL_SOURCE, GEMVP_GLU_KERNEL_NAMES, GEMVP_KERNEL_NAMES, GEMVP_NORM_KERNEL_NAMES,
  GEMVP_NORMGLU_KERNEL_NAMES, GEMVP_NORMROPE_KERNEL_NAMES,
} from './gemv-kernels.ts';
import { MOE_KERNEL_NAMES, MOE_KERNEL_SOURCE } from './moe-kernels.ts';
import { SAMPLING_KERNEL_NAMES, SAMPLING_KERNEL_SOURCE } from './sampling-kernels.ts';

/**
 * The helpers every module starts with (NVRTC compiles each module on its own, so each gets its own
 * copy): dtype codes, u16/i64, bf2f/f2bf/h2f/f2h, ld/st, report, activate, warp/block reductions,
 * GRID_STRIDE. Changing it recompiles every module.
 */
export const KERNEL_PRELUDE = String.raw`
#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2
#define ACT_SILU 0
#define ACT_GELU_TANH 1
#define ACT_GELU 2
#define NEG_INF (-__int_as_float(0x7f800000))

typedef unsigned short u16;
typedef long long i64;

__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ u16 f2bf(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u); // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u); // round to nearest even
  return (u16)(u >> 16);
}
#ifdef __CUDA_ARCH__
__device__ __forceinline__ float h2f(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ u16 f2h(float f) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#else // the host warp simulator (test/backends/cuda-sim): the compiler's own half type
inline float h2f(u16 h) { _Float16 v; memcpy(&v, &h, 2); return (float)v; }
inline u16 f2h(float f) { _Float16 v = (_Float16)f; u16 h; memcpy(&h, &v, 2); return h; }
#endif

// The launch's dynamic shared memory, 16-byte aligned (the host warp simulator's stand-in without
// __CUDA_ARCH__)
#ifdef __CUDA_ARCH__
extern __shared__ uint4 dyn_smem_[];
__device__ __forceinline__ uint4* dyn_smem() { return dyn_smem_; }
#else
inline uint4* dyn_smem() { return (uint4*)sim_dynamic_shared(); }
#endif

__device__ __forceinline__ float ld(const void* p, int dt, i64 i) {
  if (dt == DT_BF16) return bf2f(((const u16*)p)[i]);
  if (dt == DT_F32) return ((const float*)p)[i];
  return h2f(((const u16*)p)[i]);
}
__device__ __forceinline__ void st(void* p, int dt, i64 i, float v) {
  if (dt == DT_BF16) ((u16*)p)[i] = f2bf(v);
  else if (dt == DT_F32) ((float*)p)[i] = v;
  else ((u16*)p)[i] = f2h(v);
}

// Programmatic dependent launch (PDL, sm_90+; runtime.ts launches PDL_KERNELS with it): a kernel may
// be scheduled while the one before it in the stream still runs. PDL_ENTRY() waits until that
// kernel has completed and its writes are visible, and only then lets the next kernel launch (so at
// most one grid waits ahead, holding SM slots). Every PDL kernel runs it in every thread before it
// reads or writes anything but weights; without the launch attribute it costs nothing.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
#define PDL_ENTRY() do { pdl_wait(); pdl_launch_dependents(); } while (0)
// PDL_WAIT(trigger): the wait, and the next kernel's launch only when trigger holds (a
// latency-bound kernel triggers later itself, so that the next one's blocks do not sit resident
// beside its chain of round trips: the decode attention's ATT_TC_TRIGGER, rope's ROPE_TRIGGER)
#define PDL_WAIT(trigger) do { pdl_wait(); if (trigger) pdl_launch_dependents(); } while (0)

__device__ __forceinline__ void report(int* err, int code, int a, int b, int c) {
  if (atomicCAS(err, 0, code) == 0) { err[1] = a; err[2] = b; err[3] = c; }
}

__device__ __forceinline__ float activate(float x, int act) {
  if (act == ACT_SILU) return x / (1.0f + expf(-x));
  if (act == ACT_GELU_TANH) return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide reductions; every thread gets the result. red: >= 32 floats of shared memory.
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  int w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads(); // red may still be read by a previous reduction
  if ((threadIdx.x & 31) == 0) red[w] = v;
  __syncthreads();
  float r = 0.0f;
  for (int i = 0; i < nw; i++) r += red[i];
  return r;
}
__device__ float block_max(float v, float* red) {
  v = warp_max(v);
  int w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[w] = v;
  __syncthreads();
  float r = red[0];
  for (int i = 1; i < nw; i++) r = fmaxf(r, red[i]);
  return r;
}

#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)
`;

/** The plain ops' kernels (module 'base'). */
const BASE_KERNEL_SOURCE = String.raw`
extern "C" __global__ void k_convert(const void* src, int sdt, void* dst, int ddt, i64 n) {
  GRID_STRIDE(i, n) st(dst, ddt, i, ld(src, sdt, i));
}

// y[t, :] = table[ids[t], :] * scale
extern "C" __global__ void k_embedding(const void* table, int tdt, const int* ids, u16* out, i64 T, i64 V, i64 D,
                                       float scale, int* err) {
  PDL_ENTRY();
  GRID_STRIDE(i, T * D) {
    i64 t = i / D, d = i - t * D;
    int id = ids[t];
    float v = 0.0f;
    if (id < 0 || id >= V) report(err, 1, (int)t, id, (int)V);
    else v = ld(table, tdt, (i64)id * D + d) * scale;
    out[i] = f2bf(v);
  }
}

// one block per row: y = x * rsqrt(mean(x^2) + eps) * (off + w)
extern "C" __global__ void k_rmsnorm(const void* x, int xdt, const void* w, int wdt, u16* out, i64 rows, int D,
                                     float eps, float off) {
  PDL_ENTRY();
  __shared__ float red[32];
  // bf16 rows of whole 16-byte chunks: 8 values a load (the scalar path took ~10 us a decode row)
  const bool vec = xdt == DT_BF16 && (D & 7) == 0 && (((unsigned long long)x) & 15) == 0 &&
                   (((unsigned long long)out) & 15) == 0;
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    float ss = 0.0f;
    if (vec) {
      const uint4* xr = (const uint4*)((const u16*)x + r * D);
      for (int d8 = threadIdx.x; d8 < (D >> 3); d8 += blockDim.x) {
        const uint4 v = xr[d8];
        const u16* h = (const u16*)&v;
        #pragma unroll
        for (int k = 0; k < 8; k++) { const float f = bf2f(h[k]); ss += f * f; }
      }
    } else {
      for (int d = threadIdx.x; d < D; d += blockDim.x) { float v = ld(x, xdt, r * D + d); ss += v * v; }
    }
    ss = block_sum(ss, red);
    float inv = rsqrtf(ss / (float)D + eps);
    if (vec) {
      const uint4* xr = (const uint4*)((const u16*)x + r * D);
      for (int d8 = threadIdx.x; d8 < (D >> 3); d8 += blockDim.x) {
        const uint4 v = xr[d8];
        const u16* h = (const u16*)&v;
        uint4 o;
        u16* oh = (u16*)&o;
        #pragma unroll
        for (int k = 0; k < 8; k++) oh[k] = f2bf(bf2f(h[k]) * inv * (off + ld(w, wdt, d8 * 8 + k)));
        ((uint4*)(out + r * D))[d8] = o;
      }
    } else {
      for (int d = threadIdx.x; d < D; d += blockDim.x)
        out[r * D + d] = f2bf(ld(x, xdt, r * D + d) * inv * (off + ld(w, wdt, d)));
    }
  }
}

extern "C" __global__ void k_add(const void* a, int adt, const void* b, int bdt, u16* out, i64 n, float bScale) {
  PDL_ENTRY();
  GRID_STRIDE(i, n) out[i] = f2bf(ld(a, adt, i) + bScale * ld(b, bdt, i));
}

extern "C" __global__ void k_scale(const void* x, int xdt, u16* out, i64 n, float s) {
  PDL_ENTRY();
  GRID_STRIDE(i, n) out[i] = f2bf(ld(x, xdt, i) * s);
}

extern "C" __global__ void k_softcap(const void* x, int xdt, u16* out, i64 n, float cap) {
  PDL_ENTRY();
  GRID_STRIDE(i, n) out[i] = f2bf(cap * tanhf(ld(x, xdt, i) / cap));
}

extern "C" __global__ void k_glu(const void* g, int gdt, const void* u, int udt, u16* out, i64 n, int act) {
  PDL_ENTRY();
  GRID_STRIDE(i, n) out[i] = f2bf(activate(ld(g, gdt, i), act) * ld(u, udt, i));
}

// Rotate-half rope on the first 2*half dims of each head; one block per token.
// invFreq: f32 [half] (invStride 0) or [T, half] (invStride half).
extern "C" __global__ void k_rope(const void* x, int xdt, const int* pos, const float* invFreq, u16* out, int T, int H,
                                  int D, int half, int invStride, float scaling) {
  PDL_ENTRY();
  for (int t = blockIdx.x; t < T; t += gridDim.x) {
    float p = (float)pos[t];
    for (int idx = threadIdx.x; idx < H * D; idx += blockDim.x) {
      int h = idx / D, d = idx - h * D;
      i64 base = ((i64)t * H + h) * D;
      if (d >= 2 * half) { out[base + d] = f2bf(ld(x, xdt, base + d)); continue; }
      int j = d < half ? d : d - half;
      float ang = __fmul_rn(p, invFreq[(i64)t * invStride + j]);
      float c = cosf(ang) * scaling, s = sinf(ang) * scaling;
      float a = ld(x, xdt, base + j), b = ld(x, xdt, base + j + half);
      out[base + d] = f2bf(d < half ? a * c - b * s : b * c + a * s);
    }
  }
}

// Writes k, v [T, rowElems] into pools [numSlots, rowElems] at slots[t]; slot -1 skips.
extern "C" __global__ void k_write_kv(void* kpool, void* vpool, int pdt, const void* k, int kdt, const void* v, int vdt,
                                      const int* slots, i64 T, i64 rowElems, i64 numSlots, int* err) {
  PDL_ENTRY();
  GRID_STRIDE(i, T * rowElems) {
    i64 t = i / rowElems, e = i - t * rowElems;
    int s = slots[t];
    if (s < 0) continue;
    if (s >= numSlots) { report(err, 2, (int)t, s, (int)numSlots); continue; }
    st(kpool, pdt, (i64)s * rowElems + e, ld(k, kdt, i));
    st(vpool, pdt, (i64)s * rowElems + e, ld(v, vdt, i));
  }
}

// Paged causal attention, one block per (token, head), online softmax over chunks of keys.
// Block: ATT_THREADS threads; thread i scores key i of the chunk, then each thread accumulates
// the output dims d = tid + k * ATT_THREADS (headDim <= 4 * ATT_THREADS).
#define ATT_THREADS 128
extern "C" __global__ void k_attention(const void* q, int qdt, const void* kpool, const void* vpool, int pdt,
                                       const int* rows, const int* poss, const int* tables, u16* out, int T, int H,
                                       int KVH, int D, int NB, int BS, int R, int MBR, int window, float scale,
                                       float softcap, int* err) {
  extern __shared__ float sh[];
  float* qs = sh;                         // [D]
  float* ps = qs + D;                     // [ATT_THREADS]
  int* slot_s = (int*)(ps + ATT_THREADS); // [ATT_THREADS]
  float* red = (float*)(slot_s + ATT_THREADS); // [32]
  int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  int kh = h / (H / KVH);
  int r = rows[t], p = poss[t];
  i64 obase = ((i64)t * H + h) * D;
  for (int d = tid; d < D; d += ATT_THREADS) qs[d] = ld(q, qdt, obase + d);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float m = NEG_INF, l = 0.0f;
  if (r < 0 || r >= R) {
    if (tid == 0 && h == 0) report(err, 3, t, r, R);
    p = -1; // attend to nothing
  }
  int start = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
  __syncthreads();
  for (int j0 = start; j0 <= p; j0 += ATT_THREADS) {
    int n = p - j0 + 1 < ATT_THREADS ? p - j0 + 1 : ATT_THREADS;
    float s = NEG_INF;
    int slot = -1;
    if (tid < n) {
      int j = j0 + tid;
      int lb = j / BS;
      int blk = lb < MBR ? tables[(i64)r * MBR + lb] : -1;
      if (blk < 0 || blk >= NB) {
        if (h == 0) report(err, 4, r, j, blk);
      } else {
        slot = blk * BS + (j - lb * BS);
        const i64 kb = ((i64)slot * KVH + kh) * D;
        float dot = 0.0f;
        for (int d = 0; d < D; d++) dot += qs[d] * ld(kpool, pdt, kb + d);
        s = dot * scale;
        if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
      }
    }
    float cmax = block_max(s, red);
    float mnew = fmaxf(m, cmax);
    float pj = (slot >= 0 && mnew != NEG_INF) ? expf(s - mnew) : 0.0f;
    ps[tid] = pj;
    slot_s[tid] = slot;
    float csum = block_sum(pj, red); // its barriers also publish ps / slot_s
    float corr = (m == NEG_INF) ? 0.0f : expf(m - mnew);
    if (mnew == NEG_INF) corr = 1.0f;
    l = l * corr + csum;
    m = mnew;
    for (int k = 0; k < 4; k++) {
      int d = tid + k * ATT_THREADS;
      if (d >= D) break;
      float a = acc[k] * corr;
      for (int jj = 0; jj < n; jj++) {
        float pw = ps[jj];
        if (pw != 0.0f) a += pw * ld(vpool, pdt, ((i64)slot_s[jj] * KVH + kh) * D + d);
      }
      acc[k] = a;
    }
    __syncthreads(); // ps / slot_s are rewritten by the next chunk
  }
  float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (int k = 0; k < 4; k++) {
    int d = tid + k * ATT_THREADS;
    if (d < D) out[obase + d] = f2bf(acc[k] * inv);
  }
}

// out[r, :] = x[idx[r], :] in units of 2 bytes (every dtype is 2 or 4 bytes)
extern "C" __global__ void k_gather_rows(const u16* x, const int* idx, u16* out, i64 R, i64 T, i64 rowUnits, int* err) {
  PDL_ENTRY();
  GRID_STRIDE(i, R * rowUnits) {
    i64 r = i / rowUnits, e = i - r * rowUnits;
    int src = idx[r];
    if (src < 0 || src >= T) { if (e == 0) report(err, 5, (int)r, src, (int)T); out[i] = 0; continue; }
    out[i] = x[(i64)src * rowUnits + e];
  }
}

// Router: per token, softmax over its E expert logits and the top K (ties to the lower index: the
// first of equal values in expert order), weights optionally renormalised over the chosen K.
// One warp per token (blocks of MOE_ROUTE_WARPS warps): lane l scans experts l, l + 32, ...; each of
// the K rounds takes every lane's best untaken expert (strict >, so its lowest index among equals)
// and a butterfly keeps the larger value, the lower index on ties, so every lane ends with the
// warp's pick; the lane holding it marks it taken (bit j of its mask: expert l + 32 j, E <= 2048,
// checked by the host). (Its one-thread-a-token predecessor re-read the chosen list from global
// memory for every candidate: 191 us a layer for Qwen3-30B-A3B's 128 experts at one token on the
// H200, 62% of the decode step.) A NaN logit compares false both ways, so lanes could then disagree:
// the picks are only defined for finite logits (as on the CPU, where NaN wins no comparison either).
extern "C" __global__ void k_moe_route(const void* logits, int ldt, float* weights, int* experts, int T, int E,
                                       int K, int renorm) {
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= T) return; // the whole warp: t is warp-uniform
  const i64 base = (i64)t * E;
  float mx = NEG_INF;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, ld(logits, ldt, base + e));
  mx = warp_max(mx);
  float z = 0.0f;
  for (int e = lane; e < E; e += 32) z += expf(ld(logits, ldt, base + e) - mx);
  z = warp_sum(z);
  unsigned long long taken = 0ull;
  float chosenSum = 0.0f;
  for (int k = 0; k < K; k++) {
    int best = -1;
    float bv = 0.0f;
    for (int j = 0, e = lane; e < E; j++, e += 32) {
      if ((taken >> j) & 1ull) continue;
      const float v = ld(logits, ldt, base + e);
      if (best < 0 || v > bv) { best = e; bv = v; }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int ob = __shfl_xor_sync(0xffffffffu, best, o);
      if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) { best = ob; bv = ov; }
    }
    const float pr = expf(bv - mx) / z;
    if (lane == 0) {
      experts[(i64)t * K + k] = best;
      weights[(i64)t * K + k] = pr;
    }
    if (best >= 0 && (best & 31) == lane) taken |= 1ull << (best >> 5);
    chosenSum += pr;
  }
  if (renorm && lane == 0) for (int k = 0; k < K; k++) weights[(i64)t * K + k] /= chosenSum;
}

// hidden[t, k, n] = act(gate_e[n, :] . x[t, :]) * (up_e[n, :] . x[t, :]), e = experts[t, k].
// grid (ceil(I / 8), T * K), 256 threads: one warp per n.
extern "C" __global__ void k_moe_hidden(const void* x, int xdt, const int* experts, const void* gate, int gdt,
                                        const void* up, int udt, float* hidden, int TK, int K, int D, int I, int E,
                                        int act, int* err) {
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int n = blockIdx.x * 8 + w;
  for (int tk = blockIdx.y; tk < TK; tk += gridDim.y) {
    if (n >= I) continue;
    int t = tk / K;
    int e = experts[tk];
    if (e < 0 || e >= E) {
      if (lane == 0) { report(err, 6, t, e, E); hidden[(i64)tk * I + n] = 0.0f; }
      continue;
    }
    const i64 wb = ((i64)e * I + n) * D, xb = (i64)t * D;
    float g = 0.0f, u = 0.0f;
    for (int d = lane; d < D; d += 32) {
      float xv = ld(x, xdt, xb + d);
      g += ld(gate, gdt, wb + d) * xv;
      u += ld(up, udt, wb + d) * xv;
    }
    g = warp_sum(g);
    u = warp_sum(u);
    if (lane == 0) hidden[(i64)tk * I + n] = activate(g, act) * u;
  }
}

// out[t, d] = sum_k weights[t, k] * (down_e[d, :] . hidden[t, k, :]); grid (ceil(D / 8), T).
extern "C" __global__ void k_moe_down(const float* hidden, const float* weights, const int* experts, const void* down,
                                      int ddt, u16* out, int T, int K, int D, int I, int E) {
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int d = blockIdx.x * 8 + w;
  if (d >= D) return;
  for (int t = blockIdx.y; t < T; t += gridDim.y) {
    float acc = 0.0f;
    for (int k = 0; k < K; k++) {
      int e = experts[(i64)t * K + k];
      if (e < 0 || e >= E) continue; // reported by k_moe_hidden
      const i64 wb = ((i64)e * D + d) * I, hb = ((i64)t * K + k) * I;
      float s = 0.0f;
      for (int n = lane; n < I; n += 32) s += ld(down, ddt, wb + n) * hidden[hb + n];
      acc += weights[(i64)t * K + k] * warp_sum(s);
    }
    if (lane == 0) out[(i64)t * D + d] = f2bf(acc);
  }
}

// y[m, n] = bf16(src[m, n] + bias[n]) (bias may be null): the epilogue of an f32-output GEMM.
extern "C" __global__ void k_matmul_finish(const float* src, const void* bias, int bdt, u16* out, i64 M, i64 N) {
  GRID_STRIDE(i, M * N) {
    float v = src[i];
    if (bias) v += ld(bias, bdt, i % N);
    out[i] = f2bf(v);
  }
}

// Plain GEMM for shapes cuBLASLt declines (and as a cross-check): one warp per output element.
// grid (ceil(N / 8), min(M, 65535)), 256 threads.
extern "C" __global__ void k_matmul_simple(const void* x, int xdt, const void* w, int wdt, const void* bias, int bdt,
                                           u16* out, int M, int N, int K) {
  int wp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int n = blockIdx.x * 8 + wp;
  if (n >= N) return;
  for (int m = blockIdx.y; m < M; m += gridDim.y) {
    float s = 0.0f;
    for (int k = lane; k < K; k += 32) s += ld(x, xdt, (i64)m * K + k) * ld(w, wdt, (i64)n * K + k);
    s = warp_sum(s);
    if (lane == 0) {
      if (bias) s += ld(bias, bdt, n);
      out[(i64)m * N + n] = f2bf(s);
    }
  }
}

// Reads n 16-byte words (the GEMM tuner's L2 flush, gemm.ts: leaves L2 full of clean lines, where a
// memset leaves dirty ones that the timed call would have to write back). The sink is written only
// for a sum no data makes (so the loads cannot be dropped). grid-stride, any grid.
extern "C" __global__ void k_l2_flush_read(const uint4* p, i64 n, unsigned* sink) {
  unsigned x = 0u;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    const uint4 v = p[i];
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x9e3779b9u && sink) *sink = x;
}
`;

const BASE_KERNEL_NAMES = [
  'k_convert', 'k_embedding', 'k_rmsnorm', 'k_add', 'k_scale', 'k_softcap', 'k_glu', 'k_rope', 'k_write_kv',
  'k_attention', 'k_gather_rows', 'k_moe_route', 'k_moe_hidden', 'k_moe_down', 'k_matmul_finish', 'k_matmul_simple',
  'k_l2_flush_read',
] as const;

/** One NVRTC module: its own source, cache entry (nvrtc.ts) and kernels. */
export interface KernelModule<K extends string = string> {
  /** short and file-name safe: it names the cache file and appears in errors and the backend's describe() */
  readonly name: string;
  /** KERNEL_PRELUDE + the module's kernels: what NVRTC compiles and the cache key hashes */
  readonly source: string;
  /** every kernel the module defines (looked up by name once the module is loaded) */
  readonly kernels: readonly K[];
}

/**
 * The macros put before a module's source, for experiments with its tuning macros
 * (CudaKernelSettings: the attention, gemv and fused modules'; none by default, so the default
 * source is the module's alone). The module's cache key is its source, so each setting is compiled
 * and cached apart.
 */
export function moduleDefines(defines: KernelDefines): string {
  return Object.entries(defines).map(([name, value]) => `#define ${name} ${value}\n`).join('');
}

function kernelModule<K extends string>(name: string, body: string, kernels: readonly K[]): KernelModule<K> {
  return { name, source: KERNEL_PRELUDE + body, kernels };
}

/**
 * Every kernel module as `s` builds them (the attention module's host-planned macros, batch-invariant
 * mode's among them, and each module's tuning defines; CUDA_DEFAULTS gives the default sources). Adding one is one line here
 * (its file exports the source, which may use KERNEL_PRELUDE's helpers, and the kernel names).
 * They start compiling in this order, at most a few at a time (nvrtc.ts): heaviest first.
 */
export function kernelModules(s: Pick<CudaSettings, 'kernels' | 'attention'> & Partial<Pick<CudaSettings, 'batchInvariant'>>) {
  return [
    kernelModule('attention', moduleDefines(s.kernels.attentionDefines) + attentionKernelSource(s.attention, s.batchInvariant ?? false),
      ATTENTION_KERNEL_NAMES),
    kernelModule('base', BASE_KERNEL_SOURCE, BASE_KERNEL_NAMES),
    kernelModule('fused', moduleDefines(s.kernels.fusedDefines) + FUSED_KERNEL_SOURCE, FUSED_KERNEL_NAMES),
    // the bf16 MoE kernels and the FP8 weight kernels share the GEMV kernels' loaders (moe-kernels.ts, fp8-kernels.ts)
    kernelModule('gemv', moduleDefines(s.kernels.gemvDefines) + ATTENTION_PRIMITIVES + GEMV_KERNEL_SOURCE + MOE_KERNEL_SOURCE +
      FP8_KERNEL_SOURCE,
      [...GEMV_KERNEL_NAMES, ...GEMVP_KERNEL_NAMES, ...GEMVP_GLU_KERNEL_NAMES, ...GEMVP_NORM_KERNEL_NAMES, ...GEMVP_NORMGLU_KERNEL_NAMES,
        ...GEMVP_NORMROPE_KERNEL_NAMES, ...MOE_KERNEL_NAMES, ...FP8_KERNEL_NAMES] as const),
    kernelModule('sampling', SAMPLING_KERNEL_SOURCE, SAMPLING_KERNEL_NAMES),
  ] as const;
}

/** Any kernel of any module (rt.launch looks it up in the module that defines it). */
export type KernelName = ReturnType<typeof kernelModules>[number]['kernels'][number];

/** Every kernel of every module (the same whatever the settings). */
export const KERNEL_NAMES: readonly KernelName[] = kernelModules(CUDA_DEFAULTS).flatMap((m): readonly KernelName[] => m.kernels);

/**
 * threads per block of k_attention (its shared memory layout depends on it). k_attention is the
 * generic fallback of the fast kernels in attention-kernels.ts (launch logic: attention.ts).
 */
export const ATT_THREADS = 128;
/** the largest head dim k_attention handles (4 accumulators per thread) */
export const ATT_MAX_HEAD_DIM = 4 * ATT_THREADS;
