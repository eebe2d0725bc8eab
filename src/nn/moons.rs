//! The two-moons demo (OCANNL's `moons_demo_parallel`): a 2-H-H-1 ReLU MLP trained with a
//! hinge loss and SGD, data-parallel over the virtual devices of any [`Backend`].
//!
//! One training step on `N` devices, in *groups* of consecutive devices (one group per core
//! that holds devices, [`Backend::placement`]; one per rank over MPI), the first device of
//! each group being its *leader*:
//! 1. every device runs the gradient routine on its slice of the batch (the dataset is
//!    resident on every device as `[slots, batch/N, 2]`; a static index `slot` selects the
//!    slice, so a step copies nothing from the host);
//! 2. each group's gradients (and loss) are merged into its leader pairwise in a tree: in
//!    rounds with stride 1, 2, 4, ..., device `from` is merged into `to = from - stride`
//!    through `to`'s merge buffer (`Streaming`: `to` reads `from`'s buffer; `Copy`: `from`'s
//!    buffer is copied into `to`'s merge buffer), then `to` runs `g = g + merge(g)`;
//! 3. the leaders combine their sums: over MPI they all-reduce them
//!    ([`Backend::all_reduce`], `MPI_Allreduce`); in one process they *exchange* them by
//!    recursive doubling: in round `r = 0 .. log2 L` leaders `l` and `l ^ 2^r` each add the
//!    other's partial sum to their own, into a buffer of the round (`sum = g + merge(g)`, so
//!    `g` stays for the partner to read);
//! 4. every leader applies the same SGD update (the learning rate comes from a schedule
//!    tensor indexed by the static index `step`) and records the step's loss, so the
//!    parameters stay identical on every leader;
//! 5. the parameters are copied from each leader to the other devices of its group.
//!
//! The exchange needs a power-of-two number of equal power-of-two groups; then it adds in the
//! order of one tree over all devices (((g0 + g1) + (g2 + g3)) ...), and addition is
//! commutative, so every leader gets the same bits, and every backend and device count the
//! same results. Otherwise all devices form one group, merged into device 0. With 2 devices
//! on 2 cores a step has one cross-core wait (the exchange) and no copies; with 8, the 4
//! devices of a core merge on their own core and only the leaders' exchange crosses cores.
//! This is the Horovod pattern; over MPI the ranks are the groups.
//!
//! The gradients and the loss travel as one tensor, and so do the parameters (fusion
//! buffers, [`Bucket`]): the gradient routine ends by packing the gradients and the loss into
//! `grads`, and the update unpacks the combined sum, updates the parameters and packs them
//! into `params`, which the gradient routine unpacks first. So a merge is one transfer and one
//! routine and a parameter copy one transfer, whatever the number of layers.
//!
//! The host never waits for a device inside a step: it schedules the steps of an epoch, and
//! every task declares the buffers it reads and writes (routine tasks, [`Transfer::task`],
//! and a merge's transfer and routine joined into one task), so the device layer's hazard
//! tracking orders the devices' work, with transfers prepared once
//! ([`Backend::prepare_transfer`]). The host waits only for the loss history of each epoch,
//! one epoch late (while the next epoch runs), and for every device at the end.
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

use super::{merge_add, merge_sum, Bucket, Mlp, Rng};
use crate::backend::{Backend, Config, Context, Device, Event, MergeBufferUse, Routine, Transfer};
use crate::error::{Error, Result};
use crate::ir::einsum;
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
    /// Number of virtual devices (over all ranks, a multiple of [`Backend::num_ranks`]);
    /// `None`: [`default_devices`].
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

/// Where the host's time went during training. The host only schedules work (the devices
/// order it among themselves with events) and waits for the loss history of each epoch, so
/// most of the training time is normally `waiting`: the devices' work.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PhaseTimes {
    /// Scheduling the training steps (gradients, merges, updates, parameter copies).
    pub scheduling: Duration,
    /// Blocked waiting for devices (the loss history of each epoch, the end of the work).
    pub waiting: Duration,
    /// Reading the loss history back at the end of each epoch (including the wait for it).
    pub loss_readback: Duration,
}

