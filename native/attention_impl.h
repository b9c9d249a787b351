// One instantiation of the attention inner kernel (see attention.c), included once per ISA under
// a `#pragma GCC target` with ATTN_ISA (name suffix), VW, VEC_AVX512 / VEC_AVX2 defined.

#define ATTN_CAT2(a, b) a##_##b
#define ATTN_CAT(a, b) ATTN_CAT2(a, b)
#define FN(name) ATTN_CAT(name, ATTN_ISA)

#include "vec_isa.h"

// What keeps a decode token's result equal to the same token's in a prefill block (attend and
// attend_block below compute every query's output with the same operations in the same order):
// ATTN_KEEP(x) makes x a rounded value the compiler cannot fuse into the next sum (it may turn
// a * b + c into one fused multiply-add, and would do so in one kernel and not the other), and
// ATTN_FP_BARRIER() does the same for values kept in memory.
#define ATTN_KEEP(x) __asm__("" : "+x"(x))
#define ATTN_FP_BARRIER() __asm__ volatile("" ::: "memory")

// Pool rows (bytes) of keys and values [j0, j0 + n) of kv head kh through a row's block table,
// prefetched: consecutive keys of one kv head sit a page apart in the pool ([.., slot, kvHeads, D]),
// so hardware prefetchers do not follow them; ask for the whole chunk up front instead of taking
// one miss per row. Keys before `first` (the earliest any query of the call attends to: a sliding
// window's blocks before it may be unmapped) and lanes n.. of a short chunk repeat key `first`
// (read, then masked).
SIMD_INLINE void FN(chunk_src)(const attn_args *a, const int32_t *table, int64_t kh, int64_t j0, int64_t n,
                               int64_t first, const char **ksrc, const char **vsrc) {
  const int64_t rb = (int64_t)kv_row_bytes(a->kv_dt, a->D);
  for (int64_t jj = 0; jj < n; jj++) {
    const int64_t j = j0 + jj < first ? first : j0 + jj;
    const int64_t off = ((int64_t)table[j / a->BS] * a->BS + j % a->BS) * a->KVH + kh;
    ksrc[jj] = (const char *)a->kpool + off * rb;
    vsrc[jj] = (const char *)a->vpool + off * rb;
    for (int64_t b = 0; b < rb; b += 64) {
      __builtin_prefetch(ksrc[jj] + b);
      __builtin_prefetch(vsrc[jj] + b, 0, 1); // to L2: the values are read after the chunks' scores, and a group's rows would overflow L1
    }
  }
  const int64_t f = first > j0 ? (first - j0 < n ? first - j0 : 0) : 0; // lane of key `first` (or 0)
  for (int64_t jj = n; jj < CHUNK; jj++) {
    ksrc[jj] = ksrc[f];
    vsrc[jj] = vsrc[f];
  }
}

// Asks for the key and value rows of keys [j0, j1) of kv head kh into L2 (the next group of
// chunks while this one is scored: the rows lie a token's KV apart, too far for the hardware
// prefetchers to follow).
SIMD_INLINE void FN(prefetch_rows)(const attn_args *a, const int32_t *table, int64_t kh, int64_t j0, int64_t j1) {
  const int64_t rb = (int64_t)kv_row_bytes(a->kv_dt, a->D);
  for (int64_t j = j0; j < j1; j++) {
    const int64_t off = ((int64_t)table[j / a->BS] * a->BS + j % a->BS) * a->KVH + kh;
    for (int64_t b = 0; b < rb; b += 64) {
      __builtin_prefetch((const char *)a->kpool + off * rb + b, 0, 1);
      __builtin_prefetch((const char *)a->vpool + off * rb + b, 0, 1);
    }
  }
}

