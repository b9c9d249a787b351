// The fit planner (src/execution/fit/) on sparse safetensors checkpoints at real sizes (real
// headers, no data), its agreement with the engine and the CPU backend it models, and
// `llmts fit` end to end.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { ATT_COUNTERS } from '../../src/backends/cuda/attention.ts';
import {
  tensorsFor, writeCheckpoint, tempModelDir, numel, bytesOf,
  LLAMA_3_1_8B, LLAMA_3_1_8B_PARAMS, GEMMA_2_9B, GEMMA_2_9B_PARAMS, QWEN3_30B_A3B, QWEN3_30B_A3B_PARAMS,
} from './checkpoints.ts';
import { FitPlanner } from '../../src/execution/fit/plan.ts';
import { gpuMachine, customMachine, cpuMachine, GPU_NAMES, MachineError } from '../../src/execution/fit/machines.ts';
import { cudaSizeClass, PoolModel, CPU_POOL } from '../../src/execution/fit/allocator.ts';
import { CUDA_L2_FLUSH_BYTES } from '../../src/execution/fit/dry-run-backend.ts';
import { planServeKv, KvBudgetError } from '../../src/execution/fit/serve-plan.ts';
import { runFit } from '../../src/cli/fit.ts';
import * as K from '../../src/execution/fit/constants.ts';
import { UsageError } from '../../src/cli/errors.ts';
import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { loadModel } from '../../src/execution/load-model.ts';
import { Engine } from '../../src/execution/engine.ts';
import { recordStepShapes } from '../../src/execution/fit/step-recorder.ts';

const ROOT = path.resolve(import.meta.dirname, '../..');
const BIN = path.join(ROOT, 'bin/llmts');

// one sparse directory per real model, shared by the tests below
const dirs = new Map<string, string>();
function sparse(name: 'llama' | 'gemma' | 'qwen'): string {
  let dir = dirs.get(name);
  if (!dir) {
    dir = tempModelDir(`llmts-fit-${name}-`);
    if (name === 'llama') writeCheckpoint(dir, LLAMA_3_1_8B, tensorsFor(LLAMA_3_1_8B), { shards: 4 });
    if (name === 'gemma') writeCheckpoint(dir, GEMMA_2_9B, tensorsFor(GEMMA_2_9B));
    if (name === 'qwen') writeCheckpoint(dir, QWEN3_30B_A3B, tensorsFor(QWEN3_30B_A3B), { shards: 16 });
    dirs.set(name, dir);
  }
  return dir;
}
const planners = new Map<string, Promise<FitPlanner>>();
function planner(name: 'llama' | 'gemma' | 'qwen'): Promise<FitPlanner> {
  let p = planners.get(name);
  if (!p) planners.set(name, (p = FitPlanner.open(sparse(name))));
  return p;
}
const H200 = gpuMachine('h200');
const CPU = cpuMachine(20); // a fixed bandwidth: no measurement in tests

test('sparse checkpoints take no disk space', () => {
  const dir = sparse('llama');
  let apparent = 0, allocated = 0;
  for (const f of fs.readdirSync(dir)) {
    const st = fs.statSync(path.join(dir, f));
    apparent += st.size;
    allocated += st.blocks * 512;
  }
  assert.ok(apparent > 16e9, `apparent size ${apparent}`);
  assert.ok(allocated < 64 * 2 ** 20, `allocated ${allocated}`);
});

test('weights: exact parameter counts of Llama-3.1-8B (sharded), Gemma-2-9B (tied), Qwen3-30B-A3B', async () => {
  for (const [name, params] of [['llama', LLAMA_3_1_8B_PARAMS], ['gemma', GEMMA_2_9B_PARAMS], ['qwen', QWEN3_30B_A3B_PARAMS]] as const) {
    const w = await (await planner(name)).weights();
    assert.equal(w.params, params, name);
    assert.equal(w.checkpointBytes, 2 * params, name);
    assert.deepEqual(w.checkpointBytesByDtype, { BF16: 2 * params }, name);
    assert.deepEqual(w.unusedTensors, [], name);
  }
  // norm vectors are kept in f32: 32 layers x 2 norms + the final norm, 4096 each, 2 more bytes each
  const llama = await (await planner('llama')).weights();
  const norms = (32 * 2 + 1) * 4096;
  assert.equal(llama.residentBytes, 2 * LLAMA_3_1_8B_PARAMS + 2 * norms);
  assert.deepEqual(llama.residentBytesByDtype, { bf16: 2 * (LLAMA_3_1_8B_PARAMS - norms), f32: 4 * norms });
  // gemma2 has four norms per layer
  const gemma = await (await planner('gemma')).weights();
  assert.equal(gemma.residentBytes, 2 * GEMMA_2_9B_PARAMS + 2 * (42 * 4 + 1) * 3584);
});

