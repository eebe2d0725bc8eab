//! Device-layer costs: scheduling throughput (empty tasks), the await round trip (schedule an
//! empty task, await it), a cross-device event hop (one device waits for another's event),
//! and a device_to_device copy versus a plain memcpy of the same bytes (the baseline, measured
//! in the same process), and host copies: `from_host` on an idle device, `from_host` queued
//! behind a task (the snapshot path) and `to_host`, each then awaited.

use arrayjit::backend::{Backend, Config, Device, MergeBufferUse, MulticoreBackend, Task};
use arrayjit::ir::{Assignments, Bindings, FetchOp, MemoryMode, Prec, Tnode};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn device(b: &MulticoreBackend) -> Device {
    b.initialize(Config::default());
    b.new_virtual_device(&b.get_device(0).unwrap()).unwrap()
}

fn scheduling(c: &mut Criterion) {
    let b = MulticoreBackend::new();
    let d = device(&b);
    let mut g = c.benchmark_group("scheduling");
    let n = 1000u64;
    g.throughput(Throughput::Elements(n));
    g.bench_function("1000 empty tasks then await", |bench| {
        bench.iter(|| {
            for _ in 0..n {
                b.schedule(&d, Task::new("empty", || Ok(()))).unwrap();
            }
            b.await_device(&d).unwrap();
        })
    });
    g.finish();
    c.bench_function("await latency (one empty task)", |bench| {
        bench.iter(|| {
            b.schedule(&d, Task::new("empty", || Ok(()))).unwrap();
            b.await_device(&d).unwrap();
        })
    });
    c.bench_function("await on an idle device", |bench| {
        bench.iter(|| b.await_device(&d).unwrap())
    });
    // Device `e` waits for `d`'s event (no host await in between), then the host awaits `e`.
    let e = b.new_virtual_device(&b.get_device(0).unwrap()).unwrap();
    c.bench_function(
        "event hop (empty task, other device waits for it, await)",
        |bench| {
            bench.iter(|| {
                b.schedule(&d, Task::new("empty", || Ok(()))).unwrap();
                b.wait_for_event(&e, &b.record_event(&d)).unwrap();
                b.schedule(&e, Task::new("empty", || Ok(()))).unwrap();
                b.await_device(&e).unwrap();
            })
        },
    );
}

fn copies(c: &mut Criterion) {
    let b = MulticoreBackend::new();
    b.initialize(Config::default());
    let p = b.get_device(0).unwrap();
    let src_dev = b.new_virtual_device(&p).unwrap();
    let dst_dev = b
        .new_virtual_device(&b.get_device(b.num_physical_devices() - 1).unwrap())
        .unwrap();
    let mut g = c.benchmark_group("copy");
    for n in [1usize << 10, 1 << 16, 1 << 20] {
        let tn = Tnode::builder(&["t"], &[n], Prec::Single)
            .memory(MemoryMode::OnDevice)
            .build()
            .unwrap();
        let code = b
            .compile(
                true,
                Some("fill"),
                &Bindings::empty(),
                &Assignments::Fetch {
                    array: tn.clone(),
                    fetch_op: FetchOp::Constant(1.0),
                },
            )
            .unwrap();
        let rs = b.link(&[], &b.init(&src_dev).unwrap(), &code).unwrap();
        let rd = b.link(&[], &b.init(&dst_dev).unwrap(), &code).unwrap();
        let bytes = (n * 4) as u64;
        g.throughput(Throughput::Bytes(bytes));
        g.bench_with_input(
            BenchmarkId::new("device_to_device", bytes),
            &n,
            |bench, _| {
                bench.iter(|| {
                    b.device_to_device(&tn, MergeBufferUse::No, rd.context(), rs.context())
                        .unwrap();
                    b.await_device(&dst_dev).unwrap();
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("device_to_device merge Copy", bytes),
            &n,
            |bench, _| {
                bench.iter(|| {
                    b.device_to_device(&tn, MergeBufferUse::Copy, rd.context(), rs.context())
                        .unwrap();
                    b.await_device(&dst_dev).unwrap();
                })
            },
        );
        let src = vec![1u8; n * 4];
        let mut dst = vec![0u8; n * 4];
        g.bench_with_input(
            BenchmarkId::new("memcpy baseline", bytes),
            &n,
            |bench, _| {
                bench.iter(|| {
                    dst.copy_from_slice(std::hint::black_box(&src));
                    std::hint::black_box(&dst);
                })
            },
        );
    }
    g.finish();
}

fn host_copies(c: &mut Criterion) {
    let b = MulticoreBackend::new();
    let d = device(&b);
    let mut g = c.benchmark_group("host copy");
    // Holds the device until the host has scheduled the copy, so that the copy is queued.
    let held = |b: &MulticoreBackend, copy: &dyn Fn()| {
        let go = Arc::new(AtomicBool::new(false));
        let wait = go.clone();
        b.schedule(
            &d,
            Task::new("hold", move || {
                while !wait.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                Ok(())
            }),
        )
        .unwrap();
        copy();
        go.store(true, Ordering::Release);
        b.await_device(&d).unwrap();
    };
    // What the held copies cost without the copy.
    g.bench_function("the holding task alone, await", |bench| {
        bench.iter(|| held(&b, &|| ()))
    });
    for n in [1usize << 10, 1 << 16, 1 << 20] {
        let x = Tnode::hosted(&["x"], &[n], Prec::Single).unwrap();
        let code = b
            .compile(
                true,
                Some("fill"),
                &Bindings::empty(),
                &Assignments::Fetch {
                    array: x.clone(),
                    fetch_op: FetchOp::Constant(1.0),
                },
            )
            .unwrap();
        let r = b.link(&[], &b.init(&d).unwrap(), &code).unwrap();
        let ctx = r.context();
        let bytes = (n * 4) as u64;
        g.throughput(Throughput::Bytes(bytes));
        g.bench_with_input(
            BenchmarkId::new("from_host idle, await", bytes),
            &n,
            |bench, _| {
                bench.iter(|| {
                    assert!(b.from_host(ctx, &x).unwrap());
                    b.await_device(&d).unwrap();
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("from_host behind a task, await", bytes),
            &n,
            |bench, _| {
                bench.iter(|| {
                    held(&b, &|| assert!(b.from_host(ctx, &x).unwrap()));
                })
            },
        );
        g.bench_with_input(BenchmarkId::new("to_host, await", bytes), &n, |bench, _| {
            bench.iter(|| {
                assert!(b.to_host(ctx, &x).unwrap());
                b.await_device(&d).unwrap();
            })
        });
    }
    g.finish();
}

criterion_group!(benches, scheduling, copies, host_copies);
criterion_main!(benches);
