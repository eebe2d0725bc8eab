#!/usr/bin/env python3
"""Times the arrayjit bench workloads in numpy and tinygrad (one thread), measures compile
latency, and prints the comparison tables. Used by run.sh; each peer runs in its own process
(with its own environment), so that one peer failing does not lose the others' numbers.

  peers.py numpy    [--runs N] [--warmup N]   -> one JSON object on stdout
  peers.py tinygrad [--runs N] [--warmup N]   -> one JSON object on stdout
  peers.py onnxruntime [--runs N] [--warmup N] -> one JSON object on stdout
  peers.py jax-small                          -> JAX's jit latency for the small kernel
  peers.py time-cmd --cmd-file F [--runs N]   -> times the compiler command arrayjit ran
  peers.py moons-line --config NAME [--cold]  -> the summary of a moons run (stdin) as JSON
  peers.py table --results DIR                -> the tables (reads what run.sh wrote to DIR)

Kernel timings are medians, in milliseconds, of `runs` timed calls after `warmup` untimed
ones. The moons job in JAX is benches/peers/moons_jax.py.
"""

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

# workload -> (description, unit, amount per run: FLOPs or bytes moved)
WORKLOADS = {
    "matmul_512": ("matmul 512^3 f32", "GFLOP/s", 2 * 512**3),
    "matmul_1024": ("matmul 1024^3 f32", "GFLOP/s", 2 * 1024**3),
    "matmul_2048": ("matmul 2048^3 f32", "GFLOP/s", 2 * 2048**3),
    "matmul_t_768": ("matmul a@b.T (ij,kj->ik) 768^3 f32", "GFLOP/s", 2 * 768**3),
    "batched_matmul_16x128": ("batched matmul 16x128^3 f32", "GFLOP/s", 2 * 16 * 128**3),
    "matmul_f64_1024": ("matmul 1024^3 f64", "GFLOP/s", 2 * 1024**3),
    "fused_elementwise": ("max(0,a*b+c)*2-d, 2^24 f32", "GB/s", 5 * 4 * 2**24),
    "row_sums": ("row sums 4096x4096 f32", "GB/s", 4 * 4096 * 4096),
    # The language of issue 20 (affine indices, bfloat16): NHWC in arrayjit, NCHW in ONNX
    # Runtime (its native layout; it reorders to its blocked NCHWc layout itself).
    "conv3x3_56x64": ("conv 3x3 pad 1, 1x56x56x64->64 f32", "GFLOP/s", 2 * 56 * 56 * 64 * 64 * 9),
    "conv3x3s2_28x128": ("conv 3x3 stride 2 pad 1, 1x28x28x128->256 f32", "GFLOP/s",
                         2 * 14 * 14 * 256 * 128 * 9),
    "dwconv3x3_56x128": ("depthwise conv 3x3 pad 1, 1x56x56x128 f32", "GFLOP/s", 2 * 56 * 56 * 128 * 9),
    "maxpool2x2_112x64": ("max-pool 2x2 stride 2, 1x112x112x64 f32", "GB/s",
                          4 * (112 * 112 * 64 + 56 * 56 * 64)),
    # numpy's column: its f32 matmul (OpenBLAS has no bf16 matmul).
    "matmul_bf16_1024": ("matmul 1024^3, bf16 inputs, f32 result", "GFLOP/s", 2 * 1024**3),
    # Memory-bound chains of statements (issue 21): bytes = one read and one write of x.
    "softmax_4096x1024": ("softmax over rows, 4096x1024 f32", "GB/s", 2 * 4 * 4096 * 1024),
    "layernorm_4096x1024": ("layer norm over rows (scale, bias), 4096x1024 f32", "GB/s",
                            2 * 4 * 4096 * 1024),
}
# The workloads timed on all cores too (--threads = the machine's cores each side), and those
# timed on all cores only.
ALL_CORES = ["matmul_2048", "conv3x3_56x64", "softmax_4096x1024", "layernorm_4096x1024",
             "row_sums", "fused_elementwise"]
