// Runs the CUDA mixture-of-experts FFN kernels on the CPU through warp-sim.h, launched as
// cuda-moe-ops.ts launches them: the generic k_moe_hidden / k_moe_down (kernels.ts' base module,
// taken out of its source: the rest of that module does not build here) with bf16 dtypes, or the
// bf16 twins k_moe_hidden_v / k_moe_down_v (moe-kernels.ts, after the GEMV source whose loaders
// they use).
import { GEMV_KERNEL_SOURCE } from '../../../src/backends/cuda/gemv-kernels.ts';
import { CUDA_DEFAULTS } from '../../../src/backends/cuda/cuda-settings.ts';
import { kernelModules, KERNEL_PRELUDE } from '../../../src/backends/cuda/kernels.ts';
import {
  MOE_GROUP_THREADS, MOE_KERNEL_SOURCE, MOE_ROUTE_WARPS, MOE_ROWS_PER_BLOCK, MOE_TC_ROWS, MOE_TC_THREADS,
  MOE_THREADS,
} from '../../../src/backends/cuda/moe-kernels.ts';
import { buildSim, bytesOf, runSim } from './build.ts';

/** The text of `extern "C" __global__ void name(...) { ... }` in `source` (to its matching brace). */
function kernelText(source: string, name: string): string {
  const start = source.indexOf(`extern "C" __global__ void ${name}(`);
  if (start < 0) throw new Error(`no kernel ${name}`);
  let depth = 0;
  for (let i = source.indexOf('{', start); i < source.length; i++) {
    if (source[i] === '{') depth++;
    else if (source[i] === '}' && --depth === 0) return source.slice(start, i + 1);
  }
  throw new Error(`kernel ${name} does not end`);
}

const BASE = kernelModules(CUDA_DEFAULTS).find((m) => m.name === 'base')!.source.slice(KERNEL_PRELUDE.length);

