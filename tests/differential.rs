//! Differential testing: random programs run through the compiled C and through the reference
//! interpreter ([`arrayjit::interp`]), compared within tolerances derived for every tensor.
//!
//! For every case a seeded generator builds a random program (tensors with values, one routine
//! of several assignments, 1-3 runs with static index values) and instantiates it three times
//! with fresh nodes (the optimizer records memory-mode decisions on the nodes):
//!
//! - (a) compiled with [`CcBackend`] (optimizer on) and run; the hosted tensors are read back
//!   after every run;
//! - (b) run by [`interp::run_assignments`] (the unoptimized loop IR);
//! - (c) compiled with the optimizer off;
//! - (d) additionally, the *optimized* loop IR of (a) is run by [`interp::run_optimized`],
//!   which tells optimizer bugs (d ≠ b) from C-generation bugs (d = b ≠ a).
//!
//! (a) is compared with (b), (c) with (a), and (d) with (b). A mismatch prints the seed and
//! the program in the JSON program-file format (`arrayjit run prog.json` reruns it), and
//! fails the test.
//!
//! Environment: `ARRAYJIT_FUZZ_CASES=N` (default 300), `ARRAYJIT_FUZZ_SEED=S` (base seed; case
//! `i` uses seed `S + i`), `ARRAYJIT_FUZZ_BATCH=K` (cases compiled together in one C file,
//! default 25), `ARRAYJIT_FUZZ_VERBOSE=1` (print every program),
//! `ARRAYJIT_FUZZ_MAX_TRACING_DIM=n` and `ARRAYJIT_FUZZ_MAX_VISITS=n` (optimizer settings of
//! the compiled run (a); with a tracing dim below 5, loops are traced only partly). The C
//! compiler's own variables apply too (`ARRAYJIT_CC`, `ARRAYJIT_CFLAGS`, ...).
//!
//! # What the generator covers
//!
//! - shapes of 1-4 axes with extents 1-5; einsum specs built from the operands' dims with
//!   shared letters, broadcasting (extent-1 axes, letters only in the result), reductions
//!   (letters only in arguments, and letters on result axes of extent 1), diagonals (a letter
//!   repeated in one argument term), fixed digit indices on both sides, and static indices
//!   `{s}` (with a range) on both sides;
//! - every unary and binary operation of the table, every precision, mixed precisions in one
//!   program and one assignment; accumulators set/add/sub/mul/max/min with and without
//!   `initialize_neutral`, bijective and not, full and partial writes;
//! - chains of assignments through intermediate nodes that are not hosted (so the optimizer
//!   inlines many of them), in-place updates, accumulation into hosted inputs;
//! - fetches: constants (exact, inexact, and ±inf/NaN into outputs), slices by a static index,
//!   and embedded static index values;
//! - 1-3 runs of the routine with changing static index values, so recurrent accumulators
//!   (hosted, and device-only ones the optimizer must keep) carry state between runs.
//!
//! Operand domains are chosen so that comparisons stay meaningful: the generator tracks, for
//! every tensor, an interval bounding its values and refuses operations outside their domain
//! with a margin: `log` needs arguments ≥ 0.25, `sqrt` ≥ 0, `recip`/`div` denominators away
//! from 0 by 0.25, `exp` arguments ≤ 7, `pow` positive bases ≥ 0.25 with exponents in [-3, 3]
//! (or any base with an exact integer exponent 0-3), `relu_gate` only gates on values whose
//! sign is the same in both computations, and magnitudes stay below 1e4 (half overflows at
//! 65504). Inputs are small dyadic rationals (k/8, k/4, k/1024) or bytes.
//!
//! # Tolerances
//!
//! Instead of one fixed tolerance per precision, the generator runs a forward error analysis
//! alongside: for every tensor it knows whether both computations produce *identical* values
//! and, if not, a bound on the absolute difference.
//!
//! - Values are identical when every operation is exact in the compute type of the C code
//!   (`float` for half/single results: 24 bits, `double` for byte/double: 53 bits): the
//!   generator tracks that all values are multiples of `2^e` below a magnitude, which
//!   decides exactness of `+ - *`, and rounding an identical value to a storage precision is
//!   identical on both sides. With dyadic inputs most of the arithmetic is exact, so most
//!   cells are compared **exactly** — a lost rounding or a wrong index shows immediately.
//! - Otherwise (division, transcendental functions, or results too wide for `float`), the
//!   bound grows by a few units in the last place of the compute type per operation (float
//!   vs. double intermediates, libm, contraction into FMA), by one unit of the storage
//!   precision per store (a value computed slightly differently can round to the
//!   neighbouring half/single: "double rounding"), by 1 per byte store (truncation can flip
//!   by one), and is propagated through each operation with its derivative bounds (e.g. an
//!   error `d` in `x` becomes `d / lo` after `log`). The comparison allows 4x the bound
//!   (8x for compiled vs. compiled). In practice this is about 1e-3 relative for half values
//!   computed by transcendental functions, 1e-6 for single and 1e-15 for double, and ±1 for
//!   bytes computed from inexact values. Programs whose bound would exceed 2% of a tensor's
//!   magnitude are not generated (those comparisons would be meaningless).
//! - NaN matches only NaN, infinities only equal infinities.

use arrayjit::backend::{CcBackend, Config, MergeBuffer};
use arrayjit::interp::{self, Memory};
use arrayjit::ir::einsum::projections;
use arrayjit::ir::{
    Assignments, AxisIndex, Bindings, Binop, Buffer, FetchOp, InitOp, MemoryMode, Prec,
    StaticSymbol, Tnode, Unop,
};
use arrayjit::optimize::{Optimized, Settings};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The CLI's program-file reader (binary-private; it uses only the library's public API).
#[path = "../src/bin/arrayjit/program/mod.rs"]
#[allow(dead_code)]
mod program;

// ------------------------------------------------------------------------------------------
// Random numbers: xorshift64* seeded through splitmix64.

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (n >= 1).
    fn below(&mut self, n: usize) -> usize {
        ((self.next() >> 11) % n.max(1) as u64) as usize
    }
    fn chance(&mut self, pct: usize) -> bool {
        self.below(100) < pct
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len())]
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

// ------------------------------------------------------------------------------------------
// Forward error analysis.

/// The grid exponent of a set of zeros (a multiple of every power of two).
const ANY: i32 = i32::MAX / 2;
/// Largest magnitude of a tensor's values (half overflows at 65504).
const MAX_MAG: f64 = 1e4;
/// Largest magnitude of an intermediate value.
const MAX_TERM: f64 = 1e5;

/// A floating-point format: significand bits (with the implicit one), smallest exponent of
/// the last place (subnormals included), largest finite value.
#[derive(Clone, Copy, PartialEq, Debug)]
struct Fmt {
    mant: i32,
    min_e: i32,
    max: f64,
}

const HALF: Fmt = Fmt {
    mant: 11,
    min_e: -24,
    max: 65504.0,
};
const SINGLE: Fmt = Fmt {
    mant: 24,
    min_e: -149,
    max: f32::MAX as f64,
};
const DOUBLE: Fmt = Fmt {
    mant: 53,
    min_e: -1074,
    max: f64::MAX,
};

/// The format generated C computes in when writing a node of precision `p`.
fn compute_fmt(p: Prec) -> Fmt {
    match p {
        Prec::Half | Prec::Single => SINGLE,
        Prec::Byte | Prec::Double => DOUBLE,
    }
}

fn store_fmt(p: Prec) -> Fmt {
    match p {
        Prec::Half => HALF,
        Prec::Single => SINGLE,
        Prec::Byte | Prec::Double => DOUBLE,
    }
}

/// One unit in the last place at magnitude `m` (with the subnormal floor).
fn ulp(m: f64, f: Fmt) -> f64 {
    m * 2f64.powi(1 - f.mant) + 2f64.powi(f.min_e)
}

/// Whether every multiple of `2^e` of magnitude at most `m` is representable in `f`.
fn fits(m: f64, e: i32, f: Fmt) -> bool {
    if m == 0.0 {
        return true;
    }
    if e == ANY || e < f.min_e || m > f.max || e > 900 {
        return false;
    }
    m / 2f64.powi(e) < 2f64.powi(f.mant)
}

/// The exponent of the last set bit of `v`: `v` is an odd multiple of `2^grid_of(v)`.
fn grid_of(v: f64) -> i32 {
    if v == 0.0 {
        return ANY;
    }
    let bits = v.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    let mut m = bits & ((1u64 << 52) - 1);
    let e0 = if exp == 0 {
        -1074
    } else {
        m |= 1 << 52;
        exp - 1075
    };
    e0 + m.trailing_zeros() as i32
}

/// What is known about the values of a tensor in both computations.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Est {
    /// Bounds of the finite values (both computations; `lo > hi` when there are none).
    lo: f64,
    hi: f64,
    /// `Some(e)`: both computations hold identical values, all multiples of `2^e`.
    grid: Option<i32>,
    /// Otherwise: a bound on the absolute difference between the two computations.
    err: f64,
    /// Some cells may hold ±inf or NaN (identical in both computations).
    nonfinite: bool,
}

