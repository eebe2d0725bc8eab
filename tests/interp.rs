//! The reference interpreter on small programs whose results are computed by hand.

mod common;
use arrayjit::interp::{self, Memory};
use arrayjit::ir::*;
use arrayjit::loops::{Llc, Llv};
use arrayjit::Error;
use common::*;

/// Interprets `asgns` once on the hosted nodes' values and returns the values of `outs`.
fn interpret(
    asgns: &Assignments,
    statics: &[(StaticSymbol, i64)],
    outs: &[&Tnode],
) -> Vec<Vec<f64>> {
    let mut mem = Memory::new();
    mem.load_from_hosts(&asgns.nodes());
    interp::run_assignments(asgns, statics, &mut mem).unwrap();
    outs.iter().map(|t| mem.get(t).unwrap().to_vec()).collect()
}

#[test]
fn matmul() {
    let b = Bindings::empty();
    let x = input("x", &[2, 3], Prec::Single, &[1., 2., 3., 4., 5., 6.]);
    let w = input("w", &[3, 2], Prec::Half, &[0.5, -1., 2., 0.25, -3., 1.]);
    let y = output("y", &[2, 2], Prec::Double);
    let t = temp("t", &[2, 2], Prec::Single);
    let a = Assignments::seq([
        binop(&t, Binop::Add, true, Binop::Mul, &x, &w, "ij,jk->ik", &b),
        unop(&y, Binop::Arg2, false, Unop::Identity, &t, "ik->ik", &b),
    ]);
    let modes: Vec<_> = a.nodes().iter().map(Tnode::declared_memory_mode).collect();
    // [1 2 3; 4 5 6] @ [0.5 -1; 2 0.25; -3 1]
    assert_eq!(
        interpret(&a, &[], &[&y])[0],
        vec![
            0.5 + 4. - 9.,
            -1. + 0.5 + 3.,
            2. + 10. - 18.,
            -4. + 1.25 + 6.
        ]
    );
    // The interpreter does not decide memory modes.
    let after: Vec<_> = a.nodes().iter().map(Tnode::declared_memory_mode).collect();
    assert_eq!(modes, after);
    assert_eq!(t.declared_memory_mode(), None);
}

#[test]
fn reduction_with_each_accumulator() {
    let b = Bindings::empty();
    let x = input("x", &[2, 3], Prec::Single, &[1., -2., 3., 4., 0.5, -1.]);
    let cases: [(Binop, bool, [f64; 2]); 8] = [
        (Binop::Add, true, [2., 3.5]),
        // Sub from the neutral 0: minus the sum.
        (Binop::Sub, true, [-2., -3.5]),
        (Binop::Mul, true, [-6., -2.]),
        (Binop::Max, true, [3., 4.]),
        (Binop::Min, true, [-2., -1.]),
        // Overwriting: the last value of each row.
        (Binop::Arg2, true, [3., -1.]),
        // Without initialization, onto the previous values [10, 20].
        (Binop::Add, false, [12., 23.5]),
        (Binop::Max, false, [10., 20.]),
    ];
    for (accum, init, want) in cases {
        let r = input("r", &[2], Prec::Single, &[10., 20.]);
        let a = unop(&r, accum, init, Unop::Identity, &x, "ij->i", &b);
        assert_eq!(
            interpret(&a, &[], &[&r])[0],
            want,
            "accumulator {accum}, init {init}"
        );
    }
    // A reduction into an axis of extent 1 (column sums) and into a scalar.
    let cols = output("cols", &[1, 3], Prec::Double);
    let total = output("total", &[1], Prec::Double);
    let a = Assignments::seq([
        unop(&cols, Binop::Add, true, Unop::Identity, &x, "ij->0j", &b),
        unop(&total, Binop::Add, true, Unop::Identity, &x, "ij->0", &b),
    ]);
    let got = interpret(&a, &[], &[&cols, &total]);
    assert_eq!(got[0], vec![5., -1.5, 2.]);
    assert_eq!(got[1], vec![5.5]);
}

