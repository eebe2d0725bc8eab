//! The optimizer: tracing, memory-mode inference, virtualization (inlining),
//! cleanup and simplification, turning lowered code into an [`Optimized`] routine body.

mod fuse;
mod gemm;
mod interleave;
mod loops;
mod parallel;
mod prefetch;
mod simplify;
mod taps;
mod trace;
mod vectorize;
mod virtualize;
mod vmerge;

pub use simplify::simplify;
pub use trace::{trace, TracedNode, TracedStore};

use crate::error::{Error, Result};
use crate::ir::tnode::provenance;
use crate::ir::{MemoryMode, MemoryModes, Tnode};
use crate::loops::{visit_llc, visit_values, Llc, Llv};

/// Knobs of the optimizer: [`Settings::default`] and the setters below (one per field, by the
/// field's name), for example `Settings::default().loop_opts(false)`.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Settings {
    /// Run virtualization and simplification at all (off: only memory-mode inference, so the
    /// code computes the same thing with every node materialized).
    pub enabled: bool,
    /// A node whose cells are read more often than this cannot be inlined.
    pub max_visits: usize,
    /// How many iterations of each loop tracing walks.
    pub max_tracing_dim: usize,
    /// The most points (iterations of the innermost statements) tracing walks per loop nest:
    /// past it, inner loops are walked for one iteration only, and tracing stays conservative
    /// about the iterations it skips (see [`trace()`]). Keeps tracing's cost bounded whatever the
    /// depth of a nest.
    pub max_tracing_points: usize,
    /// Inline scalar nodes computed only from constants, however often they are read.
    pub inline_scalar_constexprs: bool,
    /// A node whose computation costs more than this many operations per read (a large
    /// reduction) is materialized rather than inlined.
    pub max_inline_work: u64,
    /// A node whose computation runs reduction loops of more than this many iterations per
    /// read is materialized rather than inlined, however rarely it is read (inlined, the
    /// reduction would run innermost and scalar in its reader).
    pub max_inline_reduction: u64,
    /// Run the loop-nest passes (loop interchange for locality, kernels, fusion across
    /// statements).
    pub loop_opts: bool,
    /// Mark the loops whose iterations are independent as parallel regions, which a
    /// device's thread team splits among its threads (needs `loop_opts`). The code computes
    /// the same bits whatever the number of threads.
    pub parallel: bool,
    /// The least work (scalar operations and vector lanes, see [`crate::loops::parallel_work`])
    /// of a loop made a parallel region, and the work a block of a split reduction aims at.
    /// Below the default, starting the team costs more than the threads gain; tests set it
    /// to 0 to make every independent loop a region.
    pub min_region_work: u64,
    /// The vector target of the kernel passes (GEMM kernels for contractions); `None`: no
    /// vector kernels. The cc backend fills it with the resolved target when it is `None`.
    pub target: Option<crate::target::VectorTarget>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            enabled: true,
            max_visits: 1,
            max_tracing_dim: 5,
            max_tracing_points: 1 << 14,
            inline_scalar_constexprs: true,
            max_inline_work: 64,
            max_inline_reduction: 16,
            loop_opts: true,
            parallel: true,
            min_region_work: parallel::MIN_REGION_WORK,
            target: None,
        }
    }
}

impl Settings {
    /// Sets [`enabled`](Settings::enabled).
    pub fn enabled(mut self, enabled: bool) -> Settings {
        self.enabled = enabled;
        self
    }

    /// Sets [`max_visits`](Settings::max_visits).
    pub fn max_visits(mut self, max_visits: usize) -> Settings {
        self.max_visits = max_visits;
        self
    }

    /// Sets [`max_tracing_dim`](Settings::max_tracing_dim).
    pub fn max_tracing_dim(mut self, max_tracing_dim: usize) -> Settings {
        self.max_tracing_dim = max_tracing_dim;
        self
    }

    /// Sets [`max_tracing_points`](Settings::max_tracing_points).
    pub fn max_tracing_points(mut self, max_tracing_points: usize) -> Settings {
        self.max_tracing_points = max_tracing_points;
        self
    }

