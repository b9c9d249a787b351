// Row ops: rmsnorm, embedding lookup, row gather. Index-taking ops validate every index in a
// serial pre-pass, so the parallel part never fails.
#include <math.h>
#include <string.h>

#include "llm.h"
#include "simd.h"

// y = x * rsqrt(mean(x^2) + eps) * (offset + w), as HF: the normalised row is rounded to f32
// before the weight multiply.
CLONES static void rmsnorm_rows(float *y, const float *x, const float *w, int64_t rows, int64_t D, float eps,
                                float offset) {
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * D;
    float *yr = y + r * D;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < D; i++) ss += xr[i] * xr[i];
    const float inv = 1.0f / sqrtf(ss / (float)D + eps);
    for (int64_t i = 0; i < D; i++) yr[i] = (xr[i] * inv) * (offset + w[i]);
  }
}

// i: [x, w, out, rows, D]; f: [eps, offset]
static int exec_rmsnorm(const llm_cmd *c) {
  const float *x = PTR(c->i[0]), *w = PTR(c->i[1]);
  float *y = PTR(c->i[2]);
  const int64_t D = c->i[4];
  const float eps = (float)c->f[0], off = (float)c->f[1];
  PARALLEL_RANGE(c->i[3], 65536 / (D > 0 ? D : 1) + 1,
                 rmsnorm_rows(y + i0 * D, x + i0 * D, w, i1 - i0, D, eps, off));
  return 0;
}

LLM_EXPORT void llm_op_rmsnorm(int64_t x, int64_t w, int64_t out, int64_t rows, int64_t D, double eps,
                               double offset) {
  llm_cmd c = {.exec = exec_rmsnorm, .i = {x, w, out, rows, D}, .f = {eps, offset}};
  llm_enqueue(&c);
}

// Checks idx[0..n) against [0, limit); on failure records "<op>: <what> <v> at <i> ..." and
// returns -1.
static int check_indices(const char *op, const char *what, const int32_t *idx, int64_t n, int64_t limit) {
  for (int64_t i = 0; i < n; i++)
    if (idx[i] < 0 || idx[i] >= limit)
      return llm_fail("%s: %s %d at index %lld is out of range [0, %lld)", op, what, idx[i], (long long)i,
                      (long long)limit);
  return 0;
}

CLONES static void scale_row(float *y, int64_t D, float s) {
  for (int64_t i = 0; i < D; i++) y[i] *= s;
}

// i: [table, ids, out, T, V, D, table_dtype]; f: [scale]
static int exec_embedding(const llm_cmd *c) {
  const char *table = PTR(c->i[0]);
  const int32_t *ids = PTR(c->i[1]);
  float *y = PTR(c->i[2]);
  const int64_t T = c->i[3], V = c->i[4], D = c->i[5];
  const int dt = (int)c->i[6];
  const float s = (float)c->f[0];
  if (check_indices("embedding", "token id", ids, T, V)) return -1;
  const size_t row_bytes = (size_t)D * dtype_size(dt);
  PARALLEL_RANGE(T, 8, {
    for (int64_t t = i0; t < i1; t++) {
      if (dt == DT_BF16_P16) p16_row_to_f32(y + t * D, table, ids[t], D);
      else if (dt_quant(dt)) quant_row_to_f32(y + t * D, table, dt, ids[t], D);
      else cvt_to_f32(y + t * D, table + (size_t)ids[t] * row_bytes, dt, (size_t)D);
      if (s != 1.0f) scale_row(y + t * D, D, s);
    }
  });
  return 0;
}

LLM_EXPORT void llm_op_embedding(int64_t table, int64_t ids, int64_t out, int64_t T, int64_t V, int64_t D,
                                 int table_dtype, double scale) {
  llm_cmd c = {.exec = exec_embedding, .i = {table, ids, out, T, V, D, table_dtype}, .f = {scale}};
  llm_enqueue(&c);
}

// i: [x, idx, out, R, T, row_bytes]
static int exec_gather_rows(const llm_cmd *c) {
  const char *x = PTR(c->i[0]);
  const int32_t *idx = PTR(c->i[1]);
  char *y = PTR(c->i[2]);
  const int64_t R = c->i[3], T = c->i[4];
  const size_t rb = (size_t)c->i[5];
  if (check_indices("gatherRows", "row index", idx, R, T)) return -1;
  for (int64_t r = 0; r < R; r++) memcpy(y + (size_t)r * rb, x + (size_t)idx[r] * rb, rb);
  return 0;
}

LLM_EXPORT void llm_op_gather_rows(int64_t x, int64_t idx, int64_t out, int64_t R, int64_t T, int64_t row_bytes) {
  llm_cmd c = {.exec = exec_gather_rows, .i = {x, idx, out, R, T, row_bytes}};
  llm_enqueue(&c);
}

// Index of the largest value of one row, lowest index on ties; NaN never compares greater, so it
// is never chosen; -1 when nothing is above -Infinity. The host sampler's greedy pick, exactly.
static int32_t argmax_row(const float *x, int64_t V) {
  int32_t best = -1;
  float bv = -INFINITY;
  for (int64_t k = 0; k < V; k++)
    if (x[k] > bv) {
      bv = x[k];
      best = (int32_t)k;
    }
  return best;
}

// i: [x, out, R, V]
static int exec_argmax(const llm_cmd *c) {
  const float *x = PTR(c->i[0]);
  int32_t *y = PTR(c->i[1]);
  const int64_t R = c->i[2], V = c->i[3];
  PARALLEL_RANGE(R, 2, {
    for (int64_t r = i0; r < i1; r++) y[r] = argmax_row(x + r * V, V);
  });
  return 0;
}

LLM_EXPORT void llm_op_argmax(int64_t x, int64_t out, int64_t R, int64_t V) {
  llm_cmd c = {.exec = exec_argmax, .i = {x, out, R, V}};
  llm_enqueue(&c);
}
