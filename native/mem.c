// Memory: allocation (immediate), and frees/copies/fills that are ordered with the ops (enqueued).
//
// JS reuses freed blocks in stream order (a block freed after op A may be handed to op B enqueued
// later, since B runs after A). So JS never writes a pooled block directly: uploads go through a
// staging copy that is enqueued (llm_op_upload), and reads copy to a fresh block first.
#include <stdlib.h>
#include <string.h>

#include "llm.h"

// 64-byte aligned block (cache line / one zmm). Returns 0 when out of memory.
LLM_EXPORT int64_t llm_alloc(int64_t bytes) {
  void *p = NULL;
  if (bytes <= 0) bytes = 64;
  if (posix_memalign(&p, 64, (size_t)bytes) != 0) return 0;
  return (int64_t)(intptr_t)p;
}

// Frees at once: only for blocks no pending op can touch (fresh staging blocks).
LLM_EXPORT void llm_free_now(int64_t addr) { free(PTR(addr)); }

// Synchronous copies for blocks no pending op can touch.
LLM_EXPORT void llm_write_now(int64_t dst, const void *src, int64_t bytes) {
  memcpy(PTR(dst), src, (size_t)bytes);
}
LLM_EXPORT void llm_read_now(int64_t src, void *dst, int64_t bytes) { memcpy(dst, PTR(src), (size_t)bytes); }

static int exec_free(const llm_cmd *c) {
  free(PTR(c->i[0]));
  return 0;
}
LLM_EXPORT void llm_op_free(int64_t addr) {
  llm_cmd c = {.exec = exec_free, .i = {addr}};
  llm_enqueue(&c);
}

// i: [src, dst, bytes, free_src]
static int exec_copy(const llm_cmd *c) {
  memcpy(PTR(c->i[1]), PTR(c->i[0]), (size_t)c->i[2]);
  if (c->i[3]) free(PTR(c->i[0]));
  return 0;
}
LLM_EXPORT void llm_op_copy(int64_t src, int64_t dst, int64_t bytes) {
  llm_cmd c = {.exec = exec_copy, .i = {src, dst, bytes, 0}};
  llm_enqueue(&c);
}

// Copies host data into a private staging block now, and into dst when the queue gets there.
// Returns 0, or -1 when the staging block cannot be allocated.
LLM_EXPORT int llm_op_upload(int64_t dst, const void *src, int64_t bytes) {
  void *staging = malloc(bytes > 0 ? (size_t)bytes : 1);
  if (!staging) return -1;
  memcpy(staging, src, (size_t)bytes);
  llm_cmd c = {.exec = exec_copy, .i = {(int64_t)(intptr_t)staging, dst, bytes, 1}};
  llm_enqueue(&c);
  return 0;
}

static int exec_zero(const llm_cmd *c) {
  memset(PTR(c->i[0]), 0, (size_t)c->i[1]);
  return 0;
}
LLM_EXPORT void llm_op_zero(int64_t dst, int64_t bytes) {
  llm_cmd c = {.exec = exec_zero, .i = {dst, bytes}};
  llm_enqueue(&c);
}
