"""What the speculative-decoding proposers of the demo model share: the demo's corpus encoded with
its own tokenizer (cached on disk), the held-out split, batches, and the greedy acceptance
simulation that measures a proposer against the demo.

Used by train_draft.py and train_eagle3.py; the corpus recipe itself is train_demo.py's
(read_corpus, encode_corpus), run here with the demo's tokenizer instead of a freshly trained one.
"""

import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_demo import SPECIALS, encode_corpus, log, read_corpus  # noqa: E402

HELD_OUT_FRACTION = 200  # the last 1/200 (0.5%) of the tokens, as train_demo.py holds out


def demo_tokenizer(demo_dir):
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(os.path.join(demo_dir, "tokenizer.json"))
    eos = tk.token_to_id(SPECIALS[0])
    if eos is None:
        raise SystemExit(f"{demo_dir}/tokenizer.json has no {SPECIALS[0]} token")
    return tk, eos


def corpus_tokens(demo_dir, corpus_bytes, cache_dir, encode_seconds=900):
    """The corpus of train_demo.py encoded with the demo's tokenizer: (int64 tensor, sources).

    Cached under cache_dir by the tokenizer's hash and the byte cap, so the second script (and a
    rerun) skips reading and encoding."""
    tk_path = os.path.join(demo_dir, "tokenizer.json")
    with open(tk_path, "rb") as f:
        key = hashlib.sha256(f.read()).hexdigest()[:16]
    os.makedirs(cache_dir, exist_ok=True)
    base = os.path.join(cache_dir, f"corpus-{key}-{corpus_bytes}")
    if os.path.exists(base + ".npy") and os.path.exists(base + ".json"):
        with open(base + ".json") as f:
            meta = json.load(f)
        log(f"corpus: cached {base}.npy ({meta['tokens']} tokens)")
        return torch.from_numpy(np.load(base + ".npy").astype(np.int64)), meta
    t0 = time.time()
    docs, nbytes, used = read_corpus(corpus_bytes)
    log(f"corpus: {len(docs)} files, {nbytes} bytes ({time.time() - t0:.1f}s)")
    tk, eos = demo_tokenizer(demo_dir)
    data, ndocs = encode_corpus(tk, docs, eos, time_limit=encode_seconds)
    if ndocs < len(docs):
        raise SystemExit(f"encoding stopped after {ndocs} of {len(docs)} files; raise --encode-seconds")
    meta = {"tokens": int(data.numel()), "bytes": nbytes, "docs": ndocs, "sources": used,
            "python": f"{sys.version_info.major}.{sys.version_info.minor}"}
    np.save(base + ".npy", data.numpy().astype(np.int32))
    with open(base + ".json", "w") as f:
        json.dump(meta, f, indent=1)
    log(f"corpus: {meta['tokens']} tokens from {ndocs} files ({time.time() - t0:.1f}s), cached in {base}.npy")
    return data, meta


def machine():
    """The CPU a run trained on, for the model card: its model name and core count."""
    name = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def split_held_out(data):
    nval = data.numel() // HELD_OUT_FRACTION
    return data[:-nval], data[-nval:]


def batches(data, bsz, seq, g):
    """Random windows of seq + 1 tokens: (inputs, next tokens)."""
    n = data.numel() - seq - 2
    ar = torch.arange(seq + 1)
    while True:
        starts = torch.randint(0, n, (bsz,), generator=g)
        b = data[starts[:, None] + ar[None, :]]
        yield b[:, :-1], b[:, 1:]


def held_out_prompts(val, count, prompt_len, seed=11):
    """`count` fixed windows of `prompt_len` held-out tokens (a seeded draw of start positions)."""
    g = torch.Generator().manual_seed(seed)
    n = val.numel() - prompt_len - 1
    starts = torch.randint(0, n, (count,), generator=g).tolist()
    return [val[s:s + prompt_len].tolist() for s in starts]


@torch.no_grad()
def greedy_continuation(target, prompt, n):
    """prompt + the target's greedy continuation of it (n tokens, eos not allowed to end it)."""
    ids = torch.tensor([prompt])
    out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                          max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
    return out[0].tolist()


