//! Trace logs (`ARRAYJIT_TRACE_DIR`, `CompilerConfig::trace_dir`): names never become format
//! strings, every routine gets its own file, concurrent runs write whole lines, a missing
//! directory is created, and the log is never opened through a symlink.

mod common;
use arrayjit::codegen::trace_file_name;
use arrayjit::compile::CompilerConfig;
use arrayjit::ir::{Assignments, Bindings, Binop, Prec, Tnode};
use arrayjit::{Error, Jit, JitConfig};
use common::*;
use std::path::{Path, PathBuf};

fn jit(trace_dir: &Path) -> Jit {
    let cfg = CompilerConfig::from_env()
        .expect("a C compiler is needed for these tests")
        .trace_dir(Some(trace_dir.to_path_buf()));
    Jit::new(JitConfig::default().compiler(Some(cfg))).unwrap()
}

/// `y = x + x` over `n` cells, `y` named `y_name`.
fn doubling(y_name: &str, n: usize) -> (Tnode, Tnode, Assignments) {
    let b = Bindings::empty();
    let xv: Vec<f64> = (0..n).map(|i| i as f64).collect();
    let x = input("x", &[n], Prec::Single, &xv);
    let y = output(y_name, &[n], Prec::Single);
    let code = binop(&y, Binop::Arg2, false, Binop::Add, &x, &x, "i,i->i", &b);
    (x, y, code)
}

/// Compiles, links on one device, uploads `x` and runs `runs` times.
fn run_traced(jit: &Jit, name: &str, x: &Tnode, code: &Assignments, runs: usize) {
    let code = jit.compile(name, &Bindings::empty(), code).unwrap();
    let dev = jit.device().unwrap();
    let r = jit.link(&jit.context(&dev).unwrap(), &code).unwrap();
    jit.upload(r.context(), x).unwrap();
    for _ in 0..runs {
        r.run().unwrap();
    }
    jit.sync(&dev).unwrap();
}

fn log_of(dir: &Path, routine: &str) -> String {
    let path = dir.join(trace_file_name(routine));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Names with printf directives are printed literally: no pointers leak into the log and
/// `%n` writes nothing (the process would crash).
#[test]
fn names_are_never_formats() {
    let dir = tempfile::tempdir().unwrap();
    let jit = jit(dir.path());
    for (routine, tensor) in [
        ("leak %p %p", "y %p %x"),
        ("crash %s%s%n", "t%s%n%s"),
        ("quote \" back \\ nl \n end", "q\"%%"),
    ] {
        let (x, _, code) = doubling(tensor, 2);
        run_traced(&jit, routine, &x, &code, 1);
        let log = log_of(dir.path(), routine);
        let shown_routine = routine.replace('\n', "?");
        let want = format!("# run of routine {shown_routine}\n{tensor}[0] = 0\n{tensor}[1] = 2\n");
        assert_eq!(log, want);
    }
}

/// Names that sanitize alike still get their own files.
#[test]
fn every_routine_has_its_own_file() {
    let pairs = [("a-b", "a_b"), ("p_routine_q", "p"), ("x", "X")];
    for (a, b) in pairs {
        assert_ne!(trace_file_name(a), trace_file_name(b));
    }
    let dir = tempfile::tempdir().unwrap();
    let jit = jit(dir.path());
    // One batch (one C file) holding all of them.
    let names: Vec<&str> = pairs.iter().flat_map(|(a, b)| [*a, *b]).collect();
    let progs: Vec<(Tnode, Tnode, Assignments)> = names
        .iter()
        .enumerate()
        .map(|(k, _)| doubling(&format!("y{k}"), 2))
        .collect();
    let codes: Vec<Assignments> = progs.iter().map(|p| p.2.clone()).collect();
    let batch = jit
        .compile_batch(&names, &Bindings::empty(), &codes)
        .unwrap();
    let dev = jit.device().unwrap();
    let (ctx, routines) = jit.link_batch(&jit.context(&dev).unwrap(), &batch).unwrap();
    for (p, r) in progs.iter().zip(&routines) {
        jit.upload(&ctx, &p.0).unwrap();
        r.as_ref().unwrap().run().unwrap();
    }
    jit.sync(&dev).unwrap();
    for (k, name) in names.iter().enumerate() {
        assert_eq!(
            log_of(dir.path(), name),
            format!("# run of routine {name}\ny{k}[0] = 0\ny{k}[1] = 2\n")
        );
    }
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(files, names.len());
}

/// Two devices running the same routine at once: the log holds only whole lines, every run's
/// header and every value (runs write more than the code's line buffer, so each run takes
/// several writes).
#[test]
fn concurrent_runs_write_whole_lines() {
    with_watchdog(300, || {
        let dir = tempfile::tempdir().unwrap();
        let jit = jit(dir.path());
        let n = 700;
        let runs = 30;
        let (x, _, code) = doubling("y", n);
        let code = jit
            .compile("concurrent", &Bindings::empty(), &code)
            .unwrap();
        let devices = jit.devices(2).unwrap();
        let mut routines = vec![];
        for d in &devices {
            let r = jit.link(&jit.context(d).unwrap(), &code).unwrap();
            jit.upload(r.context(), &x).unwrap();
            routines.push(r);
        }
        for _ in 0..runs {
            for r in &routines {
                r.schedule().unwrap();
            }
        }
        for d in &devices {
            jit.sync(d).unwrap();
        }
        let log = log_of(dir.path(), "concurrent");
        assert!(log.ends_with('\n'));
        let mut headers = 0;
        let mut seen = vec![0usize; n];
        for line in log.lines() {
            if line == "# run of routine concurrent" {
                headers += 1;
                continue;
            }
            let (lhs, value) = line
                .split_once("] = ")
                .unwrap_or_else(|| panic!("not a whole line: {line:?}"));
            let i: usize = lhs
                .strip_prefix("y[")
                .and_then(|i| i.parse().ok())
                .unwrap_or_else(|| panic!("not a whole line: {line:?}"));
            assert_eq!(value, format!("{}", 2 * i), "line {line:?}");
            seen[i] += 1;
        }
        assert_eq!(headers, 2 * runs);
        assert!(seen.iter().all(|&c| c == 2 * runs), "{seen:?}");
    });
}

/// A trace directory that does not exist is created (mode 0700) when the code is compiled; one
/// that cannot be created is an error then.
#[test]
fn a_missing_trace_directory_is_created() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let dir: PathBuf = root.path().join("not/yet/there");
    let jit = jit(&dir);
    let (x, _, code) = doubling("y", 2);
    run_traced(&jit, "created", &x, &code, 1);
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    assert!(log_of(&dir, "created").starts_with("# run of routine created\n"));

    let file = root.path().join("a file");
    std::fs::write(&file, "").unwrap();
    let jit = self::jit(&file.join("sub"));
    let (_, _, code) = doubling("y", 2);
    match jit.compile("nowhere", &Bindings::empty(), &code) {
        Err(e) => assert!(
            matches!(e.root(), Error::Io { what, .. } if what.contains("trace directory")),
            "{e}"
        ),
        Ok(_) => panic!("compiled with a trace directory under a file"),
    }
}

