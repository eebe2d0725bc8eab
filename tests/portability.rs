//! Results that must not depend on the CPU or the C compiler: half-precision rounding (exact
//! IEEE conversions, whatever half arithmetic the target has), modular bytes, and what
//! compilers make of the generated C for CPUs this machine may not have (checked in their
//! assembly).

mod common;

use arrayjit::backend::CcBackend;
use arrayjit::ir::*;
use common::*;
use half::f16;
use std::path::Path;
use std::process::Command;

/// Float bit patterns that exercise every rounding case of float -> half: every value of the
/// upper 16 bits (sign, exponent, top mantissa bits: all magnitudes, all tie positions of
/// subnormal results) combined with low bits that are zero, exact ties, just below and just
/// above ties.
fn float_samples() -> Vec<f32> {
    let mut lows: Vec<u32> = vec![0, 1, 0xffff, 0x7fff, 0x8000, 0x8001];
    for k in 0..16 {
        let t = 1u32 << k;
        lows.extend([t, t - 1, t + 1]);
    }
    lows.sort_unstable();
    lows.dedup();
    let mut out = Vec::with_capacity(65536 * lows.len());
    for hi in 0..65536u32 {
        for &lo in &lows {
            out.push(f32::from_bits(hi << 16 | (lo & 0xffff)));
        }
    }
    out
}

fn same_value(got: f64, want: f64) -> bool {
    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan())
}

#[test]
fn half_stores_round_like_ieee_on_every_cpu() {
    let xs = float_samples();
    let n = xs.len();
    let values: Vec<f64> = xs.iter().map(|&x| x as f64).collect();
    let b = Bindings::empty();
    let x = input("x", &[n], Prec::Single, &values);
    let h = output("h", &[n], Prec::Half);
    let asg = unop(&h, Binop::Arg2, false, Unop::Identity, &x, "i->i", &b);
    let (got, src) = compute(&asg, &b, &[&h]);
    assert!(src.contains("aj_f2h("), "{src}");
    assert!(!src.contains("_Float16"), "{src}");
    let mut bad = 0;
    for (i, (&x, &g)) in xs.iter().zip(&got[0]).enumerate() {
        // The half crate rounds to nearest, ties to even, independently of our C.
        let want = f16::from_f32(x).to_f64();
        if !same_value(g, want) {
            bad += 1;
            assert!(
                bad > 10,
                "cell {i}: {x:e} ({:#010x}) stored as half {g:e}, IEEE says {want:e}",
                x.to_bits()
            );
        }
    }
    assert_eq!(bad, 0);
}

#[test]
fn every_half_widens_exactly() {
    let b = Bindings::empty();
    let halves: Vec<f64> = (0..=u16::MAX)
        .map(|bits| f16::from_bits(bits).to_f64())
        .collect();
    let h = input("h", &[halves.len()], Prec::Half, &halves);
    let y = output("y", &[halves.len()], Prec::Single);
    let d = output("d", &[halves.len()], Prec::Double);
    let asg = Assignments::seq([
        unop(&y, Binop::Arg2, false, Unop::Identity, &h, "i->i", &b),
        unop(&d, Binop::Arg2, false, Unop::Identity, &h, "i->i", &b),
    ]);
    let (got, _) = compute(&asg, &b, &[&y, &d]);
    for (bits, want) in halves.iter().enumerate() {
        assert!(
            same_value(got[0][bits], *want),
            "half {bits:#06x} as single"
        );
        assert!(
            same_value(got[1][bits], *want),
            "half {bits:#06x} as double"
        );
    }
}

/// The differential test's seed 20240744 (issue 9): a half tensor accumulated over two axes
/// with the sum computed in float. GCC 12 with AVX512-FP16 used to keep the running sum in a
/// float register across the reduction and round once at the end.
#[test]
fn half_accumulation_rounds_at_every_step() {
    let b = Bindings::empty();
    let x: Vec<f64> = (0..25).map(|k| 0.75 + 0.125 * k as f64).collect();
    let t: Vec<f64> = vec![-300.5, -151.25, 77.0, -420.75];
    let xn = input("x", &[5, 5], Prec::Single, &x);
    let tn = input("t", &[2, 2], Prec::Double, &t);
    let o = output("o", &[2, 5], Prec::Half);
    // o[c, b] += x[a, b] + t[c, d], over a and d, twice (the second run starts from the
    // first run's result, as in the fuzz case).
    let asg = binop(&o, Binop::Add, false, Binop::Add, &xn, &tn, "ab,cd->cb", &b);
    let backend = CcBackend::new();
    let (r, _) = build(&backend, "acc", &b, &asg).unwrap();
    r.run().unwrap();
    let got = run_and_read(&backend, &r, &[&o]).remove(0);
    // Independently: the loop order is a (outer), d, then the store rounds to half after
    // every addition, which is computed in float.
    let mut want = vec![0f64; 10];
    for _run in 0..2 {
        for c in 0..2 {
            for bb in 0..5 {
                let cell = c * 5 + bb;
                for a in 0..5 {
                    for d in 0..2 {
                        let term = (x[a * 5 + bb] as f32) + (t[c * 2 + d] as f32);
                        let sum = want[cell] as f32 + term;
                        want[cell] = f16::from_f32(sum).to_f64();
                    }
                }
            }
        }
    }
    assert_eq!(got, want);
}

