// On-device sampling on the CPU (Backend.sampleRows): the semantics, packed row layout and result
// layout of src/contracts/device-sampling.ts, computed as src/backends/reference/sampling.ts does
// (float64 weights and masses, float32 processed logits), so the tokens equal the reference
// backend's and the host sampler's. Runs on the worker thread like every op, rows in parallel.
//
// Nothing sorts a whole row: top-k takes the k-th value from a bounded heap (small k) or a
// quickselect; top-p first tries the best 64 candidates (one heap scan; enough for peaked rows),
// else a weighted quickselect finds the cut. The reference sums the top-p mass in (value desc,
// id asc) order; the heap path sums in exactly that order, and the quickselect path, which sums
// in another order, is only trusted when its masses lie farther from the target than their
// rounding error; otherwise the candidates are sorted and summed in the reference's order.
// Every other sum runs in ascending id order, as the reference's.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"

// No FMA contraction of the float64 maths (x - f * c - p must round like the reference's).
#pragma GCC optimize("fp-contract=off")

// Packed layout (contracts/device-sampling.ts; keep in sync)
enum { SR_HDR = 4, SR_ROW_WORDS = 24, SR_ENT_WORDS = 6 };
enum { F_FLAGS = 0, F_TOPK = 1, F_NENT = 2, F_ENT_OFF = 3, F_MASK_OFF = 4, F_NLP = 5 };
enum { F_TEMP = 8, F_TOPP = 10, F_MINP = 12, F_U = 14, F_REP = 16, F_FREQ = 18, F_PRES = 20 };
enum { SR_F_GREEDY = 1, SR_F_MASK = 2, SR_F_LOGPROBS = 4, SR_F_TOPP = 8, SR_F_MINP = 16 };
enum { SAMPLE_ERR_MASKED = -1, SAMPLE_ERR_INF = -2 };
enum { MAX_LOGPROBS = 20, HEAP_TOP_K_LIMIT = 4096, TOP_P_HEAD = 64 };

static double f64_at(const int32_t *buf, int64_t word) {
  double v;
  memcpy(&v, buf + word, sizeof v);
  return v;
}

// ---- (value desc, id asc) order ------------------------------------------------------------------

// a worse than b: lower value, or the same value and a higher id
static inline int worse(float va, int32_t ia, float vb, int32_t ib) { return va < vb || (va == vb && ia > ib); }

static void heap_sift(float *hv, int32_t *hi, int64_t i, int64_t n) {
  for (;;) {
    const int64_t l = 2 * i + 1;
    if (l >= n) return;
    const int64_t r = l + 1;
    const int64_t c = r < n && worse(hv[r], hi[r], hv[l], hi[l]) ? r : l;
    if (!worse(hv[c], hi[c], hv[i], hi[i])) return;
    const float tv = hv[i];
    const int32_t ti = hi[i];
    hv[i] = hv[c], hi[i] = hi[c];
    hv[c] = tv, hi[c] = ti;
    i = c;
  }
}

// The m best of x over ids (ids ascending; NULL = 0..n-1), best first, into out[0..m); returns m
// (clamped to n). NaN counts as -Infinity. hv/hi: scratch of m.
static int64_t top_ids(const float *x, const int32_t *ids, int64_t n, int64_t m, float *hv, int32_t *hi,
                       int32_t *out) {
  if (m > n) m = n;
  if (m <= 0) return 0;
  for (int64_t j = 0; j < m; j++) {
    const int32_t id = ids ? ids[j] : (int32_t)j;
    const float v = x[id];
    hv[j] = v == v ? v : -INFINITY;
    hi[j] = id;
  }
  for (int64_t j = m / 2 - 1; j >= 0; j--) heap_sift(hv, hi, j, m);
  // later ids are higher, so an equal value never beats the root: strict > suffices
  float worst = hv[0];
  for (int64_t j = m; j < n; j++) {
    const int32_t id = ids ? ids[j] : (int32_t)j;
    const float v = x[id];
    if (v > worst) {
      hv[0] = v, hi[0] = id;
      heap_sift(hv, hi, 0, m);
      worst = hv[0];
    }
  }
  for (int64_t size = m; size > 0; size--) {
    out[size - 1] = hi[0];
    hv[0] = hv[size - 1], hi[0] = hi[size - 1];
    heap_sift(hv, hi, 0, size - 1);
  }
  return m;
}

