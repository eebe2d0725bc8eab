//! The two-moons demo (OCANNL's `moons_demo_parallel`): a 2-H-H-1 ReLU MLP trained with a
//! hinge loss and SGD, data-parallel over the virtual devices of any [`Backend`].
//!
//! One training step on `N` devices (SPEC section 8):
//! 1. every device runs the gradient routine on its slice of the batch (the dataset is
//!    resident on every device as `[slots, batch/N, 2]`; a static index `slot` selects the
//!    slice, so a step copies nothing from the host);
//! 2. the gradients (and the loss) are merged into device 0 pairwise in a tree: in rounds
//!    with stride 1, 2, 4, ..., device `from` is merged into `to = from - stride` through
//!    `to`'s merge buffer (`Streaming`: `to` reads `from`'s buffer; `Copy`: `from`'s buffer
//!    is copied into `to`'s merge buffer), then `to` runs `g = g + merge(g)` for each tensor;
//! 3. device 0 applies the SGD update (the learning rate comes from a schedule tensor indexed
//!    by the static index `step`) and records the step's loss;
//! 4. the parameters are copied from device 0 to the other devices.
//!
//! Ordering rules: a device is awaited before anything copies from it; with `Streaming`, the
//! destination reads the source's buffer, so every destination is awaited at the end of its
//! round, before the next step lets the source overwrite its gradients; device 0 is awaited
//! before its parameters are copied out.
//!
//! ```no_run
//! use arrayjit::backend::MulticoreBackend;
//! use arrayjit::nn::moons::{dataset, train, TrainConfig};
//! # fn main() -> arrayjit::Result<()> {
//! let backend = MulticoreBackend::new();
//! let data = dataset(2400, 1);
//! let report = train(&backend, &data, &TrainConfig::default(), &mut |epoch, loss| {
//!     println!("epoch {epoch} loss {loss:.4}")
//! })?;
//! println!("accuracy {} on {} devices, {:.0} samples/s", report.accuracy, report.devices,
//!          report.samples_per_sec());
//! # Ok(())
//! # }
//! ```

use super::{Mlp, Rng};
use crate::backend::{Backend, Config, Context, Device, MergeBufferUse, Routine};
use crate::error::{Error, Result};
use crate::ir::einsum;
use crate::ir::tnode::provenance;
use crate::ir::{
    Assignments, Bindings, Binop, Buffer, InitOp, MemoryMode, Prec, StaticSymbol, Tnode, Unop,
};
use std::time::{Duration, Instant};

pub use super::HostMlp;

/// Points in the plane with labels ±1.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// The points.
    pub points: Vec<[f64; 2]>,
    /// One label per point: `1.0` or `-1.0`.
    pub labels: Vec<f64>,
}

impl Dataset {
    /// Number of points.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// Whether there are no points.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }
}

/// Two interleaved half-moons of `n` points, as in OCANNL's demo: for each pair, an angle
/// `v = k·π/(n/2)` with `k` uniform in `0..n/2`; the point `(cos v, sin v)` gets label `1` and
/// the point `(1 - cos v, 0.5 - sin v)` label `-1`, each coordinate plus noise uniform in
/// `±0.1`. Points alternate between the classes. Deterministic for a given `seed`.
pub fn dataset(n: usize, seed: u64) -> Dataset {
    let mut rng = Rng::new(seed);
    let pairs = n.div_ceil(2);
    let mut points = Vec::with_capacity(n);
    let mut labels = Vec::with_capacity(n);
    for _ in 0..pairs {
        let k = rng.below(pairs);
        let v = k as f64 * std::f64::consts::PI / pairs as f64;
        let (s, c) = v.sin_cos();
        let mut noise = || rng.range(-0.1, 0.1);
        let a = [c + noise(), s + noise()];
        let b = [1.0 - c + noise(), 0.5 - s + noise()];
        points.push(a);
        labels.push(1.0);
        points.push(b);
        labels.push(-1.0);
    }
    points.truncate(n);
    labels.truncate(n);
    Dataset { points, labels }
}

