#!/usr/bin/env python3
"""Times the arrayjit bench workloads in numpy and tinygrad (f32, one thread), and prints the
comparison table. Used by run.sh; each peer runs in its own process (with its own
environment), so that one peer failing does not lose the other's numbers.

  peers.py numpy    [--runs N] [--warmup N]   -> one JSON object on stdout
  peers.py tinygrad [--runs N] [--warmup N]   -> one JSON object on stdout
  peers.py table --results DIR                -> the table (reads DIR/*.json written by run.sh)

Timings are medians, in milliseconds, of `runs` timed calls after `warmup` untimed ones.
"""

import argparse
import json
import os
import statistics
import sys
import time

# workload -> (description, unit, amount per run: FLOPs or bytes moved)
WORKLOADS = {
    "matmul_512": ("matmul 512^3", "GFLOP/s", 2 * 512**3),
    "matmul_1024": ("matmul 1024^3", "GFLOP/s", 2 * 1024**3),
    "fused_elementwise": ("max(0,a*b+c)*2-d, 2^24", "GB/s", 5 * 4 * 2**24),
    "row_sums": ("row sums 4096x4096", "GB/s", 4 * 4096 * 4096),
}
SMALL = 4096  # elements of the small kernel (benches/peers/small_kernel.json)


def inputs(np):
    """The same shapes as benches/programs/*.json (uniform [0, 1) f32; values differ)."""
    rng = np.random.default_rng(0)
    u = lambda *shape: rng.random(shape, dtype=np.float32)  # noqa: E731
    n = 2**24
    return {
        "matmul_512": (u(512, 512), u(512, 512)),
        "matmul_1024": (u(1024, 1024), u(1024, 1024)),
        "fused_elementwise": (u(n), u(n), u(n), u(n)),
        "row_sums": (u(4096, 4096),),
    }


