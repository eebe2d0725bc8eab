//! Instantiation of a program with fresh nodes and the ways of running it: compiled (optimizer
//! on and off), interpreted, and the optimized loop IR interpreted.

use super::case::{Kind, Op, Program, Stmt};
use arrayjit::backend::{CcBackend, Config, MergeBuffer};
use arrayjit::interp::{self, Memory};
use arrayjit::ir::einsum::projections;
use arrayjit::ir::{Assignments, Bindings, Buffer, FetchOp, InitOp, StaticSymbol, Tnode};
use arrayjit::optimize::{Optimized, Settings};

pub struct Instance {
    pub tnodes: Vec<Tnode>,
    pub statics: Vec<StaticSymbol>,
    pub asgns: Assignments,
}

pub fn instantiate(p: &Program) -> Instance {
    let tnodes: Vec<Tnode> = p
        .tensors
        .iter()
        .map(|t| match t.kind {
            Kind::Input => Tnode::with_init(
                &[&t.name],
                &t.dims,
                t.prec,
                &InitOp::ConstantFill {
                    values: t.init.clone(),
                    strict: true,
                },
            )
            .unwrap(),
            Kind::Output => Tnode::hosted(&[&t.name], &t.dims, t.prec).unwrap(),
            Kind::Temp => Tnode::new(&[&t.name], &t.dims, t.prec).unwrap(),
        })
        .collect();
    let statics: Vec<StaticSymbol> = p
        .statics
        .iter()
        .map(|(n, r)| StaticSymbol::new(n, Some(*r)))
        .collect();
    let bindings = Bindings(statics.clone());
    let node = |i: usize| tnodes[i].clone();
    let stmts: Vec<Assignments> = p
        .stmts
        .iter()
        .map(|s| match s {
            Stmt::Accum {
                lhs,
                accum,
                init,
                op,
                args,
                logic,
                ..
            } => {
                let rhs: Vec<&[usize]> = args.iter().map(|&i| tnodes[i].dims()).collect();
                let projections = projections(logic, tnodes[*lhs].dims(), &rhs, &bindings)
                    .unwrap_or_else(|e| panic!("seed {}: {e}", p.seed));
                match op {
                    Op::Un(u) => Assignments::AccumUnop {
                        initialize_neutral: *init,
                        accum: *accum,
                        op: *u,
                        lhs: node(*lhs),
                        rhs: Buffer::Node(node(args[0])),
                        projections,
                    },
                    Op::Bin(b) => Assignments::AccumBinop {
                        initialize_neutral: *init,
                        accum: *accum,
                        op: *b,
                        lhs: node(*lhs),
                        rhs1: Buffer::Node(node(args[0])),
                        rhs2: Buffer::Node(node(args[1])),
                        projections,
                    },
                    Op::Tern(t) => Assignments::AccumTernop {
                        initialize_neutral: *init,
                        accum: *accum,
                        op: *t,
                        lhs: node(*lhs),
                        rhs1: Buffer::Node(node(args[0])),
                        rhs2: Buffer::Node(node(args[1])),
                        rhs3: Buffer::Node(node(args[2])),
                        projections,
                    },
                }
            }
            Stmt::Const { lhs, c } => Assignments::Fetch {
                array: node(*lhs),
                fetch_op: FetchOp::Constant(*c),
            },
            Stmt::Slice { lhs, src, stat } => Assignments::Fetch {
                array: node(*lhs),
                fetch_op: FetchOp::Slice {
                    batch_idx: statics[*stat].clone(),
                    sliced: node(*src),
                },
            },
            Stmt::Embed { lhs, stat } => Assignments::Fetch {
                array: node(*lhs),
                fetch_op: FetchOp::EmbedSymbol(statics[*stat].clone()),
            },
            Stmt::Random { lhs, seed } => Assignments::Fetch {
                array: node(*lhs),
                fetch_op: FetchOp::Random { seed: *seed },
            },
            Stmt::Gather { lhs, table, index } => Assignments::Gather {
                lhs: node(*lhs),
                table: node(*table),
                index: node(*index),
            },
            Stmt::Scatter { lhs, src, index } => Assignments::ScatterAdd {
                lhs: node(*lhs),
                src: node(*src),
                index: node(*index),
            },
        })
        .collect();
    let asgns = Assignments::block(&format!("case {}", p.seed), Assignments::seq(stmts));
    Instance {
        tnodes,
        statics,
        asgns,
    }
}

/// Values of the hosted tensors: `[run][hosted tensor][cell]`. A 64-bit integer tensor's
/// cells are followed by their values modulo 2^32, so that values beyond 2^53 (which `f64`
/// rounds) are compared exactly too.
pub type Outputs = Vec<Vec<Vec<f64>>>;