/// What to train and how.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Seed of the parameter initialization and of the batch order.
    pub seed: u64,
    /// Units in each of the two hidden layers.
    pub hidden: usize,
    /// Samples per step (split evenly across the devices).
    pub batch: usize,
    /// Passes over the dataset.
    pub epochs: usize,
    /// Initial learning rate; it decays linearly over the training to half of it (step `s` of
    /// `S` uses `learning_rate · (2S - s) / 2S`).
    pub learning_rate: f64,
    /// Weight decay (L2 penalty factor in the SGD step).
    pub weight_decay: f64,
    /// Number of virtual devices; `None`: [`default_devices`].
    pub devices: Option<usize>,
    /// `Streaming` or `Copy`: how gradients reach the merging device.
    pub merge: MergeBufferUse,
    /// Precision of parameters, data and activations.
    pub prec: Prec,
}

impl Default for TrainConfig {
    /// The demo's settings: seed 1, 16 hidden units, batch 120, 20 epochs, learning rate 0.1,
    /// weight decay 0.0002, the backend's suggested devices, streaming merges, single precision.
    fn default() -> Self {
        TrainConfig {
            seed: 1,
            hidden: 16,
            batch: 120,
            epochs: 20,
            learning_rate: 0.1,
            weight_decay: 0.0002,
            devices: None,
            merge: MergeBufferUse::Streaming,
            prec: Prec::Single,
        }
    }
}

/// Host-side time spent in each phase of the training steps (each phase ends when the devices
/// it used were awaited).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PhaseTimes {
    /// Scheduling the gradient routines and waiting for them.
    pub compute: Duration,
    /// The merge tree: transfers into merge buffers, merge routines, waiting for them.
    pub merge: Duration,
    /// The SGD update on device 0 and waiting for it.
    pub update: Duration,
    /// Copying the parameters from device 0 to the other devices and waiting for the copies.
    pub copies: Duration,
    /// Of all the above, the time spent blocked in `await_device`.
    pub waiting: Duration,
    /// Reading the loss history back at the end of each epoch.
    pub loss_readback: Duration,
}

/// The outcome of [`train`].
#[derive(Clone, Debug)]
pub struct TrainReport {
    /// The backend's name.
    pub backend: String,
    /// Number of virtual devices used.
    pub devices: usize,
    /// Mean batch loss of each epoch.
    pub epoch_losses: Vec<f64>,
    /// Fraction of the dataset's points classified correctly after training.
    pub accuracy: f64,
    /// Training steps run.
    pub steps: usize,
    /// Samples processed (`steps · batch`).
    pub samples: usize,
    /// Number of routines compiled (in one `compile_batch`).
    pub routines: usize,
    /// Lowering, optimizing, generating C, running the C compiler and loading the library.
    pub compile_time: Duration,
    /// Creating devices, linking, and the initial copies to the devices.
    pub setup_time: Duration,
    /// The training steps (from the first step to the last epoch's loss).
    pub train_time: Duration,
    /// Inference over the dataset and reading the parameters back.
    pub eval_time: Duration,
    /// Where the training time went.
    pub phases: PhaseTimes,
    /// The trained parameters, for evaluating the model on the host.
    pub model: HostMlp,
}

impl TrainReport {
    /// Training throughput: samples per second of [`train_time`](TrainReport::train_time).
    pub fn samples_per_sec(&self) -> f64 {
        let s = self.train_time.as_secs_f64();
        if s > 0.0 {
            self.samples as f64 / s
        } else {
            0.0
        }
    }
}

/// The number of devices to use by default: the backend's physical devices times its
/// suggested virtual devices per physical device, reduced to the largest number that divides
/// `batch` (each device gets an equal slice).
///
/// # Errors
///
/// When the backend has no device 0 (e.g. it is not initialized).
pub fn default_devices(backend: &dyn Backend, batch: usize) -> Result<usize> {
    let per = backend.suggested_num_virtual_devices(&backend.get_device(0)?);
    let n = (backend.num_physical_devices() * per).max(1);
    Ok((1..=n)
        .rev()
        .find(|d| batch.is_multiple_of(*d))
        .unwrap_or(1))
}

