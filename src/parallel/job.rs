//! The checks of a model and its settings before anything is built, and the number of
//! devices (the cost model's choice for [`Devices::Auto`]).

use super::cost;
use super::model::{Model, Slice, Update};
use super::settings::{Devices, Schedule, Settings};
use crate::backend::{Backend, Config, MergeBufferUse};
use crate::error::{Error, Result};
use crate::ir::{Assignments, Prec, Tnode};

/// The number of devices [`Devices::Auto`] picks: one per rank on the MPI backend; else
/// among the counts up to the backend's physical devices times its suggested virtual
/// devices that divide the batch (or, with shards, the shards), the one the cost model says
/// makes a step fastest. When that is more than one and `watch_load` is set, the cores other
/// processes keep busy now are taken from the backend's, and the model asked again.
fn auto_devices(
    backend: &dyn Backend,
    batch: usize,
    shards: Option<usize>,
    work: u64,
    watch_load: bool,
) -> Result<usize> {
    let ranks = backend.num_ranks().max(1);
    if ranks > 1 {
        return Ok(ranks);
    }
    let per = backend.suggested_num_virtual_devices(&backend.get_device(0)?);
    let queues = backend.num_physical_devices().max(1);
    let most = (queues * per).max(1);
    let parts = shards.unwrap_or(batch);
    let candidates: Vec<usize> = (1..=most.min(parts))
        .filter(|d| parts.is_multiple_of(*d))
        .collect();
    let best = cost::best_devices(work, shards, queues, &candidates).unwrap_or(1);
    if best == 1 || !watch_load {
        return Ok(best);
    }
    let free = queues
        .saturating_sub(crate::backend::load::busy_elsewhere())
        .max(1);
    Ok(cost::best_devices(work, shards, free, &candidates).unwrap_or(1))
}

/// The model and settings, checked.
pub(crate) struct Job<'m, 'a> {
    pub(crate) model: &'m Model<'a>,
    pub(crate) update: &'m Update<'a>,
    pub(crate) prec: Prec,
    pub(crate) loss: Tnode,
    pub(crate) per_epoch: usize,
    pub(crate) steps: usize,
    pub(crate) batch: usize,
    pub(crate) epochs: usize,
}

impl<'m, 'a> Job<'m, 'a> {
    pub(crate) fn check(model: &'m Model<'a>, settings: &Settings) -> Result<Job<'m, 'a>> {
        let missing = |what: &str, hint: &str| Error::Missing {
            what: what.into(),
            hint: hint.into(),
        };
        let first = model.params.first().ok_or_else(|| {
            missing(
                "parameters",
                "give the model at least one with Model::param",
            )
        })?;
        let loss = model
            .loss
            .clone()
            .ok_or_else(|| missing("loss", "give the model its loss tensor with Model::loss"))?;
        if model.gradient.is_none() {
            return Err(missing(
                "gradient code",
                "give the model the gradient code of a slice with Model::gradient",
            ));
        }
        let update = model.update.as_ref().ok_or_else(|| {
            missing(
                "update rule",
                "give the model one with Model::update (e.g. Update::sgd)",
            )
        })?;
        let first_data = model.data.first().ok_or_else(|| {
            missing(
                "data",
                "give the model at least one data tensor [samples, ...] with Model::data",
            )
        })?;
        let prec = first.tensor.prec();
        let what = "the parameters, gradients and loss of a model";
        let same = |t: &Tnode| -> Result<()> {
            if t.prec() == prec {
                return Ok(());
            }
            Err(Error::MixedPrecision {
                what: what.into(),
                tensor: t.name(),
                prec: t.prec().to_string(),
                expected: prec.to_string(),
            })
        };
        for p in &model.params {
            if p.grad.dims() != p.tensor.dims() {
                return Err(Error::GradientDims {
                    param: p.tensor.name(),
                    param_dims: p.tensor.dims().to_vec(),
                    grad: p.grad.name(),
                    grad_dims: p.grad.dims().to_vec(),
                });
            }
            same(&p.tensor)?;
            same(&p.grad)?;
            if p.initial.len() != p.tensor.numel() {
                return Err(Error::Count {
                    what: format!("initial values of parameter {}", p.tensor.name()),
                    expected: p.tensor.numel(),
                    got: p.initial.len(),
                });
            }
        }
        same(&loss)?;
        if loss.dims() != [1] {
            return Err(Error::Dims {
                tensor: loss.name(),
                dims: loss.dims().to_vec(),
                problem: "are not those of a scalar loss: [1]".into(),
            });
        }
        let samples = first_data.dims()[0];
        for c in &model.constants {
            if !c.is_hosted() {
                return Err(Error::NotHosted {
                    what: "the constants of a model: ".into(),
                    tensor: c.name(),
                });
            }
        }
        for d in &model.data {
            if !d.is_hosted() {
                return Err(Error::NotHosted {
                    what: "the data of a model: ".into(),
                    tensor: d.name(),
                });
            }
            if d.dims()[0] != samples {
                return Err(Error::Count {
                    what: format!(
                        "samples of data tensor {} (the first axis; {} has {samples})",
                        d.name(),
                        first_data.name()
                    ),
                    expected: samples,
                    got: d.dims()[0],
                });
            }
        }
        let positive = |what: &str, v: usize| -> Result<()> {
            if v > 0 {
                return Ok(());
            }
            Err(Error::Invalid {
                what: what.into(),
                value: "0".into(),
                expected: "a positive number".into(),
            })
        };
        positive("Settings::batch", settings.batch)?;
        positive("Settings::epochs", settings.epochs)?;
        if settings.batch > samples {
            return Err(Error::Invalid {
                what: "Settings::batch".into(),
                value: settings.batch.to_string(),
                expected: format!(
                    "at most the {samples} samples of the data ({})",
                    first_data.name()
                ),
            });
        }
        if settings.merge == MergeBufferUse::No {
            return Err(Error::Invalid {
                what: "Settings::merge".into(),
                value: "MergeBufferUse::No".into(),
                expected: "MergeBufferUse::Streaming or MergeBufferUse::Copy".into(),
            });
        }
        let per_epoch = samples / settings.batch;
        let steps = per_epoch * settings.epochs;
        // The learning rates, checked now (one per step).
        update.lr.values(steps)?;
        Ok(Job {
            model,
            update,
            prec,
            loss,
            per_epoch,
            steps,
            batch: settings.batch,
            epochs: settings.epochs,
        })
    }

