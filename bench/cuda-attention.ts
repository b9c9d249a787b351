// Paged attention alone on the CUDA backend (Llama-3.1-8B shapes: 32 query heads, 8 KV heads,
// head dim 128, bf16 KV in blocks of 16 scattered over the pool): decode (B rows of one token at
// context 512 / 4k / 32k) and causal prefill (1k, 8k tokens in one row).
//
// Per case: device time per call (the backend's kernel profiler: timing events around each
// launch, summed over the call's kernels), wall time per call (enqueue + run, waited by a sync)
// and wall time per replay of a CUDA graph of the call (no per-launch host cost). Decode reports
// the KV bytes read (every attended key and value row once per KV head) per second of device time
// against the H200's copy bandwidth; prefill reports attention TFLOP/s (4 * D * H per query-key
// pair, causal: T(T+1)/2 pairs) against the bf16 GEMM peak measured for the README. --generic
// runs the generic kernel as well (slow: few iterations), on a second backend created with
// attention mode 'generic' and the same inputs; --check compares fast and generic outputs (max
// |difference|). The CUDA knobs (LLMTS_CUDA_ATT_*) apply to both.
//
//   node --import tsx bench/cuda-attention.ts [--generic] [--check] [--decode 512,4096,32768] [--prefill 1024,8192]
//        [--batch 1] [--heads 32] [--kv-heads 8] [--head-dim 128] [--block 16] [--json out.json]
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

import { planAttention } from '../src/backends/cuda/attention.ts';
import { type CudaBackend, createCudaBackend } from '../src/backends/cuda/index.ts';
import type { PagedKv, StepLayout, Tensor } from '../src/contracts/backend.ts';

const README_COPY_GBPS = 4275; // H200 device-to-device copy (bench/gpu_ceilings.py, PyTorch; BENCHMARKS.md "Machines")
const README_GEMM_TFLOPS = 797; // H200 bf16 GEMM at 8192^3 (bench/gpu_ceilings.py, PyTorch; BENCHMARKS.md "Machines")

const { values } = parseArgs({
  options: {
    decode: { type: 'string', default: '512,4096,32768' },
    prefill: { type: 'string', default: '1024,8192' },
    batch: { type: 'string', default: '1' },
    heads: { type: 'string', default: '32' },
    'kv-heads': { type: 'string', default: '8' },
    'head-dim': { type: 'string', default: '128' },
    block: { type: 'string', default: '16' },
    generic: { type: 'boolean', default: false },
    check: { type: 'boolean', default: false },
    json: { type: 'string' },
  },
});
const list = (s: string) => s.split(',').filter((x) => x.trim() !== '').map(Number);
const B = Number(values.batch), H = Number(values.heads), KVH = Number(values['kv-heads']);
const D = Number(values['head-dim']), BS = Number(values.block);

const b = await createCudaBackend();
/** the generic kernel's backend (--generic, --check): the same knobs, attention mode 'generic' */
const generic = values.generic || values.check ? await createCudaBackend({ settings: { attention: { mode: 'generic' } } }) : undefined;
console.log(`# ${b.describe()}`);
console.log(`# H=${H} KVH=${KVH} D=${D} blockSize=${BS}; times per call; device = sum of the call's kernels`);

/** deterministic values in [-1, 1) without a per-element RNG call cost worth mentioning */
function fill(n: number, seed: number, scale = 1): Float32Array {
  const out = new Float32Array(n);
  let x = (seed * 2654435761) >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
    out[i] = ((x / 4294967296) * 2 - 1) * scale;
  }
  return out;
}
/** a bf16 tensor of backend `b` (upload f32, convert on the device, free the f32 copy) */
function bf16(b: CudaBackend, data: Float32Array, shape: number[]): Tensor {
  const f = b.upload(data, shape);
  const t = b.scale(f, 1);
  b.free(f);
  return t;
}

interface Setup { label: string; q: Tensor; kv: PagedKv; layout: StepLayout; T: number; R: number; MBR: number;
  NB: number; keys: number; kvBytes: number; flops: number; kind: 'decode' | 'prefill'; free(): void }

