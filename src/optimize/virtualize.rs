//! Virtualization: inlining nodes computed and consumed within one routine.
//!
//! The routine is a list of top-level statements (loop nests, zero-outs, comments). A node
//! `tn` is inlined when:
//! - its memory mode still allows `Virtual`;
//! - every statement writing it writes only through indices that are distinct loop iterators
//!   spanning their axes (or 0 on axes of extent 1), and reads it only at those same indices
//!   (its own accumulation);
//! - every statement reading it comes after the last statement writing it;
//! - no node its computation reads is written between its first write and its last read.
//!
//! Each read `tn[ridx]` then becomes a `Local_scope` that re-runs the computation with the
//! written iterators replaced by `ridx` (reduction loops are kept, with fresh iterators), and
//! the statements that computed `tn` disappear.

use super::TracedStore;
use crate::error::Result;
use crate::ir::tnode::provenance;
use crate::ir::{AxisIndex, MemoryMode, MemoryModes, Symbol, Tnode};
use crate::loops::{Llc, Llv, ScopeId};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};

/// For a statement writing a node: which written iterator indexes which axis.
type Pattern = HashMap<Symbol, usize>;

static NEXT_SCOPE: AtomicU32 = AtomicU32::new(1);

fn fresh_scope(tn: &Tnode) -> ScopeId {
    ScopeId {
        tn: tn.clone(),
        id: NEXT_SCOPE.fetch_add(1, Ordering::Relaxed),
    }
}

/// Nodes written by a statement (own arrays only).
fn writes_of(c: &Llc, out: &mut HashSet<Tnode>) {
    crate::loops::visit_llc(c, &mut |c| {
        if let Llc::Set { tn, .. } | Llc::ZeroOut(tn) = c {
            out.insert(tn.clone());
        }
    });
}

/// Nodes read by a statement (own arrays only), the index reads of lookups included.
fn reads_of(c: &Llc, out: &mut HashSet<Tnode>) {
    crate::loops::visit_values(c, &mut |v| {
        if let Llv::Get(tn, _) = v {
            out.insert(tn.clone());
        }
    });
    crate::loops::visit_llc(c, &mut |c| {
        if let Llc::Lookup { tn, .. } = c {
            out.insert(tn.clone());
        }
    });
}

/// Whether a statement reads `tn` inside a guard ([`Llc::If`], from affine indices) or a
/// lookup ([`Llc::Lookup`], from gather and scatter-add), or reads its index in a lookup:
/// such nodes stay materialized (an inlined computation is only ever substituted into
/// values, and a row chosen by data is not a pattern the tracer can count visits of).
fn reads_under_guard(c: &Llc, tn: &Tnode) -> bool {
    let mut found = false;
    crate::loops::visit_llc(c, &mut |c| {
        if let Llc::If { body, .. } | Llc::Lookup { body, .. } = c {
            let mut r = HashSet::new();
            reads_of(body, &mut r);
            found |= r.contains(tn);
        }
        if let Llc::Lookup { tn: index, .. } = c {
            found |= index == tn;
        }
    });
    found
}

