#!/usr/bin/env python3
"""Writes a random-weight Llama-3.1-8B model directory at the real shapes, for benchmarks.

config.json is Llama-3.1-8B's (hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate 14336,
vocab 128256, rope_theta 500000 with llama3 scaling, max_position_embeddings 131072); weights are
bf16 in 5 GB safetensors shards with model.safetensors.index.json, as the real checkpoint ships.
Matrices and embeddings are N(0, std^2) (std 0.02, transformers' initializer_range: activations
stay finite through 32 layers), norms are ones. The tensors are drawn on the GPU when there is one.

The benchmarks feed token ids, so the tokenizer only has to load: --tokenizer copies a
tokenizer.json (and the tokenizer_config.json beside it) whose vocabulary may be smaller than
vocab_size; ids past it decode to nothing in llmts, and transformers' model never reads it.

usage: python3 bench/make_random_llama.py --out DIR [--tokenizer models/demo/tokenizer.json]
                                          [--std 0.02] [--seed 0] [--tiny] [--fp8]
--tiny keeps the vocabulary and config fields but shrinks the layers, to test this script and the
benchmarks' plumbing off the GPU machine. --fp8 writes the layers' seven projections as an FP8
checkpoint does (transformers' FineGrainedFP8, quant_method "fp8"): F8_E4M3 weights, each 128 x 128
block scaled by amax / 448 (F32 weight_scale_inv, [ceil(N / 128), ceil(K / 128)]); embeddings,
lm_head and norms stay bf16. It needs torch (float8_e4m3fn).
"""
import argparse
import json
import os
import shutil
import struct
import time

SHARD_BYTES = 5_000_000_000


def llama31_8b_config(tiny):
    c = {
        'architectures': ['LlamaForCausalLM'],
        'attention_bias': False,
        'attention_dropout': 0.0,
        'bos_token_id': 128000,
        'eos_token_id': [128001, 128008, 128009],
        'head_dim': 128,
        'hidden_act': 'silu',
        'hidden_size': 4096,
        'initializer_range': 0.02,
        'intermediate_size': 14336,
        'max_position_embeddings': 131072,
        'mlp_bias': False,
        'model_type': 'llama',
        'num_attention_heads': 32,
        'num_hidden_layers': 32,
        'num_key_value_heads': 8,
        'pretraining_tp': 1,
        'rms_norm_eps': 1e-05,
        'rope_scaling': {
            'factor': 8.0,
            'high_freq_factor': 4.0,
            'low_freq_factor': 1.0,
            'original_max_position_embeddings': 8192,
            'rope_type': 'llama3',
        },
        'rope_theta': 500000.0,
        'tie_word_embeddings': False,
        'torch_dtype': 'bfloat16',
        'use_cache': True,
        'vocab_size': 128256,
    }
    if tiny:
        c.update(hidden_size=64, head_dim=16, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128)
    return c


FP8_PROJECTIONS = ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj')
FP8_BLOCK = 128
KIND_DTYPE = {'ones': ('BF16', 2), 'randn': ('BF16', 2), 'fp8': ('F8_E4M3', 1), 'scale': ('F32', 4)}


