//! Assignments: the input IR, and its readable printer.

use super::indexing::{AxisIndex, Projections, StaticSymbol};
use super::ops::{Binop, Ternop, Unop};
use super::tnode::Tnode;
use std::fmt::Write;

/// An argument of an assignment.
#[derive(Clone, Debug, PartialEq)]
pub enum Buffer {
    /// The node's own array.
    Node(Tnode),
    /// This device's merge buffer, which must hold the given node.
    MergeBuffer(Tnode),
}

impl Buffer {
    /// The node read.
    pub fn tnode(&self) -> &Tnode {
        match self {
            Buffer::Node(t) | Buffer::MergeBuffer(t) => t,
        }
    }
}

/// What a [`Assignments::Fetch`] puts into its array.
#[derive(Clone, Debug, PartialEq)]
pub enum FetchOp {
    /// Every cell gets the constant (0 becomes a `Zero_out`), stored by the array's rule
    /// (SPEC 9.1; a half, bfloat16 or fp8 array gets the constant rounded once, directly).
    Constant(f64),
    /// Every cell gets the exact integer, stored by the array's rule (wrapped into an integer
    /// precision: every digit of an int64 above 2^53 is kept; a floating array gets it
    /// rounded). The program format's `"constant"` for integer tensors.
    ConstantInt(i128),
    /// `array[idcs] = sliced[batch_idx, idcs]`.
    Slice {
        /// The static index selecting the slice.
        batch_idx: StaticSymbol,
        /// The array sliced; its dims are `[n] ++ array.dims`.
        sliced: Tnode,
    },
    /// Every cell gets the value of the static index.
    EmbedSymbol(StaticSymbol),
    /// Uniform random values of SPEC section 9.5: Threefry-4x32-20 keyed by the seed,
    /// counting the cell's row-major offset (see [`crate::ir::random`]).
    Random {
        /// The generator's 64-bit seed.
        seed: u64,
    },
    /// Every cell gets the result of a C function `double NAME(void)` available to the
    /// loaded library. The name must be a plain C identifier.
    Imported(String),
}

/// The input IR.
#[derive(Clone, Debug, PartialEq)]
pub enum Assignments {
    /// Nothing.
    Noop,
    /// One after the other.
    Seq(Box<Assignments>, Box<Assignments>),
    /// A labelled block; the first comment names the routine when no name is given.
    BlockComment(String, Box<Assignments>),
    /// `lhs[p_lhs] = accum(lhs[p_lhs], op(rhs1[p_rhs1], rhs2[p_rhs2]))` over the product space.
    AccumBinop {
        /// Fill with accum's neutral element first (or overwrite, when bijective).
        initialize_neutral: bool,
        /// The accumulation; `Arg2` overwrites.
        accum: Binop,
        /// The operation.
        op: Binop,
        /// The result.
        lhs: Tnode,
        /// First argument.
        rhs1: Buffer,
        /// Second argument.
        rhs2: Buffer,
        /// The projections (two argument projections).
        projections: Projections,
    },
    /// `lhs[p_lhs] = accum(lhs[p_lhs], op(rhs1[p_rhs1], rhs2[p_rhs2], rhs3[p_rhs3]))` over the
    /// product space (SPEC section 9.2).
    AccumTernop {
        /// Fill with accum's neutral element first (or overwrite, when bijective).
        initialize_neutral: bool,
        /// The accumulation; `Arg2` overwrites.
        accum: Binop,
        /// The operation.
        op: Ternop,
        /// The result.
        lhs: Tnode,
        /// First argument.
        rhs1: Buffer,
        /// Second argument.
        rhs2: Buffer,
        /// Third argument.
        rhs3: Buffer,
        /// The projections (three argument projections).
        projections: Projections,
    },
    /// `lhs[p_lhs] = accum(lhs[p_lhs], op(rhs[p_rhs]))` over the product space.
    AccumUnop {
        /// Fill with accum's neutral element first (or overwrite, when bijective).
        initialize_neutral: bool,
        /// The accumulation; `Arg2` overwrites.
        accum: Binop,
        /// The operation.
        op: Unop,
        /// The result.
        lhs: Tnode,
        /// The argument.
        rhs: Buffer,
        /// The projections (one argument projection).
        projections: Projections,
    },
    /// `lhs[d, r] = table[index[d], r]` (SPEC section 9.4): `index` has an integer precision
    /// and dims `D`, `table` dims `[N] ++ R`, `lhs` dims `D ++ R`; an index outside `0 .. N-1`
    /// gives zeros.
    Gather {
        /// The result.
        lhs: Tnode,
        /// The table read.
        table: Tnode,
        /// The row indices.
        index: Tnode,
    },
    /// `lhs[index[d], r] += src[d, r]` for every `d` in row-major order whose index is inside
    /// `0 .. N-1` (SPEC section 9.4): `lhs` has dims `[N] ++ R`, `src` dims `D ++ R`.
    ScatterAdd {
        /// The table accumulated into.
        lhs: Tnode,
        /// The rows added.
        src: Tnode,
        /// The row indices.
        index: Tnode,
    },
    /// Fills `array` by `fetch_op`.
    Fetch {
        /// The array filled.
        array: Tnode,
        /// How.
        fetch_op: FetchOp,
    },
}

