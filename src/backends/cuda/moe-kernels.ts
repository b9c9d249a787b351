// CUDA source of the bf16 mixture-of-experts FFN kernels (k_moe_hidden_v, k_moe_down_v): the
// vectorized twins of kernels.ts' k_moe_hidden / k_moe_down, with the same semantics (the same
// outputs up to f32 summation order, the same error reporting). They follow GEMV_KERNEL_SOURCE in
// the 'gemv' module (kernelModules in kernels.ts) and use its loaders and dot product
// (gemv_ld_stream, gemv_ld_cached, gemv_dot8), after KERNEL_PRELUDE's helpers.
//
// Why: a decode step of a Qwen3-30B-A3B-style model (D 2048, 128 experts of I 768, top 8) streams
// the chosen experts' rows once, as a dense decode GEMV streams its weights, but the generic
// kernels (one warp per output row, one 2-byte load per lane and step through the dtype-generic
// ld()) read them at ~0.24 of the H200's copy bandwidth. Here, as in gemv-kernels.ts, each lane
// streams 16-byte chunks (8 bf16) of the weight rows with several independent loads in flight
// (ld.global.nc.L1::no_allocate: every weight byte is read once), reads the matching chunks of the
// small activations (x, hidden) through the cached read-only path, and accumulates in f32.
//
// Layout (256 threads, 8 warps a block, one warp per output row; grids as the generic kernels'):
//   k_moe_hidden_v, grid (ceil(I / 8), min(T K, 65535)): warp = row n of pair tk's expert; a lane
//     holds MOE_UNR_H chunks of the gate row and MOE_UNR_H of the up row, 2 MOE_UNR_H 16-byte loads
//     in flight (16 at the default 8: one pass covers D = 2048, 256 chunks).
//   k_moe_down_v, grid (ceil(D / 8), min(T, 65535)): warp = output (t, d); its K rows down_e[d, :]
//     are one stream of K I / 8 chunks (k = chunk / (I / 8)), so a lane keeps MOE_UNR_D loads in
//     flight across the experts (K 8, I 768: 768 chunks, 3 passes of 8 a lane).
// Both refill a lane's slot u with the next pass's chunk u as soon as slot u is multiplied (the
// ring of gemv-kernels.ts' persistent kernels), so the loads stay in flight across passes.
// __launch_bounds__(256, 2) caps a thread at 128 registers (two blocks an SM); NVRTC 11.8 and
// ptxas 13 for sm_90 use 100 (hidden) and 96 (down), no spills. On the H200 they read 1.2x faster than the generic kernels at B=1; the
// host runs them by default where they apply ($LLMTS_CUDA_MOE=scalar: the generic ones; cuda-moe-ops.ts).
// Requirements (checked by the host, cuda-moe-ops.ts): bf16 x and weights, D % 8 == 0,
// I % 8 == 0, x / gate / up / down / hidden 16-byte aligned.
//
// PDL_ENTRY comes first: the weights' addresses depend on the experts the kernel before wrote, so
// here nothing can be fetched ahead of it (the kernels are not in pdl.ts' PDL_KERNELS).
// k_moe_down_v multiplies each chunk's partial dot by its routing weight (sum_k sum_c w_k p_kc
// instead of sum_k w_k sum_c p_kc): a reassociation of the same f32 sums.
import type { DType } from '../../contracts/backend.ts';
import type { CudaMoeSettings } from './cuda-settings.ts';

