// CUDA source of the fast paged-attention kernels (its own NVRTC module, kernelModules in kernels.ts,
// after KERNEL_PRELUDE: u16, i64, bf2f, f2bf, report, NEG_INF). The launch logic is attention.ts.
//
// Fast path: bf16 q, bf16 KV pools, headDim in ATT_FAST_HEAD_DIMS. Everything else goes to the
// generic k_attention in kernels.ts.
//
// Who computes which token. A "run" is a maximal stretch of consecutive tokens of the flattened
// batch with the same tokenRow. A token in a run of at most ATT_DEC_MAX_RUN tokens is a *decode*
// token (decode rows, short speculative chunks); every other token is a *prefill* token. Both
// kernels classify from tokenRow on the device with the same function (att_is_decode), so every
// token is written by exactly one of them, whatever the layout (rows need not be contiguous,
// positions need not be consecutive: the kernels are correct for any layout, only faster for the
// usual one).
//
//   k_attn_decode_d<D>_g<GC>  split-KV ("flash-decoding"): block (slot, kv head [, head chunk])
//       takes one decode token and one split of its keys, with all (up to GC) query heads of the
//       GQA group, so K/V rows are read once per group. 4 warps; a key row is read by D/8 lanes as
//       16-byte vectors (coalesced), each warp runs 32*8/D independent key streams, f32 online
//       softmax in the log2 domain, then the streams and warps are merged in shared memory. A
//       token with one split writes its output; otherwise the split writes (acc, max, sum) to the
//       partials and k_attn_combine merges them.
//       Graph friendly: the host fixes the grid (W slots) from shapes only; on the device the n
//       decode tokens share the W slots (seff = W / n splits each, at least ATT_MIN_CHUNK keys per
//       split, chunk = ceil(len / splits)), so the same launch serves any sequence lengths.
//   k_attn_plan  (T > ATT_DEC_INLINE_T only) lists the decode tokens once; for smaller T every
//       decode block lists them itself in shared memory and block (0, 0) stores the list for the
//       combine kernel.
//   k_attn_prefill_d<D>  flash attention on tensor cores: block (head, 64-token tile), 4 warps of
//       16 queries; Q fragments in registers (ldmatrix), K/V tiles of BK keys (64; 32 for D=256)
//       gathered page by page through the block table (one lookup per key, made while the
//       previous tile computes) with cp.async into padded shared memory,
//       S = QK^T and O += PV with mma.sync m16n8k16 bf16 (f32 accumulation; P rounded to bf16),
//       online softmax in f32. The key tiles travel through a ring of ATT_PF_STAGES (K, V) stages in
//       dynamic shared memory (attPfSharedBytes): the next tiles load while one computes. The tile's
//       prefill tokens are processed one row ("segment") at a time over the key range that row's
//       queries see; warps skip tiles outside their queries' ranges and mask only the tiles that
//       cut a diagonal, a window edge or a missing block. Heavy (late) tiles are launched first.
//
// Errors, as k_attention: a token whose row is outside the block tables reports code 3 and gets
// zeros; an attended key without a block (-1, >= numBlocks, or past maxBlocksPerRow) reports code 4
// (row, position, entry) and is left out of the softmax.

import { attDecodeTcKernels } from './attention-decode-tc.ts';
import type { CudaAttentionSettings } from './cuda-settings.ts';

/**
 * Runs of at most this many tokens of one row take the decode (split-KV) path: decode rows and
 * verify chunks (a row's token and up to 7 drafts). The prefill kernel walks a tile's rows one
 * after another, so a tile of many short runs is a long serial loop over few blocks (on the demo
 * model at 16 rows of 5-token chunks, 2 ms a step against 0.3 ms for decode); a decode token reads
 * its keys itself, as each query head of the prefill kernel does, with all SMs splitting them.
 */
export const ATT_DEC_MAX_RUN = 8;
/** up to this many tokens the decode kernels list the decode tokens themselves (no plan kernel) */
export const ATT_DEC_INLINE_T = 128;
/** fewest keys a decode split gets */
export const ATT_MIN_CHUNK = 64;
/** keys per tile of the tensor-core decode kernel (its splits are whole tiles: att_tc_splits) */
export const ATT_TC_BK = 32;
/** query tokens per prefill block */
export const ATT_BQ = 64;
/** keys per tile of the prefill kernel at head dim D (its registers and shared memory bound it at 256) */
export const attPfBk = (D: number): number => (D === 256 ? 32 : 64);
/**
 * Dynamic shared memory of a k_attn_prefill_d<D> launch: its ring of `stages` (CudaAttentionSettings.pfStages:
 * tiles it + 1 .. it + stages - 1 load while tile it computes) x (K and V tiles, rows of D + 8) bf16.
 */
export function attPfSharedBytes(D: number, stages: number): number {
  return stages * 2 * attPfBk(D) * (D + 8) * 2;
}
/**
 * Dynamic shared memory of a k_attn_prefill_bi_d<D> launch (batch-invariant mode): as
 * attPfSharedBytes, at the tensor-core decode kernel's ATT_TC_BK keys a tile.
 */
export function attPfBiSharedBytes(D: number, stages: number): number {
  return stages * 2 * ATT_TC_BK * (D + 8) * 2;
}
/** head dims with fast kernels */
export const ATT_FAST_HEAD_DIMS = [64, 128, 256] as const;

/** Kernel names (in KERNEL_NAMES through kernels.ts). */
export const ATTENTION_KERNEL_NAMES = [
  'k_attn_plan', 'k_attn_combine',
  'k_attn_decode_d64_g4', 'k_attn_decode_d64_g8', 'k_attn_decode_d128_g4', 'k_attn_decode_d128_g8',
  'k_attn_decode_d256_g4', 'k_attn_decode_d256_g8', 'k_attn_decode_tc_d64', 'k_attn_decode_tc_d128',
  'k_attn_prefill_d64', 'k_attn_prefill_d128', 'k_attn_prefill_d256', 'k_attn_prefill_bi_d64', 'k_attn_prefill_bi_d128',
] as const;

/**
 * The device primitives (inline PTX). Kept apart from the kernels so the kernels can also be
 * compiled on the host against emulated primitives (a warp-level simulation).
 *
 * Dialect: NVRTC's default C++ dialect differs between versions (11.x compiles this without
 * -std, i.e. without constexpr, static_assert, alignas or lambdas), so this source sticks to
 * C++03 plus CUDA: enums for constants, uint4 for 16-byte vectors and aligned shared memory.
 */
export const ATTENTION_PRIMITIVES = String.raw`
__device__ __forceinline__ unsigned att_smem(const void* p) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}
// 16-byte global -> shared copy; zero-fills the destination when !pred (src is then not read)
__device__ __forceinline__ void att_cp16(void* dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(att_smem(dst)), "l"(src), "r"(pred ? 16 : 0) : "memory");
}
__device__ __forceinline__ void att_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void att_cp_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
__device__ __forceinline__ void att_ldsm4(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
    : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(att_smem(p)) : "memory");
}
__device__ __forceinline__ void att_ldsm4t(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
    : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(att_smem(p)) : "memory");
}
// d += a (16x16, row) * b (16x8, col), bf16 inputs, f32 accumulators
__device__ __forceinline__ void att_mma(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// two floats -> bf16x2 (round to nearest even); lo in the low half
__device__ __forceinline__ unsigned att_pack2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// f32 global load cached in L2 only (data other blocks of this kernel wrote, behind a fence)
__device__ __forceinline__ float att_ldcg(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}
// atomic add at gpu scope with acquire and release semantics (the old value)
__device__ __forceinline__ int att_atom_add_acq_rel(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
// 16-byte read-only global load
__device__ __forceinline__ uint4 att_ldg16(const void* p) {
  uint4 v;
  asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
`;