// VW one-byte values of a DT_KV_INT8 / DT_KV_FP8 row from element d, widened (fp8: to its value
// / 2^8, e4m3_as_f16_bits) and multiplied by the row's factor s (kv8_scale): kv_elem's values.
SIMD_INLINE VF FN(load_kv8)(const uint8_t *q, int dt, float s) {
#if VEC_AVX512
  const __m128i b = _mm_loadu_si128((const __m128i *)q);
  if (dt == DT_KV_INT8) return (VF)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)) * FN(vsplat)(s);
  const __m256i w = _mm256_cvtepu8_epi16(b);
  const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                                    _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7));
  return (VF)_mm512_cvtph_ps(h) * FN(vsplat)(s);
#elif VEC_AVX2
  const __m128i b = _mm_loadl_epi64((const __m128i *)q);
  if (dt == DT_KV_INT8) return (VF)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)) * FN(vsplat)(s);
  const __m128i w = _mm_cvtepu8_epi16(b);
  const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8),
                                 _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7));
  return (VF)_mm256_cvtph_ps(h) * FN(vsplat)(s);
#else
  VF v;
  for (int i = 0; i < VW; i++) v[i] = dt == DT_KV_INT8 ? (float)(int8_t)q[i] : f16_to_f32(e4m3_as_f16_bits(q[i]));
  return v * FN(vsplat)(s);
#endif
}

// VW elements of a pool row of dtype dt from element d, as f32 (kv_format.h).
SIMD_INLINE VF FN(load_kv)(const char *row, int dt, int64_t D, int64_t d) {
  if (dt == DT_F32) return FN(vload)((const float *)row + d);
  if (dt == DT_BF16) return FN(load_w)(row, DT_BF16, d);
  return FN(load_kv8)((const uint8_t *)row + d, dt, kv8_scale(row, dt, D));
}

// The chunk's value rows as f32: in place (f32 pools), or widened into vbuf (CHUNK D floats,
// L1-resident) from a bf16, int8 or fp8 pool, so the kernels read f32 either way while memory
// traffic shrinks.
SIMD_INLINE void FN(value_rows)(const attn_args *a, const char *const *vsrc, int64_t n, const float **vrow, float *vbuf) {
  const int64_t D = a->D;
  const int dt = a->kv_dt;
  if (dt == DT_F32) {
    for (int64_t jj = 0; jj < n; jj++) vrow[jj] = (const float *)vsrc[jj];
    return;
  }
  for (int64_t jj = 0; jj < n; jj++) {
    float *vd = vbuf + jj * D;
    int64_t d = 0;
    for (; d + VW <= D; d += VW) FN(vstore)(vd + d, FN(load_kv)(vsrc[jj], dt, D, d));
    for (; d < D; d++) vd[d] = kv_elem(vsrc[jj], dt, D, d);
    vrow[jj] = vd;
  }
}

// kt[d ldk + jj] = key jj's element d as f32, for d < D, jj < CHUNK: the chunk's keys transposed
// (and widened from bf16, int8 or fp8), VW x VW tiles in registers (transpose, vec_isa.h), the
// last D % VW elements one by one.
SIMD_INLINE void FN(transpose_keys)(const attn_args *a, const char *const *ksrc, float *kt, int64_t ldk) {
  const int64_t D = a->D;
  const int dt = a->kv_dt;
  int64_t d0 = 0;
  for (; d0 + VW <= D; d0 += VW) {
    for (int j0 = 0; j0 < CHUNK; j0 += VW) {
      VF v[VW];
#pragma GCC unroll 16
      for (int i = 0; i < VW; i++) v[i] = FN(load_kv)(ksrc[j0 + i], dt, D, d0);
      FN(transpose)(v);
#pragma GCC unroll 16
      for (int i = 0; i < VW; i++) FN(vstore)(kt + (d0 + i) * ldk + j0, v[i]); // v[i]: element d0 + i
    }
  }
  for (; d0 < D; d0++)
    for (int jj = 0; jj < CHUNK; jj++) kt[d0 * ldk + jj] = kv_elem(ksrc[jj], dt, D, d0);
}

// Prefill rows per PV register block and keys per scores register block: AVX-512's 32 registers
// hold 4 rows x 4 vectors of outputs (PV) or 16 keys' score vectors (scores); AVX2's 16 hold half.
#if VW == 16
#define ATTN_PR 4
#define ATTN_KB 16
#else
#define ATTN_PR 2
#define ATTN_KB 8
#endif