fn hosted(label: &[&str], dims: &[usize], prec: Prec, values: Vec<f64>) -> Result<Tnode> {
    let t = Tnode::with_init(
        label,
        dims,
        prec,
        &InitOp::ConstantFill {
            values,
            strict: true,
        },
    )?;
    t.update_memory_mode(MemoryMode::Materialized, provenance::USER)?;
    Ok(t)
}

/// One device's handles.
struct Dev {
    device: Device,
    ctx: Context,
    grad: Routine,
    merges: Vec<Routine>,
    update: Routine,
    infer: Routine,
}

/// Awaits a device, adding the time blocked to `waiting`.
fn wait(backend: &dyn Backend, d: &Device, waiting: &mut Duration) -> Result<()> {
    let t = Instant::now();
    let r = backend.await_device(d);
    *waiting += t.elapsed();
    r
}

/// Trains the demo's MLP on `data` with the given settings, data-parallel over
/// `cfg.devices` virtual devices of `backend` (initialized with [`Config::default`] if it is
/// not initialized yet). `on_epoch(epoch, mean_loss)` is called after each epoch (1-based).
///
/// All routines (gradient, one merge per gradient and for the loss, SGD update, inference)
/// are compiled in one `compile_batch`, linked on every device, and run as described in the
/// [module documentation](self). The batches of an epoch are the dataset's consecutive runs
/// of `batch` points (a remainder smaller than a batch is not trained on), visited in a
/// random order per epoch (seeded by `cfg.seed`).
///
/// The devices created stay with the backend until its `unsafe_cleanup` (or its drop).
///
/// # Errors
///
/// [`Error::Usage`] for settings that do not fit (no batch, a batch larger than the dataset,
/// devices that do not divide the batch, a merge mode other than `Streaming`/`Copy`), and
/// any error of compiling, linking or running.
pub fn train(
    backend: &dyn Backend,
    data: &Dataset,
    cfg: &TrainConfig,
    on_epoch: &mut dyn FnMut(usize, f64),
) -> Result<TrainReport> {
    let usage = |m: String| Err(Error::Usage(m));
    if cfg.batch == 0 || cfg.epochs == 0 || cfg.hidden == 0 {
        return usage(format!(
            "batch ({}), epochs ({}) and hidden units ({}) must be positive",
            cfg.batch, cfg.epochs, cfg.hidden
        ));
    }
    if data.labels.len() != data.len() {
        return usage("the dataset needs one label per point".into());
    }
    if data.len() < cfg.batch {
        return usage(format!(
            "the batch ({}) is larger than the dataset ({} points)",
            cfg.batch,
            data.len()
        ));
    }
    if cfg.merge == MergeBufferUse::No {
        return usage("merging needs MergeBufferUse::Streaming or MergeBufferUse::Copy".into());
    }
    if !backend.is_initialized() {
        backend.initialize(Config::default());
    }
    let n_dev = match cfg.devices {
        Some(n) => n,
        None => default_devices(backend, cfg.batch)?,
    };
    if n_dev == 0 || !cfg.batch.is_multiple_of(n_dev) {
        return usage(format!(
            "{n_dev} devices cannot split a batch of {} evenly",
            cfg.batch
        ));
    }
    let prec = cfg.prec;
    let m = cfg.batch / n_dev;
    let per_epoch = data.len() / cfg.batch;
    let slots = per_epoch * n_dev;
    let steps = per_epoch * cfg.epochs;
    let used = per_epoch * cfg.batch;

    // The model and the tensors resident on the devices.
    let mlp = Mlp::new(&[2, cfg.hidden, cfg.hidden, 1], prec, cfg.seed)?;
    let xs: Vec<f64> = data.points[..used].iter().flatten().copied().collect();
    let data_x = hosted(&["moons", "x"], &[slots, m, 2], prec, xs)?;
    let data_t = hosted(
        &["moons", "t"],
        &[slots, m, 1],
        prec,
        data.labels[..used].to_vec(),
    )?;
    let schedule: Vec<f64> = (0..steps)
        .map(|s| cfg.learning_rate * (2 * steps - s) as f64 / (2 * steps) as f64)
        .collect();
    let lr_schedule = hosted(&["lr_schedule"], &[steps, 1], prec, schedule)?;
    let eval_x = hosted(
        &["eval", "x"],
        &[data.len(), 2],
        prec,
        data.points.iter().flatten().copied().collect(),
    )?;
    let scores = Tnode::new(&["scores"], &[data.len(), 1], prec)?;
    scores.ensure_hosted()?;
    let loss = Tnode::new(&["loss"], &[1], prec)?;
    loss.update_memory_mode(MemoryMode::OnDevice, provenance::USER)?;
    let history = Tnode::new(&["loss_history"], &[steps], prec)?;
    history.ensure_hosted()?;

    let slot = StaticSymbol::new("slot", Some(slots));
    let step = StaticSymbol::new("step", Some(steps));
    let bindings = Bindings(vec![slot.clone(), step.clone()]);
    let record = Assignments::AccumUnop {
        initialize_neutral: false,
        accum: Binop::Arg2,
        op: Unop::Identity,
        lhs: history.clone(),
        rhs: Buffer::Node(loss.clone()),
        projections: einsum::projections("0->{step}", history.dims(), &[loss.dims()], &bindings)?,
    };

    let mut names = vec!["grad".to_string()];
    let mut code = vec![mlp.grad_routine(&data_x, &data_t, &slot, &loss, cfg.batch)?];
    let merges = mlp.merge_routines(std::slice::from_ref(&loss));
    let merge_nodes: Vec<Tnode> = mlp.grads().into_iter().chain([loss.clone()]).collect();
    for (name, a) in merges {
        names.push(name);
        code.push(a);
    }
    names.push("sgd_update".into());
    code.push(Assignments::seq([
        mlp.sgd_routine(&lr_schedule, &step, cfg.weight_decay)?,
        Assignments::block("record the step's loss", record),
    ]));
    names.push("infer".into());
    code.push(mlp.infer_routine(&eval_x, &scores)?);

    let t0 = Instant::now();
    let batch = backend.compile_batch(true, Some(&names), None, &bindings, &code)?;
    let compile_time = t0.elapsed();

    // Devices, contexts, routines, initial copies.
    let t0 = Instant::now();
    let mut devs: Vec<Dev> = vec![];
    let physical = backend.num_physical_devices().max(1);
    let params = mlp.params();
    for i in 0..n_dev {
        let device = backend.new_virtual_device(&backend.get_device(i % physical)?)?;
        let root = backend.init(&device)?;
        let (ctx, rs) = backend.link_batch(&[], &root, &batch)?;
        let mut rs = rs
            .into_iter()
            .zip(&names)
            .map(|(r, n)| r.ok_or_else(|| Error::Usage(format!("routine {n} was not linked"))))
            .collect::<Result<Vec<Routine>>>()?;
        let infer = rs.pop().ok_or_else(|| Error::Usage("no routines".into()))?;
        let update = rs.pop().ok_or_else(|| Error::Usage("no routines".into()))?;
        let grad = rs.remove(0);
        let mut initial = vec![&data_x, &data_t];
        initial.extend(&params);
        if i == 0 {
            initial.extend([&lr_schedule, &eval_x]);
        }
        for tn in initial {
            if !backend.from_host(&ctx, tn)? {
                return usage(format!("tensor {} is not on device {i}", tn.name()));
            }
        }
        devs.push(Dev {
            device,
            ctx,
            grad,
            merges: rs,
            update,
            infer,
        });
    }
    for d in &devs {
        backend.await_device(&d.device)?;
    }
    let setup_time = t0.elapsed();

    // Training.
    let mut phases = PhaseTimes::default();
    let mut waiting = Duration::ZERO;
    let mut epoch_losses = vec![];
    let mut order_rng = Rng::new(cfg.seed.wrapping_mul(0x9E37_79B9).wrapping_add(7));
    let mut s = 0usize;
    let t_train = Instant::now();
    for epoch in 0..cfg.epochs {
        for k in order_rng.permutation(per_epoch) {
            // 1. Gradients of every slice.
            let t = Instant::now();
            for (i, d) in devs.iter().enumerate() {
                d.grad
                    .bindings()
                    .set_symbol(&slot, (k * n_dev + i) as i64)?;
                d.grad.schedule()?;
            }
            for d in &devs {
                wait(backend, &d.device, &mut waiting)?;
            }
            let t1 = Instant::now();
            phases.compute += t1 - t;
            // 2. Tree merge into device 0.
            let mut stride = 1;
            while stride < n_dev {
                let mut targets = vec![];
                for to in (0..n_dev).step_by(2 * stride) {
                    let from = to + stride;
                    if from >= n_dev {
                        continue;
                    }
                    // `from` is idle: awaited after computing, or at the end of its last round.
                    for (g, r) in merge_nodes.iter().zip(&devs[to].merges) {
                        backend.device_to_device(g, cfg.merge, &devs[to].ctx, &devs[from].ctx)?;
                        r.schedule()?;
                    }
                    targets.push(to);
                }
                // With Streaming the targets read their sources' buffers: let them finish
                // before anyone writes those buffers (and before a target is merged onward).
                for to in targets {
                    wait(backend, &devs[to].device, &mut waiting)?;
                }
                stride *= 2;
            }
            let t2 = Instant::now();
            phases.merge += t2 - t1;
            // 3. Update on device 0.
            let d0 = &devs[0];
            d0.update.bindings().set_symbol(&step, s as i64)?;
            d0.update.schedule()?;
            wait(backend, &d0.device, &mut waiting)?;
            let t3 = Instant::now();
            phases.update += t3 - t2;
            // 4. Parameters back to the other devices.
            if n_dev > 1 {
                for d in &devs[1..] {
                    for p in &params {
                        if !backend.device_to_device(p, MergeBufferUse::No, &d.ctx, &d0.ctx)? {
                            return usage(format!("parameter {} is not on a device", p.name()));
                        }
                    }
                }
                for d in &devs[1..] {
                    wait(backend, &d.device, &mut waiting)?;
                }
            }
            phases.copies += t3.elapsed();
            s += 1;
        }
        let t = Instant::now();
        backend.to_host(&devs[0].ctx, &history)?;
        wait(backend, &devs[0].device, &mut waiting)?;
        let values = history
            .host_values()
            .ok_or_else(|| Error::Usage("the loss history is not hosted".into()))?;
        let epoch_steps = values
            .get(epoch * per_epoch..(epoch + 1) * per_epoch)
            .ok_or_else(|| Error::Usage("the loss history is too short".into()))?;
        let mean = epoch_steps.iter().sum::<f64>() / per_epoch as f64;
        epoch_losses.push(mean);
        phases.loss_readback += t.elapsed();
        on_epoch(epoch + 1, mean);
    }
    let train_time = t_train.elapsed();
    phases.waiting = waiting;

    // Evaluation on device 0.
    let t0 = Instant::now();
    let d0 = &devs[0];
    d0.infer.schedule()?;
    backend.to_host(&d0.ctx, &scores)?;
    for p in &params {
        backend.to_host(&d0.ctx, p)?;
    }
    backend.await_device(&d0.device)?;
    let predicted = scores
        .host_values()
        .ok_or_else(|| Error::Usage("scores are not hosted".into()))?;
    let correct = predicted
        .iter()
        .zip(&data.labels)
        .filter(|(y, t)| (**y > 0.0) == (**t > 0.0))
        .count();
    let model = mlp.to_host_model()?;
    let eval_time = t0.elapsed();

    Ok(TrainReport {
        backend: backend.name().to_string(),
        devices: n_dev,
        epoch_losses,
        accuracy: correct as f64 / data.len() as f64,
        steps,
        samples: steps * cfg.batch,
        routines: names.len(),
        compile_time,
        setup_time,
        train_time,
        eval_time,
        phases,
        model,
    })
}
