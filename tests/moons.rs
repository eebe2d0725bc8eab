//! The two-moons job: the `arrayjit::nn` helpers, the MLP's gradients against finite
//! differences computed here in plain `f64` Rust, and short data-parallel training runs.

use arrayjit::backend::{Backend, Config, MergeBufferUse, MulticoreBackend, SyncBackend};
use arrayjit::ir::{Bindings, InitOp, MemoryMode, Ndarray, Prec, StaticSymbol, Tnode};
use arrayjit::nn::moons::{self, dataset};
use arrayjit::nn::{self, HostMlp, Mlp};
use arrayjit::parallel::{self, Devices, Report, Schedule, Settings, Update};
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

fn hosted(name: &str, dims: &[usize], prec: Prec, values: &[f64]) -> Tnode {
    Tnode::with_init(
        &[name],
        dims,
        prec,
        &InitOp::ConstantFill {
            values: values.to_vec(),
            strict: true,
        },
    )
    .unwrap()
}

#[test]
fn dataset_is_seeded_and_interleaved() {
    let a = dataset(300, 7);
    assert_eq!(a, dataset(300, 7));
    assert_ne!(a, dataset(300, 8));
    assert_eq!(a.len(), 300);
    assert_eq!(dataset(7, 1).len(), 7);
    for (i, (p, t)) in a.points.iter().zip(&a.labels).enumerate() {
        assert_eq!(*t, if i % 2 == 0 { 1.0 } else { -1.0 });
        // Upper moon: cos/sin of an angle in [0, π] plus noise; lower moon shifted.
        let (x, y) = if *t > 0.0 {
            (p[0], p[1])
        } else {
            (1.0 - p[0], 0.5 - p[1])
        };
        let r = (x * x + y * y).sqrt();
        assert!((r - 1.0).abs() <= 0.15, "point {i} {p:?}");
        assert!(y >= -0.1 - 1e-12, "point {i} {p:?}");
    }
}

/// Every helper on small tensors, against values computed by hand.
#[test]
fn helpers_compute_what_they_say() {
    with_watchdog(120, || {
        let b = SyncBackend::new();
        b.initialize(Config::default());
        let dev = b.new_virtual_device(&b.get_device(0).unwrap()).unwrap();
        let none = Bindings::empty();
        let p = Prec::Double;
        let x = hosted("x", &[2, 3], p, &[1., -2., 3., -4., 5., -6.]);
        let w = hosted("w", &[3, 2], p, &[1., 0., 0., 1., 2., -1.]);
        let bias = hosted("bias", &[2], p, &[0.5, -0.5]);
        let outs: Vec<Tnode> = [
            "mm",
            "mm_ordered",
            "biased",
            "act",
            "gated",
            "sums",
            "wt",
            "scaled",
        ]
        .iter()
        .zip([
            [2, 2],
            [2, 2],
            [2, 2],
            [2, 2],
            [2, 2],
            [2, 1],
            [2, 3],
            [2, 3],
        ])
        .map(|(n, d)| Tnode::hosted(&[n], &d, p).unwrap())
        .collect();
        let [mm, mmo, biased, act, gated, sums, wt, scaled] = &outs[..] else {
            unreachable!()
        };
        let sums1 = Tnode::hosted(&["sums1"], &[2], p).unwrap();
        let code = arrayjit::ir::Assignments::seq([
            nn::matmul(mm, &x, &w, "bi,io->bo", &none).unwrap(),
            nn::matmul_ordered(mmo, &x, &w, "bi,io->bo", "bio", &none).unwrap(),
            nn::add_bias(biased, mm, &bias, "bo,o->bo", &none).unwrap(),
            nn::relu(act, biased).unwrap(),
            nn::relu_backward(gated, biased, mm).unwrap(),
            nn::sum(&sums1, &x, "bi->b", &none).unwrap(),
            nn::sum_ordered(sums, mm, "bo->b0", "bo", &none).unwrap(),
            nn::transpose(wt, &w, "io->oi", &none).unwrap(),
            nn::scale(scaled, &x, -0.5).unwrap(),
        ]);
        let r = b
            .link(
                &[],
                &b.init(&dev).unwrap(),
                &b.compile(true, Some("helpers"), &none, &code).unwrap(),
            )
            .unwrap();
        for t in [&x, &w, &bias] {
            assert!(b.from_host(r.context(), t).unwrap());
        }
        r.schedule().unwrap();
        for t in outs.iter().chain([&sums1]) {
            assert!(b.to_host(r.context(), t).unwrap(), "{t}");
        }
        b.await_device(&dev).unwrap();
        // x @ w = [[1+6, -2-3], [-4-12, 5+6]] = [[7, -5], [-16, 11]]
        assert_eq!(mm.host_values().unwrap(), vec![7., -5., -16., 11.]);
        assert_eq!(mmo.host_values().unwrap(), vec![7., -5., -16., 11.]);
        assert_eq!(biased.host_values().unwrap(), vec![7.5, -5.5, -15.5, 10.5]);
        assert_eq!(act.host_values().unwrap(), vec![7.5, 0., 0., 10.5]);
        assert_eq!(gated.host_values().unwrap(), vec![7., 0., 0., 11.]);
        assert_eq!(sums1.host_values().unwrap(), vec![2., -5.]);
        assert_eq!(sums.host_values().unwrap(), vec![2., -5.]);
        assert_eq!(wt.host_values().unwrap(), vec![1., 0., 2., 0., 1., -1.]);
        assert_eq!(
            scaled.host_values().unwrap(),
            vec![-0.5, 1., -1.5, 2., -2.5, 3.]
        );
        // A loop order that misses a letter is an error, not a panic.
        assert!(nn::matmul_ordered(mmo, &x, &w, "bi,io->bo", "bo", &none).is_err());
        assert!(nn::relu(act, &x).is_err());
    });
}

