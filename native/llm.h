// Shared declarations of the llmts CPU backend (build/libllmts_cpu.so).
//
// The library mirrors a CUDA stream: JS calls cheap exported llm_op_* functions that only push a
// command record onto a FIFO queue; one worker thread pops and executes them (each op using an
// OpenMP team for its own parallelism); llm_wait blocks until a fence has been reached. Pointers
// cross the FFI boundary as int64 addresses so JS can form views as base + offset.
#ifndef LLM_H
#define LLM_H

#include <stddef.h>
#include <omp.h>
#include <stdint.h>

// Element types; the numbers are part of the FFI (src/backends/cpu/native-lib.ts mirrors them).
// DT_BF16_P16: bf16 matmul weights in 16-row panels of k pairs (weight_pack.c), only as a
// matmul's w or an embedding table. DT_Q8_0_P16 / DT_Q4_0_P16 / DT_Q4_K_P16 / DT_Q6_K_P16 / DT_Q5_K_P16 /
// DT_IQ4_XS_P16 / DT_Q4_1_P16 / DT_Q5_1_P16: GGUF Q8_0 / Q4_0 / Q4_K / Q6_K / Q5_K / IQ4_XS / Q4_1 / Q5_1
// matmul weights kept quantized in 16-row
// panels (quant_pack.c), in the same two roles.
// DT_KV_INT8 / DT_KV_FP8: KV pools of one-byte values with an f32 scale per row (kv_format.h).
enum {
  DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2, DT_I32 = 3, DT_BF16_P16 = 4,
  DT_Q8_0_P16 = 5, DT_Q4_0_P16 = 6, DT_Q4_K_P16 = 7, DT_Q6_K_P16 = 8,
  DT_KV_INT8 = 9, DT_KV_FP8 = 10, DT_Q5_K_P16 = 11, DT_IQ4_XS_P16 = 12,
  DT_Q4_1_P16 = 13, DT_Q5_1_P16 = 14
};

enum { ACT_SILU = 0, ACT_GELU_TANH = 1, ACT_GELU = 2 };

#define LLM_EXPORT __attribute__((visibility("default")))

// Runtime ISA dispatch for hot serial kernels. OpenMP outlines parallel-loop bodies into separate
// functions that target_clones does not clone, so clones go on serial range/row kernels that the
// parallel loops call.
#define CLONES __attribute__((target_clones("avx512f", "avx2,fma", "default")))

// Runs `body` (which sees int64_t i0, i1) over [0, n) split into one contiguous chunk per
// thread; below `grain` items on this thread alone, outside OpenMP (where waking the team costs
// more than it saves, and even a team of one costs libgomp a futex call at its barrier).
#define PARALLEL_RANGE(n, grain, ...)                                                               \
  do {                                                                                               \
    const int64_t n_ = (n);                                                                          \
    const int nt_ = n_ >= (int64_t)(grain) ? omp_get_max_threads() : 1;                             \
    if (nt_ == 1) {                                                                                  \
      const int64_t i0 = 0, i1 = n_;                                                                 \
      __VA_ARGS__;                                                                                   \
    } else {                                                                                         \
      _Pragma("omp parallel for schedule(static) num_threads(nt_)") for (int c_ = 0; c_ < nt_; c_++) { \
        const int64_t i0 = n_ * c_ / nt_, i1 = n_ * (c_ + 1) / nt_;                                 \
        __VA_ARGS__;                                                                                 \
      }                                                                                              \
    }                                                                                                \
  } while (0)
#define PTR(a) ((void *)(intptr_t)(a))

// The decode team (pool.c): runs fn(ctx, item, thread) for item in [0, n) on the caller and the
// helpers, items claimed one at a time; returns when all have run. Queue worker thread only.
void llm_pool_for(int64_t n, void (*fn)(void *ctx, int64_t item, int thread), void *ctx);
// threads of the decode team, the caller included (thread indices passed to fn are below it)
int llm_pool_threads(void);

// Weight bytes below which a small-M matmul runs on one thread (env LLMTS_GEMV_PAR_MIN_BYTES).
size_t llm_gemv_parallel_min_bytes(void);

static inline size_t dtype_size(int dt) { return dt == DT_F16 || dt == DT_BF16 || dt == DT_BF16_P16 ? 2 : 4; }

// ---- bf16 weights in panels (weight_pack.c) ----------------------------------------------------

