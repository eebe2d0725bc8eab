//! Lowering: assignments to the loop IR ([`crate::loops`]).

use crate::error::{Error, Result};
use crate::ir::tnode::provenance;
use crate::ir::{
    Assignments, AxisIndex, Binop, Buffer, FetchOp, MemoryMode, Prec, Projections, Symbol, Tnode,
};
use crate::loops::{Llc, Llv};

fn loops(product: &[(Symbol, usize)], body: Llc) -> Llc {
    product.iter().rev().fold(body, |body, &(s, n)| Llc::For {
        index: s,
        from: 0,
        to: n as i64 - 1,
        body: Box::new(body),
        trace_it: true,
    })
}

/// Loops over every cell of `tn`, calling `f` with the indices of a cell.
fn over_all_cells(tn: &Tnode, f: impl FnOnce(Vec<AxisIndex>) -> Llc) -> Llc {
    let mut product = vec![];
    let idcs = tn
        .dims()
        .iter()
        .map(|&d| {
            if d == 1 {
                AxisIndex::Fixed(0)
            } else {
                let s = Symbol::fresh();
                product.push((s, d));
                AxisIndex::Iterator(s)
            }
        })
        .collect();
    loops(&product, f(idcs))
}

fn get(b: &Buffer, idcs: &[AxisIndex]) -> Llv {
    match b {
        Buffer::Node(t) => Llv::Get(t.clone(), idcs.to_vec()),
        Buffer::MergeBuffer(t) => Llv::GetMergeBuffer(t.clone(), idcs.to_vec()),
    }
}

fn check_projections(lhs: &Tnode, args: &[&Buffer], p: &Projections) -> Result<()> {
    let bad = |m: String| {
        Err(Error::Assignment(format!(
            "assignment to {}: {m}",
            lhs.name()
        )))
    };
    if p.project_lhs.len() != lhs.dims().len() || p.lhs_dims != lhs.dims() {
        return bad(format!(
            "projection for the result has dims {:?} but the tensor has {:?}",
            p.lhs_dims,
            lhs.dims()
        ));
    }
    if p.project_rhs.len() != args.len() || p.product_space.len() != p.product_iterators.len() {
        return bad(format!(
            "projections describe {} arguments, the assignment has {}",
            p.project_rhs.len(),
            args.len()
        ));
    }
    for (k, (a, pr)) in args.iter().zip(&p.project_rhs).enumerate() {
        if pr.len() != a.tnode().dims().len() {
            return bad(format!(
                "argument {} ({}) has dims {:?} but its projection has {} axes",
                k + 1,
                a.tnode().name(),
                a.tnode().dims(),
                pr.len()
            ));
        }
    }
    // Every fixed index and every iterator must stay within the dims it indexes.
    let extent = |s: &Symbol| {
        p.product_iterators
            .iter()
            .position(|x| x == s)
            .map(|i| p.product_space[i])
    };
    let mut all: Vec<(&Tnode, &[AxisIndex])> = vec![(lhs, &p.project_lhs)];
    all.extend(
        args.iter()
            .zip(&p.project_rhs)
            .map(|(a, pr)| (a.tnode(), pr.as_slice())),
    );
    for (tn, idcs) in all {
        for (axis, (ix, &d)) in idcs.iter().zip(tn.dims()).enumerate() {
            // Affine entries over product iterators are guarded: their points out of range
            // are skipped (SPEC 9.3), so they need not stay within the axis.
            let guarded = p.affine
                && !matches!(ix, AxisIndex::Fixed(_))
                && ix.symbols().iter().all(|s| extent(s).is_some());
            let ok = guarded
                || match ix {
                    AxisIndex::Fixed(i) => *i < d,
                    AxisIndex::Iterator(s) => extent(s).is_none_or(|n| n <= d),
                    // `offset + Σ coef·iterator` (a flat view, e.g. a fusion buffer): its largest
                    // value must be in range, and every term must be a product iterator.
                    AxisIndex::Linear(l) => {
                        l.offset >= 0
                            && l.terms()
                                .iter()
                                .try_fold(l.offset as usize, |max, (s, c)| {
                                    max.checked_add(c.checked_mul(extent(s)?.checked_sub(1)?)?)
                                })
                                .is_some_and(|max| max < d)
                    }
                };
            if !ok {
                return bad(format!(
                    "index {ix} on axis {axis} of {} (extent {d}) is out of range",
                    tn.name()
                ));
            }
        }
    }
    Ok(())
}

