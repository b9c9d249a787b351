// Runs the CUDA GEMV kernels (gemv-kernels.ts, y = x · w^T for decode shapes) on the CPU through
// warp-sim.h, launched as gemm.ts and cuda-fused-ops.ts launch them: GEMV_THREADS a block, grid
// gemvLaunchGrid (one-shot kernels: a block per row group; persistent ones: at most the given SM
// count times their blocks per SM, so a small SM count makes each block loop over several groups),
// and the fused persistent twins with M K 2 bytes of dynamic shared memory.
import {
  GEMV_KERNEL_NAMES, GEMV_KERNEL_SOURCE, GEMV_THREADS, GEMVP_GLU_KERNEL_NAMES,
  GEMVP_KERNEL_NAMES, GEMVP_NORM_KERNEL_NAMES, GEMVP_NORMGLU_KERNEL_NAMES, GEMVP_NORMROPE_KERNEL_NAMES, type GemvChoice, type GemvKernelName, gemvLaunchGrid, gemvRopeUnits,
} from '../../../src/backends/cuda/gemv-kernels.ts';
import { buildSim, bytesOf, runSim } from './build.ts';
import type { RopeSimCall, RopeSimResult } from './fused-sim.ts';

const list = (names: readonly string[]) => names.map((k) => `{"${k}", ${k}}`).join(', ');

