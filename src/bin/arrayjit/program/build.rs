//! From a parsed [`Program`] to library objects: tensor nodes, static indices, assignments per
//! routine and a validated run plan. Every semantic error carries the JSON path of the
//! offending value, so that it can be reported with the routine/statement and line.

use super::decimal;
use super::format::{
    ArgDecl, AssignDecl, FetchKind, InitDecl, MemoryDecl, MergeDecl, Program, Statement, Step,
    TensorDecl,
};
use super::locate::{json_path, JsonPath, Seg};
use arrayjit::ir::einsum;
use arrayjit::ir::tnode::provenance;
use arrayjit::ir::{
    Assignments, Bindings, Binop, Buffer, FetchOp, HostedMode, InitOp, MemoryMode, Projections,
    StaticSymbol, Ternop, Tnode, Unop,
};
use std::collections::HashMap;
use std::path::Path;

/// The largest tensor the CLI creates, in bytes (a guard against typos such as an extra
/// zero in `dims`; smaller tensors that do not fit in memory are [`arrayjit::Error::OutOfMemory`]
/// errors).
pub const MAX_TENSOR_BYTES: u128 = 1 << 34;

/// The most run steps one execution of a program's `run` list may execute, counting every
/// repetition (a `repeat` of N × M steps counts N·M; a `repeat` of nothing counts 0 and is
/// skipped). A guard against counts that would run for centuries.
pub const MAX_EXECUTED_STEPS: u64 = 1_000_000_000;

/// The most devices a multi-device program may have (each gets a worker thread).
pub const MAX_DEVICES: usize = 1024;

/// A semantic error: a message and the JSON path of the value it is about.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgramError {
    /// Where in the document, if known.
    pub path: Option<JsonPath>,
    /// What is wrong.
    pub msg: String,
}

impl ProgramError {
    /// An error about the value at `path`.
    pub fn at(path: JsonPath, msg: impl Into<String>) -> ProgramError {
        ProgramError {
            path: Some(path),
            msg: msg.into(),
        }
    }
    /// An error without a place in the file.
    pub fn nowhere(msg: impl Into<String>) -> ProgramError {
        ProgramError {
            path: None,
            msg: msg.into(),
        }
    }
}

type Res<T> = Result<T, ProgramError>;

/// A validated run step.
#[derive(Clone, Debug)]
pub enum PlanStep {
    /// Set bindings of the routine with this index, then run it.
    Run {
        /// Index into [`Built::routine_names`].
        routine: usize,
        /// The device it runs on (0 for single-device programs).
        device: usize,
        /// Static index values to set before running.
        bindings: Vec<(String, i64)>,
        /// Where the step is (for run-time errors).
        path: JsonPath,
    },
    /// Repeat the steps (never empty: a repeat that executes nothing is left out of the plan).
    Repeat {
        /// How many times.
        count: u64,
        /// The steps.
        steps: Vec<PlanStep>,
    },
    /// Copy a tensor between devices (or into the destination's merge buffer).
    Copy {
        /// The tensor's name and node.
        tensor: (String, Tnode),
        /// Source device.
        from: usize,
        /// Destination device.
        to: usize,
        /// Merge-buffer use.
        merge: MergeDecl,
        /// Where the step is.
        path: JsonPath,
    },
    /// Copy a hosted tensor from the host to a device.
    FromHost {
        /// The tensor's name and node.
        tensor: (String, Tnode),
        /// The device.
        device: usize,
        /// Where the step is.
        path: JsonPath,
    },
    /// Copy a hosted tensor from a device to the host.
    ToHost {
        /// The tensor's name and node.
        tensor: (String, Tnode),
        /// The device.
        device: usize,
        /// Where the step is.
        path: JsonPath,
    },
    /// Wait for a device (or all).
    Await {
        /// The device, or `None` for all.
        device: Option<usize>,
        /// Where the step is.
        path: JsonPath,
    },
    /// Sum a tensor over devices, leaving the sum on each of them.
    AllReduce {
        /// The tensor's name and node.
        tensor: (String, Tnode),
        /// The devices taking part (distinct, at least one).
        devices: Vec<usize>,
        /// Where the step is.
        path: JsonPath,
    },
}

