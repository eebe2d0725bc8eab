//! Whether a loop's iterations are independent: the analysis behind parallel regions
//! ([`Llc::Parallel`]), which the optimizer's parallel pass uses to find them and the verifier
//! to check them.
//!
//! A loop over `i` may run its iterations at once when, for every tensor its body writes:
//! - the tensor is **separated** by `i`: on some axis, every access of the tensor in the body
//!   (reads and writes, vector lanes included) has the index `c·i + S + r` with one
//!   coefficient `c > 0`, one part `S` in symbols bound outside the loop, and a rest `r` over
//!   the body's own iterators whose whole range is narrower than `c`; iteration `i` then
//!   touches only the axis positions `c·i + S + [lo, hi]`, which no other iteration touches;
//! - or the tensor is a local array that is **private** to the iterations: every read of it
//!   in the body reads cells written earlier in the same iteration (*covered*, see below),
//!   and no read of it outside the loop can see what the loop wrote (every such read is
//!   covered by writes made after the loop). Each thread then works on its own copy.
//!
//! A read is covered when, in some enclosing statement list, the statements before the one
//! holding it write (unconditionally) every cell the read may touch. Cells are flat
//! offsets; symbols bound outside that list are compared exactly (the same symbolic part),
//! the others range over their loops. What a statement writes is a set of blocks: a loop's
//! iterations' blocks join into one where they touch (a row written by a vector loop and
//! then by a last vector or a remainder loop, and the rows around it), or else form a
//! *family*, one block repeated at a stride (the panels of a packed operand whose last
//! reduction block is shorter than the panels' room); a read lies in a family when one of
//! its symbols, or its fixed offset, picks members. Conservative: a read that cannot be
//! shown covered is not.
//!
//! The vector variables the body uses must be its own (used nowhere else) and assigned in
//! each iteration before they are read; the body must not call imported C functions (which
//! may keep state).
//!
//! A tensor the body only reduces into one fixed cell (`T[I] = T[I] ⊕ e` with `⊕` addition,
//! subtraction, max or min, in single or double precision, and no other access) is an
//! **accumulator**: the parallel pass turns such loops into blocks of partial results
//! combined in a fixed order (the verifier accepts no accumulator in a region).

use super::walk::visit_vlv;
use super::{visit_llc, visit_values, visit_vectors, Llc, Llv, ParallelLoop, Vlv};
use crate::ir::{AxisIndex, Binop, Prec, Symbol, Tnode};
use std::collections::{HashMap, HashSet};

/// A tensor a loop only reduces into one cell.
#[derive(Clone, Debug, PartialEq)]
pub struct Accumulator {
    /// The tensor.
    pub tn: Tnode,
    /// The cell (indices free of the loop's iterators).
    pub idcs: Vec<AxisIndex>,
    /// The reduction: add, sub, max or min.
    pub op: Binop,
}

/// What makes a loop's iterations independent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Independence {
    /// Local arrays each iteration writes before it reads them (a copy per thread).
    pub private: Vec<Tnode>,
    /// Tensors the loop reduces into (the loop needs blocking before it can run in
    /// parallel).
    pub accumulators: Vec<Accumulator>,
}

/// The loops of a routine already decided to be parallel regions, by the local arrays they
/// privatize: a region writing its private copy of a tensor makes the shared tensor's
/// earlier contents unknown to the code after it.
#[derive(Clone, Default)]
pub struct Regions<'a> {
    private: HashMap<Tnode, Vec<&'a Llc>>,
}

impl<'a> Regions<'a> {
    /// Records that `region` (a loop of the routine) privatizes `tn`.
    pub fn add(&mut self, tn: &Tnode, region: &'a Llc) {
        self.private.entry(tn.clone()).or_default().push(region);
    }
}

/// Checks a parallel region of `root` (the node `Llc::Parallel`, found in `root` by
/// address): its iterations are independent with its private arrays, and it has no
/// accumulator.
pub fn check_parallel(root: &Llc, region: &Llc) -> Result<(), String> {
    let Llc::Parallel(p) = region else {
        return Err("not a parallel loop".into());
    };
    let mut regions = Regions::default();
    visit_llc(root, &mut |c| {
        if let Llc::Parallel(q) = c {
            for t in &q.private {
                regions.add(t, c);
            }
        }
    });
    let allowed: HashSet<Tnode> = p.private.iter().cloned().collect();
    let ind = analyze(root, region, &allowed, &regions)?;
    if let Some(a) = ind.accumulators.first() {
        return Err(format!("it reduces into {} (not blocked)", a.tn.name()));
    }
    for t in &p.private {
        if !ind.private.contains(t) {
            // Separated tensors need no copy, but a private one must still pass the checks.
            private_ok(root, region, p.index, &p.body, t, &regions)?;
        }
    }
    Ok(())
}

