//! A small convolutional network trained data-parallel on synthetic images: bars against
//! crosses.
//!
//! ```text
//! cargo run --release --example convnet [-- --devices N] [--epochs N] [--batch N] [--seed N]
//! ```
//!
//! Each 8×8 image holds one bar (class 0: a horizontal or vertical line of 3 to 5 pixels)
//! or one cross (class 1: a horizontal and a vertical line through the same point), at a
//! random place, with noise. The network: a 3×3 convolution (1 → 8 channels, padding 1) and
//! its bias, ReLU, 2×2 max-pooling, a dense layer to 2 logits, and softmax cross-entropy
//! against `int32` labels. Every step, each of N devices computes the gradients of its share
//! of the batch; the gradients are summed across devices (`all_reduce`) and every device
//! applies the same SGD update, so the replicas stay identical. It prints the loss per epoch
//! and the accuracy on a held-out set, on its last line:
//! `accuracy: A devices: N samples/s: S`.

use arrayjit::ir::{Assignments, Bindings, Binop, InitOp, Prec, Tnode};
use arrayjit::nn::{self, SoftmaxScratch, Window};
use arrayjit::{Jit, JitConfig};
use std::time::Instant;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

macro_rules! bail {
    ($($t:tt)*) => {
        return Err(format!($($t)*).into())
    };
}

fn num<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T> {
    let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
    v.parse()
        .map_err(|_| format!("{flag}: {v:?} is not a valid number").into())
}

const SIDE: usize = 8;
const CHANNELS: usize = 8;
const CLASSES: usize = 2;

struct Args {
    devices: Option<usize>,
    epochs: usize,
    batch: usize,
    train: usize,
    seed: u64,
    lr: f64,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        devices: None,
        epochs: 8,
        batch: 64,
        train: 4096,
        seed: 1,
        lr: 0.1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--devices" => a.devices = Some(num(&flag, it.next())?),
            "--epochs" => a.epochs = num(&flag, it.next())?,
            "--batch" => a.batch = num(&flag, it.next())?,
            "--train" => a.train = num(&flag, it.next())?,
            "--seed" => a.seed = num(&flag, it.next())?,
            "--lr" => a.lr = num(&flag, it.next())?,
            "-h" | "--help" => {
                println!(
                    "usage: convnet [--devices N] [--epochs N] [--batch N] [--train N] \
                     [--seed N] [--lr X]"
                );
                std::process::exit(0);
            }
            _ => bail!("unknown flag {flag} (see --help)"),
        }
    }
    if a.batch == 0 || a.epochs == 0 || a.train < a.batch {
        bail!("--batch and --epochs must be positive and --train at least --batch");
    }
    Ok(a)
}

/// SplitMix64: a small deterministic generator for the images and the initial weights.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `n` images (row-major `[n, 8, 8, 1]`) and their labels.
fn images(n: usize, rng: &mut Rng) -> (Vec<f64>, Vec<i32>) {
    let mut x = vec![0.0; n * SIDE * SIDE];
    let mut y = vec![0; n];
    for s in 0..n {
        let img = &mut x[s * SIDE * SIDE..(s + 1) * SIDE * SIDE];
        for p in img.iter_mut() {
            *p = 0.2 * rng.uniform();
        }
        let label = rng.below(2);
        let (r, c) = (1 + rng.below(SIDE - 2), 1 + rng.below(SIDE - 2));
        let len = 3 + rng.below(3);
        let mut line = |horizontal: bool| {
            for t in 0..len {
                let off = t as isize - (len / 2) as isize;
                let (rr, cc) = if horizontal {
                    (r as isize, c as isize + off)
                } else {
                    (r as isize + off, c as isize)
                };
                if (0..SIDE as isize).contains(&rr) && (0..SIDE as isize).contains(&cc) {
                    img[rr as usize * SIDE + cc as usize] = 1.0;
                }
            }
        };
        if label == 0 {
            line(rng.below(2) == 0);
        } else {
            line(true);
            line(false);
        }
        y[s] = label as i32;
    }
    (x, y)
}

/// The network's parameters, gradients and the routines of one device's step.
struct Net {
    params: Vec<Tnode>,
    grads: Vec<Tnode>,
    grad_step: Assignments,
    update: Assignments,
    x: Tnode,
    labels: Tnode,
    logits: Tnode,
    loss: Tnode,
    classes: Tnode,
}

