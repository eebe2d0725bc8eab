//! C generation: one translation unit per routine or batch of routines.
//!
//! Every routine becomes a readable function `static int NAME_routine(params...)` plus a fixed-signature
//! entry point `int NAME_routine_entry(void *const *buffers, const int64_t *statics,
//! const void *merge_buffer)` that the loader calls; it returns 0.
//!
//! Parameters of the readable function, in order: the merge buffer (`const T *merge_buffer`)
//! if the routine reads one; the static indices (`int`), in the order of the routine's
//! bindings; one pointer per node that lives in the context, in order of node id; one
//! pointer per local array larger than 16 KiB (scratch memory owned by the linked routine,
//! zeroed at the start of each call), in order of node id.
//!
//! Every user-provided string is sanitized before it reaches the C text: identifiers keep only
//! `[A-Za-z0-9_]` and always carry a suffix, so they never collide with keywords, libc/libm
//! names or each other; comments keep printable ASCII other than `/`, `\`, `?` and `#`.

mod collapse;
mod names;
mod vector;

pub use names::{sanitize_comment, sanitize_ident};
pub use vector::Dialect;

use crate::error::Result;
use crate::ir::{AxisIndex, Bindings, MemoryMode, Prec, StaticSymbol, Tnode};
use crate::loops::{Llc, Llv, VType, Vlv};
use crate::optimize::Optimized;
use crate::target::VectorTarget;
use names::Names;
use std::collections::HashSet;
use std::fmt::Write;

/// One parameter of a generated routine.
#[derive(Clone, Debug, PartialEq)]
pub enum Param {
    /// The device's merge buffer, expected to hold this node.
    MergeBuffer(Tnode),
    /// A static index.
    Static(StaticSymbol),
    /// A node's buffer in the context.
    Node(Tnode),
    /// A large local array: scratch memory owned by the linked routine (allocated once at
    /// link time, zeroed at the start of every call), not part of the context.
    Scratch(Tnode),
}

/// What the loader needs to call one generated routine.
#[derive(Clone, Debug)]
pub struct RoutineSignature {
    /// The routine's name as given by the user.
    pub name: String,
    /// The C name of the routine (its parts are named after it).
    pub c_name: String,
    /// The entry points of its parts, to be called in order.
    pub entries: Vec<String>,
    /// The parameters of the routine as a whole (the union of its parts' parameters), in
    /// order: the merge buffer, the static indices, the context buffers, the scratch buffers.
    pub params: Vec<Param>,
    /// Nodes passed as context buffers: the first entries of the entry point's `buffers`
    /// array.
    pub buffers: Vec<Tnode>,
    /// For each of `buffers`, whether the routine writes it (a run locks it exclusively;
    /// the others are only read and locked shared).
    pub writes: Vec<bool>,
    /// Large local arrays passed as routine-owned scratch buffers: the entries of `buffers`
    /// after the context buffers.
    pub scratch: Vec<Tnode>,
    /// The static indices, in the order of the entry point's `statics` array.
    pub statics: Vec<StaticSymbol>,
    /// The node read from the merge buffer, if any.
    pub merge_node: Option<Tnode>,
    /// For each static index, the largest exclusive bound its value must respect (the
    /// smallest extent among the axes it indexes, and its declared range).
    pub static_limits: Vec<Option<usize>>,
}

/// One C function of a routine: a run of the routine's top-level statements, with its own
/// entry point. Routines are split into parts of bounded size so that no C function grows
/// with the program: the C compiler's time stays linear in the number of statements, and the
/// parts of a batch can be spread over several files compiled in parallel.
#[derive(Clone, Debug)]
pub struct Part {
    /// Index of the routine (in the list given to [`generate`]) the part belongs to.
    pub routine: usize,
    /// The readable C function's name.
    pub c_name: String,
    /// The entry point's symbol: `int ENTRY(void *const *buffers, const int64_t *statics,
    /// const void *merge_buffer)`, returning 0.
    pub entry: String,
    /// The C text of the function and its entry point.
    pub text: String,
    /// A measure of its size (loop-IR nodes), used to balance files.
    pub weight: usize,
    /// The imported C functions it calls.
    pub imports: Vec<String>,
    /// Its parameters, in order.
    pub params: Vec<Param>,
    /// The vector types it uses.
    pub vtypes: Vec<VType>,
}

/// The C code of some routines: their parts, in order, and their signatures.
#[derive(Clone, Debug)]
pub struct Generated {
    /// Every part of every routine, routine by routine, each routine's parts in order.
    pub parts: Vec<Part>,
    /// One signature per routine.
    pub sigs: Vec<RoutineSignature>,
    /// How vectors are spelled.
    pub dialect: Dialect,
    /// Whether the routines write trace logs.
    pub traced: bool,
}

