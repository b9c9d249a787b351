// The fit planner's decode model (decode-model.ts), its calibration (calibrate.ts), what the
// dry-run backend models of each backend (op scratch on CUDA, the fused path), more inputs it
// must refuse with a clear message, and bench/fit-cuda.ts's plumbing (--device cpu).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  tensorsFor, writeCheckpoint, tempModelDir, LLAMA_3_1_8B, GEMMA_2_9B, GEMMA_2_2B, GEMMA_2_2B_PARAMS, QWEN3_30B_A3B,
} from './checkpoints.ts';
import { FitPlanner, type PlannerSettings, realBackendCaps } from '../../src/execution/fit/plan.ts';
import { cpuMachine, gpuMachine } from '../../src/execution/fit/machines.ts';
import * as K from '../../src/execution/fit/constants.ts';
import { decodeSeconds, groupedExpertReads, termSeconds, type DecodeTerm } from '../../src/execution/fit/decode-model.ts';
import { nnls, fitDecodeConstants, meanTerms, type DecodeSample } from '../../src/execution/fit/calibrate.ts';
import { CUDA_L2_FLUSH_BYTES, DryRunBackend } from '../../src/execution/fit/dry-run-backend.ts';
import { ExactModel } from '../../src/execution/fit/allocator.ts';
import { loadModelDir } from '../../src/artifacts/model-dir.ts';
import { loadModelWeights } from '../../src/models/weights.ts';
import { runFit } from '../../src/cli/fit.ts';

const ROOT = path.resolve(import.meta.dirname, '../..');
const H200 = gpuMachine('h200');
const CPU = cpuMachine(20);

const opened = new Map<string, Promise<FitPlanner>>();
/** A planner of a sparse checkpoint of `config` for backends with `settings` (one per name and settings). */
function sparse(name: string, config: Record<string, unknown>, shards = 1, settings: PlannerSettings = {}): Promise<FitPlanner> {
  const key = `${name} ${JSON.stringify(settings)}`;
  let p = opened.get(key);
  if (!p) {
    opened.set(key, (p = FitPlanner.open(writeCheckpoint(tempModelDir(`llmts-fit-${name}-`), config, tensorsFor(config), { shards }),
      settings)));
  }
  return p;
}
const llama = () => sparse('llama8b', LLAMA_3_1_8B, 4);
const gemma = () => sparse('gemma9b', GEMMA_2_9B);
const qwen = (settings: PlannerSettings = {}) => sparse('qwen30b', QWEN3_30B_A3B, 16, settings);
// every matrix under 1 MiB (q/o 0.5, k/v 0.125, MLP 0.94 MiB), a 32 MiB lm_head
const SMALL = {
  architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: 32768, hidden_size: 512, intermediate_size: 960,
  num_hidden_layers: 24, num_attention_heads: 8, num_key_value_heads: 2, head_dim: 64, max_position_embeddings: 4096,
  rms_norm_eps: 1e-5, rope_theta: 10000, hidden_act: 'silu', tie_word_embeddings: false,
};
const small = (settings: PlannerSettings = {}) => sparse('small', SMALL, 1, settings);

const sumTerms = (terms: DecodeTerm[], constant: K.ConstantName) => terms.filter((t) => t.constant === constant).reduce((a, t) => a + t.unit, 0);

test('sparse Gemma-2-2B (the GPU bench\'s sliding-window model) has its published parameter count', async () => {
  const p = await sparse('gemma2b', GEMMA_2_2B);
  const w = await p.weights();
  assert.equal(w.params, GEMMA_2_2B_PARAMS);
  assert.deepEqual(p.kvPools(8192, 1, 1024, 16, 'bf16', 'cuda').groups.map((g) => [g.attention, g.window, g.layers]), [['sliding', 4096, 13], ['full', 0, 13]]);
});

