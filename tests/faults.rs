//! Fault injection: a missing, failing or hanging C compiler, unusable temporary and debug
//! directories, static indices out of range, and panicking device tasks.
//!
//! Faults that depend on environment variables run the `arrayjit` binary as a child process
//! (so nothing leaks between tests), each with its own `TMPDIR` and with the compile cache
//! off, so that a cached library can never hide a compile. Every test has a bounded run
//! time: child processes are killed after a deadline, library tests run under a watchdog.
//! After every compile fault, the `TMPDIR` given to the process must hold no `arrayjit-*`
//! entries.

mod common;

use arrayjit::backend::{Backend, CcBackend, Config, MulticoreBackend, SyncBackend, Task};
use arrayjit::interp::{self, Memory};
use arrayjit::ir::*;
use arrayjit::Error;
use common::*;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a run of the binary produced.
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

/// The longest any single run of the binary may take.
const CLI_DEADLINE: Duration = Duration::from_secs(60);

/// Runs `arrayjit ARGS` with `TMPDIR=tmpdir`, the compile cache off and extra environment
/// variables (`None` removes one); kills it and fails the test after [`CLI_DEADLINE`].
fn cli(args: &[&str], tmpdir: &Path, env: &[Var]) -> Out {
    let out_dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (out_dir.path().join("out"), out_dir.path().join("err"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_arrayjit"));
    cmd.args(args)
        .env("TMPDIR", tmpdir)
        .env("ARRAYJIT_CACHE", "0")
        .env_remove("ARRAYJIT_DEBUG_DIR")
        .env_remove("ARRAYJIT_COMPILE_TIMEOUT")
        .stdin(Stdio::null())
        // Files rather than pipes: a leftover grandchild holding them open cannot block us.
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap());
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let start = Instant::now();
    let mut child = cmd.spawn().expect("the arrayjit binary starts");
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > CLI_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("arrayjit {args:?} did not finish in {CLI_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = start.elapsed();
    Out {
        code: status.code().expect("exited normally, not by a signal"),
        stdout: std::fs::read_to_string(&out_path).unwrap(),
        stderr: std::fs::read_to_string(&err_path).unwrap(),
        elapsed,
    }
}

/// An environment variable to set (`Some`) or remove (`None`).
type Var<'a> = (&'a str, Option<OsString>);

fn os(s: impl Into<OsString>) -> Option<OsString> {
    Some(s.into())
}

/// An example program with one routine.
fn program() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/programs/matmul.json")
}

fn program_str() -> String {
    program().to_str().unwrap().to_string()
}

/// The real C compiler, as the library finds it for this (unchanged) environment.
fn real_cc() -> OsString {
    arrayjit::compile::CompilerConfig::from_env()
        .expect("a C compiler is needed for these tests")
        .compiler
        .into_os_string()
}

/// Asserts a failed run: exit code 1, one `error: ` message, no panic, no output.
fn assert_error(out: &Out) {
    assert_eq!(
        out.code, 1,
        "expected exit code 1; stdout {} stderr {}",
        out.stdout, out.stderr
    );
    assert!(out.stderr.starts_with("error: "), "{}", out.stderr);
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    assert!(!out.stderr.contains("internal error"), "{}", out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
}

/// Asserts that `dir` holds no `arrayjit-*` entries (the compile stage's temporary
/// directories).
fn assert_no_leftovers(dir: &Path) {
    let left: Vec<String> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("arrayjit-"))
            .collect(),
        Err(_) => return,
    };
    assert!(
        left.is_empty(),
        "left behind in {}: {left:?}",
        dir.display()
    );
}

/// Writes an executable shell script. The file is written by a child process, so that no
/// descriptor open for writing can leak into a process another test forks concurrently
/// (which would make executing the script fail with ETXTBSY).
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    let status = Command::new("sh")
        .arg("-c")
        .arg("printf '%s\\n' \"$2\" > \"$1\" && chmod 755 \"$1\"")
        .arg("sh")
        .arg(&path)
        .arg(format!("#!/bin/sh\n{body}"))
        .status()
        .unwrap();
    assert!(status.success());
    path
}

