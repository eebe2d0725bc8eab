//! The MPI backend end to end (issue 12): program files, the moons example and
//! `arrayjit::parallel` on a model of its own (the regression example) under `mpirun` with 2
//! and 4 ranks, values checked against the in-process backends and by hand, and faults (a
//! rank that errors, panics or is killed; ranks that compiled different code) that must end
//! the job within a bound, naming the rank.
//!
//! Needs Open MPI's `mpirun` on the PATH (`.ci/run` installs `openmpi-bin` and
//! `libopenmpi-dev`). Every `mpirun` runs in its own process group under a watchdog that kills
//! the group and fails the test after its timeout. The examples (`moons`, `mpi_faults`,
//! `mpi_allreduce`) are built in release mode by the first test that needs them.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

/// What a finished `mpirun` left.
struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

impl Out {
    fn ok(&self) -> &Self {
        assert_eq!(
            self.code,
            Some(0),
            "mpirun failed:\nstdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        self
    }
}

/// `mpirun --oversubscribe --allow-run-as-root -n N ARGS...` (ARGS may hold `:` for MPMD),
/// as the leader of a new process group.
fn mpirun_command(n: usize, args: &[&str]) -> Command {
    let mut c = Command::new("mpirun");
    c.args([
        "--oversubscribe",
        "--allow-run-as-root",
        "-n",
        &n.to_string(),
    ])
    .args(args)
    .env("OMPI_MCA_orte_base_help_aggregate", "0")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .process_group(0);
    c
}

/// Kills the process group of `child` (mpirun and every rank).
fn kill_group(child: &Child) {
    // SAFETY: a plain syscall on a process group id we created (the child is its leader).
    unsafe {
        libc::kill(-(child.id() as i32), libc::SIGKILL);
    }
}

/// Waits for `child` at most `limit`; on timeout kills its process group and fails.
fn wait_bounded(mut child: Child, limit: Duration, what: &str, start: Instant) -> Out {
    let so = child.stdout.take();
    let se = child.stderr.take();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut so) = so {
            let _ = so.read_to_string(&mut s);
        }
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut se) = se {
            let _ = se.read_to_string(&mut s);
        }
        s
    });
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > limit {
            kill_group(&child);
            let _ = child.wait();
            panic!(
                "{what}: still running after {limit:?}; killed its process group\nstdout:\n{}\nstderr:\n{}",
                t_out.join().unwrap(),
                t_err.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = start.elapsed();
    // Ranks killed with mpirun may leave nothing behind, but make sure.
    kill_group(&child);
    Out {
        code: status.code(),
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
        elapsed,
    }
}

/// Runs mpirun with a watchdog of `limit`.
fn mpirun(n: usize, args: &[&str], limit: Duration) -> Out {
    let start = Instant::now();
    let child = mpirun_command(n, args)
        .spawn()
        .expect("mpirun runs (install openmpi-bin)");
    wait_bounded(
        child,
        limit,
        &format!("mpirun -n {n} {}", args.join(" ")),
        start,
    )
}

fn cli() -> &'static str {
    env!("CARGO_BIN_EXE_arrayjit")
}

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The release examples, built once (with the feature `mpi`).
fn examples() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| manifest().join("target"));
        let cargo = option_env!("CARGO").unwrap_or("cargo");
        let out = Command::new(cargo)
            .args(["build", "--release", "--features", "mpi"])
            .args(["--example", "moons", "--example", "mpi_faults"])
            .args(["--example", "mpi_allreduce", "--example", "regression"])
            .current_dir(manifest())
            .env("CARGO_TARGET_DIR", &target)
            .output()
            .expect("cargo runs");
        assert!(
            out.status.success(),
            "building the examples failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        target.join("release/examples")
    })
}

fn example(name: &str) -> String {
    examples().join(name).to_str().unwrap().to_string()
}

