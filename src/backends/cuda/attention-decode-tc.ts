// CUDA source of the tensor-core split-KV decode kernel, part of the attention module (appended to
// attention-kernels.ts' source, whose helpers it uses: att_decode_tokens, att_decode_item, att_seff,
// att_cp16, att_ldsm4(t), att_mma, att_pack2, att_score). The default decode kernel where it applies
// (attention.ts; $LLMTS_CUDA_ATT_DECODE=cuda-core for k_attn_decode_d<D>_g<GC>). Its logic is checked
// without one by test/backends/cuda-attention-sim.slow.ts (the warp simulator, cuda-sim/).
//
// Why: the CUDA-core decode kernel holds each lane's share of q, the group's accumulators and the
// keys in flight in registers (159 of them at d128 / 4 heads); that caps it at 3-4 blocks an SM and
// ~40% of copy bandwidth at 256 rows. Here keys and values travel by cp.async into shared memory
// (bytes in flight cost no registers) and the dot products run on tensor cores.
//
//   k_attn_decode_tc_d<D>  grid (KVH, W) (ATT_TC_HEADS_FIRST; else (W, KVH)), 128 threads; same slots, splits, partials and combine as
//       k_attn_decode_d<D>_g<GC> (it is a drop-in replacement when the GQA group G <= 16). The
//       group's G query heads are the rows of one m16 tile (rows >= G are zeros, never written).
//       Keys go in tiles of BK = 32 through a ring of ATT_TC_STAGES stages (attTcStages, default
//       2): while tile it is used, tiles it+1 .. it+STAGES-1 load (Q travels with tile 0, and each
//       tile's block-table entries are read a tile ahead, so at one row, where the kernel is a
//       chain of global round trips, a tile costs no extra one). The ring is the launch's dynamic
//       shared memory (attTcSharedBytes: past 48 KiB at 3 stages, so attention.ts raises the
//       kernel's limit).
//       Per tile: warp w computes the scores of keys [8w, 8w + 8) (S = Q K^T, mma m16n8k16) into
//       shared memory; then every warp reads the whole tile's scores and runs the same online
//       softmax (so all warps hold identical max and sum), and computes O[:, D/4 * w ..) += P V for
//       its quarter of the head dims. No cross-warp merge at the end: each warp writes its dims.
//       Registers: the Q fragments (D/16 x 4), a quarter of O (D/32 x 4) and a few scores.
//       With `counters` (attention.ts: always, up to ATT_COUNTERS tokens x kv heads) a split token
//       needs no k_attn_combine: each split writes its partial and counts itself in
//       counters[token, kv head] (ATT_TC_SYNC); the split that counts last merges the partials of
//       the group's heads (through the ring, a chunk of splits a round trip) and writes the
//       output, and sets the counter back to 0 for the next call (a graph replays the same
//       buffer). At one row that saves a dependent launch per layer.
/**
 * The module's source of the kernel at `stages` stages (CudaAttentionSettings.tcStages; the define
 * comes last before the body, so CudaKernelSettings.attentionDefines cannot set a ring size the host
 * does not launch with).
 */
