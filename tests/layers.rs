//! The nn layers of the wider language (convolution, max-pooling, softmax cross-entropy over
//! integer labels) and typed host access, checked against plain loops written from their
//! definitions.

mod common;

use arrayjit::ir::{Bindings, Binop, Prec, Tnode, Unop};
use arrayjit::nn::{self, SoftmaxScratch, Window};
use common::*;

/// Deterministic pseudo-random values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

fn close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

#[test]
fn conv2d_and_its_gradients_match_plain_loops() {
    // x [2,5,6,3], w [3,3,3,4], stride 2, padding 1 -> y [2,3,3,4].
    let (b, h, w_, c, d, k, s, p) = (
        2usize, 5usize, 6usize, 3usize, 4usize, 3usize, 2usize, 1usize,
    );
    let (ho, wo) = ((h + 2 * p - k) / s + 1, (w_ + 2 * p - k) / s + 1);
    let xv = values(b * h * w_ * c, 1);
    let wv = values(k * k * c * d, 2);
    let dyv = values(b * ho * wo * d, 3);
    let x = input("x", &[b, h, w_, c], Prec::Single, &xv);
    let w = input("w", &[k, k, c, d], Prec::Single, &wv);
    let dy = input("dy", &[b, ho, wo, d], Prec::Single, &dyv);
    let y = output("y", &[b, ho, wo, d], Prec::Single);
    let gw = output("gw", &[k, k, c, d], Prec::Single);
    let dx = output("dx", &[b, h, w_, c], Prec::Single);
    let win = Window {
        stride: s,
        padding: p,
    };
    let code = arrayjit::ir::Assignments::seq([
        nn::conv2d(&y, &x, &w, win).unwrap(),
        nn::conv2d_weight_grad(&gw, &x, &dy, win).unwrap(),
        nn::conv2d_input_grad(&dx, &dy, &w, win).unwrap(),
    ]);
    let (got, _) = compute(&code, &Bindings::empty(), &[&y, &gw, &dx]);
    let xi = |bb: usize, hh: usize, ww: usize, cc: usize| ((bb * h + hh) * w_ + ww) * c + cc;
    let wi = |i: usize, j: usize, cc: usize, dd: usize| ((i * k + j) * c + cc) * d + dd;
    let yi = |bb: usize, hh: usize, ww: usize, dd: usize| ((bb * ho + hh) * wo + ww) * d + dd;
    let (mut want_y, mut want_gw, mut want_dx) = (
        vec![0.0; b * ho * wo * d],
        vec![0.0; k * k * c * d],
        vec![0.0; b * h * w_ * c],
    );
    for bb in 0..b {
        for oh in 0..ho {
            for ow in 0..wo {
                for i in 0..k {
                    for j in 0..k {
                        // The input pixel this kernel tap reads; padding is skipped.
                        let (ih, iw) = (
                            (s * oh + i) as isize - p as isize,
                            (s * ow + j) as isize - p as isize,
                        );
                        if ih < 0 || iw < 0 || ih >= h as isize || iw >= w_ as isize {
                            continue;
                        }
                        let (ih, iw) = (ih as usize, iw as usize);
                        for cc in 0..c {
                            for dd in 0..d {
                                want_y[yi(bb, oh, ow, dd)] +=
                                    xv[xi(bb, ih, iw, cc)] * wv[wi(i, j, cc, dd)];
                                want_gw[wi(i, j, cc, dd)] +=
                                    xv[xi(bb, ih, iw, cc)] * dyv[yi(bb, oh, ow, dd)];
                                want_dx[xi(bb, ih, iw, cc)] +=
                                    dyv[yi(bb, oh, ow, dd)] * wv[wi(i, j, cc, dd)];
                            }
                        }
                    }
                }
            }
        }
    }
    close(&got[0], &want_y, "y");
    close(&got[1], &want_gw, "gw");
    close(&got[2], &want_dx, "dx");
}

#[test]
fn max_pool_and_its_gradient_match_plain_loops() {
    let (b, h, w_, c) = (2usize, 4usize, 6usize, 3usize);
    let xv = values(b * h * w_ * c, 4);
    let dyv = values(b * (h / 2) * (w_ / 2) * c, 5);
    let x = input("x", &[b, h, w_, c], Prec::Single, &xv);
    let dy = input("dy", &[b, h / 2, w_ / 2, c], Prec::Single, &dyv);
    let y = output("y", &[b, h / 2, w_ / 2, c], Prec::Single);
    let dx = output("dx", &[b, h, w_, c], Prec::Single);
    let up = temp("up", &[b, h, w_, c], Prec::Single);
    let code = arrayjit::ir::Assignments::seq([
        nn::max_pool2d(&y, &x, 2).unwrap(),
        nn::max_pool2d_backward(&dx, &x, &y, &dy, &up, 2).unwrap(),
    ]);
    let (got, _) = compute(&code, &Bindings::empty(), &[&y, &dx]);
    let xi = |bb: usize, hh: usize, ww: usize, cc: usize| ((bb * h + hh) * w_ + ww) * c + cc;
    let mut want_y = vec![];
    let mut want_dx = vec![0.0; xv.len()];
    for bb in 0..b {
        for oh in 0..h / 2 {
            for ow in 0..w_ / 2 {
                for cc in 0..c {
                    let cells = [(0, 0), (0, 1), (1, 0), (1, 1)]
                        .map(|(i, j)| xi(bb, 2 * oh + i, 2 * ow + j, cc));
                    let m = cells
                        .iter()
                        .map(|&q| xv[q])
                        .fold(f64::NEG_INFINITY, f64::max);
                    want_y.push(m);
                    let g = dyv[((bb * (h / 2) + oh) * (w_ / 2) + ow) * c + cc];
                    for q in cells {
                        if xv[q] == m {
                            want_dx[q] = g;
                        }
                    }
                }
            }
        }
    }
    close(&got[0], &want_y, "y");
    close(&got[1], &want_dx, "dx");
}