impl Est {
    fn zero() -> Est {
        Est {
            lo: 0.0,
            hi: 0.0,
            grid: Some(ANY),
            err: 0.0,
            nonfinite: false,
        }
    }
    /// Cells that hold ±inf or NaN only.
    fn infinite() -> Est {
        Est {
            lo: f64::INFINITY,
            hi: f64::NEG_INFINITY,
            grid: Some(ANY),
            err: 0.0,
            nonfinite: true,
        }
    }
    fn value(v: f64) -> Est {
        if v.is_finite() {
            Est {
                lo: v,
                hi: v,
                grid: Some(grid_of(v)),
                err: 0.0,
                nonfinite: false,
            }
        } else {
            Est::infinite()
        }
    }
    fn of_values(vs: &[f64]) -> Est {
        vs.iter()
            .map(|&v| Est::value(v))
            .reduce(Est::union)
            .unwrap_or_else(Est::zero)
    }
    fn mag(&self) -> f64 {
        if self.lo > self.hi {
            0.0
        } else {
            self.lo.abs().max(self.hi.abs())
        }
    }
    fn union(self, o: Est) -> Est {
        Est {
            lo: self.lo.min(o.lo),
            hi: self.hi.max(o.hi),
            grid: grid_min(self.grid, o.grid),
            err: self.err.max(o.err),
            nonfinite: self.nonfinite || o.nonfinite,
        }
    }
    /// Widens the bounds away from zero by a relative `r` (zero bounds stay).
    fn widen(self, r: f64) -> Est {
        Est {
            lo: self.lo - self.lo.abs() * r,
            hi: self.hi + self.hi.abs() * r,
            ..self
        }
    }
    /// The two computations may now differ, by `add` more than before.
    fn inexact(self, add: f64) -> Est {
        Est {
            grid: None,
            err: self.err + add,
            ..self.widen(2e-3)
        }
    }
}

fn grid_min(a: Option<i32>, b: Option<i32>) -> Option<i32> {
    Some(a?.min(b?))
}

type Check<T> = Result<T, &'static str>;

/// The result of an operation computed in `c`: identical on both sides only if exact.
fn in_compute(x: Est, c: Fmt) -> Est {
    match x.grid {
        Some(e) if fits(x.mag(), e, c) => x,
        _ => x.inexact(2.0 * ulp(x.mag(), c)),
    }
}

/// Reading a node of precision `src` into compute format `c` (C converts double to float).
fn read(x: Est, src: Prec, c: Fmt) -> Est {
    if src == Prec::Double && c == SINGLE {
        match x.grid {
            Some(e) if fits(x.mag(), e, SINGLE) => x,
            Some(_) => x.widen(2f64.powi(-23)),
            None => x.inexact(ulp(x.mag(), SINGLE)),
        }
    } else {
        x
    }
}

/// Storing into a node of precision `p`.
fn store(x: Est, p: Prec) -> Check<Est> {
    if x.nonfinite {
        return if p == Prec::Byte {
            Err("non-finite into byte")
        } else {
            Ok(x)
        };
    }
    match p {
        Prec::Byte => {
            // Bytes wrap modulo 256: the stored range is the image of [lo, hi] unless that
            // interval crosses a multiple of 256, and two computations that differ by `err`
            // can land on opposite sides of one (255 against 0).
            let block = |v: f64| (v.trunc() / 256.0).floor();
            let (lo, hi) = if block(x.lo) == block(x.hi) {
                (common::round_to(p, x.lo), common::round_to(p, x.hi))
            } else {
                (0.0, 255.0)
            };
            let identical = x.grid.is_some() || x.lo.trunc() == x.hi.trunc();
            Ok(Est {
                lo,
                hi,
                grid: identical.then_some(if hi == 0.0 { ANY } else { 0 }),
                err: if identical {
                    0.0
                } else if block(x.lo - x.err) == block(x.hi + x.err) {
                    (x.err + 1.0).min(255.0)
                } else {
                    255.0
                },
                nonfinite: false,
            })
        }
        _ => {
            let f = store_fmt(p);
            if x.mag() > f.max / 4.0 {
                return Err("overflow");
            }
            Ok(match x.grid {
                Some(e) if fits(x.mag(), e, f) => x,
                // Identical values round identically; they stay multiples of 2^e.
                Some(_) => x.widen(2f64.powi(1 - f.mant)),
                None => x.inexact(ulp(x.mag(), f)),
            })
        }
    }
}

fn corners(a: Est, b: Est, f: impl Fn(f64, f64) -> f64) -> (f64, f64) {
    let v = [f(a.lo, b.lo), f(a.lo, b.hi), f(a.hi, b.lo), f(a.hi, b.hi)];
    (
        v.iter().copied().fold(f64::INFINITY, f64::min),
        v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    )
}

/// A transcendental (or otherwise inexact) result.
fn transc(lo: f64, hi: f64, err: f64, c: Fmt) -> Est {
    Est {
        lo,
        hi,
        grid: None,
        err,
        nonfinite: false,
    }
    .inexact(4.0 * ulp(lo.abs().max(hi.abs()), c))
}

/// The smallest magnitude of an interval away from zero by at least 0.25, with a small error.
fn away_from_zero(a: Est) -> Check<f64> {
    let m = if a.lo >= 0.25 {
        a.lo
    } else if a.hi <= -0.25 {
        -a.hi
    } else {
        return Err("too close to zero");
    };
    if a.err > m / 8.0 {
        return Err("imprecise denominator");
    }
    Ok(m)
}

fn unop_est(op: Unop, a: Est, c: Fmt) -> Check<Est> {
    let r = match op {
        Unop::Identity => a,
        Unop::Relu => Est {
            lo: a.lo.max(0.0),
            hi: a.hi.max(0.0),
            ..a
        },
        Unop::Neg => Est {
            lo: -a.hi,
            hi: -a.lo,
            ..a
        },
        Unop::Exp => {
            if a.hi > 7.0 {
                return Err("exp too large");
            }
            transc(a.lo.exp(), a.hi.exp(), a.hi.exp() * a.err, c)
        }
        Unop::Log => {
            if a.lo < 0.25 || a.err > a.lo / 8.0 {
                return Err("log domain");
            }
            transc(a.lo.ln(), a.hi.ln(), a.err / a.lo, c)
        }
        Unop::Sqrt => {
            if a.lo < 0.0 {
                return Err("sqrt domain");
            }
            let d = if a.err == 0.0 {
                0.0
            } else if a.lo > 0.0 {
                (a.err / (2.0 * a.lo.sqrt())).min(a.err.sqrt())
            } else {
                a.err.sqrt()
            };
            transc(a.lo.sqrt(), a.hi.sqrt(), d, c)
        }
        Unop::Recip => {
            let m = away_from_zero(a)?;
            transc(1.0 / a.hi, 1.0 / a.lo, 2.0 * a.err / (m * m), c)
        }
        Unop::Tanh => transc(a.lo.tanh(), a.hi.tanh(), a.err, c),
        Unop::Sin | Unop::Cos => transc(-1.0, 1.0, a.err, c),
    };
    if r.mag() > MAX_TERM {
        return Err("magnitude");
    }
    Ok(in_compute(r, c))
}

fn binop_est(op: Binop, a: Est, b: Est, c: Fmt) -> Check<Est> {
    let r = match op {
        Binop::Add => Est {
            lo: a.lo + b.lo,
            hi: a.hi + b.hi,
            grid: grid_min(a.grid, b.grid),
            err: a.err + b.err,
            nonfinite: false,
        },
        Binop::Sub => Est {
            lo: a.lo - b.hi,
            hi: a.hi - b.lo,
            grid: grid_min(a.grid, b.grid),
            err: a.err + b.err,
            nonfinite: false,
        },
        Binop::Mul => {
            let (lo, hi) = corners(a, b, |x, y| x * y);
            let grid = match (a.grid, b.grid) {
                (Some(x), Some(y)) => Some(if x == ANY || y == ANY { ANY } else { x + y }),
                _ => None,
            };
            Est {
                lo,
                hi,
                grid,
                err: b.mag() * a.err + a.mag() * b.err + a.err * b.err,
                nonfinite: false,
            }
        }
        Binop::Div => {
            let m = away_from_zero(b)?;
            let (lo, hi) = corners(a, b, |x, y| x / y);
            transc(lo, hi, a.err / m + 2.0 * a.mag() * b.err / (m * m), c)
        }
        Binop::ToPowOf => {
            if a.lo >= 0.25 && b.lo >= -3.0 && b.hi <= 3.0 && a.err <= a.lo / 8.0 {
                let (lo, hi) = corners(a, b, f64::powf);
                if hi > MAX_TERM {
                    return Err("pow too large");
                }
                let (_, d_base) = corners(a, b, |x, y| y.abs() * x.powf(y - 1.0));
                let d_exp = a.lo.ln().abs().max(a.hi.ln().abs()) * hi;
                transc(lo, hi, d_base * a.err + d_exp * b.err, c)
            } else if b.grid.is_some()
                && b.lo == b.hi
                && b.lo.fract() == 0.0
                && (0.0..=3.0).contains(&b.lo)
            {
                let n = b.lo as i32;
                let (mut lo, hi) = corners(a, a, |x, _| x.powi(n));
                if n % 2 == 0 && a.lo < 0.0 && a.hi > 0.0 {
                    lo = 0.0;
                }
                let d = n as f64 * a.mag().powi((n - 1).max(0)) * a.err;
                transc(lo, hi, d, c)
            } else {
                return Err("pow domain");
            }
        }
        Binop::ReluGate => {
            if a.grid.is_none() && a.lo <= 0.0 && a.hi > 0.0 {
                return Err("gate sign may differ");
            }
            if a.lo > 0.0 {
                b
            } else if a.hi <= 0.0 {
                Est::zero()
            } else {
                b.union(Est::zero())
            }
        }
        Binop::Arg1 => a,
        Binop::Arg2 => b,
        Binop::Max => Est {
            lo: a.lo.max(b.lo),
            hi: a.hi.max(b.hi),
            grid: grid_min(a.grid, b.grid),
            err: a.err.max(b.err),
            nonfinite: false,
        },
        Binop::Min => Est {
            lo: a.lo.min(b.lo),
            hi: a.hi.min(b.hi),
            grid: grid_min(a.grid, b.grid),
            err: a.err.max(b.err),
            nonfinite: false,
        },
    };
    if r.mag() > MAX_TERM || !r.lo.is_finite() || !r.hi.is_finite() {
        return Err("magnitude");
    }
    Ok(in_compute(r, c))
}