/// Whether the process `pid` is gone (or a zombie waiting to be reaped by an init process
/// that does not reap).
fn is_dead(pid: u32) -> bool {
    let alive = Command::new("kill")
        .arg("-0")
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !alive {
        return true;
    }
    // kill -0 succeeds on zombies: they hold no resources and run no code.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

fn read_pid(path: &Path) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if let Ok(p) = s.trim().parse() {
                return p;
            }
        }
        assert!(Instant::now() < deadline, "no pid in {}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_dead(pid: u32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !is_dead(pid) {
        assert!(
            Instant::now() < deadline,
            "{what} (pid {pid}) is still running"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------
// The C compiler.

#[test]
fn missing_compiler_is_a_typed_error() {
    let tmp = tempfile::tempdir().unwrap();
    let p = program_str();
    let cases: [(&[Var], &[&str]); 3] = [
        (
            &[("ARRAYJIT_CC", os("/nonexistent/cc"))],
            &[
                "C compiler not found",
                "ARRAYJIT_CC=/nonexistent/cc",
                "no such file",
            ],
        ),
        (
            &[("ARRAYJIT_CC", os("arrayjit-no-such-cc"))],
            &[
                "C compiler not found",
                "arrayjit-no-such-cc",
                "not found in PATH",
            ],
        ),
        (
            &[("ARRAYJIT_CC", None), ("CC", os("/nonexistent/gcc"))],
            &["C compiler not found", "CC=/nonexistent/gcc"],
        ),
    ];
    for (env, needles) in cases {
        let out = cli(&["run", &p], tmp.path(), env);
        assert_error(&out);
        for n in needles {
            assert!(out.stderr.contains(n), "expected {n:?} in {}", out.stderr);
        }
        // The routine is named, and nothing was compiled or left behind.
        assert!(out.stderr.contains("\"matmul\""), "{}", out.stderr);
        assert_no_leftovers(tmp.path());
    }
    // bench fails the same way.
    let out = cli(
        &["bench", &p],
        tmp.path(),
        &[("ARRAYJIT_CC", os("/nonexistent/cc"))],
    );
    assert_error(&out);
    assert!(
        out.stderr.contains("C compiler not found"),
        "{}",
        out.stderr
    );
    assert_no_leftovers(tmp.path());
}

#[test]
fn failing_compiler_output_is_in_the_error() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let p = program_str();
    let cases = [
        (
            script(
                bin.path(),
                "fail-cc",
                "echo 'fake-cc: on stdout 4242'\necho 'fake-cc: deliberate failure 1234' >&2\nexit 1",
            ),
            vec![
                "C compilation failed",
                "fail-cc",
                "fake-cc: deliberate failure 1234",
                "fake-cc: on stdout 4242",
            ],
        ),
        (
            script(bin.path(), "silent-cc", "exit 3"),
            vec!["C compilation failed", "exited with status 3 and printed nothing"],
        ),
        (
            // SIGKILL, which no handler can catch (a sanitizer runtime preloaded by
            // scripts/sanitize.sh would turn a SIGSEGV into an ordinary exit).
            script(bin.path(), "crash-cc", "echo dying >&2\nkill -KILL $$"),
            vec!["C compilation failed", "dying", "terminated by signal 9"],
        ),
        (
            // Exits 0 without producing the library.
            script(bin.path(), "lazy-cc", "exit 0"),
            vec!["loading compiled library"],
        ),
    ];
    for (cc, needles) in cases {
        let out = cli(&["run", &p], tmp.path(), &[("ARRAYJIT_CC", os(&cc))]);
        assert_error(&out);
        for n in needles {
            assert!(out.stderr.contains(n), "expected {n:?} in {}", out.stderr);
        }
        assert!(out.stderr.contains("\"matmul\""), "{}", out.stderr);
        assert_no_leftovers(tmp.path());
    }
}

#[test]
fn hanging_compiler_is_killed_after_the_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let pid_file = bin.path().join("cc.pid");
    let child_file = bin.path().join("child.pid");
    // The compiler starts a child of its own, then becomes a long sleep itself.
    let cc = script(
        bin.path(),
        "hang-cc",
        &format!(
            "sleep 300 &\necho $! > '{}'\necho $$ > '{}'\nexec sleep 300",
            child_file.display(),
            pid_file.display()
        ),
    );
    let out = cli(
        &["run", &program_str()],
        tmp.path(),
        &[
            ("ARRAYJIT_CC", os(&cc)),
            ("ARRAYJIT_COMPILE_TIMEOUT", os("1")),
        ],
    );
    assert_error(&out);
    assert!(
        out.stderr.contains("timed out after 1s") && out.stderr.contains("hang-cc"),
        "{}",
        out.stderr
    );
    assert!(out.elapsed >= Duration::from_secs(1), "{:?}", out.elapsed);
    assert!(out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);
    // Both the compiler and the process it started were killed.
    wait_dead(read_pid(&pid_file), "the hanging compiler");
    wait_dead(read_pid(&child_file), "the hanging compiler's child");
    assert_no_leftovers(tmp.path());
}

