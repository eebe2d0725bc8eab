//! Every operation in every precision, against values computed here by plain Rust formulas.

mod common;
use arrayjit::ir::*;
use common::*;

fn inputs(prec: Prec) -> (Vec<f64>, Vec<f64>) {
    match prec {
        Prec::Byte => (
            vec![0., 1., 2., 3., 7., 100., 200., 255.],
            vec![1., 2., 3., 0., 5., 2., 100., 255.],
        ),
        _ => (
            vec![-2.5, -1., -0.25, 0., 0.5, 1., 1.75, 3.],
            vec![1.5, 2., -0.5, 3., 0.25, -4., 2., 0.5],
        ),
    }
}

/// The meaning of each unary op, written independently of the library's table.
fn unary(op: Unop, a: f64) -> f64 {
    match op {
        Unop::Identity => a,
        Unop::Relu => {
            if a > 0.0 {
                a
            } else {
                0.0
            }
        }
        Unop::Neg => -a,
        Unop::Exp => a.exp(),
        Unop::Log => a.ln(),
        Unop::Sqrt => a.sqrt(),
        Unop::Recip => 1.0 / a,
        Unop::Tanh => a.tanh(),
        Unop::Sin => a.sin(),
        Unop::Cos => a.cos(),
        Unop::Satur01 => {
            if a > 0.0 {
                a.min(1.0)
            } else {
                0.0
            }
        }
        Unop::Exp2 => 2f64.powf(a),
        Unop::Log2 => a.ln() / std::f64::consts::LN_2,
        Unop::Rsqrt => 1.0 / a.sqrt(),
        Unop::Trunc => a.trunc(),
        Unop::Floor => a.floor(),
        Unop::Ceil => a.ceil(),
        Unop::Abs => a.abs(),
        Unop::Sigmoid => 1.0 / (1.0 + (-a).exp()),
        Unop::Not => f64::from(u8::from(a == 0.0)),
    }
}

/// The meaning of each binary op, written independently of the library's table.
fn binary(op: Binop, a: f64, b: f64) -> f64 {
    match op {
        Binop::Add => a + b,
        Binop::Sub => a - b,
        Binop::Mul => a * b,
        Binop::Div => a / b,
        Binop::ToPowOf => a.powf(b),
        Binop::ReluGate => {
            if a > 0.0 {
                b
            } else {
                0.0
            }
        }
        Binop::Arg1 => a,
        Binop::Arg2 => b,
        Binop::Max => {
            if a.is_nan() {
                b
            } else if b.is_nan() || a >= b {
                a
            } else {
                b
            }
        }
        Binop::Min => {
            if a.is_nan() {
                b
            } else if b.is_nan() || a <= b {
                a
            } else {
                b
            }
        }
        Binop::Mod => a % b,
        Binop::Lt => f64::from(u8::from(a < b)),
        Binop::Le => f64::from(u8::from(a <= b)),
        Binop::Gt => f64::from(u8::from(a > b)),
        Binop::Ge => f64::from(u8::from(a >= b)),
        Binop::Eq => f64::from(u8::from(a == b)),
        Binop::Ne => f64::from(u8::from(a != b)),
        Binop::And => f64::from(u8::from(a != 0.0 && b != 0.0)),
        Binop::Or => f64::from(u8::from(a != 0.0 || b != 0.0)),
        Binop::Satur01Gate => {
            if 0.0 < a && a < 1.0 {
                b
            } else {
                0.0
            }
        }
        // Integer-only: bytes (the only integer precision of this test).
        Binop::BitAnd => f64::from(a as u8 & b as u8),
        Binop::BitOr => f64::from(a as u8 | b as u8),
        Binop::BitXor => f64::from(a as u8 ^ b as u8),
        Binop::Shl => f64::from((a as u8) << (b as u8 % 8)),
        Binop::Shr => f64::from((a as u8) >> (b as u8 % 8)),
    }
}

