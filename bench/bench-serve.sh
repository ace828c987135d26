#!/usr/bin/env bash
# bench-serve.sh: a bounded load test of `toy serve` on loopback.
#
# Starts the server on a free port, then for each concurrency level C runs
# C client loops (curl) that send REQUESTS requests in total, each asking
# for TOKENS tokens (ignore_eos, so every request does the same work), and
# reports: requests/s, aggregate generated tokens/s, p50/p99 request latency,
# 5xx count, and the server's mean decode batch (rows per decode step, from
# /metrics). Also a time-to-first-token check with and without a prefix-cache
# hit for a long prompt.
#
#   bench/bench-serve.sh -m model.gguf [-c "1 4 16"] [-n 64] [-t 64] [--parallel 16] [--threads N]
#                        [--temp 0.8] [--lookup N]
#
# --lookup N runs the server with prompt lookup and reports how many drafted
# tokens were kept; --temp 0 makes every request greedy (a random-weights
# model then loops, so every draft is kept: the upper end of what it gains).
#
# Environment: TOY_BIN (build/toy). Loopback only; everything is bounded by
# the request count and curl's --max-time.
set -euo pipefail

TOY_BIN=${TOY_BIN:-build/toy}
MODEL=""
CONC="1 4 16"
REQUESTS=64
TOKENS=64
PARALLEL=16
THREADS=0
PROMPT_TOKENS=512
TEMP=0.8
LOOKUP=0
while [ $# -gt 0 ]; do
    case "$1" in
    -m) MODEL=$2; shift 2 ;;
    -c) CONC=$2; shift 2 ;;
    -n) REQUESTS=$2; shift 2 ;;
    -t) TOKENS=$2; shift 2 ;;
    --parallel) PARALLEL=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --prompt-tokens) PROMPT_TOKENS=$2; shift 2 ;;
    --temp) TEMP=$2; shift 2 ;;
    --lookup) LOOKUP=$2; shift 2 ;;
    *) echo "usage: $0 -m MODEL.gguf [-c '1 4 16'] [-n requests] [-t tokens] [--parallel N] [--threads N] [--temp T] [--lookup N]" >&2; exit 2 ;;
    esac
done
[ -n "$MODEL" ] || { echo "bench-serve: -m MODEL.gguf is required" >&2; exit 2; }

