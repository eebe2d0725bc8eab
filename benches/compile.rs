//! Compile latency of one small kernel (`out = max(0, a*b + c)*2 - d` on 4096 f32 elements,
//! the same as `benches/peers/small_kernel.json`):
//!
//! - cold: `compile::compile_and_load` with the cache off (`cache_dir = None`, as with
//!   `ARRAYJIT_CACHE=0`), i.e. temporary directory, files, the compiler and `dlopen`;
//! - the raw compiler command alone (the exact command `compile_and_load` runs, i.e.
//!   `<cc> -O3 -march=native -std=gnu11 -shared -fPIC -I. -o libK.so K.c -lm`, in a directory
//!   prepared once), measured in the same process for comparison;
//! - cached: `compile_and_load` hits in a temporary cache directory (warmed by a first call);
//! - the whole `CcBackend::compile` (lower, optimize, codegen, compile) on a cache hit, and
//!   lower+optimize+codegen alone.

use arrayjit::backend::{CcBackend, Config};
use arrayjit::compile::{compile_and_load, CompilerConfig};
use arrayjit::ir::einsum::projections;
use arrayjit::ir::{
    Assignments, Bindings, Binop, Buffer, FetchOp, InitOp, MemoryMode, Prec, Tnode, Unop,
};
use arrayjit::optimize::Settings;
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The runtime header the generated C includes (for the raw compiler command).
const RUNTIME_HEADER: &str = include_str!("../runtime_c/arrayjit.h");

const N: usize = 4096;

fn binop(lhs: &Tnode, op: Binop, a: &Tnode, b: &Tnode, spec: &str) -> Assignments {
    Assignments::AccumBinop {
        initialize_neutral: false,
        accum: Binop::Arg2,
        op,
        lhs: lhs.clone(),
        rhs1: Buffer::Node(a.clone()),
        rhs2: Buffer::Node(b.clone()),
        projections: projections(spec, lhs.dims(), &[a.dims(), b.dims()], &Bindings::empty())
            .unwrap(),
    }
}

/// The small kernel's assignments.
fn small_kernel() -> Assignments {
    let input = |name: &str, seed: u64| {
        Tnode::with_init(
            &[name],
            &[N],
            Prec::Single,
            &InitOp::StandardUniform { seed },
        )
        .unwrap()
    };
    let temp = |name: &str, dims: &[usize]| Tnode::new(&[name], dims, Prec::Single).unwrap();
    let (a, b, c, d) = (input("a", 1), input("b", 2), input("c", 3), input("d", 4));
    let (ab, abc, r, r2, two) = (
        temp("ab", &[N]),
        temp("abc", &[N]),
        temp("r", &[N]),
        temp("r2", &[N]),
        temp("two", &[1]),
    );
    let out = Tnode::builder(&["out"], &[N], Prec::Single)
        .memory(MemoryMode::OnDevice)
        .build()
        .unwrap();
    Assignments::block(
        "out = max(0, a*b + c) * 2 - d",
        Assignments::seq([
            binop(&ab, Binop::Mul, &a, &b, "i,i->i"),
            binop(&abc, Binop::Add, &ab, &c, "i,i->i"),
            Assignments::AccumUnop {
                initialize_neutral: false,
                accum: Binop::Arg2,
                op: Unop::Relu,
                lhs: r.clone(),
                rhs: Buffer::Node(abc.clone()),
                projections: projections("i->i", r.dims(), &[abc.dims()], &Bindings::empty())
                    .unwrap(),
            },
            Assignments::Fetch {
                array: two.clone(),
                fetch_op: FetchOp::Constant(2.0),
            },
            binop(&r2, Binop::Mul, &r, &two, "i,0->i"),
            binop(&out, Binop::Sub, &r2, &d, "i,i->i"),
        ]),
    )
}

/// Lower, optimize and print the C of a routine (what `CcBackend::compile` does before
/// compiling).
fn generate(asgns: &Assignments) -> String {
    let code = arrayjit::lower::lower(asgns).unwrap();
    let optimized = arrayjit::optimize::optimize("small", code, &Settings::default()).unwrap();
    let target = arrayjit::target::VectorTarget::default();
    let (source, _) =
        arrayjit::codegen::write_file(&[(&optimized, &Bindings::empty())], &target).unwrap();
    source
}

fn files_in(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

fn compile_latency(c: &mut Criterion) {
    let asgns = small_kernel();
    let source = generate(&asgns);

    let mut cold = CompilerConfig::from_env().unwrap();
    cold.cache_dir = None;
    cold.debug_dir = None;

    let mut g = c.benchmark_group("compile small kernel");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sampling_mode(SamplingMode::Flat);

    g.bench_function("lower+optimize+codegen", |b| {
        b.iter(|| generate(std::hint::black_box(&asgns)))
    });

    g.bench_function("cold compile_and_load (no cache)", |b| {
        b.iter(|| {
            let lib = compile_and_load(&cold, &source, "small", &[]).unwrap();
            assert!(!lib.from_cache());
            lib
        })
    });

    // The same command in a directory prepared once: the compiler alone.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("small.c"), &source).unwrap();
    std::fs::write(dir.path().join("arrayjit.h"), RUNTIME_HEADER).unwrap();
    let args = cold.args(Path::new("small.c"), Path::new("libsmall.so"));
    eprintln!(
        "raw compiler command: {}",
        cold.command_line(Path::new("small.c"), Path::new("libsmall.so"))
    );
    g.bench_function("raw compiler command", |b| {
        b.iter(|| {
            let status = Command::new(&cold.compiler)
                .args(&args)
                .current_dir(dir.path())
                .stdout(Stdio::null())
                .status()
                .unwrap();
            assert!(status.success());
        })
    });

    let cache = tempfile::tempdir().unwrap();
    let mut cached = cold.clone();
    cached.cache_dir = Some(cache.path().to_path_buf());
    assert!(!compile_and_load(&cached, &source, "small", &[])
        .unwrap()
        .from_cache());
    g.bench_function("cached compile_and_load (hit)", |b| {
        b.iter(|| {
            let lib = compile_and_load(&cached, &source, "small", &[]).unwrap();
            assert!(lib.from_cache());
            lib
        })
    });

    // CcBackend::compile reads its configuration from the environment: point its cache at a
    // fresh directory, warm it, then every call is a hit (the same nodes give the same source).
    let backend_cache = tempfile::tempdir().unwrap();
    std::env::set_var("ARRAYJIT_CACHE_DIR", backend_cache.path());
    std::env::remove_var("ARRAYJIT_CACHE");
    std::env::remove_var("ARRAYJIT_DEBUG_DIR");
    let be = CcBackend::new();
    be.initialize(Config::default());
    let warm = be
        .compile(true, Some("small"), &Bindings::empty(), &asgns)
        .unwrap();
    let entries = files_in(backend_cache.path());
    g.bench_function("CcBackend::compile (cache hit)", |b| {
        b.iter(|| {
            be.compile(true, Some("small"), &Bindings::empty(), &asgns)
                .unwrap()
        })
    });
    g.finish();
    assert_eq!(
        files_in(backend_cache.path()),
        entries,
        "CcBackend::compile missed the cache"
    );
    drop(warm);
}

criterion_group!(benches, compile_latency);
criterion_main!(benches);
