#!/usr/bin/env python3
"""The PyTorch reference the engine's EAGLE-3 head is checked against (test/models/eagle3.test.ts):

    python3 tools/demo/eagle3_reference.py --demo models/demo --head models/demo-eagle3

writes <head>/eagle3_reference.json: for a fixed short prompt, the demo's hidden states entering
the head's fused layers (transformers' output_hidden_states, fp32, eager attention, CPU, the bf16
weights loaded as fp32), the head's logits over the context pairs (target hidden state at i,
token i + 1: predicting token i + 2), and a chain of draft steps from the end of the prompt (each
step's token the previous step's argmax, its hidden state the previous step's output). Logits
are over target ids: log_softmax over the draft vocabulary, mapped by d2t.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from eagle3_head import Eagle3Head  # noqa: E402

PROMPT = "def add(a, b):\n    return a + b\n\n\ndef mul("
CHAIN = 4


def record(head, logits_row):
    """One step: the argmax (as a target id), its logprob and the top 5, over target ids."""
    lp = torch.log_softmax(logits_row.float(), -1)
    top = torch.topk(lp, 5)
    tgt = head.to_target(top.indices)
    return {"token_id": int(tgt[0]), "logprob": float(top.values[0]),
            "top": [{"token_id": int(t), "logprob": float(v)} for t, v in zip(tgt.tolist(), top.values.tolist())]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--demo", default="models/demo")
    ap.add_argument("--head", default="models/demo-eagle3")
    ap.add_argument("--out", default=None, help="default <head>/eagle3_reference.json")
    args = ap.parse_args()
    torch.set_num_threads(2)

    with open(os.path.join(args.head, "config.json")) as f:
        cfg = json.load(f)
    layers = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    tok = AutoTokenizer.from_pretrained(args.demo)
    demo = AutoModelForCausalLM.from_pretrained(args.demo, dtype=torch.float32, attn_implementation="eager").eval()
    head = Eagle3Head(cfg, demo.get_input_embeddings())
    sd = load_file(os.path.join(args.head, "model.safetensors"))
    missing, unexpected = head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in sd.items()},
                                               strict=False)
    assert not unexpected and all(k.startswith("embed.") for k in missing), (missing, unexpected)
    head.eval()

    ids = tok.encode(PROMPT)
    n = len(ids)
    x = torch.tensor([ids])
    with torch.no_grad():
        out = demo(input_ids=x, output_hidden_states=True)
        hs = [out.hidden_states[l] for l in layers]
        hid = head.fuse(*(h[:, :n - 1] for h in hs))
        o, past = head.chunk(x[:, 1:], hid, torch.arange(n - 1)[None])
        context = [record(head, head.logits(o)[0, i]) for i in range(n - 1)]
        chain = [context[-1]]
        o = o[:, -1:]
        for j in range(1, CHAIN):
            t = torch.tensor([[chain[-1]["token_id"]]])
            o, past = head.chunk(t, o, torch.tensor([[n - 2 + j]]), past)
            chain.append(record(head, head.logits(o)[0, -1]))

    ref = {
        "prompt_text": PROMPT,
        "prompt_token_ids": ids,
        "layers": layers,
        "hidden_states": {str(l): [[float(f"{v:.6g}") for v in row] for row in h[0].tolist()]
                          for l, h in zip(layers, hs)},
        "context": context,
        "chain": chain,
        "method": (
            "transformers forward (fp32, eager attention, CPU, bf16 weights loaded as fp32) with "
            "output_hidden_states: hidden_states[l] for each fused layer l (6 significant digits); the head "
            "(tools/demo/eagle3_head.py, fp32) over the context pairs (hidden state at i, token i + 1) at "
            "positions 0..n-2: context[i] predicts token i + 2; chain[0] = context[n-2], chain[j] the step at "
            "position n-2+j fed chain[j-1]'s argmax and the previous step's output; logprobs are "
            "log_softmax over the draft vocabulary, ids mapped to target ids by d2t"),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    path = args.out or os.path.join(args.head, "eagle3_reference.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(ref, f, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {path}: {n} prompt tokens, chain {[c['token_id'] for c in chain]}", flush=True)


if __name__ == "__main__":
    main()
