//! Tap kernels: accumulations over a few *taps* that are pointwise along a contiguous axis
//! (depthwise convolutions, pooling with padding, 1-D convolutions of one channel), with the
//! accumulators held in vector registers across the taps.
//!
//! A *tap nest* is a nest of loops and guards (SPEC 9.3) around one accumulation
//! `c[pc] = c[pc] op e` (`op` one of add, sub, mul, max, min; single or double `c`) where
//! - every index of `c` is a plain loop iterator or fixed, no iterator indexing two axes;
//! - the loops that do not index `c` are the *taps* (the reduction: `i`, `j` of a 3×3
//!   window), at most [`MAX_TAPS`] points in all;
//! - one loop of `c`, the *channel* `ch`, walks `c` contiguously, and every read of `e` moves
//!   along `ch` contiguously or not at all (no reduction over channels: not a GEMM);
//! - `e` reads only arrays of `c`'s precision, not `c` itself.
//!
//! Such a nest runs its taps for every cell in the order of the nest (the loops that index
//! `c` may be reordered freely, as [`super::loops`] explains). The kernel keeps that order:
//! for a block of `P` *pixels* (consecutive values of a second loop `v` of `c`, one along
//! which some operand, the weights, does not move) × `CV` vectors of `W` channels, it loads
//! the `P · CV` accumulators from `c`, runs the tap loops (in their order) applying
//! `acc = acc op e` lane-wise (`e` as vector loads along `ch` and broadcasts of what does not
//! move along it; the operands that do not move along `v` loaded once per tap for all
//! pixels; `acc + x·y` as a fused multiply-add where the target has one, as the C compiler
//! contracts the scalar statement), then stores them. So every cell sees exactly the scalar
//! nest's sequence of updates (max and min included: skipped points are not visited at all),
//! and `c` is read and written once per block instead of once per tap.
//!
//! **Guards.** A guard that mentions `v` (`v+j-1`) may mention only `v` and taps; then `v` is
//! split into the *interior*, where the guard holds for every tap (an affine guard with
//! non-negative coefficients is smallest at the taps' first values and largest at their
//! last), and the borders before and after it. Interior blocks carry no such guard; in border
//! blocks each pixel's update is guarded on its own. The same goes for a guard on `ch` (the
//! 1-D convolution `(o+k-1),k->o`, whose channel is `o`): only the interior of `ch` runs in
//! vectors, the rest of the channels (and the channels past the last whole vector) are left
//! to the scalar nest, restricted to them ([`Taps::rest`]). Guards on the other loops and
//! taps (`h+i-1`) sit inside the tap loops, at the innermost loop they mention, or around the
//! block when they mention no tap. No skipped point is read or computed.
//!
//! **The fill.** When the statement just before the nest fills the result with a constant
//! (`init_neutral`: zeros, `-inf` for max) and the nest writes every cell, the accumulators
//! start from the constant instead of being loaded, and the fill is dropped
//! ([`Taps::folded_fill`]): exactly the values the fill and the loads would give, with the
//! result written once. Guards that skip whole blocks then sit inside the block (it still
//! stores the constant), and the channels left to the scalar nest get their own fill first.
//!
//! Only single- and double-precision results are rewritten (half and byte results round at
//! every step in the scalar code, which vectors of the compute type would not).

use crate::ir::{AxisIndex, Binop, Prec, Symbol, Tnode};
use crate::loops::{visit_value, visit_value_indices, Llc, Llv, VReg, VType, Vlv};
use crate::target::VectorTarget;

/// The most tap points (the product of the tap loops' extents) a kernel runs per block: the
/// operands of one block stay in cache for windows up to this size; longer reductions are
/// left to the other passes.
pub const MAX_TAPS: i64 = 64;

/// Reductions of at most this many points go to a tap kernel rather than a GEMM kernel when
/// both apply (a product over a short reduction, a 1-D convolution of one channel): the tap
/// kernel needs no packing and folds the fill (measured: `b(o+k-2),kd->bod` with 5 taps,
/// 0.065 ms against the GEMM kernel's 0.11 ms).
pub const TAPS_BEFORE_GEMM: i64 = 16;

