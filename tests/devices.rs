//! The device layer: multicore and sync backends, queues, failures, transfers, merge buffers.
//! Every test runs under a watchdog, so a hang fails the test instead of stalling the suite.

mod common;
use arrayjit::backend::sexp::*;
use arrayjit::backend::*;
use arrayjit::ir::*;
use common::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

fn backends() -> Vec<Box<dyn Backend>> {
    vec![
        Box::new(MulticoreBackend::new()),
        Box::new(SyncBackend::new()),
    ]
}

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

/// Each device computes y = 2 * batch[d] (its own slice) + sum of the slice.
#[test]
fn devices_run_concurrently_on_their_own_data() {
    with_watchdog(120, || {
        for b in backends() {
            let n = 4;
            let devs = devices(b.as_ref(), n);
            let row = StaticSymbol::new("row", Some(n));
            let bind = Bindings(vec![row.clone()]);
            let data: Vec<f64> = (0..n * 8).map(|i| i as f64 * 0.5).collect();
            let batch = input("batch", &[n, 8], Prec::Single, &data);
            let x = temp("x", &[8], Prec::Single);
            let two = temp("two", &[1], Prec::Single);
            let s = output("s", &[1], Prec::Single);
            let y = output("y", &[8], Prec::Single);
            let code = Assignments::seq([
                Assignments::Fetch {
                    array: x.clone(),
                    fetch_op: FetchOp::Slice {
                        batch_idx: row.clone(),
                        sliced: batch.clone(),
                    },
                },
                Assignments::Fetch {
                    array: two.clone(),
                    fetch_op: FetchOp::Constant(2.0),
                },
                binop(
                    &y,
                    Binop::Arg2,
                    false,
                    Binop::Mul,
                    &x,
                    &two,
                    "i,0->i",
                    &bind,
                ),
                unop(&s, Binop::Add, true, Unop::Identity, &x, "i->0", &bind),
            ]);
            let code = b.compile(true, Some("per_device"), &bind, &code).unwrap();
            let mut routines = vec![];
            for d in &devs {
                let ctx = b.init(d).unwrap();
                let r = b.link(&[], &ctx, &code).unwrap();
                assert!(b.from_host(r.context(), &batch).unwrap());
                r.bindings()
                    .set(
                        "row",
                        d.subordinal() as i64 * b.num_physical_devices() as i64
                            + d.physical().ordinal() as i64,
                    )
                    .unwrap();
                routines.push(r);
            }
            for r in &routines {
                r.schedule().unwrap();
            }
            for (d, r) in devs.iter().zip(&routines) {
                let k = r.bindings().values()[0] as usize;
                // Read back through a host copy private to this check.
                b.await_device(d).unwrap();
                let yb = r.context().get_buffer(&y).unwrap();
                let sb = r.context().get_buffer(&s).unwrap();
                let mut ya = Ndarray::zeros(Prec::Single, &[8]);
                let mut sa = Ndarray::zeros(Prec::Single, &[1]);
                b.buffer_to_host(&mut ya, &yb).unwrap();
                b.buffer_to_host(&mut sa, &sb).unwrap();
                let slice = &data[k * 8..k * 8 + 8];
                assert_eq!(
                    ya.to_f64_vec(),
                    slice.iter().map(|v| v * 2.0).collect::<Vec<_>>(),
                    "{}",
                    b.name()
                );
                assert_eq!(sa.to_f64_vec(), vec![slice.iter().sum::<f64>()]);
            }
            b.unsafe_cleanup();
        }
    });
}

/// Gradients on every device merged into device 0 pairwise in a tree; Streaming and Copy
/// give the same sums.
#[test]
fn streaming_and_copy_merges_agree() {
    with_watchdog(120, || {
        for b in backends() {
            let mut sums = vec![];
            for mode in [MergeBufferUse::Streaming, MergeBufferUse::Copy] {
                let n = 4;
                let devs = devices(b.as_ref(), n);
                let row = StaticSymbol::new("row", Some(n));
                let bind = Bindings(vec![row.clone()]);
                let data: Vec<f64> = (0..n * 3).map(|i| (i * i) as f64).collect();
                let batch = input("batch", &[n, 3], Prec::Double, &data);
                let g = on_device("g", &[3], Prec::Double);
                let grad = Assignments::Fetch {
                    array: g.clone(),
                    fetch_op: FetchOp::Slice {
                        batch_idx: row.clone(),
                        sliced: batch.clone(),
                    },
                };
                let merge = Assignments::AccumBinop {
                    initialize_neutral: false,
                    accum: Binop::Add,
                    op: Binop::Arg2,
                    lhs: g.clone(),
                    rhs1: arrayjit::ir::Buffer::Node(g.clone()),
                    rhs2: arrayjit::ir::Buffer::MergeBuffer(g.clone()),
                    projections: Projections::pointwise(&[3], 2),
                };
                let names = vec!["grad".to_string(), "merge".to_string()];
                let batch_code = b
                    .compile_batch(true, Some(&names), None, &bind, &[grad, merge])
                    .unwrap();
                assert_eq!(
                    b.expected_merge_nodes(&batch_code),
                    vec![None, Some(g.clone())]
                );
                let mut ctxs = vec![];
                let mut grads = vec![];
                let mut merges = vec![];
                for (i, d) in devs.iter().enumerate() {
                    let ctx = b.init(d).unwrap();
                    let (ctx, rs) = b.link_batch(&[], &ctx, &batch_code).unwrap();
                    b.from_host(&ctx, &batch).unwrap();
                    let rg = rs[0].clone().unwrap();
                    rg.bindings().set("row", i as i64).unwrap();
                    rg.schedule().unwrap();
                    grads.push(rg);
                    merges.push(rs[1].clone().unwrap());
                    ctxs.push(ctx);
                }
                // Tree: round with stride 1 merges 1->0, 3->2; stride 2 merges 2->0.
                let mut stride = 1;
                while stride < n {
                    for to in (0..n).step_by(2 * stride) {
                        let from = to + stride;
                        if from < n {
                            b.await_device(&devs[from]).unwrap();
                            // Into the merge routine's context: it expects g.
                            assert!(b
                                .device_to_device(&g, mode, merges[to].context(), &ctxs[from])
                                .unwrap());
                            merges[to].schedule().unwrap();
                            // Streaming reads the source's buffer: keep it until merged.
                            b.await_device(&devs[to]).unwrap();
                        }
                    }
                    stride *= 2;
                }
                b.await_device(&devs[0]).unwrap();
                let mut host = Ndarray::zeros(Prec::Double, &[3]);
                b.buffer_to_host(&mut host, &ctxs[0].get_buffer(&g).unwrap())
                    .unwrap();
                let want: Vec<f64> = (0..3)
                    .map(|j| (0..n).map(|i| data[i * 3 + j]).sum())
                    .collect();
                assert_eq!(host.to_f64_vec(), want, "{} {mode:?}", b.name());
                if mode == MergeBufferUse::Copy {
                    assert!(devs[0].merge_storage_size().unwrap() >= 24);
                }
                sums.push(host.to_f64_vec());
                // A mismatched merge node fails at the call, naming both nodes.
                let other = on_device("other_node", &[3], Prec::Double);
                let oc = b
                    .compile(
                        true,
                        Some("other"),
                        &bind,
                        &Assignments::Fetch {
                            array: other.clone(),
                            fetch_op: FetchOp::Constant(1.0),
                        },
                    )
                    .unwrap();
                let ro = b.link(&[], &ctxs[1], &oc).unwrap();
                ro.schedule().unwrap();
                b.await_device(&devs[1]).unwrap();
                let err = b
                    .device_to_device(&other, mode, merges[0].context(), ro.context())
                    .unwrap_err()
                    .to_string();
                assert!(
                    err.contains("expected tensor g") && err.contains("actual tensor other_node"),
                    "{err}"
                );
                // As in the seed, the context downstream of the batch expects what the
                // context it was linked into expected (none): merging g into it fails too.
                assert_eq!(ctxs[0].expected_merge_node(), None);
                assert_eq!(merges[0].context().expected_merge_node(), Some(&g));
                let err = b
                    .device_to_device(&g, mode, &ctxs[0], &ctxs[1])
                    .unwrap_err()
                    .to_string();
                assert!(
                    err.contains("expected none") && err.contains("actual tensor g"),
                    "{err}"
                );
                // A node absent from the source is an error too.
                let err = b
                    .device_to_device(&other, mode, &ctxs[0], &ctxs[2])
                    .unwrap_err()
                    .to_string();
                assert!(err.contains("other_node"), "{err}");
                // A routine run with the wrong node in the merge buffer fails, naming both.
                devs[0]
                    .merge_buffer()
                    .set(ro.context().get_buffer(&other).unwrap(), other.clone());
                let err = match merges[0].schedule() {
                    Err(e) => e.to_string(),
                    Ok(()) => b.await_device(&devs[0]).unwrap_err().to_string(),
                };
                assert!(err.contains("other_node") && err.contains("merge"), "{err}");
                b.unsafe_cleanup();
            }
            assert_eq!(sums[0], sums[1]);
        }
    });
}

