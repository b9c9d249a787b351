// Q8_0, Q4_0, Q4_1, Q5_1, Q4_K, Q5_K, Q6_K and IQ4_XS matmul weights kept quantized (DT_Q8_0_P16 .. DT_Q6_K_P16, DT_Q5_K_P16 .. DT_Q5_1_P16): the CPU
// backend's layout for a GGUF file's matrices of those types, made once at load
// (llm_op_pack_quant) from the file's ggml blocks, and the arithmetic every kernel of it computes.
//
// Why: decode streams every weight once a token, so its speed is the weights' bytes; Q8_0 holds
// 34 bytes per 32 weights and Q4_0 18, against bf16's 64. The integer dot products (AVX512-VNNI
// vpdpbusd: 16 lanes x 4 byte products a lane, summed exactly into int32) also do four times the
// multiply-adds of an f32 FMA per instruction at prefill.
//
// Layout, as weight_pack.c's bf16 panels: weight rows in the vector lanes, so every output element
// is one chain whatever M is and no reduction tree follows. Panel p holds rows 16p .. 16p + 15 of
// w[N][K] (K a multiple of 32, KB = K / 32 blocks; rows past N have zero weights and scales):
//   quants  KB blocks of QB bytes, then
//   scales  KB x 16 f16 (row 16p + l's block scale at [b][l]), the file's own f16 values.
// Q8_0 (QB = 512): block b is 8 vectors of 64 bytes, one per group of 4 k: byte (g, l, t) = the
//   weight of row 16p + l at k = 32 b + 4 g + t, plus 128, as an unsigned byte.
// Q4_0 (QB = 256): the nibbles stay nibbles (half the bytes to stream: decode is bound by them, and
//   unpacking costs two ands and a shift a vector, in registers): block b is 4 vectors of 64
//   bytes; byte (j, l, t) holds row 16p + l's 4-bit value (weight + 8) at k = 32 b + 8 j + t in its
//   low nibble and at k = 32 b + 8 j + 4 + t in its high nibble.
// Q4_K (K a multiple of 256, KS = K / 256 super-blocks): quants as Q4_0's (4-bit values 0..15, no
//   offset: Q4_K subtracts a min instead), then in place of the f16 scales
//     sc    KB x 16 bytes: row 16p + l's 6-bit sub-block scale of block b at [b][l]
//     mn    KB x 16 bytes: its 6-bit sub-block min
//     d     KS x 16 f16: the super-block's scale, dmin KS x 16 f16: its min's scale (the file's values).
//   296 bytes a panel block of 32 k against the file's 288 (144 per 256 weights, 16 rows): the
//   weight is w = (d * sc) * q - (dmin * mn), both products exact in f32 (11 x 6 significant bits).
// Q6_K (K a multiple of 256): a block of 32 k holds two of the file's sub-blocks of 16, each with its
//   own int8 scale; the 6-bit values q (0..63, weight + 32) split in two:
//     lo    256 bytes: q & 15 as Q4_0's nibbles (byte (j, l, t): k = 32 b + 8 j + t low, + 4 high)
//     hi    128 bytes: 2 vectors of 64; vector h's byte (l, t) holds in bits 2j, 2j + 1 the q >> 4 of
//           row 16p + l at k = 32 b + 8 j + 4 h + t (j = 0..3)
//   (384 bytes a block), then sc KB x 2 x 16 int8 (row 16p + l's scale of the block's half h at
//   [b][h][l]) and d KS x 16 f16: 420 bytes a panel block against the file's 420 (210 per 256
//   weights). w = (d * sc) * (q - 32), d * sc exact in f32 (11 x 8 bits).
//
// Q5_K (K a multiple of 256): Q4_K's panel with the fifth bits after each block's nibbles:
//     hi    64 bytes: byte (l, t) holds in bit 2j + h the q >> 4 of row 16p + l at k = 32 b + 8 j + 4 h + t
//   (320 bytes a block), then sc, mn, d and dmin as Q4_K's: 360 bytes a panel block against the file's
//   352 (176 per 256 weights). w = (d * sc) * q - (dmin * mn), q in 0..31.
// IQ4_XS (K a multiple of 256): the nibbles as Q4_0's (each indexes the non-linear table kv of 16 int8
//   values), then sc KB x 16 int8 (row 16p + l's 6-bit block scale minus 32 at [b][l]) and d KS x 16 f16:
//   276 bytes a panel block against the file's 272 (136 per 256 weights). w = (d * sc) * kv[q], d * sc
//   exact in f32; the kernels multiply kv[q] + 128 (unsigned) and start from -128 times x's block sum.
// Q4_1 / Q5_1 (K a multiple of 32): the nibbles as Q4_0's (values 0..15, no offset), Q5_1 with fifth bits
//   as Q5_K's after each block's nibbles, then d KB x 16 f16 (the file's scale) and nm KB x 16 f16 (its
//   min, negated: exact): 320 / 384 bytes a panel block, the file's 20 / 24 per 32 weights. w = d * q + m.
//
// Why unsigned weights: vpdpbusd multiplies unsigned bytes by signed ones. The weights take the
// unsigned side, offset by C (128 for Q8_0, 8 for Q4_0: its nibbles as they are, 32 for Q6_K), and the
// activations stay signed; then sum_k (w + C) x = sum_k w x + C sum_k x, and C sum_k x is one
// integer per activation row and block, computed when x is quantized and started from (-C sum x)
// in the accumulator: no extra weight bytes and no extra instruction. llama.cpp's alternative
// (|x| unsigned, the sign moved onto the weights) would change the weights on every call, for
// each row of x.
//
// Arithmetic (every ISA, every M, bit for bit; test/backends/cpu-quant-weights.test.ts holds a
// TypeScript model of it):
//   x, per row and block of 32: d = max|x| / 127 (f32 division), q = x / d (f32) rounded to nearest,
//   ties to even, clamped to [-127, 127] (all 0 when d is 0), as llama.cpp quantizes activations to
//   Q8_0 but with an f32 d.
//   y[m][n] = the f32 sum over blocks b in order: acc = acc + float(i_b) * (d_x * d_w), where i_b is
//   the exact int32 dot of the block's quantized values (|i_b| < 2^24, so float(i_b) is exact), the
//   products and the sum each rounded to f32 (never fused), then y = acc + bias[n].
//   Q4_K: d_w = d * sc and m_w = dmin * mn (exact), i_b the dot of x's values with the 4-bit q, s_b
//   the sum of x's values in the block; acc = (acc + float(i_b) * (d_x * d_w)) - float(s_b) * (d_x * m_w),
//   each product and sum rounded to f32, in that order.
//   Q5_K: as Q4_K, i_b the dot with the 5-bit q. IQ4_XS: as Q8_0, d_w = d * sc. Q4_1 / Q5_1: as Q4_K with
//   d_w = d and m_w = -m (so the min term's subtraction adds m's).
//   Q6_K: the block's two halves of 16 k in turn, acc = acc + float(i_h) * (d_x * d_w_h), i_h the dot
//   over the half (started from -32 times the half's sum of x's values, so it is that of q - 32).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"
#include "simd.h"

