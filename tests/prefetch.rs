//! Software prefetching of row streams (`src/optimize/prefetch.rs`): a row loop making several
//! passes over the rows of large tensors (a fused softmax) gets prefetches of the next row of
//! what it reads and of the current row of what it writes last; they change no value (the same
//! bits as the same program compiled without them, and softmax computed in f64 within the
//! vector `exp`'s few ulps, the last row included, whose next row lies past the tensor), and
//! the C is otherwise unchanged. Tensors smaller than the L2 cache and single-pass loops get
//! none.

mod common;
use arrayjit::backend::{CcBackend, Config, MergeBuffer};
use arrayjit::compile::CompilerConfig;
use arrayjit::interp::{self, Memory};
use arrayjit::ir::*;
use arrayjit::optimize::Settings;
use arrayjit::target::VectorTarget;
use common::*;

fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((((x >> 40) as f64) / (1u64 << 24) as f64) * 8.0 - 4.0) as f32 as f64
        })
        .collect()
}

/// Outputs of the compiled code, its C, and the outputs of the interpreter running the
/// optimized loop IR (which ignores prefetches).
fn run(
    asgns: &Assignments,
    outs: &[&Tnode],
    target: VectorTarget,
) -> (Vec<Vec<f64>>, String, Vec<Vec<f64>>) {
    let settings = Settings::default().target(Some(target));
    let backend = CcBackend::with_config(CompilerConfig::from_env().unwrap(), settings);
    backend.initialize(Config::default());
    let b = Bindings::empty();
    let code = backend.compile(true, Some("pf"), &b, asgns).unwrap();
    let ctx = backend.init("pf").unwrap();
    let r = backend.link(&[], &MergeBuffer::new(), &ctx, &code).unwrap();
    let nodes = asgns.nodes();
    for tn in &nodes {
        backend.from_host(r.context(), tn).unwrap();
    }
    let mut mem = Memory::new();
    mem.load_from_hosts(nodes.iter());
    interp::run_optimized(code.optimized(), &[], &mut mem).unwrap();
    let interp = outs.iter().map(|t| mem.get(t).unwrap().to_vec()).collect();
    (
        run_and_read(&backend, &r, outs),
        code.source().to_string(),
        interp,
    )
}

/// A 32-byte vector target with the given L2 size.
fn target(l2_bytes: usize) -> VectorTarget {
    VectorTarget::default()
        .vector_bytes(32)
        .l1d_bytes(32 << 10)
        .l2_bytes(l2_bytes)
}

fn prefetch_lines(src: &str) -> Vec<&str> {
    src.lines().filter(|l| l.contains("AJ_PREFETCH(")).collect()
}

/// Softmax over 48 rows of 1000 floats (192 KB: larger than an L2 of 64 KB, smaller than one
/// of 1 GB), each row one fused loop of four passes.
#[test]
fn softmax_rows_prefetch_the_next_row_and_change_nothing() {
    let (n, m) = (48, 1000);
    let xv = values(n * m, 11);
    let b = Bindings::empty();
    let x = input("x", &[n, m], Prec::Single, &xv);
    let mx = temp("m", &[n], Prec::Single);
    let d = temp("d", &[n, m], Prec::Single);
    let e = temp("e", &[n, m], Prec::Single);
    let s = temp("s", &[n], Prec::Single);
    let y = output("y", &[n, m], Prec::Single);
    let code = Assignments::seq([
        unop(&mx, Binop::Max, true, Unop::Identity, &x, "ij->i", &b),
        binop(&d, Binop::Arg2, false, Binop::Sub, &x, &mx, "ij,i->ij", &b),
        unop(&e, Binop::Arg2, false, Unop::Exp, &d, "ij->ij", &b),
        unop(&s, Binop::Add, true, Unop::Identity, &e, "ij->i", &b),
        binop(&y, Binop::Arg2, false, Binop::Div, &e, &s, "ij,i->ij", &b),
    ]);
    let (with, src, interp) = run(&code, &[&y], target(64 << 10));
    let (without, plain_src, _) = run(&code, &[&y], target(1 << 30));
    let hints = prefetch_lines(&src);
    // The next row of x (1000 elements on) read, the current row of y written.
    assert!(
        hints
            .iter()
            .any(|l| l.contains("AJ_PREFETCH(x") && l.contains("+ 1000") && l.ends_with(", 0);")),
        "{src}"
    );
    assert!(
        hints
            .iter()
            .any(|l| l.contains("AJ_PREFETCH(y") && l.ends_with(", 1);")),
        "{src}"
    );
    // Only there: the C without them is the C compiled for the large L2.
    assert!(prefetch_lines(&plain_src).is_empty(), "{plain_src}");
    let stripped: Vec<&str> = src
        .lines()
        .filter(|l| !l.contains("AJ_PREFETCH("))
        .collect();
    assert_eq!(stripped, plain_src.lines().collect::<Vec<_>>());
    // The same bits, and softmax.
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&with[0]), bits(&without[0]));
    for i in 0..n {
        let row = &xv[i * m..(i + 1) * m];
        let mxv = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - mxv).exp()).sum();
        for j in 0..m {
            let want = (row[j] - mxv).exp() / sum;
            for (what, got) in [
                ("compiled", with[0][i * m + j]),
                ("interpreted", interp[0][i * m + j]),
            ] {
                let ulp = ((want as f32).abs().next_up() - (want as f32).abs()) as f64;
                assert!(
                    (got - want).abs() <= 8.0 * ulp,
                    "{what} y[{i}, {j}] = {got:e}, want {want:e}"
                );
            }
        }
    }
}

/// A row loop of one pass (row sums) and the passes of a GEMM kernel over panels that are not
/// contiguous get no prefetch, however large the tensors.
#[test]
fn single_passes_and_sparse_ranges_get_no_prefetch() {
    let (n, m) = (64, 512);
    let b = Bindings::empty();
    let x = input("x", &[n, m], Prec::Single, &values(n * m, 3));
    let w = input("w", &[m, m], Prec::Single, &values(m * m, 4));
    let s = output("s", &[n], Prec::Single);
    let c = output("c", &[n, m], Prec::Single);
    let code = Assignments::seq([
        unop(&s, Binop::Add, true, Unop::Identity, &x, "ij->i", &b),
        binop(&c, Binop::Add, true, Binop::Mul, &x, &w, "ij,jk->ik", &b),
    ]);
    let (out, src, _) = run(&code, &[&s, &c], target(16 << 10));
    assert!(src.contains("GEMM kernel"), "{src}");
    assert!(prefetch_lines(&src).is_empty(), "{src}");
    // And the results are the sums and products.
    let xv = values(n * m, 3);
    let wv = values(m * m, 4);
    for i in 0..n {
        let want: f64 = xv[i * m..(i + 1) * m].iter().sum();
        assert!(
            (out[0][i] - want).abs() <= 1e-3 * (1.0 + want.abs()),
            "s[{i}]"
        );
        for k in [0, 7, m - 1] {
            let want: f64 = (0..m).map(|j| xv[i * m + j] * wv[j * m + k]).sum();
            assert!(
                (out[1][i * m + k] - want).abs() <= 1e-3 * (1.0 + want.abs()),
                "c[{i}, {k}]"
            );
        }
    }
}