/** rows of `tokens` queries each, ending at position ctx - 1, on backend `b`; blocks shuffled over the pool */
function setup(b: CudaBackend, kind: 'decode' | 'prefill', rows: number, ctx: number, tokens: number): Setup {
  const per = Math.ceil(ctx / BS), NB = rows * per + 1, MBR = per;
  const perm = Array.from({ length: NB }, (_, i) => i);
  let s = 12345;
  for (let i = NB - 1; i > 0; i--) {
    s = (s * 1103515245 + 12345) >>> 0;
    const j = s % (i + 1);
    [perm[i], perm[j]] = [perm[j]!, perm[i]!];
  }
  const tables = new Int32Array(rows * MBR);
  for (let r = 0; r < rows; r++) for (let k = 0; k < per; k++) tables[r * MBR + k] = perm[r * per + k]!;
  const T = rows * tokens;
  const tokenRow = new Int32Array(T), tokenPos = new Int32Array(T);
  let keys = 0;
  for (let r = 0, t = 0; r < rows; r++) {
    for (let k = 0; k < tokens; k++, t++) {
      tokenRow[t] = r;
      tokenPos[t] = ctx - tokens + k;
      keys += ctx - tokens + k + 1;
    }
  }
  const kv = { k: bf16(b, fill(NB * BS * KVH * D, 1), [NB, BS, KVH, D]), v: bf16(b, fill(NB * BS * KVH * D, 2), [NB, BS, KVH, D]) };
  const q = bf16(b, fill(T * H * D, 3, 2), [T, H, D]);
  const layout: StepLayout = {
    tokenRow: b.upload(tokenRow, [T]), tokenPos: b.upload(tokenPos, [T]), slots: b.upload(new Int32Array(T).fill(-1), [T]),
    blockTables: b.upload(tables, [rows, MBR]), blockSize: BS,
    oneTokenPerRow: kind === 'decode', // as the decode graphs promise: no empty prefill kernel
  };
  return {
    label: kind === 'decode' ? `decode B=${rows} ctx ${ctx}` : `prefill ${tokens} tokens`,
    q, kv, layout, T, R: rows, MBR, NB, keys, kind,
    // decode: each row's K and V rows once per KV head; prefill: the same bytes (from L2 many times)
    kvBytes: rows * ctx * KVH * D * 2 * 2,
    flops: 4 * D * H * keys,
    free() {
      for (const t of [q, kv.k, kv.v, layout.tokenRow, layout.tokenPos, layout.slots, layout.blockTables]) b.free(t);
    },
  };
}

const params = { scale: 1 / Math.sqrt(D), window: 0, softcap: 0 };

interface Timing { deviceUs: number; wallUs: number; graphUs: number; kernels: string }
async function time(b: CudaBackend, st: Setup, iters: number): Promise<Timing> {
  const call = () => b.attention(st.q, st.kv, st.layout, params);
  const once = () => { b.beginScope(); call(); b.endScope(); };
  once();
  await b.sync();
  b.startProfile();
  for (let i = 0; i < iters; i++) once();
  const prof = (await b.stopProfile()).filter((k) => k.name.startsWith('k_att'));
  const deviceUs = (prof.reduce((a, k) => a + k.ms, 0) / iters) * 1000;
  const kernels = prof.map((k) => `${k.name.replace(/^k_/, '')} ${((k.ms / iters) * 1000).toFixed(1)}`).join(', ');
  let t0 = performance.now();
  for (let i = 0; i < iters; i++) once();
  await b.sync();
  const wallUs = ((performance.now() - t0) / iters) * 1000;
  let graphUs = NaN;
  try {
    const g = b.captureGraph(() => [call()]);
    g.replay();
    await b.sync();
    t0 = performance.now();
    for (let i = 0; i < iters; i++) g.replay();
    await b.sync();
    graphUs = ((performance.now() - t0) / iters) * 1000;
    g.dispose();
  } catch (e) {
    console.log(`#   (graph capture failed: ${(e as Error).message.split('\n')[0]})`);
  }
  return { deviceUs, wallUs, graphUs, kernels };
}

