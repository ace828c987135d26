#!/usr/bin/env bash
# coverage.sh LAUNCHED: every __global__ kernel of src/backends/cuda/*.cu
# must appear in LAUNCHED (kernel names the emulator wrote, one a line,
# with TOY_EMU_KERNELS=LAUNCHED while tests/test-cuda.c ran; template
# arguments are ignored). Lists the kernels no test launches; exit 1 if any.
set -euo pipefail
cd "$(dirname "$0")/../.."
launched=$1
all=$(grep -ohE '^(template <[^>]*> )?__global__ void [A-Za-z_0-9]+' src/backends/cuda/*.cu | awk '{print $NF}' | sort -u)
ran=$(sed 's/<.*//' "$launched" | sort -u)
missing=$(comm -23 <(echo "$all") <(echo "$ran"))
n_all=$(echo "$all" | wc -l)
if [ -n "$missing" ]; then
  echo "cuda-emu coverage: $(echo "$missing" | wc -l) of $n_all kernels never launched by tests/test-cuda.c:"
  echo "$missing" | sed 's/^/  /'
  exit 1
fi
echo "cuda-emu coverage: all $n_all kernels launched by tests/test-cuda.c"