ALL_CORES_ONLY = ["matmul_2048"]
SMALL = 4096  # elements of the small kernel (benches/peers/small_kernel.json)


def inputs(np):
    """The same shapes and precisions as benches/programs/*.json (uniform [0, 1); values
    differ)."""
    rng = np.random.default_rng(0)
    u = lambda *shape: rng.random(shape, dtype=np.float32)  # noqa: E731
    u64 = lambda *shape: rng.random(shape, dtype=np.float64)  # noqa: E731
    n = 2**24
    return {
        "matmul_512": (u(512, 512), u(512, 512)),
        "matmul_1024": (u(1024, 1024), u(1024, 1024)),
        "matmul_2048": (u(2048, 2048), u(2048, 2048)),
        "matmul_t_768": (u(768, 768), u(768, 768)),
        "batched_matmul_16x128": (u(16, 128, 128), u(16, 128, 128)),
        "matmul_f64_1024": (u64(1024, 1024), u64(1024, 1024)),
        "fused_elementwise": (u(n), u(n), u(n), u(n)),
        "row_sums": (u(4096, 4096),),
        "matmul_bf16_1024": (u(1024, 1024), u(1024, 1024)),
        "softmax_4096x1024": (u(4096, 1024),),
        "layernorm_4096x1024": (u(4096, 1024), u(1024), u(1024)),
    }


def numpy_ops(np):
    """Each workload in numpy (also the reference that tinygrad's results are checked
    against)."""

    def softmax(x):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def layernorm(x, g, b):
        c = x - x.mean(axis=1, keepdims=True)
        return c / np.sqrt((c * c).mean(axis=1, keepdims=True) + 1e-5) * g + b

    return {
        "matmul_512": lambda a, b: a @ b,
        "matmul_1024": lambda a, b: a @ b,
        "matmul_2048": lambda a, b: a @ b,
        "matmul_t_768": lambda a, b: a @ b.T,
        "batched_matmul_16x128": lambda a, b: a @ b,
        "matmul_f64_1024": lambda a, b: a @ b,
        "fused_elementwise": lambda a, b, c, d: np.maximum(0, a * b + c) * 2 - d,
        "row_sums": lambda x: x.sum(axis=1),
        "matmul_bf16_1024": lambda a, b: a @ b,
        "softmax_4096x1024": softmax,
        "layernorm_4096x1024": layernorm,
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
    out["threads"] = args.threads
    data = inputs(np)
    limits = None
    if args.threads != 1:
        from threadpoolctl import threadpool_limits

        limits = threadpool_limits(args.threads)
    for w, op in numpy_ops(np).items():
        if args.only and w not in args.only:
            continue
        xs = data[w]
        out["ms"][w] = median_ms(lambda: op(*xs), args.warmup, args.runs)
    del limits
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
        "matmul_t_768": lambda a, b: a @ b.T,
        "batched_matmul_16x128": lambda a, b: a @ b,
        "matmul_f64_1024": lambda a, b: a @ b,
        "fused_elementwise": lambda a, b, c, d: (a * b + c).maximum(0) * 2 - d,
        "row_sums": lambda x: x.sum(axis=1),
        "softmax_4096x1024": lambda x: x.softmax(axis=1),
        "layernorm_4096x1024": lambda x, g, b: x.layernorm(axis=1, eps=1e-5) * g + b,
    }
    check = numpy_ops(np)
    out["errors"] = {}
    for w, op in ops.items():
        # One workload failing (an unsupported operation or precision) leaves its cell empty
        # and its reason in "errors"; the others are still timed.
        try:
            xs = [Tensor(x, device=dev).realize() for x in data[w]]
            sync()

            def once():
                r = op(*xs).realize()
                sync()
                return r

            got = once().numpy()
            want = check[w](*data[w])
            if got.dtype != want.dtype:
                raise RuntimeError(f"computed in {got.dtype}, not {want.dtype}")
            if not np.allclose(got, want, rtol=1e-3, atol=1e-3):
                raise RuntimeError("wrong result")
            out["ms"][w] = median_ms(once, args.warmup, args.runs)
            del xs
        except Exception as e:
            out["errors"][w] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return out


