//! Loop-nest passes on optimized code.
//!
//! **Interchange for locality.** A perfect loop nest whose body is one `Set` of a node that is
//! read (if at all) only at the written cell may run its loops in any order that keeps the
//! relative order of the reduction loops (those not indexing the written cell): each cell
//! still sees the same sequence of updates, so results are bit-identical. The pass moves
//! innermost the loop that makes the most accesses contiguous (stride 1) or invariant, and
//! the fewest strided: a matrix product `c[i,k] += a[i,j] * b[j,k]` becomes the i-j-k order
//! whose inner loop walks rows of `c` and `b`, which the C compiler vectorizes.
//!
//! **Cache tiling of contractions.** After interchange, a contraction whose inner loop walks
//! the result row is split into panels of 512 bytes (128 floats, 64 doubles: eight 64-byte
//! vectors) with the panel loop outermost, so the panel of the right-hand matrix is reused
//! from cache for every row (see [`tile_contraction`]; bit-identical). Register blocking
//! (several rows per inner loop) was measured by hand and did not beat gcc's code for the
//! panel loop on this hardware, so it is not done.
//!
//! **Vectorizable reductions.** A reduction loop `s = s + e(j)` (also max, min, sub) carries
//! a dependency through `s`, so without `-ffast-math` a C compiler must add one element at a
//! time. When the loop walks memory contiguously and is long enough, the pass gives it `V`
//! independent accumulators (a local array: 16 lanes for single precision, 8 for double, one
//! 64-byte vector), strip-mining `j = jo * V + l`:
//!
//! ```text
//! acc[l] = neutral                        for l in 0..V
//! acc[l] = acc[l] + e(jo * V + l)         for jo in 0..n/V, l in 0..V   (vectorizes)
//! acc[0] = acc[0] + e(j)                  for the remaining j
//! s = s + ((acc[0] + acc[1]) + ...)       a balanced tree
//! ```
//!
//! This reassociates the sum (results change in the last bits, as with any parallel
//! reduction); max and min are exact. Only single and double results are rewritten: half and
//! byte results round at every step, which the rewrite would not preserve.

use crate::ir::tnode::provenance;
use crate::ir::{AxisIndex, Binop, MemoryMode, Prec, Symbol, Tnode};
use crate::loops::{Llc, Llv};
use crate::target::VectorTarget;

/// What the loop-nest passes produced.
pub struct LoopResult {
    /// The code.
    pub code: Llc,
    /// The local arrays the passes introduced.
    pub locals: Vec<Tnode>,
    /// Those of them that are entirely written before they are read in each call.
    pub written_first: Vec<Tnode>,
}

/// Runs the loop-nest passes. With a vector target, contractions become GEMM kernels
/// ([`super::gemm`]) first, and accumulations over a few taps that are pointwise along a
/// contiguous axis (depthwise convolutions, pooling) tap kernels ([`super::taps`]); a
/// reduction of at most [`super::taps::TAPS_BEFORE_GEMM`] points tries the tap kernel first.
pub fn optimize_loops(code: Llc, target: Option<&VectorTarget>) -> LoopResult {
    let mut out = LoopResult {
        code: Llc::Noop,
        locals: vec![],
        written_first: vec![],
    };
    out.code = pass(code, target, &mut out);
    out
}

fn pass(code: Llc, target: Option<&VectorTarget>, out: &mut LoopResult) -> Llc {
    match code {
        Llc::Seq(v) => {
            let mut stmts: Vec<Llc> = Vec::with_capacity(v.len());
            for c in v {
                // A fill just before a kernel's nest may be folded into the kernel.
                let c = match (target, &c) {
                    (Some(t), Llc::For { .. }) => match kernel(c, t, stmts.last(), out) {
                        Ok((k, folded)) => {
                            if folded {
                                stmts.pop();
                            }
                            stmts.push(k);
                            continue;
                        }
                        Err(c) => c,
                    },
                    _ => c,
                };
                stmts.push(pass(c, target, out));
            }
            Llc::Seq(stmts)
        }
        c @ Llc::For { .. } => {
            let c = match target {
                Some(t) => match kernel(c, t, None, out) {
                    Ok((k, _)) => return k,
                    Err(c) => c,
                },
                None => c,
            };
            let c = tile_contraction(interchange(c));
            // With vectors, reductions are vectorized explicitly after fusion
            // (`super::vectorize`), which falls back to this rewrite where it cannot.
            if target.is_some_and(|t| t.vector_bytes >= 16) {
                c
            } else {
                vectorize_reduction(c, &mut out.locals)
            }
        }
        c => c,
    }
}