/// The outcome of [`train`].
#[derive(Clone, Debug)]
pub struct TrainReport {
    /// The backend's name.
    pub backend: String,
    /// Number of virtual devices used (over all ranks).
    pub devices: usize,
    /// Number of processes the devices were spread over ([`Backend::num_ranks`]: 1 but for
    /// the MPI backend, where each rank holds `devices / ranks` of them).
    pub ranks: usize,
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
/// `batch` (each device gets an equal slice) and is a multiple of the backend's ranks (each
/// rank holds as many).
///
/// # Errors
///
/// When the backend has no device 0 (e.g. it is not initialized).
pub fn default_devices(backend: &dyn Backend, batch: usize) -> Result<usize> {
    let per = backend.suggested_num_virtual_devices(&backend.get_device(0)?);
    let n = (backend.num_physical_devices() * per).max(1);
    let ranks = backend.num_ranks().max(1);
    Ok((1..=n)
        .rev()
        .find(|d| batch.is_multiple_of(*d) && d.is_multiple_of(ranks))
        .unwrap_or(ranks))
}

fn hosted(label: &[&str], dims: &[usize], prec: Prec, values: Vec<f64>) -> Result<Tnode> {
    Tnode::builder(label, dims, prec)
        .init(InitOp::ConstantFill {
            values,
            strict: true,
        })
        .memory(MemoryMode::Materialized)
        .build()
}

/// One device's handles.
struct Dev {
    device: Device,
    ctx: Context,
    grad: Routine,
    /// The tree merge's routine (`g = g + merge(g)` on the fused gradients and loss), then
    /// the exchange's routine of each round.
    merges: Vec<Routine>,
    update: Routine,
    infer: Routine,
}

/// How the devices combine their gradients (module documentation): groups of devices (one
/// per core, or per rank), each merged into its first device (its leader) in a tree, then
/// the leaders' sums combined.
struct Layout {
    /// Contiguous runs of devices, in order; the first of each is its leader.
    groups: Vec<Vec<usize>>,
    /// Rounds of the leaders' exchange (0: one group, or MPI ranks, which all-reduce).
    rounds: usize,
}

impl Layout {
    /// Groups by [`Backend::placement`]. Across ranks the leaders all-reduce. In one process,
    /// the leaders exchange when the groups are a power-of-two number of equal power-of-two
    /// runs (the exchange then adds in the order of one tree over all devices, so every
    /// device count gives the same bits on every backend); otherwise all devices form one
    /// group (one tree into device 0).
    fn new(backend: &dyn Backend, n_dev: usize) -> Layout {
        let mut groups: Vec<Vec<usize>> = vec![];
        let mut last = None;
        for i in 0..n_dev {
            let p = backend.placement(i, n_dev);
            match groups.last_mut() {
                Some(g) if last == Some(p) => g.push(i),
                _ => groups.push(vec![i]),
            }
            last = Some(p);
        }
        if backend.num_ranks() > 1 {
            return Layout { groups, rounds: 0 };
        }
        let size = groups.first().map_or(0, Vec::len);
        let even = groups.iter().all(|g| g.len() == size);
        if groups.len() > 1 && groups.len().is_power_of_two() && size.is_power_of_two() && even {
            let rounds = groups.len().trailing_zeros() as usize;
            Layout { groups, rounds }
        } else {
            Layout {
                groups: vec![(0..n_dev).collect()],
                rounds: 0,
            }
        }
    }