impl Generated {
    /// A translation unit holding the given parts (indices into [`Generated::parts`]).
    pub fn file(&self, parts: &[usize]) -> String {
        let mut out = String::new();
        let mut names: Vec<&str> = vec![];
        let mut imports: Vec<&str> = vec![];
        let mut vtypes: Vec<VType> = vec![];
        for &k in parts {
            let Some(p) = self.parts.get(k) else { continue };
            let name = self.sigs.get(p.routine).map_or("", |s| s.name.as_str());
            if !names.contains(&name) {
                names.push(name);
            }
            for f in &p.imports {
                if !imports.contains(&f.as_str()) {
                    imports.push(f);
                }
            }
            for t in &p.vtypes {
                if !vtypes.contains(t) {
                    vtypes.push(*t);
                }
            }
        }
        let names: Vec<String> = names.iter().map(|n| sanitize_comment(n)).collect();
        let _ = writeln!(
            out,
            "/* Generated by arrayjit. Routines: {} */",
            names.join(", ")
        );
        out.push_str("#include \"arrayjit.h\"\n");
        if self.traced {
            out.push_str("#include <stdio.h>\n");
        }
        if !vtypes.is_empty() {
            if let Some(inc) = self.dialect.include() {
                let _ = writeln!(out, "{inc}");
            }
            for t in vtypes {
                out.push_str(&self.dialect.prelude(t));
            }
        }
        for f in imports {
            let _ = writeln!(out, "extern double {f}(void);");
        }
        for &k in parts {
            if let Some(p) = self.parts.get(k) {
                out.push_str(&p.text);
            }
        }
        out
    }

    /// One translation unit holding everything.
    pub fn source(&self) -> String {
        self.file(&(0..self.parts.len()).collect::<Vec<_>>())
    }
}

/// Prints one C translation unit holding the given routines.
pub fn write_file(
    routines: &[(&Optimized, &Bindings)],
    target: &VectorTarget,
) -> Result<(String, Vec<RoutineSignature>)> {
    let g = generate(routines, target, None)?;
    Ok((g.source(), g.sigs))
}

/// Generates the C code of the given routines, split into parts, with vector operations
/// spelled for `target`. With `trace_dir`, every run of a routine appends the values its
/// assignments store, with their indices, to `<trace_dir>/<routine>.log`.
pub fn generate(
    routines: &[(&Optimized, &Bindings)],
    target: &VectorTarget,
    trace_dir: Option<&std::path::Path>,
) -> Result<Generated> {
    let dialect = Dialect::new(*target);
    let mut w = Writer {
        out: String::new(),
        names: Names::default(),
        dialect,
        trace_dir: trace_dir.map(|d| c_string_literal(&d.to_string_lossy())),
    };
    let mut parts = vec![];
    let mut sigs = vec![];
    for (i, (o, b)) in routines.iter().enumerate() {
        let (sig, ps) = w.write_routine(i, o, b);
        sigs.push(sig);
        parts.extend(ps);
    }
    Ok(Generated {
        parts,
        sigs,
        dialect,
        traced: trace_dir.is_some(),
    })
}

struct Writer {
    out: String,
    names: Names,
    dialect: Dialect,
    /// The trace directory as the inside of a C string literal, when tracing.
    trace_dir: Option<String>,
}

/// The inside of a C string literal spelling `s`: bytes other than `[A-Za-z0-9/._-]` become
/// octal escapes, so no text can end the literal or mean anything else.
fn c_string_literal(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"/._-".contains(&b) {
                (b as char).to_string()
            } else {
                format!("\\{b:03o}")
            }
        })
        .collect()
}

fn float_literal(c: f64, in_float: bool) -> String {
    if c.is_nan() {
        return "NAN".into();
    }
    if c.is_infinite() {
        return if c > 0.0 {
            "INFINITY".into()
        } else {
            "(-INFINITY)".into()
        };
    }
    if in_float {
        let f = c as f32;
        if f as f64 == c {
            let s = format!("{f:?}");
            return if s.starts_with('-') {
                format!("({s}f)")
            } else {
                format!("{s}f")
            };
        }
        return format!("((float){c:?})");
    }
    let s = format!("{c:?}");
    if s.starts_with('-') {
        format!("({s})")
    } else {
        s
    }
}