/// `arrayjit run FILE` in this process (no mpirun), expecting success.
fn run_here(file: &Path) -> Value {
    let o = Command::new(cli())
        .args(["run", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The printed JSON of rank 0 (the other ranks print nothing).
fn printed(o: &Out) -> Value {
    serde_json::from_str(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON value ({e}):\n{}", o.stdout))
}

/// The same program with another backend, in a temporary directory.
fn with_backend(dir: &Path, file: &Path, backend: &str) -> PathBuf {
    let text = std::fs::read_to_string(file).unwrap();
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v["backend"] = Value::String(backend.into());
    let p = dir.join(format!(
        "{}.{backend}.json",
        file.file_stem().unwrap().to_str().unwrap()
    ));
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    p
}

const PROGRAM_LIMIT: Duration = Duration::from_secs(120);

/// One MPI job at a time: the ranks of concurrent tests would share the 2 cores (and the
/// speed-up test would measure them).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn all_reduce_program_on_1_2_and_4_ranks_matches_hand_values_and_multicore() {
    let _serial = serial();
    let file = manifest().join("examples/programs/mpi/all_reduce.json");
    // By hand: the batch's column sums [18, 22, 26] times w = [1, 2, 3]; w -= g/8; twice.
    let expected = serde_json::json!({
        "g": {"dims": [3], "prec": "single", "values": [-22.5, -77, -175.5]},
        "w": {"dims": [3], "prec": "single", "values": [1.5625, 6.125, 15.1875]}
    });
    let dir = tempfile::tempdir().unwrap();
    for backend in ["multicore", "sync"] {
        assert_eq!(
            run_here(&with_backend(dir.path(), &file, backend)),
            expected
        );
    }
    for n in [1, 2, 4] {
        let o = mpirun(n, &[cli(), "run", file.to_str().unwrap()], PROGRAM_LIMIT);
        assert_eq!(printed(o.ok()), expected, "{n} ranks");
    }
}

#[test]
fn cross_rank_copies_and_merges_match_multicore() {
    let _serial = serial();
    // Device-to-device copies in all three merge modes, across ranks on 2 and 4 ranks.
    let file = manifest().join("examples/programs/data_parallel.json");
    let dir = tempfile::tempdir().unwrap();
    let reference = run_here(&file);
    assert_eq!(
        reference["g"]["values"],
        serde_json::json!([18, 44, 78]),
        "{reference}"
    );
    let mpi = with_backend(dir.path(), &file, "mpi");
    for n in [2, 4] {
        let o = mpirun(n, &[cli(), "run", mpi.to_str().unwrap()], PROGRAM_LIMIT);
        assert_eq!(printed(o.ok()), reference, "{n} ranks");
    }
}

/// A program with an all-reduce and cross-rank copies of a tensor of each precision.
fn precisions_program(prec: &str, values: &str) -> String {
    format!(
        r#"{{
  "devices": 4,
  "backend": "mpi",
  "tensors": [
    {{"name": "src", "dims": [4, 3], "prec": "{prec}", "init": {{"values": {values}}}}},
    {{"name": "g", "dims": [3], "prec": "{prec}"}},
    {{"name": "h", "dims": [3], "prec": "{prec}"}},
    {{"name": "m", "dims": [3], "prec": "{prec}"}}
  ],
  "static_indices": [{{"name": "row", "range": 4}}],
  "routines": [
    {{"name": "take", "code": [{{"fetch": "g", "slice": "src", "index": "row"}},
                               {{"assign": "h", "op": "add", "args": ["g", "g"]}}]}},
    {{"name": "merge", "code": [{{"assign": "m", "op": "add", "args": ["h", {{"merge": "h"}}]}}]}}
  ],
  "run": [
    {{"routine": "take", "device": 0, "bindings": {{"row": 0}}}},
    {{"routine": "take", "device": 1, "bindings": {{"row": 1}}}},
    {{"routine": "take", "device": 2, "bindings": {{"row": 2}}}},
    {{"routine": "take", "device": 3, "bindings": {{"row": 3}}}},
    {{"copy": "h", "from": 3, "to": 0, "merge": "copy"}},
    {{"routine": "merge", "device": 0}},
    {{"copy": "h", "from": 2, "to": 1, "merge": "streaming"}},
    {{"routine": "merge", "device": 1}},
    {{"copy": "m", "from": 1, "to": 2}},
    {{"all_reduce": "g"}},
    {{"all_reduce": "m", "devices": [0, 2]}},
    {{"await": "all"}}
  ],
  "print": ["g", "m"]
}}"#
    )
}

#[test]
fn every_precision_reduces_and_copies_across_ranks_as_on_multicore() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    for (prec, values) in [
        ("single", "[1.5, -2, 3.25, 4, 5, 6, 7, 8, 9, 10, 11, 12.5]"),
        (
            "double",
            "[0.1, 0.2, 0.3, 1e-3, 2e-3, 3e-3, 10, 20, 30, -1, -2, -3]",
        ),
        ("half", "[0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5, 6]"),
        ("byte", "[100, 200, 255, 1, 2, 3, 60, 70, 80, 90, 100, 110]"),
        (
            "int32",
            "[2147483647, -2147483648, 5, 1, -1, 2, 2147483647, 7, 8, 9, 10, 11]",
        ),
        (
            "int64",
            "[9007199254740993, -9223372036854775808, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]",
        ),
        (
            "uint64",
            "[18446744073709551615, 9223372036854775808, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]",
        ),
        ("uint16", "[65535, 40000, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"),
        (
            "bfloat16",
            "[85.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5, 6]",
        ),
        ("fp8", "[0.75, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5, 6]"),
    ] {
        let file = dir.path().join(format!("{prec}.json"));
        std::fs::write(&file, precisions_program(prec, values)).unwrap();
        let reference = run_here(&with_backend(dir.path(), &file, "multicore"));
        assert_eq!(reference["g"]["prec"], prec, "{reference}");
        for n in [2, 4] {
            let o = mpirun(n, &[cli(), "run", file.to_str().unwrap()], PROGRAM_LIMIT);
            assert_eq!(printed(o.ok()), reference, "{prec} on {n} ranks");
        }
    }
    // Bytes wrap modulo 256, as on multicore: 100 + 1 + 60 + 90 = 251, 200 + 2 + 70 + 100 =
    // 372 = 116 (mod 256), 255 + 3 + 80 + 110 = 448 = 192 (mod 256).
    let file = dir.path().join("byte.json");
    let v = run_here(&with_backend(dir.path(), &file, "multicore"));
    assert_eq!(v["g"]["values"], serde_json::json!([251, 116, 192]), "{v}");
    // int64 sums are exact above 2^53 (no double on the way): 2^53 + 1 + 2 + 5 + 8,
    // -2^63 + 3 + 6 + 9, 1 + 4 + 7 + 10.
    let file = dir.path().join("int64.json");
    let v = run_here(&with_backend(dir.path(), &file, "multicore"));
    assert_eq!(
        v["g"]["values"],
        serde_json::json!([9007199254741008_i64, -9223372036854775790_i64, 22]),
        "{v}"
    );
}

