//! Tracing: walks the code for the first few iterations of each loop, counting reads and
//! writes per node and cell.
//!
//! # Cost
//!
//! Each loop is walked for its first `max_tracing_dim` iterations, so a loop nest costs the
//! product of those counts: exponential in the nest's depth (a sum over a rank-20 tensor of
//! extent 2 visited 2^20 points). The walk is therefore bounded by
//! [`Settings::max_tracing_points`]: a loop is walked for its first `max_tracing_dim`
//! iterations only while the product of the walked iterations of it and its enclosing loops
//! stays within that budget; past it, the loop is walked for its first iteration only. Every
//! statement of a nest is still reached, and each statement is executed at most
//! `max_tracing_points` times per top-level nest.
//!
//! A loop walked for fewer iterations than it has is *cut short*, and the analysis stays
//! conservative about what it did not see, whether the cut comes from `max_tracing_dim` or
//! from the budget:
//! - a cell whose coordinates depend on a cut-short loop is *inexact*: reading it counts as
//!   reading a written cell only if a `Zero_out` or a single store covering every cell of the
//!   node came first, otherwise the node is recurrent (it persists: always correct);
//! - a read inside a loop walked once by the budget counts as many visits as the full walk
//!   would have given its cell (the loop's `max_tracing_dim` first iterations) when the read's
//!   cell does not depend on the loop's iterator, or depends on it through a linear
//!   combination (where other iterations may land on the same cell), so the budget never
//!   makes a node look read less often, and thus inlinable, than the full walk would.

use super::Settings;
use crate::error::Result;
use crate::ir::{AxisIndex, Symbol, Tnode};
use crate::loops::visit_values;
use crate::loops::{Llc, Llv};
use std::collections::{BTreeMap, HashMap, HashSet};

/// What tracing found out about one node.
#[derive(Clone, Debug)]
pub struct TracedNode {
    /// The node.
    pub tn: Tnode,
    /// Never written in the routine.
    pub read_only: bool,
    /// Zeroed (`Zero_out`) before any other write.
    pub zero_initialized: bool,
    /// Some cell is read before it is written (the node must persist across calls).
    pub is_recurrent: bool,
    /// A scalar computed only from constants.
    pub is_scalar_constexpr: bool,
    /// The most reads of any single traced cell (reads by the node's own accumulation excluded).
    pub max_visits: usize,
    /// Number of traced reads.
    pub reads: usize,
    /// Number of traced writes.
    pub writes: usize,
}

/// Per-node tracing results, ordered by node id.
#[derive(Clone, Debug, Default)]
pub struct TracedStore {
    nodes: BTreeMap<Tnode, TracedNode>,
    points: usize,
}

impl TracedStore {
    /// The traced nodes, by id.
    pub fn nodes(&self) -> impl Iterator<Item = &TracedNode> {
        self.nodes.values()
    }
    /// The tracing result for a node.
    pub fn get(&self, tn: &Tnode) -> Option<&TracedNode> {
        self.nodes.get(tn)
    }
    /// How many statements (stores, local stores, zero fills) tracing executed: the measure
    /// of its work that [`Settings::max_tracing_points`] bounds per loop nest.
    pub fn points(&self) -> usize {
        self.points
    }
}

/// A cell coordinate; static indices become negative placeholders.
type Cell = Vec<i64>;

#[derive(Default)]
struct NodeState {
    written_cells: HashSet<Cell>,
    any_write: bool,
    /// Some single store covered every cell (a full loop nest over the node's dims), and its
    /// loop nest has ended.
    fully_written: bool,
    /// Unguarded stores by their symbolic indices, with the time of the latest (see
    /// [`Tracer::written_this_iteration`]).
    stores: HashMap<Vec<AxisIndex>, u64>,
    zeroed: bool,
    visits: HashMap<Cell, usize>,
    reads: usize,
    writes: usize,
    recurrent: bool,
}

struct Tracer<'a> {
    settings: &'a Settings,
    env: HashMap<Symbol, i64>,
    /// The bounds of the enclosing loops.
    ranges: HashMap<Symbol, (i64, i64)>,
    /// Loop iterators whose loop was cut short by sampling.
    truncated: HashSet<Symbol>,
    /// The enclosing loops that the budget walks once although the full walk would take
    /// several iterations: each iterator with that number of iterations.
    collapsed: Vec<(Symbol, usize)>,
    /// The product of the walked iterations of the enclosing loops.
    walked: usize,
    /// Statements executed so far.
    points: usize,
    /// How many guards ([`Llc::If`]) enclose the current statement.
    guarded: usize,
    /// Counts the stores and loop iterations walked: the time of each.
    clock: u64,
    /// The enclosing loops' iterators, outermost first, with the time their current iteration
    /// started.
    loops: Vec<(Symbol, u64)>,
    /// Nodes that a store covers in full once the loop of the given iterator ends (the
    /// outermost loop of the store's iterators): until then, only the iterations walked so far
    /// have written.
    pending_full: Vec<(Tnode, Symbol)>,
    nodes: BTreeMap<Tnode, NodeState>,
}