/** The kernel's ATT_TC_TRIGGER of each CudaAttentionSettings.tcTrigger */
const TC_TRIGGER_CODE = { entry: 0, split: 1, exit: 2, loaded: 3 } as const;

/**
 * The kernels proper: plain CUDA C++ over the primitives above and the kernels.ts prelude, with
 * the host-planned macros of `a` (the tensor-core decode kernel's split size, grid order and PDL
 * trigger; the prefill ring's stages) and, in batch-invariant mode, ATT_BI and its split size.
 */
export const attentionKernels = (a: CudaAttentionSettings, batchInvariant = false): string => String.raw`
#define ATT_DEC_MAX_RUN ${ATT_DEC_MAX_RUN}
#define ATT_DEC_INLINE_T ${ATT_DEC_INLINE_T}
#define ATT_MIN_CHUNK ${ATT_MIN_CHUNK}
#define ATT_TC_MIN_CHUNK ${a.tcMinChunk}
#define ATT_TC_BK ${ATT_TC_BK}
#define ATT_TC_HEADS_FIRST ${a.tcGrid === 'heads-first' ? 1 : 0}
#define ATT_TC_TRIGGER ${TC_TRIGGER_CODE[a.tcTrigger]}
#ifndef ATT_TC_TILE_RATIO10 // $LLMTS_CUDA_ATT_DEFINES may set it (the host's slots do not depend on it)
#define ATT_TC_TILE_RATIO10 65
#endif
#define ATT_BQ ${ATT_BQ}
#define ATT_PF_STAGES ${a.pfStages}
${batchInvariant ? `#define ATT_BI 1\n#define ATT_BI_CHUNK ${a.invariantChunk}\n` : ''}#ifndef ATT_BI // batch-invariant mode (CudaSettings.batchInvariant): the tensor-core decode kernel's splits and merge
#define ATT_BI 0
#endif
#ifndef ATT_BI_CHUNK // the batch-invariant splits' key positions (CudaAttentionSettings.invariantChunk)
#define ATT_BI_CHUNK 512
#endif
#define ATT_LOG2E 1.4426950408889634f
#define ATT_BIG 0x3fffffff
#define ATT_FULL 0xffffffffu
// compile-time check without static_assert (C++03): a negative array size fails to compile
#define ATT_STATIC_ASSERT(cond, name) typedef char name[(cond) ? 1 : -1]

__device__ __forceinline__ int att_min(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int att_max(int a, int b) { return a > b ? a : b; }
// Logical block of key j: a shift when the block size is a power of two (bsShift >= 0).
__device__ __forceinline__ int att_block_of(int j, int BS, int bsShift) { return bsShift >= 0 ? j >> bsShift : j / BS; }
__device__ __forceinline__ int att_bs_shift(int BS) { return (BS & (BS - 1)) == 0 ? __ffs(BS) - 1 : -1; }

// Whether token t is in a run of at most ATT_DEC_MAX_RUN consecutive tokens of its row. The loads
// are unconditional (clamped indices) so they issue together.
__device__ __forceinline__ bool att_is_decode(const int* rows, int T, int t) {
  const int r = rows[t];
  int n = 1;
  bool back = true, fwd = true;
#pragma unroll
  for (int k = 1; k <= ATT_DEC_MAX_RUN; k++) {
    const int rb = rows[t - k >= 0 ? t - k : 0], rf = rows[t + k < T ? t + k : T - 1];
    back = back && t - k >= 0 && rb == r;
    fwd = fwd && t + k < T && rf == r;
    n += (int)back + (int)fwd;
  }
  return n <= ATT_DEC_MAX_RUN;
}

// Keys a query at position p sees: [start, start + len). p < 0: none.
__device__ __forceinline__ void att_range(int p, int window, int& start, int& len) {
  start = (window > 0 && p - window + 1 > 0) ? p - window + 1 : 0;
  len = p >= start ? p - start + 1 : 0;
}

// Splits each of n decode tokens may use when they share W slots.
__device__ __forceinline__ int att_seff(int n, int W) { return (n <= 0 || n >= W) ? 1 : W / n; }

// Splits of a decode token with len keys on the CUDA-core kernels (at most seff, at least minChunk
// keys each) and the keys per split (a multiple of 16).
__device__ __forceinline__ int att_splits(int len, int seff, int minChunk, int& chunk) {
  int ns = (len + minChunk - 1) / minChunk;
  if (ns > seff) ns = seff;
  if (ns < 1) ns = 1;
  chunk = (((len + ns - 1) / ns) + 15) & ~15;
  if (chunk < 16) chunk = 16;
  return len > 0 ? (len + chunk - 1) / chunk : 1;
}

// Lists the decode tokens of [0, T) in increasing order into list; returns how many (to every
// thread). Called by the whole block; blockDim.x a multiple of 32; wsum: 32 ints of shared memory.
__device__ int att_plan(const int* rows, int T, int* list, int* wsum) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int base = 0;
  for (int c0 = 0; c0 < T; c0 += blockDim.x) {
    const int t = c0 + threadIdx.x;
    const bool d = t < T && att_is_decode(rows, T, t);
    const unsigned bal = __ballot_sync(ATT_FULL, d);
    if (lane == 0) wsum[w] = __popc(bal);
    __syncthreads();
    int off = base, tot = 0;
    for (int k = 0; k < nw; k++) {
      if (k < w) off += wsum[k];
      tot += wsum[k];
    }
    if (d) list[off + __popc(bal & ((1u << lane) - 1u))] = t;
    __syncthreads(); // wsum is rewritten by the next chunk; list is complete for the caller
    base += tot;
  }
  return base;
}

// plan = [n, decode tokens...] for the decode and combine kernels when T > ATT_DEC_INLINE_T.
extern "C" __global__ void __launch_bounds__(1024) k_attn_plan(const int* rows, int T, int* plan) {
  PDL_ENTRY();
  __shared__ int wsum[32];
  const int n = att_plan(rows, T, plan + 1, wsum);
  if (threadIdx.x == 0) plan[0] = n;
}

// The decode tokens of a call, for every block of a decode kernel: k_attn_plan's list (planReady 1),
// every token in order (planReady 2, *list null: a layout of one token a row, given only to the
// tensor-core kernel, which stores no plan), or listed here in shared memory (s_list, s_wsum), block
// (0, 0) storing it for k_attn_combine when storePlan (the tensor-core kernel merges its own splits:
// it reads no stored plan). Returns how many; *list points at them.
__device__ __forceinline__ int att_decode_tokens(const int* rows, int T, int* plan, int planReady, int* s_list,
    int* s_wsum, const int** list, bool storePlan) {
  if (planReady == 2) {
    *list = 0;
    return T;
  }
  if (planReady) {
    *list = plan + 1;
    return plan[0];
  }
  const int n = att_plan(rows, T, s_list, s_wsum);
  *list = s_list;
  if (storePlan && blockIdx.x == 0 && blockIdx.y == 0) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) plan[1 + i] = s_list[i];
    if (threadIdx.x == 0) plan[0] = n;
  }
  return n;
}

