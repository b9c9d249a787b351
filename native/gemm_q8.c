// Matmuls of quantized panel weights (DT_Q8_0_P16 .. DT_Q6_K_P16, DT_Q5_K_P16 .. DT_Q5_1_P16; quant_pack.c has the
// layout and the arithmetic) with AVX512-VNNI: per group of 4 k, one vpdpbusd adds 16 rows x 4 byte products
// of a panel into 16 int32 lanes, x's 4 bytes broadcast. A block's 8 groups sum exactly; then its
// int32 sums become f32, times d_x * d_w, into one f32 accumulator per output, blocks in order.
//
// Batch invariance: every element of y is that one chain whatever M is; M only picks the tile (x
// rows by panels: registers and cache reuse) and the threading. The f32 steps use the embedded-
// rounding intrinsics, which the compiler never fuses into an FMA (avx512f implies FMA, and GCC
// contracts a plain multiply and add), so the portable kernel computes the same bits.
//
// Q4_K runs Q4_0's nibble loop from zero (no offset) and subtracts each block's min term after it;
// Q5_K the same with each nibble vector or'ed with its fifth bits (a shift and a mask); Q4_1 / Q5_1 as
// Q4_K / Q5_K with the block's own f16 d and -m. IQ4_XS turns
// Q4_0's nibbles into its table's bytes with vpshufb (the table in each 128-bit lane), then runs as
// Q8_0 with the block's scale d * sc.
// Q6_K ors each nibble vector with its 2-bit high parts (two shifts and masks) and folds each half of
// the block into the f32 sum with the half's scale.
//
// Tiles: decode of one row takes 8 panels (Q4_0, Q4_K: 6; Q6_K: 4) at once, enough independent vpdpbusd chains to
// cover their latency while the panels stream from memory; two rows 4 panels; from three rows on,
// 4 x rows by 3 panels (the nibble kinds: 2, their unpacked nibbles take registers; Q6_K from two rows on). Work items are a tile's
// panels by up to 64 x rows (all rows at decode), so each panel group streams from memory once per
// item and stays in L2 while the row tiles pass.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,prefer-vector-width=512")
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"

#define RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define QMR 4 // x rows a tile at most
#define QNV 8 // panels a tile at most
#define QMC 64 // x rows a prefill work item

// As quant_x_rows_portable (quant_pack.c), 16 lanes at a time: the same IEEE divisions, the same
// rounding (nearest, ties to even) and clamp, so the same bytes.
static void quant_x_rows_avx512(const float *x, int8_t *xq, float *xd, int32_t *xc, int c_off, int sums, int64_t m0,
                                int64_t m1, int64_t K) {
  const int64_t KB = K / 32;
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
  for (int64_t m = m0; m < m1; m++)
    for (int64_t b = 0; b < KB; b++) {
      const float *v = x + m * K + b * 32;
      const __m512 a = _mm512_loadu_ps(v), c = _mm512_loadu_ps(v + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(a, absmask), _mm512_and_ps(c, absmask)));
      const float d = amax / 127.0f;
      __m512i qa = _mm512_setzero_si512(), qc = _mm512_setzero_si512();
      if (d > 0.0f) {
        const __m512 dv = _mm512_set1_ps(d);
        const __m512 ra = _mm512_roundscale_ps(_mm512_div_ps(a, dv), RN);
        const __m512 rc = _mm512_roundscale_ps(_mm512_div_ps(c, dv), RN);
        qa = _mm512_cvttps_epi32(_mm512_min_ps(_mm512_max_ps(ra, lo), hi));
        qc = _mm512_cvttps_epi32(_mm512_min_ps(_mm512_max_ps(rc, lo), hi));
      }
      _mm_storeu_si128((__m128i *)(xq + m * K + b * 32), _mm512_cvtepi32_epi8(qa));
      _mm_storeu_si128((__m128i *)(xq + m * K + b * 32 + 16), _mm512_cvtepi32_epi8(qc));
      xd[m * KB + b] = d;
      if (sums == 2) {
        xc[(m * KB + b) * 2] = -c_off * _mm512_reduce_add_epi32(qa);
        xc[(m * KB + b) * 2 + 1] = -c_off * _mm512_reduce_add_epi32(qc);
      } else {
        xc[m * KB + b] = -c_off * _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qc));
      }
    }
}

