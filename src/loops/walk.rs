//! Traversals of the loop IR shared by the optimizer, the C writer and the interpreter.

use super::{Llc, Llv, Vlv};
use crate::ir::{AxisIndex, Tnode};

/// Calls `f` on every statement, outermost first, including statements inside local scopes
/// (the borrows `f` gets live as long as `c`'s).
pub fn visit_llc<'a>(c: &'a Llc, f: &mut impl FnMut(&'a Llc)) {
    f(c);
    match c {
        Llc::Seq(v) => v.iter().for_each(|c| visit_llc(c, f)),
        Llc::For { body, .. } | Llc::If { body, .. } | Llc::Lookup { body, .. } => {
            visit_llc(body, f)
        }
        Llc::Parallel(p) => visit_llc(&p.body, f),
        Llc::Set { value, .. } | Llc::SetLocal(_, value) => stmts_in_value(value, f),
        Llc::VSet(_, v) | Llc::VStore { value: v, .. } => {
            visit_vlv(v, &mut |v| {
                if let Vlv::Splat(_, x) = v {
                    stmts_in_value(x, f)
                }
            });
        }
        Llc::Noop | Llc::Comment(_) | Llc::ZeroOut(_) | Llc::Prefetch { .. } => {}
    }
}

/// `c` with its body replaced by `f(body)` when it has one (a `For`, a `Parallel`, an `If`
/// or a `Lookup`, whose loop, guards or lookup are kept); any other statement unchanged.
pub fn map_body(mut c: Llc, f: impl FnOnce(Llc) -> Llc) -> Llc {
    let body = match &mut c {
        Llc::For { body, .. } | Llc::If { body, .. } | Llc::Lookup { body, .. } => &mut **body,
        Llc::Parallel(p) => &mut p.body,
        _ => return c,
    };
    *body = f(std::mem::replace(body, Llc::Noop));
    c
}

/// `c` rebuilt with `f` applied to the statements directly inside it when it is a block: the
/// items of a `Seq`, the body of a `For`, an `If` or a `Lookup` (whose lookup itself is kept).
/// `None` for any other statement, which the caller rebuilds itself.
pub fn map_block(c: &Llc, f: &mut impl FnMut(&Llc) -> Llc) -> Option<Llc> {
    Some(match c {
        Llc::Seq(v) => Llc::Seq(v.iter().map(&mut *f).collect()),
        Llc::For {
            index,
            from,
            to,
            body,
            trace_it,
        } => Llc::For {
            index: *index,
            from: *from,
            to: *to,
            body: Box::new(f(body)),
            trace_it: *trace_it,
        },
        Llc::If { guards, body } => Llc::If {
            guards: guards.clone(),
            body: Box::new(f(body)),
        },
        Llc::Lookup {
            symbol,
            tn,
            idcs,
            extent,
            body,
        } => Llc::Lookup {
            symbol: *symbol,
            tn: tn.clone(),
            idcs: idcs.clone(),
            extent: *extent,
            body: Box::new(f(body)),
        },
        _ => return None,
    })
}

fn stmts_in_value<'a>(v: &'a Llv, f: &mut impl FnMut(&'a Llc)) {
    match v {
        Llv::LocalScope { body, .. } => visit_llc(body, f),
        Llv::Binop(_, a, b) => {
            stmts_in_value(a, f);
            stmts_in_value(b, f);
        }
        Llv::Unop(_, a) => stmts_in_value(a, f),
        Llv::Ternop(_, a, b, c) => {
            stmts_in_value(a, f);
            stmts_in_value(b, f);
            stmts_in_value(c, f);
        }
        _ => {}
    }
}