/// The loop `lp` (an `Llc::For` or `Llc::Parallel` inside `root`, by address): whether its
/// iterations are independent, privatizing only tensors of `locals`, given the `regions`
/// decided so far; `Err` says why not.
pub fn analyze(
    root: &Llc,
    lp: &Llc,
    locals: &HashSet<Tnode>,
    regions: &Regions<'_>,
) -> Result<Independence, String> {
    let (index, from, to, body) = match lp {
        Llc::For {
            index,
            from,
            to,
            body,
            ..
        } => (*index, *from, *to, &**body),
        Llc::Parallel(p) => (p.index, p.from, p.to, &p.body),
        _ => return Err("not a loop".into()),
    };
    let mut calls = false;
    visit_values(body, &mut |v| calls |= matches!(v, Llv::GetCFunction(_)));
    if calls {
        return Err("it calls an imported C function".into());
    }
    vectors_are_own(root, lp, body)?;
    // The ranges of the symbols bound in the body (a symbol bound by several loops: the
    // union of their ranges).
    let mut inner: HashMap<Symbol, (i64, i64)> = HashMap::new();
    let mut widen = |s: Symbol, from: i64, to: i64| {
        let r = inner.entry(s).or_insert((from, to.max(from)));
        *r = (r.0.min(from), r.1.max(to));
    };
    widen(index, from, to);
    visit_llc(body, &mut |c| match c {
        Llc::For {
            index, from, to, ..
        } => widen(*index, *from, *to),
        Llc::Parallel(p) => widen(p.index, p.from, p.to),
        Llc::Lookup { symbol, extent, .. } => widen(*symbol, 0, *extent as i64 - 1),
        _ => {}
    });
    let mut ranges = inner.clone();
    for (s, from, to) in enclosing(root, lp).unwrap_or_default() {
        ranges.entry(s).or_insert((from, to.max(from)));
    }
    let accesses = accesses(body);
    let mut written: Vec<&Tnode> = vec![];
    for a in &accesses {
        if a.kind != Kind::Read && !written.contains(&a.tn) {
            written.push(a.tn);
        }
    }
    let mut ind = Independence::default();
    for tn in written {
        let mine: Vec<&Access> = accesses.iter().filter(|a| a.tn == tn).collect();
        if separated(tn, &mine, index, &inner, &ranges) {
            continue;
        }
        if locals.contains(tn) && private_ok(root, lp, index, body, tn, regions).is_ok() {
            ind.private.push(tn.clone());
            continue;
        }
        match accumulator(body, tn, index, &inner) {
            Some(a) => ind.accumulators.push(a),
            None => {
                return Err(format!(
                    "several iterations may access the same cells of {} (written)",
                    tn.name()
                ))
            }
        }
    }
    Ok(ind)
}

/// The loops (and lookups) enclosing `target` in `root`, outermost first, with their ranges;
/// `None` when `target` is not in `root`.
fn enclosing(root: &Llc, target: &Llc) -> Option<Vec<(Symbol, i64, i64)>> {
    fn go(c: &Llc, target: &Llc, path: &mut Vec<(Symbol, i64, i64)>) -> bool {
        if std::ptr::eq(c, target) {
            return true;
        }
        let (bound, body) = match c {
            Llc::Seq(v) => return v.iter().any(|c| go(c, target, path)),
            Llc::For {
                index,
                from,
                to,
                body,
                ..
            } => (Some((*index, *from, *to)), &**body),
            Llc::Parallel(p) => (Some((p.index, p.from, p.to)), &p.body),
            Llc::Lookup {
                symbol,
                extent,
                body,
                ..
            } => (Some((*symbol, 0, *extent as i64 - 1)), &**body),
            Llc::If { body, .. } => (None, &**body),
            _ => return false,
        };
        path.extend(bound);
        if go(body, target, path) {
            return true;
        }
        if bound.is_some() {
            path.pop();
        }
        false
    }
    let mut path = vec![];
    go(root, target, &mut path).then_some(path)
}