/// Byte arguments compute in integer arithmetic (SPEC 9.1): the power is exact, wrapped.
fn binary_in(prec: Prec, op: Binop, a: f64, b: f64) -> f64 {
    match (prec, op) {
        (Prec::Byte, Binop::ToPowOf) => f64::from((a as u8).wrapping_pow(b as u32)),
        (Prec::Byte, Binop::Div) if b == 0.0 => 0.0,
        _ => binary(op, a, b),
    }
}

#[test]
fn every_operation_in_every_precision() {
    // (The wider integer precisions have their own tests in tests/precisions.rs.)
    for prec in Prec::ALL
        .into_iter()
        .filter(|p| *p == Prec::Byte || !p.is_integer())
    {
        let (va, vb) = inputs(prec);
        let b = Bindings::empty();
        let a_t = input("a", &[2, 4], prec, &va);
        let b_t = input("b", &[2, 4], prec, &vb);
        // Values as stored.
        let va: Vec<f64> = va.iter().map(|&x| round_to(prec, x)).collect();
        let vb: Vec<f64> = vb.iter().map(|&x| round_to(prec, x)).collect();
        let mut asgns = vec![];
        let mut checks: Vec<(String, Tnode, Vec<f64>)> = vec![];
        for op in Unop::ALL {
            let out = output(&format!("u_{}", op.name()), &[2, 4], prec);
            asgns.push(unop(&out, Binop::Arg2, false, op, &a_t, "ij->ij", &b));
            let want = va.iter().map(|&x| round_to(prec, unary(op, x))).collect();
            checks.push((op.name().to_string(), out, want));
        }
        for op in Binop::ALL {
            if op.is_integer_only() && !prec.is_integer() {
                continue;
            }
            let out = output(&format!("b_{}", op.name()), &[2, 4], prec);
            asgns.push(binop(
                &out,
                Binop::Arg2,
                false,
                op,
                &a_t,
                &b_t,
                "ij,ij->ij",
                &b,
            ));
            let want = va
                .iter()
                .zip(&vb)
                .map(|(&x, &y)| round_to(prec, binary_in(prec, op, x, y)))
                .collect();
            checks.push((op.name().to_string(), out, want));
        }
        let outs: Vec<&Tnode> = checks.iter().map(|c| &c.1).collect();
        let (got, _) = compute(&Assignments::seq(asgns), &b, &outs);
        for ((name, _, want), got) in checks.iter().zip(&got) {
            assert_close(prec, got, want, name);
        }
    }
}

#[test]
fn integer_powers_are_unrolled_and_correct() {
    for prec in [Prec::Single, Prec::Double] {
        let b = Bindings::empty();
        let x = input("x", &[4], prec, &[-1.5, 0.5, 2.0, 3.0]);
        let mut asgns = vec![];
        let mut checks = vec![];
        for e in [0.0, 1.0, 2.0, 3.0, -2.0, 0.5] {
            let c = temp(&format!("c{}", checks.len()), &[1], prec);
            asgns.push(Assignments::Fetch {
                array: c.clone(),
                fetch_op: FetchOp::Constant(e),
            });
            let out = output(&format!("p{}", checks.len()), &[4], prec);
            asgns.push(binop(
                &out,
                Binop::Arg2,
                false,
                Binop::ToPowOf,
                &x,
                &c,
                "i,0->i",
                &b,
            ));
            let want: Vec<f64> = [-1.5f64, 0.5, 2.0, 3.0]
                .iter()
                .map(|&v| round_to(prec, v.powf(e)))
                .collect();
            checks.push((out, want, e));
        }
        let outs: Vec<&Tnode> = checks.iter().map(|c| &c.0).collect();
        let (got, src) = compute(&Assignments::seq(asgns), &b, &outs);
        for ((_, want, e), got) in checks.iter().zip(&got) {
            assert_close(prec, got, want, &format!("pow {e}"));
        }
        // Only the non-integer exponent needs the pow function.
        let pow_fn = if prec == Prec::Single {
            "powf("
        } else {
            "pow("
        };
        assert_eq!(src.matches(pow_fn).count(), 1, "{src}");
    }
}

