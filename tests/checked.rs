//! Bounds-checked mode (`ARRAYJIT_CHECKED`, `CompilerConfig::checked`, `JitConfig::checked`):
//! an out-of-range access is reported as `Error::IndexOutOfBounds` naming the routine, the
//! tensor, the indices and the extents, and never crashes; valid programs give the same values
//! checked and unchecked (the GEMM kernels and vector paths included).

mod common;
use arrayjit::backend::{CcBackend, Routine};
use arrayjit::compile::CompilerConfig;
use arrayjit::ir::{Assignments, Bindings, Binop, FetchOp, Prec, StaticSymbol, Tnode, Unop};
use arrayjit::optimize::Settings;
use arrayjit::{Error, Jit, JitConfig};
use common::*;

/// A compiler configuration from the environment with bounds checks as given.
fn config(checked: bool) -> CompilerConfig {
    CompilerConfig::from_env()
        .expect("a C compiler is needed for these tests")
        .checked(checked)
}

fn backend(checked: bool) -> CcBackend {
    CcBackend::with_config(config(checked), Settings::default())
}

/// `y = x[{s}, :]`: a slice of `x` (3 x 2) by a static index of range 3.
fn slice_program() -> (StaticSymbol, Bindings, Tnode, Tnode, Assignments) {
    let s = StaticSymbol::new("s", Some(3));
    let b = Bindings(vec![s.clone()]);
    let x = input("x", &[3, 2], Prec::Single, &[1., 2., 3., 4., 5., 6.]);
    let y = output("y", &[2], Prec::Single);
    let code = Assignments::Fetch {
        array: y.clone(),
        fetch_op: FetchOp::Slice {
            batch_idx: s.clone(),
            sliced: x.clone(),
        },
    };
    (s, b, x, y, code)
}

fn read(backend: &CcBackend, r: &Routine, t: &Tnode) -> Vec<f64> {
    assert!(backend.to_host(r.context(), t).unwrap());
    t.host_values().unwrap()
}

#[test]
fn an_out_of_range_read_is_reported_not_a_crash() {
    let (_, b, _, y, code) = slice_program();
    let be = backend(true);
    let (r, src) = build(&be, "slicer", &b, &code).unwrap();
    assert!(src.contains("AJ_OOB(") && src.contains("aj_chk"), "{src}");
    // A valid run first.
    r.run_unchecked_statics_for_test(&[1]).unwrap();
    assert_eq!(read(&be, &r, &y), vec![3., 4.]);
    // Then an index past the axis, and a negative one: reported, nothing more written.
    for bad in [5i64, 3, -1, i64::MAX] {
        match r.run_unchecked_statics_for_test(&[bad]) {
            Err(Error::IndexOutOfBounds {
                routine,
                tensor,
                indices,
                extents,
            }) => {
                assert_eq!(routine, "slicer");
                assert_eq!(tensor, "x");
                assert_eq!(indices, vec![bad, 0]);
                assert_eq!(extents, vec![3, 2]);
            }
            other => panic!("s = {bad}: expected IndexOutOfBounds, got {other:?}"),
        }
        assert_eq!(read(&be, &r, &y), vec![3., 4.], "s = {bad} wrote into y");
    }
    // The message names them all.
    let e = r.run_unchecked_statics_for_test(&[7]).unwrap_err();
    let msg = e.to_string();
    for part in ["slicer", "tensor x", "[7, 0]", "[3, 2]"] {
        assert!(msg.contains(part), "{msg:?} lacks {part:?}");
    }
    // The process and the routine survive: valid runs work again.
    r.run_unchecked_statics_for_test(&[2]).unwrap();
    assert_eq!(read(&be, &r, &y), vec![5., 6.]);
    r.bindings().set("s", 0).unwrap();
    r.run().unwrap();
    assert_eq!(read(&be, &r, &y), vec![1., 2.]);
}

#[test]
fn an_out_of_range_write_is_reported_before_it_happens() {
    // y[{s}] = x[0] + 1 over a second axis: y is 3 x 2.
    let s = StaticSymbol::new("s", Some(3));
    let b = Bindings(vec![s.clone()]);
    let x = input("x", &[2], Prec::Double, &[10., 20.]);
    let one = input("one", &[1], Prec::Double, &[1.]);
    let y = output("y", &[3, 2], Prec::Double);
    let code = binop(
        &y,
        Binop::Arg2,
        false,
        Binop::Add,
        &x,
        &one,
        "j,0->{s}j",
        &b,
    );
    let be = backend(true);
    let (r, _) = build(&be, "writer", &b, &code).unwrap();
    match r.run_unchecked_statics_for_test(&[4]) {
        Err(Error::IndexOutOfBounds {
            routine,
            tensor,
            indices,
            extents,
        }) => {
            assert_eq!((routine.as_str(), tensor.as_str()), ("writer", "y"));
            assert_eq!((indices, extents), (vec![4, 0], vec![3, 2]));
        }
        other => panic!("expected IndexOutOfBounds, got {other:?}"),
    }
    assert_eq!(read(&be, &r, &y), vec![0.; 6]);
    r.run_unchecked_statics_for_test(&[2]).unwrap();
    assert_eq!(read(&be, &r, &y), vec![0., 0., 0., 0., 11., 21.]);
}