    /// The number of devices (checked) and the cost model's work of a step.
    pub(crate) fn devices(
        &self,
        backend: &dyn Backend,
        settings: &Settings,
    ) -> Result<(usize, u64)> {
        if !backend.is_initialized() {
            backend.initialize(Config::default());
        }
        let ranks = backend.num_ranks().max(1);
        // The cost model's estimate of a step's work: the gradient code on the whole batch.
        let step_work = cost::work(&self.gradient_code(self.batch)?.1);
        let shards = match settings.schedule {
            Schedule::Deterministic { shards } => {
                if shards == 0 || !self.batch.is_multiple_of(shards) {
                    return Err(Error::BatchSplit {
                        batch: self.batch,
                        parts: shards,
                        into: "shards".into(),
                    });
                }
                Some(shards)
            }
            _ => None,
        };
        let n_dev = match settings.devices {
            Devices::Count(n) => n,
            Devices::Auto => {
                auto_devices(backend, self.batch, shards, step_work, settings.watch_load)?
            }
        };
        if n_dev == 0 {
            return Err(Error::Invalid {
                what: "Settings::devices".into(),
                value: "Count(0)".into(),
                expected: "at least one device".into(),
            });
        }
        match shards {
            Some(shards) if n_dev > shards => {
                return Err(Error::Invalid {
                    what: "Settings::devices".into(),
                    value: format!("Count({n_dev})"),
                    expected: format!(
                        "at most one device per shard ({shards} shards with \
                         Schedule::Deterministic)"
                    ),
                })
            }
            None if !self.batch.is_multiple_of(n_dev) => {
                return Err(Error::BatchSplit {
                    batch: self.batch,
                    parts: n_dev,
                    into: "device slices".into(),
                })
            }
            _ => {}
        }
        if !n_dev.is_multiple_of(ranks) {
            return Err(Error::DeviceSpread {
                devices: n_dev,
                ranks,
            });
        }
        Ok((n_dev, step_work))
    }

    /// The slice tensors of `rows` samples and the gradient code on them (the user's code
    /// only; the caller adds the fetches of the slices).
    pub(crate) fn gradient_code(&self, rows: usize) -> Result<(Vec<Tnode>, Assignments)> {
        let data = self
            .model
            .data
            .iter()
            .map(|d| {
                let mut dims = d.dims().to_vec();
                dims[0] = rows;
                Tnode::new(&[&d.name(), "slice"], &dims, d.prec())
            })
            .collect::<Result<Vec<_>>>()?;
        let slice = Slice {
            data: data.clone(),
            rows,
            batch: self.batch,
        };
        let gradient = self.model.gradient.as_ref().ok_or_else(|| Error::Missing {
            what: "gradient code".into(),
            hint: "give the model the gradient code of a slice with Model::gradient".into(),
        })?;
        Ok((data, gradient(&slice)?))
    }
}
