//! Contractions as GEMM kernels: packed operand panels and register-blocked vector tiles.
//!
//! A *contraction* is a perfect loop nest around one accumulation
//! `c[pc] = c[pc] + x * y` whose iterators split into
//! - a reduced iterator `k` (read by `x` and `y`, not indexing `c`),
//! - a row iterator `m` (indexing `c` and `x`, not `y`),
//! - a column iterator `n` (indexing `c` and `y`, not `x`) along which `c` is contiguous,
//! - and any others (batch axes, further reductions), which stay loops around the kernel.
//!
//! Matrix products with transposed operands, batched products and einsums that reduce to
//! these qualify (`x` and `y` may be any scalar expressions; the operands are swapped when the
//! contiguous axis of `c` is the row iterator). The nest becomes, per iteration of the outer
//! loops:
//!
//! 1. **Packing.** `y` is evaluated into `bp[jr, k, c] = y(k, n = jr*NR + c)` and `x` into
//!    `ap[ir, k, r] = x(m = ir*MR + r, k)`: panels of `NR` columns and `MR` rows, each
//!    contiguous along `k`, zero-padded to whole panels and to a whole number of `KC` blocks
//!    (the buffers are routine-owned scratch, zeroed before the call, and the padding is never
//!    written). Values are converted to the result's compute type while packing.
//! 2. **Register tiles.** For every `KC` block and every `MR × NR` tile, `MR · NR / W` vector
//!    variables (`W` lanes each) start at 0 and accumulate `a[r] * b[v]` for every `k` of the
//!    block: one broadcast of `ap` and `NR / W` loads of `bp` per row and step, with fused
//!    multiply-adds. Then the tile is added to `c` (`c += acc`): whole vectors where the tile
//!    lies inside `c`, and through a small tile buffer for the right edge.
//!
//! The blocking comes from the target: `W` from the vector width, `MR` from the register
//! count (`MR · NR/W + NR/W + 1` registers), `KC` so that a `KC × NR` panel of `bp` fills
//! about two thirds of the L1 cache, and the row blocks (`MC`) so that the packed rows of one
//! block fill about half the L2.
//!
//! The sum over `k` is reassociated (each `KC` block is summed in a register, then added to
//! `c`), as every BLAS does; results change only in the last bits. Only single- and
//! double-precision results are rewritten: half and byte results round at every step, which a
//! blocked sum would not preserve.

use crate::ir::tnode::provenance;
use crate::ir::{AxisIndex, Binop, MemoryMode, Prec, Symbol, Tnode};
use crate::loops::{
    map_value_indices, visit_value, visit_value_indices, Llc, Llv, VReg, VType, Vlv,
};
use crate::target::VectorTarget;
use std::sync::atomic::{AtomicU32, Ordering};

/// The smallest contraction (in multiply-adds) worth packing for.
const MIN_WORK: usize = 32 * 32 * 32;

static NEXT_VREG: AtomicU32 = AtomicU32::new(1);

struct Loop {
    index: Symbol,
    from: i64,
    to: i64,
    trace_it: bool,
}

/// What a contraction nest computes.
struct Contraction {
    /// The loops that stay around the kernel, outermost first.
    outer: Vec<Loop>,
    /// The result and its indices.
    c: Tnode,
    pc: Vec<AxisIndex>,
    /// The row-operand and column-operand expressions (after any swap).
    x: Llv,
    y: Llv,
    /// The row, column and reduction iterators and their extents.
    m: (Symbol, usize),
    n: (Symbol, usize),
    k: (Symbol, usize),
}

/// A contraction rewritten as a GEMM kernel.
pub struct Kernel {
    /// The kernel's code.
    pub code: Llc,
    /// The local arrays it introduced (packed panels, tile buffer).
    pub locals: Vec<Tnode>,
    /// Those of them whose every element is written before it is read in each call (so they
    /// need no zeroing).
    pub written_first: Vec<Tnode>,
    /// Whether the zero fill of the result just before the nest was folded into the kernel
    /// (then the caller drops it).
    pub folded_zero_fill: bool,
}

