//! The two-moons demo (OCANNL's `moons_demo_parallel`): a 2-H-H-1 ReLU MLP trained with a
//! hinge loss and SGD, data-parallel over the virtual devices of any [`Backend`].
//!
//! One training step on `N` devices:
//! 1. every device runs the gradient routine on its slice of the batch (the dataset is
//!    resident on every device as `[slots, batch/N, 2]`; a static index `slot` selects the
//!    slice, so a step copies nothing from the host);
//! 2. the gradients (and the loss) are added up, always with the association of a pairwise
//!    tree into device 0: in rounds with stride 1, 2, 4, ..., the sum of device
//!    `from = to + stride` is added to that of `to` through `to`'s merge buffer (`Streaming`:
//!    `to` reads `from`'s buffer; `Copy`: `from`'s buffer is copied into `to`'s merge buffer);
//! 3. the SGD update (the learning rate comes from a schedule tensor indexed by the static
//!    index `step`) records the step's loss;
//! 4. every device ends the step with the same parameters.
//!
//! The gradients and the loss travel as one tensor, and so do the parameters (fusion
//! buffers, [`Bucket`]). The parameters' bucket is the model's only state: every routine
//! unpacks the parameters it reads from it, so the per-layer tensors stay local to the
//! routines' code ([`Mlp::new_unstored`]). So a merge is one transfer and one routine and a
//! parameter copy one transfer, whatever the number of layers.
//!
//! Three ways to run the steps ([`Schedule`]), with the same results bit for bit:
//! - **The exchange** ([`Schedule::Exchange`]), what [`Schedule::Auto`] runs on one rank
//!   when the devices sharing each queue (core) form aligned blocks of `2^a` consecutive
//!   devices and there are `2^b` blocks: each device on a core of its own, blocks of devices
//!   per core, or every device on the sync backend's one queue. Each queue runs the whole
//!   training as one task: per step its devices' gradients, the tree of its block into its
//!   first device (the leader), then `b` rounds of recursive doubling between leaders (a
//!   leader adds its partner leader's partial sum to its own; `a + b == b + a` exactly, so
//!   both hold the tree's sum), the update on each leader, and copies of the leader's
//!   parameters to the rest of its block. Sums a partner reads have two rows, used on
//!   alternate steps, so no write-after-read wait is needed (see the `Exchange` type).
//! - **The tree as programs** ([`Schedule::Tree`]), what `Auto` runs on one rank otherwise
//!   (a number of devices that is not a power of two, or blocks of different sizes): the
//!   merges into device 0, its update, and copies of its parameters to the other devices,
//!   again one task per queue for the whole training (see the `TreeProgram` type).
//! - **The host-scheduled tree** ([`Schedule::HostTree`]), what runs over several ranks: the
//!   same tree, one task per device and phase, scheduled by the host step by step. The host
//!   never waits for a device inside a step: devices order their work among themselves with
//!   events ([`Backend::record_event`]); a merge target waits for its source's gradients, and
//!   every device other than 0 waits for device 0's update before copying the parameters (the
//!   rules are spelled out on the step scheduler in the source). The host waits only for the
//!   loss history of each epoch, one epoch late, and for every device at the end.
//!
//! In the programs, queues wait for each other through [`Progress`] counts, without a task
//! boundary, and the host schedules one task per queue, then sleeps until the training ends,
//! waking every 100 ms to report the finished epochs' losses.
//!
//! On a backend with several ranks ([`Backend::num_ranks`]: the MPI backend), the `N` devices
//! are spread over the `R` ranks in blocks of `N / R` ([`Backend::placement`]); the tree
//! merges each rank's block into its first device (the rank's *leader*), the leaders then
//! all-reduce the gradients and the loss ([`Backend::all_reduce`], `MPI_Allreduce`), every
//! leader applies the same SGD update (so the parameters stay identical on every rank) and
//! copies the parameters to the other devices of its block: the Horovod pattern.
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

use super::{binop, copy, merge_add, unop, Bucket, Mlp, Rng};
use crate::backend::{
    Backend, BufferPtr, Config, Context, Device, Event, MergeBufferUse, Progress, Routine, Task,
    Transfer,
};
use crate::error::{Error, Result};
use crate::ir::einsum;
use crate::ir::{
    Assignments, Bindings, Binop, Buffer, InitOp, MemoryMode, Prec, StaticSymbol, Tnode, Unop,
};
use std::sync::Arc;
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
    /// How the steps run (see the [module documentation](self)): [`Schedule::Auto`] (the
    /// default), [`Schedule::Tree`] or [`Schedule::HostTree`]. All give the same results, bit
    /// for bit.
    pub schedule: Schedule,
}

/// How the training steps run (see the [module documentation](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Schedule {
    /// The exchange where the devices allow it, else the tree, both as one program per
    /// device queue; the host-scheduled tree over several ranks.
    #[default]
    Auto,
    /// The hierarchical exchange, one program per device queue; an error where the devices
    /// do not allow it.
    Exchange,
    /// The tree into device 0, one program per device queue (on one rank; the
    /// host-scheduled tree over several).
    Tree,
    /// The tree into device 0, scheduled by the host step by step.
    HostTree,
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
            schedule: Schedule::Auto,
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
    /// How the steps ran: [`Schedule::Exchange`], [`Schedule::Tree`] or
    /// [`Schedule::HostTree`] (see [`TrainConfig::schedule`]).
    pub schedule: Schedule,
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
    /// The tree: one routine adding the fused gradients (and loss) in the merge buffer to
    /// this device's. The exchange: the merge within a queue, then one routine per round
    /// but the last (which is `update`'s).
    merges: Vec<Routine>,
    update: Routine,
    infer: Routine,
}

