//! GEMM kernels (`src/optimize/gemm.rs`): contractions in every layout and shape, checked
//! against products computed here, through the compiled code, the interpreter on the
//! optimized code, every x86 instruction set this machine runs, and the assembly compilers
//! make for targets it cannot run (NEON, portable vector extensions).
//!
//! Inputs are small dyadic rationals (multiples of 1/8 up to 4), so every product and sum is
//! exact in single precision: whatever order the kernel sums in, results must be identical.

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

/// Deterministic dyadic values in [-4, 4] (multiples of 1/8).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s % 65) as f64 - 32.0) / 8.0
        })
        .collect()
}

/// An einsum `lhs = Σ x * y` computed here: every letter's extent from the operands, loops
/// over all letters, accumulation in f64 (exact for dyadic inputs).
fn reference(
    spec: &str,
    xd: &[usize],
    x: &[f64],
    yd: &[usize],
    y: &[f64],
    cd: &[usize],
    init: &[f64],
) -> Vec<f64> {
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
        out[offset(res, cd, &at)] += x[offset(xs, xd, &at)] * y[offset(ys, yd, &at)];
    }
    out
}

struct Case {
    spec: &'static str,
    x: Vec<usize>,
    y: Vec<usize>,
    c: Vec<usize>,
}

fn case(spec: &'static str, x: &[usize], y: &[usize], c: &[usize]) -> Case {
    Case {
        spec,
        x: x.to_vec(),
        y: y.to_vec(),
        c: c.to_vec(),
    }
}

/// Every layout, with extents that are multiples of no tile.
fn cases() -> Vec<Case> {
    vec![
        case("ij,jk->ik", &[37, 53], &[53, 45], &[37, 45]),
        case("ij,jk->ik", &[70, 33], &[33, 69], &[70, 69]),
        case("ij,jk->ik", &[29, 300], &[300, 17], &[29, 17]),
        case("ij,kj->ik", &[41, 38], &[50, 38], &[41, 50]),
        case("ji,jk->ik", &[38, 41], &[38, 50], &[41, 50]),
        case("ij,jk->ki", &[41, 38], &[38, 50], &[50, 41]),
        case("bij,bjk->bik", &[3, 33, 35], &[3, 35, 47], &[3, 33, 47]),
        case("bij,jk->bik", &[2, 40, 33], &[33, 34], &[2, 40, 34]),
        case("ijl,jkl->ik", &[34, 33, 3], &[33, 36, 3], &[34, 36]),
    ]
}

fn prog_for(c: &Case, xp: Prec, yp: Prec, cp: Prec, init: bool) -> (Assignments, [Tnode; 3]) {
    let x = input("x", &c.x, xp, &values(c.x.iter().product(), 1));
    let y = input("y", &c.y, yp, &values(c.y.iter().product(), 2));
    let out = input("c", &c.c, cp, &values(c.c.iter().product(), 3));
    let b = Bindings::empty();
    let asg = Assignments::AccumBinop {
        initialize_neutral: init,
        accum: Binop::Add,
        op: Binop::Mul,
        lhs: out.clone(),
        rhs1: Buffer::Node(x.clone()),
        rhs2: Buffer::Node(y.clone()),
        projections: projections(c.spec, &c.c, &[&c.x, &c.y], &b).unwrap(),
    };
    (asg, [x, y, out])
}

fn expected(c: &Case, xp: Prec, yp: Prec, init: bool) -> Vec<f64> {
    let xs: Vec<f64> = values(c.x.iter().product(), 1)
        .iter()
        .map(|&v| round_to(xp, v))
        .collect();
    let ys: Vec<f64> = values(c.y.iter().product(), 2)
        .iter()
        .map(|&v| round_to(yp, v))
        .collect();
    let start: Vec<f64> = if init {
        vec![0.0; c.c.iter().product()]
    } else {
        values(c.c.iter().product(), 3)
    };
    reference(c.spec, &c.x, &xs, &c.y, &ys, &c.c, &start)
}

#[test]
fn contractions_in_every_layout_match_the_reference() {
    let precs = [
        (Prec::Single, Prec::Single, Prec::Single),
        (Prec::Double, Prec::Double, Prec::Double),
        (Prec::Half, Prec::Single, Prec::Single),
        (Prec::Byte, Prec::Double, Prec::Double),
    ];
    for c in cases() {
        for &(xp, yp, cp) in &precs {
            for init in [true, false] {
                let (asg, [_, _, out]) = prog_for(&c, xp, yp, cp, init);
                let (got, src) = compute(&asg, &Bindings::empty(), &[&out]);
                assert!(
                    src.contains("GEMM kernel"),
                    "{} {xp}/{yp}->{cp}: no kernel\n{src}",
                    c.spec
                );
                let want = expected(&c, xp, yp, init);
                assert_eq!(got[0], want, "{} {xp}/{yp}->{cp} init {init}", c.spec);
            }
        }
    }
}

/// `asg` optimized for `target` and interpreted from the host values of `nodes`: the
/// optimized code as text, and the values of `out`.
fn interpreted(
    asg: &Assignments,
    target: VectorTarget,
    nodes: [&Tnode; 3],
    out: &Tnode,
) -> (String, Vec<f64>) {
    let code = arrayjit::lower::lower(asg).unwrap();
    let settings = Settings::default().target(Some(target));
    let o = optimize::optimize("kernel", code, &settings).unwrap();
    let mut mem = Memory::new();
    mem.load_from_hosts(nodes);
    interp::run_optimized(&o, &[], &mut mem).unwrap();
    (
        arrayjit::loops::to_doc(&o.code),
        mem.get(out).unwrap().to_vec(),
    )
}

