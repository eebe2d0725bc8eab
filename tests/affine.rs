//! Affine indices (SPEC 9.3): convolutions, pooling, shifts and concatenation, through the CLI
//! (the example programs) and through the library (compiled with the optimizer on and off,
//! bounds-checked, and interpreted). Expected values are computed here by plain Rust loops
//! written from the SPEC's definition: a point of the product space at which any affine entry
//! falls outside its axis is skipped.

mod common;
use arrayjit::backend::CcBackend;
use arrayjit::interp::{self, Memory};
use arrayjit::ir::einsum::projections;
use arrayjit::ir::*;
use arrayjit::optimize::Settings;
use arrayjit::Error;
use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

// ---------------------------------------------------------------------------------------------
// Independent references

fn range(n: usize) -> Vec<f64> {
    (0..n).map(|i| i as f64).collect()
}

/// `y[o] = Σ_k x[o+k]·w[k]` (valid convolution).
fn conv1d_ref(x: &[f64], w: &[f64], n_out: usize) -> Vec<f64> {
    (0..n_out)
        .map(|o| (0..w.len()).map(|k| x[o + k] * w[k]).sum())
        .collect()
}

/// NHWC convolution with stride 2 and padding 1 (`b(2*h+i-1)(2*w+j-1)c,ijcd->bhwd`).
fn conv2d_ref(x: &[f64], xd: [usize; 4], w: &[f64], wd: [usize; 4], yd: [usize; 4]) -> Vec<f64> {
    let mut y = vec![0.0; yd.iter().product()];
    for b in 0..yd[0] {
        for h in 0..yd[1] {
            for ww in 0..yd[2] {
                for d in 0..yd[3] {
                    let mut acc = 0.0;
                    for i in 0..wd[0] {
                        for j in 0..wd[1] {
                            let r = 2 * h as i64 + i as i64 - 1;
                            let c0 = 2 * ww as i64 + j as i64 - 1;
                            if r < 0 || r >= xd[1] as i64 || c0 < 0 || c0 >= xd[2] as i64 {
                                continue;
                            }
                            let (r, c0) = (r as usize, c0 as usize);
                            for c in 0..wd[2] {
                                let xv = x[((b * xd[1] + r) * xd[2] + c0) * xd[3] + c];
                                let wv = w[((i * wd[1] + j) * wd[2] + c) * wd[3] + d];
                                acc += xv * wv;
                            }
                        }
                    }
                    y[((b * yd[1] + h) * yd[2] + ww) * yd[3] + d] = acc;
                }
            }
        }
    }
    y
}

/// Max-pool 2×2 stride 2 of an NHWC tensor with batch 1.
fn maxpool_ref(x: &[f64], xd: [usize; 4]) -> Vec<f64> {
    let (hh, ww, cc) = (xd[1] / 2, xd[2] / 2, xd[3]);
    let mut y = vec![f64::NEG_INFINITY; hh * ww * cc];
    for h in 0..hh {
        for w in 0..ww {
            for c in 0..cc {
                for i in 0..2 {
                    for j in 0..2 {
                        let v = x[((2 * h + i) * xd[2] + 2 * w + j) * cc + c];
                        let cell = &mut y[(h * ww + w) * cc + c];
                        *cell = cell.max(v);
                    }
                }
            }
        }
    }
    y
}

/// `dx[o+k] += dy[o]·w[k]` from zeros.
fn conv_transpose_ref(dy: &[f64], w: &[f64]) -> Vec<f64> {
    let mut dx = vec![0.0; dy.len() + w.len() - 1];
    for (o, a) in dy.iter().enumerate() {
        for (k, b) in w.iter().enumerate() {
            dx[o + k] += a * b;
        }
    }
    dx
}

fn maxpool_values() -> Vec<f64> {
    (0..72).map(|i| ((i * 37) % 72) as f64 - 30.0).collect()
}

// ---------------------------------------------------------------------------------------------
// The example programs through the CLI

