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
//! loops, BLIS-style:
//!
//! - for every `KC` block of the reduction (the last one possibly shorter),
//!   - for every column block (`NCP` panels of `NR` columns; one block when all fit):
//!     1. **Packing `y`.** The block's panels are evaluated into `bp[jj, kx, c] =
//!        y(k = kb*KC + kx, n = (block start + jj)*NR + c)`: each panel contiguous along `k`,
//!        the columns past the right edge zero. Sized to stay in L2 while it is used. When
//!        `y` is a plain read contiguous along `k` (`a @ b.T`), whole panels are transposed
//!        `W × W` at a time in vector registers (loads along `k`, lane shuffles, stores
//!        along the columns) instead of element by element.
//!     2. for every row panel of `MR` rows (the last one possibly fewer):
//!        - **Packing `x`.** Its rows are evaluated into `ap` (`MR × KC`, stays in L1): each
//!          row contiguous along `k` (`ap[r, kx]`) when `x` is read along `k` (then packing
//!          is a copy), else each step's rows together (`ap[kx, r]`).
//!        - **Register tiles.** For every panel of `bp`, `MR · NR / W` vector variables (`W`
//!          lanes each) start at 0 and accumulate `a[r] * b[v]` for every step of the block:
//!          one broadcast of `ap` and `NR / W` loads of `bp` per row and step, with fused
//!          multiply-adds. Then the tile is added to `c` (`c += acc`): whole vectors where
//!          the tile lies inside `c`, and through a small tile buffer for the right edge.
//!
//! Packing just before use keeps the packed data hot (`bp` in L2, `ap` in L1) and the
//! packed buffers small. Values are converted to the result's compute type while packing;
//! the buffers are routine-owned scratch whose every element that is read was written
//! before in the same call.
//!
//! The blocking comes from the target: `W` from the vector width, `MR` from the register
//! count (`MR · NR/W + NR/W + 1` registers), `KC` so that a `KC × NR` panel of `bp` fills
//! about two thirds of the L1 cache (the blocks balanced over `k`), and `NCP` so that the
//! packed panels of one column block fill about half the L2, adjusted to the machine's cores
//! (the column blocks are what the threads share: see `column_block_panels`).
//!
//! **Convolutions** (affine reads, SPEC 9.3) qualify too: packing substitutes the iterators
//! into any index, so `x[b, h+i-1, v+j-1, c] * w[i, j, c, d]` is packed like a product with
//! rows `v`, columns `d` and reduction `c` (`b`, `h`, `i`, `j` are outer loops; any loop order
//! is legal for a `+=` of products). Its guards (points out of range are *skipped*, not read
//! as zero) are kept exact without packing a single skipped point:
//! - guards that mention neither the rows, the columns nor the reduction (`h+i-1`) go around
//!   the kernel, inside the outer loops;
//! - a guard mentioning the rows (`v+j-1`) may mention outer iterators only: those (`j`) are
//!   unrolled, one kernel per value (at most 32), each over exactly the rows
//!   where its guards hold (an affine guard holds on a contiguous range of rows). The kernels
//!   share the packed buffers;
//! - a guard mentioning the rows and the reduction (`o+k-1` of a 1-D convolution whose
//!   reduction is the window) may mention nothing else: the kernel runs over the *interior*
//!   rows, where the guard holds for every step of the reduction (so it needs no guard), and
//!   the rows before and after are left to the scalar passes as the guarded nest restricted to
//!   them ([`Kernel::rest`]);
//! - any other guard mentioning the columns or the reduction declines the rewrite.
//!
//! When the whole of `y` is packed at once (one reduction block, one run of panels), the outer
//! loops that do not move `y` (a convolution's output rows, a batch over `x` only) are moved
//! inside: `y` (one tap of the weights) is packed once and reused by all their iterations.
//! When it takes several blocks but each kernel has few rows (at most 96: the 7 columns of a
//! 7×7 convolution with 512 channels, whose weights of one tap fill 4 blocks), those loops go
//! inside every block instead, after its packing: each block is packed once per tap rather
//! than once per output row (1.6-1.9× on such convolutions). Their columns are then split
//! into one part per core, around everything else, so that the threads share columns rather
//! than those few rows ([`column_parts`]).
//!
//! So no skipped point's operand is ever multiplied, and a weight holding an infinity or a NaN
//! next to the padding gives exactly what the scalar nest gives (packing zeros for skipped
//! points would turn `0 · ∞` into NaN).
//!
//! For single and double results, operands of any float precision qualify (bfloat16 and fp8
//! are converted exactly while packing by the runtime's integer code, `aj_bf2f`, `aj_fp82f`;
//! half by `aj_h2f`), and bytes; wide integer operands are left to the scalar code there.
//!
//! The sum over `k` is reassociated (each `KC` block is summed in a register, then added to
//! `c`), as every BLAS does; results change only in the last bits. Of the floating results
//! only single and double precision are rewritten: half, bfloat16 and fp8 results round at
//! every step, which a blocked sum would not preserve.
//!
//! **Long reductions into small results** (64×64 from 4096 steps: few row panels to share
//! per reduction block) are split into equal groups of steps, counted from the shape alone
//! (see [`reduction_groups`]): each group runs the whole kernel into its own partial result,
//! the groups are what a device's threads share, and the partial results are added to `c` in
//! group order, so every thread count gives the same bits.
//!
//! **Integer results** are rewritten too, exactly. A statement whose result and arguments are
//! all integers computes modulo 2^64 and wraps into the result's width `W` after every step
//! (SPEC 9.1), so the result is `c0 + Σ x·y` modulo `2^W`, whatever the order of the sum:
//! modular arithmetic commutes with truncation. So for `W ≤ 16` (`byte`, `uint16`) the kernel
//! computes in `uint16` lanes (`vpmullw`: twice the lanes of `vpmulld`, and on AMD Zen 2 a
//! 1024³ product ran 3.9 times as fast as in `uint32` lanes), for `W = 32` in `uint32` lanes
//! (`vpmulld`), for `W = 64` in `uint64` lanes (`vpmullq` with AVX-512DQ; the compiler
//! emulates the product elsewhere, and the blocking keeps registers for it, see
//! [`VectorTarget::int64_mul`]), all wrapping, never undefined behaviour.
//!
//! Packing stores each operand into the lanes by the ordinary integer store (sign-extension
//! of `int32`/`int64`, zero-extension of the unsigned precisions, then wrapping), so `byte`,
//! `uint16`, `int32`, `uint32`, `int64` and `uint64` operands mix freely. The tile reaches `c`
//! by whole vectors (the lanes' bit patterns) when `c`'s elements have the lanes' width
//! (`uint16` in `uint16` lanes, `int32`/`uint32` in `uint32` lanes, `int64`/`uint64` in
//! `uint64` lanes), else (`byte` results, the right edge) through the tile buffer and a scalar
//! `c = c + tile`, which wraps into `c`'s width.
//!
//! Only pure integer statements qualify (an integer result with a floating argument computes
//! in `double` and truncates at every step: not associative), and only operands that are
//! polynomials (`+`, `-`, `*`) of integer reads, constants and index values (see
//! [`modular`]): their bits modulo the lanes' width do not depend on the statement's compute
//! type. As for floats, the statement must be `c = c + x * y` (accumulation `add`, operation
//! `mul`; `max` of products and the like stay scalar); the zero fill of an `init_neutral` add
//! (0 for integers too) may be folded into the first reduction block, which then stores the
//! tile (`acc + 0`, exact).

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
    /// The first row: the rows are `m_from .. m_from + m.1`.
    m_from: usize,
    /// The guards of affine indices (SPEC 9.3) the nest's points must pass; none of them
    /// mentions the column or the reduction iterator. In a specialized contraction (see
    /// [`specialize`]) none mentions the row iterator either: they go around the kernel.
    guards: Vec<(AxisIndex, usize)>,
    /// The outer loops whose iterators appear in a guard with the row iterator: they are
    /// unrolled into one specialized kernel per value, each over the rows where the guard holds.
    unroll: Vec<Loop>,
    /// The guards on the rows and the reduction (`o+k-1` of a 1-D convolution whose only
    /// reduction is the window): the kernel runs over the rows where they hold for every step
    /// of the reduction, the other rows are left to the scalar nest (see [`rewrite`]).
    split: Vec<(AxisIndex, usize)>,
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
    /// The parts of the nest left to the scalar passes, run after the kernel: the nest
    /// restricted to the rows the kernel does not cover (see [`Contraction::split`]).
    pub rest: Vec<Llc>,
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
    let Some(mut con) = match_contraction(&nest) else {
        return Err(nest);
    };
    // Guards on the rows and the reduction: the kernel takes the interior rows, where every
    // step of the reduction passes them, with no such guard (so no skipped point is packed);
    // the rows before and after stay the guarded scalar nest.
    let mut rest = vec![];
    if !con.split.is_empty() {
        let (m, m_from) = (con.m.0, con.m_from as i64);
        let m_to = m_from + con.m.1 as i64 - 1;
        let k = (con.k.0, 0, con.k.1 as i64 - 1);
        let Some((lo, hi)) = super::taps::interior_range(&con.split, m, m_from, m_to, &[k]) else {
            return Err(nest);
        };
        if lo > hi {
            return Err(nest);
        }
        if m_from < lo {
            rest.push(super::taps::restrict(&nest, m, m_from, lo - 1));
        }
        if hi < m_to {
            rest.push(super::taps::restrict(&nest, m, hi + 1, m_to));
        }
        con.m_from = lo as usize;
        con.m.1 = (hi - lo + 1) as usize;
        con.split.clear();
    }
    // Results narrower than a vector (8 or 12 columns of floats with AVX-512's 16 lanes) use
    // narrower vectors (2048×512 times 512×8 took 2.65 ms as a scalar nest, 7 times numpy's).
    let prec = con.c.prec();
    let target = &target.fitting(con.n.1, |t| kernel_type(prec, t).lanes);
    let w = kernel_type(con.c.prec(), target).lanes;
    let (m, n, k) = (con.m.1, con.n.1, con.k.1);
    if w < 2 || n < w || m < 2 || k < 4 || m.saturating_mul(n).saturating_mul(k) < MIN_WORK {
        return Err(nest);
    }
    let Some(specs) = specialize(&con) else {
        return Err(nest);
    };
    let fold = zero_filled == Some(&con.c)
        && con.guards.is_empty()
        && con.unroll.is_empty()
        && con.m_from == 0
        && writes_every_cell(&con);
    let (mut locals, mut written_first) = (vec![], vec![]);
    let code = match reduction_groups(&con, &specs) {
        Some(groups) => build_groups(&con, groups, target, &mut locals, &mut written_first, fold),
        None => build(&con, &specs, target, &mut locals, &mut written_first, fold),
    };
    match code {
        Some(code) => Ok(Kernel {
            code,
            locals,
            written_first,
            folded_zero_fill: fold,
            rest,
        }),
        None => Err(nest),
    }
}