// Bytes of w[N][K] as DT_BF16_P16: N rounded up to whole panels of 16 rows.
static inline size_t p16_bytes(int64_t N, int64_t K) { return (size_t)((N + 15) / 16) * 16 * (size_t)K * 2; }
// dst[0..K) = row n of a DT_BF16_P16 matrix with K columns, as f32.
void p16_row_to_f32(float *dst, const void *w, int64_t n, int64_t K);
// y = x . w^T (+ bias) for DT_BF16_P16 w on any ISA: per element the f32 chain over k in order.
void gemm_p16_portable(const float *x, const void *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K);
// The same with AVX512-BF16 dot products, x rounded to bf16 as gemm_bf16.c's other kernels do.
void gemm_p16_bf16dot(const float *x, const uint32_t *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K);

// ---- quantized weights in panels (quant_pack.c, gemm_q8.c) -------------------------------------

static inline int dt_quant(int dt) { return (dt >= DT_Q8_0_P16 && dt <= DT_Q6_K_P16) || (dt >= DT_Q5_K_P16 && dt <= DT_Q5_1_P16); }
// The kernels' variant of a quantized panel dtype: QK_Q8_0, QK_Q4_0 (nibbles, offset 8), QK_Q4_K
// (nibbles, a min per block), QK_Q6_K (nibbles and 2-bit high parts, a scale per 16 k, offset 32),
// QK_Q5_K (Q4_K's, and a fifth bit per weight), QK_IQ4_XS (nibbles indexing a table of bytes, offset
// 128, an int8 scale per block times its super-block's f16), QK_Q4_1 / QK_Q5_1 (nibbles, Q5_1 with
// fifth bits as Q5_K's; an f16 scale and an f16 min per block).
enum { QK_Q8_0 = 0, QK_Q4_0 = 1, QK_Q4_K = 2, QK_Q6_K = 3, QK_Q5_K = 4, QK_IQ4_XS = 5, QK_Q4_1 = 6, QK_Q5_1 = 7 };
static inline int quant_kind(int dt) { return dt <= DT_Q6_K_P16 ? dt - DT_Q8_0_P16 : dt - DT_Q5_K_P16 + QK_Q5_K; }
// Kinds with a min per block (their weights carry no offset; x's block sums multiply the min) and
// kinds with fifth bits after each block's nibbles.
static inline int quant_has_min(int kind) { return kind == QK_Q4_K || kind == QK_Q5_K || kind == QK_Q4_1 || kind == QK_Q5_1; }
static inline int quant_has_fifth(int kind) { return kind == QK_Q5_K || kind == QK_Q5_1; }
// Bytes of a panel block's quants (16 rows x 32 k), ahead of the KB blocks' scales: Q8_0 512 (a byte
// a weight), the nibble kinds 256, Q6_K 384 (nibbles, then the 2-bit high parts), Q5_K 320 (nibbles,
// then the fifth bits), Q5_1 320.
static inline int64_t quant_quants_bytes(int kind) {
  static const int64_t qb[] = {512, 256, 256, 384, 320, 256, 256, 320};
  return qb[kind];
}
// Weights a ggml block of dt holds (K must be a multiple): 32, or 256 for the K-quants and IQ4_XS.
static inline int64_t quant_k_multiple(int dt) {
  const int k = quant_kind(dt);
  return k == QK_Q8_0 || k == QK_Q4_0 || k == QK_Q4_1 || k == QK_Q5_1 ? 32 : 256;
}
// Bytes of w[N][K] (K a multiple of quant_k_multiple) per panel block of 32 k: DT_Q8_0_P16 544,
// DT_Q4_0_P16 288, DT_Q4_K_P16 296, DT_Q6_K_P16 420, DT_Q5_K_P16 360, DT_IQ4_XS_P16 276, DT_Q4_1_P16 320,
// DT_Q5_1_P16 384.
static inline size_t quant_p16_bytes(int64_t N, int64_t K, int dt) {
  static const int per_block[] = {544, 288, 296, 420, 360, 276, 320, 384};
  return (size_t)((N + 15) / 16) * (size_t)(K / 32) * (size_t)per_block[quant_kind(dt)];
}
// x's per-block integer terms a kind needs: xc holds quant_x_sums(kind) int32 per block of 32 (Q6_K:
// one per 16 k), each -c_off times the sum of those q, c_off = quant_x_offset(kind) (the weights'
// unsigned offset; the min kinds' -1 gives the plain sum, for their mins).
static inline int quant_x_sums(int kind) { return kind == QK_Q6_K ? 2 : 1; }
static inline int quant_x_offset(int kind) {
  static const int off[] = {128, 8, -1, 32, -1, 128, -1, -1};
  return off[kind];
}
// dst[0..K) = row n of a quantized panel matrix, dequantized (exact: f16 scale x small integer).
void quant_row_to_f32(float *dst, const void *w, int dt, int64_t n, int64_t K);
// y = x . w^T (+ bias) for quantized panel w: x quantized per block of 32, integer dots (quant_pack.c
// states the arithmetic), AVX512-VNNI where the CPU has it and the ISA in effect is AVX-512, else portable.
void gemm_quant(const float *x, const void *w, int dt, const float *bias, float *y, int64_t M, int64_t N, int64_t K);
void gemm_quant_vnni(const float *x, const void *w, int dt, const float *bias, float *y, int64_t M, int64_t N,
                     int64_t K);