/// The testing hook refuses unchecked code (whose accesses would not be checked).
#[test]
fn the_testing_hook_needs_checked_code() {
    let (_, b, _, _, code) = slice_program();
    let be = backend(false);
    let (r, src) = build(&be, "unchecked", &b, &code).unwrap();
    assert!(!src.contains("AJ_OOB("), "{src}");
    assert!(matches!(
        r.run_unchecked_statics_for_test(&[5]),
        Err(Error::Usage(_))
    ));
    // And the ordinary static check still guards it.
    assert!(r.bindings().set("s", 5).is_err() || r.run().is_err());
}

/// Through `JitConfig::checked` on a device (a worker thread): the error comes back from
/// the device, which keeps working.
#[test]
fn checked_runs_on_a_device_report_the_error() {
    let (_, b, x, y, code) = slice_program();
    let jit = Jit::new(
        JitConfig::default()
            .compiler(Some(config(false)))
            .checked(true),
    )
    .unwrap();
    let code = jit.compile("on_device", &b, &code).unwrap();
    assert!(code.source().contains("aj_out_of_bounds("));
    let dev = jit.device().unwrap();
    let r = jit.link(&jit.context(&dev).unwrap(), &code).unwrap();
    jit.upload(r.context(), &x).unwrap();
    jit.sync(&dev).unwrap();
    let e = r.run_unchecked_statics_for_test(&[9]).unwrap_err();
    assert!(
        matches!(e.root(), Error::IndexOutOfBounds { tensor, .. } if tensor == "x"),
        "{e}"
    );
    r.bindings().set("s", 1).unwrap();
    r.schedule().unwrap();
    jit.download(r.context(), &y).unwrap();
    assert_eq!(y.host_values().unwrap(), vec![3., 4.]);
}

/// Runs `code` checked and unchecked and returns both results of `outs`, with the checked
/// C source.
fn both(name: &str, code: &Assignments, outs: &[&Tnode]) -> (Vec<Vec<f64>>, Vec<Vec<f64>>, String) {
    let b = Bindings::empty();
    let mut got = vec![];
    let mut src = String::new();
    for checked in [false, true] {
        let be = backend(checked);
        let (r, s) = build(&be, name, &b, code).unwrap();
        got.push(run_and_read(&be, &r, outs));
        if checked {
            src = s;
        }
    }
    let checked = got.pop().unwrap();
    (got.pop().unwrap(), checked, src)
}

/// A matrix product large enough for the GEMM kernels (packing, vector tiles, edge tiles),
/// with small integers: every sum is exact in any order.
#[test]
fn checked_matmul_gives_the_same_values() {
    let (m, k, n) = (37, 41, 35);
    let av: Vec<f64> = (0..m * k).map(|i| ((i * 7) % 9) as f64 - 4.0).collect();
    let bv: Vec<f64> = (0..k * n).map(|i| ((i * 5) % 7) as f64 - 3.0).collect();
    let a = input("a", &[m, k], Prec::Single, &av);
    let bm = input("b", &[k, n], Prec::Single, &bv);
    let c = output("c", &[m, n], Prec::Single);
    let code = binop(
        &c,
        Binop::Add,
        true,
        Binop::Mul,
        &a,
        &bm,
        "ij,jk->ik",
        &Bindings::empty(),
    );
    let mut want = vec![0.0; m * n];
    for i in 0..m {
        for kk in 0..n {
            want[i * n + kk] = (0..k).map(|j| av[i * k + j] * bv[j * n + kk]).sum();
        }
    }
    let (plain, checked, src) = both("mm", &code, &[&c]);
    assert_eq!(plain[0], want);
    assert_eq!(checked[0], want);
    // The kernel's vector accesses are checked too (a vector check tests the last lane).
    assert!(src.contains("vec1"), "no vector code:\n{src}");
    assert!(
        src.lines().any(|l| l.contains("AJ_OOB(")
            && l.contains("aj_out_of_bounds(")
            && !l.ends_with(", 1);")),
        "no checked vector access:\n{src}"
    );
}