impl Assignments {
    /// Sequences a list of assignments, as a balanced tree (depth logarithmic in the number
    /// of items, so that walking or dropping it never needs a deep stack).
    pub fn seq(items: impl IntoIterator<Item = Assignments>) -> Assignments {
        fn balanced(mut v: Vec<Assignments>) -> Assignments {
            if v.len() <= 1 {
                return v.pop().unwrap_or(Assignments::Noop);
            }
            let right = v.split_off(v.len() / 2);
            Assignments::Seq(Box::new(balanced(v)), Box::new(balanced(right)))
        }
        balanced(items.into_iter().collect())
    }

    /// A labelled block.
    pub fn block(comment: &str, body: Assignments) -> Assignments {
        Assignments::BlockComment(comment.to_string(), Box::new(body))
    }

    /// The first block comment, used to name a routine when no name is given.
    pub fn first_comment(&self) -> Option<&str> {
        let mut stack = vec![self];
        while let Some(a) = stack.pop() {
            match a {
                Assignments::BlockComment(c, _) => return Some(c),
                Assignments::Seq(a, b) => {
                    stack.push(b);
                    stack.push(a);
                }
                _ => {}
            }
        }
        None
    }

    /// Every node mentioned, in order of first appearance.
    pub fn nodes(&self) -> Vec<Tnode> {
        let mut out: Vec<Tnode> = vec![];
        let mut add = |t: &Tnode| {
            if !out.contains(t) {
                out.push(t.clone())
            }
        };
        self.visit(&mut |a| match a {
            Assignments::AccumBinop {
                lhs, rhs1, rhs2, ..
            } => {
                add(lhs);
                add(rhs1.tnode());
                add(rhs2.tnode());
            }
            Assignments::AccumUnop { lhs, rhs, .. } => {
                add(lhs);
                add(rhs.tnode());
            }
            Assignments::AccumTernop {
                lhs,
                rhs1,
                rhs2,
                rhs3,
                ..
            } => {
                add(lhs);
                add(rhs1.tnode());
                add(rhs2.tnode());
                add(rhs3.tnode());
            }
            Assignments::Gather { lhs, table, index } => {
                add(lhs);
                add(table);
                add(index);
            }
            Assignments::ScatterAdd { lhs, src, index } => {
                add(lhs);
                add(src);
                add(index);
            }
            Assignments::Fetch { array, fetch_op } => {
                add(array);
                if let FetchOp::Slice { sliced, .. } = fetch_op {
                    add(sliced);
                }
            }
            _ => {}
        });
        out
    }

    /// Calls `f` on every leaf assignment, in order. Iterative: sequences of any depth are
    /// fine.
    pub fn visit(&self, f: &mut impl FnMut(&Assignments)) {
        self.walk(&mut |a, _| {
            if !matches!(a, Assignments::BlockComment(..)) {
                f(a)
            }
        });
    }

    /// Calls `f` on every block comment (before its body) and every leaf, in order, with the
    /// block nesting depth. Iterative, without recursion.
    pub fn walk(&self, f: &mut impl FnMut(&Assignments, usize)) {
        let mut stack = vec![(self, 0usize)];
        while let Some((a, depth)) = stack.pop() {
            match a {
                Assignments::Seq(x, y) => {
                    stack.push((y, depth));
                    stack.push((x, depth));
                }
                Assignments::BlockComment(_, body) => {
                    f(a, depth);
                    stack.push((body, depth + 1));
                }
                Assignments::Noop => {}
                a => f(a, depth),
            }
        }
    }

    /// A readable rendering, one assignment per line.
    pub fn to_doc(&self) -> String {
        let mut out = String::new();
        self.walk(&mut |a, indent| a.write_doc(&mut out, indent));
        out
    }

