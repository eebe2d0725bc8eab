//! SPEC 9.1 precisions and the 9.2 operations on them: compiled C against values computed
//! independently here (plain Rust integer arithmetic, rounding tables decoded from the formats'
//! definitions), the reference interpreter against the same values, and the CLI surface.

mod common;
use arrayjit::interp::{self, Memory};
use arrayjit::ir::*;
use common::*;
use std::process::Command;

/// A hosted tensor holding exactly the given integers (wrapped into the precision).
fn int_input(name: &str, prec: Prec, vals: &[i128]) -> Tnode {
    let t = Tnode::hosted(&[name], &[vals.len()], prec).unwrap();
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

/// Runs `asgns` compiled (exact host values of `outs`), then through the interpreter from
/// the same inputs, and checks both against `want`.
fn check_ints(asgns: Vec<Assignments>, outs: &[(&Tnode, Vec<i128>)]) {
    let a = Assignments::seq(asgns);
    let b = Bindings::empty();
    let nodes: Vec<&Tnode> = outs.iter().map(|o| o.0).collect();
    compute(&a, &b, &nodes);
    for (t, want) in outs {
        assert_eq!(&ints_of(t), want, "compiled: {}", t.name());
    }
    let inputs = a.nodes();
    let mut mem = Memory::new();
    mem.load_from_hosts(inputs.iter().filter(|t| !nodes.contains(t)));
    interp::run_assignments(&a, &[], &mut mem).unwrap();
    for (t, want) in outs {
        assert_eq!(&mem.get_int(t).unwrap(), want, "interpreted: {}", t.name());
    }
}

fn elementwise(out: &Tnode, op: Binop, a: &Tnode, b: &Tnode) -> Assignments {
    binop(
        out,
        Binop::Arg2,
        false,
        op,
        a,
        b,
        "i,i->i",
        &Bindings::empty(),
    )
}

fn wrap(prec: Prec, v: i128) -> i128 {
    prec.wrap_int(v as u64)
}

#[test]
fn int32_int64_uint64_arithmetic_wraps() {
    let a32 = [i32::MAX as i128, i32::MIN as i128, -1, 5, 46341];
    let b32 = [1, -1, i32::MIN as i128, 3, 46341];
    let (x, y) = (
        int_input("x", Prec::Int32, &a32),
        int_input("y", Prec::Int32, &b32),
    );
    let add = output("add", &[5], Prec::Int32);
    let mul = output("mul", &[5], Prec::Int32);
    let sub = output("sub", &[5], Prec::Int32);
    let i32s = |f: fn(i32, i32) -> i32| -> Vec<i128> {
        a32.iter()
            .zip(&b32)
            .map(|(&p, &q)| f(p as i32, q as i32) as i128)
            .collect()
    };
    let a64 = [
        i64::MAX as i128,
        i64::MIN as i128,
        9_007_199_254_740_993,
        -3,
    ];
    let b64 = [1, -1, 3, i64::MIN as i128];
    let (x64, y64) = (
        int_input("x64", Prec::Int64, &a64),
        int_input("y64", Prec::Int64, &b64),
    );
    let add64 = output("add64", &[4], Prec::Int64);
    let mul64 = output("mul64", &[4], Prec::Int64);
    let i64s = |f: fn(i64, i64) -> i64| -> Vec<i128> {
        a64.iter()
            .zip(&b64)
            .map(|(&p, &q)| f(p as i64, q as i64) as i128)
            .collect()
    };
    let au = [u64::MAX as i128, 1 << 63, 3, 12_345_678_901_234_567_891];
    let bu = [1, 2, u64::MAX as i128, 3];
    let (xu, yu) = (
        int_input("xu", Prec::Uint64, &au),
        int_input("yu", Prec::Uint64, &bu),
    );
    let addu = output("addu", &[4], Prec::Uint64);
    let mulu = output("mulu", &[4], Prec::Uint64);
    let u64s = |f: fn(u64, u64) -> u64| -> Vec<i128> {
        au.iter()
            .zip(&bu)
            .map(|(&p, &q)| f(p as u64, q as u64) as i128)
            .collect()
    };
    check_ints(
        vec![
            elementwise(&add, Binop::Add, &x, &y),
            elementwise(&mul, Binop::Mul, &x, &y),
            elementwise(&sub, Binop::Sub, &x, &y),
            elementwise(&add64, Binop::Add, &x64, &y64),
            elementwise(&mul64, Binop::Mul, &x64, &y64),
            elementwise(&addu, Binop::Add, &xu, &yu),
            elementwise(&mulu, Binop::Mul, &xu, &yu),
        ],
        &[
            (&add, i32s(i32::wrapping_add)),
            (&mul, i32s(i32::wrapping_mul)),
            (&sub, i32s(i32::wrapping_sub)),
            (&add64, i64s(i64::wrapping_add)),
            (&mul64, i64s(i64::wrapping_mul)),
            (&addu, u64s(u64::wrapping_add)),
            (&mulu, u64s(u64::wrapping_mul)),
        ],
    );
}

#[test]
fn division_and_modulo_by_zero_and_min_by_minus_one() {
    let a = [i64::MIN as i128, 7, -7, 5, i64::MIN as i128, -9];
    let b = [-1, 0, 2, -3, 1, 0];
    let (x, y) = (
        int_input("x", Prec::Int64, &a),
        int_input("y", Prec::Int64, &b),
    );
    let d = output("d", &[6], Prec::Int64);
    let m = output("m", &[6], Prec::Int64);
    let want = |f: fn(i64, i64) -> i64| -> Vec<i128> {
        a.iter()
            .zip(&b)
            .map(|(&p, &q)| {
                if q == 0 {
                    0
                } else {
                    f(p as i64, q as i64) as i128
                }
            })
            .collect()
    };
    // int32: MIN / -1 wraps to MIN.
    let x32 = int_input("x32", Prec::Int32, &[i32::MIN as i128, 1]);
    let y32 = int_input("y32", Prec::Int32, &[-1, 0]);
    let d32 = output("d32", &[2], Prec::Int32);
    // uint32 / byte with 0
    let xb = int_input("xb", Prec::Byte, &[200, 9]);
    let yb = int_input("yb", Prec::Byte, &[0, 4]);
    let mb = output("mb", &[2], Prec::Byte);
    check_ints(
        vec![
            elementwise(&d, Binop::Div, &x, &y),
            elementwise(&m, Binop::Mod, &x, &y),
            elementwise(&d32, Binop::Div, &x32, &y32),
            elementwise(&mb, Binop::Mod, &xb, &yb),
        ],
        &[
            (&d, want(i64::wrapping_div)),
            (&m, want(i64::wrapping_rem)),
            (&d32, vec![i32::MIN as i128, 0]),
            (&mb, vec![0, 1]),
        ],
    );
}

#[test]
fn shifts_take_the_count_modulo_the_width() {
    let a = [1i128, 1, -8, 3, -8, i32::MIN as i128];
    let b = [31i128, 32, 33, -1, 65, 4];
    let (x, y) = (
        int_input("x", Prec::Int32, &a),
        int_input("y", Prec::Int32, &b),
    );
    let shl = output("shl", &[6], Prec::Int32);
    let shr = output("shr", &[6], Prec::Int32);
    let want_shl = a
        .iter()
        .zip(&b)
        .map(|(&p, &q)| (p as i32).wrapping_shl((q as u32) % 32) as i128)
        .collect();
    let want_shr = a
        .iter()
        .zip(&b)
        .map(|(&p, &q)| ((p as i32) >> ((q as u32) % 32)) as i128)
        .collect();
    // Unsigned results shift logically; uint64 counts modulo 64.
    let au = [u64::MAX as i128, 1 << 63, 5];
    let bu = [64i128, 63, 130];
    let (xu, yu) = (
        int_input("xu", Prec::Uint64, &au),
        int_input("yu", Prec::Uint64, &bu),
    );
    let shru = output("shru", &[3], Prec::Uint64);
    let shlu = output("shlu", &[3], Prec::Uint64);
    let want_u = |f: fn(u64, u32) -> u64| -> Vec<i128> {
        au.iter()
            .zip(&bu)
            .map(|(&p, &q)| f(p as u64, (q as u32) % 64) as i128)
            .collect()
    };
    // byte: shl by 8 is by 0; bit operations
    let xb = int_input("xb", Prec::Byte, &[0x81, 0xf0, 0x0f]);
    let yb = int_input("yb", Prec::Byte, &[8, 0x3c, 0xff]);
    let shlb = output("shlb", &[3], Prec::Byte);
    let andb = output("andb", &[3], Prec::Byte);
    let xorb = output("xorb", &[3], Prec::Byte);
    let orb = output("orb", &[3], Prec::Byte);
    check_ints(
        vec![
            elementwise(&shl, Binop::Shl, &x, &y),
            elementwise(&shr, Binop::Shr, &x, &y),
            elementwise(&shru, Binop::Shr, &xu, &yu),
            elementwise(&shlu, Binop::Shl, &xu, &yu),
            elementwise(&shlb, Binop::Shl, &xb, &yb),
            elementwise(&andb, Binop::BitAnd, &xb, &yb),
            elementwise(&xorb, Binop::BitXor, &xb, &yb),
            elementwise(&orb, Binop::BitOr, &xb, &yb),
        ],
        &[
            (&shl, want_shl),
            (&shr, want_shr),
            (&shru, want_u(|p, k| p >> k)),
            (&shlu, want_u(|p, k| p << k)),
            (
                &shlb,
                vec![0x81, (0xf0 << (0x3c % 8)) & 0xff, 0x0f << 7 & 0xff],
            ),
            (&andb, vec![0, 0x30, 0x0f]),
            (&xorb, vec![0x89, 0xcc, 0xf0]),
            (&orb, vec![0x89, 0xfc, 0xff]),
        ],
    );
}

#[test]
fn comparisons_max_min_pow_and_unary_ops_on_integers() {
    let a = [i64::MIN as i128, -1, 0, 3, -2, 1];
    let b = [i64::MAX as i128, -1, -5, 2, -3, -7];
    let (x, y) = (
        int_input("x", Prec::Int64, &a),
        int_input("y", Prec::Int64, &b),
    );
    let outs: Vec<(Binop, Tnode)> = [
        Binop::Lt,
        Binop::Ge,
        Binop::Eq,
        Binop::Max,
        Binop::Min,
        Binop::ToPowOf,
    ]
    .into_iter()
    .map(|op| (op, output(&format!("o_{}", op.name()), &[6], Prec::Int64)))
    .collect();
    let ipow = |p: i64, q: i64| -> i64 {
        if q < 0 {
            match p {
                1 => 1,
                -1 => {
                    if q % 2 == 0 {
                        1
                    } else {
                        -1
                    }
                }
                _ => 0,
            }
        } else {
            p.wrapping_pow(q as u32)
        }
    };
    let want = |op: Binop| -> Vec<i128> {
        a.iter()
            .zip(&b)
            .map(|(&p, &q)| {
                let (p, q) = (p as i64, q as i64);
                i128::from(match op {
                    Binop::Lt => i64::from(p < q),
                    Binop::Ge => i64::from(p >= q),
                    Binop::Eq => i64::from(p == q),
                    Binop::Max => p.max(q),
                    Binop::Min => p.min(q),
                    _ => ipow(p, q),
                })
            })
            .collect()
    };
    let neg = output("neg", &[6], Prec::Int64);
    let abs = output("abs", &[6], Prec::Int64);
    let not = output("not", &[6], Prec::Int64);
    let sqrt = output("sqrt", &[6], Prec::Int64);
    let e = Bindings::empty();
    let mut asg: Vec<Assignments> = outs
        .iter()
        .map(|(op, t)| elementwise(t, *op, &x, &y))
        .collect();
    for (t, op) in [
        (&neg, Unop::Neg),
        (&abs, Unop::Abs),
        (&not, Unop::Not),
        (&sqrt, Unop::Sqrt),
    ] {
        asg.push(unop(t, Binop::Arg2, false, op, &y, "i->i", &e));
    }
    // max / min reductions start at the type's minimum / maximum
    let mx = output("mx", &[1], Prec::Int64);
    let mn = output("mn", &[1], Prec::Int64);
    let xs = int_input("xs", Prec::Int64, &[i64::MIN as i128, i64::MIN as i128]);
    let xl = int_input("xl", Prec::Int64, &[i64::MAX as i128, i64::MAX as i128]);
    asg.push(unop(&mx, Binop::Max, true, Unop::Identity, &xs, "i->0", &e));
    asg.push(unop(&mn, Binop::Min, true, Unop::Identity, &xl, "i->0", &e));
    let mut checks: Vec<(&Tnode, Vec<i128>)> = outs.iter().map(|(op, t)| (t, want(*op))).collect();
    checks.push((
        &neg,
        b.iter()
            .map(|&q| (q as i64).wrapping_neg() as i128)
            .collect(),
    ));
    checks.push((
        &abs,
        b.iter()
            .map(|&q| (q as i64).wrapping_abs() as i128)
            .collect(),
    ));
    checks.push((&not, b.iter().map(|&q| i128::from(q == 0)).collect()));
    // sqrt of a negative is NaN, which stores 0
    checks.push((&sqrt, vec![3037000499, 0, 0, 1, 0, 0]));
    checks.push((&mx, vec![i64::MIN as i128]));
    checks.push((&mn, vec![i64::MAX as i128]));
    check_ints(asg, &checks);
}

/// SPEC 9.1: integer arithmetic is exact, then reduced modulo 2^64. Every value keeps the
/// signedness of its own precision, whatever the result's: -5 <= 5 holds and |-6| = 6 even
/// when the result is a uint64, and a signed value meets a uint64 one by their exact values
/// (numpy does the same). Found by scripts/conformance.py: the whole statement used to
/// compute with unsigned meanings as soon as the result or any argument was a uint64.
#[test]
fn integer_operands_keep_their_own_signedness() {
    let e = Bindings::empty();
    let umax = u64::MAX as i128;
    let s32 = int_input("s32", Prec::Int32, &[-5, 63, 11]);
    let u5 = int_input("u5", Prec::Uint64, &[5, 5, 5]);
    let le = output("le", &[3], Prec::Uint64);
    let s64 = int_input("s64", Prec::Int64, &[2, 5, -6, -3]);
    let abs = output("abs", &[4], Prec::Uint64);
    let r32 = int_input("r32", Prec::Int32, &[-7, 4, 0]);
    let relu = output("relu", &[3], Prec::Uint64);
    let m32 = int_input("m32", Prec::Int32, &[10, -7]);
    let mu = int_input("mu", Prec::Uint64, &[6, 10]);
    let min = output("min", &[2], Prec::Int64);
    // a max reduction into int32 (stored at every step) of uint64 values: max(MIN, 6) = 6;
    // max(6, 2^64-1) = 2^64-1, stored as -1; max(-1, 3) = 3
    let xu = int_input("xu", Prec::Uint64, &[6, umax, 3]);
    let red = output("red", &[1], Prec::Int32);
    let d32 = int_input("d32", Prec::Int32, &[-7, 7]);
    let du = int_input("du", Prec::Uint64, &[2, 2]);
    let div = output("div", &[2], Prec::Int64);
    let rem = output("rem", &[2], Prec::Int64);
    // -1 (int32) and 2^64-1 (uint64) are different numbers
    let e32 = int_input("e32", Prec::Int32, &[-1, 3]);
    let eu = int_input("eu", Prec::Uint64, &[umax, 3]);
    let eq = output("eq", &[2], Prec::Uint64);
    // (2^64-1)^-1 is a real below 1 (truncated: 0); 1^-2 = 1
    let pb = int_input("pb", Prec::Uint64, &[umax, 1]);
    let pe = int_input("pe", Prec::Int32, &[-1, -2]);
    let pow = output("pow", &[2], Prec::Int64);
    // 0 + max(-7, 255) accumulated into a uint64
    let a32 = int_input("a32", Prec::Int32, &[-7]);
    let a64 = int_input("a64", Prec::Int64, &[255]);
    let acc = output("acc", &[1], Prec::Uint64);
    check_ints(
        vec![
            elementwise(&le, Binop::Le, &s32, &u5),
            unop(&abs, Binop::Arg2, false, Unop::Abs, &s64, "i->i", &e),
            unop(&relu, Binop::Arg2, false, Unop::Relu, &r32, "i->i", &e),
            elementwise(&min, Binop::Min, &m32, &mu),
            unop(&red, Binop::Max, true, Unop::Identity, &xu, "i->0", &e),
            elementwise(&div, Binop::Div, &d32, &du),
            elementwise(&rem, Binop::Mod, &d32, &du),
            elementwise(&eq, Binop::Eq, &e32, &eu),
            elementwise(&pow, Binop::ToPowOf, &pb, &pe),
            binop(
                &acc,
                Binop::Add,
                false,
                Binop::Max,
                &a32,
                &a64,
                "i,i->i",
                &e,
            ),
        ],
        &[
            (&le, vec![1, 0, 0]),
            (&abs, vec![2, 5, 6, 3]),
            (&relu, vec![0, 4, 0]),
            (&min, vec![6, -7]),
            (&red, vec![3]),
            (&div, vec![-3, 3]),
            (&rem, vec![-1, 1]),
            (&eq, vec![0, 1]),
            (&pow, vec![0, 1]),
            (&acc, vec![255]),
        ],
    );
}

/// `shr` shifts the exact value of its operand (arithmetic for a negative one, as numpy's
/// `right_shift` on the operand's type), then the result is stored by the wrapping rule:
/// -5 >> 2 = -2 stores 254 in a byte, 0x1ff >> 1 = 0xff stores 255, and the uint32
/// 0xfffffff8 >> 1 is 0x7ffffffc in an int32. Found by scripts/conformance.py (the operand
/// used to be read at the result's width and signedness: 62, 127 and -4).
#[test]
fn shr_shifts_the_operand_value_then_stores() {
    let a = int_input("a", Prec::Int64, &[-5, 0x1ff]);
    let k = int_input("k", Prec::Int32, &[2, 1]);
    let byte = output("byte", &[2], Prec::Byte);
    let u = int_input("u", Prec::Uint32, &[0xffff_fff8]);
    let one = int_input("one", Prec::Int32, &[1]);
    let s = output("s", &[1], Prec::Int32);
    check_ints(
        vec![
            elementwise(&byte, Binop::Shr, &a, &k),
            elementwise(&s, Binop::Shr, &u, &one),
        ],
        &[(&byte, vec![254, 255]), (&s, vec![0x7fff_fffc])],
    );
}

#[test]
fn integer_results_with_floating_arguments_compute_in_double() {
    // byte <- 2.7 + 2.7 stores 5 (double, then truncated); int32 <- 1e10 wraps; NaN stores 0.
    let x = input("x", &[4], Prec::Single, &[2.7, 1e10, f64::NAN, -3.9]);
    let y = input("y", &[4], Prec::Single, &[2.7, 0.0, 1.0, 0.0]);
    let b8 = output("b8", &[4], Prec::Byte);
    let i32o = output("i32o", &[4], Prec::Int32);
    // the sum in double of the two singles, truncated
    let sum = f64::from(2.7f32) + f64::from(2.7f32);
    check_ints(
        vec![
            elementwise(&b8, Binop::Add, &x, &y),
            elementwise(&i32o, Binop::Add, &x, &y),
        ],
        &[
            (
                &b8,
                vec![sum.trunc() as i128, (1e10f32 as i128) % 256, 0, 253],
            ),
            (
                &i32o,
                vec![
                    sum.trunc() as i128,
                    wrap(Prec::Int32, 1e10f32 as i128),
                    0,
                    -3,
                ],
            ),
        ],
    );
}

#[test]
fn comparisons_and_logic_with_nan() {
    let nan = f64::NAN;
    let x = input("x", &[4], Prec::Single, &[nan, 1.0, nan, 0.0]);
    let y = input("y", &[4], Prec::Single, &[1.0, nan, nan, 0.0]);
    let b = Bindings::empty();
    let ops = [
        (Binop::Lt, [0.0, 0.0, 0.0, 0.0]),
        (Binop::Ge, [0.0, 0.0, 0.0, 1.0]),
        (Binop::Eq, [0.0, 0.0, 0.0, 1.0]),
        (Binop::Ne, [1.0, 1.0, 1.0, 0.0]),
        (Binop::And, [1.0, 1.0, 1.0, 0.0]),
        (Binop::Or, [1.0, 1.0, 1.0, 0.0]),
        (Binop::Satur01Gate, [0.0, 0.0, 0.0, 0.0]),
    ];
    let outs: Vec<Tnode> = ops
        .iter()
        .map(|(op, _)| output(&format!("o_{}", op.name()), &[4], Prec::Single))
        .collect();
    let asg: Vec<Assignments> = ops
        .iter()
        .zip(&outs)
        .map(|((op, _), t)| binop(t, Binop::Arg2, false, *op, &x, &y, "i,i->i", &b))
        .collect();
    let refs: Vec<&Tnode> = outs.iter().collect();
    let (got, _) = compute(&Assignments::seq(asg), &b, &refs);
    for ((op, want), got) in ops.iter().zip(got) {
        assert_eq!(got, want.to_vec(), "{}", op.name());
    }
    // An int32 result of a comparison of singles (computes in double).
    let c = output("c", &[4], Prec::Int32);
    let (got, _) = compute(
        &binop(&c, Binop::Arg2, false, Binop::Le, &x, &y, "i,i->i", &b),
        &b,
        &[&c],
    );
    assert_eq!(got[0], vec![0.0, 0.0, 0.0, 1.0]);
}

/// Inputs around the interesting points of bfloat16 and fp8: ties, the overflow threshold,
/// NaN, infinities, subnormals and the subnormal/normal boundary.
fn narrow_inputs() -> Vec<f64> {
    let p = |e: i32| 2f64.powi(e);
    vec![
        1.0 + p(-8),           // bf16 tie -> 1
        1.0 + 3.0 * p(-8),     // bf16 tie -> up
        1.125,                 // fp8 tie -> 1
        1.375,                 // fp8 tie -> 1.5
        57344.0,               // fp8 max
        61439.0,               // below the fp8 overflow tie
        61440.0,               // fp8 overflow tie -> inf
        -70000.0,              // -inf in fp8
        3.3895313892515355e38, // bf16 max
        3.4e38,                // beyond the bf16 overflow tie -> inf
        f64::NAN,
        f64::INFINITY,
        -f64::INFINITY,
        p(-17),                  // fp8 subnormal tie -> 0
        3.0 * p(-17),            // fp8 subnormal tie -> 2^-15
        1.1 * p(-17),            // fp8 -> 2^-16
        p(-14) * 0.875 + p(-18), // rounds up to the fp8 min normal
        p(-130) * 1.5,           // bf16 subnormal
        -0.1,
        0.3,
        -0.0,
    ]
}

#[test]
fn bf16_and_fp8_round_to_nearest_even_when_storing() {
    let vals = narrow_inputs();
    let n = vals.len();
    let x = input("x", &[n], Prec::Double, &vals);
    let b = Bindings::empty();
    // via single (the compute type of these results): exact for these inputs
    let bf = output("bf", &[n], Prec::Bfloat16);
    let f8 = output("f8", &[n], Prec::Fp8);
    let asg = Assignments::seq(vec![
        unop(&bf, Binop::Arg2, false, Unop::Identity, &x, "i->i", &b),
        unop(&f8, Binop::Arg2, false, Unop::Identity, &x, "i->i", &b),
    ]);
    let (got, _) = compute(&asg, &b, &[&bf, &f8]);
    let (bf_t, f8_t) = (bf16_values(), fp8_values());
    for (i, &v) in vals.iter().enumerate() {
        let v32 = v as f32 as f64;
        let (wb, wf) = (nearest_in(v32, &bf_t), nearest_in(v32, &f8_t));
        let same = |g: f64, w: f64| (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits();
        assert!(
            same(got[0][i], wb),
            "bf16 of {v}: got {}, want {wb}",
            got[0][i]
        );
        assert!(
            same(got[1][i], wf),
            "fp8 of {v}: got {}, want {wf}",
            got[1][i]
        );
        // The library's rounding (host arrays, interpreter) agrees.
        assert!(same(Prec::Bfloat16.round(v), wb), "Prec::round bf16 of {v}");
        assert!(same(Prec::Fp8.round(v), wf), "Prec::round fp8 of {v}");
    }
    // Arithmetic in bf16/fp8 results: computed in float, rounded once at the store.
    let s = output("s", &[n], Prec::Fp8);
    let asg = binop(&s, Binop::Arg2, false, Binop::Add, &x, &x, "i,i->i", &b);
    let (got, _) = compute(&asg, &b, &[&s]);
    for (i, &v) in vals.iter().enumerate() {
        let w = nearest_in(v as f32 as f64 * 2.0, &f8_t);
        assert!(
            (got[0][i].is_nan() && w.is_nan()) || got[0][i] == w,
            "fp8 of {v}+{v}"
        );
    }
}

#[test]
fn floating_only_ops_reject_bitwise_operations_before_running() {
    let b = Bindings::empty();
    let x = input("x", &[2], Prec::Single, &[1.0, 2.0]);
    let y = input("y", &[2], Prec::Int32, &[1.0, 2.0]);
    let o = output("o", &[2], Prec::Int32);
    let asg = binop(&o, Binop::Arg2, false, Binop::BitAnd, &y, &x, "i,i->i", &b);
    let backend = arrayjit::backend::CcBackend::new();
    let e = build(&backend, "bad", &b, &asg).map(|_| ()).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("operation bit_and needs integer precisions, but tensor x is single"),
        "{e:?}"
    );
    let mut mem = Memory::new();
    assert!(matches!(
        interp::run_assignments(&asg, &[], &mut mem),
        Err(arrayjit::Error::IntegerOnlyOp { .. })
    ));
    // Unknown precision names list the known ones.
    let e = Prec::parse("int8").unwrap_err().to_string();
    assert_eq!(
        e,
        "unknown precision \"int8\" (known: byte, uint16, int32, uint32, int64, uint64, fp8, \
         half, bfloat16, single, double)"
    );
    // Unknown operation names too.
    let e = Binop::parse("bitand").unwrap_err().to_string();
    assert!(
        e.starts_with("unknown operation \"bitand\" (known: add, sub,") && e.contains("bit_and"),
        "{e}"
    );
    assert_eq!(Unop::parse("sigmoid").unwrap(), Unop::Sigmoid);
    // Typed host access checks the element type.
    let h = Tnode::hosted(&["h"], &[2], Prec::Int64).unwrap();
    h.with_host(|a| {
        assert!(a.as_slice::<i64>().is_ok());
        assert!(matches!(
            a.as_slice::<f32>(),
            Err(arrayjit::Error::PrecisionMismatch { .. })
        ));
    });
}

fn run_cli(prog: &str, extra_env: &[(&str, &str)]) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.json");
    std::fs::write(&p, prog).unwrap();
    let mut c = Command::new(env!("CARGO_BIN_EXE_arrayjit"));
    c.arg("run").arg(&p);
    for (k, v) in extra_env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// bfloat16 and fp8 round once, to nearest even, from a double (SPEC 9.1: the conversions of
/// ml_dtypes) and from the decimal text of a program's `values`: 1.0039062500000002 lies just
/// above the midpoint 1.00390625 of the bfloat16s 1 and 1.0078125, so it rounds up (through
/// a float it became the midpoint, which ties down to 1); 1.125 + 2^-30 rounds up to the fp8
/// 1.25. A decimal whose nearest double is the midpoint itself is compared with the midpoint
/// (1.00390625000000000000001 rounds up, 1.00390624999999999999999 down). Found by
/// scripts/conformance.py.
#[test]
fn bf16_and_fp8_round_once_from_a_double_or_a_decimal() {
    let above = 1.0039062500000002;
    assert_eq!(Prec::Bfloat16.round(above), 1.0078125);
    assert_eq!(Prec::Bfloat16.round(-above), -1.0078125);
    assert_eq!(Prec::Fp8.round(1.125 + 2f64.powi(-30)), 1.25);
    assert_eq!(Prec::Fp8.round(1.125), 1.0);
    assert_eq!(Prec::Bfloat16.round(1.00390625), 1.0);
    // a host array of a library user
    let h = input(
        "h",
        &[2],
        Prec::Bfloat16,
        &[above, 1.00390625 - 2f64.powi(-40)],
    );
    assert_eq!(h.with_host(|a| a.get(0)).unwrap(), 1.0078125);
    assert_eq!(h.with_host(|a| a.get(1)).unwrap(), 1.0);
    // the CLI's values
    let prog = r#"{"tensors": [
        {"name": "b", "dims": [4], "prec": "bfloat16", "init": {"values":
          [1.00390625000001, 1.0039062500000002, 1.00390625000000000000001, 1.00390624999999999999999]}},
        {"name": "f", "dims": [3], "prec": "fp8", "init": {"values":
          [1.12500000000001, 1.12500000000000000000001, 1.1249999999999999999999]}}],
      "print": ["b", "f"]}"#;
    let (ok, out, err) = run_cli(prog, &[]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["b"]["values"].to_string(),
        "[1.0078125,1.0078125,1.0078125,1]"
    );
    assert_eq!(v["f"]["values"].to_string(), "[1.25,1.25,1]");
}