fn fill_neutral(lhs: &Tnode, accum: Binop) -> Llc {
    let value = if lhs.prec().is_integer() {
        // Integer results (SPEC 9.1): the type's minimum for max, maximum for min. Constants
        // are f64; every neutral is exact as one, read as a 64-bit pattern, except int64's
        // maximum, written as (-2^63) - 1 (which wraps to it in integer compute).
        let bits = accum.int_neutral(lhs.prec());
        if bits == i64::MAX as u64 {
            Llv::Binop(
                Binop::Sub,
                Box::new(Llv::Constant(i64::MIN as f64)),
                Box::new(Llv::Constant(1.0)),
            )
        } else {
            Llv::Constant(bits as i64 as f64)
        }
    } else {
        Llv::Constant(accum.neutral())
    };
    if value == Llv::Constant(0.0) {
        Llc::ZeroOut(lhs.clone())
    } else {
        over_all_cells(lhs, |idcs| Llc::Set {
            tn: lhs.clone(),
            idcs,
            value: value.clone(),
        })
    }
}

/// Bitwise and shift operations need integer precisions for the result and every argument
/// (SPEC 9.2): [`Error::IntegerOnlyOp`] otherwise.
fn check_integer_only(ops: &[Binop], lhs: &Tnode, args: &[&Buffer]) -> Result<()> {
    let Some(op) = ops.iter().find(|o| o.is_integer_only()) else {
        return Ok(());
    };
    let tensors = std::iter::once(lhs).chain(args.iter().map(|b| match b {
        Buffer::Node(t) | Buffer::MergeBuffer(t) => t,
    }));
    for t in tensors {
        if !t.prec().is_integer() {
            return Err(Error::IntegerOnlyOp {
                op: op.name().to_string(),
                tensor: t.name(),
                prec: t.prec().name().to_string(),
            });
        }
    }
    Ok(())
}

fn accum_body(
    initialize_neutral: bool,
    bijective: bool,
    accum: Binop,
    lhs: &Tnode,
    idcs: &[AxisIndex],
    v: Llv,
) -> Llc {
    let value = if accum == Binop::Arg2 || (initialize_neutral && bijective) {
        v
    } else {
        Llv::Binop(
            accum,
            Box::new(Llv::Get(lhs.clone(), idcs.to_vec())),
            Box::new(v),
        )
    };
    Llc::Set {
        tn: lhs.clone(),
        idcs: idcs.to_vec(),
        value,
    }
}

/// Lowers assignments to the loop IR: one flat sequence of statements, block comments
/// becoming comments before their bodies. Iterative, so sequences of any length and depth
/// lower without deep recursion.
pub fn lower(asgns: &Assignments) -> Result<Llc> {
    let mut out = vec![];
    let mut err = None;
    asgns.walk(&mut |a, _| {
        if err.is_some() {
            return;
        }
        match lower_leaf(a) {
            Ok(Llc::Seq(v)) => out.extend(v),
            Ok(Llc::Noop) => {}
            Ok(c) => out.push(c),
            Err(e) => err = Some(e),
        }
    });
    match err {
        Some(e) => Err(e),
        None => Ok(Llc::Seq(out)),
    }
}

