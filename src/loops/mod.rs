//! The loop IR (`Low_level`): what lowering produces, the optimizer rewrites, the C writer
//! prints and the reference interpreter runs.
//!
//! Scalar code is statements ([`Llc`]) over values ([`Llv`]). The optimizer's kernel passes
//! add *vector* statements: a vector variable ([`VReg`]) holds `lanes` values of one compute
//! precision; [`Vlv`] computes lane-wise (loads of consecutive elements, broadcasts, fused
//! multiply-adds, additions, lane shuffles, ...); [`Llc::VSet`] assigns a vector variable and [`Llc::VStore`]
//! stores one into consecutive elements of a tensor. Their meaning is defined lane by lane,
//! so the interpreter runs them like scalar code, and the C writer prints them with the
//! target's vector instructions.

mod deps;
mod print;
mod verify;
mod walk;

pub use deps::{analyze, check_parallel, parallel_work, Accumulator, Independence, Regions};
pub use print::to_doc;
pub use verify::verify;
pub use walk::{
    map_block, map_body, map_indices, map_value_indices, visit_indices, visit_llc, visit_reads,
    visit_value, visit_value_indices, visit_values, visit_vectors,
};
pub(crate) use walk::{rename, replace_statements, visit_vlv};

use crate::ir::{AxisIndex, Binop, Prec, Symbol, Ternop, Tnode, Unop};

/// A scalar local holding one virtual node's value at one read site.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScopeId {
    /// The virtual node whose value the local holds.
    pub tn: Tnode,
    /// Unique within a routine.
    pub id: u32,
}

/// Statements of the loop IR.
#[derive(Clone, Debug, PartialEq)]
pub enum Llc {
    /// Nothing.
    Noop,
    /// A comment (the text of a block comment).
    Comment(String),
    /// Statements in order.
    Seq(Vec<Llc>),
    /// `for index in from..=to { body }`.
    For {
        /// The iterator.
        index: Symbol,
        /// First value.
        from: i64,
        /// Last value (inclusive).
        to: i64,
        /// The body.
        body: Box<Llc>,
        /// Whether tracing should walk this loop.
        trace_it: bool,
    },
    /// A parallel region: a loop whose iterations are independent, so that a device's thread
    /// team may run them in any order and at once (see [`ParallelLoop`]). Its meaning is
    /// the plain loop's: the interpreter runs it as one.
    Parallel(Box<ParallelLoop>),
    /// `if (0 <= idx < extent for every guard) { body }`: the guards of affine indices
    /// (SPEC 9.3); the points where one fails are skipped.
    If {
        /// Each guard: an index and the exclusive bound it must stay below (and it must not
        /// be negative).
        guards: Vec<(AxisIndex, usize)>,
        /// The guarded statements.
        body: Box<Llc>,
    },
    /// A row index read from data (gather and scatter-add, SPEC 9.4): reads the integer
    /// `tn[idcs]` exactly (any integer precision, signed or unsigned); when its value `v`
    /// satisfies `0 <= v < extent`, runs `body` with `symbol` bound to `v` (an index in
    /// `0..extent`, used like a loop iterator); otherwise does nothing. So the body's
    /// accesses through `symbol` stay in bounds for every value the data can hold.
    Lookup {
        /// The symbol bound to the value read (fresh, used only in `body`).
        symbol: Symbol,
        /// The integer tensor the value is read from.
        tn: Tnode,
        /// The cell read.
        idcs: Vec<AxisIndex>,
        /// The exclusive bound the value must stay below.
        extent: usize,
        /// The statements run when the value is in range.
        body: Box<Llc>,
    },
    /// Fill a node with zeros.
    ZeroOut(Tnode),
    /// `tn[idcs] = value`.
    Set {
        /// The node written.
        tn: Tnode,
        /// Its indices.
        idcs: Vec<AxisIndex>,
        /// The value.
        value: Llv,
    },
    /// Set a scalar local.
    SetLocal(ScopeId, Llv),
    /// Set a vector variable.
    VSet(VReg, Vlv),
    /// A hint with no effect on any value: the cache line holding element `offset` of `tn`
    /// (counted in elements from its first, in memory order) is about to be read (`write`:
    /// written). The offset may lie outside the tensor: the C writer computes the address in
    /// integer arithmetic (no out-of-bounds pointer is formed) and prefetch instructions never
    /// fault. Written only by the optimizer's last pass ([`crate::optimize`]'s prefetching).
    Prefetch {
        /// The node whose memory is touched.
        tn: Tnode,
        /// The element, in memory order.
        offset: AxisIndex,
        /// Whether the line is about to be written rather than read.
        write: bool,
    },
    /// `tn[idcs + lane] = value[lane]` for every lane: the vector's lanes go to consecutive
    /// elements of `tn` (in memory order) starting at the element `idcs`. `tn`'s precision is
    /// the vector's precision, or, for integer lanes, an integer precision of the same width
    /// (each lane's bit pattern is stored: as two's complement into a signed precision).
    VStore {
        /// The node written.
        tn: Tnode,
        /// The indices of the first element written.
        idcs: Vec<AxisIndex>,
        /// The vector stored.
        value: Vlv,
    },
}