fn run_cli(args: &[&str]) -> Value {
    let o = Command::new(env!("CARGO_BIN_EXE_arrayjit"))
        .args(args)
        .output()
        .expect("the arrayjit binary runs");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("one JSON object")
}

fn values(out: &Value, name: &str) -> Vec<f64> {
    out[name]["values"]
        .as_array()
        .unwrap_or_else(|| panic!("{name} printed: {out}"))
        .iter()
        .map(|v| match v {
            Value::String(s) if s == "-inf" => f64::NEG_INFINITY,
            v => v.as_f64().expect("a number"),
        })
        .collect()
}

/// Runs an example compiled and interpreted and checks `name` against `want` in both.
fn check_example(file: &str, name: &str, want: &[f64]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/programs")
        .join(file);
    let p = path.to_str().unwrap();
    for args in [vec!["run", p], vec!["run", "--interpret", p]] {
        let out = run_cli(&args);
        assert_eq!(values(&out, name), want, "{args:?}");
    }
}

#[test]
fn example_conv1d() {
    let want = conv1d_ref(&range(32), &[1.0, -2.0, 0.5], 30);
    check_example("conv1d.json", "y", &want);
}

#[test]
fn example_conv2d_stride_2_padding_1() {
    let want = conv2d_ref(
        &range(192),
        [1, 8, 8, 3],
        &range(54),
        [3, 3, 3, 2],
        [1, 4, 4, 2],
    );
    check_example("conv2d.json", "y", &want);
}

/// `conv2d_kernel.json`: a 3×3 convolution with padding 1 (stride 1), large enough to run
/// through the GEMM kernels (the emitted C says so); doubles of `range` inputs sum exactly.
#[test]
fn example_conv2d_through_the_kernels() {
    let (xd, wd) = ([1usize, 4, 20, 40], [3usize, 3, 40, 48]);
    let (x, w) = (range(xd.iter().product()), range(wd.iter().product()));
    let mut want = vec![0.0; 4 * 20 * 48];
    for h in 0..4i64 {
        for v in 0..20i64 {
            for d in 0..48 {
                let mut acc = 0.0;
                for i in 0..3i64 {
                    for j in 0..3i64 {
                        let (r, q) = (h + i - 1, v + j - 1);
                        if !(0..4).contains(&r) || !(0..20).contains(&q) {
                            continue;
                        }
                        for c in 0..40 {
                            acc += x[((r * 20 + q) * 40) as usize + c]
                                * w[(((i * 3 + j) * 40) as usize + c) * 48 + d];
                        }
                    }
                }
                want[((h * 20 + v) * 48) as usize + d] = acc;
            }
        }
    }
    check_example("conv2d_kernel.json", "y", &want);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/programs/conv2d_kernel.json");
    let o = Command::new(env!("CARGO_BIN_EXE_arrayjit"))
        .arg("emit-c")
        .arg(&path)
        .output()
        .unwrap();
    let c = String::from_utf8_lossy(&o.stdout);
    assert!(c.contains("GEMM kernel for y"), "{c}");
}

#[test]
fn example_maxpool() {
    let want = maxpool_ref(&maxpool_values(), [1, 6, 6, 2]);
    check_example("maxpool.json", "y", &want);
}

#[test]
fn example_conv_transpose() {
    let want = conv_transpose_ref(&range(30), &[1.0, -2.0, 0.5]);
    check_example("conv_transpose.json", "dx", &want);
}

#[test]
fn example_concat() {
    check_example("concat.json", "y", &[1.0, 2.0, 3.0, 4.0, 10.0, 20.0, 30.0]);
}

#[test]
fn example_shift() {
    check_example("shift.json", "y", &[-1.0, 0.0, 1.0, 2.0, 3.0, 4.0]);
}

// ---------------------------------------------------------------------------------------------
// The same computations through the library, four ways

