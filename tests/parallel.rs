//! `arrayjit::parallel` on a model of the test's own (not the library's MLP): a 2-layer tanh
//! network with a squared loss, in double precision. Its training is checked against a plain
//! single-device loop written here in Rust (forward, backward and SGD by hand); the
//! deterministic schedule must give the same bits on 1, 2, 3 and 8 devices, the fast
//! schedules the same bits as each other for a given number of devices; every schedule runs
//! on the multicore and the sync backends; and a model or settings that cannot work are
//! typed errors naming what is wrong.

use arrayjit::backend::{Backend, MergeBufferUse, MulticoreBackend, SyncBackend};
use arrayjit::ir::{Assignments, Bindings, MemoryMode, Prec, Tnode, Unop};
use arrayjit::nn;
use arrayjit::parallel::{
    self, Devices, LearningRate, Model, Report, Schedule, Settings, Slice, Update, UpdateArgs,
};
use arrayjit::Error;
use std::sync::mpsc;
use std::time::Duration;

fn with_watchdog(secs: u64, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => h.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p)
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("watchdog: test did not finish in {secs}s"),
    }
}

const IN: usize = 3;
const HID: usize = 4;
const OUT: usize = 2;
const SAMPLES: usize = 192;
const P: Prec = Prec::Double;

/// SplitMix64, for the test's data and initial weights.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

/// The inputs (`[SAMPLES, IN]`) and targets (`[SAMPLES, OUT]`): two smooth functions of the
/// inputs.
fn data() -> (Vec<f64>, Vec<f64>) {
    let mut rng = Rng(7);
    let xs: Vec<f64> = (0..SAMPLES * IN).map(|_| rng.uniform()).collect();
    let ts = xs
        .chunks(IN)
        .flat_map(|x| [(x[0] - 0.5 * x[1]).sin(), x[2] * x[0] + 0.25])
        .collect();
    (xs, ts)
}

/// The initial parameters: `w1 [IN, HID]`, `b1 [HID]`, `w2 [HID, OUT]`, `b2 [OUT]`.
fn initial() -> Vec<Vec<f64>> {
    let mut rng = Rng(3);
    let mut draw =
        |n: usize, scale: f64| -> Vec<f64> { (0..n).map(|_| scale * rng.uniform()).collect() };
    vec![
        draw(IN * HID, 0.8),
        draw(HID, 0.1),
        draw(HID * OUT, 0.8),
        draw(OUT, 0.1),
    ]
}

/// The network's forward pass in plain Rust, for one sample.
fn forward(p: &[Vec<f64>], x: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let h: Vec<f64> = (0..HID)
        .map(|j| (p[1][j] + (0..IN).map(|i| x[i] * p[0][i * HID + j]).sum::<f64>()).tanh())
        .collect();
    let y = (0..OUT)
        .map(|o| p[3][o] + (0..HID).map(|j| h[j] * p[2][j * OUT + o]).sum::<f64>())
        .collect();
    (h, y)
}

/// How the plain loop updates the parameters.
#[derive(Clone, Copy)]
enum Rule {
    /// `p -= lr·(g + wd·p)`.
    Sgd { wd: f64 },
    /// `v = mu·v + g; p -= lr·v`.
    Momentum { mu: f64 },
}

/// Training in plain Rust, in order (no shuffling): per step the mean squared loss of the
/// batch and its gradient, then the update. Returns the epochs' mean losses and the
/// parameters.
fn plain_loop(batch: usize, epochs: usize, lrs: &[f64], rule: Rule) -> (Vec<f64>, Vec<Vec<f64>>) {
    let (xs, ts) = data();
    let mut p = initial();
    let mut v: Vec<Vec<f64>> = p.iter().map(|q| vec![0.0; q.len()]).collect();
    let per_epoch = SAMPLES / batch;
    let mut losses = vec![];
    let mut s = 0;
    for _ in 0..epochs {
        let mut total = 0.0;
        for k in 0..per_epoch {
            let mut g: Vec<Vec<f64>> = p.iter().map(|q| vec![0.0; q.len()]).collect();
            let mut loss = 0.0;
            for b in k * batch..(k + 1) * batch {
                let x = &xs[b * IN..(b + 1) * IN];
                let t = &ts[b * OUT..(b + 1) * OUT];
                let (h, y) = forward(&p, x);
                let mut dh = [0.0; HID];
                for o in 0..OUT {
                    let d = y[o] - t[o];
                    loss += d * d / batch as f64;
                    let dy = 2.0 * d / batch as f64;
                    g[3][o] += dy;
                    for j in 0..HID {
                        g[2][j * OUT + o] += h[j] * dy;
                        dh[j] += dy * p[2][j * OUT + o];
                    }
                }
                for j in 0..HID {
                    let dpre = dh[j] * (1.0 - h[j] * h[j]);
                    g[1][j] += dpre;
                    for i in 0..IN {
                        g[0][i * HID + j] += x[i] * dpre;
                    }
                }
            }
            total += loss;
            let lr = lrs[s];
            for ((q, gq), vq) in p.iter_mut().zip(&g).zip(&mut v) {
                for ((w, gw), vw) in q.iter_mut().zip(gq).zip(vq.iter_mut()) {
                    match rule {
                        Rule::Sgd { wd } => *w -= lr * (gw + wd * *w),
                        Rule::Momentum { mu } => {
                            *vw = mu * *vw + gw;
                            *w -= lr * *vw;
                        }
                    }
                }
            }
            s += 1;
        }
        losses.push(total / per_epoch as f64);
    }
    (losses, p)
}