#[test]
fn a_panicking_task_is_reported_and_other_devices_keep_working() {
    with_watchdog(60, || {
        for b in backends() {
            let devs = devices(b.as_ref(), 2);
            let counter = Arc::new(AtomicUsize::new(0));
            let res = b.schedule(&devs[0], Task::new("exploding task", || panic!("boom")));
            if devs[0].has_worker() {
                res.unwrap();
                let err = b.await_device(&devs[0]).unwrap_err().to_string();
                assert!(
                    err.contains("exploding task") && err.contains("boom"),
                    "{err}"
                );
            } else {
                let err = res.unwrap_err().to_string();
                assert!(
                    err.contains("exploding task") && err.contains("boom"),
                    "{err}"
                );
            }
            // Reported once; the device works again.
            b.await_device(&devs[0]).unwrap();
            for d in &devs {
                let c = counter.clone();
                b.schedule(
                    d,
                    Task::new("count", move || {
                        c.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    }),
                )
                .unwrap();
                b.await_device(d).unwrap();
            }
            assert_eq!(counter.load(Ordering::SeqCst), 2);
            // An error returned by a task is reported by the next schedule as well.
            if devs[1].has_worker() {
                b.schedule(
                    &devs[1],
                    Task::new("failing task", || Err(arrayjit::Error::Usage("bad".into()))),
                )
                .unwrap();
                while !b.is_idle(&devs[1]) {
                    std::thread::yield_now();
                }
                let err = b
                    .schedule(&devs[1], Task::new("next", || Ok(())))
                    .unwrap_err()
                    .to_string();
                assert!(err.contains("failing task"), "{err}");
            }
            b.unsafe_cleanup();
        }
    });
}

#[test]
fn ten_thousand_tiny_tasks_per_device() {
    with_watchdog(120, || {
        for b in backends() {
            let n = 4;
            let devs = devices(b.as_ref(), n);
            let one = input("one", &[1], Prec::Double, &[1.0]);
            let acc = on_device("acc", &[1], Prec::Double);
            let bind = Bindings::empty();
            let code = b
                .compile(
                    true,
                    Some("inc"),
                    &bind,
                    &binop(
                        &acc,
                        Binop::Arg2,
                        false,
                        Binop::Add,
                        &acc,
                        &one,
                        "0,0->0",
                        &bind,
                    ),
                )
                .unwrap();
            let routines: Vec<Routine> = devs
                .iter()
                .map(|d| {
                    let r = b.link(&[], &b.init(d).unwrap(), &code).unwrap();
                    b.from_host(r.context(), &one).unwrap();
                    r
                })
                .collect();
            for _ in 0..10_000 {
                for r in &routines {
                    r.schedule().unwrap();
                }
            }
            for (d, r) in devs.iter().zip(&routines) {
                b.await_device(d).unwrap();
                let mut h = Ndarray::zeros(Prec::Double, &[1]);
                b.buffer_to_host(&mut h, &r.context().get_buffer(&acc).unwrap())
                    .unwrap();
                assert_eq!(h.to_f64_vec(), vec![10_000.0], "{}", d.name());
            }
            b.unsafe_cleanup();
        }
    });
}

#[test]
fn is_idle_reflects_queued_work() {
    with_watchdog(60, || {
        let b = MulticoreBackend::new();
        let devs = devices(&b, 1);
        let d = &devs[0];
        b.await_device(d).unwrap();
        assert!(b.is_idle(d));
        let (tx, rx) = mpsc::channel::<()>();
        b.schedule(
            d,
            Task::new("blocked", move || {
                rx.recv().ok();
                Ok(())
            }),
        )
        .unwrap();
        b.schedule(d, Task::new("behind", || Ok(()))).unwrap();
        assert!(!b.is_idle(d));
        tx.send(()).unwrap();
        b.await_device(d).unwrap();
        assert!(b.is_idle(d));
        println!("{}", sexp_of_device(d));
    });
}

#[test]
fn cleanup_then_initialize_again() {
    with_watchdog(60, || {
        for b in backends() {
            let devs = devices(b.as_ref(), 2);
            let x = input("x", &[2], Prec::Single, &[1., 2.]);
            let y = output("y", &[2], Prec::Single);
            let bind = Bindings::empty();
            let code = b
                .compile(
                    true,
                    Some("neg"),
                    &bind,
                    &unop(&y, Binop::Arg2, false, Unop::Neg, &x, "i->i", &bind),
                )
                .unwrap();
            let r = b.link(&[], &b.init(&devs[1]).unwrap(), &code).unwrap();
            b.unsafe_cleanup();
            assert!(!b.is_initialized());
            assert!(b.get_device(0).is_err());
            assert!(r.schedule().is_err(), "a released device must refuse work");
            b.initialize(Config::PhysicalDevicesOnly);
            // Devices and contexts from before the cleanup stay invalid after initializing
            // again: init, link and runs on them fail, naming the device.
            let stale = |e: arrayjit::Error| {
                let m = e.to_string();
                assert!(m.contains("released by unsafe_cleanup"), "{m}");
            };
            stale(b.init(&devs[1]).unwrap_err());
            stale(b.link(&[], r.context(), &code).unwrap_err());
            stale(r.run().unwrap_err());
            stale(b.from_host(r.context(), &x).unwrap_err());
            let d = b.new_virtual_device(&b.get_device(0).unwrap()).unwrap();
            assert_eq!(b.to_subordinal(&d), 0);
            let code = b
                .compile(
                    true,
                    Some("neg"),
                    &bind,
                    &unop(&y, Binop::Arg2, false, Unop::Neg, &x, "i->i", &bind),
                )
                .unwrap();
            let ctx = b.init(&d).unwrap();
            let r = b.link(&[], &ctx, &code).unwrap();
            assert!(b.from_host(r.context(), &x).unwrap());
            r.schedule().unwrap();
            assert!(b.to_host(r.context(), &y).unwrap());
            b.await_device(&d).unwrap();
            assert_eq!(y.host_values().unwrap(), vec![-1., -2.]);
            // Not hosted or not in context: false.
            let t = temp("t", &[2], Prec::Single);
            assert!(!b.from_host(r.context(), &t).unwrap());
            assert!(!b.to_host(&ctx, &y).unwrap());
            assert_eq!(b.get_ctx_device(r.context()).unwrap(), d);
            assert!(b.get_name(&d).starts_with(b.name()));
            let text = format!(
                "{} {} {}",
                sexp_of_routine(&r),
                sexp_of_code(&code),
                sexp_of_context(&ctx)
            );
            assert!(text.contains("neg") && text.contains('y'), "{text}");
            b.unsafe_cleanup();
        }
    });
}

