//! Instantiation of a program with fresh nodes and the ways of running it: compiled (optimizer
//! on and off), interpreted, and the optimized loop IR interpreted.

use super::program::{Kind, Op, Program, Stmt};
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
            Kind::Output => {
                let tn = Tnode::new(&[&t.name], &t.dims, t.prec).unwrap();
                tn.ensure_hosted().unwrap();
                tn
            }
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
        })
        .collect();
    let asgns = Assignments::block(&format!("case {}", p.seed), Assignments::seq(stmts));
    Instance {
        tnodes,
        statics,
        asgns,
    }
}

/// Values of the hosted tensors: `[run][hosted tensor][cell]`.
pub type Outputs = Vec<Vec<Vec<f64>>>;

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
                .map(|&i| mem.get(&inst.tnodes[i]).map(<[f64]>::to_vec))
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
                    mem.get(&inst.tnodes[i])
                        .map(<[f64]>::to_vec)
                        .unwrap_or_else(|| vec![0.0; inst.tnodes[i].numel()])
                })
                .collect(),
        );
    }
    Ok(out)
}

/// A compiled run of one case: the outputs, the optimized code and the instance it ran on.
pub type Compiled = Result<(Outputs, Optimized, Instance), String>;

/// (a) / (c): compiles the cases in one batch (one C file) and runs each; on a compile
/// failure, retries case by case (with fresh nodes) to find the culprit.
pub fn run_compiled(progs: &[&Program], settings: &Settings) -> Vec<Compiled> {
    let insts: Vec<Instance> = progs.iter().map(|p| instantiate(p)).collect();
    let backend = CcBackend::with_settings(settings.clone());
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
                .flat_map(|p| run_compiled(&[p], settings))
                .collect()
        }
    };
    let optimized = batch.optimized();
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
                    snap.push(tn.host_values().ok_or("not hosted")?);
                }
                outs.push(snap);
            }
            Ok(outs)
        };
        let o = optimized[k].cloned();
        out.push(match (run(), o) {
            (Ok(v), Some(o)) => Ok((v, o, inst)),
            (Err(e), _) => Err(e),
            (Ok(_), None) => Err("no optimized code".into()),
        });
    }
    out
}
