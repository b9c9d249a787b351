// normalizeConfig + ropeFrequencies against transformers itself. data/config-cases.json holds the
// configs; data/transformers-reference.json is what transformers derived from each of them
// (made by data/make-transformers-reference.py on a machine with PyTorch: it builds every model
// and reads the numbers back from the live modules).

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { normalizeConfig } from '../../src/artifacts/config.ts';
import type { ModelConfig } from '../../src/contracts/model-config.ts';
import { ropeFrequencies } from '../../src/models/rope-frequencies.ts';

const dataDir = path.join(path.dirname(fileURLToPath(import.meta.url)), 'data');
const cases: Record<string, any> = JSON.parse(fs.readFileSync(path.join(dataDir, 'config-cases.json'), 'utf8'));
const reference = JSON.parse(fs.readFileSync(path.join(dataDir, 'transformers-reference.json'), 'utf8'));

/** families whose attention reads config.sliding_window directly (no per-layer attribute) */
const CONFIG_WINDOW = new Set(['mistral', 'mixtral', 'phi3']);
const ACT: Record<string, string> = {
  SiLUActivation: 'silu', SiLU: 'silu', GELUTanh: 'gelu_tanh', PytorchGELUTanh: 'gelu_tanh',
  GELUActivation: 'gelu', GELU: 'gelu', NewGELUActivation: 'gelu_tanh',
};

/** distance in float32 ulps */
function ulps(a: number, b: number): number {
  const ia = new Int32Array(new Float32Array([a]).buffer)[0];
  const ib = new Int32Array(new Float32Array([b]).buffer)[0];
  return Math.abs(ia - ib);
}

function sameFloats(actual: Float32Array, expected: number[], what: string): void {
  assert.equal(actual.length, expected.length, `${what}: length`);
  let worst = 0;
  for (let i = 0; i < expected.length; i++) worst = Math.max(worst, ulps(actual[i], expected[i]));
  // torch's float32 pow is within 1 ulp (Sleef); everything else is reproduced step by step
  assert.ok(worst <= 1, `${what}: ${worst} ulps off\n  ours   ${[...actual]}\n  theirs ${expected}`);
}

const ids = (v: unknown): number[] => (v === null || v === undefined ? [] : Array.isArray(v) ? v : [v as number]);

