#!/usr/bin/env bash
# session 10, call 9: first GPU run of bench/cuda-pick-search.sh (each one-row shape's candidates measured as
# picks in the whole B=1 decode) for o, down and lm_head
set -u
source .device/env.sh 2>/dev/null
SHAPES="1x4096x4096 1x4096x14336 1x128256x4096" timeout 400 bash bench/cuda-pick-search.sh "$1/ps"
echo "rc $?"