/// Rewrites a contraction nest as a GEMM kernel; gives the nest back unchanged if it is not
/// one (or too small to be worth it). `zero_filled` is the node a `zero_out` just before the
/// nest filled, if any: when it is the result and the kernel writes all of it, the fill is
/// folded into the kernel's first reduction block.
pub fn rewrite(
    nest: Llc,
    target: &VectorTarget,
    zero_filled: Option<&Tnode>,
) -> Result<Kernel, Llc> {
    let Some(con) = match_contraction(&nest) else {
        return Err(nest);
    };
    let prec = con.c.prec();
    let w = target.lanes(prec);
    let (m, n, k) = (con.m.1, con.n.1, con.k.1);
    if w < 2 || n < w || m < 2 || k < 4 || m.saturating_mul(n).saturating_mul(k) < MIN_WORK {
        return Err(nest);
    }
    let fold = zero_filled == Some(&con.c) && writes_every_cell(&con);
    let (mut locals, mut written_first) = (vec![], vec![]);
    match build(&con, target, &mut locals, &mut written_first, fold) {
        Some(code) => Ok(Kernel {
            code,
            locals,
            written_first,
            folded_zero_fill: fold,
        }),
        None => Err(nest),
    }
}

/// Whether every cell of the result is written once per reduction block: each of its axes is
/// indexed by the row, column or an outer iterator ranging over the whole axis (or has extent
/// 1), and no outer loop is a reduction.
fn writes_every_cell(con: &Contraction) -> bool {
    let mut ranges: Vec<(Symbol, usize)> = vec![con.m, con.n];
    ranges.extend(
        con.outer
            .iter()
            .map(|l| (l.index, (l.to - l.from + 1) as usize)),
    );
    let outer_in_c = con
        .outer
        .iter()
        .all(|l| con.pc.iter().any(|ix| ix.coef(l.index) != 0));
    let mut seen = vec![];
    let axes_covered = con.pc.iter().zip(con.c.dims()).all(|(ix, &d)| match ix {
        AxisIndex::Fixed(0) => d == 1,
        AxisIndex::Iterator(s) => {
            !seen.contains(s)
                && ranges.iter().any(|&(r, e)| r == *s && e == d)
                && con.outer.iter().all(|l| l.index != *s || l.from == 0)
                && {
                    seen.push(*s);
                    true
                }
        }
        _ => false,
    });
    outer_in_c && axes_covered
}

fn perfect_nest(c: &Llc) -> (Vec<Loop>, &Llc) {
    let mut loops = vec![];
    let mut c = c;
    while let Llc::For {
        index,
        from,
        to,
        body,
        trace_it,
    } = c
    {
        loops.push(Loop {
            index: *index,
            from: *from,
            to: *to,
            trace_it: *trace_it,
        });
        c = body;
    }
    (loops, c)
}

/// Whether a value mentions `s` in any index.
fn mentions(v: &Llv, s: Symbol) -> bool {
    let mut hit = false;
    visit_value_indices(v, &mut |ix| hit |= ix.coef(s) != 0);
    hit
}

/// The stride in elements with which `idcs` moves in `tn` when `s` grows by one.
fn stride(tn: &Tnode, idcs: &[AxisIndex], s: Symbol) -> usize {
    let dims = tn.dims();
    idcs.iter()
        .enumerate()
        .map(|(k, ix)| ix.coef(s) * dims[k + 1..].iter().product::<usize>())
        .sum()
}

