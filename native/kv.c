// writeKv: k, v [T, kvHeads, headDim] into the paged pools [numBlocks, blockSize, kvHeads, headDim]
// at flat slot = block * blockSize + offset; slot -1 skips the token (e.g. padding).
#include <string.h>

#include "llm.h"

// f32 -> bf16, rounded to nearest even (NaN stays a quiet NaN)
static inline uint16_t f32_to_bf16_rne(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// i: [kpool, vpool, k, v, slots, T, row_floats (kvHeads*headDim), num_slots, pool dtype (DT_F32 or DT_BF16)]
static int exec_write_kv(const llm_cmd *c) {
  const float *k = PTR(c->i[2]), *v = PTR(c->i[3]);
  const int32_t *slots = PTR(c->i[4]);
  const int64_t T = c->i[5], rf = c->i[6], ns = c->i[7];
  const int dt = (int)c->i[8];
  for (int64_t t = 0; t < T; t++)
    if (slots[t] < -1 || slots[t] >= ns)
      return llm_fail("writeKv: slot %d of token %lld is out of range [-1, %lld)", slots[t], (long long)t,
                      (long long)ns);
  for (int64_t t = 0; t < T; t++) {
    if (slots[t] < 0) continue;
    if (dt == DT_F32) {
      float *kp = PTR(c->i[0]), *vp = PTR(c->i[1]);
      memcpy(kp + (size_t)slots[t] * rf, k + t * rf, (size_t)rf * sizeof(float));
      memcpy(vp + (size_t)slots[t] * rf, v + t * rf, (size_t)rf * sizeof(float));
    } else {
      uint16_t *kp = (uint16_t *)PTR(c->i[0]) + (size_t)slots[t] * rf, *vp = (uint16_t *)PTR(c->i[1]) + (size_t)slots[t] * rf;
      for (int64_t e = 0; e < rf; e++) {
        kp[e] = f32_to_bf16_rne(k[t * rf + e]);
        vp[e] = f32_to_bf16_rne(v[t * rf + e]);
      }
    }
  }
  return 0;
}

LLM_EXPORT void llm_op_write_kv(int64_t kpool, int64_t vpool, int64_t k, int64_t v, int64_t slots, int64_t T,
                                int64_t row_floats, int64_t num_slots, int64_t dtype) {
  llm_cmd c = {.exec = exec_write_kv, .i = {kpool, vpool, k, v, slots, T, row_floats, num_slots, dtype}};
  llm_enqueue(&c);
}
