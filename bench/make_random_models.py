#!/usr/bin/env python3
"""Random-weight model directories of other families, for the fit planner's GPU bench
(bench/fit-cuda.ts): a sliding-window Gemma-2, a Qwen3 MoE and small many-layer llamas whose
decode time is all per-step and per-layer overhead. A sibling of make_random_llama.py (whose
shard writer, bf16 source and tokenizer copying it reuses).

Presets (real published shapes where they name a model):
  gemma2-2b        google/gemma-2-2b: hidden 2304, 26 layers (alternating sliding window 4096 /
                   full), 8 heads of 256 on 4 KV heads, intermediate 9216, vocab 256000, tied
                   embeddings, soft-capping. 2.61 B params, 5.2 GB bf16.
  qwen3-moe-6l     Qwen/Qwen3-30B-A3B's layers (hidden 2048, 32 heads of 128 on 4 KV heads, 128
                   experts of intermediate 768, 8 per token, vocab 151936), 6 layers instead of 48:
                   4.36 B params, 8.7 GB bf16 (a token reads 8/128 of each layer's experts).
  llama-probe      a llama with hidden 256, intermediate 512, 4 heads of 64 on 2 KV heads, vocab
                   8192; --layers N (default 32). Reads ~0.6 MB a layer: its decode step time is
                   overhead (launches, dispatch), which the bench fits per step and per layer.
  qwen3-0.6b       Qwen/Qwen3-0.6B's layers (hidden 1024, 28 layers, 16 heads of 128 on 8 KV heads,
                   intermediate 3072, tied embeddings) with the demo tokenizer's 8192-token vocab:
                   0.45 B params, 0.9 GB bf16; the CPU comparison with llama.cpp (bench/peers/llama-cpp.ts).
  qwen3-8b         Qwen/Qwen3-8B's layers (hidden 4096, 32 heads of 128 on 8 KV heads, intermediate 12288)
                   with the same vocab, untied; --layers N of its 36 (2: 0.42 B params, 0.84 GB bf16).

usage: python3 bench/make_random_models.py --preset NAME --out DIR [--layers N] [--tiny]
                                           [--tokenizer models/demo/tokenizer.json] [--std 0.02] [--seed 0]
--tiny keeps the family and its config fields but shrinks the shapes, to test the bench's plumbing
off the GPU machine (numpy is enough then).
"""
import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_random_llama as mrl  # noqa: E402  (header_bytes, plan_shards, make_source, nbytes)


def gemma2_2b(tiny):
    c = {
        'architectures': ['Gemma2ForCausalLM'], 'model_type': 'gemma2', 'vocab_size': 256000, 'hidden_size': 2304,
        'intermediate_size': 9216, 'num_hidden_layers': 26, 'num_attention_heads': 8, 'num_key_value_heads': 4,
        'head_dim': 256, 'max_position_embeddings': 8192, 'rms_norm_eps': 1e-6, 'rope_theta': 10000.0,
        'hidden_activation': 'gelu_pytorch_tanh', 'query_pre_attn_scalar': 256, 'sliding_window': 4096,
        'attn_logit_softcapping': 50.0, 'final_logit_softcapping': 30.0, 'tie_word_embeddings': True,
        'attention_bias': False, 'bos_token_id': 2, 'eos_token_id': 1, 'pad_token_id': 0, 'torch_dtype': 'bfloat16',
    }
    if tiny:
        c.update(vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=64)
    return c


def qwen3_moe_6l(tiny):
    c = {
        'architectures': ['Qwen3MoeForCausalLM'], 'model_type': 'qwen3_moe', 'vocab_size': 151936, 'hidden_size': 2048,
        'intermediate_size': 6144, 'moe_intermediate_size': 768, 'num_hidden_layers': 6, 'num_attention_heads': 32,
        'num_key_value_heads': 4, 'head_dim': 128, 'num_experts': 128, 'num_experts_per_tok': 8, 'norm_topk_prob': True,
        'decoder_sparse_step': 1, 'mlp_only_layers': [], 'max_position_embeddings': 40960, 'rms_norm_eps': 1e-6,
        'rope_theta': 1000000.0, 'hidden_act': 'silu', 'tie_word_embeddings': False, 'attention_bias': False,
        'bos_token_id': 151643, 'eos_token_id': 151645, 'torch_dtype': 'bfloat16',
    }
    if tiny:
        c.update(vocab_size=8192, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                 max_position_embeddings=4096)
    return c


