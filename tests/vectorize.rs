//! Explicit vector loops (`src/optimize/vectorize.rs`): elementwise loops and reductions
//! become vector code with the runtime's vector functions. Checked against plain Rust loops
//! (bit for bit where every operation is exact, within the documented ulp bounds for `exp`,
//! `tanh`, ...), against the interpreter running the same optimized (vector) IR, for lengths
//! that are not multiples of any vector width, broadcasts and mixed reads, NaN and signed
//! zeros in max/min reductions, on every vector width (16, 32 and 64 bytes), and for
//! determinism (the same C every time, and sums that do not depend on the vector width).

mod common;
use arrayjit::backend::{CcBackend, Config, MergeBuffer};
use arrayjit::compile::CompilerConfig;
use arrayjit::interp::{self, Memory};
use arrayjit::ir::ops::{max_number, min_number};
use arrayjit::ir::*;
use arrayjit::optimize::Settings;
use arrayjit::target::VectorTarget;
use common::*;

fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Full-precision single values in [-4, 4).
            ((((x >> 40) as f64) / (1u64 << 24) as f64) * 8.0 - 4.0) as f32 as f64
        })
        .collect()
}

/// What one compile and run gives: the outputs, the C, and the outputs of the interpreter
/// running the optimized loop IR (the vector statements lane by lane).
struct Run {
    out: Vec<Vec<f64>>,
    src: String,
    interp: Vec<Vec<f64>>,
}

/// Compiles `asgns` for `target` (the machine's when `None`), runs it once compiled and once
/// interpreted on its optimized code, from the same host values.
fn run(asgns: &Assignments, outs: &[&Tnode], target: Option<VectorTarget>) -> Run {
    let settings = Settings::default().target(target);
    let backend = CcBackend::with_config(CompilerConfig::from_env().unwrap(), settings);
    backend.initialize(Config::default());
    let b = Bindings::empty();
    let code = backend.compile(true, Some("vec"), &b, asgns).unwrap();
    let ctx = backend.init("vec").unwrap();
    let r = backend.link(&[], &MergeBuffer::new(), &ctx, &code).unwrap();
    let nodes = asgns.nodes();
    for tn in &nodes {
        backend.from_host(r.context(), tn).unwrap();
    }
    let mut mem = Memory::new();
    mem.load_from_hosts(nodes.iter());
    interp::run_optimized(code.optimized(), &[], &mut mem).unwrap();
    let interp = outs.iter().map(|t| mem.get(t).unwrap().to_vec()).collect();
    Run {
        out: run_and_read(&backend, &r, outs),
        src: code.source().to_string(),
        interp,
    }
}

fn target(bytes: usize) -> VectorTarget {
    VectorTarget::default().vector_bytes(bytes)
}

