//! Comparing the runs of a case within the bounds of the error analysis, and statistics.

use super::case::{accum_name, to_json, Kind, Program, Stmt};
use super::coverage::{paths, Coverage};
use super::gen::generate;
use super::model::Est;
use super::run::{
    instantiate, run_compiled, run_interp, run_interp_optimized, CompiledCase, Outputs,
};
use arrayjit::ir::MemoryMode;
use arrayjit::optimize::Settings;
use std::collections::BTreeMap;

/// Generator and runner knobs.
#[derive(Clone, Debug, Default)]
pub struct Opts {
    /// Optimizer settings of the compiled run (a).
    pub settings: Settings,
    /// Compile (a) and (c) in bounds-checked mode: any out-of-bounds access fails the case
    /// (`Error::IndexOutOfBounds` from the run).
    pub checked: bool,
}

/// Multiplier on the error bound.
pub const TOL_FACTOR: f64 = 2.0;

/// Whether `g` and `w` agree for a tensor with estimate `est`; also returns how much of the
/// tolerance was used (for statistics).
pub fn close(g: f64, w: f64, est: &Est, factor: f64) -> (bool, f64) {
    if g.is_nan() || w.is_nan() {
        return (g.is_nan() && w.is_nan(), 0.0);
    }
    // Identical values agree whatever the error analysis says (its bound may be unknown).
    if g == w {
        return (true, 0.0);
    }
    if g.is_infinite() || w.is_infinite() {
        return (g == w, 0.0);
    }
    if est.grid.is_some() {
        return (g == w, 0.0);
    }
    let tol = factor * TOL_FACTOR * est.err;
    let d = (g - w).abs();
    (d <= tol, if tol > 0.0 { d / tol } else { 0.0 })
}

#[derive(Default)]
pub struct Stats {
    pub cases: usize,
    pub stmts: BTreeMap<String, usize>,
    pub precs: BTreeMap<&'static str, usize>,
    pub runs: BTreeMap<usize, usize>,
    pub with_statics: usize,
    pub temps: usize,
    pub inlined_temps: usize,
    pub exact_cells: usize,
    pub inexact_cells: usize,
    pub max_used: f64,
    pub coverage: Coverage,
    /// Time spent (summed over threads): generating, compiling with the optimizer on and
    /// off (and running), interpreting the unoptimized and the optimized code.
    pub secs: [f64; 5],
    /// The same in CPU time of the test's threads (the C compiler's time is not in it).
    pub cpu: [f64; 5],
}

impl Stats {
    pub fn add_program(&mut self, p: &Program) {
        self.cases += 1;
        for s in &p.stmts {
            let key = match s {
                Stmt::Accum {
                    accum,
                    init,
                    op,
                    shape,
                    ..
                } => {
                    *self
                        .stmts
                        .entry(format!(
                            "accum {}{}",
                            accum_name(*accum),
                            if *init { "+init" } else { "" }
                        ))
                        .or_default() += 1;
                    if !shape.bijective {
                        *self.stmts.entry("non-bijective".into()).or_default() += 1;
                    }
                    if !shape.full {
                        *self.stmts.entry("partial write".into()).or_default() += 1;
                    }
                    format!("op {}", op.name())
                }
                Stmt::Const { .. } => "fetch constant".into(),
                Stmt::Slice { .. } => "fetch slice".into(),
                Stmt::Embed { .. } => "fetch embed".into(),
                Stmt::Random { .. } => "fetch random".into(),
                Stmt::Gather { .. } => "gather".into(),
                Stmt::Scatter { .. } => "scatter_add".into(),
            };
            *self.stmts.entry(key).or_default() += 1;
        }
        for t in &p.tensors {
            *self.precs.entry(t.prec.name()).or_default() += 1;
        }
        *self.runs.entry(p.runs.len()).or_default() += 1;
        self.with_statics += usize::from(!p.statics.is_empty());
    }

