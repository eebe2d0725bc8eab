//! Loop-nest passes: interchange for locality keeps results bit-identical, and large
//! reductions are materialized instead of being recomputed inside their consumers.

mod common;
use arrayjit::ir::*;
use arrayjit::loops::Llc;
use arrayjit::lower::lower;
use arrayjit::optimize::{optimize, Settings};
use common::*;

/// The loop iterators of the first perfect nest that writes `tn`, outermost first, as the
/// indices (0-based) they take in `tn`'s operands: returned as the spec letters they came from.
fn loop_order(code: &Llc) -> Vec<i64> {
    fn go(c: &Llc, out: &mut Vec<i64>) -> bool {
        match c {
            Llc::Seq(v) => v.iter().any(|c| go(c, out)),
            Llc::For { to, body, .. } => {
                out.push(*to);
                go(body, out);
                true
            }
            _ => false,
        }
    }
    let mut out = vec![];
    go(code, &mut out);
    out
}

fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % 1000) as f64 / 100.0 - 5.0
        })
        .collect()
}

/// Compiles and runs `y = x @ w` (f32, dims n×k times k×m) with the loop passes on or off;
/// returns the loop order of the optimized code and the result.
fn single_matmul(
    (n, k, m): (usize, usize, usize),
    av: &[f64],
    bv: &[f64],
    loop_opts: bool,
) -> (Vec<i64>, Vec<f64>) {
    let b = Bindings::empty();
    let x = input("x", &[n, k], Prec::Single, av);
    let w = input("w", &[k, m], Prec::Single, bv);
    let y = output("y", &[n, m], Prec::Single);
    let a = binop(&y, Binop::Add, true, Binop::Mul, &x, &w, "ij,jk->ik", &b);
    let settings = Settings {
        loop_opts,
        ..Default::default()
    };
    let o = optimize("mm", lower(&a).unwrap(), &settings).unwrap();
    // The loop passes keep every cell's summation order, so the results are bit-identical
    // as long as the C compiler treats both loop orders alike. Whether it contracts
    // `y + x * w` into a fused multiply-add is its choice per loop (GCC 12 tuned for AMD
    // Zen 4 keeps the vectorized reduction of the i-j-k order unfused and fuses the
    // i-k-j order): contraction is off here, so the comparison tests the passes only.
    let mut cfg = arrayjit::compile::CompilerConfig::from_env().unwrap();
    cfg.extra_flags.push("-ffp-contract=off".into());
    let backend = arrayjit::backend::CcBackend::with_config(cfg, settings);
    let (r, _) = build(&backend, "mm", &b, &a).unwrap();
    (
        loop_order(&o.code),
        run_and_read(&backend, &r, &[&y]).remove(0),
    )
}

#[test]
fn matmul_becomes_i_j_k_and_stays_bit_identical() {
    let (n, k, m) = (5, 7, 9);
    let av = values(n * k, 1);
    let bv = values(k * m, 2);
    let run = |loop_opts: bool| single_matmul((n, k, m), &av, &bv, loop_opts);
    let (order_off, plain) = run(false);
    let (order_on, interchanged) = run(true);
    // Extents (as `to` bounds): i (4), k (8), j (6) before; i, j, k after.
    assert_eq!(order_off, vec![4, 8, 6]);
    assert_eq!(order_on, vec![4, 6, 8]);
    assert_eq!(plain, interchanged, "interchange must not change any bit");
    // And both match a plain f32 computation in the same summation order (the C compiler
    // may contract a*b+c into one fused multiply-add, so not bit for bit).
    for i in 0..n {
        for c in 0..m {
            let mut s = 0f32;
            for j in 0..k {
                s += av[i * k + j] as f32 * bv[j * m + c] as f32;
            }
            assert!((plain[i * m + c] - s as f64).abs() <= 1e-5 * (s.abs() as f64).max(1.0));
        }
    }
}