/// The number of points of a nest's reduction (the loops that do not index the stored cell),
/// when the nest is one loop nest around one store.
pub fn reduction_points(c: &Llc) -> Option<i64> {
    let (loops, _, body) = nest_parts(c);
    let Llc::Set { idcs, .. } = body else {
        return None;
    };
    loops
        .iter()
        .filter(|l| !idcs.contains(&AxisIndex::Iterator(l.index)))
        .try_fold(1i64, |a, l| a.checked_mul(l.extent().max(0)))
}

/// A tap nest rewritten as a kernel.
pub struct Taps {
    /// The kernel.
    pub code: Llc,
    /// The parts of the nest left to the scalar passes: the same nest restricted to the
    /// channels the vectors do not cover (each after its fill, when the fill was folded).
    pub rest: Vec<Llc>,
    /// Whether the fill of the result just before the nest was folded into the kernel (the
    /// caller drops it).
    pub folded_fill: bool,
}

/// What a statement fills: every cell of a node with one constant (`ZeroOut`, or a nest of
/// loops over every whole axis storing a constant, as the fill of `init_neutral`).
pub fn fill_of(c: &Llc) -> Option<(Tnode, f64)> {
    if let Llc::ZeroOut(t) = c {
        return Some((t.clone(), 0.0));
    }
    let (loops, guards, body) = nest_parts(c);
    let Llc::Set {
        tn,
        idcs,
        value: Llv::Constant(k),
    } = body
    else {
        return None;
    };
    (guards.is_empty() && covers(tn, idcs, &loops)).then(|| (tn.clone(), *k))
}

/// Whether the loops reach every cell of `tn` through `idcs`: each axis indexed by a distinct
/// loop over all of it, or fixed on an axis of extent 1.
fn covers(tn: &Tnode, idcs: &[AxisIndex], loops: &[Loop]) -> bool {
    let mut seen = vec![];
    idcs.len() == tn.dims().len()
        && idcs.iter().zip(tn.dims()).all(|(ix, &d)| match ix {
            AxisIndex::Fixed(0) => d == 1,
            AxisIndex::Iterator(s) => {
                let whole = loops
                    .iter()
                    .any(|l| l.index == *s && l.from == 0 && l.to + 1 == d as i64);
                let fresh = !seen.contains(s);
                seen.push(*s);
                whole && fresh
            }
            _ => false,
        })
}

#[derive(Clone, Copy)]
struct Loop {
    index: Symbol,
    from: i64,
    to: i64,
}

impl Loop {
    fn extent(&self) -> i64 {
        self.to - self.from + 1
    }
}

pub(super) type Guard = (AxisIndex, usize);

fn nest_parts(c: &Llc) -> (Vec<Loop>, Vec<Guard>, &Llc) {
    let (mut loops, mut guards) = (vec![], vec![]);
    let mut c = c;
    loop {
        match c {
            Llc::For {
                index,
                from,
                to,
                body,
                ..
            } => {
                loops.push(Loop {
                    index: *index,
                    from: *from,
                    to: *to,
                });
                c = body;
            }
            Llc::If { guards: g, body } => {
                guards.extend(g.iter().copied());
                c = body;
            }
            _ => return (loops, guards, c),
        }
    }
}

/// The nest `c` with the bounds of loop `s` replaced.
pub(super) fn restrict(c: &Llc, s: Symbol, from: i64, to: i64) -> Llc {
    match c {
        Llc::For {
            index,
            from: f,
            to: t,
            body,
            trace_it,
        } => {
            let (f, t) = if *index == s { (from, to) } else { (*f, *t) };
            Llc::For {
                index: *index,
                from: f,
                to: t,
                body: Box::new(restrict(body, s, from, to)),
                trace_it: *trace_it,
            }
        }
        Llc::If { guards, body } => Llc::If {
            guards: guards.clone(),
            body: Box::new(restrict(body, s, from, to)),
        },
        other => other.clone(),
    }
}

