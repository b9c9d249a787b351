#!/usr/bin/env python3
"""Writes MODEL_DIR/sample_reference.json: transformers' greedy continuation of a prompt, in fp32 on
the CPU, the reference bench/peers/llama-cpp.ts checks llmts and llama.cpp against before it times
them (models/demo ships its own; random-weight models made by bench/make_random_models.py need one).

    pip install torch transformers safetensors
    python3 bench/sample_reference.py MODEL_DIR [--prompt TEXT] [--steps N]

Same fields as models/demo/sample_reference.json (tools/demo/train_demo.py): end-of-sequence ids are
masked by min_new_tokens so the run always has `steps` tokens, as llmts's and llama.cpp's
ignore-EOS runs do.
"""
import argparse
import json
import os

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('model_dir')
    ap.add_argument('--prompt', default='def fibonacci(n):')
    ap.add_argument('--steps', type=int, default=40)
    a = ap.parse_args()

    tok = AutoTokenizer.from_pretrained(a.model_dir)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32, attn_implementation='eager')
    model.eval()
    ids = tok(a.prompt, return_tensors='pt').input_ids
    with torch.no_grad():
        out = model.generate(ids, do_sample=False, max_new_tokens=a.steps, min_new_tokens=a.steps,
                             output_logits=True, return_dict_in_generate=True)
    gen = out.sequences[0, ids.shape[1]:].tolist()
    top = []
    for logits in out.logits:
        lp = torch.log_softmax(logits[0].float(), dim=-1)
        v, i = lp.topk(5)
        top.append([{'token_id': int(t), 'logprob': float(x)} for x, t in zip(v, i)])
    ref = {
        'prompt_text': a.prompt, 'prompt_token_ids': ids[0].tolist(), 'generated_token_ids': gen,
        'generated_text': tok.decode(gen), 'steps': a.steps, 'top5': top,
        'method': f'transformers model.generate(do_sample=False, max_new_tokens={a.steps}, min_new_tokens={a.steps}, '
                  'output_logits=True), CPU, weights loaded into fp32, attn_implementation=eager; logprobs are '
                  'log_softmax of the raw logits',
        'transformers_version': transformers.__version__, 'torch_version': torch.__version__,
    }
    path = os.path.join(a.model_dir, 'sample_reference.json')
    with open(path, 'w', encoding='utf-8') as f:
        json.dump(ref, f, indent=1)
    print(f'wrote {path}: {len(gen)} greedy tokens after {ids.shape[1]} prompt tokens')


if __name__ == '__main__':
    main()
