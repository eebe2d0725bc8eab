//! bfloat16 contractions through AVX512-BF16's dot products of pairs (`vdpbf16ps`, issue 20):
//! where the resolved target has them and the configuration asks for them
//! (`CompilerConfig::bf16_dot`, off by default), a contraction of bfloat16 (or fp8) operands
//! into a single-precision result multiplies pairs of steps packed side by side; otherwise it
//! converts the operands to `float` while packing. Both are checked against sums computed
//! here (the dot products only on a machine that has them), exactly where the sums are exact,
//! and the interpreter against the instruction's documented semantics.

mod common;

use arrayjit::backend::CcBackend;
use arrayjit::compile::{CompilerConfig, Target};
use arrayjit::interp::{self, Memory};
use arrayjit::ir::*;
use arrayjit::optimize::{self, Settings};
use arrayjit::target::VectorTarget;
use common::*;

/// Whether this machine's compile target (the configuration from the environment, as the
/// backend resolves it) has the dot products.
fn target_has_dot() -> bool {
    let cfg = CompilerConfig::from_env().unwrap();
    Target::resolve(&cfg).unwrap().vector_target(false).bf16_dot
}

/// The settings of `CompilerConfig::bf16_dot` to run: off (the default), and on where the
/// target has the dot products.
fn dot_settings() -> Vec<bool> {
    if target_has_dot() {
        vec![false, true]
    } else {
        vec![false]
    }
}

/// A backend with the environment's compiler configuration and the dot products on or off.
fn backend(dot: bool) -> CcBackend {
    let cfg = CompilerConfig::from_env().unwrap().bf16_dot(dot);
    CcBackend::with_config(cfg, Settings::default())
}

/// `c[i, k] = Σ_j a[i, j] · b[j, k]` in f64 (`bt`: `b` is given as `[k, j]`).
fn matmul_ref(a: &[f64], b: &[f64], (m, n, k): (usize, usize, usize), bt: bool) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for col in 0..n {
            let mut s = 0.0;
            for j in 0..k {
                let bv = if bt { b[col * k + j] } else { b[j * n + col] };
                s += a[i * k + j] * bv;
            }
            c[i * n + col] = s;
        }
    }
    c
}

/// Small integers (−4..=4): every product and partial sum below 2^24 is exact in single
/// precision, so any order of summation gives exactly the f64 sum.
fn small_ints(n: usize, seed: usize) -> Vec<f64> {
    (0..n)
        .map(|i| ((i * 7 + seed * 13 + i / 5) % 9) as f64 - 4.0)
        .collect()
}

/// Values of a simple generator in (-1, 1), rounded to `prec` as storing does.
fn uniform(n: usize, seed: u64, prec: Prec) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0;
            round_to(prec, u)
        })
        .collect()
}

struct Case {
    m: usize,
    n: usize,
    k: usize,
    bt: bool,
    xp: Prec,
    yp: Prec,
}

/// Compiles and runs `c = a @ b` (or `a @ b.T`) for the case with the given operand values,
/// with the dot products asked for or not; returns the result and the C source.
fn run_case(c: &Case, av: &[f64], bv: &[f64], dot: bool) -> (Vec<f64>, String) {
    let a = input("a", &[c.m, c.k], c.xp, av);
    let bdims = if c.bt { [c.n, c.k] } else { [c.k, c.n] };
    let b = input("b", &bdims, c.yp, bv);
    let out = output("c", &[c.m, c.n], Prec::Single);
    let spec = if c.bt { "ij,kj->ik" } else { "ij,jk->ik" };
    let asg = binop(
        &out,
        Binop::Add,
        true,
        Binop::Mul,
        &a,
        &b,
        spec,
        &Bindings::empty(),
    );
    let backend = backend(dot);
    let (r, src) = build(&backend, "bf16_dot", &Bindings::empty(), &asg).unwrap();
    (run_and_read(&backend, &r, &[&out]).remove(0), src)
}

fn cases() -> Vec<Case> {
    let bf = Prec::Bfloat16;
    let mk = |m, n, k, bt, xp, yp| Case {
        m,
        n,
        k,
        bt,
        xp,
        yp,
    };
    vec![
        // Edge row panels, an edge column panel, an odd number of steps.
        mk(37, 45, 53, false, bf, bf),
        // Few steps (fewer than four stay loops): two whole pairs; two and a padded one.
        mk(200, 180, 4, false, bf, bf),
        mk(150, 180, 5, false, bf, bf),
        // Several reduction blocks (the last one shorter and odd), several column blocks.
        mk(40, 600, 1101, false, bf, bf),
        // `a @ b.T`: `b` read along the steps while packing.
        mk(35, 50, 61, true, bf, bf),
        // fp8 (E5M2) operands: every fp8 value is a normal bfloat16.
        mk(34, 36, 39, false, Prec::Fp8, bf),
        mk(30, 33, 47, false, Prec::Fp8, Prec::Fp8),
    ]
}

