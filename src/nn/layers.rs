//! Layers of a convolutional network and generic statement builders for every operation of
//! the op table (SPEC section 9): each returns the assignments of one array operation and
//! runs nothing.
//!
//! - [`unary`], [`binary`], [`reduce`], [`contract`]: any unary or binary operation, pointwise
//!   or with an einsum spec (affine entries included), overwriting or accumulating;
//! - [`conv2d`], [`conv2d_weight_grad`], [`conv2d_input_grad`]: a 2-D convolution over NHWC
//!   images with stride and zero padding, and its two gradients (SPEC section 9.3);
//! - [`max_pool2d`], [`max_pool2d_backward`]: square max-pooling and its gradient;
//! - [`softmax_cross_entropy`]: the loss of a classifier over integer labels, with its
//!   gradient.

use crate::error::{Error, Result};
use crate::ir::einsum;
use crate::ir::{Assignments, Bindings, Binop, Buffer, FetchOp, Prec, Tnode, Unop};

fn node(t: &Tnode) -> Buffer {
    Buffer::Node(t.clone())
}

fn proj(spec: &str, out: &Tnode, args: &[&Tnode]) -> Result<crate::ir::Projections> {
    let dims: Vec<&[usize]> = args.iter().map(|t| t.dims()).collect();
    einsum::projections(spec, out.dims(), &dims, &Bindings::empty())
}

/// A spec over all of `out`'s axes, for pointwise statements: `"abc,abc->abc"` style.
fn pointwise_spec(out: &Tnode, nargs: usize) -> Result<String> {
    let rank = out.dims().len();
    if rank > 26 {
        return Err(Error::Assignment(format!(
            "{}: rank {rank} is above the 26 letters of a spec",
            out.name()
        )));
    }
    let term: String = (0..rank).map(|i| (b'a' + i as u8) as char).collect();
    Ok(format!("{}->{term}", vec![term.clone(); nargs].join(",")))
}

/// `out = op(x)`, pointwise (`x` has `out`'s dims).
///
/// # Errors
///
/// [`Error::Spec`] when the dims differ.
pub fn unary(out: &Tnode, op: Unop, x: &Tnode) -> Result<Assignments> {
    let spec = pointwise_spec(out, 1)?;
    Ok(Assignments::AccumUnop {
        initialize_neutral: false,
        accum: Binop::Arg2,
        op,
        lhs: out.clone(),
        rhs: node(x),
        projections: proj(&spec, out, &[x])?,
    })
}

/// `out = op(a, b)` at every point of `spec` (e.g. `"bk,b->bk"` broadcasts `b`; `None`:
/// pointwise). The result is overwritten where the spec reaches it.
///
/// # Errors
///
/// [`Error::Spec`] when the spec does not fit the operands' dims.
pub fn binary(
    out: &Tnode,
    op: Binop,
    a: &Tnode,
    b: &Tnode,
    spec: Option<&str>,
) -> Result<Assignments> {
    let spec = match spec {
        Some(s) => s.to_string(),
        None => pointwise_spec(out, 2)?,
    };
    Ok(Assignments::AccumBinop {
        initialize_neutral: false,
        accum: Binop::Arg2,
        op,
        lhs: out.clone(),
        rhs1: node(a),
        rhs2: node(b),
        projections: proj(&spec, out, &[a, b])?,
    })
}

/// `out = accum over the letters missing from the result of x` (e.g. `accum` [`Binop::Max`]
/// and `"bk->b"` for a row maximum). The result starts from `accum`'s neutral element.
///
/// # Errors
///
/// [`Error::Spec`] when the spec does not fit the operands' dims.
pub fn reduce(out: &Tnode, accum: Binop, x: &Tnode, spec: &str) -> Result<Assignments> {
    Ok(Assignments::AccumUnop {
        initialize_neutral: true,
        accum,
        op: Unop::Identity,
        lhs: out.clone(),
        rhs: node(x),
        projections: proj(spec, out, &[x])?,
    })
}

/// `out = accum over the points of spec of op(a, b)`, starting from `accum`'s neutral
/// element: [`Binop::Add`] of [`Binop::Mul`] is a sum of products (a matrix product, a
/// convolution).
///
/// # Errors
///
/// [`Error::Spec`] when the spec does not fit the operands' dims.
pub fn contract(
    out: &Tnode,
    accum: Binop,
    op: Binop,
    a: &Tnode,
    b: &Tnode,
    spec: &str,
) -> Result<Assignments> {
    Ok(Assignments::AccumBinop {
        initialize_neutral: true,
        accum,
        op,
        lhs: out.clone(),
        rhs1: node(a),
        rhs2: node(b),
        projections: proj(spec, out, &[a, b])?,
    })
}