fn match_contraction(nest: &Llc) -> Option<Contraction> {
    let (loops, body) = perfect_nest(nest);
    let Llc::Set {
        tn: c,
        idcs: pc,
        value,
    } = body
    else {
        return None;
    };
    if !matches!(c.prec(), Prec::Single | Prec::Double) || loops.len() < 3 {
        return None;
    }
    let Llv::Binop(Binop::Add, own, prod) = value else {
        return None;
    };
    if !matches!(&**own, Llv::Get(t, i) if t == c && i == pc) {
        return None;
    }
    let Llv::Binop(Binop::Mul, x, y) = &**prod else {
        return None;
    };
    // The result must not be read by the operands (no in-place products here).
    let reads_c = |v: &Llv| {
        let mut hit = false;
        visit_value(v, &mut |v| {
            if let Llv::Get(t, _) | Llv::GetMergeBuffer(t, _) = v {
                hit |= t == c;
            }
            if let Llv::LocalScope { .. } | Llv::GetLocal(_) = v {
                // Inlined computations are fine to pack, but keep the first version simple.
                hit = true;
            }
        });
        hit
    };
    if reads_c(x) || reads_c(y) {
        return None;
    }
    if loops.iter().any(|l| l.from != 0 || l.to < 0) {
        return None;
    }
    let in_c = |s: Symbol| pc.iter().any(|ix| ix.coef(s) != 0);
    // Every index of the result must be an iterator, a fixed index or a static index: a
    // linear index could alias cells across iterations.
    if pc.iter().any(|ix| matches!(ix, AxisIndex::Linear(_))) {
        return None;
    }
    let extent = |l: &Loop| (l.to - l.from + 1) as usize;
    // The column iterator: the one along which the result is contiguous.
    let (col, _) = loops
        .iter()
        .map(|l| (l, stride(c, pc, l.index)))
        .find(|(_, st)| *st == 1)?;
    let (cx, cy) = (mentions(x, col.index), mentions(y, col.index));
    let (x, y) = match (cx, cy) {
        (false, true) => (x, y),
        (true, false) => (y, x),
        _ => return None,
    };
    let mut best_m: Option<&Loop> = None;
    let mut best_k: Option<&Loop> = None;
    for l in &loops {
        let s = l.index;
        let (ic, ix, iy) = (in_c(s), mentions(x, s), mentions(y, s));
        // The result's index of each iterator must be a plain iterator on a single axis.
        if ic && pc.iter().filter(|i| i.coef(s) != 0).count() != 1 {
            return None;
        }
        if s == col.index {
            continue;
        }
        if ic && ix && !iy && best_m.is_none_or(|b| extent(l) > extent(b)) {
            best_m = Some(l);
        }
        if !ic && ix && iy && best_k.is_none_or(|b| extent(l) > extent(b)) {
            best_k = Some(l);
        }
    }
    let (mr, kr) = (best_m?, best_k?);
    let outer = loops
        .iter()
        .filter(|l| ![mr.index, col.index, kr.index].contains(&l.index))
        .map(|l| Loop {
            index: l.index,
            from: l.from,
            to: l.to,
            trace_it: l.trace_it,
        })
        .collect();
    Some(Contraction {
        outer,
        c: c.clone(),
        pc: pc.clone(),
        x: (**x).clone(),
        y: (**y).clone(),
        m: (mr.index, extent(mr)),
        n: (col.index, extent(col)),
        k: (kr.index, extent(kr)),
    })
}

/// `Σ coef·symbol + offset` as an index.
fn lin(terms: &[(Symbol, usize)], offset: usize) -> Option<AxisIndex> {
    AxisIndex::linear(terms, offset)
}

/// Substitutes iterators in a value.
fn subst(v: &Llv, subs: &[(Symbol, AxisIndex)]) -> Option<Llv> {
    map_value_indices(v, &mut |mut ix| {
        for &(s, by) in subs {
            ix = ix.substitute(s, by)?;
        }
        Some(ix)
    })
}

