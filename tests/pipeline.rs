//! End-to-end tests of the pipeline: fusion, materialization, hostile names, constants,
//! recurrent state, batches, contexts and the merge buffer.

mod common;
use arrayjit::backend::{CcBackend, Config, MergeBuffer};
use arrayjit::ir::*;
use common::*;

/// out = max(0, a*b + c) * 2 - d through four intermediates.
fn fused_chain(labels: [&str; 4], comment: &str) -> (Assignments, Vec<Tnode>, Tnode) {
    let b = Bindings::empty();
    let n = 16;
    let a = input(
        "a",
        &[n],
        Prec::Single,
        &(0..n).map(|i| i as f64 - 5.0).collect::<Vec<_>>(),
    );
    let bb = input(
        "b",
        &[n],
        Prec::Single,
        &(0..n).map(|i| 0.5 * i as f64).collect::<Vec<_>>(),
    );
    let c = input(
        "c",
        &[n],
        Prec::Single,
        &(0..n).map(|i| 3.0 - i as f64).collect::<Vec<_>>(),
    );
    let d = input(
        "d",
        &[n],
        Prec::Single,
        &(0..n).map(|i| (i % 3) as f64).collect::<Vec<_>>(),
    );
    let t1 = temp(labels[0], &[n], Prec::Single);
    let t2 = temp(labels[1], &[n], Prec::Single);
    let t3 = temp(labels[2], &[n], Prec::Single);
    let two = temp("two", &[1], Prec::Single);
    let t4 = temp(labels[3], &[n], Prec::Single);
    let out = output("out", &[n], Prec::Single);
    let asgns = Assignments::block(
        comment,
        Assignments::seq([
            binop(&t1, Binop::Arg2, false, Binop::Mul, &a, &bb, "i,i->i", &b),
            binop(&t2, Binop::Arg2, false, Binop::Add, &t1, &c, "i,i->i", &b),
            unop(&t3, Binop::Arg2, false, Unop::Relu, &t2, "i->i", &b),
            Assignments::Fetch {
                array: two.clone(),
                fetch_op: FetchOp::Constant(2.0),
            },
            binop(&t4, Binop::Arg2, false, Binop::Mul, &t3, &two, "i,0->i", &b),
            binop(&out, Binop::Arg2, false, Binop::Sub, &t4, &d, "i,i->i", &b),
        ]),
    );
    (asgns, vec![t1, t2, t3, t4, two], out)
}

fn fused_chain_expected() -> Vec<f64> {
    (0..16)
        .map(|i| {
            let (a, b, c, d) = (
                i as f64 - 5.0,
                0.5 * i as f64,
                3.0 - i as f64,
                (i % 3) as f64,
            );
            (a * b + c).max(0.0) * 2.0 - d
        })
        .collect()
}

#[test]
fn pointwise_chain_fuses_into_one_loop_without_intermediates() {
    let (asgns, temps, out) = fused_chain(["t1", "t2", "t3", "t4"], "fused chain");
    let (got, src, modes) = compute_with_modes(&asgns, &Bindings::empty(), &[&out]);
    assert_eq!(got[0], fused_chain_expected());
    assert_eq!(src.matches("for (").count(), 1, "one loop expected:\n{src}");
    for t in &temps {
        assert_eq!(
            modes.get(t),
            Some(MemoryMode::Virtual),
            "{} should be virtual",
            t.name()
        );
        let ident = format!("{}_", t.name());
        assert!(
            !src.contains(&ident),
            "intermediate {} appears in the C:\n{src}",
            t.name()
        );
    }
    assert!(!src.contains("memset"), "{src}");
}

#[test]
fn intermediate_read_many_times_is_materialized() {
    let b = Bindings::empty();
    let x = input("x", &[4], Prec::Single, &[-1., 2., -3., 4.]);
    let w = input("w", &[3], Prec::Single, &[1., 10., 100.]);
    let h = temp("h", &[4], Prec::Single);
    let y = output("y", &[4, 3], Prec::Single);
    let asgns = Assignments::seq([
        unop(&h, Binop::Arg2, false, Unop::Relu, &x, "i->i", &b),
        binop(&y, Binop::Arg2, false, Binop::Mul, &h, &w, "i,j->ij", &b),
    ]);
    let (got, src, modes) = compute_with_modes(&asgns, &b, &[&y]);
    let want: Vec<f64> = [-1.0f64, 2., -3., 4.]
        .iter()
        .flat_map(|&x| [1.0, 10.0, 100.0].map(|w| x.max(0.0) * w))
        .collect();
    assert_eq!(got[0], want);
    assert_eq!(modes.get(&h), Some(MemoryMode::Local));
    assert!(src.contains("float h_"), "h must be a local array:\n{src}");
}