enum { Q41_BLOCK_BYTES = 20, Q51_BLOCK_BYTES = 24, Q8_BLOCK_BYTES = 34, Q4_BLOCK_BYTES = 18, Q4K_BLOCK_BYTES = 144, Q6K_BLOCK_BYTES = 210, Q5K_BLOCK_BYTES = 176,
       IQ4XS_BLOCK_BYTES = 136 };

// IQ4_NL / IQ4_XS's table (ggml's kvalues_iq4nl)
static const int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static int quant_q4(int dt) { return dt == DT_Q4_0_P16; }

// Q6_K panel block q's 6-bit value of row l at k = 8 j + 4 hh + t (hh 0: the low nibble's k, 1: the high's).
static inline int q6k_value(const uint8_t *q, int j, int hh, int l, int t) {
  const uint8_t u = q[j * 64 + l * 4 + t];
  return ((hh ? u >> 4 : u) & 0xF) | (((q[256 + hh * 64 + l * 4 + t] >> (2 * j)) & 3) << 4);
}

// Q4_K sub-block j's (0..7) 6-bit scale and min from the 12 scale bytes at s (ggml's get_scale_min_k4).
static void q4k_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    *mn = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// Q4_K (q5 0) or Q5_K (q5 1) panel p from the ggml blocks (row n's super-block s at raw + (n KS + s) *
// 144 or 176: d, dmin, 12 scale bytes, Q5_K's 32 bytes of fifth bits, the 128 bytes of nibbles).
static void pack_panel_q4k(uint8_t *dst, const uint8_t *raw, int64_t N, int64_t KB, int64_t p, int q5) {
  const int64_t KS = KB / 8, qb = q5 ? 320 : 256, bb = q5 ? Q5K_BLOCK_BYTES : Q4K_BLOCK_BYTES;
  uint8_t *sc = dst + KB * qb, *mn = sc + KB * 16;
  uint16_t *d = (uint16_t *)(mn + KB * 16), *dmin = d + KS * 16;
  for (int64_t l = 0; l < 16; l++) {
    const int64_t n = p * 16 + l;
    for (int64_t s = 0; s < KS; s++) {
      if (n >= N) {
        d[s * 16 + l] = dmin[s * 16 + l] = 0;
        for (int64_t b = s * 8; b < s * 8 + 8; b++) {
          sc[b * 16 + l] = mn[b * 16 + l] = 0;
          for (int j = 0; j < qb / 64; j++) memset(dst + b * qb + j * 64 + l * 4, 0, 4);
        }
        continue;
      }
      const uint8_t *src = raw + (n * KS + s) * bb;
      memcpy(&d[s * 16 + l], src, 2);
      memcpy(&dmin[s * 16 + l], src + 2, 2);
      const uint8_t *qh = src + 16; // Q5_K: bit jb of qh[e] is the fifth bit of sub-block jb's element e
      for (int jb = 0; jb < 8; jb++) {
        const int64_t b = s * 8 + jb;
        q4k_scale_min(src + 4, jb, &sc[b * 16 + l], &mn[b * 16 + l]);
        // ggml: sub-block jb's element e is nibble (jb & 1) of qs[32 (jb >> 1) + e]
        const uint8_t *qs = src + (q5 ? 48 : 16) + 32 * (jb >> 1);
        const int shift = (jb & 1) * 4;
        uint8_t *q = dst + b * qb;
        for (int t = 0; t < 4; t++) {
          uint8_t hv = 0;
          for (int j = 0; j < 4; j++) {
            q[j * 64 + l * 4 + t] = (uint8_t)(((qs[8 * j + t] >> shift) & 0xF) | (((qs[8 * j + 4 + t] >> shift) & 0xF) << 4));
            if (q5)
              for (int h = 0; h < 2; h++) hv |= (uint8_t)(((qh[8 * j + 4 * h + t] >> jb) & 1) << (2 * j + h));
          }
          if (q5) q[256 + l * 4 + t] = hv;
        }
      }
    }
  }
}