/// Everything built from a program.
pub struct Built {
    /// The tensors in declaration order, with their names.
    pub tensors: Vec<(String, Tnode)>,
    /// The static indices shared by all routines.
    pub bindings: Bindings,
    /// The routine names, in order.
    pub routine_names: Vec<String>,
    /// The routines' assignments, in order.
    pub assignments: Vec<Assignments>,
    /// The validated run steps.
    pub plan: Vec<PlanStep>,
    /// How many steps one execution of the plan executes (at most [`MAX_EXECUTED_STEPS`]).
    pub executed_steps: u64,
    /// The printed tensors (name, node), in print order.
    pub print: Vec<(String, Tnode)>,
    /// Number of devices of a multi-device program (`None`: single device, no device layer).
    pub devices: Option<usize>,
    /// The device backend's name (`multicore` or `sync`).
    pub backend: String,
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

fn names_list(names: impl IntoIterator<Item = &'static str>) -> String {
    names.into_iter().collect::<Vec<_>>().join(", ")
}

fn with(path: &[Seg], more: JsonPath) -> JsonPath {
    let mut p = path.to_vec();
    p.extend(more);
    p
}

struct Builder<'a> {
    tensors: HashMap<&'a str, Tnode>,
    bindings: Bindings,
}

impl<'a> Builder<'a> {
    fn tensor(&self, name: &str, path: JsonPath) -> Res<Tnode> {
        self.tensors
            .get(name)
            .cloned()
            .ok_or_else(|| ProgramError::at(path, format!("unknown tensor {}", quote(name))))
    }

    fn static_index(&self, name: &str, path: JsonPath) -> Res<StaticSymbol> {
        self.bindings.find(name).cloned().ok_or_else(|| {
            let known: Vec<String> = self.bindings.0.iter().map(|s| quote(&s.name)).collect();
            ProgramError::at(
                path,
                if known.is_empty() {
                    format!(
                        "unknown static index {} (the program declares no static_indices)",
                        quote(name)
                    )
                } else {
                    format!(
                        "unknown static index {} (declared: {})",
                        quote(name),
                        known.join(", ")
                    )
                },
            )
        })
    }

    fn statements(&self, code: &[Statement], path: &[Seg]) -> Res<Assignments> {
        let items = code
            .iter()
            .enumerate()
            .map(|(i, st)| self.statement(st, &with(path, json_path![i])))
            .collect::<Res<Vec<_>>>()?;
        Ok(Assignments::seq(items))
    }

    fn statement(&self, st: &Statement, path: &[Seg]) -> Res<Assignments> {
        match st {
            Statement::Block(b) => Ok(Assignments::block(
                &b.comment,
                self.statements(&b.code, &with(path, json_path!["code"]))?,
            )),
            Statement::Assign(a) => self.assign(a, path),
            Statement::Gather(g) => {
                let key = if g.scatter { "scatter_add" } else { "gather" };
                let lhs = self.tensor(&g.lhs, with(path, json_path![key]))?;
                let from = self.tensor(&g.from, with(path, json_path!["from"]))?;
                let index = self.tensor(&g.index, with(path, json_path!["index"]))?;
                let asg = if g.scatter {
                    Assignments::ScatterAdd {
                        lhs,
                        src: from,
                        index,
                    }
                } else {
                    Assignments::Gather {
                        lhs,
                        table: from,
                        index,
                    }
                };
                // Lowering checks the precision of the index and the dims: report its
                // error at the statement.
                if let Err(e) = arrayjit::lower::lower(&asg) {
                    let at = match e {
                        arrayjit::Error::IndexPrecision { .. } => json_path!["index"],
                        _ => json_path![key],
                    };
                    return Err(ProgramError::at(with(path, at), e.to_string()));
                }
                Ok(asg)
            }
            Statement::Fetch(f) => {
                let array = self.tensor(&f.lhs, with(path, json_path!["fetch"]))?;
                let fetch_op = match &f.kind {
                    // Exactly as written, like `values`: integers keep every digit, floats
                    // round once, from the decimal, to the tensor's precision.
                    FetchKind::Constant(c) => {
                        let prec = array.prec();
                        let at = || with(path, json_path!["constant"]);
                        if prec.is_integer() {
                            FetchOp::ConstantInt(
                                decimal::convert_int(c, prec)
                                    .map_err(|m| ProgramError::at(at(), m))?,
                            )
                        } else {
                            FetchOp::Constant(
                                decimal::convert(c, prec).map_err(|m| ProgramError::at(at(), m))?,
                            )
                        }
                    }
                    FetchKind::Random { seed } => FetchOp::Random { seed: *seed },
                    FetchKind::EmbedIndex(s) => FetchOp::EmbedSymbol(
                        self.static_index(s, with(path, json_path!["embed_index"]))?,
                    ),
                    FetchKind::Slice { src, index } => {
                        let sliced = self.tensor(src, with(path, json_path!["slice"]))?;
                        let batch_idx =
                            self.static_index(index, with(path, json_path!["index"]))?;
                        let sd = sliced.dims();
                        if sd.len() != array.dims().len() + 1 || &sd[1..] != array.dims() {
                            return Err(ProgramError::at(
                                with(path, json_path!["slice"]),
                                format!(
                                    "shapes mismatch: slice source {} has dims {:?}, but slicing \
                                     into {} (dims {:?}) needs dims [N, {}]",
                                    quote(src),
                                    sd,
                                    quote(&f.lhs),
                                    array.dims(),
                                    array
                                        .dims()
                                        .iter()
                                        .map(|d| d.to_string())
                                        .collect::<Vec<_>>()
                                        .join(", ")
                                ),
                            ));
                        }
                        if let Some(r) = batch_idx.range {
                            if r > sd[0] {
                                return Err(ProgramError::at(
                                    with(path, json_path!["index"]),
                                    format!(
                                        "static index {} has range {r}, larger than the {} \
                                         slices of {}",
                                        quote(index),
                                        sd[0],
                                        quote(src)
                                    ),
                                ));
                            }
                        }
                        FetchOp::Slice { batch_idx, sliced }
                    }
                };
                Ok(Assignments::Fetch { array, fetch_op })
            }
        }
    }

