//! Kernel throughput on the cc backend for the workloads of the performance issue (one
//! thread): f32 matmul 512³ and 1024³, the contractions of issue 10 (the transposed matmul
//! `ij,kj->ik` at 768³ f32, the batched matmul `bij,bjk->bik` 16×128³ f32 and the f64 matmul
//! 1024³), the fused elementwise chain `out = max(0, a*b + c)*2 - d` on 2^24 f32 elements, and
//! the row sums of a 4096×4096 f32 matrix (the same workloads as `benches/programs/*.json`,
//! which `benches/peers/run.sh` times beside numpy, tinygrad and JAX).
//!
//! Each workload is built with the library, compiled once, linked, its inputs are copied to
//! the context once, and only `routine.run()` is timed. In the same group, as a baseline
//! measured in the same process, a plain Rust loop nest computes the same thing (i-k-j for
//! matmul, also per batch for the batched one and in f64 for the f64 one; 8-accumulator dot
//! products for the transposed matmul; a straightforward loop for the elementwise chain, one
//! accumulator for row sums; the row sums also get an 8-accumulator (reassociated) loop). The baselines are compiled
//! for AVX2 when the processor has it (the generated C uses `-march=native`); Rust does not
//! contract `a*b + c` into FMAs, gcc does.
//!
//! Throughput: matmul in FLOPs (2·n³, shown by criterion as elements/s, i.e. FLOP/s); the
//! others in bytes moved (fused: 5 arrays × 4 B × n; row sums: 4096² × 4 B), shown in decimal
//! units (GB/s), like the issue.
//!
//! Before timing, the arrayjit result is checked against the baseline.
//!
//! The `bounds checks` groups measure the cost of bounds-checked code (`ARRAYJIT_CHECKED`,
//! `CcBackend::with_checked`) on the f32 matmul 512³ (GEMM kernels: packing, vector tiles)
//! and the fused elementwise chain on 2^24 f32: the same routine compiled unchecked and
//! checked. Only these: `cargo bench --bench kernels -- "bounds checks"`.

use arrayjit::backend::{CcBackend, Config, MergeBuffer, Routine};
use arrayjit::ir::einsum::projections;
use arrayjit::ir::{
    Assignments, Bindings, Binop, Buffer, FetchOp, InitOp, MemoryMode, Prec, Tnode, Unop,
};
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use criterion::{measurement::WallTime, SamplingMode};
use std::hint::black_box;
use std::time::Duration;

fn uniform(name: &str, dims: &[usize], seed: u64) -> Tnode {
    uniform_prec(name, dims, seed, Prec::Single)
}

fn uniform_prec(name: &str, dims: &[usize], seed: u64, prec: Prec) -> Tnode {
    Tnode::with_init(&[name], dims, prec, &InitOp::StandardUniform { seed }).unwrap()
}

/// A hosted output (so that the result can be checked), kept in the context.
fn output(name: &str, dims: &[usize]) -> Tnode {
    output_prec(name, dims, Prec::Single)
}

fn output_prec(name: &str, dims: &[usize], prec: Prec) -> Tnode {
    Tnode::builder(&[name], dims, prec)
        .memory(MemoryMode::OnDevice)
        .hosted()
        .build()
        .unwrap()
}

fn temp(name: &str, dims: &[usize]) -> Tnode {
    Tnode::new(&[name], dims, Prec::Single).unwrap()
}

fn binop(
    lhs: &Tnode,
    accum: Binop,
    init: bool,
    op: Binop,
    a: &Tnode,
    b: &Tnode,
    spec: &str,
) -> Assignments {
    Assignments::AccumBinop {
        initialize_neutral: init,
        accum,
        op,
        lhs: lhs.clone(),
        rhs1: Buffer::Node(a.clone()),
        rhs2: Buffer::Node(b.clone()),
        projections: projections(spec, lhs.dims(), &[a.dims(), b.dims()], &Bindings::empty())
            .unwrap(),
    }
}

fn unop(lhs: &Tnode, accum: Binop, init: bool, op: Unop, a: &Tnode, spec: &str) -> Assignments {
    Assignments::AccumUnop {
        initialize_neutral: init,
        accum,
        op,
        lhs: lhs.clone(),
        rhs: Buffer::Node(a.clone()),
        projections: projections(spec, lhs.dims(), &[a.dims()], &Bindings::empty()).unwrap(),
    }
}