const BIG: &str = r#"{
  "tensors": [
    {"name": "a", "dims": [4], "prec": "int64", "init": {"values": [9007199254740993, -9223372036854775808, 9223372036854775807, -7]}},
    {"name": "u", "dims": [2], "prec": "uint64", "init": {"values": [18446744073709551615, 18446744073709551616]}},
    {"name": "r", "dims": [4], "prec": "int64", "init": "range"},
    {"name": "b", "dims": [4], "prec": "int64"}
  ],
  "routines": [{"name": "r", "code": [{"assign": "b", "op": "add", "args": ["a", "r"]}]}],
  "run": [{"routine": "r"}],
  "print": ["a", "u", "b"]
}"#;

#[test]
fn int64_above_2_pow_53_round_trips_through_the_cli() {
    let (ok, out, err) = run_cli(BIG, &[]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let text = |k: &str| v[k]["values"].to_string();
    assert_eq!(
        text("a"),
        "[9007199254740993,-9223372036854775808,9223372036854775807,-7]"
    );
    // 2^64 wraps to 0
    assert_eq!(text("u"), "[18446744073709551615,0]");
    // b[i] = a[i] + i, wrapping
    assert_eq!(
        text("b"),
        format!(
            "[9007199254740993,{},{},-4]",
            i64::MIN + 1,
            i64::MAX.wrapping_add(2)
        )
    );
    // The interpreter agrees exactly.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.json");
    std::fs::write(&p, BIG).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_arrayjit"))
        .args(["run", "--interpret"])
        .arg(&p)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), out);
}