/// With small integer operands every sum is exact: the kernels (dot products of pairs where
/// the target has them and they are asked for, conversions to float otherwise) give exactly
/// the sums computed here, and the C uses the dot products exactly when asked for.
#[test]
fn exact_sums_through_the_kernels() {
    for dot in dot_settings() {
        for c in cases() {
            let av = small_ints(c.m * c.k, 1);
            let bv = small_ints(c.n * c.k, 2);
            let want = matmul_ref(&av, &bv, (c.m, c.n, c.k), c.bt);
            let (got, src) = run_case(&c, &av, &bv, dot);
            let what = format!(
                "{}x{}x{} bt {} {}/{} dot {dot}",
                c.m, c.n, c.k, c.bt, c.xp, c.yp
            );
            assert!(src.contains("GEMM kernel"), "{what}: no kernel\n{src}");
            assert_eq!(
                src.contains("AJ_DPBF16PS("),
                dot,
                "{what}: dot products used exactly when asked for"
            );
            assert_eq!(got, want, "{what}");
        }
    }
}

/// Values in (-1, 1): the result is within the bound of any blocked single-precision sum,
/// `k · 2^-24 · Σ |a| |b|` per cell (each step's product is exact; each addition rounds once),
/// of the exact sum of the rounded inputs.
#[test]
fn rounded_sums_are_within_the_bound() {
    for (dot, c) in dot_settings()
        .into_iter()
        .flat_map(|d| cases().into_iter().map(move |c| (d, c)))
    {
        let av = uniform(c.m * c.k, 3, c.xp);
        let bv = uniform(c.n * c.k, 4, c.yp);
        let want = matmul_ref(&av, &bv, (c.m, c.n, c.k), c.bt);
        let abs_a: Vec<f64> = av.iter().map(|x| x.abs()).collect();
        let abs_b: Vec<f64> = bv.iter().map(|x| x.abs()).collect();
        let mag = matmul_ref(&abs_a, &abs_b, (c.m, c.n, c.k), c.bt);
        let (got, _) = run_case(&c, &av, &bv, dot);
        for (idx, ((g, w), s)) in got.iter().zip(&want).zip(&mag).enumerate() {
            let bound = c.k as f64 * f32::EPSILON as f64 * s + f64::from(f32::MIN_POSITIVE);
            assert!(
                (g - w).abs() <= bound,
                "{}x{}x{} dot {dot} cell {idx}: {g} vs {w} (bound {bound})",
                c.m,
                c.n,
                c.k
            );
        }
    }
}

/// Infinities and NaN propagate as in any order of the sum: a row holding +∞ against
/// positive columns gives +∞, against a zero column NaN, and a NaN gives NaN.
#[test]
fn infinities_and_nan_propagate() {
    let (m, n, k) = (33, 40, 21);
    let mut av = small_ints(m * k, 5)
        .iter()
        .map(|x| x.abs() + 1.0)
        .collect::<Vec<_>>();
    let mut bv = small_ints(n * k, 6)
        .iter()
        .map(|x| x.abs() + 1.0)
        .collect::<Vec<_>>();
    av[3 * k + 7] = f64::INFINITY;
    av[5 * k + 8] = f64::NAN;
    // Column 9 of b is 0 at step 7: ∞ · 0 = NaN in row 3.
    bv[7 * n + 9] = 0.0;
    let c = Case {
        m,
        n,
        k,
        bt: false,
        xp: Prec::Bfloat16,
        yp: Prec::Bfloat16,
    };
    let want = matmul_ref(&av, &bv, (m, n, k), false);
    for dot in dot_settings() {
        let (got, _) = run_case(&c, &av, &bv, dot);
        for col in 0..n {
            let row3 = got[3 * n + col];
            if col == 9 {
                assert!(row3.is_nan(), "dot {dot}: ∞ · 0 at column 9: {row3}");
            } else {
                assert_eq!(row3, f64::INFINITY, "dot {dot}: row 3 column {col}");
            }
            assert!(got[5 * n + col].is_nan(), "dot {dot}: row 5 column {col}");
        }
        assert_eq!(got[0..3 * n], want[0..3 * n], "dot {dot}");
    }
}

/// A target with the dot products, as the optimizer sees it.
fn dot_target() -> VectorTarget {
    avx512_target()
        .bf16_dot(true)
        .l1d_bytes(2 << 10)
        .l2_bytes(16 << 10)
}