/// The stride in elements with which `idcs` moves in `tn` when `s` grows by one (saturating).
fn stride(tn: &Tnode, idcs: &[AxisIndex], s: Symbol) -> usize {
    let dims = tn.dims();
    let mut total: usize = 0;
    for (k, ix) in idcs.iter().enumerate() {
        let axis = dims[k + 1..]
            .iter()
            .fold(1usize, |a, &d| a.saturating_mul(d));
        total = total.saturating_add(axis.saturating_mul(ix.coef(s)));
    }
    total
}

fn mentions(v: &Llv, s: Symbol) -> bool {
    let mut hit = false;
    visit_value_indices(v, &mut |ix| hit |= ix.coef(s) != 0);
    hit
}

/// `lo..=hi`: the values of `s` in `from..=to` at which every guard holds for every value of
/// the taps. Each guard mentions `s` and taps only.
fn interior(guards: &[Guard], s: Symbol, from: i64, to: i64, taps: &[Loop]) -> Option<(i64, i64)> {
    let ranges: Vec<(Symbol, i64, i64)> = taps.iter().map(|t| (t.index, t.from, t.to)).collect();
    interior_range(guards, s, from, to, &ranges)
}

/// `lo..=hi`: the values of `s` in `from..=to` at which every guard holds for all values of
/// the other iterators in their ranges (`(iterator, first, last)`); an empty range when
/// `lo > hi`. `None` when a guard mentions another symbol or does not move with `s`. An
/// affine guard's coefficients are non-negative, so it is smallest at the first values of
/// the other iterators and largest at their last.
pub(super) fn interior_range(
    guards: &[Guard],
    s: Symbol,
    from: i64,
    to: i64,
    taps: &[(Symbol, i64, i64)],
) -> Option<(i64, i64)> {
    let (mut lo, mut hi) = (from, to);
    for (ix, d) in guards {
        let d = i64::try_from(*d).ok()?;
        let (mut min, mut max, mut a) = (0i64, 0i64, 0i64);
        match ix {
            AxisIndex::Fixed(_) => return None,
            AxisIndex::Iterator(x) => {
                if *x != s {
                    return None;
                }
                a = 1;
            }
            AxisIndex::Linear(l) => {
                min = l.offset;
                max = l.offset;
                for &(x, c) in l.terms() {
                    let c = i64::try_from(c).ok()?;
                    if x == s {
                        a = c;
                    } else {
                        let &(_, first, last) = taps.iter().find(|t| t.0 == x)?;
                        min = min.checked_add(c.checked_mul(first)?)?;
                        max = max.checked_add(c.checked_mul(last)?)?;
                    }
                }
            }
        }
        if a <= 0 {
            return None;
        }
        // a·s + min >= 0 and a·s + max <= d - 1.
        lo = lo.max(min.checked_neg()?.checked_add(a - 1)?.div_euclid(a));
        hi = hi.min((d - 1).checked_sub(max)?.div_euclid(a));
    }
    Some((lo, hi))
}

/// A fresh vector variable (numbered with the GEMM kernels' ones: distinct names in one C
/// function).
fn vreg(ty: VType) -> VReg {
    super::gemm::vreg(ty)
}

fn subst_idcs(idcs: &[AxisIndex], subs: &[(Symbol, AxisIndex)]) -> Option<Vec<AxisIndex>> {
    idcs.iter()
        .map(|&ix| {
            subs.iter()
                .try_fold(ix, |ix, &(s, by)| ix.substitute(s, by))
        })
        .collect()
}

fn subst_all(c: &Llc, subs: &[(Symbol, AxisIndex)]) -> Option<Llc> {
    crate::loops::map_indices(c, &mut |ix| {
        subs.iter()
            .try_fold(ix, |ix, &(s, by)| ix.substitute(s, by))
    })
}

/// Whether `e` can be computed lane-wise along `ch` (see [`vectorize`]).
fn vectorizable(e: &Llv, ch: Symbol) -> bool {
    match e {
        Llv::Get(t, i) => matches!(stride(t, i, ch), 0 | 1),
        Llv::Constant(_) => true,
        Llv::Binop(op, a, b) => {
            if !mentions(e, ch) {
                return splattable(e);
            }
            matches!(
                op,
                Binop::Add | Binop::Sub | Binop::Mul | Binop::Max | Binop::Min
            ) && vectorizable(a, ch)
                && vectorizable(b, ch)
        }
        other => !mentions(other, ch) && splattable(other),
    }
}