def median_ms(fn, warmup, runs):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def run_numpy(args):
    import numpy as np

    out = {"peer": "numpy", "version": np.__version__, "ms": {}}
    try:
        from threadpoolctl import threadpool_info

        out["blas"] = [
            {k: p.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
            for p in threadpool_info()
        ]
    except Exception as e:  # threadpoolctl is optional
        out["blas"] = f"threadpoolctl unavailable: {e}"
    out["env"] = {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    data = inputs(np)
    ops = {
        "matmul_512": lambda a, b: a @ b,
        "matmul_1024": lambda a, b: a @ b,
        "fused_elementwise": lambda a, b, c, d: np.maximum(0, a * b + c) * 2 - d,
        "row_sums": lambda x: x.sum(axis=1),
    }
    for w, op in ops.items():
        xs = data[w]
        out["ms"][w] = median_ms(lambda: op(*xs), args.warmup, args.runs)
    return out


def run_tinygrad(args):
    import numpy as np
    from tinygrad import Device, Tensor

    dev = Device.DEFAULT
    out = {"peer": "tinygrad", "device": dev, "ms": {}}
    try:
        from importlib.metadata import version

        out["version"] = version("tinygrad")
    except Exception:
        pass
    if not dev.startswith(("CPU", "CLANG")):
        raise RuntimeError(f"tinygrad's default device is {dev}, not the CPU (clang) device")
    out["renderer"] = type(Device[dev].renderer).__name__
    out["env"] = {k: os.environ.get(k) for k in ("DEV", "CPU", "CLANG", "THREADS", "CACHELEVEL")}

    def sync():
        Device[dev].synchronize()

    # Device set-up (its own helper kernels), not counted as the first call.
    (Tensor([1.0, 2.0], device=dev) + 1).realize()
    sync()

    # First call of a small kernel: schedule, codegen, clang, load, run (disk cache off:
    # run.sh sets CACHELEVEL=0). Then the same expression again (kernel cached in-process).
    rng = np.random.default_rng(1)
    a, b, c, d = (Tensor(rng.random(SMALL, dtype=np.float32), device=dev).realize() for _ in range(4))
    sync()
    small = lambda: ((a * b + c).maximum(0) * 2 - d).realize()  # noqa: E731
    t = time.perf_counter()
    small()
    sync()
    out["first_call_ms"] = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    small()
    sync()
    out["second_call_ms"] = (time.perf_counter() - t) * 1e3

    data = inputs(np)
    ops = {
        "matmul_512": lambda a, b: a @ b,
        "matmul_1024": lambda a, b: a @ b,
        "fused_elementwise": lambda a, b, c, d: (a * b + c).maximum(0) * 2 - d,
        "row_sums": lambda x: x.sum(axis=1),
    }
    check = {
        "matmul_512": lambda a, b: a @ b,
        "matmul_1024": lambda a, b: a @ b,
        "fused_elementwise": lambda a, b, c, d: np.maximum(0, a * b + c) * 2 - d,
        "row_sums": lambda x: x.sum(axis=1),
    }
    for w, op in ops.items():
        xs = [Tensor(x, device=dev).realize() for x in data[w]]
        sync()

        def once():
            r = op(*xs).realize()
            sync()
            return r

        got = once().numpy()
        want = check[w](*data[w])
        if not np.allclose(got, want, rtol=1e-3, atol=1e-3):
            raise RuntimeError(f"tinygrad computed a wrong result for {w}")
        out["ms"][w] = median_ms(once, args.warmup, args.runs)
        del xs
    return out


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table(args):
    d = args.results

    def load(name):
        try:
            with open(os.path.join(d, name)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def reason(name):
        try:
            with open(os.path.join(d, name)) as f:
                return f.read().strip()
        except OSError:
            return "no result"

    aj = load("arrayjit.json") or {}
    npy = load("numpy.json")
    tg = load("tinygrad.json")
    comp = load("compile.json") or {}

    head = ["workload", "arrayjit ms", "arrayjit rate", "numpy ms", "tinygrad ms",
            "arrayjit/numpy", "arrayjit/tinygrad"]
    rows = []
    for w, (desc, unit, amount) in WORKLOADS.items():
        a = aj.get(w)
        n = npy["ms"].get(w) if npy else None
        t = tg["ms"].get(w) if tg else None
        rate = None if a is None else amount / (a * 1e-3) / 1e9
        rows.append([
            desc,
            fmt(a, ".3f"),
            "-" if rate is None else f"{rate:.1f} {unit}",
            fmt(n, ".3f"),
            fmt(t, ".3f"),
            "-" if a is None or n is None else f"{n / a:.2f}x",
            "-" if a is None or t is None else f"{t / a:.2f}x",
        ])
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(str(c).ljust(wd) for c, wd in zip(r, widths)) + " |"  # noqa: E731
    print(line(head))
    print("|" + "|".join("-" * (wd + 2) for wd in widths) + "|")
    for r in rows:
        print(line(r))
    print("ratios are speed ratios (peer time / arrayjit time): above 1x, arrayjit is faster.")
    print()
    print(f"compile latency, one small kernel (max(0,a*b+c)*2-d on {SMALL} f32), median ms:")
    crow = [
        ("arrayjit cold (ARRAYJIT_CACHE=0, compile_ms)", comp.get("arrayjit_cold_ms")),
        ("arrayjit cached (second run, compile_ms)", comp.get("arrayjit_cached_ms")),
        ("gcc alone (arrayjit's command on the same C)", comp.get("gcc_ms")),
        ("tinygrad first call (CACHELEVEL=0)", tg.get("first_call_ms") if tg else None),
        ("tinygrad second call (same kernel)", tg.get("second_call_ms") if tg else None),
    ]
    wd = max(len(k) for k, _ in crow)
    for k, v in crow:
        print(f"  {k.ljust(wd)}  {fmt(v, '.1f')}")
    print()
    if npy:
        print(f"numpy {npy.get('version')}; BLAS: {json.dumps(npy.get('blas'))}; "
              f"OPENBLAS_CORETYPE/L2_SIZE in its environment: {json.dumps(npy.get('env'))}")
    else:
        print(f"numpy: missing ({reason('numpy.err')})")
    if tg:
        print(f"tinygrad {tg.get('version')}: device {tg.get('device')}, renderer {tg.get('renderer')}, "
              f"environment {json.dumps(tg.get('env'))}")
    else:
        print(f"tinygrad: missing ({reason('tinygrad.err')})")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["numpy", "tinygrad", "table"])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--results", default=".")
    args = p.parse_args()
    if args.what == "table":
        table(args)
    else:
        res = run_numpy(args) if args.what == "numpy" else run_tinygrad(args)
        json.dump(res, sys.stdout)
        print()


if __name__ == "__main__":
    main()