const results: Record<string, unknown>[] = [];
const cases: { kind: 'decode' | 'prefill'; n: number }[] = [
  ...list(values.decode!).map((n) => ({ kind: 'decode' as const, n })),
  ...list(values.prefill!).map((n) => ({ kind: 'prefill' as const, n })),
];
for (const { kind, n } of cases) {
  const st = kind === 'decode' ? setup(b, 'decode', B, n, 1) : setup(b, 'prefill', 1, n, n);
  const plan = planAttention({ T: st.T, H, KVH, D, numBlocks: st.NB, blockSize: BS, R: st.R, maxBlocksPerRow: st.MBR,
    window: 0, qDtype: 'bf16', poolDtype: 'bf16', oneTokenPerRow: st.layout.oneTokenPerRow }, b.info.sms, b.settings.attention);
  const iters = kind === 'decode' ? (n >= 16384 ? 100 : 300) : (n >= 4096 ? 5 : 30);
  const fast = await time(b, st, iters);
  const rate = (us: number) => kind === 'decode'
    ? `${(st.kvBytes / (us * 1e3)).toFixed(0)} GB/s (${((st.kvBytes / (us * 1e3) / README_COPY_GBPS) * 100).toFixed(0)}% of ${README_COPY_GBPS})`
    : `${(st.flops / (us * 1e6)).toFixed(1)} TFLOP/s (${((st.flops / (us * 1e6) / README_GEMM_TFLOPS) * 100).toFixed(0)}% of ${README_GEMM_TFLOPS})`;
  console.log(`${st.label}: device ${fast.deviceUs.toFixed(1)} us -> ${rate(fast.deviceUs)}; wall ${fast.wallUs.toFixed(1)} us; ` +
    `graph replay ${fast.graphUs.toFixed(1)} us`);
  const kernel = kind === 'prefill' ? plan.prefillKernel : plan.decodeKernel;
  const res = kernel ? b.kernelResources(kernel) : undefined;
  console.log(`#   kernels (us): ${fast.kernels}; slots ${plan.slots}${plan.planKernel ? ', plan kernel' : ''}` +
    (res ? `; ${kernel}: ${res.registers} registers, ${res.localBytes} B local, ${res.sharedBytes} B shared` : '') +
    (process.env.LLMTS_CUDA_ATT_DEFINES ? `; defines ${process.env.LLMTS_CUDA_ATT_DEFINES}` : ''));
  const row: Record<string, unknown> = { case: st.label, kind, n, batch: st.R, H, KVH, D, blockSize: BS, ...fast,
    kvBytes: st.kvBytes, flops: st.flops, slots: plan.slots };
  if (generic) {
    // the same inputs on the generic backend (setup's values are deterministic)
    const gst = kind === 'decode' ? setup(generic, 'decode', B, n, 1) : setup(generic, 'prefill', 1, n, n);
    try {
      if (values.generic) {
        const gi = kind === 'decode' ? 20 : 1;
        const gen = await time(generic, gst, gi);
        console.log(`#   generic kernel: device ${gen.deviceUs.toFixed(1)} us -> ${rate(gen.deviceUs)} (${(gen.deviceUs / fast.deviceUs).toFixed(1)}x the fast path)`);
        row.genericDeviceUs = gen.deviceUs;
      }
      if (values.check) {
        const slow = await generic.read(generic.attention(gst.q, gst.kv, gst.layout, params));
        const got = await b.read(b.attention(st.q, st.kv, st.layout, params));
        let md = 0;
        for (let i = 0; i < got.length; i++) md = Math.max(md, Math.abs(got[i]! - slow[i]!));
        console.log(`#   fast vs generic: max |difference| ${md.toExponential(2)}`);
        row.maxDiff = md;
      }
    } finally {
      gst.free();
      await generic.sync();
    }
  }
  results.push(row);
  st.free();
  await b.sync();
}
if (values.json) writeFileSync(values.json, JSON.stringify({ device: b.info, results }, null, 2));
await generic?.close();
await b.close();
