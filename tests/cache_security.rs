//! The compile cache, the debug directory and the temporary directories trust nothing another
//! user could have written (issue 19, items 2, 8, 9 and 12): these tests plant what such a
//! user could plant and check that it is neither run, loaded, followed nor waited on, and
//! that the compile still gives the right values.
//!
//! They need root (to give files to `nobody`, uid 65534) for the tests about other users'
//! files; those tests are skipped (with a message) when run as another user. Tests that could
//! hang or that change process-wide state (the umask) run a compile in a child process: this
//! test binary run again with `child_process` as the only test, told what to do by
//! environment variables, and killed if it takes more than [`CHILD_TIMEOUT`].

use std::fmt;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use arrayjit::compile::{compile_and_load, CompilerConfig, EntryFn, LoadedLibrary};

/// `f` writes `2 * s[0]` into `b[0][0]`: for 21, 42.
const DOUBLER: &str = r#"#include "arrayjit.h"
int f(void *const *b, const int64_t *s, const void *m, const void *t) {
  (void)m;
  ((double *)b[0])[0] = s[0] * 2.0;
  return 0;
}
"#;

/// How long a child compile may take before it counts as hung (a compile takes a second or
/// two; a blocked one never ends).
const CHILD_TIMEOUT: Duration = Duration::from_secs(90);

/// The user other users' files are given to.
const NOBODY: u32 = 65534;

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Whether the tests about other users' files can run (they need root).
fn root_or_skip(test: &str) -> bool {
    if euid() == 0 {
        return true;
    }
    eprintln!("{test}: skipped (needs root to give files to uid {NOBODY})");
    false
}

