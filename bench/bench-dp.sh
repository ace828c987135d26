#!/usr/bin/env bash
# bench-dp.sh: data-parallel scaling from 1 to 2 MPI ranks on this machine
# (docs/distributed.md keeps the figures and the cost model they feed).
#
#   bash bench/bench-dp.sh [BUILD_DIR] [STEPS] [PRESET]   (build-mpi, 40, small)
#
# Runs `toy train` on the same data and model (global batch 16 x 128
# tokens) as: 1 rank x 1 thread with the per-rank batch (8: what one rank
# does in the 2-rank job), 1 rank x 1 thread x 16, 1 rank x 2 threads x 16
# (the same two cores used by threads instead), and 2 ranks x 1 thread x 8
# three ways: the all-reduce after the backward pass (--dp-overlap 0),
# overlapped with it (the default), and overlapped with ZeRO-1 (--zero 1);
# all three with 2 MiB buckets (BUCKET_MB), so that the small preset's
# 13 MB of gradients make 7 buckets that can start during the backward pass.
# From the step events (steps after the 5th) it prints the median step
# time, the global tokens/s, each rank's forward+backward time, the time
# the step waited for the gradients after its backward pass ("exposed":
# all of the all-reduce without overlap), the AdamW state per rank, and the
# efficiencies:
#   weak   = step time of 1 rank x 8 / step time of 2 ranks x 8 each
#   vs threads = tokens/s of 2 ranks / tokens/s of 1 rank x 2 threads
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${1:-build-mpi}
STEPS=${2:-40}
PRESET=${3:-small}
BUCKET_MB=${BUCKET_MB:-2}
TOY=$ROOT/$BUILD/toy
PY=${PY:-/usr/bin/python3}
MPIRUN=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
T=$(mktemp -d /tmp/toy-bench-dp-XXXXXX)
trap 'rm -rf "$T"' EXIT
CORPUS=$ROOT/../shared/testdata/corpus-tinyshakespeare/input.txt
head -c 400000 "$CORPUS" >"$T/text.txt"
COMMON=(--data "$T/text.txt" --vocab-size 512 --preset "$PRESET" --ctx 128 --seed 7 --steps "$STEPS" --warmup 5
        --eval-every 0 --eval-batches 1 --log-every 100000)
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(mpirun --version | head -1)"
run() { # name, then the command
  local name=$1
  shift
  (cd "$T" && "$@" --out "$T/$name") >"$T/$name.log" 2>&1 || { cat "$T/$name.log"; exit 1; }
}
run r1b8 "$TOY" train "${COMMON[@]}" --threads 1 --batch 8
run r1b16 "$TOY" train "${COMMON[@]}" --threads 1 --batch 16
run r1b16t2 "$TOY" train "${COMMON[@]}" --threads 2 --batch 16
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
run r2b8 "${MPIRUN[@]}" -np 2 "$TOY" train "${COMMON[@]}" --threads 1 --batch 8 --dp-bucket-mb "$BUCKET_MB" --dp-overlap 0
run r2b8ov "${MPIRUN[@]}" -np 2 "$TOY" train "${COMMON[@]}" --threads 1 --batch 8 --dp-bucket-mb "$BUCKET_MB" --dp-overlap 1
run r2b8z "${MPIRUN[@]}" -np 2 "$TOY" train "${COMMON[@]}" --threads 1 --batch 8 --dp-bucket-mb "$BUCKET_MB" --zero 1
"$PY" - "$T" <<'EOF'
import json, statistics, sys
T = sys.argv[1]
def load(name):
    ev = [json.loads(l) for l in open(f"{T}/{name}/events.jsonl")]
    n_params = ev[0]["model"]["n_params"]
    steps = [e for e in ev if e["kind"] == "step" and e["step"] > 5]
    wall = statistics.median(e["wall_us"] for e in steps) / 1e3
    tok = steps[0]["tokens"]
    r = {"name": name, "params": n_params, "step_ms": wall, "tok_s": tok / wall * 1e3, "tokens": tok,
         "optim_mb": ev[0]["config"].get("optim_state_bytes_per_rank", 0) / 1e6}
    if "rank_tokens_per_s" in steps[0]:
        per = tok / len(steps[0]["rank_tokens_per_s"])
        r["rank_compute_ms"] = [statistics.median(per / e["rank_tokens_per_s"][k] * 1e3 for e in steps)
                                for k in range(len(steps[0]["rank_tokens_per_s"]))]
        r["allreduce_ms"] = statistics.median(e["allreduce_us"] for e in steps) / 1e3
    return r
rs = {n: load(n) for n in ["r1b8", "r1b16", "r1b16t2", "r2b8", "r2b8ov", "r2b8z"]}
P = rs["r1b8"]["params"]
print(f"model: {P} parameters; gradient all-reduce: {4 * P / 1e6:.1f} MB per step")
labels = {"r1b8": "1 rank  x 1 thread,  batch 8 ", "r1b16": "1 rank  x 1 thread,  batch 16",
          "r1b16t2": "1 rank  x 2 threads, batch 16", "r2b8": "2 ranks x 1 thread,  batch 8 each, after backward",
          "r2b8ov": "2 ranks x 1 thread,  batch 8 each, overlapped ", "r2b8z": "2 ranks x 1 thread,  batch 8 each, ZeRO-1     "}
for n, r in rs.items():
    extra = ""
    if "allreduce_ms" in r:
        extra = (f"  compute/rank {', '.join(f'{x:.1f}' for x in r['rank_compute_ms'])} ms"
                 f"  exposed all-reduce {r['allreduce_ms']:.2f} ms")
    print(f"{labels[n]}: step {r['step_ms']:7.1f} ms  {r['tok_s']:8.0f} tok/s (global)  AdamW {r['optim_mb']:.1f} MB/rank{extra}")
for n in ("r2b8", "r2b8ov", "r2b8z"):
    weak = rs["r1b8"]["step_ms"] / rs[n]["step_ms"]
    vs_t = rs[n]["tok_s"] / rs["r1b16t2"]["tok_s"]
    speed = rs[n]["tok_s"] / rs["r1b16"]["tok_s"]
    print(f"scaling 1 -> 2 ranks ({labels[n].split(', ')[-1].strip()}): weak efficiency {weak:.2f}, speedup over "
          f"1 rank x 1 thread {speed:.2f}x, 2 ranks / 1 rank x 2 threads {vs_t:.2f}")
bw = 4 * P / (rs["r2b8"]["allreduce_ms"] / 1e3) / 1e9 if rs["r2b8"]["allreduce_ms"] > 0 else float("nan")
print(f"all-reduce after backward, effective bandwidth (payload / time, includes waiting for the slower rank): {bw:.2f} GB/s")
hid = 1 - rs["r2b8ov"]["allreduce_ms"] / rs["r2b8"]["allreduce_ms"] if rs["r2b8"]["allreduce_ms"] > 0 else float("nan")
print(f"overlap: exposed all-reduce {rs['r2b8']['allreduce_ms']:.2f} -> {rs['r2b8ov']['allreduce_ms']:.2f} ms "
      f"({hid * 100:.0f}% hidden); step {rs['r2b8']['step_ms']:.1f} -> {rs['r2b8ov']['step_ms']:.1f} ms")
EOF