#[test]
fn reductions_with_every_accumulator() {
    for prec in Prec::ALL
        .into_iter()
        .filter(|p| *p == Prec::Byte || !p.is_integer())
    {
        let b = Bindings::empty();
        let vals: Vec<f64> = match prec {
            Prec::Byte => vec![1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12.],
            _ => vec![0.5, -1., 2., 3., -4., 0.25, 1.5, -2., 1., 1., 2., -0.5],
        };
        let x = input("x", &[3, 4], prec, &vals);
        let mut asgns = vec![];
        let mut checks = vec![];
        for acc in [Binop::Add, Binop::Mul, Binop::Max, Binop::Min, Binop::Sub] {
            let out = output(&format!("r_{}", acc.name()), &[3], prec);
            asgns.push(unop(&out, acc, true, Unop::Identity, &x, "ij->i", &b));
            let want: Vec<f64> = (0..3)
                .map(|i| {
                    let row = &vals[i * 4..i * 4 + 4];
                    let start = match acc {
                        Binop::Add | Binop::Sub => 0.0,
                        Binop::Mul => 1.0,
                        // Integer results (SPEC 9.1): the type's minimum / maximum.
                        Binop::Max if prec == Prec::Byte => 0.0,
                        Binop::Max => f64::NEG_INFINITY,
                        _ if prec == Prec::Byte => 255.0,
                        _ => f64::INFINITY,
                    };
                    // Accumulate as generated code does: store (round) after each step.
                    let start = round_to(prec, start);
                    row.iter().fold(start, |s, &v| {
                        round_to(prec, binary(acc, s, round_to(prec, v)))
                    })
                })
                .collect();
            checks.push((acc.name(), out, want));
        }
        // Column sums into a [1, 4] result (broadcast lhs axis).
        let cols = output("cols", &[1, 4], prec);
        asgns.push(unop(
            &cols,
            Binop::Add,
            true,
            Unop::Identity,
            &x,
            "ij->0j",
            &b,
        ));
        let want: Vec<f64> = (0..4)
            .map(|j| {
                (0..3).fold(0.0, |s, i| {
                    round_to(prec, s + round_to(prec, vals[i * 4 + j]))
                })
            })
            .collect();
        checks.push(("cols", cols, want));
        let outs: Vec<&Tnode> = checks.iter().map(|c| &c.1).collect();
        let (got, _) = compute(&Assignments::seq(asgns), &b, &outs);
        for ((name, _, want), got) in checks.iter().zip(&got) {
            assert_close(prec, got, want, name);
        }
    }
}

#[test]
fn matmul_and_mixed_precisions() {
    let b = Bindings::empty();
    let x = input("x", &[2, 3], Prec::Single, &[1., 2., 3., 4., 5., 6.]);
    let w = input("w", &[3, 2], Prec::Half, &[0.5, -1., 2., 0.25, -3., 1.]);
    let y = output("y", &[2, 2], Prec::Double);
    let a = binop(&y, Binop::Add, true, Binop::Mul, &x, &w, "ij,jk->ik", &b);
    let (got, _) = compute(&a, &b, &[&y]);
    // By hand: [1 2 3; 4 5 6] @ [0.5 -1; 2 0.25; -3 1].
    assert_eq!(
        got[0],
        vec![
            0.5 + 4. - 9.,
            -1. + 0.5 + 3.,
            2. + 10. - 18.,
            -4. + 1.25 + 6.
        ]
    );
}

