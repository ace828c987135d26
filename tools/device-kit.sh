#!/usr/bin/env bash
# device-kit.sh: what a GPU machine's bare image lacks to build and run toy.
#
# The GPU machines this project is lent (/work/.library/device) start from
# an image with CUDA's compiler, PyTorch and its Python wheels, but without
# the Debian -dev packages toy builds against (OpenBLAS, PCRE2, utf8proc,
# Jansson, libmicrohttpd, zlib, stb, Criterion), and nothing can be
# installed there. So, here:
#   bash tools/device-kit.sh pack
# writes .devkit/kit.tar.gz (ignored by git; ~15 MB): those packages'
# headers, the shared libraries toy's binaries load (besides glibc's and
# GCC's own), and `make`. Name `.devkit` in the device call's `carry`.
# There, before building:
#   source tools/device-kit.sh env
# unpacks it and exports CPPFLAGS and LDFLAGS for it (the kit's libraries
# are found by the binaries' rpath), finds
# the CUDA toolkit (CUDA_HOME: /usr/local/cuda, else the nvcc on PATH) and
# looks for cuBLAS, cuBLASLt, the CUDA runtime and NCCL where the toolkit
# lacks them (NCCL is not part of it), in PyTorch's nvidia-* wheels. It sets
# WERROR= so a compiler newer than CI's warns instead of stopping the one
# build. tools/gpu-check.sh does this itself when .devkit/kit.tar.gz exists.
# `bash tools/device-kit.sh check` rehearses the kit here: a build of the
# CPU library and tests that finds the packages only in the kit.

kit_root=/tmp/toy-kit # the tarball holds toy-kit/
kit_tar=.devkit/kit.tar.gz
kit_pkgs=(libopenblas-pthread-dev libpcre2-dev libutf8proc-dev libjansson-dev libmicrohttpd-dev zlib1g-dev
  libstb-dev libcriterion-dev)

kit_pack() {
  set -euo pipefail
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  bash tools/deps.sh --quiet
  make -s -j"$(nproc)" all build/toy-tests
  local tmp
  tmp=$(mktemp -d)
  local k=$tmp/toy-kit
  mkdir -p "$k/include" "$k/lib" "$k/bin"
  # headers, as the compiler here finds them (Debian's multiarch folder and
  # OpenBLAS's alternatives folder flattened)
  local p f rel
  for p in "${kit_pkgs[@]}"; do
    dpkg -L "$p" | grep -E '^/usr/include/.+\.h$' | while read -r f; do
      rel=${f#/usr/include/}
      rel=${rel#x86_64-linux-gnu/}
      rel=${rel#openblas-pthread/}
      mkdir -p "$k/include/$(dirname "$rel")"
      cp -L "$f" "$k/include/$rel"
    done
  done
  # the libraries the binaries load, by soname, less glibc's and GCC's
  local so name
  for so in $(ldd build/toy build/toy-tests build/libtoy.so | awk '/=> \// {print $3}' | sort -u); do
    name=$(basename "$so")
    case "$name" in
      libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libresolv.so.*|ld-linux*|libgcc_s.so.*|libstdc++.so.*) ;;
      *) cp -L "$so" "$k/lib/$name" ;;
    esac
  done
  # the names a link line asks for (-lopenblas: libopenblas.so)
  for f in "$k"/lib/*.so.*; do
    ln -sf "$(basename "$f")" "${f%%.so.*}.so"
  done
  cp -L "$(command -v make)" "$k/bin/make"
  # the two small test-data sets tools/gpu-check.sh's CLI steps read (a
  # device call carries the checkout only, not ../shared)
  local td=../shared/testdata
  if [ -d "$td" ]; then
    mkdir -p .devkit/testdata
    cp -r "$td/model-gguf-llama2-tiny-random" "$td/corpus-tinyshakespeare" .devkit/testdata/
  fi
  mkdir -p .devkit
  tar -czf .devkit/kit.tar.gz -C "$tmp" toy-kit
  rm -rf "$tmp"
  echo "device kit: $kit_tar, $(du -h .devkit/kit.tar.gz | cut -f1)"
}

# the folder holding lib$1.so* or $1 (a header) first among the toolkit's
# and the Python wheels' folders, or nothing
kit_find() {
  local want=$1 d
  local dirs=("$CUDA_HOME/lib64" "$CUDA_HOME/include" "$CUDA_HOME/targets/x86_64-linux/lib"
    "$CUDA_HOME/targets/x86_64-linux/include" /usr/lib/x86_64-linux-gnu /usr/include)
  local py
  for py in python3 /usr/bin/python3; do
    command -v "$py" >/dev/null || continue
    for d in $("$py" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
      dirs+=("$d"/nvidia/*/lib "$d"/nvidia/*/include "$d"/nvidia/cu*/lib "$d"/nvidia/cu*/include)
    done
  done
  for d in "${dirs[@]}"; do
    [ -d "$d" ] || continue
    if [[ $want == *.h ]]; then
      [ -f "$d/$want" ] && { echo "$d"; return; }
    else
      ls "$d/lib$want.so"* >/dev/null 2>&1 && { echo "$d"; return; }
    fi
  done
}

