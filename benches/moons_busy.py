#!/usr/bin/env python3
"""The moons jobs on a machine with a neighbour: one busy process (`while True: pass`) runs
for the whole measurement, and the configurations run in turn, ROUNDS times (interleaved).
Prints per configuration the median samples/s and the median over rounds of its ratio to the
first configuration of its job (one device).

    cargo build --release --example moons
    python3 benches/moons_busy.py [ROUNDS] [--quiet]   (--quiet: no busy process)

Jobs: the default job (the README's first command) with --devices 1, with the default
device count and with --devices 2 (two devices in lockstep, one of them on the busy core);
the big job (2-256-256-1, batch 2048, 24576 points, 3 epochs) with --devices 1
and --devices 2. A speed figure is a benchmark, never a test.
"""
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOONS = os.path.join(ROOT, "target", "release", "examples", "moons")
BIG = ["--hidden", "256", "--batch", "2048", "--points", "24576", "--epochs", "3"]
# (name, flags, the configuration its ratio is to: its job on one device)
CONFIGS = [
    ("default job, --devices 1", ["--devices", "1"], 0),
    ("default job, default devices", [], 0),
    ("default job, --devices 2", ["--devices", "2"], 0),
    ("big job, --devices 1", BIG + ["--devices", "1"], 3),
    ("big job, --devices 2", BIG + ["--devices", "2"], 3),
]


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--quiet"]
    quiet = "--quiet" in sys.argv[1:]
    rounds = int(args[0]) if args else 5
    busy = None if quiet else subprocess.Popen([sys.executable, "-c", "while True: pass"])
    runs = {name: [] for name, _, _ in CONFIGS}
    try:
        for _ in range(rounds):
            for name, flags, _ in CONFIGS:
                out = subprocess.run([MOONS, "--no-plot", *flags], capture_output=True,
                                     text=True, check=False)
                m = re.search(r"samples/s: (\d+)", out.stdout)
                if out.returncode != 0 or not m:
                    print(f"{name} failed:\n{out.stdout}{out.stderr}")
                    return 1
                runs[name].append(float(m.group(1)))
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    print(f"{rounds} interleaved rounds, {'no busy process' if quiet else 'one busy process'}, "
          f"load {os.getloadavg()[0]:.2f} at the end")
    for name, _, b in CONFIGS:
        base = CONFIGS[b][0]
        v = runs[name]
        ratio = statistics.median(a / b for a, b in zip(v, runs[base]))
        print(f"  {name:<30} median {statistics.median(v):>12,.0f} samples/s "
              f"(min {min(v):,.0f}, max {max(v):,.0f}); ratio to one device {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