/// The interpreter runs the kernel's vector statements lane by lane: on the optimized code
/// it gives exactly what the compiled code gives.
#[test]
fn the_interpreter_runs_the_kernels() {
    let target = avx512_target();
    for c in cases().into_iter().take(4) {
        let (asg, [x, y, out]) = prog_for(&c, Prec::Single, Prec::Single, Prec::Single, true);
        let (doc, got) = interpreted(&asg, target, [&x, &y, &out], &out);
        assert!(doc.contains("fma("), "{}", c.spec);
        assert_eq!(
            got.as_slice(),
            expected(&c, Prec::Single, Prec::Single, true).as_slice(),
            "{}",
            c.spec
        );
    }
}

/// Results with fewer columns than a vector has lanes (8 and 12 floats against AVX-512's 16,
/// 5 against 8) are kernels of narrower vectors that the columns fill: interpreted on the
/// code optimized for an AVX-512 target (whose kernel comment names the lanes), and compiled
/// for this machine, exactly the reference sums.
#[test]
fn narrow_results_use_narrower_vectors() {
    let avx512 = avx512_target();
    for (n, lanes) in [(8usize, 8usize), (12, 8), (5, 4)] {
        let c = case("ij,jk->ik", &[300, 64], &[64, n], &[300, n]);
        let want = expected(&c, Prec::Single, Prec::Single, true);
        let (asg, [x, y, out]) = prog_for(&c, Prec::Single, Prec::Single, Prec::Single, true);
        let (doc, got) = interpreted(&asg, avx512, [&x, &y, &out], &out);
        assert!(doc.contains(&format!("({lanes} lanes)")), "n = {n}:\n{doc}");
        assert_eq!(got.as_slice(), want.as_slice(), "interpreted, n = {n}");
        let (got, src) = compute(&asg, &Bindings::empty(), &[&out]);
        assert!(src.contains("GEMM kernel"), "n = {n}: no kernel\n{src}");
        assert_eq!(got[0], want, "compiled, n = {n}");
    }
}

