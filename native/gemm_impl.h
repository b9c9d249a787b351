// One instantiation of the matmul kernels, included by matmul.c once per ISA under a
// `#pragma GCC target`. Parameters (macros): GEMM_ISA (name suffix), VW (floats per native
// vector register: 16 / 8 / 4), PW (x panel width, a multiple of VW), NRW (weight rows per
// micro-kernel: NRW * PW/VW accumulators + PW/VW x vectors + 1 broadcast fit the register file),
// VEC_AVX512 / VEC_AVX2 (use intrinsics for the dtype conversions).
//
// y[M,N] = x[M,K] . w[N,K]^T, f32 accumulation, w in f32/f16/bf16.
//   - M <= ROWS_MAX_M (decode): weight rows stream from memory once, converted in registers,
//     each dotted with up to 4 x rows at a time; K is chunked so x stays in L1 meanwhile; threads
//     take blocks of 16 rows. Memory bound: the aim is to read w at full bandwidth.
//   - larger M (prefill): x is packed K-major into panels of PW rows, w is converted KC columns
//     at a time into f32 rows (bf16/f16 are never expanded as a whole), and an outer-product
//     micro-kernel keeps an NRW x PW block of y in registers (NRW broadcasts of w, PW/VW vector
//     loads of x per k). Threads split (N blocks x M blocks).

#define GEMM_CAT2(a, b) a##_##b
#define GEMM_CAT(a, b) GEMM_CAT2(a, b)
#define FN(name) GEMM_CAT(name, GEMM_ISA)

#include "vec_isa.h"

// ---- decode path -------------------------------------------------------------------------------

// ys[m] += dot(x[m*ldx + 0..n), wrow[0..n)) for m < MB; MB and dt are constants after inlining.
SIMD_INLINE void FN(dot_rows)(const int MB, const int dt, const float *x, int64_t ldx, int64_t n, const void *wrow,
                              float *ys) {
  VF acc[4][2];
  for (int m = 0; m < MB; m++) acc[m][0] = acc[m][1] = (VF){0};
  int64_t k = 0;
  for (; k + 2 * VW <= n; k += 2 * VW) {
    VF w0 = FN(load_w)(wrow, dt, k), w1 = FN(load_w)(wrow, dt, k + VW);
    for (int m = 0; m < MB; m++) {
      acc[m][0] += FN(vload)(x + m * ldx + k) * w0;
      acc[m][1] += FN(vload)(x + m * ldx + k + VW) * w1;
    }
  }
  for (; k + VW <= n; k += VW) {
    VF w0 = FN(load_w)(wrow, dt, k);
    for (int m = 0; m < MB; m++) acc[m][0] += FN(vload)(x + m * ldx + k) * w0;
  }
  float s[4];
  for (int m = 0; m < MB; m++) s[m] = FN(vhsum)(acc[m][0] + acc[m][1]);
  for (; k < n; k++) {
    float wk = load_elem(wrow, dt, k);
    for (int m = 0; m < MB; m++) s[m] += x[m * ldx + k] * wk;
  }
  for (int m = 0; m < MB; m++) ys[m] += s[m];
}

#define DOT_CASE(MB_, DT_)                                                                           \
  case (MB_) * 4 + (DT_):                                                                            \
    FN(dot_rows)(MB_, DT_, x + m0 * K + k0, K, kc, wrow, ys + m0);                                  \
    break;

#define RB 16 // weight rows per work item
// k chunk: x[M][rkc] (16 KiB) stays in L1 while the RB weight rows stream past it
#define RKC_FLOATS 4096

static void FN(gemm_rows)(const float *x, const void *w, int dt, const float *bias, float *y, int64_t M,
                          int64_t N, int64_t K) {
  const size_t esz = dtype_size(dt);
  const int64_t rkc = (RKC_FLOATS / M) / (2 * VW) * (2 * VW); // M <= 16: >= 256
  // Dynamic chunks of rows: on a shared machine one thread may lose its core for a while, and a
  // static split would make every op wait for it. Small matrices run on one thread: waking the
  // team costs more than it saves (see llm_gemv_parallel_min_bytes).
#pragma omp parallel for schedule(dynamic, 1) if ((size_t)N * (size_t)K * esz >= llm_gemv_parallel_min_bytes())
  for (int64_t j0 = 0; j0 < N; j0 += RB) {
    const int64_t nr = N - j0 < RB ? N - j0 : RB;
    float acc[RB * ROWS_MAX_M]; // [row][m] partial sums over the k chunks so far
    memset(acc, 0, sizeof acc);
    for (int64_t k0 = 0; k0 < K; k0 += rkc) {
      const int64_t kc = K - k0 < rkc ? K - k0 : rkc;
      for (int64_t r = 0; r < nr; r++) {
        const void *wrow = (const char *)w + ((size_t)(j0 + r) * (size_t)K + (size_t)k0) * esz;
        float *ys = acc + r * ROWS_MAX_M;
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
          const int mb = M - m0 < 4 ? (int)(M - m0) : 4;
          switch (mb * 4 + dt) {
            DOT_CASE(1, DT_F32) DOT_CASE(1, DT_F16) DOT_CASE(1, DT_BF16)
            DOT_CASE(2, DT_F32) DOT_CASE(2, DT_F16) DOT_CASE(2, DT_BF16)
            DOT_CASE(3, DT_F32) DOT_CASE(3, DT_F16) DOT_CASE(3, DT_BF16)
            DOT_CASE(4, DT_F32) DOT_CASE(4, DT_F16) DOT_CASE(4, DT_BF16)
          }
        }
      }
    }
    for (int64_t m = 0; m < M; m++)
      for (int64_t r = 0; r < nr; r++) y[m * N + j0 + r] = acc[r * ROWS_MAX_M + m] + (bias ? bias[j0 + r] : 0.0f);
  }
}
#undef DOT_CASE
#undef RB
#undef RKC_FLOATS

