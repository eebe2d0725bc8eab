//! Integer contractions through the GEMM kernels (`src/optimize/gemm.rs`): a statement whose
//! result and arguments are all integers computes modulo 2^64 and wraps into the result's
//! width after every step (SPEC 9.1); the kernels sum in wrapping `uint16`/`uint32`/`uint64`
//! lanes in another order, which must give exactly the same integers.
//!
//! Every expected value is computed here, point by point in the einsum's own order, in `u64`
//! wrapping arithmetic wrapped into the result's width after every step, as the SPEC words
//! it. The operands use their precisions' whole ranges (so products overflow 32 and 64 bits),
//! or values next to the extremes. Checked through the compiled code (whose C must hold the
//! kernel), through the interpreter on the optimized code for several targets, through the
//! CLI at several architecture levels, and in the assembly compilers make of the kernels.

mod common;

use arrayjit::backend::{CcBackend, Config};
use arrayjit::interp::{self, Memory};
use arrayjit::ir::einsum::projections;
use arrayjit::ir::*;
use arrayjit::optimize::{self, Settings};
use arrayjit::target::{Isa, VectorTarget};
use common::*;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

/// The value of the 64-bit pattern `bits` stored into `prec` (wrapped into its width, two's
/// complement for the signed precisions).
fn wrap(prec: Prec, bits: u64) -> i128 {
    match prec {
        Prec::Byte => i128::from(bits as u8),
        Prec::Uint16 => i128::from(bits as u16),
        Prec::Int32 => i128::from(bits as u32 as i32),
        Prec::Uint32 => i128::from(bits as u32),
        Prec::Int64 => i128::from(bits as i64),
        Prec::Uint64 => i128::from(bits),
        p => panic!("{p} is not an integer precision"),
    }
}

/// A deterministic stream of 64-bit words (xorshift).
fn words(n: usize, seed: u64) -> Vec<u64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        })
        .collect()
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug)]
enum Draw {
    /// Any value of the precision.
    Full,
    /// Values within 1000 of the precision's extremes (and of 0, and of 2^63 for uint64).
    Extremes,
    /// Values in `lo..=hi`.
    Range(i64, i64),
}

fn draw(prec: Prec, n: usize, seed: u64, how: Draw) -> Vec<i128> {
    words(n, seed)
        .into_iter()
        .map(|w| (w, w % 1000))
        .map(|(w, r)| match how {
            Draw::Full => wrap(prec, w),
            Draw::Extremes => {
                // (Narrow precisions: wrapped, so within 1000 of an extreme modulo 2^bits.)
                let r = i128::from(r);
                let (lo, hi) = match prec {
                    Prec::Int64 => (i128::from(i64::MIN), i128::from(i64::MAX)),
                    Prec::Int32 => (i128::from(i32::MIN), i128::from(i32::MAX)),
                    p => (0, wrap(p, u64::MAX)),
                };
                let v = match (w >> 32) % 4 {
                    0 => hi - r,
                    1 => lo + r,
                    2 if prec == Prec::Uint64 => (1i128 << 63) + r - 500,
                    2 => r - 500,
                    _ => r,
                };
                wrap(prec, v as u64)
            }
            Draw::Range(lo, hi) => i128::from(lo) + i128::from(w % (hi - lo + 1) as u64),
        })
        .collect()
}

/// A hosted tensor holding exactly the given integers.
fn int_tensor(name: &str, dims: &[usize], prec: Prec, vals: &[i128]) -> Tnode {
    let t = Tnode::hosted(&[name], dims, prec).unwrap();
    t.with_host_mut(|a| {
        for (i, &v) in vals.iter().enumerate() {
            a.set_int(i, v);
        }
    });
    t
}

fn ints_of(t: &Tnode) -> Vec<i128> {
    t.with_host(|a| (0..a.len()).map(|i| a.get_int(i).unwrap()).collect())
        .unwrap()
}

/// `c (+)= Σ x * y` over an einsum computed here, point by point: every letter's extent from
/// the operands, loops over all letters; each step adds the product (64-bit patterns,
/// wrapping) to the cell and wraps the sum into the result's precision, as SPEC 9.1 says.
#[allow(clippy::too_many_arguments)]
fn reference(
    spec: &str,
    xd: &[usize],
    x: &[i128],
    yd: &[usize],
    y: &[i128],
    cd: &[usize],
    cp: Prec,
    init: &[i128],
) -> Vec<i128> {
    let (args, res) = spec.split_once("->").unwrap();
    let (xs, ys) = args.split_once(',').unwrap();
    let mut extent: HashMap<char, usize> = HashMap::new();
    for (term, dims) in [(xs, xd), (ys, yd), (res, cd)] {
        for (c, &d) in term.chars().zip(dims) {
            extent.insert(c, d);
        }
    }
    let letters: Vec<char> = extent.keys().copied().collect();
    let offset = |term: &str, dims: &[usize], at: &HashMap<char, usize>| {
        term.chars()
            .zip(dims)
            .fold(0, |off, (c, &d)| off * d + at[&c])
    };
    let mut out = init.to_vec();
    let total: usize = letters.iter().map(|c| extent[c]).product();
    let mut at: HashMap<char, usize> = HashMap::new();
    for mut flat in 0..total {
        for c in &letters {
            at.insert(*c, flat % extent[c]);
            flat /= extent[c];
        }
        let o = offset(res, cd, &at);
        let p = (x[offset(xs, xd, &at)] as u64).wrapping_mul(y[offset(ys, yd, &at)] as u64);
        out[o] = wrap(cp, (out[o] as u64).wrapping_add(p));
    }
    out
}