def llama_probe(tiny):
    c = {
        'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'vocab_size': 8192, 'hidden_size': 256,
        'intermediate_size': 512, 'num_hidden_layers': 32, 'num_attention_heads': 4, 'num_key_value_heads': 2,
        'head_dim': 64, 'max_position_embeddings': 8192, 'rms_norm_eps': 1e-5, 'rope_theta': 10000.0,
        'hidden_act': 'silu', 'tie_word_embeddings': True, 'attention_bias': False, 'mlp_bias': False,
        'bos_token_id': 1, 'eos_token_id': 2, 'torch_dtype': 'bfloat16',
    }
    if tiny:
        c.update(hidden_size=64, intermediate_size=128, head_dim=16)
    return c


def qwen3_0_6b(tiny):
    # Qwen/Qwen3-0.6B's layers with the demo model's 8k vocabulary (the tokenizer the directory gets),
    # so that llama.cpp tokenizes and runs the same weights: 0.45 B params, 0.9 GB bf16.
    c = {
        'architectures': ['Qwen3ForCausalLM'], 'model_type': 'qwen3', 'vocab_size': 8192, 'hidden_size': 1024,
        'intermediate_size': 3072, 'num_hidden_layers': 28, 'num_attention_heads': 16, 'num_key_value_heads': 8,
        'head_dim': 128, 'max_position_embeddings': 40960, 'rms_norm_eps': 1e-6, 'rope_theta': 1000000.0,
        'hidden_act': 'silu', 'tie_word_embeddings': True, 'attention_bias': False,
        'bos_token_id': None, 'eos_token_id': 2, 'pad_token_id': 0, 'torch_dtype': 'bfloat16',
    }
    if tiny:
        c.update(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, max_position_embeddings=4096)
    return c


def qwen3_8b(tiny):
    # Qwen/Qwen3-8B's layers (hidden 4096, intermediate 12288, 32 heads of 128 on 8 KV heads) with the
    # demo model's 8k vocabulary; --layers N keeps N of its 36 (2: 0.42 B params, 0.84 GB bf16)
    c = qwen3_0_6b(False)
    c.update(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
             num_key_value_heads=8, tie_word_embeddings=False)
    if tiny:
        c.update(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, max_position_embeddings=4096)
    return c


PRESETS = {'gemma2-2b': gemma2_2b, 'qwen3-moe-6l': qwen3_moe_6l, 'llama-probe': llama_probe, 'qwen3-0.6b': qwen3_0_6b,
           'qwen3-8b': qwen3_8b}


