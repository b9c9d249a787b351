#!/usr/bin/env python3
"""Train the bundled llmts demo model: a small Qwen3-architecture model that writes Python-ish text.

Runs on a GPU machine with PyTorch + transformers (no network needed):

    python3 tools/demo/train_demo.py --out models/demo [--train-seconds 400] [--deadline EPOCH]

Steps: read the Python source of the standard library and of a fixed list of permissively
licensed packages installed on the machine (sorted file lists, deterministic), train a byte-level
BPE tokenizer (vocab 8192, ChatML special tokens), train Qwen3ForCausalLM with bf16 autocast for
a fixed wall-clock budget, save bf16 safetensors + tokenizer + generation_config + README.md, and
record a transformers reference continuation (fp32, CPU, eager attention) in
sample_reference.json. See tools/demo/README.md.
"""

import argparse
import importlib.util
import json
import math
import os
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
    Qwen3Config,
)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)
# package name -> licence, in corpus order (stdlib first)
PACKAGES = [
    ("numpy", "BSD-3-Clause"),
    ("scipy", "BSD-3-Clause"),
    ("sympy", "BSD-3-Clause"),
    ("networkx", "BSD-3-Clause"),
    ("pandas", "BSD-3-Clause"),
    ("sklearn", "BSD-3-Clause"),
    ("transformers", "Apache-2.0"),
    ("torch", "BSD-3-Clause"),
]
SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages", "idle_test", "turtledemo",
             "lib2to3", "ensurepip", "pydoc_data", "_vendor", "vendored", "_vendored",
             "externals", "third_party", "_lib"}
SAMPLE_PROMPT = "def fibonacci(n):"
SAMPLE_TOKENS = 40


def log(*a):
    print(*a, flush=True)


def python_files(root, max_file_bytes=300_000, skip_tests=False):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames
            if d not in SKIP_DIRS and not d.startswith(".")
            and not (skip_tests and d in ("test", "tests")))
        for fn in sorted(filenames):
            if fn.endswith(".py"):
                p = os.path.join(dirpath, fn)
                try:
                    if not os.path.islink(p) and 200 <= os.path.getsize(p) <= max_file_bytes:
                        out.append(p)
                except OSError:
                    pass
    return out


def read_corpus(max_bytes):
    sources = [("python-stdlib", sysconfig.get_paths()["stdlib"], "PSF-2.0", True)]
    for name, lic in PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            log(f"  package {name} not found, skipped")
            continue
        sources.append((name, list(spec.submodule_search_locations)[0], lic, False))
    docs, total, used = [], 0, []
    for name, root, lic, is_stdlib in sources:
        n0, b0 = len(docs), total
        for p in python_files(root, skip_tests=is_stdlib):
            try:
                with open(p, encoding="utf-8") as f:
                    t = f.read()
            except (UnicodeDecodeError, OSError):
                continue
            docs.append(t)
            total += len(t.encode("utf-8"))
            if total >= max_bytes:
                break
        used.append({"source": name, "path": root, "license": lic, "files": len(docs) - n0,
                     "bytes": total - b0})
        if total >= max_bytes:
            break
    return docs, total, used


def train_tokenizer(docs, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator(docs, trainer=trainer)
    return tk


def encode_corpus(tk, docs, eos, time_limit):
    import numpy as np
    t0 = time.time()
    parts, ntok, ndocs = [], 0, 0
    chunk = 2000
    for i in range(0, len(docs), chunk):
        encs = tk.encode_batch(docs[i:i + chunk])
        for e in encs:
            a = np.asarray(e.ids + [eos], dtype=np.int32)
            parts.append(a)
            ntok += a.size
        ndocs = min(len(docs), i + chunk)
        if time.time() - t0 > time_limit:
            log(f"  encoding stopped by time limit after {ndocs} docs")
            break
    arr = np.concatenate(parts)
    return torch.from_numpy(arr.astype(np.int64)), ndocs


def build_config(V, eos, im_end):
    return Qwen3Config(
        vocab_size=V,
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=6,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        bos_token_id=None,
        eos_token_id=im_end,
        pad_token_id=eos,
    )


def make_model(cfg, attn):
    try:
        return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
    except Exception as e:  # noqa: BLE001
        log(f"  from_config({attn}) failed: {e!r}; falling back to eager")
        return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")


def batches(data, bsz, seq, g, device):
    n = data.numel() - seq - 2
    ar = torch.arange(seq + 1, device=device)
    while True:
        starts = torch.randint(0, n, (bsz,), generator=g).to(device)
        b = data[starts[:, None] + ar[None, :]]
        yield b[:, :-1], b[:, 1:]


def loss_of(model, x, y):
    logits = model(input_ids=x).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                             y.reshape(-1))


