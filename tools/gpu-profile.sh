#!/usr/bin/env bash
# gpu-profile.sh: where a GPU step's time goes. Builds the CUDA benchmark
# (make CUDA=1, with the device kit where the machine needs it: see
# tools/gpu-check.sh), times the training and decode benchmarks plainly, then
# once more with TOY_CUDA_PROFILE=N: every node timed on its own (launch and
# kernels, synchronised) and, per run, the time per op kind and the N
# slowest nodes with their shapes. Everything goes to one log,
# $OUT/gpu-profile.txt (or build-cuda/gpu-profile.txt), and the plain
# figures to stdout. The whole script keeps to GPU_PROFILE_SECONDS (240).
#   bash tools/gpu-profile.sh
set -uo pipefail
cd "$(dirname "$0")/.."
L=${OUT:-build-cuda}/gpu-profile.txt
mkdir -p "$(dirname "$L")"
T_END=$(( $(date +%s) + ${GPU_PROFILE_SECONDS:-240} ))
lim() { local l=$(( T_END - $(date +%s) )); [ $l -lt 1 ] && l=1; [ "$1" -lt $l ] && l=$1; echo $l; }
if [ -f .devkit/kit.tar.gz ]; then
  # shellcheck source=tools/device-kit.sh
  source tools/device-kit.sh env >> "$L" 2>&1 || { cat "$L"; exit 1; }
fi
{ time timeout "$(lim 200)" make CUDA=1 -j"$(nproc)" build-cuda/bench/bench-cuda; } >> "$L" 2>&1 ||
  { tail -20 "$L"; echo "build failed"; exit 1; }
B=./build-cuda/bench/bench-cuda
# each: LIMIT | plain run | profiled run (fewer steps: each run prints)
while IFS='|' read -r lim plain prof; do
  echo "== $plain" | tee -a "$L"
  timeout "$(lim "$lim")" $B $plain | tee -a "$L"
  echo "== $prof, profiled" >> "$L"
  TOY_CUDA_PROFILE=${TOP:-30} timeout "$(lim "$lim")" $B $prof >> "$L" 2>&1
done <<'RUNS'
60|train gpt2-124m 16 1024 3 cuda:0 bf16|train gpt2-124m 16 1024 1 cuda:0 bf16
60|train smollm2-135m 16 1024 3 cuda:0 bf16|train smollm2-135m 16 1024 1 cuda:0 bf16
30|decode smollm2-135m bf16 40 cuda:0|decode smollm2-135m bf16 4 cuda:0
30|decode llama-1b q8_0 40 cuda:0|decode llama-1b q8_0 4 cuda:0
RUNS
grep -E "^== |^cuda:0 profile|^  [A-Z_]+ " "$L" | head -80
