//! The parallel pass, the optimizer's last: marks the loops whose iterations are independent
//! as parallel regions ([`Llc::Parallel`]), which a device's thread team runs in chunks of
//! iterations (see `docs/performance.md`).
//!
//! The pass walks each loop nest from the outside in and takes the first loop that does
//! enough work ([`MIN_REGION_WORK`], so that starting the team pays) and whose iterations
//! are independent ([`crate::loops::analyze`]): each iteration writes cells no other touches,
//! or local arrays it writes before reading them (each thread gets its own copy). Rows of an
//! elementwise chain or a normalization, column blocks of the packed GEMM kernels, output
//! rows of a convolution are such loops.
//!
//! A loop whose only obstacle is a reduction into one cell (`s = s + e` over the loop, a
//! full sum) is split into blocks: a parallel loop over blocks computes one partial result
//! each (in the loop's order within the block), and a plain loop then combines the partials
//! in block order. The blocks depend only on the loop's size and work, never on the number of
//! threads, so every thread count computes the same bits.
//!
//! The code is the same for every number of threads: with one, the regions run inline.

use crate::ir::tnode::provenance;
use crate::ir::{AxisIndex, Binop, MemoryMode, Symbol, Tnode};
use crate::loops::{
    analyze, parallel_work, Accumulator, Independence, Llc, Llv, ParallelLoop, Regions, Vlv,
};
use std::collections::HashSet;

/// The least work (see [`parallel_work`]) for which a loop becomes a parallel region, by
/// default ([`super::Settings::min_region_work`]); a block of a split reduction aims at a
/// quarter of it. About 5 µs of vector code on one core: a region costs the caller around a
/// microsecond (publishing it, the helpers' cache misses on its inputs, the join), and
/// regions of a quarter of this (two 2 µs tap kernels a step) made the default moons job on
/// one device slower with its team of two threads than with one (10.6M-15.8M samples/s, and
/// 16.5M-19.9M without the regions).
pub const MIN_REGION_WORK: u64 = 1 << 18;
/// The least work of the chunk a thread takes at once (the region's grain).
pub const MIN_CHUNK_WORK: u64 = 1 << 14;
/// The most blocks a reduction is split into.
const MAX_BLOCKS: i64 = 64;
/// How much more a copied element weighs than an operation (see [`region_work`]).
const COPY_WEIGHT: u64 = 4;

/// The work of a loop as the pass weighs it: [`parallel_work`], times [`COPY_WEIGHT`] when
/// it packs a GEMM kernel's operands: every statement in it copies one element (or vector)
/// of a tensor into the kernel's packed buffers. A copy counts one operation per element,
/// where the arithmetic of a product counts five per multiply-add, yet it is the slower of
/// the two per element: it moves the data (from memory, often along a stride) that the
/// arithmetic then reuses from registers. A block of 256 steps of 768 columns (196,608
/// copies, under the threshold by their plain count) took 37 µs on one core of the AVX2 VM,
/// in series with the regions of its row panels, whose 201 MFLOP would take about 84 µs on 16
/// cores of 150 GFLOP/s: a 512×3072×768 product would spend 30% of its time packing on one
/// core. Weighed, it is a region of its own. Other copies keep their plain count: weighing
/// every copy (the unpacking of a model's parameters from its flat buffer, say) doubled the
/// regions of the big moons job's routines for no gain in speed, and its compile took 50%
/// longer.
fn region_work(c: &Llc) -> u64 {
    fn packs(tn: &Tnode) -> bool {
        tn.declared_memory_mode() == Some((MemoryMode::Local, provenance::KERNEL))
    }
    fn copies_only(c: &Llc) -> bool {
        match c {
            Llc::Seq(v) => v.iter().all(copies_only),
            Llc::For { body, .. } | Llc::If { body, .. } => copies_only(body),
            Llc::Set { tn, value, .. } => packs(tn) && matches!(value, Llv::Get(..)),
            Llc::VStore { tn, value, .. } => packs(tn) && matches!(value, Vlv::Load(..)),
            Llc::Comment(_) | Llc::Noop | Llc::Prefetch { .. } => true,
            _ => false,
        }
    }
    let work = parallel_work(c);
    if copies_only(c) {
        work.saturating_mul(COPY_WEIGHT)
    } else {
        work
    }
}