/// Runs `asgns` compiled (optimizer on, optimizer off, bounds-checked) and interpreted, and
/// checks every output against `want`. Each way gets fresh nodes from `make`.
fn check_all_ways(make: &dyn Fn() -> (Assignments, Vec<Tnode>), want: &[Vec<f64>]) {
    let b = Bindings::empty();
    let off = Settings::default().enabled(false);
    let backends = [
        ("optimized", CcBackend::new()),
        ("optimizer off", CcBackend::with_settings(off)),
        ("checked", CcBackend::new().with_checked(true)),
    ];
    for (what, backend) in &backends {
        let (asgns, outs) = make();
        let (r, src) = build(backend, "affine", &b, &asgns).unwrap();
        let outs: Vec<&Tnode> = outs.iter().collect();
        let got = run_and_read(backend, &r, &outs);
        assert_eq!(got, want, "{what}; source:\n{src}");
    }
    let (asgns, outs) = make();
    let mut mem = Memory::new();
    mem.load_from_hosts(&asgns.nodes());
    interp::run_assignments(&asgns, &[], &mut mem).unwrap();
    let got: Vec<Vec<f64>> = outs.iter().map(|t| mem.get(t).unwrap().to_vec()).collect();
    assert_eq!(got, want, "interpreter");
}

#[test]
fn library_conv1d() {
    let make = || {
        let b = Bindings::empty();
        let x = input("x", &[32], Prec::Single, &range(32));
        let w = input("w", &[3], Prec::Single, &[1.0, -2.0, 0.5]);
        let y = output("y", &[30], Prec::Single);
        let a = binop(&y, Binop::Add, true, Binop::Mul, &x, &w, "(o+k),k->o", &b);
        (a, vec![y])
    };
    check_all_ways(&make, &[conv1d_ref(&range(32), &[1.0, -2.0, 0.5], 30)]);
}

#[test]
fn library_conv2d() {
    let make = || {
        let b = Bindings::empty();
        let x = input("x", &[1, 8, 8, 3], Prec::Single, &range(192));
        let w = input("w", &[3, 3, 3, 2], Prec::Single, &range(54));
        let y = output("y", &[1, 4, 4, 2], Prec::Single);
        let a = binop(
            &y,
            Binop::Add,
            true,
            Binop::Mul,
            &x,
            &w,
            "b(2*h+i-1)(2*w+j-1)c,ijcd->bhwd",
            &b,
        );
        (a, vec![y])
    };
    let want = conv2d_ref(
        &range(192),
        [1, 8, 8, 3],
        &range(54),
        [3, 3, 3, 2],
        [1, 4, 4, 2],
    );
    check_all_ways(&make, &[want]);
}

#[test]
fn library_conv2d_into_an_intermediate_then_relu() {
    // The convolution's result is not hosted: the optimizer must keep it (it is written under
    // guards) and the relu reads it.
    let make = || {
        let b = Bindings::empty();
        let x = input("x", &[1, 5, 5, 1], Prec::Double, &range(25));
        let w = input(
            "w",
            &[3, 3, 1, 1],
            Prec::Double,
            &[1.0, -1.0, 0.0, 2.0, -3.0, 1.0, 0.0, 1.0, -1.0],
        );
        let t = temp("t", &[1, 3, 3, 1], Prec::Double);
        let y = output("y", &[1, 3, 3, 1], Prec::Double);
        let a = Assignments::seq([
            binop(
                &t,
                Binop::Add,
                true,
                Binop::Mul,
                &x,
                &w,
                "b(2*h+i-1)(2*w+j-1)c,ijcd->bhwd",
                &b,
            ),
            unop(&y, Binop::Arg2, false, Unop::Relu, &t, "bhwd->bhwd", &b),
        ]);
        (a, vec![y])
    };
    let conv = conv2d_ref(
        &range(25),
        [1, 5, 5, 1],
        &[1.0, -1.0, 0.0, 2.0, -3.0, 1.0, 0.0, 1.0, -1.0],
        [3, 3, 1, 1],
        [1, 3, 3, 1],
    );
    let want: Vec<f64> = conv.iter().map(|v| v.max(0.0)).collect();
    check_all_ways(&make, &[want]);
}