/// The MLP's loss in plain f64 Rust: mean over the full batch of `relu(1 - t·y)`.
fn reference_loss(
    sizes: &[usize],
    weights: &[Vec<f64>],
    biases: &[Vec<f64>],
    xs: &[[f64; 2]],
    ts: &[f64],
) -> f64 {
    let mut total = 0.0;
    for (x, t) in xs.iter().zip(ts) {
        let mut a = x.to_vec();
        for l in 0..weights.len() {
            let (ins, outs) = (sizes[l], sizes[l + 1]);
            let mut z = vec![0.0; outs];
            for o in 0..outs {
                z[o] = biases[l][o];
                for i in 0..ins {
                    z[o] += a[i] * weights[l][i * outs + o];
                }
                if l + 1 < weights.len() {
                    z[o] = z[o].max(0.0);
                }
            }
            a = z;
        }
        total += (1.0 - t * a[0]).max(0.0);
    }
    total / xs.len() as f64
}

/// The gradients that the library's backward assignments compute for a tiny model match
/// central finite differences of the loss computed above.
#[test]
fn gradients_match_finite_differences() {
    with_watchdog(120, || {
        let sizes = [2, 4, 3, 1];
        let m = 10;
        let p = Prec::Double;
        let mlp = Mlp::new(&sizes, p, 11).unwrap();
        // Non-zero biases, so that they matter.
        for (k, l) in mlp.layers().iter().enumerate() {
            let n = l.b.numel();
            let v: Vec<f64> = (0..n).map(|i| 0.1 * (i as f64 - k as f64) - 0.05).collect();
            l.b.set_host_values(&v).unwrap();
        }
        let data = dataset(m, 3);
        let xs: Vec<f64> = data.points.iter().flatten().copied().collect();
        let data_x = hosted("data_x", &[1, m, 2], p, &xs);
        let data_t = hosted("data_t", &[1, m, 1], p, &data.labels);
        let slot = StaticSymbol::new("slot", Some(1));
        let loss = Tnode::builder(&["loss"], &[1], p)
            .memory(MemoryMode::OnDevice)
            .build()
            .unwrap();
        let code = mlp.grad_routine(&data_x, &data_t, &slot, &loss, m).unwrap();
        let b = MulticoreBackend::new();
        b.initialize(Config::default());
        let dev = b.new_virtual_device(&b.get_device(0).unwrap()).unwrap();
        let compiled = b
            .compile(true, Some("grad"), &Bindings(vec![slot]), &code)
            .unwrap();
        let r = b.link(&[], &b.init(&dev).unwrap(), &compiled).unwrap();
        for t in mlp.params().iter().chain([&data_x, &data_t]) {
            assert!(b.from_host(r.context(), t).unwrap(), "{t}");
        }
        r.schedule().unwrap();
        b.await_device(&dev).unwrap();
        let read = |t: &Tnode| {
            let mut a = Ndarray::zeros(p, t.dims());
            b.buffer_to_host(&mut a, &r.context().get_buffer(t).unwrap())
                .unwrap();
            a.to_f64_vec()
        };

        let model = mlp.to_host_model().unwrap();
        let (weights, biases) = (model.weights.clone(), model.biases.clone());
        let f = |w: &[Vec<f64>], bs: &[Vec<f64>]| {
            reference_loss(&sizes, w, bs, &data.points, &data.labels)
        };
        let l0 = f(&weights, &biases);
        let lib_loss = read(&loss)[0];
        assert!((lib_loss - l0).abs() < 1e-12, "loss {lib_loss} vs {l0}");
        assert!(l0 > 0.0, "the hinge must be active for some samples");

        let eps = 1e-6;
        let mut checked = 0;
        for (l, layer) in mlp.layers().iter().enumerate() {
            for (is_bias, g) in [(false, &layer.gw), (true, &layer.gb)] {
                let lib = read(g);
                let mut fd = vec![];
                for k in 0..lib.len() {
                    let (mut wp, mut bp) = (weights.clone(), biases.clone());
                    let (mut wm, mut bm) = (weights.clone(), biases.clone());
                    if is_bias {
                        bp[l][k] += eps;
                        bm[l][k] -= eps;
                    } else {
                        wp[l][k] += eps;
                        wm[l][k] -= eps;
                    }
                    fd.push((f(&wp, &bp) - f(&wm, &bm)) / (2.0 * eps));
                }
                for (k, (a, e)) in lib.iter().zip(&fd).enumerate() {
                    assert!(
                        (a - e).abs() <= 1e-7 + 1e-5 * e.abs(),
                        "{g}[{k}]: library {a} vs finite difference {e}"
                    );
                    checked += 1;
                }
                assert!(
                    fd.iter().any(|v| v.abs() > 1e-6),
                    "{g}: every gradient is zero, the check would be vacuous"
                );
            }
        }
        assert_eq!(checked, 2 * 4 + 4 + 4 * 3 + 3 + 3 + 1);
    });
}

