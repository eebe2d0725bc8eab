//! Neural-network building blocks written as [`Assignments`], and the two-moons demo.
//!
//! The helpers here are small: each returns the assignments for one array operation (a matrix
//! product, a bias add, a ReLU and its gradient, a reduction, an SGD step...), so that a model's
//! forward and backward passes read like the math. They never run anything: compile the result
//! with a backend ([`crate::backend::Backend::compile_batch`]) and link it on devices.
//!
//! - [`matmul`], [`add_bias`], [`relu`], [`relu_backward`], [`sum`], [`transpose`],
//!   [`scale`], [`mul`], [`sub`], [`slice()`]: the operations of a forward and backward pass;
//! - [`unary`], [`binary`], [`reduce`], [`contract`]: any operation of the op table, pointwise
//!   or with an einsum spec (affine entries included);
//! - [`conv2d`] and its gradients, [`max_pool2d`] and its gradient, [`softmax_cross_entropy`]
//!   over integer labels: the layers of a small convolutional network;
//! - [`merge_add`] (`g = g + merge(g)`, reading the device's merge buffer) and [`sgd_step`]:
//!   the pieces of data-parallel training;
//! - [`Mlp`]: a multi-layer perceptron with ReLU hidden layers, its parameters and gradients,
//!   and the routines of a training step (per-device gradient with a hinge loss, merges,
//!   SGD update, inference);
//! - [`moons`]: the two-moons dataset and the demo's model, to train with
//!   [`crate::parallel::train`] over any [`Backend`].
//!
//! Loop order matters for speed: `*_ordered` variants take the order of the loops (outermost
//! first) as letters of the spec; a product whose innermost loop runs along the contiguous
//! axis of both the result and an argument (e.g. `"bi,io->bo"` in order `"bio"`) vectorizes.
//!
//! A ReLU layer and its backward pass, for a batch of 8 inputs of 2 features:
//!
//! ```
//! use arrayjit::ir::{Assignments, Bindings, Prec, Tnode};
//! use arrayjit::nn;
//! # fn main() -> arrayjit::Result<()> {
//! let none = Bindings::empty();
//! let t = |label: &str, dims: &[usize]| Tnode::new(&[label], dims, Prec::Single);
//! let (x, w, b) = (t("x", &[8, 2])?, t("w", &[2, 4])?, t("b", &[4])?);
//! let (z, pre, h) = (t("z", &[8, 4])?, t("pre", &[8, 4])?, t("h", &[8, 4])?);
//! let (dh, dpre, gw, gb) = (t("dh", &[8, 4])?, t("dpre", &[8, 4])?, t("gw", &[2, 4])?, t("gb", &[4])?);
//! let forward = Assignments::seq([
//!     nn::matmul(&z, &x, &w, "bi,io->bo", &none)?,
//!     nn::add_bias(&pre, &z, &b, "bo,o->bo", &none)?,
//!     nn::relu(&h, &pre)?,
//! ]);
//! // Given dh = dLoss/dh:
//! let backward = Assignments::seq([
//!     nn::relu_backward(&dpre, &h, &dh)?,
//!     nn::matmul_ordered(&gw, &x, &dpre, "bi,bo->io", "bio", &none)?,
//!     nn::sum(&gb, &dpre, "bo->o", &none)?,
//! ]);
//! assert!(Assignments::seq([forward, backward]).to_doc().contains("relu_gate"));
//! # Ok(())
//! # }
//! ```
//!
//! [`Backend`]: crate::backend::Backend

mod bucket;
mod layers;
mod mlp;
#[doc(hidden)]
pub mod moons;

pub use bucket::Bucket;
pub use layers::{
    binary, contract, conv2d, conv2d_input_grad, conv2d_weight_grad, max_pool2d,
    max_pool2d_backward, reduce, softmax_cross_entropy, unary, SoftmaxScratch, Window,
};
pub use mlp::{Forward, HostMlp, Layer, Mlp};

use crate::error::{Error, Result};
use crate::ir::einsum;
use crate::ir::ndarray::SplitMix64;
use crate::ir::{
    Assignments, AxisIndex, Bindings, Binop, Buffer, FetchOp, Prec, Projections, StaticSymbol,
    Symbol, Tnode, Unop,
};

/// One axis entry of a spec term (for finding the iterator of a letter).
#[derive(Clone, Debug, PartialEq)]
enum Entry {
    Letter(char),
    Other,
}