/// Whether a scalar value that does not move along the channels may be broadcast: plain
/// array reads and arithmetic only (no inlined computations, random numbers or indices).
fn splattable(e: &Llv) -> bool {
    let mut ok = true;
    visit_value(e, &mut |v| {
        ok &= matches!(
            v,
            Llv::Get(..) | Llv::Constant(_) | Llv::Binop(..) | Llv::Unop(..) | Llv::Ternop(..)
        );
    });
    ok
}

/// `e` as a vector along `ch` (already substituted): reads contiguous along `ch` are loads,
/// parts that do not move along `ch` are broadcasts. `hoisted` replaces whole subtrees (the
/// operands loaded once per tap for all pixels).
fn vectorize(e: &Llv, ch: Symbol, ty: VType, hoisted: &[(Llv, VReg)]) -> Option<Vlv> {
    if let Some((_, r)) = hoisted.iter().find(|(h, _)| h == e) {
        return Some(Vlv::Reg(*r));
    }
    if !mentions(e, ch) {
        return Some(Vlv::Splat(ty, Box::new(e.clone())));
    }
    match e {
        Llv::Get(t, i) if stride(t, i, ch) == 1 => Some(Vlv::Load(ty, t.clone(), i.clone())),
        Llv::Binop(op, a, b) => Some(Vlv::Binop(
            *op,
            Box::new(vectorize(a, ch, ty, hoisted)?),
            Box::new(vectorize(b, ch, ty, hoisted)?),
        )),
        _ => None,
    }
}

/// The leaves of `e` (reads and broadcast subtrees) that do not mention `v`: loaded once per
/// tap and channel vector for all the pixels of a block.
fn invariant_leaves(e: &Llv, ch: Symbol, v: Symbol, out: &mut Vec<Llv>) {
    let leaf = !mentions(e, ch) || matches!(e, Llv::Get(..));
    if leaf {
        if !mentions(e, v) && !matches!(e, Llv::Constant(_)) && !out.contains(e) {
            out.push(e.clone());
        }
        return;
    }
    if let Llv::Binop(_, a, b) = e {
        invariant_leaves(a, ch, v, out);
        invariant_leaves(b, ch, v, out);
    }
}

/// Rewrites a tap nest as a kernel (see the module documentation); gives it back unchanged
/// when it is not one.
/// `fill` is what the statement just before the nest filled ([`fill_of`]): when it is the
/// result and the nest writes every cell, the kernel starts its accumulators from the constant
/// instead of loading them (exactly what the fill and the loads would give), and the fill is
/// dropped.
pub fn rewrite(nest: Llc, target: &VectorTarget, fill: Option<(Tnode, f64)>) -> Result<Taps, Llc> {
    match build(&nest, target, fill) {
        Some(t) => Ok(t),
        None => Err(nest),
    }
}

struct Shape<'a> {
    c: &'a Tnode,
    pc: &'a [AxisIndex],
    op: Binop,
    e: &'a Llv,
    ty: VType,
    ch: Loop,
    v: Option<Loop>,
    outer: Vec<Loop>,
    taps: Vec<Loop>,
    /// Guards placed in the tap loops or around the block.
    inner_guards: Vec<Guard>,
    /// Guards on the pixels (kept per pixel in border blocks).
    v_guards: Vec<Guard>,
    /// The vectors of channels: `nvec` vectors from channel `c0`.
    c0: i64,
    nvec: usize,
    cv: usize,
    p: usize,
    /// The constant the accumulators start from (the folded fill), else `None`: loaded.
    start: Option<f64>,
}

