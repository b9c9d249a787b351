// Portable 16-lane vectors (GCC vector extensions). A function compiled for AVX-512 maps a v16f
// onto one zmm register, for AVX2 onto two ymm, for the x86-64 baseline onto four xmm; so one
// source serves every target_clones clone. Helpers are always_inline so they take the target of
// the function they are inlined into.
#ifndef LLM_SIMD_H
#define LLM_SIMD_H

#include <stdint.h>
#include <string.h>

typedef float v16f __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

#define SIMD_INLINE static inline __attribute__((always_inline))

SIMD_INLINE v16f v16_load(const float *p) {
  v16f v;
  memcpy(&v, p, sizeof v);
  return v;
}

SIMD_INLINE void v16_store(float *p, v16f v) { memcpy(p, &v, sizeof v); }

// Shuffling lane 0 everywhere compiles to one broadcast (a plain `vector + scalar` would keep an
// add of 0.0, which is not an identity for -0.0).
SIMD_INLINE v16f v16_splat(float s) { return __builtin_shuffle((v16f){s}, (v16i){0}); }

// bf16 is the top half of an f32: widening and shifting is exact.
SIMD_INLINE v16f v16_load_bf16(const uint16_t *p) {
  v16h h;
  memcpy(&h, p, sizeof h);
  v16u u = __builtin_convertvector(h, v16u) << 16;
  return (v16f)u;
}

// Exact f16 -> f32 without F16C: place exponent+mantissa 13 bits up, which reads as an f32 with
// the exponent biased by 15 instead of 127 (subnormal f16 become subnormal f32), and multiply by
// 2^112 to fix the bias (exact: a power of two, and every f16 value is representable). Inf/NaN
// get the all-ones exponent instead.
SIMD_INLINE v16f v16_load_f16(const uint16_t *p) {
  v16h h;
  memcpy(&h, p, sizeof h);
  v16u x = __builtin_convertvector(h, v16u);
  v16u em = x & 0x7fff;
  v16u sign = (x & 0x8000) << 16;
  v16u bits = em << 13;
  v16f f = (v16f)bits * 0x1p112f;
  v16u r = (v16u)f;
  v16u special = (v16u)(em >= 0x7c00); // all ones where inf/nan
  r = (r & ~special) | ((bits | 0x7f800000u) & special);
  return (v16f)(r | sign);
}

SIMD_INLINE float v16_sum(v16f v) {
  // pairwise tree: 16 -> 1
  float s8[8], s4[4];
  for (int i = 0; i < 8; i++) s8[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

SIMD_INLINE float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

SIMD_INLINE float f16_to_f32(uint16_t h) {
  uint32_t em = h & 0x7fffu, sign = (uint32_t)(h & 0x8000u) << 16, bits = em << 13, r;
  float f;
  memcpy(&f, &bits, 4);
  f *= 0x1p112f;
  memcpy(&r, &f, 4);
  if (em >= 0x7c00u) r = bits | 0x7f800000u;
  r |= sign;
  memcpy(&f, &r, 4);
  return f;
}

// Element k of a row of dtype dt (f32/f16/bf16) as f32; for scalar tails.
SIMD_INLINE float load_elem(const void *p, int dt, int64_t k) {
  if (dt == 0) return ((const float *)p)[k];
  if (dt == 1) return f16_to_f32(((const uint16_t *)p)[k]);
  return bf16_to_f32(((const uint16_t *)p)[k]);
}

#endif