/// An estimate of the work of a statement: each scalar operation counts once per execution,
/// each vector operation once per lane (so a loop's work does not depend on whether it was
/// vectorized), each zero-filled element a sixteenth.
pub fn parallel_work(c: &Llc) -> u64 {
    fn value(v: &Llv) -> u64 {
        let mut n = 0u64;
        super::visit_value(v, &mut |_| n += 1);
        n
    }
    fn vector(v: &Vlv) -> u64 {
        let mut n = 0u64;
        visit_vlv(v, &mut |x| n = n.saturating_add(x.ty().lanes.max(1) as u64));
        n.max(1)
    }
    match c {
        Llc::Seq(v) => v.iter().map(parallel_work).fold(0, u64::saturating_add),
        Llc::For { from, to, body, .. } => {
            parallel_work(body).saturating_mul((to - from + 1).max(0) as u64)
        }
        Llc::Parallel(p) => {
            parallel_work(&p.body).saturating_mul((p.to - p.from + 1).max(0) as u64)
        }
        Llc::If { body, .. } | Llc::Lookup { body, .. } => parallel_work(body).saturating_add(1),
        Llc::Set { value: v, .. } | Llc::SetLocal(_, v) => value(v).max(1),
        Llc::VSet(_, v) | Llc::VStore { value: v, .. } => vector(v),
        Llc::ZeroOut(t) => (t.numel() as u64 / 16).max(1),
        Llc::Noop | Llc::Comment(_) | Llc::Prefetch { .. } => 0,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    /// A zero fill of the whole tensor.
    Zero,
}

struct Access<'a> {
    tn: &'a Tnode,
    idcs: &'a [AxisIndex],
    lanes: usize,
    kind: Kind,
}

/// Every access of a tensor in `c` (merge-buffer reads left out: nothing writes them).
fn accesses(c: &Llc) -> Vec<Access<'_>> {
    let mut out = vec![];
    visit_llc(c, &mut |c| match c {
        Llc::Set { tn, idcs, .. } => out.push(Access {
            tn,
            idcs,
            lanes: 1,
            kind: Kind::Write,
        }),
        Llc::VStore { tn, idcs, value } => out.push(Access {
            tn,
            idcs,
            lanes: value.ty().lanes,
            kind: Kind::Write,
        }),
        Llc::ZeroOut(tn) => out.push(Access {
            tn,
            idcs: &[],
            lanes: 1,
            kind: Kind::Zero,
        }),
        _ => {}
    });
    reads_of(c, &mut |tn, idcs, lanes| {
        out.push(Access {
            tn,
            idcs,
            lanes,
            kind: Kind::Read,
        })
    });
    out
}

/// [`super::visit_reads`] without the merge-buffer reads.
fn reads_of<'a>(c: &'a Llc, f: &mut impl FnMut(&'a Tnode, &'a [AxisIndex], usize)) {
    super::visit_reads(c, &mut |tn, idcs, lanes, merge| {
        if !merge {
            f(tn, idcs, lanes)
        }
    });
}

/// An index as `c·i + Σ symbolic + [lo, hi]`: the coefficient of `i`, the terms in symbols
/// that are neither `i` nor in `inner` (sorted), and the range of the rest.
fn split(ix: &AxisIndex, i: Symbol, inner: &HashMap<Symbol, (i64, i64)>) -> Split {
    let (terms, offset): (Vec<(Symbol, usize)>, i64) = match ix {
        AxisIndex::Fixed(k) => (vec![], *k as i64),
        AxisIndex::Iterator(s) => (vec![(*s, 1)], 0),
        AxisIndex::Linear(l) => (l.terms().to_vec(), l.offset),
    };
    let mut out = Split {
        coef: 0,
        symbolic: vec![],
        lo: offset as i128,
        hi: offset as i128,
    };
    for (s, c) in terms {
        let c = c as i128;
        if s == i {
            out.coef += c;
        } else if let Some(&(from, to)) = inner.get(&s) {
            out.lo += c * from as i128;
            out.hi += c * to as i128;
        } else {
            out.symbolic.push((s, c));
        }
    }
    out.symbolic.sort();
    out
}

struct Split {
    coef: i128,
    symbolic: Vec<(Symbol, i128)>,
    lo: i128,
    hi: i128,
}

