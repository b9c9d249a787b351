#!/usr/bin/env python3
"""Build the FP8 checkpoint fixtures in test/fixtures/fp8/ (not run in CI: it needs PyTorch).

    python3 scripts/make_fp8_fixtures.py [--out test/fixtures/fp8]

Needs torch, transformers 5.x (with accelerate, which its FP8 loader requires), safetensors, numpy
and gguf (make_gguf_fixtures.py, whose greedy steps it shares, imports it). For each fixture below, a tiny fixture checkpoint of test/fixtures/ with every attention and
MLP matrix quantized to float8_e4m3fn (torch's rounding) with f32 scales of amax / 448 over the
scheme's groups: blocks, output rows, or the whole tensor. Embeddings, norms and lm_head stay as
they were (f32). Written in the layout the fixture's quant_method names:

* "fp8" (transformers' FineGrainedFP8): `<m>.weight` F8_E4M3 and `<m>.weight_scale_inv` F32
  [N / bm, K / bn], quantization_config {quant_method: fp8, fmt: e4m3, weight_block_size};
* "compressed-tensors" (float-quantized): `<m>.weight` F8_E4M3 and `<m>.weight_scale` ([1] for the
  tensor strategy, [N, 1] for channel, in the dtype the fixture states), plus a static
  `<m>.input_scale` for one fixture (llmts does not apply it; transformers' dequantized model does
  not either).

References: transformers loads the FineGrainedFP8 form of the same bytes and scales (the fixture
itself for "fp8"; for compressed-tensors, whose loader needs the compressed-tensors package, a
FineGrainedFP8 twin whose weight_scale_inv holds the same scales as a [1, 1] or [N, 1] grid) in fp32
on the CPU, which dequantizes them (q.float() * scale, its Fp8Dequantize); the script checks that the
model's matrices equal that product. Greedy steps with top-5 logprobs of the raw logits for the
source fixture's three prompts. Also e4m3-values.json: torch's float8_e4m3fn value of every byte.
"""

import argparse
import json
import os
import shutil
import tempfile

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from make_gguf_fixtures import STEPS, greedy  # the same greedy steps as the GGUF references (scripts/ is on sys.path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "test", "fixtures")
MATRICES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")

# name, source fixture, method, strategy, block (rows, cols) for "block", scale dtype, static input scales
FIXTURES = [
    ("llama_fp8_block", "llama", "fp8", "block", (32, 32), torch.float32, False),
    ("qwen3_fp8_channel", "qwen3", "compressed-tensors", "channel", None, torch.bfloat16, False),
    ("mistral_fp8_tensor", "mistral", "compressed-tensors", "tensor", None, torch.float32, True),
]


def quantize(w, strategy, block):
    """w [N, K] f32 -> (e4m3 tensor, f32 scale grid [R, C]) with scale = amax / 448 per group."""
    N, K = w.shape
    bm, bn = {"block": block, "channel": (1, K), "tensor": (N, K)}[strategy]
    assert N % bm == 0 and K % bn == 0, (w.shape, bm, bn)
    g = w.reshape(N // bm, bm, K // bn, bn)
    amax = g.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax)).float()
    q = (g / scale[:, None, :, None]).reshape(N, K).to(torch.float8_e4m3fn)
    return q, scale