/// The demo's job as `examples/moons.rs` runs it: the moons model with the SGD update,
/// trained by `arrayjit::parallel`, the accuracy of the evaluation, and the trained model.
struct TrainReport {
    report: Report,
    accuracy: f64,
    model: HostMlp,
}

impl std::ops::Deref for TrainReport {
    type Target = Report;
    fn deref(&self) -> &Report {
        &self.report
    }
}

fn train(
    backend: &dyn Backend,
    data: &moons::Dataset,
    settings: &Settings,
    on_epoch: &mut dyn FnMut(usize, f64),
) -> arrayjit::Result<TrainReport> {
    let mlp = Mlp::new_unstored(&[2, 16, 16, 1], Prec::Single, 1)?;
    let (model, scores) = moons::model(&mlp, data)?;
    let steps = data.len() / settings.batch.max(1) * settings.epochs;
    let model = model.update(Update::sgd(moons::learning_rate(0.1, steps)).weight_decay(0.0002));
    let report = parallel::train(backend, &model, settings, &mut |e| {
        on_epoch(e.epoch, e.loss)
    })?;
    Ok(TrainReport {
        accuracy: moons::accuracy(&scores, data)?,
        model: mlp.host_model_from(&report.flat_params())?,
        report,
    })
}

fn short_config(devices: usize, merge: MergeBufferUse) -> Settings {
    Settings::new(24, 10)
        .devices(Devices::Count(devices))
        .merge(merge)
        .shuffle(Some(1))
}

fn short_run(backend: &dyn Backend, devices: usize, merge: MergeBufferUse) -> TrainReport {
    short_run_with(backend, &short_config(devices, merge))
}

