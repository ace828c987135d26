#!/usr/bin/env bash
# gpu-check.sh: the one script a session with an NVIDIA GPU runs for the
# CUDA backend (docs/cuda.md): build with CUDA=1, list the devices, run the
# CUDA tests (tests/test-cuda.c: every op, a Llama's logits, KV decode and
# 20 training steps against the CPU), a CLI check, then the benchmarks
# against PyTorch and a table of them against the issue's targets
# (bench/cuda_report.py). Every step has its own time limit, and the whole
# script one more (GPU_CHECK_SECONDS, default 480): a step starts with what is
# left of it, so the script ends inside a device call's limit. `quick` skips
# torch.compile. Results go to build-cuda/gpu-check/; where $OUT is set (the
# device runner's folder, which gives back at most 8 files) they are also
# packed into $OUT/gpu-check.tar.gz after every step, so a call cut short
# still brings back what was done.
#   bash tools/gpu-check.sh [quick]     # quick: no torch.compile runs
#   bash tools/gpu-check.sh emu         # a rehearsal without a GPU: the same steps on
#                                       # the CPU emulator (make CUDA_EMU=1), tiny benchmarks
set -uo pipefail
cd "$(dirname "$0")/.."
# X: the time limits' factor (emulated kernels are slow)
if [ "${1:-}" = emu ]; then MODE=CUDA_EMU=1; BLD=build-cuda-emu; X=6; else MODE=CUDA=1; BLD=build-cuda; X=1; fi
R=$BLD/gpu-check
rm -rf "$R"; mkdir -p "$R"
T_END=$(( $(date +%s) + ${GPU_CHECK_SECONDS:-480} * X ))
export T_END # bench/bench-cuda.sh keeps to it too
# lim N: N seconds, or what is left of the whole script's time if less
lim() { local l=$(( T_END - $(date +%s) )); [ $l -lt 1 ] && l=1; [ "$1" -lt $l ] && l=$1; echo $l; }
pack() { [ -n "${OUT:-}" ] && tar czf "$OUT/gpu-check.tar.gz" --exclude='*.gguf' -C "$BLD" gpu-check 2>/dev/null; return 0; }
# a GPU machine's bare image: the packages carried from a machine that has
# them (.devkit/kit.tar.gz, tools/device-kit.sh pack), CUDA_HOME from its
# nvcc, cuBLAS and NCCL from PyTorch's wheels where the toolkit lacks them
if [ "$BLD" = build-cuda ]; then
  # shellcheck source=tools/device-kit.sh
  source tools/device-kit.sh env > "$R/kit.txt" 2>&1
  rc=$?; cat "$R/kit.txt"; [ $rc -eq 0 ] || exit 1
