//! Every core for one routine (issue 21, item 4): parallel regions run on a device's thread
//! team, and the results are the same bits for 1, 2, 3 and 8 threads, equal to the
//! interpreter's on the same optimized code and close to plain loops written here.

mod common;

use arrayjit::backend::{Backend, CcBackend, MulticoreBackend};
use arrayjit::interp::{self, Memory};
use arrayjit::ir::*;
use arrayjit::loops::{visit_llc, Llc};
use arrayjit::optimize::Optimized;
use arrayjit::{Error, Jit, JitConfig};
use common::*;
use std::time::{Duration, Instant};

const THREADS: [usize; 4] = [1, 2, 3, 8];

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

fn none() -> Bindings {
    Bindings::empty()
}

/// A program: its code, inputs (hosted, with values), outputs (hosted) and the values plain
/// loops compute for them.
struct Case {
    name: &'static str,
    code: Assignments,
    inputs: Vec<Tnode>,
    outputs: Vec<Tnode>,
    want: Vec<Vec<f64>>,
    /// How close the compiled results must be to `want` (relative).
    tolerance: f64,
}

fn regions(o: &Optimized) -> usize {
    let mut n = 0;
    visit_llc(&o.code, &mut |c| {
        n += usize::from(matches!(c, Llc::Parallel(_)))
    });
    n
}

fn jit(threads: usize) -> Jit {
    Jit::new(
        JitConfig::from_env()
            .expect("a C compiler is needed for these tests")
            .threads(Some(threads)),
    )
    .unwrap()
}

/// Compiles and runs the case on a device of `threads` threads; the outputs, the optimized
/// code and the C source.
fn run(case: &Case, threads: usize) -> (Vec<Vec<f64>>, Optimized, String) {
    run_on(&jit(threads), threads, case)
}

