#!/usr/bin/env bash
# fuzz/run.sh SECONDS: a bounded libFuzzer run of the GGUF parser for CI.
# Seeds: the third-party GGUF test vectors (if ../shared/testdata is there)
# and small files written by toy itself. Any crashing input is copied to
# tests/data/gguf-crashes/ (replayed by tests/test-gguf.c) and the script
# exits 1. Run from the repository root.
set -euo pipefail
secs=${1:-60}
cd "$(dirname "$0")/.."
make -s -f fuzz/Makefile
work=fuzz/corpus-work
mkdir -p "$work/corpus" "$work/artifacts"
build-fuzz/make-seeds "$work/corpus"
for f in ../shared/testdata/gguf-testvectors/valid/*.gguf; do
    [ -f "$f" ] || continue
    [ "$(stat -c %s "$f")" -le 65536 ] && cp -f "$f" "$work/corpus/"
done
if [ -d tests/data/gguf-crashes ]; then cp -f tests/data/gguf-crashes/* "$work/corpus/" 2>/dev/null || true; fi
rm -f "$work"/artifacts/*
status=0
build-fuzz/fuzz-gguf "$work/corpus" -max_total_time="$secs" -max_len=65536 -timeout=10 \
    -rss_limit_mb=2048 -artifact_prefix="$work/artifacts/" -print_final_stats=1 || status=$?
found=0
for a in "$work"/artifacts/*; do
    [ -f "$a" ] || continue
    mkdir -p tests/data/gguf-crashes
    cp "$a" "tests/data/gguf-crashes/$(basename "$a")"
    echo "fuzz: kept $(basename "$a") in tests/data/gguf-crashes/"
    found=1
done
if [ "$found" = 1 ] || [ "$status" != 0 ]; then
    echo "fuzz: FAILED (status $status)"
    exit 1
fi
echo "fuzz: ok, no crash in ${secs}s"
