#!/usr/bin/env bash
# The embedding contract end to end, as a user outside this tree meets it: install the existing
# build into a temporary DESTDIR (nothing is rebuilt), then compile examples/embed_c (C99) and
# examples/embed_cpp (C++17) with warnings as errors against the installed headers and library,
# located by `pkg-config --cflags --libs tessera` and nothing else, run both on the shipped
# example model and compare them with PyTorch's output and with each other. Also checks what was
# installed: the headers, the CLI, libtessera.so's soname, and that it exports exactly the
# functions tessera.h declares. Runs in about 5 s (two small compiles); needs no network.
#   tests/install_test.sh BUILD_DIR SOURCE_DIR
# meson sets CC, CXX (the project's compilers) and SANITIZE (b_sanitize: sanitized libraries need
# the sanitizer runtime linked into the program too).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
CC=${CC:-cc}
CXX=${CXX:-c++}
SANITIZE=${SANITIZE:-none}

fail() {
  echo "install_test: FAIL: $*" >&2
  exit 1
}

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera_install_test.XXXXXX")
trap 'rm -rf "$work"' EXIT
dest=$work/root

meson install -C "$build" --destdir "$dest" --no-rebuild --quiet >/dev/null

# ---- what was installed
pc=$(find "$dest" -path '*/pkgconfig/tessera.pc' | head -n 1)
[ -n "$pc" ] || fail "no pkgconfig/tessera.pc under $dest"
lib=$(find "$dest" -name 'libtessera.so.0' | head -n 1)
[ -n "$lib" ] || fail "no libtessera.so.0 under $dest"
libdir=$(dirname "$lib")
[ -L "$libdir/libtessera.so" ] || fail "no libtessera.so development symlink in $libdir"
include=$(find "$dest" -type d -path '*/include/tessera' | head -n 1)
for h in tessera.h tessera.hpp version.h; do
  [ -f "$include/$h" ] || fail "header tessera/$h not installed"
done
cli=$(find "$dest" -path '*/bin/tessera' | head -n 1)
[ -n "$cli" ] || fail "the tessera CLI was not installed"

soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libtessera.so.0" ] || fail "soname is '$soname', expected libtessera.so.0"

# Exported symbols == functions declared with TESSERA_API. nm -D shows versioned names
# (tessera_version@@TESSERA_0) and the version node itself (TESSERA_0).
exported=$(nm -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' | grep -vx 'TESSERA_0' |
           sort)
declared=$(grep -oE 'TESSERA_API [^(]*[^a-z0-9_]tessera_[a-z0-9_]+\(' "$include/tessera.h" |
           grep -oE 'tessera_[a-z0-9_]+\($' | tr -d '(' | sort)
[ -n "$declared" ] || fail "found no TESSERA_API declarations in tessera.h"
if [ "$exported" != "$declared" ]; then
  diff <(echo "$declared") <(echo "$exported") >&2 || true
  fail "libtessera.so exports other symbols than tessera.h declares (< declared, > exported)"
fi

# ---- build the examples as an outside user does
export PKG_CONFIG_PATH=$(dirname "$pc")
# The .pc file names the real prefix (/usr/local/...); the files sit under $dest.
export PKG_CONFIG_SYSROOT_DIR=$dest
flags=$(pkg-config --cflags --libs tessera)
cflags=$(pkg-config --cflags tessera)
libs=$(pkg-config --libs tessera)
san=()
[ "$SANITIZE" != "none" ] && san=("-fsanitize=$SANITIZE")
# A C program: compiled as C99, linked by the C driver, as a user does. Against a sanitized
# library it is linked by the C++ driver instead: the library's UBSan checks of C++ code (vptr)
# need the sanitizer runtime's C++ part, which clang links only for C++.
build_c() {
  # shellcheck disable=SC2086  # CC/CXX and the pkg-config flags are word lists
  $CC -std=c99 -Wall -Wextra -Wpedantic -Werror "${san[@]}" $cflags -c "$1" -o "$2.o"
  if [ "$SANITIZE" = "none" ]; then
    # shellcheck disable=SC2086
    $CC "$2.o" $libs -o "$2"
  else
    # shellcheck disable=SC2086
    $CXX "${san[@]}" "$2.o" $libs -o "$2"
  fi
}
build_c "$src/examples/embed_c/main.c" "$work/embed_c"
# shellcheck disable=SC2086
$CXX -std=c++17 -Wall -Wextra -Wpedantic -Werror "${san[@]}" "$src/examples/embed_cpp/main.cpp" \
  $flags -o "$work/embed_cpp"
build_c "$src/examples/generate_c/main.c" "$work/generate_c"

# ---- run them against the installed library only
export LD_LIBRARY_PATH=$libdir
resolved=$(ldd "$work/embed_c" | awk '/libtessera/ {print $3}')
[ "$resolved" = "$libdir/libtessera.so.0" ] ||
  fail "embed_c loads libtessera from '$resolved', not the installed $libdir"

ex=$src/examples/encoder
"$work/embed_c" "$ex/encoder.safetensors" "$ex/input.safetensors" "$ex/expected.safetensors" \
  >"$work/c.out" || { cat "$work/c.out" >&2; fail "embed_c failed"; }
"$work/embed_cpp" "$ex/encoder.safetensors" "$ex/input.safetensors" "$ex/expected.safetensors" \
  >"$work/cpp.out" || { cat "$work/cpp.out" >&2; fail "embed_cpp failed"; }
cat "$work/c.out" "$work/cpp.out"
c_sum=$(grep 'checksum' "$work/c.out")
cpp_sum=$(grep 'checksum' "$work/cpp.out")
[ -n "$c_sum" ] || fail "embed_c printed no checksum"
[ "$c_sum" = "$cpp_sum" ] || fail "the C and C++ examples disagree: '$c_sum' vs '$cpp_sum'"

# Generation: the C example's greedy text equals the installed CLI's ids read as ASCII (the
# fortunes model's ids are character codes), prompt included.
fortunes=$src/examples/fortunes/fortunes.safetensors
prompt='The best way to'
"$work/generate_c" "$fortunes" "$prompt" 60 >"$work/gen_c.out" ||
  { cat "$work/gen_c.out" >&2; fail "generate_c failed"; }
ids=$(printf '%s' "$prompt" | od -An -tu1 | tr -s ' \n' ',' | sed 's/^,//; s/,$//')
cli_text=$("$cli" generate "$fortunes" --prompt-ids "$ids" --max-new-tokens 60 |
           awk '{ for (i = 1; i <= NF; i++) printf "%c", $i }')
[ "$(cat "$work/gen_c.out")" = "$prompt$cli_text" ] ||
  fail "generate_c printed '$(cat "$work/gen_c.out")', the CLI generated '$prompt$cli_text'"
echo "generate_c: $(head -c 120 "$work/gen_c.out" | tr '\n' ' ')"

version=$("$cli" --version)
[ "$version" = "tessera $(sed -n 's/^#define TESSERA_VERSION_STRING "\(.*\)"/\1/p' \
  "$include/version.h")" ] || fail "installed CLI says '$version'"

echo "install_test: OK ($(echo "$declared" | wc -l) C functions exported; $soname; $version)"