def onnx_models(np):
    """Each workload that ONNX Runtime has a CPU kernel for, as (model, inputs): weights of
    the convolutions are initializers (constants), as in deployed inference."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    u = lambda *shape: rng.random(shape, dtype=np.float32)  # noqa: E731
    F, D = TensorProto.FLOAT, TensorProto.DOUBLE

    def model(nodes, ins, out, inits=()):
        g = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in ins],
            [helper.make_tensor_value_info(out[0], out[1], None)],
            initializer=[numpy_helper.from_array(a, name=n) for n, a in inits])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return m.SerializeToString()

    def matmul(a_shape, b_shape, t=F, dt=np.float32, trans_b=False):
        a = rng.random(a_shape).astype(dt)
        b = rng.random(b_shape).astype(dt)
        node = (helper.make_node("Gemm", ["a", "b"], ["y"], transB=1) if trans_b
                else helper.make_node("MatMul", ["a", "b"], ["y"]))
        return model([node], [("a", t, a_shape), ("b", t, b_shape)], ("y", t)), {"a": a, "b": b}

    def conv(c_in, hw, c_out, stride, group=1):
        x = u(1, c_in, hw, hw)
        w = u(c_out, c_in // group, 3, 3)
        node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                strides=[stride, stride], group=group)
        return model([node], [("x", F, x.shape)], ("y", F), [("w", w)]), {"x": x}

    n = 2**24
    two = np.array(2, dtype=np.float32)
    fused = model([helper.make_node("Mul", ["a", "b"], ["ab"]),
                   helper.make_node("Add", ["ab", "c"], ["abc"]),
                   helper.make_node("Relu", ["abc"], ["r"]),
                   helper.make_node("Mul", ["r", "two"], ["r2"]),
                   helper.make_node("Sub", ["r2", "d"], ["y"])],
                  [(k, F, [n]) for k in "abcd"], ("y", F), [("two", two)])
    axes = np.array([1], dtype=np.int64)
    rows = model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
                 [("x", F, [4096, 4096])], ("y", F), [("axes", axes)])
    softmax = model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                    [("x", F, [4096, 1024])], ("y", F))
    layernorm = model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1,
                                        epsilon=1e-5)],
                      [("x", F, [4096, 1024])], ("y", F), [("g", u(1024)), ("b", u(1024))])
    pool_x = u(1, 64, 112, 112)
    pool = model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                 [("x", F, pool_x.shape)], ("y", F))
    return {
        "matmul_512": lambda: matmul([512, 512], [512, 512]),
        "matmul_1024": lambda: matmul([1024, 1024], [1024, 1024]),
        "matmul_2048": lambda: matmul([2048, 2048], [2048, 2048]),
        "matmul_t_768": lambda: matmul([768, 768], [768, 768], trans_b=True),
        "batched_matmul_16x128": lambda: matmul([16, 128, 128], [16, 128, 128]),
        "matmul_f64_1024": lambda: matmul([1024, 1024], [1024, 1024], D, np.float64),
        "fused_elementwise": lambda: (fused, {k: u(n) for k in "abcd"}),
        "row_sums": lambda: (rows, {"x": u(4096, 4096)}),
        "conv3x3_56x64": lambda: conv(64, 56, 64, 1),
        "conv3x3s2_28x128": lambda: conv(128, 28, 256, 2),
        "dwconv3x3_56x128": lambda: conv(128, 56, 128, 1, group=128),
        "maxpool2x2_112x64": lambda: (pool, {"x": pool_x}),
        "softmax_4096x1024": lambda: (softmax, {"x": u(4096, 1024)}),
        "layernorm_4096x1024": lambda: (layernorm, {"x": u(4096, 1024)}),
    }


def run_onnxruntime(args):
    """The workloads in ONNX Runtime's CPU provider (MLAS kernels), on --threads threads
    (intra_op_num_threads; inter_op_num_threads=1), all graph optimizations on."""
    import numpy as np
    import onnxruntime as ort

    out = {"peer": "onnxruntime", "version": ort.__version__, "ms": {}, "errors": {}}
    opts = ort.SessionOptions()
    out["threads"] = args.threads
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    for w, make in onnx_models(np).items():
        if args.only and w not in args.only:
            continue
        try:
            m, feeds = make()
            sess = ort.InferenceSession(m, opts, providers=["CPUExecutionProvider"])
            out["ms"][w] = median_ms(lambda: sess.run(None, feeds), args.warmup, args.runs)
            del sess
        except Exception as e:
            out["errors"][w] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return out


def run_jax_small(args):
    """Compile latency of the small kernel in JAX: a fresh `jax.jit` function's first call
    (trace, lower, XLA compile, run), its second call, and the ahead-of-time split of the
    first (trace+lower, compile) on another fresh function."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(1)
    a, b, c, d = (jnp.asarray(rng.random(SMALL, dtype=np.float32)) for _ in range(4))
    jax.block_until_ready((a, b, c, d))
    # JAX's own set-up (backend, its helper computations), not counted.
    jax.block_until_ready(jax.jit(lambda x: x + 1)(a))

    def kernel(a, b, c, d):
        return jnp.maximum(0, a * b + c) * 2 - d

    f = jax.jit(kernel)
    t = time.perf_counter()
    jax.block_until_ready(f(a, b, c, d))
    first = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    jax.block_until_ready(f(a, b, c, d))
    second = (time.perf_counter() - t) * 1e3
    t0 = time.perf_counter()
    lowered = jax.jit(lambda a, b, c, d: kernel(a, b, c, d)).lower(a, b, c, d)
    t1 = time.perf_counter()
    lowered.compile()
    t2 = time.perf_counter()
    return {"peer": "jax", "version": jax.__version__, "first_call_ms": first,
            "second_call_ms": second, "trace_lower_ms": (t1 - t0) * 1e3,
            "xla_compile_ms": (t2 - t1) * 1e3}


