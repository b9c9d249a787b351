// Prefill matmuls of bf16 weights with AVX512-BF16 dot products (ISA_AVX512_BF16, matmul.c):
// x is rounded to bf16 (nearest even) as it is packed, and each vdpbf16ps multiplies 16 rows x 2
// k-steps of x by a broadcast pair of weights, accumulating in f32: twice the multiply-adds of an
// f32 FMA per instruction. The weights are bf16 already, so they need no conversion either.
//
// Why: a prefill's matmuls run at ~90% of the cores' f32 FMA peak (gemm_impl.h's packed path);
// llama.cpp multiplies bf16 activations (ggml's bf16 vec-dot) and was 1.1-1.3x faster at prefill on
// the 2-core dev VM. What it costs: x's rounding, a relative 2^-9 a product at most, as
// transformers' own bf16 inference has in every matmul (the CUDA backend's activations are bf16
// throughout); sums stay f32. Decode (M <= ROWS_MAX_M, gemm_rows_bf16dot below) rounds x the same
// way and computes each element exactly as the packed kernel does, so that a row's result does not
// depend on the other rows in its step. llm_set_isa(ISA_AVX512) turns it off (the tests compare both).
//
// Layout as gemm_impl.h's packed path: x in K-major panels of PW rows, but as pairs of k
// (xp[(k/2) PW + ii] holds x[row ii][k], x[row ii][k+1] in one 32-bit unit: a vector load takes
// 16 rows' pairs); weights read in place, NRW rows of KC columns a micro-kernel call (a last,
// partial group of rows copied zero-padded; copying every block, once per 128 rows of x, cost 8-13%
// at the demo's and 8B's shapes); an NRW x PW block of y^T in registers.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,prefer-vector-width=512")
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"

#define PW 32            // x rows per panel: two vectors of 16 rows' k pairs
#define NRW 12           // weight rows per micro-kernel: 24 accumulators + 2 x vectors of 32 zmm
#define KC 256           // k block (even): a panel block (KC x PW bf16, 16 KiB) stays in L1
#define NB (NRW * 8)     // weight rows per work item
#define MP (128 / PW)    // x panels per work item

// Panel p of x as k pairs: xp[(k2 PW + ii)] = bf16 pair (x[r][2 k2], x[r][2 k2 + 1]), r = p PW + ii,
// zero past M. K is even.
static void pack_panel_bf16(uint32_t *xp, const float *x, int64_t M, int64_t K, int64_t p) {
  for (int64_t ii = 0; ii < PW; ii++) {
    const int64_t row = p * PW + ii;
    if (row >= M) {
      for (int64_t k2 = 0; k2 < K / 2; k2++) xp[k2 * PW + ii] = 0;
      continue;
    }
    const float *src = x + row * K;
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
      // 32 floats -> 16 pairs; cvtne2ps puts its second operand's 16 values first
      const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + k + 16), _mm512_loadu_ps(src + k));
      uint32_t u[16];
      _mm512_storeu_si512(u, v);
      for (int j = 0; j < 16; j++) xp[(k / 2 + j) * PW + ii] = u[j];
    }
    for (; k < K; k += 2) {
      const __m128i v = (__m128i)_mm_cvtne2ps_pbh(_mm_set1_ps(0.0f), _mm_setr_ps(src[k], src[k + 1], 0.0f, 0.0f));
      xp[(k / 2) * PW + ii] = (uint32_t)_mm_cvtsi128_si32(v);
    }
  }
}

// ct[r ldc + 0..PW) (+)= sum_k wb[r ldw + k] x[.. k] over the block's kc (even) columns, r < NRW.
static inline void micro_bf16(const uint16_t *wb, int64_t ldw, const uint32_t *xp, int64_t kc, float *ct, int64_t ldc,
                              int first) {
  __m512 c[NRW][2];
  for (int r = 0; r < NRW; r++) {
    c[r][0] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(ct + r * ldc);
    c[r][1] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(ct + r * ldc + 16);
  }
  for (int64_t k2 = 0; k2 < kc / 2; k2++) {
    const __m512bh x0 = (__m512bh)_mm512_load_si512(xp + k2 * PW);
    const __m512bh x1 = (__m512bh)_mm512_load_si512(xp + k2 * PW + 16);
    for (int r = 0; r < NRW; r++) {
      int32_t pair;
      memcpy(&pair, wb + r * ldw + 2 * k2, 4);
      const __m512bh b = (__m512bh)_mm512_set1_epi32(pair);
      c[r][0] = _mm512_dpbf16_ps(c[r][0], x0, b);
      c[r][1] = _mm512_dpbf16_ps(c[r][1], x1, b);
    }
  }
  for (int r = 0; r < NRW; r++) {
    _mm512_storeu_ps(ct + r * ldc, c[r][0]);
    _mm512_storeu_ps(ct + r * ldc + 16, c[r][1]);
  }
}

void gemm_packed_bf16dot(const float *x, const uint16_t *w, const float *bias, float *y, int64_t M, int64_t N,
                         int64_t K) {
  const int64_t P = (M + PW - 1) / PW, K2 = K / 2;
  uint32_t *xp = aligned_alloc(64, (size_t)(P * K2 * PW) * sizeof(uint32_t) + 64);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < P; p++) pack_panel_bf16(xp + p * K2 * PW, x, M, K, p);

  const int64_t nbi = (N + NB - 1) / NB, nmi = (P + MP - 1) / MP, ldc = MP * PW;
