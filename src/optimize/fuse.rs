//! Fusion across statements, and the dead stores it makes visible.
//!
//! **Fusion.** Consecutive top-level loop nests over the same outer range become one loop
//! when each iteration of the fused loop touches, of every tensor that one of them writes and
//! another accesses, only one slice: every access of such a tensor indexes one axis `p` with
//! the outer iterator itself. Iteration `i` of a later nest then depends only on iteration
//! `i` of the earlier ones, so running them iteration by iteration computes exactly what
//! running them one after the other computes (bit for bit: no operation is reordered within a
//! slice). A softmax over rows (row max, subtract and `exp`, row sum, divide) becomes one
//! loop over rows whose body runs the four statements on one row. Loops holding vector code
//! (GEMM kernels) are left alone.
//!
//! **Slice-sized locals.** A routine-local tensor (memory mode `Local`) that is written whole
//! before anything reads it, and that only one fused loop accesses, always at the current
//! slice, shrinks to one slice: `e[i, j]` becomes `e_row[j]`, reused by every iteration. The
//! intermediates of a softmax or a layer norm stay in L1 instead of streaming through memory.
//!
//! **Dead stores.** Local tensors are zero at the start of a call unless every element is
//! written before it is read; [`full_writes`] finds those (the first statement touching them
//! writes every element without reading them), so their zero fill is dropped.
//!
//! The fused code is printed like any loop: one `for` over the outer axis around the
//! statements' inner loops.

use crate::ir::{AxisIndex, Symbol, Tnode};
use crate::loops::{visit_llc, visit_values, visit_vectors, Llc, Llv, Vlv};
use std::collections::{HashMap, HashSet};

/// What fusion produced.
pub struct Fused {
    /// The code.
    pub code: Llc,
    /// Local tensors replaced by slice-sized locals: they no longer appear in the code.
    pub replaced: Vec<Tnode>,
    /// The slice-sized locals (memory mode `Local`, written before read in every iteration).
    pub locals: Vec<Tnode>,
}

/// One access of a tensor: its indices (`None`: every element, a zero fill) and whether it
/// writes.
struct Access {
    tn: Tnode,
    idcs: Option<Vec<AxisIndex>>,
    write: bool,
}

fn accesses(c: &Llc) -> Vec<Access> {
    let mut out = vec![];
    visit_llc(c, &mut |c| match c {
        Llc::Set { tn, idcs, .. } | Llc::VStore { tn, idcs, .. } => out.push(Access {
            tn: tn.clone(),
            idcs: Some(idcs.clone()),
            write: true,
        }),
        Llc::ZeroOut(tn) => out.push(Access {
            tn: tn.clone(),
            idcs: None,
            write: true,
        }),
        Llc::Lookup { tn, idcs, .. } => out.push(Access {
            tn: tn.clone(),
            idcs: Some(idcs.clone()),
            write: false,
        }),
        _ => {}
    });
    visit_values(c, &mut |v| {
        if let Llv::Get(tn, idcs) = v {
            out.push(Access {
                tn: tn.clone(),
                idcs: Some(idcs.clone()),
                write: false,
            })
        }
    });
    visit_vectors(c, &mut |v| {
        if let Vlv::Load(_, tn, idcs) = v {
            out.push(Access {
                tn: tn.clone(),
                idcs: Some(idcs.clone()),
                write: false,
            })
        }
    });
    out
}

fn has_vectors(c: &Llc) -> bool {
    let mut hit = false;
    visit_llc(c, &mut |c| {
        if matches!(c, Llc::VSet(..) | Llc::VStore { .. }) {
            hit = true
        }
    });
    hit
}

/// The axis at which every access of `tn` among `acc` is the iterator `g` itself, if any.
fn aligned_axis<'a>(
    tn: &Tnode,
    acc: impl Iterator<Item = &'a Access> + Clone,
    g: Symbol,
) -> Option<usize> {
    let rank = tn.dims().len();
    (0..rank).find(|&p| {
        acc.clone().filter(|a| &a.tn == tn).all(|a| {
            a.idcs
                .as_ref()
                .is_some_and(|i| i.get(p) == Some(&AxisIndex::Iterator(g)))
        })
    })
}