/// Splits an einsum spec into its argument terms and result term (entries only). The spec was
/// already validated by [`einsum::projections`].
fn spec_terms(spec: &str) -> Result<(Vec<Vec<Entry>>, Vec<Entry>)> {
    let err = |msg: &str| Error::Spec {
        spec: spec.to_string(),
        msg: msg.to_string(),
    };
    let (lhs, rhs) = spec.split_once("->").ok_or_else(|| err("missing '->'"))?;
    let term = |t: &str| -> Result<Vec<Entry>> {
        let mut out = vec![];
        let mut chars = t.chars();
        while let Some(c) = chars.next() {
            match c {
                c if c.is_whitespace() => {}
                c if c.is_ascii_alphabetic() => out.push(Entry::Letter(c)),
                c if c.is_ascii_digit() => out.push(Entry::Other),
                '{' => {
                    if !chars.by_ref().any(|c| c == '}') {
                        return Err(err("unterminated '{'"));
                    }
                    out.push(Entry::Other);
                }
                _ => return Err(err("unexpected character")),
            }
        }
        Ok(out)
    };
    let args = lhs.split(',').map(term).collect::<Result<Vec<_>>>()?;
    Ok((args, term(rhs)?))
}

/// Projections from an einsum-style spec (see [`einsum::projections`]), with the loops nested
/// in `loop_order` (letters, outermost first) instead of the default order (result letters
/// first, then reduced letters).
///
/// Letters of `loop_order` that are not iterated (every axis they index has extent 1) are
/// skipped; every iterated letter must appear.
///
/// # Errors
///
/// [`Error::Spec`] when the spec is malformed (see [`einsum::projections`]) or when
/// `loop_order` misses an iterated letter or names a letter twice or one not in the spec.
pub fn projections_ordered(
    spec: &str,
    lhs_dims: &[usize],
    rhs_dims: &[&[usize]],
    statics: &Bindings,
    loop_order: &str,
) -> Result<Projections> {
    let p = einsum::projections(spec, lhs_dims, rhs_dims, statics)?;
    let err = |msg: String| Error::Spec {
        spec: spec.to_string(),
        msg,
    };
    let (args, result) = spec_terms(spec)?;
    let mut terms: Vec<(&Vec<Entry>, &Vec<AxisIndex>)> = vec![(&result, &p.project_lhs)];
    terms.extend(args.iter().zip(&p.project_rhs));
    let symbol_of = |c: char| -> Option<Symbol> {
        terms.iter().find_map(|(entries, idcs)| {
            entries
                .iter()
                .zip(idcs.iter())
                .find_map(|(e, ix)| match (e, ix) {
                    (Entry::Letter(l), AxisIndex::Iterator(s))
                        if *l == c && p.product_iterators.contains(s) =>
                    {
                        Some(*s)
                    }
                    _ => None,
                })
        })
    };
    let mut order: Vec<Symbol> = vec![];
    let mut seen: Vec<char> = vec![];
    for c in loop_order.chars().filter(|c| !c.is_whitespace()) {
        if seen.contains(&c) {
            return Err(err(format!("loop order {loop_order:?} names '{c}' twice")));
        }
        seen.push(c);
        let in_spec = args
            .iter()
            .chain(std::iter::once(&result))
            .any(|t| t.contains(&Entry::Letter(c)));
        if !in_spec {
            return Err(err(format!(
                "loop order {loop_order:?} names '{c}', which is not a letter of the spec"
            )));
        }
        if let Some(s) = symbol_of(c) {
            order.push(s);
        }
    }
    if order.len() != p.product_iterators.len() {
        return Err(err(format!(
            "loop order {loop_order:?} must name every iterated letter of the spec"
        )));
    }
    let extent = |s: &Symbol| {
        p.product_iterators
            .iter()
            .position(|x| x == s)
            .map(|i| p.product_space[i])
            .unwrap_or(1)
    };
    let product_space = order.iter().map(extent).collect();
    Ok(Projections {
        product_space,
        product_iterators: order,
        debug_info: format!("{spec} (loops {loop_order})"),
        ..p
    })
}

fn projections_for(
    spec: &str,
    lhs: &Tnode,
    rhs: &[&Tnode],
    statics: &Bindings,
    loop_order: Option<&str>,
) -> Result<Projections> {
    let dims: Vec<&[usize]> = rhs.iter().map(|t| t.dims()).collect();
    match loop_order {
        None => einsum::projections(spec, lhs.dims(), &dims, statics),
        Some(order) => projections_ordered(spec, lhs.dims(), &dims, statics, order),
    }
}