// o_r[0..D) = o_r * al_r + sum_jj p[jj * RP + r] v[jj][0..D) for the PR rows r0.. (outputs o[k]):
// each value vector loaded once for PR rows, PR x 4 accumulators. PR is a constant (ATTN_PR, or 1
// for a lone row): one body for both, so a row's sums never depend on how many share the call.
SIMD_INLINE void FN(pv_rows)(const int PR, float *const *o, const float *al, const float *p, int64_t RP,
                             const float *const *v, int64_t n, int64_t D) {
  int64_t d0 = 0;
  for (; d0 + 4 * VW <= D; d0 += 4 * VW) {
    VF c[ATTN_PR][4];
#pragma GCC unroll 4
    for (int k = 0; k < PR; k++) {
      const VF s = FN(vsplat)(al[k]);
      for (int u = 0; u < 4; u++) {
        c[k][u] = FN(vload)(o[k] + d0 + u * VW) * s;
        ATTN_KEEP(c[k][u]);
      }
    }
    for (int64_t jj = 0; jj < n; jj++) {
      const float *vr = v[jj] + d0;
      const VF v0 = FN(vload)(vr), v1 = FN(vload)(vr + VW), v2 = FN(vload)(vr + 2 * VW), v3 = FN(vload)(vr + 3 * VW);
#pragma GCC unroll 4
      for (int k = 0; k < PR; k++) {
        const VF w = FN(vsplat)(p[jj * RP + k]);
        c[k][0] += w * v0;
        c[k][1] += w * v1;
        c[k][2] += w * v2;
        c[k][3] += w * v3;
      }
    }
#pragma GCC unroll 4
    for (int k = 0; k < PR; k++)
      for (int u = 0; u < 4; u++) FN(vstore)(o[k] + d0 + u * VW, c[k][u]);
  }
  for (; d0 + VW <= D; d0 += VW) {
    VF c[ATTN_PR];
    for (int k = 0; k < PR; k++) {
      c[k] = FN(vload)(o[k] + d0) * FN(vsplat)(al[k]);
      ATTN_KEEP(c[k]);
    }
    for (int64_t jj = 0; jj < n; jj++) {
      const VF vv = FN(vload)(v[jj] + d0);
      for (int k = 0; k < PR; k++) c[k] += FN(vsplat)(p[jj * RP + k]) * vv;
    }
    for (int k = 0; k < PR; k++) FN(vstore)(o[k] + d0, c[k]);
  }
  for (int k = 0; k < PR; k++)
    for (int64_t d = d0; d < D; d++) {
      float c = o[k][d] * al[k];
      ATTN_KEEP(c);
      for (int64_t jj = 0; jj < n; jj++) c += p[jj * RP + k] * v[jj][d];
      o[k][d] = c;
    }
}