/// Every lane of `got` equals `want` bitwise (NaN: any NaN).
fn assert_bits(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{what}[{k}]: {g:e} ({:#x}) != {w:e} ({:#x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

/// `|got - want| <= ulps` units in the last place of single precision at `want`.
fn assert_ulps(got: &[f64], want: &[f64], ulps: f64, what: &str) {
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        let r = *w as f32;
        let ulp = (r.abs().next_up() - r.abs()) as f64;
        assert!(
            (g - w).abs() <= ulps * ulp,
            "{what}[{k}]: {g:e} vs {w:e} ({} ulp)",
            (g - w).abs() / ulp
        );
    }
}

/// `y[i, j] = exp(x[i, j] - m[i]) * g[j] + b[j]` (mul then add, not fused): a contiguous
/// read, a row broadcast, two column reads and `exp`, over rows of 37 and 1003 elements
/// (no multiple of 4, 8 or 16: every vector loop has a scalar remainder).
#[test]
fn elementwise_exp_with_broadcasts_and_remainders() {
    for (n, m) in [(3, 37), (2, 1003)] {
        let xv = values(n * m, 1);
        let mv = values(n, 2);
        let gv = values(m, 3);
        let bv = values(m, 4);
        let b = Bindings::empty();
        let x = input("x", &[n, m], Prec::Single, &xv);
        let mx = input("m", &[n], Prec::Single, &mv);
        let g = input("g", &[m], Prec::Single, &gv);
        let bb = input("b", &[m], Prec::Single, &bv);
        let d = temp("d", &[n, m], Prec::Single);
        let e = temp("e", &[n, m], Prec::Single);
        let eg = temp("eg", &[n, m], Prec::Single);
        let y = output("y", &[n, m], Prec::Single);
        let code = Assignments::seq([
            binop(&d, Binop::Arg2, false, Binop::Sub, &x, &mx, "ij,i->ij", &b),
            unop(&e, Binop::Arg2, false, Unop::Exp, &d, "ij->ij", &b),
            binop(&eg, Binop::Arg2, false, Binop::Mul, &e, &g, "ij,j->ij", &b),
            binop(&y, Binop::Arg2, false, Binop::Add, &eg, &bb, "ij,j->ij", &b),
        ]);
        for bytes in [16, 32, 64] {
            let r = run(&code, &[&y], Some(target(bytes)));
            let lanes = bytes / 4;
            assert!(
                r.src.contains(&format!("aj_vexp_f32_{lanes}(")),
                "{bytes}-byte vectors:\n{}",
                r.src
            );
            // exp within 1.5 ulp, then the product and the sum (maybe fused): at most
            // 3 ulp of the terms' magnitudes.
            for k in 0..n * m {
                let (i, j) = (k / m, k % m);
                let dv = (xv[i * m + j] as f32 - mv[i] as f32) as f64;
                let eg = dv.exp() * gv[j];
                let exact = eg + bv[j];
                let tol = 3.0 * f32::EPSILON as f64 * (eg.abs() + bv[j].abs());
                assert!(
                    (r.out[0][k] - exact).abs() <= tol,
                    "{bytes}B: y[{k}] = {} vs {exact}",
                    r.out[0][k]
                );
                assert!(
                    (r.interp[0][k] - exact).abs() <= tol,
                    "interpreted y[{k}] = {} vs {exact}",
                    r.interp[0][k]
                );
            }
        }
    }
}

/// A loop whose length is no multiple of the vector width ends with one vector over its last
/// lanes, overlapping the vector loop, instead of a scalar remainder: the overlapped lanes are
/// computed again from the same inputs into the same cells. Not where a statement reads a
/// cell that the loop writes (`y += x * x`): a lane run twice would add twice, so there the
/// remainder stays scalar. Rows of 37 on every width.
#[test]
fn remainders_overlap_the_last_vector_unless_a_written_cell_is_read() {
    let (n, m) = (3, 37);
    let xv = values(n * m, 11);
    let yv = values(n * m, 12);
    let b = Bindings::empty();
    let x = input("x", &[n, m], Prec::Single, &xv);
    let e = output("e", &[n, m], Prec::Single);
    let exp = Assignments::seq([unop(&e, Binop::Arg2, false, Unop::Exp, &x, "ij->ij", &b)]);
    for bytes in [16, 32, 64] {
        let lanes = bytes / 4;
        let r = run(&exp, &[&e], Some(target(bytes)));
        let last = format!(" * 37 + {}]", m - lanes);
        assert!(
            !r.src.contains("expf(") && r.src.contains(&last),
            "{bytes}-byte vectors: no overlapping last vector ({last}):\n{}",
            r.src
        );
        let want: Vec<f64> = xv.iter().map(|v| v.exp()).collect();
        assert_ulps(&r.out[0], &want, 1.5, "exp");
        // A fresh `y` for each width (a run copies its result back to the host).
        let y = input("y", &[n, m], Prec::Single, &yv);
        let update = Assignments::seq([binop(
            &y,
            Binop::Add,
            false,
            Binop::Mul,
            &x,
            &x,
            "ij,ij->ij",
            &b,
        )]);
        let r = run(&update, &[&y], Some(target(bytes)));
        // One rounding where the C compiler contracts the multiply-add (the target has
        // FMA), two otherwise; each lane once.
        for (k, (got, interp)) in r.out[0].iter().zip(&r.interp[0]).enumerate() {
            let (x, y) = (xv[k] as f32, yv[k] as f32);
            let once = [x.mul_add(x, y) as f64, (y + x * x) as f64];
            assert!(
                once.contains(got),
                "{bytes}-byte y[{k}] += x * x: {got} not in {once:?}"
            );
            assert!(
                once.contains(interp),
                "interpreted y[{k}]: {interp} not in {once:?}"
            );
        }
    }
}

/// Exact operations computed by vector loops are bit-identical to plain Rust loops doing the
/// same single (or double) operations: add, sub, mul, div, max and min (IEEE
/// maximumNumber/minimumNumber with NaN and signed zeros), relu, abs, neg, recip, satur01,
/// fma (one rounding), mul3. Lengths 29 and 131, single and double, every width.
#[test]
fn exact_elementwise_operations_match_plain_loops_bitwise() {
    let special = [
        0.0,
        -0.0,
        f64::NAN,
        1.5,
        -2.25,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e-40,
        3.0,
    ];
    for prec in [Prec::Single, Prec::Double] {
        for n in [29usize, 131] {
            let r32 = |v: f64| {
                if prec == Prec::Single {
                    v as f32 as f64
                } else {
                    v
                }
            };
            let mk = |seed: u64| -> Vec<f64> {
                values(n, seed)
                    .into_iter()
                    .enumerate()
                    .map(|(k, v)| {
                        if k % 5 == 0 {
                            special[(k / 5 + seed as usize) % special.len()]
                        } else {
                            v
                        }
                    })
                    .map(r32)
                    .collect()
            };
            let (av, bv, cv) = (mk(1), mk(2), mk(3));
            let b = Bindings::empty();
            let a = input("a", &[n], prec, &av);
            let bt = input("b", &[n], prec, &bv);
            let c = input("c", &[n], prec, &cv);
            let mut stmts = vec![];
            let mut outs = vec![];
            type Ref = Box<dyn Fn(f64, f64, f64) -> f64>;
            let mut refs: Vec<Ref> = vec![];
            let single = prec == Prec::Single;
            let rnd = move |v: f64| if single { v as f32 as f64 } else { v };
            for op in [
                Binop::Add,
                Binop::Sub,
                Binop::Mul,
                Binop::Div,
                Binop::Max,
                Binop::Min,
            ] {
                let y = output(&format!("y_{}", op.name()), &[n], prec);
                stmts.push(binop(&y, Binop::Arg2, false, op, &a, &bt, "i,i->i", &b));
                outs.push(y);
                refs.push(Box::new(move |x, y, _| rnd(op.interpret(x, y))));
            }
            for op in [Unop::Relu, Unop::Abs, Unop::Neg, Unop::Recip, Unop::Satur01] {
                let y = output(&format!("u_{}", op.name()), &[n], prec);
                stmts.push(unop(&y, Binop::Arg2, false, op, &a, "i->i", &b));
                outs.push(y);
                refs.push(Box::new(move |x, _, _| rnd(op.interpret(x))));
            }
            for op in [Ternop::Fma, Ternop::Mul3] {
                let y = output(&format!("t_{}", op.name()), &[n], prec);
                stmts.push(Assignments::AccumTernop {
                    initialize_neutral: false,
                    accum: Binop::Arg2,
                    op,
                    lhs: y.clone(),
                    rhs1: Buffer::Node(a.clone()),
                    rhs2: Buffer::Node(bt.clone()),
                    rhs3: Buffer::Node(c.clone()),
                    projections: einsum::projections(
                        "i,i,i->i",
                        y.dims(),
                        &[a.dims(), bt.dims(), c.dims()],
                        &b,
                    )
                    .unwrap(),
                });
                outs.push(y);
                refs.push(Box::new(move |x, y, z| {
                    if op == Ternop::Mul3 {
                        rnd(rnd(x * y) * z)
                    } else {
                        rnd(op.interpret(single, x, y, z))
                    }
                }));
            }
            let code = Assignments::seq(stmts);
            let out_refs: Vec<&Tnode> = outs.iter().collect();
            for bytes in [16, 32, 64] {
                let r = run(&code, &out_refs, Some(target(bytes)));
                assert!(r.src.contains("AJ_VMAX("), "{prec:?} {bytes}:\n{}", r.src);
                for (k, (t, f)) in outs.iter().zip(&refs).enumerate() {
                    let want: Vec<f64> = (0..n).map(|i| f(av[i], bv[i], cv[i])).collect();
                    let what = format!("{prec:?} n={n} {bytes}B {}", t.name());
                    assert_bits(&r.out[k], &want, &what);
                    assert_bits(&r.interp[k], &want, &format!("{what} (interpreted)"));
                }
            }
        }
    }
}

/// Rows divided by one scalar per row (`ij,i->ij`, a softmax's last statement): on 64-byte
/// vectors the runtime's `aj_vdivs_f32_16` (a reciprocal and two fused corrections, or the
/// division where a lane is zero, subnormal, huge, infinite or NaN, or the divisor is out of
/// range), on the others the division; every quotient equal, bit for bit, to the single
/// division Rust computes. The rows hold quotients next to midpoints between floats (x the
/// nearest float to m·d for a midpoint m), special values, and divisors of every kind.
#[test]
fn division_by_a_row_scalar_is_correctly_rounded() {
    let divisors: Vec<f32> = vec![
        3.0,
        -7.0,
        1.0,
        0.1,
        1.999_999_9,
        1.000_000_1,
        6.5e-38,
        3.0e37,
        f32::MIN_POSITIVE,
        1e-40,
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NAN,
        2.5e-30,
        7.7e29,
    ];
    let m = 77usize;
    let n = divisors.len();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut xv = vec![0f64; n * m];
    for (i, &d) in divisors.iter().enumerate() {
        for j in 0..m {
            let r = next();
            // The first 48 of a row (three whole 16-lane vectors) next to midpoints, the
            // rest mixed with bit patterns of every kind and special values.
            let kind = if j < 48 { 0 } else { j % 4 };
            let bits = d.to_bits();
            let bsig = (bits & 0x7f_ffff) | 0x80_0000;
            let x: f32 = match kind {
                // The hardest: a - m b = k 2^-47 for a small odd k (significands a, b in
                // [1, 2), m a midpoint with 25 bits), possible when b's significand is odd.
                0 if bsig % 2 == 1 && d.is_normal() && r % 3 != 0 => {
                    let big = bsig as u64;
                    let mut inv = big;
                    for _ in 0..5 {
                        inv = inv.wrapping_mul(2u64.wrapping_sub(big.wrapping_mul(inv)));
                    }
                    let k: i64 = [1, -1, 3, -3][(r >> 8) as usize % 4];
                    let mask = (1u64 << 24) - 1;
                    let mm = (1u64 << 24) | ((k.wrapping_neg() as u64).wrapping_mul(inv) & mask);
                    let num = (mm * big) as i64 + k;
                    let a = (num >> 24) as u64;
                    if (1 << 23..1 << 24).contains(&a) {
                        // x = a 2^-23 scaled with d's exponent and a few more.
                        let e = ((bits >> 23) & 0xff) as i32 - 127 + (r % 7) as i32 - 3;
                        (a as f64 * (2f64).powi(e - 23)) as f32 * d.signum()
                    } else {
                        1.5
                    }
                }
                // Next to a midpoint: m has 25 significant bits, its last one set.
                0 | 1 => {
                    let mid = (((r >> 40) as u32 | 1 << 24) | 1) as f64 * (2f64).powi(-24);
                    (mid * d as f64 * (2f64).powi((r % 9) as i32 - 4)) as f32
                }
                2 => f32::from_bits((r >> 32) as u32),
                _ => [
                    0.0,
                    -0.0,
                    1e-45,
                    f32::MAX,
                    f32::INFINITY,
                    f32::NAN,
                    1e-39,
                    -3.5,
                ][(r % 8) as usize],
            };
            xv[i * m + j] = x as f64;
        }
    }
    let b = Bindings::empty();
    let x = input("x", &[n, m], Prec::Single, &xv);
    let dv: Vec<f64> = divisors.iter().map(|&d| d as f64).collect();
    let d = input("d", &[n], Prec::Single, &dv);
    let y = output("y", &[n, m], Prec::Single);
    let code = binop(&y, Binop::Arg2, false, Binop::Div, &x, &d, "ij,i->ij", &b);
    let want: Vec<f64> = (0..n * m)
        .map(|k| (xv[k] as f32 / divisors[k / m]) as f64)
        .collect();
    for bytes in [16, 32, 64] {
        let r = run(&code, &[&y], Some(target(bytes)));
        assert_eq!(
            r.src.contains("aj_vdivs_f32_16("),
            bytes == 64,
            "{bytes}:\n{}",
            r.src
        );
        assert_bits(&r.out[0], &want, &format!("{bytes}B"));
        assert_bits(&r.interp[0], &want, &format!("{bytes}B (interpreted)"));
    }
}

/// Row max and min of rows holding NaNs and zeros of both signs, over 37, 100 and 1000
/// elements: vector partial results combined in a tree give exactly the sequential
/// maximumNumber / minimumNumber (NaN ignored, +0 above -0), bit for bit, on every width.
#[test]
fn max_and_min_reductions_are_exact_with_nan_and_signed_zeros() {
    for (prec, m) in [
        (Prec::Single, 9usize),
        (Prec::Single, 20),
        (Prec::Single, 37),
        (Prec::Single, 100),
        (Prec::Single, 1000),
        (Prec::Double, 20),
        (Prec::Double, 100),
    ] {
        let n = 8;
        let mut xv = values(n * m, 7);
        // Row 0: all NaN but one -0.0 and one +0.0; row 1: all NaN; row 2: negatives, NaNs,
        // and -0.0 as its maximum; row 3: ordinary values with NaNs.
        for j in 0..m {
            xv[j] = f64::NAN;
            xv[m + j] = f64::NAN;
            xv[2 * m + j] = if j % 3 == 0 {
                f64::NAN
            } else {
                -(xv[2 * m + j].abs()) - 1.0
            };
            if j % 7 == 0 {
                xv[3 * m + j] = f64::NAN;
            }
        }
        xv[m / 2] = -0.0;
        xv[m - 1] = 0.0;
        xv[2 * m + m - 2] = -0.0;
        // Rows 4 to 7: NaNs and zeros of both signs at the positions 5 and 37 (the same
        // partial result: 37 = 5 + 32), +0 first in rows 4 and 6, -0 first in rows 5 and 7,
        // so that one accumulator meets both zeros in each order (in the scalar remainder
        // when m = 37); the other elements are negative in rows 4 and 5 (zero is the
        // maximum) and positive in rows 6 and 7 (zero is the minimum).
        for r in 4..8 {
            for j in 0..m {
                let v = xv[r * m + j].abs() + 1.0;
                xv[r * m + j] = if j % 5 == 0 {
                    f64::NAN
                } else if r < 6 {
                    -v
                } else {
                    v
                };
            }
            let (first, second) = if r % 2 == 0 { (0.0, -0.0) } else { (-0.0, 0.0) };
            xv[r * m + 5] = first;
            xv[r * m + 36.min(m - 1)] = second;
            if m > 37 {
                xv[r * m + 37] = second;
            }
        }
        let b = Bindings::empty();
        let x = input("x", &[n, m], prec, &xv);
        let mx = output("mx", &[n], prec);
        let mn = output("mn", &[n], prec);
        let code = Assignments::seq([
            unop(&mx, Binop::Max, true, Unop::Identity, &x, "ij->i", &b),
            unop(&mn, Binop::Min, true, Unop::Identity, &x, "ij->i", &b),
        ]);
        let fold = |f: fn(f64, f64) -> f64, init: f64| -> Vec<f64> {
            (0..n)
                .map(|i| xv[i * m..(i + 1) * m].iter().fold(init, |a, &v| f(a, v)))
                .collect()
        };
        let want_max = fold(max_number, f64::NEG_INFINITY);
        let want_min = fold(min_number, f64::INFINITY);
        assert!(want_max[0] == 0.0 && want_max[0].is_sign_positive());
        // A row of NaNs only: every element is ignored, the neutral -inf stays.
        assert_eq!(want_max[1], f64::NEG_INFINITY);
        assert!(want_max[2] == 0.0 && want_max[2].is_sign_negative());
        for r in [4, 5] {
            assert!(want_max[r] == 0.0 && want_max[r].is_sign_positive());
        }
        for r in [6, 7] {
            assert!(want_min[r] == 0.0 && want_min[r].is_sign_negative());
        }
        for bytes in [16, 32, 64] {
            let r = run(&code, &[&mx, &mn], Some(target(bytes)));
            let what = format!("{prec} m={m} {bytes}B");
            if m * prec.size_in_bytes() < bytes {
                // Shorter than one vector: the scalar loop.
                assert!(!r.src.contains("AJ_SHUFFLE("), "{what}\n{}", r.src);
                assert_bits(&r.out[0], &want_max, &format!("max {what}"));
                assert_bits(&r.out[1], &want_min, &format!("min {what}"));
                continue;
            }
            // The accumulators never hold a NaN: the cheaper exact spelling (for 64-byte
            // vectors the header's functions, one comparison each on AVX-512).
            let (vmax, vmin) = match (bytes, prec) {
                (64, Prec::Single) => ("aj_vmax_acc_f32_16(", "aj_vmin_acc_f32_16("),
                (64, _) => ("aj_vmax_acc_f64_8(", "aj_vmin_acc_f64_8("),
                _ => ("AJ_VMAX_ACC(", "AJ_VMIN_ACC("),
            };
            assert!(r.src.contains(vmax), "{}", r.src);
            assert!(r.src.contains(vmin), "{}", r.src);
            // No scalar steps but the one joining the cell: the last elements are whole
            // vectors (overlapping), and the lanes are combined with shuffles.
            let (smax, smin) = match prec {
                Prec::Single => ("aj_max_f(", "aj_min_f("),
                _ => ("aj_max_d(", "aj_min_d("),
            };
            // (One per copy of the row when rows are interleaved.)
            let rows = 1 + r
                .src
                .lines()
                .filter(|l| l.contains(" mx_part_copy") && l.contains("aligned"))
                .count();
            assert_eq!(r.src.matches(smax).count(), rows, "{what}\n{}", r.src);
            assert_eq!(r.src.matches(smin).count(), rows, "{what}\n{}", r.src);
            assert!(r.src.contains("AJ_SHUFFLE("), "{}", r.src);
            assert_bits(&r.out[0], &want_max, &format!("max {what}"));
            assert_bits(&r.out[1], &want_min, &format!("min {what}"));
            assert_bits(&r.interp[0], &want_max, &format!("interpreted max {what}"));
            assert_bits(&r.interp[1], &want_min, &format!("interpreted min {what}"));
        }
    }
}

/// Sums over rows of 1000 and 33 (single) and 70 (double) elements: close to the exact sum,
/// the same bits on every vector width (partial results are per position modulo 32 or 16,
/// not per vector), the same bits from the interpreter running the vector IR, and the same C
/// on every compile.
#[test]
fn sums_do_not_depend_on_the_vector_width_and_the_c_is_deterministic() {
    for (prec, m) in [
        (Prec::Single, 1000usize),
        (Prec::Single, 33),
        (Prec::Double, 70),
    ] {
        let n = 3;
        let xv: Vec<f64> = values(n * m, 11)
            .into_iter()
            .map(|v| v * 1.37)
            .map(|v| {
                if prec == Prec::Single {
                    v as f32 as f64
                } else {
                    v
                }
            })
            .collect();
        let b = Bindings::empty();
        let x = input("x", &[n, m], prec, &xv);
        let s = output("s", &[n], prec);
        // s = sum_j x[i, j] * 0.5 - subtracted from a start value: sub accumulates too.
        let sq = output("sq", &[n], prec);
        let code = Assignments::seq([
            unop(&s, Binop::Add, true, Unop::Identity, &x, "ij->i", &b),
            binop(&sq, Binop::Sub, true, Binop::Mul, &x, &x, "ij,ij->i", &b),
        ]);
        let runs: Vec<Run> = [16, 32, 64]
            .into_iter()
            .map(|bytes| run(&code, &[&s, &sq], Some(target(bytes))))
            .collect();
        for r in &runs[1..] {
            assert_bits(&r.out[0], &runs[0].out[0], "sum across widths");
            assert_bits(&r.out[1], &runs[0].out[1], "sub across widths");
        }
        // The interpreter runs the same vector partial sums, but computes the final tree of
        // scalar additions in f64 (its documented difference from C): close, not bitwise.
        let eps32 = if prec == Prec::Single {
            f32::EPSILON as f64
        } else {
            f64::EPSILON
        };
        for r in &runs {
            for (g, w) in r.interp[0].iter().zip(&r.out[0]) {
                assert!(
                    (g - w).abs() <= 64.0 * eps32 * w.abs().max(1.0),
                    "interpreted sum"
                );
            }
        }
        let eps = if prec == Prec::Single {
            f32::EPSILON as f64
        } else {
            f64::EPSILON
        };
        for i in 0..n {
            let row = &xv[i * m..(i + 1) * m];
            let exact: f64 = row.iter().sum();
            let abs: f64 = row.iter().map(|v| v.abs()).sum();
            assert!(
                (runs[0].out[0][i] - exact).abs() <= abs * eps * 8.0,
                "{prec:?} sum row {i}: {} vs {exact}",
                runs[0].out[0][i]
            );
            let sq: f64 = -row.iter().map(|v| v * v).sum::<f64>();
            assert!(
                (runs[0].out[1][i] - sq).abs() <= sq.abs() * eps * 8.0,
                "{prec:?} sub row {i}"
            );
        }
        // The same C on every compile (fresh backends).
        let again = run(&code, &[&s, &sq], Some(target(32)));
        assert_eq!(again.src, runs[1].src);
        // Vectorized: the partial results go through a local array of 32 (16) elements.
        assert!(runs[1].src.contains("_part_"), "{}", runs[1].src);
    }
}

/// Softmax over rows of 300 with the machine's own target: one fused loop whose exp is the
/// vector function, within a few ulp of softmax computed in f64.
#[test]
fn softmax_uses_the_vector_exp_and_stays_accurate() {
    let (n, m) = (5, 300);
    let xv = values(n * m, 5);
    let b = Bindings::empty();
    let x = input("x", &[n, m], Prec::Single, &xv);
    let mx = temp("m", &[n], Prec::Single);
    let d = temp("d", &[n, m], Prec::Single);
    let e = temp("e", &[n, m], Prec::Single);
    let s = temp("s", &[n], Prec::Single);
    let y = output("y", &[n, m], Prec::Single);
    let code = Assignments::seq([
        unop(&mx, Binop::Max, true, Unop::Identity, &x, "ij->i", &b),
        binop(&d, Binop::Arg2, false, Binop::Sub, &x, &mx, "ij,i->ij", &b),
        unop(&e, Binop::Arg2, false, Unop::Exp, &d, "ij->ij", &b),
        unop(&s, Binop::Add, true, Unop::Identity, &e, "ij->i", &b),
        binop(&y, Binop::Arg2, false, Binop::Div, &e, &s, "ij,i->ij", &b),
    ]);
    let r = run(&code, &[&y], None);
    let mut want = vec![0.0; n * m];
    for i in 0..n {
        let row = &xv[i * m..(i + 1) * m];
        let mxv = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - mxv).exp()).sum();
        for j in 0..m {
            want[i * m + j] = (row[j] - mxv).exp() / sum;
        }
    }
    if r.src.contains("aj_v8f") || r.src.contains("aj_v16f") || r.src.contains("aj_v4f") {
        assert!(r.src.contains("aj_vexp_f32_"), "{}", r.src);
    }
    assert_ulps(&r.out[0], &want, 8.0, "softmax");
    assert_ulps(&r.interp[0], &want, 8.0, "interpreted softmax");
}

