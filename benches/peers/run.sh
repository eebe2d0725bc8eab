#!/usr/bin/env bash
# arrayjit beside its peers, in one run, printing tables with speed ratios (above 1x: arrayjit
# is faster):
#
# 1. Kernels (benches/programs/*.json, timed by `arrayjit bench`) and the same workloads in
#    numpy (OpenBLAS) and tinygrad (CPU device, clang backend), one thread each: f32 matmul
#    512^3 and 1024^3, the transposed matmul a@b.T (ij,kj->ik) 768^3, the batched matmul
#    16x128^3 (bij,bjk->bik), the f64 matmul 1024^3, a fused elementwise chain on 2^24 f32
#    and the row sums of a 4096x4096 f32 matrix; the same in ONNX Runtime (pip onnxruntime:
#    its MLAS kernels are what deployed CPU inference uses), plus the convolutions and pooling
#    of the wider language (3x3 1x56x56x64->64 padding 1, 3x3 stride 2 1x28x28x128->256,
#    depthwise 3x3 1x56x56x128, 2x2 max-pool 1x112x112x64) and a bf16 matmul 1024^3 (bf16
#    inputs, f32 result; numpy's column is its f32 matmul), and softmax and layer norm over the
#    rows of 4096x1024 f32 (ONNX Runtime's Softmax and LayerNormalization kernels).
# 2. The big moons training job (MLP 2-256-256-1, hinge loss, SGD with arrayjit's decaying
#    learning rate and weight decay, batch 2048, 24576 points, 3 epochs) against the same job
#    in JAX (benches/peers/moons_jax.py: one jax.jit-compiled step), in samples/s: on one core
#    (arrayjit --devices 1 vs JAX single-threaded, both pinned to one CPU with taskset) and on
#    both cores (arrayjit --devices 2 vs JAX with its default threads); and the compile
#    latency of the moons job (arrayjit cold compile_batch vs JAX's jit of the step).
# 3. Compile latency of one small kernel: arrayjit cold (fresh cache directory) and cached,
#    the C compiler alone on the same C with arrayjit's exact command, and the first call of
#    the same kernel in tinygrad and JAX.
# 4. Compile scaling: the cold compile of a routine of N chained statements over 64x64
#    tensors (a matmul every 50; peers.py chain), N in CHAIN_NS (default 10 100 1000 3000).
#
#   bash benches/peers/run.sh            (from the repo root or anywhere)
#
# Environment: THREADS (default: the CPUs this process may use) for the all-cores table of
# matmul 2048^3, the 3x3 convolution, softmax, layer norm, row sums and the fused chain;
# RUNS (default 10) and WARMUP (default 2) for the kernels, timed in ROUNDS
# (default 3) rounds that interleave the peers (each peer's best round counts); REPEAT
# (default 5) rounds of the moons processes (arrayjit and JAX in turn, medians count); PYTHON (default python3) creates the virtual
# environment benches/peers/.venv, where numpy, threadpoolctl, tinygrad, jax[cpu], onnx and onnxruntime are
# installed with pip. A peer that cannot be installed or fails leaves its cells empty ("-")
# and its reason is printed under the table; the script still finishes. tinygrad's CPU
# device compiles with clang (Debian: apt-get install clang). Raw results: benches/peers/results.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
RUNS=${RUNS:-10}
WARMUP=${WARMUP:-2}
REPEAT=${REPEAT:-5}
ROUNDS=${ROUNDS:-3}
PYTHON=${PYTHON:-python3}
venv=$here/.venv
results=$here/results
rm -rf "$results"
mkdir -p "$results"

say() { printf '%s\n' "$*" >&2; }
last_line() { tail -n 1 "$1" 2>/dev/null | cut -c1-400; }

# One thread everywhere for the kernels (BLAS, OpenMP; tinygrad: THREADS=0 below).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# --- the virtual environment -------------------------------------------------------------
if [[ ! -x $venv/bin/python ]]; then
    say "creating $venv"
    "$PYTHON" -m venv "$venv"