// Splits of a decode token with len keys on the tensor-core kernel (at most seff), in whole tiles of
// ATT_TC_BK keys: about sqrt(tiles / ratio) tiles a split, ratio = ATT_TC_TILE_RATIO10 / 10, and at
// least ATT_TC_MIN_CHUNK keys. Why: at one row a split's tiles are a chain of round trips, and each
// split adds a partial that the last one reads and folds; a token's time ~ ns x partial + (tiles /
// ns) x tile is least at sqrt(tiles x tile / partial) tiles a split, ratio the tile-to-partial cost.
// H200, 8B shapes, B=1: at 512 keys 2 tiles a split beat 1 and 4 (+1.3-1.5%); at 4k 4
// tiles (33 splits) beat 3 (45 splits, -1%) and 4.5 (29 splits, -0.6%); at 16k 45 splits (the
// slots' limit) beat 32 (-3.4%). A fixed ATT_TC_MIN_CHUNK alone cannot give all three.
__device__ __forceinline__ int att_tc_splits(int len, int seff, int& chunk) {
  ATT_STATIC_ASSERT(ATT_TC_TILE_RATIO10 >= 1, att_tc_tile_ratio);
  const int L = (len + ATT_TC_BK - 1) / ATT_TC_BK;
  // nt = round(sqrt(L / ratio)): (2 nt - 1)^2 ratio10 <= 40 L < (2 nt + 1)^2 ratio10
  int nt = (int)sqrtf((float)L * (10.0f / (float)ATT_TC_TILE_RATIO10));
  while (nt > 0 && (2 * nt - 1) * (2 * nt - 1) * ATT_TC_TILE_RATIO10 > 40 * L) nt--;
  while ((2 * nt + 1) * (2 * nt + 1) * ATT_TC_TILE_RATIO10 <= 40 * L) nt++;
  if (nt < ATT_TC_MIN_CHUNK / ATT_TC_BK) nt = ATT_TC_MIN_CHUNK / ATT_TC_BK;
  if (nt < 1) nt = 1;
  int ns = (L + nt - 1) / nt;
  if (ns > seff) {
    ns = seff;
    nt = (L + ns - 1) / ns;
  }
  chunk = nt * ATT_TC_BK;
  return len > 0 ? (len + chunk - 1) / chunk : 1;
}

// An output pair's bf16 bits (the simulator's tests define it to a hash of every f32 bit, to see
// differences the rounding to bf16 would hide)
#ifndef ATT_OUT_PACK2
#define ATT_OUT_PACK2(lo, hi) att_pack2((lo), (hi))
#endif

// a * b + c with one rounding: written out where two kernels must round alike (batch-invariant mode)
#ifdef __CUDA_ARCH__
#define ATT_FMA(a, b, c) __fmaf_rn((a), (b), (c))
#else
#define ATT_FMA(a, b, c) std::fma((a), (b), (c))
#endif

// Batch-invariant mode (ATT_BI): a token's keys [start, start + len) are split where key positions
// cross a multiple of ATT_BI_CHUNK, so its splits follow from its own position alone (not from how
// many tokens share the slots), and its tiles start at multiples of ATT_TC_BK (the first one masked
// below start). The batch-invariant prefill kernel sums the same tiles and folds the same splits
// (att_bi_fold), so a token gets the same bits from either kernel: its prompt's chunking does not
// matter. att_bi_splits: the splits of such a token; att_bi_max_splits: the most of any token
// of a call (the partials' stride; the host's twin is attention.ts attBiMaxSplits).
__device__ __forceinline__ int att_bi_splits(int start, int len) {
  return len > 0 ? (start + len - 1) / ATT_BI_CHUNK - start / ATT_BI_CHUNK + 1 : 1;
}
__device__ __forceinline__ int att_bi_max_splits(int MBR, int BS, int window) {
  const i64 keys = (i64)MBR * BS;
  const i64 all = keys > 0 ? (keys + ATT_BI_CHUNK - 1) / ATT_BI_CHUNK : 1;
  const i64 win = window > 0 ? (window + ATT_BI_CHUNK - 1) / ATT_BI_CHUNK + 1 : all;
  return (int)(win < all ? win : all);
}
// Folds a split's online-softmax state (m, l, o) into the merged one (M, L, O) of the same row:
// the decode kernel's merge and the batch-invariant prefill kernel's split ends, with the same
// roundings (a split with no key is a no-op: keep 1, f 0).
__device__ __forceinline__ void att_bi_fold_scale(float M, float m, float& keep, float& f) {
  const float bm = fmaxf(M, m), mu = bm == NEG_INF ? 0.0f : bm;
  keep = exp2f(M - mu);
  f = exp2f(m - mu);
}
__device__ __forceinline__ float att_bi_fold(float X, float keep, float x, float f) {
  return __fadd_rn(__fmul_rn(X, keep), __fmul_rn(x, f));
}

// Split s of decode token t (whose row is reported, code 3, and attends to nothing when outside
// [0, R)): its row's keys [k0, k1), the token's number of splits ns and its row's block table.
// False when the token has fewer than s + 1 splits (block-uniform). TC: the tensor-core kernel's
// splits (att_tc_splits), else the CUDA-core kernels' (att_splits, ATT_MIN_CHUNK).
// kv0: the first key attended (batch-invariant splits: k0 may be below it, at a tile boundary).
// Batch-invariant mode, tensor-core kernel: the splits of att_bi_splits, at most nsMax (a token
// past the partials' capacity, decode token index i >= cap, runs unsplit).
struct AttDecodeItem {
  int r, k0, k1, ns, kv0;
  const int* tab;
};
template <bool TC>
__device__ __forceinline__ bool att_decode_item(int t, int s, int seff, const int* rows,
    const int* poss, const int* tables, int R, int MBR, int window, int* err, AttDecodeItem& it, int nsMax = 0,
    bool unsplit = false) {
  const int r = rows[t];
  int p = poss[t];
  const bool rowOk = r >= 0 && r < R;
  if (!rowOk) {
    if (s == 0 && threadIdx.x == 0 && (TC && ATT_TC_HEADS_FIRST ? blockIdx.x : blockIdx.y) == 0) report(err, 3, t, r, R);
    p = -1; // attends to nothing: zeros
  }
  int start, len, chunk;
  att_range(p, window, start, len);
  it.r = r;
  it.tab = tables + (i64)(rowOk ? r : 0) * MBR;
  it.kv0 = start;
  if (TC && ATT_BI) {
    const int ns = unsplit ? 1 : att_min(att_bi_splits(start, len), nsMax);
    it.ns = ns;
    if (s >= ns) return false;
    const int c0 = (start / ATT_BI_CHUNK + s) * ATT_BI_CHUNK;
    it.k0 = s == 0 ? start / ATT_TC_BK * ATT_TC_BK : c0;
    it.k1 = s == ns - 1 ? start + len : c0 + ATT_BI_CHUNK;
    return true;
  }
  it.ns = TC ? att_tc_splits(len, seff, chunk) : att_splits(len, seff, ATT_MIN_CHUNK, chunk);
  if (s >= it.ns) return false;
  it.k0 = start + s * chunk;
  it.k1 = att_min(it.k0 + chunk, start + len);
  return true;
}