/// `g[i,j] = sum over b of h[b,i] * d[b,j]` over `rows` samples, read once by `y = 2 g`:
/// the values (worked out in f64) and the memory mode decided for `g`.
fn reduction_read_once(rows: usize) -> Option<MemoryMode> {
    let b = Bindings::empty();
    let hv: Vec<f64> = (0..rows * 4).map(|k| (k % 7) as f64 - 3.0).collect();
    let dv: Vec<f64> = (0..rows * 4).map(|k| (k % 5) as f64 * 0.5).collect();
    let h = input("h", &[rows, 4], Prec::Single, &hv);
    let d = input("d", &[rows, 4], Prec::Single, &dv);
    let g = temp("g", &[4, 4], Prec::Single);
    let y = output("y", &[4, 4], Prec::Single);
    let two = input("two", &[1], Prec::Single, &[2.0]);
    let asgns = Assignments::seq([
        binop(&g, Binop::Add, true, Binop::Mul, &h, &d, "bi,bj->ij", &b),
        binop(&y, Binop::Arg2, false, Binop::Mul, &g, &two, "ij,k->ij", &b),
    ]);
    let (got, _, modes) = compute_with_modes(&asgns, &b, &[&y]);
    let want: Vec<f64> = (0..16)
        .map(|c| {
            let (i, j) = (c / 4, c % 4);
            2.0 * (0..rows)
                .map(|r| hv[r * 4 + i] * dv[r * 4 + j])
                .sum::<f64>()
        })
        .collect();
    assert_eq!(got[0], want, "{rows} rows");
    modes.get(&g)
}

#[test]
fn a_long_reduction_read_once_is_materialized_and_a_short_one_inlined() {
    // Inlined, the sum over 60 rows would run innermost in y's loop, one scalar chain per
    // cell (the moons job on two devices, whose weight gradients sum over 60 samples, ran at
    // half its speed so).
    assert_eq!(reduction_read_once(60), Some(MemoryMode::Local));
    // A sum of 8 products is cheaper recomputed where it is read than stored and loaded.
    assert_eq!(reduction_read_once(8), Some(MemoryMode::Virtual));
}

#[test]
fn large_local_arrays_are_not_on_the_stack() {
    let b = Bindings::empty();
    let n = 100_000;
    let x = Tnode::with_init(&["x"], &[n], Prec::Single, &InitOp::RangeOverOffsets).unwrap();
    let w = input("w", &[2], Prec::Single, &[1., -1.]);
    let h = temp("h", &[n], Prec::Single);
    // `y` is written column by column (`ji`), so the loop writing `h` (over `i`) and the
    // loop reading it (over `j`) cannot fuse into one loop with a one-row `h`.
    let y = output("y", &[2, n], Prec::Single);
    let asgns = Assignments::seq([
        unop(&h, Binop::Arg2, false, Unop::Sqrt, &x, "i->i", &b),
        binop(&y, Binop::Arg2, false, Binop::Mul, &h, &w, "i,j->ji", &b),
    ]);
    let (got, src) = compute(&asgns, &b, &[&y]);
    // h (400 KB) is routine-owned scratch memory, zeroed at each call, not a stack array.
    assert!(src.contains("float *restrict h_"), "{src}");
    assert!(!src.contains("float h_"), "{src}");
    for i in [0usize, 1, 99_999] {
        let s = (i as f32).sqrt() as f64;
        assert_eq!(got[0][i], s);
        assert_eq!(got[0][n + i], -s);
    }
}

