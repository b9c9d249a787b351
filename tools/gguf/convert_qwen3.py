#!/usr/bin/env python3
"""Convert a Hugging Face Qwen3 model directory (config.json, *.safetensors, tokenizer.json)
to GGUF with llama.cpp's `qwen3` architecture names, so that llama.cpp can run the same
weights as llmts (bench/peers/llama-cpp.ts).

    pip install gguf numpy
    python3 tools/gguf/convert_qwen3.py models/demo /tmp/demo-bf16.gguf [--outtype bf16|f16|f32|q8_0|q4_0]

Written against the `gguf` package's GGUFWriter and its name tables (gguf.TENSOR_NAMES,
gguf.Keys); no llama.cpp code. Scope: dense Qwen3 (model_type "qwen3"), byte-level BPE
tokenizers with merges. Anything else is refused rather than converted approximately.

Precision: matrices keep the source's class by default (bf16 -> bf16, bit-exact copy);
1-D tensors (RMSNorm weights) are written as f32, as llama.cpp's own converter does
(its CPU ops take f32 norms). `--outtype f16` rounds bf16 to f16 (round-to-nearest-even,
values outside f16's range saturate); `--outtype f32` widens exactly; `--outtype q8_0|q4_0`
quantizes every matrix with gguf.quants.quantize (llama.cpp's reference quantizers).

Layout: safetensors stores row-major [out, in]; GGUF lists dimensions fastest-first, and
the writer reverses numpy's shape, so the bytes are copied unchanged. Qwen3's RoPE is the
rotate-half ("NeoX") form, which is what llama.cpp uses for qwen3, so q/k rows are not
permuted (unlike llama.cpp's `llama` architecture).
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np
import gguf

ST_DTYPES = {'BF16': np.uint16, 'F16': np.float16, 'F32': np.float32}


def read_safetensors(model_dir: Path) -> dict[str, tuple[str, np.ndarray]]:
    """name -> (safetensors dtype, array). BF16 arrives as its raw uint16 bits."""
    files = sorted(model_dir.glob('*.safetensors'))
    if not files:
        sys.exit(f'convert_qwen3: no *.safetensors in {model_dir}')
    out: dict[str, tuple[str, np.ndarray]] = {}
    for path in files:
        data = path.read_bytes()
        (n,) = struct.unpack('<Q', data[:8])
        header = json.loads(data[8:8 + n])
        base = 8 + n
        for name, info in header.items():
            if name == '__metadata__':
                continue
            dt = info['dtype']
            if dt not in ST_DTYPES:
                sys.exit(f'convert_qwen3: {name}: unsupported dtype {dt}')
            begin, end = info['data_offsets']
            arr = np.frombuffer(data, dtype=ST_DTYPES[dt], count=(end - begin) // np.dtype(ST_DTYPES[dt]).itemsize,
                                offset=base + begin).reshape(info['shape'])
            out[name] = (dt, arr)
    return out


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def to_f32(dt: str, arr: np.ndarray) -> np.ndarray:
    return bf16_bits_to_f32(arr) if dt == 'BF16' else arr.astype(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even f32 -> bf16 bits (NaN kept quiet)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)


def matrix(dt: str, arr: np.ndarray, outtype: str) -> tuple[np.ndarray, gguf.GGMLQuantizationType | None]:
    """A 2-D weight in the requested output class: (array, raw_dtype for the writer)."""
    if outtype == 'bf16':
        bits = arr if dt == 'BF16' else f32_to_bf16_bits(to_f32(dt, arr))
        return np.ascontiguousarray(bits), gguf.GGMLQuantizationType.BF16
    if outtype == 'f16':
        f32 = to_f32(dt, arr)
        lim = float(np.finfo(np.float16).max)
        return np.clip(f32, -lim, lim).astype(np.float16), None
    if outtype in ('q8_0', 'q4_0'):
        qt = gguf.GGMLQuantizationType.Q8_0 if outtype == 'q8_0' else gguf.GGMLQuantizationType.Q4_0
        return gguf.quants.quantize(to_f32(dt, arr), qt), qt
    return to_f32(dt, arr), None


def tokenizer_pre(tok: dict) -> str:
    """llama.cpp pre-tokenizer name for the split regex tokenizer.json really uses.

    A bare ByteLevel pre-tokenizer with use_regex splits with GPT-2's pattern ("gpt-2");
    Qwen2/3's released tokenizers instead put their own Split regex first ("qwen2")."""
    pre = tok.get('pre_tokenizer') or {}
    if pre.get('type') == 'ByteLevel' and pre.get('use_regex', True):
        return 'gpt-2'
    if pre.get('type') == 'Sequence':
        for p in pre.get('pretokenizers', []):
            if p.get('type') == 'Split':
                pat = p.get('pattern', {}).get('Regex', '')
                if r'\p{N}' in pat and "(?i:'s|'t|'re|'ve|'m|'ll|'d)" in pat:
                    return 'qwen2'
    sys.exit('convert_qwen3: unrecognised pre-tokenizer; pass --pre explicitly')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('model_dir', type=Path)
    ap.add_argument('out', type=Path)
    ap.add_argument('--outtype', choices=['bf16', 'f16', 'f32', 'q8_0', 'q4_0'], default='bf16')
    ap.add_argument('--pre', help='tokenizer.ggml.pre (default: derived from tokenizer.json)')
    args = ap.parse_args()

    cfg = json.loads((args.model_dir / 'config.json').read_text())
    if cfg.get('model_type') != 'qwen3':
        sys.exit(f"convert_qwen3: model_type {cfg.get('model_type')!r} is not qwen3")
    rope = cfg.get('rope_parameters') or {}
    rope_theta = rope.get('rope_theta', cfg.get('rope_theta', 10000.0))
    if (rope.get('rope_type') or 'default') != 'default' or cfg.get('rope_scaling'):
        sys.exit('convert_qwen3: only default RoPE is handled')
    if cfg.get('use_sliding_window'):
        sys.exit('convert_qwen3: sliding-window attention is not handled')
    n_layer = cfg['num_hidden_layers']
    n_head = cfg['num_attention_heads']
    n_kv = cfg.get('num_key_value_heads', n_head)
    head_dim = cfg.get('head_dim') or cfg['hidden_size'] // n_head
    tied = cfg.get('tie_word_embeddings', False)

    tok = json.loads((args.model_dir / 'tokenizer.json').read_text())
    model = tok['model']
    if model.get('type') != 'BPE' or model.get('byte_fallback'):
        sys.exit('convert_qwen3: tokenizer.json is not a byte-level BPE')
    vocab: dict[str, int] = dict(model['vocab'])
    specials = {t['content']: t for t in tok.get('added_tokens', [])}
    for content, t in specials.items():
        vocab.setdefault(content, t['id'])
    n_vocab = cfg['vocab_size']
    by_id = {i: s for s, i in vocab.items()}
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n_vocab):
        if i in by_id:
            s = by_id[i]
            tokens.append(s)
            sp = specials.get(s)
            types.append(gguf.TokenType.CONTROL if sp and sp.get('special') else
                         gguf.TokenType.USER_DEFINED if sp else gguf.TokenType.NORMAL)
        else:  # embedding rows past the tokenizer's vocabulary
            tokens.append(f'[PAD{i}]')
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else ' '.join(m) for m in model['merges']]

    tcfg_path = args.model_dir / 'tokenizer_config.json'
    tcfg = json.loads(tcfg_path.read_text()) if tcfg_path.exists() else {}

    def special_id(name: str) -> int | None:
        v = tcfg.get(name)
        if isinstance(v, dict):
            v = v.get('content')
        return vocab.get(v) if isinstance(v, str) else None

    eos = cfg.get('eos_token_id')
    eos = eos[0] if isinstance(eos, list) else eos
    if eos is None:
        eos = special_id('eos_token')
    pad = cfg.get('pad_token_id')
    if pad is None:
        pad = special_id('pad_token')
    bos = cfg.get('bos_token_id')
    if bos is None:  # Qwen's convention: <|endoftext|> stands in for BOS, which is never added
        bos = vocab.get('<|endoftext|>', eos)

    arch = gguf.MODEL_ARCH.QWEN3
    arch_name = gguf.MODEL_ARCH_NAMES[arch]
    names = gguf.TENSOR_NAMES
    T = gguf.MODEL_TENSOR

    w = gguf.GGUFWriter(args.out, arch_name)
    w.add_name(args.model_dir.resolve().name)
    w.add_file_type({'bf16': gguf.LlamaFileType.MOSTLY_BF16, 'f16': gguf.LlamaFileType.MOSTLY_F16,
                     'f32': gguf.LlamaFileType.ALL_F32, 'q8_0': gguf.LlamaFileType.MOSTLY_Q8_0,
                     'q4_0': gguf.LlamaFileType.MOSTLY_Q4_0}[args.outtype])
    w.add_context_length(cfg['max_position_embeddings'])
    w.add_embedding_length(cfg['hidden_size'])
    w.add_block_count(n_layer)
    w.add_feed_forward_length(cfg['intermediate_size'])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg['rms_norm_eps'])
    w.add_rope_freq_base(float(rope_theta))

    w.add_tokenizer_model('gpt2')
    w.add_tokenizer_pre(args.pre or tokenizer_pre(tok))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    if pad is not None:
        w.add_pad_token_id(pad)
    w.add_add_bos_token(False)  # the tokenizer's post-processor adds nothing
    chat_tpl = args.model_dir / 'chat_template.jinja'
    if chat_tpl.exists():
        w.add_chat_template(chat_tpl.read_text())
    elif isinstance(tcfg.get('chat_template'), str):
        w.add_chat_template(tcfg['chat_template'])

    st = read_safetensors(args.model_dir)
    used: set[str] = set()

    def put(hf: str, gg: str) -> None:
        gg += '.weight'  # llama.cpp looks tensors up as <base name>.weight
        if hf not in st:
            sys.exit(f'convert_qwen3: missing tensor {hf}')
        used.add(hf)
        dt, arr = st[hf]
        if arr.ndim == 1:
            w.add_tensor(gg, np.ascontiguousarray(to_f32(dt, arr)))
        else:
            data, raw = matrix(dt, arr, args.outtype)
            w.add_tensor(gg, data, raw_dtype=raw)

    put('model.embed_tokens.weight', names[T.TOKEN_EMBD])
    put('model.norm.weight', names[T.OUTPUT_NORM])
    if not tied:
        put('lm_head.weight', names[T.OUTPUT])
    # tied: llama.cpp's qwen3 loader falls back to token_embd when `output` is absent
    per_layer = {
        'input_layernorm': T.ATTN_NORM,
        'self_attn.q_proj': T.ATTN_Q,
        'self_attn.k_proj': T.ATTN_K,
        'self_attn.v_proj': T.ATTN_V,
        'self_attn.o_proj': T.ATTN_OUT,
        'self_attn.q_norm': T.ATTN_Q_NORM,
        'self_attn.k_norm': T.ATTN_K_NORM,
        'post_attention_layernorm': T.FFN_NORM,
        'mlp.gate_proj': T.FFN_GATE,
        'mlp.up_proj': T.FFN_UP,
        'mlp.down_proj': T.FFN_DOWN,
    }
    for i in range(n_layer):
        for hf, t in per_layer.items():
            put(f'model.layers.{i}.{hf}.weight', names[t].format(bid=i))
    rest = sorted(set(st) - used - ({'lm_head.weight'} if tied else set()))
    if rest:
        sys.exit(f'convert_qwen3: tensors not converted: {rest[:5]}')

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f'wrote {args.out} ({args.outtype} matrices, f32 norms, {len(used)} tensors, '
          f'{n_vocab} tokens, {len(merges)} merges, pre={args.pre or tokenizer_pre(tok)})')


if __name__ == '__main__':
    main()
