//! Parallel regions ([`Llc::Parallel`]) in C: each becomes a function running a chunk of
//! the loop's iterations, `static int NAME_rK(void *ctx, int64_t lo, int64_t hi, int64_t
//! tid)`, with a context struct `NAME_rK_ctx` holding what the chunk needs from the
//! enclosing function (the team, the pointers of the tensors it shares, the merge buffer,
//! the values of the enclosing loops' iterators and static indices). The enclosing function
//! fills the struct and calls `aj_parallel(aj_team, NAME_rK, &ctx, from, to, grain)` (runtime
//! header), which runs the chunks on the routine's thread team, or inline with one thread,
//! and returns the first non-zero status of a chunk; the function then returns it.
//!
//! Private arrays are the chunk function's own: local arrays on its stack (within the same
//! budget as the enclosing function's), larger ones in the calling thread's scratch memory
//! (`aj_scratch(team, tid, bytes)`, one block per chunk, 64-byte aligned pieces). They need
//! no zeroing: every iteration writes them before reading them (the region's invariant).
//!
//! Bounds-checked code: the chunk runs in `NAME_rK_run` with a record of its own; on an
//! out-of-bounds access the chunk stops and the first chunk to fail (an atomic claim in the
//! context) copies its record into the routine's, so the error is reported with the
//! offending indices whatever thread met it. Trace logs keep the plain loop (the stores'
//! order is the log's).

use super::{sanitize_comment, Uses, Writer, LOCAL_ARRAY_ALIGN, MAX_FRAME_BYTES, MAX_STACK_BYTES};
use crate::ir::{Symbol, Tnode};
use crate::loops::{visit_llc, Llc, ParallelLoop, VReg};
use std::collections::HashSet;
use std::fmt::Write;

impl Uses {
    /// What statements use outside the private arrays of their parallel regions (with
    /// `regions` false, everything: the regions are written as plain loops).
    pub(super) fn shared_of(stmts: &[Llc], regions: bool) -> Uses {
        fn go(c: &Llc, regions: bool, u: &mut Uses) {
            let merge = |u: &mut Uses, v: Uses| {
                u.nodes.extend(v.nodes);
                u.symbols.extend(v.symbols);
                u.merge |= v.merge;
            };
            match c {
                Llc::Seq(v) => v.iter().for_each(|c| go(c, regions, u)),
                Llc::For { body, .. } => go(body, regions, u),
                Llc::Parallel(p) if regions => {
                    let mut inner = Uses::of(std::slice::from_ref(&p.body));
                    for t in &p.private {
                        inner.nodes.remove(t);
                    }
                    merge(u, inner);
                }
                Llc::Parallel(p) => go(&p.body, regions, u),
                Llc::If { guards, body } => {
                    for (ix, _) in guards {
                        u.symbols.extend(ix.symbols());
                    }
                    go(body, regions, u)
                }
                Llc::Lookup { tn, idcs, body, .. } => {
                    u.nodes.insert(tn.clone());
                    for ix in idcs {
                        u.symbols.extend(ix.symbols());
                    }
                    go(body, regions, u)
                }
                c => merge(u, Uses::of(std::slice::from_ref(c))),
            }
        }
        let mut u = Uses::default();
        for c in stmts {
            go(c, regions, &mut u);
        }
        u
    }
}

/// The vector variables assigned in `c` outside parallel regions (everywhere, with `regions`
/// false), added to `out` in order of first assignment.
pub(super) fn vregs_outside_regions(c: &Llc, regions: bool, out: &mut Vec<VReg>) {
    match c {
        Llc::Parallel(_) if regions => {}
        Llc::Seq(v) => v
            .iter()
            .for_each(|c| vregs_outside_regions(c, regions, out)),
        Llc::For { body, .. } | Llc::If { body, .. } | Llc::Lookup { body, .. } => {
            vregs_outside_regions(body, regions, out)
        }
        Llc::Parallel(p) => vregs_outside_regions(&p.body, regions, out),
        Llc::VSet(r, _) if !out.contains(r) => out.push(*r),
        _ => {}
    }
}

/// The symbols bound inside `c` (loop iterators, lookups).
fn bound_symbols(c: &Llc) -> HashSet<Symbol> {
    let mut out = HashSet::new();
    visit_llc(c, &mut |c| match c {
        Llc::For { index, .. } => {
            out.insert(*index);
        }
        Llc::Parallel(p) => {
            out.insert(p.index);
        }
        Llc::Lookup { symbol, .. } => {
            out.insert(*symbol);
        }
        _ => {}
    });
    out
}

/// The byte offsets of large private arrays in a chunk's scratch block are multiples of this
/// (a cache line: threads' blocks never share one, and vectors stay aligned).
const SCRATCH_ALIGN: usize = 64;