#[test]
fn fetch_constant_slice_and_embed() {
    let row = StaticSymbol::new("row", Some(3));
    let b = Bindings(vec![row.clone()]);
    let batch = input("batch", &[3, 2], Prec::Single, &[1., 2., 3., 4., 5., 6.]);
    let sl = output("sl", &[2], Prec::Single);
    let k = output("k", &[2, 2], Prec::Double);
    let e = output("e", &[1], Prec::Byte);
    let asgns = Assignments::seq([
        Assignments::Fetch {
            array: sl.clone(),
            fetch_op: FetchOp::Slice {
                batch_idx: row.clone(),
                sliced: batch.clone(),
            },
        },
        Assignments::Fetch {
            array: k.clone(),
            fetch_op: FetchOp::Constant(-0.125),
        },
        Assignments::Fetch {
            array: e.clone(),
            fetch_op: FetchOp::EmbedSymbol(row.clone()),
        },
    ]);
    let backend = arrayjit::backend::CcBackend::new();
    let (r, _) = build(&backend, "fetch", &b, &asgns).unwrap();
    for i in 0..3 {
        r.bindings().set("row", i).unwrap();
        let got = run_and_read(&backend, &r, &[&sl, &k, &e]);
        let i = i as usize;
        assert_eq!(got[0], vec![(2 * i + 1) as f64, (2 * i + 2) as f64]);
        assert_eq!(got[1], vec![-0.125; 4]);
        assert_eq!(got[2], vec![i as f64]);
    }
    // Out of range: a clear error, not an out-of-bounds access.
    let err = r.bindings().set("row", 3).unwrap_err().to_string();
    assert!(err.contains("row") && err.contains('3'), "{err}");
    assert!(r.bindings().set("row", -1).is_err());
    // The last good value stays.
    assert_eq!(run_and_read(&backend, &r, &[&e])[0], vec![2.]);
}

#[test]
fn static_index_in_einsum_spec() {
    let s = StaticSymbol::new("s", None);
    let b = Bindings(vec![s.clone()]);
    let x = input("x", &[3, 2], Prec::Single, &[1., 2., 3., 4., 5., 6.]);
    let y = output("y", &[3], Prec::Single);
    // y[s] = sum_j x[s, j], other cells untouched.
    let a = unop(&y, Binop::Add, false, Unop::Identity, &x, "{s}j->{s}", &b);
    let backend = arrayjit::backend::CcBackend::new();
    let (r, _) = build(&backend, "st", &b, &a).unwrap();
    r.bindings().set("s", 2).unwrap();
    let got = run_and_read(&backend, &r, &[&y]);
    assert_eq!(got[0], vec![0., 0., 11.]);
    assert!(matches!(
        r.bindings().set("s", 3),
        Err(arrayjit::Error::BindingOutOfRange { .. })
    ));
}

/// No operation's C template names an operand twice: the operand's text would be printed
/// twice, so each level of a chain of inlined operations would double the C expression
/// (`relu` was `aj_gate_f($a, $a)`: 30 chained relus made gigabytes of C).
#[test]
fn no_operation_template_repeats_an_operand() {
    let templates = Binop::ALL
        .iter()
        .flat_map(|op| {
            let i = op.info();
            [
                (op.name(), i.c_float),
                (op.name(), i.c_double),
                (op.name(), i.c_int),
            ]
        })
        .chain(Unop::ALL.iter().flat_map(|op| {
            let i = op.info();
            [
                (op.name(), i.c_float),
                (op.name(), i.c_double),
                (op.name(), i.c_int),
            ]
        }));
    for (name, t) in templates {
        assert!(t.matches("$a").count() <= 1, "{name}: {t}");
        assert!(t.matches("$b").count() <= 1, "{name}: {t}");
    }
}

