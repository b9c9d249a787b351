// Runs kernels of the CUDA fused module (fused-kernels.ts: add + rmsnorm, packed GLU, argmax) on
// the CPU through warp-sim.h, launched as cuda-fused-ops.ts and cuda-pick-ops.ts launch them.
import { FUSED_KERNEL_SOURCE } from '../../../src/backends/cuda/fused-kernels.ts';
import { buildSim, bytesOf, runSim } from './build.ts';

const DRIVER = String.raw`
// argv: input, output. Input: i32 which (0: add_rmsnorm, 1: argmax, 2: glu_packed), then
//   add_rmsnorm: i32 rows D threads; f32 rScale eps off; u16 a[rows D], b[rows D], w[D] -> u16 sum, normed
//   argmax:      i32 R V S chunk;    f32 x[R V]                                      -> i32 out[R]
//   glu_packed:  i32 T I act blocks; u16 gu[T 2I] (bf16)                             -> u16 out[T I]
//   rope_qkv:    i32 T H KVH D half invStride numSlots; f32 scaling; u16 qkv[T (H + 2 KVH) D]; i32 pos[T];
//                f32 invFreq[...]; i32 slots[T]; u16 kpool, vpool[numSlots KVH D] (bf16, no qk-norm)
//                -> u16 q[T H D], kpool, vpool; i32 err[4]
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  int which;
  if (!f || fread(&which, 4, 1, f) != 1) return 2;
  FILE* o = fopen(argv[2], "wb");
  if (which == 0) {
    int hd[3]; float fl[3];
    if (fread(hd, 4, 3, f) != 3 || fread(fl, 4, 3, f) != 3) return 2;
    const int rows = hd[0], D = hd[1], threads = hd[2];
    std::vector<u16> a((size_t)rows * D), b((size_t)rows * D), w(D), sum((size_t)rows * D), normed((size_t)rows * D);
    if (fread(a.data(), 2, a.size(), f) != a.size() || fread(b.data(), 2, b.size(), f) != b.size() ||
        fread(w.data(), 2, w.size(), f) != w.size()) return 2;
    sim::launch(dim3{(unsigned)rows, 1, 1}, threads, [&] {
      k_add_rmsnorm(a.data(), DT_BF16, b.data(), DT_BF16, fl[0], w.data(), DT_BF16, sum.data(), normed.data(), rows, D,
                    fl[1], fl[2]);
    });
    fwrite(sum.data(), 2, sum.size(), o);
    fwrite(normed.data(), 2, normed.size(), o);
  } else if (which == 2) {
    int hd[4];
    if (fread(hd, 4, 4, f) != 4) return 2;
    const int T = hd[0], I = hd[1], act = hd[2], blocks = hd[3];
    std::vector<u16> gu((size_t)T * 2 * I), out((size_t)T * I, 0xffff);
    if (fread(gu.data(), 2, gu.size(), f) != gu.size()) return 2;
    sim::launch(dim3{(unsigned)blocks, 1, 1}, 256, [&] { k_glu_packed(gu.data(), DT_BF16, out.data(), T, I, act); });
    fwrite(out.data(), 2, out.size(), o);
  } else if (which == 3) {
    int hd[7]; float scaling;
    if (fread(hd, 4, 7, f) != 7 || fread(&scaling, 4, 1, f) != 1) return 2;
    const int T = hd[0], H = hd[1], KVH = hd[2], D = hd[3], half = hd[4], invStride = hd[5], numSlots = hd[6];
    std::vector<u16> qkv((size_t)T * (H + 2 * KVH) * D), q((size_t)T * H * D, 0xffff);
    std::vector<int> pos(T), slots(T), err(4, 0);
    std::vector<float> invFreq(invStride ? (size_t)T * invStride : (size_t)half);
    std::vector<u16> kp((size_t)numSlots * KVH * D), vp((size_t)numSlots * KVH * D);
    if (fread(qkv.data(), 2, qkv.size(), f) != qkv.size() || fread(pos.data(), 4, T, f) != (size_t)T ||
        fread(invFreq.data(), 4, invFreq.size(), f) != invFreq.size() || fread(slots.data(), 4, T, f) != (size_t)T ||
        fread(kp.data(), 2, kp.size(), f) != kp.size() || fread(vp.data(), 2, vp.size(), f) != vp.size()) return 2;
    const int threads = std::min(256, std::max(32, (D + 31) / 32 * 32));
    sim::launch(dim3{(unsigned)T, (unsigned)(H + KVH), 1}, threads, [&] {
      k_rope_qkv(qkv.data(), DT_BF16, pos.data(), invFreq.data(), invStride, scaling, 0, 0, 0, 0.0f, 0.0f, q.data(), kp.data(),
                 vp.data(), DT_BF16, slots.data(), T, H, KVH, D, half, numSlots, err.data());
    });
    fwrite(q.data(), 2, q.size(), o);
    fwrite(kp.data(), 2, kp.size(), o);
    fwrite(vp.data(), 2, vp.size(), o);
    fwrite(err.data(), 4, 4, o);
  } else {
    int hd[4];
    if (fread(hd, 4, 4, f) != 4) return 2;
    const int R = hd[0], V = hd[1], S = hd[2], chunk = hd[3];
    std::vector<float> x((size_t)R * V), pv((size_t)R * S);
    std::vector<int> pi((size_t)R * S), out(R, -7);
    if (fread(x.data(), 4, x.size(), f) != x.size()) return 2;
    sim::launch(dim3{(unsigned)((V + chunk - 1) / chunk), (unsigned)R, 1}, 256, [&] {
      k_argmax_part(x.data(), DT_F32, pv.data(), pi.data(), V, chunk);
    });
    sim::launch(dim3{(unsigned)((R + 7) / 8), 1, 1}, 256, [&] { k_argmax_final(pv.data(), pi.data(), out.data(), R, (V + chunk - 1) / chunk); });
    fwrite(out.data(), 4, out.size(), o);
  }
  fclose(f);
  fclose(o);
  return 0;
}
`;