/// The transfer of a merge's source into the target's merge buffer, and the routine adding it.
type MergeWork = Arc<(Transfer, Routine)>;

/// One merge of the tree: `to` adds `from`'s gradients (and loss) to its own.
struct MergeJob {
    to: usize,
    from: usize,
    description: Arc<str>,
    /// The transfer of the fused gradients into `to`'s merge buffer, then the routine adding
    /// them.
    work: MergeWork,
}

/// The copy of the fused parameters from device 0 to device `to`.
struct CopyJob {
    to: usize,
    description: Arc<str>,
    work: Arc<Transfer>,
}

/// What a training step schedules, prepared once: the devices' routines, and the transfers
/// of the merge tree and of the parameter copies, checked when prepared.
struct Plan {
    devs: Vec<Dev>,
    slot: StaticSymbol,
    step: StaticSymbol,
    /// In tree order within each rank's group: rounds with stride 1, 2, 4, ...
    merges: Vec<MergeJob>,
    /// The first device of each rank's group (device 0 on the in-process backends).
    leaders: Vec<usize>,
    /// What the leaders all-reduce across ranks (the fused gradients and loss), when there are
    /// several ranks, and the leaders' contexts.
    all_reduce: Option<(Vec<Tnode>, Vec<Context>)>,
    copies: Vec<CopyJob>,
    /// Instead of the tree, merges and copies: the exchange (see [`Exchange`]).
    exchange: Option<Arc<Exchange>>,
}

/// The exchange: the training as one program per device queue, used on one rank when the
/// devices on each queue form aligned blocks of the same size, a power of two, and their
/// number is a power of two too (each device on a queue of its own; blocks of consecutive
/// devices per core; every device on one queue on the sync backend).
///
/// Per step, every queue computes its devices' gradients, adds them up in a tree into its
/// first device (the *leader*), then the leaders exchange partial sums by recursive
/// doubling: in round `r` (stride `2^(r-1)` groups) a leader adds its partner's partial sum
/// to its own. Every leader then holds the sum of all the gradients and applies the same
/// update; the other devices of its queue copy the leader's parameters. The sums have the
/// tree's association (a block's tree, then each round adds two sums of the same blocks,
/// with `a + b == b + a` exactly), so the results are the tree's, bit for bit, whatever the
/// grouping.
///
/// Leaders read each other's sums without copying them (`Streaming`) or through their merge
/// buffers (`Copy`). A round writes a tensor of its own, read only by the next round's
/// partner, and every tensor a partner reads has two rows, row `s % 2` at step `s`: a
/// leader overwrites a row only two steps later, after waiting for its partner's next-step
/// value, which the partner computes after reading. So each round needs one wait, for the
/// partner's previous stage, and no write-after-read waits.
struct Exchange {
    slot: StaticSymbol,
    step: StaticSymbol,
    parity: StaticSymbol,
    /// Per device, the gradient routine.
    grads: Vec<Routine>,
    groups: Vec<Group>,
}

/// The devices of one queue in the exchange.
struct Group {
    /// Consecutive devices, the leader first.
    members: Vec<usize>,
    /// The tree into the leader, in order.
    local: Vec<Merge>,
    /// The leader's rounds with the other groups' leaders.
    rounds: Vec<Merge>,
    /// The leader's update, with the last round before it in one routine (without rounds,
    /// the copy of the leader's row as the merged sum).
    update: Routine,
    /// The parameters from the leader to the other members.
    copies: Vec<(String, Transfer)>,
}

/// One merge of the exchange: the transfer of `from`'s sum into the merge buffer of the
/// device running `routine`, which adds it to its own.
struct Merge {
    /// The group whose progress to wait for (rounds only).
    from_group: usize,
    description: String,
    transfer: Transfer,
    routine: Routine,
}

