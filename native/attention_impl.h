// One instantiation of the attention inner kernel (see attention.c), included once per ISA under
// a `#pragma GCC target` with ATTN_ISA (name suffix), VW, VEC_AVX512 / VEC_AVX2 defined.

#define ATTN_CAT2(a, b) a##_##b
#define ATTN_CAT(a, b) ATTN_CAT2(a, b)
#define FN(name) ATTN_CAT(name, ATTN_ISA)

#include "vec_isa.h"

// q . k over D: two vector chains, one horizontal sum.
SIMD_INLINE float FN(dot)(const float *q, const float *k, int64_t D) {
  VF a0 = (VF){0}, a1 = (VF){0};
  int64_t d = 0;
  for (; d + 2 * VW <= D; d += 2 * VW) {
    a0 += FN(vload)(q + d) * FN(vload)(k + d);
    a1 += FN(vload)(q + d + VW) * FN(vload)(k + d + VW);
  }
  if (d + VW <= D) {
    a0 += FN(vload)(q + d) * FN(vload)(k + d);
    d += VW;
  }
  float s = FN(vhsum)(a0 + a1);
  for (; d < D; d++) s += q[d] * k[d];
  return s;
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

// Scores, softmax and weighted values for token t, kv head kh.
// scratch: G*CHUNK scores + 2*G running max/sum floats, then 2*CHUNK row pointers.
static void FN(attend)(const attn_args *a, int64_t t, int64_t kh, float *scratch) {
  const int64_t D = a->D, G = a->H / a->KVH, p = a->pos[t];
  const int64_t start = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
  const int32_t *table = a->tables + (int64_t)a->row[t] * a->MBR;
  const float *q = a->q + (t * a->H + kh * G) * D; // G heads, contiguous
  float *o = a->out + (t * a->H + kh * G) * D;     // accumulated in place
  float *s = scratch, *m = scratch + G * CHUNK, *l = m + G;
  const float **krow = (const float **)(l + G), **vrow = krow + CHUNK;
  for (int64_t g = 0; g < G; g++) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
    memset(o + g * D, 0, (size_t)D * sizeof(float));
  }
  for (int64_t j0 = start; j0 <= p; j0 += CHUNK) {
    const int64_t n = p + 1 - j0 < CHUNK ? p + 1 - j0 : CHUNK;
    for (int64_t jj = 0; jj < n; jj++) {
      const int64_t j = j0 + jj, off = ((int64_t)table[j / a->BS] * a->BS + j % a->BS) * a->KVH + kh;
      krow[jj] = a->kpool + off * D;
      vrow[jj] = a->vpool + off * D;
      // Consecutive keys of one KV head sit a page apart in the pool ([.., slot, kvHeads, D]), so
      // hardware prefetchers do not follow them: ask for the whole chunk up front instead of
      // taking one miss per row.
      for (int64_t b = 0; b < D * 4; b += 64) {
        __builtin_prefetch((const char *)krow[jj] + b);
        __builtin_prefetch((const char *)vrow[jj] + b);
      }
    }
    for (int64_t g = 0; g < G; g++) {
      float *sg = s + g * CHUNK;
      for (int64_t jj = 0; jj < n; jj++) sg[jj] = FN(dot)(q + g * D, krow[jj], D) * a->scale;
      if (a->softcap > 0.0f)
        for (int64_t jj = 0; jj < n; jj++) sg[jj] = a->softcap * fast_tanhf(sg[jj] / a->softcap);
      float mx = m[g];
      for (int64_t jj = 0; jj < n; jj++) mx = sg[jj] > mx ? sg[jj] : mx;
      const float alpha = fast_expf(m[g] - mx); // ~0 on the first chunk (m = -inf)
      for (int64_t jj = 0; jj < n; jj++) sg[jj] = fast_expf(sg[jj] - mx);
      float sum = 0.0f;
      for (int64_t jj = 0; jj < n; jj++) sum += sg[jj];
      l[g] = l[g] * alpha + sum;
      m[g] = mx;
      if (alpha != 1.0f)
        for (int64_t d = 0; d < D; d++) o[g * D + d] *= alpha;
      FN(accumulate)(o + g * D, sg, vrow, n, D);
    }
  }
  for (int64_t g = 0; g < G; g++) {
    const float inv = l[g] > 0.0f ? 1.0f / l[g] : 0.0f; // no key (position -1): zeros
    for (int64_t d = 0; d < D; d++) o[g * D + d] *= inv;
  }
}

#undef VF
#undef VU
#undef VI
#undef VH
#undef FN
#undef ATTN_CAT
#undef ATTN_CAT2