static inline int32_t load4(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return v;
}

// acc[i][v] = y of x row xr[i] by the 16 rows of panel wp[v], over all KB blocks. Q4: the kind (QK_*,
// llm.h; cr then holds what quant_x_offset / quant_x_sums say for it).
static inline __attribute__((always_inline)) void qtile(const int MR, const int NV, const int Q4,
                                                        const int8_t *const *xr, const float *const *dr,
                                                        const int32_t *const *cr, const uint8_t *const *wp,
                                                        int64_t KB, __m512 acc[QMR][QNV]) {
  const int64_t qb = quant_quants_bytes(Q4);
  const __m512i nib = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10);
  // IQ4_XS: ggml's kvalues_iq4nl + 128 in each 128-bit lane, for vpshufb
  const __m512i iq4 = _mm512_broadcast_i32x4(_mm_setr_epi8((char)1, (char)24, (char)45, (char)63, (char)79, (char)93, (char)106,
                                                            (char)118, (char)129, (char)141, (char)153, (char)166, (char)181,
                                                            (char)197, (char)217, (char)241));
  const uint16_t *sc[QNV];
  for (int v = 0; v < NV; v++) sc[v] = (const uint16_t *)(wp[v] + KB * qb); // Q8_0, Q4_0
  for (int i = 0; i < MR; i++)
    for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();
  for (int64_t b = 0; b < KB; b++) {
    __m512i ia[QMR][QNV];
    if (Q4 == QK_Q6_K) {
      const __m512i m30 = _mm512_set1_epi8(0x30);
      __m512i h0[QNV], h1[QNV];
      for (int v = 0; v < NV; v++) {
        h0[v] = _mm512_loadu_si512(wp[v] + b * 384 + 256);
        h1[v] = _mm512_loadu_si512(wp[v] + b * 384 + 320);
      }
#pragma GCC unroll 2
      for (int h = 0; h < 2; h++) {
        for (int i = 0; i < MR; i++) {
          const __m512i c0 = _mm512_set1_epi32(cr[i][2 * b + h]);
          for (int v = 0; v < NV; v++) ia[i][v] = c0;
        }
#pragma GCC unroll 2
        for (int j = 2 * h; j < 2 * h + 2; j++) {
          __m512i lq[QNV], hq[QNV];
          for (int v = 0; v < NV; v++) {
            const __m512i r = _mm512_loadu_si512(wp[v] + b * 384 + j * 64);
            // bits 2j, 2j + 1 of each high-part byte moved to bits 4, 5 (16-bit shifts: the mask
            // drops what crosses from the neighbouring byte)
            __m512i u0, u1;
            if (j == 0) u0 = _mm512_slli_epi16(h0[v], 4), u1 = _mm512_slli_epi16(h1[v], 4);
            else if (j == 1) u0 = _mm512_slli_epi16(h0[v], 2), u1 = _mm512_slli_epi16(h1[v], 2);
            else if (j == 2) u0 = h0[v], u1 = h1[v];
            else u0 = _mm512_srli_epi16(h0[v], 2), u1 = _mm512_srli_epi16(h1[v], 2);
            lq[v] = _mm512_or_si512(_mm512_and_si512(r, nib), _mm512_and_si512(u0, m30));
            hq[v] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(r, 4), nib), _mm512_and_si512(u1, m30));
          }
          for (int i = 0; i < MR; i++) {
            const __m512i xa = _mm512_set1_epi32(load4(xr[i] + b * 32 + 8 * j));
            const __m512i xb = _mm512_set1_epi32(load4(xr[i] + b * 32 + 8 * j + 4));
            for (int v = 0; v < NV; v++) {
              ia[i][v] = _mm512_dpbusd_epi32(ia[i][v], lq[v], xa);
              ia[i][v] = _mm512_dpbusd_epi32(ia[i][v], hq[v], xb);
            }
          }
        }
        __m512 dw[QNV];
        for (int v = 0; v < NV; v++) {
          const int8_t *ks = (const int8_t *)(wp[v] + KB * 384) + b * 32 + h * 16;
          const uint16_t *kd = (const uint16_t *)(wp[v] + KB * 384 + KB * 32) + (b / 8) * 16;
          const __m512 scv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)ks)));
          dw[v] = _mm512_mul_round_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)kd)), scv, RN);
        }
        for (int i = 0; i < MR; i++) {
          const __m512 dx = _mm512_set1_ps(dr[i][b]);
          for (int v = 0; v < NV; v++) {
            const __m512 s = _mm512_mul_round_ps(dx, dw[v], RN);
            acc[i][v] = _mm512_add_round_ps(acc[i][v], _mm512_mul_round_ps(_mm512_cvtepi32_ps(ia[i][v]), s, RN), RN);
          }
        }
      }
      continue;
    }
    const int kmin = quant_has_min(Q4), five = quant_has_fifth(Q4); // a min per block, no offset; fifth bits
    for (int i = 0; i < MR; i++) {
      const __m512i c0 = kmin ? _mm512_setzero_si512() : _mm512_set1_epi32(cr[i][b]);
      for (int v = 0; v < NV; v++) ia[i][v] = c0;
    }
    if (Q4) {
      __m512i h5[QNV];
      if (five)
        for (int v = 0; v < NV; v++) h5[v] = _mm512_loadu_si512(wp[v] + b * qb + 256);
      for (int j = 0; j < 4; j++) {
        __m512i l4[QNV], h4[QNV];
        for (int v = 0; v < NV; v++) {
          const __m512i r = _mm512_loadu_si512(wp[v] + b * qb + j * 64);
          l4[v] = _mm512_and_si512(r, nib);
          h4[v] = _mm512_and_si512(_mm512_srli_epi16(r, 4), nib);
          if (five) {
            // bits 2j and 2j + 1 of each fifth-bit byte moved to bit 4 (16-bit shifts of at most 4:
            // bit 4 of either byte comes from its own byte)
            __m512i u0, u1;
            if (j == 0) u0 = _mm512_slli_epi16(h5[v], 4), u1 = _mm512_slli_epi16(h5[v], 3);
            else if (j == 1) u0 = _mm512_slli_epi16(h5[v], 2), u1 = _mm512_slli_epi16(h5[v], 1);
            else if (j == 2) u0 = h5[v], u1 = _mm512_srli_epi16(h5[v], 1);
            else u0 = _mm512_srli_epi16(h5[v], 2), u1 = _mm512_srli_epi16(h5[v], 3);
            l4[v] = _mm512_or_si512(l4[v], _mm512_and_si512(u0, m10));
            h4[v] = _mm512_or_si512(h4[v], _mm512_and_si512(u1, m10));
          } else if (Q4 == QK_IQ4_XS) {
            l4[v] = _mm512_shuffle_epi8(iq4, l4[v]);
            h4[v] = _mm512_shuffle_epi8(iq4, h4[v]);
          }
        }
        for (int i = 0; i < MR; i++) {
          const __m512i xa = _mm512_set1_epi32(load4(xr[i] + b * 32 + 8 * j));
          const __m512i xb = _mm512_set1_epi32(load4(xr[i] + b * 32 + 8 * j + 4));
          for (int v = 0; v < NV; v++) {
            ia[i][v] = _mm512_dpbusd_epi32(ia[i][v], l4[v], xa);
            ia[i][v] = _mm512_dpbusd_epi32(ia[i][v], h4[v], xb);
          }
        }
      }
    } else {
      for (int g = 0; g < 8; g++) {
        __m512i wv[QNV];
        for (int v = 0; v < NV; v++) wv[v] = _mm512_loadu_si512(wp[v] + b * 512 + g * 64);
        for (int i = 0; i < MR; i++) {
          const __m512i xa = _mm512_set1_epi32(load4(xr[i] + b * 32 + 4 * g));
          for (int v = 0; v < NV; v++) ia[i][v] = _mm512_dpbusd_epi32(ia[i][v], wv[v], xa);
        }
      }
    }
    __m512 dw[QNV];
    if (kmin) {
      // d * sc and dmin * mn, exact; acc = (acc + i_b (d_x d_w)) - s_b (d_x m_w)
      __m512 mw[QNV];
      for (int v = 0; v < NV; v++) {
        if (Q4 == QK_Q4_1 || Q4 == QK_Q5_1) { // the block's d and -m, f16
          const uint16_t *d1 = (const uint16_t *)(wp[v] + KB * qb) + b * 16;
          dw[v] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)d1));
          mw[v] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d1 + KB * 16)));
          continue;
        }
        const uint8_t *ks = wp[v] + KB * qb;
        const uint16_t *kd = (const uint16_t *)(ks + KB * 32) + (b / 8) * 16;
        const __m512 scv = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(ks + b * 16))));
        const __m512 mnv = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(ks + KB * 16 + b * 16))));
        dw[v] = _mm512_mul_round_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)kd)), scv, RN);
        mw[v] = _mm512_mul_round_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kd + (KB / 8) * 16))), mnv, RN);
      }
      for (int i = 0; i < MR; i++) {
        const __m512 dx = _mm512_set1_ps(dr[i][b]), sx = _mm512_set1_ps((float)cr[i][b]);
        for (int v = 0; v < NV; v++) {
          const __m512 s = _mm512_mul_round_ps(dx, dw[v], RN), t = _mm512_mul_round_ps(dx, mw[v], RN);
          const __m512 a = _mm512_add_round_ps(acc[i][v], _mm512_mul_round_ps(_mm512_cvtepi32_ps(ia[i][v]), s, RN), RN);
          acc[i][v] = _mm512_sub_round_ps(a, _mm512_mul_round_ps(sx, t, RN), RN);
        }
      }
      continue;
    }
    if (Q4 == QK_IQ4_XS) {
      // d * sc, exact
      for (int v = 0; v < NV; v++) {
        const int8_t *ks = (const int8_t *)(wp[v] + KB * 256) + b * 16;
        const uint16_t *kd = (const uint16_t *)(wp[v] + KB * 256 + KB * 16) + (b / 8) * 16;
        const __m512 scv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)ks)));
        dw[v] = _mm512_mul_round_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)kd)), scv, RN);
      }
    } else {
      for (int v = 0; v < NV; v++) dw[v] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc[v] + b * 16)));
    }
    for (int i = 0; i < MR; i++) {
      const __m512 dx = _mm512_set1_ps(dr[i][b]);
      for (int v = 0; v < NV; v++) {
        const __m512 s = _mm512_mul_round_ps(dx, dw[v], RN);
        acc[i][v] = _mm512_add_round_ps(acc[i][v], _mm512_mul_round_ps(_mm512_cvtepi32_ps(ia[i][v]), s, RN), RN);
      }
    }
  }
}

