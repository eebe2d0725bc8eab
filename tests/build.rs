//! The statement builder (`arrayjit::ir::build`): statements written like the math, checked
//! against plain Rust loops in the test, and the errors of specs that do not fit.

mod common;

use arrayjit::ir::build::{exp, merge, relu, select};
use arrayjit::ir::*;
use arrayjit::Error;
use common::*;

fn values(n: usize, f: impl Fn(usize) -> f64) -> Vec<f64> {
    (0..n).map(f).collect()
}

/// A dense layer and a softmax over rows, each statement one line: `h = x @ w`,
/// `z = relu(h + b)`, `m = rowmax(z)`, `e = exp(z - m)`, `s = rowsum(e)`, `p = e / s`.
#[test]
fn softmax_of_a_dense_layer() {
    let (n, k, c) = (5, 3, 4);
    let xv = values(n * k, |i| (i as f64 * 0.37).sin());
    let wv = values(k * c, |i| (i as f64 * 0.91).cos());
    let bv = values(c, |i| 0.1 * i as f64 - 0.15);
    let x = input("x", &[n, k], Prec::Double, &xv);
    let w = input("w", &[k, c], Prec::Double, &wv);
    let b = input("b", &[c], Prec::Double, &bv);
    let h = Tnode::new(&["h"], &[n, c], Prec::Double).unwrap();
    let z = output("z", &[n, c], Prec::Double);
    let m = Tnode::new(&["m"], &[n], Prec::Double).unwrap();
    let e = Tnode::new(&["e"], &[n, c], Prec::Double).unwrap();
    let s = Tnode::new(&["s"], &[n], Prec::Double).unwrap();
    let p = output("p", &[n, c], Prec::Double);
    let code = Assignments::seq([
        h.assign((&x * &w).sum("ij,jk->ik")).unwrap(),
        z.assign(relu((&h + &b).spec("ik,k->ik"))).unwrap(),
        m.assign(z.max_over("ik->i")).unwrap(),
        e.assign(exp(&z - m.spec("i->ik"))).unwrap(),
        s.assign(e.sum("ik->i")).unwrap(),
        p.assign((&e / &s).spec("ik,i->ik")).unwrap(),
    ]);
    let (got, _) = compute(&code, &Bindings::empty(), &[&z, &p]);
    // The same by plain loops.
    let mut zw = vec![0.0; n * c];
    let mut pw = vec![0.0; n * c];
    for i in 0..n {
        for kk in 0..c {
            let mut acc = 0.0;
            for j in 0..k {
                acc += xv[i * k + j] * wv[j * c + kk];
            }
            zw[i * c + kk] = (acc + bv[kk]).max(0.0);
        }
        let row = &zw[i * c..(i + 1) * c];
        let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let ex: Vec<f64> = row.iter().map(|v| (v - mx).exp()).collect();
        let sum: f64 = ex.iter().sum();
        for kk in 0..c {
            pw[i * c + kk] = ex[kk] / sum;
        }
    }
    assert_close(Prec::Double, &got[0], &zw, "z");
    assert_close(Prec::Double, &got[1], &pw, "p");
}

/// `accumulate` adds onto the old values (no neutral fill); a pointwise expression
/// broadcasts extent-1 axes; nested expressions become intermediates of the right dims;
/// every operation is reachable through its enum; unary minus and `select`.
#[test]
fn accumulate_broadcast_nesting_and_every_operation() {
    let a = input("a", &[2, 3], Prec::Single, &[1., -2., 3., -4., 5., -6.]);
    let r = input("r", &[1, 3], Prec::Single, &[10., 20., 30.]);
    let y = output("y", &[2, 3], Prec::Single);
    let t = output("t", &[2], Prec::Single);
    let q = output("q", &[2, 3], Prec::Single);
    let code = Assignments::seq([
        // y = a + r (r broadcast over the rows), then y += -a twice: y = r - a.
        y.assign(&a + &r).unwrap(),
        y.accumulate(Binop::Add, -&a).unwrap(),
        y.accumulate(Binop::Add, Unop::Neg.of(&a)).unwrap(),
        // t = twice the row sums of a * a (a nested product).
        t.assign((&a * &a).sum("ij,ij->i")).unwrap(),
        t.accumulate(Binop::Add, (&a * &a).sum("ij,ij->i")).unwrap(),
        // q = a < 0 ? a * 10 : max(a, 2)
        q.assign(select(
            Binop::Lt.of(&a, input("zero", &[1, 1], Prec::Single, &[0.])),
            &a * &r,
            Binop::Max.of(&a, &a),
        ))
        .unwrap(),
    ]);
    let (got, _) = compute(&code, &Bindings::empty(), &[&y, &t, &q]);
    assert_eq!(got[0], [9., 22., 27., 14., 15., 36.]); // r - a
    assert_eq!(got[1], [2. * 14., 2. * 77.]);
    assert_eq!(got[2], [1., -40., 3., -40., 5., -180.]);
}

/// Reads of the merge buffer and static indices in specs.
#[test]
fn merge_buffer_and_static_indices() {
    let batch = input("batch", &[3, 2], Prec::Single, &[1., 2., 3., 4., 5., 6.]);
    let row = StaticSymbol::new("row", Some(3));
    let bind = Bindings(vec![row.clone()]);
    let x = output("x", &[2], Prec::Single);
    let code = x
        .assign(Expr::from(&batch).spec("{row}i->i").bind(&bind))
        .unwrap();
    let backend = arrayjit::backend::CcBackend::new();
    let (r, _) = build(&backend, "pick", &bind, &code).unwrap();
    r.bindings().set("row", 2).unwrap();
    assert_eq!(run_and_read(&backend, &r, &[&x])[0], [5., 6.]);
    // A merge routine: g += merge(g).
    let g = output("g", &[2], Prec::Single);
    let code = g
        .accumulate(Binop::Add, Unop::Identity.of(merge(&g)))
        .unwrap();
    match &code {
        Assignments::AccumUnop { rhs, .. } => {
            assert!(matches!(rhs, Buffer::MergeBuffer(t) if *t == g))
        }
        other => panic!("{other:?}"),
    }
}

use arrayjit::ir::build::Expr;

/// Specs that do not fit are errors naming the spec, never panics; an intermediate whose
/// dims the spec does not determine, and a reduction accumulated by another operation, too.
#[test]
fn specs_that_do_not_fit_are_errors() {
    let a = input("a", &[2, 3], Prec::Single, &[0.; 6]);
    let b = input("b", &[3, 2], Prec::Single, &[0.; 6]);
    let y = output("y", &[2, 3], Prec::Single);
    let e = y.assign(&a + &b).unwrap_err();
    assert!(matches!(e, Error::Spec { .. }), "{e}");
    let e = y.assign((&a * &b).sum("ij,jk->ik")).unwrap_err();
    assert!(e.to_string().contains("ij,jk->ik"), "{e}");
    // The intermediate `a.spec("ij->0j")` has a fixed result entry: its dims are unknown.
    let e = y.assign(exp(a.spec("ij->0j"))).unwrap_err();
    assert!(e.to_string().contains("not a plain letter"), "{e}");
    // A max reduction accumulated by add.
    let s = output("s", &[2], Prec::Single);
    let e = s.accumulate(Binop::Add, a.max_over("ij->i")).unwrap_err();
    assert!(matches!(e, Error::Assignment(_)), "{e}");
}
