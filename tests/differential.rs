//! Differential testing: random programs run through the compiled C and through the reference
//! interpreter ([`arrayjit::interp`]), compared within tolerances derived for every tensor.
//!
//! For every case a seeded generator builds a random program (tensors with values, one routine
//! of several assignments, 1-3 runs with static index values) and instantiates it three times
//! with fresh nodes (the optimizer records memory-mode decisions on the nodes):
//!
//! - (a) compiled with [`CcBackend`] (optimizer on) and run; the hosted tensors are read back
//!   after every run;
//! - (b) run by [`interp::run_assignments`] (the unoptimized loop IR);
//! - (c) compiled with the optimizer off;
//! - (d) additionally, the *optimized* loop IR of (a) is run by [`interp::run_optimized`],
//!   which tells optimizer bugs (d ≠ b) from C-generation bugs (d = b ≠ a).
//!
//! (a) is compared with (b), (c) with (a), and (d) with (b). A mismatch prints the seed and
//! the program in the JSON program-file format (`arrayjit run prog.json` reruns it), and
//! fails the test. At the end the test prints what was covered: statements, precisions,
//! how many cells were compared exactly and within tolerances, which of the optimizer's
//! kernel paths the compiled cases took (GEMM kernels, vectorized reductions, tap kernels; per
//! contraction layout, and why the others were not rewritten), and where the time went.
//!
//! Environment: `ARRAYJIT_FUZZ_CASES=N` (default 300), `ARRAYJIT_FUZZ_SEED=S` (base seed; case
//! `i` uses seed `S + i`), `ARRAYJIT_FUZZ_BATCH=K` (cases compiled together in one C file,
//! default 25), `ARRAYJIT_FUZZ_VERBOSE=1` (print every program),
//! `ARRAYJIT_FUZZ_MAX_TRACING_DIM=n` and `ARRAYJIT_FUZZ_MAX_VISITS=n` (optimizer settings of
//! the compiled run (a); with a tracing dim below 5, loops are traced only partly; unless
//! the visits are set, every other batch uses 64 instead of the default 1, so that nodes read
//! many times, like the operands of a contraction, are inlined too),
//! `ARRAYJIT_FUZZ_BIG=n` (how many cases in a thousand get a large statement, default
//! 190). Every fourth batch (batches 3, 6, 11, 14, ...: `k % 8` is 3 or 6, so both
//! `max_visits` settings get some) compiles (a) and (c) in bounds-checked
//! mode (`CompilerConfig::checked`): the generator's programs are valid, so an
//! out-of-bounds access (`Error::IndexOutOfBounds`, naming the tensor, indices and extents)
//! is a bug and fails the case; this costs no extra compile, the batch is just compiled
//! checked instead of unchecked. `ARRAYJIT_CHECKED=1` checks every batch. The compiled
//! runs (a) and (c) run parallel regions on teams of three threads, and half the batches
//! (`k % 4` is 0 or 3) make every independent loop a region, however small (the optimizer's
//! `min_region_work` 0), so that privatized arrays, split reductions and chunked loops are
//! compared with the interpreter on every kind of statement. The C compiler's
//! own variables apply too (`ARRAYJIT_CC`,
//! `ARRAYJIT_ARCH_FLAGS`, `ARRAYJIT_CFLAGS`, ...): the kernels follow the target they
//! describe (AVX-512, AVX2, SSE2 vector widths and register counts).
//!
//! The code: `differential/case.rs` (programs and their JSON rendering),
//! `differential/model.rs` (the error analysis), `differential/gen.rs` (the random
//! generator), `differential/big.rs` (its large statements), `differential/run.rs` (the
//! four ways of running), `differential/compare.rs` (comparison, statistics),
//! `differential/coverage.rs` (which kernel paths were taken).
//!
//! # What the generator covers
//!
//! - shapes of 1-4 axes with extents 1-5; einsum specs built from the operands' dims with
//!   shared letters, broadcasting (extent-1 axes, letters only in the result), reductions
//!   (letters only in arguments, and letters on result axes of extent 1), diagonals (a letter
//!   repeated in one argument term), fixed digit indices on both sides, and static indices
//!   `{s}` (with a range) on both sides;
//! - affine entries (SPEC 9.3) on argument and result axes: `(c·L [+ c·M] ± o)` with
//!   coefficients 1-2 and offsets -2..2 over letters that have an extent, so that some points
//!   fall outside their axis and are skipped (the model lets a cell get 0..fan_in terms);
//! - every unary, binary and ternary operation of the table and every precision of SPEC 9.1
//!   (byte, uint16, int32, uint32, int64, uint64, fp8, half, bfloat16, single, double), mixed
//!   precisions in one program and one assignment (integer results with floating arguments
//!   compute in double, floating results with integer arguments convert them); accumulators
//!   set/add/sub/mul/max/min with and without `initialize_neutral` (integer neutral elements:
//!   the type's minimum/maximum for max/min), bijective and not, full and partial writes;
//! - integer programs (SPEC 9.1, 9.2): 30% of the cases are integer-heavy (most new tensors
//!   get an integer precision); integer inputs hold small values (-3..8: divisors and mods by
//!   zero, negative exponents, shift counts) or edge values (0, ±1, the type's minimum and
//!   maximum — for 64 bits the largest `f64` in range, 2^63 - 1024 and 2^64 - 2048 — values
//!   around ±2^31, 2^32, 2^53 and 2^62, shift counts 7-65 around the widths), and integer
//!   statements try the bitwise operations and shifts, div, mod, pow and sub first half of
//!   the time, so they overflow, wrap, divide by zero and shift by the width or more. The
//!   bitwise operations and shifts appear only on integer statements;
//!   [`differential_integer_only_ops_on_floating_statements_are_errors`] checks the misuse
//!   (generated statements with a floating result or argument given one of them fail with
//!   `Error::IntegerOnlyOp` naming the operation and a floating tensor, compiled and
//!   interpreted);
//! - bfloat16 and fp8 values around their rounding ties (k/16 in [1, 4), 1 + k/256,
//!   1 + k/512 in single and double, k·2^-17 around the fp8 subnormals), overflowing
//!   constants (57344, its tie 61440 to inf, -65536, 1e5, 3.4e38) and NaN/±inf constants into
//!   outputs of every precision (integers store 0); index tensors of gathers and scatters of
//!   every integer precision, with negative rows for the signed ones;
//! - chains of assignments through intermediate nodes that are not hosted (so the optimizer
//!   inlines many of them), in-place updates, accumulation into hosted inputs;
//! - fetches: constants (exact, inexact, and ±inf/NaN into outputs), slices by a static index,
//!   and embedded static index values;
//! - 1-3 runs of the routine with changing static index values, so recurrent accumulators
//!   (hosted, and device-only ones the optimizer must keep) carry state between runs;
//! - in 19% of the cases, one *large statement* among the others ([`big`]):
//!   - (12%) a contraction with extents up to about 70 (tile edges half of the time: 13-17,
//!     27-33, 41-49, 55-57, 63-65, 69-70; mostly above the GEMM kernels' threshold of 32^3
//!     multiply-adds and a vector of contiguous columns) in every layout: `ij,jk->ik`,
//!     transposed operands (`ij,kj->ik`, `ji,jk->ik`, `ji,kj->ik`), transposed results
//!     (`ij,jk->ki`, `ji,kj->ki`), a Gram matrix (`ij,kj->ik` of one node with itself),
//!     batched (`bij,bjk->bik`, `ibj,bjk->bik`), broadcast batches (`bij,jk->bik`,
//!     `ij,bjk->ibk`), a second reduced axis (`ijl,jkl->ik`, `lij,ljk->ik`), static and fixed
//!     indices on an outer axis (`{s}ij,jk->ik`, `ij,jk->{s}ik`, `{s}ij,{s}jk->{s}ik`,
//!     `2ij,jk->ik`, `ij,1jk->1ik`), operands in either order;
//!   - (3%) a long contraction: a reduction of 257-3000 into a few rows (several reduction
//!     blocks of a kernel);
//!   - (3%) a long reduction of 257-3000 terms: sums, sums of transcendental terms, dot
//!     products, matrix-vector products, contiguous (vectorized for single and double
//!     results) or strided, with add/sub/max/min;
//!   - (1%) a wide product: hundreds of columns (cache tiling of small products), or more
//!     than a block of column panels of a kernel;
//!
//!   with operands of any precision (half, byte, single, double), inputs or pointwise chains
//!   through non-hosted nodes (inlined into the product in the batches with many visits),
//!   results mostly single or double, non-hosted, hosted outputs or hosted inputs, with and
//!   without `initialize_neutral` (accumulating across runs), mostly `add` of `mul` but
//!   sometimes other accumulators and operations, read afterwards half of the time
//!   (pointwise, or summed along a row). Their values are scaled so that sums stay below
//!   about 1500: dyadic (products and sums often exact), full precision (inexact) or all
//!   positive. The random statements never read them (their extents are above 5).
//!
//! Operand domains are chosen so that comparisons stay meaningful: the generator tracks, for
//! every tensor, an interval bounding its values and refuses operations outside their domain
//! with a margin: `log` needs arguments ≥ 0.25, `sqrt` ≥ 0, `recip`/`div` denominators away
//! from 0 by 0.25, `exp` arguments ≤ 7, `pow` positive bases ≥ 0.25 with exponents in [-3, 3]
//! (or any base with an exact integer exponent 0-3), `relu_gate` only gates on values whose
//! sign is the same in both computations, and magnitudes stay below 1e4 (half overflows at
//! 65504). Inputs are small dyadic rationals (k/8, k/4, k/1024) or bytes (and, for large
//! statements, also full-precision values).
//!
//! # Tolerances
//!
//! Instead of one fixed tolerance per precision, the generator runs a forward error analysis
//! alongside: for every tensor it knows whether both computations produce *identical* values
//! and, if not, a bound on the absolute difference.
//!
//! - Values are identical when every operation is exact in the compute type of the C code
//!   (`float` for half/single results: 24 bits, `double` for byte/double: 53 bits): the
//!   generator tracks that all values are multiples of `2^e` below a magnitude, which
//!   decides exactness of `+ - *`, and rounding an identical value to a storage precision is
//!   identical on both sides. With dyadic inputs most of the arithmetic is exact, so most
//!   cells are compared **exactly** — a lost rounding or a wrong index shows immediately.
//! - Otherwise (division, transcendental functions, or results too wide for `float`), the
//!   bound grows by a few units in the last place of the compute type per operation (float
//!   vs. double intermediates, libm, contraction into FMA), by one unit of the storage
//!   precision per store (a value computed slightly differently can round to the
//!   neighbouring half/single: "double rounding"), by 1 per byte store (truncation can flip
//!   by one), and is propagated through each operation with its derivative bounds (e.g. an
//!   error `d` in `x` becomes `d / lo` after `log`). The comparison allows 4x the bound
//!   (8x for compiled vs. compiled). In practice this is about 1e-3 relative for half values
//!   computed by transcendental functions, 1e-6 for single and 1e-15 for double, and ±1 for
//!   bytes computed from inexact values. Programs whose bound would exceed 2% of a tensor's
//!   magnitude are not generated (those comparisons would be meaningless).
//! - Sums into single and double results may be *reassociated* by the optimizer (GEMM
//!   kernels sum blocks of the reduction in registers, vectorized reductions keep 16 or 8
//!   partial sums): the estimate of such a sum covers every summation order
//!   ([`model::any_order`]): identical only if every partial sum of any subset of the terms
//!   is exact, otherwise within `n · ulp(|start| + n · max|term|)` plus the propagated
//!   errors (the classic bound for summation in any order). The bounds of long sums are the
//!   exact bounds of the sum plus the rounding each step may add ([`model::accumulate`]),
//!   not a relative margin per step, which would compound over thousands of terms.
//! - NaN matches only NaN, infinities only equal infinities.
//! - Integer statements (integer result and arguments) compute exactly in 64-bit integers:
//!   their values are identical on both sides whatever they are (the model bounds them by
//!   interval arithmetic while nothing wraps, by the type's range otherwise), except for the
//!   functions of reals (`exp`, `sqrt`, `sigmoid`, ...), which compute in double (libm) and
//!   truncate: those get the double error model and ±1 after the store, in a small domain.
//!   64-bit integer results are compared exactly: the outputs carry every cell's value
//!   modulo 2^32 besides its `f64` rounding (see `run::Outputs`).
//! - Storing into bfloat16 and fp8 rounds identical values identically (exact comparison);
//!   values that may differ get one unit of the narrow format. The operations without a
//!   derivative bound — comparisons, `and`/`or`/`not`, `mod` (fmod), `trunc`/`floor`/`ceil`,
//!   the gates and `where`'s condition — are generated only on arguments whose values are
//!   identical on both sides, so their results are compared exactly; `satur01` and `abs`
//!   propagate errors unchanged; `exp2`, `log2`, `rsqrt` and `sigmoid` get tolerances like
//!   `exp` and `log`. Integer arguments of floating statements are exact where they fit the
//!   compute type and one unit of it otherwise.