/// [`run`] with a given JIT of `threads` threads.
fn run_on(jit: &Jit, threads: usize, case: &Case) -> (Vec<Vec<f64>>, Optimized, String) {
    let code = jit.compile(case.name, &none(), &case.code).unwrap();
    let device = jit.device().unwrap();
    assert_eq!(device.threads(), threads, "{}", case.name);
    let ctx = jit.context(&device).unwrap();
    let r = jit.link(&ctx, &code).unwrap();
    for t in &case.inputs {
        jit.upload(r.context(), t).unwrap();
    }
    r.schedule().unwrap();
    let outs = case
        .outputs
        .iter()
        .map(|t| {
            jit.download(r.context(), t).unwrap();
            t.host_values().unwrap()
        })
        .collect();
    (outs, code.optimized().clone(), code.source().to_string())
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Runs the case on 1, 2, 3 and 8 threads: identical bits, a parallel region in the code,
/// the interpreter's values on that code, and values close to the plain loops'.
fn check(case: &Case) {
    let (first, o, src) = run(case, 1);
    assert!(
        regions(&o) > 0,
        "{}: no parallel region\n{}",
        case.name,
        arrayjit::loops::to_doc(&o.code)
    );
    for &t in &THREADS[1..] {
        let (got, _, src2) = run(case, t);
        assert_eq!(src2, src, "{}: the code depends on the threads", case.name);
        for (k, (g, f)) in got.iter().zip(&first).enumerate() {
            assert_eq!(
                bits(g),
                bits(f),
                "{}: output {k} on {t} threads differs from 1 thread",
                case.name
            );
        }
    }
    // The interpreter on the same optimized code (up to the C compiler's contractions of
    // `a * b + c` and the interpreter's rounding of intermediate results).
    let mut mem = Memory::new();
    mem.load_from_hosts(case.inputs.iter());
    interp::run_optimized(&o, &[], &mut mem).unwrap();
    for (k, (out, f)) in case.outputs.iter().zip(&first).enumerate() {
        let interpreted = mem.get(out).unwrap();
        for (i, (a, b)) in interpreted.iter().zip(f).enumerate() {
            let close = a == b || (a - b).abs() <= 1e-5 * b.abs().max(1.0);
            assert!(
                close,
                "{}: output {k} cell {i}: interpreted {a}, compiled {b}",
                case.name
            );
        }
    }
    for (k, (w, f)) in case.want.iter().zip(&first).enumerate() {
        assert_eq!(w.len(), f.len());
        for (i, (w, g)) in w.iter().zip(f).enumerate() {
            assert!(
                (w - g).abs() <= case.tolerance * w.abs().max(1.0),
                "{}: output {k} cell {i}: got {g}, plain loops {w}",
                case.name
            );
        }
    }
}

fn f32s(v: &[f64]) -> Vec<f64> {
    v.iter().map(|x| *x as f32 as f64).collect()
}

/// `out = relu(a * b + c) * 2 - d`, elementwise over 2^18 cells.
fn elementwise() -> Case {
    let n = 1 << 18;
    let (av, bv, cv, dv) = (values(n, 1), values(n, 2), values(n, 3), values(n, 4));
    let p = Prec::Single;
    let (a, b, c, d) = (
        input("a", &[n], p, &av),
        input("b", &[n], p, &bv),
        input("c", &[n], p, &cv),
        input("d", &[n], p, &dv),
    );
    let two = input("two", &[1], p, &[2.0]);
    let (ab, abc, r, r2) = (
        temp("ab", &[n], p),
        temp("abc", &[n], p),
        temp("r", &[n], p),
        temp("r2", &[n], p),
    );
    let out = output("out", &[n], p);
    let code = Assignments::seq([
        binop(
            &ab,
            Binop::Arg2,
            false,
            Binop::Mul,
            &a,
            &b,
            "i,i->i",
            &none(),
        ),
        binop(
            &abc,
            Binop::Arg2,
            false,
            Binop::Add,
            &ab,
            &c,
            "i,i->i",
            &none(),
        ),
        unop(&r, Binop::Arg2, false, Unop::Relu, &abc, "i->i", &none()),
        binop(
            &r2,
            Binop::Arg2,
            false,
            Binop::Mul,
            &r,
            &two,
            "i,0->i",
            &none(),
        ),
        binop(
            &out,
            Binop::Arg2,
            false,
            Binop::Sub,
            &r2,
            &d,
            "i,i->i",
            &none(),
        ),
    ]);
    let (av, bv, cv, dv) = (f32s(&av), f32s(&bv), f32s(&cv), f32s(&dv));
    let want = (0..n)
        .map(|i| (av[i] * bv[i] + cv[i]).max(0.0) * 2.0 - dv[i])
        .collect();
    Case {
        name: "elementwise",
        code,
        inputs: vec![a, b, c, d, two],
        outputs: vec![out],
        want: vec![want],
        tolerance: 1e-6,
    }
}

/// Sums of the rows of a 512×512 matrix, and the sum of all its cells (a reduction split
/// into blocks).
fn sums(full: bool) -> Case {
    let (m, n) = (512, 512);
    let xv = values(m * n, 5);
    let p = Prec::Single;
    let x = input("x", &[m, n], p, &xv);
    let xv = f32s(&xv);
    if full {
        let s = output("s", &[1], p);
        let code = unop(&s, Binop::Add, true, Unop::Identity, &x, "ij->0", &none());
        let want = vec![xv.iter().sum::<f64>()];
        Case {
            name: "full_sum",
            code,
            inputs: vec![x],
            outputs: vec![s],
            want: vec![want],
            tolerance: 1e-4,
        }
    } else {
        let s = output("s", &[m], p);
        let code = unop(&s, Binop::Add, true, Unop::Identity, &x, "ij->i", &none());
        let want = (0..m)
            .map(|i| xv[i * n..(i + 1) * n].iter().sum())
            .collect();
        Case {
            name: "row_sums",
            code,
            inputs: vec![x],
            outputs: vec![s],
            want: vec![want],
            tolerance: 1e-5,
        }
    }
}

/// A softmax over the rows of an `m`×`n` matrix.
fn softmax(name: &'static str, m: usize, n: usize) -> Case {
    let xv = values(m * n, 6);
    let p = Prec::Single;
    let x = input("x", &[m, n], p, &xv);
    let (mx, d, e, s) = (
        temp("m", &[m], p),
        temp("d", &[m, n], p),
        temp("e", &[m, n], p),
        temp("s", &[m], p),
    );
    let y = output("y", &[m, n], p);
    let code = Assignments::seq([
        unop(&mx, Binop::Max, true, Unop::Identity, &x, "ij->i", &none()),
        binop(
            &d,
            Binop::Arg2,
            false,
            Binop::Sub,
            &x,
            &mx,
            "ij,i->ij",
            &none(),
        ),
        unop(&e, Binop::Arg2, false, Unop::Exp, &d, "ij->ij", &none()),
        unop(&s, Binop::Add, true, Unop::Identity, &e, "ij->i", &none()),
        binop(
            &y,
            Binop::Arg2,
            false,
            Binop::Div,
            &e,
            &s,
            "ij,i->ij",
            &none(),
        ),
    ]);
    let xv = f32s(&xv);
    let mut want = vec![0.0; m * n];
    for i in 0..m {
        let row = &xv[i * n..(i + 1) * n];
        let mxv = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - mxv).exp()).sum();
        for j in 0..n {
            want[i * n + j] = (row[j] - mxv).exp() / sum;
        }
    }
    Case {
        name,
        code,
        inputs: vec![x],
        outputs: vec![y],
        want: vec![want],
        tolerance: 1e-5,
    }
}