/// Checks the shape of a statement writing `tn`; returns the map from written iterators to
/// axes, or None if the statement cannot be inlined.
fn writer_pattern(stmt: &Llc, tn: &Tnode) -> Option<HashMap<Symbol, usize>> {
    let mut map: HashMap<Symbol, usize> = HashMap::new();
    let mut ok = true;
    fn go(
        c: &Llc,
        tn: &Tnode,
        loops: &mut Vec<(Symbol, i64, i64)>,
        map: &mut HashMap<Symbol, usize>,
        ok: &mut bool,
    ) {
        match c {
            Llc::Seq(v) => v.iter().for_each(|c| go(c, tn, loops, map, ok)),
            Llc::For {
                index,
                from,
                to,
                body,
                ..
            } => {
                loops.push((*index, *from, *to));
                go(body, tn, loops, map, ok);
                loops.pop();
            }
            Llc::Parallel(p) => {
                loops.push((p.index, p.from, p.to));
                go(&p.body, tn, loops, map, ok);
                loops.pop();
            }
            Llc::Set { tn: t, idcs, value } if t == tn => {
                let mut seen = HashSet::new();
                for (axis, (ix, &d)) in idcs.iter().zip(tn.dims()).enumerate() {
                    match ix {
                        AxisIndex::Fixed(0) if d == 1 => {}
                        AxisIndex::Iterator(s) => {
                            let spans = loops
                                .iter()
                                .any(|&(l, f, to)| l == *s && f == 0 && to == d as i64 - 1);
                            if !spans
                                || !seen.insert(*s)
                                || map.insert(*s, axis).is_some_and(|a| a != axis)
                            {
                                *ok = false;
                            }
                        }
                        _ => *ok = false,
                    }
                }
                // Reads of tn in its own value must be at the written indices.
                let stmt = Llc::SetLocal(fresh_scope(tn), value.clone());
                crate::loops::visit_values(&stmt, &mut |v| match v {
                    Llv::Get(t2, i2) if t2 == tn && i2 != idcs => *ok = false,
                    Llv::GetMergeBuffer(t2, _) if t2 == tn => *ok = false,
                    // The inliner renames iterators, not the terms of linear indices (e.g. a
                    // read from a fusion buffer): such computations stay materialized.
                    Llv::Get(_, i2) | Llv::GetMergeBuffer(_, i2)
                        if i2.iter().any(|i| matches!(i, AxisIndex::Linear(_))) =>
                    {
                        *ok = false
                    }
                    Llv::EmbedIndex(AxisIndex::Linear(_)) => *ok = false,
                    // Nor those of a random value's cell (an inlined random fetch read
                    // through an affine index).
                    Llv::Random { idcs, .. }
                        if idcs.iter().any(|i| matches!(i, AxisIndex::Linear(_))) =>
                    {
                        *ok = false
                    }
                    _ => {}
                });
            }
            Llc::ZeroOut(t) if t == tn => {}
            // Writes under a guard (affine indices) or a lookup (gather, scatter-add) skip
            // points: never inlined.
            Llc::If { .. } | Llc::Lookup { .. } => *ok = false,
            Llc::Set { value, .. } | Llc::SetLocal(_, value) => {
                // Another node written in the same statement, or tn read outside its writes.
                let _ = value;
                *ok = false;
            }
            // Vector code (from the kernel passes, which run later) is never inlined.
            Llc::ZeroOut(_) | Llc::VSet(..) | Llc::VStore { .. } => *ok = false,
            Llc::Noop | Llc::Comment(_) | Llc::Prefetch { .. } => {}
        }
    }
    go(stmt, tn, &mut vec![], &mut map, &mut ok);
    ok.then_some(map)
}

/// Substitutes indices and renames loops while copying a computation into a local scope.
struct Inliner<'a> {
    tn: &'a Tnode,
    scope: ScopeId,
    subst: HashMap<Symbol, AxisIndex>,
    scopes: HashMap<u32, ScopeId>,
}