def save_all(model, hf_tok, d, eos, im_end):
    os.makedirs(d, exist_ok=True)
    model.generation_config = GenerationConfig(eos_token_id=[im_end, eos], pad_token_id=eos)
    try:
        model.save_pretrained(d, safe_serialization=True)
    except TypeError:
        model.save_pretrained(d)
    hf_tok.save_pretrained(d)
    GenerationConfig(eos_token_id=[im_end, eos], pad_token_id=eos).save_pretrained(d)


def reference_sample(d, prompt, n):
    tok = AutoTokenizer.from_pretrained(d)
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    m.eval()
    ids = [int(t) for t in tok.encode(prompt)]
    inp = torch.tensor([ids])
    eos_ids = m.generation_config.eos_token_id
    eos_ids = eos_ids if isinstance(eos_ids, list) else [eos_ids]
    with torch.no_grad():
        out = m.generate(input_ids=inp, attention_mask=torch.ones_like(inp), do_sample=False,
                         max_new_tokens=n, min_new_tokens=n, output_logits=True,
                         return_dict_in_generate=True, pad_token_id=tok.pad_token_id)
    gen = out.sequences[0, len(ids):].tolist()
    steps = []
    for i, lg in enumerate(out.logits):
        lp = torch.log_softmax(lg[0].float(), -1)
        top = torch.topk(lp, 5)
        steps.append({"token_id": gen[i], "logprob": float(lp[gen[i]]),
                      "top": [{"token_id": int(t), "logprob": float(v)}
                              for v, t in zip(top.values.tolist(), top.indices.tolist())]})
    return {
        "prompt_text": prompt,
        "prompt_token_ids": ids,
        "generated_token_ids": gen,
        "generated_text": tok.decode(gen),
        "steps": steps,
        "method": "transformers model.generate(do_sample=False, max_new_tokens=%d, "
                  "min_new_tokens=%d, output_logits=True), CPU, weights loaded from the bf16 "
                  "safetensors into fp32, attn_implementation=eager; logprobs are log_softmax of "
                  "the raw logits; eos ids %s are masked by min_new_tokens" % (n, n, eos_ids),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-seconds", type=float, default=420.0)
    ap.add_argument("--deadline", type=float, default=None,
                    help="unix time by which everything (save, sample) must be done")
    ap.add_argument("--corpus-bytes", type=int, default=80_000_000)
    ap.add_argument("--tokenizer-bytes", type=int, default=16_000_000)
    ap.add_argument("--bsz", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    args = ap.parse_args()

    t0 = time.time()
    torch.manual_seed(0)
    assert torch.cuda.is_available(), "needs a GPU"
    device = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    log(f"transformers {transformers.__version__} torch {torch.__version__} "
        f"{torch.cuda.get_device_name(0)}")

    docs, nbytes, used = read_corpus(args.corpus_bytes)
    log(f"corpus: {len(docs)} files, {nbytes} bytes ({time.time() - t0:.1f}s)")
    for u in used:
        log(f"  {u}")
    # tokenizer: trained on an evenly spread subset of the corpus
    stride = max(1, int(math.ceil(nbytes / args.tokenizer_bytes)))
    tk = train_tokenizer(docs[::stride], 8192)
    V = tk.get_vocab_size()
    eos, im_start, im_end = (tk.token_to_id(s) for s in SPECIALS)
    log(f"tokenizer: vocab {V} eos {eos} im_start {im_start} im_end {im_end} "
        f"({time.time() - t0:.1f}s)")
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>",
                                     pad_token="<|endoftext|>", clean_up_tokenization_spaces=False,
                                     model_max_length=2048)
    hf_tok.chat_template = CHAT_TEMPLATE
    data, ndocs = encode_corpus(tk, docs, eos, time_limit=60)
    del docs
    # hold out the last 0.5% for validation
    nval = data.numel() // 200
    val, train_data = data[-nval:].to(device), data[:-nval].to(device)
    log(f"tokens: train {train_data.numel()} val {val.numel()} from {ndocs} docs "
        f"({time.time() - t0:.1f}s)")

    cfg = build_config(V, eos, im_end)
    tmp = "/tmp/demo_dryrun"
    # dry run: a few steps, save, reload, generate -- so a late failure cannot waste the run
    torch.manual_seed(1)
    m = make_model(cfg, "sdpa").to(device)
    g = torch.Generator().manual_seed(0)
    it = batches(train_data, 4, 64, g, device)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    for _ in range(2):
        x, y = next(it)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(m, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    shutil.rmtree(tmp, ignore_errors=True)
    save_all(m.to(torch.bfloat16).cpu(), hf_tok, tmp, eos, im_end)
    reference_sample(tmp, SAMPLE_PROMPT, 3)
    log(f"dry run ok ({time.time() - t0:.1f}s)")
    del m, opt

    torch.manual_seed(1234)
    model = make_model(cfg, "sdpa").to(device)
    nparams = sum(p.numel() for p in model.parameters())
    log(f"model: {nparams} parameters (tied embeddings counted once)")
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                weight_decay=0.1, fused=True)
    except Exception:  # noqa: BLE001
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                weight_decay=0.1)
    g = torch.Generator().manual_seed(42)
    it = batches(train_data, args.bsz, args.seq, g, device)

    budget = args.train_seconds
    if args.deadline is not None:
        budget = min(budget, args.deadline - time.time() - 45)
    log(f"training budget {budget:.0f}s")
    # learning-rate schedule by wall-clock progress (the GPU may be shared with other work while
    # this runs, so a step count fixed in advance would over- or undershoot the budget)
    warm = 200
    t_train = time.time()
    step, losses = 0, []
    model.train()
    while True:
        progress = (time.time() - t_train) / budget
        if progress >= 1.0:
            break
        lr = args.lr * (step + 1) / warm if step < warm else \
            args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for pg in opt.param_groups:
            pg["lr"] = lr
        x, y = next(it)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0:
            lv = loss.item()
            losses.append((step, lv))
            log(f"  step {step:5d} loss {lv:.4f} lr {lr:.2e} ({time.time() - t0:.0f}s)")
        step += 1
    model.eval()
    # final train loss (mean of 8 fresh batches) and validation loss
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        tr = sum(loss_of(model, *next(it)).item() for _ in range(8)) / 8
        gv = torch.Generator().manual_seed(7)
        vit = batches(val, args.bsz, args.seq, gv, device)
        vl = sum(loss_of(model, *next(vit)).item() for _ in range(8)) / 8
    train_time = time.time() - t_train
    log(f"trained {step} steps in {train_time:.0f}s: train loss {tr:.4f} val loss {vl:.4f}")

    out = args.out
    shutil.rmtree(out, ignore_errors=True)
    model = model.to(torch.bfloat16).cpu()
    save_all(model, hf_tok, out, eos, im_end)
    sizes = {f: os.path.getsize(os.path.join(out, f)) for f in sorted(os.listdir(out))}
    log(f"saved: {sizes}")
    sample = reference_sample(out, SAMPLE_PROMPT, SAMPLE_TOKENS)
    with open(os.path.join(out, "sample_reference.json"), "w", encoding="utf-8") as f:
        json.dump(sample, f, indent=1, ensure_ascii=False)
        f.write("\n")
    log("sample: " + json.dumps(SAMPLE_PROMPT + sample["generated_text"]))

    stats = {
        "parameters": nparams, "vocab_size": V, "steps": step, "batch": args.bsz,
        "seq": args.seq, "tokens_seen": step * args.bsz * args.seq, "train_seconds": train_time,
        "final_train_loss": tr, "final_val_loss": vl, "corpus_bytes": nbytes,
        "corpus_docs_encoded": ndocs, "train_tokens": int(train_data.numel()),
        "val_tokens": int(val.numel()), "sources": used, "loss_curve": losses,
        "peak_lr": args.lr, "gpu": torch.cuda.get_device_name(0),
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "sample": SAMPLE_PROMPT + sample["generated_text"],
    }
    with open(os.path.join(out, "training_stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
        f.write("\n")
    write_card(out, stats, sizes)
    log(f"done in {time.time() - t0:.0f}s")


def write_card(out, s, sizes):
    licences = ", ".join(sorted({u["license"] for u in s["sources"]}))
    src_lines = "\n".join(
        f"| {u['source']} | {u['license']} | {u['files']} | {u['bytes'] / 1e6:.1f} MB |"
        for u in s["sources"])
    card = f"""# llmts demo model

A tiny **demo** language model bundled with llmts so that `llmts serve --model models/demo`
works out of the box. It was trained from scratch for a few minutes on Python source code, so it
writes Python-ish text; it does not follow instructions or answer questions, whatever the chat
template suggests. Use it to try the engine and as a regression reference, not for anything else.

## Architecture

Hugging Face `Qwen3ForCausalLM` (model_type `qwen3`), bf16 safetensors:

| | |
| --- | --- |
| parameters | {s['parameters']:,} (tied input/output embeddings) |
| vocab | {s['vocab_size']} (byte-level BPE trained on the corpus; `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`) |
| hidden size | 384 |
| layers | 6 |
| attention heads | 6 query, 2 key/value (GQA), head_dim 64, q/k RMSNorm |
| MLP | SwiGLU, intermediate size 1024 |
| RoPE | default, theta 1e6 |
| max positions | 2048 |

Chat template: ChatML (`<|im_start|>role\\n...<|im_end|>\\n`). generation_config eos:
`<|im_end|>` and `<|endoftext|>`.

## Training

- Corpus: the Python source files of the Python {sys.version_info.major}.{sys.version_info.minor}
  standard library (test folders skipped) and of installed packages, read in sorted order:

| source | licence | files | size |
| --- | --- | --- | --- |
{src_lines}

  Files are joined with `<|endoftext|>`; {s['train_tokens']:,} training tokens, {s['val_tokens']:,} held out.
- {s['steps']:,} AdamW steps (peak lr {s['peak_lr']}, warmup 200 steps, then cosine to 10% over the
  wall-clock budget, weight decay 0.1,
  grad clip 1), batch {s['batch']} x {s['seq']} tokens ({s['tokens_seen']:,} tokens seen), bf16
  autocast, {s['train_seconds']:.0f} s on one {s['gpu']}.
- Final loss: train {s['final_train_loss']:.3f}, held-out {s['final_val_loss']:.3f} (nats/token).
- Built with transformers {s['transformers_version']}, torch {s['torch_version']} by
  `tools/demo/train_demo.py`; `training_stats.json` has the details and the loss curve.

Greedy sample (transformers, fp32): 

```python
{s['sample']}
```

`sample_reference.json` holds that continuation's token ids and per-step top-5 logprobs so the
engine can be checked against transformers.

## Licence

The weights are released with llmts under the Apache-2.0 licence. They were trained on source
code under the permissive licences listed above ({licences}); the model is a toy that may
reproduce fragments of that code.
"""
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
        f.write(card)


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)