#[test]
fn compiler_whose_child_keeps_the_output_open_does_not_block() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let child_file = bin.path().join("child.pid");
    // The compiler fails at once, but leaves a process behind that holds its stdout and
    // stderr open for a long time.
    let cc = script(
        bin.path(),
        "orphan-cc",
        &format!(
            "sleep 30 &\necho $! > '{}'\necho 'orphan-cc: failing' >&2\nexit 1",
            child_file.display()
        ),
    );
    let out = cli(
        &["run", &program_str()],
        tmp.path(),
        &[("ARRAYJIT_CC", os(&cc))],
    );
    let child = read_pid(&child_file);
    assert_error(&out);
    assert!(out.stderr.contains("orphan-cc: failing"), "{}", out.stderr);
    assert!(out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);
    assert_no_leftovers(tmp.path());
    // Clean up the process the script started (only that one).
    let _ = Command::new("kill").arg(child.to_string()).status();
}

// ---------------------------------------------------------------------------------------------
// Directories.

#[test]
fn unwritable_tmpdir_is_a_clear_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let cc = real_cc();
    for tmpdir in [file.join("sub"), dir.path().join("missing/deeper")] {
        let out = cli(
            &["run", &program_str()],
            &tmpdir,
            &[("ARRAYJIT_CC", Some(cc.clone()))],
        );
        assert_error(&out);
        assert!(
            out.stderr.contains("creating a temporary directory in")
                && out.stderr.contains(&*tmpdir.to_string_lossy()),
            "{}",
            out.stderr
        );
        assert!(
            out.stderr.contains("Not a directory") || out.stderr.contains("No such file"),
            "{}",
            out.stderr
        );
        assert_no_leftovers(dir.path());
        assert_no_leftovers(&tmpdir);
    }
    // --interpret needs no temporary directory at all.
    let out = cli(
        &["run", "--interpret", &program_str()],
        &file.join("sub"),
        &[("ARRAYJIT_CC", os("/nonexistent/cc"))],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("\"c\""), "{}", out.stdout);
}

