#!/usr/bin/env bash
# test-dp.sh: data-parallel training over MPI, end to end (issue 11;
# docs/distributed.md). Needs the MPI build (`make MPI=1`, build-mpi/toy)
# and Open MPI's mpirun; .ci/run calls it when both exist.
#
#   bash tests/mpi/test-dp.sh [BUILD_DIR]      (default build-mpi)
#
# Checks, on one machine over loopback/shared memory:
#  1. 2 ranks x batch 4 give the same loss curve, held-out losses and final
#     weights as 1 rank x batch 8, to floating-point reduction tolerance
#     (losses 1e-4 relative, weights 1e-3 of each tensor's largest value;
#     measured: see docs/distributed.md); rank 0 alone writes the bundle;
#     run_start.config states world 2 and global_batch 8; step events carry
#     rank_tokens_per_s for both ranks.
#  2. A rank that hangs (SIGSTOP) ends the job within the collective timeout
#     (--dp-timeout 5) with a clear error, a run_end "errored", and a
#     checkpoint of the last completed step whose resume reproduces the
#     uninterrupted run bit for bit.
#     With 3 ranks, the other survivor (rank 1) waits for rank 0 to write
#     that checkpoint before it ends the job.
#  3. A rank killed with SIGKILL ends the job within a bounded time; the last
#     periodic checkpoint resumes on 1 rank (global batch kept: batch 8).
#  4. Resuming that 2 x 4 run on 3 ranks is a clear error.
#  5. The all-reduce overlapped with the backward pass (--dp-overlap 1, the
#     default) gives the same bits as after it (--dp-overlap 0): losses,
#     held-out losses and weights, with buckets small enough (--dp-bucket-mb)
#     that there are many and they start during the backward pass.
#  6. ZeRO-1 (--zero 1): with clipping off it gives plain data parallelism's
#     bits; with clipping (whose norm sums the shards in another order)
#     losses within 1e-6 relative and weights within 1e-5; the AdamW state
#     per rank is halved; its checkpoint (moments gathered to rank 0)
#     resumes on 2 ranks with ZeRO-1 bit for bit and on 1 rank (batch 8)
#     within the 2 x 4 = 1 x 8 tolerance.
#  7. toy finetune (LoRA) on 2 ranks x batch 2 gives the same loss curve and
#     adapter as 1 rank x batch 2 with --grad-accum 2 (the same rows in the
#     same steps), to the same tolerance as 1; rank 0 alone writes the
#     bundle; finetune.json states world 2 and global batch 4; the 2-rank
#     checkpoint resumes on 1 rank (--grad-accum 2: the same micro-batches)
#     within that tolerance; its packing efficiency is this rank's, at most 1.
#  8. Ranks started with other options (another --seed), another model
#     (--preset) or a bad flag end the job before training with a message
#     naming what differs, exit non-zero, and leave no run; a rank resuming
#     a stale copy of the run (another step) is refused the same way.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${1:-build-mpi}
TOY=$ROOT/$BUILD/toy
PY=${PY:-/usr/bin/python3}
[ -x "$TOY" ] || { echo "test-dp: $TOY missing (make MPI=1)"; exit 1; }
command -v mpirun >/dev/null || { echo "test-dp: mpirun missing (bash tools/deps.sh --mpi)"; exit 1; }
MPIRUN=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
export OMPI_MCA_btl_vader_single_copy_mechanism=none # containers without CMA/ptrace

T=$(mktemp -d /tmp/toy-test-dp-XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "test-dp: FAIL: $*"; exit 1; }
pass=0
ok() { echo "test-dp: ok: $*"; pass=$((pass + 1)); }

CORPUS=$ROOT/../shared/testdata/corpus-tinyshakespeare/input.txt
if [ -r "$CORPUS" ]; then
  head -c 200000 "$CORPUS" >"$T/text.txt"
else # a stand-in with structure: numbered lines of a few repeating words
  awk 'BEGIN { for (i = 0; i < 20000; i++) printf "line %d of the %s and the %s\n", i % 97, (i % 3 ? "king" : "queen"), (i % 5 ? "sea" : "land") }' >"$T/text.txt"
fi
COMMON=(--data "$T/text.txt" --vocab-size 320 --preset tiny --ctx 64 --seed 7 --threads 1 --warmup 10
        --eval-batches 4 --log-every 1000)

