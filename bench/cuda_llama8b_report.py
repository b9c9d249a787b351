#!/usr/bin/env python3
"""Markdown summary of bench/cuda-llama8b.sh's OUTDIR (ceilings.json, llmts.json, transformers.json).

usage: python3 bench/cuda_llama8b_report.py OUTDIR > OUTDIR/summary.md
"""
import json
import os
import sys


def load(d, name):
    p = os.path.join(d, name)
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def fmt(x, spec):
    return '—' if x is None else format(x, spec)


def main():
    d = sys.argv[1]
    c, l, t = load(d, 'ceilings.json'), load(d, 'llmts.json'), load(d, 'transformers.json')
    out = []
    if c:
        out.append(f"Ceilings (same run, PyTorch {c['torch']}, {c['gpu']}): copy {c['copyGBps']:.0f} GB/s "
                   f"(read + written), bf16 GEMM {c['gemmTflops']:.0f} TFLOP/s at 8192³.")
        out.append('Prefill-shape GEMMs (TFLOP/s): ' + ', '.join(f'{k} {v}' for k, v in c['gemmShapes'].items()) + '.')
    else:
        out.append('Ceilings: not measured in this run (ratios use the H200 figures of BENCHMARKS.md "Machines").')
    out.append('')

    cols = [('llmts CUDA', l)]
    if t:
        cols.append((f"transformers {t['transformers']} eager (sdpa, dynamic cache)", t.get('eager')))
        comp = t.get('compiled')
        if comp and 'decodeTokPerS' in comp:
            cols.append(('transformers static cache + torch.compile', comp))
    def ttft(x, n):
        for e in (x or {}).get('ttft', []):
            if e['promptTokens'] == n:
                return e
        return None

    rows = []
    ready = [l and l['readyMs'] / 1000] + ([t and t['readyS']] if t else []) + ([None] if len(cols) > 2 else [])
    rows.append(('launch to ready (s)', [fmt(x, '.1f') for x in ready]))
    for label, key, spec in [('decode tok/s, B=1', 'decodeTokPerS', '.1f'), ('ms per decode step', 'msPerDecodeStep', '.2f'),
                             ('decode weight GB/s', 'decodeWeightGBps', '.0f'), ('÷ copy GB/s', 'decodeBandwidthRatio', '.3f'),
                             (f"prefill tok/s, {(l or t or {}).get('promptTokens', '?')} prompt", 'prefillTokPerS', '.0f')]:
        rows.append((label, [fmt((x or {}).get(key), spec) for _, x in cols]))
    rows.append(('launches per decode step', [fmt(l and l.get('launchesPerDecodeStep'), '.0f')] + ['—'] * (len(cols) - 1)))
    sweep = sorted({e['promptTokens'] for _, x in cols for e in (x or {}).get('ttft', [])})
    for n in sweep:
        rows.append((f'TTFT {n} prompt (ms)', [fmt((ttft(x, n) or {}).get('ttftMs'), '.0f') for _, x in cols]))
        rows.append((f'prefill MFU {n} (2·P·N; +attention)', [
            '—' if ttft(x, n) is None else f"{100 * ttft(x, n)['mfu']:.1f}%; {100 * ttft(x, n)['mfuWithAttention']:.1f}%"
            for _, x in cols]))
    out.append('| | ' + ' | '.join(n for n, _ in cols) + ' |')
    out.append('|---|' + '---|' * len(cols))
    for label, vals in rows:
        out.append(f'| {label} | ' + ' | '.join(vals) + ' |')
    out.append('')
    if l:
        out.append(f"llmts: {l['device']}; weights {l['loadMs'] / 1000:.1f} s, backend init (kernels) "
                   f"{l['backendInitMs'] / 1000:.1f} s, node + tsx start {l['backendStartMs'] / 1000:.1f} s; "
                   f"{l['weightBytesPerDecodeStep'] / 1e9:.2f} GB read per decode step; "
                   f"{l['totalParams'] / 1e9:.3f} B params; token budget {l['tokenBudget']}.")
    if t:
        comp = t.get('compiled')
        if comp and 'decodeTokPerS' in comp:
            out.append(f"transformers compile: first (compiling) generate call {comp['compileS']:.0f} s.")
        elif comp:
            out.append(f"transformers static cache + torch.compile: {comp.get('skipped')}.")
        else:
            out.append('transformers static cache + torch.compile: not run.')
        if l and t.get('eager'):
            out.append(f"llmts ÷ transformers eager: decode {l['decodeTokPerS'] / t['eager']['decodeTokPerS']:.2f}×.")
    steps = os.path.join(d, 'steps.txt')
    if os.path.exists(steps):
        with open(steps) as f:
            out.append('Steps (name, exit status, seconds): ' + '; '.join(s.strip() for s in f if s.strip()) + '.')
    print('\n'.join(out))


if __name__ == '__main__':
    main()