/// Whether the accesses `mine` of `tn` (all of them in the body) are separated by `i` on
/// some axis (see the module documentation).
/// `ranges` holds the range of every symbol bound in or around the loop.
fn separated(
    tn: &Tnode,
    mine: &[&Access<'_>],
    i: Symbol,
    inner: &HashMap<Symbol, (i64, i64)>,
    ranges: &HashMap<Symbol, (i64, i64)>,
) -> bool {
    let dims = tn.dims();
    if dims.is_empty() || mine.iter().any(|a| a.kind == Kind::Zero) {
        return false;
    }
    let last = dims.len() - 1;
    // A vector whose lanes may run past the last axis reaches into other positions of the
    // axes before it: never separated.
    let spills = mine.iter().any(|a| {
        if a.lanes <= 1 {
            return false;
        }
        let Some(ix) = a.idcs.get(last) else {
            return true;
        };
        // Every symbol ranging (no symbol is `Symbol(u32::MAX)`).
        let s = split(ix, Symbol(u32::MAX), ranges);
        !s.symbolic.is_empty() || s.hi + a.lanes as i128 > dims[last] as i128
    });
    if spills {
        return false;
    }
    (0..dims.len()).any(|k| {
        let mut coef = None;
        let mut symbolic = None;
        let (mut lo, mut hi) = (i128::MAX, i128::MIN);
        for a in mine {
            let Some(ix) = a.idcs.get(k) else {
                return false;
            };
            let s = split(ix, i, inner);
            if s.coef == 0 || coef.is_some_and(|c| c != s.coef) {
                return false;
            }
            if symbolic.as_ref().is_some_and(|y| *y != s.symbolic) {
                return false;
            }
            coef = Some(s.coef);
            let extra = if k == last { a.lanes as i128 - 1 } else { 0 };
            lo = lo.min(s.lo);
            hi = hi.max(s.hi + extra);
            symbolic = Some(s.symbolic);
        }
        coef.is_some_and(|c| hi - lo < c)
    })
}

/// `tn` as an accumulator of the loop over `i` with body `body`: every access is a
/// statement `tn[I] = tn[I] ⊕ e` with one `I` free of the body's iterators, one `⊕`, and `e`
/// not reading `tn`.
fn accumulator(
    body: &Llc,
    tn: &Tnode,
    i: Symbol,
    inner: &HashMap<Symbol, (i64, i64)>,
) -> Option<Accumulator> {
    if !matches!(tn.prec(), Prec::Single | Prec::Double) {
        return None;
    }
    let mut found: Option<Accumulator> = None;
    let mut updates = 0usize;
    let mut ok = true;
    visit_llc(body, &mut |c| {
        let Llc::Set { tn: t, idcs, value } = c else {
            if let Llc::VStore { tn: t, .. } | Llc::ZeroOut(t) = c {
                ok &= t != tn;
            }
            return;
        };
        if t != tn {
            return;
        }
        let Llv::Binop(op, a, e) = value else {
            ok = false;
            return;
        };
        let own = matches!(&**a, Llv::Get(x, ix) if x == tn && ix == idcs);
        let mut reads_it = false;
        super::visit_value(e, &mut |v| {
            reads_it |= matches!(v, Llv::Get(x, _) if x == tn);
        });
        let free = idcs.iter().all(|ix| {
            ix.symbols()
                .iter()
                .all(|s| *s != i && !inner.contains_key(s))
        });
        if !own
            || reads_it
            || !free
            || !matches!(op, Binop::Add | Binop::Sub | Binop::Max | Binop::Min)
        {
            ok = false;
            return;
        }
        match &found {
            Some(f) if f.idcs != *idcs || f.op != *op => ok = false,
            Some(_) => {}
            None => {
                found = Some(Accumulator {
                    tn: tn.clone(),
                    idcs: idcs.clone(),
                    op: *op,
                })
            }
        }
        updates += 1;
    });
    // The only reads are the updates' own.
    let mut reads = 0usize;
    reads_of(body, &mut |t, _, _| reads += usize::from(t == tn));
    // Updates inside local scopes (values) are not statements of the loop.
    let mut in_scopes = false;
    visit_values(body, &mut |v| {
        if let Llv::LocalScope { body, .. } = v {
            visit_llc(body, &mut |c| {
                in_scopes |= matches!(c, Llc::Set { tn: t, .. } if t == tn);
            });
        }
    });
    (ok && !in_scopes && reads == updates)
        .then_some(found)
        .flatten()
}

/// The vector variables of the loop `lp` (in `root`, by address) are its own: used nowhere
/// else, and in each iteration assigned before they are read.
fn vectors_are_own(root: &Llc, lp: &Llc, body: &Llc) -> Result<(), String> {
    fn regs(c: &Llc, out: &mut HashSet<u32>) {
        visit_llc(c, &mut |c| {
            if let Llc::VSet(r, _) = c {
                out.insert(r.id);
            }
        });
        visit_vectors(c, &mut |v| {
            if let Vlv::Reg(r) = v {
                out.insert(r.id);
            }
        });
    }
    let mut inside = HashSet::new();
    regs(body, &mut inside);
    if inside.is_empty() {
        return Ok(());
    }
    // Everything outside the loop.
    fn outside(c: &Llc, lp: &Llc, out: &mut HashSet<u32>) {
        if std::ptr::eq(c, lp) {
            return;
        }
        match c {
            Llc::Seq(v) => v.iter().for_each(|c| outside(c, lp, out)),
            Llc::For { body, .. } | Llc::If { body, .. } | Llc::Lookup { body, .. } => {
                outside(body, lp, out)
            }
            Llc::Parallel(p) => outside(&p.body, lp, out),
            c => regs(c, out),
        }
    }
    let mut out = HashSet::new();
    outside(root, lp, &mut out);
    if let Some(r) = inside.intersection(&out).next() {
        return Err(format!("vector variable {r} is also used outside it"));
    }
    let mut defined = HashSet::new();
    assigned_first(body, &mut defined)
}

/// Whether every vector variable read in `c` is assigned before (in `defined`, or earlier
/// in `c` on every path); adds what `c` surely assigns to `defined`.
fn assigned_first(c: &Llc, defined: &mut HashSet<u32>) -> Result<(), String> {
    let check = |v: &Vlv, defined: &HashSet<u32>| -> Result<(), String> {
        let mut bad = None;
        visit_vlv(v, &mut |x| {
            if let Vlv::Reg(r) = x {
                if !defined.contains(&r.id) {
                    bad = Some(r.id);
                }
            }
        });
        match bad {
            Some(r) => Err(format!(
                "vector variable {r} may be read before it is assigned in an iteration"
            )),
            None => Ok(()),
        }
    };
    match c {
        Llc::Seq(v) => v.iter().try_for_each(|c| assigned_first(c, defined)),
        Llc::For { from, to, body, .. } => {
            let mut inner = defined.clone();
            assigned_first(body, &mut inner)?;
            if from <= to {
                *defined = inner;
            }
            Ok(())
        }
        Llc::Parallel(p) => {
            let mut inner = defined.clone();
            assigned_first(&p.body, &mut inner)?;
            if p.from <= p.to {
                *defined = inner;
            }
            Ok(())
        }
        Llc::If { body, .. } | Llc::Lookup { body, .. } => {
            let mut inner = defined.clone();
            assigned_first(body, &mut inner)
        }
        Llc::VSet(r, v) => {
            check(v, defined)?;
            defined.insert(r.id);
            Ok(())
        }
        Llc::VStore { value, .. } => check(value, defined),
        _ => Ok(()),
    }
}

/// Whether `tn` may be private to the iterations of the loop `lp` over `index` with body
/// `body` (in `root`): every read of it in the body is covered within an iteration, and
/// every read outside is covered by writes after the loop (and after the other `regions`
/// privatizing it).
fn private_ok(
    root: &Llc,
    lp: &Llc,
    index: Symbol,
    body: &Llc,
    tn: &Tnode,
    regions: &Regions<'_>,
) -> Result<(), String> {
    // Inside: a fresh copy per thread, so nothing from before the loop is visible (the
    // iterator is bound outside the body: symbolic).
    let _ = index;
    let mut inside = Coverage::new(tn, vec![]);
    inside.list(std::slice::from_ref(body));
    if let Some(e) = inside.failure {
        return Err(format!("in an iteration, {e}"));
    }
    let mut kills: Vec<&Llc> = vec![lp];
    if let Some(r) = regions.private.get(tn) {
        kills.extend(r.iter().copied());
    }
    let mut outside = Coverage::new(tn, kills);
    outside.list(std::slice::from_ref(root));
    if let Some(e) = outside.failure {
        return Err(format!("outside the loop, {e}"));
    }
    Ok(())
}

/// Cells of a tensor, as flat offsets: a symbolic part (sorted terms in symbols bound
/// outside the statement list considered) plus the interval `[lo, hi]`, and for the blocks
/// a loop writes with gaps between its iterations (the panels of a packed operand whose
/// last reduction block is shorter), the family `(stride, from, to)`: the interval moved
/// by `stride · t` for every `t` in `from..=to`.
#[derive(Clone, Debug, PartialEq)]
struct Cells {
    symbolic: Vec<(Symbol, i128)>,
    lo: i128,
    hi: i128,
    family: Option<(i128, i64, i64)>,
}

impl Cells {
    /// Whether `other` lies within these cells' interval, with the same symbolic part.
    fn holds(&self, other: &Cells) -> bool {
        self.symbolic == other.symbolic && self.lo <= other.lo && other.hi <= self.hi
    }
}

/// One statement list being walked: its position in the stack of enclosing loops, the cells
/// its statements so far have written, and whether its coverage is unusable here.
struct Level {
    depth: usize,
    covers: Vec<Cells>,
    blocked: bool,
}

/// The walk checking that every read of `tn` is covered (see the module documentation).
struct Coverage<'a> {
    tn: &'a Tnode,
    strides: Vec<i128>,
    /// Loops whose writes of `tn` go elsewhere (private copies): they cover nothing, and
    /// after them the tensor's contents are unknown; reads inside them are not checked here.
    kills: Vec<&'a Llc>,
    /// The enclosing loops (and lookups) of the point walked, outermost first.
    bound: Vec<(Symbol, i64, i64)>,
    levels: Vec<Level>,
    failure: Option<String>,
}