now() { date +%s.%N; }
# pid of rank $2 of the job writing run dir $1
rank_pid() {
  local p
  for p in $(pgrep -f "toy train.*$1" || true); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then echo "$p"; return; fi
  done
}
# waits until run $1 has logged step >= $2
wait_step() {
  local i
  for i in $(seq 1 600); do
    if [ -f "$1/events.jsonl" ] && grep -q '"kind":"step"' "$1/events.jsonl"; then
      local s
      s=$(grep '"kind":"step"' "$1/events.jsonl" | tail -1 | sed 's/.*"step":\([0-9]*\).*/\1/')
      [ "$s" -ge "$2" ] && return 0
    fi
    sleep 0.05
  done
  fail "$1 never reached step $2"
}

# ---- 1. 2 ranks x B = 1 rank x 2B ----------------------------------------------------
"$TOY" train "${COMMON[@]}" --steps 60 --eval-every 20 --batch 8 --out "$T/one" >"$T/one.log" 2>&1 ||
  { cat "$T/one.log"; fail "1-rank run"; }
(cd "$T" && "${MPIRUN[@]}" -np 2 "$TOY" train "${COMMON[@]}" --steps 60 --eval-every 20 --batch 4 --out "$T/two") \
  >"$T/two.log" 2>&1 || { cat "$T/two.log"; fail "2-rank run"; }
CMP=$("$PY" tests/mpi/compare-runs.py "$T/one" "$T/two" --loss-tol 1e-4 --weight-tol 1e-3) ||
  fail "2 x 4 differs from 1 x 8 beyond tolerance: $CMP"
ok "2 ranks x batch 4 = 1 rank x batch 8 over 60 steps: $CMP"
"$PY" - "$T/two" <<'EOF' || fail "2-rank events"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1] + "/events.jsonl")]
assert [e["kind"] for e in ev].count("run_start") == 1, "one run_start (rank 0 alone writes)"
cfg = ev[0]["config"]
assert cfg["world"] == 2 and cfg["global_batch"] == 8 and cfg["batch"] == 4, cfg
steps = [e for e in ev if e["kind"] == "step"]
assert len(steps) == 60 and all(len(e["rank_tokens_per_s"]) == 2 and e["world"] == 2 for e in steps)
assert all(e["tokens"] == 8 * 64 for e in steps), "tokens count the global batch"
assert ev[-1]["kind"] == "run_end" and ev[-1]["reason"] == "completed"
EOF
grep -q "learning a 320-token" "$T/two.log" && [ "$(grep -c 'learning a 320-token' "$T/two.log")" -eq 1 ] ||
  fail "rank 1 printed progress"
ok "rank 0 alone writes events and reports; run_start.config has world 2, global_batch 8"

# ---- 2. a hung rank: timeout, clear error, exact resume ------------------------------------
HANG=(--steps 400 --eval-every 0 --ckpt-every 1000 --batch 4 --schedule constant --dp-timeout 5)
(cd "$T" && "${MPIRUN[@]}" -np 2 "$TOY" train "${COMMON[@]}" "${HANG[@]}" --out "$T/ref") >"$T/ref.log" 2>&1 ||
  { cat "$T/ref.log"; fail "uninterrupted 2-rank run"; }
(cd "$T" && "${MPIRUN[@]}" -np 2 "$TOY" train "${COMMON[@]}" "${HANG[@]}" --out "$T/hang"; echo "rc=$?") \
  >"$T/hang.log" 2>&1 &
JOB=$!
wait_step "$T/hang" 30
P1=$(rank_pid "$T/hang" 1)
[ -n "$P1" ] || fail "no rank 1 process"
kill -STOP "$P1"
t0=$(now)
wait "$JOB" || true
dt=$(echo "$(now) - $t0" | bc)
grep -q "rc=0" "$T/hang.log" && { cat "$T/hang.log"; fail "a hung rank ended the job with status 0"; }
grep -q "did not complete within 5 s: another rank died, hangs or stopped calling it" "$T/hang.log" ||
  { cat "$T/hang.log"; fail "no clear timeout message"; }