fn build(nest: &Llc, target: &VectorTarget, fill: Option<(Tnode, f64)>) -> Option<Taps> {
    let (loops, guards, body) = nest_parts(nest);
    let Llc::Set {
        tn: c,
        idcs: pc,
        value,
    } = body
    else {
        return None;
    };
    if !matches!(c.prec(), Prec::Single | Prec::Double) || loops.len() < 2 {
        return None;
    }
    let Llv::Binop(op, own, e) = value else {
        return None;
    };
    if !matches!(
        op,
        Binop::Add | Binop::Sub | Binop::Mul | Binop::Max | Binop::Min
    ) || !matches!(&**own, Llv::Get(t, i) if t == c && i == pc)
    {
        return None;
    }
    if loops.iter().any(|l| l.to < l.from) {
        return None;
    }
    let is_loop = |s: Symbol| loops.iter().any(|l| l.index == s);
    // The written cell: plain iterators (each on one axis) or fixed indices.
    for ix in pc.iter() {
        match ix {
            AxisIndex::Fixed(_) => {}
            AxisIndex::Iterator(s) => {
                if pc.iter().filter(|i| i.coef(*s) != 0).count() != 1 {
                    return None;
                }
            }
            AxisIndex::Linear(_) => return None,
        }
    }
    let written = |s: Symbol| pc.contains(&AxisIndex::Iterator(s));
    // `e` reads arrays of `c`'s precision only, and not `c`.
    let mut reads_ok = true;
    visit_value(e, &mut |v| match v {
        Llv::Get(t, _) => reads_ok &= t != c && t.prec() == c.prec(),
        Llv::GetMergeBuffer(..) | Llv::LocalScope { .. } | Llv::GetLocal(_) => reads_ok = false,
        _ => {}
    });
    if !reads_ok {
        return None;
    }
    let ch = *loops
        .iter()
        .find(|l| written(l.index) && stride(c, pc, l.index) == 1)?;
    let mut contiguous = false;
    visit_value(e, &mut |v| {
        if let Llv::Get(t, i) = v {
            contiguous |= stride(t, i, ch.index) == 1;
        }
    });
    if !contiguous || !vectorizable(e, ch.index) {
        return None;
    }
    let taps: Vec<Loop> = loops
        .iter()
        .filter(|l| !written(l.index))
        .copied()
        .collect();
    let points = taps
        .iter()
        .try_fold(1i64, |a, t| a.checked_mul(t.extent()))?;
    if taps.is_empty() || !(2..=MAX_TAPS).contains(&points) {
        return None;
    }
    let is_tap = |s: Symbol| taps.iter().any(|t| t.index == s);
    // Every symbol of a guard is a loop iterator of the nest.
    if guards
        .iter()
        .any(|(ix, _)| ix.symbols().iter().any(|&s| !is_loop(s)))
    {
        return None;
    }
    // Guards on the channels: channels and taps only.
    let mut ch_guards = vec![];
    let mut rest_guards = vec![];
    for g in &guards {
        if g.0.coef(ch.index) != 0 {
            if g.0.symbols().iter().any(|&s| s != ch.index && !is_tap(s)) {
                return None;
            }
            ch_guards.push(*g);
        } else {
            rest_guards.push(*g);
        }
    }
    // The pixels: the innermost other loop of `c` along which some read does not move and
    // whose guards mention only it and taps.
    let mut w = target.lanes(c.prec());
    if w < 2 {
        return None;
    }
    let v = loops
        .iter()
        .rev()
        .filter(|l| written(l.index) && l.index != ch.index && l.extent() >= 2)
        .find(|l| {
            let mut reuse = false;
            visit_value(e, &mut |x| {
                if let Llv::Get(t, i) = x {
                    reuse |= stride(t, i, l.index) == 0;
                }
            });
            reuse
                && rest_guards.iter().all(|(ix, _)| {
                    ix.coef(l.index) == 0 || ix.symbols().iter().all(|&s| s == l.index || is_tap(s))
                })
        })
        .copied();
    let (v_guards, inner_guards): (Vec<Guard>, Vec<Guard>) = rest_guards
        .iter()
        .partition(|(ix, _)| v.is_some_and(|v| ix.coef(v.index) != 0));
    // A guard on another written loop together with taps is fine (it sits in the taps); one
    // on two written loops (`h+v`) is not handled.
    let outer: Vec<Loop> = loops
        .iter()
        .filter(|l| written(l.index) && l.index != ch.index && v.is_none_or(|v| v.index != l.index))
        .copied()
        .collect();
    for (ix, _) in &inner_guards {
        if ix.symbols().iter().filter(|&&s| !is_tap(s)).count() > 1 {
            return None;
        }
    }
    let (clo, chi) = interior(&ch_guards, ch.index, ch.from, ch.to, &taps)?;
    // Fewer channels than a vector has lanes (8 floats against AVX-512's 16): narrower
    // vectors that they fill.
    let channels = usize::try_from(chi - clo + 1).unwrap_or(0);
    w = target
        .fitting(channels, |t| t.lanes(c.prec()))
        .lanes(c.prec());
    let ty = VType {
        prec: c.prec(),
        lanes: w,
    };
    let nvec = if chi >= clo {
        usize::try_from((chi - clo + 1) / w as i64).ok()?
    } else {
        0
    };
    if nvec == 0 {
        return None;
    }
    // The blocking: accumulators for P pixels × CV vectors, the invariant operands of CV
    // vectors, and a few temporaries in the registers.
    let mut inv = vec![];
    if let Some(v) = v {
        invariant_leaves(e, ch.index, v.index, &mut inv);
    }
    let regs = target.registers.max(8);
    let (cv, p) = match v {
        Some(_) => {
            let cv = nvec.min(2);
            let p = (regs.saturating_sub(2 + cv * inv.len()) / cv).clamp(1, 8);
            (cv, p)
        }
        None => (nvec.min(4), 1),
    };
    let start = match fill {
        Some((t, k)) if &t == c && covers(c, pc, &loops) => Some(k),
        _ => None,
    };
    let shape = Shape {
        c,
        pc,
        op: *op,
        e,
        ty,
        ch,
        v,
        outer,
        taps,
        inner_guards,
        v_guards,
        c0: clo,
        nvec,
        cv,
        p,
        start,
    };
    let code = shape.emit()?;
    // The channels the vectors leave to the scalar nest.
    let vec_end = clo + (nvec * w) as i64;
    let mut rest = vec![];
    let mut part = |from: i64, to: i64| {
        let scalar = restrict(nest, ch.index, from, to);
        rest.push(match start {
            // The fill of these channels, then their nest.
            Some(k) => {
                let fill = loops.iter().rev().filter(|l| written(l.index)).fold(
                    Llc::Set {
                        tn: c.clone(),
                        idcs: pc.to_vec(),
                        value: Llv::Constant(k),
                    },
                    |body, l| Llc::for_loop(l.index, l.from, l.to, body),
                );
                Llc::Seq(vec![restrict(&fill, ch.index, from, to), scalar])
            }
            None => scalar,
        });
    };
    if ch.from < clo {
        part(ch.from, clo - 1);
    }
    if vec_end <= ch.to {
        part(vec_end, ch.to);
    }
    Some(Taps {
        code,
        rest,
        folded_fill: start.is_some(),
    })
}