test('weights: a tied lm_head copy in the checkpoint is not counted twice', async () => {
  const cfg = { ...GEMMA_2_9B, num_hidden_layers: 2 };
  const tensors = tensorsFor(cfg);
  const dir = writeCheckpoint(tempModelDir(), cfg, [...tensors, { name: 'lm_head.weight', dtype: 'BF16', shape: [256000, 3584] }]);
  const w = await (await FitPlanner.open(dir)).weights();
  assert.equal(w.params, tensors.reduce((a, t) => a + numel(t.shape), 0));
  assert.deepEqual(w.unusedTensors, ['lm_head.weight']);
  assert.equal(w.unusedBytes, 256000 * 3584 * 2);
});

test('KV bytes per token by hand; full layers grow with the context', async () => {
  const p = await planner('llama');
  // 32 layers x (K + V) x 8 kv heads x 128 dims x 2 bytes (bf16)
  assert.equal(p.kvBytesPerToken('bf16'), 32 * 2 * 8 * 128 * 2);
  assert.equal(p.kvBytesPerToken('f32'), 32 * 2 * 8 * 128 * 4);
  const plan = await p.plan(H200, { ctx: 8192 });
  assert.equal(plan.kvBytesPerToken, 131072);
  assert.equal(plan.kvDtype, 'bf16');
  assert.equal(plan.kvBytes, 8192 * 131072); // 16 MiB pools: exact size classes
  const f32 = await p.plan(H200, { ctx: 8192, kvDtype: 'f32' });
  assert.equal(f32.kvBytes, 2 * plan.kvBytes);
  // whole blocks of 16 tokens; batch multiplies
  const odd = await p.plan(CPU, { ctx: 1000, batch: 3, kvDtype: 'bf16' });
  assert.equal(odd.kvTokens, 3 * 1008);
  assert.equal(odd.kvBytes, 3 * 1008 * 131072);
  // int8 / fp8 (CPU): a byte an element and each token's head row its f32 scale
  for (const dt of ['int8', 'fp8'] as const) {
    assert.equal(p.kvBytesPerToken(dt), 32 * 2 * 8 * (128 + 4));
    const q = await p.plan(CPU, { ctx: 1000, batch: 3, kvDtype: dt });
    assert.equal(q.kvBytes, 3 * 1008 * 32 * 2 * 8 * 132, dt);
  }
});

test('sliding layers saturate at their window (Gemma-2-9B: 21 sliding + 21 full layers)', async () => {
  const p = await planner('gemma');
  const perLayerToken = 2 * 8 * 256 * 2;
  assert.equal(p.kvBytesPerToken('bf16'), 42 * perLayerToken);
  const at = (ctx: number) => p.kvPools(ctx, 1, 512, 16, 'bf16', 'cpu');
  const small = at(2048);
  assert.deepEqual(small.groups.map((g) => [g.attention, g.window, g.layers, g.tokensPerSequence]), [['sliding', 4096, 21, 2048], ['full', 0, 21, 2048]]);
  // a chunk starting at s reads from s - 4095: (4095 + 512) / 16 blocks, + 1 for straddling
  const blocks = Math.ceil((4096 - 1 + 512) / 16) + 1;
  for (const ctx of [blocks * 16, 6000, 8192]) {
    const k = at(ctx);
    assert.equal(k.groups[0]!.poolBlocks, blocks, `ctx ${ctx}`);
    assert.equal(k.groups[0]!.bytes, 21 * 2 * blocks * 16 * 8 * 256 * 2);
    assert.equal(k.groups[1]!.bytes, 21 * Math.ceil(ctx / 16) * 16 * perLayerToken);
  }
  assert.equal(at(6000).groups[0]!.bytes, at(8192).groups[0]!.bytes);
  assert.ok(at(8192).groups[1]!.bytes > at(6000).groups[1]!.bytes);
  // decode reads at most the window of a sliding layer
  const d = await p.decodeStep(H200, 8191, 1, 'bf16');
  assert.equal(d.kvBytes, 21 * perLayerToken * 4096 + 21 * perLayerToken * 8192);
});