    fn assign(&self, a: &AssignDecl, path: &[Seg]) -> Res<Assignments> {
        let lhs = self.tensor(&a.lhs, with(path, json_path!["assign"]))?;
        let args_path = with(path, json_path!["args"]);
        let mut args = vec![];
        for (i, arg) in a.args.iter().enumerate() {
            args.push(match arg {
                ArgDecl::Tensor(n) => {
                    Buffer::Node(self.tensor(n, with(&args_path, json_path![i]))?)
                }
                ArgDecl::Merge(n) => {
                    Buffer::MergeBuffer(self.tensor(n, with(&args_path, json_path![i, "merge"]))?)
                }
            });
        }
        let op_path = with(path, json_path!["op"]);
        let unary_names = || names_list(Unop::ALL.iter().map(|o| o.name()));
        let binary_names = || names_list(Binop::ALL.iter().map(|o| o.name()));
        let ternary_names = || names_list(Ternop::ALL.iter().map(|o| o.name()));
        enum Op {
            Un(Unop),
            Bin(Binop),
            Tern(Ternop),
        }
        if let (Some(_), n @ (1 | 2)) = (Ternop::from_name(&a.op), args.len()) {
            return Err(ProgramError::at(
                op_path,
                format!(
                    "wrong arity: operation {} is ternary, but the assignment has {n} argument{}",
                    quote(&a.op),
                    if n == 1 { "" } else { "s" }
                ),
            ));
        }
        let op = match args.len() {
            1 => match (Unop::from_name(&a.op), Binop::from_name(&a.op)) {
                (Some(u), _) => Op::Un(u),
                (None, Some(_)) => {
                    return Err(ProgramError::at(
                        op_path,
                        format!(
                            "wrong arity: operation {} is binary, but the assignment has 1 \
                             argument",
                            quote(&a.op)
                        ),
                    ))
                }
                (None, None) => {
                    return Err(ProgramError::at(
                        op_path,
                        format!(
                            "unknown unary operation {} (unary operations: {})",
                            quote(&a.op),
                            unary_names()
                        ),
                    ))
                }
            },
            2 => match (Binop::from_name(&a.op), Unop::from_name(&a.op)) {
                (Some(b), _) => Op::Bin(b),
                (None, Some(_)) => {
                    return Err(ProgramError::at(
                        op_path,
                        format!(
                            "wrong arity: operation {} is unary, but the assignment has 2 \
                             arguments",
                            quote(&a.op)
                        ),
                    ))
                }
                (None, None) => {
                    return Err(ProgramError::at(
                        op_path,
                        format!(
                            "unknown binary operation {} (binary operations: {})",
                            quote(&a.op),
                            binary_names()
                        ),
                    ))
                }
            },
            3 => match Ternop::from_name(&a.op) {
                Some(t) => Op::Tern(t),
                None => {
                    return Err(ProgramError::at(
                        op_path,
                        format!(
                            "unknown ternary operation {} (ternary operations: {})",
                            quote(&a.op),
                            ternary_names()
                        ),
                    ))
                }
            },
            n => {
                return Err(ProgramError::at(
                    args_path,
                    format!("wrong arity: an assignment takes 1, 2 or 3 arguments, got {n}"),
                ))
            }
        };
        let accum = match a.accum.as_deref() {
            None | Some("set") => Binop::Arg2,
            Some(name) => Binop::from_name(name).ok_or_else(|| {
                ProgramError::at(
                    with(path, json_path!["accum"]),
                    format!(
                        "unknown accumulator {}: expected \"set\" or a binary operation ({})",
                        quote(name),
                        binary_names()
                    ),
                )
            })?,
        };
        let projections = match &a.logic {
            None => {
                for (i, arg) in args.iter().enumerate() {
                    let tn = arg.tnode();
                    if tn.dims() != lhs.dims() {
                        return Err(ProgramError::at(
                            with(&args_path, json_path![i]),
                            format!(
                                "shapes mismatch: without \"logic\" every argument must have the \
                                 dims of {} {:?}, but argument {} {} has dims {:?}; give a \
                                 \"logic\" spec to broadcast or reduce",
                                quote(&a.lhs),
                                lhs.dims(),
                                i + 1,
                                quote(&tn.name()),
                                tn.dims()
                            ),
                        ));
                    }
                }
                Projections::pointwise(lhs.dims(), args.len())
            }
            Some(spec) => {
                let dims: Vec<&[usize]> = args.iter().map(|b| b.tnode().dims()).collect();
                einsum::projections(spec, lhs.dims(), &dims, &self.bindings)
                    .map_err(|e| ProgramError::at(with(path, json_path!["logic"]), e.to_string()))?
            }
        };
        Ok(
            match (
                op,
                <[Buffer; 1]>::try_from(args.clone()),
                <[Buffer; 2]>::try_from(args.clone()),
                <[Buffer; 3]>::try_from(args),
            ) {
                (Op::Tern(op), _, _, Ok([rhs1, rhs2, rhs3])) => Assignments::AccumTernop {
                    initialize_neutral: a.init_neutral,
                    accum,
                    op,
                    lhs,
                    rhs1,
                    rhs2,
                    rhs3,
                    projections,
                },
                (Op::Un(op), Ok([rhs]), _, _) => Assignments::AccumUnop {
                    initialize_neutral: a.init_neutral,
                    accum,
                    op,
                    lhs,
                    rhs,
                    projections,
                },
                (Op::Bin(op), _, Ok([rhs1, rhs2]), _) => Assignments::AccumBinop {
                    initialize_neutral: a.init_neutral,
                    accum,
                    op,
                    lhs,
                    rhs1,
                    rhs2,
                    projections,
                },
                _ => {
                    return Err(ProgramError::at(
                        path.to_vec(),
                        "the operation's arity does not match its arguments",
                    ))
                }
            },
        )
    }
}