const DRIVER = String.raw`
typedef void (*GemvFn)(const u16*, const u16*, u16*, int, int, int, int);
struct Named { const char* name; GemvFn fn; };
static const Named GEMV[] = { ${list([...GEMV_KERNEL_NAMES, ...GEMVP_KERNEL_NAMES])} };
typedef void (*GemvGluFn)(const u16*, const u16*, u16*, int, int, int, int, int);
struct NamedGlu { const char* name; GemvGluFn fn; };
static const NamedGlu GEMV_GLU[] = { ${list(GEMVP_GLU_KERNEL_NAMES)} };
typedef void (*GemvNormFn)(const u16*, const u16*, const u16*, float, const void*, int, float, float, u16*, u16*, int, int,
  int, int);
struct NamedNorm { const char* name; GemvNormFn fn; };
static const NamedNorm GEMV_NORM[] = { ${list(GEMVP_NORM_KERNEL_NAMES)} };
typedef void (*GemvNormGluFn)(const u16*, const u16*, const u16*, float, const void*, int, float, float, u16*, u16*, int,
  int, int, int, int);
struct NamedNormGlu { const char* name; GemvNormGluFn fn; };
static const NamedNormGlu GEMV_NORMGLU[] = { ${list(GEMVP_NORMGLU_KERNEL_NAMES)} };
typedef void (*GemvNormRopeFn)(const u16*, const u16*, const u16*, float, const void*, int, float, float, u16*, u16*, int,
  int, int, int, int, int, int, const int*, const float*, int, float, u16*, u16*, const int*, i64, int*);
struct NamedNormRope { const char* name; GemvNormRopeFn fn; };
static const NamedNormRope GEMV_NORMROPE[] = { ${list(GEMVP_NORMROPE_KERNEL_NAMES)} };

// A norm-rope twin (N: its rope units): after the common header, i32 H KVH D half invStride numSlots;
// f32 scaling; u16 w[(H + 2 KVH) D, K], x[M K], r[M K], nw[K]; i32 pos[M]; f32 invFreq[...]; i32 slots[M];
// u16 kpool, vpool[numSlots KVH D]. Output: u16 q[M H D], sum[M K], kpool, vpool; i32 err[4].
static int normRope(GemvNormRopeFn fn, FILE* f, const char* out, int M, int N, int K, int WPR, int gridX, int threads,
                    int shared, const float* fl) {
  int hd[6]; float scaling;
  if (fread(hd, 4, 6, f) != 6 || fread(&scaling, 4, 1, f) != 1) return 2;
  const int H = hd[0], KVH = hd[1], D = hd[2], half = hd[3], invStride = hd[4], numSlots = hd[5];
  std::vector<u16> w((size_t)(H + 2 * KVH) * D * K), x((size_t)M * K), r((size_t)M * K), nw(K);
  std::vector<int> pos(M), slots(M), err(4, 0);
  std::vector<float> invFreq(invStride ? (size_t)M * invStride : (size_t)half);
  std::vector<u16> kp((size_t)numSlots * KVH * D), vp((size_t)numSlots * KVH * D), q((size_t)M * H * D, 0xffff),
    sum((size_t)M * K, 0xffff);
  if (fread(w.data(), 2, w.size(), f) != w.size() || fread(x.data(), 2, x.size(), f) != x.size() ||
      fread(r.data(), 2, r.size(), f) != r.size() || fread(nw.data(), 2, nw.size(), f) != nw.size() ||
      fread(pos.data(), 4, M, f) != (size_t)M || fread(invFreq.data(), 4, invFreq.size(), f) != invFreq.size() ||
      fread(slots.data(), 4, M, f) != (size_t)M || fread(kp.data(), 2, kp.size(), f) != kp.size() ||
      fread(vp.data(), 2, vp.size(), f) != vp.size()) return 2;
  fclose(f);
  (void)N;
  sim::launch(dim3{(unsigned)gridX, 1, 1}, threads, [&] {
    fn(w.data(), x.data(), r.data(), fl[0], nw.data(), DT_BF16, fl[1], fl[2], sum.data(), q.data(), M, K, WPR, H, KVH, D, half,
       pos.data(), invFreq.data(), invStride, scaling, kp.data(), vp.data(), slots.data(), numSlots, err.data());
  }, (size_t)shared);
  FILE* o = fopen(out, "wb");
  fwrite(q.data(), 2, q.size(), o);
  fwrite(sum.data(), 2, sum.size(), o);
  fwrite(kp.data(), 2, kp.size(), o);
  fwrite(vp.data(), 2, vp.size(), o);
  fwrite(err.data(), 4, 4, o);
  fclose(o);
  return 0;
}

// argv: input, output. Input: char[32] kernel; i32 M N K WPR gridX threads act (-1: none) shared (dynamic
// shared bytes); f32 rScale eps off; u16 w[N K], x[M K] (a GLU twin: packed gate/up [M 2K]), then for
// a norm twin r[M K], nw[K] (bf16); a norm-GLU twin's w is packed gate/up rows [2N K]. Output: u16
// y[M N], then for a norm twin sum[M K].
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  char name[32];
  int hd[8];
  float fl[3];
  if (!f || fread(name, 1, 32, f) != 32 || fread(hd, 4, 8, f) != 8 || fread(fl, 4, 3, f) != 3) return 2;
  const int M = hd[0], N = hd[1], K = hd[2], WPR = hd[3], gridX = hd[4], threads = hd[5], act = hd[6], shared = hd[7];
  GemvFn fn = 0;
  GemvGluFn glu = 0;
  GemvNormFn norm = 0;
  GemvNormGluFn normglu = 0;
  for (const Named& n : GEMV) if (!strcmp(n.name, name)) fn = n.fn;
  for (const NamedNormGlu& n : GEMV_NORMGLU) if (!strcmp(n.name, name)) normglu = n.fn;
  for (const NamedNormRope& n : GEMV_NORMROPE) {
    if (!strcmp(n.name, name)) return normRope(n.fn, f, argv[2], M, N, K, WPR, gridX, threads, shared, fl);
  }
  for (const NamedGlu& n : GEMV_GLU) if (!strcmp(n.name, name)) glu = n.fn;
  for (const NamedNorm& n : GEMV_NORM) if (!strcmp(n.name, name)) norm = n.fn;
  if (!fn && !glu && !norm && !normglu) { fprintf(stderr, "unknown kernel %s\n", name); return 2; }
  const bool normed = norm || normglu;
  std::vector<u16> w((size_t)N * K * (normglu ? 2 : 1)), x((size_t)M * K * (glu ? 2 : 1)), y((size_t)M * N, 0xffff);
  std::vector<u16> r(normed ? (size_t)M * K : 0), nw(normed ? K : 0), sum(normed ? (size_t)M * K : 0, 0xffff);
  if (fread(w.data(), 2, w.size(), f) != w.size() || fread(x.data(), 2, x.size(), f) != x.size() ||
      fread(r.data(), 2, r.size(), f) != r.size() || fread(nw.data(), 2, nw.size(), f) != nw.size()) return 2;
  fclose(f);
  sim::launch(dim3{(unsigned)gridX, 1, 1}, threads, [&] {
    if (normglu) normglu(w.data(), x.data(), r.data(), fl[0], nw.data(), DT_BF16, fl[1], fl[2], sum.data(), y.data(), M, N, K,
      WPR, act);
    else if (norm) norm(w.data(), x.data(), r.data(), fl[0], nw.data(), DT_BF16, fl[1], fl[2], sum.data(), y.data(), M, N, K, WPR);
    else if (glu) glu(w.data(), x.data(), y.data(), M, N, K, WPR, act);
    else fn(w.data(), x.data(), y.data(), M, N, K, WPR);
  }, (size_t)shared);
  FILE* o = fopen(argv[2], "wb");
  fwrite(y.data(), 2, y.size(), o);
  fwrite(sum.data(), 2, sum.size(), o);
  fclose(o);
  return 0;
}
`;

const sim = () => buildSim('gemv', `${GEMV_KERNEL_SOURCE}\n${DRIVER}`);

