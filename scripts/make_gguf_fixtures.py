#!/usr/bin/env python3
"""Build the GGUF oracle fixtures in test/fixtures/gguf/ (not run in CI: it needs PyTorch).

    python3 scripts/make_gguf_fixtures.py [--out test/fixtures/gguf] [--only llama_q8_0,qwen3_f16]

Needs torch, transformers 5.x, tokenizers, safetensors, numpy and gguf (gguf-py). What it writes:

* <name>.gguf + <name>.reference.json for each fixture in FIXTURES: an existing tiny fixture
  checkpoint of test/fixtures/ converted to GGUF the way llama.cpp's convert_hf_to_gguf.py would
  (its metadata keys, tensor names, q/k row permutation for llama/granite, gemma norms stored as
  1 + w, phi3's fused attn_qkv and ffn_up, stacked ffn_*_exps experts), every 2-D weight in the
  fixture's ggml type (gguf.quants.quantize), norms and routers F32. `kquant` is a fresh random
  Qwen3-shaped model with hidden size 256 (K-quant blocks are 256 wide) whose matrices are random
  valid blocks of Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS and IQ4_NL: gguf-py can only dequantize those.
* dequant-samples.gguf: for each ggml type, random valid blocks and, beside them as F32 tensors
  "<TYPE>.expected", gguf.quants.dequantize's output (the dequantizers' bit-exact reference).
* vocab-<arch>.gguf + .reference.json: vocabulary-only files with a SentencePiece ("llama")
  tokenizer under the llama, gemma2 and phi3 architectures, and transformers' ids for them.

References (fp32, eager attention, CPU): greedy steps with top-5 logprobs of the raw logits for
each prompt, and the tokenizer's ids. Method "transformers-gguf" loads the GGUF with
`from_pretrained(dir, gguf_file=...)` (which dequantizes with gguf-py); method "hf-class" saves the
dequantized tensors, mapped back by this script, as a Hugging Face checkpoint with the config the
GGUF metadata states (llama.cpp's reading of it) and loads that, for the files transformers cannot
load or reads differently (listed per fixture in the reference's `method_note`). Where both run,
the script records the largest logit difference between them (`methods_max_abs_logit_diff`).

transformers' GGUF support used here, as of 5.18: accelerate is required by from_pretrained's
GGUF path only through a guard (patched off below: nothing of accelerate runs for a CPU fp32
load); its qwen3 key map lacks attention.key_length (added below: real Qwen3 models have the
default 128). Which architectures it maps at all: GGUF_SUPPORTED_ARCHITECTURES in
transformers/modeling_gguf_pytorch_utils.py (no olmo2, granite, or llama with experts).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
import torch
import transformers
import transformers.modeling_utils as modeling_utils
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

modeling_utils.is_accelerate_available = lambda: True
GGUF_CONFIG_MAPPING["qwen3"]["attention.key_length"] = "head_dim"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "test", "fixtures")
STEPS = 16
PROMPT_LENGTHS = [6, 24, 48]

# name, source fixture, ggml type of the matrices, the config changes the GGUF implies, notes
FIXTURES = [
    ("llama_q8_0", "llama", Q.Q8_0, {}, "llama arch, q/k permuted"),
    ("mistral_q4_0", "mistral", Q.Q4_0, {}, "llama arch + llama.attention.sliding_window 8 (-> mistral), head_dim 24; transformers maps no GGUF mistral"),
    ("qwen2_q4_1", "qwen2", Q.Q4_1, {"use_sliding_window": False, "layer_types": ["full_attention"] * 4},
     "qkv bias, tied; GGUF qwen2 has no sliding window, so the reference attends fully"),
    ("qwen3_q5_0", "qwen3", Q.Q5_0, {}, "q/k norm per head, head_dim 32, tied"),
    ("qwen3_f16", "qwen3", Q.F16, {}, "F16 matrices"),
    ("gemma2_q5_1", "gemma2", Q.Q5_1, {"query_pre_attn_scalar": 16},
     "norms stored 1 + w, softcaps; GGUF states no query_pre_attn_scalar: llama.cpp uses head_dim (16), transformers its default 256"),
    ("gemma3_q8_0", "gemma3_text", Q.Q8_0, {"layer_types": ["sliding_attention"] * 4},
     "gemma3 arch: llama.cpp's layer pattern (every 6th layer full) makes all 4 layers sliding, local rope base 10000; transformers uses query_pre_attn_scalar 256 and ignores rope.scaling"),
    ("phi3_q4_0", "phi3", Q.Q4_0, {}, "fused attn_qkv and ffn_up (gate, up rows), rope.dimension_count 8 of 16, sliding window 8; transformers maps neither rope.dimension_count nor the window"),
    ("olmo2_bf16", "olmo2", Q.BF16, {}, "BF16 matrices, post-norms, q/k norm over the whole projection"),
    ("granite_q4_1", "granite", Q.Q4_1, {}, "granite arch, q/k permuted, the four scales"),
    ("qwen3_moe_q5_1", "qwen3_moe", Q.Q5_1, {}, "qwen3moe: stacked ffn_*_exps, layer 0 dense; transformers makes every layer sparse"),
    ("mixtral_q4_0", "mixtral", Q.Q4_0, {}, "llama arch with experts (-> mixtral), q/k permuted, sliding window 8; transformers loads a dense llama"),
]

PROMPT = (
    "import os\nimport sys\n\n\nclass Reader:\n    \"\"\"Read lines from a file.\"\"\"\n\n"
    "    def __init__(self, path, encoding='utf-8'):\n        self.path = path\n"
    "        self.encoding = encoding\n        self._lines = []\n\n    def read(self):\n"
    "        with open(self.path, encoding=self.encoding) as f:\n"
)
PROMPT_PROSE = (
    "Beautiful is better than ugly.\nExplicit is better than implicit.\n"
    "Simple is better than complex.\nComplex is better than complicated.\n"
    "Flat is better than nested.\nSparse is better than dense.\nReadability counts.\n"
)
TOKENIZER_TEXTS = [
    "def main():\n    print('hello, world')\n",
    "héllo wörld — 你好 🙂",
    "  leading spaces,\ttabs\r\nand <|im_end|> inside text",
]
SPM_TEXTS = ["def main():\n    print('hello')", "  two spaces and </s> inside", "héllo wörld 🙂", "Hello World"]
CHATS = [[{"role": "system", "content": "You are a helpful assistant."},
          {"role": "user", "content": "Write a function that adds two numbers."}]]


def log(*a):
    print(*a, flush=True)


# ------------------------------------------------------------------------------------------------
# reading the Hugging Face fixture


def read_fixture(name):
    from safetensors.numpy import load_file
    d = os.path.join(SRC, name)
    cfg = json.load(open(os.path.join(d, "config.json")))
    st = load_file(os.path.join(d, "model.safetensors"))
    tok = json.load(open(os.path.join(d, "tokenizer.json")))
    tpl_file = os.path.join(d, "chat_template.jinja")
    template = open(tpl_file).read() if os.path.exists(tpl_file) else None
    return cfg, {k: v.astype(np.float32) for k, v in st.items()}, tok, template


def permute(w, n_head, n_kv):
    # convert_hf_to_gguf.py LlamaModel.permute
    if n_kv is not None and n_head != n_kv:
        n_head = n_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ------------------------------------------------------------------------------------------------
# HF -> GGUF


GGUF_ARCH = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
             "qwen3_moe": "qwen3moe", "gemma2": "gemma2", "gemma3_text": "gemma3", "phi3": "phi3",
             "olmo2": "olmo2", "granite": "granite"}


def write_tokenizer(w, tok, cfg, template):
    model = tok["model"]
    vocab = dict(model["vocab"])
    specials = {t["content"]: t for t in tok.get("added_tokens", [])}
    for content, t in specials.items():
        vocab.setdefault(content, t["id"])
    by_id = {i: s for s, i in vocab.items()}
    tokens, types = [], []
    for i in range(cfg["vocab_size"]):
        s = by_id.get(i, f"[PAD{i}]")
        tokens.append(s)
        sp = specials.get(s)
        types.append(gguf.TokenType.CONTROL if sp and sp.get("special") else gguf.TokenType.NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model["merges"]])
    eos = cfg["eos_token_id"]
    w.add_eos_token_id(eos[0] if isinstance(eos, list) else eos)
    w.add_bos_token_id(vocab["<|endoftext|>"])
    w.add_pad_token_id(cfg.get("pad_token_id") or 0)
    w.add_add_bos_token(False)
    if template:
        w.add_chat_template(template)


def quantize(arr, qtype):
    """(data for the writer, raw_dtype, the values as gguf-py dequantizes them)"""
    if qtype == Q.F32 or arr.ndim == 1:
        return arr.astype(np.float32), None, arr.astype(np.float32)
    if qtype == Q.F16:
        h = arr.astype(np.float16)
        return h, None, h.astype(np.float32)
    data = gguf.quants.quantize(arr, qtype)
    return data, qtype, gguf.quants.dequantize(data, qtype).reshape(arr.shape)


def convert(src, qtype, out_file):
    """Writes the GGUF; returns the HF state dict as the GGUF holds it (dequantized, transforms undone)."""
    cfg, st, tok, template = read_fixture(src)
    mt = cfg["model_type"]
    arch = GGUF_ARCH[mt]
    L, H, Hk, D = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    hd = cfg.get("head_dim") or D // H
    w = gguf.GGUFWriter(out_file, arch)
    w.add_name(src)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(D)
    w.add_block_count(L)
    w.add_head_count(H)
    w.add_head_count_kv(Hk)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg.get("rope_parameters") or {}
    if mt == "gemma3_text":
        w.add_rope_freq_base(rope["full_attention"]["rope_theta"])
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["full_attention"]["factor"])
    else:
        w.add_rope_freq_base(rope["rope_theta"])
    if mt != "granite":
        w.add_key_length(hd)
        w.add_value_length(hd)
    if mt == "phi3":
        w.add_rope_dimension_count(int(hd * rope["partial_rotary_factor"]))
    elif mt not in ("gemma2", "gemma3_text"):
        w.add_rope_dimension_count(hd)
    if mt in ("qwen3_moe", "mixtral"):
        n_exp = cfg.get("num_experts") or cfg.get("num_local_experts")
        w.add_expert_count(n_exp)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
    if mt == "qwen3_moe":
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_weights_norm(bool(cfg["norm_topk_prob"]))
    w.add_feed_forward_length(cfg["intermediate_size"])
    if cfg.get("sliding_window") and mt in ("mistral", "mixtral", "phi3", "gemma2", "gemma3_text"):
        w.add_sliding_window(cfg["sliding_window"])
    if mt == "gemma2":
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if mt == "granite":
        w.add_attention_scale(cfg["attention_multiplier"])
        w.add_embedding_scale(cfg["embedding_multiplier"])
        w.add_residual_scale(cfg["residual_multiplier"])
        w.add_logit_scale(cfg["logits_scaling"])
    write_tokenizer(w, tok, cfg, template)

    permuted = mt in ("llama", "mistral", "mixtral", "granite")
    gemma = mt in ("gemma2", "gemma3_text")
    back = {}  # HF name -> values as the GGUF holds them, transforms undone

    def put(gname, hf_names, arr, quant=True, undo=lambda x: x):
        data, raw, deq = quantize(arr, qtype if quant and arr.ndim >= 2 and arr.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0 else Q.F32)
        w.add_tensor(gname, data, raw_dtype=raw)
        deq = undo(deq)
        if isinstance(hf_names, list):  # stacked experts
            for e, n in enumerate(hf_names):
                back[n] = deq[e]
        else:
            back[hf_names] = deq

    norm_map = ({"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
                 "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"} if gemma else
                {"post_attention_layernorm": "post_attention_norm", "post_feedforward_layernorm": "post_ffw_norm"}
                if mt == "olmo2" else {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"})
    plus1 = (lambda a: a + 1) if gemma else (lambda a: a)
    minus1 = (lambda a: a - 1) if gemma else (lambda a: a)

    put("token_embd.weight", "model.embed_tokens.weight", st["model.embed_tokens.weight"])
    put("output_norm.weight", "model.norm.weight", plus1(st["model.norm.weight"]), undo=minus1)
    if "lm_head.weight" in st and not cfg.get("tie_word_embeddings"):
        put("output.weight", "lm_head.weight", st["lm_head.weight"])
    for i in range(L):
        p = f"model.layers.{i}."
        for hf, g in norm_map.items():
            put(f"blk.{i}.{g}.weight", p + hf + ".weight", plus1(st[p + hf + ".weight"]), undo=minus1)
        a = p + "self_attn."
        for hf, g in [("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output"),
                      ("qkv_proj", "attn_qkv")]:
            for kind in ("weight", "bias"):
                n = f"{a}{hf}.{kind}"
                if n not in st:
                    continue
                arr = st[n]
                if permuted and hf in ("q_proj", "k_proj"):
                    heads = H if hf == "q_proj" else Hk
                    put(f"blk.{i}.{g}.{kind}", n, permute(arr, H, heads if hf == "k_proj" else None),
                        undo=lambda x, h=heads: unpermute(x, h))
                else:
                    put(f"blk.{i}.{g}.{kind}", n, arr)
        for hf, g in [("q_norm", "attn_q_norm"), ("k_norm", "attn_k_norm")]:
            n = f"{a}{hf}.weight"
            if n in st:
                put(f"blk.{i}.{g}.weight", n, plus1(st[n]), undo=minus1)
        m = p + "mlp."
        if m + "gate.weight" in st or p + "block_sparse_moe.gate.weight" in st:
            blk = m if m + "gate.weight" in st else p + "block_sparse_moe."
            E = st[blk + "gate.weight"].shape[0]
            put(f"blk.{i}.ffn_gate_inp.weight", blk + "gate.weight", st[blk + "gate.weight"], quant=False)
            names = {"gate": ["gate_proj", "w1"], "up": ["up_proj", "w3"], "down": ["down_proj", "w2"]}
            for g, alts in names.items():
                alt = next(x for x in alts if f"{blk}experts.0.{x}.weight" in st)
                hf_names = [f"{blk}experts.{e}.{alt}.weight" for e in range(E)]
                put(f"blk.{i}.ffn_{g}_exps.weight", hf_names, np.stack([st[n] for n in hf_names]))
        else:
            for hf, g in [("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down"), ("gate_up_proj", "ffn_up")]:
                for kind in ("weight", "bias"):
                    n = f"{m}{hf}.{kind}"
                    if n in st:
                        put(f"blk.{i}.{g}.{kind}", n, st[n])
    missing = sorted(set(st) - set(back) - ({"lm_head.weight"} if cfg.get("tie_word_embeddings") else set()))
    assert not missing, missing
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return cfg, back, tok, template


# ------------------------------------------------------------------------------------------------
# the K-quant fixture: random valid blocks


D_FIELDS = {  # byte offsets of the f16 scale fields in a block
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208], Q.IQ4_XS: [0], Q.IQ4_NL: [0],
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
}


def random_blocks(rng, qtype, n_blocks, scale=None):
    """Random bytes with finite, moderate f16 scales (every field value is then valid)."""
    _, ts = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    for off in D_FIELDS[qtype]:
        d = rng.uniform(0.25, 1.0, size=n_blocks).astype(np.float16)
        if off != D_FIELDS[qtype][0]:
            d = (d * 0.5).astype(np.float16)
        b[:, off:off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    if scale is not None:
        # rescale so the values have the given standard deviation (linear in every f16 field)
        vals = gguf.quants.dequantize(b, qtype)
        f = scale / float(vals.std())
        for off in D_FIELDS[qtype]:
            d = b[:, off:off + 2].copy().view(np.float16).astype(np.float32) * f
            b[:, off:off + 2] = d.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return b


def make_kquant(out_file, rng):
    """A random Qwen3-shaped model (hidden 256, one layer), every matrix in another block type."""
    D, H, Hk, hd, I, V = 256, 4, 2, 64, 256, 512
    _, _, tok, template = read_fixture("qwen3")
    cfg = {"model_type": "qwen3", "vocab_size": V, "hidden_size": D, "num_hidden_layers": 1, "num_attention_heads": H,
           "num_key_value_heads": Hk, "head_dim": hd, "intermediate_size": I, "max_position_embeddings": 256,
           "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
           "eos_token_id": 0, "pad_token_id": 0, "bos_token_id": None, "architectures": ["Qwen3ForCausalLM"]}
    w = gguf.GGUFWriter(out_file, "qwen3")
    w.add_name("kquant")
    w.add_context_length(256)
    w.add_embedding_length(D)
    w.add_block_count(1)
    w.add_head_count(H)
    w.add_head_count_kv(Hk)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_feed_forward_length(I)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    write_tokenizer(w, tok, cfg, template)
    back = {}
    # a peaked output: a large tied embedding (logits ~ N(0, 16)), moderate layer weights
    emb = rng.normal(0, 1.0, size=(V, D)).astype(np.float32)
    data = gguf.quants.quantize(emb, Q.Q8_0)
    w.add_tensor("token_embd.weight", data, raw_dtype=Q.Q8_0)
    back["model.embed_tokens.weight"] = gguf.quants.dequantize(data, Q.Q8_0).reshape(V, D)
    mats = [("attn_q", "self_attn.q_proj", H * hd, D, Q.Q2_K), ("attn_k", "self_attn.k_proj", Hk * hd, D, Q.Q3_K),
            ("attn_v", "self_attn.v_proj", Hk * hd, D, Q.Q4_K), ("attn_output", "self_attn.o_proj", D, H * hd, Q.Q5_K),
            ("ffn_gate", "mlp.gate_proj", I, D, Q.Q6_K), ("ffn_up", "mlp.up_proj", I, D, Q.IQ4_XS),
            ("ffn_down", "mlp.down_proj", D, I, Q.IQ4_NL)]
    for g, hf, rows, cols, qt in mats:
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        blocks = random_blocks(rng, qt, rows * cols // bs, scale=1.0 / np.sqrt(cols))
        data = blocks.reshape(rows, cols // bs * ts)
        w.add_tensor(f"blk.0.{g}.weight", data, raw_dtype=qt)
        back[f"model.layers.0.{hf}.weight"] = gguf.quants.dequantize(data, qt).reshape(rows, cols)
    for g, hf, n in [("attn_norm", "input_layernorm", D), ("ffn_norm", "post_attention_layernorm", D),
                     ("attn_q_norm", "self_attn.q_norm", hd), ("attn_k_norm", "self_attn.k_norm", hd)]:
        v = rng.uniform(0.8, 1.2, size=n).astype(np.float32)
        w.add_tensor(f"blk.0.{g}.weight", v)
        back[f"model.layers.0.{hf}.weight"] = v
    v = rng.uniform(0.8, 1.2, size=D).astype(np.float32)
    w.add_tensor("output_norm.weight", v)
    back["model.norm.weight"] = v
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return cfg, back, tok, template


# ------------------------------------------------------------------------------------------------
# references


def greedy(model, prompt_ids):
    ids = list(prompt_ids)
    steps = []
    with torch.no_grad():
        for _ in range(STEPS):
            lg = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
            lp = torch.log_softmax(lg, -1)
            top = torch.topk(lp, 5)
            t = int(torch.argmax(lg))
            steps.append({"token_id": t, "logprob": float(lp[t]),
                          "top": [{"token_id": int(i), "logprob": float(v)} for v, i in zip(top.values.tolist(), top.indices.tolist())]})
            ids.append(t)
    return steps


def last_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


def hf_class_model(cfg, back, changes, tmp):
    from safetensors.numpy import save_file
    c = dict(cfg)
    c.update(changes)
    c.pop("transformers_version", None)
    d = os.path.join(tmp, "hf")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    json.dump(c, open(os.path.join(d, "config.json"), "w"))
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in back.items()}, os.path.join(d, "model.safetensors"))
    kw = dict(attn_implementation="eager", dtype=torch.float32)
    if c.get("model_type") in ("qwen3_moe", "mixtral"):
        kw["experts_implementation"] = "eager"
    m, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, **kw)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return m.eval()


def gguf_model(path):
    d, f = os.path.split(path)
    return AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32, attn_implementation="eager").eval()


def gguf_tokenizer(gguf_path):
    """AutoTokenizer on the GGUF; for an architecture it refuses, the same conversion called directly."""
    try:
        return AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path)), "AutoTokenizer"
    except ValueError:
        from transformers import PreTrainedTokenizerFast
        from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer
        arch, tdict, tconfig = get_gguf_tokenizer(gguf_path)
        backend, _ = convert_gguf_tokenizer(arch, tdict)
        tokz = PreTrainedTokenizerFast(tokenizer_object=backend, **{k: v for k, v in tconfig.items() if v is not None})
        return tokz, "convert_gguf_tokenizer (AutoTokenizer refuses the architecture)"


def reference(name, gguf_path, cfg, back, changes, note, tok_texts, template):
    tokz, tok_method = gguf_tokenizer(gguf_path)
    text_ids = [tokz(t, add_special_tokens=False)["input_ids"] for t in [PROMPT, PROMPT_PROSE, PROMPT]]
    prompts = [text_ids[0][:PROMPT_LENGTHS[0]], text_ids[1][:PROMPT_LENGTHS[1]], text_ids[2][:PROMPT_LENGTHS[2]]]
    with tempfile.TemporaryDirectory() as tmp:
        hf = hf_class_model(cfg, back, changes, tmp)
        method, why, diff = "hf-class", "", None
        try:
            tg = gguf_model(gguf_path)
            diff = max(float((last_logits(tg, p) - last_logits(hf, p)).abs().max()) for p in prompts)
            if diff < 1e-3:
                method = "transformers-gguf"
            else:
                why = f"transformers reads this GGUF differently (max |logit diff| {diff:.3g} against the config the metadata states)"
        except Exception as e:  # noqa: BLE001
            why = f"transformers cannot load this GGUF: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        model = tg if method == "transformers-gguf" else hf
        cases = []
        for p in prompts:
            steps = greedy(model, p)
            cases.append({"prompt_token_ids": p, "generated_token_ids": [s["token_id"] for s in steps], "steps": steps})
    gaps = [c["steps"][i]["top"][0]["logprob"] - c["steps"][i]["top"][1]["logprob"] for c in cases for i in range(STEPS)]
    chat = []
    if template:
        for msgs in CHATS:
            chat.append({"messages": msgs, "text": tokz.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)})
    log(f"  {name}: method {method} {why} diff {diff}; min top1-top2 gap {min(gaps):.3g}")
    return {
        "name": name, "gguf": os.path.basename(gguf_path), "method": method, "method_note": why or None,
        "methods_max_abs_logit_diff": diff, "notes": note, "transformers_version": transformers.__version__,
        "torch_version": torch.__version__, "gguf_version": getattr(gguf, "__version__", "0.19.0"),
        "config_changes": changes, "min_top1_top2_logprob_gap": min(gaps),
        "generation": f"greedy argmax of the raw fp32 logits, {STEPS} steps, one no-cache forward per step, eager attention, CPU",
        "cases": cases,
        "tokenizer_method": tok_method,
        "tokenizer": [{"text": t, "ids": tokz(t, add_special_tokens=False)["input_ids"]} for t in tok_texts],
        "chat": chat,
    }


# ------------------------------------------------------------------------------------------------
# dequantizer samples and vocabulary-only files


SAMPLE_TYPES = [Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
                Q.IQ4_NL, Q.IQ4_XS]


def make_samples(out_file, rng):
    w = gguf.GGUFWriter(out_file, "llama")
    for qt in SAMPLE_TYPES:
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        if qt in (Q.F16, Q.BF16):
            vals = rng.normal(0, 2.0, size=512).astype(np.float32)
            data = vals.astype(np.float16) if qt == Q.F16 else gguf.quants.quantize(vals, Q.BF16)
            raw = None if qt == Q.F16 else Q.BF16
            expected = gguf.quants.dequantize(data.view(np.uint8) if qt == Q.BF16 else data, qt).reshape(-1)
        else:
            n = 6 if bs == 256 else 48
            data = random_blocks(rng, qt, n).reshape(-1)
            raw = qt
            expected = gguf.quants.dequantize(data, qt).reshape(-1)
        assert np.isfinite(expected).all()
        w.add_tensor(qt.name, data, raw_dtype=raw)
        w.add_tensor(qt.name + ".expected", expected.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def spm_vocab():
    """A small SentencePiece-style BPE vocabulary (byte fallback) trained on Python's own sources."""
    import glob
    import sysconfig
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    docs = [open(p, encoding="utf-8", errors="ignore").read() for p in sorted(glob.glob(sysconfig.get_paths()["stdlib"] + "/*.py"))[:60]]
    tk = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tk.train_from_iterator(docs, trainer=trainers.BpeTrainer(vocab_size=700, special_tokens=specials, show_progress=False))
    return [t for t, _ in sorted(tk.get_vocab().items(), key=lambda kv: kv[1])]