fn build(per_device: usize, batch: usize, lr: f64, rng: &mut Rng) -> Result<Net> {
    let f = Prec::Single;
    let b = per_device;
    let half = SIDE / 2;
    let t = |name: &str, dims: &[usize]| Tnode::new(&[name], dims, f);
    let hosted = |name: &str, dims: &[usize], prec: Prec| Tnode::hosted(&[name], dims, prec);
    let init = |name: &str, dims: &[usize], scale: f64, rng: &mut Rng| -> Result<Tnode> {
        let n: usize = dims.iter().product();
        let v: Vec<f64> = (0..n)
            .map(|_| scale * (2.0 * rng.uniform() - 1.0))
            .collect();
        Ok(Tnode::with_init(
            &[name],
            dims,
            f,
            &InitOp::ConstantFill {
                values: v,
                strict: true,
            },
        )?)
    };
    let w1 = init("w1", &[3, 3, 1, CHANNELS], 0.5, rng)?;
    let b1 = init("b1", &[CHANNELS], 0.0, rng)?;
    let w2 = init("w2", &[half, half, CHANNELS, CLASSES], 0.2, rng)?;
    let b2 = init("b2", &[CLASSES], 0.0, rng)?;
    let x = hosted("x", &[b, SIDE, SIDE, 1], f)?;
    let labels = hosted("labels", &[b], Prec::Int32)?;
    let classes = Tnode::with_init(
        &["classes"],
        &[CLASSES],
        Prec::Int32,
        &InitOp::RangeOverOffsets,
    )?;
    let (z1, r1) = (
        t("z1", &[b, SIDE, SIDE, CHANNELS])?,
        t("r1", &[b, SIDE, SIDE, CHANNELS])?,
    );
    let p1 = t("p1", &[b, half, half, CHANNELS])?;
    let logits = hosted("logits", &[b, CLASSES], f)?;
    let loss = hosted("loss", &[1], f)?;
    let dz2 = t("dz2", &[b, CLASSES])?;
    let dp1 = t("dp1", &[b, half, half, CHANNELS])?;
    let (dr1, up) = (
        t("dr1", &[b, SIDE, SIDE, CHANNELS])?,
        t("up", &[b, SIDE, SIDE, CHANNELS])?,
    );
    let dz1 = t("dz1", &[b, SIDE, SIDE, CHANNELS])?;
    let gw1 = hosted("gw1", &[3, 3, 1, CHANNELS], f)?;
    let gb1 = hosted("gb1", &[CHANNELS], f)?;
    let gw2 = hosted("gw2", &[half, half, CHANNELS, CLASSES], f)?;
    let gb2 = hosted("gb2", &[CLASSES], f)?;
    let scratch = SoftmaxScratch::new("xent", b, CLASSES, f)?;
    let same = Window {
        stride: 1,
        padding: 1,
    };
    let none = Bindings::empty();
    let grad_step = Assignments::seq([
        Assignments::block(
            "forward",
            Assignments::seq([
                nn::conv2d(&z1, &x, &w1, same)?,
                nn::binary(&z1, Binop::Add, &z1, &b1, Some("bhvd,d->bhvd"))?,
                nn::relu(&r1, &z1)?,
                nn::max_pool2d(&p1, &r1, 2)?,
                nn::matmul(&logits, &p1, &w2, "bhvc,hvck->bk", &none)?,
                nn::binary(&logits, Binop::Add, &logits, &b2, Some("bk,k->bk"))?,
            ]),
        ),
        Assignments::block(
            "loss and backward",
            Assignments::seq([
                nn::softmax_cross_entropy(
                    &loss, &dz2, &logits, &labels, &classes, &scratch, batch,
                )?,
                nn::matmul(&gw2, &p1, &dz2, "bhvc,bk->hvck", &none)?,
                nn::sum(&gb2, &dz2, "bk->k", &none)?,
                nn::matmul(&dp1, &dz2, &w2, "bk,hvck->bhvc", &none)?,
                nn::max_pool2d_backward(&dr1, &r1, &p1, &dp1, &up, 2)?,
                nn::relu_backward(&dz1, &r1, &dr1)?,
                nn::conv2d_weight_grad(&gw1, &x, &dz1, same)?,
                nn::sum(&gb1, &dz1, "bhvd->d", &none)?,
            ]),
        ),
    ]);
    let params = vec![w1, b1, w2, b2];
    let grads = vec![gw1, gb1, gw2, gb2];
    let (rate, rate_fill) = nn::constant("lr", lr, f)?;
    let (decay, decay_fill) = nn::constant("lr_wd", 0.0, f)?;
    let mut update = vec![rate_fill, decay_fill];
    for (p, g) in params.iter().zip(&grads) {
        update.push(nn::sgd_step(p, g, &rate, &decay)?);
    }
    Ok(Net {
        params,
        grads,
        grad_step,
        update: Assignments::seq(update),
        x,
        labels,
        logits,
        loss,
        classes,
    })
}

