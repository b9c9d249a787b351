#!/usr/bin/env bash
# session 13, call 5: every CUDA test on a cold cache with the attention's trigger after its splits (the
# new default) and o's 1.2 margin; cuda-decode-ab's default variants with a server's table at 512 and 4096
set -u
source bench/cuda-device-lib.sh
call_start s13c5 "$1"
cold_tests "$W/cuda-tests.txt" 220
call_wait_model
MAX_MODEL_LEN=32768 timeout 280 bash bench/cuda-decode-ab.sh "$W/ab"
call_finish
