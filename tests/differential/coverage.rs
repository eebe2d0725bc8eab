//! Which of the optimizer's kernel paths the compiled cases took: GEMM kernels (recognized by
//! the comment each kernel starts with, `GEMM kernel for NAME: MxNxK, tile MRxNR (W lanes),
//! kc KC, column blocks of P panels`) and vectorized reductions (their accumulator, a local
//! array labelled `NAME_acc`), read from the optimized loop IR of every compiled case.

use super::case::{Op, Program, Stmt};
use arrayjit::ir::{Binop, Prec};
use arrayjit::loops::{visit_llc, Llc};
use arrayjit::optimize::Optimized;
use std::collections::BTreeMap;

/// One GEMM kernel, from its comment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Kernel {
    pub result: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub mr: usize,
    pub nr: usize,
    pub kc: usize,
    pub panels: usize,
}

impl Kernel {
    fn parse(text: &str) -> Option<Kernel> {
        let rest = text.strip_prefix("GEMM kernel for ")?;
        let (result, rest) = rest.split_once(": ")?;
        let nums: Vec<usize> = rest
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().ok())
            .collect::<Option<_>>()?;
        // m, n, k, mr, nr, lanes, kc, panels
        let [m, n, k, mr, nr, _, kc, panels] = nums[..] else {
            return None;
        };
        Some(Kernel {
            result: result.to_string(),
            m,
            n,
            k,
            mr,
            nr,
            kc,
            panels,
        })
    }
}

/// The kernel paths one compiled case took.
#[derive(Clone, Debug, Default)]
pub struct Paths {
    pub kernels: Vec<Kernel>,
    /// The results of vectorized reductions.
    pub reductions: Vec<String>,
    /// The results of tap kernels (`optimize/taps.rs`, recognized by their comment
    /// `tap kernel for NAME: ...`).
    pub taps: Vec<String>,
    /// Parallel regions, the private arrays they list, and split reductions (recognized by
    /// their comment `a reduction split into ...`).
    pub regions: usize,
    pub private: usize,
    pub split: usize,
}

pub fn paths(o: &Optimized) -> Paths {
    let mut p = Paths::default();
    visit_llc(&o.code, &mut |c| match c {
        Llc::Parallel(r) => {
            p.regions += 1;
            p.private += r.private.len();
        }
        Llc::Comment(text) => {
            p.split += usize::from(text.starts_with("a reduction split into"));
            p.kernels.extend(Kernel::parse(text));
            if let Some((name, _)) = text
                .strip_prefix("tap kernel for ")
                .and_then(|r| r.split_once(':'))
            {
                p.taps.push(name.to_string());
            }
        }
        Llc::Set { tn, .. } => {
            if let [name, acc] = tn.label() {
                if acc == "acc" && !p.reductions.contains(name) {
                    p.reductions.push(name.clone());
                }
            }
        }
        _ => {}
    });
    p
}

/// Coverage counts over many cases.
#[derive(Default)]
pub struct Coverage {
    /// Large statements generated, by kind.
    pub big: BTreeMap<&'static str, usize>,
    /// Per contraction layout: generated, computed by a GEMM kernel.
    pub layouts: BTreeMap<&'static str, (usize, usize)>,
    pub gemm_cases: usize,
    pub kernels: usize,
    /// Kernels whose result is inexact (the comparison uses the reassociation bound).
    pub kernels_inexact: usize,
    /// Kernels with more than one reduction block, with bottom or right edge tiles, with
    /// column blocks.
    pub kernels_k_blocks: usize,
    pub kernels_edges: usize,
    pub kernels_col_blocks: usize,
    /// Kernels of a large statement's result.
    pub kernels_of_big: usize,
    /// Kernels of a large statement with an operand computed by an inlined node.
    pub kernels_computed_operand: usize,
    pub reduction_cases: usize,
    pub reductions: usize,
    pub reductions_inexact: usize,
    /// Per window layout (depthwise, pooling): generated, computed by a tap kernel.
    pub windows: BTreeMap<&'static str, (usize, usize)>,
    /// Cases with tap kernels, and how many.
    pub tap_cases: usize,
    pub taps: usize,
    /// Large statements whose result was computed by no kernel path.
    pub big_scalar: usize,
    /// Cases with parallel regions; regions, private arrays, split reductions.
    pub region_cases: usize,
    pub regions: usize,
    pub private: usize,
    pub split: usize,
    /// Contractions not computed by a GEMM kernel, by reason: how many, and a few seeds.
    pub not_gemm: BTreeMap<&'static str, (usize, Vec<u64>)>,
}