/// `n` accumulation steps `acc = accum(acc, term)`, each stored into `p`.
fn accumulate(mut acc: Est, term: Est, n: usize, accum: Binop, p: Prec) -> Check<Est> {
    let c = compute_fmt(p);
    for _ in 0..n {
        acc = store(binop_est(accum, acc, term, c)?, p)?;
        if acc.mag() > MAX_TERM {
            return Err("accumulation too large");
        }
    }
    Ok(acc)
}

/// What `fill_neutral` stores for an accumulator.
fn neutral_est(accum: Binop, p: Prec) -> Est {
    let v = accum.neutral();
    if v.is_finite() || p == Prec::Byte {
        // Bytes store infinities as 0.
        Est::value(common::round_to(p, v))
    } else {
        Est::infinite()
    }
}

// ------------------------------------------------------------------------------------------
// Programs.

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// Hosted, with values.
    Input,
    /// Hosted, zeros at first.
    Output,
    /// Not hosted: the optimizer decides (often inlined).
    Temp,
}

#[derive(Clone, Debug)]
struct TSpec {
    name: String,
    dims: Vec<usize>,
    prec: Prec,
    kind: Kind,
    /// Initial values (inputs only; already rounded to the precision).
    init: Vec<f64>,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Op {
    Un(Unop),
    Bin(Binop),
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Un(u) => u.name(),
            Op::Bin(b) => b.name(),
        }
    }
}

/// What an assignment's projections do to its result.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Shape {
    /// Product-space points per written result cell.
    fan_in: usize,
    /// Whether every result cell is written.
    full: bool,
    /// Whether every product iterator indexes the result.
    bijective: bool,
}

#[derive(Clone, Debug)]
enum Stmt {
    Accum {
        lhs: usize,
        accum: Binop,
        init: bool,
        op: Op,
        args: Vec<usize>,
        logic: String,
        shape: Shape,
    },
    Const {
        lhs: usize,
        c: f64,
    },
    Slice {
        lhs: usize,
        src: usize,
        stat: usize,
    },
    Embed {
        lhs: usize,
        stat: usize,
    },
}

impl Stmt {
    fn lhs(&self) -> usize {
        match self {
            Stmt::Accum { lhs, .. }
            | Stmt::Const { lhs, .. }
            | Stmt::Slice { lhs, .. }
            | Stmt::Embed { lhs, .. } => *lhs,
        }
    }
    fn reads(&self) -> Vec<usize> {
        match self {
            Stmt::Accum { args, .. } => args.clone(),
            Stmt::Slice { src, .. } => vec![*src],
            _ => vec![],
        }
    }
}

#[derive(Clone, Debug)]
struct Program {
    seed: u64,
    tensors: Vec<TSpec>,
    /// Static indices: name and range.
    statics: Vec<(String, usize)>,
    stmts: Vec<Stmt>,
    /// Per run, the value of every static index.
    runs: Vec<Vec<i64>>,
    /// Per run, the estimate of every tensor after it.
    ests: Vec<Vec<Est>>,
}

impl Program {
    fn hosted(&self) -> Vec<usize> {
        (0..self.tensors.len())
            .filter(|&i| self.tensors[i].kind != Kind::Temp)
            .collect()
    }

    fn initial_ests(&self) -> Vec<Est> {
        self.tensors
            .iter()
            .map(|t| {
                if t.init.is_empty() {
                    Est::zero()
                } else {
                    Est::of_values(&t.init)
                }
            })
            .collect()
    }

    /// Runs the estimates through `runs` runs of the routine.
    fn replay(&self, runs: usize) -> Check<Vec<Vec<Est>>> {
        let mut ests = self.initial_ests();
        let mut out = vec![];
        for _ in 0..runs {
            for s in &self.stmts {
                apply(self, s, &mut ests)?;
            }
            out.push(ests.clone());
        }
        Ok(out)
    }
}

fn readable_est(e: &Est) -> Check<Est> {
    if e.nonfinite {
        Err("reads non-finite values")
    } else {
        Ok(*e)
    }
}

/// Updates the estimates for one statement; an error when the statement would leave the
/// domain where comparisons are meaningful.
fn apply(p: &Program, s: &Stmt, ests: &mut [Est]) -> Check<()> {
    let t = &p.tensors;
    let lhs = s.lhs();
    let pr = t[lhs].prec;
    let c = compute_fmt(pr);
    let new = match s {
        Stmt::Const { c: v, .. } => {
            // The constant is rounded to the compute type, then stored.
            let v = if c == SINGLE { *v as f32 as f64 } else { *v };
            if pr == Prec::Byte {
                Est::value(common::round_to(pr, v))
            } else {
                store(Est::value(v), pr)?
            }
        }
        Stmt::Embed { stat, .. } => {
            let r = p.statics[*stat].1;
            store(
                Est {
                    lo: 0.0,
                    hi: (r - 1) as f64,
                    grid: Some(if r == 1 { ANY } else { 0 }),
                    err: 0.0,
                    nonfinite: false,
                },
                pr,
            )?
        }
        Stmt::Slice { src, .. } => {
            let a = readable_est(&ests[*src])?;
            store(read(a, t[*src].prec, c), pr)?
        }
        Stmt::Accum {
            accum,
            init,
            op,
            args,
            shape,
            ..
        } => {
            let a = args
                .iter()
                .map(|&i| readable_est(&ests[i]).map(|e| read(e, t[i].prec, c)))
                .collect::<Check<Vec<Est>>>()?;
            let term = match op {
                Op::Un(u) => unop_est(*u, a[0], c)?,
                Op::Bin(b) => binop_est(*b, a[0], a[1], c)?,
            };
            let old = ests[lhs];
            // As lowered: a reduction (not bijective) with `initialize_neutral` first fills
            // the whole result with the accumulator's neutral element (0 for `set`); `set`
            // and bijective initializing assignments then just store the term.
            let plain = *accum == Binop::Arg2 || (*init && shape.bijective);
            let fills = *init && !shape.bijective;
            let neutral = neutral_est(*accum, pr);
            let written = if plain {
                store(term, pr)?
            } else if fills && neutral.nonfinite {
                // max/min from -inf/+inf: the first step yields the term exactly.
                let first = store(term, pr)?;
                accumulate(first, term, shape.fan_in - 1, *accum, pr)?
            } else {
                let start = if fills { neutral } else { readable_est(&old)? };
                accumulate(start, term, shape.fan_in, *accum, pr)?
            };
            if shape.full {
                written
            } else {
                written.union(if fills { neutral } else { old })
            }
        }
    };
    if !new.nonfinite && new.grid.is_none() {
        let lim = if pr == Prec::Byte {
            (0.05 * new.mag()).max(2.0)
        } else {
            0.02 * new.mag().max(1.0)
        };
        if new.err > lim {
            return Err("imprecise");
        }
    }
    if pr != Prec::Byte && new.mag() > MAX_MAG {
        return Err("magnitude");
    }
    ests[lhs] = new;
    Ok(())
}

/// Generator and runner knobs.
#[derive(Clone, Debug, Default)]
struct Opts {
    /// Optimizer settings of the compiled run (a).
    settings: Settings,
}

struct Gen {
    rng: Rng,
    p: Program,
    ests: Vec<Est>,
    written: Vec<bool>,
    read: Vec<bool>,
    last: Option<usize>,
}

const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyz";

impl Gen {
    fn new_tensor(&mut self, kind: Kind, dims: Vec<usize>, prec: Prec, init: Vec<f64>) -> usize {
        let i = self.p.tensors.len();
        let prefix = match kind {
            Kind::Input => "x",
            Kind::Output => "o",
            Kind::Temp => "t",
        };
        self.ests.push(if init.is_empty() {
            Est::zero()
        } else {
            Est::of_values(&init)
        });
        self.p.tensors.push(TSpec {
            name: format!("{prefix}{i}"),
            dims,
            prec,
            kind,
            init,
        });
        self.written.push(false);
        self.read.push(false);
        i
    }

    fn rollback(&mut self, n: usize) {
        self.p.tensors.truncate(n);
        self.ests.truncate(n);
        self.written.truncate(n);
        self.read.truncate(n);
    }

    fn random_dims(&mut self) -> Vec<usize> {
        let n = self.rng.pick(&[1, 1, 2, 2, 2, 3, 3, 4]);
        let mut d: Vec<usize> = (0..n).map(|_| 1 + self.rng.below(5)).collect();
        while d.iter().product::<usize>() > 200 {
            let k = self.rng.below(d.len());
            d[k] = (d[k] / 2).max(1);
        }
        d
    }

    fn random_prec(&mut self) -> Prec {
        self.rng.pick(&[
            Prec::Byte,
            Prec::Byte,
            Prec::Half,
            Prec::Half,
            Prec::Half,
            Prec::Single,
            Prec::Single,
            Prec::Single,
            Prec::Double,
            Prec::Double,
        ])
    }

    fn random_values(&mut self, prec: Prec, n: usize) -> Vec<f64> {
        let dist = self.rng.below(4);
        (0..n)
            .map(|_| {
                let v = match (prec, dist) {
                    (Prec::Byte, 0 | 1) => self.rng.below(10) as f64,
                    (Prec::Byte, _) => self.rng.below(256) as f64,
                    (_, 0) => (self.rng.below(49) as f64 - 24.0) / 8.0,
                    (_, 1) => (2 + self.rng.below(23)) as f64 / 8.0,
                    (_, 2) => (self.rng.below(801) as f64 - 400.0) / 4.0,
                    _ => (self.rng.below(4097) as f64 - 2048.0) / 1024.0,
                };
                common::round_to(prec, v)
            })
            .collect()
    }

