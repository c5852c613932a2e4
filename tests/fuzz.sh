#!/bin/sh
# `make fuzz`: the fuzz harnesses as libFuzzer targets, with AddressSanitizer and
# UndefinedBehaviorSanitizer, each run for FUZZ_SECONDS (default 60).  Needs clang with
# libFuzzer (Debian: apt-get install clang); the normal build and `make check` do not.
#
# Everything goes to $WSYNC_BUILD_DIR/fuzz: the instrumented library objects, plugins
# (test plugins included) built as modules that take libwsync's symbols from the
# harness, one binary per target, the corpora (fuzz/corpus/TARGET, kept between runs,
# started from the seeds the make-check harnesses write), any crash
# (fuzz/crash-TARGET-*), and each target's TMPDIR (fuzz/tmp-TARGET: nothing goes to
# /tmp; removed after the run, which fails when a target that found nothing left
# anything in it).  FUZZ_TARGETS chooses targets (default: all of them):
#   safetensors index config conf record sync-args dcp-pickle dcp-metadata dcp-blob
#   dcp-shard dcp-dir
# Exit status: 0 when no target found anything, 1 otherwise.
set -eu
top=$WSYNC_SRC_DIR
build=$WSYNC_BUILD_DIR
seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-"safetensors index config conf record sync-args dcp-pickle dcp-metadata dcp-blob dcp-shard dcp-dir"}
cc=${FUZZ_CC:-clang}

if ! command -v "$cc" >/dev/null 2>&1; then
  echo "make fuzz: $cc not found; it needs clang with libFuzzer (Debian: apt-get install clang)" >&2
  exit 2
fi
out=$build/fuzz
mkdir -p "$out/obj" "$out/plugins" "$out/corpus" "$out/seeds"
pkgs="glib-2.0 gthread-2.0 json-glib-1.0 libconfuse libzip libxxhash"
san="-g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"
cflags="-std=c11 -I$top/include -I$build -I$top/core $(pkg-config --cflags $pkgs)
  -DWSYNC_PLUGIN_DIR=\"/nonexistent\" -DWSYNC_CONF_DIR=\"/nonexistent\""
libs="$(pkg-config --libs $pkgs) -lltdl -lm"

if [ -z "$WSYNC_LIB_SOURCES" ]; then
  echo "make fuzz: WSYNC_LIB_SOURCES is empty: Makefile.am must pass the library's sources" >&2
  exit 2
fi
echo "fuzz: building the instrumented library and plugins in $out"
objs=
for src in $WSYNC_LIB_SOURCES; do
  obj=$out/obj/$(basename "$src" .c).o
  # shellcheck disable=SC2086
  $cc $san -fsanitize=fuzzer-no-link -fPIC $cflags -c "$top/$src" -o "$obj"
  objs="$objs $obj"
done
for src in "$top"/plugins/*.c "$top"/tests/plugins/*.c; do
  # undefined wsync_* symbols resolve against the harness (linked -rdynamic); -z nodelete
  # keeps a closed plugin's coverage counters mapped, where libFuzzer still reads them
  # shellcheck disable=SC2086
  $cc $san -fsanitize=fuzzer-no-link -fPIC -shared -Wl,-z,nodelete $cflags "$src" \
    -o "$out/plugins/$(basename "$src" .c).so"
done

build_target() { # NAME SOURCE EXTRA-FLAGS...
  name=$1 src=$2
  shift 2
  # shellcheck disable=SC2086
  $cc $san -fsanitize=fuzzer $cflags -DWSYNC_LIBFUZZER "$@" "$src" $objs -rdynamic $libs \
    -o "$out/fuzz-$name"
}

export G_TEST_SRCDIR="$top/tests" G_SLICE=always-malloc G_DEBUG=gc-friendly
export WSYNC_TEST_PLUGIN_DIR="$out/plugins" WSYNC_TEST_BUILT_PLUGIN_DIR="$out/plugins"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
status=0
for t in $targets; do
  mkdir -p "$out/corpus/$t" "$out/seeds/$t"
  case $t in
  dcp-dir) # tests/fuzz-dcp-dir.c, a harness of fuzz-driver.h like those below
    build_target "$t" "$top/tests/fuzz-$t.c"
    "$build/tests/fuzz-$t" --write-seeds "$out/seeds/$t"
    ;;
  record) # the commit record's parser is the Python module's (python/record.c)
    build_target "$t" "$top/tests/fuzz-$t.c" "$top/python/record.c"
    "$build/tests/fuzz-$t" --write-seeds "$out/seeds/$t"
    ;;
  dcp-*)
    d=${t#dcp-}
    build_target "$t" "$top/tests/fuzz-dcp.c" "-DWSYNC_FUZZ_TARGET=\"$d\""
    cp "$top"/tests/data/dcp-fuzz-seeds/"$d"-* "$out/seeds/$t/"
    ;;
  *)
    build_target "$t" "$top/tests/fuzz-$t.c"
    "$build/tests/fuzz-$t" --write-seeds "$out/seeds/$t"
    ;;
  esac
  echo "fuzz: $t for $seconds s"
  # the target's work directories go to a TMPDIR of its own, never /tmp: a crash ends the
  # target with _Exit(), past its teardown, and that TMPDIR is removed whatever happened;
  # after a run that found nothing it must be empty (the harness cleaned up at exit)
  tmp=$out/tmp-$t
  rm -rf "$tmp"
  mkdir -p "$tmp"
  if ! TMPDIR=$tmp "$out/fuzz-$t" -max_total_time="$seconds" -timeout=60 -rss_limit_mb=4096 \
      -print_final_stats=1 -artifact_prefix="$out/crash-$t-" \
      "$out/corpus/$t" "$out/seeds/$t" >"$out/$t.log" 2>&1; then
    echo "fuzz: $t FOUND SOMETHING: see $out/$t.log and $out/crash-$t-*" >&2
    status=1
  elif [ -n "$(ls -A "$tmp")" ]; then
    echo "fuzz: $t left in its TMPDIR: $(ls -A "$tmp" | tr '\n' ' ')" >&2
    status=1
  fi
  rm -rf "$tmp"
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$out/$t.log" | sed "s/^/fuzz: $t: /"
done
exit $status