#[test]
fn broadcast() {
    let b = Bindings::empty();
    let a = input("a", &[2, 1], Prec::Single, &[1., 2.]);
    let c = input("c", &[1, 3], Prec::Single, &[10., 20., 30.]);
    let y = output("y", &[2, 3], Prec::Single);
    let asg = binop(&y, Binop::Arg2, false, Binop::Add, &a, &c, "ij,ij->ij", &b);
    assert_eq!(
        interpret(&asg, &[], &[&y])[0],
        vec![11., 21., 31., 12., 22., 32.]
    );
    // A letter only in the result broadcasts the argument along it.
    let z = output("z", &[3, 2], Prec::Single);
    let v = input("v", &[2], Prec::Single, &[-1., 1.]);
    let asg = unop(&z, Binop::Arg2, false, Unop::Neg, &v, "j->ij", &b);
    assert_eq!(
        interpret(&asg, &[], &[&z])[0],
        vec![1., -1., 1., -1., 1., -1.]
    );
}

#[test]
fn slice_fetch_and_static_indices() {
    let row = StaticSymbol::new("row", Some(3));
    let batch = input("batch", &[3, 2], Prec::Single, &[1., 2., 3., 4., 5., 6.]);
    let sl = output("sl", &[2], Prec::Double);
    let asg = Assignments::Fetch {
        array: sl.clone(),
        fetch_op: FetchOp::Slice {
            batch_idx: row.clone(),
            sliced: batch.clone(),
        },
    };
    let mut mem = Memory::new();
    mem.load_from_hosts(&asg.nodes());
    for i in 0..3 {
        interp::run_assignments(&asg, &[(row.clone(), i)], &mut mem).unwrap();
        let i = i as f64;
        assert_eq!(mem.get(&sl).unwrap(), &[2. * i + 1., 2. * i + 2.]);
    }
    // Outside the declared range: an error before anything runs; memory untouched.
    let before = mem.get(&sl).unwrap().to_vec();
    for bad in [3, -1] {
        let err = interp::run_assignments(&asg, &[(row.clone(), bad)], &mut mem).unwrap_err();
        assert!(
            matches!(&err, Error::BindingOutOfRange { index, value, limit: 3, .. } if index == "row" && *value == bad),
            "{err}"
        );
    }
    assert_eq!(mem.get(&sl).unwrap(), before.as_slice());

    // A static index without a range, beyond an axis's extent: an error naming the tensor.
    let s = StaticSymbol::new("s", None);
    let b = Bindings(vec![s.clone()]);
    let x = input("xs", &[3, 2], Prec::Single, &[1., 2., 3., 4., 5., 6.]);
    let y = output("ys", &[3], Prec::Single);
    let asg = unop(&y, Binop::Add, false, Unop::Identity, &x, "{s}j->{s}", &b);
    assert_eq!(
        interpret(&asg, &[(s.clone(), 1)], &[&y])[0],
        vec![0., 7., 0.]
    );
    let mut mem = Memory::new();
    let err = interp::run_assignments(&asg, &[(s.clone(), 3)], &mut mem).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Interpreter { .. }), "{msg}");
    assert!(msg.contains("ys") || msg.contains("xs"), "{msg}");
    assert!(msg.contains("s = 3") && msg.contains("extent"), "{msg}");
    assert!(mem.nodes().is_empty(), "nothing ran: {mem:?}");
    // A static index that is not given at all.
    let err = interp::run_assignments(&asg, &[], &mut mem).unwrap_err();
    assert!(err.to_string().contains("static"), "{err}");
}

#[test]
fn embed_index() {
    let s = StaticSymbol::new("s", Some(8));
    let e = output("e", &[2], Prec::Byte);
    let h = output("h", &[1, 2], Prec::Half);
    let asg = Assignments::seq([
        Assignments::Fetch {
            array: e.clone(),
            fetch_op: FetchOp::EmbedSymbol(s.clone()),
        },
        Assignments::Fetch {
            array: h.clone(),
            fetch_op: FetchOp::EmbedSymbol(s.clone()),
        },
    ]);
    let got = interpret(&asg, &[(s.clone(), 5)], &[&e, &h]);
    assert_eq!(got, vec![vec![5., 5.], vec![5., 5.]]);
}

