//! A multi-layer perceptron written as assignments: parameters, forward pass, hinge loss,
//! backward pass, merges and SGD update.

use super::{
    add_bias, constant, matmul, matmul_ordered, merge_add, mul, relu, relu_backward, scale,
    sgd_step, slice, sub, sum_ordered, transpose, Rng,
};
use crate::error::{Error, Result};
use crate::ir::{Assignments, Bindings, InitOp, MemoryMode, Prec, StaticSymbol, Tnode};

/// One layer `y = x·w + b` of an [`Mlp`], with the gradients of its parameters.
#[derive(Clone, Debug)]
pub struct Layer {
    /// Weights, dims `[inputs, outputs]` (hosted: initialized on the host, copied to devices
    /// with `from_host`, read back with `to_host`).
    pub w: Tnode,
    /// Biases, dims `[outputs]` (hosted).
    pub b: Tnode,
    /// Gradient of the loss with respect to `w` (on device).
    pub gw: Tnode,
    /// Gradient of the loss with respect to `b` (on device).
    pub gb: Tnode,
}

/// A multi-layer perceptron: `sizes[0]` inputs, ReLU hidden layers of `sizes[1..n-1]` units,
/// and a linear output layer of `sizes[n-1]` units.
///
/// Its parameters and gradients are tensor nodes marked to persist on devices; the methods
/// build the assignments of the routines of data-parallel training:
/// [`grad_routine`](Mlp::grad_routine) (forward, hinge loss and backward on a batch slice
/// selected by a static index), [`merge_routines`](Mlp::merge_routines) (one
/// `g = g + merge(g)` per gradient), [`sgd_routine`](Mlp::sgd_routine) and
/// [`infer_routine`](Mlp::infer_routine).
///
/// Layout: activations are `[batch, units]`, row-major. Every product runs its innermost loop
/// along a contiguous axis of the result (the weight gradient `Σ_b a[b,i]·δ[b,o]` in loop order
/// `b, i, o`; the input gradient through a transposed copy of `w`), so the C compiler can
/// vectorize it; the products are materialized to keep that order. Intermediate arrays
/// larger than 16 KiB are per-device scratch buffers (`OnDevice`, allocated once at link)
/// rather than arrays allocated on every call.
#[derive(Clone, Debug)]
pub struct Mlp {
    sizes: Vec<usize>,
    prec: Prec,
    layers: Vec<Layer>,
    /// The initial values of every parameter, in the order of [`Mlp::params`].
    initial: Vec<Vec<f64>>,
}

/// The assignments of a forward pass and the nodes they compute.
#[derive(Clone, Debug)]
pub struct Forward {
    /// The assignments.
    pub code: Assignments,
    /// The post-ReLU activation of every hidden layer, `[batch, units]`.
    pub hidden: Vec<Tnode>,
}

/// The trained parameters of an [`Mlp`] as plain `f64` values on the host, for evaluating the
/// model without a backend (e.g. to draw a decision boundary).
#[derive(Clone, Debug, PartialEq)]
pub struct HostMlp {
    /// Layer sizes, as for [`Mlp::new`].
    pub sizes: Vec<usize>,
    /// Per layer, the weights `[inputs, outputs]`, row-major.
    pub weights: Vec<Vec<f64>>,
    /// Per layer, the biases.
    pub biases: Vec<Vec<f64>>,
}

impl HostMlp {
    /// The model's outputs for one input (`sizes[0]` values), computed in `f64`. Layer widths
    /// come from the bias lengths; missing weights count as zero.
    pub fn predict(&self, x: &[f64]) -> Vec<f64> {
        let mut a = x.to_vec();
        let n = self.weights.len();
        for (l, (w, b)) in self.weights.iter().zip(&self.biases).enumerate() {
            let outs = b.len();
            let mut z = b.clone();
            for (i, ai) in a.iter().enumerate() {
                for (o, zo) in z.iter_mut().enumerate() {
                    *zo += ai * w.get(i * outs + o).copied().unwrap_or(0.0);
                }
            }
            if l + 1 < n {
                z.iter_mut().for_each(|v| *v = v.max(0.0));
            }
            a = z;
        }
        a
    }
}