/// A layer norm over the rows of a 256×1024 matrix: `(x - mean) * rsqrt(var + eps) * g + b`.
fn layer_norm() -> Case {
    let (m, n) = (256, 1024);
    let p = Prec::Single;
    let (xv, gv, bv) = (values(m * n, 7), values(n, 8), values(n, 9));
    let x = input("x", &[m, n], p, &xv);
    let g = input("g", &[n], p, &gv);
    let b = input("b", &[n], p, &bv);
    let inv_n = input("inv_n", &[1], p, &[1.0 / n as f64]);
    let eps = input("eps", &[1], p, &[1e-5]);
    let (mu, c, var, ve, r, nn) = (
        temp("mu", &[m], p),
        temp("c", &[m, n], p),
        temp("var", &[m], p),
        temp("ve", &[m], p),
        temp("r", &[m], p),
        temp("n", &[m, n], p),
    );
    let cc = temp("cc", &[m, n], p);
    let y = output("y", &[m, n], p);
    let code = Assignments::seq([
        binop(
            &mu,
            Binop::Add,
            true,
            Binop::Mul,
            &x,
            &inv_n,
            "ij,0->i",
            &none(),
        ),
        binop(
            &c,
            Binop::Arg2,
            false,
            Binop::Sub,
            &x,
            &mu,
            "ij,i->ij",
            &none(),
        ),
        binop(
            &cc,
            Binop::Arg2,
            false,
            Binop::Mul,
            &c,
            &c,
            "ij,ij->ij",
            &none(),
        ),
        binop(
            &var,
            Binop::Add,
            true,
            Binop::Mul,
            &cc,
            &inv_n,
            "ij,0->i",
            &none(),
        ),
        binop(
            &ve,
            Binop::Arg2,
            false,
            Binop::Add,
            &var,
            &eps,
            "i,0->i",
            &none(),
        ),
        unop(&r, Binop::Arg2, false, Unop::Rsqrt, &ve, "i->i", &none()),
        binop(
            &nn,
            Binop::Arg2,
            false,
            Binop::Mul,
            &c,
            &r,
            "ij,i->ij",
            &none(),
        ),
        binop(
            &cc,
            Binop::Arg2,
            false,
            Binop::Mul,
            &nn,
            &g,
            "ij,j->ij",
            &none(),
        ),
        binop(
            &y,
            Binop::Arg2,
            false,
            Binop::Add,
            &cc,
            &b,
            "ij,j->ij",
            &none(),
        ),
    ]);
    let (xv, gv, bv) = (f32s(&xv), f32s(&gv), f32s(&bv));
    let mut want = vec![0.0; m * n];
    for i in 0..m {
        let row = &xv[i * n..(i + 1) * n];
        let mean = row.iter().sum::<f64>() / n as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
        let r = 1.0 / (var + 1e-5).sqrt();
        for j in 0..n {
            want[i * n + j] = (row[j] - mean) * r * gv[j] + bv[j];
        }
    }
    Case {
        name: "layer_norm",
        code,
        inputs: vec![x, g, b, inv_n, eps],
        outputs: vec![y],
        want: vec![want],
        tolerance: 1e-4,
    }
}