export const MOE_KERNEL_SOURCE = String.raw`
#ifndef MOE_UNR_H
#define MOE_UNR_H 8
#endif
#ifndef MOE_UNR_D
#define MOE_UNR_D 8
#endif

// 8 bf16 values (a chunk of a weight row) . 8 f32 values (h0, h1)
__device__ __forceinline__ float moe_dot8v(const uint4& w, const uint4& h0, const uint4& h1) {
  const unsigned* uw = (const unsigned*)&w;
  const unsigned* a = (const unsigned*)&h0;
  const unsigned* b = (const unsigned*)&h1;
  float s = 0.0f;
  #pragma unroll
  for (int k = 0; k < 2; k++) {
    s += __uint_as_float(uw[k] << 16) * __uint_as_float(a[2 * k]);
    s += __uint_as_float(uw[k] & 0xffff0000u) * __uint_as_float(a[2 * k + 1]);
    s += __uint_as_float(uw[k + 2] << 16) * __uint_as_float(b[2 * k]);
    s += __uint_as_float(uw[k + 2] & 0xffff0000u) * __uint_as_float(b[2 * k + 1]);
  }
  return s;
}
// the same with the 8 f32 values at h (two 16-byte cached loads)
__device__ __forceinline__ float moe_dot8f(const uint4& w, const uint4* h) {
  return moe_dot8v(w, gemv_ld_cached(h), gemv_ld_cached(h + 1));
}

// hidden[tk, n] = act(gate_e[n, :] . x[t, :]) * (up_e[n, :] . x[t, :]), e = experts[tk], t = tk / K
extern "C" __global__ void __launch_bounds__(256, 2) k_moe_hidden_v(const u16* x, const int* experts, const u16* gate,
    const u16* up, float* hidden, int TK, int K, int D, int I, int E, int act, int* err) {
  PDL_ENTRY();
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (n >= I) return; // the whole warp: no block barrier follows
  const int nch = D >> 3, step = 32 * MOE_UNR_H;
  const int passes = (nch + step - 1) / step;
  for (int tk = blockIdx.y; tk < TK; tk += gridDim.y) {
    const int t = tk / K, e = experts[tk];
    if (e < 0 || e >= E) {
      if (lane == 0) { report(err, 6, t, e, E); hidden[(i64)tk * I + n] = 0.0f; }
      continue;
    }
    const i64 row = ((i64)e * I + n) * nch;
    const uint4* gr = (const uint4*)gate + row;
    const uint4* ur = (const uint4*)up + row;
    const uint4* xr = (const uint4*)x + (i64)t * nch;
    uint4 gv[MOE_UNR_H], uv[MOE_UNR_H];
    #pragma unroll
    for (int u = 0; u < MOE_UNR_H; u++) {
      const int c = u * 32 + lane;
      gv[u] = c < nch ? gemv_ld_stream(gr + c) : make_uint4(0u, 0u, 0u, 0u);
      uv[u] = c < nch ? gemv_ld_stream(ur + c) : make_uint4(0u, 0u, 0u, 0u);
    }
    float g = 0.0f, s = 0.0f;
    for (int p = 0; p < passes; p++) {
      #pragma unroll
      for (int u = 0; u < MOE_UNR_H; u++) {
        const int c = p * step + u * 32 + lane;
        if (c < nch) {
          const uint4 xv = gemv_ld_cached(xr + c);
          g += gemv_dot8(gv[u], xv);
          s += gemv_dot8(uv[u], xv);
        }
        if (c + step < nch) { // the ring: slot u's chunk of the next pass, in flight from now
          gv[u] = gemv_ld_stream(gr + c + step);
          uv[u] = gemv_ld_stream(ur + c + step);
        }
      }
    }
    g = warp_sum(g);
    s = warp_sum(s);
    if (lane == 0) hidden[(i64)tk * I + n] = activate(g, act) * s;
  }
}

// Chunk j of output row d's stream is chunk j - k nch of down_e[d, :], k = j / nch, e = ex[k].
// moe_down_slot: its k (with e), or -1 past the stream or for an expert outside [0, E) (reported
// by k_moe_hidden_v, skipped here); moe_down_load: its weights (split so that a pass's expert ids
// are all read before its weight loads wait on them).
__device__ __forceinline__ int moe_down_slot(const int* ex, int j, int total, int nch, int E, int& e) {
  if (j >= total) return -1;
  const int k = j / nch;
  e = ex[k];
  return e >= 0 && e < E ? k : -1;
}
__device__ __forceinline__ uint4 moe_down_load(const u16* down, int j, int k, int e, int nch, int d, int D) {
  return gemv_ld_stream((const uint4*)down + ((i64)e * D + d) * nch + (j - k * nch));
}

// out[t, d] = bf16(sum_k weights[t, k] * (down_e[d, :] . hidden[t, k, :])), e = experts[t, k]
extern "C" __global__ void __launch_bounds__(256, 2) k_moe_down_v(const float* hidden, const float* weights,
    const int* experts, const u16* down, u16* out, int T, int K, int D, int I, int E) {
  PDL_ENTRY();
  const int lane = threadIdx.x & 31;
  const int d = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (d >= D) return; // the whole warp: no block barrier follows
  const int nch = I >> 3, total = K * nch, step = 32 * MOE_UNR_D;
  const int passes = (total + step - 1) / step;
  for (int t = blockIdx.y; t < T; t += gridDim.y) {
    const int* ex = experts + (i64)t * K;
    uint4 wv[MOE_UNR_D];
    int kv[MOE_UNR_D], ev[MOE_UNR_D]; // slot u's expert slot k (-1: none) and expert
    #pragma unroll
    for (int u = 0; u < MOE_UNR_D; u++) kv[u] = moe_down_slot(ex, u * 32 + lane, total, nch, E, ev[u]);
    #pragma unroll
    for (int u = 0; u < MOE_UNR_D; u++) {
      wv[u] = kv[u] >= 0 ? moe_down_load(down, u * 32 + lane, kv[u], ev[u], nch, d, D) : make_uint4(0u, 0u, 0u, 0u);
    }
    float acc = 0.0f;
    for (int p = 0; p < passes; p++) {
      int kn[MOE_UNR_D], en[MOE_UNR_D]; // the next pass's
      #pragma unroll
      for (int u = 0; u < MOE_UNR_D; u++) kn[u] = moe_down_slot(ex, (p + 1) * step + u * 32 + lane, total, nch, E, en[u]);
      #pragma unroll
      for (int u = 0; u < MOE_UNR_D; u++) {
        const int j = p * step + u * 32 + lane, k = kv[u];
        if (k >= 0) {
          const uint4* h = (const uint4*)(hidden + ((i64)t * K + k) * I) + 2 * (j - k * nch);
          acc += weights[(i64)t * K + k] * moe_dot8f(wv[u], h);
        }
        if (kn[u] >= 0) wv[u] = moe_down_load(down, j + step, kn[u], en[u], nch, d, D); // the ring, as above
        kv[u] = kn[u];
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) out[(i64)t * D + d] = f2bf(acc);
  }
}

// ---- grouped by expert (moeFfn at CudaMoeSettings.groupedMinRows tokens and more) ----
//
// Why: k_moe_hidden_v / k_moe_down_v read each (token, expert) pair's weight rows, so an expert chosen
// by several tokens of a step is streamed once per token (16 tokens x 8 of 128 experts: 128 expert
// reads a layer where ~81 experts are distinct; a 512-token prefill chunk: 4,096 where 128 are). Here
// a pass of up to CudaMoeSettings.passRows tokens is first grouped by expert (k_moe_group), then each warp
// streams one weight row of an active expert once per MOE_GROUP_TOKENS of its pairs and multiplies
// it with each of their activations; the down projection writes each pair's f32 output row, and
// k_moe_combine sums a token's pairs in k order (the order the other kernels sum in, up to f32
// reassociation: no atomics, so the results do not depend on scheduling).
//
// grp, ints: [0] the active experts nAct; [1, 1 + TK) the active experts in expert order; [1 + TK,
// 2 + 2 TK) their first pair in order[] (entry nAct: the valid pairs); [2 + 2 TK, 2 + 3 TK) order[]:
// the chunk's pair indices (t K + k) grouped by expert (in any order within an expert: each pair's
// sums are its own, so the order changes no result).
#ifndef MOE_GROUP_TOKENS
#define MOE_GROUP_TOKENS 8
#endif

// exclusive prefix sums of s[0, n), n <= 2 blockDim.x, in place; returns the total (all threads;
// tmp: blockDim.x ints)
__device__ __forceinline__ int moe_scan(int* s, int n, int* tmp) {
  const int t = threadIdx.x, i0 = 2 * t;
  const int a = i0 < n ? s[i0] : 0, b = i0 + 1 < n ? s[i0 + 1] : 0;
  tmp[t] = a + b;
  __syncthreads();
  for (int o = 1; o < (int)blockDim.x; o <<= 1) { // Hillis-Steele, inclusive
    const int v = t >= o ? tmp[t - o] : 0;
    __syncthreads();
    tmp[t] += v;
    __syncthreads();
  }
  const int before = tmp[t] - a - b, total = tmp[blockDim.x - 1];
  if (i0 < n) s[i0] = before;
  if (i0 + 1 < n) s[i0 + 1] = before + a;
  __syncthreads();
  return total;
}

// grp read back: the active experts (act[0, nAct)), each one's pairs order[start[j], start[j + 1])
struct MoeGroups {
  int nAct;
  const int* act;
  const int* start;
  const int* order;
};
__device__ __forceinline__ MoeGroups moe_groups(const int* grp, int TK) {
  MoeGroups g;
  g.nAct = grp[0];
  g.act = grp + 1;
  g.start = grp + 1 + TK;
  g.order = grp + 2 + 2 * TK;
  return g;
}

// One block of MOE_GROUP_THREADS: grp for the TK pairs of experts[] (E <= 2 MOE_GROUP_THREADS). A
// pair whose expert is outside [0, E) is left out, reported (error 6: token tBase + i / K, expert,
// E) and its hidden row zeroed, as k_moe_hidden_v does.
extern "C" __global__ void __launch_bounds__(1024) k_moe_group(const int* experts, int TK, int K, int E, int I,
    int tBase, int* grp, float* hidden, int* err) {
  __shared__ int s_start[2048]; // per expert: its count, then its first pair, then the scatter cursor
  __shared__ int s_act[2048];   // per expert: 1 if active, then its index among the active
  __shared__ int s_tmp[1024];
  const int tid = threadIdx.x, nt = blockDim.x;
  for (int e = tid; e < E; e += nt) s_start[e] = 0;
  __syncthreads();
  for (int i = tid; i < TK; i += nt) {
    const int e = experts[i];
    if (e >= 0 && e < E) {
      atomicAdd(&s_start[e], 1);
    } else {
      report(err, 6, tBase + i / K, e, E);
      for (int n = 0; n < I; n++) hidden[(i64)i * I + n] = 0.0f;
    }
  }
  __syncthreads();
  for (int e = tid; e < E; e += nt) s_act[e] = s_start[e] > 0 ? 1 : 0;
  __syncthreads();
  const int nAct = moe_scan(s_act, E, s_tmp);
  const int nValid = moe_scan(s_start, E, s_tmp);
  int* act = grp + 1;
  int* start = grp + 1 + TK;
  int* order = grp + 2 + 2 * TK;
  for (int e = tid; e < E; e += nt) {
    const int next = e + 1 < E ? s_start[e + 1] : nValid;
    if (next > s_start[e]) {
      act[s_act[e]] = e;
      start[s_act[e]] = s_start[e];
    }
  }
  if (tid == 0) {
    grp[0] = nAct;
    start[nAct] = nValid;
  }
  __syncthreads(); // the starts are read; now they are cursors
  for (int i = tid; i < TK; i += nt) {
    const int e = experts[i];
    if (e >= 0 && e < E) order[atomicAdd(&s_start[e], 1)] = i;
  }
}

// hidden[i, n] = act(gate_e[n, :] . x[i / K, :]) * (up_e[n, :] . x[i / K, :]) for every pair i of
// active expert e = act[j], j = blockIdx.y, blockIdx.y + gridDim.y, ...; a warp owns R rows
// n = blockIdx.x 8 R + 8 r + warp (r < R), their gate and up rows streamed together, U chunks a lane
// a row in flight, for Q of the group's pairs at a time: k_moe_hidden_g (R = 1, U = MOE_UNR_H,
// Q = MOE_GROUP_TOKENS) or k_moe_hidden_g2 (R = 2, U = 4, Q = 4: 128 registers without spills under
// nvcc 13; half the blocks, as k_moe_down_g4 for the down projection; a group of more than 4 pairs
// streams its rows again for each 4, from L2). A lane's chunks and their summation order are
// k_moe_hidden_v's for any R, U and Q, so each value is the same bits.
template <int R, int U, int Q>
__device__ __forceinline__ void moe_hidden_g_rows(const u16* x, const int* grp, const u16* gate, const u16* up,
    float* hidden, int TK, int K, int D, int I, int act) {
  const int lane = threadIdx.x & 31;
  const int n0 = blockIdx.x * 8 * R + (threadIdx.x >> 5);
  if (n0 >= I) return; // the whole warp: no block barrier follows
  const MoeGroups G = moe_groups(grp, TK);
  const int nch = D >> 3, step = 32 * U;
  const int passes = (nch + step - 1) / step;
  for (int j = blockIdx.y; j < G.nAct; j += gridDim.y) {
    const int e = G.act[j], p1 = G.start[j + 1];
    const i64 row = ((i64)e * I + n0) * nch; // row n0; row n0 + 8 r at + 8 r nch
    const uint4* gr = (const uint4*)gate + row;
    const uint4* ur = (const uint4*)up + row;
    for (int b0 = G.start[j]; b0 < p1; b0 += Q) {
      const int nb = min(Q, p1 - b0);
      int tok[Q];
      float g[R][Q], s[R][Q];
      #pragma unroll
      for (int q = 0; q < Q; q++) {
        tok[q] = q < nb ? G.order[b0 + q] / K : 0;
        #pragma unroll
        for (int r = 0; r < R; r++) g[r][q] = s[r][q] = 0.0f;
      }
      for (int p = 0; p < passes; p++) {
        uint4 gv[R][U], uv[R][U];
        #pragma unroll
        for (int r = 0; r < R; r++) {
          #pragma unroll
          for (int u = 0; u < U; u++) {
            const int c = p * step + u * 32 + lane;
            const bool ok = c < nch && n0 + 8 * r < I;
            gv[r][u] = ok ? gemv_ld_stream(gr + (i64)8 * r * nch + c) : make_uint4(0u, 0u, 0u, 0u);
            uv[r][u] = ok ? gemv_ld_stream(ur + (i64)8 * r * nch + c) : make_uint4(0u, 0u, 0u, 0u);
          }
        }
        #pragma unroll
        for (int u = 0; u < U; u++) {
          const int c = p * step + u * 32 + lane;
          if (c >= nch) continue;
          #pragma unroll
          for (int q = 0; q < Q; q++) {
            if (q < nb) {
              const uint4 xv = gemv_ld_cached((const uint4*)x + (i64)tok[q] * nch + c);
              #pragma unroll
              for (int r = 0; r < R; r++) {
                g[r][q] += gemv_dot8(gv[r][u], xv);
                s[r][q] += gemv_dot8(uv[r][u], xv);
              }
            }
          }
        }
      }
      #pragma unroll
      for (int r = 0; r < R; r++) {
        if (n0 + 8 * r >= I) continue; // warp-uniform
        #pragma unroll
        for (int q = 0; q < Q; q++) {
          if (q < nb) {
            const float gq = warp_sum(g[r][q]), sq = warp_sum(s[r][q]);
            if (lane == 0) hidden[(i64)G.order[b0 + q] * I + n0 + 8 * r] = activate(gq, act) * sq;
          }
        }
      }
    }
  }
}
extern "C" __global__ void __launch_bounds__(256, 2) k_moe_hidden_g(const u16* x, const int* grp, const u16* gate,
    const u16* up, float* hidden, int TK, int K, int D, int I, int act) {
  PDL_ENTRY();
  moe_hidden_g_rows<1, MOE_UNR_H, MOE_GROUP_TOKENS>(x, grp, gate, up, hidden, TK, K, D, I, act);
}
extern "C" __global__ void __launch_bounds__(256, 2) k_moe_hidden_g2(const u16* x, const int* grp, const u16* gate,
    const u16* up, float* hidden, int TK, int K, int D, int I, int act) {
  PDL_ENTRY();
  moe_hidden_g_rows<2, 4, 4>(x, grp, gate, up, hidden, TK, K, D, I, act);
}

// ypair[i, d] = down_e[d, :] . hidden[i, :] for every pair i of active expert e (as k_moe_hidden_g
// walks them). A warp owns R output rows d = blockIdx.x 8 R + 8 r + warp (r < R) and streams them
// together, U chunks a lane a row in flight, each hidden chunk read once for its R rows: k_moe_down_g
// (R = 1, U = MOE_UNR_D) or k_moe_down_g4 (R = 4, U = 3: 128 registers without spills under nvcc 13,
// one pass over Qwen3-30B-A3B's 768-wide rows; a quarter of the blocks, each with 4x the bytes in
// flight: at a few tokens an expert, a block read little more than its group's ids before its
// weights, so the launch was a chain of many short waves). A lane sums its chunks in the same order
// for any R and U: the same bits.
template <int R, int U>
__device__ __forceinline__ void moe_down_g_rows(const float* hidden, const int* grp, const u16* down, float* ypair,
    int TK, int D, int I) {
  const int lane = threadIdx.x & 31;
  const int d0 = blockIdx.x * 8 * R + (threadIdx.x >> 5);
  if (d0 >= D) return; // the whole warp: no block barrier follows
  const MoeGroups G = moe_groups(grp, TK);
  const int nch = I >> 3, step = 32 * U;
  const int passes = (nch + step - 1) / step;
  for (int j = blockIdx.y; j < G.nAct; j += gridDim.y) {
    const int e = G.act[j], p1 = G.start[j + 1];
    const uint4* dr = (const uint4*)down + ((i64)e * D + d0) * nch; // row d0; row d0 + 8 r at + 8 r nch
    for (int b0 = G.start[j]; b0 < p1; b0 += MOE_GROUP_TOKENS) {
      const int nb = min(MOE_GROUP_TOKENS, p1 - b0);
      int pr[MOE_GROUP_TOKENS];
      float acc[R][MOE_GROUP_TOKENS];
      #pragma unroll
      for (int q = 0; q < MOE_GROUP_TOKENS; q++) {
        pr[q] = q < nb ? G.order[b0 + q] : 0;
        #pragma unroll
        for (int r = 0; r < R; r++) acc[r][q] = 0.0f;
      }
      for (int p = 0; p < passes; p++) {
        uint4 wv[R][U];
        #pragma unroll
        for (int r = 0; r < R; r++) {
          #pragma unroll
          for (int u = 0; u < U; u++) {
            const int c = p * step + u * 32 + lane;
            wv[r][u] = c < nch && d0 + 8 * r < D ? gemv_ld_stream(dr + (i64)8 * r * nch + c) : make_uint4(0u, 0u, 0u, 0u);
          }
        }
        #pragma unroll
        for (int u = 0; u < U; u++) {
          const int c = p * step + u * 32 + lane;
          if (c >= nch) continue;
          #pragma unroll
          for (int q = 0; q < MOE_GROUP_TOKENS; q++) {
            if (q >= nb) continue;
            const uint4* h = (const uint4*)(hidden + (i64)pr[q] * I) + 2 * c;
            const uint4 h0 = gemv_ld_cached(h), h1 = gemv_ld_cached(h + 1);
            #pragma unroll
            for (int r = 0; r < R; r++) acc[r][q] += moe_dot8v(wv[r][u], h0, h1);
          }
        }
      }
      #pragma unroll
      for (int r = 0; r < R; r++) {
        if (d0 + 8 * r >= D) continue; // warp-uniform
        #pragma unroll
        for (int q = 0; q < MOE_GROUP_TOKENS; q++) {
          if (q < nb) {
            const float a = warp_sum(acc[r][q]);
            if (lane == 0) ypair[(i64)pr[q] * D + d0 + 8 * r] = a;
          }
        }
      }
    }
  }
}
extern "C" __global__ void __launch_bounds__(256, 2) k_moe_down_g(const float* hidden, const int* grp, const u16* down,
    float* ypair, int TK, int D, int I) {
  PDL_ENTRY();
  moe_down_g_rows<1, MOE_UNR_D>(hidden, grp, down, ypair, TK, D, I);
}
extern "C" __global__ void __launch_bounds__(256, 2) k_moe_down_g4(const float* hidden, const int* grp, const u16* down,
    float* ypair, int TK, int D, int I) {
  PDL_ENTRY();
  moe_down_g_rows<4, 3>(hidden, grp, down, ypair, TK, D, I);
}

// hidden as k_moe_hidden_g makes it, on tensor cores (moeFfn from MOE_TC_MIN_ROWS tokens: prefill,
// where an expert has many tokens and the CUDA-core dot products, not the bytes, set the time).
// grid (ceil(I / 64), gridY), 128 threads: the block's 64 rows n0 .. n0 + 63 of active expert j
// (blockIdx.y, + gridDim.y, ...) for its pairs in tiles of 16; warp w owns rows n0 + 16 w .. + 15 of
// gate and of up (two n8 tiles each), so the GLU is made from its own accumulators. Per 32 of D:
// the 16 pairs' x rows (A, row-major) and the 64 gate and 64 up rows (B: W[n, k] rows are B's
// columns) travel by cp.async into double-buffered shared tiles (rows padded to 40 elements:
// ldmatrix without bank conflicts), then 2 k16 steps of 4 mma m16n8k16 a warp. Pairs past the
// group's end and rows past I are zero-filled and never stored; D % 8 == 0 (16-byte chunks).
enum { MOE_TC_BK = 32, MOE_TC_LDS = MOE_TC_BK + 8, MOE_TC_ROWS = 64 };

// cp.async of rows r0 .. r0 + 63, columns k0 .. k0 + 31 of a row-major [N, Kd] bf16 matrix into a
// shared tile of MOE_TC_LDS-element rows; zeros past N or Kd (all 128 threads; the caller commits)
__device__ __forceinline__ void moe_tc_stage_rows(u16* tile, const u16* m, int r0, int N, int Kd, int k0) {
  for (int i = threadIdx.x; i < MOE_TC_ROWS * 4; i += 128) {
    const int r = i >> 2, c = k0 + 8 * (i & 3), n = r0 + r;
    const bool ok = n < N && c < Kd;
    att_cp16(tile + r * MOE_TC_LDS + 8 * (i & 3), m + (ok ? (i64)n * Kd + c : 0), ok);
  }
}

// accumulator q (0 .. 3) of an m16n8 mma tile: its row (pair slot of the 16) and its column in the n8 tile
__device__ __forceinline__ int moe_tc_row(int lane, int q) { return (lane >> 2) + (q >> 1) * 8; }
__device__ __forceinline__ int moe_tc_col(int lane, int q) { return 2 * (lane & 3) + (q & 1); }
extern "C" __global__ void __launch_bounds__(128) k_moe_hidden_tc(const u16* x, const int* grp, const u16* gate,
    const u16* up, float* hidden, int TK, int K, int D, int I, int act) {
  PDL_ENTRY();
  __shared__ uint4 s_a4[2 * 16 * MOE_TC_LDS / 8];
  __shared__ uint4 s_g4[2 * MOE_TC_ROWS * MOE_TC_LDS / 8];
  __shared__ uint4 s_u4[2 * MOE_TC_ROWS * MOE_TC_LDS / 8];
  __shared__ int s_tok[16], s_pair[16];
  u16* s_a = (u16*)s_a4;
  u16* s_g = (u16*)s_g4;
  u16* s_u = (u16*)s_u4;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n0 = blockIdx.x * MOE_TC_ROWS;
  const MoeGroups G = moe_groups(grp, TK);
  const int nk = (D + MOE_TC_BK - 1) / MOE_TC_BK;
  for (int j = blockIdx.y; j < G.nAct; j += gridDim.y) {
    const int e = G.act[j], p1 = G.start[j + 1];
    const u16* ge = gate + (i64)e * I * D;
    const u16* ue = up + (i64)e * I * D;
    for (int b0 = G.start[j]; b0 < p1; b0 += 16) {
      const int nb = min(16, p1 - b0);
      if (tid < 16) {
        s_pair[tid] = tid < nb ? G.order[b0 + tid] : -1;
        s_tok[tid] = tid < nb ? G.order[b0 + tid] / K : 0;
      }
      __syncthreads();
      float ag[2][4], au[2][4];
      for (int t = 0; t < 2; t++) for (int q = 0; q < 4; q++) ag[t][q] = au[t][q] = 0.0f;
      // stage st <- columns k0 .. k0 + 31: the pairs' x rows, then gate and up rows n0 ..
      #define MOE_TC_ISSUE(st, k0) do { \
        if (tid < 64) { \
          const int r_ = tid >> 2, c_ = (k0) + 8 * (tid & 3); \
          att_cp16(s_a + ((st) * 16 + r_) * MOE_TC_LDS + 8 * (tid & 3), x + (i64)s_tok[r_] * D + c_, r_ < nb && c_ < D); \
        } \
        moe_tc_stage_rows(s_g + (st) * MOE_TC_ROWS * MOE_TC_LDS, ge, n0, I, D, (k0)); \
        moe_tc_stage_rows(s_u + (st) * MOE_TC_ROWS * MOE_TC_LDS, ue, n0, I, D, (k0)); \
        att_cp_commit(); \
      } while (0)
      MOE_TC_ISSUE(0, 0);
      for (int kt = 0; kt < nk; kt++) {
        if (kt + 1 < nk) {
          MOE_TC_ISSUE((kt + 1) & 1, (kt + 1) * MOE_TC_BK);
          att_cp_wait<1>(); // tile kt has landed (kt + 1 may still be in flight)
        } else {
          att_cp_wait<0>();
        }
        __syncthreads();
        const int st = kt & 1;
        #pragma unroll
        for (int k16 = 0; k16 < MOE_TC_BK; k16 += 16) {
          unsigned a[4], bg[4], bu[4];
          att_ldsm4(a, s_a + (st * 16 + (lane & 15)) * MOE_TC_LDS + k16 + (lane >> 4) * 8);
          const int br = st * MOE_TC_ROWS + warp * 16 + (lane & 7) + (lane >> 4) * 8;
          att_ldsm4(bg, s_g + br * MOE_TC_LDS + k16 + ((lane >> 3) & 1) * 8);
          att_ldsm4(bu, s_u + br * MOE_TC_LDS + k16 + ((lane >> 3) & 1) * 8);
          att_mma(ag[0], a, bg[0], bg[1]);
          att_mma(ag[1], a, bg[2], bg[3]);
          att_mma(au[0], a, bu[0], bu[1]);
          att_mma(au[1], a, bu[2], bu[3]);
        }
        __syncthreads(); // the stage is free for tile kt + 2
      }
      #undef MOE_TC_ISSUE
      // accumulators of n8 tile t: rows moe_tc_row (pair slots), columns moe_tc_col
      for (int t = 0; t < 2; t++) {
        for (int q = 0; q < 4; q++) {
          const int r = moe_tc_row(lane, q), n = n0 + warp * 16 + t * 8 + moe_tc_col(lane, q);
          if (r < nb && n < I) hidden[(i64)s_pair[r] * I + n] = activate(ag[t][q], act) * au[t][q];
        }
      }
      __syncthreads(); // s_tok / s_pair are free for the next tile
    }
  }
}

// ypair as k_moe_down_g makes it, on tensor cores (opt-in: moeFfn from MOE_TC_DOWN_MIN_ROWS tokens).
// grid (ceil(D / 64), gridY), 128 threads: output rows d0 .. d0 + 63 of active expert j's down
// matrix for its pairs in tiles of 16, warp w rows d0 + 16 w .. + 15 (two n8 tiles). Per 32 of I:
// the 16 pairs' hidden rows are read as f32 and stored to shared memory as bf16 (A: the one rounding
// this path adds, as a bf16 model's activations are rounded), the 64 down rows travel by cp.async
// into double-buffered tiles (B), then 2 k16 steps of 2 mma a warp. I % 8 == 0.
extern "C" __global__ void __launch_bounds__(128) k_moe_down_tc(const float* hidden, const int* grp, const u16* down,
    float* ypair, int TK, int D, int I) {
  PDL_ENTRY();
  __shared__ uint4 s_a4[16 * MOE_TC_LDS / 8];
  __shared__ uint4 s_b4[2 * MOE_TC_ROWS * MOE_TC_LDS / 8];
  __shared__ int s_pair[16];
  u16* s_a = (u16*)s_a4;
  u16* s_b = (u16*)s_b4;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int d0 = blockIdx.x * MOE_TC_ROWS;
  const MoeGroups G = moe_groups(grp, TK);
  const int nk = (I + MOE_TC_BK - 1) / MOE_TC_BK;
  for (int j = blockIdx.y; j < G.nAct; j += gridDim.y) {
    const int e = G.act[j], p1 = G.start[j + 1];
    const u16* de = down + (i64)e * D * I;
    for (int b0 = G.start[j]; b0 < p1; b0 += 16) {
      const int nb = min(16, p1 - b0);
      if (tid < 16) s_pair[tid] = tid < nb ? G.order[b0 + tid] : 0;
      __syncthreads();
      float acc[2][4];
      for (int t = 0; t < 2; t++) for (int q = 0; q < 4; q++) acc[t][q] = 0.0f;
      // stage st <- columns k0 .. k0 + 31 of the 64 down rows d0 ..
      moe_tc_stage_rows(s_b, de, d0, D, I, 0);
      att_cp_commit();
      for (int kt = 0; kt < nk; kt++) {
        { // A: row r = tid / 8, 4 floats at column 4 (tid % 8) of this tile (the last barrier freed s_a)
          const int r = tid >> 3, c = 4 * (tid & 7), k = kt * MOE_TC_BK + c;
          float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          if (r < nb && k < I) v = *(const float4*)(hidden + (i64)s_pair[r] * I + k);
          unsigned* dst = (unsigned*)(s_a + r * MOE_TC_LDS + c);
          dst[0] = att_pack2(v.x, v.y);
          dst[1] = att_pack2(v.z, v.w);
        }
        if (kt + 1 < nk) {
          moe_tc_stage_rows(s_b + ((kt + 1) & 1) * MOE_TC_ROWS * MOE_TC_LDS, de, d0, D, I, (kt + 1) * MOE_TC_BK);
          att_cp_commit();
          att_cp_wait<1>(); // tile kt has landed (kt + 1 may still be in flight)
        } else {
          att_cp_wait<0>();
        }
        __syncthreads();
        const int st = kt & 1;
        #pragma unroll
        for (int k16 = 0; k16 < MOE_TC_BK; k16 += 16) {
          unsigned a[4], b[4];
          att_ldsm4(a, s_a + (lane & 15) * MOE_TC_LDS + k16 + (lane >> 4) * 8);
          att_ldsm4(b, s_b + (st * MOE_TC_ROWS + warp * 16 + (lane & 7) + (lane >> 4) * 8) * MOE_TC_LDS + k16
                         + ((lane >> 3) & 1) * 8);
          att_mma(acc[0], a, b[0], b[1]);
          att_mma(acc[1], a, b[2], b[3]);
        }
        __syncthreads(); // s_a and the stage are free
      }
      for (int t = 0; t < 2; t++) {
        for (int q = 0; q < 4; q++) {
          const int r = moe_tc_row(lane, q), d = d0 + warp * 16 + t * 8 + moe_tc_col(lane, q);
          if (r < nb && d < D) ypair[(i64)s_pair[r] * D + d] = acc[t][q];
        }
      }
      __syncthreads(); // s_pair is free for the next tile
    }
  }
}

// out[t, d] = bf16(sum_k weights[t, k] ypair[t K + k, d]) over the pairs with an expert in [0, E),
// in k order; grid-stride over T D
extern "C" __global__ void k_moe_combine(const float* ypair, const float* weights, const int* experts, u16* out,
    int T, int K, int D, int E) {
  PDL_ENTRY();
  const i64 total = (i64)T * D;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    const i64 t = i / D, d = i - t * D;
    float s = 0.0f;
    for (int k = 0; k < K; k++) {
      const int e = experts[t * K + k];
      if (e >= 0 && e < E) s += weights[t * K + k] * ypair[(t * K + k) * D + d];
    }
    out[i] = f2bf(s);
  }
}
`;