fn subst_idcs(idcs: &[AxisIndex], subs: &[(Symbol, AxisIndex)]) -> Option<Vec<AxisIndex>> {
    idcs.iter()
        .map(|&ix| {
            let mut ix = ix;
            for &(s, by) in subs {
                ix = ix.substitute(s, by)?;
            }
            Some(ix)
        })
        .collect()
}

fn local(label: &[&str], dims: &[usize], prec: Prec, locals: &mut Vec<Tnode>) -> Option<Tnode> {
    // Packed buffers are scratch memory: their size was checked through the operands'.
    let t = Tnode::builder(label, dims, prec)
        .memory_with_provenance(MemoryMode::Local, provenance::KERNEL)
        .build()
        .ok()?;
    locals.push(t.clone());
    Some(t)
}

fn vreg(ty: VType) -> VReg {
    VReg {
        id: NEXT_VREG.fetch_add(1, Ordering::Relaxed),
        ty,
    }
}

/// The blocking of one contraction.
struct Blocking {
    ty: VType,
    /// Vectors per tile row, and columns per tile (`nv · lanes`).
    nv: usize,
    nr: usize,
    mr: usize,
    kc: usize,
    /// Number of `kc` blocks (the packed reduction extent is `nk · kc`).
    nk: usize,
    /// Column panels per column block (the block of `bp` that stays in L2).
    ncp: usize,
}

fn blocking(con: &Contraction, target: &VectorTarget) -> Blocking {
    let prec = con.c.prec();
    let w = target.lanes(prec);
    let esize = prec.size_in_bytes();
    let nv = if con.n.1 <= w { 1 } else { 2 };
    let nr = nv * w;
    let mr = ((target.registers.saturating_sub(nv + 1)) / nv).clamp(1, 14);
    let kc_max = ((target.l1d_bytes * 2 / 3) / (nr * esize)).clamp(16, 512);
    let nk = con.k.1.div_ceil(kc_max);
    let kc = con.k.1.div_ceil(nk);
    let ncp = ((target.l2_bytes / 2) / (nr * kc * esize)).max(1);
    Blocking {
        ty: VType { prec, lanes: w },
        nv,
        nr,
        mr,
        kc,
        nk,
        ncp,
    }
}

/// How a tile's result reaches `c`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `c += acc`.
    Accumulate,
    /// `c = acc + 0` (the first reduction block, when the zero fill of `c` before the nest is
    /// folded into the kernel; adding +0 turns a -0 sum into +0, as `0 + sum` would).
    Store,
}

/// The packed buffers and tile buffer of one kernel.
struct Buffers {
    ap: Tnode,
    bp: Tnode,
    tile: Tnode,
}