/// The C expression storing `e` (computed in the precision's compute type) into an element
/// of precision `prec`.
fn store(prec: Prec, e: String) -> String {
    match prec {
        Prec::Byte => format!("aj_to_byte({e})"),
        Prec::Half => format!("aj_f2h({e})"),
        Prec::Single | Prec::Double => e,
    }
}

impl Writer {
    fn offset(&mut self, tn: &Tnode, idcs: &[AxisIndex]) -> String {
        let dims = tn.dims();
        let mut stride = 1usize;
        let mut constant = 0usize;
        let mut terms: Vec<String> = vec![];
        for (k, ix) in idcs.iter().enumerate().rev() {
            match ix {
                AxisIndex::Fixed(i) => constant += i * stride,
                AxisIndex::Iterator(s) => {
                    let n = self.names.symbol(*s);
                    terms.push(if stride == 1 {
                        n
                    } else {
                        format!("{n} * {stride}")
                    });
                }
                AxisIndex::Linear(l) => {
                    constant += l.offset * stride;
                    for &(s, c) in l.terms() {
                        let n = self.names.symbol(s);
                        terms.push(if c * stride == 1 {
                            n
                        } else {
                            format!("{n} * {}", c * stride)
                        });
                    }
                }
            }
            stride *= dims[k];
        }
        terms.reverse();
        if constant != 0 || terms.is_empty() {
            terms.push(constant.to_string());
        }
        terms.join(" + ")
    }

    /// Converts `e`, of C type `from_c_type`, to the compute type (`float` or `double`).
    /// Halves are widened exactly by `aj_h2f`.
    fn convert(from_c_type: &str, in_float: bool, e: String) -> String {
        let ct = if in_float { "float" } else { "double" };
        if from_c_type == ct {
            e
        } else if from_c_type == Prec::Half.c_type() {
            if in_float {
                format!("aj_h2f({e})")
            } else {
                format!("(double)aj_h2f({e})")
            }
        } else {
            format!("({ct}){e}")
        }
    }

    /// An expression computing `v` in float (`in_float`) or double; local scopes are hoisted
    /// into `pre` (each scope once).
    fn expr(
        &mut self,
        v: &Llv,
        in_float: bool,
        pre: &mut String,
        indent: usize,
        done: &mut HashSet<u32>,
    ) -> String {
        match v {
            Llv::Constant(c) => float_literal(*c, in_float),
            Llv::Get(tn, idcs) => {
                let off = self.offset(tn, idcs);
                let n = self.names.node(tn);
                Self::convert(tn.prec().c_type(), in_float, format!("{n}[{off}]"))
            }
            Llv::GetMergeBuffer(tn, idcs) => {
                let off = self.offset(tn, idcs);
                Self::convert(tn.prec().c_type(), in_float, format!("merge_buffer[{off}]"))
            }
            Llv::GetCFunction(f) => Self::convert("double", in_float, format!("{f}()")),
            Llv::EmbedIndex(AxisIndex::Fixed(i)) => float_literal(*i as f64, in_float),
            Llv::EmbedIndex(AxisIndex::Iterator(s)) => {
                let n = self.names.symbol(*s);
                Self::convert("int64_t", in_float, n)
            }
            Llv::EmbedIndex(AxisIndex::Linear(l)) => {
                let mut terms: Vec<String> = l
                    .terms()
                    .iter()
                    .map(|&(s, c)| format!("{} * {c}", self.names.symbol(s)))
                    .collect();
                terms.push(l.offset.to_string());
                Self::convert("int64_t", in_float, format!("({})", terms.join(" + ")))
            }
            Llv::GetLocal(id) => {
                let n = self.names.scope(id);
                Self::convert(id.tn.prec().c_type(), in_float, n)
            }
            Llv::LocalScope { id, body, .. } => {
                let n = self.names.scope(id);
                if done.insert(id.id) {
                    let pad = "  ".repeat(indent);
                    let _ = writeln!(
                        pre,
                        "{pad}/* {} */",
                        sanitize_comment(&format!("inlined {}", id.tn.name()))
                    );
                    let _ = writeln!(pre, "{pad}{} {n} = 0;", id.tn.prec().c_type());
                    let mut body_text = String::new();
                    self.stmt(body, indent, &mut body_text);
                    pre.push_str(&body_text);
                }
                Self::convert(id.tn.prec().c_type(), in_float, n)
            }
            Llv::Binop(op, a, b) => {
                let a = self.expr(a, in_float, pre, indent, done);
                let b = self.expr(b, in_float, pre, indent, done);
                op.c_expr(in_float, &a, &b)
            }
            Llv::Unop(op, a) => {
                let a = self.expr(a, in_float, pre, indent, done);
                op.c_expr(in_float, &a)
            }
        }
    }