/// `finalize` (as in the seed's device backends) awaits the context's device, then releases
/// the context: later links, host copies, transfers, runs and schedules of its routines
/// fail naming it; contexts derived from it are finalized with it. Also covers the seed
/// functions `get_physical_device`, `to_ordinal`, `sexp_of_buffer_ptr` and
/// `sexp_of_code_batch`.
#[test]
fn finalize_awaits_the_device_releases_the_context_and_rejects_later_use() {
    with_watchdog(60, || {
        for b in backends() {
            let devs = devices(b.as_ref(), 1);
            let d = &devs[0];
            let phys = b.get_physical_device(d);
            assert_eq!(b.to_ordinal(&phys), 0);
            assert_eq!(phys, b.get_device(0).unwrap());
            let x = input("x", &[4], Prec::Single, &[1., 2., 3., 4.]);
            let y = output("y", &[4], Prec::Single);
            let bind = Bindings::empty();
            let neg = unop(&y, Binop::Arg2, false, Unop::Neg, &x, "i->i", &bind);
            let names = vec!["neg".to_string()];
            let batch = b
                .compile_batch(true, Some(&names), None, &bind, std::slice::from_ref(&neg))
                .unwrap();
            let text = sexp_of_code_batch(&batch).to_string();
            assert!(text.contains("neg"), "{text}");
            let code = b.compile(true, Some("neg"), &bind, &neg).unwrap();
            let root = b.init(d).unwrap();
            let r = b.link(&[], &root, &code).unwrap();
            assert!(b.from_host(r.context(), &x).unwrap());
            let ybuf = r.context().get_buffer(&y).unwrap();
            let text = sexp_of_buffer_ptr(&ybuf).to_string();
            assert!(text.contains("16"), "{text}");
            // A slow task ahead of the routine: finalize must wait for both.
            let ran = Arc::new(AtomicUsize::new(0));
            let flag = ran.clone();
            b.schedule(
                d,
                Task::new("slow", move || {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    flag.store(1, Ordering::SeqCst);
                    Ok(())
                }),
            )
            .unwrap();
            r.schedule().unwrap();
            let held = Arc::strong_count(&ybuf);
            b.finalize(r.context());
            assert_eq!(
                ran.load(Ordering::SeqCst),
                1,
                "finalize did not await the device"
            );
            assert!(b.is_idle(d));
            // The routine ran before finalize returned.
            let mut host = Ndarray::zeros(Prec::Single, &[4]);
            b.buffer_to_host(&mut host, &ybuf).unwrap();
            assert_eq!(host.to_f64_vec(), vec![-1., -2., -3., -4.]);
            // The context dropped its buffers.
            assert_eq!(Arc::strong_count(&ybuf), held - 1);
            assert!(r.context().get_buffer(&y).is_none());
            let finalized = |e: arrayjit::Error| {
                assert!(
                    matches!(e.root(), arrayjit::Error::ContextFinalized { .. })
                        && e.to_string().contains("was finalized"),
                    "{e}"
                )
            };
            finalized(r.run().unwrap_err());
            finalized(r.schedule().unwrap_err());
            finalized(b.schedule(d, r.task()).unwrap_err());
            finalized(b.from_host(r.context(), &x).unwrap_err());
            finalized(b.to_host(r.context(), &y).unwrap_err());
            finalized(b.link(&[], r.context(), &code).unwrap_err());
            let other = b.link(&[], &root, &code).unwrap();
            finalized(
                b.device_to_device(&y, MergeBufferUse::No, other.context(), r.context())
                    .unwrap_err(),
            );
            // The root is still usable; finalizing it finalizes what descends from it.
            assert!(b.from_host(other.context(), &x).unwrap());
            other.schedule().unwrap();
            b.await_device(d).unwrap();
            b.finalize(&root);
            finalized(other.run().unwrap_err());
            finalized(b.link(&[], &root, &code).unwrap_err());
            b.await_device(d).unwrap();
            b.unsafe_cleanup();
        }
    });
}

/// As in the seed's multicore backend, a physical device runs one thing at a time: its
/// virtual devices share one worker thread and queue (tasks run in scheduling order across
/// them), while each keeps its own merge buffer, subordinal and failures. A device waiting
/// for another's event on the same queue does not deadlock.
#[test]
fn virtual_devices_of_a_core_share_its_worker() {
    with_watchdog(60, || {
        let b = MulticoreBackend::new();
        b.initialize(Config::default());
        let phys = b.get_device(0).unwrap();
        let devs: Vec<Device> = (0..8)
            .map(|_| b.new_virtual_device(&phys).unwrap())
            .collect();
        let subs: Vec<usize> = devs.iter().map(|d| b.to_subordinal(d)).collect();
        assert_eq!(subs, (0..8).collect::<Vec<_>>());
        let t = on_device("t", &[2], Prec::Single);
        devs[0]
            .merge_buffer()
            .set(arrayjit::backend::DeviceBuffer::new(8).unwrap(), t.clone());
        assert!(devs[0].merge_buffer().get().is_some());
        assert!(
            devs[1].merge_buffer().get().is_none(),
            "merge buffers are shared"
        );
        let log = Arc::new(std::sync::Mutex::new(vec![]));
        for round in 0..3 {
            for (i, d) in devs.iter().enumerate() {
                let log = log.clone();
                b.schedule(
                    d,
                    Task::new(format!("t{round}.{i}"), move || {
                        log.lock()
                            .unwrap()
                            .push((round * 8 + i, std::thread::current().id()));
                        Ok(())
                    }),
                )
                .unwrap();
            }
        }
        // Device 0 waits for device 7's event: 7's tasks were scheduled first on the queue.
        let ev = b.record_event(&devs[7]);
        b.wait_for_event(&devs[0], &ev).unwrap();
        b.await_device(&devs[0]).unwrap();
        let log = log.lock().unwrap().clone();
        let order: Vec<usize> = log.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            order,
            (0..24).collect::<Vec<_>>(),
            "not in scheduling order"
        );
        assert!(
            log.iter().all(|(_, t)| *t == log[0].1),
            "more than one thread"
        );
        assert_ne!(log[0].1, std::thread::current().id());
        // A failure is reported on its own device only.
        b.schedule(
            &devs[3],
            Task::new("fails", || Err(arrayjit::Error::Usage("boom".into()))),
        )
        .unwrap();
        b.await_device(&devs[3]).map(|_| ()).unwrap_err();
        for (i, d) in devs.iter().enumerate() {
            assert!(
                b.await_device(d).is_ok(),
                "device {i} got device 3's failure"
            );
        }
        b.unsafe_cleanup();
    });
}

