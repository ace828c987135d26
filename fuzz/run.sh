#!/usr/bin/env bash
# fuzz/run.sh SECONDS: a bounded libFuzzer run for CI: the GGUF parser/writer
# (two shares of the time), then one share each for the safetensors parser,
# the tokenizer, chat templates (fuzz-jinja), image sets (fuzz-images),
# training data (fuzz-data: TOYT, loader state, SFT JSONL) and model replies
# (fuzz-chat-reply: reasoning, content and tool calls split as they stream),
# and response_format schemas with replies fed through them (fuzz-json-grammar). Seeds: the
# third-party GGUF test vectors and chat templates (if ../shared/testdata is
# there), small files written by toy itself (make-seeds, jinja-seeds.py,
# data-seeds.py), and earlier crash inputs. A crashing input is copied to
# tests/data/<kind>-crashes/ (replayed by test-gguf.c, test-hf-import.c,
# test-chat-template.c and test-vit.c) and the script exits 1. Run from the
# repository root. Renders and loads must also stay within -timeout and
# -malloc_limit_mb: a hang or a huge allocation counts as a crash. A failed
# run ends by naming the harness, libFuzzer's reason and the input in base64
# (up to 16 KiB), so the last lines of a CI log are enough to replay it:
#   base64 -d > crash; build-fuzz/fuzz-KIND crash
set -euo pipefail
secs=${1:-60}
cd "$(dirname "$0")/.."
make -s -f fuzz/Makefile
work=fuzz/corpus-work
kinds="gguf safetensors tokenizer jinja images data chat-reply json-grammar"
for kind in $kinds; do mkdir -p "$work/$kind"; done
mkdir -p "$work/artifacts"
build-fuzz/make-seeds "$work/gguf" "$work/safetensors"
if command -v python3 >/dev/null; then
    python3 fuzz/jinja-seeds.py "$work/jinja" ../shared/testdata/tokenizer-llama3/tokenizer_config.json \
        ../shared/testdata/llamacpp-vocab-gguf/expected_metadata.json >/dev/null
    python3 fuzz/data-seeds.py "$work/images" "$work/data" >/dev/null
fi
# replies of each family (first byte: family | think 8 | in_think 16 | tools 32)
printf '\x29<think>plan</think>ok <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>' > "$work/chat-reply/hermes"
printf '\x22<|python_tag|>{"name": "f", "parameters": {}}; {"name": "get_weather", "parameters": {"city": "x"}}' \
    > "$work/chat-reply/llama3"
printf '\x23[TOOL_CALLS]f[ARGS]{"a": [1, 2]}[TOOL_CALLS]get_weather[CALL_ID]9[ARGS]{}' > "$work/chat-reply/mistral"
printf '\x25<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a":1}<|call|>' \
    > "$work/chat-reply/harmony"
# schemas, a NUL, then a reply
printf '{"type":"object","properties":{"a":{"type":"array","items":{"enum":[1,"x",null]},"maxItems":2},"b":{"anyOf":[{"type":"string","maxLength":3},{"type":"integer"}]}},"required":["a"]}\0{"a": [1, "x"], "b": "ab"}' \
    > "$work/json-grammar/object"
printf '{"$defs":{"t":{"type":"object","properties":{"k":{"type":"array","items":{"$ref":"#/$defs/t"}}}}},"$ref":"#/$defs/t"}\0{"k":[{"k":[]}]}' \
    > "$work/json-grammar/recursive"
printf '{"x": [1.5e-3, true, {"y": "\\u00e9"}]}' > "$work/json-grammar/any"
printf ' {"type":"object","properties":{"city":{"type":"string"}}}\0<tool_call>\n{"city": "x"}\n</tool_call>' \
    > "$work/json-grammar/framed"
printf '!{"anyOf":[{"type":"object","properties":{"k":{"const":"a"},"v":{"type":"integer"}}},{"type":"object","properties":{"k":{"const":"b"},"w":{"type":"string"}}}]}\0<think>hm</think>\n<ab>{"k": "b", "w": "x"};' \
    > "$work/json-grammar/forms"
for f in ../shared/testdata/gguf-testvectors/valid/*.gguf; do
    [ -f "$f" ] || continue
    [ "$(stat -c %s "$f")" -le 65536 ] && cp -f "$f" "$work/gguf/"
done
for kind in $kinds; do
    if [ -d "tests/data/$kind-crashes" ]; then cp -f "tests/data/$kind-crashes"/* "$work/$kind/" 2>/dev/null || true; fi
done
status=0
failed=""
report=$(mktemp)
trap 'rm -f "$report" "$report.log"' EXIT
run() { # kind seconds [libFuzzer flags]
    rm -f "$work"/artifacts/*
    local st=0
    "build-fuzz/fuzz-$1" "$work/$1" -max_total_time="$2" -max_len=65536 -timeout=10 \
        -rss_limit_mb=2048 -malloc_limit_mb=256 -artifact_prefix="$work/artifacts/" -print_final_stats=1 "${@:3}" \
        2>&1 | tee "$report.log" || st=$?
    local found=0
    for a in "$work"/artifacts/*; do
        [ -f "$a" ] || continue
        mkdir -p "tests/data/$1-crashes"
        cp "$a" "tests/data/$1-crashes/$(basename "$a")"
        echo "fuzz: kept $(basename "$a") in tests/data/$1-crashes/"
        {
            echo "== fuzz-$1: $(basename "$a") ($(stat -c %s "$a") bytes)"
            grep -aE '^==[0-9]+==( ERROR|WARNING: MemorySanitizer)|^SUMMARY:|runtime error:|ERROR: libFuzzer|out-of-memory|Timeout|deadly signal' \
                "$report.log" | head -8
            if [ "$(stat -c %s "$a")" -le 16384 ]; then echo "input (base64):"; base64 -w 76 "$a"; fi
        } >> "$report"
        found=1
    done
    if [ "$found" = 1 ] || [ "$st" != 0 ]; then
        echo "fuzz-$1: FAILED (status $st)"
        [ "$found" = 1 ] || { echo "== fuzz-$1: status $st and no input kept"; tail -5 "$report.log"; } >> "$report"
        failed="$failed $1"
        status=1
    else
        echo "fuzz-$1: ok, no crash in ${2}s"
    fi
}
share=$(( secs / 9 > 0 ? secs / 9 : 1 ))
run gguf $(( secs - 7 * share > 0 ? secs - 7 * share : 1 ))
run safetensors "$share"
run tokenizer "$share"
run jinja "$share" -dict=fuzz/jinja.dict -max_len=16384
run images "$share"
run data "$share"
run chat-reply "$share" -dict=fuzz/chat-reply.dict
run json-grammar "$share" -max_len=4096
if [ "$status" != 0 ]; then
    echo "---- fuzz: what failed:$failed ----"
    cat "$report"
fi
exit $status
