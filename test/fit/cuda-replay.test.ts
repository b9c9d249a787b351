// Replays an excerpt of a real H200 run (`bench/fit-cuda.ts --out DIR --budget-s 330`, the tree
// committed as 959960d, 2026-11-30; fixtures/fit-cuda-h200-2026-11-30-959960d/step-memory.json says
// so): the step shapes the engine ran and the CUDA pool's live high-water mark during them. The
// planner's simulation of the same steps (the decoder graph on the CUDA pool model, the GEMM
// tuner's L2-flush buffer, graph arenas) must reproduce the mark.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { FitPlanner, type StepShape } from '../../src/execution/fit/plan.ts';
import { LLAMA_3_1_8B, QWEN3_30B_A3B, tempModelDir, tensorsFor, writeCheckpoint } from './checkpoints.ts';

const fixture = JSON.parse(fs.readFileSync(path.join(import.meta.dirname, 'fixtures', 'fit-cuda-h200-2026-11-30-959960d', 'step-memory.json'), 'utf8')) as {
  cases: { name: string; model: string; steps: StepShape[]; stepLiveBytes: number }[];
};

// the models of bench/make_random_*.py (same shapes; header-only checkpoints)
const CONFIGS: Record<string, Record<string, unknown>> = {
  llama8b: { ...LLAMA_3_1_8B, head_dim: 128 },
  moe: { ...QWEN3_30B_A3B, num_hidden_layers: 6 },
  probe4: {
    architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: 8192, hidden_size: 256, intermediate_size: 512,
    num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 64, max_position_embeddings: 8192,
    rms_norm_eps: 1e-5, rope_theta: 10000.0, hidden_act: 'silu', tie_word_embeddings: true, torch_dtype: 'bfloat16',
  },
};

test('CUDA step memory: the recorded H200 steps simulate to the measured pool live high-water mark', async () => {
  const root = tempModelDir('llmts-fit-replay-');
  try {
    for (const c of fixture.cases) {
      const dir = path.join(root, c.model);
      if (!fs.existsSync(dir)) writeCheckpoint(dir, CONFIGS[c.model]!, tensorsFor(CONFIGS[c.model]!), { data: 'sparse' });
      const p = await FitPlanner.open(dir);
      // the recording's tuner timed every row count up to 1024 apart, not by row class as gemm.ts does
      const sim = await p.simulatePool('cuda', c.steps, { cudaTuning: { maxM: 1024, byClass: false } });
      const err = sim.livePeak / c.stepLiveBytes - 1;
      assert.ok(Math.abs(err) < 0.01, `${c.name}: simulated ${sim.livePeak} B, measured ${c.stepLiveBytes} B (${(100 * err).toFixed(1)}%)`);
    }
  } finally {
    fs.rmSync(root, { recursive: true, force: true });
  }
});