#[path = "differential/big.rs"]
mod big;
#[path = "differential/case.rs"]
mod case;
mod common;
#[path = "differential/compare.rs"]
mod compare;
#[path = "differential/coverage.rs"]
mod coverage;
#[path = "differential/gen.rs"]
mod gen;
#[path = "differential/model.rs"]
mod model;
#[path = "differential/run.rs"]
mod run;

/// The CLI's program-file reader (binary-private; it uses only the library's public API).
#[path = "../src/bin/arrayjit/program/mod.rs"]
#[allow(dead_code)]
mod program;

use arrayjit::backend::CcBackend;
use arrayjit::interp::{self, Memory};
use arrayjit::ir::{Assignments, Bindings, Binop, Prec, StaticSymbol, Tnode, Unop};
use arrayjit::optimize::Settings;
use case::{to_json, Stmt};
use compare::{process, CaseReport, Opts, Stats};
use gen::generate;
use run::{instantiate, run_interp};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The optimizer's `max_visits` in every other batch.
const MANY_VISITS: usize = 64;

/// Whether batch `k` runs bounds-checked code: every fourth batch, alternately one with many
/// visits (odd `k`) and one with the default (even `k`).
fn checked_batch(k: usize) -> bool {
    matches!(k % 8, 3 | 6)
}

