//! The forward error analysis: for every tensor, whether the two computations compared hold
//! identical values and, if not, a bound on their difference (see the crate documentation).

use super::case::{Op, Program, Stmt};
use super::common;
use arrayjit::ir::{Binop, Prec, Ternop, Unop};

/// The grid exponent of a set of zeros (a multiple of every power of two).
pub const ANY: i32 = i32::MAX / 2;
/// Largest magnitude of a tensor's values (half overflows at 65504).
pub const MAX_MAG: f64 = 1e4;
/// Largest magnitude of an intermediate value.
pub const MAX_TERM: f64 = 1e5;

/// A floating-point format: significand bits (with the implicit one), smallest exponent of
/// the last place (subnormals included), largest finite value.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct Fmt {
    pub mant: i32,
    pub min_e: i32,
    pub max: f64,
}

pub const HALF: Fmt = Fmt {
    mant: 11,
    min_e: -24,
    max: 65504.0,
};
pub const SINGLE: Fmt = Fmt {
    mant: 24,
    min_e: -149,
    max: f32::MAX as f64,
};
pub const DOUBLE: Fmt = Fmt {
    mant: 53,
    min_e: -1074,
    max: f64::MAX,
};
/// bfloat16: 8 significant bits, subnormals down to 2^-133.
pub const BF16: Fmt = Fmt {
    mant: 8,
    min_e: -133,
    max: 3.3895313892515355e38,
};
/// fp8 (E5M2): 3 significant bits, subnormals down to 2^-16, largest finite 57344.
pub const FP8: Fmt = Fmt {
    mant: 3,
    min_e: -16,
    max: 57344.0,
};

/// The format generated C computes in when writing a node of precision `p`.
pub fn compute_fmt(p: Prec) -> Fmt {
    match p {
        Prec::Half | Prec::Single | Prec::Bfloat16 | Prec::Fp8 => SINGLE,
        _ => DOUBLE,
    }
}

pub fn store_fmt(p: Prec) -> Fmt {
    match p {
        Prec::Half => HALF,
        Prec::Single => SINGLE,
        Prec::Bfloat16 => BF16,
        Prec::Fp8 => FP8,
        _ => DOUBLE,
    }
}

/// One unit in the last place at magnitude `m` (with the subnormal floor).
pub fn ulp(m: f64, f: Fmt) -> f64 {
    m * 2f64.powi(1 - f.mant) + 2f64.powi(f.min_e)
}

/// Whether every multiple of `2^e` of magnitude at most `m` is representable in `f`.
pub fn fits(m: f64, e: i32, f: Fmt) -> bool {
    if m == 0.0 {
        return true;
    }
    if e == ANY || e < f.min_e || m > f.max || e > 900 {
        return false;
    }
    m / 2f64.powi(e) < 2f64.powi(f.mant)
}