/// The log is opened without following a symlink planted at its path: nothing is written
/// through it (and the run still succeeds).
#[test]
fn the_log_is_not_opened_through_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "untouched\n").unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join(trace_file_name("linked"))).unwrap();
    let jit = jit(dir.path());
    let (x, _, code) = doubling("y", 2);
    run_traced(&jit, "linked", &x, &code, 2);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched\n");
}

/// Checked and traced at once: a run stopped by an out-of-bounds access closes its log (the
/// lines logged before the violation are there, whole) and reports the access.
#[test]
fn a_checked_run_stopped_by_a_violation_keeps_its_log() {
    use arrayjit::ir::{FetchOp, StaticSymbol};
    let dir = tempfile::tempdir().unwrap();
    let cfg = CompilerConfig::from_env()
        .expect("a C compiler is needed for these tests")
        .trace_dir(Some(dir.path().to_path_buf()))
        .checked(true);
    let jit = Jit::new(JitConfig::default().compiler(Some(cfg))).unwrap();
    // z = x + x; y = z[{s}, :]
    let s = StaticSymbol::new("s", Some(2));
    let b = Bindings(vec![s.clone()]);
    let x = input("x", &[2, 2], Prec::Single, &[1., 2., 3., 4.]);
    let z = output("z", &[2, 2], Prec::Single);
    let y = output("y", &[2], Prec::Single);
    let code = Assignments::seq([
        binop(&z, Binop::Arg2, false, Binop::Add, &x, &x, "ij,ij->ij", &b),
        Assignments::Fetch {
            array: y.clone(),
            fetch_op: FetchOp::Slice {
                batch_idx: s.clone(),
                sliced: z.clone(),
            },
        },
    ]);
    let code = jit.compile("both", &b, &code).unwrap();
    let dev = jit.device().unwrap();
    let r = jit.link(&jit.context(&dev).unwrap(), &code).unwrap();
    jit.upload(r.context(), &x).unwrap();
    jit.sync(&dev).unwrap();
    match r.run_unchecked_statics_for_test(&[3]) {
        Err(Error::IndexOutOfBounds {
            tensor,
            indices,
            extents,
            ..
        }) => assert_eq!(
            (tensor.as_str(), indices, extents),
            ("z", vec![3, 0], vec![2, 2])
        ),
        other => panic!("expected IndexOutOfBounds, got {other:?}"),
    }
    assert_eq!(
        log_of(dir.path(), "both"),
        "# run of routine both\nz[0, 0] = 2\nz[0, 1] = 4\nz[1, 0] = 6\nz[1, 1] = 8\n"
    );
}