export const MOE_KERNEL_NAMES = ['k_moe_hidden_v', 'k_moe_down_v', 'k_moe_group', 'k_moe_hidden_g', 'k_moe_hidden_g2', 'k_moe_down_g',
  'k_moe_down_g4', 'k_moe_combine', 'k_moe_hidden_tc', 'k_moe_down_tc'] as const;

/** threads per block of both kernels (8 warps: 8 output rows a block) */
export const MOE_THREADS = 256;
/** output rows a block of either kernel covers (grid x = ceil(rows / this)) */
export const MOE_ROWS_PER_BLOCK = MOE_THREADS / 32;
/** k_moe_route (kernels.ts): warps a block, one token each */
export const MOE_ROUTE_WARPS = 4;
/** k_moe_route's most experts: a lane's taken mask has 64 bits, for experts lane + 32 j */
export const MOE_ROUTE_MAX_EXPERTS = 2048;
/** k_moe_group's block: one, of this many threads (it groups up to 2x this many experts) */
export const MOE_GROUP_THREADS = 1024;
/** k_moe_hidden_tc / k_moe_down_tc: expert rows a block (MOE_TC_ROWS in their source) and threads */
export const MOE_TC_ROWS = 64;
export const MOE_TC_THREADS = 128;


/** Whether the bf16 MoE kernels take these sizes: hidden D and intermediate I in whole 16-byte chunks. */
export function moeVecSizes(D: number, I: number): boolean {
  return D % 8 === 0 && I % 8 === 0 && I > 0;
}