#[test]
fn unknown_precision_and_operation_names_are_listed() {
    let (ok, _, err) = run_cli(
        r#"{"tensors": [{"name": "a", "dims": [1], "prec": "int8"}], "routines": [], "run": [], "print": []}"#,
        &[],
    );
    assert!(!ok);
    assert!(err.contains("int8"), "{err}");
    assert!(
        err.contains("\"uint16\"") && err.contains("\"bfloat16\"") && err.contains("\"fp8\""),
        "{err}"
    );
    let (ok, _, err) = run_cli(
        r#"{"tensors": [{"name": "a", "dims": [1], "prec": "int32"}],
            "routines": [{"name": "r", "code": [{"assign": "a", "op": "bitand", "args": ["a", "a"]}]}],
            "run": [], "print": []}"#,
        &[],
    );
    assert!(!ok);
    assert!(
        err.contains("bitand") && err.contains("bit_and") && err.contains("shr"),
        "{err}"
    );
    let (ok, _, err) = run_cli(
        r#"{"tensors": [{"name": "a", "dims": [1], "prec": "half"}],
            "routines": [{"name": "r", "code": [{"assign": "a", "op": "shl", "args": ["a", "a"]}]}],
            "run": [{"routine": "r"}], "print": []}"#,
        &[],
    );
    assert!(!ok);
    assert!(
        err.contains("operation shl needs integer precisions, but tensor a is half"),
        "{err}"
    );
}

