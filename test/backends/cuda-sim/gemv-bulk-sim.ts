// The bulk-streamed one-row GEMV (gemv-bulk-kernels.ts k_gemvt_m1) on the warp simulator: the gemv
// module's loaders, the kernel, and a driver main() that launches it as gemm.ts does (gemvtLayout).
import { GEMV_KERNEL_SOURCE } from '../../../src/backends/cuda/gemv-kernels.ts';
import { GEMVT_KERNEL_SOURCE, GEMVT_THREADS, type GemvtLayout } from '../../../src/backends/cuda/gemv-bulk-kernels.ts';
import { buildSim, bytesOf, runSim } from './build.ts';

const DRIVER = String.raw`
// argv: input, output. Input: i32 kind (0: k_gemvt_m1, 1: k_gemvt_norm_m1, 2: k_gemvt_normglu_m1) N K
// rowsPerBlock partCols slots grid threads shared act; f32 rScale eps off; u16 w[N K] (kind 2: packed
// gate/up [2N K]), x[K], then for the norm twins r[K], nw[K] (bf16). Output: u16 y[N] (0xffff where no
// block wrote), then for the norm twins sum[K].
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  int hd[10];
  float fl[3];
  if (!f || fread(hd, 4, 10, f) != 10 || fread(fl, 4, 3, f) != 3) return 2;
  const int kind = hd[0], N = hd[1], K = hd[2], R = hd[3], P = hd[4], S = hd[5], grid = hd[6], threads = hd[7], shared = hd[8];
  const int act = hd[9], norm = kind != 0;
  std::vector<u16> w((size_t)N * K * (kind == 2 ? 2 : 1)), x(K), r(norm ? K : 0), nw(norm ? K : 0), y(N, 0xffff), sum(norm ? K : 0, 0xffff);
  if (fread(w.data(), 2, w.size(), f) != w.size() || fread(x.data(), 2, x.size(), f) != x.size() ||
      fread(r.data(), 2, r.size(), f) != r.size() || fread(nw.data(), 2, nw.size(), f) != nw.size()) return 2;
  fclose(f);
  sim::launch(dim3{(unsigned)grid, 1, 1}, threads, [&] {
    if (kind == 2) {
      k_gemvt_normglu_m1(w.data(), x.data(), r.data(), fl[0], nw.data(), DT_BF16, fl[1], fl[2], sum.data(), y.data(), N, K, R, P, S, act);
    } else if (kind == 1) {
      k_gemvt_norm_m1(w.data(), x.data(), r.data(), fl[0], nw.data(), DT_BF16, fl[1], fl[2], sum.data(), y.data(), N, K, R, P, S);
    } else {
      k_gemvt_m1(w.data(), x.data(), y.data(), N, K, R, P, S);
    }
  }, (size_t)shared);
  FILE* o = fopen(argv[2], "wb");
  fwrite(y.data(), 2, y.size(), o);
  fwrite(sum.data(), 2, sum.size(), o);
  fclose(o);
  return 0;
}
`;

const sim = () => buildSim('gemv-bulk', `${GEMV_KERNEL_SOURCE}\n${GEMVT_KERNEL_SOURCE}\n${DRIVER}`);

function header(kind: number, l: GemvtLayout, N: number, K: number, act: number, f: [number, number, number]): Buffer {
  return bytesOf(Int32Array.from([kind, N, K, l.rowsPerBlock, l.partCols, l.slots, l.grid, GEMVT_THREADS, l.sharedBytes, act]),
    Float32Array.from(f));
}

/** y [N] (bf16 bits) of k_gemvt_m1 launched with layout `l` over w [N, K] and x [K]. */
export function runGemvtSim(l: GemvtLayout, N: number, K: number, w: Uint16Array, x: Uint16Array): Uint16Array {
  return new Uint16Array(runSim(sim(), Buffer.concat([header(0, l, N, K, 0, [0, 0, 0]), bytesOf(w, x)])));
}

/**
 * k_gemvt_norm_m1 (layout gemvtLayout): y [N] = rmsnorm(x + rScale r) (weight nw bf16, offset off) · w^T
 * and the new residual [K]; with `act` (an ACT_CODE) k_gemvt_normglu_m1 over packed gate/up rows w [2N, K]
 * (layout gemvtLayout(..., true)): y [N] their GLU. bf16 bits.
 */
export function runGemvtNormSim(l: GemvtLayout, N: number, K: number, w: Uint16Array, x: Uint16Array, r: Uint16Array, nw: Uint16Array,
  rScale: number, eps: number, off: number, act?: number): { y: Uint16Array; sum: Uint16Array } {
  const buf = runSim(sim(), Buffer.concat([header(act === undefined ? 1 : 2, l, N, K, act ?? 0, [rScale, eps, off]), bytesOf(w, x, r, nw)]));
  return { y: new Uint16Array(buf, 0, N), sum: new Uint16Array(buf, N * 2, K) };
}