    fn stmt(&mut self, c: &Llc, indent: usize, out: &mut String) {
        let pad = "  ".repeat(indent);
        match c {
            Llc::Noop => {}
            Llc::Comment(t) => {
                let _ = writeln!(out, "{pad}/* {} */", sanitize_comment(t));
            }
            Llc::Seq(v) => v.iter().for_each(|c| self.stmt(c, indent, out)),
            Llc::For {
                index,
                from,
                to,
                body,
                ..
            } => {
                let n = self.names.symbol(*index);
                let _ = writeln!(
                    out,
                    "{pad}for (int64_t {n} = {from}; {n} <= {to}; ++{n}) {{"
                );
                self.stmt(body, indent + 1, out);
                let _ = writeln!(out, "{pad}}}");
            }
            Llc::ZeroOut(tn) => {
                let n = self.names.node(tn);
                let _ = writeln!(out, "{pad}memset({n}, 0, {});", tn.size_in_bytes());
            }
            Llc::Set { tn, idcs, value } => {
                let mut pre = String::new();
                let e = self.expr(
                    value,
                    tn.prec().computes_in_float(),
                    &mut pre,
                    indent,
                    &mut HashSet::new(),
                );
                let off = self.offset(tn, idcs);
                let n = self.names.node(tn);
                if pre.is_empty() {
                    let _ = writeln!(out, "{pad}{n}[{off}] = {};", store(tn.prec(), e));
                } else {
                    let _ = writeln!(out, "{pad}{{");
                    out.push_str(&indent_text(&pre, 1));
                    let _ = writeln!(out, "{pad}  {n}[{off}] = {};", store(tn.prec(), e));
                    let _ = writeln!(out, "{pad}}}");
                }
                if self.trace_dir.is_some() {
                    let line = self.trace_line(tn, idcs, &n, &off);
                    let _ = writeln!(out, "{pad}{line}");
                }
            }
            Llc::SetLocal(id, value) => {
                let mut pre = String::new();
                let e = self.expr(
                    value,
                    id.tn.prec().computes_in_float(),
                    &mut pre,
                    indent,
                    &mut HashSet::new(),
                );
                let n = self.names.scope(id);
                if pre.is_empty() {
                    let _ = writeln!(out, "{pad}{n} = {};", store(id.tn.prec(), e));
                } else {
                    let _ = writeln!(out, "{pad}{{");
                    out.push_str(&indent_text(&pre, 1));
                    let _ = writeln!(out, "{pad}  {n} = {};", store(id.tn.prec(), e));
                    let _ = writeln!(out, "{pad}}}");
                }
            }
            Llc::VSet(r, v) => {
                let mut pre = String::new();
                let e = self.vexpr(v, &mut pre, indent);
                let n = self.names.vreg(r.id);
                self.emit_with_pre(out, &pad, &pre, &format!("{n} = {e};"));
            }
            Llc::VStore { tn, idcs, value } => {
                let mut pre = String::new();
                let e = self.vexpr(value, &mut pre, indent);
                let off = self.offset(tn, idcs);
                let n = self.names.node(tn);
                let store = self.dialect.store(value.ty(), &format!("&{n}[{off}]"), &e);
                self.emit_with_pre(out, &pad, &pre, &format!("{store};"));
            }
        }
    }

    /// The trace-log statement after a store into `tn` at `idcs` (element `name[off]`): the
    /// node, the indices and the stored value.
    fn trace_line(&mut self, tn: &Tnode, idcs: &[AxisIndex], name: &str, off: &str) -> String {
        let mut fmt = format!("{}[", sanitize_ident(&tn.name()));
        let mut args = vec![];
        for (k, ix) in idcs.iter().enumerate() {
            if k > 0 {
                fmt.push_str(", ");
            }
            fmt.push_str("%lld");
            args.push(format!("(long long)({})", self.axis_expr(ix)));
        }
        fmt.push_str("] = %.9g\\n");
        let value = Self::convert(tn.prec().c_type(), false, format!("{name}[{off}]"));
        args.push(value);
        format!(
            "if (aj_log) fprintf(aj_log, \"{fmt}\", {});",
            args.join(", ")
        )
    }

