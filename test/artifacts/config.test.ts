// normalizeConfig per family, in both config styles, against values worked out by hand from
// transformers 5.x's configuration_*.py / modeling_*.py (see the comments at each expectation).

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { normalizeConfig } from '../../src/artifacts/config.ts';
import { ArtifactError } from '../../src/artifacts/errors.ts';
import { SUPPORTED_MODEL_TYPES } from '../../src/contracts/model-config.ts';

const base = {
  vocab_size: 128, hidden_size: 64, intermediate_size: 96, num_hidden_layers: 2,
  num_attention_heads: 4, num_key_value_heads: 2,
};
const cfg = (model_type: string, extra: Record<string, unknown> = {}) => ({ model_type, ...base, ...extra });
const close = (a: number, b: number, tol = 1e-12) => assert.ok(Math.abs(a - b) <= tol * Math.max(1, Math.abs(b)), `${a} != ${b}`);

describe('normalizeConfig: llama', () => {
  it('derives shapes, defaults and the 1/sqrt(head_dim) scale', () => {
    const c = normalizeConfig(cfg('llama'));
    assert.equal(c.headDim, 16); // 64 / 4
    assert.equal(c.numKvHeads, 2);
    assert.equal(c.rmsNormEps, 1e-6);
    assert.equal(c.activation, 'silu');
    assert.equal(c.tieWordEmbeddings, false);
    assert.equal(c.maxPositionEmbeddings, 2048);
    assert.equal(c.attentionScale, 0.25);
    assert.equal(c.normPlacement, 'pre');
    assert.equal(c.qkNorm, 'none');
    assert.equal(c.weightPrefix, 'model.');
    assert.equal(c.lmHeadWeight, 'lm_head.weight');
    assert.deepEqual(c.eosTokenIds, [2]); // LlamaConfig default eos
    assert.equal(c.bosTokenId, 1);
    assert.equal(c.layers.length, 2);
    for (const l of c.layers) {
      assert.deepEqual({ attention: l.attention, window: l.window, mlp: l.mlp }, { attention: 'full', window: 0, mlp: 'dense' });
      assert.deepEqual(l.rope, { type: 'default', theta: 10000, rotaryDim: 16, factor: 1, maxPositions: 2048 });
    }
  });

  it('num_key_value_heads missing or null means one per head', () => {
    const { num_key_value_heads: _, ...noKv } = cfg('llama');
    assert.equal(normalizeConfig(noKv).numKvHeads, 4);
    assert.equal(normalizeConfig(cfg('llama', { num_key_value_heads: null })).numKvHeads, 4);
  });

  it('llama3 rope from rope_scaling (old style) and rope_parameters (new style) agree', () => {
    const params = { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192 };
    const old = normalizeConfig(cfg('llama', { rope_theta: 500000, max_position_embeddings: 131072, rope_scaling: { rope_type: 'llama3', ...params } }));
    const neu = normalizeConfig(cfg('llama', { max_position_embeddings: 131072, rope_parameters: { rope_type: 'llama3', rope_theta: 500000, ...params } }));
    const want = {
      type: 'llama3', theta: 500000, rotaryDim: 16, factor: 8, maxPositions: 131072,
      originalMaxPositions: 8192, lowFreqFactor: 1, highFreqFactor: 4,
    };
    assert.deepEqual(old.layers[0].rope, want);
    assert.deepEqual(neu.layers[1].rope, want);
  });

  it('accepts "type" as the rope type key and keeps keys in the dict over top-level ones', () => {
    const c = normalizeConfig(cfg('llama', { rope_theta: 1234, rope_scaling: { type: 'linear', factor: 4 } }));
    assert.equal(c.layers[0].rope.type, 'linear');
    assert.equal(c.layers[0].rope.factor, 4);
    assert.equal(c.layers[0].rope.theta, 1234);
    const d = normalizeConfig(cfg('llama', { rope_theta: 1234, rope_parameters: { rope_type: 'default', rope_theta: 99 } }));
    assert.equal(d.layers[0].rope.theta, 99);
  });

  it('rope_scaling wins over rope_parameters when both are present', () => {
    const c = normalizeConfig(cfg('llama', { rope_scaling: { type: 'linear', factor: 2 }, rope_parameters: { rope_type: 'dynamic', factor: 3 } }));
    assert.equal(c.layers[0].rope.type, 'linear');
  });

  it('dynamic and yarn carry their parameters; yarn original_max_position_embeddings defaults to max_position_embeddings', () => {
    const dyn = normalizeConfig(cfg('llama', { rope_scaling: { type: 'dynamic', factor: 2 }, max_position_embeddings: 64 })).layers[0].rope;
    assert.deepEqual(dyn, { type: 'dynamic', theta: 10000, rotaryDim: 16, factor: 2, maxPositions: 64 });
    const yarn = normalizeConfig(cfg('llama', {
      max_position_embeddings: 4096,
      rope_parameters: { rope_type: 'yarn', factor: 40, mscale: 1, mscale_all_dim: 0.707, beta_fast: 16, beta_slow: 2, truncate: false },
    })).layers[0].rope;
    assert.deepEqual(yarn, {
      type: 'yarn', theta: 10000, rotaryDim: 16, factor: 40, maxPositions: 4096, originalMaxPositions: 4096,
      attentionFactor: undefined, betaFast: 16, betaSlow: 2, mscale: 1, mscaleAllDim: 0.707, truncate: false,
    });
    // a top-level original_max_position_embeddings wins over the dict's
    const top = normalizeConfig(cfg('llama', {
      max_position_embeddings: 4096, original_max_position_embeddings: 1024,
      rope_scaling: { type: 'yarn', factor: 4, original_max_position_embeddings: 2048 },
    })).layers[0].rope;
    assert.equal(top.originalMaxPositions, 1024);
    // yarn factor null: max_position_embeddings / original
    const implicit = normalizeConfig(cfg('llama', {
      max_position_embeddings: 4096, rope_scaling: { type: 'yarn', factor: null, original_max_position_embeddings: 1024 },
    })).layers[0].rope;
    assert.equal(implicit.factor, 4);
  });

  it('attention_bias biases q/k/v/o; mlp_bias biases the MLP', () => {
    const c = normalizeConfig(cfg('llama', { attention_bias: true, mlp_bias: true }));
    assert.deepEqual([c.attentionBias, c.attentionOutBias, c.mlpBias], [true, true, true]);
    const d = normalizeConfig(cfg('llama'));
    assert.deepEqual([d.attentionBias, d.attentionOutBias, d.mlpBias], [false, false, false]);
  });

  it('llama ignores sliding_window and layer_types (transformers never reads them)', () => {
    const c = normalizeConfig(cfg('llama', { sliding_window: 8, layer_types: ['sliding_attention', 'full_attention'] }));
    assert.deepEqual(c.layers.map((l) => l.window), [0, 0]);
  });

  it('eos ids: int or list, merged with generation_config, deduplicated', () => {
    assert.deepEqual(normalizeConfig(cfg('llama', { eos_token_id: 7 })).eosTokenIds, [7]);
    assert.deepEqual(normalizeConfig(cfg('llama', { eos_token_id: [7, 8] }), { generationEosIds: [8, 9] }).eosTokenIds, [7, 8, 9]);
    // generation_config alone replaces the family default
    const { ...noEos } = cfg('llama');
    assert.deepEqual(normalizeConfig(noEos, { generationEosIds: [5] }).eosTokenIds, [5]);
    assert.deepEqual(normalizeConfig(cfg('llama', { eos_token_id: null })).eosTokenIds, []);
  });

  it('gelu activations map; an unknown one is an error naming the field', () => {
    assert.equal(normalizeConfig(cfg('llama', { hidden_act: 'gelu' })).activation, 'gelu');
    assert.equal(normalizeConfig(cfg('llama', { hidden_act: 'gelu_pytorch_tanh' })).activation, 'gelu_tanh');
    assert.throws(() => normalizeConfig(cfg('llama', { hidden_act: 'relu2' })), /hidden_act.*relu2/);
  });

  it('picks the tensor prefix by probing the checkpoint', () => {
    const bare = normalizeConfig(cfg('llama'), { hasTensor: (n) => n === 'embed_tokens.weight' });
    assert.equal(bare.weightPrefix, '');
  });
});