impl Exchange {
    /// Runs the whole training of group `gi` (the devices of one queue), as one task on that
    /// queue: for each step, the members' gradients, the tree into the leader, the leader's
    /// rounds (each waiting for the partner's previous stage through its [`Progress`]), the
    /// update, and the parameter copies. `progress[g]` counts group `g`'s finished stages
    /// (`rounds + 1` per step); group 0 also copies the loss history to the host at the end
    /// of each epoch and advances `epochs`. On any failure (or panic) every count fails, so
    /// that no queue and not the host waits forever.
    fn run_group(&self, run: &Run, gi: usize) -> Result<()> {
        let mut exit = FailOnExit(run, false);
        let g = &self.groups[gi];
        let n_dev = self.grads.len();
        let stages = g.rounds.len() as u64 + 1;
        let with_parity = |r: &Routine, parity: i64| -> Result<()> {
            r.bindings().set_symbol(&self.parity, parity)?;
            part(r.name(), r.run_in_task())
        };
        for (s, &k) in run.order.iter().enumerate() {
            let parity = (s % 2) as i64;
            for &i in &g.members {
                let grad = &self.grads[i];
                grad.bindings()
                    .set_symbol(&self.slot, (k * n_dev + i) as i64)?;
                with_parity(grad, parity)?;
            }
            for m in &g.local {
                part(&m.description, m.transfer.run())?;
                with_parity(&m.routine, parity)?;
            }
            run.progress[gi].advance();
            // The last round runs the update too.
            g.update.bindings().set_symbol(&self.step, s as i64)?;
            for (r, m) in g.rounds.iter().enumerate() {
                run.progress[m.from_group].wait_for(s as u64 * stages + r as u64 + 1)?;
                part(&m.description, m.transfer.run())?;
                with_parity(&m.routine, parity)?;
                run.progress[gi].advance();
            }
            if g.rounds.is_empty() {
                with_parity(&g.update, parity)?;
            }
            for (what, copy) in &g.copies {
                part(what, copy.run())?;
            }
            if gi == 0 {
                run.end_of_step(s)?;
            }
        }
        exit.1 = true;
        Ok(())
    }
}

/// How often the host reports the epochs' losses while the programs run (it sleeps in
/// between).
const REPORT_EVERY: Duration = Duration::from_millis(100);

/// The exchange's tensors of gradient sums: `rows[r]` (two rows, one per step parity) is
/// what round `r + 1` reads (`rows[0]`: each device's gradients, summed in place by the
/// tree into its leader); `merged` (one row) is what the update reads.
struct Sums {
    rows: Vec<Tnode>,
    merged: Tnode,
    /// The rounds between leaders: log2 of the number of groups.
    rounds: usize,
}

/// What the queue programs of the exchange share (see `Exchange::run_group`).
struct Run {
    /// The batch of each step.
    order: Vec<usize>,
    per_epoch: usize,
    /// The exchange: per group, its finished stages. The tree: per device, the steps whose
    /// sum of its subtree is final.
    progress: Vec<Progress>,
    /// The tree: the steps device 0 has updated the parameters of.
    updated: Progress,
    /// Epochs whose loss history device 0 has copied to the host.
    epochs: Progress,
    history: Tnode,
    /// Device 0's buffer of the loss history.
    history_buffer: BufferPtr,
}

impl Run {
    /// Device 0's end of step `s`: at the end of an epoch, the loss history to the host.
    fn end_of_step(&self, s: usize) -> Result<()> {
        if (s + 1).is_multiple_of(self.per_epoch) {
            self.history
                .with_host_mut(|a| self.history_buffer.read_ndarray(a))
                .unwrap_or(Ok(()))?;
            self.epochs.advance();
        }
        Ok(())
    }
}

/// The tree as one program per device queue, for one rank when the exchange does not fit
/// (see `TreeProgram::run_group`): the same merges, update and copies as the host-scheduled
/// tree, in the same order, with waits on [`Progress`] counts instead of events.
struct TreeProgram {
    slot: StaticSymbol,
    step: StaticSymbol,
    /// Per device, the gradient routine, and its queue.
    grads: Vec<Routine>,
    queue: Vec<Option<usize>>,
    /// The tree's merges, in order: `(to, from, work)`.
    merges: Vec<(usize, usize, MergeWork)>,
    /// Per device, how many merges add into it.
    incoming: Vec<usize>,
    /// Device 0's update.
    update: Routine,
    /// The parameter copies from device 0: `(to, what, transfer)`.
    copies: Vec<(usize, Arc<str>, Arc<Transfer>)>,
    /// The devices by queue.
    groups: Vec<Vec<usize>>,
}

impl TreeProgram {
    /// Runs the whole training of the devices `groups[gi]` (one queue), as one task on it:
    /// per step, their gradients, the merges into them (waiting, for a source on another
    /// queue, until its own merges are done: `progress[from]` counts the steps whose sum of
    /// its subtree is final), device 0's update (then `updated` advances), and the copies of
    /// device 0's parameters into them (waiting for `updated` on another queue than device
    /// 0's). A queue does its merges in the tree's order (stride 1, 2, 4, ...), and a merge
    /// waits only for subtrees of smaller strides, so no two queues wait for each other. The
    /// write-after-read rules are the host-scheduled tree's (see `Plan::schedule_step`). On
    /// any failure (or panic) every count fails.
    fn run_group(&self, run: &Run, gi: usize) -> Result<()> {
        let mut exit = FailOnExit(run, false);
        let members = &self.groups[gi];
        let n_dev = self.grads.len();
        let mine = |i: usize| self.queue[i] == self.queue[members[0]];
        let mut left = vec![0usize; n_dev];
        for (s, &k) in run.order.iter().enumerate() {
            let done = s as u64 + 1;
            for &i in members {
                let g = &self.grads[i];
                g.bindings()
                    .set_symbol(&self.slot, (k * n_dev + i) as i64)?;
                part(g.name(), g.run_in_task())?;
                left[i] = self.incoming[i];
                if left[i] == 0 {
                    run.progress[i].advance();
                }
            }
            for (to, from, work) in &self.merges {
                if !mine(*to) {
                    continue;
                }
                if !mine(*from) {
                    run.progress[*from].wait_for(done)?;
                }
                let (t, r) = &**work;
                part(t.description(), t.run())?;
                part(r.name(), r.run_in_task())?;
                left[*to] -= 1;
                if left[*to] == 0 {
                    run.progress[*to].advance();
                }
            }
            if mine(0) {
                self.update.bindings().set_symbol(&self.step, s as i64)?;
                part(self.update.name(), self.update.run_in_task())?;
                run.updated.advance();
            }
            for (to, what, copy) in &self.copies {
                if mine(*to) {
                    run.updated.wait_for(done)?;
                    part(what, copy.run())?;
                }
            }
            if mine(0) {
                run.end_of_step(s)?;
            }
        }
        exit.1 = true;
        Ok(())
    }
}