    fn leaders(&self) -> Vec<usize> {
        self.groups.iter().map(|g| g[0]).collect()
    }
}

/// One merge: the transfer into `to`'s merge buffer, then the routine adding it.
struct MergeJob {
    to: usize,
    transfer: Transfer,
    routine: Routine,
}

/// What a training step schedules, prepared once: the devices' routines, and the transfers
/// of the merges and of the parameter copies, checked when prepared.
struct Plan {
    devs: Vec<Dev>,
    slot: StaticSymbol,
    step: StaticSymbol,
    /// In scheduling order: each group's tree (rounds with stride 1, 2, 4, ...), then the
    /// leaders' exchange rounds.
    merges: Vec<MergeJob>,
    /// The devices that update: the leaders.
    leaders: Vec<usize>,
    /// What the leaders all-reduce across ranks (the fused gradients and loss), when there are
    /// several ranks, and the leaders' contexts.
    all_reduce: Option<(Vec<Tnode>, Vec<Context>)>,
    /// The parameter copies from each leader to the other devices of its group, with their
    /// destinations.
    copies: Vec<(usize, Transfer)>,
}

impl Plan {
    /// `merged[r]`: what the exchange's round `r` reads (the fused gradients for round 0,
    /// then the previous round's sum).
    fn new(
        backend: &dyn Backend,
        devs: Vec<Dev>,
        layout: &Layout,
        (slot, step): (StaticSymbol, StaticSymbol),
        (merged, params): (&[&Tnode], &Tnode),
        merge: MergeBufferUse,
    ) -> Result<Plan> {
        let job = |to: usize, from: usize, routine: usize, node: &Tnode| -> Result<MergeJob> {
            let routine = devs[to].merges[routine].clone();
            let transfer = backend
                .prepare_transfer(node, merge, routine.context(), &devs[from].ctx)?
                .ok_or_else(|| {
                    Error::Usage(format!("gradients {} are not on a device", node.name()))
                })?;
            Ok(MergeJob {
                to,
                transfer,
                routine,
            })
        };
        let mut merges = vec![];
        for g in &layout.groups {
            let mut stride = 1;
            while stride < g.len() {
                for local in (0..g.len()).step_by(2 * stride) {
                    if local + stride < g.len() {
                        merges.push(job(g[local], g[local + stride], 0, merged[0])?);
                    }
                }
                stride *= 2;
            }
        }
        let leaders = layout.leaders();
        for (r, node) in merged.iter().enumerate().take(layout.rounds) {
            for (l, &to) in leaders.iter().enumerate() {
                merges.push(job(to, leaders[l ^ (1 << r)], 1 + r, node)?);
            }
        }
        let mut copies = vec![];
        for g in &layout.groups {
            for &to in &g[1..] {
                copies.push((
                    to,
                    backend
                        .prepare_transfer(
                            params,
                            MergeBufferUse::No,
                            &devs[to].ctx,
                            &devs[g[0]].ctx,
                        )?
                        .ok_or_else(|| {
                            Error::Usage(format!(
                                "parameters {} are not on a device",
                                params.name()
                            ))
                        })?,
                ));
            }
        }
        let all_reduce = (backend.num_ranks() > 1).then(|| {
            let ctxs = leaders.iter().map(|&l| devs[l].ctx.clone()).collect();
            (vec![merged[0].clone()], ctxs)
        });
        Ok(Plan {
            devs,
            slot,
            step,
            merges,
            leaders,
            all_reduce,
            copies,
        })
    }

