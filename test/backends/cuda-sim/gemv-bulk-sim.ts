// The bulk-streamed one-row GEMV (gemv-bulk-kernels.ts k_gemvt_m1) on the warp simulator: the gemv
// module's loaders, the kernel, and a driver main() that launches it as gemm.ts does (gemvtLayout).
import { GEMV_KERNEL_SOURCE } from '../../../src/backends/cuda/gemv-kernels.ts';
import { GEMVT_KERNEL_SOURCE, GEMVT_THREADS, type GemvtLayout } from '../../../src/backends/cuda/gemv-bulk-kernels.ts';
import { buildSim, bytesOf, runSim } from './build.ts';

const DRIVER = String.raw`
// argv: input, output. Input: i32 norm (0: k_gemvt_m1, 1: k_gemvt_norm_m1) N K rowsPerBlock rowsPerChunk
// stages grid threads shared; f32 rScale eps off; u16 w[N K], x[K], then for the norm twin r[K], nw[K]
// (bf16). Output: u16 y[N] (0xffff where no block wrote), then for the norm twin sum[K].
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  int hd[9];
  float fl[3];
  if (!f || fread(hd, 4, 9, f) != 9 || fread(fl, 4, 3, f) != 3) return 2;
  const int norm = hd[0], N = hd[1], K = hd[2], R = hd[3], C = hd[4], S = hd[5], grid = hd[6], threads = hd[7], shared = hd[8];
  std::vector<u16> w((size_t)N * K), x(K), r(norm ? K : 0), nw(norm ? K : 0), y(N, 0xffff), sum(norm ? K : 0, 0xffff);
  if (fread(w.data(), 2, w.size(), f) != w.size() || fread(x.data(), 2, x.size(), f) != x.size() ||
      fread(r.data(), 2, r.size(), f) != r.size() || fread(nw.data(), 2, nw.size(), f) != nw.size()) return 2;
  fclose(f);
  sim::launch(dim3{(unsigned)grid, 1, 1}, threads, [&] {
    if (norm) k_gemvt_norm_m1(w.data(), x.data(), r.data(), fl[0], nw.data(), DT_BF16, fl[1], fl[2], sum.data(), y.data(), N, K, R, C, S);
    else k_gemvt_m1(w.data(), x.data(), y.data(), N, K, R, C, S);
  }, (size_t)shared);
  FILE* o = fopen(argv[2], "wb");
  fwrite(y.data(), 2, y.size(), o);
  fwrite(sum.data(), 2, sum.size(), o);
  fclose(o);
  return 0;
}
`;

const sim = () => buildSim('gemv-bulk', `${GEMV_KERNEL_SOURCE}\n${GEMVT_KERNEL_SOURCE}\n${DRIVER}`);

/** y [N] (bf16 bits) of k_gemvt_m1 launched with layout `l` over w [N, K] and x [K]. */
export function runGemvtSim(l: GemvtLayout, N: number, K: number, w: Uint16Array, x: Uint16Array): Uint16Array {
  const hd = Int32Array.from([0, N, K, l.rowsPerBlock, l.rowsPerChunk, l.stages, l.grid, GEMVT_THREADS, l.sharedBytes]);
  return new Uint16Array(runSim(sim(), Buffer.concat([bytesOf(hd, Float32Array.from([0, 0, 0])), bytesOf(w, x)])));
}

/** k_gemvt_norm_m1 (layout gemvtNormLayout): y [N] = rmsnorm(x + rScale r) (weight nw bf16, offset off) · w^T and the new residual [K]; bf16 bits. */
export function runGemvtNormSim(l: GemvtLayout, N: number, K: number, w: Uint16Array, x: Uint16Array, r: Uint16Array, nw: Uint16Array,
  rScale: number, eps: number, off: number): { y: Uint16Array; sum: Uint16Array } {
  const hd = Int32Array.from([1, N, K, l.rowsPerBlock, l.rowsPerChunk, l.stages, l.grid, GEMVT_THREADS, l.sharedBytes]);
  const buf = runSim(sim(), Buffer.concat([bytesOf(hd, Float32Array.from([rScale, eps, off])), bytesOf(w, x, r, nw)]));
  return { y: new Uint16Array(buf, 0, N), sum: new Uint16Array(buf, N * 2, K) };
}