fn call(lib: &LoadedLibrary) -> f64 {
    let f: EntryFn = lib.entry("f").unwrap();
    let mut out = [0.0f64];
    let buffers = [out.as_mut_ptr() as *mut u8];
    let statics = [21i64];
    // SAFETY: `f` is DOUBLER's `f`, which writes one double into buffers[0] and reads
    // statics[0]; `lib` is alive.
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

/// The system compiler.
fn system_cc() -> PathBuf {
    CompilerConfig::from_env()
        .expect("a C compiler is needed for these tests")
        .compiler
}

/// A configuration for the system compiler, independent of the environment, keeping its
/// temporary files under `root` and its cache in `cache`.
fn config(root: &Path, cache: Option<&Path>) -> CompilerConfig {
    CompilerConfig::new(system_cc())
        .opt_level("1")
        .arch_flags(vec![])
        .extra_flags(vec![])
        .timeout(Duration::from_secs(120))
        .temp_root(Some(root.to_path_buf()))
        .cache_dir(cache.map(Path::to_path_buf))
        .compile_jobs(1)
}

/// A `tracing` subscriber that keeps the messages of warnings and errors.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl Warnings {
    fn all(&self) -> String {
        self.0.lock().unwrap().join("\n")
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        *m.level() <= tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        let mut m = Message(String::new());
        e.record(&mut m);
        self.0.lock().unwrap().push(m.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Compiles DOUBLER in this thread with `cfg`; the library and the warnings logged.
fn compile_watched(cfg: &CompilerConfig) -> (Arc<LoadedLibrary>, String) {
    let warnings = Warnings::default();
    let lib = tracing::subscriber::with_default(warnings.clone(), || {
        compile_and_load(cfg, DOUBLER, "k", &[]).unwrap()
    });
    (lib, warnings.all())
}

/// The cache entries (`<key>.so`) in `dir`.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().path())
                .filter(|p| {
                    p.extension().is_some_and(|e| e == "so")
                        && p.file_stem().is_some_and(|s| s.len() == 64)
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
}

fn write_script(path: &Path, body: &str) {
    fs::write(path, format!("#!/bin/sh\n{body}")).unwrap();
    set_mode(path, 0o755);
}

// ---------------------------------------------------------------------------------------------
// The child process.

/// What the child process does, by environment variable:
/// - `CACHE_SECURITY_CHILD=compile`: compiles DOUBLER with `CompilerConfig::from_env()` (so the
///   `ARRAYJIT_*` variables the parent sets apply) and prints `value <f(21)>` and
///   `from_cache <bool>`; warnings go to the standard error.
/// - `CACHE_SECURITY_UMASK=<octal>`: sets the umask first.
#[test]
fn child_process() {
    let Ok(action) = std::env::var("CACHE_SECURITY_CHILD") else {
        return; // an ordinary test run: nothing to do
    };
    assert_eq!(action, "compile");
    if let Ok(m) = std::env::var("CACHE_SECURITY_UMASK") {
        let m = u32::from_str_radix(&m, 8).unwrap();
        // SAFETY: umask(2) has no preconditions; this process is the child, run for this.
        unsafe { libc::umask(m as libc::mode_t) };
    }
    let warnings = Warnings::default();
    tracing::subscriber::set_global_default(warnings.clone()).unwrap();
    let cfg = CompilerConfig::from_env().unwrap();
    let lib = compile_and_load(&cfg, DOUBLER, "k", &[]);
    eprintln!("{}", warnings.all());
    let lib = lib.unwrap();
    println!("\nvalue {}", call(&lib));
    println!("from_cache {}", lib.from_cache());
}

/// The child's result.
struct Child {
    stdout: String,
    stderr: String,
}

impl Child {
    fn value(&self) -> f64 {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix("value "))
            .unwrap_or_else(|| panic!("no value printed: {}\n{}", self.stdout, self.stderr))
            .parse()
            .unwrap()
    }
    fn hit_the_cache(&self) -> bool {
        self.stdout.contains("from_cache true")
    }
}

/// The child command: this binary, running only `child_process`, with the compile-related
/// variables of the environment removed and `env` set.
fn child_command(env: &[(&str, &Path)]) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "child_process",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ]);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("ARRAYJIT_") || k == "CC" || k == "XDG_CACHE_HOME" {
            cmd.env_remove(k);
        }
    }
    cmd.env("CACHE_SECURITY_CHILD", "compile")
        .env("ARRAYJIT_OPT_LEVEL", "1")
        .env("ARRAYJIT_ARCH_FLAGS", "");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs the child to its end, which must come within [`CHILD_TIMEOUT`] (else it is killed
/// and the test fails: it hung), and successfully.
fn run_child(env: &[(&str, &Path)]) -> Child {
    let mut child = child_command(env).spawn().unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > CHILD_TIMEOUT {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "the compile hung (killed after {CHILD_TIMEOUT:?}); stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().unwrap();
    let c = Child {
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    };
    assert!(
        status.success(),
        "child failed:\n{}\n{}",
        c.stdout,
        c.stderr
    );
    c
}

// ---------------------------------------------------------------------------------------------
// (2) The cache directory and its entries.

#[test]
fn cache_and_debug_dirs_are_created_0700_under_umask_000() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("a/b/cache");
    let debug = dir.path().join("d/debug");
    let c = run_child(&[
        ("CACHE_SECURITY_UMASK", Path::new("0")),
        ("ARRAYJIT_CACHE_DIR", &cache),
        ("ARRAYJIT_DEBUG_DIR", &debug),
        ("TMPDIR", dir.path()),
    ]);
    assert_eq!(c.value(), 42.0);
    for d in [
        dir.path().join("a"),
        dir.path().join("a/b"),
        cache.clone(),
        dir.path().join("d"),
        debug.clone(),
    ] {
        assert_eq!(mode(&d), 0o700, "{}", d.display());
    }
    // The entry (and every memo) is private too, and the cache was used.
    let e = entries(&cache);
    assert_eq!(e.len(), 1, "{e:?}\n{}", c.stderr);
    for f in fs::read_dir(&cache).unwrap() {
        let p = f.unwrap().path();
        assert_eq!(mode(&p), 0o600, "{}", p.display());
    }
    assert!(!c.stderr.contains("not used"), "{}", c.stderr);
}

#[test]
fn a_cache_dir_others_can_write_or_own_is_not_used() {
    let root = tempfile::tempdir().unwrap();
    let check = |cache: &Path, expect: &str| {
        let (lib, warnings) = compile_watched(&config(root.path(), Some(cache)));
        assert_eq!(call(&lib), 42.0);
        assert!(!lib.from_cache());
        assert!(
            warnings.contains("compile cache not used")
                && warnings.contains(&cache.display().to_string())
                && warnings.contains(expect),
            "expected a warning naming {} and {expect:?}: {warnings:?}",
            cache.display()
        );
        assert!(entries(cache).is_empty(), "the cache was used");
    };
    // Writable by everyone (created by an old arrayjit under umask 000).
    let shared = root.path().join("shared");
    fs::create_dir(&shared).unwrap();
    set_mode(&shared, 0o777);
    check(&shared, "its mode is 0777");
    assert_eq!(mode(&shared), 0o777, "the mode is reported, not changed");
    // Writable by the group.
    let group = root.path().join("group");
    fs::create_dir(&group).unwrap();
    set_mode(&group, 0o770);
    check(&group, "its mode is 0770");
    // Below a directory anyone can write to, without the sticky bit.
    let open = root.path().join("open");
    fs::create_dir(&open).unwrap();
    set_mode(&open, 0o777);
    check(&open.join("cache"), "above it has mode 0777");
    // With the sticky bit (like /tmp) it is fine.
    let sticky = root.path().join("sticky");
    fs::create_dir(&sticky).unwrap();
    set_mode(&sticky, 0o1777);
    let cfg = config(root.path(), Some(&sticky.join("cache")));
    let (lib, warnings) = compile_watched(&cfg);
    assert_eq!(call(&lib), 42.0);
    assert!(warnings.is_empty(), "{warnings}");
    assert_eq!(entries(&sticky.join("cache")).len(), 1);
    // Owned by another user.
    if root_or_skip("a_cache_dir_others_can_write_or_own_is_not_used (owner)") {
        let theirs = root.path().join("theirs");
        fs::create_dir(&theirs).unwrap();
        set_mode(&theirs, 0o700);
        chown(&theirs, NOBODY);
        check(&theirs, &format!("owned by uid {NOBODY}"));
    }
}

/// A library whose constructor creates `marker`: what another user would put into the cache.
fn evil_library(dir: &Path, marker: &Path) -> Vec<u8> {
    let src = dir.join("evil.c");
    fs::write(
        &src,
        format!(
            "#include <fcntl.h>\n#include <unistd.h>\n\
             __attribute__((constructor)) static void evil(void) {{\n\
               int fd = open(\"{}\", O_CREAT | O_WRONLY, 0644);\n\
               if (fd >= 0) close(fd);\n}}\n",
            marker.display()
        ),
    )
    .unwrap();
    let so = dir.join("libevil.so");
    let ok = Command::new(system_cc())
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .status()
        .unwrap()
        .success();
    assert!(ok);
    fs::read(so).unwrap()
}

/// `object` with the trailer of the entry `entry` (its key, the BLAKE3 checksum, the magic),
/// as arrayjit stores it: a valid-looking entry.
fn with_trailer(entry: &Path, object: &[u8]) -> Vec<u8> {
    let key = entry.file_stem().unwrap().to_str().unwrap();
    let mut bytes = object.to_vec();
    bytes.extend_from_slice(key.as_bytes());
    bytes.extend_from_slice(blake3::hash(object).as_bytes());
    bytes.extend_from_slice(b"AJCACHE2");
    bytes
}

#[test]
fn an_entry_another_user_owns_or_could_write_is_not_loaded() {
    let root = tempfile::tempdir().unwrap();
    let cache = root.path().join("cache");
    let cfg = config(root.path(), Some(&cache));
    let (lib, _) = compile_watched(&cfg);
    assert_eq!(call(&lib), 42.0);
    let entry = entries(&cache).pop().expect("an entry was stored");
    let (lib, _) = compile_watched(&cfg);
    assert!(lib.from_cache(), "the setup must hit the cache");

    let marker = root.path().join("constructor-ran");
    let evil = with_trailer(&entry, &evil_library(root.path(), &marker));
    let plant = |uid: u32, mode: u32| {
        let _ = fs::remove_file(&entry);
        fs::write(&entry, &evil).unwrap();
        set_mode(&entry, mode);
        chown(&entry, uid);
    };
    let refused = |expect: &str| {
        let (lib, warnings) = compile_watched(&cfg);
        assert_eq!(call(&lib), 42.0);
        assert!(!lib.from_cache());
        assert!(
            !marker.exists(),
            "the planted library was loaded (its constructor ran)"
        );
        assert!(
            warnings.contains(&entry.display().to_string()) && warnings.contains(expect),
            "expected a warning naming the entry and {expect:?}: {warnings}"
        );
        // Replaced by a fresh entry of this user's.
        let meta = fs::symlink_metadata(&entry).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (euid(), 0o600));
        let (lib, _) = compile_watched(&cfg);
        assert!(lib.from_cache(), "the fresh entry is used");
    };
    // Writable by others, or by the group.
    plant(euid(), 0o666);
    refused("its mode is 0666");
    plant(euid(), 0o620);
    refused("its mode is 0620");
    if root_or_skip("an_entry_another_user_owns_or_could_write_is_not_loaded (owner)") {
        plant(NOBODY, 0o600);
        refused(&format!("owned by uid {NOBODY}"));
        plant(NOBODY, 0o644);
        refused(&format!("owned by uid {NOBODY}"));
    }
    // The control: the same file as this user's own private entry passes the owner and mode
    // checks and is loaded (its constructor runs; the key check after loading then refuses
    // it). So the refusals above were the owner and mode checks.
    plant(euid(), 0o600);
    let (lib, _) = compile_watched(&cfg);
    assert_eq!(call(&lib), 42.0);
    assert!(marker.exists(), "the control did not load the planted file");
}

