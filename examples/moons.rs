//! Data-parallel training of a 2-16-16-1 ReLU MLP on two moons, on every core.
//!
//! ```text
//! cargo run --release --example moons -- [--seed N] [--points N] [--hidden N] [--batch N]
//!     [--epochs N] [--lr X] [--weight-decay X] [--devices N] [--copy-to-merge]
//!     [--schedule auto|exchange|tree|host-tree|deterministic:S] [--backend multicore|sync|mpi]
//!     [--plot FILE.png] [--no-plot]
//! mpirun -n R target/release/examples/moons --backend mpi [--devices N] ...
//! ```
//!
//! Prints the mean loss of every epoch, the training-set accuracy, a terminal plot of the
//! points and the decision boundary, where the time went, and a summary line
//! `accuracy: A devices: N ranks: R samples/s: S compile_ms: C`. With `--plot FILE.png` it
//! also draws the points and the decision boundary into a PNG.
//!
//! With `--backend mpi` (built with `--features mpi`, run under `mpirun`), every rank trains
//! its `--devices N` local devices (default 1) on its share of each batch, the ranks
//! all-reduce the gradients, and only rank 0 prints; `devices: N` in the summary is per rank.
//! An error on a rank prints `rank R: error: ...` and aborts the whole job.
//!
//! The dataset and the model (the MLP, its hinge loss and gradients) are `arrayjit::nn::moons`;
//! the training (per-device gradients of batch slices, merged through merge buffers in a tree
//! or the hierarchical exchange, the SGD update) is `arrayjit::parallel`, which trains any
//! model this way.

use arrayjit::backend::{backend_by_name, Backend, Config, MergeBufferUse};
use arrayjit::ir::Prec;
use arrayjit::nn::moons::{self, Dataset};
use arrayjit::nn::{HostMlp, Mlp};
use arrayjit::parallel::{self, Devices, Schedule, Settings, Update};
use std::process::ExitCode;

const USAGE: &str = "usage: moons [--seed N] [--points N] [--hidden N] [--batch N] [--epochs N]
             [--lr X] [--weight-decay X] [--devices N] [--copy-to-merge]
             [--schedule auto|exchange|tree|host-tree|deterministic:S]
             [--backend multicore|sync|mpi]
             [--plot FILE.png] [--no-plot]

Trains a 2-H-H-1 ReLU MLP (hinge loss, SGD with linearly decaying learning rate and weight
decay) on two moons, data-parallel over N virtual devices.

  --seed N          dataset, initialization and batch-order seed (default 1)
  --points N        dataset size (default 2400)
  --hidden N        units per hidden layer (default 16)
  --batch N         samples per step, split evenly across devices (default 120)
  --epochs N        passes over the dataset (default 20)
  --lr X            initial learning rate, decaying linearly (default 0.1)
  --weight-decay X  weight decay (default 0.0002)
  --devices N       virtual devices (default: as many as pay off for a step this size, by
                    the library's cost model, dividing the batch); with --backend mpi:
                    devices per rank (default 1)
  --copy-to-merge   copy gradients into merge buffers (default: streaming, no copy)
  --schedule NAME   how steps run: auto (default: the exchange where the devices allow it,
                    else the tree, as one program per core; the host-scheduled tree over
                    MPI), exchange, tree, host-tree (the tree, scheduled step by step), or
                    deterministic:S (S shards per batch: the same bits on any number of
                    devices up to S)
  --backend NAME    multicore (default), sync, or mpi (under mpirun; needs a build with
                    --features mpi)
  --plot FILE.png   also draw the points and the decision boundary into a PNG
  --no-plot         skip the terminal plot";

struct Args {
    seed: u64,
    points: usize,
    hidden: usize,
    lr: f64,
    weight_decay: f64,
    /// Devices per rank (on the in-process backends, the one rank holds them all).
    devices: Option<usize>,
    settings: Settings,
    backend: String,
    png: Option<String>,
    terminal_plot: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        seed: 1,
        points: 2400,
        hidden: 16,
        lr: 0.1,
        weight_decay: 0.0002,
        devices: None,
        settings: Settings::new(120, 20),
        backend: "multicore".into(),
        png: None,
        terminal_plot: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| format!("{flag} needs a value\n\n{USAGE}"))
        };
        fn num<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String> {
            v.parse()
                .map_err(|_| format!("{flag}: cannot read {v:?} as a number"))
        }
        match flag.as_str() {
            "--seed" => a.seed = num(&flag, value()?)?,
            "--points" => a.points = num(&flag, value()?)?,
            "--hidden" => a.hidden = num(&flag, value()?)?,
            "--batch" => a.settings.batch = num(&flag, value()?)?,
            "--epochs" => a.settings.epochs = num(&flag, value()?)?,
            "--lr" => a.lr = num(&flag, value()?)?,
            "--weight-decay" => a.weight_decay = num(&flag, value()?)?,
            "--devices" => a.devices = Some(num(&flag, value()?)?),
            "--copy-to-merge" => a.settings.merge = MergeBufferUse::Copy,
            "--schedule" => {
                a.settings.schedule = value()?
                    .parse()
                    .map_err(|e: arrayjit::Error| format!("--schedule: {e}"))?
            }
            "--backend" => a.backend = value()?,
            "--plot" => a.png = Some(value()?),
            "--no-plot" => a.terminal_plot = false,
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown flag {other:?}\n\n{USAGE}")),
        }
    }
    Ok(a)
}