/// The predicted class of each row of logits.
fn argmax_rows(logits: &[f64]) -> Vec<i32> {
    logits
        .chunks(CLASSES)
        .map(|row| {
            let mut best = 0;
            for (k, v) in row.iter().enumerate() {
                if *v > row[best] {
                    best = k;
                }
            }
            best as i32
        })
        .collect()
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let jit = Jit::new(JitConfig::from_env()?)?;
    let devices = match args.devices {
        Some(n) => n,
        None => jit.suggested_devices()?.clamp(1, 2),
    };
    if devices == 0 || args.batch % devices != 0 {
        bail!(
            "--batch {} must split evenly over {devices} devices",
            args.batch
        );
    }
    let per = args.batch / devices;
    let mut rng = Rng(args.seed);
    let (train_x, train_y) = images(args.train, &mut rng);
    let test_n = 1024 - 1024 % per;
    let (test_x, test_y) = images(test_n, &mut rng);
    let net = build(per, args.batch, args.lr, &mut rng)?;
    println!(
        "bars vs crosses: {} training images 8x8, conv 3x3x{CHANNELS} + relu + max-pool 2x2 + dense, batch {}, {} epochs, {devices} device{}",
        args.train,
        args.batch,
        args.epochs,
        if devices == 1 { "" } else { "s" }
    );
    let t0 = Instant::now();
    let none = Bindings::empty();
    let grad_code = jit.compile("convnet_grad", &none, &net.grad_step)?;
    let update_code = jit.compile("convnet_sgd", &none, &net.update)?;
    let devs = jit.devices(devices)?;
    let mut grad_routines = vec![];
    let mut update_routines = vec![];
    for d in &devs {
        let ctx = jit.context(d)?;
        let g = jit.link(&ctx, &grad_code)?;
        let u = jit.link(g.context(), &update_code)?;
        for p in net.params.iter().chain([&net.classes]) {
            jit.upload(u.context(), p)?;
        }
        grad_routines.push(g);
        update_routines.push(u);
    }
    println!(
        "compiled and linked in {:.0} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
    let ctxs: Vec<_> = update_routines
        .iter()
        .map(|u| u.context().clone())
        .collect();
    let pixels = SIDE * SIDE;
    let steps = args.train / args.batch;
    let t1 = Instant::now();
    for epoch in 0..args.epochs {
        let mut total = 0.0;
        for s in 0..steps {
            for (k, g) in grad_routines.iter().enumerate() {
                let start = s * args.batch + k * per;
                net.x
                    .set_host_values(&train_x[start * pixels..(start + per) * pixels])?;
                net.labels.set_host_slice(&train_y[start..start + per])?;
                jit.upload(g.context(), &net.x)?;
                jit.upload(g.context(), &net.labels)?;
                g.schedule()?;
            }
            jit.backend().all_reduce(&net.grads, &ctxs)?;
            for u in &update_routines {
                u.schedule()?;
            }
            // The loss of every device's share (each is already divided by the batch size).
            for (g, d) in grad_routines.iter().zip(&devs) {
                jit.download(g.context(), &net.loss)?;
                jit.sync(d)?;
                total += net.loss.host_values().ok_or("loss is not hosted")?[0];
            }
        }
        println!("epoch {epoch} loss {:.4}", total / steps as f64);
    }
    let seconds = t1.elapsed().as_secs_f64();
    // Accuracy on the held-out images, with the first device's replica.
    let g = &grad_routines[0];
    let mut correct = 0;
    for start in (0..test_n).step_by(per) {
        net.x
            .set_host_values(&test_x[start * pixels..(start + per) * pixels])?;
        net.labels.set_host_slice(&test_y[start..start + per])?;
        jit.upload(g.context(), &net.x)?;
        jit.upload(g.context(), &net.labels)?;
        g.schedule()?;
        jit.download(g.context(), &net.logits)?;
        jit.sync(&devs[0])?;
        let logits = net.logits.host_values().ok_or("logits are not hosted")?;
        correct += argmax_rows(&logits)
            .iter()
            .zip(&test_y[start..start + per])
            .filter(|(p, y)| p == y)
            .count();
    }
    println!(
        "accuracy: {:.4} devices: {devices} samples/s: {:.0}",
        correct as f64 / test_n as f64,
        (steps * args.epochs * args.batch) as f64 / seconds
    );
    Ok(())
}