    pub fn merge(&mut self, o: Stats) {
        self.cases += o.cases;
        for (k, v) in o.stmts {
            *self.stmts.entry(k).or_default() += v;
        }
        for (k, v) in o.precs {
            *self.precs.entry(k).or_default() += v;
        }
        for (k, v) in o.runs {
            *self.runs.entry(k).or_default() += v;
        }
        self.with_statics += o.with_statics;
        self.temps += o.temps;
        self.inlined_temps += o.inlined_temps;
        self.exact_cells += o.exact_cells;
        self.inexact_cells += o.inexact_cells;
        self.max_used = self.max_used.max(o.max_used);
        self.coverage.merge(o.coverage);
        for (a, b) in self.secs.iter_mut().zip(o.secs) {
            *a += b;
        }
        for (a, b) in self.cpu.iter_mut().zip(o.cpu) {
            *a += b;
        }
    }
}

/// Compares two runs of a case; pushes up to a few messages per disagreement.
pub fn compare(
    p: &Program,
    what: &str,
    got: &Outputs,
    want: &Outputs,
    factor: f64,
    stats: Option<&mut Stats>,
    problems: &mut Vec<String>,
) {
    let hosted = p.hosted();
    let mut shown = 0;
    let (mut exact, mut inexact, mut used) = (0, 0, 0f64);
    for (r, (g_run, w_run)) in got.iter().zip(want).enumerate() {
        for (k, &ti) in hosted.iter().enumerate() {
            let est = &p.ests[r][ti];
            let (g, w) = (&g_run[k], &w_run[k]);
            if g.len() != w.len() {
                problems.push(format!(
                    "{what}: run {r}: {} has {} cells vs {}",
                    p.tensors[ti].name,
                    g.len(),
                    w.len()
                ));
                continue;
            }
            for (cell, (&gv, &wv)) in g.iter().zip(w).enumerate() {
                let (ok, u) = close(gv, wv, est, factor);
                if est.grid.is_some() {
                    exact += 1;
                } else {
                    inexact += 1;
                }
                if ok {
                    used = used.max(u);
                } else {
                    if shown < 6 {
                        problems.push(format!(
                            "{what}: after run {} tensor {} ({}, dims {:?}) cell {cell}: {gv:?} vs {wv:?} (difference {:e}; {})",
                            r + 1,
                            p.tensors[ti].name,
                            p.tensors[ti].prec,
                            p.tensors[ti].dims,
                            (gv - wv).abs(),
                            match est.grid {
                                Some(_) => "expected identical values".to_string(),
                                None => format!("tolerance {:e}", factor * TOL_FACTOR * est.err),
                            }
                        ));
                    }
                    shown += 1;
                }
            }
        }
    }
    if shown > 6 {
        problems.push(format!("{what}: ... {} more differing cells", shown - 6));
    }
    if let Some(s) = stats {
        s.exact_cells += exact;
        s.inexact_cells += inexact;
        s.max_used = s.max_used.max(used);
    }
}

pub struct CaseReport {
    pub seed: u64,
    /// The optimizer's `max_visits` of the compiled run (a) (it depends on the batch).
    pub max_visits: usize,
    /// Whether the batch ran in bounds-checked mode.
    pub checked: bool,
    pub problems: Vec<String>,
    pub json: String,
}