#[test]
fn hostile_names_and_comments_are_sanitized() {
    let hostile = [
        "x */ system(\"rm -rf /\"); /*",
        "#define float int\nq",
        "back\\\nslash ??/ y0",
        "exp\0nul \"quoted\" 9lives",
    ];
    let comment = "*/ #include <stdio.h> ??/\n int main() { return 1; } /* \\";
    let (asgns_h, _, out_h) = fused_chain(hostile, comment);
    let (got_h, src) = compute(&asgns_h, &Bindings::empty(), &[&out_h]);
    if std::env::var("SHOW_C").is_ok() {
        println!("{src}");
    }
    assert_eq!(got_h[0], fused_chain_expected());
    // Also as materialized nodes (not inlined): read twice so they get arrays in the C.
    let b = Bindings::empty();
    let x = input(hostile[0], &[2], Prec::Single, &[1., 2.]);
    let t = temp(hostile[1], &[2], Prec::Single);
    let y = output(hostile[2], &[2, 2], Prec::Single);
    let asgns = Assignments::block(
        comment,
        Assignments::seq([
            unop(&t, Binop::Arg2, false, Unop::Neg, &x, "i->i", &b),
            binop(&y, Binop::Arg2, false, Binop::Add, &t, &t, "i,j->ij", &b),
        ]),
    );
    let backend = CcBackend::new();
    let (r, src2) = build(&backend, "*/ evil\n#undef x", &b, &asgns).unwrap();
    let got = run_and_read(&backend, &r, &[&y]);
    assert_eq!(got[0], vec![-2., -3., -3., -4.]);
    for src in [&src, &src2] {
        for (i, line) in src.lines().enumerate() {
            if line != "#include \"arrayjit.h\"" && line != "#define AJ_VMATH 1" {
                assert!(!line.contains('#'), "line {i} has '#': {line}\n{src}");
                assert!(!line.contains('"'), "line {i} has a quote: {line}\n{src}");
                assert!(
                    !line.contains('\\'),
                    "line {i} has a backslash: {line}\n{src}"
                );
                assert!(
                    !line.contains("??"),
                    "line {i} has a trigraph: {line}\n{src}"
                );
            }
            assert_eq!(
                line.matches("/*").count(),
                line.matches("*/").count(),
                "line {i}: {line}"
            );
        }
        assert!(!src.contains('\0'));
        assert!(!src.contains("system("), "{src}");
    }
}

#[test]
fn identifiers_avoid_keywords_and_libm_names() {
    let b = Bindings::empty();
    let x = input("exp", &[2], Prec::Double, &[1., 2.]);
    let y = output("y0", &[2], Prec::Double);
    let z = output("int", &[2], Prec::Double);
    let w = output("3d", &[2], Prec::Double);
    let asgns = Assignments::seq([
        unop(&y, Binop::Arg2, false, Unop::Exp, &x, "i->i", &b),
        unop(&z, Binop::Arg2, false, Unop::Sin, &x, "i->i", &b),
        unop(&w, Binop::Arg2, false, Unop::Cos, &x, "i->i", &b),
    ]);
    let (got, src) = compute(&asgns, &b, &[&y, &z, &w]);
    assert_eq!(got[0], vec![1f64.exp(), 2f64.exp()]);
    assert_eq!(got[1], vec![1f64.sin(), 2f64.sin()]);
    assert_eq!(got[2], vec![1f64.cos(), 2f64.cos()]);
    assert!(
        !src.contains(" exp[") && !src.contains(" y0[") && !src.contains(" int["),
        "{src}"
    );
    assert!(src.contains("t3d_"), "{src}");
}

#[test]
fn float_constants_are_exact_including_non_finite() {
    let b = Bindings::empty();
    let x = input("x", &[3], Prec::Double, &[1., 3., 7.]);
    let tenth = temp("tenth", &[1], Prec::Double);
    let y = output("y", &[3], Prec::Double);
    let inf = output("inf", &[2], Prec::Single);
    let ninf = output("ninf", &[2], Prec::Half);
    let nan = output("nan", &[2], Prec::Double);
    let tiny = output("tiny", &[1], Prec::Double);
    let fetch = |t: &Tnode, c: f64| Assignments::Fetch {
        array: t.clone(),
        fetch_op: FetchOp::Constant(c),
    };
    let asgns = Assignments::seq([
        fetch(&tenth, 0.1),
        binop(&y, Binop::Arg2, false, Binop::Mul, &x, &tenth, "i,0->i", &b),
        fetch(&inf, f64::INFINITY),
        fetch(&ninf, f64::NEG_INFINITY),
        fetch(&nan, f64::NAN),
        fetch(&tiny, 5e-324),
    ]);
    let (got, _) = compute(&asgns, &b, &[&y, &inf, &ninf, &nan, &tiny]);
    assert_eq!(got[0], vec![0.1, 3.0 * 0.1, 7.0 * 0.1]);
    assert_eq!(got[1], vec![f64::INFINITY; 2]);
    assert_eq!(got[2], vec![f64::NEG_INFINITY; 2]);
    assert!(got[3].iter().all(|v| v.is_nan()));
    assert_eq!(got[4], vec![5e-324]);
}