def held_out_greedy(demo, demo_dir, val, count, prompt_len, gen, cache_dir):
    """[(prompt_len, prompt + the demo's greedy continuation)] for `count` held-out windows: the
    acceptance runs' text, by transformers (fp32), cached under cache_dir by the demo's weights and
    the arguments (both proposers are measured on the same sequences)."""
    key = _file_key(os.path.join(demo_dir, "model.safetensors"))
    path = os.path.join(cache_dir, f"held-out-greedy-{key}-{count}-{prompt_len}-{gen}.json")
    if os.path.exists(path):
        with open(path) as f:
            seqs = json.load(f)
    else:
        seqs = [greedy_continuation(demo, p, gen) for p in held_out_prompts(val, count, prompt_len)]
        os.makedirs(cache_dir, exist_ok=True)
        with open(path, "w") as f:
            json.dump(seqs, f)
    return [(prompt_len, s) for s in seqs]


def acceptance(propose, prompts_and_seqs, draft_len):
    """Greedy speculative decoding against the target's own greedy output, simulated.

    For every prompt, from the end of the prompt on: the proposer drafts `draft_len` tokens for
    the context so far, the accepted ones are the longest prefix equal to the target's greedy
    tokens, the target adds its own next token (the bonus), and the context moves on by
    accepted + 1. Returns the counts: rounds (target forwards), drafted, accepted tokens, and the
    histogram of accepted tokens per round. `propose(seq, c, k)` drafts k tokens after seq[:c]."""
    rounds = drafted = accepted = 0
    hist = [0] * (draft_len + 1)
    for prompt_len, seq in prompts_and_seqs:
        c = prompt_len
        while c < len(seq):
            k = min(draft_len, len(seq) - c)
            draft = propose(seq, c, k)
            a = 0
            while a < k and draft[a] == seq[c + a]:
                a += 1
            rounds += 1
            drafted += k
            accepted += a
            hist[a] += 1
            c += a + 1
    return {
        "draft_len": draft_len, "rounds": rounds, "drafted": drafted, "accepted": accepted,
        "acceptance_rate": accepted / max(1, drafted),
        "mean_accepted": accepted / max(1, rounds),
        "tokens_per_verify": (accepted + rounds) / max(1, rounds),
        "accepted_histogram": hist,
    }


def _file_key(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()[:16]


def greedy_corpus(demo_dir, train, count, prompt_len, gen_len, k, cache_dir, seed=3, max_batch=64):
    """The demo's own text, for training on what it writes (EAGLE-3 trains on target-generated
    data; for a draft model it is sequence-level distillation): greedy continuations of gen_len
    tokens (eos not ending them) of `count` seeded random training windows of prompt_len tokens,
    generated by llmts itself (greedy_corpus.ts, the CPU backend), with each generated token's
    top-k log-probabilities. Cached under cache_dir by the demo's weights and the arguments.
    Returns (tokens [count, prompt_len + gen_len], top-k ids [count, gen_len, k], top-k logprobs
    [count, gen_len, k]): step j's top-k is the demo's distribution for token prompt_len + j, the
    logits at position prompt_len - 1 + j."""
    key = _file_key(os.path.join(demo_dir, "model.safetensors"))
    path = os.path.join(cache_dir, f"greedy-{key}-{count}-{prompt_len}-{gen_len}-{k}-{seed}.pt")
    if os.path.exists(path):
        d = torch.load(path)
        log(f"greedy data: cached {path}")
        return d["tokens"].long(), d["ids"].long(), d["lps"].float()
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, train.numel() - prompt_len - 1, (count,), generator=g)
    prompts = train[starts[:, None] + torch.arange(prompt_len)]
    os.makedirs(cache_dir, exist_ok=True)
    pin, pout = path + ".prompts.json", path + ".out.json"
    with open(pin, "w") as f:
        json.dump(prompts.tolist(), f)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    t0 = time.time()
    subprocess.run(["node", "--import", "tsx", os.path.join(root, "tools/demo/greedy_corpus.ts"), "--model", demo_dir,
                    "--prompts", pin, "--out", pout, "--max-tokens", str(gen_len), "--top-logprobs", str(k),
                    "--max-batch", str(max_batch)], check=True, cwd=root)
    with open(pout) as f:
        out = json.load(f)
    os.remove(pin)
    os.remove(pout)
    d = {"tokens": torch.cat([prompts, torch.tensor(out["tokens"])], 1).to(torch.int32),
         "ids": torch.tensor(out["top_ids"], dtype=torch.int16),
         "lps": torch.tensor(out["top_logprobs"], dtype=torch.float16)}
    torch.save(d, path)
    log(f"greedy data: {count} sequences of {prompt_len + gen_len} tokens in {time.time() - t0:.0f}s, cached in {path}")
    return d["tokens"].long(), d["ids"].long(), d["lps"].float()