#[test]
fn library_maxpool_with_padding_ignores_the_padding() {
    // 1-D max-pool, window 2, stride 2, padding 1: x[4] -> y[3]; windows {-1,0}, {1,2}, {3,4}.
    let xs = [-5.0, -7.0, -1.0, -9.0];
    let make = || {
        let b = Bindings::empty();
        let x = input("x", &[4], Prec::Single, &xs);
        let k = input("k", &[2], Prec::Single, &[0.0, 0.0]);
        let y = output("y", &[3], Prec::Single);
        let a = binop(
            &y,
            Binop::Max,
            true,
            Binop::Arg1,
            &x,
            &k,
            "(2*h+i-1),i->h",
            &b,
        );
        (a, vec![y])
    };
    // Padding would give 0 if it took part; it does not.
    check_all_ways(&make, &[vec![-5.0, -1.0, -9.0]]);
}

#[test]
fn library_maxpool_2d() {
    let make = || {
        let b = Bindings::empty();
        let x = input("x", &[1, 6, 6, 2], Prec::Single, &maxpool_values());
        let k = input("k", &[2, 2], Prec::Single, &[0.0; 4]);
        let y = output("y", &[1, 3, 3, 2], Prec::Single);
        let a = binop(
            &y,
            Binop::Max,
            true,
            Binop::Arg1,
            &x,
            &k,
            "b(2*h+i)(2*w+j)c,ij->bhwc",
            &b,
        );
        (a, vec![y])
    };
    check_all_ways(&make, &[maxpool_ref(&maxpool_values(), [1, 6, 6, 2])]);
}

#[test]
fn library_conv_transpose_and_concat_and_shift() {
    let make = || {
        let b = Bindings::empty();
        let dy = input("dy", &[30], Prec::Single, &range(30));
        let w = input("w", &[3], Prec::Single, &[1.0, -2.0, 0.5]);
        let dx = output("dx", &[32], Prec::Single);
        let a4 = input("a", &[4], Prec::Single, &[1.0, 2.0, 3.0, 4.0]);
        let b3 = input("b", &[3], Prec::Single, &[10.0, 20.0, 30.0]);
        let cat = output("cat", &[7], Prec::Single);
        let s = input("s", &[6], Prec::Single, &[-1.0; 6]);
        let x6 = input("x6", &[6], Prec::Single, &range(6));
        let a = Assignments::seq([
            binop(&dx, Binop::Add, true, Binop::Mul, &dy, &w, "o,k->(o+k)", &b),
            unop(&cat, Binop::Arg2, false, Unop::Identity, &a4, "i->(i)", &b),
            unop(
                &cat,
                Binop::Arg2,
                false,
                Unop::Identity,
                &b3,
                "i->(i+4)",
                &b,
            ),
            unop(&s, Binop::Arg2, false, Unop::Identity, &x6, "i->(i+1)", &b),
        ]);
        (a, vec![dx, cat, s])
    };
    check_all_ways(
        &make,
        &[
            conv_transpose_ref(&range(30), &[1.0, -2.0, 0.5]),
            vec![1.0, 2.0, 3.0, 4.0, 10.0, 20.0, 30.0],
            vec![-1.0, 0.0, 1.0, 2.0, 3.0, 4.0],
        ],
    );
}

#[test]
fn affine_result_with_init_neutral_fills_first() {
    // `(i)` on the result makes the statement an accumulation: with init_neutral the whole
    // result is filled with the neutral element (0 for set) first, so cells 4..6 become 0.
    let make = || {
        let b = Bindings::empty();
        let a4 = input("a", &[4], Prec::Single, &[1.0, 2.0, 3.0, 4.0]);
        let y = input("y", &[7], Prec::Single, &[9.0; 7]);
        let a = unop(&y, Binop::Arg2, true, Unop::Identity, &a4, "i->(i)", &b);
        (a, vec![y])
    };
    check_all_ways(&make, &[vec![1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0]]);
}