/// One contraction: its spec, the operands' and the result's dims and precisions, how the
/// operands are drawn, and whether the result starts from 0 (`init_neutral`) or from values.
#[derive(Clone)]
struct Case {
    spec: &'static str,
    x: (Vec<usize>, Prec, Draw),
    y: (Vec<usize>, Prec, Draw),
    c: (Vec<usize>, Prec),
    init: bool,
}

#[allow(clippy::too_many_arguments)]
fn case(
    spec: &'static str,
    (xd, xp, xh): (&[usize], Prec, Draw),
    (yd, yp, yh): (&[usize], Prec, Draw),
    (cd, cp): (&[usize], Prec),
    init: bool,
) -> Case {
    Case {
        spec,
        x: (xd.to_vec(), xp, xh),
        y: (yd.to_vec(), yp, yh),
        c: (cd.to_vec(), cp),
        init,
    }
}

impl Case {
    fn name(&self) -> String {
        format!(
            "{} {}·{}->{} init {}",
            self.spec, self.x.1, self.y.1, self.c.1, self.init
        )
    }

    fn values(&self) -> [Vec<i128>; 3] {
        let n = |d: &[usize]| d.iter().product::<usize>();
        [
            draw(self.x.1, n(&self.x.0), 1, self.x.2),
            draw(self.y.1, n(&self.y.0), 2, self.y.2),
            draw(self.c.1, n(&self.c.0), 3, Draw::Full),
        ]
    }

    /// The statement (fresh tensors holding the case's values) and its tensors.
    fn program(&self, tag: usize) -> (Assignments, [Tnode; 3]) {
        let [xv, yv, cv] = self.values();
        let x = int_tensor(&format!("x{tag}"), &self.x.0, self.x.1, &xv);
        let y = int_tensor(&format!("y{tag}"), &self.y.0, self.y.1, &yv);
        let c = int_tensor(&format!("c{tag}"), &self.c.0, self.c.1, &cv);
        let asg = Assignments::AccumBinop {
            initialize_neutral: self.init,
            accum: Binop::Add,
            op: Binop::Mul,
            lhs: c.clone(),
            rhs1: Buffer::Node(x.clone()),
            rhs2: Buffer::Node(y.clone()),
            projections: projections(
                self.spec,
                &self.c.0,
                &[&self.x.0, &self.y.0],
                &Bindings::empty(),
            )
            .unwrap(),
        };
        (asg, [x, y, c])
    }

    fn expected(&self) -> Vec<i128> {
        let [xv, yv, cv] = self.values();
        let start = if self.init { vec![0; cv.len()] } else { cv };
        reference(
            self.spec, &self.x.0, &xv, &self.y.0, &yv, &self.c.0, self.c.1, &start,
        )
    }
}

/// The kernel's lanes for a result precision, as the kernel's comment names them.
fn lanes_of(cp: Prec) -> &'static str {
    match cp.int_bits().unwrap() {
        8 | 16 => "uint16 lanes",
        32 => "uint32 lanes",
        _ => "uint64 lanes",
    }
}

/// Compiles all cases into one routine (one statement each), runs it and checks every result
/// against the reference; each statement must have become a kernel of the right lanes.
/// Compiles and runs the cases as one routine: their outputs and the C source.
fn run_cases(cases: &[Case]) -> (Vec<Tnode>, String) {
    let mut asgs = vec![];
    let mut outs = vec![];
    for (i, c) in cases.iter().enumerate() {
        let (asg, [_, _, out]) = c.program(i);
        asgs.push(asg);
        outs.push(out);
    }
    let refs: Vec<&Tnode> = outs.iter().collect();
    let (_, src) = compute(&Assignments::seq(asgs), &Bindings::empty(), &refs);
    (outs, src)
}