fi
py=$venv/bin/python
pip_install() { # pip_install NAME MODULE SPEC...: installs unless MODULE imports; 1 on failure
    local name=$1 module=$2
    shift 2
    "$py" -c "import $module" 2>/dev/null && return 0
    say "installing $*"
    if ! "$py" -m pip install -q --disable-pip-version-check "$@" >"$results/pip-$name.log" 2>&1; then
        echo "pip install $* failed: $(last_line "$results/pip-$name.log")" >"$results/$name.err"
        say "  $(cat "$results/$name.err")"
        return 1
    fi
}
numpy_ok=1 tinygrad_ok=1 jax_ok=1 ort_ok=1
pip_install numpy numpy numpy || numpy_ok=0
pip_install threadpoolctl threadpoolctl threadpoolctl || true
pip_install tinygrad tinygrad tinygrad || tinygrad_ok=0
pip_install jax jax 'jax[cpu]' || jax_ok=0
pip_install onnx onnx onnx || ort_ok=0
pip_install onnxruntime onnxruntime onnxruntime || ort_ok=0
# The table needs only the standard library; the helpers below need numpy or nothing.

# --- arrayjit ----------------------------------------------------------------------------
say "building arrayjit (cargo build --release --bin arrayjit --example moons)"
(cd "$root" && cargo build --release --quiet --bin arrayjit --example moons)
aj=$root/target/release/arrayjit
moons=$root/target/release/examples/moons
field() { # field JSON_LINE KEY: compile_ms or run_ms.median of an `arrayjit bench` line
    "$py" -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["compile_ms"] if sys.argv[2]=="compile" else d["run_ms"]["median"])' "$1" "$2"
}

pin=
if command -v taskset >/dev/null && taskset -c 0 true 2>/dev/null; then
    pin="taskset -c 0"
fi
xla_1thread="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
# What arrayjit uses by default: the CPUs this process may run on (nproc would read OMP_NUM_THREADS).
compile_jobs=${ARRAYJIT_COMPILE_JOBS:-$("$py" -c 'import os; print(len(os.sched_getaffinity(0)))' 2>/dev/null || echo '?')}
cc=${ARRAYJIT_CC:-${CC:-cc}}
# The all-cores rounds: this many threads each side (default: the CPUs this process may use).
THREADS=${THREADS:-$("$py" -c 'import os; print(len(os.sched_getaffinity(0)))')}
"$py" - "$results/meta.json" "$RUNS" "$WARMUP" "$REPEAT" "$ROUNDS" "$pin" "$xla_1thread" "$compile_jobs" \
    "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(uptime | sed 's/.*load average/load average/')" \
    "$("$cc" --version 2>/dev/null | head -n 1)" "$(rustc --version 2>/dev/null)" \
    "$(clang --version 2>/dev/null | head -n 1)" "$THREADS" <<'EOF'
import json, sys
out, runs, warmup, repeat, rounds, pin, xla, jobs, date, load, cc, rustc, clang, threads = sys.argv[1:]
cpu = "?"
try:
    with open("/proc/cpuinfo") as f:
        models = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
        f.seek(0)
        flags = next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
    isa = [x for x in ("avx2", "fma", "avx512f", "avx512_fp16") if x in flags]
    if models:
        cpu = f"{models[0]} x {len(models)} ({', '.join(isa) or 'no AVX2'})"
except OSError:
    pass
json.dump({"runs": int(runs), "warmup": int(warmup), "repeat": int(repeat),
           "rounds": int(rounds), "pin": pin, "threads": int(threads),
           "xla_1thread": f"XLA_FLAGS={xla}", "compile_jobs": jobs, "date": date,
           "cpu": f"{cpu}; {load} at start", "cc": cc, "rustc": rustc,
           "clang (tinygrad)": clang,
           "moons_big": "2-256-256-1, batch 2048, 24576 points, 3 epochs",
           "moons_small": "2-16-16-1, batch 120, 2400 points, 20 epochs"}, open(out, "w"))