/// Calls `f` on every scalar value, outermost first, including values inside local scopes
/// and the scalars that vectors broadcast.
pub fn visit_values<'a>(c: &'a Llc, f: &mut impl FnMut(&'a Llv)) {
    fn go_v<'a>(v: &'a Llv, f: &mut impl FnMut(&'a Llv)) {
        f(v);
        match v {
            Llv::LocalScope { body, .. } => visit_values(body, f),
            Llv::Binop(_, a, b) => {
                go_v(a, f);
                go_v(b, f);
            }
            Llv::Unop(_, a) => go_v(a, f),
            Llv::Ternop(_, a, b, c) => {
                go_v(a, f);
                go_v(b, f);
                go_v(c, f);
            }
            _ => {}
        }
    }
    match c {
        Llc::Seq(v) => v.iter().for_each(|c| visit_values(c, f)),
        Llc::For { body, .. } | Llc::If { body, .. } | Llc::Lookup { body, .. } => {
            visit_values(body, f)
        }
        Llc::Parallel(p) => visit_values(&p.body, f),
        Llc::Set { value, .. } | Llc::SetLocal(_, value) => go_v(value, f),
        Llc::VSet(_, v) | Llc::VStore { value: v, .. } => visit_vlv(v, &mut |v| {
            if let Vlv::Splat(_, x) = v {
                go_v(x, f)
            }
        }),
        Llc::Noop | Llc::Comment(_) | Llc::ZeroOut(_) | Llc::Prefetch { .. } => {}
    }
}

/// Calls `f` on a scalar value and every value inside it, outermost first (including values
/// inside local scopes).
pub fn visit_value(v: &Llv, f: &mut impl FnMut(&Llv)) {
    f(v);
    match v {
        Llv::LocalScope { body, .. } => visit_values(body, f),
        Llv::Binop(_, a, b) => {
            visit_value(a, f);
            visit_value(b, f);
        }
        Llv::Unop(_, a) => visit_value(a, f),
        Llv::Ternop(_, a, b, c) => {
            visit_value(a, f);
            visit_value(b, f);
            visit_value(c, f);
        }
        _ => {}
    }
}

/// Calls `f` on every index used inside a scalar value.
pub fn visit_value_indices(v: &Llv, f: &mut impl FnMut(&AxisIndex)) {
    visit_value(v, &mut |v| match v {
        Llv::Get(_, idcs) | Llv::GetMergeBuffer(_, idcs) => idcs.iter().for_each(&mut *f),
        Llv::LocalScope {
            body, orig_indices, ..
        } => {
            orig_indices.iter().for_each(&mut *f);
            visit_llc(body, &mut |c| {
                if let Llc::Set { idcs, .. } | Llc::VStore { idcs, .. } = c {
                    idcs.iter().for_each(&mut *f)
                }
            });
        }
        Llv::EmbedIndex(ix) => f(ix),
        Llv::Random { idcs, .. } => idcs.iter().for_each(&mut *f),
        _ => {}
    });
}

pub(crate) fn visit_vlv<'a>(v: &'a Vlv, f: &mut impl FnMut(&'a Vlv)) {
    f(v);
    match v {
        Vlv::Fma(a, b, c) | Vlv::DotPairs(a, b, c) | Vlv::Ternop(_, a, b, c) => {
            visit_vlv(a, f);
            visit_vlv(b, f);
            visit_vlv(c, f);
        }
        Vlv::Binop(_, a, b) | Vlv::Shuffle(a, b, _) => {
            visit_vlv(a, f);
            visit_vlv(b, f);
        }
        Vlv::Repeat(a, _) | Vlv::Unop(_, a) => visit_vlv(a, f),
        Vlv::Reg(_) | Vlv::Zero(_) | Vlv::Splat(..) | Vlv::Load(..) => {}
    }
}

/// Calls `f` on every vector value, outermost first.
pub fn visit_vectors<'a>(c: &'a Llc, f: &mut impl FnMut(&'a Vlv)) {
    visit_llc(c, &mut |c| {
        if let Llc::VSet(_, v) | Llc::VStore { value: v, .. } = c {
            visit_vlv(v, f)
        }
    });
}

/// Calls `f(node, indices, lanes)` on every read of a tensor: scalar reads (1 lane), reads of
/// the merge buffer (with `merge` true), vector loads and the index reads of
/// [`Llc::Lookup`] (1 lane).
pub fn visit_reads<'a>(c: &'a Llc, f: &mut impl FnMut(&'a Tnode, &'a [AxisIndex], usize, bool)) {
    visit_llc(c, &mut |c| {
        if let Llc::Lookup { tn, idcs, .. } = c {
            f(tn, idcs, 1, false)
        }
    });
    visit_values(c, &mut |v| match v {
        Llv::Get(tn, idcs) => f(tn, idcs, 1, false),
        Llv::GetMergeBuffer(tn, idcs) => f(tn, idcs, 1, true),
        _ => {}
    });
    visit_vectors(c, &mut |v| {
        if let Vlv::Load(t, tn, idcs) = v {
            f(tn, idcs, t.lanes, false)
        }
    });
}

