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
                // Rejected when set, naming the routine; the previous value stays.
                match r.bindings().set("row", bad) {
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
                // The routine still runs with the previous value.
                r.run().unwrap();
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
                (None, Error::Interpreter { msg: m, .. })
                    if m.contains("batch") && m.contains("row") => {}
                _ => panic!("{range:?}: unexpected {e:?}"),
            }
            assert!(mem.get(&y).is_none());
        }

        // On a device, the failing routine task is reported naming the routine.
        let (code, bind, _, _) = pick(None);
        // The batch is never uploaded (it reads zeros): strict reads off.
        let b = MulticoreBackend::with_cc(CcBackend::new().with_strict(false));
        b.initialize(Config::default());
        let dev = b.new_virtual_device(&b.get_device(0).unwrap()).unwrap();
        let compiled = b.compile(true, Some("pick"), &bind, &code).unwrap();
        let ctx = b.init(&dev).unwrap();
        let r = b.link(&[], &ctx, &compiled).unwrap();
        let e = r.bindings().set("row", 5).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(&e, Error::BindingOutOfRange { routine, .. } if routine == "pick"),
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

// ---------------------------------------------------------------------------------------------
// Environment variables.

/// Junk in any of the compile stage's variables is an error naming the variable, its value
/// and what was expected, whether or not the variable used to be checked.
#[test]
fn junk_in_compile_variables_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let p = program_str();
    let boolean = "1, on, true or yes to enable; 0, off, false or no to disable";
    let jobs = "a whole number of compiler processes, at least 1";
    let flags = "compiler flags separated by whitespace, each starting with '-'";
    let cases: Vec<(&str, &str, String)> = vec![
        ("ARRAYJIT_COMPILE_JOBS", "lots", jobs.into()),
        ("ARRAYJIT_COMPILE_JOBS", "0", jobs.into()),
        ("ARRAYJIT_CACHE", "maybe", boolean.into()),
        ("ARRAYJIT_GCC_WORKAROUND", "2", boolean.into()),
        (
            "ARRAYJIT_OPT_LEVEL",
            "fastest",
            "an optimization level: 0, 1, 2, 3, s, z, g or fast (optionally with -O)".into(),
        ),
        (
            "ARRAYJIT_COMPILE_TIMEOUT",
            "-1",
            "a positive number of seconds, such as 300 or 2.5".into(),
        ),
        (
            "ARRAYJIT_ARCH_FLAGS",
            "march=native",
            format!("{flags} (\"march=native\" does not)"),
        ),
        (
            "ARRAYJIT_CFLAGS",
            "-O2 -E",
            format!("{flags}, but not -E (arrayjit chooses what the compiler produces)"),
        ),
        (
            "CC",
            "gcc -m32",
            "a single program (a path, or a name found in PATH); put flags in ARRAYJIT_CFLAGS"
                .into(),
        ),
    ];
    for (var, value, expected) in cases {
        let mut env: Vec<Var> = vec![(var, os(value))];
        if var == "CC" {
            env.push(("ARRAYJIT_CC", None));
        }
        let out = cli(&["run", &p], tmp.path(), &env);
        assert_error(&out);
        let want = format!("environment variable {var}={value:?}: expected {expected}");
        assert!(
            out.stderr.contains(&want),
            "expected {want:?} in {}",
            out.stderr
        );
        assert_no_leftovers(tmp.path());
    }
    // Good values of the same variables work.
    let out = cli(
        &["run", &p],
        tmp.path(),
        &[
            ("ARRAYJIT_CC", Some(real_cc())),
            ("ARRAYJIT_COMPILE_JOBS", os("2")),
            ("ARRAYJIT_CACHE", os("OFF")),
            ("ARRAYJIT_GCC_WORKAROUND", os("yes")),
            ("ARRAYJIT_OPT_LEVEL", os("-O2")),
            ("ARRAYJIT_COMPILE_TIMEOUT", os("30.5")),
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_no_leftovers(tmp.path());
}

// ---------------------------------------------------------------------------------------------
// The compiler remembered by detection (`detected-cc-*` in the cache directory).

/// The first line of a valid `detected-cc-*` file.
const DETECTED_HEADER: &str = "arrayjit detected C compiler, format 1";

/// The environment for a run that detects its compiler and uses the cache in `cache`.
fn detecting(cache: &Path) -> Vec<Var<'static>> {
    vec![
        ("ARRAYJIT_CC", None),
        ("CC", None),
        ("ARRAYJIT_CACHE", None),
        ("ARRAYJIT_CACHE_DIR", os(cache)),
    ]
}

