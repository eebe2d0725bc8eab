//! Loop collapsing, just before printing: a perfect nest `for i in 0..A { for j in 0..B {
//! body } }` whose every access reaches memory at `i * B + j` (in units of `j`'s stride) is
//! printed as one loop over that flat position.
//!
//! Every index of the body that mentions `i` or `j` must be the pair `.., i, j, ..` on
//! consecutive axes of a tensor whose inner axis has extent `B`: then `i`'s stride is `B`
//! times `j`'s, and `i * stride_i + j * stride_j = (i * B + j) * stride_j`. The rewrite fixes
//! `i` to 0 and lets `j` run over `0..A*B`, which leaves every offset unchanged. The result
//! breaks the loop IR's rule that an index stays within its axis (the verifier and the
//! interpreter never see it); it exists only to give the C compiler one simple loop instead
//! of a nest, which GCC compiles about three times faster, to the same vector code.

use crate::ir::{AxisIndex, Symbol, Tnode};
use crate::loops::{map_body, map_indices, visit_llc, visit_values, visit_vectors, Llc, Llv, Vlv};

/// Collapses every collapsible nest in `c`, outermost pairs first and repeatedly, so that a
/// nest of three loops over contiguous axes becomes one loop.
pub fn nests(c: Llc) -> Llc {
    match c {
        Llc::Seq(v) => Llc::Seq(v.into_iter().map(nests).collect()),
        mut c @ Llc::For { .. } => {
            while let Some(merged) = collapse_pair(&c) {
                c = merged;
            }
            map_body(c, nests)
        }
        c => map_body(c, nests),
    }
}

/// The single loop of a body (looking through one-statement sequences).
fn only_loop(c: &Llc) -> Option<&Llc> {
    match c {
        Llc::For { .. } => Some(c),
        Llc::Seq(v) if v.len() == 1 => only_loop(&v[0]),
        _ => None,
    }
}

/// `for i in 0..=A-1 { for j in 0..=B-1 { body } }` as one loop over `j` in `0..=A*B-1`, or
/// `None` when the accesses do not allow it.
fn collapse_pair(outer: &Llc) -> Option<Llc> {
    let Llc::For {
        index: i,
        from: 0,
        to: ti,
        body,
        trace_it,
    } = outer
    else {
        return None;
    };
    let Some(Llc::For {
        index: j,
        from: 0,
        to: tj,
        body: inner,
        ..
    }) = only_loop(body)
    else {
        return None;
    };
    let (a, b) = (
        usize::try_from(*ti).ok()? + 1,
        usize::try_from(*tj).ok()? + 1,
    );
    let total = a.checked_mul(b)?;
    if !accesses_are_flat(inner, *i, *j, b) {
        return None;
    }
    let body = map_indices(inner, &mut |ix| match ix {
        AxisIndex::Iterator(s) if s == *i => Some(AxisIndex::Fixed(0)),
        ix => Some(ix),
    })?;
    Some(Llc::For {
        index: *j,
        from: 0,
        to: i64::try_from(total - 1).ok()?,
        body: Box::new(body),
        trace_it: *trace_it,
    })
}

/// How often `s` occurs in an index.
fn occurrences(ix: &AxisIndex, s: Symbol) -> usize {
    match ix {
        AxisIndex::Fixed(_) => 0,
        AxisIndex::Iterator(t) => usize::from(*t == s),
        AxisIndex::Linear(l) => l.terms().iter().filter(|(t, _)| *t == s).count(),
    }
}