/// Creates a tensor node from its declaration (see the module docs of [`super`] for the
/// hosting rules).
/// The tensor names a routine's statements mention.
fn names_used<'a>(stmts: &'a [Statement], out: &mut Vec<&'a str>) {
    for st in stmts {
        match st {
            Statement::Assign(a) => {
                out.push(&a.lhs);
                for arg in &a.args {
                    match arg {
                        ArgDecl::Tensor(n) | ArgDecl::Merge(n) => out.push(n),
                    }
                }
            }
            Statement::Fetch(f) => {
                out.push(&f.lhs);
                if let FetchKind::Slice { src, .. } = &f.kind {
                    out.push(src);
                }
            }
            Statement::Block(b) => names_used(&b.code, out),
            Statement::Gather(g) => {
                out.push(&g.lhs);
                out.push(&g.from);
                out.push(&g.index);
            }
        }
    }
}

/// Builds a tensor. `shared_by` lists the routines using it when there are several: it must
/// then persist between them (Materialized).
fn make_tensor(
    decl: &TensorDecl,
    path: &[Seg],
    base_dir: &Path,
    printed: bool,
    shared_by: &[&str],
) -> Res<Tnode> {
    let name = decl.name.as_str();
    if name.is_empty() {
        return Err(ProgramError::at(
            with(path, json_path!["name"]),
            "a tensor name must not be empty",
        ));
    }
    let dims_path = with(path, json_path!["dims"]);
    if decl.dims.is_empty() || decl.dims.contains(&0) {
        return Err(ProgramError::at(
            dims_path,
            format!(
                "dims {:?} must be non-empty and every dim at least 1 (a scalar has dims [1])",
                decl.dims
            ),
        ));
    }
    let prec = decl.prec.prec();
    let bytes = decl
        .dims
        .iter()
        .try_fold(prec.size_in_bytes() as u128, |acc, &d| {
            acc.checked_mul(d as u128)
        });
    if bytes.is_none_or(|b| b > MAX_TENSOR_BYTES) {
        return Err(ProgramError::at(
            dims_path,
            format!(
                "dims {:?} of precision {prec} are too large (the limit is {MAX_TENSOR_BYTES} \
                 bytes per tensor)",
                decl.dims
            ),
        ));
    }
    let init_path = with(path, json_path!["init"]);
    let mem_path = with(path, json_path!["memory"]);
    let lib = |p: &JsonPath| {
        let p = p.clone();
        move |e: arrayjit::Error| {
            let e = match e {
                arrayjit::Error::OutOfMemory { what, bytes } => arrayjit::Error::OutOfMemory {
                    what: format!("tensor {} ({what})", quote(name)),
                    bytes,
                },
                e => e,
            };
            ProgramError::at(p, e.to_string())
        }
    };
    // Exact values of an integer tensor's `values` (the f64s of the init may round them).
    let mut exact_ints: Vec<i128> = vec![];
    // The host data, when the init is something other than zeros.
    let data_init: Option<InitOp> = match &decl.init {
        None | Some(InitDecl::Zeros) => None,
        Some(InitDecl::Range) => Some(InitOp::RangeOverOffsets),
        Some(InitDecl::Values { values, strict }) => {
            if values.is_empty() {
                return Err(ProgramError::at(init_path, "\"values\" must not be empty"));
            }
            // (The number of cells fits: the size was checked above.)
            let n = arrayjit::ir::ndarray::numel(&decl.dims);
            if !*strict && values.len() > n {
                return Err(ProgramError::at(
                    with(&init_path, json_path!["values"]),
                    format!(
                        "{} values for {n} cells: with \"strict\": false the values repeat, \
                         and values beyond the last cell would be ignored",
                        values.len()
                    ),
                ));
            }
            let mut converted = Vec::with_capacity(values.len());
            for (i, v) in values.iter().enumerate() {
                let x = decimal::convert(v, prec)
                    .map_err(|m| ProgramError::at(with(&init_path, json_path!["values", i]), m))?;
                converted.push(x);
                if prec.is_integer() {
                    // Exact (every digit of an int64 above 2^53), written after creation.
                    let k = decimal::convert_int(v, prec).map_err(|m| {
                        ProgramError::at(with(&init_path, json_path!["values", i]), m)
                    })?;
                    exact_ints.push(k);
                }
            }
            Some(InitOp::ConstantFill {
                values: converted,
                strict: *strict,
            })
        }
        Some(InitDecl::Uniform { seed }) => Some(InitOp::StandardUniform { seed: *seed }),
        Some(InitDecl::File(f)) => Some(InitOp::FileMapped {
            path: base_dir.join(f),
        }),
    };
    let label = [name];
    let shared = || {
        shared_by
            .iter()
            .map(|u| quote(u))
            .collect::<Vec<_>>()
            .join(", ")
    };
    // Host arrays are always created through the builder's init (zeros included), so that a
    // failed allocation is an error naming the tensor rather than an abort.
    let create = |hosted: bool, mode: Option<(MemoryMode, u32)>, at: &JsonPath| -> Res<Tnode> {
        let mut b = Tnode::builder(&label, &decl.dims, prec);
        if let Some((m, p)) = mode {
            b = b.memory_with_provenance(m, p);
        }
        let (b, at) = match (&data_init, hosted) {
            (Some(init), _) => (b.init(init.clone()), &init_path),
            (None, true) => (b.hosted(), at),
            (None, false) => (b, &dims_path),
        };
        let tn = b.build().map_err(lib(at))?;
        if !exact_ints.is_empty() {
            tn.with_host_mut(|a| {
                for i in 0..a.len() {
                    a.set_int(i, exact_ints[i % exact_ints.len()]);
                }
            });
        }
        Ok(tn)
    };
    let shared_mode =
        (shared_by.len() > 1).then_some((MemoryMode::Materialized, provenance::SHARED_BY_ROUTINES));
    match decl.memory {
        None => create(decl.init.is_some() || printed, shared_mode, &path.to_vec()),
        Some(MemoryDecl::Hosted) => create(
            true,
            Some((
                MemoryMode::Hosted(HostedMode::Nonconstant),
                provenance::USER,
            )),
            &mem_path,
        ),
        // A non-zero init gets a host array that only stages the data for `from_host`; a
        // printed tensor gets one to receive `to_host`.
        Some(MemoryDecl::OnDevice) => create(
            printed,
            Some((MemoryMode::OnDevice, provenance::USER)),
            &mem_path,
        ),
        Some(m @ (MemoryDecl::Virtual | MemoryDecl::Local)) => {
            if data_init.is_some() {
                return Err(ProgramError::at(
                    mem_path,
                    format!(
                        "a tensor with memory {} cannot have an init other than \"zeros\": its \
                         values never come from the host (use \"on_device\" or \"hosted\")",
                        quote(m.name())
                    ),
                ));
            }
            if printed {
                return Err(ProgramError::at(
                    mem_path,
                    format!(
                        "the tensor is printed, but memory {} keeps its values off the host \
                         (use \"on_device\" or \"hosted\", or drop \"memory\")",
                        quote(m.name())
                    ),
                ));
            }
            if shared_by.len() > 1 {
                return Err(ProgramError::at(
                    mem_path,
                    format!(
                        "used by routines {} and so must persist between them, but memory {} \
                         keeps it within one routine call",
                        shared(),
                        quote(m.name())
                    ),
                ));
            }
            let mode = if m == MemoryDecl::Virtual {
                MemoryMode::Virtual
            } else {
                MemoryMode::Local
            };
            create(false, Some((mode, provenance::USER)), &mem_path)
        }
    }
}