kit_env() {
  if [ -f "$kit_tar" ]; then
    rm -rf "$kit_root"
    tar -xzf "$kit_tar" -C /tmp
  fi
  if [ -d "$kit_root" ]; then
    export CPPFLAGS="${CPPFLAGS:+$CPPFLAGS }-isystem $kit_root/include"
    # toy's binaries find the kit's libraries, and those their own, by the
    # binaries' DT_RPATH (not RUNPATH, which their dependencies would not
    # see); no LD_LIBRARY_PATH, which would hand the kit's OpenSSL, zlib,
    # ... to the image's own programs (Python, PyTorch) too
    export LDFLAGS="${LDFLAGS:+$LDFLAGS }-L$kit_root/lib -Wl,-rpath-link,$kit_root/lib -Wl,--disable-new-dtags,-rpath,$kit_root/lib"
    command -v make >/dev/null || export PATH="$PATH:$kit_root/bin"
    echo "device kit: $kit_root"
  fi
  export WERROR=
  if [ -z "${CUDA_HOME:-}" ]; then
    if [ -x /usr/local/cuda/bin/nvcc ]; then
      CUDA_HOME=/usr/local/cuda
    elif command -v nvcc >/dev/null; then
      CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    fi
  fi
  [ -n "${CUDA_HOME:-}" ] || { echo "device kit: no nvcc found (set CUDA_HOME)"; return 1; }
  export CUDA_HOME
  # what the link line and the CUDA sources need but the toolkit may not hold
  local links=$kit_root/cuda-links n d f
  mkdir -p "$links"
  for n in cudart cublas cublasLt nccl; do
    [ -e "$CUDA_HOME/lib64/lib$n.so" ] && continue
    d=$(kit_find "$n")
    [ -n "$d" ] || { echo "device kit: lib$n.so not found (toolkit or nvidia-* wheels)"; continue; }
    f=$(ls "$d/lib$n.so"* | sort | head -1)
    ln -sf "$f" "$links/lib$n.so"
    export LDFLAGS="${LDFLAGS:+$LDFLAGS }-Wl,-rpath,$d"
    echo "device kit: lib$n from $d"
  done
  export LDFLAGS="${LDFLAGS:+$LDFLAGS }-L$links"
  for n in nccl.h cublasLt.h cublas_v2.h cuda_runtime.h; do
    [ -f "$CUDA_HOME/include/$n" ] && continue
    d=$(kit_find "$n")
    [ -n "$d" ] || { echo "device kit: $n not found (toolkit or nvidia-* wheels)"; continue; }
    # a folder the compiler searches anyway is not named again: -isystem
    # /usr/include would reorder it and break C++'s #include_next <math.h>
    case "$d" in /usr/include|/usr/local/include) ;; *) export CPPFLAGS="$CPPFLAGS -isystem $d" ;; esac
    echo "device kit: $n from $d"
  done
  echo "device kit: CUDA_HOME=$CUDA_HOME"
}

# here: a bare root (a chroot with only Debian's build-essential) builds the
# CPU library and tests from the kit alone and runs a few suites; needs root
# and debootstrap (apt-get install debootstrap), ~3 minutes the first time
kit_check() {
  set -euo pipefail
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  [ -f "$kit_tar" ] || kit_pack
  local root=${TOY_KIT_CHROOT:-/var/tmp/toy-kit-chroot} rc
  if [ ! -x "$root/usr/bin/gcc" ]; then
    command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
    debootstrap --variant=minbase --include=build-essential bookworm "$root" http://deb.debian.org/debian >/dev/null
  fi
  rm -rf "$root/src" && mkdir -p "$root/src"
  git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$root/src" # what a device call sends
  mkdir -p "$root/src/.devkit" && cp "$kit_tar" "$root/src/.devkit/"
  mountpoint -q "$root/proc" || mount -t proc proc "$root/proc" # Criterion's workers need it
  chroot "$root" /bin/bash -c 'cd /src && source tools/device-kit.sh env >/dev/null 2>&1
    make -s -j2 WERROR=-Werror all build/toy-tests || exit 1
    ldd build/toy build/toy-tests build/libtoy.so | grep "not found" && exit 1
    for s in gguf qdot quant sampler; do
      TOY_BIN=build/toy ./build/toy-tests --filter "$s/*" -j2 2>&1 | tail -1 | grep -q "Failing: 0 | Crashing: 0" || exit 1
    done
    echo "device kit: a bare Debian root built toy and ran its gguf, qdot, quant and sampler tests from the kit alone"' &&
    rc=0 || rc=$?
  umount "$root/proc" 2>/dev/null || true
  return $rc
}

case "${1:-}" in
  pack) kit_pack ;;
  env) kit_env ;;
  check) kit_check ;;
  *) echo "usage: bash tools/device-kit.sh pack|check; source tools/device-kit.sh env" >&2
     [ "${BASH_SOURCE[0]}" = "$0" ] && exit 2 || return 2 ;;
esac