__device__ __forceinline__ void att_unpack8(const uint4& v, float* f) {
  f[0] = __uint_as_float(v.x << 16); f[1] = __uint_as_float(v.x & 0xffff0000u);
  f[2] = __uint_as_float(v.y << 16); f[3] = __uint_as_float(v.y & 0xffff0000u);
  f[4] = __uint_as_float(v.z << 16); f[5] = __uint_as_float(v.z & 0xffff0000u);
  f[6] = __uint_as_float(v.w << 16); f[7] = __uint_as_float(v.w & 0xffff0000u);
}

// A score in the log2 domain from q.k, where q was pre-multiplied by scale (soft-capped) or by
// scale * log2(e) (not soft-capped).
__device__ __forceinline__ float att_score(float x, float softcap) {
  return softcap > 0.0f ? (softcap * ATT_LOG2E) * tanhf(x / softcap) : x;
}

// ---- decode: split-KV over the keys of one token, all query heads of a GQA group -----------
// Tuning macros (defaults below; $LLMTS_CUDA_ATT_DEFINES sets others for experiments, see
// kernels.ts and bench/cuda-attention-variants.sh): keys per stream per step for 4- and 8-head
// blocks, and the resident blocks per SM each kernel is compiled for.
#ifndef ATT_DEC_U4
#define ATT_DEC_U4 4
#endif
#ifndef ATT_DEC_U8
#define ATT_DEC_U8 2
#endif
// Resident blocks per SM each decode kernel is compiled for (__launch_bounds__' second argument;
// ATT_DEC_MINB overrides all of them). The kernel is latency-bound and its occupancy is set by its
// registers: d128_g4 took 159 registers (3 blocks an SM); held to 128 (4 blocks, 32 bytes spilled)
// it read 41% of the H200's copy bandwidth at 256 rows and 2k context instead of 30%, 1.35x
// faster. Slower: 5 or more blocks (spills), 8 keys a step, loading the next step's keys before
// computing the current one (199 registers), unpacking values key by key (no change); measured
// with bench/cuda-attention-variants.sh (results in BENCHMARKS.md). The others keep 1 until measured.
#ifdef ATT_DEC_MINB
#define ATT_DEC_MINB_OF(D, GC) ATT_DEC_MINB
#else
#define ATT_DEC_MINB_OF(D, GC) ((D) == 128 && (GC) == 4 ? 4 : 1)
#endif
// grid (W, KVH * ceil(G / GC)), 128 threads.
// part: f32 [W, H, D] un-normalised accumulators; partml: f32 [W, H, 2] (max (log2 domain), sum).
// plan: int [1 + T]; planReady: 1 when k_attn_plan filled it, else it is filled here.
template <int D, int GC>
__device__ __forceinline__ void att_decode(const u16* q, const u16* kpool, const u16* vpool, const int* rows,
    const int* poss, const int* tables, int* plan, int planReady, u16* out, float* part, float* partml, int T, int H,
    int KVH, int NB, int BS, int R, int MBR, int window, float scale, float softcap, int W, int* err) {
  enum {
    NCH = D / 8,                                  // 16-byte chunks per key row
    LPK = NCH <= 8 ? 8 : (NCH <= 16 ? 16 : 32),   // lanes per key
    KPI = 32 / LPK,                               // key streams per warp
    NSTR = 4 * KPI,                               // key streams per block
    U = GC <= 4 ? ATT_DEC_U4 : ATT_DEC_U8         // keys per stream per step
  };
  ATT_STATIC_ASSERT(D % 8 == 0 && NCH <= 32, att_decode_head_dim);
  __shared__ int s_list[ATT_DEC_INLINE_T];
  __shared__ int s_wsum[32];
  __shared__ float s_acc[4][GC][D];
  __shared__ float s_m[4][GC];
  __shared__ float s_l[4][GC];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ks = lane / LPK, dc = lane % LPK;
  const bool dact = dc < NCH;
  const int G = H / KVH, nhc = (G + GC - 1) / GC;
  const int kh = blockIdx.y / nhc, hc = blockIdx.y - kh * nhc;
  const int h0 = kh * G + hc * GC;
  const int gc = att_min(GC, G - hc * GC);
  const int w = blockIdx.x;

  const int* list;
  const int n = att_decode_tokens(rows, T, plan, planReady, s_list, s_wsum, &list, true);
  const int seff = att_seff(n, W);
  const float qmul = softcap > 0.0f ? scale : scale * ATT_LOG2E;
  const i64 rs = (i64)KVH * D; // elements from one slot to the next
  const u16* kb = kpool + (i64)kh * D + dc * 8;
  const u16* vb = vpool + (i64)kh * D + dc * 8;
  const int bsShift = att_bs_shift(BS);
  // seff > 1: slot w is split (w % seff) of decode token (w / seff); else slots stride the tokens
  const int s = seff > 1 ? w % seff : 0;
  for (int i = seff > 1 ? w / seff : w; i < n; i += seff > 1 ? n : W) {
    const int t = list[i];
    AttDecodeItem item;
    if (!att_decode_item<false>(t, s, seff, rows, poss, tables, R, MBR, window, err, item)) continue;
    const int r = item.r, ns = item.ns, k0 = item.k0, k1 = item.k1;
    const int* tab = item.tab;

    float qf[GC][8];
#pragma unroll
    for (int g = 0; g < GC; g++) {
#pragma unroll
      for (int e = 0; e < 8; e++) qf[g][e] = 0.0f;
      if (g < gc && dact) {
        att_unpack8(att_ldg16(q + ((i64)t * H + h0 + g) * D + dc * 8), qf[g]);
#pragma unroll
        for (int e = 0; e < 8; e++) qf[g][e] *= qmul;
      }
    }
    float m[GC], l[GC], acc[GC][8];
#pragma unroll
    for (int g = 0; g < GC; g++) {
      m[g] = NEG_INF;
      l[g] = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; e++) acc[g][e] = 0.0f;
    }

    // warp-uniform loop: the warp's KPI streams take keys jw + ks + u * NSTR
    for (int jw = k0 + warp * KPI; jw < k1; jw += NSTR * U) {
      uint4 kv[U], vv[U];
      bool ok[U];
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int j = jw + ks + u * NSTR;
        ok[u] = false;
        kv[u].x = kv[u].y = kv[u].z = kv[u].w = 0u;
        vv[u].x = vv[u].y = vv[u].z = vv[u].w = 0u;
        if (j < k1) {
          const int lb = att_block_of(j, BS, bsShift);
          const int blk = lb < MBR ? tab[lb] : -1;
          if (blk >= 0 && blk < NB) {
            ok[u] = true;
            if (dact) {
              const i64 off = ((i64)blk * BS + (j - lb * BS)) * rs;
              kv[u] = att_ldg16(kb + off);
              vv[u] = att_ldg16(vb + off);
            }
          } else if (dc == 0 && hc == 0) {
            report(err, 4, r, j, blk);
          }
        }
      }
      float sc[U][GC];
#pragma unroll
      for (int u = 0; u < U; u++) {
        float kf[8];
        att_unpack8(kv[u], kf);
#pragma unroll
        for (int g = 0; g < GC; g++) {
          float d = 0.0f;
          if (g < gc) {
#pragma unroll
            for (int e = 0; e < 8; e++) d += qf[g][e] * kf[e];
#pragma unroll
            for (int o = LPK / 2; o > 0; o >>= 1) d += __shfl_xor_sync(ATT_FULL, d, o);
          }
          sc[u][g] = ok[u] ? att_score(d, softcap) : NEG_INF;
        }
      }
      float vf[U][8];
#pragma unroll
      for (int u = 0; u < U; u++) att_unpack8(vv[u], vf[u]);
#pragma unroll
      for (int g = 0; g < GC; g++) {
        if (g < gc) {
          float mx = m[g];
#pragma unroll
          for (int u = 0; u < U; u++) mx = fmaxf(mx, sc[u][g]);
          const float mu = mx == NEG_INF ? 0.0f : mx;
          const float corr = exp2f(m[g] - mu);
          float pu[U], lsum = 0.0f;
#pragma unroll
          for (int u = 0; u < U; u++) {
            pu[u] = exp2f(sc[u][g] - mu);
            lsum += pu[u];
          }
          l[g] = l[g] * corr + lsum;
          m[g] = mx;
#pragma unroll
          for (int e = 0; e < 8; e++) {
            float a = acc[g][e] * corr;
#pragma unroll
            for (int u = 0; u < U; u++) a += pu[u] * vf[u][e];
            acc[g][e] = a;
          }
        }
      }
    }

    // merge the warp's KPI streams (lanes dc, dc + LPK, ...)