#[test]
fn a_compiler_memo_another_user_owns_or_could_write_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let env = |extra: &[(&'static str, &Path)]| -> Vec<(&'static str, PathBuf)> {
        let mut v: Vec<(&str, PathBuf)> = vec![
            ("ARRAYJIT_CACHE_DIR", cache.clone()),
            ("TMPDIR", dir.path().to_path_buf()),
        ];
        v.extend(extra.iter().map(|(k, p)| (*k, p.to_path_buf())));
        v
    };
    let run = |extra: &[(&'static str, &Path)]| {
        let e = env(extra);
        let e: Vec<(&str, &Path)> = e.iter().map(|(k, v)| (*k, v.as_path())).collect();
        run_child(&e)
    };
    // No ARRAYJIT_CC or CC: the detection remembers its answer in the cache directory.
    assert_eq!(run(&[]).value(), 42.0);
    let memo = fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("detected-cc-"))
        .expect("no detected-cc-* memo was written");
    let text = fs::read_to_string(&memo).unwrap();
    let head: Vec<&str> = text.lines().take(2).collect();
    assert_eq!(head.len(), 2, "{text}");

    // Another user's "compiler": it leaves a marker, then compiles for real.
    let marker = dir.path().join("fake-compiler-ran");
    let fake = dir.path().join("fake-cc");
    write_script(
        &fake,
        &format!(
            "touch '{}'\nexec '{}' \"$@\"\n",
            marker.display(),
            system_cc().display()
        ),
    );
    let meta = fs::metadata(&fake).unwrap();
    let forged = format!(
        "{}\n{}\npath {}\nidentity {} {} {} {}\n",
        head[0],
        head[1],
        fake.display(),
        fs::canonicalize(&fake).unwrap().display(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec()
    );
    let plant = |uid: u32, mode: u32| {
        let _ = fs::remove_file(&memo);
        fs::write(&memo, &forged).unwrap();
        set_mode(&memo, mode);
        chown(&memo, uid);
    };
    let refused = |expect: &str| {
        let c = run(&[]);
        assert_eq!(c.value(), 42.0);
        assert!(!marker.exists(), "the compiler named by the memo was run");
        assert!(
            c.stderr.contains(&memo.display().to_string()) && c.stderr.contains(expect),
            "expected a warning naming the memo and {expect:?}: {}",
            c.stderr
        );
    };
    plant(euid(), 0o666);
    refused("its mode is 0666");
    if root_or_skip("a_compiler_memo_another_user_owns_or_could_write_is_not_trusted (owner)") {
        plant(NOBODY, 0o644);
        refused(&format!("owned by uid {NOBODY}"));
    }
    // A symbolic link to a forged memo elsewhere is not followed.
    let elsewhere = dir.path().join("forged-memo");
    fs::write(&elsewhere, &forged).unwrap();
    set_mode(&elsewhere, 0o600);
    let _ = fs::remove_file(&memo);
    std::os::unix::fs::symlink(&elsewhere, &memo).unwrap();
    refused("symbolic link");
    // The control: the same memo as this user's private file is trusted, and its compiler
    // runs. So the refusals above were the owner, mode and link checks.
    plant(euid(), 0o600);
    assert_eq!(run(&[]).value(), 42.0);
    assert!(marker.exists(), "the control did not use the memo");
}

#[test]
fn a_target_memo_another_user_owns_or_could_write_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    // A compiler that logs its runs (the target probe is the one with `-E -dM`).
    let log = dir.path().join("runs.log");
    let cc = dir.path().join("logging-cc");
    write_script(
        &cc,
        &format!(
            "echo \"$*\" >> '{}'\nexec '{}' \"$@\"\n",
            log.display(),
            system_cc().display()
        ),
    );
    let env: [(&str, &Path); 3] = [
        ("ARRAYJIT_CC", &cc),
        ("ARRAYJIT_CACHE_DIR", &cache),
        ("TMPDIR", dir.path()),
    ];
    let probes = || {
        fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("-E -dM"))
            .count()
    };
    assert_eq!(run_child(&env).value(), 42.0);
    assert_eq!(probes(), 1);
    let memo = fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("target-"))
        .expect("no target-* memo was written");
    // Remembered: a new process neither probes nor compiles.
    assert!(run_child(&env).hit_the_cache());
    assert_eq!(probes(), 1);
    // Writable by others: not read (the probe runs again), and rewritten as a private file.
    set_mode(&memo, 0o666);
    let c = run_child(&env);
    assert_eq!(c.value(), 42.0);
    assert_eq!(probes(), 2, "the memo was trusted");
    assert!(
        c.stderr.contains(&memo.display().to_string()) && c.stderr.contains("its mode is 0666"),
        "{}",
        c.stderr
    );
    assert_eq!(mode(&memo), 0o600);
    if root_or_skip("a_target_memo_another_user_owns_or_could_write_is_not_trusted (owner)") {
        chown(&memo, NOBODY);
        let c = run_child(&env);
        assert_eq!(c.value(), 42.0);
        assert_eq!(probes(), 3, "the memo was trusted");
        assert!(
            c.stderr.contains(&format!("owned by uid {NOBODY}")),
            "{}",
            c.stderr
        );
        assert_eq!(fs::metadata(&memo).unwrap().uid(), euid());
    }
}