    fn new_input(&mut self, dims: Vec<usize>) -> usize {
        let prec = self.random_prec();
        let n = dims.iter().product();
        let values = self.random_values(prec, n);
        self.new_tensor(Kind::Input, dims, prec, values)
    }

    fn readable(&self, i: usize) -> bool {
        !self.ests[i].nonfinite && (self.p.tensors[i].kind == Kind::Input || self.written[i])
    }

    fn pick_arg(&mut self) -> usize {
        if let Some(l) = self.last {
            if self.readable(l) && self.rng.chance(50) {
                return l;
            }
        }
        let cands: Vec<usize> = (0..self.p.tensors.len())
            .filter(|&i| self.readable(i))
            .collect();
        if !cands.is_empty() && self.rng.chance(65) {
            return self.rng.pick(&cands);
        }
        let dims = self.random_dims();
        self.new_input(dims)
    }

    /// Builds an einsum spec over the arguments' dims; returns the argument terms, the result
    /// term and the result's dims.
    fn build_logic(&mut self, arg_dims: &[Vec<usize>]) -> (Vec<String>, String, Vec<usize>) {
        // Letters with their extent (None: only seen on axes of extent 1 so far).
        let mut letters: Vec<(char, Option<usize>)> = vec![];
        let fresh = |letters: &mut Vec<(char, Option<usize>)>, e: Option<usize>| {
            let c = LETTERS[letters.len()] as char;
            letters.push((c, e));
            c
        };
        let statics = self.p.statics.clone();
        let mut terms = vec![];
        for dims in arg_dims {
            let mut term = String::new();
            for &e in dims {
                let r = self.rng.below(100);
                if e == 1 {
                    if r < 20 {
                        term.push('0');
                    } else if r < 50 && !letters.is_empty() {
                        term.push(self.rng.pick(&letters).0);
                    } else {
                        term.push(fresh(&mut letters, None));
                    }
                } else {
                    let st: Vec<&(String, usize)> = statics.iter().filter(|s| s.1 <= e).collect();
                    let same: Vec<usize> = (0..letters.len())
                        .filter(|&k| letters[k].1.is_none_or(|x| x == e))
                        .collect();
                    if r < 8 {
                        term.push((b'0' + self.rng.below(e) as u8) as char);
                    } else if r < 16 && !st.is_empty() {
                        let s = st[self.rng.below(st.len())];
                        let _ = write!(term, "{{{}}}", s.0);
                    } else if r < 60 && !same.is_empty() {
                        let k = self.rng.pick(&same);
                        letters[k].1 = Some(e);
                        term.push(letters[k].0);
                    } else {
                        term.push(fresh(&mut letters, Some(e)));
                    }
                }
            }
            terms.push(term);
        }
        // The result: kept letters, maybe a new broadcast letter, a digit, a static index.
        let mut axes: Vec<(String, usize)> = vec![];
        let mut order: Vec<usize> = (0..letters.len()).collect();
        self.rng.shuffle(&mut order);
        for k in order {
            if self.rng.chance(70) {
                let dim = match letters[k].1 {
                    Some(e) if self.rng.chance(5) => {
                        let _ = e;
                        1
                    }
                    Some(e) => e,
                    None => 1 + self.rng.below(5),
                };
                axes.push((letters[k].0.to_string(), dim));
            }
        }
        if self.rng.chance(15) && letters.len() < LETTERS.len() {
            let e = 2 + self.rng.below(4);
            let c = fresh(&mut letters, Some(e));
            axes.push((c.to_string(), e));
        }
        if self.rng.chance(8) {
            let d = self.rng.below(3);
            axes.push((d.to_string(), d + 1 + self.rng.below(5 - d)));
        }
        if self.rng.chance(10) && !statics.is_empty() {
            let (name, range) = statics[self.rng.below(statics.len())].clone();
            axes.push((format!("{{{name}}}"), range + self.rng.below(6 - range)));
        }
        self.rng.shuffle(&mut axes);
        axes.truncate(4);
        if axes.is_empty() {
            axes.push(("0".into(), 1));
        }
        let lhs_term: String = axes.iter().map(|a| a.0.as_str()).collect();
        let lhs_dims = axes.iter().map(|a| a.1).collect();
        (terms, lhs_term, lhs_dims)
    }

    fn shape_of(&self, spec: &str, lhs_dims: &[usize], arg_dims: &[Vec<usize>]) -> Shape {
        let bindings = Bindings(
            self.p
                .statics
                .iter()
                .map(|(n, r)| StaticSymbol::new(n, Some(*r)))
                .collect(),
        );
        let rhs: Vec<&[usize]> = arg_dims.iter().map(Vec::as_slice).collect();
        let pr = projections(spec, lhs_dims, &rhs, &bindings).unwrap_or_else(|e| {
            panic!("the generated spec {spec:?} with result dims {lhs_dims:?} and argument dims {arg_dims:?} was rejected: {e}")
        });
        let in_lhs = |s| pr.project_lhs.contains(&AxisIndex::Iterator(s));
        let fan_in = pr
            .product_iterators
            .iter()
            .zip(&pr.product_space)
            .filter(|(s, _)| !in_lhs(**s))
            .map(|(_, n)| *n)
            .product();
        let full = pr.project_lhs.iter().zip(lhs_dims).all(|(ix, &d)| {
            d == 1 || matches!(ix, AxisIndex::Iterator(s) if pr.product_iterators.contains(s))
        });
        Shape {
            fan_in,
            full,
            bijective: pr.is_bijective(),
        }
    }

    /// Picks or creates the result of an assignment.
    fn choose_lhs(
        &mut self,
        dims: &[usize],
        args: &[usize],
        terms: &[String],
        lhs_term: &str,
    ) -> Option<usize> {
        if self.rng.chance(25) {
            let cands: Vec<usize> = (0..self.p.tensors.len())
                .filter(|&i| {
                    let t = &self.p.tensors[i];
                    t.dims == dims
                        && !self.ests[i].nonfinite
                        && args
                            .iter()
                            .zip(terms)
                            .all(|(&a, term)| a != i || term == lhs_term)
                })
                .collect();
            if !cands.is_empty() {
                return Some(self.rng.pick(&cands));
            }
        }
        let kind = match self.rng.below(20) {
            0..=8 => Kind::Temp,
            9..=17 => Kind::Output,
            _ => Kind::Input,
        };
        let prec = self.random_prec();
        let init = if kind == Kind::Input {
            self.random_values(prec, dims.iter().product())
        } else {
            vec![]
        };
        Some(self.new_tensor(kind, dims.to_vec(), prec, init))
    }

    /// Tries `stmt`; commits it if the estimates accept it.
    fn try_commit(&mut self, stmt: Stmt) -> bool {
        let mut e = self.ests.clone();
        if apply(&self.p, &stmt, &mut e).is_err() {
            return false;
        }
        self.ests = e;
        let lhs = stmt.lhs();
        for r in stmt.reads() {
            // A node read only by its own updates is copied into an output at the end half of
            // the time (otherwise it is computed and never consumed, which must compile too:
            // `regression_node_read_only_by_its_own_updates`).
            if r != lhs || self.rng.chance(50) {
                self.read[r] = true;
            }
        }
        self.written[lhs] = true;
        if self.p.tensors[lhs].kind == Kind::Temp {
            self.last = Some(lhs);
        }
        self.p.stmts.push(stmt);
        true
    }

    fn gen_accum(&mut self) -> bool {
        let n0 = self.p.tensors.len();
        let binary = self.rng.chance(55);
        let args: Vec<usize> = (0..if binary { 2 } else { 1 })
            .map(|_| self.pick_arg())
            .collect();
        let arg_dims: Vec<Vec<usize>> = args
            .iter()
            .map(|&i| self.p.tensors[i].dims.clone())
            .collect();
        let (terms, lhs_term, lhs_dims) = self.build_logic(&arg_dims);
        let Some(lhs) = self.choose_lhs(&lhs_dims, &args, &terms, &lhs_term) else {
            self.rollback(n0);
            return false;
        };
        let logic = format!("{}->{lhs_term}", terms.join(","));
        let shape = self.shape_of(&logic, &lhs_dims, &arg_dims);
        if shape.fan_in > 1 && args.contains(&lhs) {
            // Updating a node in place while reducing into it reads values the same statement
            // already changed; the estimates do not model that.
            self.rollback(n0);
            return false;
        }
        let mut ops: Vec<Op> = if binary {
            Binop::ALL.iter().map(|&b| Op::Bin(b)).collect()
        } else {
            Unop::ALL.iter().map(|&u| Op::Un(u)).collect()
        };
        self.rng.shuffle(&mut ops);
        let mut accums = [
            Binop::Arg2,
            Binop::Arg2,
            Binop::Add,
            Binop::Add,
            Binop::Sub,
            Binop::Mul,
            Binop::Max,
            Binop::Min,
        ];
        for &op in ops.iter().take(6) {
            self.rng.shuffle(&mut accums);
            for &accum in accums.iter().take(3) {
                let init = self.rng.chance(50);
                let stmt = Stmt::Accum {
                    lhs,
                    accum,
                    init,
                    op,
                    args: args.clone(),
                    logic: logic.clone(),
                    shape,
                };
                if self.try_commit(stmt) {
                    return true;
                }
            }
        }
        self.rollback(n0);
        false
    }

    fn new_result(&mut self, dims: Vec<usize>) -> usize {
        let kind = if self.rng.chance(55) {
            Kind::Temp
        } else {
            Kind::Output
        };
        let prec = self.random_prec();
        self.new_tensor(kind, dims, prec, vec![])
    }

