// Branch-free float helpers that GCC auto-vectorises inside CLONES loops (libm's expf/tanhf are
// scalar calls without -ffast-math).
#ifndef LLM_FASTMATH_H
#define LLM_FASTMATH_H

#include <stdint.h>
#include <string.h>

// exp(x) within ~2 ulp for x in [-87.3, 88.7] (clamped outside: exp(-inf) gives ~6e-39, which
// every caller treats as 0 next to a term >= 1). Cephes' expf: x = n ln2 + r, |r| <= ln2/2,
// exp(r) by a degree-6 polynomial, 2^n put into the exponent bits.
static inline __attribute__((always_inline)) float fast_expf(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.7f ? 88.7f : x;
  // round-to-nearest integer via the 1.5 * 2^23 trick (exact arithmetic, so not folded away)
  const float t = x * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  const float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r2 + r + 1.0f;
  int32_t tb, pb;
  memcpy(&tb, &t, 4);
  memcpy(&pb, &p, 4);
  pb += (tb - 0x4b400000) << 23; // n = bits(t) - bits(1.5 * 2^23)
  memcpy(&p, &pb, 4);
  return p;
}

// tanh(x) = 1 - 2 / (exp(2x) + 1), and the odd Taylor polynomial near 0 where that formula's
// absolute error (~1e-7) would be large relative to x. Saturates to +-1.
static inline __attribute__((always_inline)) float fast_tanhf(float x) {
  const float t = 1.0f - 2.0f / (fast_expf(2.0f * x) + 1.0f);
  const float x2 = x * x;
  const float small = x * (1.0f + x2 * (-0.333333333f + x2 * 0.133333333f));
  return (x < 0.0625f && x > -0.0625f) ? small : t;
}

#endif