/// Builds the kernel for a matched contraction. With `zero_fill_folded`, `c` was not zeroed
/// before: the first reduction block stores instead of accumulating.
fn build(
    con: &Contraction,
    target: &VectorTarget,
    locals: &mut Vec<Tnode>,
    written_first: &mut Vec<Tnode>,
    zero_fill_folded: bool,
) -> Option<Llc> {
    let b = blocking(con, target);
    let prec = con.c.prec();
    let (m, n, k) = (con.m.1, con.n.1, con.k.1);
    let mp = m.div_ceil(b.mr);
    let np = n.div_ceil(b.nr);
    let kp = b.nk * b.kc;
    let label = con.c.label().join("_");
    let bufs = Buffers {
        ap: local(&[&label, "packed_a"], &[mp, kp, b.mr], prec, locals)?,
        bp: local(&[&label, "packed_b"], &[np, kp, b.nr], prec, locals)?,
        tile: local(&[&label, "tile"], &[b.mr, b.nr], prec, locals)?,
    };
    // Every element of these is written before it is read in each call: no zeroing needed.
    written_first.extend([bufs.ap.clone(), bufs.bp.clone(), bufs.tile.clone()]);
    let mut stmts = vec![
        Llc::Comment(format!(
            "GEMM kernel for {}: {m}x{n}x{k}, tile {}x{} ({} lanes), kc {}, column blocks of {} panels",
            con.c.name(),
            b.mr,
            b.nr,
            b.ty.lanes,
            b.kc,
            b.ncp
        )),
        pack(&con.y, con.n, con.k, &bufs.bp, b.nr, n, k, kp)?,
        pack(&con.x, con.m, con.k, &bufs.ap, b.mr, m, k, kp)?,
    ];
    let kc = Symbol::fresh();
    if zero_fill_folded {
        // The first block stores; the others accumulate.
        stmts.push(substitute_block(
            tiles(con, &b, &bufs, kc, Mode::Store)?,
            kc,
            0,
        )?);
        if b.nk > 1 {
            stmts.push(Llc::for_loop(
                kc,
                1,
                b.nk as i64 - 1,
                tiles(con, &b, &bufs, kc, Mode::Accumulate)?,
            ));
        }
    } else {
        stmts.push(Llc::for_loop(
            kc,
            0,
            b.nk as i64 - 1,
            tiles(con, &b, &bufs, kc, Mode::Accumulate)?,
        ));
    }
    let mut code = Llc::Seq(stmts);
    for l in con.outer.iter().rev() {
        code = Llc::For {
            index: l.index,
            from: l.from,
            to: l.to,
            body: Box::new(code),
            trace_it: l.trace_it,
        };
    }
    Some(code)
}

/// Fixes the block iterator `kc` to `value`.
fn substitute_block(code: Llc, kc: Symbol, value: usize) -> Option<Llc> {
    crate::loops::map_indices(&code, &mut |ix| ix.substitute(kc, AxisIndex::Fixed(value)))
}

/// Packs `v(p = panel*width + j, k)` into `dst[panel, k, j]`, and writes zeros into the
/// padding: the columns past `extent` of the last panel and the reduction steps past `k`.
#[allow(clippy::too_many_arguments)]
fn pack(
    v: &Llv,
    p: (Symbol, usize),
    kk: (Symbol, usize),
    dst: &Tnode,
    width: usize,
    extent: usize,
    k: usize,
    kp: usize,
) -> Option<Llc> {
    let (panel, j, kx) = (Symbol::fresh(), Symbol::fresh(), Symbol::fresh());
    let full = extent / width;
    let edge = extent % width;
    let panels = extent.div_ceil(width);
    let set = |panel_ix: AxisIndex, kx_ix: AxisIndex, value: Llv| Llc::Set {
        tn: dst.clone(),
        idcs: vec![panel_ix, kx_ix, AxisIndex::Iterator(j)],
        value,
    };
    // A source contiguous along k (a row of `a` in `a @ b`, a row of a transposed `b`) is
    // read a cache line at a time: blocks of KB steps of k, every column of the panel, then
    // the steps of the block (reads contiguous, each line used whole); a source contiguous
    // along the panel is copied row by row (reads and writes contiguous).
    const KB: usize = 16;
    let mut along_k = false;
    let mut along_p = false;
    visit_value(v, &mut |x| {
        if let Llv::Get(t, idcs) = x {
            along_k |= stride(t, idcs, kk.0) == 1;
            along_p |= stride(t, idcs, p.0) == 1;
        }
    });
    let blocked = along_k && !along_p && k >= KB;
    let data = |panel_ix: AxisIndex, cols: usize| -> Option<Llc> {
        let pos = match panel_ix {
            AxisIndex::Iterator(s) => lin(&[(s, width), (j, 1)], 0)?,
            AxisIndex::Fixed(f) => lin(&[(j, 1)], f * width)?,
            AxisIndex::Linear(_) => return None,
        };
        let at = |kx_ix: AxisIndex| -> Option<Llc> {
            Some(set(
                panel_ix,
                kx_ix,
                subst(v, &[(p.0, pos), (kk.0, kx_ix)])?,
            ))
        };
        if !blocked {
            return Some(Llc::for_loop(
                kx,
                0,
                k as i64 - 1,
                Llc::for_loop(j, 0, cols as i64 - 1, at(AxisIndex::Iterator(kx))?),
            ));
        }
        let (kb, full_kb, rest) = (Symbol::fresh(), k / KB, k % KB);
        let mut out = vec![Llc::for_loop(
            kb,
            0,
            full_kb as i64 - 1,
            Llc::for_loop(
                j,
                0,
                cols as i64 - 1,
                Llc::for_loop(kx, 0, KB as i64 - 1, at(lin(&[(kb, KB), (kx, 1)], 0)?)?),
            ),
        )];
        if rest > 0 {
            out.push(Llc::for_loop(
                j,
                0,
                cols as i64 - 1,
                Llc::for_loop(kx, 0, rest as i64 - 1, at(lin(&[(kx, 1)], full_kb * KB)?)?),
            ));
        }
        Some(Llc::Seq(out))
    };
    let mut out = vec![];
    if full > 0 {
        out.push(Llc::for_loop(
            panel,
            0,
            full as i64 - 1,
            data(AxisIndex::Iterator(panel), width)?,
        ));
    }
    if edge > 0 {
        out.push(data(AxisIndex::Fixed(full), edge)?);
        out.push(Llc::for_loop(
            kx,
            0,
            k as i64 - 1,
            Llc::for_loop(
                j,
                edge as i64,
                width as i64 - 1,
                set(
                    AxisIndex::Fixed(full),
                    AxisIndex::Iterator(kx),
                    Llv::Constant(0.0),
                ),
            ),
        ));
    }
    if kp > k {
        out.push(Llc::for_loop(
            panel,
            0,
            panels as i64 - 1,
            Llc::for_loop(
                kx,
                k as i64,
                kp as i64 - 1,
                Llc::for_loop(
                    j,
                    0,
                    width as i64 - 1,
                    set(
                        AxisIndex::Iterator(panel),
                        AxisIndex::Iterator(kx),
                        Llv::Constant(0.0),
                    ),
                ),
            ),
        ));
    }
    Some(Llc::Seq(out))
}