    fn gen_fetch(&mut self) -> bool {
        let n0 = self.p.tensors.len();
        let has_statics = !self.p.statics.is_empty();
        let stmt = match self.rng.below(if has_statics { 3 } else { 1 }) {
            0 => {
                let dims = if self.rng.chance(60) {
                    vec![1]
                } else {
                    self.random_dims()
                };
                let lhs = self.new_result(dims);
                let t = &self.p.tensors[lhs];
                let special = t.kind == Kind::Output && t.prec != Prec::Byte;
                let c = if special && self.rng.chance(20) {
                    self.rng
                        .pick(&[f64::INFINITY, f64::NEG_INFINITY, f64::NAN, -0.0])
                } else {
                    self.rng.pick(&[
                        0.0,
                        0.5,
                        -1.25,
                        2.0,
                        3.0,
                        0.375,
                        1.0,
                        0.1,
                        1.0 / 3.0,
                        2.7,
                        -0.3,
                    ])
                };
                Stmt::Const { lhs, c }
            }
            1 => {
                let stat = self.rng.below(self.p.statics.len());
                let range = self.p.statics[stat].1;
                let cands: Vec<usize> = (0..self.p.tensors.len())
                    .filter(|&i| {
                        let d = &self.p.tensors[i].dims;
                        self.readable(i) && d.len() >= 2 && d[0] >= range
                    })
                    .collect();
                let src = if !cands.is_empty() && self.rng.chance(50) {
                    self.rng.pick(&cands)
                } else {
                    let mut dims = vec![range + self.rng.below(6 - range)];
                    let rest = self.random_dims();
                    dims.extend(rest.into_iter().take(3));
                    if dims.len() < 2 {
                        dims.push(1 + self.rng.below(5));
                    }
                    self.new_input(dims)
                };
                let dims = self.p.tensors[src].dims[1..].to_vec();
                let lhs = self.new_result(dims);
                Stmt::Slice { lhs, src, stat }
            }
            _ => {
                let stat = self.rng.below(self.p.statics.len());
                let dims = self.random_dims();
                let lhs = self.new_result(dims);
                Stmt::Embed { lhs, stat }
            }
        };
        if self.try_commit(stmt) {
            true
        } else {
            self.rollback(n0);
            false
        }
    }
}

/// Generates the program of one case; the same seed always gives the same program.
fn generate(seed: u64) -> Program {
    let mut g = Gen {
        rng: Rng::new(seed),
        p: Program {
            seed,
            tensors: vec![],
            statics: vec![],
            stmts: vec![],
            runs: vec![],
            ests: vec![],
        },
        ests: vec![],
        written: vec![],
        read: vec![],
        last: None,
    };
    let n_statics = g.rng.pick(&[0, 0, 1, 1, 2]);
    for k in 0..n_statics {
        let range = 1 + g.rng.below(5);
        g.p.statics.push((format!("s{k}"), range));
    }
    let target = 4 + g.rng.below(9);
    let mut attempts = 0;
    while g.p.stmts.len() < target && attempts < 4 * target {
        attempts += 1;
        if g.rng.chance(15) {
            g.gen_fetch();
        } else {
            g.gen_accum();
        }
    }
    // Every non-hosted result that nothing reads is copied into a hosted output.
    for i in 0..g.p.tensors.len() {
        let t = g.p.tensors[i].clone();
        if t.kind == Kind::Temp && g.written[i] && !g.read[i] && !g.ests[i].nonfinite {
            let prec = if g.rng.chance(50) {
                g.random_prec()
            } else {
                t.prec
            };
            let lhs = g.new_tensor(Kind::Output, t.dims.clone(), prec, vec![]);
            let term: String = (0..t.dims.len()).map(|k| LETTERS[k] as char).collect();
            let logic = format!("{term}->{term}");
            let shape = g.shape_of(&logic, &t.dims, std::slice::from_ref(&t.dims));
            let stmt = Stmt::Accum {
                lhs,
                accum: Binop::Arg2,
                init: false,
                op: Op::Un(Unop::Identity),
                args: vec![i],
                logic,
                shape,
            };
            if !g.try_commit(stmt) {
                g.rollback(lhs);
            }
        }
    }
    // Runs: as many (up to 1-3) as the estimates allow.
    let mut p = g.p;
    let mut runs = g.rng.pick(&[1, 2, 2, 3, 3]);
    let ests = loop {
        match p.replay(runs) {
            Ok(e) => break e,
            Err(_) if runs > 1 => runs -= 1,
            Err(why) => panic!("seed {seed}: replaying the generated program failed: {why}"),
        }
    };
    p.ests = ests;
    p.runs = (0..runs)
        .map(|_| {
            p.statics
                .iter()
                .map(|(_, r)| g.rng.below(*r) as i64)
                .collect()
        })
        .collect();
    p
}

// ------------------------------------------------------------------------------------------
// The program-file rendering (PROGRAM_FORMAT.md).

fn json_num(v: f64) -> String {
    if v.is_nan() {
        "\"nan\"".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "\"inf\"".into()
        } else {
            "\"-inf\"".into()
        }
    } else {
        format!("{v:?}")
    }
}

fn accum_name(a: Binop) -> &'static str {
    if a == Binop::Arg2 {
        "set"
    } else {
        a.name()
    }
}

fn to_json(p: &Program) -> String {
    let mut s = String::from("{\n  \"tensors\": [\n");
    let n = |i: usize| &p.tensors[i].name;
    for (i, t) in p.tensors.iter().enumerate() {
        let _ = write!(
            s,
            "    {{\"name\": \"{}\", \"dims\": {:?}, \"prec\": \"{}\"",
            t.name,
            t.dims,
            t.prec.name()
        );
        if t.kind == Kind::Input {
            let v: Vec<String> = t.init.iter().map(|&v| json_num(v)).collect();
            let _ = write!(s, ", \"init\": {{\"values\": [{}]}}", v.join(", "));
        }
        s.push('}');
        s.push_str(if i + 1 < p.tensors.len() { ",\n" } else { "\n" });
    }
    s.push_str("  ],\n");
    let st: Vec<String> = p
        .statics
        .iter()
        .map(|(name, r)| format!("{{\"name\": \"{name}\", \"range\": {r}}}"))
        .collect();
    let _ = writeln!(s, "  \"static_indices\": [{}],", st.join(", "));
    s.push_str("  \"routines\": [{\"name\": \"case\", \"code\": [\n");
    let stmts: Vec<String> = p
        .stmts
        .iter()
        .map(|st| match st {
            Stmt::Accum {
                lhs,
                accum,
                init,
                op,
                args,
                logic,
                ..
            } => {
                let a: Vec<String> = args.iter().map(|&i| format!("\"{}\"", n(i))).collect();
                format!(
                    "    {{\"assign\": \"{}\", \"op\": \"{}\", \"args\": [{}], \"logic\": \"{logic}\", \"accum\": \"{}\", \"init_neutral\": {init}}}",
                    n(*lhs),
                    op.name(),
                    a.join(", "),
                    accum_name(*accum)
                )
            }
            Stmt::Const { lhs, c } => {
                format!("    {{\"fetch\": \"{}\", \"constant\": {}}}", n(*lhs), json_num(*c))
            }
            Stmt::Slice { lhs, src, stat } => format!(
                "    {{\"fetch\": \"{}\", \"slice\": \"{}\", \"index\": \"{}\"}}",
                n(*lhs),
                n(*src),
                p.statics[*stat].0
            ),
            Stmt::Embed { lhs, stat } => format!(
                "    {{\"fetch\": \"{}\", \"embed_index\": \"{}\"}}",
                n(*lhs),
                p.statics[*stat].0
            ),
        })
        .collect();
    s.push_str(&stmts.join(",\n"));
    s.push_str("\n  ]}],\n  \"run\": [\n");
    let runs: Vec<String> = p
        .runs
        .iter()
        .map(|vals| {
            let b: Vec<String> = p
                .statics
                .iter()
                .zip(vals)
                .map(|((name, _), v)| format!("\"{name}\": {v}"))
                .collect();
            format!(
                "    {{\"routine\": \"case\", \"bindings\": {{{}}}}}",
                b.join(", ")
            )
        })
        .collect();
    s.push_str(&runs.join(",\n"));
    let printed: Vec<String> = p
        .hosted()
        .iter()
        .map(|&i| format!("\"{}\"", n(i)))
        .collect();
    let _ = write!(s, "\n  ],\n  \"print\": [{}]\n}}\n", printed.join(", "));
    s
}

// ------------------------------------------------------------------------------------------
// Instantiation and the three ways of running.

struct Instance {
    tnodes: Vec<Tnode>,
    statics: Vec<StaticSymbol>,
    asgns: Assignments,
}

fn instantiate(p: &Program) -> Instance {
    let tnodes: Vec<Tnode> = p
        .tensors
        .iter()
        .map(|t| match t.kind {
            Kind::Input => Tnode::with_init(
                &[&t.name],
                &t.dims,
                t.prec,
                &InitOp::ConstantFill {
                    values: t.init.clone(),
                    strict: true,
                },
            )
            .unwrap(),
            Kind::Output => {
                let tn = Tnode::new(&[&t.name], &t.dims, t.prec).unwrap();
                tn.ensure_hosted().unwrap();
                tn
            }
            Kind::Temp => Tnode::new(&[&t.name], &t.dims, t.prec).unwrap(),
        })
        .collect();
    let statics: Vec<StaticSymbol> = p
        .statics
        .iter()
        .map(|(n, r)| StaticSymbol::new(n, Some(*r)))
        .collect();
    let bindings = Bindings(statics.clone());
    let node = |i: usize| tnodes[i].clone();
    let stmts: Vec<Assignments> = p
        .stmts
        .iter()
        .map(|s| match s {
            Stmt::Accum {
                lhs,
                accum,
                init,
                op,
                args,
                logic,
                ..
            } => {
                let rhs: Vec<&[usize]> = args.iter().map(|&i| tnodes[i].dims()).collect();
                let projections = projections(logic, tnodes[*lhs].dims(), &rhs, &bindings)
                    .unwrap_or_else(|e| panic!("seed {}: {e}", p.seed));
                match op {
                    Op::Un(u) => Assignments::AccumUnop {
                        initialize_neutral: *init,
                        accum: *accum,
                        op: *u,
                        lhs: node(*lhs),
                        rhs: Buffer::Node(node(args[0])),
                        projections,
                    },
                    Op::Bin(b) => Assignments::AccumBinop {
                        initialize_neutral: *init,
                        accum: *accum,
                        op: *b,
                        lhs: node(*lhs),
                        rhs1: Buffer::Node(node(args[0])),
                        rhs2: Buffer::Node(node(args[1])),
                        projections,
                    },
                }
            }
            Stmt::Const { lhs, c } => Assignments::Fetch {
                array: node(*lhs),
                fetch_op: FetchOp::Constant(*c),
            },
            Stmt::Slice { lhs, src, stat } => Assignments::Fetch {
                array: node(*lhs),
                fetch_op: FetchOp::Slice {
                    batch_idx: statics[*stat].clone(),
                    sliced: node(*src),
                },
            },
            Stmt::Embed { lhs, stat } => Assignments::Fetch {
                array: node(*lhs),
                fetch_op: FetchOp::EmbedSymbol(statics[*stat].clone()),
            },
        })
        .collect();
    let asgns = Assignments::block(&format!("case {}", p.seed), Assignments::seq(stmts));
    Instance {
        tnodes,
        statics,
        asgns,
    }
}