/// Devices that do not divide evenly over the ranks are spread as evenly as the formula
/// `rank = i·R/N` gives (3 ranks hold 2, 1 and 1 of 4 devices; with 5 ranks one holds none and
/// still takes part in every collective), with the same values as in one process.
#[test]
fn devices_spread_unevenly_over_the_ranks_give_the_same_values() {
    let _serial = serial();
    let file = manifest().join("examples/programs/mpi/all_reduce.json");
    let dir = tempfile::tempdir().unwrap();
    let expected = run_here(&with_backend(dir.path(), &file, "multicore"));
    for n in [3, 5] {
        let o = mpirun(n, &[cli(), "run", file.to_str().unwrap()], PROGRAM_LIMIT);
        assert_eq!(printed(o.ok()), expected, "{n} ranks");
    }
}

#[test]
fn ranks_running_different_programs_are_detected() {
    let _serial = serial();
    // MPMD: rank 0 and rank 1 run different files; the ranks compare hashes at start.
    let dir = tempfile::tempdir().unwrap();
    let file = manifest().join("examples/programs/mpi/all_reduce.json");
    let text = std::fs::read_to_string(&file).unwrap();
    let other = dir.path().join("other.json");
    std::fs::write(
        &other,
        text.replace("\"values\": [0.125]", "\"values\": [0.25]"),
    )
    .unwrap();
    let a = file.to_str().unwrap();
    let b = other.to_str().unwrap();
    let o = mpirun(
        1,
        &[cli(), "run", a, ":", "-n", "1", cli(), "run", b],
        PROGRAM_LIMIT,
    );
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert!(
        o.stderr
            .contains("MPI ranks differ in the program file: rank 1 ("),
        "{}",
        o.stderr
    );
    // Different routines: the hash of the compiled batch differs.
    let o = mpirun(
        2,
        &[&example("mpi_faults"), "mismatch", "1"],
        Duration::from_secs(60),
    );
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert!(
        o.stderr
            .contains("MPI ranks differ in the compiled batch (hash of its C source): rank 1 ("),
        "{}",
        o.stderr
    );
}