/// Compiles once, links, copies the inputs to the context once.
fn build(be: &CcBackend, name: &str, code: &Assignments, inputs: &[&Tnode]) -> Routine {
    be.initialize(Config::default());
    let compiled = be
        .compile(true, Some(name), &Bindings::empty(), code)
        .unwrap();
    let ctx = be.init(name).unwrap();
    let r = be.link(&[], &MergeBuffer::new(), &ctx, &compiled).unwrap();
    for tn in inputs {
        assert!(
            be.from_host(r.context(), tn).unwrap(),
            "{} not in the context",
            tn.name()
        );
    }
    r
}

fn host_f32(tn: &Tnode) -> Vec<f32> {
    tn.host_values()
        .unwrap()
        .into_iter()
        .map(|v| v as f32)
        .collect()
}

/// Runs once, reads `out` back and compares it with `want`.
fn check(be: &CcBackend, r: &Routine, out: &Tnode, want: &[f32], rel_tol: f32) {
    let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
    check_f64(be, r, out, &want, rel_tol as f64);
}

/// [`check`] in f64.
fn check_f64(be: &CcBackend, r: &Routine, out: &Tnode, want: &[f64], rel_tol: f64) {
    r.run().unwrap();
    assert!(be.to_host(r.context(), out).unwrap());
    let got = out.host_values().unwrap();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rel_tol * w.abs().max(1.0),
            "{}: cell {i}: arrayjit {g}, baseline {w}",
            out.name()
        );
    }
}

fn configure(g: &mut BenchmarkGroup<'_, WallTime>) {
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sampling_mode(SamplingMode::Flat);
}

/// Runs `f` compiled for AVX2 and FMA when the processor has them (the generated C is compiled
/// with `-march=native`), else as is.
macro_rules! native {
    ($(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),*) $body:block) => {
        $(#[$m])*
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $body
                if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                    // SAFETY: the features `avx2` was compiled for are present.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $body
        }
    };
}

native! {
    /// `c = a @ b`, all n×n, loop order i-k-j.
    fn matmul_ikj(a: &[f32], b: &[f32], c: &mut [f32], n: usize) {
        c.fill(0.0);
        for i in 0..n {
            let ci = &mut c[i * n..(i + 1) * n];
            for k in 0..n {
                let aik = a[i * n + k];
                let bk = &b[k * n..(k + 1) * n];
                for (cij, bkj) in ci.iter_mut().zip(bk) {
                    *cij += aik * bkj;
                }
            }
        }
    }
}

native! {
    /// `c = a @ b`, all n×n f64, loop order i-k-j.
    fn matmul_ikj_f64(a: &[f64], b: &[f64], c: &mut [f64], n: usize) {
        c.fill(0.0);
        for i in 0..n {
            let ci = &mut c[i * n..(i + 1) * n];
            for k in 0..n {
                let aik = a[i * n + k];
                let bk = &b[k * n..(k + 1) * n];
                for (cij, bkj) in ci.iter_mut().zip(bk) {
                    *cij += aik * bkj;
                }
            }
        }
    }
}

native! {
    /// `c = a @ bᵀ` (`c[i,k] = Σ_j a[i,j]·b[k,j]`), all n×n: a dot product of two rows per
    /// cell, with 8 accumulators (reassociated, so it vectorizes).
    fn matmul_abt(a: &[f32], b: &[f32], c: &mut [f32], n: usize) {
        for i in 0..n {
            let ai = &a[i * n..(i + 1) * n];
            for k in 0..n {
                let bk = &b[k * n..(k + 1) * n];
                let mut acc = [0.0f32; 8];
                let (ca, cb) = (ai.chunks_exact(8), bk.chunks_exact(8));
                let rest: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
                for (x, y) in ca.zip(cb) {
                    for l in 0..8 {
                        acc[l] += x[l] * y[l];
                    }
                }
                c[i * n + k] = acc.iter().sum::<f32>() + rest;
            }
        }
    }
}

native! {
    /// `out = max(0, a*b + c)*2 - d`.
    fn fused_loop(a: &[f32], b: &[f32], c: &[f32], d: &[f32], out: &mut [f32]) {
        for i in 0..out.len() {
            out[i] = (a[i] * b[i] + c[i]).max(0.0) * 2.0 - d[i];
        }
    }
}

native! {
    /// Row sums with one scalar accumulator per row (summed in order).
    fn row_sums_1acc(x: &[f32], s: &mut [f32], cols: usize) {
        for (row, si) in x.chunks_exact(cols).zip(s.iter_mut()) {
            let mut acc = 0.0f32;
            for v in row {
                acc += v;
            }
            *si = acc;
        }
    }
}

