// Matmuls of bf16 weights with AVX512-BF16 dot products (ISA_AVX512_BF16, matmul.c): x is
// rounded to bf16 (nearest even) once per call, and each vdpbf16ps multiplies 16 pairs of x by 16
// pairs of a weight row, accumulating in f32: twice the multiply-adds of an f32 FMA per
// instruction, and the weights need no conversion.
//
// Why: a prefill's f32 matmuls run at ~90% of the cores' FMA peak (gemm_impl.h's packed path);
// llama.cpp multiplies bf16 activations (ggml's bf16 vec-dot) and was 1.1-1.3x faster at prefill on
// the 2-core dev VM. What it costs: x's rounding, a relative 2^-9 a product at most, as
// transformers' own bf16 inference has in every matmul (the CUDA backend's activations are bf16
// throughout); sums stay f32. vdpbf16ps reads subnormal inputs as zero. llm_set_isa(ISA_AVX512)
// turns it off (the tests compare both).
//
// Batch invariance: every element of y is computed the same way whatever M is, by one tile
// kernel (dot_tile): a vector of 16 lanes over the k pairs (lane l sums pairs l, l + 16, .. in
// order), a last partial vector of pairs masked to zero, then one fixed tree over the lanes
// (reduce16), then the bias. Decode (M <= ROWS_MAX_M) and prefill differ only in how tiles are
// blocked for the caches and split over threads, so a row's result never depends on the other
// rows of its step.
//
// Layout: x and w row-major, pairs of k in 32-bit units (x converted once: xb[m K2 + k2]);
// prefill tiles of 4 x rows by 6 weight rows (24 accumulators + 4 x vectors of 32 zmm), blocked by
// KC2 pairs (the tile's rows stay in L1) with the accumulators kept in a buffer between blocks;
// decode tiles of up to 4 x rows by 8 weight rows over the whole of K.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,prefer-vector-width=512")
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"

#define TILE_M 4    // x rows a prefill tile
#define TILE_N 6    // weight rows a prefill tile
#define DEC_N 8     // weight rows a decode tile
#ifndef KC2
#define KC2 1024    // k pairs a prefill block (multiple of 16): a tile's 10 row segments, 40 KiB, stay in L1
                    // (best of 256, 512, 1024 on a 16-core Xeon: bench/cpu-ab.ts, BENCHMARKS.md)
#endif
#define NB 96       // weight rows a prefill work item (a multiple of TILE_N)
#define MB 64       // x rows a prefill work item (a multiple of TILE_M)

// x rows as bf16 pairs, rounded to nearest even: xb[m K2 + k2] = (x[m][2 k2], x[m][2 k2 + 1]).
static void pack_rows_bf16(uint32_t *xb, const float *x, int64_t m0, int64_t m1, int64_t K) {
  for (int64_t m = m0; m < m1; m++) {
    const float *src = x + m * K;
    uint32_t *dst = xb + m * (K / 2);
    int64_t k = 0;
    for (; k + 32 <= K; k += 32)
      _mm512_storeu_si512(dst + k / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + k + 16), _mm512_loadu_ps(src + k)));
    for (; k < K; k += 2) {
      const __m128i v = (__m128i)_mm_cvtne2ps_pbh(_mm_set1_ps(0.0f), _mm_setr_ps(src[k], src[k + 1], 0.0f, 0.0f));
      dst[k / 2] = (uint32_t)_mm_cvtsi128_si32(v);
    }
  }
}

