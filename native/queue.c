// The command queue: a growable ring of llm_cmd records drained in FIFO order by one worker thread.
//
// Invariants:
//   - commands run one at a time, in enqueue order (stream semantics), each numbered by its
//     1-based enqueue sequence; `completed` is the number that have finished;
//   - a failing op does not stop the queue: later ops still run (each validates its own indices)
//     and the first error is kept until a wait whose fence covers it reports and clears it;
//   - the JS thread only ever blocks on the queue mutex for O(1) work, never on an op.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER; // worker waits for commands
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER; // waiters wait for `completed`

static llm_cmd *ring;      // [cap] circular buffer
static size_t cap, head, count; // head = index of the oldest pending command
static uint64_t enqueued, completed;
static int worker_idle, stopping, started;
static int waiters; // threads blocked in llm_wait
// the lowest fence a blocked llm_wait waits for: the worker wakes waiters only when `completed`
// reaches it (waking them after every op cost a context switch an op on the cores the op needs)
static uint64_t wake_at = UINT64_MAX;
static pthread_t worker;

static uint64_t err_seq;         // sequence number of the first unreported error; 0 = none
static char err_msg[2048];       // its message
static char last_msg[2048];      // message of the error most recently returned by llm_wait
static char cur_msg[2048];       // written by llm_fail during the running op (worker thread only)

int llm_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cur_msg, sizeof cur_msg, fmt, ap);
  va_end(ap);
  return -1;
}

static void *worker_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&mu);
  for (;;) {
    while (count == 0 && !stopping) {
      worker_idle = 1;
      pthread_cond_wait(&work_cv, &mu);
      worker_idle = 0;
    }
    if (count == 0 && stopping) break;
    llm_cmd c = ring[head];
    pthread_mutex_unlock(&mu);

    cur_msg[0] = 0;
    int rc = c.exec(&c);

    pthread_mutex_lock(&mu);
    head = (head + 1) % cap;
    count--;
    completed++;
    if (rc != 0 && err_seq == 0) {
      err_seq = completed;
      snprintf(err_msg, sizeof err_msg, "%s", cur_msg[0] ? cur_msg : "unknown native op error");
    }
    if (waiters && completed >= wake_at) {
      wake_at = UINT64_MAX; // each waiter still short of its fence lowers it again
      pthread_cond_broadcast(&done_cv);
    }
  }
  pthread_mutex_unlock(&mu);
  return NULL;
}

// Starts the worker thread; idempotent. Returns 0 or -1.
LLM_EXPORT int llm_init(void) {
  pthread_mutex_lock(&mu);
  int rc = 0;
  if (!started) {
    cap = 1024;
    ring = malloc(cap * sizeof *ring);
    stopping = 0;
    if (!ring || pthread_create(&worker, NULL, worker_main, NULL) != 0) rc = -1;
    else started = 1;
  }
  pthread_mutex_unlock(&mu);
  return rc;
}

void llm_enqueue(const llm_cmd *c) {
  pthread_mutex_lock(&mu);
  if (count == cap) { // grow, unrolling the ring so the oldest command lands at index 0
    size_t ncap = cap * 2;
    llm_cmd *n = malloc(ncap * sizeof *n);
    if (!n) abort(); // out of memory for a few KB of records: nothing sensible left to do
    for (size_t k = 0; k < count; k++) n[k] = ring[(head + k) % cap];
    free(ring);
    ring = n;
    cap = ncap;
    head = 0;
  }
  ring[(head + count) % cap] = *c;
  count++;
  enqueued++;
  if (worker_idle) pthread_cond_signal(&work_cv);
  pthread_mutex_unlock(&mu);
}

// The sequence number of the most recently enqueued command (a fence for llm_wait).
LLM_EXPORT int64_t llm_fence(void) {
  pthread_mutex_lock(&mu);
  uint64_t f = enqueued;
  pthread_mutex_unlock(&mu);
  return (int64_t)f;
}

// Blocks until every command up to `fence` has run. Returns 0, or the sequence number of the
// first failed command among them (its message is then available from llm_last_error; it is
// reported once). Call through koffi's async so the Node event loop keeps running.
LLM_EXPORT int64_t llm_wait(int64_t fence) {
  pthread_mutex_lock(&mu);
  waiters++;
  while (completed < (uint64_t)fence) {
    if ((uint64_t)fence < wake_at) wake_at = (uint64_t)fence;
    pthread_cond_wait(&done_cv, &mu);
  }
  waiters--;
  int64_t rc = 0;
  if (err_seq != 0 && err_seq <= (uint64_t)fence) {
    memcpy(last_msg, err_msg, sizeof last_msg);
    rc = (int64_t)err_seq;
    err_seq = 0;
  }
  pthread_mutex_unlock(&mu);
  return rc;
}

LLM_EXPORT const char *llm_last_error(void) { return last_msg; }

// Drains the queue and stops the worker. The library can be llm_init'ed again afterwards.
LLM_EXPORT void llm_shutdown(void) {
  pthread_mutex_lock(&mu);
  if (!started) {
    pthread_mutex_unlock(&mu);
    return;
  }
  stopping = 1;
  pthread_cond_signal(&work_cv);
  pthread_mutex_unlock(&mu);
  pthread_join(worker, NULL);
  pthread_mutex_lock(&mu);
  free(ring);
  ring = NULL;
  cap = head = count = 0;
  started = 0;
  pthread_mutex_unlock(&mu);
}
