// CUDA source of on-device sampling (Backend.sampleRows; semantics and the packed row layout in
// contracts/device-sampling.ts, launch logic in sampling.ts). Its own NVRTC module
// (kernelModules in kernels.ts): it uses KERNEL_PRELUDE's ld(), DT_F32, NEG_INF and i64; every helper of its own is
// prefixed sr_. Needs sm_70+ (__match_any_sync).
//
// One block of SR_THREADS threads per row (k_sample_rows, grid = P). Nothing is sorted: the
// thresholds are found by radix select over order-preserving u32 keys of the f32 values
// (sr_key), 8 bits per pass from the top, each pass one read of the row into a 256-bin shared
// histogram of the keys that match the digits chosen so far (counts: one shared atomic per distinct
// digit per warp, lanes grouped by __match_any_sync). Passes over the row (V values):
//   processing (rows with bias, penalties or a mask) 1: a processed copy in the scratch row,
//     then one thread per sparse entry;
//   max / argmax 1 (a greedy row ends here);
//   top-k 4 (count histograms: the k-th largest key; ties with it are kept);
//   top-p 4 (count + mass histograms: the smallest key whose strictly-greater mass is below
//     topP * mass; the mass of the top-k set comes out of the first histogram), + 2 when that
//     key is tied (an ordered scan over the ties in id order finds where the mass runs out);
//   min-p 0 (a predicate in the draw);
//   draw 1 + one thread's 1/SR_THREADS: each thread sums a contiguous id range, a block scan
//     gives every range its cumulative start, and the one range holding u * Z is walked;
//   logprobs 2 (max and sum of exp of the RAW row) + for K > 0 top logprobs 4 (radix select of
//     the K-th largest raw key) + 2 (collect, ties in id order), then one thread sorts <= 20.
//
// Masses are 40-bit fixed point: q = ceil(w * 2^40) of w = exp((x - max) / T) in [0, 1]
// (f32 expf of an argument formed in f64). Integer sums do not depend on the order of the adds,
// so histograms built with shared atomics, scans and the draw are deterministic and agree with
// each other exactly; V * 2^40 < 2^64 for V < 2^24. Rounding up keeps every positive weight
// drawable, as on the host (only w below expf's underflow, e^-104, becomes 0; the host's float64
// exp goes to e^-745). Against the host's float64 weights, masses differ by ~1e-6 relative at
// most (f32 expf and the argument's rounding, plus < 2^-40 per token): a token can differ from
// the host's only when u * Z, a top-p cut or a min-p threshold lies that close to a boundary.

import {
  DEVICE_SAMPLING_MAX_LOGPROBS, SAMPLE_ERR_INF, SAMPLE_ERR_MASKED, SR, SR_ENT_WORDS, SR_F_GREEDY, SR_F_LOGPROBS,
  SR_F_MASK, SR_F_MINP, SR_F_TOPP, SR_HDR, SR_ROW_WORDS,
} from '../../contracts/device-sampling.ts';

/** threads per block of k_sample_rows (one block per row) */
export const SAMPLE_THREADS = 1024;

