#!/usr/bin/env bash
# Memory safety of generated code.
#  1. The example programs and the test suite, with every generated routine compiled with
#     -fsanitize=address,undefined (ARRAYJIT_CFLAGS); the sanitizer runtime is preloaded into
#     the (uninstrumented) Rust processes that load the routines.
#  2. `arrayjit run` on every example program under valgrind memcheck (routines compiled
#     without -march=native, which valgrind cannot decode).
# Prints a summary and exits non-zero on any finding.
set -uo pipefail
cd "$(dirname "$0")/.."

cc=${ARRAYJIT_CC:-${CC:-cc}}
asan_rt=$("$cc" -print-file-name=libasan.so)
ubsan_rt=$("$cc" -print-file-name=libubsan.so)
if [ ! -e "$asan_rt" ]; then
  echo "sanitize: $cc has no AddressSanitizer runtime (libasan.so); install libasan for it" >&2
  exit 2
fi
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
findings=0

export ARRAYJIT_CACHE=0
san_env=(
  ARRAYJIT_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g"
  LD_PRELOAD="$asan_rt $ubsan_rt"
  ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:exitcode=86:log_path=$log/asan"
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=87:log_path=$log/ubsan"
)

echo "== building"
cargo build --release --quiet || exit 1
cargo test --release --no-run --quiet 2>/dev/null || cargo test --release --no-run || exit 1

echo "== example programs with -fsanitize=address,undefined"
for p in examples/programs/*.json; do
  if env "${san_env[@]}" target/release/arrayjit run "$p" >/dev/null 2>"$log/err"; then
    echo "ok      $p"
  else
    echo "FINDING $p"; cat "$log/err"; findings=$((findings + 1))
  fi
done

echo "== test suite's generated code with -fsanitize=address,undefined"
# The test binaries themselves are Rust; their generated C is instrumented.
for t in $(cargo test --release --no-run --message-format=json 2>/dev/null |
           grep '"profile":{[^}]*"test":true' |
           sed -n 's/.*"executable":"\([^"]*\)".*/\1/p'); do
  name=$(basename "$t")
  case "$name" in compile-*|compiler_env-*) continue ;; esac  # these set their own flags
  if env "${san_env[@]}" "$t" --test-threads=2 -q >"$log/out" 2>&1; then
    echo "ok      $name ($(grep -o '[0-9]* passed' "$log/out" | head -1))"
  else
    echo "FINDING $name"; tail -40 "$log/out"; findings=$((findings + 1))
  fi
done
for f in "$log"/asan* "$log"/ubsan*; do
  [ -e "$f" ] || continue
  echo "FINDING sanitizer report $f:"; head -40 "$f"; findings=$((findings + 1))
done

echo "== example programs under valgrind memcheck"
if command -v valgrind >/dev/null; then
  for p in examples/programs/*.json; do
    if ARRAYJIT_ARCH_FLAGS="" valgrind -q --error-exitcode=99 --leak-check=no \
         target/release/arrayjit run "$p" >/dev/null 2>"$log/vg"; then
      echo "ok      $p"
    else
      echo "FINDING $p"; cat "$log/vg"; findings=$((findings + 1))
    fi
  done
else
  echo "valgrind not installed: apt-get install valgrind"; findings=$((findings + 1))
fi

echo "sanitize: $findings findings"
[ "$findings" -eq 0 ]