/// Whether every index mentioning `i` or `j` in `body` is an `i, j` pair on consecutive axes
/// whose inner extent is `b` (and there is at least one).
fn accesses_are_flat(body: &Llc, i: Symbol, j: Symbol, b: usize) -> bool {
    let (mut seen_i, mut seen_j, mut pairs) = (0usize, 0usize, 0usize);
    let mut access = |tn: Option<&Tnode>, idcs: &[AxisIndex]| {
        for ix in idcs {
            seen_i += occurrences(ix, i);
            seen_j += occurrences(ix, j);
        }
        if let Some(tn) = tn {
            let dims = tn.dims();
            pairs += idcs
                .windows(2)
                .enumerate()
                .filter(|(k, w)| {
                    w[0] == AxisIndex::Iterator(i)
                        && w[1] == AxisIndex::Iterator(j)
                        && dims.get(k + 1) == Some(&b)
                })
                .count();
        }
    };
    visit_llc(body, &mut |c| match c {
        Llc::Set { tn, idcs, .. } | Llc::VStore { tn, idcs, .. } | Llc::Lookup { tn, idcs, .. } => {
            access(Some(tn), idcs)
        }
        // A guard mentioning `i` or `j` is not a flat access: the nest stays.
        Llc::If { guards, .. } => {
            let g: Vec<AxisIndex> = guards.iter().map(|(ix, _)| *ix).collect();
            access(None, &g)
        }
        // A flat offset is not an `i, j` pair either.
        Llc::Prefetch { offset, .. } => access(None, std::slice::from_ref(offset)),
        _ => {}
    });
    visit_values(body, &mut |v| match v {
        Llv::Get(tn, idcs) | Llv::GetMergeBuffer(tn, idcs) => access(Some(tn), idcs),
        Llv::EmbedIndex(ix) => access(None, std::slice::from_ref(ix)),
        // Counted but never paired: a random value's loops are not collapsed.
        Llv::Random { idcs, .. } => access(None, idcs),
        _ => {}
    });
    visit_vectors(body, &mut |v| {
        if let Vlv::Load(_, tn, idcs) = v {
            access(Some(tn), idcs)
        }
    });
    pairs > 0 && seen_i == pairs && seen_j == pairs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Binop, Prec};

    fn for_(index: Symbol, to: i64, body: Llc) -> Llc {
        Llc::for_loop(index, 0, to, body)
    }

    #[test]
    fn contiguous_nests_collapse_and_others_do_not() {
        let t = Tnode::new(&["t"], &[4, 8, 16], Prec::Single).unwrap();
        let u = Tnode::new(&["u"], &[16], Prec::Single).unwrap();
        let (h, i, j) = (Symbol::fresh(), Symbol::fresh(), Symbol::fresh());
        let it = AxisIndex::Iterator;
        let get = |tn: &Tnode, idcs: Vec<AxisIndex>| Llv::Get(tn.clone(), idcs);
        // t[h, i, j] = t[h, i, j] + 1: all three loops become one over 4 * 8 * 16 cells.
        let set = Llc::Set {
            tn: t.clone(),
            idcs: vec![it(h), it(i), it(j)],
            value: Llv::Binop(
                Binop::Add,
                Box::new(get(&t, vec![it(h), it(i), it(j)])),
                Box::new(Llv::Constant(1.)),
            ),
        };
        let nest = for_(h, 3, for_(i, 7, for_(j, 15, set.clone())));
        match nests(nest) {
            Llc::For {
                index, from, to, ..
            } => assert_eq!((index, from, to), (j, 0, 511)),
            other => panic!("{other:?}"),
        }
        // A broadcast read u[j] needs j modulo 16: only the outer pair (h, i) collapses.
        let bcast = Llc::Set {
            tn: t.clone(),
            idcs: vec![it(h), it(i), it(j)],
            value: get(&u, vec![it(j)]),
        };
        let c = nests(for_(h, 3, for_(i, 7, for_(j, 15, bcast))));
        let Llc::For {
            index, to, body, ..
        } = c
        else {
            panic!()
        };
        assert_eq!((index, to), (i, 31));
        assert!(matches!(*body, Llc::For { index, to: 15, .. } if index == j));
        // An embedded iterator value keeps its loop.
        let embed = Llc::Set {
            tn: t.clone(),
            idcs: vec![it(h), it(i), it(j)],
            value: Llv::EmbedIndex(it(j)),
        };
        let c = nests(for_(i, 7, for_(j, 15, embed)));
        assert!(matches!(c, Llc::For { index, to: 7, .. } if index == i));
    }
}