/// Loops the pass does not vectorize stay correct scalar code: `sqrt` (no vector function),
/// a half-precision result (rounding per store), a strided read (a transpose), and a sum of
/// halves into single (a conversion per element).
#[test]
fn loops_the_pass_leaves_scalar_stay_correct() {
    let m = 40;
    let xv: Vec<f64> = values(m * m, 9).into_iter().map(|v| v.abs()).collect();
    let b = Bindings::empty();
    let x = input("x", &[m, m], Prec::Single, &xv);
    let xh = input("xh", &[m, m], Prec::Half, &xv);
    let sq = output("sq", &[m, m], Prec::Single);
    let h = output("h", &[m, m], Prec::Half);
    let t = output("t", &[m, m], Prec::Single);
    let s = output("s", &[m], Prec::Single);
    let code = Assignments::seq([
        unop(&sq, Binop::Arg2, false, Unop::Sqrt, &x, "ij->ij", &b),
        unop(&h, Binop::Arg2, false, Unop::Exp, &xh, "ij->ij", &b),
        unop(&t, Binop::Arg2, false, Unop::Neg, &x, "ij->ji", &b),
        unop(&s, Binop::Add, true, Unop::Identity, &xh, "ij->i", &b),
    ]);
    let r = run(&code, &[&sq, &h, &t, &s], None);
    for i in 0..m {
        let mut sum = 0.0f64;
        for j in 0..m {
            let v = xv[i * m + j];
            assert_eq!(r.out[0][i * m + j], (v as f32).sqrt() as f64, "sqrt");
            let hv = round_to(Prec::Half, v);
            let want_h = round_to(Prec::Half, hv.exp());
            assert!(
                (r.out[1][i * m + j] - want_h).abs() <= want_h.abs() * 2e-3,
                "exp of half"
            );
            assert_eq!(r.out[2][j * m + i], -(v as f32) as f64, "transpose");
            sum += hv;
        }
        assert!((r.out[3][i] - sum).abs() <= sum * 1e-5, "sum of halves");
    }
    assert_bits(&r.interp[0], &r.out[0], "interpreted sqrt");
    assert_bits(&r.interp[2], &r.out[2], "interpreted transpose");
}

