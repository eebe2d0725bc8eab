#!/usr/bin/env python3
"""arrayjit beside ONNX Runtime and numpy on shapes other than those of benches/programs:
softmax and layer norm over rows, 3x3 convolutions (padding 1) and matmuls, including sizes
that are not multiples of the vector width or of the kernels' tiles. The bench programs are
tuned against; these are not, so they show whether the speed carries over to the shapes a
user writes.

  python3 benches/peers/shapes.py [--threads N] [--rounds R] [--runs N] [--only NAME...]

Run it in benches/peers/.venv (run.sh creates it). Each workload is written as a program
file (the format of ../../PROGRAM_FORMAT.md, the same statements as benches/programs) and
timed by `arrayjit bench --threads N`; the peer runs the same workload in this process on N
threads (ONNX Runtime's intra_op_num_threads, numpy's threadpool_limits). Rounds interleave
arrayjit and its peer; each side's best round median counts, as in run.sh. Prints one line
per workload with both times and the ratio (above 1x: arrayjit is faster).
"""

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import median_ms  # noqa: E402  (the same timing as run.sh's peers)


def softmax_program(r, c):
    return {
        "tensors": [
            {"name": "x", "dims": [r, c], "init": {"uniform": {"seed": 1}}},
            {"name": "m", "dims": [r]}, {"name": "d", "dims": [r, c]},
            {"name": "e", "dims": [r, c]}, {"name": "s", "dims": [r]},
            {"name": "y", "dims": [r, c], "memory": "on_device"},
        ],
        "routines": [{"name": "softmax", "code": [
            {"assign": "m", "accum": "max", "init_neutral": True, "op": "identity", "args": ["x"],
             "logic": "ij->i"},
            {"assign": "d", "op": "sub", "args": ["x", "m"], "logic": "ij,i->ij"},
            {"assign": "e", "op": "exp", "args": ["d"]},
            {"assign": "s", "accum": "add", "init_neutral": True, "op": "identity", "args": ["e"],
             "logic": "ij->i"},
            {"assign": "y", "op": "div", "args": ["e", "s"], "logic": "ij,i->ij"},
        ]}],
        "run": [{"routine": "softmax"}],
    }


def layernorm_program(r, c):
    return {
        "tensors": [
            {"name": "x", "dims": [r, c], "init": {"uniform": {"seed": 1}}},
            {"name": "g", "dims": [c], "init": {"uniform": {"seed": 2}}},
            {"name": "b", "dims": [c], "init": {"uniform": {"seed": 3}}},
            {"name": "inv_n", "dims": [1]}, {"name": "eps", "dims": [1]},
            {"name": "mu", "dims": [r]}, {"name": "c", "dims": [r, c]},
            {"name": "var", "dims": [r]}, {"name": "ve", "dims": [r]}, {"name": "r", "dims": [r]},
            {"name": "n", "dims": [r, c]},
            {"name": "y", "dims": [r, c], "memory": "on_device"},
        ],
        "routines": [{"name": "layernorm", "code": [
            {"fetch": "inv_n", "constant": 1.0 / c},
            {"fetch": "eps", "constant": 0.00001},
            {"assign": "mu", "accum": "add", "init_neutral": True, "op": "mul",
             "args": ["x", "inv_n"], "logic": "ij,0->i"},
            {"assign": "c", "op": "sub", "args": ["x", "mu"], "logic": "ij,i->ij"},
            {"assign": "var", "accum": "add", "init_neutral": True, "op": "mul3",
             "args": ["c", "c", "inv_n"], "logic": "ij,ij,0->i"},
            {"assign": "ve", "op": "add", "args": ["var", "eps"], "logic": "i,0->i"},
            {"assign": "r", "op": "rsqrt", "args": ["ve"]},
            {"assign": "n", "op": "mul", "args": ["c", "r"], "logic": "ij,i->ij"},
            {"assign": "y", "op": "fma", "args": ["n", "g", "b"], "logic": "ij,j,j->ij"},
        ]}],
        "run": [{"routine": "layernorm"}],
    }


def conv_program(b, hw, cin, cout, stride):
    out = (hw + 2 - 3) // stride + 1
    s = "" if stride == 1 else f"{stride}*"
    return {
        "tensors": [
            {"name": "x", "dims": [b, hw, hw, cin], "init": {"uniform": {"seed": 1}}},
            {"name": "w", "dims": [3, 3, cin, cout], "init": {"uniform": {"seed": 2}}},
            {"name": "y", "dims": [b, out, out, cout], "memory": "on_device"},
        ],
        "routines": [{"name": "conv", "code": [
            {"assign": "y", "accum": "add", "init_neutral": True, "op": "mul", "args": ["x", "w"],
             "logic": f"b({s}h+i-1)({s}v+j-1)c,ijcd->bhvd"},
        ]}],
        "run": [{"routine": "conv"}],
    }


def matmul_program(m, k, n, prec, trans_b):
    b_dims = [n, k] if trans_b else [k, n]
    p = {} if prec == "single" else {"prec": prec}
    return {
        "tensors": [
            {"name": "a", "dims": [m, k], "init": {"uniform": {"seed": 1}}, **p},
            {"name": "b", "dims": b_dims, "init": {"uniform": {"seed": 2}}, **p},
            {"name": "c", "dims": [m, n], "memory": "on_device", **p},
        ],
        "routines": [{"name": "matmul", "code": [
            {"assign": "c", "accum": "add", "init_neutral": True, "op": "mul", "args": ["a", "b"],
             "logic": "ij,kj->ik" if trans_b else "ij,jk->ik"},
        ]}],
        "run": [{"routine": "matmul"}],
    }