/// The device layer tracks hazards between devices for the work it schedules: a copy from a
/// device waits for the source's pending writes (read after write), and a routine that
/// overwrites a buffer waits for another device's pending copy of it (write after read), with
/// no await or event from the caller. Blocker tasks hold the devices back so that, without
/// the tracking, the copy would run before its source was written and the overwrite before
/// the copy.
#[test]
fn transfers_and_routines_are_ordered_across_devices_without_awaits() {
    with_watchdog(60, || {
        let b = MulticoreBackend::new();
        let devs = devices(&b, 2);
        let a = input("a", &[3], Prec::Single, &[1., 2., 3.]);
        let two = input("two", &[1], Prec::Single, &[2.]);
        let x = on_device("x", &[3], Prec::Single);
        let y = output("y", &[3], Prec::Single);
        let bind = Bindings::empty();
        let fill = binop(
            &x,
            Binop::Arg2,
            false,
            Binop::Mul,
            &a,
            &two,
            "i,0->i",
            &bind,
        );
        let use_x = unop(&y, Binop::Arg2, false, Unop::Identity, &x, "i->i", &bind);
        let fill = b.compile(true, Some("fill"), &bind, &fill).unwrap();
        let use_x = b.compile(true, Some("use_x"), &bind, &use_x).unwrap();
        let ra = b.link(&[], &b.init(&devs[0]).unwrap(), &fill).unwrap();
        let rb = b.link(&[], &b.init(&devs[1]).unwrap(), &use_x).unwrap();
        assert!(b.from_host(ra.context(), &a).unwrap());
        assert!(b.from_host(ra.context(), &two).unwrap());
        let blocker = |d: &Device| {
            let (tx, rx) = mpsc::channel::<()>();
            b.schedule(
                d,
                Task::new("blocker", move || {
                    rx.recv().ok();
                    Ok(())
                }),
            )
            .unwrap();
            tx
        };
        // Read after write: device 0 is held back before computing x; the copy to device 1 is
        // scheduled at once.
        let hold0 = blocker(&devs[0]);
        ra.schedule().unwrap();
        assert!(b
            .device_to_device(&x, MergeBufferUse::No, rb.context(), ra.context())
            .unwrap());
        rb.schedule().unwrap();
        assert!(b.to_host(rb.context(), &y).unwrap());
        // Device 1 has had ample time to copy; it must still be waiting for device 0.
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!b.is_idle(&devs[1]), "the copy did not wait for its source");
        hold0.send(()).unwrap();
        b.await_device(&devs[1]).unwrap();
        assert_eq!(y.host_values().unwrap(), vec![2., 4., 6.]);
        // Write after read: device 1 is held back before copying x; device 0 then recomputes
        // x from new inputs, which must wait for the copy.
        let hold1 = blocker(&devs[1]);
        assert!(b
            .device_to_device(&x, MergeBufferUse::No, rb.context(), ra.context())
            .unwrap());
        a.set_host_values(&[10., 20., 30.]).unwrap();
        assert!(b.from_host(ra.context(), &a).unwrap());
        ra.schedule().unwrap();
        rb.schedule().unwrap();
        assert!(b.to_host(rb.context(), &y).unwrap());
        // Device 0 cannot have overwritten x yet: it waits for device 1's copy.
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(
            !b.is_idle(&devs[0]),
            "the overwrite did not wait for the copy"
        );
        hold1.send(()).unwrap();
        b.await_device(&devs[1]).unwrap();
        b.await_device(&devs[0]).unwrap();
        assert_eq!(y.host_values().unwrap(), vec![2., 4., 6.]);
        // And the next copy sees the new values.
        assert!(b
            .device_to_device(&x, MergeBufferUse::No, rb.context(), ra.context())
            .unwrap());
        rb.schedule().unwrap();
        assert!(b.to_host(rb.context(), &y).unwrap());
        b.await_device(&devs[1]).unwrap();
        assert_eq!(y.host_values().unwrap(), vec![20., 40., 60.]);
        b.unsafe_cleanup();
    });
}

#[test]
fn device_counts_follow_config() {
    let m = MulticoreBackend::new();
    m.initialize(Config::ForParallelCopying);
    let expected = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(m.num_physical_devices(), expected);
    let p = m.get_device(0).unwrap();
    assert_eq!(m.suggested_num_virtual_devices(&p), 2);
    assert!(m.get_device(expected).is_err());
    let s = SyncBackend::new();
    s.initialize(Config::MostParallelDevices);
    assert_eq!(s.num_physical_devices(), 1);
    let p = s.get_device(0).unwrap();
    for i in 0..5 {
        assert_eq!(s.to_subordinal(&s.new_virtual_device(&p).unwrap()), i);
    }
}

/// A task that records `tag` in `log`.
fn log_task(log: &Arc<std::sync::Mutex<Vec<String>>>, tag: String) -> Task {
    let log = log.clone();
    Task::new(tag.clone(), move || {
        log.lock().unwrap().push(tag);
        Ok(())
    })
}

#[test]
fn events_order_work_across_devices_without_the_host_waiting() {
    with_watchdog(60, || {
        for b in backends() {
            let devs = devices(b.as_ref(), 2);
            let value = Arc::new(AtomicUsize::new(0));
            let seen = Arc::new(AtomicUsize::new(usize::MAX));
            for round in 1..=20usize {
                // Device 0 writes late; device 1 reads after waiting for device 0's event.
                let v = value.clone();
                b.schedule(
                    &devs[0],
                    Task::new("slow writer", move || {
                        std::thread::sleep(std::time::Duration::from_micros(200));
                        v.store(round, Ordering::SeqCst);
                        Ok(())
                    }),
                )
                .unwrap();
                let ev = b.record_event(&devs[0]);
                b.wait_for_event(&devs[1], &ev).unwrap();
                let (v, s) = (value.clone(), seen.clone());
                b.schedule(
                    &devs[1],
                    Task::new("reader", move || {
                        s.store(v.load(Ordering::SeqCst), Ordering::SeqCst);
                        Ok(())
                    }),
                )
                .unwrap();
                // Only device 1 is awaited: the event made it wait for device 0.
                b.await_device(&devs[1]).unwrap();
                assert_eq!(seen.load(Ordering::SeqCst), round, "{}", b.name());
                assert!(ev.is_complete());
            }
            b.unsafe_cleanup();
        }
    });
}