// IQ4_XS panel p from the ggml blocks (row n's super-block s at raw + (n KS + s) * 136: d, scales_h,
// scales_l[4], then sub-block j's 16 bytes of nibbles, low nibbles its elements 0..15).
static void pack_panel_iq4xs(uint8_t *dst, const uint8_t *raw, int64_t N, int64_t KB, int64_t p) {
  const int64_t KS = KB / 8;
  int8_t *sc = (int8_t *)(dst + KB * 256);
  uint16_t *d = (uint16_t *)(dst + KB * 256 + KB * 16);
  for (int64_t l = 0; l < 16; l++) {
    const int64_t n = p * 16 + l;
    for (int64_t s = 0; s < KS; s++) {
      const uint8_t *src = n < N ? raw + (n * KS + s) * IQ4XS_BLOCK_BYTES : NULL;
      if (src) memcpy(&d[s * 16 + l], src, 2);
      else d[s * 16 + l] = 0;
      const int sh = src ? src[2] | (src[3] << 8) : 0;
      for (int jb = 0; jb < 8; jb++) {
        const int64_t b = s * 8 + jb;
        uint8_t u[32]; // rows past N: index 8 (a small value times a zero scale)
        for (int e = 0; e < 16; e++) {
          u[e] = src ? src[8 + 16 * jb + e] & 0xF : 8;
          u[e + 16] = src ? src[8 + 16 * jb + e] >> 4 : 8;
        }
        sc[b * 16 + l] = src ? (int8_t)((((src[4 + (jb >> 1)] >> ((jb & 1) * 4)) & 0xF) | (((sh >> (2 * jb)) & 3) << 4)) - 32) : 0;
        uint8_t *q = dst + b * 256;
        for (int j = 0; j < 4; j++)
          for (int t = 0; t < 4; t++) q[j * 64 + l * 4 + t] = (uint8_t)(u[8 * j + t] | (u[8 * j + 4 + t] << 4));
      }
    }
  }
}

