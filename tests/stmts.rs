//! Ternary operations (SPEC 9.2) and the random fetch (SPEC 9.5): compiled code, the
//! interpreter and independent computations agree exactly.

mod common;
use arrayjit::interp::{self, Memory};
use arrayjit::ir::einsum::projections;
use arrayjit::ir::*;
use common::*;

fn interpret(asgns: &Assignments, outs: &[&Tnode]) -> Vec<Vec<f64>> {
    let mut mem = Memory::new();
    mem.load_from_hosts(&asgns.nodes());
    interp::run_assignments(asgns, &[], &mut mem).unwrap();
    outs.iter().map(|t| mem.get(t).unwrap().to_vec()).collect()
}

#[allow(clippy::too_many_arguments)]
fn ternop(
    lhs: &Tnode,
    accum: Binop,
    init: bool,
    op: Ternop,
    a: &Tnode,
    b: &Tnode,
    c: &Tnode,
    spec: &str,
) -> Assignments {
    Assignments::AccumTernop {
        initialize_neutral: init,
        accum,
        op,
        lhs: lhs.clone(),
        rhs1: Buffer::Node(a.clone()),
        rhs2: Buffer::Node(b.clone()),
        rhs3: Buffer::Node(c.clone()),
        projections: projections(
            spec,
            lhs.dims(),
            &[a.dims(), b.dims(), c.dims()],
            &Bindings::empty(),
        )
        .unwrap(),
    }
}

/// Independent Threefry-4x32-20 (written from the Random123 paper's description, as a
/// check of the library's): the first output word.
fn threefry_first(ctr: [u32; 4], key: [u32; 4]) -> u32 {
    const R: [u32; 16] = [10, 26, 11, 21, 13, 27, 23, 5, 6, 20, 17, 11, 25, 10, 18, 20];
    let ks = [
        key[0],
        key[1],
        key[2],
        key[3],
        0x1BD11BDA ^ key[0] ^ key[1] ^ key[2] ^ key[3],
    ];
    let mut x: Vec<u32> = (0..4).map(|i| ctr[i].wrapping_add(ks[i])).collect();
    for r in 0..20usize {
        let (p, q) = if r % 2 == 0 { (1, 3) } else { (3, 1) };
        let (ra, rb) = (R[2 * (r % 8)], R[2 * (r % 8) + 1]);
        x[0] = x[0].wrapping_add(x[p]);
        x[p] = x[p].rotate_left(ra) ^ x[0];
        x[2] = x[2].wrapping_add(x[q]);
        x[q] = x[q].rotate_left(rb) ^ x[2];
        if r % 4 == 3 {
            let s = (r + 1) / 4;
            for (i, xi) in x.iter_mut().enumerate() {
                *xi = xi.wrapping_add(ks[(s + i) % 5]);
            }
            x[3] = x[3].wrapping_add(s as u32);
        }
    }
    x[0]
}

