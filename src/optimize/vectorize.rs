//! Explicit vectorization of innermost loops, after fusion.
//!
//! C compilers vectorize neither calls of `expf` (and the other libm functions) nor float
//! reductions without `-ffast-math` (they may not reassociate), so the memory-bound chains of
//! a softmax or a layer norm would run one lane at a time. This pass writes their vector code
//! itself, with the vector statements of the loop IR ([`Llc::VSet`], [`Llc::VStore`],
//! [`Vlv`]) and the runtime header's vector functions ([`Vlv::Unop`]):
//!
//! - **Elementwise loops.** An innermost loop `for j { t[.., j] = e(j); ... }` (one store or
//!   several, as fusion leaves them) whose stores and reads are contiguous in `j` (stride 1)
//!   or do not depend on `j`, of single (or double) results computed from tensors of that
//!   precision only, with operations that have vector spellings, becomes a loop over whole
//!   vectors (`VStore t[.., from + W·jo] = e`, reads as vector loads, loop-invariant
//!   subexpressions computed once as a broadcast). When `W` does not divide `n`, one more
//!   vector covers the last `W` elements, overlapping the loop's last vector: its lanes are
//!   computed again from the same inputs into the same cells. That needs every statement to
//!   read no tensor that it or a later statement writes (see [`recomputable`]); otherwise
//!   (`t = t + x`) the scalar loop covers the `n mod W` last elements. A tensor the loop
//!   writes may be read in it only at the cell it is written at (`t = t + x`, or a later
//!   statement reading an earlier one's cell), so the iterations are independent. Every
//!   element is computed by the same operations as before, so results are bit-identical,
//!   except for the functions of the vector math family (`exp`, `log`, `tanh`, ... within
//!   their documented error bounds; a scalar remainder keeps libm).
//! - **Reductions.** An innermost loop `for j { s = s ⊕ e(j) }` into a cell `s` that does not
//!   depend on `j` (`⊕` one of add, sub, max, min; `e` vectorizable as above and not reading
//!   `s`'s tensor) keeps `P` partial results in vector accumulators, `P` = 32 for single and
//!   16 for double whatever the target (so results do not depend on the vector width): partial
//!   `k` accumulates the elements `j ≡ k (mod P)` in order of `j`. After the loop the partial
//!   results are combined in a fixed balanced tree (`((p0 ⊕ p1) ⊕ (p2 ⊕ p3)) ⊕ ...`) by
//!   vector operations (within each vector lane `i` with lane `i ^ h` for `h = 1, 2, ...,
//!   W/2`, shuffles, then the vectors pairwise: lane 0 gets the bits of the scalar tree), added
//!   to `s`, and the `n mod P` last elements follow one by one. Sums are reassociated (results
//!   change in the last bits, as in any parallel reduction; the partial sums start at -0.0,
//!   the exact identity of addition). Max and min are exact (the NaN rule of `aj_max_f` holds
//!   lane by lane; max and min are associative, commutative and idempotent up to the payload
//!   of a NaN, which an accumulator never holds), so their number of accumulators changes no
//!   bit (at least 4 vectors, at most the row's whole vectors, `P` when that is more) and they
//!   take no scalar steps but one: the last elements are whole vectors too, the last one
//!   overlapping the vector before it, the accumulators are combined lane-wise, then one
//!   vector's lanes by halves (shuffles), and its lane 0 joins the cell. On rows of 77 floats
//!   this halved a softmax.
//!
//! Everything else stays scalar code, which is always correct: loops with guards, lookups,
//! reductions fused with other statements, inlined local scopes, index values, random values, imported functions,
//! merge-buffer reads, mixed precisions (a conversion per element), strided reads, or an
//! operation without a vector spelling (`sqrt`, rounding, comparisons, `where`, and the
//! double-precision transcendental functions).