/// A statement reading its own result through an affine entry that leaves the axis at every
/// point (`y[i] += -y[i+3]` with y of 2 cells): no point runs, so y keeps its values without
/// init_neutral, and is filled with the neutral element (0) with it. Found by
/// scripts/conformance.py: the snapshot of y that the statement reads was then never read, so
/// the optimizer made it an output and refused to compile ("memory mode conflict for tensor
/// y.old: cannot make it Materialized ...: it is already Local").
#[test]
fn self_read_through_an_affine_entry_that_never_hits() {
    for (init, want) in [(false, vec![1.0, 3.0]), (true, vec![0.0, 0.0])] {
        let make = move || {
            let b = Bindings::empty();
            let y = input("y", &[2], Prec::Single, &[1.0, 3.0]);
            let a = unop(&y, Binop::Add, init, Unop::Neg, &y, "(i+3)->i", &b);
            (a, vec![y])
        };
        check_all_ways(&make, &[want]);
    }
}

#[test]
fn affine_entry_on_extent_one_axis_never_broadcasts() {
    // x has one cell: `(i-1)` reaches it only at i = 1; other points are skipped.
    let make = || {
        let b = Bindings::empty();
        let x = input("x", &[1], Prec::Single, &[5.0]);
        let z = input("z", &[3], Prec::Single, &[1.0, 2.0, 3.0]);
        let y = input("y", &[3], Prec::Single, &[7.0; 3]);
        let a = binop(&y, Binop::Add, true, Binop::Mul, &x, &z, "(i-1),i->i", &b);
        (a, vec![y])
    };
    check_all_ways(&make, &[vec![0.0, 10.0, 0.0]]);
}

#[test]
fn huge_coefficients_skip_points_without_overflow() {
    // Only the point i = j = 0 lands inside x.
    let make = || {
        let b = Bindings::empty();
        let x = input("x", &[3], Prec::Double, &[2.0, 3.0, 4.0]);
        let z = input("z", &[3], Prec::Double, &[10.0, 20.0, 30.0]);
        let y = output("y", &[3], Prec::Double);
        let a = binop(
            &y,
            Binop::Add,
            true,
            Binop::Mul,
            &x,
            &z,
            "(2147483647*i+2147483647*j),j->i",
            &b,
        );
        (a, vec![y])
    };
    check_all_ways(&make, &[vec![20.0, 0.0, 0.0]]);
    // A single huge term: no point at all.
    let make = || {
        let b = Bindings::empty();
        let x = input("x", &[3], Prec::Double, &[2.0, 3.0, 4.0]);
        let y = input("y", &[3], Prec::Double, &[1.0; 3]);
        let a = unop(
            &y,
            Binop::Add,
            true,
            Unop::Identity,
            &x,
            "(2147483647*i+2147483647)->i",
            &b,
        );
        (a, vec![y])
    };
    check_all_ways(&make, &[vec![0.0, 0.0, 0.0]]);
}

// ---------------------------------------------------------------------------------------------
// Errors

fn spec_err(spec: &str, lhs: &[usize], rhs: &[&[usize]]) -> Error {
    match projections(spec, lhs, rhs, &Bindings::empty()) {
        Ok(p) => panic!("{spec:?} should fail, got {p:?}"),
        Err(e) => e,
    }
}

#[test]
fn affine_letter_without_extent_is_named() {
    let e = spec_err("(i+j),j->j", &[3], &[&[5], &[3]]);
    let msg = e.to_string();
    assert!(matches!(e, Error::Spec { .. }), "{e:?}");
    assert!(msg.contains("letter 'i'"), "{msg}");
    assert!(msg.contains("no extent"), "{msg}");
    // A letter alone only on an axis of extent 1 has no extent either.
    let msg = spec_err("(i+j),ij->j", &[3], &[&[5], &[1, 3]]).to_string();
    assert!(msg.contains("letter 'i'"), "{msg}");
}

