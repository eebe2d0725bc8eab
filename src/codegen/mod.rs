//! C generation: one translation unit per routine or batch of routines.
//!
//! Every routine becomes a readable function `static int NAME_routine(params...)` plus a fixed-signature
//! entry point `int NAME_routine_entry(void *const *buffers, const int64_t *statics,
//! const void *merge_buffer, const aj_team_t *team)` that the loader calls; it returns 0.
//! `team` is the thread team that runs the routine's parallel regions (see `regions.rs`).
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
//!
//! **Bounds-checked mode** ([`CodegenOptions::checked`]): the file starts with
//! `#define AJ_CHECKED 1` (the runtime header then defines `aj_check_t`, `AJ_OOB` and
//! `aj_out_of_bounds`), every readable function takes one more parameter, `aj_check_t
//! *restrict aj_chk`, and the entry point finds it in `buffers[B]`, `B` being the number of
//! context and scratch buffers (the caller appends a pointer to a zeroed record to the table).
//! Before each statement, every array access it makes (reads, the write, vector loads and
//! stores, the GEMM kernels' packed buffers included) is checked:
//! `if (AJ_OOB(i, 3) || AJ_OOB(j + 1, 4)) return aj_out_of_bounds(aj_chk, T, 2,
//! (const int64_t[]){i, j + 1}, (const int64_t[]){3, 4}, 1);`: each axis index against its
//! extent (constant indices inside their axis need no test), and for a vector access of `W`
//! lanes also its last lane (`offset + W - 1` against the number of elements). On a violation
//! the function fills the record (the tensor as the index `T` into
//! [`RoutineSignature::check_tensors`], the indices, the extents) and returns
//! `AJ_STATUS_OUT_OF_BOUNDS` at once, so nothing more is read or written; the caller turns
//! the record into `Error::IndexOutOfBounds`. Loops are not collapsed in checked mode.
//!
//! **Trace logs** ([`CodegenOptions::trace_dir`]): `#define AJ_TRACE 1`; each part opens the
//! routine's log (`aj_trace_open`: `open(2)` with `O_APPEND | O_CREAT | O_NOFOLLOW |
//! O_CLOEXEC`, mode 0600) at [`trace_file_name`], formats lines into a buffer and writes whole
//! lines with single `write(2)` calls, so concurrent runs never interleave within a line.
//! Format strings are constants; names are `%s` arguments spelled as octal-escaped string
//! literals.

mod collapse;
mod names;
mod regions;
mod vector;

pub use names::{sanitize_comment, sanitize_ident};
pub use vector::Dialect;

use crate::error::Result;
use crate::ir::{
    AxisIndex, Bindings, Binop, Compute, IntCtx, MemoryMode, Prec, StaticSymbol, Tnode,
};
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
    /// Whether the code checks every array access ([`CodegenOptions::checked`]): then the
    /// entry point's `buffers` table has one more entry, after the scratch buffers, pointing
    /// to an `aj_check_t` record the code fills on an out-of-bounds access.
    pub checked: bool,
    /// The tensors the checks name, by the index the C code records (`aj_check_t.tensor`):
    /// names never travel through C.
    pub check_tensors: Vec<Tnode>,
}

/// How code is generated beyond the target: trace logs and bounds checks.
/// [`CodegenOptions::default`] and the setters below (one per field, by the field's name).
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct CodegenOptions<'a> {
    /// With a directory, every run of a routine appends the values its assignments store,
    /// with their indices, to `<trace_dir>/<`[`trace_file_name`]`(routine)>`.
    pub trace_dir: Option<&'a std::path::Path>,
    /// Bounds-checked mode: every read and write of an array checks each axis index against
    /// the axis' extent first (a vector access: its first element on every axis and its last
    /// lane); on a violation the routine records it and returns
    /// `AJ_STATUS_OUT_OF_BOUNDS` without any further access. Loops are not collapsed.
    pub checked: bool,
}

impl<'a> CodegenOptions<'a> {
    /// Sets [`trace_dir`](CodegenOptions::trace_dir).
    pub fn trace_dir(mut self, trace_dir: Option<&'a std::path::Path>) -> CodegenOptions<'a> {
        self.trace_dir = trace_dir;
        self
    }

    /// Sets [`checked`](CodegenOptions::checked).
    pub fn checked(mut self, checked: bool) -> CodegenOptions<'a> {
        self.checked = checked;
        self
    }
}

/// The name of a routine's trace log in the trace directory: the routine's name as an
/// identifier (see [`sanitize_ident`], at most 32 characters), a dash, and the first 16
/// hexadecimal digits of the BLAKE3 hash of the exact name, then `.log`: routines `a-b` and
/// `a_b` log to different files, and a name never reaches the file system unsanitized.
pub fn trace_file_name(routine: &str) -> String {
    let hash = blake3::hash(routine.as_bytes()).to_hex();
    format!("{}-{}.log", sanitize_ident(routine), &hash.as_str()[..16])
}