def tensor_specs(c):
    """(name, shape, kind) in the order transformers saves them; kind 'ones' / 'zeros' / 'randn'."""
    D, V, L = c['hidden_size'], c['vocab_size'], c['num_hidden_layers']
    hd = c['head_dim']
    q, kv = c['num_attention_heads'] * hd, c['num_key_value_heads'] * hd
    t = c['model_type']
    # gemma norms scale by (1 + w): zeros are the identity, as ones are for the others
    norm = 'zeros' if t == 'gemma2' else 'ones'
    specs = [('model.embed_tokens.weight', (V, D), 'randn')]
    for i in range(L):
        p = f'model.layers.{i}.'
        specs += [
            (p + 'input_layernorm.weight', (D,), norm),
            (p + 'self_attn.q_proj.weight', (q, D), 'randn'),
            (p + 'self_attn.k_proj.weight', (kv, D), 'randn'),
            (p + 'self_attn.v_proj.weight', (kv, D), 'randn'),
            (p + 'self_attn.o_proj.weight', (D, q), 'randn'),
            (p + 'post_attention_layernorm.weight', (D,), norm),
        ]
        if t in ('qwen3', 'qwen3_moe'):
            specs += [(p + 'self_attn.q_norm.weight', (hd,), 'ones'), (p + 'self_attn.k_norm.weight', (hd,), 'ones')]
        if t == 'gemma2':
            specs += [(p + 'pre_feedforward_layernorm.weight', (D,), norm),
                      (p + 'post_feedforward_layernorm.weight', (D,), norm)]
        if t == 'qwen3_moe':
            E, I = c['num_experts'], c['moe_intermediate_size']
            specs.append((p + 'mlp.gate.weight', (E, D), 'randn'))
            for e in range(E):
                specs += [(p + f'mlp.experts.{e}.gate_proj.weight', (I, D), 'randn'),
                          (p + f'mlp.experts.{e}.up_proj.weight', (I, D), 'randn'),
                          (p + f'mlp.experts.{e}.down_proj.weight', (D, I), 'randn')]
        else:
            I = c['intermediate_size']
            specs += [(p + 'mlp.gate_proj.weight', (I, D), 'randn'), (p + 'mlp.up_proj.weight', (I, D), 'randn'),
                      (p + 'mlp.down_proj.weight', (D, I), 'randn')]
    specs.append(('model.norm.weight', (D,), norm))
    if not c['tie_word_embeddings']:
        specs.append(('lm_head.weight', (V, D), 'randn'))
    return specs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--preset', required=True, choices=sorted(PRESETS))
    ap.add_argument('--out', required=True)
    ap.add_argument('--layers', type=int)
    ap.add_argument('--tokenizer', default='models/demo/tokenizer.json')
    ap.add_argument('--std', type=float, default=0.02)
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--tiny', action='store_true')
    ap.add_argument('--shard-bytes', type=int, default=mrl.SHARD_BYTES)
    a = ap.parse_args()

    t0 = time.time()
    c = PRESETS[a.preset](a.tiny)
    if a.layers:
        c['num_hidden_layers'] = a.layers
    os.makedirs(a.out, exist_ok=True)
    for f in os.listdir(a.out):  # a previous run's shards would be merged in otherwise
        if f.endswith('.safetensors') or f.endswith('.safetensors.index.json'):
            os.remove(os.path.join(a.out, f))
    with open(os.path.join(a.out, 'config.json'), 'w') as f:
        json.dump(c, f, indent=2)
    with open(os.path.join(a.out, 'generation_config.json'), 'w') as f:
        json.dump({'bos_token_id': c['bos_token_id'], 'eos_token_id': c['eos_token_id'], 'do_sample': False}, f, indent=2)
    shutil.copyfile(a.tokenizer, os.path.join(a.out, 'tokenizer.json'))
    tc = os.path.join(os.path.dirname(a.tokenizer), 'tokenizer_config.json')
    if os.path.exists(tc):
        shutil.copyfile(tc, os.path.join(a.out, 'tokenizer_config.json'))

    randn, how = mrl.make_source(a.seed, a.std)

    def gen(shape, kind):
        if kind != 'zeros':
            return randn(shape, kind)
        z = randn(shape, 'ones')
        z[...] = 0  # bf16 bit pattern of +0
        return z

    specs = tensor_specs(c)
    shards = mrl.plan_shards(specs, a.shard_bytes)
    total = sum(mrl.nbytes(s[1]) for s in specs)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f'model-{i + 1:05d}-of-{len(shards):05d}.safetensors'
        with open(os.path.join(a.out, fname), 'wb') as f:
            f.write(mrl.header_bytes(shard))
            for name, shape, kind in shard:
                arr = gen(shape, kind)
                assert arr.nbytes == mrl.nbytes(shape), name
                f.write(memoryview(arr).cast('B'))
                weight_map[name] = fname
    with open(os.path.join(a.out, 'model.safetensors.index.json'), 'w') as f:
        json.dump({'metadata': {'total_size': total}, 'weight_map': weight_map}, f, indent=2)
    dt = time.time() - t0
    print(f'wrote {a.out}: {"tiny " if a.tiny else ""}{a.preset} ({c["model_type"]}, {c["num_hidden_layers"]} layers), '
          f'{total / 2 / 1e9:.3f} B params, {total / 1e9:.2f} GB bf16 in {len(shards)} shards, {how}, {dt:.1f} s')


if __name__ == '__main__':
    main()