/// `values` of a node, with the low 32 bits of `ints` appended for 64-bit integers.
pub fn with_exact(tn: &Tnode, mut values: Vec<f64>, ints: Option<Vec<i128>>) -> Vec<f64> {
    if tn.prec().int_bits() == Some(64) {
        let ints = ints.unwrap_or_else(|| values.iter().map(|&v| v as i128).collect());
        values.extend(ints.iter().map(|&v| (v as u64 & 0xffff_ffff) as f64));
    }
    values
}

/// The host values of a node (exact for 64-bit integers, see [`Outputs`]).
pub fn host_snapshot(tn: &Tnode) -> Option<Vec<f64>> {
    let ints = tn.with_host(|a| (0..a.len()).map(|i| a.get_int(i).unwrap_or(0)).collect());
    Some(with_exact(tn, tn.host_values()?, ints))
}

/// The interpreter's values of a node (exact for 64-bit integers, see [`Outputs`]).
pub fn mem_snapshot(mem: &Memory, tn: &Tnode) -> Option<Vec<f64>> {
    Some(with_exact(tn, mem.get(tn)?.to_vec(), mem.get_int(tn)))
}

pub fn statics_for(inst: &Instance, run: &[i64]) -> Vec<(StaticSymbol, i64)> {
    inst.statics
        .iter()
        .cloned()
        .zip(run.iter().copied())
        .collect()
}

/// (b): the interpreter on the unoptimized loop IR.
pub fn run_interp(p: &Program, inst: &Instance) -> Result<Outputs, String> {
    let mut mem = Memory::new();
    mem.load_from_hosts(&inst.tnodes);
    let hosted = p.hosted();
    let mut out = vec![];
    for run in &p.runs {
        interp::run_assignments(&inst.asgns, &statics_for(inst, run), &mut mem)
            .map_err(|e| format!("interpreter: {e}"))?;
        out.push(
            hosted
                .iter()
                .map(|&i| mem_snapshot(&mem, &inst.tnodes[i]))
                .collect::<Option<Vec<_>>>()
                .ok_or("interpreter: a hosted tensor is missing from memory")?,
        );
    }
    Ok(out)
}

/// (d): the interpreter on the optimized loop IR of a compiled instance.
pub fn run_interp_optimized(
    p: &Program,
    inst: &Instance,
    o: &Optimized,
) -> Result<Outputs, String> {
    let mut mem = Memory::new();
    for (t, tn) in p.tensors.iter().zip(&inst.tnodes) {
        if t.kind == Kind::Input {
            mem.set(tn, t.init.clone()).map_err(|e| e.to_string())?;
        }
    }
    let hosted = p.hosted();
    let mut out = vec![];
    for run in &p.runs {
        interp::run_optimized(o, &statics_for(inst, run), &mut mem)
            .map_err(|e| format!("interpreter on the optimized code: {e}"))?;
        out.push(
            hosted
                .iter()
                .map(|&i| {
                    let tn = &inst.tnodes[i];
                    mem_snapshot(&mem, tn)
                        .unwrap_or_else(|| with_exact(tn, vec![0.0; tn.numel()], None))
                })
                .collect(),
        );
    }
    Ok(out)
}

/// A compiled run of one case: the outputs, the optimized code and the instance it ran on.
pub type Compiled = Result<CompiledCase, String>;

/// A compiled case that ran.
pub struct CompiledCase {
    pub outputs: Outputs,
    pub optimized: Optimized,
    pub inst: Instance,
    /// Whether one of the routine's C functions reads a vector variable before assigning
    /// it ([`uninitialized_vectors`]).
    pub uninit_vectors: bool,
}

/// The C functions of `source` that read a vector variable (`vecN`) before assigning it: a
/// vector statement cut off from the statements that set its inputs, when a routine is split
/// into functions (`regression_gemm_kernel_split_across_parts`). A function's first textual
/// use of a variable is its first use in execution order (the code has no jumps back except
/// loops, and a loop's first iteration runs the text in order); that use must be a statement
/// `vecN = ...` whose right-hand side does not read `vecN`.
pub fn uninitialized_vectors(source: &str) -> Vec<String> {
    let mut bad = vec![];
    // The function being read: its name, the variables seen so far, whether one was read
    // before being assigned.
    let mut current: Option<(String, Vec<String>, bool)> = None;
    for line in source.lines() {
        if let Some(rest) = line.strip_prefix("static int ") {
            let name = rest.split('(').next().unwrap_or("").to_string();
            current = Some((name, vec![], false));
            continue;
        }
        if line == "}" {
            if let Some((name, _, true)) = current.take() {
                bad.push(name);
            }
            continue;
        }
        let Some((_, seen, found)) = current.as_mut() else {
            continue;
        };
        let t = line.trim();
        // Declarations (`__m512 vec3;`, `float32x4_t vec3;`, `aj_v4sf vec3;`): two words.
        let decl: Vec<&str> = t.trim_end_matches(';').split_whitespace().collect();
        if t.ends_with(';')
            && decl.len() == 2
            && decl[0]
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'_')
            && vector_words(decl[1]).len() == 1
        {
            continue;
        }
        let words = vector_words(t);
        for (k, (pos, w)) in words.iter().enumerate() {
            if seen.contains(w) {
                continue;
            }
            seen.push(w.clone());
            let assigned = k == 0
                && *pos == 0
                && t[w.len()..].trim_start().starts_with("= ")
                && !words[1..].iter().any(|(_, x)| x == w);
            *found |= !assigned;
        }
    }
    bad
}