fi
step() { pack; echo; echo "== $* ($(date +%T), $(lim 99999) s left)"; }
step "GPU"
if [ "$BLD" = build-cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv 2>&1 | tee "$R/gpu.txt"
else
  echo "none: the CPU emulator (tools/cuda-emu/) stands in for it" | tee "$R/gpu.txt"
fi
step "build (make $MODE)"
{ time timeout "$(lim 400)" make "$MODE" -j"$(nproc)" all $BLD/toy-tests $BLD/bench/bench-cuda; } > "$R/build.txt" 2>&1
rc=$?; tail -5 "$R/build.txt"
if [ $rc -ne 0 ]; then grep -E "error|Error" "$R/build.txt" | head -20; echo "build failed (see $R/build.txt)"; pack; exit 1; fi
step "toy devices"
./$BLD/toy devices | tee "$R/devices.txt"
step "CUDA tests"
TOY_REFS=$BLD/refs TOY_BIN=$BLD/toy timeout $(lim $((180 * X))) ./$BLD/toy-tests --filter 'cuda/*' --verbose -j1 \
  > "$R/test-cuda.txt" 2>&1
echo "exit $?"; grep -E "Synthesis|FAIL|fail|differs|skip|max rel|AdamW|decode" "$R/test-cuda.txt" | head -60
step "attention: the untiled reference kernels too"
TOY_CUDA_ATTN=simple timeout $(lim $((60 * X))) ./$BLD/toy-tests --filter 'cuda/attention*' -j1 > "$R/test-cuda-attn-simple.txt" 2>&1
echo "simple attention: $(grep Synthesis "$R/test-cuda-attn-simple.txt")"
TOY_CUDA_ATTN=twopass timeout $(lim $((60 * X))) ./$BLD/toy-tests --filter 'cuda/attention_bf16*' -j1 > "$R/test-cuda-attn-twopass.txt" 2>&1
echo "two-pass tensor-core forward: $(grep Synthesis "$R/test-cuda-attn-twopass.txt")"
step "decode without CUDA graph capture (TOY_CUDA_GRAPH=0) too"
TOY_CUDA_GRAPH=0 timeout $(lim $((60 * X))) ./$BLD/toy-tests --filter 'cuda/*decode*' -j1 > "$R/test-cuda-nograph.txt" 2>&1
echo "uncaptured decode: $(grep Synthesis "$R/test-cuda-nograph.txt")"
step "training with the optimizer on the host too (TOY_CUDA_OPTIM=0: parameters up, gradients down every step)"
TOY_CUDA_OPTIM=0 timeout $(lim $((60 * X))) ./$BLD/toy-tests --filter 'cuda/llama_training*' -j1 > "$R/test-cuda-host-optim.txt" 2>&1
echo "host optimizer: $(grep Synthesis "$R/test-cuda-host-optim.txt")"
step "TF32 and BF16 GEMM modes (looser: the bounds are F32's, failures here are expected and informative)"
for m in tf32 bf16; do
  TOY_CUDA_MATH=$m timeout $(lim $((60 * X))) ./$BLD/toy-tests --filter 'cuda/llama_*' -j1 > "$R/test-cuda-$m.txt" 2>&1
  echo "$m: $(grep Synthesis "$R/test-cuda-$m.txt")"
done
step "CLI: toy generate --device cuda on the test-data model"
TD="../shared/testdata shared/testdata .devkit/testdata" # the last: carried with the kit
M=$(for d in $TD; do ls $d/model-gguf-llama2-tiny-random/*.gguf; done 2>/dev/null | head -1)
if [ -n "$M" ]; then
  timeout $(lim $((60 * X))) ./$BLD/toy generate -m "$M" -p "Hello" -n 16 --temp 0 --device cuda 2>&1 | tail -3 | tee "$R/generate-cuda.txt"
  timeout $(lim $((60 * X))) ./$BLD/toy generate -m "$M" -p "Hello" -n 16 --temp 0 2>&1 | tail -3 | tee "$R/generate-cpu.txt"
fi
timeout $(lim $((10 * X))) ./$BLD/toy generate -m x --device cuda:99; echo "missing device exit code: $? (want 1)"
step "CLI: 30 training steps, cuda vs cpu (same losses expected to ~1e-4)"
D=$(for d in $TD; do ls $d/corpus-tinyshakespeare/input.txt; done 2>/dev/null | head -1)
if [ -n "$D" ]; then
  for dev in cuda cpu; do
    timeout $(lim $((60 * X))) ./$BLD/toy train --device $dev --data "$D" --steps 30 --batch 4 --ctx 32 --eval-every 15 \
      --eval-batches 2 --runs "$R/runs" --sample "ROMEO:" --sample-tokens 16 --threads 1 2>&1 | tee "$R/train-$dev.txt" | grep -E "^step|completed"
  done
fi
step "benchmarks (toy vs PyTorch)"
if [ "$BLD" = build-cuda ]; then
  TOY_BUILD=build-cuda timeout $(lim $((300 * X))) bash bench/bench-cuda.sh "${1:-}" | tee "$R/bench-cuda.jsonl"
else # the harness only: emulated kernels are far too slow for the real shapes
  { timeout $(lim $((120 * X))) ./$BLD/bench/bench-cuda decode smollm2-135m q8_0 3 cuda:0
    timeout $(lim $((300 * X))) ./$BLD/bench/bench-cuda train smollm2-135m 1 8 1 cuda:0 bf16; } | tee "$R/bench-cuda.jsonl"
fi
step "report (the issue's targets; bench/cuda_report.py)"
python3 bench/cuda_report.py "$R/bench-cuda.jsonl" | tee "$R/bench-cuda-report.txt"
CS=$(command -v compute-sanitizer || ls "${CUDA_HOME:-/usr/local/cuda}"/{bin,compute-sanitizer}/compute-sanitizer 2>/dev/null | head -1)
if [ "$BLD" = build-cuda ] && [ -n "$CS" ]; then
  step "compute-sanitizer (memcheck, then racecheck) over the CUDA tests, in what time is left"
  for tool in memcheck racecheck; do
    [ "$(lim 99999)" -lt 20 ] && { echo "$tool: no time left"; continue; }
    timeout "$(lim 150)" "$CS" --tool $tool --target-processes all --error-exitcode 9 \
      ./$BLD/toy-tests --filter 'cuda/*' -j1 > "$R/sanitizer-$tool.txt" 2>&1
    echo "$tool: exit $? $(grep -E "Synthesis|ERROR SUMMARY" "$R/sanitizer-$tool.txt" | sort | uniq -c | tr '\n' ' ')"
  done
fi
step "done"
pack