#[test]
fn reduction_order_is_kept_and_illegal_nests_are_left_alone() {
    let b = Bindings::empty();
    // Two reduction iterators: their relative order must stay.
    let x = input("x", &[3, 4, 5], Prec::Double, &values(60, 3));
    let s = output("s", &[5], Prec::Double);
    let a = unop(&s, Binop::Add, true, Unop::Identity, &x, "ijk->k", &b);
    let o = optimize("r", lower(&a).unwrap(), &Settings::default()).unwrap();
    // k is written and contiguous: it moves innermost; i stays before j.
    assert_eq!(loop_order(&o.code), vec![2, 3, 4]);
    // Row sums: j is contiguous already.
    let x2 = input("x2", &[6, 8], Prec::Single, &values(48, 4));
    let s2 = output("s2", &[6], Prec::Single);
    let a2 = unop(&s2, Binop::Add, true, Unop::Identity, &x2, "ij->i", &b);
    let o2 = optimize("r2", lower(&a2).unwrap(), &Settings::default()).unwrap();
    assert_eq!(loop_order(&o2.code), vec![5, 7]);
    // y[i, j] = y[j, i] + 1 reads y at another cell: the order must not change.
    let y = input("y", &[4, 4], Prec::Single, &values(16, 5));
    let one = input("one", &[1], Prec::Single, &[1.0]);
    let a3 = binop(&y, Binop::Arg2, false, Binop::Add, &y, &one, "ji,0->ij", &b);
    let before = loop_order(&lower(&a3).unwrap());
    let o3 = optimize("t", lower(&a3).unwrap(), &Settings::default()).unwrap();
    assert_eq!(loop_order(&o3.code), before);
}

#[test]
fn large_reductions_are_materialized_not_recomputed() {
    let b = Bindings::empty();
    let (n, k, m) = (4, 100, 3);
    let xv = values(n * k, 6);
    let wv = values(k * m, 7);
    let x = input("x", &[n, k], Prec::Double, &xv);
    let w = input("w", &[k, m], Prec::Double, &wv);
    let h = temp("h", &[n, m], Prec::Double);
    let y = output("y", &[n, m], Prec::Double);
    let a = Assignments::seq([
        binop(&h, Binop::Add, true, Binop::Mul, &x, &w, "ij,jk->ik", &b),
        unop(&y, Binop::Arg2, false, Unop::Relu, &h, "ik->ik", &b),
    ]);
    let (got, src, modes) = compute_with_modes(&a, &b, &[&y]);
    assert_eq!(modes.get(&h), Some(MemoryMode::Local), "{src}");
    for i in 0..n {
        for c in 0..m {
            let s: f64 = (0..k).map(|j| xv[i * k + j] * wv[j * m + c]).sum();
            assert!((got[0][i * m + c] - s.max(0.0)).abs() < 1e-9);
        }
    }
    // A small reduction is still inlined.
    let x = input("x", &[n, 3], Prec::Double, &values(n * 3, 8));
    let w = input("w", &[3, m], Prec::Double, &values(3 * m, 9));
    let h = temp("h", &[n, m], Prec::Double);
    let y = output("y", &[n, m], Prec::Double);
    let a = Assignments::seq([
        binop(&h, Binop::Add, true, Binop::Mul, &x, &w, "ij,jk->ik", &b),
        unop(&y, Binop::Arg2, false, Unop::Relu, &h, "ik->ik", &b),
    ]);
    let (_, _, modes) = compute_with_modes(&a, &b, &[&y]);
    assert_eq!(modes.get(&h), Some(MemoryMode::Virtual));
}