/// The most cells of a result whose reduction may be split into groups (see
/// [`reduction_groups`]).
const GROUPS_MAX_CELLS: usize = 1 << 15;
/// The most groups, the fewest reduction steps in a group, and the fewest multiply-adds.
const GROUPS_MAX: usize = 16;
const GROUP_MIN_STEPS: usize = 256;
const GROUP_MIN_WORK: usize = 1 << 19;

/// For a contraction with a small result and a long reduction (64×64 from 4096 steps), the
/// number of equal groups of reduction steps to split it into, if it qualifies. Every
/// reduction block of the plain kernel would otherwise share only its few row panels among a
/// device's threads, once per block (26 regions of about 3 µs for 64×4096×64, and the helper
/// reading the panels of `y` the caller packed: 0.55 ms on two threads against 0.39 on one).
/// The groups are what the threads share instead, each packing its own operands.
///
/// The count depends on the shape alone (the most groups, at most [`GROUPS_MAX`], that divide
/// the reduction into parts of at least [`GROUP_MIN_STEPS`] steps and
/// [`GROUP_MIN_WORK`] multiply-adds), never on the number of threads, so every thread count
/// computes the same bits. Plain products only: no outer loops, guards or row offset.
fn reduction_groups(con: &Contraction, specs: &[Contraction]) -> Option<usize> {
    if !con.outer.is_empty()
        || !con.guards.is_empty()
        || !con.unroll.is_empty()
        || con.m_from != 0
        || specs.len() != 1
    {
        return None;
    }
    let cells = con.m.1.checked_mul(con.n.1)?;
    if cells > GROUPS_MAX_CELLS {
        return None;
    }
    let k = con.k.1;
    (2..=GROUPS_MAX).rev().find(|&g| {
        k.is_multiple_of(g) && k / g >= GROUP_MIN_STEPS && cells * (k / g) >= GROUP_MIN_WORK
    })
}

/// The kernel of `con` with its reduction split into `groups` equal groups of steps (see
/// [`reduction_groups`]): a loop over the groups, each running the whole kernel over its
/// steps into its own partial result `p[g, m, n]` (stored by its first block, so never
/// zeroed), then a loop adding the partial results to `c` in group order: `c = c + p[0] + p[1]
/// + …`, or `c = p[0] + p[1] + …` when the zero fill of `c` is folded.
fn build_groups(
    con: &Contraction,
    groups: usize,
    target: &VectorTarget,
    locals: &mut Vec<Tnode>,
    written_first: &mut Vec<Tnode>,
    zero_fill_folded: bool,
) -> Option<Llc> {
    let (m, n, k) = (con.m.1, con.n.1, con.k.1);
    let steps = k / groups;
    let label = con.c.label().join("_");
    let partial = local(&[&label, "partial"], &[groups, m, n], con.c.prec(), locals)?;
    written_first.push(partial.clone());
    let (g, kx) = (Symbol::fresh(), Symbol::fresh());
    // Step `g·steps + kx` of the reduction.
    let step = [(con.k.0, lin(&[(g, steps), (kx, 1)], 0)?)];
    let part = Contraction {
        outer: vec![],
        c: partial.clone(),
        pc: vec![
            AxisIndex::Iterator(g),
            AxisIndex::Iterator(con.m.0),
            AxisIndex::Iterator(con.n.0),
        ],
        x: subst(&con.x, &step)?,
        y: subst(&con.y, &step)?,
        m: con.m,
        n: con.n,
        k: (kx, steps),
        m_from: 0,
        guards: vec![],
        unroll: vec![],
        split: vec![],
    };
    let specs = specialize(&part)?;
    let kernel = build(&part, &specs, target, locals, written_first, true)?;
    // c[i, j] (+)= p[0, i, j]; then c[i, j] += p[h, i, j] for h = 1, 2, …, a row at a time.
    let (i, h) = (Symbol::fresh(), Symbol::fresh());
    let add_group = |group: AxisIndex, onto_c: bool| -> Option<Llc> {
        let j = Symbol::fresh();
        let cell = subst_idcs(
            &con.pc,
            &[
                (con.m.0, AxisIndex::Iterator(i)),
                (con.n.0, AxisIndex::Iterator(j)),
            ],
        )?;
        let p = Llv::Get(
            partial.clone(),
            vec![group, AxisIndex::Iterator(i), AxisIndex::Iterator(j)],
        );
        let value = if onto_c {
            Llv::Binop(
                Binop::Add,
                Box::new(Llv::Get(con.c.clone(), cell.clone())),
                Box::new(p),
            )
        } else {
            p
        };
        Some(Llc::for_loop(
            j,
            0,
            n as i64 - 1,
            Llc::Set {
                tn: con.c.clone(),
                idcs: cell,
                value,
            },
        ))
    };
    let combine = Llc::for_loop(
        i,
        0,
        m as i64 - 1,
        Llc::Seq(vec![
            add_group(AxisIndex::Fixed(0), !zero_fill_folded)?,
            Llc::for_loop(
                h,
                1,
                groups as i64 - 1,
                add_group(AxisIndex::Iterator(h), true)?,
            ),
        ]),
    );
    Some(Llc::Seq(vec![
        Llc::Comment(format!(
            "the reduction of {} split into {groups} groups of {steps} steps, each into its own partial result, added in group order",
            con.c.name()
        )),
        Llc::for_loop(g, 0, groups as i64 - 1, kernel),
        combine,
    ]))
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

/// Whether `v` is a polynomial (`+`, `-`, `*`) of integer reads, constants and index values.
/// In an integer statement its value modulo `2^b` (`b ≤ 64`) depends only on its operands
/// modulo `2^b`, whatever the statement's integer compute type (signed or unsigned, the
/// result's width): so packing it into `uint32` or `uint64` lanes (a statement of its own,
/// with another compute type) keeps exactly the bits the kernel needs. Operations whose value
/// depends on the signedness or on high bits (`div`, `max`, comparisons, shifts) do not
/// qualify.
fn modular(v: &Llv) -> bool {
    match v {
        Llv::Get(t, _) | Llv::GetMergeBuffer(t, _) => t.prec().is_integer(),
        Llv::Constant(_) | Llv::EmbedIndex(_) => true,
        Llv::Binop(Binop::Add | Binop::Sub | Binop::Mul, a, b) => modular(a) && modular(b),
        _ => false,
    }
}

/// The type of the kernel's vectors for a result of precision `prec`: the result's compute
/// type for single and double; for integers the narrowest unsigned lanes of 16, 32 or 64 bits
/// that hold the result's width, in which the sum of products wraps.
fn kernel_type(prec: Prec, target: &VectorTarget) -> VType {
    match prec.int_bits() {
        Some(b) if b <= 16 => VType {
            prec: Prec::Uint16,
            lanes: target.int_lanes(16),
        },
        Some(b) if b <= 32 => VType {
            prec: Prec::Uint32,
            lanes: target.int_lanes(32),
        },
        Some(_) => VType {
            prec: Prec::Uint64,
            lanes: target.int_lanes(64),
        },
        None => VType {
            prec,
            lanes: target.lanes(prec),
        },
    }
}

/// The loops of a nest (through guards), its guards and its innermost statement.
type Nest<'a> = (Vec<Loop>, Vec<(AxisIndex, usize)>, &'a Llc);

