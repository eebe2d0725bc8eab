//! The Rust-native entry point: configuration passed in as a value, one way to compile,
//! link and run, errors for the silent mistakes of the seed-shaped API.

mod common;

use arrayjit::compile::CompilerConfig;
use arrayjit::ir::*;
use arrayjit::{Jit, JitConfig};
use common::*;

fn sum_rows(x: &Tnode, s: &Tnode) -> Assignments {
    unop(
        s,
        Binop::Add,
        true,
        Unop::Identity,
        x,
        "ij->i",
        &Bindings::empty(),
    )
}

/// Two JITs with different compilers settings and caches, side by side in one process:
/// nothing is read from the environment when a configuration is given.
#[test]
fn two_configurations_side_by_side() {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let base = CompilerConfig::from_env().unwrap();
    let jits: Vec<Jit> = dirs
        .iter()
        .zip(["0", "2"])
        .map(|(d, level)| {
            let mut c = base.clone();
            c.cache_dir = Some(d.path().to_path_buf());
            c.opt_level = level.to_string();
            Jit::new(JitConfig::default().compiler(Some(c))).unwrap()
        })
        .collect();
    for (k, jit) in jits.iter().enumerate() {
        let x = input("x", &[2, 3], Prec::Single, &[1., 2., 3., 4., 5., 6.]);
        let s = output("s", &[2], Prec::Single);
        let code = jit
            .compile("sums", &Bindings::empty(), &sum_rows(&x, &s))
            .unwrap();
        let dev = jit.device().unwrap();
        let ctx = jit.context(&dev).unwrap();
        let r = jit.link(&ctx, &code).unwrap();
        jit.upload(r.context(), &x).unwrap();
        r.schedule().unwrap();
        jit.download(r.context(), &s).unwrap();
        assert_eq!(s.host_values().unwrap(), vec![6., 15.], "jit {k}");
        // Each JIT's cache directory holds its own entry.
        let entries = std::fs::read_dir(dirs[k].path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".so"))
            })
            .count();
        assert_eq!(entries, 1, "jit {k}");
    }
}

#[test]
fn transfers_of_tensors_not_hosted_or_not_in_the_context_are_errors() {
    let jit = Jit::new(JitConfig::default()).unwrap();
    let x = input("x", &[2, 2], Prec::Single, &[1., 2., 3., 4.]);
    let s = output("s", &[2], Prec::Single);
    let code = jit
        .compile("sums", &Bindings::empty(), &sum_rows(&x, &s))
        .unwrap();
    let dev = jit.device().unwrap();
    let ctx = jit.context(&dev).unwrap();
    // Before linking the context holds nothing.
    let e = jit.upload(&ctx, &x).unwrap_err().to_string();
    assert!(
        e.contains("upload") && e.contains('x') && e.contains("is not in context"),
        "{e}"
    );
    let r = jit.link(&ctx, &code).unwrap();
    let stranger = temp("stranger", &[2], Prec::Single);
    let e = jit
        .download(r.context(), &stranger)
        .unwrap_err()
        .to_string();
    assert!(e.contains("stranger") && e.contains("no host array"), "{e}");
}

#[test]
fn batches_and_several_devices() {
    let jit = Jit::new(JitConfig::default()).unwrap();
    let x = input("x", &[3, 2], Prec::Double, &[1., 2., 3., 4., 5., 6.]);
    let s = output("s", &[3], Prec::Double);
    let t = output("t", &[3], Prec::Double);
    let b = Bindings::empty();
    let batch = jit
        .compile_batch(
            &["sums", "maxes"],
            &b,
            &[
                sum_rows(&x, &s),
                unop(&t, Binop::Max, true, Unop::Identity, &x, "ij->i", &b),
            ],
        )
        .unwrap();
    assert!(jit.compile_batch(&["one"], &b, &[]).is_err());
    for dev in jit.devices(3).unwrap() {
        let ctx = jit.context(&dev).unwrap();
        let (ctx, routines) = jit.link_batch(&ctx, &batch).unwrap();
        jit.upload(&ctx, &x).unwrap();
        for r in routines.iter().flatten() {
            r.schedule().unwrap();
        }
        jit.download(&ctx, &s).unwrap();
        jit.download(&ctx, &t).unwrap();
        assert_eq!(s.host_values().unwrap(), vec![3., 7., 11.]);
        assert_eq!(t.host_values().unwrap(), vec![2., 4., 6.]);
    }
    assert!(jit.suggested_devices().unwrap() >= 1);
}