/// How the statements of a fused loop (or one candidate) use one tensor: whether any writes
/// it, and the axes at which every access so far is the loop's iterator itself.
#[derive(Clone)]
struct TensorUse {
    written: bool,
    aligned: Vec<usize>,
}

/// The uses of every tensor among `acc`, accesses of the loop over `g`.
fn summarize(acc: &[Access], g: Symbol) -> HashMap<Tnode, TensorUse> {
    let mut out: HashMap<Tnode, TensorUse> = HashMap::new();
    for a in acc {
        let here: Vec<usize> = match &a.idcs {
            Some(idcs) => (0..idcs.len())
                .filter(|&p| idcs[p] == AxisIndex::Iterator(g))
                .collect(),
            None => vec![],
        };
        match out.get_mut(&a.tn) {
            Some(u) => {
                u.written |= a.write;
                u.aligned.retain(|p| here.contains(p));
            }
            None => {
                out.insert(
                    a.tn.clone(),
                    TensorUse {
                        written: a.write,
                        aligned: here,
                    },
                );
            }
        }
    }
    out
}

/// Whether a loop nest using tensors as `next` says may join a fused loop using them as
/// `group` says (both over the same iterator): every tensor that one of them writes and both
/// access is accessed, by all of them, at one slice of the iterator (one common axis).
/// Linear in the size of `next`, so fusing `n` statements is linear in `n`.
fn may_join(group: &HashMap<Tnode, TensorUse>, next: &HashMap<Tnode, TensorUse>) -> bool {
    next.iter().all(|(tn, b)| match group.get(tn) {
        Some(a) if a.written || b.written => a.aligned.iter().any(|p| b.aligned.contains(p)),
        _ => true,
    })
}

/// Adds the uses `next` to the uses `group` of a fused loop.
fn merge_uses(group: &mut HashMap<Tnode, TensorUse>, next: HashMap<Tnode, TensorUse>) {
    for (tn, b) in next {
        match group.get_mut(&tn) {
            Some(a) => {
                a.written |= b.written;
                a.aligned.retain(|p| b.aligned.contains(p));
            }
            None => {
                group.insert(tn, b);
            }
        }
    }
}

/// The most statements one fused loop takes: the C writer splits a routine into parts only
/// between top-level statements, so an unbounded fused loop would make one huge C function
/// (100,000 statements over one row would compile super-linearly).
const MAX_MEMBERS: usize = 256;

/// The tensors whose every element the code writes before reading any: the first top-level
/// statement touching each one writes all its elements (a zero fill, or a perfect loop nest
/// over the whole tensor storing a value that does not read it).
pub fn full_writes(code: &Llc) -> HashSet<Tnode> {
    let top: &[Llc] = match code {
        Llc::Seq(v) => v,
        c => std::slice::from_ref(c),
    };
    let mut seen: HashSet<Tnode> = HashSet::new();
    let mut out = HashSet::new();
    for c in top {
        let written = writes_whole(c);
        for a in accesses(c) {
            if seen.insert(a.tn.clone()) && written.as_ref() == Some(&a.tn) {
                out.insert(a.tn);
            }
        }
    }
    out
}

