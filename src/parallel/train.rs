//! [`train`]: checks the model and the settings, builds the routines of a step, compiles them
//! in one batch, links them on the devices, runs the schedule and reports.

use super::host::Sharded;
use super::job::Job;
use super::model::{Eval, Model, Rule, UpdateArgs};
use super::plan::{exchange_groups, queue_of, Dev, Plan, Sums};
use super::programs::{Program, Run, REPORT_EVERY};
use super::settings::{Epoch, PhaseTimes, Report, Schedule, Settings};
use crate::backend::{Backend, Context, Device, Event, Progress, Task};
use crate::error::{Error, Result};
use crate::ir::einsum;
use crate::ir::{
    Assignments, AxisIndex, Bindings, Binop, Buffer, FetchOp, MemoryMode, Prec, Projections,
    StaticSymbol, Tnode, Unop,
};
use crate::nn::{self, Bucket, Rng};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Trains `model` data-parallel on `backend` as `settings` say, calling `on_epoch` at the end
/// of every epoch, and returns the trained parameters with the losses and timings (see the
/// [module documentation](super)). The backend is initialized with [`Config::default`](crate::backend::Config::default) if it
/// is not yet.
///
/// All routines of a step (the gradient of a slice, the merges, the update, and the
/// evaluation if any) are compiled in one `compile_batch` and linked on every device. The
/// data are copied to every device once, as `[slots, rows, ...]`, so that a step copies
/// nothing from the host: a static index selects the slice of a run. The devices created
/// stay with the backend until its `unsafe_cleanup` (or its drop).
///
/// On the MPI backend every rank makes the call with the same model and settings; every rank
/// gets the same report.
///
/// # Errors
///
/// Typed errors naming what is wrong with the model or the settings:
/// [`Error::Missing`] (no parameters, loss, data, gradient code or update rule),
/// [`Error::GradientDims`], [`Error::MixedPrecision`], [`Error::Count`] (initial values, the
/// samples of the data tensors, learning rates), [`Error::Dims`] (a loss that is not `[1]`, a
/// data tensor without samples), [`Error::NotHosted`] (a data tensor without values),
/// [`Error::Invalid`] (a batch or a number of epochs or devices of 0, a batch larger than the
/// data, more devices than shards, a merge mode of `No`), [`Error::BatchSplit`] (a batch the
/// devices or shards do not divide), [`Error::DeviceSpread`] (devices the MPI ranks do not
/// divide), [`Error::ScheduleUnavailable`] (the exchange where it does not fit); then any
/// error of the gradient code, of compiling, linking or running, a failing part of a step
/// as [`Error::InJob`] naming it.
pub fn train(
    backend: &dyn Backend,
    model: &Model<'_>,
    settings: &Settings,
    on_epoch: &mut dyn FnMut(&Epoch),
) -> Result<Report> {
    let job = Job::check(model, settings)?;
    let (n_dev, step_work) = job.devices(backend, settings)?;
    let ranks = backend.num_ranks().max(1);
    let training = Training::new(backend, &job, settings, n_dev, ranks, step_work)?;
    match settings.schedule {
        Schedule::Deterministic { shards } => training.deterministic(shards, on_epoch),
        _ => training.fast(on_epoch),
    }
}

/// The number of devices [`train`] would use for `model` on `backend` with `settings`: the
/// count of [`Devices::Count`](super::Devices::Count), or the one [`Devices::Auto`](super::Devices::Auto) picks (see the [module
/// documentation](super#how-many-devices)), checked against the batch, the shards and the
/// ranks as [`train`] checks it. The backend is initialized with [`Config::default`](crate::backend::Config::default) if it is
/// not yet. It calls the model's gradient code once (to count the work of a step).
///
/// # Errors
///
/// As [`train`] for the model and the settings.
pub fn devices_for(backend: &dyn Backend, model: &Model<'_>, settings: &Settings) -> Result<usize> {
    let job = Job::check(model, settings)?;
    Ok(job.devices(backend, settings)?.0)
}

