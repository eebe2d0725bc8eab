#!/usr/bin/env bash
# Fuzzing campaigns: the differential test (tests/differential.rs) on new seeds, across C
# compilers, targets and sanitizers. Every case is a random program compiled with the
# optimizer on and off and compared with the reference interpreter (see the test's docs).
#
# Usage: scripts/fuzz.sh [--cases N] [--seed S] [--chunk K] [--configs LIST] [--log DIR]
#   --cases N    cases per configuration (default 1000)
#   --seed S     base seed (default: derived from the current commit, printed); config number
#                c (0, 1, ...) uses seeds S + c * 10^9 + i, so configurations see different
#                programs and every failing case is replayable on its own
#   --chunk K    cases per test process (default 500): a crash loses one chunk, not the run
#   --configs    comma-separated, from:
#                  gcc, clang            -march=native (the default flags)
#                  gcc-v2, clang-v2      ARRAYJIT_ARCH_FLAGS=-march=x86-64-v2 (no AVX)
#                  gcc-san, clang-san    -fsanitize=address,undefined -fno-sanitize-recover=all
#                                        (the sanitizer runtimes preloaded into the test)
#                (default: gcc,clang,gcc-v2,clang-v2)
#   --log DIR    keep every chunk's output there (default: a temporary directory, removed)
# Prints one line per chunk and a summary: cases, failures and the command that replays each
# failing chunk. Exits non-zero on any failure (a mismatch, a crash, a sanitizer report, a
# bounds violation in checked mode).
set -uo pipefail
cd "$(dirname "$0")/.."

cases=1000
seed=""
chunk=500
configs="gcc,clang,gcc-v2,clang-v2"
log=""
while (($#)); do
  case "$1" in
    --cases) cases=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --chunk) chunk=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    --log) log=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "fuzz.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in cases chunk; do
  if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then
    echo "fuzz.sh: --$v must be a positive whole number, not '${!v}'" >&2; exit 2
  fi
done
if [ -z "$seed" ]; then
  # The first 8 hexadecimal digits of the commit: a new seed for every commit.
  head=$(git rev-parse HEAD 2>/dev/null || echo 0)
  seed=$((16#${head:0:8}))
fi
if ! [[ $seed =~ ^[0-9]+$ ]]; then
  echo "fuzz.sh: --seed must be a whole number, not '$seed'" >&2; exit 2
fi
if [ -z "$log" ]; then
  log=$(mktemp -d)
  trap 'rm -rf "$log"' EXIT
else
  mkdir -p "$log"
fi

echo "fuzz: base seed $seed, $cases cases per configuration, configurations $configs"
cargo test --test differential --no-run --quiet 2>/dev/null || cargo test --test differential --no-run || exit 1
bin=$(cargo test --test differential --no-run --message-format=json 2>/dev/null |
      sed -n 's/.*"executable":"\([^"]*differential-[^"]*\)".*/\1/p' | tail -1)
if [ ! -x "$bin" ]; then
  echo "fuzz.sh: cannot find the differential test binary" >&2; exit 1
fi

# The sanitizer runtimes of compiler $1, for LD_PRELOAD.
runtimes() {
  case "$1" in
    gcc) echo "$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" ;;
    # Clang's AddressSanitizer runtime contains UndefinedBehaviorSanitizer's (preloading
    # ubsan_standalone beside it fails at start-up).
    clang) clang -print-file-name=libclang_rt.asan-x86_64.so ;;
  esac
}

failures=0
total=0
c=0
IFS=, read -ra list <<<"$configs"
for cfg in "${list[@]}"; do
  cc=${cfg%%-*}
  env_cfg=(ARRAYJIT_CC="$cc" ARRAYJIT_CACHE=0)
  case "$cfg" in
    gcc|clang) ;;
    gcc-v2|clang-v2) env_cfg+=(ARRAYJIT_ARCH_FLAGS=-march=x86-64-v2) ;;
    gcc-san|clang-san)
      rt=$(runtimes "$cc")
      for f in $rt; do
        [ -e "$f" ] || { echo "fuzz.sh: $cc has no sanitizer runtime $f" >&2; exit 2; }
      done
      env_cfg+=(
        ARRAYJIT_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
        LD_PRELOAD="$rt"
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:exitcode=86"
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=87"
      ) ;;
    *) echo "fuzz.sh: unknown configuration '$cfg' (see --help)" >&2; exit 2 ;;
  esac
  command -v "$cc" >/dev/null || { echo "fuzz.sh: $cc is not installed" >&2; exit 2; }
  base=$((seed + c * 1000000000))
  done_cases=0
  start=$(date +%s)
  while ((done_cases < cases)); do
    n=$((cases - done_cases < chunk ? cases - done_cases : chunk))
    s=$((base + done_cases))
    out="$log/$cfg-$s.log"
    replay="env$(printf ' %q' "${env_cfg[@]}") ARRAYJIT_FUZZ_SEED=$s ARRAYJIT_FUZZ_CASES=$n $bin differential_random_programs --nocapture"
    if env "${env_cfg[@]}" ARRAYJIT_FUZZ_SEED="$s" ARRAYJIT_FUZZ_CASES="$n" \
         "$bin" differential_random_programs --nocapture >"$out" 2>&1; then
      echo "ok      $cfg seeds $s..$((s + n - 1))"
    else
      rc=$?
      echo "FAILED  $cfg seeds $s..$((s + n - 1)) (exit $rc)"
      grep -E "differential mismatch|failing seeds|SUMMARY|runtime error|signal|panicked" "$out" | head -20
      echo "  replay: $replay"
      failures=$((failures + 1))
    fi
    done_cases=$((done_cases + n))
  done
  total=$((total + cases))
  echo "        $cfg: $cases cases in $(($(date +%s) - start)) s"
  c=$((c + 1))
done
echo "fuzz: $total cases, $failures failing chunks (base seed $seed)"
[ "$failures" -eq 0 ]