#pragma omp parallel
  {
    uint16_t *wt = aligned_alloc(64, (size_t)(NRW * KC) * sizeof(uint16_t)); // a last, partial row group, zero-padded
    float *ct = aligned_alloc(64, (size_t)(NB * ldc) * sizeof(float));       // [NB][MP PW] y^T block
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int64_t bi = 0; bi < nbi; bi++) {
      for (int64_t mi = 0; mi < nmi; mi++) {
        const int64_t j0 = bi * NB, nb = N - j0 < NB ? N - j0 : NB;
        const int64_t nbr = (nb + NRW - 1) / NRW * NRW; // rounded up; extra rows are zero
        const int64_t full = nb / NRW * NRW; // row groups read in place; a partial last one from wt
        const int64_t p0 = mi * MP, np = P - p0 < MP ? P - p0 : MP;
        for (int64_t k0 = 0; k0 < K; k0 += KC) {
          const int64_t kc = K - k0 < KC ? K - k0 : KC;
          for (int64_t r = full; r < nbr; r++) {
            if (r < nb) memcpy(wt + (r - full) * KC, w + (j0 + r) * K + k0, (size_t)kc * 2);
            else memset(wt + (r - full) * KC, 0, (size_t)kc * 2);
          }
          for (int64_t pp = 0; pp < np; pp++) {
            const uint32_t *xpb = xp + (p0 + pp) * K2 * PW + (k0 / 2) * PW;
            for (int64_t jr = 0; jr < nbr; jr += NRW) {
              const int inplace = jr < full;
              micro_bf16(inplace ? w + (j0 + jr) * K + k0 : wt, inplace ? K : KC, xpb, kc, ct + jr * ldc + pp * PW, ldc,
                         k0 == 0);
            }
          }
        }
        gemm_store_yt(y, N, ct, ldc, p0 * PW, (p0 + np) * PW < M ? (p0 + np) * PW : M, j0, nb, bias);
      }
    }
    free(wt);
    free(ct);
  }
  free(xp);
}

// The same products for M <= ROWS_MAX_M (decode), each element of y computed exactly as the
// packed kernel computes it (one vdpbf16ps chain over the k pairs in order, then the bias), so a
// row's result does not depend on how many rows share the call. Weight rows are in the lanes
// here: a tile of 16 rows x 16 k pairs (one 64-byte load a row) is transposed in registers, then
// each broadcast x pair multiplies a column of 16 rows' pairs.

// v[0..16) as 16 x 16 32-bit units: rows become columns (4 stages, stage h swapping bit h of the
// row and column index).
static inline void transpose_u32x16(__m512i *v) {
  static const int32_t lo[4][16] = {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
                                    {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
                                    {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
                                    {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}};
  static const int32_t hi[4][16] = {{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
                                    {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
                                    {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
                                    {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}};
  int s = 0;
#pragma GCC unroll 4
  for (int h = 8; h >= 1; h /= 2, s++) {
    const __m512i il = _mm512_loadu_si512(lo[s]), ih = _mm512_loadu_si512(hi[s]);
#pragma GCC unroll 8
    for (int i = 0; i < 16; i++) {
      if (i & h) continue;
      const __m512i a = v[i], b = v[i + h];
      v[i] = _mm512_permutex2var_epi32(a, il, b);
      v[i + h] = _mm512_permutex2var_epi32(a, ih, b);
    }
  }
}

// x rows as bf16 pairs, rounded as pack_panel_bf16 rounds them: xb[m K/2 + k2] = (x[m][2 k2], x[m][2 k2 + 1]).
static void pack_rows_bf16(uint32_t *xb, const float *x, int64_t M, int64_t K) {
  for (int64_t m = 0; m < M; m++) {
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

void gemm_rows_bf16dot(const float *x, const uint16_t *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K) {
  const int64_t K2 = K / 2;
  uint32_t *xb = malloc((size_t)(M * K2) * sizeof(uint32_t) + 64);
  pack_rows_bf16(xb, x, M, K);
#pragma omp parallel for schedule(dynamic, 1) if ((size_t)N * (size_t)K * 2 >= llm_gemv_parallel_min_bytes())
  for (int64_t j0 = 0; j0 < N; j0 += 16) {
    const int64_t nr = N - j0 < 16 ? N - j0 : 16;
    const uint16_t *wr[16];
    for (int r = 0; r < 16; r++) wr[r] = w + (size_t)(j0 + (r < nr ? r : 0)) * (size_t)K;
    __m512 acc[ROWS_MAX_M];
    for (int64_t m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    for (int64_t k2 = 0; k2 < K2; k2 += 16) {
      const int64_t n2 = K2 - k2 < 16 ? K2 - k2 : 16; // pairs in this tile
      const __mmask16 mask = (__mmask16)((1u << n2) - 1u);
      __m512i t[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; r++) t[r] = r < nr ? _mm512_maskz_loadu_epi32(mask, wr[r] + 2 * k2) : _mm512_setzero_si512();
      transpose_u32x16(t); // t[i]: the 16 rows' pair k2 + i
      for (int64_t m = 0; m < M; m++) {
        const uint32_t *xm = xb + m * K2 + k2;
        __m512 a = acc[m];
        if (n2 == 16) {
#pragma GCC unroll 16
          for (int i = 0; i < 16; i++) a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_set1_epi32((int32_t)xm[i]), (__m512bh)t[i]);
        } else {
          for (int i = 0; i < n2; i++) a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_set1_epi32((int32_t)xm[i]), (__m512bh)t[i]);
        }
        acc[m] = a;
      }
    }
    for (int64_t m = 0; m < M; m++) {
      float s[16];
      _mm512_storeu_ps(s, acc[m]);
      for (int64_t r = 0; r < nr; r++) y[m * N + j0 + r] = s[r] + (bias ? bias[j0 + r] : 0.0f);
    }
  }
  free(xb);
}
