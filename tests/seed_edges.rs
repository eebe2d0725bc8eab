//! Edges of the seed API (OCANNL's `Backend` signature, `src/backend/`) that other tests
//! leave out: `link`/`link_batch` with a non-empty `from_prior_context`, merges into a
//! context that lacks the node, a node missing from the source of `device_to_device`,
//! `finalize` after a failed task (and `CcBackend::finalize`), a second `initialize` with
//! another config, and what is logged while routines run on device worker threads.
//! Every test runs under a watchdog, so a hang fails the test instead of stalling the suite.

mod common;
use arrayjit::backend::*;
use arrayjit::codegen::trace_file_name;
use arrayjit::compile::CompilerConfig;
use arrayjit::ir::*;
use arrayjit::optimize::Settings;
use arrayjit::Error;
use common::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Both in-process device backends; the multicore workers are left unpinned (the machine
/// running the tests is shared).
fn backends() -> Vec<Box<dyn Backend>> {
    vec![
        Box::new(MulticoreBackend::new().with_pinning(false)),
        Box::new(SyncBackend::new()),
    ]
}

/// `n` virtual devices, spread over the physical devices.
fn devices(b: &dyn Backend, n: usize) -> Vec<Device> {
    b.initialize(Config::default());
    let p = b.num_physical_devices();
    (0..n)
        .map(|i| {
            let phys = b.get_device(i % p).unwrap();
            b.new_virtual_device(&phys).unwrap()
        })
        .collect()
}

/// The values of `tn`'s buffer in `ctx`, read through a private host array (the caller has
/// awaited the device).
fn values(b: &dyn Backend, ctx: &Context, tn: &Tnode) -> Vec<f64> {
    let buf = ctx
        .get_buffer(tn)
        .unwrap_or_else(|| panic!("{} is not in {ctx:?}", tn.name()));
    let mut host = Ndarray::zeros(tn.prec(), tn.dims());
    b.buffer_to_host(&mut host, &buf).unwrap();
    host.to_f64_vec()
}

/// Asserts `e` is [`Error::ContextFinalized`] (under any routine wrapping) naming `ctx`.
fn assert_finalized(e: Error, ctx: &Context) {
    let want = format!("{} (#{})", ctx.label(), ctx.id());
    match e.root() {
        Error::ContextFinalized { context } => assert_eq!(context, &want, "{e}"),
        other => panic!("expected ContextFinalized naming {want}, got {other:?}"),
    }
}

/// `lhs = a op b`, pointwise over one axis.
fn pointwise(lhs: &Tnode, op: Binop, a: &Tnode, b: &Tnode) -> Assignments {
    binop(
        lhs,
        Binop::Arg2,
        false,
        op,
        a,
        b,
        "i,i->i",
        &Bindings::empty(),
    )
}

/// `lhs = a + merge(g)`, pointwise: the routine reads `g` only from the merge buffer.
fn add_merged(lhs: &Tnode, a: &Tnode, g: &Tnode) -> Assignments {
    Assignments::AccumBinop {
        initialize_neutral: false,
        accum: Binop::Arg2,
        op: Binop::Add,
        lhs: lhs.clone(),
        rhs1: Buffer::Node(a.clone()),
        rhs2: Buffer::MergeBuffer(g.clone()),
        projections: Projections::pointwise(lhs.dims(), 2),
    }
}

// ---------------------------------------------------------------------------------------
// 1. link and link_batch with a non-empty from_prior_context
// ---------------------------------------------------------------------------------------

/// `a = x * x` computed by a first routine is carried (listed in `from_prior_context`) into
/// the context of a second routine `y = a + x`, which reads it: the same buffer, and the
/// values the first routine left there. Linking into a context that lacks `a` fails naming
/// it and the routine.
#[test]
fn link_from_prior_context_reads_what_the_first_routine_computed() {
    with_watchdog(120, || {
        for b in backends() {
            let devs = devices(b.as_ref(), 1);
            let d = &devs[0];
            let x = input("x", &[3], Prec::Single, &[1., 2., 3.]);
            let a = on_device("a", &[3], Prec::Single);
            let y = output("y", &[3], Prec::Single);
            let bind = Bindings::empty();
            let produce = b
                .compile(
                    true,
                    Some("produce"),
                    &bind,
                    &pointwise(&a, Binop::Mul, &x, &x),
                )
                .unwrap();
            let consume = b
                .compile(
                    true,
                    Some("consume"),
                    &bind,
                    &pointwise(&y, Binop::Add, &a, &x),
                )
                .unwrap();
            let root = b.init(d).unwrap();
            let r1 = b.link(&[], &root, &produce).unwrap();
            assert!(b.from_host(r1.context(), &x).unwrap());
            r1.schedule().unwrap();

            // The root lacks a: listing it is an error naming a and the routine.
            let e = b
                .link(std::slice::from_ref(&a), &root, &consume)
                .unwrap_err();
            match &e {
                Error::InRoutine { routine, source } => {
                    assert_eq!(routine, "consume");
                    assert_eq!(
                        source.to_string(),
                        format!(
                            "linking routine consume: tensor a is not in context {} (it is \
                             listed in from_prior_context)",
                            d.name()
                        )
                    );
                    assert!(matches!(**source, Error::NotInContext { .. }), "{source:?}");
                }
                other => panic!("expected InRoutine, got {other:?}"),
            }

            let r2 = b
                .link(std::slice::from_ref(&a), r1.context(), &consume)
                .unwrap();
            assert_eq!(
                r2.context().parent().map(Context::id),
                Some(r1.context().id())
            );
            let (a1, a2) = (
                r1.context().get_buffer(&a).unwrap(),
                r2.context().get_buffer(&a).unwrap(),
            );
            assert!(Arc::ptr_eq(&a1, &a2), "a was not carried: another buffer");
            // y was added to the second routine's context only.
            assert!(r2.context().contains(&y) && !r1.context().contains(&y));
            r2.schedule().unwrap();
            b.await_device(d).unwrap();
            assert_eq!(values(b.as_ref(), r2.context(), &a), vec![1., 4., 9.]);
            assert_eq!(values(b.as_ref(), r2.context(), &y), vec![2., 6., 12.]);

            // New input through the shared x: both routines see it.
            x.set_host_values(&[4., 5., 6.]).unwrap();
            assert!(b.from_host(r2.context(), &x).unwrap());
            r1.schedule().unwrap();
            r2.schedule().unwrap();
            assert!(b.to_host(r2.context(), &y).unwrap());
            b.await_device(d).unwrap();
            assert_eq!(y.host_values().unwrap(), vec![20., 30., 42.]);
            b.unsafe_cleanup();
        }
    });
}

/// The same through `link_batch`: a batch of two consumers of `a` linked with
/// `from_prior_context = [a]` into the producer's context; the returned context is
/// downstream of both and shares `a`. Into a context lacking `a`, the first entry using it
/// fails, naming it.
#[test]
fn link_batch_from_prior_context_reads_what_the_first_routine_computed() {
    with_watchdog(120, || {
        for b in backends() {
            let devs = devices(b.as_ref(), 1);
            let d = &devs[0];
            let x = input("x", &[3], Prec::Double, &[1., 2., 3.]);
            let a = on_device("a", &[3], Prec::Double);
            let y = output("y", &[3], Prec::Double);
            let z = output("z", &[3], Prec::Double);
            let bind = Bindings::empty();
            let produce = b
                .compile(
                    true,
                    Some("produce"),
                    &bind,
                    &pointwise(&a, Binop::Mul, &x, &x),
                )
                .unwrap();
            let names = vec!["sum".to_string(), "product".to_string()];
            let batch = b
                .compile_batch(
                    true,
                    Some(&names),
                    None,
                    &bind,
                    &[
                        pointwise(&y, Binop::Add, &a, &x),
                        pointwise(&z, Binop::Mul, &a, &x),
                    ],
                )
                .unwrap();
            let root = b.init(d).unwrap();
            let r1 = b.link(&[], &root, &produce).unwrap();
            assert!(b.from_host(r1.context(), &x).unwrap());
            r1.schedule().unwrap();

            let e = b
                .link_batch(std::slice::from_ref(&a), &root, &batch)
                .unwrap_err();
            match &e {
                Error::InRoutine { routine, source } => {
                    assert_eq!(routine, "sum");
                    assert!(
                        source.to_string().contains(&format!(
                            "tensor a is not in context {} (it is listed in \
                             from_prior_context)",
                            d.name()
                        )),
                        "{source}"
                    );
                }
                other => panic!("expected InRoutine, got {other:?}"),
            }

            let (ctx, rs) = b
                .link_batch(std::slice::from_ref(&a), r1.context(), &batch)
                .unwrap();
            assert_eq!(rs.len(), 2);
            let (rs_sum, rs_prod) = (rs[0].clone().unwrap(), rs[1].clone().unwrap());
            let a1 = r1.context().get_buffer(&a).unwrap();
            for c in [&ctx, rs_sum.context(), rs_prod.context()] {
                assert!(Arc::ptr_eq(&a1, &c.get_buffer(&a).unwrap()));
            }
            assert!(ctx.contains(&y) && ctx.contains(&z));
            assert_eq!(ctx.expected_merge_node(), None);
            rs_sum.schedule().unwrap();
            rs_prod.schedule().unwrap();
            b.await_device(d).unwrap();
            assert_eq!(values(b.as_ref(), &ctx, &y), vec![2., 6., 12.]);
            assert_eq!(values(b.as_ref(), &ctx, &z), vec![1., 8., 27.]);
            b.unsafe_cleanup();
        }
    });
}

// ---------------------------------------------------------------------------------------
// 2. merges into a destination context that lacks the node
// ---------------------------------------------------------------------------------------

/// The seed: with `into_merge_buffer` other than `No`, `device_to_device` schedules the
/// merge-buffer task and returns true, whether or not `dst` holds the node (the merge buffer
/// belongs to `dst`'s device). Here `dst` is the context of `s = x + merge(g)`, which reads
/// `g` only from the merge buffer and holds no buffer of it: Copy and Streaming both return
/// true and the routine reads the source's `g`. With `No`, a `dst` lacking the node gives
/// false and changes nothing.
#[test]
fn a_merge_into_a_context_lacking_the_node_goes_through_the_merge_buffer() {
    with_watchdog(120, || {
        for b in backends() {
            let devs = devices(b.as_ref(), 2);
            let bind = Bindings::empty();
            let x = input("x", &[3], Prec::Double, &[10., 20., 30.]);
            let g = on_device("g", &[3], Prec::Double);
            let s = output("s", &[3], Prec::Double);
            let make_g = b
                .compile(
                    true,
                    Some("make_g"),
                    &bind,
                    &pointwise(&g, Binop::Add, &x, &x),
                )
                .unwrap();
            let merge = b
                .compile(true, Some("merge_g"), &bind, &add_merged(&s, &x, &g))
                .unwrap();
            assert_eq!(b.expected_merge_node(&merge), Some(g.clone()));
            // Source: g on device 1.
            let rg = b.link(&[], &b.init(&devs[1]).unwrap(), &make_g).unwrap();
            assert!(b.from_host(rg.context(), &x).unwrap());
            // Destination: the merge routine on device 0; its context lacks g.
            let rm = b.link(&[], &b.init(&devs[0]).unwrap(), &merge).unwrap();
            assert!(b.from_host(rm.context(), &x).unwrap());
            assert!(!rm.context().contains(&g));
            assert_eq!(rm.context().expected_merge_node(), Some(&g));

            // No: the destination lacks g, so false, and the merge buffer stays empty.
            assert!(!b
                .device_to_device(&g, MergeBufferUse::No, rm.context(), rg.context())
                .unwrap());
            b.await_device(&devs[0]).unwrap();
            assert!(devs[0].merge_buffer().get().is_none());

            // Copy, then Streaming, each from a new g (x on device 1 changes between them).
            let cases = [
                (MergeBufferUse::Copy, [10., 20., 30.], [30., 60., 90.]),
                (MergeBufferUse::Streaming, [1., 2., 3.], [12., 24., 36.]),
            ];
            for (mode, xs, want) in cases {
                x.set_host_values(&xs).unwrap();
                assert!(b.from_host(rg.context(), &x).unwrap());
                rg.schedule().unwrap();
                b.await_device(&devs[1]).unwrap();
                assert!(b
                    .device_to_device(&g, mode, rm.context(), rg.context())
                    .unwrap());
                rm.schedule().unwrap();
                b.await_device(&devs[0]).unwrap();
                let what = format!("{} {mode:?}", b.name());
                assert_eq!(values(b.as_ref(), rm.context(), &s), want, "{what}");
                assert!(!rm.context().contains(&g), "{what}: the merge added g");
                let (held, node) = devs[0].merge_buffer().get().unwrap();
                assert_eq!(node, g, "{what}");
                let src = rg.context().get_buffer(&g).unwrap();
                match mode {
                    // Streaming points at the source's buffer; Copy fills the device's own.
                    MergeBufferUse::Streaming => assert!(Arc::ptr_eq(&held, &src), "{what}"),
                    _ => {
                        assert!(!Arc::ptr_eq(&held, &src), "{what}");
                        assert!(devs[0].merge_storage_size().unwrap() >= 24, "{what}");
                    }
                }
            }

            // A destination that lacks g and whose routine reads no merge buffer (device 0's
            // root): the Rust API rejects it at once (stricter than the seed, which only
            // requires this of contexts compiled with merge-buffer code; documented on
            // Backend::device_to_device).
            let root0 = b.init(&devs[0]).unwrap();
            for mode in [MergeBufferUse::Copy, MergeBufferUse::Streaming] {
                match b.device_to_device(&g, mode, &root0, rg.context()) {
                    Err(Error::MergeNodeMismatch {
                        context,
                        expected,
                        actual,
                    }) => {
                        assert_eq!(context, devs[0].name());
                        assert_eq!(expected, None);
                        assert_eq!(actual, "g");
                    }
                    other => panic!("{mode:?}: expected MergeNodeMismatch, got {other:?}"),
                }
            }
            b.unsafe_cleanup();
        }
    });
}

// ---------------------------------------------------------------------------------------
// 3. a node missing from the source
// ---------------------------------------------------------------------------------------

/// The seed: "If the node is absent from the src context and either it is present in the
/// dst context or ~into_merge_buffer is different from No: raises an error." Every such
/// case is `Error::NotInContext` naming the node and the source context, from `device_to_device`
/// and `prepare_transfer` alike, and schedules nothing; absent from both with `No` is false.
#[test]
fn a_node_missing_from_the_source_is_an_error_naming_it() {
    with_watchdog(120, || {
        for b in backends() {
            let devs = devices(b.as_ref(), 2);
            let bind = Bindings::empty();
            let x = input("x", &[3], Prec::Single, &[1., 2., 3.]);
            let g = on_device("g", &[3], Prec::Single);
            let s = output("s", &[3], Prec::Single);
            let make_g = b
                .compile(
                    true,
                    Some("make_g"),
                    &bind,
                    &pointwise(&g, Binop::Add, &x, &x),
                )
                .unwrap();
            let merge = b
                .compile(true, Some("merge_g"), &bind, &add_merged(&s, &x, &g))
                .unwrap();
            // Destinations on device 0: one holding g, one expecting it in the merge buffer.
            let holds_g = b.link(&[], &b.init(&devs[0]).unwrap(), &make_g).unwrap();
            assert!(b.from_host(holds_g.context(), &x).unwrap());
            holds_g.schedule().unwrap();
            b.await_device(&devs[0]).unwrap();
            let expects_g = b.link(&[], &b.init(&devs[0]).unwrap(), &merge).unwrap();
            // Source on device 1 without g.
            let src = b.init(&devs[1]).unwrap();
            assert!(!src.contains(&g));
            let want = format!(
                "device_to_device: tensor g is not in context {} (the source context)",
                src.label()
            );
            let cases = [
                (MergeBufferUse::No, holds_g.context()),
                (MergeBufferUse::Copy, holds_g.context()),
                (MergeBufferUse::Streaming, holds_g.context()),
                (MergeBufferUse::Copy, expects_g.context()),
                (MergeBufferUse::Streaming, expects_g.context()),
            ];
            for (mode, dst) in cases {
                let what = format!("{} {mode:?} into {dst:?}", b.name());
                for r in [
                    b.device_to_device(&g, mode, dst, &src),
                    b.prepare_transfer(&g, mode, dst, &src).map(|t| t.is_some()),
                ] {
                    match r {
                        Err(e @ Error::NotInContext { .. }) => {
                            assert_eq!(e.to_string(), want, "{what}")
                        }
                        other => panic!("{what}: expected NotInContext, got {other:?}"),
                    }
                }
            }
            // Nothing was scheduled: g on device 0 keeps its value, the merge buffer is empty.
            b.await_device(&devs[0]).unwrap();
            assert_eq!(values(b.as_ref(), holds_g.context(), &g), vec![2., 4., 6.]);
            assert!(devs[0].merge_buffer().get().is_none());
            // Absent from both, No: nothing to copy, false.
            assert!(!b
                .device_to_device(&g, MergeBufferUse::No, expects_g.context(), &src)
                .unwrap());
            b.unsafe_cleanup();
        }
    });
}

// ---------------------------------------------------------------------------------------
// 4. finalize after a failed task; CcBackend::finalize
// ---------------------------------------------------------------------------------------

/// A routine that fails on its device (it reads the merge buffer, which nothing filled),
/// then `Backend::finalize` of its context: finalize returns (it awaits the device, the
/// failure stays to be reported once by the next await), and later uses of the context are
/// `Error::ContextFinalized` naming it, never a panic or hang. The device keeps working.
#[test]
fn finalize_after_a_failed_task_then_use_is_an_error() {
    with_watchdog(120, || {
        for b in backends() {
            let devs = devices(b.as_ref(), 2);
            let d = &devs[0];
            let bind = Bindings::empty();
            let x = input("x", &[3], Prec::Single, &[1., 2., 3.]);
            let g = on_device("g", &[3], Prec::Single);
            let s = output("s", &[3], Prec::Single);
            let merge = b
                .compile(true, Some("merge_g"), &bind, &add_merged(&s, &x, &g))
                .unwrap();
            let make_g = b
                .compile(
                    true,
                    Some("make_g"),
                    &bind,
                    &pointwise(&g, Binop::Add, &x, &x),
                )
                .unwrap();
            let rm = b.link(&[], &b.init(d).unwrap(), &merge).unwrap();
            assert!(b.from_host(rm.context(), &x).unwrap());
            let want_task = format!("routine merge_g on {}", d.name());
            let want_msg = "routine merge_g expects tensor g in the merge buffer, but it holds \
                            nothing";
            let check_failure = |r: arrayjit::Result<()>| match r {
                Err(Error::Task { task, msg }) => {
                    assert_eq!(task, want_task);
                    assert_eq!(msg, want_msg);
                }
                other => panic!("expected the merge routine's Task failure, got {other:?}"),
            };
            let scheduled = rm.schedule();
            if d.has_worker() {
                scheduled.unwrap();
            } else {
                // The sync backend runs it now.
                check_failure(scheduled);
            }
            b.finalize(rm.context());
            assert!(rm.context().is_finalized());
            assert!(b.is_idle(d));
            if d.has_worker() {
                // The failure survives finalize and is reported once.
                check_failure(b.await_device(d));
            }
            b.await_device(d).unwrap();
            // The context's buffers are gone; every use of it fails naming it.
            assert!(rm.context().nodes().is_empty());
            assert!(rm.context().get_buffer(&x).is_none());
            let ctx = rm.context().clone();
            assert_finalized(rm.run().unwrap_err(), &ctx);
            assert_finalized(rm.schedule().unwrap_err(), &ctx);
            assert_finalized(b.schedule(d, rm.task()).unwrap_err(), &ctx);
            assert_finalized(b.from_host(&ctx, &x).unwrap_err(), &ctx);
            assert_finalized(b.to_host(&ctx, &s).unwrap_err(), &ctx);
            assert_finalized(b.link(&[], &ctx, &make_g).unwrap_err(), &ctx);
            let names = vec!["make_g".to_string()];
            let batch = b
                .compile_batch(
                    true,
                    Some(&names),
                    None,
                    &bind,
                    &[pointwise(&g, Binop::Add, &x, &x)],
                )
                .unwrap();
            assert_finalized(b.link_batch(&[], &ctx, &batch).unwrap_err(), &ctx);
            let rg = b.link(&[], &b.init(&devs[1]).unwrap(), &make_g).unwrap();
            assert!(b.from_host(rg.context(), &x).unwrap());
            rg.schedule().unwrap();
            b.await_device(&devs[1]).unwrap();
            for mode in [
                MergeBufferUse::No,
                MergeBufferUse::Copy,
                MergeBufferUse::Streaming,
            ] {
                assert_finalized(
                    b.device_to_device(&g, mode, &ctx, rg.context())
                        .unwrap_err(),
                    &ctx,
                );
                assert_finalized(
                    b.device_to_device(&g, mode, rg.context(), &ctx)
                        .unwrap_err(),
                    &ctx,
                );
            }
            // Finalizing again changes nothing.
            b.finalize(&ctx);
            assert_finalized(rm.run().unwrap_err(), &ctx);
            // The device still works for other contexts.
            let again = b.link(&[], &b.init(d).unwrap(), &merge).unwrap();
            assert!(b.from_host(again.context(), &x).unwrap());
            assert!(b
                .device_to_device(&g, MergeBufferUse::Copy, again.context(), rg.context())
                .unwrap());
            again.schedule().unwrap();
            b.await_device(d).unwrap();
            assert_eq!(values(b.as_ref(), again.context(), &s), vec![3., 6., 9.]);
            b.unsafe_cleanup();
            // Finalizing a context of a device released by unsafe_cleanup returns too.
            b.finalize(again.context());
            assert_finalized(
                b.from_host(again.context(), &x).unwrap_err(),
                again.context(),
            );
        }
    });
}

/// `y = x[{s}, :]` (x is 3 x 2) on a bounds-checked cc backend.
fn slice_program() -> (Bindings, Tnode, Tnode, Assignments) {
    let s = StaticSymbol::new("s", Some(3));
    let bind = Bindings(vec![s.clone()]);
    let x = input("x", &[3, 2], Prec::Single, &[1., 2., 3., 4., 5., 6.]);
    let y = output("y", &[2], Prec::Single);
    let code = Assignments::Fetch {
        array: y.clone(),
        fetch_op: FetchOp::Slice {
            batch_idx: s,
            sliced: x.clone(),
        },
    };
    (bind, x, y, code)
}

/// `CcBackend::finalize` directly, after a checked-mode failure (an out-of-bounds read):
/// later runs, host copies and links of the finalized context are `ContextFinalized`; a
/// context linked from its parent before is unaffected.
#[test]
fn cc_backend_finalize_after_a_bounds_failure() {
    with_watchdog(120, || {
        let cc = CcBackend::new().with_checked(true);
        let (bind, x, y, code) = slice_program();
        let (r, _) = build(&cc, "slicer", &bind, &code).unwrap();
        r.run_unchecked_statics_for_test(&[1]).unwrap();
        assert!(cc.to_host(r.context(), &y).unwrap());
        assert_eq!(y.host_values().unwrap(), vec![3., 4.]);
        match r.run_unchecked_statics_for_test(&[5]) {
            Err(Error::IndexOutOfBounds {
                routine,
                tensor,
                indices,
                extents,
            }) => {
                assert_eq!((routine.as_str(), tensor.as_str()), ("slicer", "x"));
                assert_eq!((indices, extents), (vec![5, 0], vec![3, 2]));
            }
            other => panic!("expected IndexOutOfBounds, got {other:?}"),
        }
        let compiled = cc.compile(true, Some("slicer"), &bind, &code).unwrap();
        let parent = r.context().parent().unwrap().clone();
        let sibling = cc
            .link(&[], &MergeBuffer::new(), &parent, &compiled)
            .unwrap();
        let ctx = r.context().clone();
        cc.finalize(&ctx);
        assert!(ctx.is_finalized() && ctx.nodes().is_empty());
        assert_finalized(r.run().unwrap_err(), &ctx);
        assert_finalized(r.run_unchecked_statics_for_test(&[1]).unwrap_err(), &ctx);
        assert_finalized(cc.from_host(&ctx, &x).unwrap_err(), &ctx);
        assert_finalized(cc.to_host(&ctx, &y).unwrap_err(), &ctx);
        let e = cc
            .link(&[], &MergeBuffer::new(), &ctx, &compiled)
            .unwrap_err();
        assert!(matches!(&e, Error::InRoutine { routine, .. } if routine == "slicer"));
        assert_finalized(e, &ctx);
        // The parent and a sibling linked from it are still usable.
        assert!(!parent.is_finalized());
        assert!(cc.from_host(sibling.context(), &x).unwrap());
        sibling.bindings().set("s", 2).unwrap();
        sibling.run().unwrap();
        assert!(cc.to_host(sibling.context(), &y).unwrap());
        assert_eq!(y.host_values().unwrap(), vec![5., 6.]);
    });
}

/// `Context::finalize` documents that copying from a finalized context fails with
/// `ContextFinalized`; `to_buffer` (on `CcBackend` and, through it, every `Backend`) once
/// reported the released buffer as a node missing from the context instead.
#[test]
fn to_buffer_from_a_finalized_context_is_context_finalized() {
    let cc = CcBackend::new();
    let (bind, _, y, code) = slice_program();
    let (r, _) = build(&cc, "slicer", &bind, &code).unwrap();
    r.run().unwrap();
    let buf = cc.alloc_buffer(None, y.size_in_bytes()).unwrap();
    cc.to_buffer(&y, &buf, r.context()).unwrap();
    let ctx = r.context().clone();
    cc.finalize(&ctx);
    assert_finalized(cc.to_buffer(&y, &buf, &ctx).unwrap_err(), &ctx);
}

// ---------------------------------------------------------------------------------------
// 5. a second initialize with another config
// ---------------------------------------------------------------------------------------

/// The seed: `initialize` "does nothing if the backend is already initialized" (and the
/// Rust docs of `CcBackend::initialize` and `Backend::initialize` say the same): a second
/// call with another config keeps the first config, and the devices and contexts obtained
/// before stay valid. After `unsafe_cleanup`, `initialize` takes the new config.
#[test]
fn a_second_initialize_with_another_config_does_nothing() {
    with_watchdog(120, || {
        // The no-device backend.
        let cc = CcBackend::new();
        assert!(!cc.is_initialized());
        match cc.init("early") {
            Err(Error::NotInitialized { backend }) => assert_eq!(backend, "cc"),
            other => panic!("expected NotInitialized, got {other:?}"),
        }
        cc.initialize(Config::ForParallelCopying);
        assert!(cc.is_initialized());
        let ctx = cc.init("before").unwrap();
        cc.initialize(Config::PhysicalDevicesOnly);
        assert!(cc.is_initialized());
        assert_eq!(cc.config(), Config::ForParallelCopying);
        let x = input("x", &[2], Prec::Single, &[1., -2.]);
        let y = output("y", &[2], Prec::Single);
        let bind = Bindings::empty();
        let neg = unop(&y, Binop::Arg2, false, Unop::Neg, &x, "i->i", &bind);
        let code = cc.compile(true, Some("neg"), &bind, &neg).unwrap();
        let r = cc.link(&[], &MergeBuffer::new(), &ctx, &code).unwrap();
        assert!(cc.from_host(r.context(), &x).unwrap());
        r.run().unwrap();
        assert!(cc.to_host(r.context(), &y).unwrap());
        assert_eq!(y.host_values().unwrap(), vec![-1., 2.]);
        cc.unsafe_cleanup();
        assert!(!cc.is_initialized());
        cc.initialize(Config::PhysicalDevicesOnly);
        assert_eq!(cc.config(), Config::PhysicalDevicesOnly);

        // The device backends: the multicore backend's suggested virtual device count
        // follows the config (2 for ForParallelCopying, 1 otherwise).
        for b in backends() {
            assert!(!b.is_initialized());
            match b.get_device(0) {
                Err(Error::NotInitialized { backend }) => assert_eq!(backend, b.name()),
                other => panic!("expected NotInitialized, got {other:?}"),
            }
            let multi = b.name() == "multicore";
            b.initialize(Config::ForParallelCopying);
            let phys = b.get_device(0).unwrap();
            let d = b.new_virtual_device(&phys).unwrap();
            let ctx = b.init(&d).unwrap();
            assert_eq!(
                b.suggested_num_virtual_devices(&phys),
                if multi { 2 } else { 1 }
            );
            b.initialize(Config::PhysicalDevicesOnly);
            assert!(b.is_initialized());
            assert_eq!(b.core().cc().config(), Config::ForParallelCopying);
            assert_eq!(
                b.suggested_num_virtual_devices(&phys),
                if multi { 2 } else { 1 }
            );
            // The device and context from before still work.
            assert_eq!(b.get_device(0).unwrap(), phys);
            let code = b.compile(true, Some("neg"), &bind, &neg).unwrap();
            let r = b.link(&[], &ctx, &code).unwrap();
            x.set_host_values(&[3., 4.]).unwrap();
            assert!(b.from_host(r.context(), &x).unwrap());
            r.schedule().unwrap();
            b.await_device(&d).unwrap();
            assert_eq!(values(b.as_ref(), r.context(), &y), vec![-3., -4.]);
            // A new virtual device after the second initialize is the next subordinal.
            let d2 = b.new_virtual_device(&phys).unwrap();
            assert_eq!(b.to_subordinal(&d2), 1);
            b.unsafe_cleanup();
            b.initialize(Config::PhysicalDevicesOnly);
            assert_eq!(b.core().cc().config(), Config::PhysicalDevicesOnly);
            let phys = b.get_device(0).unwrap();
            assert_eq!(b.suggested_num_virtual_devices(&phys), 1);
            b.unsafe_cleanup();
        }
    });
}

// ---------------------------------------------------------------------------------------
// 6. logging while routines run on device worker threads
// ---------------------------------------------------------------------------------------

/// One captured `tracing` event.
#[derive(Clone, Debug)]
struct Captured {
    thread: Option<String>,
    level: tracing::Level,
    target: String,
    fields: BTreeMap<String, String>,
}

struct Capture(Arc<Mutex<Vec<Captured>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct Fields<'a>(&'a mut BTreeMap<String, String>);
        impl tracing::field::Visit for Fields<'_> {
            fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
                self.0.insert(f.name().into(), v.into());
            }
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                self.0.insert(f.name().into(), format!("{v:?}"));
            }
        }
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let c = Captured {
            thread: std::thread::current().name().map(str::to_string),
            level: *event.metadata().level(),
            target: event.metadata().target().to_string(),
            fields,
        };
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(c);
    }
}

