//! Generated programs and their rendering in the program-file format (PROGRAM_FORMAT.md).

use super::model::{apply, Check, Est};
use arrayjit::ir::{Binop, Prec, Ternop, Unop};
use std::fmt::Write as _;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// Hosted, with values.
    Input,
    /// Hosted, zeros at first.
    Output,
    /// Not hosted: the optimizer decides (often inlined).
    Temp,
}

#[derive(Clone, Debug)]
pub struct TSpec {
    pub name: String,
    pub dims: Vec<usize>,
    pub prec: Prec,
    pub kind: Kind,
    /// Initial values (inputs only; already rounded to the precision).
    pub init: Vec<f64>,
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Op {
    Un(Unop),
    Bin(Binop),
    Tern(Ternop),
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Un(u) => u.name(),
            Op::Bin(b) => b.name(),
            Op::Tern(t) => t.name(),
        }
    }
    /// Whether the operation is defined on integer statements only (SPEC 9.2).
    pub fn integer_only(self) -> bool {
        matches!(self, Op::Bin(b) if b.is_integer_only())
    }
}

/// What an assignment's projections do to its result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Product-space points per written result cell.
    pub fan_in: usize,
    /// Whether every result cell is written.
    pub full: bool,
    /// Whether every product iterator indexes the result.
    pub bijective: bool,
    /// Whether the spec has affine entries (SPEC 9.3): points may be skipped, so a result
    /// cell gets anywhere from 0 to `fan_in` contributions.
    pub affine: bool,
}

#[derive(Clone, Debug)]
pub enum Stmt {
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
    /// `{"fetch": lhs, "random": {"seed": seed}}`
    Random {
        lhs: usize,
        seed: u64,
    },
    /// `{"gather": lhs, "from": table, "index": index}` (index: a byte input, some values out
    /// of range)
    Gather {
        lhs: usize,
        table: usize,
        index: usize,
    },
    /// `{"scatter_add": lhs, "from": src, "index": index}`
    Scatter {
        lhs: usize,
        src: usize,
        index: usize,
    },
}

impl Stmt {
    pub fn lhs(&self) -> usize {
        match self {
            Stmt::Accum { lhs, .. }
            | Stmt::Const { lhs, .. }
            | Stmt::Slice { lhs, .. }
            | Stmt::Embed { lhs, .. }
            | Stmt::Random { lhs, .. }
            | Stmt::Gather { lhs, .. }
            | Stmt::Scatter { lhs, .. } => *lhs,
        }
    }
    pub fn reads(&self) -> Vec<usize> {
        match self {
            Stmt::Accum { args, .. } => args.clone(),
            Stmt::Slice { src, .. } => vec![*src],
            Stmt::Gather { table, index, .. } => vec![*table, *index],
            Stmt::Scatter { lhs, src, index } => vec![*lhs, *src, *index],
            _ => vec![],
        }
    }
}

#[derive(Clone, Debug)]
pub struct Program {
    pub seed: u64,
    pub tensors: Vec<TSpec>,
    /// Static indices: name and range.
    pub statics: Vec<(String, usize)>,
    pub stmts: Vec<Stmt>,
    /// Per run, the value of every static index.
    pub runs: Vec<Vec<i64>>,
    /// Per run, the estimate of every tensor after it.
    pub ests: Vec<Vec<Est>>,
    /// The large statements (contractions, long reductions), for the coverage statistics.
    pub big: Vec<Big>,
}

/// A large statement of a program: a contraction with extents up to about 70, or a long
/// reduction ([`super::big`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Big {
    /// Its result.
    pub lhs: usize,
    /// `"contraction"`, `"long contraction"`, `"wide contraction"`, `"long reduction"` or
    /// `"window"` (a depthwise convolution or pooling, layout `"depthwise"` or `"pooling"`).
    pub kind: &'static str,
    /// The layout (its name in [`super::big::LAYOUTS`] or [`super::big::REDUCTIONS`]).
    pub layout: &'static str,
    /// For a contraction: the extents of the result's rows and (contiguous) columns and of
    /// the reduced axis, as a GEMM kernel would see them (0 for a reduction).
    pub mnk: (usize, usize, usize),
}

impl Program {
    pub fn hosted(&self) -> Vec<usize> {
        (0..self.tensors.len())
            .filter(|&i| self.tensors[i].kind != Kind::Temp)
            .collect()
    }

    pub fn initial_ests(&self) -> Vec<Est> {
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
    pub fn replay(&self, runs: usize) -> Check<Vec<Vec<Est>>> {
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

pub fn json_num(v: f64) -> String {
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

pub fn accum_name(a: Binop) -> &'static str {
    if a == Binop::Arg2 {
        "set"
    } else {
        a.name()
    }
}

pub fn to_json(p: &Program) -> String {
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
            // Integers as JSON integers, with every digit (2^63 - 1024 stays exact).
            let v: Vec<String> = t
                .init
                .iter()
                .map(|&v| {
                    if t.prec.is_integer() && v.is_finite() {
                        format!("{}", v as i128)
                    } else {
                        json_num(v)
                    }
                })
                .collect();
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
            Stmt::Random { lhs, seed } => format!(
                "    {{\"fetch\": \"{}\", \"random\": {{\"seed\": {seed}}}}}",
                n(*lhs)
            ),
            Stmt::Gather { lhs, table, index } => format!(
                "    {{\"gather\": \"{}\", \"from\": \"{}\", \"index\": \"{}\"}}",
                n(*lhs),
                n(*table),
                n(*index)
            ),
            Stmt::Scatter { lhs, src, index } => format!(
                "    {{\"scatter_add\": \"{}\", \"from\": \"{}\", \"index\": \"{}\"}}",
                n(*lhs),
                n(*src),
                n(*index)
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
