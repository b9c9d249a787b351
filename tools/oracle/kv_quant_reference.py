"""Writes test/fixtures/kv-quant/e4m3.json: f32 values and the float8_e4m3fn bytes PyTorch rounds
them to, the oracle for the fp8 KV pools' rounding (native/kv_format.h f32_to_e4m3).

The values are every e4m3 value, the midpoints between neighbours (ties: they round to even),
each of those nudged one f32 ulp either way, the subnormal range, magnitudes up to 448 (e4m3's
largest; the pools scale each row into it), and random magnitudes over the whole range.

    python3 tools/oracle/kv_quant_reference.py [--out test/fixtures/kv-quant/e4m3.json]
"""
import argparse
import json

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="test/fixtures/kv-quant/e4m3.json")
    args = ap.parse_args()

    codes = torch.arange(0, 0x7F, dtype=torch.uint8)  # the finite non-negative codes (0x7f is NaN)
    values = codes.view(torch.float8_e4m3fn).to(torch.float32).numpy()
    mids = (values[:-1] + values[1:]) / 2  # exact in f32: neighbours differ in at most 4 mantissa bits
    nudged = np.concatenate([np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(1000))])
    rng = np.random.default_rng(0)
    rand = np.exp(rng.uniform(np.log(2.0**-12), np.log(448.0), 600)).astype(np.float32)
    sub = rng.uniform(0, 2.0**-6, 100).astype(np.float32)
    x = np.concatenate([values, mids, nudged, rand, sub, np.float32([448.0, 447.9, 440.0, 2.0**-10, 2.0**-9 * 1.5])]).astype(np.float32)
    x = np.concatenate([x, -x[::7]])
    bits = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    with open(args.out, "w") as f:
        json.dump({"torch": torch.__version__, "x": [float(v) for v in x], "bits": [int(b) for b in bits]}, f, separators=(",", ":"))
        f.write("\n")
    print(f"{args.out}: {len(x)} values")


if __name__ == "__main__":
    main()
