// Per-ISA native-width vectors, included by each *_impl.h instantiation (under a `#pragma GCC
// target`, with VW = floats per register, VEC_AVX512 / VEC_AVX2 = 0/1 to use intrinsics, and
// FN() = the instantiation's name suffixer). Vectors
// are exactly one register wide: wider GCC vectors are lowered through memory on targets that
// lack them.
typedef float FN(vf) __attribute__((vector_size(VW * 4)));
typedef uint32_t FN(vu) __attribute__((vector_size(VW * 4)));
typedef int32_t FN(vi) __attribute__((vector_size(VW * 4)));
typedef uint16_t FN(vh) __attribute__((vector_size(VW * 2)));
#define VF FN(vf)
#define VU FN(vu)
#define VI FN(vi)
#define VH FN(vh)

SIMD_INLINE VF FN(vload)(const float *p) {
  VF v;
  memcpy(&v, p, sizeof v);
  return v;
}
SIMD_INLINE void FN(vstore)(float *p, VF v) { memcpy(p, &v, sizeof v); }
SIMD_INLINE VF FN(vsplat)(float s) { return __builtin_shuffle((VF){s}, (VI){0}); }

// Horizontal sum (GCC scalarises a generic lane loop; the intrinsics reduce in log steps).
SIMD_INLINE float FN(vhsum)(VF v) {
#if VEC_AVX512
  return _mm512_reduce_add_ps((__m512)v);
#elif VEC_AVX2
  __m128 x = _mm_add_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
#else
  return (v[0] + v[2]) + (v[1] + v[3]);
#endif
}

// Horizontal max.
SIMD_INLINE float FN(vhmax)(VF v) {
#if VEC_AVX512
  return _mm512_reduce_max_ps((__m512)v);
#elif VEC_AVX2
  __m128 x = _mm_max_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
#else
  const float a = v[0] > v[1] ? v[0] : v[1], b = v[2] > v[3] ? v[2] : v[3];
  return a > b ? a : b;
#endif
}

// Lane-wise max (a NaN lane of b loses to a; scores here are never NaN).
SIMD_INLINE VF FN(vmax)(VF a, VF b) {
  const VI gt = b > a;
  return (VF)(((VI)b & gt) | ((VI)a & ~gt));
}

// VW elements of a row of dtype dt (f32/f16/bf16) starting at element k, as f32.
SIMD_INLINE VF FN(load_w)(const void *w, int dt, int64_t k) {
  const uint16_t *h16 = (const uint16_t *)w + k;
#if VEC_AVX512
  // GCC splits a generic u16 -> u32 widening into halves; one vpmovzxwd / vcvtph2ps does it.
  if (dt == DT_BF16) return (VF)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)h16)), 16);
  if (dt == DT_F16) return (VF)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h16));
#elif VEC_AVX2
  if (dt == DT_BF16) return (VF)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)h16)), 16);
  if (dt == DT_F16) return (VF)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h16));
#else
  if (dt != DT_F32) {
    VH h;
    memcpy(&h, h16, sizeof h);
    VU x = __builtin_convertvector(h, VU);
    if (dt == DT_BF16) return (VF)(x << 16);
    // exact f16 -> f32, as v16_load_f16 in simd.h
    VU em = x & 0x7fff, sign = (x & 0x8000) << 16, bits = em << 13;
    VU r = (VU)((VF)bits * 0x1p112f);
    VU special = (VU)(em >= 0x7c00);
    r = (r & ~special) | ((bits | 0x7f800000u) & special);
    return (VF)(r | sign);
  }
#endif
  return FN(vload)((const float *)w + k);
}

// Rows v[0..VW) of a VW x VW tile become its columns (the matmul's decode tiles, attention's
// chunks of keys): log2 VW stages, stage h swapping bit h of
// the row and column index (the off-diagonal h x h blocks of each 2h x 2h block).
SIMD_INLINE void FN(transpose)(VF *v) {
#if VW == 16
  static const VI lo[4] = {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
                           {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
                           {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
                           {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}};
  static const VI hi[4] = {{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
                           {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
                           {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
                           {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}};
#elif VW == 8
  static const VI lo[3] = {{0, 1, 2, 3, 8, 9, 10, 11}, {0, 1, 8, 9, 4, 5, 12, 13}, {0, 8, 2, 10, 4, 12, 6, 14}};
  static const VI hi[3] = {{4, 5, 6, 7, 12, 13, 14, 15}, {2, 3, 10, 11, 6, 7, 14, 15}, {1, 9, 3, 11, 5, 13, 7, 15}};
#else
  static const VI lo[2] = {{0, 1, 4, 5}, {0, 4, 2, 6}};
  static const VI hi[2] = {{2, 3, 6, 7}, {1, 5, 3, 7}};
#endif
  int s = 0;
#pragma GCC unroll 4
  for (int h = VW / 2; h >= 1; h /= 2, s++) {
#pragma GCC unroll 8
    for (int i = 0; i < VW; i++) {
      if (i & h) continue;
      const VF a = v[i], b = v[i + h];
      v[i] = __builtin_shuffle(a, b, lo[s]);
      v[i + h] = __builtin_shuffle(a, b, hi[s]);
    }
  }
}
