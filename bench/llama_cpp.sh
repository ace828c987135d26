#!/bin/bash
# bench/llama_cpp.sh: toy against llama.cpp's CPU kernels on the same GGUF
# files: the SmolLM2-135M shape (random weights, SmolLM2's tokenizer) in
# F32, F16, Q8_0 and Q4_0, prefill of 256 tokens and greedy decode, at 1 and 2
# threads, its width-512 twin in Q4_K, Q3_K, Q2_K and IQ4_XS at 2, and a
# mixture of experts of that width (12 layers of 32 experts, 4 a token) in
# Q8_0 and Q4_0 at 2, with the decode bound (the larger of triad and read
# GB/s, over the weight bytes a token reads: 4 of the 32 experts)
# measured in the same run. llama.cpp comes from the npm package
# node-llama-cpp (prebuilt CPU builds, incl. Zen 4), installed once into
# $B/node. Prints one line per file and thread count; JSON to $B/bench-llama-cpp.json.
set -u
B=${TOY_BUILD:-build}
TD=${TOY_TESTDATA:-../shared/testdata}
PY=${PY:-/usr/bin/python3}
NLC_VERSION=3.21.1
dir=$B/bench-gguf
mkdir -p "$dir"
if [ ! -f "$TD/tokenizer-smollm2/tokenizer.json" ]; then
  echo "llama.cpp: skipped (needs $TD/tokenizer-smollm2 for a loadable 49152-token vocabulary)"
  exit 0
fi
if [ ! -f "$B/node/node_modules/node-llama-cpp/package.json" ]; then
  command -v npm >/dev/null || { echo "llama.cpp: skipped (npm is not installed)"; exit 0; }
  mkdir -p "$B/node"
  (cd "$B/node" && npm install --silent --no-audit --no-fund "node-llama-cpp@$NLC_VERSION" >/dev/null 2>&1) ||
    { echo "llama.cpp: skipped (npm install node-llama-cpp@$NLC_VERSION failed)"; exit 0; }
fi
cp bench/llama_cpp.mjs "$B/node/llama_cpp.mjs"
[ -f "$dir/m-f32.gguf" ] || "$B/bench/bench-llama" 0 M gguf "$dir/m-f32.gguf" "$TD/tokenizer-smollm2" || exit 1
for t in f16 q8_0 q4_0; do
  if [ ! -f "$dir/m-$t.gguf" ]; then
    log=$("$B/toy" quantize "$dir/m-f32.gguf" "$dir/m-$t.gguf" "$t" 2>&1) || { echo "$log"; exit 1; }
  fi
done
[ -f "$dir/k-f32.gguf" ] || "$B/bench/bench-llama" 0 K gguf "$dir/k-f32.gguf" "$TD/tokenizer-smollm2" || exit 1
if [ ! -f "$dir/e-q4_0.gguf" ]; then
  "$B/bench/bench-llama" 0 E gguf "$dir/e-f32.gguf" "$TD/tokenizer-smollm2" || exit 1
  for t in q8_0 q4_0; do
    log=$("$B/toy" quantize "$dir/e-f32.gguf" "$dir/e-$t.gguf" "$t" 2>&1) || { echo "$log"; exit 1; }
  done
  rm -f "$dir/e-f32.gguf" # 1.3 GB, only the source of those two
fi
for t in q4_k q3_k q2_k iq4_xs; do
  if [ ! -f "$dir/k-$t.gguf" ]; then
    log=$("$B/toy" quantize "$dir/k-f32.gguf" "$dir/k-$t.gguf" "$t" 2>&1) || { echo "$log"; exit 1; }
  fi
done
{
  for t in f32 f16 q8_0 q4_0; do
    for th in 1 2; do
      "$B/bench/bench-llama" "$th" M file "$dir/m-$t.gguf"
      UV_THREADPOOL_SIZE=1 node "$B/node/llama_cpp.mjs" "$(realpath "$dir/m-$t.gguf")" "$th" | sed "s/{/{\"dtype\":\"$t\",/"
    done
  done
  # the k-quants and iq4_xs on the K shape (M at width 512: rows whole
  # super-blocks), files written by toy quantize, 2 threads
  for t in q4_k q3_k q2_k iq4_xs; do
    "$B/bench/bench-llama" 2 M file "$dir/k-$t.gguf"
    UV_THREADPOOL_SIZE=1 node "$B/node/llama_cpp.mjs" "$(realpath "$dir/k-$t.gguf")" 2 | sed "s/{/{\"dtype\":\"$t\",/"
  done
  # a mixture of experts (the E shape: 32 experts, 4 a token), 2 threads
  for t in q8_0 q4_0; do
    "$B/bench/bench-llama" 2 M file "$dir/e-$t.gguf" | sed "s/\"dtype\":\"$t\"/\"dtype\":\"moe-$t\"/"
    UV_THREADPOOL_SIZE=1 node "$B/node/llama_cpp.mjs" "$(realpath "$dir/e-$t.gguf")" 2 | sed "s/{/{\"dtype\":\"moe-$t\",/"
  done
} | "$PY" bench/llama_cpp_report.py "$B/bench-llama-cpp.json"
