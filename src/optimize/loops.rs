//! Loop-nest passes on optimized code.
//!
//! **Interchange for locality.** A perfect loop nest whose body is one `Set` of a node that is
//! read (if at all) only at the written cell may run its loops in any order that keeps the
//! relative order of the reduction loops (those not indexing the written cell): each cell
//! still sees the same sequence of updates, so results are bit-identical. The pass moves
//! innermost the loop that makes the most accesses contiguous (stride 1) or invariant, and
//! the fewest strided: a matrix product `c[i,k] += a[i,j] * b[j,k]` becomes the i-j-k order
//! whose inner loop walks rows of `c` and `b`, which the C compiler vectorizes.

use crate::ir::{AxisIndex, Symbol, Tnode};
use crate::lower::{Llc, Llv};

/// Runs the loop-nest passes.
pub fn optimize_loops(code: Llc) -> Llc {
    match code {
        Llc::Seq(v) => Llc::Seq(v.into_iter().map(optimize_loops).collect()),
        c @ Llc::For { .. } => interchange(c),
        c => c,
    }
}

struct Loop {
    index: Symbol,
    from: i64,
    to: i64,
    trace_it: bool,
}

/// Splits a perfect nest into its loops and innermost statement.
fn perfect_nest(c: Llc) -> (Vec<Loop>, Llc) {
    let mut loops = vec![];
    let mut c = c;
    loop {
        match c {
            Llc::For {
                index,
                from,
                to,
                body,
                trace_it,
            } => {
                loops.push(Loop {
                    index,
                    from,
                    to,
                    trace_it,
                });
                c = *body;
            }
            other => return (loops, other),
        }
    }
}

fn rebuild(loops: Vec<Loop>, body: Llc) -> Llc {
    loops.into_iter().rev().fold(body, |body, l| Llc::For {
        index: l.index,
        from: l.from,
        to: l.to,
        body: Box::new(body),
        trace_it: l.trace_it,
    })
}

/// Every read of the value (including inside local scopes).
fn reads(v: &Llv, out: &mut Vec<(Tnode, Vec<AxisIndex>)>) {
    match v {
        Llv::Get(t, i) | Llv::GetMergeBuffer(t, i) => out.push((t.clone(), i.clone())),
        Llv::LocalScope { body, .. } => super::visit_values(body, &mut |x| {
            if let Llv::Get(t, i) | Llv::GetMergeBuffer(t, i) = x {
                out.push((t.clone(), i.clone()))
            }
        }),
        Llv::Binop(_, a, b) => {
            reads(a, out);
            reads(b, out);
        }
        Llv::Unop(_, a) => reads(a, out),
        _ => {}
    }
}

/// The stride, in elements, with which an access moves when `s` increases by one.
fn stride(tn: &Tnode, idcs: &[AxisIndex], s: Symbol) -> usize {
    let dims = tn.dims();
    let mut total = 0;
    for (k, ix) in idcs.iter().enumerate() {
        if *ix == AxisIndex::Iterator(s) {
            total += dims[k + 1..].iter().product::<usize>();
        }
    }
    total
}

fn score(s: Symbol, lhs: (&Tnode, &[AxisIndex]), reads: &[(Tnode, Vec<AxisIndex>)]) -> i64 {
    let one = |tn: &Tnode, idcs: &[AxisIndex]| match stride(tn, idcs, s) {
        0 => 1,
        1 => 2,
        _ => -2,
    };
    2 * one(lhs.0, lhs.1) + reads.iter().map(|(t, i)| one(t, i)).sum::<i64>()
}

fn interchange(c: Llc) -> Llc {
    let (mut loops, body) = perfect_nest(c);
    let Llc::Set { tn, idcs, value } = &body else {
        // Not a perfect nest around one store: optimize what is inside.
        let body = optimize_loops(body);
        return rebuild(loops, body);
    };
    if loops.len() < 2 {
        return rebuild(loops, body);
    }
    let mut rs = vec![];
    reads(value, &mut rs);
    // Legal only if the node is read at the written cell alone.
    if rs.iter().any(|(t, i)| t == tn && i != idcs) {
        return rebuild(loops, body);
    }
    let written = |s: Symbol| idcs.contains(&AxisIndex::Iterator(s));
    let innermost = loops.len() - 1;
    let mut best = innermost;
    let mut best_score = score(loops[innermost].index, (tn, idcs), &rs);
    for (pos, l) in loops.iter().enumerate() {
        // A reduction loop may move inward only past written-index loops.
        let movable = written(l.index) || loops[pos + 1..].iter().all(|m| written(m.index));
        if !movable {
            continue;
        }
        let sc = score(l.index, (tn, idcs), &rs);
        if sc > best_score {
            best = pos;
            best_score = sc;
        }
    }
    if best != innermost {
        let l = loops.remove(best);
        loops.push(l);
    }
    rebuild(loops, body)
}