    /// Sets [`inline_scalar_constexprs`](Settings::inline_scalar_constexprs).
    pub fn inline_scalar_constexprs(mut self, inline_scalar_constexprs: bool) -> Settings {
        self.inline_scalar_constexprs = inline_scalar_constexprs;
        self
    }

    /// Sets [`max_inline_work`](Settings::max_inline_work).
    pub fn max_inline_work(mut self, max_inline_work: u64) -> Settings {
        self.max_inline_work = max_inline_work;
        self
    }

    /// Sets [`max_inline_reduction`](Settings::max_inline_reduction).
    pub fn max_inline_reduction(mut self, max_inline_reduction: u64) -> Settings {
        self.max_inline_reduction = max_inline_reduction;
        self
    }

    /// Sets [`loop_opts`](Settings::loop_opts).
    pub fn loop_opts(mut self, loop_opts: bool) -> Settings {
        self.loop_opts = loop_opts;
        self
    }

    /// Sets [`target`](Settings::target).
    pub fn target(mut self, target: Option<crate::target::VectorTarget>) -> Settings {
        self.target = target;
        self
    }

    /// Sets [`parallel`](Settings::parallel).
    pub fn parallel(mut self, parallel: bool) -> Settings {
        self.parallel = parallel;
        self
    }

    /// Sets [`min_region_work`](Settings::min_region_work).
    pub fn min_region_work(mut self, min_region_work: u64) -> Settings {
        self.min_region_work = min_region_work;
        self
    }
}

/// An optimized routine body.
#[derive(Clone, Debug)]
pub struct Optimized {
    /// The routine's name.
    pub name: String,
    /// The code before optimization (for dumps).
    pub unoptimized: Llc,
    /// The optimized code.
    pub code: Llc,
    /// What tracing found out about each node (before virtualization).
    pub traced_store: TracedStore,
    /// The node this routine reads from the merge buffer, if any.
    pub merge_node: Option<Tnode>,
    /// Nodes that remain in the code, with their final memory modes, in order of id.
    pub nodes: Vec<(Tnode, MemoryMode)>,
    /// Local arrays whose every element is written before it is read in each call (the
    /// kernel passes' packed panels): they need no zeroing.
    pub written_first: Vec<Tnode>,
    /// The memory-mode decisions about every node of the routine, with their provenance (the
    /// nodes themselves are never changed).
    pub modes: MemoryModes,
}

impl Optimized {
    /// The memory mode decided for a node of this routine (or its declaration).
    pub fn memory_mode(&self, tn: &Tnode) -> Option<MemoryMode> {
        self.modes.get(tn)
    }
}

/// Optimizes lowered code, starting from the nodes' declarations.
pub fn optimize(name: &str, code: Llc, settings: &Settings) -> Result<Optimized> {
    optimize_with(name, code, settings, &MemoryModes::new())
}