/// The scalar `sigmoid` of the runtime header used to compute `1 / (1 + expf(-x))`, which
/// overflows for x < -88.7 and gave 0 where the value is a subnormal (sigmoid(-89) =
/// 2.2e-39): the interpreter, which computes in double, disagreed. Now `e / (1 + e)` with
/// `e = exp(-|x|)` for negative x, in the scalar code and the vector function alike.
#[test]
fn sigmoid_of_large_negative_arguments_is_not_zero() {
    let xv: Vec<f64> = [-89.0, -95.0, -100.0, -10.0, 0.0, 30.0, -0.0]
        .into_iter()
        .cycle()
        .take(19)
        .collect();
    for bytes in [4, 32] {
        let b = Bindings::empty();
        let x = input("x", &[xv.len()], Prec::Single, &xv);
        let y = output("y", &[xv.len()], Prec::Single);
        let code = unop(&y, Binop::Arg2, false, Unop::Sigmoid, &x, "i->i", &b);
        let r = run(&code, &[&y], Some(target(bytes)));
        for (k, &v) in xv.iter().enumerate() {
            let want = if v < 0.0 {
                v.exp() / (1.0 + v.exp())
            } else {
                1.0 / (1.0 + (-v).exp())
            };
            assert_ulps(
                &r.out[0][k..k + 1],
                &[want],
                3.0,
                &format!("{bytes}B sigmoid({v})"),
            );
            assert_ulps(&r.interp[0][k..k + 1], &[want], 1.0, "interpreted sigmoid");
        }
    }
}

