// Runs the CUDA attention module's decode kernels on the CPU through warp-sim.h: the kernels'
// own source (attention-kernels.ts, attention-decode-tc.ts) compiled with g++ against emulated
// primitives, driven by the launch plan attention.ts makes for a small simulated GPU. CI has no
// GPU; this checks the kernels' index and fragment logic there (not their speed, nor anything
// the emulation itself gets wrong: warp-sim.h follows the PTX ISA's fragment layouts).
import { buildSim, bytesOf, runSim } from './build.ts';
import { attentionKernels } from '../../../src/backends/cuda/attention-kernels.ts';
import { attDecodeTcKernels, attTcSharedBytes } from '../../../src/backends/cuda/attention-decode-tc.ts';
import { type AttentionPlan, decodeGrid } from '../../../src/backends/cuda/attention.ts';
import { CUDA_DEFAULTS, type CudaAttentionSettings } from '../../../src/backends/cuda/cuda-settings.ts';

/** the module's kernels as the default settings plan them (the tests' plans use the same) */
const ATTENTION_KERNELS = attentionKernels(CUDA_DEFAULTS.attention);

export { simUnavailable } from './build.ts';

const DECODE_KERNELS = [
  'k_attn_decode_d64_g4', 'k_attn_decode_d64_g8', 'k_attn_decode_d128_g4', 'k_attn_decode_d128_g8',
  'k_attn_decode_d256_g4', 'k_attn_decode_d256_g8',
];
/** the tensor-core decode kernels take the split counters as a last argument */
const TC_KERNELS = ['k_attn_decode_tc_d64', 'k_attn_decode_tc_d128'];