/// The `detected-cc-*` files in `cache`.
fn detected_files(cache: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("detected-cc-")
        })
        .collect()
}

/// Deletes the compiled objects in `cache`, so that the next run must compile.
fn remove_objects(cache: &Path) {
    for e in std::fs::read_dir(cache).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "so") {
            std::fs::remove_file(p).unwrap();
        }
    }
}

/// The `identity` line of a `detected-cc-*` file for `path`: resolved path, size and
/// modification time.
fn identity_of(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let real = std::fs::canonicalize(path).unwrap();
    let m = std::fs::metadata(&real).unwrap();
    format!(
        "{} {} {} {}",
        real.display(),
        m.len(),
        m.mtime(),
        m.mtime_nsec()
    )
}

/// A corrupted `detected-cc-*` file (`false`, which is found in PATH; empty; binary junk; a
/// path to nothing; a directory) is ignored and rewritten, and the run works.
#[test]
fn corrupt_detected_compiler_file_heals() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let p = program_str();
    let env = detecting(cache.path());
    let first = cli(&["run", &p], tmp.path(), &env);
    assert_eq!(first.code, 0, "{}", first.stderr);
    let files = detected_files(cache.path());
    assert_eq!(files.len(), 1, "{files:?}");
    let file = &files[0];
    let good = std::fs::read_to_string(file).unwrap();
    let lines: Vec<&str> = good.lines().collect();
    assert_eq!(lines.len(), 4, "{good}");
    assert_eq!(lines[0], DETECTED_HEADER);
    assert!(lines[1].starts_with("target ") && lines[2].starts_with("path "));
    assert!(lines[3].starts_with("identity /"), "{good}");

    let cases: [(&str, &[u8]); 6] = [
        ("false", b"false\n"),
        ("false without a newline", b"false"),
        ("empty", b""),
        (
            "binary junk",
            &[0x7f, b'E', b'L', b'F', 0, 0xff, 0xfe, b'\n', 1, 2, 3],
        ),
        ("a path to nothing", b"/nonexistent/bin/cc\n"),
        (
            "the old format naming false",
            b"arrayjit detected C compiler, format 1\nfalse\n",
        ),
    ];
    for (what, contents) in cases {
        std::fs::write(file, contents).unwrap();
        remove_objects(cache.path());
        let out = cli(&["run", &p], tmp.path(), &env);
        assert_eq!(out.code, 0, "{what}: {}", out.stderr);
        assert_eq!(out.stdout, first.stdout, "{what}");
        assert_eq!(std::fs::read_to_string(file).unwrap(), good, "{what}");
        assert_no_leftovers(tmp.path());
    }
    // A directory in its place: detection still works (the memo just cannot be written).
    std::fs::remove_file(file).unwrap();
    std::fs::create_dir(file).unwrap();
    remove_objects(cache.path());
    let out = cli(&["run", &p], tmp.path(), &env);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, first.stdout);
    std::fs::remove_dir(file).unwrap();

    // A well-formed file naming a compiler that exists and fails: the failure makes the
    // detection run afresh, which finds the real compiler; the run works and the file heals.
    let bin = tempfile::tempdir().unwrap();
    let broken = script(
        bin.path(),
        "broken-cc",
        "echo 'broken-cc: I am not a compiler' >&2\nexit 1",
    );
    std::fs::write(
        file,
        format!(
            "{DETECTED_HEADER}\n{}\npath {}\nidentity {}\n",
            lines[1],
            broken.display(),
            identity_of(&broken)
        ),
    )
    .unwrap();
    remove_objects(cache.path());
    let out = cli(&["run", &p], tmp.path(), &env);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, first.stdout);
    assert_eq!(std::fs::read_to_string(file).unwrap(), good);
    assert_no_leftovers(tmp.path());

    // A compile that fails for its source (here: its flags) with a working remembered
    // compiler is not blamed on the file, and the file stays.
    remove_objects(cache.path());
    let mut bad_source = env.clone();
    bad_source.push(("ARRAYJIT_CFLAGS", os("-Dfor=@")));
    let out = cli(&["run", &p], tmp.path(), &bad_source);
    assert_error(&out);
    assert!(out.stderr.contains("stray"), "{}", out.stderr);
    assert!(!out.stderr.contains("remembered in"), "{}", out.stderr);
    assert_eq!(std::fs::read_to_string(file).unwrap(), good);
    // The compiler's output is longer than the error's tail (every `for` of the runtime
    // header is an error), so all of it is kept in a log the error names: that file stays,
    // nothing else does.
    for log in kept_logs(&out.stderr) {
        std::fs::remove_file(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    }
    assert_no_leftovers(tmp.path());
}