fn short_run_with(backend: &dyn Backend, cfg: &Settings) -> TrainReport {
    let Devices::Count(devices) = cfg.devices else {
        panic!("short runs give the number of devices")
    };
    let data = dataset(480, 1);
    let mut seen = vec![];
    let report = train(backend, &data, cfg, &mut |e, l| seen.push((e, l))).unwrap();
    assert_eq!(report.devices, devices);
    // The host copy of the trained model agrees with the evaluation on the device.
    let host_correct = data
        .points
        .iter()
        .zip(&data.labels)
        .filter(|(p, t)| (report.model.predict(&p[..])[0] > 0.0) == (**t > 0.0))
        .count();
    let host_accuracy = host_correct as f64 / data.len() as f64;
    assert!(
        (host_accuracy - report.accuracy).abs() <= 2.0 / data.len() as f64,
        "host model accuracy {host_accuracy} vs {}",
        report.accuracy
    );
    assert_eq!(report.steps, 200);
    assert_eq!(report.samples, 4800);
    assert_eq!(
        seen,
        report
            .epoch_losses
            .iter()
            .enumerate()
            .map(|(e, l)| (e + 1, *l))
            .collect::<Vec<_>>()
    );
    report
}

fn assert_learns(r: &TrainReport) {
    let l = &r.epoch_losses;
    assert_eq!(l.len(), 10);
    assert!(l.iter().all(|v| v.is_finite()), "{l:?}");
    assert!(l[9] < 0.6 * l[0], "the loss must fall: {l:?}");
    assert!(r.accuracy > 0.9, "accuracy {} (losses {l:?})", r.accuracy);
    assert!(r.compile_time > Duration::ZERO && r.train_time > Duration::ZERO);
    assert!(r.samples_per_sec() > 0.0);
}

fn assert_same_curve(a: &TrainReport, b: &TrainReport) {
    for (x, y) in a.epoch_losses.iter().zip(&b.epoch_losses) {
        assert!(
            (x - y).abs() <= 1e-3 * x.abs().max(1e-3),
            "loss curves differ: {:?} vs {:?}",
            a.epoch_losses,
            b.epoch_losses
        );
    }
    assert!((a.accuracy - b.accuracy).abs() <= 0.01);
}

#[test]
fn short_run_learns_on_one_device() {
    with_watchdog(300, || {
        let r = short_run(&MulticoreBackend::new(), 1, MergeBufferUse::Streaming);
        assert_learns(&r);
    });
}

/// Two devices, streaming merges: learns, and follows the single-device loss curve (only the
/// order of the sums differs).
#[test]
fn short_run_learns_on_two_devices_like_on_one() {
    with_watchdog(300, || {
        let two = short_run(&MulticoreBackend::new(), 2, MergeBufferUse::Streaming);
        assert_learns(&two);
        let one = short_run(&SyncBackend::new(), 1, MergeBufferUse::Streaming);
        assert_same_curve(&one, &two);
    });
}

/// Three virtual devices (a tree that is not a power of two), copy merges, on the synchronous
/// backend: the same curve again.
#[test]
fn copy_merges_on_three_devices_follow_the_same_curve() {
    with_watchdog(300, || {
        let three = short_run(&SyncBackend::new(), 3, MergeBufferUse::Copy);
        assert_learns(&three);
        let one = short_run(&SyncBackend::new(), 1, MergeBufferUse::Copy);
        assert_same_curve(&one, &three);
    });
}

#[test]
fn bad_settings_are_typed_errors() {
    use arrayjit::Error;
    let b = SyncBackend::new();
    let data = dataset(100, 1);
    let cfg = |devices, batch, merge| {
        Settings::new(batch, 1)
            .devices(Devices::Count(devices))
            .merge(merge)
    };
    let err = |c: Settings| {
        train(&b, &data, &c, &mut |_, _| {})
            .err()
            .expect("an error")
    };
    let e = err(cfg(3, 20, MergeBufferUse::Streaming));
    assert!(
        matches!(
            e,
            Error::BatchSplit {
                batch: 20,
                parts: 3,
                ..
            }
        ),
        "{e}"
    );
    let e = err(cfg(1, 200, MergeBufferUse::Streaming));
    assert!(
        matches!(&e, Error::Invalid { what, .. } if what == "Settings::batch"),
        "{e}"
    );
    assert!(e.to_string().contains("at most the 100 samples"), "{e}");
    let e = err(cfg(1, 20, MergeBufferUse::No));
    assert!(
        matches!(&e, Error::Invalid { what, .. } if what == "Settings::merge"),
        "{e}"
    );
    let e = err(cfg(0, 20, MergeBufferUse::Copy));
    assert!(
        matches!(&e, Error::Invalid { what, .. } if what == "Settings::devices"),
        "{e}"
    );
    assert!(matches!(
        Mlp::new(&[2], Prec::Single, 1),
        Err(Error::Invalid { .. })
    ));
    assert!(matches!(
        Mlp::new(&[2, 0, 1], Prec::Single, 1),
        Err(Error::Invalid { .. })
    ));
    // The moons model needs 2 inputs and 1 output.
    let wide = Mlp::new_unstored(&[3, 4, 1], Prec::Single, 1).unwrap();
    assert!(matches!(
        moons::model(&wide, &data),
        Err(Error::Invalid { .. })
    ));
}