// Scores, softmax and weighted values for token t, kv head kh (a decode token, or a row's only
// token of the step). Every query's arithmetic is attend_block's for one of its rows (a score's
// multiply-adds over d in order, the same softmax steps, sums over keys in order, pv_rows), with
// the keys in vector lanes instead of the rows: a token's output never depends on whether it ran
// alone or in a block, or in which. Scores come ATTN_SC chunks at a time, the softmax and values
// chunk by chunk. scratch: see exec_attention; vbuf: value_rows' widened rows.
static void FN(attend)(const attn_args *a, int64_t t, int64_t kh, float *scratch, float *vbuf) {
  enum { SK = ATTN_SC * CHUNK, NV = SK / VW, HP = VW == 16 ? 2 : 1 }; // keys, their vectors, heads a pass
  const int64_t D = a->D, G = a->H / a->KVH, p = a->pos[t];
  const int64_t start = attn_start(a, p);
  const int32_t *table = a->tables + (int64_t)a->row[t] * a->MBR;
  const float *q = a->q + (t * a->H + kh * G) * D; // G heads, contiguous
  float *o = a->out + (t * a->H + kh * G) * D;     // accumulated in place
  float *kt = scratch, *sc = kt + D * SK, *m = sc + G * SK, *l = m + G;
  const char *ksrc[SK], *vsrc[SK];
  const float *vrow[CHUNK];
  const float scale = a->scale, cap = a->softcap;
  for (int64_t g = 0; g < G; g++) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
    memset(o + g * D, 0, (size_t)D * sizeof(float));
  }
  _Static_assert(CHUNK % VW == 0, "attention: CHUNK must be a multiple of the vector width");
  // chunks start at multiples of CHUNK whatever the window's start, as attend_block's do
  for (int64_t s0 = start / CHUNK * CHUNK; s0 <= p; s0 += SK) {
    const int64_t nc = (p - s0) / CHUNK + 1 < ATTN_SC ? (p - s0) / CHUNK + 1 : ATTN_SC;
    if (s0 + SK <= p) FN(prefetch_rows)(a, table, kh, s0 + SK, s0 + 2 * SK <= p + 1 ? s0 + 2 * SK : p + 1);
    for (int64_t c = 0; c < ATTN_SC; c++) { // chunks past p repeat chunk 0 (scored, never used)
      const int64_t j0 = s0 + c * CHUNK, n = p + 1 - j0 < CHUNK ? p + 1 - j0 : CHUNK;
      if (c < nc) FN(chunk_src)(a, table, kh, j0, n, start, ksrc + c * CHUNK, vsrc + c * CHUNK);
      else FN(chunk_src)(a, table, kh, start, 1, start, ksrc + c * CHUNK, vsrc + c * CHUNK);
      FN(transpose_keys)(a, ksrc + c * CHUNK, kt + c * CHUNK, SK);
    }
    // scores sc[g SK + jj], HP heads a pass: NV HP independent chains
    for (int64_t g0 = 0; g0 < G; g0 += HP) {
      const int hp = G - g0 < HP ? (int)(G - g0) : HP;
      VF acc[HP][NV];
      for (int h = 0; h < HP; h++)
        for (int v = 0; v < NV; v++) acc[h][v] = (VF){0};
      for (int64_t d = 0; d < D; d++) {
        VF qv[HP];
        for (int h = 0; h < HP; h++) qv[h] = FN(vsplat)(q[(g0 + (h < hp ? h : 0)) * D + d]);
#pragma GCC unroll 16
        for (int v = 0; v < NV; v++) {
          const VF kv = FN(vload)(kt + d * SK + v * VW);
          for (int h = 0; h < HP; h++) acc[h][v] += kv * qv[h];
        }
      }
      for (int h = 0; h < hp; h++)
        for (int v = 0; v < NV; v++) FN(vstore)(sc + (g0 + h) * SK + v * VW, acc[h][v]);
    }
    for (int64_t c = 0; c < nc; c++) {
      const int64_t j0 = s0 + c * CHUNK, n = p + 1 - j0 < CHUNK ? p + 1 - j0 : CHUNK;
      FN(value_rows)(a, vsrc + c * CHUNK, n, vrow, vbuf);
      for (int64_t g = 0; g < G; g++) {
        float *sg = sc + g * SK + c * CHUNK;
        // attend_block's softmax step, for one row
        for (int64_t jj = 0; jj < CHUNK; jj++) {
          float x = sg[jj] * scale;
          if (cap > 0.0f) x = cap * fast_tanhf(x / cap);
          sg[jj] = jj < n && j0 + jj >= start ? x : -INFINITY;
        }
        float cm = m[g];
        for (int64_t jj = 0; jj < CHUNK; jj++) cm = sg[jj] > cm ? sg[jj] : cm;
        const float alpha = cm == m[g] ? 1.0f : fast_expf(m[g] - cm); // ~0 on the first keys (m = -inf)
        const float mu = cm == -INFINITY ? 0.0f : cm;
        float lg = l[g] * alpha;
        ATTN_KEEP(lg);
        for (int64_t jj = 0; jj < CHUNK; jj++) {
          sg[jj] = sg[jj] == -INFINITY ? 0.0f : fast_expf(sg[jj] - mu);
          lg += sg[jj];
        }
        m[g] = cm;
        l[g] = lg;
        float *og = o + g * D;
        FN(pv_rows)(1, &og, &alpha, sg, 1, vrow, n, D);
      }
    }
  }
  for (int64_t g = 0; g < G; g++) {
    const float inv = l[g] > 0.0f ? 1.0f / l[g] : 0.0f; // no key (position -1): zeros
    for (int64_t d = 0; d < D; d++) o[g * D + d] *= inv;
  }
}

