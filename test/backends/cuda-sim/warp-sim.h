// A host emulation of the CUDA execution model, enough to run the attention kernels' source on a
// CPU (cuda-sim.ts compiles it with g++): the threads of a block are fibers (ucontext) on one OS
// thread, switched only at barriers, so every run is deterministic (round-robin: every thread to
// its next barrier; $WARP_SIM_SCHEDULE=warp-first: each warp as far as it can go before the next;
// warp-first-reverse: the same from the last warp to the first). Blocks run one after another,
// which makes `__shared__` a function-static array. Warp collectives (shuffles, ballots, ldmatrix,
// mma.sync m16n8k16) exchange through per-warp scratch between two warp barriers, in the register
// layouts of the PTX ISA. A barrier some threads never reach (divergence) aborts with a message
// instead of hanging. cp.async poisons its destination at issue and lands at the issuing thread's
// wait for its group: a kernel that reads a tile before waiting, or fills a buffer others still
// read, fails here as it could on a GPU, only reliably. Dynamic shared
// memory (a launch's shared bytes: sim_dynamic_shared(), for `extern __shared__`) is poisoned with
// 0xff bytes (bf16 / f32 NaNs) before each block, and a guard past its end is checked after it.
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <functional>
#include <vector>
#include <ucontext.h>

struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct uint4 { unsigned x, y, z, w; };
struct float4 { float x, y, z, w; };

namespace sim {

enum State { RUNNABLE, WAIT_WARP, WAIT_BLOCK, DONE };
// one cp.async of 16 bytes: where, and the bytes it will write (read from global at issue)
struct PendingCopy {
  void* dst;
  unsigned char data[16];
};
struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  State state = RUNNABLE;
  unsigned tid = 0;
  std::vector<PendingCopy> cpOpen;                // issued, not yet committed
  std::vector<std::vector<PendingCopy>> cpGroups; // committed groups, oldest first
};

struct WarpScratch {
  float f[32];
  int i[32];
  const void* p[32];
  unsigned a[32][4], b[32][2];
  float c[32][4];
};

inline ucontext_t schedCtx;
inline std::vector<Fiber> fibers;
inline std::vector<WarpScratch> warps;
inline int current = -1;
inline std::function<void()> body;
inline int blockOr = 0, blockOrResult = 0;

inline dim3 threadIdx_, blockIdx_, blockDim_, gridDim_;
// the block's dynamic shared memory, then GUARD bytes that must stay untouched
inline std::vector<char> dynShared;
inline size_t dynSharedBytes = 0;
constexpr size_t DYN_SHARED_GUARD = 256;

inline void yield(State s) {
  Fiber& f = fibers[current];
  f.state = s;
  swapcontext(&f.ctx, &schedCtx);
}

inline void cpLand(std::vector<PendingCopy>& g) {
  for (PendingCopy& c : g) std::memcpy(c.dst, c.data, 16);
  g.clear();
}

inline void entry() {
  body();
  // copies a thread never waited for still land (a kernel that reads them is wrong, and fails)
  for (auto& g : fibers[current].cpGroups) cpLand(g);
  cpLand(fibers[current].cpOpen);
  fibers[current].state = DONE;
  swapcontext(&fibers[current].ctx, &schedCtx);
}

