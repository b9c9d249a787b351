// Runs the CUDA FP8 weight kernels (fp8-kernels.ts: the FP8 GEMVs and k_fp8_dequant) on the CPU
// through warp-sim.h, launched as cuda-fp8-weights.ts launches them (the block and grid
// gemvFp8Choice gives; the dequantization over elementwiseGrid).
import { ELEMWISE_THREADS, elementwiseGrid } from '../../../src/backends/cuda/cuda-op-context.ts';
import { FP8_KERNEL_SOURCE, type Fp8GemvLaunch, GEMV_FP8_KERNEL_NAMES, GEMV_FP8_TC_KERNEL_NAMES } from '../../../src/backends/cuda/fp8-kernels.ts';
import { GEMV_KERNEL_SOURCE } from '../../../src/backends/cuda/gemv-kernels.ts';
import { buildSim, bytesOf, runSim } from './build.ts';

const DRIVER = String.raw`
typedef void (*GemvFp8Fn)(const unsigned char*, const float*, int, int, const u16*, const void*, int, void*, int, int, int, int, int);
struct Named { const char* name; GemvFp8Fn fn; };
static const Named FP8[] = { ${[...GEMV_FP8_KERNEL_NAMES, ...GEMV_FP8_TC_KERNEL_NAMES].map((k) => `{"${k}", ${k}}`).join(', ')} };

// argv: input, output. Input: char[32] kernel; i32 M N K KB WPR grid threads bdt ydt colShift; u8 w[N K];
// f32 scales[N KB]; then for a GEMV u16 x[M K] and (bdt 0) f32 bias[N]. Output: y [M N] (ydt: bf16
// or f32 bits), or for k_fp8_dequant u16 out[N K].
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  char name[32];
  int hd[10];
  if (!f || fread(name, 1, 32, f) != 32 || fread(hd, 4, 10, f) != 10) return 2;
  const int M = hd[0], N = hd[1], K = hd[2], KB = hd[3], WPR = hd[4], grid = hd[5], threads = hd[6], bdt = hd[7], ydt = hd[8], colShift = hd[9];
  std::vector<unsigned char> w((size_t)N * K);
  std::vector<float> scales((size_t)N * KB);
  if (fread(w.data(), 1, w.size(), f) != w.size() || fread(scales.data(), 4, scales.size(), f) != scales.size()) return 2;
  FILE* o = fopen(argv[2], "wb");
  if (!strcmp(name, "k_fp8_dequant")) {
    fclose(f);
    std::vector<u16> out((size_t)N * K, 0xffff);
    sim::launch(dim3{(unsigned)grid, 1, 1}, threads, [&] { k_fp8_dequant(w.data(), scales.data(), KB, colShift, out.data(), N, K); });
    fwrite(out.data(), 2, out.size(), o);
    fclose(o);
    return 0;
  }
  GemvFp8Fn fn = 0;
  for (const Named& n : FP8) if (!strcmp(n.name, name)) fn = n.fn;
  if (!fn) { fprintf(stderr, "unknown kernel %s\n", name); return 2; }
  std::vector<u16> x((size_t)M * K);
  std::vector<float> bias(bdt == 0 ? N : 0);
  if (fread(x.data(), 2, x.size(), f) != x.size() || fread(bias.data(), 4, bias.size(), f) != bias.size()) return 2;
  fclose(f);
  const size_t ybytes = (size_t)M * N * (ydt == DT_F32 ? 4 : 2);
  std::vector<unsigned char> y(ybytes, 0xff);
  sim::launch(dim3{(unsigned)grid, 1, 1}, threads, [&] {
    fn(w.data(), scales.data(), KB, colShift, x.data(), bias.data(), bdt, y.data(), ydt, M, N, K, WPR);
  });
  fwrite(y.data(), 1, y.size(), o);
  fclose(o);
  return 0;
}
`;

const sim = () => buildSim('fp8', `${GEMV_KERNEL_SOURCE}\n${FP8_KERNEL_SOURCE}\n${DRIVER}`);

function header(kernel: string, ints: number[]): Buffer {
  const name = Buffer.alloc(32);
  name.write(kernel);
  return Buffer.concat([name, bytesOf(Int32Array.from([...ints, ...Array(10 - ints.length).fill(0)]))]);
}

/**
 * y [M, N] of one FP8 GEMV launch over e4m3 bytes w [N, K] and scales [N, KB] (each covering
 * 2^colShift columns), x bf16 bits [M, K];
 * bias f32 [N] if given; y bf16 bits (Uint16Array) or, with `f32Out`, f32 (Float32Array).
 */
export function runGemvFp8Sim(l: Fp8GemvLaunch, M: number, N: number, K: number, w: Uint8Array, scales: Float32Array, colShift: number,
  x: Uint16Array, bias?: Float32Array, f32Out = false): Uint16Array | Float32Array {
  const KB = scales.length / N;
  const buf = runSim(sim(), Buffer.concat([
    header(l.kernel, [M, N, K, KB, l.warpsPerRow, l.grid, l.threads, bias ? 0 : -1, f32Out ? 0 : 2, colShift]),
    bytesOf(w, scales, x, ...(bias ? [bias] : []))]));
  return f32Out ? new Float32Array(buf) : new Uint16Array(buf);
}

/** bf16 bits [N, K] of k_fp8_dequant over e4m3 bytes w [N, K] and scales [N, KB] of 2^colShift columns (K % 4 == 0). */
export function runFp8DequantSim(N: number, K: number, w: Uint8Array, scales: Float32Array, colShift: number): Uint16Array {
  const KB = scales.length / N;
  const [grid] = elementwiseGrid((N * K) / 4);
  return new Uint16Array(runSim(sim(), Buffer.concat([header('k_fp8_dequant', [0, N, K, KB, 0, grid, ELEMWISE_THREADS, -1, 2, colShift]),
    bytesOf(w, scales)])));
}