def time_cmd(args):
    """Runs the compiler command that arrayjit wrote to CMD_FILE (ARRAYJIT_DEBUG_DIR), from
    its directory, `runs` times; prints the times in ms."""
    cmd = shlex.split(open(args.cmd_file).read())
    cwd = os.path.dirname(os.path.abspath(args.cmd_file))
    times = []
    for _ in range(args.runs):
        t = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, check=True)
        times.append((time.perf_counter() - t) * 1e3)
    return {"cmd": " ".join(cmd), "ms": times}


MOONS_SUMMARY = re.compile(
    r"accuracy: ([0-9.]+) devices: (\d+)(?: ranks: \d+)? samples/s: ([0-9.]+) compile_ms: ([0-9.]+)")
MOONS_EPOCH = re.compile(r"^epoch (\d+) loss ([0-9.eE+-]+|nan|inf)$", re.M)


def moons_line(args):
    """Reads the output of arrayjit's moons example on stdin; prints its summary as JSON."""
    text = sys.stdin.read()
    m = MOONS_SUMMARY.search(text)
    if not m:
        raise SystemExit(f"no summary line in the moons output: {text.strip()[-300:]!r}")
    losses = [float(x) for _, x in MOONS_EPOCH.findall(text)]
    return {"config": args.config, "cold": args.cold, "accuracy": float(m.group(1)),
            "devices": int(m.group(2)), "samples_per_s": float(m.group(3)),
            "compile_ms": float(m.group(4)), "epoch_losses": losses}


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def print_table(head, rows):
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(str(c).ljust(wd) for c, wd in zip(r, widths)) + " |"  # noqa: E731
    print(line(head))
    print("|" + "|".join("-" * (wd + 2) for wd in widths) + "|")
    for r in rows:
        print(line(r))


def ratio(peer, aj):
    """Speed ratio from times (peer time / arrayjit time)."""
    return "-" if peer is None or aj is None or aj <= 0 else f"{peer / aj:.2f}x"


