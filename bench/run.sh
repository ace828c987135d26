#!/bin/bash
# bench/run.sh: the benchmarks `make bench` runs, one line each. Each prints
# its figures as a ratio to a peer measured or recorded alongside.
set -u
B=${TOY_BUILD:-build}
TD=${TOY_TESTDATA:-../shared/testdata}
status=0
PY=${PY:-/usr/bin/python3}
NTH=${TOY_THREADS:-2}
# The PyTorch peers run on the same OpenBLAS kernels as toy: where OpenBLAS
# falls back to its generic ones on a CPU it does not know, toy picks the
# CPU's (src/backends/cpu/blas.c) and so must the peer, else the ratios
# would measure that fallback (4.5x in SGEMM on an Emerald Rapids Xeon).
# An OPENBLAS_CORETYPE of the environment holds for both. Where it names
# older kernels than the CPU has, toy's f32 products run on its own AVX-512
# SGEMM (the machine line says so) and PyTorch's on those kernels.
blas=$("$B/toy" devices --json | "$PY" -c 'import json, sys
d = json.load(sys.stdin); print(d["f32_gemm"], d["bf16_gemm"], d["blas_core"], d["blas_note"] or "OpenBLAS'"'"'s own choice", sep="|")')
f32=${blas%%|*} blas=${blas#*|}
bf16=${blas%%|*} blas=${blas#*|}
[ -n "${OPENBLAS_CORETYPE:-}" ] && blas="${blas%%|*}|OPENBLAS_CORETYPE set by the environment"
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-${blas%%|*}}
# CPU and BLAS line, so figures can be compared across machines
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores," \
     "$(grep -o -w -E 'avx512f|avx512_bf16|avx512_vnni|avx2|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')," \
     "OpenBLAS $OPENBLAS_CORETYPE for toy and PyTorch (${blas#*|}), toy's f32 products: $f32, bf16: $bf16"
# engine vs BLAS and vs PyTorch (same shapes, same threads, same script)
{ "$B/bench/bench-engine" "$NTH"; OMP_WAIT_POLICY=passive "$PY" bench/torch_ops.py "$NTH"; } \
  | "$PY" bench/report.py "$B/bench-results.json" || status=1
# Llama training step (S and M shapes, and E: a mixture of experts) and
# inference (M) against PyTorch,
# toy and PyTorch alternating for $TOY_BENCH_ROUNDS rounds (default 3), the
# best of each: a VM's speed can swing by a quarter within minutes, and a
# peer measured in another phase than toy would make the ratio that swing
ROUNDS=${TOY_BENCH_ROUNDS:-3}
for spec in "S train" "M train" "E train" "M infer"; do
  set -- $spec
  for ((round = 0; round < ROUNDS; round++)); do
    "$B/bench/bench-llama" "$NTH" "$1" "$2"
    OMP_WAIT_POLICY=passive "$PY" bench/torch_llama.py "$NTH" "$1" "$2"
  done | "$PY" bench/report.py "$B/bench-llama-$1-$2.json" || status=1
done
# BF16 mixed precision against F32: 200 steps on real text, same seed
bash bench/bf16_curve.sh || status=1
# scaling: S step time against T, M decode against context length
"$B/bench/bench-llama" "$NTH" S scale || status=1
# decode's products against loads alone over the same weights and nodes, and
# those loads against the same loads in one run (the phases of the machine
# cancel: the three alternate pass by pass)
out=$("$B/bench/bench-llama" "$NTH" M stream) || status=1
grep '^{' <<<"$out" > "$B/bench-llama-M-stream.json"
grep -v '^{' <<<"$out"
# speculative decoding (prompt lookup, and a draft model: M's own first layers) against plain decode, same run
out=$("$B/bench/bench-llama" "$NTH" M lookup) || status=1
grep '^{' <<<"$out" > "$B/bench-llama-M-lookup.json"
grep -v '^{' <<<"$out"
# prefill and decode of the same GGUF files against llama.cpp (npm node-llama-cpp)
bash bench/llama_cpp.sh || status=1
# GPT-2 124M training step (B 4, T 64) and ViT-Tiny/16 training images/s against PyTorch
for which in gpt2 vit; do
  "$B/bench/bench-gpt2-vit" "$NTH" "$which" | OMP_WAIT_POLICY=passive "$PY" bench/torch_gpt2_vit.py "$NTH" "$which" || status=1
done
# BERT-base embedding model (bge-base's shape): a query and a batch of passages encoded, against PyTorch
"$B/bench/bench-bert" "$NTH" | OMP_WAIT_POLICY=passive "$PY" bench/torch_bert.py "$NTH" || status=1
# LoRA / QLoRA step on the SmolLM2-135M shape against PyTorch's same-math step
"$B/bench/bench-finetune" "$NTH" | OMP_WAIT_POLICY=passive "$PY" bench/torch_lora.py "$NTH" || status=1
[ -x "$B/bench/bench-blas" ] && { "$B/bench/bench-blas" "$NTH" || status=1; }
"$B/bench/bench-tokenizer" "$TD" 3 || status=1
# GGUF open (mmap vs read) and write, quantize/dequantize GB/s vs memcpy
"$B/bench/bench-gguf" 500 || status=1
exit $status
