#include <ctype.h>
#include <stdlib.h>
#include <string.h>
// Which instruction set the hand-dispatched kernels (matmul, attention) use.
#include "llm.h"

// LLMTS_CPU_BF16_DOT=off keeps the matmuls of bf16 weights in f32 (x not rounded to bf16)
// where the CPU has AVX512-BF16; cpu-knobs.ts checks the value when the library loads.
static int bf16_dot_allowed(void) {
  const char *e = getenv("LLMTS_CPU_BF16_DOT");
  while (e && isspace((unsigned char)*e)) e++;
  return !(e && strncmp(e, "off", 3) == 0);
}

static int cpu_isa(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vl") && bf16_dot_allowed()
               ? ISA_AVX512_BF16 : ISA_AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return ISA_AVX2;
  return ISA_GENERIC;
}

static int isa = -1;

int llm_isa(void) {
  if (isa < 0) isa = cpu_isa();
  return isa;
}

LLM_EXPORT int llm_get_isa(void) { return llm_isa(); }

// Forces a lower ISA (tests exercise every path on one machine); returns the one in effect.
// -1 = the best this CPU supports. Call only while the queue is idle.
LLM_EXPORT int llm_set_isa(int level) {
  int best = cpu_isa();
  isa = level < 0 || level > best ? best : level;
  return isa;
}

// Below this many weight bytes a small-M matmul is not worth waking the OpenMP team for: with
// passive waiting a wake-up costs tens of microseconds, about what one thread needs to stream
// a few hundred KiB of weights. Tunable through LLMTS_GEMV_PAR_MIN_BYTES (read once).
// Measured on the 2-core dev VM (demo model, bench/cpu-generate.ts): decode 262 tok/s with every
// matmul parallel, 490-590 at 1 MiB, 500-620 at 4 MiB (noise +-100); 1 MiB keeps mid-size
// matrices parallel on machines with many cores. The attention uses the same bound on the keys and
// values a step reads (attention.c): the demo's decode attention on one thread ran 24-31% faster.
#define GEMV_PAR_MIN_BYTES_DEFAULT ((size_t)1 << 20)
static size_t gemv_par_min = (size_t)-1;

size_t llm_gemv_parallel_min_bytes(void) {
  if (gemv_par_min == (size_t)-1) {
    // native-lib.ts checks the value when it loads this library; blanks around it are allowed
    // there, and only blanks mean unset, as there
    const char *e = getenv("LLMTS_GEMV_PAR_MIN_BYTES");
    while (e && isspace((unsigned char)*e)) e++;
    gemv_par_min = e && *e ? (size_t)strtoull(e, NULL, 10) : GEMV_PAR_MIN_BYTES_DEFAULT;
  }
  return gemv_par_min;
}

// Tests: 0 forces every small-M matmul onto the OpenMP team; -1 restores the default.
LLM_EXPORT void llm_set_gemv_parallel_min_bytes(int64_t bytes) {
  gemv_par_min = bytes < 0 ? (size_t)-1 : (size_t)bytes;
}
