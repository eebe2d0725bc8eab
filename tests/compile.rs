//! Tests of the compile stage: these run the system C compiler.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrayjit::compile::{compile_and_load, CompilerConfig, DebugFile, EntryFn, LoadedLibrary};
use arrayjit::Error;

const DOUBLER: &str = r#"#include "arrayjit.h"
int f(void *const *b, const int64_t *s, const void *m, const void *t) {
  (void)m;
  ((double *)b[0])[0] = s[0] * 2.0;
  return 0;
}
"#;

const SYNTAX_ERROR: &str = r#"#include "arrayjit.h"
int f(void *const *b, const int64_t *s, const void *m, const void *t) {
  this is not C
}
"#;

/// A configuration for the system compiler that does not depend on the process environment
/// (apart from the compiler choice) and keeps its temporary files under `root`.
fn config(root: &Path) -> CompilerConfig {
    let base = CompilerConfig::from_env().expect("a C compiler is needed for these tests");
    CompilerConfig::new(base.compiler)
        .opt_level("1")
        .arch_flags(vec![])
        .extra_flags(vec![])
        .timeout(Duration::from_secs(120))
        .temp_root(Some(root.to_path_buf()))
        .compile_jobs(1)
}

fn call(f: EntryFn, s: i64) -> f64 {
    let mut out = [0.0f64];
    let buffers = [out.as_mut_ptr() as *mut u8];
    let statics = [s];
    // SAFETY: `f` is DOUBLER's `f`, which writes one double into buffers[0] and reads statics[0];
    // its library is kept alive by the caller.
    unsafe {
        f(
            buffers.as_ptr(),
            statics.as_ptr(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    out[0]
}

fn assert_empty(dir: &Path) {
    let left: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}

#[test]
fn loaded_library_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<LoadedLibrary>();
    check::<Arc<LoadedLibrary>>();
}

#[test]
fn compiles_loads_and_runs() {
    let root = tempfile::tempdir().unwrap();
    let lib = compile_and_load(&config(root.path()), DOUBLER, "doubler", &[]).unwrap();
    let f = lib.entry("f").unwrap();
    assert_eq!(call(f, 21), 42.0);
    assert_eq!(call(f, -3), -6.0);
    assert_eq!(lib.name(), "doubler");
    assert_empty(root.path());
}

#[test]
fn missing_symbol_is_a_load_error() {
    let root = tempfile::tempdir().unwrap();
    let lib = compile_and_load(&config(root.path()), DOUBLER, "doubler", &[]).unwrap();
    let e = lib.entry("no_such_routine").unwrap_err();
    assert!(
        matches!(&e, Error::Load { msg, .. } if msg.contains("no_such_routine")),
        "{e}"
    );
}

#[test]
fn user_derived_stem_is_sanitized() {
    let root = tempfile::tempdir().unwrap();
    let lib = compile_and_load(&config(root.path()), DOUBLER, "../evil name;rm -rf", &[]).unwrap();
    assert_eq!(lib.name(), "___evil_name_rm__rf");
    assert_eq!(call(lib.entry("f").unwrap(), 1), 2.0);
    assert_empty(root.path());
}

#[test]
fn syntax_error_is_a_compile_error() {
    let root = tempfile::tempdir().unwrap();
    let cfg = config(root.path());
    let e = compile_and_load(&cfg, SYNTAX_ERROR, "broken", &[]).unwrap_err();
    match &e {
        Error::Compile {
            command,
            output,
            source_path,
        } => {
            assert!(
                command.contains(&*cfg.compiler.to_string_lossy()),
                "{command}"
            );
            assert!(command.contains("broken.c"), "{command}");
            assert!(output.contains("broken.c:3"), "{output}");
            assert!(output.contains("error"), "{output}");
            assert_eq!(source_path, &None);
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    assert_empty(root.path());
}

#[test]
fn missing_compiler_is_reported() {
    let root = tempfile::tempdir().unwrap();
    let cfg = config(root.path()).compiler("/nonexistent/cc");
    let e = compile_and_load(&cfg, DOUBLER, "doubler", &[]).unwrap_err();
    assert!(
        matches!(&e, Error::CompilerNotFound(m) if m.contains("/nonexistent/cc")),
        "{e}"
    );
    assert_empty(root.path());
}

#[test]
fn hanging_compiler_times_out() {
    let root = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let script = bin.path().join("hang-cc");
    // Written by a child process, so that no descriptor open for writing can leak into a
    // process another test forks concurrently (which would make exec fail with ETXTBSY).
    let status = Command::new("sh")
        .arg("-c")
        .arg("printf '#!/bin/sh\\nsleep 100\\n' > \"$1\" && chmod 755 \"$1\"")
        .arg("sh")
        .arg(&script)
        .status()
        .unwrap();
    assert!(status.success());

    let cfg = config(root.path())
        .compiler(script.clone())
        .timeout(Duration::from_secs(1));
    let start = Instant::now();
    let e = compile_and_load(&cfg, DOUBLER, "doubler", &[]).unwrap_err();
    let elapsed = start.elapsed();
    assert!(
        matches!(&e, Error::CompileTimeout { seconds: 1, command } if command.contains("hang-cc")),
        "{e}"
    );
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert!(elapsed >= Duration::from_secs(1), "took {elapsed:?}");
    assert_empty(root.path());
}

#[test]
fn debug_dir_keeps_files() {
    let root = tempfile::tempdir().unwrap();
    let debug = tempfile::tempdir().unwrap();
    let dir = debug.path().join("nested/debug");
    let cfg = config(root.path())
        .debug_dir(Some(dir.clone()))
        .trace_dir(None);
    let extra = [DebugFile {
        name: "assignments.txt".into(),
        contents: "x =: y + 1\n".into(),
    }];

    let lib = compile_and_load(&cfg, DOUBLER, "k", &extra).unwrap();
    assert_eq!(call(lib.entry("f").unwrap(), 5), 10.0);
    assert_eq!(lib.debug_source(), Some(dir.join("k.c").as_path()));
    assert_eq!(fs::read_to_string(dir.join("k.c")).unwrap(), DOUBLER);
    assert!(fs::read_to_string(dir.join("arrayjit.h"))
        .unwrap()
        .contains("ARRAYJIT_RUNTIME_H"));
    let cmd = fs::read_to_string(dir.join("k.cmd")).unwrap();
    assert!(cmd.contains("-std=gnu11") && cmd.contains("k.c"), "{cmd}");
    assert!(dir.join("k.log").exists());
    assert_eq!(
        fs::read_to_string(dir.join("k.assignments.txt")).unwrap(),
        "x =: y + 1\n"
    );

    // The same stem again gets a suffix instead of overwriting.
    let lib2 = compile_and_load(&cfg, SYNTAX_ERROR, "k", &[]);
    match lib2 {
        Err(Error::Compile {
            source_path,
            output,
            ..
        }) => {
            assert_eq!(source_path, Some(dir.join("k_1.c")));
            assert_eq!(fs::read_to_string(dir.join("k_1.c")).unwrap(), SYNTAX_ERROR);
            assert_eq!(fs::read_to_string(dir.join("k_1.log")).unwrap(), output);
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    assert_eq!(fs::read_to_string(dir.join("k.c")).unwrap(), DOUBLER);

    // The kept command reproduces the build from the debug directory.
    let status = Command::new("sh")
        .arg("-c")
        .arg(cmd.trim())
        .current_dir(&dir)
        .status()
        .unwrap();
    assert!(status.success());
    assert!(dir.join("libk.so").exists());
    assert_empty(root.path());
}

#[test]
fn unwritable_debug_dir_is_an_io_error() {
    let root = tempfile::tempdir().unwrap();
    let file = tempfile::NamedTempFile::new().unwrap();
    let dir = file.path().join("debug");
    let cfg = config(root.path())
        .debug_dir(Some(dir.clone()))
        .trace_dir(None);
    let e = compile_and_load(&cfg, DOUBLER, "k", &[]).unwrap_err();
    assert!(
        matches!(&e, Error::Io { what, .. } if what.contains(&*dir.to_string_lossy())),
        "{e}"
    );
    assert_empty(root.path());
}

#[test]
fn reserved_debug_file_name_is_rejected() {
    let root = tempfile::tempdir().unwrap();
    let debug = tempfile::tempdir().unwrap();
    let cfg = config(root.path())
        .debug_dir(Some(debug.path().to_path_buf()))
        .trace_dir(None);
    let extra = [DebugFile {
        name: "log".into(),
        contents: String::new(),
    }];
    let e = compile_and_load(&cfg, DOUBLER, "k", &extra).unwrap_err();
    assert!(matches!(e, Error::DebugFileName { .. }), "{e}");
    assert_empty(debug.path());
}

#[test]
fn same_source_twice_gives_independent_libraries() {
    let root = tempfile::tempdir().unwrap();
    let cfg = config(root.path());
    let a = compile_and_load(&cfg, DOUBLER, "same", &[]).unwrap();
    let b = compile_and_load(&cfg, DOUBLER, "same", &[]).unwrap();
    let fa = a.entry("f").unwrap();
    let fb = b.entry("f").unwrap();
    assert_ne!(fa as usize, fb as usize);
    assert_eq!(call(fa, 4), 8.0);
    assert_eq!(call(fb, 6), 12.0);
    drop(a);
    assert_eq!(call(fb, 7), 14.0);
    assert_empty(root.path());
}

#[test]
fn from_env_finds_a_working_compiler() {
    let cfg = CompilerConfig::from_env().unwrap();
    assert!(!cfg.compiler.as_os_str().is_empty());
    let args = cfg.args(Path::new("/d/x.c"), Path::new("/d/libx.so"));
    assert_eq!(args.first().unwrap(), &format!("-O{}", cfg.opt_level));
    assert!(args.ends_with(&[
        "-std=gnu11".to_string(),
        "-shared".into(),
        "-fPIC".into(),
        "-I/d".into(),
        "-o".into(),
        "/d/libx.so".into(),
        "/d/x.c".into(),
        "-lm".into()
    ]));
}

#[test]
fn default_flags_from_env_compile() {
    // The configuration as users get it (-O3 -march=native unless overridden).
    let root = tempfile::tempdir().unwrap();
    let cfg = CompilerConfig::from_env()
        .unwrap()
        .temp_root(Some(root.path().to_path_buf()))
        .cache_dir(None);
    let lib = compile_and_load(&cfg, DOUBLER, "defaults", &[]).unwrap();
    assert_eq!(call(lib.entry("f").unwrap(), 10), 20.0);
    assert_empty(root.path());
}

#[test]
fn cache_hits_same_source_and_misses_changed_flags() {
    let root = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let mut cfg = config(root.path());
    cfg.cache_dir = Some(cache.path().to_path_buf());
    let a = compile_and_load(&cfg, DOUBLER, "cached", &[]).unwrap();
    assert!(!a.from_cache());
    let b = compile_and_load(&cfg, DOUBLER, "cached", &[]).unwrap();
    assert!(b.from_cache());
    assert_eq!(call(b.entry("f").unwrap(), 4), 8.0);
    let files = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let objects = |d: &Path| -> Vec<String> {
        files(d)
            .into_iter()
            .filter(|f| f.ends_with(".so"))
            .collect()
    };
    assert_eq!(objects(cache.path()).len(), 1, "{:?}", files(cache.path()));
    // Besides the object, the cache holds the memo of the target probe.
    assert_eq!(files(cache.path()).len(), 2, "{:?}", files(cache.path()));
    // A changed flag is a different key.
    cfg.opt_level = "2".into();
    let c = compile_and_load(&cfg, DOUBLER, "cached", &[]).unwrap();
    assert!(!c.from_cache());
    assert_eq!(objects(cache.path()).len(), 2);
    // A changed source too.
    let other = DOUBLER.replace("2.0", "3.0");
    let d = compile_and_load(&cfg, &other, "cached", &[]).unwrap();
    assert!(!d.from_cache());
    assert_eq!(call(d.entry("f").unwrap(), 4), 12.0);
    assert!(files(root.path()).is_empty(), "temporary files left behind");
}

/// The cache is bounded: after a store, the least recently used entries are deleted until
/// the objects fit in `cache_max_bytes`; a hit makes an entry recently used; an object larger
/// than the limit is not stored at all.
#[test]
fn cache_evicts_least_recently_used_entries_beyond_its_limit() {
    let root = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let mut cfg = config(root.path());
    cfg.cache_dir = Some(cache.path().to_path_buf());
    let sources: Vec<String> = (0..3)
        .map(|i| DOUBLER.replace("2.0", &format!("{}.0", i + 2)))
        .collect();
    let size = |p: &Path| fs::metadata(p).unwrap().len();
    // Pauses between steps keep modification times apart on coarse file systems.
    let pause = || std::thread::sleep(Duration::from_millis(20));
    let load = |cfg: &CompilerConfig, i: usize| {
        let lib = compile_and_load(cfg, &sources[i], "s", &[]).unwrap();
        pause();
        lib
    };
    assert!(!load(&cfg, 0).from_cache());
    assert!(!load(&cfg, 1).from_cache());
    // Hits load from the entries' paths.
    let a_path = load(&cfg, 0).path().to_path_buf();
    let b = load(&cfg, 1);
    assert!(b.from_cache());
    let b_path = b.path().to_path_buf();
    // Room for two objects of this size (the three differ only in one constant).
    cfg.cache_max_bytes = size(&a_path) + size(&b_path) + size(&a_path) / 2;
    // A hit on a: now b is the least recently used.
    assert!(load(&cfg, 0).from_cache());
    assert!(!load(&cfg, 2).from_cache());
    let c = load(&cfg, 2);
    assert!(c.from_cache());
    assert!(a_path.exists(), "the recently used entry was evicted");
    assert!(!b_path.exists(), "the least recently used entry was kept");
    // b was only unlinked: the library loaded from it still works.
    assert_eq!(call(b.entry("f").unwrap(), 5), 15.0);
    assert_eq!(call(c.entry("f").unwrap(), 5), 20.0);
    let info = arrayjit::compile::CompileCache::new(cache.path(), cfg.cache_max_bytes)
        .info()
        .unwrap();
    assert_eq!(info.objects.count, 2);
    assert!(info.objects.bytes <= cfg.cache_max_bytes);
    // b again: a miss, stored, and now a (used before c) goes.
    assert!(!load(&cfg, 1).from_cache());
    assert!(!a_path.exists() && b_path.exists() && c.path().exists());
    // A limit below one object: nothing new is stored, nothing is evicted.
    cfg.cache_max_bytes = 100;
    let d = compile_and_load(&cfg, &DOUBLER.replace("2.0", "9.0"), "d", &[]).unwrap();
    assert!(!d.from_cache());
    let again = compile_and_load(&cfg, &DOUBLER.replace("2.0", "9.0"), "d", &[]).unwrap();
    assert!(!again.from_cache());
    assert!(b_path.exists() && c.path().exists());
}

#[test]
fn cache_is_shared_between_processes() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let log = dir.path().join("compiles.log");
    let real = CompilerConfig::from_env().unwrap().compiler;
    let wrapper = dir.path().join("cc-wrapper");
    fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\nexec '{}' \"$@\"\n",
            log.display(),
            real.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
    let program = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/programs/matmul.json");
    let run = |extra_flags: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_arrayjit"))
            .arg("run")
            .arg(&program)
            .env("ARRAYJIT_CC", &wrapper)
            .env("ARRAYJIT_CACHE_DIR", &cache)
            .env("ARRAYJIT_CFLAGS", extra_flags)
            .env_remove("ARRAYJIT_CACHE")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    // Every run of the compiler, as (probe?, arguments); each process's runs with its probe
    // first (the probe and the compile run at the same time when the target is guessed).
    let runs = || -> Vec<(bool, String)> {
        let mut r: Vec<(bool, String)> = fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(|l| (l.contains("-E -dM"), l.to_string()))
            .collect();
        for pair in r.chunks_mut(2) {
            pair.sort_by_key(|(probe, _)| !probe);
        }
        r
    };
    let first = run("");
    let r = runs();
    assert_eq!(r.len(), 2, "one target probe and one compile: {r:?}");
    assert!(r[0].0 && r[0].1.contains("-march=native"), "{r:?}");
    assert!(!r[1].0, "{r:?}");
    let second = run("");
    assert_eq!(
        runs().len(),
        2,
        "the second process must hit the cache without running the compiler (not even the \
         target probe, which is remembered in the cache directory)"
    );
    assert_eq!(first, second);
    run("-fno-math-errno");
    let r = runs();
    assert_eq!(
        r.len(),
        4,
        "a changed flag must miss the cache (and probe again): {r:?}"
    );
    assert!(r[2].0 && r[2].1.contains("-fno-math-errno"), "{r:?}");
}

/// GCC 12.2 with -O3 -march=native on an AVX-512 machine turns this generated routine (found
/// by the differential tests, seed 10203) into assembly with the mnemonic
/// `vinsert<i128vldq>`, which its assembler rejects. The compile stage retries without
/// AVX-512, so the routine still compiles and loads (elsewhere it compiles the first time).
#[test]
fn compiler_emitting_invalid_assembly_is_retried_without_avx512() {
    let root = tempfile::tempdir().unwrap();
    let base = CompilerConfig::from_env().unwrap();
    let cfg = base
        .cache_dir(None)
        .temp_root(Some(root.path().to_path_buf()));
    let source = include_str!("data/gcc12_invalid_asm.c");
    let lib = compile_and_load(&cfg, source, "gcc12_invalid_asm", &[]).unwrap();
    lib.entry("case_routine_entry").unwrap();
    assert!(
        fs::read_dir(root.path()).unwrap().next().is_none(),
        "temporary files left behind"
    );
}

/// Clang 14 at -O3 for AVX2 targets (`-march=x86-64-v3`, `haswell`, `znver3`) crashes on this
/// generated routine ("fatal error: error in backend: Cannot emit physreg copy instruction",
/// found by scripts/conformance.py, seed 12, case 157): its SLP vectorizer is at fault. The
/// compile stage retries a compiler that crashed in its backend once with
/// `-fno-slp-vectorize`, so the routine compiles and loads (other compilers compile it the
/// first time).
#[cfg(target_arch = "x86_64")]
#[test]
fn compiler_crashing_in_its_backend_is_retried_without_slp_vectorization() {
    let source = include_str!("data/clang14_backend_crash.c");
    for cc in ["clang", "gcc"] {
        if Command::new(cc).arg("--version").output().is_err() {
            continue; // CI installs both; a machine with one checks that one
        }
        let root = tempfile::tempdir().unwrap();
        let cfg = config(root.path())
            .compiler(PathBuf::from(cc))
            .arch_flags(vec!["-march=x86-64-v3".into()])
            .opt_level("3");
        let lib = compile_and_load(&cfg, source, "backend_crash", &[])
            .unwrap_or_else(|e| panic!("{cc}: {e}"));
        lib.entry("main_routine_entry").unwrap();
        assert_empty(root.path());
    }
}

/// The same source compiled for two targets from one cache directory: `-march=x86-64-v2`
/// and the default `-march=native`. The cache key holds what the flags resolve to, so the
/// two get separate entries and each loads and computes right.
#[cfg(target_arch = "x86_64")]
#[test]
fn targets_are_resolved_into_the_cache_key() {
    use arrayjit::compile::{Arch, Target};
    let root = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let native = CompilerConfig::from_env()
        .unwrap()
        .temp_root(Some(root.path().to_path_buf()))
        .cache_dir(Some(cache.path().to_path_buf()))
        .arch_flags(vec!["-march=native".into()]);
    let v2 = native.clone().arch_flags(vec!["-march=x86-64-v2".into()]);
    let t_native = Target::resolve(&native).unwrap();
    let t_v2 = Target::resolve(&v2).unwrap();
    assert_ne!(t_native.fingerprint, t_v2.fingerprint);
    assert_eq!(t_v2.arch, Arch::X86_64);
    assert!(t_v2.features.sse2 && t_v2.features.sse4_1, "{t_v2:?}");
    assert!(
        !t_v2.features.avx && !t_v2.features.avx2 && !t_v2.features.avx512f,
        "{t_v2:?}"
    );
    assert_eq!((t_v2.vector_bytes, t_v2.vector_registers), (16, 16));
    // -march=native means this CPU: compare with what the kernel says it has.
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap();
    let cpu_flags: Vec<&str> = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap()
        .split_whitespace()
        .collect();
    let has = |f: &str| cpu_flags.contains(&f);
    assert_eq!(t_native.features.avx2, has("avx2"), "{t_native:?}");
    assert_eq!(t_native.features.avx512f, has("avx512f"), "{t_native:?}");
    assert_eq!(
        t_native.features.avx512fp16,
        has("avx512_fp16"),
        "{t_native:?}"
    );
    let widest = if has("avx512f") {
        64
    } else if has("avx") {
        32
    } else {
        16
    };
    assert_eq!(t_native.vector_bytes, widest);

    // Two entries in one cache directory, each loading and computing right.
    let a = compile_and_load(&native, DOUBLER, "t", &[]).unwrap();
    let b = compile_and_load(&v2, DOUBLER, "t", &[]).unwrap();
    assert!(!a.from_cache() && !b.from_cache());
    assert_eq!(call(a.entry("f").unwrap(), 21), 42.0);
    assert_eq!(call(b.entry("f").unwrap(), 5), 10.0);
    let a2 = compile_and_load(&native, DOUBLER, "t", &[]).unwrap();
    let b2 = compile_and_load(&v2, DOUBLER, "t", &[]).unwrap();
    assert!(a2.from_cache() && b2.from_cache());
    assert_ne!(a2.path(), b2.path());
    assert_eq!(call(a2.entry("f").unwrap(), 1), 2.0);
    assert_eq!(call(b2.entry("f").unwrap(), 3), 6.0);
    let objects: Vec<_> = fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".so"))
        .collect();
    assert_eq!(objects.len(), 2, "{objects:?}");
    assert_empty(root.path());
}

/// Targets we cannot run are checked through the compiler: `-march=sapphirerapids` has
/// AVX-512 with half-precision arithmetic, for GCC and Clang alike (where installed).
#[cfg(target_arch = "x86_64")]
#[test]
fn target_probe_reports_what_the_flags_mean() {
    use arrayjit::compile::{CompilerFamily, Target};
    let root = tempfile::tempdir().unwrap();
    let mut seen = 0;
    for (cc, family) in [
        ("gcc", CompilerFamily::Gcc),
        ("clang", CompilerFamily::Clang),
    ] {
        let Some(path) = which(cc) else { continue };
        seen += 1;
        let cfg = config(root.path())
            .compiler(path.clone())
            .arch_flags(vec!["-march=sapphirerapids".into()]);
        let t = Target::resolve(&cfg).unwrap();
        let f = t.features;
        assert!(
            f.avx512fp16 && f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl,
            "{cc}: {t:?}"
        );
        assert!(f.avx2 && f.fma && f.f16c && f.sse4_1, "{cc}: {t:?}");
        assert_eq!((t.vector_bytes, t.f32_lanes()), (64, 16), "{cc}");
        assert_eq!(t.compiler, family, "{cc}");
        // The version is the compiler's own: `cc -dumpversion` starts with the major version.
        let out = Command::new(&path).arg("-dumpversion").output().unwrap();
        let major: u32 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .split('.')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(t.compiler_version.0, major, "{cc}: {t:?}");
        assert_eq!(t.macro_value("__AVX512FP16__"), Some("1"));
        // Haswell: AVX2 without AVX-512.
        let hsw = Target::resolve(&cfg.clone().arch_flags(vec!["-march=haswell".into()])).unwrap();
        assert!(hsw.features.avx2 && !hsw.features.avx512f, "{cc}: {hsw:?}");
        assert_eq!(hsw.vector_bytes, 32);
        assert_ne!(hsw.fingerprint, t.fingerprint);
    }
    assert!(seen > 0, "neither gcc nor clang is installed");
    // Host cache sizes are sane whatever the machine.
    let t = Target::resolve(&CompilerConfig::from_env().unwrap()).unwrap();
    assert!(
        t.caches.l1d >= 4096 && t.caches.l2 >= t.caches.l1d,
        "{:?}",
        t.caches
    );

    // An unknown architecture is a probe error carrying the compiler's complaint.
    let cfg = config(root.path()).arch_flags(vec!["-march=no-such-cpu".into()]);
    match Target::resolve(&cfg) {
        Err(Error::TargetProbe { command, output }) => {
            assert!(command.contains("-march=no-such-cpu -E -dM"), "{command}");
            assert!(output.contains("no-such-cpu"), "{output}");
        }
        other => panic!("expected a probe error, got {other:?}"),
    }
    assert_empty(root.path());
}

/// `name` looked up in `PATH`.
fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

const TRIPLER: &str = r#"#include "arrayjit.h"
int f(void *const *b, const int64_t *s, const void *m, const void *t) {
  (void)m;
  ((double *)b[0])[0] = s[0] * 3.0;
  return 0;
}
"#;

/// A valid shared object from another program copied over a cache entry, a garbage file and
/// a truncated object are all detected (the key compiled into the object does not match),
/// deleted and compiled again.
#[test]
fn invalid_cache_entries_are_recompiled() {
    let root = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let cfg = config(root.path()).cache_dir(Some(cache.path().to_path_buf()));
    let (doubler_entry, tripler_entry) = {
        let a = compile_and_load(&cfg, DOUBLER, "d", &[]).unwrap();
        let b = compile_and_load(&cfg, TRIPLER, "t", &[]).unwrap();
        assert_eq!(call(a.entry("f").unwrap(), 2), 4.0);
        assert_eq!(call(b.entry("f").unwrap(), 2), 6.0);
        let a = compile_and_load(&cfg, DOUBLER, "d", &[]).unwrap();
        let b = compile_and_load(&cfg, TRIPLER, "t", &[]).unwrap();
        assert!(a.from_cache() && b.from_cache());
        (a.path().to_path_buf(), b.path().to_path_buf())
    }; // all libraries unloaded here
    let good = fs::read(&doubler_entry).unwrap();
    // Replaces the entry by a new file (a rename, as a copy from elsewhere would).
    let replace = |contents: &[u8]| {
        let tmp = cache.path().join("replacement");
        fs::write(&tmp, contents).unwrap();
        fs::rename(&tmp, &doubler_entry).unwrap();
    };
    let tripler = fs::read(&tripler_entry).unwrap();
    // A shared object built by someone else (not through the cache) that computes otherwise.
    let foreign_dir = tempfile::tempdir().unwrap();
    fs::write(
        foreign_dir.path().join("arrayjit.h"),
        "#include <stdint.h>\n",
    )
    .unwrap();
    fs::write(foreign_dir.path().join("f.c"), TRIPLER).unwrap();
    let status = Command::new(&cfg.compiler)
        .args(["-shared", "-fPIC", "-I.", "-o", "libf.so", "f.c"])
        .current_dir(foreign_dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let foreign = fs::read(foreign_dir.path().join("libf.so")).unwrap();
    for (what, contents) in [
        ("another program's shared object", foreign),
        ("another entry", tripler.clone()),
        ("garbage", b"this is not an ELF file".to_vec()),
        ("a truncated object", good[..good.len() / 2].to_vec()),
        ("an empty file", Vec::new()),
    ] {
        replace(&contents);
        let lib = compile_and_load(&cfg, DOUBLER, "d", &[]).unwrap();
        assert!(!lib.from_cache(), "{what} was used");
        assert_eq!(call(lib.entry("f").unwrap(), 21), 42.0, "{what}");
        drop(lib);
        // The entry was written again and is used from now on.
        let lib = compile_and_load(&cfg, DOUBLER, "d", &[]).unwrap();
        assert!(lib.from_cache(), "{what}: entry not rewritten");
        assert_eq!(call(lib.entry("f").unwrap(), 5), 10.0, "{what}");
    }
    // The other entry was never touched.
    assert_eq!(fs::read(&tripler_entry).unwrap(), tripler);
    // The debug log says what happened to an invalid entry.
    let debug = tempfile::tempdir().unwrap();
    replace(&tripler);
    let with_debug = cfg
        .clone()
        .debug_dir(Some(debug.path().to_path_buf()))
        .trace_dir(None);
    let lib = compile_and_load(&with_debug, DOUBLER, "d", &[]).unwrap();
    assert_eq!(call(lib.entry("f").unwrap(), 1), 2.0);
    let log = fs::read_to_string(debug.path().join("d.log")).unwrap();
    assert!(
        log.starts_with(&format!(
            "[cache entry {} holds the object stored under key {}: deleted, compiling again]",
            doubler_entry.display(),
            tripler_entry.file_stem().unwrap().to_string_lossy()
        )),
        "{log}"
    );
    assert_empty(root.path());
}

/// Code compiled with `-fsanitize=address` cannot be loaded into a process without the
/// AddressSanitizer runtime (GCC's runtime would end the process): the compile stage says so
/// with an error naming what to preload, before compiling, and the process goes on.
#[test]
fn sanitizer_without_its_runtime_is_an_error_not_an_exit() {
    let root = tempfile::tempdir().unwrap();
    let mut cfg = config(root.path());
    cfg.extra_flags = vec!["-fsanitize=address".into(), "-g".into()];
    let e = compile_and_load(&cfg, DOUBLER, "asan", &[]).unwrap_err();
    assert!(matches!(e, Error::Sanitizer { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("AddressSanitizer (-fsanitize=address)") && msg.contains("LD_PRELOAD="),
        "{msg}"
    );
    // Turned off again by a later flag: compiles and runs.
    cfg.extra_flags.push("-fno-sanitize=address".into());
    let lib = compile_and_load(&cfg, DOUBLER, "asan", &[]).unwrap();
    assert_eq!(call(lib.entry("f").unwrap(), 3), 6.0);
    assert!(fs::read_dir(root.path()).unwrap().next().is_none());
}

/// Clang 14 crashed ("fatal error: error in backend: Cannot select: ... X86ISD::VZEXT_MOVL")
/// on the half conversions of this generated C (differential seed 913001487, `-march=native`
/// on a Sapphire Rapids CPU) whenever AVX512-FP16 was enabled. Generated code never needs
/// half-precision instructions, so every compile for a target that has them adds
/// `-mno-avx512fp16`: the same C now compiles for `-march=sapphirerapids` with gcc and clang
/// on any x86-64 machine (it is only loaded, not run: this CPU may lack the ISA).
#[cfg(target_arch = "x86_64")]
#[test]
fn targets_with_avx512fp16_compile_without_it() {
    use arrayjit::compile::{Target, NO_FP16_FLAG};
    let source = include_str!("data/clang14_fp16_crash.c");
    for cc in ["gcc", "clang"] {
        if Command::new(cc).arg("--version").output().is_err() {
            continue; // CI installs both; a machine with one checks that one
        }
        let root = tempfile::tempdir().unwrap();
        let debug = tempfile::tempdir().unwrap();
        let cfg = config(root.path())
            .compiler(PathBuf::from(cc))
            .arch_flags(vec!["-march=sapphirerapids".into()])
            .opt_level("3")
            .debug_dir(Some(debug.path().to_path_buf()));
        let t = Target::resolve(&cfg).unwrap();
        assert!(
            t.features.avx512fp16,
            "{cc}: -march=sapphirerapids has AVX512-FP16"
        );
        let lib = compile_and_load(&cfg, source, "fp16_crash", &[])
            .unwrap_or_else(|e| panic!("{cc}: {e}"));
        lib.entry("case_routine_entry").unwrap();
        let cmd = fs::read_to_string(debug.path().join("fp16_crash.cmd")).unwrap();
        assert!(cmd.contains(NO_FP16_FLAG), "{cc}: {cmd}");
        // What the compiler makes of the final flags: no FP16, and a fingerprint of its own.
        let with_flag = cfg.clone().extra_flags(vec![NO_FP16_FLAG.into()]);
        let t2 = Target::resolve(&with_flag).unwrap();
        assert!(
            !t2.features.avx512fp16 && t2.features.avx512f,
            "{cc}: {t2:?}"
        );
        assert_ne!(t.fingerprint, t2.fingerprint);
        assert_eq!(t2.macro_value("__AVX512FP16__"), None);
    }
}
