#!/usr/bin/env bash
# bench-cuda.sh: toy on the GPU next to PyTorch (eager and torch.compile) on
# the same shapes: training tokens/s and MFU for GPT-2 124M and SmolLM2-135M
# in BF16 (B 16, T 1024), decode tokens/s for SmolLM2-135M and a 1B-class
# Llama. One JSON line per run (bench/bench-cuda.c, bench/torch_cuda.py).
# Each run has its own time limit so the whole script stays under ~6 min.
#   TOY_BUILD=build-cuda bash bench/bench-cuda.sh [quick]
set -uo pipefail
cd "$(dirname "$0")/.."
B=${TOY_BUILD:-build-cuda}
PY=${PY:-python3}
BIN="$B/bench/bench-cuda"
STEPS=${STEPS:-5}
# run LIMIT CMD...: with T_END set (tools/gpu-check.sh: the epoch second its
# whole run must end by), no run goes past it, and one with under 5 s left
# is skipped
run() {
  local lim=$1; shift
  if [ -n "${T_END:-}" ]; then
    local left=$(( T_END - $(date +%s) ))
    if [ $left -lt 5 ]; then echo "{\"skipped\":\"$*\",\"why\":\"out of time\"}"; return; fi
    [ $left -lt "$lim" ] && lim=$left
  fi
  timeout "$lim" "$@" || echo "{\"failed\":\"$*\",\"rc\":$?}"
}
have_torch() { "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

for model in gpt2-124m smollm2-135m; do
  run 120 "$BIN" train "$model" 16 1024 "$STEPS" cuda:0 bf16
  if have_torch; then
    run 60 "$PY" bench/torch_cuda.py train "$model" 16 1024 10 eager
    [ "${1:-}" = quick ] || run 180 "$PY" bench/torch_cuda.py train "$model" 16 1024 10 compile
  fi
done
for w in bf16 q8_0; do run 60 "$BIN" decode smollm2-135m "$w" 130 cuda:0; done
for w in bf16 q8_0; do run 90 "$BIN" decode llama-1b "$w" 66 cuda:0; done
if have_torch; then
  run 60 "$PY" bench/torch_cuda.py decode smollm2-135m bf16 130
  run 60 "$PY" bench/torch_cuda.py decode llama-1b bf16 66
fi
# last (the first run a time limit cuts): GPT-2's step with the F32 SIMT
# attention kernels instead of the tensor-core ones, what tensor cores gain
TOY_CUDA_ATTN=simt run 120 "$BIN" train gpt2-124m 16 1024 "$STEPS" cuda:0 bf16
