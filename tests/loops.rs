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
/// The loop extents of the last loop nest, outermost first (the nest of the computation: a
/// zero fill before it may have been fused into its outer loop).
fn loop_order(code: &Llc) -> Vec<i64> {
    fn go(c: &Llc, out: &mut Vec<i64>) -> bool {
        match c {
            Llc::Seq(v) => v.iter().rev().any(|c| go(c, out)),
            Llc::For { to, body, .. } => {
                out.push(*to);
                go(body, out);
                true
            }
            // A parallel region is its loop.
            Llc::Parallel(p) => {
                out.push(p.to);
                go(&p.body, out);
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
    let settings = Settings::default().loop_opts(loop_opts);
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
                    let settings = Settings::default().loop_opts(loop_opts);
                    let backend = arrayjit::backend::CcBackend::with_settings(settings);
                    let (r, src) = build(&backend, "red", &b, &a).unwrap();
                    (run_and_read(&backend, &r, &[&s]).remove(0), src)
                };
                let (plain, _) = run(false);
                let (fast, src) = run(true);
                // Vector partial results (`s_part_`, explicit vector loops) on targets with
                // vectors, independent scalar accumulators (`s_acc_`) otherwise.
                assert!(src.contains("s_part_") || src.contains("s_acc_"), "{src}");
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

// ---------------------------------------------------------------------------------------------
// Interchange through the guards of affine indices: depthwise convolution and pooling

/// Compares two results cell by cell, bitwise as single-precision values (so a NaN must be
/// a NaN and the sign of a zero counts).
fn assert_same_bits(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        let same = (g.is_nan() && w.is_nan()) || (*g as f32).to_bits() == (*w as f32).to_bits();
        assert!(same, "{what}: cell {k}: got {g:?}, want {w:?}");
    }
}

/// Runs `make`'s assignments compiled (optimizer on, optimizer off, bounds-checked) and
/// interpreted, checks the single output against `want` bitwise, and returns the optimized
/// loop code and C source.
fn check_four_ways(make: &dyn Fn() -> (Assignments, Tnode), want: &[f64]) -> (Llc, String) {
    use arrayjit::backend::CcBackend;
    use arrayjit::interp::{self, Memory};
    let b = Bindings::empty();
    let off = Settings::default().enabled(false);
    let backends = [
        ("optimized", CcBackend::new()),
        ("optimizer off", CcBackend::with_settings(off)),
        ("checked", CcBackend::new().with_checked(true)),
    ];
    let mut src = String::new();
    for (what, backend) in &backends {
        let (asgns, out) = make();
        let (r, s) = build(backend, "pool", &b, &asgns).unwrap();
        let got = run_and_read(backend, &r, &[&out]).remove(0);
        assert_same_bits(&got, want, &format!("{what}; source:\n{s}"));
        if src.is_empty() {
            src = s;
        }
    }
    let (asgns, out) = make();
    let mut mem = Memory::new();
    mem.load_from_hosts(&asgns.nodes());
    interp::run_assignments(&asgns, &[], &mut mem).unwrap();
    assert_same_bits(mem.get(&out).unwrap(), want, "interpreter");
    let (asgns, _) = make();
    let o = optimize("pool", lower(&asgns).unwrap(), &Settings::default()).unwrap();
    (o.code, src)
}

/// The innermost loop of the (last) nest that stores into a node: its extent and whether
/// any guard sits inside it.
fn innermost_loop(code: &Llc) -> Option<(i64, bool)> {
    fn has_if(c: &Llc) -> bool {
        let mut hit = false;
        arrayjit::loops::visit_llc(c, &mut |c| hit |= matches!(c, Llc::If { .. }));
        hit
    }
    fn go(c: &Llc, out: &mut Option<(i64, bool)>) {
        match c {
            Llc::Seq(v) => v.iter().for_each(|c| go(c, out)),
            Llc::If { body, .. } => go(body, out),
            Llc::For { to, body, .. } => {
                if matches!(&**body, Llc::Set { .. })
                    || matches!(&**body, Llc::If { body, .. } if matches!(&**body, Llc::Set { .. }))
                {
                    *out = Some((*to + 1, has_if(body)));
                } else {
                    go(body, out);
                }
            }
            _ => {}
        }
    }
    let mut out = None;
    go(code, &mut out);
    out
}

/// Whether the C source has a `for` loop of extent `n` whose body is a single store (no `if`,
/// no nested loop): the guard-free contiguous loop the C compiler vectorizes.
fn c_has_plain_inner_loop(src: &str, n: i64) -> bool {
    let lines: Vec<&str> = src.lines().map(str::trim).collect();
    let plain = lines.windows(3).any(|w| {
        w[0].starts_with("for (")
            && w[0].contains(&format!("<= {};", n - 1))
            && w[1].contains("] = ")
            && !w[1].starts_with("if")
            && w[2] == "}"
    });
    // Or the explicit vector loop the vectorize pass makes of it: a loop over whole vectors
    // whose body is one vector store (then a scalar loop over the rest, if any).
    let vector = lines.windows(3).any(|w| {
        w[0].starts_with("for (")
            && w[1].contains("_store(&")
            && !w[1].starts_with("if")
            && w[2] == "}"
    });
    plain || vector
}

/// NHWC depthwise convolution `b(h+i-1)(v+j-1)c,ijc->bhvc` (3×3, padding 1), written from
/// the SPEC's definition: points outside the input are skipped.
fn depthwise_ref(x: &[f64], [hh, ww, cc]: [usize; 3], w: &[f64]) -> Vec<f64> {
    let mut y = vec![0.0; hh * ww * cc];
    for h in 0..hh {
        for v in 0..ww {
            for c in 0..cc {
                let mut acc = 0.0;
                for i in 0..3 {
                    for j in 0..3 {
                        let (r, s) = (h as i64 + i as i64 - 1, v as i64 + j as i64 - 1);
                        if r < 0 || s < 0 || r >= hh as i64 || s >= ww as i64 {
                            continue;
                        }
                        let (r, s) = (r as usize, s as usize);
                        acc += x[(r * ww + s) * cc + c] * w[(i * 3 + j) * cc + c];
                    }
                }
                y[(h * ww + v) * cc + c] = acc;
            }
        }
    }
    y
}

#[test]
fn depthwise_convolution_runs_the_channel_loop_innermost_outside_the_guards() {
    for (prec, (hh, ww, cc)) in [
        (Prec::Single, (7, 6, 20)),
        (Prec::Double, (5, 5, 9)),
        (Prec::Single, (4, 3, 1)),
    ] {
        // Small integers: every sum is exact, whatever the compiler contracts or reorders.
        let xv: Vec<f64> = values(hh * ww * cc, 3).iter().map(|v| v.round()).collect();
        let wv: Vec<f64> = values(9 * cc, 4).iter().map(|v| v.round()).collect();
        let make = || {
            let b = Bindings::empty();
            let x = input("x", &[1, hh, ww, cc], prec, &xv);
            let w = input("w", &[3, 3, cc], prec, &wv);
            let y = output("y", &[1, hh, ww, cc], prec);
            let a = binop(
                &y,
                Binop::Add,
                true,
                Binop::Mul,
                &x,
                &w,
                "b(h+i-1)(v+j-1)c,ijc->bhvc",
                &b,
            );
            (a, y)
        };
        let (code, src) = check_four_ways(&make, &depthwise_ref(&xv, [hh, ww, cc], &wv));
        if cc > 1 {
            // b-h-v-i-j-c: the channel loop is innermost, with no guard inside it (the loop
            // passes without a vector target).
            assert_eq!(innermost_loop(&code), Some((cc as i64, false)), "{src}");
            // For this machine: a tap kernel (`tests/kernels.rs` checks those), or that loop
            // when the channels are fewer than a vector.
            assert!(
                src.contains("tap kernel for y") || c_has_plain_inner_loop(&src, cc as i64),
                "{src}"
            );
        }
    }
}

/// IEEE maximumNumber with +0 above -0 (SPEC's `max`), written independently.
fn max_number(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        return b;
    }
    if b.is_nan() {
        return a;
    }
    if a == b {
        // Only zeros of different signs differ: +0 wins.
        return if a.is_sign_negative() && b.is_sign_negative() {
            a
        } else {
            a.abs()
        };
    }
    if a > b {
        a
    } else {
        b
    }
}

#[test]
fn padded_max_pool_with_nan_and_signed_zeros_keeps_its_values() {
    // 3×3 window, stride 1, padding 1, over an NHWC tensor with NaNs and zeros of both signs;
    // one window is all NaN (-inf, the neutral), some hold only -0 and +0 (+0) or only -0 and
    // NaN (-0).
    let (hh, ww, cc) = (5, 6, 10);
    let mut xv: Vec<f64> = values(hh * ww * cc, 5);
    for (k, v) in xv.iter_mut().enumerate() {
        match k % 7 {
            0 => *v = f64::NAN,
            1 => *v = -0.0,
            2 => *v = 0.0,
            _ => {}
        }
    }
    // Channel 3: only -0 and NaN (an all-NaN window at the top-left corner); channel 4: only
    // zeros of both signs.
    for h in 0..hh {
        for v in 0..ww {
            let at = (h * ww + v) * cc;
            xv[at + 3] = if h < 2 && v < 2 { f64::NAN } else { -0.0 };
            xv[at + 4] = if (h + v) % 3 == 0 { 0.0 } else { -0.0 };
        }
    }
    let mut want = vec![f64::NEG_INFINITY; hh * ww * cc];
    for h in 0..hh {
        for v in 0..ww {
            for c in 0..cc {
                let cell = &mut want[(h * ww + v) * cc + c];
                for i in 0..3 {
                    for j in 0..3 {
                        let (r, s) = (h as i64 + i - 1, v as i64 + j - 1);
                        if r < 0 || s < 0 || r >= hh as i64 || s >= ww as i64 {
                            continue;
                        }
                        *cell = max_number(*cell, xv[(r as usize * ww + s as usize) * cc + c]);
                    }
                }
            }
        }
    }
    // NaNs are ignored: the all-NaN corner window of channel 3 keeps the neutral -inf.
    assert_eq!(want[3], f64::NEG_INFINITY);
    assert!(want.iter().any(|v| *v == 0.0 && v.is_sign_negative()));
    let make = || {
        let b = Bindings::empty();
        let x = input("x", &[1, hh, ww, cc], Prec::Single, &xv);
        let k = input("k", &[3, 3], Prec::Single, &[0.0; 9]);
        let y = output("y", &[1, hh, ww, cc], Prec::Single);
        let a = binop(
            &y,
            Binop::Max,
            true,
            Binop::Arg1,
            &x,
            &k,
            "b(h+i-1)(v+j-1)c,ij->bhvc",
            &b,
        );
        (a, y)
    };
    let (code, src) = check_four_ways(&make, &want);
    assert_eq!(innermost_loop(&code), Some((cc as i64, false)), "{src}");
    // A tap kernel for this machine, or the plain loop when the channels are fewer than a
    // vector.
    assert!(
        src.contains("tap kernel for y") || c_has_plain_inner_loop(&src, cc as i64),
        "{src}"
    );
}

#[test]
fn strided_max_pool_runs_the_channel_loop_innermost() {
    let (hh, ww, cc) = (6, 8, 12);
    let xv = values(hh * ww * cc, 6);
    let mut want = vec![f64::NEG_INFINITY; hh / 2 * (ww / 2) * cc];
    for h in 0..hh / 2 {
        for v in 0..ww / 2 {
            for c in 0..cc {
                let cell = &mut want[(h * (ww / 2) + v) * cc + c];
                for i in 0..2 {
                    for j in 0..2 {
                        *cell = max_number(*cell, xv[((2 * h + i) * ww + 2 * v + j) * cc + c]);
                    }
                }
            }
        }
    }
    let make = || {
        let b = Bindings::empty();
        let x = input("x", &[1, hh, ww, cc], Prec::Single, &xv);
        let k = input("k", &[2, 2], Prec::Single, &[0.0; 4]);
        let y = output("y", &[1, hh / 2, ww / 2, cc], Prec::Single);
        let a = binop(
            &y,
            Binop::Max,
            true,
            Binop::Arg1,
            &x,
            &k,
            "b(2*h+i)(2*v+j)c,ij->bhvc",
            &b,
        );
        (a, y)
    };
    let (code, src) = check_four_ways(&make, &want);
    assert_eq!(innermost_loop(&code), Some((cc as i64, false)), "{src}");
    // A tap kernel for this machine, or the plain loop when the channels are fewer than a
    // vector.
    assert!(
        src.contains("tap kernel for y") || c_has_plain_inner_loop(&src, cc as i64),
        "{src}"
    );
}

#[test]
fn nests_writing_one_cell_from_several_points_keep_their_order() {
    // `(a+b)` on the result with `set`: the last point in the lowered order (a outer, b
    // inner) wins. x is read at [b, a], so moving a innermost would make x contiguous (and
    // the interchange's score prefers it); the interchange must not, since it would change
    // which point writes last.
    let (na, nb) = (4, 3);
    let xv = values(na * nb, 7);
    let mut want = vec![0.0; na + nb - 1];
    for a in 0..na {
        for b in 0..nb {
            want[a + b] = xv[b * na + a];
        }
    }
    let make = || {
        let bd = Bindings::empty();
        let x = input("x", &[nb, na], Prec::Single, &xv);
        let t = input("t", &[nb], Prec::Single, &[0.0; 3]);
        let y = output("y", &[na + nb - 1], Prec::Single);
        let a = binop(
            &y,
            Binop::Arg2,
            false,
            Binop::Arg1,
            &x,
            &t,
            "ba,b->(a+b)",
            &bd,
        );
        (a, y)
    };
    // Compiled (optimizer on and off, checked) and interpreted. GCC 12.2 reordered these
    // stores (an earlier point's write won) until the C writer put a compiler barrier after
    // each store through a non-one-to-one index.
    let (code, src) = check_four_ways(&make, &want);
    // Loops a (to 3) then b (to 2), as lowered.
    assert_eq!(
        loop_order(&code),
        vec![na as i64 - 1, nb as i64 - 1],
        "{src}"
    );
    assert!(src.contains("__asm__ __volatile__"), "{src}");
}

#[test]
fn example_depthwise_convolution_through_the_cli() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/programs/depthwise_conv.json"
    );
    let xv: Vec<f64> = (0..48).map(f64::from).collect();
    let wv: Vec<f64> = (0..27).map(|k| f64::from((k * 5) % 7 - 3)).collect();
    let want = depthwise_ref(&xv, [4, 4, 3], &wv);
    for args in [vec!["run", path], vec!["run", "--interpret", path]] {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_arrayjit"))
            .args(&args)
            .output()
            .expect("the arrayjit binary runs");
        assert_eq!(o.status.code(), Some(0), "{args:?}");
        let out: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
        let got: Vec<f64> = out["y"]["values"]
            .as_array()
            .expect("y printed")
            .iter()
            .map(|v| v.as_f64().expect("a number"))
            .collect();
        assert_eq!(got, want, "{args:?}");
    }
}