/// A hosted tensor holding `values`.
fn hosted(label: &[&str], dims: &[usize], prec: Prec, values: &[f64]) -> Result<Tnode> {
    let t = Tnode::builder(label, dims, prec).hosted().build()?;
    t.set_host_values(values)?;
    Ok(t)
}

/// `lhs[..] = rhs[..]` under `p`.
fn copy(lhs: &Tnode, rhs: Buffer, p: Projections) -> Assignments {
    Assignments::AccumUnop {
        initialize_neutral: false,
        accum: Binop::Arg2,
        op: Unop::Identity,
        lhs: lhs.clone(),
        rhs,
        projections: p,
    }
}

/// Everything a training run builds before its schedule: the tensors, the buckets, the
/// shared pieces of code, the timings so far.
struct Training<'b, 'j, 'm, 'a> {
    backend: &'b dyn Backend,
    job: &'j Job<'m, 'a>,
    settings: &'j Settings,
    n_dev: usize,
    ranks: usize,
    step_work: u64,
    params: Bucket,
    /// The gradients and then the loss.
    grads: Bucket,
    /// Tensors of the update's own for the merged gradients and loss (one per part of
    /// `grads`), so that the gradient routine and the update share only the flat tensors
    /// and the parameters: the unpacked ones stay local to each routine's code.
    applied: Vec<Tnode>,
    lr_schedule: Tnode,
    history: Tnode,
    step: StaticSymbol,
    phases: PhaseTimes,
    epoch_losses: Vec<f64>,
}

impl<'b, 'j, 'm, 'a> Training<'b, 'j, 'm, 'a> {
    fn new(
        backend: &'b dyn Backend,
        job: &'j Job<'m, 'a>,
        settings: &'j Settings,
        n_dev: usize,
        ranks: usize,
        step_work: u64,
    ) -> Result<Training<'b, 'j, 'm, 'a>> {
        let prec = job.prec;
        let model = job.model;
        // Fusion buffers: the gradients and the loss travel between devices as one tensor,
        // and so do the parameters, so a merge is one transfer and one routine, and a
        // parameter copy one transfer, whatever the number of tensors. The parameters' bucket
        // is the model's only state: it starts from the host (the initial values) and ends
        // there.
        let grads = Bucket::on_device(
            &["grads"],
            &model
                .grads()
                .into_iter()
                .chain([job.loss.clone()])
                .collect::<Vec<_>>(),
        )?;
        let params = Bucket::hosted(&["params"], &model.params())?;
        let initial: Vec<f64> = model
            .params
            .iter()
            .flat_map(|p| p.initial.iter().copied())
            .collect();
        params.flat().set_host_values(&initial)?;
        let applied = grads
            .parts()
            .iter()
            .map(|(t, _)| Tnode::new(&[&t.name(), "merged"], t.dims(), prec))
            .collect::<Result<Vec<Tnode>>>()?;
        let lr_schedule = hosted(
            &["lr_schedule"],
            &[job.steps, 1],
            prec,
            &job.update.lr.values(job.steps)?,
        )?;
        let history = Tnode::hosted(&["loss_history"], &[job.steps], prec)?;
        Ok(Training {
            backend,
            job,
            settings,
            n_dev,
            ranks,
            step_work,
            params,
            grads,
            applied,
            lr_schedule,
            history,
            step: StaticSymbol::new("step", Some(job.steps)),
            phases: PhaseTimes::default(),
            epoch_losses: vec![],
        })
    }

    /// The data, resident on every device as `[slots, rows, ...]` (slot `k·parts + j` is
    /// slice `j` of batch `k`), and the fetches of the slice of `slot` into the gradient
    /// code's slice tensors, with that code.
    fn slices(&self, parts: usize, slot: &StaticSymbol) -> Result<(Vec<Tnode>, Assignments)> {
        let rows = self.job.batch / parts;
        let slots = self.job.per_epoch * parts;
        let (slice_tensors, user) = self.job.gradient_code(rows)?;
        let mut resident = vec![];
        let mut code = vec![];
        for (d, s) in self.job.model.data.iter().zip(&slice_tensors) {
            let mut dims = vec![slots, rows];
            dims.extend_from_slice(&d.dims()[1..]);
            let r = Tnode::builder(&[&d.name(), "resident"], &dims, d.prec())
                .hosted()
                .build()?;
            // The samples of the whole batches, as they are: slot `k·parts + j` holds rows
            // `(k·parts + j)·rows ..` of the data.
            let bytes = r.size_in_bytes();
            d.with_host(|src| {
                r.with_host_mut(|dst| dst.as_bytes_mut().copy_from_slice(&src.as_bytes()[..bytes]))
            })
            .flatten()
            .ok_or_else(|| Error::NotHosted {
                what: "the data of a model: ".into(),
                tensor: d.name(),
            })?;
            code.push(nn::slice(s, &r, slot));
            resident.push(r);
        }
        code.push(user);
        Ok((resident, Assignments::seq(code)))
    }