use super::loops::{mentions, stride};
use crate::ir::tnode::provenance;
use crate::ir::{AxisIndex, Binop, MemoryMode, Prec, Symbol, Ternop, Tnode, Unop};
use crate::loops::{map_body, vector_unop, Llc, Llv, VType, Vlv};
use crate::target::VectorTarget;

/// What the pass produced.
pub struct Vectorized {
    /// The code.
    pub code: Llc,
    /// The local arrays it introduced.
    pub locals: Vec<Tnode>,
    /// Those of them written whole before they are read (the vector partial results).
    pub written_first: Vec<Tnode>,
}

/// Partial results of a vectorized single-precision reduction.
pub const SINGLE_PARTIALS: usize = 32;
/// Partial results of a vectorized double-precision reduction.
pub const DOUBLE_PARTIALS: usize = 16;

/// Vectorizes the innermost loops of `code` for `target` (see the module documentation).
pub fn vectorize(code: Llc, target: &VectorTarget) -> Vectorized {
    let mut out = Vectorized {
        code: Llc::Noop,
        locals: vec![],
        written_first: vec![],
    };
    out.code = walk(code, target, &mut out);
    out
}

/// Whether the code holds vector statements already (a GEMM kernel): left alone.
fn has_vectors(c: &Llc) -> bool {
    let mut hit = false;
    crate::loops::visit_llc(c, &mut |c| {
        hit |= matches!(c, Llc::VSet(..) | Llc::VStore { .. });
    });
    hit
}

fn walk(c: Llc, target: &VectorTarget, out: &mut Vectorized) -> Llc {
    match c {
        Llc::Seq(v) => Llc::Seq(v.into_iter().map(|c| walk(c, target, out)).collect()),
        c @ Llc::For { .. } if has_vectors(&c) => c,
        Llc::For {
            index,
            from,
            to,
            body,
            trace_it,
        } => {
            let inner: Vec<Llc> = body.clone().flatten();
            let l = Loop { j: index, from, to };
            let sets: Option<Vec<(Tnode, Vec<AxisIndex>, Llv)>> = inner
                .iter()
                .map(|c| match c {
                    Llc::Set { tn, idcs, value } => Some((tn.clone(), idcs.clone(), value.clone())),
                    _ => None,
                })
                .collect();
            if let Some(code) = sets.and_then(|sets| elementwise(&l, &sets, target)) {
                return code;
            }
            if let [Llc::Set { tn, idcs, value }] = inner.as_slice() {
                if let Some((code, part)) = reduction(&l, tn, idcs, value, target) {
                    out.locals.push(part.clone());
                    out.written_first.push(part);
                    return code;
                }
                // A reduction this pass cannot vectorize (a conversion, `sqrt`, ...) still
                // gets scalar independent accumulators, which C compilers vectorize.
                let c = Llc::For {
                    index,
                    from,
                    to,
                    body,
                    trace_it,
                };
                return super::loops::vectorize_reduction(c, &mut out.locals);
            }
            Llc::For {
                index,
                from,
                to,
                body: Box::new(walk(*body, target, out)),
                trace_it,
            }
        }
        c @ (Llc::If { .. } | Llc::Lookup { .. }) => map_body(c, |b| walk(b, target, out)),
        c => c,
    }
}

/// The loop being rewritten.
struct Loop {
    j: Symbol,
    from: i64,
    to: i64,
}

impl Loop {
    fn len(&self) -> i64 {
        self.to - self.from + 1
    }
}

/// The vector type of a result of precision `prec`, if the target and the runtime have one.
fn vtype(prec: Prec, target: &VectorTarget) -> Option<VType> {
    let lanes = target.lanes(prec);
    let ok = match prec {
        Prec::Single => matches!(lanes, 4 | 8 | 16),
        Prec::Double => matches!(lanes, 2 | 4 | 8),
        _ => false,
    };
    ok.then_some(VType { prec, lanes })
}