impl<'a> Coverage<'a> {
    fn new(tn: &'a Tnode, kills: Vec<&'a Llc>) -> Coverage<'a> {
        let dims = tn.dims();
        let mut strides = vec![1i128; dims.len()];
        for k in (0..dims.len().saturating_sub(1)).rev() {
            strides[k] = strides[k + 1] * dims[k + 1] as i128;
        }
        Coverage {
            tn,
            strides,
            kills,
            bound: vec![],
            levels: vec![],
            failure: None,
        }
    }

    fn is_kill(&self, c: &Llc) -> bool {
        self.kills.iter().any(|k| std::ptr::eq(*k, c))
    }

    fn contains_kill(&self, c: &Llc) -> bool {
        let mut hit = false;
        visit_llc(c, &mut |x| hit |= self.is_kill(x));
        hit
    }

    /// The flat offsets of the access `idcs` (with `lanes`), the loops `bound[depth..]`
    /// ranging and every other symbol symbolic: the interval spanning them.
    fn cells(&self, idcs: &[AxisIndex], lanes: usize, depth: usize) -> Cells {
        let mut symbolic: HashMap<Symbol, i128> = HashMap::new();
        let mut local: HashMap<Symbol, i128> = HashMap::new();
        let mut constant = 0i128;
        let ranging = &self.bound[depth.min(self.bound.len())..];
        for (ix, &stride) in idcs.iter().zip(&self.strides) {
            let (terms, offset): (Vec<(Symbol, usize)>, i64) = match ix {
                AxisIndex::Fixed(k) => (vec![], *k as i64),
                AxisIndex::Iterator(s) => (vec![(*s, 1)], 0),
                AxisIndex::Linear(l) => (l.terms().to_vec(), l.offset),
            };
            constant += offset as i128 * stride;
            for (s, c) in terms {
                let c = c as i128 * stride;
                if ranging.iter().any(|b| b.0 == s) {
                    *local.entry(s).or_default() += c;
                } else {
                    *symbolic.entry(s).or_default() += c;
                }
            }
        }
        let mut lo = constant;
        // (coefficient, count) of every ranging term, and the lanes.
        let mut spans: Vec<(i128, i128)> = vec![];
        for (s, c) in &local {
            // The innermost binding of a symbol counts.
            let Some(&(_, from, to)) = ranging.iter().rev().find(|b| b.0 == *s) else {
                continue;
            };
            lo += c * from as i128;
            spans.push((*c, (to - from) as i128 + 1));
        }
        if lanes > 1 {
            spans.push((1, lanes as i128));
        }
        let span: i128 = spans.iter().map(|&(c, n)| c * (n - 1)).sum();
        let mut symbolic: Vec<(Symbol, i128)> =
            symbolic.into_iter().filter(|(_, c)| *c != 0).collect();
        symbolic.sort();
        Cells {
            symbolic,
            lo,
            hi: lo + span,
            family: None,
        }
    }

    fn fail(&mut self, msg: String) {
        if self.failure.is_none() {
            self.failure = Some(msg);
        }
    }

    /// Walks a statement list as one level.
    fn list(&mut self, stmts: &[Llc]) {
        self.levels.push(Level {
            depth: self.bound.len(),
            covers: vec![],
            blocked: false,
        });
        for c in stmts {
            self.stmt(c);
            if self.failure.is_some() {
                break;
            }
        }
        self.levels.pop();
    }

    fn stmt(&mut self, c: &Llc) {
        if self.is_kill(c) {
            if let Some(l) = self.levels.last_mut() {
                l.covers.clear();
            }
            return;
        }
        if let Llc::Seq(v) = c {
            // A nested sequence continues the same list.
            for c in v {
                self.stmt(c);
            }
            return;
        }
        let kill_inside = self.contains_kill(c);
        let saved: Vec<bool> = self.levels.iter().map(|l| l.blocked).collect();
        if kill_inside {
            self.levels.iter_mut().for_each(|l| l.blocked = true);
        }
        match c {
            Llc::For {
                index,
                from,
                to,
                body,
                ..
            } => {
                self.bound.push((*index, *from, (*to).max(*from)));
                self.list(std::slice::from_ref(body));
                self.bound.pop();
            }
            Llc::Parallel(p) => {
                self.bound.push((p.index, p.from, p.to.max(p.from)));
                self.list(std::slice::from_ref(&p.body));
                self.bound.pop();
            }
            Llc::If { body, .. } => self.list(std::slice::from_ref(body)),
            Llc::Lookup {
                symbol,
                extent,
                body,
                ..
            } => {
                self.leaf_reads(c, true);
                self.bound.push((*symbol, 0, (*extent as i64 - 1).max(0)));
                self.list(std::slice::from_ref(body));
                self.bound.pop();
            }
            _ => self.leaf_reads(c, false),
        }
        for (l, b) in self.levels.iter_mut().zip(saved) {
            l.blocked = b;
        }
        if self.failure.is_some() {
            return;
        }
        if kill_inside {
            if let Some(l) = self.levels.last_mut() {
                l.covers.clear();
            }
            return;
        }
        // What the statement surely writes covers later reads in this list.
        let added = self.sure_blocks(c);
        if let Some(l) = self.levels.last_mut() {
            for cells in added {
                insert(&mut l.covers, cells);
            }
        }
    }

    /// The blocks of cells of `tn` that statement `c` writes whatever the data (not under a
    /// guard or a lookup, not in local scopes), as flat offsets in the symbols bound outside
    /// `c`. A loop writes the union of its iterations' blocks where successive iterations'
    /// blocks touch or overlap: so a row written by a vector loop and then by one last
    /// vector or a scalar remainder loop is one block, and so are the rows of a loop around
    /// it.
    fn sure_blocks(&self, c: &Llc) -> Vec<Cells> {
        let mut out = vec![];
        match c {
            Llc::Seq(v) => {
                for b in v.iter().flat_map(|c| self.sure_blocks(c)) {
                    insert(&mut out, b);
                }
            }
            Llc::For {
                index,
                from,
                to,
                body,
                ..
            } => out = self.loop_blocks(*index, *from, *to, body),
            Llc::Parallel(p) => out = self.loop_blocks(p.index, p.from, p.to, &p.body),
            Llc::Set { tn, idcs, .. } if tn == self.tn => out.push(self.flat(idcs, 1)),
            Llc::VStore { tn, idcs, value } if tn == self.tn => {
                out.push(self.flat(idcs, value.ty().lanes))
            }
            Llc::ZeroOut(t) if t == self.tn => out.push(Cells {
                symbolic: vec![],
                lo: 0,
                hi: self.tn.numel() as i128 - 1,
                family: None,
            }),
            _ => {}
        }
        out
    }

    /// The blocks `for index in from..=to { body }` surely writes (see [`Self::sure_blocks`]).
    fn loop_blocks(&self, index: Symbol, from: i64, to: i64, body: &Llc) -> Vec<Cells> {
        let mut out = vec![];
        if from > to {
            return out;
        }
        for b in self.sure_blocks(body) {
            let c = b.symbolic.iter().find(|t| t.0 == index).map_or(0, |t| t.1);
            let symbolic: Vec<(Symbol, i128)> = b
                .symbolic
                .iter()
                .filter(|t| t.0 != index)
                .copied()
                .collect();
            let (first, last) = (c * from as i128, c * to as i128);
            let cells = if c == 0 {
                Cells { symbolic, ..b }
            } else if b.family.is_some() {
                continue; // one family deep at most
            } else if c.abs() > b.hi - b.lo + 1 {
                // Gaps between the iterations' blocks: a family.
                Cells {
                    symbolic,
                    family: Some((c, from, to)),
                    ..b
                }
            } else {
                Cells {
                    symbolic,
                    lo: b.lo + first.min(last),
                    hi: b.hi + first.max(last),
                    family: None,
                }
            };
            insert(&mut out, cells);
        }
        out
    }

    /// The flat offsets `idcs` (with `lanes`) touch, every symbol symbolic.
    fn flat(&self, idcs: &[AxisIndex], lanes: usize) -> Cells {
        self.cells(idcs, lanes, self.bound.len())
    }

    /// Checks the reads of `tn` a simple statement makes (a lookup: only its index read).
    fn leaf_reads(&mut self, c: &Llc, lookup_only: bool) {
        let mut reads: Vec<(&[AxisIndex], usize)> = vec![];
        if lookup_only {
            if let Llc::Lookup { tn, idcs, .. } = c {
                if tn == self.tn {
                    reads.push((idcs, 1));
                }
            }
        } else {
            let tn = self.tn;
            reads_of(c, &mut |t, idcs, lanes| {
                if t == tn {
                    reads.push((idcs, lanes));
                }
            });
        }
        for (idcs, lanes) in reads {
            if !self.covered(idcs, lanes) {
                let shown: Vec<String> = idcs.iter().map(|i| i.to_string()).collect();
                self.fail(format!(
                    "the read of {}[{}] may see cells not written before it",
                    self.tn.name(),
                    shown.join(", ")
                ));
                return;
            }
        }
    }

    fn covered(&self, idcs: &[AxisIndex], lanes: usize) -> bool {
        self.levels.iter().any(|l| {
            if l.blocked || l.covers.is_empty() {
                return false;
            }
            let cells = self.cells(idcs, lanes, l.depth);
            l.covers.iter().any(|c| match c.family {
                None => c.holds(&cells),
                Some(f) => self.in_family(idcs, lanes, l.depth, c, f),
            })
        })
    }

    /// Whether the cells `idcs` (with `lanes`) touch, at a level of `depth`, lie in the family
    /// `c`: one symbol of the read moves it by the family's stride over a range within the
    /// family's, and the rest of the read lies in the family's interval.
    fn in_family(
        &self,
        idcs: &[AxisIndex],
        lanes: usize,
        depth: usize,
        c: &Cells,
        (stride, from, to): (i128, i64, i64),
    ) -> bool {
        // A read within one member (a fixed row of packed panels).
        let cells = self.cells(idcs, lanes, depth);
        if c.symbolic == cells.symbolic {
            let t = (cells.lo - c.lo).div_euclid(stride);
            let member = |t: i128| {
                (from as i128..=to as i128).contains(&t)
                    && c.lo + stride * t <= cells.lo
                    && cells.hi <= c.hi + stride * t
            };
            if member(t) || member(t + 1) {
                return true;
            }
        }
        // A symbol of the read moving it by the family's stride (its coefficient in the flat
        // offset), over a range within the family's.
        let whole = self.flat(idcs, lanes);
        whole.symbolic.iter().any(|&(s, coef)| {
            // The innermost binding of `s`, and the read with `s` at 0.
            let Some(&(_, s_from, s_to)) = self.bound.iter().rev().find(|b| b.0 == s) else {
                return false;
            };
            let Some(pinned) = idcs
                .iter()
                .map(|ix| ix.substitute(s, AxisIndex::Fixed(0)))
                .collect::<Option<Vec<_>>>()
            else {
                return false;
            };
            coef == stride
                && from <= s_from
                && s_to <= to
                && c.holds(&self.cells(&pinned, lanes, depth))
        })
    }
}

/// Adds `cells` to a set of blocks, merging it with the blocks it overlaps or touches.
fn insert(covers: &mut Vec<Cells>, mut cells: Cells) {
    let mut k = 0;
    while k < covers.len() {
        let c = &covers[k];
        if c.symbolic == cells.symbolic
            && c.family == cells.family
            && c.lo <= cells.hi + 1
            && cells.lo <= c.hi + 1
        {
            cells.lo = cells.lo.min(c.lo);
            cells.hi = cells.hi.max(c.hi);
            covers.swap_remove(k);
            k = 0;
            continue;
        }
        k += 1;
    }
    covers.push(cells);
}

impl ParallelLoop {
    /// The work of one iteration (see [`parallel_work`]).
    pub fn iteration_work(&self) -> u64 {
        parallel_work(&self.body)
    }
}