/// An elementwise chain (fused into one vectorizable loop) and a row reduction.
#[test]
fn checked_elementwise_chain_and_reduction_give_the_same_values() {
    let b = Bindings::empty();
    let n = 67;
    let xv: Vec<f64> = (0..2 * n).map(|i| (i as f64 - 60.0) / 4.0).collect();
    let x = input("x", &[2, n], Prec::Single, &xv);
    let t = temp("t", &[2, n], Prec::Single);
    let u = temp("u", &[2, n], Prec::Single);
    let y = output("y", &[2, n], Prec::Single);
    let s = output("s", &[2], Prec::Double);
    let code = Assignments::seq([
        binop(&t, Binop::Arg2, false, Binop::Mul, &x, &x, "ij,ij->ij", &b),
        unop(&u, Binop::Arg2, false, Unop::Relu, &x, "ij->ij", &b),
        binop(&y, Binop::Arg2, false, Binop::Add, &t, &u, "ij,ij->ij", &b),
        unop(&s, Binop::Add, true, Unop::Identity, &y, "ij->i", &b),
    ]);
    let want_y: Vec<f64> = xv.iter().map(|&v| v * v + v.max(0.0)).collect();
    let want_s: Vec<f64> = (0..2)
        .map(|r| want_y[r * n..(r + 1) * n].iter().sum())
        .collect();
    let (plain, checked, src) = both("chain", &code, &[&y, &s]);
    assert!(src.contains("AJ_OOB("), "{src}");
    for got in [plain, checked] {
        assert_eq!(got[0], want_y);
        assert_eq!(got[1], want_s);
    }
}

/// Checked code differs from unchecked code, so the compile cache keeps both: two objects,
/// and compiling either again hits the cache.
#[test]
fn checked_code_is_cached_apart() {
    let cache = tempfile::tempdir().unwrap();
    let objects = || {
        std::fs::read_dir(cache.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "so")
            })
            .count()
    };
    let (_, b, _, y, code) = slice_program();
    let mut sources = vec![];
    for (round, checked) in [false, true, false, true].into_iter().enumerate() {
        let cfg = config(checked).cache_dir(Some(cache.path().to_path_buf()));
        let be = CcBackend::with_config(cfg, Settings::default());
        let (r, src) = build(&be, "cached", &b, &code).unwrap();
        r.bindings().set("s", 2).unwrap();
        assert_eq!(run_and_read(&be, &r, &[&y])[0], vec![5., 6.]);
        sources.push(src);
        assert_eq!(objects(), round.min(1) + 1, "after compile {round}");
    }
    assert_ne!(sources[0], sources[1]);
    assert_eq!(sources[0], sources[2]);
}

/// The C side of the ABI alone: `aj_out_of_bounds` fills an `aj_check_t` laid out as the
/// library reads it (mirrored here), and for a vector access whose first element is inside
/// the tensor, records its last lane (the overflow shows on the first axis).
#[test]
fn the_check_record_of_a_vector_access() {
    #[repr(C)]
    struct Record {
        failed: i32,
        tensor: i32,
        naxes: i32,
        lanes: i32,
        indices: [i64; 16],
        extents: [i64; 16],
    }
    const SRC: &str = "#define AJ_CHECKED 1\n#include \"arrayjit.h\"\n\
        int f(void *const *buffers, const int64_t *statics, const void *merge_buffer, const void *team) {\n\
          (void)merge_buffer;\n\
          aj_check_t *aj_chk = (aj_check_t *)buffers[0];\n\
          int64_t i = statics[0], j = statics[1];\n\
          if (AJ_OOB(i, 3) || AJ_OOB(j, 5) || AJ_OOB(i * 5 + j + 3, 15)) return aj_out_of_bounds(aj_chk, 2, 2, (const int64_t[]){i, j}, (const int64_t[]){3, 5}, 4);\n\
          return 0;\n\
        }\n";
    let root = tempfile::tempdir().unwrap();
    let cfg = config(false)
        .temp_root(Some(root.path().to_path_buf()))
        .cache_dir(None);
    let lib = arrayjit::compile::compile_and_load(&cfg, SRC, "check_record", &[]).unwrap();
    let f = lib.entry("f").unwrap();
    let call = |i: i64, j: i64| {
        let mut r = Record {
            failed: 0,
            tensor: 0,
            naxes: 0,
            lanes: 0,
            indices: [0; 16],
            extents: [0; 16],
        };
        let buffers = [(&mut r as *mut Record).cast::<u8>()];
        let statics = [i, j];
        // SAFETY: `f` (SRC above) reads statics[0..2] and writes at most one aj_check_t
        // through buffers[0], which points at `r`, a Record of the same layout (272 bytes,
        // asserted by the header); `lib` outlives the call.
        let status = unsafe {
            f(
                buffers.as_ptr(),
                statics.as_ptr(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        (status, r)
    };
    let (status, r) = call(1, 3);
    assert_eq!((status, r.failed), (0, 0));
    // Lanes (2, 3) .. (3, 1): the last lane is past the end.
    let (status, r) = call(2, 3);
    assert_eq!(
        (status, r.failed, r.tensor, r.naxes, r.lanes),
        (3, 1, 2, 2, 4)
    );
    assert_eq!(
        (&r.indices[..2], &r.extents[..2]),
        (&[3, 1][..], &[3, 5][..])
    );
    // A first element outside is recorded as it is.
    let (status, r) = call(-1, 3);
    assert_eq!((status, r.failed), (3, 1));
    assert_eq!(&r.indices[..2], &[-1, 3]);
}