    /// The update applying the merged gradients and loss in `merged` (laid out like the
    /// gradients' bucket): unpack the parameters and `merged`, the rule, record the loss in
    /// the history at the step, pack the parameters.
    fn update_code(&self, merged: &Tnode, bindings: &Bindings) -> Result<Assignments> {
        let prec = self.job.prec;
        let (merged_loss, merged_grads) = self
            .applied
            .split_last()
            .ok_or_else(|| Error::Internal("the gradients' bucket has no loss".into()))?;
        let record = copy(
            &self.history,
            Buffer::Node(merged_loss.clone()),
            einsum::projections(
                "0->{step}",
                self.history.dims(),
                &[merged_loss.dims()],
                bindings,
            )?,
        );
        let lr = Tnode::new(&["lr"], &[1], prec)?;
        let mut rule = vec![nn::slice(&lr, &self.lr_schedule, &self.step)];
        let rule = match &self.job.update.rule {
            Rule::Sgd { weight_decay } => {
                let lr_wd = Tnode::new(&["lr_wd"], &[1], prec)?;
                let (wd, fill_wd) = nn::constant("weight_decay", *weight_decay, prec)?;
                rule.push(fill_wd);
                rule.push(nn::mul(&lr_wd, &lr, &wd)?);
                for (p, g) in self.job.model.params.iter().zip(merged_grads) {
                    rule.push(nn::sgd_step(&p.tensor, g, &lr, &lr_wd)?);
                }
                Assignments::block("sgd update with weight decay", Assignments::seq(rule))
            }
            Rule::Custom(code) => {
                let args = UpdateArgs {
                    params: self.job.model.params(),
                    grads: merged_grads.to_vec(),
                    lr: lr.clone(),
                    step: self.step.clone(),
                    steps: self.job.steps,
                };
                rule.push(code(&args)?);
                Assignments::block("the update rule", Assignments::seq(rule))
            }
        };
        Ok(Assignments::seq([
            self.params.unpack()?,
            self.grads.unpack_from(merged, &self.applied)?,
            rule,
            Assignments::block("record the step's loss", record),
            self.params.pack()?,
        ]))
    }

    /// The evaluation routine's code, if the model has one.
    fn eval_code(&self) -> Result<Option<Assignments>> {
        self.job
            .model
            .eval
            .as_ref()
            .map(|e| Ok(Assignments::seq([self.params.unpack()?, e.code.clone()])))
            .transpose()
    }

    /// `n_dev` new virtual devices, spread over the physical devices.
    fn new_devices(&self) -> Result<Vec<Device>> {
        let mut devices = vec![];
        for i in 0..self.n_dev {
            let physical = self
                .backend
                .get_device(self.backend.placement(i, self.n_dev))?;
            devices.push(self.backend.new_virtual_device(&physical)?);
        }
        Ok(devices)
    }