describe('transformers reference', () => {
  it('covers every case', () => {
    assert.ok(/^5\./.test(reference.transformers), `made with transformers ${reference.transformers}`);
    assert.deepEqual(Object.keys(reference.cases).sort(), Object.keys(cases).sort());
    for (const [name, r] of Object.entries<any>(reference.cases)) assert.equal(r.error, undefined, `${name}: ${r.error}`);
  });

  for (const [name, raw] of Object.entries(cases)) {
    it(name, () => {
      const ref = reference.cases[name];
      const genEos = ids(ref.generation.eos);
      const c: ModelConfig = normalizeConfig(raw, {
        generationEosIds: [],
        hasTensor: ref.savedTensorNames ? (n) => ref.savedTensorNames.includes(n) : undefined,
      });
      const mt = c.modelType;
      assert.equal(c.numKvHeads, ref.numKvHeads, 'num_key_value_heads');
      assert.equal(c.rmsNormEps, ref.rmsNormEps, 'rms_norm_eps');
      assert.equal(c.maxPositionEmbeddings, ref.maxPositionEmbeddings, 'max_position_embeddings');
      assert.equal(c.tieWordEmbeddings, ref.tied, 'tied embeddings');
      assert.deepEqual(new Set(c.eosTokenIds), new Set(genEos), 'eos ids');
      assert.equal(c.bosTokenId ?? null, ref.generation.bos ?? null, 'bos');
      assert.equal(c.padTokenId ?? null, ref.generation.pad ?? null, 'pad');
      assert.equal(c.finalLogitSoftcap, ref.finalLogitSoftcapping ?? 0, 'final softcap');
      if (ref.embedScale !== null) {
        assert.ok(c.embeddingScaleInWeightDtype);
        assert.equal(Math.fround(c.embeddingScale), ref.embedScale, 'embed scale');
      }
      if (ref.embeddingMultiplier !== null) assert.equal(c.embeddingScale, ref.embeddingMultiplier);
      if (ref.logitsScaling !== null) assert.equal(c.logitScale, 1 / ref.logitsScaling);

      assert.equal(c.layers.length, ref.layers.length, 'layers');
      ref.layers.forEach((l: any, i: number) => {
        const at = `${name} layer ${i}`;
        const ours = c.layers[i];
        assert.equal(c.headDim, l.headDim, `${at} head_dim`);
        assert.ok(Math.abs(c.attentionScale - l.scaling) <= 1e-15 * l.scaling, `${at} scaling ${c.attentionScale} vs ${l.scaling}`);
        const window = l.slidingWindowAttr === 'absent' ? (CONFIG_WINDOW.has(mt) ? ref.configSlidingWindow : null) : l.slidingWindowAttr;
        assert.equal(ours.window, window ?? 0, `${at} window`);
        assert.equal(ours.mlp, /Sparse/.test(l.mlpClass) ? 'moe' : 'dense', `${at} mlp (${l.mlpClass})`);
        assert.equal(c.rmsNormEps, l.inputNormEps ?? c.rmsNormEps, `${at} norm eps`);
        assert.equal(c.attnLogitSoftcap, l.attnSoftcap ?? 0, `${at} attn softcap`);
        if (l.residualMultiplier !== null) assert.equal(c.residualScale, l.residualMultiplier);
        assert.equal(ACT[l.act], c.activation, `${at} activation ${l.act}`);
        const qkv = l.q_projBias ?? l.qkv_projBias;
        assert.equal(c.attentionBias, qkv, `${at} qkv bias`);
        assert.equal(c.attentionOutBias, l.o_projBias, `${at} o bias`);
        if (l.gate_projBias !== undefined) assert.equal(c.mlpBias, l.gate_projBias, `${at} mlp bias`);
        if (l.gate_up_projBias !== undefined) assert.ok(c.fusedGateUp);
        if (l.qkv_projBias !== undefined) assert.ok(c.fusedQkv);
        assert.equal(c.qkNorm === 'none' ? false : true, l.hasQNorm, `${at} qk norm`);
        if (l.hasQNorm) assert.equal(l.qNormShape[0], c.qkNorm === 'head' ? c.headDim : c.numHeads * c.headDim, `${at} qk norm width`);
        const hasPostNorms = l.norms.includes('post_feedforward_layernorm');
        const hasPreFf = l.norms.includes('pre_feedforward_layernorm');
        assert.equal(c.normPlacement, hasPreFf ? 'pre_post' : hasPostNorms ? 'post' : 'pre', `${at} norms ${l.norms}`);
        if (l.topK !== undefined) {
          assert.equal(c.moe!.topK, l.topK);
          assert.equal(c.moe!.numExperts, l.numExperts);
          if (l.normTopK !== null) assert.equal(c.moe!.normTopK, l.normTopK);
        }
        // rope: per layer type (gemma3) or one for all
        const key = ref.rope.all ? 'all' : (ref.configLayerTypes[i] as string);
        const r = ropeFrequencies(ours.rope, 1);
        sameFloats(r.invFreq, ref.rope[key].invFreq, `${at} inv_freq`);
        assert.ok(Math.abs(r.attentionScaling - ref.rope[key].attentionScaling) < 1e-12, `${at} attention scaling`);
        for (const s of ref.ropeAtSeq ?? []) {
          const rs = ropeFrequencies(ours.rope, s.seqLen);
          sameFloats(rs.invFreq, s.invFreq, `${at} inv_freq at seq ${s.seqLen}`);
          assert.ok(Math.abs(rs.attentionScaling - s.attentionScaling) < 1e-12, `${at} attention scaling at seq ${s.seqLen}`);
        }
      });

      if (ref.savedTensorNames) {
        assert.ok(ref.savedTensorNames.includes(`${c.weightPrefix}embed_tokens.weight`), `prefix ${c.weightPrefix}`);
        assert.ok(ref.savedTensorNames.includes(`${c.weightPrefix}layers.0.input_layernorm.weight`));
        if (!c.tieWordEmbeddings) assert.ok(ref.savedTensorNames.includes(c.lmHeadWeight), c.lmHeadWeight);
      }
    });
  }
});
