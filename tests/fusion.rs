//! Fusion across statements: loop nests over the same rows become one loop, their
//! intermediates shrink to row-sized locals, and local tensors written whole before they are
//! read get no zero fill. Values are checked against softmax and layer norm computed here in
//! f64, and against the same code with the optimizer off.

mod common;
use arrayjit::ir::*;
use arrayjit::loops::Llc;
use arrayjit::lower::lower;
use arrayjit::optimize::{optimize, Settings};
use common::*;

fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % 2000) as f64 / 200.0 - 5.0
        })
        .collect()
}

/// The top-level loops of optimized code (comments and zero fills left out).
/// The loops at the top of the code (plain or parallel: the rows' loop of a fused
/// normalization is a parallel region).
fn top_loops(code: &Llc) -> usize {
    let is_loop = |c: &Llc| matches!(c, Llc::For { .. } | Llc::Parallel(_));
    match code {
        Llc::Seq(v) => v.iter().filter(|c| is_loop(c)).count(),
        c => usize::from(is_loop(c)),
    }
}

/// `y = softmax(x)` over rows, as five statements: row max, subtract, exp, row sum, divide.
fn softmax(x: &Tnode, y: &Tnode, (n, m): (usize, usize)) -> Assignments {
    let b = Bindings::empty();
    let mx = temp("m", &[n], Prec::Single);
    let d = temp("d", &[n, m], Prec::Single);
    let e = temp("e", &[n, m], Prec::Single);
    let s = temp("s", &[n], Prec::Single);
    Assignments::seq([
        unop(&mx, Binop::Max, true, Unop::Identity, x, "ij->i", &b),
        binop(&d, Binop::Arg2, false, Binop::Sub, x, &mx, "ij,i->ij", &b),
        unop(&e, Binop::Arg2, false, Unop::Exp, &d, "ij->ij", &b),
        unop(&s, Binop::Add, true, Unop::Identity, &e, "ij->i", &b),
        binop(y, Binop::Arg2, false, Binop::Div, &e, &s, "ij,i->ij", &b),
    ])
}

fn softmax_f64(xv: &[f64], (n, m): (usize, usize)) -> Vec<f64> {
    let mut out = vec![0.0; n * m];
    for i in 0..n {
        let row = &xv[i * m..(i + 1) * m];
        let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - mx).exp()).sum();
        for j in 0..m {
            out[i * m + j] = (row[j] - mx).exp() / s;
        }
    }
    out
}

#[test]
fn softmax_rows_fuse_into_one_loop_with_row_locals() {
    let (n, m) = (37, 300);
    let xv = values(n * m, 1);
    let x = input("x", &[n, m], Prec::Single, &xv);
    let y = output("y", &[n, m], Prec::Single);
    let code = softmax(&x, &y, (n, m));
    let o = optimize("softmax", lower(&code).unwrap(), &Settings::default()).unwrap();
    assert_eq!(top_loops(&o.code), 1, "one loop over rows:\n{:?}", o.code);
    // The intermediates became row-sized locals: no node of n × m elements is left but x, y.
    for (tn, mode) in &o.nodes {
        if *mode == MemoryMode::Local {
            assert!(
                tn.dims().iter().product::<usize>() <= m,
                "{} {:?}",
                tn.name(),
                tn.dims()
            );
        }
    }
    let (got, src) = compute(&code, &Bindings::empty(), &[&y]);
    assert!(src.contains("_row_"), "{src}");
    assert!(
        !src.contains("memset"),
        "no zero fill of a buffer written whole:\n{src}"
    );
    let want = softmax_f64(&xv, (n, m));
    for (k, (g, w)) in got[0].iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6 + 1e-5 * w.abs(),
            "y[{k}] = {g}, want {w}"
        );
    }
}

#[test]
fn layer_norm_rows_fuse_and_match_f64() {
    let (n, m) = (19, 256);
    let b = Bindings::empty();
    let xv = values(n * m, 2);
    let gv = values(m, 3);
    let x = input("x", &[n, m], Prec::Single, &xv);
    let g = input("g", &[m], Prec::Single, &gv);
    let inv = input("inv", &[1], Prec::Single, &[1.0 / m as f64]);
    let mu = temp("mu", &[n], Prec::Single);
    let c = temp("c", &[n, m], Prec::Single);
    let var = temp("var", &[n], Prec::Single);
    let r = temp("r", &[n], Prec::Single);
    let y = output("y", &[n, m], Prec::Single);
    let code = Assignments::seq([
        binop(&mu, Binop::Add, true, Binop::Mul, &x, &inv, "ij,0->i", &b),
        binop(&c, Binop::Arg2, false, Binop::Sub, &x, &mu, "ij,i->ij", &b),
        binop(&var, Binop::Add, true, Binop::Mul, &c, &c, "ij,ij->i", &b),
        unop(&r, Binop::Arg2, false, Unop::Rsqrt, &var, "i->i", &b),
        binop(&y, Binop::Arg2, false, Binop::Mul, &c, &r, "ij,i->ij", &b),
        binop(&y, Binop::Arg2, false, Binop::Mul, &y, &g, "ij,j->ij", &b),
    ]);
    let o = optimize("ln", lower(&code).unwrap(), &Settings::default()).unwrap();
    assert_eq!(top_loops(&o.code), 1, "{:?}", o.code);
    let (got, _) = compute(&code, &b, &[&y]);
    for i in 0..n {
        let row = &xv[i * m..(i + 1) * m];
        let mean = row.iter().sum::<f64>() / m as f64;
        let var: f64 = row.iter().map(|v| (v - mean) * (v - mean)).sum();
        for j in 0..m {
            let want = (row[j] - mean) / var.sqrt() * gv[j];
            let got = got[0][i * m + j];
            assert!(
                (got - want).abs() <= 1e-5 + 1e-4 * want.abs(),
                "y[{i},{j}] = {got}, want {want}"
            );
        }
    }
}