fn perfect_nest(c: &Llc) -> Nest<'_> {
    let (mut loops, mut guards) = (vec![], vec![]);
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
                    index: *index,
                    from: *from,
                    to: *to,
                    trace_it: *trace_it,
                });
                c = body;
            }
            // A guard depends only on loop iterators: holding it just inside the loop of its
            // innermost letter or around the statement is the same.
            Llc::If { guards: g, body } => {
                guards.extend(g.iter().copied());
                c = body;
            }
            _ => return (loops, guards, c),
        }
    }
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
    let (loops, guards, body) = perfect_nest(nest);
    let Llc::Set {
        tn: c,
        idcs: pc,
        value,
    } = body
    else {
        return None;
    };
    // Integer results (SPEC 9.1): only statements computing in integers (every argument an
    // integer) qualify; their sum is exact modular arithmetic (see the module documentation).
    let int = c.prec().is_integer();
    if int {
        if !crate::loops::statement_compute(c.prec(), value).is_integer() {
            return None;
        }
    } else if !matches!(c.prec(), Prec::Single | Prec::Double) {
        return None;
    }
    if loops.len() < 3 {
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
    // Operands of the wide integer precisions are left to the scalar code: the packing
    // converts bytes, halves, bfloat16, fp8, singles and doubles (the narrow floats exactly,
    // by the runtime's integer code, `aj_bf2f` and the like).
    let other_prec = |v: &Llv| {
        let mut hit = false;
        visit_value(v, &mut |v| {
            if let Llv::Get(t, _) | Llv::GetMergeBuffer(t, _) = v {
                hit |= !matches!(
                    t.prec(),
                    Prec::Byte
                        | Prec::Half
                        | Prec::Bfloat16
                        | Prec::Fp8
                        | Prec::Single
                        | Prec::Double
                );
            }
        });
        hit
    };
    if int {
        if !modular(x) || !modular(y) {
            return None;
        }
    } else if other_prec(x) || other_prec(y) {
        return None;
    }
    // Affine reads (convolutions, SPEC 9.3) are packed like any other: packing substitutes
    // the iterators into their indices. Their guards are handled below.
    if loops.iter().any(|l| l.to < l.from) {
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
        if ic && ix && !iy && best_m.is_none_or(|b| extent(l) >= extent(b)) {
            best_m = Some(l);
        }
        if !ic && ix && iy && best_k.is_none_or(|b| extent(l) > extent(b)) {
            best_k = Some(l);
        }
    }
    let (mr, kr) = (best_m?, best_k?);
    // The packed panels start at column and step 0.
    if col.from != 0 || kr.from != 0 {
        return None;
    }
    // Guards may not involve the columns or the reduction (a panel would mix skipped and
    // computed points); the outer iterators appearing in a guard with the rows are unrolled.
    let mut unrolled: Vec<Symbol> = vec![];
    let mut split = vec![];
    let mut kept = vec![];
    for &(ix, d) in &guards {
        if ix.coef(col.index) != 0 {
            return None;
        }
        if ix.coef(kr.index) != 0 {
            // The rows and the reduction only: the rows are split (see `rewrite`).
            if ix.coef(mr.index) == 0
                || ix.symbols().iter().any(|&s| s != mr.index && s != kr.index)
            {
                return None;
            }
            split.push((ix, d));
            continue;
        }
        kept.push((ix, d));
        if ix.coef(mr.index) != 0 {
            for s in ix.symbols() {
                if s != mr.index && !unrolled.contains(&s) {
                    unrolled.push(s);
                }
            }
        }
    }
    let copy = |l: &Loop| Loop {
        index: l.index,
        from: l.from,
        to: l.to,
        trace_it: l.trace_it,
    };
    let outer = loops
        .iter()
        .filter(|l| ![mr.index, col.index, kr.index].contains(&l.index))
        .filter(|l| !unrolled.contains(&l.index))
        .map(copy)
        .collect();
    let unroll: Vec<Loop> = loops
        .iter()
        .filter(|l| unrolled.contains(&l.index))
        .map(copy)
        .collect();
    // A guard's letters are all loop iterators of the nest.
    if unroll.len() != unrolled.len() {
        return None;
    }
    Some(Contraction {
        outer,
        c: c.clone(),
        pc: pc.clone(),
        x: (**x).clone(),
        y: (**y).clone(),
        m: (mr.index, extent(mr)),
        n: (col.index, extent(col)),
        k: (kr.index, extent(kr)),
        m_from: usize::try_from(mr.from).ok()?,
        guards: kept,
        unroll,
        split,
    })
}

/// The most specialized kernels one contraction unrolls into.
const MAX_SPECIALIZED: usize = 32;