impl Inliner<'_> {
    fn idx(&self, i: &AxisIndex) -> AxisIndex {
        match i {
            AxisIndex::Iterator(s) => self.subst.get(s).copied().unwrap_or(*i),
            f => *f,
        }
    }

    fn idcs(&self, v: &[AxisIndex]) -> Vec<AxisIndex> {
        v.iter().map(|i| self.idx(i)).collect()
    }

    fn scope_id(&mut self, id: &ScopeId) -> ScopeId {
        self.scopes
            .entry(id.id)
            .or_insert_with(|| fresh_scope(&id.tn))
            .clone()
    }

    /// Copies a statement writing `tn` as statements of the local scope.
    fn stmt(&mut self, c: &Llc, written: &HashMap<Symbol, usize>, ridx: &[AxisIndex]) -> Llc {
        match c {
            Llc::Seq(v) => Llc::Seq(v.iter().map(|c| self.stmt(c, written, ridx)).collect()),
            Llc::For {
                index,
                from,
                to,
                body,
                trace_it,
            } => {
                if let Some(&axis) = written.get(index) {
                    self.subst.insert(*index, ridx[axis]);
                    let b = self.stmt(body, written, ridx);
                    self.subst.remove(index);
                    b
                } else {
                    let fresh = Symbol::fresh();
                    self.subst.insert(*index, AxisIndex::Iterator(fresh));
                    let b = self.stmt(body, written, ridx);
                    self.subst.remove(index);
                    Llc::For {
                        index: fresh,
                        from: *from,
                        to: *to,
                        body: Box::new(b),
                        trace_it: *trace_it,
                    }
                }
            }
            Llc::Set { tn, idcs, value } if tn == self.tn => {
                let v = self.value_own(value, idcs);
                Llc::SetLocal(self.scope.clone(), v)
            }
            Llc::ZeroOut(tn) if tn == self.tn => {
                Llc::SetLocal(self.scope.clone(), Llv::Constant(0.0))
            }
            Llc::Set { tn, idcs, value } => Llc::Set {
                tn: tn.clone(),
                idcs: self.idcs(idcs),
                value: self.value(value),
            },
            Llc::SetLocal(id, value) => {
                let id = self.scope_id(id);
                Llc::SetLocal(id, self.value(value))
            }
            Llc::ZeroOut(t) => Llc::ZeroOut(t.clone()),
            // Never inside an inlined computation (see `writer_pattern`; parallel regions
            // come after virtualization).
            Llc::If { .. }
            | Llc::Parallel(_)
            | Llc::Lookup { .. }
            | Llc::Noop
            | Llc::Comment(_)
            | Llc::VSet(..)
            | Llc::VStore { .. }
            | Llc::Prefetch { .. } => Llc::Noop,
        }
    }

    fn value_own(&mut self, v: &Llv, own_idcs: &[AxisIndex]) -> Llv {
        match v {
            Llv::Get(t, i) if t == self.tn && i == own_idcs => Llv::GetLocal(self.scope.clone()),
            Llv::Binop(op, a, b) => Llv::Binop(
                *op,
                Box::new(self.value_own(a, own_idcs)),
                Box::new(self.value_own(b, own_idcs)),
            ),
            Llv::Unop(op, a) => Llv::Unop(*op, Box::new(self.value_own(a, own_idcs))),
            Llv::Ternop(op, a, b, c) => Llv::Ternop(
                *op,
                Box::new(self.value_own(a, own_idcs)),
                Box::new(self.value_own(b, own_idcs)),
                Box::new(self.value_own(c, own_idcs)),
            ),
            v => self.value(v),
        }
    }

    fn value(&mut self, v: &Llv) -> Llv {
        match v {
            Llv::LocalScope {
                id,
                body,
                orig_indices,
            } => {
                let id = self.scope_id(id);
                let no_written = HashMap::new();
                Llv::LocalScope {
                    id,
                    body: Box::new(self.stmt(body, &no_written, &[])),
                    orig_indices: self.idcs(orig_indices),
                }
            }
            Llv::GetLocal(id) => Llv::GetLocal(self.scope_id(id)),
            Llv::Get(t, i) => Llv::Get(t.clone(), self.idcs(i)),
            Llv::GetMergeBuffer(t, i) => Llv::GetMergeBuffer(t.clone(), self.idcs(i)),
            Llv::Binop(op, a, b) => {
                Llv::Binop(*op, Box::new(self.value(a)), Box::new(self.value(b)))
            }
            Llv::Unop(op, a) => Llv::Unop(*op, Box::new(self.value(a))),
            Llv::EmbedIndex(i) => Llv::EmbedIndex(self.idx(i)),
            Llv::Ternop(op, a, b, c) => Llv::Ternop(
                *op,
                Box::new(self.value(a)),
                Box::new(self.value(b)),
                Box::new(self.value(c)),
            ),
            Llv::Random {
                seed,
                idcs,
                dims,
                prec,
            } => Llv::Random {
                seed: *seed,
                idcs: self.idcs(idcs),
                dims: dims.clone(),
                prec: *prec,
            },
            Llv::GetCFunction(_) | Llv::Constant(_) => v.clone(),
        }
    }
}