#[test]
fn unwritable_debug_dir_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let debug = file.join("debug");
    let out = cli(
        &["run", &program_str()],
        tmp.path(),
        &[
            ("ARRAYJIT_CC", Some(real_cc())),
            ("ARRAYJIT_DEBUG_DIR", os(&debug)),
        ],
    );
    assert_error(&out);
    assert!(
        out.stderr
            .contains(&format!("debug directory {}", debug.display()))
            && out.stderr.contains("cannot create it"),
        "{}",
        out.stderr
    );
    assert_no_leftovers(tmp.path());
    // The same run with a usable debug directory works and keeps the source.
    let good = dir.path().join("debug");
    let out = cli(
        &["run", &program_str()],
        tmp.path(),
        &[
            ("ARRAYJIT_CC", Some(real_cc())),
            ("ARRAYJIT_DEBUG_DIR", os(&good)),
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(good.join("arrayjit.h").is_file());
    assert_no_leftovers(tmp.path());
}

// ---------------------------------------------------------------------------------------------
// Static indices out of range.

/// `x = batch[row, :]` and `y = x * 2`; `row` has the given declared range (or none).
fn pick(range: Option<usize>) -> (Assignments, Bindings, Tnode, Tnode) {
    let row = StaticSymbol::new("row", range);
    let bind = Bindings(vec![row.clone()]);
    let batch = input(
        "batch",
        &[4, 3],
        Prec::Single,
        &(0..12).map(|i| i as f64).collect::<Vec<_>>(),
    );
    let x = temp("x", &[3], Prec::Single);
    let y = output("y", &[3], Prec::Single);
    let code = Assignments::seq([
        Assignments::Fetch {
            array: x.clone(),
            fetch_op: FetchOp::Slice {
                batch_idx: row,
                sliced: batch.clone(),
            },
        },
        binop(
            &y,
            Binop::Arg2,
            false,
            Binop::Add,
            &x,
            &x,
            "i,i->i",
            &Bindings::empty(),
        ),
    ]);
    (code, bind, batch, y)
}

#[test]
fn static_index_out_of_range_in_the_library() {
    with_watchdog(60, || {
        // A declared range of 3 (tighter than the 4 rows), and no declared range (the 4 rows
        // bound it).
        for (range, limit) in [(Some(3), 3usize), (None, 4)] {
            let (code, bind, _, y) = pick(range);
            let be = CcBackend::new();
            let (r, _) = build(&be, "pick", &bind, &code).unwrap();
            r.bindings().set("row", 2).unwrap();
            assert_eq!(run_and_read(&be, &r, &[&y])[0], vec![12., 14., 16.]);
            for bad in [limit as i64, 7, -1, i64::MAX] {
                r.bindings().set("row", bad).unwrap();
                match r.run() {
                    Err(Error::BindingOutOfRange {
                        routine,
                        index,
                        value,
                        limit: l,
                    }) => {
                        assert_eq!(
                            (routine.as_str(), index.as_str(), value, l),
                            ("pick", "row", bad, limit)
                        );
                    }
                    other => panic!("row = {bad}: expected BindingOutOfRange, got {other:?}"),
                }
                // Nothing was written.
                be.to_host(r.context(), &y).unwrap();
                assert_eq!(y.host_values().unwrap(), vec![12., 14., 16.]);
            }
            // The routine still works.
            r.bindings().set("row", 1).unwrap();
            assert_eq!(run_and_read(&be, &r, &[&y])[0], vec![6., 8., 10.]);

            // The interpreter rejects a value outside the declared range the same way, and
            // one outside the tensor with an error naming it; the memory is left untouched.
            let (code, bind, batch, y) = pick(range);
            let mut mem = Memory::new();
            mem.load_from_hosts([&batch]);
            let e =
                interp::run_assignments(&code, &[(bind.0[0].clone(), 9)], &mut mem).unwrap_err();
            match (range, &e) {
                (
                    Some(3),
                    Error::BindingOutOfRange {
                        value: 9, limit: 3, ..
                    },
                ) => {}
                (None, Error::Usage(m)) if m.contains("batch") && m.contains("row") => {}
                _ => panic!("{range:?}: unexpected {e:?}"),
            }
            assert!(mem.get(&y).is_none());
        }

        // On a device, the failing routine task is reported naming the routine.
        let (code, bind, _, _) = pick(None);
        let b = MulticoreBackend::new();
        b.initialize(Config::default());
        let dev = b.new_virtual_device(&b.get_device(0).unwrap()).unwrap();
        let compiled = b.compile(true, Some("pick"), &bind, &code).unwrap();
        let ctx = b.init(&dev).unwrap();
        let r = b.link(&[], &ctx, &compiled).unwrap();
        r.bindings().set("row", 5).unwrap();
        r.schedule().unwrap();
        let e = b.await_device(&dev).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(&e, Error::Task { task, .. } if task.contains("routine pick")),
            "{msg}"
        );
        assert!(msg.contains("row = 5") && msg.contains("0..4"), "{msg}");
        r.bindings().set("row", 3).unwrap();
        r.schedule().unwrap();
        b.await_device(&dev).unwrap();
        b.unsafe_cleanup();
    });
}

#[test]
fn static_index_out_of_range_in_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let prog = |range: &str, rows: &str| {
        format!(
            r#"{{"tensors": [{{"name": "batch", "dims": [4, 2], "init": "range"}},
                            {{"name": "x", "dims": [2]}}],
               "static_indices": [{{"name": "row"{range}}}],
               "routines": [{{"name": "pick", "code": [
                 {{"fetch": "x", "slice": "batch", "index": "row"}}
               ]}}],
               "run": [{rows}],
               "print": ["x"]}}"#
        )
    };
    let f = dir.path().join("oob.json");
    std::fs::write(
        &f,
        prog(
            "",
            r#"{"routine": "pick", "bindings": {"row": 3}},
               {"routine": "pick", "bindings": {"row": 4}}"#,
        ),
    )
    .unwrap();
    let f = f.to_str().unwrap();
    // Compiled: the library's BindingOutOfRange, naming the step, the routine and the value.
    let out = cli(&["run", f], tmp.path(), &[]);
    assert_error(&out);
    assert!(
        out.stderr.contains("run step 2")
            && out.stderr.contains("routine \"pick\"")
            && out
                .stderr
                .contains("static index row = 4 is out of range 0..4"),
        "{}",
        out.stderr
    );
    assert_no_leftovers(tmp.path());
    // Interpreted: the same step, with the tensor it would index outside of.
    let out = cli(&["run", "--interpret", f], tmp.path(), &[]);
    assert_error(&out);
    assert!(
        out.stderr.contains("run step 2")
            && out.stderr.contains("batch")
            && out.stderr.contains("row = 4"),
        "{}",
        out.stderr
    );
    // With a declared range the value is rejected before anything is compiled.
    let g = dir.path().join("declared.json");
    std::fs::write(
        &g,
        prog(
            r#", "range": 2"#,
            r#"{"routine": "pick", "bindings": {"row": 2}}"#,
        ),
    )
    .unwrap();
    let out = cli(
        &["run", g.to_str().unwrap()],
        tmp.path(),
        &[("ARRAYJIT_CC", os("/nonexistent/cc"))],
    );
    assert_error(&out);
    assert!(
        out.stderr.contains("declared.json:")
            && out.stderr.contains("run step 1")
            && out.stderr.contains("\"row\" = 2 is out of range 0..2"),
        "{}",
        out.stderr
    );
    assert_no_leftovers(tmp.path());
}

