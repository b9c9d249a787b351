#!/usr/bin/env python3
"""Train the demo model's draft model for speculative decoding: a 2-layer Qwen3 that shares the
demo's tokenizer, distilled from the demo mostly on the demo's own greedy text. PyTorch on the CPU:

    python3 tools/demo/train_draft.py --out models/demo-draft [--train-seconds 900]

Steps: encode train_demo.py's corpus with models/demo's tokenizer (spec_common.corpus_tokens,
cached); generate (or read from the cache) the demo's greedy continuations of training windows
with their top-k logprobs (spec_common.greedy_corpus, by llmts); start the draft's tied embedding
from the demo's (its top principal directions); then for a wall-clock budget train on greedy
batches (cross-entropy from the demo's renormalised top-k distribution at the continuation's
positions), every --corpus-every'th step on a corpus batch instead (KL from the demo's next-token
distributions, computed on the fly in fp32, plus a little corpus cross-entropy). Saves bf16
safetensors with the demo's tokenizer files, a transformers reference continuation
(sample_reference.json) and the greedy acceptance against the demo on held-out text (draft
length 4), written into README.md. See tools/demo/README.md.
"""

import argparse
import json
import math
import os
import shutil
import sys
import time
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, DynamicCache, GenerationConfig, Qwen3Config  # noqa: E402

from spec_common import (acceptance, batches, corpus_tokens, greedy_corpus,  # noqa: E402
                         held_out_greedy, log, machine, split_held_out)
from train_demo import SAMPLE_PROMPT, SAMPLE_TOKENS, reference_sample  # noqa: E402

TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]


def build_config(demo_cfg, args):
    return Qwen3Config(
        vocab_size=demo_cfg.vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=demo_cfg.max_position_embeddings,
        rms_norm_eps=demo_cfg.rms_norm_eps,
        initializer_range=0.02,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        bos_token_id=None,
        eos_token_id=demo_cfg.eos_token_id,
        pad_token_id=demo_cfg.pad_token_id,
    )


@torch.no_grad()
def init_embedding_from(draft, demo):
    """The draft's tied embedding starts as the demo's projected on its top principal directions:
    token similarity the demo learned from 390M tokens, which this CPU budget cannot relearn."""
    e = demo.get_input_embeddings().weight.float()
    d = draft.get_input_embeddings().weight.shape[1]
    _, s, vh = torch.linalg.svd(e - e.mean(0, keepdim=True), full_matrices=False)
    proj = e @ vh[:d].T
    # at the scale of a fresh embedding: with tied weights a larger one starts with huge logits
    draft.get_input_embeddings().weight.copy_(proj / proj.std() * draft.config.initializer_range)
    return float((s[:d] ** 2).sum() / (s ** 2).sum())


def distill_loss(draft, demo, x, y, alpha):
    """alpha * KL(demo || draft) + (1 - alpha) * CE(corpus next token), per token, in nats.

    The demo runs in fp32: on a CPU without bf16 dot-product instructions (AVX2 only) bf16
    autocast is about twice as slow."""
    with torch.no_grad():
        t_logits = demo(input_ids=x).logits
    t_logp = F.log_softmax(t_logits.float(), -1)
    logits = draft(input_ids=x).logits.float()
    logp = F.log_softmax(logits, -1)
    kl = (t_logp.exp() * (t_logp - logp)).sum(-1).mean()
    ce = F.nll_loss(logp.reshape(-1, logp.shape[-1]), y.reshape(-1))
    return alpha * kl + (1 - alpha) * ce, kl, ce


def sparse_kd_loss(draft, seqs, top_ids, top_lp, prompt_len):
    """On greedy sequences (greedy_corpus): the cross-entropy from the demo's top-k distribution
    (renormalised) to the draft's at the continuation's positions, per token, and the draft's
    top-1 agreement with the demo there."""
    gen = top_ids.shape[1]
    logits = draft(input_ids=seqs[:, :prompt_len + gen - 1]).logits[:, prompt_len - 1:]
    logp = F.log_softmax(logits.float(), -1)
    p = F.softmax(top_lp, -1)
    ce = -(p * logp.gather(-1, top_ids.long())).sum(-1).mean()
    agree = (logp.argmax(-1) == top_ids[..., 0].long()).float().mean()
    return ce, agree


