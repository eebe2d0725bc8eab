#!/usr/bin/env python3
"""The big moons training job of arrayjit's `moons` example, in JAX (CPU), for run.sh.

The same job, step for step: the same dataset (two moons, arrayjit's SplitMix64 generator
ported, so the points are identical), the same MLP 2-H-H-1 (ReLU hidden layers, linear
output; He-uniform weights drawn by the same generator in the same order, zero biases),
the same hinge loss `Σ relu(1 - t·y) / B`, the same SGD (`p = p - lr·(g + wd·p)`, the learning
rate decaying linearly from `lr` to `lr/2` over the training: step `s` of `S` uses
`lr·(2S - s)/2S`), the same batches (consecutive runs of B points, visited in the same
random order per epoch) and the same per-epoch loss readback. The dataset, its labels and the
learning-rate schedule live on the device; one training step is one `jax.jit`-compiled
function `(params, step, batch index) -> (params, loss)`.

  moons_jax.py [--points N] [--hidden H] [--batch B] [--epochs E] [--lr X] [--weight-decay X]
               [--seed N]

prints one JSON object: samples_per_s (over the training loop, from the first step to the
last epoch's loss readback, like arrayjit's `samples/s`), compile_ms (tracing, lowering and
XLA compilation of the step, ahead of time), the process's CPU time during the training
loop (over the wall time: how many cores it kept busy), the losses per epoch, the accuracy, versions
and the threading environment (XLA_FLAGS, the CPUs this process may run on).
"""

import argparse
import json
import math
import os
import sys
import time

MASK = (1 << 64) - 1


class Rng:
    """arrayjit's `nn::Rng` (SplitMix64), bit for bit."""

    def __init__(self, seed):
        self.s = (seed ^ 0x5DEECE66D1CE4E5B) & MASK

    def next_u64(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def uniform(self):
        return (self.next_u64() >> 11) / float(1 << 53)

    def range(self, lo, hi):
        return lo + (hi - lo) * self.uniform()

    def below(self, n):
        return min(int(self.uniform() * n), max(n - 1, 0))

    def permutation(self, n):
        v = list(range(n))
        for i in range(n - 1, 0, -1):
            j = self.below(i + 1)
            v[i], v[j] = v[j], v[i]
        return v


def dataset(n, seed):
    """`nn::moons::dataset`: two interleaved half-moons, labels ±1, alternating."""
    rng = Rng(seed)
    pairs = (n + 1) // 2
    points, labels = [], []
    for _ in range(pairs):
        k = rng.below(pairs)
        v = k * math.pi / pairs
        s, c = math.sin(v), math.cos(v)
        a = [c + rng.range(-0.1, 0.1), s + rng.range(-0.1, 0.1)]
        b = [1.0 - c + rng.range(-0.1, 0.1), 0.5 - s + rng.range(-0.1, 0.1)]
        points += [a, b]
        labels += [1.0, -1.0]
    return points[:n], labels[:n]


def init_params(sizes, seed):
    """`Mlp::new`: w uniform in ±sqrt(6/inputs), row-major [inputs, outputs]; b = 0."""
    rng = Rng(seed)
    params = []
    for ins, outs in zip(sizes[:-1], sizes[1:]):
        a = math.sqrt(6.0 / ins)
        w = [rng.range(-a, a) for _ in range(ins * outs)]
        params.append((w, ins, outs))
    return params


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--points", type=int, default=24576)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.0002)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    if jax.default_backend() != "cpu":
        raise RuntimeError(f"JAX's default backend is {jax.default_backend()}, not cpu")
    f32 = jnp.float32
    B, H = args.batch, args.hidden
    pts, lab = dataset(args.points, args.seed)
    per_epoch = len(pts) // B
    if per_epoch == 0:
        raise SystemExit("the batch is larger than the dataset")
    steps = per_epoch * args.epochs
    used = per_epoch * B
    data_x = jnp.asarray(np.array(pts[:used], dtype=np.float32).reshape(per_epoch, B, 2))
    data_t = jnp.asarray(np.array(lab[:used], dtype=np.float32).reshape(per_epoch, B, 1))
    schedule = jnp.asarray(
        np.array([args.lr * (2 * steps - s) / (2 * steps) for s in range(steps)], dtype=np.float32))
    params = [
        (jnp.asarray(np.array(w, dtype=np.float32).reshape(ins, outs)), jnp.zeros((outs,), f32))
        for w, ins, outs in init_params([2, H, H, 1], args.seed)
    ]
    wd = args.weight_decay

    def forward(params, x):
        for w, b in params[:-1]:
            x = jax.nn.relu(x @ w + b)
        w, b = params[-1]
        return x @ w + b

    def loss_fn(params, x, t):
        return jnp.sum(jax.nn.relu(1.0 - t * forward(params, x))) / B

    def step(params, s, k):
        x = jax.lax.dynamic_index_in_dim(data_x, k, keepdims=False)
        t = jax.lax.dynamic_index_in_dim(data_t, k, keepdims=False)
        loss, grads = jax.value_and_grad(loss_fn)(params, x, t)
        lr = schedule[s]
        new = jax.tree_util.tree_map(lambda q, g: q - lr * (g + wd * q), params, grads)
        return new, loss

    # Ahead-of-time: trace and lower, then compile, timed separately (no compilation cache:
    # JAX's persistent cache is off unless configured).
    s0, k0 = jnp.int32(0), jnp.int32(0)
    t0 = time.perf_counter()
    lowered = jax.jit(step, donate_argnums=0).lower(params, s0, k0)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()

    # Step indices as device scalars made beforehand (arrayjit sets its static indices
    # without copying anything to the device, either).
    s_dev = [jnp.int32(s) for s in range(steps)]
    k_dev = [jnp.int32(k) for k in range(per_epoch)]
    jax.block_until_ready((s_dev, k_dev, params))

    order = Rng((args.seed * 0x9E3779B9 + 7) & MASK)
    epoch_losses = []
    s = 0
    t_train = time.perf_counter()
    c_train = time.process_time()
    for _ in range(args.epochs):
        losses = []
        for k in order.permutation(per_epoch):
            params, loss = compiled(params, s_dev[s], k_dev[k])
            losses.append(loss)
            s += 1
        epoch_losses.append(float(np.mean(jax.device_get(losses))))
    train_s = time.perf_counter() - t_train
    train_cpu_s = time.process_time() - c_train

    scores = np.asarray(jax.jit(forward)(params, jnp.asarray(np.array(pts, dtype=np.float32))))[:, 0]
    accuracy = float(np.mean((scores > 0) == (np.array(lab) > 0)))

    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        cpus = None
    out = {
        "peer": "jax",
        "version": jax.__version__,
        "jaxlib": getattr(jax.lib, "__version__", None) or getattr(__import__("jaxlib"), "__version__", None),
        "devices": [str(d) for d in jax.devices()],
        "xla_flags": os.environ.get("XLA_FLAGS"),
        "cpus": cpus,
        "points": len(pts),
        "hidden": H,
        "batch": B,
        "epochs": args.epochs,
        "steps": steps,
        "train_ms": train_s * 1e3,
        "train_cpu_ms": train_cpu_s * 1e3,
        "samples_per_s": steps * B / train_s,
        "trace_lower_ms": (t1 - t0) * 1e3,
        "xla_compile_ms": (t2 - t1) * 1e3,
        "compile_ms": (t2 - t0) * 1e3,
        "epoch_losses": epoch_losses,
        "accuracy": accuracy,
    }
    json.dump(out, sys.stdout)
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