/// An integer-heavy program compiled with UBSan (trapping on any finding): every edge case of
/// division, modulo, shifts, powers and float-to-integer stores runs without undefined
/// behaviour, and the values are still right.
#[test]
fn integer_edge_cases_have_no_undefined_behaviour() {
    let prog = r#"{
  "tensors": [
    {"name": "a", "dims": [6], "prec": "int64", "init": {"values": [-9223372036854775808, -1, 0, 9223372036854775807, 7, -7]}},
    {"name": "b", "dims": [6], "prec": "int64", "init": {"values": [-1, 0, -9223372036854775808, 64, -1, 200]}},
    {"name": "c", "dims": [6], "prec": "int32", "init": {"values": [-2147483648, -1, 0, 2147483647, 33, -33]}},
    {"name": "f", "dims": [6], "prec": "double", "init": {"values": ["nan", "inf", "-inf", 1e300, -1e19, 4294967296.5]}},
    {"name": "d", "dims": [6], "prec": "int64"},
    {"name": "m", "dims": [6], "prec": "int64"},
    {"name": "s", "dims": [6], "prec": "int64"},
    {"name": "t", "dims": [6], "prec": "int32"},
    {"name": "p", "dims": [6], "prec": "int64"},
    {"name": "q", "dims": [6], "prec": "int32"},
    {"name": "n", "dims": [6], "prec": "int64"},
    {"name": "x", "dims": [6], "prec": "uint32"}
  ],
  "routines": [{"name": "r", "code": [
    {"assign": "d", "op": "div", "args": ["a", "b"]},
    {"assign": "m", "op": "mod", "args": ["a", "b"]},
    {"assign": "s", "op": "shl", "args": ["a", "b"]},
    {"assign": "t", "op": "shr", "args": ["c", "b"]},
    {"assign": "p", "op": "pow", "args": ["a", "b"]},
    {"assign": "q", "op": "mul", "args": ["c", "c"]},
    {"assign": "n", "op": "neg", "args": ["a"]},
    {"assign": "x", "op": "identity", "args": ["f"]}
  ]}],
  "run": [{"routine": "r"}],
  "print": ["d", "m", "s", "t", "p", "q", "n", "x"]
}"#;
    let flags = "-fsanitize=undefined,float-cast-overflow -fsanitize-undefined-trap-on-error";
    let (ok, out, err) = run_cli(prog, &[("ARRAYJIT_CFLAGS", flags), ("ARRAYJIT_CACHE", "0")]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let text = |k: &str| v[k]["values"].to_string();
    let (a, b) = (
        [i64::MIN, -1, 0, i64::MAX, 7, -7],
        [-1i64, 0, i64::MIN, 64, -1, 200],
    );
    let list = |f: &dyn Fn(i64, i64) -> i128| -> String {
        let v: Vec<String> = a
            .iter()
            .zip(&b)
            .map(|(&p, &q)| f(p, q).to_string())
            .collect();
        format!("[{}]", v.join(","))
    };
    assert_eq!(
        text("d"),
        list(&|p, q| if q == 0 { 0 } else { p.wrapping_div(q) as i128 })
    );
    assert_eq!(
        text("m"),
        list(&|p, q| if q == 0 { 0 } else { p.wrapping_rem(q) as i128 })
    );
    assert_eq!(
        text("s"),
        list(&|p, q| p.wrapping_shl((q as u32) % 64) as i128)
    );
    let c = [i32::MIN, -1, 0, i32::MAX, 33, -33];
    let t: Vec<String> = c
        .iter()
        .zip(&b)
        .map(|(&p, &q)| (p >> ((q as u32) % 32)).to_string())
        .collect();
    assert_eq!(text("t"), format!("[{}]", t.join(",")));
    let q: Vec<String> = c.iter().map(|&p| p.wrapping_mul(p).to_string()).collect();
    assert_eq!(text("q"), format!("[{}]", q.join(",")));
    assert_eq!(text("n"), list(&|p, _| p.wrapping_neg() as i128));
    // pow: MIN^-1 = 0, (-1)^0 = 1, 0^MIN = 0, MAX^64 wraps, 7^-1 = 0, (-7)^200 wraps
    let p: Vec<String> = [
        0,
        1,
        0,
        i64::MAX.wrapping_pow(64),
        0,
        (-7i64).wrapping_pow(200),
    ]
    .iter()
    .map(|v| v.to_string())
    .collect();
    assert_eq!(text("p"), format!("[{}]", p.join(",")));
    // NaN, inf -> 0; 1e300 mod 2^32 (exact: 1e300 is a multiple of 2^32); -1e19 wraps
    let x1e19 = (-1e19f64 as i128).rem_euclid(1 << 32);
    assert_eq!(text("x"), format!("[0,0,0,0,{x1e19},0]"));
}

