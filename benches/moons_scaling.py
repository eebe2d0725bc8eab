#!/usr/bin/env python3
"""Device scaling of the default moons job (the README's first set-up command).

Runs `target/release/examples/moons --devices D --no-plot` for each device count in turn,
ROUNDS times (interleaved, so that a slow phase of a shared machine hits every count alike),
and prints per count the median samples/s, and the median over rounds of its ratio to one
device in the same round.

    cargo build --release --example moons
    python3 benches/moons_scaling.py [ROUNDS] [DEVICES,...] [-- extra moons flags]

Defaults: 15 rounds, devices 1,2,8. A speed figure is a benchmark, never a test.
"""
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOONS = os.path.join(ROOT, "target", "release", "examples", "moons")


def main() -> int:
    args = sys.argv[1:]
    extra: list[str] = []
    if "--" in args:
        i = args.index("--")
        args, extra = args[:i], args[i + 1 :]
    rounds = int(args[0]) if args else 15
    devices = [int(d) for d in args[1].split(",")] if len(args) > 1 else [1, 2, 8]
    if 1 not in devices:
        devices = [1] + devices
    if not os.access(MOONS, os.X_OK):
        print(f"{MOONS} is missing: run `cargo build --release --example moons` first")
        return 2
    runs: dict[int, list[float]] = {d: [] for d in devices}
    for _ in range(rounds):
        for d in devices:
            out = subprocess.run(
                [MOONS, "--devices", str(d), "--no-plot", *extra],
                capture_output=True,
                text=True,
                check=False,
            )
            m = re.search(r"samples/s: (\d+)", out.stdout)
            if out.returncode != 0 or not m:
                print(f"--devices {d} failed:\n{out.stdout}{out.stderr}")
                return 1
            runs[d].append(float(m.group(1)))
    print(f"default moons job, {rounds} interleaved rounds, load {os.getloadavg()[0]:.2f}")
    print("devices  median samples/s  min      max      median ratio to 1 device")
    for d in devices:
        v = runs[d]
        ratios = [a / b for a, b in zip(v, runs[1])]
        print(
            f"{d:>7}  {statistics.median(v) / 1e6:>9.2f}M       "
            f"{min(v) / 1e6:>6.2f}M  {max(v) / 1e6:>6.2f}M  {statistics.median(ratios):.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
