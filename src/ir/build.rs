//! Statements that read like the math: an [`Expr`] is an operation over tensors (or over
//! other expressions), and [`Tnode::assign`] makes it a statement, taking the dims from the
//! nodes:
//!
//! ```
//! use arrayjit::ir::build::{exp, relu};
//! use arrayjit::ir::{Assignments, Prec, Tnode};
//! # fn main() -> arrayjit::Result<()> {
//! let x = Tnode::hosted(&["x"], &[4, 3], Prec::Single)?;
//! let w = Tnode::hosted(&["w"], &[3, 2], Prec::Single)?;
//! let b = Tnode::hosted(&["b"], &[2], Prec::Single)?;
//! let h = Tnode::new(&["h"], &[4, 2], Prec::Single)?;
//! let y = Tnode::hosted(&["y"], &[4, 2], Prec::Single)?;
//! let m = Tnode::new(&["m"], &[4], Prec::Single)?;
//! let code = Assignments::seq([
//!     h.assign((&x * &w).sum("ij,jk->ik"))?,       // h = x @ w
//!     y.assign(relu(&h + b.spec("k->ik")))?,     // y = relu(h + b), b broadcast
//!     m.assign(y.max_over("ik->i"))?,                // m = the row maxima of y
//!     y.assign(exp(&y - m.spec("i->ik")))?,      // y = exp(y - m)
//! ]);
//! # let _ = code;
//! # Ok(())
//! # }
//! ```
//!
//! - Operations: `+`, `-`, `*`, `/` and unary `-` on `&Tnode` and `Expr`; every operation of
//!   the op table through its enum ([`Unop::of`], [`Binop::of`], [`Ternop::of`]:
//!   `Unop::Exp.of(&x)`, `Binop::Lt.of(&a, &b)`, `Ternop::Where.of(&c, &a, &b)`); and the most
//!   used ones by name ([`exp`], [`log`], [`relu`], [`sqrt`], [`tanh`], [`sigmoid`], [`max`],
//!   [`min`], [`pow`], [`select`]). [`merge`] reads this device's merge buffer.
//! - Without a spec an expression is pointwise: its arguments have the result's dims (an axis
//!   of extent 1 broadcasts). [`Expr::spec`] gives an einsum spec (SPEC section 2 and 9.3,
//!   affine entries included; [`Expr::bind`] for `{name}` static indices); [`Expr::sum`],
//!   [`Expr::max`], [`Expr::min`], [`Expr::prod`] and [`Expr::reduce`] reduce over the letters
//!   missing from the result, starting from the neutral element.
//! - An argument that is itself an expression becomes an intermediate tensor of its own
//!   (dims from the spec, precision from its arguments), which the optimizer inlines when it
//!   can (a virtual node): `exp(&y - m.spec("i->ik"))` computes `y - m` per element inside
//!   the loop of `exp`.
//! - [`Tnode::assign`] overwrites the result (`y = e`); [`Tnode::accumulate`] combines it
//!   with its old value (`y = y + e` with [`Binop::Add`]).

use super::einsum;
use super::{Assignments, Bindings, Binop, Buffer, Prec, Ternop, Tnode, Unop};
use crate::error::{Error, Result};

/// An argument of an operation: a tensor, this device's merge buffer holding a tensor, or an
/// expression (computed into an intermediate tensor first).
#[derive(Clone, Debug)]
pub enum Arg {
    /// A tensor.
    Node(Tnode),
    /// The merge buffer, holding this tensor ([`Buffer::MergeBuffer`]).
    Merge(Tnode),
    /// An expression.
    Expr(Box<Expr>),
}

impl From<&Tnode> for Arg {
    fn from(t: &Tnode) -> Arg {
        Arg::Node(t.clone())
    }
}

impl From<Tnode> for Arg {
    fn from(t: Tnode) -> Arg {
        Arg::Node(t)
    }
}

impl From<Expr> for Arg {
    fn from(e: Expr) -> Arg {
        Arg::Expr(Box::new(e))
    }
}

/// This device's merge buffer holding `t` (read by a merge routine).
pub fn merge(t: &Tnode) -> Arg {
    Arg::Merge(t.clone())
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Un(Unop),
    Bin(Binop),
    Ter(Ternop),
}

/// An operation over arguments, with how it maps onto its result: pointwise, or an einsum
/// spec, possibly reducing. Made a statement by [`Tnode::assign`] or [`Tnode::accumulate`].
#[derive(Clone, Debug)]
pub struct Expr {
    op: Op,
    args: Vec<Arg>,
    spec: Option<String>,
    /// The reduction (`Some(accum)`: start from its neutral element and accumulate).
    reduce: Option<Binop>,
    bindings: Bindings,
}