/// Which column panels a run of tiles covers.
#[derive(Clone, Copy)]
enum Cols {
    /// Column block `jc` (a loop iterator): panels `jc*ncp .. jc*ncp + ncp`, all full.
    Block { jc: Symbol },
    /// Panels `start .. full_end` (full), then one edge panel of `edge_cols` columns if
    /// nonzero.
    Rest {
        start: usize,
        full_end: usize,
        edge_cols: usize,
    },
}

/// All tiles of one reduction block: column blocks (so that the block of `bp` stays in L2),
/// within them every row panel (its panel of `ap` stays in L1), within that the column panels.
fn tiles(con: &Contraction, b: &Blocking, bufs: &Buffers, kc: Symbol, mode: Mode) -> Option<Llc> {
    let n = con.n.1;
    let full = n / b.nr;
    let edge_cols = n % b.nr;
    let np = n.div_ceil(b.nr);
    let (blocks, rest) = if np > b.ncp {
        (full / b.ncp, (full / b.ncp) * b.ncp)
    } else {
        (0, 0)
    };
    let mut out = vec![];
    if blocks > 0 {
        let jc = Symbol::fresh();
        let body = row_panels(con, b, bufs, kc, mode, Cols::Block { jc })?;
        out.push(Llc::for_loop(jc, 0, blocks as i64 - 1, body));
    }
    if rest < full || edge_cols > 0 {
        out.push(row_panels(
            con,
            b,
            bufs,
            kc,
            mode,
            Cols::Rest {
                start: rest,
                full_end: full,
                edge_cols,
            },
        )?);
    }
    Some(Llc::Seq(out))
}