/// Runs a program file through the CLI with the given architecture flags, spelling of
/// vector code and extra compiler flags.
fn run_cli(prog: &Value, arch: &str, intrinsics: bool, cflags: &str) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("p.json");
    std::fs::write(&f, serde_json::to_string(prog).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_arrayjit"))
        .arg("run")
        .arg(&f)
        .env("ARRAYJIT_ARCH_FLAGS", arch)
        .env("ARRAYJIT_INTRINSICS", if intrinsics { "1" } else { "0" })
        .env("ARRAYJIT_CFLAGS", cflags)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{arch}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The same products through SSE2, AVX2 (+FMA) and AVX-512 code (this machine runs all
/// three), spelled with intrinsics and with vector extensions, in single and double
/// precision; and with the lane shuffles of the transposing pack spelled as older GCC needs
/// them (`__builtin_shuffle`, forced on GCC by `-DAJ_NO_SHUFFLEVECTOR`; Clang ignores it).
#[test]
fn every_x86_instruction_set_computes_the_same() {
    let c = case("ij,kj->ik", &[45, 67], &[39, 67], &[45, 39]);
    for prec in ["single", "double"] {
        let x = values(45 * 67, 1);
        let y = values(39 * 67, 2);
        let prog = json!({
            "tensors": [
                {"name": "x", "dims": c.x, "prec": prec, "init": {"values": x}},
                {"name": "y", "dims": c.y, "prec": prec, "init": {"values": y}},
                {"name": "c", "dims": c.c, "prec": prec}
            ],
            "routines": [{"name": "r", "code": [{"assign": "c", "accum": "add", "init_neutral": true,
                "op": "mul", "args": ["x", "y"], "logic": c.spec}]}],
            "run": [{"routine": "r"}],
            "print": ["c"]
        });
        let want = expected(&c, Prec::Single, Prec::Single, true);
        for (arch, intrinsics, cflags) in [
            ("-march=x86-64", true, ""),
            ("-march=x86-64-v3", true, ""),
            ("-march=native", true, ""),
            ("-march=x86-64", false, ""),
            ("-march=x86-64-v3", false, ""),
            ("-march=native", false, ""),
            ("-march=x86-64", true, "-DAJ_NO_SHUFFLEVECTOR"),
            ("-march=native", true, "-DAJ_NO_SHUFFLEVECTOR"),
            ("-march=native", false, "-DAJ_NO_SHUFFLEVECTOR"),
        ] {
            let got = run_cli(&prog, arch, intrinsics, cflags);
            // Printed values are the shortest text that reads back as the same value of the
            // tensor's precision.
            let got: Vec<f64> = got["c"]["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .map(|v| if prec == "single" { v as f32 as f64 } else { v })
                .collect();
            let bad = got.iter().zip(&want).position(|(g, w)| g != w);
            assert!(
                bad.is_none(),
                "{prec} {arch} intrinsics {intrinsics} {cflags}: cell {bad:?}: {:?} vs {:?}",
                bad.map(|i| got[i]),
                bad.map(|i| want[i])
            );
        }
    }
}

/// The C of a kernel written for `target`: of `a @ b`, or with `transposed` of `a @ b.T`
/// (whose packing transposes blocks of `b` with vector shuffles).
fn kernel_source(target: VectorTarget, prec: Prec, transposed: bool) -> String {
    let c = if transposed {
        case("ij,kj->ik", &[40, 50], &[60, 50], &[40, 60])
    } else {
        case("ij,jk->ik", &[40, 50], &[50, 60], &[40, 60])
    };
    let (asg, _) = prog_for(&c, prec, prec, prec, true);
    let settings = Settings::default().target(Some(target));
    let o = optimize::optimize("kernel", arrayjit::lower::lower(&asg).unwrap(), &settings).unwrap();
    let (src, _) = arrayjit::codegen::write_file(&[(&o, &Bindings::empty())], &target).unwrap();
    assert!(src.contains("GEMM kernel"), "{src}");
    assert_eq!(src.contains("AJ_SHUFFLE("), transposed, "{src}");
    src
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

/// NEON kernels compile to fused multiply-adds on AArch64 (checked in the assembly of a
/// cross compiler: this machine cannot run them). CI installs gcc-aarch64-linux-gnu and sets
/// ARRAYJIT_REQUIRE_CROSS=1; elsewhere the check needs that compiler to be present.
#[test]
fn neon_kernels_compile_to_fused_multiply_adds() {
    let cc = "aarch64-linux-gnu-gcc";
    if !installed(cc) {
        assert!(
            std::env::var_os("ARRAYJIT_REQUIRE_CROSS").is_none(),
            "{cc} is required (ARRAYJIT_REQUIRE_CROSS is set)"
        );
        eprintln!("note: {cc} is not installed; the NEON assembly check did not run");
        return;
    }
    for intrinsics in [true, false] {
        let neon = VectorTarget::default()
            .isa(Isa::Neon)
            .vector_bytes(16)
            .registers(32)
            .fma(true)
            .bf16_dot(false)
            .int64_mul(false)
            .l1d_bytes(64 << 10)
            .l2_bytes(1 << 20)
            .intrinsics(intrinsics);
        for (prec, lanes) in [(Prec::Single, ".4s"), (Prec::Double, ".2d")] {
            for transposed in [false, true] {
                let src = kernel_source(neon, prec, transposed);
                assert_eq!(src.contains("vfmaq_f"), intrinsics, "{src}");
                // Also with the shuffles spelled for GCC before 12 (`__builtin_shuffle`).
                for shuffles in ["-O2", "-DAJ_NO_SHUFFLEVECTOR"] {
                    let asm = assembly(cc, &["-O2", "-march=armv8-a", shuffles], &src);
                    let fmla = asm.lines().any(|l| l.contains("fmla") && l.contains(lanes));
                    assert!(
                        fmla,
                        "{prec} intrinsics {intrinsics} {shuffles}: no vector fmla\n{asm}"
                    );
                }
            }
        }
    }
}

/// The portable dialect (GCC/Clang vector extensions, for targets without intrinsics here)
/// compiles with gcc and clang to vector multiply-adds.
#[test]
fn portable_kernels_compile_to_vector_code() {
    let generic = VectorTarget::default();
    for transposed in [false, true] {
        let src = kernel_source(generic, Prec::Single, transposed);
        assert!(src.contains("vector_size(16)"), "{src}");
        for cc in ["gcc", "clang"].into_iter().filter(|cc| installed(cc)) {
            // Also with the shuffles spelled for GCC before 12 (`__builtin_shuffle`, which
            // Clang lacks).
            let spellings: &[&str] = if cc == "gcc" {
                &["-O2", "-DAJ_NO_SHUFFLEVECTOR"]
            } else {
                &["-O2"]
            };
            for shuffles in spellings {
                let asm = assembly(cc, &["-O2", "-march=x86-64-v3", shuffles], &src);
                assert!(
                    asm.contains("vfmadd") || asm.contains("vmulps"),
                    "{cc} {shuffles}: no vector arithmetic"
                );
            }
        }
    }
}

/// A backend compiles the same kernel for every precision the issue asks for: half inputs
/// are converted while packing and computed in float.
#[test]
fn half_operands_compute_in_float() {
    let backend = CcBackend::new();
    backend.initialize(Config::default());
    let c = case("ij,jk->ik", &[33, 40], &[40, 35], &[33, 35]);
    let (asg, [_, _, out]) = prog_for(&c, Prec::Half, Prec::Half, Prec::Single, true);
    let (r, src) = build(&backend, "half", &Bindings::empty(), &asg).unwrap();
    assert!(
        src.contains("GEMM kernel") && src.contains("aj_h2f("),
        "{src}"
    );
    let got = run_and_read(&backend, &r, &[&out]);
    assert_eq!(got[0], expected(&c, Prec::Half, Prec::Half, true));
}

/// With tiny caches the blocking exercises every path: several column blocks and a rest
/// run with an edge panel, several reduction blocks with a shorter last one, edge row panels.
/// Run by the interpreter on the optimized code, in single and double precision.
#[test]
fn kernels_with_tiny_caches_split_columns_and_the_reduction() {
    let target = avx512_target().l1d_bytes(1 << 10).l2_bytes(8 << 10);
    let mut cs = cases();
    cs.push(case("ij,jk->ik", &[31, 77], &[77, 300], &[31, 300]));
    cs.push(case("ij,kj->ik", &[30, 45], &[140, 45], &[30, 140]));
    for c in cs {
        for prec in [Prec::Single, Prec::Double] {
            for init in [true, false] {
                let (asg, [x, y, out]) = prog_for(&c, prec, prec, prec, init);
                let (doc, got) = interpreted(&asg, target, [&x, &y, &out], &out);
                assert!(doc.contains("fma("), "{}: no kernel\n{doc}", c.spec);
                assert_eq!(
                    got.as_slice(),
                    expected(&c, prec, prec, init).as_slice(),
                    "{} {prec} init {init}",
                    c.spec
                );
            }
        }
    }
}

/// Narrow-float operands (bfloat16, fp8) are converted exactly while packing (by the
/// runtime's integer code, `aj_bf2f` / `aj_fp82f`) and computed in float: the product through
/// the kernel, compiled and interpreted, equals the one computed here from the rounded inputs.
#[test]
fn bfloat16_and_fp8_operands_use_the_kernels() {
    let backend = CcBackend::new();
    backend.initialize(Config::default());
    let target = avx512_target();
    for (c, xp, yp, conv) in [
        (
            case("ij,jk->ik", &[33, 40], &[40, 35], &[33, 35]),
            Prec::Bfloat16,
            Prec::Bfloat16,
            "aj_bf2f(",
        ),
        (
            case("ij,kj->ik", &[37, 41], &[50, 41], &[37, 50]),
            Prec::Bfloat16,
            Prec::Single,
            "aj_bf2f(",
        ),
        (
            case("ij,jk->ik", &[34, 39], &[39, 36], &[34, 36]),
            Prec::Fp8,
            Prec::Bfloat16,
            "aj_fp82f(",
        ),
    ] {
        let want = expected(&c, xp, yp, true);
        let (asg, [x, y, out]) = prog_for(&c, xp, yp, Prec::Single, true);
        let (r, src) = build(&backend, "narrow", &Bindings::empty(), &asg).unwrap();
        assert!(
            src.contains("GEMM kernel") && src.contains(conv),
            "{} {xp}/{yp}: {src}",
            c.spec
        );
        assert_eq!(run_and_read(&backend, &r, &[&out])[0], want, "{xp}/{yp}");
        let (doc, got) = interpreted(&asg, target, [&x, &y, &out], &out);
        assert!(doc.contains("fma("));
        assert_eq!(got.as_slice(), want.as_slice(), "{xp}/{yp} interpreted");
    }
}

// ---------------------------------------------------------------------------------------------
// Convolutions (affine indices, SPEC 9.3) through the kernels

/// A 2-D NHWC convolution `y[b,h,v,d] = Σ x[b, s·h+i-p, s·v+j-p, c] · w[i,j,c,d]` computed
/// here from the SPEC's definition: a point whose row or column falls outside `x` is skipped
/// (its weight is never multiplied, even when it is infinite or NaN).
fn conv_ref(
    x: &[f64],
    xd: [usize; 4],
    w: &[f64],
    wd: [usize; 4],
    yd: [usize; 4],
    (s, p): (i64, i64),
) -> Vec<f64> {
    let mut y = vec![0.0; yd.iter().product()];
    for b in 0..yd[0] {
        for h in 0..yd[1] {
            for v in 0..yd[2] {
                for d in 0..yd[3] {
                    let mut acc = 0.0;
                    for i in 0..wd[0] {
                        for j in 0..wd[1] {
                            let r = s * h as i64 + i as i64 - p;
                            let q = s * v as i64 + j as i64 - p;
                            if r < 0 || r >= xd[1] as i64 || q < 0 || q >= xd[2] as i64 {
                                continue;
                            }
                            let (r, q) = (r as usize, q as usize);
                            for c in 0..wd[2] {
                                acc += x[((b * xd[1] + r) * xd[2] + q) * xd[3] + c]
                                    * w[((i * wd[1] + j) * wd[2] + c) * wd[3] + d];
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

/// A convolution: spec, dims of `x`, `w`, `y`, and (stride, padding).
type ConvCase = (&'static str, [usize; 4], [usize; 4], [usize; 4], (i64, i64));

/// Equal values, NaN equal to NaN.
fn same(got: &[f64], want: &[f64]) -> Option<usize> {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .position(|(g, w)| !(g == w || (g.is_nan() && w.is_nan())))
}

/// Convolutions with padding (single-letter-free guards `(h+i-1)`), stride 2 and a 5×5
/// window, in shapes that are multiples of no tile, with weights holding infinities and NaNs
/// that only padded points meet for some outputs: through the kernel (the C says so), compiled
/// and interpreted on the optimized code, they equal the reference, in which those points are
/// skipped (packing zeros for them would give NaN: 0·∞).
#[test]
fn convolutions_use_the_kernels_exactly() {
    let target = avx512_target();
    let cases: [ConvCase; 6] = [
        // 600 input channels: several reduction blocks for 9 rows, so the output rows go
        // inside every packed block of the weights (packed once for all of them).
        (
            "b(h+i-1)(v+j-1)c,ijcd->bhvd",
            [1, 5, 9, 600],
            [3, 3, 600, 70],
            [1, 5, 9, 70],
            (1, 1),
        ),
        // Padding 3 on the low side only: every row range starts past 0, the first output
        // row meets no input row at all.
        (
            "b(h+i-3)(v+j-3)c,ijcd->bhvd",
            [1, 5, 21, 40],
            [3, 3, 40, 45],
            [1, 5, 21, 45],
            (1, 3),
        ),
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
        // No padding: the guards are all narrowed into loop bounds.
        (
            "b(h+i)(v+j)c,ijcd->bhvd",
            [1, 6, 30, 37],
            [3, 3, 37, 34],
            [1, 4, 28, 34],
            (1, 0),
        ),
    ];
    for (spec, xd, wd, yd, sp) in cases {
        let xv = values(xd.iter().product(), 1);
        let mut wv = values(wd.iter().product(), 2);
        let at = |i: usize, j: usize, c: usize, d: usize| ((i * wd[1] + j) * wd[2] + c) * wd[3] + d;
        for inf_too in [false, true] {
            if inf_too {
                // Tap (0, 0) is padding for the first row and column, tap (last, last) for
                // the last ones (with padding).
                wv[at(0, 0, 3, 5)] = f64::INFINITY;
                wv[at(0, 0, 4, 6)] = f64::NAN;
                wv[at(wd[0] - 1, wd[1] - 1, 7, 9)] = f64::NEG_INFINITY;
                wv[at(0, wd[1] - 1, 1, 2)] = f64::NAN;
            }
            let want = conv_ref(&xv, xd, &wv, wd, yd, sp);
            let make = || {
                let x = input("x", &xd, Prec::Single, &xv);
                let w = input("w", &wd, Prec::Single, &wv);
                let y = output("y", &yd, Prec::Single);
                let b = Bindings::empty();
                let asg = Assignments::AccumBinop {
                    initialize_neutral: true,
                    accum: Binop::Add,
                    op: Binop::Mul,
                    lhs: y.clone(),
                    rhs1: Buffer::Node(x.clone()),
                    rhs2: Buffer::Node(w.clone()),
                    projections: projections(spec, &yd, &[&xd, &wd], &b).unwrap(),
                };
                (asg, [x, w, y])
            };
            let (asg, [_, _, y]) = make();
            let (got, src) = compute(&asg, &Bindings::empty(), &[&y]);
            assert!(src.contains("GEMM kernel"), "{spec}: no kernel\n{src}");
            if sp.1 > 0 {
                assert!(src.contains("specialized row ranges"), "{spec}\n{src}");
            }
            let bad = same(&got[0], &want);
            assert!(
                bad.is_none(),
                "{spec} inf {inf_too}: cell {bad:?}: {:?} vs {:?}",
                bad.map(|i| got[0][i]),
                bad.map(|i| want[i])
            );
            if inf_too {
                // Some outputs are finite only because the infinite taps were skipped.
                assert!(want.iter().any(|v| v.is_finite()) && want.iter().any(|v| v.is_nan()));
            }
            let (asg, [x, w, y]) = make();
            let settings = Settings::default().target(Some(target));
            let o =
                optimize::optimize("k", arrayjit::lower::lower(&asg).unwrap(), &settings).unwrap();
            assert!(arrayjit::loops::to_doc(&o.code).contains("fma("), "{spec}");
            let mut mem = Memory::new();
            mem.load_from_hosts([&x, &w, &y]);
            interp::run_optimized(&o, &[], &mut mem).unwrap();
            let got = mem.get(&y).unwrap();
            assert!(
                same(got, &want).is_none(),
                "{spec} inf {inf_too} interpreted"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tap kernels (`src/optimize/taps.rs`) and 1-D convolutions through the kernels

/// One entry of a spec term: `Σ coef·letter + offset`.
type Entry = (Vec<(char, i64)>, i64);

/// The entries of one term: a plain letter, or an affine entry in parentheses.
fn entries(term: &str) -> Vec<Entry> {
    let mut out = vec![];
    let mut chars = term.chars();
    while let Some(c) = chars.next() {
        if c != '(' {
            out.push((vec![(c, 1)], 0));
            continue;
        }
        let inner: String = chars.by_ref().take_while(|&c| c != ')').collect();
        let (mut terms, mut offset) = (vec![], 0i64);
        for (k, part) in inner.replace('-', "+-").split('+').enumerate() {
            if part.is_empty() {
                assert!(k == 0);
                continue;
            }
            match part.split_once('*') {
                Some((coef, l)) => terms.push((l.chars().next().unwrap(), coef.parse().unwrap())),
                None => match part.parse::<i64>() {
                    Ok(n) => offset += n,
                    Err(_) => terms.push((part.chars().next().unwrap(), 1)),
                },
            }
        }
        out.push((terms, offset));
    }
    out
}

/// `c = init; c[lhs] = c[lhs] accum op(x[a], y[b])` over every point of the letters, computed
/// here from SPEC 9.3: extents from the plain-letter entries, and a point at which any entry
/// falls outside its axis is skipped (never read, never multiplied). `Arg1` takes `x` alone.
#[allow(clippy::too_many_arguments)]
fn affine_reference(
    spec: &str,
    xd: &[usize],
    x: &[f64],
    yd: &[usize],
    y: &[f64],
    cd: &[usize],
    accum: Binop,
    op: Binop,
) -> Vec<f64> {
    let (args, res) = spec.split_once("->").unwrap();
    let (xs, ys) = args.split_once(',').unwrap();
    let terms = [(entries(xs), xd), (entries(ys), yd), (entries(res), cd)];
    let mut extent: Vec<(char, usize)> = vec![];
    for (es, dims) in &terms {
        for ((t, off), &d) in es.iter().zip(dims.iter()) {
            if let [(l, 1)] = t.as_slice() {
                if *off == 0 && !extent.iter().any(|e| e.0 == *l) {
                    extent.push((*l, d));
                }
            }
        }
    }
    let init = match accum {
        Binop::Max => f64::NEG_INFINITY,
        Binop::Min => f64::INFINITY,
        _ => 0.0,
    };
    let mut out = vec![init; cd.iter().product()];
    let total: usize = extent.iter().map(|e| e.1).product();
    for point in 0..total {
        let mut at: HashMap<char, i64> = HashMap::new();
        let mut rest = point;
        for &(l, e) in extent.iter().rev() {
            at.insert(l, (rest % e) as i64);
            rest /= e;
        }
        let offset = |es: &[Entry], dims: &[usize]| -> Option<usize> {
            let mut off = 0usize;
            for ((t, o), &d) in es.iter().zip(dims) {
                let v: i64 = t.iter().map(|(l, c)| c * at[l]).sum::<i64>() + o;
                if v < 0 || v >= d as i64 {
                    return None;
                }
                off = off * d + v as usize;
            }
            Some(off)
        };
        let (Some(xo), Some(yo), Some(co)) = (
            offset(&terms[0].0, xd),
            offset(&terms[1].0, yd),
            offset(&terms[2].0, cd),
        ) else {
            continue;
        };
        let v = match op {
            Binop::Mul => x[xo] * y[yo],
            Binop::Arg1 => x[xo],
            _ => unreachable!(),
        };
        out[co] = match accum {
            Binop::Add => out[co] + v,
            // IEEE maximumNumber and minimumNumber: a NaN operand is ignored (no -0 in these
            // inputs).
            Binop::Max => out[co].max(v),
            Binop::Min => out[co].min(v),
            _ => unreachable!(),
        };
    }
    out
}

/// A tap or convolution case: spec, dims of `x`, `w`, `y`, the accumulation and operation,
/// cells of `w` set to infinities and NaNs (taps that only padded points meet for some
/// outputs), and the kernel the C must show.
struct TapCase {
    spec: &'static str,
    xd: Vec<usize>,
    wd: Vec<usize>,
    yd: Vec<usize>,
    accum: Binop,
    op: Binop,
    poison: Vec<(usize, f64)>,
    kernel: &'static str,
    /// The precision of every tensor.
    prec: Prec,
    /// Cells of `x` set to NaN.
    x_nan: Vec<usize>,
}

fn tap_case(
    spec: &'static str,
    xd: &[usize],
    wd: &[usize],
    yd: &[usize],
    kernel: &'static str,
) -> TapCase {
    TapCase {
        spec,
        xd: xd.to_vec(),
        wd: wd.to_vec(),
        yd: yd.to_vec(),
        accum: Binop::Add,
        op: Binop::Mul,
        poison: vec![],
        kernel,
        prec: Prec::Single,
        x_nan: vec![],
    }
}

/// Runs a case compiled for this machine, and interpreted on the code optimized for an
/// AVX-512 target and for SSE2 (other blockings), each compared exactly (NaN equal to NaN)
/// with [`affine_reference`]; the C must name the kernel.
fn check_tap_case(c: &TapCase) {
    let mut xv = values(c.xd.iter().product(), 11);
    for &at in &c.x_nan {
        xv[at] = f64::NAN;
    }
    let mut wv = values(c.wd.iter().product(), 12);
    for &(at, v) in &c.poison {
        wv[at] = v;
    }
    let want = affine_reference(c.spec, &c.xd, &xv, &c.wd, &wv, &c.yd, c.accum, c.op);
    if !c.poison.is_empty() {
        // Some outputs are finite only because the poisoned taps were skipped.
        assert!(want.iter().any(|v| v.is_finite()) && want.iter().any(|v| !v.is_finite()));
    }
    let make = || {
        let x = input("x", &c.xd, c.prec, &xv);
        let w = input("w", &c.wd, c.prec, &wv);
        let y = output("y", &c.yd, c.prec);
        let asg = Assignments::AccumBinop {
            initialize_neutral: true,
            accum: c.accum,
            op: c.op,
            lhs: y.clone(),
            rhs1: Buffer::Node(x.clone()),
            rhs2: Buffer::Node(w.clone()),
            projections: projections(c.spec, &c.yd, &[&c.xd, &c.wd], &Bindings::empty()).unwrap(),
        };
        (asg, [x, w, y])
    };
    let (asg, [_, _, y]) = make();
    let (got, src) = compute(&asg, &Bindings::empty(), &[&y]);
    assert!(src.contains(c.kernel), "{}: no {}\n{src}", c.spec, c.kernel);
    let bad = same(&got[0], &want);
    assert!(
        bad.is_none(),
        "{}: cell {bad:?}: {:?} vs {:?}\n{src}",
        c.spec,
        bad.map(|i| got[0][i]),
        bad.map(|i| want[i])
    );
    let avx512 = avx512_target().int64_mul(true);
    let sse2 = avx512
        .isa(Isa::Sse2)
        .vector_bytes(16)
        .registers(16)
        .fma(false);
    for target in [avx512, sse2] {
        let (asg, [x, w, y]) = make();
        let settings = Settings::default().target(Some(target));
        let o = optimize::optimize("k", arrayjit::lower::lower(&asg).unwrap(), &settings).unwrap();
        let doc = arrayjit::loops::to_doc(&o.code);
        let mut mem = Memory::new();
        mem.load_from_hosts([&x, &w, &y]);
        interp::run_optimized(&o, &[], &mut mem).unwrap();
        let bad = same(mem.get(&y).unwrap(), &want);
        assert!(
            bad.is_none(),
            "{} interpreted ({:?}): cell {bad:?}\n{doc}",
            c.spec,
            target.isa
        );
    }
}

/// Depthwise convolutions and pooling with padding, stride, dilation, padding larger than the
/// window (output rows that meet no input), channel counts that are multiples of no vector
/// width, and weights holding infinities and NaNs at taps that only padded points meet for
/// some outputs: through the tap kernel, equal to the reference that skips those points.
#[test]
fn depthwise_convolutions_and_pooling_use_the_tap_kernels_exactly() {
    let tap = "tap kernel for y";
    let w3 = |i: usize, j: usize, c: usize, cs: usize| (i * 3 + j) * cs + c;
    let mut cases = vec![
        TapCase {
            poison: vec![
                (w3(0, 0, 3, 37), f64::INFINITY),
                (w3(0, 1, 4, 37), f64::NAN),
                (w3(2, 2, 36, 37), f64::NEG_INFINITY),
                (w3(1, 0, 0, 37), f64::NAN),
            ],
            ..tap_case(
                "b(h+i-1)(v+j-1)c,ijc->bhvc",
                &[2, 5, 23, 37],
                &[3, 3, 37],
                &[2, 5, 23, 37],
                tap,
            )
        },
        tap_case(
            "b(2*h+i-1)(2*v+j-1)c,ijc->bhvc",
            &[1, 9, 31, 16],
            &[3, 3, 16],
            &[1, 5, 16, 16],
            tap,
        ),
        // Dilation 2 (padding 2).
        tap_case(
            "b(h+2*i-2)(v+2*j-2)c,ijc->bhvc",
            &[1, 6, 19, 24],
            &[3, 3, 24],
            &[1, 6, 19, 24],
            tap,
        ),
        // Max-pool 3×3, stride 2, padding 1 (the padding takes no part: inputs are negative
        // as well as positive), and a sum pool.
        TapCase {
            accum: Binop::Max,
            op: Binop::Arg1,
            ..tap_case(
                "b(2*h+i-1)(2*v+j-1)c,ij->bhvc",
                &[1, 11, 21, 20],
                &[3, 3],
                &[1, 6, 11, 20],
                tap,
            )
        },
        TapCase {
            op: Binop::Arg1,
            ..tap_case(
                "b(h+i-1)(v+j-1)c,ij->bhvc",
                &[1, 7, 9, 19],
                &[3, 3],
                &[1, 7, 9, 19],
                tap,
            )
        },
    ];
    // Padding 4 around a 3×3 window: output rows and columns 0, 1, 8, 9 meet no input.
    // 16 channels, and 8 (with AVX-512, vectors of 8 of its 16 lanes).
    cases.extend([16, 8].map(|ch| TapCase {
        poison: vec![(w3(0, 0, 5, ch), f64::INFINITY)],
        ..tap_case(
            "b(h+i-4)(v+j-4)c,ijc->bhvc",
            &[1, 4, 4, ch],
            &[3, 3, ch],
            &[1, 10, 10, ch],
            tap,
        )
    }));
    // Doubles (4 lanes on AVX2, 8 on AVX-512), and a min-pool with padding.
    cases.push(TapCase {
        prec: Prec::Double,
        poison: vec![(w3(0, 2, 1, 21), f64::NAN)],
        ..tap_case(
            "b(h+i-1)(v+j-1)c,ijc->bhvc",
            &[1, 4, 13, 21],
            &[3, 3, 21],
            &[1, 4, 13, 21],
            tap,
        )
    });
    cases.push(TapCase {
        accum: Binop::Min,
        op: Binop::Arg1,
        ..tap_case(
            "b(h+i-1)(v+j-1)c,ij->bhvc",
            &[1, 5, 12, 17],
            &[3, 3],
            &[1, 5, 12, 17],
            tap,
        )
    });
    // NaN inputs in a max-pool are ignored (maximumNumber), as the scalar code does: the
    // window of output (0, 0, channel 0) is all NaN (its maximum is the fill, -inf).
    cases.push(TapCase {
        x_nan: vec![0, 32, 256, 288, 3, 5 * 32 + 7],
        accum: Binop::Max,
        op: Binop::Arg1,
        ..tap_case(
            "b(2*h+i)(2*v+j)c,ij->bhvc",
            &[1, 8, 8, 32],
            &[2, 2],
            &[1, 4, 4, 32],
            tap,
        )
    });
    for c in &cases {
        check_tap_case(c);
    }
}

/// 1-D convolutions whose padding guard involves the reduction letter: of one channel
/// (`(o+k-1),k->o`, the output axis is the contiguous one; batched with output channels,
/// `b(o+k-2),kd->bod`) through the tap kernel; with a long window, through the GEMM kernel
/// over the interior rows (the border rows stay guarded scalar code); with input channels
/// through the GEMM kernel. Stride 2, dilation 2, padding larger than the window, lengths that
/// are multiples of no vector width, and infinite and NaN weights next to the padding.
#[test]
fn one_dimensional_convolutions_use_the_kernels_exactly() {
    let tap = "tap kernel for y";
    let gemm = "GEMM kernel for y";
    let cases = vec![
        TapCase {
            poison: vec![(0, f64::INFINITY)],
            ..tap_case("(o+k-1),k->o", &[45], &[3], &[45], tap)
        },
        TapCase {
            poison: vec![(2, f64::NAN)],
            ..tap_case("(o+k-1),k->o", &[45], &[3], &[45], tap)
        },
        TapCase {
            poison: vec![(0, f64::NEG_INFINITY)],
            ..tap_case("b(2*o+k-1),kd->bod", &[2, 77], &[3, 24], &[2, 39, 24], tap)
        },
        tap_case("(o+2*k-2),k->o", &[50], &[3], &[50], tap),
        // Padding 6 around a window of 3: outputs 0..=3 and 54.. meet no input.
        TapCase {
            poison: vec![(1, f64::NAN)],
            ..tap_case("(o+k-6),k->o", &[50], &[3], &[60], tap)
        },
        TapCase {
            poison: vec![(0, f64::INFINITY), (4 * 40 + 39, f64::NAN)],
            ..tap_case("b(o+k-2),kd->bod", &[3, 70], &[5, 40], &[3, 70, 40], tap)
        },
        // 33 taps: a GEMM over the rows where every tap is in range.
        TapCase {
            poison: vec![(0, f64::INFINITY), (32 * 36 + 7, f64::NAN)],
            ..tap_case(
                "b(o+k-16),kd->bod",
                &[2, 100],
                &[33, 36],
                &[2, 100, 36],
                gemm,
            )
        },
        TapCase {
            poison: vec![(0, f64::INFINITY), (2 * 32 * 40 + 5, f64::NAN)],
            ..tap_case(
                "b(o+k-1)c,kcd->bod",
                &[2, 150, 32],
                &[3, 32, 40],
                &[2, 150, 40],
                gemm,
            )
        },
        tap_case(
            "b(2*o+2*k-2)c,kcd->bod",
            &[1, 131, 33],
            &[3, 33, 34],
            &[1, 66, 34],
            gemm,
        ),
    ];
    for c in &cases {
        check_tap_case(c);
    }
}

/// Tap kernels through SSE2, AVX2 (+FMA) and AVX-512 code (this machine runs all three),
/// spelled with intrinsics and with vector extensions: a single-precision depthwise
/// convolution and a double-precision max-pool with padding (`AJ_VMAX` on each vector type).
#[test]
fn tap_kernels_on_every_x86_instruction_set_compute_the_same() {
    let (xd, wd, yd) = ([1usize, 6, 21, 27], [3usize, 3, 27], [1usize, 6, 21, 27]);
    let (pd, kd) = ([1usize, 9, 14, 13], [3usize, 3]);
    let md = [1usize, 5, 7, 13];
    let (x, w, p) = (
        values(xd.iter().product(), 3),
        values(wd.iter().product(), 4),
        values(pd.iter().product(), 5),
    );
    let (dw, pool) = (
        "b(h+i-1)(v+j-1)c,ijc->bhvc",
        "b(2*h+i-1)(2*v+j-1)c,ij->bhvc",
    );
    let want_y = affine_reference(dw, &xd, &x, &wd, &w, &yd, Binop::Add, Binop::Mul);
    let want_m = affine_reference(pool, &pd, &p, &kd, &[0.0; 9], &md, Binop::Max, Binop::Arg1);
    let prog = json!({
        "tensors": [
            {"name": "x", "dims": xd, "init": {"values": x}},
            {"name": "w", "dims": wd, "init": {"values": w}},
            {"name": "y", "dims": yd},
            {"name": "p", "dims": pd, "prec": "double", "init": {"values": p}},
            {"name": "k", "dims": kd, "prec": "double", "init": {"values": vec![0.0; 9]}},
            {"name": "m", "dims": md, "prec": "double"}
        ],
        "routines": [{"name": "r", "code": [
            {"assign": "y", "accum": "add", "init_neutral": true, "op": "mul",
             "args": ["x", "w"], "logic": dw},
            {"assign": "m", "accum": "max", "init_neutral": true, "op": "arg1",
             "args": ["p", "k"], "logic": pool}]}],
        "run": [{"routine": "r"}],
        "print": ["y", "m"]
    });
    for (arch, intrinsics) in [
        ("-march=x86-64", true),
        ("-march=x86-64-v3", true),
        ("-march=native", true),
        ("-march=x86-64", false),
        ("-march=x86-64-v3", false),
        ("-march=native", false),
    ] {
        let got = run_cli(&prog, arch, intrinsics, "");
        for (name, want, single) in [("y", &want_y, true), ("m", &want_m, false)] {
            let got: Vec<f64> = got[name]["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .map(|v| if single { v as f32 as f64 } else { v })
                .collect();
            assert_eq!(&got, want, "{name}: {arch} intrinsics {intrinsics}");
        }
    }
}

/// Tap kernels for NEON (intrinsics and vector extensions) compile to vector multiply-adds
/// and, for max-pooling, to vector compares (the lane-wise maximumNumber of `AJ_VMAX`); checked
/// in the assembly of a cross compiler, as for the GEMM kernels.
#[test]
fn neon_tap_kernels_compile_to_vector_code() {
    let cc = "aarch64-linux-gnu-gcc";
    if !installed(cc) {
        assert!(
            std::env::var_os("ARRAYJIT_REQUIRE_CROSS").is_none(),
            "{cc} is required (ARRAYJIT_REQUIRE_CROSS is set)"
        );
        eprintln!("note: {cc} is not installed; the NEON assembly check did not run");
        return;
    }
    for intrinsics in [true, false] {
        let neon = VectorTarget::default()
            .isa(Isa::Neon)
            .vector_bytes(16)
            .registers(32)
            .fma(true)
            .bf16_dot(false)
            .int64_mul(false)
            .l1d_bytes(64 << 10)
            .l2_bytes(1 << 20)
            .intrinsics(intrinsics);
        for (accum, op, spec, wd, want) in [
            (
                Binop::Add,
                Binop::Mul,
                "b(h+i-1)(v+j-1)c,ijc->bhvc",
                vec![3usize, 3, 32],
                "fmla",
            ),
            (
                Binop::Max,
                Binop::Arg1,
                "b(h+i-1)(v+j-1)c,ij->bhvc",
                vec![3usize, 3],
                "fcmgt",
            ),
        ] {
            let xd = [1usize, 6, 20, 32];
            let x = input("x", &xd, Prec::Single, &values(xd.iter().product(), 1));
            let w = input("w", &wd, Prec::Single, &values(wd.iter().product(), 2));
            let y = output("y", &xd, Prec::Single);
            let asg = Assignments::AccumBinop {
                initialize_neutral: true,
                accum,
                op,
                lhs: y,
                rhs1: Buffer::Node(x),
                rhs2: Buffer::Node(w),
                projections: projections(spec, &xd, &[&xd, &wd], &Bindings::empty()).unwrap(),
            };
            let settings = Settings::default().target(Some(neon));
            let o = optimize::optimize("taps", arrayjit::lower::lower(&asg).unwrap(), &settings)
                .unwrap();
            let (src, _) =
                arrayjit::codegen::write_file(&[(&o, &Bindings::empty())], &neon).unwrap();
            assert!(src.contains("tap kernel for y"), "{src}");
            let asm = assembly(cc, &["-O2", "-march=armv8-a"], &src);
            let found = asm.lines().any(|l| l.contains(want) && l.contains(".4s"));
            assert!(
                found,
                "{spec} intrinsics {intrinsics}: no vector {want}\n{asm}"
            );
        }
    }
}