/// The network as the library sees it: parameters, gradients, loss, data.
struct Net {
    params: Vec<Tnode>,
    grads: Vec<Tnode>,
    loss: Tnode,
    x: Tnode,
    t: Tnode,
}

fn node(name: &str, dims: &[usize]) -> Tnode {
    Tnode::new(&[name], dims, P).unwrap()
}

fn net() -> Net {
    let (xs, ts) = data();
    let x = Tnode::hosted(&["x"], &[SAMPLES, IN], P).unwrap();
    x.set_host_values(&xs).unwrap();
    let t = Tnode::hosted(&["t"], &[SAMPLES, OUT], P).unwrap();
    t.set_host_values(&ts).unwrap();
    let dims: [&[usize]; 4] = [&[IN, HID], &[HID], &[HID, OUT], &[OUT]];
    let names = ["w1", "b1", "w2", "b2"];
    Net {
        params: names.iter().zip(dims).map(|(n, d)| node(n, d)).collect(),
        grads: names
            .iter()
            .zip(dims)
            .map(|(n, d)| node(&format!("g{n}"), d))
            .collect(),
        loss: node("loss", &[1]),
        x,
        t,
    }
}

/// The gradient code of a slice: forward, the slice's share of the batch's mean squared
/// loss, and backward, with the `arrayjit::nn` helpers.
fn gradient(net: &Net, s: &Slice) -> arrayjit::Result<Assignments> {
    let (x, t, m) = (&s.data[0], &s.data[1], s.rows);
    let [w1, b1, w2, b2] = &net.params[..] else {
        unreachable!()
    };
    let [gw1, gb1, gw2, gb2] = &net.grads[..] else {
        unreachable!()
    };
    let n = |name: &str, dims: &[usize]| Tnode::new(&[name], dims, P);
    let (z1, pre, h) = (
        n("z1", &[m, HID])?,
        n("pre", &[m, HID])?,
        n("h", &[m, HID])?,
    );
    let (z2, y, diff) = (
        n("z2", &[m, OUT])?,
        n("y", &[m, OUT])?,
        n("diff", &[m, OUT])?,
    );
    let (sq, dy, dh) = (n("sq", &[1])?, n("dy", &[m, OUT])?, n("dh", &[m, HID])?);
    let (hh, gate, dpre) = (
        n("hh", &[m, HID])?,
        n("gate", &[m, HID])?,
        n("dpre", &[m, HID])?,
    );
    let (one, fill_one) = nn::constant("one", 1.0, P)?;
    let none = Bindings::empty();
    let inv = 1.0 / s.batch as f64;
    Ok(Assignments::seq([
        nn::matmul(&z1, x, w1, "bi,ih->bh", &none)?,
        nn::add_bias(&pre, &z1, b1, "bh,h->bh", &none)?,
        nn::unary(&h, Unop::Tanh, &pre)?,
        nn::matmul(&z2, &h, w2, "bh,ho->bo", &none)?,
        nn::add_bias(&y, &z2, b2, "bo,o->bo", &none)?,
        nn::sub(&diff, &y, t)?,
        nn::matmul(&sq, &diff, &diff, "bo,bo->0", &none)?,
        nn::scale(&net.loss, &sq, inv)?,
        nn::scale(&dy, &diff, 2.0 * inv)?,
        nn::matmul(gw2, &h, &dy, "bh,bo->ho", &none)?,
        nn::sum(gb2, &dy, "bo->o", &none)?,
        nn::matmul(&dh, &dy, w2, "bo,ho->bh", &none)?,
        fill_one,
        nn::mul(&hh, &h, &h)?,
        nn::sub(&gate, &one, &hh)?,
        nn::mul(&dpre, &dh, &gate)?,
        nn::matmul(gw1, x, &dpre, "bi,bh->ih", &none)?,
        nn::sum(gb1, &dpre, "bh->h", &none)?,
    ]))
}