/// The code with its parallel regions, and the local arrays the pass added (the partial
/// results of split reductions, written whole before they are read).
pub struct Parallelized {
    pub code: Llc,
    pub locals: Vec<Tnode>,
}

/// Marks the parallel regions of `code` (loops doing at least `min_work`), privatizing only
/// arrays of `locals` (the routine's local arrays), for a machine of `cores` cores (see
/// [`balance`]).
pub fn parallelize(
    code: Llc,
    locals: &HashSet<Tnode>,
    min_work: u64,
    cores: usize,
) -> Parallelized {
    let mut decisions: Vec<(&Llc, Llc)> = vec![];
    let mut new_locals = vec![];
    let mut regions = Regions::default();
    let mut f = Finder {
        root: &code,
        locals,
        min_work,
        cores: cores.max(1),
        regions: &mut regions,
        out: &mut decisions,
        new_locals: &mut new_locals,
    };
    f.find(&code);
    if decisions.is_empty() {
        return Parallelized {
            code,
            locals: vec![],
        };
    }
    let rebuilt = crate::loops::replace_statements(&code, &decisions);
    Parallelized {
        code: rebuilt,
        locals: new_locals,
    }
}

/// The walk looking for regions.
struct Finder<'a, 'r> {
    root: &'a Llc,
    locals: &'r HashSet<Tnode>,
    min_work: u64,
    cores: usize,
    regions: &'r mut Regions<'a>,
    out: &'r mut Vec<(&'a Llc, Llc)>,
    new_locals: &'r mut Vec<Tnode>,
}

impl<'a> Finder<'a, '_> {
    fn find(&mut self, c: &'a Llc) {
        match c {
            Llc::Seq(v) => v.iter().for_each(|c| self.find(c)),
            Llc::For {
                index,
                from,
                to,
                body,
                ..
            } => {
                let n = to - from + 1;
                let work = region_work(c);
                if n >= 2 && work >= self.min_work {
                    if let Ok(ind) = analyze(self.root, c, self.locals, self.regions) {
                        if ind.accumulators.is_empty() && self.inner_balances_better(n, body) {
                            return;
                        }
                        let replaced = if ind.accumulators.is_empty() {
                            let per = (work / n as u64).max(1);
                            Some(Llc::Parallel(Box::new(ParallelLoop {
                                index: *index,
                                from: *from,
                                to: *to,
                                body: (**body).clone(),
                                private: ind.private.clone(),
                                grain: MIN_CHUNK_WORK.div_ceil(per).max(1) as i64,
                            })))
                        } else {
                            let blocks = blocking(n, work, self.min_work / 4);
                            blocks.and_then(|b| {
                                split_reduction(*index, (*from, n), body, &ind, b, self.new_locals)
                            })
                        };
                        if let Some(r) = replaced {
                            for t in &ind.private {
                                self.regions.add(t, c);
                            }
                            self.out.push((c, r));
                            return;
                        }
                    }
                }
                self.find(body)
            }
            Llc::If { body, .. } | Llc::Lookup { body, .. } => self.find(body),
            _ => {}
        }
    }
}

impl<'a> Finder<'a, '_> {
    /// For an independent loop of `n` iterations that the cores would share unevenly
    /// (3 column blocks on 2 cores: one core idles a third of the time), whether the regions
    /// found inside its body share their work better: then they are taken instead (and
    /// `true` is returned). They must cover nearly all of the loop's work, since what is
    /// outside them (the packing of a column block) then runs on one thread, and start
    /// seldom: at least 16 times [`MIN_REGION_WORK`]'s work each time (the 126 starts of
    /// two column blocks each that a 7×7×512 convolution's taps would take made it 30%
    /// slower on two threads than its 7 output rows).
    fn inner_balances_better(&mut self, n: i64, body: &'a Llc) -> bool {
        let outer = balance(n, self.cores);
        if outer >= 0.9 {
            return false;
        }
        let mut regions = self.regions.clone();
        let (mut out, mut new_locals) = (vec![], vec![]);
        let mut inner = Finder {
            root: self.root,
            locals: self.locals,
            min_work: self.min_work,
            cores: self.cores,
            regions: &mut regions,
            out: &mut out,
            new_locals: &mut new_locals,
        };
        inner.find(body);
        let mut covered = 0u64;
        let mut balanced = 0.0f64;
        let mut starts = 0u64;
        for (l, _) in &out {
            let (runs, work) = (runs_in(body, l), region_work(l));
            starts = starts.saturating_add(runs);
            let m = match l {
                Llc::For { from, to, .. } => to - from + 1,
                _ => 1,
            };
            covered = covered.saturating_add(runs.saturating_mul(work));
            balanced += (runs.saturating_mul(work)) as f64 * balance(m, self.cores);
        }
        let total = region_work(body).max(1);
        let better = !out.is_empty()
            && covered as f64 >= 0.9 * total as f64
            && covered / starts.max(1) >= 16 * self.min_work
            && balanced / covered.max(1) as f64 >= outer + 0.1;
        if better {
            *self.regions = regions;
            self.out.extend(out);
            self.new_locals.extend(new_locals);
        }
        better
    }
}