/// Calls `f` on every index of every access (reads, writes, embedded index values).
pub fn visit_indices(c: &Llc, f: &mut impl FnMut(&AxisIndex)) {
    visit_llc(c, &mut |c| match c {
        Llc::Set { idcs, .. } | Llc::VStore { idcs, .. } | Llc::Lookup { idcs, .. } => {
            idcs.iter().for_each(&mut *f)
        }
        Llc::If { guards, .. } => guards.iter().for_each(|(ix, _)| f(ix)),
        Llc::Prefetch { offset, .. } => f(offset),
        _ => {}
    });
    visit_values(c, &mut |v| match v {
        Llv::Get(_, idcs) | Llv::GetMergeBuffer(_, idcs) => idcs.iter().for_each(&mut *f),
        // (A local scope's `orig_indices` record where an inlined node was read; they are
        // not an access, and may name iterators of loops the inlining removed.)
        Llv::EmbedIndex(ix) => f(ix),
        Llv::Random { idcs, .. } => idcs.iter().for_each(&mut *f),
        _ => {}
    });
    visit_vectors(c, &mut |v| {
        if let Vlv::Load(_, _, idcs) = v {
            idcs.iter().for_each(&mut *f)
        }
    });
}

/// [`map_indices`] for a value.
pub fn map_value_indices(
    v: &Llv,
    f: &mut impl FnMut(AxisIndex) -> Option<AxisIndex>,
) -> Option<Llv> {
    Some(match v {
        Llv::Get(t, i) => Llv::Get(t.clone(), idcs(i, f)?),
        Llv::GetMergeBuffer(t, i) => Llv::GetMergeBuffer(t.clone(), idcs(i, f)?),
        Llv::EmbedIndex(i) => Llv::EmbedIndex(f(*i)?),
        Llv::Random {
            seed,
            idcs: i,
            dims,
            prec,
        } => Llv::Random {
            seed: *seed,
            idcs: idcs(i, f)?,
            dims: dims.clone(),
            prec: *prec,
        },
        Llv::Ternop(op, a, b, c) => Llv::Ternop(
            *op,
            Box::new(map_value_indices(a, f)?),
            Box::new(map_value_indices(b, f)?),
            Box::new(map_value_indices(c, f)?),
        ),
        Llv::Binop(op, a, b) => Llv::Binop(
            *op,
            Box::new(map_value_indices(a, f)?),
            Box::new(map_value_indices(b, f)?),
        ),
        Llv::Unop(op, a) => Llv::Unop(*op, Box::new(map_value_indices(a, f)?)),
        Llv::LocalScope {
            id,
            body,
            orig_indices,
        } => Llv::LocalScope {
            id: id.clone(),
            body: Box::new(map_indices(body, f)?),
            orig_indices: idcs(orig_indices, f)?,
        },
        v @ (Llv::GetLocal(_) | Llv::GetCFunction(_) | Llv::Constant(_)) => v.clone(),
    })
}

fn idcs(
    v: &[AxisIndex],
    f: &mut impl FnMut(AxisIndex) -> Option<AxisIndex>,
) -> Option<Vec<AxisIndex>> {
    v.iter().map(|i| f(*i)).collect()
}