// acc[i][j] (+)= the dot products of pairs [k2a, k2b) of x rows xr[i] and weight rows wr[j], 16
// pairs a vector; a last partial vector is masked (its pairs past k2b are zero on both sides).
// MR and NR are constants at every call (always inlined), so acc stays in registers.
static inline __attribute__((always_inline)) void dot_tile(const int MR, const int NR, const uint32_t *const *xr,
                                                           const uint32_t *const *wr, int64_t k2a, int64_t k2b,
                                                           __m512 acc[TILE_M][DEC_N]) {
  int64_t k2 = k2a;
  for (; k2 + 16 <= k2b; k2 += 16) {
    __m512i xv[TILE_M];
    for (int i = 0; i < MR; i++) xv[i] = _mm512_loadu_si512(xr[i] + k2);
    for (int j = 0; j < NR; j++) {
      const __m512bh wv = (__m512bh)_mm512_loadu_si512(wr[j] + k2);
      for (int i = 0; i < MR; i++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)xv[i], wv);
    }
  }
  if (k2 < k2b) {
    const __mmask16 mask = (__mmask16)((1u << (k2b - k2)) - 1u);
    __m512i xv[TILE_M];
    for (int i = 0; i < MR; i++) xv[i] = _mm512_maskz_loadu_epi32(mask, xr[i] + k2);
    for (int j = 0; j < NR; j++) {
      const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi32(mask, wr[j] + k2);
      for (int i = 0; i < MR; i++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)xv[i], wv);
    }
  }
}

// out[i] = the sum of v[i]'s 16 lanes for i < n (n <= 16), always by the same tree: lanes l and
// l + 8, then l and l + 4, l + 2, l + 1 (a transposing reduction: each level adds two shuffles of
// a pair of vectors, so 16 sums cost 15 pair steps, not 16 horizontal sums). A vector's sum does
// not depend on which others share the call.
static void reduce16(const __m512 *v, int n, float *out) {
  static const int32_t lo[4][16] = {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
                                    {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27},
                                    {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29},
                                    {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}};
  static const int32_t hi[4][16] = {{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
                                    {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31},
                                    {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31},
                                    {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31}};
  __m512 a[16];
  for (int i = 0; i < 16; i++) a[i] = i < n ? v[i] : _mm512_setzero_ps();
  // live: vectors holding anything; pairs past them are zeros and stay zeros (no step needed)
  int w = 16, live = n;
  for (int s = 0; s < 4; s++, w /= 2, live = (live + 1) / 2) {
    const __m512i il = _mm512_loadu_si512(lo[s]), ih = _mm512_loadu_si512(hi[s]);
    for (int i = 0; i < w / 2; i++) {
      if (2 * i >= live) {
        a[i] = _mm512_setzero_ps();
        continue;
      }
      a[i] = _mm512_add_ps(_mm512_permutex2var_ps(a[2 * i], il, a[2 * i + 1]), _mm512_permutex2var_ps(a[2 * i], ih, a[2 * i + 1]));
    }
  }
  float s[16];
  _mm512_storeu_ps(s, a[0]);
  for (int i = 0; i < n; i++) out[i] = s[i];
}

// y[m][n] for the MR x NR tile at x rows xr, weight rows wr (their indices m0.., n0..): reduce and
// add the bias.
static inline __attribute__((always_inline)) void store_tile(const int MR, const int NR, __m512 acc[TILE_M][DEC_N],
                                                             int64_t m0, int64_t n0, int64_t mr, int64_t nr,
                                                             const float *bias, float *y, int64_t N) {
  __m512 v[TILE_M * DEC_N];
  float s[TILE_M * DEC_N];
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) v[i * NR + j] = acc[i][j];
  for (int g = 0; g < MR * NR; g += 16) reduce16(v + g, MR * NR - g < 16 ? MR * NR - g : 16, s + g);
  for (int64_t i = 0; i < mr; i++)
    for (int64_t j = 0; j < nr; j++) y[(m0 + i) * N + n0 + j] = s[i * NR + j] + (bias ? bias[n0 + j] : 0.0f);
}

// ---- prefill (M > ROWS_MAX_M) ---------------------------------------------------------------