    /// The value of one axis index as a C integer expression.
    fn axis_expr(&mut self, ix: &AxisIndex) -> String {
        match ix {
            AxisIndex::Fixed(k) => k.to_string(),
            AxisIndex::Iterator(s) => self.names.symbol(*s),
            AxisIndex::Linear(l) => {
                let mut terms: Vec<String> = l
                    .terms()
                    .iter()
                    .map(|&(s, c)| format!("{} * {c}", self.names.symbol(s)))
                    .collect();
                terms.push(l.offset.to_string());
                terms.join(" + ")
            }
        }
    }

    /// Writes `line`, inside a block after the hoisted local scopes `pre` if there are any.
    fn emit_with_pre(&mut self, out: &mut String, pad: &str, pre: &str, line: &str) {
        if pre.is_empty() {
            let _ = writeln!(out, "{pad}{line}");
        } else {
            let _ = writeln!(out, "{pad}{{");
            out.push_str(&indent_text(pre, 1));
            let _ = writeln!(out, "{pad}  {line}");
            let _ = writeln!(out, "{pad}}}");
        }
    }

    /// A C expression computing a vector.
    fn vexpr(&mut self, v: &Vlv, pre: &mut String, indent: usize) -> String {
        let t = v.ty();
        match v {
            Vlv::Reg(r) => self.names.vreg(r.id),
            Vlv::Zero(t) => self.dialect.zero(*t),
            Vlv::Splat(t, x) => {
                let in_float = t.prec.computes_in_float();
                let x = self.expr(x, in_float, pre, indent, &mut HashSet::new());
                self.dialect.splat(*t, &x)
            }
            Vlv::Load(t, tn, idcs) => {
                let off = self.offset(tn, idcs);
                let n = self.names.node(tn);
                self.dialect.load(*t, &format!("&{n}[{off}]"))
            }
            Vlv::Fma(a, b, c) => {
                let (a, b, c) = (
                    self.vexpr(a, pre, indent),
                    self.vexpr(b, pre, indent),
                    self.vexpr(c, pre, indent),
                );
                self.dialect.fma(t, &a, &b, &c)
            }
            Vlv::Binop(op, a, b) => {
                let (a, b) = (self.vexpr(a, pre, indent), self.vexpr(b, pre, indent));
                self.dialect
                    .binop(t, *op, &a, &b)
                    .unwrap_or_else(|| format!("/* unsupported vector {op} */ {a}"))
            }
            Vlv::Shuffle(a, b, idx) => {
                let (a, b) = (self.vexpr(a, pre, indent), self.vexpr(b, pre, indent));
                self.dialect.shuffle(t, &a, &b, idx)
            }
        }
    }

