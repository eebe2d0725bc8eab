#!/usr/bin/env python3
"""Cold and cached compile times of a small kernel against gcc alone.

Usage: scripts/cold_start_bench.py [N] [ARRAYJIT_BINARY...]
       (default: N = 20, target/release/arrayjit; program benches/peers/small_kernel.json)

Alternates, N times:
  cold    `arrayjit run` with a fresh, empty ARRAYJIT_CACHE_DIR (so nothing is remembered: no
          compiled object, no target probe, no detected compiler);
  gcc     arrayjit's exact compile command run by itself (taken from an ARRAYJIT_DEBUG_DIR run),
          in a fresh directory holding the source and arrayjit.h;
  probe   the target probe alone (`<cc> <arch flags> <extra flags> -E -dM -x c /dev/null`);
  cached  `arrayjit run` with a warm cache directory (whole process), and `arrayjit bench`'s
          `compile_ms` with it (the library's part: compile_batch, a cache hit).
Each iteration waits until the machine's CPUs were at least 90% idle for half a second (at
most IDLE_WAIT seconds, default 60, then it runs anyway and counts as loaded), so that other
work on a shared machine disturbs the comparison less. Prints medians, minima and maxima in
milliseconds, the median of the paired differences cold - gcc, and the load average.
"""
import json, os, shutil, statistics, subprocess, sys, tempfile, time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = int(sys.argv[1]) if len(sys.argv) > 1 else 20
bins = sys.argv[2:] or [os.path.join(root, "target/release/arrayjit")]
prog = os.path.join(root, "benches/peers/small_kernel.json")
env = {k: v for k, v in os.environ.items() if not k.startswith("ARRAYJIT_")}

dbg = tempfile.mkdtemp(prefix="ajbench-dbg-")
subprocess.run([bins[0], "run", prog], env={**env, "ARRAYJIT_DEBUG_DIR": dbg, "ARRAYJIT_CACHE": "off"},
               check=True, stdout=subprocess.DEVNULL)
cmd = open(os.path.join(dbg, "small.cmd")).read().strip()
words = cmd.split()
# The probe: the compiler, the arch and extra flags (the flags between -O<level> and
# -mno-avx512fp16/-std=gnu11, which arrayjit adds after probing).
flags = []
for w in words[2:]:
    if w in ("-mno-avx512fp16", "-std=gnu11"):
        break
    flags.append(w)
probe = " ".join([words[0]] + flags + ["-E", "-dM", "-x", "c", "/dev/null"])
print("compile:", cmd)
print("probe:  ", probe)


def idle_fraction(seconds=0.5):
    def sample():
        f = list(map(int, open("/proc/stat").readline().split()[1:]))
        return sum(f), f[3] + f[4]
    t1, i1 = sample()
    time.sleep(seconds)
    t2, i2 = sample()
    return (i2 - i1) / max(t2 - t1, 1)


def wait_for_idle():
    """Whether the machine became idle within IDLE_WAIT seconds."""
    end = time.time() + float(os.environ.get("IDLE_WAIT", "60"))
    while time.time() < end:
        if idle_fraction() >= 0.9:
            return True
    return False


def wall(argv, **kw):
    t = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, **kw)
    return (time.perf_counter() - t) * 1e3


res = {}
loaded = 0
warm = {b: tempfile.mkdtemp(prefix="ajbench-warm-") for b in bins}
for b in bins:
    subprocess.run([b, "run", prog], env={**env, "ARRAYJIT_CACHE_DIR": warm[b]}, check=True,
                   stdout=subprocess.DEVNULL)
for _ in range(N):
    loaded += not wait_for_idle()
    for b in bins:
        d = tempfile.mkdtemp(prefix="ajbench-cold-")
        res.setdefault(("cold", b), []).append(wall([b, "run", prog], env={**env, "ARRAYJIT_CACHE_DIR": d}))
        shutil.rmtree(d)
    w = tempfile.mkdtemp(prefix="ajbench-gcc-")
    shutil.copy(os.path.join(dbg, "small.c"), w)
    shutil.copy(os.path.join(dbg, "arrayjit.h"), w)
    res.setdefault(("gcc", ""), []).append(wall(["sh", "-c", "exec " + cmd], cwd=w, env={**env, "TMPDIR": w}))
    shutil.rmtree(w)
    res.setdefault(("probe", ""), []).append(wall(["sh", "-c", "exec " + probe + " >/dev/null"]))
    for b in bins:
        res.setdefault(("cached", b), []).append(wall([b, "run", prog], env={**env, "ARRAYJIT_CACHE_DIR": warm[b]}))
        out = subprocess.run([b, "bench", prog, "--runs", "1", "--warmup", "0"],
                             env={**env, "ARRAYJIT_CACHE_DIR": warm[b]}, check=True,
                             capture_output=True, text=True).stdout
        res.setdefault(("cached compile_ms", b), []).append(json.loads(out)["compile_ms"])
for (what, b), v in res.items():
    print(f"{what:18} {b:45} median {statistics.median(v):7.2f}  min {min(v):7.2f}  max {max(v):7.2f}")
for b in bins:
    d = [c - g for c, g in zip(res[("cold", b)], res[("gcc", "")])]
    print(f"{'cold - gcc':18} {b:45} median {statistics.median(d):7.2f} (paired)")
print(f"iterations run on a loaded machine: {loaded} of {N}")
print("load average:", open("/proc/loadavg").read().strip())
for d in [dbg, *warm.values()]:
    shutil.rmtree(d)