/// The geometry of a square 2-D window (a convolution kernel or a pooling window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// The step between windows.
    pub stride: usize,
    /// Zero padding on each side (points reading it are skipped, SPEC section 9.3).
    pub padding: usize,
}

impl Window {
    /// The affine entry of an image axis: `(S*o+k-P)`.
    fn entry(&self, o: char, k: char) -> String {
        let mut s = String::from("(");
        if self.stride != 1 {
            s.push_str(&format!("{}*", self.stride));
        }
        s.push(o);
        s.push('+');
        s.push(k);
        if self.padding != 0 {
            s.push_str(&format!("-{}", self.padding));
        }
        s.push(')');
        s
    }

    fn input_term(&self) -> String {
        format!("b{}{}c", self.entry('h', 'i'), self.entry('v', 'j'))
    }
}

/// `y[b,h,v,d] = Σ x[b, S·h+i-P, S·v+j-P, c] · w[i,j,c,d]`: a 2-D convolution of NHWC images
/// `x` (`[B, H, W, C]`) with kernels `w` (`[K, K, C, D]`) into `y` (`[B, H', W', D]`); points
/// in the padding are skipped (zero padding).
///
/// # Errors
///
/// [`Error::Spec`] when the dims do not fit together.
pub fn conv2d(y: &Tnode, x: &Tnode, w: &Tnode, win: Window) -> Result<Assignments> {
    let spec = format!("{},ijcd->bhvd", win.input_term());
    contract(y, Binop::Add, Binop::Mul, x, w, &spec)
}

/// The gradient of [`conv2d`] with respect to its kernels: `gw[i,j,c,d] = Σ x[b, S·h+i-P,
/// S·v+j-P, c] · dy[b,h,v,d]`.
///
/// # Errors
///
/// [`Error::Spec`] when the dims do not fit together.
pub fn conv2d_weight_grad(gw: &Tnode, x: &Tnode, dy: &Tnode, win: Window) -> Result<Assignments> {
    let spec = format!("{},bhvd->ijcd", win.input_term());
    contract(gw, Binop::Add, Binop::Mul, x, dy, &spec)
}

/// The gradient of [`conv2d`] with respect to its input (a transposed convolution):
/// `dx[b, S·h+i-P, S·v+j-P, c] += dy[b,h,v,d] · w[i,j,c,d]`, `dx` first zeroed.
///
/// # Errors
///
/// [`Error::Spec`] when the dims do not fit together.
pub fn conv2d_input_grad(dx: &Tnode, dy: &Tnode, w: &Tnode, win: Window) -> Result<Assignments> {
    let spec = format!("bhvd,ijcd->{}", win.input_term());
    contract(dx, Binop::Add, Binop::Mul, dy, w, &spec)
}

/// A `[size, size]` node filled with ones, and its fill: the window argument of the pooling
/// statements (its values are never used; its dims give the window's letters their extent).
fn window_node(label: &str, size: usize, prec: Prec) -> Result<(Tnode, Assignments)> {
    let k = Tnode::new(&[label, "window"], &[size, size], prec)?;
    let fill = Assignments::Fetch {
        array: k.clone(),
        fetch_op: FetchOp::Constant(1.0),
    };
    Ok((k, fill))
}

/// `y[b,h,v,c] = max over i,j < size of x[b, size·h+i, size·v+j, c]`: max-pooling of NHWC
/// images with a square window and a stride of its size (`x`: `[B, H, W, C]`, `y`:
/// `[B, H/size, W/size, C]`).
///
/// # Errors
///
/// [`Error::Spec`] when the dims do not fit together.
pub fn max_pool2d(y: &Tnode, x: &Tnode, size: usize) -> Result<Assignments> {
    let (k, fill) = window_node(&y.name(), size, x.prec())?;
    let win = Window {
        stride: size,
        padding: 0,
    };
    let spec = format!("{},ij->bhvc", win.input_term());
    Ok(Assignments::seq([
        fill,
        contract(y, Binop::Max, Binop::Arg1, x, &k, &spec)?,
    ]))
}

