// Paged causal attention, varlen (any mix of prefill and decode tokens in one step).
//
// Token t of row r = tokenRow[t] at position p = tokenPos[t] attends to keys j in
// [max(0, p - window + 1), p] (window 0 = no limit), key j living in physical block
// blockTables[r][j / blockSize] at offset j % blockSize. Query head h reads KV head
// h / (H / kvHeads). Scores = scale * q.k, optionally cap * tanh(s / cap), then an online
// (chunked) softmax in f32. Work items are (block, kv head): the G query heads sharing a KV head
// are done together, so a chunk of key/value rows is fetched from memory once for all of them (and
// re-read from L1/L2 per head). A block is a lone token (decode: attend, the chunk's keys in vector
// lanes) or up to attn_qb consecutive tokens of one row (a prefill chunk: attend_block puts the
// block's query rows in vector lanes, so scores, softmax and weighted values run on whole vectors
// of rows; see attention_impl.h). Both transpose each chunk of keys once, both start chunks at
// multiples of CHUNK, and both compute a query's output with the same operations in the same order:
// a token's result does not depend on the other tokens of its step. No gather copy of the pool:
// keys are read in place through the block table.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "fastmath.h"
#include "kv_format.h"
#include "llm.h"
#include "simd.h"

#define CHUNK 16 // keys per softmax rescale
// Chunks whose scores a decode token computes together (attend): each score is its own multiply-add
// chain over d, and one chunk's 16 of them are too few chains to keep the multiply-add units busy.
#define ATTN_SC 4
// Query tokens of one row attended together (attend_block): as many as keep its transposed Q
// (D x tokens x G floats) within ATTN_QT_BYTES, so that it stays in L1 beside a chunk of keys, from
// ATTN_QB_MIN to ATTN_QB_MAX. 32 tokens against 16: +5-16% at the demo model's shape (G 3, D 64:
// 24 KiB); 8-10% slower at 8B's (G 4, D 128: 64 KiB), which the bound keeps at 16.
#define ATTN_QT_BYTES (32 * 1024)
#define ATTN_QB_MIN 16
#define ATTN_QB_MAX 32
static int64_t attn_qb(int64_t D, int64_t G) {
  const int64_t qb = ATTN_QT_BYTES / (4 * D * G);
  return qb < ATTN_QB_MIN ? ATTN_QB_MIN : qb > ATTN_QB_MAX ? ATTN_QB_MAX : qb;
}

typedef struct {
  const float *q;              // [T, H, D]
  const void *kpool, *vpool;   // [NB, BS, KVH, D] rows of kv_dt (kv_format.h)
  int kv_dt;                   // DT_F32, DT_BF16, DT_KV_INT8 or DT_KV_FP8: all but f32 widened chunk by chunk (value_rows, transpose_keys)
  const int32_t *row, *pos;    // [T]
  const int32_t *tables;       // [R, MBR]
  float *out;                  // [T, H, D]
  int64_t T, H, KVH, D, NB, BS, R, MBR, window;
  float scale, softcap;
} attn_args;

