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

// Row gather/scatter between a buffer and a tensor's dim-0 rows (KV blocks <-> host, for the
// prefix cache's SSD tier): dst row (dst_idx ? dst_idx[k] : k) = src row (src_idx ? src_idx[k] : k)
// for k < n. The index array and (for writes) the data were copied into malloc'd blocks when the
// op was enqueued; the command owns and frees them.
// i: [src, dst, idx (int32, malloc'd), n, row_bytes, indexed_rows, idx_is_dst, free_src]
static int exec_copy_rows(const llm_cmd *c) {
  char *src = PTR(c->i[0]), *dst = PTR(c->i[1]);
  int32_t *idx = PTR(c->i[2]);
  const int64_t n = c->i[3], rb = c->i[4], rows = c->i[5];
  const int idx_is_dst = (int)c->i[6], free_src = (int)c->i[7];
  int rc = 0;
  for (int64_t k = 0; k < n; k++)
    if (idx[k] < 0 || idx[k] >= rows) {
      rc = llm_fail("%s: block %d is out of range [0, %lld)", idx_is_dst ? "writeBlocks" : "readBlocks", idx[k],
                    (long long)rows);
      break;
    }
  if (rc == 0) {
    PARALLEL_RANGE(n, 64, for (int64_t k = i0; k < i1; k++) {
      const int64_t s = idx_is_dst ? k : idx[k], d = idx_is_dst ? idx[k] : k;
      memcpy(dst + (size_t)d * (size_t)rb, src + (size_t)s * (size_t)rb, (size_t)rb);
    });
  }
  free(idx);
  if (free_src) free(src);
  return rc;
}

static int32_t *copy_idx(const int32_t *idx, int64_t n) {
  int32_t *p = malloc(n > 0 ? (size_t)n * sizeof *p : 1);
  if (p && n > 0) memcpy(p, idx, (size_t)n * sizeof *p);
  return p;
}

// Enqueues dst[k] = src row idx[k] (k < n), rows of row_bytes; src has src_rows rows.
// Returns 0, or -1 when the index copy cannot be allocated.
LLM_EXPORT int llm_op_read_rows(int64_t src, int64_t dst, const int32_t *idx, int64_t n, int64_t row_bytes,
                                int64_t src_rows) {
  int32_t *ix = copy_idx(idx, n);
  if (!ix) return -1;
  llm_cmd c = {.exec = exec_copy_rows, .i = {src, dst, (int64_t)(intptr_t)ix, n, row_bytes, src_rows, 0, 0}};
  llm_enqueue(&c);
  return 0;
}

// Stages n rows of host data now and enqueues dst row idx[k] = data row k; dst has dst_rows rows.
// Returns 0, or -1 when staging cannot be allocated.
LLM_EXPORT int llm_op_write_rows(int64_t dst, const void *data, const int32_t *idx, int64_t n, int64_t row_bytes,
                                 int64_t dst_rows) {
  size_t bytes = (size_t)n * (size_t)row_bytes;
  void *staging = malloc(bytes > 0 ? bytes : 1);
  int32_t *ix = copy_idx(idx, n);
  if (!staging || !ix) {
    free(staging);
    free(ix);
    return -1;
  }
  memcpy(staging, data, bytes);
  llm_cmd c = {.exec = exec_copy_rows,
               .i = {(int64_t)(intptr_t)staging, dst, (int64_t)(intptr_t)ix, n, row_bytes, dst_rows, 1, 1}};
  llm_enqueue(&c);
  return 0;
}