/// A small differential fuzzer for integer programs: random chains of operations over
/// random integer precisions, with edge values (0, ±1, MIN, MAX of each type, oversized
/// shift counts, zero divisors), through an inlined (virtual) intermediate, elementwise and
/// reducing; compiled C and the interpreter must agree exactly (integer arithmetic has no
/// rounding, so there is nothing to tolerate).
#[test]
fn random_integer_programs_agree_compiled_and_interpreted() {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        state >> 33
    };
    let precs = [
        Prec::Byte,
        Prec::Uint16,
        Prec::Int32,
        Prec::Uint32,
        Prec::Int64,
        Prec::Uint64,
    ];
    let binops: Vec<Binop> = Binop::ALL.to_vec();
    let unops: Vec<Unop> = [
        Unop::Identity,
        Unop::Relu,
        Unop::Neg,
        Unop::Abs,
        Unop::Not,
        Unop::Satur01,
        Unop::Trunc,
        Unop::Sqrt,
        Unop::Recip,
    ]
    .to_vec();
    let accums = [
        Binop::Add,
        Binop::Mul,
        Binop::Max,
        Binop::Min,
        Binop::BitXor,
    ];
    let b = Bindings::empty();
    for case in 0..40 {
        let mut pick = |n: usize| (next() as usize) % n;
        let edge = |p: Prec, k: usize, r: u64| -> i128 {
            let bits = p.int_bits().unwrap();
            let (min, max) = if p.is_signed_integer() {
                (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
            } else {
                (0, (1i128 << bits) - 1)
            };
            match k {
                0 => 0,
                1 => 1,
                2 => -1,
                3 => min,
                4 => max,
                5 => i128::from(bits) + 1,
                _ => i128::from(r as i64),
            }
        };
        let mk = |name: &str, pick: &mut dyn FnMut(usize) -> usize| {
            let p = precs[pick(precs.len())];
            let vals: Vec<i128> = (0..8)
                .map(|_| {
                    let k = pick(9);
                    let r = ((pick(1 << 30) as u64) << 34) ^ (pick(1 << 30) as u64);
                    edge(p, k, r)
                })
                .collect();
            int_input(name, p, &vals)
        };
        let x = mk("x", &mut pick);
        let y = mk("y", &mut pick);
        let z = mk("z", &mut pick);
        let tp = precs[pick(precs.len())];
        let t = temp("t", &[8], tp);
        let op1 = binops[pick(binops.len())];
        let first = elementwise(&t, op1, &x, &y);
        let out_p = precs[pick(precs.len())];
        let (out, second) = if pick(2) == 0 {
            let o = output("o", &[8], out_p);
            let s = if pick(2) == 0 {
                elementwise(&o, binops[pick(binops.len())], &t, &z)
            } else {
                unop(
                    &o,
                    Binop::Arg2,
                    false,
                    unops[pick(unops.len())],
                    &t,
                    "i->i",
                    &b,
                )
            };
            (o, s)
        } else {
            let o = output("o", &[1], out_p);
            let acc = accums[pick(accums.len())];
            let op2 = binops[pick(binops.len())];
            (o.clone(), binop(&o, acc, true, op2, &t, &z, "i,i->0", &b))
        };
        let a = Assignments::seq(vec![first, second]);
        let (got, src) = {
            let backend = arrayjit::backend::CcBackend::new();
            let (r, src) = build(&backend, "fz", &b, &a).unwrap();
            run_and_read(&backend, &r, &[&out]);
            (ints_of(&out), src)
        };
        let mut mem = Memory::new();
        mem.load_from_hosts([&x, &y, &z]);
        interp::run_assignments(&a, &[], &mut mem).unwrap();
        let want = mem.get_int(&out).unwrap();
        assert_eq!(got, want, "case {case}: {a:?}\n{src}");
    }
}