// Q6_K panel p from the ggml blocks (row n's super-block s at raw + (n KS + s) * 210).
static void pack_panel_q6k(uint8_t *dst, const uint8_t *raw, int64_t N, int64_t KB, int64_t p) {
  const int64_t KS = KB / 8;
  int8_t *sc = (int8_t *)(dst + KB * 384);
  uint16_t *d = (uint16_t *)(dst + KB * 384 + KB * 32);
  for (int64_t l = 0; l < 16; l++) {
    const int64_t n = p * 16 + l;
    for (int64_t s = 0; s < KS; s++) {
      const uint8_t *src = n < N ? raw + (n * KS + s) * Q6K_BLOCK_BYTES : NULL;
      if (src) memcpy(&d[s * 16 + l], src + 208, 2);
      else d[s * 16 + l] = 0;
      for (int jb = 0; jb < 8; jb++) {
        const int64_t b = s * 8 + jb;
        uint8_t q[32]; // the block's 6-bit values, k order (rows past N: 32, a zero weight)
        for (int e = 0; e < 32; e++) {
          if (!src) {
            q[e] = 32;
            continue;
          }
          // ggml: element x (0..255) is nibble (x >> 6) & 1 of ql[64 (x >> 7) + (x & 63)] with bits
          // 2 ((x >> 5) & 3) of qh[32 (x >> 7) + (x & 31)] above it
          const int x = jb * 32 + e, h = x >> 7;
          const int lo = (src[64 * h + (x & 63)] >> (((x >> 6) & 1) * 4)) & 0xF;
          const int hi = (src[128 + 32 * h + (x & 31)] >> (((x >> 5) & 3) * 2)) & 3;
          q[e] = (uint8_t)(lo | (hi << 4));
        }
        for (int h = 0; h < 2; h++) sc[b * 32 + h * 16 + l] = src ? (int8_t)src[192 + 2 * jb + h] : 0;
        uint8_t *o = dst + b * 384;
        for (int t = 0; t < 4; t++) {
          uint8_t hv[2] = {0, 0};
          for (int j = 0; j < 4; j++) {
            o[j * 64 + l * 4 + t] = (uint8_t)((q[8 * j + t] & 0xF) | ((q[8 * j + 4 + t] & 0xF) << 4));
            for (int h = 0; h < 2; h++) hv[h] |= (uint8_t)((q[8 * j + 4 * h + t] >> 4) << (2 * j));
          }
          for (int h = 0; h < 2; h++) o[256 + h * 64 + l * 4 + t] = hv[h];
        }
      }
    }
  }
}

// Q4_1 (q5 0) or Q5_1 (q5 1) panel p from the ggml blocks (row n's block b at raw + (n KB + b) * 20 or
// 24: d, m, Q5_1's u32 of fifth bits (bit e: element e's), 16 bytes of nibbles, low nibbles elements 0..15).
static void pack_panel_q41(uint8_t *dst, const uint8_t *raw, int64_t N, int64_t KB, int64_t p, int q5) {
  const int64_t qb = q5 ? 320 : 256, bb = q5 ? Q51_BLOCK_BYTES : Q41_BLOCK_BYTES;
  uint16_t *d = (uint16_t *)(dst + KB * qb), *nm = d + KB * 16;
  for (int64_t l = 0; l < 16; l++) {
    const int64_t n = p * 16 + l;
    for (int64_t b = 0; b < KB; b++) {
      uint8_t *q = dst + b * qb;
      if (n >= N) {
        d[b * 16 + l] = nm[b * 16 + l] = 0;
        for (int j = 0; j < qb / 64; j++) memset(q + j * 64 + l * 4, 0, 4);
        continue;
      }
      const uint8_t *src = raw + (n * KB + b) * bb;
      memcpy(&d[b * 16 + l], src, 2);
      uint16_t m;
      memcpy(&m, src + 2, 2);
      nm[b * 16 + l] = (uint16_t)(m ^ 0x8000);
      uint32_t qh = 0;
      if (q5) memcpy(&qh, src + 4, 4);
      const uint8_t *qs = src + (q5 ? 8 : 4);
      uint8_t u[32];
      for (int e = 0; e < 16; e++) {
        u[e] = (uint8_t)((qs[e] & 0xF) | (((qh >> e) & 1) << 4));
        u[e + 16] = (uint8_t)((qs[e] >> 4) | (((qh >> (e + 16)) & 1) << 4));
      }
      for (int t = 0; t < 4; t++) {
        uint8_t hv = 0;
        for (int j = 0; j < 4; j++) {
          q[j * 64 + l * 4 + t] = (uint8_t)((u[8 * j + t] & 0xF) | ((u[8 * j + 4 + t] & 0xF) << 4));
          for (int h = 0; h < 2; h++) hv |= (uint8_t)((u[8 * j + 4 * h + t] >> 4) << (2 * j + h));
        }
        if (q5) q[256 + l * 4 + t] = hv;
      }
    }
  }
}