/// Lowers one block comment (just its comment) or one leaf assignment.
fn lower_leaf(asgns: &Assignments) -> Result<Llc> {
    Ok(match asgns {
        Assignments::Noop | Assignments::Seq(..) => Llc::Noop,
        Assignments::BlockComment(c, _) => Llc::Comment(c.clone()),
        Assignments::AccumBinop {
            initialize_neutral,
            accum,
            op,
            lhs,
            rhs1,
            rhs2,
            projections,
        } => {
            check_projections(lhs, &[rhs1, rhs2], projections)?;
            check_integer_only(&[*op, *accum], lhs, &[rhs1, rhs2])?;
            let (snapshot, args) =
                snapshot_aliases(lhs, *initialize_neutral, projections, &[rhs1, rhs2])?;
            let p = projections.freshen();
            let v = Llv::Binop(
                *op,
                Box::new(get(&args[0], &p.project_rhs[0])),
                Box::new(get(&args[1], &p.project_rhs[1])),
            );
            with_snapshot(
                lhs,
                snapshot,
                lower_accum(*initialize_neutral, *accum, lhs, &p, v)?,
            )
        }
        Assignments::AccumTernop {
            initialize_neutral,
            accum,
            op,
            lhs,
            rhs1,
            rhs2,
            rhs3,
            projections,
        } => {
            check_projections(lhs, &[rhs1, rhs2, rhs3], projections)?;
            // The accumulation may be integer-only (`bit_or` of where-selections).
            check_integer_only(&[*accum], lhs, &[rhs1, rhs2, rhs3])?;
            let (snapshot, args) =
                snapshot_aliases(lhs, *initialize_neutral, projections, &[rhs1, rhs2, rhs3])?;
            let p = projections.freshen();
            let v = Llv::Ternop(
                *op,
                Box::new(get(&args[0], &p.project_rhs[0])),
                Box::new(get(&args[1], &p.project_rhs[1])),
                Box::new(get(&args[2], &p.project_rhs[2])),
            );
            with_snapshot(
                lhs,
                snapshot,
                lower_accum(*initialize_neutral, *accum, lhs, &p, v)?,
            )
        }
        Assignments::AccumUnop {
            initialize_neutral,
            accum,
            op,
            lhs,
            rhs,
            projections,
        } => {
            check_projections(lhs, &[rhs], projections)?;
            check_integer_only(&[*accum], lhs, &[rhs])?;
            let (snapshot, args) = snapshot_aliases(lhs, *initialize_neutral, projections, &[rhs])?;
            let p = projections.freshen();
            let v = Llv::Unop(*op, Box::new(get(&args[0], &p.project_rhs[0])));
            with_snapshot(
                lhs,
                snapshot,
                lower_accum(*initialize_neutral, *accum, lhs, &p, v)?,
            )
        }
        Assignments::Fetch { array, fetch_op } => lower_fetch(array, fetch_op)?,
        Assignments::Gather { lhs, table, index } => lower_gather(lhs, table, index)?,
        Assignments::ScatterAdd { lhs, src, index } => lower_scatter_add(lhs, src, index)?,
    })
}

/// An assignment that reads its own result at other cells than the one it writes (`b = b`
/// with `ij->ji`, an in-place product), or reads it after `initialize_neutral` refills it,
/// would see half-updated values. Such reads go to a snapshot of the result taken just before
/// the assignment: the assignment then means what it says, computed from the old values.
/// Returns the snapshot node (if one is needed) and the arguments to read.
fn snapshot_aliases(
    lhs: &Tnode,
    initialize_neutral: bool,
    p: &Projections,
    args: &[&Buffer],
) -> Result<(Option<Tnode>, Vec<Buffer>)> {
    let refilled = initialize_neutral && !p.is_bijective();
    let aliased = args.iter().zip(&p.project_rhs).any(|(a, proj)| {
        matches!(a, Buffer::Node(t) if t == lhs) && (refilled || *proj != p.project_lhs)
    });
    if !aliased {
        return Ok((None, args.iter().map(|a| (*a).clone()).collect()));
    }
    let mut label: Vec<&str> = lhs.label().iter().map(String::as_str).collect();
    label.push("old");
    let snap = Tnode::builder(&label, lhs.dims(), lhs.prec())
        .memory_with_provenance(MemoryMode::Local, provenance::SNAPSHOT)
        .build()?;
    let args = args
        .iter()
        .map(|a| match a {
            Buffer::Node(t) if t == lhs => Buffer::Node(snap.clone()),
            a => (*a).clone(),
        })
        .collect();
    Ok((Some(snap), args))
}

/// Prefixes `body` with the copy of `lhs` into the snapshot, if there is one.
fn with_snapshot(lhs: &Tnode, snapshot: Option<Tnode>, body: Llc) -> Llc {
    match snapshot {
        None => body,
        Some(snap) => {
            let copy = over_all_cells(&snap, |idcs| Llc::Set {
                tn: snap.clone(),
                idcs: idcs.clone(),
                value: Llv::Get(lhs.clone(), idcs),
            });
            Llc::Seq(vec![copy, body])
        }
    }
}