// ---------------------------------------------------------------------------------------------
// (8) Special files never block and are never read.

#[test]
fn a_fifo_or_a_link_to_dev_zero_at_an_entry_neither_blocks_nor_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let env: [(&str, &Path); 2] = [("ARRAYJIT_CACHE_DIR", &cache), ("TMPDIR", dir.path())];
    assert_eq!(run_child(&env).value(), 42.0);
    let entry = entries(&cache).pop().expect("an entry was stored");
    assert!(run_child(&env).hit_the_cache());

    // A FIFO nobody writes to: reading it would block forever.
    fs::remove_file(&entry).unwrap();
    mkfifo(&entry);
    let start = Instant::now();
    let c = run_child(&env);
    assert_eq!(c.value(), 42.0);
    assert!(!c.hit_the_cache());
    assert!(c.stderr.contains("a FIFO"), "{}", c.stderr);
    assert!(fs::symlink_metadata(&entry).unwrap().is_file());
    assert!(start.elapsed() < Duration::from_secs(60));

    // A link to /dev/zero: reading it would never end (or fill the memory).
    fs::remove_file(&entry).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &entry).unwrap();
    let c = run_child(&env);
    assert_eq!(c.value(), 42.0);
    assert!(!c.hit_the_cache());
    assert!(c.stderr.contains("symbolic link"), "{}", c.stderr);
    assert!(fs::symlink_metadata(&entry).unwrap().is_file());
    assert!(run_child(&env).hit_the_cache());
}

