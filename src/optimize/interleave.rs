//! Interleaving the iterations of short row loops.
//!
//! A row of a softmax over 128 floats is a chain of dependent steps: the maximum (vector
//! maxima, then a tree of shuffles combining the lanes), `exp` of the row less it, the sum
//! (another tree), the division by it. Each step waits for the one before, and a row does
//! too little work for the processor to run the next row's steps meanwhile: its
//! instructions do not fit in the reorder window beside the current row's. This pass runs
//! `u` rows side by side instead:
//!
//! ```text
//! for i in 0..n { s1(i); s2(i); s3(i) }   ==>   for p in 0..n/u {
//!                                                 s1(u·p); s1'(u·p+1); ...
//!                                                 s2(u·p); s2'(u·p+1); ...
//!                                                 s3(u·p); s3'(u·p+1); ...
//!                                               }
//!                                               for i in u·(n/u)..n { s1''(i); s2''(i); s3''(i) }
//! ```
//!
//! where each copy (primed) has its own scratch arrays (the row locals the loop writes before
//! it reads them in every iteration) and its own vector variables. It applies to loops whose
//! iterations are independent ([`crate::loops::analyze`], as for parallel regions), whose
//! body has inner loops and combines vector lanes (a row reduction), and does at most
//! [`MAX_WORK`] per iteration. Every copy computes what the original iteration computes, on
//! the same values in the same order, so the results are bit-identical.
//!
//! Measured on the Sapphire Rapids VM, a softmax of 16384×128 floats on one core: 1.24 ms,
//! 0.86 ms with two rows side by side and 0.79 ms with four (the C of the routine, edited by
//! hand, in a harness pinned to one core; GCC 12, `-O3 -march=native`). Through the pass,
//! `arrayjit bench --threads 1 --runs 30`: 16384×128 1.38 → 0.82 ms, 4096×100 0.40 → 0.23,
//! 3000×77 0.28 → 0.16 (ONNX Runtime: 0.81, 0.23, 0.16).
//!
//! As many rows go side by side as the target's vector registers hold the live variables of
//! (`u · live + 4 ≤ registers`, at most [`MAX_COPIES`]): 4 for a softmax row on AVX-512's 32
//! registers, 2 on AVX2's 16.

use crate::ir::tnode::provenance;
use crate::ir::{AxisIndex, MemoryMode, Tnode};
use crate::loops::{
    analyze, map_indices, parallel_work, rename, visit_llc, visit_vectors, Llc, Regions, VReg, Vlv,
};
use crate::target::VectorTarget;
use std::collections::{HashMap, HashSet};

/// The most work ([`parallel_work`]) of one iteration of an interleaved loop: softmax rows of
/// up to 512 floats (a work of 7,944). Longer rows keep the processor busy on their own, and
/// interleaving them made them slower: on one core of the Sapphire Rapids VM (`arrayjit
/// bench --runs 20`, two rounds, without and with), softmax 8192×256 0.98 → 0.77 ms, 4096×512
/// 0.82 → 0.76, but 2048×768 0.57 → 0.59, 4096×1024 1.45 → 1.63; layer norm 16384×128 0.593
/// both ways, 4096×512 0.59 → 0.61 (a work of about 11,000), 4096×1024 1.20 → 1.43.
pub const MAX_WORK: u64 = 1 << 13;
/// The most iterations run side by side.
const MAX_COPIES: usize = 4;

/// The code with its short row loops interleaved, and the scratch arrays of the copies, each
/// with the array it copies.
pub struct Interleaved {
    pub code: Llc,
    pub locals: Vec<(Tnode, Tnode)>,
}

/// Interleaves the short row loops of `code` (see the module documentation), whose local
/// arrays are `locals`, for `target`'s vector registers.
pub fn interleave(code: Llc, locals: &HashSet<Tnode>, target: &VectorTarget) -> Interleaved {
    let mut decisions: Vec<(&Llc, Llc)> = vec![];
    let mut copies = vec![];
    find(&code, &code, locals, target, &mut decisions, &mut copies);
    if decisions.is_empty() {
        return Interleaved {
            code,
            locals: vec![],
        };
    }
    let code = crate::loops::replace_statements(&code, &decisions);
    Interleaved {
        code,
        locals: copies,
    }
}

/// Looks for loops to interleave, from the outside in (a loop interleaved is not looked
/// into).
fn find<'a>(
    root: &'a Llc,
    c: &'a Llc,
    locals: &HashSet<Tnode>,
    target: &VectorTarget,
    out: &mut Vec<(&'a Llc, Llc)>,
    copies: &mut Vec<(Tnode, Tnode)>,
) {
    match c {
        Llc::Seq(v) => v
            .iter()
            .for_each(|c| find(root, c, locals, target, out, copies)),
        Llc::For { body, .. } => {
            if let Some(r) = interleaved(root, c, locals, target, copies) {
                out.push((c, r));
            } else {
                find(root, body, locals, target, out, copies)
            }
        }
        Llc::If { body, .. } | Llc::Lookup { body, .. } => {
            find(root, body, locals, target, out, copies)
        }
        _ => {}
    }
}