test('CPU decode: matrices under 1 MiB run on one thread, the rest on the OpenMP team, each MoE expert matrix its own region', async () => {
  const s = await small();
  const f = (await s.decodeStep(CPU, 100, 1, 'f32')).features;
  // 24 layers x 7 matrices on one thread; the lm_head (32768 x 512 bf16, 32 MiB) on the team
  assert.equal(f.small.count, 24 * 7);
  assert.equal(f.small.bytes, 24 * 2 * (2 * 512 * 512 + 2 * 128 * 512 + 3 * 960 * 512));
  assert.equal(f.small.macs, f.small.bytes / 2);
  assert.deepEqual(f.parallel, { bytes: 32768 * 512 * 2, macs: 32768 * 512, count: 1 });
  // more than 16 rows take the packed path: everything on the team
  const f17 = (await s.decodeStep(CPU, 100, 17, 'f32')).features;
  assert.equal(f17.small.count, 0);
  assert.equal(f17.parallel.count, 24 * 7 + 1);
  // the threshold follows the CPU backend's settings (CpuSettings.gemvParallelMinBytes, $LLMTS_GEMV_PAR_MIN_BYTES)
  const everyParallel = await small({ cpu: { gemvParallelMinBytes: 0 } });
  assert.equal((await everyParallel.decodeStep(CPU, 100, 1, 'f32')).features.small.count, 0);
  // Qwen3-30B-A3B: experts of 768 x 2048 bf16 (3 MiB) are team matmuls, one region per matrix of
  // every touched expert: 8 of 128 per layer for one row, 128 x (1 - (15/16)^4) for four
  const q = await qwen();
  const q1 = (await q.decodeStep(CPU, 0, 1, 'f32')).features;
  const dense = q1.parallel.count - 48 * 8 * 3;
  assert.equal(dense, 48 * 4 + 1); // q, k, v, o per layer and the lm_head; the routers (128 x 2048, 0.5 MiB) on one thread
  assert.equal(q1.small.count, 48);
  const q4 = (await q.decodeStep(CPU, 0, 4, 'f32')).features;
  assert.ok(Math.abs(q4.parallel.count - (dense + 48 * 3 * 128 * (1 - (15 / 16) ** 4))) < 1e-9);
});

test('CUDA MoE decode: each (token, expert) pair reads its expert below 8 rows; from 8, grouped, each chosen expert once', async () => {
  const q = await qwen();
  const expert = 3 * 768 * 2048 * 2; // gate, up and down of one Qwen3-30B-A3B expert, bf16
  const at = async (rows: number) => (await q.decodeStep(H200, 0, rows, 'bf16')).features.expertPairBytes;
  assert.equal(await at(1), 48 * 8 * expert);
  assert.equal(await at(4), 48 * 4 * 8 * expert);
  // 16 rows: 128 (1 - (15/16)^16) = 82.4 distinct experts a layer, not 128 pairs
  assert.ok(Math.abs(await at(16) - 48 * 128 * (1 - (15 / 16) ** 16) * expert) < 1);
  // never grouped (CudaMoeSettings.groupedMinRows 0): per pair again
  const perPair = await qwen({ cuda: { moe: { groupedMinRows: 0 } } });
  assert.equal((await perPair.decodeStep(H200, 0, 16, 'bf16')).features.expertPairBytes, 48 * 16 * 8 * expert);
  // one pass past passRows tokens (2048 by default) reads the experts again
  assert.ok(Math.abs(groupedExpertReads(2048 + 16, 128, 8, 2048) - 128 * ((1 - (15 / 16) ** 2048) + (1 - (15 / 16) ** 16))) < 1e-9);
});