fn binop(
    initialize_neutral: bool,
    accum: Binop,
    op: Binop,
    lhs: &Tnode,
    a: Buffer,
    b: Buffer,
    projections: Projections,
) -> Assignments {
    Assignments::AccumBinop {
        initialize_neutral,
        accum,
        op,
        lhs: lhs.clone(),
        rhs1: a,
        rhs2: b,
        projections,
    }
}

fn unop(
    initialize_neutral: bool,
    accum: Binop,
    op: Unop,
    lhs: &Tnode,
    a: Buffer,
    projections: Projections,
) -> Assignments {
    Assignments::AccumUnop {
        initialize_neutral,
        accum,
        op,
        lhs: lhs.clone(),
        rhs: a,
        projections,
    }
}

/// `lhs[..] = rhs[..]` under `p`.
fn copy(lhs: &Tnode, rhs: &Tnode, p: Projections) -> Assignments {
    unop(false, Binop::Arg2, Unop::Identity, lhs, node(rhs), p)
}

fn node(t: &Tnode) -> Buffer {
    Buffer::Node(t.clone())
}

/// Pointwise projections over `out`'s dims for arguments of the same dims, or scalars (dims
/// `[1]`, broadcast).
fn pointwise(what: &str, out: &Tnode, args: &[&Tnode]) -> Result<Projections> {
    let mut p = Projections::pointwise(out.dims(), args.len());
    for (k, a) in args.iter().enumerate() {
        if a.dims() == out.dims() {
            continue;
        }
        if a.dims() == [1] {
            p.rhs_dims[k] = vec![1];
            p.project_rhs[k] = vec![AxisIndex::Fixed(0)];
            continue;
        }
        return Err(Error::Assignment(format!(
            "{what} into {} (dims {:?}): argument {} has dims {:?}; expected the same dims or a scalar [1]",
            out.name(),
            out.dims(),
            a.name(),
            a.dims()
        )));
    }
    p.debug_info = format!("{what} (pointwise)");
    Ok(p)
}

/// `out = Σ a·b` over the letters of `spec` missing from the result: a matrix product, or any
/// sum of products in einsum notation (e.g. `"bi,io->bo"`; `"bi,bo->io"` for a weight
/// gradient). The result is overwritten (the accumulation starts from zero).
///
/// # Errors
///
/// [`Error::Spec`] when the spec does not fit the operands' dims.
pub fn matmul(
    out: &Tnode,
    a: &Tnode,
    b: &Tnode,
    spec: &str,
    statics: &Bindings,
) -> Result<Assignments> {
    let p = projections_for(spec, out, &[a, b], statics, None)?;
    Ok(binop(
        true,
        Binop::Add,
        Binop::Mul,
        out,
        node(a),
        node(b),
        p,
    ))
}

/// [`matmul`] with the loops nested in `loop_order` (letters, outermost first); e.g.
/// `matmul_ordered(z, x, w, "bi,io->bo", "bio", ..)` runs the innermost loop along `o`, the
/// contiguous axis of both `z` and `w`, which the C compiler vectorizes.
///
/// # Errors
///
/// [`Error::Spec`] as for [`projections_ordered`].
pub fn matmul_ordered(
    out: &Tnode,
    a: &Tnode,
    b: &Tnode,
    spec: &str,
    loop_order: &str,
    statics: &Bindings,
) -> Result<Assignments> {
    let p = projections_for(spec, out, &[a, b], statics, Some(loop_order))?;
    Ok(binop(
        true,
        Binop::Add,
        Binop::Mul,
        out,
        node(a),
        node(b),
        p,
    ))
}

/// `out = x + bias`, the bias broadcast as the spec says (e.g. `"bo,o->bo"`).
///
/// # Errors
///
/// [`Error::Spec`] when the spec does not fit the operands' dims.
pub fn add_bias(
    out: &Tnode,
    x: &Tnode,
    bias: &Tnode,
    spec: &str,
    statics: &Bindings,
) -> Result<Assignments> {
    let p = projections_for(spec, out, &[x, bias], statics, None)?;
    Ok(binop(
        true,
        Binop::Add,
        Binop::Add,
        out,
        node(x),
        node(bias),
        p,
    ))
}

/// `out = relu(x) = max(x, 0)`, pointwise.
///
/// # Errors
///
/// [`Error::Assignment`] when the dims differ.
pub fn relu(out: &Tnode, x: &Tnode) -> Result<Assignments> {
    let p = pointwise("relu", out, &[x])?;
    Ok(unop(true, Binop::Add, Unop::Relu, out, node(x), p))
}

