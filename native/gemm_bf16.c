// Prefill matmuls of bf16 weights with AVX512-BF16 dot products (ISA_AVX512_BF16, matmul.c):
// x is rounded to bf16 (nearest even) as it is packed, and each vdpbf16ps multiplies 16 rows x 2
// k-steps of x by a broadcast pair of weights, accumulating in f32: twice the multiply-adds of an
// f32 FMA per instruction. The weights are bf16 already, so they need no conversion either.
//
// Why: a prefill's matmuls run at ~90% of the cores' f32 FMA peak (gemm_impl.h's packed path);
// llama.cpp multiplies bf16 activations (ggml's bf16 vec-dot) and was 1.1-1.3x faster at prefill on
// the 2-core dev VM. What it costs: x's rounding, a relative 2^-9 a product at most, as
// transformers' own bf16 inference has in every matmul (the CUDA backend's activations are bf16
// throughout); sums stay f32. Decode (M <= ROWS_MAX_M) keeps f32 x: it is bound by the weights'
// bytes, not the multiply-adds. llm_set_isa(ISA_AVX512) turns it off (the tests compare both).
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