/// Values of the hosted tensors: `[run][hosted tensor][cell]`.
type Outputs = Vec<Vec<Vec<f64>>>;

fn statics_for(inst: &Instance, run: &[i64]) -> Vec<(StaticSymbol, i64)> {
    inst.statics
        .iter()
        .cloned()
        .zip(run.iter().copied())
        .collect()
}

/// (b): the interpreter on the unoptimized loop IR.
fn run_interp(p: &Program, inst: &Instance) -> Result<Outputs, String> {
    let mut mem = Memory::new();
    mem.load_from_hosts(&inst.tnodes);
    let hosted = p.hosted();
    let mut out = vec![];
    for run in &p.runs {
        interp::run_assignments(&inst.asgns, &statics_for(inst, run), &mut mem)
            .map_err(|e| format!("interpreter: {e}"))?;
        out.push(
            hosted
                .iter()
                .map(|&i| mem.get(&inst.tnodes[i]).map(<[f64]>::to_vec))
                .collect::<Option<Vec<_>>>()
                .ok_or("interpreter: a hosted tensor is missing from memory")?,
        );
    }
    Ok(out)
}

/// (d): the interpreter on the optimized loop IR of a compiled instance.
fn run_interp_optimized(p: &Program, inst: &Instance, o: &Optimized) -> Result<Outputs, String> {
    let mut mem = Memory::new();
    for (t, tn) in p.tensors.iter().zip(&inst.tnodes) {
        if t.kind == Kind::Input {
            mem.set(tn, t.init.clone()).map_err(|e| e.to_string())?;
        }
    }
    let hosted = p.hosted();
    let mut out = vec![];
    for run in &p.runs {
        interp::run_optimized(o, &statics_for(inst, run), &mut mem)
            .map_err(|e| format!("interpreter on the optimized code: {e}"))?;
        out.push(
            hosted
                .iter()
                .map(|&i| {
                    mem.get(&inst.tnodes[i])
                        .map(<[f64]>::to_vec)
                        .unwrap_or_else(|| vec![0.0; inst.tnodes[i].numel()])
                })
                .collect(),
        );
    }
    Ok(out)
}

/// A compiled run of one case: the outputs, the optimized code and the instance it ran on.
type Compiled = Result<(Outputs, Optimized, Instance), String>;

/// (a) / (c): compiles the cases in one batch (one C file) and runs each; on a compile
/// failure, retries case by case (with fresh nodes) to find the culprit.
fn run_compiled(progs: &[&Program], settings: &Settings) -> Vec<Compiled> {
    let insts: Vec<Instance> = progs.iter().map(|p| instantiate(p)).collect();
    let backend = CcBackend::with_settings(settings.clone());
    backend.initialize(Config::default());
    let bindings = Bindings(insts.iter().flat_map(|i| i.statics.clone()).collect());
    let names: Vec<String> = progs.iter().map(|p| format!("case_{}", p.seed)).collect();
    let asgns: Vec<Assignments> = insts.iter().map(|i| i.asgns.clone()).collect();
    let linked = backend
        .compile_batch(true, Some(&names), None, &bindings, &asgns)
        .and_then(|batch| {
            let ctx = backend.init("differential")?;
            let (ctx, routines) = backend.link_batch(&[], &MergeBuffer::new(), &ctx, &batch)?;
            Ok((batch, ctx, routines))
        });
    let (batch, ctx, routines) = match linked {
        Ok(x) => x,
        Err(e) if progs.len() == 1 => return vec![Err(format!("compile/link: {e}"))],
        Err(_) => {
            return progs
                .iter()
                .flat_map(|p| run_compiled(&[p], settings))
                .collect()
        }
    };
    let optimized = batch.optimized();
    let mut out = vec![];
    for (k, (p, inst)) in progs.iter().zip(insts).enumerate() {
        let run = || -> Result<Outputs, String> {
            let r = routines[k]
                .as_ref()
                .ok_or("routine missing from the batch")?;
            let hosted = p.hosted();
            for &i in &hosted {
                backend
                    .from_host(&ctx, &inst.tnodes[i])
                    .map_err(|e| e.to_string())?;
            }
            let mut outs = vec![];
            for vals in &p.runs {
                for (s, &v) in inst.statics.iter().zip(vals) {
                    r.bindings().set_symbol(s, v).map_err(|e| e.to_string())?;
                }
                r.run().map_err(|e| format!("run: {e}"))?;
                let mut snap = vec![];
                for &i in &hosted {
                    let tn = &inst.tnodes[i];
                    backend.to_host(&ctx, tn).map_err(|e| e.to_string())?;
                    snap.push(tn.host_values().ok_or("not hosted")?);
                }
                outs.push(snap);
            }
            Ok(outs)
        };
        let o = optimized[k].cloned();
        out.push(match (run(), o) {
            (Ok(v), Some(o)) => Ok((v, o, inst)),
            (Err(e), _) => Err(e),
            (Ok(_), None) => Err("no optimized code".into()),
        });
    }
    out
}

// ------------------------------------------------------------------------------------------
// Comparison.

/// Multiplier on the error bound.
const TOL_FACTOR: f64 = 2.0;

/// Whether `g` and `w` agree for a tensor with estimate `est`; also returns how much of the
/// tolerance was used (for statistics).
fn close(g: f64, w: f64, est: &Est, factor: f64) -> (bool, f64) {
    if g.is_nan() || w.is_nan() {
        return (g.is_nan() && w.is_nan(), 0.0);
    }
    if g.is_infinite() || w.is_infinite() {
        return (g == w, 0.0);
    }
    if est.grid.is_some() {
        return (g == w, 0.0);
    }
    let tol = factor * TOL_FACTOR * est.err;
    let d = (g - w).abs();
    (d <= tol, if tol > 0.0 { d / tol } else { 0.0 })
}

#[derive(Default)]
struct Stats {
    cases: usize,
    stmts: BTreeMap<String, usize>,
    precs: BTreeMap<&'static str, usize>,
    runs: BTreeMap<usize, usize>,
    with_statics: usize,
    temps: usize,
    inlined_temps: usize,
    exact_cells: usize,
    inexact_cells: usize,
    max_used: f64,
}

impl Stats {
    fn add_program(&mut self, p: &Program) {
        self.cases += 1;
        for s in &p.stmts {
            let key = match s {
                Stmt::Accum {
                    accum,
                    init,
                    op,
                    shape,
                    ..
                } => {
                    *self
                        .stmts
                        .entry(format!(
                            "accum {}{}",
                            accum_name(*accum),
                            if *init { "+init" } else { "" }
                        ))
                        .or_default() += 1;
                    if !shape.bijective {
                        *self.stmts.entry("non-bijective".into()).or_default() += 1;
                    }
                    if !shape.full {
                        *self.stmts.entry("partial write".into()).or_default() += 1;
                    }
                    format!("op {}", op.name())
                }
                Stmt::Const { .. } => "fetch constant".into(),
                Stmt::Slice { .. } => "fetch slice".into(),
                Stmt::Embed { .. } => "fetch embed".into(),
            };
            *self.stmts.entry(key).or_default() += 1;
        }
        for t in &p.tensors {
            *self.precs.entry(t.prec.name()).or_default() += 1;
        }
        *self.runs.entry(p.runs.len()).or_default() += 1;
        self.with_statics += usize::from(!p.statics.is_empty());
    }

    fn merge(&mut self, o: Stats) {
        self.cases += o.cases;
        for (k, v) in o.stmts {
            *self.stmts.entry(k).or_default() += v;
        }
        for (k, v) in o.precs {
            *self.precs.entry(k).or_default() += v;
        }
        for (k, v) in o.runs {
            *self.runs.entry(k).or_default() += v;
        }
        self.with_statics += o.with_statics;
        self.temps += o.temps;
        self.inlined_temps += o.inlined_temps;
        self.exact_cells += o.exact_cells;
        self.inexact_cells += o.inexact_cells;
        self.max_used = self.max_used.max(o.max_used);
    }
}