def workloads():
    """name -> (program, peer kind, peer parameters)."""
    w = {}
    for r, c in [(1000, 1000), (2048, 768), (256, 8192), (16384, 128), (4096, 100), (3000, 77)]:
        w[f"softmax_{r}x{c}"] = (softmax_program(r, c), "softmax", (r, c))
        w[f"layernorm_{r}x{c}"] = (layernorm_program(r, c), "layernorm", (r, c))
    for b, hw, cin, cout, st in [(1, 28, 128, 128, 1), (1, 14, 256, 256, 1), (1, 112, 32, 64, 1),
                                 (1, 7, 512, 512, 1), (2, 30, 48, 96, 1), (1, 56, 64, 128, 2),
                                 (1, 57, 40, 24, 1), (1, 14, 512, 512, 1), (4, 7, 512, 512, 1)]:
        name = f"conv3x3{'s2' if st == 2 else ''}_{b}x{hw}x{hw}x{cin}to{cout}"
        w[name] = (conv_program(b, hw, cin, cout, st), "conv", (b, hw, cin, cout, st))
    for m, k, n, prec, t in [(1000, 1000, 1000, "single", False), (512, 3072, 768, "single", False),
                             (4096, 256, 1024, "single", False), (1000, 1000, 1000, "single", True),
                             (384, 1024, 4096, "single", True), (777, 555, 333, "single", False),
                             (768, 768, 768, "double", False), (1000, 1000, 1000, "double", True),
                             (64, 4096, 64, "single", False), (1536, 1536, 1536, "single", False)]:
        name = f"matmul{'_t' if t else ''}_{m}x{k}x{n}{'_f64' if prec == 'double' else ''}"
        w[name] = (matmul_program(m, k, n, prec, t), "matmul", (m, k, n, prec, t))
    return w


def peer_session(kind, params, threads):
    """A callable running the workload in ONNX Runtime (softmax, layer norm, conv) or numpy
    (matmul), and the peer's name."""
    import numpy as np

    rng = np.random.default_rng(0)
    if kind == "matmul":
        from threadpoolctl import threadpool_limits

        m, k, n, prec, t = params
        dt = np.float64 if prec == "double" else np.float32
        a = rng.random((m, k)).astype(dt)
        b = rng.random((n, k) if t else (k, n)).astype(dt)
        lim = threadpool_limits(limits=threads)

        def run():
            return a @ b.T if t else a @ b

        return run, "numpy", lim
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    F = TensorProto.FLOAT
    inits, feeds = [], {}
    if kind == "softmax":
        r, c = params
        x = rng.random((r, c), dtype=np.float32)
        nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=-1)]
    elif kind == "layernorm":
        r, c = params
        x = rng.random((r, c), dtype=np.float32)
        inits = [("g", rng.random(c, dtype=np.float32)), ("b", rng.random(c, dtype=np.float32))]
        nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1,
                                  epsilon=1e-5)]
    else:
        b, hw, cin, cout, st = params
        x = rng.random((b, cin, hw, hw), dtype=np.float32)
        inits = [("w", rng.random((cout, cin, 3, 3), dtype=np.float32))]
        nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3],
                                  pads=[1, 1, 1, 1], strides=[st, st])]
    feeds["x"] = x
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, x.shape)],
                          [helper.make_tensor_value_info("y", F, None)],
                          initializer=[numpy_helper.from_array(a, name=n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return (lambda: sess.run(None, feeds)), "onnxrt", sess


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--only", nargs="*", help="workloads whose name starts with one of these")
    p.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "arrayjit"))
    args = p.parse_args()
    if not os.path.exists(args.bin):
        sys.exit(f"{args.bin} is missing: run `cargo build --release` first")
    todo = {k: v for k, v in workloads().items()
            if not args.only or any(k.startswith(o) for o in args.only)}
    print(f"{len(todo)} workloads, {args.threads} thread(s), {args.rounds} rounds of "
          f"{args.runs} runs", flush=True)
    print(f"{'workload':34} {'arrayjit ms':>12} {'peer':>7} {'peer ms':>10} {'ratio':>7}")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (prog, kind, params) in todo.items():
            path = os.path.join(tmp, name + ".json")
            with open(path, "w") as f:
                json.dump(prog, f)
            ours, theirs = [], []
            for _ in range(args.rounds):
                # arrayjit first, with no peer session alive and a second after the last:
                # ONNX Runtime's idle threads keep spinning after a session is created or
                # run (for about a second), and OpenBLAS's after a product; they took a
                # core from arrayjit's team.
                time.sleep(1.0)
                out = subprocess.run(
                    [args.bin, "bench", path, "--threads", str(args.threads), "--warmup",
                     str(args.warmup), "--runs", str(args.runs)],
                    capture_output=True, text=True, check=True).stdout
                ours.append(json.loads(out)["run_ms"]["median"])
                fn, peer, keep = peer_session(kind, params, args.threads)
                theirs.append(median_ms(fn, args.warmup, args.runs))
                del fn, keep
                gc.collect()
            r = min(theirs) / min(ours)
            ratios.append(r)
            print(f"{name:34} {min(ours):12.3f} {peer:>7} {min(theirs):10.3f} {r:6.2f}x",
                  flush=True)
    ratios.sort()
    print(f"ratios: min {ratios[0]:.2f}x, median {statistics.median(ratios):.2f}x, "
          f"max {ratios[-1]:.2f}x")


if __name__ == "__main__":
    main()
