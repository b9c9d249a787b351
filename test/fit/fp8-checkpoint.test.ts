// The fit planner and FP8 checkpoints: their e4m3 matrices load dequantized (bf16 by default), so
// the plan counts what the backend then holds, from headers alone, not the checkpoint's bytes.
import assert from 'node:assert/strict';
import { join, resolve } from 'node:path';
import { it } from 'node:test';

import type { Tensor } from '../../src/contracts/backend.ts';
import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import type { CpuTensor } from '../../src/backends/cpu/cpu-tensor.ts';
import { openWeights } from '../../src/artifacts/safetensors.ts';
import { FitPlanner } from '../../src/execution/fit/index.ts';
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