// One work item: weight rows [n0, n1) x x rows [m0, m1), K blocked by KC2 pairs, each tile's
// accumulators kept in cbuf between blocks. Tile rows past N or M repeat the item's first row
// (computed, never stored).
static void prefill_item(const uint32_t *xb, const uint32_t *wp, int64_t K2, int64_t M, int64_t N,
                         int64_t m0, int64_t m1, int64_t n0, int64_t n1, const float *bias, float *y, __m512 *cbuf) {
  const int64_t tm = (m1 - m0 + TILE_M - 1) / TILE_M, tn = (n1 - n0 + TILE_N - 1) / TILE_N;
  for (int64_t k2a = 0; k2a < K2; k2a += KC2) {
    const int64_t k2b = K2 - k2a < KC2 ? K2 : k2a + KC2;
    // weight tiles outer: a tile's 6 row segments stay in L1 while the x tiles pass
    for (int64_t bn = 0; bn < tn; bn++) {
      const uint32_t *wr[DEC_N];
      for (int j = 0; j < TILE_N; j++) {
        const int64_t n = n0 + bn * TILE_N + j;
        wr[j] = wp + (n < N ? n : n0) * K2;
      }
      for (int64_t bm = 0; bm < tm; bm++) {
        const uint32_t *xr[TILE_M];
        for (int i = 0; i < TILE_M; i++) {
          const int64_t m = m0 + bm * TILE_M + i;
          xr[i] = xb + (m < M ? m : m0) * K2;
        }
        __m512 acc[TILE_M][DEC_N];
        __m512 *cb = cbuf + (bn * tm + bm) * (TILE_M * TILE_N);
        for (int i = 0; i < TILE_M; i++)
          for (int j = 0; j < TILE_N; j++) acc[i][j] = k2a == 0 ? _mm512_setzero_ps() : cb[i * TILE_N + j];
        dot_tile(TILE_M, TILE_N, xr, wr, k2a, k2b, acc);
        if (k2b < K2) {
          for (int i = 0; i < TILE_M; i++)
            for (int j = 0; j < TILE_N; j++) cb[i * TILE_N + j] = acc[i][j];
        } else {
          const int64_t mb = m0 + bm * TILE_M, nb = n0 + bn * TILE_N;
          store_tile(TILE_M, TILE_N, acc, mb, nb, M - mb < TILE_M ? M - mb : TILE_M, N - nb < TILE_N ? N - nb : TILE_N,
                     bias, y, N);
        }
      }
    }
  }
}

void gemm_packed_bf16dot(const float *x, const uint16_t *w, const float *bias, float *y, int64_t M, int64_t N,
                         int64_t K) {
  const int64_t K2 = K / 2;
  uint32_t *xb = aligned_alloc(64, ((size_t)(M * K2) * sizeof(uint32_t) + 63) / 64 * 64);
  const int64_t nmi = (M + MB - 1) / MB, nni = (N + NB - 1) / NB;
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t mi = 0; mi < nmi; mi++) pack_rows_bf16(xb, x, mi * MB, (mi + 1) * MB < M ? (mi + 1) * MB : M, K);
    __m512 *cbuf = aligned_alloc(64, (size_t)((MB / TILE_M) * (NB / TILE_N) * TILE_M * TILE_N) * sizeof(__m512));
#pragma omp for schedule(dynamic, 1) collapse(2) nowait
    for (int64_t ni = 0; ni < nni; ni++)
      for (int64_t mi = 0; mi < nmi; mi++)
        prefill_item(xb, (const uint32_t *)w, K2, M, N, mi * MB, (mi + 1) * MB < M ? (mi + 1) * MB : M, ni * NB,
                     (ni + 1) * NB < N ? (ni + 1) * NB : N, bias, y, cbuf);
    free(cbuf);
  }
  free(xb);
}

// ---- decode (M <= ROWS_MAX_M) ---------------------------------------------------------------

// Weight rows stream from memory once, each 64-byte vector dotted with up to 4 rows of x; threads
// take blocks of DEC_N rows.
#define DECODE_CASE(MR_)                                                                                  \
  case MR_: {                                                                                             \
    __m512 acc[TILE_M][DEC_N];                                                                            \
    for (int i = 0; i < MR_; i++)                                                                         \
      for (int j = 0; j < DEC_N; j++) acc[i][j] = _mm512_setzero_ps();                                   \
    dot_tile(MR_, DEC_N, xr, wr, 0, K2, acc);                                                             \
    store_tile(MR_, DEC_N, acc, m0, n0, MR_, nr, bias, y, N);                                            \
    break;                                                                                                \
  }