/// The loop `lp` interleaved, if it qualifies (module documentation).
fn interleaved(
    root: &Llc,
    lp: &Llc,
    locals: &HashSet<Tnode>,
    target: &VectorTarget,
    copies: &mut Vec<(Tnode, Tnode)>,
) -> Option<Llc> {
    let Llc::For {
        index,
        from,
        to,
        body,
        trace_it,
    } = lp
    else {
        return None;
    };
    let n = to - from + 1;
    let (mut inner, mut other) = (false, false);
    visit_llc(body, &mut |c| {
        inner |= matches!(c, Llc::For { .. });
        other |= matches!(c, Llc::Parallel(_) | Llc::SetLocal(..));
    });
    let mut combines = false;
    visit_vectors(body, &mut |v| combines |= matches!(v, Vlv::Shuffle(..)));
    if !inner || other || !combines || parallel_work(body) > MAX_WORK {
        return None;
    }
    // The vector variables each copy needs its own of: those the body assigns.
    let mut regs: Vec<VReg> = vec![];
    visit_llc(body, &mut |c| {
        if let Llc::VSet(r, _) = c {
            if !regs.contains(r) {
                regs.push(*r);
            }
        }
    });
    let live = pressure(&body.as_ref().clone().flatten());
    let u = (2..=MAX_COPIES)
        .rev()
        .find(|&u| u * live + 4 <= target.registers && n >= 2 * u as i64)?;
    let ind = analyze(root, lp, locals, &Regions::default()).ok()?;
    if !ind.accumulators.is_empty() {
        return None;
    }
    // Copy `k` of the body for iteration `at`: copy 0 keeps the arrays and variables.
    let mut made = vec![];
    let mut copy = |k: usize, at: AxisIndex| -> Option<Vec<Llc>> {
        let b = map_indices(body, &mut |ix| ix.substitute(*index, at))?;
        if k == 0 {
            return Some(b.flatten());
        }
        let mut nodes = vec![];
        for t in &ind.private {
            let c = scratch_copy(t, k)?;
            made.push((c.clone(), t.clone()));
            nodes.push((t.clone(), c));
        }
        let map: HashMap<u32, VReg> = regs
            .iter()
            .map(|r| (r.id, super::gemm::vreg(r.ty)))
            .collect();
        Some(rename(&b, &nodes, &map)?.flatten())
    };
    let uu = u as i64;
    let groups = n / uu;
    let p = crate::ir::Symbol::fresh();
    let mut bodies = vec![];
    for k in 0..u {
        let at = AxisIndex::affine(&[(p, u)], from + k as i64)?;
        bodies.push(copy(k, at)?);
    }
    let len = bodies[0].len();
    if bodies.iter().any(|b| b.len() != len) {
        return None;
    }
    let mut jammed = Vec::with_capacity(len * u);
    for j in 0..len {
        for b in &bodies {
            jammed.push(b[j].clone());
        }
    }
    let mut out = vec![Llc::For {
        index: p,
        from: 0,
        to: groups - 1,
        body: Box::new(Llc::Seq(jammed)),
        trace_it: *trace_it,
    }];
    if groups * uu < n {
        // The rest, with arrays and variables of its own (a loop sharing them with the
        // interleaved one could not become a parallel region after it).
        let r = crate::ir::Symbol::fresh();
        out.push(Llc::For {
            index: r,
            from: from + groups * uu,
            to: *to,
            body: Box::new(Llc::Seq(copy(u, AxisIndex::Iterator(r))?)),
            trace_it: *trace_it,
        });
    }
    copies.extend(made);
    Some(Llc::Seq(out))
}

/// The most vector variables live at once over `stmts` (a variable is live from the first
/// statement that mentions it to the last): the registers one copy of a row body needs.
fn pressure(stmts: &[Llc]) -> usize {
    let mut span: HashMap<u32, (usize, usize)> = HashMap::new();
    for (i, c) in stmts.iter().enumerate() {
        let mut mark = |r: &VReg| {
            let e = span.entry(r.id).or_insert((i, i));
            e.1 = i;
        };
        visit_llc(c, &mut |c| {
            if let Llc::VSet(r, _) = c {
                mark(r)
            }
        });
        visit_vectors(c, &mut |v| {
            if let Vlv::Reg(r) = v {
                mark(r)
            }
        });
    }
    (0..stmts.len())
        .map(|i| span.values().filter(|(a, b)| *a <= i && i <= *b).count())
        .max()
        .unwrap_or(0)
}

/// A scratch array like `t` for copy `k` of a loop body.
fn scratch_copy(t: &Tnode, k: usize) -> Option<Tnode> {
    let mut label: Vec<String> = t.label().to_vec();
    label.push(format!("copy{k}"));
    let label: Vec<&str> = label.iter().map(String::as_str).collect();
    let prov = t
        .declared_memory_mode()
        .map_or(provenance::KERNEL, |(_, p)| p);
    Tnode::builder(&label, t.dims(), t.prec())
        .memory_with_provenance(MemoryMode::Local, prov)
        .build()
        .ok()
}