    /// Links the batch on every device and makes the first copies: to every device the
    /// resident data, the constants and the parameters, the learning rates where `updates(i)`, and the
    /// evaluation's inputs to the first device of every rank.
    fn link(
        &self,
        devices: Vec<Device>,
        batch: &crate::backend::CodeBatch,
        names: &[String],
        resident: &[Tnode],
        updates: &dyn Fn(usize) -> bool,
    ) -> Result<Vec<Dev>> {
        let backend = self.backend;
        let group = self.n_dev / self.ranks;
        let eval = self.job.model.eval.as_ref();
        let mut devs: Vec<Dev> = vec![];
        for (i, device) in devices.into_iter().enumerate() {
            let root = backend.init(&device)?;
            let (ctx, rs) = backend.link_batch(&[], &root, batch)?;
            let mut rs = rs.into_iter().zip(names).map(|(r, n)| {
                r.ok_or_else(|| Error::Internal(format!("routine {n} was not linked")))
            });
            let mut next = || {
                rs.next().unwrap_or_else(|| {
                    Err(Error::Internal(
                        "compile_batch returned too few routines".into(),
                    ))
                })
            };
            let grad = next()?;
            let update = next()?;
            let eval_routine = match eval {
                Some(_) => Some(next()?),
                None => None,
            };
            let merges = rs.collect::<Result<Vec<_>>>()?;
            let mut initial: Vec<&Tnode> = resident.iter().collect();
            initial.extend(&self.job.model.constants);
            initial.push(self.params.flat());
            if updates(i) {
                initial.push(&self.lr_schedule);
            }
            let leader = i % group == 0;
            if let (true, Some(Eval { inputs, .. })) = (leader, eval) {
                initial.extend(inputs);
            }
            for tn in initial {
                if !backend.from_host(&ctx, tn)? {
                    return Err(Error::NotInContext {
                        what: "the first copies of a training".into(),
                        tensor: tn.name(),
                        context: ctx.label().to_string(),
                        hint: if tn.is_hosted() {
                            " (no routine of the training reads it)".into()
                        } else {
                            " (it is not hosted)".into()
                        },
                    });
                }
            }
            devs.push(Dev {
                device,
                ctx,
                grad,
                merges,
                update,
                eval: eval_routine,
            });
        }
        for d in &devs {
            backend.await_device(&d.device)?;
        }
        Ok(devs)
    }

    /// The order of the batches: per epoch a permutation (seeded by the settings), or in
    /// order.
    fn order(&self) -> Vec<usize> {
        let per_epoch = self.job.per_epoch;
        match self.settings.shuffle {
            Some(seed) => {
                let mut rng = Rng::new(seed.wrapping_mul(0x9E37_79B9).wrapping_add(7));
                (0..self.job.epochs)
                    .flat_map(|_| rng.permutation(per_epoch))
                    .collect()
            }
            None => (0..self.job.epochs).flat_map(|_| 0..per_epoch).collect(),
        }
    }

    /// Reads epoch `e`'s losses from the history's host array and reports the epoch.
    fn record_epoch(
        &mut self,
        e: usize,
        t: Instant,
        t_train: Instant,
        on_epoch: &mut dyn FnMut(&Epoch),
    ) -> Result<()> {
        let per_epoch = self.job.per_epoch;
        // The epoch's steps only (converting the whole history every epoch was quadratic).
        let steps = e * per_epoch..(e + 1) * per_epoch;
        let sum = self
            .history
            .with_host(|a| (steps.end <= a.len()).then(|| steps.map(|i| a.get(i)).sum::<f64>()))
            .ok_or_else(|| Error::NotHosted {
                what: "the loss history: ".into(),
                tensor: self.history.name(),
            })?
            .ok_or_else(|| Error::Internal("the loss history is too short".into()))?;
        let mean = sum / per_epoch as f64;
        self.epoch_losses.push(mean);
        self.phases.loss_readback += t.elapsed();
        on_epoch(&Epoch {
            epoch: e + 1,
            epochs: self.job.epochs,
            loss: mean,
            steps: (e + 1) * per_epoch,
            elapsed: t_train.elapsed(),
        });
        Ok(())
    }