describe('normalizeConfig: mistral / mixtral / phi3 (one window for every layer)', () => {
  it('mistral: sliding_window applies to all layers; 4096 when the key is absent', () => {
    assert.deepEqual(normalizeConfig(cfg('mistral', { sliding_window: 16 })).layers.map((l) => [l.attention, l.window]), [['sliding', 16], ['sliding', 16]]);
    const dflt = normalizeConfig(cfg('mistral', { num_attention_heads: 8, num_key_value_heads: undefined }));
    assert.equal(dflt.layers[0].window, 4096);
    assert.equal(dflt.numKvHeads, 8); // MistralConfig default
    assert.equal(dflt.maxPositionEmbeddings, 131072);
    assert.equal(normalizeConfig(cfg('mistral', { sliding_window: null })).layers[0].window, 0);
  });

  it('mistral with layer_types loads as ministral: only sliding layers slide', () => {
    const c = normalizeConfig(cfg('mistral', { num_hidden_layers: 3, sliding_window: 8, layer_types: ['sliding_attention', 'full_attention', 'sliding_attention'] }));
    assert.deepEqual(c.layers.map((l) => l.window), [8, 0, 8]);
  });

  it('mixtral: every layer MoE with renormalised top-k, theta 1e6 default, eps 1e-5', () => {
    const c = normalizeConfig(cfg('mixtral', { num_local_experts: 4, num_experts_per_tok: 2 }));
    assert.deepEqual(c.moe, { numExperts: 4, topK: 2, normTopK: true, intermediateSize: 96 });
    assert.equal(c.intermediateSize, 0);
    assert.ok(c.layers.every((l) => l.mlp === 'moe' && l.window === 0));
    assert.equal(c.layers[0].rope.theta, 1_000_000);
    assert.equal(c.rmsNormEps, 1e-5);
    assert.equal(c.attentionBias, false);
  });

  it('phi3: fused projections, longrope with partial rotary, top-level original_max_position_embeddings', () => {
    const c = normalizeConfig(cfg('phi3', {
      max_position_embeddings: 128, original_max_position_embeddings: 32, partial_rotary_factor: 0.5, sliding_window: 31,
      rope_scaling: { type: 'longrope', short_factor: [1, 1.1, 1.25, 1.5], long_factor: [1, 2, 4, 8] },
    }));
    assert.equal(c.fusedQkv, true);
    assert.equal(c.fusedGateUp, true);
    assert.equal(c.rmsNormEps, 1e-5);
    assert.deepEqual(c.layers.map((l) => l.window), [31, 31]);
    assert.deepEqual(c.layers[0].rope, {
      type: 'longrope', theta: 10000, rotaryDim: 8, factor: 4, maxPositions: 128, originalMaxPositions: 32,
      shortFactor: [1, 1.1, 1.25, 1.5], longFactor: [1, 2, 4, 8], attentionFactor: undefined,
    });
    assert.equal(c.bosTokenId, 1);
    assert.deepEqual(c.eosTokenIds, [32000]);
  });

  it('phi3: "su" is longrope; the dataclass default original_max_position_embeddings (4096) beats the dict', () => {
    const c = normalizeConfig(cfg('phi3', {
      max_position_embeddings: 8192,
      rope_parameters: { rope_type: 'su', short_factor: Array(8).fill(1), long_factor: Array(8).fill(2), original_max_position_embeddings: 64 },
    }));
    assert.equal(c.layers[0].rope.type, 'longrope');
    assert.equal(c.layers[0].rope.originalMaxPositions, 4096);
    assert.equal(c.layers[0].rope.factor, 2);
    assert.equal(c.layers[0].rope.rotaryDim, 16);
  });

  it('phi3: longrope factor lists must cover rotary_dim / 2', () => {
    assert.throws(
      () => normalizeConfig(cfg('phi3', { rope_scaling: { type: 'longrope', short_factor: [1], long_factor: [1] } })),
      /short_factor.*1 entries, expected 8/,
    );
  });
});