/// The gradient of [`max_pool2d`]: `dx` gets `dy` at the cells of `x` equal to their window's
/// maximum `y`, and 0 elsewhere (a tie passes the gradient to every maximal cell). `up` is a
/// scratch node of `x`'s dims.
///
/// # Errors
///
/// [`Error::Spec`] when the dims do not fit together.
pub fn max_pool2d_backward(
    dx: &Tnode,
    x: &Tnode,
    y: &Tnode,
    dy: &Tnode,
    up: &Tnode,
    size: usize,
) -> Result<Assignments> {
    let (k, fill) = window_node(&dx.name(), size, x.prec())?;
    let win = Window {
        stride: size,
        padding: 0,
    };
    let spread = format!("bhvc,ij->{}", win.input_term());
    Ok(Assignments::seq([
        fill,
        // up = y spread over each window; dx = (x == up), then dx = dx * (dy spread).
        binary(up, Binop::Arg1, y, &k, Some(&spread))?,
        binary(dx, Binop::Eq, x, up, None)?,
        binary(up, Binop::Arg1, dy, &k, Some(&spread))?,
        binary(dx, Binop::Mul, dx, up, None)?,
    ]))
}

/// Scratch nodes of [`softmax_cross_entropy`], all `[B]` or `[B, K]` like the logits.
pub struct SoftmaxScratch {
    /// `[B]`: row maxima, then the loss per row.
    pub row: Tnode,
    /// `[B]`: row sums of the exponentials.
    pub sum: Tnode,
    /// `[B, K]`: the one-hot labels.
    pub onehot: Tnode,
}

impl SoftmaxScratch {
    /// Scratch nodes for logits of dims `[b, k]` in precision `prec`.
    ///
    /// # Errors
    ///
    /// [`Error::Dims`] only if a node cannot be created.
    pub fn new(label: &str, b: usize, k: usize, prec: Prec) -> Result<SoftmaxScratch> {
        Ok(SoftmaxScratch {
            row: Tnode::new(&[label, "row"], &[b], prec)?,
            sum: Tnode::new(&[label, "sum"], &[b], prec)?,
            onehot: Tnode::new(&[label, "onehot"], &[b, k], prec)?,
        })
    }
}

/// Softmax cross-entropy of `logits` (`[B, K]`) against integer `labels` (`[B]`, any integer
/// precision; `classes` is `[K]` holding `0..K` in the labels' precision), averaged over
/// `total` samples (the whole batch when the rows are one device's share):
/// `loss += Σ_b (log Σ_k e^(z_bk - m_b) + m_b - z_b,label_b) / total` and
/// `dlogits = (softmax(z) - onehot(label)) / total`. `loss` (`[1]`) is overwritten.
///
/// # Errors
///
/// [`Error::Spec`] when the dims do not fit together, [`Error::Assignment`] when `total` is 0.
pub fn softmax_cross_entropy(
    loss: &Tnode,
    dlogits: &Tnode,
    logits: &Tnode,
    labels: &Tnode,
    classes: &Tnode,
    s: &SoftmaxScratch,
    total: usize,
) -> Result<Assignments> {
    if total == 0 {
        return Err(Error::Assignment(format!(
            "softmax_cross_entropy into {}: the sample count is 0",
            loss.name()
        )));
    }
    let (inv, fill) = super::constant("inv_total", 1.0 / total as f64, loss.prec())?;
    let (m, sum, onehot, d) = (&s.row, &s.sum, &s.onehot, dlogits);
    Ok(Assignments::seq([
        fill,
        reduce(m, Binop::Max, logits, "bk->b")?,
        // d = exp(z - m); sum = Σ_k d; d = d / sum
        binary(d, Binop::Sub, logits, m, Some("bk,b->bk"))?,
        unary(d, Unop::Exp, d)?,
        reduce(sum, Binop::Add, d, "bk->b")?,
        binary(d, Binop::Div, d, sum, Some("bk,b->bk"))?,
        binary(onehot, Binop::Eq, labels, classes, Some("b,k->bk"))?,
        // row = log(sum) + m - Σ_k onehot·z
        unary(sum, Unop::Log, sum)?,
        binary(m, Binop::Add, sum, m, None)?,
        Assignments::AccumBinop {
            initialize_neutral: false,
            accum: Binop::Sub,
            op: Binop::Mul,
            lhs: m.clone(),
            rhs1: node(onehot),
            rhs2: node(logits),
            projections: proj("bk,bk->b", m, &[onehot, logits])?,
        },
        contract(loss, Binop::Add, Binop::Mul, m, &inv, "b,z->z")?,
        // d = (d - onehot) / total
        binary(d, Binop::Sub, d, onehot, None)?,
        binary(d, Binop::Mul, d, &inv, Some("bk,z->bk"))?,
    ]))
}