#[test]
fn byte_arithmetic_is_modular() {
    let b = Bindings::empty();
    let x = input(
        "x",
        &[6],
        Prec::Single,
        &[-3.7, 0.9, 2.99, 254.5, 1000., 0.],
    );
    let out = output("out", &[6], Prec::Byte);
    // out = x / x * x: NaN for the 0 cell (NaN stores as 0).
    let q = temp("q", &[6], Prec::Single);
    let asg = Assignments::seq([
        binop(&q, Binop::Arg2, false, Binop::Div, &x, &x, "i,i->i", &b),
        binop(&out, Binop::Arg2, false, Binop::Mul, &q, &x, "i,i->i", &b),
    ]);
    // Truncated toward zero, then wrapped modulo 256: -3.7 -> -3 -> 253, 1000 -> 232.
    assert_eq!(
        interpret(&asg, &[], &[&out])[0],
        vec![253., 0., 2., 254., 232., 0.]
    );
    // A byte intermediate wraps before the next operation reads it: 200 + 100 = 44.
    let p = input("p", &[2], Prec::Byte, &[200., 7.]);
    let r = input("r", &[2], Prec::Byte, &[100., 3.]);
    let hundred = temp("hundred", &[1], Prec::Double);
    let t = temp("t", &[2], Prec::Byte);
    let y = output("y", &[2], Prec::Double);
    let asg = Assignments::seq([
        binop(&t, Binop::Arg2, false, Binop::Add, &p, &r, "i,i->i", &b),
        Assignments::Fetch {
            array: hundred.clone(),
            fetch_op: FetchOp::Constant(100.),
        },
        binop(
            &y,
            Binop::Arg2,
            false,
            Binop::Sub,
            &t,
            &hundred,
            "i,0->i",
            &b,
        ),
    ]);
    assert_eq!(interpret(&asg, &[], &[&y])[0], vec![-56., -90.]);
    // Memory::set rounds like a store.
    let mut mem = Memory::new();
    mem.set(&t, vec![-1., 300.7]).unwrap();
    assert_eq!(mem.get(&t).unwrap(), &[255., 44.]);
    assert!(mem.set(&t, vec![1.]).is_err());
}

#[test]
fn half_rounding() {
    let b = Bindings::empty();
    let x = input("x", &[3], Prec::Double, &[0.1, 1. / 3., 2049.]);
    let t = output("t", &[3], Prec::Half);
    let asg = unop(&t, Binop::Arg2, false, Unop::Identity, &x, "i->i", &b);
    assert_eq!(
        interpret(&asg, &[], &[&t])[0],
        vec![0.0999755859375, 0.333251953125, 2048.]
    );
    // Every accumulation step is rounded to half: 1 + 0.0001 rounds back to 1.
    let acc = input("acc", &[1], Prec::Half, &[1.]);
    let d = input("d", &[4], Prec::Double, &[0.0001; 4]);
    let asg = unop(&acc, Binop::Add, false, Unop::Identity, &d, "i->0", &b);
    assert_eq!(interpret(&asg, &[], &[&acc])[0], vec![1.]);
    // The same in double accumulates.
    let acc2 = input("acc2", &[1], Prec::Double, &[1.]);
    let asg = unop(&acc2, Binop::Add, false, Unop::Identity, &d, "i->0", &b);
    assert_eq!(interpret(&asg, &[], &[&acc2])[0], vec![1. + 0.0001 * 4.]);
}