/// A 512×512×512 product (the packed GEMM kernels).
fn matmul(name: &'static str, (m, k, n): (usize, usize, usize)) -> Case {
    let p = Prec::Single;
    let (av, bv) = (values(m * k, 10), values(k * n, 11));
    let a = input("a", &[m, k], p, &av);
    let b = input("b", &[k, n], p, &bv);
    let c = output("c", &[m, n], p);
    let code = binop(
        &c,
        Binop::Add,
        true,
        Binop::Mul,
        &a,
        &b,
        "ik,kj->ij",
        &none(),
    );
    let want = plain_product(vec![0.0; m * n], &f32s(&av), &f32s(&bv), (m, k, n));
    Case {
        name,
        code,
        inputs: vec![a, b],
        outputs: vec![c],
        want: vec![want],
        tolerance: 1e-4,
    }
}

/// `c + a·b` by plain loops, for `a` of `m × k` and `b` of `k × n`, row-major.
fn plain_product(
    mut c: Vec<f64>,
    a: &[f64],
    b: &[f64],
    (m, k, n): (usize, usize, usize),
) -> Vec<f64> {
    for i in 0..m {
        for kk in 0..k {
            let x = a[i * k + kk];
            for j in 0..n {
                c[i * n + j] += x * b[kk * n + j];
            }
        }
    }
    c
}

/// A 3×3 convolution with padding 1, 1×28×28×`ci` → `co` channels.
fn convolution(ci: usize, co: usize) -> Case {
    convolution_of(28, ci, co)
}

/// A 3×3 convolution (padding 1) of a `hw`×`hw` image of `ci` channels into `co` channels.
fn convolution_of(hw: usize, ci: usize, co: usize) -> Case {
    let (h, w) = (hw, hw);
    let p = Prec::Single;
    let (xv, wv) = (values(h * w * ci, 12), values(9 * ci * co, 13));
    let x = input("x", &[1, h, w, ci], p, &xv);
    let k = input("k", &[3, 3, ci, co], p, &wv);
    let y = output("y", &[1, h, w, co], p);
    let code = binop(
        &y,
        Binop::Add,
        true,
        Binop::Mul,
        &x,
        &k,
        "b(h+i-1)(v+j-1)c,ijcd->bhvd",
        &none(),
    );
    let (xv, wv) = (f32s(&xv), f32s(&wv));
    let mut want = vec![0.0; h * w * co];
    for r in 0..h {
        for s in 0..w {
            for i in 0..3 {
                for j in 0..3 {
                    let (yy, xx) = (r as i64 + i as i64 - 1, s as i64 + j as i64 - 1);
                    if yy < 0 || xx < 0 || yy >= h as i64 || xx >= w as i64 {
                        continue;
                    }
                    for c in 0..ci {
                        let v = xv[(yy as usize * w + xx as usize) * ci + c];
                        for d in 0..co {
                            want[(r * w + s) * co + d] += v * wv[((i * 3 + j) * ci + c) * co + d];
                        }
                    }
                }
            }
        }
    }
    Case {
        name: "convolution",
        code,
        inputs: vec![x, k],
        outputs: vec![y],
        want: vec![want],
        tolerance: 1e-4,
    }
}

#[test]
fn an_elementwise_chain_is_the_same_on_every_team() {
    check(&elementwise());
}

#[test]
fn row_sums_are_the_same_on_every_team() {
    check(&sums(false));
}

/// The full sum is split into blocks whose number depends on the loop alone, combined in
/// order: the same bits on every team.
#[test]
fn a_full_sum_is_the_same_on_every_team() {
    check(&sums(true));
}

#[test]
fn softmax_is_the_same_on_every_team() {
    check(&softmax("softmax", 256, 1024));
}

/// Rows of 8192 floats (32 KiB): the row a thread keeps is too large for its stack and lives
/// in the thread's scratch memory.
#[test]
fn softmax_with_long_rows_uses_each_threads_scratch() {
    let case = softmax("softmax_long", 16, 8192);
    let jit = jit(2);
    let code = jit.compile(case.name, &none(), &case.code).unwrap();
    assert!(
        code.source().contains("aj_scratch(aj_team, aj_tid,"),
        "{}",
        code.source()
    );
    check(&case);
}

#[test]
fn layer_norm_is_the_same_on_every_team() {
    check(&layer_norm());
}