EOF

# --- tinygrad's device ---------------------------------------------------------------------
tg_env=
if [[ $tinygrad_ok == 1 ]]; then
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
    fi
fi

# --- kernels: ROUNDS rounds of arrayjit, numpy, tinygrad, interleaved ----------------------
# On a shared machine, another process's work hits whichever peer runs at that moment;
# interleaving the peers and keeping each one's best round keeps that from deciding a ratio.
one_thread_workloads="matmul_512 matmul_1024 matmul_t_768 batched_matmul_16x128 matmul_f64_1024
    fused_elementwise row_sums conv3x3_56x64 conv3x3s2_28x128 dwconv3x3_56x128 maxpool2x2_112x64
    matmul_bf16_1024 softmax_4096x1024 layernorm_4096x1024"
all_cores_workloads="matmul_2048 conv3x3_56x64 softmax_4096x1024 layernorm_4096x1024 row_sums
    fused_elementwise"
kernels_round() { # kernels_round R THREADS: one round on THREADS threads each side
    local r=$1 threads=$2 w line sep= tag= list=$one_thread_workloads
    if [[ $threads != 1 ]]; then
        tag=-all list=$all_cores_workloads
    fi
    {
        printf '{'
        for w in $list; do
            if line=$("$aj" bench "$root/benches/programs/$w.json" --threads "$threads" \
                --warmup "$WARMUP" --runs "$RUNS" 2>"$results/arrayjit$tag-$w.err"); then
                say "  arrayjit $w: $line"
                printf '%s"%s": %s' "$sep" "$w" "$(field "$line" run)"
                sep=', '
            else
                say "  arrayjit $w failed: $(last_line "$results/arrayjit$tag-$w.err")"
            fi
        done
        printf '}\n'
    } >"$results/arrayjit$tag-$r.json"
    # OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (set on some processors of this workplace for
    # older OpenBLAS builds) slow a current numpy: unset both, for this command alone.
    if [[ $numpy_ok == 1 ]]; then
        say "  numpy"
        # shellcheck disable=SC2086 # the workload list splits into words
        if ! env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" \
            "$py" "$here/peers.py" numpy --runs "$RUNS" --warmup "$WARMUP" --threads "$threads" \
            --only $list >"$results/numpy$tag-$r.json" 2>"$tmp/numpy.err"; then
            say "  numpy failed: $(last_line "$tmp/numpy.err")"
            echo "numpy failed: $(last_line "$tmp/numpy.err")" >"$results/numpy$tag.err"
            rm -f "$results/numpy$tag-$r.json"
        fi
    fi
    if [[ $ort_ok == 1 ]]; then
        say "  onnxruntime"
        # shellcheck disable=SC2086
        if ! "$py" "$here/peers.py" onnxruntime --runs "$RUNS" --warmup "$WARMUP" \
            --threads "$threads" --only $list >"$results/onnxruntime$tag-$r.json" \
            2>"$tmp/onnxruntime.err"; then
            say "  onnxruntime failed: $(last_line "$tmp/onnxruntime.err")"
            echo "onnxruntime failed: $(last_line "$tmp/onnxruntime.err")" >"$results/onnxruntime$tag.err"
            rm -f "$results/onnxruntime$tag-$r.json"
        fi
    fi
    if [[ -n $tg_env && $threads == 1 ]]; then
        say "  tinygrad ($tg_env THREADS=0 CACHELEVEL=0)"
        if ! env "$tg_env" THREADS=0 CACHELEVEL=0 "$py" "$here/peers.py" tinygrad --runs "$RUNS" \
            --warmup "$WARMUP" >"$results/tinygrad-$r.json" 2>"$tmp/tinygrad.err"; then
            say "  tinygrad failed: $(last_line "$tmp/tinygrad.err")"
            echo "tinygrad failed: $(last_line "$tmp/tinygrad.err")" >"$results/tinygrad.err"
            rm -f "$results/tinygrad-$r.json"
        fi
    fi
}
for r in $(seq "$ROUNDS"); do
    say "kernels, one thread, round $r of $ROUNDS"
    kernels_round "$r" 1