/// A statement that reads another row than the one being written (a shift by one row) must
/// not fuse with the statement computing it: fusing would read rows not yet computed.
#[test]
fn a_shifted_read_keeps_the_loops_apart() {
    let (n, m) = (8, 40);
    let b = Bindings::empty();
    let xv = values(n * m, 4);
    let x = input("x", &[n, m], Prec::Single, &xv);
    let t = temp("t", &[n, m], Prec::Single);
    let two = input("two", &[1], Prec::Single, &[2.0]);
    let y = output("y", &[n, m], Prec::Single);
    let code = Assignments::seq([
        binop(&t, Binop::Arg2, false, Binop::Mul, &x, &two, "ij,0->ij", &b),
        binop(
            &y,
            Binop::Arg2,
            false,
            Binop::Add,
            &t,
            &t,
            "(i+1)j,ij->ij",
            &b,
        ),
    ]);
    let o = optimize("shift", lower(&code).unwrap(), &Settings::default()).unwrap();
    assert_eq!(top_loops(&o.code), 2, "{:?}", o.code);
    let (got, src) = compute(&code, &b, &[&y]);
    // `t` is written whole before it is read: no zero fill.
    assert!(!src.contains("memset"), "{src}");
    for i in 0..n {
        for j in 0..m {
            // The last row's points read past the end of `t`: skipped, so `y` keeps its 0.
            let want = if i + 1 < n {
                (2.0 * xv[(i + 1) * m + j] as f32 + 2.0 * xv[i * m + j] as f32) as f64
            } else {
                0.0
            };
            assert_eq!(got[0][i * m + j], want, "y[{i},{j}]");
        }
    }
}

/// Fusion reorders nothing within a row, so the results are those of the unfused code bit
/// for bit. The statements use only exact reductions (max, min) and exact operations, so
/// that the other loop passes change no bit either (split reductions reassociate sums, and
/// the vector loops compute `exp` with the runtime's vector function instead of libm's).
#[test]
fn fusion_keeps_every_bit() {
    let (n, m) = (23, 129);
    let xv = values(n * m, 5);
    let run = |loop_opts: bool| {
        let b = Bindings::empty();
        let x = input("x", &[n, m], Prec::Single, &xv);
        let mx = temp("m", &[n], Prec::Single);
        let e = temp("e", &[n, m], Prec::Single);
        let m2 = temp("m2", &[n], Prec::Single);
        let y = output("y", &[n, m], Prec::Single);
        let code = Assignments::seq([
            unop(&mx, Binop::Max, true, Unop::Identity, &x, "ij->i", &b),
            binop(&e, Binop::Arg2, false, Binop::Sub, &x, &mx, "ij,i->ij", &b),
            unop(&m2, Binop::Min, true, Unop::Identity, &e, "ij->i", &b),
            binop(&y, Binop::Arg2, false, Binop::Div, &e, &m2, "ij,i->ij", &b),
        ]);
        let settings = Settings::default().loop_opts(loop_opts);
        let o = optimize("sm", lower(&code).unwrap(), &settings).unwrap();
        let cfg = arrayjit::compile::CompilerConfig::from_env().unwrap();
        let backend = arrayjit::backend::CcBackend::with_config(cfg, settings);
        let (r, _) = build(&backend, "sm", &b, &code).unwrap();
        (
            top_loops(&o.code),
            run_and_read(&backend, &r, &[&y]).remove(0),
        )
    };
    let (loops_off, off) = run(false);
    let (loops_on, on) = run(true);
    assert!(loops_off >= 3 && loops_on == 1, "{loops_off} {loops_on}");
    assert_eq!(off, on);
}

/// The C of a fused program is the same on every run: the slice-sized locals are made in node
/// order, not in the order of a hash map (layer norm has several of them).
#[test]
fn fused_c_is_deterministic() {
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/benches/programs/layernorm_4096x1024.json"
    );
    let emit = || {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_arrayjit"))
            .args(["emit-c", file])
            .output()
            .expect("the arrayjit binary runs");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        o.stdout
    };
    let first = emit();
    for _ in 0..4 {
        assert!(emit() == first, "emit-c printed different C");
    }
}
