//! The MPI all-reduce against a memcpy of the same bytes (issue 12's target: within 3×), and a
//! check of its values. Needs the cargo feature `mpi`; run under `mpirun`:
//!
//! ```text
//! cargo build --release --features mpi --example mpi_allreduce
//! mpirun -n 2 target/release/examples/mpi_allreduce [--mib 4] [--runs 50] [--prec single]
//!        [--devices 1]
//! ```
//!
//! Every rank holds `--devices` local devices, each with a tensor `g` of `--mib` MiB; device
//! `i` of rank `r` fills it with `r·L + i + 1` (`L` local devices). Each run all-reduces `g`
//! over every device of every rank ([`Backend::all_reduce`]) and awaits the local devices;
//! the first run's result is checked against the sum `N(N+1)/2` of the `N` devices' values
//! (in every cell, on every device), the others are timed. Rank 0 prints the median time of
//! an all-reduce, the median time of a `memcpy` of the same bytes between two warm buffers,
//! and their ratio, then `allreduce_ms: A memcpy_ms: M ratio: R`.

use arrayjit::backend::{Backend, Config, MpiBackend};
use arrayjit::ir::{Bindings, Prec, Tnode};
use std::process::ExitCode;
use std::time::Instant;

struct Args {
    mib: f64,
    runs: usize,
    prec: Prec,
    devices: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        mib: 4.0,
        runs: 50,
        prec: Prec::Single,
        devices: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = || format!("{flag}: cannot read {value:?}");
        match flag.as_str() {
            "--mib" => a.mib = value.parse().map_err(|_| bad())?,
            "--runs" => a.runs = value.parse().map_err(|_| bad())?,
            "--devices" => a.devices = value.parse().map_err(|_| bad())?,
            "--prec" => {
                a.prec = Prec::from_name(&value).ok_or_else(|| {
                    format!("--prec: {value:?} is not byte, half, single or double")
                })?
            }
            other => {
                return Err(format!(
                    "unknown flag {other:?}; flags: --mib X --runs N --prec P --devices N"
                ))
            }
        }
    }
    if a.runs == 0 || a.devices == 0 || a.mib <= 0.0 {
        return Err("--runs, --devices and --mib must be positive".into());
    }
    Ok(a)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run(be: &MpiBackend, a: &Args) -> Result<(), String> {
    let e = |e: arrayjit::Error| e.to_string();
    be.initialize(Config::default());
    let n = ((a.mib * 1048576.0) as usize / a.prec.size_in_bytes()).max(1);
    let g = Tnode::hosted(&["g"], &[n], a.prec).map_err(e)?;
    let out = Tnode::hosted(&["out"], &[n], a.prec).map_err(e)?;
    let touch = arrayjit::nn::scale(&out, &g, 1.0).map_err(e)?;
    let batch = be
        .compile_batch(
            true,
            Some(&["touch".into()]),
            None,
            &Bindings(vec![]),
            &[touch],
        )
        .map_err(e)?;
    let (ranks, l) = (be.num_ranks(), a.devices);
    let total = ranks * l;
    let (mut devices, mut ctxs) = (vec![], vec![]);
    for i in 0..total {
        let d = be
            .new_virtual_device(&be.get_device(be.placement(i, total)).map_err(e)?)
            .map_err(e)?;
        let root = be.init(&d).map_err(e)?;
        let (ctx, _) = be.link_batch(&[], &root, &batch).map_err(e)?;
        devices.push(d);
        ctxs.push(ctx);
    }
    let local: Vec<usize> = (0..total).filter(|&i| !devices[i].is_remote()).collect();
    // The first run: each device holds its ordinal + 1; check the sum everywhere.
    for &i in &local {
        g.set_host_values(&vec![(i + 1) as f64; n]).map_err(e)?;
        be.from_host(&ctxs[i], &g).map_err(e)?;
        be.await_device(&devices[i]).map_err(e)?;
    }
    be.all_reduce(std::slice::from_ref(&g), &ctxs).map_err(e)?;
    let expected = a.prec.round((total * (total + 1) / 2) as f64);
    let expected = if a.prec == Prec::Byte {
        ((total * (total + 1) / 2) % 256) as f64
    } else {
        expected
    };
    for &i in &local {
        be.to_host(&ctxs[i], &g).map_err(e)?;
        be.await_device(&devices[i]).map_err(e)?;
        let v = g.host_values().ok_or("g is not hosted")?;
        if let Some((k, x)) = v.iter().enumerate().find(|(_, x)| **x != expected) {
            return Err(format!(
                "rank {}: device {i}: cell {k} of the all-reduced g holds {x}, expected {expected}",
                be.rank()
            ));
        }
    }
    // Timed runs.
    let mut times = vec![];
    for _ in 0..a.runs {
        let t = Instant::now();
        be.all_reduce(std::slice::from_ref(&g), &ctxs).map_err(e)?;
        for &i in &local {
            be.await_device(&devices[i]).map_err(e)?;
        }
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    // memcpy of the same bytes between two warm buffers.
    let bytes = n * a.prec.size_in_bytes();
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let mut copies = vec![];
    for _ in 0..a.runs.max(5) {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        copies.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let (ar, mc) = (median(times), median(copies));
    if be.rank() == 0 {
        println!(
            "all_reduce of {bytes} bytes ({}) over {ranks} ranks × {l} devices: median {ar:.3} ms \
             of {} runs; memcpy of the same bytes: median {mc:.3} ms; ratio {:.2}",
            a.prec.name(),
            a.runs,
            ar / mc
        );
        println!(
            "allreduce_ms: {ar:.4} memcpy_ms: {mc:.4} ratio: {:.2}",
            ar / mc
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(m) => {
            eprintln!("{m}");
            return ExitCode::from(2);
        }
    };
    let be = match MpiBackend::new() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(m) = run(&be, &args) {
        // One write, so that the lines of ranks failing at once do not interleave.
        let line = format!("rank {}: error: {m}\n", be.rank());
        eprint!("{line}");
        be.abort_job(1);
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