def dequantized(q, scale):
    N, K = q.shape
    R, C = scale.shape
    return (q.float().reshape(R, N // R, C, K // C) * scale[:, None, :, None]).reshape(N, K)


def write_dir(d, cfg, tensors, src_dir):
    os.makedirs(d, exist_ok=True)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    save_file(tensors, os.path.join(d, "model.safetensors"))
    for f in TOKENIZER_FILES:
        if os.path.exists(os.path.join(src_dir, f)):
            shutil.copy(os.path.join(src_dir, f), os.path.join(d, f))


def make(out_root, name, src, method, strategy, block, scale_dtype, static_input):
    src_dir = os.path.join(SRC, src)
    cfg = json.load(open(os.path.join(src_dir, "config.json")))
    cfg.pop("transformers_version", None)
    st = load_file(os.path.join(src_dir, "model.safetensors"))
    out, twin, expect = {}, {}, {}
    for k, v in st.items():
        if k.endswith(".weight") and k.split(".")[-2] in MATRICES:
            q, scale = quantize(v.float(), strategy, block)
            stored = scale.to(scale_dtype)  # the checkpoint's scale dtype (bf16 scales round here)
            base = k[: -len("weight")]
            out[k] = q
            twin[k] = q
            twin[k + "_scale_inv"] = stored.float().reshape(scale.shape)
            expect[k] = dequantized(q, stored.float())
            if method == "fp8":
                out[k + "_scale_inv"] = stored.float()
            else:
                out[k + "_scale"] = stored.reshape(-1) if strategy == "tensor" else stored.reshape(-1, 1)
                if static_input:
                    out[base + "input_scale"] = torch.tensor([0.05], dtype=torch.float32)
        else:
            out[k] = v
            twin[k] = v
    bm, bn = block if block else (None, None)
    twin_cfg = dict(cfg, quantization_config={"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                              "weight_block_size": [bm, bn] if block else None})
    if method == "fp8":
        q_cfg = twin_cfg["quantization_config"]
    else:
        weights = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False}
        acts = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": not static_input}
        q_cfg = {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
                 "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}},
                 "ignore": ["lm_head"]}
    d = os.path.join(out_root, name)
    shutil.rmtree(d, ignore_errors=True)
    write_dir(d, dict(cfg, quantization_config=q_cfg), out, src_dir)
    with tempfile.TemporaryDirectory() as tmp:
        t = os.path.join(tmp, "twin")
        write_dir(t, twin_cfg, twin, src_dir)
        model, info = AutoModelForCausalLM.from_pretrained(t, dtype=torch.float32, attn_implementation="eager",
                                                           output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        model.eval()
        params = dict(model.named_parameters())
        for k, v in expect.items():
            got = params[k].detach()
            assert got.dtype == torch.float32 and torch.equal(got, v), f"{name}: {k} is not q * scale"
        src_ref = json.load(open(os.path.join(src_dir, "reference.json")))
        cases = []
        for c in src_ref["cases"]:
            steps = greedy(model, c["prompt_token_ids"])
            cases.append({"prompt_token_ids": c["prompt_token_ids"], "generated_token_ids": [s["token_id"] for s in steps], "steps": steps})
    gaps = [c["steps"][i]["top"][0]["logprob"] - c["steps"][i]["top"][1]["logprob"] for c in cases for i in range(STEPS)]
    ref = {
        "name": name, "source_fixture": src, "quant_method": method, "strategy": strategy, "block": list(block) if block else None,
        "scale_dtype": str(scale_dtype).replace("torch.", ""), "static_input_scale": static_input,
        "method": "transformers FineGrainedFP8, dequantized in fp32" + ("" if method == "fp8" else " (a FineGrainedFP8 twin of the same bytes and scales)"),
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "min_top1_top2_logprob_gap": min(gaps),
        "generation": f"greedy argmax of the raw fp32 logits, {STEPS} steps, one no-cache forward per step, eager attention, CPU",
        "cases": cases,
    }
    json.dump(ref, open(os.path.join(d, "reference.json"), "w"), indent=1)
    print(f"{name}: {method} {strategy}; min top1-top2 gap {min(gaps):.3g}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(SRC, "fp8"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for f in FIXTURES:
        make(a.out, *f)
    b = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    values = [None if np.isnan(x) else x for x in b.tolist()]
    json.dump({"torch": torch.__version__, "dtype": "float8_e4m3fn", "values": values},
              open(os.path.join(a.out, "e4m3-values.json"), "w"))


if __name__ == "__main__":
    main()