/// Why a contraction was not rewritten as a GEMM kernel (`optimize/gemm.rs` rewrites
/// `c += x * y` into single or double results, with at least 32^3 multiply-adds and a full
/// vector of contiguous columns: 16 floats or 8 doubles with AVX-512, fewer elsewhere).
fn why_not_gemm(p: &Program, b: &super::case::Big, inlined: &[bool]) -> &'static str {
    let Some(Stmt::Accum {
        accum, op, args, ..
    }) = p
        .stmts
        .iter()
        .find(|s| s.lhs() == b.lhs && matches!(s, Stmt::Accum { .. }))
    else {
        return "other";
    };
    let (m, n, k) = b.mnk;
    let lanes = if p.tensors[b.lhs].prec == Prec::Double {
        8
    } else {
        16
    };
    if !matches!(p.tensors[b.lhs].prec, Prec::Single | Prec::Double) {
        "half or byte result"
    } else if *accum != Binop::Add {
        "accumulator other than add"
    } else if *op != Op::Bin(Binop::Mul) {
        "operation other than mul"
    } else if inlined.get(b.lhs) == Some(&true) {
        "result inlined into its reader"
    } else if m * n * k < 32 * 32 * 32 || n < lanes {
        "below the size threshold"
    } else if args.iter().any(|&a| inlined.get(a) == Some(&true)) {
        "operand inlined as a scope"
    } else {
        "other"
    }
}

impl Coverage {
    /// Adds a case: its program, the paths its compiled run took and which of its tensors
    /// the optimizer inlined.
    pub fn add(&mut self, p: &Program, paths: Option<&Paths>, inlined: &[bool]) {
        for b in &p.big {
            *self.big.entry(b.kind).or_default() += 1;
        }
        let Some(paths) = paths else { return };
        let index = |name: &str| p.tensors.iter().position(|t| t.name == name);
        let inexact = |name: &str| {
            index(name).is_some_and(|i| p.ests.last().is_some_and(|e| e[i].grid.is_none()))
        };
        for b in &p.big {
            let name = &p.tensors[b.lhs].name;
            let gemm = paths.kernels.iter().any(|k| &k.result == name);
            if b.kind == "window" {
                let e = self.windows.entry(b.layout).or_default();
                e.0 += 1;
                e.1 += usize::from(paths.taps.contains(name));
            }
            if !matches!(b.kind, "long reduction" | "window") {
                let e = self.layouts.entry(b.layout).or_default();
                e.0 += 1;
                e.1 += usize::from(gemm);
            }
            let computed = p.stmts.iter().any(|s| match s {
                Stmt::Accum { lhs, args, .. } if *lhs == b.lhs => {
                    args.iter().any(|&a| inlined.get(a) == Some(&true))
                }
                _ => false,
            });
            self.kernels_computed_operand += usize::from(gemm && computed);
            if !gemm && !paths.reductions.contains(name) && !paths.taps.contains(name) {
                self.big_scalar += 1;
            }
            if !matches!(b.kind, "long reduction" | "window") && !gemm {
                let why = why_not_gemm(p, b, inlined);
                let e = self.not_gemm.entry(why).or_default();
                e.0 += 1;
                if e.1.len() < 4 {
                    e.1.push(p.seed);
                }
            }
        }
        self.gemm_cases += usize::from(!paths.kernels.is_empty());
        for k in &paths.kernels {
            self.kernels += 1;
            self.kernels_inexact += usize::from(inexact(&k.result));
            self.kernels_k_blocks += usize::from(k.k > k.kc);
            self.kernels_edges += usize::from(k.m % k.mr != 0 || k.n % k.nr != 0);
            self.kernels_col_blocks += usize::from(k.n > k.panels * k.nr);
            self.kernels_of_big +=
                usize::from(p.big.iter().any(|b| p.tensors[b.lhs].name == k.result));
        }
        self.region_cases += usize::from(paths.regions > 0);
        self.regions += paths.regions;
        self.private += paths.private;
        self.split += paths.split;
        self.tap_cases += usize::from(!paths.taps.is_empty());
        self.taps += paths.taps.len();
        self.reduction_cases += usize::from(!paths.reductions.is_empty());
        for r in &paths.reductions {
            self.reductions += 1;
            self.reductions_inexact += usize::from(inexact(r));
        }
    }

