// Which instruction set the hand-dispatched kernels (matmul, attention) use.
#include "llm.h"

static int cpu_isa(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return ISA_AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return ISA_AVX2;
  return ISA_GENERIC;
}

static int isa = -1;

int llm_isa(void) {
  if (isa < 0) isa = cpu_isa();
  return isa;
}

// Forces a lower ISA (tests exercise every path on one machine); returns the one in effect.
// -1 = the best this CPU supports. Call only while the queue is idle.
LLM_EXPORT int llm_set_isa(int level) {
  int best = cpu_isa();
  isa = level < 0 || level > best ? best : level;
  return isa;
}
