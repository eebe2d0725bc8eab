//! Data-parallel training of any model over the devices of any [`Backend`]: the multicore
//! backend (a device per core), the sync backend (everything on the calling thread) and the
//! MPI backend (devices spread over ranks).
//!
//! You describe the model ([`Model`]): its parameters with their gradient tensors and
//! initial values, the scalar loss, the data (hosted tensors `[samples, ...]`), the gradient
//! code of one slice of a batch, and the update rule ([`Update::sgd`] with a
//! [`LearningRate`] and weight decay, or [`Update::custom`] code of your own). [`train`]
//! then picks the devices and the schedule, compiles every routine of a step in one batch,
//! runs the training, reports each epoch's loss to a callback, and returns the trained
//! parameters ([`Report::params`]) with timings.
//!
//! # A model of your own
//!
//! Linear regression `y = x·w + b` with a squared loss, on two devices (each takes half of
//! every batch; their gradients are added up, and every device ends the step with the same
//! parameters):
//!
//! ```
//! use arrayjit::backend::MulticoreBackend;
//! use arrayjit::ir::{Bindings, Prec, Tnode};
//! use arrayjit::parallel::{self, Devices, LearningRate, Model, Settings, Slice, Update};
//! use arrayjit::{ir::Assignments, nn};
//!
//! # fn main() -> arrayjit::Result<()> {
//! let f = Prec::Single;
//! // 64 samples of 3 features; targets y = x·[1, -2, 0.5] + 0.3.
//! let xs: Vec<f64> = (0..64 * 3).map(|i| ((i * 37 % 17) as f64 - 8.0) / 8.0).collect();
//! let ys: Vec<f64> = xs.chunks(3).map(|r| r[0] - 2.0 * r[1] + 0.5 * r[2] + 0.3).collect();
//! let (x, y) = (Tnode::hosted(&["x"], &[64, 3], f)?, Tnode::hosted(&["y"], &[64, 1], f)?);
//! x.set_host_values(&xs)?;
//! y.set_host_values(&ys)?;
//! // Parameters and gradients: plain nodes (the module keeps their values).
//! let (w, b) = (Tnode::new(&["w"], &[3, 1], f)?, Tnode::new(&["b"], &[1], f)?);
//! let (gw, gb) = (Tnode::new(&["gw"], &[3, 1], f)?, Tnode::new(&["gb"], &[1], f)?);
//! let loss = Tnode::new(&["loss"], &[1], f)?;
//!
//! // The gradient code of a slice of `s.rows` samples: its share of the batch's mean loss.
//! let (w2, b2, gw2, gb2, loss2) = (w.clone(), b.clone(), gw.clone(), gb.clone(), loss.clone());
//! let gradient = move |s: &Slice| -> arrayjit::Result<Assignments> {
//!     let (x, y, m) = (&s.data[0], &s.data[1], s.rows);
//!     let t = |n: &str, d: &[usize]| Tnode::new(&[n], d, f);
//!     let (z, pred, diff, d) = (t("z", &[m, 1])?, t("pred", &[m, 1])?, t("diff", &[m, 1])?, t("d", &[m, 1])?);
//!     let squares = t("squares", &[1])?;
//!     let none = Bindings::empty();
//!     Ok(Assignments::seq([
//!         nn::matmul(&z, x, &w2, "bi,io->bo", &none)?,
//!         nn::add_bias(&pred, &z, &b2, "bo,o->bo", &none)?,
//!         nn::sub(&diff, &pred, y)?,
//!         // loss = Σ diff² / batch
//!         nn::matmul(&squares, &diff, &diff, "bo,bo->0", &none)?,
//!         nn::scale(&loss2, &squares, 1.0 / s.batch as f64)?,
//!         // d = 2·diff / batch; gw = xᵀ·d; gb = Σ d
//!         nn::scale(&d, &diff, 2.0 / s.batch as f64)?,
//!         nn::matmul(&gw2, x, &d, "bi,bo->io", &none)?,
//!         nn::sum(&gb2, &d, "bo->o", &none)?,
//!     ]))
//! };
//! let model = Model::new()
//!     .param(&w, &gw, vec![0.0; 3])
//!     .param(&b, &gb, vec![0.0])
//!     .loss(&loss)
//!     .data(&x)
//!     .data(&y)
//!     .gradient(gradient)
//!     .update(Update::sgd(LearningRate::Constant(0.2)));
//! let settings = Settings::new(16, 60).devices(Devices::Count(2));
//! let backend = MulticoreBackend::new();
//! let mut losses = vec![];
//! let report = parallel::train(&backend, &model, &settings, &mut |e| losses.push(e.loss))?;
//! assert_eq!(report.devices, 2);
//! assert!(losses[59] < 1e-4 * losses[0], "{losses:?}");
//! let w_trained = &report.params[0];
//! assert!((w_trained[1] + 2.0).abs() < 0.01, "{w_trained:?}");
//! assert!((report.params[1][0] - 0.3).abs() < 0.01);
//! # Ok(())
//! # }
//! ```
//!
//! # What a step does
//!
//! A step trains on one batch of [`Settings::batch`] samples, split into slices:
//! 1. every device runs the gradient code on its slice (the data are resident on every
//!    device as `[slots, rows, ...]` and a static index selects the slice, so a step copies
//!    nothing from the host); the gradient code writes each parameter's gradient and the
//!    loss of its slice, as a share of the batch's mean (see [`Slice`]);
//! 2. the gradients and the loss of the slices are added up (the schedules below differ in
//!    how); they travel as one flat tensor, and so do the parameters (fusion buffers,
//!    [`crate::nn::Bucket`]), so that a merge is one transfer and one routine and a parameter
//!    copy one transfer, whatever the number of tensors;
//! 3. the update rule applies the summed gradients, and the step's loss is recorded (the
//!    learning rate comes from a schedule tensor indexed by the static index of the step);
//! 4. every device ends the step with the same parameters.
//!
//! The parameters' flat tensor is the model's only state: every routine unpacks the
//! parameters it reads from it, so the parameter and gradient tensors the user gives can be
//! plain nodes that stay local to each routine's code.
//!
//! # Schedules
//!
//! [`Settings::schedule`] picks one ([`Schedule`]); [`Schedule::Auto`] picks the fastest that
//! fits. The first three give the same results bit for bit for a given number of devices:
//!
//! - **The exchange** ([`Schedule::Exchange`]), what `Auto` runs on one rank when the
//!   devices sharing each queue (core) form aligned blocks of `2^a` consecutive devices and
//!   there are `2^b` blocks: each device on a core of its own, blocks of devices per core, or
//!   every device on the sync backend's one queue. Each queue runs the whole training as one
//!   task: per step its devices' gradients, the tree of its block into its first device (the
//!   leader), then `b` rounds of recursive doubling between leaders (a leader adds its
//!   partner leader's partial sum to its own; `a + b == b + a` exactly, so both hold the
//!   tree's sum), the update on each leader, and copies of the leader's parameters to the
//!   rest of its block. Sums a partner reads have two rows, used on alternate steps, so no
//!   write-after-read wait is needed. A leader waiting for its partner's sum takes chunks of
//!   the partner's parallel regions meanwhile (it is lent to the partner's thread team), so
//!   a device slowed down by another process on its core gets help with its gradients; the
//!   bits are the same whichever thread runs a chunk ([`Report::lent_chunks`] counts them).
//! - **The tree as programs** ([`Schedule::Tree`]), what `Auto` runs on one rank otherwise (a
//!   number of devices that is not a power of two, or blocks of different sizes): in rounds
//!   with stride 1, 2, 4, ..., the sum of device `to + stride` is added to that of `to`
//!   through `to`'s merge buffer ([`Settings::merge`]: `Streaming` reads the source's buffer
//!   in place, `Copy` copies it first) until device 0 holds the sum; device 0 updates and
//!   its parameters are copied to the other devices; again one task per queue for the whole
//!   training. A queue waiting for another takes chunks of its parallel regions meanwhile,
//!   as in the exchange.
//! - **The host-scheduled tree** ([`Schedule::HostTree`]), what runs over MPI ranks: the same
//!   tree, one task per device and phase, scheduled by the host step by step. The host never
//!   waits for a device inside a step: devices order their work among themselves with events
//!   ([`Backend::record_event`]); the host waits only for the loss history of each epoch, one
//!   epoch late, and for every device at the end. Over `R` ranks, the devices are spread in
//!   blocks of `N / R` ([`Backend::placement`]); the tree merges each rank's block into its
//!   first device, the leaders all-reduce the sums ([`Backend::all_reduce`],
//!   `MPI_Allreduce`), every leader applies the same update and copies the parameters to the
//!   other devices of its block: the Horovod pattern.
//!
//! In the programs (the exchange and the tree), queues wait for each other through
//! [`Progress`] counts, without task boundaries; the host schedules one task per queue, then
//! sleeps until the training ends, waking every 100 ms to report the finished epochs.
//!
//! The sums of these schedules associate by device: on 2 devices `(g0 + g1)`, on 3
//! `((g0 + g1) + g2)` over other slices of the batch, so results differ in the last bits
//! between device counts (and then drift apart over the steps, as float sums do). Where the
//! bits must not depend on the number of devices, use:
//!
//! - **The deterministic schedule** ([`Schedule::Deterministic`]`{ shards }`): the batch is
//!   split into `shards` slices whatever the number of devices (each device takes a
//!   contiguous range of them), each slice's gradient is computed by the same compiled
//!   routine into its own row of a `[shards, n]` tensor, an all-reduce gives every device
//!   every row (each row plus zeros from the other devices: the row itself, exactly), and
//!   every device adds the rows up in shard order (`((r0 + r1) + r2) + ...`) and applies the
//!   update. Nothing in the arithmetic depends on the number of devices, so the losses and
//!   parameters are the same bit for bit on 1, 2, 3 or 8 devices (up to `shards`), on every
//!   backend.
//!
//!   Its cost, against the fast schedules: each device runs the gradient routine once per
//!   shard it owns (`shards / N` runs of `batch / shards` samples instead of one run of
//!   `batch / N`: more fixed costs per step, and smaller loops); the all-reduce moves
//!   `shards` times the gradients' size and, in process, is one task adding every device's
//!   rows on the first device; every device adds `shards` rows and updates; and the host
//!   schedules every step (one task per device for its shards, the all-reduce, the updates;
//!   no programs per queue). On the moons job (2-16-16-1, batch 120, a step of about 12 µs)
//!   24 shards ran at about half the speed of the fast schedule on one device; on a step of
//!   milliseconds the gradients dominate and the difference is small. See `docs/devices.md`
//!   for measurements.
//!
//! # How many devices
//!
//! [`Devices::Count`] fixes the number. [`Devices::Auto`] (the default) picks it with a cost
//! model of a step: the *work* of the gradient code on the whole batch is the number of
//! points of its statements' product spaces (loop iterations, [`Report::step_work`]), at
//! 0.037 ns each (vectorized code on one core); a device's routine runs cost 0.1 µs a
//! step more; `N` devices on `P` cores (queues) run `⌈N / P⌉` devices one after another per
//! core, each doing `1/N` of the work; and adding the gradients up costs 0.9 µs per level of
//! the tree, `⌈log2 N⌉` levels (a transfer, a merge and the lockstep wait between devices;
//! the constants were measured on the default moons job on a Sapphire Rapids VM, see
//! `src/parallel/cost.rs`). Among the counts up to the backend's suggested devices that
//! divide the batch (with shards: the shards), `Auto` takes the fastest estimate, a larger
//! count only if it is at least 5 % faster. So a step of less than about 2 µs stays on one
//! device (a second core would save less than the merge costs), and the default moons
//! job's step of about 4.6 µs and a step of milliseconds go on every core.
//!
//! Devices in lockstep wait for the slowest, and a device whose core another process keeps
//! busy gets about half of it. So when the model picks more than one device,
//! [`Settings::watch_load`] (on by default) looks at the run queue for about 20 ms: the
//! other processes' threads that are runnable in most of 16 looks (from `/proc/loadavg`,
//! less this process's runnable threads) are cores taken, and the model is asked again with
//! the rest. Beside one busy process on a 2-core machine, the default moons job stays on one
//! device. On the MPI backend `Auto` is one device per rank.
//!
//! # Errors
//!
//! Everything about the model and the settings is checked before anything is compiled, and
//! a problem is a typed error naming it (see [`train`]).
//!
//! [`Backend`]: crate::backend::Backend
//! [`Backend::record_event`]: crate::backend::Backend::record_event
//! [`Backend::placement`]: crate::backend::Backend::placement
//! [`Backend::all_reduce`]: crate::backend::Backend::all_reduce
//! [`Progress`]: crate::backend::Progress
#![warn(missing_docs)]

mod cost;
mod host;
mod job;
mod model;
mod plan;
mod programs;
mod settings;
mod train;

pub use model::{GradientFn, LearningRate, Model, Slice, Update, UpdateArgs, UpdateFn};
pub use settings::{Devices, Epoch, PhaseTimes, Report, Schedule, Settings};
pub use train::{devices_for, train};