typedef struct {
  const int8_t *xq;
  const float *xd;
  const int32_t *xc;
  const uint8_t *w;
  const float *bias;
  float *y;
  int64_t M, N, K, KB, P, pb;
} qctx;

// The tile at x rows m0 .. m0 + mr (rows past mr repeat m0) by panels p0 .. p0 + np (panels past np
// repeat p0); only rows below mr and panels below np (and columns below N) are stored.
static inline __attribute__((always_inline)) void qrun(const int MR, const int NV, const int Q4, const qctx *c,
                                                       int64_t m0, int64_t mr, int64_t p0, int64_t np) {
  const int8_t *xr[QMR];
  const float *dr[QMR];
  const int32_t *cr[QMR];
  const uint8_t *wp[QNV];
  for (int i = 0; i < MR; i++) {
    const int64_t m = m0 + (i < mr ? i : 0);
    xr[i] = c->xq + m * c->K;
    dr[i] = c->xd + m * c->KB;
    cr[i] = c->xc + m * c->KB * quant_x_sums(Q4);
  }
  for (int v = 0; v < NV; v++) wp[v] = c->w + (p0 + (v < np ? v : 0)) * c->pb;
  __m512 acc[QMR][QNV];
  qtile(MR, NV, Q4, xr, dr, cr, wp, c->KB, acc);
  for (int v = 0; v < NV && v < np; v++) {
    const int64_t n0 = (p0 + v) * 16;
    if (n0 >= c->N) break;
    const __mmask16 mask = c->N - n0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (c->N - n0)) - 1u);
    const __m512 bv = c->bias ? _mm512_maskz_loadu_ps(mask, c->bias + n0) : _mm512_setzero_ps();
    for (int i = 0; i < MR && i < mr; i++) {
      const __m512 r = c->bias ? _mm512_add_round_ps(acc[i][v], bv, RN) : acc[i][v];
      _mm512_mask_storeu_ps(c->y + (m0 + i) * c->N + n0, mask, r);
    }
  }
}