impl Expr {
    fn new(op: Op, args: Vec<Arg>) -> Expr {
        Expr {
            op,
            args,
            spec: None,
            reduce: None,
            bindings: Bindings::empty(),
        }
    }

    /// The same operation mapped onto its result by `spec` (e.g. `"ik,k->ik"` broadcasts the
    /// second argument over `i`; `"ij->ji"` transposes; affine entries as in SPEC 9.3).
    pub fn spec(mut self, spec: &str) -> Expr {
        self.spec = Some(spec.to_string());
        self
    }

    /// Resolves `{name}` entries of the spec with these static indices.
    pub fn bind(mut self, bindings: &Bindings) -> Expr {
        self.bindings = bindings.clone();
        self
    }

    /// The sum over the letters of `spec` missing from its result (starting from 0).
    pub fn sum(self, spec: &str) -> Expr {
        self.reduce(Binop::Add, spec)
    }

    /// The product over the letters of `spec` missing from its result (starting from 1).
    pub fn prod(self, spec: &str) -> Expr {
        self.reduce(Binop::Mul, spec)
    }

    /// The maximum over the letters of `spec` missing from its result.
    pub fn max(self, spec: &str) -> Expr {
        self.reduce(Binop::Max, spec)
    }

    /// The minimum over the letters of `spec` missing from its result.
    pub fn min(self, spec: &str) -> Expr {
        self.reduce(Binop::Min, spec)
    }

    /// The reduction by `accum` over the letters of `spec` missing from its result, starting
    /// from `accum`'s neutral element.
    pub fn reduce(mut self, accum: Binop, spec: &str) -> Expr {
        self.spec = Some(spec.to_string());
        self.reduce = Some(accum);
        self
    }

    fn op_name(&self) -> &'static str {
        match self.op {
            Op::Un(u) => u.name(),
            Op::Bin(b) => b.name(),
            Op::Ter(t) => t.name(),
        }
    }

    /// The spec: the given one, or pointwise over the result's rank.
    fn spec_for(&self, rank: usize) -> Result<String> {
        if let Some(s) = &self.spec {
            return Ok(s.clone());
        }
        if rank > 26 {
            return Err(Error::Spec {
                spec: String::new(),
                msg: format!(
                    "a pointwise {} over {rank} axes needs a spec",
                    self.op_name()
                ),
            });
        }
        let term: String = (0..rank).map(|i| char::from(b'a' + i as u8)).collect();
        let args = vec![term.as_str(); self.args.len()].join(",");
        Ok(format!("{args}->{term}"))
    }

    /// The statements computing this expression into `lhs` (after those of its intermediate
    /// arguments), combining with `lhs`'s old value by `accum` when given.
    fn statements(
        self,
        lhs: &Tnode,
        accum: Option<Binop>,
        out: &mut Vec<Assignments>,
    ) -> Result<()> {
        let spec = self.spec_for(lhs.dims().len())?;
        let name = self.op_name();
        let mut bufs = Vec::with_capacity(self.args.len());
        for a in self.args {
            bufs.push(lower_arg(a, out)?);
        }
        let dims: Vec<&[usize]> = bufs.iter().map(|b| buffer_node(b).dims()).collect();
        let projections = einsum::projections(&spec, lhs.dims(), &dims, &self.bindings)?;
        let (initialize_neutral, accum) = match (self.reduce, accum) {
            (Some(r), None) => (true, r),
            (Some(r), Some(a)) if a == r => (false, r),
            (Some(r), Some(a)) => {
                return Err(Error::Assignment(format!(
                    "{}: a {} reduction accumulated by {} into {}: use the same operation, or \
                     reduce into a tensor of its own first",
                    name,
                    r.name(),
                    a.name(),
                    lhs.name()
                )))
            }
            (None, None) => (false, Binop::Arg2),
            (None, Some(a)) => (false, a),
        };
        let lhs = lhs.clone();
        let mut b = bufs.into_iter();
        let mut next = || {
            b.next()
                .ok_or_else(|| Error::Internal("an operation lost an argument".into()))
        };
        out.push(match self.op {
            Op::Un(op) => Assignments::AccumUnop {
                initialize_neutral,
                accum,
                op,
                lhs,
                rhs: next()?,
                projections,
            },
            Op::Bin(op) => Assignments::AccumBinop {
                initialize_neutral,
                accum,
                op,
                lhs,
                rhs1: next()?,
                rhs2: next()?,
                projections,
            },
            Op::Ter(op) => Assignments::AccumTernop {
                initialize_neutral,
                accum,
                op,
                lhs,
                rhs1: next()?,
                rhs2: next()?,
                rhs3: next()?,
                projections,
            },
        });
        Ok(())
    }

    /// The dims and precision of an intermediate tensor holding this expression.
    fn intermediate(&self, bufs: &[Buffer]) -> Result<(Vec<usize>, Prec)> {
        let dims: Vec<&[usize]> = bufs.iter().map(|b| buffer_node(b).dims()).collect();
        let shape = match &self.spec {
            Some(s) => einsum::result_dims(s, &dims)?,
            // Pointwise: every argument has the result's rank; extent-1 axes broadcast.
            None => {
                let rank = dims.first().map_or(0, |d| d.len());
                if dims.iter().any(|d| d.len() != rank) {
                    return Err(Error::Spec {
                        spec: String::new(),
                        msg: format!(
                            "the arguments of a pointwise {} have dims {dims:?}: give a spec",
                            self.op_name()
                        ),
                    });
                }
                (0..rank)
                    .map(|i| dims.iter().map(|d| d[i]).max().unwrap_or(1))
                    .collect()
            }
        };
        let precs: Vec<Prec> = bufs.iter().map(|b| buffer_node(b).prec()).collect();
        let prec = match precs.split_first() {
            Some((first, rest)) if rest.iter().all(|p| p == first) => *first,
            // Mixed precisions: the widest of their kind (SPEC 9.1's compute types).
            _ if precs.iter().all(|p| p.is_integer()) => {
                if precs.contains(&Prec::Uint64) {
                    Prec::Uint64
                } else {
                    Prec::Int64
                }
            }
            _ if precs.contains(&Prec::Double) => Prec::Double,
            _ => Prec::Single,
        };
        Ok((shape, prec))
    }
}