/// The compiler logs an error message says it kept (`all of it is in PATH]`).
fn kept_logs(stderr: &str) -> Vec<PathBuf> {
    stderr
        .split("all of it is in ")
        .skip(1)
        .filter_map(|rest| rest.split(']').next())
        .map(PathBuf::from)
        .collect()
}

/// When the remembered compiler fails and a fresh detection chooses it again, the error names
/// the file that remembered it.
#[test]
fn failing_detected_compiler_error_names_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    // A `cc` first in PATH that is not a compiler: the cc crate's detection picks it.
    script(
        bin.path(),
        "cc",
        "echo 'fake cc: refusing 5150' >&2\nexit 1",
    );
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![bin.path().to_path_buf()];
    dirs.extend(std::env::split_paths(&path));
    let mut env = detecting(cache.path());
    env.push(("PATH", Some(std::env::join_paths(dirs).unwrap())));
    env.push(("CC_x86_64_unknown_linux_gnu", None));
    env.push(("TARGET_CC", None));
    env.push(("HOST_CC", None));
    let p = program_str();
    // The first run detects it afresh, so there is nothing to blame on the file.
    let out = cli(&["run", &p], tmp.path(), &env);
    assert_error(&out);
    assert!(
        out.stderr.contains("fake cc: refusing 5150"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("detected-cc-"), "{}", out.stderr);
    // The second run takes it from the file.
    let files = detected_files(cache.path());
    assert_eq!(files.len(), 1, "{files:?}");
    let out = cli(&["run", &p], tmp.path(), &env);
    assert_error(&out);
    assert!(
        out.stderr.contains("fake cc: refusing 5150"),
        "{}",
        out.stderr
    );
    let want = format!(
        "remembered in {}; a fresh detection chose it again",
        files[0].display()
    );
    assert!(
        out.stderr.contains(&want),
        "expected {want:?} in {}",
        out.stderr
    );
    assert_no_leftovers(tmp.path());
}

// ---------------------------------------------------------------------------------------------
// Compiler output.

/// The process's children's peak resident memory so far, in KiB.
fn children_max_rss_kib() -> i64 {
    // SAFETY: getrusage only writes into the struct we pass, which is plain data for which
    // all-zero bytes are a valid value.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut u);
        u.ru_maxrss
    }
}