/// Whether batch `k` makes every independent loop a parallel region (the optimizer's
/// `min_region_work` 0), however little work it does: half the batches, some checked.
fn regions_everywhere(k: usize) -> bool {
    matches!(k % 4, 0 | 3)
}

#[test]
fn differential_random_programs() {
    let cases = env_u64("ARRAYJIT_FUZZ_CASES", 300) as usize;
    let base = env_u64("ARRAYJIT_FUZZ_SEED", 20_240_601);
    let batch = env_u64("ARRAYJIT_FUZZ_BATCH", 25).max(1) as usize;
    let defaults = Settings::default();
    let max_visits = env_u64("ARRAYJIT_FUZZ_MAX_VISITS", defaults.max_visits as u64) as usize;
    let max_tracing_dim = env_u64(
        "ARRAYJIT_FUZZ_MAX_TRACING_DIM",
        defaults.max_tracing_dim as u64,
    ) as usize;
    let opts = Opts {
        settings: defaults
            .max_visits(max_visits)
            .max_tracing_dim(max_tracing_dim),
        checked: false,
    };
    // Every other batch inlines nodes read many times per cell (unless the visits are set):
    // then pointwise chains feeding a contraction are inlined into it, and its kernel packs
    // computed values.
    let many_visits = Opts {
        settings: opts.settings.clone().max_visits(MANY_VISITS),
        checked: false,
    };
    let visits_set = std::env::var("ARRAYJIT_FUZZ_MAX_VISITS").is_ok();
    let verbose = env_flag("ARRAYJIT_FUZZ_VERBOSE");
    let seeds: Vec<u64> = (0..cases as u64).map(|i| base.wrapping_add(i)).collect();
    let chunks: Vec<&[u64]> = seeds.chunks(batch).collect();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, Vec<CaseReport>, Stats)>> = Mutex::new(vec![]);
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8)
        .min(chunks.len().max(1));
    let start = std::time::Instant::now();
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::SeqCst);
                let Some(chunk) = chunks.get(k) else { break };
                let o = if k % 2 == 1 && !visits_set {
                    &many_visits
                } else {
                    &opts
                };
                // Every independent loop a parallel region, however small.
                let everywhere;
                let o = if regions_everywhere(k) {
                    everywhere = Opts {
                        settings: o.settings.clone().min_region_work(0),
                        ..o.clone()
                    };
                    &everywhere
                } else {
                    o
                };
                let checked;
                let o = if checked_batch(k) {
                    checked = Opts {
                        checked: true,
                        ..o.clone()
                    };
                    &checked
                } else {
                    o
                };
                let (reports, stats) = process(chunk, o, verbose);
                results.lock().unwrap().push((k, reports, stats));
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|r| r.0);
    let mut stats = Stats::default();
    let mut failed = vec![];
    for (_, reports, s) in results {
        stats.merge(s);
        for r in reports {
            if !r.problems.is_empty() {
                eprintln!(
                    "==== differential mismatch, seed {} (rerun: ARRAYJIT_FUZZ_SEED={} ARRAYJIT_FUZZ_CASES=1 ARRAYJIT_FUZZ_MAX_VISITS={}{}, with the same compiler variables) ====",
                    r.seed,
                    r.seed,
                    r.max_visits,
                    if r.checked { " ARRAYJIT_CHECKED=1" } else { "" }
                );
                for m in &r.problems {
                    eprintln!("  {m}");
                }
                eprintln!("program (arrayjit run prog.json):\n{}", r.json);
                failed.push(r.seed);
            }
        }
    }
    let info = format!(
        "differential: {:.1}s; {} of {} temporaries inlined; {} cells compared exactly, {} within tolerance (at most {:.0}% of it used); runs {:?}; {} cases with static indices\n  precisions {:?}\n  statements {:?}",
        start.elapsed().as_secs_f64(),
        stats.inlined_temps,
        stats.temps,
        stats.exact_cells,
        stats.inexact_cells,
        stats.max_used * 100.0,
        stats.runs,
        stats.with_statics,
        stats.precs,
        stats.stmts
    );
    eprintln!("{info}");
    eprintln!("{}", stats.coverage.report(stats.cases));
    let (own_cpu, cc_cpu) = compare::process_cpu();
    eprintln!(
        "time (summed over threads; CPU time of the test's threads in parentheses): generating and comparing {:.1}s ({:.1}s), compiling with the optimizer on {:.1}s ({:.1}s), off {:.1}s ({:.1}s), interpreting {:.1}s ({:.1}s), interpreting the optimized code {:.1}s ({:.1}s); CPU time of the process {own_cpu:.1}s, of the C compiler {cc_cpu:.1}s",
        stats.secs[0],
        stats.cpu[0],
        stats.secs[1],
        stats.cpu[1],
        stats.secs[2],
        stats.cpu[2],
        stats.secs[3],
        stats.cpu[3],
        stats.secs[4],
        stats.cpu[4]
    );
    let summary = format!("differential: {} cases, {} mismatches", cases, failed.len());
    println!("{summary}");
    eprintln!("{summary}");
    assert!(
        failed.is_empty(),
        "{summary}; failing seeds: {failed:?} (programs printed above)"
    );
}