def make_vocab(out_dir, arch, tokens):
    if arch == "gemma2":
        # gemma's layout: <pad> <eos> <bos> <unk> <mask> first, runs of spaces stored as spaces
        tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"] + [t for t in tokens if t not in ("<unk>", "<s>", "</s>")] + ["  ", "   "]
    types, scores = [], []
    for i, t in enumerate(tokens):
        if t == "<unk>":
            types.append(gguf.TokenType.UNKNOWN)
        elif t in ("<s>", "</s>", "<pad>", "<eos>", "<bos>", "<mask>"):
            types.append(gguf.TokenType.CONTROL)
        elif t.startswith("<0x") and len(t) == 6:
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
        scores.append(0.0 if types[-1] != gguf.TokenType.NORMAL else -float(i))
    path = os.path.join(out_dir, f"vocab-{arch}.gguf")
    w = gguf.GGUFWriter(path, arch)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    bos, eos = ("<bos>", "<eos>") if arch == "gemma2" else ("<s>", "</s>")
    w.add_bos_token_id(tokens.index(bos))
    w.add_eos_token_id(tokens.index(eos))
    w.add_unk_token_id(tokens.index("<unk>"))
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tokz = AutoTokenizer.from_pretrained(out_dir, gguf_file=os.path.basename(path))
    ref = {"gguf": os.path.basename(path), "architecture": arch, "transformers_version": transformers.__version__,
           "class": type(tokz).__name__, "bos_token_id": tokens.index(bos),
           "tokenizer": [{"text": t, "ids": tokz(t, add_special_tokens=False)["input_ids"],
                          "decoded": tokz.decode(tokz(t, add_special_tokens=False)["input_ids"])} for t in SPM_TEXTS]}
    json.dump(ref, open(path.replace(".gguf", ".reference.json"), "w"), indent=1, ensure_ascii=False)
    log(f"  vocab-{arch}: {type(tokz).__name__}, {len(tokens)} tokens")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "test", "fixtures", "gguf"))
    ap.add_argument("--only", default=None)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    if not only or "samples" in only:
        make_samples(os.path.join(args.out, "dequant-samples.gguf"), rng)
    if not only or "vocab" in only:
        tokens = spm_vocab()
        for arch in ("llama", "gemma2", "phi3"):
            make_vocab(args.out, arch, tokens)
    work = [(n, s, q, c, note) for n, s, q, c, note in FIXTURES] + [("kquant", None, None, {}, "random blocks: q Q2_K, k Q3_K, v Q4_K, o Q5_K, gate Q6_K, up IQ4_XS, down IQ4_NL, embedding Q8_0")]
    for name, src, qt, changes, note in work:
        if only and name not in only:
            continue
        path = os.path.join(args.out, f"{name}.gguf")
        cfg, back, tok, template = make_kquant(path, np.random.default_rng(1)) if src is None else convert(src, qt, path)
        ref = reference(name, path, cfg, back, changes, note, TOKENIZER_TEXTS, template)
        ref["ggml_type"] = qt.name if qt is not None else "mixed"
        json.dump(ref, open(os.path.join(args.out, f"{name}.reference.json"), "w"), indent=None, separators=(",", ":"), ensure_ascii=False)
        log(f"  {name}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    sys.exit(main())