// The first key token position p attends to (its sliding window's start; 0 without one).
static inline int64_t attn_start(const attn_args *a, int64_t p) {
  return a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512")
#define ATTN_ISA avx512
#define VEC_AVX512 1
#define VEC_AVX2 0
#define VW 16
#include "attention_impl.h"
#undef ATTN_ISA
#undef VEC_AVX512
#undef VEC_AVX2
#undef VW
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define ATTN_ISA avx2
#define VEC_AVX512 0
#define VEC_AVX2 1
#define VW 8
#include "attention_impl.h"
#undef ATTN_ISA
#undef VEC_AVX512
#undef VEC_AVX2
#undef VW
#pragma GCC pop_options

#define ATTN_ISA generic
#define VEC_AVX512 0
#define VEC_AVX2 0
#define VW 4
#include "attention_impl.h"
#undef ATTN_ISA
#undef VEC_AVX512
#undef VEC_AVX2
#undef VW

// Every block a token will read must be mapped to a real block.
static int validate(const attn_args *a) {
  for (int64_t t = 0; t < a->T; t++) {
    const int64_t r = a->row[t], p = a->pos[t];
    if (r < 0 || r >= a->R)
      return llm_fail("attention: tokenRow %lld of token %lld is out of range [0, %lld)", (long long)r,
                      (long long)t, (long long)a->R);
    if (p < -1) return llm_fail("attention: tokenPos %lld of token %lld is below -1", (long long)p, (long long)t);
    if (p == -1) continue; // padding: reads no key, gets zeros (Backend.attention)
    const int64_t start = attn_start(a, p);
    if (p / a->BS >= a->MBR)
      return llm_fail("attention: token %lld at position %lld needs logical block %lld but block tables have %lld "
                      "columns",
                      (long long)t, (long long)p, (long long)(p / a->BS), (long long)a->MBR);
    for (int64_t b = start / a->BS; b <= p / a->BS; b++) {
      const int32_t phys = a->tables[r * a->MBR + b];
      if (phys < 0 || phys >= a->NB)
        return llm_fail("attention: token %lld (row %lld, position %lld) reads logical block %lld, mapped to "
                        "physical block %d outside [0, %lld)",
                        (long long)t, (long long)r, (long long)p, (long long)b, phys, (long long)a->NB);
    }
  }
  return 0;
}

// One work item of a step's attention: a block of tokens (decode: one) by one kv head; `thread`
// picks the thread's scratch (perThread floats each: the kernels' scratch, then value rows).
typedef struct {
  const attn_args *a;
  const int64_t *block;
  int isa;
  int64_t scratchFloats, perThread;
  float *scratch;
} attn_items;

static void attn_item(void *arg, int64_t it, int thread) {
  const attn_items *x = arg;
  const attn_args *a = x->a;
  float *scratch = x->scratch + (size_t)thread * (size_t)x->perThread, *vbuf = scratch + x->scratchFloats;
  const int64_t b = it / a->KVH, kh = it % a->KVH, t0 = x->block[b], nq = x->block[b + 1] - t0;
  if (nq == 1) {
    if (x->isa >= ISA_AVX512) attend_avx512(a, t0, kh, scratch, vbuf);
    else if (x->isa == ISA_AVX2) attend_avx2(a, t0, kh, scratch, vbuf);
    else attend_generic(a, t0, kh, scratch, vbuf);
  } else {
    if (x->isa >= ISA_AVX512) attend_block_avx512(a, t0, nq, kh, scratch, vbuf);
    else if (x->isa == ISA_AVX2) attend_block_avx2(a, t0, nq, kh, scratch, vbuf);
    else attend_block_generic(a, t0, nq, kh, scratch, vbuf);
  }
}

// i: [q, kpool, vpool, row, pos, tables, out, T, H, KVH, D, NB, BS, R, MBR, window, kv_dt]; f: [scale, softcap]
static int exec_attention(const llm_cmd *c) {
  const attn_args a = {
      .q = PTR(c->i[0]), .kpool = PTR(c->i[1]), .vpool = PTR(c->i[2]), .row = PTR(c->i[3]),
      .pos = PTR(c->i[4]), .tables = PTR(c->i[5]), .out = PTR(c->i[6]), .T = c->i[7], .H = c->i[8],
      .KVH = c->i[9], .D = c->i[10], .NB = c->i[11], .BS = c->i[12], .R = c->i[13], .MBR = c->i[14],
      .window = c->i[15], .kv_dt = (int)c->i[16], .scale = (float)c->f[0], .softcap = (float)c->f[1],
  };
  if (!dt_kv(a.kv_dt))
    return llm_fail("attention: pool dtype %d is not a KV dtype", a.kv_dt);
  if (validate(&a)) return -1;
  // work items: (block, kv head), a block being up to qb consecutive tokens of one row (a
  // prefill chunk's tokens share each gathered chunk of keys) or a lone token (decode)
  const int64_t G = a.H / a.KVH, qb = attn_qb(a.D, G);
  int64_t *block = malloc((size_t)(a.T + 1) * sizeof(int64_t)), nblocks = 0;
  if (!block) return llm_fail("attention: out of memory for %lld tokens", (long long)a.T);
  size_t kvBytes = 0; // the keys and values the blocks read (each block's longest span, once a kv head)
  for (int64_t t = 0; t < a.T;) {
    const int64_t t0 = t++;
    while (t < a.T && t - t0 < qb && a.row[t] == a.row[t0]) t++;
    block[nblocks++] = t0;
    int64_t span = 0;
    for (int64_t u = t0; u < t; u++) {
      const int64_t p = a.pos[u], n = p < 0 ? 0 : p + 1 - attn_start(&a, p);
      span = n > span ? n : span;
    }
    kvBytes += (size_t)span * (size_t)a.KVH * 2 * kv_row_bytes(a.kv_dt, a.D);
  }
  block[nblocks] = a.T;
  const int64_t items = nblocks * a.KVH;
  const int isa = llm_isa();
  // attend: ATTN_SC chunks' keys transposed (D x SK) and the G heads' scores (G x SK), 2G of
  // running max/sum; attend_block: Q transposed (D x RP), keys transposed (D x CHUNK), scores
  // (CHUNK x RP), 5 RP of max, sum, factor and key bounds (RP: qb G rows rounded up to the widest
  // vector). Then a chunk's value rows widened to f32 when the pools hold another dtype (value_rows).
  const int64_t RP = (qb * G + 15) / 16 * 16, SK = ATTN_SC * CHUNK;
  const int64_t attendFloats = a.D * SK + G * SK + 2 * G;
  const int64_t blockFloats = a.D * RP + a.D * CHUNK + CHUNK * RP + 5 * RP;
  const int64_t scratchFloats = attendFloats > blockFloats ? attendFloats : blockFloats;
  const int64_t vbufFloats = a.kv_dt == DT_F32 ? 0 : CHUNK * a.D;
  const attn_items ai = {&a, block, isa, scratchFloats, scratchFloats + vbufFloats, NULL};
  // a step that reads little (a few decode rows at short contexts) runs on this thread: waking the
  // team costs more than it saves, as for the small matmuls (llm_gemv_parallel_min_bytes)
  const int parallel = kvBytes >= llm_gemv_parallel_min_bytes();
  if (parallel && nblocks == a.T) {
    // decode (a token a block): on the decode team (pool.c), each thread its scratch
    attn_items d = ai;
    d.scratch = malloc((size_t)llm_pool_threads() * (size_t)ai.perThread * sizeof(float));
    if (!d.scratch) {
      free(block);
      return llm_fail("attention: out of memory for scratch");
    }
    llm_pool_for(items, attn_item, &d);
    free(d.scratch);
  } else {
#pragma omp parallel if (parallel)
    {
      attn_items mine = ai;
      mine.scratch = malloc((size_t)ai.perThread * sizeof(float));
#pragma omp for schedule(dynamic, 1) nowait
      for (int64_t it = 0; it < items; it++) attn_item(&mine, it, 0);
      free(mine.scratch);
    }
  }
  free(block);
  return 0;
}

LLM_EXPORT void llm_op_attention(int64_t q, int64_t kpool, int64_t vpool, int64_t row, int64_t pos, int64_t tables,
                                 int64_t out, int64_t T, int64_t H, int64_t KVH, int64_t D, int64_t NB, int64_t BS,
                                 int64_t R, int64_t MBR, int64_t window, int64_t kv_dt, double scale, double softcap) {
  llm_cmd c = {.exec = exec_attention,
               .i = {q, kpool, vpool, row, pos, tables, out, T, H, KVH, D, NB, BS, R, MBR, window, kv_dt},
               .f = {scale, softcap}};
  llm_enqueue(&c);
}