/// The gradient of a ReLU: `out = gate > 0 ? grad : 0`, pointwise ([`Binop::ReluGate`]).
/// `gate` can be the ReLU's input or its output (both are positive at the same cells), so the
/// pre-activation need not be kept.
///
/// # Errors
///
/// [`Error::Assignment`] when the dims differ.
pub fn relu_backward(out: &Tnode, gate: &Tnode, grad: &Tnode) -> Result<Assignments> {
    let p = pointwise("relu_backward", out, &[gate, grad])?;
    Ok(binop(
        true,
        Binop::Add,
        Binop::ReluGate,
        out,
        node(gate),
        node(grad),
        p,
    ))
}

/// `out = Σ x` over the letters of `spec` missing from the result (e.g. `"bo->o"`). The result
/// is overwritten.
///
/// # Errors
///
/// [`Error::Spec`] when the spec does not fit the operands' dims.
pub fn sum(out: &Tnode, x: &Tnode, spec: &str, statics: &Bindings) -> Result<Assignments> {
    let p = projections_for(spec, out, &[x], statics, None)?;
    Ok(unop(true, Binop::Add, Unop::Identity, out, node(x), p))
}

/// [`sum`] with the loops nested in `loop_order` (outermost first); `sum_ordered(gb, d,
/// "bo->o", "bo", ..)` adds rows of `d` with a contiguous innermost loop.
///
/// # Errors
///
/// [`Error::Spec`] as for [`projections_ordered`].
pub fn sum_ordered(
    out: &Tnode,
    x: &Tnode,
    spec: &str,
    loop_order: &str,
    statics: &Bindings,
) -> Result<Assignments> {
    let p = projections_for(spec, out, &[x], statics, Some(loop_order))?;
    Ok(unop(true, Binop::Add, Unop::Identity, out, node(x), p))
}

/// `out = x` with axes permuted as the spec says (e.g. `"io->oi"`).
///
/// # Errors
///
/// [`Error::Spec`] when the spec does not fit the operands' dims.
pub fn transpose(out: &Tnode, x: &Tnode, spec: &str, statics: &Bindings) -> Result<Assignments> {
    let p = projections_for(spec, out, &[x], statics, None)?;
    Ok(unop(true, Binop::Add, Unop::Identity, out, node(x), p))
}

/// A scalar (dims `[1]`) node holding `value`, and the assignment that fills it. Scalars
/// computed from constants are inlined by the optimizer: the constant appears in the C.
///
/// # Errors
///
/// [`Error::Dims`] only if the node cannot be created.
pub fn constant(label: &str, value: f64, prec: Prec) -> Result<(Tnode, Assignments)> {
    let c = Tnode::new(&[label], &[1], prec)?;
    let fill = Assignments::Fetch {
        array: c.clone(),
        fetch_op: FetchOp::Constant(value),
    };
    Ok((c, fill))
}

/// `out = factor · x`, pointwise (`x` may also be a scalar `[1]`, broadcast).
///
/// # Errors
///
/// [`Error::Assignment`] when the dims do not fit.
pub fn scale(out: &Tnode, x: &Tnode, factor: f64) -> Result<Assignments> {
    let (c, fill) = constant("factor", factor, out.prec())?;
    let p = pointwise("scale", out, &[x, &c])?;
    Ok(Assignments::seq([
        fill,
        binop(true, Binop::Add, Binop::Mul, out, node(x), node(&c), p),
    ]))
}

/// `out = a ⊙ b`, pointwise (either argument may be a scalar `[1]`, broadcast).
///
/// # Errors
///
/// [`Error::Assignment`] when the dims do not fit.
pub fn mul(out: &Tnode, a: &Tnode, b: &Tnode) -> Result<Assignments> {
    let p = pointwise("mul", out, &[a, b])?;
    Ok(binop(
        true,
        Binop::Add,
        Binop::Mul,
        out,
        node(a),
        node(b),
        p,
    ))
}

/// `out = a - b`, pointwise (either argument may be a scalar `[1]`, broadcast).
///
/// # Errors
///
/// [`Error::Assignment`] when the dims do not fit.
pub fn sub(out: &Tnode, a: &Tnode, b: &Tnode) -> Result<Assignments> {
    let p = pointwise("sub", out, &[a, b])?;
    Ok(binop(
        true,
        Binop::Add,
        Binop::Sub,
        out,
        node(a),
        node(b),
        p,
    ))
}

/// `out[...] = source[index, ...]`: the slice of `source` selected by a static index (a
/// [`FetchOp::Slice`]); `source`'s dims are `[n]` followed by `out`'s dims.
pub fn slice(out: &Tnode, source: &Tnode, index: &StaticSymbol) -> Assignments {
    Assignments::Fetch {
        array: out.clone(),
        fetch_op: FetchOp::Slice {
            batch_idx: index.clone(),
            sliced: source.clone(),
        },
    }
}

