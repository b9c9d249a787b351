// One instantiation of the attention inner kernel (see attention.c), included once per ISA under
// a `#pragma GCC target` with ATTN_ISA (name suffix), VW, VEC_AVX512 / VEC_AVX2 defined.

#define ATTN_CAT2(a, b) a##_##b
#define ATTN_CAT(a, b) ATTN_CAT2(a, b)
#define FN(name) ATTN_CAT(name, ATTN_ISA)

#include "vec_isa.h"

// Lane i of the result = the sum of a[i]'s lanes, for i < VW: a transposing reduction (log2 VW
// levels, each adding two shuffles of a pair of vectors, keys' partial sums halving in width), where
// VW separate horizontal sums would cost log2 VW shuffles and adds each. Level with L lanes a key
// (h = L / 2): lo[o] = (o / h) L + o % h of the pair (u, v), hi[o] = lo[o] + h.
SIMD_INLINE VF FN(pair)(VF u, VF v, VI lo, VI hi) { return __builtin_shuffle(u, v, lo) + __builtin_shuffle(u, v, hi); }
SIMD_INLINE VF FN(hsum_each)(VF *a) {
#if VW == 16
  for (int i = 0; i < 8; i++)
    a[i] = FN(pair)(a[2 * i], a[2 * i + 1], (VI){0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
                     (VI){8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31});
  for (int i = 0; i < 4; i++)
    a[i] = FN(pair)(a[2 * i], a[2 * i + 1], (VI){0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27},
                     (VI){4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31});
  for (int i = 0; i < 2; i++)
    a[i] = FN(pair)(a[2 * i], a[2 * i + 1], (VI){0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29},
                     (VI){2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31});
  return FN(pair)(a[0], a[1], (VI){0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30},
                   (VI){1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31});
#elif VW == 8
  for (int i = 0; i < 4; i++)
    a[i] = FN(pair)(a[2 * i], a[2 * i + 1], (VI){0, 1, 2, 3, 8, 9, 10, 11}, (VI){4, 5, 6, 7, 12, 13, 14, 15});
  for (int i = 0; i < 2; i++)
    a[i] = FN(pair)(a[2 * i], a[2 * i + 1], (VI){0, 1, 4, 5, 8, 9, 12, 13}, (VI){2, 3, 6, 7, 10, 11, 14, 15});
  return FN(pair)(a[0], a[1], (VI){0, 2, 4, 6, 8, 10, 12, 14}, (VI){1, 3, 5, 7, 9, 11, 13, 15});
#else
  for (int i = 0; i < 2; i++) a[i] = FN(pair)(a[2 * i], a[2 * i + 1], (VI){0, 1, 4, 5}, (VI){2, 3, 6, 7});
  return FN(pair)(a[0], a[1], (VI){0, 2, 4, 6}, (VI){1, 3, 5, 7});
#endif
}

// s[i] = q . k[i][0..D) for i < VW (every k[i] readable): the VW keys' products accumulate in VW
// vectors, q loaded once a step for all of them, then one transposing reduction.
SIMD_INLINE void FN(dots)(const float *q, const float *const *k, int64_t D, float *s) {
  VF acc[VW];
#pragma GCC unroll 16
  for (int i = 0; i < VW; i++) acc[i] = (VF){0};
  int64_t d = 0;
  for (; d + VW <= D; d += VW) {
    const VF qv = FN(vload)(q + d);
#pragma GCC unroll 16
    for (int i = 0; i < VW; i++) acc[i] += qv * FN(vload)(k[i] + d);
  }
  FN(vstore)(s, FN(hsum_each)(acc));
  for (; d < D; d++)
    for (int i = 0; i < VW; i++) s[i] += q[d] * k[i][d];
}

// o[0..D) += sum_jj e[jj] * v[jj][0..D): blocks of 4 vectors of o stay in registers across keys.
SIMD_INLINE void FN(accumulate)(float *o, const float *e, const float *const *v, int64_t n, int64_t D) {
  int64_t d0 = 0;
  for (; d0 + 4 * VW <= D; d0 += 4 * VW) {
    VF c0 = FN(vload)(o + d0), c1 = FN(vload)(o + d0 + VW), c2 = FN(vload)(o + d0 + 2 * VW),
       c3 = FN(vload)(o + d0 + 3 * VW);
    for (int64_t jj = 0; jj < n; jj++) {
      const VF w = FN(vsplat)(e[jj]);
      const float *vr = v[jj] + d0;
      c0 += w * FN(vload)(vr);
      c1 += w * FN(vload)(vr + VW);
      c2 += w * FN(vload)(vr + 2 * VW);
      c3 += w * FN(vload)(vr + 3 * VW);
    }
    FN(vstore)(o + d0, c0);
    FN(vstore)(o + d0 + VW, c1);
    FN(vstore)(o + d0 + 2 * VW, c2);
    FN(vstore)(o + d0 + 3 * VW, c3);
  }
  for (; d0 + VW <= D; d0 += VW) {
    VF c = FN(vload)(o + d0);
    for (int64_t jj = 0; jj < n; jj++) c += FN(vsplat)(e[jj]) * FN(vload)(v[jj] + d0);
    FN(vstore)(o + d0, c);
  }
  for (int64_t jj = 0; jj < n; jj++)
    for (int64_t d = d0; d < D; d++) o[d] += e[jj] * v[jj][d];
}

// The key and value rows [j0, j0 + n) of kv head kh through a row's block table, prefetched:
// consecutive keys of one kv head sit a page apart in the pool ([.., slot, kvHeads, D]), so
// hardware prefetchers do not follow them; ask for the whole chunk up front instead of taking one
// miss per row. bf16 pools: the chunk's rows are widened into kvbuf (2 CHUNK D floats, L1-resident)
// and the rows point there, so the kernels below read f32 either way while memory traffic halves.
SIMD_INLINE void FN(chunk_rows)(const attn_args *a, const int32_t *table, int64_t kh, int64_t j0, int64_t n,
                                const float **krow, const float **vrow, float *kvbuf) {
  const int64_t D = a->D, eb = a->kv_dt == DT_F32 ? 4 : 2;
  const char *src[2 * CHUNK];
  for (int64_t jj = 0; jj < n; jj++) {
    const int64_t j = j0 + jj, off = ((int64_t)table[j / a->BS] * a->BS + j % a->BS) * a->KVH + kh;
    src[2 * jj] = (const char *)a->kpool + off * D * eb;
    src[2 * jj + 1] = (const char *)a->vpool + off * D * eb;
    for (int64_t b = 0; b < D * eb; b += 64) {
      __builtin_prefetch(src[2 * jj] + b);
      __builtin_prefetch(src[2 * jj + 1] + b);
    }
  }
  if (a->kv_dt == DT_F32) {
    for (int64_t jj = 0; jj < n; jj++) {
      krow[jj] = (const float *)src[2 * jj];
      vrow[jj] = (const float *)src[2 * jj + 1];
    }
    return;
  }
  for (int64_t jj = 0; jj < n; jj++) {
    float *kd = kvbuf + jj * D, *vd = kvbuf + (CHUNK + jj) * D;
    int64_t d = 0;
    for (; d + VW <= D; d += VW) {
      FN(vstore)(kd + d, FN(load_w)(src[2 * jj], DT_BF16, d));
      FN(vstore)(vd + d, FN(load_w)(src[2 * jj + 1], DT_BF16, d));
    }
    for (; d < D; d++) {
      kd[d] = bf16_to_f32(((const uint16_t *)src[2 * jj])[d]);
      vd[d] = bf16_to_f32(((const uint16_t *)src[2 * jj + 1])[d]);
    }
    krow[jj] = kd;
    vrow[jj] = vd;
  }
}

// One query row's online-softmax step over a chunk: sg[0..CHUNK) its raw q.k scores, of which
// lanes [lo, hi) are its keys (the others get weight 0); m, l and o[0..D) updated.
SIMD_INLINE void FN(chunk_update)(const attn_args *a, float *sg, int64_t lo, int64_t hi, float *m, float *l, float *o,
                                  const float *const *vrow) {
  const int64_t D = a->D;
  for (int64_t jj = 0; jj < CHUNK; jj++) sg[jj] *= a->scale;
  if (a->softcap > 0.0f)
    for (int64_t jj = 0; jj < CHUNK; jj++) sg[jj] = a->softcap * fast_tanhf(sg[jj] / a->softcap);
  // the chunk's maximum over its keys' lanes (the others -inf for it), in vector steps
  for (int64_t jj = 0; jj < lo; jj++) sg[jj] = -INFINITY;
  for (int64_t jj = hi; jj < CHUNK; jj++) sg[jj] = -INFINITY;
  VF mv = FN(vload)(sg);
  for (int64_t j = VW; j < CHUNK; j += VW) mv = FN(vmax)(mv, FN(vload)(sg + j));
  const float cm = FN(vhmax)(mv), mx = cm > *m ? cm : *m;
  const float alpha = mx == *m ? 1.0f : fast_expf(*m - mx); // ~0 on the first chunk (m = -inf)
  for (int64_t jj = 0; jj < CHUNK; jj++) sg[jj] = fast_expf(sg[jj] - mx);
  for (int64_t jj = 0; jj < lo; jj++) sg[jj] = 0.0f;
  for (int64_t jj = hi; jj < CHUNK; jj++) sg[jj] = 0.0f;
  VF acc = FN(vload)(sg);
  for (int64_t j = VW; j < CHUNK; j += VW) acc += FN(vload)(sg + j);
  *l = *l * alpha + FN(vhsum)(acc);
  *m = mx;
  if (alpha != 1.0f)
    for (int64_t d = 0; d < D; d++) o[d] *= alpha;
  FN(accumulate)(o, sg, vrow, hi, D);
}

// Scores, softmax and weighted values for token t, kv head kh (a decode token, or a row's only
// token of the step). scratch: CHUNK scores + 2*G running max/sum floats; kvbuf: chunk_rows' widened rows (bf16 pools).
static void FN(attend)(const attn_args *a, int64_t t, int64_t kh, float *scratch, float *kvbuf) {
  const int64_t D = a->D, G = a->H / a->KVH, p = a->pos[t];
  const int64_t start = attn_start(a, p);
  const int32_t *table = a->tables + (int64_t)a->row[t] * a->MBR;
  const float *q = a->q + (t * a->H + kh * G) * D; // G heads, contiguous
  float *o = a->out + (t * a->H + kh * G) * D;     // accumulated in place
  float *sg = scratch, *m = scratch + CHUNK, *l = m + G;
  const float *krow[CHUNK], *vrow[CHUNK];
  for (int64_t g = 0; g < G; g++) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
    memset(o + g * D, 0, (size_t)D * sizeof(float));
  }
  _Static_assert(CHUNK % VW == 0, "attention: CHUNK must be a multiple of the vector width");
  for (int64_t j0 = start; j0 <= p; j0 += CHUNK) {
    const int64_t n = p + 1 - j0 < CHUNK ? p + 1 - j0 : CHUNK;
    FN(chunk_rows)(a, table, kh, j0, n, krow, vrow, kvbuf);
    for (int64_t jj = n; jj < CHUNK; jj++) krow[jj] = krow[0]; // a short chunk's spare lanes: read, then dropped
    for (int64_t g = 0; g < G; g++) {
      // the whole chunk's lanes (CHUNK, a multiple of VW) in vector steps
      for (int64_t j = 0; j < CHUNK; j += VW) FN(dots)(q + g * D, krow + j, D, sg + j);
      FN(chunk_update)(a, sg, 0, n, m + g, l + g, o + g * D, vrow);
    }
  }
  for (int64_t g = 0; g < G; g++) {
    const float inv = l[g] > 0.0f ? 1.0f / l[g] : 0.0f; // no key (position -1): zeros
    for (int64_t d = 0; d < D; d++) o[g * D + d] *= inv;
  }
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
// each value vector loaded once for PR rows, PR x 4 accumulators.
SIMD_INLINE void FN(pv_rows)(float *const *o, const float *al, const float *p, int64_t RP, const float *const *v,
                             int64_t n, int64_t D) {
  int64_t d0 = 0;
  for (; d0 + 4 * VW <= D; d0 += 4 * VW) {
    VF c[ATTN_PR][4];
#pragma GCC unroll 4
    for (int k = 0; k < ATTN_PR; k++) {
      const VF s = FN(vsplat)(al[k]);
      for (int u = 0; u < 4; u++) c[k][u] = FN(vload)(o[k] + d0 + u * VW) * s;
    }
    for (int64_t jj = 0; jj < n; jj++) {
      const float *vr = v[jj] + d0;
      const VF v0 = FN(vload)(vr), v1 = FN(vload)(vr + VW), v2 = FN(vload)(vr + 2 * VW), v3 = FN(vload)(vr + 3 * VW);
#pragma GCC unroll 4
      for (int k = 0; k < ATTN_PR; k++) {
        const VF w = FN(vsplat)(p[jj * RP + k]);
        c[k][0] += w * v0;
        c[k][1] += w * v1;
        c[k][2] += w * v2;
        c[k][3] += w * v3;
      }
    }
#pragma GCC unroll 4
    for (int k = 0; k < ATTN_PR; k++)
      for (int u = 0; u < 4; u++) FN(vstore)(o[k] + d0 + u * VW, c[k][u]);
  }
  for (; d0 + VW <= D; d0 += VW) {
    VF c[ATTN_PR];
    for (int k = 0; k < ATTN_PR; k++) c[k] = FN(vload)(o[k] + d0) * FN(vsplat)(al[k]);
    for (int64_t jj = 0; jj < n; jj++) {
      const VF vv = FN(vload)(v[jj] + d0);
      for (int k = 0; k < ATTN_PR; k++) c[k] += FN(vsplat)(p[jj * RP + k]) * vv;
    }
    for (int k = 0; k < ATTN_PR; k++) FN(vstore)(o[k] + d0, c[k]);
  }
  for (int k = 0; k < ATTN_PR; k++)
    for (int64_t d = d0; d < D; d++) {
      float c = o[k][d] * al[k];
      for (int64_t jj = 0; jj < n; jj++) c += p[jj * RP + k] * v[jj][d];
      o[k][d] = c;
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
// time, each value vector loaded once for them. (Before: a row at a time, two loads per
// multiply-add; this is 1.6-1.8x, see BENCHMARKS.md.) scratch: sized in exec_attention (attention.c).
static void FN(attend_block)(const attn_args *a, int64_t t0, int64_t nq, int64_t kh, float *scratch, float *kvbuf) {
  const int64_t D = a->D, G = a->H / a->KVH, R = nq * G, RP = (R + VW - 1) / VW * VW;
  const int32_t *table = a->tables + (int64_t)a->row[t0] * a->MBR;
  float *qt = scratch, *kt = qt + D * RP, *st = kt + D * CHUNK, *m = st + CHUNK * RP, *l = m + RP, *al = l + RP;
  int32_t *lo = (int32_t *)(al + RP), *hi = lo + RP; // row r's keys: [lo, hi] (none when hi < lo)
  const float *krow[CHUNK], *vrow[CHUNK];
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
  for (int64_t j0 = jlo; j0 <= jhi; j0 += CHUNK) {
    const int64_t n = jhi + 1 - j0 < CHUNK ? jhi + 1 - j0 : CHUNK;
    FN(chunk_rows)(a, table, kh, j0, n, krow, vrow, kvbuf);
    for (int64_t d = 0; d < D; d++) {
      for (int64_t jj = 0; jj < n; jj++) kt[d * CHUNK + jj] = krow[jj][d];
      for (int64_t jj = n; jj < CHUNK; jj++) kt[d * CHUNK + jj] = 0.0f;
    }
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
      if (any) FN(pv_rows)(o, al + r, st + r, RP, vrow, n, D);
    }
    for (; r < R; r++) // the rows past the last whole group: one at a time, as attend's rows
      if (hi[r] >= j0 && lo[r] < j0 + n) {
        float *o = a->out + FN(block_row)(a, t0, kh, G, r), e[CHUNK];
        for (int64_t d = 0; d < D; d++) o[d] *= al[r];
        for (int64_t jj = 0; jj < n; jj++) e[jj] = st[jj * RP + r];
        FN(accumulate)(o, e, vrow, n, D);
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
