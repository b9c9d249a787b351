#!/usr/bin/env bash
# session 14, call 5: the Llama-3.1-8B record on this tree (commit 004b95e): same-run ceilings, launch to
# ready, B=1 decode against copy bandwidth, TTFT / prefill MFU at 1k and 8k, transformers eager and
# static cache + torch.compile (bench/cuda-llama8b.sh)
set -u
source bench/cuda-device-lib.sh
call_start s14c5 "$1"
call_wait_model
LLMTS_COMMIT=004b95e PEER_COMPILE=1 BUDGET_S=400 bash bench/cuda-llama8b.sh "$W/l8"
call_finish