#define QRUN(MR_, NV_, Q4_) qrun(MR_, NV_, Q4_, c, m0, mr, p0, np)

// One tile of mr rows (1..4) by the item's nv panels (nv fixed per call by M, see gemm_quant_vnni).
static void run_tile(const qctx *c, int q4, int nv, int64_t m0, int64_t mr, int64_t p0, int64_t np) {
  if (q4 == QK_Q6_K) {
    if (nv == 4) QRUN(1, 4, 3);
    else if (mr == 1) QRUN(1, 2, 3);
    else if (mr == 2) QRUN(2, 2, 3);
    else if (mr == 3) QRUN(3, 2, 3);
    else QRUN(4, 2, 3);
  } else if (q4 == QK_Q4_K) {
    if (nv == 6) QRUN(1, 6, 2);
    else if (nv == 4) QRUN(2, 4, 2);
    else if (mr == 1) QRUN(1, 2, 2);
    else if (mr == 2) QRUN(2, 2, 2);
    else if (mr == 3) QRUN(3, 2, 2);
    else QRUN(4, 2, 2);
  } else if (q4 == QK_Q5_K) {
    if (nv == 6) QRUN(1, 6, 4);
    else if (nv == 4) QRUN(2, 4, 4);
    else if (mr == 1) QRUN(1, 2, 4);
    else if (mr == 2) QRUN(2, 2, 4);
    else if (mr == 3) QRUN(3, 2, 4);
    else QRUN(4, 2, 4);
  } else if (q4 == QK_Q4_1) {
    if (nv == 6) QRUN(1, 6, 6);
    else if (nv == 4) QRUN(2, 4, 6);
    else if (mr == 1) QRUN(1, 2, 6);
    else if (mr == 2) QRUN(2, 2, 6);
    else if (mr == 3) QRUN(3, 2, 6);
    else QRUN(4, 2, 6);
  } else if (q4 == QK_Q5_1) {
    if (nv == 6) QRUN(1, 6, 7);
    else if (nv == 4) QRUN(2, 4, 7);
    else if (mr == 1) QRUN(1, 2, 7);
    else if (mr == 2) QRUN(2, 2, 7);
    else if (mr == 3) QRUN(3, 2, 7);
    else QRUN(4, 2, 7);
  } else if (q4 == QK_IQ4_XS) {
    if (nv == 6) QRUN(1, 6, 5);
    else if (nv == 4) QRUN(2, 4, 5);
    else if (mr == 1) QRUN(1, 2, 5);
    else if (mr == 2) QRUN(2, 2, 5);
    else if (mr == 3) QRUN(3, 2, 5);
    else QRUN(4, 2, 5);
  } else if (q4) {
    if (nv == 6) QRUN(1, 6, 1);
    else if (nv == 4) QRUN(2, 4, 1);
    else if (mr == 1) QRUN(1, 2, 1);
    else if (mr == 2) QRUN(2, 2, 1);
    else if (mr == 3) QRUN(3, 2, 1);
    else QRUN(4, 2, 1);
  } else {
    if (nv == 8) QRUN(1, 8, 0);
    else if (nv == 4) QRUN(2, 4, 0);
    else if (mr == 1) QRUN(1, 3, 0);
    else if (mr == 2) QRUN(2, 3, 0);
    else if (mr == 3) QRUN(3, 3, 0);
    else QRUN(4, 3, 0);
  }
}
#undef QRUN