/// Double-precision `exp`, `exp2`, `log`, `log2`, `tanh` and `sigmoid` in vector loops: the
/// runtime's double vector functions, within their documented bounds of the exact value
/// (Rust's libm in double is itself within about half an ulp), on every width, 45 elements.
#[test]
fn double_transcendental_functions_in_vector_loops() {
    let n = 45;
    let xv: Vec<f64> = values(n, 21).into_iter().map(|v| v * 40.0).collect();
    let pos: Vec<f64> = xv.iter().map(|v| v.abs() + 1e-3).collect();
    let b = Bindings::empty();
    let x = input("x", &[n], Prec::Double, &xv);
    let p = input("p", &[n], Prec::Double, &pos);
    let mut stmts = vec![];
    let mut outs = vec![];
    let ops = [
        (Unop::Exp, false),
        (Unop::Exp2, false),
        (Unop::Log, true),
        (Unop::Log2, true),
        (Unop::Tanh, false),
        (Unop::Sigmoid, false),
    ];
    for (op, positive) in ops {
        let y = output(&format!("y_{}", op.name()), &[n], Prec::Double);
        stmts.push(unop(
            &y,
            Binop::Arg2,
            false,
            op,
            if positive { &p } else { &x },
            "i->i",
            &b,
        ));
        outs.push(y);
    }
    let code = Assignments::seq(stmts);
    let refs: Vec<&Tnode> = outs.iter().collect();
    for bytes in [16, 32, 64] {
        let r = run(&code, &refs, Some(target(bytes)));
        let lanes = bytes / 8;
        assert!(
            r.src.contains(&format!("aj_vexp_f64_{lanes}(")),
            "{}",
            r.src
        );
        for (k, (op, positive)) in ops.iter().enumerate() {
            let bound = if matches!(op, Unop::Tanh | Unop::Sigmoid) {
                3.5
            } else {
                2.0
            };
            for i in 0..n {
                let a = if *positive { pos[i] } else { xv[i] };
                let want = op.interpret(a);
                let got = r.out[k][i];
                let ulp = if want == 0.0 {
                    f64::MIN_POSITIVE
                } else {
                    (want.abs().next_up() - want.abs()).max(f64::from_bits(1))
                };
                assert!(
                    (got - want).abs() <= bound * ulp,
                    "{bytes}B {}({a}) = {got:e}, libm {want:e}",
                    op.name()
                );
            }
        }
    }
}