#pragma unroll
    for (int o = LPK; o < 32; o <<= 1) {
#pragma unroll
      for (int g = 0; g < GC; g++) {
        if (g < gc) {
          const float mo = __shfl_xor_sync(ATT_FULL, m[g], o);
          const float lo = __shfl_xor_sync(ATT_FULL, l[g], o);
          const float mx = fmaxf(m[g], mo);
          const float mu = mx == NEG_INF ? 0.0f : mx;
          const float f1 = exp2f(m[g] - mu), f2 = exp2f(mo - mu);
          l[g] = l[g] * f1 + lo * f2;
          m[g] = mx;
#pragma unroll
          for (int e = 0; e < 8; e++) acc[g][e] = acc[g][e] * f1 + __shfl_xor_sync(ATT_FULL, acc[g][e], o) * f2;
        }
      }
    }
    if (ks == 0) {
#pragma unroll
      for (int g = 0; g < GC; g++) {
        if (g < gc) {
          if (dact) {
#pragma unroll
            for (int e = 0; e < 8; e++) s_acc[warp][g][dc * 8 + e] = acc[g][e];
          }
          if (dc == 0) {
            s_m[warp][g] = m[g];
            s_l[warp][g] = l[g];
          }
        }
      }
    }
    __syncthreads();
    // merge the 4 warps; one split: the output, else a partial for k_attn_combine
    for (int idx = tid; idx < gc * D; idx += blockDim.x) {
      const int g = idx / D, d = idx - g * D;
      float mx = NEG_INF;
#pragma unroll
      for (int wi = 0; wi < 4; wi++) mx = fmaxf(mx, s_m[wi][g]);
      const float mu = mx == NEG_INF ? 0.0f : mx;
      float L = 0.0f, O = 0.0f;
#pragma unroll
      for (int wi = 0; wi < 4; wi++) {
        const float f = exp2f(s_m[wi][g] - mu);
        L += s_l[wi][g] * f;
        O += s_acc[wi][g][d] * f;
      }
      const int h = h0 + g;
      if (ns == 1) {
        out[((i64)t * H + h) * D + d] = f2bf(L > 0.0f ? O / L : 0.0f);
      } else {
        const i64 ph = ((i64)i * seff + s) * H + h;
        part[ph * D + d] = O;
        if (d == 0) {
          partml[ph * 2] = mx;
          partml[ph * 2 + 1] = L;
        }
      }
    }
    __syncthreads(); // s_acc / s_m / s_l are rewritten by the next token
  }
}

#define ATT_DECODE_KERNEL(D, GC) \
extern "C" __global__ void __launch_bounds__(128, ATT_DEC_MINB_OF(D, GC)) k_attn_decode_d##D##_g##GC(const u16* q, const u16* kpool, \
    const u16* vpool, const int* rows, const int* poss, const int* tables, int* plan, int planReady, u16* out, \
    float* part, float* partml, int T, int H, int KVH, int NB, int BS, int R, int MBR, int window, float scale, \
    float softcap, int W, int* err) { \
  PDL_ENTRY(); \
  att_decode<D, GC>(q, kpool, vpool, rows, poss, tables, plan, planReady, out, part, partml, T, H, KVH, NB, BS, R, \
    MBR, window, scale, softcap, W, err); \
}
ATT_DECODE_KERNEL(64, 4)
ATT_DECODE_KERNEL(64, 8)
ATT_DECODE_KERNEL(128, 4)
ATT_DECODE_KERNEL(128, 8)
ATT_DECODE_KERNEL(256, 4)
ATT_DECODE_KERNEL(256, 8)

// Merges the splits of every decode token that has more than one. grid (>= 1, H), 128 threads.
extern "C" __global__ void __launch_bounds__(128) k_attn_combine(const int* rows, const int* poss, const int* plan,
    const float* part, const float* partml, u16* out, int T, int H, int D, int R, int window, int W) {
  PDL_ENTRY();
  const int n = plan[0];
  const int seff = att_seff(n, W);
  if (seff == 1) return;
  const int h = blockIdx.y;
  for (int i = blockIdx.x; i < n; i += gridDim.x) {
    const int t = plan[1 + i];
    const int r = rows[t];
    int p = poss[t];
    if (r < 0 || r >= R) p = -1;
    int start, len, chunk;
    att_range(p, window, start, len);
    const int ns = att_splits(len, seff, ATT_MIN_CHUNK, chunk); // the CUDA-core kernels' splits
    if (ns == 1) continue; // written by the decode kernel
    const i64 base = (i64)i * seff;
    float mx = NEG_INF;
    for (int s = 0; s < ns; s++) mx = fmaxf(mx, partml[((base + s) * H + h) * 2]);
    const float mu = mx == NEG_INF ? 0.0f : mx;
    float L = 0.0f;
    for (int s = 0; s < ns; s++) {
      const i64 ph = (base + s) * H + h;
      L += partml[ph * 2 + 1] * exp2f(partml[ph * 2] - mu);
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      float O = 0.0f;
      for (int s = 0; s < ns; s++) {
        const i64 ph = (base + s) * H + h;
        O += part[ph * D + d] * exp2f(partml[ph * 2] - mu);
      }
      out[((i64)t * H + h) * D + d] = f2bf(O * inv);
    }
  }
}

// ---- prefill: tensor-core flash attention over 64-token tiles --------------------------------