    /// Writes one block comment's header or one leaf.
    fn write_doc(&self, out: &mut String, indent: usize) {
        let pad = "  ".repeat(indent);
        match self {
            Assignments::Noop | Assignments::Seq(..) => {}
            Assignments::BlockComment(c, _) => {
                let _ = writeln!(out, "{pad}# {}", c.escape_debug());
            }
            Assignments::AccumBinop {
                initialize_neutral,
                accum,
                op,
                lhs,
                rhs1,
                rhs2,
                projections,
            } => {
                let _ = writeln!(
                    out,
                    "{pad}{}{} {} {}({}, {}) ~logic:{:?}",
                    doc_buffer(&Buffer::Node(lhs.clone()), &projections.project_lhs),
                    if *initialize_neutral { " :" } else { " " },
                    accum_sym(*accum),
                    op.name(),
                    doc_buffer(rhs1, &projections.project_rhs[0]),
                    doc_buffer(rhs2, &projections.project_rhs[1]),
                    projections.debug_info
                );
            }
            Assignments::AccumTernop {
                initialize_neutral,
                accum,
                op,
                lhs,
                rhs1,
                rhs2,
                rhs3,
                projections,
            } => {
                let _ = writeln!(
                    out,
                    "{pad}{}{} {} {}({}, {}, {}) ~logic:{:?}",
                    doc_buffer(&Buffer::Node(lhs.clone()), &projections.project_lhs),
                    if *initialize_neutral { " :" } else { " " },
                    accum_sym(*accum),
                    op.name(),
                    doc_buffer(rhs1, &projections.project_rhs[0]),
                    doc_buffer(rhs2, &projections.project_rhs[1]),
                    doc_buffer(rhs3, &projections.project_rhs[2]),
                    projections.debug_info
                );
            }
            Assignments::AccumUnop {
                initialize_neutral,
                accum,
                op,
                lhs,
                rhs,
                projections,
            } => {
                let _ = writeln!(
                    out,
                    "{pad}{}{} {} {}({}) ~logic:{:?}",
                    doc_buffer(&Buffer::Node(lhs.clone()), &projections.project_lhs),
                    if *initialize_neutral { " :" } else { " " },
                    accum_sym(*accum),
                    op.name(),
                    doc_buffer(rhs, &projections.project_rhs[0]),
                    projections.debug_info
                );
            }
            Assignments::Gather { lhs, table, index } => {
                let _ = writeln!(
                    out,
                    "{pad}{} := gather({}, {})",
                    lhs.name().escape_debug(),
                    table.name().escape_debug(),
                    index.name().escape_debug()
                );
            }
            Assignments::ScatterAdd { lhs, src, index } => {
                let _ = writeln!(
                    out,
                    "{pad}{} += scatter({}, {})",
                    lhs.name().escape_debug(),
                    src.name().escape_debug(),
                    index.name().escape_debug()
                );
            }
            Assignments::Fetch { array, fetch_op } => {
                let what = match fetch_op {
                    FetchOp::Constant(c) => format!("{c}"),
                    FetchOp::ConstantInt(c) => format!("{c}"),
                    FetchOp::Slice { batch_idx, sliced } => {
                        format!(
                            "{}[{}, ...]",
                            sliced.name().escape_debug(),
                            batch_idx.name.escape_debug()
                        )
                    }
                    FetchOp::EmbedSymbol(s) => format!("embed({})", s.name.escape_debug()),
                    FetchOp::Imported(f) => format!("{}()", f.escape_debug()),
                    FetchOp::Random { seed } => format!("random({seed})"),
                };
                let _ = writeln!(out, "{pad}{} := {what}", array.name().escape_debug());
            }
        }
    }
}

fn accum_sym(accum: Binop) -> String {
    match accum {
        Binop::Arg2 => "=".into(),
        op => match op.info().infix {
            Some(s) => format!("{s}="),
            None => format!("{}=", op.name()),
        },
    }
}

fn doc_buffer(b: &Buffer, idcs: &[AxisIndex]) -> String {
    let idcs: Vec<String> = idcs.iter().map(|i| i.to_string()).collect();
    match b {
        Buffer::Node(t) => format!("{}[{}]", t.name().escape_debug(), idcs.join(", ")),
        Buffer::MergeBuffer(t) => {
            format!("merge({})[{}]", t.name().escape_debug(), idcs.join(", "))
        }
    }
}