/// Runs the cases of one batch all ways and compares them.
pub fn process(seeds: &[u64], opts: &Opts, verbose: bool) -> (Vec<CaseReport>, Stats) {
    let mut stats = Stats::default();
    let clock = std::time::Instant::now();
    let cpu0 = thread_cpu();
    let lap = |k: usize, stats: &mut Stats| {
        let t = clock.elapsed().as_secs_f64();
        stats.secs[k] += t - stats.secs.iter().sum::<f64>();
        let c = thread_cpu() - cpu0;
        stats.cpu[k] += c - stats.cpu.iter().sum::<f64>();
    };
    let progs: Vec<Program> = seeds.iter().map(|&s| generate(s)).collect();
    lap(0, &mut stats);
    let refs: Vec<&Program> = progs.iter().collect();
    let a = run_compiled(&refs, &opts.settings, opts.checked);
    lap(1, &mut stats);
    let c = run_compiled(&refs, &Settings::default().enabled(false), opts.checked);
    lap(2, &mut stats);
    let mut reports = vec![];
    for ((p, a), c) in progs.iter().zip(a).zip(c) {
        stats.add_program(p);
        let mut problems = vec![];
        let b = run_interp(p, &instantiate(p));
        lap(3, &mut stats);
        if let Err(e) = &b {
            problems.push(format!("(b) interpreter failed: {e}"));
        }
        let taken = a.as_ref().ok().map(|x| paths(&x.optimized));
        let inlined: Vec<bool> = match &a {
            Ok(x) => x
                .inst
                .tnodes
                .iter()
                .map(|tn| x.optimized.memory_mode(tn) == Some(MemoryMode::Virtual))
                .collect(),
            Err(_) => vec![],
        };
        stats.coverage.add(p, taken.as_ref(), &inlined);
        match &a {
            Err(e) => problems.push(format!("(a) compiled, optimizer on, failed: {e}")),
            Ok(CompiledCase {
                outputs: va,
                optimized: o,
                inst,
                ..
            }) => {
                for (t, tn) in p.tensors.iter().zip(&inst.tnodes) {
                    if t.kind == Kind::Temp {
                        stats.temps += 1;
                        stats.inlined_temps +=
                            usize::from(o.memory_mode(tn) == Some(MemoryMode::Virtual));
                    }
                }
                if let Ok(vb) = &b {
                    compare(
                        p,
                        "(a) compiled vs (b) interpreted",
                        va,
                        vb,
                        1.0,
                        Some(&mut stats),
                        &mut problems,
                    );
                    match run_interp_optimized(p, inst, o) {
                        Ok(vd) => compare(
                            p,
                            "(d) interpreted optimized code vs (b) interpreted",
                            &vd,
                            vb,
                            1.0,
                            None,
                            &mut problems,
                        ),
                        Err(e) => problems.push(format!("(d) {e}")),
                    }
                    lap(4, &mut stats);
                }
            }
        }
        match (&c, &a) {
            (Err(e), _) => problems.push(format!("(c) compiled, optimizer off, failed: {e}")),
            (Ok(CompiledCase { outputs: vc, .. }), Ok(CompiledCase { outputs: va, .. })) => {
                compare(
                    p,
                    "(c) optimizer off vs (a) optimizer on",
                    vc,
                    va,
                    2.0,
                    None,
                    &mut problems,
                )
            }
            _ => {}
        }
        lap(0, &mut stats);
        // A C function that reads vector variables before setting them is a code-generation
        // bug even when the values happen to agree (regression_gemm_kernel_split_across_parts).
        if a.as_ref().is_ok_and(|x| x.uninit_vectors) {
            problems.push(
                "(a) the generated C reads vector variables before setting them (a kernel split \
                 across C functions?)"
                    .into(),
            );
        }
        let a_bad = problems.iter().any(|m| m.starts_with("(a) compiled vs"));
        let d_bad = problems.iter().any(|m| m.starts_with("(d)"));
        if d_bad {
            problems.push(
                "diagnosis: the optimized loop IR already computes other values (d ≠ b): the \
                 optimizer changed the program's meaning"
                    .into(),
            );
        } else if a_bad {
            problems.push(
                "diagnosis: the optimized loop IR computes the right values (d = b), the compiled \
                 C does not: a C generation bug, or a C compiler bug (gcc 12.2 miscompiles some \
                 vectorized loops at -O3 -march=native, see \
                 regression_gcc12_vectorizer_wrong_code; rerun with \
                 ARRAYJIT_CFLAGS=-fno-tree-vectorize or ARRAYJIT_OPT_LEVEL=2 to tell)"
                    .into(),
            );
        }
        let json = to_json(p);
        if verbose {
            eprintln!("seed {}:\n{json}", p.seed);
        }
        reports.push(CaseReport {
            seed: p.seed,
            max_visits: opts.settings.max_visits,
            checked: opts.checked,
            problems,
            json,
        });
    }
    (reports, stats)
}

/// CPU time of the calling thread, in seconds.
pub fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// CPU time (user + system) of this process and of its waited-for children (the C
/// compiler), in seconds.
pub fn process_cpu() -> (f64, f64) {
    let get = |who| {
        // SAFETY: an all-zero rusage is valid for the call to fill.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `ru` is a valid rusage for the call to fill.
        unsafe { libc::getrusage(who, &mut ru) };
        let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
        t(ru.ru_utime) + t(ru.ru_stime)
    };
    (get(libc::RUSAGE_SELF), get(libc::RUSAGE_CHILDREN))
}