// Element offset of row r of a prefill block (token t0 + r / G, query head kh G + r % G) in q and out.
SIMD_INLINE int64_t FN(block_row)(const attn_args *a, int64_t t0, int64_t kh, int64_t G, int64_t r) {
  return ((t0 + r / G) * a->H + kh * G + r % G) * a->D;
}

// attend for nq > 1 consecutive tokens t0.. of one row (a prefill chunk), kv head kh, with the
// R = nq x G query rows (token i's head g: row i G + g) in vector lanes: Q transposed once
// (qt[d RP + r], RP = R rounded up to VW), and per chunk of keys (transposed, kt[d CHUNK + jj])
// the scores of every row as broadcast multiply-adds, key jj's scores of VW rows a vector
// (st[jj RP + r]); the online softmax lane-wise over rows; then the weighted values PR rows at a
// time, each value vector loaded once for them. attend computes each of its queries exactly so.
// scratch: sized in exec_attention (attention.c).
static void FN(attend_block)(const attn_args *a, int64_t t0, int64_t nq, int64_t kh, float *scratch, float *vbuf) {
  const int64_t D = a->D, G = a->H / a->KVH, R = nq * G, RP = (R + VW - 1) / VW * VW;
  const int32_t *table = a->tables + (int64_t)a->row[t0] * a->MBR;
  float *qt = scratch, *kt = qt + D * RP, *st = kt + D * CHUNK, *m = st + CHUNK * RP, *l = m + RP, *al = l + RP;
  int32_t *lo = (int32_t *)(al + RP), *hi = lo + RP; // row r's keys: [lo, hi] (none when hi < lo)
  const char *ksrc[CHUNK], *vsrc[CHUNK];
  const float *vrow[CHUNK];
  int64_t jlo = INT64_MAX, jhi = -1;
  for (int64_t r = 0; r < RP; r++) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    lo[r] = 0;
    hi[r] = -1; // padding lanes and tokens at position -1 read no key
    if (r >= R) {
      for (int64_t d = 0; d < D; d++) qt[d * RP + r] = 0.0f;
      continue;
    }
    const int64_t p = a->pos[t0 + r / G];
    const float *q = a->q + FN(block_row)(a, t0, kh, G, r);
    for (int64_t d = 0; d < D; d++) qt[d * RP + r] = q[d];
    if (p < 0) continue;
    lo[r] = (int32_t)attn_start(a, p);
    hi[r] = (int32_t)p;
    jlo = lo[r] < jlo ? lo[r] : jlo;
    jhi = p > jhi ? p : jhi;
  }
  for (int64_t i = 0; i < nq; i++) memset(a->out + ((t0 + i) * a->H + kh * G) * D, 0, (size_t)(G * D) * sizeof(float));
  // chunks start at multiples of CHUNK whatever the rows' windows, as attend's do
  for (int64_t j0 = jlo <= jhi ? jlo / CHUNK * CHUNK : 0; j0 <= jhi; j0 += CHUNK) {
    const int64_t n = jhi + 1 - j0 < CHUNK ? jhi + 1 - j0 : CHUNK;
    FN(chunk_src)(a, table, kh, j0, n, jlo, ksrc, vsrc);
    FN(transpose_keys)(a, ksrc, kt, CHUNK);
    FN(value_rows)(a, vsrc, n, vrow, vbuf);
    // scores: st[jj RP + r] = q_r . k_jj, ATTN_KB keys' vectors of VW rows accumulating over d
    for (int64_t r0 = 0; r0 < RP; r0 += VW)
      for (int kb = 0; kb < CHUNK; kb += ATTN_KB) {
        VF acc[ATTN_KB];
#pragma GCC unroll 16
        for (int jj = 0; jj < ATTN_KB; jj++) acc[jj] = (VF){0};
        for (int64_t d = 0; d < D; d++) {
          const VF qv = FN(vload)(qt + d * RP + r0);
          const float *kd = kt + d * CHUNK + kb;
#pragma GCC unroll 16
          for (int jj = 0; jj < ATTN_KB; jj++) acc[jj] += FN(vsplat)(kd[jj]) * qv;
        }
#pragma GCC unroll 16
        for (int jj = 0; jj < ATTN_KB; jj++) FN(vstore)(st + (kb + jj) * RP + r0, acc[jj]);
      }
    // the online softmax, lane-wise over rows: scale and cap, mask each row's keys, new maxima,
    // the old sums' and outputs' factors (al), then the weights
    const float scale = a->scale, cap = a->softcap;
    for (int64_t jj = 0; jj < CHUNK; jj++) {
      float *sj = st + jj * RP;
      const int32_t j = (int32_t)(j0 + jj);
      for (int64_t r = 0; r < RP; r++) {
        float x = sj[r] * scale;
        if (cap > 0.0f) x = cap * fast_tanhf(x / cap);
        sj[r] = jj < n && j >= lo[r] && j <= hi[r] ? x : -INFINITY;
      }
    }
    // (every loop runs along r, the lanes: the chunk's maxima gather in al first)
    for (int64_t r = 0; r < RP; r++) al[r] = m[r];
    for (int64_t jj = 0; jj < CHUNK; jj++)
      for (int64_t r = 0; r < RP; r++) al[r] = st[jj * RP + r] > al[r] ? st[jj * RP + r] : al[r];
    for (int64_t r = 0; r < RP; r++) {
      const float cm = al[r];
      al[r] = cm == m[r] ? 1.0f : fast_expf(m[r] - cm); // ~0 on a row's first keys (m = -inf)
      m[r] = cm;
      l[r] *= al[r];
    }
    ATTN_FP_BARRIER();
    for (int64_t jj = 0; jj < CHUNK; jj++) {
      float *sj = st + jj * RP;
      for (int64_t r = 0; r < RP; r++) {
        const float mu = m[r] == -INFINITY ? 0.0f : m[r];
        sj[r] = sj[r] == -INFINITY ? 0.0f : fast_expf(sj[r] - mu);
        l[r] += sj[r];
      }
    }
    // the weighted values, ATTN_PR rows at a time (a group none of whose rows has a key in the
    // chunk is skipped: its weights are 0 and its factors 1)
    int64_t r = 0;
    for (; r + ATTN_PR <= R; r += ATTN_PR) {
      int any = 0;
      float *o[ATTN_PR];
      for (int k = 0; k < ATTN_PR; k++) {
        any |= hi[r + k] >= j0 && lo[r + k] < j0 + n;
        o[k] = a->out + FN(block_row)(a, t0, kh, G, r + k);
      }
      if (any) FN(pv_rows)(ATTN_PR, o, al + r, st + r, RP, vrow, n, D);
    }
    for (; r < R; r++) // the rows past the last whole group: one at a time
      if (hi[r] >= j0 && lo[r] < j0 + n) {
        float *o = a->out + FN(block_row)(a, t0, kh, G, r);
        FN(pv_rows)(1, &o, al + r, st + r, RP, vrow, n, D);
      }
  }
  for (int64_t r = 0; r < R; r++) {
    float *o = a->out + FN(block_row)(a, t0, kh, G, r);
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f; // no key (position -1): zeros
    for (int64_t d = 0; d < D; d++) o[d] *= inv;
  }
}

#undef ATTN_PR
#undef ATTN_KB
#undef VF
#undef VU
#undef VI
#undef VH
#undef FN
#undef ATTN_CAT
#undef ATTN_CAT2
