#!/usr/bin/env python3
"""Train an EAGLE-3 draft head for the demo model, in the published EAGLE-3 checkpoint layout
(eagle3_head.py), with PyTorch on the CPU:

    python3 tools/demo/train_eagle3.py --out models/demo-eagle3 [--train-seconds 900] [--ttt-steps 3]

Steps: encode train_demo.py's corpus with the demo's tokenizer (spec_common.corpus_tokens,
cached); read the demo's greedy continuations of training windows (spec_common.greedy_corpus, by
llmts, shared with train_draft.py's cache); pick the draft vocabulary (the most frequent training
tokens; d2t / t2d); start lm_head and norm from the demo's output layer and fc from the identity
on the highest fused layer; then for a wall-clock budget: take a batch of greedy sequences (every
--corpus-every'th step a corpus batch instead), run the demo (fp32, no gradients) over it for its
hidden states at the EAGLE-3 layers and its next-token distributions, and train the head with the
EAGLE-3 training-time test (--ttt-steps chained drafts from every position, each step's hidden
state the previous step's output, loss weights 0.8^k; 1 = the plain next-token objective) on the
demo's distributions restricted to the draft vocabulary. Saves model.safetensors (bf16 weights,
int64 d2t, bool t2d), config.json, the greedy acceptance against the demo on held-out text
(draft length 4) in README.md, and the reference of tools/demo/eagle3_reference.py.
See tools/demo/README.md.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from eagle3_head import Eagle3Head  # noqa: E402
from spec_common import (acceptance, batches, corpus_tokens, greedy_corpus,  # noqa: E402
                         held_out_greedy, log, machine, split_held_out)


def head_config(demo_cfg, args):
    n = demo_cfg.num_hidden_layers
    layers = [int(x) for x in args.layers.split(",")] if args.layers else [1, n // 2, n - 1]
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": demo_cfg.hidden_size,
        "target_hidden_size": demo_cfg.hidden_size,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": 1,
        "num_attention_heads": demo_cfg.num_attention_heads,
        "num_key_value_heads": demo_cfg.num_key_value_heads,
        "head_dim": demo_cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": demo_cfg.rms_norm_eps,
        "max_position_embeddings": demo_cfg.max_position_embeddings,
        "rope_theta": float(demo_cfg.rope_parameters["rope_theta"]),
        "rope_scaling": None,
        "vocab_size": demo_cfg.vocab_size,
        "draft_vocab_size": args.draft_vocab,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": demo_cfg.eos_token_id,
        "pad_token_id": demo_cfg.pad_token_id,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers, "use_aux_hidden_state": True},
    }


def draft_vocab(train, V, k):
    """The k most frequent training tokens, in target-id order (as SpecForge builds d2t / t2d)."""
    counts = torch.bincount(train, minlength=V)
    ids = torch.sort(torch.topk(counts, k).indices).values
    coverage = float(counts[ids].sum() / counts.sum())
    return ids, coverage


@torch.no_grad()
def init_head(head, demo, ids):
    """lm_head and norm start as the demo's output layer over the draft vocabulary (the head's
    output space is the demo's last hidden space); fc starts as the identity on the highest fused
    layer plus the default random init on the others."""
    head.lm_head.weight.copy_(demo.lm_head.weight[ids])
    head.norm.weight.copy_(demo.model.norm.weight)
    d = head.fc.weight.shape[0]
    w = head.fc.weight
    w[:, 2 * d:] = torch.eye(d)


@torch.no_grad()
def target_pass(demo, x, layers):
    """The demo over x [B, W]: the hidden states entering `layers` (output_hidden_states[l]) and
    the logits. In fp32: on a CPU without bf16 dot-product instructions (AVX2 only) bf16 autocast
    is about twice as slow, and the head then trains on the states it is measured with."""
    out = demo(input_ids=x, output_hidden_states=True)
    hs = [out.hidden_states[l].float() for l in layers]
    return hs, out.logits.float()


def ttt_loss(head, x, hs, logits, ids, steps, L):
    """Loss over `steps` training-time-test steps on windows x [B, L + steps] (the pairs at
    positions 0..L-1; step k's inputs and labels reach k positions further)."""
    hid0 = head.fuse(*(h[:, :L] for h in hs))
    outs = head.ttt(x, hid0, steps)
    total, per_step = 0.0, []
    for k, lg in enumerate(outs):
        t = logits[:, 1 + k:1 + k + L]  # the demo's distribution for token i + 2 + k
        p = F.softmax(t[..., ids], -1)
        logq = F.log_softmax(lg.float(), -1)
        ce = -(p * logq).sum(-1).mean()
        acc = (ids[lg.argmax(-1)] == t.argmax(-1)).float().mean()
        total = total + (0.8 ** k) * ce
        per_step.append((float(ce.detach()), float(acc)))
    return total, per_step


class Eagle3Proposer:
    """Greedy drafts from the head for one sequence at a time: the head's KV over the sequence's
    context pairs (target hidden state at i, token i + 1) is computed once per sequence (pairs
    never change: the context is the target's own output), then each round chains k steps."""

    def __init__(self, head, demo, layers):
        self.head, self.demo, self.layers = head, demo, layers
        self.seq = None

    @torch.no_grad()
    def prepare(self, seq):
        ids = torch.tensor([seq])
        hs, _ = target_pass(self.demo, ids, self.layers)
        n = len(seq) - 1
        hid = self.head.fuse(*(h[:, :n] for h in hs))
        self.out, self.kv = self.head.chunk(ids[:, 1:], hid, torch.arange(n)[None])
        self.seq = seq

    @torch.no_grad()
    def __call__(self, seq, c, k):
        if self.seq is not seq:
            self.prepare(seq)
        # pairs at positions 0 .. c - 2; the last one predicts token c
        past = (self.kv[0][:, :, :c - 1], self.kv[1][:, :, :c - 1])
        o = self.out[:, c - 2:c - 1]
        drafts = []
        for j in range(k):
            tok = self.head.to_target(self.head.logits(o)[0, -1].argmax())
            drafts.append(int(tok))
            if j + 1 < k:
                o, past = self.head.chunk(tok.view(1, 1), o, torch.tensor([[c - 1 + j]]), past)
        return drafts


def self_check(cfg, demo):
    """The training-time test computes what chained inference steps compute."""
    torch.manual_seed(5)
    head = Eagle3Head(cfg, demo.get_input_embeddings()).eval()
    B, L, steps = 2, 9, 3
    tokens = torch.randint(3, cfg["vocab_size"], (B, L + steps))
    hid0 = torch.randn(B, L, cfg["hidden_size"])
    with torch.no_grad():
        outs = head.ttt(tokens, hid0, steps)
        for i in (0, 4, L - 1):
            o, past = head.chunk(tokens[:, 1:i + 2], hid0[:, :i + 1], torch.arange(i + 1)[None].expand(B, -1))
            o = o[:, -1:]
            for k in range(steps):
                if k > 0:
                    o, past = head.chunk(tokens[:, i + 1 + k:i + 2 + k], o, torch.full((B, 1), i + k), past)
                diff = (head.logits(o)[:, 0] - outs[k][:, i]).abs().max().item()
                assert diff < 1e-4, f"ttt step {k} at {i} differs from the chained steps by {diff}"
    log("self-check: the training-time test equals chained inference steps")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--demo", default="models/demo")
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-seconds", type=float, default=900.0)
    ap.add_argument("--ttt-steps", type=int, default=3, help="training-time-test steps (1: plain next-token objective)")
    ap.add_argument("--layers", default="", help="target layers whose input hidden states are fused (default 1,N/2,N-1)")
    ap.add_argument("--draft-vocab", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--corpus-bytes", type=int, default=80_000_000)
    ap.add_argument("--cache-dir", default="/tmp/llmts-spec-cache")
    ap.add_argument("--bsz", type=int, default=8,
                    help="corpus windows a batch (greedy batches hold about as many positions)")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--greedy-sequences", type=int, default=2048,
                    help="demo greedy continuations of training windows to train on (0: the corpus only)")
    ap.add_argument("--greedy-topk", type=int, default=16, help="(shares train_draft.py's cached greedy data)")
    ap.add_argument("--corpus-every", type=int, default=4,
                    help="with greedy data, every Nth step trains on a corpus batch instead (0: never)")
    ap.add_argument("--eval-prompts", type=int, default=24)
    ap.add_argument("--eval-prompt-len", type=int, default=96)
    ap.add_argument("--eval-gen", type=int, default=64)
    args = ap.parse_args()

    t0 = time.time()
    torch.set_num_threads(args.threads)
    log(f"transformers {transformers.__version__} torch {torch.__version__}, {args.threads} threads")
    data, corpus = corpus_tokens(args.demo, args.corpus_bytes, args.cache_dir)
    train, val = split_held_out(data)
    demo = AutoModelForCausalLM.from_pretrained(args.demo, dtype=torch.float32, attn_implementation="sdpa").eval()
    for p in demo.parameters():
        p.requires_grad_(False)
    cfg = head_config(demo.config, args)
    layers = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    if len(layers) != 3 or not all(0 <= l < demo.config.num_hidden_layers for l in layers):
        raise SystemExit(f"--layers: three layer ids in [0, {demo.config.num_hidden_layers}) needed, got {layers}")
    self_check(cfg, demo)

    ids, coverage = draft_vocab(train, cfg["vocab_size"], args.draft_vocab)
    log(f"draft vocabulary: {args.draft_vocab} tokens covering {coverage:.1%} of the training tokens; layers {layers}")
    torch.manual_seed(1234)
    head = Eagle3Head(cfg, demo.get_input_embeddings())
    head.d2t.copy_(ids - torch.arange(len(ids)))
    head.t2d.zero_()
    head.t2d[ids] = True
    init_head(head, demo, ids)
    params = [p for n, p in head.named_parameters() if not n.startswith("embed.")]
    nparams = sum(p.numel() for p in params)
    log(f"head: {nparams} parameters (the demo's embedding shared)")

    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(42)
    L, steps = args.seq, args.ttt_steps
    it = batches(train, args.bsz, L + steps, g)
    gen = None
    if args.greedy_sequences > 0:
        gen = greedy_corpus(args.demo, train, args.greedy_sequences, args.eval_prompt_len, args.eval_gen,
                            args.greedy_topk, args.cache_dir)[0]
        GL = gen.shape[1] - steps  # pairs per greedy sequence
        gbsz = max(1, args.bsz * L // GL)
    t_train = time.time()
    step, corpus_steps, curve = 0, 0, []
    head.train()
    while True:
        progress = (time.time() - t_train) / args.train_seconds
        if progress >= 1.0:
            break
        lr = args.lr * (step + 1) / args.warmup if step < args.warmup else \
            args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for pg in opt.param_groups:
            pg["lr"] = lr
        corpus_step = gen is None or (args.corpus_every > 0 and step % args.corpus_every == args.corpus_every - 1)
        if corpus_step:
            corpus_steps += 1
            x, n = next(it)[0], L
        else:
            x, n = gen[torch.randint(0, gen.shape[0], (gbsz,), generator=g)], GL
        hs, logits = target_pass(demo, x, layers)
        loss, per = ttt_loss(head, x, hs, logits, ids, steps, n)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0 or (step % 25 == args.corpus_every - 1 and gen is not None):
            curve.append((step, "corpus" if corpus_step else "greedy", [[round(a, 4), round(b, 4)] for a, b in per]))
            log(f"  step {step:5d} {'corpus' if corpus_step else 'greedy'} " + " ".join(f"ttt{k} ce {a:.3f} acc {b:.3f}" for k, (a, b) in enumerate(per))
                + f" lr {lr:.2e} ({time.time() - t0:.0f}s)")
        step += 1
    train_time = time.time() - t_train
    head.eval()
    with torch.no_grad():
        vit = batches(val, args.bsz, L + steps, torch.Generator().manual_seed(7))
        vals = []
        for _ in range(4):
            x, _ = next(vit)
            hs, logits = target_pass(demo, x, layers)
            vals.append(ttt_loss(head, x, hs, logits, ids, steps, L)[1])
        held = [[sum(v[k][j] for v in vals) / len(vals) for j in range(2)] for k in range(steps)]
    log(f"trained {step} steps in {train_time:.0f}s; held-out per step (ce, top-1 = demo's greedy): {held}")

    out = args.out
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        os.remove(os.path.join(out, f))
    save_file(head.checkpoint_tensors(), os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    # acceptance with the saved bf16 weights, read back as fp32
    from safetensors.torch import load_file
    ev = Eagle3Head(cfg, demo.get_input_embeddings())
    ev.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in
                        load_file(os.path.join(out, "model.safetensors")).items()}, strict=False)
    ev.eval()
    t_acc = time.time()
    seqs = held_out_greedy(demo, args.demo, val, args.eval_prompts, args.eval_prompt_len, args.eval_gen, args.cache_dir)
    gen_tokens = [t for pl, s in seqs for t in s[pl:]]
    greedy_coverage = sum(bool(ev.t2d[t]) for t in gen_tokens) / len(gen_tokens)
    acc = acceptance(Eagle3Proposer(ev, demo, layers), seqs, 4)
    log(f"acceptance (draft length 4): {json.dumps(acc)}; draft vocabulary holds {greedy_coverage:.1%} "
        f"of the demo's greedy tokens ({time.time() - t_acc:.0f}s)")

    stats = {
        "parameters": nparams, "layers": layers, "draft_vocab_size": args.draft_vocab,
        "draft_vocab_train_coverage": coverage, "draft_vocab_greedy_coverage": greedy_coverage,
        "intermediate_size": args.intermediate, "ttt_steps": steps, "steps": step,
        "corpus_steps": corpus_steps, "greedy_batch": gbsz if gen is not None else 0, "batch": args.bsz,
        "seq": L, "train_seconds": train_time, "threads": args.threads,
        "peak_lr": args.lr, "warmup": args.warmup, "held_out": held,
        "greedy_sequences": args.greedy_sequences, "corpus_every": args.corpus_every, "train_tokens": int(train.numel()),
        "held_out_tokens": int(val.numel()), "corpus": corpus, "acceptance": acc,
        "acceptance_eval": {"prompts": args.eval_prompts, "prompt_tokens": args.eval_prompt_len,
                            "generated_tokens": args.eval_gen},
        "loss_curve": curve, "transformers_version": transformers.__version__,
        "torch_version": torch.__version__, "machine": machine(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "command": " ".join(sys.argv),
    }
    with open(os.path.join(out, "training_stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
        f.write("\n")
    size = os.path.getsize(os.path.join(out, "model.safetensors"))
    write_card(out, cfg, stats, size)
    subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "eagle3_reference.py"),
                    "--demo", args.demo, "--head", out], check=True)
    log(f"done in {time.time() - t0:.0f}s")


def write_card(out, cfg, s, size):
    acc, ev = s["acceptance"], s["acceptance_eval"]
    greedy = (f"the demo's own greedy continuations ({s['greedy_sequences']:,} of them, {ev['generated_tokens']} tokens "
              f"after {ev['prompt_tokens']}-token training windows drawn at random, eos not ending them; generated by llmts "
              f"with `tools/demo/greedy_corpus.ts`, as EAGLE-3 trains on target-generated text), "
              f"{s['greedy_batch']} whole sequences (prompt and continuation) a step; every {s['corpus_every']}th step a "
              f"corpus batch of {s['batch']} x {s['seq'] + s['ttt_steps']} tokens instead"
              if s["greedy_sequences"] > 0 else f"corpus batches of {s['batch']} x {s['seq'] + s['ttt_steps']} tokens only")
    srcs = ", ".join(f"{u['source']} ({u['bytes'] / 1e6:.1f} MB)" for u in s["corpus"]["sources"])
    objective = (f"the EAGLE-3 training-time test over {s['ttt_steps']} steps" if s["ttt_steps"] > 1
                 else "the plain next-token objective (one step)")
    held = "; ".join(f"step {k}: cross-entropy {ce:.3f}, top-1 = demo's greedy {a:.1%}"
                     for k, (ce, a) in enumerate(s["held_out"]))
    L = s["layers"]
    card = f"""# llmts demo EAGLE-3 head

An **EAGLE-3 draft head** for the demo model (`models/demo`), in the published EAGLE-3
checkpoint layout (the one the EAGLE repository, SpecForge, vLLM's `llama_eagle3` and sglang
read): it fuses the demo's hidden states entering layers {L[0]}, {L[1]} and {L[2]} (low, mid, high),
runs one decoder layer over concat(token embedding, fused state) and predicts the token after
next over a {s['draft_vocab_size']}-token draft vocabulary. A toy, like the demo; trained on the CPU
by `tools/demo/train_eagle3.py`.

## Layout

`model.safetensors` ({size / 1e6:.1f} MB; weights bf16, `d2t` int64, `t2d` bool), config
`architectures: ["LlamaForCausalLMEagle3"]`, `eagle_config.eagle_aux_hidden_state_layer_ids:
{L}` (index l = the hidden state entering layer l, transformers' `output_hidden_states[l]`):

| tensor | shape |
| --- | --- |
| `fc.weight` | [{cfg['hidden_size']}, {3 * cfg['target_hidden_size']}] (concat(low, mid, high) -> hidden) |
| `midlayer.hidden_norm.weight`, `midlayer.input_layernorm.weight` | [{cfg['hidden_size']}] |
| `midlayer.self_attn.q_proj.weight` | [{cfg['num_attention_heads'] * cfg['head_dim']}, {2 * cfg['hidden_size']}] (over concat(embedding, hidden)) |
| `midlayer.self_attn.k_proj.weight`, `v_proj.weight` | [{cfg['num_key_value_heads'] * cfg['head_dim']}, {2 * cfg['hidden_size']}] |
| `midlayer.self_attn.o_proj.weight` | [{cfg['hidden_size']}, {cfg['num_attention_heads'] * cfg['head_dim']}] |
| `midlayer.post_attention_layernorm.weight` | [{cfg['hidden_size']}] |
| `midlayer.mlp.gate_proj.weight`, `up_proj.weight` / `down_proj.weight` | [{cfg['intermediate_size']}, {cfg['hidden_size']}] / [{cfg['hidden_size']}, {cfg['intermediate_size']}] |
| `norm.weight` | [{cfg['hidden_size']}] |
| `lm_head.weight` | [{cfg['draft_vocab_size']}, {cfg['hidden_size']}] |
| `d2t` | [{cfg['draft_vocab_size']}] (target id = draft id + d2t[draft id]) |
| `t2d` | [{cfg['vocab_size']}] (target id in the draft vocabulary) |

The token embedding is the demo's (not in the checkpoint). {s['parameters']:,} parameters.

## Training

- Corpus: the recipe of `tools/demo/train_demo.py` (Python {s['corpus']['python']} standard library, then
  installed packages, 80 MB cap) encoded with the demo's tokenizer: {srcs};
  {s['train_tokens']:,} training tokens, the last {s['held_out_tokens']:,} held out.
- Draft vocabulary: the {s['draft_vocab_size']} most frequent training tokens ({s['draft_vocab_train_coverage']:.1%} of the
  training tokens, {s['draft_vocab_greedy_coverage']:.1%} of the demo's greedy tokens in the acceptance run).
- Start: `lm_head` and `norm` are the demo's output layer restricted to the draft vocabulary;
  `fc` is the identity on the high layer's block.
- Objective: {objective}: from every position the head drafts {s['ttt_steps']} chained tokens, step k
  reading step k-1's output as its hidden state and attending to its own earlier steps, each
  step's loss the cross-entropy to the demo's next-token distribution restricted to the draft
  vocabulary (weights 0.8^k), at every position of the batch. The demo runs in fp32 without
  gradients, on the fly, for its hidden states and distributions.
- Data: {greedy}
- {s['steps']:,} AdamW steps ({s['corpus_steps']:,} of them on corpus batches; peak lr {s['peak_lr']}, warmup
  {s['warmup']} steps, cosine to 10% over the wall-clock budget, grad clip 1), about {s['batch'] * s['seq']:,} positions a batch,
  {s['train_seconds']:.0f} s on {s['threads']} CPU threads
  ({s['machine']}), {s['date']}.
- Held-out corpus text (4 batches of {s['batch']} x {s['seq'] + s['ttt_steps']}): {held}.
- Built with transformers {s['transformers_version']}, torch {s['torch_version']} by
  `{s['command']}`; `training_stats.json` has the details and the loss curve.

## Acceptance

Greedy speculative decoding against the demo, simulated with PyTorch (fp32, CPU,
`spec_common.acceptance`): on {ev['prompts']} held-out windows of {ev['prompt_tokens']} tokens (a seeded draw), the
demo's greedy continuation of {ev['generated_tokens']} tokens by transformers; from the end of the prompt,
each round the head drafts 4 tokens (fewer at the end of a continuation) from the demo's hidden
states of the context (the pairs up to the last verified token, then its own chained steps), the
accepted ones are the longest prefix the demo's greedy tokens agree with, the demo adds its own
next token, and the context moves on by accepted + 1. Acceptance rate = accepted / drafted tokens.

| draft length | rounds | acceptance rate | mean accepted | tokens per demo forward | accepted 0/1/2/3/4 |
| --- | --- | --- | --- | --- | --- |
| 4 | {acc['rounds']} | {acc['acceptance_rate']:.1%} | {acc['mean_accepted']:.2f} | {acc['tokens_per_verify']:.2f} | {' / '.join(str(h) for h in acc['accepted_histogram'])} |

`eagle3_reference.json` (by `tools/demo/eagle3_reference.py`) holds, for a short prompt, the
demo's hidden states at the fused layers and the head's draft steps (tokens and top-5 logprobs
over target ids), so the engine can be checked against PyTorch.

## Licence

Apache-2.0, like the demo model; trained on the demo's corpus and outputs.
"""
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
        f.write(card)


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)