/// Local arrays larger than this are allocated (`calloc`) and freed by the generated C on every
/// call (smaller ones live on the stack); see `docs/generated-c.md`.
const STACK_LOCAL_LIMIT: usize = 16 * 1024;

/// A node that must be materialized (so that the loop order chosen for it is kept rather
/// than inlined): `Local` when small; when large, `OnDevice`, i.e. a scratch buffer allocated
/// once per device at link time. A large `Local` would be `calloc`ed and freed on every call,
/// and its pages faulted in again each time (about 256 page faults per MiB per call, up to a
/// quarter of a step's time at 256 hidden units, and worse with several devices).
fn materialized(label: &[&str], dims: &[usize], prec: Prec) -> Result<Tnode> {
    let bytes = dims.iter().product::<usize>() * prec.size_in_bytes();
    let mode = if bytes > STACK_LOCAL_LIMIT {
        MemoryMode::OnDevice
    } else {
        MemoryMode::Local
    };
    Tnode::builder(label, dims, prec).memory(mode).build()
}

/// A node left to the optimizer (inlined when it can be), except that when it is large and
/// cannot be inlined it is kept as a per-device scratch buffer rather than a per-call `calloc`
/// (see [`materialized`]). Only for nodes read more than once per cell, which are never
/// inlined anyway.
fn reused(label: &[&str], dims: &[usize], prec: Prec) -> Result<Tnode> {
    let bytes = dims.iter().product::<usize>() * prec.size_in_bytes();
    let b = Tnode::builder(label, dims, prec);
    if bytes > STACK_LOCAL_LIMIT {
        b.memory(MemoryMode::OnDevice).build()
    } else {
        b.build()
    }
}

impl Mlp {
    /// A new MLP with layer sizes `sizes` (at least two: inputs and outputs), parameters in
    /// precision `prec`. Weights are drawn uniformly from `(-a, a)` with `a = sqrt(6 / inputs)`
    /// (He initialization for ReLU) by a generator seeded with `seed`; biases start at zero.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] when there are fewer than two sizes or a size is zero.
    pub fn new(sizes: &[usize], prec: Prec, seed: u64) -> Result<Mlp> {
        Mlp::build(sizes, prec, seed, true)
    }

    /// Like [`new`](Mlp::new), with parameters and gradients that are not kept in memory of
    /// their own: each routine computes the ones it reads (typically by unpacking a
    /// [`Bucket`](super::Bucket) holding all the parameters, the only state between steps),
    /// so they stay local to its code and cost a run no buffer. The initial values are in
    /// [`initial_values`](Mlp::initial_values); read a trained model back with
    /// [`host_model_from`](Mlp::host_model_from).
    ///
    /// # Errors
    ///
    /// As for [`new`](Mlp::new).
    pub fn new_unstored(sizes: &[usize], prec: Prec, seed: u64) -> Result<Mlp> {
        Mlp::build(sizes, prec, seed, false)
    }