/// The bounding box of the points, with a margin.
fn bounds(data: &Dataset) -> (f64, f64, f64, f64) {
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for p in &data.points {
        x0 = x0.min(p[0]);
        x1 = x1.max(p[0]);
        y0 = y0.min(p[1]);
        y1 = y1.max(p[1]);
    }
    let (mx, my) = ((x1 - x0) * 0.05, (y1 - y0) * 0.08);
    (x0 - mx, x1 + mx, y0 - my, y1 + my)
}

/// The points (`+` label 1, `o` label -1) over the model's decision regions (`.` where it
/// predicts 1, blank where it predicts -1), with the decision boundary drawn as `#`.
fn terminal_plot(data: &Dataset, model: &HostMlp, cols: usize, rows: usize) -> String {
    let (x0, x1, y0, y1) = bounds(data);
    let at = |c: f64, r: f64| {
        let x = x0 + (c + 0.5) / cols as f64 * (x1 - x0);
        let y = y1 - (r + 0.5) / rows as f64 * (y1 - y0);
        model.predict(&[x, y])[0] > 0.0
    };
    let mut grid = vec![vec![' '; cols]; rows];
    for (r, row) in grid.iter_mut().enumerate() {
        for (c, cell) in row.iter_mut().enumerate() {
            let here = at(c as f64, r as f64);
            // A boundary cell: the sign changes within the cell.
            let (rf, cf) = (r as f64, c as f64);
            let edge = [(-0.5, 0.0), (0.5, 0.0), (0.0, -0.5), (0.0, 0.5)]
                .iter()
                .any(|(dc, dr)| at(cf + dc, rf + dr) != here);
            *cell = if edge {
                '#'
            } else if here {
                '.'
            } else {
                ' '
            };
        }
    }
    for (p, t) in data.points.iter().zip(&data.labels) {
        let c = ((p[0] - x0) / (x1 - x0) * cols as f64) as usize;
        let r = ((y1 - p[1]) / (y1 - y0) * rows as f64) as usize;
        if c < cols && r < rows {
            grid[r][c] = if *t > 0.0 { '+' } else { 'o' };
        }
    }
    let border = format!("+{}+", "-".repeat(cols));
    let mut out = border.clone();
    out.push('\n');
    for row in grid {
        out.push('|');
        out.extend(row);
        out.push_str("|\n");
    }
    out.push_str(&border);
    out
}

