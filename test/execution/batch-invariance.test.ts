// Batch invariance on the CPU backend: a request's tokens and logprobs do not depend on the other
// rows in its steps (the cases: test/helpers/batch-invariance.ts). What breaks it: a kernel chosen
// by how many rows share a step (the matmul's decode and prefill paths, the bf16 dot products), a
// reduction order that depends on the row count, or a prompt's own prefill computed differently
// when the token budget splits it into other chunks (attention over cached keys vs the chunk's own).
// The GGUF cases keep their Q8_0 / Q4_0 (and K-quant) matrices quantized (LLMTS_CPU_QUANT_WEIGHTS, on by default),
// so every matmul quantizes its activations per row block: a row's bytes must not depend on the others.

import { describe, before, after } from 'node:test';
import { join, resolve } from 'node:path';
import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { loadModel, type LoadedModel } from '../../src/execution/load-model.ts';
import type { Backend } from '../../src/contracts/backend.ts';
import { batchInvarianceCases } from '../helpers/batch-invariance.ts';

const ROOT = resolve(import.meta.dirname, '../..');

for (const { name, dir } of [
  { name: 'demo (bf16 weights)', dir: join(ROOT, 'models/demo') },
  { name: 'llama fixture (f32 weights)', dir: join(ROOT, 'test/fixtures/llama') },
  { name: 'qwen3_moe fixture (experts)', dir: join(ROOT, 'test/fixtures/qwen3_moe') },
  { name: 'gemma2 fixture (sliding windows, soft-caps)', dir: join(ROOT, 'test/fixtures/gemma2') },
  { name: 'llama Q8_0 GGUF (weights kept quantized: integer dot products)', dir: join(ROOT, 'test/fixtures/gguf/llama_q8_0.gguf') },
  { name: 'mistral Q4_0 GGUF (weights kept quantized: integer dot products)', dir: join(ROOT, 'test/fixtures/gguf/mistral_q4_0.gguf') },
]) {
  describe(`batch invariance: ${name}`, () => {
    let backend: Backend;
    let m: LoadedModel;
    before(async () => {
      backend = await createCpuBackend();
      m = await loadModel(backend, dir, { maxModelLen: 512 });
    });
    after(async () => {
      await backend?.close();
    });
    batchInvarianceCases(() => m, 6);
  });
}