done
for r in $(seq "$ROUNDS"); do
    say "kernels, all cores ($THREADS threads), round $r of $ROUNDS"
    kernels_round "$r" "$THREADS"
done

# --- compile latency of a small kernel ---------------------------------------------------
small=$here/small_kernel.json
cold=() off=() cached=()
say "compile latency (arrayjit bench $small, 5 times each)"
for i in 1 2 3 4 5; do
    dir=$tmp/small-cache-$i # a fresh cache directory: a cold compile, then a cached one
    cold+=("$(field "$(ARRAYJIT_CACHE_DIR=$dir "$aj" bench "$small" --warmup 0 --runs 1)" compile)")
    cached+=("$(field "$(ARRAYJIT_CACHE_DIR=$dir "$aj" bench "$small" --warmup 0 --runs 1)" compile)")
    off+=("$(field "$(ARRAYJIT_CACHE=0 "$aj" bench "$small" --warmup 0 --runs 1)" compile)")
done
# The compiler alone: arrayjit's exact command (ARRAYJIT_DEBUG_DIR keeps it, with the C).
dbg=$tmp/debug
ARRAYJIT_CACHE=0 ARRAYJIT_DEBUG_DIR=$dbg "$aj" bench "$small" --warmup 0 --runs 1 >/dev/null
"$py" "$here/peers.py" time-cmd --cmd-file "$dbg/small.cmd" --runs 5 >"$tmp/gcc.json"
say "  cold: ${cold[*]}; cache off: ${off[*]}; cached: ${cached[*]}; compiler alone: $(cat "$tmp/gcc.json")"
"$py" - "$tmp/gcc.json" "${cold[*]}" "${off[*]}" "${cached[*]}" >"$results/compile.json" <<'EOF'
import json, sys
gcc = json.load(open(sys.argv[1]))
nums = lambda s: [float(x) for x in s.split()]
print(json.dumps({"arrayjit_cold_ms": nums(sys.argv[2]), "arrayjit_cache_off_ms": nums(sys.argv[3]),
                  "arrayjit_cached_ms": nums(sys.argv[4]), "gcc_ms": gcc["ms"], "gcc_cmd": gcc["cmd"]}))
EOF

# --- compile scaling: the N-statement chain ----------------------------------------------
# `peers.py chain --n N` (64x64 f32 statements, a matmul every 50), compiled cold with a
# fresh cache directory; CHAIN_NS (default "10 100 1000 3000") lists the sizes.
say "compile scaling (the N-statement chain, cold)"
: >"$results/chain.jsonl"
for n in ${CHAIN_NS:-10 100 1000 3000}; do
    "$py" "$here/peers.py" chain --n "$n" >"$tmp/chain-$n.json"
    if line=$(ARRAYJIT_CACHE_DIR=$tmp/chain-cache-$n "$aj" bench "$tmp/chain-$n.json" \
        --warmup 0 --runs 1 2>"$results/chain-$n.err"); then
        echo "{\"n\": $n, \"compile_ms\": $(field "$line" compile)}" >>"$results/chain.jsonl"
        say "  N=$n: $(field "$line" compile) ms"
    else
        say "  N=$n failed: $(last_line "$results/chain-$n.err")"
    fi
done