test('MoE decode reads the active experts only (Qwen3-30B-A3B: 8 of 128)', async () => {
  const p = await planner('qwen');
  const w = await p.weights();
  const expertParams = 48 * 128 * 3 * 768 * 2048;
  assert.equal(w.expertBytes, 2 * expertParams);
  const d = await p.decodeStep(H200, 0, 1, 'bf16');
  // everything but the experts and the embedding table, 1/16 of the experts, one embedding row
  const embed = 151936 * 2048 * 2;
  assert.equal(d.weightBytes, w.residentBytes - w.expertBytes - embed + w.expertBytes / 16 + 2048 * 2);
  // ~3.3B parameters read per token, as Qwen states ("3.3B activated")
  const activeParams = d.weightBytes / 2 + 151936 * 2048 - 2048;
  assert.ok(Math.abs(activeParams / 3.35e9 - 1) < 0.01, String(activeParams));
  // CUDA: k_moe_hidden / k_moe_down read an expert's rows for every (token, expert) pair, so a
  // batch of 4 reads 4 x 8 experts' rows (no sharing), at the MoE efficiency
  const d4 = await p.decodeStep(H200, 0, 4, 'bf16');
  assert.ok(Math.abs(d4.weightBytes - (w.residentBytes - embed - w.expertBytes + (4 * w.expertBytes) / 16 + 4 * 2048 * 2)) < 1);
  assert.ok(Math.abs(d4.features.expertPairBytes - (4 * w.expertBytes) / 16) < 1);
  // predicted tok/s: weights at bandwidth x efficiency, KV at bandwidth x KV efficiency, plus the step overheads
  const plan = await p.plan(H200, { ctx: 1 });
  const f = d.features;
  const seconds = f.weightBytes / (4800e9 * K.CUDA_DECODE_EFFICIENCY.value) + d.kvBytes / (4800e9 * K.CUDA_KV_READ_EFFICIENCY.value) +
    f.expertPairBytes / (4800e9 * K.CUDA_MOE_EFFICIENCY.value) +
    (K.CUDA_STEP_OVERHEAD_MS.value + f.kernels * K.CUDA_KERNEL_OVERHEAD_MS.value + 48 * K.CUDA_MOE_LAYER_MS.value +
      48 * K.CUDA_ATTENTION_LAYER_MS.value) / 1000; // Qwen3-30B-A3B: 48 layers, head dim 128
  assert.ok(f.kernels > 48 * 8, `kernels per decode step: ${f.kernels}`);
  assert.ok(Math.abs(plan.predictedDecodeTps * seconds - 1) < 1e-9);
  assert.equal(plan.decode.bytesPerStep, d.weightBytes + d.kvBytes);
});

test('total is monotone in the context and maxSafeContext is the bisection boundary', async () => {
  for (const [name, machine, batch] of [
    ['llama', customMachine('gpu', 40 * 2 ** 30, 1000), 4],
    ['gemma', customMachine('gpu', 30 * 2 ** 30, 1000), 8],
    ['llama', customMachine('cpu', 48 * 2 ** 30, 20), 1],
  ] as const) {
    const p = await planner(name);
    const chunk = 128; // a small token budget keeps the step simulation short
    const r = p.resolve(machine, { ctx: 1, batch, chunk });
    let prev = 0;
    for (const ctx of [1, 2, 15, 16, 17, 100, 127, 128, 129, 1000, 4096, 4097, 5000, 8192, 20000, 65536, 131072]) {
      if (ctx > p.contextLength) break;
      const total = await p.totalBytes(machine, { ctx, batch, chunk });
      assert.ok(total >= prev, `${name}: total(${ctx}) = ${total} < ${prev}`);
      prev = total;
    }
    const plan = await p.plan(machine, { ctx: 1024, batch, chunk });
    const m = plan.maxSafeContext;
    assert.ok(m > 0 && m < p.contextLength, `${name}: maxSafeContext ${m}`);
    assert.equal(plan.maxSafeContextLimitedBy, 'memory');
    assert.ok((await p.totalBytes(machine, { ctx: m, batch, chunk })) <= plan.usableBytes);
    assert.ok((await p.totalBytes(machine, { ctx: m + 1, batch, chunk })) > plan.usableBytes);
    assert.equal(m, await p.maxContext(machine, r, plan.usableBytes, p.contextLength));
  }
});