class DraftProposer:
    """Greedy drafts from a transformers causal LM with a KV cache that keeps the longest prefix
    still shared with the context (so a rejected draft costs only its own positions)."""

    def __init__(self, model):
        self.model = model
        self.cache = None
        self.cached = []

    @torch.no_grad()
    def __call__(self, seq, c, k):
        ctx = seq[:c]
        keep = 0
        while keep < min(len(self.cached), c - 1) and self.cached[keep] == ctx[keep]:
            keep += 1
        if self.cache is None or keep == 0:
            self.cache, keep = DynamicCache(), 0
        elif self.cache.get_seq_length() > keep:
            self.cache.crop(keep - self.cache.get_seq_length())
        feed = ctx[keep:]
        out = []
        for _ in range(k):
            logits = self.model(input_ids=torch.tensor([feed]), past_key_values=self.cache, use_cache=True).logits
            nxt = int(logits[0, -1].argmax())
            out.append(nxt)
            feed = [nxt]
        self.cached = ctx + out[:-1]
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--demo", default="models/demo")
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-seconds", type=float, default=900.0)
    ap.add_argument("--corpus-bytes", type=int, default=80_000_000)
    ap.add_argument("--cache-dir", default="/tmp/llmts-spec-cache")
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--bsz", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--alpha", type=float, default=0.9, help="weight of the KL to the demo (rest: corpus CE)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--greedy-sequences", type=int, default=2048,
                    help="demo greedy continuations of training windows to train on (0: the corpus only)")
    ap.add_argument("--greedy-topk", type=int, default=16)
    ap.add_argument("--corpus-every", type=int, default=4,
                    help="with greedy data, every Nth step distils on a corpus batch instead (0: never)")
    ap.add_argument("--eval-prompts", type=int, default=24)
    ap.add_argument("--eval-prompt-len", type=int, default=96)
    ap.add_argument("--eval-gen", type=int, default=64)
    args = ap.parse_args()

    t0 = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    log(f"transformers {transformers.__version__} torch {torch.__version__}, {args.threads} threads")
    data, corpus = corpus_tokens(args.demo, args.corpus_bytes, args.cache_dir)
    train, val = split_held_out(data)
    log(f"tokens: train {train.numel()} held out {val.numel()}")

    demo = AutoModelForCausalLM.from_pretrained(args.demo, dtype=torch.float32, attn_implementation="sdpa").eval()
    for p in demo.parameters():
        p.requires_grad_(False)
    cfg = build_config(demo.config, args)
    torch.manual_seed(1234)
    draft = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    explained = init_embedding_from(draft, demo)
    nparams = sum(p.numel() for p in draft.parameters())
    log(f"draft: {nparams} parameters; embedding from the demo's top {args.hidden} principal directions "
        f"({explained:.1%} of its variance)")

    g = torch.Generator().manual_seed(42)
    gen = None
    if args.greedy_sequences > 0:
        gen = greedy_corpus(args.demo, train, args.greedy_sequences, args.eval_prompt_len, args.eval_gen,
                            args.greedy_topk, args.cache_dir)
    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    it = batches(train, args.bsz, args.seq, g)
    gbsz = max(1, args.bsz * args.seq // (args.eval_prompt_len + args.eval_gen))
    warm = args.warmup
    budget = args.train_seconds
    t_train = time.time()
    step, corpus_steps, curve = 0, 0, []
    draft.train()
    while True:
        progress = (time.time() - t_train) / budget
        if progress >= 1.0:
            break
        lr = args.lr * (step + 1) / warm if step < warm else \
            args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for pg in opt.param_groups:
            pg["lr"] = lr
        corpus_step = gen is None or (args.corpus_every > 0 and step % args.corpus_every == args.corpus_every - 1)
        if corpus_step:
            corpus_steps += 1
            x, y = next(it)
            loss, kl, ce = distill_loss(draft, demo, x, y, args.alpha)
        else:
            pick = torch.randint(0, gen[0].shape[0], (gbsz,), generator=g)
            loss, agree = sparse_kd_loss(draft, gen[0][pick], gen[1][pick], gen[2][pick], args.eval_prompt_len)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or (step % 25 == args.corpus_every - 1 and gen is not None):
            if corpus_step:
                curve.append((step, "corpus", round(kl.item(), 4), round(ce.item(), 4)))
                log(f"  step {step:5d} corpus kl {kl.item():.4f} ce {ce.item():.4f} lr {lr:.2e} ({time.time() - t0:.0f}s)")
            else:
                curve.append((step, "greedy", round(loss.item(), 4), round(agree.item(), 4)))
                log(f"  step {step:5d} greedy ce {loss.item():.4f} top-1 {agree.item():.3f} lr {lr:.2e} ({time.time() - t0:.0f}s)")
        step += 1
    train_time = time.time() - t_train
    draft.eval()
    with torch.no_grad():
        gv = torch.Generator().manual_seed(7)
        vit = batches(val, args.bsz, args.seq, gv)
        vals = [distill_loss(draft, demo, *next(vit), args.alpha) for _ in range(4)]
        val_kl = sum(float(v[1]) for v in vals) / len(vals)
        val_ce = sum(float(v[2]) for v in vals) / len(vals)
    log(f"trained {step} steps in {train_time:.0f}s: held-out KL {val_kl:.4f} CE {val_ce:.4f}")

    out = args.out
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    draft = draft.to(torch.bfloat16)
    draft.generation_config = GenerationConfig.from_pretrained(args.demo)
    draft.save_pretrained(out)
    for f in TOKENIZER_FILES:
        shutil.copyfile(os.path.join(args.demo, f), os.path.join(out, f))
    sample = reference_sample(out, SAMPLE_PROMPT, SAMPLE_TOKENS)
    with open(os.path.join(out, "sample_reference.json"), "w", encoding="utf-8") as f:
        json.dump(sample, f, indent=1, ensure_ascii=False)
        f.write("\n")
    log("sample: " + json.dumps(SAMPLE_PROMPT + sample["generated_text"]))

    # acceptance: the saved bf16 weights, loaded as fp32 like the reference
    ev = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    t_acc = time.time()
    seqs = held_out_greedy(demo, args.demo, val, args.eval_prompts, args.eval_prompt_len, args.eval_gen, args.cache_dir)
    acc = acceptance(DraftProposer(ev), seqs, 4)
    log(f"acceptance (draft length 4): {json.dumps(acc)} ({time.time() - t_acc:.0f}s)")

    sizes = {f: os.path.getsize(os.path.join(out, f)) for f in sorted(os.listdir(out))}
    stats = {
        "parameters": nparams, "hidden_size": args.hidden, "layers": args.layers, "heads": args.heads,
        "kv_heads": args.kv_heads, "intermediate_size": args.intermediate, "steps": step,
        "corpus_steps": corpus_steps, "batch": args.bsz, "seq": args.seq, "greedy_batch": gbsz,
        "train_seconds": train_time, "threads": args.threads, "peak_lr": args.lr, "warmup": args.warmup, "alpha": args.alpha,
        "greedy_sequences": args.greedy_sequences, "greedy_topk": args.greedy_topk, "corpus_every": args.corpus_every,
        "embedding_variance_kept": explained, "held_out_kl": val_kl, "held_out_ce": val_ce,
        "train_tokens": int(train.numel()), "held_out_tokens": int(val.numel()), "corpus": corpus,
        "acceptance": acc, "acceptance_eval": {"prompts": args.eval_prompts, "prompt_tokens": args.eval_prompt_len,
                                               "generated_tokens": args.eval_gen},
        "loss_curve": curve, "transformers_version": transformers.__version__,
        "torch_version": torch.__version__, "machine": machine(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "sample": SAMPLE_PROMPT + sample["generated_text"],
        "command": " ".join(sys.argv),
    }
    with open(os.path.join(out, "training_stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
        f.write("\n")
    write_card(out, stats, sizes)
    log(f"done in {time.time() - t0:.0f}s")


def write_card(out, s, sizes):
    acc = s["acceptance"]
    ev = s["acceptance_eval"]
    greedy = (f"the demo's own greedy continuations ({s['greedy_sequences']:,} of them, {ev['generated_tokens']} tokens "
              f"after {ev['prompt_tokens']}-token training windows drawn at random, eos not ending them, each token with "
              f"the demo's top-{s['greedy_topk']} logprobs; generated by llmts with `tools/demo/greedy_corpus.ts`: what "
              f"the draft has to predict in use), {s['greedy_batch']} sequences a step; every {s['corpus_every']}th step "
              f"a corpus batch of {s['batch']} x {s['seq']} tokens instead"
              if s["greedy_sequences"] > 0 else f"corpus batches of {s['batch']} x {s['seq']} tokens only")
    srcs = ", ".join(f"{u['source']} ({u['bytes'] / 1e6:.1f} MB)" for u in s["corpus"]["sources"])
    card = f"""# llmts demo draft model

A 2-layer **draft model** for speculative decoding with the demo model (`models/demo`): it shares
the demo's tokenizer (the tokenizer files here are copies of the demo's) and was distilled from
the demo, mostly on the demo's own greedy continuations, so it proposes what the demo would
write. It is an ordinary model too (`llmts generate --model models/demo-draft`), a weaker one. A
toy, like the demo.

## Architecture

Hugging Face `Qwen3ForCausalLM` (model_type `qwen3`), bf16 safetensors ({sizes['model.safetensors'] / 1e6:.1f} MB):

| | |
| --- | --- |
| parameters | {s['parameters']:,} (tied input/output embeddings; the 8192 x {s['hidden_size']} embedding is most of them) |
| vocab | 8192, the demo's |
| hidden size | {s['hidden_size']} |
| layers | {s['layers']} |
| attention heads | {s['heads']} query, {s['kv_heads']} key/value, head_dim {s['hidden_size'] // s['heads']}, q/k RMSNorm |
| MLP | SwiGLU, intermediate size {s['intermediate_size']} |
| RoPE | default, theta 1e6 |

Why this size: a decode step of a model this small costs mostly its weight reads, and the draft
runs once per proposed token, so its weights should be a small fraction of the demo's
(12.6M parameters): {s['parameters'] / 12_588_672:.0%} here. Two layers are the fewest that
attend over the context through a second position (induction-style copying, which code repeats
a lot); hidden {s['hidden_size']} keeps the embedding, shared with the output layer, able to hold the
demo's token similarities (its top {s['hidden_size']} principal directions keep
{s['embedding_variance_kept']:.0%} of the demo embedding's variance).

## Training

- Corpus: the recipe of `tools/demo/train_demo.py` (the Python {s['corpus']['python']} standard library,
  then installed packages in a fixed order, 80 MB cap) encoded with the demo's tokenizer: {srcs};
  {s['train_tokens']:,} training tokens, the last {s['held_out_tokens']:,} held out.
- Start: the tied embedding is the demo's embedding projected on its top {s['hidden_size']} principal
  directions; everything else is freshly initialised.
- Data: {greedy}
- Objective: on greedy sequences, the cross-entropy from the demo's top-{s['greedy_topk']} distribution
  (renormalised) to the draft's at each of the {ev['generated_tokens']} continuation positions (the prompt
  positions only as context); on corpus batches, {s['alpha']} x KL(demo || draft) over the demo's
  next-token distributions at every position (the demo in fp32, on the fly) + {1 - s['alpha']:.1f} x
  cross-entropy on the corpus tokens.
- {s['steps']:,} AdamW steps ({s['corpus_steps']:,} of them on corpus batches; peak lr {s['peak_lr']}, warmup {s['warmup']} steps, cosine to 10% over the
  wall-clock budget, weight decay 0.1, grad clip 1), fp32, {s['train_seconds']:.0f} s on {s['threads']} CPU threads
  ({s['machine']}), {s['date']}.
- Held-out corpus text (4 batches of {s['batch']} x {s['seq']}): KL to the demo {s['held_out_kl']:.3f}, cross-entropy
  {s['held_out_ce']:.3f} nats/token.
- Built with transformers {s['transformers_version']}, torch {s['torch_version']} by
  `{s['command']}`; `training_stats.json` has the details and the loss curve.

## Acceptance

Greedy speculative decoding against the demo, simulated with transformers (fp32, CPU,
`spec_common.acceptance`): on {ev['prompts']} held-out windows of {ev['prompt_tokens']} tokens (a seeded draw), the
demo's greedy continuation of {ev['generated_tokens']} tokens by transformers; from the end of the prompt,
each round the draft proposes 4 tokens (fewer at the end of a continuation), the accepted ones
are the longest prefix the demo's greedy tokens agree with, the demo adds its own next token, and
the context moves on by accepted + 1. Acceptance rate = accepted / drafted tokens.

| draft length | rounds | acceptance rate | mean accepted | tokens per demo forward | accepted 0/1/2/3/4 |
| --- | --- | --- | --- | --- | --- |
| 4 | {acc['rounds']} | {acc['acceptance_rate']:.1%} | {acc['mean_accepted']:.2f} | {acc['tokens_per_verify']:.2f} | {' / '.join(str(h) for h in acc['accepted_histogram'])} |

Greedy sample (transformers, fp32):

```python
{s['sample']}
```

`sample_reference.json` holds that continuation's token ids and per-step top-5 logprobs so the
engine can be checked against transformers.

## Licence

Apache-2.0, like the demo model; trained on the demo's corpus and outputs (permissive licences:
PSF-2.0, BSD-3-Clause, Apache-2.0).
"""
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
        f.write(card)


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)
