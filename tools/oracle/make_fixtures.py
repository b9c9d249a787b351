#!/usr/bin/env python3
"""Build the Hugging Face transformers oracle fixtures for llmts.

For each supported family this script builds a tiny model with transformers' own config and
model classes, trains it briefly (GPU if present) so that its next-token distributions are
peaked, saves it in Hugging Face layout together with one shared small byte-level BPE tokenizer
and a ChatML chat template, and records transformers' reference outputs (greedy tokens and
top-5 logprobs per step, computed on CPU in fp32 with eager attention).

Usage (on a machine with PyTorch + transformers; no network needed):

    python3 tools/oracle/make_fixtures.py --out /tmp/fixtures
        [--only llama,qwen3] [--steps 250]

Then copy /tmp/fixtures/<name>/ to test/fixtures/<name>/. See tools/oracle/README.md.

Everything is deterministic up to GPU training non-determinism: the corpus is the Python
standard library of the machine (sorted file list, test folders skipped), seeds are fixed.
"""

import argparse
import dataclasses
import glob
import inspect
import json
import math
import os
import random
import shutil
import sys
import sysconfig
import time
import traceback

import torch

import transformers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerFast,
)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The Qwen2-style ChatML template. Newlines inside the Jinja string literals are real newline
# characters (as in Qwen2's tokenizer_config.json once its JSON is decoded).
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)
VOCAB_SIZE = 512
NEW_TOKENS = 32

# Real text for prompts (truncated to a token count after encoding).
PROMPT_SHORT = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n"
    "        return n\n    a, b = 0, 1\n    for _ in range(n - 1):\n        a, b = b, a + b\n"
    "    return b\n\n\ndef main():\n    for i in range(10):\n        print(i, fibonacci(i))\n"
)
PROMPT_CODE = (
    "import os\nimport sys\n\n\nclass Reader:\n    \"\"\"Read lines from a file.\"\"\"\n\n"
    "    def __init__(self, path, encoding='utf-8'):\n        self.path = path\n"
    "        self.encoding = encoding\n        self._lines = []\n\n    def read(self):\n"
    "        with open(self.path, encoding=self.encoding) as f:\n"
    "            for line in f:\n                self._lines.append(line.rstrip('\\n'))\n"
    "        return self._lines\n"
)
PROMPT_PROSE = (
    "Beautiful is better than ugly.\nExplicit is better than implicit.\n"
    "Simple is better than complex.\nComplex is better than complicated.\n"
    "Flat is better than nested.\nSparse is better than dense.\nReadability counts.\n"
    "Special cases aren't special enough to break the rules.\n"
    "Although practicality beats purity.\nErrors should never pass silently.\n"
)
PROMPTS = [(PROMPT_SHORT, 6), (PROMPT_CODE, 48), (PROMPT_PROSE, 56)]

CHATS = [
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Write a function that adds two numbers."},
    ],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What does len() return?"},
        {"role": "assistant", "content": "The number of items in a container."},
        {"role": "user", "content": "And for a string?"},
    ],
]
TOKENIZER_TEXTS = [
    "def main():\n    print('hello, world')\n",
    "héllo wörld — 你好 🙂",
    "  leading spaces,\ttabs\r\nand <|im_end|> inside text",
]


def log(*a):
    print(*a, flush=True)


# --------------------------------------------------------------------------------------------
# corpus and tokenizer


SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__",
             "lib2to3", "idlelib", "turtledemo", "ensurepip", "pydoc_data", "encodings"}


def python_files(root, skip_dirs=SKIP_DIRS, max_file_bytes=400_000):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs and not d.startswith("."))
        for fn in sorted(filenames):
            if fn.endswith(".py"):
                p = os.path.join(dirpath, fn)
                try:
                    if os.path.getsize(p) <= max_file_bytes and not os.path.islink(p):
                        out.append(p)
                except OSError:
                    pass
    return out


def read_corpus(max_bytes):
    root = sysconfig.get_paths()["stdlib"]
    docs, total = [], 0
    for p in python_files(root):
        try:
            with open(p, encoding="utf-8") as f:
                t = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        if not t.strip():
            continue
        docs.append(t)
        total += len(t.encode("utf-8"))
        if total >= max_bytes:
            break
    return root, docs, total