/// The devices order their work with events, not host awaits, and the host runs ahead: any
/// missed hazard (a merge reading gradients not yet written, a device computing with stale
/// parameters, a source overwriting gradients still being merged) would change the numbers.
/// Each multicore run must therefore match the synchronous backend's run on the same number of
/// devices bit for bit, for trees of every shape and both merge modes.
#[test]
fn multicore_runs_match_the_sync_backend_exactly() {
    with_watchdog(600, || {
        for devices in [2, 3, 4, 6, 8] {
            for merge in [MergeBufferUse::Streaming, MergeBufferUse::Copy] {
                let sync = short_run(&SyncBackend::new(), devices, merge);
                for _ in 0..2 {
                    let mc = short_run(&MulticoreBackend::new(), devices, merge);
                    assert_eq!(
                        sync.epoch_losses, mc.epoch_losses,
                        "{devices} devices, {merge:?}"
                    );
                    assert_eq!(sync.model, mc.model, "{devices} devices, {merge:?}");
                    assert_eq!(sync.accuracy, mc.accuracy);
                }
            }
        }
    });
}

/// The exchange (one program per queue: a tree per queue, recursive doubling between the
/// queues' leaders), the tree as one program per queue and the host-scheduled tree add the
/// gradients with the same association, so they give the same losses and the same model, bit
/// for bit: on the multicore backend (blocks of devices per core, pinned or not) and on the
/// sync backend (all devices on one queue), for both merge modes. Three and six devices
/// never take the exchange (not a power of two); there `Auto` runs the tree as programs.
#[test]
fn every_schedule_gives_the_same_bits() {
    with_watchdog(600, || {
        type MakeBackend = fn() -> Box<dyn Backend>;
        let backends: [(&str, MakeBackend); 3] = [
            ("sync", || Box::new(SyncBackend::new())),
            ("multicore", || Box::new(MulticoreBackend::new())),
            ("multicore unpinned", || {
                Box::new(MulticoreBackend::new().with_pinning(false))
            }),
        ];
        for devices in [1, 2, 3, 4, 6, 8] {
            for merge in [MergeBufferUse::Streaming, MergeBufferUse::Copy] {
                let host_tree = short_config(devices, merge).schedule(Schedule::HostTree);
                let reference = short_run_with(&SyncBackend::new(), &host_tree);
                assert_eq!(reference.schedule, Schedule::HostTree);
                for (name, make) in &backends {
                    for schedule in [Schedule::Auto, Schedule::Tree, Schedule::HostTree] {
                        let cfg = host_tree.clone().schedule(schedule);
                        let r = short_run_with(make().as_ref(), &cfg);
                        let what = format!("{devices} devices, {merge:?}, {name}, {schedule:?}");
                        assert_eq!(reference.epoch_losses, r.epoch_losses, "{what}");
                        assert_eq!(reference.model, r.model, "{what}");
                        assert_eq!(reference.accuracy, r.accuracy, "{what}");
                        let ran = match schedule {
                            Schedule::Auto if devices.is_power_of_two() => Schedule::Exchange,
                            Schedule::Auto => Schedule::Tree,
                            other => other,
                        };
                        assert_eq!(r.schedule, ran, "{what}");
                    }
                }
            }
        }
        // Asked for where it does not fit, the exchange is an error naming why.
        let cfg = short_config(3, MergeBufferUse::Streaming).schedule(Schedule::Exchange);
        let e = train(&SyncBackend::new(), &dataset(480, 1), &cfg, &mut |_, _| {})
            .err()
            .expect("an error");
        assert!(
            matches!(e, arrayjit::Error::ScheduleUnavailable { .. }),
            "{e}"
        );
        assert!(e.to_string().contains("the exchange needs"), "{e}");
    });
}