/// Every row panel (full panels in a loop, then the bottom edge) over a run of column panels.
fn row_panels(
    con: &Contraction,
    b: &Blocking,
    bufs: &Buffers,
    kc: Symbol,
    mode: Mode,
    cols: Cols,
) -> Option<Llc> {
    let m = con.m.1;
    let full = m / b.mr;
    let edge_rows = m % b.mr;
    let mut out = vec![];
    if full > 0 {
        let ir = Symbol::fresh();
        let body = col_panels(con, b, bufs, kc, mode, cols, AxisIndex::Iterator(ir), b.mr)?;
        out.push(Llc::for_loop(ir, 0, full as i64 - 1, body));
    }
    if edge_rows > 0 {
        out.push(col_panels(
            con,
            b,
            bufs,
            kc,
            mode,
            cols,
            AxisIndex::Fixed(full),
            edge_rows,
        )?);
    }
    Some(Llc::Seq(out))
}

/// The tiles of one row panel over a run of column panels.
#[allow(clippy::too_many_arguments)]
fn col_panels(
    con: &Contraction,
    b: &Blocking,
    bufs: &Buffers,
    kc: Symbol,
    mode: Mode,
    cols: Cols,
    panel: AxisIndex,
    rows: usize,
) -> Option<Llc> {
    let jj = Symbol::fresh();
    let mut out = vec![];
    match cols {
        Cols::Block { jc } => {
            let jr = lin(&[(jc, b.ncp), (jj, 1)], 0)?;
            let t = kernel(con, b, bufs, kc, mode, panel, jr, rows, b.nr)?;
            out.push(Llc::for_loop(jj, 0, b.ncp as i64 - 1, t));
        }
        Cols::Rest {
            start,
            full_end,
            edge_cols,
        } => {
            if full_end > start {
                let jr = lin(&[(jj, 1)], start)?;
                let t = kernel(con, b, bufs, kc, mode, panel, jr, rows, b.nr)?;
                out.push(Llc::for_loop(jj, 0, (full_end - start) as i64 - 1, t));
            }
            if edge_cols > 0 {
                out.push(kernel(
                    con,
                    b,
                    bufs,
                    kc,
                    mode,
                    panel,
                    AxisIndex::Fixed(full_end),
                    rows,
                    edge_cols,
                )?);
            }
        }
    }
    Some(Llc::Seq(out))
}

/// `ix * scale + Σ terms + offset` as an index.
fn scaled(
    ix: AxisIndex,
    scale: usize,
    terms: &[(Symbol, usize)],
    offset: usize,
) -> Option<AxisIndex> {
    let (mut all, base): (Vec<(Symbol, usize)>, usize) = match ix {
        AxisIndex::Fixed(f) => (vec![], f * scale),
        AxisIndex::Iterator(s) => (vec![(s, scale)], 0),
        AxisIndex::Linear(l) => (
            l.terms().iter().map(|&(s, c)| (s, c * scale)).collect(),
            l.offset * scale,
        ),
    };
    all.extend_from_slice(terms);
    lin(&all, base + offset)
}

