//! What the user trains: the parameters, their gradients and the loss, the data, the gradient
//! code of one slice of a batch, the update rule, and an optional evaluation.

use crate::error::{Error, Result};
use crate::ir::{Assignments, StaticSymbol, Tnode};

/// The gradient code of one slice of a batch: given the [`Slice`], the assignments that read
/// the parameters (the tensors given to [`Model::param`]) and the slice's data
/// ([`Slice::data`]), and write every parameter's gradient tensor and the loss tensor
/// ([`Model::loss`]). See [`Model::gradient`].
pub type GradientFn<'a> = dyn Fn(&Slice) -> Result<Assignments> + 'a;

/// A user-written update: given the [`UpdateArgs`], the assignments that update the
/// parameters in place from the summed gradients. See [`Update::custom`].
pub type UpdateFn<'a> = dyn Fn(&UpdateArgs) -> Result<Assignments> + 'a;

/// One slice of a batch, as the gradient code sees it: the rows of every data tensor that one
/// run of the gradient code handles.
///
/// A step of batch `B` is split into slices of `rows` samples: one per device (the fast
/// schedules: `rows = B / devices`) or one per shard
/// ([`Schedule::Deterministic`](super::Schedule::Deterministic): `rows = B / shards`). The
/// gradients and the losses of the slices are **summed**, so the gradient code computes the
/// slice's share of the batch's mean loss: a sum over its rows divided by
/// [`batch`](Slice::batch), not by `rows`. Then the sum over the slices is the mean over the
/// batch, whatever the split.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Slice {
    /// One tensor per data tensor given to [`Model::data`], in the same order and precision,
    /// with dims `[rows, ...]` (the data tensor's dims with the first one replaced by
    /// `rows`): the slice's samples. The module fills them (from data resident on each
    /// device, so a step copies nothing from the host); the gradient code reads them.
    pub data: Vec<Tnode>,
    /// Samples in the slice.
    pub rows: usize,
    /// Samples in the whole batch (divide by this for the mean loss).
    pub batch: usize,
}

/// What a custom update ([`Update::custom`]) works with. The module runs the update's code
/// after it unpacked the current parameters into [`params`](UpdateArgs::params) and the
/// gradients summed over the batch into [`grads`](UpdateArgs::grads), and packs `params`
/// again afterwards: the code updates `params` in place.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct UpdateArgs {
    /// The parameters, the tensors given to [`Model::param`], in that order.
    pub params: Vec<Tnode>,
    /// The gradients of the batch's loss, one per parameter with its dims (tensors of the
    /// update's own, not the gradient tensors the gradient code writes).
    pub grads: Vec<Tnode>,
    /// A scalar (`[1]`) holding the learning rate of this step, from the update's
    /// [`LearningRate`].
    pub lr: Tnode,
    /// The static index of the step (`0..steps`), for rules that depend on it.
    pub step: StaticSymbol,
    /// Steps in the whole training.
    pub steps: usize,
}

/// The learning rate of each step.
#[derive(Clone, Debug, PartialEq)]
pub enum LearningRate {
    /// The same at every step.
    Constant(f64),
    /// From `start` at the first step to `end` after the last: step `s` of `S` uses
    /// `start + (end - start) · s / S`.
    Linear {
        /// The rate of the first step.
        start: f64,
        /// The rate the decay tends to (not reached: the last step is `S - 1`).
        end: f64,
    },
    /// One value per step (an error if the number of steps differs).
    PerStep(Vec<f64>),
}

impl LearningRate {
    /// The rate of every step of a training of `steps` steps.
    ///
    /// # Errors
    ///
    /// [`Error::Count`] when a [`LearningRate::PerStep`] does not have `steps` values.
    pub fn values(&self, steps: usize) -> Result<Vec<f64>> {
        match self {
            LearningRate::Constant(r) => Ok(vec![*r; steps]),
            LearningRate::Linear { start, end } => Ok((0..steps)
                .map(|s| start + (end - start) * s as f64 / steps as f64)
                .collect()),
            LearningRate::PerStep(v) if v.len() == steps => Ok(v.clone()),
            LearningRate::PerStep(v) => Err(Error::Count {
                what: "learning rates of LearningRate::PerStep (one per training step)".into(),
                expected: steps,
                got: v.len(),
            }),
        }
    }
}