    fn build(sizes: &[usize], prec: Prec, seed: u64, stored: bool) -> Result<Mlp> {
        if sizes.len() < 2 || sizes.contains(&0) {
            return Err(Error::Invalid {
                what: "the layer sizes of an MLP".into(),
                value: format!("{sizes:?}"),
                expected: "at least two sizes (inputs and outputs), all positive".into(),
            });
        }
        let mut rng = Rng::new(seed);
        let mut layers = vec![];
        let mut initial = vec![];
        for l in 0..sizes.len() - 1 {
            let (ins, outs) = (sizes[l], sizes[l + 1]);
            let a = (6.0 / ins as f64).sqrt();
            let values: Vec<f64> = (0..ins * outs).map(|_| rng.range(-a, a)).collect();
            let wl = format!("w{}", l + 1);
            let bl = format!("b{}", l + 1);
            let (w, b, gw, gb) = if stored {
                (
                    Tnode::builder(&[&wl], &[ins, outs], prec)
                        .init(InitOp::ConstantFill {
                            values: values.clone(),
                            strict: true,
                        })
                        .memory(MemoryMode::Materialized)
                        .build()?,
                    Tnode::builder(&[&bl], &[outs], prec)
                        .init(InitOp::ConstantFill {
                            values: vec![0.0],
                            strict: false,
                        })
                        .memory(MemoryMode::Materialized)
                        .build()?,
                    Tnode::builder(&[&wl, "grad"], &[ins, outs], prec)
                        .memory(MemoryMode::OnDevice)
                        .build()?,
                    Tnode::builder(&[&bl, "grad"], &[outs], prec)
                        .memory(MemoryMode::OnDevice)
                        .build()?,
                )
            } else {
                (
                    Tnode::new(&[&wl], &[ins, outs], prec)?,
                    Tnode::new(&[&bl], &[outs], prec)?,
                    Tnode::new(&[&wl, "grad"], &[ins, outs], prec)?,
                    Tnode::new(&[&bl, "grad"], &[outs], prec)?,
                )
            };
            initial.push(values);
            initial.push(vec![0.0; outs]);
            layers.push(Layer { w, b, gw, gb });
        }
        Ok(Mlp {
            sizes: sizes.to_vec(),
            prec,
            layers,
            initial,
        })
    }

    /// The initial values of every parameter, in the order of [`params`](Mlp::params),
    /// row-major.
    pub fn initial_values(&self) -> &[Vec<f64>] {
        &self.initial
    }

    /// The model whose parameters, in the order of [`params`](Mlp::params), row-major, are
    /// laid one after another in `flat` (e.g. the host values of a parameter bucket).
    ///
    /// # Errors
    ///
    /// [`Error::Count`] when `flat` does not have exactly one value per parameter cell.
    pub fn host_model_from(&self, flat: &[f64]) -> Result<HostMlp> {
        let expected: usize = self.params().iter().map(Tnode::numel).sum();
        if flat.len() != expected {
            return Err(Error::Count {
                what: format!("values for the parameters of an MLP {:?}", self.sizes),
                expected,
                got: flat.len(),
            });
        }
        let mut rest = flat;
        let mut take = |t: &Tnode| {
            let (head, tail) = rest.split_at(t.numel());
            rest = tail;
            head.to_vec()
        };
        let mut weights = vec![];
        let mut biases = vec![];
        for l in &self.layers {
            weights.push(take(&l.w));
            biases.push(take(&l.b));
        }
        Ok(HostMlp {
            sizes: self.sizes.clone(),
            weights,
            biases,
        })
    }

    /// The layer sizes.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// The precision of parameters and activations.
    pub fn prec(&self) -> Prec {
        self.prec
    }

    /// The layers, input first.
    pub fn layers(&self) -> &[Layer] {
        &self.layers
    }

    /// Every parameter: `w1, b1, w2, b2, ...`.
    pub fn params(&self) -> Vec<Tnode> {
        self.layers
            .iter()
            .flat_map(|l| [l.w.clone(), l.b.clone()])
            .collect()
    }

    /// Every gradient, in the order of [`params`](Mlp::params).
    pub fn grads(&self) -> Vec<Tnode> {
        self.layers
            .iter()
            .flat_map(|l| [l.gw.clone(), l.gb.clone()])
            .collect()
    }

    fn check_batch(&self, what: &str, t: &Tnode, units: usize) -> Result<usize> {
        match t.dims() {
            [m, u] if *u == units => Ok(*m),
            d => Err(Error::Assignment(format!(
                "{what} {}: dims {d:?}, expected [batch, {units}]",
                t.name()
            ))),
        }
    }