/// The 32-partial sum of single values in the documented order: partial `k` adds the elements
/// `j ≡ k (mod 32)` in order from -0.0, the partials combine in a balanced tree of adjacent
/// pairs, the total is added to the start value 0, then the last `n mod 32` elements one by
/// one, every step rounded to single precision.
fn partial_sum_f32(v: &[f32]) -> f32 {
    let blocks = v.len() / 32;
    let mut level = vec![-0.0f32; 32];
    for b in 0..blocks {
        for (k, p) in level.iter_mut().enumerate() {
            *p += v[b * 32 + k];
        }
    }
    while level.len() > 1 {
        level = level.chunks(2).map(|p| p[0] + p[1]).collect();
    }
    let mut s = 0.0f32 + level[0];
    for x in &v[blocks * 32..] {
        s += x;
    }
    s
}

/// Whether some line of `src` containing `store` is followed, inside the same block (before a
/// line that closes it), by a line containing `acc`.
fn in_same_loop(src: &str, store: &str, acc: &str) -> bool {
    let lines: Vec<&str> = src.lines().collect();
    lines.iter().enumerate().any(|(k, l)| {
        l.contains(store)
            && lines[k + 1..]
                .iter()
                .take_while(|l| l.trim() != "}")
                .any(|l| l.contains(acc))
    })
}