impl Tracer<'_> {
    fn cell(&self, idcs: &[AxisIndex]) -> (Cell, bool) {
        let mut exact = true;
        let mut value = |s: &Symbol| match self.env.get(s) {
            Some(v) => {
                if self.truncated.contains(s) {
                    exact = false;
                }
                *v
            }
            None => {
                exact = false;
                -1 - s.0 as i64
            }
        };
        let cell = idcs
            .iter()
            .map(|i| match i {
                AxisIndex::Fixed(k) => *k as i64,
                AxisIndex::Iterator(s) => value(s),
                AxisIndex::Linear(l) => l.terms().iter().fold(l.offset, |acc, (s, c)| {
                    acc.wrapping_add((*c as i64).wrapping_mul(value(s)))
                }),
            })
            .collect();
        (cell, exact)
    }

    /// Whether a store at `idcs` inside the current loops writes every cell of `tn`.
    fn covers_all_cells(&self, tn: &Tnode, idcs: &[AxisIndex]) -> bool {
        let mut seen = HashSet::new();
        idcs.iter().zip(tn.dims()).all(|(ix, &d)| match ix {
            AxisIndex::Fixed(0) => d == 1,
            AxisIndex::Fixed(_) | AxisIndex::Linear(_) => false,
            AxisIndex::Iterator(s) => {
                seen.insert(*s) && self.ranges.get(s) == Some(&(0, d as i64 - 1))
            }
        })
    }

    fn read(&mut self, tn: &Tnode, idcs: &[AxisIndex], own: Option<(&Tnode, &[AxisIndex])>) {
        let (cell, exact) = self.cell(idcs);
        let weight = self.collapsed_weight(idcs);
        let this_iteration = self.written_this_iteration(tn, idcs);
        let st = self.nodes.entry(tn.clone()).or_default();
        st.reads += 1;
        // A cell whose coordinates are not all known (a static index, or a loop cut short by
        // sampling) counts as written only if every cell of the node was, or if the same
        // indices were stored to in this iteration of the loops they depend on.
        let written = st.zeroed
            || st.fully_written
            || this_iteration
            || (exact && st.written_cells.contains(&cell));
        if !written {
            st.recurrent = true;
        }
        let self_accum = own.is_some_and(|(t, i)| t == tn && i == idcs);
        if !self_accum {
            let v = st.visits.entry(cell).or_default();
            *v = v.saturating_add(weight);
        }
    }

    /// Whether an unguarded store to `tn` at the same symbolic indices `idcs` came earlier in the
    /// current iteration of every loop whose iterator `idcs` uses. Then it did so in every
    /// iteration, walked or not (the same code with the same indices, and no guard), so the
    /// cell read is written whatever iteration reads it. `idcs` must use loop iterators only
    /// (a static index or a lookup's row has no loop).
    fn written_this_iteration(&self, tn: &Tnode, idcs: &[AxisIndex]) -> bool {
        let Some(&time) = self.nodes.get(tn).and_then(|st| st.stores.get(idcs)) else {
            return false;
        };
        let mut symbols = idcs.iter().flat_map(|ix| match ix {
            AxisIndex::Fixed(_) => vec![],
            AxisIndex::Iterator(s) => vec![*s],
            AxisIndex::Linear(l) => l.terms().iter().map(|(s, _)| *s).collect(),
        });
        symbols.all(|s| {
            self.loops
                .iter()
                .find(|(l, _)| *l == s)
                .is_some_and(|&(_, start)| time >= start)
        })
    }

    /// How many visits one traced read at `idcs` stands for: the full walk's iterations of
    /// every loop walked once by the budget whose iterator the read does not index alone
    /// (see the module documentation).
    fn collapsed_weight(&self, idcs: &[AxisIndex]) -> usize {
        self.collapsed
            .iter()
            .filter(|(s, _)| {
                !idcs.iter().any(|ix| matches!(ix, AxisIndex::Iterator(t) if t == s))
                    || idcs.iter().any(
                        |ix| matches!(ix, AxisIndex::Linear(l) if l.terms().iter().any(|(t, _)| t == s)),
                    )
            })
            .fold(1usize, |w, (_, n)| w.saturating_mul(*n))
    }

    fn value(&mut self, v: &Llv, own: Option<(&Tnode, &[AxisIndex])>) {
        match v {
            Llv::Get(tn, idcs) => self.read(tn, idcs, own),
            Llv::LocalScope { body, .. } => self.stmt(body),
            Llv::Binop(_, a, b) => {
                self.value(a, own);
                self.value(b, own);
            }
            Llv::Unop(_, a) => self.value(a, own),
            Llv::Ternop(_, a, b, c) => {
                self.value(a, own);
                self.value(b, own);
                self.value(c, own);
            }
            Llv::GetMergeBuffer(..)
            | Llv::Random { .. }
            | Llv::GetLocal(_)
            | Llv::GetCFunction(_)
            | Llv::Constant(_)
            | Llv::EmbedIndex(_) => {}
        }
    }

    fn stmt(&mut self, c: &Llc) {
        match c {
            // Tracing runs on lowered code, before the kernel passes introduce vectors.
            Llc::Noop
            | Llc::Comment(_)
            | Llc::VSet(..)
            | Llc::VStore { .. }
            | Llc::Prefetch { .. } => {}
            Llc::Seq(v) => v.iter().for_each(|c| self.stmt(c)),
            // Parallel regions come after tracing; one means its plain loop.
            Llc::Parallel(p) => self.stmt(&p.to_for()),
            Llc::For {
                index,
                from,
                to,
                body,
                ..
            } => {
                let n = (to - from + 1).max(0);
                let full = n.min(self.settings.max_tracing_dim.max(1) as i64);
                // Within the budget, the loop's first `full` iterations; past it, one.
                let budget = self.settings.max_tracing_points.max(1);
                let walk = if self.walked.saturating_mul(full as usize) <= budget {
                    full
                } else {
                    full.min(1)
                };
                if n > walk {
                    self.truncated.insert(*index);
                }
                let collapsed = walk < full;
                if collapsed {
                    self.collapsed.push((*index, full as usize));
                }
                let outer = self.walked;
                self.walked = outer.saturating_mul(walk.max(1) as usize);
                self.ranges.insert(*index, (*from, *to));
                self.loops.push((*index, self.clock));
                for i in *from..*from + walk {
                    self.clock += 1;
                    self.loops.last_mut().expect("pushed above").1 = self.clock;
                    self.env.insert(*index, i);
                    self.stmt(body);
                }
                self.loops.pop();
                // The stores that cover a node in full once this loop has run.
                let mut k = 0;
                while k < self.pending_full.len() {
                    if self.pending_full[k].1 == *index {
                        let (tn, _) = self.pending_full.swap_remove(k);
                        self.nodes.entry(tn).or_default().fully_written = true;
                    } else {
                        k += 1;
                    }
                }
                self.walked = outer;
                if collapsed {
                    self.collapsed.pop();
                }
                self.env.remove(index);
                self.ranges.remove(index);
                self.truncated.remove(index);
            }
            // Both ways: the body's reads count (conservative), its writes count as writes
            // but never as covering cells (a skipped write leaves the old value).
            Llc::If { body, .. } => {
                self.guarded += 1;
                self.stmt(body);
                self.guarded -= 1;
            }
            // The index is read here; the body runs for some unknown row (its symbol has no
            // value: its accesses are inexact) or not at all, like a guard's.
            Llc::Lookup { tn, idcs, body, .. } => {
                self.points += 1;
                self.read(tn, idcs, None);
                self.guarded += 1;
                self.stmt(body);
                self.guarded -= 1;
            }
            Llc::ZeroOut(tn) => {
                self.points += 1;
                let st = self.nodes.entry(tn.clone()).or_default();
                if !st.any_write {
                    st.zeroed = true;
                }
                st.any_write = true;
                st.writes += 1;
            }
            Llc::Set { tn, idcs, value } => {
                self.points += 1;
                self.value(value, Some((tn, idcs)));
                let (cell, _) = self.cell(idcs);
                let guarded = self.guarded > 0;
                let full = !guarded && self.covers_all_cells(tn, idcs);
                // The cells are all written when the outermost loop of the store's iterators
                // ends (at once if it has none: a node of one cell).
                let outermost = self.loops.iter().map(|(s, _)| *s).find(|s| {
                    idcs.iter()
                        .any(|ix| matches!(ix, AxisIndex::Iterator(t) if t == s))
                });
                self.clock += 1;
                let time = self.clock;
                let st = self.nodes.entry(tn.clone()).or_default();
                if !guarded {
                    st.written_cells.insert(cell);
                    st.stores.insert(idcs.to_vec(), time);
                }
                if full {
                    match outermost {
                        Some(s) => self.pending_full.push((tn.clone(), s)),
                        None => st.fully_written = true,
                    }
                }
                st.any_write = true;
                st.writes += 1;
            }
            Llc::SetLocal(_, value) => {
                self.points += 1;
                self.value(value, None)
            }
        }
    }
}