void gemm_rows_bf16dot(const float *x, const uint16_t *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K) {
  const int64_t K2 = K / 2;
  uint32_t *xb = malloc((size_t)(M * K2) * sizeof(uint32_t) + 64);
  pack_rows_bf16(xb, x, 0, M, K);
#pragma omp parallel for schedule(dynamic, 1) if ((size_t)N * (size_t)K * 2 >= llm_gemv_parallel_min_bytes())
  for (int64_t n0 = 0; n0 < N; n0 += DEC_N) {
    const int64_t nr = N - n0 < DEC_N ? N - n0 : DEC_N;
    const uint32_t *wr[DEC_N];
    for (int j = 0; j < DEC_N; j++) wr[j] = (const uint32_t *)w + (n0 + (j < nr ? j : 0)) * K2; // past N: row n0, not stored
    for (int64_t m0 = 0; m0 < M; m0 += TILE_M) {
      const uint32_t *xr[TILE_M];
      for (int i = 0; i < TILE_M; i++) xr[i] = xb + (m0 + (m0 + i < M ? i : 0)) * K2; // the tile takes exactly M - m0 rows
      switch (M - m0 < TILE_M ? (int)(M - m0) : TILE_M) {
        DECODE_CASE(1)
        DECODE_CASE(2)
        DECODE_CASE(3)
        DECODE_CASE(4)
      }
    }
  }
  free(xb);
}
#undef DECODE_CASE

// ---- weights in panels (DT_BF16_P16, weight_pack.c) -------------------------------------------
//
// Lanes are weight rows: lane l of a panel's accumulator sums row 16p + l's pairs in order, one
// vdpbf16ps a pair of k with x's pair broadcast, so no tree follows and decode reads the panels
// as they lie. Prefill blocks K by PKC2 pairs, keeping the accumulators in a buffer between
// blocks (exact: the chain is the same); decode runs each tile over the whole of K.

#define PM 6      // x rows a prefill tile
#define PV 4      // panels a prefill tile (6 x 4 accumulators + 4 weight vectors + a broadcast)
#define DM 4      // x rows a decode tile at most (4 x 4 accumulators; 1 or 2 rows take up to 8 panels)
#define DV 8      // panels a decode tile (enough independent chains for one row)
#define PKC2 512  // k pairs a prefill block: a tile's panels, 128 KiB, stay in L2 while the x tiles pass
#define PMB 96    // x rows a prefill work item at most (a multiple of PM); its panels are one tile's PV

// acc[i][v] (+)= pairs [k2a, k2b) of x rows xr[i] dotted into panels wp[v].
static inline __attribute__((always_inline)) void p16_dot(const int MR, const int NV, const uint32_t *const *xr,
                                                          const uint32_t *const *wp, int64_t k2a, int64_t k2b,
                                                          __m512 acc[PM][DV]) {
  for (int64_t k2 = k2a; k2 < k2b; k2++) {
    __m512i wv[DV];
    for (int v = 0; v < NV; v++) wv[v] = _mm512_loadu_si512(wp[v] + k2 * 16);
    for (int i = 0; i < MR; i++) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xr[i][k2]);
      for (int v = 0; v < NV; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], xv, (__m512bh)wv[v]);
    }
  }
}

// y rows m0 .. m0 + mr, columns of panels p0 .. p0 + NV (those below N) = acc + bias.
static inline __attribute__((always_inline)) void p16_store(const int MR, const int NV, __m512 acc[PM][DV], int64_t m0,
                                                            int64_t mr, int64_t p0, const float *bias, float *y,
                                                            int64_t N) {
  for (int v = 0; v < NV; v++) {
    const int64_t n0 = (p0 + v) * 16;
    if (n0 >= N) break;
    const __mmask16 mask = N - n0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (N - n0)) - 1u);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + n0) : _mm512_setzero_ps();
    for (int i = 0; i < MR && i < mr; i++) _mm512_mask_storeu_ps(y + (m0 + i) * N + n0, mask, _mm512_add_ps(acc[i][v], b));
  }
}