/// Found by `scripts/fuzz.sh` on new seeds (1796534390 and 2796533796, every loop a
/// region): a parallel
/// region's context captured the iterators of a local scope's original indices (`i12`,
/// `i13`, of loops the inlining had removed), which the C then referenced undeclared. Those
/// indices are a record of where an inlined node was read, not an access.
#[test]
fn regression_region_captures_only_iterators_its_code_uses() {
    // The second seed (2796533796) met it with clang in bounds-checked mode.
    for (seed, checked) in [(1_796_534_390, false), (2_796_533_796, true)] {
        let opts = Opts {
            settings: Settings::default().max_visits(64).min_region_work(0),
            checked,
        };
        let (reports, _) = process(&[seed], &opts, false);
        let problems: Vec<&String> = reports.iter().flat_map(|r| &r.problems).collect();
        assert!(problems.is_empty(), "seed {seed}: {problems:#?}");
    }
}

#[test]
fn differential_generator_is_deterministic() {
    for seed in [1, 77, 12345] {
        let a = generate(seed);
        let b = generate(seed);
        assert_eq!(to_json(&a), to_json(&b));
        assert_eq!(a.ests, b.ests);
        assert!(!a.stmts.is_empty(), "seed {seed} generated no statements");
    }
}

/// The printed programs are valid program files that mean the same thing: loading one with
/// the CLI's reader and interpreting it gives exactly the values of the generated program.
#[test]
fn differential_programs_round_trip_through_program_files() {
    let dir = tempfile::tempdir().unwrap();
    let (mut with_statics, mut with_non_finite) = (false, false);
    for seed in 500..800u64 {
        if seed >= 530 && with_statics && with_non_finite {
            break;
        }
        let p = generate(seed);
        with_statics |= !p.statics.is_empty();
        with_non_finite |= p
            .stmts
            .iter()
            .any(|s| matches!(s, Stmt::Const { c, .. } if !c.is_finite()));
        let path = dir.path().join(format!("case{seed}.json"));
        std::fs::write(&path, to_json(&p)).unwrap();
        let (built, _) = program::load(path.to_str().unwrap())
            .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", to_json(&p)));
        assert_eq!(built.assignments.len(), 1);
        let mut mem = Memory::new();
        mem.load_from_hosts(built.tensors.iter().map(|(_, t)| t));
        let mut out = vec![];
        for run in &p.runs {
            let statics: Vec<(StaticSymbol, i64)> = p
                .statics
                .iter()
                .zip(run)
                .map(|((name, _), v)| (built.bindings.find(name).unwrap().clone(), *v))
                .collect();
            interp::run_assignments(&built.assignments[0], &statics, &mut mem).unwrap();
            out.push(
                built
                    .print
                    .iter()
                    .map(|(_, t)| mem.get(t).unwrap().to_vec())
                    .collect::<Vec<_>>(),
            );
        }
        let want = run_interp(&p, &instantiate(&p)).unwrap();
        assert_eq!(out.len(), want.len());
        for (g, w) in out.iter().zip(&want) {
            for (g, w) in g.iter().zip(w) {
                assert!(
                    g.iter()
                        .zip(w)
                        .all(|(a, b)| a == b || (a.is_nan() && b.is_nan())),
                    "seed {seed}: {g:?} vs {w:?}\n{}",
                    to_json(&p)
                );
            }
        }
    }
    assert!(with_statics && with_non_finite);
}

/// Deliberate misuse: the generated statements with a floating result or argument, their
/// operation replaced by a bitwise or shift operation, must fail with
/// [`arrayjit::Error::IntegerOnlyOp`] (naming the operation and a floating tensor) both when
/// compiled and when interpreted, before any code runs.
#[test]
fn differential_integer_only_ops_on_floating_statements_are_errors() {
    let mut checked = 0;
    for seed in 3000..3400u64 {
        let p = generate(seed);
        let Some(k) = p.stmts.iter().position(|s| match s {
            Stmt::Accum { lhs, args, op, .. } => {
                matches!(op, case::Op::Bin(_))
                    && std::iter::once(lhs)
                        .chain(args)
                        .any(|&i| !p.tensors[i].prec.is_integer())
            }
            _ => false,
        }) else {
            continue;
        };
        let mut bad = p.clone();
        let ops = [
            Binop::BitAnd,
            Binop::BitOr,
            Binop::BitXor,
            Binop::Shl,
            Binop::Shr,
        ];
        let want_op = ops[(seed % 5) as usize];
        if let Stmt::Accum { op, .. } = &mut bad.stmts[k] {
            *op = case::Op::Bin(want_op);
        }
        bad.stmts.truncate(k + 1);
        let floating: Vec<&str> = {
            let Stmt::Accum { lhs, args, .. } = &bad.stmts[k] else {
                unreachable!()
            };
            std::iter::once(lhs)
                .chain(args)
                .filter(|&&i| !bad.tensors[i].prec.is_integer())
                .map(|&i| bad.tensors[i].name.as_str())
                .collect()
        };
        let msg_ok = |m: &str| {
            m.contains(&format!(
                "operation {} needs integer precisions, but tensor ",
                want_op.name()
            )) && floating
                .iter()
                .any(|t| m.contains(&format!("tensor {t} is ")))
        };
        let e = run_interp(&bad, &instantiate(&bad))
            .map(|_| ())
            .unwrap_err();
        assert!(msg_ok(&e), "seed {seed}: interpreter: {e}");
        let inst = instantiate(&bad);
        let backend = CcBackend::new();
        backend.initialize(arrayjit::backend::Config::default());
        let e = backend
            .compile(true, None, &Bindings(inst.statics.clone()), &inst.asgns)
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(
                &e,
                arrayjit::Error::InRoutine { source, .. }
                    if matches!(**source, arrayjit::Error::IntegerOnlyOp { .. })
            ) && msg_ok(&e.to_string()),
            "seed {seed}: compile: {e:?}"
        );
        checked += 1;
        if checked == 12 {
            break;
        }
    }
    assert_eq!(checked, 12);
}