    /// Schedules training step `s` on batch `k` of the epoch (module documentation). Every
    /// task declares what it reads and writes (routine tasks, [`Transfer::task`], and the two
    /// joined by [`Task::then`](crate::backend::Task::then) for a merge), so the device layer orders the devices' work:
    /// a merge waits for its source's gradients (read after write), a source's next
    /// gradients wait for the merges reading them (write after read), a copy waits for its
    /// leader's update, and the leader's next update for the copies reading its parameters.
    /// The host never waits.
    fn schedule_step(&self, backend: &dyn Backend, k: usize, s: usize) -> Result<()> {
        let devs = &self.devs;
        let n_dev = devs.len();
        // 1. Gradients of every slice.
        for (i, d) in devs.iter().enumerate() {
            d.grad
                .bindings()
                .set_symbol(&self.slot, (k * n_dev + i) as i64)?;
            d.grad.schedule()?;
        }
        // 2. The groups' trees, then the leaders' exchange rounds.
        for job in &self.merges {
            backend.schedule(
                &devs[job.to].device,
                job.transfer.task().then(job.routine.task()),
            )?;
        }
        // 3. Across ranks: the leaders' gradients and losses are all-reduced (MPI).
        if let Some((nodes, ctxs)) = &self.all_reduce {
            backend.all_reduce(nodes, ctxs)?;
        }
        // 4. Every leader updates (they hold the same sums, so their parameters stay equal).
        for &l in &self.leaders {
            let d = &devs[l];
            d.update.bindings().set_symbol(&self.step, s as i64)?;
            d.update.schedule()?;
        }
        // 5. Parameters from the leaders to the other devices of their groups.
        for (to, t) in &self.copies {
            backend.schedule(&devs[*to].device, t.task())?;
        }
        Ok(())
    }
}

/// Trains the demo's MLP on `data` with the given settings, data-parallel over
/// `cfg.devices` virtual devices of `backend` (initialized with [`Config::default`] if it is
/// not initialized yet). `on_epoch(epoch, mean_loss)` is called after each epoch (1-based).
///
/// All routines (gradient, the merge or one exchange routine per round, SGD update,
/// inference, and the packing of the initial parameters) are compiled in one `compile_batch`, linked on every device, and run as described in the
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
    let ranks = backend.num_ranks().max(1);
    if !n_dev.is_multiple_of(ranks) {
        return usage(format!(
            "{n_dev} devices cannot be spread evenly over {ranks} ranks (the devices are the \
             total over all ranks)"
        ));
    }
    let layout = Layout::new(backend, n_dev);
    let leaders = layout.leaders();
    // This rank's leader: the device whose results this process reads (device 0 in one
    // process); every rank evaluates on its own.
    let me = if ranks > 1 {
        backend.rank() * (n_dev / ranks)
    } else {
        0
    };
    let readers = if ranks > 1 { leaders.clone() } else { vec![0] };
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
    let scores = Tnode::hosted(&["scores"], &[data.len(), 1], prec)?;
    let loss = Tnode::builder(&["loss"], &[1], prec)
        .memory(MemoryMode::OnDevice)
        .build()?;
    let history = Tnode::hosted(&["loss_history"], &[steps], prec)?;

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

    // Fusion buffers: the gradients and the loss travel between devices as one tensor, and
    // so do the parameters, so a merge is one transfer and one routine, and a parameter copy
    // one transfer, whatever the number of layers.
    let grads = Bucket::on_device(
        &["grads"],
        &mlp.grads()
            .into_iter()
            .chain([loss.clone()])
            .collect::<Vec<_>>(),
    )?;
    let params = Bucket::on_device(&["params"], &mlp.params())?;
    // The leaders' exchange (module documentation): round `r` adds the partner's partial
    // sum to this leader's into `sums[r]`.
    let sums = (0..layout.rounds)
        .map(|r| {
            Tnode::builder(&["grads", &format!("sum{r}")], grads.flat().dims(), prec)
                .memory(MemoryMode::OnDevice)
                .build()
        })
        .collect::<Result<Vec<Tnode>>>()?;
    let total = sums.last().unwrap_or(grads.flat());
    let mut names = vec!["grad".to_string(), "merge_grads".to_string()];
    let mut code = vec![
        Assignments::seq([
            params.unpack()?,
            mlp.grad_routine(&data_x, &data_t, &slot, &loss, cfg.batch)?,
            grads.pack()?,
        ]),
        Assignments::block("merge the gradients and the loss", merge_add(grads.flat())),
    ];
    for (r, sum) in sums.iter().enumerate() {
        let prev = if r == 0 { grads.flat() } else { &sums[r - 1] };
        names.push(format!("exchange_{r}"));
        code.push(Assignments::block(
            &format!("exchange round {r}: add the partner's partial sum"),
            merge_sum(sum, prev)?,
        ));
    }
    let merges = names.len() - 1;
    names.extend(["sgd_update", "infer", "pack_params"].map(String::from));
    code.extend([
        Assignments::seq([
            grads.unpack_from(total)?,
            mlp.sgd_routine(&lr_schedule, &step, cfg.weight_decay)?,
            Assignments::block("record the step's loss", record),
            params.pack()?,
        ]),
        mlp.infer_routine(&eval_x, &scores)?,
        params.pack()?,
    ]);

    let t0 = Instant::now();
    let batch = backend.compile_batch(true, Some(&names), None, &bindings, &code)?;
    let compile_time = t0.elapsed();

