// FP8 checkpoints against transformers (fixtures from scripts/make_fp8_fixtures.py): one per
// scale layout (FineGrainedFP8 blocks, compressed-tensors per output row with bf16 scales, and per
// tensor with static input scales), each family's tiny fixture with every attention and MLP
// matrix in e4m3. transformers dequantizes them in fp32; llmts dequantizes at load into f32 (the
// reference's own values: the f32 tolerance of every fixture) or bf16 (its tolerance), greedy
// steps and top-5 logprobs under the closeness rule, alone and batched, on the CPU backend.

import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { test } from 'node:test';

import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { loadModel } from '../../src/execution/load-model.ts';
import { checkReferenceCases, type ReferenceCase } from '../helpers/reference-cases.ts';

const DIR = resolve(import.meta.dirname, '../fixtures/fp8');
/** |Δ logprob| allowed on the matched prefix, by what the matrices are dequantized into */
const TOLERANCE = { f32: 0.05, bf16: 0.1 } as const;

interface Reference {
  name: string;
  quant_method: string;
  strategy: string;
  cases: ReferenceCase[];
}

const fixtures = existsSync(DIR) ? readdirSync(DIR).filter((d) => existsSync(join(DIR, d, 'reference.json'))).sort() : [];

test('an FP8 fixture for each scale layout', () => {
  const kinds = new Set(fixtures.map((d) => {
    const r = JSON.parse(readFileSync(join(DIR, d, 'reference.json'), 'utf8')) as Reference;
    return `${r.quant_method}/${r.strategy}`;
  }));
  for (const k of ['fp8/block', 'compressed-tensors/channel', 'compressed-tensors/tensor']) assert.ok(kinds.has(k), `no fixture of ${k}`);
});

for (const dtype of ['f32', 'bf16'] as const) {
  for (const name of fixtures) {
    const dir = join(DIR, name);
    const ref = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as Reference;
    test(`${name} (${ref.quant_method}, ${ref.strategy} scales, dequantized to ${dtype}): matches transformers alone and batched`, async (t) => {
      const backend = await createCpuBackend();
      try {
        const m = await loadModel(backend, dir, { maxModelLen: 512, quantizedDtype: dtype });
        const worst = await checkReferenceCases(m, ref.cases, TOLERANCE[dtype]);
        t.diagnostic(`max |Δ logprob| on the matched prefix: ${worst.toExponential(2)}`);
      } finally {
        await backend.close();
      }
    });
  }
}