    /// Writes a routine's parts; returns its signature and the parts.
    fn write_routine(
        &mut self,
        routine: usize,
        o: &Optimized,
        bindings: &Bindings,
    ) -> (RoutineSignature, Vec<Part>) {
        let c_name = self.names.routine(&o.name);
        let statics: Vec<StaticSymbol> = bindings.0.clone();
        // The limits of the code as written (every access the routine's meaning has, as the
        // interpreter checks them; the optimizer may drop reads, like `arg1`'s unused
        // operand) and of the optimized code (whose linear indices are checked too).
        let static_limits = statics
            .iter()
            .map(|s| {
                let written = static_limit(&o.unoptimized, s);
                let optimized = static_limit(&o.code, s);
                match (written, optimized) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            })
            .collect();
        let written = written_nodes(&o.code);
        let mut buffers = vec![];
        let mut local_nodes = vec![];
        for (tn, mode) in &o.nodes {
            match mode {
                MemoryMode::Local => local_nodes.push(tn.clone()),
                MemoryMode::Virtual => {}
                _ => buffers.push(tn.clone()),
            }
        }
        // Only the routine's own statement list is split: a nested sequence (a GEMM kernel,
        // whose vector variables live across its statements) stays whole in one part.
        let top = match o.code.clone() {
            Llc::Seq(v) => v,
            c => vec![c],
        };
        let groups = split_parts(top);
        let uses: Vec<Uses> = groups.iter().map(|g| Uses::of(g)).collect();
        // Local arrays used by one part live in that part's frame, whose size is budgeted:
        // the smallest go on the stack while they fit in MAX_FRAME_BYTES (each at most
        // MAX_STACK_BYTES). The rest, and local arrays shared by several parts, are scratch
        // buffers owned by the linked routine (zeroed by the first part that uses them).
        let mut scratch = vec![];
        let mut part_locals: Vec<Vec<Tnode>> = vec![vec![]; groups.len()];
        let mut frames = vec![0usize; groups.len()];
        local_nodes.sort_by_key(|tn| (tn.size_in_bytes(), tn.id()));
        for tn in local_nodes {
            let users: Vec<usize> = (0..groups.len())
                .filter(|&k| uses[k].nodes.contains(&tn))
                .collect();
            let size = tn.size_in_bytes();
            match users.as_slice() {
                [k] if size <= MAX_STACK_BYTES && frames[*k] + size <= MAX_FRAME_BYTES => {
                    frames[*k] += size;
                    part_locals[*k].push(tn);
                }
                [] => {}
                _ => scratch.push(tn),
            }
        }
        scratch.sort();
        let mut params = vec![];
        if let Some(m) = &o.merge_node {
            params.push(Param::MergeBuffer(m.clone()));
        }
        params.extend(statics.iter().cloned().map(Param::Static));
        params.extend(buffers.iter().cloned().map(Param::Node));
        params.extend(scratch.iter().cloned().map(Param::Scratch));
        let n = groups.len();
        let mut zeroed: Vec<Tnode> = vec![];
        let mut parts = vec![];
        for (k, (group, used)) in groups.iter().zip(&uses).enumerate() {
            let part_name = if n == 1 {
                c_name.clone()
            } else {
                format!("{c_name}_p{}", k + 1)
            };
            // This part's parameters: the routine's, restricted to what it uses.
            let mine: Vec<(usize, &Param)> = params
                .iter()
                .enumerate()
                .filter(|(_, p)| match p {
                    Param::MergeBuffer(_) => used.merge,
                    Param::Static(s) => used.symbols.contains(&s.symbol),
                    Param::Node(tn) | Param::Scratch(tn) => used.nodes.contains(tn),
                })
                .collect();
            let to_zero: Vec<Tnode> = scratch
                .iter()
                .filter(|tn| {
                    used.nodes.contains(tn) && !zeroed.contains(tn) && !o.written_first.contains(tn)
                })
                .cloned()
                .collect();
            zeroed.extend(to_zero.iter().cloned());
            let before = self.out.len();
            let title = if n == 1 {
                format!("Routine: {}", o.name)
            } else {
                format!("Routine: {}, part {} of {n}", o.name, k + 1)
            };
            self.write_part(
                &part_name,
                &title,
                &mine,
                &params,
                (&part_locals[k], &o.written_first),
                &to_zero,
                group,
            );
            let text = self.out.split_off(before);
            let mut imports = vec![];
            for c in group {
                crate::loops::visit_values(c, &mut |v| {
                    if let Llv::GetCFunction(f) = v {
                        if !imports.contains(f) {
                            imports.push(f.clone());
                        }
                    }
                });
            }
            parts.push(Part {
                routine,
                entry: format!("{part_name}_entry"),
                c_name: part_name,
                text,
                weight: group.iter().map(weight).sum::<usize>().max(1),
                imports,
                params: mine.iter().map(|(_, p)| (*p).clone()).collect(),
                vtypes: vector_types(group),
            });
        }
        let sig = RoutineSignature {
            name: o.name.clone(),
            c_name,
            entries: parts.iter().map(|p| p.entry.clone()).collect(),
            params,
            writes: buffers.iter().map(|tn| written.contains(tn)).collect(),
            buffers,
            scratch,
            statics,
            merge_node: o.merge_node.clone(),
            static_limits,
        };
        (sig, parts)
    }

