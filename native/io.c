// Weight loading straight from a file into native memory (never through the JS heap).
//
// Called through koffi's async on a koffi worker thread, not through the command queue: the
// destination is a fresh block no queued op can reference, and loads then overlap with compute.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "llm.h"

#define LLM_ERR_EOF (-100000)   // file shorter than offset + nbytes
#define LLM_ERR_DTYPE (-100001) // unsupported conversion
#define CHUNK ((size_t)4 << 20)

// Reads exactly n bytes at off; returns 0 or a negative errno / LLM_ERR_EOF.
static int pread_all(int fd, void *dst, size_t n, int64_t off) {
  char *p = dst;
  while (n > 0) {
    ssize_t r = pread(fd, p, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n, (off_t)off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (r == 0) return LLM_ERR_EOF;
    p += r;
    n -= (size_t)r;
    off += r;
  }
  return 0;
}

// Copies nbytes of src_dtype elements at file_offset into dst, either as stored
// (dst_dtype == src_dtype) or converted to f32 (dst_dtype == DT_F32). Returns 0 or a negative
// code: -errno, LLM_ERR_EOF, LLM_ERR_DTYPE.
LLM_EXPORT int llm_read_file(const char *path, int64_t file_offset, int64_t nbytes, int64_t dst, int src_dtype,
                             int dst_dtype) {
  if (dst_dtype != src_dtype && dst_dtype != DT_F32) return LLM_ERR_DTYPE;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  posix_fadvise(fd, (off_t)file_offset, (off_t)nbytes, POSIX_FADV_SEQUENTIAL);
  int rc = 0;
  if (dst_dtype == src_dtype) {
    rc = pread_all(fd, PTR(dst), (size_t)nbytes, file_offset);
  } else {
    size_t esz = dtype_size(src_dtype);
    void *buf = malloc(CHUNK);
    if (!buf) rc = -ENOMEM;
    float *out = PTR(dst);
    for (int64_t done = 0; rc == 0 && done < nbytes;) {
      size_t n = (size_t)(nbytes - done) < CHUNK ? (size_t)(nbytes - done) : CHUNK;
      rc = pread_all(fd, buf, n, file_offset + done);
      if (rc == 0) cvt_to_f32(out + done / (int64_t)esz, buf, src_dtype, n / esz);
      done += (int64_t)n;
    }
    free(buf);
  }
  close(fd);
  return rc;
}