#[test]
fn events_chain_many_devices_in_order() {
    with_watchdog(120, || {
        for b in backends() {
            let n = 8;
            let devs = devices(b.as_ref(), n);
            let log = Arc::new(std::sync::Mutex::new(vec![]));
            let rounds = 300;
            // A token passed around the ring: device i runs its part of round r only after
            // device i-1 did (round r) — the log must be in exactly that order.
            let mut last: Option<Event> = None;
            for r in 0..rounds {
                for (i, d) in devs.iter().enumerate() {
                    if let Some(ev) = &last {
                        b.wait_for_event(d, ev).unwrap();
                    }
                    b.schedule(d, log_task(&log, format!("{r}:{i}"))).unwrap();
                    last = Some(b.record_event(d));
                }
            }
            b.await_event(last.as_ref().unwrap()).unwrap();
            let want: Vec<String> = (0..rounds)
                .flat_map(|r| (0..n).map(move |i| format!("{r}:{i}")))
                .collect();
            assert_eq!(*log.lock().unwrap(), want, "{}", b.name());
            b.unsafe_cleanup();
        }
    });
}

#[test]
fn an_event_after_a_failure_completes_and_the_failure_is_reported_once() {
    with_watchdog(60, || {
        for b in backends() {
            let devs = devices(b.as_ref(), 2);
            let res = b.schedule(&devs[0], Task::new("exploding task", || panic!("boom")));
            if !devs[0].has_worker() {
                // The sync backend runs the task at once and reports it right away.
                assert!(res.unwrap_err().to_string().contains("boom"));
                b.unsafe_cleanup();
                continue;
            }
            res.unwrap();
            let ev = b.record_event(&devs[0]);
            // Device 1 waits for it and still runs: no hang.
            b.wait_for_event(&devs[1], &ev).unwrap();
            let ran = Arc::new(AtomicUsize::new(0));
            let r = ran.clone();
            b.schedule(
                &devs[1],
                Task::new("after the wait", move || {
                    r.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }),
            )
            .unwrap();
            b.await_device(&devs[1]).unwrap();
            assert_eq!(ran.load(Ordering::SeqCst), 1);
            // Waiting for the event inside a task did not take device 0's error: the host's
            // await of the event reports it, once.
            let err = b.await_event(&ev).unwrap_err().to_string();
            assert!(
                err.contains("exploding task") && err.contains("boom"),
                "{err}"
            );
            b.await_device(&devs[0]).unwrap();
            b.await_event(&ev).unwrap();
            // A failure is also reported by the next wait_for_event on the failed device.
            b.schedule(
                &devs[1],
                Task::new("failing task", || Err(arrayjit::Error::Usage("bad".into()))),
            )
            .unwrap();
            while !b.is_idle(&devs[1]) {
                std::thread::yield_now();
            }
            let err = b
                .wait_for_event(&devs[1], &b.record_event(&devs[0]))
                .unwrap_err()
                .to_string();
            assert!(err.contains("failing task"), "{err}");
            b.unsafe_cleanup();
        }
    });
}

#[test]
fn waiting_for_an_event_of_the_same_device_does_not_deadlock() {
    with_watchdog(60, || {
        for b in backends() {
            let devs = devices(b.as_ref(), 1);
            let d = &devs[0];
            let log = Arc::new(std::sync::Mutex::new(vec![]));
            for i in 0..100 {
                b.schedule(d, log_task(&log, format!("{i}"))).unwrap();
                let ev = b.record_event(d);
                b.wait_for_event(d, &ev).unwrap();
            }
            b.await_device(d).unwrap();
            assert_eq!(log.lock().unwrap().len(), 100);
            b.unsafe_cleanup();
        }
    });
}

#[test]
fn cleanup_drains_queues_with_pending_cross_device_waits() {
    with_watchdog(60, || {
        let b = MulticoreBackend::new();
        let devs = devices(&b, 4);
        let count = Arc::new(AtomicUsize::new(0));
        for _ in 0..200 {
            for (i, d) in devs.iter().enumerate() {
                let ev = b.record_event(&devs[(i + 1) % devs.len()]);
                b.wait_for_event(d, &ev).unwrap();
                let c = count.clone();
                b.schedule(
                    d,
                    Task::new("count", move || {
                        c.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    }),
                )
                .unwrap();
            }
        }
        let ev = b.record_event(&devs[3]);
        // No await: cleanup lets every worker finish its queue, then joins it.
        b.unsafe_cleanup();
        assert_eq!(count.load(Ordering::SeqCst), 800);
        assert!(ev.is_complete());
        for d in &devs {
            assert!(!d.has_worker());
            assert!(b.await_device(d).is_err(), "a released device reports it");
            assert!(b.wait_for_event(d, &ev).is_err());
        }
    });
}