#[test]
fn a_matmul_is_the_same_on_every_team() {
    check(&matmul("matmul", (512, 512, 512)));
}

/// How many times the regions of `c` start per run: each region counts once per iteration
/// of the loops around it.
fn region_runs(c: &Llc) -> u64 {
    match c {
        Llc::Seq(v) => v.iter().map(region_runs).sum(),
        Llc::For { from, to, body, .. } => (to - from + 1).max(0) as u64 * region_runs(body),
        Llc::If { body, .. } | Llc::Lookup { body, .. } => region_runs(body),
        Llc::Parallel(_) => 1,
        _ => 0,
    }
}

/// A product of sizes that are no multiples of the kernel's tiles (a last row panel of 4
/// rows, a last column panel of 8 columns, a shorter last reduction block): the packed
/// panels of the remainders used to defeat the analysis of the threads' own packed copies,
/// so the threads shared the column panels of each row panel, a region started per row
/// panel (hundreds of starts a run, slower on two threads than on one). The threads share
/// the row panels or column blocks now: a few region starts a run.
#[test]
fn a_matmul_with_remainders_shares_whole_panels() {
    let case = matmul("matmul_remainders", (130, 700, 200));
    let jit = jit(2);
    let code = jit.compile(case.name, &none(), &case.code).unwrap();
    let runs = region_runs(&code.optimized().code);
    assert!(
        (1..=16).contains(&runs),
        "{runs} region starts a run\n{}",
        code.source()
    );
    check(&case);
}

/// A product with a small result and a long reduction (48×40 from 4096 steps): its
/// reduction is split into groups of steps, one region over the groups each packing its own
/// operands (the threads used to share the 8 row panels of every one of 13 reduction blocks:
/// 13 region starts, slower on two threads than on one), and the partial results are added in
/// group order, so every team gives the same bits. Its result is accumulated onto the values
/// `c` holds (copied from `c0`, no zero fill), so the addition of the partials to them is
/// checked as well.
#[test]
fn a_long_reduction_is_split_into_groups_of_steps() {
    let (m, k, n) = (48, 4096, 40);
    let p = Prec::Single;
    let (av, bv, cv) = (values(m * k, 20), values(k * n, 21), values(m * n, 22));
    let a = input("a", &[m, k], p, &av);
    let b = input("b", &[k, n], p, &bv);
    let c0 = input("c0", &[m, n], p, &cv);
    let c = output("c", &[m, n], p);
    let code = Assignments::seq([
        unop(
            &c,
            Binop::Arg2,
            false,
            Unop::Identity,
            &c0,
            "ij->ij",
            &none(),
        ),
        binop(
            &c,
            Binop::Add,
            false,
            Binop::Mul,
            &a,
            &b,
            "ik,kj->ij",
            &none(),
        ),
    ]);
    let want = plain_product(f32s(&cv), &f32s(&av), &f32s(&bv), (m, k, n));
    let case = Case {
        name: "long_reduction",
        code,
        inputs: vec![a, b, c0],
        outputs: vec![c],
        want: vec![want],
        tolerance: 1e-4,
    };
    let jit = jit(2);
    let compiled = jit.compile(case.name, &none(), &case.code).unwrap();
    let o = compiled.optimized();
    assert_eq!(region_runs(&o.code), 1, "{}", compiled.source());
    assert!(
        compiled
            .source()
            .contains("split into 8 groups of 512 steps"),
        "{}",
        compiled.source()
    );
    check(&case);
}

/// The number of iterations of every parallel region of `o`, in code order.
fn region_iterations(o: &Optimized) -> Vec<i64> {
    let mut parts = vec![];
    visit_llc(&o.code, &mut |c| {
        if let Llc::Parallel(p) = c {
            parts.push(p.to - p.from + 1);
        }
    });
    parts
}

/// `got` is within the case's tolerance of its first output's plain-loop values.
fn assert_near_plain_loops(case: &Case, got: &[f64]) {
    for (w, g) in case.want[0].iter().zip(got) {
        assert!(
            (w - g).abs() <= case.tolerance * w.abs().max(1.0),
            "{}: {g} vs {w}",
            case.name
        );
    }
}

#[test]
fn a_convolution_is_the_same_on_every_team() {
    check(&convolution(32, 32));
}