impl Shape<'_> {
    fn emit(&self) -> Option<Llc> {
        let mut out = vec![Llc::Comment(format!(
            "tap kernel for {}: {} taps, {} pixels x {} vectors of {} lanes per block",
            self.c.name(),
            self.taps.iter().map(|t| t.extent()).product::<i64>(),
            if self.v.is_some() { self.p } else { 1 },
            self.cv,
            self.ty.lanes
        ))];
        // The guards on the outer loops alone go around everything they cover.
        // With a folded fill every block must store (the constant where they fail), so
        // they go around the tap loops instead.
        let (around, in_taps): (Vec<Guard>, Vec<Guard>) =
            self.inner_guards.iter().partition(|(ix, _)| {
                self.start.is_none()
                    && ix
                        .symbols()
                        .iter()
                        .all(|s| self.taps.iter().all(|t| t.index != *s))
            });
        let mut body = vec![];
        match self.v {
            None => body.push(self.channels(&[], &in_taps, false)?),
            Some(v) => {
                let (lo, hi) = interior(&self.v_guards, v.index, v.from, v.to, &self.taps)?;
                let mut segs = vec![];
                if lo > hi {
                    segs.push((v.from, v.to, true));
                } else {
                    if v.from < lo {
                        segs.push((v.from, lo - 1, true));
                    }
                    segs.push((lo, hi, false));
                    if hi < v.to {
                        segs.push((hi + 1, v.to, true));
                    }
                }
                for (from, to, border) in segs {
                    body.push(self.pixels(v.index, from, to, border, &in_taps)?);
                }
            }
        }
        let mut c = Llc::Seq(body);
        if !around.is_empty() {
            c = Llc::If {
                guards: around,
                body: Box::new(c),
            };
        }
        for l in self.outer.iter().rev() {
            c = Llc::for_loop(l.index, l.from, l.to, c);
        }
        out.push(c);
        Some(Llc::Seq(out))
    }

    /// Pixels `from..=to` of `v` in blocks of `p` (and one shorter block).
    fn pixels(&self, v: Symbol, from: i64, to: i64, border: bool, guards: &[Guard]) -> Option<Llc> {
        let n = usize::try_from(to - from + 1).ok()?;
        let p = self.p.min(n);
        let (blocks, rem) = (n / p, n % p);
        let from = usize::try_from(from).ok()?;
        let mut out = vec![];
        if blocks > 0 {
            let vb = Symbol::fresh();
            let px: Vec<(Symbol, AxisIndex)> = (0..p)
                .map(|k| Some((v, AxisIndex::linear(&[(vb, p)], from + k)?)))
                .collect::<Option<_>>()?;
            let inner = self.channels(&px, guards, border)?;
            out.push(if blocks == 1 {
                subst_llc(&inner, vb, AxisIndex::Fixed(0))?
            } else {
                Llc::for_loop(vb, 0, blocks as i64 - 1, inner)
            });
        }
        if rem > 0 {
            let start = from + blocks * p;
            let px: Vec<(Symbol, AxisIndex)> =
                (0..rem).map(|k| (v, AxisIndex::Fixed(start + k))).collect();
            out.push(self.channels(&px, guards, border)?);
        }
        Some(Llc::Seq(out))
    }

    /// The channel vectors for the given pixels (each a substitution of `v`; none when there
    /// is no pixel loop).
    fn channels(&self, px: &[(Symbol, AxisIndex)], guards: &[Guard], border: bool) -> Option<Llc> {
        let w = self.ty.lanes;
        let c0 = usize::try_from(self.c0).ok()?;
        let (blocks, rem) = (self.nvec / self.cv, self.nvec % self.cv);
        let mut out = vec![];
        if blocks > 0 {
            let cb = Symbol::fresh();
            let chans: Vec<AxisIndex> = (0..self.cv)
                .map(|k| AxisIndex::linear(&[(cb, self.cv * w)], c0 + k * w))
                .collect::<Option<_>>()?;
            let inner = self.block(px, &chans, guards, border)?;
            out.push(if blocks == 1 {
                subst_llc(&inner, cb, AxisIndex::Fixed(0))?
            } else {
                Llc::for_loop(cb, 0, blocks as i64 - 1, inner)
            });
        }
        if rem > 0 {
            let start = c0 + blocks * self.cv * w;
            let chans: Vec<AxisIndex> = (0..rem).map(|k| AxisIndex::Fixed(start + k * w)).collect();
            out.push(self.block(px, &chans, guards, border)?);
        }
        Some(Llc::Seq(out))
    }

    /// One block: accumulators for every pixel × channel vector, loaded, updated over the
    /// taps, stored.
    fn block(
        &self,
        px: &[(Symbol, AxisIndex)],
        chans: &[AxisIndex],
        guards: &[Guard],
        border: bool,
    ) -> Option<Llc> {
        let ty = self.ty;
        let ch = self.ch.index;
        let one_pixel = [None];
        let pixels: Vec<Option<(Symbol, AxisIndex)>> = if px.is_empty() {
            one_pixel.to_vec()
        } else {
            px.iter().copied().map(Some).collect()
        };
        let subs = |p: &Option<(Symbol, AxisIndex)>, c: AxisIndex| {
            let mut s = vec![(ch, c)];
            s.extend(*p);
            s
        };
        let acc: Vec<Vec<VReg>> = pixels
            .iter()
            .map(|_| chans.iter().map(|_| vreg(ty)).collect())
            .collect();
        let mut stmts = vec![];
        for (p, accs) in pixels.iter().zip(&acc) {
            for (&c, &r) in chans.iter().zip(accs) {
                let idcs = subst_idcs(self.pc, &subs(p, c))?;
                stmts.push(Llc::VSet(
                    r,
                    match self.start {
                        Some(k) => Vlv::Splat(ty, Box::new(Llv::Constant(k))),
                        None => Vlv::Load(ty, self.c.clone(), idcs),
                    },
                ));
            }
        }
        // The update of every accumulator at one tap point.
        let mut update = vec![];
        let mut inv = vec![];
        if let (Some(v), true) = (self.v, pixels.len() > 1) {
            invariant_leaves(self.e, ch, v.index, &mut inv);
        }
        // Vectorized before the substitution (which turns `ch` into the block's channels).
        let mut hoisted: Vec<Vec<(Llv, VReg)>> = vec![];
        for &c in chans {
            let mut h = vec![];
            for leaf in &inv {
                let r = vreg(ty);
                let set = Llc::VSet(r, vectorize(leaf, ch, ty, &[])?);
                update.push(subst_all(&set, &[(ch, c)])?);
                h.push((leaf.clone(), r));
            }
            hoisted.push(h);
        }
        for (p, accs) in pixels.iter().zip(&acc) {
            for ((&c, &r), h) in chans.iter().zip(accs).zip(&hoisted) {
                let s = subs(p, c);
                let acc = Box::new(Vlv::Reg(r));
                let value = match (self.e, self.op) {
                    (Llv::Binop(Binop::Mul, a, b), Binop::Add) => Vlv::Fma(
                        Box::new(vectorize(a, ch, ty, h)?),
                        Box::new(vectorize(b, ch, ty, h)?),
                        acc,
                    ),
                    (e, op) => Vlv::Binop(op, acc, Box::new(vectorize(e, ch, ty, h)?)),
                };
                let mut stmt = subst_all(&Llc::VSet(r, value), &s)?;
                if border && !self.v_guards.is_empty() {
                    let g: Vec<Guard> = self
                        .v_guards
                        .iter()
                        .map(|(ix, d)| Some((subst_idcs(&[*ix], &s)?[0], *d)))
                        .collect::<Option<_>>()?;
                    stmt = Llc::If {
                        guards: g,
                        body: Box::new(stmt),
                    };
                }
                update.push(stmt);
            }
        }
        // The tap loops in their order, each guard inside the innermost loop it mentions.
        let level = |g: &Guard| {
            let syms = g.0.symbols();
            self.taps
                .iter()
                .rposition(|t| syms.contains(&t.index))
                .map_or(0, |k| k + 1)
        };
        let mut at: Vec<Vec<Guard>> = vec![vec![]; self.taps.len() + 1];
        for g in guards {
            at[level(g)].push(*g);
        }
        let wrap = |c: Llc, g: Vec<Guard>| {
            if g.is_empty() {
                c
            } else {
                Llc::If {
                    guards: g,
                    body: Box::new(c),
                }
            }
        };
        let mut c = wrap(Llc::Seq(update), at.pop().unwrap_or_default());
        for t in self.taps.iter().rev() {
            c = Llc::for_loop(t.index, t.from, t.to, c);
            c = wrap(c, at.pop().unwrap_or_default());
        }
        stmts.push(c);
        for (p, accs) in pixels.iter().zip(&acc) {
            for (&c, &r) in chans.iter().zip(accs) {
                let idcs = subst_idcs(self.pc, &subs(p, c))?;
                stmts.push(Llc::VStore {
                    tn: self.c.clone(),
                    idcs,
                    value: Vlv::Reg(r),
                });
            }
        }
        Some(Llc::Seq(stmts))
    }
}

fn subst_llc(c: &Llc, s: Symbol, by: AxisIndex) -> Option<Llc> {
    crate::loops::map_indices(c, &mut |ix| ix.substitute(s, by))
}