#[test]
fn a_full_queue_blocks_the_scheduler_until_there_is_room() {
    with_watchdog(60, || {
        let b = Arc::new(MulticoreBackend::new());
        let devs = devices(b.as_ref(), 1);
        let d = devs[0].clone();
        let (tx, rx) = mpsc::channel::<()>();
        b.schedule(
            &d,
            Task::new("blocked", move || {
                rx.recv().ok();
                Ok(())
            }),
        )
        .unwrap();
        let scheduled = Arc::new(AtomicUsize::new(0));
        let (b2, d2, s2) = (b.clone(), d.clone(), scheduled.clone());
        let producer = std::thread::spawn(move || {
            for _ in 0..device::QUEUE_CAPACITY + 10 {
                b2.schedule(&d2, Task::new("empty", || Ok(()))).unwrap();
                s2.fetch_add(1, Ordering::SeqCst);
            }
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        // The blocked task counts toward the capacity.
        assert_eq!(scheduled.load(Ordering::SeqCst), device::QUEUE_CAPACITY - 1);
        assert_eq!(d.pending(), device::QUEUE_CAPACITY);
        tx.send(()).unwrap();
        producer.join().unwrap();
        b.await_device(&d).unwrap();
        assert!(b.is_idle(&d));
        b.unsafe_cleanup();
    });
}

#[test]
fn prepared_transfers_check_like_device_to_device_and_run_again() {
    with_watchdog(60, || {
        for b in backends() {
            let devs = devices(b.as_ref(), 2);
            let bind = Bindings::empty();
            let x = input("x", &[3], Prec::Single, &[1., 2., 3.]);
            let g = output("g", &[3], Prec::Single);
            let other = on_device("other", &[3], Prec::Single);
            // g = x (a "gradient"), and a merge routine g = g + merge(g).
            let fill = b
                .compile(
                    true,
                    Some("fill"),
                    &bind,
                    &unop(&g, Binop::Arg2, false, Unop::Identity, &x, "i->i", &bind),
                )
                .unwrap();
            let merge = b
                .compile(true, Some("merge"), &bind, &arrayjit::nn::merge_add(&g))
                .unwrap();
            let rs: Vec<(Routine, Routine)> = devs
                .iter()
                .map(|d| {
                    let f = b.link(&[], &b.init(d).unwrap(), &fill).unwrap();
                    let m = b.link(&[], f.context(), &merge).unwrap();
                    b.from_host(f.context(), &x).unwrap();
                    f.schedule().unwrap();
                    b.await_device(d).unwrap();
                    (f, m)
                })
                .collect();
            let (dst, src) = (rs[0].1.context(), rs[1].1.context());
            // The same errors and `false` as device_to_device.
            for mode in [MergeBufferUse::Streaming, MergeBufferUse::Copy] {
                let e = b.prepare_transfer(&other, mode, dst, src).err().unwrap();
                assert!(
                    e.to_string().contains("is not in context")
                        && e.to_string().contains("the source context"),
                    "{e}"
                );
                let e2 = b.device_to_device(&other, mode, dst, src).err().unwrap();
                assert_eq!(e.to_string(), e2.to_string());
            }
            assert!(b
                .prepare_transfer(&other, MergeBufferUse::No, dst, src)
                .unwrap()
                .is_none());
            assert!(!b
                .device_to_device(&other, MergeBufferUse::No, dst, src)
                .unwrap());
            for mode in [MergeBufferUse::Streaming, MergeBufferUse::Copy] {
                let t = b.prepare_transfer(&g, mode, dst, src).unwrap().unwrap();
                assert_eq!(t.device(), &devs[0]);
                assert!(t.description().contains("device_to_device"));
                // Run it three times, each followed by the merge: g0 = x + 3 x.
                rs[0].0.schedule().unwrap();
                for _ in 0..3 {
                    t.schedule().unwrap();
                    rs[0].1.schedule().unwrap();
                }
                b.await_device(&devs[0]).unwrap();
                let mut h = Ndarray::zeros(Prec::Single, &[3]);
                b.buffer_to_host(&mut h, &dst.get_buffer(&g).unwrap())
                    .unwrap();
                assert_eq!(h.to_f64_vec(), vec![4., 8., 12.], "{} {mode:?}", b.name());
            }
            // `No` copies into the destination's own buffer, run inside a task of its own.
            let t = b
                .prepare_transfer(&g, MergeBufferUse::No, dst, src)
                .unwrap()
                .unwrap();
            b.schedule(&devs[0], t.task()).unwrap();
            b.await_device(&devs[0]).unwrap();
            let mut h = Ndarray::zeros(Prec::Single, &[3]);
            b.buffer_to_host(&mut h, &dst.get_buffer(&g).unwrap())
                .unwrap();
            assert_eq!(h.to_f64_vec(), vec![1., 2., 3.]);
            b.unsafe_cleanup();
        }
    });
}

#[cfg(not(feature = "mpi"))]
#[test]
fn backend_mpi_without_the_feature_is_a_clear_error() {
    let err = backend_by_name("mpi").err().expect("no MPI in this build");
    assert!(matches!(err, arrayjit::Error::MpiNotBuilt), "{err}");
    assert!(err.to_string().contains("--features mpi"), "{err}");
}

#[test]
fn all_reduce_sums_over_in_process_devices_in_every_precision() {
    for backend in [
        Box::new(MulticoreBackend::new()) as Box<dyn Backend>,
        Box::new(SyncBackend::new()),
    ] {
        backend.initialize(Config::default());
        for (prec, values, want) in [
            (Prec::Single, [1.5, -2.0, 4.0], vec![4.5, -6.0, 12.0]),
            (
                Prec::Double,
                [0.1, 0.2, 0.3],
                vec![0.1 + 0.1 + 0.1, 0.6000000000000001, 0.8999999999999999],
            ),
            (Prec::Half, [0.5, 1.0, 1.5], vec![1.5, 3.0, 4.5]),
            (Prec::Byte, [100.0, 200.0, 255.0], vec![44.0, 88.0, 253.0]),
        ] {
            let g = Tnode::hosted(&["g"], &[3], prec).unwrap();
            let out = Tnode::hosted(&["out"], &[3], prec).unwrap();
            let code = backend
                .compile(
                    true,
                    Some("touch"),
                    &Bindings(vec![]),
                    &arrayjit::nn::scale(&out, &g, 1.0).unwrap(),
                )
                .unwrap();
            let mut ctxs = vec![];
            let mut devices = vec![];
            for _ in 0..3 {
                let d = backend
                    .new_virtual_device(&backend.get_device(0).unwrap())
                    .unwrap();
                let root = backend.init(&d).unwrap();
                let r = backend.link(&[], &root, &code).unwrap();
                g.set_host_values(&values).unwrap();
                backend.from_host(r.context(), &g).unwrap();
                backend.await_device(&d).unwrap();
                ctxs.push(r.context().clone());
                devices.push(d);
            }
            backend.all_reduce(std::slice::from_ref(&g), &ctxs).unwrap();
            for (d, c) in devices.iter().zip(&ctxs) {
                backend.to_host(c, &g).unwrap();
                backend.await_device(d).unwrap();
                assert_eq!(
                    g.host_values().unwrap(),
                    want,
                    "{} {prec:?}",
                    backend.name()
                );
            }
            // The same device twice, and a context without the tensor, are errors.
            let e = backend.all_reduce(
                std::slice::from_ref(&g),
                &[ctxs[0].clone(), ctxs[0].clone()],
            );
            assert!(e.unwrap_err().to_string().contains("is given twice"));
            let bare = backend.init(&devices[1]).unwrap();
            let e = backend.all_reduce(std::slice::from_ref(&g), &[ctxs[0].clone(), bare]);
            assert!(e
                .unwrap_err()
                .to_string()
                .contains("the tensor is not in context"));
        }
        backend.unsafe_cleanup();
    }
}

/// `Task::then` runs both works in order as one task, skips the second when the first fails
/// (the error names both), and checks both preconditions when scheduled.
#[test]
fn chained_tasks_run_in_order_and_stop_at_the_first_failure() {
    let b = MulticoreBackend::new();
    b.initialize(Config::default());
    let d = b.new_virtual_device(&b.get_device(0).unwrap()).unwrap();
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (l1, l2) = (log.clone(), log.clone());
    let chained = Task::new("first", move || {
        l1.lock().unwrap().push(1);
        Ok(())
    })
    .then(Task::new("second", move || {
        l2.lock().unwrap().push(2);
        Ok(())
    }));
    assert_eq!(&*chained.description, "first, then second");
    b.schedule(&d, chained).unwrap();
    b.await_device(&d).unwrap();
    assert_eq!(*log.lock().unwrap(), vec![1, 2]);

    let l3 = log.clone();
    let failing = Task::new("fails", || Err(arrayjit::Error::Usage("boom".into()))).then(
        Task::new("never", move || {
            l3.lock().unwrap().push(3);
            Ok(())
        }),
    );
    b.schedule(&d, failing).unwrap();
    let err = b.await_device(&d).unwrap_err().to_string();
    assert!(
        err.contains("fails, then never") && err.contains("boom"),
        "{err}"
    );
    assert_eq!(*log.lock().unwrap(), vec![1, 2]);

    let refused = Task::new("a", || Ok(())).then(
        Task::new("b", || Ok(()))
            .with_precondition(|| Err(arrayjit::Error::Usage("not now".into()))),
    );
    let err = b.schedule(&d, refused).unwrap_err().to_string();
    assert!(err.contains("not now"), "{err}");
}

/// Holds `d`'s queue until the returned sender sends (or is dropped): `None` on the sync
/// backend, where the task would run, and block, at once.
fn hold(b: &dyn Backend, d: &Device) -> Option<mpsc::Sender<()>> {
    if b.name() == "sync" {
        return None;
    }
    let (tx, rx) = mpsc::channel::<()>();
    b.schedule(
        d,
        Task::new("hold", move || {
            rx.recv().ok();
            Ok(())
        }),
    )
    .unwrap();
    Some(tx)
}

/// Every hazard on a host array, made to happen by holding a device back: the host copies give
/// the values of running them in scheduling order (the values the sync backend gives), however
/// long their devices take. Returns what device A read each time and the host array at the
/// end of each phase.
fn host_copies_in_scheduling_order(b: &dyn Backend) -> Vec<Vec<f64>> {
    let devs = devices(b, 2);
    let (da, db) = (&devs[0], &devs[1]);
    let x = input("x", &[3], Prec::Single, &[1., 2., 3.]);
    let c = input("c", &[3], Prec::Single, &[10., 20., 30.]);
    let y = output("y", &[3], Prec::Single);
    let bind = Bindings::empty();
    let use_x = unop(&y, Binop::Arg2, false, Unop::Identity, &x, "i->i", &bind);
    let set_x = unop(&x, Binop::Arg2, false, Unop::Identity, &c, "i->i", &bind);
    let use_x = b.compile(true, Some("use_x"), &bind, &use_x).unwrap();
    let set_x = b.compile(true, Some("set_x"), &bind, &set_x).unwrap();
    let ra = b.link(&[], &b.init(da).unwrap(), &use_x).unwrap();
    let rb = b.link(&[], &b.init(db).unwrap(), &set_x).unwrap();
    assert!(b.from_host(rb.context(), &c).unwrap());
    let multicore = b.name() != "sync";
    let still_waits = |d: &Device, what: &str| {
        if multicore {
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(!b.is_idle(d), "{what}");
        }
    };
    let mut seen = vec![];

    // 1. from_host, then the host array is overwritten (by another device's to_host, then by
    // the user) before the from_host runs: the device gets the value at the call.
    let hold_a = hold(b, da);
    assert!(b.from_host(ra.context(), &x).unwrap());
    rb.schedule().unwrap();
    assert!(b.to_host(rb.context(), &x).unwrap());
    b.await_device(db).unwrap();
    assert_eq!(x.host_values().unwrap(), vec![10., 20., 30.]);
    x.set_host_values(&[7., 8., 9.]).unwrap();
    drop(hold_a);
    ra.schedule().unwrap();
    assert!(b.to_host(ra.context(), &y).unwrap());
    b.await_device(da).unwrap();
    seen.push(y.host_values().unwrap());
    seen.push(x.host_values().unwrap());

    // 2. to_host from device B (held back), then from_host to device A: A gets what the
    // to_host writes, not what B computes after it.
    let hold_b = hold(b, db);
    assert!(b.to_host(rb.context(), &x).unwrap());
    assert!(b.from_host(ra.context(), &x).unwrap());
    c.set_host_values(&[100., 200., 300.]).unwrap();
    assert!(b.from_host(rb.context(), &c).unwrap());
    rb.schedule().unwrap();
    ra.schedule().unwrap();
    assert!(b.to_host(ra.context(), &y).unwrap());
    still_waits(da, "the from_host did not wait for the to_host before it");
    drop(hold_b);
    b.await_device(da).unwrap();
    b.await_device(db).unwrap();
    seen.push(y.host_values().unwrap());
    seen.push(x.host_values().unwrap());

    // 3. to_host from B (held back), then to_host from A: the later one's value stays.
    let hold_b = hold(b, db);
    assert!(b.to_host(rb.context(), &x).unwrap());
    assert!(b.to_host(ra.context(), &x).unwrap());
    still_waits(da, "the to_host did not wait for the to_host before it");
    drop(hold_b);
    b.await_device(da).unwrap();
    b.await_device(db).unwrap();
    seen.push(x.host_values().unwrap());
    b.unsafe_cleanup();
    seen
}

#[test]
fn host_copies_give_the_values_of_scheduling_order_whatever_the_timing() {
    with_watchdog(60, || {
        let want: Vec<Vec<f64>> = vec![
            // 1: A read x at its from_host; the host holds the user's values.
            vec![1., 2., 3.],
            vec![7., 8., 9.],
            // 2: A read B's x as of the to_host; the host holds it.
            vec![10., 20., 30.],
            vec![10., 20., 30.],
            // 3: A's x (the last to_host) is on the host, not B's newer one.
            vec![10., 20., 30.],
        ];
        let sync = host_copies_in_scheduling_order(&SyncBackend::new());
        assert_eq!(sync, want, "sync");
        for pin in [true, false] {
            let b = MulticoreBackend::new().with_pinning(pin);
            assert_eq!(
                host_copies_in_scheduling_order(&b),
                want,
                "multicore, pinned: {pin}"
            );
        }
    });
}

/// The issue's scenario as a program of the `arrayjit` command line: device 0 computes
/// something slow, its `from_host` of x is queued behind it, and meanwhile device 1 computes
/// a new x and copies it to the host (the command line awaits device 1 after a `to_host`).
/// Device 0 must still upload x as it was when its `from_host` was scheduled: y = 1, as
/// `--interpret` and the sync backend give, on every run.
#[test]
fn a_queued_from_host_uploads_the_host_value_of_its_step_in_a_program() {
    let Some(bin) = option_env!("CARGO_BIN_EXE_arrayjit") else {
        return; // built without the command line (feature `cli`)
    };
    with_watchdog(300, move || {
        let dir = tempfile::tempdir().unwrap();
        // The interpreter takes the slow routine's n³ literally: a small n there.
        let program = |backend: &str, n: usize| {
            format!(
                r#"{{
  "devices": 2,
  "backend": "{backend}",
  "tensors": [
    {{"name": "x", "dims": [1], "init": {{"values": [1]}}}},
    {{"name": "c", "dims": [1], "init": {{"values": [2]}}}},
    {{"name": "y", "dims": [1]}},
    {{"name": "a", "dims": [{n}, {n}], "init": "range"}},
    {{"name": "s", "dims": [{n}, {n}]}}
  ],
  "routines": [
    {{"name": "slow", "code": [{{"assign": "s", "accum": "add", "init_neutral": true,
      "op": "mul", "args": ["a", "a"], "logic": "ij,jk->ik"}}]}},
    {{"name": "set_x", "code": [{{"assign": "x", "op": "identity", "args": ["c"]}}]}},
    {{"name": "use_x", "code": [{{"assign": "y", "op": "identity", "args": ["x"]}}]}}
  ],
  "run": [
    {{"routine": "slow", "device": 0}},
    {{"from_host": "x", "device": 0}},
    {{"routine": "set_x", "device": 1}},
    {{"to_host": "x", "device": 1}},
    {{"routine": "use_x", "device": 0}},
    {{"await": "all"}}
  ],
  "print": ["y"]
}}"#
            )
        };
        let run = |backend: &str, args: &[&str], pin: &str| {
            let file = dir.path().join(format!("{backend}.json"));
            let n = if args.is_empty() { 384 } else { 8 };
            std::fs::write(&file, program(backend, n)).unwrap();
            let out = std::process::Command::new(bin)
                .arg("run")
                .args(args)
                .arg(&file)
                .env("ARRAYJIT_PIN_WORKERS", pin)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{backend} {args:?}: {stderr}");
            let stdout: String = String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .collect();
            assert_eq!(
                stdout, r#"{"y":{"dims":[1],"prec":"single","values":[1]}}"#,
                "{backend} {args:?}, ARRAYJIT_PIN_WORKERS={pin}"
            );
        };
        run("multicore", &["--interpret"], "1");
        run("sync", &[], "1");
        for _ in 0..3 {
            for pin in ["1", "0"] {
                run("multicore", &[], pin);
            }
        }
    });
}