native! {
    /// Row sums with 8 independent accumulators (reassociated, so it vectorizes).
    fn row_sums_8acc(x: &[f32], s: &mut [f32], cols: usize) {
        for (row, si) in x.chunks_exact(cols).zip(s.iter_mut()) {
            let mut acc = [0.0f32; 8];
            let chunks = row.chunks_exact(8);
            let rest: f32 = chunks.remainder().iter().sum();
            for ch in chunks {
                for (a, v) in acc.iter_mut().zip(ch) {
                    *a += v;
                }
            }
            *si = acc.iter().sum::<f32>() + rest;
        }
    }
}

fn matmul(c: &mut Criterion) {
    for n in [512usize, 1024] {
        let a = uniform("a", &[n, n], 1);
        let b = uniform("b", &[n, n], 2);
        let out = output("c", &[n, n]);
        let code = binop(&out, Binop::Add, true, Binop::Mul, &a, &b, "ij,jk->ik");
        let be = CcBackend::new();
        let r = build(&be, "matmul", &code, &[&a, &b]);
        let (ha, hb) = (host_f32(&a), host_f32(&b));
        let mut hc = vec![0.0f32; n * n];
        matmul_ikj(&ha, &hb, &mut hc, n);
        check(&be, &r, &out, &hc, 1e-4);

        let mut g = c.benchmark_group(format!("matmul {n}x{n}x{n} f32"));
        configure(&mut g);
        g.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
        g.bench_function("arrayjit", |bench| bench.iter(|| r.run().unwrap()));
        g.bench_function("rust i-k-j baseline", |bench| {
            bench.iter(|| {
                matmul_ikj(black_box(&ha), black_box(&hb), &mut hc, n);
                black_box(&hc);
            })
        });
        g.finish();
    }
}

/// The contractions of issue 10: `a @ bᵀ` at 768³ f32, the batched matmul 16×128³ f32 and
/// the f64 matmul 1024³.
fn contractions(c: &mut Criterion) {
    // Transposed: c[i,k] = Σ_j a[i,j]·b[k,j].
    {
        let n = 768usize;
        let a = uniform("a", &[n, n], 1);
        let b = uniform("b", &[n, n], 2);
        let out = output("c", &[n, n]);
        let code = binop(&out, Binop::Add, true, Binop::Mul, &a, &b, "ij,kj->ik");
        let be = CcBackend::new();
        let r = build(&be, "matmul_t", &code, &[&a, &b]);
        let (ha, hb) = (host_f32(&a), host_f32(&b));
        let mut hc = vec![0.0f32; n * n];
        matmul_abt(&ha, &hb, &mut hc, n);
        check(&be, &r, &out, &hc, 1e-4);

        let mut g = c.benchmark_group(format!("matmul a@b.T (ij,kj->ik) {n}x{n}x{n} f32"));
        configure(&mut g);
        g.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
        g.bench_function("arrayjit", |bench| bench.iter(|| r.run().unwrap()));
        g.bench_function("rust 8-accumulator dot baseline", |bench| {
            bench.iter(|| {
                matmul_abt(black_box(&ha), black_box(&hb), &mut hc, n);
                black_box(&hc);
            })
        });
        g.finish();
    }
    // Batched: c[b,i,k] = Σ_j a[b,i,j]·b[b,j,k].
    {
        let (nb, n) = (16usize, 128usize);
        let a = uniform("a", &[nb, n, n], 1);
        let b = uniform("b", &[nb, n, n], 2);
        let out = output("c", &[nb, n, n]);
        let code = binop(&out, Binop::Add, true, Binop::Mul, &a, &b, "bij,bjk->bik");
        let be = CcBackend::new();
        let r = build(&be, "bmm", &code, &[&a, &b]);
        let (ha, hb) = (host_f32(&a), host_f32(&b));
        let mut hc = vec![0.0f32; nb * n * n];
        let bmm = |hc: &mut [f32]| {
            for ((ab, bb), cb) in ha
                .chunks_exact(n * n)
                .zip(hb.chunks_exact(n * n))
                .zip(hc.chunks_exact_mut(n * n))
            {
                matmul_ikj(black_box(ab), black_box(bb), cb, n);
            }
        };
        bmm(&mut hc);
        check(&be, &r, &out, &hc, 1e-4);

        let mut g = c.benchmark_group(format!("batched matmul {nb}x{n}x{n}x{n} f32"));
        configure(&mut g);
        g.throughput(Throughput::Elements(2 * nb as u64 * (n as u64).pow(3)));
        g.bench_function("arrayjit", |bench| bench.iter(|| r.run().unwrap()));
        g.bench_function("rust i-k-j baseline per batch", |bench| {
            bench.iter(|| {
                bmm(&mut hc);
                black_box(&hc);
            })
        });
        g.finish();
    }
    // f64.
    {
        let n = 1024usize;
        let a = uniform_prec("a", &[n, n], 1, Prec::Double);
        let b = uniform_prec("b", &[n, n], 2, Prec::Double);
        let out = output_prec("c", &[n, n], Prec::Double);
        let code = binop(&out, Binop::Add, true, Binop::Mul, &a, &b, "ij,jk->ik");
        let be = CcBackend::new();
        let r = build(&be, "matmul_f64", &code, &[&a, &b]);
        let (ha, hb) = (a.host_values().unwrap(), b.host_values().unwrap());
        let mut hc = vec![0.0f64; n * n];
        matmul_ikj_f64(&ha, &hb, &mut hc, n);
        check_f64(&be, &r, &out, &hc, 1e-10);

        let mut g = c.benchmark_group(format!("matmul {n}x{n}x{n} f64"));
        configure(&mut g);
        g.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
        g.bench_function("arrayjit", |bench| bench.iter(|| r.run().unwrap()));
        g.bench_function("rust i-k-j baseline", |bench| {
            bench.iter(|| {
                matmul_ikj_f64(black_box(&ha), black_box(&hb), &mut hc, n);
                black_box(&hc);
            })
        });
        g.finish();
    }
}