def train_tokenizer(docs, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(docs, trainer=trainer)
    return tk


def make_hf_tokenizer(tk):
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def token_stream(tk, docs, eos_id):
    ids = []
    for enc in tk.encode_batch(docs):
        ids.extend(enc.ids)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.long)


# --------------------------------------------------------------------------------------------
# fixture specs


def base_kwargs(V, eos):
    return dict(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=eos,
    )


def fixture_specs(V, eos, im_end):
    def rope(t="default", theta=10000.0, **kw):
        d = {"rope_type": t, "rope_theta": theta}
        d.update(kw)
        return d

    S = []

    def add(name, cfg_cls, model_cls, overrides, notes="", legacy=False, eos_list=False,
            moe=False, reuse=None):
        kw = base_kwargs(V, eos)
        kw.update(overrides)
        S.append(dict(name=name, cfg_cls=cfg_cls, model_cls=model_cls, kwargs=kw, notes=notes,
                      legacy=legacy, eos_list=eos_list, moe=moe, reuse=reuse))

    add("llama", "LlamaConfig", "LlamaForCausalLM", dict(rope_parameters=rope()),
        "plain llama, rope default")
    add("llama_llama3", "LlamaConfig", "LlamaForCausalLM",
        dict(rope_parameters=rope("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position_embeddings=32)),
        "rope llama3 factor 8, low 1, high 4, original_max_position_embeddings 32 (32 rather "
        "than 16 so that, with head_dim 16 and theta 1e4, all three llama3 branches occur: "
        "wavelen < 8 kept, 8..32 smoothed, > 32 divided by factor); config.json in LEGACY "
        "style (top-level rope_theta + rope_scaling)", legacy=True)
    add("llama_linear", "LlamaConfig", "LlamaForCausalLM",
        dict(rope_parameters=rope("linear", factor=2.0), attention_bias=True, mlp_bias=True),
        "rope linear factor 2, attention_bias and mlp_bias")
    add("llama_dynamic", "LlamaConfig", "LlamaForCausalLM",
        dict(rope_parameters=rope("dynamic", factor=2.0), max_position_embeddings=32),
        "rope dynamic NTK factor 2, max_position_embeddings 32 (long prompts exceed it at "
        "prefill; the short prompt crosses it during generation)")
    add("llama_yarn", "LlamaConfig", "LlamaForCausalLM",
        dict(rope_parameters=rope("yarn", factor=4.0, original_max_position_embeddings=16),
             max_position_embeddings=64),
        "rope yarn factor 4, original_max_position_embeddings 16, max_position_embeddings 64")
    add("mistral", "MistralConfig", "MistralForCausalLM",
        dict(rope_parameters=rope(), sliding_window=8, head_dim=24),
        "sliding_window 8 on every layer, head_dim 24 != hidden/heads (16)")
    add("qwen2", "Qwen2Config", "Qwen2ForCausalLM",
        dict(rope_parameters=rope(theta=1000000.0), tie_word_embeddings=True, num_hidden_layers=4,
             use_sliding_window=True, sliding_window=8, max_window_layers=2),
        "qkv bias (always on in qwen2), tied embeddings, use_sliding_window with window 8 and "
        "max_window_layers 2 of 4 layers; generation_config eos is [endoftext, im_end]",
        eos_list=True)
    add("qwen3", "Qwen3Config", "Qwen3ForCausalLM",
        dict(rope_parameters=rope(theta=1000000.0), tie_word_embeddings=True, head_dim=32),
        "q/k RMSNorm per head, tied embeddings, head_dim 32 != hidden/heads (16); "
        "generation_config eos is [endoftext, im_end]", eos_list=True)
    add("gemma2", "Gemma2Config", "Gemma2ForCausalLM",
        dict(rope_parameters=rope(), head_dim=16, query_pre_attn_scalar=24, sliding_window=8,
             attn_logit_softcapping=5.0, final_logit_softcapping=10.0, num_hidden_layers=3,
             tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh"),
        "alternating sliding (window 8) / full layers, attn softcap 5, final softcap 10, "
        "query_pre_attn_scalar 24 (head_dim 16)")
    add("gemma3_text", "Gemma3TextConfig", "Gemma3ForCausalLM",
        dict(rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
        }, head_dim=16, query_pre_attn_scalar=16, sliding_window=8, num_hidden_layers=4,
            layer_types=["sliding_attention", "sliding_attention", "full_attention",
                         "sliding_attention"],
            tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh"),
        "Gemma3ForCausalLM with Gemma3TextConfig: 4 layers, layer_types "
        "[sliding, sliding, full, sliding], window 8; local rope theta 1e4 default, global rope "
        "theta 1e6 linear factor 2; q/k norm")
    add("phi3", "Phi3Config", "Phi3ForCausalLM",
        dict(rope_parameters=rope(partial_rotary_factor=0.5), sliding_window=8,
             original_max_position_embeddings=256),
        "fused qkv_proj and gate_up_proj, partial_rotary_factor 0.5 (8 of 16 dims rotated), "
        "sliding_window 8")
    add("phi3_longrope", "Phi3Config", "Phi3ForCausalLM",
        dict(rope_parameters=rope(
            "longrope",
            short_factor=[1.0, 1.02, 1.05, 1.1, 1.2, 1.35, 1.5, 1.7],
            long_factor=[1.0, 1.25, 1.6, 2.2, 3.0, 4.0, 5.5, 7.0]),
            original_max_position_embeddings=16, max_position_embeddings=64),
        "rope longrope, short/long factors of length 8 (rotaryDim/2), "
        "original_max_position_embeddings 16, max_position_embeddings 64")
    add("olmo2", "Olmo2Config", "Olmo2ForCausalLM", dict(rope_parameters=rope()),
        "post-norm (norms after attention/MLP), q_norm/k_norm over the whole projection")
    add("granite", "GraniteConfig", "GraniteForCausalLM",
        dict(rope_parameters=rope(), embedding_multiplier=2.0, residual_multiplier=0.5,
             attention_multiplier=0.1, logits_scaling=4.0),
        "embedding_multiplier 2, residual_multiplier 0.5, attention_multiplier 0.1, "
        "logits_scaling 4")
    add("qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
        dict(rope_parameters=rope(theta=1000000.0), num_hidden_layers=3, num_experts=4,
             num_experts_per_tok=2, norm_topk_prob=True, moe_intermediate_size=32,
             decoder_sparse_step=1, mlp_only_layers=[0]),
        "4 experts top-2, norm_topk_prob, moe_intermediate_size 32, layer 0 dense "
        "(mlp_only_layers [0], intermediate_size 128), layers 1-2 sparse", moe=True)
    add("mixtral", "MixtralConfig", "MixtralForCausalLM",
        dict(rope_parameters=rope(theta=1000000.0), num_local_experts=4, num_experts_per_tok=2,
             sliding_window=8, router_jitter_noise=0.0),
        "4 experts top-2 (softmax over top-k logits), sliding_window 8", moe=True)
    add("qwen3_legacy", "Qwen3Config", "Qwen3ForCausalLM", {},
        "the qwen3 fixture's weights with config.json rewritten in LEGACY style "
        "(top-level rope_theta, rope_scaling null, no rope_parameters); references must equal "
        "qwen3's", legacy=True, eos_list=True, reuse="qwen3")
    return S


# --------------------------------------------------------------------------------------------
# helpers


def build_config(spec, notes_out):
    cls = getattr(transformers, spec["cfg_cls"])
    kw = dict(spec["kwargs"])
    field_names = set()
    try:
        field_names = {f.name for f in dataclasses.fields(cls)}
    except TypeError:
        field_names = set(inspect.signature(cls.__init__).parameters)
    attr_map = getattr(cls, "attribute_map", {}) or {}
    unknown = sorted(k for k in kw if k not in field_names and k not in attr_map)
    if unknown:
        notes_out.append(f"config kwargs not declared by {cls.__name__}: {unknown}")
    cfg = cls(**kw)
    return cfg, unknown


def instantiate(spec, cfg, moe):
    extra = {"attn_implementation": "eager"}
    if moe:
        extra["experts_implementation"] = "eager"
    try:
        return AutoModelForCausalLM.from_config(cfg, **extra)
    except Exception as e:  # noqa: BLE001
        log(f"  from_config with {extra} failed ({e!r}); retrying with attn only")
        try:
            return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
        except Exception as e2:  # noqa: BLE001
            log(f"  from_config failed again ({e2!r}); using the class directly")
            return getattr(transformers, spec["model_cls"])(cfg)


def train(model, data, steps, device, seq=64, bsz=32, lr=3e-3, seed=0):
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    data_d = data.to(device)
    n = data.numel() - seq - 2
    ar = torch.arange(seq + 1, device=device)
    warm = 20
    losses = []
    for step in range(steps):
        cur = lr * (step + 1) / warm if step < warm else \
            lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm))))
        for pg in opt.param_groups:
            pg["lr"] = cur
        starts = torch.randint(0, n, (bsz,), generator=g).to(device)
        batch = data_d[starts[:, None] + ar[None, :]]
        x, y = batch[:, :-1], batch[:, 1:]
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                 y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            log(f"    step {step:4d} loss {loss.item():.4f}")
    model.eval()
    return losses