/// A training run as one program per queue.
#[derive(Clone)]
enum Program {
    Exchange(Arc<Exchange>),
    Tree(Arc<TreeProgram>),
}

impl Program {
    /// The devices of each queue, the first one's queue running the group's program.
    fn groups(&self) -> Vec<Vec<usize>> {
        match self {
            Program::Exchange(x) => x.groups.iter().map(|g| g.members.clone()).collect(),
            Program::Tree(t) => t.groups.clone(),
        }
    }

    fn run_group(&self, run: &Run, gi: usize) -> Result<()> {
        match self {
            Program::Exchange(x) => x.run_group(run, gi),
            Program::Tree(t) => t.run_group(run, gi),
        }
    }
}

/// Fails every count of a run unless disarmed (`.1 = true`): a program that stops early
/// (an error or a panic) must not leave another queue or the host waiting.
struct FailOnExit<'a>(&'a Run, bool);

impl Drop for FailOnExit<'_> {
    fn drop(&mut self) {
        if !self.1 {
            self.0.progress.iter().for_each(Progress::fail);
            self.0.updated.fail();
            self.0.epochs.fail();
        }
    }
}

/// The exchange's groups for devices on these queues (`queue[i]`: device `i`'s queue), when
/// they qualify (see [`Exchange`]): `n` devices in aligned blocks of `2^a` per queue, `2^b`
/// blocks. `None` otherwise.
fn exchange_groups(queue: &[Option<usize>]) -> Option<Vec<Vec<usize>>> {
    let groups = queue_groups(queue);
    let size = groups.first()?.len();
    let blocks = groups
        .iter()
        .all(|g| g.len() == size && g.windows(2).all(|w| w[1] == w[0] + 1));
    let ok = queue.len().is_power_of_two()
        && size.is_power_of_two()
        && groups.len().is_power_of_two()
        && blocks;
    ok.then_some(groups)
}

/// The queue a device's tasks run on: its physical device's worker, or `None` for the
/// devices without one (which run tasks on the scheduling thread, all alike).
fn queue_of(d: &Device) -> Option<usize> {
    d.has_worker().then(|| d.physical().ordinal())
}

