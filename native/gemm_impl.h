// One instantiation of the matmul kernels, included by matmul.c once per ISA under a
// `#pragma GCC target`. Parameters (macros): GEMM_ISA (name suffix), VW (floats per native
// vector register: 16 / 8 / 4), PW (x panel width, a multiple of VW), NRW (weight rows per
// micro-kernel: NRW * PW/VW accumulators + PW/VW x vectors + 1 broadcast fit the register file),
// VEC_AVX512 / VEC_AVX2 (use intrinsics for the dtype conversions).
//
// y[M,N] = x[M,K] . w[N,K]^T, f32 accumulation, w in f32/f16/bf16.
//   - M <= ROWS_MAX_M (decode): weight rows stream from memory once, converted in registers, VW
//     rows at a time transposed so that they sit in vector lanes; threads take blocks of VW rows.
//     Memory bound: the aim is to read w at full bandwidth.
//   Both paths compute each element of y the same way (one multiply-add chain over k in order),
//   so a row's result never depends on how many rows share the call.
//   - larger M (prefill): x is packed K-major into panels of PW rows, w is converted KC columns
//     at a time into f32 rows (bf16/f16 are never expanded as a whole), and an outer-product
//     micro-kernel keeps an NRW x PW block of y in registers (NRW broadcasts of w, PW/VW vector
//     loads of x per k). Threads split (N blocks x M blocks).

#define GEMM_CAT2(a, b) a##_##b
#define GEMM_CAT(a, b) GEMM_CAT2(a, b)
#define FN(name) GEMM_CAT(name, GEMM_ISA)

#include "vec_isa.h"

// ---- decode path -------------------------------------------------------------------------------
//
// Batch invariance: a row of y must come out bit for bit the same whatever M is, so this path
// computes every element exactly as the packed path's micro-kernel does: one multiply-add chain
// over k = 0, 1, .., K - 1 from zero, then the bias. The packed kernel has x rows in vector lanes;
// here VW weight rows are: a VW x VW tile of w (VW rows, VW consecutive k) is transposed in
// registers, and each x element, broadcast, multiplies the tile's column of VW rows. Weight rows
// still stream from memory once, converted in registers; the transpose costs shuffles that hide
// behind the weights' bytes.

// y[m][j0 + r] for m < M, r < nr <= VW: lane r of acc[m] is weight row j0 + r.
static void FN(rows_block)(const float *x, const void *w, int dt, const float *bias, float *y, int64_t M, int64_t N,
                           int64_t K, int64_t j0, int64_t nr, VF *acc) {
  const size_t esz = dtype_size(dt);
  const char *wr[VW];
  for (int r = 0; r < VW; r++) wr[r] = (const char *)w + (size_t)(j0 + (r < nr ? r : 0)) * (size_t)K * esz;
  for (int64_t m = 0; m < M; m++) acc[m] = (VF){0};
  int64_t k = 0;
  for (; k + VW <= K; k += VW) {
    VF t[VW];
#pragma GCC unroll 16
    for (int r = 0; r < VW; r++) t[r] = r < nr ? FN(load_w)(wr[r], dt, k) : (VF){0};
    FN(transpose)(t); // t[i] = the tile's column k + i
    for (int64_t m = 0; m < M; m++) {
      const float *xm = x + m * K + k;
      VF a = acc[m];
#pragma GCC unroll 16
      for (int i = 0; i < VW; i++) a += FN(vsplat)(xm[i]) * t[i];
      acc[m] = a;
    }
  }
  for (; k < K; k++) {
    VF t = (VF){0};
    for (int r = 0; r < nr; r++) t[r] = load_elem(wr[r], dt, k);
    for (int64_t m = 0; m < M; m++) acc[m] += FN(vsplat)(x[m * K + k]) * t;
  }
  for (int64_t m = 0; m < M; m++)
    for (int64_t r = 0; r < nr; r++) y[m * N + j0 + r] = acc[m][r] + (bias ? bias[j0 + r] : 0.0f);
}

static void FN(gemm_rows)(const float *x, const void *w, int dt, const float *bias, float *y, int64_t M,
                          int64_t N, int64_t K) {
  // Dynamic blocks of VW rows: on a shared machine one thread may lose its core for a while, and a
  // static split would make every op wait for it. Small matrices run on one thread: waking the
  // team costs more than it saves (see llm_gemv_parallel_min_bytes).
#pragma omp parallel for schedule(dynamic, 1) if ((size_t)N * (size_t)K * dtype_size(dt) >= llm_gemv_parallel_min_bytes())
  for (int64_t j0 = 0; j0 < N; j0 += VW) {
    VF acc[ROWS_MAX_M];
    FN(rows_block)(x, w, dt, bias, y, M, N, K, j0, N - j0 < VW ? N - j0 : VW, acc);
  }
}

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
#pragma omp for schedule(dynamic, 1) collapse(2) nowait
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