/// The computation of `tn` as a local scope read at `ridx`.
fn local_scope(tn: &Tnode, writers: &[(Llc, HashMap<Symbol, usize>)], ridx: &[AxisIndex]) -> Llv {
    let scope = fresh_scope(tn);
    let mut inl = Inliner {
        tn,
        scope: scope.clone(),
        subst: HashMap::new(),
        scopes: HashMap::new(),
    };
    let body: Vec<Llc> = writers.iter().map(|(c, w)| inl.stmt(c, w, ridx)).collect();
    Llv::LocalScope {
        id: scope,
        body: Box::new(Llc::Seq(body)),
        orig_indices: ridx.to_vec(),
    }
}

/// Replaces every read of `tn` in a statement by its local scope.
fn replace_reads(c: Llc, tn: &Tnode, writers: &[(Llc, HashMap<Symbol, usize>)]) -> Llc {
    fn go_v(v: Llv, tn: &Tnode, w: &[(Llc, HashMap<Symbol, usize>)]) -> Llv {
        match v {
            Llv::Get(t, i) if &t == tn => local_scope(tn, w, &i),
            Llv::LocalScope {
                id,
                body,
                orig_indices,
            } => Llv::LocalScope {
                id,
                body: Box::new(replace_reads(*body, tn, w)),
                orig_indices,
            },
            Llv::Binop(op, a, b) => {
                Llv::Binop(op, Box::new(go_v(*a, tn, w)), Box::new(go_v(*b, tn, w)))
            }
            Llv::Unop(op, a) => Llv::Unop(op, Box::new(go_v(*a, tn, w))),
            Llv::Ternop(op, a, b, c) => Llv::Ternop(
                op,
                Box::new(go_v(*a, tn, w)),
                Box::new(go_v(*b, tn, w)),
                Box::new(go_v(*c, tn, w)),
            ),
            v => v,
        }
    }
    match c {
        Llc::Seq(v) => Llc::Seq(
            v.into_iter()
                .map(|c| replace_reads(c, tn, writers))
                .collect(),
        ),
        Llc::For {
            index,
            from,
            to,
            body,
            trace_it,
        } => Llc::For {
            index,
            from,
            to,
            body: Box::new(replace_reads(*body, tn, writers)),
            trace_it,
        },
        Llc::Set { tn: t, idcs, value } => Llc::Set {
            tn: t,
            idcs,
            value: go_v(value, tn, writers),
        },
        Llc::SetLocal(id, value) => Llc::SetLocal(id, go_v(value, tn, writers)),
        Llc::If { guards, body } => Llc::If {
            guards,
            body: Box::new(replace_reads(*body, tn, writers)),
        },
        Llc::Lookup {
            symbol,
            tn: index,
            idcs,
            extent,
            body,
        } => Llc::Lookup {
            symbol,
            tn: index,
            idcs,
            extent,
            body: Box::new(replace_reads(*body, tn, writers)),
        },
        c => c,
    }
}