/// The tensor `c` writes whole without reading it, when `c` is a zero fill or a perfect loop
/// nest around one store at plain iterators covering every axis.
fn writes_whole(c: &Llc) -> Option<Tnode> {
    let mut ranges: HashMap<Symbol, (i64, i64)> = HashMap::new();
    let mut c = c;
    loop {
        match c {
            Llc::ZeroOut(tn) => return Some(tn.clone()),
            Llc::For {
                index,
                from,
                to,
                body,
                ..
            } => {
                ranges.insert(*index, (*from, *to));
                c = body;
            }
            Llc::Seq(v) if v.len() == 1 => c = &v[0],
            Llc::Set { tn, idcs, value } => {
                let mut used = HashSet::new();
                let covers = idcs.len() == tn.dims().len()
                    && idcs.iter().zip(tn.dims()).all(|(ix, &d)| match ix {
                        AxisIndex::Fixed(0) => d == 1,
                        AxisIndex::Iterator(s) => {
                            used.insert(*s) && ranges.get(s) == Some(&(0, d as i64 - 1))
                        }
                        _ => false,
                    })
                    && used.len() == ranges.len();
                let mut reads_it = false;
                crate::loops::visit_value(value, &mut |v| {
                    if matches!(v, Llv::Get(t, _) if t == tn) {
                        reads_it = true
                    }
                });
                return (covers && !reads_it).then(|| tn.clone());
            }
            _ => return None,
        }
    }
}

/// A loop nest storing 0 into every element of `tn` (the same as `ZeroOut(tn)`).
fn zero_nest(tn: &Tnode) -> Llc {
    let mut loops = vec![];
    let idcs = tn
        .dims()
        .iter()
        .map(|&d| {
            if d == 1 {
                AxisIndex::Fixed(0)
            } else {
                let s = Symbol::fresh();
                loops.push((s, d));
                AxisIndex::Iterator(s)
            }
        })
        .collect();
    let mut c = Llc::Set {
        tn: tn.clone(),
        idcs,
        value: Llv::Constant(0.0),
    };
    for &(s, d) in loops.iter().rev() {
        c = Llc::for_loop(s, 0, d as i64 - 1, c);
    }
    c
}

fn outer_range(c: &Llc) -> Option<(i64, i64)> {
    match c {
        Llc::For { from, to, body, .. } if !has_vectors(body) => Some((*from, *to)),
        _ => None,
    }
}

/// A zero fill next to a loop over its first axis becomes a loop nest, so that it can fuse.
fn zero_fills_to_loops(top: Vec<Llc>) -> Vec<Llc> {
    let ranges: Vec<Option<(i64, i64)>> = top.iter().map(outer_range).collect();
    let neighbour = |k: usize, step: isize| {
        let mut j = k as isize + step;
        while j >= 0 && (j as usize) < top.len() {
            match &top[j as usize] {
                Llc::Comment(_) => j += step,
                _ => return ranges[j as usize],
            }
        }
        None
    };
    let mut out = Vec::with_capacity(top.len());
    for (k, c) in top.iter().enumerate() {
        match c {
            Llc::ZeroOut(tn) if tn.dims()[0] > 1 => {
                let first = Some((0, tn.dims()[0] as i64 - 1));
                if neighbour(k, -1) == first || neighbour(k, 1) == first {
                    out.push(zero_nest(tn));
                    continue;
                }
                out.push(c.clone())
            }
            _ => out.push(c.clone()),
        }
    }
    out
}

/// A fused loop being built: its iterator and range, the statements joined (with their
/// iterator renamed), their accesses, and the original statements (emitted unchanged when
/// nothing joins the first one).
struct Group {
    index: Symbol,
    from: i64,
    to: i64,
    body: Vec<Llc>,
    uses: HashMap<Tnode, TensorUse>,
    originals: Vec<Llc>,
    members: usize,
}

impl Group {
    fn start(c: Llc) -> Result<Group, Llc> {
        let Llc::For {
            index,
            from,
            to,
            body,
            ..
        } = &c
        else {
            return Err(c);
        };
        if has_vectors(body) {
            return Err(c);
        }
        Ok(Group {
            index: *index,
            from: *from,
            to: *to,
            uses: summarize(&accesses(body), *index),
            body: vec![(**body).clone()],
            originals: vec![c.clone()],
            members: 1,
        })
    }

