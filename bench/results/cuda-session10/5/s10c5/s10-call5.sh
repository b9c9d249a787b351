#!/usr/bin/env bash
# session 10, call 5: where the bulk GEMV's ~9 us fixed cost goes: Nsight Compute source-level stall
# samples (SASS) for one o-shaped k_gemvt_m1 launch (the tuner's 5th: after four of 1x6144x4096)
set -u
source bench/cuda-device-lib.sh
call_start s10c5 "$1"
call_wait_model
NCU=/usr/local/cuda/bin/ncu
LLMTS_CUDA_GEMV_BULK=on timeout 200 $NCU --kernel-name k_gemvt_m1 --launch-skip 4 --launch-count 1 --set full -f -o $W/o \
  node --import tsx bench/cuda-generate.ts --device cuda --model $MODEL_DIR --prompt-tokens 64 --decode-tokens 4 --repeats 1 > $W/ncu-run.log 2>&1
echo "ncu rc $?"
timeout 60 $NCU --import $W/o.ncu-rep --page source --csv --print-source sass > $W/source.csv 2> $W/source.err
echo "source rc $? $(wc -l < $W/source.csv) lines"; head -c 600 $W/source.err
timeout 60 $NCU --import $W/o.ncu-rep --page details > $W/details.txt 2>&1
timeout 60 $NCU --import $W/o.ncu-rep --page raw --csv > $W/raw.csv 2>&1
grep -E "Duration|DRAM Throughput|Executed Instructions  " $W/details.txt | head
python3 - "$W/source.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[0]
print(hdr)
def col(name):
    for i, h in enumerate(hdr):
        if h.startswith(name): return i
    return None
src, samp, ex = col('Source'), col('Warp Stall Sampling (All'), col('Instructions Executed')
tot = sum(float(r[samp] or 0) for r in rows[1:] if len(r) > samp)
top = sorted(rows[1:], key=lambda r: -float(r[samp] or 0) if len(r) > samp else 0)[:40]
for r in top: print(f"{float(r[samp] or 0)/tot*100:5.1f}%  ex {r[ex]:>8}  {r[src][:110]}")
PY
xz -9f $W/raw.csv $W/source.csv; rm -f $W/o.ncu-rep
call_finish