    // Devices, contexts, routines, initial copies.
    let t0 = Instant::now();
    let mut devs: Vec<Dev> = vec![];
    let layer_params = mlp.params();
    for i in 0..n_dev {
        let physical = backend.get_device(backend.placement(i, n_dev))?;
        let device = backend.new_virtual_device(&physical)?;
        let root = backend.init(&device)?;
        let (ctx, rs) = backend.link_batch(&[], &root, &batch)?;
        let mut rs = rs
            .into_iter()
            .zip(&names)
            .map(|(r, n)| r.ok_or_else(|| Error::Usage(format!("routine {n} was not linked"))))
            .collect::<Result<Vec<Routine>>>()?;
        let [update, infer, pack_params]: [Routine; 3] =
            rs.split_off(1 + merges).try_into().map_err(|_| {
                Error::Usage("compile_batch returned the wrong number of routines".into())
            })?;
        let grad = rs.remove(0);
        let mut initial = vec![&data_x, &data_t];
        initial.extend(&layer_params);
        if leaders.contains(&i) {
            // The leaders update and evaluate.
            initial.extend([&lr_schedule, &eval_x]);
        }
        for tn in initial {
            if !backend.from_host(&ctx, tn)? {
                return usage(format!("tensor {} is not on device {i}", tn.name()));
            }
        }
        // The gradient routine starts from the parameters' fusion buffer.
        pack_params.schedule()?;
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
    let merged: Vec<&Tnode> = std::iter::once(grads.flat()).chain(&sums).collect();
    let plan = Plan::new(
        backend,
        devs,
        &layout,
        (slot, step),
        (&merged, params.flat()),
        cfg.merge,
    )?;
    let devs = &plan.devs;
    let setup_time = t0.elapsed();

    // Training: the host only schedules; devices order their work among themselves with
    // events, so the host runs ahead of them (up to the queues' capacity) and waits only
    // for the loss history at the end of each epoch, one epoch late.
    let mut phases = PhaseTimes::default();
    let mut waiting = Duration::ZERO;
    let mut epoch_losses = vec![];
    let mut order_rng = Rng::new(cfg.seed.wrapping_mul(0x9E37_79B9).wrapping_add(7));
    let mut s = 0usize;
    // The epoch whose loss history is on its way to the host, and the event after the copy.
    let mut readback: Option<(usize, Event)> = None;
    let t_train = Instant::now();
    for epoch in 0..=cfg.epochs {
        if epoch < cfg.epochs {
            let t = Instant::now();
            for k in order_rng.permutation(per_epoch) {
                plan.schedule_step(backend, k, s)?;
                s += 1;
            }
            phases.scheduling += t.elapsed();
        }
        // The previous epoch's losses: wait for them while this epoch runs.
        if let Some((e, ev)) = readback.take() {
            let t = Instant::now();
            backend.await_event(&ev)?;
            waiting += t.elapsed();
            let values = history
                .host_values()
                .ok_or_else(|| Error::Usage("the loss history is not hosted".into()))?;
            let epoch_steps = values
                .get(e * per_epoch..(e + 1) * per_epoch)
                .ok_or_else(|| Error::Usage("the loss history is too short".into()))?;
            let mean = epoch_steps.iter().sum::<f64>() / per_epoch as f64;
            epoch_losses.push(mean);
            phases.loss_readback += t.elapsed();
            on_epoch(e + 1, mean);
        }
        if epoch < cfg.epochs {
            // Every rank makes the same calls; each runs only on its own leader.
            for &l in &readers {
                backend.to_host(&devs[l].ctx, &history)?;
            }
            readback = Some((epoch, backend.record_event(&devs[me].device)));
        }
    }
    // The last parameter copies, and any failure.
    let t = Instant::now();
    for d in devs {
        backend.await_device(&d.device)?;
    }
    waiting += t.elapsed();
    let train_time = t_train.elapsed();
    phases.waiting = waiting;

    // Evaluation on device 0 (on every rank's leader: their parameters are the same).
    let t0 = Instant::now();
    for &l in &readers {
        let d = &devs[l];
        d.infer.schedule()?;
        backend.to_host(&d.ctx, &scores)?;
        for p in &layer_params {
            backend.to_host(&d.ctx, p)?;
        }
    }
    backend.await_device(&devs[me].device)?;
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
        ranks,
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
