#!/usr/bin/env bash
# Installs the Debian packages toy needs, only those missing (idempotent;
# silent when everything is present). Run as root or with sudo available.
set -euo pipefail
# --mpi adds Open MPI, for `make MPI=1` (data parallelism; docs/distributed.md).
quiet=0; mpi=0
for a in "$@"; do case "$a" in --quiet) quiet=1 ;; --mpi) mpi=1 ;; esac; done
pkgs=(
  build-essential pkg-config clang libclang-rt-14-dev   # clang: warnings build, libFuzzer
  zlib1g-dev                             # gzip (MNIST IDX files)
  libopenblas-dev libopenblas0-pthread   # SGEMM
  libcriterion-dev                       # tests
  libpcre2-dev libutf8proc-dev           # tokenizer regexes, NFC
  libjansson-dev                         # JSON
  libmicrohttpd-dev                      # toy serve
  libstb-dev                             # PNG/JPEG for image sets
  python3-torch python3-numpy            # the reference oracle in tests
)
[ $mpi -eq 1 ] && pkgs+=(openmpi-bin libopenmpi-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  [ $quiet -eq 1 ] || echo "deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "deps: installing ${missing[*]}"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
# Refresh package lists when they are missing or older than a day.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -n1)" ]; then
  $SUDO apt-get update -qq
fi
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "deps: done"