test('CPU decode: a one-thread matrix costs the longer of streaming it and its multiply-adds (batch rows cost once compute-bound)', async () => {
  const s = await small();
  await K.withConstants({ CPU_SMALL_MATMUL_EFFICIENCY: 0.5, CPU_MATMUL_GMACS_PER_CORE: 10, CPU_DECODE_EFFICIENCY: 0.8 }, async () => {
    const at = async (rows: number) => (await s.decodeStep(CPU, 100, rows, 'f32')).terms;
    const bytes = 24 * 2 * (2 * 512 * 512 + 2 * 128 * 512 + 3 * 960 * 512);
    // one row: bytes / (20 GB/s x 0.5) = 4.5 ms > bytes/2 MACs / 10 GMAC/s = 1.1 ms: memory-bound
    const one = await at(1);
    assert.equal(sumTerms(one, 'CPU_SMALL_MATMUL_EFFICIENCY'), bytes / 20e9);
    // sixteen rows: 82 ms of arithmetic on one core: compute-bound; so is the lm_head on the team
    // (16 x 16.8M multiply-adds on every core against 33.5 MB at 16 GB/s)
    const sixteen = await at(16);
    assert.equal(sumTerms(sixteen, 'CPU_SMALL_MATMUL_EFFICIENCY'), 0);
    assert.equal(sumTerms(sixteen, 'CPU_DECODE_EFFICIENCY'), 0);
    const cores = os.availableParallelism();
    assert.ok(Math.abs(sumTerms(sixteen, 'CPU_MATMUL_GMACS_PER_CORE') - ((16 * bytes) / 2 / 1e9 + (16 * 32768 * 512) / (1e9 * cores))) < 1e-12);
    assert.ok(decodeSeconds(sixteen) > decodeSeconds(one));
  });
});

test('decode attention: sliding layers read at most their window; CPU KV reads and arithmetic, CUDA KV reads, each their own constant', async () => {
  const g = await gemma();
  const d = await g.decodeStep(CPU, 8191, 2, 'f32');
  const perLayerToken = 2 * 8 * 256 * 4;
  assert.equal(d.kvBytes, 2 * 21 * perLayerToken * (4096 + 8192));
  assert.equal(sumTerms(d.terms, 'CPU_KV_READ_EFFICIENCY'), d.kvBytes / 20e9);
  assert.equal(d.attentionFlops, 2 * 21 * (4096 + 8192) * 16 * 256 * 4);
  assert.equal(sumTerms(d.terms, 'CPU_ATTENTION_GFLOPS_PER_CORE'), d.attentionFlops / (1e9 * os.availableParallelism()));
  // every layer reads over 1 MiB of KV: 42 attention regions on the team beside the matmuls'
  assert.deepEqual([d.features.attentionRegions, d.features.attentionOneThread.kvBytes], [42, 0]);
  assert.equal(sumTerms(d.terms, 'CPU_PARALLEL_MATMUL_MS'), 1e-3 * (d.features.parallel.count + 42));
  // a short context: each layer's attention (2 rows x 11 keys x 16 KiB) runs on one thread, as native/attention.c does
  const s11 = await g.decodeStep(CPU, 10, 2, 'f32');
  assert.deepEqual(s11.features.attentionOneThread, { kvBytes: s11.kvBytes, flops: s11.attentionFlops });
  assert.equal(s11.features.attentionRegions, 0);
  assert.equal(sumTerms(s11.terms, 'CPU_ATTENTION_GFLOPS_PER_CORE'), s11.attentionFlops / 1e9);
  assert.equal(sumTerms(s11.terms, 'CPU_PARALLEL_MATMUL_MS'), 1e-3 * s11.features.parallel.count);
  const c = await g.decodeStep(H200, 8191, 2, 'bf16');
  assert.deepEqual(c.terms.map((t) => t.constant).sort(), ['CUDA_ATTENTION_LAYER_MS', 'CUDA_DECODE_EFFICIENCY', 'CUDA_KERNEL_OVERHEAD_MS',
    'CUDA_KV_READ_EFFICIENCY', 'CUDA_MOE_EFFICIENCY', 'CUDA_MOE_LAYER_MS', 'CUDA_STEP_OVERHEAD_MS']);
  // the decode attention kernels' fixed time: per layer, scaled by head dim / 128 (gemma: 256)
  assert.equal(sumTerms(c.terms, 'CUDA_ATTENTION_LAYER_MS'), 1e-3 * 42 * 2);
  assert.equal(sumTerms(c.terms, 'CUDA_KV_READ_EFFICIENCY'), c.kvBytes / 4800e9);
  // gemma2's pre_post layers norm each branch's output too: more kernels per layer than a 'pre' llama layer
  assert.equal(sumTerms(c.terms, 'CUDA_KERNEL_OVERHEAD_MS'), 1e-3 * c.features.kernels);
  assert.ok(c.features.kernels > 42 * 12, String(c.features.kernels));
  assert.equal(sumTerms(c.terms, 'CUDA_MOE_EFFICIENCY'), 0);
  assert.equal(c.seconds, c.terms.reduce((a, t) => a + termSeconds(t), 0));
});