/// Splits a contraction whose guards involve the rows into one contraction per value of the
/// unrolled outer iterators ([`Contraction::unroll`]), each over exactly the rows where its
/// guards hold (a contiguous range, the guards being affine in the row); those left without
/// rows are dropped. The other guards stay, with the unrolled values substituted (dropped
/// when they hold, the whole contraction dropped when one fails). `None` when there would be
/// more than [`MAX_SPECIALIZED`] of them.
fn specialize(con: &Contraction) -> Option<Vec<Contraction>> {
    let count = con.unroll.iter().try_fold(1usize, |acc, l| {
        acc.checked_mul(usize::try_from(l.to - l.from + 1).ok()?)
    })?;
    if count > MAX_SPECIALIZED {
        return None;
    }
    let mut out = vec![];
    for combo in 0..count {
        // The values of the unrolled iterators, the last one varying fastest.
        let mut rest = combo;
        let mut subs: Vec<(Symbol, AxisIndex)> = vec![];
        for l in con.unroll.iter().rev() {
            let e = (l.to - l.from + 1) as usize;
            let v = usize::try_from(l.from).ok()? + rest % e;
            rest /= e;
            subs.push((l.index, AxisIndex::Fixed(v)));
        }
        let m = con.m.0;
        let (mut lo, mut hi) = (con.m_from as i64, (con.m_from + con.m.1) as i64 - 1);
        let mut guards = vec![];
        let mut holds = true;
        for (ix, d) in &con.guards {
            let ix = subst_idcs(&[*ix], &subs)?[0];
            let d = i64::try_from(*d).ok()?;
            let (a, o) = match ix {
                AxisIndex::Fixed(f) => (0, i64::try_from(f).ok()?),
                AxisIndex::Iterator(_) => (ix.coef(m), 0),
                AxisIndex::Linear(l) => (l.coef(m), l.offset),
            };
            if a == 0 {
                if ix.symbols().is_empty() {
                    holds &= (0..d).contains(&o);
                } else {
                    guards.push((ix, d as usize));
                }
                continue;
            }
            // Only the row is left: 0 <= a·m + o <= d - 1.
            if ix.symbols().len() != 1 {
                return None;
            }
            let a = i64::try_from(a).ok()?;
            // m >= ceil(-o / a) = -floor(o / a).
            lo = lo.max(o.div_euclid(a).checked_neg()?);
            hi = hi.min((d - 1).checked_sub(o)?.div_euclid(a));
        }
        if !holds || lo > hi {
            continue;
        }
        out.push(Contraction {
            outer: vec![],
            c: con.c.clone(),
            pc: con.pc.clone(),
            x: subst(&con.x, &subs)?,
            y: subst(&con.y, &subs)?,
            m: (m, (hi - lo + 1) as usize),
            n: con.n,
            k: con.k,
            m_from: lo as usize,
            guards,
            unroll: vec![],
            split: vec![],
        });
    }
    Some(out)
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

/// A fresh vector variable (unique in the process, so in every C function).
pub(super) fn vreg(ty: VType) -> VReg {
    VReg {
        id: NEXT_VREG.fetch_add(1, Ordering::Relaxed),
        ty,
    }
}

/// The blocking of one contraction.
#[derive(Clone, Copy)]
struct Blocking {
    ty: VType,
    /// Vectors per tile row, and columns per tile (`nv · lanes`).
    nv: usize,
    nr: usize,
    mr: usize,
    /// Reduction steps per block.
    kc: usize,
    /// Column panels per column block (the block of `bp` that stays in L2).
    ncp: usize,
    /// Whether `ap` holds each row of the panel contiguous along `k` (`ap[r, kx]`, when `x`
    /// is read contiguously along `k`: packing is then a copy) rather than each step's rows
    /// together (`ap[kx, r]`).
    a_rows: bool,
    /// Whether the kernel multiplies bfloat16 pairs (`vdpbf16ps`, see [`Vlv::DotPairs`]):
    /// `ap` and `bp` then hold bfloat16 values, two consecutive steps side by side
    /// (`ap[kp, r, t]`, `bp[jj, kp, c, t]` for step `2kp + t`; a missing last step is 0).
    pairs: bool,
}

/// Whether every value of `v` is exactly a bfloat16 value: a read of a bfloat16 tensor, or
/// of an fp8 (E5M2) one, whose every value, subnormals included, is a normal bfloat16.
fn bf16_exact(v: &Llv) -> bool {
    matches!(v, Llv::Get(t, _) if matches!(t.prec(), Prec::Bfloat16 | Prec::Fp8))
}

fn blocking(con: &Contraction, target: &VectorTarget) -> Blocking {
    let prec = con.c.prec();
    let ty = kernel_type(prec, target);
    let w = ty.lanes;
    // bfloat16 pairs: single-precision results of bfloat16 (or fp8) operands, on 16 lanes.
    let pairs = target.bf16_dot
        && prec == Prec::Single
        && w == 16
        && bf16_exact(&con.x)
        && bf16_exact(&con.y);
    // The size of one packed element.
    let esize = if pairs { 2 } else { ty.prec.size_in_bytes() };
    let nv = if con.n.1 <= w { 1 } else { 2 };
    let nr = nv * w;
    // Registers besides the accumulators: the `nv` vectors of `bp` and the broadcast; an
    // emulated 64-bit product (no `vpmullq`: three `vpmuludq`, shifts and adds) also keeps
    // the high halves of those and three temporaries (with AVX2, a 4×8 tile made GCC 12
    // spill an accumulator; 3×8 does not, and ran 5% faster on a 1024³ int64 product).
    let reserved = if ty.prec == Prec::Uint64 && !target.int64_mul {
        2 * nv + 5
    } else {
        nv + 1
    };
    let mr = ((target.registers.saturating_sub(reserved)) / nv).clamp(1, 14);
    let kc_max = ((target.l1d_bytes * 2 / 3) / (nr * esize)).clamp(16, 512);
    // The fewest blocks of at most `kc_max`, or one more when that count divides `k` (2048 in
    // 8 blocks of 256, not 7 of 293): whole blocks only make one loop of them, with no
    // remainder block after it, and the parallel pass can then split the column blocks
    // inside every reduction block across a device's threads.
    let nk_min = con.k.1.div_ceil(kc_max);
    let nk = if !con.k.1.is_multiple_of(nk_min) && con.k.1.is_multiple_of(nk_min + 1) {
        nk_min + 1
    } else {
        nk_min
    };
    let mut kc = con.k.1.div_ceil(nk);
    // Whole pairs in every block but the last.
    if pairs && kc % 2 == 1 && kc < con.k.1 {
        kc += 1;
    }
    let panel_bytes = nr * kc * esize;
    let ncp = column_block_panels(
        con.n.1.div_ceil(nr),
        ((target.l2_bytes / 2) / panel_bytes).max(1),
        (target.l2_bytes / panel_bytes).max(1),
        target.cores,
    );
    let (along_k, along_m) = contiguity(&con.x, con.k.0, con.m.0);
    Blocking {
        ty,
        nv,
        nr,
        mr,
        kc,
        ncp,
        a_rows: along_k && !along_m,
        pairs,
    }
}

/// Column panels per column block, for `panels` panels on a machine of `cores` cores, where
/// `half` panels fill half the L2 and `full` all of it. The column blocks are the chunks the
/// parallel pass shares among a device's threads, and each block re-reads the row panels of
/// `x` (packing them anew), so:
/// - blocks of half the L2 by default;
/// - when that makes more than two blocks per core, larger blocks (up to the whole L2) that
///   still make two per core: on the 2-core AVX2 VM, the 2048³ product on two threads took
///   98-99 ms with 4 blocks of 512 columns and 106-108 ms with 8 of 256 (3 interleaved runs),
///   one thread 181 and 184 ms;
/// - when that makes several blocks but fewer than cores (a 2 MB L2 holds 1,120 columns of a
///   2048-wide AVX-512 product: two blocks), smaller blocks (of 4 panels at least), one per
///   core, so that every core gets a share. A single block stays whole: its panels are then
///   packed once for all the outer loops (a convolution's taps), and splitting the 256
///   columns of the stride-2 3×3 convolution in two made it 31% slower on one thread.
fn column_block_panels(panels: usize, half: usize, full: usize, cores: usize) -> usize {
    const MIN_PANELS: usize = 4;
    let cores = cores.max(1);
    let blocks = panels.div_ceil(half);
    if blocks > 2 * cores {
        (panels / (2 * cores)).clamp(half, full.max(half))
    } else if blocks >= 2 && blocks < cores {
        panels.div_ceil(cores).max(MIN_PANELS).min(half)
    } else {
        half
    }
}

#[cfg(test)]
mod tests {
    use super::column_block_panels;

    #[test]
    fn column_blocks_grow_to_two_per_core_and_shrink_to_one() {
        // 2048 columns of 16 (128 panels), 16 panels in half the L2, 32 in all of it.
        assert_eq!(column_block_panels(128, 16, 32, 2), 32);
        // Eight cores: the 8 blocks of half the L2, one per core, as they are.
        assert_eq!(column_block_panels(128, 16, 32, 8), 16);
        // One core and 64 blocks: they grow, but only to the whole L2.
        assert_eq!(column_block_panels(1024, 16, 32, 1), 32);
        // 4 blocks for 2 cores: as they are.
        assert_eq!(column_block_panels(64, 16, 32, 2), 16);
        // A 2048-wide AVX-512 product (64 panels of 32), 35 panels in half a 2 MB L2, on 8
        // cores: 8 blocks of 8 panels; on 64 cores, blocks of 4 panels at least.
        assert_eq!(column_block_panels(64, 35, 71, 8), 8);
        assert_eq!(column_block_panels(64, 35, 71, 64), 4);
        // One block stays whole.
        assert_eq!(column_block_panels(16, 32, 64, 8), 32);
    }
}

/// Whether some array read of `v` is contiguous along `k`, and whether one is along `p`.
fn contiguity(v: &Llv, k: Symbol, p: Symbol) -> (bool, bool) {
    let (mut along_k, mut along_p) = (false, false);
    visit_value(v, &mut |x| {
        if let Llv::Get(t, idcs) = x {
            along_k |= stride(t, idcs, k) == 1;
            along_p |= stride(t, idcs, p) == 1;
        }
    });
    (along_k, along_p)
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
#[derive(Clone)]
struct Buffers {
    ap: Tnode,
    bp: Tnode,
    tile: Tnode,
}

/// One reduction block: its index (a loop iterator or fixed) and its number of steps.
#[derive(Clone, Copy)]
struct Block {
    kb: AxisIndex,
    len: usize,
}

/// Where a run of column panels starts: at panel `jc · ncp` (a column block, `jc` a loop
/// iterator) or at a fixed panel.
#[derive(Clone, Copy)]
enum Base {
    Block(Symbol),
    At(usize),
}

/// A run of column panels packed together into `bp`: `full` whole panels from `base`, then
/// an edge panel of `edge` columns if nonzero.
#[derive(Clone, Copy)]
struct Run {
    base: Base,
    full: usize,
    edge: usize,
}

impl Run {
    /// The panel of the result that local panel `jj` of the run is.
    fn panel(&self, jj: AxisIndex, ncp: usize) -> Option<AxisIndex> {
        match self.base {
            Base::Block(jc) => scaled(jj, 1, &[(jc, ncp)], 0),
            Base::At(s) => scaled(jj, 1, &[], s),
        }
    }
}

/// The shared state of one kernel's construction.
struct Gen<'a> {
    con: &'a Contraction,
    b: Blocking,
    bufs: Buffers,
}

/// The runs of column panels of `n` columns: column blocks of `ncp` whole panels while the
/// columns do not fit one (with how many blocks), then the rest.
fn runs(n: usize, b: &Blocking) -> Vec<(Option<usize>, Run)> {
    let (full_n, edge_n) = (n / b.nr, n % b.nr);
    let np = n.div_ceil(b.nr);
    let (blocks, rest_start) = if np > b.ncp {
        (full_n / b.ncp, (full_n / b.ncp) * b.ncp)
    } else {
        (0, 0)
    };
    let mut runs = vec![];
    if blocks > 0 {
        runs.push((
            Some(blocks),
            Run {
                base: Base::Block(Symbol::fresh()),
                full: b.ncp,
                edge: 0,
            },
        ));
    }
    if rest_start < full_n || edge_n > 0 {
        runs.push((
            None,
            Run {
                base: Base::At(rest_start),
                full: full_n - rest_start,
                edge: edge_n,
            },
        ));
    }
    runs
}

/// Builds the kernel for a matched contraction: the outer loops of `con` around the kernels
/// of its specializations `specs` (see [`specialize`]; each in an `if` of its remaining
/// guards), which share the packed buffers. With `zero_fill_folded`, `c` was not zeroed
/// before: the first reduction block stores instead of accumulating.
fn build(
    con: &Contraction,
    specs: &[Contraction],
    target: &VectorTarget,
    locals: &mut Vec<Tnode>,
    written_first: &mut Vec<Tnode>,
    zero_fill_folded: bool,
) -> Option<Llc> {
    let b = blocking(con, target);
    // The packed buffers and the tile hold values of the kernel's lanes.
    let prec = b.ty.prec;
    let (m, n, k) = (con.m.1, con.n.1, con.k.1);
    let run_panels = runs(n, &b)
        .iter()
        .map(|(_, r)| r.full + usize::from(r.edge > 0))
        .max()?;
    let label = con.c.label().join("_");
    let kc2 = b.kc.div_ceil(2);
    let bufs = if b.pairs {
        Buffers {
            ap: local(
                &[&label, "packed_a"],
                &[kc2, b.mr, 2],
                Prec::Bfloat16,
                locals,
            )?,
            bp: local(
                &[&label, "packed_b"],
                &[run_panels, kc2, b.nr, 2],
                Prec::Bfloat16,
                locals,
            )?,
            tile: local(&[&label, "tile"], &[b.mr, b.nr], prec, locals)?,
        }
    } else {
        Buffers {
            ap: if b.a_rows {
                local(&[&label, "packed_a"], &[b.mr, b.kc], prec, locals)?
            } else {
                local(&[&label, "packed_a"], &[b.kc, b.mr], prec, locals)?
            },
            bp: local(
                &[&label, "packed_b"],
                &[run_panels, b.kc, b.nr],
                prec,
                locals,
            )?,
            tile: local(&[&label, "tile"], &[b.mr, b.nr], prec, locals)?,
        }
    };
    // Every element of these that is read is written before in each call: no zeroing needed.
    written_first.extend([bufs.ap.clone(), bufs.bp.clone(), bufs.tile.clone()]);
    let mut stmts = vec![Llc::Comment(format!(
        "GEMM kernel for {}: {m}x{n}x{k}, tile {}x{} ({}{} lanes{}), kc {}, column blocks of {} panels{}",
        con.c.name(),
        b.mr,
        b.nr,
        b.ty.lanes,
        if prec.is_integer() {
            format!(" {prec}")
        } else {
            String::new()
        },
        if b.pairs { ", bfloat16 pairs" } else { "" },
        b.kc,
        b.ncp,
        if con.unroll.is_empty() && con.guards.is_empty() {
            String::new()
        } else {
            format!(", guarded, {} specialized row ranges", specs.len())
        }
    ))];
    // When the whole of `y` is packed at once (one reduction block, one run of panels) and
    // some outer loops do not move `y` (the output rows `h` of a convolution, the batch of
    // `bij,jk->bik`), those loops go inside: `y` is packed once per iteration of the others
    // and reused by all of theirs.
    let (inner, outer): (Vec<&Loop>, Vec<&Loop>) =
        con.outer.iter().partition(|l| !mentions(&con.y, l.index));
    let whole_y = k == b.kc && matches!(runs(n, &b).as_slice(), [(None, _)]);
    if whole_y && !zero_fill_folded && !inner.is_empty() {
        // Per specialization: the packing of `y` and the rows that use it.
        let blk = Block {
            kb: AxisIndex::Fixed(0),
            len: k,
        };
        let mut bodies = vec![];
        for spec in specs {
            let g = Gen {
                con: spec,
                b,
                bufs: bufs.clone(),
            };
            let [(None, run)] = runs(n, &b)[..] else {
                return None;
            };
            let rows = g.guarded_row_panels(&run, blk, Mode::Accumulate)?;
            bodies.push((g.pack_b(&run, blk)?, rows));
        }
        let row_bytes = m * n * con.c.prec().size_in_bytes();
        if let Some(blocks) = (!outer.is_empty())
            .then(|| RowBlocks::new(&inner, row_bytes, target))
            .flatten()
        {
            stmts.push(blocks.build(&outer, bodies)?);
            return Some(Llc::Seq(stmts));
        }
        for (pack, rows) in bodies {
            stmts.push(match parts(&inner, target.cores) {
                Some(p) => p.split(pack, rows)?,
                None => Llc::Seq(vec![pack, wrap(&inner, rows)]),
            });
        }
        return Some(wrap(&outer, Llc::Seq(stmts)));
    }
    // Otherwise, when few rows share each packed block of `y` (a 7×7 convolution with 512
    // channels: 7 rows of `v` for each output row `h`), packing would cost more than the
    // products: then those loops go inside every block, after its packing, so that each
    // block of `y` is packed once for all their iterations (the cells of `c` they update
    // are few enough to stay in cache between the blocks).
    let inner_rows: usize = inner
        .iter()
        .map(|l| (l.to - l.from + 1).max(1) as usize)
        .product::<usize>()
        .saturating_mul(m);
    let move_inner =
        !zero_fill_folded && !inner.is_empty() && m <= FEW_ROWS && inner_rows <= MOVED_ROWS;
    // With those loops inside, the rows of a call are few: the columns are split instead
    // (see [`column_parts`]), in parts around everything else.
    let parts = if move_inner {
        column_parts(n, &b, target.cores)
    } else {
        None
    };
    let part = Symbol::fresh();
    let b = match parts {
        Some((_, q)) => Blocking { ncp: q, ..b },
        None => b,
    };
    if let (Some((count, q)), Some(Llc::Comment(c))) = (parts, stmts.first_mut()) {
        c.push_str(&format!(", in {count} column parts of {q} panels"));
    }
    for spec in specs {
        let g = Gen {
            con: spec,
            b,
            bufs: bufs.clone(),
        };
        let runs = match parts {
            Some((_, q)) => vec![(
                None,
                Run {
                    base: Base::Block(part),
                    full: q,
                    edge: 0,
                },
            )],
            None => runs(n, &b),
        };
        let (kc, full_kb, rest_k) = (g.b.kc, k / g.b.kc, k % g.b.kc);
        let block = |blk: Block, mode: Mode| -> Option<Llc> {
            let mut out = vec![];
            for (count, run) in &runs {
                let code = if move_inner {
                    let rows = g.guarded_row_panels(run, blk, mode)?;
                    g.packed_around(run, blk, &inner, rows)?
                } else {
                    g.run(run, blk, mode)?
                };
                out.push(match (count, run.base) {
                    (Some(count), Base::Block(jc)) => Llc::for_loop(jc, 0, *count as i64 - 1, code),
                    _ => code,
                });
            }
            Some(Llc::Seq(out))
        };
        let mut code = vec![];
        // `kc ≤ k`, so there is at least one whole block.
        let mut first = 0;
        if zero_fill_folded {
            code.push(block(
                Block {
                    kb: AxisIndex::Fixed(0),
                    len: kc,
                },
                Mode::Store,
            )?);
            first = 1;
        }
        if full_kb > first {
            let kb = Symbol::fresh();
            code.push(Llc::for_loop(
                kb,
                first as i64,
                full_kb as i64 - 1,
                block(
                    Block {
                        kb: AxisIndex::Iterator(kb),
                        len: kc,
                    },
                    Mode::Accumulate,
                )?,
            ));
        }
        if rest_k > 0 {
            code.push(block(
                Block {
                    kb: AxisIndex::Fixed(full_kb),
                    len: rest_k,
                },
                Mode::Accumulate,
            )?);
        }
        let code = Llc::Seq(code);
        stmts.push(if spec.guards.is_empty() || move_inner {
            code
        } else {
            Llc::If {
                guards: spec.guards.clone(),
                body: Box::new(code),
            }
        });
    }
    let around: Vec<&Loop> = if move_inner {
        outer
    } else {
        con.outer.iter().collect()
    };
    let code = wrap(&around, Llc::Seq(stmts));
    Some(match parts {
        Some((count, _)) => Llc::for_loop(part, 0, count as i64 - 1, code),
        None => code,
    })
}

/// The column parts of a kernel whose rows are few (the outer loops that do not move `y`
/// moved inside its packed blocks, see [`build`]): `(parts, panels per part)`, for `n`
/// columns on a machine of `cores` cores, when the columns are whole panels in one column
/// block and some count of parts from `cores` down to 2 divides them into parts of at least
/// two panels. The parts are the outermost loop, around the outer loops, the reduction
/// blocks and the rows, so the parallel pass makes them one region: each thread packs the
/// blocks of `y` of its columns, and the rows of `x` for itself, and shares nothing with
/// the others. Splitting the rows instead (the parallel pass's choice otherwise) made one
/// region per block and tap, 72 regions of about 20 µs for a 1×7×7×512→512 3×3
/// convolution, each splitting 7 rows 4/3 between two threads, and every thread read the
/// packed `y` the other packed: 1.67 ms on two threads, 1.52 ms on one. The order of each
/// cell's sum does not change.
fn column_parts(n: usize, b: &Blocking, cores: usize) -> Option<(usize, usize)> {
    if cores < 2 || !n.is_multiple_of(b.nr) {
        return None;
    }
    let panels = n / b.nr;
    if panels > b.ncp {
        return None;
    }
    (2..=cores)
        .rev()
        .find(|&p| panels.is_multiple_of(p) && panels / p >= 2)
        .map(|p| (p, panels / p))
}

/// The outermost of the loops moved inside a packed `y` split into one contiguous part per
/// core, each packing `y` for itself: the threads then share the parts, each reading the `y`
/// it packed in its own cache. One packing shared by all (the threads sharing the rows)
/// made every other core fetch the packed `y` of every tap from the packing core's cache:
/// a 1×14×14×256→256 convolution ran 1.87 ms on two threads, and 1.40 ms without the
/// packing. With one core, or fewer rows than twice the cores, nothing is split.
struct Parts<'l> {
    /// The loop split and the loops inside it.
    first: &'l Loop,
    rest: &'l [&'l Loop],
    /// The split loop's iterations, the parts' length in them, and the number of parts.
    trips: i64,
    chunk: i64,
    count: i64,
}