fn check_compiled(cases: &[Case]) {
    let (outs, src) = run_cases(cases);
    for (c, out) in cases.iter().zip(&outs) {
        let head = format!("GEMM kernel for {}:", out.name());
        let line = src.lines().find(|l| l.contains(&head));
        assert!(
            line.is_some_and(|l| l.contains(lanes_of(c.c.1))),
            "{}: no kernel of {}\n{src}",
            c.name(),
            lanes_of(c.c.1)
        );
        let (got, want) = (ints_of(out), c.expected());
        let bad = got.iter().zip(&want).position(|(g, w)| g != w);
        assert!(
            bad.is_none(),
            "{}: cell {bad:?}: {:?} vs {:?}",
            c.name(),
            bad.map(|i| got[i]),
            bad.map(|i| want[i])
        );
    }
}

/// Runs the optimized code of each case for `target` in the interpreter, and checks it against
/// the reference; the code must hold vector multiply-adds.
fn check_interpreted(cases: &[Case], target: VectorTarget) {
    for c in cases {
        let (asg, [x, y, out]) = c.program(0);
        let settings = Settings::default().target(Some(target));
        let o = optimize::optimize("k", arrayjit::lower::lower(&asg).unwrap(), &settings).unwrap();
        let doc = arrayjit::loops::to_doc(&o.code);
        assert!(doc.contains("fma("), "{}: no kernel\n{doc}", c.name());
        let mut mem = Memory::new();
        mem.load_from_hosts([&x, &y, &out]);
        interp::run_optimized(&o, &[], &mut mem).unwrap();
        assert_eq!(
            mem.get_int(&out).unwrap(),
            c.expected(),
            "{} interpreted for {target:?}",
            c.name()
        );
    }
}

const F: Draw = Draw::Full;

/// The shapes of `ij,jk->ik`, `ij,kj->ik` (the transposing pack) and `ji,jk->ik`, none a
/// multiple of a tile.
fn matmuls(xp: Prec, yp: Prec, cp: Prec, how: Draw, init: bool) -> Vec<Case> {
    vec![
        case(
            "ij,jk->ik",
            (&[37, 53], xp, how),
            (&[53, 45], yp, how),
            (&[37, 45], cp),
            init,
        ),
        case(
            "ij,kj->ik",
            (&[41, 38], xp, how),
            (&[50, 38], yp, how),
            (&[41, 50], cp),
            init,
        ),
        case(
            "ji,jk->ik",
            (&[38, 41], xp, how),
            (&[38, 70], yp, how),
            (&[41, 70], cp),
            init,
        ),
    ]
}

/// int32 = int32 · int32 over the whole int32 range: nearly every product and sum overflows
/// 32 bits, and the results are the wrapped ones.
#[test]
fn int32_matmuls_that_overflow_are_exact() {
    let mut cases = matmuls(Prec::Int32, Prec::Int32, Prec::Int32, F, true);
    cases.extend(matmuls(Prec::Int32, Prec::Int32, Prec::Int32, F, false));
    // The inputs do overflow: the exact sum differs from the wrapped one.
    let c = &cases[0];
    let [xv, yv, _] = c.values();
    let exact: i128 = (0..53).map(|j| xv[j] * yv[j * 45]).sum();
    assert_ne!(exact, c.expected()[0]);
    assert_eq!(wrap(Prec::Int32, exact as u64), c.expected()[0]);
    check_compiled(&cases);
}

/// int64 and uint64 contractions with operands next to ±2^63 and 2^64 (and a uint32 result
/// of uint64 operands, summed in uint32 lanes).
#[test]
fn int64_and_uint64_near_the_extremes_are_exact() {
    let e = Draw::Extremes;
    let mut cases = matmuls(Prec::Int64, Prec::Int64, Prec::Int64, e, true);
    cases.extend(matmuls(Prec::Uint64, Prec::Uint64, Prec::Uint64, e, false));
    cases.push(case(
        "ij,jk->ik",
        (&[33, 40], Prec::Uint64, F),
        (&[40, 35], Prec::Uint64, e),
        (&[33, 35], Prec::Uint32),
        true,
    ));
    check_compiled(&cases);
}

/// Byte results (of bytes, and of int32 operands holding int8-range values, negative ones
/// included) and uint16 results, summed in uint16 lanes and wrapped into 8 bits.
#[test]
fn byte_and_uint16_results_are_exact() {
    let i8s = Draw::Range(-128, 127);
    let mut cases = matmuls(Prec::Byte, Prec::Byte, Prec::Byte, F, true);
    cases.extend(matmuls(Prec::Int32, Prec::Int32, Prec::Byte, i8s, false));
    cases.extend(matmuls(Prec::Uint16, Prec::Int32, Prec::Uint16, F, true));
    check_compiled(&cases);
}