    pub fn merge(&mut self, o: Coverage) {
        for (k, v) in o.big {
            *self.big.entry(k).or_default() += v;
        }
        for (k, (a, b)) in o.layouts {
            let e = self.layouts.entry(k).or_default();
            e.0 += a;
            e.1 += b;
        }
        self.gemm_cases += o.gemm_cases;
        self.kernels += o.kernels;
        self.kernels_inexact += o.kernels_inexact;
        self.kernels_k_blocks += o.kernels_k_blocks;
        self.kernels_edges += o.kernels_edges;
        self.kernels_col_blocks += o.kernels_col_blocks;
        self.kernels_of_big += o.kernels_of_big;
        self.kernels_computed_operand += o.kernels_computed_operand;
        self.reduction_cases += o.reduction_cases;
        self.reductions += o.reductions;
        self.reductions_inexact += o.reductions_inexact;
        for (k, (a, b)) in o.windows {
            let e = self.windows.entry(k).or_default();
            e.0 += a;
            e.1 += b;
        }
        self.tap_cases += o.tap_cases;
        self.taps += o.taps;
        self.big_scalar += o.big_scalar;
        self.region_cases += o.region_cases;
        self.regions += o.regions;
        self.private += o.private;
        self.split += o.split;
        for (k, (n, seeds)) in o.not_gemm {
            let e = self.not_gemm.entry(k).or_default();
            e.0 += n;
            e.1.extend(seeds);
            e.1.truncate(4);
        }
    }

    pub fn report(&self, cases: usize) -> String {
        let layouts: Vec<String> = self
            .layouts
            .iter()
            .map(|(k, (g, h))| format!("{k} {h}/{g}"))
            .collect();
        let windows: Vec<String> = self
            .windows
            .iter()
            .map(|(k, (g, h))| format!("{k} {h}/{g}"))
            .collect();
        format!(
            "coverage: large statements {:?}; GEMM kernels in {} of {cases} cases: {} kernels ({} of large statements, {} packing inlined computations, {} inexact, {} with several reduction blocks, {} with edge tiles, {} with column blocks); vectorized reductions in {} cases: {} ({} inexact); tap kernels in {} cases: {} (windows by tap kernel/generated: {}); large statements computed by no kernel: {}; parallel regions in {} cases: {} ({} private arrays, {} split reductions)\n  contraction layouts (GEMM/generated): {}\n  contractions without GEMM kernel (count, some seeds): {:?}",
            self.big,
            self.gemm_cases,
            self.kernels,
            self.kernels_of_big,
            self.kernels_computed_operand,
            self.kernels_inexact,
            self.kernels_k_blocks,
            self.kernels_edges,
            self.kernels_col_blocks,
            self.reduction_cases,
            self.reductions,
            self.reductions_inexact,
            self.tap_cases,
            self.taps,
            windows.join(", "),
            self.big_scalar,
            self.region_cases,
            self.regions,
            self.private,
            self.split,
            layouts.join(", "),
            self.not_gemm
        )
    }
}
