//! Compiler selection and failures through the environment. Environment variables are
//! process-wide, so everything that changes them lives in this one test.

mod common;
use arrayjit::backend::{CcBackend, Config};
use arrayjit::ir::*;
use common::*;

fn chain() -> Assignments {
    let b = Bindings::empty();
    let x = input("x", &[4], Prec::Single, &[1., 2., 3., 4.]);
    let y = output("y", &[4], Prec::Single);
    unop(&y, Binop::Arg2, false, Unop::Exp, &x, "i->i", &b)
}

#[test]
fn compiler_errors_and_missing_compiler() {
    let backend = CcBackend::new();
    backend.initialize(Config::default());
    let b = Bindings::empty();

    // A missing compiler is a clear error naming what was looked for.
    std::env::set_var("ARRAYJIT_CC", "/nonexistent");
    let err = backend.compile(true, Some("r"), &b, &chain()).unwrap_err();
    assert!(matches!(err, arrayjit::Error::CompilerNotFound(_)), "{err}");
    assert!(err.to_string().contains("/nonexistent"), "{err}");
    std::env::remove_var("ARRAYJIT_CC");

    // A compile error carries the compiler's own message and the command line.
    std::env::set_var("ARRAYJIT_CFLAGS", "-Dfor=@");
    let err = backend.compile(true, Some("r"), &b, &chain()).unwrap_err();
    let msg = err.to_string();
    // It names the routine, around the compiler's error.
    assert!(
        matches!(&err, arrayjit::Error::InRoutine { routine, .. } if routine == "r"),
        "{msg}"
    );
    assert!(
        matches!(err.root(), arrayjit::Error::Compile { .. }),
        "{msg}"
    );
    assert!(msg.contains("stray") && msg.contains("-Dfor=@"), "{msg}");

    // With a debug directory the message points at the kept source and the dumps are there.
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("ARRAYJIT_DEBUG_DIR", dir.path());
    let err = backend
        .compile(true, Some("kept"), &b, &chain())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&dir.path().join("kept.c").display().to_string()),
        "{err}"
    );
    std::env::remove_var("ARRAYJIT_CFLAGS");
    backend.compile(true, Some("fine"), &b, &chain()).unwrap();
    let files: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for want in ["fine.c", "fine.cmd", "fine.log", "arrayjit.h"] {
        assert!(
            files.iter().any(|f| f == want),
            "{want} missing from {files:?}"
        );
    }
    for want in ["assignments.txt", "unoptimized.ll.txt", "optimized.ll.txt"] {
        assert!(
            files.iter().any(|f| f.ends_with(want)),
            "{want} missing from {files:?}"
        );
    }
    std::env::remove_var("ARRAYJIT_DEBUG_DIR");

    // An imported C function that does not exist fails at load time, not at run time.
    let z = output("z", &[2], Prec::Double);
    let imp = Assignments::Fetch {
        array: z,
        fetch_op: FetchOp::Imported("arrayjit_no_such_function".into()),
    };
    let err = backend
        .compile(true, Some("imp"), &b, &imp)
        .unwrap_err()
        .to_string();
    assert!(err.contains("arrayjit_no_such_function"), "{err}");

    // Junk in a variable is a typed error naming the variable, its value and what it must
    // hold: for the variables that used to be ignored silently too.
    let boolean = "1, on, true or yes to enable; 0, off, false or no to disable";
    let jobs = "a whole number of compiler processes, at least 1";
    for (var, value, expected) in [
        ("ARRAYJIT_CACHE", "maybe", boolean),
        ("ARRAYJIT_COMPILE_JOBS", "lots", jobs),
        ("ARRAYJIT_COMPILE_JOBS", "0", jobs),
        ("ARRAYJIT_GCC_WORKAROUND", "perhaps", boolean),
    ] {
        std::env::set_var(var, value);
        let err = backend.compile(true, Some("r"), &b, &chain()).unwrap_err();
        match &err {
            arrayjit::Error::Config {
                var: v,
                value: val,
                expected: exp,
            } => assert_eq!(
                (v.as_str(), val.as_str(), exp.as_str()),
                (var, value, expected)
            ),
            other => panic!("{var}={value}: expected a Config error, got {other:?}"),
        }
        let e = arrayjit::compile::CompilerConfig::from_env().unwrap_err();
        assert_eq!(e.to_string(), err.to_string());
        std::env::remove_var(var);
    }
    // The job count is part of the configuration.
    std::env::set_var("ARRAYJIT_COMPILE_JOBS", " 3 ");
    let cfg = arrayjit::compile::CompilerConfig::from_env().unwrap();
    assert_eq!(cfg.compile_jobs, 3);
    std::env::remove_var("ARRAYJIT_COMPILE_JOBS");
    backend
        .compile(true, Some("fine_again"), &b, &chain())
        .unwrap();
}