const DRIVER = String.raw`
typedef void (*DecodeFn)(const u16*, const u16*, const u16*, const int*, const int*, const int*, int*, int, u16*,
  float*, float*, int, int, int, int, int, int, int, int, float, float, int, int*);
struct Named { const char* name; DecodeFn fn; };
static const Named DECODE[] = { ${DECODE_KERNELS.map((k) => `{"${k}", ${k}}`).join(', ')} };
typedef void (*DecodeTcFn)(const u16*, const u16*, const u16*, const int*, const int*, const int*, int*, int, u16*,
  float*, float*, int, int, int, int, int, int, int, int, float, float, int, int*, int*);
struct NamedTc { const char* name; DecodeTcFn fn; };
static const NamedTc DECODE_TC[] = { ${TC_KERNELS.map((k) => `{"${k}", ${k}}`).join(', ')} };

template <class T> static std::vector<T> take(FILE* f, size_t n) {
  std::vector<T> v(n);
  if (n && fread(v.data(), sizeof(T), n, f) != n) { fprintf(stderr, "short input\n"); exit(2); }
  return v;
}

// argv: input file, output file. Input: char[64] decode kernel name, char[64] prefill kernel name
// ("" for none); i32 T H KVH D NB BS R MBR window W gridY planKernel combine prefillTiles fusedCombine
// decodeShared (the decode kernel's dynamic shared bytes) gridX (the decode kernel's grid: gridX x gridY)
// prefillShared (the prefill kernel's dynamic shared bytes) partRows (the partials' rows, AttentionPlan.partRows);
// f32 scale softcap; u16 q[T H D], k[NB BS KVH D], v[same]; i32 rows[T],
// poss[T], tables[R MBR]. Output: u16 out[T H D]; i32 err[4]; i32 the split counters' sum afterwards.
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  if (!f) return 2;
  char name[64], prefill[64];
  if (fread(name, 1, 64, f) != 64 || fread(prefill, 1, 64, f) != 64) return 2;
  std::vector<int> hd = take<int>(f, 19);
  const int T = hd[0], H = hd[1], KVH = hd[2], D = hd[3], NB = hd[4], BS = hd[5], R = hd[6], MBR = hd[7];
  const int window = hd[8], W = hd[9], gridY = hd[10], planKernel = hd[11], combine = hd[12], tiles = hd[13];
  const int fused = hd[14], decodeShared = hd[15], gridX = hd[16], prefillShared = hd[17], partRows = hd[18];
  std::vector<float> fl = take<float>(f, 2);
  std::vector<u16> q = take<u16>(f, (size_t)T * H * D);
  std::vector<u16> kp = take<u16>(f, (size_t)NB * BS * KVH * D), vp = take<u16>(f, (size_t)NB * BS * KVH * D);
  std::vector<int> rows = take<int>(f, T), poss = take<int>(f, T), tables = take<int>(f, (size_t)R * MBR);
  fclose(f);
  DecodeFn fn = 0;
  DecodeTcFn tc = 0;
  for (const Named& n : DECODE) if (!strcmp(n.name, name)) fn = n.fn;
  for (const NamedTc& n : DECODE_TC) if (!strcmp(n.name, name)) tc = n.fn;
  if (!fn && !tc) { fprintf(stderr, "unknown kernel %s\n", name); return 2; }
  std::vector<int> counters((size_t)T * KVH + 1, 0);
  std::vector<u16> out((size_t)T * H * D, 0);
  std::vector<int> plan(T + 1, 0), err(4, 0);
  std::vector<float> part((size_t)partRows * H * D + 1), partml((size_t)partRows * H * 2 + 1);
  const float scale = fl[0], softcap = fl[1];
  // planKernel: the decode kernel's planReady (1: k_attn_plan first; 2: every token in order)
  if (planKernel == 1) sim::launch(dim3{1, 1, 1}, 1024, [&] { k_attn_plan(rows.data(), T, plan.data()); });
  sim::launch(dim3{(unsigned)gridX, (unsigned)gridY, 1}, 128, [&] {
    if (tc) {
      tc(q.data(), kp.data(), vp.data(), rows.data(), poss.data(), tables.data(), plan.data(), planKernel, out.data(),
         part.data(), partml.data(), T, H, KVH, NB, BS, R, MBR, window, scale, softcap, W, err.data(),
         fused ? counters.data() : 0);
    } else {
      fn(q.data(), kp.data(), vp.data(), rows.data(), poss.data(), tables.data(), plan.data(), planKernel, out.data(),
         part.data(), partml.data(), T, H, KVH, NB, BS, R, MBR, window, scale, softcap, W, err.data());
    }
  }, (size_t)decodeShared);
  if (combine) {
    sim::launch(dim3{(unsigned)((W + 1) / 2), (unsigned)H, 1}, 128, [&] {
      k_attn_combine(rows.data(), poss.data(), plan.data(), part.data(), partml.data(), out.data(), T, H, D, R, window, W);
    });
  }
  if (prefill[0]) {
    typedef void (*PrefillFn)(const u16*, const u16*, const u16*, const int*, const int*, const int*, u16*, int, int, int,
      int, int, int, int, int, float, float, int*);
    PrefillFn pf = !strcmp(prefill, "k_attn_prefill_d64") ? k_attn_prefill_d64 : !strcmp(prefill, "k_attn_prefill_d128")
      ? k_attn_prefill_d128 : !strcmp(prefill, "k_attn_prefill_d256") ? k_attn_prefill_d256
      : !strcmp(prefill, "k_attn_prefill_bi_d64") ? k_attn_prefill_bi_d64 : !strcmp(prefill, "k_attn_prefill_bi_d128")
      ? k_attn_prefill_bi_d128 : 0;
    if (!pf) { fprintf(stderr, "unknown kernel %s\n", prefill); return 2; }
    sim::launch(dim3{(unsigned)H, (unsigned)tiles, 1}, 128, [&] {
      pf(q.data(), kp.data(), vp.data(), rows.data(), poss.data(), tables.data(), out.data(), T, H, KVH, NB, BS, R, MBR,
         window, scale, softcap, err.data());
    }, (size_t)prefillShared);
  }
  FILE* o = fopen(argv[2], "wb");
  fwrite(out.data(), 2, out.size(), o);
  fwrite(err.data(), 4, 4, o);
  int left = 0;
  for (int c : counters) left += c;
  fwrite(&left, 4, 1, o);
  fclose(o);
  return 0;
}
`;

/**
 * The attention module's kernels and the driver, built once per process (cached on disk), with
 * `defines` (NAME=VALUE: the tuning macros CudaKernelSettings.attentionDefines sets) put first;
 * `invariant`: as batch-invariant mode builds them, with these attention settings' split size.
 */
function attentionSim(defines: readonly string[], stages: number, invariant?: CudaAttentionSettings): string {
  const head = defines.map((d) => `#define ${d.replace('=', ' ')}\n`).join('');
  const kernels = invariant ? attentionKernels(invariant, true) : ATTENTION_KERNELS;
  return buildSim('attention', `${head}${kernels}\n${attDecodeTcKernels(stages)}\n${DRIVER}`);
}