// x rows [m0, m1) quantized: xq [M][K] int8, xd [M][K/32] scales, xc [M][K/32 * sums] as quant_x_sums
// says (sums 1 or 2: per block of 32 or per 16 k).
void quant_x_rows_portable(const float *x, int8_t *xq, float *xd, int32_t *xc, int c_off, int sums, int64_t m0,
                           int64_t m1, int64_t K);

// ---- command queue -----------------------------------------------------------------------------

typedef struct llm_cmd llm_cmd;
typedef int (*llm_exec_fn)(const llm_cmd *c);

// One enqueued op. `i` holds addresses and integer arguments, `f` floating arguments; their
// meaning is private to each op (see the llm_op_* function that fills it).
struct llm_cmd {
  llm_exec_fn exec; // runs on the worker thread; returns 0 or llm_fail(...)
  int64_t i[20];
  double f[4];
};

// Pushes a copy of *c; never blocks on the worker (the ring grows when full).
void llm_enqueue(const llm_cmd *c);

// Records an op error message (printf-style) for the current op and returns -1. Called on the
// worker thread only, outside OpenMP regions (kernels validate indices in a serial pre-pass).
int llm_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// ---- dtype conversion (convert.c) --------------------------------------------------------------

// dst[0..n) = (float) src[0..n) for src dtype f32/f16/bf16; exact (f16 subnormals, inf, nan too).
void cvt_to_f32(float *dst, const void *src, int src_dtype, size_t n);

// ---- ISA of the hand-dispatched kernels (isa.c) ------------------------------------------------

// ISA_AVX512_BF16: AVX-512 plus its bf16 dot products, which only the prefill matmuls of bf16
// weights use (gemm_bf16.c); everything else runs its AVX-512 kernels there.
enum { ISA_GENERIC = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_AVX512_BF16 = 3 };
int llm_isa(void);

// ---- matmul (matmul.c) -------------------------------------------------------------------------

// y[M,N] = x[M,K] . w[N,K]^T (+ bias[N]); w is f32/f16/bf16 and consumed without a full copy.
// Multi-threaded internally (call from outside any OpenMP region).
// Row-streaming is best while w dominates the traffic; from this many rows on, the packed
// outer-product kernel's compute efficiency wins (measured on a 16-core Xeon and a 2-core EPYC:
// at M = 9..16 the packed kernel, padding x to 32-row panels, was 2-4x slower).
#ifndef ROWS_MAX_M // matmuls of up to this many rows take the rows kernels
#define ROWS_MAX_M 16
#endif
void gemm(const float *x, const void *w, int wdtype, const float *bias, float *y, int64_t M, int64_t N,
          int64_t K);
// The packed matmuls' write-back: y[m][j0 + r] = ct[r * ldc + m - m_lo] (+ bias[j0 + r]) for rows
// [m_lo, m_hi) and r < nb, from a work item's y^T block.
static inline void gemm_store_yt(float *y, int64_t N, const float *ct, int64_t ldc, int64_t m_lo, int64_t m_hi,
                                 int64_t j0, int64_t nb, const float *bias) {
  for (int64_t m = m_lo; m < m_hi; m++) {
    float *yr = y + m * N + j0;
    const float *cc = ct + (m - m_lo);
    for (int64_t r = 0; r < nb; r++) yr[r] = cc[r * ldc] + (bias ? bias[j0 + r] : 0.0f);
  }
}
// The same for bf16 w and K even, with x rounded to bf16 (gemm_bf16.c; ISA_AVX512_BF16): the packed
// kernel for M > ROWS_MAX_M, the rows kernel below it, each element computed identically by both.
void gemm_packed_bf16dot(const float *x, const uint16_t *w, const float *bias, float *y, int64_t M, int64_t N,
                         int64_t K);
void gemm_rows_bf16dot(const float *x, const uint16_t *w, const float *bias, float *y, int64_t M, int64_t N,
                       int64_t K);

// ---- activations (act.c) -----------------------------------------------------------------------

// out[i] = act(gate[i]) * up[i]
void glu_rows(float *out, const float *gate, const float *up, int64_t n, int act);

#endif