/// Compares two runs of a case; pushes up to a few messages per disagreement.
fn compare(
    p: &Program,
    what: &str,
    got: &Outputs,
    want: &Outputs,
    factor: f64,
    stats: Option<&mut Stats>,
    problems: &mut Vec<String>,
) {
    let hosted = p.hosted();
    let mut shown = 0;
    let (mut exact, mut inexact, mut used) = (0, 0, 0f64);
    for (r, (g_run, w_run)) in got.iter().zip(want).enumerate() {
        for (k, &ti) in hosted.iter().enumerate() {
            let est = &p.ests[r][ti];
            let (g, w) = (&g_run[k], &w_run[k]);
            if g.len() != w.len() {
                problems.push(format!(
                    "{what}: run {r}: {} has {} cells vs {}",
                    p.tensors[ti].name,
                    g.len(),
                    w.len()
                ));
                continue;
            }
            for (cell, (&gv, &wv)) in g.iter().zip(w).enumerate() {
                let (ok, u) = close(gv, wv, est, factor);
                if est.grid.is_some() {
                    exact += 1;
                } else {
                    inexact += 1;
                }
                if ok {
                    used = used.max(u);
                } else {
                    if shown < 6 {
                        problems.push(format!(
                            "{what}: after run {} tensor {} ({}, dims {:?}) cell {cell}: {gv:?} vs {wv:?} (difference {:e}; {})",
                            r + 1,
                            p.tensors[ti].name,
                            p.tensors[ti].prec,
                            p.tensors[ti].dims,
                            (gv - wv).abs(),
                            match est.grid {
                                Some(_) => "expected identical values".to_string(),
                                None => format!("tolerance {:e}", factor * TOL_FACTOR * est.err),
                            }
                        ));
                    }
                    shown += 1;
                }
            }
        }
    }
    if shown > 6 {
        problems.push(format!("{what}: ... {} more differing cells", shown - 6));
    }
    if let Some(s) = stats {
        s.exact_cells += exact;
        s.inexact_cells += inexact;
        s.max_used = s.max_used.max(used);
    }
}

struct CaseReport {
    seed: u64,
    problems: Vec<String>,
    json: String,
}

/// Runs the cases of one batch all ways and compares them.
fn process(seeds: &[u64], opts: &Opts, verbose: bool) -> (Vec<CaseReport>, Stats) {
    let progs: Vec<Program> = seeds.iter().map(|&s| generate(s)).collect();
    let refs: Vec<&Program> = progs.iter().collect();
    let a = run_compiled(&refs, &opts.settings);
    let c = run_compiled(
        &refs,
        &Settings {
            enabled: false,
            ..Default::default()
        },
    );
    let mut stats = Stats::default();
    let mut reports = vec![];
    for ((p, a), c) in progs.iter().zip(a).zip(c) {
        stats.add_program(p);
        let mut problems = vec![];
        let b = run_interp(p, &instantiate(p));
        if let Err(e) = &b {
            problems.push(format!("(b) interpreter failed: {e}"));
        }
        match &a {
            Err(e) => problems.push(format!("(a) compiled, optimizer on, failed: {e}")),
            Ok((va, o, inst)) => {
                for (t, tn) in p.tensors.iter().zip(&inst.tnodes) {
                    if t.kind == Kind::Temp {
                        stats.temps += 1;
                        stats.inlined_temps +=
                            usize::from(tn.memory_mode() == Some(MemoryMode::Virtual));
                    }
                }
                if let Ok(vb) = &b {
                    compare(
                        p,
                        "(a) compiled vs (b) interpreted",
                        va,
                        vb,
                        1.0,
                        Some(&mut stats),
                        &mut problems,
                    );
                    match run_interp_optimized(p, inst, o) {
                        Ok(vd) => compare(
                            p,
                            "(d) interpreted optimized code vs (b) interpreted",
                            &vd,
                            vb,
                            1.0,
                            None,
                            &mut problems,
                        ),
                        Err(e) => problems.push(format!("(d) {e}")),
                    }
                }
            }
        }
        match (&c, &a) {
            (Err(e), _) => problems.push(format!("(c) compiled, optimizer off, failed: {e}")),
            (Ok((vc, _, _)), Ok((va, _, _))) => compare(
                p,
                "(c) optimizer off vs (a) optimizer on",
                vc,
                va,
                2.0,
                None,
                &mut problems,
            ),
            _ => {}
        }
        let a_bad = problems.iter().any(|m| m.starts_with("(a) compiled vs"));
        let d_bad = problems.iter().any(|m| m.starts_with("(d)"));
        if d_bad {
            problems.push(
                "diagnosis: the optimized loop IR already computes other values (d ≠ b): the \
                 optimizer changed the program's meaning"
                    .into(),
            );
        } else if a_bad {
            problems.push(
                "diagnosis: the optimized loop IR computes the right values (d = b), the compiled \
                 C does not: a C generation bug, or a C compiler bug (gcc 12.2 miscompiles some \
                 vectorized loops at -O3 -march=native, see \
                 regression_gcc12_vectorizer_wrong_code; rerun with \
                 ARRAYJIT_CFLAGS=-fno-tree-vectorize or ARRAYJIT_OPT_LEVEL=2 to tell)"
                    .into(),
            );
        }
        let json = to_json(p);
        if verbose {
            eprintln!("seed {}:\n{json}", p.seed);
        }
        reports.push(CaseReport {
            seed: p.seed,
            problems,
            json,
        });
    }
    (reports, stats)
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

#[test]
fn differential_random_programs() {
    let cases = env_u64("ARRAYJIT_FUZZ_CASES", 300) as usize;
    let base = env_u64("ARRAYJIT_FUZZ_SEED", 20_240_601);
    let batch = env_u64("ARRAYJIT_FUZZ_BATCH", 25).max(1) as usize;
    let defaults = Settings::default();
    let opts = Opts {
        settings: Settings {
            max_visits: env_u64("ARRAYJIT_FUZZ_MAX_VISITS", defaults.max_visits as u64) as usize,
            max_tracing_dim: env_u64(
                "ARRAYJIT_FUZZ_MAX_TRACING_DIM",
                defaults.max_tracing_dim as u64,
            ) as usize,
            ..defaults
        },
    };
    let verbose = env_flag("ARRAYJIT_FUZZ_VERBOSE");
    let seeds: Vec<u64> = (0..cases as u64).map(|i| base.wrapping_add(i)).collect();
    let chunks: Vec<&[u64]> = seeds.chunks(batch).collect();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, Vec<CaseReport>, Stats)>> = Mutex::new(vec![]);
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8)
        .min(chunks.len().max(1));
    let start = std::time::Instant::now();
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::SeqCst);
                let Some(chunk) = chunks.get(k) else { break };
                let (reports, stats) = process(chunk, &opts, verbose);
                results.lock().unwrap().push((k, reports, stats));
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|r| r.0);
    let mut stats = Stats::default();
    let mut failed = vec![];
    for (_, reports, s) in results {
        stats.merge(s);
        for r in reports {
            if !r.problems.is_empty() {
                eprintln!(
                    "==== differential mismatch, seed {} (rerun: ARRAYJIT_FUZZ_SEED={} ARRAYJIT_FUZZ_CASES=1) ====",
                    r.seed, r.seed
                );
                for m in &r.problems {
                    eprintln!("  {m}");
                }
                eprintln!("program (arrayjit run prog.json):\n{}", r.json);
                failed.push(r.seed);
            }
        }
    }
    let info = format!(
        "differential: {:.1}s; {} of {} temporaries inlined; {} cells compared exactly, {} within tolerance (at most {:.0}% of it used); runs {:?}; {} cases with static indices\n  precisions {:?}\n  statements {:?}",
        start.elapsed().as_secs_f64(),
        stats.inlined_temps,
        stats.temps,
        stats.exact_cells,
        stats.inexact_cells,
        stats.max_used * 100.0,
        stats.runs,
        stats.with_statics,
        stats.precs,
        stats.stmts
    );
    eprintln!("{info}");
    let summary = format!("differential: {} cases, {} mismatches", cases, failed.len());
    println!("{summary}");
    eprintln!("{summary}");
    assert!(
        failed.is_empty(),
        "{summary}; failing seeds: {failed:?} (programs printed above)"
    );
}

#[test]
fn differential_generator_is_deterministic() {
    for seed in [1, 77, 12345] {
        let a = generate(seed);
        let b = generate(seed);
        assert_eq!(to_json(&a), to_json(&b));
        assert_eq!(a.ests, b.ests);
        assert!(!a.stmts.is_empty(), "seed {seed} generated no statements");
    }
}

/// The printed programs are valid program files that mean the same thing: loading one with
/// the CLI's reader and interpreting it gives exactly the values of the generated program.
#[test]
fn differential_programs_round_trip_through_program_files() {
    let dir = tempfile::tempdir().unwrap();
    let (mut with_statics, mut with_non_finite) = (false, false);
    for seed in 500..800u64 {
        if seed >= 530 && with_statics && with_non_finite {
            break;
        }
        let p = generate(seed);
        with_statics |= !p.statics.is_empty();
        with_non_finite |= p
            .stmts
            .iter()
            .any(|s| matches!(s, Stmt::Const { c, .. } if !c.is_finite()));
        let path = dir.path().join(format!("case{seed}.json"));
        std::fs::write(&path, to_json(&p)).unwrap();
        let (built, _) = program::load(path.to_str().unwrap())
            .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", to_json(&p)));
        assert_eq!(built.assignments.len(), 1);
        let mut mem = Memory::new();
        mem.load_from_hosts(built.tensors.iter().map(|(_, t)| t));
        let mut out = vec![];
        for run in &p.runs {
            let statics: Vec<(StaticSymbol, i64)> = p
                .statics
                .iter()
                .zip(run)
                .map(|((name, _), v)| (built.bindings.find(name).unwrap().clone(), *v))
                .collect();
            interp::run_assignments(&built.assignments[0], &statics, &mut mem).unwrap();
            out.push(
                built
                    .print
                    .iter()
                    .map(|(_, t)| mem.get(t).unwrap().to_vec())
                    .collect::<Vec<_>>(),
            );
        }
        let want = run_interp(&p, &instantiate(&p)).unwrap();
        assert_eq!(out.len(), want.len());
        for (g, w) in out.iter().zip(&want) {
            for (g, w) in g.iter().zip(w) {
                assert!(
                    g.iter()
                        .zip(w)
                        .all(|(a, b)| a == b || (a.is_nan() && b.is_nan())),
                    "seed {seed}: {g:?} vs {w:?}\n{}",
                    to_json(&p)
                );
            }
        }
    }
    assert!(with_statics && with_non_finite);
}