/// The example program `examples/programs/integers.json`, against values computed here.
#[test]
fn example_integers_program() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/programs/integers.json");
    let run = |extra: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_arrayjit"))
            .arg("run")
            .args(extra)
            .arg(&path)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let out = run(&[]);
    assert_eq!(run(&["--interpret"]), out);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let text = |k: &str| v[k]["values"].to_string();
    let golden = 11_400_714_819_323_198_485u64;
    let hash: Vec<String> = [1u64, 2, 12_345_678_901_234_567_890, u64::MAX]
        .iter()
        .map(|&id| ((id ^ (id >> 33)).wrapping_mul(golden)).to_string())
        .collect();
    assert_eq!(text("hash"), format!("[{}]", hash.join(",")));
    let x = [-2.75f64, 0.1, 300.9, 1e10, f64::NAN];
    let wrap_to = |v: f64, m: i128, signed: bool| -> i128 {
        if !v.is_finite() {
            return 0;
        }
        let r = (v.trunc() as i128).rem_euclid(m);
        if signed && r >= m / 2 {
            r - m
        } else {
            r
        }
    };
    let list = |f: &dyn Fn(f64) -> i128| {
        let v: Vec<String> = x.iter().map(|&v| f(v).to_string()).collect();
        format!("[{}]", v.join(","))
    };
    assert_eq!(text("q8"), list(&|v| wrap_to(v, 256, false)));
    assert_eq!(text("q32"), list(&|v| wrap_to(v, 1 << 32, true)));
    assert_eq!(text("big"), "[0,0,0,0,1]");
    // bf16 / fp8: printed exactly: the number is the value that round-to-nearest-even gives
    // for x.
    for (k, table) in [("bf", bf16_values()), ("f8", fp8_values())] {
        for (i, &xi) in x.iter().enumerate() {
            let want = nearest_in(xi, &table);
            let got = &v[k]["values"][i];
            let got = match got.as_str() {
                Some("nan") => f64::NAN,
                Some("inf") => f64::INFINITY,
                Some(s) => panic!("{k}[{i}]: {s}"),
                None => got.as_f64().unwrap(),
            };
            assert!(
                (got.is_nan() && want.is_nan()) || got == want,
                "{k}[{i}]: {got} vs {want}"
            );
        }
    }
    // the fp8 values, by hand: -2.75 ties to -3 (even), 300.9 -> 320, 1e10 -> inf
    assert_eq!(nearest_in(-2.75, &fp8_values()), -3.0);
    assert_eq!(nearest_in(300.9, &fp8_values()), 320.0);
}