/// Runs `asg` compiled at `-O<level>` and returns the host values of `outs` and the C source.
fn compute_at_opt_level(
    level: &str,
    asg: &Assignments,
    outs: &[&Tnode],
) -> (Vec<Vec<f64>>, String) {
    use arrayjit::backend::CcBackend;
    use arrayjit::compile::CompilerConfig;
    let cfg = CompilerConfig::from_env()
        .unwrap()
        .opt_level(level)
        .cache_dir(None);
    let backend = CcBackend::with_config(cfg, Default::default());
    let (r, src) = build(&backend, "signed_zeros", &Bindings::empty(), asg).unwrap();
    (run_and_read(&backend, &r, outs), src)
}

/// Bitwise equality of results, with the sign of zeros checked (NaN matches NaN).
fn assert_same_bits(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same =
            (g.is_nan() && w.is_nan()) || (g == w && g.is_sign_negative() == w.is_sign_negative());
        assert!(
            same,
            "{what} cell {i}: got {g:?}, want {w:?}\n got: {got:?}\nwant: {want:?}"
        );
    }
}

/// max and min are IEEE 754-2019 maximumNumber / minimumNumber: a NaN operand is ignored, and
/// +0 is larger than -0, whatever the order of the operands: max(-0, +0) = max(+0, -0) = +0,
/// min(-0, +0) = min(+0, -0) = -0. Pointwise and as accumulators (short rows, and rows long
/// enough for the vectorized reductions of single and double), in half, single and double,
/// compiled at -O0 and -O3 and interpreted: every result bit for bit, signs included.
#[test]
fn max_and_min_order_signed_zeros() {
    let (n, p) = (-0.0f64, 0.0f64);
    let nan = f64::NAN;
    let a = [n, p, n, p, nan, n, nan, 1.0, n];
    let b = [p, n, n, p, n, nan, p, n, -1.0];
    let max_ab = [p, p, n, p, n, n, p, 1.0, n];
    let min_ab = [n, n, n, p, n, n, p, n, -1.0];
    // Rows to reduce: a long one (beyond the vectorized reductions' 2 x 16 lanes) of -0 with a
    // single +0 in the middle, a long one of -0 only, and short ones.
    let width = 40;
    let mut rows: Vec<Vec<f64>> = vec![vec![n; width], vec![n; width]];
    rows[0][21] = p;
    let mut short = |r: &[f64]| {
        let mut v = r.to_vec();
        v.resize(width, r[r.len() - 1]);
        rows.push(v);
    };
    short(&[p, n]);
    short(&[n, p]);
    short(&[nan, n]);
    short(&[p, nan]);
    let red_max = [p, n, p, p, n, p];
    let red_min = [n, n, n, n, n, p];
    let flat: Vec<f64> = rows.concat();
    for prec in [Prec::Half, Prec::Single, Prec::Double] {
        let bnd = Bindings::empty();
        let at = input("a", &[a.len()], prec, &a);
        let bt = input("b", &[b.len()], prec, &b);
        let xt = input("x", &[rows.len(), width], prec, &flat);
        let outs: Vec<Tnode> = ["max", "min", "rmax", "rmin"]
            .iter()
            .map(|s| {
                output(
                    s,
                    &[if s.starts_with('r') {
                        rows.len()
                    } else {
                        a.len()
                    }],
                    prec,
                )
            })
            .collect();
        let asg = Assignments::seq([
            binop(
                &outs[0],
                Binop::Arg2,
                false,
                Binop::Max,
                &at,
                &bt,
                "i,i->i",
                &bnd,
            ),
            binop(
                &outs[1],
                Binop::Arg2,
                false,
                Binop::Min,
                &at,
                &bt,
                "i,i->i",
                &bnd,
            ),
            unop(
                &outs[2],
                Binop::Max,
                true,
                Unop::Identity,
                &xt,
                "ij->i",
                &bnd,
            ),
            unop(
                &outs[3],
                Binop::Min,
                true,
                Unop::Identity,
                &xt,
                "ij->i",
                &bnd,
            ),
        ]);
        let want: [&[f64]; 4] = [&max_ab, &min_ab, &red_max, &red_min];
        let refs: Vec<&Tnode> = outs.iter().collect();
        for level in ["0", "3"] {
            let (got, src) = compute_at_opt_level(level, &asg, &refs);
            // Single and double long rows take the vectorized reductions' path (vector
            // partial results `_part`, or scalar accumulators `_acc` without vectors).
            let vectorized = src.contains("_acc") || src.contains("_part");
            assert_eq!(vectorized, prec != Prec::Half, "{src}");
            for ((o, g), w) in outs.iter().zip(&got).zip(want) {
                assert_same_bits(g, w, &format!("{} [{prec}] -O{level}", o.name()));
            }
        }
        let mut mem = arrayjit::interp::Memory::new();
        mem.load_from_hosts(&asg.nodes());
        arrayjit::interp::run_assignments(&asg, &[], &mut mem).unwrap();
        for (o, w) in outs.iter().zip(want) {
            let g = mem.get(o).unwrap();
            assert_same_bits(g, w, &format!("{} [{prec}] interpreted", o.name()));
        }
    }
}