test('calibration: non-negative least squares, and a fit that recovers the constants its samples were made with', async () => {
  assert.deepEqual(nnls([[1, 0], [0, 1]], [2, -3]), [2, 0]);
  const x = nnls([[1, 1], [1, 2], [1, 3], [1, 4]], [3, 5, 7, 9]);
  assert.ok(Math.abs(x[0]! - 1) < 1e-9 && Math.abs(x[1]! - 2) < 1e-9, String(x));
  // CPU: samples over models, positions and batches that tell every constant apart
  const truth = {
    CPU_STEP_OVERHEAD_MS: 0.15, CPU_LAYER_OVERHEAD_MS: 0.04, CPU_ROW_OVERHEAD_MS: 0.07, CPU_DECODE_EFFICIENCY: 0.8,
    CPU_PARALLEL_MATMUL_MS: 0.02, CPU_KV_READ_EFFICIENCY: 0.55, CPU_ATTENTION_GFLOPS_PER_CORE: 14,
  };
  const fixed = { CPU_SMALL_MATMUL_EFFICIENCY: 0.6, CPU_MATMUL_GMACS_PER_CORE: 30 };
  const models = [await small(), await llama(), await gemma(), await qwen()];
  const samples: DecodeSample[] = [];
  await K.withConstants({ ...truth, ...fixed }, async () => {
    for (const [i, p] of models.entries()) {
      for (const [pos, rows] of [[16, 1], [4000, 1], [300, 4], [2000, 8]] as const) {
        const steps = [];
        for (let k = 0; k < 3; k++) steps.push((await p.decodeStep(CPU, pos + k, rows, 'f32')).terms);
        const terms = meanTerms(steps);
        samples.push({ name: `${i} ${pos} ${rows}`, terms, seconds: decodeSeconds(terms) });
      }
    }
  });
  await K.withConstants(fixed, async () => {
    const fit = fitDecodeConstants(samples, { fixed: ['CPU_SMALL_MATMUL_EFFICIENCY', 'CPU_MATMUL_GMACS_PER_CORE'] });
    for (const [n, v] of Object.entries(truth)) assert.ok(Math.abs(fit.values[n as K.ConstantName]! / v - 1) < 1e-6, `${n}: ${fit.values[n as K.ConstantName]} vs ${v}`);
    assert.ok(!('CPU_SMALL_MATMUL_EFFICIENCY' in fit.values));
    for (const r of fit.rows) assert.ok(Math.abs(r.error) < 1e-6 && Math.abs(r.heldOutError) < 1e-6, r.name);
  });
  // withConstants restores what it replaced, also when its function throws
  const before = K.CPU_DECODE_EFFICIENCY.value;
  await assert.rejects(K.withConstants({ CPU_DECODE_EFFICIENCY: 0.1 }, async () => { throw new Error('boom'); }), /boom/);
  assert.equal(K.CPU_DECODE_EFFICIENCY.value, before);
  await assert.rejects(K.withConstants({ NOPE: 1 } as never, async () => 0), /unknown constant NOPE/);
});