/// This process's peak resident memory (VmHWM), in KiB; 0 if unknown.
fn own_peak_rss_kib() -> i64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// A compiler that writes ~100 MB and fails: the error holds only the tail of its output
/// (the last lines, at most 16 KiB) and names a file with all of it, and the output is never
/// read whole into memory.
#[test]
fn huge_compiler_output_is_cut_to_its_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let cc = script(
        bin.path(),
        "loud-cc",
        "echo 'loud-cc: first line 1111' >&2\n\
         yes 'loud-cc: warning: this line repeats a great many times' | head -c 100000000 >&2\n\
         echo 'loud-cc: on stdout 3333'\n\
         echo 'loud-cc: last line 9999' >&2\n\
         exit 1",
    );
    let out = cli(
        &["run", &program_str()],
        tmp.path(),
        &[("ARRAYJIT_CC", os(&cc))],
    );
    assert_error(&out);
    assert!(out.stderr.len() < 20 * 1024, "{} bytes", out.stderr.len());
    assert!(out.stderr.lines().count() < 220, "{}", out.stderr);
    assert!(
        out.stderr.contains("loud-cc: last line 9999"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("first line 1111"), "{}", out.stderr);
    // The pointer to the full output.
    let marker = "all of it is in ";
    let start = out.stderr.find(marker).expect("a path to the full output") + marker.len();
    let rest = &out.stderr[start..];
    let log = PathBuf::from(&rest[..rest.find(']').unwrap()]);
    assert_eq!(log.parent(), Some(tmp.path()), "{}", log.display());
    let name = log.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("arrayjit-compile-matmul") && name.ends_with(".log"),
        "{name}"
    );
    let size = std::fs::metadata(&log).unwrap().len();
    assert!(
        out.stderr
            .contains(&format!("[the compiler printed {size} bytes; the first ")),
        "{}",
        out.stderr
    );
    assert!(size > 100_000_000, "{size}");
    // The log starts with standard output, then the error output from its first line.
    let mut head = vec![0u8; 64];
    use std::io::Read;
    std::fs::File::open(&log)
        .unwrap()
        .read_exact(&mut head)
        .unwrap();
    assert!(
        head.starts_with(b"loud-cc: on stdout 3333\nloud-cc: first line 1111\n"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    std::fs::remove_file(&log).unwrap();
    assert_no_leftovers(tmp.path());
    // Reading 100 MB into memory (as before) would take hundreds of MB. Other tests' compilers
    // count too, but none of them comes near; a preloaded sanitizer runtime would, so the
    // check is skipped under one.
    // A child started by posix_spawn (vfork) records at its exec the peak of the memory it
    // shared with us, so a child's peak at or below this process's own peak says nothing about
    // the child (this process can pass 100 MiB when panics of other tests symbolize their
    // backtraces, with RUST_BACKTRACE=1).
    if std::env::var_os("LD_PRELOAD").is_none() {
        let rss_kib = children_max_rss_kib();
        let own_kib = own_peak_rss_kib();
        assert!(
            rss_kib < 100 * 1024 || rss_kib <= own_kib,
            "a child process peaked at {} MiB (this process: {} MiB)",
            rss_kib / 1024,
            own_kib / 1024
        );
    }

    // With a debug directory, its log has all of it and the message points there.
    let debug = tempfile::tempdir().unwrap();
    let out = cli(
        &["run", &program_str()],
        tmp.path(),
        &[
            ("ARRAYJIT_CC", os(&cc)),
            ("ARRAYJIT_DEBUG_DIR", os(debug.path())),
        ],
    );
    assert_error(&out);
    let kept = debug.path().join("matmul.log");
    assert!(
        out.stderr
            .contains(&format!("all of it is in {}]", kept.display())),
        "{}",
        out.stderr
    );
    assert_eq!(std::fs::metadata(&kept).unwrap().len(), size);
    assert!(out.stderr.len() < 20 * 1024);
    assert_no_leftovers(tmp.path());
}

// ---------------------------------------------------------------------------------------------
// Signals.

/// SIGTERM while the compiler runs (during the target probe with the cache on, during the
/// compile with it off): the CLI kills the compiler's process group, removes its temporary
/// directory and exits with 143.
#[test]
fn sigterm_during_a_compile_cleans_up() {
    for cache in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tempfile::tempdir().unwrap();
        let cache_dir = tempfile::tempdir().unwrap();
        let pid_file = bin.path().join("cc.pid");
        let child_file = bin.path().join("child.pid");
        // Writes its pid, starts a child, then sleeps; the pid file is written last, so that
        // both are known once it exists.
        let cc = script(
            bin.path(),
            "sleepy-cc",
            &format!(
                "sleep 300 &\necho $! > '{c}'\necho $$ > '{p}.tmp'\nmv '{p}.tmp' '{p}'\nexec sleep 300",
                c = child_file.display(),
                p = pid_file.display()
            ),
        );
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_arrayjit"));
        cmd.args(["run", &program_str()])
            .env("TMPDIR", tmp.path())
            .env("ARRAYJIT_CC", &cc)
            .env_remove("ARRAYJIT_DEBUG_DIR")
            .env_remove("ARRAYJIT_COMPILE_TIMEOUT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if cache {
            cmd.env_remove("ARRAYJIT_CACHE")
                .env("ARRAYJIT_CACHE_DIR", cache_dir.path());
        } else {
            cmd.env("ARRAYJIT_CACHE", "0");
        }
        let mut child = cmd.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !pid_file.exists() {
            if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the fake compiler never started (cache {cache})");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let cc_pid = read_pid(&pid_file);
        let grandchild = read_pid(&child_file);
        // The compile is under way: its temporary directory exists.
        let busy: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert!(
            !busy.is_empty(),
            "no temporary directory during the compile"
        );

        let sent = Instant::now();
        // SAFETY: kill(2) has no memory-safety preconditions; `child` is our own unreaped
        // child, so its pid names it.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if sent.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                let _ = child.wait();
                let _ = Command::new("kill")
                    .args(["-9", &cc_pid.to_string(), &grandchild.to_string()])
                    .status();
                panic!("arrayjit did not exit within 10 s of SIGTERM (cache {cache})");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(143), "cache {cache}: {status:?}");
        assert!(
            sent.elapsed() < Duration::from_secs(5),
            "{:?}",
            sent.elapsed()
        );
        wait_dead(cc_pid, "the fake compiler");
        wait_dead(grandchild, "the fake compiler's child");
        assert_no_leftovers(tmp.path());
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