test('plan fields: fits, usable memory, reserve and what is not yet measured', async () => {
  const p = await planner('llama');
  const plan = await p.plan(H200, { ctx: 8192 });
  assert.equal(plan.usableBytes, Math.floor(141 * 2 ** 30 * 0.9));
  assert.equal(plan.totalBytes, plan.weightsBytes + plan.kvBytes + plan.transientBytes + plan.reserveBytes);
  assert.equal(plan.fits, true);
  assert.equal(plan.maxSafeContext, 131072);
  assert.equal(plan.maxSafeContextLimitedBy, 'model');
  // unmeasured lists exactly the CUDA constants not measured yet; the reserve says which it used
  assert.deepEqual(plan.unmeasured, Object.entries(K.CUDA_CONSTANTS).filter(([, c]) => !c.measured).map(([n]) => n));
  assert.deepEqual(plan.reserve.map((r) => r.measured), [K.CUDA_CONTEXT_BYTES, K.CUDA_CUBLASLT_WORKSPACE_BYTES, K.CUDA_RUNTIME_GROWTH_BYTES].map((c) => c.measured));
  assert.equal(plan.reserveBytes, K.CUDA_CONTEXT_BYTES.value + K.CUDA_CUBLASLT_WORKSPACE_BYTES.value + K.CUDA_RUNTIME_GROWTH_BYTES.value);
  // the pool at creation: cuBLASLt's 32 MiB workspace, the 16-byte error word (a 256-byte block)
  // and the attention split counters; a change to any of them must change the constant
  assert.equal(K.CUDA_CUBLASLT_WORKSPACE_BYTES.value, 32 * 2 ** 20 + 256 + ATT_COUNTERS * 4);
  const cpuPlan = await p.plan(CPU, { ctx: 64, chunk: 64 });
  assert.deepEqual(cpuPlan.unmeasured, Object.entries(K.CPU_CONSTANTS).filter(([, c]) => !c.measured).map(([n]) => n));
  // the 8B model in bf16 does not fit a 16 GB card at all
  const t4 = await p.plan(gpuMachine('t4'), { ctx: 8192 });
  assert.equal(t4.fits, false);
  assert.equal(t4.maxSafeContext, 0);
  const half = await p.plan(H200, { ctx: 8192, utilization: 0.5 });
  assert.equal(half.usableBytes, Math.floor(141 * 2 ** 30 * 0.5));
  // the transient grows with the step, not with the context (beyond the block tables): steps of up
  // to 64 tokens may time a GEMM (the tuner's 128 MiB L2-flush buffer), a 4k-token step outgrows that
  const t1 = await p.plan(H200, { ctx: 8192, chunk: 64 });
  const t4k = await p.plan(H200, { ctx: 8192, chunk: 4096 });
  assert.ok(t1.transientBytes - CUDA_L2_FLUSH_BYTES < (t4k.transientBytes - CUDA_L2_FLUSH_BYTES) / 4,
    `chunk 64: ${t1.transientBytes} B, chunk 4096: ${t4k.transientBytes} B`);
  assert.ok(t1.transientBytes >= CUDA_L2_FLUSH_BYTES && plan.transientBytes >= t1.transientBytes);
});

test('machines: GPU table, names, custom devices', () => {
  assert.ok(GPU_NAMES.length >= 20);
  for (const n of ['h200', 'h100', 'a100-80gb', 'l4', 'rtx-4090', 'rtx-3090', 'rtx-5090']) assert.ok(GPU_NAMES.includes(n), n);
  assert.equal(gpuMachine('NVIDIA H200').name, 'h200');
  assert.equal(gpuMachine('RTX 4090').name, 'rtx-4090');
  assert.equal(gpuMachine('rtx_4090').memoryBytes, 24 * 2 ** 30);
  assert.throws(() => gpuMachine('h300'), (e: Error) => e instanceof MachineError && /unknown GPU "h300"; accepted: b200, h200, /.test(e.message) && e.message.includes('rtx-3060'));
  assert.throws(() => customMachine('gpu', 0, 100), /memory must be a positive size/);
  assert.throws(() => customMachine('gpu', 2 ** 30, -1), /bandwidth must be a positive number of GB\/s/);
  const cpu = cpuMachine(12.5);
  assert.equal(cpu.kind, 'cpu');
  assert.equal(cpu.bandwidthGBps, 12.5);
});

test('unreadable or inconsistent inputs: clear errors naming the field, tensor or what is accepted', async () => {
  const base = { ...LLAMA_3_1_8B, num_hidden_layers: 2 };
  const open = (cfg: Record<string, unknown>, tensors = tensorsFor(base), opts = {}) => FitPlanner.open(writeCheckpoint(tempModelDir(), cfg, tensors, opts));
  const without = (k: string) => Object.fromEntries(Object.entries(base).filter(([key]) => key !== k));
  await assert.rejects(open(without('hidden_size')), /config\.json is missing required field "hidden_size"/);
  await assert.rejects(open(without('vocab_size')), /missing required field "vocab_size"/);
  await assert.rejects(open({ ...base, model_type: 'gpt2' }), /model_type "gpt2"; supported model types: llama, mistral, qwen2/);
  await assert.rejects(open({ ...base, num_attention_heads: 'x' }), /"num_attention_heads" must be a positive integer, got "x"/);
  // a tensor whose shape disagrees with config.json
  const bad = tensorsFor(base).map((t) => (t.name === 'model.layers.1.self_attn.k_proj.weight' ? { ...t, shape: [2048, 4096] } : t));
  await assert.rejects(open(base, bad), /tensor model\.layers\.1\.self_attn\.k_proj\.weight in .* has shape \[2048,4096\], expected \[1024,4096\] from config\.json/);
  // config.json says 3 layers, the checkpoint has 2
  await assert.rejects(open({ ...base, num_hidden_layers: 3 }), /missing tensor model\.layers\.2\.self_attn\.q_proj\.weight/);
  // a header whose data_offsets disagree with its shape, and a file shorter than its header says
  await assert.rejects(open(base, tensorsFor(base), { mutateHeader: (h: Record<string, any>) => { h['model.norm.weight'].shape = [4097]; } }),
    /tensor "model\.norm\.weight" data_offsets .* span 8192 bytes, but shape \[4097\] of BF16 needs 8194/);
  const dir = writeCheckpoint(tempModelDir(), base, tensorsFor(base));
  fs.truncateSync(path.join(dir, 'model.safetensors'), 1_000_000);
  await assert.rejects(FitPlanner.open(dir), /is truncated: tensor ".*" needs bytes up to \d+, but the file has 1000000/);
  await assert.rejects(FitPlanner.open(path.join(dir, 'nope')), /does not exist/);
  const p = await FitPlanner.open(writeCheckpoint(tempModelDir(), base, tensorsFor(base)));
  await assert.rejects(p.plan(H200, { ctx: 0 }), /ctx must be a positive integer, got 0/);
  await assert.rejects(p.plan(H200, { ctx: 10, kvDtype: 'q4' as 'f32' }), /KV dtype must be one of f32, bf16, f16, int8, fp8, got "q4"/);
  await assert.rejects(p.plan(H200, { ctx: 10, kvDtype: 'int8' }), /KV dtype int8 is kept by the CPU backend only/);
  await assert.rejects(p.plan(H200, { ctx: 10, utilization: 1.5 }), /utilization must be in \(0, 1\], got 1\.5/);
});