/// Trace logging: every run of a routine appends each value its assignments store, with
/// the indices, to `<trace_dir>/<trace_file_name(routine)>`.
#[test]
fn trace_logs_every_stored_value() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = CompilerConfig::from_env().unwrap();
    c.trace_dir = Some(dir.path().join("odd dir 'x'"));
    std::fs::create_dir_all(c.trace_dir.as_ref().unwrap()).unwrap();
    let jit = Jit::new(JitConfig::default().compiler(Some(c))).unwrap();
    let b = Bindings::empty();
    let x = input("x", &[2, 2], Prec::Single, &[1., 2., 3., 4.]);
    let y = output("y", &[2, 2], Prec::Single);
    let s = output("s", &[2], Prec::Single);
    let code = Assignments::seq([
        binop(&y, Binop::Arg2, false, Binop::Add, &x, &x, "ij,ij->ij", &b),
        unop(&s, Binop::Add, true, Unop::Identity, &y, "ij->i", &b),
    ]);
    let code = jit.compile("traced", &b, &code).unwrap();
    assert!(
        code.source().contains("aj_trace_printf(&aj_log"),
        "{}",
        code.source()
    );
    let dev = jit.device().unwrap();
    let r = jit.link(&jit.context(&dev).unwrap(), &code).unwrap();
    jit.upload(r.context(), &x).unwrap();
    r.run().unwrap();
    r.run().unwrap();
    let file = arrayjit::codegen::trace_file_name("traced");
    let log = std::fs::read_to_string(dir.path().join("odd dir 'x'").join(file)).unwrap();
    // The log follows the optimized code: both statements loop over the rows, so they are
    // fused into one loop over rows, and the zero fill of `s` became a store in that loop.
    let one_run = "# run of routine traced\n\
                   y[0, 0] = 2\ny[0, 1] = 4\ns[0] = 0\ns[0] = 2\ns[0] = 6\n\
                   y[1, 0] = 6\ny[1, 1] = 8\ns[1] = 0\ns[1] = 6\ns[1] = 14\n";
    assert_eq!(log, format!("{one_run}{one_run}"));
}

/// No silent zeros: a routine reading a tensor that nothing has written in its context (a
/// forgotten upload) fails with strict reads, the default in debug builds, naming the routine
/// and the tensor; without strict reads it runs (reading zeros) and the routine reports the
/// warning. After the upload both run and give the sums.
#[test]
fn reads_of_never_written_tensors_are_errors_or_warnings() {
    assert_eq!(JitConfig::default().strict, cfg!(debug_assertions));
    for strict in [true, false] {
        let jit = Jit::new(JitConfig::default().strict(strict)).unwrap();
        let x = input("x", &[2, 2], Prec::Single, &[1., 2., 3., 4.]);
        let s = output("s", &[2], Prec::Single);
        let code = jit
            .compile("sums", &Bindings::empty(), &sum_rows(&x, &s))
            .unwrap();
        let dev = jit.device().unwrap();
        let r = jit.link(&jit.context(&dev).unwrap(), &code).unwrap();
        // Forgot: jit.upload(r.context(), &x).
        r.schedule().unwrap();
        let res = jit.sync(&dev);
        if strict {
            // The device reports the task's error (Error::UnwrittenRead) by its text.
            let e = res.unwrap_err().to_string();
            assert!(
                e.contains("routine sums reads x that nothing has written in its context")
                    && e.contains("copy them from the host"),
                "{e}"
            );
            assert!(r.warnings().is_empty());
        } else {
            res.unwrap();
            jit.download(r.context(), &s).unwrap();
            assert_eq!(s.host_to_vec::<f32>().unwrap(), [0.0, 0.0]);
            let w = r.warnings();
            assert_eq!(w.len(), 1, "{w:?}");
            assert!(w[0].contains("routine sums reads x that nothing has written"));
        }
        jit.upload(r.context(), &x).unwrap();
        r.schedule().unwrap();
        jit.download(r.context(), &s).unwrap();
        assert_eq!(s.host_to_vec::<f32>().unwrap(), [3.0, 7.0]);
        assert!(r.warnings().len() <= 1, "warned once at most");
    }
}

/// On the no-device backend the run itself returns the typed error.
#[test]
fn strict_reads_give_a_typed_error_on_the_no_device_backend() {
    use arrayjit::backend::{CcBackend, Config, MergeBuffer};
    let be = CcBackend::new().with_strict(true);
    be.initialize(Config::default());
    let x = input("x", &[2, 2], Prec::Single, &[1., 2., 3., 4.]);
    let s = output("s", &[2], Prec::Single);
    let code = be
        .compile(true, Some("sums"), &Bindings::empty(), &sum_rows(&x, &s))
        .unwrap();
    let r = be
        .link(&[], &MergeBuffer::new(), &be.init("c").unwrap(), &code)
        .unwrap();
    match r.run() {
        Err(arrayjit::Error::UnwrittenRead { routine, tensors }) => {
            assert_eq!((routine.as_str(), tensors.as_str()), ("sums", "x"))
        }
        other => panic!("expected UnwrittenRead, got {other:?}"),
    }
    assert!(be.from_host(r.context(), &x).unwrap());
    r.run().unwrap();
}
