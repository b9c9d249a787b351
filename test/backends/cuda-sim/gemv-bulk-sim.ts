// The bulk-streamed one-row GEMV (gemv-bulk-kernels.ts k_gemvt_m1) on the warp simulator: the gemv
// module's loaders, the kernel, and a driver main() that launches it as gemm.ts does (gemvtLayout).
import { GEMV_KERNEL_SOURCE } from '../../../src/backends/cuda/gemv-kernels.ts';
import { GEMVT_KERNEL_SOURCE, GEMVT_THREADS, type GemvtLayout } from '../../../src/backends/cuda/gemv-bulk-kernels.ts';
import { buildSim, bytesOf, runSim } from './build.ts';

const DRIVER = String.raw`
// argv: input, output. Input: i32 N K rowsPerBlock rowsPerChunk stages grid threads shared; u16 w[N K], x[K].
// Output: u16 y[N] (0xffff where no block wrote).
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  int hd[8];
  if (!f || fread(hd, 4, 8, f) != 8) return 2;
  const int N = hd[0], K = hd[1], R = hd[2], C = hd[3], S = hd[4], grid = hd[5], threads = hd[6], shared = hd[7];
  std::vector<u16> w((size_t)N * K), x(K), y(N, 0xffff);
  if (fread(w.data(), 2, w.size(), f) != w.size() || fread(x.data(), 2, x.size(), f) != x.size()) return 2;
  fclose(f);
  sim::launch(dim3{(unsigned)grid, 1, 1}, threads, [&] { k_gemvt_m1(w.data(), x.data(), y.data(), N, K, R, C, S); }, (size_t)shared);
  FILE* o = fopen(argv[2], "wb");
  fwrite(y.data(), 2, y.size(), o);
  fclose(o);
  return 0;
}
`;

const sim = () => buildSim('gemv-bulk', `${GEMV_KERNEL_SOURCE}\n${GEMVT_KERNEL_SOURCE}\n${DRIVER}`);

/** y [N] (bf16 bits) of k_gemvt_m1 launched with layout `l` over w [N, K] and x [K]. */
export function runGemvtSim(l: GemvtLayout, N: number, K: number, w: Uint16Array, x: Uint16Array): Uint16Array {
  const hd = Int32Array.from([N, K, l.rowsPerBlock, l.rowsPerChunk, l.stages, l.grid, GEMVT_THREADS, l.sharedBytes]);
  return new Uint16Array(runSim(sim(), Buffer.concat([bytesOf(hd), bytesOf(w, x)])));
}