/// Optimizes lowered code, starting from the nodes' declarations refined by `known` (the
/// decisions of routines compiled before, so that every routine of a session agrees on where
/// a node lives; a contradiction is an error naming the node).
pub fn optimize_with(
    name: &str,
    code: Llc,
    settings: &Settings,
    known: &MemoryModes,
) -> Result<Optimized> {
    let mut modes = known.clone();
    let verify = |pass: &'static str, code: &Llc| -> Result<()> {
        if cfg!(debug_assertions) {
            crate::loops::verify(code).map_err(|msg| Error::Verifier {
                routine: name.to_string(),
                pass,
                msg,
            })?;
        }
        Ok(())
    };
    verify("lowering", &code)?;
    let unoptimized = code.clone();
    let traced_store = trace(&code, settings)?;
    // Reading two different nodes from the merge buffer is an error even if one read is dead.
    merge_node(&code)?;
    // Memory-mode decisions from tracing.
    for t in traced_store.nodes() {
        let tn = &t.tn;
        if t.read_only {
            modes.refine(tn, MemoryMode::Materialized, provenance::READ_ONLY)?;
        } else if t.is_recurrent {
            modes.refine(tn, MemoryMode::Materialized, provenance::RECURRENT)?;
        } else if t.max_visits > settings.max_visits
            && !(settings.inline_scalar_constexprs && t.is_scalar_constexpr)
        {
            modes.refine(tn, MemoryMode::NeverVirtual, provenance::TOO_MANY_VISITS)?;
        }
    }
    let mut locals: Vec<Tnode> = vec![];
    let mut written_first: Vec<Tnode> = vec![];
    let code = if settings.enabled {
        let code = virtualize::virtualize(
            code,
            &traced_store,
            settings.max_inline_work,
            settings.max_inline_reduction,
            &mut modes,
        )?;
        verify("virtualize", &code)?;
        let code = simplify(code);
        verify("simplify", &code)?;
        if settings.loop_opts {
            let r = loops::optimize_loops(code, settings.target.as_ref());
            verify("loop passes", &r.code)?;
            locals = r.locals;
            written_first = r.written_first;
            r.code
        } else {
            code
        }
    } else {
        code
    };
    // Cleanup: nodes written and never read here must persist; the rest default to the most
    // local compatible mode.
    let mut nodes = vec![];
    for t in traced_store.nodes() {
        let tn = &t.tn;
        // (A Local node never read, such as the snapshot of an in-place statement whose
        // reads are all skipped by affine guards, is dead, not an output.)
        if !t.read_only
            && t.reads == 0
            && !matches!(
                modes.get(tn),
                Some(MemoryMode::Virtual) | Some(MemoryMode::Local)
            )
        {
            modes.refine(tn, MemoryMode::Materialized, provenance::OUTPUT)?;
        }
        if !settings.enabled && modes.get(tn).is_none_or(|m| m.may_be_virtual()) {
            modes.refine(tn, MemoryMode::NeverVirtual, provenance::NOT_INLINABLE)?;
        }
        let mode = modes.finalize(tn)?;
        if mode == MemoryMode::Virtual && mentions(&code, tn) {
            return Err(Error::MemoryMode {
                node: tn.name(),
                msg: format!(
                    "it is Virtual but routine {name} still reads or writes it (it could not be inlined: \
                     a virtual node must be computed in the same routine, written before it is read, \
                     with every written index a loop iterator)"
                ),
            });
        }
        if mode != MemoryMode::Virtual {
            nodes.push((tn.clone(), mode));
        }
    }
    for t in &locals {
        modes.refine(t, MemoryMode::Local, provenance::KERNEL)?;
    }
    nodes.extend(locals.into_iter().map(|t| (t, MemoryMode::Local)));
    // Dead stores: local tensors written whole before they are read need no zero fill.
    let whole = fuse::full_writes(&code);
    let local_nodes = local_set(&nodes);
    let dead_fills: Vec<Tnode> = whole
        .iter()
        .filter(|t| local_nodes.contains(*t) && !written_first.contains(*t))
        .cloned()
        .collect();
    written_first.extend(dead_fills);
    let code = if settings.enabled && settings.loop_opts {
        let f = fuse::fuse(code, &local_nodes, &whole);
        verify("fusion", &f.code)?;
        nodes.retain(|(t, _)| !f.replaced.contains(t));
        for t in &f.locals {
            modes.refine(t, MemoryMode::Local, provenance::FUSED)?;
        }
        written_first.extend(f.locals.iter().cloned());
        nodes.extend(f.locals.into_iter().map(|t| (t, MemoryMode::Local)));
        f.code
    } else {
        code
    };
    // Explicit vector loops, last: on the fused loops, whose rows stay in L1.
    let code = match settings.target {
        Some(t) if settings.enabled && settings.loop_opts && t.vector_bytes >= 16 => {
            let v = vectorize::vectorize(code, &t);
            verify("vectorize", &v.code)?;
            let merged = vmerge::merge(v.code);
            verify("vector merge", &merged)?;
            for tn in &v.locals {
                modes.refine(tn, MemoryMode::Local, provenance::KERNEL)?;
            }
            written_first.extend(v.written_first);
            nodes.extend(v.locals.into_iter().map(|t| (t, MemoryMode::Local)));
            merged
        }
        _ => code,
    };
    // Prefetches of the rows that multi-pass row loops read and write, on the loops as the
    // kernels, fusion and vectorization left them.
    let code = match settings.target {
        Some(t) if settings.enabled && settings.loop_opts => {
            let is_local = |tn: &Tnode| {
                nodes
                    .iter()
                    .any(|(n, m)| n == tn && *m == MemoryMode::Local)
            };
            let p = prefetch::prefetch(code, &is_local, &t);
            verify("prefetch", &p)?;
            p
        }
        _ => code,
    };
    // Short row loops interleaved, on the loops as the passes before left them.
    let code = match settings.target {
        Some(t) if settings.enabled && settings.loop_opts && t.vector_bytes >= 16 => {
            let i = interleave::interleave(code, &local_set(&nodes), &t);
            verify("interleave", &i.code)?;
            for (copy, original) in i.locals {
                let made_by = copy
                    .declared_memory_mode()
                    .map_or(provenance::KERNEL, |(_, p)| p);
                modes.refine(&copy, MemoryMode::Local, made_by)?;
                if written_first.contains(&original) {
                    written_first.push(copy.clone());
                }
                nodes.push((copy, MemoryMode::Local));
            }
            i.code
        }
        _ => code,
    };
    // Parallel regions, the very last: loops as the kernels, fusion and vectorization left
    // them.
    let code = if settings.enabled && settings.loop_opts && settings.parallel {
        let cores = settings.target.map_or(1, |t| t.cores);
        let p = parallel::parallelize(code, &local_set(&nodes), settings.min_region_work, cores);
        verify("parallel", &p.code)?;
        for t in &p.locals {
            modes.refine(t, MemoryMode::Local, provenance::PARALLEL)?;
        }
        written_first.extend(p.locals.iter().cloned());
        nodes.extend(p.locals.into_iter().map(|t| (t, MemoryMode::Local)));
        p.code
    } else {
        code
    };
    // The decisions this routine made or relied on, about its own nodes.
    let mine: std::collections::HashSet<Tnode> = traced_store
        .nodes()
        .map(|t| t.tn.clone())
        .chain(nodes.iter().map(|(t, _)| t.clone()))
        .collect();
    modes.retain(|t| mine.contains(t));
    nodes.sort_by(|a, b| a.0.cmp(&b.0));
    let merge_node = merge_node(&code)?;
    Ok(Optimized {
        name: name.to_string(),
        unoptimized,
        code,
        traced_store,
        merge_node,
        nodes,
        written_first,
        modes,
    })
}