test('the CUDA dry run counts op scratch: an f32 weight converts x and accumulates in f32; reading bf16 widens it', async () => {
  const alloc = new ExactModel();
  const b = new DryRunBackend({ name: 'cuda', activationDtype: 'bf16', allocator: alloc, gemmTune: 'off' });
  b.beginScope();
  const x = b.zeros([4, 8], 'bf16');
  {
    // backends/cuda/gemm.ts: the first GEMM of a shape (<= 1024 rows) is timed with a 128 MiB L2-flush buffer live
    const a2 = new ExactModel();
    const b2 = new DryRunBackend({ name: 'cuda', activationDtype: 'bf16', allocator: a2, gemmTune: 'once' });
    b2.beginScope();
    const x2 = b2.zeros([4, 8], 'bf16'), w2 = b2.zeros([16, 8], 'bf16');
    const base2 = a2.resident;
    a2.resetPeak();
    b2.matmul(x2, w2);
    assert.equal(a2.peak - base2, 4 * 16 * 2 + CUDA_L2_FLUSH_BYTES);
    a2.resetPeak();
    b2.matmul(x2, w2); // tuned already
    assert.equal(a2.peak - a2.resident, 0);
    b2.endScope();
  }
  const base = alloc.resident;
  alloc.resetPeak();
  b.matmul(x, b.zeros([16, 8], 'bf16'));
  assert.equal(alloc.peak - base, 16 * 8 * 2 + 4 * 16 * 2); // weight + y, no scratch
  const w32 = b.zeros([16, 8], 'f32');
  const at = alloc.resident;
  alloc.resetPeak();
  const y = b.matmul(x, w32);
  assert.equal(alloc.peak - at, 4 * 16 * 2 + 4 * 8 * 4 + 4 * 16 * 4); // y + x in f32 + the f32 accumulator
  assert.equal(alloc.resident - at, 4 * 16 * 2); // the scratch went back
  alloc.resetPeak();
  const r = alloc.resident;
  await b.read(y);
  assert.equal(alloc.peak - r, 4 * 16 * 4);
  b.endScope();
});

test('the dry run takes the fused path when the backend has fused ops: packed q/k/v and gate/up, the same weight bytes', async () => {
  const cfg = { ...LLAMA_3_1_8B, num_hidden_layers: 2 };
  const dir = writeCheckpoint(tempModelDir(), cfg, tensorsFor(cfg));
  const art = loadModelDir(dir, { tokenizer: false });
  const sizes = async (fused: boolean) => {
    const alloc = new ExactModel();
    const b = new DryRunBackend({ name: 'cuda', activationDtype: 'bf16', allocator: alloc, fused });
    const w = await loadModelWeights(b, art.config, art.weights);
    return { bytes: alloc.resident, qkv: w.layers[0]!.attn.qkv?.shape, gateUp: w.layers[0]!.mlp.kind === 'dense' ? w.layers[0]!.mlp.gateUp?.shape : undefined };
  };
  const plain = await sizes(false), fused = await sizes(true);
  assert.equal(plain.qkv, undefined);
  assert.deepEqual(fused.qkv, [(32 + 16) * 128, 4096]);
  assert.deepEqual(fused.gateUp, [2 * 14336, 4096]);
  assert.equal(fused.bytes, plain.bytes);
  // the planner simulates steps on either path; the pool's cache only adds to a run's peak
  const p = await FitPlanner.open(dir);
  const steps = [{ tokens: 64, rows: 1 }, { tokens: 1, rows: 1 }, { tokens: 40, rows: 2 }];
  const real = await p.simulatePool('cuda', steps);
  const live = await p.simulatePool('cuda', steps, { cache: false });
  assert.ok(real.livePeak > 0 && real.livePeak <= real.peak && live.peak <= real.peak, JSON.stringify({ real, live }));
});