#[test]
fn malformed_entries_name_the_term_and_character() {
    let cases: [(&str, &str, &str); 7] = [
        ("(i*2),i->i", "(i*2)", "'*'"),
        ("(2*i+),i->i", "(2*i+)", "')'"),
        ("(2*),i->i", "(2*)", "')'"),
        ("(i-j),i,j->i", "(i-j)", "'j'"),
        ("(i+3x),i->i", "(i+3x)", "'x'"),
        ("(4),i->i", "(4)", "4"),
        ("x,(i+1->i", "(i+1", "'-'"),
    ];
    for (spec, term, ch) in cases {
        let rhs: Vec<Vec<usize>> = spec
            .split("->")
            .next()
            .unwrap()
            .split(',')
            .map(|_| vec![3])
            .collect();
        let rhs: Vec<&[usize]> = rhs.iter().map(|v| v.as_slice()).collect();
        match projections(spec, &[3], &rhs, &Bindings::empty()) {
            Err(Error::SpecEntry {
                spec: s,
                term: t,
                msg,
                ..
            }) => {
                assert_eq!(s, spec);
                assert_eq!(t, term, "{spec}: {msg}");
                assert!(msg.contains(ch), "{spec}: {msg} should name {ch}");
            }
            other => panic!("{spec}: expected SpecEntry, got {other:?}"),
        }
    }
    // Unterminated.
    match projections("(i+1", &[3], &[], &Bindings::empty()) {
        Err(Error::SpecEntry { msg, .. }) => assert!(msg.contains("end of the spec"), "{msg}"),
        other => panic!("expected SpecEntry, got {other:?}"),
    }
}

#[test]
fn huge_numbers_are_errors_not_panics() {
    for spec in [
        "(99999999999999999999999*i),i->i",
        "(i+99999999999999999999),i->i",
        "(i-2147483648),i->i",
    ] {
        match projections(spec, &[3], &[&[3], &[3]], &Bindings::empty()) {
            Err(Error::SpecEntry { msg, .. }) => assert!(msg.contains("too large"), "{msg}"),
            other => panic!("{spec}: expected SpecEntry, got {other:?}"),
        }
    }
}

#[test]
fn cli_reports_malformed_entries() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.json");
    std::fs::write(
        &p,
        r#"{"tensors": [{"name": "x", "dims": [4], "init": "range"}, {"name": "y", "dims": [4]}],
            "routines": [{"name": "r", "code": [
              {"assign": "y", "op": "identity", "args": ["x"], "logic": "(i+*2)->i"}]}],
            "run": [{"routine": "r"}], "print": ["y"]}"#,
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_arrayjit"))
        .args(["run", p.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("(i+*2)") && err.contains("'*'"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn regression_gcc12_loop_interchange() {
    // `(a+b)` on the result with `set`: several points write one cell, the last one (in loop
    // order: result letters first, a outer, b inner) wins. GCC 12.2 at -O3 with
    // `--param=max-completely-peel-times=1` interchanged this nest (now -fno-loop-interchange).
    let t = [101.0, 172.0, 208.0];
    let mut want = vec![0.0; 25];
    for a in 0..2 {
        for (b, v) in t.iter().enumerate() {
            want[(a + b) * 5 + 3] = *v;
        }
    }
    let make = || {
        let b = Bindings::empty();
        let x = input("x", &[2, 5], Prec::Byte, &[0.0; 10]);
        let tt = input("t", &[3], Prec::Byte, &t);
        let o = output("o", &[5, 5], Prec::Byte);
        let a = binop(
            &o,
            Binop::Arg2,
            true,
            Binop::Arg2,
            &x,
            &tt,
            "a3,b->(a+b)3",
            &b,
        );
        (a, vec![o])
    };
    check_all_ways(&make, &[want]);
}