    /// The forward pass `y = mlp(x)` for `x: [batch, sizes[0]]` into `y: [batch, outputs]`;
    /// `tag` prefixes the labels of the intermediate nodes.
    ///
    /// # Errors
    ///
    /// [`Error::Assignment`] when `x` or `y` has the wrong dims.
    pub fn forward(&self, x: &Tnode, y: &Tnode, tag: &str) -> Result<Forward> {
        let m = self.check_batch("forward input", x, self.sizes[0])?;
        let m_out = self.check_batch("forward output", y, *self.sizes.last().unwrap_or(&1))?;
        if m != m_out {
            return Err(Error::Assignment(format!(
                "forward: input {} has {m} rows but output {} has {m_out}",
                x.name(),
                y.name()
            )));
        }
        let none = Bindings::empty();
        let mut code = vec![];
        let mut hidden = vec![];
        let mut a = x.clone();
        let n = self.layers.len();
        for (l, layer) in self.layers.iter().enumerate() {
            let outs = self.sizes[l + 1];
            let z = materialized(&[tag, &format!("z{}", l + 1)], &[m, outs], self.prec)?;
            // z[b,o] = Σ_i a[b,i]·w[i,o], innermost loop along o (contiguous in z and w).
            code.push(matmul_ordered(&z, &a, &layer.w, "bi,io->bo", "bio", &none)?);
            if l + 1 == n {
                code.push(add_bias(y, &z, &layer.b, "bo,o->bo", &none)?);
            } else {
                let pre = Tnode::new(&[tag, &format!("pre{}", l + 1)], &[m, outs], self.prec)?;
                let h = reused(&[tag, &format!("h{}", l + 1)], &[m, outs], self.prec)?;
                code.push(add_bias(&pre, &z, &layer.b, "bo,o->bo", &none)?);
                code.push(relu(&h, &pre)?);
                hidden.push(h.clone());
                a = h;
            }
        }
        Ok(Forward {
            code: Assignments::block(&format!("{tag}: forward"), Assignments::seq(code)),
            hidden,
        })
    }

    /// Forward pass, hinge loss and backward pass for inputs `x: [m, sizes[0]]` and targets
    /// `t: [m, outputs]` (±1): `loss = Σ relu(1 - t·y) / full_batch` and the gradient of that
    /// loss into every layer's `gw`, `gb`. Dividing by the full batch size (not `m`) makes
    /// the sum of the gradients of the slices of a batch the gradient of the batch's mean
    /// loss, which is what merging adds up.
    ///
    /// # Errors
    ///
    /// [`Error::Assignment`] when dims do not fit; [`Error::Invalid`] when `full_batch` is 0.
    pub fn loss_and_backward(
        &self,
        x: &Tnode,
        t: &Tnode,
        loss: &Tnode,
        full_batch: usize,
        tag: &str,
    ) -> Result<Assignments> {
        let outs = *self.sizes.last().unwrap_or(&1);
        let m = self.check_batch("targets", t, outs)?;
        if full_batch == 0 {
            return Err(Error::Invalid {
                what: "full_batch".into(),
                value: "0".into(),
                expected: "a positive batch size".into(),
            });
        }
        if loss.dims() != [1] {
            return Err(Error::Assignment(format!(
                "loss {} must be a scalar [1], it has dims {:?}",
                loss.name(),
                loss.dims()
            )));
        }
        let p = self.prec;
        let none = Bindings::empty();
        let y = Tnode::new(&[tag, "y"], &[m, outs], p)?;
        let fwd = self.forward(x, &y, tag)?;
        // margin u = 1 - t·y; loss = Σ relu(u) / B; dy = (u > 0 ? t : 0) · (-1/B).
        let ty = Tnode::new(&[tag, "ty"], &[m, outs], p)?;
        let u = Tnode::new(&[tag, "margin"], &[m, outs], p)?;
        let lterm = Tnode::new(&[tag, "hinge"], &[m, outs], p)?;
        let gate = Tnode::new(&[tag, "dy_gate"], &[m, outs], p)?;
        let dy = Tnode::new(&[tag, "dy"], &[m, outs], p)?;
        let (one, fill_one) = constant("one", 1.0, p)?;
        let (inv_b, fill_inv_b) = constant("inv_batch", 1.0 / full_batch as f64, p)?;
        let loss_code = Assignments::block(
            &format!("{tag}: hinge loss"),
            Assignments::seq([
                fill_one,
                fill_inv_b,
                mul(&ty, t, &y)?,
                sub(&u, &one, &ty)?,
                relu(&lterm, &u)?,
                matmul(loss, &lterm, &inv_b, "bo,0->0", &none)?,
            ]),
        );
        let mut back = vec![
            relu_backward(&gate, &u, t)?,
            scale(&dy, &gate, -1.0 / full_batch as f64)?,
        ];
        let mut delta = dy;
        for l in (0..self.layers.len()).rev() {
            let layer = &self.layers[l];
            let a_prev = if l == 0 { x } else { &fwd.hidden[l - 1] };
            // gw[i,o] = Σ_b a[b,i]·δ[b,o]; gb[o] = Σ_b δ[b,o]; innermost loops along o.
            back.push(matmul_ordered(
                &layer.gw,
                a_prev,
                &delta,
                "bi,bo->io",
                "bio",
                &none,
            )?);
            back.push(sum_ordered(&layer.gb, &delta, "bo->o", "bo", &none)?);
            if l > 0 {
                let (ins, outs) = (self.sizes[l], self.sizes[l + 1]);
                let wt = reused(&[tag, &format!("w{}T", l + 1)], &[outs, ins], p)?;
                let dh = materialized(&[tag, &format!("dh{l}")], &[m, ins], p)?;
                let dpre = reused(&[tag, &format!("dpre{l}")], &[m, ins], p)?;
                back.push(transpose(&wt, &layer.w, "io->oi", &none)?);
                // dh[b,i] = Σ_o δ[b,o]·w[i,o], innermost loop along i (through wᵀ).
                back.push(matmul_ordered(&dh, &delta, &wt, "bo,oi->bi", "boi", &none)?);
                back.push(relu_backward(&dpre, &fwd.hidden[l - 1], &dh)?);
                delta = dpre;
            }
        }
        Ok(Assignments::seq([
            fwd.code,
            loss_code,
            Assignments::block(&format!("{tag}: backward"), Assignments::seq(back)),
        ]))
    }

