// GGUF models against transformers (fixtures from scripts/make_gguf_fixtures.py): each fixture
// family, one ggml type each (kquant: every K-quant and IQ4 type in one model), greedy steps and
// top-5 logprobs under the closeness rule on the CPU backend, alone and batched. Quantized
// tensors load dequantized into f32 (the reference's own values, so the f32 tolerance of every
// fixture applies) and into bf16 (a rounding of every weight to 8 bits of mantissa: the tolerance
// of the bf16 path, as for CUDA's bf16 activations), with LLMTS_CPU_QUANT_WEIGHTS off; and, the
// default, Q8_0 / Q4_0 / Q4_1 / Q5_1 / Q4_K / Q5_K / Q6_K / IQ4_XS matrices kept quantized (native/quant_pack.c: activations rounded to 8 bits
// per block of 32 for the integer dot products), Q5_0 / IQ4_NL / Q3_K ones rewritten into Q8_0 / Q6_K
// blocks of the same values (src/artifacts/gguf/transcode.ts) and kept so; the rest dequantized into
// bf16; tolerance per ggml type.

import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { test } from 'node:test';

import { createCpuBackend } from '../../src/backends/cpu/cpu-backend.ts';
import { loadModel } from '../../src/execution/load-model.ts';
import { checkReferenceCases, type ReferenceCase } from '../helpers/reference-cases.ts';

const DIR = resolve(import.meta.dirname, '../fixtures/gguf');
/** |Δ logprob| allowed on the matched prefix, by what the weights are dequantized into */
const TOLERANCE = { f32: 0.05, bf16: 0.1 } as const;
/** the same with those matrices kept quantized, by the fixture's ggml type ('mixed': kquant's) */
const QUANT_TOLERANCE: Record<string, number> = { Q8_0: 0.1, Q4_0: 0.1, Q4_1: 0.1, Q5_0: 0.1, Q5_1: 0.1, mixed: 0.1 };
/** the layouts a fixture's kept matrices must show, by its ggml type */
const KEPT_LAYOUTS: Record<string, string[]> = { Q8_0: ['q8_0'], Q4_0: ['q4_0'], Q4_1: ['q4_1'], Q5_0: ['q8_0'], Q5_1: ['q5_1'], mixed: ['q8_0', 'q4_k', 'q6_k', 'q5_k', 'iq4_xs'] };
/**
 * kquant's layer matrices (one ggml type each, its notes) by the layout they must be kept in; the
 * others dequantized (the 'p16' bf16 panels)
 */
const KQUANT_LAYOUTS: Record<string, string> = {
  q: 'p16', k: 'q6_k', v: 'q4_k', o: 'q5_k', gate: 'q6_k', up: 'iq4_xs', down: 'q8_0',
};

interface Reference {
  name: string;
  gguf: string;
  ggml_type: string;
  method: string;
  cases: ReferenceCase[];
}

const refs: Reference[] = existsSync(DIR)
  ? readdirSync(DIR).filter((f) => f.endsWith('.reference.json') && !f.startsWith('vocab-'))
    .map((f) => JSON.parse(readFileSync(join(DIR, f), 'utf8')) as Reference).sort((a, b) => a.name.localeCompare(b.name))
  : [];

test('a GGUF fixture per family and every loadable ggml type', () => {
  const families = new Set(refs.map((r) => r.name.replace(/_(q\d_\d|q\d_k|f16|bf16|q8_0)$/, '')));
  for (const f of ['llama', 'mistral', 'qwen2', 'qwen3', 'qwen3_moe', 'gemma2', 'gemma3', 'phi3', 'olmo2', 'granite', 'mixtral', 'kquant']) {
    assert.ok(families.has(f), `no GGUF fixture for ${f} (have ${[...families].join(', ')})`);
  }
  const types = new Set(refs.map((r) => r.ggml_type));
  for (const t of ['Q8_0', 'Q4_0', 'Q4_1', 'Q5_0', 'Q5_1', 'F16', 'BF16', 'mixed']) assert.ok(types.has(t), `no fixture of ${t}`);
});

for (const dtype of ['f32', 'bf16', 'quantized'] as const) {
  for (const ref of refs) {
    if (dtype === 'quantized' && !(ref.ggml_type in QUANT_TOLERANCE)) continue;
    const what = dtype === 'quantized' ? `${KEPT_LAYOUTS[ref.ggml_type]!.join(' / ')} kept quantized` : `dequantized to ${dtype}`;
    const tolerance = dtype === 'quantized' ? QUANT_TOLERANCE[ref.ggml_type]! : TOLERANCE[dtype];
    test(`${ref.name} (${ref.ggml_type}, ${what}): matches transformers (${ref.method}) alone and batched`, async (t) => {
      const backend = await createCpuBackend({ settings: { quantWeights: dtype === 'quantized' } });
      try {
        const m = await loadModel(backend, join(DIR, ref.gguf), { maxModelLen: 512, quantizedDtype: dtype === 'quantized' ? 'bf16' : dtype });
        if (dtype === 'quantized') {
          const layouts = new Set([m.model.weights.embed, ...m.model.weights.layers.flatMap((l) => [...Object.values(l.attn), ...Object.values(l.mlp)])]
            .map((w) => (w as { layout?: string } | undefined)?.layout));
          for (const want of KEPT_LAYOUTS[ref.ggml_type]!) {
            assert.ok(layouts.has(want), `no ${want} weight kept quantized (layouts: ${[...layouts].join(', ')})`);
          }
          if (ref.name === 'kquant') {
            for (const l of m.model.weights.layers) {
              const byName: Record<string, unknown> = { ...l.attn, ...l.mlp };
              for (const [name, want] of Object.entries(KQUANT_LAYOUTS)) {
                assert.equal((byName[name] as { layout?: string } | undefined)?.layout, want, `kquant ${name}`);
              }
            }
          }
        }
        const worst = await checkReferenceCases(m, ref.cases, tolerance);
        t.diagnostic(`max |Δ logprob| on the matched prefix: ${worst.toExponential(2)}`);
      } finally {
        await backend.close();
      }
    });
  }
}