static inline float median3(float a, float b, float c) {
  return a < b ? (b < c ? b : a < c ? c : a) : a < c ? a : b < c ? c : b;
}

// The k-th largest of x[0..n) (1 <= k <= n, no NaN), counting repeats. Small k: a min-heap of
// the k largest values; else quickselect on the copy a[0..n).

/* Restores the min-heap property of a[0..k) below position i (values only). */
static void min_heap_sift_down(float *a, int64_t k, int64_t i) {
  for (;;) {
    const int64_t l = 2 * i + 1, r = l + 1;
    if (l >= k) return;
    const int64_t c = r < k && a[r] < a[l] ? r : l;
    if (!(a[c] < a[i])) return;
    const float t = a[i];
    a[i] = a[c], a[c] = t;
    i = c;
  }
}

static float kth_largest(const float *x, int64_t n, int64_t k, float *a) {
  if (k <= HEAP_TOP_K_LIMIT) {
    for (int64_t j = 0; j < k; j++) a[j] = x[j];
    // min-heap of values (ids do not matter for the value)
    for (int64_t s = k / 2 - 1; s >= 0; s--) min_heap_sift_down(a, k, s);
    for (int64_t j = k; j < n; j++) {
      const float v = x[j];
      if (v > a[0]) {
        a[0] = v;
        min_heap_sift_down(a, k, 0);
      }
    }
    return a[0];
  }
  memcpy(a, x, (size_t)n * sizeof *a);
  int64_t want = k - 1, lo = 0, hi = n;
  for (;;) {
    const float pv = median3(a[lo], a[(lo + hi) >> 1], a[hi - 1]);
    int64_t gt = lo, i = lo, lt = hi;
    while (i < lt) {
      const float v = a[i];
      if (v > pv) {
        a[i] = a[gt];
        a[gt++] = v;
        i++;
      } else if (v < pv) {
        a[i] = a[--lt];
        a[lt] = v;
      } else
        i++;
    }
    if (want < gt - lo)
      hi = gt;
    else if (want < lt - lo)
      return pv;
    else {
      want -= lt - lo;
      lo = lt;
    }
  }
}