/// The expected cell value, computed independently: `w / 2^32` rounded down by searching the
/// precision's largest value not above it.
fn expected_random(seed: u64, off: u64, prec: Prec) -> f64 {
    let w = threefry_first(
        [off as u32, (off >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32, 0, 0],
    );
    let exact = w as f64 / 4294967296.0;
    let single_down = || {
        let f = exact as f32;
        if f as f64 > exact {
            f32::from_bits(f.to_bits() - 1)
        } else {
            f
        }
    };
    let half_down = || {
        let h = half::f16::from_f64(exact);
        if h.to_f64() > exact {
            half::f16::from_bits(h.to_bits() - 1)
        } else {
            h
        }
    };
    match prec {
        Prec::Byte => (w & 0xff) as f64,
        Prec::Uint16 => (w & 0xffff) as f64,
        Prec::Int32 => w as i32 as f64,
        Prec::Uint32 | Prec::Int64 | Prec::Uint64 => w as f64,
        Prec::Double => exact,
        Prec::Single => single_down() as f64,
        // Both are the top bits of a wider format: dropping the low bits of a positive value
        // rounds it down.
        Prec::Bfloat16 => f32::from_bits(single_down().to_bits() & 0xffff_0000) as f64,
        Prec::Half => half_down().to_f64(),
        Prec::Fp8 => half::f16::from_bits(half_down().to_bits() & 0xff00).to_f64(),
    }
}

#[test]
fn threefry_known_answers_in_rust() {
    use arrayjit::ir::random::threefry4x32_20;
    assert_eq!(
        threefry4x32_20([0; 4], [0; 4]),
        [0x9c6ca96a, 0xe17eae66, 0xfc10ecd4, 0x5256a7d8]
    );
    assert_eq!(
        threefry4x32_20([u32::MAX; 4], [u32::MAX; 4]),
        [0x2a881696, 0x57012287, 0xf6c7446e, 0xa16a6732]
    );
    let ctr = [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344];
    let key = [0xa4093822, 0x299f31d0, 0x082efa98, 0xec4e6c89];
    assert_eq!(
        threefry4x32_20(ctr, key),
        [0x59cd1dbb, 0xb8879579, 0x86b5d00c, 0xac8b6d84]
    );
    assert_eq!(threefry_first(ctr, key), 0x59cd1dbb);
}

#[test]
fn threefry_known_answers_in_c() {
    let dir = std::env::temp_dir().join(format!("aj_kat_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let header = concat!(env!("CARGO_MANIFEST_DIR"), "/runtime_c/arrayjit.h");
    let src = format!(
        "#include \"{header}\"\n#include <stdio.h>\n\
         static void kat(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1, uint32_t k2, uint32_t k3) {{\n\
           uint32_t c[4] = {{c0, c1, c2, c3}}, k[4] = {{k0, k1, k2, k3}}, o[4];\n\
           aj_threefry4x32_20(c, k, o);\n\
           printf(\"%08x %08x %08x %08x\\n\", o[0], o[1], o[2], o[3]);\n\
         }}\n\
         int main(void) {{\n\
           kat(0, 0, 0, 0, 0, 0, 0, 0);\n\
           kat(~0u, ~0u, ~0u, ~0u, ~0u, ~0u, ~0u, ~0u);\n\
           kat(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u, 0x082efa98u, 0xec4e6c89u);\n\
           printf(\"%.17g\\n\", aj_rand_unit(aj_threefry_word(42u, 5u), 24, -126));\n\
           return 0;\n\
         }}\n"
    );
    let c = dir.join("kat.c");
    std::fs::write(&c, src).unwrap();
    let exe = dir.join("kat");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = std::process::Command::new(&cc)
        .args(["-O2", "-std=c11", "-o"])
        .arg(&exe)
        .arg(&c)
        .arg("-lm")
        .status()
        .unwrap();
    assert!(st.success());
    let out = std::process::Command::new(&exe).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "9c6ca96a e17eae66 fc10ecd4 5256a7d8");
    assert_eq!(lines[1], "2a881696 57012287 f6c7446e a16a6732");
    assert_eq!(lines[2], "59cd1dbb b8879579 86b5d00c ac8b6d84");
    let v: f64 = lines[3].parse().unwrap();
    assert_eq!(v, expected_random(42, 5, Prec::Single));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn random_fetch_compiled_and_interpreted() {
    for prec in Prec::ALL {
        let seed = 0x1234_5678_9abc_def0u64;
        let x = output("x", &[3, 1, 5], prec);
        let asg = Assignments::Fetch {
            array: x.clone(),
            fetch_op: FetchOp::Random { seed },
        };
        let want: Vec<f64> = (0..15).map(|o| expected_random(seed, o, prec)).collect();
        let (got, _) = compute(&asg, &Bindings::empty(), &[&x]);
        assert_eq!(got[0], want, "compiled, {prec}");
        x.set_host_values(&[0.0; 15]).unwrap();
        assert_eq!(interpret(&asg, &[&x])[0], want, "interpreted, {prec}");
        if !prec.is_integer() {
            assert!(want.iter().all(|&v| (0.0..1.0).contains(&v)));
        }
    }
}

#[test]
fn random_fetch_under_virtualization() {
    // `noise` is an intermediate: it gets inlined into the consumer, computed per position.
    let b = Bindings::empty();
    let noise = temp("noise", &[4, 6], Prec::Single);
    let y = output("y", &[6, 4], Prec::Single);
    let asg = Assignments::seq([
        Assignments::Fetch {
            array: noise.clone(),
            fetch_op: FetchOp::Random { seed: 7 },
        },
        unop(&y, Binop::Arg2, false, Unop::Identity, &noise, "ij->ji", &b),
    ]);
    let (got, _src, modes) = compute_with_modes(&asg, &b, &[&y]);
    assert_eq!(modes.get(&noise), Some(MemoryMode::Virtual));
    let want: Vec<f64> = (0..6)
        .flat_map(|j| (0..4).map(move |i| expected_random(7, (i * 6 + j) as u64, Prec::Single)))
        .collect();
    assert_eq!(got[0], want);
}

#[test]
fn ternary_ops_compiled_and_interpreted() {
    let n = 6;
    let av = [0.0, 1.0, -2.0, f64::NAN, 0.0, 3.0];
    let bv = [1.5, 1e8, 0.1, -4.0, 7.0, 0.3];
    let cv = [2.0, -1e8, 0.2, 5.0, -0.0, 1e-9];
    for prec in [Prec::Byte, Prec::Half, Prec::Single, Prec::Double] {
        let a = input("a", &[n], prec, &av);
        let bb = input("b", &[n], prec, &bv);
        let c = input("c", &[n], prec, &cv);
        let (a_, b_, c_): (Vec<f64>, Vec<f64>, Vec<f64>) = (
            a.host_values().unwrap(),
            bb.host_values().unwrap(),
            c.host_values().unwrap(),
        );
        for op in Ternop::ALL {
            let y = output("y", &[n], prec);
            let asg = ternop(&y, Binop::Arg2, false, op, &a, &bb, &c, "i,i,i->i");
            let want: Vec<f64> = (0..n)
                .map(|i| {
                    let (x, yv, z) = (a_[i], b_[i], c_[i]);
                    let v = match (op, prec.computes_in_float()) {
                        (Ternop::Where, _) => {
                            if x != 0.0 {
                                yv
                            } else {
                                z
                            }
                        }
                        (Ternop::Fma, true) => (x as f32).mul_add(yv as f32, z as f32) as f64,
                        (Ternop::Fma, false) => x.mul_add(yv, z),
                        (Ternop::Mul3, true) => ((x as f32) * (yv as f32) * (z as f32)) as f64,
                        (Ternop::Mul3, false) => x * yv * z,
                    };
                    prec.round(v)
                })
                .collect();
            let (got, _) = compute(&asg, &Bindings::empty(), &[&y]);
            let same = |g: &[f64]| {
                g.iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()))
            };
            assert!(
                same(&got[0]),
                "compiled {op} {prec}: {:?} vs {want:?}",
                got[0]
            );
            y.set_host_values(&[0.0; 6]).unwrap();
            let got = interpret(&asg, &[&y]);
            assert!(
                same(&got[0]),
                "interpreted {op} {prec}: {:?} vs {want:?}",
                got[0]
            );
        }
    }
}

#[test]
fn fma_rounds_once() {
    // (1 + 2^-12)^2 - 1 - 2^-11 = 2^-24: lost when the product is rounded to float first.
    let e = 2f64.powi(-12);
    let a = input("a", &[1], Prec::Single, &[1.0 + e]);
    let c = input("c", &[1], Prec::Single, &[-(1.0 + 2.0 * e)]);
    let y = output("y", &[1], Prec::Single);
    let asg = ternop(&y, Binop::Arg2, false, Ternop::Fma, &a, &a, &c, "i,i,i->i");
    let (got, _) = compute(&asg, &Bindings::empty(), &[&y]);
    assert_eq!(got[0], vec![2f64.powi(-24)]);
}

#[test]
fn ternary_accumulates() {
    // y[i] = sum_j a[i,j] * b[j] * c[i]; then where with an accumulating max.
    let a = input("a", &[2, 3], Prec::Double, &[1., 2., 3., 4., 5., 6.]);
    let b = input("b", &[3], Prec::Double, &[1., 10., 100.]);
    let c = input("c", &[2], Prec::Double, &[2., -1.]);
    let y = output("y", &[2], Prec::Double);
    let asg = ternop(&y, Binop::Add, true, Ternop::Mul3, &a, &b, &c, "ij,j,i->i");
    let want = vec![2.0 * 321.0, -654.0];
    assert_eq!(compute(&asg, &Bindings::empty(), &[&y]).0[0], want);
    y.set_host_values(&[0.0; 2]).unwrap();
    assert_eq!(interpret(&asg, &[&y])[0], want);
}

fn gather_want(table: &[f64], n: usize, row: usize, ids: &[f64]) -> Vec<f64> {
    ids.iter()
        .flat_map(|&i| {
            (0..row).map(move |r| {
                if (i as usize) < n {
                    table[i as usize * row + r]
                } else {
                    0.0
                }
            })
        })
        .collect()
}

#[test]
fn gather_and_scatter_add_compiled_and_interpreted() {
    for prec in [Prec::Byte, Prec::Half, Prec::Single, Prec::Double] {
        let tv: Vec<f64> = (0..10).map(|k| k as f64 * 1.5 - 3.0).collect();
        let table = input("table", &[5, 2], prec, &tv);
        let tv = table.host_values().unwrap();
        let ids_v = [4.0, 0.0, 5.0, 255.0, 4.0, 2.0];
        let ids = input("ids", &[3, 2], Prec::Byte, &ids_v);
        let y = output("y", &[3, 2, 2], prec);
        let asg = Assignments::Gather {
            lhs: y.clone(),
            table: table.clone(),
            index: ids.clone(),
        };
        let want = gather_want(&tv, 5, 2, &ids_v);
        assert_eq!(
            compute(&asg, &Bindings::empty(), &[&y]).0[0],
            want,
            "{prec}"
        );
        y.set_host_values(&[7.0; 12]).unwrap();
        assert_eq!(interpret(&asg, &[&y])[0], want, "{prec}");

        // Scatter the rows back: ids 4 twice add up in order, 5 and 255 are skipped.
        let g0: Vec<f64> = (0..10).map(|k| k as f64).collect();
        let g = input("g", &[5, 2], prec, &g0);
        let h: Vec<f64> = (0..12).map(|k| (k as f64) * 0.5 + 1.0).collect();
        let hsrc = input("h", &[3, 2, 2], prec, &h);
        let hv = hsrc.host_values().unwrap();
        let mut gw = g.host_values().unwrap();
        for (d, &i) in ids_v.iter().enumerate() {
            if (i as usize) < 5 {
                for r in 0..2 {
                    let c = i as usize * 2 + r;
                    gw[c] = prec.round(prec.round_compute(gw[c] + hv[d * 2 + r]));
                }
            }
        }
        let asg = Assignments::ScatterAdd {
            lhs: g.clone(),
            src: hsrc.clone(),
            index: ids.clone(),
        };
        assert_eq!(compute(&asg, &Bindings::empty(), &[&g]).0[0], gw, "{prec}");
        g.set_host_values(&g0).unwrap();
        let mut mem = Memory::new();
        mem.load_from_hosts(&asg.nodes());
        interp::run_assignments(&asg, &[], &mut mem).unwrap();
        assert_eq!(mem.get(&g).unwrap().to_vec(), gw, "{prec}");
    }
}

#[test]
fn gather_from_a_virtual_table() {
    // The table is an intermediate (2 * base), left to the optimizer (it keeps it local: the
    // gather reads it at every row).
    let b = Bindings::empty();
    let base = input("base", &[3, 2], Prec::Single, &[1., 2., 3., 4., 5., 6.]);
    let two = input("two", &[1], Prec::Single, &[2.]);
    let table = temp("table", &[3, 2], Prec::Single);
    let ids = input("ids", &[4], Prec::Byte, &[2., 3., 0., 2.]);
    let y = output("y", &[4, 2], Prec::Single);
    let asg = Assignments::seq([
        binop(
            &table,
            Binop::Arg2,
            false,
            Binop::Mul,
            &base,
            &two,
            "ij,0->ij",
            &b,
        ),
        Assignments::Gather {
            lhs: y.clone(),
            table: table.clone(),
            index: ids.clone(),
        },
    ]);
    let (got, _src, modes) = compute_with_modes(&asg, &b, &[&y]);
    assert!(modes
        .get(&table)
        .is_some_and(|m| m.may_be_virtual() || m == MemoryMode::Local));
    assert_eq!(got[0], vec![10., 12., 0., 0., 2., 4., 10., 12.]);
}

#[test]
fn gather_errors() {
    let table = input("table", &[5, 2], Prec::Single, &[0.0; 10]);
    let fids = input("fids", &[3], Prec::Single, &[0.0; 3]);
    let ids = input("ids", &[3], Prec::Byte, &[0.0; 3]);
    let y = output("y", &[3, 2], Prec::Single);
    let bad = output("bad", &[3, 3], Prec::Single);
    let asg = Assignments::Gather {
        lhs: y.clone(),
        table: table.clone(),
        index: fids.clone(),
    };
    let e = arrayjit::lower::lower(&asg).unwrap_err();
    assert!(matches!(e, arrayjit::Error::IndexPrecision { .. }));
    assert_eq!(
        e.to_string(),
        "gather into y: index tensor fids has precision single, but an index needs an integer precision"
    );
    let asg = Assignments::ScatterAdd {
        lhs: table.clone(),
        src: bad.clone(),
        index: ids.clone(),
    };
    let e = arrayjit::lower::lower(&asg).unwrap_err();
    assert!(matches!(e, arrayjit::Error::GatherShape { .. }));
    assert_eq!(
        e.to_string(),
        "scatter_add into table: bad has dims [3, 3], but index ids (dims [3]) followed by the \
         row dims [2] of table table (dims [5, 2]) give [3, 2]"
    );
}

#[test]
fn ternop_table() {
    assert_eq!(Ternop::from_name("where"), Some(Ternop::Where));
    assert_eq!(Ternop::from_name("fma"), Some(Ternop::Fma));
    assert_eq!(Ternop::from_name("mul3"), Some(Ternop::Mul3));
    assert_eq!(Ternop::from_name("add"), None);
    assert_eq!(Ternop::Fma.c_expr(true, "x", "y", "z"), "fmaf(x, y, z)");
    assert_eq!(Ternop::Fma.c_expr(false, "x", "y", "z"), "fma(x, y, z)");
    // Operands are substituted once, even when their text holds a template marker.
    assert_eq!(
        Ternop::Where.c_expr(false, "$b", "q", "r"),
        "aj_where_d($b, q, r)"
    );
    assert_eq!(Ternop::Mul3.c_expr_int("p", "q", "r"), "(p * q * r)");
    // The integer meaning wraps modulo 2^64.
    assert_eq!(Ternop::Fma.interpret_int(u64::MAX, 2, 5), 3);
    assert_eq!(Ternop::Mul3.interpret_int(1 << 40, 1 << 30, 3), 0);
    assert_eq!(Ternop::Where.interpret_int(0, 7, 9), 9);
    assert_eq!(Ternop::Where.interpret_int(u64::MAX, 7, 9), 7);
    // where: NaN is non-zero, -0 is zero.
    assert_eq!(Ternop::Where.interpret(false, f64::NAN, 1.0, 2.0), 1.0);
    assert_eq!(Ternop::Where.interpret(true, -0.0, 1.0, 2.0), 2.0);
}

#[test]
fn random_operand_of_a_matrix_product() {
    // A random intermediate read by a product large enough for the optimizer's kernels:
    // compiled (whatever it inlines or packs) equals interpreted, and the values are exact
    // sums of the independently computed random cells times small integers.
    let b = Bindings::empty();
    let n = 24;
    let noise = temp("noise", &[n, n], Prec::Double);
    let wv: Vec<f64> = (0..n * n).map(|k| (k % 7) as f64 - 3.0).collect();
    let w = input("w", &[n, n], Prec::Double, &wv);
    let y = output("y", &[n, n], Prec::Double);
    let asg = Assignments::seq([
        Assignments::Fetch {
            array: noise.clone(),
            fetch_op: FetchOp::Random { seed: 99 },
        },
        binop(
            &y,
            Binop::Add,
            true,
            Binop::Mul,
            &noise,
            &w,
            "ik,kj->ij",
            &b,
        ),
    ]);
    let (got, _) = compute(&asg, &b, &[&y]);
    let interp = interpret(&asg, &[&y]);
    let r: Vec<f64> = (0..n * n)
        .map(|o| expected_random(99, o as u64, Prec::Double))
        .collect();
    for i in 0..n {
        for j in 0..n {
            let want: f64 = (0..n).map(|k| r[i * n + k] * wv[k * n + j]).sum();
            let g = got[0][i * n + j];
            assert!(
                (g - want).abs() <= 1e-12 * want.abs().max(1.0),
                "{i},{j}: {g} vs {want}"
            );
            let it = interp[0][i * n + j];
            assert!(
                (it - want).abs() <= 1e-12 * want.abs().max(1.0),
                "{i},{j}: {it} vs {want}"
            );
        }
    }
}

/// An index value as a tensor of `prec` holds it (wrapped modulo 2^bits, read signed or
/// unsigned), computed here independently of the library.
fn stored_index(prec: Prec, x: i128) -> i128 {
    let b = x as u64;
    match prec {
        Prec::Byte => (b as u8).into(),
        Prec::Uint16 => (b as u16).into(),
        Prec::Int32 => (b as u32 as i32).into(),
        Prec::Uint32 => (b as u32).into(),
        Prec::Int64 => (b as i64).into(),
        Prec::Uint64 => b.into(),
        _ => unreachable!("not an index precision"),
    }
}

/// A hosted integer tensor holding exactly `values` (wrapped into `prec`).
fn int_input(name: &str, prec: Prec, values: &[i128]) -> Tnode {
    let t = output(name, &[values.len()], prec);
    t.with_host_mut(|a| {
        for (i, &v) in values.iter().enumerate() {
            a.set_int(i, v);
        }
    })
    .unwrap();
    t
}

/// The cc backend with `compiler` and, for gcc, UndefinedBehaviorSanitizer aborting on the
/// first report (so undefined behaviour in the generated code fails the test).
fn backend_with(compiler: &str) -> arrayjit::backend::CcBackend {
    let env = arrayjit::compile::CompilerConfig::from_env().unwrap();
    let extra_flags = if compiler == "gcc" {
        vec![
            "-fsanitize=undefined".to_string(),
            "-fno-sanitize-recover=all".to_string(),
        ]
    } else {
        vec![]
    };
    let cfg = env
        .compiler(compiler)
        .extra_flags(extra_flags)
        .cache_dir(None);
    arrayjit::backend::CcBackend::with_config(cfg, arrayjit::optimize::Settings::default())
}

/// Compiles and runs with `compiler`; the outputs and the C source.
fn compute_with(compiler: &str, asg: &Assignments, outs: &[&Tnode]) -> (Vec<Vec<f64>>, String) {
    let be = backend_with(compiler);
    let (r, src) = build(&be, "test", &Bindings::empty(), asg).unwrap();
    (run_and_read(&be, &r, outs), src)
}

/// Index values that are negative, huge (2^63, 2^64 - 1), exactly N, or wrap into range in
/// narrow precisions; read in every integer precision, by gcc (under UBSan) and clang
/// compiled code and by the interpreter, against rows picked here.
#[test]
fn gather_and_scatter_add_read_exact_integer_indices() {
    const N: usize = 5;
    let raw: Vec<i128> = vec![
        -1,
        0,
        4,
        5, // exactly N
        3,
        1 << 63,
        (1 << 64) - 1,
        -(1 << 63),
        (1 << 32) + 1, // 1 in 32-bit precisions
        (1 << 16) + 2, // 2 in uint16
        256 + 4,       // 4 in byte
        (1 << 31) + 3, // negative in int32
        (1 << 53) + 1,
        4, // a repeat: scatter_add adds twice
    ];
    let tv: Vec<f64> = (0..N * 2).map(|k| k as f64 * 1.25 - 2.0).collect();
    for prec in [
        Prec::Byte,
        Prec::Uint16,
        Prec::Int32,
        Prec::Uint32,
        Prec::Int64,
        Prec::Uint64,
    ] {
        let ids = int_input("ids", prec, &raw);
        let rows: Vec<Option<usize>> = raw
            .iter()
            .map(|&x| {
                let v = stored_index(prec, x);
                (0..N as i128).contains(&v).then_some(v as usize)
            })
            .collect();
        let table = input("table", &[N, 2], Prec::Single, &tv);
        let y = output("y", &[raw.len(), 2], Prec::Single);
        let gather = Assignments::Gather {
            lhs: y.clone(),
            table: table.clone(),
            index: ids.clone(),
        };
        let tv = &tv;
        let want: Vec<f64> = rows
            .iter()
            .flat_map(|r| (0..2).map(move |c| r.map_or(0.0, |r| tv[r * 2 + c])))
            .collect();
        for cc in ["gcc", "clang"] {
            y.set_host_values(&vec![9.0; raw.len() * 2]).unwrap();
            assert_eq!(compute_with(cc, &gather, &[&y]).0[0], want, "{prec} {cc}");
        }
        y.set_host_values(&vec![9.0; raw.len() * 2]).unwrap();
        assert_eq!(interpret(&gather, &[&y])[0], want, "{prec}");

        // Scatter rows of h back, in f32 arithmetic, in the order of d.
        let hv: Vec<f64> = (0..raw.len() * 2).map(|k| k as f64 * 0.5 + 0.25).collect();
        let h = input("h", &[raw.len(), 2], Prec::Single, &hv);
        let g0: Vec<f64> = (0..N * 2).map(|k| 100.0 * k as f64).collect();
        let g = input("g", &[N, 2], Prec::Single, &g0);
        let mut gw: Vec<f32> = g0.iter().map(|&x| x as f32).collect();
        for (d, r) in rows.iter().enumerate() {
            if let Some(r) = r {
                for c in 0..2 {
                    gw[r * 2 + c] += hv[d * 2 + c] as f32;
                }
            }
        }
        let gw: Vec<f64> = gw.into_iter().map(f64::from).collect();
        let scatter = Assignments::ScatterAdd {
            lhs: g.clone(),
            src: h.clone(),
            index: ids.clone(),
        };
        for cc in ["gcc", "clang"] {
            g.set_host_values(&g0).unwrap();
            assert_eq!(compute_with(cc, &scatter, &[&g]).0[0], gw, "{prec} {cc}");
        }
        g.set_host_values(&g0).unwrap();
        assert_eq!(interpret(&scatter, &[&g])[0], gw, "{prec}");
    }
}

/// Scatter-add into an integer table adds exactly (SPEC 9.1: integer arithmetic, no rounding
/// through a float), repeated indices included.
#[test]
fn scatter_add_into_integers_is_exact() {
    let big = (1i128 << 53) + 1;
    let g = int_input("g", Prec::Int64, &[big, -big, 7]);
    let h = int_input("h", Prec::Int64, &[1, 1, 1, -5, 1 << 40]);
    let ids = int_input("ids", Prec::Uint16, &[0, 0, 0, 1, 3]);
    let asg = Assignments::ScatterAdd {
        lhs: g.clone(),
        src: h.clone(),
        index: ids.clone(),
    };
    let want = vec![big + 3, -big - 5, 7];
    let be = backend_with("gcc");
    let (r, _) = build(&be, "test", &Bindings::empty(), &asg).unwrap();
    r.run().unwrap();
    assert!(be.to_host(r.context(), &g).unwrap());
    let got: Vec<i128> = g
        .with_host(|a| (0..3).map(|i| a.get_int(i).unwrap()).collect())
        .unwrap();
    assert_eq!(got, want);
    g.with_host_mut(|a| {
        for (i, v) in [big, -big, 7].into_iter().enumerate() {
            a.set_int(i, v);
        }
    })
    .unwrap();
    let mut mem = Memory::new();
    mem.load_from_hosts(&asg.nodes());
    interp::run_assignments(&asg, &[], &mut mem).unwrap();
    assert_eq!(mem.get_int(&g).unwrap(), want);
}

/// A table of 100,000 rows: the generated code reads each index once and copies one row (no
/// loop over the table's rows), and agrees with the interpreter and the rows picked here.
#[test]
fn gather_from_a_large_table_does_not_loop_over_its_rows() {
    const N: usize = 100_000;
    let tv: Vec<f64> = (0..N * 3).map(|k| k as f64).collect();
    let table = input("table", &[N, 3], Prec::Single, &tv);
    let raw = [99_999i128, 0, 100_000, 50_000, -7, 99_999];
    let ids = int_input("ids", Prec::Int32, &raw);
    let y = output("y", &[raw.len(), 3], Prec::Single);
    let asg = Assignments::Gather {
        lhs: y.clone(),
        table: table.clone(),
        index: ids.clone(),
    };
    let want: Vec<f64> = raw
        .iter()
        .flat_map(|&i| {
            (0..3).map(move |c| {
                if (0..N as i128).contains(&i) {
                    (i as usize * 3 + c) as f64
                } else {
                    0.0
                }
            })
        })
        .collect();
    let (got, src) = compute(&asg, &Bindings::empty(), &[&y]);
    assert_eq!(got[0], want);
    assert!(!src.contains("99999;"), "a loop over the rows:\n{src}");
    assert!(src.contains("< UINT64_C(100000)"), "{src}");
    y.set_host_values(&[5.0; 18]).unwrap();
    assert_eq!(interpret(&asg, &[&y])[0], want);
}

/// Rows past 2^24 (where a `float` difference `I[d] - n` would no longer be exact): a byte
/// table of 2^24 + 3 rows, compiled.
#[test]
fn gather_rows_past_two_to_the_24() {
    const N: usize = (1 << 24) + 3;
    let table = output("table", &[N], Prec::Byte);
    table
        .with_host_mut(|a| {
            for (k, b) in a.as_bytes_mut().iter_mut().enumerate() {
                *b = (k % 251) as u8;
            }
        })
        .unwrap();
    let raw = [(1i128 << 24) + 1, 1 << 24, (1 << 24) + 2, (1 << 24) + 3];
    let ids = int_input("ids", Prec::Int64, &raw);
    let y = output("y", &[4], Prec::Single);
    let asg = Assignments::Gather {
        lhs: y.clone(),
        table: table.clone(),
        index: ids.clone(),
    };
    let want: Vec<f64> = raw
        .iter()
        .map(|&i| {
            if i < N as i128 {
                (i as usize % 251) as f64
            } else {
                0.0
            }
        })
        .collect();
    assert_eq!(compute(&asg, &Bindings::empty(), &[&y]).0[0], want);
}

/// The loop IR of a gather: one lookup per index cell (no loop over the table's rows); the
/// verifier rejects a lookup reading a floating tensor or using its symbol outside its body.
#[test]
fn gather_lowers_to_a_lookup() {
    use arrayjit::loops::{verify, Llc, Llv};
    let table = input("table", &[7, 2], Prec::Single, &[0.0; 14]);
    let ids = input("ids", &[1], Prec::Int32, &[3.0]);
    let y = output("y", &[1, 2], Prec::Single);
    let asg = Assignments::Gather {
        lhs: y.clone(),
        table: table.clone(),
        index: ids.clone(),
    };
    let code = arrayjit::lower::lower(&asg).unwrap();
    let doc = arrayjit::loops::to_doc(&code);
    assert!(
        doc.contains("lookup ") && doc.contains(" = ids[0] if 0 <= "),
        "{doc}"
    );
    assert!(!doc.contains("to 6 {"), "{doc}");
    assert_eq!(verify(&code), Ok(()));
    // A single index (dims [1]: no loop around the lookup) of value 3 picks row 3, compiled and interpreted.
    let tv: Vec<f64> = (0..14).map(f64::from).collect();
    table.set_host_values(&tv).unwrap();
    assert_eq!(
        compute(&asg, &Bindings::empty(), &[&y]).0[0],
        vec![6.0, 7.0]
    );
    y.set_host_values(&[1.0, 1.0]).unwrap();
    assert_eq!(interpret(&asg, &[&y])[0], vec![6.0, 7.0]);

    let s = Symbol::fresh();
    let body = Llc::Set {
        tn: y.clone(),
        idcs: vec![AxisIndex::Fixed(0), AxisIndex::Fixed(0)],
        value: Llv::Get(
            table.clone(),
            vec![AxisIndex::Iterator(s), AxisIndex::Fixed(0)],
        ),
    };
    let lookup = |tn: &Tnode| Llc::Lookup {
        symbol: s,
        tn: tn.clone(),
        idcs: vec![AxisIndex::Fixed(0)],
        extent: 7,
        body: Box::new(body.clone()),
    };
    let fscalar = input("f", &[1], Prec::Single, &[0.0]);
    assert_eq!(
        verify(&lookup(&fscalar)),
        Err("an index read from single tensor f".to_string())
    );
    let outside = Llc::Seq(vec![lookup(&ids), body.clone()]);
    assert!(verify(&outside)
        .unwrap_err()
        .contains("is used outside its loop"));
}

/// Regression (differential seed 4278): a random fetch read through an affine index
/// (`t6[a + 2, b]`), inlined into `t8`, which is itself inlined into `o9`: the inliner renames
/// plain iterators only, so a computation holding a random cell with a linear index stays
/// materialized (it printed an undeclared iterator in the random value's offset before).
#[test]
fn random_fetch_read_through_an_affine_index_inlined_twice() {
    let b = Bindings::empty();
    let t6 = temp("t6", &[5, 5], Prec::Half);
    let x7 = input(
        "x7",
        &[3],
        Prec::Half,
        &[0.720703125, -1.15234375, -1.466796875],
    );
    let t8 = temp("t8", &[3], Prec::Single);
    let o9 = output("o9", &[3], Prec::Single);
    let asg = Assignments::seq([
        Assignments::Fetch {
            array: t6.clone(),
            fetch_op: FetchOp::Random { seed: 1 },
        },
        binop(
            &t8,
            Binop::Arg2,
            false,
            Binop::Sub,
            &x7,
            &t6,
            "a,(a+2)b->a",
            &b,
        ),
        unop(&o9, Binop::Arg2, false, Unop::Identity, &t8, "a->a", &b),
    ]);
    // `set` keeps the last b (4): o9[a] = x7[a] - t6[a + 2, 4], in float.
    let xv = x7.host_values().unwrap();
    let want: Vec<f64> = (0..3)
        .map(|a| {
            let r = expected_random(1, ((a + 2) * 5 + 4) as u64, Prec::Half);
            f64::from(xv[a] as f32 - r as f32)
        })
        .collect();
    assert_eq!(compute(&asg, &b, &[&o9]).0[0], want);
    o9.set_host_values(&[0.0; 3]).unwrap();
    assert_eq!(interpret(&asg, &[&o9])[0], want);
}