/// The `accuracy:` summary lines of a moons run.
fn summaries(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| l.starts_with("accuracy: "))
        .collect()
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let mut it = line.split_whitespace();
    while let Some(w) = it.next() {
        if w == key {
            return it.next().unwrap();
        }
    }
    panic!("no {key} in {line}")
}

#[test]
fn moons_on_2_and_4_ranks_trains_the_same_model() {
    let _serial = serial();
    let moons = example("moons");
    for (ranks, per) in [(2, 1), (4, 1), (2, 2)] {
        // The same total number of devices on the multicore backend, in one process.
        let o = Command::new(&moons)
            .args(["--no-plot", "--devices", &(ranks * per).to_string()])
            .output()
            .unwrap();
        assert!(o.status.success());
        let reference = String::from_utf8(o.stdout).unwrap();
        let r = summaries(&reference)[0];
        let o = mpirun(
            ranks,
            &[&moons, "--backend", "mpi", "--devices", &per.to_string()],
            Duration::from_secs(180),
        );
        o.ok();
        let lines = summaries(&o.stdout);
        assert_eq!(lines.len(), 1, "only rank 0 prints:\n{}", o.stdout);
        let s = lines[0];
        assert_eq!(field(s, "ranks:"), ranks.to_string(), "{s}");
        assert_eq!(field(s, "devices:"), per.to_string(), "{s}");
        assert_eq!(field(s, "accuracy:"), field(r, "accuracy:"), "{s} vs {r}");
        assert!(field(s, "accuracy:").parse::<f64>().unwrap() > 0.95, "{s}");
        // The epochs' losses agree with the single process's to the printed digits (the sums
        // of the gradients differ only in the order of additions).
        let losses = |t: &str| -> Vec<String> {
            t.lines()
                .filter(|l| l.starts_with("epoch "))
                .map(String::from)
                .collect()
        };
        assert_eq!(losses(&o.stdout).len(), 20, "{}", o.stdout);
        assert_eq!(
            losses(&o.stdout),
            losses(&reference),
            "{ranks} ranks × {per}"
        );
    }
}

/// The `bits:` line of a regression run: its epochs' losses and trained parameters, bit for
/// bit.
fn bits_line(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("bits: "))
        .unwrap_or_else(|| panic!("no bits line in:\n{stdout}"))
        .to_string()
}