    /// Writes one part: the readable function taking the parameters it uses, and its entry
    /// point, which picks them out of the routine's tables (`all` gives the table positions).
    #[allow(clippy::too_many_arguments)]
    fn write_part(
        &mut self,
        c_name: &str,
        title: &str,
        mine: &[(usize, &Param)],
        all: &[Param],
        (locals, written_first): (&[Tnode], &[Tnode]),
        to_zero: &[Tnode],
        body: &[Llc],
    ) {
        let param_text: Vec<String> = mine
            .iter()
            .map(|(_, p)| match p {
                Param::MergeBuffer(tn) => {
                    format!("const {} *restrict merge_buffer", tn.prec().c_type())
                }
                Param::Static(s) => format!("int64_t {}", self.names.static_symbol(s)),
                Param::Node(tn) | Param::Scratch(tn) => {
                    format!("{} *restrict {}", tn.prec().c_type(), self.names.node(tn))
                }
            })
            .collect();
        let _ = writeln!(self.out, "\n/* {} */", sanitize_comment(title));
        let _ = writeln!(
            self.out,
            "static int {c_name}({}) {{",
            if param_text.is_empty() {
                "void".to_string()
            } else {
                param_text.join(", ")
            }
        );
        for tn in locals {
            let n = self.names.node(tn);
            // Arrays written entirely before they are read need no zeroing.
            let init = if written_first.contains(tn) {
                ""
            } else {
                " = {0}"
            };
            // The alignment is explicit: GCC 12 (`-O3`, AVX-512, with
            // `--param=max-completely-peel-times=1`) may raise a local array's alignment for
            // an aligned vector store without realigning the frame, which then faults
            // (`regression_gcc12_unaligned_stack_array`). A declared alignment makes every
            // compiler realign the frame.
            let _ = writeln!(
                self.out,
                "  {} {n}[{}] __attribute__((aligned({LOCAL_ARRAY_ALIGN}))){init};",
                tn.prec().c_type(),
                tn.numel()
            );
        }
        for tn in to_zero {
            let n = self.names.node(tn);
            let _ = writeln!(self.out, "  memset({n}, 0, {});", tn.size_in_bytes());
        }
        // Vector variables, declared once per function (the compiler keeps them in registers).
        let mut vregs = vec![];
        for c in body {
            crate::loops::visit_llc(c, &mut |c| {
                if let Llc::VSet(r, _) = c {
                    if !vregs.contains(r) {
                        vregs.push(*r);
                    }
                }
            });
        }
        for r in vregs {
            let n = self.names.vreg(r.id);
            let _ = writeln!(self.out, "  {} {n};", self.dialect.ty(r.ty));
        }
        if let Some(dir) = &self.trace_dir {
            let routine = title.strip_prefix("Routine: ").unwrap_or(title);
            let routine = sanitize_comment(routine.split(", part ").next().unwrap_or(routine));
            let _ = writeln!(
                self.out,
                "  FILE *aj_log = fopen(\"{dir}/{}.log\", \"a\");",
                c_name.split("_routine").next().unwrap_or(c_name)
            );
            if !title.contains(", part ") || title.contains(", part 1 of") {
                let _ = writeln!(
                    self.out,
                    "  if (aj_log) fprintf(aj_log, \"# run of routine {routine}\\n\");"
                );
            }
        }
        let mut text = String::new();
        for c in body {
            if self.trace_dir.is_some() {
                // Trace lines print every index as the loop IR has it.
                self.stmt(c, 1, &mut text);
            } else {
                self.stmt(&collapse::nests(c.clone()), 1, &mut text);
            }
        }
        self.out.push_str(&text);
        if self.trace_dir.is_some() {
            self.out.push_str("  if (aj_log) fclose(aj_log);\n");
        }
        self.out.push_str("  return 0;\n}\n");
        // The entry point with a fixed signature: statics and buffers are indexed by their
        // position among the routine's statics and buffers.
        let static_pos = |i: usize| {
            all[..i]
                .iter()
                .filter(|p| matches!(p, Param::Static(_)))
                .count()
        };
        let buffer_pos = |i: usize| {
            all[..i]
                .iter()
                .filter(|p| matches!(p, Param::Node(_) | Param::Scratch(_)))
                .count()
        };
        let args: Vec<String> = mine
            .iter()
            .map(|&(i, p)| match p {
                Param::MergeBuffer(tn) => format!("(const {} *)merge_buffer", tn.prec().c_type()),
                Param::Static(_) => format!("statics[{}]", static_pos(i)),
                Param::Node(tn) | Param::Scratch(tn) => {
                    format!("({} *)buffers[{}]", tn.prec().c_type(), buffer_pos(i))
                }
            })
            .collect();
        let _ = writeln!(
            self.out,
            "int {c_name}_entry(void *const *buffers, const int64_t *statics, const void *merge_buffer) {{\n  (void)buffers; (void)statics; (void)merge_buffer;\n  return {c_name}({});\n}}",
            args.join(", ")
        );
    }
}

/// What a part uses: nodes (read or written), symbols, the merge buffer.
#[derive(Default)]
struct Uses {
    nodes: HashSet<Tnode>,
    symbols: HashSet<crate::ir::Symbol>,
    merge: bool,
}

impl Uses {
    fn of(stmts: &[Llc]) -> Uses {
        let mut u = Uses::default();
        for c in stmts {
            crate::loops::visit_llc(c, &mut |c| match c {
                Llc::Set { tn, .. } | Llc::VStore { tn, .. } | Llc::ZeroOut(tn) => {
                    u.nodes.insert(tn.clone());
                }
                _ => {}
            });
            crate::loops::visit_reads(c, &mut |tn, _, _, merge| {
                if merge {
                    u.merge = true;
                } else {
                    u.nodes.insert(tn.clone());
                }
            });
            crate::loops::visit_indices(c, &mut |ix| u.symbols.extend(ix.symbols()));
        }
        u
    }
}

