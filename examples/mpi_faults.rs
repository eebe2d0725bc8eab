//! Fault injection for the MPI backend's tests (`tests/mpi.rs`): every rank runs rounds of
//! an all-reduce, and one rank fails in the middle in the way asked for. The job must end
//! within a bounded time, with an error naming the rank. Needs the cargo feature `mpi`:
//!
//! ```text
//! mpirun -n 2 target/release/examples/mpi_faults MODE RANK [ROUNDS]
//! ```
//!
//! MODE is one of:
//! - `none`: no fault (prints `ok: R rounds` on rank 0);
//! - `error`: rank RANK returns an error after 3 rounds (prints `rank RANK: error: ...` and
//!   aborts the job, as the moons example and the CLI do);
//! - `panic`: rank RANK panics on its main thread after 3 rounds (the backend's panic hook
//!   aborts the job);
//! - `task-panic`: a task on rank RANK's device panics after 3 rounds (reported as an error
//!   at the next await, then as `error`);
//! - `exit`: rank RANK exits with status 3 after 3 rounds, without finalizing MPI;
//! - `mismatch`: rank RANK compiles a different routine (the ranks' batch hashes differ);
//! - `skip`: rank RANK skips the last round's all-reduce (the calls are out of step: the other
//!   ranks wait in it until the watchdog, `ARRAYJIT_MPI_TIMEOUT`, aborts the job).

use arrayjit::backend::{Backend, Config, MpiBackend, Task};
use arrayjit::ir::{Bindings, Prec, Tnode};
use std::process::ExitCode;

fn run(be: &MpiBackend, mode: &str, faulty: usize, rounds: usize) -> Result<(), String> {
    let e = |e: arrayjit::Error| e.to_string();
    be.initialize(Config::default());
    let me = be.rank();
    let n = 1 << 16;
    let g = Tnode::hosted(&["g"], &[n], Prec::Single).map_err(e)?;
    let out = Tnode::hosted(&["out"], &[n], Prec::Single).map_err(e)?;
    let factor = if mode == "mismatch" && me == faulty {
        2.0
    } else {
        1.0
    };
    let touch = arrayjit::nn::scale(&out, &g, factor).map_err(e)?;
    let batch = be
        .compile_batch(
            true,
            Some(&["touch".into()]),
            None,
            &Bindings(vec![]),
            &[touch],
        )
        .map_err(e)?;
    let ranks = be.num_ranks();
    let (mut devices, mut ctxs, mut routines) = (vec![], vec![], vec![]);
    for r in 0..ranks {
        let d = be
            .new_virtual_device(&be.get_device(r).map_err(e)?)
            .map_err(e)?;
        let root = be.init(&d).map_err(e)?;
        let (ctx, rs) = be.link_batch(&[], &root, &batch).map_err(e)?;
        routines.push(rs.into_iter().flatten().next().ok_or("no routine")?);
        devices.push(d);
        ctxs.push(ctx);
    }
    for round in 0..rounds {
        if round == 3 && me == faulty {
            match mode {
                "error" => return Err(format!("injected error in round {round}")),
                "panic" => panic!("injected panic in round {round}"),
                "task-panic" => be
                    .schedule(
                        &devices[me],
                        Task::new("a task that panics", || panic!("injected task panic")),
                    )
                    .map_err(e)?,
                "exit" => std::process::exit(3),
                _ => {}
            }
        }
        for r in &routines {
            r.schedule().map_err(e)?;
        }
        if mode == "skip" && me == faulty && round + 1 == rounds {
            continue;
        }
        be.all_reduce(std::slice::from_ref(&g), &ctxs).map_err(e)?;
        be.await_device(&devices[me]).map_err(e)?;
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if me == 0 {
        println!("ok: {rounds} rounds");
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(mode), Some(Ok(faulty))) = (args.first(), args.get(1).map(|r| r.parse::<usize>()))
    else {
        eprintln!("usage: mpi_faults none|error|panic|task-panic|exit|mismatch|skip RANK [ROUNDS]");
        return ExitCode::from(2);
    };
    let rounds = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(50);
    let be = match MpiBackend::new() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(m) = run(&be, mode, faulty, rounds) {
        // One write, so that the lines of ranks failing at once do not interleave.
        let line = format!("rank {}: error: {m}\n", be.rank());
        eprint!("{line}");
        be.abort_job(1);
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