/// `arrayjit::parallel` over 2 ranks, on a model of the example's own (a tanh network in
/// double precision): the host-scheduled tree (each rank's block merged into its leader, the
/// leaders all-reduced) gives the bits of the same tree on one process's devices; the
/// deterministic schedule gives the bits of one device whatever the ranks and devices;
/// `Devices::Auto` is one device per rank; devices the ranks do not divide are a typed error
/// on every rank.
#[test]
fn the_parallel_module_trains_a_users_model_over_2_ranks() {
    let _serial = serial();
    let reg = example("regression");
    let here = |args: &[&str]| -> String {
        let o = Command::new(&reg)
            .args(args)
            .arg("--bits")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        bits_line(&String::from_utf8(o.stdout).unwrap())
    };
    let over_mpi = |args: &[&str]| -> String {
        let mut all = vec![reg.as_str(), "--backend", "mpi", "--bits"];
        all.extend_from_slice(args);
        let o = mpirun(2, &all, Duration::from_secs(180));
        o.ok();
        let summary = o
            .stdout
            .lines()
            .find(|l| l.starts_with("loss: "))
            .unwrap_or_else(|| panic!("no summary in:\n{}", o.stdout));
        assert_eq!(field(summary, "ranks:"), "2", "{summary}");
        o.stdout.clone()
    };
    for devices in ["2", "4"] {
        let reference = here(&["--devices", devices, "--schedule", "host-tree"]);
        let out = over_mpi(&["--devices", devices]);
        assert!(
            out.contains(&format!("devices: {devices} ranks: 2 schedule: host-tree")),
            "{out}"
        );
        assert_eq!(bits_line(&out), reference, "{devices} devices over 2 ranks");
    }
    let one = here(&["--devices", "1", "--schedule", "deterministic:12"]);
    assert_ne!(one, here(&["--devices", "2", "--schedule", "host-tree"]));
    for devices in ["2", "4"] {
        let out = over_mpi(&["--devices", devices, "--schedule", "deterministic:12"]);
        assert_eq!(
            bits_line(&out),
            one,
            "deterministic, {devices} devices over 2 ranks"
        );
    }
    let out = over_mpi(&[]);
    assert!(out.contains("devices: 2 ranks: 2"), "{out}");
    let o = mpirun(
        2,
        &[&reg, "--backend", "mpi", "--devices", "3"],
        Duration::from_secs(60),
    );
    assert_ne!(o.code, Some(0), "{}", o.stdout);
    assert!(
        o.stderr
            .contains("error: 3 devices cannot be spread evenly over 2 ranks"),
        "{}",
        o.stderr
    );
}

#[test]
fn all_reduce_example_checks_its_values() {
    let _serial = serial();
    for (n, args) in [
        (2, vec!["--prec", "single"]),
        (2, vec!["--prec", "double", "--devices", "2"]),
        (2, vec!["--prec", "half"]),
        (4, vec!["--prec", "byte", "--devices", "2"]),
        (4, vec!["--prec", "single", "--devices", "3"]),
    ] {
        let bin = example("mpi_allreduce");
        let mut all = vec![&bin[..], "--mib", "0.25", "--runs", "5"];
        all.extend(args.iter().copied());
        let o = mpirun(n, &all, PROGRAM_LIMIT);
        o.ok();
        assert!(o.stdout.contains("allreduce_ms: "), "{}", o.stdout);
    }
}

/// Bound for a job to end after a fault.
const FAULT_LIMIT: Duration = Duration::from_secs(30);

#[test]
fn a_failing_rank_ends_the_job_naming_it() {
    let _serial = serial();
    let faults = example("mpi_faults");
    for (n, mode, rank, expect) in [
        (2, "error", 1, "rank 1: error: injected error in round 3"),
        (4, "error", 2, "rank 2: error: injected error in round 3"),
        (
            2,
            "panic",
            1,
            "rank 1: panicked (above); aborting the MPI job",
        ),
        (
            4,
            "panic",
            3,
            "rank 3: panicked (above); aborting the MPI job",
        ),
        (
            2,
            "task-panic",
            0,
            "rank 0: error: task \"a task that panics\" failed: panicked: injected task panic",
        ),
        (2, "exit", 1, "Exit code:    3"),
    ] {
        let o = mpirun(
            n,
            &[&faults, mode, &rank.to_string(), "100000"],
            FAULT_LIMIT,
        );
        assert_ne!(o.code, Some(0), "{mode}: {}", o.stderr);
        assert!(
            o.stderr.contains(expect),
            "{mode} on rank {rank}:\n{}",
            o.stderr
        );
        if mode == "exit" {
            assert!(o.stderr.contains(&format!(",1],{rank}]")), "{}", o.stderr);
        }
        assert!(o.elapsed < FAULT_LIMIT, "{mode}: {:?}", o.elapsed);
    }
    // The control: no fault, the job ends normally.
    let o = mpirun(2, &[&faults, "none", "0", "5"], FAULT_LIMIT);
    assert!(o.ok().stdout.contains("ok: 5 rounds"), "{}", o.stdout);
}

