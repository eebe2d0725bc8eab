#!/usr/bin/env bash
# Times the arrayjit bench workloads (benches/programs/*.json) and the same workloads in numpy
# and tinygrad (CPU device, clang backend), all f32 and single-threaded, in one run, and prints
# a table of arrayjit time, peer times and ratios, plus compile latency of one small kernel.
#
#   bash benches/peers/run.sh            (from the repo root or anywhere)
#
# Environment: RUNS (default 10), WARMUP (default 2), PYTHON (default python3; used to create
# the virtual environment benches/peers/.venv, where numpy, threadpoolctl and tinygrad are
# installed with pip). tinygrad's CPU device compiles with clang: without a `clang` on PATH
# (Debian: apt-get install clang) its column is empty and the reason is printed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
RUNS=${RUNS:-10}
WARMUP=${WARMUP:-2}
PYTHON=${PYTHON:-python3}
venv=$here/.venv
results=$here/results
rm -rf "$results"
mkdir -p "$results"

say() { printf '%s\n' "$*" >&2; }

# One thread everywhere (BLAS, OpenMP; tinygrad: THREADS=0 below).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

# --- the virtual environment -------------------------------------------------------------
if [[ ! -x $venv/bin/python ]]; then
    say "creating $venv"
    "$PYTHON" -m venv "$venv"
fi
py=$venv/bin/python
if ! "$py" -c 'import numpy, threadpoolctl' 2>/dev/null; then
    say "installing numpy and threadpoolctl"
    "$py" -m pip install -q --disable-pip-version-check numpy threadpoolctl >&2
fi
tinygrad_ok=1
if ! "$py" -c 'import tinygrad' 2>/dev/null; then
    say "installing tinygrad"
    if ! "$py" -m pip install -q --disable-pip-version-check tinygrad >"$results/pip-tinygrad.log" 2>&1; then
        tinygrad_ok=0
        echo "pip install tinygrad failed: $(tail -n 1 "$results/pip-tinygrad.log")" >"$results/tinygrad.err"
    fi
fi

# --- arrayjit ----------------------------------------------------------------------------
say "building arrayjit (cargo build --release)"
(cd "$root" && cargo build --release --quiet)
aj=$root/target/release/arrayjit
field() { # field JSON_LINE KEY: compile_ms or run_ms.median of an `arrayjit bench` line
    "$py" -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["compile_ms"] if sys.argv[2]=="compile" else d["run_ms"]["median"])' "$1" "$2"
}
median() { "$py" -c 'import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }

{
    printf '{'
    sep=
    for w in matmul_512 matmul_1024 fused_elementwise row_sums; do
        say "arrayjit bench $w"
        line=$("$aj" bench "$root/benches/programs/$w.json" --warmup "$WARMUP" --runs "$RUNS")
        say "  $line"
        printf '%s"%s": %s' "$sep" "$w" "$(field "$line" run)"
        sep=', '
    done
    printf '}\n'
} >"$results/arrayjit.json"

# --- compile latency ---------------------------------------------------------------------
small=$here/small_kernel.json
cold=() cached=() gcc=()
cache_dir=$(mktemp -d)
trap 'rm -rf "$cache_dir"' EXIT
say "compile latency (arrayjit bench $small, 5 times each)"
ARRAYJIT_CACHE_DIR=$cache_dir "$aj" bench "$small" --warmup 0 --runs 1 >/dev/null # warm the cache
for _ in 1 2 3 4 5; do
    cold+=("$(field "$(ARRAYJIT_CACHE=0 "$aj" bench "$small" --warmup 0 --runs 1)" compile)")
    cached+=("$(field "$(ARRAYJIT_CACHE_DIR=$cache_dir "$aj" bench "$small" --warmup 0 --runs 1)" compile)")
done
# gcc alone: the command arrayjit runs, on the C it generates for the small kernel.
cdir=$cache_dir/gcc
mkdir -p "$cdir"
"$aj" emit-c "$small" >"$cdir/small.c"
cp "$root/runtime_c/arrayjit.h" "$cdir/"
cc=${ARRAYJIT_CC:-${CC:-cc}}
for _ in 1 2 3 4 5; do
    t0=$(date +%s%N)
    (cd "$cdir" && "$cc" -O3 -march=native -std=gnu11 -shared -fPIC -I. -o libsmall.so small.c -lm)
    t1=$(date +%s%N)
    gcc+=("$(( (t1 - t0) / 1000 ))e-3")
done
say "  cold: ${cold[*]}; cached: ${cached[*]}; $cc alone: ${gcc[*]} (ms)"
printf '{"arrayjit_cold_ms": %s, "arrayjit_cached_ms": %s, "gcc_ms": %s}\n' \
    "$(median "${cold[@]}")" "$(median "${cached[@]}")" "$(median "${gcc[@]}")" >"$results/compile.json"

# --- numpy -------------------------------------------------------------------------------
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (set on some processors of this workplace for older
# OpenBLAS builds) slow a current numpy: unset both, for this command alone.
say "numpy"
if ! env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$py" "$here/peers.py" numpy --runs "$RUNS" --warmup "$WARMUP" \
    >"$results/numpy.json" 2>"$results/numpy.err"; then
    say "  numpy failed: $(tail -n 1 "$results/numpy.err")"
    rm -f "$results/numpy.json"
fi

# --- tinygrad ----------------------------------------------------------------------------
if [[ $tinygrad_ok == 1 ]]; then
    if ! command -v clang >/dev/null; then
        say "  note: no clang on PATH; tinygrad's CPU device needs it (Debian: apt-get install clang)"
    fi
    # Which variable selects the CPU device with the clang backend depends on the version:
    # DEV=CPU:CLANG or DEV=CPU (0.13+), CPU=1 (0.10-0.12), CLANG=1 (older). Probe them.
    tg_env=
    probe_err=
    for cand in DEV=CPU:CLANG DEV=CPU CPU=1 CLANG=1; do
        if out=$(env "$cand" THREADS=0 CACHELEVEL=0 "$py" -c '
from tinygrad import Device, Tensor
assert Device.DEFAULT.split(":")[0] in ("CPU", "CLANG"), Device.DEFAULT
assert (Tensor([1.0, 2.0]) * 2).tolist() == [2.0, 4.0]
' 2>&1); then
            tg_env=$cand
            break
        fi
        probe_err+="${probe_err:+; }$cand: $(printf '%s\n' "$out" | tail -n 1)"
    done
    if [[ -z $tg_env ]]; then
        hint=
        command -v clang >/dev/null || hint=" (no clang on PATH: tinygrad's CPU device compiles with it; Debian: apt-get install clang)"
        echo "tinygrad's CPU/clang device does not work here$hint; probes: $probe_err" >"$results/tinygrad.err"
        say "  tinygrad: $(cat "$results/tinygrad.err")"
    else
        say "tinygrad ($tg_env THREADS=0 CACHELEVEL=0)"
        if ! env "$tg_env" THREADS=0 CACHELEVEL=0 "$py" "$here/peers.py" tinygrad --runs "$RUNS" --warmup "$WARMUP" \
            >"$results/tinygrad.json" 2>"$results/tinygrad.err"; then
            say "  tinygrad failed: $(tail -n 1 "$results/tinygrad.err")"
            echo "tinygrad failed: $(tail -n 1 "$results/tinygrad.err")" >"$results/tinygrad.err"
            rm -f "$results/tinygrad.json"
        fi
    fi
fi

echo
"$py" "$here/peers.py" table --results "$results"