/// Why a node could not be inlined, if it could not.
fn inlinable(
    stmts: &[Llc],
    tn: &Tnode,
) -> std::result::Result<Vec<(usize, Pattern)>, &'static str> {
    let mut writers = vec![];
    let mut readers = vec![];
    for (i, s) in stmts.iter().enumerate() {
        let mut w = HashSet::new();
        writes_of(s, &mut w);
        let mut r = HashSet::new();
        reads_of(s, &mut r);
        if w.contains(tn) {
            let pat = writer_pattern(s, tn).ok_or("written with indices other than full loops")?;
            writers.push((i, pat));
        } else if r.contains(tn) {
            if reads_under_guard(s, tn) {
                return Err("read under a guard (affine indices) or by a gather/scatter-add");
            }
            readers.push(i);
        }
    }
    let (Some(first_w), Some(last_w)) = (writers.first().map(|w| w.0), writers.last().map(|w| w.0))
    else {
        return Err("not written in this routine");
    };
    let (Some(&first_r), Some(&last_r)) = (readers.first(), readers.last()) else {
        return Err("not read in this routine");
    };
    if first_r < last_w {
        return Err("read before its last write");
    }
    let mut inputs = HashSet::new();
    for (i, _) in &writers {
        reads_of(&stmts[*i], &mut inputs);
    }
    inputs.remove(tn);
    for (i, s) in stmts.iter().enumerate().take(last_r + 1).skip(first_w + 1) {
        if writers.iter().any(|w| w.0 == i) {
            continue;
        }
        let mut w = HashSet::new();
        writes_of(s, &mut w);
        if w.iter().any(|t| inputs.contains(t)) {
            return Err("an input of its computation changes before it is read");
        }
    }
    Ok(writers)
}

/// What recomputing a node's computation costs per read: loops over the written iterators
/// disappear (they are replaced by the read's indices), other loops (reductions) multiply.
#[derive(Clone, Copy)]
struct PerRead {
    /// Scalar operations.
    work: u64,
    /// Iterations of the reduction loops along the deepest nesting (the product of their
    /// trip counts).
    reduction: u64,
}

impl PerRead {
    const NONE: PerRead = PerRead {
        work: 0,
        reduction: 1,
    };

    /// One after the other: the work adds up, the deeper reduction counts.
    fn then(self, o: PerRead) -> PerRead {
        PerRead {
            work: self.work.saturating_add(o.work),
            reduction: self.reduction.max(o.reduction),
        }
    }

    /// In a loop of `n` iterations: `n` times over if it is a reduction loop (`reduces`),
    /// once if it runs over a written iterator (replaced by the read's index).
    fn times(self, n: i64, reduces: bool) -> PerRead {
        if !reduces {
            return self;
        }
        let n = n.max(0) as u64;
        PerRead {
            work: self.work.saturating_mul(n),
            reduction: self.reduction.saturating_mul(n),
        }
    }
}

/// What recomputing `c`, a statement writing a node through `written`, costs per read.
fn per_read(c: &Llc, written: &Pattern) -> PerRead {
    fn value(v: &Llv) -> PerRead {
        match v {
            Llv::LocalScope { body, .. } => stmt(body, &Pattern::new()),
            Llv::Binop(_, a, b) => value(a).then(value(b)),
            Llv::Unop(_, a) => value(a),
            Llv::Ternop(_, a, b, c) => value(a).then(value(b)).then(value(c)),
            // One generator call (some eighty integer operations, but a cell's value, like a
            // load: a fetch read once per cell costs the same inlined or materialized).
            Llv::Random { .. } => PerRead {
                work: 1,
                reduction: 1,
            },
            _ => PerRead::NONE,
        }
    }
    fn stmt(c: &Llc, written: &Pattern) -> PerRead {
        match c {
            Llc::Seq(v) => v
                .iter()
                .map(|c| stmt(c, written))
                .fold(PerRead::NONE, PerRead::then),
            Llc::For {
                index,
                from,
                to,
                body,
                ..
            } => stmt(body, written).times(to - from + 1, !written.contains_key(index)),
            Llc::Parallel(p) => stmt(&p.body, written).times(p.to - p.from + 1, true),
            Llc::If { body, .. } | Llc::Lookup { body, .. } => stmt(body, written),
            Llc::Set { value: v, .. } | Llc::SetLocal(_, v) => {
                let r = value(v);
                PerRead {
                    work: r.work.saturating_add(1),
                    ..r
                }
            }
            Llc::ZeroOut(_) | Llc::VSet(..) | Llc::VStore { .. } => PerRead {
                work: 1,
                reduction: 1,
            },
            Llc::Noop | Llc::Comment(_) | Llc::Prefetch { .. } => PerRead::NONE,
        }
    }
    stmt(c, written)
}