    /// Joins `c` if it loops over the same range and the accesses allow it; gives it back
    /// otherwise.
    fn join(&mut self, c: Llc) -> Result<(), Llc> {
        if let Llc::Comment(_) = c {
            self.body.push(c.clone());
            self.originals.push(c);
            return Ok(());
        }
        let Llc::For {
            index,
            from,
            to,
            body,
            ..
        } = &c
        else {
            return Err(c);
        };
        if (*from, *to) != (self.from, self.to) || has_vectors(body) || self.members >= MAX_MEMBERS
        {
            return Err(c);
        }
        let g = AxisIndex::Iterator(self.index);
        let Some(renamed) = crate::loops::map_indices(body, &mut |ix| ix.substitute(*index, g))
        else {
            return Err(c);
        };
        let uses = summarize(&accesses(&renamed), self.index);
        if !may_join(&self.uses, &uses) {
            return Err(c);
        }
        merge_uses(&mut self.uses, uses);
        self.body.push(renamed);
        self.originals.push(c);
        self.members += 1;
        Ok(())
    }

    /// The fused loop (and the comments that followed its last member), or the original
    /// statements when nothing joined.
    fn finish(mut self, out: &mut Vec<Llc>, fused: &mut Vec<usize>) {
        let trailing = self
            .body
            .iter()
            .rev()
            .take_while(|c| matches!(c, Llc::Comment(_)))
            .count();
        if self.members < 2 {
            out.extend(self.originals);
            return;
        }
        let tail = self.body.split_off(self.body.len() - trailing);
        fused.push(out.len());
        out.push(Llc::for_loop(
            self.index,
            self.from,
            self.to,
            Llc::Seq(self.body),
        ));
        out.extend(tail);
    }
}

/// Fuses the top-level loop nests of `code` and shrinks the local tensors `locals` (the
/// routine's nodes of memory mode `Local`) that only one fused loop uses, one slice at a
/// time, to slice-sized locals. `written_first` are the tensors every element of which is
/// written before it is read ([`full_writes`] of the code before fusion).
pub fn fuse(code: Llc, locals: &HashSet<Tnode>, written_first: &HashSet<Tnode>) -> Fused {
    let top = match code {
        Llc::Seq(v) => v,
        c => vec![c],
    };
    let top = zero_fills_to_loops(top);
    let mut out: Vec<Llc> = Vec::with_capacity(top.len());
    let mut fused_at: Vec<usize> = vec![];
    let mut group: Option<Group> = None;
    for c in top {
        let c = match group.as_mut() {
            Some(g) => match g.join(c) {
                Ok(()) => continue,
                Err(c) => {
                    if let Some(g) = group.take() {
                        g.finish(&mut out, &mut fused_at);
                    }
                    c
                }
            },
            None => c,
        };
        match Group::start(c) {
            Ok(g) => group = Some(g),
            Err(c) => out.push(c),
        }
    }
    if let Some(g) = group.take() {
        g.finish(&mut out, &mut fused_at);
    }
    // Slice-sized locals.
    let mut uses: HashMap<Tnode, usize> = HashMap::new();
    for c in &out {
        for a in accesses(c) {
            *uses.entry(a.tn).or_default() += 1;
        }
    }
    let mut replaced = vec![];
    let mut new_locals = vec![];
    for k in fused_at {
        let Llc::For { index, body, .. } = &out[k] else {
            continue;
        };
        let g = *index;
        let acc = accesses(body);
        let mut counts: HashMap<&Tnode, usize> = HashMap::new();
        for a in &acc {
            *counts.entry(&a.tn).or_default() += 1;
        }
        // In node order, so that the new locals (and their names in the C) do not depend on
        // hashing.
        let mut counts: Vec<(&Tnode, usize)> = counts.into_iter().collect();
        counts.sort();
        let mut shrink: HashMap<Tnode, (usize, Tnode)> = HashMap::new();
        for (tn, n) in counts {
            if !locals.contains(tn) || !written_first.contains(tn) || uses.get(tn) != Some(&n) {
                continue;
            }
            let Some(p) = aligned_axis(tn, acc.iter(), g) else {
                continue;
            };
            let mut dims = tn.dims().to_vec();
            dims.remove(p);
            if dims.is_empty() {
                dims.push(1);
            }
            let label: Vec<&str> = tn
                .label()
                .iter()
                .map(String::as_str)
                .chain(["row"])
                .collect();
            let Ok(row) = Tnode::builder(&label, &dims, tn.prec())
                .memory_with_provenance(
                    crate::ir::MemoryMode::Local,
                    crate::ir::tnode::provenance::FUSED,
                )
                .build()
            else {
                continue;
            };
            shrink.insert(tn.clone(), (p, row));
        }
        if shrink.is_empty() {
            continue;
        }
        let mut f = |tn: &Tnode, idcs: &[AxisIndex]| {
            let (p, row) = shrink.get(tn)?;
            let mut idcs = idcs.to_vec();
            idcs.remove(*p);
            if idcs.is_empty() {
                idcs.push(AxisIndex::Fixed(0));
            }
            Some((row.clone(), idcs))
        };
        out[k] = map_tensors(&out[k], &mut f);
        for (tn, (_, row)) in shrink {
            replaced.push(tn);
            new_locals.push(row);
        }
    }
    replaced.sort();
    new_locals.sort();
    Fused {
        code: Llc::Seq(out),
        replaced,
        locals: new_locals,
    }
}