/// Rebuilds the code with every index replaced by `f(index)`; `None` if `f` refuses one.
pub fn map_indices(c: &Llc, f: &mut impl FnMut(AxisIndex) -> Option<AxisIndex>) -> Option<Llc> {
    fn vector(v: &Vlv, f: &mut impl FnMut(AxisIndex) -> Option<AxisIndex>) -> Option<Vlv> {
        Some(match v {
            Vlv::Reg(_) | Vlv::Zero(_) => v.clone(),
            Vlv::Splat(t, x) => Vlv::Splat(*t, Box::new(map_value_indices(x, f)?)),
            Vlv::Load(t, tn, i) => Vlv::Load(*t, tn.clone(), idcs(i, f)?),
            Vlv::Fma(a, b, c) => Vlv::Fma(
                Box::new(vector(a, f)?),
                Box::new(vector(b, f)?),
                Box::new(vector(c, f)?),
            ),
            Vlv::Binop(op, a, b) => {
                Vlv::Binop(*op, Box::new(vector(a, f)?), Box::new(vector(b, f)?))
            }
            Vlv::Shuffle(a, b, idx) => Vlv::Shuffle(
                Box::new(vector(a, f)?),
                Box::new(vector(b, f)?),
                idx.clone(),
            ),
            Vlv::Repeat(a, times) => Vlv::Repeat(Box::new(vector(a, f)?), *times),
            Vlv::Unop(op, a) => Vlv::Unop(*op, Box::new(vector(a, f)?)),
            Vlv::Ternop(op, a, b, c) => Vlv::Ternop(
                *op,
                Box::new(vector(a, f)?),
                Box::new(vector(b, f)?),
                Box::new(vector(c, f)?),
            ),
            Vlv::DotPairs(a, b, c) => Vlv::DotPairs(
                Box::new(vector(a, f)?),
                Box::new(vector(b, f)?),
                Box::new(vector(c, f)?),
            ),
        })
    }
    Some(match c {
        Llc::Seq(v) => Llc::Seq(v.iter().map(|c| map_indices(c, f)).collect::<Option<_>>()?),
        Llc::For {
            index,
            from,
            to,
            body,
            trace_it,
        } => Llc::For {
            index: *index,
            from: *from,
            to: *to,
            body: Box::new(map_indices(body, f)?),
            trace_it: *trace_it,
        },
        Llc::Parallel(p) => Llc::Parallel(Box::new(super::ParallelLoop {
            index: p.index,
            from: p.from,
            to: p.to,
            body: map_indices(&p.body, f)?,
            private: p.private.clone(),
            grain: p.grain,
        })),
        Llc::If { guards, body } => Llc::If {
            guards: guards
                .iter()
                .map(|(ix, n)| Some((f(*ix)?, *n)))
                .collect::<Option<_>>()?,
            body: Box::new(map_indices(body, f)?),
        },
        Llc::Lookup {
            symbol,
            tn,
            idcs: i,
            extent,
            body,
        } => Llc::Lookup {
            symbol: *symbol,
            tn: tn.clone(),
            idcs: idcs(i, f)?,
            extent: *extent,
            body: Box::new(map_indices(body, f)?),
        },
        Llc::Set {
            tn,
            idcs: i,
            value: v,
        } => Llc::Set {
            tn: tn.clone(),
            idcs: idcs(i, f)?,
            value: map_value_indices(v, f)?,
        },
        Llc::SetLocal(id, v) => Llc::SetLocal(id.clone(), map_value_indices(v, f)?),
        Llc::VSet(r, v) => Llc::VSet(*r, vector(v, f)?),
        Llc::VStore {
            tn,
            idcs: i,
            value: v,
        } => Llc::VStore {
            tn: tn.clone(),
            idcs: idcs(i, f)?,
            value: vector(v, f)?,
        },
        c @ (Llc::Noop | Llc::Comment(_) | Llc::ZeroOut(_)) => c.clone(),
        Llc::Prefetch { tn, offset, write } => Llc::Prefetch {
            tn: tn.clone(),
            offset: f(*offset)?,
            write: *write,
        },
    })
}

/// `c` with each statement of `decisions` (found by address, a statement of `c`) replaced by
/// its replacement: how a pass that decided on borrowed statements rebuilds the code.
pub(crate) fn replace_statements(c: &Llc, decisions: &[(&Llc, Llc)]) -> Llc {
    if let Some((_, r)) = decisions.iter().find(|(x, _)| std::ptr::eq(*x, c)) {
        return r.clone();
    }
    map_block(c, &mut |c| replace_statements(c, decisions)).unwrap_or_else(|| c.clone())
}