// ---------------------------------------------------------------------------------------------
// Device tasks that panic.

#[test]
fn a_panicking_task_is_named_and_other_devices_keep_working() {
    with_watchdog(60, || {
        let backends: Vec<Box<dyn Backend>> = vec![
            Box::new(MulticoreBackend::new()),
            Box::new(SyncBackend::new()),
        ];
        for b in backends {
            b.initialize(Config::default());
            let p = b.num_physical_devices();
            let devs: Vec<_> = (0..3)
                .map(|i| b.new_virtual_device(&b.get_device(i % p).unwrap()).unwrap())
                .collect();
            // One routine linked on every device: acc += x.
            let bind = Bindings::empty();
            let x = input("x", &[4], Prec::Double, &[1., 2., 3., 4.]);
            let acc = output("acc", &[4], Prec::Double);
            let code = unop(&acc, Binop::Add, false, Unop::Identity, &x, "i->i", &bind);
            let compiled = b.compile(true, Some("accumulate"), &bind, &code).unwrap();
            let routines: Vec<_> = devs
                .iter()
                .map(|d| {
                    let ctx = b.init(d).unwrap();
                    let r = b.link(&[], &ctx, &compiled).unwrap();
                    b.from_host(r.context(), &x).unwrap();
                    r
                })
                .collect();
            let after_panic = Arc::new(AtomicUsize::new(0));
            for (i, d) in devs.iter().enumerate() {
                for _ in 0..3 {
                    routines[i].schedule().unwrap();
                }
                if i == 1 {
                    // A panicking task in the middle of device 1's queue, then more work.
                    let res = b.schedule(
                        d,
                        Task::new("exploding task #1", || panic!("boom on purpose")),
                    );
                    if d.has_worker() {
                        res.unwrap();
                    } else {
                        let e = res.unwrap_err().to_string();
                        assert!(e.contains("exploding task #1") && e.contains("boom"), "{e}");
                    }
                    let c = after_panic.clone();
                    b.schedule(
                        d,
                        Task::new("after the panic", move || {
                            c.fetch_add(1, Ordering::SeqCst);
                            Ok(())
                        }),
                    )
                    .unwrap();
                }
            }
            for (i, d) in devs.iter().enumerate() {
                let res = b.await_device(d);
                if i == 1 && d.has_worker() {
                    let e = res.unwrap_err();
                    let msg = e.to_string();
                    assert!(
                        matches!(&e, Error::Task { task, msg } if task == "exploding task #1"
                            && msg.contains("panicked") && msg.contains("boom on purpose")),
                        "{msg}"
                    );
                } else {
                    res.unwrap();
                }
                // Reported once.
                b.await_device(d).unwrap();
            }
            // Device 1 ran the task queued after the panic; every device computed 3 * x.
            assert_eq!(after_panic.load(Ordering::SeqCst), 1);
            for (i, r) in routines.iter().enumerate() {
                b.to_host(r.context(), &acc).unwrap();
                b.await_device(&devs[i]).unwrap();
                assert_eq!(
                    acc.host_values().unwrap(),
                    vec![3., 6., 9., 12.],
                    "{} device {i}",
                    b.name()
                );
            }
            // A panic with a payload that is not a string is reported too.
            let res = b.schedule(
                &devs[2],
                Task::new("odd payload", || std::panic::panic_any(42u8)),
            );
            let e = match res {
                Ok(()) => b.await_device(&devs[2]).unwrap_err(),
                Err(e) => e,
            };
            assert!(e.to_string().contains("odd payload"), "{e}");
            // The devices still run routines.
            routines[2].schedule().unwrap();
            b.await_device(&devs[2]).unwrap();
            b.unsafe_cleanup();
        }
    });
}