/// Rebuilds scalar code with every access `tn[idcs]` for which `f` answers replaced by the
/// access it answers. Vector statements are kept as they are (fused loops hold none).
fn map_tensors(
    c: &Llc,
    f: &mut impl FnMut(&Tnode, &[AxisIndex]) -> Option<(Tnode, Vec<AxisIndex>)>,
) -> Llc {
    type Access<'a> = dyn FnMut(&Tnode, &[AxisIndex]) -> (Tnode, Vec<AxisIndex>) + 'a;
    fn val(v: &Llv, a: &mut Access) -> Llv {
        match v {
            Llv::Get(tn, idcs) => {
                let (tn, idcs) = a(tn, idcs);
                Llv::Get(tn, idcs)
            }
            Llv::LocalScope {
                id,
                body,
                orig_indices,
            } => Llv::LocalScope {
                id: id.clone(),
                body: Box::new(stmt(body, a)),
                orig_indices: orig_indices.clone(),
            },
            Llv::Binop(op, x, y) => Llv::Binop(*op, Box::new(val(x, a)), Box::new(val(y, a))),
            Llv::Unop(op, x) => Llv::Unop(*op, Box::new(val(x, a))),
            Llv::Ternop(op, x, y, z) => Llv::Ternop(
                *op,
                Box::new(val(x, a)),
                Box::new(val(y, a)),
                Box::new(val(z, a)),
            ),
            v => v.clone(),
        }
    }
    fn stmt(c: &Llc, a: &mut Access) -> Llc {
        // A lookup's own read of the index tensor is an access too.
        if let Llc::Lookup {
            symbol,
            tn,
            idcs,
            extent,
            body,
        } = c
        {
            let (tn, idcs) = a(tn, idcs);
            return Llc::Lookup {
                symbol: *symbol,
                tn,
                idcs,
                extent: *extent,
                body: Box::new(stmt(body, a)),
            };
        }
        if let Some(b) = crate::loops::map_block(c, &mut |c| stmt(c, a)) {
            return b;
        }
        match c {
            Llc::Set { tn, idcs, value } => {
                let value = val(value, a);
                let (tn, idcs) = a(tn, idcs);
                Llc::Set { tn, idcs, value }
            }
            Llc::SetLocal(id, v) => Llc::SetLocal(id.clone(), val(v, a)),
            c => c.clone(),
        }
    }
    let mut access =
        |tn: &Tnode, idcs: &[AxisIndex]| f(tn, idcs).unwrap_or_else(|| (tn.clone(), idcs.to_vec()));
    stmt(c, &mut access)
}