def table(args):
    d = args.results

    def load(name):
        try:
            with open(os.path.join(d, name)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def load_lines(name):
        out = []
        try:
            with open(os.path.join(d, name)) as f:
                for line in f:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
        except OSError:
            pass
        return out

    def reason(name):
        try:
            with open(os.path.join(d, name)) as f:
                text = f.read().strip()
                return text or "no result"
        except OSError:
            return "no result"

    meta = load("meta.json") or {}
    def rounds(prefix):
        """The rounds' results (PREFIX-1.json, PREFIX-2.json, ...) that exist."""
        out = []
        for r in range(1, 1000):
            if not os.path.exists(os.path.join(d, f"{prefix}-{r}.json")):
                if r > meta.get("rounds", 1):
                    break
                continue
            x = load(f"{prefix}-{r}.json")
            if x is not None:
                out.append(x)
        return out

    def best(times):
        """Per workload, the lowest of the rounds' medians."""
        out = {}
        for t in times:
            for w, v in t.items():
                if v is not None and (w not in out or v < out[w]):
                    out[w] = v
        return out

    aj_rounds, np_rounds, tg_rounds = rounds("arrayjit"), rounds("numpy"), rounds("tinygrad")
    ort_rounds = rounds("onnxruntime")
    aj = best(aj_rounds)
    npy = dict(np_rounds[0], ms=best(r["ms"] for r in np_rounds)) if np_rounds else None
    ortr = dict(ort_rounds[0], ms=best(r["ms"] for r in ort_rounds)) if ort_rounds else None
    tg = None
    if tg_rounds:
        tg = dict(tg_rounds[0], ms=best(r["ms"] for r in tg_rounds))
        tg["first_call_ms"] = med([r.get("first_call_ms") for r in tg_rounds])
        tg["second_call_ms"] = med([r.get("second_call_ms") for r in tg_rounds])
        tg["errors"] = {w: e for r in tg_rounds for w, e in (r.get("errors") or {}).items()
                        if w not in tg["ms"]}
    comp = load("compile.json") or {}
    jsmall = load("jax_small.json")

    # --- kernels ------------------------------------------------------------------------
    print(f"kernels, one thread (OMP/OPENBLAS_NUM_THREADS=1, tinygrad THREADS=0, ONNX Runtime "
          f"intra_op_num_threads=1): per peer, the best of {len(aj_rounds)}/{len(np_rounds)}/"
          f"{len(tg_rounds)}/{len(ort_rounds)} rounds (arrayjit/numpy/tinygrad/onnxruntime, "
          f"interleaved) of the median ms of {meta.get('runs', '?')} runs after "
          f"{meta.get('warmup', '?')} warm-up runs")
    head = ["workload", "arrayjit ms", "arrayjit rate", "numpy ms", "tinygrad ms", "onnxrt ms",
            "arrayjit/numpy", "arrayjit/tinygrad", "arrayjit/onnxrt"]
    rows = []
    for w, (desc, unit, amount) in WORKLOADS.items():
        if w in ALL_CORES_ONLY:
            continue
        a = aj.get(w)
        n = npy["ms"].get(w) if npy else None
        t = tg["ms"].get(w) if tg else None
        o = ortr["ms"].get(w) if ortr else None
        rate = None if a is None else amount / (a * 1e-3) / 1e9
        rows.append([
            desc,
            fmt(a, ".3f"),
            "-" if rate is None else f"{rate:.1f} {unit}",
            fmt(n, ".3f"),
            fmt(t, ".3f"),
            fmt(o, ".3f"),
            ratio(n, a),
            ratio(t, a),
            ratio(o, a),
        ])
    print_table(head, rows)
    print("ratios are speed ratios (peer time / arrayjit time): above 1x, arrayjit is faster.")
    for w in WORKLOADS:
        if aj.get(w) is None and w not in ALL_CORES_ONLY:
            print(f"  arrayjit {w}: {reason(f'arrayjit-{w}.err')}")
    if tg:
        for w, e in (tg.get("errors") or {}).items():
            print(f"  tinygrad {w}: {e}")
    if ortr:
        for w, e in (ortr.get("errors") or {}).items():
            if w not in ortr["ms"]:
                print(f"  onnxruntime {w}: {e}")
    print()

    # --- kernels on all cores -----------------------------------------------------------
    aj_all, np_all_r, ort_all_r = rounds("arrayjit-all"), rounds("numpy-all"), rounds("onnxruntime-all")
    if aj_all or np_all_r or ort_all_r:
        threads = meta.get("threads", "?")
        a_all = best(aj_all)
        n_all = best(r["ms"] for r in np_all_r)
        o_all = best(r["ms"] for r in ort_all_r)
        print(f"kernels, all cores ({threads} threads each side: arrayjit bench --threads "
              f"{threads}, numpy threadpool_limits({threads}), ONNX Runtime intra_op_num_threads="
              f"{threads}): per peer, the best of {len(aj_all)}/{len(np_all_r)}/{len(ort_all_r)} "
              f"rounds (arrayjit/numpy/onnxruntime, interleaved)")
        head = ["workload", "arrayjit ms", "arrayjit rate", "numpy ms", "onnxrt ms",
                "arrayjit/numpy", "arrayjit/onnxrt", "over its 1 thread"]
        rows = []
        for w in ALL_CORES:
            desc, unit, amount = WORKLOADS[w]
            a, n, o = a_all.get(w), n_all.get(w), o_all.get(w)
            rate = None if a is None else amount / (a * 1e-3) / 1e9
            rows.append([desc, fmt(a, ".3f"), "-" if rate is None else f"{rate:.1f} {unit}",
                         fmt(n, ".3f"), fmt(o, ".3f"), ratio(n, a), ratio(o, a),
                         ratio(aj.get(w), a)])
        print_table(head, rows)
        print("over its 1 thread: arrayjit's one-thread time (table above) / its all-cores time.")
        for w in ALL_CORES:
            if a_all.get(w) is None:
                print(f"  arrayjit {w} (all cores): {reason(f'arrayjit-all-{w}.err')}")
        print()

    # --- moons --------------------------------------------------------------------------
    mj = load_lines("moons_arrayjit.jsonl")
    jx = {k: load_lines(f"jax_moons_{k}.jsonl") for k in ("1thread", "default", "small")}
    big = meta.get("moons_big", "?")
    print(f"moons training ({big}), samples/s: median (min-max) of {meta.get('repeat', '?')} "
          "processes each, arrayjit and JAX in turn:")

    def sps(rs):
        return med([r.get("samples_per_s") for r in rs])

    def sps_cell(rs):
        xs = [r["samples_per_s"] for r in rs if r.get("samples_per_s") is not None]
        if not xs:
            return "-"
        return f"{statistics.median(xs):,.0f}" + (
            f" ({min(xs):,.0f}-{max(xs):,.0f})" if len(xs) > 1 else "")

    def cores(rs):
        c = med([r["train_cpu_ms"] / r["train_ms"] for r in rs
                 if r.get("train_ms") and r.get("train_cpu_ms") is not None])
        return "-" if c is None else f"{c:.2f}"

    pin = meta.get("pin")
    d1 = [r for r in mj if r.get("config") == "big_d1"]
    d2 = [r for r in mj if r.get("config") == "big_d2"]
    rows = []
    for label, a_rs, j_rs in [
        ("one core: arrayjit --devices 1 vs JAX 1 thread (*)", d1, jx["1thread"]),
        ("both cores: arrayjit --devices 2 vs JAX default threads", d2, jx["default"]),
    ]:
        a, j = sps(a_rs), sps(j_rs)
        rows.append([label, sps_cell(a_rs), sps_cell(j_rs), cores(j_rs),
                     "-" if a is None or j is None or j <= 0 else f"{a / j:.2f}x"])
    print_table(["configuration", "arrayjit samples/s", "JAX samples/s", "JAX cores busy",
                 "arrayjit/JAX"], rows)
    print("arrayjit/JAX is arrayjit's throughput over JAX's: above 1x, arrayjit is faster. "
          "JAX cores busy: process CPU time / wall time of its training loop.")
    print(f"(*) JAX with {meta.get('xla_1thread', '?')}; "
          + (f"both processes pinned to one CPU ({pin})." if pin else "not pinned (no taskset)."))
    for name, rs in [("arrayjit --devices 1", d1), ("arrayjit --devices 2", d2),
                     ("JAX 1 thread", jx["1thread"]), ("JAX default threads", jx["default"])]:
        if rs:
            r = rs[0]
            losses = ", ".join(f"{x:.4f}" for x in r.get("epoch_losses", []))
            print(f"  {name}: epoch losses {losses}; accuracy {r.get('accuracy', float('nan')):.4f}")
    for name, err in [("arrayjit moons", "moons_arrayjit.err"), ("JAX 1 thread", "jax_moons_1thread.err"),
                      ("JAX default threads", "jax_moons_default.err"), ("JAX default job", "jax_moons_small.err")]:
        if os.path.exists(os.path.join(d, err)) and reason(err) != "no result":
            print(f"  {name}: {reason(err)}")
    print()

    dflt = [r for r in mj if r.get("config") == "default_cold"]
    dcached = [r for r in mj if r.get("config") == "default_cached"]
    big_cold = [r for r in mj if r.get("config") == "big_cold"]

    def jc(rs, key="compile_ms"):
        return med([r.get(key) for r in rs])

    print("moons compile latency, median ms. arrayjit cold: compile_ms of the summary line with a "
          "fresh ARRAYJIT_CACHE_DIR (one compile_batch of 4 routines: gradient, the last merge "
          "with the SGD update, inference, and a merge within a core; "
          f"{meta.get('compile_jobs', '?')} compiler "
          "jobs); JAX: tracing, lowering and XLA compilation of the jitted training step (ahead of time, default "
          "threads, no compilation cache):")
    small_desc = meta.get("moons_small", "default job")
    rows = [
        [f"default job ({small_desc}): arrayjit cold vs JAX jit",
         fmt(jc(dflt), ".0f"), fmt(jc(jx["small"]), ".0f"), ratio(jc(jx["small"]), jc(dflt))],
        [f"big job ({big}, --devices 1): arrayjit cold vs JAX jit",
         fmt(jc(big_cold), ".0f"), fmt(jc(jx["default"]), ".0f"), ratio(jc(jx["default"]), jc(big_cold))],
        ["default job: arrayjit cached (second run, same cache dir)",
         fmt(jc(dcached), ".1f"), "-", "-"],
    ]
    print_table(["compile", "arrayjit ms", "JAX ms", "arrayjit/JAX"], rows)
    j = jx["default"]
    if j:
        print(f"  JAX big step split: trace+lower {jc(j, 'trace_lower_ms'):.0f} ms, "
              f"XLA compile {jc(j, 'xla_compile_ms'):.0f} ms")
    print()

    # --- small kernel -------------------------------------------------------------------
    print(f"compile latency, one small kernel (max(0,a*b+c)*2-d on {SMALL} f32, "
          "benches/peers/small_kernel.json), median ms:")
    crow = [
        ("arrayjit cold (fresh ARRAYJIT_CACHE_DIR: nothing remembered)",
         med(comp.get("arrayjit_cold_ms", []))),
        ("arrayjit with the cache off (ARRAYJIT_CACHE=0)",
         med(comp.get("arrayjit_cache_off_ms", []))),
        ("arrayjit cached (second run, same cache dir)", med(comp.get("arrayjit_cached_ms", []))),
        ("the C compiler alone (arrayjit's exact command on the same C)",
         med(comp.get("gcc_ms", []))),
        ("tinygrad first call (CACHELEVEL=0; median over the rounds)",
         tg.get("first_call_ms") if tg else None),
        ("tinygrad second call (same kernel)", tg.get("second_call_ms") if tg else None),
        ("JAX jit first call (trace, lower, XLA compile, run)", jsmall.get("first_call_ms") if jsmall else None),
        ("JAX jit second call", jsmall.get("second_call_ms") if jsmall else None),
    ]
    wd = max(len(k) for k, _ in crow)
    for k, v in crow:
        print(f"  {k.ljust(wd)}  {fmt(v, '.1f')}")
    if comp.get("gcc_cmd"):
        print(f"  (compiler command: {comp['gcc_cmd']})")
    print()

    # --- compile scaling ----------------------------------------------------------------
    chain = load_lines("chain.jsonl")
    if chain:
        print("compile scaling: a routine of N chained statements over 64x64 f32 (a matmul every "
              "50; peers.py chain), cold compile (fresh ARRAYJIT_CACHE_DIR), "
              f"{meta.get('compile_jobs', '?')} compiler jobs:")
        per = {r["n"]: r["compile_ms"] / r["n"] for r in chain}
        base = per.get(100)
        rows = [[str(r["n"]), fmt(r["compile_ms"], ".0f"), fmt(per[r["n"]], ".2f"),
                 fmt(per[r["n"]] / base, ".2f") + "x" if base else "-"] for r in chain]
        print_table(["N", "cold ms", "ms per statement", "per statement vs N=100"], rows)
        print()

    # --- versions -----------------------------------------------------------------------
    for k in ("date", "cpu", "cc", "rustc", "clang (tinygrad)"):
        if meta.get(k):
            print(f"{k}: {meta[k]}")
    try:
        print("load average at the end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    except OSError:
        pass
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
    if ortr:
        print(f"onnxruntime {ortr.get('version')}: CPUExecutionProvider (MLAS), one thread")
    else:
        print(f"onnxruntime: missing ({reason('onnxruntime.err')})")
    jr = (jx["default"] or jx["1thread"] or jx["small"] or [None])[0] or jsmall
    if jr:
        print(f"jax {jr.get('version')} (jaxlib {jr.get('jaxlib', '?')}), CPU")
    else:
        print(f"jax: missing ({reason('jax.err')})")


def chain_program(args):
    """The N-statement chain of issue 10: N statements over 64x64 f32 tensors, each reading the
    previous one (add, mul or sub with a constant matrix `a`), every 50th a matmul by `a`.
    Every intermediate is on the device (materialized: one loop nest per statement)."""
    n = args.n
    tensors = [{"name": "a", "dims": [64, 64], "init": {"uniform": {"seed": 1}}},
               {"name": "t0", "dims": [64, 64], "init": {"uniform": {"seed": 2}}}]
    code = []
    for i in range(1, n + 1):
        t = {"name": f"t{i}", "dims": [64, 64]}
        if i < n:
            t["memory"] = "on_device"
        tensors.append(t)
        if i % 50 == 0:
            code.append({"assign": f"t{i}", "accum": "add", "init_neutral": True, "op": "mul",
                         "args": [f"t{i - 1}", "a"], "logic": "ij,jk->ik"})
        else:
            code.append({"assign": f"t{i}", "op": ("add", "mul", "sub")[i % 3],
                         "args": [f"t{i - 1}", "a"]})
    return {"tensors": tensors, "routines": [{"name": "chain", "code": code}],
            "run": [{"routine": "chain"}], "print": [f"t{n}"]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["numpy", "tinygrad", "onnxruntime", "jax-small", "time-cmd", "moons-line",
                                     "chain", "table"])
    p.add_argument("--n", type=int, default=100, help="chain: the number of statements")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--threads", type=int, default=1,
                   help="numpy, onnxruntime: threads (threadpool_limits, intra_op_num_threads)")
    p.add_argument("--only", nargs="*", help="numpy, onnxruntime: these workloads alone")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--results", default=".")
    p.add_argument("--cmd-file", help="time-cmd: the .cmd file arrayjit wrote")
    p.add_argument("--config", help="moons-line: a name for the configuration")
    p.add_argument("--cold", action="store_true", help="moons-line: the run compiled cold")
    args = p.parse_args()
    if args.what == "table":
        table(args)
        return
    run = {"numpy": run_numpy, "tinygrad": run_tinygrad, "onnxruntime": run_onnxruntime,
           "jax-small": run_jax_small,
           "time-cmd": time_cmd, "moons-line": moons_line, "chain": chain_program}[args.what]
    json.dump(run(args), sys.stdout)
    print()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:
        # The last line of stderr is what run.sh prints as the reason: make it the error.
        import traceback

        traceback.print_exc()
        print(f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}",
              file=sys.stderr)
        sys.exit(1)