/// Whether a value may be computed once for the whole loop: it does not mention `j`, reads
/// nothing of the tensors the loop writes (whose cells change during the loop), and has no
/// effect or hidden input (local scopes, imported functions, merge buffers, random values).
fn invariant(v: &Llv, j: Symbol, written: &[(Tnode, Vec<AxisIndex>)]) -> bool {
    let mut ok = !mentions(v, j);
    crate::loops::visit_value(v, &mut |x| match x {
        Llv::Get(t, _) => ok &= written.iter().all(|(w, _)| w != t),
        Llv::LocalScope { .. }
        | Llv::GetLocal(_)
        | Llv::GetCFunction(_)
        | Llv::GetMergeBuffer(..)
        | Llv::Random { .. } => ok = false,
        _ => {}
    });
    ok
}

/// The vector form of `v` for lanes `j = at + lane`, where `at` is the index the pass
/// substitutes for `j` (a multiple of the vector width past the loop's start): `None` if some
/// part cannot be vectorized. `written` holds the tensors the loop writes with the cells they
/// are written at: such a tensor may be read only at that cell (the lane's own), and with
/// `cell_reads` false (a reduction) not at all.
struct Ctx<'a> {
    t: VType,
    j: Symbol,
    at: AxisIndex,
    written: &'a [(Tnode, Vec<AxisIndex>)],
    cell_reads: bool,
}

impl Ctx<'_> {
    fn vec(&self, v: &Llv) -> Option<Vlv> {
        if invariant(v, self.j, self.written) {
            return Some(Vlv::Splat(self.t, Box::new(v.clone())));
        }
        let b = |x: Vlv| Box::new(x);
        Some(match v {
            Llv::Get(tn, idcs) => {
                let own_cell = |(w, cell): &(Tnode, Vec<AxisIndex>)| {
                    w != tn || (self.cell_reads && cell == idcs)
                };
                if tn.prec() != self.t.prec
                    || stride(tn, idcs, self.j) != 1
                    || !self.written.iter().all(own_cell)
                {
                    return None;
                }
                let idcs = idcs
                    .iter()
                    .map(|ix| ix.substitute(self.j, self.at))
                    .collect::<Option<Vec<_>>>()?;
                Vlv::Load(self.t, tn.clone(), idcs)
            }
            Llv::Binop(op, x, y) => match op {
                Binop::Add | Binop::Sub | Binop::Mul | Binop::Div | Binop::Max | Binop::Min => {
                    Vlv::Binop(*op, b(self.vec(x)?), b(self.vec(y)?))
                }
                _ => return None,
            },
            Llv::Unop(Unop::Identity, x) => self.vec(x)?,
            Llv::Unop(op, x) if vector_unop(*op, self.t.prec) => Vlv::Unop(*op, b(self.vec(x)?)),
            Llv::Ternop(op @ (Ternop::Fma | Ternop::Mul3), x, y, z) => {
                Vlv::Ternop(*op, b(self.vec(x)?), b(self.vec(y)?), b(self.vec(z)?))
            }
            _ => return None,
        })
    }
}

/// Whether a statement of result precision `prec` computing `value` computes in that
/// precision's own type (`float` for single, `double` for double).
fn computes_in_own_type(prec: Prec, value: &Llv) -> bool {
    let c = crate::loops::statement_compute(prec, value);
    match prec {
        Prec::Single => c == crate::ir::Compute::F32,
        Prec::Double => c == crate::ir::Compute::F64,
        _ => false,
    }
}

/// `from + lanes · jo`, the index of the first lane of vector `jo`.
fn strip(jo: Symbol, lanes: usize, from: i64) -> Option<AxisIndex> {
    AxisIndex::linear(&[(jo, lanes)], usize::try_from(from).ok()?)
}

fn for_(index: Symbol, from: i64, to: i64, body: Llc) -> Llc {
    Llc::for_loop(index, from, to, body)
}