fn lower_accum(
    initialize_neutral: bool,
    accum: Binop,
    lhs: &Tnode,
    p: &Projections,
    v: Llv,
) -> Result<Llc> {
    let bijective = p.is_bijective();
    let product: Vec<(Symbol, usize)> = p
        .product_iterators
        .iter()
        .copied()
        .zip(p.product_space.iter().copied())
        .collect();
    let stmt = accum_body(initialize_neutral, bijective, accum, lhs, &p.project_lhs, v);
    let body = if p.affine {
        guarded_loops(p, &product, stmt)?
    } else {
        loops(&product, stmt)
    };
    Ok(if initialize_neutral && !bijective {
        Llc::Seq(vec![fill_neutral(lhs, accum), body])
    } else {
        body
    })
}

/// The loop nest of a statement with affine entries (SPEC 9.3): every point at which an
/// index of an operand may fall outside its axis is skipped. A guard on one iterator
/// (`c·s + o`) tightens that loop's bounds exactly; a guard on several becomes an
/// [`Llc::If`] placed just inside the loop of its innermost iterator, so that it is tested as
/// far out as possible and the loops inside it stay guard-free.
fn guarded_loops(p: &Projections, product: &[(Symbol, usize)], stmt: Llc) -> Result<Llc> {
    let overflow = |ix: &AxisIndex| Error::Spec {
        spec: p.debug_info.clone(),
        msg: format!("the affine index {ix} overflows 64-bit integers over the product space"),
    };
    let pos = |s: Symbol| product.iter().position(|(x, _)| *x == s);
    let max = |s: Symbol| pos(s).map(|k| product[k].1 as i64 - 1);
    let mut bounds: Vec<(i64, i64)> = product.iter().map(|&(_, n)| (0, n as i64 - 1)).collect();
    // Guards on several iterators, by the position of their innermost iterator.
    let mut ifs: Vec<Vec<(AxisIndex, usize)>> = vec![vec![]; product.len()];
    let operands =
        std::iter::once((&p.project_lhs, &p.lhs_dims)).chain(p.project_rhs.iter().zip(&p.rhs_dims));
    for (idcs, dims) in operands {
        for (ix, &d) in idcs.iter().zip(dims) {
            if matches!(ix, AxisIndex::Fixed(_)) {
                continue;
            }
            let syms = ix.symbols();
            if syms.iter().any(|s| pos(*s).is_none()) {
                // A static index: checked when its value is set.
                continue;
            }
            if product.iter().any(|&(_, n)| n == 0) {
                // No points at all.
                return Ok(Llc::Noop);
            }
            let (lo, hi) = ix.range(max).ok_or_else(|| overflow(ix))?;
            let d64 = i64::try_from(d).map_err(|_| overflow(ix))?;
            if lo >= 0 && hi < d64 {
                continue;
            }
            match ix {
                AxisIndex::Iterator(s) => {
                    let k = pos(*s).unwrap_or(0);
                    bounds[k].1 = bounds[k].1.min(d64 - 1);
                }
                AxisIndex::Linear(l) if l.terms().len() == 1 => {
                    let (s, c) = l.terms()[0];
                    let k = pos(s).unwrap_or(0);
                    let c = i64::try_from(c).map_err(|_| overflow(ix))?;
                    let o = l.offset;
                    // 0 <= c·s + o <= d-1.
                    let from = -o.div_euclid(c);
                    let to = (d64 - 1)
                        .checked_sub(o)
                        .ok_or_else(|| overflow(ix))?
                        .div_euclid(c);
                    bounds[k] = (bounds[k].0.max(from), bounds[k].1.min(to));
                }
                _ => {
                    let k = syms.iter().filter_map(|s| pos(*s)).max().unwrap_or(0);
                    if !ifs[k].iter().any(|g| g.0 == *ix && g.1 == d) {
                        ifs[k].push((*ix, d));
                    }
                }
            }
        }
    }
    if bounds.iter().any(|(from, to)| from > to) {
        return Ok(Llc::Noop);
    }
    let mut body = stmt;
    for k in (0..product.len()).rev() {
        let guards = std::mem::take(&mut ifs[k]);
        if !guards.is_empty() {
            body = Llc::If {
                guards,
                body: Box::new(body),
            };
        }
        body = Llc::For {
            index: product[k].0,
            from: bounds[k].0,
            to: bounds[k].1,
            body: Box::new(body),
            trace_it: true,
        };
    }
    Ok(body)
}