// Runs `kernel` for every block of the grid, one block at a time, with `shared` bytes of dynamic
// shared memory.
inline void launch(dim3 grid, unsigned threads, const std::function<void()>& kernel, size_t shared = 0) {
  body = kernel;
  dynSharedBytes = shared;
  dynShared.assign(shared + DYN_SHARED_GUARD, 0);
  gridDim_ = grid;
  blockDim_ = dim3{threads, 1, 1};
  const unsigned nw = (threads + 31) / 32;
  warps.assign(nw, WarpScratch{});
  for (unsigned by = 0; by < grid.y; by++) {
    for (unsigned bx = 0; bx < grid.x; bx++) {
      blockIdx_ = dim3{bx, by, 0};
      fibers.assign(threads, Fiber{});
      for (unsigned t = 0; t < threads; t++) {
        Fiber& f = fibers[t];
        f.tid = t;
        f.stack.resize(256 * 1024);
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.data();
        f.ctx.uc_stack.ss_size = f.stack.size();
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, entry, 0);
      }
      blockOr = 0;
      std::memset(dynShared.data(), 0xff, shared);
      std::memset(dynShared.data() + shared, 0x5a, DYN_SHARED_GUARD);
      const char* schedule = std::getenv("WARP_SIM_SCHEDULE");
      const bool reverse = schedule != nullptr && std::strcmp(schedule, "warp-first-reverse") == 0;
      const bool warpFirst = reverse || (schedule != nullptr && std::strcmp(schedule, "warp-first") == 0);
      auto runFiber = [&](unsigned t) {
        current = (int)t;
        threadIdx_ = dim3{t, 0, 0};
        swapcontext(&schedCtx, &fibers[t].ctx);
      };
      // warp w passes its collective once every lane that has not exited waits at it; true if released
      auto releaseWarp = [&](unsigned w) {
        const unsigned lo = w * 32, hi = std::min(threads, lo + 32);
        unsigned atWarp = 0, exited = 0;
        for (unsigned t = lo; t < hi; t++) {
          atWarp += fibers[t].state == WAIT_WARP;
          exited += fibers[t].state == DONE;
        }
        if (atWarp == 0 || atWarp + exited != hi - lo) return false;
        for (unsigned t = lo; t < hi; t++) if (fibers[t].state == WAIT_WARP) fibers[t].state = RUNNABLE;
        return true;
      };
      for (;;) {
        if (warpFirst) {
          // each warp in turn runs as far as it can (through its warp collectives) before the next
          // starts: an early warp's writes land before later warps' reads, which the round-robin
          // order (every thread to its next barrier) hides
          for (unsigned i = 0; i < nw; i++) {
            const unsigned w = reverse ? nw - 1 - i : i;
            do {
              for (unsigned t = w * 32; t < std::min(threads, w * 32 + 32); t++) if (fibers[t].state == RUNNABLE) runFiber(t);
            } while (releaseWarp(w));
          }
        } else {
          for (unsigned t = 0; t < threads; t++) if (fibers[t].state == RUNNABLE) runFiber(t);
        }
        unsigned done = 0, atBlock = 0;
        for (const Fiber& f : fibers) {
          done += f.state == DONE;
          atBlock += f.state == WAIT_BLOCK;
        }
        if (done == threads) break;
        bool released = false;
        // exited threads count as arrived (as on the hardware: a block whose early warps returned
        // still passes __syncthreads)
        if (atBlock > 0 && atBlock + done == threads) {
          blockOrResult = blockOr;
          blockOr = 0;
          for (Fiber& f : fibers) if (f.state == WAIT_BLOCK) f.state = RUNNABLE;
          released = true;
        } else {
          for (unsigned w = 0; w < nw; w++) released = releaseWarp(w) || released;
        }
        if (!released) {
          std::fprintf(stderr, "warp-sim: deadlock in block (%u, %u): %u of %u threads done, %u at __syncthreads, "
            "the rest at a warp collective (a barrier some threads skip)\n", bx, by, done, threads, atBlock);
          std::exit(3);
        }
      }
      for (size_t i = 0; i < DYN_SHARED_GUARD; i++) {
        if (dynShared[shared + i] != 0x5a) {
          std::fprintf(stderr, "warp-sim: block (%u, %u) wrote past its %zu bytes of dynamic shared memory\n", bx, by, shared);
          std::exit(4);
        }
      }
    }
  }
}

inline unsigned lane() { return threadIdx_.x & 31; }
// 16-byte aligned (operator new's alignment), as `extern __shared__` arrays of uint4 need
inline void* dynamicShared() { return dynShared.data(); }
inline WarpScratch& warp() { return warps[threadIdx_.x >> 5]; }
inline void warpBarrier() { yield(WAIT_WARP); }

}  // namespace sim

#define threadIdx (sim::threadIdx_)
#define blockIdx (sim::blockIdx_)
#define blockDim (sim::blockDim_)
#define gridDim (sim::gridDim_)
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

