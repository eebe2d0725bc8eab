//! The two-moons demo (OCANNL's `moons_demo_parallel`): the dataset, and the model (a 2-H-H-1
//! ReLU MLP with a hinge loss) as a [`crate::parallel::Model`] to train data-parallel with
//! [`crate::parallel::train`] over the devices of any backend. `examples/moons.rs` runs it.
//!
//! ```no_run
//! use arrayjit::backend::MulticoreBackend;
//! use arrayjit::ir::Prec;
//! use arrayjit::nn::{moons, Mlp};
//! use arrayjit::parallel::{self, Settings, Update};
//! # fn main() -> arrayjit::Result<()> {
//! let data = moons::dataset(2400, 1);
//! let mlp = Mlp::new_unstored(&[2, 16, 16, 1], Prec::Single, 1)?;
//! let (model, scores) = moons::model(&mlp, &data)?;
//! let settings = Settings::new(120, 20).shuffle(Some(1));
//! let steps = data.len() / settings.batch * settings.epochs;
//! let model = model.update(Update::sgd(moons::learning_rate(0.1, steps)).weight_decay(2e-4));
//! let report = parallel::train(&MulticoreBackend::new(), &model, &settings, &mut |e| {
//!     println!("epoch {} loss {:.4}", e.epoch, e.loss)
//! })?;
//! println!("accuracy {} on {} devices, {:.0} samples/s", moons::accuracy(&scores, &data)?,
//!          report.devices, report.samples_per_sec());
//! let trained = mlp.host_model_from(&report.flat_params())?; // to evaluate on the host
//! # Ok(())
//! # }
//! ```

use super::{Mlp, Rng};
use crate::error::{Error, Result};
use crate::ir::{Assignments, Tnode};
use crate::parallel::{LearningRate, Model, Slice};

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

/// The demo's model over `data`, to train with [`crate::parallel::train`] once it has an update
/// rule ([`Model::update`]; the demo's is SGD with [`learning_rate`] and weight decay): the
/// parameters of `mlp` (with its initial values; build it with [`Mlp::new_unstored`], whose
/// tensors stay local to the routines' code), the hinge loss `Σ relu(1 - t·y) / batch` and its
/// gradients ([`Mlp::loss_and_backward`]), the points and labels as data (in the MLP's
/// precision), and as evaluation the MLP's output on every point, into the returned
/// `[points, 1]` tensor of scores (positive: label 1).
///
/// # Errors
///
/// [`Error::Invalid`] when the MLP does not have 2 inputs and 1 output, [`Error::Missing`]
/// for an empty dataset, [`Error::Count`] when it does not have one label per point.
pub fn model(mlp: &Mlp, data: &Dataset) -> Result<(Model<'static>, Tnode)> {
    let sizes = mlp.sizes();
    if sizes.first() != Some(&2) || sizes.last() != Some(&1) {
        return Err(Error::Invalid {
            what: "the layer sizes of the moons MLP".into(),
            value: format!("{sizes:?}"),
            expected: "2 inputs and 1 output".into(),
        });
    }
    if data.is_empty() {
        return Err(Error::Missing {
            what: "points".into(),
            hint: "the moons dataset needs at least one point".into(),
        });
    }
    if data.labels.len() != data.len() {
        return Err(Error::Count {
            what: "labels of the moons dataset (one per point)".into(),
            expected: data.len(),
            got: data.labels.len(),
        });
    }
    let prec = mlp.prec();
    let n = data.len();
    let points: Vec<f64> = data.points.iter().flatten().copied().collect();
    let hosted = |label: &[&str], dims: &[usize], values: &[f64]| -> Result<Tnode> {
        let t = Tnode::hosted(label, dims, prec)?;
        t.set_host_values(values)?;
        Ok(t)
    };
    let x = hosted(&["moons", "x"], &[n, 2], &points)?;
    let t = hosted(&["moons", "t"], &[n, 1], &data.labels)?;
    let eval_x = hosted(&["eval", "x"], &[n, 2], &points)?;
    let scores = Tnode::hosted(&["scores"], &[n, 1], prec)?;
    let loss = Tnode::new(&["loss"], &[1], prec)?;
    let mut model = Model::new();
    for ((p, g), initial) in mlp
        .params()
        .iter()
        .zip(mlp.grads())
        .zip(mlp.initial_values())
    {
        model = model.param(p, &g, initial.clone());
    }
    let (net, l) = (mlp.clone(), loss.clone());
    let gradient = move |s: &Slice| -> Result<Assignments> {
        Ok(Assignments::block(
            "gradient of the hinge loss on a batch slice",
            net.loss_and_backward(&s.data[0], &s.data[1], &l, s.batch, "grad")?,
        ))
    };
    let model = model
        .loss(&loss)
        .data(&x)
        .data(&t)
        .gradient(gradient)
        .evaluate(
            mlp.infer_routine(&eval_x, &scores)?,
            &[eval_x],
            std::slice::from_ref(&scores),
        );
    Ok((model, scores))
}

/// The demo's learning rate: from `initial`, decaying linearly over the training to half of
/// it (step `s` of `steps` uses `initial · (2·steps - s) / (2·steps)`).
pub fn learning_rate(initial: f64, steps: usize) -> LearningRate {
    LearningRate::PerStep(
        (0..steps)
            .map(|s| initial * (2 * steps - s) as f64 / (2 * steps) as f64)
            .collect(),
    )
}

/// The fraction of `data`'s points whose score in `scores` (the evaluation's output of
/// [`model`], read back by [`crate::parallel::train`]) has the sign of their label.
///
/// # Errors
///
/// [`Error::NotHosted`] when `scores` has no host array, [`Error::Count`] when it does not
/// hold one score per point.
pub fn accuracy(scores: &Tnode, data: &Dataset) -> Result<f64> {
    let predicted = scores.host_values().ok_or_else(|| Error::NotHosted {
        what: "the moons accuracy: ".into(),
        tensor: scores.name(),
    })?;
    if predicted.len() != data.len() || data.is_empty() {
        return Err(Error::Count {
            what: format!("scores in {} (one per point)", scores.name()),
            expected: data.len(),
            got: predicted.len(),
        });
    }
    let correct = predicted
        .iter()
        .zip(&data.labels)
        .filter(|(y, t)| (**y > 0.0) == (**t > 0.0))
        .count();
    Ok(correct as f64 / data.len() as f64)
}
