//! Merging a vector reduction into the vector loop that writes what it reduces.
//!
//! After fusion and vectorization, a row of a softmax computes `e = exp(x - m)` into a row
//! local in one vector loop, then sums `e` in a second loop whose accumulators wait on each
//! other's latency (32 partial sums of single precision are two 16-lane chains of 32
//! additions on AVX-512: 4 cycles each, about 130 of a row's 1,240 cycles in llvm-mca's
//! model). The same holds for a layer norm's variance, the sum of the squares of the centred
//! row just written. This pass runs the reduction's iterations inside the producing loop:
//!
//! ```text
//! for ja in 0..na { store e[ja·W] = f(ja) }          for jb in 0..nb {
//! s = 0                                     ==>        store e[(jb·u)·W] = f(jb·u)
//! r0 = r1 = -0.0                                       ...
//! for jb in 0..nb {                                    store e[(jb·u+u-1)·W] = f(jb·u+u-1)
//!   r0 = r0 + load e[jb·P]; r1 = r1 + load e[jb·P+W]   r0 = r0 + load e[jb·P]; ...
//! }                                                  }
//! ```
//!
//! with `na = u·nb`: the producing loop is unrolled `u` times and the reduction's body follows
//! each group of `u` iterations; the statements between the loops (the reduction's initial
//! values) move before them. Every statement runs the same operations on the same values in
//! the same order relative to the statements it depends on, so results are bit-identical:
//! the merge applies only when each load of the reduction of a tensor the producing loop
//! writes reads exactly the vector one of the group's `u` iterations stores, the reduction
//! writes only its own vector registers (which the producing loop does not use), and the
//! statements moved neither read nor write what the producing loop touches.

use crate::ir::{AxisIndex, Tnode};
use crate::loops::{
    map_body, map_indices, visit_llc, visit_reads, visit_vectors, visit_vlv, Llc, VReg, Vlv,
};

/// The most iterations of the producing loop per iteration of the reduction.
const MAX_UNROLL: i64 = 4;

/// Merges reductions into the loops producing what they read, throughout `code` (see the
/// module documentation).
pub fn merge(code: Llc) -> Llc {
    match code {
        Llc::Seq(v) => Llc::Seq(merge_seq(v.into_iter().map(merge).collect())),
        c @ (Llc::For { .. } | Llc::If { .. } | Llc::Lookup { .. }) => map_body(c, merge),
        c => c,
    }
}

/// Merges within one block. A reduction's statements are a block of their own (its initial
/// values, its loop, the combination of its partial results), which is looked into; the
/// block structure is otherwise kept as it is (later passes cut routines into parts and
/// parallel regions along it).
fn merge_seq(mut stmts: Vec<Llc>) -> Vec<Llc> {
    let mut i = 0;
    while i < stmts.len() {
        if let Some((end, merged)) = merge_at(&stmts, i) {
            stmts.splice(i..end, merged);
        }
        i += 1;
    }
    stmts
}

/// If `stmts[at]` is a producing loop followed by movable statements and a reduction (its
/// block, or its loop) that can be merged into it, the index after the reduction and the
/// statements replacing `stmts[at..that]`.
fn merge_at(stmts: &[Llc], at: usize) -> Option<(usize, Vec<Llc>)> {
    // The producing loop: the statement, or the last of its block (after the broadcasts it
    // reads, say, which stay before it).
    let a = last_statement(&stmts[at]);
    if !matches!(a, Llc::For { .. }) {
        return None;
    }
    // The statements after the producing loop, up to a loop, or up to and into a block (a
    // reduction's block: its initial values, its loop, the combination).
    let mut after: Vec<&Llc> = vec![];
    let mut end = at + 1;
    while end < stmts.len() {
        let c = &stmts[end];
        end += 1;
        match c {
            Llc::Seq(inner) => {
                after.extend(inner);
                break;
            }
            Llc::For { .. } => {
                after.push(c);
                break;
            }
            c => after.push(c),
        }
    }
    let (k, merged) = merge_with(a, &after)?;
    let mut out = match &stmts[at] {
        c @ Llc::Seq(_) => {
            let mut own = c.clone().flatten();
            own.pop();
            own
        }
        _ => vec![],
    };
    out.extend(merged);
    // The statements of `after` past the reduction loop stay after it, in a block when they
    // came from one.
    let rest: Vec<Llc> = after[k + 1..].iter().map(|c| (*c).clone()).collect();
    if !rest.is_empty() {
        out.push(Llc::Seq(rest));
    }
    Some((end, out))
}

/// The last statement of `c`, inside its trailing blocks.
fn last_statement(c: &Llc) -> &Llc {
    match c {
        Llc::Seq(v) => v.last().map_or(c, last_statement),
        c => c,
    }
}