/// The devices by queue (`queue[i]`: device `i`'s), in order of first appearance, each in
/// device order.
fn queue_groups(queue: &[Option<usize>]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = vec![];
    for (i, q) in queue.iter().enumerate() {
        match groups.iter_mut().find(|g| queue[g[0]] == *q) {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    groups
}

/// Runs a transfer or a routine of a job, naming it in a failure.
fn part(what: &str, r: Result<()>) -> Result<()> {
    r.map_err(|e| Error::Usage(format!("{what}: {e}")))
}

impl Plan {
    fn new(
        backend: &dyn Backend,
        devs: Vec<Dev>,
        (slot, step): (StaticSymbol, StaticSymbol),
        grads: &Tnode,
        params: &Tnode,
        merge: MergeBufferUse,
        exchange: Option<(StaticSymbol, Sums, Vec<Vec<usize>>)>,
    ) -> Result<Plan> {
        if let Some((parity, sums, groups)) = exchange {
            let prepare = |tn: &Tnode, mode, to: &Routine, from: &Dev| {
                backend
                    .prepare_transfer(tn, mode, to.context(), &from.ctx)?
                    .ok_or_else(|| Error::Usage(format!("{} is not on a device", tn.name())))
            };
            let mut out = vec![];
            for (gi, members) in groups.iter().enumerate() {
                let leader = &devs[members[0]];
                // The tree into the leader: rounds with stride 1, 2, 4, ... within the block.
                let mut local = vec![];
                let mut stride = 1;
                while stride < members.len() {
                    for l in (0..members.len()).step_by(2 * stride) {
                        let (to, from) = (&devs[members[l]], &devs[members[l + stride]]);
                        local.push(Merge {
                            from_group: gi,
                            description: format!(
                                "merge the gradients of {} into {}",
                                from.device.name(),
                                to.device.name()
                            ),
                            transfer: prepare(&sums.rows[0], merge, &to.merges[0], from)?,
                            routine: to.merges[0].clone(),
                        });
                    }
                    stride *= 2;
                }
                let mut rounds = vec![];
                for r in 0..sums.rounds {
                    let pg = gi ^ (1 << r);
                    let partner = &devs[groups[pg][0]];
                    // The last round is the update's routine (see `train`).
                    let routine = if r + 1 == sums.rounds {
                        leader.update.clone()
                    } else {
                        leader.merges[1 + r].clone()
                    };
                    rounds.push(Merge {
                        from_group: pg,
                        description: format!(
                            "exchange round {} of {} with {}",
                            r + 1,
                            leader.device.name(),
                            partner.device.name()
                        ),
                        transfer: prepare(&sums.rows[r], merge, &routine, partner)?,
                        routine,
                    });
                }
                let mut copies = vec![];
                for &i in &members[1..] {
                    let d = &devs[i];
                    let copy = backend
                        .prepare_transfer(params, MergeBufferUse::No, &d.ctx, &leader.ctx)?
                        .ok_or_else(|| {
                            Error::Usage(format!(
                                "parameters {} are not on a device",
                                params.name()
                            ))
                        })?;
                    copies.push((
                        format!(
                            "copy the parameters from {} to {}",
                            leader.device.name(),
                            d.device.name()
                        ),
                        copy,
                    ));
                }
                out.push(Group {
                    members: members.clone(),
                    local,
                    rounds,
                    update: leader.update.clone(),
                    copies,
                });
            }
            let exchange = Arc::new(Exchange {
                slot: slot.clone(),
                step: step.clone(),
                parity,
                grads: devs.iter().map(|d| d.grad.clone()).collect(),
                groups: out,
            });
            return Ok(Plan {
                devs,
                slot,
                step,
                merges: vec![],
                leaders: vec![0],
                all_reduce: None,
                copies: vec![],
                exchange: Some(exchange),
            });
        }
        let ranks = backend.num_ranks().max(1);
        let group = devs.len() / ranks;
        let leaders: Vec<usize> = (0..ranks).map(|r| r * group).collect();
        let mut merges = vec![];
        for &base in &leaders {
            let mut stride = 1;
            while stride < group {
                for local in (0..group).step_by(2 * stride) {
                    if local + stride >= group {
                        continue;
                    }
                    let (to, from) = (base + local, base + local + stride);
                    let (dt, df) = (&devs[to], &devs[from]);
                    let t = backend
                        .prepare_transfer(grads, merge, dt.merges[0].context(), &df.ctx)?
                        .ok_or_else(|| {
                            Error::Usage(format!("gradients {} are not on a device", grads.name()))
                        })?;
                    let work = (t, dt.merges[0].clone());
                    merges.push(MergeJob {
                        to,
                        from,
                        description: format!(
                            "merge the gradients of {} into {}",
                            df.device.name(),
                            dt.device.name()
                        )
                        .into(),
                        work: Arc::new(work),
                    });
                }
                stride *= 2;
            }
        }
        let mut copies = vec![];
        for (to, d) in devs.iter().enumerate() {
            let leader = &devs[to / group * group];
            if to % group == 0 {
                continue;
            }
            let work = backend
                .prepare_transfer(params, MergeBufferUse::No, &d.ctx, &leader.ctx)?
                .ok_or_else(|| {
                    Error::Usage(format!("parameters {} are not on a device", params.name()))
                })?;
            copies.push(CopyJob {
                to,
                description: format!("copy the parameters from {}", leader.device.name()).into(),
                work: Arc::new(work),
            });
        }
        let all_reduce = (ranks > 1).then(|| {
            let ctxs = leaders.iter().map(|&l| devs[l].ctx.clone()).collect();
            (vec![grads.clone()], ctxs)
        });
        Ok(Plan {
            devs,
            slot,
            step,
            merges,
            leaders,
            all_reduce,
            copies,
            exchange: None,
        })
    }

    /// The tree as one program per queue (one rank; see [`TreeProgram`]).
    fn tree_program(&self) -> TreeProgram {
        let queue: Vec<Option<usize>> = self.devs.iter().map(|d| queue_of(&d.device)).collect();
        let groups = queue_groups(&queue);
        let mut incoming = vec![0; self.devs.len()];
        for m in &self.merges {
            incoming[m.to] += 1;
        }
        TreeProgram {
            slot: self.slot.clone(),
            step: self.step.clone(),
            grads: self.devs.iter().map(|d| d.grad.clone()).collect(),
            queue,
            merges: self
                .merges
                .iter()
                .map(|m| (m.to, m.from, m.work.clone()))
                .collect(),
            incoming,
            update: self.devs[0].update.clone(),
            copies: self
                .copies
                .iter()
                .map(|c| (c.to, c.description.clone(), c.work.clone()))
                .collect(),
            groups,
        }
    }

    /// Schedules training step `s` on batch `k` of the epoch (module documentation),
    /// ordering the devices' work with events instead of awaiting them:
    /// - a merge target waits for its source's event (the source's gradients are final), so
    ///   it reads them after they are written; the source writes them again only in the next
    ///   step, after its parameter copy, which waits for device 0's update, which comes after
    ///   every merge (each target is merged onward into device 0 later in the tree);
    /// - every other device waits for device 0's event after the update before copying the
    ///   parameters; device 0 overwrites them in the next update only after every device's
    ///   next gradients were merged into it, which each device computes after its copy.
    ///
    /// One task per device and phase: the transfers and merge routines of a merge, and the
    /// copies of the parameters, run inside one task.
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
        // 2. Tree merge into device 0.
        for job in &self.merges {
            let source = backend.record_event(&devs[job.from].device);
            let work = job.work.clone();
            backend.schedule(
                &devs[job.to].device,
                Task::new(job.description.clone(), move || {
                    source.wait();
                    let (t, r) = &*work;
                    part(t.description(), t.run())?;
                    part(r.name(), r.run_in_task())
                }),
            )?;
        }
        // 3. Across ranks: the leaders' gradients and losses are all-reduced (MPI).
        if let Some((nodes, ctxs)) = &self.all_reduce {
            backend.all_reduce(nodes, ctxs)?;
        }
        // 4. Update on every leader (device 0 on the in-process backends; on MPI every rank
        //    applies the same update to the same parameters, so they stay identical).
        let mut updated = vec![];
        for &l in &self.leaders {
            let d = &devs[l];
            d.update.bindings().set_symbol(&self.step, s as i64)?;
            d.update.schedule()?;
            updated.push(backend.record_event(&d.device));
        }
        // 5. Parameters from the leader to the other devices of its group.
        let group = n_dev / self.leaders.len();
        for job in &self.copies {
            let (updated, work) = (updated[job.to / group].clone(), job.work.clone());
            backend.schedule(
                &devs[job.to].device,
                Task::new(job.description.clone(), move || {
                    updated.wait();
                    part(work.description(), work.run())
                }),
            )?;
        }
        Ok(())
    }
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
    let ranks = backend.num_ranks().max(1);
    if !n_dev.is_multiple_of(ranks) {
        return usage(format!(
            "{n_dev} devices cannot be spread evenly over {ranks} ranks (the devices are the \
             total over all ranks)"
        ));
    }
    let group = n_dev / ranks;
    // This rank's group leader: the device whose results this process reads.
    let me = backend.rank() * group;
    let prec = cfg.prec;
    let m = cfg.batch / n_dev;
    let per_epoch = data.len() / cfg.batch;
    let slots = per_epoch * n_dev;
    let steps = per_epoch * cfg.epochs;
    let used = per_epoch * cfg.batch;

    // The model and the tensors resident on the devices.
    // Parameters and gradients live in fusion buffers only (see below): the routines unpack
    // what they read, so the per-layer tensors stay local to their code.
    let mlp = Mlp::new_unstored(&[2, cfg.hidden, cfg.hidden, 1], prec, cfg.seed)?;
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
    let loss = Tnode::new(&["loss"], &[1], prec)?;
    let history = Tnode::hosted(&["loss_history"], &[steps], prec)?;

    let slot = StaticSymbol::new("slot", Some(slots));
    let step = StaticSymbol::new("step", Some(steps));
    let bindings = Bindings(vec![slot.clone(), step.clone()]);

    // Fusion buffers: the gradients and the loss travel between devices as one tensor, and
    // so do the parameters, so a merge is one transfer and one routine, and a parameter copy
    // one transfer, whatever the number of layers. The parameters' bucket is the model's only
    // state: it starts from the host (the initial values) and ends there.
    let grads = Bucket::on_device(
        &["grads"],
        &mlp.grads()
            .into_iter()
            .chain([loss.clone()])
            .collect::<Vec<_>>(),
    )?;
    let params = Bucket::hosted(&["params"], &mlp.params())?;
    params
        .flat()
        .set_host_values(&mlp.initial_values().concat())?;
    // The devices first: whether the exchange fits (see `Exchange`) depends on their queues.
    let t_setup = Instant::now();
    let mut devices = vec![];
    for i in 0..n_dev {
        let physical = backend.get_device(backend.placement(i, n_dev))?;
        devices.push(backend.new_virtual_device(&physical)?);
    }
    let queues: Vec<Option<usize>> = devices.iter().map(queue_of).collect();
    let in_process = ranks == 1 && !devices.iter().any(Device::is_remote);
    let groups = if matches!(cfg.schedule, Schedule::Auto | Schedule::Exchange) && in_process {
        exchange_groups(&queues)
    } else {
        None
    };
    if groups.is_none() && cfg.schedule == Schedule::Exchange {
        return usage(format!(
            "the exchange needs one rank and a power of two of devices in equal, aligned \
             blocks per queue; {n_dev} devices on queues {queues:?} over {ranks} rank(s) do \
             not fit (Schedule::Auto runs the tree then)"
        ));
    }
    let exchange = match groups {
        None => None,
        Some(groups) => {
            let parity = StaticSymbol::new("parity", Some(2));
            let n = grads.flat().dims()[0];
            let rounds = groups.len().trailing_zeros() as usize;
            let on_device = |label: &str, dims: &[usize]| {
                Tnode::builder(&["grads", label], dims, prec)
                    .memory(MemoryMode::OnDevice)
                    .build()
            };
            let rows = (0..rounds.max(1))
                .map(|r| on_device(&format!("sum{r}"), &[2, n]))
                .collect::<Result<Vec<Tnode>>>()?;
            let sums = Sums {
                rows,
                merged: on_device("merged", &[n])?,
                rounds,
            };
            Some((parity, sums, groups))
        }
    };
    let setup_devices = t_setup.elapsed();
    let bindings = match &exchange {
        Some((parity, _, _)) => Bindings(vec![slot.clone(), step.clone(), parity.clone()]),
        None => bindings,
    };
    let second = if exchange.is_some() {
        "merge_and_update"
    } else {
        "sgd_update"
    };
    let mut names: Vec<String> = ["grad", second, "infer"].map(String::from).into();
    // The update unpacks the merged gradients and loss into tensors of its own (not the
    // gradient routine's), so that the two routines share only the fused tensors and the
    // parameters: the unpacked ones stay local to the update's code.
    let applied = grads
        .parts()
        .iter()
        .map(|(t, _)| Tnode::new(&[&t.name(), "merged"], t.dims(), prec))
        .collect::<Result<Vec<Tnode>>>()?;
    let update = |merged: &Tnode| -> Result<Assignments> {
        let (merged_loss, merged_grads) = applied
            .split_last()
            .ok_or_else(|| Error::Usage("no gradients".into()))?;
        let record = copy(
            &history,
            merged_loss,
            einsum::projections(
                "0->{step}",
                history.dims(),
                &[merged_loss.dims()],
                &bindings,
            )?,
        );
        Ok(Assignments::seq([
            params.unpack()?,
            grads.unpack_from(merged, &applied)?,
            mlp.sgd_routine_with(merged_grads, &lr_schedule, &step, cfg.weight_decay)?,
            Assignments::block("record the step's loss", record),
            params.pack()?,
        ]))
    };
    let projections = |spec: &str, to: &Tnode, from: &[&Tnode]| {
        let dims: Vec<&[usize]> = from.iter().map(|t| t.dims()).collect();
        einsum::projections(spec, to.dims(), &dims, &bindings)
    };
    // Round `r` of the exchange (1-based): the partner's previous sum added to this leader's.
    let round = |sums: &Sums, r: usize| -> Result<Assignments> {
        let from = &sums.rows[r - 1];
        let (to, spec) = if r < sums.rounds {
            (&sums.rows[r], "{parity}i,{parity}i->{parity}i")
        } else {
            (&sums.merged, "{parity}i,{parity}i->i")
        };
        Ok(Assignments::block(
            &format!("exchange round {r}"),
            binop(
                false,
                Binop::Arg2,
                Binop::Add,
                to,
                Buffer::Node(from.clone()),
                Buffer::MergeBuffer(from.clone()),
                projections(spec, to, &[from, from])?,
            ),
        ))
    };
    // What makes the merged sum: the last round, or without rounds the leader's own row.
    let last_merge = |sums: &Sums| -> Result<Assignments> {
        if sums.rounds > 0 {
            return round(sums, sums.rounds);
        }
        let row = &sums.rows[0];
        Ok(Assignments::block(
            "the leader's row of gradient sums, as merged",
            copy(
                &sums.merged,
                row,
                projections("{parity}i->i", &sums.merged, &[row])?,
            ),
        ))
    };
    let mut code = match &exchange {
        Some((parity, sums, _)) => vec![
            Assignments::seq([
                params.unpack()?,
                mlp.grad_routine(&data_x, &data_t, &slot, &loss, cfg.batch)?,
                grads.pack_into_row(&sums.rows[0], parity)?,
            ]),
            // The last round (or, without rounds, the copy of the leader's row) and the update,
            // in one routine.
            Assignments::seq([last_merge(sums)?, update(&sums.merged)?]),
        ],
        None => vec![
            Assignments::seq([
                params.unpack()?,
                mlp.grad_routine(&data_x, &data_t, &slot, &loss, cfg.batch)?,
                grads.pack()?,
            ]),
            update(grads.flat())?,
        ],
    };
    code.push(Assignments::seq([
        params.unpack()?,
        mlp.infer_routine(&eval_x, &scores)?,
    ]));
    match &exchange {
        Some((_, sums, _)) => {
            // The tree within a queue: a follower's row added to the leader's, in place.
            let row = &sums.rows[0];
            code.push(Assignments::block(
                "merge the gradients and the loss of a device on the same queue",
                unop(
                    false,
                    Binop::Add,
                    Unop::Identity,
                    row,
                    Buffer::MergeBuffer(row.clone()),
                    projections("{parity}i->{parity}i", row, &[row])?,
                ),
            ));
            names.push("local_merge".into());
            // All rounds but the last (which goes with the update).
            for r in 1..sums.rounds {
                code.push(round(sums, r)?);
                names.push(format!("exchange_round{r}"));
            }
        }
        None => {
            code.push(Assignments::block(
                "merge the gradients and the loss",
                merge_add(grads.flat()),
            ));
            names.push("merge_grads".into());
        }
    }

    let t0 = Instant::now();
    let batch = backend.compile_batch(true, Some(&names), None, &bindings, &code)?;
    let compile_time = t0.elapsed();

    // Contexts, routines, initial copies.
    let t0 = Instant::now();
    let mut devs: Vec<Dev> = vec![];
    for (i, device) in devices.into_iter().enumerate() {
        let root = backend.init(&device)?;
        let (ctx, rs) = backend.link_batch(&[], &root, &batch)?;
        let rs = rs
            .into_iter()
            .zip(&names)
            .map(|(r, n)| r.ok_or_else(|| Error::Usage(format!("routine {n} was not linked"))))
            .collect::<Result<Vec<Routine>>>()?;
        let mut rs = rs.into_iter();
        let mut next = || {
            rs.next()
                .ok_or_else(|| Error::Usage("compile_batch returned too few routines".into()))
        };
        let (grad, update, infer) = (next()?, next()?, next()?);
        let merges: Vec<Routine> = rs.collect();
        let initial_params = params.flat();
        let mut initial = vec![&data_x, &data_t, initial_params];
        if i % group == 0 || exchange.is_some() {
            initial.push(&lr_schedule);
        }
        if i % group == 0 {
            initial.push(&eval_x);
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
            merges,
            update,
            infer,
        });
    }
    for d in &devs {
        backend.await_device(&d.device)?;
    }
    let plan = Plan::new(
        backend,
        devs,
        (slot, step),
        grads.flat(),
        params.flat(),
        cfg.merge,
        exchange,
    )?;
    let devs = &plan.devs;
    let setup_time = t0.elapsed() + setup_devices;

    let mut phases = PhaseTimes::default();
    let mut waiting = Duration::ZERO;
    let mut epoch_losses = vec![];
    let mut order_rng = Rng::new(cfg.seed.wrapping_mul(0x9E37_79B9).wrapping_add(7));
    let mut record_epoch = |e: usize, phases: &mut PhaseTimes, t: Instant| -> Result<()> {
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
        Ok(())
    };
    let t_train = Instant::now();
    // One rank, in process: the training as one program per queue (the exchange where it
    // fits, else the tree), unless `cfg.programs` is off.
    let program = match &plan.exchange {
        Some(x) => Some(Program::Exchange(x.clone())),
        None if cfg.schedule != Schedule::HostTree && in_process => {
            Some(Program::Tree(Arc::new(plan.tree_program())))
        }
        None => None,
    };
    let schedule = match &program {
        Some(Program::Exchange(_)) => Schedule::Exchange,
        Some(Program::Tree(_)) => Schedule::Tree,
        None => Schedule::HostTree,
    };
    if let Some(program) = program {
        // The host schedules one task per queue and sleeps until each epoch's loss history
        // is on the host (see `Exchange::run_group`, `TreeProgram::run_group`).
        let t = Instant::now();
        let order: Vec<usize> = (0..cfg.epochs)
            .flat_map(|_| order_rng.permutation(per_epoch))
            .collect();
        let history_buffer = devs[0]
            .ctx
            .get_buffer(&history)
            .ok_or_else(|| Error::Usage("the loss history is not on device 0".into()))?;
        let groups = program.groups();
        let counted: Vec<usize> = match &program {
            Program::Exchange(_) => groups.iter().map(|g| g[0]).collect(),
            Program::Tree(_) => (0..n_dev).collect(),
        };
        let run = Arc::new(Run {
            order,
            per_epoch,
            progress: counted
                .iter()
                .map(|&i| Progress::new(format!("the training on {}", devs[i].device.name())))
                .collect(),
            updated: Progress::new(format!("the updates on {}", devs[0].device.name())),
            epochs: Progress::new("the loss history of device 0"),
            history: history.clone(),
            history_buffer,
        });
        for (gi, members) in groups.iter().enumerate() {
            let description = format!(
                "the training of {}",
                members
                    .iter()
                    .map(|&i| devs[i].device.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let (program, run) = (program.clone(), run.clone());
            backend.schedule(
                &devs[members[0]].device,
                Task::new(description, move || program.run_group(&run, gi)),
            )?;
        }
        phases.scheduling += t.elapsed();
        // The epochs' losses, reported in batches: the host wakes when the training ends or
        // every `REPORT_EVERY`, so that on a short job it does not take a core from the
        // devices once per epoch.
        let mut reported = 0;
        while reported < cfg.epochs {
            let t = Instant::now();
            if run
                .epochs
                .sleep_until_for(cfg.epochs as u64, REPORT_EVERY)
                .is_err()
            {
                // A device failed: its error, not the wait's.
                break;
            }
            waiting += t.elapsed();
            let done = (run.epochs.count() as usize).min(cfg.epochs);
            for e in reported..done {
                record_epoch(e, &mut phases, Instant::now())?;
            }
            reported = done;
        }
    } else {
        // The tree: the host schedules every step; devices order their work among
        // themselves with events, so the host runs ahead of them (up to the queues'
        // capacity) and waits only for the loss history at the end of each epoch, one epoch
        // late.
        let mut s = 0usize;
        // The epoch whose loss history is on its way to the host, and the event after the
        // copy.
        let mut readback: Option<(usize, Event)> = None;
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
                record_epoch(e, &mut phases, t)?;
            }
            if epoch < cfg.epochs {
                // Every rank makes the same calls; each runs only on its own leader.
                for &l in &plan.leaders {
                    backend.to_host(&devs[l].ctx, &history)?;
                }
                readback = Some((epoch, backend.record_event(&devs[me].device)));
            }
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
    for &l in &plan.leaders {
        let d = &devs[l];
        d.infer.schedule()?;
        backend.to_host(&d.ctx, &scores)?;
        backend.to_host(&d.ctx, params.flat())?;
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
    let trained = params
        .flat()
        .host_values()
        .ok_or_else(|| Error::Usage("the parameters are not hosted".into()))?;
    let model = mlp.host_model_from(&trained)?;
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
        schedule,
        compile_time,
        setup_time,
        train_time,
        eval_time,
        phases,
        model,
    })
}