/// The nodes of `nodes` that are local arrays of the routine.
fn local_set(nodes: &[(Tnode, MemoryMode)]) -> std::collections::HashSet<Tnode> {
    nodes
        .iter()
        .filter(|(_, m)| *m == MemoryMode::Local)
        .map(|(t, _)| t.clone())
        .collect()
}

fn merge_node(code: &Llc) -> Result<Option<Tnode>> {
    let mut found: Option<Tnode> = None;
    let mut err = None;
    visit_values(code, &mut |v| {
        if let Llv::GetMergeBuffer(tn, _) = v {
            match &found {
                Some(f) if f != tn => {
                    err = Some(Error::Assignment(format!(
                        "a routine can read only one node from the merge buffer, but it reads both {} and {}",
                        f.name(),
                        tn.name()
                    )))
                }
                _ => found = Some(tn.clone()),
            }
        }
    });
    match err {
        Some(e) => Err(e),
        None => Ok(found),
    }
}

/// Whether the code reads or writes `tn` from its own array.
fn mentions(code: &Llc, tn: &Tnode) -> bool {
    let mut hit = false;
    visit_llc(code, &mut |c| match c {
        Llc::Set { tn: t, .. } | Llc::ZeroOut(t) | Llc::Lookup { tn: t, .. } if t == tn => {
            hit = true
        }
        _ => {}
    });
    visit_values(code, &mut |v| {
        if let Llv::Get(t, _) = v {
            if t == tn {
                hit = true
            }
        }
    });
    hit
}