/// The elementwise rewrite (see the module documentation), of a loop body of one or more
/// stores: each tensor written is written and read at one cell only, contiguous in `j`, so
/// that iterations are independent and statement `k` of lane `j` sees exactly what it sees in
/// the scalar loop.
fn elementwise(
    l: &Loop,
    sets: &[(Tnode, Vec<AxisIndex>, Llv)],
    target: &VectorTarget,
) -> Option<Llc> {
    let prec = sets.first()?.0.prec();
    let t = vtype(prec, target)?;
    let w = t.lanes as i64;
    if l.len() < w {
        return None;
    }
    let written: Vec<(Tnode, Vec<AxisIndex>)> = sets
        .iter()
        .map(|(tn, idcs, _)| (tn.clone(), idcs.clone()))
        .collect();
    for (tn, idcs, value) in sets {
        let one_cell = written.iter().all(|(w, c)| w != tn || c == idcs);
        // A result entry of several letters (`(a+b)`) writes one cell from several points:
        // the C writer keeps such stores in order with a compiler barrier (see
        // `overwrites_shared_cells` in the C writer); they stay scalar.
        let mut accumulates = false;
        crate::loops::visit_value(value, &mut |v| {
            accumulates |= matches!(v, Llv::Get(t, i) if t == tn && i == idcs);
        });
        let shared_cells = !accumulates && idcs.iter().any(|ix| ix.symbols().len() > 1);
        if tn.prec() != prec
            || shared_cells
            || !one_cell
            || stride(tn, idcs, l.j) != 1
            || !computes_in_own_type(prec, value)
        {
            return None;
        }
    }
    let jo = Symbol::fresh();
    let at = strip(jo, t.lanes, l.from)?;
    let cx = Ctx {
        t,
        j: l.j,
        at,
        written: &written,
        cell_reads: true,
    };
    // The stores of lanes `at + lane`.
    let stores = |cx: &Ctx| -> Option<Vec<Llc>> {
        sets.iter()
            .map(|(tn, idcs, value)| {
                let idcs = idcs
                    .iter()
                    .map(|ix| ix.substitute(l.j, cx.at))
                    .collect::<Option<Vec<_>>>()?;
                let value = cx.vec(value)?;
                Some(Llc::VStore {
                    tn: tn.clone(),
                    idcs,
                    value,
                })
            })
            .collect()
    };
    let vector_body = stores(&cx)?;
    let depends = vector_body
        .iter()
        .any(|c| matches!(c, Llc::VStore { value, .. } if !matches!(value, Vlv::Splat(..))));
    if !depends {
        // Nothing reads along j: not worth a vector loop.
        return None;
    }
    let vectors = l.len() / w;
    let mut stmts = vec![for_(jo, 0, vectors - 1, Llc::Seq(vector_body))];
    let rest = l.from + vectors * w;
    if rest <= l.to && recomputable(sets) {
        // The last `w` lanes, overlapping the vector loop's last lanes, which are computed
        // again from the same inputs into the same cells.
        let last = AxisIndex::Fixed(usize::try_from(l.to - w + 1).ok()?);
        stmts.extend(stores(&Ctx { at: last, ..cx })?);
    } else if rest <= l.to {
        let scalar: Vec<Llc> = sets
            .iter()
            .map(|(tn, idcs, value)| Llc::Set {
                tn: tn.clone(),
                idcs: idcs.clone(),
                value: value.clone(),
            })
            .collect();
        stmts.push(for_(l.j, rest, l.to, Llc::Seq(scalar)));
    }
    Some(Llc::Seq(stmts))
}

/// Whether running an iteration of the loop body again for a lane leaves every cell as it
/// was: no statement reads a tensor that it or a later statement writes, so each statement
/// reads only the loop's inputs and the cells that earlier statements have just written again
/// with the same values.
fn recomputable(sets: &[(Tnode, Vec<AxisIndex>, Llv)]) -> bool {
    sets.iter().enumerate().all(|(k, (_, _, value))| {
        let mut ok = true;
        crate::loops::visit_value(value, &mut |v| {
            if let Llv::Get(t, _) = v {
                ok &= sets[k..].iter().all(|(w, _, _)| w != t);
            }
        });
        ok
    })
}