    /// The host-scheduled steps: `schedule(k, s)` schedules step `s` on batch `k`; devices
    /// order their work among themselves, so the host runs ahead of them (up to the queues'
    /// capacity) and waits only for the loss history at the end of each epoch, one epoch
    /// late. `leaders` are the devices holding the history (one per rank; every rank makes
    /// the same calls, each runs only on its own), `me` this rank's.
    fn host_loop(
        &mut self,
        devs: &[Dev],
        leaders: &[usize],
        me: usize,
        t_train: Instant,
        schedule: &dyn Fn(usize, usize) -> Result<()>,
        on_epoch: &mut dyn FnMut(&Epoch),
    ) -> Result<Duration> {
        let order = self.order();
        let per_epoch = self.job.per_epoch;
        let mut waiting = Duration::ZERO;
        // The epoch whose loss history is on its way to the host, and the event after the
        // copy.
        let mut readback: Option<(usize, Event)> = None;
        for epoch in 0..=self.job.epochs {
            if epoch < self.job.epochs {
                let t = Instant::now();
                let first = epoch * per_epoch;
                for (s, &k) in order.iter().enumerate().skip(first).take(per_epoch) {
                    schedule(k, s)?;
                }
                self.phases.scheduling += t.elapsed();
            }
            // The previous epoch's losses: wait for them while this epoch runs.
            if let Some((e, ev)) = readback.take() {
                let t = Instant::now();
                self.backend.await_event(&ev)?;
                waiting += t.elapsed();
                self.record_epoch(e, t, t_train, on_epoch)?;
            }
            if epoch < self.job.epochs {
                for &l in leaders {
                    self.backend.to_host(&devs[l].ctx, &self.history)?;
                }
                readback = Some((epoch, self.backend.record_event(&devs[me].device)));
            }
        }
        Ok(waiting)
    }