/// The events captured so far by the process-wide subscriber (installed on first use: a
/// thread-local one would not see the device worker threads).
fn captured() -> Vec<Captured> {
    static EVENTS: OnceLock<Arc<Mutex<Vec<Captured>>>> = OnceLock::new();
    let events = EVENTS.get_or_init(|| {
        use tracing_subscriber::layer::SubscriberExt;
        let events = Arc::default();
        let subscriber = tracing_subscriber::registry().with(Capture(Arc::clone(&events)));
        tracing::subscriber::set_global_default(subscriber).unwrap();
        events
    });
    events.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// What the library logs today around a routine on a device: `linked` (debug) on the
/// linking thread, and the once-per-routine warning about reads of never-written tensors,
/// emitted by the run itself, so on the device's worker thread (named after its queue,
/// `multicore:0`) on the multicore backend and on the caller's thread on the sync backend.
/// The device layer logs awaits (trace), host transfers (trace), transfers between devices
/// (debug) and an await that returns a task's failure (debug, naming the task), besides a
/// failure to pin a worker to its core (which this test cannot provoke).
#[test]
fn events_of_routines_run_on_worker_threads_are_captured() {
    captured();
    with_watchdog(120, || {
        // Strict reads off: the reads of u warn instead of failing.
        let lenient = || CcBackend::new().with_strict(false);
        let backends: [Box<dyn Backend>; 2] = [
            Box::new(MulticoreBackend::with_cc(lenient())),
            Box::new(SyncBackend::with_cc(lenient())),
        ];
        for b in backends {
            let devs = devices(b.as_ref(), 1);
            let d = &devs[0];
            let me = std::thread::current().name().map(str::to_string);
            let routine = format!("traced_{}", b.name());
            // u is never written: the routine reads zeros and warns about it.
            let u = on_device("u", &[2], Prec::Single);
            let y = output("y", &[2], Prec::Single);
            let bind = Bindings::empty();
            let code = b
                .compile(
                    true,
                    Some(&routine),
                    &bind,
                    &pointwise(&y, Binop::Add, &u, &u),
                )
                .unwrap();
            let ctx = b.init(d).unwrap();
            let r = b.link(&[], &ctx, &code).unwrap();
            // A task that fails: the device layer logs nothing about it.
            let failing = format!("failing_{}", b.name());
            let _ = b.schedule(
                d,
                Task::new(failing.clone(), || Err(Error::Usage("on purpose".into()))),
            );
            let _ = b.await_device(d);
            for _ in 0..3 {
                r.schedule().unwrap();
            }
            b.await_device(d).unwrap();
            assert_eq!(values(b.as_ref(), r.context(), &y), vec![0., 0.]);
            let events = captured();
            let mine = |msg: &str| -> Vec<Captured> {
                events
                    .iter()
                    .filter(|e| {
                        e.target == "arrayjit::backend"
                            && e.fields.get("routine") == Some(&routine)
                            && e.fields.get("message").is_some_and(|m| m.contains(msg))
                    })
                    .cloned()
                    .collect()
            };
            let linked = mine("linked");
            assert_eq!(linked.len(), 1, "{linked:?}");
            assert_eq!(linked[0].level, tracing::Level::DEBUG);
            assert_eq!(linked[0].thread, me);
            assert_eq!(linked[0].fields["context"], d.name());
            assert_eq!(linked[0].fields["buffers"], "2");
            let warned = mine("that nothing has written");
            assert_eq!(warned.len(), 1, "once per linked routine: {warned:?}");
            let w = &warned[0];
            assert_eq!(w.level, tracing::Level::WARN);
            assert_eq!(w.fields["tensors"], "u");
            assert_eq!(
                w.fields["message"],
                format!(
                    "routine {routine} reads u that nothing has written in its context (all \
                     zeros): run the routine computing them first, or copy them from the host"
                )
            );
            if d.has_worker() {
                assert_eq!(w.thread.as_deref(), Some("multicore:0"));
                assert_ne!(w.thread, me);
            } else {
                assert_eq!(w.thread, me);
            }
            // On a worker, the failed task is reported by the await that returned its error
            // (debug, on the awaiting thread), and by nothing else; the sync backend returns
            // it from `schedule` itself, and logs nothing.
            let failed: Vec<&Captured> = events
                .iter()
                .filter(|e| e.fields.values().any(|v| v.contains(&failing)))
                .collect();
            if d.has_worker() {
                assert_eq!(failed.len(), 1, "{failed:?}");
                assert_eq!(failed[0].level, tracing::Level::DEBUG);
                assert_eq!(failed[0].fields["message"], "await: a task failed");
                assert_eq!(failed[0].thread, me);
            } else {
                assert!(failed.is_empty(), "{failed:?}");
            }
            b.unsafe_cleanup();
        }
    });
}

/// The generated code's trace log (`CompilerConfig::trace_dir`) written by runs on a device
/// worker thread: every run appends its header and values, in order.
#[test]
fn trace_logs_of_runs_on_worker_threads() {
    with_watchdog(120, || {
        let dir = tempfile::tempdir().unwrap();
        let cfg = CompilerConfig::from_env()
            .expect("a C compiler is needed for these tests")
            .trace_dir(Some(dir.path().to_path_buf()));
        let b = MulticoreBackend::with_cc(CcBackend::with_config(cfg, Settings::default()))
            .with_pinning(false);
        let devs = devices(&b, 1);
        let d = &devs[0];
        assert!(d.has_worker());
        let x = input("x", &[2], Prec::Single, &[1., 2.]);
        let y = output("y", &[2], Prec::Single);
        let bind = Bindings::empty();
        let code = b
            .compile(
                true,
                Some("traced_on_worker"),
                &bind,
                &pointwise(&y, Binop::Add, &x, &x),
            )
            .unwrap();
        let r = b.link(&[], &b.init(d).unwrap(), &code).unwrap();
        assert!(b.from_host(r.context(), &x).unwrap());
        r.schedule().unwrap();
        b.await_device(d).unwrap();
        x.set_host_values(&[5., -1.]).unwrap();
        assert!(b.from_host(r.context(), &x).unwrap());
        r.schedule().unwrap();
        b.await_device(d).unwrap();
        let path = dir.path().join(trace_file_name("traced_on_worker"));
        let log = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            log,
            "# run of routine traced_on_worker\ny[0] = 2\ny[1] = 4\n\
             # run of routine traced_on_worker\ny[0] = 10\ny[1] = -2\n"
        );
        b.unsafe_cleanup();
    });
}
