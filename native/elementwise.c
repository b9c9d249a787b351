// Elementwise ops: add, scale, softcap, glu. Each is a CLONES range kernel called per chunk.
#include <math.h>

#include "fastmath.h"
#include "llm.h"

#define GRAIN 65536 // elements below which one thread does the whole op

CLONES static void add_range(float *o, const float *a, const float *b, float s, int64_t n) {
  for (int64_t i = 0; i < n; i++) o[i] = a[i] + s * b[i];
}

// i: [a, b, out, n]; f: [bScale]
static int exec_add(const llm_cmd *c) {
  float *o = PTR(c->i[2]);
  const float *a = PTR(c->i[0]), *b = PTR(c->i[1]);
  const float s = (float)c->f[0];
  PARALLEL_RANGE(c->i[3], GRAIN, add_range(o + i0, a + i0, b + i0, s, i1 - i0));
  return 0;
}

LLM_EXPORT void llm_op_add(int64_t a, int64_t b, int64_t out, int64_t n, double bscale) {
  llm_cmd c = {.exec = exec_add, .i = {a, b, out, n}, .f = {bscale}};
  llm_enqueue(&c);
}

CLONES static void scale_range(float *o, const float *x, float s, int64_t n) {
  for (int64_t i = 0; i < n; i++) o[i] = x[i] * s;
}

// i: [x, out, n]; f: [s]
static int exec_scale(const llm_cmd *c) {
  float *o = PTR(c->i[1]);
  const float *x = PTR(c->i[0]);
  const float s = (float)c->f[0];
  PARALLEL_RANGE(c->i[2], GRAIN, scale_range(o + i0, x + i0, s, i1 - i0));
  return 0;
}

LLM_EXPORT void llm_op_scale(int64_t x, int64_t out, int64_t n, double s) {
  llm_cmd c = {.exec = exec_scale, .i = {x, out, n}, .f = {s}};
  llm_enqueue(&c);
}

CLONES static void softcap_range(float *o, const float *x, float cap, int64_t n) {
  for (int64_t i = 0; i < n; i++) o[i] = cap * fast_tanhf(x[i] / cap);
}

// i: [x, out, n]; f: [cap]
static int exec_softcap(const llm_cmd *c) {
  float *o = PTR(c->i[1]);
  const float *x = PTR(c->i[0]);
  const float cap = (float)c->f[0];
  PARALLEL_RANGE(c->i[2], GRAIN / 8, softcap_range(o + i0, x + i0, cap, i1 - i0));
  return 0;
}

LLM_EXPORT void llm_op_softcap(int64_t x, int64_t out, int64_t n, double cap) {
  llm_cmd c = {.exec = exec_softcap, .i = {x, out, n}, .f = {cap}};
  llm_enqueue(&c);
}

// Activations follow PyTorch: silu(x) = x * sigmoid(x); gelu_tanh is gelu(approximate='tanh');
// gelu is the exact erf form (libm erff: scalar, but rare). exp/tanh are the vectorisable
// fastmath.h versions (~2 ulp).
CLONES void glu_rows(float *out, const float *gate, const float *up, int64_t n, int act) {
  switch (act) {
  case ACT_SILU:
    for (int64_t i = 0; i < n; i++) {
      const float g = gate[i];
      out[i] = g / (1.0f + fast_expf(-g)) * up[i];
    }
    break;
  case ACT_GELU_TANH:
    for (int64_t i = 0; i < n; i++) {
      const float g = gate[i];
      const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);
      out[i] = 0.5f * g * (1.0f + fast_tanhf(inner)) * up[i];
    }
    break;
  default:
    for (int64_t i = 0; i < n; i++) {
      const float g = gate[i];
      out[i] = 0.5f * g * (1.0f + erff(g * 0.7071067811865476f)) * up[i];
    }
  }
}

// i: [gate, up, out, n, act]
static int exec_glu(const llm_cmd *c) {
  float *o = PTR(c->i[2]);
  const float *g = PTR(c->i[0]), *u = PTR(c->i[1]);
  const int act = (int)c->i[4];
  PARALLEL_RANGE(c->i[3], GRAIN / 8, glu_rows(o + i0, g + i0, u + i0, i1 - i0, act));
  return 0;
}

LLM_EXPORT void llm_op_glu(int64_t gate, int64_t up, int64_t out, int64_t n, int act) {
  llm_cmd c = {.exec = exec_glu, .i = {gate, up, out, n, act}};
  llm_enqueue(&c);
}