/// Draws the decision regions, the boundary and the points into a PNG (no text, so no fonts
/// are needed).
fn png_plot(path: &str, data: &Dataset, model: &HostMlp) -> Result<(), String> {
    use plotters::prelude::*;
    let (x0, x1, y0, y1) = bounds(data);
    // Equal scales on both axes.
    let w = 800u32;
    let h = ((w as f64 * (y1 - y0) / (x1 - x0)) as u32).clamp(200, 1600);
    let to_xy = |px: f64, py: f64| {
        (
            x0 + px / w as f64 * (x1 - x0),
            y1 - py / h as f64 * (y1 - y0),
        )
    };
    let root = BitMapBackend::new(path, (w, h)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("drawing {path}: {e}");
    root.fill(&WHITE).map_err(|e| err(&e))?;
    // Regions, evaluated on 4x4-pixel cells; the boundary where neighbouring cells differ.
    let cell = 4u32;
    let (gw, gh) = (w / cell, h / cell);
    let sign: Vec<Vec<bool>> = (0..gh)
        .map(|r| {
            (0..gw)
                .map(|c| {
                    let (x, y) = to_xy(
                        (c * cell) as f64 + cell as f64 / 2.0,
                        (r * cell) as f64 + cell as f64 / 2.0,
                    );
                    model.predict(&[x, y])[0] > 0.0
                })
                .collect()
        })
        .collect();
    let pos = RGBColor(205, 222, 245);
    let neg = RGBColor(247, 214, 205);
    let line = RGBColor(60, 60, 60);
    for r in 0..gh as usize {
        for c in 0..gw as usize {
            let s = sign[r][c];
            let edge = (c + 1 < gw as usize && sign[r][c + 1] != s)
                || (r + 1 < gh as usize && sign[r + 1][c] != s);
            let color = if edge {
                line
            } else if s {
                pos
            } else {
                neg
            };
            let (px, py) = ((c as u32 * cell) as i32, (r as u32 * cell) as i32);
            root.draw(&Rectangle::new(
                [(px, py), (px + cell as i32, py + cell as i32)],
                color.filled(),
            ))
            .map_err(|e| err(&e))?;
        }
    }
    let blue = RGBColor(31, 90, 180);
    let red = RGBColor(200, 60, 40);
    for (p, t) in data.points.iter().zip(&data.labels) {
        let px = ((p[0] - x0) / (x1 - x0) * w as f64) as i32;
        let py = ((y1 - p[1]) / (y1 - y0) * h as f64) as i32;
        let color = if *t > 0.0 { blue } else { red };
        root.draw(&Circle::new((px, py), 3, color.filled()))
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn run(args: Args, backend: &dyn Backend) -> Result<(), String> {
    backend.initialize(Config::default());
    let e = |e: arrayjit::Error| e.to_string();
    let data = moons::dataset(args.points, args.seed);
    let ranks = backend.num_ranks();
    // Only rank 0 prints (every rank computes the same).
    let out = backend.rank() == 0;
    macro_rules! say {
        ($($t:tt)*) => { if out { println!($($t)*) } };
    }
    let h = args.hidden;
    let mlp = Mlp::new_unstored(&[2, h, h, 1], Prec::Single, args.seed).map_err(e)?;
    let (model, scores) = moons::model(&mlp, &data).map_err(e)?;
    let settings = args.settings.clone().shuffle(Some(args.seed));
    let steps = data.len() / settings.batch.max(1) * settings.epochs;
    let update = Update::sgd(moons::learning_rate(args.lr, steps)).weight_decay(args.weight_decay);
    let model = model.update(update);
    // The devices: as many per rank as asked for, else what the library's cost model picks
    // (one per rank over MPI).
    let settings = match args.devices {
        Some(n) => settings.devices(Devices::Count(n * ranks)),
        None => {
            let n = parallel::devices_for(backend, &model, &settings).map_err(e)?;
            settings.devices(Devices::Count(n))
        }
    };
    let Devices::Count(total) = settings.devices else {
        unreachable!("the count was just set")
    };
    let devices = total / ranks.max(1);
    let plural = if devices == 1 { "" } else { "s" };
    let where_ = if ranks > 1 {
        format!(
            "{ranks} ranks × {devices} {} device{plural} ({total} devices)",
            backend.name()
        )
    } else {
        format!("{devices} {} device{plural}", backend.name())
    };
    let merges = match settings.merge {
        MergeBufferUse::Copy => "copy",
        _ => "streaming",
    };
    say!(
        "two moons: {} points, MLP 2-{h}-{h}-1, batch {}, {} epochs, {where_} ({merges} merges)",
        data.len(),
        settings.batch,
        settings.epochs,
    );
    let report = parallel::train(backend, &model, &settings, &mut |ep| {
        say!("epoch {} loss {:.4}", ep.epoch, ep.loss)
    })
    .map_err(e)?;
    if !out {
        backend.unsafe_cleanup();
        return Ok(());
    }
    let accuracy = moons::accuracy(&scores, &data).map_err(e)?;
    let trained = mlp.host_model_from(&report.flat_params()).map_err(e)?;
    println!("training-set accuracy: {accuracy:.4}");
    if args.terminal_plot {
        // Terminal cells are about twice as tall as wide: keep the picture's proportions.
        let (x0, x1, y0, y1) = bounds(&data);
        let rows = ((78.0 * (y1 - y0) / (x1 - x0) / 2.0).round() as usize).clamp(8, 60);
        println!("{}", terminal_plot(&data, &trained, 78, rows));
        println!("(+ label 1, o label -1, . predicted 1, # decision boundary)");
    }
    if let Some(path) = &args.png {
        png_plot(path, &data, &trained)?;
        println!("wrote {path}");
    }
    let p = &report.phases;
    println!(
        "time: compile {:.0} ms ({} routines in one compile_batch); setup {:.1} ms; eval {:.1} ms",
        ms(report.compile_time),
        report.routines,
        ms(report.setup_time),
        ms(report.eval_time),
    );
    println!(
        "training {:.1} ms for {} steps ({}): the host scheduled for {:.1} ms and waited for \
         the devices for {:.1} ms (loss readback {:.1} ms)",
        ms(report.train_time),
        report.steps,
        match report.schedule {
            Schedule::Exchange => "the exchange, one program per device queue",
            Schedule::Tree => "the tree, one program per device queue",
            Schedule::Deterministic { .. } => "deterministic: shards summed in order",
            _ => "the tree, scheduled step by step",
        },
        ms(p.scheduling),
        ms(p.waiting),
        ms(p.loss_readback),
    );
    if report.lent_chunks > 0 {
        println!(
            "devices waiting for another ran {} chunks of its parallel regions",
            report.lent_chunks
        );
    }
    backend.unsafe_cleanup();
    println!(
        "accuracy: {accuracy:.4} devices: {} ranks: {} samples/s: {:.0} compile_ms: {:.0}",
        report.devices / report.ranks,
        report.ranks,
        report.samples_per_sec(),
        ms(report.compile_time)
    );
    Ok(())
}

fn main() -> ExitCode {
    // Ctrl-C during a compile must not leave the compiler running or its files behind.
    if let Err(e) = arrayjit::compile::install_signal_cleanup() {
        eprintln!("warning: {e}");
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    let backend = match backend_by_name(&args.backend) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(args, backend.as_ref()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) if backend.num_ranks() > 1 => {
            // The other ranks would wait for this one: stop the whole job.
            // One write, so that the lines of ranks failing at once do not interleave.
            let line = format!("rank {}: error: {msg}\n", backend.rank());
            eprint!("{line}");
            backend.abort_job(1);
            ExitCode::FAILURE
        }
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}
