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
//! against `int32` labels. It is trained with `arrayjit::parallel`: every step, each of N
//! devices computes the gradients of its share of the batch, the gradients are summed across
//! devices and every device ends the step with the same parameters (SGD). It prints the loss
//! per epoch and the accuracy on a held-out set, on its last line:
//! `accuracy: A devices: N samples/s: S`.

use arrayjit::ir::{Assignments, Bindings, Binop, InitOp, Prec, Tnode};
use arrayjit::nn::{self, SoftmaxScratch, Window};
use arrayjit::parallel::{self, Devices, LearningRate, Model, Settings, Slice, Update};
use arrayjit::{Jit, JitConfig};

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

/// The network's parameters and gradients (plain nodes: `arrayjit::parallel` keeps their
/// values), their initial values, and the class indices the loss compares labels with.
struct Net {
    params: Vec<(Tnode, Tnode, Vec<f64>)>,
    classes: Tnode,
}

/// The forward pass of `b` images `x` (`[b, 8, 8, 1]`): its code, the logits, and the
/// activations the backward pass reads.
struct Forward {
    code: Assignments,
    logits: Tnode,
    r1: Tnode,
    p1: Tnode,
}

impl Net {
    fn new(rng: &mut Rng) -> arrayjit::Result<Net> {
        let f = Prec::Single;
        let half = SIDE / 2;
        let mut param = |name: &str, dims: &[usize], scale: f64| -> arrayjit::Result<_> {
            let n: usize = dims.iter().product();
            let v: Vec<f64> = (0..n)
                .map(|_| scale * (2.0 * rng.uniform() - 1.0))
                .collect();
            let grad = format!("g{name}");
            Ok((
                Tnode::new(&[name], dims, f)?,
                Tnode::new(&[&grad], dims, f)?,
                v,
            ))
        };
        let params = vec![
            param("w1", &[3, 3, 1, CHANNELS], 0.5)?,
            param("b1", &[CHANNELS], 0.0)?,
            param("w2", &[half, half, CHANNELS, CLASSES], 0.2)?,
            param("b2", &[CLASSES], 0.0)?,
        ];
        let classes = Tnode::with_init(
            &["classes"],
            &[CLASSES],
            Prec::Int32,
            &InitOp::RangeOverOffsets,
        )?;
        Ok(Net { params, classes })
    }

    fn p(&self, i: usize) -> &Tnode {
        &self.params[i].0
    }

    fn g(&self, i: usize) -> &Tnode {
        &self.params[i].1
    }

    fn forward(&self, x: &Tnode, b: usize, logits: Tnode) -> arrayjit::Result<Forward> {
        let t = |name: &str, dims: &[usize]| Tnode::new(&[name], dims, Prec::Single);
        let half = SIDE / 2;
        let z1 = t("z1", &[b, SIDE, SIDE, CHANNELS])?;
        let r1 = t("r1", &[b, SIDE, SIDE, CHANNELS])?;
        let p1 = t("p1", &[b, half, half, CHANNELS])?;
        let same = Window {
            stride: 1,
            padding: 1,
        };
        let none = Bindings::empty();
        let code = Assignments::block(
            "forward",
            Assignments::seq([
                nn::conv2d(&z1, x, self.p(0), same)?,
                nn::binary(&z1, Binop::Add, &z1, self.p(1), Some("bhvd,d->bhvd"))?,
                nn::relu(&r1, &z1)?,
                nn::max_pool2d(&p1, &r1, 2)?,
                nn::matmul(&logits, &p1, self.p(2), "bhvc,hvck->bk", &none)?,
                nn::binary(&logits, Binop::Add, &logits, self.p(3), Some("bk,k->bk"))?,
            ]),
        );
        Ok(Forward {
            code,
            logits,
            r1,
            p1,
        })
    }