const sim = () => buildSim('fused', `${FUSED_KERNEL_SOURCE}\n${DRIVER}`);

/** k_add_rmsnorm over bf16 rows (threads as cuda-fused-ops.ts picks them); returns the bf16 bits of sum and normed. */
export function runAddRmsnormSim(rows: number, D: number, a: Uint16Array, b: Uint16Array, w: Uint16Array, rScale: number,
  eps: number, off: number): { sum: Uint16Array; normed: Uint16Array } {
  const threads = Math.min(1024, Math.max(32, Math.ceil(Math.ceil(D / 8) / 32) * 32));
  const buf = runSim(sim(), bytesOf(Int32Array.of(0, rows, D, threads), Float32Array.of(rScale, eps, off), a, b, w));
  return { sum: new Uint16Array(buf, 0, rows * D), normed: new Uint16Array(buf, rows * D * 2, rows * D) };
}

/** k_glu_packed over bf16 packed gate/up rows [T, 2I] (a few grid-stride blocks); returns the bf16 bits of [T, I]. */
export function runGluPackedSim(T: number, I: number, gu: Uint16Array, act: number): Uint16Array {
  return new Uint16Array(runSim(sim(), bytesOf(Int32Array.of(2, T, I, act, 3), gu)));
}

/** k_argmax_part + k_argmax_final over f32 rows, split as cuda-pick-ops.ts splits them. */
export function runArgmaxSim(R: number, V: number, x: Float32Array): Int32Array {
  const S = Math.max(1, Math.min(64, Math.ceil(V / 4096)));
  const chunk = Math.ceil(V / S / 8) * 8;
  const buf = runSim(sim(), bytesOf(Int32Array.of(1, R, V, S, chunk), x));
  return new Int32Array(buf);
}

/** What a rope + KV write call does to q and the pools (bf16 bits), and its error word. */
export interface RopeSimResult { q: Uint16Array; kpool: Uint16Array; vpool: Uint16Array; err: Int32Array }

/** The shapes and inputs of a rope + KV write call (no qk-norm, bf16 pools of numSlots slots). */
export interface RopeSimCall {
  T: number; H: number; KVH: number; D: number; half: number;
  /** 0: one invFreq row [half] for every token; half: a row per token [T, half] */
  invStride: number;
  numSlots: number; scaling: number;
  pos: Int32Array; invFreq: Float32Array; slots: Int32Array;
  /** the pools' contents before the call */
  kpool: Uint16Array; vpool: Uint16Array;
}

/** k_rope_qkv over bf16 qkv rows [T, (H + 2 KVH) D], as cuda-fused-ops.ts launches it. */
export function runRopeQkvSim(c: RopeSimCall, qkv: Uint16Array): RopeSimResult {
  const buf = runSim(sim(), Buffer.concat([bytesOf(Int32Array.from([3, c.T, c.H, c.KVH, c.D, c.half, c.invStride, c.numSlots]),
    Float32Array.from([c.scaling]), qkv, c.pos, c.invFreq, c.slots, c.kpool, c.vpool)]));
  const nq = c.T * c.H * c.D, np = c.numSlots * c.KVH * c.D;
  return { q: new Uint16Array(buf, 0, nq), kpool: new Uint16Array(buf, nq * 2, np), vpool: new Uint16Array(buf, (nq + np) * 2, np),
    err: new Int32Array(buf, (nq + 2 * np) * 2, 4) };
}