/// A static index's limit comes from every axis it indexes in the routine as written, not
/// only from the reads that survive optimization: `arg1` drops its second operand, which is
/// the only use of `s` (issue 19, item 7: `s = 1000` on an extent-2 axis ran).
#[test]
fn static_index_limit_counts_reads_the_optimizer_drops() {
    let s = StaticSymbol::new("s", None);
    let b = Bindings(vec![s.clone()]);
    let x = input("x", &[3], Prec::Single, &[1., 2., 3.]);
    let w = input("w", &[2], Prec::Single, &[10., 20.]);
    let y = output("y", &[3], Prec::Single);
    let a = binop(&y, Binop::Arg2, false, Binop::Arg1, &x, &w, "i,{s}->i", &b);
    let backend = arrayjit::backend::CcBackend::new();
    let (r, _) = build(&backend, "drop", &b, &a).unwrap();
    r.bindings().set("s", 1).unwrap();
    assert_eq!(run_and_read(&backend, &r, &[&y])[0], vec![1., 2., 3.]);
    for bad in [2, 1000, -1] {
        let err = r.bindings().set("s", bad).unwrap_err();
        assert!(
            matches!(&err, arrayjit::Error::BindingOutOfRange { index, value, limit: 2, .. } if index == "s" && *value == bad),
            "s = {bad}: {err:?}"
        );
    }
}

/// A static index used on axes of extents 3 and 1 accepts only 0, however the optimizer
/// rewrites the accesses (issue 19, item 1).
#[test]
fn static_index_limit_is_the_smallest_axis() {
    let s = StaticSymbol::new("s", None);
    let b = Bindings(vec![s.clone()]);
    let x = input("x", &[2], Prec::Single, &[1., 2.]);
    let y1 = output("y1", &[3], Prec::Single);
    let y2 = output("y2", &[2, 1, 2], Prec::Single);
    let a = Assignments::seq([
        unop(&y1, Binop::Add, false, Unop::Identity, &x, "j->{s}", &b),
        unop(&y2, Binop::Arg2, false, Unop::Identity, &x, "j->a{s}j", &b),
    ]);
    let backend = arrayjit::backend::CcBackend::new();
    let (r, _) = build(&backend, "two_axes", &b, &a).unwrap();
    r.bindings().set("s", 0).unwrap();
    let got = run_and_read(&backend, &r, &[&y1, &y2]);
    assert_eq!(got[0], vec![3., 0., 0.]);
    assert_eq!(got[1], vec![1., 2., 1., 2.]);
    for bad in [1, 2] {
        assert!(matches!(
            r.bindings().set("s", bad),
            Err(arrayjit::Error::BindingOutOfRange { limit: 1, .. })
        ));
    }
}