// Packs panel p from the ggml blocks (row n's block b at raw + (n KB + b) * block bytes).
static void pack_panel(uint8_t *dst, const uint8_t *raw, int dt, int64_t N, int64_t KB, int64_t p) {
  const int q4 = quant_q4(dt);
  const int64_t qb = q4 ? 256 : 512, bb = q4 ? Q4_BLOCK_BYTES : Q8_BLOCK_BYTES;
  uint16_t *scales = (uint16_t *)(dst + KB * qb);
  for (int64_t l = 0; l < 16; l++) {
    const int64_t n = p * 16 + l;
    for (int64_t b = 0; b < KB; b++) {
      uint8_t *q = dst + b * qb;
      if (n >= N) {
        scales[b * 16 + l] = 0;
        if (q4)
          for (int j = 0; j < 4; j++) memset(q + j * 64 + l * 4, 0x88, 4);
        else
          for (int g = 0; g < 8; g++) memset(q + g * 64 + l * 4, 0x80, 4);
        continue;
      }
      const uint8_t *src = raw + (n * KB + b) * bb;
      memcpy(&scales[b * 16 + l], src, 2);
      if (q4) {
        // ggml: byte j's low nibble is element j, its high nibble element j + 16
        uint8_t u[32];
        for (int j = 0; j < 16; j++) {
          u[j] = src[2 + j] & 0xF;
          u[j + 16] = src[2 + j] >> 4;
        }
        for (int j = 0; j < 4; j++)
          for (int t = 0; t < 4; t++) q[j * 64 + l * 4 + t] = (uint8_t)(u[8 * j + t] | (u[8 * j + 4 + t] << 4));
      } else {
        for (int g = 0; g < 8; g++)
          for (int t = 0; t < 4; t++) q[g * 64 + l * 4 + t] = (uint8_t)(src[2 + 4 * g + t] ^ 0x80); // int8 + 128
      }
    }
  }
}

// i: [src (ggml blocks of w[N][K]), dst (quant_p16_bytes), N, K, dtype (a quantized panel dtype)]
static int exec_pack_quant(const llm_cmd *c) {
  const uint8_t *raw = PTR(c->i[0]);
  uint8_t *dst = PTR(c->i[1]);
  const int64_t N = c->i[2], K = c->i[3];
  const int dt = (int)c->i[4];
  if (!dt_quant(dt)) return llm_fail("packQuant: dtype code %d is not a quantized panel type", dt);
  const int64_t kmul = quant_k_multiple(dt);
  if (K <= 0 || K % kmul != 0) return llm_fail("packQuant: K = %lld is not a positive multiple of %lld", (long long)K, (long long)kmul);
  const int64_t P = (N + 15) / 16, KB = K / 32, pb = (int64_t)quant_p16_bytes(16, K, dt);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < P; p++) {
    if (dt == DT_Q4_K_P16 || dt == DT_Q5_K_P16) pack_panel_q4k(dst + p * pb, raw, N, KB, p, dt == DT_Q5_K_P16);
    else if (dt == DT_IQ4_XS_P16) pack_panel_iq4xs(dst + p * pb, raw, N, KB, p);
    else if (dt == DT_Q4_1_P16 || dt == DT_Q5_1_P16) pack_panel_q41(dst + p * pb, raw, N, KB, p, dt == DT_Q5_1_P16);
    else if (dt == DT_Q6_K_P16) pack_panel_q6k(dst + p * pb, raw, N, KB, p);
    else pack_panel(dst + p * pb, raw, dt, N, KB, p);
  }
  return 0;
}

LLM_EXPORT void llm_op_pack_quant(int64_t src, int64_t dst, int64_t N, int64_t K, int dtype) {
  llm_cmd c = {.exec = exec_pack_quant, .i = {src, dst, N, K, dtype}};
  llm_enqueue(&c);
}

LLM_EXPORT int64_t llm_quant_p16_bytes(int64_t N, int64_t K, int dtype) { return (int64_t)quant_p16_bytes(N, K, dtype); }