test('llmts fit flags: bad values are refused with what is accepted', async () => {
  const dir = sparse('llama');
  for (const [args, why] of [
    [['--ctx', '4096'], /--model is required/],
    [['--model', dir], /--ctx is required/],
    [['--model', dir, '--ctx', '0'], /--ctx must be >= 1/],
    [['--model', dir, '--ctx', 'many'], /--ctx must be a number/],
    [['--model', dir, '--ctx', '8', '--gpu', 'h300'], /--gpu: unknown GPU "h300"; accepted: b200, h200, .*rtx-3060 \(or --memory SIZE --bandwidth GBps\)/],
    [['--model', dir, '--ctx', '8', '--memory', 'lots', '--bandwidth', '100'], /--memory must be a size like 512M or 8G, got "lots"/],
    [['--model', dir, '--ctx', '8', '--memory', '0G', '--bandwidth', '100'], /--memory must be more than 0 bytes/],
    [['--model', dir, '--ctx', '8', '--memory', '80G', '--bandwidth', '0'], /--bandwidth must be a positive number of GB\/s/],
    [['--model', dir, '--ctx', '8', '--memory', '80G'], /a GPU needs --gpu NAME \(accepted: b200, .*\) or both --memory SIZE and --bandwidth GBps/],
    [['--model', dir, '--ctx', '8', '--device', 'cuda'], /a GPU needs --gpu NAME/],
    [['--model', dir, '--ctx', '8', '--device', 'tpu'], /--device must be cpu or cuda, got "tpu"/],
    [['--model', dir, '--ctx', '8', '--gpu', 'h100', '--memory', '80G', '--bandwidth', '3000'], /either --gpu NAME or --memory SIZE --bandwidth GBps, not both/],
    [['--model', dir, '--ctx', '8', '--skus', '--gpu', 'h100'], /--skus plans for every machine/],
    [['--model', dir, '--ctx', '8', '--kv-dtype', 'q4'], /--kv-dtype must be one of f32, bf16, f16, int8, fp8, got "q4"/],
    [['--model', dir, '--ctx', '8', '--batch', '0'], /--batch must be >= 1/],
    [['--model', dir, '--ctx', '8', '--gpu-memory-utilization', '1.2', '--gpu', 'h100'], /--gpu-memory-utilization must be in \(0, 1\]/],
    [['--model', dir, '--ctx', '8', '--bogus'], /Unknown option '--bogus'/],
  ] as const) {
    await assert.rejects(runFit([...args]), (e: Error) => e instanceof UsageError && why.test(e.message), `${args.join(' ')}: expected ${why}`);
  }
});

/** runFit in-process, returning what it printed on stdout */
async function fitOutput(args: string[]): Promise<string> {
  let out = '';
  const write = process.stdout.write;
  process.stdout.write = ((chunk: string) => ((out += chunk), true)) as typeof process.stdout.write;
  try {
    await runFit(args);
  } finally {
    process.stdout.write = write;
  }
  return out;
}

