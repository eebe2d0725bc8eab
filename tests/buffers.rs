//! Buffers are shared between threads soundly: every access (host copies, buffer-to-buffer
//! copies, routine runs) holds the buffer's lock, so unsynchronized use from safe code gets
//! whole operations in some order, never a torn or lost one.

mod common;
use arrayjit::backend::{Backend, CcBackend, DeviceBuffer, MulticoreBackend};
use arrayjit::ir::*;
use common::*;
use std::sync::Arc;

/// `x = x + one` on 65,536 floats, run 50 times from each of 4 threads at once: with the
/// runs serialized every cell ends at exactly 200 (an unsynchronized read-modify-write would
/// lose increments).
#[test]
fn concurrent_runs_of_one_routine_do_not_lose_updates() {
    with_watchdog(120, || {
        let n = 1 << 20;
        let x = output("x", &[n], Prec::Single);
        let one = input("one", &[1], Prec::Single, &[1.0]);
        let bindings = Bindings::default();
        let code = binop(
            &x,
            Binop::Add,
            false,
            Binop::Arg2,
            &x,
            &one,
            "i,0->i",
            &bindings,
        );
        let backend = CcBackend::new();
        let (r, _) = build(&backend, "increment", &bindings, &code).unwrap();
        let r = Arc::new(r);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        r.run().unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(backend.to_host(r.context(), &x).unwrap());
        let v = x.host_values().unwrap();
        assert!(v.iter().all(|&c| c == 200.0), "cells: {:?}", &v[..8]);
    });
}

/// One thread writes whole buffers of one byte value, alternating, while another copies the
/// buffer out and reads it: every copy and every read sees one value throughout.
#[test]
fn concurrent_writes_and_copies_are_never_torn() {
    with_watchdog(120, || {
        let size = 1 << 20;
        let a = DeviceBuffer::new(size).unwrap();
        let b = DeviceBuffer::new(size).unwrap();
        let writer = {
            let a = a.clone();
            std::thread::spawn(move || {
                for i in 0..300u32 {
                    let byte = if i % 2 == 0 { 0xAA } else { 0x55 };
                    a.write_bytes(&vec![byte; size]).unwrap();
                }
            })
        };
        let mut out = vec![0u8; size];
        for _ in 0..300 {
            b.copy_from(&a, size).unwrap();
            b.read_bytes(&mut out).unwrap();
            let first = out[0];
            assert!(out.iter().all(|&c| c == first), "a copy mixed two writes");
            a.read_bytes(&mut out).unwrap();
            let first = out[0];
            assert!(out.iter().all(|&c| c == first), "a read mixed two writes");
        }
        writer.join().unwrap();
    });
}

/// Two buffers copied into each other from two threads at once (each copy locks both, in
/// address order): no deadlock, and each ends holding one of the two patterns whole.
#[test]
fn crossing_copies_do_not_deadlock() {
    with_watchdog(60, || {
        let size = 1 << 16;
        let a = DeviceBuffer::new(size).unwrap();
        let b = DeviceBuffer::new(size).unwrap();
        a.write_bytes(&vec![1; size]).unwrap();
        b.write_bytes(&vec![2; size]).unwrap();
        let t = {
            let (a, b) = (a.clone(), b.clone());
            std::thread::spawn(move || {
                for _ in 0..2000 {
                    a.copy_from(&b, size).unwrap();
                }
            })
        };
        for _ in 0..2000 {
            b.copy_from(&a, size).unwrap();
        }
        t.join().unwrap();
        let mut out = vec![0u8; size];
        for buf in [&a, &b] {
            buf.read_bytes(&mut out).unwrap();
            assert!(out.iter().all(|&c| c == out[0]) && (out[0] == 1 || out[0] == 2));
        }
    });
}

/// A host copy into a tensor's buffer races with a device task running a routine that
/// writes it; both are whole operations. The routine sets y = x * 2 (x in the context);
/// meanwhile the host keeps overwriting x with 1s and 3s. Every y read afterwards is all 2s
/// or all 6s.
#[test]
fn host_copies_racing_a_device_routine_are_whole() {
    with_watchdog(120, || {
        let n = 1 << 20;
        let backend = MulticoreBackend::new();
        backend.initialize(arrayjit::backend::Config::default());
        let dev = backend
            .new_virtual_device(&backend.get_device(0).unwrap())
            .unwrap();
        let x = output("x", &[n], Prec::Single);
        let two = input("two", &[1], Prec::Single, &[2.0]);
        let y = output("y", &[n], Prec::Single);
        let bindings = Bindings::default();
        let code = binop(
            &y,
            Binop::Arg2,
            false,
            Binop::Mul,
            &x,
            &two,
            "i,0->i",
            &bindings,
        );
        let c = backend
            .compile(true, Some("double"), &bindings, &code)
            .unwrap();
        let ctx = backend.init(&dev).unwrap();
        let r = backend.link(&[], &ctx, &c).unwrap();
        backend.from_host(r.context(), &two).unwrap();
        let xbuf = r.context().get_buffer(&x).unwrap();
        let ybuf = r.context().get_buffer(&y).unwrap();
        let ones: Vec<u8> = (0..n).flat_map(|_| 1.0f32.to_ne_bytes()).collect();
        let threes: Vec<u8> = (0..n).flat_map(|_| 3.0f32.to_ne_bytes()).collect();
        xbuf.write_bytes(&ones).unwrap();
        let mut out = vec![0u8; n * 4];
        for i in 0..100 {
            backend.schedule(&dev, r.task()).unwrap();
            xbuf.write_bytes(if i % 2 == 0 { &threes } else { &ones })
                .unwrap();
            ybuf.read_bytes(&mut out).unwrap();
            let vals: Vec<f32> = out
                .chunks_exact(4)
                .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            assert!(
                vals.iter().all(|&v| v == vals[0]) && [0.0, 2.0, 6.0].contains(&vals[0]),
                "y mixed two runs: {:?}",
                &vals[..4]
            );
        }
        backend.await_device(&dev).unwrap();
    });
}