fn fused(c: &mut Criterion) {
    let n = 1usize << 24;
    let [a, b, cc, d] =
        [("a", 1), ("b", 2), ("c", 3), ("d", 4)].map(|(s, seed)| uniform(s, &[n], seed));
    let two = temp("two", &[1]);
    let (ab, abc, r, r2) = (
        temp("ab", &[n]),
        temp("abc", &[n]),
        temp("r", &[n]),
        temp("r2", &[n]),
    );
    let out = output("out", &[n]);
    let code = Assignments::block(
        "out = max(0, a*b + c) * 2 - d",
        Assignments::seq([
            binop(&ab, Binop::Arg2, false, Binop::Mul, &a, &b, "i,i->i"),
            binop(&abc, Binop::Arg2, false, Binop::Add, &ab, &cc, "i,i->i"),
            unop(&r, Binop::Arg2, false, Unop::Relu, &abc, "i->i"),
            Assignments::Fetch {
                array: two.clone(),
                fetch_op: FetchOp::Constant(2.0),
            },
            binop(&r2, Binop::Arg2, false, Binop::Mul, &r, &two, "i,0->i"),
            binop(&out, Binop::Arg2, false, Binop::Sub, &r2, &d, "i,i->i"),
        ]),
    );
    let be = CcBackend::new();
    let routine = build(&be, "fused", &code, &[&a, &b, &cc, &d]);
    let [ha, hb, hc, hd] = [&a, &b, &cc, &d].map(host_f32);
    let mut hout = vec![0.0f32; n];
    fused_loop(&ha, &hb, &hc, &hd, &mut hout);
    check(&be, &routine, &out, &hout, 1e-6);

    let mut g = c.benchmark_group("fused elementwise 2^24 f32");
    configure(&mut g);
    g.throughput(Throughput::BytesDecimal(5 * 4 * n as u64));
    g.bench_function("arrayjit", |bench| bench.iter(|| routine.run().unwrap()));
    g.bench_function("rust loop baseline", |bench| {
        bench.iter(|| {
            fused_loop(
                black_box(&ha),
                black_box(&hb),
                black_box(&hc),
                black_box(&hd),
                &mut hout,
            );
            black_box(&hout);
        })
    });
    g.finish();
}

