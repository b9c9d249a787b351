#!/usr/bin/env python3
"""Same-run physical ceilings of the GPU, measured with PyTorch, for bench/cuda-llama8b.sh.

  copyGBps:   device-to-device copy of a 4 GiB buffer, bytes read + written per second (best of 5
              timings of 10 copies each); the ceiling that decode's weight-read GB/s is set against
  gemmTflops: bf16 GEMM at 8192^3 (best of 5 timings of 20 GEMMs); the ceiling for prefill MFU
  gemmShapes: bf16 GEMM TFLOP/s at Llama-3.1-8B's prefill shapes, for context

usage: python3 bench/gpu_ceilings.py [--json ceilings.json] [--copy-gib 4]
"""
import argparse
import json
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--json')
    ap.add_argument('--copy-gib', type=float, default=4.0)
    a = ap.parse_args()

    import torch

    dev = torch.device('cuda')
    props = torch.cuda.get_device_properties(dev)

    def timed(fn, iters, trials=5):
        fn()
        torch.cuda.synchronize()
        best = float('inf')
        for _ in range(trials):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(iters):
                fn()
            e.record()
            e.synchronize()
            best = min(best, s.elapsed_time(e) / 1000 / iters)
        return best

    n = int(a.copy_gib * 2**30)
    src = torch.empty(n, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), 10)
    copy_gbps = 2 * n / t / 1e9
    del src, dst
    torch.cuda.empty_cache()

    def gemm_tflops(m, k, nn, iters=20):
        x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
        w = torch.randn(k, nn, dtype=torch.bfloat16, device=dev)
        tt = timed(lambda: torch.matmul(x, w), iters)
        return 2 * m * k * nn / tt / 1e12

    gemm = gemm_tflops(8192, 8192, 8192)
    shapes = {}
    for m in (512, 8192):
        for name, (k, nn) in {'qkv': (4096, 6144), 'o': (4096, 4096), 'gate_up': (4096, 28672), 'down': (14336, 4096)}.items():
            shapes[f'M{m}_{name}_{k}x{nn}'] = round(gemm_tflops(m, k, nn), 1)
    r = {
        'gpu': props.name, 'smCount': props.multi_processor_count, 'memGiB': round(props.total_memory / 2**30, 1),
        'torch': torch.__version__, 'cuda': torch.version.cuda,
        'copyGBps': copy_gbps, 'copyBytes': n, 'gemmTflops': gemm, 'gemmShape': '8192x8192x8192 bf16',
        'gemmShapes': shapes, 'measuredAt': time.strftime('%Y-%m-%d %H:%M:%S'),
    }
    print(f"ceilings {props.name}: copy {copy_gbps:.0f} GB/s (read + written, {a.copy_gib:g} GiB buffer), "
          f"bf16 GEMM {gemm:.0f} TFLOP/s at 8192^3")
    print('          prefill-shape GEMMs (TFLOP/s): ' + ', '.join(f'{k} {v}' for k, v in shapes.items()))
    if a.json:
        with open(a.json, 'w') as f:
            json.dump(r, f, indent=2)


if __name__ == '__main__':
    main()