// ------------------------------------------------------------------------------------------
// Regressions: minimal reproductions of bugs the differential test found. The three library
// bugs are fixed (commit 7ee7cee); while they were open, these tests were ignored and the
// generator avoided the constructs. The C compiler bug is not arrayjit's: its test stays
// ignored (run it with `cargo test --test differential -- --ignored`).

/// Interprets `asgns` once and returns the values of `outs`.
fn interpret(asgns: &Assignments, outs: &[&Tnode]) -> Vec<Vec<f64>> {
    let mut mem = Memory::new();
    mem.load_from_hosts(&asgns.nodes());
    interp::run_assignments(asgns, &[], &mut mem).unwrap();
    outs.iter().map(|t| mem.get(t).unwrap().to_vec()).collect()
}

/// Bug (fixed): when the optimizer inlines a node and the node's local scope collapses into the
/// reader's expression (`simplify` turns a scope that only sets its local into the bare
/// expression), the node's value is neither computed in its own compute type nor rounded to
/// its precision: a byte intermediate is no longer truncated or saturated, a half one no
/// longer rounded to half. The unoptimized code (and the optimizer off) store and round it.
#[test]
fn regression_inlined_node_loses_its_precision() {
    use common::*;
    let b = Bindings::empty();
    for tp in [Prec::Byte, Prec::Half] {
        let x = input("x", &[3], Prec::Single, &[1.5, 2.75, 3.125]);
        let y = input("y", &[3], Prec::Single, &[1.3, 1.01, 7.77]);
        let t = temp("t", &[3], tp);
        let out = output("out", &[3], Prec::Double);
        // t = x * y (t is inlined); out = t
        let asgns = Assignments::seq([
            binop(&t, Binop::Arg2, false, Binop::Mul, &x, &y, "i,i->i", &b),
            unop(&out, Binop::Arg2, false, Unop::Identity, &t, "i->i", &b),
        ]);
        let want: Vec<f64> = [(1.5f32, 1.3f32), (2.75, 1.01), (3.125, 7.77)]
            .iter()
            .map(|&(x, y)| round_to(tp, (x * y) as f64))
            .collect();
        assert_eq!(interpret(&asgns, &[&out])[0], want, "interpreter, {tp}");
        let (got, src) = compute(&asgns, &b, &[&out]);
        assert_eq!(got[0], want, "compiled with t of precision {tp}:\n{src}");
    }
}

/// Bug (fixed): a non-hosted node whose only reads are its own accumulations (computed, updated in
/// place, never consumed) makes compilation fail: "memory mode conflict for tensor t: it is
/// Virtual but routine ... still reads or writes it". Tracing counts its own reads, so
/// cleanup does not treat it as an output, and virtualization finds no reader to inline it
/// into, so it defaults to Virtual while its code stays.
#[test]
fn regression_node_read_only_by_its_own_updates() {
    use common::*;
    let b = Bindings::empty();
    let x = input("x", &[3], Prec::Single, &[1., 2., 3.]);
    let t = temp("t", &[3], Prec::Single);
    let out = output("out", &[3], Prec::Single);
    // t = x; t += t; out = -x (t is never consumed)
    let asgns = Assignments::seq([
        unop(&t, Binop::Arg2, false, Unop::Identity, &x, "i->i", &b),
        unop(&t, Binop::Add, false, Unop::Identity, &t, "i->i", &b),
        unop(&out, Binop::Arg2, false, Unop::Neg, &x, "i->i", &b),
    ]);
    assert_eq!(
        interpret(&asgns, &[&out, &t]),
        vec![vec![-1., -2., -3.], vec![2., 4., 6.]]
    );
    let backend = CcBackend::new();
    match common::build(&backend, "own_updates", &b, &asgns) {
        Ok((r, _)) => {
            let got = common::run_and_read(&backend, &r, &[&out]);
            assert_eq!(got[0], vec![-1., -2., -3.]);
        }
        Err(e) => panic!("compiling failed: {e}"),
    }
}

/// Bug (fixed): tracing counts a read whose cell involves a static index as a read of written cells
/// as soon as the node has any write (`Tracer::read`: `written = any_write` for inexact
/// cells). A non-hosted node written at one static index and read at another is therefore
/// not recurrent: it becomes Local (zeroed on every call) and loses the cells written by
/// earlier runs, which the routine reads. The interpreter (and the spec's rule "a node read
/// before it is written is recurrent") keep them.
#[test]
fn regression_static_index_read_of_partially_written_node() {
    use common::*;
    let s = StaticSymbol::new("s", Some(3));
    let r = StaticSymbol::new("r", Some(3));
    let b = Bindings(vec![s.clone(), r.clone()]);
    let x = input("x", &[3], Prec::Single, &[10., 20., 30.]);
    let t = temp("t", &[3], Prec::Single);
    let out = output("out", &[1], Prec::Single);
    // t[s] = x[s]; out = t[r]
    let asgns = Assignments::seq([
        unop(&t, Binop::Arg2, false, Unop::Identity, &x, "{s}->{s}", &b),
        unop(&out, Binop::Arg2, false, Unop::Identity, &t, "{r}->0", &b),
    ]);
    // Run 1 writes t[0]; run 2 writes t[1] and reads t[0].
    let runs = [(0, 0, 10.0), (1, 0, 10.0)];
    let mut mem = Memory::new();
    mem.load_from_hosts(&asgns.nodes());
    for &(sv, rv, want) in &runs {
        interp::run_assignments(&asgns, &[(s.clone(), sv), (r.clone(), rv)], &mut mem).unwrap();
        assert_eq!(
            mem.get(&out).unwrap(),
            &[want],
            "interpreter, s={sv} r={rv}"
        );
    }
    let backend = CcBackend::new();
    let (routine, src) = common::build(&backend, "static_reads", &b, &asgns).unwrap();
    for &(sv, rv, want) in &runs {
        routine.bindings().set("s", sv).unwrap();
        routine.bindings().set("r", rv).unwrap();
        let got = common::run_and_read(&backend, &routine, &[&out]);
        assert_eq!(
            got[0],
            vec![want],
            "compiled, s={sv} r={rv}; t is {:?}:\n{src}",
            backend.memory_mode(&t)
        );
    }
}