inline void __syncthreads() { sim::yield(sim::WAIT_BLOCK); }
inline void* sim_dynamic_shared() { return sim::dynamicShared(); }
inline int __syncthreads_or(int p) {
  sim::blockOr |= p != 0;
  sim::yield(sim::WAIT_BLOCK);
  return sim::blockOrResult;
}
inline float __shfl_xor_sync(unsigned, float v, int o) {
  sim::WarpScratch& w = sim::warp();
  w.f[sim::lane()] = v;
  sim::warpBarrier();
  const float r = w.f[sim::lane() ^ o];
  sim::warpBarrier();
  return r;
}
inline int __shfl_xor_sync(unsigned, int v, int o) {
  sim::WarpScratch& w = sim::warp();
  w.i[sim::lane()] = v;
  sim::warpBarrier();
  const int r = w.i[sim::lane() ^ o];
  sim::warpBarrier();
  return r;
}
inline unsigned __ballot_sync(unsigned, int p) {
  sim::WarpScratch& w = sim::warp();
  w.i[sim::lane()] = p != 0;
  sim::warpBarrier();
  unsigned r = 0;
  for (int l = 0; l < 32; l++) r |= (unsigned)w.i[l] << l;
  sim::warpBarrier();
  return r;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
// round-to-nearest intrinsics: the host's IEEE operations round to nearest (no contraction under -std=c++17)
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline int atomicCAS(int* p, int cmp, int v) { const int old = *p; if (old == cmp) *p = v; return old; }
inline int atomicAdd(int* p, int v) { const int old = *p; *p += v; return old; }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { const unsigned long long old = *p; *p += v; return old; }
// a cycle counter that only goes up (each read a tick later): phase timers run, their numbers mean nothing here
inline long long clock64() { static long long ticks = 0; return ++ticks; }
inline void __threadfence() {}

// ---- the attention module's primitives (attention-kernels.ts ATTENTION_PRIMITIVES) ----------------
// cp.async: the destination is poisoned (0xff: bf16 NaNs) at issue and gets its bytes only when
// the issuing thread waits for the copy's group, so a kernel that reads a tile before its wait,
// or issues into a buffer other warps still read, computes NaNs here.
inline void att_cp16(void* dst, const void* src, bool pred) {
  sim::PendingCopy c;
  c.dst = dst;
  if (pred) std::memcpy(c.data, src, 16);
  else std::memset(c.data, 0, 16);
  std::memset(dst, 0xff, 16);
  sim::fibers[sim::current].cpOpen.push_back(c);
}
inline void att_cp_commit() {
  sim::Fiber& f = sim::fibers[sim::current];
  f.cpGroups.push_back(std::move(f.cpOpen));
  f.cpOpen.clear();
}
template <int N> inline void att_cp_wait() {
  sim::Fiber& f = sim::fibers[sim::current];
  while (f.cpGroups.size() > (size_t)N) {
    sim::cpLand(f.cpGroups.front());
    f.cpGroups.erase(f.cpGroups.begin());
  }
}
inline unsigned short sim_at(const void* row, int col) { return ((const unsigned short*)row)[col]; }
// ldmatrix .x4: matrix m's row r is at the address of lane 8 m + r; lane l receives, of each
// matrix, row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 (.trans: of the transposed matrix)
inline void sim_ldsm4(unsigned* r, const void* p, bool trans) {
  sim::WarpScratch& w = sim::warp();
  const unsigned l = sim::lane();
  w.p[l] = p;
  sim::warpBarrier();
  for (int m = 0; m < 4; m++) {
    unsigned lo, hi;
    if (!trans) {
      const void* row = w.p[8 * m + l / 4];
      lo = sim_at(row, 2 * (l % 4));
      hi = sim_at(row, 2 * (l % 4) + 1);
    } else {
      lo = sim_at(w.p[8 * m + 2 * (l % 4)], l / 4);
      hi = sim_at(w.p[8 * m + 2 * (l % 4) + 1], l / 4);
    }
    r[m] = lo | (hi << 16);
  }
  sim::warpBarrier();
}
inline void att_ldsm4(unsigned* r, const void* p) { sim_ldsm4(r, p, false); }
inline void att_ldsm4t(unsigned* r, const void* p) { sim_ldsm4(r, p, true); }
inline float sim_bf(unsigned bits16) { return __uint_as_float((bits16 & 0xffffu) << 16); }
// mma.sync.m16n8k16.row.col f32 += bf16 x bf16. Fragments (g = lane / 4, c = lane % 4):
// A a0 (g, 2c..2c+1) a1 (g+8, 2c..) a2 (g, 2c+8..) a3 (g+8, 2c+8..); B b0 (k 2c..2c+1, n g)
// b1 (k 2c+8.., n g); C/D d0 (g, 2c) d1 (g, 2c+1) d2 (g+8, 2c) d3 (g+8, 2c+1)
inline void att_mma(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  sim::WarpScratch& w = sim::warp();
  const unsigned l = sim::lane();
  for (int k = 0; k < 4; k++) w.a[l][k] = a[k];
  w.b[l][0] = b0;
  w.b[l][1] = b1;
  for (int k = 0; k < 4; k++) w.c[l][k] = d[k];
  sim::warpBarrier();
  auto A = [&](int row, int k) {
    const int reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0), ln = 4 * (row % 8) + (k % 8) / 2;
    return sim_bf(w.a[ln][reg] >> (16 * (k % 2)));
  };
  auto B = [&](int k, int n) {
    const int reg = k >= 8 ? 1 : 0, ln = 4 * n + (k % 8) / 2;
    return sim_bf(w.b[ln][reg] >> (16 * (k % 2)));
  };
  const int g = l / 4, c = l % 4;
  float out[4];
  for (int e = 0; e < 4; e++) {
    const int row = g + (e >= 2 ? 8 : 0), col = 2 * c + (e & 1);
    double s = w.c[l][e];
    for (int k = 0; k < 16; k++) s += (double)A(row, k) * B(k, col);
    out[e] = (float)s;
  }
  sim::warpBarrier();
  for (int e = 0; e < 4; e++) d[e] = out[e];
}
inline unsigned att_pack2(float lo, float hi) {
  auto rn = [](float f) {
    unsigned u = __float_as_uint(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
  };
  return rn(lo) | (rn(hi) << 16);
}
inline uint4 att_ldg16(const void* p) { uint4 v; std::memcpy(&v, p, 16); return v; }
inline float att_ldcg(const float* p) { return *p; }
inline int att_atom_add_acq_rel(int* p, int v) { return atomicAdd(p, v); }

// The kernels.ts prelude (KERNEL_PRELUDE) follows this header in every simulator program: it
// defines u16, i64, bf2f, f2bf, report, PDL_ENTRY (empty without __CUDA_ARCH__), activate and
// the warp/block reductions over the functions above.