/// The split of the outermost of `inner` into parts for `cores` cores (see [`Parts`]).
fn parts<'l>(inner: &'l [&'l Loop], cores: usize) -> Option<Parts<'l>> {
    let (first, rest) = inner.split_first()?;
    let trips = first.to - first.from + 1;
    let count = i64::try_from(cores).ok()?;
    if count < 2 || trips < 2 * count {
        return None;
    }
    let chunk = (trips + count - 1) / count;
    let count = (trips + chunk - 1) / chunk;
    Some(Parts {
        first,
        rest,
        trips,
        chunk,
        count,
    })
}

impl Parts<'_> {
    /// `for part { pack; for the part's iterations of first { rest { body } } }`.
    fn split(&self, pack: Llc, body: Llc) -> Option<Llc> {
        let (part, step) = (Symbol::fresh(), Symbol::fresh());
        let terms = [(part, self.chunk as usize), (step, 1)];
        let at = AxisIndex::affine(&terms, self.first.from)?;
        let mut inner = crate::loops::map_indices(&wrap(self.rest, body), &mut |ix| {
            ix.substitute(self.first.index, at)
        })?;
        if self.chunk * self.count != self.trips {
            inner = Llc::If {
                guards: vec![(AxisIndex::affine(&terms, 0)?, self.trips as usize)],
                body: Box::new(inner),
            };
        }
        Some(Llc::for_loop(
            part,
            0,
            self.count - 1,
            Llc::Seq(vec![pack, Llc::for_loop(step, 0, self.chunk - 1, inner)]),
        ))
    }
}

/// The outer loops that do not move `y` (`inner`: a convolution's output rows) cut into
/// blocks whose cells of `c` fit in an eighth of the L2, with the loops that move `y` (the
/// taps) inside each block: every tap's `y` is packed again for each block, but the block's
/// cells of `c` stay in cache while all the taps add into them. Used when `y` is packed
/// whole and the cells of `c` the inner loops span exceed half the L2: with the taps
/// outside (the inner loops inside a packing of each tap's `y`), every tap then read and
/// wrote all of `c` from memory. A 1×112×112×32→64 3×3 convolution (3.2 MB of `c`) took
/// 4.04 ms on one thread of the Sapphire Rapids VM (2 MB of L2) that way, and 3.1 ms in
/// blocks of 9 rows (2.05 and 1.7 ms on two threads); blocks of a half, a quarter, a
/// sixteenth of the L2 or of one row were within the noise of it. Lowering the threshold
/// to a sixteenth of the L2 changed nothing measurable on the other convolutions of
/// `benches/peers/shapes.py`, so it stays at half.
///
/// With several cores and enough rows, the outermost inner loop is first cut into one
/// contiguous part per core (as [`Parts`]), the parts' loop outermost: one region, each
/// thread packing for itself.
struct RowBlocks<'l> {
    first: &'l Loop,
    rest: &'l [&'l Loop],
    /// Iterations of `first`: in all, per part, per block; the number of parts (1: none).
    trips: i64,
    chunk: i64,
    block: i64,
    count: i64,
}