/// Operands of different integer widths and signedness in one product: each is
/// sign-extended (int32, int64) or zero-extended (byte, uint16, uint32, uint64) into the lanes,
/// as the scalar statement extends it to 64 bits.
#[test]
fn mixed_integer_operand_widths_are_exact() {
    let e = Draw::Extremes;
    let mix = |xp, yp, cp, init| {
        case(
            "ij,jk->ik",
            (&[35, 44], xp, e),
            (&[44, 39], yp, F),
            (&[35, 39], cp),
            init,
        )
    };
    check_compiled(&[
        mix(Prec::Int32, Prec::Uint32, Prec::Uint64, true),
        mix(Prec::Int32, Prec::Int64, Prec::Int64, false),
        mix(Prec::Byte, Prec::Int64, Prec::Int64, true),
        mix(Prec::Uint16, Prec::Uint64, Prec::Int32, true),
        mix(Prec::Int64, Prec::Int32, Prec::Uint32, false),
        mix(Prec::Int32, Prec::Byte, Prec::Uint16, true),
        mix(Prec::Uint64, Prec::Int32, Prec::Byte, true),
    ]);
}

/// Batched products, a batch over one operand only, and a product with two reduced letters.
#[test]
fn batched_integer_einsums_are_exact() {
    let (i32_, i64_) = (Prec::Int32, Prec::Int64);
    check_compiled(&[
        case(
            "bij,bjk->bik",
            (&[3, 33, 35], i32_, F),
            (&[3, 35, 47], i32_, F),
            (&[3, 33, 47], i32_),
            true,
        ),
        case(
            "bij,jk->bik",
            (&[2, 40, 33], i64_, Draw::Extremes),
            (&[33, 34], i32_, F),
            (&[2, 40, 34], i64_),
            false,
        ),
        case(
            "ijl,jkl->ik",
            (&[34, 33, 3], Prec::Uint32, F),
            (&[33, 36, 3], i32_, F),
            (&[34, 36], Prec::Uint32),
            true,
        ),
    ]);
}

/// A 2-D NHWC convolution computed here from the SPEC's definition: a point whose row or
/// column falls outside `x` is skipped; each step wraps into the result's precision.
#[allow(clippy::too_many_arguments)]
fn conv_ref(
    x: &[i128],
    xd: [usize; 4],
    w: &[i128],
    wd: [usize; 4],
    yd: [usize; 4],
    yp: Prec,
    (s, p): (i64, i64),
) -> Vec<i128> {
    let mut y = vec![0i128; yd.iter().product()];
    for b in 0..yd[0] {
        for h in 0..yd[1] {
            for v in 0..yd[2] {
                for d in 0..yd[3] {
                    let mut acc = 0i128;
                    for i in 0..wd[0] {
                        for j in 0..wd[1] {
                            let r = s * h as i64 + i as i64 - p;
                            let q = s * v as i64 + j as i64 - p;
                            if r < 0 || r >= xd[1] as i64 || q < 0 || q >= xd[2] as i64 {
                                continue;
                            }
                            let (r, q) = (r as usize, q as usize);
                            for c in 0..wd[2] {
                                let xv = x[((b * xd[1] + r) * xd[2] + q) * xd[3] + c];
                                let wv = w[((i * wd[1] + j) * wd[2] + c) * wd[3] + d];
                                let prod = (xv as u64).wrapping_mul(wv as u64);
                                acc = wrap(yp, (acc as u64).wrapping_add(prod));
                            }
                        }
                    }
                    y[((b * yd[1] + h) * yd[2] + v) * yd[3] + d] = acc;
                }
            }
        }
    }
    y
}