describe('normalizeConfig: qwen', () => {
  it('qwen2: q/k/v biased, o not; sliding only from max_window_layers with use_sliding_window', () => {
    const c = normalizeConfig(cfg('qwen2', { num_hidden_layers: 3, use_sliding_window: true, sliding_window: 8, max_window_layers: 1 }));
    assert.deepEqual(c.layers.map((l) => l.window), [0, 8, 8]);
    assert.deepEqual([c.attentionBias, c.attentionOutBias], [true, false]);
    const off = normalizeConfig(cfg('qwen2', { num_hidden_layers: 3, use_sliding_window: false, sliding_window: 8, max_window_layers: 1 }));
    assert.deepEqual(off.layers.map((l) => l.window), [0, 0, 0]);
  });

  it('qwen2: explicit layer_types win over max_window_layers; without use_sliding_window they attend fully', () => {
    const c = normalizeConfig(cfg('qwen2', {
      num_hidden_layers: 3, use_sliding_window: true, sliding_window: 8, max_window_layers: 0,
      layer_types: ['full_attention', 'sliding_attention', 'full_attention'],
    }));
    assert.deepEqual(c.layers.map((l) => l.window), [0, 8, 0]);
    const unused = normalizeConfig(cfg('qwen2', { use_sliding_window: false, sliding_window: 8, layer_types: ['sliding_attention', 'full_attention'] }));
    assert.deepEqual(unused.layers.map((l) => [l.attention, l.window]), [['full', 0], ['full', 0]]);
  });

  it('qwen3: head_dim defaults to 128 (not hidden/heads), per-head qk-norm', () => {
    const c = normalizeConfig(cfg('qwen3'));
    assert.equal(c.headDim, 128);
    close(c.attentionScale, 128 ** -0.5);
    assert.equal(c.qkNorm, 'head');
    assert.equal(c.layers[0].rope.rotaryDim, 128);
    assert.equal(c.bosTokenId, undefined);
    assert.deepEqual(c.eosTokenIds, []);
  });

  it('qwen3_moe: mlp_only_layers stay dense; sparse step; norm_topk_prob', () => {
    const c = normalizeConfig(cfg('qwen3_moe', {
      num_hidden_layers: 4, num_experts: 4, num_experts_per_tok: 2, moe_intermediate_size: 32,
      norm_topk_prob: true, mlp_only_layers: [1], decoder_sparse_step: 1,
    }));
    assert.deepEqual(c.layers.map((l) => l.mlp), ['moe', 'dense', 'moe', 'moe']);
    assert.deepEqual(c.moe, { numExperts: 4, topK: 2, normTopK: true, intermediateSize: 32 });
    assert.equal(c.intermediateSize, 96);
    const step2 = normalizeConfig(cfg('qwen3_moe', { num_hidden_layers: 4, num_experts: 4, decoder_sparse_step: 2 }));
    assert.deepEqual(step2.layers.map((l) => l.mlp), ['dense', 'moe', 'dense', 'moe']);
    assert.deepEqual(step2.moe, { numExperts: 4, topK: 8, normTopK: false, intermediateSize: 768 });
    assert.equal(step2.headDim, 16); // no head_dim default in Qwen3MoeConfig
  });

  it('qwen3_moe: use_sliding_window slides every layer', () => {
    const c = normalizeConfig(cfg('qwen3_moe', { num_experts: 4, use_sliding_window: true, sliding_window: 32 }));
    assert.deepEqual(c.layers.map((l) => l.window), [32, 32]);
  });
});