/// How the parameters change at each step, from the gradients summed over the batch.
pub struct Update<'a> {
    pub(crate) lr: LearningRate,
    pub(crate) rule: Rule<'a>,
}

pub(crate) enum Rule<'a> {
    Sgd { weight_decay: f64 },
    Custom(Box<UpdateFn<'a>>),
}

impl<'a> Update<'a> {
    /// Stochastic gradient descent: `p = p - lr·(g + weight_decay·p)` for every parameter `p`
    /// and its summed gradient `g` (weight decay 0 until [`weight_decay`](Update::weight_decay)
    /// sets it).
    pub fn sgd(lr: LearningRate) -> Update<'a> {
        Update {
            lr,
            rule: Rule::Sgd { weight_decay: 0.0 },
        }
    }

    /// The weight decay of [`Update::sgd`] (an L2 penalty factor; ignored by a custom rule).
    pub fn weight_decay(mut self, weight_decay: f64) -> Update<'a> {
        if let Rule::Sgd { .. } = self.rule {
            self.rule = Rule::Sgd { weight_decay };
        }
        self
    }

    /// A rule of the user's: `code(&args)` returns the assignments that update
    /// [`UpdateArgs::params`] in place (see [`UpdateArgs`]); `lr` gives
    /// [`UpdateArgs::lr`]. Tensors the code keeps between steps (e.g. a momentum) should be
    /// `OnDevice` ([`crate::ir::MemoryMode::OnDevice`]): they start at zero and persist on
    /// each device that applies the update.
    pub fn custom(
        lr: LearningRate,
        code: impl Fn(&UpdateArgs) -> Result<Assignments> + 'a,
    ) -> Update<'a> {
        Update {
            lr,
            rule: Rule::Custom(Box::new(code)),
        }
    }
}

impl std::fmt::Debug for Update<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rule = match &self.rule {
            Rule::Sgd { weight_decay } => format!("Sgd {{ weight_decay: {weight_decay} }}"),
            Rule::Custom(_) => "Custom".to_string(),
        };
        f.debug_struct("Update")
            .field("lr", &self.lr)
            .field("rule", &rule)
            .finish()
    }
}

/// A parameter: the tensor the code reads, its gradient, its initial values.
#[derive(Clone, Debug)]
pub(crate) struct Param {
    pub(crate) tensor: Tnode,
    pub(crate) grad: Tnode,
    pub(crate) initial: Vec<f64>,
}

/// Code run once after training on the first device (of each rank), with the trained
/// parameters.
#[derive(Clone, Debug)]
pub(crate) struct Eval {
    pub(crate) code: Assignments,
    pub(crate) inputs: Vec<Tnode>,
    pub(crate) outputs: Vec<Tnode>,
}

/// A model to train data-parallel ([`train`](super::train)): its parameters with their
/// gradients and initial values, the loss, the data, the gradient code of a slice of a
/// batch, the update rule, and optionally code to evaluate the trained model. Built with the
/// methods below; nothing is checked until [`train`](super::train), which returns a typed
/// error naming what is wrong.
///
/// All parameters, gradients and the loss share one precision: they travel between devices
/// packed into two flat tensors (fusion buffers, [`crate::nn::Bucket`]), the parameters and
/// the gradients with the loss, so that a merge is one transfer and one routine whatever the
/// number of tensors. The parameters' flat tensor is the model's only state: each routine
/// unpacks the parameters it reads from it, so the parameter and gradient tensors can be
/// plain nodes ([`Tnode::new`]) that stay local to the routines' code.
#[derive(Default)]
pub struct Model<'a> {
    pub(crate) params: Vec<Param>,
    pub(crate) loss: Option<Tnode>,
    pub(crate) data: Vec<Tnode>,
    pub(crate) constants: Vec<Tnode>,
    pub(crate) gradient: Option<Box<GradientFn<'a>>>,
    pub(crate) update: Option<Update<'a>>,
    pub(crate) eval: Option<Eval>,
}