#[test]
fn a_fifo_at_the_debug_dirs_header_does_not_block() {
    let dir = tempfile::tempdir().unwrap();
    let debug = dir.path().join("debug");
    fs::create_dir(&debug).unwrap();
    mkfifo(&debug.join("arrayjit.h"));
    let c = run_child(&[
        ("ARRAYJIT_DEBUG_DIR", &debug),
        ("ARRAYJIT_CACHE", Path::new("off")),
        ("TMPDIR", dir.path()),
    ]);
    assert_eq!(c.value(), 42.0);
    // Replaced by the header.
    let h = debug.join("arrayjit.h");
    assert!(fs::symlink_metadata(&h).unwrap().is_file());
    assert!(fs::read_to_string(&h).unwrap().contains("#"));
}

// ---------------------------------------------------------------------------------------------
// (9) The debug directory's files are never opened by a name someone else could have
// planted.

#[test]
fn a_link_planted_at_the_log_during_the_compile_does_not_truncate_its_target() {
    let root = tempfile::tempdir().unwrap();
    let debug = root.path().join("debug");
    fs::create_dir(&debug).unwrap();
    set_mode(&debug, 0o1777); // a shared directory, like /tmp
    let victim = root.path().join("victim");
    fs::write(&victim, "precious\n").unwrap();
    set_mode(&victim, 0o600);
    // Another user's move while the compiler runs (the compile, not the target probe, which
    // runs before the stem is chosen): replace `k.log` by a link to the victim (`ln -sf`
    // removes what is there first).
    let cc = root.path().join("cc-planting-a-link");
    write_script(
        &cc,
        &format!(
            "case \"$*\" in *-shared*) ln -sf '{}' '{}';; esac\nexec '{}' \"$@\"\n",
            victim.display(),
            debug.join("k.log").display(),
            system_cc().display()
        ),
    );
    let cfg = config(root.path(), None)
        .compiler(cc)
        .debug_dir(Some(debug.clone()));
    let (lib, _) = compile_watched(&cfg);
    assert_eq!(call(&lib), 42.0);
    assert_eq!(lib.name(), "k");
    assert!(
        fs::symlink_metadata(debug.join("k.log"))
            .unwrap()
            .file_type()
            .is_symlink(),
        "the script did not plant the link"
    );
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
    // The same for the extra debug files and the command: a link planted before the compile
    // makes the stem taken (the next free one is used).
    let victim2 = root.path().join("victim2");
    fs::write(&victim2, "precious too\n").unwrap();
    std::os::unix::fs::symlink(&victim2, debug.join("j.cmd")).unwrap();
    let cfg = cfg.compiler(system_cc());
    let lib = compile_and_load(&cfg, DOUBLER, "j", &[]).unwrap();
    assert_eq!(lib.name(), "j_1");
    assert_eq!(fs::read_to_string(&victim2).unwrap(), "precious too\n");
}