/// An index per axis: a fresh iterator (added to `product`), or 0 on an axis of extent 1.
fn axis_indices(dims: &[usize], product: &mut Vec<(Symbol, usize)>) -> Vec<AxisIndex> {
    dims.iter()
        .map(|&d| {
            if d == 1 {
                AxisIndex::Fixed(0)
            } else {
                let s = Symbol::fresh();
                product.push((s, d));
                AxisIndex::Iterator(s)
            }
        })
        .collect()
}

/// Checks the tensors of a gather (`table` is `[N] ++ R`, `rows` is `D ++ R`, `index` is
/// `D`, integer) or of a scatter-add (`table` written, `rows` read).
fn check_gather(
    statement: &'static str,
    target: &Tnode,
    table: &Tnode,
    rows: &Tnode,
    index: &Tnode,
) -> Result<()> {
    if !index.prec().is_integer() {
        return Err(Error::IndexPrecision {
            statement,
            target: target.name(),
            index: index.name(),
            prec: index.prec().name().to_string(),
        });
    }
    let shape = |msg: String| Error::GatherShape {
        statement,
        target: target.name(),
        msg,
    };
    let (td, rd, id) = (table.dims(), rows.dims(), index.dims());
    if td.is_empty() {
        return Err(shape(format!(
            "table {} has no axes (it needs dims [N, ...])",
            table.name()
        )));
    }
    let want: Vec<usize> = id.iter().chain(&td[1..]).copied().collect();
    if rd != want.as_slice() {
        return Err(shape(format!(
            "{} has dims {rd:?}, but index {} (dims {id:?}) followed by the row dims {:?} of \
             table {} (dims {td:?}) give {want:?}",
            rows.name(),
            index.name(),
            &td[1..],
            table.name()
        )));
    }
    if target == index || table == rows {
        return Err(shape(format!(
            "{} is written and read by the same statement",
            target.name()
        )));
    }
    Ok(())
}

/// The loops of a gather or scatter-add over the index cells `d` of `index`: for each, the
/// index is read once as an exact integer ([`Llc::Lookup`]) and, when it is inside
/// `0 .. extent-1`, `row` runs over the row axes `r` (dims `row_dims`), given the indices of
/// `(d, r)` and of `(index[d], r)`. `None` when the table has no rows.
fn lookup_rows(
    index: &Tnode,
    row_dims: &[usize],
    extent: usize,
    row: impl FnOnce(Vec<AxisIndex>, Vec<AxisIndex>) -> Llc,
) -> Option<Llc> {
    if extent == 0 {
        return None;
    }
    let mut outer = vec![];
    let d = axis_indices(index.dims(), &mut outer);
    let mut inner = vec![];
    let r = axis_indices(row_dims, &mut inner);
    let n = Symbol::fresh();
    let flat: Vec<AxisIndex> = d.iter().chain(&r).copied().collect();
    let looked_up: Vec<AxisIndex> = std::iter::once(AxisIndex::Iterator(n))
        .chain(r.iter().copied())
        .collect();
    let body = loops(&inner, row(flat, looked_up));
    Some(loops(
        &outer,
        Llc::Lookup {
            symbol: n,
            tn: index.clone(),
            idcs: d,
            extent,
            body: Box::new(body),
        },
    ))
}

/// `lhs[d, r] = table[index[d], r]`: `lhs` is zeroed, then for every `d` the index is read
/// once as an exact integer ([`Llc::Lookup`]) and, when it is inside `0 .. N-1`, row
/// `index[d]` of the table is copied (converted like an assignment); other rows stay zero.
/// The work is `|D| · |R|`, whatever `N`; nothing outside the table is ever read.
fn lower_gather(lhs: &Tnode, table: &Tnode, index: &Tnode) -> Result<Llc> {
    check_gather("gather", lhs, table, lhs, index)?;
    let copy = lookup_rows(index, &table.dims()[1..], table.dims()[0], |out, row| {
        Llc::Set {
            tn: lhs.clone(),
            idcs: out,
            value: Llv::Get(table.clone(), row),
        }
    });
    Ok(Llc::Seq(
        std::iter::once(Llc::ZeroOut(lhs.clone()))
            .chain(copy)
            .collect(),
    ))
}