// One work item of gemm_quant_vnni: nv panels of weights by up to mc rows of x (item = panel tile x
// row tile, panel-major), QMR rows at a time.
typedef struct {
  const qctx *c;
  int q4, nv;
  int64_t P, MT, mc, M;
} qitems;

static void quant_item(void *arg, int64_t it, int thread) {
  (void)thread;
  const qitems *a = arg;
  const int64_t pt = it / a->MT, mt = it % a->MT;
  const int64_t p0 = pt * a->nv, np = a->P - p0 < a->nv ? a->P - p0 : a->nv;
  const int64_t m1 = (mt + 1) * a->mc < a->M ? (mt + 1) * a->mc : a->M;
  for (int64_t m0 = mt * a->mc; m0 < m1; m0 += QMR) run_tile(a->c, a->q4, a->nv, m0, m1 - m0 < QMR ? m1 - m0 : QMR, p0, np);
}

void gemm_quant_vnni(const float *x, const void *w, int dt, const float *bias, float *y, int64_t M, int64_t N,
                     int64_t K) {
  const int q4 = quant_kind(dt), sums = quant_x_sums(q4);
  const int64_t KB = K / 32, P = (N + 15) / 16;
  int8_t *xq = aligned_alloc(64, ((size_t)(M * K) + 63) / 64 * 64);
  float *xd = malloc((size_t)(M * KB) * sizeof(float) + 64);
  int32_t *xc = malloc((size_t)(M * KB * sums) * sizeof(int32_t) + 64);
  const qctx c = {xq, xd, xc, w, bias, y, M, N, K, KB, P, (int64_t)quant_p16_bytes(16, K, dt)};
  // the tile's panels, by M alone (1 row: 8, 6 or 4; 2 rows: 4 or 2; more: 3 or 2); rows 4 at a time
  const int nv = q4 == QK_Q6_K ? (M == 1 ? 4 : 2) : M == 1 ? (q4 ? 6 : 8) : M == 2 ? 4 : (q4 ? 2 : 3);
  const int64_t mc = M <= ROWS_MAX_M ? M : QMC;
  const int64_t PT = (P + nv - 1) / nv, MT = (M + mc - 1) / mc, XT = (M + 15) / 16;
  const int parallel = M > ROWS_MAX_M || quant_p16_bytes(N, K, dt) >= llm_gemv_parallel_min_bytes();
  const qitems items = {&c, q4, nv, P, MT, mc, M};
  if (XT == 1) {
    // decode: one tile of x rows, quantized here (inside a team it would cost a barrier, more than
    // the rows take); the items on the decode team (pool.c), or on this thread for small matrices
    quant_x_rows_avx512(x, xq, xd, xc, quant_x_offset(q4), sums, 0, M, K);
    if (parallel) llm_pool_for(PT * MT, quant_item, (void *)&items);
    else
      for (int64_t it = 0; it < PT * MT; it++) quant_item((void *)&items, it, 0);
  } else {
#pragma omp parallel
    {
#pragma omp for schedule(static)
      for (int64_t t = 0; t < XT; t++)
        quant_x_rows_avx512(x, xq, xd, xc, quant_x_offset(q4), sums, t * 16, (t + 1) * 16 < M ? (t + 1) * 16 : M, K);
#pragma omp for schedule(dynamic, 1) nowait
      for (int64_t it = 0; it < PT * MT; it++) quant_item((void *)&items, it, 0);
    }
  }
  free(xq);
  free(xd);
  free(xc);
}