(($(echo "$dt < 30" | bc))) || fail "the job took $dt s to end after a rank hung"
kill -9 "$P1" 2>/dev/null || true
"$PY" - "$T/hang" <<'EOF' || fail "hung-rank run bundle"
import json, os, sys
run = sys.argv[1]
ev = [json.loads(l) for l in open(run + "/events.jsonl")]
end = ev[-1]
assert end["kind"] == "run_end" and end["reason"] == "errored" and "did not complete" in end["error"], end
last = max(e["step"] for e in ev if e["kind"] == "step")
assert end["final_step"] == last, (end, last)
assert os.readlink(run + "/weights/latest") == "step_%d.gguf" % last
print("test-dp: the hung run stopped at step %d" % last)
EOF
ok "a hung rank ends the job in $dt s (timeout 5 s) with a clear error and a checkpoint of the last step"
(cd "$T" && "${MPIRUN[@]}" -np 2 "$TOY" train --resume "$T/hang" --threads 1) >"$T/resume.log" 2>&1 ||
  { cat "$T/resume.log"; fail "resume after the hang"; }
"$PY" - "$T/ref" "$T/hang" <<'EOF' || fail "the resumed run differs from the uninterrupted one"
import json, sys
def losses(run):
    out = {}
    for l in open(run + "/events.jsonl"):
        e = json.loads(l)
        if e["kind"] == "step":
            out[e["step"]] = e["loss"]  # a resumed run's later events win
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert a.keys() == b.keys() and len(a) == 400, (len(a), len(b))
bad = [s for s in a if a[s] != b[s]]
assert not bad, "steps %s differ: %s vs %s" % (bad[:3], [a[s] for s in bad[:3]], [b[s] for s in bad[:3]])
EOF
CMP=$("$PY" tests/mpi/compare-runs.py "$T/ref" "$T/hang" --loss-tol 0 --weight-tol 0) ||
  fail "resumed weights differ from the uninterrupted run's: $CMP"
ok "the hung run resumed on 2 ranks reproduces the uninterrupted run's 400 losses and weights exactly"

# ---- 2b. with 3 ranks, rank 2 hangs: rank 1 times out too, but leaves rank 0 time to checkpoint --------
(cd "$T" && "${MPIRUN[@]}" -np 3 "$TOY" train "${COMMON[@]}" --steps 2000 --eval-every 0 --batch 4 --dp-timeout 5 \
  --out "$T/hang3"; echo "rc=$?") >"$T/hang3.log" 2>&1 &
JOB=$!
wait_step "$T/hang3" 20
P2=$(rank_pid "$T/hang3" 2)
[ -n "$P2" ] || fail "no rank 2 process"
kill -STOP "$P2"
t0=$(now)
wait "$JOB" || true
dt=$(echo "$(now) - $t0" | bc)
kill -9 "$P2" 2>/dev/null || true
grep -q "rc=0" "$T/hang3.log" && { cat "$T/hang3.log"; fail "3 ranks: a hung rank ended the job with status 0"; }
(($(echo "$dt < 40" | bc))) || fail "3 ranks: the job took $dt s to end after a rank hung"
tail -1 "$T/hang3/events.jsonl" | grep -q '"reason":"errored"' || { cat "$T/hang3.log"; fail "3 ranks: no run_end errored"; }
L3=$(readlink "$T/hang3/weights/latest")
S3=$(tail -1 "$T/hang3/events.jsonl" | sed 's/.*"final_step":\([0-9]*\).*/\1/')
[ "$L3" = "step_$S3.gguf" ] || fail "3 ranks: latest is $L3, the run ended at step $S3"
ok "3 ranks, rank 2 hung: the job ends in $dt s; rank 0 checkpointed step $S3 before rank 1 gave up"

# ---- 3. a killed rank: the job ends; the last checkpoint resumes on 1 rank ---------------------
(cd "$T" && "${MPIRUN[@]}" -np 2 "$TOY" train "${COMMON[@]}" --steps 2000 --eval-every 0 --ckpt-every 20 --batch 4 \
  --dp-timeout 5 --out "$T/kill"; echo "rc=$?") >"$T/kill.log" 2>&1 &