void quant_row_to_f32(float *dst, const void *w, int dt, int64_t n, int64_t K) {
  const int q4 = quant_q4(dt);
  const int64_t KB = K / 32, qb = q4 ? 256 : 512, l = n % 16;
  const uint8_t *panel = (const uint8_t *)w + (n / 16) * (int64_t)quant_p16_bytes(16, K, dt);
  if (quant_has_min(quant_kind(dt))) {
    // K-quants: (d * sc) * q - dmin * mn; Q4_1 / Q5_1: d * q - (-m); rounded as gguf dequantizes: the
    // product, then the difference
    const int kind = quant_kind(dt), kq = kind == QK_Q4_K || kind == QK_Q5_K;
    const int64_t kqb = quant_quants_bytes(kind);
    const uint8_t *sc = panel + KB * kqb, *mn = sc + KB * 16;
    const uint16_t *d = (const uint16_t *)(mn + KB * 16), *dmin = d + (KB / 8) * 16;
    const uint16_t *d1 = (const uint16_t *)(panel + KB * kqb), *nm1 = d1 + KB * 16;
    for (int64_t b = 0; b < KB; b++) {
      const float dw = kq ? f16_to_f32(d[(b / 8) * 16 + l]) * (float)sc[b * 16 + l] : f16_to_f32(d1[b * 16 + l]);
      const float mw = kq ? f16_to_f32(dmin[(b / 8) * 16 + l]) * (float)mn[b * 16 + l] : f16_to_f32(nm1[b * 16 + l]);
      const uint8_t *q = panel + b * kqb;
      float *o = dst + b * 32;
      for (int j = 0; j < 4; j++)
        for (int t = 0; t < 4; t++) {
          const uint8_t u = q[j * 64 + l * 4 + t];
          const int h5 = quant_has_fifth(kind) ? q[256 + l * 4 + t] >> (2 * j) : 0;
          const float lo = (float)((u & 0xF) | ((h5 & 1) << 4)) * dw, hi = (float)((u >> 4) | ((h5 & 2) << 3)) * dw;
          o[8 * j + t] = lo - mw;
          o[8 * j + 4 + t] = hi - mw;
        }
    }
    return;
  }
  if (dt == DT_IQ4_XS_P16) { // (d * sc) * kv[q], exact
    const int8_t *sc = (const int8_t *)(panel + KB * 256);
    const uint16_t *d = (const uint16_t *)(panel + KB * 256 + KB * 16);
    for (int64_t b = 0; b < KB; b++) {
      const float dw = f16_to_f32(d[(b / 8) * 16 + l]) * (float)sc[b * 16 + l];
      const uint8_t *q = panel + b * 256;
      float *o = dst + b * 32;
      for (int j = 0; j < 4; j++)
        for (int t = 0; t < 4; t++) {
          const uint8_t u = q[j * 64 + l * 4 + t];
          o[8 * j + t] = (float)IQ4_VALUES[u & 0xF] * dw;
          o[8 * j + 4 + t] = (float)IQ4_VALUES[u >> 4] * dw;
        }
    }
    return;
  }
  if (dt == DT_Q6_K_P16) { // (d * sc) * (q - 32), exact
    const int8_t *sc = (const int8_t *)(panel + KB * 384);
    const uint16_t *d = (const uint16_t *)(panel + KB * 384 + KB * 32);
    for (int64_t b = 0; b < KB; b++) {
      const uint8_t *q = panel + b * 384;
      float *o = dst + b * 32;
      for (int j = 0; j < 4; j++) {
        const float dw = f16_to_f32(d[(b / 8) * 16 + l]) * (float)sc[b * 32 + (j >> 1) * 16 + l];
        for (int t = 0; t < 4; t++) {
          o[8 * j + t] = (float)(q6k_value(q, j, 0, l, t) - 32) * dw;
          o[8 * j + 4 + t] = (float)(q6k_value(q, j, 1, l, t) - 32) * dw;
        }
      }
    }
    return;
  }
  const uint16_t *scales = (const uint16_t *)(panel + KB * qb);
  for (int64_t b = 0; b < KB; b++) {
    const float d = f16_to_f32(scales[b * 16 + l]);
    const uint8_t *q = panel + b * qb;
    float *o = dst + b * 32;
    if (q4) {
      for (int j = 0; j < 4; j++)
        for (int t = 0; t < 4; t++) {
          const uint8_t u = q[j * 64 + l * 4 + t];
          o[8 * j + t] = (float)((u & 0xF) - 8) * d;
          o[8 * j + 4 + t] = (float)((u >> 4) - 8) * d;
        }
    } else {
      for (int g = 0; g < 8; g++)
        for (int t = 0; t < 4; t++) o[4 * g + t] = (float)(q[g * 64 + l * 4 + t] - 128) * d;
    }
  }
}