#[test]
fn byte_arithmetic_wraps_modulo_256() {
    let b = Bindings::empty();
    let p = input("p", &[4], Prec::Byte, &[200., 255., 0., 17.]);
    let q = input("q", &[4], Prec::Byte, &[100., 1., 1., 3.]);
    let sum = output("sum", &[4], Prec::Byte);
    let diff = output("diff", &[4], Prec::Byte);
    let f = input(
        "f",
        &[10],
        Prec::Double,
        &[
            -1.0,
            300.7,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -256.5,
            1e300,
            -0.99,
            255.99,
            9_007_199_254_740_993.0,
        ],
    );
    let fb = output("fb", &[10], Prec::Byte);
    let asg = Assignments::seq([
        binop(&sum, Binop::Arg2, false, Binop::Add, &p, &q, "i,i->i", &b),
        binop(&diff, Binop::Arg2, false, Binop::Sub, &q, &p, "i,i->i", &b),
        unop(&fb, Binop::Arg2, false, Unop::Identity, &f, "i->i", &b),
    ]);
    let (got, src) = compute(&asg, &b, &[&sum, &diff, &fb]);
    assert!(src.contains("aj_d2u64("), "{src}");
    assert_eq!(got[0], vec![44., 0., 1., 20.]);
    assert_eq!(got[1], vec![156., 2., 1., 242.]);
    // Truncated toward zero, then wrapped; NaN and infinities store 0. 2^53 + 1 is the
    // double 2^53, a multiple of 256.
    assert_eq!(got[2], vec![255., 44., 0., 0., 0., 0., 0., 0., 255., 0.]);
}

/// The compilers to check: gcc and clang, whichever are installed (CI installs both).
fn compilers() -> Vec<&'static str> {
    let found: Vec<&str> = ["gcc", "clang"]
        .into_iter()
        .filter(|cc| {
            Command::new(cc)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .collect();
    assert!(!found.is_empty(), "neither gcc nor clang is installed");
    found
}

/// Compiles `source` (with the runtime header) to assembly and returns the instruction
/// mnemonics.
fn mnemonics(cc: &str, flags: &[&str], source: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let header = Path::new(env!("CARGO_MANIFEST_DIR")).join("runtime_c/arrayjit.h");
    std::fs::copy(header, dir.path().join("arrayjit.h")).unwrap();
    std::fs::write(dir.path().join("k.c"), source).unwrap();
    let out = Command::new(cc)
        .args(flags)
        .args(["-std=gnu11", "-fPIC", "-I.", "-S", "-o", "k.s", "k.c"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cc} {flags:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let asm = std::fs::read_to_string(dir.path().join("k.s")).unwrap();
    asm.lines()
        .filter(|l| l.starts_with('\t') && !l.trim_start().starts_with('.'))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Generated half code compiled for Sapphire Rapids (AVX512-FP16) by gcc and clang contains
/// no half-precision instruction at all: conversions are integer code, so no compiler can
/// fold or widen them, and the values match the run on this machine by construction.
#[test]
fn half_code_uses_no_fp16_instructions_for_cpus_with_native_half() {
    let b = Bindings::empty();
    let x = temp("x", &[64, 48], Prec::Half);
    let t = temp("t", &[2, 2], Prec::Double);
    let o = output("o", &[2, 48], Prec::Half);
    let y = output("y", &[64, 48], Prec::Half);
    let asg = Assignments::seq([
        binop(&o, Binop::Add, false, Binop::Add, &x, &t, "ab,cd->cb", &b),
        binop(&y, Binop::Arg2, false, Binop::Mul, &x, &x, "ij,ij->ij", &b),
    ]);
    let backend = CcBackend::new();
    backend.initialize(arrayjit::backend::Config::default());
    let code = backend.compile(false, Some("half"), &b, &asg).unwrap();
    let half_insn = |m: &str| {
        let m = m.to_ascii_lowercase();
        m.starts_with('v')
            && (m.ends_with("ph")
                || m.ends_with("sh")
                || m.ends_with("phx")
                || m.ends_with("phxx")
                || m.contains("ph2")
                || m.contains("2ph")
                || m.contains("sh2")
                || m.contains("2sh"))
    };
    for cc in compilers() {
        for flags in [
            &["-O3", "-march=sapphirerapids"][..],
            &["-O2", "-march=sapphirerapids", "-mprefer-vector-width=512"][..],
        ] {
            let ms = mnemonics(cc, flags, code.source());
            assert!(!ms.is_empty(), "{cc}: no instructions");
            let bad: Vec<&String> = ms.iter().filter(|m| half_insn(m)).collect();
            assert!(bad.is_empty(), "{cc} {flags:?} emitted {bad:?}");
        }
    }
}
