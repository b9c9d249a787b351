// bf16 matmul weights in panels (DT_BF16_P16): the CPU backend's layout for the bf16 weights of
// a CPU with AVX512-BF16, made once at load (llm_op_pack_bf16_p16).
//
// Why: with rows of w in vector lanes, one multiply-add chain per output element serves every M.
// A row-major w puts k in the lanes instead, and each element's sum then ends in a reduction tree
// over the lanes (what gemm_bf16.c's row-major kernels pay: about a quarter of the multiply-adds
// at K = 384), or the rows must be transposed into lanes on every call (what decode could not
// afford). Panels give both paths lanes of rows straight from memory: decode streams them, prefill
// broadcasts x, and neither transposes or reduces.
//
// Layout: panel p holds rows 16p .. 16p + 15 of w[N][K] (K even) as K/2 vectors of 16 32-bit
// words, word (k2, l) = the pair (w[16p + l][2 k2], w[16p + l][2 k2 + 1]) (low half first, as
// vdpbf16ps reads pairs); rows past N are zero. p16_bytes() is its size.
//
// Besides the AVX512-BF16 kernels (gemm_bf16.c), the other ISAs (forced by llm_set_isa, as the
// tests do) read the layout with the portable kernel here: each output element is the f32
// multiply-add chain over k in order, as the row-major f32 kernels compute it.
#include <string.h>

#include "llm.h"
#include "simd.h"

#define P16_KB 256 // k pairs copied per block: a panel block (16 KiB) stays in L1 while 16 rows fill it

static void pack_panel(uint32_t *dst, const uint16_t *w, int64_t N, int64_t K, int64_t p) {
  const int64_t K2 = K / 2;
  for (int64_t k0 = 0; k0 < K2; k0 += P16_KB) {
    const int64_t k1 = K2 - k0 < P16_KB ? K2 : k0 + P16_KB;
    for (int64_t l = 0; l < 16; l++) {
      const int64_t n = p * 16 + l;
      if (n >= N) {
        for (int64_t k2 = k0; k2 < k1; k2++) dst[k2 * 16 + l] = 0;
        continue;
      }
      const uint16_t *row = w + n * K;
      for (int64_t k2 = k0; k2 < k1; k2++) {
        uint32_t pair;
        memcpy(&pair, row + 2 * k2, sizeof pair);
        dst[k2 * 16 + l] = pair;
      }
    }
  }
}

// i: [src (bf16 [N][K]), dst (p16_bytes(N, K)), N, K]
static int exec_pack_bf16_p16(const llm_cmd *c) {
  const uint16_t *w = PTR(c->i[0]);
  uint32_t *dst = PTR(c->i[1]);
  const int64_t N = c->i[2], K = c->i[3];
  if (K % 2 != 0) return llm_fail("packBf16P16: K = %lld is odd", (long long)K);
  const int64_t P = (N + 15) / 16;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < P; p++) pack_panel(dst + p * 8 * K, w, N, K, p);
  return 0;
}

LLM_EXPORT void llm_op_pack_bf16_p16(int64_t src, int64_t dst, int64_t N, int64_t K) {
  llm_cmd c = {.exec = exec_pack_bf16_p16, .i = {src, dst, N, K}};
  llm_enqueue(&c);
}

LLM_EXPORT int64_t llm_p16_bytes(int64_t N, int64_t K) { return (int64_t)p16_bytes(N, K); }

void p16_row_to_f32(float *dst, const void *w, int64_t n, int64_t K) {
  const uint32_t *panel = (const uint32_t *)w + (n / 16) * 8 * K;
  const int64_t l = n % 16;
  for (int64_t k2 = 0; k2 < K / 2; k2++) {
    const uint32_t pair = panel[k2 * 16 + l];
    dst[2 * k2] = bf16_to_f32((uint16_t)pair);
    dst[2 * k2 + 1] = bf16_to_f32((uint16_t)(pair >> 16));
  }
}

// ---- the portable kernel ------------------------------------------------------------------------

#define GP_MR 4 // x rows a tile

// y[m0 + i][16 p + l] for i < mr, l < nl: lane l of the panel's chain over k in order. The tile's
// x values are staged first (rows past mr as zeros), so the arithmetic loops have fixed trip counts
// and read nothing outside x.
CLONES static void p16_tile(const float *x, const uint32_t *panel, const float *bias, float *y, int64_t N, int64_t K,
                            int64_t m0, int64_t mr, int64_t n0, int64_t nl) {
  float acc[GP_MR][16];
  memset(acc, 0, sizeof acc);
  for (int64_t k2 = 0; k2 < K / 2; k2++) {
    const uint32_t *u = panel + k2 * 16;
    float lo[16], hi[16], xa[GP_MR], xb[GP_MR];
    for (int l = 0; l < 16; l++) {
      const uint32_t a = u[l] << 16, b = u[l] & 0xFFFF0000u;
      memcpy(&lo[l], &a, 4);
      memcpy(&hi[l], &b, 4);
    }
    for (int i = 0; i < GP_MR; i++) {
      xa[i] = i < mr ? x[(m0 + i) * K + 2 * k2] : 0.0f;
      xb[i] = i < mr ? x[(m0 + i) * K + 2 * k2 + 1] : 0.0f;
    }
    for (int i = 0; i < GP_MR; i++) {
      for (int l = 0; l < 16; l++) acc[i][l] += xa[i] * lo[l];
      for (int l = 0; l < 16; l++) acc[i][l] += xb[i] * hi[l];
    }
  }
  for (int64_t i = 0; i < mr; i++)
    for (int64_t l = 0; l < nl; l++) y[(m0 + i) * N + n0 + l] = acc[i][l] + (bias ? bias[n0 + l] : 0.0f);
}

void gemm_p16_portable(const float *x, const void *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K) {
  const int64_t P = (N + 15) / 16, T = (M + GP_MR - 1) / GP_MR;
#pragma omp parallel for schedule(dynamic, 1) collapse(2)
  for (int64_t p = 0; p < P; p++)
    for (int64_t t = 0; t < T; t++) {
      const int64_t m0 = t * GP_MR, n0 = p * 16;
      p16_tile(x, (const uint32_t *)w + p * 8 * K, bias, y, N, K, m0, M - m0 < GP_MR ? M - m0 : GP_MR, n0,
               N - n0 < 16 ? N - n0 : 16);
    }
}
