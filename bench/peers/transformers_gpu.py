#!/usr/bin/env python3
"""The in-run PyTorch peer for bench/cuda-generate.ts: transformers on the same model directory,
bf16, B=1, greedy, the same prompt ids, timed the same way.

  eager:    plain transformers, model.generate with its default dynamic KV cache
            (attention: --attn, default sdpa)
  compiled: generate(cache_implementation="static"), which transformers compiles with
            torch.compile (mode reduce-overhead: CUDA graphs) for the decode steps; only with
            --compile (compiling takes minutes: the first generate call pays it, and it is
            reported as compileS)

Decode tok/s = (tokens - 1) / (end - first token), as llmts's bench; TTFT = generate call to first
token with max_new_tokens 1; the end of sequence is ignored (min_new_tokens = max_new_tokens).
Prompt r (r = 0 is the warm-up) of n tokens: ids[k] = (k * 7919 + 13 + 31 * r) % min(vocab, 5000).
Results go to --json after every phase, so a run stopped part-way keeps what it measured.

usage: python3 bench/peers/transformers_gpu.py --model DIR [--prompt-tokens 512] [--decode-tokens 128]
         [--repeats 3] [--prefill-prompts 1024,8192] [--prefill-repeats 2] [--attn sdpa]
         [--ceilings ceilings.json] [--launch-time EPOCH_S] [--compile [--compile-until EPOCH_S]]
         [--json out.json]
"""
import argparse
import json
import os
import time