/// What run steps may refer to.
struct PlanEnv<'a> {
    routines: &'a HashMap<&'a str, usize>,
    bindings: &'a Bindings,
    tensors: &'a HashMap<&'a str, Tnode>,
    /// Number of devices (1 for single-device programs).
    devices: usize,
    multi: bool,
}

impl PlanEnv<'_> {
    fn device(&self, d: Option<usize>, path: JsonPath) -> Res<usize> {
        let d = d.unwrap_or(0);
        if !self.multi && d != 0 {
            return Err(ProgramError::at(
                path,
                format!("device {d}: this program has one device (add \"devices\": N for more)"),
            ));
        }
        if d >= self.devices {
            return Err(ProgramError::at(
                path,
                format!(
                    "device {d} does not exist: the program has {} devices",
                    self.devices
                ),
            ));
        }
        Ok(d)
    }

    /// A `from_host` / `to_host` step needs a tensor with a host array.
    fn hosted(&self, tensor: &(String, Tnode), step: &str, path: JsonPath) -> Res<()> {
        if tensor.1.is_hosted() {
            return Ok(());
        }
        Err(ProgramError::at(
            path,
            format!(
                "{step} of tensor {}, which is not hosted (a tensor is hosted when it has an \
                 \"init\", is printed, or has \"memory\": \"hosted\")",
                quote(&tensor.0)
            ),
        ))
    }

    fn tensor(&self, name: &str, path: JsonPath) -> Res<(String, Tnode)> {
        match self.tensors.get(name) {
            Some(t) => Ok((name.to_string(), t.clone())),
            None => Err(ProgramError::at(
                path,
                format!("unknown tensor {}", quote(name)),
            )),
        }
    }
}

