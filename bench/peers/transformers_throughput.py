#!/usr/bin/env python3
"""The in-run peer for bench/cuda-throughput.ts: the same batched workload (N requests submitted at
once, each its own prompt of --input-tokens ids, --output-tokens greedy tokens, EOS ignored) through
transformers' own continuous batching, on the same model directory and the same prompt ids, timed
the same way: output tok/s = generated tokens / wall time from the first submission to the last
result; total tok/s adds the prompt tokens; TTFT, inter-token latency and end-to-end latency per
request from transformers' own per-token timestamps (record_timestamps).

Modes (--mode, comma-separated, run in this order in one process, the model loaded once):
  cb        transformers continuous batching (ContinuousBatchingManager, the engine behind
            generate_batch and `transformers serve`): model.init_continuous_batching(generation_config,
            continuous_batching_config, workload_hints), manager.warmup() (transformers' own warm-up,
            it captures CUDA graphs when it uses them), manager.start(), a few untimed warm-up
            requests, then every request at once with add_request(record_timestamps=True,
            eos_token_id=-1, max_new_tokens=N); results from get_result(). Attention: --attn auto =
            flash_attention_2 when the flash_attn package is importable (transformers then also
            uses CUDA graphs, async batching and its decode fast path), else paged|sdpa (what
            transformers says to use for sdpa). Block sharing (prefix caching) is off, as llmts's
            prefix cache is in its bench; everything else is transformers' automatic sizing.
  generate  the fallback, labelled as such: model.generate in static batches of --gen-batch (64)
            requests, sdpa, the default dynamic cache, min_new_tokens = max_new_tokens. Batches run
            one after another; all requests count as submitted at the start. Runs automatically
            when the cb mode fails before it produced anything.
With both modes, cb gets --cb-share of the time left after loading, generate the rest.

Time limit (--budget-s, from process start): a mode that runs out of time is stopped (cb: tokens
counted from the live request states at the deadline, then a hard stop; generate: max_time) and its
JSON says complete: false with what was done. Results go to --json after every phase.

Prompts: --prompts FILE (written by bench/cuda-throughput.ts --write-prompts); without it the same
generator is run here: request r of n ids, V = min(vocab, 5000),
  x = (seed * 1000003 + r * 7919 + 12345) mod 2^32; per id: x = (1664525 x + 1013904223) mod 2^32,
  id = floor(x / 256) mod V.

usage: python3 bench/peers/transformers_throughput.py --model DIR [--prompts prompts.json]
         [--requests 256] [--input-tokens 1024] [--output-tokens 1024] [--seed 1] [--mode cb]
         [--attn auto] [--cuda-graph auto|on|off] [--max-batch-tokens N] [--num-blocks N]
         [--gen-batch 64] [--budget-s S] [--cb-share 0.6] [--progress-s 5] [--launch-time EPOCH_S]
         [--json out.json]
PEER_DEVICE=cpu (with a tiny model) only tests the plumbing off the GPU machine.
"""
import argparse
import dataclasses
import gc
import importlib.util
import inspect
import json
import math
import os
import sys
import time
import traceback

T_PROCESS = time.time()
T_MONO = time.monotonic()
DEVICE = os.environ.get('PEER_DEVICE', 'cuda')
TWO32 = 4294967296