/// Not an arrayjit bug but wrong results all the same: gcc 12.2 at `-O3 -march=native`
/// (the default flags) miscompiles some loop nests the optimizer produces, in its loop
/// vectorizer (the results are right at `-O2`, with `-fno-tree-vectorize`, and with clang).
/// Found by the differential test (seeds 1001694 and 1000377 from base 1000000). Standalone C
/// reproductions are in the report; this test passes where the C compiler is not affected.
#[test]
fn regression_gcc12_vectorizer_wrong_code() {
    use common::*;
    let b = Bindings::empty();
    // (1) AVX2: a broadcast read under a condition on a local array (seed 1001694):
    // t1 = -transpose(x0); o8[a, b, c, d] = t1[a, 2] > 0 ? x0[b, c] : 0
    let xv: Vec<f64> = (0..20).map(|i| ((i * 7) % 11) as f64 - 5.0).collect();
    let x0 = input("x0", &[5, 4], Prec::Single, &xv);
    let t1 = temp("t1", &[4, 5], Prec::Single);
    let o8 = output("o8", &[4, 5, 4, 4], Prec::Single);
    let asgns = Assignments::seq([
        unop(&t1, Binop::Arg2, false, Unop::Neg, &x0, "ab->ba", &b),
        binop(
            &o8,
            Binop::Arg2,
            true,
            Binop::ReluGate,
            &t1,
            &x0,
            "a2,bc->abcd",
            &b,
        ),
    ]);
    let want = interpret(&asgns, &[&o8]);
    let mut hand = vec![];
    for a in 0..4 {
        for bb in 0..5 {
            for c in 0..4 {
                for _d in 0..4 {
                    hand.push(if -xv[2 * 4 + a] > 0.0 {
                        xv[bb * 4 + c]
                    } else {
                        0.0
                    });
                }
            }
        }
    }
    assert_eq!(want[0], hand);
    let (got, src) = compute(&asgns, &b, &[&o8]);
    assert_eq!(got, want, "{src}");

    // (2) AVX-512: a conditional reduction in an inlined node (seed 1000377):
    // o15[i, j] = - sum_k (x13[k, 0] > 0 ? t12[i, j, k] : 0)
    let t12v: Vec<f64> = (0..24).map(|i| -10.0 * ((i % 4) + 1) as f64).collect();
    let t12 = input("t12", &[3, 2, 4], Prec::Single, &t12v);
    let x13 = input(
        "x13",
        &[4, 2],
        Prec::Double,
        &[-0.79, -0.3, 0.53, 0.125, -0.77, -1.71, 0.3, -1.16],
    );
    let t14 = temp("t14", &[3, 2], Prec::Single);
    let o15 = output("o15", &[3, 2], Prec::Single);
    let asgns = Assignments::seq([
        binop(
            &t14,
            Binop::Sub,
            true,
            Binop::ReluGate,
            &x13,
            &t12,
            "a0,bca->bc",
            &b,
        ),
        unop(&o15, Binop::Arg2, false, Unop::Identity, &t14, "ab->ab", &b),
    ]);
    assert_eq!(interpret(&asgns, &[&o15])[0], vec![60.0; 6]);
    let (got, src) = compute(&asgns, &b, &[&o15]);
    assert_eq!(got[0], vec![60.0; 6], "{src}");
}