/// The nest as a GEMM kernel or a tap kernel, tried in that order except for reductions of at
/// most [`super::taps::TAPS_BEFORE_GEMM`] points; with whether the kernel folded the fill
/// `before` it (the statement just before the nest).
fn kernel(
    c: Llc,
    t: &VectorTarget,
    before: Option<&Llc>,
    out: &mut LoopResult,
) -> Result<(Llc, bool), Llc> {
    let small =
        super::taps::reduction_points(&c).is_some_and(|n| n <= super::taps::TAPS_BEFORE_GEMM);
    let fill = before.and_then(super::taps::fill_of);
    let zero_filled = match before {
        Some(Llc::ZeroOut(z)) => Some(z.clone()),
        _ => None,
    };
    let gemm = |c: Llc, out: &mut LoopResult| match super::gemm::rewrite(c, t, zero_filled.as_ref())
    {
        Ok(k) => {
            out.locals.extend(k.locals);
            out.written_first.extend(k.written_first);
            if k.rest.is_empty() {
                return Ok((k.code, k.folded_zero_fill));
            }
            let mut stmts = vec![k.code];
            for r in k.rest {
                stmts.push(pass(r, Some(t), out));
            }
            Ok((Llc::Seq(stmts), k.folded_zero_fill))
        }
        Err(c) => Err(c),
    };
    if small {
        let c = match tap_kernel(c, t, fill, out) {
            Ok(k) => return Ok(k),
            Err(c) => c,
        };
        gemm(c, out)
    } else {
        let c = match gemm(c, out) {
            Ok(k) => return Ok(k),
            Err(c) => c,
        };
        tap_kernel(c, t, fill, out)
    }
}

/// A tap kernel ([`super::taps`]) for a nest, with the parts it leaves to the scalar code
/// through the scalar passes; with whether it folded `fill`.
fn tap_kernel(
    c: Llc,
    target: &VectorTarget,
    fill: Option<(Tnode, f64)>,
    out: &mut LoopResult,
) -> Result<(Llc, bool), Llc> {
    let k = super::taps::rewrite(c, target, fill)?;
    let mut stmts = vec![k.code];
    for r in k.rest {
        stmts.push(pass(r, Some(target), out));
    }
    Ok((Llc::Seq(stmts), k.folded_fill))
}

struct Loop {
    index: Symbol,
    from: i64,
    to: i64,
    trace_it: bool,
}

/// Moves the loops around `c` (outermost first) into `loops`; gives back the first statement
/// that is not a loop.
fn peel_loops(mut c: Llc, loops: &mut Vec<Loop>) -> Llc {
    while let Llc::For {
        index,
        from,
        to,
        body,
        trace_it,
    } = c
    {
        loops.push(Loop {
            index,
            from,
            to,
            trace_it,
        });
        c = *body;
    }
    c
}

/// Splits a perfect nest into its loops and innermost statement.
fn perfect_nest(c: Llc) -> (Vec<Loop>, Llc) {
    let mut loops = vec![];
    let inner = peel_loops(c, &mut loops);
    (loops, inner)
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
        Llv::LocalScope { body, .. } => crate::loops::visit_values(body, &mut |x| {
            if let Llv::Get(t, i) | Llv::GetMergeBuffer(t, i) = x {
                out.push((t.clone(), i.clone()))
            }
        }),
        Llv::Binop(_, a, b) => {
            reads(a, out);
            reads(b, out);
        }
        Llv::Unop(_, a) => reads(a, out),
        Llv::Ternop(_, a, b, c) => {
            reads(a, out);
            reads(b, out);
            reads(c, out);
        }
        _ => {}
    }
}