/// A loop whose iterations are independent (found by the optimizer's parallel pass,
/// [`crate::optimize`], and checked by `verify`): each iteration writes only cells that no
/// other iteration reads or writes, except the cells of its `private` local arrays, which
/// every iteration writes before it reads them and nothing after the loop reads; the vector
/// variables it uses are its own and assigned before they are read. So its iterations may run
/// in any order, on several threads, each thread with its own copy of the private arrays,
/// and compute exactly what the plain loop computes.
#[derive(Clone, Debug, PartialEq)]
pub struct ParallelLoop {
    /// The iterator.
    pub index: Symbol,
    /// First value.
    pub from: i64,
    /// Last value (inclusive).
    pub to: i64,
    /// The body.
    pub body: Llc,
    /// Local arrays each iteration writes before reading them (one copy per thread).
    pub private: Vec<Tnode>,
    /// The fewest iterations worth giving a thread at once (the loop's work per iteration
    /// is small below it).
    pub grain: i64,
}

impl ParallelLoop {
    /// The same loop as a plain [`Llc::For`].
    pub fn to_for(&self) -> Llc {
        Llc::for_loop(self.index, self.from, self.to, self.body.clone())
    }
}

/// The type of a vector: `lanes` values of precision `prec` (single: `float` lanes, double:
/// `double` lanes, bfloat16: the bit patterns of [`Vlv::DotPairs`]' operands; `uint16`,
/// `uint32` and `uint64`: unsigned integer lanes whose arithmetic wraps modulo 2^bits, so that
/// it is exact modular arithmetic and never undefined behaviour).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VType {
    /// Single, double, bfloat16, uint16, uint32 or uint64.
    pub prec: Prec,
    /// How many values.
    pub lanes: usize,
}

/// A vector variable of a routine (a register, for the C compiler).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VReg {
    /// Unique within a routine.
    pub id: u32,
    /// Its type.
    pub ty: VType,
}

/// Vector values, computed lane by lane in the vector's precision.
///
/// On integer vectors (`uint16`, `uint32`, `uint64` lanes) every operation is modular:
/// `a * b + c`, `a + b`, `a - b` and `a * b` wrap modulo 2^bits of a lane.
#[derive(Clone, Debug, PartialEq)]
pub enum Vlv {
    /// A vector variable's value.
    Reg(VReg),
    /// Every lane 0.
    Zero(VType),
    /// Every lane equal to a scalar value (computed in the vector's precision; for integer
    /// lanes, computed as a statement storing into the lanes' precision computes it, SPEC 9.1,
    /// then wrapped into the lanes).
    Splat(VType, Box<Llv>),
    /// `lanes` consecutive elements of a tensor (in memory order) starting at the element
    /// `idcs`; the tensor's precision is the vector's, or, for integer lanes, an integer
    /// precision of the same width (`int32` into `uint32` lanes, `int64` into `uint64`): the
    /// lanes then hold the elements' two's complement bit patterns.
    Load(VType, Tnode, Vec<AxisIndex>),
    /// `a * b + c`, rounded once where the target has fused multiply-add (twice otherwise);
    /// on integer lanes, exact modulo 2^bits.
    Fma(Box<Vlv>, Box<Vlv>, Box<Vlv>),
    /// A lane-wise binary operation (add, sub, mul, div, max, min), with the operation's
    /// meaning ([`Binop::interpret`]).
    Binop(Binop, Box<Vlv>, Box<Vlv>),
    /// A lane-wise unary operation of single or double vectors, with the operation's meaning
    /// ([`Unop::interpret`]) up to the documented error bound of the runtime's vector function
    /// (`aj_v<op>_f32_<lanes>` of `runtime_c/arrayjit.h`; [`vector_unop`] says which exist).
    Unop(Unop, Box<Vlv>),
    /// A lane-wise ternary operation ([`Ternop::Fma`]: one rounding on every target;
    /// [`Ternop::Mul3`]: `(a * b) * c`).
    Ternop(Ternop, Box<Vlv>, Box<Vlv>, Box<Vlv>),
    /// A permutation of two vectors' lanes: lane `i` is lane `idx[i]` of `a` followed by `b`
    /// (`idx[i] < lanes` picks lane `idx[i]` of `a`, else lane `idx[i] - lanes` of `b`). `a`
    /// and `b` have one type; `idx` has one entry per lane, each below `2 · lanes`.
    Shuffle(Box<Vlv>, Box<Vlv>, Vec<usize>),
    /// The lanes of `a` repeated `times` times (a vector of `a.lanes · times` lanes of
    /// `a`'s precision): a pair of bfloat16 values broadcast to every pair of a vector.
    Repeat(Box<Vlv>, usize),
    /// Dot products of bfloat16 pairs (AVX512-BF16's `vdpbf16ps`): lane `i` of the
    /// single-precision `acc` plus `a[2i+1]·b[2i+1]`, then plus `a[2i]·b[2i]`, where `a` and
    /// `b` are vectors of `2 · acc.lanes` bfloat16 values. Each product of two bfloat16
    /// values is exact in single precision and each addition rounds to nearest even; as the
    /// instruction does, subnormal inputs and results count as zero. Only written for
    /// targets with [`crate::target::VectorTarget::bf16_dot`].
    DotPairs(Box<Vlv>, Box<Vlv>, Box<Vlv>),
}