/// The assignments and nodes of a case.
fn case_nodes(c: &Case, av: &[f64], bv: &[f64]) -> (Assignments, [Tnode; 3]) {
    let a = input("a", &[c.m, c.k], c.xp, av);
    let bdims = if c.bt { [c.n, c.k] } else { [c.k, c.n] };
    let b = input("b", &bdims, c.yp, bv);
    let out = output("c", &[c.m, c.n], Prec::Single);
    let spec = if c.bt { "ij,kj->ik" } else { "ij,jk->ik" };
    let asg = binop(
        &out,
        Binop::Add,
        true,
        Binop::Mul,
        &a,
        &b,
        spec,
        &Bindings::empty(),
    );
    (asg, [a, b, out])
}

/// The interpreter runs the dot-product kernels (forced on, with tiny caches, so that every
/// blocking path is taken) with the instruction's semantics: exact sums stay exact.
#[test]
fn the_interpreter_runs_the_dot_product_kernels() {
    let settings = Settings::default().target(Some(dot_target()));
    for c in cases() {
        let (av, bv) = (small_ints(c.m * c.k, 7), small_ints(c.n * c.k, 8));
        let (asg, [a, b, out]) = case_nodes(&c, &av, &bv);
        let o = optimize::optimize("k", arrayjit::lower::lower(&asg).unwrap(), &settings).unwrap();
        let doc = arrayjit::loops::to_doc(&o.code);
        assert!(doc.contains("dot_pairs("), "no dot products:\n{doc}");
        let mut mem = Memory::new();
        mem.load_from_hosts([&a, &b, &out]);
        interp::run_optimized(&o, &[], &mut mem).unwrap();
        assert_eq!(
            mem.get(&out).unwrap(),
            matmul_ref(&av, &bv, (c.m, c.n, c.k), c.bt).as_slice()
        );
    }
}

/// On a machine with the instruction, the compiled kernel and the interpreter running the
/// same optimized code agree bit for bit on rounded sums: the instruction does what
/// `Vlv::DotPairs` documents (each step `s + a·b` rounds once, the odd step of a pair first).
#[test]
fn compiled_dot_products_match_their_documented_semantics() {
    if !target_has_dot() {
        eprintln!("this target has no AVX512-BF16: nothing to compare");
        return;
    }
    for c in cases() {
        let (av, bv) = (uniform(c.m * c.k, 9, c.xp), uniform(c.n * c.k, 10, c.yp));
        let (asg, [a, b, out]) = case_nodes(&c, &av, &bv);
        let backend = backend(true);
        backend.initialize(arrayjit::backend::Config::default());
        let code = backend
            .compile(true, Some("dot"), &Bindings::empty(), &asg)
            .unwrap();
        assert!(code.source().contains("AJ_DPBF16PS("));
        let ctx = backend.init("dot").unwrap();
        let r = backend
            .link(&[], &arrayjit::backend::MergeBuffer::new(), &ctx, &code)
            .unwrap();
        for t in [&a, &b, &out] {
            backend.from_host(r.context(), t).unwrap();
        }
        let compiled = run_and_read(&backend, &r, &[&out]).remove(0);
        let mut mem = Memory::new();
        mem.load_from_hosts([&a, &b, &out]);
        interp::run_optimized(code.optimized(), &[], &mut mem).unwrap();
        assert_eq!(
            mem.get(&out).unwrap(),
            compiled.as_slice(),
            "{}x{}x{}: interpreted vs compiled",
            c.m,
            c.n,
            c.k
        );
    }
}

/// Subnormal inputs and results count as zero in the dot products (as the instruction
/// defines them), and are kept by the portable kernels: 2^-70 · 2^-70 = 2^-140, a subnormal
/// single. The semantics chapter documents the difference.
#[test]
fn subnormal_products_flush_only_with_the_dot_products() {
    let (m, n, k) = (33, 40, 33);
    let tiny = 2f64.powi(-70);
    let av = vec![tiny; m * k];
    let bv = vec![tiny; n * k];
    let c = Case {
        m,
        n,
        k,
        bt: false,
        xp: Prec::Bfloat16,
        yp: Prec::Bfloat16,
    };
    let exact = k as f64 * 2f64.powi(-140);
    for dot in dot_settings() {
        let (got, _) = run_case(&c, &av, &bv, dot);
        let want = if dot { 0.0 } else { exact };
        assert!(
            got.iter().all(|&g| g == want),
            "dot {dot}: {} vs {want}",
            got[0]
        );
    }
}