def prompt_ids(r, n, vocab, seed):
    x = (seed * 1000003 + r * 7919 + 12345) % TWO32
    ids = []
    for _ in range(n):
        x = (x * 1664525 + 1013904223) % TWO32
        ids.append((x // 256) % vocab)
    return ids


def pct(s, p):
    if not s:
        return None
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


def dist(xs):
    """mean and percentiles (nearest rank, as bench/cuda-throughput.ts); None where there is no sample"""
    s = sorted(xs)
    return {'n': len(s), 'mean': sum(s) / len(s) if s else None, 'p50': pct(s, 50), 'p90': pct(s, 90),
            'p99': pct(s, 99), 'max': s[-1] if s else None}


def num(x, spec):
    return '-' if x is None else format(x, spec)


def log(msg):
    print(msg, flush=True)


def note(msg):
    print(msg, file=sys.stderr, flush=True)


def jsonable(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    return str(v)


def only_known(fn_or_cls, kw):
    """The keyword arguments `fn_or_cls` accepts (dataclass fields or signature), the rest dropped."""
    if dataclasses.is_dataclass(fn_or_cls):
        names = {f.name for f in dataclasses.fields(fn_or_cls)}
    else:  # named parameters only: a **kwargs catch-all (logit processor kwargs, deprecated options) gets nothing
        names = {n for n, p in inspect.signature(fn_or_cls).parameters.items()
                 if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in kw.items() if k in names}


def summarise(n_req, in_tok, out_tok, t0, t_end, per_req, gaps, decode_phase, steps):
    """The fields bench/cuda-throughput.ts reports, from per-request (tokens, first, last, end, done)."""
    wall = t_end - t0
    tokens = sum(r['tokens'] for r in per_req.values())
    started = sum(1 for r in per_req.values() if r['tokens'] > 0)
    completed = sum(1 for r in per_req.values() if r['done'])
    ttft = [(r['first'] - t0) * 1000 for r in per_req.values() if r['tokens'] > 0 and r['first'] is not None]
    itl = [(r['last'] - r['first']) * 1000 / (r['tokens'] - 1) for r in per_req.values()
           if r['tokens'] > 1 and r['first'] is not None and r['last'] is not None]
    e2e = [(r['end'] - t0) * 1000 for r in per_req.values() if r['done'] and r['end'] is not None]
    return {
        'complete': completed == n_req, 'requestsSubmitted': n_req, 'requestsCompleted': completed,
        'requestsStarted': started, 'wallS': wall, 'outputTokens': tokens, 'inputTokens': started * in_tok,
        'outputTokPerS': tokens / wall if wall > 0 else None,
        'totalTokPerS': (tokens + started * in_tok) / wall if wall > 0 else None,
        'decodePhase': decode_phase,
        'ttftMs': dist(ttft), 'itlMs': {'meanOfRequests': sum(itl) / len(itl) if itl else None, 'pooled': dist(gaps)},
        'e2eLatencyMs': dist(e2e), 'steps': steps,
        'msPerStep': wall * 1000 / steps if steps else None,
        'ttftMsAll': [round(x) for x in ttft],
    }


def print_summary(name, s):
    log(f"{name}: {s['requestsCompleted']}/{s['requestsSubmitted']} requests completed"
        f"{'' if s['complete'] else ' (NOT complete: ' + str(s.get('stoppedBy')) + ')'} in {s['wallS']:.2f} s; "
        f"output {num(s['outputTokPerS'], '.1f')} tok/s ({s['outputTokens']} tokens), total {num(s['totalTokPerS'], '.1f')} tok/s"
        + (f"; after the last first token {s['decodePhase']['tokPerS']:.1f} tok/s" if s.get('decodePhase') else ''))
    t, i = s['ttftMs'], s['itlMs']
    log(f"{name}: TTFT mean {num(t['mean'], '.0f')} ms, p50 {num(t['p50'], '.0f')}, p99 {num(t['p99'], '.0f')}; inter-token mean "
        f"{num(i['meanOfRequests'], '.2f')} ms (pooled p50 {num(i['pooled']['p50'], '.2f')}, p99 {num(i['pooled']['p99'], '.2f')})"
        + (f"; {s['steps']} steps, {s['msPerStep']:.2f} ms/step" if s.get('steps') else ''))


# ------------------------------------------------------------------------------------------------
# continuous batching
# ------------------------------------------------------------------------------------------------

def import_cb_types():
    """ContinuousBatchingConfig and WorkloadHints where this transformers version has them (else None)."""
    cbc = hints = None
    for mod, name in (('transformers', 'ContinuousBatchingConfig'), ('transformers.generation', 'ContinuousBatchingConfig'),
                      ('transformers.generation.configuration_utils', 'ContinuousBatchingConfig')):
        try:
            cbc = getattr(__import__(mod, fromlist=[name]), name)
            break
        except Exception:  # ImportError, or AttributeError from the lazy top-level module
            pass
    try:
        from transformers.generation.continuous_batching.utils import WorkloadHints as hints
    except Exception:
        pass
    return cbc, hints


def live_states(manager):
    """The scheduler's request states (active and waiting) by id; read from another thread, so best effort."""
    sch = getattr(getattr(manager, 'batch_processor', None), 'scheduler', None)
    out = {}
    for attr in ('active_requests', 'waiting_requests'):
        d = getattr(sch, attr, None)
        if not isinstance(d, dict):
            continue
        for _ in range(3):
            try:
                out.update(dict(d))
                break
            except RuntimeError:  # changed size during iteration
                continue
    return out


def state_tokens(st):
    toks = getattr(st, 'generated_tokens', None) or []
    ts = getattr(st, '_timestamps', None) or getattr(st, 'timestamps', None) or []
    return len(toks), (ts[0] if ts else None), (ts[-1] if ts else None)


def stop_manager(manager, pending_ids, hard):
    kw = {'block': True, 'timeout': 20}
    params = inspect.signature(manager.stop).parameters
    if hard:
        if 'hard_stop' in params:
            kw['hard_stop'] = True
        else:  # older versions flush what is pending before they stop: cancel it first
            for rid in pending_ids:
                try:
                    manager.cancel_request(rid)
                except Exception:
                    pass
    manager.stop(**only_known(manager.stop, kw))
    if hasattr(manager, 'destroy'):
        try:
            manager.destroy()
        except Exception as e:
            note(f'peer: manager.destroy failed: {type(e).__name__}: {e}')


def run_cb(a, model, prompts, deadline, rec, save):
    import torch
    from transformers import GenerationConfig

    n, out_tok = len(prompts), a.output_tokens
    cbc_cls, hints_cls = import_cb_types()
    rec['api'] = {'ContinuousBatchingConfig': cbc_cls is not None, 'WorkloadHints': hints_cls is not None}
    # eos_token_id None: init_continuous_batching sets it to -1 (disabled); add_request passes -1 too
    gen_kw = {'max_new_tokens': out_tok, 'do_sample': False}
    cb_kw = {'allow_block_sharing': a.block_sharing}
    if a.max_batch_tokens:
        cb_kw['max_batch_tokens'] = a.max_batch_tokens
    if a.num_blocks:
        cb_kw['num_blocks'] = a.num_blocks
    if a.cuda_graph != 'auto':
        cb_kw['use_cuda_graph'] = a.cuda_graph == 'on'
    init_kw = {}
    if cbc_cls is not None:
        init_kw['continuous_batching_config'] = cbc_cls(**only_known(cbc_cls, cb_kw))
        rec['cbConfigRequested'] = jsonable(only_known(cbc_cls, cb_kw))
    else:  # older versions read these from the generation config
        gen_kw.update({k: v for k, v in cb_kw.items() if k != 'allow_block_sharing'})
    gen_cfg = GenerationConfig(**gen_kw)
    init_kw['generation_config'] = gen_cfg
    if hints_cls is not None:
        init_kw['workload_hints'] = hints_cls(**only_known(hints_cls, {
            'max_prompt_length': a.input_tokens, 'max_generated_length': out_tok, 'num_requests': n}))
    init_kw = only_known(model.init_continuous_batching, init_kw)
    rec['initKwargs'] = sorted(init_kw)

    t = time.time()
    manager = model.init_continuous_batching(**init_kw)

    def submit(rid, ids, max_new):
        kw = {'input_ids': ids, 'request_id': rid, 'max_new_tokens': max_new, 'record_timestamps': True, 'eos_token_id': -1}
        got = manager.add_request(**only_known(manager.add_request, kw))
        if got is None:
            raise RuntimeError(f'the manager refused request {rid}')

    pending_ids = []
    failed = True
    try:
        if hasattr(manager, 'warmup'):
            with torch.no_grad():  # as continuous_batching_context_manager calls it
                manager.warmup()  # transformers' own warm-up: captures CUDA graphs when it uses them
        manager.start()
        # a few untimed requests through the started manager
        w_n = min(a.warmup_requests, n)
        w_len = min(32, a.input_tokens)
        vocab = min(model.config.get_text_config().vocab_size if hasattr(model.config, 'get_text_config') else model.config.vocab_size, 5000)
        for i in range(w_n):
            submit(f'warm_{i}', prompt_ids(i, w_len, vocab, a.seed + 7777), min(16, out_tok))
        got = 0
        while got < w_n:
            r = manager.get_result(timeout=1)
            if r is not None and str(r.request_id).startswith('warm_'):
                if getattr(r, 'error', None):
                    raise RuntimeError(f'warm-up request failed: {r.error}')
                got += 1
            elif r is None and not manager.is_running():
                raise RuntimeError('the generation thread stopped during the warm-up')
            if time.monotonic() > deadline:
                raise TimeoutError('the time budget ran out during the warm-up')
        rec['warmupS'] = time.time() - t
        resolved = getattr(manager, 'continuous_batching_config', None)
        if dataclasses.is_dataclass(resolved):
            rec['cbConfigResolved'] = jsonable({f.name: getattr(resolved, f.name) for f in dataclasses.fields(resolved)})
        rec['attnImplementation'] = getattr(model.config, '_attn_implementation', None)
        save()
        log(f"peer cb: manager ready and warmed up in {rec['warmupS']:.1f} s (attention {rec['attnImplementation']}); "
            f"resolved config: " + ', '.join(f'{k}={v}' for k, v in (rec.get('cbConfigResolved') or {}).items()
                                              if k in ('num_blocks', 'max_batch_tokens', 'page_size', 'block_size', 'max_requests_per_batch',
                                                       'max_blocks_per_request', 'use_cuda_graph', 'use_async_batching', 'max_memory_percent')))

        # the timed run
        step0 = getattr(manager, 'current_batch', None)
        ids = [f'req_{i}' for i in range(n)]
        per = {rid: {'tokens': 0, 'first': None, 'last': None, 'end': None, 'done': False} for rid in ids}
        results = {}
        gaps = []
        timeline = []
        t0 = time.perf_counter()
        for rid, p in zip(ids, prompts):
            submit(rid, p, out_tok)
        pending_ids = list(ids)
        log(f'peer cb: {n} requests submitted in {time.perf_counter() - t0:.2f} s')
        next_poll = next_progress = t0
        all_first = None
        stopped_by = None
        t_end = None
        while len(results) < n:
            r = manager.get_result(timeout=0.25)
            now = time.perf_counter()
            if r is not None and r.request_id in per and r.request_id not in results:
                results[r.request_id] = r
                q = per[r.request_id]
                q['tokens'] = len(r.generated_tokens)
                ts = getattr(r, 'timestamps', None) or []
                if ts:
                    q['first'], q['last'] = ts[0], ts[-1]
                    gaps.extend((y - x) * 1000 for x, y in zip(ts, ts[1:]))
                q['end'] = now
                q['done'] = getattr(r, 'error', None) is None and len(r.generated_tokens) >= out_tok
                if getattr(r, 'error', None):
                    rec.setdefault('errors', []).append(f'{r.request_id}: {r.error}'[:300])
                t_end = now
            elif r is None and not manager.is_running():
                stopped_by = 'generation thread stopped'
                break
            if now >= next_poll or len(results) == n:
                next_poll = now + 0.5
                live = live_states(manager)
                for rid, st in live.items():
                    if rid in per and rid not in results:
                        k, f, l_ = state_tokens(st)
                        q = per[rid]
                        if k >= q['tokens']:
                            q['tokens'], q['first'], q['last'] = k, f if f is not None else q['first'], l_ if l_ is not None else q['last']
                tokens = sum(q['tokens'] for q in per.values())
                started = sum(1 for q in per.values() if q['tokens'] > 0)
                if all_first is None and started == n:
                    all_first = (now, tokens)
                if now >= next_progress:
                    next_progress = now + a.progress_s
                    s = now - t0
                    timeline.append({'s': round(s, 1), 'tokens': tokens, 'finished': len(results), 'started': started})
                    note(f'[transformers cb] {s:.1f} s: {tokens} output tokens ({tokens / s if s > 0 else 0:.1f} tok/s so far), '
                         f'{started}/{n} started, {len(results)}/{n} done, steps {(getattr(manager, "current_batch", 0) or 0) - (step0 or 0)}')
            if time.monotonic() >= deadline:
                stopped_by = 'budget'
                note('[transformers cb] time budget reached: counting what was generated, then a hard stop')
                live = live_states(manager)
                for rid, st in live.items():
                    if rid in per and rid not in results:
                        k, f, l_ = state_tokens(st)
                        q = per[rid]
                        if k >= q['tokens']:
                            q['tokens'], q['first'], q['last'] = k, f if f is not None else q['first'], l_ if l_ is not None else q['last']
                        ts = list(getattr(st, '_timestamps', None) or [])
                        gaps.extend((y - x) * 1000 for x, y in zip(ts, ts[1:]))
                t_end = now
                break
        if t_end is None:
            t_end = time.perf_counter()
        steps = None if step0 is None else (getattr(manager, 'current_batch', step0) - step0)
        tokens_end = sum(q['tokens'] for q in per.values())
        decode_phase = None
        if all_first is not None and t_end > all_first[0]:
            decode_phase = {'s': t_end - all_first[0], 'tokens': tokens_end - all_first[1],
                            'tokPerS': (tokens_end - all_first[1]) / (t_end - all_first[0])}
        s = summarise(n, a.input_tokens, out_tok, t0, t_end, per, gaps, decode_phase, steps)
        s['stoppedBy'] = stopped_by
        s['timeline'] = timeline
        s['maxMemoryAllocatedGiB'] = torch.cuda.max_memory_allocated() / 2**30 if DEVICE == 'cuda' else None
        rec.update(s)
        save()
        print_summary('peer cb', s)
        pending_ids = [rid for rid in ids if rid not in results]
        failed = False
    finally:
        stop_manager(manager, pending_ids, hard=failed or bool(pending_ids))
        del manager
        gc.collect()
        if DEVICE == 'cuda':
            torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------
# fallback: static batches through model.generate
# ------------------------------------------------------------------------------------------------

def run_generate(a, model, prompts, deadline, rec, save):
    import torch
    try:
        from transformers.generation.streamers import BaseStreamer
    except ImportError:
        BaseStreamer = object

    class Clock(BaseStreamer):
        """Notes when each generated token arrives (the first put is the prompt)."""

        def __init__(self):
            self.times = []

        def put(self, value):
            self.times.append(time.perf_counter())

        def end(self):
            pass

    gc.collect()  # a continuous batching run before this one may have left its cache to collect
    if DEVICE == 'cuda':
        torch.cuda.empty_cache()
    impl = getattr(model.config, '_attn_implementation', '') or ''
    if impl.startswith('paged|') or impl.endswith('_paged'):
        model.set_attn_implementation(a.gen_attn)
    rec['attnImplementation'] = getattr(model.config, '_attn_implementation', None)
    rec['label'] = f'fallback, not continuous batching: model.generate in static batches of {a.gen_batch}, {rec["attnImplementation"]}, dynamic cache'
    n, B, out_tok = len(prompts), a.gen_batch, a.output_tokens

    def gen(ids, new, max_time=None):
        ids = torch.tensor(ids, device=model.device)
        clock = Clock()
        kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                  pad_token_id=0, streamer=clock)
        if max_time is not None:
            kw['max_time'] = max_time
        out = model.generate(ids, **kw)
        if DEVICE == 'cuda':
            torch.cuda.synchronize()
        return out.shape[1] - ids.shape[1], clock.times

    t = time.time()
    vocab = min(model.config.vocab_size, 5000)
    gen([prompt_ids(i, min(32, a.input_tokens), vocab, a.seed + 7777) for i in range(min(B, n))], min(8, out_tok))
    rec['warmupS'] = time.time() - t

    per = {}
    gaps = []
    timeline = []
    stopped_by = None
    t0 = time.perf_counter()
    for b0 in range(0, n, B):
        left = deadline - time.monotonic()
        if left < 3:
            stopped_by = 'budget' if b0 else 'budget (no time to start)'
            break
        rows = prompts[b0:b0 + B]
        k, times = gen(rows, out_tok, max_time=left - 2)
        now = time.perf_counter()
        tok_times = times[1:]  # times[0] is the prompt
        for j in range(len(rows)):
            per[f'req_{b0 + j}'] = {'tokens': k, 'first': tok_times[0] if tok_times else None,
                                   'last': tok_times[-1] if tok_times else None, 'end': now, 'done': k >= out_tok}
        gaps.extend([(y - x) * 1000 for x, y in zip(tok_times, tok_times[1:])] * len(rows))
        timeline.append({'s': round(now - t0, 1), 'tokens': sum(q['tokens'] for q in per.values()), 'finished': b0 + len(rows)})
        note(f'[transformers generate] batch {b0 // B + 1}/{math.ceil(n / B)}: {k} tokens x {len(rows)} rows, '
             f'{now - t0:.1f} s so far')
        if k < out_tok:
            stopped_by = 'budget'
            break
    t_end = time.perf_counter()
    for i in range(n):
        per.setdefault(f'req_{i}', {'tokens': 0, 'first': None, 'last': None, 'end': None, 'done': False})
    s = summarise(n, a.input_tokens, out_tok, t0, t_end, per, gaps, None, None)
    s['stoppedBy'] = stopped_by
    s['timeline'] = timeline
    s['maxMemoryAllocatedGiB'] = torch.cuda.max_memory_allocated() / 2**30 if DEVICE == 'cuda' else None
    rec.update(s)
    save()
    print_summary('peer generate', s)


# ------------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--model', required=True)
    ap.add_argument('--prompts', help='JSON written by bench/cuda-throughput.ts --write-prompts')
    ap.add_argument('--requests', type=int, default=256)
    ap.add_argument('--input-tokens', type=int, default=1024)
    ap.add_argument('--output-tokens', type=int, default=1024)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--mode', default='cb', help='cb, generate, or cb,generate')
    ap.add_argument('--attn', default='auto', help='auto | paged|sdpa | flash_attention_2 | ...')
    ap.add_argument('--gen-attn', default='sdpa', help='attention for the generate mode')
    ap.add_argument('--cuda-graph', default='auto', choices=['auto', 'on', 'off'])
    ap.add_argument('--max-batch-tokens', type=int)
    ap.add_argument('--num-blocks', type=int)
    ap.add_argument('--block-sharing', action='store_true', help='allow prefix block sharing (off: llmts runs without prefix cache)')
    ap.add_argument('--warmup-requests', type=int, default=4)
    ap.add_argument('--gen-batch', type=int, default=64)
    ap.add_argument('--budget-s', type=float)
    ap.add_argument('--cb-share', type=float, default=0.6)
    ap.add_argument('--progress-s', type=float, default=5)
    ap.add_argument('--launch-time', type=float, help='epoch seconds when the launcher started this process')
    ap.add_argument('--json')
    a = ap.parse_args()
    modes = [m.strip() for m in a.mode.split(',') if m.strip()]
    for m in modes:
        if m not in ('cb', 'generate'):
            ap.error(f'unknown mode {m}')
    deadline = T_MONO + a.budget_s if a.budget_s else float('inf')
    t_launch = a.launch_time or T_PROCESS

    # prompts first: they need no torch
    if a.prompts:
        with open(a.prompts) as f:
            pj = json.load(f)
        prompts = pj['prompts'][:a.requests]
        if len(prompts) < a.requests or any(len(p) != a.input_tokens for p in prompts):
            raise SystemExit(f'{a.prompts}: expected {a.requests} prompts of {a.input_tokens} ids')
        a.seed = pj.get('seed', a.seed)
        prompt_source = a.prompts
    else:
        with open(os.path.join(a.model, 'config.json')) as f:
            c = json.load(f)
        vocab = min(c.get('vocab_size') or c['text_config']['vocab_size'], 5000)
        prompts = [prompt_ids(r, a.input_tokens, vocab, a.seed) for r in range(a.requests)]
        prompt_source = f'generated here (seed {a.seed}, vocab {vocab})'

    r = {'peer': 'transformers', 'workload': {'requests': a.requests, 'inputTokens': a.input_tokens, 'outputTokens': a.output_tokens,
                                              'ignoreEos': True, 'sampling': 'greedy', 'seed': a.seed, 'prompts': prompt_source},
         'modes': modes, 'runs': {}, 'budgetS': a.budget_s}

    def save():
        if a.json:
            with open(a.json, 'w') as f:
                json.dump(r, f, indent=2)

    os.environ.setdefault('HF_HUB_OFFLINE', '1')  # the model is local; the GPU machine has no network
    os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    t_import = time.time()
    have_fa = importlib.util.find_spec('flash_attn') is not None
    attn = a.attn if a.attn != 'auto' else ('flash_attention_2' if have_fa and DEVICE == 'cuda' else 'paged|sdpa')
    r.update({'transformers': transformers.__version__, 'torch': torch.__version__,
              'gpu': torch.cuda.get_device_name() if DEVICE == 'cuda' else DEVICE, 'flashAttnInstalled': have_fa,
              'kernelsInstalled': importlib.util.find_spec('kernels') is not None, 'attnRequested': attn})
    # device_map first; then on the host and .to(device) (device_map may want accelerate); then plain
    # sdpa (a version without the paged|sdpa name: the manager makes sdpa paged itself)
    attempts = [(attn, True), (attn, False)]
    if attn != 'sdpa' and 'sdpa' in attn:
        attempts += [('sdpa', True), ('sdpa', False)]
    model = None
    for i, (impl, dmap) in enumerate(attempts):
        try:
            kw = {'dtype': torch.bfloat16, 'attn_implementation': impl}
            if dmap:
                kw['device_map'] = DEVICE
            model = AutoModelForCausalLM.from_pretrained(a.model, **kw)
            if not dmap:
                model = model.to(DEVICE)
            r['attnRequested'], r['load'] = impl, 'device_map' if dmap else 'host then .to(device)'
            break
        except Exception as e:
            note(f'peer: from_pretrained(attn_implementation={impl}, device_map={DEVICE if dmap else None}) failed: '
                 f'{type(e).__name__}: {str(e)[:300]}')
            if i == len(attempts) - 1:
                raise
    model.eval()
    if DEVICE == 'cuda':
        torch.cuda.synchronize()
    t_ready = time.time()
    r.update({'importS': t_import - t_launch, 'loadS': t_ready - t_import, 'readyS': t_ready - t_launch,
              'params': sum(p.numel() for p in model.parameters())})
    save()
    log(f"peer transformers {transformers.__version__}, torch {torch.__version__}: ready {r['readyS']:.1f} s after launch "
        f"(imports {r['importS']:.1f} s, from_pretrained {r['loadS']:.1f} s); attention {r['attnRequested']}; flash_attn installed: {have_fa}; "
        f"prompts {prompt_source}")

    todo = list(modes)
    i = 0
    while i < len(todo):
        mode = todo[i]
        later = len(todo) - i - 1
        now = time.monotonic()
        mode_deadline = deadline if later == 0 else now + (deadline - now) * a.cb_share
        rec = r['runs'].setdefault(mode, {'mode': mode})
        if mode == 'cb':
            rec['label'] = 'transformers continuous batching (ContinuousBatchingManager)'
        try:
            (run_cb if mode == 'cb' else run_generate)(a, model, prompts, mode_deadline, rec, save)
        except Exception as e:
            rec['error'] = f'{type(e).__name__}: {e}'
            rec['traceback'] = traceback.format_exc()[-4000:]
            note(f'peer {mode} failed: {rec["error"]}')
            if mode == 'cb' and 'generate' not in todo and not rec.get('outputTokens'):
                todo.append('generate')
                r['fallbackReason'] = f'continuous batching failed: {rec["error"]}'[:500]
        save()
        i += 1

    # the figure the summary compares with: continuous batching when it produced tokens, else the fallback
    head = next((m for m in ('cb', 'generate') if r['runs'].get(m, {}).get('outputTokens')), None)
    r['headlineMode'] = head
    if head:
        h = r['runs'][head]
        for k in ('label', 'attnImplementation', 'complete', 'stoppedBy', 'requestsSubmitted', 'requestsCompleted', 'requestsStarted',
                  'wallS', 'outputTokens', 'inputTokens', 'outputTokPerS', 'totalTokPerS', 'decodePhase', 'ttftMs', 'itlMs',
                  'e2eLatencyMs', 'steps', 'msPerStep'):
            r[k] = h.get(k)
    save()
    return 0 if head else 1


if __name__ == '__main__':
    sys.exit(main())