    /// The gradient code of a slice: forward, loss (the slice's share of the batch's mean)
    /// and backward.
    fn gradient(&self, s: &Slice, loss: &Tnode) -> arrayjit::Result<Assignments> {
        let f = Prec::Single;
        let t = |name: &str, dims: &[usize]| Tnode::new(&[name], dims, f);
        let (x, labels, b) = (&s.data[0], &s.data[1], s.rows);
        let half = SIDE / 2;
        let fwd = self.forward(x, b, t("logits", &[b, CLASSES])?)?;
        let dz2 = t("dz2", &[b, CLASSES])?;
        let dp1 = t("dp1", &[b, half, half, CHANNELS])?;
        let (dr1, up) = (
            t("dr1", &[b, SIDE, SIDE, CHANNELS])?,
            t("up", &[b, SIDE, SIDE, CHANNELS])?,
        );
        let dz1 = t("dz1", &[b, SIDE, SIDE, CHANNELS])?;
        let scratch = SoftmaxScratch::new("xent", b, CLASSES, f)?;
        let same = Window {
            stride: 1,
            padding: 1,
        };
        let none = Bindings::empty();
        Ok(Assignments::seq([
            fwd.code,
            Assignments::block(
                "loss and backward",
                Assignments::seq([
                    nn::softmax_cross_entropy(
                        loss,
                        &dz2,
                        &fwd.logits,
                        labels,
                        &self.classes,
                        &scratch,
                        s.batch,
                    )?,
                    nn::matmul(self.g(2), &fwd.p1, &dz2, "bhvc,bk->hvck", &none)?,
                    nn::sum(self.g(3), &dz2, "bk->k", &none)?,
                    nn::matmul(&dp1, &dz2, self.p(2), "bk,hvck->bhvc", &none)?,
                    nn::max_pool2d_backward(&dr1, &fwd.r1, &fwd.p1, &dp1, &up, 2)?,
                    nn::relu_backward(&dz1, &fwd.r1, &dr1)?,
                    nn::conv2d_weight_grad(self.g(0), x, &dz1, same)?,
                    nn::sum(self.g(1), &dz1, "bhvd->d", &none)?,
                ]),
            ),
        ]))
    }
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
    let backend = jit.backend();
    let mut rng = Rng(args.seed);
    let (train_x, train_y) = images(args.train, &mut rng);
    let test_n = 1024;
    let (test_x, test_y) = images(test_n, &mut rng);
    let net = std::rc::Rc::new(Net::new(&mut rng)?);
    let f = Prec::Single;

    // The data, the held-out images and what the evaluation writes.
    let x = Tnode::hosted(&["images"], &[args.train, SIDE, SIDE, 1], f)?;
    x.set_host_values(&train_x)?;
    let labels = Tnode::hosted(&["labels"], &[args.train], Prec::Int32)?;
    labels.set_host_slice(&train_y)?;
    let test_images = Tnode::hosted(&["test", "images"], &[test_n, SIDE, SIDE, 1], f)?;
    test_images.set_host_values(&test_x)?;
    let test_logits = Tnode::hosted(&["test", "logits"], &[test_n, CLASSES], f)?;
    let eval = net.forward(&test_images, test_n, test_logits.clone())?.code;

    let loss = Tnode::new(&["loss"], &[1], f)?;
    let mut model = Model::new();
    for (p, g, init) in &net.params {
        model = model.param(p, g, init.clone());
    }
    let (n2, l2) = (net.clone(), loss.clone());
    let model = model
        .loss(&loss)
        .data(&x)
        .data(&labels)
        .constant(&net.classes)
        .gradient(move |s| n2.gradient(s, &l2))
        .update(Update::sgd(LearningRate::Constant(args.lr)))
        .evaluate(
            eval,
            std::slice::from_ref(&test_images),
            std::slice::from_ref(&test_logits),
        );
    let settings = Settings::new(args.batch, args.epochs);
    let devices = match args.devices {
        Some(n) => n,
        None => parallel::devices_for(backend, &model, &settings)?,
    };
    if devices == 0 || args.batch % devices != 0 {
        bail!(
            "--batch {} must split evenly over {devices} devices",
            args.batch
        );
    }
    println!(
        "bars vs crosses: {} training images 8x8, conv 3x3x{CHANNELS} + relu + max-pool 2x2 + dense, batch {}, {} epochs, {devices} device{}",
        args.train,
        args.batch,
        args.epochs,
        if devices == 1 { "" } else { "s" }
    );
    let report = parallel::train(
        backend,
        &model,
        &settings.devices(Devices::Count(devices)),
        &mut |e| println!("epoch {} loss {:.4}", e.epoch - 1, e.loss),
    )?;
    println!(
        "compiled and linked in {:.0} ms",
        (report.compile_time + report.setup_time).as_secs_f64() * 1e3
    );
    // Accuracy on the held-out images, computed by the evaluation with the trained weights.
    let logits = test_logits.host_values().ok_or("logits are not hosted")?;
    let correct = argmax_rows(&logits)
        .iter()
        .zip(&test_y)
        .filter(|(p, y)| p == y)
        .count();
    println!(
        "accuracy: {:.4} devices: {devices} samples/s: {:.0}",
        correct as f64 / test_n as f64,
        report.samples_per_sec()
    );
    Ok(())
}