#[test]
fn softmax_cross_entropy_over_int32_labels_matches_plain_loops() {
    let (b, k) = (5usize, 4usize);
    let zv: Vec<f64> = values(b * k, 6).iter().map(|v| 3.0 * v).collect();
    let labels_v = [3i32, 0, 2, 1, 3];
    let z = input("z", &[b, k], Prec::Single, &zv);
    let labels = output("labels", &[b], Prec::Int32);
    labels.set_host_slice(&labels_v).unwrap();
    let classes = output("classes", &[k], Prec::Int32);
    classes.set_host_slice(&[0i32, 1, 2, 3]).unwrap();
    let loss = output("loss", &[1], Prec::Single);
    let dz = output("dz", &[b, k], Prec::Single);
    let scratch = SoftmaxScratch::new("xent", b, k, Prec::Single).unwrap();
    let total = 10; // this is one device's half of a batch of 10
    let code =
        nn::softmax_cross_entropy(&loss, &dz, &z, &labels, &classes, &scratch, total).unwrap();
    let (got, _) = compute(&code, &Bindings::empty(), &[&loss, &dz]);
    let mut want_loss = 0.0;
    let mut want_dz = vec![];
    for r in 0..b {
        let row = &zv[r * k..(r + 1) * k];
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - m).exp()).sum();
        want_loss += (sum.ln() + m - row[labels_v[r] as usize]) / total as f64;
        for (q, v) in row.iter().enumerate() {
            let onehot = if q == labels_v[r] as usize { 1.0 } else { 0.0 };
            want_dz.push(((v - m).exp() / sum - onehot) / total as f64);
        }
    }
    close(&got[0], &[want_loss], "loss");
    close(&got[1], &want_dz, "dz");
    // A zero sample count is refused.
    let e = nn::softmax_cross_entropy(&loss, &dz, &z, &labels, &classes, &scratch, 0)
        .err()
        .unwrap();
    assert!(e.to_string().contains("sample count is 0"), "{e}");
}

#[test]
fn generic_builders_reach_every_operation() {
    let a = input("a", &[4], Prec::Int32, &[7.0, -7.0, 12.0, 0.0]);
    let bb = input("b", &[4], Prec::Int32, &[2.0, 2.0, 5.0, 3.0]);
    let m = output("m", &[4], Prec::Int32);
    let sh = output("sh", &[4], Prec::Int32);
    let r = output("r", &[4], Prec::Single);
    let f = input("f", &[4], Prec::Single, &[4.0, 16.0, 0.25, 1.0]);
    let mx = output("mx", &[1], Prec::Int32);
    let code = arrayjit::ir::Assignments::seq([
        nn::binary(&m, Binop::Mod, &a, &bb, None).unwrap(),
        nn::binary(&sh, Binop::Shl, &a, &bb, None).unwrap(),
        nn::unary(&r, Unop::Rsqrt, &f).unwrap(),
        nn::reduce(&mx, Binop::Max, &a, "i->z").unwrap(),
    ]);
    let (got, _) = compute(&code, &Bindings::empty(), &[&m, &sh, &r, &mx]);
    assert_eq!(got[0], vec![1.0, -1.0, 2.0, 0.0]); // C's %: the sign of the dividend
    assert_eq!(got[1], vec![28.0, -28.0, 384.0, 0.0]);
    assert_eq!(got[2], vec![0.5, 0.25, 2.0, 1.0]);
    assert_eq!(got[3], vec![12.0]);
    // Bit operations on a floating result are refused before any code runs.
    let bad = nn::binary(&r, Binop::BitAnd, &f, &f, None).unwrap();
    let backend = arrayjit::backend::CcBackend::new();
    let e = build(&backend, "bad", &Bindings::empty(), &bad)
        .err()
        .unwrap();
    assert!(e.to_string().contains("bit_and"), "{e}");
}