/**
 * Whether the bf16 MoE kernels (per pair, and grouped by expert from CudaMoeSettings.groupedMinRows tokens)
 * take operands of these dtypes and sizes: every one bf16, moeVecSizes (cuda-moe-ops.ts also wants
 * 16-byte aligned addresses; the fit planner's dry run and decode model ask this of the weights).
 */
export function moeVecKernelsApply(dtypes: readonly DType[], D: number, I: number): boolean {
  return dtypes.every((t) => t === 'bf16') && moeVecSizes(D, I);
}

/**
 * Whether a T-token moeFfn with E experts, K a token, whose bf16 kernels apply, runs grouped by
 * expert (moeFfnGrouped in cuda-moe-ops.ts: each active expert's rows streamed once per
 * MOE_GROUP_TOKENS of its tokens instead of once per token) under `moe` (groupedMinRows). Here, not
 * in cuda-moe-ops.ts, because the fit planner's dry run (execution/fit) sizes the same scratch.
 */
export function moeRunsGrouped(T: number, E: number, K: number, moe: Pick<CudaMoeSettings, 'groupedMinRows'>): boolean {
  const min = moe.groupedMinRows;
  return min > 0 && K > 0 && T >= min && E <= 2 * MOE_GROUP_THREADS;
}

/** Which kernels a moeFfn whose bf16 kernels apply runs (moeFfnPath). */
export interface MoeFfnPath {
  /** grouped by expert (k_moe_group ... k_moe_combine), else per (token, expert) pair */
  grouped: boolean;
  /** grouped: gate/up on tensor cores (k_moe_hidden_tc) */
  tc: boolean;
  /** grouped: the down projection on tensor cores (k_moe_down_tc) */
  tcDown: boolean;
}

