#!/usr/bin/env bash
# Data-parallel scaling over MPI: the big moons job (2-256-256-1, batch 2048) on 1 and on 2
# ranks (one device each), alternating, REPEAT times (default 5); prints every run's
# samples/s, the medians and their ratio. Speed is measured here, not in a test: on a shared
# machine a single ratio says little.
#
# Needs Open MPI (Debian: apt-get install openmpi-bin libopenmpi-dev libclang-dev); builds
# with `cargo build --release --features mpi --examples`. As root, it passes Open MPI's
# run-as-root switches.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --features mpi --examples >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
args=(--backend mpi --devices 1 --hidden 256 --batch 2048 --epochs 3 --points 24576 --no-plot)
one=() two=()
for _ in $(seq "${REPEAT:-5}"); do
    for n in 1 2; do
        s=$(mpirun --oversubscribe -n "$n" target/release/examples/moons "${args[@]}" |
            grep -o 'samples/s: [0-9.]*' | head -1 | cut -d' ' -f2)
        echo "ranks $n: $s samples/s"
        if [ "$n" = 1 ]; then one+=("$s"); else two+=("$s"); fi
    done
done
python3 - "${one[*]}" "${two[*]}" <<'PY'
import statistics, sys
one = [float(x) for x in sys.argv[1].split()]
two = [float(x) for x in sys.argv[2].split()]
m1, m2 = statistics.median(one), statistics.median(two)
print(f"median: 1 rank {m1:.0f}, 2 ranks {m2:.0f} samples/s: {m2 / m1:.2f}x")
PY