export const SAMPLING_KERNEL_SOURCE = String.raw`
#define SR_THREADS ${SAMPLE_THREADS}
#define SR_WARPS (SR_THREADS / 32)
#define SR_FULL 0xffffffffu
#define SR_HDR ${SR_HDR}
#define SR_ROW_WORDS ${SR_ROW_WORDS}
#define SR_ENT_WORDS ${SR_ENT_WORDS}
#define SR_FLAGS ${SR.FLAGS}
#define SR_TOPK ${SR.TOPK}
#define SR_NENT ${SR.NENT}
#define SR_ENT_OFF ${SR.ENT_OFF}
#define SR_MASK_OFF ${SR.MASK_OFF}
#define SR_NLP ${SR.NLP}
#define SR_SCRATCH ${SR.SCRATCH}
#define SR_TEMP ${SR.TEMP}
#define SR_TOPP ${SR.TOPP}
#define SR_MINP ${SR.MINP}
#define SR_U ${SR.U}
#define SR_REP ${SR.REP}
#define SR_FREQ ${SR.FREQ}
#define SR_PRES ${SR.PRES}
#define SR_F_GREEDY ${SR_F_GREEDY}
#define SR_F_MASK ${SR_F_MASK}
#define SR_F_LOGPROBS ${SR_F_LOGPROBS}
#define SR_F_TOPP ${SR_F_TOPP}
#define SR_F_MINP ${SR_F_MINP}
#define SR_ERR_MASKED (${SAMPLE_ERR_MASKED})
#define SR_ERR_INF (${SAMPLE_ERR_INF})
#define SR_LP_MAX ${DEVICE_SAMPLING_MAX_LOGPROBS}
#define SR_Q_SCALE 1099511627776.0f
#define SR_NAN_BITS 0x7fc00000
#define SR_POS_INF __int_as_float(0x7f800000)

typedef unsigned long long sr_u64;

// an f64 field of the packed buffer (two little-endian words)
__device__ __forceinline__ double sr_f64(const unsigned* p) { return __hiloint2double((int)p[1], (int)p[0]); }

// a logit as the sampler compares it: NaN -> -inf, -0 -> +0 (equal floats get equal keys)
__device__ __forceinline__ float sr_ld(const void* p, int dt, i64 i) {
  const float v = ld(p, dt, i);
  if (v != v) return NEG_INF;
  return v == 0.0f ? 0.0f : v;
}

// order-preserving map of floats onto u32: a > b  <=>  sr_key(a) > sr_key(b)
__device__ __forceinline__ unsigned sr_key(float v) {
  const unsigned b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// the weight exp((x - xmax) / T) (in [0, 1]) and its 40-bit fixed-point mass (rounded up: w > 0 -> q > 0)
__device__ __forceinline__ float sr_w(float x, float xmax, double invT) {
  return expf(__double2float_rn(__dmul_rn(__dsub_rn((double)x, (double)xmax), invT)));
}
__device__ __forceinline__ sr_u64 sr_q(float x, float xmax, double invT) {
  return __float2ull_ru(sr_w(x, xmax, invT) * SR_Q_SCALE);
}

// ---- block-wide reductions (SR_THREADS threads; every thread gets the result) ----
__device__ __forceinline__ sr_u64 sr_warp_incl64(sr_u64 v) {
  const int lane = threadIdx.x & 31;
  for (int o = 1; o < 32; o <<= 1) {
    const sr_u64 n = __shfl_up_sync(SR_FULL, v, o);
    if (lane >= o) v += n;
  }
  return v;
}
// exclusive prefix sum in thread order; *total = the sum over the block
__device__ sr_u64 sr_scan64(sr_u64 v, sr_u64* red, sr_u64* total) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const sr_u64 incl = sr_warp_incl64(v);
  __syncthreads(); // red may still be read by a previous reduction
  if (lane == 31) red[w] = incl;
  __syncthreads();
  sr_u64 before = 0, all = 0;
  for (int i = 0; i < SR_WARPS; i++) {
    const sr_u64 t = red[i];
    all += t;
    if (i < w) before += t;
  }
  *total = all;
  return before + incl - v;
}
__device__ double sr_sumd(double v, double* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(SR_FULL, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  double s = 0.0;
  for (int i = 0; i < SR_WARPS; i++) s += red[i];
  return s;
}
__device__ float sr_maxf(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(SR_FULL, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = red[0];
  for (int i = 1; i < SR_WARPS; i++) m = fmaxf(m, red[i]);
  return m;
}
__device__ int sr_mini(int v, int* red, bool wantMax) {
  for (int o = 16; o > 0; o >>= 1) {
    const int n = __shfl_xor_sync(SR_FULL, v, o);
    v = wantMax ? max(v, n) : min(v, n);
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  int m = red[0];
  for (int i = 1; i < SR_WARPS; i++) m = wantMax ? max(m, red[i]) : min(m, red[i]);
  return m;
}
// (value, index) order of argmax: the larger value, then the lower index; index -1 = nothing
__device__ __forceinline__ void sr_merge(float& v, int& i, float ov, int oi) {
  if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) { v = ov; i = oi; }
}
__device__ void sr_argmax(float& v, int& i, float* redf, int* redi) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(SR_FULL, v, o);
    const int oi = __shfl_xor_sync(SR_FULL, i, o);
    sr_merge(v, i, ov, oi);
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) { redf[threadIdx.x >> 5] = v; redi[threadIdx.x >> 5] = i; }
  __syncthreads();
  v = redf[0];
  i = redi[0];
  for (int k = 1; k < SR_WARPS; k++) sr_merge(v, i, redf[k], redi[k]);
}

// The contiguous id range [*c0, *c1) of this thread (ordered scans walk ids in id order).
__device__ __forceinline__ void sr_chunk(int V, int* c0, int* c1) {
  const int C = (V + SR_THREADS - 1) / SR_THREADS;
  *c0 = min(V, (int)threadIdx.x * C);
  *c1 = min(V, *c0 + C);
}

// hist[d] += 1 for every lane with d >= 0, one shared atomic per distinct d of the warp (the top
// digit of logits falls in a few bins, where per-lane atomics would serialize). All 32 lanes call it.
__device__ __forceinline__ void sr_count(int* hist, int d) {
  const unsigned peers = __match_any_sync(SR_FULL, d);
  if (d >= 0 && (int)(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[d], __popc(peers));
}

// The k-th largest key of the row (1 <= k <= V): 4 passes, one per 8-bit digit from the top.
// *above = keys strictly greater than it, *ties = keys equal to it. bc: int[4] shared.
__device__ unsigned sr_select_count(const void* xp, int xdt, i64 xb, int V, int k, int* hist, int* bc, int* above,
                                    int* ties) {
  const int tid = threadIdx.x, lane = tid & 31;
  unsigned prefix = 0, pmask = 0;
  int ab = 0, tc = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < 256; b += SR_THREADS) hist[b] = 0;
    __syncthreads();
    for (int i0 = 0; i0 < V; i0 += SR_THREADS) { // trip count uniform over the block: full warps
      const int i = i0 + tid;
      int d = -1;
      if (i < V) {
        const unsigned key = sr_key(sr_ld(xp, xdt, xb + i));
        if ((key & pmask) == prefix) d = (int)((key >> shift) & 255u);
      }
      sr_count(hist, d);
    }
    __syncthreads();
    if (tid < 32) {
      // lane l holds bins 255 - 8l down to 248 - 8l: lanes in descending key order
      int c[8];
      int s = 0;
      #pragma unroll
      for (int j = 0; j < 8; j++) { c[j] = hist[255 - 8 * lane - j]; s += c[j]; }
      int incl = s;
      for (int o = 1; o < 32; o <<= 1) {
        const int n = __shfl_up_sync(SR_FULL, incl, o);
        if (lane >= o) incl += n;
      }
      const unsigned m = __ballot_sync(SR_FULL, ab + incl >= k);
      if (m != 0u && lane == __ffs(m) - 1) {
        int run = ab + incl - s;
        for (int j = 0; j < 8; j++) {
          if (run + c[j] >= k) { bc[0] = 255 - 8 * lane - j; bc[1] = run; bc[2] = c[j]; break; }
          run += c[j];
        }
      }
    }
    __syncthreads();
    prefix |= (unsigned)bc[0] << shift;
    pmask |= 255u << shift;
    ab = bc[1];
    tc = bc[2];
  }
  *above = ab;
  *ties = tc;
  return prefix;
}

// Top-p's cut among the candidates (key >= lo), masses q: the smallest key c whose strictly
// greater mass is < target = topP * (the candidates' total mass). 4 passes, counts and masses.
// *above = the mass strictly above c, *ties = candidates with key c, *tgt = target.
__device__ unsigned sr_select_mass(const void* xp, int xdt, i64 xb, int V, unsigned lo, float xmax, double invT,
                                   double topP, int* hist, sr_u64* mass, int* bc, sr_u64* bm, double* tgt,
                                   sr_u64* above, int* ties) {
  const int tid = threadIdx.x, lane = tid & 31;
  unsigned prefix = 0, pmask = 0;
  sr_u64 ab = 0;
  int tc = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < 256; b += SR_THREADS) { hist[b] = 0; mass[b] = 0; }
    __syncthreads();
    for (int i0 = 0; i0 < V; i0 += SR_THREADS) { // trip count uniform over the block: full warps
      const int i = i0 + tid;
      int d = -1;
      sr_u64 q = 0;
      if (i < V) {
        const float x = sr_ld(xp, xdt, xb + i);
        const unsigned key = sr_key(x);
        if (key >= lo && (key & pmask) == prefix) {
          d = (int)((key >> shift) & 255u);
          q = sr_q(x, xmax, invT);
        }
      }
      sr_count(hist, d);
      if (q != 0ull) atomicAdd(&mass[d], q);
    }
    __syncthreads();
    if (tid < 32) {
      sr_u64 ms[8];
      int cs[8];
      sr_u64 s = 0;
      #pragma unroll
      for (int j = 0; j < 8; j++) { ms[j] = mass[255 - 8 * lane - j]; cs[j] = hist[255 - 8 * lane - j]; s += ms[j]; }
      const sr_u64 incl = sr_warp_incl64(s);
      double target;
      if (shift == 24) {
        target = topP * (double)__shfl_sync(SR_FULL, incl, 31); // the first pass sees every candidate
        if (lane == 0) *tgt = target;
      } else {
        target = *tgt;
      }
      // in descending bin order the mass above a bin only grows: the cut's bin is the lowest
      // non-empty bin whose mass above is still < target
      int sel = -1, selTies = 0;
      sr_u64 selAbove = 0, run = ab + incl - s;
      #pragma unroll
      for (int j = 0; j < 8; j++) {
        if ((double)run < target && cs[j] > 0) { sel = 255 - 8 * lane - j; selTies = cs[j]; selAbove = run; }
        run += ms[j];
      }
      const unsigned m = __ballot_sync(SR_FULL, sel >= 0);
      if (m != 0u && lane == 31 - __clz(m)) { bc[0] = sel; bc[1] = selTies; bm[0] = selAbove; }
    }
    __syncthreads();
    prefix |= (unsigned)bc[0] << shift;
    pmask |= 255u << shift;
    tc = bc[1];
    ab = bm[0];
  }
  *above = ab;
  *ties = tc;
  return prefix;
}

// What the draw needs of a row.
struct SrRow {
  const void* xp;
  int xdt;
  i64 xb;
  int V;
  float xmax;
  double invT;
  unsigned kthKey; // top-k: keys >= kthKey survive (0 = all)
  int topp;
  unsigned cKey;   // top-p: keys > cKey survive, and key == cKey below id cutId
  int cutId;
  int minp;
  double minP;
};

// the final mass of token i (0 = not a candidate)
__device__ __forceinline__ sr_u64 sr_final_q(const SrRow& R, int i) {
  const float x = sr_ld(R.xp, R.xdt, R.xb + i);
  const unsigned key = sr_key(x);
  if (key < R.kthKey) return 0ull;
  if (R.topp && (key < R.cKey || (key == R.cKey && i >= R.cutId))) return 0ull;
  const float w = sr_w(x, R.xmax, R.invT);
  if (R.minp && !((double)w >= R.minP)) return 0ull;
  return __float2ull_ru(w * SR_Q_SCALE);
}

// Top-p among the tokens tied at cKey: in id order each is kept while the mass before it
// (above + tied mass of lower ids) is < target. Returns the first id cut (V = none). 2 passes.
__device__ int sr_tie_cut(const SrRow& R, sr_u64 above, double target, sr_u64* red64, int* redi) {
  int c0, c1;
  sr_chunk(R.V, &c0, &c1);
  sr_u64 s = 0;
  for (int i = c0; i < c1; i++) {
    const float x = sr_ld(R.xp, R.xdt, R.xb + i);
    if (sr_key(x) == R.cKey) s += sr_q(x, R.xmax, R.invT);
  }
  sr_u64 total;
  sr_u64 run = above + sr_scan64(s, red64, &total);
  int cut = R.V;
  for (int i = c0; i < c1; i++) {
    const float x = sr_ld(R.xp, R.xdt, R.xb + i);
    if (sr_key(x) != R.cKey) continue;
    if ((double)run >= target) { cut = i; break; }
    run += sr_q(x, R.xmax, R.invT);
  }
  return sr_mini(cut, redi, false);
}

// The draw: the first candidate in ascending id order whose cumulative mass exceeds u * Z (the
// last positive one when rounding leaves none).
__device__ int sr_draw(const SrRow& R, double u, sr_u64* red64, int* redi, int* tok) {
  int c0, c1;
  sr_chunk(R.V, &c0, &c1);
  sr_u64 s = 0;
  int last = -1;
  for (int i = c0; i < c1; i++) {
    const sr_u64 q = sr_final_q(R, i);
    if (q != 0ull) { s += q; last = i; }
  }
  sr_u64 Z;
  const sr_u64 pre = sr_scan64(s, red64, &Z);
  const int lastPos = sr_mini(last, redi, true);
  const double r = u * (double)Z;
  if (threadIdx.x == 0) *tok = -1;
  __syncthreads();
  // (double) of a growing integer never decreases: exactly one range holds the crossing
  if ((double)pre <= r && (double)(pre + s) > r) {
    sr_u64 cum = pre;
    for (int i = c0; i < c1; i++) {
      const sr_u64 q = sr_final_q(R, i);
      if (q == 0ull) continue;
      cum += q;
      if ((double)cum > r) { *tok = i; break; }
    }
  }
  __syncthreads();
  const int t = *tok;
  return t >= 0 ? t : lastPos;
}

// The K best raw ids (K - above of them tied at key kk, the lowest ids first) into list (any
// order). 2 passes.
__device__ void sr_collect(const void* xp, int xdt, i64 xb, int V, unsigned kk, int above, int K, int* list, int* n,
                           sr_u64* red64) {
  int c0, c1;
  sr_chunk(V, &c0, &c1);
  int t = 0;
  for (int i = c0; i < c1; i++) t += sr_key(sr_ld(xp, xdt, xb + i)) == kk;
  sr_u64 total;
  int rank = (int)sr_scan64((sr_u64)t, red64, &total);
  if (threadIdx.x == 0) *n = 0;
  __syncthreads();
  const int need = K - above;
  for (int i = c0; i < c1; i++) {
    const unsigned key = sr_key(sr_ld(xp, xdt, xb + i));
    if (key > kk) {
      list[atomicAdd(n, 1)] = i;
    } else if (key == kk) {
      if (rank < need) list[above + rank] = i;
      rank++;
    }
  }
  __syncthreads();
}

// One block per row of logits [P, V] (f32 / bf16 / f16): out [P, OW] = token, chosen logprob
// bits, (id, logprob bits) pairs. pk: the packed rows; scratch: [scratch rows, V] f32.
extern "C" __global__ void __launch_bounds__(SR_THREADS) k_sample_rows(const void* logits, int ldt, const unsigned* pk,
                                                                       float* scratch, int* out, int V, int OW) {
  __shared__ int s_hist[256];
  __shared__ sr_u64 s_mass[256];
  __shared__ sr_u64 s_red64[SR_WARPS];
  __shared__ double s_redd[SR_WARPS];
  __shared__ float s_redf[SR_WARPS];
  __shared__ int s_redi[SR_WARPS];
  __shared__ int s_bc[4];
  __shared__ sr_u64 s_bm[1];
  __shared__ double s_tgt[1];
  __shared__ int s_list[SR_LP_MAX];
  __shared__ int s_n[1];
  __shared__ int s_tok[1];
  const int tid = threadIdx.x;
  const unsigned* row = pk + SR_HDR + (i64)blockIdx.x * SR_ROW_WORDS;
  const unsigned flags = row[SR_FLAGS];
  const i64 rb = (i64)blockIdx.x * V; // the raw row
  const void* xp = logits;            // the processed row: the raw one, or its processed copy
  int xdt = ldt;
  i64 xb = rb;

  // 1. bias, repetition, frequency/presence (f64 maths, f32 stores, as the host), then the mask
  const int srow = (int)row[SR_SCRATCH];
  if (srow >= 0) {
    float* s = scratch + (i64)srow * V;
    const unsigned* mask = (flags & SR_F_MASK) ? pk + row[SR_MASK_OFF] : (const unsigned*)0;
    for (int i = tid; i < V; i += SR_THREADS) {
      float v = sr_ld(logits, ldt, rb + i);
      if (mask && !((mask[i >> 5] >> (i & 31)) & 1u)) v = NEG_INF;
      s[i] = v;
    }
    __syncthreads();
    const int ne = (int)row[SR_NENT];
    const unsigned* ent = pk + row[SR_ENT_OFF];
    const double rep = sr_f64(row + SR_REP), fq = sr_f64(row + SR_FREQ), pr = sr_f64(row + SR_PRES);
    for (int e = tid; e < ne; e += SR_THREADS) { // ids are distinct: one thread per id
      const unsigned* en = ent + (i64)e * SR_ENT_WORDS;
      const int id = (int)en[0], cnt = (int)en[1];
      if (id < 0 || id >= V) continue;
      if (mask && !((mask[id >> 5] >> (id & 31)) & 1u)) continue; // stays -inf
      float x = s[id];
      if (en[2]) x = __double2float_rn(__dadd_rn((double)x, sr_f64(en + 4)));
      if (cnt >= 0 && rep != 1.0)
        x = __double2float_rn(x > 0.0f ? __ddiv_rn((double)x, rep) : __dmul_rn((double)x, rep));
      if (cnt > 0 && (fq != 0.0 || pr != 0.0))
        x = __double2float_rn(__dsub_rn(__dsub_rn((double)x, __dmul_rn(fq, (double)cnt)), pr));
      s[id] = x;
    }
    __syncthreads();
    xp = s;
    xdt = DT_F32;
    xb = 0;
  }

  // 2. max and argmax of the processed row (lowest id on ties)
  float best = NEG_INF;
  int bi = -1;
  for (int i = tid; i < V; i += SR_THREADS) {
    const float v = sr_ld(xp, xdt, xb + i);
    if (v > best) { best = v; bi = i; }
  }
  sr_argmax(best, bi, s_redf, s_redi);

  int token;
  if (flags & SR_F_GREEDY) token = bi;
  else if (bi < 0) token = SR_ERR_MASKED;
  else if (best == SR_POS_INF) token = SR_ERR_INF;
  else {
    // 3. top-k, top-p, min-p, the draw
    SrRow R;
    R.xp = xp; R.xdt = xdt; R.xb = xb; R.V = V; R.xmax = best;
    R.invT = 1.0 / sr_f64(row + SR_TEMP);
    R.kthKey = 0u;
    R.topp = (flags & SR_F_TOPP) != 0u;
    R.cKey = 0u;
    R.cutId = V;
    R.minp = (flags & SR_F_MINP) != 0u;
    R.minP = sr_f64(row + SR_MINP);
    const int topK = (int)row[SR_TOPK];
    if (topK > 0) {
      int above, ties;
      R.kthKey = sr_select_count(xp, xdt, xb, V, topK, s_hist, s_bc, &above, &ties);
    }
    if (R.topp) {
      sr_u64 above;
      int ties;
      R.cKey = sr_select_mass(xp, xdt, xb, V, R.kthKey, R.xmax, R.invT, sr_f64(row + SR_TOPP), s_hist, s_mass, s_bc,
                              s_bm, s_tgt, &above, &ties);
      if (ties > 1) R.cutId = sr_tie_cut(R, above, s_tgt[0], s_red64, s_redi);
    }
    token = sr_draw(R, sr_f64(row + SR_U), s_red64, s_redi, s_tok);
  }

  // 4. logprobs of the raw row
  float chosen = __int_as_float(SR_NAN_BITS);
  double lse = 0.0;
  int nlp = 0;
  if ((flags & SR_F_LOGPROBS) && token >= 0) {
    float m = NEG_INF;
    for (int i = tid; i < V; i += SR_THREADS) m = fmaxf(m, sr_ld(logits, ldt, rb + i));
    m = sr_maxf(m, s_redf);
    double sum = 0.0;
    if (m != NEG_INF && m != SR_POS_INF)
      for (int i = tid; i < V; i += SR_THREADS) sum += exp((double)sr_ld(logits, ldt, rb + i) - (double)m);
    sum = sr_sumd(sum, s_redd);
    lse = (m == NEG_INF || m == SR_POS_INF) ? (double)m : (double)m + log(sum);
    chosen = (float)((double)sr_ld(logits, ldt, rb + token) - lse);
    nlp = (int)row[SR_NLP];
    if (nlp > 0) {
      int above, ties;
      const unsigned kk = sr_select_count(logits, ldt, rb, V, nlp, s_hist, s_bc, &above, &ties);
      sr_collect(logits, ldt, rb, V, kk, above, nlp, s_list, s_n, s_red64);
    }
  }

  if (tid == 0) {
    // best first: value desc, id asc (insertion sort of <= SR_LP_MAX ids)
    for (int a = 1; a < nlp; a++) {
      const int id = s_list[a];
      const float v = sr_ld(logits, ldt, rb + id);
      int b = a - 1;
      while (b >= 0) {
        const int jd = s_list[b];
        const float w = sr_ld(logits, ldt, rb + jd);
        if (!(v > w || (v == w && id < jd))) break;
        s_list[b + 1] = jd;
        b--;
      }
      s_list[b + 1] = id;
    }
    int* o = out + (i64)blockIdx.x * OW;
    o[0] = token;
    o[1] = __float_as_int(chosen);
    for (int j = 0; 2 + 2 * j < OW; j++) {
      if (j < nlp) {
        o[2 + 2 * j] = s_list[j];
        o[3 + 2 * j] = __float_as_int((float)((double)sr_ld(logits, ldt, rb + s_list[j]) - lse));
      } else {
        o[2 + 2 * j] = -1;
        o[3 + 2 * j] = SR_NAN_BITS;
      }
    }
  }
}
`;

export const SAMPLING_KERNEL_NAMES = ['k_sample_rows'] as const;
