#!/usr/bin/env python3
"""Records what transformers itself derives from each config in config-cases.json.

For every case: writes config.json to a temp dir, loads it with AutoConfig.from_pretrained (the
real loading path, heuristics included), builds the model on CPU in fp32, and reads back the
derived numbers from the live modules (attention scaling, sliding windows, head_dim, rope
inv_freq and attention scaling per layer type, also after a forward at long positions for the
seq-len dependent rope types, norms, biases, multipliers, tensor names after save_pretrained).
test/artifacts/transformers-reference.test.ts compares normalizeConfig/ropeFrequencies to it.

Usage: python3 make-transformers-reference.py config-cases.json transformers-reference.json
Needs torch (CPU is enough), transformers 5.x and safetensors; the committed JSON records the
versions it was made with.
"""
import json, os, sys, tempfile, traceback

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from safetensors import safe_open

LONG = {"llama_dynamic": [100, 10], "phi3_longrope": [64, 8], "phi3_su_params": [100, 8]}


def floats(t):
    return [float(x) for x in t.detach().to(torch.float32).flatten().tolist()]


def text_model(model):
    inner = model.model
    return getattr(inner, "language_model", inner)


def rope_record(rot, layer_type=None):
    if layer_type is None:
        return {"invFreq": floats(rot.inv_freq), "attentionScaling": float(rot.attention_scaling)}
    return {"invFreq": floats(getattr(rot, f"{layer_type}_inv_freq")),
            "attentionScaling": float(getattr(rot, f"{layer_type}_attention_scaling"))}


def run_case(name, cfg_dict):
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg_dict, f)
    config = AutoConfig.from_pretrained(d)
    torch.manual_seed(0)
    if cfg_dict["model_type"] == "gemma3":
        model = transformers.Gemma3ForConditionalGeneration(config)
        tcfg = config.text_config
    else:
        model = AutoModelForCausalLM.from_config(config)
        tcfg = config
    model.eval()
    tm = text_model(model)
    out = {"configClass": type(config).__name__, "modelClass": type(model).__name__}
    layers = []
    for i, layer in enumerate(tm.layers):
        attn = layer.self_attn
        rec = {
            "scaling": float(attn.scaling),
            "headDim": int(attn.head_dim),
            "slidingWindowAttr": getattr(attn, "sliding_window", "absent"),
            "layerType": getattr(attn, "layer_type", None) or getattr(layer, "attention_type", None),
            "mlpClass": type(layer.mlp).__name__,
            "inputNormEps": float(getattr(layer.input_layernorm, "variance_epsilon", getattr(layer.input_layernorm, "eps", -1)))
            if hasattr(layer, "input_layernorm") else None,
            "attnSoftcap": getattr(attn, "attn_logit_softcapping", None),
            "residualMultiplier": getattr(layer, "residual_multiplier", None),
            "hasQNorm": hasattr(attn, "q_norm"),
            "qNormShape": list(attn.q_norm.weight.shape) if hasattr(attn, "q_norm") else None,
            "norms": sorted(n for n, _ in layer.named_children() if "norm" in n),
        }
        for p in ["q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj"]:
            m = getattr(attn, p, None)
            if m is not None:
                rec[p + "Bias"] = m.bias is not None
        mlp = layer.mlp
        for p in ["gate_proj", "up_proj", "down_proj", "gate_up_proj"]:
            m = getattr(mlp, p, None)
            if isinstance(m, torch.nn.Linear):
                rec[p + "Bias"] = m.bias is not None
        act = getattr(mlp, "act_fn", None) or getattr(mlp, "activation_fn", None)
        if act is None and hasattr(mlp, "experts"):
            act = getattr(mlp.experts, "act_fn", None)
        rec["act"] = type(act).__name__ if act is not None else None
        gate = getattr(mlp, "gate", None)
        if gate is not None and hasattr(gate, "top_k"):
            rec["topK"] = gate.top_k
            rec["normTopK"] = getattr(gate, "norm_topk_prob", None)
            rec["numExperts"] = gate.num_experts
        layers.append(rec)
    out["layers"] = layers
    out["configSlidingWindow"] = getattr(tcfg, "sliding_window", None)
    out["configLayerTypes"] = getattr(tcfg, "layer_types", None)
    out["ropeParameters"] = getattr(tcfg, "rope_parameters", None)
    rot = tm.rotary_emb
    if isinstance(rot.rope_type, dict):
        out["rope"] = {lt: rope_record(rot, lt) for lt in rot.rope_type}
    else:
        out["rope"] = {"all": rope_record(rot)}
        seqs = LONG.get(name, [])
        out["ropeAtSeq"] = []
        x = torch.zeros(1, 1, dtype=torch.float32)
        for n in seqs:
            rot(x, torch.arange(n)[None])
            out["ropeAtSeq"].append({"seqLen": n, **rope_record(rot)})
    emb = tm.embed_tokens
    out["embedScale"] = float(emb.embed_scale) if hasattr(emb, "embed_scale") else None
    out["embeddingMultiplier"] = getattr(tm, "embedding_multiplier", None)
    out["logitsScaling"] = getattr(tcfg, "logits_scaling", None)
    out["finalLogitSoftcapping"] = getattr(tcfg, "final_logit_softcapping", None)
    out["tied"] = model.lm_head.weight.data_ptr() == emb.weight.data_ptr()
    out["numKvHeads"] = tcfg.num_key_value_heads
    out["rmsNormEps"] = tcfg.rms_norm_eps
    out["maxPositionEmbeddings"] = tcfg.max_position_embeddings
    gc = model.generation_config
    out["generation"] = {"eos": gc.eos_token_id, "bos": gc.bos_token_id, "pad": gc.pad_token_id}
    out["configIds"] = {k: getattr(config, k, None) for k in ["eos_token_id", "bos_token_id", "pad_token_id"]}
    out["textConfigIds"] = {k: getattr(tcfg, k, None) for k in ["eos_token_id", "bos_token_id", "pad_token_id"]}
    if name in ("gemma3_wrapper", "qwen3_moe", "mixtral", "llama_default", "phi3_longrope"):
        sd = tempfile.mkdtemp()
        model.save_pretrained(sd)
        names = []
        for fn in sorted(os.listdir(sd)):
            if fn.endswith(".safetensors"):
                with safe_open(os.path.join(sd, fn), "pt") as f:
                    names += list(f.keys())
        out["savedTensorNames"] = sorted(names)
    return out


def main():
    cases = json.load(open(sys.argv[1]))
    result = {"transformers": transformers.__version__, "torch": torch.__version__, "cases": {}}
    for name, cfg in cases.items():
        try:
            result["cases"][name] = run_case(name, cfg)
        except Exception as e:
            result["cases"][name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
    with open(sys.argv[2], "w") as f:
        json.dump(result, f, indent=1, default=str)
    print({k: ("ERR " + v["error"][:200]) if "error" in v else "ok" for k, v in result["cases"].items()})


main()
