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
// miss per row.
SIMD_INLINE void FN(chunk_rows)(const attn_args *a, const int32_t *table, int64_t kh, int64_t j0, int64_t n,
                                const float **krow, const float **vrow) {
  const int64_t D = a->D;
  for (int64_t jj = 0; jj < n; jj++) {
    const int64_t j = j0 + jj, off = ((int64_t)table[j / a->BS] * a->BS + j % a->BS) * a->KVH + kh;
    krow[jj] = a->kpool + off * D;
    vrow[jj] = a->vpool + off * D;
    for (int64_t b = 0; b < D * 4; b += 64) {
      __builtin_prefetch((const char *)krow[jj] + b);
      __builtin_prefetch((const char *)vrow[jj] + b);
    }
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
// token of the step). scratch: CHUNK scores + 2*G running max/sum floats.
static void FN(attend)(const attn_args *a, int64_t t, int64_t kh, float *scratch) {
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
    FN(chunk_rows)(a, table, kh, j0, n, krow, vrow);
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

// sg[0..CHUNK) = q . keys, the chunk's keys transposed in kt[d * CHUNK + jj]: broadcasts of q
// times rows of kt, four partial sums to break the chain of adds.
SIMD_INLINE void FN(scores_t)(const float *q, const float *kt, int64_t D, float *sg) {
  enum { NV = CHUNK / VW };
  VF acc[4][NV];
  for (int u = 0; u < 4; u++)
    for (int c = 0; c < NV; c++) acc[u][c] = (VF){0};
  int64_t d = 0;
  for (; d + 4 <= D; d += 4)
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++) {
      const VF qd = FN(vsplat)(q[d + u]);
      for (int c = 0; c < NV; c++) acc[u][c] += qd * FN(vload)(kt + (d + u) * CHUNK + c * VW);
    }
  for (; d < D; d++) {
    const VF qd = FN(vsplat)(q[d]);
    for (int c = 0; c < NV; c++) acc[0][c] += qd * FN(vload)(kt + d * CHUNK + c * VW);
  }
  for (int c = 0; c < NV; c++) FN(vstore)(sg + c * VW, (acc[0][c] + acc[1][c]) + (acc[2][c] + acc[3][c]));
}

// The same for nq > 1 consecutive tokens t0.. of one row (a prefill chunk), kv head kh: each
// chunk of keys is gathered and transposed once for all nq x G query rows, whose scores are then
// broadcast multiply-adds into whole vectors (no reductions). scratch: D*CHUNK transposed keys,
// CHUNK scores, 2*ATTN_QB*G running max/sum floats.
static void FN(attend_block)(const attn_args *a, int64_t t0, int64_t nq, int64_t kh, float *scratch) {
  const int64_t D = a->D, G = a->H / a->KVH;
  const int32_t *table = a->tables + (int64_t)a->row[t0] * a->MBR;
  float *kt = scratch, *sg = kt + D * CHUNK, *m = sg + CHUNK, *l = m + nq * G;
  const float *krow[CHUNK], *vrow[CHUNK];
  int64_t jlo = INT64_MAX, jhi = -1;
  for (int64_t i = 0; i < nq; i++) {
    const int64_t p = a->pos[t0 + i];
    const int64_t st = attn_start(a, p);
    if (p >= 0) {
      jlo = st < jlo ? st : jlo;
      jhi = p > jhi ? p : jhi;
    }
    for (int64_t g = 0; g < G; g++) {
      m[i * G + g] = -INFINITY;
      l[i * G + g] = 0.0f;
    }
    memset(a->out + ((t0 + i) * a->H + kh * G) * D, 0, (size_t)(G * D) * sizeof(float));
  }
  for (int64_t j0 = jlo; j0 <= jhi; j0 += CHUNK) {
    const int64_t n = jhi + 1 - j0 < CHUNK ? jhi + 1 - j0 : CHUNK;
    FN(chunk_rows)(a, table, kh, j0, n, krow, vrow);
    for (int64_t d = 0; d < D; d++) {
      for (int64_t jj = 0; jj < n; jj++) kt[d * CHUNK + jj] = krow[jj][d];
      for (int64_t jj = n; jj < CHUNK; jj++) kt[d * CHUNK + jj] = 0.0f;
    }
    for (int64_t i = 0; i < nq; i++) {
      const int64_t t = t0 + i, p = a->pos[t];
      const int64_t st = attn_start(a, p);
      if (p < j0 || st >= j0 + n) continue; // none of its keys in this chunk (or none at all: p = -1)
      const int64_t lo = st > j0 ? st - j0 : 0, hi = p + 1 - j0 < n ? p + 1 - j0 : n;
      for (int64_t g = 0; g < G; g++) {
        const int64_t h = kh * G + g;
        FN(scores_t)(a->q + (t * a->H + h) * D, kt, D, sg);
        FN(chunk_update)(a, sg, lo, hi, m + i * G + g, l + i * G + g, a->out + (t * a->H + h) * D, vrow);
      }
    }
  }
  for (int64_t i = 0; i < nq; i++)
    for (int64_t g = 0; g < G; g++) {
      float *o = a->out + ((t0 + i) * a->H + kh * G + g) * D;
      const float inv = l[i * G + g] > 0.0f ? 1.0f / l[i * G + g] : 0.0f; // no key (position -1): zeros
      for (int64_t d = 0; d < D; d++) o[d] *= inv;
    }
}

#undef VF
#undef VU
#undef VI
#undef VH
#undef FN
#undef ATTN_CAT
#undef ATTN_CAT2