// Threads [0, BK): slots[i] = KV slot of key j0 + i, or -1 (above kmax, or no block). A key up to
// kmax without a block is reported (code 4) when reportOk and a query of the segment (mem /
// start / pos) attends it. Returns whether this thread met a key <= kmax without a block.
template <int BK>
__device__ __forceinline__ int att_key_slots(int* slots, const int* tab, int j0, int kmax, int NB, int BS, int bsShift,
    int MBR, const int* mem, const int* start, const int* pos, int seg, bool reportOk, int* err) {
  int bad = 0;
  if ((int)threadIdx.x < BK) {
    const int j = j0 + threadIdx.x;
    int slot = -1;
    if (j <= kmax) {
      const int lb = att_block_of(j, BS, bsShift);
      const int blk = lb < MBR ? tab[lb] : -1;
      if (blk >= 0 && blk < NB) {
        slot = blk * BS + (j - lb * BS);
      } else {
        bad = 1;
        if (reportOk) {
          bool seen = false;
          for (int q = 0; q < ATT_BQ; q++) seen |= mem[q] && start[q] <= j && j <= pos[q];
          if (seen) report(err, 4, seg, j, blk);
        }
      }
    }
    slots[threadIdx.x] = slot;
  }
  return bad;
}

// Issues (cp.async, 128 threads) the copies of the BK key rows at slots (-1: zeros) from base
// (pool + kv head offset; rs elements from one slot to the next) into dst [BK][D + 8].
template <int D, int BK>
__device__ __forceinline__ void att_issue(u16* dst, const u16* base, const int* slots, i64 rs) {
  enum { LDS = D + 8, NCH = D / 8, LPT = BK * NCH / 128 };
#pragma unroll
  for (int k = 0; k < LPT; k++) {
    const int c = threadIdx.x + k * 128, kr = c / NCH, ch = c - kr * NCH;
    const int slot = slots[kr];
    att_cp16(dst + kr * LDS + ch * 8, slot >= 0 ? (const void*)(base + (i64)slot * rs + ch * 8) : (const void*)base,
             slot >= 0);
  }
}

// The end of a split of the batch-invariant prefill (BI): each of this thread's two rows folds its
// split's state (m, l, o) into its merged one (M, L, O) as the tensor-core decode kernel's merge
// folds a split's partial (att_tc_fold_bi), and starts the next split empty.
template <int DT>
__device__ __forceinline__ void att_pf_fold(float (*o)[4], float (*O)[4], float& m0, float& m1, float& l0, float& l1,
    float& M0, float& M1, float& L0, float& L1) {
  float keep0, f0, keep1, f1;
  att_bi_fold_scale(M0, m0, keep0, f0);
  att_bi_fold_scale(M1, m1, keep1, f1);
  L0 = att_bi_fold(L0, keep0, l0, f0);
  L1 = att_bi_fold(L1, keep1, l1, f1);
#pragma unroll
  for (int k = 0; k < DT; k++) {
    O[k][0] = att_bi_fold(O[k][0], keep0, o[k][0], f0);
    O[k][1] = att_bi_fold(O[k][1], keep0, o[k][1], f0);
    O[k][2] = att_bi_fold(O[k][2], keep1, o[k][2], f1);
    O[k][3] = att_bi_fold(O[k][3], keep1, o[k][3], f1);
    o[k][0] = o[k][1] = o[k][2] = o[k][3] = 0.0f;
  }
  M0 = fmaxf(M0, m0);
  M1 = fmaxf(M1, m1);
  m0 = m1 = NEG_INF;
  l0 = l1 = 0.0f;
}

