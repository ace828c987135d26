#!/usr/bin/env bash
# check.sh BUILD [MAKEVAR=VALUE...]: `make install` into a scratch DESTDIR as a library user
# would use it. The files land where PREFIX says, the shared library carries
# its soname, pkg-config finds toy, and a program built from README.md's
# C example against the installed headers runs, linked both against
# libtoy.so (found by its soname) and statically. Then `make uninstall`
# leaves nothing of toy behind. Run by tests/test-install.c (make check).
set -euo pipefail
build=${1:?usage: check.sh BUILD [MAKEVAR=VALUE...]}
shift
cd "$(dirname "$0")/../.."
dest=$(mktemp -d /tmp/toy-install-XXXXXX)
trap 'rm -rf "$dest"' EXIT
fail() { echo "install check: $*" >&2; exit 1; }

# a nested make must not join the jobserver of a make that runs the tests
unset MAKEFLAGS MFLAGS MAKELEVEL
make -s --no-print-directory BUILD="$build" "$@" PREFIX=/opt/toy DESTDIR="$dest" install >/dev/null
root=$dest/opt/toy
version=$(sed -n 's/^#define TOY_VERSION "\(.*\)"/\1/p' include/toy/toy.h)
for f in bin/toy lib/libtoy.a "lib/libtoy.so.$version" lib/libtoy.so lib/pkgconfig/toy.pc \
         include/toy/toy.h include/toy/tensor.h; do
  [ -e "$root/$f" ] || fail "$f is not installed"
done
soname=$(readelf -d "$root/lib/libtoy.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ -n "$soname" ] || fail "libtoy.so has no soname"
[ "$(readlink "$root/lib/$soname")" = "libtoy.so.$version" ] || fail "lib/$soname does not name libtoy.so.$version"
"$root/bin/toy" --help >/dev/null || fail "the installed toy does not run"

export PKG_CONFIG_PATH=$root/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$dest
[ "$(pkg-config --modversion toy)" = "$version" ] || fail "pkg-config reports another version"
grep -q '^libdir=/opt/toy/lib$' "$root/lib/pkgconfig/toy.pc" || fail "toy.pc does not name PREFIX's libdir"

# README's example, word for word, inside main() (x's values set first)
cat > "$dest/app.c" <<'EOF'
#include <stdio.h>
#include <toy/toy.h>

int main(void) {
EOF
awk '/^```c$/ {on = 1; next} /^```$/ {on = 0} on && !/#include/' README.md > "$dest/example.c"
grep -q toy_graph_compute "$dest/example.c" || fail "README.md has no C example"
sed 's|toy_graph_compute(g, pool);|for (int i = 0; i < 512; i++) ((float *)x->data)[i] = 0.01f * (float)(i % 7);\n&|' \
  "$dest/example.c" | sed 's|^toy_threadpool_free(pool);|printf("%g\\n", (double)((float *)w->grad->data)[0]);\n&|' \
  >> "$dest/app.c"
echo 'return 0; }' >> "$dest/app.c"
# the sanitizer build's library needs the sanitizers' run time in the program
san=$(grep -o -- '-fsanitize=[^ ]*' "$root/lib/pkgconfig/toy.pc" | head -1 || true)
cc -std=c11 -Wall -Wextra -Werror $san -o "$dest/app-shared" "$dest/app.c" $(pkg-config --cflags --libs toy)
cc -std=c11 -Wall -Wextra -Werror $san -o "$dest/app-static" "$dest/app.c" $(pkg-config --cflags toy) \
  "$root/lib/libtoy.a" $(pkg-config --static --libs toy | sed 's/-ltoy//')
readelf -d "$dest/app-shared" | grep -q "NEEDED.*\[$soname\]" || fail "the program does not need $soname"
a=$(LD_LIBRARY_PATH=$root/lib ASAN_OPTIONS=detect_leaks=0 "$dest/app-shared") || fail "the shared-linked program failed"
b=$(ASAN_OPTIONS=detect_leaks=0 "$dest/app-static") || fail "the static program failed"
[ -n "$a" ] && [ "$a" = "$b" ] || fail "the two programs disagree: '$a' against '$b'"
awk -v g="$a" 'BEGIN { exit !(g != 0 && g == g) }' || fail "w's gradient is $a"

make -s --no-print-directory BUILD="$build" "$@" PREFIX=/opt/toy DESTDIR="$dest" uninstall >/dev/null
left=$(cd "$dest" && find opt -type f -o -type l)
[ -z "$left" ] || fail "uninstall left: $left"
echo "install check: ok ($soname, gradient $a)"