/// A fusion buffer compiled to C: packing hosted tensors, then unpacking into tensors the
/// optimizer may inline (no memory mode set) that a product reads, gives the values worked
/// out here by hand.
#[test]
fn buckets_pack_and_unpack_in_compiled_code() {
    use arrayjit::ir::einsum::projections;
    use arrayjit::ir::{Assignments, Binop, Buffer, Unop};
    use arrayjit::{Jit, JitConfig};
    let w = hosted("w", &[2, 3], Prec::Single, &[1., 2., 3., 4., 5., 6.]);
    let b = hosted("b", &[3], Prec::Single, &[10., 20., 30.]);
    let packed = nn::Bucket::hosted(&["packed"], &[w.clone(), b.clone()]).unwrap();
    // The copies the second routine unpacks into, and what it computes from them.
    let w2 = Tnode::new(&["w2"], &[2, 3], Prec::Single).unwrap();
    let b2 = Tnode::new(&["b2"], &[3], Prec::Single).unwrap();
    let copies = nn::Bucket::hosted(&["copies"], &[w2.clone(), b2.clone()]).unwrap();
    let out = Tnode::hosted(&["out"], &[3], Prec::Single).unwrap();
    let none = Bindings::empty();
    let col_sums_plus_b = Assignments::seq([
        Assignments::AccumUnop {
            initialize_neutral: true,
            accum: Binop::Add,
            op: Unop::Identity,
            lhs: out.clone(),
            rhs: Buffer::Node(w2.clone()),
            projections: projections("ij->j", out.dims(), &[w2.dims()], &none).unwrap(),
        },
        Assignments::AccumUnop {
            initialize_neutral: false,
            accum: Binop::Add,
            op: Unop::Relu,
            lhs: out.clone(),
            rhs: Buffer::Node(b2.clone()),
            projections: projections("j->j", out.dims(), &[b2.dims()], &none).unwrap(),
        },
    ]);
    let jit = Jit::new(JitConfig::default()).unwrap();
    let pack = jit.compile("pack", &none, &packed.pack().unwrap()).unwrap();
    let use_it = jit
        .compile(
            "use",
            &none,
            &Assignments::seq([
                // The packed values, copied as a whole into the other bucket's flat tensor.
                Assignments::AccumBinop {
                    initialize_neutral: false,
                    accum: Binop::Arg2,
                    op: Binop::Arg2,
                    lhs: copies.flat().clone(),
                    rhs1: Buffer::Node(packed.flat().clone()),
                    rhs2: Buffer::Node(packed.flat().clone()),
                    projections: projections(
                        "i,i->i",
                        copies.flat().dims(),
                        &[packed.flat().dims(), packed.flat().dims()],
                        &none,
                    )
                    .unwrap(),
                },
                copies.unpack().unwrap(),
                col_sums_plus_b,
            ]),
        )
        .unwrap();
    let device = jit.device().unwrap();
    let ctx = jit.context(&device).unwrap();
    let pack = jit.link(&ctx, &pack).unwrap();
    let use_it = jit.link(pack.context(), &use_it).unwrap();
    jit.upload(use_it.context(), &w).unwrap();
    jit.upload(use_it.context(), &b).unwrap();
    pack.schedule().unwrap();
    use_it.schedule().unwrap();
    jit.download(use_it.context(), packed.flat()).unwrap();
    jit.download(use_it.context(), &out).unwrap();
    assert_eq!(
        packed.flat().host_values().unwrap(),
        vec![1., 2., 3., 4., 5., 6., 10., 20., 30.]
    );
    // out[j] = Σ_i w[i,j] + relu(b[j])
    assert_eq!(
        out.host_values().unwrap(),
        vec![1. + 4. + 10., 2. + 5. + 20., 3. + 6. + 30.]
    );
}