static int cmp_i32(const void *a, const void *b) {
  const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

// qsort by (value desc, id asc) over ids; the values come through a file-scope pointer set per
// call (qsort has no context argument); calls happen inside one row, per thread
static _Thread_local const float *g_order_x;
static int cmp_order(const void *a, const void *b) {
  const int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
  const float va = g_order_x[ia], vb = g_order_x[ib];
  if (va != vb) return va > vb ? -1 : 1;
  return (ia > ib) - (ia < ib);
}

// Top-p weighted quickselect (sampling/truncation.ts topPSelect): reorders ids[0..n) so that the
// kept tokens come first and returns their count r. *last_before / *kept_mass: the (approximate)
// mass before the last kept token and of all kept ones.
static int64_t top_p_select(const float *x, const double *w, int32_t *ids, int64_t n, double target,
                            double *last_before, double *kept_mass) {
  int64_t lo = 0, hi = n;
  double before = 0, prev = 0;
  while (lo < hi) {
    const float pv = median3(x[ids[lo]], x[ids[(lo + hi) >> 1]], x[ids[hi - 1]]);
    int64_t gt = lo, i = lo, lt = hi;
    double above = 0;
    while (i < lt) {
      const int32_t id = ids[i];
      const float v = x[id];
      if (v > pv) {
        ids[i] = ids[gt];
        ids[gt++] = id;
        above += w[id];
        i++;
      } else if (v < pv) {
        ids[i] = ids[--lt];
        ids[lt] = id;
      } else
        i++;
    }
    if (gt > lo && before + above >= target) {
      hi = gt;
      continue;
    }
    before += above;
    qsort(ids + gt, (size_t)(lt - gt), sizeof *ids, cmp_i32);
    for (int64_t j = gt; j < lt; j++) {
      if (before >= target) {
        *last_before = prev, *kept_mass = before;
        return j;
      }
      prev = before;
      before += w[ids[j]];
    }
    if (before >= target) {
      *last_before = prev, *kept_mass = before;
      return lt;
    }
    lo = lt;
  }
  // lo < n: a part whose summed mass reached the target fell short when added token by token
  // (rounding); the caller then recomputes the cut exactly
  *last_before = lo == n ? prev : INFINITY, *kept_mass = before;
  return n;
}

// ---- one row ---------------------------------------------------------------------------------------

typedef struct {
  float *x;     // [V] processed row
  double *w;    // [V] weights
  int32_t *c;   // [V] candidates, ascending id
  int32_t *p;   // [V] candidates, permuted by top-p
  float *a;     // [V] quickselect copy / heap values
  int32_t *hi;  // [TOP_P_HEAD] heap ids
  int32_t *top; // [TOP_P_HEAD] best first
} row_scratch;

static size_t row_scratch_bytes(int64_t V) {
  return (size_t)V * (sizeof(float) * 2 + sizeof(double) + sizeof(int32_t) * 2) + 2 * TOP_P_HEAD * sizeof(int32_t) + 64;
}

static row_scratch row_scratch_at(char *base, int64_t V) {
  row_scratch s;
  s.w = (double *)base; // 8-byte aligned first
  s.x = (float *)(s.w + V);
  s.a = s.x + V;
  s.c = (int32_t *)(s.a + V);
  s.p = s.c + V;
  s.hi = s.p + V;
  s.top = s.hi + TOP_P_HEAD;
  return s;
}

// The token of one row (or SAMPLE_ERR_*), from the raw f32 row.
static int32_t sample_row(const float *raw, int64_t V, const int32_t *buf, const int32_t *row, row_scratch *s) {
  const int flags = row[F_FLAGS];
  float *x = s->x;
  double *w = s->w;
  memcpy(x, raw, (size_t)V * sizeof *x);
  // 1. bias, repetition, frequency/presence (float64 maths, float32 stores); ids are distinct
  const int64_t nent = row[F_NENT];
  const int32_t *ent = buf + row[F_ENT_OFF];
  const double rep = f64_at(row, F_REP), freq = f64_at(row, F_FREQ), pres = f64_at(row, F_PRES);
  for (int64_t j = 0; j < nent; j++) {
    const int32_t *e = ent + j * SR_ENT_WORDS;
    const int32_t id = e[0], count = e[1];
    if (e[2]) x[id] = (float)((double)x[id] + f64_at(e, 4));
    if (count >= 0 && rep != 1) x[id] = x[id] > 0 ? (float)((double)x[id] / rep) : (float)((double)x[id] * rep);
    if (count > 0 && (freq != 0 || pres != 0)) x[id] = (float)((double)x[id] - freq * (double)count - pres);
  }
  if (flags & SR_F_MASK) {
    const uint32_t *mask = (const uint32_t *)(buf + row[F_MASK_OFF]);
    for (int64_t i = 0; i < V; i++)
      if (!((mask[i >> 5] >> (i & 31)) & 1u)) x[i] = -INFINITY;
  }
  // NaN -> -Infinity; the argmax (lowest id on ties)
  int32_t best = -1;
  float xmax = -INFINITY;
  for (int64_t i = 0; i < V; i++) {
    const float v = x[i];
    if (v != v) x[i] = -INFINITY;
    else if (v > xmax) {
      xmax = v;
      best = (int32_t)i;
    }
  }
  if (flags & SR_F_GREEDY) return best;
  if (xmax == -INFINITY) return SAMPLE_ERR_MASKED;
  if (xmax == INFINITY) return SAMPLE_ERR_INF;

  const double T = f64_at(row, F_TEMP), dmax = (double)xmax;
  // 2. candidates (ascending id) and their weights exp((x - max) / T); below -746 exp is 0
  int32_t *c = s->c;
  int64_t n = 0;
  const int64_t topk = row[F_TOPK];
  const float kth = topk > 0 ? kth_largest(x, V, topk, s->a) : -INFINITY;
  for (int64_t i = 0; i < V; i++) {
    if (!(x[i] >= kth)) continue;
    const double y = ((double)x[i] - dmax) / T;
    w[i] = y < -746.0 ? 0.0 : exp(y);
    c[n++] = (int32_t)i;
  }
  // 3. top-p: keep, in (value desc, id asc) order, while the mass before < topP * mass
  if (flags & SR_F_TOPP) {
    double total = 0;
    for (int64_t j = 0; j < n; j++) total += w[c[j]];
    const double target = f64_at(row, F_TOPP) * total;
    int64_t kept = -1;
    int32_t *keep = s->top;
    // (a) the best TOP_P_HEAD, summed in the reference's order
    const int64_t h = top_ids(x, c, n, TOP_P_HEAD, s->a, s->hi, s->top);
    double before = 0;
    for (int64_t j = 0; j < h; j++) {
      if (before >= target) {
        kept = j;
        break;
      }
      before += w[s->top[j]];
    }
    if (kept < 0 && (before >= target || h == n)) kept = h;
    if (kept < 0) {
      // (b) weighted quickselect; trusted only when its sums sit clearly on their side of the target
      int32_t *p = s->p;
      memcpy(p, c, (size_t)n * sizeof *p);
      double last_before, mass;
      const int64_t r = top_p_select(x, w, p, n, target, &last_before, &mass);
      const double err = (double)(r + 2) * 0x1p-52 * total;
      if (!(last_before < target - err && (r == n || mass >= target + err))) {
        // (c) near the cut: sort the candidates and sum exactly as the reference does
        g_order_x = x;
        qsort(p, (size_t)n, sizeof *p, cmp_order);
        double b = 0;
        int64_t k = 0;
        while (k < n && b < target) b += w[p[k++]];
        kept = k;
      } else
        kept = r;
      keep = p;
    }
    // the kept ids become the candidates, ascending
    qsort(keep, (size_t)kept, sizeof *keep, cmp_i32);
    memmove(c, keep, (size_t)kept * sizeof *c);
    n = kept;
  }
  // 4. min-p: keep w >= minP
  if (flags & SR_F_MINP) {
    const double minp = f64_at(row, F_MINP);
    int64_t r = 0;
    for (int64_t j = 0; j < n; j++)
      if (w[c[j]] >= minp) c[r++] = c[j];
    n = r;
  }
  // 5. the draw in ascending id order
  double z = 0;
  for (int64_t j = 0; j < n; j++) z += w[c[j]];
  const double target = f64_at(row, F_U) * z;
  double cum = 0;
  int32_t last = -1;
  for (int64_t j = 0; j < n; j++) {
    const double wj = w[c[j]];
    if (!(wj > 0)) continue;
    cum += wj;
    last = c[j];
    if (cum > target) return c[j];
  }
  return last;
}

// log-softmax of the raw row (NaN propagates, as the reference's)
static double log_sum_exp(const float *x, int64_t V) {
  float m = -INFINITY;
  for (int64_t i = 0; i < V; i++)
    if (x[i] > m) m = x[i];
  if (m == -INFINITY || m == INFINITY) return (double)m;
  double s = 0;
  for (int64_t i = 0; i < V; i++) s += exp((double)x[i] - (double)m);
  return (double)m + log(s);
}

static inline void put_f32(int32_t *dst, float v) { memcpy(dst, &v, sizeof v); }

// ---- the op ----------------------------------------------------------------------------------------

// Scratch reused across calls (the worker thread is the only caller): per thread one row_scratch
// and, for f16/bf16 logits, one converted row.
static char *g_scratch;
static size_t g_scratch_bytes;

// i: [logits, dtype, packed (malloc'd, owned), nwords, out, P, V, W]
static int exec_sample_rows(const llm_cmd *c) {
  const char *logits = PTR(c->i[0]);
  const int dt = (int)c->i[1];
  int32_t *buf = PTR(c->i[2]);
  const int64_t nwords = c->i[3];
  int32_t *out = PTR(c->i[4]);
  const int64_t P = c->i[5], V = c->i[6], W = c->i[7];
  int rc = 0;
  // serial checks of the packed buffer (the packer's invariants)
  if (nwords < SR_HDR + P * SR_ROW_WORDS || buf[0] != P || buf[1] != V || 2 + 2 * (int64_t)buf[2] != W) {
    rc = llm_fail("sampleRows: the packed rows do not match %lld rows of %lld", (long long)P, (long long)V);
    goto done;
  }
  for (int64_t r = 0; r < P; r++) {
    const int32_t *row = buf + SR_HDR + r * SR_ROW_WORDS;
    const int64_t ne = row[F_NENT], eo = row[F_ENT_OFF], mo = row[F_MASK_OFF];
    int bad = ne < 0 || eo < 0 || (eo & 1) || eo + ne * SR_ENT_WORDS > nwords || row[F_TOPK] < 0 ||
              row[F_TOPK] >= V || row[F_NLP] < 0 || row[F_NLP] > MAX_LOGPROBS || 2 + 2 * (int64_t)row[F_NLP] > W ||
              ((row[F_FLAGS] & SR_F_MASK) && (mo <= 0 || mo + (V + 31) / 32 > nwords));
    for (int64_t j = 0; !bad && j < ne; j++) {
      const int32_t id = buf[eo + j * SR_ENT_WORDS];
      bad = id < 0 || id >= V;
    }
    if (bad) {
      rc = llm_fail("sampleRows: packed row %lld is malformed", (long long)r);
      goto done;
    }
  }
  if (P == 0) goto done;
  const int nt = (int)(P < omp_get_max_threads() ? P : omp_get_max_threads());
  const size_t per = row_scratch_bytes(V) + (dt == DT_F32 ? 0 : (size_t)V * sizeof(float) + 64);
  const size_t per_al = (per + 63) & ~(size_t)63;
  if (g_scratch_bytes < per_al * (size_t)nt) {
    free(g_scratch);
    g_scratch_bytes = 0;
    g_scratch = malloc(per_al * (size_t)nt);
    if (!g_scratch) {
      rc = llm_fail("sampleRows: out of memory for %d scratch rows of %lld", nt, (long long)V);
      goto done;
    }
    g_scratch_bytes = per_al * (size_t)nt;
  }
  const size_t esz = dtype_size(dt);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t r = 0; r < P; r++) {
    char *mine = g_scratch + per_al * (size_t)omp_get_thread_num();
    row_scratch s = row_scratch_at(mine, V);
    const float *raw;
    if (dt == DT_F32)
      raw = (const float *)(logits + (size_t)r * V * esz);
    else {
      float *conv = (float *)(mine + ((row_scratch_bytes(V) + 63) & ~(size_t)63));
      cvt_to_f32(conv, logits + (size_t)r * V * esz, dt, (size_t)V);
      raw = conv;
    }
    const int32_t *row = buf + SR_HDR + r * SR_ROW_WORDS;
    int32_t *o = out + r * W;
    const int32_t token = sample_row(raw, V, buf, row, &s);
    o[0] = token;
    put_f32(o + 1, NAN);
    for (int64_t j = 0; 2 + 2 * j < W; j++) {
      o[2 + 2 * j] = -1;
      put_f32(o + 3 + 2 * j, NAN);
    }
    if (!(row[F_FLAGS] & SR_F_LOGPROBS) || token < 0) continue;
    const double lse = log_sum_exp(raw, V);
    put_f32(o + 1, (float)((double)raw[token] - lse));
    const int64_t k = top_ids(raw, NULL, V, row[F_NLP], s.a, s.hi, s.top);
    for (int64_t j = 0; j < k; j++) {
      o[2 + 2 * j] = s.top[j];
      put_f32(o + 3 + 2 * j, (float)((double)raw[s.top[j]] - lse));
    }
  }
done:
  free(buf);
  return rc;
}

// Copies the packed rows (nwords int32) now and enqueues the sampling of logits [P, V] (dtype
// f32/f16/bf16) into out i32 [P, W]. Returns 0, or -1 when the copy cannot be allocated.
LLM_EXPORT int llm_op_sample_rows(int64_t logits, int dtype, const void *packed, int64_t nwords, int64_t out, int64_t P,
                                  int64_t V, int64_t W) {
  void *copy = malloc(nwords > 0 ? (size_t)nwords * 4 : 4);
  if (!copy) return -1;
  memcpy(copy, packed, (size_t)nwords * 4);
  llm_cmd c = {.exec = exec_sample_rows, .i = {logits, dtype, (int64_t)(intptr_t)copy, nwords, out, P, V, W}};
  llm_enqueue(&c);
  return 0;
}