def save_model(model, d):
    try:
        model.save_pretrained(d, safe_serialization=True)
    except TypeError:
        model.save_pretrained(d)


def to_legacy(cfg):
    """Rewrite a transformers-5 config dict into the legacy rope_theta/rope_scaling style."""
    cfg = dict(cfg)
    rp = cfg.pop("rope_parameters", None)
    if rp is None:
        raise ValueError("no rope_parameters to rewrite")
    if any(isinstance(v, dict) for v in rp.values()):
        raise ValueError("per-layer-type rope_parameters have no legacy form")
    rp = dict(rp)
    theta = rp.pop("rope_theta")
    prf = rp.pop("partial_rotary_factor", None)
    if prf is not None and prf != 1.0:
        cfg["partial_rotary_factor"] = prf
    cfg["rope_theta"] = theta
    rtype = rp.get("rope_type", rp.get("type", "default"))
    cfg["rope_scaling"] = None if rtype == "default" else rp
    return cfg


def load_for_reference(d, moe):
    kw = dict(attn_implementation="eager", dtype=torch.float32)
    if moe:
        kw["experts_implementation"] = "eager"
    try:
        m = AutoModelForCausalLM.from_pretrained(d, **kw)
    except Exception as e:  # noqa: BLE001
        log(f"  from_pretrained with {sorted(kw)} failed ({e!r}); retrying plainer")
        kw.pop("experts_implementation", None)
        try:
            m = AutoModelForCausalLM.from_pretrained(d, **kw)
        except TypeError:
            m = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager",
                                                     torch_dtype=torch.float32)
        if moe and hasattr(m, "set_experts_implementation"):
            try:
                m.set_experts_implementation("eager")
            except Exception as e2:  # noqa: BLE001
                log(f"  set_experts_implementation failed: {e2!r}")
    m.eval()
    return m


