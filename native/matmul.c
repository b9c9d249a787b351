// Matmul entry points: one instantiation of gemm_impl.h per ISA, picked at run time.
//
// The micro-kernel holds NRW x PW/VW accumulators plus PW/VW x vectors and a broadcast, chosen
// per ISA to fit the register file: 12+2+1 of 32 zmm, 12+2+1 of 16 ymm, 12+2+1 of 16 xmm.
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"
#include "simd.h"


#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512")
#define GEMM_ISA avx512
#define VEC_AVX512 1
#define VEC_AVX2 0
#define VW 16
#define PW 32
#define NRW 6
#include "gemm_impl.h"
#undef NRW
#undef VW
#undef PW
#undef VEC_AVX2
#undef GEMM_ISA
#undef VEC_AVX512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define GEMM_ISA avx2
#define VEC_AVX512 0
#define VEC_AVX2 1
#define VW 8
#define PW 16
#define NRW 6
#include "gemm_impl.h"
#undef NRW
#undef VW
#undef PW
#undef VEC_AVX2
#undef GEMM_ISA
#undef VEC_AVX512
#pragma GCC pop_options

#define GEMM_ISA generic
#define VEC_AVX512 0
#define VEC_AVX2 0
#define VW 4
#define PW 8
#define NRW 6
#include "gemm_impl.h"
#undef NRW
#undef VW
#undef PW
#undef VEC_AVX2
#undef GEMM_ISA


void gemm(const float *x, const void *w, int wdtype, const float *bias, float *y, int64_t M, int64_t N,
          int64_t K) {
  if (M <= 0 || N <= 0) return;
  if (K == 0) { // empty sum: y = bias
    for (int64_t m = 0; m < M; m++)
      for (int64_t j = 0; j < N; j++) y[m * N + j] = bias ? bias[j] : 0.0f;
    return;
  }
  if (dt_quant(wdtype)) { // quant_pack.c: one kernel for every M too
    gemm_quant(x, w, wdtype, bias, y, M, N, K);
    return;
  }
  if (wdtype == DT_BF16_P16) { // one kernel for every M, as below
    if (llm_isa() == ISA_AVX512_BF16) gemm_p16_bf16dot(x, (const uint32_t *)w, bias, y, M, N, K);
    else gemm_p16_portable(x, w, bias, y, M, N, K);
    return;
  }
  const int packed = M > ROWS_MAX_M;
  switch (llm_isa()) {
  case ISA_AVX512_BF16:
    if (wdtype == DT_BF16 && K % 2 == 0) { // by the shape alone, whatever M is: see gemm_impl.h
      (packed ? gemm_packed_bf16dot : gemm_rows_bf16dot)(x, (const uint16_t *)w, bias, y, M, N, K);
      break;
    }
    __attribute__((fallthrough)); // AVX-512's kernels
  case ISA_AVX512:
    (packed ? gemm_packed_avx512 : gemm_rows_avx512)(x, w, wdtype, bias, y, M, N, K);
    break;
  case ISA_AVX2:
    (packed ? gemm_packed_avx2 : gemm_rows_avx2)(x, w, wdtype, bias, y, M, N, K);
    break;
  default:
    (packed ? gemm_packed_generic : gemm_rows_generic)(x, w, wdtype, bias, y, M, N, K);
  }
}

// i: [x, w, bias (0 = none), y, M, N, K, wdtype]
static int exec_matmul(const llm_cmd *c) {
  gemm(PTR(c->i[0]), PTR(c->i[1]), (int)c->i[7], c->i[2] ? PTR(c->i[2]) : NULL, PTR(c->i[3]), c->i[4],
       c->i[5], c->i[6]);
  return 0;
}

LLM_EXPORT void llm_op_matmul(int64_t x, int64_t w, int64_t bias, int64_t y, int M, int N, int K, int wdtype) {
  llm_cmd c = {.exec = exec_matmul, .i = {x, w, bias, y, M, N, K, wdtype}};
  llm_enqueue(&c);
}