fn row_sums(c: &mut Criterion) {
    let n = 4096usize;
    let x = uniform("x", &[n, n], 1);
    let s = output("s", &[n]);
    let code = unop(&s, Binop::Add, true, Unop::Identity, &x, "ij->i");
    let be = CcBackend::new();
    let r = build(&be, "row_sums", &code, &[&x]);
    let hx = host_f32(&x);
    let mut hs = vec![0.0f32; n];
    row_sums_1acc(&hx, &mut hs, n);
    check(&be, &r, &s, &hs, 1e-4);

    let mut g = c.benchmark_group("row sums 4096x4096 f32");
    configure(&mut g);
    g.throughput(Throughput::BytesDecimal((n * n * 4) as u64));
    g.bench_function("arrayjit", |bench| bench.iter(|| r.run().unwrap()));
    g.bench_function("rust one-accumulator baseline", |bench| {
        bench.iter(|| {
            row_sums_1acc(black_box(&hx), &mut hs, n);
            black_box(&hs);
        })
    });
    g.bench_function("rust 8-accumulator baseline", |bench| {
        bench.iter(|| {
            row_sums_8acc(black_box(&hx), &mut hs, n);
            black_box(&hs);
        })
    });
    g.finish();
}

/// The fused chain of [`fused`] on `n` elements: the code, its inputs, its output and the
/// baseline's result.
fn fused_program(n: usize) -> (Assignments, [Tnode; 4], Tnode, Vec<f32>) {
    let [a, b, cc, d] =
        [("a", 1), ("b", 2), ("c", 3), ("d", 4)].map(|(s, seed)| uniform(s, &[n], seed));
    let two = temp("two", &[1]);
    let (ab, abc, r, r2) = (
        temp("ab", &[n]),
        temp("abc", &[n]),
        temp("r", &[n]),
        temp("r2", &[n]),
    );
    let out = output("out", &[n]);
    let code = Assignments::seq([
        binop(&ab, Binop::Arg2, false, Binop::Mul, &a, &b, "i,i->i"),
        binop(&abc, Binop::Arg2, false, Binop::Add, &ab, &cc, "i,i->i"),
        unop(&r, Binop::Arg2, false, Unop::Relu, &abc, "i->i"),
        Assignments::Fetch {
            array: two.clone(),
            fetch_op: FetchOp::Constant(2.0),
        },
        binop(&r2, Binop::Arg2, false, Binop::Mul, &r, &two, "i,0->i"),
        binop(&out, Binop::Arg2, false, Binop::Sub, &r2, &d, "i,i->i"),
    ]);
    let [ha, hb, hc, hd] = [&a, &b, &cc, &d].map(host_f32);
    let mut want = vec![0.0f32; n];
    fused_loop(&ha, &hb, &hc, &hd, &mut want);
    (code, [a, b, cc, d], out, want)
}

/// Bounds-checked against unchecked code: the matmul 512³ f32 and the fused chain.
fn bounds_checks(c: &mut Criterion) {
    let n = 512usize;
    let a = uniform("a", &[n, n], 1);
    let b = uniform("b", &[n, n], 2);
    let out = output("c", &[n, n]);
    let code = binop(&out, Binop::Add, true, Binop::Mul, &a, &b, "ij,jk->ik");
    let mut want = vec![0.0f32; n * n];
    matmul_ikj(&host_f32(&a), &host_f32(&b), &mut want, n);
    let mut g = c.benchmark_group(format!("bounds checks: matmul {n}x{n}x{n} f32"));
    configure(&mut g);
    g.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
    for checked in [false, true] {
        let be = CcBackend::new().with_checked(checked);
        let r = build(&be, "matmul", &code, &[&a, &b]);
        assert_eq!(r.signature().checked, checked);
        check(&be, &r, &out, &want, 1e-4);
        let label = if checked { "checked" } else { "unchecked" };
        g.bench_function(label, |bench| bench.iter(|| r.run().unwrap()));
    }
    g.finish();

    let n = 1usize << 24;
    let (code, inputs, out, want) = fused_program(n);
    let mut g = c.benchmark_group("bounds checks: fused elementwise 2^24 f32");
    configure(&mut g);
    g.throughput(Throughput::BytesDecimal(5 * 4 * n as u64));
    for checked in [false, true] {
        let be = CcBackend::new().with_checked(checked);
        let r = build(&be, "fused", &code, &inputs.each_ref());
        assert_eq!(r.signature().checked, checked);
        check(&be, &r, &out, &want, 1e-6);
        let label = if checked { "checked" } else { "unchecked" };
        g.bench_function(label, |bench| bench.iter(|| r.run().unwrap()));
    }
    g.finish();
}

criterion_group!(
    benches,
    matmul,
    contractions,
    fused,
    row_sums,
    bounds_checks
);
criterion_main!(benches);