export interface SimCall {
  T: number; H: number; KVH: number; D: number; NB: number; BS: number; R: number; MBR: number; window: number;
  scale: number; softcap: number;
  /** bf16 bits */
  q: Uint16Array; k: Uint16Array; v: Uint16Array;
  rows: Int32Array; poss: Int32Array; tables: Int32Array;
}

/**
 * Runs one attention call's kernels as `plan` launches them (attention.ts enqueueAttention); returns
 * the bf16 output bits and the error word. `stages`: the tensor-core kernel's ring, compiled and
 * sized for that many stages (default: the default tcStages, the plan's decodeSharedBytes).
 * `invariant`: the kernels of batch-invariant mode under these settings (a plan of planAttention's
 * batch-invariant mode with the same settings).
 */
export function runAttentionSim(call: SimCall, plan: AttentionPlan, defines: readonly string[] = [], stages = CUDA_DEFAULTS.attention.tcStages,
  invariant?: CudaAttentionSettings): { out: Uint16Array; err: Int32Array; countersLeft: number } {
  if (plan.path !== 'fast' || !plan.decodeKernel) throw new Error('runAttentionSim: the plan is not the fast path');
  const name = Buffer.alloc(128);
  name.write(plan.decodeKernel);
  if (plan.prefillKernel) name.write(plan.prefillKernel, 64);
  const c = call;
  const [gridX, gridY] = decodeGrid(plan, plan.slots, c.KVH);
  const ints = Int32Array.from([c.T, c.H, c.KVH, c.D, c.NB, c.BS, c.R, c.MBR, c.window, plan.slots,
    gridY, plan.planKernel ? 1 : plan.identityList ? 2 : 0, plan.combine ? 1 : 0, plan.prefillTiles, plan.fusedCombine ? 1 : 0,
    plan.tensorCores ? attTcSharedBytes(c.D, stages) : plan.decodeSharedBytes, gridX, plan.prefillSharedBytes, plan.partRows]);
  const n = c.T * c.H * c.D;
  // the error word's details (after its code) name whichever missing key a thread reported first
  const buf = runSim(attentionSim(defines, stages, invariant), Buffer.concat([name, bytesOf(ints, Float32Array.from([c.scale, c.softcap]), c.q, c.k, c.v,
    c.rows, c.poss, c.tables)]), { scheduleDependent: [[n * 2 + 4, n * 2 + 16]] });
  return { out: new Uint16Array(buf, 0, n), err: new Int32Array(buf, n * 2, 4), countersLeft: new Int32Array(buf, n * 2 + 16, 1)[0]! };
}

const SPLITS_DRIVER = String.raw`
// argv: input file, output file. Input: i32 n, then n pairs (len, seff). Output: n pairs (splits, keys a split).
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  if (!f) return 2;
  int n = 0;
  if (fread(&n, 4, 1, f) != 1) return 2;
  std::vector<int> in((size_t)n * 2), out((size_t)n * 2);
  if (n && fread(in.data(), 4, in.size(), f) != in.size()) return 2;
  fclose(f);
  for (int i = 0; i < n; i++) {
    int chunk = 0;
    out[2 * i] = att_tc_splits(in[2 * i], in[2 * i + 1], chunk);
    out[2 * i + 1] = chunk;
  }
  FILE* o = fopen(argv[2], "wb");
  fwrite(out.data(), 4, out.size(), o);
  fclose(o);
  return 0;
}
`;

/**
 * The tensor-core decode kernel's split rule (att_tc_splits, the kernel's own source) for each
 * [keys, most splits]: [splits, keys a split]. `defines` as attentionSim's.
 */
export function tcSplitsSim(cases: readonly (readonly [number, number])[], defines: readonly string[] = []): [number, number][] {
  const head = defines.map((d) => `#define ${d.replace('=', ' ')}\n`).join('');
  const bin = buildSim('attention-splits', `${head}${ATTENTION_KERNELS}\n${SPLITS_DRIVER}`);
  const out = new Int32Array(runSim(bin, bytesOf(Int32Array.from([cases.length, ...cases.flat()]))));
  return cases.map((_, i) => [out[2 * i]!, out[2 * i + 1]!]);
}