/// Traces the code: walks each loop for its first [`Settings::max_tracing_dim`] iterations
/// while the iterations walked in a loop nest stay within [`Settings::max_tracing_points`], and
/// for its first iteration past that budget. What the walk skips is treated conservatively: a
/// read of a cell that depends on a loop cut short counts as a read before any write unless the
/// whole node was zeroed or written first (the node is then recurrent, so it persists), and a
/// read in a loop walked once by the budget counts the visits the full walk would have seen.
pub fn trace(code: &Llc, settings: &Settings) -> Result<TracedStore> {
    let mut t = Tracer {
        settings,
        env: HashMap::new(),
        ranges: HashMap::new(),
        truncated: HashSet::new(),
        collapsed: vec![],
        walked: 1,
        points: 0,
        guarded: 0,
        clock: 0,
        loops: vec![],
        pending_full: vec![],
        nodes: BTreeMap::new(),
    };
    t.stmt(code);
    let constexpr = scalar_constexprs(code);
    Ok(TracedStore {
        points: t.points,
        nodes: t
            .nodes
            .into_iter()
            .map(|(tn, st)| {
                let node = TracedNode {
                    read_only: st.writes == 0,
                    zero_initialized: st.zeroed,
                    is_recurrent: st.recurrent && st.writes > 0,
                    is_scalar_constexpr: constexpr.contains(&tn),
                    max_visits: st.visits.values().copied().max().unwrap_or(0),
                    reads: st.reads,
                    writes: st.writes,
                    tn: tn.clone(),
                };
                (tn, node)
            })
            .collect(),
    })
}

