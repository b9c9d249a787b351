// dtype conversion of contiguous runs (weight loading, embedding rows, matmul weight panels).
#include "llm.h"
#include "simd.h"

CLONES static void cvt_bf16(float *dst, const uint16_t *src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) v16_store(dst + i, v16_load_bf16(src + i));
  for (; i < n; i++) dst[i] = bf16_to_f32(src[i]);
}

CLONES static void cvt_f16(float *dst, const uint16_t *src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) v16_store(dst + i, v16_load_f16(src + i));
  for (; i < n; i++) dst[i] = f16_to_f32(src[i]);
}

void cvt_to_f32(float *dst, const void *src, int src_dtype, size_t n) {
  if (src_dtype == DT_BF16) cvt_bf16(dst, src, n);
  else if (src_dtype == DT_F16) cvt_f16(dst, src, n);
  else memmove(dst, src, n * sizeof(float));
}