/// The vector variables (`vecN`) a line of C mentions, with their byte positions.
fn vector_words(t: &str) -> Vec<(usize, String)> {
    let b = t.as_bytes();
    let mut out = vec![];
    let mut i = 0;
    while let Some(off) = t[i..].find("vec") {
        let at = i + off;
        let mut end = at + 3;
        while end < b.len() && b[end].is_ascii_digit() {
            end += 1;
        }
        let starts_word = at == 0 || !(b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_');
        let ends_word = end == b.len() || !(b[end].is_ascii_alphanumeric() || b[end] == b'_');
        if end > at + 3 && starts_word && ends_word {
            out.push((at, t[at..end].to_string()));
        }
        i = end;
    }
    out
}

/// The threads running the parallel regions of the compiled runs (more than the cores of
/// most test machines: chunks of one region then interleave on a core too).
pub const REGION_THREADS: usize = 3;

/// (a) / (c): compiles the cases in one batch (one C file) and runs each; on a compile
/// failure, retries case by case (with fresh nodes) to find the culprit. With `checked`, the
/// code is bounds-checked: an out-of-bounds access fails its case with the error naming the
/// tensor, the indices and the extents.
pub fn run_compiled(progs: &[&Program], settings: &Settings, checked: bool) -> Vec<Compiled> {
    let insts: Vec<Instance> = progs.iter().map(|p| instantiate(p)).collect();
    // Programs may read tensors no statement writes (zeros, as the interpreter reads them).
    let backend = CcBackend::with_settings(settings.clone())
        .with_checked(checked)
        .with_strict(false)
        .with_threads(REGION_THREADS);
    backend.initialize(Config::default());
    let bindings = Bindings(insts.iter().flat_map(|i| i.statics.clone()).collect());
    let names: Vec<String> = progs.iter().map(|p| format!("case_{}", p.seed)).collect();
    let asgns: Vec<Assignments> = insts.iter().map(|i| i.asgns.clone()).collect();
    let linked = backend
        .compile_batch(true, Some(&names), None, &bindings, &asgns)
        .and_then(|batch| {
            let ctx = backend.init("differential")?;
            let (ctx, routines) = backend.link_batch(&[], &MergeBuffer::new(), &ctx, &batch)?;
            Ok((batch, ctx, routines))
        });
    let (batch, ctx, routines) = match linked {
        Ok(x) => x,
        Err(e) if progs.len() == 1 => return vec![Err(format!("compile/link: {e}"))],
        Err(_) => {
            return progs
                .iter()
                .flat_map(|p| run_compiled(&[p], settings, checked))
                .collect()
        }
    };
    let optimized = batch.optimized();
    let uninit = uninitialized_vectors(batch.source());
    let mut out = vec![];
    for (k, (p, inst)) in progs.iter().zip(insts).enumerate() {
        let run = || -> Result<Outputs, String> {
            let r = routines[k]
                .as_ref()
                .ok_or("routine missing from the batch")?;
            let hosted = p.hosted();
            for &i in &hosted {
                backend
                    .from_host(&ctx, &inst.tnodes[i])
                    .map_err(|e| e.to_string())?;
            }
            let mut outs = vec![];
            for vals in &p.runs {
                for (s, &v) in inst.statics.iter().zip(vals) {
                    r.bindings().set_symbol(s, v).map_err(|e| e.to_string())?;
                }
                r.run().map_err(|e| format!("run: {e}"))?;
                let mut snap = vec![];
                for &i in &hosted {
                    let tn = &inst.tnodes[i];
                    backend.to_host(&ctx, tn).map_err(|e| e.to_string())?;
                    snap.push(host_snapshot(tn).ok_or("not hosted")?);
                }
                outs.push(snap);
            }
            Ok(outs)
        };
        let o = optimized[k].cloned();
        out.push(match (run(), o) {
            (Ok(v), Some(o)) => Ok(CompiledCase {
                outputs: v,
                optimized: o,
                inst,
                uninit_vectors: {
                    let prefix = format!("case_{}_routine", p.seed);
                    uninit.iter().any(|f| f.starts_with(&prefix))
                },
            }),
            (Err(e), _) => Err(e),
            (Ok(_), None) => Err("no optimized code".into()),
        });
    }
    out
}