/// A sum over a row that the loop before it has just written (`d = x - h`, as softmax sums
/// the exponentials it has just stored, or a layer norm the squares of the centred row) runs
/// inside that loop once both are vector loops whose lengths allow it (src/optimize/
/// vmerge.rs): the C shows the accumulation next to the store, and the sums and quotients
/// `y = d / s` are the bits of the documented order computed here, on every vector width,
/// for rows the merge applies to (1024, 96) and one it does not (1000: the producing loop
/// ends with an overlapping vector). No products: a C compiler may fuse a product into the
/// sum (SPEC allows fused multiply-adds to change the last bits).
#[test]
fn a_sum_of_the_row_just_written_runs_in_the_loop_that_writes_it() {
    for m in [1024usize, 96, 1000] {
        let n = 3;
        let xv = values(n * m, 21);
        let hv = values(m, 22);
        let b = Bindings::empty();
        let x = input("x", &[n, m], Prec::Single, &xv);
        let h = input("h", &[m], Prec::Single, &hv);
        let d = temp("d", &[n, m], Prec::Single);
        let s = output("s", &[n], Prec::Single);
        let y = output("y", &[n, m], Prec::Single);
        let code = Assignments::seq([
            binop(&d, Binop::Arg2, false, Binop::Sub, &x, &h, "ij,j->ij", &b),
            unop(&s, Binop::Add, true, Unop::Identity, &d, "ij->i", &b),
            binop(&y, Binop::Arg2, false, Binop::Div, &d, &s, "ij,i->ij", &b),
        ]);
        let (mut want_s, mut want_y) = (vec![], vec![]);
        for i in 0..n {
            let row: Vec<f32> = (0..m)
                .map(|j| xv[i * m + j] as f32 - hv[j] as f32)
                .collect();
            let sum = partial_sum_f32(&row);
            want_s.push(sum as f64);
            want_y.extend(row.iter().map(|v| (v / sum) as f64));
        }
        for t in [Some(target(16)), Some(target(32)), Some(target(64)), None] {
            let what = format!("m {m}, {t:?}");
            let r = run(&code, &[&s, &y], t);
            assert_bits(&r.out[0], &want_s, &format!("{what}: s"));
            assert_bits(&r.out[1], &want_y, &format!("{what}: y"));
            let lanes = t.map_or(0, |t| t.vector_bytes / 4);
            if m != 1000 && (lanes == 8 || lanes == 16) {
                // Vector extensions, or intrinsics (`ARRAYJIT_INTRINSICS=1`).
                let bits = lanes * 32;
                let merged = [
                    (
                        format!("aj_v{lanes}f_store(&d_row"),
                        format!("aj_v{lanes}f_load(&d_row"),
                    ),
                    (
                        format!("_mm{bits}_storeu_ps(&d_row"),
                        format!("_mm{bits}_loadu_ps(&d_row"),
                    ),
                ]
                .iter()
                .any(|(store, acc)| in_same_loop(&r.src, store, acc));
                assert!(merged, "{what}: not merged\n{}", r.src);
            }
        }
    }
}