JOB=$!
wait_step "$T/kill" 50
P1=$(rank_pid "$T/kill" 1)
[ -n "$P1" ] || fail "no rank 1 process"
kill -9 "$P1"
t0=$(now)
wait "$JOB" || true
dt=$(echo "$(now) - $t0" | bc)
grep -q "rc=0" "$T/kill.log" && { cat "$T/kill.log"; fail "a killed rank ended the job with status 0"; }
(($(echo "$dt < 30" | bc))) || fail "the job took $dt s to end after a rank was killed"
pgrep -f "toy train.*$T/kill" >/dev/null && fail "processes of the killed job are left"
LAST=$(readlink "$T/kill/weights/latest")
KS=${LAST#step_}; KS=${KS%.gguf} # the job may have checkpointed several times before the kill landed
"$TOY" train --resume "$T/kill" --steps $((KS + 20)) --threads 1 >"$T/kresume.log" 2>&1 ||
  { cat "$T/kresume.log"; fail "resume on 1 rank"; }
tail -1 "$T/kill/events.jsonl" | grep -q '"reason":"completed"' ||
  { cat "$T/kresume.log"; tail -2 "$T/kill/events.jsonl"; fail "the 1-rank resume (from $LAST) did not complete"; }
grep '"kind":"run_start"' "$T/kill/events.jsonl" | tail -1 | grep -q '"batch":8,' ||
  fail "the 1-rank resume did not keep the global batch (batch 8)"
ok "a killed rank ends the job in $dt s ($(grep -m1 -o 'exited on signal [0-9]*' "$T/kill.log" || echo 'mpirun aborted it')); $LAST resumes on 1 rank with batch 8"

# ---- 4. a global batch the ranks cannot split --------------------------------------------------
if (cd "$T" && "${MPIRUN[@]}" -np 3 "$TOY" train --resume "$T/kill" --steps 100 --threads 1) >"$T/three.log" 2>&1; then
  fail "resuming 2 x 4 on 3 ranks succeeded"
fi
grep -q "cannot resume on 3 ranks: the run's global batch is 8 rows" "$T/three.log" || { cat "$T/three.log"; fail "no clear error for 3 ranks"; }
ok "resuming a global batch of 8 on 3 ranks is a clear error"

# ---- 5. overlap on = overlap off, to the bit ---------------------------------------------------
SMALLB=(--dp-bucket-mb 0.05) # 52 kB buckets: ~10 of them for the tiny preset's 476 kB of gradients
for ov in 0 1; do
  (cd "$T" && "${MPIRUN[@]}" -np 2 "$TOY" train "${COMMON[@]}" --steps 40 --eval-every 20 --batch 4 "${SMALLB[@]}" \
    --dp-overlap $ov --out "$T/ov$ov") >"$T/ov$ov.log" 2>&1 || { cat "$T/ov$ov.log"; fail "2-rank run, --dp-overlap $ov"; }
done
grep -q "all-reduce overlapped with the backward pass" "$T/ov1.log" || fail "the overlapped run does not say so"
CMP=$("$PY" tests/mpi/compare-runs.py "$T/ov0" "$T/ov1" --loss-tol 0 --weight-tol 0) ||
  fail "overlapped all-reduce differs from the one after the backward pass: $CMP"
echo "$CMP" | grep -q '"weights_bit_identical": true' || fail "weights not bit-identical: $CMP"
ok "all-reduce overlapped with the backward pass = after it, bit for bit (40 steps, 52 kB buckets)"

# ---- 6. ZeRO-1 -------------------------------------------------------------------------------------
for clip in 0 1; do
  for z in 0 1; do
    (cd "$T" && "${MPIRUN[@]}" -np 2 "$TOY" train "${COMMON[@]}" --steps 40 --eval-every 20 --batch 4 "${SMALLB[@]}" \
      --clip $clip --zero $z --out "$T/z${z}c$clip") >"$T/z${z}c$clip.log" 2>&1 ||
      { cat "$T/z${z}c$clip.log"; fail "2-rank run, --zero $z --clip $clip"; }
  done
done
CMP=$("$PY" tests/mpi/compare-runs.py "$T/z0c0" "$T/z1c0" --loss-tol 0 --weight-tol 0) || fail "ZeRO-1 differs from plain DP with clip 0: $CMP"
echo "$CMP" | grep -q '"weights_bit_identical": true' || fail "ZeRO-1, clip 0: weights not bit-identical: $CMP"
CMP=$("$PY" tests/mpi/compare-runs.py "$T/z0c1" "$T/z1c1" --loss-tol 1e-6 --weight-tol 1e-5) || fail "ZeRO-1 differs from plain DP: $CMP"
MEM=$("$PY" - "$T/z0c1" "$T/z1c1" <<'EOF'
import json, sys
cfg = [json.loads(open(r + "/events.jsonl").readline())["config"] for r in sys.argv[1:]]
full, shard = cfg[0]["optim_state_bytes_per_rank"], cfg[1]["optim_state_bytes_per_rank"]
assert cfg[1]["zero"] == 1 and abs(shard - full / 2) <= 64, (full, shard)
print("AdamW state per rank %d -> %d bytes" % (full, shard))
EOF
) || fail "ZeRO-1 memory per rank"
ok "ZeRO-1 = plain DP bit for bit with clip 0; with clip 1 $CMP; $MEM"
ZC=(--eval-every 0 --batch 4 --schedule constant --zero 1 "${SMALLB[@]}")
(cd "$T" && "${MPIRUN[@]}" -np 2 "$TOY" train "${COMMON[@]}" "${ZC[@]}" --steps 30 --out "$T/zref") >"$T/zref.log" 2>&1 ||
  { cat "$T/zref.log"; fail "ZeRO-1 reference run"; }
(cd "$T" && "${MPIRUN[@]}" -np 2 "$TOY" train "${COMMON[@]}" "${ZC[@]}" --steps 15 --out "$T/zpart") >"$T/zpart.log" 2>&1 ||
  { cat "$T/zpart.log"; fail "ZeRO-1 first half"; }
cp -r "$T/zpart" "$T/zpart1"
(cd "$T" && "${MPIRUN[@]}" -np 2 "$TOY" train --resume "$T/zpart" --zero 1 --steps 30 --threads 1) >"$T/zres2.log" 2>&1 ||
  { cat "$T/zres2.log"; fail "ZeRO-1 checkpoint resumed on 2 ranks"; }
CMP=$("$PY" tests/mpi/compare-runs.py "$T/zref" "$T/zpart" --loss-tol 0 --weight-tol 0 --common-evals) ||
  fail "ZeRO-1 resumed on 2 ranks differs from the uninterrupted run: $CMP"
"$TOY" train --resume "$T/zpart1" --steps 30 --threads 1 >"$T/zres1.log" 2>&1 || { cat "$T/zres1.log"; fail "ZeRO-1 checkpoint resumed on 1 rank"; }
grep '"kind":"run_start"' "$T/zpart1/events.jsonl" | tail -1 | grep -q '"batch":8,' || fail "the 1-rank resume did not take batch 8"
CMP=$("$PY" tests/mpi/compare-runs.py "$T/zref" "$T/zpart1" --loss-tol 1e-4 --weight-tol 1e-3 --common-evals) ||
  fail "ZeRO-1 resumed on 1 rank differs from the uninterrupted run beyond tolerance: $CMP"
ok "a ZeRO-1 checkpoint resumes on 2 ranks bit for bit and on 1 rank (batch 8) within tolerance: $CMP"

# ---- 7. toy finetune ----------------------------------------------------------------------------------
"$TOY" train "${COMMON[@]}" --steps 10 --eval-every 0 --batch 4 --out "$T/base" >"$T/base.log" 2>&1 ||
  { cat "$T/base.log"; fail "the base model for finetune"; }
"$PY" - "$T/sft.jsonl" <<'EOF'
import json, sys
words = ["king", "queen", "sea", "land", "crown", "storm", "night", "day"]
with open(sys.argv[1], "w") as f:
    for i in range(240):
        a, b = words[i % 8], words[(i * 3 + 1) % 8]
        f.write(json.dumps({"prompt": f"the {a} and the", "completion": f" {b} of line {i % 13}"}) + "\n")
EOF
FT=(--base "$T/base/weights/latest" --data "$T/sft.jsonl" --method lora --rank 4 --ctx 64 --lr 3e-3 --steps 24
    --eval-every 8 --eval-batches 4 --seed 5 --threads 1 --log-every 1000 --json)
"$TOY" finetune "${FT[@]}" --batch 2 --grad-accum 2 --out "$T/ft1" >"$T/ft1.log" 2>&1 || { cat "$T/ft1.log"; fail "1-rank finetune"; }
(cd "$T" && "${MPIRUN[@]}" -np 2 "$TOY" finetune "${FT[@]}" --batch 2 --ckpt-every 12 --out "$T/ft2") >"$T/ft2.log" 2>&1 ||
  { cat "$T/ft2.log"; fail "2-rank finetune"; }
CMP=$("$PY" tests/mpi/compare-runs.py "$T/ft1" "$T/ft2" --loss-tol 1e-4 --weight-tol 1e-3) ||
  fail "finetune 2 x 2 differs from 1 x 2 x accum 2 beyond tolerance: $CMP"
"$PY" - "$T/ft2" <<'EOF' || fail "2-rank finetune bundle"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1] + "/events.jsonl")]
assert [e["kind"] for e in ev].count("run_start") == 1, "one run_start (rank 0 alone writes)"
cfg = json.load(open(sys.argv[1] + "/finetune.json"))
assert cfg["world"] == 2 and cfg["global_batch"] == 4 and cfg["batch"] == 2, cfg
assert len([e for e in ev if e["kind"] == "step"]) == 24
EOF
[ "$(grep -c '"format":"toy/finetune-v1"' "$T/ft2.log")" -eq 1 ] || fail "finetune: one result line (rank 0)"
(cd "$T/ft2/weights" && ln -sfn step_12.gguf latest)
"$TOY" finetune --resume "$T/ft2" --threads 1 --json >"$T/ftres.log" 2>&1 || { cat "$T/ftres.log"; fail "finetune resumed on 1 rank"; }
grep '"kind":"run_start"' "$T/ft2/events.jsonl" | tail -1 | grep -q '"accum":2,' || fail "the 1-rank finetune resume did not take --grad-accum 2"
CMP2=$("$PY" tests/mpi/compare-runs.py "$T/ft1" "$T/ft2" --loss-tol 1e-4 --weight-tol 1e-3 --common-evals) ||
  fail "the 2-rank finetune resumed on 1 rank differs beyond tolerance: $CMP2"