#[test]
fn recurrent_state_persists_between_runs() {
    let b = Bindings::empty();
    let x = input("x", &[3], Prec::Single, &[1., 2., 3.]);
    let acc = input("acc", &[3], Prec::Single, &[10., 20., 30.]);
    // Not hosted: lives on the device across calls.
    let hidden = temp("hidden", &[3], Prec::Single);
    let seen = output("seen", &[3], Prec::Single);
    let asgns = Assignments::seq([
        binop(&acc, Binop::Arg2, false, Binop::Add, &acc, &x, "i,i->i", &b),
        unop(&hidden, Binop::Add, false, Unop::Identity, &x, "i->i", &b),
        unop(
            &seen,
            Binop::Arg2,
            false,
            Unop::Identity,
            &hidden,
            "i->i",
            &b,
        ),
    ]);
    let backend = CcBackend::new();
    let (r, _) = build(&backend, "accumulate", &b, &asgns).unwrap();
    for k in 1..=3 {
        let got = run_and_read(&backend, &r, &[&acc, &seen]);
        assert_eq!(
            got[0],
            vec![10. + k as f64, 20. + 2. * k as f64, 30. + 3. * k as f64]
        );
        assert_eq!(got[1], vec![k as f64, 2. * k as f64, 3. * k as f64]);
    }
    assert_eq!(backend.memory_mode(&hidden), Some(MemoryMode::OnDevice));
}

#[test]
fn memory_mode_conflicts_name_the_node() {
    let b = Bindings::empty();
    let x = input("x", &[2], Prec::Single, &[1., 2.]);
    let v = Tnode::builder(&["vee"], &[2], Prec::Single)
        .memory(MemoryMode::Virtual)
        .build()
        .unwrap();
    let y = output("y", &[2], Prec::Single);
    // v is read before it is written: it would have to persist, but it is declared virtual.
    let asgns = Assignments::seq([
        binop(&y, Binop::Arg2, false, Binop::Add, &x, &v, "i,i->i", &b),
        unop(&v, Binop::Arg2, false, Unop::Identity, &x, "i->i", &b),
    ]);
    let backend = CcBackend::new();
    backend.initialize(Config::default());
    let err = backend
        .compile(true, None, &b, &asgns)
        .unwrap_err()
        .to_string();
    assert!(err.contains("vee"), "{err}");
    // Abstract refinements that agree are fine; contradictions name both provenances.
    let n = temp("n", &[2], Prec::Single);
    let mut modes = MemoryModes::new();
    modes.refine(&n, MemoryMode::NeverVirtual, 7).unwrap();
    modes.refine(&n, MemoryMode::Materialized, 8).unwrap();
    modes.refine(&n, MemoryMode::DeviceOnly, 9).unwrap();
    assert_eq!(modes.get(&n), Some(MemoryMode::OnDevice));
    assert_eq!(
        n.declared_memory_mode(),
        None,
        "decisions never change the node"
    );
    let err = modes
        .refine(&n, MemoryMode::Virtual, 10)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains('n') && err.contains("10") && err.contains('9'),
        "{err}"
    );
}