/// The model with the update `update`.
fn model<'a>(net: &'a Net, update: Update<'a>) -> Model<'a> {
    let mut m = Model::new();
    for ((p, g), init) in net.params.iter().zip(&net.grads).zip(initial()) {
        m = m.param(p, g, init);
    }
    m.loss(&net.loss)
        .data(&net.x)
        .data(&net.t)
        .gradient(move |s| gradient(net, s))
        .update(update)
}

const BATCH: usize = 24;
const EPOCHS: usize = 3;
const STEPS: usize = SAMPLES / BATCH * EPOCHS;

fn lrs() -> LearningRate {
    LearningRate::Linear {
        start: 0.2,
        end: 0.05,
    }
}

fn sgd<'a>() -> Update<'a> {
    Update::sgd(lrs()).weight_decay(0.01)
}

/// Trains with `schedule` on `devices` devices, checking what the callback saw against the
/// report.
fn run(backend: &dyn Backend, devices: usize, schedule: Schedule, shuffle: bool) -> Report {
    let net = net();
    let settings = Settings::new(BATCH, EPOCHS)
        .devices(Devices::Count(devices))
        .schedule(schedule)
        .shuffle(shuffle.then_some(11));
    let mut seen = vec![];
    let r = parallel::train(backend, &model(&net, sgd()), &settings, &mut |e| {
        seen.push((e.epoch, e.epochs, e.steps, e.loss))
    })
    .unwrap_or_else(|e| panic!("{devices} devices, {schedule:?}: {e}"));
    assert_eq!(r.devices, devices);
    assert_eq!((r.steps, r.samples), (STEPS, STEPS * BATCH));
    let expected: Vec<_> = (0..EPOCHS)
        .map(|e| (e + 1, EPOCHS, (e + 1) * STEPS / EPOCHS, r.epoch_losses[e]))
        .collect();
    assert_eq!(seen, expected);
    r
}

fn bits(r: &Report) -> (Vec<u64>, Vec<u64>) {
    (
        r.epoch_losses.iter().map(|v| v.to_bits()).collect(),
        r.flat_params().iter().map(|v| v.to_bits()).collect(),
    )
}

/// `a` and `b` agree to `tol` relative to their scale.
fn close(what: &str, a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "{what}[{k}]: {x} vs {y} (library vs plain loop)\n{a:?}\n{b:?}"
        );
    }
}

fn plain_sgd() -> (Vec<f64>, Vec<Vec<f64>>) {
    plain_loop(
        BATCH,
        EPOCHS,
        &lrs().values(STEPS).unwrap(),
        Rule::Sgd { wd: 0.01 },
    )
}

type MakeBackend = fn() -> Box<dyn Backend>;