#[test]
fn long_reductions_get_independent_accumulators() {
    let b = Bindings::empty();
    for prec in [Prec::Single, Prec::Double] {
        for n in [32usize, 37, 100, 257] {
            let xv = values(3 * n, n as u64);
            for acc in [Binop::Add, Binop::Max, Binop::Min, Binop::Sub] {
                let run = |loop_opts: bool| {
                    let x = input("x", &[3, n], prec, &xv);
                    // An inlined intermediate inside the reduced expression, and the index.
                    let sq = temp("sq", &[3, n], prec);
                    let s = output("s", &[3], prec);
                    let a = Assignments::seq([
                        binop(&sq, Binop::Arg2, false, Binop::Mul, &x, &x, "ij,ij->ij", &b),
                        unop(&s, acc, true, Unop::Identity, &sq, "ij->i", &b),
                    ]);
                    let settings = Settings {
                        loop_opts,
                        ..Default::default()
                    };
                    let backend = arrayjit::backend::CcBackend::with_settings(settings);
                    let (r, src) = build(&backend, "red", &b, &a).unwrap();
                    (run_and_read(&backend, &r, &[&s]).remove(0), src)
                };
                let (plain, _) = run(false);
                let (fast, src) = run(true);
                assert!(src.contains("s_acc_"), "{src}");
                for i in 0..3 {
                    let row = xv[i * n..(i + 1) * n].iter().map(|v| round_to(prec, v * v));
                    let want = match acc {
                        Binop::Add => row.sum::<f64>(),
                        Binop::Sub => -row.sum::<f64>(),
                        Binop::Max => row.fold(f64::NEG_INFINITY, f64::max),
                        _ => row.fold(f64::INFINITY, f64::min),
                    };
                    let tol = if prec == Prec::Single { 1e-4 } else { 1e-12 };
                    for got in [plain[i], fast[i]] {
                        assert!(
                            (got - want).abs() <= tol * want.abs().max(1.0),
                            "{prec} n={n} {acc}: got {got}, want {want}"
                        );
                    }
                    if matches!(acc, Binop::Max | Binop::Min) {
                        assert_eq!(plain[i], fast[i], "max and min are exact");
                    }
                }
            }
        }
    }
}

#[test]
fn short_and_half_precision_reductions_are_left_sequential() {
    let b = Bindings::empty();
    let x = input("x", &[2, 64], Prec::Half, &values(128, 11));
    let s = output("s", &[2], Prec::Half);
    let (_, src) = compute(
        &unop(&s, Binop::Add, true, Unop::Identity, &x, "ij->i", &b),
        &b,
        &[&s],
    );
    assert!(!src.contains("_acc_"), "{src}");
    let x = input("x", &[2, 20], Prec::Single, &values(40, 12));
    let s = output("s", &[2], Prec::Single);
    let (_, src) = compute(
        &unop(&s, Binop::Add, true, Unop::Identity, &x, "ij->i", &b),
        &b,
        &[&s],
    );
    assert!(!src.contains("_acc_"), "{src}");
}

#[test]
fn the_interpreter_runs_strip_mined_code() {
    let b = Bindings::empty();
    let n = 70;
    let xv = values(2 * n, 21);
    let x = input("x", &[2, n], Prec::Double, &xv);
    let s = output("s", &[2], Prec::Double);
    let a = unop(&s, Binop::Add, true, Unop::Identity, &x, "ij->i", &b);
    let o = optimize("red", lower(&a).unwrap(), &Settings::default()).unwrap();
    assert!(
        arrayjit::loops::to_doc(&o.code).contains('*'),
        "expected a strip-mined index"
    );
    let mut mem = arrayjit::interp::Memory::new();
    mem.load_from_hosts(&a.nodes());
    arrayjit::interp::run(&o.code, &[], &mut mem).unwrap();
    for i in 0..2 {
        let want: f64 = xv[i * n..(i + 1) * n].iter().sum();
        assert!((mem.get(&s).unwrap()[i] - want).abs() < 1e-9);
    }
}

#[test]
fn contractions_are_tiled_into_panels_bit_identically() {
    let (n, k, m) = (3, 40, 256);
    let av = values(n * k, 31);
    let bv = values(k * m, 32);
    let run = |loop_opts: bool| single_matmul((n, k, m), &av, &bv, loop_opts);
    let (_, plain) = run(false);
    let (order, tiled) = run(true);
    // Panel loop (256 / 128 = 2 panels) outermost, then i, j, and a 128-wide inner loop.
    assert_eq!(order, vec![1, 2, 39, 127]);
    assert_eq!(plain, tiled, "tiling must not change any bit");
}