/// A convolution whose weights of one tap are packed whole splits its output rows into one
/// part per core of the target, each part packing the weights for itself (no core reads the
/// copy another packed): for 3 cores, 28 rows in parts of 10, 10 and 8 (a guard skips the
/// rest of the last), the regions' loops over the 3 parts. On 1, 2 and 3 threads the same
/// bits as one part on one core, which are the plain loops' values.
#[test]
fn a_convolution_packs_its_weights_once_per_core() {
    let case = convolution(64, 64);
    let (single, _, _) = run_on(&jit_for_cores(1, 1), 1, &case);
    for threads in [1, 2, 3] {
        let (got, o, _) = run_on(&jit_for_cores(3, threads), threads, &case);
        let parts = region_iterations(&o);
        assert!(
            !parts.is_empty() && parts.iter().all(|&n| n == 3),
            "regions over {parts:?} iterations\n{}",
            arrayjit::loops::to_doc(&o.code)
        );
        assert_eq!(bits(&got[0]), bits(&single[0]), "{threads} threads");
    }
    assert_near_plain_loops(&case, &single[0]);
}

/// A convolution with few output rows and many channels (7×7, 512 → 128: 7 rows of 7
/// pixels, 2 reduction blocks of 256 channels, 8 column panels of 16 on 32-byte vectors)
/// splits its columns instead of its rows: one region around all the taps and blocks, over
/// 2 parts of 4 panels for 3 cores (3 does not divide 8), each packing its own weights.
/// Splitting the 7 rows made a region per tap and block. On 1, 2 and 3 threads the same bits
/// as on one core (no parts), which are close to the plain loops' values.
#[test]
fn a_convolution_with_few_rows_splits_its_columns() {
    let case = convolution_of(7, 512, 128);
    let (single, _, src1) = run_on(&jit_for_cores(1, 1), 1, &case);
    assert!(!src1.contains("column parts"), "{src1}");
    for threads in [1, 2, 3] {
        let (got, o, src) = run_on(&jit_for_cores(3, threads), threads, &case);
        let parts = region_iterations(&o);
        assert_eq!(parts, [2], "{}", arrayjit::loops::to_doc(&o.code));
        assert!(src.contains("in 2 column parts of 4 panels"), "{src}");
        assert_eq!(bits(&got[0]), bits(&single[0]), "{threads} threads");
    }
    assert_near_plain_loops(&case, &single[0]);
}

/// A convolution whose result exceeds half the L2 (56×56×32 floats, 401 KB, on a target of
/// 512 KiB of L2) adds every tap into a block of output rows before the next block, instead
/// of adding each tap into all of the result: one region, over a part of the rows per core,
/// with the taps inside. The same bits on 1, 2 and 3 threads as with a large L2 on one core
/// (the taps outside): each cell's sum runs in the same order.
#[test]
fn a_convolution_larger_than_the_l2_adds_its_taps_block_by_block() {
    let case = convolution_of(56, 32, 32);
    let (single, o1, _) = run_on(&jit_for(1, 1, 4 << 20), 1, &case);
    for threads in [1, 2, 3] {
        let (got, o, _) = run_on(&jit_for(3, threads, 512 << 10), threads, &case);
        let parts = region_iterations(&o);
        assert_eq!(parts, [3], "{}", arrayjit::loops::to_doc(&o.code));
        assert_ne!(
            arrayjit::loops::to_doc(&o.code),
            arrayjit::loops::to_doc(&o1.code)
        );
        assert_eq!(bits(&got[0]), bits(&single[0]), "{threads} threads");
    }
    assert_near_plain_loops(&case, &single[0]);
}

/// A convolution whose input channels are one reduction block (64) reads its rows of the
/// input where they are: the rows of a kernel call and their 64 channels are one contiguous
/// block of the input, as the packing would have copied them. No packing of `x` in the code
/// (32-byte vectors, 2 cores); the same bits on 1 and 2 threads, close to the plain loops.
#[test]
fn a_convolution_reads_an_input_block_that_is_already_packed_in_place() {
    let case = convolution_of(28, 64, 64);
    let (single, _, src) = run_on(&jit_for_cores(2, 1), 1, &case);
    assert!(src.contains("GEMM kernel"), "{src}");
    assert!(!src.contains("packed_a"), "{src}");
    let (two, _, _) = run_on(&jit_for_cores(2, 2), 2, &case);
    assert_eq!(bits(&two[0]), bits(&single[0]));
    assert_near_plain_loops(&case, &single[0]);
}

