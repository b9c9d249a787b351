// Runs the CUDA GEMV kernels (gemv-kernels.ts, y = x · w^T for decode shapes) on the CPU through
// warp-sim.h, launched as gemm.ts launches them (grid gemvGrid(N, warps per row), GEMV_THREADS).
import { GEMV_GLU_KERNEL_NAMES, GEMV_KERNEL_NAMES, GEMV_KERNEL_SOURCE, GEMV_THREADS, type GemvKernelName, gemvGrid } from '../../../src/backends/cuda/gemv-kernels.ts';
import { buildSim, bytesOf, runSim } from './build.ts';

const DRIVER = String.raw`
typedef void (*GemvFn)(const u16*, const u16*, u16*, int, int, int, int);
struct Named { const char* name; GemvFn fn; };
static const Named GEMV[] = { ${GEMV_KERNEL_NAMES.map((k) => `{"${k}", ${k}}`).join(', ')} };
typedef void (*GemvGluFn)(const u16*, const u16*, u16*, int, int, int, int, int);
struct NamedGlu { const char* name; GemvGluFn fn; };
static const NamedGlu GEMV_GLU[] = { ${GEMV_GLU_KERNEL_NAMES.map((k) => `{"${k}", ${k}}`).join(', ')} };

// argv: input, output. Input: char[32] kernel; i32 M N K WPR gridX threads act (-1: no GLU);
// u16 w[N K], x[M K] (with GLU: packed gate/up [M 2K]). Output: u16 y[M N].
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  char name[32];
  int hd[7];
  if (!f || fread(name, 1, 32, f) != 32 || fread(hd, 4, 7, f) != 7) return 2;
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
  const raw = runSim(bin, Buffer.concat([name, bytesOf(Int32Array.from([M, N, K, warpsPerRow, gemvGrid(N, warpsPerRow), GEMV_THREADS,
    act ?? -1]), w, x)]));
  return new Uint16Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength));
}