/// The exponent of the last set bit of `v`: `v` is an odd multiple of `2^grid_of(v)`.
pub fn grid_of(v: f64) -> i32 {
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
pub struct Est {
    /// Bounds of the finite values (both computations; `lo > hi` when there are none).
    pub lo: f64,
    pub hi: f64,
    /// `Some(e)`: both computations hold identical values, all multiples of `2^e`.
    pub grid: Option<i32>,
    /// Otherwise: a bound on the absolute difference between the two computations.
    pub err: f64,
    /// Some cells may hold ±inf or NaN (identical in both computations).
    pub nonfinite: bool,
}

impl Est {
    pub fn zero() -> Est {
        Est {
            lo: 0.0,
            hi: 0.0,
            grid: Some(ANY),
            err: 0.0,
            nonfinite: false,
        }
    }
    /// Cells that hold ±inf or NaN only.
    pub fn infinite() -> Est {
        Est {
            lo: f64::INFINITY,
            hi: f64::NEG_INFINITY,
            grid: Some(ANY),
            err: 0.0,
            nonfinite: true,
        }
    }
    pub fn value(v: f64) -> Est {
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
    pub fn of_values(vs: &[f64]) -> Est {
        vs.iter()
            .map(|&v| Est::value(v))
            .reduce(Est::union)
            .unwrap_or_else(Est::zero)
    }
    pub fn mag(&self) -> f64 {
        if self.lo > self.hi {
            0.0
        } else {
            self.lo.abs().max(self.hi.abs())
        }
    }
    pub fn union(self, o: Est) -> Est {
        Est {
            lo: self.lo.min(o.lo),
            hi: self.hi.max(o.hi),
            grid: grid_min(self.grid, o.grid),
            err: self.err.max(o.err),
            nonfinite: self.nonfinite || o.nonfinite,
        }
    }
    /// Widens the bounds away from zero by a relative `r` (zero bounds stay).
    pub fn widen(self, r: f64) -> Est {
        Est {
            lo: self.lo - self.lo.abs() * r,
            hi: self.hi + self.hi.abs() * r,
            ..self
        }
    }
    /// The two computations may now differ, by `add` more than before.
    pub fn inexact(self, add: f64) -> Est {
        Est {
            grid: None,
            err: self.err + add,
            ..self.widen(2e-3)
        }
    }
}

pub fn grid_min(a: Option<i32>, b: Option<i32>) -> Option<i32> {
    Some(a?.min(b?))
}

pub type Check<T> = Result<T, &'static str>;

/// The result of an operation computed in `c`: identical on both sides only if exact.
pub fn in_compute(x: Est, c: Fmt) -> Est {
    match x.grid {
        Some(e) if fits(x.mag(), e, c) => x,
        _ => x.inexact(2.0 * ulp(x.mag(), c)),
    }
}

/// Reading a node of precision `src` into compute format `c` (C converts double to float).
pub fn read(x: Est, src: Prec, c: Fmt) -> Est {
    if src.is_integer() {
        // Integers convert exactly where they fit; otherwise both sides round the same
        // integer, but perhaps through double (double rounding): one unit of `c`.
        return match x.grid {
            Some(e) if fits(x.mag(), e, c) => x,
            _ => x.inexact(ulp(x.mag(), c)),
        };
    }
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
pub fn store(x: Est, p: Prec) -> Check<Est> {
    if x.nonfinite {
        return if p.is_integer() {
            Err("non-finite into an integer")
        } else {
            Ok(x)
        };
    }
    match p {
        _ if p.is_integer() => {
            // Integers wrap modulo 2^bits: the stored range is the image of [lo, hi] unless
            // that interval crosses a block boundary, and two computations that differ by
            // `err` can land on opposite sides of one (255 against 0).
            let (tmin, tmax) = int_range(p);
            let m = tmax - tmin + 1.0;
            let block = |v: f64| ((v.trunc() - tmin) / m).floor();
            let (lo, hi) = if block(x.lo) == block(x.hi) {
                (common::round_to(p, x.lo), common::round_to(p, x.hi))
            } else {
                (tmin, tmax)
            };
            let identical = x.grid.is_some() || x.lo.trunc() == x.hi.trunc();
            Ok(Est {
                lo,
                hi,
                grid: identical.then_some(if hi == 0.0 && lo == 0.0 { ANY } else { 0 }),
                err: if identical {
                    0.0
                } else if block(x.lo - x.err) == block(x.hi + x.err) {
                    (x.err + 1.0).min(m)
                } else {
                    m
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

/// The smallest and largest value of an integer precision (as `f64`: 2^64-1 rounds up).
pub fn int_range(p: Prec) -> (f64, f64) {
    let bits = p.int_bits().unwrap_or(64) as i32;
    if p.is_signed_integer() {
        (-(2f64.powi(bits - 1)), 2f64.powi(bits - 1) - 1.0)
    } else {
        (0.0, 2f64.powi(bits) - 1.0)
    }
}

/// An identical integer value anywhere in the range of `p`.
pub fn int_any(p: Prec) -> Est {
    let (lo, hi) = int_range(p);
    Est {
        lo,
        hi,
        grid: Some(0),
        err: 0.0,
        nonfinite: false,
    }
}

/// A truth value (0 or 1), identical on both sides.
pub fn boolean() -> Est {
    Est {
        lo: 0.0,
        hi: 1.0,
        grid: Some(0),
        err: 0.0,
        nonfinite: false,
    }
}

/// Whether every operation of an integer statement (integer result, integer arguments) is
/// computed exactly in 64-bit integers: all but the functions of reals, which compute in
/// `double` (libm) and are truncated.
pub fn int_exact_unop(op: Unop) -> bool {
    matches!(
        op,
        Unop::Identity
            | Unop::Relu
            | Unop::Neg
            | Unop::Satur01
            | Unop::Trunc
            | Unop::Floor
            | Unop::Ceil
            | Unop::Abs
            | Unop::Not
    )
}

/// The estimate of an exact integer operation's result (before the store): the interval
/// when it is known without wrapping, otherwise anything in the 64-bit compute range.
pub fn int_op_est(op: Op, a: &[Est], p: Prec) -> Est {
    let any = Est {
        lo: -(2f64.powi(63)),
        hi: 2f64.powi(64),
        grid: Some(0),
        err: 0.0,
        nonfinite: false,
    };
    let with = |lo: f64, hi: f64| {
        if lo >= -(2f64.powi(52)) && hi <= 2f64.powi(52) {
            Est {
                lo,
                hi,
                grid: Some(if lo == 0.0 && hi == 0.0 { ANY } else { 0 }),
                err: 0.0,
                nonfinite: false,
            }
        } else {
            any
        }
    };
    let _ = p;
    match op {
        Op::Un(u) => {
            let x = a[0];
            match u {
                Unop::Identity | Unop::Trunc | Unop::Floor | Unop::Ceil => with(x.lo, x.hi),
                Unop::Relu => with(x.lo.max(0.0), x.hi.max(0.0)),
                Unop::Neg => with(-x.hi, -x.lo),
                Unop::Abs => {
                    let lo = if x.lo <= 0.0 && x.hi >= 0.0 {
                        0.0
                    } else {
                        x.lo.abs().min(x.hi.abs())
                    };
                    with(lo, x.mag())
                }
                Unop::Satur01 | Unop::Not => boolean(),
                _ => any,
            }
        }
        Op::Bin(b) => {
            let (x, y) = (a[0], a[1]);
            match b {
                Binop::Add => with(x.lo + y.lo, x.hi + y.hi),
                Binop::Sub => with(x.lo - y.hi, x.hi - y.lo),
                Binop::Mul => {
                    let (lo, hi) = corners(x, y, |u, v| u * v);
                    with(lo, hi)
                }
                Binop::Max => with(x.lo.max(y.lo), x.hi.max(y.hi)),
                Binop::Min => with(x.lo.min(y.lo), x.hi.min(y.hi)),
                Binop::Arg1 => with(x.lo, x.hi),
                Binop::Arg2 => with(y.lo, y.hi),
                Binop::ReluGate | Binop::Satur01Gate => with(y.lo.min(0.0), y.hi.max(0.0)),
                Binop::Lt
                | Binop::Le
                | Binop::Gt
                | Binop::Ge
                | Binop::Eq
                | Binop::Ne
                | Binop::And
                | Binop::Or => boolean(),
                _ => any,
            }
        }
        Op::Tern(Ternop::Where) => with(a[1].lo.min(a[2].lo), a[1].hi.max(a[2].hi)),
        Op::Tern(_) => any,
    }
}

pub fn corners(a: Est, b: Est, f: impl Fn(f64, f64) -> f64) -> (f64, f64) {
    let v = [f(a.lo, b.lo), f(a.lo, b.hi), f(a.hi, b.lo), f(a.hi, b.hi)];
    (
        v.iter().copied().fold(f64::INFINITY, f64::min),
        v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    )
}

/// A transcendental (or otherwise inexact) result.
pub fn transc(lo: f64, hi: f64, err: f64, c: Fmt) -> Est {
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
pub fn away_from_zero(a: Est) -> Check<f64> {
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

pub fn unop_est(op: Unop, a: Est, c: Fmt) -> Check<Est> {
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
        // Monotone and exact: the error propagates unchanged.
        Unop::Satur01 => Est {
            lo: a.lo.clamp(0.0, 1.0),
            hi: a.hi.clamp(0.0, 1.0),
            ..a
        },
        Unop::Abs => {
            let lo = if a.lo <= 0.0 && a.hi >= 0.0 {
                0.0
            } else {
                a.lo.abs().min(a.hi.abs())
            };
            Est {
                lo,
                hi: a.mag(),
                ..a
            }
        }
        // Discontinuous: only on identical arguments (then exact, and identical).
        Unop::Trunc | Unop::Floor | Unop::Ceil => {
            if a.grid.is_none() {
                return Err("rounding of an inexact value");
            }
            let f = match op {
                Unop::Trunc => f64::trunc,
                Unop::Floor => f64::floor,
                _ => f64::ceil,
            };
            Est {
                lo: f(a.lo),
                hi: f(a.hi),
                grid: Some(if f(a.lo) == 0.0 && f(a.hi) == 0.0 {
                    ANY
                } else {
                    a.grid.unwrap_or(0).max(0)
                }),
                ..a
            }
        }
        Unop::Not => {
            if a.grid.is_none() && a.lo <= 0.0 && a.hi >= 0.0 {
                return Err("truth of an inexact value");
            }
            boolean()
        }
        Unop::Exp2 => {
            if a.hi > 10.0 {
                return Err("exp2 too large");
            }
            let h = a.hi.exp2();
            transc(a.lo.exp2(), h, h * std::f64::consts::LN_2 * a.err, c)
        }
        Unop::Log2 => {
            if a.lo < 0.25 || a.err > a.lo / 8.0 {
                return Err("log2 domain");
            }
            transc(
                a.lo.log2(),
                a.hi.log2(),
                a.err / (a.lo * std::f64::consts::LN_2),
                c,
            )
        }
        Unop::Rsqrt => {
            if a.lo < 0.25 || a.err > a.lo / 8.0 {
                return Err("rsqrt domain");
            }
            transc(
                1.0 / a.hi.sqrt(),
                1.0 / a.lo.sqrt(),
                a.err / (2.0 * a.lo.powf(1.5)),
                c,
            )
        }
        Unop::Sigmoid => {
            let s = |x: f64| 1.0 / (1.0 + (-x).exp());
            transc(s(a.lo), s(a.hi), a.err / 4.0, c)
        }
    };
    if r.mag() > MAX_TERM {
        return Err("magnitude");
    }
    Ok(in_compute(r, c))
}

/// `x * y` for error bounds, where a zero magnitude (a value that is exactly 0 in both
/// computations) times an unbounded error is 0, not NaN.
fn times(x: f64, y: f64) -> f64 {
    if x == 0.0 || y == 0.0 {
        0.0
    } else {
        x * y
    }
}

pub fn binop_est(op: Binop, a: Est, b: Est, c: Fmt) -> Check<Est> {
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
                err: times(b.mag(), a.err) + times(a.mag(), b.err) + times(a.err, b.err),
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
        // fmod is exact, but discontinuous: only on identical arguments.
        Binop::Mod => {
            let m = away_from_zero(b)?;
            let _ = m;
            if a.grid.is_none() || b.grid.is_none() {
                return Err("fmod of inexact values");
            }
            let r = a.mag().min(b.mag());
            Est {
                lo: if a.lo < 0.0 { -r } else { 0.0 },
                hi: if a.hi > 0.0 { r } else { 0.0 },
                grid: grid_min(a.grid, b.grid),
                err: 0.0,
                nonfinite: false,
            }
        }
        Binop::Lt | Binop::Le | Binop::Gt | Binop::Ge | Binop::Eq | Binop::Ne => {
            if a.grid.is_none() || b.grid.is_none() {
                return Err("comparison of inexact values");
            }
            boolean()
        }
        Binop::And | Binop::Or => {
            let sure = |x: Est| x.grid.is_some() || x.lo > 0.0 || x.hi < 0.0;
            if !sure(a) || !sure(b) {
                return Err("truth of an inexact value");
            }
            boolean()
        }
        Binop::Satur01Gate => {
            if a.grid.is_none() {
                return Err("gate on an inexact value");
            }
            b.union(Est::zero())
        }
        _ => return Err("operation outside the error model"),
    };
    if r.mag() > MAX_TERM || !r.lo.is_finite() || !r.hi.is_finite() {
        return Err("magnitude");
    }
    Ok(in_compute(r, c))
}

/// `n` accumulation steps `acc = accum(acc, term)`, each stored into `p`.
///
/// The steps are modelled in order, but the optimizer may reassociate sums into single and
/// double results ([`any_order`]); the estimate then covers every order.
///
/// The bounds of a sum are not those of the step-by-step model, which widens the interval
/// of an inexact value by a relative margin at every step: over thousands of terms that
/// margin compounds (`1.002^3000 ≈ 400`). They are the exact bounds of the sum of `start`
/// and `k` terms (from the terms' bounds, which hold for the values either computation
/// uses), widened by `dev`, a bound on how far rounding moves either computation from the
/// exact sum of its own terms: at most one unit in the last place of the compute type and
/// one of the storage type per step at the partial sum's magnitude, when the step can round
/// at all.
pub fn accumulate(start: Est, term: Est, n: usize, accum: Binop, p: Prec) -> Check<Est> {
    let c = compute_fmt(p);
    let sum = matches!(accum, Binop::Add | Binop::Sub) && !p.is_integer();
    let (mut lo, mut hi, mut dev) = (start.lo, start.hi, 0.0);
    let mut acc = start;
    for _ in 0..n {
        acc = store(binop_est(accum, acc, term, c)?, p)?;
        if sum {
            (lo, hi) = if accum == Binop::Add {
                (lo + term.lo, hi + term.hi)
            } else {
                (lo - term.hi, hi - term.lo)
            };
            let m = lo.abs().max(hi.abs());
            let rounds = match acc.grid {
                Some(e) => !fits(m, e, c) || !fits(m, e, store_fmt(p)),
                None => true,
            };
            if rounds {
                dev += ulp(m, c) + ulp(m, store_fmt(p));
            }
            acc.lo = lo - dev;
            acc.hi = hi + dev;
        }
        if acc.mag() > MAX_TERM {
            return Err("accumulation too large");
        }
    }
    if n >= 2 && reassociable(accum, p) {
        acc = any_order(start, term, n, acc, c);
    }
    Ok(acc)
}

/// `n` accumulation steps of an integer statement (integer result and arguments): exact in
/// 64-bit integers, wrapped at every store.
pub fn int_accumulate(start: Est, term: Est, n: usize, accum: Binop, p: Prec) -> Check<Est> {
    if n > 0 && (start.grid.is_none() || term.grid.is_none()) {
        return Err("integer accumulation of values that may differ");
    }
    let mut acc = start;
    for _ in 0..n.min(256) {
        let next = store(int_op_est(Op::Bin(accum), &[acc, term], p), p)?;
        if next == acc {
            break;
        }
        acc = next;
    }
    if n > 256 {
        acc = acc.union(int_any(p));
    }
    Ok(acc)
}

/// Whether the optimizer may sum an accumulation in another order than the one written:
/// GEMM kernels (`optimize/gemm.rs`) sum each reduction block in vector registers before
/// adding it to the result, and vectorized reductions (`vectorize_reduction` in
/// `optimize/loops.rs`) keep 16 or 8 partial sums and add them up in a tree. Both rewrite
/// only additions (and subtractions, summed as additions of negated terms) into single and
/// double results, whose compute type is their storage type. Max and min are exact in any
/// order, products are never reassociated, and half and byte results round at every step.
pub fn reassociable(accum: Binop, p: Prec) -> bool {
    matches!(accum, Binop::Add | Binop::Sub) && matches!(p, Prec::Single | Prec::Double)
}

/// The estimate of `start ± t_1 ± ... ± t_n` summed in *any* order, given `seq`, the estimate
/// of the in-order sum, all in compute format `c` (= the storage format).
///
/// Whatever the order, the sum is a binary tree whose `n + 1` leaves are `start` and the
/// terms (plus, in the rewritten code, zeros: the neutral starts of partial sums and the
/// padding of packed panels, whose additions are exact), so it performs `n` roundings, and
/// every intermediate value is the sum of a subset of the leaves: at most
/// `s = |start| + n · max|t|` in magnitude (up to the rounding errors themselves, a relative
/// `n · 2^(1-mant)` at most, added as a margin). Hence:
///
/// - if `start` and every term are multiples of `2^e` and every multiple of `2^e` up to `s`
///   is representable in `c`, no addition rounds: both sides compute the exact sum, in every
///   order. (The in-order model checks only the magnitudes of the in-order partial sums,
///   which can be smaller than those of a reassociated sum when `start` has the opposite
///   sign of the terms: `-1000 + 500 terms of 1..2` stays within 1000, but the terms alone
///   sum to up to 1000 before `start` is added.)
/// - otherwise each rounding errs by at most half an ulp at magnitude `s`, so each side is
///   within `n/2 · ulp(s)` of the exact sum of its leaves, and the leaves differ by at most
///   `err(start) + n · err(t)` (addition propagates absolute errors unchanged): the two
///   sides differ by at most `err(start) + n · err(t) + n · ulp(s)`. This is the classic
///   bound for summation in any order (`|fl(Σ) − Σ| ≤ (n−1) u Σ|x_i|`, Higham, *Accuracy
///   and Stability of Numerical Algorithms*, 4.2). A fused multiply-add on one side and a
///   rounded product on the other differ by the product's rounding, which `err(t)` already
///   counts when the product is inexact.
///
/// The result keeps the in-order interval, widened by the bound, and the larger of the two
/// error bounds.
pub fn any_order(start: Est, term: Est, n: usize, seq: Est, c: Fmt) -> Est {
    let nf = n as f64;
    let s = start.mag() + nf * term.mag();
    let exact = match (start.grid, term.grid) {
        (Some(a), Some(b)) => fits(s, a.min(b), c),
        _ => false,
    };
    if exact {
        return seq;
    }
    let bound = start.err + nf * term.err + nf * ulp(s * (1.0 + nf * 2f64.powi(1 - c.mant)), c);
    let r = if seq.grid.is_some() {
        seq.inexact(0.0)
    } else {
        seq
    };
    // A reassociated sum is within `bound` of the exact sum of its leaves, which lies within
    // the in-order bounds before their rounding margin.
    Est {
        lo: r.lo - bound,
        hi: r.hi + bound,
        err: r.err.max(bound),
        ..r
    }
}

/// What `fill_neutral` stores for an accumulator.
pub fn neutral_est(accum: Binop, p: Prec) -> Est {
    if p.is_integer() {
        // The type's minimum for max, its maximum for min (SPEC 9.1).
        let (lo, hi) = int_range(p);
        let v = match accum {
            Binop::Max => lo,
            Binop::Min => hi,
            _ => common::round_to(p, accum.neutral()),
        };
        return Est {
            grid: Some(if v == 0.0 { ANY } else { 0 }),
            ..Est::value(v)
        };
    }
    let v = accum.neutral();
    if v.is_finite() || p == Prec::Byte {
        // Bytes store infinities as 0.
        Est::value(common::round_to(p, v))
    } else {
        Est::infinite()
    }
}

pub fn readable_est(e: &Est) -> Check<Est> {
    if e.nonfinite {
        Err("reads non-finite values")
    } else {
        Ok(*e)
    }
}

/// Updates the estimates for one statement; an error when the statement would leave the
/// domain where comparisons are meaningful.
pub fn apply(p: &Program, s: &Stmt, ests: &mut [Est]) -> Check<()> {
    let t = &p.tensors;
    let lhs = s.lhs();
    let pr = t[lhs].prec;
    let c = compute_fmt(pr);
    let new = match s {
        Stmt::Const { c: v, .. } => {
            // The constant is rounded to the compute type, then stored.
            let v = if c == SINGLE { *v as f32 as f64 } else { *v };
            if pr.is_integer() {
                // (NaN and infinities store 0.)
                Est::value(common::round_to(pr, v))
            } else if v.abs() > MAX_MAG {
                // Overflowing narrow floats (identical on both sides, never read again).
                ests[lhs] = Est {
                    nonfinite: true,
                    ..Est::value(common::round_to(pr, v))
                };
                return Ok(());
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
        Stmt::Random { .. } => Est {
            lo: 0.0,
            // Integers: the 32-bit word, wrapped.
            hi: if pr.is_integer() {
                int_range(pr).1.min(2f64.powi(32) - 1.0)
            } else {
                1.0
            },
            // Multiples of 2^-32 (integers for integer precisions), identical on both sides.
            grid: Some(if pr.is_integer() { 0 } else { -32 }),
            err: 0.0,
            nonfinite: false,
        },
        Stmt::Gather { table, .. } if pr.is_integer() && t[*table].prec.is_integer() => {
            store(readable_est(&ests[*table])?, pr)?.union(Est::zero())
        }
        Stmt::Scatter { src, index, .. } if pr.is_integer() && t[*src].prec.is_integer() => {
            let a = readable_est(&ests[*src])?;
            let old = readable_est(&ests[lhs])?;
            if a.grid.is_none() || old.grid.is_none() {
                return Err("integer scatter of values that may differ");
            }
            let n = t[*index].dims.iter().product::<usize>();
            int_accumulate(old, a, n, Binop::Add, pr)?.union(old)
        }
        Stmt::Slice { src, .. } if pr.is_integer() && t[*src].prec.is_integer() => {
            store(readable_est(&ests[*src])?, pr)?
        }
        Stmt::Gather { table, .. } => {
            let a = readable_est(&ests[*table])?;
            // Rows of the table, or zeros for out-of-range indices.
            store(read(a, t[*table].prec, c), pr)?.union(Est::zero())
        }
        Stmt::Scatter { src, index, .. } => {
            let a = read(readable_est(&ests[*src])?, t[*src].prec, c);
            let old = readable_est(&ests[lhs])?;
            // At most every index row lands in one cell; cells no index reaches keep theirs.
            let n = t[*index].dims.iter().product::<usize>();
            accumulate(old, a, n, Binop::Add, pr)?.union(old)
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
            let int_stmt = pr.is_integer() && args.iter().all(|&i| t[i].prec.is_integer());
            if !int_stmt && op.integer_only() {
                return Err("integer-only operation on a floating statement");
            }
            let exact_int = int_stmt
                && match op {
                    Op::Un(u) => int_exact_unop(*u),
                    _ => true,
                };
            let a = args
                .iter()
                .map(|&i| {
                    readable_est(&ests[i]).map(|e| if int_stmt { e } else { read(e, t[i].prec, c) })
                })
                .collect::<Check<Vec<Est>>>()?;
            if exact_int && a.iter().any(|e| e.grid.is_none()) {
                // Exact integer arithmetic on values that may already differ (from a function
                // of reals): bit operations, wrapping and comparisons would amplify it.
                return Err("integer statement on values that may differ");
            }
            let term = match op {
                _ if exact_int => int_op_est(*op, &a, pr),
                Op::Un(u) if int_stmt => {
                    // A function of reals: in double from the integer argument.
                    let x = a[0];
                    if x.mag() > MAX_TERM {
                        return Err("magnitude");
                    }
                    unop_est(*u, x, DOUBLE)?
                }
                Op::Tern(Ternop::Where)
                    if a[0].grid.is_none() && a[0].lo <= 0.0 && a[0].hi >= 0.0 =>
                {
                    return Err("selection on an inexact value");
                }
                Op::Un(u) => unop_est(*u, a[0], c)?,
                Op::Bin(b) => binop_est(*b, a[0], a[1], c)?,
                // A selection: exactly one of the two values.
                Op::Tern(Ternop::Where) => a[1].union(a[2]),
                // Bounded by the unfused computation (one rounding fewer).
                Op::Tern(Ternop::Fma) => {
                    binop_est(Binop::Add, binop_est(Binop::Mul, a[0], a[1], c)?, a[2], c)?
                }
                Op::Tern(Ternop::Mul3) => {
                    binop_est(Binop::Mul, binop_est(Binop::Mul, a[0], a[1], c)?, a[2], c)?
                }
            };
            let old = ests[lhs];
            // As lowered: a reduction (not bijective) with `initialize_neutral` first fills
            // the whole result with the accumulator's neutral element (0 for `set`); `set`
            // and bijective initializing assignments then just store the term.
            let plain = *accum == Binop::Arg2 || (*init && shape.bijective);
            let fills = *init && !shape.bijective;
            let neutral = neutral_est(*accum, pr);
            let accumulate = |start: Est, term: Est, n: usize, accum: Binop, p: Prec| {
                if exact_int {
                    int_accumulate(start, term, n, accum, p)
                } else {
                    accumulate(start, term, n, accum, p)
                }
            };
            let written = if plain {
                store(term, pr)?
            } else if shape.affine {
                // Skipped points: a cell gets anywhere from 0 to `fan_in` contributions.
                if shape.fan_in > 64 {
                    return Err("affine fan-in");
                }
                let start = if fills { neutral } else { readable_est(&old)? };
                let mut all = start;
                for k in 1..=shape.fan_in {
                    let e = if fills && neutral.nonfinite {
                        accumulate(store(term, pr)?, term, k - 1, *accum, pr)?
                    } else {
                        accumulate(start, term, k, *accum, pr)?
                    };
                    all = all.union(e);
                }
                all
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
        let lim = if pr.is_integer() {
            (0.05 * new.mag()).max(2.0)
        } else {
            0.02 * new.mag().max(1.0)
        };
        if new.err > lim {
            return Err("imprecise");
        }
    }
    if !pr.is_integer() && new.mag() > MAX_MAG {
        return Err("magnitude");
    }
    ests[lhs] = new;
    Ok(())
}