impl<'l> RowBlocks<'l> {
    /// The blocks for `inner` when its cells of `c` exceed half the L2, each iteration of
    /// the innermost of them spanning `row_bytes` of `c`.
    fn new(inner: &'l [&'l Loop], row_bytes: usize, target: &VectorTarget) -> Option<Self> {
        let (first, rest) = inner.split_first()?;
        let trips = first.to - first.from + 1;
        let per_first = rest
            .iter()
            .map(|l| (l.to - l.from + 1).max(1) as usize)
            .product::<usize>()
            .saturating_mul(row_bytes);
        let all = per_first.saturating_mul(trips.max(1) as usize);
        if trips < 2 || all <= target.l2_bytes / 2 {
            return None;
        }
        let (chunk, count) = match parts(inner, target.cores) {
            Some(p) => (p.chunk, p.count),
            None => (trips, 1),
        };
        let most = ((target.l2_bytes / 8) / per_first.max(1)).max(1) as i64;
        let blocks = (chunk + most - 1) / most;
        let block = (chunk + blocks - 1) / blocks;
        Some(RowBlocks {
            first,
            rest,
            trips,
            chunk,
            block,
            count,
        })
    }

    /// `for part { for block { outer { for spec: pack; for the block's rows { rows } } } }`
    /// for `bodies`, the packing and the rows of each specialization.
    fn build(&self, outer: &[&Loop], bodies: Vec<(Llc, Llc)>) -> Option<Llc> {
        let (part, blk) = (Symbol::fresh(), Symbol::fresh());
        let blocks = (self.chunk + self.block - 1) / self.block;
        let mut specs = vec![];
        for (pack, rows) in bodies {
            let step = Symbol::fresh();
            let mut terms = vec![(blk, self.block as usize), (step, 1)];
            // Guards: the row within the part, and within all (when they do not divide).
            let mut guards = vec![];
            if blocks * self.block != self.chunk {
                guards.push((AxisIndex::affine(&terms, 0)?, self.chunk as usize));
            }
            if self.count > 1 {
                terms.push((part, self.chunk as usize));
            }
            if self.chunk * self.count != self.trips {
                guards.push((AxisIndex::affine(&terms, 0)?, self.trips as usize));
            }
            let at = AxisIndex::affine(&terms, self.first.from)?;
            let mut rows = crate::loops::map_indices(&wrap(self.rest, rows), &mut |ix| {
                ix.substitute(self.first.index, at)
            })?;
            if !guards.is_empty() {
                rows = Llc::If {
                    guards,
                    body: Box::new(rows),
                };
            }
            specs.push(pack);
            specs.push(Llc::for_loop(step, 0, self.block - 1, rows));
        }
        let code = Llc::for_loop(blk, 0, blocks - 1, wrap(outer, Llc::Seq(specs)));
        Some(if self.count > 1 {
            Llc::for_loop(part, 0, self.count - 1, code)
        } else {
            code
        })
    }
}

/// The most rows of a kernel for which the outer loops that do not move `y` go inside its
/// packed blocks (see [`build`]).
const FEW_ROWS: usize = 96;
/// The most rows of `c` those loops and the kernel's rows may span together.
const MOVED_ROWS: usize = 4096;

/// `code` inside `loops` (the first outermost).
fn wrap(loops: &[&Loop], code: Llc) -> Llc {
    loops.iter().rev().fold(code, |code, l| Llc::For {
        index: l.index,
        from: l.from,
        to: l.to,
        body: Box::new(code),
        trace_it: l.trace_it,
    })
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
            usize::try_from(l.offset).ok()? * scale,
        ),
    };
    all.extend_from_slice(terms);
    lin(&all, base + offset)
}