/// `lhs[index[d], r] += src[d, r]`: for every `d` in row-major order the index is read once
/// as an exact integer ([`Llc::Lookup`]) and, when it is inside `0 .. N-1`, row `d` of `src`
/// is added into row `index[d]` of `lhs` (converted like an assignment): repeated indices add
/// in the order of `d`, out-of-range ones add nothing. The work is `|D| · |R|`.
fn lower_scatter_add(lhs: &Tnode, src: &Tnode, index: &Tnode) -> Result<Llc> {
    check_gather("scatter_add", lhs, lhs, src, index)?;
    let add = lookup_rows(index, &lhs.dims()[1..], lhs.dims()[0], |from, cell| {
        Llc::Set {
            tn: lhs.clone(),
            idcs: cell.clone(),
            value: Llv::Binop(
                Binop::Add,
                Box::new(Llv::Get(lhs.clone(), cell)),
                Box::new(Llv::Get(src.clone(), from)),
            ),
        }
    });
    Ok(add.unwrap_or(Llc::Noop))
}

/// An exact 64-bit pattern as a value of the integer compute type: one constant when the
/// pattern, read as an int64, is a double; else its high and low 32 bits added (constants are
/// doubles; integer statements are not constant-folded, see `optimize::simplify`).
fn exact_int(bits: u64) -> Llv {
    let v = bits as i64;
    if v as f64 as i128 == i128::from(v) {
        return Llv::Constant(v as f64);
    }
    let hi = (bits & !0xffff_ffff) as i64 as f64;
    let lo = (bits & 0xffff_ffff) as f64;
    Llv::Binop(
        Binop::Add,
        Box::new(Llv::Constant(hi)),
        Box::new(Llv::Constant(lo)),
    )
}

fn fill_constant(array: &Tnode, value: Llv) -> Llc {
    if matches!(value, Llv::Constant(c) if c == 0.0 && c.is_sign_positive()) {
        return Llc::ZeroOut(array.clone());
    }
    over_all_cells(array, |idcs| Llc::Set {
        tn: array.clone(),
        idcs,
        value: value.clone(),
    })
}