const DRIVER = String.raw`
// reads v.size() values of v's type; false on a short file
template <class T> static bool rd(FILE* f, std::vector<T>& v) { return fread(v.data(), sizeof(T), v.size(), f) == v.size(); }

// argv: input, output. Input: i32 kind (0 scalar, 1 vec, 2 grouped, 3 grouped with k_moe_hidden_tc, 4 with both
// tensor-core kernels) T K D I E act gridY (the cap on grid
// y) chunk (grouped: tokens a pass) downRows (grouped on CUDA cores: 1 k_moe_down_g, 4 k_moe_down_g4) hiddenRows (1
// k_moe_hidden_g, 2 k_moe_hidden_g2); u16 x[T D] (bf16);
// i32 experts[T K]; f32 weights[T K]; u16 gate[E I D], up[E I D], down[E D I] (bf16).
// Output: f32 hidden[T K I] (NaN where never written); u16 out[T D] (0xffff where never written); i32 err[4].
int main(int argc, char** argv) {
  FILE* f = argc == 3 ? fopen(argv[1], "rb") : 0;
  std::vector<int> hd(11);
  if (!f || !rd(f, hd)) return 2;
  const int vec = hd[0], T = hd[1], K = hd[2], D = hd[3], I = hd[4], E = hd[5], act = hd[6], capY = hd[7], chunk = hd[8];
  const int downRows = hd[9], hiddenRows = hd[10];
  std::vector<u16> x((size_t)T * D), gate((size_t)E * I * D), up(gate.size()), down((size_t)E * D * I);
  std::vector<int> experts((size_t)T * K);
  std::vector<float> weights(experts.size());
  if (!rd(f, x) || !rd(f, experts) || !rd(f, weights) || !rd(f, gate) || !rd(f, up) || !rd(f, down)) return 2;
  fclose(f);
  std::vector<float> hidden((size_t)T * K * I, __uint_as_float(0xffffffffu));
  std::vector<u16> out((size_t)T * D, 0xffff);
  std::vector<int> err(4, 0);
  const int TK = T * K, R = ${MOE_ROWS_PER_BLOCK};
  const dim3 gh{(unsigned)((I + R - 1) / R), (unsigned)(TK < capY ? TK : capY), 1};
  const dim3 gd{(unsigned)((D + R - 1) / R), (unsigned)(T < capY ? T : capY), 1};
  if (vec >= 2) { // as cuda-moe-ops.ts moeFfnGrouped: chunks of up to chunk tokens
    std::vector<float> ypair((size_t)chunk * K * D, __uint_as_float(0xffffffffu));
    std::vector<int> grp(2 + 3 * (size_t)chunk * K, -9);
    for (int t0 = 0; t0 < T; t0 += chunk) {
      const int Tc = T - t0 < chunk ? T - t0 : chunk, TKc = Tc * K;
      const int gy0 = E < TKc ? E : TKc;
      const unsigned gy = (unsigned)(gy0 < capY ? gy0 : capY);
      float* hid = hidden.data() + (size_t)t0 * K * I; // the chunk's rows of the full hidden, for the output
      const int* ex = experts.data() + (size_t)t0 * K;
      sim::launch(dim3{1, 1, 1}, ${MOE_GROUP_THREADS}, [&] { k_moe_group(ex, TKc, K, E, I, t0, grp.data(), hid, err.data()); });
      if (vec >= 3) {
        sim::launch(dim3{(unsigned)((I + ${MOE_TC_ROWS} - 1) / ${MOE_TC_ROWS}), gy, 1}, ${MOE_TC_THREADS}, [&] {
          k_moe_hidden_tc(x.data() + (size_t)t0 * D, grp.data(), gate.data(), up.data(), hid, TKc, K, D, I, act);
        });
      } else if (hiddenRows == 2) {
        sim::launch(dim3{(unsigned)((I + 2 * R - 1) / (2 * R)), gy, 1}, ${MOE_THREADS}, [&] {
          k_moe_hidden_g2(x.data() + (size_t)t0 * D, grp.data(), gate.data(), up.data(), hid, TKc, K, D, I, act);
        });
      } else {
        sim::launch(dim3{(unsigned)((I + R - 1) / R), gy, 1}, ${MOE_THREADS}, [&] {
          k_moe_hidden_g(x.data() + (size_t)t0 * D, grp.data(), gate.data(), up.data(), hid, TKc, K, D, I, act);
        });
      }
      if (vec == 4) {
        sim::launch(dim3{(unsigned)((D + ${MOE_TC_ROWS} - 1) / ${MOE_TC_ROWS}), gy, 1}, ${MOE_TC_THREADS}, [&] {
          k_moe_down_tc(hid, grp.data(), down.data(), ypair.data(), TKc, D, I);
        });
      } else if (downRows == 4) {
        sim::launch(dim3{(unsigned)((D + 4 * R - 1) / (4 * R)), gy, 1}, ${MOE_THREADS}, [&] {
          k_moe_down_g4(hid, grp.data(), down.data(), ypair.data(), TKc, D, I);
        });
      } else {
        sim::launch(dim3{(unsigned)((D + R - 1) / R), gy, 1}, ${MOE_THREADS}, [&] {
          k_moe_down_g(hid, grp.data(), down.data(), ypair.data(), TKc, D, I);
        });
      }
      sim::launch(dim3{(unsigned)((Tc * D + 255) / 256 < 4 ? (Tc * D + 255) / 256 : 4), 1, 1}, 256, [&] {
        k_moe_combine(ypair.data(), weights.data() + (size_t)t0 * K, ex, out.data() + (size_t)t0 * D, Tc, K, D, E);
      });
    }
  } else if (vec) {
    sim::launch(gh, ${MOE_THREADS}, [&] {
      k_moe_hidden_v(x.data(), experts.data(), gate.data(), up.data(), hidden.data(), TK, K, D, I, E, act, err.data());
    });
    sim::launch(gd, ${MOE_THREADS}, [&] {
      k_moe_down_v(hidden.data(), weights.data(), experts.data(), down.data(), out.data(), T, K, D, I, E);
    });
  } else {
    sim::launch(gh, ${MOE_THREADS}, [&] {
      k_moe_hidden(x.data(), DT_BF16, experts.data(), gate.data(), DT_BF16, up.data(), DT_BF16, hidden.data(), TK, K, D, I,
                   E, act, err.data());
    });
    sim::launch(gd, ${MOE_THREADS}, [&] {
      k_moe_down(hidden.data(), weights.data(), experts.data(), down.data(), DT_BF16, out.data(), T, K, D, I, E);
    });
  }
  FILE* o = fopen(argv[2], "wb");
  fwrite(hidden.data(), 4, hidden.size(), o);
  fwrite(out.data(), 2, out.size(), o);
  fwrite(err.data(), 4, 4, o);
  fclose(o);
  return 0;
}
`;

const sim = () => buildSim('moe', [GEMV_KERNEL_SOURCE, MOE_KERNEL_SOURCE, kernelText(BASE, 'k_moe_hidden'),
  kernelText(BASE, 'k_moe_down'), DRIVER].join('\n'));