describe('normalizeConfig: gemma', () => {
  it('gemma2 defaults: head_dim 256, scale 256^-0.5, softcaps 50/30, alternate windows, sqrt(hidden) embedding', () => {
    const c = normalizeConfig(cfg('gemma2', { num_hidden_layers: 3, num_key_value_heads: undefined }));
    assert.equal(c.headDim, 256);
    assert.equal(c.numKvHeads, 4);
    assert.equal(c.attentionScale, 1 / 16);
    assert.equal(c.attnLogitSoftcap, 50);
    assert.equal(c.finalLogitSoftcap, 30);
    assert.deepEqual(c.layers.map((l) => l.window), [4096, 0, 4096]); // (i + 1) % 2 -> sliding
    assert.equal(c.embeddingScale, 8); // sqrt(64)
    assert.equal(c.embeddingScaleInWeightDtype, true);
    assert.equal(c.normPlacement, 'pre_post');
    assert.equal(c.normWeightOffset, 1);
    assert.equal(c.activation, 'gelu_tanh');
    assert.equal(c.tieWordEmbeddings, true);
    assert.deepEqual([c.bosTokenId, c.eosTokenIds, c.padTokenId], [2, [1], 0]);
    assert.equal(c.qkNorm, 'none');
  });

  it('gemma2 explicit: query_pre_attn_scalar, null softcap disables it, hidden_activation beats hidden_act', () => {
    const c = normalizeConfig(cfg('gemma2', {
      head_dim: 16, query_pre_attn_scalar: 32, attn_logit_softcapping: null, final_logit_softcapping: 25,
      hidden_activation: 'gelu_pytorch_tanh', hidden_act: 'silu', sliding_window: 8,
      layer_types: ['full_attention', 'sliding_attention'],
    }));
    close(c.attentionScale, 32 ** -0.5);
    assert.equal(c.attnLogitSoftcap, 0);
    assert.equal(c.finalLogitSoftcap, 25);
    assert.equal(c.activation, 'gelu_tanh');
    assert.deepEqual(c.layers.map((l) => l.window), [0, 8]);
  });

  it('gemma3_text old style: rope_theta for full layers, rope_local_base_freq for sliding, rope_scaling only on full', () => {
    const c = normalizeConfig(cfg('gemma3_text', {
      num_hidden_layers: 4, head_dim: 16, sliding_window: 8, sliding_window_pattern: 2,
      rope_theta: 1_000_000, rope_local_base_freq: 10_000, rope_scaling: { rope_type: 'linear', factor: 8 },
    }));
    assert.deepEqual(c.layers.map((l) => l.window), [8, 0, 8, 0]);
    assert.deepEqual(c.layers[1].rope, { type: 'linear', theta: 1_000_000, rotaryDim: 16, factor: 8, maxPositions: 131072 });
    assert.deepEqual(c.layers[0].rope, { type: 'default', theta: 10_000, rotaryDim: 16, factor: 1, maxPositions: 131072 });
    assert.equal(c.qkNorm, 'head');
    assert.equal(c.attnLogitSoftcap, 0);
    assert.equal(c.finalLogitSoftcap, 0);
  });

  it('gemma3_text defaults: pattern 6, thetas 1e6 / 1e4', () => {
    const c = normalizeConfig(cfg('gemma3_text', { num_hidden_layers: 7, head_dim: 16 }));
    assert.deepEqual(c.layers.map((l) => l.window), [4096, 4096, 4096, 4096, 4096, 0, 4096]);
    assert.equal(c.layers[5].rope.theta, 1_000_000);
    assert.equal(c.layers[0].rope.theta, 10_000);
  });

  it('gemma3_text new style: nested rope_parameters per layer type, explicit layer_types', () => {
    const c = normalizeConfig(cfg('gemma3_text', {
      num_hidden_layers: 3, head_dim: 16, sliding_window: 8, max_position_embeddings: 256,
      layer_types: ['sliding_attention', 'sliding_attention', 'full_attention'],
      rope_parameters: {
        full_attention: { rope_type: 'yarn', factor: 4, rope_theta: 1_000_000, original_max_position_embeddings: 64 },
        sliding_attention: { rope_type: 'default', rope_theta: 10_000 },
      },
    }));
    assert.deepEqual(c.layers.map((l) => l.window), [8, 8, 0]);
    assert.equal(c.layers[2].rope.type, 'yarn');
    assert.equal(c.layers[2].rope.originalMaxPositions, 64);
    assert.equal(c.layers[2].rope.truncate, true);
    assert.equal(c.layers[0].rope.type, 'default');
    assert.equal(c.layers[0].rope.theta, 10_000);
  });

  it('gemma3 wrapper: text_config, wrapper eos/tie, tensor prefix by checkpoint layout', () => {
    const raw = {
      model_type: 'gemma3', eos_token_id: [1, 106],
      text_config: { model_type: 'gemma3_text', ...base, head_dim: 16, sliding_window: 8, sliding_window_pattern: 2 },
      vision_config: { hidden_size: 16 },
    };
    // Hub / save_pretrained layout by default
    const saved = normalizeConfig(raw);
    assert.equal(saved.modelType, 'gemma3');
    assert.equal(saved.weightPrefix, 'language_model.model.');
    assert.equal(saved.lmHeadWeight, 'language_model.lm_head.weight');
    assert.deepEqual(saved.eosTokenIds, [1, 106]);
    assert.equal(saved.tieWordEmbeddings, true);
    assert.deepEqual(saved.layers.map((l) => l.window), [8, 0]);
    // transformers 5 module naming, when the checkpoint has it
    const modulePath = normalizeConfig(raw, { hasTensor: (n) => n === 'model.language_model.embed_tokens.weight' });
    assert.equal(modulePath.weightPrefix, 'model.language_model.');
    assert.equal(modulePath.lmHeadWeight, 'lm_head.weight');
    assert.throws(() => normalizeConfig({ ...raw, text_config: { head_dim: 16 } }), /text_config\.vocab_size/);
  });
});