/// Inlines every node that can be, in order of first write. A node whose computation costs
/// more than `max_work` operations per read (a large reduction) is materialized instead:
/// recomputing it inside its consumer's loops would turn e.g. a matrix product into an
/// inner-product loop nest with strided access. So is a node whose reduction loops run more
/// than `max_reduction` iterations per read, however rarely it is read: inlined, the
/// reduction runs innermost in its reader's loops, one scalar chain per cell, where
/// materialized it accumulates whole rows of vectors (the default moons job on two devices,
/// whose weight gradients sum over 60 samples, trained at 8.4M samples/s with them inlined
/// and 18.8M materialized).
pub fn virtualize(
    code: Llc,
    traced: &TracedStore,
    max_work: u64,
    max_reduction: u64,
    modes: &mut MemoryModes,
) -> Result<Llc> {
    let mut stmts = code.flatten();
    // Candidates in order of first write.
    let mut order: Vec<Tnode> = vec![];
    for s in &stmts {
        let mut w = HashSet::new();
        writes_of(s, &mut w);
        let mut w: Vec<Tnode> = w.into_iter().filter(|t| !order.contains(t)).collect();
        w.sort();
        order.extend(w);
    }
    for tn in order {
        let Some(t) = traced.get(&tn) else { continue };
        let allowed = modes.get(&tn).is_none_or(|m| m.may_be_virtual());
        if !allowed || t.is_recurrent || t.read_only || tn.is_hosted() {
            continue;
        }
        let inl = inlinable(&stmts, &tn).and_then(|w| {
            let cost = w
                .iter()
                .map(|(i, p)| per_read(&stmts[*i], p))
                .fold(PerRead::NONE, PerRead::then);
            let (work, reduction) = (cost.work, cost.reduction);
            if work > max_work {
                Err("too costly to recompute per read")
            } else if reduction > max_reduction {
                Err("a reduction too long to run innermost per read")
            } else {
                Ok(w)
            }
        });
        match inl {
            Ok(writers) => {
                modes.refine(&tn, MemoryMode::Virtual, provenance::INLINED)?;
                let ws: Vec<(Llc, HashMap<Symbol, usize>)> = writers
                    .iter()
                    .map(|(i, p)| (stmts[*i].clone(), p.clone()))
                    .collect();
                let wi: HashSet<usize> = writers.iter().map(|w| w.0).collect();
                stmts = std::mem::take(&mut stmts)
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| !wi.contains(i))
                    .map(|(_, s)| replace_reads(s, &tn, &ws))
                    .collect();
            }
            Err("not read in this routine") => {
                if modes.get(&tn) == Some(MemoryMode::Virtual) {
                    // Cleanup: a node declared virtual and never read computes nothing useful.
                    stmts.retain(|s| {
                        let mut w = HashSet::new();
                        writes_of(s, &mut w);
                        !w.contains(&tn)
                    });
                } else if modes.get(&tn) != Some(MemoryMode::Local) {
                    // Written (perhaps updated in place) and never consumed here: an output.
                    // (A Local node never read is dead: it does not outlive the routine.)
                    modes.refine(&tn, MemoryMode::Materialized, provenance::OUTPUT)?;
                }
            }
            Err(_) => modes.refine(&tn, MemoryMode::NeverVirtual, provenance::NOT_INLINABLE)?,
        }
    }
    Ok(Llc::Seq(stmts))
}