fn lower_fetch(array: &Tnode, fetch_op: &FetchOp) -> Result<Llc> {
    let prec = array.prec();
    Ok(match fetch_op {
        FetchOp::Constant(c) if *c == 0.0 && c.is_sign_positive() => Llc::ZeroOut(array.clone()),
        // Narrow floats: rounded once from the constant, not through the float compute type.
        FetchOp::Constant(c) if matches!(prec, Prec::Half | Prec::Bfloat16 | Prec::Fp8) => {
            fill_constant(array, Llv::Constant(prec.round(*c)))
        }
        FetchOp::Constant(c) => fill_constant(array, Llv::Constant(*c)),
        FetchOp::ConstantInt(c) if prec.is_integer() => {
            fill_constant(array, exact_int(prec.wrap_int(*c as u64) as u64))
        }
        FetchOp::ConstantInt(c) => {
            // (Exact in f64 up to 2^53; beyond, rounded to double first.)
            let x = *c as f64;
            let x = match prec {
                Prec::Single => x as f32 as f64,
                Prec::Double => x,
                p => p.round(x),
            };
            fill_constant(array, Llv::Constant(x))
        }
        FetchOp::Slice { batch_idx, sliced } => {
            if sliced.dims().len() != array.dims().len() + 1 || sliced.dims()[1..] != *array.dims()
            {
                return Err(Error::Assignment(format!(
                    "slice of {} (dims {:?}) into {} (dims {:?}): the sliced tensor's dims must be [n] followed by the result's dims",
                    sliced.name(),
                    sliced.dims(),
                    array.name(),
                    array.dims()
                )));
            }
            if let Some(r) = batch_idx.range {
                if r > sliced.dims()[0] {
                    return Err(Error::Assignment(format!(
                        "slice of {} by static index {}: its range 0..{r} exceeds axis 0 of extent {}",
                        sliced.name(),
                        batch_idx.name,
                        sliced.dims()[0]
                    )));
                }
            }
            over_all_cells(array, |idcs| {
                let mut src = vec![AxisIndex::Iterator(batch_idx.symbol)];
                src.extend(idcs.iter().copied());
                Llc::Set {
                    tn: array.clone(),
                    idcs,
                    value: Llv::Get(sliced.clone(), src),
                }
            })
        }
        FetchOp::Random { seed } => over_all_cells(array, |idcs| Llc::Set {
            tn: array.clone(),
            idcs: idcs.clone(),
            value: Llv::Random {
                seed: *seed,
                idcs,
                dims: array.dims().to_vec(),
                prec: array.prec(),
            },
        }),
        FetchOp::EmbedSymbol(s) => over_all_cells(array, |idcs| Llc::Set {
            tn: array.clone(),
            idcs,
            value: Llv::EmbedIndex(AxisIndex::Iterator(s.symbol)),
        }),
        FetchOp::Imported(name) => {
            let valid = !name.is_empty()
                && name.len() <= 64
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit());
            if !valid {
                return Err(Error::Assignment(format!(
                    "imported C function name {:?} for {} is not a plain C identifier",
                    name,
                    array.name()
                )));
            }
            over_all_cells(array, |idcs| Llc::Set {
                tn: array.clone(),
                idcs,
                value: Llv::GetCFunction(name.clone()),
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::einsum::projections;
    use crate::ir::{Bindings, Prec};

    fn lowered(spec: &str, lhs: &[usize], rhs: &[&[usize]]) -> Llc {
        let y = Tnode::new(&["y"], lhs, Prec::Single).unwrap();
        let args: Vec<Tnode> = rhs
            .iter()
            .enumerate()
            .map(|(k, d)| Tnode::new(&[&format!("x{k}")], d, Prec::Single).unwrap())
            .collect();
        let p = projections(spec, lhs, rhs, &Bindings::empty()).unwrap();
        let a = Assignments::AccumBinop {
            initialize_neutral: true,
            accum: Binop::Add,
            op: Binop::Mul,
            lhs: y,
            rhs1: Buffer::Node(args[0].clone()),
            rhs2: Buffer::Node(args[1].clone()),
            projections: p,
        };
        lower(&a).unwrap()
    }

    /// The loops (index, from, to) and guards, outermost first, of the last statement.
    fn shape(c: &Llc) -> Vec<String> {
        let mut out = vec![];
        let last = c.clone().flatten().pop().unwrap();
        crate::loops::visit_llc(&last, &mut |c| match c {
            Llc::For { from, to, .. } => out.push(format!("for {from}..={to}")),
            Llc::If { guards, .. } => out.push(format!("if {}", guards.len())),
            _ => {}
        });
        out
    }

    #[test]
    fn one_iterator_guards_tighten_bounds() {
        // A single-letter entry (i-1) tightens i to 1..=2 (no `if`).
        let c = lowered("(i-1),i->i", &[3], &[&[8], &[3]]);
        assert_eq!(shape(&c), vec!["for 1..=2"]);
        // (2*i+1) below 4: i in 0..=1.
        let c = lowered("(2*i+1),i->i", &[3], &[&[4], &[3]]);
        assert_eq!(shape(&c), vec!["for 0..=1"]);
        // No point at all: nothing but the fill.
        let c = lowered("(i+5),i->i", &[3], &[&[4], &[3]]);
        assert_eq!(shape(&c), Vec::<String>::new());
    }

    #[test]
    fn several_iterator_guards_sit_inside_their_innermost_loop() {
        let c = lowered(
            "b(2*h+i-1)(2*w+j-1)c,ijcd->bhwd",
            &[1, 4, 4, 2],
            &[&[1, 8, 8, 3], &[3, 3, 3, 2]],
        );
        // h, w, d, then i (guard on h, i), then j (guard on w, j), then c guard-free.
        assert_eq!(
            shape(&c),
            vec![
                "for 0..=3",
                "for 0..=3",
                "for 0..=1",
                "for 0..=2",
                "if 1",
                "for 0..=2",
                "if 1",
                "for 0..=2"
            ]
        );
        // A valid convolution needs no guard at all.
        let c = lowered("(o+k),k->o", &[30], &[&[32], &[3]]);
        assert_eq!(shape(&c), vec!["for 0..=29", "for 0..=2"]);
    }
}