#[test]
fn typed_host_access_is_exact_and_checks_the_precision() {
    let t = Tnode::hosted(&["ids"], &[3], Prec::Int64).unwrap();
    let big = [i64::MIN, (1i64 << 53) + 1, i64::MAX];
    t.set_host_slice(&big).unwrap();
    assert_eq!(t.host_to_vec::<i64>().unwrap(), big.to_vec());
    let e = t.host_to_vec::<i32>().err().unwrap();
    assert!(
        e.to_string().contains("int32") && e.to_string().contains("int64"),
        "{e}"
    );
    let e = t.set_host_slice(&[1.0f32, 2.0, 3.0]).err().unwrap();
    assert!(e.to_string().contains("single"), "{e}");
    let e = t.set_host_slice(&[1i64, 2]).err().unwrap();
    assert!(e.to_string().contains("3 expected, 2 given"), "{e}");
}

/// The convolutional example trains from scratch: its accuracy on held-out images is high,
/// and one device and two devices reach the same losses (the gradients are summed across
/// devices; the replicas apply the same update).
#[test]
fn the_convnet_example_learns_bars_against_crosses() {
    // Cargo builds the examples before it runs the integration tests, next to `deps/`.
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("examples").join("convnet"))
        .unwrap();
    if !bin.exists() {
        panic!(
            "{} was not built (run `cargo test`, which builds the examples)",
            bin.display()
        );
    }
    let run = |devices: &str| {
        let o = std::process::Command::new(&bin)
            .args(["--epochs", "4", "--devices", devices])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(
            o.status.success(),
            "{out}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        out
    };
    let (one, two) = (run("1"), run("2"));
    let losses = |s: &str| -> Vec<f64> {
        s.lines()
            .filter_map(|l| l.strip_prefix("epoch "))
            .map(|l| l.split_whitespace().nth(2).unwrap().parse().unwrap())
            .collect()
    };
    let (l1, l2) = (losses(&one), losses(&two));
    assert_eq!(l1.len(), 4, "{one}");
    assert!(l1[3] < l1[0] * 0.5, "the loss falls: {l1:?}");
    for (a, b) in l1.iter().zip(&l2) {
        assert!((a - b).abs() <= 1e-3, "1 device {l1:?}, 2 devices {l2:?}");
    }
    let acc: f64 = one
        .lines()
        .find_map(|l| l.strip_prefix("accuracy: "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(acc >= 0.9, "accuracy {acc}\n{one}");
}

/// bfloat16 and fp8 host data are typed too (`half::bf16` and `arrayjit::ir::Fp8`, re-exported
/// from `arrayjit::ir`): set exactly, doubled by a compiled routine, read back exactly.
#[test]
fn typed_host_access_of_the_narrow_floats() {
    use arrayjit::ir::{bf16, Fp8};
    let b = Tnode::hosted(&["b"], &[3], Prec::Bfloat16).unwrap();
    let b2 = Tnode::hosted(&["b2"], &[3], Prec::Bfloat16).unwrap();
    let f = Tnode::hosted(&["f"], &[3], Prec::Fp8).unwrap();
    let f2 = Tnode::hosted(&["f2"], &[3], Prec::Fp8).unwrap();
    // 1.5, -0.0078125 (2^-7) and the largest finite bfloat16 (0x7f7f).
    b.set_host_slice(&[
        bf16::from_f32(1.5),
        bf16::from_f32(-0.0078125),
        bf16::from_bits(0x7f7f),
    ])
    .unwrap();
    // fp8 E5M2: 0.75 = 0x3a, -3.0 = 0xc2, 57344 (the largest finite) = 0x7b.
    f.set_host_slice(&[
        Fp8::from_bits(0x3a),
        Fp8::from_f64(-3.0),
        Fp8::from_bits(0x7b),
    ])
    .unwrap();
    assert_eq!(Fp8::from_f64(-3.0).to_bits(), 0xc2);
    assert_eq!(Fp8::from_bits(0x7b).to_f64(), 57344.0);
    let code = arrayjit::ir::Assignments::seq([
        nn::binary(&b2, Binop::Add, &b, &b, None).unwrap(),
        nn::binary(&f2, Binop::Add, &f, &f, None).unwrap(),
    ]);
    compute(&code, &Bindings::empty(), &[&b2, &f2]);
    // Doubling is exact, except that twice the largest finite value overflows to +inf.
    let got: Vec<u16> = b2
        .host_to_vec::<bf16>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect();
    assert_eq!(got, [0x4040, 0xbc80, 0x7f80]);
    let got: Vec<u8> = f2
        .host_to_vec::<Fp8>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect();
    assert_eq!(got, [0x3e, 0xc6, 0x7c]); // 1.5, -6.0, +inf
                                         // A precision mismatch names both precisions.
    let e = b.host_to_vec::<f32>().err().unwrap().to_string();
    assert!(e.contains("bfloat16") && e.contains("single"), "{e}");
    let e = f.host_to_vec::<u8>().err().unwrap().to_string();
    assert!(e.contains("fp8") && e.contains("byte"), "{e}");
}
