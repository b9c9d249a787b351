// Rotary embedding, rotate-half convention (HF llama / GPT-NeoX):
//   for i < half: (x1, x2) = (x[i], x[i + half]);
//   out[i] = x1*cos - x2*sin, out[i + half] = x2*cos + x1*sin,
// with angle = f32(pos) * invFreq[i] rounded to f32 and cos/sin taken in f32, times
// attentionScaling, exactly as transformers builds its cos/sin tables. Dims >= 2*half pass through.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"

CLONES static void rope_heads(float *y, const float *x, const float *cs, const float *sn, int64_t H, int64_t D,
                              int64_t half) {
  for (int64_t h = 0; h < H; h++) {
    const float *xh = x + h * D;
    float *yh = y + h * D;
    for (int64_t i = 0; i < half; i++) {
      const float x1 = xh[i], x2 = xh[i + half];
      yh[i] = x1 * cs[i] - x2 * sn[i];
      yh[i + half] = x2 * cs[i] + x1 * sn[i];
    }
    for (int64_t i = 2 * half; i < D; i++) yh[i] = xh[i];
  }
}

// i: [x, pos, invFreq, out, T, H, D, half, invStride]; f: [attentionScaling]
// invStride 0: one table shared by every token; half: one table per token ([T, half]).
static int exec_rope(const llm_cmd *c) {
  const float *x = PTR(c->i[0]), *inv_all = PTR(c->i[2]);
  const int32_t *pos = PTR(c->i[1]);
  float *y = PTR(c->i[3]);
  const int64_t T = c->i[4], H = c->i[5], D = c->i[6], half = c->i[7], inv_stride = c->i[8];
  const float att = (float)c->f[0];
  PARALLEL_RANGE(T, 32768 / (H * D > 0 ? H * D : 1) + 1, {
    float *tab = malloc((size_t)(2 * half + 1) * sizeof(float)); // cos [half], sin [half]
    for (int64_t t = i0; t < i1; t++) {
      const float *inv = inv_all + t * inv_stride;
      for (int64_t i = 0; i < half; i++) {
        const float angle = (float)pos[t] * inv[i];
        tab[i] = cosf(angle) * att;
        tab[half + i] = sinf(angle) * att;
      }
      rope_heads(y + t * H * D, x + t * H * D, tab, tab + half, H, D, half);
    }
    free(tab);
  });
  return 0;
}

LLM_EXPORT void llm_op_rope(int64_t x, int64_t pos, int64_t inv_freq, int64_t out, int64_t T, int64_t H,
                            int64_t D, int64_t half, int64_t inv_stride, double attention_scaling) {
  llm_cmd c = {.exec = exec_rope, .i = {x, pos, inv_freq, out, T, H, D, half, inv_stride}, .f = {attention_scaling}};
  llm_enqueue(&c);
}
