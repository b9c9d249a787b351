// Mixture-of-experts: routing (softmax + top-k) and the expert FFN.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"

// i: [logits, weights_out, experts_out, T, E, topK, renormalize]
static int exec_moe_route(const llm_cmd *c) {
  const float *logits = PTR(c->i[0]);
  float *wout = PTR(c->i[1]);
  int32_t *eout = PTR(c->i[2]);
  const int64_t T = c->i[3], E = c->i[4], K = c->i[5];
  const int renorm = (int)c->i[6];
  PARALLEL_RANGE(T, 64, {
    float *prob = malloc((size_t)E * sizeof(float));
    for (int64_t t = i0; t < i1; t++) {
      const float *x = logits + t * E;
      float mx = -INFINITY, sum = 0.0f;
      for (int64_t e = 0; e < E; e++) mx = x[e] > mx ? x[e] : mx;
      for (int64_t e = 0; e < E; e++) sum += prob[e] = expf(x[e] - mx);
      for (int64_t e = 0; e < E; e++) prob[e] /= sum;
      // top-k by repeated selection: strictly-greater keeps the lower index on ties; taken
      // experts are marked with -1 (probabilities are >= 0).
      float ksum = 0.0f;
      for (int64_t k = 0; k < K; k++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++)
          if (prob[e] >= 0.0f && (best < 0 || prob[e] > prob[best])) best = e;
        eout[t * K + k] = (int32_t)best;
        wout[t * K + k] = prob[best];
        ksum += prob[best];
        prob[best] = -1.0f;
      }
      if (renorm)
        for (int64_t k = 0; k < K; k++) wout[t * K + k] /= ksum;
    }
    free(prob);
  });
  return 0;
}

LLM_EXPORT void llm_op_moe_route(int64_t logits, int64_t weights_out, int64_t experts_out, int64_t T, int64_t E,
                                 int64_t top_k, int renormalize) {
  llm_cmd c = {.exec = exec_moe_route, .i = {logits, weights_out, experts_out, T, E, top_k, renormalize}};
  llm_enqueue(&c);
}

// out[t] = sum_k w[t,k] * down_e(act(gate_e x[t]) * up_e x[t]), e = experts[t,k].
// Tokens are grouped by expert so each expert's weights are streamed once per step, as one
// gather -> gemm(gate), gemm(up) -> glu -> gemm(down) -> weighted scatter-add.
// i: [x, weights, experts, gate, up, down, out, T, K, D, I, E, gate_dt, up_dt, down_dt, act]
static int exec_moe_ffn(const llm_cmd *c) {
  const float *x = PTR(c->i[0]), *rw = PTR(c->i[1]);
  const int32_t *ex = PTR(c->i[2]);
  const char *gate = PTR(c->i[3]), *up = PTR(c->i[4]), *down = PTR(c->i[5]);
  float *out = PTR(c->i[6]);
  const int64_t T = c->i[7], K = c->i[8], D = c->i[9], I = c->i[10], E = c->i[11];
  const int gdt = (int)c->i[12], udt = (int)c->i[13], ddt = (int)c->i[14], act = (int)c->i[15];
  for (int64_t n = 0; n < T * K; n++)
    if (ex[n] < 0 || ex[n] >= E)
      return llm_fail("moeFfn: expert %d of token %lld is out of range [0, %lld)", ex[n], (long long)(n / K),
                      (long long)E);

  // Bucket the T*K (token, k) pairs by expert: order[start[e] .. start[e+1]) lists expert e's.
  int64_t *start = calloc((size_t)E + 1, sizeof(int64_t));
  int64_t *order = malloc((size_t)(T * K + 1) * sizeof(int64_t));
  int64_t maxc = 0;
  for (int64_t n = 0; n < T * K; n++) start[ex[n] + 1]++;
  for (int64_t e = 0; e < E; e++) {
    maxc = start[e + 1] > maxc ? start[e + 1] : maxc;
    start[e + 1] += start[e];
  }
  int64_t *fill = malloc((size_t)(E + 1) * sizeof(int64_t));
  memcpy(fill, start, (size_t)(E + 1) * sizeof(int64_t));
  for (int64_t n = 0; n < T * K; n++) order[fill[ex[n]]++] = n;

  float *xg = malloc((size_t)(maxc * D + 1) * sizeof(float)); // [maxc, D] gathered tokens
  float *g = malloc((size_t)(maxc * I + 1) * sizeof(float));  // [maxc, I] gate, then glu output
  float *u = malloc((size_t)(maxc * I + 1) * sizeof(float));  // [maxc, I] up
  float *y = malloc((size_t)(maxc * D + 1) * sizeof(float));  // [maxc, D] expert output
  memset(out, 0, (size_t)(T * D) * sizeof(float));
  const size_t gsz = (size_t)(I * D) * dtype_size(gdt), usz = (size_t)(I * D) * dtype_size(udt),
               dsz = (size_t)(D * I) * dtype_size(ddt);
  for (int64_t e = 0; e < E; e++) {
    const int64_t cnt = start[e + 1] - start[e];
    if (cnt == 0) continue;
    const int64_t *ord = order + start[e];
    for (int64_t r = 0; r < cnt; r++) memcpy(xg + r * D, x + (ord[r] / K) * D, (size_t)D * sizeof(float));
    gemm(xg, gate + (size_t)e * gsz, gdt, NULL, g, cnt, I, D);
    gemm(xg, up + (size_t)e * usz, udt, NULL, u, cnt, I, D);
    PARALLEL_RANGE(cnt * I, 16384, glu_rows(g + i0, g + i0, u + i0, i1 - i0, act));
    gemm(g, down + (size_t)e * dsz, ddt, NULL, y, cnt, D, I);
    for (int64_t r = 0; r < cnt; r++) {
      const float w = rw[ord[r]];
      float *o = out + (ord[r] / K) * D;
      const float *yr = y + r * D;
      for (int64_t d = 0; d < D; d++) o[d] += w * yr[d];
    }
  }
  free(start);
  free(order);
  free(fill);
  free(xg);
  free(g);
  free(u);
  free(y);
  return 0;
}

LLM_EXPORT void llm_op_moe_ffn(int64_t x, int64_t weights, int64_t experts, int64_t gate, int64_t up, int64_t down,
                               int64_t out, int64_t T, int64_t K, int64_t D, int64_t I, int64_t E, int gate_dt,
                               int up_dt, int down_dt, int act) {
  llm_cmd c = {.exec = exec_moe_ffn,
               .i = {x, weights, experts, gate, up, down, out, T, K, D, I, E, gate_dt, up_dt, down_dt, act}};
  llm_enqueue(&c);
}