// ------------------------------------------------------------------------------------------
// Regressions: minimal reproductions of bugs the differential test found. The three library
// bugs are fixed (commit 7ee7cee); while they were open, these tests were ignored and the
// generator avoided the constructs. The C compiler bug is not arrayjit's: its test stays
// ignored (run it with `cargo test --test differential -- --ignored`).

mod common;

/// Interprets `asgns` once and returns the values of `outs`.
fn interpret(asgns: &Assignments, outs: &[&Tnode]) -> Vec<Vec<f64>> {
    let mut mem = Memory::new();
    mem.load_from_hosts(&asgns.nodes());
    interp::run_assignments(asgns, &[], &mut mem).unwrap();
    outs.iter().map(|t| mem.get(t).unwrap().to_vec()).collect()
}

/// Bug (fixed): when the optimizer inlines a node and the node's local scope collapses into the
/// reader's expression (`simplify` turns a scope that only sets its local into the bare
/// expression), the node's value is neither computed in its own compute type nor rounded to
/// its precision: a byte intermediate is no longer truncated or saturated, a half one no
/// longer rounded to half. The unoptimized code (and the optimizer off) store and round it.
#[test]
fn regression_inlined_node_loses_its_precision() {
    use common::*;
    let b = Bindings::empty();
    for tp in [Prec::Byte, Prec::Half] {
        let x = input("x", &[3], Prec::Single, &[1.5, 2.75, 3.125]);
        let y = input("y", &[3], Prec::Single, &[1.3, 1.01, 7.77]);
        let t = temp("t", &[3], tp);
        let out = output("out", &[3], Prec::Double);
        // t = x * y (t is inlined); out = t
        let asgns = Assignments::seq([
            binop(&t, Binop::Arg2, false, Binop::Mul, &x, &y, "i,i->i", &b),
            unop(&out, Binop::Arg2, false, Unop::Identity, &t, "i->i", &b),
        ]);
        let want: Vec<f64> = [(1.5f32, 1.3f32), (2.75, 1.01), (3.125, 7.77)]
            .iter()
            .map(|&(x, y)| round_to(tp, (x * y) as f64))
            .collect();
        assert_eq!(interpret(&asgns, &[&out])[0], want, "interpreter, {tp}");
        let (got, src) = compute(&asgns, &b, &[&out]);
        assert_eq!(got[0], want, "compiled with t of precision {tp}:\n{src}");
    }
}

/// Bug (fixed): a non-hosted node whose only reads are its own accumulations (computed, updated in
/// place, never consumed) makes compilation fail: "memory mode conflict for tensor t: it is
/// Virtual but routine ... still reads or writes it". Tracing counts its own reads, so
/// cleanup does not treat it as an output, and virtualization finds no reader to inline it
/// into, so it defaults to Virtual while its code stays.
#[test]
fn regression_node_read_only_by_its_own_updates() {
    use common::*;
    let b = Bindings::empty();
    let x = input("x", &[3], Prec::Single, &[1., 2., 3.]);
    let t = temp("t", &[3], Prec::Single);
    let out = output("out", &[3], Prec::Single);
    // t = x; t += t; out = -x (t is never consumed)
    let asgns = Assignments::seq([
        unop(&t, Binop::Arg2, false, Unop::Identity, &x, "i->i", &b),
        unop(&t, Binop::Add, false, Unop::Identity, &t, "i->i", &b),
        unop(&out, Binop::Arg2, false, Unop::Neg, &x, "i->i", &b),
    ]);
    assert_eq!(
        interpret(&asgns, &[&out, &t]),
        vec![vec![-1., -2., -3.], vec![2., 4., 6.]]
    );
    let backend = CcBackend::new();
    match common::build(&backend, "own_updates", &b, &asgns) {
        Ok((r, _)) => {
            let got = common::run_and_read(&backend, &r, &[&out]);
            assert_eq!(got[0], vec![-1., -2., -3.]);
        }
        Err(e) => panic!("compiling failed: {e}"),
    }
}

/// Bug (fixed): tracing counts a read whose cell involves a static index as a read of written cells
/// as soon as the node has any write (`Tracer::read`: `written = any_write` for inexact
/// cells). A non-hosted node written at one static index and read at another is therefore
/// not recurrent: it becomes Local (zeroed on every call) and loses the cells written by
/// earlier runs, which the routine reads. The interpreter (and the spec's rule "a node read
/// before it is written is recurrent") keep them.
#[test]
fn regression_static_index_read_of_partially_written_node() {
    use common::*;
    let s = StaticSymbol::new("s", Some(3));
    let r = StaticSymbol::new("r", Some(3));
    let b = Bindings(vec![s.clone(), r.clone()]);
    let x = input("x", &[3], Prec::Single, &[10., 20., 30.]);
    let t = temp("t", &[3], Prec::Single);
    let out = output("out", &[1], Prec::Single);
    // t[s] = x[s]; out = t[r]
    let asgns = Assignments::seq([
        unop(&t, Binop::Arg2, false, Unop::Identity, &x, "{s}->{s}", &b),
        unop(&out, Binop::Arg2, false, Unop::Identity, &t, "{r}->0", &b),
    ]);
    // Run 1 writes t[0]; run 2 writes t[1] and reads t[0].
    let runs = [(0, 0, 10.0), (1, 0, 10.0)];
    let mut mem = Memory::new();
    mem.load_from_hosts(&asgns.nodes());
    for &(sv, rv, want) in &runs {
        interp::run_assignments(&asgns, &[(s.clone(), sv), (r.clone(), rv)], &mut mem).unwrap();
        assert_eq!(
            mem.get(&out).unwrap(),
            &[want],
            "interpreter, s={sv} r={rv}"
        );
    }
    let backend = CcBackend::new();
    let (routine, src) = common::build(&backend, "static_reads", &b, &asgns).unwrap();
    for &(sv, rv, want) in &runs {
        routine.bindings().set("s", sv).unwrap();
        routine.bindings().set("r", rv).unwrap();
        let got = common::run_and_read(&backend, &routine, &[&out]);
        assert_eq!(
            got[0],
            vec![want],
            "compiled, s={sv} r={rv}; t is {:?}:\n{src}",
            t.memory_mode()
        );
    }
}

/// Not an arrayjit bug but wrong results all the same: gcc 12.2 at `-O3 -march=native`
/// (the default flags) miscompiles some loop nests the optimizer produces, in its loop
/// vectorizer (the results are right at `-O2`, with `-fno-tree-vectorize`, and with clang).
/// Found by the differential test (seeds 1001694 and 1000377 from base 1000000). Standalone C
/// reproductions are in the report; this test passes where the C compiler is not affected.
#[test]
fn regression_gcc12_vectorizer_wrong_code() {
    use common::*;
    let b = Bindings::empty();
    // (1) AVX2: a broadcast read under a condition on a local array (seed 1001694):
    // t1 = -transpose(x0); o8[a, b, c, d] = t1[a, 2] > 0 ? x0[b, c] : 0
    let xv: Vec<f64> = (0..20).map(|i| ((i * 7) % 11) as f64 - 5.0).collect();
    let x0 = input("x0", &[5, 4], Prec::Single, &xv);
    let t1 = temp("t1", &[4, 5], Prec::Single);
    let o8 = output("o8", &[4, 5, 4, 4], Prec::Single);
    let asgns = Assignments::seq([
        unop(&t1, Binop::Arg2, false, Unop::Neg, &x0, "ab->ba", &b),
        binop(
            &o8,
            Binop::Arg2,
            true,
            Binop::ReluGate,
            &t1,
            &x0,
            "a2,bc->abcd",
            &b,
        ),
    ]);
    let want = interpret(&asgns, &[&o8]);
    let mut hand = vec![];
    for a in 0..4 {
        for bb in 0..5 {
            for c in 0..4 {
                for _d in 0..4 {
                    hand.push(if -xv[2 * 4 + a] > 0.0 {
                        xv[bb * 4 + c]
                    } else {
                        0.0
                    });
                }
            }
        }
    }
    assert_eq!(want[0], hand);
    let (got, src) = compute(&asgns, &b, &[&o8]);
    assert_eq!(got, want, "{src}");

    // (2) AVX-512: a conditional reduction in an inlined node (seed 1000377):
    // o15[i, j] = - sum_k (x13[k, 0] > 0 ? t12[i, j, k] : 0)
    let t12v: Vec<f64> = (0..24).map(|i| -10.0 * ((i % 4) + 1) as f64).collect();
    let t12 = input("t12", &[3, 2, 4], Prec::Single, &t12v);
    let x13 = input(
        "x13",
        &[4, 2],
        Prec::Double,
        &[-0.79, -0.3, 0.53, 0.125, -0.77, -1.71, 0.3, -1.16],
    );
    let t14 = temp("t14", &[3, 2], Prec::Single);
    let o15 = output("o15", &[3, 2], Prec::Single);
    let asgns = Assignments::seq([
        binop(
            &t14,
            Binop::Sub,
            true,
            Binop::ReluGate,
            &x13,
            &t12,
            "a0,bca->bc",
            &b,
        ),
        unop(&o15, Binop::Arg2, false, Unop::Identity, &t14, "ab->ab", &b),
    ]);
    assert_eq!(interpret(&asgns, &[&o15])[0], vec![60.0; 6]);
    let (got, src) = compute(&asgns, &b, &[&o15]);
    assert_eq!(got[0], vec![60.0; 6], "{src}");
}