/// Validates run steps; returns the plan and how many steps it executes (every repetition
/// counted), which is at most [`MAX_EXECUTED_STEPS`].
fn plan(steps: &[Step], path: &[Seg], env: &PlanEnv<'_>) -> Res<(Vec<PlanStep>, u64)> {
    let (routines, bindings) = (env.routines, env.bindings);
    let mut out = vec![];
    let mut executed: u64 = 0;
    for (i, step) in steps.iter().enumerate() {
        let here = with(path, json_path![i]);
        // Every step but a repeat executes one step.
        let mut cost: u64 = 1;
        match step {
            Step::Routine {
                routine,
                bindings: values,
                device,
            } => {
                let device = env.device(*device, with(&here, json_path!["device"]))?;
                let &r = routines.get(routine.as_str()).ok_or_else(|| {
                    let mut known: Vec<&&str> = routines.keys().collect();
                    known.sort();
                    ProgramError::at(
                        with(&here, json_path!["routine"]),
                        format!(
                            "unknown routine {} (routines: {})",
                            quote(routine),
                            known
                                .iter()
                                .map(|k| quote(k))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    )
                })?;
                let mut sets = vec![];
                for (name, &v) in values {
                    let vpath = with(&here, json_path!["bindings", name.as_str()]);
                    let Some(s) = bindings.find(name) else {
                        return Err(ProgramError::at(
                            vpath,
                            format!(
                                "routine {}: unknown static index {}",
                                quote(routine),
                                quote(name)
                            ),
                        ));
                    };
                    let limit = s
                        .range
                        .map_or(i64::MAX, |r| i64::try_from(r).unwrap_or(i64::MAX));
                    if v < 0 || v >= limit {
                        return Err(ProgramError::at(
                            vpath,
                            format!(
                                "routine {}: static index {} = {v} is out of range 0..{limit}",
                                quote(routine),
                                quote(name)
                            ),
                        ));
                    }
                    sets.push((name.clone(), v));
                }
                out.push(PlanStep::Run {
                    routine: r,
                    device,
                    bindings: sets,
                    path: here.clone(),
                });
            }
            Step::Repeat { count, steps } => {
                let count_path = with(&here, json_path!["repeat"]);
                let Ok(count) = u64::try_from(*count) else {
                    return Err(ProgramError::at(
                        count_path,
                        format!("repeat count {count} must not be negative"),
                    ));
                };
                let (inner, per_round) = plan(steps, &with(&here, json_path!["steps"]), env)?;
                cost = match count.checked_mul(per_round) {
                    Some(c) if c <= MAX_EXECUTED_STEPS => c,
                    _ => {
                        return Err(ProgramError::at(
                            count_path,
                            format!(
                                "repeating {per_round} step{} {count} times executes more than \
                                 {MAX_EXECUTED_STEPS} steps, the limit for one run",
                                if per_round == 1 { "" } else { "s" }
                            ),
                        ))
                    }
                };
                // A repeat that executes nothing (no steps, or 0 times) is left out, so that
                // no executor ever loops over it.
                if cost > 0 {
                    out.push(PlanStep::Repeat {
                        count,
                        steps: inner,
                    });
                }
            }
            Step::Copy {
                tensor,
                from,
                to,
                merge,
            } => {
                if !env.multi {
                    return Err(ProgramError::at(
                        with(&here, json_path!["copy"]),
                        "copying between devices needs a multi-device program (\"devices\": N)",
                    ));
                }
                let tensor = env.tensor(tensor, with(&here, json_path!["copy"]))?;
                let from = env.device(Some(*from), with(&here, json_path!["from"]))?;
                let to = env.device(Some(*to), with(&here, json_path!["to"]))?;
                if from == to {
                    return Err(ProgramError::at(
                        with(&here, json_path!["to"]),
                        format!("copy of {} from device {from} to itself", quote(&tensor.0)),
                    ));
                }
                out.push(PlanStep::Copy {
                    tensor,
                    from,
                    to,
                    merge: *merge,
                    path: here.clone(),
                });
            }
            Step::FromHost { tensor, device } => {
                let tensor = env.tensor(tensor, with(&here, json_path!["from_host"]))?;
                env.hosted(&tensor, "from_host", with(&here, json_path!["from_host"]))?;
                let device = env.device(*device, with(&here, json_path!["device"]))?;
                out.push(PlanStep::FromHost {
                    tensor,
                    device,
                    path: here.clone(),
                });
            }
            Step::ToHost { tensor, device } => {
                let tensor = env.tensor(tensor, with(&here, json_path!["to_host"]))?;
                env.hosted(&tensor, "to_host", with(&here, json_path!["to_host"]))?;
                let device = env.device(*device, with(&here, json_path!["device"]))?;
                out.push(PlanStep::ToHost {
                    tensor,
                    device,
                    path: here.clone(),
                });
            }
            Step::AllReduce { tensor, devices } => {
                if !env.multi {
                    return Err(ProgramError::at(
                        with(&here, json_path!["all_reduce"]),
                        "all_reduce needs a multi-device program (\"devices\": N)",
                    ));
                }
                let tensor = env.tensor(tensor, with(&here, json_path!["all_reduce"]))?;
                let devices = match devices {
                    None => (0..env.devices).collect(),
                    Some(list) => {
                        let mut out: Vec<usize> = vec![];
                        for (i, d) in list.iter().enumerate() {
                            let d = env.device(Some(*d), with(&here, json_path!["devices", i]))?;
                            if out.contains(&d) {
                                return Err(ProgramError::at(
                                    with(&here, json_path!["devices", i]),
                                    format!("device {d} is listed twice"),
                                ));
                            }
                            out.push(d);
                        }
                        if out.is_empty() {
                            return Err(ProgramError::at(
                                with(&here, json_path!["devices"]),
                                "an all_reduce needs at least one device",
                            ));
                        }
                        out
                    }
                };
                out.push(PlanStep::AllReduce {
                    tensor,
                    devices,
                    path: here.clone(),
                });
            }
            Step::Await { device } => {
                let device = match device {
                    Some(d) => Some(env.device(Some(*d), with(&here, json_path!["await"]))?),
                    None => None,
                };
                out.push(PlanStep::Await {
                    device,
                    path: here.clone(),
                });
            }
        }
        executed = match executed.checked_add(cost) {
            Some(e) if e <= MAX_EXECUTED_STEPS => e,
            _ => {
                return Err(ProgramError::at(
                    here,
                    format!(
                        "with this step the run executes more than {MAX_EXECUTED_STEPS} steps, \
                         the limit for one run"
                    ),
                ))
            }
        };
    }
    Ok((out, executed))
}

/// Builds tensors, static indices, routines and the run plan; relative `file` inits are
/// resolved against `base_dir`.
pub fn build(prog: &Program, base_dir: &Path) -> Res<Built> {
    // Names first: duplicates, and what is printed.
    let mut tensor_index: HashMap<&str, usize> = HashMap::new();
    for (i, t) in prog.tensors.iter().enumerate() {
        if let Some(prev) = tensor_index.insert(t.name.as_str(), i) {
            return Err(ProgramError::at(
                json_path!["tensors", i, "name"],
                format!(
                    "duplicate tensor name {} (first declared as tensor #{})",
                    quote(&t.name),
                    prev + 1
                ),
            ));
        }
    }
    let mut printed = vec![false; prog.tensors.len()];
    for (i, name) in prog.print.iter().enumerate() {
        let path = json_path!["print", i];
        let Some(&t) = tensor_index.get(name.as_str()) else {
            return Err(ProgramError::at(
                path,
                format!("cannot print unknown tensor {}", quote(name)),
            ));
        };
        if printed[t] {
            return Err(ProgramError::at(
                path,
                format!("tensor {} is printed twice", quote(name)),
            ));
        }
        printed[t] = true;
    }

    let mut bindings = Bindings::empty();
    for (i, s) in prog.static_indices.iter().enumerate() {
        let path = json_path!["static_indices", i];
        if s.name.is_empty() {
            return Err(ProgramError::at(
                with(&path, json_path!["name"]),
                "a static index name must not be empty",
            ));
        }
        if bindings.find(&s.name).is_some() {
            return Err(ProgramError::at(
                with(&path, json_path!["name"]),
                format!("duplicate static index {}", quote(&s.name)),
            ));
        }
        if s.range == Some(0) {
            return Err(ProgramError::at(
                with(&path, json_path!["range"]),
                "a static index range must be at least 1",
            ));
        }
        bindings.0.push(StaticSymbol::new(&s.name, s.range));
    }

    let mut tensors = vec![];
    let mut b = Builder {
        tensors: HashMap::new(),
        bindings,
    };
    // Which routines use each tensor: one used by several must persist between them.
    let used: Vec<Vec<&str>> = prog
        .routines
        .iter()
        .map(|r| {
            let mut v = vec![];
            names_used(&r.code, &mut v);
            v
        })
        .collect();
    for (i, t) in prog.tensors.iter().enumerate() {
        let users: Vec<&str> = prog
            .routines
            .iter()
            .zip(&used)
            .filter(|(_, names)| names.contains(&t.name.as_str()))
            .map(|(r, _)| r.name.as_str())
            .collect();
        let tn = make_tensor(t, &json_path!["tensors", i], base_dir, printed[i], &users)?;
        b.tensors.insert(t.name.as_str(), tn.clone());
        tensors.push((t.name.clone(), tn));
    }

    let mut routine_index: HashMap<&str, usize> = HashMap::new();
    let mut assignments = vec![];
    for (i, r) in prog.routines.iter().enumerate() {
        let path = json_path!["routines", i];
        if r.name.is_empty() {
            return Err(ProgramError::at(
                with(&path, json_path!["name"]),
                "a routine name must not be empty",
            ));
        }
        if routine_index.insert(r.name.as_str(), i).is_some() {
            return Err(ProgramError::at(
                with(&path, json_path!["name"]),
                format!("duplicate routine name {}", quote(&r.name)),
            ));
        }
        assignments.push(b.statements(&r.code, &with(&path, json_path!["code"]))?);
    }

    if prog.devices == Some(0) {
        return Err(ProgramError::at(
            json_path!["devices"],
            "a program needs at least one device",
        ));
    }
    if let Some(n) = prog.devices.filter(|&n| n > MAX_DEVICES) {
        return Err(ProgramError::at(
            json_path!["devices"],
            format!("{n} devices are too many (the limit is {MAX_DEVICES})"),
        ));
    }
    let backend = prog.backend.clone().unwrap_or_else(|| "multicore".into());
    if !matches!(backend.as_str(), "multicore" | "sync" | "mpi") {
        return Err(ProgramError::at(
            json_path!["backend"],
            format!(
                "unknown backend {}: expected \"multicore\", \"sync\" or \"mpi\"",
                quote(&backend)
            ),
        ));
    }
    if prog.backend.is_some() && prog.devices.is_none() {
        return Err(ProgramError::at(
            json_path!["backend"],
            "\"backend\" only applies to multi-device programs (add \"devices\": N)",
        ));
    }
    let env = PlanEnv {
        routines: &routine_index,
        bindings: &b.bindings,
        tensors: &b.tensors,
        devices: prog.devices.unwrap_or(1),
        multi: prog.devices.is_some(),
    };
    let (plan, executed_steps) = plan(&prog.run, &json_path!["run"], &env)?;
    let print = prog
        .print
        .iter()
        .map(|n| (n.clone(), b.tensors[n.as_str()].clone()))
        .collect();
    Ok(Built {
        tensors,
        bindings: b.bindings,
        routine_names: prog.routines.iter().map(|r| r.name.clone()).collect(),
        assignments,
        plan,
        executed_steps,
        print,
        devices: prog.devices,
        backend,
    })
}