    /// The per-device gradient routine of data-parallel training: takes the slice `slot` of
    /// `data: [slots, m, sizes[0]]` and `labels: [slots, m, outputs]` (tensors resident on
    /// every device, so a step needs no host copies), then runs
    /// [`loss_and_backward`](Mlp::loss_and_backward) on it. Compile it with bindings that
    /// contain `slot`.
    ///
    /// # Errors
    ///
    /// [`Error::Assignment`] when dims do not fit.
    pub fn grad_routine(
        &self,
        data: &Tnode,
        labels: &Tnode,
        slot: &StaticSymbol,
        loss: &Tnode,
        full_batch: usize,
    ) -> Result<Assignments> {
        let outs = *self.sizes.last().unwrap_or(&1);
        let (m, ok) = match (data.dims(), labels.dims()) {
            ([s, m, i], [s2, m2, o]) => {
                (*m, s == s2 && m == m2 && *i == self.sizes[0] && *o == outs)
            }
            _ => (0, false),
        };
        if !ok {
            return Err(Error::Assignment(format!(
                "grad_routine: data {} {:?} and labels {} {:?} must be [slots, m, {}] and [slots, m, {outs}]",
                data.name(),
                data.dims(),
                labels.name(),
                labels.dims(),
                self.sizes[0]
            )));
        }
        let x = Tnode::new(&["x"], &[m, self.sizes[0]], self.prec)?;
        let t = Tnode::new(&["t"], &[m, outs], self.prec)?;
        Ok(Assignments::block(
            "gradient of the hinge loss on a batch slice",
            Assignments::seq([
                slice(&x, data, slot),
                slice(&t, labels, slot),
                self.loss_and_backward(&x, &t, loss, full_batch, "grad")?,
            ]),
        ))
    }

    /// One merge routine per gradient and per node of `extra` (e.g. the loss), each
    /// `g = g + merge(g)`, named `merge_<label>`.
    pub fn merge_routines(&self, extra: &[Tnode]) -> Vec<(String, Assignments)> {
        self.grads()
            .iter()
            .chain(extra)
            .map(|g| {
                let name = format!("merge_{}", g.label().join("_"));
                (name.clone(), Assignments::block(&name, merge_add(g)))
            })
            .collect()
    }

