#!/bin/bash
# bench/run.sh: the benchmarks `make bench` runs, one line each. Each prints
# its figures as a ratio to a peer measured or recorded alongside.
set -u
B=${TOY_BUILD:-build}
TD=${TOY_TESTDATA:-../shared/testdata}
status=0
"$B/bench/bench-tokenizer" "$TD" 3 || status=1
exit $status
