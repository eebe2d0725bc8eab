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
        // (The generator makes no bfloat16 or fp8 tensors: integer programs are compared
        // exactly by tests/precisions.rs.)
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
        _ => return Err("operation outside the error model"),
    };
    if r.mag() > MAX_TERM {
        return Err("magnitude");
    }
    Ok(in_compute(r, c))
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
    let sum = matches!(accum, Binop::Add | Binop::Sub) && p != Prec::Byte;
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
        Stmt::Random { .. } => Est {
            lo: 0.0,
            hi: if pr == Prec::Byte { 255.0 } else { 1.0 },
            // Multiples of 2^-32 (integers in byte), identical on both sides.
            grid: Some(if pr == Prec::Byte { 0 } else { -32 }),
            err: 0.0,
            nonfinite: false,
        },
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
            let a = args
                .iter()
                .map(|&i| readable_est(&ests[i]).map(|e| read(e, t[i].prec, c)))
                .collect::<Check<Vec<Est>>>()?;
            let term = match op {
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