// ---- activations -------------------------------------------------------------------------------

void quant_x_rows_portable(const float *x, int8_t *xq, float *xd, int32_t *xc, int c_off, int sums, int64_t m0,
                           int64_t m1, int64_t K) {
  const int64_t KB = K / 32;
  for (int64_t m = m0; m < m1; m++)
    for (int64_t b = 0; b < KB; b++) {
      const float *v = x + m * K + b * 32;
      float amax = 0.0f;
      for (int j = 0; j < 32; j++) {
        const float a = fabsf(v[j]);
        amax = a > amax ? a : amax;
      }
      const float d = amax / 127.0f;
      int32_t sum[2] = {0, 0};
      for (int j = 0; j < 32; j++) {
        int32_t q = 0;
        if (d > 0.0f) {
          float r = rintf(v[j] / d); // the default rounding mode: nearest, ties to even
          r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
          q = (int32_t)r;
        }
        xq[m * K + b * 32 + j] = (int8_t)q;
        sum[j >> 4] += q;
      }
      xd[m * KB + b] = d;
      if (sums == 2) {
        xc[(m * KB + b) * 2] = -c_off * sum[0];
        xc[(m * KB + b) * 2 + 1] = -c_off * sum[1];
      } else {
        xc[m * KB + b] = -c_off * (sum[0] + sum[1]);
      }
    }
}

// ---- the portable kernel -----------------------------------------------------------------------

// y rows [m0, m1) x panel p. Compiled for AVX2 (no FMA: nothing can fuse the f32 multiply and add)
// or the baseline; the int dots vectorise, the f32 steps run lane by lane as the VNNI kernel's do.
// kind: QK_* (llm.h); xc holds what quant_x_offset / quant_x_sums say for it.
__attribute__((target_clones("avx2", "default"))) static void
quant_panel_portable(const int8_t *xq, const float *xd, const int32_t *xc, const uint8_t *panel, int kind,
                     const float *bias, float *y, int64_t N, int64_t K, int64_t m0, int64_t m1, int64_t p) {
  const int64_t KB = K / 32, qb = quant_quants_bytes(kind);
  const int kmin = quant_has_min(kind), kq = kind == QK_Q4_K || kind == QK_Q5_K;
  const uint16_t *d1 = (const uint16_t *)(panel + KB * qb), *nm1 = d1 + KB * 16; // Q4_1 / Q5_1
  const uint16_t *scales = (const uint16_t *)(panel + KB * qb);
  const uint8_t *ksc = panel + KB * qb, *kmn = ksc + KB * 16;
  const uint16_t *kd = (const uint16_t *)(kmn + KB * 16), *kdmin = kd + (KB / 8) * 16;
  const int8_t *q6sc = (const int8_t *)(panel + KB * 384);
  const uint16_t *q6d = (const uint16_t *)(panel + KB * 384 + KB * 32);
  const int8_t *xsc = (const int8_t *)(panel + KB * 256);
  const uint16_t *xsd = (const uint16_t *)(panel + KB * 256 + KB * 16);
  uint8_t iq4u[16]; // IQ4_XS: the table's values + 128, the unsigned side of the dots
  for (int i = 0; i < 16; i++) iq4u[i] = (uint8_t)(IQ4_VALUES[i] + 128);
  for (int64_t m = m0; m < m1; m++) {
    float acc[16] = {0};
    for (int64_t b = 0; b < KB; b++) {
      const int8_t *xb = xq + m * K + b * 32;
      const uint8_t *q = panel + b * qb;
      const float dx = xd[m * KB + b];
      if (kind == QK_Q6_K) {
        for (int h = 0; h < 2; h++) {
          int32_t is[16];
          for (int l = 0; l < 16; l++) is[l] = xc[(m * KB + b) * 2 + h];
          for (int j = 2 * h; j < 2 * h + 2; j++)
            for (int l = 0; l < 16; l++)
              for (int t = 0; t < 4; t++)
                is[l] += q6k_value(q, j, 0, l, t) * xb[8 * j + t] + q6k_value(q, j, 1, l, t) * xb[8 * j + 4 + t];
          for (int l = 0; l < 16; l++) {
            const float dw = f16_to_f32(q6d[(b / 8) * 16 + l]) * (float)q6sc[b * 32 + h * 16 + l];
            const float s = dx * dw;
            const float f = (float)is[l] * s;
            acc[l] = acc[l] + f;
          }
        }
        continue;
      }
      int32_t is[16];
      for (int l = 0; l < 16; l++) is[l] = kmin ? 0 : xc[m * KB + b];
      if (kind != QK_Q8_0) {
        for (int j = 0; j < 4; j++)
          for (int l = 0; l < 16; l++)
            for (int t = 0; t < 4; t++) {
              const uint8_t u = q[j * 64 + l * 4 + t];
              int32_t lo = u & 0xF, hi = u >> 4;
              if (quant_has_fifth(kind)) {
                const int h5 = q[256 + l * 4 + t] >> (2 * j);
                lo |= (h5 & 1) << 4;
                hi |= (h5 & 2) << 3;
              } else if (kind == QK_IQ4_XS) {
                lo = iq4u[lo];
                hi = iq4u[hi];
              }
              is[l] += lo * xb[8 * j + t] + hi * xb[8 * j + 4 + t];
            }
      } else {
        for (int g = 0; g < 8; g++)
          for (int l = 0; l < 16; l++)
            for (int t = 0; t < 4; t++) is[l] += (int32_t)q[g * 64 + l * 4 + t] * xb[4 * g + t];
      }
      if (kmin) {
        const float sum = (float)xc[m * KB + b];
        for (int l = 0; l < 16; l++) {
          const float dw = kq ? f16_to_f32(kd[(b / 8) * 16 + l]) * (float)ksc[b * 16 + l] : f16_to_f32(d1[b * 16 + l]);
          const float mw = kq ? f16_to_f32(kdmin[(b / 8) * 16 + l]) * (float)kmn[b * 16 + l] : f16_to_f32(nm1[b * 16 + l]);
          const float s = dx * dw, t = dx * mw;
          const float f = (float)is[l] * s, g = sum * t;
          const float a = acc[l] + f;
          acc[l] = a - g;
        }
        continue;
      }
      for (int l = 0; l < 16; l++) {
        const float dw = kind == QK_IQ4_XS ? f16_to_f32(xsd[(b / 8) * 16 + l]) * (float)xsc[b * 16 + l] : f16_to_f32(scales[b * 16 + l]);
        const float s = dx * dw;
        const float f = (float)is[l] * s;
        acc[l] = acc[l] + f;
      }
    }
    for (int64_t l = 0; l < 16 && p * 16 + l < N; l++) y[m * N + p * 16 + l] = bias ? acc[l] + bias[p * 16 + l] : acc[l];
  }
}

