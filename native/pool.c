// The decode team: helper threads that run the items of a step's small parallel loops (decode
// matmuls, decode attention) beside the queue's worker thread, waiting between loops by spinning
// for a bounded time, then sleeping on a futex.
//
// Why not OpenMP for these: a decode step runs a hundred or more short loops back to back, and
// libgomp's wait policy is one setting for the process. Threads that sleep at once are woken by a
// futex for every loop (a round trip of tens of microseconds in a VM); threads that spin long hold
// a core that another process wants, and libgomp's barrier then waits for a partner the kernel has
// descheduled. Here the caller never waits for a helper that has not started an item: items are
// claimed one at a time from a counter tagged with the loop's generation, so a helper that wakes
// late finds nothing left and a loop ends when its claimed items are done. A helper spins up to
// POOL_SPIN_NS after its last item (covering the gaps inside a step, not the host's time between
// steps), then sleeps until the next loop.
//
// Only the queue's worker thread calls llm_pool_for (one loop at a time); the team has
// omp_get_max_threads() - 1 helpers (OMP_NUM_THREADS), started on first use. An item's function gets
// the index of the thread running it, 0 (the caller) to llm_pool_threads() - 1, for per-thread scratch.
#define _GNU_SOURCE
#include <limits.h>
#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "llm.h"

#define POOL_SPIN_NS 200000 // how long an idle helper spins before it sleeps
#define POOL_MAX_HELPERS 255
#define GEN_SHIFT 40        // claim counter: generation << GEN_SHIFT | next item index
#define TAG_MASK ((1u << (64 - GEN_SHIFT)) - 1) // the generation bits the counter keeps

static _Atomic uint32_t gen;        // bumped for each loop; helpers wait on it
static _Atomic uint64_t claim;      // (gen << GEN_SHIFT) | index of the next unclaimed item
static _Atomic int inflight;        // helpers between a claim attempt and its item's end
static _Atomic int sleepers;        // helpers asleep (or about to sleep) on `gen`
// the loop's fields, under a sequence lock: fields_seq is odd while they are written and 2 g once
// loop g's are in place. A helper uses them only if it reads 2 g before and after them, so a late
// helper that races the next loop's writes never pairs one loop's function with another's context
// or item count.
static _Atomic uint32_t fields_seq;
static _Atomic(void (*)(void *, int64_t, int)) loop_fn;
static _Atomic(void *) loop_ctx;
static _Atomic int64_t loop_n;
static int helpers = -1;            // -1: not started
static pthread_mutex_t start_mu = PTHREAD_MUTEX_INITIALIZER;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

// Claims and runs items of generation g until none is left (or a newer loop has begun).
static void run_items(uint32_t g, void (*fn)(void *, int64_t, int), void *ctx, int64_t n, int thread) {
  uint64_t v = atomic_load_explicit(&claim, memory_order_acquire);
  for (;;) {
    if ((uint32_t)(v >> GEN_SHIFT) != (g & TAG_MASK)) return;
    const int64_t i = (int64_t)(v & ((1ull << GEN_SHIFT) - 1));
    if (i >= n) return;
    if (atomic_compare_exchange_weak_explicit(&claim, &v, v + 1, memory_order_acq_rel, memory_order_acquire)) {
      fn(ctx, i, thread);
      v = atomic_load_explicit(&claim, memory_order_acquire);
    }
  }
}

static void *helper_main(void *arg) {
  const int thread = (int)(intptr_t)arg;
  uint32_t seen = atomic_load(&gen);
  for (;;) {
    // wait for a new loop: spin, then sleep
    int64_t t0 = 0;
    for (int k = 0; atomic_load_explicit(&gen, memory_order_acquire) == seen; k++) {
      cpu_relax();
      if ((k & 255) == 255) {
        const int64_t t = now_ns();
        if (t0 == 0) t0 = t;
        else if (t - t0 > POOL_SPIN_NS) {
          atomic_fetch_add(&sleepers, 1);
          // the kernel compares gen with seen: a loop published before this call is not missed
          syscall(SYS_futex, (uint32_t *)&gen, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
          atomic_fetch_sub(&sleepers, 1);
          t0 = 0;
        }
      }
    }
    const uint32_t g = atomic_load_explicit(&gen, memory_order_acquire);
    seen = g;
    atomic_fetch_add_explicit(&inflight, 1, memory_order_acq_rel);
    // loop g's fields, if they are still g's (else a newer loop has begun: nothing of g is left)
    const uint32_t s1 = atomic_load_explicit(&fields_seq, memory_order_acquire);
    void (*fn)(void *, int64_t, int) = atomic_load_explicit(&loop_fn, memory_order_relaxed);
    void *ctx = atomic_load_explicit(&loop_ctx, memory_order_relaxed);
    const int64_t n = atomic_load_explicit(&loop_n, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    if (s1 == 2 * g && atomic_load_explicit(&fields_seq, memory_order_relaxed) == s1) run_items(g, fn, ctx, n, thread);
    atomic_fetch_sub_explicit(&inflight, 1, memory_order_release);
  }
  return NULL;
}

static void start_helpers(void) {
  pthread_mutex_lock(&start_mu);
  if (helpers < 0) {
    int want = omp_get_max_threads() - 1;
    if (want > POOL_MAX_HELPERS) want = POOL_MAX_HELPERS;
    int started = 0;
    for (int h = 0; h < want; h++) {
      pthread_t t;
      pthread_attr_t a;
      pthread_attr_init(&a);
      pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
      if (pthread_create(&t, &a, helper_main, (void *)(intptr_t)(started + 1)) == 0) started++;
      pthread_attr_destroy(&a);
    }
    helpers = started;
  }
  pthread_mutex_unlock(&start_mu);
}

int llm_pool_threads(void) {
  if (helpers < 0) start_helpers();
  return helpers + 1;
}

void llm_pool_for(int64_t n, void (*fn)(void *ctx, int64_t item, int thread), void *ctx) {
  if (n <= 0) return;
  if (helpers < 0) start_helpers();
  if (helpers == 0 || n == 1) {
    for (int64_t i = 0; i < n; i++) fn(ctx, i, 0);
    return;
  }
  const uint32_t g = atomic_load(&gen) + 1;
  atomic_store_explicit(&fields_seq, 2 * g - 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_release); // the odd value is seen before any of the new fields
  atomic_store_explicit(&loop_fn, fn, memory_order_relaxed);
  atomic_store_explicit(&loop_ctx, ctx, memory_order_relaxed);
  atomic_store_explicit(&loop_n, n, memory_order_relaxed);
  atomic_store_explicit(&fields_seq, 2 * g, memory_order_release);
  atomic_store_explicit(&claim, (uint64_t)(g & TAG_MASK) << GEN_SHIFT, memory_order_release);
  atomic_store(&gen, g); // seq_cst: ordered before the sleepers load below
  if (atomic_load(&sleepers) > 0) syscall(SYS_futex, (uint32_t *)&gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
  run_items(g, fn, ctx, n, 0);
  // every item is claimed; wait for the ones helpers are still running (yielding the core after a
  // while: a helper the kernel descheduled may need it)
  for (int k = 0; atomic_load_explicit(&inflight, memory_order_acquire) != 0; k++) {
    if (k < 4096) cpu_relax();
    else sched_yield();
  }
}