impl Gen<'_> {
    /// One reduction block over one run of column panels: the run's panels of `y` are packed
    /// into `bp` (which stays in L2), then for every row panel its rows of `x` are packed into
    /// `ap` (which stays in L1) and multiplied by every panel of the run.
    fn run(&self, run: &Run, blk: Block, mode: Mode) -> Option<Llc> {
        Some(Llc::Seq(vec![
            self.pack_b(run, blk)?,
            self.row_panels(run, blk, mode)?,
        ]))
    }

    /// [`Self::row_panels`] under the specialization's remaining guards.
    fn guarded_row_panels(&self, run: &Run, blk: Block, mode: Mode) -> Option<Llc> {
        let rows = self.row_panels(run, blk, mode)?;
        Some(if self.con.guards.is_empty() {
            rows
        } else {
            Llc::If {
                guards: self.con.guards.clone(),
                body: Box::new(rows),
            }
        })
    }

    /// The block's packing of `y`, then `rows` inside the outer `loops` that do not move `y`
    /// (the packed block is reused by all their iterations).
    fn packed_around(&self, run: &Run, blk: Block, loops: &[&Loop], rows: Llc) -> Option<Llc> {
        Some(Llc::Seq(vec![self.pack_b(run, blk)?, wrap(loops, rows)]))
    }

    /// The row panels of one reduction block over one run whose panels are packed in `bp`.
    fn row_panels(&self, run: &Run, blk: Block, mode: Mode) -> Option<Llc> {
        let (b, m) = (&self.b, self.con.m.1);
        let mut out = vec![];
        let (full_m, edge_m) = (m / b.mr, m % b.mr);
        let pack = |ir: AxisIndex, rows: usize| -> Option<Llc> {
            if self.direct_a(blk) {
                Some(Llc::Noop)
            } else {
                self.pack_a(ir, rows, blk)
            }
        };
        if full_m > 0 {
            let ir = Symbol::fresh();
            let ir_ix = AxisIndex::Iterator(ir);
            out.push(Llc::for_loop(
                ir,
                0,
                full_m as i64 - 1,
                Llc::Seq(vec![
                    pack(ir_ix, b.mr)?,
                    self.tiles(run, ir_ix, b.mr, blk, mode)?,
                ]),
            ));
        }
        if edge_m > 0 {
            let ir_ix = AxisIndex::Fixed(full_m);
            out.push(pack(ir_ix, edge_m)?);
            out.push(self.tiles(run, ir_ix, edge_m, blk, mode)?);
        }
        Some(Llc::Seq(out))
    }

    /// Whether the kernel reads its rows of `x` where they are instead of packing them into
    /// `ap`: when they already lie as `ap` would hold them, each row's steps contiguous and
    /// the rows one after the other (the block is the whole reduction, and `x`'s stride along
    /// the rows is the block's length), in the kernel's precision. Packing then copies one
    /// contiguous block into another: the input rows of a convolution whose channels are one
    /// reduction block (`x[h + i, w + j, c]` over `w` and `c`), a product whose `k` fits one
    /// block. A 1×112×112×32→64 3×3 convolution copied 3.6 million floats a call so.
    fn direct_a(&self, blk: Block) -> bool {
        let (con, b) = (self.con, &self.b);
        let Llv::Get(tn, idcs) = &con.x else {
            return false;
        };
        !b.pairs
            && b.a_rows
            && tn.prec() == b.ty.prec
            && blk.len == con.k.1
            && stride(tn, idcs, con.k.0) == 1
            && stride(tn, idcs, con.m.0) == blk.len
    }

    /// Row `row` of the kernel's rows from `ir·mr` at step `kx` of `blk`: from `ap`, or from
    /// `x` itself (see [`Self::direct_a`]).
    fn a_value(&self, ir: AxisIndex, row: usize, kx: Symbol, blk: Block) -> Option<Llv> {
        let (con, b) = (self.con, &self.b);
        if self.direct_a(blk) {
            return subst(
                &con.x,
                &[
                    (con.m.0, scaled(ir, b.mr, &[], con.m_from + row)?),
                    (con.k.0, scaled(blk.kb, b.kc, &[(kx, 1)], 0)?),
                ],
            );
        }
        let (row_ix, kx_ix) = (AxisIndex::Fixed(row), AxisIndex::Iterator(kx));
        Some(Llv::Get(
            self.bufs.ap.clone(),
            if b.a_rows {
                vec![row_ix, kx_ix]
            } else {
                vec![kx_ix, row_ix]
            },
        ))
    }

    /// Packs rows `ir·mr .. ir·mr + rows` of `x` over the steps of `blk` into `ap`.
    fn pack_a(&self, ir: AxisIndex, rows: usize, blk: Block) -> Option<Llc> {
        if self.b.pairs {
            return self.pack_a_pairs(ir, rows, blk);
        }
        let (con, b) = (self.con, &self.b);
        let (r, kx) = (Symbol::fresh(), Symbol::fresh());
        let value = subst(
            &con.x,
            &[
                (con.m.0, scaled(ir, b.mr, &[(r, 1)], con.m_from)?),
                (con.k.0, scaled(blk.kb, b.kc, &[(kx, 1)], 0)?),
            ],
        )?;
        let (r_ix, kx_ix) = (AxisIndex::Iterator(r), AxisIndex::Iterator(kx));
        let set = Llc::Set {
            tn: self.bufs.ap.clone(),
            idcs: if b.a_rows {
                vec![r_ix, kx_ix]
            } else {
                vec![kx_ix, r_ix]
            },
            value,
        };
        let (rows, steps) = (rows as i64 - 1, blk.len as i64 - 1);
        // Reads and writes both run along the innermost loop.
        Some(if b.a_rows {
            Llc::for_loop(r, 0, rows, Llc::for_loop(kx, 0, steps, set))
        } else {
            Llc::for_loop(kx, 0, steps, Llc::for_loop(r, 0, rows, set))
        })
    }

    /// Packs the run's panels of `y` over the steps of `blk` into `bp[jj, kx, c]`, and zeros
    /// into the columns past the edge of an edge panel.
    fn pack_b(&self, run: &Run, blk: Block) -> Option<Llc> {
        if self.b.pairs {
            return self.pack_b_pairs(run, blk);
        }
        let (con, b) = (self.con, &self.b);
        let (jj, c, kx) = (Symbol::fresh(), Symbol::fresh(), Symbol::fresh());
        // A source contiguous along k (a row of a transposed `b`) is read a cache line at a
        // time: blocks of KB steps, every column of the panel, then the steps of the block
        // (reads contiguous, each line used whole); a source contiguous along the columns is
        // copied row by row (reads and writes contiguous).
        const KB: usize = 16;
        let (along_k, along_n) = contiguity(&con.y, con.k.0, con.n.0);
        let blocked = along_k && !along_n && blk.len >= KB;
        let set = |jj_ix: AxisIndex, k_ix: AxisIndex, value: Llv| Llc::Set {
            tn: self.bufs.bp.clone(),
            idcs: vec![jj_ix, k_ix, AxisIndex::Iterator(c)],
            value,
        };
        let data = |jj_ix: AxisIndex, cols: usize| -> Option<Llc> {
            let jg = run.panel(jj_ix, b.ncp)?;
            // Step `Σ terms + offset` of the block.
            let at = |terms: &[(Symbol, usize)], offset: usize| -> Option<Llc> {
                let value = subst(
                    &con.y,
                    &[
                        (con.n.0, scaled(jg, b.nr, &[(c, 1)], 0)?),
                        (con.k.0, scaled(blk.kb, b.kc, terms, offset)?),
                    ],
                )?;
                Some(set(jj_ix, lin(terms, offset)?, value))
            };
            let cols = cols as i64 - 1;
            if !blocked {
                return Some(Llc::for_loop(
                    kx,
                    0,
                    blk.len as i64 - 1,
                    Llc::for_loop(c, 0, cols, at(&[(kx, 1)], 0)?),
                ));
            }
            let (kb16, full, rest) = (Symbol::fresh(), blk.len / KB, blk.len % KB);
            let mut out = vec![Llc::for_loop(
                kb16,
                0,
                full as i64 - 1,
                Llc::for_loop(
                    c,
                    0,
                    cols,
                    Llc::for_loop(kx, 0, KB as i64 - 1, at(&[(kb16, KB), (kx, 1)], 0)?),
                ),
            )];
            if rest > 0 {
                out.push(Llc::for_loop(
                    c,
                    0,
                    cols,
                    Llc::for_loop(kx, 0, rest as i64 - 1, at(&[(kx, 1)], full * KB)?),
                ));
            }
            Some(Llc::Seq(out))
        };
        let mut out = vec![];
        if run.full > 0 {
            let jj_ix = AxisIndex::Iterator(jj);
            let body = match self.transposed_panel(run, blk, jj_ix)? {
                Some(code) => code,
                None => data(jj_ix, b.nr)?,
            };
            out.push(Llc::for_loop(jj, 0, run.full as i64 - 1, body));
        }
        if run.edge > 0 {
            let jj_ix = AxisIndex::Fixed(run.full);
            out.push(data(jj_ix, run.edge)?);
            out.push(Llc::for_loop(
                kx,
                0,
                blk.len as i64 - 1,
                Llc::for_loop(
                    c,
                    run.edge as i64,
                    b.nr as i64 - 1,
                    set(jj_ix, AxisIndex::Iterator(kx), Llv::Constant(0.0)),
                ),
            ));
        }
        Some(Llc::Seq(out))
    }

    /// [`Gen::pack_a`] for bfloat16 pairs: `ap[kp, r, t] = x(row r, step 2kp + t)`, and 0 for
    /// the missing second step of an odd block.
    fn pack_a_pairs(&self, ir: AxisIndex, rows: usize, blk: Block) -> Option<Llc> {
        let (con, b) = (self.con, &self.b);
        let (r, kp, t) = (Symbol::fresh(), Symbol::fresh(), Symbol::fresh());
        let r_ix = AxisIndex::Iterator(r);
        let row = scaled(ir, b.mr, &[(r, 1)], con.m_from)?;
        let at = |terms: &[(Symbol, usize)], offset: usize| -> Option<Llv> {
            subst(
                &con.x,
                &[
                    (con.m.0, row),
                    (con.k.0, scaled(blk.kb, b.kc, terms, offset)?),
                ],
            )
        };
        let set = |kp_ix: AxisIndex, t_ix: AxisIndex, value: Llv| Llc::Set {
            tn: self.bufs.ap.clone(),
            idcs: vec![kp_ix, r_ix, t_ix],
            value,
        };
        let (full, odd) = (blk.len / 2, blk.len % 2 == 1);
        let mut body = vec![];
        if full > 0 {
            let value = at(&[(kp, 2), (t, 1)], 0)?;
            let kp_ix = AxisIndex::Iterator(kp);
            body.push(Llc::for_loop(
                kp,
                0,
                full as i64 - 1,
                Llc::for_loop(t, 0, 1, set(kp_ix, AxisIndex::Iterator(t), value)),
            ));
        }
        if odd {
            let kp_ix = AxisIndex::Fixed(full);
            body.push(set(kp_ix, AxisIndex::Fixed(0), at(&[], 2 * full)?));
            body.push(set(kp_ix, AxisIndex::Fixed(1), Llv::Constant(0.0)));
        }
        Some(Llc::for_loop(r, 0, rows as i64 - 1, Llc::Seq(body)))
    }

    /// [`Gen::pack_b`] for bfloat16 pairs: `bp[jj, kp, c, t] = y(step 2kp + t, column c)`,
    /// 0 for the missing second step of an odd block and for the columns past the edge.
    fn pack_b_pairs(&self, run: &Run, blk: Block) -> Option<Llc> {
        let (con, b) = (self.con, &self.b);
        let (jj, c, kp, t) = (
            Symbol::fresh(),
            Symbol::fresh(),
            Symbol::fresh(),
            Symbol::fresh(),
        );
        let (along_k, along_n) = contiguity(&con.y, con.k.0, con.n.0);
        let steps_outer = !along_k || along_n;
        let (full, odd) = (blk.len / 2, blk.len % 2 == 1);
        // One iterator per index entry: the C writer fences stores through entries of
        // several iterators (which may overwrite a cell), and these never do.
        let set = |jj_ix: AxisIndex, kp_ix: AxisIndex, t_ix: AxisIndex, value: Llv| {
            Some(Llc::Set {
                tn: self.bufs.bp.clone(),
                idcs: vec![jj_ix, kp_ix, AxisIndex::Iterator(c), t_ix],
                value,
            })
        };
        let data = |jj_ix: AxisIndex, cols: usize| -> Option<Llc> {
            let jg = run.panel(jj_ix, b.ncp)?;
            let at = |terms: &[(Symbol, usize)], offset: usize| -> Option<Llv> {
                subst(
                    &con.y,
                    &[
                        (con.n.0, scaled(jg, b.nr, &[(c, 1)], 0)?),
                        (con.k.0, scaled(blk.kb, b.kc, terms, offset)?),
                    ],
                )
            };
            let cols = cols as i64 - 1;
            let mut out = vec![];
            if full > 0 {
                let s = set(
                    jj_ix,
                    AxisIndex::Iterator(kp),
                    AxisIndex::Iterator(t),
                    at(&[(kp, 2), (t, 1)], 0)?,
                )?;
                // Reads along the source's contiguous axis.
                out.push(if steps_outer {
                    Llc::for_loop(
                        kp,
                        0,
                        full as i64 - 1,
                        Llc::for_loop(t, 0, 1, Llc::for_loop(c, 0, cols, s)),
                    )
                } else {
                    Llc::for_loop(
                        c,
                        0,
                        cols,
                        Llc::for_loop(kp, 0, full as i64 - 1, Llc::for_loop(t, 0, 1, s)),
                    )
                });
            }
            if odd {
                let kp_ix = AxisIndex::Fixed(full);
                out.push(Llc::for_loop(
                    c,
                    0,
                    cols,
                    Llc::Seq(vec![
                        set(jj_ix, kp_ix, AxisIndex::Fixed(0), at(&[], 2 * full)?)?,
                        set(jj_ix, kp_ix, AxisIndex::Fixed(1), Llv::Constant(0.0))?,
                    ]),
                ));
            }
            Some(Llc::Seq(out))
        };
        let mut out = vec![];
        if run.full > 0 {
            let jj_ix = AxisIndex::Iterator(jj);
            out.push(Llc::for_loop(
                jj,
                0,
                run.full as i64 - 1,
                data(jj_ix, b.nr)?,
            ));
        }
        if run.edge > 0 {
            let jj_ix = AxisIndex::Fixed(run.full);
            out.push(data(jj_ix, run.edge)?);
            out.push(Llc::for_loop(
                kp,
                0,
                blk.len.div_ceil(2) as i64 - 1,
                Llc::for_loop(
                    c,
                    run.edge as i64,
                    b.nr as i64 - 1,
                    Llc::for_loop(
                        t,
                        0,
                        1,
                        set(
                            jj_ix,
                            AxisIndex::Iterator(kp),
                            AxisIndex::Iterator(t),
                            Llv::Constant(0.0),
                        )?,
                    ),
                ),
            ));
        }
        Some(Llc::Seq(out))
    }

    /// Packs whole panel `jj` of the run from a `y` that is a plain read of an array of the
    /// compute precision, contiguous along `k` (a row of a transposed `b`): `W × W` blocks (`W`
    /// the lanes) are loaded as `W` vectors along `k`, one per column, transposed in registers
    /// (`log2 W` rounds of lane shuffles: each round interleaves the low and the high halves
    /// of vectors `i` and `i + W/2` into vectors `2i` and `2i + 1`) and stored as `W` vectors
    /// along the columns; the steps past the last whole block are copied one by one. `None`
    /// when `y` is not such a read.
    fn transposed_panel(&self, run: &Run, blk: Block, jj: AxisIndex) -> Option<Option<Llc>> {
        let (con, b) = (self.con, &self.b);
        let (ty, w) = (b.ty, b.ty.lanes);
        let Llv::Get(src, src_idcs) = &con.y else {
            return Some(None);
        };
        // (The runtime header has shuffle masks for 32- and 64-bit lanes.)
        if !ty.fits_memory_of(src.prec())
            || ty.prec.size_in_bytes() < 4
            || !w.is_power_of_two()
            || blk.len < w
            || stride(src, src_idcs, con.k.0) != 1
            || stride(src, src_idcs, con.n.0) == 1
        {
            return Some(None);
        }
        let jg = run.panel(jj, b.ncp)?;
        let (q, kx, c) = (Symbol::fresh(), Symbol::fresh(), Symbol::fresh());
        let (blocks, rest) = (blk.len / w, blk.len % w);
        let half = w / 2;
        let lo: Vec<usize> = (0..half).flat_map(|i| [i, w + i]).collect();
        let hi: Vec<usize> = (half..w).flat_map(|i| [i, w + i]).collect();
        let mut body = vec![];
        for v in 0..b.nv {
            // Column `v·W + i` of the panel, steps `q·W ..` of the block, into vector `i`.
            let mut rows: Vec<VReg> = vec![];
            for i in 0..w {
                let idcs = subst_idcs(
                    src_idcs,
                    &[
                        (con.n.0, scaled(jg, b.nr, &[], v * w + i)?),
                        (con.k.0, scaled(blk.kb, b.kc, &[(q, w)], 0)?),
                    ],
                )?;
                let r = vreg(ty);
                body.push(Llc::VSet(r, Vlv::Load(ty, src.clone(), idcs)));
                rows.push(r);
            }
            for _ in 0..w.trailing_zeros() {
                let mut next = vec![];
                for i in 0..half {
                    for idx in [&lo, &hi] {
                        let r = vreg(ty);
                        body.push(Llc::VSet(
                            r,
                            Vlv::Shuffle(
                                Box::new(Vlv::Reg(rows[i])),
                                Box::new(Vlv::Reg(rows[i + half])),
                                idx.clone(),
                            ),
                        ));
                        next.push(r);
                    }
                }
                rows = next;
            }
            // Vector `i` now holds step `q·W + i` of the `W` columns.
            for (i, &r) in rows.iter().enumerate() {
                body.push(Llc::VStore {
                    tn: self.bufs.bp.clone(),
                    idcs: vec![jj, lin(&[(q, w)], i)?, AxisIndex::Fixed(v * w)],
                    value: Vlv::Reg(r),
                });
            }
        }
        let mut out = vec![Llc::for_loop(q, 0, blocks as i64 - 1, Llc::Seq(body))];
        if rest > 0 {
            let value = subst(
                &con.y,
                &[
                    (con.n.0, scaled(jg, b.nr, &[(c, 1)], 0)?),
                    (con.k.0, scaled(blk.kb, b.kc, &[(kx, 1)], blocks * w)?),
                ],
            )?;
            out.push(Llc::for_loop(
                kx,
                0,
                rest as i64 - 1,
                Llc::for_loop(
                    c,
                    0,
                    b.nr as i64 - 1,
                    Llc::Set {
                        tn: self.bufs.bp.clone(),
                        idcs: vec![jj, lin(&[(kx, 1)], blocks * w)?, AxisIndex::Iterator(c)],
                        value,
                    },
                ),
            ));
        }
        Some(Some(Llc::Seq(out)))
    }

    /// The tiles of row panel `ir` (`rows` valid rows, packed in `ap`) over the run's panels.
    fn tiles(&self, run: &Run, ir: AxisIndex, rows: usize, blk: Block, mode: Mode) -> Option<Llc> {
        let mut out = vec![];
        if run.full > 0 {
            let jj = Symbol::fresh();
            let jj_ix = AxisIndex::Iterator(jj);
            let jg = run.panel(jj_ix, self.b.ncp)?;
            let t = self.kernel(ir, jj_ix, jg, rows, self.b.nr, blk, mode)?;
            out.push(Llc::for_loop(jj, 0, run.full as i64 - 1, t));
        }
        if run.edge > 0 {
            let jj_ix = AxisIndex::Fixed(run.full);
            let jg = run.panel(jj_ix, self.b.ncp)?;
            out.push(self.kernel(ir, jj_ix, jg, rows, run.edge, blk, mode)?);
        }
        Some(Llc::Seq(out))
    }

    /// The steps of one reduction block in bfloat16 pairs (see [`Blocking::pairs`]): for
    /// every pair of steps, `NR / W` loads of 32 bfloat16 values from `bp` and, per row, one
    /// broadcast of the row's pair from `ap` and `NR / W` dot products into the accumulators.
    fn pairs_steps(&self, acc: &[Vec<VReg>], jj: AxisIndex, blk: Block) -> Llc {
        let (b, bufs) = (&self.b, &self.bufs);
        let w = b.ty.lanes;
        let pair = VType {
            prec: Prec::Bfloat16,
            lanes: 2,
        };
        let wide = VType {
            prec: Prec::Bfloat16,
            lanes: 2 * w,
        };
        let kp = Symbol::fresh();
        let kp_ix = AxisIndex::Iterator(kp);
        let bv: Vec<VReg> = (0..b.nv).map(|_| vreg(wide)).collect();
        let a = vreg(wide);
        let mut step = vec![];
        for (v, &r) in bv.iter().enumerate() {
            step.push(Llc::VSet(
                r,
                Vlv::Load(
                    wide,
                    bufs.bp.clone(),
                    vec![jj, kp_ix, AxisIndex::Fixed(v * w), AxisIndex::Fixed(0)],
                ),
            ));
        }
        for (row, accs) in acc.iter().enumerate() {
            step.push(Llc::VSet(
                a,
                Vlv::Repeat(
                    Box::new(Vlv::Load(
                        pair,
                        bufs.ap.clone(),
                        vec![kp_ix, AxisIndex::Fixed(row), AxisIndex::Fixed(0)],
                    )),
                    w,
                ),
            ));
            for (v, &r) in accs.iter().enumerate() {
                step.push(Llc::VSet(
                    r,
                    Vlv::DotPairs(
                        Box::new(Vlv::Reg(r)),
                        Box::new(Vlv::Reg(a)),
                        Box::new(Vlv::Reg(bv[v])),
                    ),
                ));
            }
        }
        Llc::for_loop(kp, 0, blk.len.div_ceil(2) as i64 - 1, Llc::Seq(step))
    }

    /// Multiplies the packed rows by local panel `jj` of `bp` (panel `jg` of the result) for
    /// one reduction block into vector accumulators, then adds (or stores) the `rows × cols`
    /// valid part to the result.
    #[allow(clippy::too_many_arguments)]
    fn kernel(
        &self,
        ir: AxisIndex,
        jj: AxisIndex,
        jg: AxisIndex,
        rows: usize,
        cols: usize,
        blk: Block,
        mode: Mode,
    ) -> Option<Llc> {
        let (con, b, bufs) = (self.con, &self.b, &self.bufs);
        let ty = b.ty;
        let w = ty.lanes;
        let kx = Symbol::fresh();
        let kx_ix = AxisIndex::Iterator(kx);
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
        if b.pairs {
            stmts.push(self.pairs_steps(&acc, jj, blk));
        } else {
            let mut step = vec![];
            for (v, &r) in bv.iter().enumerate() {
                step.push(Llc::VSet(
                    r,
                    Vlv::Load(
                        ty,
                        bufs.bp.clone(),
                        vec![jj, kx_ix, AxisIndex::Fixed(v * w)],
                    ),
                ));
            }
            for (row, accs) in acc.iter().enumerate() {
                step.push(Llc::VSet(
                    a,
                    Vlv::Splat(ty, Box::new(self.a_value(ir, row, kx, blk)?)),
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
            stmts.push(Llc::for_loop(kx, 0, blk.len as i64 - 1, Llc::Seq(step)));
        }
        // The result's cell of tile element (row, col): m = ir*mr + row, n = jg*nr + col.
        let cell =
            |row: AxisIndex, col: AxisIndex| subst_idcs(&con.pc, &[(con.m.0, row), (con.n.0, col)]);
        let combine = |old: Vlv, acc: Vlv| match mode {
            Mode::Accumulate => Vlv::Binop(Binop::Add, Box::new(old), Box::new(acc)),
            Mode::Store => Vlv::Binop(Binop::Add, Box::new(acc), Box::new(Vlv::Zero(ty))),
        };
        // Whole vectors go to `c` directly where its elements are the lanes (or, for integers,
        // have their width: the lanes' bit patterns are the wrapped sums); narrower integers
        // go through the tile buffer, wrapped into their width by the scalar store.
        if cols == b.nr && ty.fits_memory_of(con.c.prec()) {
            for (row, accs) in acc.iter().enumerate() {
                for (v, &r) in accs.iter().enumerate() {
                    let idcs = cell(
                        scaled(ir, b.mr, &[], con.m_from + row)?,
                        scaled(jg, b.nr, &[], v * w)?,
                    )?;
                    stmts.push(Llc::VStore {
                        tn: con.c.clone(),
                        idcs: idcs.clone(),
                        value: combine(Vlv::Load(ty, con.c.clone(), idcs), Vlv::Reg(r)),
                    });
                }
            }
        } else {
            // The right edge (and narrow integers): through the tile buffer, then element by
            // element.
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
                scaled(ir, b.mr, &[(rr, 1)], con.m_from)?,
                scaled(jg, b.nr, &[(cc, 1)], 0)?,
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
}