/// Merges the reduction loop `after[k]` (after movable statements `after[..k]`) into the
/// producing loop `a`: `k` and the statements replacing `a` and `after[..=k]`.
fn merge_with(a: &Llc, after: &[&Llc]) -> Option<(usize, Vec<Llc>)> {
    let Llc::For {
        index: ja,
        from: 0,
        to: a_to,
        body: a_body,
        trace_it,
    } = a
    else {
        return None;
    };
    let written = stores(a_body)?;
    let a_regs = registers(a_body);
    let a_reads = read_nodes(a_body);
    let touches = |tn: &Tnode| written.iter().any(|(w, _)| w == tn) || a_reads.contains(tn);
    // The statements that can move before the producing loop.
    let mut k = 0;
    while k < after.len() {
        let c = after[k];
        let apart = !reads_any(c, &written) && !registers(c).iter().any(|r| a_regs.contains(r));
        let movable = match c {
            Llc::Set { tn, .. } => apart && !touches(tn),
            Llc::VSet(..) => apart,
            _ => false,
        };
        if !movable {
            break;
        }
        k += 1;
    }
    let Llc::For {
        index: jb,
        from: 0,
        to: b_to,
        body: b_body,
        ..
    } = after.get(k)?
    else {
        return None;
    };
    let (na, nb) = (a_to + 1, b_to + 1);
    if nb < 1 || na % nb != 0 || na / nb > MAX_UNROLL {
        return None;
    }
    let u = na / nb;
    // The reduction: vector registers only, none of them the producing loop's.
    let b_stmts = b_body.as_ref().clone().flatten();
    let only_vsets = !b_stmts.is_empty() && b_stmts.iter().all(accumulates);
    let apart = !registers(b_body).iter().any(|r| a_regs.contains(r));
    if !only_vsets || !apart || !reads_any(b_body, &written) {
        return None;
    }
    // Iteration `jb·u + g` of the producing loop, for each `g`.
    let group: Vec<Llc> = (0..u)
        .map(|g| {
            let by = AxisIndex::linear(&[(*jb, u as usize)], g as usize)?;
            map_indices(a_body, &mut |ix| ix.substitute(*ja, by))
        })
        .collect::<Option<_>>()?;
    // Every load of a tensor the producing loop writes reads exactly a vector the group
    // stores.
    let mut stored = vec![];
    for c in &group {
        stored.extend(stores(c)?);
    }
    let mut exact = true;
    visit_reads(b_body, &mut |tn, idcs, lanes, _| {
        if written.iter().any(|(w, _)| w == tn) {
            exact &= stored
                .iter()
                .any(|(w, (i, l))| w == tn && i.as_slice() == idcs && *l == lanes);
        }
    });
    if !exact {
        return None;
    }
    let mut body = group;
    body.extend(b_stmts);
    let mut out: Vec<Llc> = after[..k].iter().map(|c| (*c).clone()).collect();
    out.push(Llc::For {
        index: *jb,
        from: 0,
        to: *b_to,
        body: Box::new(Llc::Seq(body)),
        trace_it: *trace_it,
    });
    Some((k, out))
}

/// The vector stores of a loop body that has only vector stores of computed values, as the
/// vectorizer's elementwise loops have (node, (indices, lanes)); `None` for any other
/// statement (a kernel's stores of its registers, say).
#[allow(clippy::type_complexity)]
fn stores(body: &Llc) -> Option<Vec<(Tnode, (Vec<AxisIndex>, usize))>> {
    match body {
        Llc::Seq(v) => {
            let mut out = vec![];
            for c in v {
                out.extend(stores(c)?);
            }
            Some(out)
        }
        Llc::Noop => Some(vec![]),
        Llc::VStore { tn, idcs, value } if !matches!(value, Vlv::Reg(_)) => {
            Some(vec![(tn.clone(), (idcs.clone(), vector_lanes(value)?))])
        }
        _ => None,
    }
}

/// Whether `c` is an accumulation `r = r ⊕ e` into a vector register that `e` does not read,
/// as the vectorizer's reductions are.
fn accumulates(c: &Llc) -> bool {
    let Llc::VSet(r, Vlv::Binop(_, acc, e)) = c else {
        return false;
    };
    let mut reads_r = false;
    visit_vlv(e, &mut |v| reads_r |= matches!(v, Vlv::Reg(x) if x == r));
    matches!(**acc, Vlv::Reg(x) if x == *r) && !reads_r
}

/// The lanes of a vector value whose type is known from its tree.
fn vector_lanes(v: &Vlv) -> Option<usize> {
    match v {
        Vlv::Reg(r) => Some(r.ty.lanes),
        Vlv::Zero(t) | Vlv::Splat(t, _) | Vlv::Load(t, _, _) => Some(t.lanes),
        Vlv::Fma(a, _, _)
        | Vlv::Binop(_, a, _)
        | Vlv::Unop(_, a)
        | Vlv::Ternop(_, a, _, _)
        | Vlv::Shuffle(a, _, _) => vector_lanes(a),
        Vlv::Repeat(..) | Vlv::DotPairs(..) => None,
    }
}

/// The vector registers a statement assigns or reads.
fn registers(c: &Llc) -> Vec<VReg> {
    let mut out = vec![];
    visit_llc(c, &mut |c| {
        if let Llc::VSet(r, _) = c {
            out.push(*r);
        }
    });
    visit_vectors(c, &mut |v| {
        if let Vlv::Reg(r) = v {
            out.push(*r);
        }
    });
    out
}

/// The nodes a statement reads.
fn read_nodes(c: &Llc) -> Vec<Tnode> {
    let mut out = vec![];
    visit_reads(c, &mut |tn, _, _, _| out.push(tn.clone()));
    out
}

/// Whether `c` reads any node of `written`.
fn reads_any<T>(c: &Llc, written: &[(Tnode, T)]) -> bool {
    let mut hit = false;
    visit_reads(c, &mut |tn, _, _, _| {
        hit |= written.iter().any(|(w, _)| w == tn)
    });
    hit
}