/// `c` with the local arrays of `nodes` (`(from, to)` pairs) and the vector variables of
/// `regs` (by id) replaced by their counterparts, everything else as it is: a copy of a loop
/// body working on its own scratch arrays and registers. `None` for code this does not
/// rename: scalar locals (`SetLocal`, local scopes) and parallel regions.
pub(crate) fn rename(
    c: &Llc,
    nodes: &[(Tnode, Tnode)],
    regs: &std::collections::HashMap<u32, super::VReg>,
) -> Option<Llc> {
    let node = |t: &Tnode| {
        nodes
            .iter()
            .find(|(from, _)| from == t)
            .map_or_else(|| t.clone(), |(_, to)| to.clone())
    };
    let reg = |r: &super::VReg| regs.get(&r.id).copied().unwrap_or(*r);
    fn value(v: &Llv, node: &impl Fn(&Tnode) -> Tnode) -> Option<Llv> {
        Some(match v {
            Llv::Get(t, i) => Llv::Get(node(t), i.clone()),
            Llv::GetMergeBuffer(t, i) => Llv::GetMergeBuffer(node(t), i.clone()),
            Llv::Binop(op, a, b) => {
                Llv::Binop(*op, Box::new(value(a, node)?), Box::new(value(b, node)?))
            }
            Llv::Unop(op, a) => Llv::Unop(*op, Box::new(value(a, node)?)),
            Llv::Ternop(op, a, b, c) => Llv::Ternop(
                *op,
                Box::new(value(a, node)?),
                Box::new(value(b, node)?),
                Box::new(value(c, node)?),
            ),
            Llv::LocalScope { .. } | Llv::GetLocal(_) => return None,
            v @ (Llv::EmbedIndex(_)
            | Llv::Random { .. }
            | Llv::GetCFunction(_)
            | Llv::Constant(_)) => v.clone(),
        })
    }
    fn vector(
        v: &Vlv,
        node: &impl Fn(&Tnode) -> Tnode,
        reg: &impl Fn(&super::VReg) -> super::VReg,
    ) -> Option<Vlv> {
        let go = |v: &Vlv| vector(v, node, reg).map(Box::new);
        Some(match v {
            Vlv::Reg(r) => Vlv::Reg(reg(r)),
            Vlv::Zero(t) => Vlv::Zero(*t),
            Vlv::Splat(t, x) => Vlv::Splat(*t, Box::new(value(x, node)?)),
            Vlv::Load(t, tn, i) => Vlv::Load(*t, node(tn), i.clone()),
            Vlv::Fma(a, b, c) => Vlv::Fma(go(a)?, go(b)?, go(c)?),
            Vlv::Binop(op, a, b) => Vlv::Binop(*op, go(a)?, go(b)?),
            Vlv::Shuffle(a, b, idx) => Vlv::Shuffle(go(a)?, go(b)?, idx.clone()),
            Vlv::Repeat(a, times) => Vlv::Repeat(go(a)?, *times),
            Vlv::Unop(op, a) => Vlv::Unop(*op, go(a)?),
            Vlv::Ternop(op, a, b, c) => Vlv::Ternop(*op, go(a)?, go(b)?, go(c)?),
            Vlv::DotPairs(a, b, c) => Vlv::DotPairs(go(a)?, go(b)?, go(c)?),
        })
    }
    Some(match c {
        Llc::Seq(v) => Llc::Seq(
            v.iter()
                .map(|c| rename(c, nodes, regs))
                .collect::<Option<_>>()?,
        ),
        Llc::For { .. } | Llc::If { .. } | Llc::Lookup { .. } => {
            // (A lookup reads its index from a tensor the copies share.)
            if let Llc::Lookup { tn, .. } = c {
                if nodes.iter().any(|(from, _)| from == tn) {
                    return None;
                }
            }
            let mut ok = true;
            let out = map_block(c, &mut |b| {
                rename(b, nodes, regs).unwrap_or_else(|| {
                    ok = false;
                    b.clone()
                })
            })?;
            ok.then_some(out)?
        }
        Llc::Parallel(_) | Llc::SetLocal(..) => return None,
        Llc::Set { tn, idcs, value: v } => Llc::Set {
            tn: node(tn),
            idcs: idcs.clone(),
            value: value(v, &node)?,
        },
        Llc::VSet(r, v) => Llc::VSet(reg(r), vector(v, &node, &reg)?),
        Llc::VStore { tn, idcs, value: v } => Llc::VStore {
            tn: node(tn),
            idcs: idcs.clone(),
            value: vector(v, &node, &reg)?,
        },
        Llc::ZeroOut(t) => Llc::ZeroOut(node(t)),
        Llc::Prefetch { tn, offset, write } => Llc::Prefetch {
            tn: node(tn),
            offset: *offset,
            write: *write,
        },
        c @ (Llc::Noop | Llc::Comment(_)) => c.clone(),
    })
}