// ---- prefill path ------------------------------------------------------------------------------

#define NPV (PW / VW) // vectors per x panel row
#ifndef GEMM_KC
#define GEMM_KC 128 // k block: an x panel block (KC*PW floats, <= 16 KiB) stays in L1 across weight rows
#endif
#ifndef GEMM_NBM
#define GEMM_NBM 8 // weight rows per work item, in micro-kernels
#endif
#ifndef GEMM_MROWS
#define GEMM_MROWS 128 // x rows per work item
#endif
#define KC GEMM_KC
#define NB (NRW * GEMM_NBM)
#define MP (GEMM_MROWS / PW) // x panels per work item

// xp[k*PW + ii] = x[(p*PW + ii)*K + k], zero past M: the K-major panel p.
static void FN(pack_panel)(float *xp, const float *x, int64_t M, int64_t K, int64_t p) {
  for (int64_t ii = 0; ii < PW; ii++) {
    int64_t row = p * PW + ii;
    if (row < M) {
      const float *src = x + row * K;
      for (int64_t k = 0; k < K; k++) xp[k * PW + ii] = src[k];
    } else {
      for (int64_t k = 0; k < K; k++) xp[k * PW + ii] = 0.0f;
    }
  }
}

static void FN(cvt_run)(float *dst, const void *src, int dt, int64_t n) {
  int64_t k = 0;
  for (; k + VW <= n; k += VW) FN(vstore)(dst + k, FN(load_w)(src, dt, k));
  for (; k < n; k++) dst[k] = load_elem(src, dt, k);
}

// ct[r*ldc + 0..PW) (+)= sum_k wf[r*KC + k] * xp[k*PW + 0..PW) for r < NRW.
SIMD_INLINE void FN(micro)(const float *wf, const float *xp, int64_t kc, float *ct, int64_t ldc, int first) {
  VF c[NRW][NPV];
  for (int r = 0; r < NRW; r++)
    for (int v = 0; v < NPV; v++) c[r][v] = first ? (VF){0} : FN(vload)(ct + r * ldc + v * VW);
  for (int64_t k = 0; k < kc; k++) {
    VF xv[NPV];
    for (int v = 0; v < NPV; v++) xv[v] = FN(vload)(xp + k * PW + v * VW);
    for (int r = 0; r < NRW; r++) {
      VF b = FN(vsplat)(wf[r * KC + k]);
      for (int v = 0; v < NPV; v++) c[r][v] += b * xv[v];
    }
  }
  for (int r = 0; r < NRW; r++)
    for (int v = 0; v < NPV; v++) FN(vstore)(ct + r * ldc + v * VW, c[r][v]);
}

static void FN(gemm_packed)(const float *x, const void *w, int dt, const float *bias, float *y, int64_t M,
                            int64_t N, int64_t K) {
  const size_t esz = dtype_size(dt);
  const int64_t P = (M + PW - 1) / PW;
  float *xp = aligned_alloc(64, (size_t)(P * K * PW) * sizeof(float) + 64);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < P; p++) FN(pack_panel)(xp + p * K * PW, x, M, K, p);

  const int64_t nbi = (N + NB - 1) / NB, nmi = (P + MP - 1) / MP, ldc = MP * PW;
#pragma omp parallel
  {
    float *wf = aligned_alloc(64, (size_t)(NB * KC) * sizeof(float)); // [NB][KC] f32 weight block
    float *ct = aligned_alloc(64, (size_t)(NB * ldc) * sizeof(float)); // [NB][MP*PW] y^T block
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int64_t bi = 0; bi < nbi; bi++) {
      for (int64_t mi = 0; mi < nmi; mi++) {
        const int64_t j0 = bi * NB, nb = N - j0 < NB ? N - j0 : NB;
        const int64_t nbr = (nb + NRW - 1) / NRW * NRW; // rounded up; extra rows are zero
        const int64_t p0 = mi * MP, np = P - p0 < MP ? P - p0 : MP;
        for (int64_t k0 = 0; k0 < K; k0 += KC) {
          const int64_t kc = K - k0 < KC ? K - k0 : KC;
          for (int64_t r = 0; r < nb; r++)
            FN(cvt_run)(wf + r * KC, (const char *)w + ((size_t)(j0 + r) * (size_t)K + (size_t)k0) * esz, dt, kc);
          for (int64_t r = nb; r < nbr; r++) memset(wf + r * KC, 0, (size_t)kc * sizeof(float));
          for (int64_t pp = 0; pp < np; pp++) {
            const float *xpb = xp + (p0 + pp) * K * PW + k0 * PW;
            for (int64_t jr = 0; jr < nbr; jr += NRW)
              FN(micro)(wf + jr * KC, xpb, kc, ct + jr * ldc + pp * PW, ldc, k0 == 0);
          }
        }
        gemm_store_yt(y, N, ct, ldc, p0 * PW, (p0 + np) * PW < M ? (p0 + np) * PW : M, j0, nb, bias);
      }
    }
    free(wf);
    free(ct);
  }
  free(xp);
}

#undef NPV
#undef VF
#undef VU
#undef VI
#undef VH
#undef KC
#undef NB
#undef MP
#undef FN
#undef GEMM_CAT
#undef GEMM_CAT2