/// The share of `cores` cores' time that `n` equal iterations keep busy when each core
/// takes the next iteration as it finishes one: `n / (cores · ⌈n / cores⌉)`.
fn balance(n: i64, cores: usize) -> f64 {
    let (n, p) = (n.max(1) as f64, cores.max(1) as f64);
    n / (p * (n / p).ceil())
}

/// How many times `target` (a loop inside `c`) runs per run of `c`: the product of the trip
/// counts of the loops around it.
fn runs_in(c: &Llc, target: &Llc) -> u64 {
    fn go(c: &Llc, target: &Llc, mult: u64) -> Option<u64> {
        if std::ptr::eq(c, target) {
            return Some(mult);
        }
        match c {
            Llc::Seq(v) => v.iter().find_map(|c| go(c, target, mult)),
            Llc::For { from, to, body, .. } => go(
                body,
                target,
                mult.saturating_mul((to - from + 1).max(0) as u64),
            ),
            Llc::If { body, .. } | Llc::Lookup { body, .. } => go(body, target, mult),
            _ => None,
        }
    }
    go(c, target, 1).unwrap_or(0)
}

/// The blocks of a reduction loop of `n` iterations doing `work`, each aiming at
/// `block_work`: `(block size, blocks)`, from the loop alone; `None` when fewer than two
/// blocks are worth it.
fn blocking(n: i64, work: u64, block_work: u64) -> Option<(i64, i64)> {
    let per = (work / n.max(1) as u64).max(1);
    let mut size = (block_work.max(1).div_ceil(per) as i64).max(1);
    let mut blocks = (n + size - 1) / size;
    if blocks > MAX_BLOCKS {
        size = (n + MAX_BLOCKS - 1) / MAX_BLOCKS;
        blocks = (n + size - 1) / size;
    }
    (blocks >= 2).then_some((size, blocks))
}