def fp8_specs(specs):
    """The projections as F8_E4M3 weights, each followed by its block scales."""
    out = []
    for name, shape, kind in specs:
        if kind == 'randn' and name.split('.')[-2] in FP8_PROJECTIONS:
            n, k = shape
            out += [(name, shape, 'fp8'), (name + '_scale_inv', (-(-n // FP8_BLOCK), -(-k // FP8_BLOCK)), 'scale')]
        else:
            out.append((name, shape, kind))
    return out


def tensor_specs(c):
    """(name, shape, kind) in the checkpoint's order; kind 'ones' for norms, 'randn' otherwise."""
    D, I, V = c['hidden_size'], c['intermediate_size'], c['vocab_size']
    hd = c['head_dim']
    q, kv = c['num_attention_heads'] * hd, c['num_key_value_heads'] * hd
    specs = [('model.embed_tokens.weight', (V, D), 'randn')]
    for i in range(c['num_hidden_layers']):
        p = f'model.layers.{i}.'
        specs += [
            (p + 'input_layernorm.weight', (D,), 'ones'),
            (p + 'self_attn.q_proj.weight', (q, D), 'randn'),
            (p + 'self_attn.k_proj.weight', (kv, D), 'randn'),
            (p + 'self_attn.v_proj.weight', (kv, D), 'randn'),
            (p + 'self_attn.o_proj.weight', (D, q), 'randn'),
            (p + 'post_attention_layernorm.weight', (D,), 'ones'),
            (p + 'mlp.gate_proj.weight', (I, D), 'randn'),
            (p + 'mlp.up_proj.weight', (I, D), 'randn'),
            (p + 'mlp.down_proj.weight', (D, I), 'randn'),
        ]
    specs += [('model.norm.weight', (D,), 'ones'), ('lm_head.weight', (V, D), 'randn')]
    return specs


def nbytes(shape, kind='randn'):
    n = KIND_DTYPE[kind][1]
    for s in shape:
        n *= s
    return n


def plan_shards(specs, limit):
    shards, cur, size = [], [], 0
    for s in specs:
        b = nbytes(s[1], s[2])
        if cur and size + b > limit:
            shards.append(cur)
            cur, size = [], 0
        cur.append(s)
        size += b
    if cur:
        shards.append(cur)
    return shards


def header_bytes(shard):
    h, off = {}, 0
    for name, shape, kind in shard:
        b = nbytes(shape, kind)
        h[name] = {'dtype': KIND_DTYPE[kind][0], 'shape': list(shape), 'data_offsets': [off, off + b]}
        off += b
    h['__metadata__'] = {'format': 'pt'}
    raw = json.dumps(h, separators=(',', ':')).encode()
    raw += b' ' * (-len(raw) % 8)  # tensor data starts 8-byte aligned
    return struct.pack('<Q', len(raw)) + raw


def make_source(seed, std):
    """Returns gen(shape, kind) -> bytes-like of bf16 little-endian values, and a description."""
    try:
        import torch
        dev = 'cuda' if torch.cuda.is_available() else 'cpu'
        g = torch.Generator(device=dev)
        g.manual_seed(seed)

        scales = []  # an fp8 weight's block scales, written as the next tensor

        def gen(shape, kind):
            if kind == 'scale':
                return scales.pop().contiguous().view(torch.int32).numpy()
            if kind == 'fp8':
                w = torch.randn(shape, generator=g, device=dev, dtype=torch.float32).mul_(std)
                w = w.to(torch.bfloat16).float()  # the bf16 model's values, quantized
                n, k = shape
                bn, bk = -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)
                pad = torch.zeros(bn * FP8_BLOCK, bk * FP8_BLOCK, device=dev)
                pad[:n, :k] = w.abs()
                amax = pad.view(bn, FP8_BLOCK, bk, FP8_BLOCK).amax(dim=(1, 3)).clamp_(min=1e-12)
                s = amax / 448.0
                full = s.repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)[:n, :k]
                q = (w / full).clamp_(-448.0, 448.0).to(torch.float8_e4m3fn)
                scales.append(s.cpu())
                return q.contiguous().view(torch.uint8).cpu().numpy()
            if kind == 'ones':
                t = torch.ones(shape, dtype=torch.bfloat16)
            elif dev == 'cuda':
                t = torch.randn(shape, generator=g, device=dev, dtype=torch.bfloat16).mul_(std).cpu()
            else:
                t = torch.randn(shape, generator=g, dtype=torch.float32).mul_(std).to(torch.bfloat16)
            return t.contiguous().view(torch.int16).numpy()
        return gen, f'torch {torch.__version__} on {dev}'
    except ImportError:
        import numpy as np
        rng = np.random.default_rng(seed)

        def gen(shape, kind):
            if kind in ('fp8', 'scale'):
                raise SystemExit('--fp8 needs torch (float8_e4m3fn)')
            f = np.ones(shape, np.float32) if kind == 'ones' else (rng.standard_normal(shape, np.float32) * std)
            u = f.view(np.uint32)
            return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
        return gen, 'numpy (no torch)'


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--out', required=True)
    ap.add_argument('--tokenizer', default='models/demo/tokenizer.json')
    ap.add_argument('--std', type=float, default=0.02)
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--tiny', action='store_true')
    ap.add_argument('--fp8', action='store_true')
    ap.add_argument('--shard-bytes', type=int, default=SHARD_BYTES)
    a = ap.parse_args()

    t0 = time.time()
    c = llama31_8b_config(a.tiny)
    if a.fp8:
        c['quantization_config'] = {'quant_method': 'fp8', 'fmt': 'e4m3', 'activation_scheme': 'dynamic',
                                    'weight_block_size': [FP8_BLOCK, FP8_BLOCK]}
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

    gen, how = make_source(a.seed, a.std)
    specs = fp8_specs(tensor_specs(c)) if a.fp8 else tensor_specs(c)
    shards = plan_shards(specs, a.shard_bytes)
    total = sum(nbytes(s[1], s[2]) for s in specs)
    params = sum(nbytes(s[1], 'randn') // 2 for s in specs if s[2] != 'scale')
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f'model-{i + 1:05d}-of-{len(shards):05d}.safetensors'
        with open(os.path.join(a.out, fname), 'wb') as f:
            f.write(header_bytes(shard))
            for name, shape, kind in shard:
                arr = gen(shape, kind)
                assert arr.nbytes == nbytes(shape, kind), name
                f.write(memoryview(arr).cast('B'))
                weight_map[name] = fname
    with open(os.path.join(a.out, 'model.safetensors.index.json'), 'w') as f:
        json.dump({'metadata': {'total_size': total}, 'weight_map': weight_map}, f, indent=2)
    dt = time.time() - t0
    print(f'wrote {a.out}: {"tiny " if a.tiny else ""}Llama-3.1-8B shapes, {params / 1e9:.3f} B params, '
          f'{total / 1e9:.2f} GB {"fp8 projections" if a.fp8 else "bf16"} in {len(shards)} shards, std {a.std}, {how}, {dt:.1f} s '
          f'({total / dt / 1e9:.2f} GB/s)')


if __name__ == '__main__':
    main()