test('CUDA decode graphs: a capture keeps its arena; the plan holds one graph per batch bucket up to the batch', async () => {
  const alloc = new ExactModel();
  const b = new DryRunBackend({ name: 'cuda', activationDtype: 'bf16', allocator: alloc, graphs: true, argmax: true });
  const input = b.zeros([8, 4], 'bf16');
  const before = alloc.resident;
  const g = b.captureGraph!(() => {
    const t = b.scale(input, 2); // 64 B: a 512 B class
    const y = b.add(t, input, 1);
    b.free(t);
    return [b.argmax!(y)];
  });
  // scale and add take a 512 B block each; argmax reuses the one scale freed (reuse stays inside
  // the arena): the graph keeps two blocks
  assert.equal(alloc.resident - before, 2 * 512);
  assert.equal(g.outputs[0]!.dtype, 'i32');
  g.dispose();
  assert.equal(alloc.resident, before);

  const p = await llama();
  const caps = await realBackendCaps('cuda');
  const plan = await p.plan(H200, { ctx: 4096, batch: 16, chunk: 128 });
  if (!caps.graphs) {
    assert.equal(plan.transient.graphBytes, 0);
    return;
  }
  // buckets 1..8 and 16; tables 4096 / 16 + 1 blocks wide
  const all = await p.graphBytes([1, 2, 3, 4, 5, 6, 7, 8, 16], 257);
  assert.equal(plan.transient.graphBytes, all);
  assert.equal(await p.graphBytes([1, 1, 2], 257), await p.graphBytes([1, 2], 257));
  assert.ok((await p.graphBytes([16], 257)) > (await p.graphBytes([1], 257)));
  assert.ok((await p.graphBytes([16], 8193)) > (await p.graphBytes([16], 257))); // wider tables
  assert.ok(plan.transientBytes >= plan.transient.largestStepBytes + all);
});

test('more unreadable or inconsistent inputs: each error names the file, field or tensor, or lists what is accepted', async () => {
  const base = { ...LLAMA_3_1_8B, num_hidden_layers: 2 };
  const open = (cfg: Record<string, unknown>, edit?: (dir: string) => void, opts = {}) => {
    const dir = writeCheckpoint(tempModelDir(), cfg, tensorsFor(base), opts);
    edit?.(dir);
    return FitPlanner.open(dir);
  };
  const poke = (file: string, at: number, bytes: Buffer) => {
    const fd = fs.openSync(file, 'r+');
    fs.writeSync(fd, bytes, 0, bytes.length, at);
    fs.closeSync(fd);
  };
  const without = (k: string) => Object.fromEntries(Object.entries(base).filter(([key]) => key !== k));
  await assert.rejects(open(without('num_hidden_layers')), /config\.json is missing required field "num_hidden_layers"/);
  await assert.rejects(open(without('intermediate_size')), /config\.json is missing required field "intermediate_size"/);
  await assert.rejects(open(without('model_type')), /config\.json has no model_type; supported model types: llama, mistral, .*mixtral/);
  await assert.rejects(open(base, (d) => fs.writeFileSync(path.join(d, 'config.json'), '{"model_type": llama')), /config\.json is not valid JSON/);
  await assert.rejects(open(base, (d) => poke(path.join(d, 'model.safetensors'), 8, Buffer.from('{{{{'))), /model\.safetensors: header is not valid JSON/);
  const huge = Buffer.alloc(8);
  huge.writeBigUInt64LE(10n ** 12n);
  await assert.rejects(open(base, (d) => poke(path.join(d, 'model.safetensors'), 0, huge)), /header length 1000000000000 is invalid \(file is \d+ bytes; limit \d+\)/);
  await assert.rejects(open(base, undefined, { mutateHeader: (h: Record<string, any>) => { h['model.norm.weight'].dtype = 'Q4'; } }),
    /tensor "model\.norm\.weight" has unknown dtype "Q4"/);
  await assert.rejects(open(base, undefined, {
    mutateHeader: (h: Record<string, any>) => { h['model.layers.0.post_attention_layernorm.weight'].data_offsets = [...h['model.layers.0.input_layernorm.weight'].data_offsets]; },
  }), /tensors "model\.layers\.0\.input_layernorm\.weight" and "model\.layers\.0\.post_attention_layernorm\.weight" overlap/);
  await assert.rejects(open(base, (d) => fs.rmSync(path.join(d, 'model-00002-of-00002.safetensors')), { shards: 2 }),
    /shard model-00002-of-00002\.safetensors named by .*model\.safetensors\.index\.json \(for ".*"\) is missing/);
  await assert.rejects(open(base, (d) => {
    const f = path.join(d, 'model.safetensors.index.json');
    const j = JSON.parse(fs.readFileSync(f, 'utf8'));
    j.weight_map['model.extra.weight'] = 'model-00001-of-00002.safetensors';
    fs.writeFileSync(f, JSON.stringify(j));
  }, { shards: 2 }), /tensor "model\.extra\.weight" is listed in .*index\.json but missing from shard/);
  await assert.rejects(open(base, (d) => fs.rmSync(path.join(d, 'model.safetensors'))), /no safetensors weights in .* \(expected model\.safetensors or model\.safetensors\.index\.json\)/);
  // MoE: the checkpoint has fewer experts than config.json says; more experts per token than experts
  const moe = { ...QWEN3_30B_A3B, num_hidden_layers: 1, num_experts: 8, num_experts_per_tok: 2 };
  await assert.rejects(FitPlanner.open(writeCheckpoint(tempModelDir(), moe, tensorsFor({ ...moe, num_experts: 4 }))),
    /tensor model\.layers\.0\.mlp\.gate\.weight in .* has shape \[4,2048\], expected \[8,2048\] from config\.json/);
  await assert.rejects(FitPlanner.open(writeCheckpoint(tempModelDir(), { ...moe, num_experts_per_tok: 9 }, tensorsFor(moe))), /num_experts_per_tok 9 is more than the 8 experts/);
  // sliding window: a bad window; head_dim disagreeing with the checkpoint
  const g = { ...GEMMA_2_9B, num_hidden_layers: 2 };
  await assert.rejects(FitPlanner.open(writeCheckpoint(tempModelDir(), { ...g, sliding_window: -5 }, tensorsFor(g))), /sliding_window must be a positive integer, got -5 in .*config\.json/);
  await assert.rejects(FitPlanner.open(writeCheckpoint(tempModelDir(), { ...g, head_dim: 128 }, tensorsFor(g))),
    /tensor model\.layers\.0\.self_attn\.q_proj\.weight in .* has shape \[4096,3584\], expected \[2048,3584\] from config\.json/);
  // the CLI: --chunk and --batch must be positive integers
  const dir = writeCheckpoint(tempModelDir(), base, tensorsFor(base));
  await assert.rejects(runFit(['--model', dir, '--ctx', '8', '--chunk', '0']), /--chunk must be >= 1/);
  await assert.rejects(runFit(['--model', dir, '--ctx', '8', '--batch', '1.5']), /--batch must be an integer/);
});

