//! Shared helpers for integration tests: build small routines and run them on the cc backend.
#![allow(dead_code)]

use arrayjit::backend::{CcBackend, Config, MergeBuffer, Routine};
use arrayjit::ir::einsum::projections;
use arrayjit::ir::*;
use arrayjit::target::{Isa, VectorTarget};

/// A hosted node with the given values.
pub fn input(name: &str, dims: &[usize], prec: Prec, values: &[f64]) -> Tnode {
    Tnode::with_init(
        &[name],
        dims,
        prec,
        &InitOp::ConstantFill {
            values: values.to_vec(),
            strict: true,
        },
    )
    .unwrap()
}

/// A hosted node of zeros (an output we want to read back).
pub fn output(name: &str, dims: &[usize], prec: Prec) -> Tnode {
    Tnode::hosted(&[name], dims, prec).unwrap()
}

/// A node without a host array, declared to stay in the context (`OnDevice`).
pub fn on_device(name: &str, dims: &[usize], prec: Prec) -> Tnode {
    Tnode::builder(&[name], dims, prec)
        .memory(MemoryMode::OnDevice)
        .build()
        .unwrap()
}

/// A node with no host array (an intermediate).
pub fn temp(name: &str, dims: &[usize], prec: Prec) -> Tnode {
    Tnode::new(&[name], dims, prec).unwrap()
}

/// `lhs (accum)= op(a, b)` with an einsum spec.
#[allow(clippy::too_many_arguments)]
pub fn binop(
    lhs: &Tnode,
    accum: Binop,
    init: bool,
    op: Binop,
    a: &Tnode,
    b: &Tnode,
    spec: &str,
    bindings: &Bindings,
) -> Assignments {
    Assignments::AccumBinop {
        initialize_neutral: init,
        accum,
        op,
        lhs: lhs.clone(),
        rhs1: Buffer::Node(a.clone()),
        rhs2: Buffer::Node(b.clone()),
        projections: projections(spec, lhs.dims(), &[a.dims(), b.dims()], bindings).unwrap(),
    }
}

/// `lhs (accum)= op(a)` with an einsum spec.
#[allow(clippy::too_many_arguments)]
pub fn unop(
    lhs: &Tnode,
    accum: Binop,
    init: bool,
    op: Unop,
    a: &Tnode,
    spec: &str,
    bindings: &Bindings,
) -> Assignments {
    Assignments::AccumUnop {
        initialize_neutral: init,
        accum,
        op,
        lhs: lhs.clone(),
        rhs: Buffer::Node(a.clone()),
        projections: projections(spec, lhs.dims(), &[a.dims()], bindings).unwrap(),
    }
}

/// Compiles one routine, links it into a fresh context and copies every hosted node of the
/// context from the host.
pub fn build(
    backend: &CcBackend,
    name: &str,
    bindings: &Bindings,
    asgns: &Assignments,
) -> arrayjit::Result<(Routine, String)> {
    backend.initialize(Config::default());
    let code = backend.compile(true, Some(name), bindings, asgns)?;
    let src = code.source().to_string();
    let ctx = backend.init(name)?;
    let r = backend.link(&[], &MergeBuffer::new(), &ctx, &code)?;
    for tn in asgns.nodes() {
        backend.from_host(r.context(), &tn)?;
    }
    Ok((r, src))
}

/// Runs the routine once and returns the host values of `outs` afterwards.
pub fn run_and_read(backend: &CcBackend, r: &Routine, outs: &[&Tnode]) -> Vec<Vec<f64>> {
    r.run().unwrap();
    outs.iter()
        .map(|t| {
            assert!(
                backend.to_host(r.context(), t).unwrap(),
                "{} not in context",
                t.name()
            );
            t.host_values().unwrap()
        })
        .collect()
}

/// Compiles and runs once; returns the outputs, the C source and the memory-mode decisions.
pub fn compute_with_modes(
    asgns: &Assignments,
    bindings: &Bindings,
    outs: &[&Tnode],
) -> (Vec<Vec<f64>>, String, MemoryModes) {
    let backend = CcBackend::new();
    let (r, src) = build(&backend, "test", bindings, asgns).unwrap();
    (
        run_and_read(&backend, &r, outs),
        src,
        backend.memory_modes(),
    )
}

/// Compiles and runs once; returns the outputs and the C source.
pub fn compute(
    asgns: &Assignments,
    bindings: &Bindings,
    outs: &[&Tnode],
) -> (Vec<Vec<f64>>, String) {
    let backend = CcBackend::new();
    let (r, src) = build(&backend, "test", bindings, asgns).unwrap();
    (run_and_read(&backend, &r, outs), src)
}

/// Rounds like storing into `prec`, computed independently of the library: bytes truncate
/// toward zero and saturate to 0..=255 (NaN to 0).
pub fn round_to(prec: Prec, v: f64) -> f64 {
    match prec {
        // Modular bytes: truncate toward zero, wrap modulo 256; NaN and infinities give 0.
        Prec::Byte => {
            if v.is_finite() {
                v.trunc().rem_euclid(256.0)
            } else {
                0.0
            }
        }
        Prec::Half => nearest_half(v),
        Prec::Single => v as f32 as f64,
        Prec::Double => v,
        Prec::Bfloat16 => {
            // The table once per process: building it for every value made rounding
            // 700,000 values take half a minute.
            static TABLE: std::sync::OnceLock<Vec<(f64, u32)>> = std::sync::OnceLock::new();
            nearest_in(v, TABLE.get_or_init(bf16_values))
        }
        Prec::Fp8 => nearest_in(v, &fp8_values()),
        p => {
            // Integers: truncate toward zero, wrap modulo 2^bits.
            let bits = p.int_bits().unwrap_or(64);
            if !v.is_finite() {
                return 0.0;
            }
            let m = 2f64.powi(bits as i32);
            let mut r = v.trunc() % m;
            if r < 0.0 {
                r += m;
            }
            if p.is_signed_integer() && r >= m / 2.0 {
                r -= m;
            }
            r
        }
    }
}