/// The vector types used by some statements.
fn vector_types(stmts: &[Llc]) -> Vec<VType> {
    let mut out: Vec<VType> = vec![];
    for c in stmts {
        crate::loops::visit_vectors(c, &mut |v| {
            let t = v.ty();
            if !out.contains(&t) {
                out.push(t);
            }
        });
    }
    out
}

/// The nodes a routine's code writes (stores, vector stores and zero fills).
fn written_nodes(code: &Llc) -> HashSet<Tnode> {
    let mut out = HashSet::new();
    crate::loops::visit_llc(code, &mut |c| match c {
        Llc::Set { tn, .. } | Llc::VStore { tn, .. } | Llc::ZeroOut(tn) => {
            out.insert(tn.clone());
        }
        _ => {}
    });
    out
}

/// The size of a statement in loop-IR nodes (statements and values).
fn weight(c: &Llc) -> usize {
    let mut n = 0usize;
    crate::loops::visit_llc(c, &mut |_| n += 1);
    crate::loops::visit_values(c, &mut |_| n += 1);
    n
}

/// Groups a routine's top-level statements into parts of at most [`PART_WEIGHT`] (a single
/// larger statement is a part of its own). Comments stay with the statement after them.
/// Always at least one (possibly empty) part.
fn split_parts(stmts: Vec<Llc>) -> Vec<Vec<Llc>> {
    let mut parts: Vec<Vec<Llc>> = vec![vec![]];
    let mut weight_now = 0usize;
    let mut pending: Vec<Llc> = vec![];
    for c in stmts {
        if matches!(c, Llc::Comment(_)) {
            pending.push(c);
            continue;
        }
        let w = weight(&c);
        let current_has_code = parts
            .last()
            .is_some_and(|p| p.iter().any(|c| !matches!(c, Llc::Comment(_))));
        if current_has_code && weight_now + w > PART_WEIGHT {
            parts.push(vec![]);
            weight_now = 0;
        }
        weight_now += w;
        if let Some(p) = parts.last_mut() {
            p.append(&mut pending);
            p.push(c);
        }
    }
    if let Some(p) = parts.last_mut() {
        p.append(&mut pending);
    }
    parts
}

/// The largest weight of a part (unless one statement alone is larger).
pub const PART_WEIGHT: usize = 256;

/// Local arrays up to this size may live on the C stack; larger ones are scratch buffers.
const MAX_STACK_BYTES: usize = 16384;
/// At most this many bytes of local arrays live on the stack per routine; beyond that they are
/// scratch buffers, so a routine's frame stays far below any thread's stack (device workers
/// get 8 MiB stacks, see the backend).
pub const MAX_FRAME_BYTES: usize = 65536;

fn indent_text(s: &str, levels: usize) -> String {
    let pad = "  ".repeat(levels);
    s.lines().map(|l| format!("{pad}{l}\n")).collect()
}

/// The exclusive bound on a static index's value: its range, and the extent of every axis it
/// indexes in the code.
/// The alignment, in bytes, of every local array in generated code: the widest vector
/// register of any target (AVX-512).
const LOCAL_ARRAY_ALIGN: usize = 64;

/// The exclusive upper bound on the value of static index `s` that keeps every access of
/// `code` that `s` takes part in inside its axis: the smallest over those axes (and the
/// declared range). An axis index `offset + c·s + (other terms ≥ 0)` stays below the extent
/// `d` only if `offset + c·s ≤ d - 1`, so `s < (d - 1 - offset) / c + 1` (and no value fits
/// when `offset ≥ d`).
fn static_limit(code: &Llc, s: &StaticSymbol) -> Option<usize> {
    let mut limit = s.range;
    let mut tighten = |tn: &Tnode, idcs: &[AxisIndex]| {
        for (ix, &d) in idcs.iter().zip(tn.dims()) {
            let c = ix.coef(s.symbol);
            if c == 0 {
                continue;
            }
            let offset = match ix {
                AxisIndex::Linear(l) => l.offset,
                _ => 0,
            };
            let bound = if offset >= d {
                0
            } else {
                (d - 1 - offset) / c + 1
            };
            limit = Some(limit.map_or(bound, |l| l.min(bound)));
        }
    };
    crate::loops::visit_llc(code, &mut |c| {
        if let Llc::Set { tn, idcs, .. } | Llc::VStore { tn, idcs, .. } = c {
            tighten(tn, idcs)
        }
    });
    crate::loops::visit_reads(code, &mut |tn, idcs, _, _| tighten(tn, idcs));
    limit
}
