#!/usr/bin/env bash
# gpu-profile.sh: where a GPU step's time goes. Builds the CUDA benchmark
# (make CUDA=1, with the device kit where the machine needs it: see
# tools/gpu-check.sh), times the training and decode benchmarks plainly, then
# once more with TOY_CUDA_PROFILE=N: every node timed on its own (launch and
# kernels, synchronised) and, per run, the time per op kind and the N
# slowest nodes with their shapes; decode unfused (TOY_FUSE=0) to compare;
# then single ops (bench-cuda op: the
# output layer's products, attention). Everything goes to one log,
# $OUT/gpu-profile.txt (or build-cuda/gpu-profile.txt), and the plain
# figures to stdout. The whole script keeps to GPU_PROFILE_SECONDS (300).
#   bash tools/gpu-profile.sh
set -uo pipefail
cd "$(dirname "$0")/.."
L=${OUT:-build-cuda}/gpu-profile.txt
mkdir -p "$(dirname "$L")"
T_END=$(( $(date +%s) + ${GPU_PROFILE_SECONDS:-300} ))
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
30|decode smollm2-135m q8_0 40 cuda:0|decode smollm2-135m q8_0 4 cuda:0
30|decode gpt2-124m bf16 40 cuda:0|decode gpt2-124m bf16 4 cuda:0
30|decode gpt2-124m q4_k 40 cuda:0|decode gpt2-124m q4_k 4 cuda:0
60|decode llama-1b q8_0 40 cuda:0|decode llama-1b q8_0 4 cuda:0
RUNS
# decode with the graph left unfused (TOY_FUSE=0: every norm, SwiGLU,
# GELU, add, ROPE and KV store its own kernel), against the fused runs above
for mw in "smollm2-135m bf16" "smollm2-135m q8_0" "gpt2-124m bf16"; do
  echo "== decode $mw 40 cuda:0, unfused (TOY_FUSE=0)" | tee -a "$L"
  TOY_FUSE=0 timeout "$(lim 30)" $B decode $mw 40 cuda:0 | tee -a "$L"
done
# single ops under BF16 math: the output layer's product at GPT-2's odd
# vocabulary (C through padded scratch, and once without) and padded to a
# multiple of 8, SmolLM2's, a block's product,
# and attention at both models' shapes (the one-pass tensor-core forward,
# dQ from the stored dS; then GPT-2's with the two-pass one, the SIMT
# kernels and the mma.sync forward, and both with dQ recomputing dS)
echo "== single ops (bench-cuda op)" | tee -a "$L"
while read -r args; do
  TOY_CUDA_MATH=bf16 timeout "$(lim 30)" $B op $args 2>&1 | tee -a "$L"
done <<'OPS'
matmul 16384 50257 768
matmul 16384 50264 768
matmul 16384 49152 576
matmul 16384 2304 768
attention 16 12 12 1024 64
attention 16 9 3 1024 64
OPS
echo "== matmul 16384 50257 768, TOY_CUDA_PAD_C=0 (C's odd rows straight to cuBLAS)" | tee -a "$L"
TOY_CUDA_MATH=bf16 TOY_CUDA_PAD_C=0 timeout "$(lim 30)" $B op matmul 16384 50257 768 2>&1 | tee -a "$L"
for mode in twopass simt mma; do
  echo "== attention 16 12 12 1024 64, TOY_CUDA_ATTN=$mode" | tee -a "$L"
  TOY_CUDA_MATH=bf16 TOY_CUDA_ATTN=$mode timeout "$(lim 30)" $B op attention 16 12 12 1024 64 2>&1 | tee -a "$L"
done
# the mma.sync kernels (forward, dK/dV) at SmolLM2's shape too: if they beat
# the wmma ones above, they should become the default
echo "== attention 16 9 3 1024 64, TOY_CUDA_ATTN=mma" | tee -a "$L"
TOY_CUDA_MATH=bf16 TOY_CUDA_ATTN=mma timeout "$(lim 30)" $B op attention 16 9 3 1024 64 2>&1 | tee -a "$L"
# the backward's dQ computing the scores again instead of reading the dS
# that dK/dV stored (the default above)
for args in "16 12 12 1024 64" "16 9 3 1024 64"; do
  echo "== attention $args, TOY_CUDA_ATTN_DS_MB=0 (dQ recomputes dS)" | tee -a "$L"
  TOY_CUDA_MATH=bf16 TOY_CUDA_ATTN_DS_MB=0 timeout "$(lim 30)" $B op attention $args 2>&1 | tee -a "$L"
done
grep -E "^== |^cuda:0 profile|^  [A-Z_]+ " "$L" | head -80