/// The finite non-negative fp8 E5M2 values, ascending (bits 0x00..=0x7b), with the bit
/// pattern of each, decoded here from the format's definition (bias 15, 2 mantissa bits).
pub fn fp8_values() -> Vec<(f64, u32)> {
    (0u32..=0x7b)
        .map(|b| {
            let (e, m) = ((b >> 2) as i32, f64::from(b & 3));
            let v = if e == 0 {
                m / 4.0 * 2f64.powi(-14)
            } else {
                (1.0 + m / 4.0) * 2f64.powi(e - 15)
            };
            (v, b)
        })
        .collect()
}

/// The finite non-negative bfloat16 values, ascending (bits 0x0000..=0x7f7f).
pub fn bf16_values() -> Vec<(f64, u32)> {
    (0u32..=0x7f7f)
        .map(|b| (f64::from(f32::from_bits(b << 16)), b))
        .collect()
}

/// Rounds `v` to the nearest of `table` (finite non-negative values ascending, with their bit
/// patterns), ties to the even pattern; beyond the largest value plus half a step (as if
/// the exponent range went on), infinity. NaN stays NaN.
pub fn nearest_in(v: f64, table: &[(f64, u32)]) -> f64 {
    if v.is_nan() {
        return v;
    }
    let a = v.abs();
    let n = table.len();
    let (max, below) = (table[n - 1].0, table[n - 2].0);
    let r = if a >= max + (max - below) / 2.0 {
        f64::INFINITY
    } else {
        let i = table.partition_point(|&(x, _)| x <= a);
        if i == n {
            max
        } else if i == 0 {
            table[0].0
        } else {
            let (lo, hi) = (table[i - 1], table[i]);
            let (dl, dh) = (a - lo.0, hi.0 - a);
            if dl < dh || (dl == dh && lo.1 % 2 == 0) {
                lo.0
            } else {
                hi.0
            }
        }
    };
    if v.is_sign_negative() {
        -r
    } else {
        r
    }
}

/// The half nearest to `v` (ties to even; 65520 and beyond overflow to infinity), found by
/// comparing the neighbours of a first guess: exact whatever the guess's own rounding.
pub fn nearest_half(v: f64) -> f64 {
    use half::f16;
    if v.is_nan() || v.is_infinite() {
        return v;
    }
    if v.abs() >= 65520.0 {
        return v.signum() * f64::INFINITY;
    }
    let guess = f16::from_f32(v as f32).to_bits() & 0x7fff;
    let sign = if v.is_sign_negative() { 0x8000 } else { 0 };
    let mut best: Option<(f64, u16)> = None;
    for b in [guess.saturating_sub(1), guess, (guess + 1).min(0x7bff)] {
        let h = f16::from_bits(sign | b).to_f64();
        let d = (h - v).abs();
        best = match best {
            Some((bd, bb)) if bd < d || (bd == d && bb % 2 == 0) => Some((bd, bb)),
            _ => Some((d, b)),
        };
    }
    best.map_or(v, |(_, b)| f16::from_bits(sign | b).to_f64())
}

/// Relative tolerance for comparing results of each precision.
pub fn tolerance(prec: Prec) -> f64 {
    match prec {
        Prec::Half => 2e-3,
        Prec::Bfloat16 => 1e-2,
        Prec::Fp8 => 0.25,
        Prec::Single => 2e-6,
        Prec::Double => 1e-13,
        _ => 0.0,
    }
}

/// Asserts `got` matches `want` within the precision's tolerance (NaN matches NaN).
pub fn assert_close(prec: Prec, got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan())
            || g == w
            || (g - w).abs() <= tolerance(prec) * w.abs().max(1e-30);
        assert!(
            ok,
            "{what} [{prec}] cell {i}: got {g}, want {w}\n got: {got:?}\nwant: {want:?}"
        );
    }
}

/// Runs `f` on its own thread and fails the test if it has not finished after `secs` seconds
/// (a hang fails instead of stalling the suite); a panic in `f` is re-raised.
pub fn with_watchdog(secs: u64, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(()) => h.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            // The body panicked: re-raise its panic.
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p)
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("watchdog: test did not finish in {secs}s")
        }
    }
}

/// An AVX-512 target as the optimizer sees it (32 registers of 64 bytes, FMA, a 48 KB L1 and
/// a 2 MB L2 as on Sapphire Rapids, vector extensions, neither bfloat16 dot products nor
/// `vpmullq`); tests change the fields they vary.
pub fn avx512_target() -> VectorTarget {
    VectorTarget::default()
        .isa(Isa::Avx512)
        .vector_bytes(64)
        .registers(32)
        .fma(true)
        .bf16_dot(false)
        .int64_mul(false)
        .l1d_bytes(48 << 10)
        .l2_bytes(2 << 20)
        .intrinsics(false)
}