/// The optimizer's simplifications keep IEEE values: a scalar constant 0 is inlined into
/// `f * k` and `f + k`, and nan·0 is nan, inf·0 is nan, -2·0 and -0·0 are -0, -0 + 0 is +0,
/// exactly
/// as when `k` is a tensor in memory (and as the interpreter computes). Found by
/// scripts/conformance.py: `x*0 → 0` and `x+0 → x` made the compiled results depend on
/// whether the optimizer inlined `k`.
#[test]
fn simplification_keeps_ieee_values() {
    let b = Bindings::empty();
    let make = |prec: Prec| {
        let f = input("f", &[4], prec, &[f64::NAN, f64::INFINITY, -2.0, -0.0]);
        let k = temp("k", &[1], prec);
        let m = output("m", &[4], prec);
        let s = output("s", &[4], prec);
        let a = Assignments::seq([
            Assignments::Fetch {
                array: k.clone(),
                fetch_op: FetchOp::Constant(0.0),
            },
            binop(&m, Binop::Arg2, false, Binop::Mul, &f, &k, "i,0->i", &b),
            binop(&s, Binop::Arg2, false, Binop::Add, &f, &k, "i,0->i", &b),
        ]);
        (a, m, s)
    };
    for prec in [Prec::Single, Prec::Double] {
        let (a, m, s) = make(prec);
        let (got, src) = compute(&a, &b, &[&m, &s]);
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let (gm, gs) = (bits(&got[0]), bits(&got[1]));
        assert!(
            got[0][0].is_nan() && got[0][1].is_nan(),
            "{prec}: {:?}\n{src}",
            got[0]
        );
        assert_eq!(gm[2..], bits(&[-0.0, -0.0])[..], "{prec}: {src}");
        assert!(got[1][0].is_nan(), "{src}");
        assert_eq!(
            gs[1..],
            bits(&[f64::INFINITY, -2.0, 0.0])[..],
            "{prec}: {src}"
        );
    }
}

/// `init_neutral` fills a logical or bitwise reduction with the operation's identity, as
/// numpy's `logical_and.reduce` / `bitwise_and.reduce` start from True / all ones: 1 for
/// `and`, all ones for `bit_and`, 0 for `or`, `bit_or`, `bit_xor`. Rows [7, 6, 14] and
/// [0, 5, 6] (by hand): and → 1, 0; or → 1, 1; bit_and → 7&6&14 = 6, 0; bit_or → 15, 7;
/// bit_xor → 7^6^14 = 15, 3. Found by scripts/conformance.py: `and` and `bit_and` started
/// from 0, so the result was always 0.
#[test]
fn logical_and_bitwise_reductions_start_from_their_identity() {
    let b = Bindings::empty();
    let vals = [7., 6., 14., 0., 5., 6.];
    let cases = [
        (Binop::And, [1., 0.]),
        (Binop::Or, [1., 1.]),
        (Binop::BitAnd, [6., 0.]),
        (Binop::BitOr, [15., 7.]),
        (Binop::BitXor, [15., 3.]),
    ];
    for prec in [Prec::Int32, Prec::Uint64, Prec::Byte, Prec::Single] {
        let x = input("x", &[2, 3], prec, &vals);
        let mut asgns = vec![];
        let mut outs = vec![];
        for (acc, _) in cases {
            if acc.is_integer_only() && !prec.is_integer() {
                continue;
            }
            let out = output(&format!("r_{}", acc.name()), &[2], prec);
            asgns.push(unop(&out, acc, true, Unop::Identity, &x, "ij->i", &b));
            outs.push((acc, out));
        }
        let refs: Vec<&Tnode> = outs.iter().map(|o| &o.1).collect();
        let (got, _) = compute(&Assignments::seq(asgns), &b, &refs);
        for ((acc, _), got) in outs.iter().zip(&got) {
            let want = cases.iter().find(|c| c.0 == *acc).unwrap().1;
            assert_eq!(got, &want.to_vec(), "{prec} {acc}");
        }
    }
}