/** One moeFfn problem: bf16 bits of x [T, D], gate / up [E, I, D], down [E, D, I]; routing [T, K]. */
export interface MoeSimCase {
  T: number; K: number; D: number; I: number; E: number;
  /** ACT_CODE of the gate's activation */
  act: number;
  x: Uint16Array; gate: Uint16Array; up: Uint16Array; down: Uint16Array;
  experts: Int32Array; weights: Float32Array;
  /** the cap on either launch's grid y (cuda-moe-ops.ts: 65535); smaller makes the blocks loop over pairs */
  gridY?: number;
  /** grouped: tokens a pass (cuda-moe-ops.ts: CudaMoeSettings.passRows, 2048 by default) */
  chunk?: number;
  /** grouped on CUDA cores: output rows a warp of the down projection takes (cuda-moe-ops.ts: 4 by default) */
  downRows?: 1 | 4;
  /** the same for the gate/up products (2 by default) */
  hiddenRows?: 1 | 2;
}

export interface MoeSimResult {
  /** f32 [T K, I] (NaN where no kernel wrote) */
  hidden: Float32Array;
  /** bf16 bits [T, D] */
  out: Uint16Array;
  /** the error word: code, a, b, c */
  err: Int32Array;
}

/**
 * The FFN kernels on one case: 'scalar' (k_moe_hidden / k_moe_down), 'vec' (k_moe_hidden_v /
 * k_moe_down_v), 'grouped' (k_moe_group, k_moe_hidden_g2 or _g, k_moe_down_g4 or _g, k_moe_combine per chunk) or
 * 'grouped-tc' (the same with k_moe_hidden_tc) or 'grouped-tc2' (and k_moe_down_tc).
 */
export function runMoeSim(kind: 'scalar' | 'vec' | 'grouped' | 'grouped-tc' | 'grouped-tc2', c: MoeSimCase): MoeSimResult {
  const { T, K, D, I, E } = c;
  const buf = runSim(sim(), bytesOf(Int32Array.of(['scalar', 'vec', 'grouped', 'grouped-tc', 'grouped-tc2'].indexOf(kind), T, K, D, I, E, c.act, c.gridY ?? 65535,
    c.chunk ?? CUDA_DEFAULTS.moe.passRows, c.downRows ?? 4, c.hiddenRows ?? 2), c.x,
    c.experts, c.weights, c.gate, c.up, c.down));
  const h = T * K * I * 4, o = T * D * 2;
  return { hidden: new Float32Array(buf, 0, T * K * I), out: new Uint16Array(buf, h, T * D), err: new Int32Array(buf.slice(h + o, h + o + 16)) };
}

const ROUTE_DRIVER = String.raw`
// argv: input, output. Input: i32 T E K renorm; f32 logits[T E]. Output: i32 experts[T K]; f32 weights[T K].
int main(int argc, char** argv) {
  FILE* f = argc == 3 ? fopen(argv[1], "rb") : 0;
  int hd[4];
  if (!f || fread(hd, 4, 4, f) != 4) return 2;
  const int T = hd[0], E = hd[1], K = hd[2], renorm = hd[3];
  std::vector<float> logits((size_t)T * E);
  if (fread(logits.data(), 4, logits.size(), f) != logits.size()) return 2;
  fclose(f);
  std::vector<int> experts((size_t)T * K, -7);
  std::vector<float> weights((size_t)T * K, -7.0f);
  const int W = ${MOE_ROUTE_WARPS};
  sim::launch(dim3{(unsigned)((T + W - 1) / W), 1, 1}, 32 * W, [&] {
    k_moe_route(logits.data(), DT_F32, weights.data(), experts.data(), T, E, K, renorm);
  });
  FILE* o = fopen(argv[2], "wb");
  fwrite(experts.data(), 4, experts.size(), o);
  fwrite(weights.data(), 4, weights.size(), o);
  fclose(o);
  return 0;
}
`;

const routeSim = () => buildSim('moe-route', [kernelText(BASE, 'k_moe_route'), ROUTE_DRIVER].join('\n'));

/** k_moe_route on f32 logits [T, E], launched as cuda-moe-ops.ts launches it: experts and weights [T, K]. */
export function runRouteSim(logits: Float32Array, T: number, E: number, K: number, renorm: boolean):
  { experts: Int32Array; weights: Float32Array } {
  const buf = runSim(routeSim(), bytesOf(Int32Array.of(T, E, K, renorm ? 1 : 0), logits));
  return { experts: new Int32Array(buf.slice(0, T * K * 4)), weights: new Float32Array(buf.slice(T * K * 4, 2 * T * K * 4)) };
}