fn buffer_node(b: &Buffer) -> &Tnode {
    match b {
        Buffer::Node(t) | Buffer::MergeBuffer(t) => t,
    }
}

/// The buffer an argument is read from: an intermediate tensor for an expression, whose
/// statements go to `out` first.
fn lower_arg(a: Arg, out: &mut Vec<Assignments>) -> Result<Buffer> {
    match a {
        Arg::Node(t) => Ok(Buffer::Node(t)),
        Arg::Merge(t) => Ok(Buffer::MergeBuffer(t)),
        Arg::Expr(e) => {
            let e = *e;
            // The intermediate's own arguments first, to know its dims and precision.
            let mut inner = Vec::with_capacity(e.args.len());
            for a in e.args.iter().cloned() {
                inner.push(lower_arg(a, out)?);
            }
            let (dims, prec) = e.intermediate(&inner)?;
            let t = Tnode::new(&[e.op_name()], &dims, prec)?;
            let e = Expr {
                args: inner
                    .into_iter()
                    .map(|b| match b {
                        Buffer::Node(t) => Arg::Node(t),
                        Buffer::MergeBuffer(t) => Arg::Merge(t),
                    })
                    .collect(),
                ..e
            };
            e.statements(&t, None, out)?;
            Ok(Buffer::Node(t))
        }
    }
}

impl Tnode {
    /// The statements `self = e` (intermediate tensors first, for arguments that are
    /// expressions): overwritten where `e`'s spec reaches it; a reduction ([`Expr::sum`]...)
    /// starts from its neutral element.
    ///
    /// # Errors
    ///
    /// [`Error::Spec`] / [`Error::SpecEntry`] when the spec (given, or pointwise) does not fit
    /// the dims; [`Error::Dims`] for an intermediate whose dims cannot be made.
    pub fn assign(&self, e: impl Into<Expr>) -> Result<Assignments> {
        let mut out = vec![];
        e.into().statements(self, None, &mut out)?;
        Ok(Assignments::seq(out))
    }

    /// The statements `self = accum(self, e)` at every point of `e` (`self += e` with
    /// [`Binop::Add`]), without a neutral fill: a reduction then adds onto the old values.
    ///
    /// # Errors
    ///
    /// As [`Tnode::assign`]; [`Error::Assignment`] when `e` reduces by another operation
    /// than `accum`.
    pub fn accumulate(&self, accum: Binop, e: impl Into<Expr>) -> Result<Assignments> {
        let mut out = vec![];
        e.into().statements(self, Some(accum), &mut out)?;
        Ok(Assignments::seq(out))
    }
}

impl From<&Tnode> for Expr {
    /// The tensor itself (`y.assign(&x)` copies `x`).
    fn from(t: &Tnode) -> Expr {
        Unop::Identity.of(t)
    }
}

