//! A model of one's own trained data-parallel with `arrayjit::parallel`: a 2-layer tanh
//! network fitting two smooth functions of 3 inputs with a squared loss, in double precision.
//!
//! ```text
//! cargo run --release --example regression -- [--devices N] [--epochs N] [--batch N]
//!     [--schedule auto|exchange|tree|host-tree|deterministic:S] [--backend multicore|sync|mpi]
//!     [--bits]
//! mpirun -n R target/release/examples/regression --backend mpi [--devices N] ...
//! ```
//!
//! Prints the loss of every epoch and a summary `loss: L devices: N ranks: R schedule: S`;
//! with `--bits`, also `bits: ...`, the losses and trained parameters as hexadecimal bit
//! patterns (the MPI tests compare them across backends). `--devices` counts the devices over
//! all ranks (default: the library's choice). Under MPI only rank 0 prints; an error on a rank
//! prints `rank R: error: ...` and ends the job.

use arrayjit::backend::{backend_by_name, Backend};
use arrayjit::ir::{Assignments, Bindings, Prec, Tnode, Unop};
use arrayjit::nn;
use arrayjit::parallel::{self, Devices, LearningRate, Model, Settings, Slice, Update};
use std::process::ExitCode;

const IN: usize = 3;
const HID: usize = 8;
const OUT: usize = 2;
const P: Prec = Prec::Double;

/// Samples `[n, IN]` uniform in `[-1, 1)` (SplitMix64, seed 7) and their targets `[n, OUT]`.
fn data(n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut state = 7u64;
    let mut uniform = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    };
    let xs: Vec<f64> = (0..n * IN).map(|_| uniform()).collect();
    let ts = xs
        .chunks(IN)
        .flat_map(|x| [(x[0] - 0.5 * x[1]).sin(), x[2] * x[0] + 0.25])
        .collect();
    (xs, ts)
}

/// The model: parameters `w1 [IN, HID]`, `b1`, `w2 [HID, OUT]`, `b2` with small initial
/// values, the data, and the gradient code of a slice (forward, the slice's share of the
/// batch's mean squared loss, backward).
fn model(samples: usize) -> arrayjit::Result<Model<'static>> {
    let t = |name: &str, dims: &[usize]| Tnode::new(&[name], dims, P);
    let (w1, b1, w2, b2) = (
        t("w1", &[IN, HID])?,
        t("b1", &[HID])?,
        t("w2", &[HID, OUT])?,
        t("b2", &[OUT])?,
    );
    let (gw1, gb1, gw2, gb2) = (
        t("gw1", &[IN, HID])?,
        t("gb1", &[HID])?,
        t("gw2", &[HID, OUT])?,
        t("gb2", &[OUT])?,
    );
    let loss = t("loss", &[1])?;
    let (xs, ts) = data(samples);
    let x = Tnode::hosted(&["x"], &[samples, IN], P)?;
    x.set_host_values(&xs)?;
    let y = Tnode::hosted(&["y"], &[samples, OUT], P)?;
    y.set_host_values(&ts)?;
    let init = |n: usize, k: usize| -> Vec<f64> {
        (0..n)
            .map(|i| 0.4 * (((i * 7 + k * 3) % 11) as f64 / 5.0 - 1.0))
            .collect()
    };
    let params = [w1.clone(), b1.clone(), w2.clone(), b2.clone()];
    let grads = [gw1.clone(), gb1.clone(), gw2.clone(), gb2.clone()];
    let l = loss.clone();
    let gradient = move |s: &Slice| -> arrayjit::Result<Assignments> {
        let (x, target, m) = (&s.data[0], &s.data[1], s.rows);
        let (z1, pre, h) = (
            t("z1", &[m, HID])?,
            t("pre", &[m, HID])?,
            t("h", &[m, HID])?,
        );
        let (z2, out, diff) = (
            t("z2", &[m, OUT])?,
            t("out", &[m, OUT])?,
            t("diff", &[m, OUT])?,
        );
        let (sq, dy, dh) = (t("sq", &[1])?, t("dy", &[m, OUT])?, t("dh", &[m, HID])?);
        let (hh, gate, dpre) = (
            t("hh", &[m, HID])?,
            t("gate", &[m, HID])?,
            t("dpre", &[m, HID])?,
        );
        let (one, fill_one) = nn::constant("one", 1.0, P)?;
        let none = Bindings::empty();
        let inv = 1.0 / s.batch as f64;
        Ok(Assignments::seq([
            nn::matmul(&z1, x, &w1, "bi,ih->bh", &none)?,
            nn::add_bias(&pre, &z1, &b1, "bh,h->bh", &none)?,
            nn::unary(&h, Unop::Tanh, &pre)?,
            nn::matmul(&z2, &h, &w2, "bh,ho->bo", &none)?,
            nn::add_bias(&out, &z2, &b2, "bo,o->bo", &none)?,
            nn::sub(&diff, &out, target)?,
            nn::matmul(&sq, &diff, &diff, "bo,bo->0", &none)?,
            nn::scale(&l, &sq, inv)?,
            nn::scale(&dy, &diff, 2.0 * inv)?,
            nn::matmul(&gw2, &h, &dy, "bh,bo->ho", &none)?,
            nn::sum(&gb2, &dy, "bo->o", &none)?,
            nn::matmul(&dh, &dy, &w2, "bo,ho->bh", &none)?,
            fill_one,
            nn::mul(&hh, &h, &h)?,
            nn::sub(&gate, &one, &hh)?,
            nn::mul(&dpre, &dh, &gate)?,
            nn::matmul(&gw1, x, &dpre, "bi,bh->ih", &none)?,
            nn::sum(&gb1, &dpre, "bh->h", &none)?,
        ]))
    };
    let mut m = Model::new();
    for (k, (p, g)) in params.iter().zip(&grads).enumerate() {
        m = m.param(p, g, init(p.numel(), k));
    }
    Ok(m.loss(&loss).data(&x).data(&y).gradient(gradient).update(
        Update::sgd(LearningRate::Linear {
            start: 0.3,
            end: 0.05,
        })
        .weight_decay(1e-4),
    ))
}