test('llmts fit: --json, --skus, the text table; through bin/llmts too', async () => {
  const dir = sparse('qwen');
  const r = spawnSync(BIN, ['fit', '--model', dir, '--ctx', '32768', '--gpu', 'H100', '--json'], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  const plan = JSON.parse(r.stdout);
  for (const k of ['weightsBytes', 'kvBytesPerToken', 'kvBytes', 'transientBytes', 'totalBytes', 'usableBytes', 'fits', 'maxSafeContext', 'predictedDecodeTps', 'machine']) {
    assert.ok(k in plan, `missing ${k}`);
  }
  assert.equal(plan.machine.name, 'h100');
  assert.equal(plan.weights.params, QWEN3_30B_A3B_PARAMS);
  assert.equal(plan.kvBytesPerToken, 48 * 2 * 4 * 128 * 2);
  assert.equal(plan.fits, true);
  const bad = spawnSync(BIN, ['fit', '--model', dir, '--ctx', '4096', '--gpu', 'h300'], { encoding: 'utf8' });
  assert.equal(bad.status, 2);
  assert.equal(bad.stdout, '');
  assert.match(bad.stderr, /^llmts: --gpu: unknown GPU "h300"; accepted: /);

  const all = JSON.parse(await fitOutput(['--model', dir, '--ctx', '4096', '--skus', '--bandwidth', '20', '--json']));
  assert.deepEqual(all.skus.map((p: { machine: { name: string } }) => p.machine.name), [...GPU_NAMES, 'cpu']);
  assert.ok(all.skus.find((p: { machine: { name: string } }) => p.machine.name === 'h200').fits);
  assert.ok(!all.skus.find((p: { machine: { name: string } }) => p.machine.name === 'rtx-4090').fits);
  const table = await fitOutput(['--model', dir, '--ctx', '4096', '--skus', '--bandwidth', '20']);
  assert.match(table, /^machine\s+memory\s+GB\/s\s+usable\s+total\s+fits\s+max ctx\s+decode tok\/s$/m);
  assert.match(table, /^h200\s+141\.00 GiB\s+4800\s/m);
  const text = await fitOutput(['--model', dir, '--ctx', '4096', '--memory', '64G', '--bandwidth', '1000']);
  assert.match(text, /^ {2}weights\s+56\.\d\d GiB\s+30\.53B params; checkpoint BF16 56\.\d\d GiB$/m);
  assert.match(text, /^ {2}fits\s+NO\s+short by/m);
  const unmeasured = K.unmeasuredConstants('cuda');
  if (unmeasured.length) assert.match(text, new RegExp(`not yet measured \\(provisional values\\): ${unmeasured.join(', ')}`));
  else assert.doesNotMatch(text, /not yet measured/);
});

test('the KV pools the planner counts are the pools the engine allocates', async () => {
  const backend = await createCpuBackend();
  try {
    for (const [fixture, ctx, batch, chunk] of [['gemma2', 200, 3, 64], ['llama', 256, 2, 512], ['qwen3_moe', 100, 1, 32]] as const) {
      const dir = path.join(ROOT, 'test/fixtures', fixture);
      const loaded = await loadModel(backend, dir, { maxModelLen: ctx });
      const p = await FitPlanner.open(dir);
      const kv = p.kvPools(ctx, batch, chunk, 16, 'f32', 'cpu');
      const engine = new Engine(loaded.model, loaded, { maxBatch: batch, tokenBudget: chunk, maxModelLen: ctx, kvTokens: kv.kvTokens });
      assert.deepEqual(engine.kv.groups.map((g) => [g.spec.window, g.pool.numBlocks]), kv.groups.map((g) => [g.window, g.poolBlocks]), fixture);
      await engine.close();
      loaded.model.dispose();
    }
  } finally {
    await backend.close();
  }
});

test('the dry-run graph allocates what the CPU backend allocates, step for step', async () => {
  for (const fixture of ['qwen3', 'gemma2', 'qwen3_moe', 'phi3_longrope']) {
    const dir = path.join(ROOT, 'test/fixtures', fixture);
    const backend = await createCpuBackend();
    try {
      const loaded = await loadModel(backend, dir, { maxModelLen: 120 });
      // deviceSampling off: sampled rows read their logits back (the step the planner replays)
      const engine = new Engine(loaded.model, loaded, {
        maxBatch: 3, tokenBudget: 40, maxModelLen: 120, kvTokens: 3 * 128, deviceSampling: false,
      });
      const steps = recordStepShapes(loaded.model, 16);
      const idleBefore = backend.memoryStats().idleBytes;
      await Promise.all([90, 37, 5].map((n, i) => engine.complete({
        // sampled rows read their logits back, the step the planner replays (greedy rows would take
        // the device argmax, and pipelined ones gather their ids: a few i32 [rows] tensors it leaves out)
        promptIds: Array.from({ length: n }, (_, k) => (k * 31 + i) % 200 + 1), maxTokens: 12, sampling: { temperature: 0.7, seed: i }, ignoreEos: true,
      })));
      const idle = backend.memoryStats().idleBytes - idleBefore;
      const sim = await (await FitPlanner.open(dir)).simulatePool('cpu', steps);
      assert.ok(steps.some((s) => s.rows > 1) && steps.some((s) => s.tokens > 1), `${fixture}: mixed steps`);
      // every intermediate of every step is back in the pool's idle lists: same classes, same counts
      assert.equal(sim.idleClassBytes, idle, `${fixture}: ${steps.length} steps`);
      await engine.close();
    } finally {
      await backend.close();
    }
  }
});

test('pool model: class rounding, caching, and the worst case over step orders', () => {
  const pool = new PoolModel(CPU_POOL);
  const a = pool.alloc(5000, false);
  assert.equal(a.bytes, 5120); // 4 classes per power of two above 4 KiB
  assert.equal(pool.resident, 5000); // CPU: only written bytes are resident
  pool.release(a);
  assert.equal(pool.idleClassBytes, 5120);
  const b = pool.alloc(4500, false); // same class: reused, nothing new
  assert.equal(b, a);
  assert.equal(pool.resident, 5000);
  pool.release(b);
  pool.resetPeak();
  // two steps of different shapes, each alone 10 KiB: together a pool may hold both
  const s1 = [pool.alloc(10_000, false)];
  s1.forEach((x) => pool.release(x));
  const s2 = [pool.alloc(6000, false), pool.alloc(4000, false)];
  s2.forEach((x) => pool.release(x));
  // classes 10240, 6144 and 4032 (4000 does not fit the idle 5120 block's class): all four blocks
  assert.equal(pool.worstCase(), 10_000 + 6000 + 4000 + 5000);
  // exact blocks are never cached
  const big = pool.alloc(300 * 2 ** 20, false);
  pool.release(big);
  assert.equal(pool.resident, 10_000 + 6000 + 4000 + 5000);
});

test('the CUDA size classes match the CUDA backend', async () => {
  const { sizeClass } = await import('../../src/backends/cuda/device-pool.ts');
  for (const b of [0, 1, 511, 512, 513, 65536, 65537, 100_000, 2 ** 20 + 1, 3e8, 5e8]) assert.equal(cudaSizeClass(b), sizeClass(b), String(b));
});

test('the server sizes its KV pool from the plan', async () => {
  const p = await planner('gemma');
  const base = { backend: 'cuda' as const, kvDtype: 'bf16' as const, maxBatch: 4, maxModelLen: 8192, memory: { totalBytes: 80 * 2 ** 30, freeBytes: 60 * 2 ** 30 } };
  // room for every sequence: full pools 4 x 8192 tokens, sliding pools 4 x their window span
  const roomy = await planServeKv(p, base);
  assert.equal(roomy.kvTokens, 4 * 8192);
  assert.deepEqual(roomy.groups.map((g) => g.poolBlocks), [4 * 289, 4 * 512]);
  assert.match(roomy.why, /room for 4 sequences of 8192 tokens/);
  // a budget: the largest whole-block pool whose bytes fit
  const budget = await planServeKv(p, { ...base, kvBudgetBytes: 2 * 2 ** 30 });
  assert.ok(budget.kvBytes <= 2 * 2 ** 30);
  assert.equal(budget.kvTokens % 16, 0);
  const more = p.kvPools(8192, 4, 512, 16, 'bf16', 'cuda', budget.kvTokens + 16);
  assert.ok(more.bytes > 2 * 2 ** 30);
  await assert.rejects(planServeKv(p, { ...base, kvBudgetBytes: 1000 }), (e: Error) => e instanceof KvBudgetError && /holds no token of KV cache \(one token needs 344064 bytes\)/.test(e.message));
  await assert.rejects(planServeKv(p, { ...base, kvBudgetBytes: 400_000 }), /holds less than one KV block \(16 tokens need \d+ bytes\)/);
  // a small GPU: what the usable memory leaves after weights, transient and reserve — sized so
  // that only about half of the roomy KV pool fits
  const fraction = roomy.usableBytes! / (80 * 2 ** 30); // usable = utilization x total here
  const smallTotal = Math.round((roomy.weightsBytes + roomy.transientBytes + roomy.reserveBytes + roomy.kvBytes / 2) / fraction);
  const tight = await planServeKv(p, { ...base, memory: { totalBytes: smallTotal, freeBytes: smallTotal } });
  assert.match(tight.why, /limited by usable memory/);
  assert.ok(tight.kvTokens < 4 * 8192 && tight.kvTokens > 0);
  assert.ok(tight.weightsBytes + tight.kvBytes + tight.transientBytes + tight.reserveBytes <= tight.usableBytes!);
  await assert.rejects(planServeKv(p, { ...base, memory: { totalBytes: 16 * 2 ** 30, freeBytes: 16 * 2 ** 30 } }), /not enough memory for any KV cache: usable/);
  await assert.rejects(planServeKv(p, { ...base, backend: 'cpu', kvDtype: 'f32', utilization: 0.5 }), /applies to CUDA devices/);
});

test('synthetic checkpoints have the published shapes', () => {
  // sanity of the test data itself: tensor bytes add up to 2 bytes per published parameter
  for (const [cfg, params] of [[LLAMA_3_1_8B, LLAMA_3_1_8B_PARAMS], [GEMMA_2_9B, GEMMA_2_9B_PARAMS], [QWEN3_30B_A3B, QWEN3_30B_A3B_PARAMS]] as const) {
    assert.equal(tensorsFor(cfg).reduce((a, t) => a + bytesOf(t), 0), 2 * params);
  }
});

test('CUDA batch-invariant mode: the transient memory counts every decode split\'s attention partials', async () => {
  const dir = sparse('llama');
  const plain = await FitPlanner.open(dir, { cuda: { batchInvariant: false } });
  const invariant = await FitPlanner.open(dir, { cuda: { batchInvariant: true } });
  const [ctx, batch] = [32768, 16];
  const a = await plain.transient(ctx, batch, 512, 16, 'cuda');
  const b = await invariant.transient(ctx, batch, 512, 16, 'cuda');
  // a decode step's 16 tokens, each with ctx / 512 splits, f32 [H, D] and [H, 2] partials apiece
  const partials = batch * (ctx / 512) * LLAMA_3_1_8B.num_attention_heads * (128 + 2) * 4;
  assert.equal(a.partialBytes, 0);
  assert.ok(b.partialBytes >= partials, `${b.partialBytes} < ${partials}`);
  assert.ok(b.bytes - a.bytes >= b.partialBytes, `${b.bytes} - ${a.bytes} < ${b.partialBytes}`);
  // each captured decode graph (one per batch bucket) keeps partials for its own rows
  if (a.graphBytes > 0) assert.ok(b.graphBytes - a.graphBytes >= partials, `graphs: ${b.graphBytes} - ${a.graphBytes}`);
  // the CPU plan is the same either way
  assert.equal((await invariant.transient(2048, 4, 512, 16, 'cpu')).bytes, (await plain.transient(2048, 4, 512, 16, 'cpu')).bytes);
});

test('the server plan with speculative decoding: the draft logit rows in the transient memory, the drafter\'s weights and KV beside the model\'s', async () => {
  const p = await planner('gemma');
  const base = { backend: 'cuda' as const, kvDtype: 'bf16' as const, maxBatch: 4, maxModelLen: 8192, memory: { totalBytes: 80 * 2 ** 30, freeBytes: 60 * 2 ** 30 } };
  const plain = await planServeKv(p, base);
  const speculation = { extraLogitRows: 64, vocabSize: 256_000, drafterBytes: 2 * 2 ** 30, drafterKvBytesPerToken: 8192 };
  const spec = await planServeKv(p, { ...base, speculation });
  assert.equal(spec.transientBytes - plain.transientBytes, 64 * 256_000 * 4, 'f32 logits of 64 draft rows');
  assert.equal(spec.kvTokens, plain.kvTokens, 'room for every sequence either way');
  assert.deepEqual(spec.speculation, { logitBytes: 64 * 256_000 * 4, drafterBytes: 2 * 2 ** 30, drafterKvBytes: spec.kvTokens * 8192 });
  assert.equal(spec.kvBytes, plain.kvBytes, 'kvBytes is the model\'s own pools');
  // a budget covers both KV caches: fewer tokens than without a drafter
  const budget = { kvBudgetBytes: 2 * 2 ** 30 };
  const [b0, b1] = await Promise.all([planServeKv(p, { ...base, ...budget }), planServeKv(p, { ...base, ...budget, speculation })]);
  assert.ok(b1.kvTokens < b0.kvTokens, `${b1.kvTokens} < ${b0.kvTokens}`);
  assert.ok(b1.kvBytes + b1.speculation!.drafterKvBytes <= 2 * 2 ** 30);
  // a tight GPU: the drafter's weights come out of the usable memory
  const fraction = plain.usableBytes! / (80 * 2 ** 30);
  const smallTotal = Math.round((plain.weightsBytes + plain.transientBytes + plain.reserveBytes + plain.kvBytes / 2) / fraction);
  const small = { ...base, memory: { totalBytes: smallTotal, freeBytes: smallTotal } };
  const [t0, t1] = await Promise.all([planServeKv(p, small), planServeKv(p, { ...small, speculation })]);
  assert.ok(t1.kvTokens < t0.kvTokens, `${t1.kvTokens} < ${t0.kvTokens}`);
  const sp = t1.speculation!;
  assert.ok(t1.weightsBytes + t1.kvBytes + t1.transientBytes + sp.drafterBytes + sp.drafterKvBytes + t1.reserveBytes <= t1.usableBytes!);
});