/** How a simulated GEMV launch runs: a one-shot or persistent choice, and the SM count its grid is sized for. */
export interface SimLaunch {
  choice: GemvChoice;
  /** persistent kernels: the grid is min(row groups, smCount x blocks per SM) (default 132, the H200's) */
  smCount?: number;
  /** the kernel to launch instead of choice.kernel (a fused twin); its grid is still the choice's */
  kernel?: string;
  /** dynamic shared memory bytes (the fused persistent twins: M K 2) */
  sharedBytes?: number;
}

function header(l: SimLaunch, M: number, N: number, K: number, act: number, f: [number, number, number]): Buffer {
  const name = Buffer.alloc(32);
  name.write(l.kernel ?? l.choice.kernel);
  return Buffer.concat([name, bytesOf(Int32Array.from([M, N, K, l.choice.warpsPerRow, gemvLaunchGrid(l.choice, N, l.smCount ?? 132),
    GEMV_THREADS, act, l.sharedBytes ?? 0]), Float32Array.from(f))]);
}

/** y [M, N] (bf16 bits) of one GEMV launch (or of its GLU twin with `act`, an ACT_CODE, on packed gate/up rows x [M, 2K]). */
export function runGemvLaunchSim(l: SimLaunch, M: number, N: number, K: number, w: Uint16Array, x: Uint16Array, act?: number): Uint16Array {
  return new Uint16Array(runSim(sim(), Buffer.concat([header(l, M, N, K, act ?? -1, [0, 0, 0]), bytesOf(w, x)])));
}

/**
 * An add + rmsnorm twin's launch: y [M, N] = rmsnorm(x + rScale r) (weight nw, offset off) · w^T,
 * and the new residual sum [M, K]; all bf16 bits.
 */
export function runGemvNormLaunchSim(l: SimLaunch, M: number, N: number, K: number, w: Uint16Array, x: Uint16Array,
  r: Uint16Array, nw: Uint16Array, rScale: number, eps: number, off: number): { y: Uint16Array; sum: Uint16Array } {
  const buf = runSim(sim(), Buffer.concat([header(l, M, N, K, -1, [rScale, eps, off]), bytesOf(w, x, r, nw)]));
  return { y: new Uint16Array(buf, 0, M * N), sum: new Uint16Array(buf, M * N * 2, M * K) };
}

/**
 * A norm-GLU twin's launch (k_gemvp_normglu_*): y [M, I] = glu(rmsnorm(x + rScale r) · w^T, act)
 * for packed gate/up rows w [2I, K], and the new residual sum [M, K]; all bf16 bits.
 */
export function runGemvNormGluLaunchSim(l: SimLaunch, M: number, I: number, K: number, w: Uint16Array, x: Uint16Array,
  r: Uint16Array, nw: Uint16Array, rScale: number, eps: number, off: number, act: number): { y: Uint16Array; sum: Uint16Array } {
  const buf = runSim(sim(), Buffer.concat([header(l, M, I, K, act, [rScale, eps, off]), bytesOf(w, x, r, nw)]));
  return { y: new Uint16Array(buf, 0, M * I), sum: new Uint16Array(buf, M * I * 2, M * K) };
}

/**
 * A norm-rope twin's launch (k_gemvp_normrope_*) over packed q/k/v rows w [(H + 2 KVH) D, K]: q
 * [M, H, D], the new residual [M, K], the pools after it and the error word. The launch's grid is
 * over the rope units (gemvRopeUnits).
 */
export function runGemvNormRopeLaunchSim(l: SimLaunch, c: RopeSimCall, K: number, w: Uint16Array, x: Uint16Array, r: Uint16Array,
  nw: Uint16Array, rScale: number, eps: number, off: number): RopeSimResult & { sum: Uint16Array } {
  const M = c.T, units = gemvRopeUnits(c.H, c.KVH, c.D, c.half);
  const buf = runSim(sim(), Buffer.concat([header(l, M, units, K, -1, [rScale, eps, off]),
    bytesOf(Int32Array.from([c.H, c.KVH, c.D, c.half, c.invStride, c.numSlots]), Float32Array.from([c.scaling]), w, x, r, nw, c.pos,
      c.invFreq, c.slots, c.kpool, c.vpool)]));
  const nq = M * c.H * c.D, np = c.numSlots * c.KVH * c.D;
  return { q: new Uint16Array(buf, 0, nq), sum: new Uint16Array(buf, nq * 2, M * K), kpool: new Uint16Array(buf, (nq + M * K) * 2, np),
    vpool: new Uint16Array(buf, (nq + M * K + np) * 2, np), err: new Int32Array(buf, (nq + M * K + 2 * np) * 2, 4) };
}

/** y [M, N] of a one-shot GEMV kernel. */
export function runGemvSim(kernel: GemvKernelName, warpsPerRow: number, M: number, N: number, K: number,
  w: Uint16Array, x: Uint16Array): Uint16Array {
  return runGemvLaunchSim({ choice: { kernel, warpsPerRow } }, M, N, K, w, x);
}