/// The stride, in elements, with which an access moves when `s` increases by one.
pub(super) fn stride(tn: &Tnode, idcs: &[AxisIndex], s: Symbol) -> usize {
    let dims = tn.dims();
    // Saturating: an affine index may carry a huge coefficient (its points are then skipped
    // by guards); a saturated stride just counts as strided.
    let mut total: usize = 0;
    for (k, ix) in idcs.iter().enumerate() {
        let axis = dims[k + 1..]
            .iter()
            .fold(1usize, |a, &d| a.saturating_mul(d));
        total = total.saturating_add(axis.saturating_mul(ix.coef(s)));
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

/// One guard of an affine index (see [`Llc::If`]): the index and its exclusive bound.
type Guard = (AxisIndex, usize);

/// Splits a nest of loops and guards (`Llc::If` with its body) into its loops, its guards,
/// and its innermost statement. Each guard is a pure condition on the iterators it mentions,
/// so it may sit anywhere inside the loops of those iterators: `for a { if g(a) { for b
/// { s } } }` runs the same points as `for a { for b { if g(a) { s } } }`.
fn guarded_nest(c: Llc) -> (Vec<Loop>, Vec<Guard>, Llc) {
    let mut loops = vec![];
    let mut guards = vec![];
    let mut c = c;
    loop {
        match peel_loops(c, &mut loops) {
            Llc::If { guards: g, body } => {
                guards.extend(g);
                c = *body;
            }
            other => return (loops, guards, other),
        }
    }
}

/// Rebuilds a nest from its loops (outermost first) and guards: each guard goes just inside
/// the innermost loop whose iterator it mentions (outside every loop if it mentions none),
/// the guards placed at one level joined in one `Llc::If` in their original order. So the
/// guards of the reduction letters of a convolution moved outside the contiguous result
/// loop are tested once per row, not once per element.
fn rebuild_guarded(loops: Vec<Loop>, guards: Vec<Guard>, body: Llc) -> Llc {
    // The level of each guard: how many loops enclose it.
    let level = |g: &Guard| {
        let syms = g.0.symbols();
        loops
            .iter()
            .rposition(|l| syms.contains(&l.index))
            .map_or(0, |p| p + 1)
    };
    let mut at: Vec<Vec<Guard>> = vec![vec![]; loops.len() + 1];
    for g in guards {
        let k = level(&g);
        at[k].push(g);
    }
    let wrap = |body: Llc, guards: Vec<Guard>| {
        if guards.is_empty() {
            body
        } else {
            Llc::If {
                guards,
                body: Box::new(body),
            }
        }
    };
    let mut c = wrap(body, at.pop().unwrap_or_default());
    for l in loops.into_iter().rev() {
        c = Llc::For {
            index: l.index,
            from: l.from,
            to: l.to,
            body: Box::new(c),
            trace_it: l.trace_it,
        };
        c = wrap(c, at.pop().unwrap_or_default());
    }
    c
}

/// Loop interchange for locality (see the module documentation), through the guards of
/// affine indices: a nest of loops and guards around one store is reordered like a perfect
/// nest, then each guard is placed just inside the innermost loop it depends on
/// ([`rebuild_guarded`]). The guards decide which points run, not their order, so the
/// legality argument is the perfect nest's: every cell sees the same updates in the same
/// order (a depthwise convolution `b(h+i-1)(v+j-1)c,ijc->bhvc` becomes b-h-v-i-j-c: the
/// guards test `h+i-1` and `v+j-1` outside the contiguous channel loop, which vectorizes).
fn interchange(c: Llc) -> Llc {
    let (mut loops, guards, body) = guarded_nest(c);
    let Llc::Set { tn, idcs, value } = &body else {
        // Not a nest around one store: leave it.
        return rebuild_guarded(loops, guards, body);
    };
    if loops.len() < 2 {
        return rebuild_guarded(loops, guards, body);
    }
    let mut rs = vec![];
    reads(value, &mut rs);
    // Legal only if the node is read at the written cell alone.
    if rs.iter().any(|(t, i)| t == tn && i != idcs) {
        return rebuild_guarded(loops, guards, body);
    }
    // Legal only if distinct values of the written loops write distinct cells: each index of
    // the cell depends on at most one loop, and each loop on at most one index. An affine
    // result entry such as `(a+b)` writes one cell from several points, whose order (which
    // write is last, with `set`) the interchange would change.
    let loop_syms: Vec<Symbol> = loops.iter().map(|l| l.index).collect();
    let per_index = |ix: &AxisIndex| {
        ix.symbols()
            .into_iter()
            .filter(|s| loop_syms.contains(s) && ix.coef(*s) != 0)
            .count()
    };
    let injective = idcs.iter().all(|ix| per_index(ix) <= 1)
        && loop_syms
            .iter()
            .all(|&s| idcs.iter().filter(|ix| ix.coef(s) != 0).count() <= 1);
    if !injective {
        return rebuild_guarded(loops, guards, body);
    }
    // A loop selects the written cell only if it is a plain index of it: one that appears
    // only in linear indices (an affine result entry such as `(a+b)`) may write the same cell
    // at several of its values, so it is a reduction loop whose order matters (integer
    // stores truncate at every step).
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
    rebuild_guarded(loops, guards, body)
}

/// Replaces iterator `j` by `by` in every index of a value (including inside local scopes);
/// `None` if an index would need more terms than a linear index holds.
fn subst_value(v: &Llv, j: Symbol, by: AxisIndex) -> Option<Llv> {
    crate::loops::map_value_indices(v, &mut |ix| ix.substitute(j, by))
}

/// Replaces iterator `j` by `by` in every index of the code; `None` if an index would need
/// more terms than a linear index holds.
fn subst_llc(c: &Llc, j: Symbol, by: AxisIndex) -> Option<Llc> {
    crate::loops::map_indices(c, &mut |ix| ix.substitute(j, by))
}

/// Whether a value mentions iterator `j` anywhere (including inside local scopes).
pub(super) fn mentions(v: &Llv, j: Symbol) -> bool {
    let has = |i: &[AxisIndex]| i.iter().any(|ix| ix.symbols().contains(&j));
    match v {
        Llv::Get(_, i) | Llv::GetMergeBuffer(_, i) => has(i),
        Llv::EmbedIndex(ix) => ix.symbols().contains(&j),
        Llv::Binop(_, a, b) => mentions(a, j) || mentions(b, j),
        Llv::Unop(_, a) => mentions(a, j),
        Llv::Ternop(_, a, b, c) => mentions(a, j) || mentions(b, j) || mentions(c, j),
        Llv::Random { idcs, .. } => has(idcs),
        Llv::LocalScope { body, .. } => mentions_llc(body, j),
        Llv::GetLocal(_) | Llv::GetCFunction(_) | Llv::Constant(_) => false,
    }
}

fn mentions_llc(c: &Llc, j: Symbol) -> bool {
    let mut hit = false;
    crate::loops::visit_indices(c, &mut |ix| hit |= ix.symbols().contains(&j));
    hit
}

/// Rewrites the innermost reduction loop of a nest with independent accumulators.
pub(super) fn vectorize_reduction(c: Llc, locals: &mut Vec<Tnode>) -> Llc {
    let (mut loops, body) = perfect_nest(c);
    let Some(red) = loops.last() else {
        return body;
    };
    let (j, from, to) = (red.index, red.from, red.to);
    let Llc::Set { tn, idcs, value } = &body else {
        return rebuild(loops, body);
    };
    let lanes: i64 = match tn.prec() {
        Prec::Single => 16,
        Prec::Double => 8,
        _ => return rebuild(loops, body),
    };
    let n = to - from + 1;
    let Llv::Binop(op, acc_read, e) = value else {
        return rebuild(loops, body);
    };
    let reduce_op = match op {
        Binop::Add | Binop::Sub => Binop::Add,
        Binop::Max | Binop::Min => *op,
        _ => return rebuild(loops, body),
    };
    let own = matches!(&**acc_read, Llv::Get(t, i) if t == tn && i == idcs);
    let mut rs = vec![];
    reads(e, &mut rs);
    let contiguous = rs.iter().any(|(t, i)| stride(t, i, j) == 1);
    if !own
        || from != 0
        || n < 2 * lanes
        || idcs.iter().any(|ix| ix.symbols().contains(&j))
        || rs.iter().any(|(t, _)| t == tn)
        || !contiguous
        || !mentions(e, j)
    {
        return rebuild(loops, body);
    }
    let (jo, lane2, rest) = (Symbol::fresh(), Symbol::fresh(), Symbol::fresh());
    let strided = AxisIndex::linear(&[(jo, lanes as usize), (lane2, 1)], 0);
    let substituted = strided.and_then(|strided| {
        Some((
            subst_value(e, j, strided)?,
            subst_value(e, j, AxisIndex::Iterator(rest))?,
        ))
    });
    let Some((strided_e, rest_e)) = substituted else {
        return rebuild(loops, body);
    };
    let Ok(acc) = Tnode::builder(
        &[&tn.label().join("_"), "acc"],
        &[lanes as usize],
        tn.prec(),
    )
    .memory_with_provenance(MemoryMode::Local, provenance::KERNEL)
    .build() else {
        return rebuild(loops, body);
    };
    locals.push(acc.clone());
    let lane = Symbol::fresh();
    let at = |i: AxisIndex| vec![i];
    let get = |i: AxisIndex| Llv::Get(acc.clone(), at(i));
    let update = |i: AxisIndex, e: Llv| Llc::Set {
        tn: acc.clone(),
        idcs: at(i),
        value: Llv::Binop(reduce_op, Box::new(get(i)), Box::new(e)),
    };
    let strips = n / lanes;
    let for_ = |index: Symbol, from: i64, to: i64, body: Llc| Llc::For {
        index,
        from,
        to,
        body: Box::new(body),
        trace_it: true,
    };
    let mut stmts = vec![for_(
        lane,
        0,
        lanes - 1,
        Llc::Set {
            tn: acc.clone(),
            idcs: at(AxisIndex::Iterator(lane)),
            value: Llv::Constant(reduce_op.neutral()),
        },
    )];
    stmts.push(for_(
        jo,
        0,
        strips - 1,
        for_(
            lane2,
            0,
            lanes - 1,
            update(AxisIndex::Iterator(lane2), strided_e),
        ),
    ));
    if strips * lanes < n {
        stmts.push(for_(
            rest,
            strips * lanes,
            n - 1,
            update(AxisIndex::Fixed(0), rest_e),
        ));
    }
    // A balanced tree over the lanes.
    let mut level: Vec<Llv> = (0..lanes as usize)
        .map(|l| get(AxisIndex::Fixed(l)))
        .collect();
    while level.len() > 1 {
        level = level
            .chunks(2)
            .map(|p| match p {
                [a, b] => Llv::Binop(reduce_op, Box::new(a.clone()), Box::new(b.clone())),
                [a] => a.clone(),
                _ => Llv::Constant(reduce_op.neutral()),
            })
            .collect();
    }
    let total = level.pop().unwrap_or(Llv::Constant(reduce_op.neutral()));
    stmts.push(Llc::Set {
        tn: tn.clone(),
        idcs: idcs.clone(),
        value: Llv::Binop(*op, acc_read.clone(), Box::new(total)),
    });
    loops.pop();
    rebuild(loops, Llc::Seq(stmts))
}

/// Bytes of a row panel kept hot by [`tile_contraction`]: the inner loop covers this many
/// bytes of the output row and of each argument row it streams (so that a whole panel of the
/// right-hand matrix, reduction extent × panel, stays in a 1 MiB L2 for reduction extents up
/// to ~2048).
const PANEL_BYTES: usize = 512;

/// Cache tiling of a contraction: a perfect nest around one store whose innermost loop walks
/// the result contiguously and which has a reduction loop outside it (after interchange, the
/// `k` of `c[i,k] += a[i,j] * b[j,k]`) is split into panels: `k = kk * T + k'` with the panel
/// loop `kk` outermost, so a `j × T` panel of `b` is reused for every `i` from cache instead of
/// streaming all of `b` once per row. The sequence of updates of every cell is unchanged, so
/// results are bit-identical. Applied only when the extent is a multiple of the panel width
/// and at least twice it.
fn tile_contraction(c: Llc) -> Llc {
    let (mut loops, body) = perfect_nest(c);
    let Llc::Set { tn, idcs, value } = &body else {
        return rebuild(loops, body);
    };
    if loops.len() < 3 {
        return rebuild(loops, body);
    }
    let mut rs = vec![];
    reads(value, &mut rs);
    // As in `interchange`: only plain indices of the written cell select it.
    let written = |s: Symbol| idcs.contains(&AxisIndex::Iterator(s));
    let Some(inner) = loops.last() else {
        return rebuild(loops, body);
    };
    let (k, from, to) = (inner.index, inner.from, inner.to);
    let width = (PANEL_BYTES / tn.prec().size_in_bytes()) as i64;
    let extent = to - from + 1;
    let has_reduction = loops.iter().any(|l| !written(l.index));
    if from != 0
        || !has_reduction
        || !written(k)
        || stride(tn, idcs, k) != 1
        || extent < 2 * width
        || extent % width != 0
        || rs.iter().any(|(t, i)| t == tn && i != idcs)
    {
        return rebuild(loops, body);
    }
    let (kk, k2) = (Symbol::fresh(), Symbol::fresh());
    let tiled = AxisIndex::linear(&[(kk, width as usize), (k2, 1)], 0);
    let Some(body) = tiled.and_then(|tiled| subst_llc(&body, k, tiled)) else {
        return rebuild(loops, body);
    };
    loops.pop();
    loops.insert(
        0,
        Loop {
            index: kk,
            from: 0,
            to: extent / width - 1,
            trace_it: true,
        },
    );
    loops.push(Loop {
        index: k2,
        from: 0,
        to: width - 1,
        trace_it: true,
    });
    rebuild(loops, body)
}