/// In the float compute type every operation rounds to float, as the generated C computes
/// (SPEC 9.1: the accumulation is done in the compute type): y = 2^-24, then y += 1 + 2^-24.
/// In float, 1 + 2^-24 ties to 1 and 2^-24 + 1 ties to 1 again: y = 1. Computed in double and
/// rounded once, it would be 1 + 2^-23. Found by scripts/conformance.py (the interpreter
/// rounded only the statement's final value).
#[test]
fn float_compute_rounds_every_operation() {
    let b = Bindings::empty();
    let eps = 2f64.powi(-24);
    let y = input("y", &[1], Prec::Single, &[eps]);
    let a = input("a", &[1], Prec::Single, &[1.]);
    let c = input("c", &[1], Prec::Single, &[eps]);
    let asg = binop(&y, Binop::Add, false, Binop::Add, &a, &c, "i,i->i", &b);
    assert_eq!(interpret(&asg, &[], &[&y])[0], vec![1.]);
    // The same statement compiled.
    let y2 = input("y2", &[1], Prec::Single, &[eps]);
    let asg = binop(&y2, Binop::Add, false, Binop::Add, &a, &c, "i,i->i", &b);
    compute(&asg, &b, &[&y2]);
    assert_eq!(y2.host_to_vec::<f32>().unwrap(), vec![1.0f32]);
    // A unary operation, too: y3 = 1 + 2^-24 * 1 (identity) rounds, then + 2^-24 rounds.
    let y3 = input("y3", &[1], Prec::Single, &[1.]);
    let e2 = input("e2", &[2], Prec::Single, &[eps, eps]);
    let asg = unop(&y3, Binop::Add, false, Unop::Identity, &e2, "i->0", &b);
    assert_eq!(interpret(&asg, &[], &[&y3])[0], vec![1.]);
}

#[test]
fn constants_and_operands_in_the_compute_type() {
    let b = Bindings::empty();
    let fetch = |t: &Tnode, c: f64| Assignments::Fetch {
        array: t.clone(),
        fetch_op: FetchOp::Constant(c),
    };
    let s = output("s", &[1], Prec::Single);
    let d = output("d", &[1], Prec::Double);
    let h = output("h", &[1], Prec::Half);
    let asg = Assignments::seq([fetch(&s, 0.1), fetch(&d, 0.1), fetch(&h, 0.1)]);
    let got = interpret(&asg, &[], &[&s, &d, &h]);
    assert_eq!(
        got,
        vec![vec![0.1f32 as f64], vec![0.1], vec![0.0999755859375]]
    );
    // A double operand read while writing a single node is converted to float first (as the
    // generated C does): (float)(1 + 2^-40) - 1 = 0, not 2^-40.
    let x = input("x", &[1], Prec::Double, &[1. + 2f64.powi(-40)]);
    let one = input("one", &[1], Prec::Double, &[1.]);
    let ys = output("ys", &[1], Prec::Single);
    let yd = output("yd", &[1], Prec::Double);
    let asg = Assignments::seq([
        binop(&ys, Binop::Arg2, false, Binop::Sub, &x, &one, "i,i->i", &b),
        binop(&yd, Binop::Arg2, false, Binop::Sub, &x, &one, "i,i->i", &b),
    ]);
    let got = interpret(&asg, &[], &[&ys, &yd]);
    assert_eq!(got, vec![vec![0.], vec![2f64.powi(-40)]]);
    // Non-finite constants.
    let inf = output("inf", &[2], Prec::Half);
    let nan = output("nan", &[1], Prec::Single);
    let asg = Assignments::seq([fetch(&inf, f64::NEG_INFINITY), fetch(&nan, f64::NAN)]);
    let got = interpret(&asg, &[], &[&inf, &nan]);
    assert_eq!(got[0], vec![f64::NEG_INFINITY; 2]);
    assert!(got[1][0].is_nan());
}

#[test]
fn merge_buffer_and_imported_functions() {
    let g = input("g", &[3], Prec::Single, &[1., 2., 3.]);
    let sum = output("sum", &[3], Prec::Single);
    let merge = Assignments::AccumBinop {
        initialize_neutral: false,
        accum: Binop::Arg2,
        op: Binop::Add,
        lhs: sum.clone(),
        rhs1: Buffer::Node(g.clone()),
        rhs2: Buffer::MergeBuffer(g.clone()),
        projections: Projections::pointwise(&[3], 2),
    };
    let mut mem = Memory::new();
    mem.load_from_hosts([&g]);
    let err = interp::run_assignments(&merge, &[], &mut mem).unwrap_err();
    assert!(matches!(err, Error::MergeBufferMismatch { .. }), "{err}");
    mem.set_merge(&sum, vec![0.; 3]).unwrap();
    let err = interp::run_assignments(&merge, &[], &mut mem).unwrap_err();
    assert!(err.to_string().contains("sum"), "{err}");
    mem.set_merge(&g, vec![10., 20., 30.]).unwrap();
    interp::run_assignments(&merge, &[], &mut mem).unwrap();
    assert_eq!(mem.get(&sum).unwrap(), &[11., 22., 33.]);
    assert_eq!(mem.merge().unwrap().0, &g);

    let r = output("r", &[2], Prec::Double);
    let imp = Assignments::Fetch {
        array: r.clone(),
        fetch_op: FetchOp::Imported("seven".into()),
    };
    let err = interp::run_assignments(&imp, &[], &mut mem).unwrap_err();
    assert!(err.to_string().contains("seven"), "{err}");
    mem.set_function("seven", || 7.0);
    interp::run_assignments(&imp, &[], &mut mem).unwrap();
    assert_eq!(mem.get(&r).unwrap(), &[7., 7.]);
}

