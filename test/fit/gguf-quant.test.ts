// The fit planner and GGUF Q8_0 / Q4_0 / Q4_K / Q6_K / Q5_K / IQ4_XS matrices (and Q5_0 / IQ4_NL / Q3_K ones, kept as Q8_0 / Q6_K): on the CPU, where they stay quantized
// (LLMTS_CPU_QUANT_WEIGHTS, on by default), the plan counts the bytes the backend holds for them,
// the quantized panels; on CUDA, and on the CPU with the knob off, their bf16 values.
import assert from 'node:assert/strict';
import { join, resolve } from 'node:path';
import { describe, it } from 'node:test';

import type { Tensor } from '../../src/contracts/backend.ts';
import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import type { CpuTensor } from '../../src/backends/cpu/cpu-tensor.ts';
import { FitPlanner, type Machine } from '../../src/execution/fit/index.ts';
import { loadModel } from '../../src/execution/load-model.ts';

const DIR = resolve(import.meta.dirname, '../fixtures/gguf');

/** Bytes the CPU backend holds for a loaded model's weights (each tensor once). */
async function residentOnCpu(file: string, quantWeights: boolean): Promise<{ bytes: number; layouts: Set<string> }> {
  const backend = await createCpuBackend({ settings: { quantWeights, packWeights: 'off' } });
  try {
    const m = await loadModel(backend, file, { maxModelLen: 256 });
    const w = m.model.weights;
    const seen = new Set<Tensor>();
    const visit = (t: unknown) => {
      if (t && typeof t === 'object' && 'shape' in t) seen.add(t as Tensor);
      else if (t && typeof t === 'object') Object.values(t).forEach(visit);
    };
    visit([w.embed, w.lmHead, w.finalNorm, w.layers]);
    const ts = [...seen] as CpuTensor[];
    return { bytes: ts.reduce((a, t) => a + t.bytes, 0), layouts: new Set(ts.map((t) => t.layout)) };
  } finally {
    await backend.close();
  }
}

describe('fit: GGUF Q8_0 / Q4_0 / Q4_K / Q6_K matrices kept quantized on the CPU', () => {
  for (const [name, layouts] of [['llama_q8_0.gguf', ['q8_0']], ['mistral_q4_0.gguf', ['q4_0']], ['kquant.gguf', ['q4_k', 'q6_k', 'q8_0', 'q5_k', 'iq4_xs']], ['qwen3_q5_0.gguf', ['q8_0']], ['granite_q4_1.gguf', ['q4_1']], ['gemma2_q5_1.gguf', ['q5_1']]] as const) {
    it(`${name}: the CPU plan counts the quantized panels, CUDA's and the knob off the bf16 values`, async () => {
      const file = join(DIR, name);
      const quant = await residentOnCpu(file, true);
      const plain = await residentOnCpu(file, false);
      for (const layout of layouts) assert.ok(quant.layouts.has(layout), `${name}: ${layout} among layouts ${[...quant.layouts].join(', ')}`);
      assert.ok(quant.bytes < plain.bytes);
      const on = await FitPlanner.open(file, { cpu: { quantWeights: true } });
      const off = await FitPlanner.open(file, { cpu: { quantWeights: false } });
      assert.equal((await on.weights('cpu')).residentBytes, quant.bytes);
      assert.equal((await off.weights('cpu')).residentBytes, plain.bytes);
      assert.equal((await on.weights('cuda')).residentBytes, plain.bytes);
      // the decode model reads what is resident: fewer bytes a step on the CPU
      const cpu: Machine = { kind: 'cpu', name: 'cpu', description: 'test', memoryBytes: 2 ** 34, bandwidthGBps: 10, source: 'test' };
      const a = await on.decodeStep(cpu, 10, 1, 'f32');
      const b = await off.decodeStep(cpu, 10, 1, 'f32');
      assert.ok(a.weightBytes < b.weightBytes, `decode reads ${a.weightBytes} quantized, ${b.weightBytes} not`);
    });
  }
});