impl Vlv {
    /// The vector's type.
    pub fn ty(&self) -> VType {
        match self {
            Vlv::Reg(r) => r.ty,
            Vlv::Zero(t) | Vlv::Splat(t, _) | Vlv::Load(t, _, _) => *t,
            Vlv::Fma(a, _, _)
            | Vlv::Binop(_, a, _)
            | Vlv::Unop(_, a)
            | Vlv::Ternop(_, a, _, _)
            | Vlv::Shuffle(a, _, _)
            | Vlv::DotPairs(a, _, _) => a.ty(),
            Vlv::Repeat(a, times) => {
                let t = a.ty();
                VType {
                    prec: t.prec,
                    lanes: t.lanes * times,
                }
            }
        }
    }
}

/// Whether the runtime header has a lane-wise vector function for `op` on vectors of
/// precision `prec` ([`Vlv::Unop`]): exact operations (identity, neg, abs, relu, recip,
/// satur01) and `exp exp2 log log2 tanh sigmoid` for single and double; `sin cos rsqrt` for
/// single only. Others (`sqrt`, rounding, `not`) stay scalar code.
pub fn vector_unop(op: Unop, prec: Prec) -> bool {
    let exact = matches!(
        op,
        Unop::Identity | Unop::Neg | Unop::Abs | Unop::Relu | Unop::Recip | Unop::Satur01
    );
    match prec {
        Prec::Single => {
            exact
                || matches!(
                    op,
                    Unop::Exp
                        | Unop::Exp2
                        | Unop::Log
                        | Unop::Log2
                        | Unop::Tanh
                        | Unop::Sigmoid
                        | Unop::Sin
                        | Unop::Cos
                        | Unop::Rsqrt
                )
        }
        Prec::Double => {
            exact
                || matches!(
                    op,
                    Unop::Exp | Unop::Exp2 | Unop::Log | Unop::Log2 | Unop::Tanh | Unop::Sigmoid
                )
        }
        _ => false,
    }
}

/// Values (scalar expressions) of the loop IR.
#[derive(Clone, Debug, PartialEq)]
pub enum Llv {
    /// A block computing a virtual node's value into a local, then yielding that local.
    LocalScope {
        /// The local.
        id: ScopeId,
        /// The computation.
        body: Box<Llc>,
        /// The indices the node was read at.
        orig_indices: Vec<AxisIndex>,
    },
    /// The value of a local.
    GetLocal(ScopeId),
    /// `tn[idcs]`.
    Get(Tnode, Vec<AxisIndex>),
    /// The merge buffer, holding `tn`, at `idcs`.
    GetMergeBuffer(Tnode, Vec<AxisIndex>),
    /// The result of calling a C function `double NAME(void)`.
    GetCFunction(String),
    /// A binary operation.
    Binop(Binop, Box<Llv>, Box<Llv>),
    /// A unary operation.
    Unop(Unop, Box<Llv>),
    /// A ternary operation.
    Ternop(Ternop, Box<Llv>, Box<Llv>, Box<Llv>),
    /// The counter-based random value of SPEC section 9.5 for the cell `idcs` of a tensor of
    /// dims `dims` and precision `prec`: Threefry-4x32-20's first word `w` for key `seed` and
    /// counter the cell's row-major offset, as `w / 2^32` rounded down to `prec` (floating
    /// precisions) or `w` itself (integer precisions, then stored by wrapping). See
    /// [`crate::ir::random`].
    Random {
        /// The generator's 64-bit seed.
        seed: u64,
        /// The cell's indices (one per axis of `dims`).
        idcs: Vec<AxisIndex>,
        /// The dims of the tensor filled (for the row-major offset).
        dims: Vec<usize>,
        /// The precision of the tensor filled.
        prec: Prec,
    },
    /// A constant.
    Constant(f64),
    /// The value of an index (a fixed number, a loop iterator or a static index).
    EmbedIndex(AxisIndex),
}