WORK=$(mktemp -d)
SERVER_PID=""
cleanup() {
    [ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

"$TOY_BIN" serve -m "$MODEL" --port 0 --parallel "$PARALLEL" --queue 1024 --threads "$THREADS" \
    --lookup "$LOOKUP" --no-events --quiet 2> "$WORK/server.log" &
SERVER_PID=$!
for _ in $(seq 300); do
    grep -q "listening on" "$WORK/server.log" 2>/dev/null && break
    sleep 0.1
done
PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$WORK/server.log" | head -1)
[ -n "$PORT" ] || { cat "$WORK/server.log" >&2; exit 1; }
URL="http://127.0.0.1:$PORT"
echo "toy serve: $MODEL, $PARALLEL slots, port $PORT, $(nproc) cores, temperature $TEMP, lookup $LOOKUP"

metric() { curl -s "$URL/metrics" | awk -v m="$1" '$1 == m {print $2}'; }

# one client: sends its share of requests, one line per request: "code seconds". Over one kept-alive
# connection from python3 where there is one: a curl process a request took the server's cores (on 2 cores,
# 4 clients measured 313 tok/s in all where a threaded client of one process measured 565-636)
client() {
    local n=$1 out=$2 i
    if command -v python3 > /dev/null; then
        python3 - "$URL" "$n" "$TOKENS" "$out" "$TEMP" <<'EOF' && return
import http.client, json, sys, time, urllib.parse
url, n, toks, out, temp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
u = urllib.parse.urlparse(url)
c = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
with open(out, "a") as f:
    for i in range(1, n + 1):
        body = json.dumps({"prompt": "Once upon a time, request %d" % i, "max_tokens": toks, "temperature": temp,
                           "seed": i, "ignore_eos": True})
        t0 = time.time()
        try:
            c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            f.write("%d %.6f\n" % (r.status, time.time() - t0))
        except Exception:
            f.write("000 0\n")
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
EOF
    fi
    for i in $(seq "$n"); do
        curl -s -o /dev/null --max-time 300 -w '%{http_code} %{time_total}\n' "$URL/v1/completions" \
            -H 'Content-Type: application/json' \
            -d "{\"prompt\":\"Once upon a time, request $i\",\"max_tokens\":$TOKENS,\"temperature\":$TEMP,\"seed\":$i,\"ignore_eos\":true}" \
            >> "$out" || echo "000 0" >> "$out"
    done
}

rss() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$SERVER_PID/status"; }
echo "server RSS at start: $(rss) MiB"
printf '%-5s %8s %8s %12s %9s %9s %5s %10s %8s\n' conc requests req/s "gen tok/s" "p50 s" "p99 s" 5xx "mean batch" "RSS MiB"
for C in $CONC; do
    rm -f "$WORK"/lat.*
    steps0=$(metric toy_decode_steps_total); rows0=$(metric toy_decode_rows_total)
    per=$(( (REQUESTS + C - 1) / C ))
    t0=$(date +%s.%N)
    for k in $(seq "$C"); do client "$per" "$WORK/lat.$k" & done
    wait $(jobs -p | grep -v "^$SERVER_PID$") 2>/dev/null || true
    t1=$(date +%s.%N)
    steps1=$(metric toy_decode_steps_total); rows1=$(metric toy_decode_rows_total)
    cat "$WORK"/lat.* | grep -v '^$' > "$WORK/all" || true
    n=$(wc -l < "$WORK/all")
    bad=$(awk '$1 >= 500 || $1 == 0' "$WORK/all" | wc -l)
    sort -n -k2 "$WORK/all" | awk '{print $2}' > "$WORK/sorted"
    p50=$(sed -n "$(( (n - 1) * 50 / 100 + 1 ))p" "$WORK/sorted")
    p99=$(sed -n "$(( (n - 1) * 99 / 100 + 1 ))p" "$WORK/sorted")
    awk -v t0="$t0" -v t1="$t1" -v n="$n" -v tok="$TOKENS" -v C="$C" -v p50="$p50" -v p99="$p99" -v bad="$bad" \
        -v ds=$((steps1 - steps0)) -v dr=$((rows1 - rows0)) -v rss="$(rss)" 'BEGIN {
            el = t1 - t0
            printf "%-5d %8d %8.2f %12.1f %9.3f %9.3f %5d %10.2f %8s\n", C, n, n / el, n * tok / el, p50, p99, bad,
                   (ds > 0 ? dr / ds : 0), rss
        }'
done

[ "$LOOKUP" -gt 0 ] && echo "prompt lookup: $(metric toy_draft_tokens_accepted_total) of $(metric toy_draft_tokens_total) drafted tokens kept"

# time to first token for a long prompt, cold and with a prefix-cache hit (a stream: the first chunk's arrival)
python3 - "$URL" "$PROMPT_TOKENS" <<'EOF' || echo "(ttft check skipped: python3 unavailable)"
import json, sys, time, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
def ttft(ids):
    body = json.dumps({"prompt": ids, "max_tokens": 4, "stream": True, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    t0, first = time.time(), None
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:   # read to the end: the slot (and its cached prefix) is free again after
            if first is None and line.startswith(b"data: {"):
                first = time.time() - t0
    return first
ids = [1] + [(7 * i) % 900 + 100 for i in range(n - 1)]
cold = ttft(ids)
warm = ttft(ids[:-8] + [5, 6, 7, 8, 9, 10, 11, 12])   # shares n-8 tokens
print(f"ttft {n}-token prompt: cold {cold*1000:.1f} ms, prefix-cache hit {warm*1000:.1f} ms ({cold/warm:.1f}x)")
EOF