/**
 * The kernels of a T-token moeFfn (E experts, K a token) whose bf16 kernels apply, under `moe`: by
 * default by T (moeRunsGrouped; tensor cores from tcMinRows / tcDownMinRows tokens). In
 * batch-invariant mode the same for every T, since each path sums a token's products in its own
 * order: grouped wherever groupedMinRows is not 0, on tensor cores wherever tcMinRows /
 * tcDownMinRows is not 0 (a token's rows are its own in every grouped kernel, whatever tokens share
 * its expert).
 */
export function moeFfnPath(T: number, E: number, K: number, moe: Pick<CudaMoeSettings, 'groupedMinRows' | 'tcMinRows' | 'tcDownMinRows'>,
  batchInvariant: boolean): MoeFfnPath {
  const rows = batchInvariant ? Infinity : T;
  const grouped = moeRunsGrouped(batchInvariant ? Math.max(T, moe.groupedMinRows) : T, E, K, moe);
  return {
    grouped,
    tc: grouped && moe.tcMinRows > 0 && rows >= moe.tcMinRows,
    tcDown: grouped && moe.tcDownMinRows > 0 && rows >= moe.tcDownMinRows,
  };
}

/**
 * A grouped moeFfn's pool scratch, bytes: hidden [rows K, I] f32, ypair [rows K, D] f32, grp ints
 * (rows: a pass of at most `moe.passRows` tokens; each pass reads every expert its tokens chose
 * again, so longer passes read less for more scratch: 184 MB at 2048 on Qwen3-30B-A3B shapes).
 */
export function moeGroupedScratch(T: number, K: number, D: number, I: number, moe: Pick<CudaMoeSettings, 'passRows'>): [number, number, number] {
  const pairs = Math.min(T, moe.passRows) * K;
  return [pairs * I * 4, pairs * D * 4, (2 + 3 * pairs) * 4];
}