# --- moons: arrayjit and JAX, interleaved -------------------------------------------------
big=(--hidden 256 --batch 2048 --epochs 3 --points 24576 --no-plot)
moons_run() { # moons_run CONFIG COLD(0|1) CACHE_DIR [PREFIX...] -- ARGS...: one moons process
    local config=$1 cold=$2 dir=$3
    shift 3
    local prefix=()
    while [[ $1 != -- ]]; do prefix+=("$1"); shift; done
    shift
    local log=$results/moons-$config.log flag=()
    [[ $cold == 1 ]] && flag=(--cold)
    if ARRAYJIT_CACHE_DIR=$dir ${prefix[@]+"${prefix[@]}"} "$moons" "$@" >"$log.tmp" 2>&1 &&
        "$py" "$here/peers.py" moons-line --config "$config" ${flag[@]+"${flag[@]}"} \
            <"$log.tmp" >>"$results/moons_arrayjit.jsonl" 2>>"$results/moons_arrayjit.err"; then
        say "  $config: $(grep 'samples/s' "$log.tmp")"
    else
        say "  $config failed: $(last_line "$log.tmp")"
        echo "$config: $(last_line "$log.tmp")" >>"$results/moons_arrayjit.err"
    fi
    cat "$log.tmp" >>"$log"
    rm -f "$log.tmp"
}
jax_run() { # jax_run NAME ENV_PREFIX... -- ARGS...: one moons_jax.py process per call
    [[ $jax_ok == 1 ]] || return 0
    local name=$1
    shift
    local prefix=()
    while [[ $1 != -- ]]; do prefix+=("$1"); shift; done
    shift
    # JAX's own thread pools ignore these; unset the kernels' variables anyway.
    if env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS -u MKL_NUM_THREADS ${prefix[@]+"${prefix[@]}"} \
        "$py" "$here/moons_jax.py" "$@" >>"$results/jax_moons_$name.jsonl" 2>"$tmp/jax.err"; then
        say "  jax $name: $(tail -n 1 "$results/jax_moons_$name.jsonl" | cut -c1-300)"
    else
        say "  jax $name failed: $(last_line "$tmp/jax.err")"
        echo "failed: $(last_line "$tmp/jax.err")" >"$results/jax_moons_$name.err"
    fi
}
: >"$results/moons_arrayjit.jsonl"
# The cold compile of the big job, not pinned (like JAX's compile); its throughput is not
# counted. The pinned runs then hit its cache: a pinned process would deal the batch out to
# fewer compiler jobs, i.e. other C files, unless told the same number of jobs. The first
# --devices 2 run compiles its own code (not counted either).
say "moons: the big job's cold compile"
moons_run big_cold 1 "$tmp/moons-big-d1" -- "${big[@]}" --devices 1
moons_run big_d2_cold 1 "$tmp/moons-big-d2" -- "${big[@]}" --devices 2
for i in $(seq "$REPEAT"); do
    say "moons, round $i of $REPEAT (arrayjit and JAX in turn)"
    moons_run default_cold 1 "$tmp/moons-default-$i" -- --no-plot
    jax_run small -- --points 2400 --hidden 16 --batch 120 --epochs 20
    moons_run big_d1 0 "$tmp/moons-big-d1" $pin env ARRAYJIT_COMPILE_JOBS="$compile_jobs" -- "${big[@]}" --devices 1
    jax_run 1thread "XLA_FLAGS=$xla_1thread" $pin -- --points 24576 --hidden 256 --batch 2048 --epochs 3
    moons_run big_d2 0 "$tmp/moons-big-d2" -- "${big[@]}" --devices 2
    jax_run default -- --points 24576 --hidden 256 --batch 2048 --epochs 3
done
moons_run default_cached 0 "$tmp/moons-default-1" -- --no-plot

# --- JAX: the small kernel -----------------------------------------------------------------
if [[ $jax_ok == 1 ]]; then
    say "JAX small kernel"
    if ! "$py" "$here/peers.py" jax-small >"$results/jax_small.json" 2>"$tmp/jax.err"; then
        say "  failed: $(last_line "$tmp/jax.err")"
        echo "jax-small failed: $(last_line "$tmp/jax.err")" >"$results/jax.err"
        rm -f "$results/jax_small.json"
    fi
fi

echo
"$py" "$here/peers.py" table --results "$results" | tee "$results/table.txt"