#[test]
fn optimized_code_and_hosts() {
    let b = Bindings::empty();
    let x = input("x", &[4], Prec::Single, &[-1., 2., -3., 4.]);
    let w = input("w", &[3], Prec::Single, &[1., 10., 100.]);
    let h = temp("h", &[4], Prec::Single);
    let t = temp("t", &[4], Prec::Single);
    let y = output("y", &[4, 3], Prec::Single);
    // t = -x (inlined), h = relu(t) (read 3 times per cell: a Local array), y = h * w
    let asg = Assignments::seq([
        unop(&t, Binop::Arg2, false, Unop::Neg, &x, "i->i", &b),
        unop(&h, Binop::Arg2, false, Unop::Relu, &t, "i->i", &b),
        binop(&y, Binop::Arg2, false, Binop::Mul, &h, &w, "i,j->ij", &b),
    ]);
    let want: Vec<f64> = [1., 0., 3., 0.]
        .iter()
        .flat_map(|&v| [v, 10. * v, 100. * v])
        .collect();
    assert_eq!(interpret(&asg, &[], &[&y])[0], want);
    let code = arrayjit::lower::lower(&asg).unwrap();
    let o = arrayjit::optimize::optimize("opt", code, &Default::default()).unwrap();
    assert_eq!(o.memory_mode(&h), Some(MemoryMode::Local));
    assert_eq!(o.memory_mode(&t), Some(MemoryMode::Virtual));
    let mut mem = Memory::new();
    mem.load_from_hosts(&asg.nodes());
    // A Local node starts zeroed on every run, whatever the memory held.
    mem.set(&h, vec![9.; 4]).unwrap();
    for _ in 0..2 {
        interp::run_optimized(&o, &[], &mut mem).unwrap();
        assert_eq!(mem.get(&y).unwrap(), want.as_slice());
    }
    assert!(
        mem.get(&t).is_none(),
        "the inlined node is never materialized"
    );
    assert_eq!(mem.store_to_hosts(&asg.nodes()).unwrap(), 3);
    assert_eq!(y.host_values().unwrap(), want);
}

#[test]
fn malformed_code_is_an_error_not_a_panic() {
    let x = temp("x", &[2], Prec::Single);
    let bad_fixed = Llc::Set {
        tn: x.clone(),
        idcs: vec![AxisIndex::Fixed(2)],
        value: Llv::Constant(1.),
    };
    let wrong_rank = Llc::Set {
        tn: x.clone(),
        idcs: vec![AxisIndex::Fixed(0), AxisIndex::Fixed(0)],
        value: Llv::Constant(1.),
    };
    let i = Symbol::fresh();
    let loop_too_far = Llc::For {
        index: i,
        from: 0,
        to: 2,
        body: Box::new(Llc::Set {
            tn: x.clone(),
            idcs: vec![AxisIndex::Iterator(i)],
            value: Llv::Get(x.clone(), vec![AxisIndex::Iterator(i)]),
        }),
        trace_it: true,
    };
    let unbound = Llc::Set {
        tn: x.clone(),
        idcs: vec![AxisIndex::Fixed(0)],
        value: Llv::EmbedIndex(AxisIndex::Iterator(Symbol::fresh())),
    };
    for code in [bad_fixed, wrong_rank, loop_too_far, unbound] {
        let mut mem = Memory::new();
        let err = interp::run(&code, &[], &mut mem).unwrap_err();
        assert!(matches!(err, Error::Interpreter { .. }), "{err}");
        assert!(mem.get(&x).is_none(), "checked before running");
    }
}