    /// The SGD update routine: `lr = lr_schedule[step]` (`lr_schedule: [steps, 1]`, a tensor
    /// resident on the device that updates), then for every parameter
    /// `p = p - lr·(g + weight_decay·p)`. Compile it with bindings that contain `step`.
    ///
    /// # Errors
    ///
    /// [`Error::Assignment`] when `lr_schedule` is not `[steps, 1]`.
    pub fn sgd_routine(
        &self,
        lr_schedule: &Tnode,
        step: &StaticSymbol,
        weight_decay: f64,
    ) -> Result<Assignments> {
        self.sgd_routine_with(&self.grads(), lr_schedule, step, weight_decay)
    }

    /// [`sgd_routine`](Mlp::sgd_routine) applying the gradients `grads` (one per parameter,
    /// in the order of [`params`](Mlp::params), with the same dims) instead of the
    /// gradient routine's own: e.g. merged gradients unpacked into tensors of the update's.
    ///
    /// # Errors
    ///
    /// As for [`sgd_routine`](Mlp::sgd_routine), and [`Error::Assignment`] when `grads` has
    /// the wrong number of tensors or dims.
    pub fn sgd_routine_with(
        &self,
        grads: &[Tnode],
        lr_schedule: &Tnode,
        step: &StaticSymbol,
        weight_decay: f64,
    ) -> Result<Assignments> {
        if grads.len() != 2 * self.layers.len() {
            return Err(Error::Assignment(format!(
                "sgd_routine: {} gradients for {} parameters",
                grads.len(),
                2 * self.layers.len()
            )));
        }
        if !matches!(lr_schedule.dims(), [_, 1]) {
            return Err(Error::Assignment(format!(
                "sgd_routine: the learning-rate schedule {} must be [steps, 1], it is {:?}",
                lr_schedule.name(),
                lr_schedule.dims()
            )));
        }
        let p = self.prec;
        let lr = Tnode::new(&["lr"], &[1], p)?;
        let lr_wd = Tnode::new(&["lr_wd"], &[1], p)?;
        let (wd, fill_wd) = constant("weight_decay", weight_decay, p)?;
        let mut code = vec![
            slice(&lr, lr_schedule, step),
            fill_wd,
            mul(&lr_wd, &lr, &wd)?,
        ];
        for (layer, g) in self.layers.iter().zip(grads.chunks(2)) {
            code.push(sgd_step(&layer.w, &g[0], &lr, &lr_wd)?);
            code.push(sgd_step(&layer.b, &g[1], &lr, &lr_wd)?);
        }
        Ok(Assignments::block(
            "sgd update with weight decay",
            Assignments::seq(code),
        ))
    }

    /// The inference routine `scores = mlp(x)` for `x: [n, sizes[0]]`, `scores: [n, outputs]`.
    ///
    /// # Errors
    ///
    /// [`Error::Assignment`] when dims do not fit.
    pub fn infer_routine(&self, x: &Tnode, scores: &Tnode) -> Result<Assignments> {
        Ok(Assignments::block(
            "inference",
            self.forward(x, scores, "infer")?.code,
        ))
    }

    /// The parameters' host values as a [`HostMlp`] (copy them from a device with `to_host`
    /// first to get the trained values).
    ///
    /// # Errors
    ///
    /// [`Error::NotHosted`] if a parameter has no host array.
    pub fn to_host_model(&self) -> Result<HostMlp> {
        let values = |t: &Tnode| {
            t.host_values().ok_or_else(|| Error::NotHosted {
                what: "an MLP's host model: ".into(),
                tensor: t.name(),
            })
        };
        Ok(HostMlp {
            sizes: self.sizes.clone(),
            weights: self
                .layers
                .iter()
                .map(|l| values(&l.w))
                .collect::<Result<_>>()?,
            biases: self
                .layers
                .iter()
                .map(|l| values(&l.b))
                .collect::<Result<_>>()?,
        })
    }
}