T_PROCESS = time.time()
DEVICE = os.environ.get('PEER_DEVICE', 'cuda')  # another device only to test this script


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--model', required=True)
    ap.add_argument('--prompt-tokens', type=int, default=512)
    ap.add_argument('--decode-tokens', type=int, default=128)
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--prefill-prompts', default='')
    ap.add_argument('--prefill-repeats', type=int, default=2)
    ap.add_argument('--attn', default='sdpa')
    ap.add_argument('--ceilings')
    ap.add_argument('--launch-time', type=float, help='epoch seconds when the launcher started this process')
    ap.add_argument('--compile', action='store_true')
    ap.add_argument('--compile-until', type=float, help='epoch seconds after which --compile is skipped')
    ap.add_argument('--json')
    a = ap.parse_args()
    t_launch = a.launch_time or T_PROCESS
    sweep = [int(x) for x in a.prefill_prompts.split(',') if x.strip()]

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    copy_gbps, gemm_tflops = 4275.0, 797.0
    if a.ceilings:
        with open(a.ceilings) as f:
            c = json.load(f)
        copy_gbps, gemm_tflops = c['copyGBps'], c['gemmTflops']

    t_import = time.time()
    how = f'device_map=cuda, attn {a.attn}'
    try:
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, device_map=DEVICE, attn_implementation=a.attn)
    except Exception as e:  # device_map may want accelerate: load on the host, then move
        print(f'peer: device_map load failed ({type(e).__name__}: {str(e)[:200]}); loading on the host')
        how = f'host then .to(cuda), attn {a.attn}'
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation=a.attn).to(DEVICE)
    model.eval()
    torch.cuda.synchronize()
    t_ready = time.time()

    params = sum(p.numel() for p in model.parameters())
    # bytes each decode step reads, as llmts counts them: layer matrices and lm_head, not the embedding
    weight_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                       if p.dim() == 2 and 'embed_tokens' not in n)
    cfg = model.config
    vocab = min(cfg.vocab_size, 5000)

    def prompt(n, r):
        return torch.tensor([[(k * 7919 + 13 + 31 * r) % vocab for k in range(n)]], device=model.device)

    try:
        from transformers.generation.streamers import BaseStreamer
    except ImportError:
        BaseStreamer = object

    class Clock(BaseStreamer):
        """A streamer that notes when each generated token arrives (the first put is the prompt)."""

        def __init__(self):
            self.times = []

        def put(self, value):
            self.times.append(time.perf_counter())

        def end(self):
            pass

    def once(ids, new_tokens, **kw):
        clock = Clock()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, streamer=clock, **kw)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        n = out.shape[1] - ids.shape[1]
        first = clock.times[1] if len(clock.times) > 1 else t1
        return {'ttftMs': (first - t0) * 1000, 'decodeS': t1 - first, 'tokens': n, 'totalS': t1 - t0}

    def median(xs):
        s = sorted(xs)
        h = len(s) // 2
        return s[h] if len(s) % 2 else (s[h - 1] + s[h]) / 2

    r = {
        'peer': 'transformers', 'transformers': transformers.__version__, 'torch': torch.__version__,
        'gpu': torch.cuda.get_device_name(), 'load': how, 'params': params, 'weightBytesPerDecodeStep': weight_bytes,
        'importS': t_import - t_launch, 'loadS': t_ready - t_import, 'readyS': t_ready - t_launch,
        'copyBandwidthGBps': copy_gbps, 'gemmTflops': gemm_tflops,
        'promptTokens': a.prompt_tokens, 'decodeTokens': a.decode_tokens,
    }

    def save():
        if a.json:
            with open(a.json, 'w') as f:
                json.dump(r, f, indent=2)

    print(f"peer     transformers {transformers.__version__}, torch {torch.__version__}: ready {r['readyS']:.1f} s after launch "
          f"(imports {r['importS']:.1f} s, from_pretrained {r['loadS']:.1f} s, {how})")
    save()

    def decode_phase(name, **kw):
        t = time.time()
        warm = once(prompt(a.prompt_tokens, 0), a.decode_tokens, **kw)
        warm_s = time.time() - t
        runs = [once(prompt(a.prompt_tokens, i), a.decode_tokens, **kw) for i in range(1, a.repeats + 1)]
        for x in runs:
            assert x['tokens'] == a.decode_tokens, x
        tps = median([(x['tokens'] - 1) / x['decodeS'] for x in runs])
        gbps = tps * weight_bytes / 1e9
        r[name] = {
            'decodeTokPerS': tps, 'decodeTokPerSAll': [(x['tokens'] - 1) / x['decodeS'] for x in runs],
            'msPerDecodeStep': 1000 / tps, 'decodeWeightGBps': gbps, 'decodeBandwidthRatio': gbps / copy_gbps,
            'prefillTokPerS': median([a.prompt_tokens / (x['ttftMs'] / 1000) for x in runs]),
            'warmupS': warm_s, 'ttft': [],
        }
        save()
        print(f"peer     {name}: decode {tps:.2f} tok/s ({1000 / tps:.2f} ms/step) = {gbps:.1f} GB/s of weights, "
              f"ratio {gbps / copy_gbps:.4f} of {copy_gbps:.0f} GB/s; {a.prompt_tokens}-token prefill "
              f"{r[name]['prefillTokPerS']:.0f} tok/s; warm-up call {warm_s:.1f} s")

    def ttft_phase(name, **kw):
        for i, n in enumerate(sweep):
            ms = [once(prompt(n, 1000 * (i + 1) + j), 1, **kw)['ttftMs'] for j in range(1, a.prefill_repeats + 1)]
            t = median(ms) / 1000
            flops = 2 * params * n
            attn = 2 * n * n * cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads) * cfg.num_hidden_layers
            r[name]['ttft'].append({
                'promptTokens': n, 'ttftMs': median(ms), 'ttftMsAll': ms, 'prefillTokPerS': n / t,
                'mfu': flops / t / (gemm_tflops * 1e12), 'mfuWithAttention': (flops + attn) / t / (gemm_tflops * 1e12),
            })
            save()
            print(f"peer     {name}: ttft {n}-token prompt {median(ms):.1f} ms (runs {', '.join(f'{x:.0f}' for x in ms)}), "
                  f"MFU {100 * flops / t / (gemm_tflops * 1e12):.2f}%")

    decode_phase('eager')
    ttft_phase('eager')
    if a.compile and a.compile_until and time.time() > a.compile_until:
        r['compiled'] = {'skipped': f'not started: {time.time() - a.compile_until:.0f} s past --compile-until'}
        save()
        print(f"peer     compiled: {r['compiled']['skipped']}")
    elif a.compile:
        # transformers compiles the decode step when the cache is static (generation_config.compile_config)
        decode_phase('compiled', cache_implementation='static')
        r['compiled']['compileS'] = r['compiled']['warmupS']
        try:  # evidence that generate compiled the decode step
            from torch._dynamo.utils import counters
            r['compiled']['dynamoUniqueGraphs'] = counters['stats']['unique_graphs']
        except Exception as e:
            r['compiled']['dynamoUniqueGraphs'] = f'unknown ({type(e).__name__})'
        save()


if __name__ == '__main__':
    os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')
    main()