"$PY" - "$T/ft2.log" <<'EOF' || fail "finetune on 2 ranks: packing efficiency"
import json, sys
line = [l for l in open(sys.argv[1]) if '"format":"toy/finetune-v1"' in l][0]
pe = json.loads(line[line.index("{"):])["pack_efficiency"]
assert 0 < pe <= 1, f"pack_efficiency {pe}: one rank's positions over all ranks' draws"
EOF
ok "toy finetune: 2 ranks x batch 2 = 1 rank x batch 2 x accum 2: $CMP; resumed on 1 rank (accum 2): $CMP2"

# ---- 8. ranks started differently -----------------------------------------------------------------------
MM=(--steps 20 --eval-every 0 --batch 4 --dp-timeout 20)
for extra in "--seed 8" "--preset small" "--arch foo"; do
  rm -rf "$T/mm"
  st=0
  # shellcheck disable=SC2086 # $extra is a flag and its value
  (cd "$T" && "${MPIRUN[@]}" -np 1 "$TOY" train "${COMMON[@]}" "${MM[@]}" --out "$T/mm" : \
       -np 1 "$TOY" train "${COMMON[@]}" "${MM[@]}" --out "$T/mm" $extra) >"$T/mm.log" 2>&1 || st=$?
  [ "$st" -ne 0 ] || { cat "$T/mm.log"; fail "rank 1 with $extra: the job succeeded"; }
  grep -Eq "the ranks were started with other (training options|model shapes)|unknown --arch" "$T/mm.log" ||
    { cat "$T/mm.log"; fail "rank 1 with $extra: no message naming the difference"; }
  [ ! -e "$T/mm/events.jsonl" ] || { cat "$T/mm.log"; fail "rank 1 with $extra: a run was left behind"; }
done
"${MPIRUN[@]}" -np 2 "$TOY" train "${COMMON[@]}" "${MM[@]}" --ckpt-every 10 --out "$T/st" >"$T/st.log" 2>&1 ||
  { cat "$T/st.log"; fail "the run for the stale-copy check"; }
cp -a "$T/st" "$T/stale" && (cd "$T/stale/weights" && ln -sfn step_10.gguf latest)
st=0
"${MPIRUN[@]}" -np 1 "$TOY" train --resume "$T/st" --steps 30 : -np 1 "$TOY" train --resume "$T/stale" --steps 30 \
  >"$T/stale.log" 2>&1 || st=$?
{ [ "$st" -ne 0 ] && grep -q "the ranks were started with other checkpoint" "$T/stale.log"; } ||
  { cat "$T/stale.log"; fail "a rank resuming a stale copy of the run (step 10, not 20) was not refused"; }
ok "ranks started with another seed, preset, a bad flag or a stale checkpoint: refused before training, no run left"

echo "test-dp: all $pass checks passed"