    /// After the steps: waits for every device, runs the evaluation on the leaders and reads
    /// the parameters back.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        mut self,
        devs: &[Dev],
        leaders: &[usize],
        me: usize,
        schedule: Schedule,
        routines: usize,
        (compile_time, setup_time): (Duration, Duration),
        (t_train, waiting): (Instant, Duration),
    ) -> Result<Report> {
        let backend = self.backend;
        // The last parameter copies, and any failure.
        let t = Instant::now();
        for d in devs {
            backend.await_device(&d.device)?;
        }
        self.phases.waiting = waiting + t.elapsed();
        let train_time = t_train.elapsed();
        // The evaluation on the first device of every rank (their parameters are the same).
        let t0 = Instant::now();
        for &l in leaders {
            let d = &devs[l];
            if let (Some(r), Some(e)) = (&d.eval, &self.job.model.eval) {
                r.schedule()?;
                for o in &e.outputs {
                    backend.to_host(&d.ctx, o)?;
                }
            }
            backend.to_host(&d.ctx, self.params.flat())?;
        }
        backend.await_device(&devs[me].device)?;
        let trained = self
            .params
            .flat()
            .host_values()
            .ok_or_else(|| Error::NotHosted {
                what: "the trained parameters: ".into(),
                tensor: self.params.flat().name(),
            })?;
        let mut rest = trained.as_slice();
        let params = self
            .job
            .model
            .params
            .iter()
            .map(|p| {
                let (head, tail) = rest.split_at(p.tensor.numel().min(rest.len()));
                rest = tail;
                head.to_vec()
            })
            .collect();
        let eval_time = t0.elapsed();
        let steps = self.job.steps;
        Ok(Report {
            backend: backend.name().to_string(),
            devices: self.n_dev,
            ranks: self.ranks,
            schedule,
            epoch_losses: self.epoch_losses,
            params,
            steps,
            samples: steps * self.job.batch,
            step_work: self.step_work,
            routines,
            compile_time,
            setup_time,
            train_time,
            eval_time,
            phases: self.phases,
            lent_chunks: 0,
        })
    }

    /// The fast schedules: the exchange, the tree as programs, the host-scheduled tree.
    fn fast(mut self, on_epoch: &mut dyn FnMut(&Epoch)) -> Result<Report> {
        let backend = self.backend;
        let (n_dev, ranks, prec) = (self.n_dev, self.ranks, self.job.prec);
        let group = n_dev / ranks;
        // This rank's group leader: the device whose results this process reads.
        let me = backend.rank() * group;
        let slots = self.job.per_epoch * n_dev;
        let slot = StaticSymbol::new("slot", Some(slots));
        let step = self.step.clone();
        let bindings = Bindings(vec![slot.clone(), step.clone()]);
        let (resident, grad_code) = self.slices(n_dev, &slot)?;

        // The devices first: whether the exchange fits (see `Exchange`) depends on their
        // queues.
        let t_setup = Instant::now();
        let devices = self.new_devices()?;
        let queues: Vec<Option<usize>> = devices.iter().map(queue_of).collect();
        let in_process = ranks == 1 && !devices.iter().any(Device::is_remote);
        let wanted = self.settings.schedule;
        let groups = if matches!(wanted, Schedule::Auto | Schedule::Exchange) && in_process {
            exchange_groups(&queues)
        } else {
            None
        };
        if groups.is_none() && wanted == Schedule::Exchange {
            return Err(Error::ScheduleUnavailable {
                schedule: wanted.to_string(),
                reason: format!(
                    "the exchange needs one rank and a power of two of devices in equal, \
                     aligned blocks per queue; {n_dev} devices on queues {queues:?} over \
                     {ranks} rank(s) do not fit (Schedule::Auto runs the tree then)"
                ),
            });
        }
        let exchange = match groups {
            None => None,
            Some(groups) => {
                let parity = StaticSymbol::new("parity", Some(2));
                let n = self.grads.flat().dims()[0];
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
            "update"
        };
        let mut names: Vec<String> = vec!["grad".into(), second.into()];
        let projections = |spec: &str, to: &Tnode, from: &[&Tnode]| {
            let dims: Vec<&[usize]> = from.iter().map(|t| t.dims()).collect();
            einsum::projections(spec, to.dims(), &dims, &bindings)
        };
        // Round `r` of the exchange (1-based): the partner's previous sum added to this
        // leader's.
        let round = |sums: &Sums, r: usize| -> Result<Assignments> {
            let from = &sums.rows[r - 1];
            let (to, spec) = if r < sums.rounds {
                (&sums.rows[r], "{parity}i,{parity}i->{parity}i")
            } else {
                (&sums.merged, "{parity}i,{parity}i->i")
            };
            Ok(Assignments::block(
                &format!("exchange round {r}"),
                Assignments::AccumBinop {
                    initialize_neutral: false,
                    accum: Binop::Arg2,
                    op: Binop::Add,
                    lhs: to.clone(),
                    rhs1: Buffer::Node(from.clone()),
                    rhs2: Buffer::MergeBuffer(from.clone()),
                    projections: projections(spec, to, &[from, from])?,
                },
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
                    Buffer::Node(row.clone()),
                    projections("{parity}i->i", &sums.merged, &[row])?,
                ),
            ))
        };
        let params = &self.params;
        let mut code = match &exchange {
            Some((parity, sums, _)) => vec![
                Assignments::seq([
                    params.unpack()?,
                    grad_code,
                    self.grads.pack_into_row(&sums.rows[0], parity)?,
                ]),
                // The last round (or, without rounds, the copy of the leader's row) and the
                // update, in one routine.
                Assignments::seq([
                    last_merge(sums)?,
                    self.update_code(&sums.merged, &bindings)?,
                ]),
            ],
            None => vec![
                Assignments::seq([params.unpack()?, grad_code, self.grads.pack()?]),
                self.update_code(self.grads.flat(), &bindings)?,
            ],
        };
        if let Some(e) = self.eval_code()? {
            code.push(e);
            names.push("evaluate".into());
        }
        match &exchange {
            Some((_, sums, _)) => {
                // The tree within a queue: a follower's row added to the leader's, in place.
                let row = &sums.rows[0];
                code.push(Assignments::block(
                    "merge the gradients and the loss of a device on the same queue",
                    Assignments::AccumUnop {
                        initialize_neutral: false,
                        accum: Binop::Add,
                        op: Unop::Identity,
                        lhs: row.clone(),
                        rhs: Buffer::MergeBuffer(row.clone()),
                        projections: projections("{parity}i->{parity}i", row, &[row])?,
                    },
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
                    nn::merge_add(self.grads.flat()),
                ));
                names.push("merge_grads".into());
            }
        }

        let t0 = Instant::now();
        let batch = backend.compile_batch(true, Some(&names), None, &bindings, &code)?;
        let compile_time = t0.elapsed();

        // Contexts, routines, initial copies.
        let t0 = Instant::now();
        let in_exchange = exchange.is_some();
        let devs = self.link(devices, &batch, &names, &resident, &|i| {
            i % group == 0 || in_exchange
        })?;
        let plan = Plan::new(
            backend,
            devs,
            (slot, step),
            self.grads.flat(),
            self.params.flat(),
            self.settings.merge,
            exchange,
        )?;
        let devs = &plan.devs;
        let setup_time = t0.elapsed() + setup_devices;

        let mut waiting = Duration::ZERO;
        let t_train = Instant::now();
        // One rank, in process: the training as one program per queue (the exchange where it
        // fits, else the tree), unless the host-scheduled tree was asked for.
        let program = match &plan.exchange {
            Some(x) => Some(Program::Exchange(x.clone())),
            None if wanted != Schedule::HostTree && in_process => {
                Some(Program::Tree(Arc::new(plan.tree_program())))
            }
            None => None,
        };
        let ran = match &program {
            Some(Program::Exchange(_)) => Schedule::Exchange,
            Some(Program::Tree(_)) => Schedule::Tree,
            None => Schedule::HostTree,
        };
        // The programs' shared state, for the count of lent chunks once they have finished.
        let mut programs_run = None;
        if let Some(program) = program {
            // The host schedules one task per queue and sleeps until each epoch's loss
            // history is on the host (see `Exchange::run_group`, `TreeProgram::run_group`).
            let t = Instant::now();
            let history_buffer =
                devs[0]
                    .ctx
                    .get_buffer(&self.history)
                    .ok_or_else(|| Error::NotInContext {
                        what: "the loss history's copies to the host".into(),
                        tensor: self.history.name(),
                        context: devs[0].ctx.label().to_string(),
                        hint: String::new(),
                    })?;
            let groups = program.groups();
            let counted: Vec<usize> = match &program {
                Program::Exchange(_) => groups.iter().map(|g| g[0]).collect(),
                Program::Tree(_) => (0..n_dev).collect(),
            };
            let run = Arc::new(Run {
                order: self.order(),
                per_epoch: self.job.per_epoch,
                progress: counted
                    .iter()
                    .map(|&i| Progress::new(format!("the training on {}", devs[i].device.name())))
                    .collect(),
                updated: Progress::new(format!("the updates on {}", devs[0].device.name())),
                epochs: Progress::new("the loss history of device 0"),
                history: self.history.clone(),
                history_buffer,
                lent: AtomicU64::new(0),
            });
            programs_run = Some(run.clone());
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
            self.phases.scheduling += t.elapsed();
            // The epochs' losses, reported in batches: the host wakes when the training ends
            // or every `REPORT_EVERY`, so that on a short job it does not take a core from the
            // devices once per epoch.
            let epochs = self.job.epochs;
            let mut reported = 0;
            while reported < epochs {
                let t = Instant::now();
                if run
                    .epochs
                    .sleep_until_for(epochs as u64, REPORT_EVERY)
                    .is_err()
                {
                    // A device failed: its error, not the wait's.
                    break;
                }
                waiting += t.elapsed();
                let done = (run.epochs.count() as usize).min(epochs);
                for e in reported..done {
                    self.record_epoch(e, Instant::now(), t_train, on_epoch)?;
                }
                reported = done;
            }
        } else {
            // The tree: the host schedules every step.
            waiting = self.host_loop(
                devs,
                &plan.leaders,
                me,
                t_train,
                &|k, s| plan.schedule_step(backend, k, s),
                on_epoch,
            )?;
        }
        let leaders = plan.leaders.clone();
        let mut report = self.finish(
            devs,
            &leaders,
            me,
            ran,
            names.len(),
            (compile_time, setup_time),
            (t_train, waiting),
        )?;
        report.lent_chunks = programs_run.map_or(0, |r| r.lent.load(Ordering::Acquire));
        Ok(report)
    }

    /// The deterministic schedule (see [`Sharded`]).
    fn deterministic(mut self, shards: usize, on_epoch: &mut dyn FnMut(&Epoch)) -> Result<Report> {
        let backend = self.backend;
        let (n_dev, ranks, prec) = (self.n_dev, self.ranks, self.job.prec);
        let group = n_dev / ranks;
        let me = backend.rank() * group;
        let slots = self.job.per_epoch * shards;
        let slot = StaticSymbol::new("slot", Some(slots));
        let shard = StaticSymbol::new("shard", Some(shards));
        let step = self.step.clone();
        let bindings = Bindings(vec![slot.clone(), shard.clone(), step.clone()]);
        let (resident, grad_code) = self.slices(shards, &slot)?;
        let n = self.grads.flat().dims()[0];
        let rows = Tnode::builder(&["grads", "shards"], &[shards, n], prec)
            .memory(MemoryMode::OnDevice)
            .build()?;
        let sum = Tnode::new(&["grads", "sum"], &[n], prec)?;
        // The sum of the shards' rows in shard order: sum = rows[0], then sum += rows[j].
        let lhs = Projections::pointwise(&[n], 1);
        let mut ordered = vec![];
        for j in 0..shards {
            let p = Projections {
                rhs_dims: vec![vec![shards, n]],
                project_rhs: vec![vec![AxisIndex::Fixed(j), lhs.project_lhs[0]]],
                debug_info: format!("add the gradients of shard {j}"),
                ..lhs.clone()
            };
            ordered.push(if j == 0 {
                copy(&sum, Buffer::Node(rows.clone()), p)
            } else {
                Assignments::AccumUnop {
                    initialize_neutral: false,
                    accum: Binop::Add,
                    op: Unop::Identity,
                    lhs: sum.clone(),
                    rhs: Buffer::Node(rows.clone()),
                    projections: p,
                }
            });
        }
        let mut code = vec![
            Assignments::seq([
                self.params.unpack()?,
                grad_code,
                self.grads.pack_into_row(&rows, &shard)?,
            ]),
            Assignments::seq([
                Assignments::block(
                    "the gradients and losses of the shards, added in shard order",
                    Assignments::seq(ordered),
                ),
                // After the all-reduce every device holds every shard's row: zero them all, so
                // that at the next step the rows this device does not compute are zeros again.
                Assignments::block(
                    "clear the rows for the next step",
                    Assignments::Fetch {
                        array: rows.clone(),
                        fetch_op: FetchOp::Constant(0.0),
                    },
                ),
                self.update_code(&sum, &bindings)?,
            ]),
        ];
        let mut names: Vec<String> = vec!["grad".into(), "update".into()];
        if let Some(e) = self.eval_code()? {
            code.push(e);
            names.push("evaluate".into());
        }
        let t0 = Instant::now();
        let batch = backend.compile_batch(true, Some(&names), None, &bindings, &code)?;
        let compile_time = t0.elapsed();

        let t0 = Instant::now();
        let devices = self.new_devices()?;
        // Every device updates its own parameters.
        let devs = self.link(devices, &batch, &names, &resident, &|_| true)?;
        let owned: Vec<Range<usize>> = (0..n_dev)
            .map(|d| d * shards / n_dev..(d + 1) * shards / n_dev)
            .collect();
        let ctxs: Vec<Context> = devs.iter().map(|d| d.ctx.clone()).collect();
        let descriptions = devs
            .iter()
            .zip(&owned)
            .map(|(d, r)| {
                format!(
                    "the gradients of shards {}..{} on {}",
                    r.start,
                    r.end,
                    d.device.name()
                )
                .into()
            })
            .collect();
        let plan = Sharded {
            devs,
            slot,
            shard,
            step,
            shards,
            owned,
            descriptions,
            rows,
            ctxs,
        };
        let setup_time = t0.elapsed();
        let leaders: Vec<usize> = (0..ranks).map(|r| r * group).collect();
        let t_train = Instant::now();
        let waiting = self.host_loop(
            &plan.devs,
            &leaders,
            me,
            t_train,
            &|k, s| plan.schedule_step(backend, k, s),
            on_epoch,
        )?;
        self.finish(
            &plan.devs,
            &leaders,
            me,
            Schedule::Deterministic { shards },
            names.len(),
            (compile_time, setup_time),
            (t_train, waiting),
        )
    }
}