/// Integer convolutions with padding (affine reads whose guards skip the padded points),
/// stride 2 and a 5×5 window, over the whole int32 range and in int64 and byte: through the
/// kernel (with specialized row ranges), compiled and interpreted, exactly the reference.
#[test]
fn integer_convolutions_with_padding_are_exact() {
    type Conv = (&'static str, [usize; 4], [usize; 4], [usize; 4], (i64, i64));
    let convs: [Conv; 3] = [
        (
            "b(h+i-1)(v+j-1)c,ijcd->bhvd",
            [1, 5, 21, 40],
            [3, 3, 40, 45],
            [1, 5, 21, 45],
            (1, 1),
        ),
        (
            "b(2*h+i-1)(2*v+j-1)c,ijcd->bhvd",
            [1, 9, 41, 40],
            [3, 3, 40, 45],
            [1, 5, 21, 45],
            (2, 1),
        ),
        (
            "b(h+i-2)(v+j-2)c,ijcd->bhvd",
            [2, 4, 26, 33],
            [5, 5, 33, 40],
            [2, 4, 26, 40],
            (1, 2),
        ),
    ];
    let avx512 = avx512_target().int64_mul(true);
    for (spec, xd, wd, yd, sp) in convs {
        for (xp, wp, yp) in [
            (Prec::Int32, Prec::Int32, Prec::Int32),
            (Prec::Int64, Prec::Int32, Prec::Int64),
            (Prec::Byte, Prec::Int32, Prec::Byte),
        ] {
            let xv = draw(xp, xd.iter().product(), 1, F);
            let wv = draw(wp, wd.iter().product(), 2, F);
            let want = conv_ref(&xv, xd, &wv, wd, yd, yp, sp);
            let make = || {
                let x = int_tensor("x", &xd, xp, &xv);
                let w = int_tensor("w", &wd, wp, &wv);
                let y = Tnode::hosted(&["y"], &yd, yp).unwrap();
                let asg = Assignments::AccumBinop {
                    initialize_neutral: true,
                    accum: Binop::Add,
                    op: Binop::Mul,
                    lhs: y.clone(),
                    rhs1: Buffer::Node(x.clone()),
                    rhs2: Buffer::Node(w.clone()),
                    projections: projections(spec, &yd, &[&xd, &wd], &Bindings::empty()).unwrap(),
                };
                (asg, [x, w, y])
            };
            let what = format!("{spec} {xp}·{wp}->{yp}");
            let (asg, [_, _, y]) = make();
            let (_, src) = compute(&asg, &Bindings::empty(), &[&y]);
            assert!(
                src.contains("GEMM kernel") && src.contains("specialized row ranges"),
                "{what}: no guarded kernel\n{src}"
            );
            assert_eq!(ints_of(&y), want, "{what}");
            let (asg, [x, w, y]) = make();
            let settings = Settings::default().target(Some(avx512));
            let o =
                optimize::optimize("k", arrayjit::lower::lower(&asg).unwrap(), &settings).unwrap();
            assert!(arrayjit::loops::to_doc(&o.code).contains("fma("), "{what}");
            let mut mem = Memory::new();
            mem.load_from_hosts([&x, &w, &y]);
            interp::run_optimized(&o, &[], &mut mem).unwrap();
            assert_eq!(mem.get_int(&y).unwrap(), want, "{what} interpreted");
        }
    }
}

/// The interpreter runs the integer kernels lane by lane (exact patterns) for AVX-512 (with
/// and without `vpmullq`), AVX2 and SSE2 targets, and with tiny caches that split the columns
/// and the reduction into several blocks with edges: always the reference.
#[test]
fn the_interpreter_runs_integer_kernels_for_every_target() {
    let base = avx512_target().int64_mul(true);
    let targets = [
        base,
        base.int64_mul(false),
        base.isa(Isa::Avx2)
            .vector_bytes(32)
            .registers(16)
            .int64_mul(false),
        base.isa(Isa::Sse2)
            .vector_bytes(16)
            .registers(16)
            .fma(false)
            .int64_mul(false),
        base.l1d_bytes(1 << 10).l2_bytes(8 << 10),
    ];
    let mut cases = vec![
        case(
            "ij,jk->ik",
            (&[31, 77], Prec::Int32, F),
            (&[77, 300], Prec::Int32, F),
            (&[31, 300], Prec::Int32),
            false,
        ),
        case(
            "ij,kj->ik",
            (&[30, 45], Prec::Int64, Draw::Extremes),
            (&[140, 45], Prec::Int64, F),
            (&[30, 140], Prec::Int64),
            true,
        ),
        case(
            "ij,jk->ik",
            (&[33, 40], Prec::Byte, F),
            (&[40, 70], Prec::Int32, F),
            (&[33, 70], Prec::Byte),
            true,
        ),
    ];
    cases.extend(matmuls(Prec::Uint64, Prec::Int32, Prec::Uint64, F, false));
    for t in targets {
        check_interpreted(&cases, t);
    }
}

/// The C of a 256×256×256 int32 product holds the kernel (wrapping `uint32_t` vector
/// extensions) and no scalar statement multiplying `a` by `b`.
#[test]
fn a_big_integer_matmul_is_a_kernel_in_the_c() {
    let n = 256;
    let a = int_tensor("a", &[n, n], Prec::Int32, &draw(Prec::Int32, n * n, 1, F));
    let b = int_tensor("b", &[n, n], Prec::Int32, &draw(Prec::Int32, n * n, 2, F));
    let c = Tnode::hosted(&["c"], &[n, n], Prec::Int32).unwrap();
    let asg = binop(
        &c,
        Binop::Add,
        true,
        Binop::Mul,
        &a,
        &b,
        "ij,jk->ik",
        &Bindings::empty(),
    );
    let backend = CcBackend::new();
    backend.initialize(Config::default());
    let (r, src) = build(&backend, "big", &Bindings::empty(), &asg).unwrap();
    assert!(src.contains("GEMM kernel for c: 256x256x256"), "{src}");
    assert!(src.contains("typedef uint32_t aj_v"), "{src}");
    let (an, bn) = (
        format!("{}[", names_in(&src, "a")),
        format!("{}[", names_in(&src, "b")),
    );
    let scalar = src.lines().find(|l| l.contains(&an) && l.contains(&bn));
    assert!(scalar.is_none(), "a scalar product: {scalar:?}\n{src}");
    run_and_read(&backend, &r, &[&c]);
    let (av, bv) = (ints_of(&a), ints_of(&b));
    let want = reference(
        "ij,jk->ik",
        &[n, n],
        &av,
        &[n, n],
        &bv,
        &[n, n],
        Prec::Int32,
        &vec![0; n * n],
    );
    assert_eq!(ints_of(&c), want);
}

/// The C name of the routine parameter for tensor `label` (`a_1` for `a`).
fn names_in(src: &str, label: &str) -> String {
    // The routine's own function (not a parallel region's chunk function, which takes
    // `void *aj_arg`).
    let sig = src
        .lines()
        .find(|l| l.starts_with("static int ") && !l.contains("void *aj_arg"))
        .unwrap();
    sig.split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
        .find(|t| {
            t.strip_prefix(label)
                .and_then(|r| r.strip_prefix('_'))
                .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
        })
        .unwrap_or_else(|| panic!("no parameter for {label} in {sig}"))
        .to_string()
}

/// What stays scalar: an integer result with a floating argument (computed in double and
/// truncated at every step, not associative), and integer accumulations other than `add` of
/// `mul`. Their values are still the SPEC's, step by step.
#[test]
fn integer_statements_that_are_not_modular_sums_stay_scalar() {
    // int32 = int32 · single: each step truncates `c + x·y` computed in double.
    let (xd, yd, cd) = ([34, 40], [40, 36], [34, 36]);
    let xv = draw(Prec::Int32, 34 * 40, 1, Draw::Range(-1000, 1000));
    let yv: Vec<f64> = words(40 * 36, 2)
        .iter()
        .map(|w| (w % 64) as f64 / 8.0 - 4.0)
        .collect();
    let x = int_tensor("x", &xd, Prec::Int32, &xv);
    let y = input("y", &yd, Prec::Single, &yv);
    let c = Tnode::hosted(&["c"], &cd, Prec::Int32).unwrap();
    let mixed = binop(
        &c,
        Binop::Add,
        true,
        Binop::Mul,
        &x,
        &y,
        "ij,jk->ik",
        &Bindings::empty(),
    );
    let (_, src) = compute(&mixed, &Bindings::empty(), &[&c]);
    assert!(!src.contains("GEMM kernel"), "{src}");
    let mut want = vec![0i128; 34 * 36];
    for i in 0..34 {
        for k in 0..36 {
            let mut acc = 0f64;
            for j in 0..40 {
                acc = (acc + xv[i * 40 + j] as f64 * yv[j * 36 + k]).trunc();
            }
            want[i * 36 + k] = acc as i128;
        }
    }
    assert_eq!(ints_of(&c), want);
    // max of products: a max-plus "product" is not a sum.
    let a = int_tensor("a", &xd, Prec::Int32, &xv);
    let b = int_tensor("b", &yd, Prec::Int32, &draw(Prec::Int32, 40 * 36, 2, F));
    let m = Tnode::hosted(&["m"], &cd, Prec::Int32).unwrap();
    let maxes = binop(
        &m,
        Binop::Max,
        true,
        Binop::Mul,
        &a,
        &b,
        "ij,jk->ik",
        &Bindings::empty(),
    );
    let (_, src) = compute(&maxes, &Bindings::empty(), &[&m]);
    assert!(!src.contains("GEMM kernel"), "{src}");
    let bv = ints_of(&b);
    let want: Vec<i128> = (0..34 * 36)
        .map(|cell| {
            let (i, k) = (cell / 36, cell % 36);
            (0..40)
                .map(|j| (xv[i * 40 + j] as i64).wrapping_mul(bv[j * 36 + k] as i64))
                .fold(i64::from(i32::MIN), |acc, p| i64::from(acc.max(p) as i32))
                .into()
        })
        .collect();
    assert_eq!(ints_of(&m), want);
}

/// Runs a program file through the CLI with the given architecture flags and spelling of
/// vector code (intrinsics fall back to vector extensions for integer lanes).
fn run_cli(prog: &Value, arch: &str, intrinsics: bool) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("p.json");
    std::fs::write(&f, serde_json::to_string(prog).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_arrayjit"))
        .arg("run")
        .arg(&f)
        .env("ARRAYJIT_ARCH_FLAGS", arch)
        .env("ARRAYJIT_INTRINSICS", if intrinsics { "1" } else { "0" })
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{arch}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The same integer products through baseline x86-64 (SSE2: the 32-bit product emulated),
/// x86-64-v2 (`pmulld`), x86-64-v3 (AVX2) and the machine's own flags, spelled with vector
/// extensions and with intrinsics: the same exact integers, printed with every digit.
#[test]
fn every_x86_level_computes_the_same_integers() {
    let cases = [
        case(
            "ij,kj->ik",
            (&[45, 67], Prec::Int32, F),
            (&[39, 67], Prec::Int32, F),
            (&[45, 39], Prec::Int32),
            true,
        ),
        case(
            "ij,jk->ik",
            (&[40, 50], Prec::Int64, Draw::Extremes),
            (&[50, 37], Prec::Uint32, F),
            (&[40, 37], Prec::Uint64),
            true,
        ),
        case(
            "ij,jk->ik",
            (&[40, 50], Prec::Byte, F),
            (&[50, 37], Prec::Byte, F),
            (&[40, 37], Prec::Byte),
            true,
        ),
    ];
    let tensor = |name: &str, dims: &[usize], p: Prec, v: &[i128]| {
        let vals: Vec<Value> = v
            .iter()
            .map(|&x| match i64::try_from(x) {
                Ok(s) => json!(s),
                Err(_) => json!(x as u64),
            })
            .collect();
        json!({"name": name, "dims": dims, "prec": p.name(), "init": {"values": vals}})
    };
    let mut tensors = vec![];
    let mut code = vec![];
    for (i, c) in cases.iter().enumerate() {
        let [xv, yv, _] = c.values();
        let (x, y, out) = (format!("x{i}"), format!("y{i}"), format!("c{i}"));
        tensors.push(tensor(&x, &c.x.0, c.x.1, &xv));
        tensors.push(tensor(&y, &c.y.0, c.y.1, &yv));
        tensors.push(json!({"name": out, "dims": c.c.0, "prec": c.c.1.name()}));
        code.push(
            json!({"assign": out, "accum": "add", "init_neutral": true, "op": "mul",
            "args": [x, y], "logic": c.spec}),
        );
    }
    let prog = json!({
        "tensors": tensors,
        "routines": [{"name": "r", "code": code}],
        "run": [{"routine": "r"}],
        "print": ["c0", "c1", "c2"]
    });
    for (arch, intrinsics) in [
        ("-march=x86-64", false),
        ("-march=x86-64-v2", false),
        ("-march=x86-64-v2", true),
        ("-march=x86-64-v3", false),
        ("-march=native", true),
        ("-march=native", false),
    ] {
        let got = run_cli(&prog, arch, intrinsics);
        for (i, c) in cases.iter().enumerate() {
            let got: Vec<i128> = got[format!("c{i}")]["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| match v.as_i64() {
                    Some(s) => i128::from(s),
                    None => i128::from(v.as_u64().unwrap()),
                })
                .collect();
            assert_eq!(
                got,
                c.expected(),
                "{arch} intrinsics {intrinsics}: {}",
                c.name()
            );
        }
    }
}

/// Compiles C (with the runtime header) to assembly and returns it.
fn assembly(cc: &str, flags: &[&str], source: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let header = Path::new(env!("CARGO_MANIFEST_DIR")).join("runtime_c/arrayjit.h");
    std::fs::copy(header, dir.path().join("arrayjit.h")).unwrap();
    std::fs::write(dir.path().join("k.c"), source).unwrap();
    let out = Command::new(cc)
        .args(flags)
        .args(["-std=gnu11", "-fPIC", "-I.", "-S", "-o", "k.s", "k.c"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cc} {flags:?}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(dir.path().join("k.s")).unwrap()
}

fn installed(cc: &str) -> bool {
    Command::new(cc)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The C of an integer kernel written for `target`, with the result precision `cp`.
fn int_kernel_source(target: VectorTarget, cp: Prec) -> String {
    let c = case(
        "ij,jk->ik",
        (&[40, 50], cp, F),
        (&[50, 70], cp, F),
        (&[40, 70], cp),
        true,
    );
    let (asg, _) = c.program(0);
    let settings = Settings::default().target(Some(target));
    let o = optimize::optimize("kernel", arrayjit::lower::lower(&asg).unwrap(), &settings).unwrap();
    let (src, _) = arrayjit::codegen::write_file(&[(&o, &Bindings::empty())], &target).unwrap();
    assert!(
        src.contains("GEMM kernel") && src.contains(lanes_of(cp)),
        "{src}"
    );
    src
}

/// What gcc and clang make of the integer kernels: the 16- and 32-bit products are single
/// instructions (`vpmullw`, `vpmulld` with AVX2, `pmulld` at x86-64-v2), the 64-bit product is
/// `vpmullq` with AVX-512DQ (Sapphire Rapids) and an emulation from 32-bit products
/// (`vpmuludq`) with AVX2; every kernel compiles for every level.
#[test]
fn integer_kernels_compile_to_vector_multiplies() {
    let avx2 = VectorTarget::default()
        .isa(Isa::Avx2)
        .vector_bytes(32)
        .registers(16)
        .fma(true)
        .bf16_dot(false)
        .int64_mul(false)
        .l1d_bytes(32 << 10)
        .l2_bytes(512 << 10)
        .intrinsics(false);
    let avx512 = avx2
        .isa(Isa::Avx512)
        .vector_bytes(64)
        .registers(32)
        .int64_mul(true);
    let sse = avx2.isa(Isa::Sse2).vector_bytes(16).fma(false);
    let checks: [(VectorTarget, Prec, &str, &[&str]); 7] = [
        (avx2, Prec::Int32, "-march=x86-64-v3", &["vpmulld"]),
        (avx2, Prec::Uint16, "-march=x86-64-v3", &["vpmullw"]),
        (avx2, Prec::Int64, "-march=x86-64-v3", &["vpmuludq"]),
        (sse, Prec::Int32, "-march=x86-64-v2", &["pmulld"]),
        (sse, Prec::Int64, "-march=x86-64-v2", &["pmuludq"]),
        (
            avx512,
            Prec::Int32,
            "-march=sapphirerapids",
            &["vpmulld", "zmm"],
        ),
        (
            avx512,
            Prec::Int64,
            "-march=sapphirerapids",
            &["vpmullq", "zmm"],
        ),
    ];
    for cc in ["gcc", "clang"].into_iter().filter(|cc| installed(cc)) {
        for (target, cp, arch, wanted) in checks {
            let src = int_kernel_source(target, cp);
            let asm = assembly(cc, &["-O2", arch], &src);
            assert!(
                asm.lines().any(|l| wanted.iter().all(|w| l.contains(w))),
                "{cc} {arch} {cp}: no {wanted:?}"
            );
        }
    }
}

/// NEON integer kernels (checked in the assembly of a cross compiler): the 32- and 16-bit
/// products are vector multiply-accumulates (`mla` on `.4s`, `.8h` lanes). CI sets
/// ARRAYJIT_REQUIRE_CROSS=1; elsewhere the check needs aarch64-linux-gnu-gcc to be present.
#[test]
fn neon_integer_kernels_compile_to_vector_multiply_accumulates() {
    let cc = "aarch64-linux-gnu-gcc";
    if !installed(cc) {
        assert!(
            std::env::var_os("ARRAYJIT_REQUIRE_CROSS").is_none(),
            "{cc} is required (ARRAYJIT_REQUIRE_CROSS is set)"
        );
        eprintln!("note: {cc} is not installed; the NEON assembly check did not run");
        return;
    }
    let neon = VectorTarget::default()
        .isa(Isa::Neon)
        .vector_bytes(16)
        .registers(32)
        .fma(true)
        .bf16_dot(false)
        .int64_mul(false)
        .l1d_bytes(64 << 10)
        .l2_bytes(1 << 20)
        .intrinsics(true);
    for (cp, lanes) in [(Prec::Int32, ".4s"), (Prec::Uint16, ".8h")] {
        let asm = assembly(cc, &["-O2", "-march=armv8-a"], &int_kernel_source(neon, cp));
        assert!(
            asm.lines().any(|l| l.contains("mla") && l.contains(lanes)),
            "{cp}: no vector mla\n{asm}"
        );
    }
    // 64-bit lanes have no NEON multiply: the compiler's own code, which must compile.
    assembly(
        cc,
        &["-O2", "-march=armv8-a"],
        &int_kernel_source(neon, Prec::Int64),
    );
}

/// Long reductions into small integer results are split into groups of steps (each group's
/// kernel into its own partial result, the partials added in group order): exact for byte,
/// int32 and int64 results, zero-filled (`init`) or accumulated onto the values `c` holds.
/// The 64 columns fill a vector of 16-bit lanes on every target (32 lanes with AVX-512), so
/// every case is a kernel.
#[test]
fn integer_reductions_split_into_groups_are_exact() {
    let mut cases = vec![];
    for (p, how) in [
        (Prec::Byte, F),
        (Prec::Int32, F),
        (Prec::Int64, Draw::Extremes),
    ] {
        for init in [true, false] {
            cases.push(case(
                "ij,jk->ik",
                (&[20, 8192], p, how),
                (&[8192, 64], p, how),
                (&[20, 64], p),
                init,
            ));
        }
    }
    let (outs, src) = run_cases(&cases);
    for (c, out) in cases.iter().zip(&outs) {
        let head = format!("the reduction of {} split into", out.name());
        assert!(src.contains(&head), "{}: not split\n{src}", c.name());
        let (got, want) = (ints_of(out), c.expected());
        let bad = got.iter().zip(&want).position(|(g, w)| g != w);
        assert!(bad.is_none(), "{}: cell {bad:?}", c.name());
    }
}