// Tile rows past M repeat row m_first and panels past P repeat panel p_first (computed, never stored).
static inline __attribute__((always_inline)) void p16_ptrs(const int MR, const int NV, const uint32_t *xb,
                                                           const uint32_t *w, int64_t K2, int64_t M, int64_t P,
                                                           int64_t m0, int64_t m_first, int64_t p0, int64_t p_first,
                                                           const uint32_t **xr, const uint32_t **wp) {
  for (int i = 0; i < MR; i++) xr[i] = xb + (m0 + i < M ? m0 + i : m_first) * K2;
  for (int v = 0; v < NV; v++) wp[v] = w + (p0 + v < P ? p0 + v : p_first) * 16 * K2;
}

// One work item: panels [q0, q1) x x rows [m0, m1).
static void p16_prefill_item(const uint32_t *xb, const uint32_t *w, int64_t K2, int64_t N, int64_t m0, int64_t m1, int64_t q0, int64_t q1, const float *bias, float *y, __m512 *cbuf) {
  const int64_t tm = (m1 - m0 + PM - 1) / PM, tv = (q1 - q0 + PV - 1) / PV;
  for (int64_t k2a = 0; k2a < K2; k2a += PKC2) {
    const int64_t k2b = K2 - k2a < PKC2 ? K2 : k2a + PKC2;
    for (int64_t bv = 0; bv < tv; bv++) { // a tile's panels stay in cache while the x tiles pass
      const int64_t p0 = q0 + bv * PV;
      for (int64_t bm = 0; bm < tm; bm++) {
        const int64_t mb = m0 + bm * PM;
        const uint32_t *xr[PM], *wp[DV];
        p16_ptrs(PM, PV, xb, w, K2, m1, q1, mb, m0, p0, q0, xr, wp);
        __m512 acc[PM][DV];
        __m512 *cb = cbuf + (bv * tm + bm) * (PM * PV);
        for (int i = 0; i < PM; i++)
          for (int v = 0; v < PV; v++) acc[i][v] = k2a == 0 ? _mm512_setzero_ps() : cb[i * PV + v];
        p16_dot(PM, PV, xr, wp, k2a, k2b, acc);
        if (k2b < K2) {
          for (int i = 0; i < PM; i++)
            for (int v = 0; v < PV; v++) cb[i * PV + v] = acc[i][v];
        } else {
          p16_store(PM, q1 - p0 < PV ? (int)(q1 - p0) : PV, acc, mb, m1 - mb, p0, bias, y, N);
        }
      }
    }
  }
}

// A decode tile: x rows m0 .. m0 + MR_ (those past M repeat m0) by panels ps .. ps + NV_ (those
// past the item's p1 repeat ps); only rows below M and columns below N are stored.
#define P16_DECODE_TILE(MR_, NV_, ps)                                                   \
  do {                                                                                  \
    const uint32_t *xr[PM], *wp[DV];                                                    \
    p16_ptrs(MR_, NV_, xb, w, K2, M, p1, m0, m0, ps, ps, xr, wp);                       \
    __m512 acc[PM][DV];                                                                 \
    for (int i = 0; i < MR_; i++)                                                       \
      for (int v = 0; v < NV_; v++) acc[i][v] = _mm512_setzero_ps();                   \
    p16_dot(MR_, NV_, xr, wp, 0, K2, acc);                                              \
    p16_store(MR_, (NV_) < p1 - (ps) ? (NV_) : (int)(p1 - (ps)), acc, m0, mr, ps, bias, y, N); \
  } while (0)
// 3 or 4 rows take a 4-row tile (a third row repeats, never stored) over at most 4 panels at a time
#define P16_DECODE_NV(NV_)                                                              \
  case NV_:                                                                             \
    if (mr == 1) P16_DECODE_TILE(1, NV_, p0);                                           \
    else if (mr == 2) P16_DECODE_TILE(2, NV_, p0);                                      \
    else if (NV_ <= 4) P16_DECODE_TILE(4, ((NV_) <= 4 ? (NV_) : 4), p0);                \
    else {                                                                              \
      P16_DECODE_TILE(4, 4, p0);                                                        \
      if (p0 + 4 < p1) P16_DECODE_TILE(4, 4, p0 + 4);                                   \
    }                                                                                   \
    break;