/// Whether every statement of `c` writes a tensor whose label has `part`.
fn writes_only(c: &Llc, part: &str) -> bool {
    let mut all = true;
    visit_llc(c, &mut |s| {
        if let Llc::Set { tn, .. } | Llc::VStore { tn, .. } = s {
            all &= tn.label().iter().any(|l| l == part);
        }
    });
    all
}

/// The packing of a product's column panels is a region of its own where the threads share
/// the row panels: a copy weighs four operations in the parallel pass, so the 196,608 copies
/// of a block of 256 steps of 768 columns are enough work (by their plain count they were
/// not, and the packing ran on one core between the regions: on 16 cores, about a third of
/// the time of a 512×3072×768 product). A target of 16 cores with a 2 MiB L2 (all 768
/// columns in one column block, as on Sapphire Rapids). The same bits on 1, 2 and 3 threads
/// as on one core.
#[test]
fn the_packing_of_column_panels_is_shared() {
    let case = matmul("matmul_packing", (512, 1024, 768));
    let jit = |cores: usize, threads: usize| jit_for(cores, threads, 2 << 20);
    let (single, _, _) = run_on(&jit(1, 1), 1, &case);
    for threads in [1, 2, 3] {
        let (got, o, _) = run_on(&jit(16, threads), threads, &case);
        let mut packing = 0;
        visit_llc(&o.code, &mut |c| {
            if let Llc::Parallel(p) = c {
                packing += usize::from(writes_only(&p.body, "packed_b"));
            }
        });
        assert!(
            packing > 0,
            "no region packs the panels\n{}",
            arrayjit::loops::to_doc(&o.code)
        );
        assert_eq!(bits(&got[0]), bits(&single[0]), "{threads} threads");
    }
}

/// A JIT of `threads` threads whose optimizer targets 32-byte vectors (written with the
/// portable vector extensions) and `cores` cores.
fn jit_for_cores(cores: usize, threads: usize) -> Jit {
    jit_for(cores, threads, 512 << 10)
}

/// [`jit_for_cores`] with an L2 cache of `l2_bytes`.
fn jit_for(cores: usize, threads: usize, l2_bytes: usize) -> Jit {
    let target = arrayjit::target::VectorTarget::default()
        .vector_bytes(32)
        .registers(16)
        .fma(false)
        .l1d_bytes(32 << 10)
        .l2_bytes(l2_bytes)
        .intrinsics(false)
        .cores(cores);
    let settings = arrayjit::optimize::Settings::default().target(Some(target));
    Jit::new(
        JitConfig::from_env()
            .unwrap()
            .threads(Some(threads))
            .optimizer(settings),
    )
    .unwrap()
}

/// Small work stays on one thread: no region below the threshold (the moons jobs' layers).
#[test]
fn small_loops_are_not_regions() {
    let x = input("x", &[16, 16], Prec::Single, &values(256, 1));
    let s = output("s", &[16], Prec::Single);
    let code = unop(&s, Binop::Add, true, Unop::Identity, &x, "ij->i", &none());
    let jit = jit(2);
    let c = jit.compile("small", &none(), &code).unwrap();
    assert_eq!(regions(c.optimized()), 0);
    assert!(!c.source().contains("aj_parallel("));
}

/// A loop whose iterations share cells it writes is not a region: a scatter-free
/// column sum keeps its row loop sequential (each column accumulates in row order).
#[test]
fn column_sums_keep_their_order() {
    let (m, n) = (512, 512);
    let xv = values(m * n, 3);
    let x = input("x", &[m, n], Prec::Single, &xv);
    let s = output("s", &[n], Prec::Single);
    let case = Case {
        name: "column_sums",
        code: unop(&s, Binop::Add, true, Unop::Identity, &x, "ij->j", &none()),
        inputs: vec![x],
        outputs: vec![s],
        want: vec![],
        tolerance: 0.0,
    };
    let (one, ..) = run(&case, 1);
    let (two, ..) = run(&case, 2);
    assert_eq!(bits(&one[0]), bits(&two[0]));
    // Each column summed in row order, in single precision, as the plain loop does.
    let xv = f32s(&xv);
    for j in 0..n {
        let mut acc = 0f32;
        for i in 0..m {
            acc += xv[i * n + j] as f32;
        }
        assert_eq!(one[0][j], acc as f64, "column {j}");
    }
}