impl Writer {
    /// Writes the function of parallel region `p` (into `self.regions`) and, into `out`, the
    /// statement running it on the team.
    pub(super) fn region(&mut self, p: &ParallelLoop, indent: usize, out: &mut String) {
        let pad = "  ".repeat(indent);
        self.region_count += 1;
        let name = format!("{}_r{}", self.part_name, self.region_count);
        let used = Uses::of(std::slice::from_ref(&p.body));
        let bound = bound_symbols(&p.body);
        let mut nodes: Vec<Tnode> = used.nodes.iter().cloned().collect();
        nodes.sort();
        let (private, shared): (Vec<Tnode>, Vec<Tnode>) =
            nodes.into_iter().partition(|t| p.private.contains(t));
        let mut free: Vec<Symbol> = used
            .symbols
            .iter()
            .copied()
            .filter(|s| *s != p.index && !bound.contains(s))
            .collect();
        free.sort();
        // The context: what the chunk takes from the enclosing function.
        let mut fields = String::from("  const aj_team_t *aj_team;\n");
        let mut init = vec![".aj_team = aj_team".to_string()];
        let mut loads =
            String::from("  const aj_team_t *aj_team = aj_c->aj_team;\n  (void)aj_team;\n");
        let merge = used.merge.then_some(self.merge_ctype).flatten();
        if let Some(ct) = merge {
            let _ = writeln!(fields, "  const {ct} *merge_buffer;");
            init.push(".merge_buffer = merge_buffer".into());
            let _ = writeln!(
                loads,
                "  const {ct} *restrict merge_buffer = aj_c->merge_buffer;"
            );
        }
        for t in &shared {
            let n = self.names.node(t);
            let ct = t.prec().c_type();
            let _ = writeln!(fields, "  {ct} *{n};");
            init.push(format!(".{n} = {n}"));
            let _ = writeln!(loads, "  {ct} *restrict {n} = aj_c->{n};");
        }
        for s in &free {
            let n = self.names.symbol(*s);
            let _ = writeln!(fields, "  int64_t {n};");
            init.push(format!(".{n} = {n}"));
            let _ = writeln!(loads, "  const int64_t {n} = aj_c->{n};");
        }
        if self.checked {
            fields.push_str("  aj_check_t *aj_chk;\n  int32_t aj_claim;\n");
            init.push(".aj_chk = aj_chk".into());
            init.push(".aj_claim = 0".into());
        }
        // Private arrays: the smallest on the stack while they fit, the rest in scratch.
        let mut private = private;
        private.sort_by_key(|t| (t.size_in_bytes(), t.id()));
        let mut frame = 0usize;
        let mut heap: Vec<(Tnode, usize)> = vec![];
        let mut heap_bytes = 0usize;
        let mut decls = String::new();
        for t in &private {
            let n = self.names.node(t);
            let size = t.size_in_bytes();
            if size <= MAX_STACK_BYTES && frame + size <= MAX_FRAME_BYTES {
                frame += size;
                let _ = writeln!(
                    decls,
                    "  {} {n}[{}] __attribute__((aligned({LOCAL_ARRAY_ALIGN})));",
                    t.prec().c_type(),
                    t.numel()
                );
            } else {
                heap.push((t.clone(), heap_bytes));
                heap_bytes += size.div_ceil(SCRATCH_ALIGN) * SCRATCH_ALIGN;
            }
        }
        if !heap.is_empty() {
            let _ = writeln!(
                decls,
                "  char *aj_priv = (char *)aj_scratch(aj_team, aj_tid, {heap_bytes});\n  if (!aj_priv) return AJ_STATUS_NO_MEMORY;"
            );
            for (t, off) in &heap {
                let n = self.names.node(t);
                let ct = t.prec().c_type();
                let _ = writeln!(decls, "  {ct} *restrict {n} = ({ct} *)(aj_priv + {off});");
            }
        }
        let mut vregs = vec![];
        vregs_outside_regions(&p.body, false, &mut vregs);
        for r in vregs {
            let n = self.names.vreg(r.id);
            let _ = writeln!(decls, "  {} {n};", self.dialect.ty(r.ty));
        }
        let i = self.names.symbol(p.index);
        let mut body = String::new();
        self.stmt(&p.body, 2, &mut body);
        let mut f = String::new();
        let _ = writeln!(
            f,
            "\n/* {} */",
            sanitize_comment(&format!(
                "Parallel region {name}: chunks of the loop over {i} from {} to {}",
                p.from, p.to
            ))
        );
        let _ = writeln!(f, "typedef struct {{\n{fields}}} {name}_ctx;");
        let head = if self.checked {
            format!(
                "static int {name}_run({name}_ctx *aj_c, int64_t aj_lo, int64_t aj_hi, int64_t aj_tid, aj_check_t *restrict aj_chk) {{"
            )
        } else {
            format!(
                "static int {name}(void *aj_arg, int64_t aj_lo, int64_t aj_hi, int64_t aj_tid) {{\n  {name}_ctx *aj_c = ({name}_ctx *)aj_arg;"
            )
        };
        let _ = writeln!(f, "{head}\n  (void)aj_tid;");
        f.push_str(&loads);
        f.push_str(&decls);
        if self.checked {
            f.push_str("  (void)aj_chk;\n");
        }
        let _ = writeln!(f, "  for (int64_t {i} = aj_lo; {i} <= aj_hi; ++{i}) {{");
        f.push_str(&body);
        f.push_str("  }\n  return 0;\n}\n");
        if self.checked {
            let _ = writeln!(
                f,
                "static int {name}(void *aj_arg, int64_t aj_lo, int64_t aj_hi, int64_t aj_tid) {{\n  {name}_ctx *aj_c = ({name}_ctx *)aj_arg;\n  aj_check_t aj_own;\n  memset(&aj_own, 0, sizeof aj_own);\n  const int aj_s = {name}_run(aj_c, aj_lo, aj_hi, aj_tid, &aj_own);\n  if (aj_s == AJ_STATUS_OUT_OF_BOUNDS) aj_check_publish(aj_c->aj_chk, &aj_own, &aj_c->aj_claim);\n  return aj_s;\n}}"
            );
        }
        self.regions.push(f);
        let _ = writeln!(out, "{pad}{{");
        let _ = writeln!(out, "{pad}  {name}_ctx aj_rc = {{{}}};", init.join(", "));
        let _ = writeln!(
            out,
            "{pad}  const int aj_rs = aj_parallel(aj_team, {name}, &aj_rc, {}, {}, {});",
            p.from, p.to, p.grain
        );
        let _ = writeln!(out, "{pad}  if (aj_rs != 0) return aj_rs;");
        let _ = writeln!(out, "{pad}}}");
    }
}