def as_id_list(x):
    if hasattr(x, "keys") and "input_ids" in x:
        x = x["input_ids"]
    if hasattr(x, "tolist"):
        x = x.tolist()
    if x and isinstance(x[0], list):
        assert len(x) == 1
        x = x[0]
    return [int(t) for t in x]


def run_case(load, prompt_ids, eos_ids, eos_id):
    """Greedy generation on a freshly loaded model (transformers' dynamic-NTK rotary embedding
    keeps state across forward calls -- its inv_freq only regrows past the longest sequence seen
    and only resets below max_position_embeddings -- so every case, and the no-cache forward,
    gets its own fresh model)."""
    model = load()
    inp = torch.tensor([prompt_ids], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(
            input_ids=inp,
            attention_mask=torch.ones_like(inp),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=eos_id,
        )
    gen = out.sequences[0, len(prompt_ids):].tolist()
    assert len(gen) == NEW_TOKENS, (len(gen), NEW_TOKENS)
    steps, eos_masked_steps, argmax_mismatch = [], [], []
    raw = []
    for i, lg in enumerate(out.logits):
        lg = lg[0].float()
        raw.append(lg)
        lp = torch.log_softmax(lg, dim=-1)
        top = torch.topk(lp, 5)
        tok = gen[i]
        am = int(torch.argmax(lg))
        if am != tok:
            masked = lg.clone()
            masked[list(eos_ids)] = -float("inf")
            if int(torch.argmax(masked)) == tok and am in eos_ids:
                eos_masked_steps.append(i)
            else:
                argmax_mismatch.append(i)
        steps.append({
            "token_id": tok,
            "logprob": float(lp[tok]),
            "top": [{"token_id": int(t), "logprob": float(v)}
                    for v, t in zip(top.values.tolist(), top.indices.tolist())],
        })
    # the same tokens in one forward pass without a cache, for comparison
    full = torch.tensor([prompt_ids + gen], dtype=torch.long)
    model = load()
    with torch.no_grad():
        fl = model(input_ids=full, use_cache=False).logits[0].float()
    p = len(prompt_ids)
    nocache = fl[p - 1:p - 1 + NEW_TOKENS]
    diff = float((nocache - torch.stack(raw)).abs().max())
    nocache_lp = torch.log_softmax(nocache, -1)
    nocache_tok_lp = [float(nocache_lp[i, gen[i]]) for i in range(NEW_TOKENS)]
    nocache_argmax_agree = all(int(torch.argmax(nocache[i])) == int(torch.argmax(raw[i]))
                               for i in range(NEW_TOKENS))
    gaps = [st["top"][0]["logprob"] - st["top"][1]["logprob"] for st in steps]
    return gen, steps, {
        "min_top1_top2_logprob_gap": min(gaps),
        "eos_masked_steps": eos_masked_steps,
        "argmax_mismatch_steps": argmax_mismatch,
        "nocache_forward_max_abs_logit_diff": diff,
        "nocache_forward_argmax_agrees": nocache_argmax_agree,
        "nocache_forward_token_logprobs": nocache_tok_lp,
    }


def tensor_listing(d):
    from safetensors import safe_open
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        with safe_open(f, framework="pt") as sf:
            for k in sorted(sf.keys()):
                t = sf.get_slice(k)
                out[k] = {"shape": list(t.get_shape()), "dtype": str(t.get_dtype())}
    return out


# --------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default=None)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--train-bytes", type=int, default=1_000_000)
    ap.add_argument("--prompt-repeats", type=int, default=15)
    ap.add_argument("--corpus-bytes", type=int, default=3_000_000)
    args = ap.parse_args()

    t0 = time.time()
    torch.manual_seed(0)
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    log(f"transformers {transformers.__version__} torch {torch.__version__} device {device}")
    os.makedirs(args.out, exist_ok=True)

    root, docs, nbytes = read_corpus(args.corpus_bytes)
    log(f"corpus: {len(docs)} files, {nbytes} bytes from {root}")
    tk = train_tokenizer(docs, VOCAB_SIZE)
    V = tk.get_vocab_size()
    eos = tk.token_to_id("<|endoftext|>")
    im_start = tk.token_to_id("<|im_start|>")
    im_end = tk.token_to_id("<|im_end|>")
    log(f"tokenizer: vocab {V}, eos {eos}, im_start {im_start}, im_end {im_end}")
    hf_tok = make_hf_tokenizer(tk)
    # model training stream: the first --train-bytes of the corpus plus each prompt text repeated
    # --prompt-repeats times at shuffled positions, so that the continuations of the prompts are
    # partly memorised and the reference distributions are peaked
    train_docs, acc = [], 0
    for t in docs:
        train_docs.append(t)
        acc += len(t)
        if acc >= args.train_bytes:
            break
    train_docs += [text for text, _ in PROMPTS] * args.prompt_repeats
    random.Random(0).shuffle(train_docs)
    data = token_stream(tk, train_docs, eos)
    log(f"training stream: {data.numel()} tokens ({time.time() - t0:.1f}s)")

    prompts = []
    for text, n in PROMPTS:
        ids = tk.encode(text).ids[:n]
        assert len(ids) == n, (text, len(ids))
        prompts.append(ids)

    specs = fixture_specs(V, eos, im_end)
    if args.only:
        want = set(args.only.split(","))
        specs = [s for s in specs if s["name"] in want]
    summary = []
    trained = {}
    for spec in specs:
        name = spec["name"]
        d = os.path.join(args.out, name)
        log(f"=== {name} ({time.time() - t0:.1f}s)")
        notes = [spec["notes"]] if spec["notes"] else []
        try:
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            eos_ids = [eos, im_end] if spec["eos_list"] else [eos]
            if spec["reuse"]:
                src_dir = os.path.join(args.out, spec["reuse"])
                for fn in os.listdir(src_dir):
                    if fn != "reference.json":
                        shutil.copy(os.path.join(src_dir, fn), os.path.join(d, fn))
                losses = trained.get(spec["reuse"], [])
                unknown = []
            else:
                cfg, unknown = build_config(spec, notes)
                torch.manual_seed(1234)
                model = instantiate(spec, cfg, spec["moe"])
                nparams = sum(p.numel() for p in model.parameters())
                log(f"  {type(model).__name__}: {nparams} parameters")
                losses = train(model, data, args.steps, device)
                trained[name] = losses
                model.to("cpu")
                model.generation_config = GenerationConfig(
                    eos_token_id=eos_ids if len(eos_ids) > 1 else eos_ids[0],
                    pad_token_id=eos, bos_token_id=None)
                save_model(model, d)
                del model
                hf_tok.save_pretrained(d)
                gc = GenerationConfig(eos_token_id=eos_ids if len(eos_ids) > 1 else eos_ids[0],
                                      pad_token_id=eos)
                gc.save_pretrained(d)
            cfg_path = os.path.join(d, "config.json")
            with open(cfg_path) as f:
                saved_cfg = json.load(f)
            style = "rope_parameters" if "rope_parameters" in saved_cfg else "legacy"
            if spec["legacy"]:
                # references from the rope_parameters config first, for comparison
                pre = [run_case(lambda: load_for_reference(d, spec["moe"]), p, eos_ids, eos)[0]
                       for p in prompts]
                legacy_cfg = to_legacy(saved_cfg)
                with open(cfg_path, "w") as f:
                    json.dump(legacy_cfg, f, indent=2, sort_keys=True)
                    f.write("\n")
                style = "legacy"
            # tokenizer.json semantics (what an engine reading tokenizer.json implements)
            tok = PreTrainedTokenizerFast.from_pretrained(d)
            # AutoTokenizer may pick a model-specific class by model_type (transformers 5 maps
            # qwen2 to Qwen2Tokenizer, which rebuilds the pre-tokenizer): recorded separately
            auto_tok = AutoTokenizer.from_pretrained(d)
            log(f"  tokenizer class {type(tok).__name__}, AutoTokenizer class "
                f"{type(auto_tok).__name__}, len {len(tok)}")
            cases = []
            checks = {}
            for i, p in enumerate(prompts):
                gen, steps, chk = run_case(lambda: load_for_reference(d, spec["moe"]), p,
                                           eos_ids, eos)
                cases.append({
                    "prompt_text": tok.decode(p),
                    "prompt_token_ids": p,
                    "generated_token_ids": gen,
                    "steps": steps,
                })
                checks[f"case{i}"] = chk
                log(f"  case {i}: prompt {len(p)} tokens; gen {gen[:12]}...; "
                    f"eos_masked {chk['eos_masked_steps']} mismatch {chk['argmax_mismatch_steps']}"
                    f" nocache diff {chk['nocache_forward_max_abs_logit_diff']:.2e}")
            if spec["legacy"]:
                same = [c["generated_token_ids"] == g for c, g in zip(cases, pre)]
                notes.append(f"legacy config gives the same greedy tokens as the "
                             f"rope_parameters config: {same}")
                log(f"  legacy == rope_parameters: {same}")
            chat = []
            for msgs in CHATS:
                text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
                ids = as_id_list(tok.apply_chat_template(msgs, add_generation_prompt=True,
                                                         tokenize=True))
                enc = as_id_list(tok.encode(text, add_special_tokens=False))
                if enc != ids:
                    notes.append("apply_chat_template ids differ from encode(text)")
                chat.append({"messages": msgs, "text": text, "ids": ids})
            tkr = []
            for s in TOKENIZER_TEXTS:
                ids = as_id_list(tok.encode(s))
                raw_ids = tk.encode(s).ids
                if raw_ids != ids:
                    notes.append(f"transformers encode differs from tokenizers encode for {s!r}")
                tkr.append({"text": s, "ids": ids, "decoded": tok.decode(ids)})
            auto = {"class": type(auto_tok).__name__}
            auto_tkr = [{"text": s, "ids": as_id_list(auto_tok.encode(s))} for s in TOKENIZER_TEXTS]
            auto_chat = [as_id_list(auto_tok.apply_chat_template(
                msgs, add_generation_prompt=True, tokenize=True)) for msgs in CHATS]
            auto["same_as_tokenizer_json"] = (
                [a["ids"] for a in auto_tkr] == [t["ids"] for t in tkr]
                and auto_chat == [c["ids"] for c in chat])
            if not auto["same_as_tokenizer_json"]:
                auto["tokenizer"] = auto_tkr
                auto["chat_ids"] = auto_chat
                notes.append(f"AutoTokenizer loads this folder as {auto['class']}, whose ids "
                             "differ from tokenizer.json's (see autotokenizer); 'tokenizer' and "
                             "'chat' are from PreTrainedTokenizerFast (tokenizer.json)")
            eos_masked = sum(len(c["eos_masked_steps"]) for c in checks.values())
            ref = {
                "name": name,
                "model_type": saved_cfg.get("model_type"),
                "config_style": style,
                "transformers_version": transformers.__version__,
                "torch_version": torch.__version__,
                "notes": "; ".join(notes),
                "generation": {
                    "method": "model.generate(do_sample=False, max_new_tokens=32, "
                              "min_new_tokens=32, output_logits=True, "
                              "return_dict_in_generate=True), batch 1, no padding, CPU fp32, "
                              "attn_implementation=eager" +
                              (", experts_implementation=eager" if spec["moe"] else ""),
                    "eos_handling": "min_new_tokens=32 masks the generation_config eos ids "
                                    f"{eos_ids} to -inf before the greedy argmax until 32 tokens "
                                    "exist; logprob/top are log_softmax of the RAW logits "
                                    "(eos not masked). steps where eos was the raw argmax and "
                                    f"was masked: {eos_masked}",
                    "eos_token_ids": eos_ids,
                },
                "training": {"steps": len(losses), "final_loss": losses[-1] if losses else None,
                             "first_loss": losses[0] if losses else None},
                "undeclared_config_kwargs": unknown,
                "checks": checks,
                "cases": cases,
                "chat": chat,
                "tokenizer": tkr,
                "autotokenizer": auto,
            }
            with open(os.path.join(d, "reference.json"), "w", encoding="utf-8") as f:
                json.dump(ref, f, indent=1, ensure_ascii=False)
                f.write("\n")
            tensors = tensor_listing(d)
            log(f"  tensors ({len(tensors)}):")
            for k, v in tensors.items():
                if ".layers." in k and not (".layers.0." in k or ".layers.1." in k):
                    continue
                log(f"    {k} {v['shape']} {v['dtype']}")
            with open(os.path.join(d, "config.json")) as f:
                log("  config.json: " + json.dumps(json.load(f), sort_keys=True))
            size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
            log(f"  files: {sorted(os.listdir(d))} total {size} bytes")
            summary.append((name, "ok", size, losses[-1] if losses else None))
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            summary.append((name, f"FAILED: {e!r}", 0, None))

    log("=== summary")
    for row in summary:
        log(f"  {row[0]:16s} {row[1]} size={row[2]} final_loss={row[3]}")
    log(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