/// Pins the calling thread to `core`.
fn pin(core: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET sets bit `core` (< 1024).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// A core busy with another thread (a spinning loop pinned to it) slows a team down but
/// never stalls it: chunks are claimed, so the other threads take the busy thread's share.
#[test]
fn a_busy_core_does_not_hang_a_team() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spinner = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            pin(cores.saturating_sub(1));
            let mut x = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        })
    };
    let case = elementwise();
    let (one, ..) = run(&case, 1);
    with_watchdog(300, move || {
        let jit = jit(cores.max(2));
        let code = jit.compile(case.name, &none(), &case.code).unwrap();
        let device = jit.device().unwrap();
        let ctx = jit.context(&device).unwrap();
        let r = jit.link(&ctx, &code).unwrap();
        for t in &case.inputs {
            jit.upload(r.context(), t).unwrap();
        }
        let start = Instant::now();
        for _ in 0..50 {
            r.schedule().unwrap();
        }
        jit.download(r.context(), &case.outputs[0]).unwrap();
        assert!(start.elapsed() < Duration::from_secs(120));
        assert_eq!(bits(&case.outputs[0].host_values().unwrap()), bits(&one[0]));
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    spinner.join().unwrap();
}

/// An out-of-bounds access inside a parallel region, in bounds-checked code, is reported
/// as on one thread (the tensor and the indices), whichever thread met it.
#[test]
fn an_out_of_bounds_access_in_a_region_is_reported() {
    let (m, n) = (512, 512);
    let sh = StaticSymbol::new("sh", Some(4));
    let bindings = Bindings(vec![sh]);
    let x = input("x", &[4, m, n], Prec::Single, &values(4 * m * n, 4));
    let y = output("y", &[m, n], Prec::Single);
    let code = unop(
        &y,
        Binop::Arg2,
        false,
        Unop::Identity,
        &x,
        "{sh}ij->ij",
        &bindings,
    );
    for threads in [1, 4] {
        let backend = CcBackend::new().with_checked(true).with_threads(threads);
        let (r, src) = build(&backend, "shifted", &bindings, &code).unwrap();
        assert!(src.contains("aj_parallel("), "{src}");
        r.run_unchecked_statics_for_test(&[0]).unwrap();
        let e = r.run_unchecked_statics_for_test(&[1000]).unwrap_err();
        match e {
            Error::IndexOutOfBounds {
                tensor, extents, ..
            } => {
                assert_eq!(tensor, x.name(), "{threads} threads");
                assert_eq!(extents, vec![4, m, n]);
            }
            e => panic!("{threads} threads: {e}"),
        }
    }
}

/// One device takes every core; data-parallel devices share them out, disjoint.
#[test]
fn devices_get_disjoint_cores() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let be = MulticoreBackend::new().with_pinning(true);
    be.initialize(Default::default());
    let d0 = be.new_virtual_device(&be.get_device(0).unwrap()).unwrap();
    assert_eq!(d0.threads(), cores);
    if cores < 2 {
        return;
    }
    let d1 = be.new_virtual_device(&be.get_device(1).unwrap()).unwrap();
    assert_eq!(d0.threads() + d1.threads(), cores);
    let c0 = d0.team().unwrap().cores();
    let c1 = d1.team().unwrap().cores();
    assert!(
        c0.iter().all(|c| c.is_some() && !c1.contains(c)),
        "{c0:?} {c1:?}"
    );
    // A second virtual device of physical device 0 shares its queue and team.
    let d2 = be.new_virtual_device(&be.get_device(0).unwrap()).unwrap();
    assert_eq!(d2.threads(), d0.threads());
    // With threads per device set, physical devices are cores / threads.
    let be = MulticoreBackend::with_cc(CcBackend::new().with_threads(2));
    be.initialize(Default::default());
    assert_eq!(be.num_physical_devices(), (cores / 2).max(1));
    let d = be.new_virtual_device(&be.get_device(0).unwrap()).unwrap();
    assert_eq!(d.threads(), 2);
}