describe('normalizeConfig: olmo2 and granite', () => {
  it('olmo2: post-norm, qk-norm over the whole projection', () => {
    const c = normalizeConfig(cfg('olmo2'));
    assert.equal(c.normPlacement, 'post');
    assert.equal(c.qkNorm, 'full');
    assert.equal(c.rmsNormEps, 1e-5);
    assert.deepEqual(c.eosTokenIds, [50279]);
    assert.equal(c.padTokenId, 1);
  });

  it('granite: multipliers replace the usual scales', () => {
    const c = normalizeConfig(cfg('granite', { embedding_multiplier: 12, logits_scaling: 8, residual_multiplier: 0.22, attention_multiplier: 0.0078125 }));
    assert.equal(c.embeddingScale, 12);
    assert.equal(c.logitScale, 1 / 8);
    assert.equal(c.residualScale, 0.22);
    assert.equal(c.attentionScale, 0.0078125);
    const d = normalizeConfig(cfg('granite'));
    assert.deepEqual([d.embeddingScale, d.logitScale, d.residualScale, d.attentionScale], [1, 1, 1, 1]);
  });
});

describe('normalizeConfig: errors', () => {
  it('unsupported model_type lists the supported ones', () => {
    assert.throws(() => normalizeConfig(cfg('bert')), (e: unknown) => {
      assert.ok(e instanceof ArtifactError);
      assert.match(e.message, /model_type "bert"/);
      for (const t of SUPPORTED_MODEL_TYPES) assert.ok(e.message.includes(t), t);
      return true;
    });
  });

  it('missing required fields name the field and file', () => {
    const { hidden_size: _, ...noHidden } = cfg('llama');
    assert.throws(() => normalizeConfig(noHidden, { file: '/m/config.json' }), /\/m\/config\.json is missing required field "hidden_size"/);
    assert.throws(() => normalizeConfig(cfg('llama', { num_hidden_layers: 0 })), /num_hidden_layers.*positive integer/);
    assert.throws(() => normalizeConfig(cfg('llama', { rope_scaling: { type: 'linear' } })), /missing required key "factor"/);
    assert.throws(() => normalizeConfig(cfg('llama', { rope_scaling: { type: 'llama3', factor: 8 } })), /low_freq_factor/);
    assert.throws(() => normalizeConfig(cfg('llama', { rope_scaling: { type: 'mrope' } })), /unsupported rope type "mrope"/);
    assert.throws(() => normalizeConfig(cfg('llama', { num_key_value_heads: 3 })), /not a multiple/);
    assert.throws(() => normalizeConfig([]), ArtifactError);
  });

  it('an unknown layer type is an error, not full attention', () => {
    assert.throws(
      () => normalizeConfig(cfg('gemma3_text', { layer_types: ['sliding_attention', 'chunked_attention'] })),
      /layer_types entry "chunked_attention"/,
    );
    assert.throws(() => normalizeConfig(cfg('gemma2', { layer_types: ['full_attention'] })), /one entry per layer \(2\)/);
  });
});
