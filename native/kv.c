// writeKv: k, v [T, kvHeads, headDim] into the paged pools [numBlocks, blockSize, kvHeads, headDim]
// at flat slot = block * blockSize + offset; slot -1 skips the token (e.g. padding).
//
// What each pool dtype keeps of a row x[0..D) (one token, one kv head):
//   f32   x itself;
//   bf16  each x_d rounded to nearest even (NaN stays a quiet NaN);
//   int8  amax = max |x_d|, scale = amax / 127, q_d = x_d * (127 / amax) rounded to nearest even
//         (clamped to [-127, 127]), all f32 operations: element d reads back as q_d * scale;
//   fp8   the same with 448 (e4m3's largest value) for 127 and q_d rounded to the nearest e4m3
//         value, ties to even (kv_format.h f32_to_e4m3).
// A one-byte row whose amax is below 2^-100 is all zeros with scale 0 (so 127 / amax stays finite
// and the scale a normal f32); a row holding a NaN or an infinity keeps scale NaN, so attention
// over it gives NaN as f32 would.
#include <float.h>
#include <math.h>
#include <string.h>

#include "kv_format.h"
#include "llm.h"

#define KV8_AMAX_MIN 0x1p-100f

// f32 -> bf16, rounded to nearest even (NaN stays a quiet NaN)
static inline uint16_t f32_to_bf16_rne(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// One row of D floats into a DT_KV_INT8 / DT_KV_FP8 pool row (kv_format.h), as stated above.
static void quantize_row(uint8_t *dst, const float *x, int64_t D, int dt) {
  float amax = 0.0f;
  int finite = 1;
  for (int64_t d = 0; d < D; d++) {
    const float a = fabsf(x[d]);
    finite &= a <= FLT_MAX;
    amax = a > amax ? a : amax;
  }
  const float top = dt == DT_KV_INT8 ? KV_INT8_MAX : KV_FP8_MAX;
  float scale = 0.0f;
  if (!finite) scale = NAN;
  else if (amax >= KV8_AMAX_MIN) {
    scale = amax / top;
    const float inv = top / amax;
    for (int64_t d = 0; d < D; d++) {
      const float y = x[d] * inv;
      if (dt == DT_KV_INT8) {
        const float r = rintf(y);
        dst[d] = (uint8_t)(int8_t)(r > KV_INT8_MAX ? KV_INT8_MAX : r < -KV_INT8_MAX ? -KV_INT8_MAX : r);
      } else dst[d] = f32_to_e4m3(y);
    }
  }
  if (scale == 0.0f || !finite) memset(dst, 0, (size_t)D);
  memcpy(dst + D, &scale, 4);
}

static void write_row(void *pool, int dt, int64_t slot, const float *x, int64_t rf, int64_t D) {
  if (dt == DT_F32) {
    memcpy((float *)pool + slot * rf, x, (size_t)rf * sizeof(float));
  } else if (dt == DT_BF16) {
    uint16_t *p = (uint16_t *)pool + slot * rf;
    for (int64_t e = 0; e < rf; e++) p[e] = f32_to_bf16_rne(x[e]);
  } else {
    const size_t rb = kv_row_bytes(dt, D);
    uint8_t *p = (uint8_t *)pool + (size_t)slot * (size_t)(rf / D) * rb;
    for (int64_t h = 0; h < rf / D; h++) quantize_row(p + h * rb, x + h * D, D, dt);
  }
}

// i: [kpool, vpool, k, v, slots, T, row_floats (kvHeads*headDim), num_slots, pool dtype, headDim]
static int exec_write_kv(const llm_cmd *c) {
  const float *k = PTR(c->i[2]), *v = PTR(c->i[3]);
  const int32_t *slots = PTR(c->i[4]);
  const int64_t T = c->i[5], rf = c->i[6], ns = c->i[7], D = c->i[9];
  const int dt = (int)c->i[8];
  if (!dt_kv(dt)) return llm_fail("writeKv: pool dtype %d is not a KV dtype", dt);
  if (D <= 0 || rf % D != 0) return llm_fail("writeKv: row of %lld floats is not whole heads of %lld", (long long)rf, (long long)D);
  for (int64_t t = 0; t < T; t++)
    if (slots[t] < -1 || slots[t] >= ns)
      return llm_fail("writeKv: slot %d of token %lld is out of range [-1, %lld)", slots[t], (long long)t,
                      (long long)ns);
  for (int64_t t = 0; t < T; t++) {
    if (slots[t] < 0) continue;
    write_row(PTR(c->i[0]), dt, slots[t], k + t * rf, rf, D);
    write_row(PTR(c->i[1]), dt, slots[t], v + t * rf, rf, D);
  }
  return 0;
}

LLM_EXPORT void llm_op_write_kv(int64_t kpool, int64_t vpool, int64_t k, int64_t v, int64_t slots, int64_t T,
                                int64_t row_floats, int64_t num_slots, int64_t dtype, int64_t head_dim) {
  llm_cmd c = {.exec = exec_write_kv, .i = {kpool, vpool, k, v, slots, T, row_floats, num_slots, dtype, head_dim}};
  llm_enqueue(&c);
}
