// The fit planner and FP8 checkpoints, from headers alone: on the CPU their e4m3 matrices load
// dequantized (bf16 by default), so the plan counts what the backend then holds, not the
// checkpoint's bytes; on CUDA they stay FP8 (a byte a weight and an f32 scale per row per scale
// run), unless CudaGemvSettings.fp8Weights is off.
import assert from 'node:assert/strict';
import { join, resolve } from 'node:path';
import { it } from 'node:test';

import type { Tensor } from '../../src/contracts/backend.ts';
import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import type { CpuTensor } from '../../src/backends/cpu/cpu-tensor.ts';
import { openWeights } from '../../src/artifacts/safetensors.ts';
import { FitPlanner } from '../../src/execution/fit/index.ts';
import { gpuMachine } from '../../src/execution/fit/machines.ts';
import { loadModel } from '../../src/execution/load-model.ts';

const DIR = resolve(import.meta.dirname, '../fixtures/fp8');

for (const name of ['llama_fp8_block', 'qwen3_fp8_channel']) {
  it(`${name}: the plan's weights are the dequantized matrices the CPU backend holds`, async () => {
    const dir = join(DIR, name);
    const backend = await createCpuBackend({ settings: { packWeights: 'off' } });
    let held = 0;
    try {
      const m = await loadModel(backend, dir, { maxModelLen: 256 });
      const seen = new Set<Tensor>();
      const visit = (t: unknown) => {
        if (t && typeof t === 'object' && 'shape' in t) seen.add(t as Tensor);
        else if (t && typeof t === 'object') Object.values(t).forEach(visit);
      };
      const w = m.model.weights;
      visit([w.embed, w.lmHead, w.finalNorm, w.layers]);
      held = [...seen].reduce((a, t) => a + (t as CpuTensor).bytes, 0);
      assert.ok([...seen].some((t) => t.dtype === 'bf16'), 'the e4m3 matrices load as bf16');
    } finally {
      await backend.close();
    }
    const plan = await FitPlanner.open(dir, { cpu: { packWeights: 'off' } });
    assert.equal((await plan.weights('cpu')).residentBytes, held);
    const fileBytes = openWeights(dir).totalBytes();
    assert.ok(held > fileBytes, `resident ${held} > the checkpoint's ${fileBytes} bytes (1 byte an e4m3 weight)`);
  });
}

// the e4m3 matrices' [N, K] from the checkpoint headers, and the f32 scales a row keeps on CUDA:
// llama_fp8_block's 32 x 32 blocks (config.json weight_block_size) a scale per 32 columns, channel
// scales one a row (mistral_fp8_tensor's one scale a tensor is as one a row)
for (const [name, scalesPerRow] of [['llama_fp8_block', (K: number) => Math.ceil(K / 32)], ['qwen3_fp8_channel', () => 1],
  ['mistral_fp8_tensor', () => 1]] as const) {
  it(`${name}: the CUDA plan keeps the e4m3 matrices in FP8 (a byte a weight, its scales), and in bf16 with fp8Weights off`, async () => {
    const dir = join(DIR, name);
    const weights = openWeights(dir);
    const fp8 = weights.names().map((n) => weights.entry(n)).filter((e) => e.dtype === 'F8_E4M3');
    assert.ok(fp8.length > 0);
    const cpu = await (await FitPlanner.open(dir, { cpu: { packWeights: 'off' } })).weights('cpu');
    const cuda = await FitPlanner.open(dir);
    const kept = await cuda.weights('cuda');
    const bf16Bytes = fp8.reduce((a, e) => a + e.shape[0]! * e.shape[1]! * 2, 0);
    const fp8Bytes = fp8.reduce((a, e) => a + e.shape[0]! * (e.shape[1]! + 4 * scalesPerRow(e.shape[1]!)), 0);
    assert.equal(kept.residentBytes, cpu.residentBytes - bf16Bytes + fp8Bytes);
    assert.equal(kept.residentBytesByDtype.fp8, fp8Bytes);
    const off = await (await FitPlanner.open(dir, { cuda: { gemv: { fp8Weights: false } } })).weights('cuda');
    assert.equal(off.residentBytes, cpu.residentBytes);
    assert.equal(off.residentBytesByDtype.fp8, undefined);
    // a whole plan runs the FP8 matmuls at decode rows (the GEMV) and at a prefill chunk (the bf16
    // scratch, held over the product: a step's peak grows by at least the largest matrix's bf16 copy)
    const machine = gpuMachine('h200');
    const plan = await cuda.plan(machine, { ctx: 256 });
    const plain = await (await FitPlanner.open(dir, { cuda: { gemv: { fp8Weights: false } } })).plan(machine, { ctx: 256 });
    assert.equal(plan.weightsBytes, kept.residentBytes);
    assert.equal(plain.weightsBytes, cpu.residentBytes);
    const largest = Math.max(...fp8.map((e) => e.shape[0]! * e.shape[1]! * 2));
    assert.ok(plan.transientBytes - plain.transientBytes >= largest,
      `a step's peak ${plan.transientBytes} against ${plain.transientBytes} dequantized at load holds the ${largest}-byte scratch`);
  });
}
