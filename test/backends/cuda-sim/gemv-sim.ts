// Runs the CUDA GEMV kernels (gemv-kernels.ts, y = x · w^T for decode shapes) on the CPU through
// warp-sim.h, launched as gemm.ts launches them (grid gemvGrid(N, warps per row), GEMV_THREADS).
import {
  GEMV_GLU_KERNEL_NAMES, GEMV_KERNEL_NAMES, GEMV_KERNEL_SOURCE, GEMV_NORM_KERNEL_NAMES, GEMV_THREADS, type GemvKernelName, gemvGrid,
} from '../../../src/backends/cuda/gemv-kernels.ts';
import { buildSim, bytesOf, runSim } from './build.ts';

const DRIVER = String.raw`
typedef void (*GemvFn)(const u16*, const u16*, u16*, int, int, int, int);
struct Named { const char* name; GemvFn fn; };
static const Named GEMV[] = { ${GEMV_KERNEL_NAMES.map((k) => `{"${k}", ${k}}`).join(', ')} };
typedef void (*GemvGluFn)(const u16*, const u16*, u16*, int, int, int, int, int);
struct NamedGlu { const char* name; GemvGluFn fn; };
static const NamedGlu GEMV_GLU[] = { ${GEMV_GLU_KERNEL_NAMES.map((k) => `{"${k}", ${k}}`).join(', ')} };
typedef void (*GemvNormFn)(const u16*, const u16*, const u16*, float, const void*, int, float, float, u16*, u16*, int, int,
  int, int);
struct NamedNorm { const char* name; GemvNormFn fn; };
static const NamedNorm GEMV_NORM[] = { ${GEMV_NORM_KERNEL_NAMES.map((k) => `{"${k}", ${k}}`).join(', ')} };

// argv: input, output. Input: char[32] kernel (a k_gemv_norm_*); i32 M N K WPR gridX threads; f32 rScale eps
// off; u16 w[N K], x[M K], r[M K], nw[K] (bf16). Output: u16 y[M N], sum[M K].
static int runNorm(FILE* f, const char* name, const char* outPath) {
  int hd[6];
  float fl[3];
  if (fread(hd, 4, 6, f) != 6 || fread(fl, 4, 3, f) != 3) return 2;
  const int M = hd[0], N = hd[1], K = hd[2], WPR = hd[3], gridX = hd[4], threads = hd[5];
  std::vector<u16> w((size_t)N * K), x((size_t)M * K), r((size_t)M * K), nw(K), y((size_t)M * N, 0xffff), sum((size_t)M * K, 0xffff);
  if (fread(w.data(), 2, w.size(), f) != w.size() || fread(x.data(), 2, x.size(), f) != x.size() ||
      fread(r.data(), 2, r.size(), f) != r.size() || fread(nw.data(), 2, nw.size(), f) != nw.size()) return 2;
  GemvNormFn fn = 0;
  for (const NamedNorm& n : GEMV_NORM) if (!strcmp(n.name, name)) fn = n.fn;
  if (!fn) { fprintf(stderr, "unknown kernel %s\n", name); return 2; }
  sim::launch(dim3{(unsigned)gridX, 1, 1}, threads, [&] {
    fn(w.data(), x.data(), r.data(), fl[0], nw.data(), DT_BF16, fl[1], fl[2], sum.data(), y.data(), M, N, K, WPR);
  });
  FILE* o = fopen(outPath, "wb");
  fwrite(y.data(), 2, y.size(), o);
  fwrite(sum.data(), 2, sum.size(), o);
  fclose(o);
  return 0;
}

// argv: input, output. Input: char[32] kernel; i32 M N K WPR gridX threads act (-1: no GLU);
// u16 w[N K], x[M K] (with GLU: packed gate/up [M 2K]). Output: u16 y[M N].
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  char name[32];
  int hd[7];
  if (!f || fread(name, 1, 32, f) != 32) return 2;
  if (!strncmp(name, "k_gemv_norm_", 12)) return runNorm(f, name, argv[2]);
  if (fread(hd, 4, 7, f) != 7) return 2;
  const int M = hd[0], N = hd[1], K = hd[2], WPR = hd[3], gridX = hd[4], threads = hd[5], act = hd[6];
  std::vector<u16> w((size_t)N * K), x((size_t)M * K * (act >= 0 ? 2 : 1)), y((size_t)M * N, 0xffff);
  if (fread(w.data(), 2, w.size(), f) != w.size() || fread(x.data(), 2, x.size(), f) != x.size()) return 2;
  fclose(f);
  GemvFn fn = 0;
  GemvGluFn glu = 0;
  for (const Named& n : GEMV) if (!strcmp(n.name, name)) fn = n.fn;
  for (const NamedGlu& n : GEMV_GLU) if (!strcmp(n.name, name)) glu = n.fn;
  if (!fn && !glu) { fprintf(stderr, "unknown kernel %s\n", name); return 2; }
  sim::launch(dim3{(unsigned)gridX, 1, 1}, threads, [&] {
    if (glu) glu(w.data(), x.data(), y.data(), M, N, K, WPR, act);
    else fn(w.data(), x.data(), y.data(), M, N, K, WPR);
  });
  FILE* o = fopen(argv[2], "wb");
  fwrite(y.data(), 2, y.size(), o);
  fclose(o);
  return 0;
}
`;

/**
 * y [M, N] (bf16 bits) of one GEMV launch; w [N, K] and x [M, K] as bf16 bits. With `act` (an
 * ACT_CODE) the kernel's GLU twin runs on x = packed gate/up rows [M, 2K].
 */
export function runGemvSim(kernel: GemvKernelName, warpsPerRow: number, M: number, N: number, K: number,
  w: Uint16Array, x: Uint16Array, act?: number): Uint16Array {
  const bin = buildSim('gemv', `${GEMV_KERNEL_SOURCE}\n${DRIVER}`);
  const name = Buffer.alloc(32);
  name.write(act === undefined ? kernel : kernel.replace('k_gemv_', 'k_gemv_glu_'));
  const buf = runSim(bin, Buffer.concat([name, bytesOf(Int32Array.from([M, N, K, warpsPerRow, gemvGrid(N, warpsPerRow), GEMV_THREADS,
    act ?? -1]), w, x)]));
  return new Uint16Array(buf);
}

/**
 * The add + rmsnorm twin of a GEMV kernel: y [M, N] = rmsnorm(x + rScale r) (weight nw, offset
 * off) · w^T, and the new residual sum [M, K]; all bf16 bits.
 */
export function runGemvNormSim(kernel: GemvKernelName, warpsPerRow: number, M: number, N: number, K: number,
  w: Uint16Array, x: Uint16Array, r: Uint16Array, nw: Uint16Array, rScale: number, eps: number, off: number): { y: Uint16Array; sum: Uint16Array } {
  const bin = buildSim('gemv', `${GEMV_KERNEL_SOURCE}\n${DRIVER}`);
  const name = Buffer.alloc(32);
  name.write(kernel.replace('k_gemv_', 'k_gemv_norm_'));
  const buf = runSim(bin, Buffer.concat([name, bytesOf(Int32Array.from([M, N, K, warpsPerRow, gemvGrid(N, warpsPerRow), GEMV_THREADS]),
    Float32Array.from([rScale, eps, off]), w, x, r, nw)]));
  return { y: new Uint16Array(buf, 0, M * N), sum: new Uint16Array(buf, M * N * 2, M * K) };
}