#[test]
fn batches_postponed_code_contexts_and_merge_buffer() {
    let b = Bindings::empty();
    let backend = CcBackend::new();
    backend.initialize(Config::default());
    let x = input("x", &[3], Prec::Single, &[1., 2., 3.]);
    let g = output("g", &[3], Prec::Single);
    let sum = output("sum", &[3], Prec::Single);
    let make_g = binop(&g, Binop::Arg2, false, Binop::Mul, &x, &x, "i,i->i", &b);
    let merge = Assignments::AccumBinop {
        initialize_neutral: false,
        accum: Binop::Arg2,
        op: Binop::Add,
        lhs: sum.clone(),
        rhs1: Buffer::Node(g.clone()),
        rhs2: Buffer::MergeBuffer(g.clone()),
        projections: Projections::pointwise(&[3], 2),
    };
    let unused = unop(
        &output("unused", &[3], Prec::Single),
        Binop::Arg2,
        false,
        Unop::Neg,
        &x,
        "i->i",
        &b,
    );
    let names = vec![
        "make_g".to_string(),
        "merge".to_string(),
        "unused".to_string(),
    ];
    let occ = |name: &str, _i: usize| name != "unused";
    let batch = backend
        .compile_batch(
            true,
            Some(&names),
            Some(&occ),
            &b,
            &[make_g.clone(), merge, unused],
        )
        .unwrap();
    assert_eq!(batch.names(), vec![Some("make_g"), Some("merge"), None]);
    assert_eq!(
        backend.expected_merge_nodes(&batch),
        vec![None, Some(g.clone()), None]
    );
    let mb = MergeBuffer::new();
    let ctx = backend.init("dev").unwrap();
    let (ctx2, routines) = backend.link_batch(&[], &mb, &ctx, &batch).unwrap();
    assert!(routines[2].is_none());
    let (rg, rm) = (routines[0].clone().unwrap(), routines[1].clone().unwrap());
    assert!(ctx2.contains(&g) && ctx2.contains(&sum) && !ctx.contains(&g));
    backend.from_host(&ctx2, &x).unwrap();
    rg.run().unwrap();
    // Merge buffer empty: a clear error naming the expected node.
    let err = rm.run().unwrap_err().to_string();
    assert!(err.contains("merge") && err.contains('g'), "{err}");
    // Another context's g (computed from other data) in the merge buffer.
    let other = backend.compile(false, Some("other"), &b, &make_g).unwrap();
    let ctx_b = backend.init("dev_b").unwrap();
    let r_other = backend
        .link(&[], &MergeBuffer::new(), &ctx_b, &other)
        .unwrap();
    let xb = r_other.context().get_buffer(&x).unwrap();
    backend
        .host_to_buffer(
            &Ndarray::create(Prec::Single, &[3], &InitOp::RangeOverOffsets).unwrap(),
            &xb,
        )
        .unwrap();
    r_other.run().unwrap();
    mb.set(r_other.context().get_buffer(&g).unwrap(), g.clone());
    rm.run().unwrap();
    backend.to_host(&ctx2, &sum).unwrap();
    assert_eq!(sum.host_values().unwrap(), vec![1. + 0., 4. + 1., 9. + 4.]);
    // Wrong node in the merge buffer.
    mb.set(ctx2.get_buffer(&x).unwrap(), x.clone());
    assert!(matches!(
        rm.run(),
        Err(arrayjit::Error::MergeBufferMismatch { .. })
    ));
    // from_prior_context: as in the seed's verify_prior_context, only nodes the code uses
    // are checked. `other` does not use sum, so listing it is fine; it uses g, which a fresh
    // context lacks, so listing g is an error naming it (and g is not added).
    assert!(backend
        .link(std::slice::from_ref(&sum), &mb, &ctx_b, &other)
        .is_ok());
    let fresh = backend.init("fresh").unwrap();
    let err = backend
        .link(std::slice::from_ref(&g), &mb, &fresh, &other)
        .unwrap_err()
        .to_string();
    assert!(err.contains("tensor g is not in context fresh"), "{err}");
    // to_buffer / buffer_to_host.
    let buf = backend.alloc_buffer(None, 12).unwrap();
    backend.to_buffer(&g, &buf, &ctx2).unwrap();
    let mut host = Ndarray::zeros(Prec::Single, &[3]);
    backend.buffer_to_host(&mut host, &buf).unwrap();
    assert_eq!(host.to_f64_vec(), vec![1., 4., 9.]);
    // Reuse of a big-enough old buffer.
    let same = backend.alloc_buffer(Some((buf.clone(), 12)), 8).unwrap();
    assert!(std::sync::Arc::ptr_eq(&same, &buf));
    backend.unsafe_cleanup();
    assert!(!backend.is_initialized());
    assert!(backend.init("x").is_err());
    backend.initialize(Config::default());
    assert!(backend.init("x").is_ok());
}