/// The loop `for index in from.. { body }` (of `n` iterations), whose only obstacle to running
/// in parallel is reducing into `ind.accumulators`, split into `blocks` blocks of `size`
/// iterations (the last may have fewer: a guard skips the rest) run by a parallel loop,
/// each reducing into its own partial result (starting from the neutral value), followed by
/// a loop combining the partial results into the accumulators in block order.
fn split_reduction(
    index: Symbol,
    (from, n): (i64, i64),
    body: &Llc,
    ind: &Independence,
    (size, blocks): (i64, i64),
    new_locals: &mut Vec<Tnode>,
) -> Option<Llc> {
    let (b, ii, c) = (Symbol::fresh(), Symbol::fresh(), Symbol::fresh());
    let mut partials = vec![];
    for a in &ind.accumulators {
        let label: Vec<String> = a.tn.label().to_vec();
        let mut label: Vec<&str> = label.iter().map(String::as_str).collect();
        label.push("partial");
        let p = Tnode::builder(&label, &[blocks as usize], a.tn.prec())
            .memory_with_provenance(MemoryMode::Local, provenance::PARALLEL)
            .build()
            .ok()?;
        partials.push(p);
    }
    let at = |s: Symbol| vec![AxisIndex::Iterator(s)];
    // Iteration `from + b·size + ii` of the loop.
    let iteration = AxisIndex::affine(&[(b, size as usize), (ii, 1)], from)?;
    let renamed = crate::loops::map_indices(body, &mut |ix| ix.substitute(index, iteration))?;
    let renamed = redirect(&renamed, &ind.accumulators, &partials, b);
    let guarded = if blocks * size == n {
        renamed
    } else {
        Llc::If {
            guards: vec![(
                AxisIndex::affine(&[(b, size as usize), (ii, 1)], 0)?,
                n as usize,
            )],
            body: Box::new(renamed),
        }
    };
    let mut block: Vec<Llc> = ind
        .accumulators
        .iter()
        .zip(&partials)
        .map(|(a, p)| Llc::Set {
            tn: p.clone(),
            idcs: at(b),
            value: Llv::Constant(start_of(a.op)),
        })
        .collect();
    block.push(Llc::for_loop(ii, 0, size - 1, guarded));
    let region = Llc::Parallel(Box::new(ParallelLoop {
        index: b,
        from: 0,
        to: blocks - 1,
        body: Llc::Seq(block),
        private: ind.private.clone(),
        grain: 1,
    }));
    let combine: Vec<Llc> = ind
        .accumulators
        .iter()
        .zip(&partials)
        .map(|(a, p)| Llc::Set {
            tn: a.tn.clone(),
            idcs: a.idcs.clone(),
            value: Llv::Binop(
                combine_of(a.op),
                Box::new(Llv::Get(a.tn.clone(), a.idcs.clone())),
                Box::new(Llv::Get(p.clone(), at(c))),
            ),
        })
        .collect();
    new_locals.extend(partials);
    Some(Llc::Seq(vec![
        Llc::Comment(format!(
            "a reduction split into {blocks} blocks of {size} iterations"
        )),
        region,
        Llc::for_loop(c, 0, blocks - 1, Llc::Seq(combine)),
    ]))
}

/// The value a partial result starts from.
fn start_of(op: Binop) -> f64 {
    match op {
        Binop::Sub => 0.0,
        op => op.neutral(),
    }
}

/// How partial results combine into the accumulator (`acc - e1 - e2` is `acc + p` where
/// `p = 0 - e1 - e2`).
fn combine_of(op: Binop) -> Binop {
    match op {
        Binop::Sub => Binop::Add,
        op => op,
    }
}

/// `c` with every update `T[I] = T[I] ⊕ e` of an accumulator turned into `P[b] = P[b] ⊕ e`
/// of its partial result.
fn redirect(c: &Llc, accs: &[Accumulator], partials: &[Tnode], b: Symbol) -> Llc {
    let go = |c: &Llc| redirect(c, accs, partials, b);
    if let Some(block) = crate::loops::map_block(c, &mut |c| go(c)) {
        return block;
    }
    match c {
        Llc::Set {
            tn,
            idcs,
            value: Llv::Binop(op, a, e),
        } => match accs.iter().position(|x| x.tn == *tn && x.idcs == *idcs) {
            Some(k) => {
                let p = &partials[k];
                let cell = vec![AxisIndex::Iterator(b)];
                let _ = a;
                Llc::Set {
                    tn: p.clone(),
                    idcs: cell.clone(),
                    value: Llv::Binop(*op, Box::new(Llv::Get(p.clone(), cell)), e.clone()),
                }
            }
            None => c.clone(),
        },
        c => c.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_depend_on_the_loop_alone() {
        // 4096 rows of 4096 additions: 16 rows would do, 64 blocks at most.
        let w = MIN_REGION_WORK / 4;
        assert_eq!(blocking(4096, 4096 * 4097, w), Some((64, 64)));
        // Little work per iteration: blocks of the block work.
        assert_eq!(blocking(1 << 20, 1 << 20, w), Some((65536, 16)));
        assert_eq!(blocking(100_000, 100_000, w), Some((65536, 2)));
        // Too many blocks of the block work: 64 larger ones.
        assert_eq!(blocking(1 << 23, 1 << 23, w), Some((131072, 64)));
        // Too little for two blocks.
        assert_eq!(blocking(1000, 1000, w), None);
        // Any work is enough: blocks of one iteration (64 at most).
        assert_eq!(blocking(5, 5, 0), Some((1, 5)));
    }
}