test('bench/fit-cuda.ts runs end to end on the CPU backend (--device cpu) and writes its tables and constants', () => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), 'llmts-fit-cuda-'));
  const r = spawnSync(process.execPath, ['--import', 'tsx', 'bench/fit-cuda.ts', '--device', 'cpu', '--out', out, '--only', 'demo,gemma2fx,moefx', '--budget-s', '120'],
    { cwd: ROOT, encoding: 'utf8', timeout: 120_000 });
  assert.equal(r.status, 0, `${r.stdout}\n${r.stderr}`);
  const j = JSON.parse(fs.readFileSync(path.join(out, 'fit-cuda.json'), 'utf8'));
  assert.equal(j.finished, true);
  assert.deepEqual(j.results.map((x: { status: string }) => x.status), ['ok', 'ok', 'ok']);
  for (const x of j.results) {
    assert.equal(x.predicted.weights, x.measured.weights, x.case.name); // the planner's weights are the pool's
    // and so are the KV pools (the CPU pool counts a block at its size class: up to a quarter more)
    assert.ok(x.predicted.kv <= x.measured.kv && x.measured.kv <= 1.25 * x.predicted.kv, x.case.name);
    assert.ok(x.child.decodeTps > 0 && x.predicted.decodeTps > 0 && x.child.steps.length > 0);
  }
  assert.match(fs.readFileSync(path.join(out, 'summary.md'), 'utf8'), /## Memory[\s\S]*## Decode[\s\S]*## Constants measured in this run/);
  assert.match(fs.readFileSync(path.join(out, 'constants.ts.txt'), 'utf8'), /export const CPU_STEP_OVERHEAD_MS: Constant = \{\n {2}value: [\d.e-]+,\n {2}measured: true,/);
});