#[test]
fn readable_dumps_of_assignments_and_loop_ir() {
    let (asgns, _, _) = fused_chain(["t1", "t2", "t3", "t4"], "the chain");
    let doc = asgns.to_doc();
    assert!(doc.contains("# the chain"), "{doc}");
    assert!(doc.contains("t1[") && doc.contains("mul(a["), "{doc}");
    let lowered = arrayjit::lower::lower(&asgns).unwrap();
    let ll = arrayjit::loops::to_doc(&lowered);
    assert!(
        ll.contains("for i") && ll.contains("t2[") && ll.contains(":="),
        "{ll}"
    );
    let opt = arrayjit::optimize::optimize("chain", lowered, &Default::default()).unwrap();
    let ll = arrayjit::loops::to_doc(&opt.code);
    assert_eq!(ll.matches("for ").count(), 1, "{ll}");
    assert!(!ll.contains("t2["), "{ll}");
}

/// Nodes are immutable descriptors: compiling decides memory modes without changing them,
/// so compiling the same code again (in the same backend or a fresh one) gives the same C,
/// and printing C (what `emit-c` does) changes nothing either.
#[test]
fn compiling_twice_gives_the_same_code_and_never_changes_nodes() {
    let (asgns, temps, out) = fused_chain(["u1", "u2", "u3", "u4"], "twice");
    let before: Vec<_> = asgns
        .nodes()
        .iter()
        .map(Tnode::declared_memory_mode)
        .collect();
    let b = Bindings::empty();
    let backend = CcBackend::new();
    backend.initialize(Config::default());
    let shown = backend
        .generate_batch_source(None, &b, std::slice::from_ref(&asgns))
        .unwrap();
    let first = backend.compile(true, Some("twice"), &b, &asgns).unwrap();
    let second = backend.compile(true, Some("twice"), &b, &asgns).unwrap();
    let fresh = CcBackend::new();
    fresh.initialize(Config::default());
    let third = fresh.compile(true, Some("twice"), &b, &asgns).unwrap();
    assert_eq!(first.source(), second.source());
    assert_eq!(first.source(), third.source());
    assert!(shown.contains("twice"), "{shown}");
    let after: Vec<_> = asgns
        .nodes()
        .iter()
        .map(Tnode::declared_memory_mode)
        .collect();
    assert_eq!(before, after);
    for t in &temps {
        assert_eq!(t.declared_memory_mode(), None);
        assert_eq!(first.optimized().memory_mode(t), Some(MemoryMode::Virtual));
    }
    assert!(first.optimized().memory_mode(&out).is_some());
}

/// `compile_batch(shared = false)` postpones the C compiler to the first `link_batch` (as the
/// seed allows): with a compiler that always fails, the batch compiles and the link reports
/// the compile failure; with a real one, the postponed batch links into two contexts (one
/// compile) and computes the right values.
#[test]
fn postponed_batches_compile_at_the_first_link() {
    let x = input("x", &[3], Prec::Single, &[1., 2., 3.]);
    let y = output("y", &[3], Prec::Single);
    let b = Bindings::empty();
    let neg = unop(&y, Binop::Arg2, false, Unop::Neg, &x, "i->i", &b);
    let names = vec!["neg".to_string()];
    let mut broken = arrayjit::compile::CompilerConfig::from_env().unwrap();
    broken.compiler = "/bin/false".into();
    broken.cache_dir = None;
    let backend = CcBackend::with_config(broken, Default::default());
    backend.initialize(Config::default());
    let batch = backend
        .compile_batch(false, Some(&names), None, &b, std::slice::from_ref(&neg))
        .expect("nothing is compiled yet");
    let err = backend
        .link_batch(
            &[],
            &MergeBuffer::new(),
            &backend.init("a").unwrap(),
            &batch,
        )
        .expect_err("the link runs the compiler");
    assert!(
        matches!(err.root(), arrayjit::Error::Compile { .. }),
        "{err}"
    );
    assert!(backend
        .compile_batch(true, Some(&names), None, &b, std::slice::from_ref(&neg))
        .is_err());

    let backend = CcBackend::new();
    backend.initialize(Config::default());
    let batch = backend
        .compile_batch(false, Some(&names), None, &b, std::slice::from_ref(&neg))
        .unwrap();
    for label in ["first", "second"] {
        let ctx = backend.init(label).unwrap();
        let (_, rs) = backend
            .link_batch(&[], &MergeBuffer::new(), &ctx, &batch)
            .unwrap();
        let r = rs[0].clone().unwrap();
        assert!(backend.from_host(r.context(), &x).unwrap());
        r.run().unwrap();
        assert!(backend.to_host(r.context(), &y).unwrap());
        assert_eq!(y.host_values().unwrap(), vec![-1., -2., -3.]);
    }
}