/// The same on two virtual devices of one core (one queue): a `from_host` after a `to_host`
/// of the same host array uploads what the `to_host` writes, not what the device computes
/// after it; and `from_host` on an idle device (copied at once, without a task) still reports
/// an earlier failure on the device first.
#[test]
fn host_copies_between_virtual_devices_of_one_core_follow_scheduling_order() {
    with_watchdog(60, || {
        let b = MulticoreBackend::new();
        b.initialize(Config::default());
        let p = b.get_device(0).unwrap();
        let (d0, d1) = (
            b.new_virtual_device(&p).unwrap(),
            b.new_virtual_device(&p).unwrap(),
        );
        let x = input("x", &[3], Prec::Single, &[1., 2., 3.]);
        let c = input("c", &[3], Prec::Single, &[10., 20., 30.]);
        let y = output("y", &[3], Prec::Single);
        let bind = Bindings::empty();
        let set_x = unop(&x, Binop::Arg2, false, Unop::Identity, &c, "i->i", &bind);
        let use_x = unop(&y, Binop::Arg2, false, Unop::Identity, &x, "i->i", &bind);
        let set_x = b.compile(true, Some("set_x"), &bind, &set_x).unwrap();
        let use_x = b.compile(true, Some("use_x"), &bind, &use_x).unwrap();
        let r0 = b.link(&[], &b.init(&d0).unwrap(), &set_x).unwrap();
        let r1 = b.link(&[], &b.init(&d1).unwrap(), &use_x).unwrap();
        assert!(b.from_host(r0.context(), &c).unwrap());
        let held = hold(&b, &d0);
        r0.schedule().unwrap();
        assert!(b.to_host(r0.context(), &x).unwrap());
        assert!(b.from_host(r1.context(), &x).unwrap());
        c.set_host_values(&[100., 200., 300.]).unwrap();
        assert!(b.from_host(r0.context(), &c).unwrap());
        r0.schedule().unwrap();
        r1.schedule().unwrap();
        assert!(b.to_host(r1.context(), &y).unwrap());
        drop(held);
        b.await_device(&d1).unwrap();
        b.await_device(&d0).unwrap();
        assert_eq!(y.host_values().unwrap(), vec![10., 20., 30.]);
        assert_eq!(x.host_values().unwrap(), vec![10., 20., 30.]);
        b.schedule(
            &d1,
            Task::new("failing task", || {
                Err(arrayjit::Error::Usage("failed on purpose".into()))
            }),
        )
        .unwrap();
        while !b.is_idle(&d1) {
            std::thread::yield_now();
        }
        let e = b.from_host(r1.context(), &x).unwrap_err().to_string();
        assert!(
            e.contains("failing task") && e.contains("on purpose"),
            "{e}"
        );
        assert!(b.from_host(r1.context(), &x).unwrap());
        b.await_device(&d1).unwrap();
        b.unsafe_cleanup();
    });
}