static void gemm_quant_portable(const float *x, const void *w, int dt, const float *bias, float *y, int64_t M,
                                int64_t N, int64_t K) {
  const int64_t KB = K / 32, P = (N + 15) / 16, pb = (int64_t)quant_p16_bytes(16, K, dt);
  const int kind = quant_kind(dt), sums = quant_x_sums(kind);
  int8_t *xq = malloc((size_t)(M * K) + 64);
  float *xd = malloc((size_t)(M * KB) * sizeof(float) + 64);
  int32_t *xc = malloc((size_t)(M * KB * sums) * sizeof(int32_t) + 64);
  quant_x_rows_portable(x, xq, xd, xc, quant_x_offset(kind), sums, 0, M, K);
  const int64_t MC = 16, T = (M + MC - 1) / MC;
  const int parallel = M > ROWS_MAX_M || quant_p16_bytes(N, K, dt) >= llm_gemv_parallel_min_bytes();
#pragma omp parallel for schedule(dynamic, 1) collapse(2) if (parallel)
  for (int64_t p = 0; p < P; p++)
    for (int64_t t = 0; t < T; t++)
      quant_panel_portable(xq, xd, xc, (const uint8_t *)w + p * pb, kind, bias, y, N, K, t * MC,
                           (t + 1) * MC < M ? (t + 1) * MC : M, p);
  free(xq);
  free(xd);
  free(xc);
}

// ---- dispatch ----------------------------------------------------------------------------------

static int vnni = -1;

static int has_vnni(void) {
  if (vnni < 0) {
    __builtin_cpu_init();
    vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512f");
  }
  return vnni;
}

LLM_EXPORT int llm_quant_vnni(void) { return llm_isa() >= ISA_AVX512 && has_vnni(); }

void gemm_quant(const float *x, const void *w, int dt, const float *bias, float *y, int64_t M, int64_t N, int64_t K) {
  if (llm_quant_vnni()) gemm_quant_vnni(x, w, dt, bias, y, M, N, K);
  else gemm_quant_portable(x, w, dt, bias, y, M, N, K);
}