/// Short rows run side by side: a row's maximum, its differences from it, their sum and the
/// quotients (a softmax without `exp`, so every value is exact and known) over 7 rows of 96
/// and 128 floats. Where the target interleaves them (copies of the row's scratch arrays in
/// the C), the bits are the documented ones: each row is computed as alone, in the same
/// order, including the rows left over after the last whole group.
#[test]
fn short_rows_run_side_by_side_with_the_same_bits() {
    for m in [96usize, 128] {
        let n = 7;
        let xv = values(n * m, 23);
        let b = Bindings::empty();
        let x = input("x", &[n, m], Prec::Single, &xv);
        let mx = temp("mx", &[n], Prec::Single);
        let d = temp("d", &[n, m], Prec::Single);
        let s = output("s", &[n], Prec::Single);
        let y = output("y", &[n, m], Prec::Single);
        let code = Assignments::seq([
            unop(&mx, Binop::Max, true, Unop::Identity, &x, "ij->i", &b),
            binop(&d, Binop::Arg2, false, Binop::Sub, &x, &mx, "ij,i->ij", &b),
            unop(&s, Binop::Add, true, Unop::Identity, &d, "ij->i", &b),
            binop(&y, Binop::Arg2, false, Binop::Div, &d, &s, "ij,i->ij", &b),
        ]);
        let (mut want_s, mut want_y) = (vec![], vec![]);
        for i in 0..n {
            let row: Vec<f32> = (0..m).map(|j| xv[i * m + j] as f32).collect();
            let top = row.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            let diff: Vec<f32> = row.iter().map(|v| v - top).collect();
            let sum = partial_sum_f32(&diff);
            want_s.push(sum as f64);
            want_y.extend(diff.iter().map(|v| (v / sum) as f64));
        }
        for t in [Some(target(32)), Some(target(64)), None] {
            let what = format!("m {m}, {t:?}");
            let r = run(&code, &[&s, &y], t);
            if t.is_some() {
                assert!(
                    r.src.contains("_copy1_"),
                    "{what}: not interleaved\n{}",
                    r.src
                );
            }
            assert_bits(&r.out[0], &want_s, &format!("{what}: s"));
            assert_bits(&r.out[1], &want_y, &format!("{what}: y"));
            assert_bits(&r.interp[0], &want_s, &format!("{what}: interpreted s"));
            assert_bits(&r.interp[1], &want_y, &format!("{what}: interpreted y"));
        }
    }
}