/// Open bug (found by the differential test: seed 20240736 from base 20240601 with the
/// default flags; seeds 33000949 and 33002104 from base 33000000 with
/// `ARRAYJIT_ARCH_FLAGS=-march=x86-64-v2`): a GEMM kernel whose zero fill is folded into it
/// (`initialize_neutral` on a result it writes whole) and that has no loop around it is a
/// *sequence* of top-level statements (packing loops, the loop over full row panels, then
/// for the edge tile: the zeroing of its vector accumulators, its reduction loop, the
/// stores of the accumulators into the tile buffer, the copy into the result).
/// `Llc::flatten` splices that sequence into the routine's statements, and
/// `codegen::split_parts` may then cut the routine into two C functions inside it:
///
/// - between the reduction loop and the stores: the second function uses vector variables
///   it does not declare and does not compile (`‘vec52’ undeclared`);
/// - between the zeroing and the reduction loop: the second function declares the
///   accumulators and reads them **uninitialized**: silently wrong results (with AVX-512:
///   64 of the 901 cells of `c` below, in the 11 rows of the edge tile; in the fuzz cases
///   values like 4.9e12 instead of 8.1).
///
/// Where the cut falls depends on the weight of the statements before the product: here
/// 53x47 @ 47x17 single after `n` pointwise statements `e_i = -a`: with AVX-512 (default
/// flags) `n` = 4-8 do not compile and `n` = 9-13 give wrong values; with
/// `-march=x86-64-v2`, 6-7 and 8-13. Fixed by splitting routines into C functions only at
/// their top-level statements (a kernel is one statement). The program file of the silent
/// form:
/// `{"tensors": [{"name": "a", "dims": [53, 47], "prec": "single", "init": {...}}, {"name":
/// "b", "dims": [47, 17], ...}, {"name": "c", "dims": [53, 17], "prec": "single"}, {"name":
/// "e0", "dims": [53, 47], "prec": "single"}, ... "e8"], "routines": [{"name": "mm",
/// "code": [{"assign": "e0", "op": "neg", "args": ["a"], "logic": "ab->ab", "accum": "set",
/// "init_neutral": false}, ... (9 times), {"assign": "c", "op": "mul", "args": ["a", "b"],
/// "logic": "ij,jk->ik", "accum": "add", "init_neutral": true}]}], ...}`.
#[test]
fn regression_gemm_kernel_split_across_parts() {
    use common::*;
    let b = Bindings::empty();
    let av: Vec<f64> = (0..53 * 47)
        .map(|i| ((i * 7 % 17) as f64 - 8.0) / 8.0)
        .collect();
    let bv: Vec<f64> = (0..47 * 17)
        .map(|i| ((i * 5 % 17) as f64 - 8.0) / 8.0)
        .collect();
    let mut failures = vec![];
    for n in 0..14 {
        let a = input("a", &[53, 47], Prec::Single, &av);
        let bm = input("b", &[47, 17], Prec::Single, &bv);
        let c = output("c", &[53, 17], Prec::Single);
        let mut stmts = vec![];
        for k in 0..n {
            let e = output(&format!("e{k}"), &[53, 47], Prec::Single);
            stmts.push(unop(&e, Binop::Arg2, false, Unop::Neg, &a, "ab->ab", &b));
        }
        stmts.push(binop(
            &c,
            Binop::Add,
            true,
            Binop::Mul,
            &a,
            &bm,
            "ij,jk->ik",
            &b,
        ));
        let asgns = Assignments::seq(stmts);
        // Dyadic values with small sums: exact in any order.
        let want = interpret(&asgns, &[&c]);
        let backend = CcBackend::new();
        match common::build(&backend, &format!("gemm_split_{n}"), &b, &asgns) {
            Err(e) => failures.push(format!("{n} statements before: compiling failed: {e}")),
            Ok((routine, _)) => {
                let got = common::run_and_read(&backend, &routine, &[&c]);
                let wrong = got[0].iter().zip(&want[0]).filter(|(g, w)| g != w).count();
                if wrong > 0 {
                    failures.push(format!("{n} statements before: {wrong} wrong cells"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The detection of the silent form of the bug above in C text: a function that reads a
/// vector variable before assigning it.
#[test]
fn uninitialized_vector_detection() {
    let ok = "static int f_p1(float *restrict a) {\n  __m512 vec1;\n  __m512 vec2;\n  vec1 = _mm512_setzero_ps();\n  for (int64_t i = 0; i <= 3; ++i) {\n    vec2 = _mm512_loadu_ps(&a[i * 16]);\n    vec1 = _mm512_add_ps(vec1, vec2);\n  }\n  _mm512_storeu_ps(&a[0], vec1);\n  return 0;\n}\n";
    assert!(run::uninitialized_vectors(ok).is_empty());
    let split = "static int f_p2(float *restrict a) {\n  __m512 vec1;\n  __m512 vec2;\n  for (int64_t i = 0; i <= 3; ++i) {\n    vec2 = _mm512_loadu_ps(&a[i * 16]);\n    vec1 = _mm512_add_ps(vec1, vec2);\n  }\n  return 0;\n}\n";
    assert_eq!(run::uninitialized_vectors(split), vec!["f_p2".to_string()]);
    let undeclared =
        "static int f_p2(float *restrict a) {\n  _mm512_storeu_ps(&a[0], vec17);\n  return 0;\n}\n";
    assert_eq!(
        run::uninitialized_vectors(undeclared),
        vec!["f_p2".to_string()]
    );
}

/// GCC 12 at `-O3 -march=native` (AVX-512) with `--param=max-completely-peel-times=1`
/// (which arrayjit passes) vectorizes the fill of a small local array with an aligned 32-byte
/// store (`vmovapd`), having raised the array's alignment, but does not realign the stack
/// frame: the store faults whenever the frame is only 16-byte aligned (seed 1602: the fill
/// `t3 = -inf` of a `double[36]` local, SIGSEGV in `case_1602_routine`). Local arrays are
/// now declared with an explicit 64-byte alignment, which every compiler must honour by
/// realigning the frame. The program runs with the optimizer on and off, and matches the
/// interpreter.
#[test]
fn regression_gcc12_unaligned_stack_array() {
    let (reports, _) = process(&[1602], &Opts::default(), false);
    for r in &reports {
        assert!(r.problems.is_empty(), "seed {}: {:?}", r.seed, r.problems);
    }
    // Every local array of the generated routine states its alignment (with the optimizer
    // off, `t3` is a local array).
    let inst = instantiate(&generate(1602));
    let backend = CcBackend::with_settings(Settings::default().enabled(false));
    backend.initialize(arrayjit::backend::Config::default());
    let compiled = backend
        .compile(
            true,
            Some("case_1602"),
            &Bindings(inst.statics.clone()),
            &inst.asgns,
        )
        .unwrap();
    let locals: Vec<&str> = compiled
        .source()
        .lines()
        .filter(|l| l.trim_end().ends_with("= {0};"))
        .collect();
    assert!(!locals.is_empty(), "{}", compiled.source());
    for line in locals {
        assert!(line.contains("__attribute__((aligned(64)))"), "{line}");
    }
}

/// Bug (fixed): a random fetch read through an affine entry (`t[{s0}, a, 2a+1, b]`) is inlined
/// into its reader, and the reader into the next one: the inliner renames the loops of the
/// reader but not the terms of the random value's linear counter index, so the C reads an
/// undeclared iterator ("'i5' undeclared"). Found by the differential test (seed 2420954277,
/// `max_visits` 64). Such computations now stay materialized, like reads of linear indices.
#[test]
fn regression_random_fetch_inlined_through_affine_index() {
    use common::*;
    let s0 = StaticSymbol::new("s0", Some(3));
    let b = Bindings(vec![s0.clone()]);
    let t = temp("t", &[3, 5, 3, 1], Prec::Byte);
    let xv: Vec<f64> = (0..20).map(|i| ((i * 37) % 256) as f64).collect();
    let x = input("x", &[4, 5], Prec::Byte, &xv);
    let t2 = temp("t2", &[1], Prec::Half);
    let out = output("out", &[1], Prec::Bfloat16);
    let asgns = Assignments::seq([
        Assignments::Fetch {
            array: t.clone(),
            fetch_op: arrayjit::ir::FetchOp::Random { seed: 3735928559 },
        },
        binop(
            &t2,
            Binop::Arg2,
            true,
            Binop::Le,
            &t,
            &x,
            "{s0}a(2*a+1)b,bc->0",
            &b,
        ),
        unop(&out, Binop::Arg2, false, Unop::Identity, &t2, "a->a", &b),
    ]);
    let mut mem = Memory::new();
    mem.load_from_hosts(&asgns.nodes());
    interp::run_assignments(&asgns, &[(s0.clone(), 2)], &mut mem).unwrap();
    let want = vec![mem.get(&out).unwrap().to_vec()];
    let backend = CcBackend::with_settings(Settings::default().max_visits(MANY_VISITS));
    let (r, src) = common::build(&backend, "random_affine", &b, &asgns)
        .unwrap_or_else(|e| panic!("compiling failed: {e}"));
    r.bindings().set("s0", 2).unwrap();
    let got = common::run_and_read(&backend, &r, &[&out]);
    assert_eq!(got, want, "{src}");
}

/// Bug (fixed): loop interchange (`optimize/loops.rs`) treated every loop that appears in the
/// written index as selecting the cell, including the loops of an affine result entry
/// `(a+b)`, which write one cell at several points. It moved such a loop inward, changing
/// the order of the accumulation steps of a cell; with a byte result, stored (truncated)
/// after every step, the values changed (254 vs 253). Found by the differential test
/// (seed 1420954373, `max_visits` 64, which inlines `t1` and makes its loop the one to
/// move).
#[test]
fn regression_byte_accumulation_of_inlined_fp8() {
    use common::*;
    let b = Bindings::empty();
    let x0 = input(
        "x0",
        &[2, 1, 4],
        Prec::Single,
        &[1.0, 1.625, 3.0, 1.875, 0.625, 2.125, 0.875, 1.875],
    );
    let x5 = input(
        "x5",
        &[4],
        Prec::Fp8,
        &[-1.75, 0.02734375, -0.01953125, 0.375],
    );
    let t1 = temp("t1", &[2], Prec::Fp8);
    let o9 = output("o9", &[6, 5], Prec::Byte);
    let asgns = Assignments::seq([
        unop(&t1, Binop::Arg2, true, Unop::Trunc, &x0, "aab->a", &b),
        binop(
            &o9,
            Binop::Add,
            false,
            Binop::Sub,
            &x5,
            &t1,
            "a,b->(a+b)1",
            &b,
        ),
    ]);
    let want = interpret(&asgns, &[&o9]);
    let backend = CcBackend::with_settings(Settings::default().max_visits(MANY_VISITS));
    let (r, src) = common::build(&backend, "byte_fp8", &b, &asgns)
        .unwrap_or_else(|e| panic!("compiling failed: {e}"));
    let got = common::run_and_read(&backend, &r, &[&o9]);
    assert_eq!(got, want, "{src}");
}

/// The example program `examples/programs/affine_byte_accumulation.json` (the program of
/// `regression_byte_accumulation_of_inlined_fp8`, run twice by the CLI): its values, computed
/// here step by step in the order of SPEC 9.3 (row-major over the product space `a, b`),
/// truncating and wrapping into a byte after every step.
#[test]
fn example_affine_byte_accumulation() {
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/programs/affine_byte_accumulation.json"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_arrayjit"))
        .args(["run", file])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let got: Vec<f64> = v["o9"]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    // t1[a] = trunc(x0[a, 0, 3]) (the last point of the `set` reduction over b).
    let t1 = [2.5f64.trunc(), 3.75f64.trunc()];
    let x5 = [-1.75, 0.02734375, -0.01953125, 0.375];
    let mut want = vec![0.0f64; 30];
    for _run in 0..2 {
        for (a, &xa) in x5.iter().enumerate() {
            for (b, &tb) in t1.iter().enumerate() {
                let cell = (a + b) * 5 + 1;
                want[cell] = (want[cell] + (xa - tb)).trunc().rem_euclid(256.0);
            }
        }
    }
    assert_eq!(got, want);
}

/// Bug (fixed): tracing took a store that covers every cell of a node (`t[i] := ...` over all
/// of `i`) as covering them from its first traced iteration, so a later iteration of the same
/// loop that read a cell before writing it (an in-place update of a node only partly written
/// before) looked like a read of written cells. The node was not recurrent, became Local, and
/// lost between runs the cells only earlier runs had written. Found by the fuzzer (seed
/// 1610420943, with every compiler); the interpreter on unoptimized code keeps them.
#[test]
fn regression_in_place_update_after_partial_write_is_recurrent() {
    use common::*;
    let b = Bindings::empty();
    let x = input("x", &[3], Prec::Single, &[5., 6., 7.]);
    let one = input("one", &[2], Prec::Single, &[1., 1.]);
    let t = temp("t", &[2], Prec::Single);
    let out = output("out", &[2], Prec::Single);
    // t[0] = x[a] for every a (the last one, 7, stays); t[i] += 1; out = t.
    let asgns = Assignments::seq([
        unop(&t, Binop::Arg2, false, Unop::Identity, &x, "a->0", &b),
        unop(&t, Binop::Add, false, Unop::Identity, &one, "i->i", &b),
        unop(&out, Binop::Arg2, false, Unop::Identity, &t, "i->i", &b),
    ]);
    // t[1] only grows by one per run, from the zeros of the first run.
    let want = [vec![8., 1.], vec![8., 2.], vec![8., 3.]];
    let mut mem = Memory::new();
    mem.load_from_hosts(&asgns.nodes());
    for w in &want {
        interp::run_assignments(&asgns, &[], &mut mem).unwrap();
        assert_eq!(mem.get(&out).unwrap(), &w[..], "interpreter");
    }
    let backend = CcBackend::new();
    let (routine, src) = common::build(&backend, "in_place", &b, &asgns).unwrap();
    for w in &want {
        let got = common::run_and_read(&backend, &routine, &[&out]);
        assert_eq!(
            got[0],
            *w,
            "compiled; t is {:?}:\n{src}",
            backend.memory_mode(&t)
        );
    }
    // The fuzzer's program, replayed.
    let opts = Opts {
        settings: Settings::default(),
        checked: false,
    };
    let (reports, _) = process(&[1_610_420_943], &opts, false);
    let problems: Vec<&String> = reports.iter().flat_map(|r| &r.problems).collect();
    assert!(problems.is_empty(), "{problems:#?}");
}
/// Bug in the harness (fixed): the error analysis multiplied an unbounded error by a zero
/// magnitude (`inf * 0`), and the NaN bound made two identical values (0.0 and 0.0) a
/// mismatch. Found by `scripts/fuzz.sh` (seed 4467658982, with `-march=x86-64-v2`).
#[test]
fn regression_identical_values_agree_whatever_the_bound() {
    let p = generate(4_467_658_982);
    for (ti, t) in p.tensors.iter().enumerate() {
        for r in &p.ests {
            assert!(!r[ti].err.is_nan(), "{}: {:?}", t.name, r[ti]);
        }
    }
    let (reports, _) = process(&[4_467_658_982], &Opts::default(), false);
    let problems: Vec<&String> = reports.iter().flat_map(|r| &r.problems).collect();
    assert!(problems.is_empty(), "{problems:#?}");
}