// The largest of 8, 4, 2, 1 that splits `units` into at least `want` parts (1 if none does).
static int64_t split_pow2(int64_t units, int64_t want, int64_t max) {
  int64_t q = max;
  while (q > 1 && (units + q - 1) / q < want) q /= 2;
  return q;
}

// One decode work item of gemm_p16_bf16dot: panels [it q, it q + q) for every row of x.
typedef struct {
  const uint32_t *xb, *w;
  const float *bias;
  float *y;
  int64_t M, N, K2, P, q;
} p16_decode_items;

static void p16_decode_item(void *arg, int64_t it, int thread) {
  (void)thread;
  const p16_decode_items *a = arg;
  const uint32_t *xb = a->xb, *w = a->w;
  const float *bias = a->bias;
  float *y = a->y;
  const int64_t M = a->M, N = a->N, K2 = a->K2, P = a->P, q = a->q;
  const int64_t p0 = it * q, p1 = p0 + q < P ? p0 + q : P;
  for (int64_t m0 = 0; m0 < M; m0 += DM) {
    const int64_t mr = M - m0 < DM ? M - m0 : DM;
    switch (q) {
      P16_DECODE_NV(1)
      P16_DECODE_NV(2)
      P16_DECODE_NV(4)
      P16_DECODE_NV(8)
    }
  }
}

void gemm_p16_bf16dot(const float *x, const uint32_t *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K) {
  const int64_t K2 = K / 2, P = (N + 15) / 16;
  uint32_t *xb = aligned_alloc(64, ((size_t)(M * K2) * sizeof(uint32_t) + 63) / 64 * 64 + 64);
  if (M <= ROWS_MAX_M) {
    pack_rows_bf16(xb, x, 0, M, K);
    // work items of 8 panels, fewer when that leaves threads idle (a tile's shape never changes
    // what its lanes compute); small matrices on one thread
    const int parallel = p16_bytes(N, K) >= llm_gemv_parallel_min_bytes();
    const int64_t q = split_pow2(P, parallel ? 2 * (int64_t)llm_pool_threads() : 1, DV);
    const p16_decode_items items = {xb, w, bias, y, M, N, K2, P, q};
    // on the decode team (pool.c), or on this thread for small matrices
    if (parallel) llm_pool_for((P + q - 1) / q, p16_decode_item, (void *)&items);
    else
      for (int64_t it = 0; it < (P + q - 1) / q; it++) p16_decode_item((void *)&items, it, 0);
    free(xb);
    return;
  }
  // work items of PV panels by up to PMB rows, fewer rows when that leaves threads idle
  const int64_t tv_all = (P + PV - 1) / PV, tm_all = (M + PM - 1) / PM;
  const int64_t want_m = (4 * (int64_t)omp_get_max_threads() + tv_all - 1) / tv_all;
  int64_t tiles = tm_all / (want_m > 0 ? want_m : 1);
  tiles = tiles < 1 ? 1 : tiles > PMB / PM ? PMB / PM : tiles;
  const int64_t mrows = tiles * PM, nmi = (M + mrows - 1) / mrows;
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t mi = 0; mi < nmi; mi++) pack_rows_bf16(xb, x, mi * mrows, (mi + 1) * mrows < M ? (mi + 1) * mrows : M, K);
    __m512 *cbuf = aligned_alloc(64, (size_t)((PMB / PM) * PM * PV) * sizeof(__m512));
#pragma omp for schedule(dynamic, 1) collapse(2) nowait
    for (int64_t qi = 0; qi < tv_all; qi++)
      for (int64_t mi = 0; mi < nmi; mi++)
        p16_prefill_item(xb, w, K2, N, mi * mrows, (mi + 1) * mrows < M ? (mi + 1) * mrows : M, qi * PV,
                         (qi + 1) * PV < P ? (qi + 1) * PV : P, bias, y, cbuf);
    free(cbuf);
  }
  free(xb);
}
#undef P16_DECODE_TILE
#undef P16_DECODE_NV