export const attDecodeTcKernels = (stages: number): string => `#define ATT_TC_STAGES ${stages}\n` + DECODE_TC_BODY;
const DECODE_TC_BODY = String.raw`
// ATT_TC_EARLY=1 (default; $LLMTS_CUDA_ATT_DEFINES=ATT_TC_EARLY=0 waits first): with programmatic
// dependent launch, a block reads its token's row, position and first block-table entries before
// it waits for the kernel before (rope + KV write), instead of after: at one row the kernel is a
// chain of global round trips, and these are the first ones; and a block with no split to run
// exits without waiting. A server's graphs plan the slots for the longest context a row may have
// (45 at one row on the H200), so at a 512-token context 288 of a launch's 360 blocks are such.
// H200, B=1: +0.04-0.43% in 8 pairs of runs, none slower (512 and 4k, the bench's table and a 32k
// one).
#ifndef ATT_TC_EARLY
#define ATT_TC_EARLY 1
#endif
// Resident blocks an SM the kernel is compiled for (attention.ts plans its slots in waves of
// CudaAttentionSettings.tcResident, 3 by default): caps it at 168 registers (d128 takes 128 with nvcc 13 for sm_90, no spills), so growth
// spills instead of silently dropping to 2 blocks an SM and breaking the plan's waves.
#ifndef ATT_TC_MINB
#define ATT_TC_MINB 3
#endif
// ATT_TC_PHASES=1 ($LLMTS_CUDA_ATT_DEFINES; a measurement, off by default): thread 0 of every block
// counts clock64 cycles by phase and, at its end, adds them to att_tc_phases[phase] = {cycles,
// blocks}: 0 the PDL wait (with ATT_TC_EARLY, the reads before it too), 1 the token's row, tables
// and Q up to its first tile's wait, 2 the tiles, 3 the partial and the split counter; merging
// blocks only: 4 the reader's fence (ATT_TC_SYNC=0; by default none: ~200 cycles measured between the marks), 5 the merge's loads (issue to landed), 6 its folds and
// writes; 7 the whole block. The host reads them (CudaBackend.attentionPhases;
// bench/cuda-generate.ts prints them): where the kernel's time goes inside a decode graph, which
// Nsight Compute's kernel-alone replays cannot show.
#ifndef ATT_TC_PHASES
#define ATT_TC_PHASES 0
#endif
// ATT_TC_SYNC ($LLMTS_CUDA_ATT_DEFINES): how a split hands its partial to the merging one. 0: every
// thread fences its writes, tid 0 counts (atomicAdd), and the merging block's threads each fence
// again before reading; 1: tid 0 alone, one atom.add.acq_rel.gpu after the block's barrier (its
// release covers the block's writes, its acquire the others'; the barrier after it passes that on
// to the block's threads: the PTX memory model's cumulativity). H200: the merging block's fence
// takes 200 cycles with 1 against 650-900 with 0; B=1 +0.2-0.6% in 4 of 4 pairs (512 and 4k), so 1.
#ifndef ATT_TC_SYNC
#define ATT_TC_SYNC 1
#endif
// Code size: at one row every block runs the kernel once on an SM whose instruction caches the
// step's other kernels have since filled, so each instruction of its path is fetched anew, a round
// trip a cache line, in the chain. On the H200 (ATT_TC_PHASES): the merge's
// fold of 5 splits took 4.5k cycles its first time and 1.5k when run again at once; with the copy
// loops and the folds not unrolled (SASS of d128: 2.5k instructions, not 6.2k) the fold took 1.7k
// and B=1 at 512 ran 0.7% faster, but at 4k context (folds of 17 splits, the merge's copies of 17
// a thread) 1% slower. Kept: the tiles' and Q's copy-issue loops rolled (3.6k instructions); the
// merge's loops unrolled by 4 (rolled up to 8 splits measured the same: 231.1 tok/s at 512, 218.0
// at 4k, either way).
// ATT_TC_TRIGGER (CudaAttentionSettings.tcTrigger, $LLMTS_CUDA_ATT_TC_TRIGGER): when a block lets the next kernel
// launch (griddepcontrol.launch_dependents). 0: right after its wait (PDL_ENTRY), so the next
// kernel's blocks sit resident, waiting, beside the attention's chain; 1: once its split has counted
// itself (a merging block: before its merge; a lone split or an idle slot: at its exit); 2: at its
// exit; 3 (default): as 1, but a merging block once its merge's first chunk of partials has landed
// (the next kernel's early weight loads slowed those L2 reads from 2k to 6.7k cycles at 512).
#define ATT_TC_WAIT() PDL_WAIT(ATT_TC_TRIGGER == 0)
#if ATT_TC_PHASES
#define ATT_TC_NPHASES 8
extern "C" { __device__ unsigned long long att_tc_phases[ATT_TC_NPHASES][2]; }
#endif

// the block-table entry of key j of a row (-1 past k1 or past the table's width)
__device__ __forceinline__ int att_tc_table_entry(const int* tab, int j, int k1, int BS, int bsShift, int MBR) {
  if (j >= k1) return -1;
  const int lb = att_block_of(j, BS, bsShift);
  return lb < MBR ? tab[lb] : -1;
}

// The merge's fold of a chunk of nc splits (their partials in s_part, split-major, G x D floats
// each; their maxima and sums in s_ml, (split, row) pairs) into this thread's float4 columns
// tid + u 128 of the group's outputs, online
template <int UM>
__device__ __forceinline__ void att_tc_fold(const float* s_part, const float* s_ml, int nc, int G, int NC4, int D,
    float* mx, float* L, float4* O) {
#pragma unroll
  for (int u = 0; u < UM; u++) {
    const int col = threadIdx.x + u * 128, row = col * 4 / D;
    if (col >= NC4) continue;
    float bm = mx[u];
#pragma unroll 4
    for (int v = 0; v < nc; v++) bm = fmaxf(bm, s_ml[2 * (v * G + row)]);
    const float mu = bm == NEG_INF ? 0.0f : bm;
    const float keep = exp2f(mx[u] - mu); // 0 while nothing is summed (mx = -inf)
    float l = L[u] * keep;
    float4 o = make_float4(O[u].x * keep, O[u].y * keep, O[u].z * keep, O[u].w * keep);
#pragma unroll 4
    for (int v = 0; v < nc; v++) {
      const float f = exp2f(s_ml[2 * (v * G + row)] - mu);
      const float4 pv = *(const float4*)(s_part + (v * NC4 + col) * 4);
      l += s_ml[2 * (v * G + row) + 1] * f;
      o.x += pv.x * f;
      o.y += pv.y * f;
      o.z += pv.z * f;
      o.w += pv.w * f;
    }
    mx[u] = bm;
    L[u] = l;
    O[u] = o;
  }
}

// Batch-invariant mode (ATT_BI): att_tc_fold's fold one split at a time, in split order, each by
// att_bi_fold, as the batch-invariant prefill kernel folds a query's splits
template <int UM>
__device__ __forceinline__ void att_tc_fold_bi(const float* s_part, const float* s_ml, int nc, int G, int NC4, int D,
    float* mx, float* L, float4* O) {
#pragma unroll
  for (int u = 0; u < UM; u++) {
    const int col = threadIdx.x + u * 128, row = col * 4 / D;
    if (col >= NC4) continue;
    for (int v = 0; v < nc; v++) {
      const float m = s_ml[2 * (v * G + row)], l = s_ml[2 * (v * G + row) + 1];
      const float4 pv = *(const float4*)(s_part + (v * NC4 + col) * 4);
      float keep, f;
      att_bi_fold_scale(mx[u], m, keep, f);
      L[u] = att_bi_fold(L[u], keep, l, f);
      O[u] = make_float4(att_bi_fold(O[u].x, keep, pv.x, f), att_bi_fold(O[u].y, keep, pv.y, f),
                         att_bi_fold(O[u].z, keep, pv.z, f), att_bi_fold(O[u].w, keep, pv.w, f));
      mx[u] = fmaxf(mx[u], m);
    }
  }
}

// thread 0 adds the cycles since the last mark to phase k (s_ph: the block's counters, ATT_TC_PHASES)
#if ATT_TC_PHASES
#define ATT_TC_PHASE(k) do { if (threadIdx.x == 0) { const long long now_ = clock64(); \
    s_ph[k] += now_ - s_ph[ATT_TC_NPHASES]; s_ph[ATT_TC_NPHASES] = now_; } } while (0)
#else
#define ATT_TC_PHASE(k) do {} while (0)
#endif
#if ATT_TC_PHASES
#define ATT_TC_PH_PARAM , long long* s_ph
#define ATT_TC_PH_ARG , s_ph
#else
#define ATT_TC_PH_PARAM
#define ATT_TC_PH_ARG
#endif

// The merge of a (token, kv head)'s ns partials into its group's G heads' outputs (rows outRow ..
// outRow + G - 1 of out), run by the split that counted last. The partials come into shared memory
// (s_part: the ring, free by then; no registers hold bytes in flight) by cp.async, CH splits at a
// time, with their maxima and sums beside them (s_ml: the scores' buffer): one round trip a chunk, 2
// at 33 splits (4k context, 2 stages, G = 4, d128). Then each thread folds its float4 columns of the
// group's G x D outputs over the chunk's splits, online. (Before: registers, 4 outputs x 8 splits a
// thread, with every split's maximum and sum loaded by every thread: measured on the H200 at 4k, the
// merge took 16.9k cycles, ~10 loaded round trips.) With ATT_TC_TRIGGER 3 the next kernel may
// launch once the first chunk has landed.
template <int D, int NST>
__device__ __forceinline__ void att_tc_merge(const float* part, const float* partml, u16* out, float* s_part,
    float* s_ml, int ns, int G, int H, i64 base0, i64 outRow ATT_TC_PH_PARAM) {
  enum { NTH = 128, UM = D / 32, RING_F = NST * ATT_TC_BK * (D + 8) }; // float4 columns a thread at G = 16; the ring in floats
  const int tid = threadIdx.x;
  const int GD = G * D, NC4 = GD / 4;
  const int CH = min(RING_F / GD, 16 * (ATT_TC_BK + 1) / (2 * G)); // >= 4 (G <= 16)
  float mx[UM], L[UM];
  float4 O[UM];
#pragma unroll
  for (int u = 0; u < UM; u++) mx[u] = NEG_INF, L[u] = 0.0f, O[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int sp0 = 0; sp0 < ns; sp0 += CH) {
    const int nc = min(CH, ns - sp0);
    // split sp's G heads are G x D consecutive floats of part
    for (int c = tid; c < nc * NC4; c += NTH) {
      const int v = c / NC4, col = c - v * NC4;
      att_cp16(s_part + c * 4, part + (base0 + (i64)(sp0 + v) * H) * D + col * 4, true);
    }
    att_cp_commit();
    for (int p = tid; p < nc * G; p += NTH) {
      const int v = p / G, row = p - v * G;
      const i64 ph = base0 + (i64)(sp0 + v) * H + row;
      s_ml[2 * p] = att_ldcg(partml + ph * 2);
      s_ml[2 * p + 1] = att_ldcg(partml + ph * 2 + 1);
    }
    att_cp_wait<0>();
    __syncthreads();
    if (ATT_TC_TRIGGER == 3 && sp0 == 0) pdl_launch_dependents();
    ATT_TC_PHASE(5);
    if (ATT_BI) att_tc_fold_bi<UM>(s_part, s_ml, nc, G, NC4, D, mx, L, O);
    else att_tc_fold<UM>(s_part, s_ml, nc, G, NC4, D, mx, L, O);
    __syncthreads(); // the chunk's buffers are free for the next
    ATT_TC_PHASE(6);
  }
#pragma unroll
  for (int u = 0; u < UM; u++) {
    const int col = tid + u * NTH, row = col * 4 / D, d = col * 4 - row * D;
    if (col >= NC4) continue;
    const float inv = L[u] > 0.0f ? 1.0f / L[u] : 0.0f;
    unsigned* dst = (unsigned*)(out + (outRow + row) * D + d);
    dst[0] = ATT_OUT_PACK2(O[u].x * inv, O[u].y * inv);
    dst[1] = ATT_OUT_PACK2(O[u].z * inv, O[u].w * inv);
  }
  ATT_TC_PHASE(6);
}

template <int D>
__device__ __forceinline__ void att_decode_tc(const u16* q, const u16* kpool, const u16* vpool, const int* rows,
    const int* poss, const int* tables, int* plan, int planReady, u16* out, float* part, float* partml, int T, int H,
    int KVH, int NB, int BS, int R, int MBR, int window, float scale, float softcap, int W, int* err, int* counters) {
  enum {
    BK = ATT_TC_BK,   // keys per tile
    NTH = 128,
    LDS = D + 8,      // shared row stride (elements): 16 B of padding keeps ldmatrix conflict-free
    NCH = D / 8,      // 16-byte chunks per row
    KST = D / 16,     // k-steps of Q.K^T
    DW = D / 4,       // head dims per warp in P.V
    DWT = DW / 8,     // n-tiles of O per warp
    TILE = BK * LDS,  // elements of one K or V tile
    NST = ATT_TC_STAGES
  };
  ATT_STATIC_ASSERT(D % 64 == 0 && D <= 128 && 16 * LDS <= 2 * TILE && NST >= 2 && NST <= 4, att_decode_tc_tile);
  // the merge's chunks through the ring: at least 4 splits of a 16-head group's partials (f32)
  ATT_STATIC_ASSERT(NST * TILE >= 4 * 16 * D, att_decode_tc_merge_chunk);
  __shared__ float s_sc[16][BK + 1];        // the tile's scores (log2 domain), rows = heads of the group
  __shared__ int s_slot[NST][BK];            // KV slot of each key of a stage's tile, -1: none
  __shared__ int s_list[ATT_DEC_INLINE_T];
  __shared__ int s_wsum[32];
  __shared__ int s_last;
#if ATT_TC_PHASES
  __shared__ long long s_ph[ATT_TC_NPHASES + 1]; // cycles by phase; [NPHASES]: the last mark
  if (threadIdx.x == 0) {
    for (int k = 0; k < ATT_TC_NPHASES; k++) s_ph[k] = 0;
    s_ph[ATT_TC_NPHASES] = clock64();
  }
  const long long ph_start = s_ph[ATT_TC_NPHASES]; // thread 0's (the only one that reads it)
#endif
#if !ATT_TC_EARLY
  ATT_TC_WAIT(); // (with ATT_TC_TIMING_SKIP the kernel waits, writes zeros and returns before this)
  ATT_TC_PHASE(0);
#endif
  // [stage][K tile, V tile] (NST 2 TILE elements); Q staged in the last stage before the key loop
  u16* const s_kv = (u16*)dyn_smem(); // the launch's dynamic shared memory

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c4 = lane & 3; // mma fragment coordinates: rows g, g + 8; columns 2 c4, 2 c4 + 1
  const int G = H / KVH;
  const int kh = ATT_TC_HEADS_FIRST ? blockIdx.x : blockIdx.y, h0 = kh * G; // attention-kernels.ts: ATT_TC_HEADS_FIRST
  const int w = ATT_TC_HEADS_FIRST ? blockIdx.y : blockIdx.x;

#if ATT_TC_EARLY
  // before the wait only what no kernel of the step writes: the step's rows, positions and block
  // tables (uploaded before the graph), and the error word; k_attn_plan's list is its output
  bool waited = planReady == 1;
  if (waited) {
    ATT_TC_WAIT();
    ATT_TC_PHASE(0);
  }
#endif
  const int* list;
  const int n = att_decode_tokens(rows, T, plan, planReady, s_list, s_wsum, &list, false);
  const int seff = att_seff(n, W);
  const float qmul = softcap > 0.0f ? scale : scale * ATT_LOG2E;
  const i64 rs = (i64)KVH * D;
  const u16* kbase = kpool + (i64)kh * D;
  const u16* vbase = vpool + (i64)kh * D;
  const int bsShift = att_bs_shift(BS);
  // Work items (decode token i, split s). By default slot w is split w % seff of token w / seff
  // (seff > 1), else the slots stride the tokens. Batch-invariant mode (ATT_BI): a token's splits do
  // not depend on n, so the slots stride the items i nsMax + s (nsMax: the most splits of any
  // token; the partials hold the first cap tokens' splits, as attention.ts sizes them)
  ATT_STATIC_ASSERT(ATT_BI_CHUNK % ATT_TC_BK == 0, att_bi_chunk_tiles);
  const int nsMax = ATT_BI ? att_bi_max_splits(MBR, BS, window) : 1;
  const int cap = att_min(T, ATT_DEC_MAX_RUN * R);
  const int stride = ATT_BI ? nsMax : seff; // of the partials, per token
  const int items = ATT_BI ? n * nsMax : n;
  const int s0 = seff > 1 ? w % seff : 0;
  for (int wi = ATT_BI ? w : (seff > 1 ? w / seff : w); wi < items; wi += ATT_BI ? W : (seff > 1 ? n : W)) {
    const int i = ATT_BI ? wi / nsMax : wi;
    const int s = ATT_BI ? wi - i * nsMax : s0;
    const int t = list ? list[i] : i;
    AttDecodeItem item;
    if (!att_decode_item<true>(t, s, seff, rows, poss, tables, R, MBR, window, err, item, nsMax, ATT_BI && i >= cap)) continue;
    const int r = item.r, ns = item.ns, k0 = item.k0, k1 = item.k1, kv0 = item.kv0;
    const int ntiles = k1 > k0 ? (k1 - k0 + BK - 1) / BK : 0;
    const int* tab = item.tab;

    // The block-table entry of key k0 + it BK + tid (tid < BK) of tile it, loaded a tile ahead of
    // its use (blkNext): a tile's issue then waits on no global load, where reading the table
    // there cost a round trip per tile (at one row, the kernel is a chain of such round trips).
    // The first NST tiles' entries load together (blkFirst): loaded each in the issue of the tile
    // before, the ring's first fill waited on NST - 1 round trips in a row before the first score.
#define ATT_TC_TABLE(it) (tid < BK ? att_tc_table_entry(tab, k0 + (it) * BK + tid, k1, BS, bsShift, MBR) : -1)
    int blkFirst[NST];
#pragma unroll
    for (int k = 0; k < NST; k++) blkFirst[k] = ATT_TC_TABLE(k);
    int blkNext = blkFirst[0];

#if ATT_TC_EARLY
    if (!waited) { // q and the KV pool (this token's key and value) are the kernels before's outputs
      ATT_TC_WAIT();
      waited = true;
      ATT_TC_PHASE(0);
    }
#endif
    // Q: the group's heads as rows 0 .. G-1 of a 16-row tile, staged through the last stage's K
    // buffer (the first tiles go to the others meanwhile: Q and they travel together)
    u16* const s_q = s_kv + (NST - 1) * 2 * TILE;
#pragma unroll 1
    for (int c = tid; c < 16 * NCH; c += NTH) {
      const int qi = c / NCH, ch = c - qi * NCH;
      const bool ok = qi < G;
      att_cp16(s_q + qi * LDS + ch * 8, ok ? (const void*)(q + ((i64)t * H + h0 + qi) * D + ch * 8) : (const void*)q, ok);
    }
    att_cp_commit();

    float o[DWT][4];
#pragma unroll
    for (int k = 0; k < DWT; k++) o[k][0] = o[k][1] = o[k][2] = o[k][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f; // rows g and g + 8

    // slots of tile it into stage it % NST (its table entries in blkNext; then the next tile's,
    // the argument next, go into it), then its K and V copies (one commit group)
#define ATT_TC_ISSUE(it, next) do { \
      const int st_ = (it) % NST, j_ = k0 + (it) * BK + tid; \
      if (tid < BK) { \
        int slot_ = -1; \
        if ((!ATT_BI || j_ >= kv0) && j_ < k1) { \
          const int lb_ = att_block_of(j_, BS, bsShift); \
          const int blk_ = blkNext; \
          if (blk_ >= 0 && blk_ < NB) slot_ = blk_ * BS + (j_ - lb_ * BS); \
          else report(err, 4, r, j_, blk_); \
        } \
        s_slot[st_][tid] = slot_; \
        blkNext = (next); \
      } \
      __syncthreads(); \
      u16* kd_ = s_kv + st_ * 2 * TILE; \
      _Pragma("unroll 1") \
      for (int c_ = tid; c_ < BK * NCH; c_ += NTH) { \
        const int kr_ = c_ / NCH, ch_ = c_ - kr_ * NCH, sl_ = s_slot[st_][kr_]; \
        const i64 off_ = (i64)(sl_ >= 0 ? sl_ : 0) * rs + ch_ * 8; \
        att_cp16(kd_ + kr_ * LDS + ch_ * 8, kbase + off_, sl_ >= 0); \
        att_cp16(kd_ + TILE + kr_ * LDS + ch_ * 8, vbase + off_, sl_ >= 0); \
      } \
      att_cp_commit(); \
    } while (0)

    // tiles 0 .. NST-2, a commit group each (an empty group for a tile past the last, so that the
    // waits below count the same groups whatever ntiles is)
#pragma unroll
    for (int k = 0; k < NST - 1; k++) {
      if (k < ntiles) ATT_TC_ISSUE(k, blkFirst[k + 1]);
      else att_cp_commit();
    }
    att_cp_wait<NST - 1>(); // Q has landed (the tiles may still be in flight)
    __syncthreads();
    ATT_TC_PHASE(1);
    unsigned qa[KST][4];
#pragma unroll
    for (int k = 0; k < KST; k++) att_ldsm4(qa[k], s_q + (lane & 15) * LDS + k * 16 + (lane >> 4) * 8);
    // (tile NST-1's copies into the last stage start after the barrier in its ATT_TC_ISSUE: these
    // reads are done)

    for (int it = 0; it < ntiles; it++) {
      const int st = it % NST;
      // into the stage tile it - 1 used (free since the barrier that ended its iteration)
      if (it + NST - 1 < ntiles) ATT_TC_ISSUE(it + NST - 1, ATT_TC_TABLE(it + NST));
      else att_cp_commit();
      att_cp_wait<NST - 1>(); // tile it has landed (the NST - 1 after it may still be in flight)
      __syncthreads();
      const u16* sK = s_kv + st * 2 * TILE;
      const u16* sV = sK + TILE;

      // scores of this warp's 8 keys, all 16 rows
      float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int kp = 0; kp < KST / 2; kp++) {
        unsigned b[4];
        att_ldsm4(b, sK + (warp * 8 + (lane & 7)) * LDS + kp * 32 + (lane >> 3) * 8);
        att_mma(sc, qa[2 * kp], b[0], b[1]);
        att_mma(sc, qa[2 * kp + 1], b[2], b[3]);
      }
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int col = warp * 8 + 2 * c4 + (e & 1);
        const float x = s_slot[st][col] >= 0 ? att_score(sc[e] * qmul, softcap) : NEG_INF;
        s_sc[e < 2 ? g : g + 8][col] = x;
      }
      __syncthreads();

      // the online softmax over the tile, identical in every warp: this thread's 8 keys of rows
      // g and g + 8 are the columns its P fragments hold (2 c4, 2 c4 + 1, 2 c4 + 8, 2 c4 + 9,
      // and the same + 16)
      float x0[8], x1[8];
#pragma unroll
      for (int kk = 0; kk < 2; kk++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int col = kk * 16 + 2 * c4 + (e & 1) + (e >> 1) * 8;
          x0[kk * 4 + e] = s_sc[g][col];
          x1[kk * 4 + e] = s_sc[g + 8][col];
        }
      }
      float mx0 = m0, mx1 = m1;
#pragma unroll
      for (int e = 0; e < 8; e++) {
        mx0 = fmaxf(mx0, x0[e]);
        mx1 = fmaxf(mx1, x1[e]);
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(ATT_FULL, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(ATT_FULL, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(ATT_FULL, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(ATT_FULL, mx1, 2));
      const float mu0 = mx0 == NEG_INF ? 0.0f : mx0, mu1 = mx1 == NEG_INF ? 0.0f : mx1;
      const float cr0 = exp2f(m0 - mu0), cr1 = exp2f(m1 - mu1);
      m0 = mx0;
      m1 = mx1;
      float ls0 = 0.0f, ls1 = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; e++) {
        x0[e] = exp2f(x0[e] - mu0);
        x1[e] = exp2f(x1[e] - mu1);
        ls0 += x0[e];
        ls1 += x1[e];
      }
      ls0 += __shfl_xor_sync(ATT_FULL, ls0, 1);
      ls0 += __shfl_xor_sync(ATT_FULL, ls0, 2);
      ls1 += __shfl_xor_sync(ATT_FULL, ls1, 1);
      ls1 += __shfl_xor_sync(ATT_FULL, ls1, 2);
      l0 = ATT_FMA(l0, cr0, ls0);
      l1 = ATT_FMA(l1, cr1, ls1);
#pragma unroll
      for (int k = 0; k < DWT; k++) {
        o[k][0] *= cr0;
        o[k][1] *= cr0;
        o[k][2] *= cr1;
        o[k][3] *= cr1;
      }

      // O[:, warp's dims] += P V
#pragma unroll
      for (int kk = 0; kk < 2; kk++) {
        unsigned pa[4];
        pa[0] = att_pack2(x0[kk * 4 + 0], x0[kk * 4 + 1]);
        pa[1] = att_pack2(x1[kk * 4 + 0], x1[kk * 4 + 1]);
        pa[2] = att_pack2(x0[kk * 4 + 2], x0[kk * 4 + 3]);
        pa[3] = att_pack2(x1[kk * 4 + 2], x1[kk * 4 + 3]);
#pragma unroll
        for (int dp = 0; dp < DWT / 2; dp++) {
          unsigned b[4];
          att_ldsm4t(b, sV + (kk * 16 + (lane & 15)) * LDS + warp * DW + dp * 16 + (lane >> 4) * 8);
          att_mma(o[2 * dp], pa, b[0], b[1]);
          att_mma(o[2 * dp + 1], pa, b[2], b[3]);
        }
      }
      __syncthreads(); // the stage and the scores are free for the next tile
    }
#undef ATT_TC_ISSUE
#undef ATT_TC_TABLE
    ATT_TC_PHASE(2);

    // rows g (and g + 8) of the group: this warp's dims; one split: the output, else a partial
#pragma unroll
    for (int half = 0; half < 2; half++) {
      const int row = g + half * 8;
      if (row >= G) continue;
      const int h = h0 + row;
      const float L = half ? l1 : l0, M = half ? m1 : m0;
      if (ns == 1) {
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        u16* dst = out + ((i64)t * H + h) * D + warp * DW + 2 * c4;
#pragma unroll
        for (int k = 0; k < DWT; k++) *(unsigned*)(dst + k * 8) = ATT_OUT_PACK2(o[k][2 * half] * inv, o[k][2 * half + 1] * inv);
      } else {
        const i64 ph = ((i64)i * stride + s) * H + h;
        float* dst = part + ph * D + warp * DW + 2 * c4;
#pragma unroll
        for (int k = 0; k < DWT; k++) {
          dst[k * 8] = o[k][2 * half];
          dst[k * 8 + 1] = o[k][2 * half + 1];
        }
        if (warp == 0 && c4 == 0) {
          partml[ph * 2] = M;
          partml[ph * 2 + 1] = L;
        }
      }
    }
    if (ns > 1 && counters) {
      // the last split of (token, kv head) to arrive merges them all
#if ATT_TC_SYNC
      __syncthreads(); // (tid 0's release below covers every thread's partial: cumulative through the barrier)
#else
      __threadfence();
      __syncthreads();
#endif
      if (tid == 0) {
        const int idx = i * KVH + kh;
        const int prev = ATT_TC_SYNC ? att_atom_add_acq_rel(counters + idx, 1) : atomicAdd(counters + idx, 1);
        s_last = prev == ns - 1;
        if (s_last) counters[idx] = 0;
      }
      __syncthreads();
      if (ATT_TC_TRIGGER == 1 || (ATT_TC_TRIGGER == 3 && !s_last)) pdl_launch_dependents();
      ATT_TC_PHASE(3);
      if (s_last) {
#if !ATT_TC_SYNC
        __threadfence();
#endif
        ATT_TC_PHASE(4);
        att_tc_merge<D, NST>(part, partml, out, (float*)s_kv, &s_sc[0][0], ns, G, H, (i64)i * stride * H + h0,
                             (i64)t * H + h0 ATT_TC_PH_ARG);
      }
    }
    __syncthreads(); // the Q staging of the next token reuses the tiles
  }
#if ATT_TC_PHASES
  if (threadIdx.x == 0) {
    s_ph[ATT_TC_NPHASES - 1] = clock64() - ph_start;
    for (int k = 0; k < ATT_TC_NPHASES; k++) {
      if (s_ph[k] == 0) continue; // a phase this block had none of (one split: no partial; no merge)
      atomicAdd(&att_tc_phases[k][0], (unsigned long long)s_ph[k]);
      atomicAdd(&att_tc_phases[k][1], 1ull);
    }
  }
#endif
#undef ATT_TC_PHASE
}

// ATT_TC_TIMING_SKIP=1: write zeros after the wait and return (wrong outputs): only for timing what
// the kernel costs in a decode step
#ifndef ATT_TC_TIMING_SKIP
#define ATT_TC_TIMING_SKIP 0
#endif
#define ATT_DECODE_TC_KERNEL(D) \
extern "C" __global__ void __launch_bounds__(128, ATT_TC_MINB) k_attn_decode_tc_d##D(const u16* q, const u16* kpool, \
    const u16* vpool, const int* rows, const int* poss, const int* tables, int* plan, int planReady, u16* out, \
    float* part, float* partml, int T, int H, int KVH, int NB, int BS, int R, int MBR, int window, float scale, \
    float softcap, int W, int* err, int* counters) { \
  if (ATT_TC_TIMING_SKIP) { /* zeros, so that the step's logits stay finite */ \
    PDL_ENTRY(); \
    const int kh_ = ATT_TC_HEADS_FIRST ? blockIdx.x : blockIdx.y; \
    if ((ATT_TC_HEADS_FIRST ? blockIdx.y : blockIdx.x) == 0) \
      for (i64 e = threadIdx.x; e < (i64)T * (H / KVH) * D; e += blockDim.x) { \
        const i64 tok = e / ((H / KVH) * D), rest = e - tok * (H / KVH) * D; \
        out[(tok * H + (i64)kh_ * (H / KVH)) * D + rest] = 0; \
      } \
    return; \
  } \
  att_decode_tc<D>(q, kpool, vpool, rows, poss, tables, plan, planReady, out, part, partml, T, H, KVH, NB, BS, R, \
    MBR, window, scale, softcap, W, err, counters); \
}
ATT_DECODE_TC_KERNEL(64)
ATT_DECODE_TC_KERNEL(128)
`;

/** ATT_TC_PHASES' phases, in the order of the kernel's att_tc_phases rows */
export const ATT_TC_PHASE_NAMES = ['wait', 'start', 'tiles', 'partial', 'fence', 'mload', 'mfold', 'block'] as const;

/**
 * Dynamic shared memory of a k_attn_decode_tc_d<D> launch: its ring, `stages` (the kernel's, tcStages)
 * x (K and V tiles of 32 keys, rows of D + 8) bf16.
 */
export function attTcSharedBytes(D: number, stages: number): number {
  return stages * 2 * 32 * (D + 8) * 2;
}