fn backends() -> [(&'static str, MakeBackend); 2] {
    [
        ("sync", || Box::new(SyncBackend::new())),
        ("multicore", || Box::new(MulticoreBackend::new())),
    ]
}

/// The deterministic schedule: the same losses and parameters, bit for bit, on 1, 2, 3 and 8
/// devices, on the sync and the multicore backends, with the batches shuffled; and in order,
/// the plain loop's to rounding.
#[test]
fn the_deterministic_schedule_gives_the_same_bits_on_any_number_of_devices() {
    with_watchdog(600, || {
        let schedule = Schedule::Deterministic { shards: 24 };
        let reference = run(&SyncBackend::new(), 1, schedule, true);
        assert_eq!(reference.schedule, schedule);
        for (name, make) in backends() {
            for devices in [1, 2, 3, 8] {
                let r = run(make().as_ref(), devices, schedule, true);
                assert_eq!(r.schedule, schedule);
                assert_eq!(bits(&r), bits(&reference), "{name}, {devices} devices");
            }
        }
        // Shuffling changed the order of the steps (so the comparison above covers it).
        let in_order = run(&MulticoreBackend::new(), 3, schedule, false);
        assert_ne!(bits(&in_order), bits(&reference));
        let (losses, params) = plain_sgd();
        close("losses", &in_order.epoch_losses, &losses, 1e-12);
        close("params", &in_order.flat_params(), &params.concat(), 1e-12);
        // Fewer shards than devices, or shards that do not divide the batch, are errors.
        let net = net();
        let e = parallel::train(
            &SyncBackend::new(),
            &model(&net, sgd()),
            &Settings::new(BATCH, 1)
                .devices(Devices::Count(8))
                .schedule(Schedule::Deterministic { shards: 4 }),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(
            matches!(&e, Error::Invalid { what, .. } if what == "Settings::devices"),
            "{e}"
        );
        let e = parallel::train(
            &SyncBackend::new(),
            &model(&net, sgd()),
            &Settings::new(BATCH, 1).schedule(Schedule::Deterministic { shards: 5 }),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                Error::BatchSplit {
                    batch: 24,
                    parts: 5,
                    ..
                }
            ),
            "{e}"
        );
    });
}

/// Every fast schedule on both backends follows the plain single-device loop (to rounding:
/// the sums of the slices associate differently), and for a given number of devices they
/// all give the same bits. The exchange where the devices do not allow it is a typed error.
#[test]
fn every_fast_schedule_follows_the_plain_loop_on_both_backends() {
    with_watchdog(900, || {
        let (losses, params) = plain_sgd();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        for devices in [1, 2, 3, 8] {
            let reference = run(&SyncBackend::new(), devices, Schedule::HostTree, false);
            close("losses", &reference.epoch_losses, &losses, 1e-12);
            close("params", &reference.flat_params(), &params.concat(), 1e-12);
            for (name, make) in backends() {
                for schedule in [
                    Schedule::Auto,
                    Schedule::Exchange,
                    Schedule::Tree,
                    Schedule::HostTree,
                ] {
                    let what = format!("{name}, {devices} devices, {schedule:?}");
                    // The exchange needs a power of two of devices in equal blocks per queue:
                    // on the sync backend's one queue, a power of two of devices; on the
                    // multicore one, also equal blocks per core.
                    let blocks_fit = devices.is_power_of_two()
                        && (name == "sync"
                            || devices <= cores
                            || devices.is_multiple_of(cores) && cores.is_power_of_two());
                    if schedule == Schedule::Exchange && !blocks_fit {
                        let net = net();
                        let e = parallel::train(
                            make().as_ref(),
                            &model(&net, sgd()),
                            &Settings::new(BATCH, 1)
                                .devices(Devices::Count(devices))
                                .schedule(schedule),
                            &mut |_| {},
                        )
                        .unwrap_err();
                        assert!(
                            matches!(e, Error::ScheduleUnavailable { .. }),
                            "{what}: {e}"
                        );
                        continue;
                    }
                    let r = run(make().as_ref(), devices, schedule, false);
                    assert_eq!(bits(&r), bits(&reference), "{what}");
                    let ran = match schedule {
                        Schedule::Auto if blocks_fit => Schedule::Exchange,
                        Schedule::Auto => Schedule::Tree,
                        other => other,
                    };
                    assert_eq!(r.schedule, ran, "{what}");
                }
            }
        }
    });
}

/// Copy merges give the streaming merges' bits.
#[test]
fn copy_merges_give_the_bits_of_streaming_merges() {
    with_watchdog(300, || {
        let net = net();
        for devices in [2, 3] {
            let go = |merge| {
                let settings = Settings::new(BATCH, EPOCHS)
                    .devices(Devices::Count(devices))
                    .merge(merge);
                parallel::train(
                    &MulticoreBackend::new(),
                    &model(&net, sgd()),
                    &settings,
                    &mut |_| {},
                )
                .unwrap()
            };
            let (s, c) = (go(MergeBufferUse::Streaming), go(MergeBufferUse::Copy));
            assert_eq!(bits(&s), bits(&c), "{devices} devices");
        }
    });
}

/// A rule of the user's: SGD with momentum, the velocity a tensor of the update's own that
/// persists on the devices between steps; against the plain loop, on a fast and on the
/// deterministic schedule.
#[test]
fn a_custom_update_with_state_follows_the_plain_loop() {
    with_watchdog(300, || {
        let net = net();
        let velocity: Vec<Tnode> = net
            .params
            .iter()
            .map(|p| {
                Tnode::builder(&[&p.name(), "velocity"], p.dims(), P)
                    .memory(MemoryMode::OnDevice)
                    .build()
                    .unwrap()
            })
            .collect();
        let momentum = |a: &UpdateArgs| -> arrayjit::Result<Assignments> {
            assert_eq!(a.steps, STEPS);
            let (mu, fill_mu) = nn::constant("mu", 0.9, P)?;
            let mut code = vec![fill_mu];
            for ((p, g), v) in a.params.iter().zip(&a.grads).zip(&velocity) {
                let (decayed, step) = (
                    Tnode::new(&["decayed"], v.dims(), P)?,
                    Tnode::new(&["step"], v.dims(), P)?,
                );
                code.push(nn::mul(&decayed, &mu, v)?);
                code.push(nn::binary(v, arrayjit::ir::Binop::Add, &decayed, g, None)?);
                code.push(nn::mul(&step, &a.lr, v)?);
                code.push(nn::binary(p, arrayjit::ir::Binop::Sub, p, &step, None)?);
            }
            Ok(Assignments::seq(code))
        };
        let (losses, params) = plain_loop(
            BATCH,
            EPOCHS,
            &lrs().values(STEPS).unwrap(),
            Rule::Momentum { mu: 0.9 },
        );
        // Momentum changes the result: the check is not vacuous.
        assert!((params[0][0] - plain_sgd().1[0][0]).abs() > 1e-6);
        for (devices, schedule) in [
            (1, Schedule::Auto),
            (2, Schedule::Auto),
            (3, Schedule::Tree),
            (2, Schedule::HostTree),
            (3, Schedule::Deterministic { shards: 6 }),
        ] {
            let settings = Settings::new(BATCH, EPOCHS)
                .devices(Devices::Count(devices))
                .schedule(schedule);
            let r = parallel::train(
                &MulticoreBackend::new(),
                &model(&net, Update::custom(lrs(), momentum)),
                &settings,
                &mut |_| {},
            )
            .unwrap();
            let what = format!("{devices} devices, {schedule:?}");
            close(&format!("{what}: losses"), &r.epoch_losses, &losses, 1e-12);
            close(
                &format!("{what}: params"),
                &r.flat_params(),
                &params.concat(),
                1e-12,
            );
        }
    });
}

/// The evaluation runs with the trained parameters: its outputs are the plain forward pass
/// of the trained parameters; a constant reaches the devices.
#[test]
fn the_evaluation_sees_the_trained_parameters() {
    with_watchdog(300, || {
        let net = net();
        let probe: Vec<f64> = vec![0.5, -0.25, 0.75, -1.0, 0.0, 0.3];
        let px = Tnode::hosted(&["probe", "x"], &[2, IN], P).unwrap();
        px.set_host_values(&probe).unwrap();
        // A constant the evaluation reads: it scales the outputs.
        let factor = Tnode::hosted(&["factor"], &[1], P).unwrap();
        factor.set_host_values(&[3.0]).unwrap();
        let out = Tnode::hosted(&["probe", "y"], &[2, OUT], P).unwrap();
        let none = Bindings::empty();
        let [w1, b1, w2, b2] = &net.params[..] else {
            unreachable!()
        };
        let (z1, pre, h) = (
            node("ez1", &[2, HID]),
            node("epre", &[2, HID]),
            node("eh", &[2, HID]),
        );
        let (z2, y) = (node("ez2", &[2, OUT]), node("ey", &[2, OUT]));
        let eval = Assignments::seq([
            nn::matmul(&z1, &px, w1, "bi,ih->bh", &none).unwrap(),
            nn::add_bias(&pre, &z1, b1, "bh,h->bh", &none).unwrap(),
            nn::unary(&h, Unop::Tanh, &pre).unwrap(),
            nn::matmul(&z2, &h, w2, "bh,ho->bo", &none).unwrap(),
            nn::add_bias(&y, &z2, b2, "bo,o->bo", &none).unwrap(),
            nn::mul(&out, &y, &factor).unwrap(),
        ]);
        let m = model(&net, sgd()).constant(&factor).evaluate(
            eval,
            std::slice::from_ref(&px),
            std::slice::from_ref(&out),
        );
        for (devices, schedule) in [
            (2, Schedule::Auto),
            (3, Schedule::Deterministic { shards: 3 }),
        ] {
            out.set_host_values(&[0.0; 2 * OUT]).unwrap();
            let r = parallel::train(
                &MulticoreBackend::new(),
                &m,
                &Settings::new(BATCH, EPOCHS)
                    .devices(Devices::Count(devices))
                    .schedule(schedule),
                &mut |_| {},
            )
            .unwrap();
            let expected: Vec<f64> = probe
                .chunks(IN)
                .flat_map(|x| forward(&r.params, x).1.into_iter().map(|v| 3.0 * v))
                .collect();
            close("evaluation", &out.host_values().unwrap(), &expected, 1e-12);
            // The gradient, the update, the evaluation, and but for the deterministic schedule a
            // merge.
            assert_eq!(r.routines, if devices == 3 { 3 } else { 4 });
        }
    });
}

/// `Devices::Auto`: the cost model keeps a tiny step on one device, spreads a large one over
/// the cores, but not over a core another process keeps busy; `Report::step_work` counts the
/// points of the gradient code's statements.
#[test]
fn auto_devices_follow_the_cost_model_of_a_step() {
    with_watchdog(300, || {
        let net = net();
        let m = model(&net, sgd());
        let tiny = Settings::new(BATCH, 1);
        let b = MulticoreBackend::new();
        assert_eq!(parallel::devices_for(&b, &m, &tiny).unwrap(), 1);
        let r = parallel::train(&b, &m, &tiny, &mut |_| {}).unwrap();
        assert_eq!(r.devices, 1);
        // The user's gradient code (the module's fetches of the slices are not counted). Per
        // sample: the products (12 + 8 for the forward, 8 + 8 + 12 for the gradients), and
        // 4 + 4 + 2 + 2 + 2 + 2 + 2 + 4 + 4 + 4 + 4 for the pointwise steps and sums; per
        // batch, the loss's scale (1 constant + 1 cell), and the constants 2/batch and 1.
        let per_sample = (12 + 8) + (8 + 8 + 12) + (4 + 4 + 2 + 2 + 2 + 2 + 2 + 4 + 4 + 4 + 4);
        assert_eq!(r.step_work, (per_sample * BATCH + 2 + 1 + 1) as u64);
        // A wide network and a large batch: milliseconds a step.
        let (wide, big_batch) = (512, 192);
        let x = Tnode::hosted(&["x"], &[big_batch, IN], P).unwrap();
        let w = node("w", &[IN, wide]);
        let gw = node("gw", &[IN, wide]);
        let loss = node("loss", &[1]);
        let (w2, l2) = (w.clone(), loss.clone());
        let g2 = gw.clone();
        let big = Model::new()
            .param(&w, &gw, vec![0.0; IN * wide])
            .loss(&loss)
            .data(&x)
            .gradient(move |s| {
                let none = Bindings::empty();
                let z = Tnode::new(&["z"], &[s.rows, wide], P)?;
                let zz = Tnode::new(&["zz"], &[wide, wide], P)?;
                let sq = Tnode::new(&["sq"], &[1], P)?;
                Ok(Assignments::seq([
                    nn::matmul(&z, &s.data[0], &w2, "bi,ih->bh", &none)?,
                    nn::matmul(&zz, &z, &z, "bh,bk->hk", &none)?,
                    nn::sum(&sq, &zz, "hk->0", &none)?,
                    nn::scale(&l2, &sq, 1e-9)?,
                    nn::matmul(&g2, &s.data[0], &z, "bi,bh->ih", &none)?,
                ]))
            })
            .update(Update::sgd(LearningRate::Constant(0.0)));
        // Without looking at the machine's load (other processes may run beside the tests).
        let settings = Settings::new(big_batch, 1).watch_load(false);
        let cores = b.num_physical_devices();
        let n = parallel::devices_for(&b, &big, &settings).unwrap();
        assert!(big_batch.is_multiple_of(n));
        if cores >= 2 {
            assert!(n >= 2 && n <= cores, "{n} devices on {cores} cores");
        } else {
            assert_eq!(n, 1);
        }
        // On 2 cores, one of them kept busy by another process: one device.
        if cores == 2 {
            let mut busy = std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap();
            std::thread::sleep(std::time::Duration::from_millis(50));
            let watching = parallel::devices_for(&b, &big, &settings.clone().watch_load(true));
            busy.kill().unwrap();
            busy.wait().unwrap();
            assert_eq!(watching.unwrap(), 1);
        }
        // The sync backend runs every device on one thread: one device.
        assert_eq!(
            parallel::devices_for(&SyncBackend::new(), &big, &settings).unwrap(),
            1
        );
    });
}

/// The exchange and the tree as programs on two devices: a device waiting for the other
/// takes chunks of the other's parallel regions (`Report::lent_chunks`), and the results are
/// the same bits as the host-scheduled tree's, where nothing is lent. A busy process beside the training makes
/// one device slower than the other, so the other waits for it at every step.
#[test]
fn a_device_waiting_for_another_runs_part_of_its_regions_with_the_same_bits() {
    with_watchdog(300, || {
        let (wide, batch, samples) = (256, 512, 2048);
        let mut rng = Rng(5);
        let xs: Vec<f64> = (0..samples * IN).map(|_| rng.uniform()).collect();
        let w0: Vec<f64> = (0..IN * wide).map(|_| rng.uniform() * 0.5).collect();
        let x = Tnode::hosted(&["x"], &[samples, IN], P).unwrap();
        x.set_host_values(&xs).unwrap();
        let train = |backend: &dyn Backend, schedule: Schedule| {
            let w = node("w", &[IN, wide]);
            let gw = node("gw", &[IN, wide]);
            let loss = node("loss", &[1]);
            let (w2, l2, g2) = (w.clone(), loss.clone(), gw.clone());
            let m = Model::new()
                .param(&w, &gw, w0.clone())
                .loss(&loss)
                .data(&x)
                .gradient(move |s| {
                    let none = Bindings::empty();
                    let t = |n: &str, d: &[usize]| Tnode::new(&[n], d, P);
                    let (z, h) = (t("z", &[s.rows, wide])?, t("h", &[s.rows, wide])?);
                    let (hh, sq) = (t("hh", &[wide, wide])?, t("sq", &[1])?);
                    // loss = Σ (hᵀh) / batch² with h = tanh(x·w); the "gradient" xᵀ·h / batch.
                    let inv = 1.0 / s.batch as f64;
                    let gh = t("gh", &[s.rows, wide])?;
                    Ok(Assignments::seq([
                        nn::matmul(&z, &s.data[0], &w2, "bi,ih->bh", &none)?,
                        nn::unary(&h, Unop::Tanh, &z)?,
                        nn::matmul(&hh, &h, &h, "bh,bk->hk", &none)?,
                        nn::sum(&sq, &hh, "hk->0", &none)?,
                        nn::scale(&l2, &sq, inv * inv)?,
                        nn::scale(&gh, &h, inv)?,
                        nn::matmul(&g2, &s.data[0], &gh, "bi,bh->ih", &none)?,
                    ]))
                })
                .update(Update::sgd(LearningRate::Constant(0.05)));
            let settings = Settings::new(batch, 3)
                .devices(Devices::Count(2))
                .schedule(schedule);
            parallel::train(backend, &m, &settings, &mut |_| {})
                .unwrap_or_else(|e| panic!("{schedule:?}: {e}"))
        };
        let reference = train(&MulticoreBackend::new(), Schedule::HostTree);
        assert_eq!(reference.lent_chunks, 0);
        let cores = MulticoreBackend::new().num_physical_devices();
        for schedule in [Schedule::Exchange, Schedule::Tree] {
            let mut busy = std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap();
            let lent = train(&MulticoreBackend::new(), schedule);
            busy.kill().unwrap();
            busy.wait().unwrap();
            assert_eq!(lent.schedule, schedule);
            assert_eq!(bits(&lent), bits(&reference), "{schedule:?}");
            // On two cores, one device shares its core with the busy process at every one
            // of the 12 steps, and its regions are cut into dozens of chunks while the
            // other waits.
            if cores == 2 {
                assert!(lent.lent_chunks > 0, "{schedule:?}: no chunk was lent");
            }
        }
    });
}

/// A model or settings that cannot work are typed errors naming what is wrong, before
/// anything is compiled.
#[test]
fn bad_models_and_settings_are_typed_errors() {
    let net = net();
    let b = SyncBackend::new();
    let settings = Settings::new(BATCH, 1).devices(Devices::Count(2));
    let fail = |m: &Model, s: &Settings| -> Error {
        parallel::train(&b, m, s, &mut |_| {}).expect_err("an error")
    };
    let full = || model(&net, sgd());

    // Missing pieces.
    let e = fail(
        &Model::new()
            .loss(&net.loss)
            .data(&net.x)
            .gradient(|s| gradient(&net, s))
            .update(sgd()),
        &settings,
    );
    assert!(
        matches!(&e, Error::Missing { what, .. } if what == "parameters"),
        "{e}"
    );
    assert!(e.to_string().contains("Model::param"), "{e}");
    let no = |m: Model, what: &str| {
        let e = fail(&m, &settings);
        assert!(
            matches!(&e, Error::Missing { what: w, .. } if w == what),
            "{what}: {e}"
        );
    };
    let params = |m: Model<'static>| -> Model<'static> {
        let n = self::net();
        let mut m = m;
        for (p, g) in n.params.iter().zip(&n.grads) {
            m = m.param(p, g, vec![0.0; p.numel()]);
        }
        m
    };
    no(params(Model::new()).data(&net.x).update(sgd()), "loss");
    no(
        params(Model::new()).loss(&net.loss).update(sgd()),
        "gradient code",
    );
    no(
        params(Model::new())
            .loss(&net.loss)
            .gradient(|_| Ok(Assignments::Noop)),
        "update rule",
    );
    no(
        params(Model::new())
            .loss(&net.loss)
            .gradient(|_| Ok(Assignments::Noop))
            .update(sgd()),
        "data",
    );

    // A gradient of the wrong dims, naming both tensors.
    let wrong = node("gw1_wrong", &[HID, IN]);
    let e = fail(
        &full().param(&node("w3", &[IN, HID]), &wrong, vec![0.0; IN * HID]),
        &settings,
    );
    match &e {
        Error::GradientDims {
            param,
            grad,
            param_dims,
            grad_dims,
        } => {
            assert_eq!((param.as_str(), grad.as_str()), ("w3", "gw1_wrong"));
            assert_eq!(
                (param_dims.as_slice(), grad_dims.as_slice()),
                (&[IN, HID][..], &[HID, IN][..])
            );
        }
        e => panic!("{e}"),
    }
    // Initial values of the wrong count.
    let e = fail(
        &full().param(&node("w4", &[2]), &node("g4", &[2]), vec![0.0; 3]),
        &settings,
    );
    assert!(
        matches!(
            e,
            Error::Count {
                expected: 2,
                got: 3,
                ..
            }
        ),
        "{e}"
    );
    // A parameter of another precision.
    let single = Tnode::new(&["w5"], &[2], Prec::Single).unwrap();
    let e = fail(
        &full().param(
            &single,
            &Tnode::new(&["g5"], &[2], Prec::Single).unwrap(),
            vec![0.0; 2],
        ),
        &settings,
    );
    assert!(
        matches!(&e, Error::MixedPrecision { tensor, .. } if tensor == "w5"),
        "{e}"
    );
    // A loss that is not a scalar.
    let mut m = Model::new();
    for ((p, g), init) in net.params.iter().zip(&net.grads).zip(initial()) {
        m = m.param(p, g, init);
    }
    let wide_loss = node("wide_loss", &[2]);
    let e = fail(
        &m.loss(&wide_loss)
            .data(&net.x)
            .gradient(|_| Ok(Assignments::Noop))
            .update(sgd()),
        &settings,
    );
    assert!(
        matches!(&e, Error::Dims { tensor, .. } if tensor == "wide_loss"),
        "{e}"
    );
    // Data without values, data of another number of samples.
    let unhosted = node("unhosted", &[SAMPLES, 2]);
    let e = fail(&full().data(&unhosted), &settings);
    assert!(
        matches!(&e, Error::NotHosted { tensor, .. } if tensor == "unhosted"),
        "{e}"
    );
    let short = Tnode::hosted(&["short"], &[SAMPLES - 1, 2], P).unwrap();
    let e = fail(&full().data(&short), &settings);
    assert!(
        matches!(e, Error::Count { expected: SAMPLES, got, .. } if got == SAMPLES - 1),
        "{e}"
    );
    // A constant without values.
    let e = fail(&full().constant(&node("table", &[4])), &settings);
    assert!(
        matches!(&e, Error::NotHosted { tensor, .. } if tensor == "table"),
        "{e}"
    );
    // Learning rates of the wrong count.
    let e = fail(
        &model(&net, Update::sgd(LearningRate::PerStep(vec![0.1; 3]))),
        &settings,
    );
    assert!(
        matches!(e, Error::Count { expected, got: 3, .. } if expected == SAMPLES / BATCH),
        "{e}"
    );

    // Settings.
    let e = fail(&full(), &settings.clone().devices(Devices::Count(5)));
    assert!(
        matches!(
            e,
            Error::BatchSplit {
                batch: BATCH,
                parts: 5,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("cannot be split evenly into 5"),
        "{e}"
    );
    let e = fail(&full(), &settings.clone().devices(Devices::Count(0)));
    assert!(
        matches!(&e, Error::Invalid { what, .. } if what == "Settings::devices"),
        "{e}"
    );
    let e = fail(&full(), &Settings::new(0, 1));
    assert!(
        matches!(&e, Error::Invalid { what, .. } if what == "Settings::batch"),
        "{e}"
    );
    let e = fail(&full(), &Settings::new(BATCH, 0));
    assert!(
        matches!(&e, Error::Invalid { what, .. } if what == "Settings::epochs"),
        "{e}"
    );
    let e = fail(&full(), &Settings::new(SAMPLES + 1, 1));
    assert!(
        matches!(&e, Error::Invalid { what, .. } if what == "Settings::batch"),
        "{e}"
    );
    let e = fail(&full(), &settings.clone().merge(MergeBufferUse::No));
    assert!(
        matches!(&e, Error::Invalid { what, .. } if what == "Settings::merge"),
        "{e}"
    );

    // An error of the gradient code reaches the caller as it is.
    let e = fail(
        &params(Model::new())
            .loss(&net.loss)
            .data(&net.x)
            .gradient(|s| nn::relu(&s.data[0], &node("other", &[1, 2])))
            .update(sgd()),
        &settings,
    );
    assert!(matches!(e, Error::Assignment(_)), "{e}");
}