/// The merge step of data-parallel training: `g = g + merge(g)`, adding the copy of `g` that
/// another device put into this device's merge buffer
/// ([`crate::backend::Backend::device_to_device`] with `Streaming` or `Copy`). A routine can
/// read only one node from the merge buffer, so each tensor to merge needs its own routine.
pub fn merge_add(g: &Tnode) -> Assignments {
    let p = Projections {
        debug_info: "merge (pointwise)".into(),
        ..Projections::pointwise(g.dims(), 1)
    };
    unop(
        false,
        Binop::Add,
        Unop::Identity,
        g,
        Buffer::MergeBuffer(g.clone()),
        p,
    )
}

/// One SGD step with weight decay, `p = p - lr·(g + wd·p)`, written as `p -= lr_wd·p` then
/// `p -= lr·g`, where `lr` and `lr_wd` (= `lr·wd`) are scalar (`[1]`) nodes computed in the
/// same routine (e.g. from a learning-rate schedule and a static step index).
///
/// # Errors
///
/// [`Error::Assignment`] when `g`'s dims differ from `p`'s or `lr`, `lr_wd` are not scalars.
pub fn sgd_step(p: &Tnode, g: &Tnode, lr: &Tnode, lr_wd: &Tnode) -> Result<Assignments> {
    for s in [lr, lr_wd] {
        if s.dims() != [1] {
            return Err(Error::Assignment(format!(
                "sgd_step for {}: {} must be a scalar [1], it has dims {:?}",
                p.name(),
                s.name(),
                s.dims()
            )));
        }
    }
    let decay = pointwise("weight decay", p, &[lr_wd, p])?;
    let step = pointwise("sgd step", p, &[lr, g])?;
    Ok(Assignments::seq([
        binop(
            false,
            Binop::Sub,
            Binop::Mul,
            p,
            node(lr_wd),
            node(p),
            decay,
        ),
        binop(false, Binop::Sub, Binop::Mul, p, node(lr), node(g), step),
    ]))
}

/// A small deterministic generator for datasets and initialization: the SplitMix64 of host
/// array initialization ([`crate::ir::ndarray`]), with helpers.
#[derive(Clone, Debug)]
pub(crate) struct Rng(SplitMix64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(SplitMix64::new(seed ^ 0x5DEE_CE66_D1CE_4E5B))
    }
    /// Uniform in `[0, 1)`.
    pub(crate) fn uniform(&mut self) -> f64 {
        self.0.next_f64()
    }
    /// Uniform in `[lo, hi)`.
    pub(crate) fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }
    /// Uniform in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((self.uniform() * n as f64) as usize).min(n.saturating_sub(1))
    }
    /// A random permutation of `0..n`.
    pub(crate) fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_order_permutes_the_product_space() {
        let statics = Bindings::empty();
        let p = projections_ordered("bi,io->bo", &[4, 3], &[&[4, 2], &[2, 3]], &statics, "bio")
            .unwrap();
        assert_eq!(p.product_space, vec![4, 2, 3]);
        let d = einsum::projections("bi,io->bo", &[4, 3], &[&[4, 2], &[2, 3]], &statics).unwrap();
        assert_eq!(d.product_space, vec![4, 3, 2]);
        // The iterator of `i` is the one the first argument's second axis uses.
        assert_eq!(
            p.project_rhs[0][1],
            AxisIndex::Iterator(p.product_iterators[1])
        );
        assert!(
            projections_ordered("bi,io->bo", &[4, 3], &[&[4, 2], &[2, 3]], &statics, "bo").is_err()
        );
        assert!(
            projections_ordered("bi,io->bo", &[4, 3], &[&[4, 2], &[2, 3]], &statics, "bioq")
                .is_err()
        );
        // Letters of extent 1 are skipped.
        let p = projections_ordered("bi,io->bo", &[4, 1], &[&[4, 2], &[2, 1]], &statics, "bio")
            .unwrap();
        assert_eq!(p.product_space, vec![4, 2]);
    }

    #[test]
    fn rng_is_deterministic() {
        let a: Vec<u64> = {
            let mut r = Rng::new(3);
            (0..4).map(|_| r.uniform().to_bits()).collect()
        };
        let mut r = Rng::new(3);
        assert_eq!(a, (0..4).map(|_| r.uniform().to_bits()).collect::<Vec<_>>());
        let mut p = Rng::new(1).permutation(10);
        p.sort();
        assert_eq!(p, (0..10).collect::<Vec<_>>());
    }
}