/// Multiplies `panel` of `ap` by panel `jr` of `bp` for one reduction block into vector
/// accumulators, then adds (or stores) the `rows × cols` valid part to the result.
#[allow(clippy::too_many_arguments)]
fn kernel(
    con: &Contraction,
    b: &Blocking,
    bufs: &Buffers,
    kc: Symbol,
    mode: Mode,
    panel: AxisIndex,
    jr: AxisIndex,
    rows: usize,
    cols: usize,
) -> Option<Llc> {
    let ty = b.ty;
    let w = ty.lanes;
    let kx = Symbol::fresh();
    let kpos = lin(&[(kc, b.kc), (kx, 1)], 0)?;
    let acc: Vec<Vec<VReg>> = (0..rows)
        .map(|_| (0..b.nv).map(|_| vreg(ty)).collect())
        .collect();
    let bv: Vec<VReg> = (0..b.nv).map(|_| vreg(ty)).collect();
    let a = vreg(ty);
    let mut stmts: Vec<Llc> = acc
        .iter()
        .flatten()
        .map(|&r| Llc::VSet(r, Vlv::Zero(ty)))
        .collect();
    let mut step = vec![];
    for (v, &r) in bv.iter().enumerate() {
        step.push(Llc::VSet(
            r,
            Vlv::Load(ty, bufs.bp.clone(), vec![jr, kpos, AxisIndex::Fixed(v * w)]),
        ));
    }
    for (row, accs) in acc.iter().enumerate() {
        step.push(Llc::VSet(
            a,
            Vlv::Splat(
                ty,
                Box::new(Llv::Get(
                    bufs.ap.clone(),
                    vec![panel, kpos, AxisIndex::Fixed(row)],
                )),
            ),
        ));
        for (v, &r) in accs.iter().enumerate() {
            step.push(Llc::VSet(
                r,
                Vlv::Fma(
                    Box::new(Vlv::Reg(a)),
                    Box::new(Vlv::Reg(bv[v])),
                    Box::new(Vlv::Reg(r)),
                ),
            ));
        }
    }
    stmts.push(Llc::for_loop(kx, 0, b.kc as i64 - 1, Llc::Seq(step)));
    // The result's cell of tile element (row, col): m = panel*mr + row, n = jr*nr + col.
    let cell =
        |row: AxisIndex, col: AxisIndex| subst_idcs(&con.pc, &[(con.m.0, row), (con.n.0, col)]);
    let combine = |old: Vlv, acc: Vlv| match mode {
        Mode::Accumulate => Vlv::Binop(Binop::Add, Box::new(old), Box::new(acc)),
        Mode::Store => Vlv::Binop(Binop::Add, Box::new(acc), Box::new(Vlv::Zero(ty))),
    };
    if cols == b.nr {
        for (row, accs) in acc.iter().enumerate() {
            for (v, &r) in accs.iter().enumerate() {
                let idcs = cell(
                    scaled(panel, b.mr, &[], row)?,
                    scaled(jr, b.nr, &[], v * w)?,
                )?;
                stmts.push(Llc::VStore {
                    tn: con.c.clone(),
                    idcs: idcs.clone(),
                    value: combine(Vlv::Load(ty, con.c.clone(), idcs), Vlv::Reg(r)),
                });
            }
        }
    } else {
        // The right edge: through the tile buffer, then element by element.
        for (row, accs) in acc.iter().enumerate() {
            for (v, &r) in accs.iter().enumerate() {
                stmts.push(Llc::VStore {
                    tn: bufs.tile.clone(),
                    idcs: vec![AxisIndex::Fixed(row), AxisIndex::Fixed(v * w)],
                    value: Vlv::Reg(r),
                });
            }
        }
        let (rr, cc) = (Symbol::fresh(), Symbol::fresh());
        let idcs = cell(
            scaled(panel, b.mr, &[(rr, 1)], 0)?,
            scaled(jr, b.nr, &[(cc, 1)], 0)?,
        )?;
        let t = Llv::Get(
            bufs.tile.clone(),
            vec![AxisIndex::Iterator(rr), AxisIndex::Iterator(cc)],
        );
        let value = match mode {
            Mode::Accumulate => Llv::Binop(
                Binop::Add,
                Box::new(Llv::Get(con.c.clone(), idcs.clone())),
                Box::new(t),
            ),
            Mode::Store => Llv::Binop(Binop::Add, Box::new(t), Box::new(Llv::Constant(0.0))),
        };
        stmts.push(Llc::for_loop(
            rr,
            0,
            rows as i64 - 1,
            Llc::for_loop(
                cc,
                0,
                cols as i64 - 1,
                Llc::Set {
                    tn: con.c.clone(),
                    idcs,
                    value,
                },
            ),
        ));
    }
    Some(Llc::Seq(stmts))
}