impl Llc {
    /// `for index in from..=to { body }`, walked by tracing.
    pub fn for_loop(index: Symbol, from: i64, to: i64, body: Llc) -> Llc {
        Llc::For {
            index,
            from,
            to,
            body: Box::new(body),
            trace_it: true,
        }
    }

    /// Flattens nested sequences and drops no-ops.
    pub fn flatten(self) -> Vec<Llc> {
        let mut out = vec![];
        fn go(c: Llc, out: &mut Vec<Llc>) {
            match c {
                Llc::Noop => {}
                Llc::Seq(v) => v.into_iter().for_each(|c| go(c, out)),
                c => out.push(c),
            }
        }
        go(self, &mut out);
        out
    }
}

impl VType {
    /// Whether a vector of this type may be loaded from and stored into a tensor of precision
    /// `p` ([`Vlv::Load`], [`Llc::VStore`]): `p` is the lanes' precision, or the lanes are
    /// integers and `p` is an integer precision of the same width.
    pub fn fits_memory_of(&self, p: Prec) -> bool {
        p == self.prec
            || (self.prec.is_integer()
                && p.is_integer()
                && p.size_in_bytes() == self.prec.size_in_bytes())
    }
}

/// The compute type of a statement storing `value` into precision `result` (SPEC 9.1): from
/// the result and the precisions of the values it reads (tensors, merge buffers and inlined
/// virtual nodes; an imported C function counts as a `double` argument; constants and index
/// values do not count).
pub fn statement_compute(result: Prec, value: &Llv) -> crate::ir::Compute {
    fn args(v: &Llv, out: &mut Vec<Prec>) {
        match v {
            Llv::Get(t, _) | Llv::GetMergeBuffer(t, _) => out.push(t.prec()),
            Llv::GetLocal(id) | Llv::LocalScope { id, .. } => out.push(id.tn.prec()),
            Llv::GetCFunction(_) => out.push(Prec::Double),
            Llv::Constant(_) | Llv::EmbedIndex(_) => {}
            Llv::Binop(_, a, b) => {
                args(a, out);
                args(b, out);
            }
            Llv::Unop(_, a) => args(a, out),
            Llv::Ternop(_, a, b, c) => {
                args(a, out);
                args(b, out);
                args(c, out);
            }
            // A random fetch reads a value of its precision (a word for integers).
            Llv::Random { prec, .. } => out.push(*prec),
        }
    }
    let mut precs = vec![];
    if result.is_integer() {
        args(value, &mut precs);
    }
    crate::ir::Compute::of(result, precs)
}

/// Whether a value of the integer compute type (SPEC 9.1) is an unsigned (`uint64`) one;
/// otherwise it is signed (int64). A value read from a tensor (or an inlined virtual tensor, a
/// merge buffer) keeps its precision's signedness: `uint64` is unsigned, every other integer
/// precision fits in int64 and is signed. Constants, index values, imported functions and
/// random words are signed. An operation's result is unsigned when one of the operands it
/// computes from is (a comparison, `and`, `or`, `not`, `satur01` and `satur01_gate` give 0 or
/// 1: signed; `arg1`, `arg2`, `relu_gate`, `shl`, `shr` and the unary operations keep the
/// signedness of the operand they pass on or shift). Operations then see exact values: -1
/// read from an int32 is below 5 read from a uint64, `abs` of an int64 -6 is 6 in any result.
pub fn int_unsigned(v: &Llv) -> bool {
    match v {
        Llv::Get(t, _) | Llv::GetMergeBuffer(t, _) => t.prec() == Prec::Uint64,
        Llv::GetLocal(id) | Llv::LocalScope { id, .. } => id.tn.prec() == Prec::Uint64,
        Llv::Constant(_) | Llv::EmbedIndex(_) | Llv::GetCFunction(_) | Llv::Random { .. } => false,
        Llv::Binop(op, a, b) => match op {
            Binop::Lt
            | Binop::Le
            | Binop::Gt
            | Binop::Ge
            | Binop::Eq
            | Binop::Ne
            | Binop::And
            | Binop::Or
            | Binop::Satur01Gate => false,
            Binop::Arg1 | Binop::Shl | Binop::Shr => int_unsigned(a),
            Binop::Arg2 | Binop::ReluGate => int_unsigned(b),
            _ => int_unsigned(a) || int_unsigned(b),
        },
        Llv::Unop(op, a) => match op {
            Unop::Not | Unop::Satur01 => false,
            _ => int_unsigned(a),
        },
        Llv::Ternop(Ternop::Where, _, b, c) => int_unsigned(b) || int_unsigned(c),
        Llv::Ternop(_, a, b, c) => int_unsigned(a) || int_unsigned(b) || int_unsigned(c),
    }
}