// ---------------------------------------------------------------------------------------------
// (12) Temporaries of killed compiles.

/// Sets a directory's modification time.
fn age(path: &Path, by: Duration) {
    fs::File::open(path)
        .unwrap()
        .set_modified(SystemTime::now() - by)
        .unwrap();
}

#[test]
fn stale_temporary_dirs_are_removed_and_fresh_or_foreign_ones_kept() {
    let root = tempfile::tempdir().unwrap();
    let two_hours = Duration::from_secs(2 * 3600);
    let mk = |name: &str, old: bool| {
        let d = root.path().join(name);
        fs::create_dir(&d).unwrap();
        fs::write(d.join("k.c"), "left behind").unwrap();
        fs::create_dir(d.join("sub")).unwrap();
        if old {
            age(&d, two_hours);
        }
        d
    };
    let stale = mk("arrayjit-Old123", true);
    let fresh = mk("arrayjit-New123", false);
    let other_name = mk("arrayjit-something-else", true);
    let kept_log = root.path().join("arrayjit-compile-k-Abc123.log");
    fs::write(&kept_log, "log").unwrap();
    age(&kept_log, two_hours);
    // In use: a live process holds its lock.
    let busy = mk("arrayjit-Busy12", true);
    let busy_fd = fs::File::open(&busy).unwrap();
    use std::os::unix::io::AsRawFd;
    // SAFETY: flock on a descriptor we own.
    assert_eq!(
        unsafe { libc::flock(busy_fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    let foreign = if root_or_skip("stale_temporary_dirs_... (foreign)") {
        let d = mk("arrayjit-Oth123", false);
        chown(&d, NOBODY);
        age(&d, two_hours);
        Some(d)
    } else {
        None
    };

    let (lib, _) = compile_watched(&config(root.path(), None));
    assert_eq!(call(&lib), 42.0);
    assert!(!stale.exists(), "the stale directory was not removed");
    for kept in [&fresh, &other_name, &kept_log, &busy]
        .into_iter()
        .chain(foreign.as_ref())
    {
        assert!(kept.exists(), "{} was removed", kept.display());
    }
    drop(busy_fd);
}

/// Whether process `pid` is gone (or a zombie, which runs nothing).
fn gone(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn the_next_compile_kills_the_compiler_of_a_killed_process_and_removes_its_dir() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("compiler.pid");
    let cc = dir.path().join("slow-cc");
    // Records its pid, then becomes `sleep` (same pid).
    write_script(
        &cc,
        &format!(
            "echo $$ > '{}.tmp'\nmv '{0}.tmp' '{0}'\nexec sleep 120\n",
            pidfile.display()
        ),
    );
    let mut child = child_command(&[
        ("ARRAYJIT_CC", &cc),
        ("ARRAYJIT_CACHE", Path::new("off")),
        ("TMPDIR", dir.path()),
    ])
    .spawn()
    .unwrap();
    let start = Instant::now();
    let pid: i32 = loop {
        if let Ok(s) = fs::read_to_string(&pidfile) {
            break s.trim().parse().unwrap();
        }
        if start.elapsed() > CHILD_TIMEOUT || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "the slow compiler did not start: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Wait until it is `sleep` (past the exec), then kill its parent without any cleanup.
    let start = Instant::now();
    while !fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep") {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never became sleep"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // Nothing ran in the killed process: its compiler runs on, orphaned, in its directory.
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !gone(pid),
        "the orphaned compiler is expected to run until the next compile"
    );
    let left = |dir: &Path| -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("arrayjit-"))
            .collect()
    };
    assert_eq!(left(dir.path()).len(), 1, "{:?}", left(dir.path()));
    // The next compile in that temporary root (this process) kills it and removes the
    // directory, however fresh.
    let (lib, _) = compile_watched(&config(dir.path(), None));
    assert_eq!(call(&lib), 42.0);
    let start = Instant::now();
    while !gone(pid) {
        if start.elapsed() > Duration::from_secs(3) {
            // SAFETY: kill(2) of the orphan this test created, so that it does not linger.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the orphaned compiler (pid {pid}) survived the next compile");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(left(dir.path()).is_empty(), "{:?}", left(dir.path()));
}
