#!/usr/bin/env bash
# fuzz/run.sh SECONDS: a bounded libFuzzer run for CI: the GGUF parser/writer
# (half the time), the safetensors parser and the tokenizer (a quarter each).
# Seeds: the third-party GGUF test vectors (if ../shared/testdata is there),
# small files written by toy itself, and earlier crash inputs. A crashing
# input is copied to tests/data/{gguf,safetensors,tokenizer}-crashes/ (the
# first two replayed by test-gguf.c / test-hf-import.c) and the script exits
# 1. Run from the repository root.
set -euo pipefail
secs=${1:-60}
cd "$(dirname "$0")/.."
make -s -f fuzz/Makefile
work=fuzz/corpus-work
mkdir -p "$work/gguf" "$work/safetensors" "$work/tokenizer" "$work/artifacts"
build-fuzz/make-seeds "$work/gguf" "$work/safetensors"
for f in ../shared/testdata/gguf-testvectors/valid/*.gguf; do
    [ -f "$f" ] || continue
    [ "$(stat -c %s "$f")" -le 65536 ] && cp -f "$f" "$work/gguf/"
done
for kind in gguf safetensors tokenizer; do
    if [ -d "tests/data/$kind-crashes" ]; then cp -f "tests/data/$kind-crashes"/* "$work/$kind/" 2>/dev/null || true; fi
done
status=0
run() { # kind seconds
    rm -f "$work"/artifacts/*
    local st=0
    "build-fuzz/fuzz-$1" "$work/$1" -max_total_time="$2" -max_len=65536 -timeout=10 \
        -rss_limit_mb=2048 -malloc_limit_mb=256 -artifact_prefix="$work/artifacts/" -print_final_stats=1 || st=$?
    local found=0
    for a in "$work"/artifacts/*; do
        [ -f "$a" ] || continue
        mkdir -p "tests/data/$1-crashes"
        cp "$a" "tests/data/$1-crashes/$(basename "$a")"
        echo "fuzz: kept $(basename "$a") in tests/data/$1-crashes/"
        found=1
    done
    if [ "$found" = 1 ] || [ "$st" != 0 ]; then
        echo "fuzz-$1: FAILED (status $st)"
        status=1
    else
        echo "fuzz-$1: ok, no crash in ${2}s"
    fi
}
quarter=$(( secs / 4 > 0 ? secs / 4 : 1 ))
run gguf $(( secs - 2 * quarter > 0 ? secs - 2 * quarter : 1 ))
run safetensors "$quarter"
run tokenizer "$quarter"
exit $status