/// A name as a trace log shows it: control characters (line breaks among them) become `?`,
/// so that every log entry stays one line.
fn log_text(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
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
    /// The vector types whose runtime function family (`AJ_VMATH_F32(N)`, `AJ_VMATH_F64(N,
    /// 2N)` of `runtime_c/arrayjit.h`) it calls.
    pub vmath: Vec<VType>,
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
    /// Whether the routines check their array accesses.
    pub checked: bool,
}

impl Generated {
    /// A translation unit holding the given parts (indices into [`Generated::parts`]).
    pub fn file(&self, parts: &[usize]) -> String {
        let mut out = String::new();
        let mut names: Vec<&str> = vec![];
        let mut imports: Vec<&str> = vec![];
        let mut vtypes: Vec<VType> = vec![];
        let mut vmath: Vec<VType> = vec![];
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
            for t in &p.vmath {
                if !vmath.contains(t) {
                    vmath.push(*t);
                }
            }
        }
        let names: Vec<String> = names.iter().map(|n| sanitize_comment(n)).collect();
        let _ = writeln!(
            out,
            "/* Generated by arrayjit. Routines: {} */",
            names.join(", ")
        );
        if self.checked {
            out.push_str("#define AJ_CHECKED 1\n");
        }
        if self.traced {
            out.push_str("#define AJ_TRACE 1\n");
        }
        if !vmath.is_empty() {
            out.push_str("#define AJ_VMATH 1\n");
        }
        out.push_str("#include \"arrayjit.h\"\n");
        if !vtypes.is_empty() {
            if let Some(inc) = self.dialect.include() {
                let _ = writeln!(out, "{inc}");
            }
            for t in vtypes {
                out.push_str(&self.dialect.prelude(t));
            }
            // The runtime's vector function families these parts call, instantiated here
            // only (see the header's vector math).
            for t in vmath {
                match (t.prec, t.lanes) {
                    (Prec::Single, 4 | 8 | 16) => {
                        let _ = writeln!(out, "AJ_VMATH_F32({})", t.lanes);
                    }
                    (Prec::Double, 2 | 4 | 8) => {
                        let _ = writeln!(out, "AJ_VMATH_F64({}, {})", t.lanes, 2 * t.lanes);
                    }
                    _ => {}
                }
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
    let g = generate(routines, target, CodegenOptions::default())?;
    Ok((g.source(), g.sigs))
}

/// Generates the C code of the given routines, split into parts, with vector operations
/// spelled for `target`, traced and checked as `options` say.
pub fn generate(
    routines: &[(&Optimized, &Bindings)],
    target: &VectorTarget,
    options: CodegenOptions<'_>,
) -> Result<Generated> {
    let dialect = Dialect::new(*target);
    let mut w = Writer {
        out: String::new(),
        names: Names::default(),
        dialect,
        trace_dir: options
            .trace_dir
            .map(|d| d.as_os_str().as_encoded_bytes().to_vec()),
        checked: options.checked,
        checks: vec![],
        check_table: vec![],
        part_name: String::new(),
        regions: vec![],
        region_count: 0,
        merge_ctype: None,
        never_nan: HashSet::new(),
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
        traced: options.trace_dir.is_some(),
        checked: options.checked,
    })
}

struct Writer {
    out: String,
    names: Names,
    dialect: Dialect,
    /// The trace directory's bytes, when tracing.
    trace_dir: Option<Vec<u8>>,
    /// Whether every access is checked.
    checked: bool,
    /// The checks of the accesses of the statement being written (see `Writer::stmt`).
    checks: Vec<String>,
    /// The routine's tensors named by its checks, by index.
    check_table: Vec<Tnode>,
    /// The C name of the part being written (its parallel regions are named after it).
    part_name: String,
    /// The functions of the parallel regions of the part being written (see `regions.rs`).
    regions: Vec<String>,
    /// How many parallel regions the part has so far.
    region_count: usize,
    /// The C type of the merge buffer's elements, when the part reads it.
    merge_ctype: Option<&'static str>,
    /// The routine's vector variables that never hold a NaN lane (see [`never_nan`]).
    never_nan: HashSet<u32>,
}

/// The inside of a C string literal spelling the bytes `s`: bytes other than
/// `[A-Za-z0-9/._-]` become (three-digit) octal escapes, so no text can end the literal,
/// form a trigraph or a format directive, or mean anything else.
fn c_string_literal(s: &[u8]) -> String {
    s.iter()
        .map(|&b| {
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

/// The C expression storing `e` (computed in compute type `compute`) into an element of
/// precision `prec`.
fn store(prec: Prec, compute: Compute, e: String) -> String {
    match prec {
        p if p.is_integer() => {
            if compute.is_integer() {
                format!("({})({e})", p.c_type())
            } else {
                format!("({})aj_d2u64({e})", p.c_type())
            }
        }
        Prec::Half => format!("aj_f2h({e})"),
        Prec::Bfloat16 => format!("aj_f2bf({e})"),
        Prec::Fp8 => format!("aj_f2fp8({e})"),
        _ => e,
    }
}

/// The compute type of a statement and, for integer compute, the result's width in bits
/// (shift counts are taken modulo it).
#[derive(Clone, Copy, Debug)]
struct Cm {
    compute: Compute,
    width: u32,
}

impl Cm {
    /// The compute type of a statement storing `value` into precision `result`.
    fn of(result: Prec, value: &Llv) -> Cm {
        Cm {
            compute: crate::loops::statement_compute(result, value),
            width: result.int_bits().unwrap_or(64),
        }
    }

    /// Plain float or double compute.
    fn float(in_float: bool) -> Cm {
        let compute = if in_float { Compute::F32 } else { Compute::F64 };
        Cm { compute, width: 64 }
    }

    /// How an integer operation on operands `a` and `b` (`b` unused by unary ones) reads
    /// them: their signedness (SPEC 9.1, exact values).
    fn int_ctx(self, a: &Llv, b: Option<&Llv>) -> IntCtx {
        use crate::loops::int_unsigned;
        IntCtx::new(self.width, int_unsigned(a), b.is_some_and(int_unsigned))
    }
}

impl Writer {
    fn offset(&mut self, tn: &Tnode, idcs: &[AxisIndex]) -> String {
        self.offset_in(tn.dims(), idcs)
    }

    /// The row-major offset of the element `idcs` of an array of dims `dims`.
    fn offset_in(&mut self, dims: &[usize], idcs: &[AxisIndex]) -> String {
        let mut stride = 1usize;
        let mut constant = 0i128;
        let mut terms: Vec<String> = vec![];
        for (k, ix) in idcs.iter().enumerate().rev() {
            match ix {
                AxisIndex::Fixed(i) => constant += *i as i128 * stride as i128,
                AxisIndex::Iterator(s) => {
                    let n = self.names.symbol(*s);
                    terms.push(if stride == 1 {
                        n
                    } else {
                        format!("{n} * {stride}")
                    });
                }
                AxisIndex::Linear(l) => {
                    constant += l.offset as i128 * stride as i128;
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

    /// Converts `e`, of C type `from_c_type`, to the compute type. Narrow floats (half,
    /// bfloat16, fp8) are widened exactly by integer code; integers become 64-bit patterns
    /// (sign-extended) in integer compute.
    fn convert(from_c_type: &str, cm: Cm, e: String) -> String {
        let ct = cm.compute.c_type();
        if from_c_type == ct {
            return e;
        }
        if cm.compute.is_integer() {
            return if from_c_type == "double" || from_c_type == "float" {
                format!("aj_d2u64({e})")
            } else {
                format!("(uint64_t)({e})")
            };
        }
        let widen = |f: &str| {
            if ct == "float" {
                format!("{f}({e})")
            } else {
                format!("(double){f}({e})")
            }
        };
        if from_c_type == Prec::Half.c_type() {
            widen("aj_h2f")
        } else if from_c_type == Prec::Bfloat16.c_type() {
            widen("aj_bf2f")
        } else if from_c_type == Prec::Fp8.c_type() {
            widen("aj_fp82f")
        } else {
            format!("({ct}){e}")
        }
    }

    /// An expression computing `v` in float (`in_float`) or double; local scopes are hoisted
    /// into `pre` (each scope once).
    fn expr(
        &mut self,
        v: &Llv,
        cm: Cm,
        pre: &mut String,
        indent: usize,
        done: &mut HashSet<u32>,
    ) -> String {
        match v {
            Llv::Constant(c) if cm.compute.is_integer() => {
                format!("UINT64_C({})", crate::ir::prec::int_bits_of_f64(*c))
            }
            Llv::Constant(c) => float_literal(*c, cm.compute == Compute::F32),
            Llv::Get(tn, idcs) => {
                self.check_access(tn, idcs, 1);
                let off = self.offset(tn, idcs);
                let n = self.names.node(tn);
                Self::convert(tn.prec().c_type(), cm, format!("{n}[{off}]"))
            }
            Llv::GetMergeBuffer(tn, idcs) => {
                self.check_access(tn, idcs, 1);
                let off = self.offset(tn, idcs);
                Self::convert(tn.prec().c_type(), cm, format!("merge_buffer[{off}]"))
            }
            Llv::GetCFunction(f) => Self::convert("double", cm, format!("{f}()")),
            Llv::EmbedIndex(AxisIndex::Fixed(i)) if cm.compute.is_integer() => {
                format!("UINT64_C({i})")
            }
            Llv::EmbedIndex(AxisIndex::Fixed(i)) => {
                float_literal(*i as f64, cm.compute == Compute::F32)
            }
            Llv::EmbedIndex(AxisIndex::Iterator(s)) => {
                let n = self.names.symbol(*s);
                Self::convert("int64_t", cm, n)
            }
            Llv::EmbedIndex(AxisIndex::Linear(l)) => {
                let mut terms: Vec<String> = l
                    .terms()
                    .iter()
                    .map(|&(s, c)| format!("{} * {c}", self.names.symbol(s)))
                    .collect();
                terms.push(l.offset.to_string());
                Self::convert("int64_t", cm, format!("({})", terms.join(" + ")))
            }
            Llv::GetLocal(id) => {
                let n = self.names.scope(id);
                Self::convert(id.tn.prec().c_type(), cm, n)
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
                Self::convert(id.tn.prec().c_type(), cm, n)
            }
            Llv::Binop(op, a, b) => {
                let ictx = cm.int_ctx(a, Some(b));
                let a = self.expr(a, cm, pre, indent, done);
                let b = self.expr(b, cm, pre, indent, done);
                if cm.compute.is_integer() {
                    op.c_expr_int(ictx, &a, &b)
                } else {
                    op.c_expr(cm.compute == Compute::F32, &a, &b)
                }
            }
            Llv::Unop(op, a) => {
                let ictx = cm.int_ctx(a, None);
                let a = self.expr(a, cm, pre, indent, done);
                if cm.compute.is_integer() {
                    op.c_expr_int(ictx, &a)
                } else {
                    op.c_expr(cm.compute == Compute::F32, &a)
                }
            }
            Llv::Ternop(op, a, b, c) => {
                let a = self.expr(a, cm, pre, indent, done);
                let b = self.expr(b, cm, pre, indent, done);
                let c = self.expr(c, cm, pre, indent, done);
                if cm.compute.is_integer() {
                    op.c_expr_int(&a, &b, &c)
                } else {
                    op.c_expr(cm.compute == Compute::F32, &a, &b, &c)
                }
            }
            Llv::Random {
                seed,
                idcs,
                dims,
                prec,
            } => {
                let off = self.offset_in(dims, idcs);
                let w = format!("aj_threefry_word({seed}ULL, (uint64_t)({off}))");
                match crate::ir::random::float_format(*prec) {
                    Some((mant, emin)) => {
                        Self::convert("double", cm, format!("aj_rand_unit({w}, {mant}, {emin})"))
                    }
                    // Integer precisions get the word itself (stored by wrapping).
                    None if cm.compute.is_integer() => format!("((uint64_t){w})"),
                    None => Self::convert("double", cm, format!("(double){w}")),
                }
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
            Llc::Parallel(p) => {
                if self.trace_dir.is_some() {
                    // Trace logs list the stores in the plain loop's order: the region runs
                    // as that loop, on the calling thread.
                    let n = self.names.symbol(p.index);
                    let _ = writeln!(
                        out,
                        "{pad}for (int64_t {n} = {}; {n} <= {}; ++{n}) {{",
                        p.from, p.to
                    );
                    self.stmt(&p.body, indent + 1, out);
                    let _ = writeln!(out, "{pad}}}");
                } else {
                    self.region(p, indent, out);
                }
            }
            Llc::If { guards, body } => {
                // `0 <= e < n` as one unsigned comparison; `e` is computed in int64_t, and
                // lowering checked that its range fits.
                let conds: Vec<String> = guards
                    .iter()
                    .map(|(ix, n)| format!("(uint64_t)({}) < UINT64_C({n})", self.axis_expr(ix)))
                    .collect();
                let conds = if conds.is_empty() {
                    "1".to_string()
                } else {
                    conds.join(" && ")
                };
                let _ = writeln!(out, "{pad}if ({conds}) {{");
                self.stmt(body, indent + 1, out);
                let _ = writeln!(out, "{pad}}}");
            }
            Llc::Lookup {
                symbol,
                tn,
                idcs,
                extent,
                body,
            } => {
                // The index as an exact integer: converting any integer type to uint64_t is
                // defined (modulo 2^64), and a negative value becomes 2^64 - |v| >= 2^63,
                // above every extent; so one unsigned comparison is `0 <= v < extent`, and
                // the conversion back to int64_t happens only for values below the extent.
                let saved = std::mem::take(&mut self.checks);
                self.check_access(tn, idcs, 1);
                let checks = std::mem::replace(&mut self.checks, saved);
                let n = self.names.symbol(*symbol);
                let off = self.offset(tn, idcs);
                let src = self.names.node(tn);
                let _ = writeln!(out, "{pad}{{");
                let inner = format!("{pad}  ");
                for c in &checks {
                    let _ = writeln!(out, "{inner}{c}");
                }
                let _ = writeln!(out, "{inner}const uint64_t {n}_u = (uint64_t){src}[{off}];");
                let _ = writeln!(out, "{inner}if ({n}_u < UINT64_C({extent})) {{");
                let _ = writeln!(out, "{inner}  const int64_t {n} = (int64_t){n}_u;");
                self.stmt(body, indent + 2, out);
                let _ = writeln!(out, "{inner}}}");
                let _ = writeln!(out, "{pad}}}");
            }
            Llc::ZeroOut(tn) => {
                let n = self.names.node(tn);
                let _ = writeln!(out, "{pad}memset({n}, 0, {});", tn.size_in_bytes());
            }
            Llc::Prefetch { tn, offset, write } => {
                // The runtime's AJ_PREFETCH computes the address in integer arithmetic: the
                // element may lie past the tensor (the row after the last one).
                let n = self.names.node(tn);
                let _ = writeln!(
                    out,
                    "{pad}AJ_PREFETCH({n}, {}, {});",
                    self.axis_expr(offset),
                    u8::from(*write)
                );
            }
            Llc::Set { tn, idcs, value } => {
                let saved = std::mem::take(&mut self.checks);
                let mut pre = String::new();
                let cm = Cm::of(tn.prec(), value);
                let e = self.expr(value, cm, &mut pre, indent, &mut HashSet::new());
                self.check_access(tn, idcs, 1);
                let checks = std::mem::replace(&mut self.checks, saved);
                let off = self.offset(tn, idcs);
                let n = self.names.node(tn);
                let mut line = format!("{n}[{off}] = {};", store(tn.prec(), cm.compute, e));
                if overwrites_shared_cells(tn, idcs, value) {
                    // GCC 12.2 (at -O2 and -O3, restrict-qualified pointers) reorders the
                    // stores of `for a { for b { y[a+b] = x[b*A+a] } }`, so that an earlier
                    // point's write wins; a compiler barrier after each store keeps them in
                    // program order. Only overwrites through a non-one-to-one affine index
                    // (several points write one cell, the last one wins) need it.
                    line.push_str(" __asm__ __volatile__(\"\" ::: \"memory\");");
                }
                self.emit_checked(out, &pad, &pre, &checks, &line);
                if self.trace_dir.is_some() {
                    let line = self.trace_line(tn, idcs, &n, &off);
                    let _ = writeln!(out, "{pad}{line}");
                }
            }
            Llc::SetLocal(id, value) => {
                let saved = std::mem::take(&mut self.checks);
                let mut pre = String::new();
                let cm = Cm::of(id.tn.prec(), value);
                let e = self.expr(value, cm, &mut pre, indent, &mut HashSet::new());
                let checks = std::mem::replace(&mut self.checks, saved);
                let n = self.names.scope(id);
                let line = format!("{n} = {};", store(id.tn.prec(), cm.compute, e));
                self.emit_checked(out, &pad, &pre, &checks, &line);
            }
            Llc::VSet(r, v) => {
                let saved = std::mem::take(&mut self.checks);
                let mut pre = String::new();
                let e = self.vexpr(v, &mut pre, indent);
                let checks = std::mem::replace(&mut self.checks, saved);
                let n = self.names.vreg(r.id);
                self.emit_checked(out, &pad, &pre, &checks, &format!("{n} = {e};"));
            }
            Llc::VStore { tn, idcs, value } => {
                let saved = std::mem::take(&mut self.checks);
                let mut pre = String::new();
                let e = self.vexpr(value, &mut pre, indent);
                self.check_access(tn, idcs, value.ty().lanes);
                let checks = std::mem::replace(&mut self.checks, saved);
                let off = self.offset(tn, idcs);
                let n = self.names.node(tn);
                let store = self.dialect.store(value.ty(), &format!("&{n}[{off}]"), &e);
                self.emit_checked(out, &pad, &pre, &checks, &format!("{store};"));
            }
        }
    }

    /// The trace-log statement after a store into `tn` at `idcs` (element `name[off]`): the
    /// node, the indices and the stored value.
    /// The tensor's name is an argument (a C string literal), never part of the format.
    fn trace_line(&mut self, tn: &Tnode, idcs: &[AxisIndex], name: &str, off: &str) -> String {
        let mut fmt = "%s[".to_string();
        let mut args = vec![format!(
            "\"{}\"",
            c_string_literal(log_text(&tn.name()).as_bytes())
        )];
        for (k, ix) in idcs.iter().enumerate() {
            if k > 0 {
                fmt.push_str(", ");
            }
            fmt.push_str("%lld");
            args.push(format!("(long long)({})", self.axis_expr(ix)));
        }
        fmt.push_str("] = %.9g\\n");
        let value = Self::convert(
            tn.prec().c_type(),
            Cm::float(false),
            format!("{name}[{off}]"),
        );
        args.push(value);
        format!("aj_trace_printf(&aj_log, \"{fmt}\", {});", args.join(", "))
    }

    /// Records, in bounds-checked mode, the check of an access of `lanes` consecutive
    /// elements of `tn` at `idcs` for the statement being written (nothing when every index
    /// is a constant inside its axis and the lanes fit).
    fn check_access(&mut self, tn: &Tnode, idcs: &[AxisIndex], lanes: usize) {
        if !self.checked {
            return;
        }
        let dims = tn.dims().to_vec();
        let mut conds = vec![];
        let mut values = vec![];
        for (ix, &d) in idcs.iter().zip(&dims) {
            let e = self.axis_expr(ix);
            if !matches!(ix, AxisIndex::Fixed(i) if *i < d) {
                conds.push(format!("AJ_OOB({e}, {d})"));
            }
            values.push(e);
        }
        if lanes > 1 {
            let numel: usize = dims.iter().product();
            let constant_fit = idcs.iter().all(|ix| matches!(ix, AxisIndex::Fixed(_)))
                && self
                    .offset(tn, idcs)
                    .parse::<usize>()
                    .is_ok_and(|o| o + lanes <= numel);
            if !constant_fit {
                let off = self.offset(tn, idcs);
                conds.push(format!("AJ_OOB({off} + {}, {numel})", lanes - 1));
            }
        }
        if conds.is_empty() {
            return;
        }
        let id = match self.check_table.iter().position(|t| t == tn) {
            Some(k) => k,
            None => {
                self.check_table.push(tn.clone());
                self.check_table.len() - 1
            }
        };
        let arrays = if dims.is_empty() {
            "(const int64_t *)0, (const int64_t *)0".to_string()
        } else {
            let ext: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
            format!(
                "(const int64_t[]){{{}}}, (const int64_t[]){{{}}}",
                values.join(", "),
                ext.join(", ")
            )
        };
        let fail = format!(
            "return aj_out_of_bounds(aj_chk, {id}, {}, {arrays}, {lanes});",
            dims.len()
        );
        let fail = if self.trace_dir.is_some() {
            format!("{{ aj_trace_close(&aj_log); {fail} }}")
        } else {
            fail
        };
        let line = format!("if ({}) {fail}", conds.join(" || "));
        if !self.checks.contains(&line) {
            self.checks.push(line);
        }
    }

    /// Writes `line` after its access checks, inside a block after the hoisted local scopes
    /// `pre` if there are any.
    fn emit_checked(
        &mut self,
        out: &mut String,
        pad: &str,
        pre: &str,
        checks: &[String],
        line: &str,
    ) {
        if checks.is_empty() {
            return self.emit_with_pre(out, pad, pre, line);
        }
        let mut text = checks.join("\n");
        text.push('\n');
        text.push_str(line);
        if pre.is_empty() {
            for l in text.lines() {
                let _ = writeln!(out, "{pad}{l}");
            }
        } else {
            let _ = writeln!(out, "{pad}{{");
            out.push_str(&indent_text(pre, 1));
            for l in text.lines() {
                let _ = writeln!(out, "{pad}  {l}");
            }
            let _ = writeln!(out, "{pad}}}");
        }
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
        if let Some((a, d)) = divides_by_scalar(v) {
            let a = self.vexpr(a, pre, indent);
            let cm = Cm::float(t.prec.computes_in_float());
            let d = self.expr(d, cm, pre, indent, &mut HashSet::new());
            return self.dialect.divide_by_scalar(t, &a, &d);
        }
        match v {
            Vlv::Reg(r) => self.names.vreg(r.id),
            Vlv::Zero(t) => self.dialect.zero(*t),
            Vlv::Splat(t, x) if t.prec.is_integer() => {
                // As a statement storing into the lanes' precision computes and wraps it.
                let cm = Cm::of(t.prec, x);
                let x = self.expr(x, cm, pre, indent, &mut HashSet::new());
                let x = store(t.prec, cm.compute, x);
                self.dialect.splat(*t, &x)
            }
            Vlv::Splat(t, x) => {
                let cm = Cm::float(t.prec.computes_in_float());
                let x = self.expr(x, cm, pre, indent, &mut HashSet::new());
                self.dialect.splat(*t, &x)
            }
            Vlv::Load(t, tn, idcs) => {
                self.check_access(tn, idcs, t.lanes);
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
            // Max and min of a variable that never holds a NaN (a reduction's accumulator)
            // have a cheaper exact spelling; the operations are symmetric then.
            Vlv::Binop(op @ (Binop::Max | Binop::Min), a, b)
                if [a, b]
                    .iter()
                    .any(|x| matches!(&***x, Vlv::Reg(r) if self.never_nan.contains(&r.id))) =>
            {
                let (acc, x) = match &**a {
                    Vlv::Reg(r) if self.never_nan.contains(&r.id) => (a, b),
                    _ => (b, a),
                };
                let (acc, x) = (self.vexpr(acc, pre, indent), self.vexpr(x, pre, indent));
                self.dialect.max_min_acc(t, *op, &acc, &x)
            }
            Vlv::Binop(op, a, b) => {
                let (a, b) = (self.vexpr(a, pre, indent), self.vexpr(b, pre, indent));
                self.dialect
                    .binop(t, *op, &a, &b)
                    .unwrap_or_else(|| format!("/* unsupported vector {op} */ {a}"))
            }
            Vlv::Unop(op, a) => {
                let a = self.vexpr(a, pre, indent);
                self.dialect
                    .unop(t, *op, &a)
                    .unwrap_or_else(|| format!("/* unsupported vector {op} */ {a}"))
            }
            Vlv::Ternop(op, a, b, c) => {
                let (a, b, c) = (
                    self.vexpr(a, pre, indent),
                    self.vexpr(b, pre, indent),
                    self.vexpr(c, pre, indent),
                );
                self.dialect
                    .ternop(t, *op, &a, &b, &c)
                    .unwrap_or_else(|| format!("/* unsupported vector {op} */ {a}"))
            }
            Vlv::Shuffle(a, b, idx) => {
                let (a, b) = (self.vexpr(a, pre, indent), self.vexpr(b, pre, indent));
                self.dialect.shuffle(t, &a, &b, idx)
            }
            Vlv::Repeat(a, _) => {
                let a = self.vexpr(a, pre, indent);
                self.dialect.repeat(t, &a)
            }
            Vlv::DotPairs(acc, a, b) => {
                let (acc, a, b) = (
                    self.vexpr(acc, pre, indent),
                    self.vexpr(a, pre, indent),
                    self.vexpr(b, pre, indent),
                );
                self.dialect.dot_pairs(&acc, &a, &b)
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
        self.check_table.clear();
        self.never_nan = never_nan(&o.code);
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
        // Arrays private to parallel regions live in the regions' own functions.
        let uses: Vec<Uses> = groups
            .iter()
            .map(|g| Uses::shared_of(g, self.trace_dir.is_none()))
            .collect();
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
                (&title, &o.name, k == 0),
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
                vmath: vector_math_types(group),
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
            checked: self.checked,
            check_tensors: std::mem::take(&mut self.check_table),
        };
        (sig, parts)
    }

    /// Writes one part: the readable function taking the parameters it uses, and its entry
    /// point, which picks them out of the routine's tables (`all` gives the table positions).
    /// `(title, routine, first)`: the part's title comment, the routine's exact name and
    /// whether the part is the routine's first.
    #[allow(clippy::too_many_arguments)]
    fn write_part(
        &mut self,
        c_name: &str,
        (title, routine, first): (&str, &str, bool),
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
        let mut param_text = param_text;
        if self.checked {
            param_text.push("aj_check_t *restrict aj_chk".to_string());
        }
        // The body first: its parallel regions become functions written before the part's.
        self.part_name = c_name.to_string();
        self.regions.clear();
        self.region_count = 0;
        self.merge_ctype = mine.iter().find_map(|(_, p)| match p {
            Param::MergeBuffer(tn) => Some(tn.prec().c_type()),
            _ => None,
        });
        let mut text = String::new();
        for c in body {
            if self.trace_dir.is_some() || self.checked {
                // Trace lines print, and checks test, every index as the loop IR has it
                // (collapsed loops run an index past its axis).
                self.stmt(c, 1, &mut text);
            } else {
                self.stmt(&collapse::nests(c.clone()), 1, &mut text);
            }
        }
        let has_regions = !self.regions.is_empty();
        for f in std::mem::take(&mut self.regions) {
            self.out.push_str(&f);
        }
        if has_regions {
            param_text.push("const aj_team_t *aj_team".to_string());
        }
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
        // Vector variables, declared once per function (the compiler keeps them in registers);
        // parallel regions declare their own.
        let mut vregs = vec![];
        for c in body {
            regions::vregs_outside_regions(c, self.trace_dir.is_none(), &mut vregs);
        }
        for r in vregs {
            let n = self.names.vreg(r.id);
            let _ = writeln!(self.out, "  {} {n};", self.dialect.ty(r.ty));
        }
        if self.checked {
            self.out.push_str("  (void)aj_chk;\n");
        }
        if let Some(dir) = &self.trace_dir {
            let mut path = dir.clone();
            path.push(b'/');
            path.extend_from_slice(trace_file_name(routine).as_bytes());
            let _ = writeln!(
                self.out,
                "  aj_trace_t aj_log;\n  aj_trace_open(&aj_log, \"{}\");",
                c_string_literal(&path)
            );
            if first {
                let _ = writeln!(
                    self.out,
                    "  aj_trace_printf(&aj_log, \"# run of routine %s\\n\", \"{}\");",
                    c_string_literal(log_text(routine).as_bytes())
                );
            }
        }
        self.out.push_str(&text);
        if self.trace_dir.is_some() {
            self.out.push_str("  aj_trace_close(&aj_log);\n");
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
        let mut args: Vec<String> = mine
            .iter()
            .map(|&(i, p)| match p {
                Param::MergeBuffer(tn) => format!("(const {} *)merge_buffer", tn.prec().c_type()),
                Param::Static(_) => format!("statics[{}]", static_pos(i)),
                Param::Node(tn) | Param::Scratch(tn) => {
                    format!("({} *)buffers[{}]", tn.prec().c_type(), buffer_pos(i))
                }
            })
            .collect();
        if self.checked {
            // The check record follows the context and scratch buffers in the table.
            args.push(format!("(aj_check_t *)buffers[{}]", buffer_pos(all.len())));
        }
        if has_regions {
            args.push("team".to_string());
        }
        let _ = writeln!(
            self.out,
            "int {c_name}_entry(void *const *buffers, const int64_t *statics, const void *merge_buffer, const aj_team_t *team) {{\n  (void)buffers; (void)statics; (void)merge_buffer; (void)team;\n  return {c_name}({});\n}}",
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

/// The vector types on which some statements call the runtime's vector functions (lane-wise
/// unary and ternary operations, max and min).
fn vector_math_types(stmts: &[Llc]) -> Vec<VType> {
    let mut out: Vec<VType> = vec![];
    for c in stmts {
        crate::loops::visit_vectors(c, &mut |v| {
            let calls = matches!(
                v,
                Vlv::Unop(..) | Vlv::Ternop(..) | Vlv::Binop(Binop::Max | Binop::Min, _, _)
            ) || divides_by_scalar(v).is_some();
            let t = v.ty();
            if calls && !out.contains(&t) {
                out.push(t);
            }
        });
    }
    out
}

/// A division of 16 single-precision lanes by a broadcast scalar (the operand and the
/// scalar), which the runtime's `aj_vdivs_f32_16` computes with a reciprocal and two fused
/// corrections, correctly rounded: `vdivps` on 512-bit vectors has about a third of the
/// throughput of 256-bit ones per lane. Other widths keep the division.
fn divides_by_scalar(v: &Vlv) -> Option<(&Vlv, &Llv)> {
    match v {
        Vlv::Binop(Binop::Div, a, b) => match &**b {
            Vlv::Splat(t, d) if t.prec == Prec::Single && t.lanes == 16 => Some((a, d)),
            _ => None,
        },
        _ => None,
    }
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
                // A negative offset only makes the bound looser: 0 is a safe under-estimate.
                AxisIndex::Linear(l) => usize::try_from(l.offset).unwrap_or(0),
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

/// Whether a store overwrites (does not accumulate into) a cell that several iterations may
/// write: an index depending on two symbols (an affine result entry such as `(a+b)`), and a
/// value that does not read the written cell.
fn overwrites_shared_cells(tn: &Tnode, idcs: &[AxisIndex], value: &Llv) -> bool {
    if idcs.iter().all(|ix| ix.symbols().len() < 2) {
        return false;
    }
    let mut accumulates = false;
    crate::loops::visit_value(value, &mut |v| {
        if let Llv::Get(t, i) = v {
            accumulates |= t == tn && i.as_slice() == idcs;
        }
    });
    !accumulates
}

/// The vector variables of `code` (by id) that never hold a NaN lane: floating vectors whose
/// every assignment is a broadcast of a constant that is not NaN, or the maximum or minimum
/// of such a variable and anything (IEEE maximumNumber and minimumNumber ignore a NaN
/// operand). The largest such set, as a fixed point: start from every floating variable and
/// drop those with another assignment until none is dropped. A reduction's accumulators
/// (broadcast -inf, then `acc = max(acc, x)`) are the ones found.
fn never_nan(code: &Llc) -> HashSet<u32> {
    let mut sets: Vec<(u32, Vlv)> = vec![];
    let mut bad: HashSet<u32> = HashSet::new();
    crate::loops::visit_llc(code, &mut |c| {
        if let Llc::VSet(r, v) = c {
            if matches!(r.ty.prec, Prec::Single | Prec::Double) {
                sets.push((r.id, v.clone()));
            } else {
                bad.insert(r.id);
            }
        }
    });
    let mut ok: HashSet<u32> = sets
        .iter()
        .map(|(r, _)| *r)
        .filter(|r| !bad.contains(r))
        .collect();
    loop {
        let number = |v: &Vlv, ok: &HashSet<u32>| match v {
            Vlv::Splat(_, c) => matches!(&**c, Llv::Constant(c) if !c.is_nan()),
            Vlv::Zero(_) => true,
            Vlv::Binop(Binop::Max | Binop::Min, a, b) => [a, b]
                .iter()
                .any(|x| matches!(&***x, Vlv::Reg(r) if ok.contains(&r.id))),
            _ => false,
        };
        let drop: Vec<u32> = sets
            .iter()
            .filter(|(r, v)| ok.contains(r) && !number(v, &ok))
            .map(|(r, _)| *r)
            .collect();
        if drop.is_empty() {
            return ok;
        }
        for r in drop {
            ok.remove(&r);
        }
    }
}