/// The precisions of SPEC 9.1 all-reduce exactly: integers wrap into their width (summed
/// modulo 2^64, then truncated, which is the sum modulo 2^bits), and bfloat16 and fp8 are
/// summed in single precision, then rounded once to nearest even. Three devices hold the same
/// values, so every expected value is three times the value, by hand.
#[test]
fn all_reduce_sums_the_wider_precisions_exactly() {
    fn reduce3(backend: &dyn Backend, prec: Prec, set: impl Fn(&Tnode), get: impl Fn(&Tnode)) {
        let g = Tnode::hosted(&["g"], &[3], prec).unwrap();
        let out = Tnode::hosted(&["out"], &[3], prec).unwrap();
        let code = backend
            .compile(
                true,
                Some("touch"),
                &Bindings(vec![]),
                &arrayjit::nn::scale(&out, &g, 1.0).unwrap(),
            )
            .unwrap();
        let mut ctxs = vec![];
        let mut devices = vec![];
        for _ in 0..3 {
            let d = backend
                .new_virtual_device(&backend.get_device(0).unwrap())
                .unwrap();
            let root = backend.init(&d).unwrap();
            let r = backend.link(&[], &root, &code).unwrap();
            set(&g);
            backend.from_host(r.context(), &g).unwrap();
            backend.await_device(&d).unwrap();
            ctxs.push(r.context().clone());
            devices.push(d);
        }
        backend.all_reduce(std::slice::from_ref(&g), &ctxs).unwrap();
        for (d, c) in devices.iter().zip(&ctxs) {
            set(&g); // overwritten by the download
            backend.to_host(c, &g).unwrap();
            backend.await_device(d).unwrap();
            get(&g);
        }
    }
    for backend in [
        Box::new(MulticoreBackend::new()) as Box<dyn Backend>,
        Box::new(SyncBackend::new()),
    ] {
        backend.initialize(Config::default());
        let b = &*backend;
        reduce3(
            b,
            Prec::Int32,
            |g| g.set_host_slice(&[i32::MAX, -5, 7]).unwrap(),
            // 3 · (2^31 - 1) = 2^32 + 2^31 - 3, which wraps to 2^31 - 3.
            |g| assert_eq!(g.host_to_vec::<i32>().unwrap(), [i32::MAX - 2, -15, 21]),
        );
        reduce3(
            b,
            Prec::Uint16,
            |g| g.set_host_slice(&[65535u16, 40000, 1]).unwrap(),
            // 196605 - 2·65536 = 65533; 120000 - 65536 = 54464.
            |g| assert_eq!(g.host_to_vec::<u16>().unwrap(), [65533, 54464, 3]),
        );
        reduce3(
            b,
            Prec::Uint32,
            |g| g.set_host_slice(&[u32::MAX, 3_000_000_000, 0]).unwrap(),
            // 9·10^9 - 2·2^32 = 410065408.
            |g| {
                assert_eq!(
                    g.host_to_vec::<u32>().unwrap(),
                    [u32::MAX - 2, 410_065_408, 0]
                )
            },
        );
        reduce3(
            b,
            Prec::Int64,
            |g| {
                g.set_host_slice(&[i64::MIN, 9_007_199_254_740_993, -1])
                    .unwrap()
            },
            // 3 · -2^63 = -2^63 modulo 2^64; 2^53 + 1 times 3 is exact (no rounding through
            // a double).
            |g| {
                assert_eq!(
                    g.host_to_vec::<i64>().unwrap(),
                    [i64::MIN, 27_021_597_764_222_979, -3]
                )
            },
        );
        reduce3(
            b,
            Prec::Uint64,
            |g| g.set_host_slice(&[u64::MAX, 1 << 63, 3]).unwrap(),
            |g| assert_eq!(g.host_to_vec::<u64>().unwrap(), [u64::MAX - 2, 1 << 63, 9]),
        );
        // bfloat16: 3 · 85.5 = 256.5 rounds to 256 (the spacing is 2 there).
        reduce3(
            b,
            Prec::Bfloat16,
            |g| g.set_host_values(&[1.0, 85.5, -3.0]).unwrap(),
            |g| assert_eq!(g.host_values().unwrap(), [3.0, 256.0, -9.0]),
        );
        // fp8 (E5M2, 2 mantissa bits): 3 · 0.75 = 2.25, halfway between 2 and 2.5: to even, 2.
        reduce3(
            b,
            Prec::Fp8,
            |g| g.set_host_values(&[1.0, 0.75, -2.0]).unwrap(),
            |g| assert_eq!(g.host_values().unwrap(), [3.0, 2.0, -6.0]),
        );
        backend.unsafe_cleanup();
    }
}