struct Args {
    backend: String,
    settings: Settings,
    bits: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        backend: "multicore".into(),
        settings: Settings::new(48, 10),
        bits: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let num = |v: String| -> Result<usize, String> {
            v.parse().map_err(|_| format!("{v:?} is not a number"))
        };
        match flag.as_str() {
            "--devices" => a.settings.devices = Devices::Count(num(value()?)?),
            "--epochs" => a.settings.epochs = num(value()?)?,
            "--batch" => a.settings.batch = num(value()?)?,
            "--backend" => a.backend = value()?,
            "--bits" => a.bits = true,
            "--schedule" => {
                a.settings.schedule = value()?
                    .parse()
                    .map_err(|e: arrayjit::Error| format!("--schedule: {e}"))?
            }
            other => return Err(format!("unknown flag {other:?} (see the source's header)")),
        }
    }
    Ok(a)
}

fn run(args: &Args, backend: &dyn Backend) -> Result<(), String> {
    let e = |e: arrayjit::Error| e.to_string();
    let out = backend.rank() == 0;
    let model = model(960).map_err(e)?;
    let report = parallel::train(backend, &model, &args.settings, &mut |ep| {
        if out {
            println!("epoch {} loss {:.6}", ep.epoch, ep.loss)
        }
    })
    .map_err(e)?;
    if out {
        let last = report.epoch_losses.last().copied().unwrap_or(f64::NAN);
        println!(
            "loss: {last:.6} devices: {} ranks: {} schedule: {}",
            report.devices, report.ranks, report.schedule
        );
        if args.bits {
            let hex = |v: &[f64]| {
                v.iter()
                    .map(|x| format!("{:016x}", x.to_bits()))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            println!(
                "bits: {} | {}",
                hex(&report.epoch_losses),
                hex(&report.flat_params())
            );
        }
    }
    backend.unsafe_cleanup();
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    let backend = match backend_by_name(&args.backend) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&args, backend.as_ref()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) if backend.num_ranks() > 1 => {
            // One write, so that the lines of ranks failing at once do not interleave.
            let line = format!("rank {}: error: {msg}\n", backend.rank());
            eprint!("{line}");
            backend.abort_job(1);
            ExitCode::FAILURE
        }
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}