#[test]
fn ranks_out_of_step_are_stopped_by_the_watchdog() {
    let _serial = serial();
    // Rank 1 skips the last all-reduce: rank 0 waits in it until ARRAYJIT_MPI_TIMEOUT.
    let start = Instant::now();
    let mut cmd = mpirun_command(2, &[&example("mpi_faults"), "skip", "1", "5"]);
    cmd.env("ARRAYJIT_MPI_TIMEOUT", "3");
    let child = cmd.spawn().expect("mpirun runs");
    let o = wait_bounded(child, FAULT_LIMIT, "mpi_faults skip", start);
    assert_ne!(o.code, Some(0), "{}", o.stderr);
    assert!(
        o.stderr.contains(
            "rank 0: error: MPI operation \"all_reduce g across 2 ranks\" has waited more than 3 s"
        ),
        "{}",
        o.stderr
    );
    assert!(o.elapsed >= Duration::from_secs(3), "{:?}", o.elapsed);
    // A bad value is an error naming the variable.
    let mut cmd = mpirun_command(2, &[&example("mpi_faults"), "none", "0", "2"]);
    cmd.env("ARRAYJIT_MPI_TIMEOUT", "soon");
    let o = wait_bounded(
        cmd.spawn().unwrap(),
        FAULT_LIMIT,
        "bad timeout",
        Instant::now(),
    );
    assert_ne!(o.code, Some(0));
    assert!(
        o.stderr
            .contains("environment variable ARRAYJIT_MPI_TIMEOUT=\"soon\""),
        "{}",
        o.stderr
    );
}

/// The pid of the process whose environment holds `OMPI_COMM_WORLD_RANK=rank` and `mark`.
fn rank_pid(rank: usize, mark: &str) -> Option<i32> {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
        if vars.contains(&want.as_bytes()) && vars.contains(&mark.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

#[test]
fn a_rank_killed_in_the_middle_of_training_ends_the_job() {
    let _serial = serial();
    let moons = example("moons");
    for (n, victim) in [(2, 1), (4, 2)] {
        let mark = format!("ARRAYJIT_MPI_TEST={}-{n}", std::process::id());
        let start = Instant::now();
        let mut cmd = mpirun_command(
            n,
            &[
                &moons,
                "--backend",
                "mpi",
                "--epochs",
                "1000000",
                "--no-plot",
            ],
        );
        let (k, v) = mark.split_once('=').unwrap();
        cmd.env(k, v);
        let mut child = cmd.spawn().expect("mpirun runs");
        // Wait (bounded) until rank 0 reports training epochs.
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("epoch 3 ") {
                    let _ = tx.send(());
                }
            }
        });
        if rx.recv_timeout(Duration::from_secs(60)).is_err() {
            kill_group(&child);
            let _ = child.wait();
            panic!("moons on {n} ranks did not start training within 60 s");
        }
        let pid = rank_pid(victim, &mark).expect("the rank's process");
        // SAFETY: a plain syscall on the pid of a rank we started.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        let killed = Instant::now();
        let o = wait_bounded(
            child,
            start.elapsed() + FAULT_LIMIT,
            "moons with a killed rank",
            start,
        );
        let after = killed.elapsed();
        assert_ne!(o.code, Some(0), "{}", o.stderr);
        assert!(after < FAULT_LIMIT, "the job ran {after:?} after the kill");
        assert!(
            o.stderr
                .contains(&format!("process rank {victim} with PID")),
            "{}",
            o.stderr
        );
        eprintln!("{n} ranks: the job ended {after:?} after rank {victim} was killed");
    }
}