impl<'a> Model<'a> {
    /// An empty model: give it parameters, a loss, data, gradient code and an update rule.
    pub fn new() -> Model<'a> {
        Model::default()
    }

    /// A parameter `param`, the tensor `grad` the gradient code writes its gradient into
    /// (same dims and precision), and its initial values (row-major, one per cell). The
    /// values given here are the initial ones; a host array of `param`, if it has one, is not
    /// read.
    pub fn param(mut self, param: &Tnode, grad: &Tnode, initial: Vec<f64>) -> Model<'a> {
        self.params.push(Param {
            tensor: param.clone(),
            grad: grad.clone(),
            initial,
        });
        self
    }

    /// The scalar (dims `[1]`) the gradient code writes the slice's share of the loss into
    /// (see [`Slice`]); the module reports the mean over the steps of each epoch of its sum
    /// over the slices.
    pub fn loss(mut self, loss: &Tnode) -> Model<'a> {
        self.loss = Some(loss.clone());
        self
    }

    /// A data tensor: hosted, dims `[samples, ...]`, any precision (e.g. the inputs in
    /// single precision, integer labels in `Int32`); every data tensor has the same number
    /// of samples. The step `k` of an epoch trains on samples `k·batch .. (k+1)·batch` (the
    /// order of the steps is shuffled per epoch when [`Settings::shuffle`] says so; samples
    /// beyond the last whole batch are not trained on). The gradient code reads a slice of
    /// it ([`Slice::data`]).
    ///
    /// [`Settings::shuffle`]: super::Settings::shuffle
    pub fn data(mut self, data: &Tnode) -> Model<'a> {
        self.data.push(data.clone());
        self
    }

    /// A hosted tensor the gradient, update or evaluation code reads and never writes (a
    /// table, a mask, the class indices of a loss): copied to every device once, before
    /// training.
    pub fn constant(mut self, constant: &Tnode) -> Model<'a> {
        self.constants.push(constant.clone());
        self
    }

    /// The gradient code of one slice (see [`GradientFn`] and [`Slice`]). The module calls
    /// `code` when it builds the training's routines (perhaps more than once, e.g. to
    /// estimate the work of a step for [`Devices::Auto`](super::Devices::Auto)), compiles
    /// what it returns once, and runs it on every device.
    pub fn gradient(mut self, code: impl Fn(&Slice) -> Result<Assignments> + 'a) -> Model<'a> {
        self.gradient = Some(Box::new(code));
        self
    }

    /// The update rule.
    pub fn update(mut self, update: Update<'a>) -> Model<'a> {
        self.update = Some(update);
        self
    }

    /// Code to run once after training, on the first device (of every rank), with the trained
    /// parameters: `code` reads the parameters and the hosted `inputs` (copied to the device
    /// first) and writes the hosted `outputs`, whose host arrays hold the results when
    /// [`train`](super::train) returns (e.g. the model's predictions on a test set).
    pub fn evaluate(mut self, code: Assignments, inputs: &[Tnode], outputs: &[Tnode]) -> Model<'a> {
        self.eval = Some(Eval {
            code,
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
        });
        self
    }

    /// The parameter tensors, in the order given.
    pub fn params(&self) -> Vec<Tnode> {
        self.params.iter().map(|p| p.tensor.clone()).collect()
    }

    /// The gradient tensors, in the order of the parameters.
    pub fn grads(&self) -> Vec<Tnode> {
        self.params.iter().map(|p| p.grad.clone()).collect()
    }
}

impl std::fmt::Debug for Model<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("params", &self.params)
            .field("loss", &self.loss)
            .field("data", &self.data)
            .field("constants", &self.constants)
            .field("gradient", &self.gradient.as_ref().map(|_| "<code>"))
            .field("update", &self.update)
            .field("eval", &self.eval)
            .finish()
    }
}