impl Unop {
    /// This operation applied to `a`.
    pub fn of(self, a: impl Into<Arg>) -> Expr {
        Expr::new(Op::Un(self), vec![a.into()])
    }
}

impl Binop {
    /// This operation applied to `a` and `b`.
    pub fn of(self, a: impl Into<Arg>, b: impl Into<Arg>) -> Expr {
        Expr::new(Op::Bin(self), vec![a.into(), b.into()])
    }
}

impl Ternop {
    /// This operation applied to `a`, `b` and `c`.
    pub fn of(self, a: impl Into<Arg>, b: impl Into<Arg>, c: impl Into<Arg>) -> Expr {
        Expr::new(Op::Ter(self), vec![a.into(), b.into(), c.into()])
    }
}

impl Tnode {
    /// This tensor mapped onto a result by `spec` (`b.spec("k->ik")` broadcasts `b` over
    /// `i`), as an argument of an operation.
    pub fn spec(&self, spec: &str) -> Expr {
        Expr::from(self).spec(spec)
    }

    /// The sum of this tensor over the letters of `spec` missing from its result.
    pub fn sum(&self, spec: &str) -> Expr {
        Expr::from(self).sum(spec)
    }

    /// The maximum of this tensor over the letters of `spec` missing from its result (not
    /// called `max`: `Tnode` is `Ord`, by id).
    pub fn max_over(&self, spec: &str) -> Expr {
        Expr::from(self).max(spec)
    }

    /// The minimum of this tensor over the letters of `spec` missing from its result.
    pub fn min_over(&self, spec: &str) -> Expr {
        Expr::from(self).min(spec)
    }
}

/// `e^a`.
pub fn exp(a: impl Into<Arg>) -> Expr {
    Unop::Exp.of(a)
}

/// The natural logarithm.
pub fn log(a: impl Into<Arg>) -> Expr {
    Unop::Log.of(a)
}

/// The square root.
pub fn sqrt(a: impl Into<Arg>) -> Expr {
    Unop::Sqrt.of(a)
}

/// `max(a, 0)`.
pub fn relu(a: impl Into<Arg>) -> Expr {
    Unop::Relu.of(a)
}

/// The hyperbolic tangent.
pub fn tanh(a: impl Into<Arg>) -> Expr {
    Unop::Tanh.of(a)
}

/// `1 / (1 + e^-a)`.
pub fn sigmoid(a: impl Into<Arg>) -> Expr {
    Unop::Sigmoid.of(a)
}

/// The larger of `a` and `b` (the NaN rule of SPEC 9.2).
pub fn max(a: impl Into<Arg>, b: impl Into<Arg>) -> Expr {
    Binop::Max.of(a, b)
}

/// The smaller of `a` and `b`.
pub fn min(a: impl Into<Arg>, b: impl Into<Arg>) -> Expr {
    Binop::Min.of(a, b)
}

/// `a` to the power `b`.
pub fn pow(a: impl Into<Arg>, b: impl Into<Arg>) -> Expr {
    Binop::ToPowOf.of(a, b)
}

/// `cond != 0 ? a : b` (the ternary `where`).
pub fn select(cond: impl Into<Arg>, a: impl Into<Arg>, b: impl Into<Arg>) -> Expr {
    Ternop::Where.of(cond, a, b)
}

macro_rules! operator {
    ($tr:ident, $method:ident, $op:expr) => {
        impl std::ops::$tr<&Tnode> for &Tnode {
            type Output = Expr;
            fn $method(self, rhs: &Tnode) -> Expr {
                $op.of(self, rhs)
            }
        }
        impl std::ops::$tr<Expr> for &Tnode {
            type Output = Expr;
            fn $method(self, rhs: Expr) -> Expr {
                $op.of(self, rhs)
            }
        }
        impl std::ops::$tr<&Tnode> for Expr {
            type Output = Expr;
            fn $method(self, rhs: &Tnode) -> Expr {
                $op.of(self, rhs)
            }
        }
        impl std::ops::$tr<Expr> for Expr {
            type Output = Expr;
            fn $method(self, rhs: Expr) -> Expr {
                $op.of(self, rhs)
            }
        }
    };
}
operator!(Add, add, Binop::Add);
operator!(Sub, sub, Binop::Sub);
operator!(Mul, mul, Binop::Mul);
operator!(Div, div, Binop::Div);

impl std::ops::Neg for &Tnode {
    type Output = Expr;
    fn neg(self) -> Expr {
        Unop::Neg.of(self)
    }
}

impl std::ops::Neg for Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        Unop::Neg.of(self)
    }
}