// BI (k_attn_prefill_bi_d<D>, batch-invariant mode): a query's result bit for bit as the tensor-core
// decode kernel's with ATT_BI would give it, so that a prompt token comes out the same whether its
// chunk makes it a prefill or a decode token: key tiles of ATT_TC_BK at multiples of it, the tile's
// sums in the decode kernel's order (a row's own sum each tile, then l = fma(l, corr, sum)), and
// the online state folded into a merged one at each multiple of ATT_BI_CHUNK (att_pf_fold), as the
// decode kernel's splits are merged. Tiles and splits where a row sees no key leave it unchanged
// exactly (corr and keep 1, sums 0).
template <int D, int BK, bool BI>
__device__ __forceinline__ void att_prefill(const u16* q, const u16* kpool, const u16* vpool, const int* rows,
    const int* poss, const int* tables, u16* out, int T, int H, int KVH, int NB, int BS, int R, int MBR, int window,
    float scale, float softcap, int* err) {
  enum {
    BQ = ATT_BQ,
    NTH = 128,
    LDS = D + 8,     // shared row stride (elements): 16 B of padding keeps ldmatrix conflict-free
    NCH = D / 8,     // 16-byte chunks per row
    KST = D / 16,    // k-steps of Q.K^T
    NT = BK / 8,     // n-tiles of S (keys)
    DT = D / 8       // n-tiles of O (dims)
  };
  enum { NS = ATT_PF_STAGES, TILE = BK * LDS };
  ATT_STATIC_ASSERT(D % 16 == 0 && BK % 16 == 0 && (BK * NCH) % NTH == 0 && BQ <= 2 * BK && BQ == 64 && NS >= 2 && NS <= 4,
                    att_prefill_tile);
  ATT_STATIC_ASSERT(!BI || (BK == ATT_TC_BK && ATT_BI_CHUNK % BK == 0), att_prefill_bi_tiles);

  // the ring: [stage][K tile, V tile], the launch's dynamic shared memory (attPfSharedBytes); the
  // tile's queries are staged through stage 0 before the key loop
  u16* const s_kv = (u16*)dyn_smem();
  __shared__ int s_row[BQ], s_pos[BQ], s_start[BQ], s_own[BQ], s_done[BQ], s_mem[BQ];
  __shared__ int s_slot[NS][BK]; // KV slot of each key of a stage's tile (-1: none)
  __shared__ int s_red[4][2];
  __shared__ int s_seg;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int h = blockIdx.x, kh = h / (H / KVH);
  const int t0 = (gridDim.y - 1 - blockIdx.y) * BQ; // late (heavy) tiles first
  const int bsShift = att_bs_shift(BS);

  // 1. the tile's queries: owned = prefill tokens of this tile
  int anyOwn = 0;
  if (tid < BQ) {
    const int t = t0 + tid;
    int own = 0, r = -1, p = -1, st = 0, len = 0;
    if (t < T && !att_is_decode(rows, T, t)) {
      own = 1;
      r = rows[t];
      p = poss[t];
      if (r < 0 || r >= R) {
        if (h == 0) report(err, 3, t, r, R);
        r = -1;
        p = -1;
      }
      att_range(p, window, st, len);
    }
    s_own[tid] = own;
    s_row[tid] = r;
    s_pos[tid] = p;
    s_start[tid] = st;
    s_done[tid] = !(own && r >= 0 && len > 0); // nothing to attend: written as zeros
    anyOwn = own;
  }
  if (!__syncthreads_or(anyOwn)) return;

  // 2. Q fragments (A operand, rows = queries), staged through shared memory
  for (int c = tid; c < BQ * NCH; c += NTH) {
    const int qi = c / NCH, ch = c - qi * NCH, t = t0 + qi;
    const bool ok = t < T && s_own[qi];
    att_cp16(s_kv + qi * LDS + ch * 8, ok ? (const void*)(q + ((i64)t * H + h) * D + ch * 8) : (const void*)q, ok);
  }
  att_cp_commit();
  att_cp_wait<0>();
  __syncthreads();
  unsigned qa[KST][4];
#pragma unroll
  for (int k = 0; k < KST; k++) att_ldsm4(qa[k], s_kv + (warp * 16 + (lane & 15)) * LDS + k * 16 + (lane >> 4) * 8);

  // 3. this thread's two query rows (g, g + 8 of the warp's 16) and accumulators
  const int g = lane >> 2, c4 = lane & 3;
  const int qr0 = warp * 16 + g, qr1 = qr0 + 8;
  float o[DT][4];
#pragma unroll
  for (int k = 0; k < DT; k++) o[k][0] = o[k][1] = o[k][2] = o[k][3] = 0.0f;
  float mrow0 = NEG_INF, mrow1 = NEG_INF, lrow0 = 0.0f, lrow1 = 0.0f;
  // BI: the merged state of the splits folded so far
  float Om[BI ? DT : 1][4];
#pragma unroll
  for (int k = 0; k < (BI ? DT : 1); k++) Om[k][0] = Om[k][1] = Om[k][2] = Om[k][3] = 0.0f;
  float Mm0 = NEG_INF, Mm1 = NEG_INF, Lm0 = 0.0f, Lm1 = 0.0f;
  const float qmul = softcap > 0.0f ? scale : scale * ATT_LOG2E;
  const i64 rs = (i64)KVH * D;
  const u16* kbase = kpool + (i64)kh * D;
  const u16* vbase = vpool + (i64)kh * D;

  // 4. one segment (the tile's queries of one row) at a time
  for (;;) {
    __syncthreads(); // s_done / s_mem / s_red / the K and V tiles are free
    if (tid == 0) {
      int rr = -1;
      for (int k = 0; k < BQ; k++) {
        if (!s_done[k]) { rr = s_row[k]; break; }
      }
      s_seg = rr;
    }
    __syncthreads();
    const int seg = s_seg;
    if (seg < 0) break;
    if (tid < BQ) {
      const int mm = !s_done[tid] && s_row[tid] == seg;
      s_mem[tid] = mm;
      if (mm) s_done[tid] = 1;
    }
    __syncthreads();
    const bool m0 = s_mem[qr0] != 0, m1 = s_mem[qr1] != 0;
    const int st0 = s_start[qr0], st1 = s_start[qr1], p0 = s_pos[qr0], p1 = s_pos[qr1];
    int wMinS = att_min(m0 ? st0 : ATT_BIG, m1 ? st1 : ATT_BIG);
    int wMaxS = att_max(m0 ? st0 : -ATT_BIG, m1 ? st1 : -ATT_BIG);
    int wMinP = att_min(m0 ? p0 : ATT_BIG, m1 ? p1 : ATT_BIG);
    int wMaxP = att_max(m0 ? p0 : -ATT_BIG, m1 ? p1 : -ATT_BIG);
    int wAll = m0 && m1;
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
      wMinS = att_min(wMinS, __shfl_xor_sync(ATT_FULL, wMinS, off));
      wMaxS = att_max(wMaxS, __shfl_xor_sync(ATT_FULL, wMaxS, off));
      wMinP = att_min(wMinP, __shfl_xor_sync(ATT_FULL, wMinP, off));
      wMaxP = att_max(wMaxP, __shfl_xor_sync(ATT_FULL, wMaxP, off));
      wAll &= __shfl_xor_sync(ATT_FULL, wAll, off);
    }
    if (lane == 0) {
      s_red[warp][0] = wMinS;
      s_red[warp][1] = wMaxP;
    }
    __syncthreads();
    int kmin = ATT_BIG, kmax = -ATT_BIG;
#pragma unroll
    for (int wi = 0; wi < 4; wi++) {
      kmin = att_min(kmin, s_red[wi][0]);
      kmax = att_max(kmax, s_red[wi][1]);
    }
    const bool wAny = wMaxP > -ATT_BIG;
    const int* tab = tables + (i64)seg * MBR;
    if (BI) kmin = kmin / BK * BK; // tiles at multiples of BK, as the decode kernel's
    const int ntiles = (kmax - kmin) / BK + 1; // members attend >= 1 key: kmax >= kmin

    // The key tiles go through a ring of NS stages, a tile's keys and values one cp.async group:
    // tiles it + 1 .. it + NS - 1 load while tile it computes. A tile's slots are looked up when its
    // copies are issued, NS - 1 tiles ahead of its use; bit k of badMask: this thread met a key
    // without a block in stage k's tile.
    unsigned badMask = 0;
#pragma unroll
    for (int k = 0; k < NS - 1; k++) {
      if (k < ntiles && att_key_slots<BK>(s_slot[k], tab, kmin + k * BK, kmax, NB, BS, bsShift, MBR, s_mem, s_start, s_pos,
                                          seg, h == 0, err)) badMask |= 1u << k;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < NS - 1; k++) {
      if (k < ntiles) {
        att_issue<D, BK>(s_kv + k * 2 * TILE, kbase, s_slot[k], rs);
        att_issue<D, BK>(s_kv + k * 2 * TILE + TILE, vbase, s_slot[k], rs);
      }
      att_cp_commit(); // (an empty group past the last tile: the waits below count the same groups)
    }
    for (int it = 0; it < ntiles; it++) {
      const int j0 = kmin + it * BK, st = it % NS, nx = it + NS - 1, sn = nx % NS;
      if (BI && it > 0 && j0 % ATT_BI_CHUNK == 0) att_pf_fold<DT>(o, Om, mrow0, mrow1, lrow0, lrow1, Mm0, Mm1, Lm0, Lm1);
      // tile nx goes to the stage tile it - 1 used (every warp is done with it: the barrier that
      // ends each iteration)
      if (nx < ntiles) {
        const int bad = att_key_slots<BK>(s_slot[sn], tab, kmin + nx * BK, kmax, NB, BS, bsShift, MBR, s_mem, s_start, s_pos,
                                          seg, h == 0, err);
        badMask = (badMask & ~(1u << sn)) | ((unsigned)bad << sn);
      }
      att_cp_wait<NS - 2>(); // this thread's copies of tile it have landed
      const int tileBad = __syncthreads_or((badMask >> st) & 1u); // everyone's; and tile nx's slots are written
      if (nx < ntiles) {
        att_issue<D, BK>(s_kv + sn * 2 * TILE, kbase, s_slot[sn], rs);
        att_issue<D, BK>(s_kv + sn * 2 * TILE + TILE, vbase, s_slot[sn], rs);
      }
      att_cp_commit();
      const u16* const sK = s_kv + st * 2 * TILE;
      const u16* const sV = sK + TILE;
      const bool act = wAny && j0 <= wMaxP && j0 + BK - 1 >= wMinS;
      const bool full = wAll && !tileBad && j0 >= wMaxS && j0 + BK - 1 <= wMinP;
      float sc[NT][4];
#pragma unroll
      for (int k = 0; k < NT; k++) sc[k][0] = sc[k][1] = sc[k][2] = sc[k][3] = 0.0f;
      if (act) {
#pragma unroll
        for (int k = 0; k < KST; k++) {
#pragma unroll
          for (int np = 0; np < NT / 2; np++) {
            unsigned b[4];
            att_ldsm4(b, sK + (np * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + k * 16 + ((lane >> 3) & 1) * 8);
            att_mma(sc[2 * np], qa[k], b[0], b[1]);
            att_mma(sc[2 * np + 1], qa[k], b[2], b[3]);
          }
        }
        float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
        for (int k = 0; k < NT; k++) {
#pragma unroll
          for (int e = 0; e < 4; e++) {
            float x = att_score(sc[k][e] * qmul, softcap);
            if (!full) {
              const int col = k * 8 + 2 * c4 + (e & 1), j = j0 + col;
              const bool vis = e < 2 ? (m0 && j >= st0 && j <= p0) : (m1 && j >= st1 && j <= p1);
              if (!vis || s_slot[st][col] < 0) x = NEG_INF;
            }
            sc[k][e] = x;
            if (e < 2) mx0 = fmaxf(mx0, x);
            else mx1 = fmaxf(mx1, x);
          }
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(ATT_FULL, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(ATT_FULL, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(ATT_FULL, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(ATT_FULL, mx1, 2));
        const float mn0 = fmaxf(mrow0, mx0), mn1 = fmaxf(mrow1, mx1);
        const float mu0 = mn0 == NEG_INF ? 0.0f : mn0, mu1 = mn1 == NEG_INF ? 0.0f : mn1;
        const float cr0 = exp2f(mrow0 - mu0), cr1 = exp2f(mrow1 - mu1);
        mrow0 = mn0;
        mrow1 = mn1;
        float ls0 = 0.0f, ls1 = 0.0f;
#pragma unroll
        for (int k = 0; k < NT; k++) {
          sc[k][0] = exp2f(sc[k][0] - mu0);
          sc[k][1] = exp2f(sc[k][1] - mu0);
          sc[k][2] = exp2f(sc[k][2] - mu1);
          sc[k][3] = exp2f(sc[k][3] - mu1);
          if (BI) { // one add at a time, in the decode kernel's order
            ls0 += sc[k][0];
            ls0 += sc[k][1];
            ls1 += sc[k][2];
            ls1 += sc[k][3];
          } else {
            ls0 += sc[k][0] + sc[k][1];
            ls1 += sc[k][2] + sc[k][3];
          }
        }
        if (BI) { // the row's sum of the tile, as the decode kernel's; below, its lanes' sums at the end
          ls0 += __shfl_xor_sync(ATT_FULL, ls0, 1);
          ls0 += __shfl_xor_sync(ATT_FULL, ls0, 2);
          ls1 += __shfl_xor_sync(ATT_FULL, ls1, 1);
          ls1 += __shfl_xor_sync(ATT_FULL, ls1, 2);
          lrow0 = ATT_FMA(lrow0, cr0, ls0);
          lrow1 = ATT_FMA(lrow1, cr1, ls1);
        } else {
          lrow0 = lrow0 * cr0 + ls0;
          lrow1 = lrow1 * cr1 + ls1;
        }
#pragma unroll
        for (int k = 0; k < DT; k++) {
          o[k][0] *= cr0;
          o[k][1] *= cr0;
          o[k][2] *= cr1;
          o[k][3] *= cr1;
        }
      }
      if (act) {
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
          unsigned pa[4];
          pa[0] = att_pack2(sc[2 * kk][0], sc[2 * kk][1]);
          pa[1] = att_pack2(sc[2 * kk][2], sc[2 * kk][3]);
          pa[2] = att_pack2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
          pa[3] = att_pack2(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
          for (int dp = 0; dp < DT / 2; dp++) {
            unsigned b[4];
            att_ldsm4t(b, sV + (kk * 16 + (lane & 15)) * LDS + dp * 16 + (lane >> 4) * 8);
            att_mma(o[2 * dp], pa, b[0], b[1]);
            att_mma(o[2 * dp + 1], pa, b[2], b[3]);
          }
        }
      }
      __syncthreads(); // every warp is done with stage st, which tile it + NS refills
    }
    if (BI) att_pf_fold<DT>(o, Om, mrow0, mrow1, lrow0, lrow1, Mm0, Mm1, Lm0, Lm1); // the segment's last split
  }

  // 5. normalise and write the owned rows (BI: the merged state; its sums are whole rows already)
  if (BI) {
    lrow0 = Lm0;
    lrow1 = Lm1;
#pragma unroll
    for (int k = 0; k < (BI ? DT : 1); k++) {
      o[k][0] = Om[k][0];
      o[k][1] = Om[k][1];
      o[k][2] = Om[k][2];
      o[k][3] = Om[k][3];
    }
  } else {
    lrow0 += __shfl_xor_sync(ATT_FULL, lrow0, 1);
    lrow0 += __shfl_xor_sync(ATT_FULL, lrow0, 2);
    lrow1 += __shfl_xor_sync(ATT_FULL, lrow1, 1);
    lrow1 += __shfl_xor_sync(ATT_FULL, lrow1, 2);
  }
  const float inv0 = lrow0 > 0.0f ? 1.0f / lrow0 : 0.0f, inv1 = lrow1 > 0.0f ? 1.0f / lrow1 : 0.0f;
  const int ta = t0 + qr0, tb = t0 + qr1;
  if (ta < T && s_own[qr0]) {
    u16* dst = out + ((i64)ta * H + h) * D + 2 * c4;
#pragma unroll
    for (int k = 0; k < DT; k++) *(unsigned*)(dst + k * 8) = ATT_OUT_PACK2(o[k][0] * inv0, o[k][1] * inv0);
  }
  if (tb < T && s_own[qr1]) {
    u16* dst = out + ((i64)tb * H + h) * D + 2 * c4;
#pragma unroll
    for (int k = 0; k < DT; k++) *(unsigned*)(dst + k * 8) = ATT_OUT_PACK2(o[k][2] * inv1, o[k][3] * inv1);
  }
}

#define ATT_PREFILL_KERNEL(D, BK) \
extern "C" __global__ void __launch_bounds__(128) k_attn_prefill_d##D(const u16* q, const u16* kpool, \
    const u16* vpool, const int* rows, const int* poss, const int* tables, u16* out, int T, int H, int KVH, int NB, \
    int BS, int R, int MBR, int window, float scale, float softcap, int* err) { \
  att_prefill<D, BK, false>(q, kpool, vpool, rows, poss, tables, out, T, H, KVH, NB, BS, R, MBR, window, scale, softcap, err); \
}
ATT_PREFILL_KERNEL(64, 64)
ATT_PREFILL_KERNEL(128, 64)
ATT_PREFILL_KERNEL(256, 32)
// batch-invariant mode's (k_attn_prefill_bi_d<D>: the tensor-core decode kernel's head dims and tiles)
#define ATT_PREFILL_BI_KERNEL(D) \
extern "C" __global__ void __launch_bounds__(128) k_attn_prefill_bi_d##D(const u16* q, const u16* kpool, \
    const u16* vpool, const int* rows, const int* poss, const int* tables, u16* out, int T, int H, int KVH, int NB, \
    int BS, int R, int MBR, int window, float scale, float softcap, int* err) { \
  att_prefill<D, ATT_TC_BK, true>(q, kpool, vpool, rows, poss, tables, out, T, H, KVH, NB, BS, R, MBR, window, scale, softcap, err); \
}
ATT_PREFILL_BI_KERNEL(64)
ATT_PREFILL_BI_KERNEL(128)
`;

/** Everything above: the attention module's kernels (kernelModules in kernels.ts) as `a` plans them. */
export function attentionKernelSource(a: CudaAttentionSettings, batchInvariant = false): string {
  return ATTENTION_PRIMITIVES + attentionKernels(a, batchInvariant) + attDecodeTcKernels(a.tcStages);
}
