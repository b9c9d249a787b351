#!/usr/bin/env bash
# session 8, call 1: tools present?; MoE decode graph profiled at 1 and 16 rows with MOE_UNR_D=12 as a variant;
# dense 16-row step profile; nsys timeline of the B=1 dense decode graph if nsys exists
set -u
OUT=$1
W=/tmp/s8c1; mkdir -p $W
T0=$(date +%s)
{ ls /usr/local/cuda/bin; ls -d /opt/nvidia/* /usr/local/cuda/nsight* 2>/dev/null; which nsys ncu; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv; } > $W/tools.txt 2>&1
ML=/tmp/llmts-llama8b-random
[ -f $ML/config.json ] || (timeout 200 python3 bench/make_random_llama.py --out $ML --tokenizer models/demo/tokenizer.json > $W/make-llama.log 2>&1) &
PROFILE=1 VARIANTS="unr12:LLMTS_CUDA_GEMV_DEFINES=MOE_UNR_D=12" timeout 330 bash bench/cuda-moe.sh $W/moe > /dev/null 2>&1
echo "moe done at $(( $(date +%s) - T0 )) s"
wait
PROFILE_BATCH=16 CONTEXTS=512 VARIANTS="" timeout 150 bash bench/cuda-decode-ab.sh $W/dense > /dev/null 2>&1
echo "dense done at $(( $(date +%s) - T0 )) s"
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
if [ -n "$NSYS" ]; then
  timeout 120 $NSYS profile --cuda-graph-trace=node -o $W/b1 -f true node --import tsx bench/cuda-generate.ts --device cuda --model $ML \
    --prompt-tokens 512 --decode-tokens 32 --repeats 1 > $W/nsys.log 2>&1
  timeout 60 $NSYS stats --report cuda_gpu_trace --format csv -o $W/b1 $W/b1.nsys-rep >> $W/nsys.log 2>&1
  xz -9 $W/b1*.csv 2>/dev/null; rm -f $W/b1.nsys-rep $W/b1.sqlite
fi
echo "all done at $(( $(date +%s) - T0 )) s"
cp .device/s8-call1.sh $W/
tar -czf $OUT/s8c1.tar.gz -C /tmp s8c1