static ZERO: Llv = Llv::Constant(0.0);

/// Scalar nodes whose every write computes from constants (and other such nodes) only.
fn scalar_constexprs(code: &Llc) -> HashSet<Tnode> {
    let mut writes: HashMap<Tnode, Vec<&Llv>> = HashMap::new();
    let mut non_scalar_writes: HashSet<Tnode> = HashSet::new();
    fn collect<'a>(c: &'a Llc, w: &mut HashMap<Tnode, Vec<&'a Llv>>, bad: &mut HashSet<Tnode>) {
        match c {
            Llc::Seq(v) => v.iter().for_each(|c| collect(c, w, bad)),
            Llc::For { body, .. } | Llc::If { body, .. } => collect(body, w, bad),
            Llc::Parallel(p) => collect(&p.body, w, bad),
            // Written only for some data: never a constant expression.
            Llc::Lookup { body, .. } => {
                let mut inner = HashMap::new();
                collect(body, &mut inner, bad);
                bad.extend(inner.into_keys());
            }
            Llc::Set { tn, value, .. } => w.entry(tn.clone()).or_default().push(value),
            Llc::ZeroOut(tn) => w.entry(tn.clone()).or_default().push(&ZERO),
            Llc::SetLocal(..) | Llc::VSet(..) | Llc::VStore { .. } => {}
            Llc::Noop | Llc::Comment(_) | Llc::Prefetch { .. } => {}
        }
        if let Llc::Set { tn, .. } | Llc::ZeroOut(tn) = c {
            if tn.numel() != 1 {
                bad.insert(tn.clone());
            }
        }
    }
    collect(code, &mut writes, &mut non_scalar_writes);
    let mut known: HashSet<Tnode> = HashSet::new();
    loop {
        let mut changed = false;
        for (tn, vals) in &writes {
            if known.contains(tn) || non_scalar_writes.contains(tn) || tn.numel() != 1 {
                continue;
            }
            let ok = vals.iter().all(|v| {
                let mut ok = true;
                let stmt = Llc::SetLocal(
                    crate::loops::ScopeId {
                        tn: tn.clone(),
                        id: 0,
                    },
                    (*v).clone(),
                );
                visit_values(&stmt, &mut |x| match x {
                    Llv::Get(t, _) if t == tn || known.contains(t) => {}
                    Llv::Get(..)
                    | Llv::GetMergeBuffer(..)
                    | Llv::GetCFunction(_)
                    | Llv::LocalScope { .. } => ok = false,
                    Llv::EmbedIndex(AxisIndex::Iterator(_)) => ok = false,
                    // A value that depends on the cell's position.
                    Llv::Random { .. } => ok = false,
                    _ => {}
                });
                ok
            });
            if ok {
                known.insert(tn.clone());
                changed = true;
            }
        }
        if !changed {
            return known;
        }
    }
}