/// The reduction rewrite (see the module documentation).
fn reduction(
    l: &Loop,
    tn: &Tnode,
    idcs: &[AxisIndex],
    value: &Llv,
    target: &VectorTarget,
) -> Option<(Llc, Tnode)> {
    let t = vtype(tn.prec(), target)?;
    let partials = if tn.prec() == Prec::Single {
        SINGLE_PARTIALS
    } else {
        DOUBLE_PARTIALS
    };
    let Llv::Binop(op, acc_read, e) = value else {
        return None;
    };
    let combine = match op {
        Binop::Add | Binop::Sub => Binop::Add,
        Binop::Max | Binop::Min => *op,
        _ => return None,
    };
    // Max and min are exact (see below): their number of accumulators changes no bit, so it
    // is chosen for speed, at least 4 vectors (AVX-512's 2 vectors of 16 lanes waited on
    // the latency of their 5-instruction chains: 8.1 cycles per 32 floats in llvm-mca's
    // Ice Lake server model, 4.0 with 4) and at most the row's whole vectors. Sums keep
    // `partials` whatever the width.
    let exact = combine != Binop::Add;
    let partials = if exact {
        let whole = usize::try_from(l.len()).ok()? / t.lanes;
        (partials.max(4 * t.lanes) / t.lanes).min(whole) * t.lanes
    } else {
        partials
    };
    let own = matches!(&**acc_read, Llv::Get(r, i) if r == tn && i.as_slice() == idcs);
    if !own
        || partials == 0
        || l.len() < partials as i64
        || idcs.iter().any(|ix| ix.coef(l.j) != 0)
        || !computes_in_own_type(tn.prec(), value)
        || !mentions(e, l.j)
    {
        return None;
    }
    let accs = partials / t.lanes;
    let jo = Symbol::fresh();
    let regs: Vec<crate::loops::VReg> = (0..accs).map(|_| super::gemm::vreg(t)).collect();
    let written = [(tn.clone(), idcs.to_vec())];
    // `r = r ⊕ e` for the lanes of `e` starting at `at`.
    let accumulate = |r: crate::loops::VReg, at: AxisIndex| -> Option<Llc> {
        let cx = Ctx {
            t,
            j: l.j,
            at,
            written: &written,
            cell_reads: false,
        };
        let v = cx.vec(e)?;
        if matches!(v, Vlv::Splat(..)) {
            return None;
        }
        Some(Llc::VSet(
            r,
            Vlv::Binop(combine, Box::new(Vlv::Reg(r)), Box::new(v)),
        ))
    };
    let mut body = vec![];
    for (a, r) in regs.iter().enumerate() {
        let at = AxisIndex::linear(
            &[(jo, partials)],
            usize::try_from(l.from).ok()? + a * t.lanes,
        )?;
        body.push(accumulate(*r, at)?);
    }
    // The exact identity of each operation: -0.0 for sums (x + -0.0 = x for every x).
    let neutral = match combine {
        Binop::Add => -0.0,
        op => op.neutral(),
    };
    let part_len = t.lanes;
    let part = Tnode::builder(&[&tn.label().join("_"), "part"], &[part_len], tn.prec())
        .memory_with_provenance(MemoryMode::Local, provenance::KERNEL)
        .build()
        .ok()?;
    let mut stmts: Vec<Llc> = regs
        .iter()
        .map(|r| Llc::VSet(*r, Vlv::Splat(t, Box::new(Llv::Constant(neutral)))))
        .collect();
    let blocks = l.len() / partials as i64;
    stmts.push(for_(jo, 0, blocks - 1, Llc::Seq(body)));
    let rest = l.from + blocks * partials as i64;
    let total = if exact {
        // Max and min are exact, associative, commutative and idempotent on the partial
        // results (which are never NaN: they start at -inf or +inf and maximumNumber ignores
        // NaN). So the last `n mod P` elements are taken as whole vectors too, the last one
        // overlapping the vector before it (`n ≥ P ≥ W`); the accumulators are combined
        // lane-wise, then the lanes of one vector by halves (lane `i` with lane `i ^ h`),
        // and only lane 0 is read back.
        let lanes = t.lanes as i64;
        let mut at = rest;
        while at <= l.to {
            let start = usize::try_from(at.min(l.to + 1 - lanes)).ok()?;
            stmts.push(accumulate(regs[0], AxisIndex::Fixed(start))?);
            at += lanes;
        }
        let r0 = Box::new(Vlv::Reg(regs[0]));
        let into_r0 = |v: Vlv| Llc::VSet(regs[0], Vlv::Binop(combine, r0.clone(), Box::new(v)));
        stmts.extend(regs[1..].iter().map(|r| into_r0(Vlv::Reg(*r))));
        let mut half = t.lanes / 2;
        while half > 0 {
            let idx = (0..t.lanes).map(|i| i ^ half).collect();
            stmts.push(into_r0(Vlv::Shuffle(r0.clone(), r0.clone(), idx)));
            half /= 2;
        }
        stmts.push(Llc::VStore {
            tn: part.clone(),
            idcs: vec![AxisIndex::Fixed(0)],
            value: Vlv::Reg(regs[0]),
        });
        Llv::Get(part.clone(), vec![AxisIndex::Fixed(0)])
    } else {
        // Sums combine their partial results in a balanced tree over the partials' order
        // (`((p0 + p1) + (p2 + p3)) + ...`), with vector operations: within each vector,
        // lane `i` adds lane `i ^ h` for `h = 1, 2, ..., W/2` (lane 0 then holds its
        // vector's subtree, each step adding the lower-numbered half to the higher one as
        // the tree does), then the vectors pairwise in order. Lane 0 ends with the bits the
        // scalar tree gives, in a chain of `log2 P` additions instead of a tree of scalar
        // extractions (about 90 instructions for two 16-lane vectors with GCC 12).
        let mut half = 1;
        while half < t.lanes {
            for r in &regs {
                let idx = (0..t.lanes).map(|i| i ^ half).collect();
                let own = Box::new(Vlv::Reg(*r));
                let other = Box::new(Vlv::Shuffle(own.clone(), own.clone(), idx));
                stmts.push(Llc::VSet(*r, Vlv::Binop(combine, own, other)));
            }
            half *= 2;
        }
        let mut level = regs.clone();
        while level.len() > 1 {
            level = level
                .chunks(2)
                .map(|p| {
                    if let [a, b] = p {
                        let sum =
                            Vlv::Binop(combine, Box::new(Vlv::Reg(*a)), Box::new(Vlv::Reg(*b)));
                        stmts.push(Llc::VSet(*a, sum));
                    }
                    p[0]
                })
                .collect();
        }
        stmts.push(Llc::VStore {
            tn: part.clone(),
            idcs: vec![AxisIndex::Fixed(0)],
            value: Vlv::Reg(regs[0]),
        });
        Llv::Get(part.clone(), vec![AxisIndex::Fixed(0)])
    };
    stmts.push(Llc::Set {
        tn: tn.clone(),
        idcs: idcs.to_vec(),
        value: Llv::Binop(*op, acc_read.clone(), Box::new(total)),
    });
    // The last elements of a sum, one by one (max and min took them as vectors above).
    if !exact && rest <= l.to {
        stmts.push(for_(
            l.j,
            rest,
            l.to,
            Llc::Set {
                tn: tn.clone(),
                idcs: idcs.to_vec(),
                value: value.clone(),
            },
        ));
    }
    Some((Llc::Seq(stmts), part))
}
