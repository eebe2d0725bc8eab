//! The compile stage: turns a generated C translation unit into a loaded shared object.
//!
//! [`compile_and_load`] writes the source and the runtime header into a private temporary
//! directory, runs the system C compiler there (with a timeout), loads the resulting shared
//! object from its unique path and deletes the directory again, so nothing is left behind.
//! Setting `ARRAYJIT_DEBUG_DIR` keeps the source, the command line and the compiler's output
//! for inspection.
//!
//! The compiler is run in the temporary directory with relative file names
//! (`cc -O3 ... -I. -o lib<stem>.so <stem>.c -lm`), so diagnostics name `<stem>.c` and the
//! command kept in the debug directory can be re-run from there as is.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::{Error, Result};

/// The runtime header every generated C file includes as `"arrayjit.h"`.
const RUNTIME_HEADER: &str = include_str!("../../runtime_c/arrayjit.h");

/// The target triple the crate was built for (recorded by `build.rs`).
const TARGET: &str = env!("ARRAYJIT_TARGET");

/// Default for `ARRAYJIT_OPT_LEVEL`.
const DEFAULT_OPT_LEVEL: &str = "3";
/// Default for `ARRAYJIT_ARCH_FLAGS`.
const DEFAULT_ARCH_FLAGS: &str = "-march=native";
/// Default for `ARRAYJIT_COMPILE_TIMEOUT`, in seconds.
const DEFAULT_TIMEOUT_SECS: u64 = 300;
/// Longest file stem kept from the caller's `file_stem`.
const MAX_STEM_LEN: usize = 64;
/// Stem used when the caller's `file_stem` sanitizes to nothing.
const FALLBACK_STEM: &str = "kernel";
/// File extensions the compile stage itself writes into the debug directory.
const RESERVED_EXTENSIONS: [&str; 3] = ["c", "cmd", "log"];

/// Compiler settings read from the environment.
///
/// All fields are public, so a configuration can also be built directly (for example in tests)
/// instead of through [`CompilerConfig::from_env`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompilerConfig {
    /// The C compiler: a path, or a bare program name looked up in `PATH`.
    pub compiler: PathBuf,
    /// The optimization level, passed as `-O<opt_level>` (e.g. `"3"`, `"2"`, `"s"`).
    pub opt_level: String,
    /// Target-architecture flags (default `-march=native`), passed after the optimization level.
    pub arch_flags: Vec<String>,
    /// Further flags, passed after the architecture flags.
    pub extra_flags: Vec<String>,
    /// Where to keep the source, command line and compiler output of every compile, if anywhere.
    pub debug_dir: Option<PathBuf>,
    /// How long the compiler may run before it (and every process it started) is killed.
    pub timeout: Duration,
    /// The directory in which private temporary directories are created;
    /// `None` means [`std::env::temp_dir`].
    pub temp_root: Option<PathBuf>,
    /// Where compiled shared objects are cached (`None`: no cache). See [`compile_and_load`].
    pub cache_dir: Option<PathBuf>,
}

impl CompilerConfig {
    /// Reads the compiler settings from the environment:
    ///
    /// - the compiler: `ARRAYJIT_CC`, else `CC`, else the `cc` crate's choice for the target the
    ///   crate was built for. The value must name a single program (a path, or a name found in
    ///   `PATH`); flags go in `ARRAYJIT_CFLAGS`. A compiler that cannot be found is
    ///   [`Error::CompilerNotFound`], naming the variable it came from;
    /// - `ARRAYJIT_OPT_LEVEL`: the optimization level, used as `-O<level>` (default `3`);
    /// - `ARRAYJIT_ARCH_FLAGS`: whitespace-separated architecture flags (default
    ///   `-march=native`; set it to an empty string for none);
    /// - `ARRAYJIT_CFLAGS`: whitespace-separated extra flags (default none); with GCC,
    ///   [`GCC_WORKAROUND_FLAGS`] come first unless `ARRAYJIT_GCC_WORKAROUND=0`;
    /// - `ARRAYJIT_DEBUG_DIR`: a directory in which to keep sources, commands and logs;
    /// - `ARRAYJIT_COMPILE_TIMEOUT`: the compile timeout in seconds (default 300);
    /// - `ARRAYJIT_CACHE_DIR`: the compile cache (default `$XDG_CACHE_HOME/arrayjit`, else
    ///   `$HOME/.cache/arrayjit`); `ARRAYJIT_CACHE=0` disables the cache.
    ///
    /// Apart from `ARRAYJIT_ARCH_FLAGS`, a variable set to the empty string counts as unset.
    /// A malformed value is [`Error::Usage`].
    pub fn from_env() -> Result<CompilerConfig> {
        let get = |name: &str| std::env::var_os(name);
        let cache_dir = cache_dir_from(&get);
        Self::from_lookup(get, || detect_compiler(cache_dir.as_deref()))
    }

    /// [`CompilerConfig::from_env`] with the environment and the fallback compiler detection
    /// supplied by the caller (so that the parsing can be tested without touching the
    /// process environment).
    fn from_lookup(
        get: impl Fn(&str) -> Option<OsString>,
        detect: impl FnOnce() -> Result<PathBuf>,
    ) -> Result<CompilerConfig> {
        let non_empty = |name: &str| get(name).filter(|v| !v.is_empty());
        let utf8 = |name: &str, value: OsString| {
            value.into_string().map_err(|v| {
                Error::Usage(format!("{name}={}: not valid UTF-8", v.to_string_lossy()))
            })
        };

        let compiler = if let Some(cc) = non_empty("ARRAYJIT_CC") {
            check_compiler(Path::new(&cc), "ARRAYJIT_CC")?
        } else if let Some(cc) = non_empty("CC") {
            check_compiler(Path::new(&cc), "CC")?
        } else {
            let detected = detect()?;
            check_compiler(
                &detected,
                &format!("the cc crate's choice for target {TARGET}"),
            )?
        };

        let opt_level = match non_empty("ARRAYJIT_OPT_LEVEL") {
            Some(v) => {
                let v = utf8("ARRAYJIT_OPT_LEVEL", v)?;
                let level = v.trim();
                let level = level.strip_prefix("-O").unwrap_or(level);
                if level.is_empty() || !level.chars().all(|c| c.is_ascii_alphanumeric()) {
                    return Err(Error::Usage(format!(
                        "ARRAYJIT_OPT_LEVEL={v:?}: expected an optimization level such as 0, 1, 2, 3, s or fast"
                    )));
                }
                level.to_string()
            }
            None => DEFAULT_OPT_LEVEL.to_string(),
        };

        let split = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        let arch_flags = match get("ARRAYJIT_ARCH_FLAGS") {
            Some(v) => split(&utf8("ARRAYJIT_ARCH_FLAGS", v)?),
            None => split(DEFAULT_ARCH_FLAGS),
        };
        // GCC 12 miscompiles some if-converted, vectorized loops with conditional selects
        // (wrong values, even reads past a buffer; reproductions in tests/differential.rs,
        // `regression_gcc12_vectorizer_wrong_code`), so with GCC those loops are not
        // if-converted unless ARRAYJIT_GCC_WORKAROUND=0.
        let workaround = is_gcc(&compiler)
            && non_empty("ARRAYJIT_GCC_WORKAROUND")
                .is_none_or(|v| v.to_string_lossy().trim() != "0");
        let mut extra_flags: Vec<String> = if workaround {
            GCC_WORKAROUND_FLAGS.iter().map(|f| f.to_string()).collect()
        } else {
            Vec::new()
        };
        if let Some(v) = get("ARRAYJIT_CFLAGS") {
            extra_flags.extend(split(&utf8("ARRAYJIT_CFLAGS", v)?));
        }

        let debug_dir = non_empty("ARRAYJIT_DEBUG_DIR").map(PathBuf::from);

        let timeout = match non_empty("ARRAYJIT_COMPILE_TIMEOUT") {
            Some(v) => {
                let v = utf8("ARRAYJIT_COMPILE_TIMEOUT", v)?;
                v.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|s| *s > 0.0)
                    .and_then(|s| Duration::try_from_secs_f64(s).ok())
                    .ok_or_else(|| {
                        Error::Usage(format!(
                            "ARRAYJIT_COMPILE_TIMEOUT={v:?}: expected a positive number of seconds"
                        ))
                    })?
            }
            None => Duration::from_secs(DEFAULT_TIMEOUT_SECS),
        };

        let cache_dir = cache_dir_from(&get);

        Ok(CompilerConfig {
            compiler,
            opt_level,
            arch_flags,
            extra_flags,
            debug_dir,
            timeout,
            temp_root: None,
            cache_dir,
        })
    }

    /// The full argument list used for a compile (for display and for cache keys later),
    /// without the compiler itself:
    /// `-O<level> <arch flags> <extra flags> -std=gnu11 -shared -fPIC -I<dir of src> -o <out> <src> -lm`.
    ///
    /// Paths that are not valid UTF-8 are converted lossily; [`compile_and_load`] always passes
    /// UTF-8 (relative) paths.
    pub fn args(&self, src: &Path, out: &Path) -> Vec<String> {
        self.os_args(src, out)
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    /// The whole command line (compiler and [`CompilerConfig::args`]), quoted for a POSIX shell.
    pub fn command_line(&self, src: &Path, out: &Path) -> String {
        let mut words = vec![shell_quote(&self.compiler.to_string_lossy())];
        words.extend(self.args(src, out).iter().map(|a| shell_quote(a)));
        words.join(" ")
    }

    /// [`CompilerConfig::args`] without the lossy conversion, for running the compiler.
    fn os_args(&self, src: &Path, out: &Path) -> Vec<OsString> {
        let include_dir = match src.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let mut args: Vec<OsString> = Vec::new();
        args.push(format!("-O{}", self.opt_level).into());
        args.extend(self.arch_flags.iter().map(OsString::from));
        args.extend(self.extra_flags.iter().map(OsString::from));
        for flag in ["-std=gnu11", "-shared", "-fPIC"] {
            args.push(flag.into());
        }
        let mut include = OsString::from("-I");
        include.push(include_dir);
        args.push(include);
        args.push("-o".into());
        args.push(out.into());
        args.push(src.into());
        args.push("-lm".into());
        args
    }
}

/// The compile cache directory: `ARRAYJIT_CACHE_DIR`, else `$XDG_CACHE_HOME/arrayjit`, else
/// `$HOME/.cache/arrayjit`; `None` when `ARRAYJIT_CACHE=0` (or `off`, `false`, `no`).
fn cache_dir_from(get: &impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let non_empty = |name: &str| get(name).filter(|v| !v.is_empty());
    let disabled = non_empty("ARRAYJIT_CACHE")
        .is_some_and(|v| matches!(v.to_string_lossy().trim(), "0" | "false" | "off" | "no"));
    if disabled {
        return None;
    }
    non_empty("ARRAYJIT_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| non_empty("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("arrayjit")))
        .or_else(|| non_empty("HOME").map(|h| PathBuf::from(h).join(".cache/arrayjit")))
}

/// Added (once) when the compiler produced assembly its own assembler rejects.
const AVX512_FALLBACK_FLAG: &str = "-mno-avx512f";

/// Flags added for GCC (see `CompilerConfig::from_env`).
pub const GCC_WORKAROUND_FLAGS: [&str; 1] = ["-fno-tree-loop-if-convert"];

/// Whether the compiler is GCC (its resolved file name says so: `gcc`, `gcc-12`,
/// `x86_64-linux-gnu-gcc-12`, or `cc` pointing at one of those).
fn is_gcc(compiler: &Path) -> bool {
    let path = if is_bare_name(compiler) {
        find_in_path(compiler.as_os_str())
    } else {
        Some(compiler.to_path_buf())
    };
    path.and_then(|p| fs::canonicalize(p).ok())
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .is_some_and(|n| n.contains("gcc"))
}

/// Asks the `cc` crate which C compiler it would use for the crate's target. The detection
/// runs the compiler (tens of milliseconds), so its answer is kept for the process and, with a
/// cache directory, in a file keyed by the target and `PATH` (used while the compiler it
/// names still exists), so a new process does not pay for it again.
fn detect_compiler(cache_dir: Option<&Path>) -> Result<PathBuf> {
    use std::sync::OnceLock;
    static DETECTED: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    let remembered = cache_dir.map(|dir| {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let key = fnv128(&[b"detected-cc", TARGET.as_bytes(), path.as_encoded_bytes()]);
        dir.join(format!("detected-cc-{key:032x}"))
    });
    DETECTED
        .get_or_init(|| {
            if let Some(file) = &remembered {
                if let Ok(text) = fs::read_to_string(file) {
                    let p = PathBuf::from(text.trim_end_matches('\n'));
                    if p.is_file() || find_in_path(p.as_os_str()).is_some() {
                        return Ok(p);
                    }
                }
            }
            let found = detect_compiler_now().map_err(|e| e.to_string());
            if let (Ok(p), Some(file)) = (&found, &remembered) {
                write_atomically(file, &p.to_string_lossy());
            }
            found
        })
        .clone()
        .map_err(|msg| match msg.strip_prefix("C compiler not found: ") {
            Some(m) => Error::CompilerNotFound(m.to_string()),
            None => Error::CompilerNotFound(msg),
        })
}

fn detect_compiler_now() -> Result<PathBuf> {
    let tool = cc::Build::new()
        .target(TARGET)
        .host(TARGET)
        .opt_level(0)
        .cargo_metadata(false)
        .cargo_warnings(false)
        .emit_rerun_if_env_changed(false)
        .try_get_compiler()
        .map_err(|e| {
            Error::CompilerNotFound(format!(
                "ARRAYJIT_CC and CC are unset and the cc crate found no C compiler for target \
                 {TARGET}: {e}"
            ))
        })?;
    Ok(tool.path().to_path_buf())
}

/// Checks that `compiler` (which came from `origin`) exists: a path must name a file, a bare
/// name must be found in `PATH`. Relative paths are made absolute, because the compiler runs
/// in another working directory. Returns the compiler as it should be stored in the config.
fn check_compiler(compiler: &Path, origin: &str) -> Result<PathBuf> {
    let shown = || format!("{origin}={}", compiler.display());
    let has_whitespace = compiler.to_string_lossy().contains(char::is_whitespace);
    let hint = if has_whitespace {
        " (the variable must name a single program; put flags in ARRAYJIT_CFLAGS)"
    } else {
        ""
    };
    if is_bare_name(compiler) {
        if find_in_path(compiler.as_os_str()).is_none() {
            return Err(Error::CompilerNotFound(format!(
                "{}: not found in PATH{hint}",
                shown()
            )));
        }
        Ok(compiler.to_path_buf())
    } else {
        if !compiler.is_file() {
            return Err(Error::CompilerNotFound(format!(
                "{}: no such file{hint}",
                shown()
            )));
        }
        std::path::absolute(compiler).map_err(|e| Error::io(shown(), e))
    }
}

/// Whether `p` is a program name to be looked up in `PATH` (no directory part).
fn is_bare_name(p: &Path) -> bool {
    p.components().count() == 1 && !p.as_os_str().as_encoded_bytes().contains(&b'/')
}

/// Looks `name` up in `PATH` like the shell does (first regular file with an execute bit).
fn find_in_path(name: &OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| {
            fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// Quotes `word` for a POSIX shell if it contains anything but obviously safe characters.
fn shell_quote(word: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_./=+,:@%".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The fixed signature of every routine entry point the code generator emits:
/// `int NAME(void *const *node_buffers, const int64_t *static_indices, const void *merge_buffer)`,
/// returning 0 on success.
///
/// A function pointer obtained from [`LoadedLibrary::entry`] is only valid while the
/// [`LoadedLibrary`] it came from is alive.
pub type EntryFn = unsafe extern "C" fn(*const *mut u8, *const i64, *const u8) -> i32;

/// A loaded shared object. Keeps the library alive as long as any routine uses it (hold it in
/// an [`Arc`]); dropping the last reference unloads it, after which entry points obtained from
/// it must not be called.
pub struct LoadedLibrary {
    /// The `dlopen` handle.
    lib: libloading::os::unix::Library,
    /// The sanitized file stem the library was compiled under.
    name: String,
    /// The (already deleted) temporary path the library was loaded from, for messages.
    path: PathBuf,
    /// The source kept in the debug directory, if any.
    debug_source: Option<PathBuf>,
    /// Whether the library came from the compile cache (no compiler ran).
    from_cache: bool,
}

impl LoadedLibrary {
    /// Whether the library was loaded from the compile cache (the compiler did not run).
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    /// Looks up an entry point by symbol name; error ([`Error::Load`]) naming the symbol if
    /// absent.
    ///
    /// The symbol must be a routine emitted by the code generator (which always uses the
    /// [`EntryFn`] signature), and the returned pointer may only be called while `self` is
    /// alive.
    pub fn entry(&self, symbol: &str) -> Result<EntryFn> {
        let load_err = |msg: String| Error::Load {
            path: self.path.clone(),
            msg,
        };
        if symbol.is_empty() || symbol.contains('\0') {
            return Err(load_err(format!("invalid symbol name {symbol:?}")));
        }
        // SAFETY: we only read the symbol's address as an untyped pointer, which is valid for
        // any symbol; nothing is called or dereferenced here.
        let sym = unsafe { self.lib.get::<*mut std::ffi::c_void>(symbol.as_bytes()) }
            .map_err(|e| load_err(format!("symbol `{symbol}` not found: {e}")))?;
        let addr: *mut std::ffi::c_void = *sym;
        if addr.is_null() {
            return Err(load_err(format!("symbol `{symbol}` has a null address")));
        }
        // SAFETY: `addr` is non-null and is the address of a symbol in a library we generated;
        // the code generator emits every routine with exactly the `EntryFn` signature, and
        // object and function pointers have the same size and representation on the
        // platforms dlopen supports (POSIX requires it for dlsym).
        let f = unsafe { std::mem::transmute::<*mut std::ffi::c_void, EntryFn>(addr) };
        Ok(f)
    }

    /// The sanitized file stem the library was compiled under (with a numeric suffix if the
    /// debug directory already held that name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The copy of the C source kept in the debug directory, if one is configured.
    pub fn debug_source(&self) -> Option<&Path> {
        self.debug_source.as_deref()
    }
}

impl fmt::Debug for LoadedLibrary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedLibrary")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("debug_source", &self.debug_source)
            .finish_non_exhaustive()
    }
}

/// Extra human-readable files to keep in the debug directory next to the .c file (e.g.
/// `("assignments.txt", text)`); written as `<stem>.<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebugFile {
    /// The file name suffix after `<stem>.`; characters other than `[A-Za-z0-9_.-]` are
    /// replaced by `_`. The names `c`, `cmd` and `log` are reserved.
    pub name: String,
    /// The file's contents.
    pub contents: String,
}

/// Reduces a caller-supplied stem to `[A-Za-z0-9_]`, at most 64 characters, never empty.
fn sanitize_stem(stem: &str) -> String {
    let s: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(MAX_STEM_LEN)
        .collect();
    if s.is_empty() {
        FALLBACK_STEM.to_string()
    } else {
        s
    }
}

/// Reduces a debug file name to `[A-Za-z0-9_.-]` without leading dots, never empty.
fn sanitize_debug_name(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let s = s.trim_start_matches('.');
    if s.is_empty() {
        "txt".to_string()
    } else {
        s.to_string()
    }
}

/// Writes `source` (a full C translation unit that does `#include "arrayjit.h"`) into a
/// private temporary directory together with the runtime header, compiles it into a shared
/// object with `config`'s compiler (`<compiler> -O<lvl> <arch flags> <extra flags> -std=gnu11
/// -shared -fPIC -I. -o lib<stem>.so <stem>.c -lm`, run inside that directory), loads the
/// object from its unique temporary path with `RTLD_NOW | RTLD_LOCAL`, and deletes the
/// directory again (the loaded mapping stays valid), leaving no files behind.
///
/// `file_stem` is reduced to `[A-Za-z0-9_]` (at most 64 characters). With
/// [`CompilerConfig::debug_dir`] set, the directory keeps `<stem>.c`, `arrayjit.h`,
/// `<stem>.cmd` (the command line, runnable from that directory), `<stem>.log` (the compiler's
/// standard output and error) and `<stem>.<name>` for each of `debug_files`; if `<stem>.c`
/// already exists a numeric suffix is added to the stem, so nothing is overwritten.
///
/// If the compiler fails inside its own assembler (GCC 12 can emit invalid AVX-512
/// assembly from valid C), the compile is retried once with `-mno-avx512f`.
///
/// Errors: [`Error::CompilerNotFound`] if the compiler cannot be started,
/// [`Error::Compile`] if it fails (exits non-zero or is killed by a signal),
/// [`Error::CompileTimeout`] if it runs longer than [`CompilerConfig::timeout`] (it and every
/// process it started are killed), [`Error::Load`] if the object cannot be loaded,
/// [`Error::Io`] for file-system failures (including an unusable debug directory) and
/// [`Error::Usage`] for bad `debug_files` names.
pub fn compile_and_load(
    config: &CompilerConfig,
    source: &str,
    file_stem: &str,
    debug_files: &[DebugFile],
) -> Result<Arc<LoadedLibrary>> {
    let debug_files_in = debug_files;
    let stem = sanitize_stem(file_stem);
    let debug_files = check_debug_files(debug_files)?;

    // Keep the source (and the other debug files) before compiling, so that they survive a
    // compiler crash or hang.
    let debug = match &config.debug_dir {
        Some(dir) => Some(DebugOutput::create(dir, &stem, source, &debug_files)?),
        None => None,
    };
    let stem = debug.as_ref().map_or(stem, |d| d.stem.clone());

    let root = config.temp_root.clone().unwrap_or_else(std::env::temp_dir);
    let tmp = tempfile::Builder::new()
        .prefix("arrayjit-")
        .tempdir_in(&root)
        .map_err(|e| {
            Error::io(
                format!("creating a temporary directory in {}", root.display()),
                e,
            )
        })?;
    let src_name = PathBuf::from(format!("{stem}.c"));
    let lib_name = PathBuf::from(format!("lib{stem}.so"));
    write_file(&tmp.path().join(&src_name), source)?;
    write_file(&tmp.path().join("arrayjit.h"), RUNTIME_HEADER)?;

    let command = config.command_line(&src_name, &lib_name);
    if let Some(d) = &debug {
        d.write(".cmd", &format!("{command}\n"))?;
    }

    // The compile cache: keyed by the source, the runtime header, the full command and the
    // compiler's identity (its resolved path, size and modification time).
    let cached = config
        .cache_dir
        .as_ref()
        .and_then(|dir| cache_key(config, source, &command).map(|k| dir.join(format!("{k}.so"))));
    if let Some(path) = cached.as_ref().filter(|p| p.is_file()) {
        if let Ok(lib) = open_library(path) {
            if let Some(d) = &debug {
                d.write(".log", &format!("[cache hit: {}]\n", path.display()))?;
            }
            return Ok(Arc::new(LoadedLibrary {
                lib,
                name: stem,
                path: path.clone(),
                debug_source: debug.map(|d| d.source_path),
                from_cache: true,
            }));
        }
    }

    let run = run_compiler(config, tmp.path(), &src_name, &lib_name, &command);
    if let (Some(d), Ok(r)) = (&debug, &run) {
        d.write(".log", &r.output)?;
    }
    let run = run?;
    if run.timed_out {
        return Err(Error::CompileTimeout {
            command,
            seconds: config.timeout.as_secs_f64().ceil() as u64,
        });
    }
    if !run.status.success() {
        // GCC 12 sometimes emits invalid AVX-512 assembly from valid C (e.g. the mnemonic
        // `vinsert<i128vldq>`, which the assembler rejects). That is the compiler's bug, not
        // the program's: retry once without AVX-512.
        if run.output.contains("Assembler messages")
            && !config.extra_flags.iter().any(|f| f == AVX512_FALLBACK_FLAG)
        {
            let mut retry = config.clone();
            retry.extra_flags.push(AVX512_FALLBACK_FLAG.to_string());
            drop(tmp);
            return compile_and_load(&retry, source, file_stem, debug_files_in);
        }
        let mut output = run.output;
        match (run.status.code(), run.status.signal()) {
            (_, Some(sig)) => output.push_str(&format!("\n[compiler terminated by signal {sig}]")),
            (Some(code), _) if output.trim().is_empty() => output.push_str(&format!(
                "[compiler exited with status {code} and printed nothing]"
            )),
            _ => {}
        }
        return Err(Error::Compile {
            command,
            output,
            source_path: debug.map(|d| d.source_path),
        });
    }

    let lib_path = tmp.path().join(&lib_name);
    // The path is unique to this compile (a fresh temporary directory), so dlopen cannot hand
    // back a stale library loaded earlier from the same path.
    let lib = open_library(&lib_path)?;
    if let Some(path) = &cached {
        store_in_cache(&lib_path, path);
    }

    let tmp_path = tmp.path().to_path_buf();
    tmp.close().map_err(|e| {
        Error::io(
            format!("removing temporary directory {}", tmp_path.display()),
            e,
        )
    })?;

    Ok(Arc::new(LoadedLibrary {
        lib,
        name: stem,
        path: lib_path,
        debug_source: debug.map(|d| d.source_path),
        from_cache: false,
    }))
}

/// Loads a shared object with `RTLD_NOW | RTLD_LOCAL`.
fn open_library(path: &Path) -> Result<libloading::os::unix::Library> {
    // SAFETY: loading runs the library's initializers. Every library loaded here was compiled
    // from C source generated by this crate (directly, or earlier into the cache under a key
    // that covers the source, the command and the compiler), which defines no constructors or
    // destructors; its only dependencies are libc and libm, already initialized in this
    // process.
    unsafe {
        libloading::os::unix::Library::open(
            Some(path),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL,
        )
    }
    .map_err(|e| Error::Load {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })
}

/// FNV-1a, 128 bits: a stable hash (unlike `std`'s, which may change between Rust releases).
fn fnv128(parts: &[&[u8]]) -> u128 {
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013B;
    let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    for part in parts {
        for &b in part.iter() {
            h ^= b as u128;
            h = h.wrapping_mul(PRIME);
        }
        // Separate the parts so that moving bytes between them changes the hash.
        h ^= 0xff;
        h = h.wrapping_mul(PRIME);
    }
    h
}

/// The compiler's identity for the cache key: its resolved path (symlinks followed, bare
/// names looked up in `PATH`) with the file's size and modification time, so that upgrading
/// or replacing the compiler changes the key. A `stat`, not a process: a cache hit must cost
/// only a few milliseconds. None if the compiler cannot be resolved (then the cache is
/// bypassed).
fn compiler_identity(config: &CompilerConfig) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let path = if is_bare_name(&config.compiler) {
        find_in_path(config.compiler.as_os_str())?
    } else {
        config.compiler.clone()
    };
    let real = fs::canonicalize(&path).ok()?;
    let meta = fs::metadata(&real).ok()?;
    Some(format!(
        "{} {} {} {}",
        real.display(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec()
    ))
}

/// The cache key of a compile, or None when the compiler cannot be identified (then the
/// cache is bypassed rather than risk reusing another compiler's output).
fn cache_key(config: &CompilerConfig, source: &str, command: &str) -> Option<String> {
    let identity = compiler_identity(config)?;
    let compiler = config.compiler.to_string_lossy();
    let h = fnv128(&[
        b"arrayjit-cache-v1",
        compiler.as_bytes(),
        identity.as_bytes(),
        command.as_bytes(),
        RUNTIME_HEADER.as_bytes(),
        source.as_bytes(),
    ]);
    Some(format!("{h:032x}"))
}

/// Writes a small file atomically (temporary file + rename); failures are ignored.
fn write_atomically(dest: &Path, contents: &str) {
    let Some(dir) = dest.parent() else { return };
    if fs::create_dir_all(dir).is_err() {
        return;
    }
    let Ok(mut tmp) = tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir) else {
        return;
    };
    if tmp.write_all(contents.as_bytes()).is_ok() {
        let _ = tmp.persist(dest);
    }
}

/// Copies a freshly built library into the cache atomically (a temporary file in the cache
/// directory, then a rename), so a concurrent reader sees either nothing or the whole file.
/// Failures only cost the cache entry.
fn store_in_cache(built: &Path, dest: &Path) {
    let Some(dir) = dest.parent() else { return };
    if fs::create_dir_all(dir).is_err() {
        return;
    }
    let Ok(tmp) = tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir) else {
        return;
    };
    if fs::copy(built, tmp.path()).is_ok() {
        let _ = tmp.persist(dest);
    }
}

/// Sanitizes the debug file names and rejects reserved or duplicate ones.
fn check_debug_files(files: &[DebugFile]) -> Result<Vec<(String, &str)>> {
    let mut out: Vec<(String, &str)> = Vec::with_capacity(files.len());
    for f in files {
        let name = sanitize_debug_name(&f.name);
        if RESERVED_EXTENSIONS.contains(&name.as_str()) {
            return Err(Error::Usage(format!(
                "debug file name {:?} is reserved for the compile stage's own files",
                f.name
            )));
        }
        if out.iter().any(|(n, _)| *n == name) {
            return Err(Error::Usage(format!(
                "debug file name {:?} is given twice",
                f.name
            )));
        }
        out.push((name, &f.contents));
    }
    Ok(out)
}

/// Writes `contents` to `path`, as an [`Error::Io`] naming the path on failure.
fn write_file(path: &Path, contents: &str) -> Result<()> {
    fs::write(path, contents).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// The files kept in the debug directory for one compile.
struct DebugOutput {
    /// The debug directory.
    dir: PathBuf,
    /// The stem claimed in it (the requested one, possibly with a numeric suffix).
    stem: String,
    /// `<dir>/<stem>.c`.
    source_path: PathBuf,
}

impl DebugOutput {
    /// Creates `dir` if needed, claims a stem nobody has used there yet by creating
    /// `<stem>.c` exclusively, and writes the source, the runtime header and `extra`.
    fn create(dir: &Path, stem: &str, source: &str, extra: &[(String, &str)]) -> Result<Self> {
        let dir_err = |what: &str, e: io::Error| {
            Error::io(format!("debug directory {}: {what}", dir.display()), e)
        };
        fs::create_dir_all(dir).map_err(|e| dir_err("cannot create it", e))?;

        let extensions: Vec<&str> = RESERVED_EXTENSIONS
            .iter()
            .copied()
            .chain(extra.iter().map(|(n, _)| n.as_str()))
            .collect();
        let mut claimed = None;
        for n in 0..100_000u32 {
            let candidate = if n == 0 {
                stem.to_string()
            } else {
                format!("{stem}_{n}")
            };
            // Skip stems whose companion files exist (left over from an older run).
            if extensions.iter().any(|ext| {
                dir.join(format!("{candidate}.{ext}"))
                    .symlink_metadata()
                    .is_ok()
            }) {
                continue;
            }
            let path = dir.join(format!("{candidate}.c"));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => {
                    claimed = Some((candidate, path, file));
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(dir_err(&format!("cannot create {candidate}.c"), e)),
            }
        }
        let (stem, source_path, mut file) = claimed.ok_or_else(|| {
            dir_err(
                &format!("no free file name for {stem}.c"),
                io::Error::from(io::ErrorKind::AlreadyExists),
            )
        })?;
        file.write_all(source.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| Error::io(format!("writing {}", source_path.display()), e))?;
        drop(file);

        write_header(dir)?;
        let out = DebugOutput {
            dir: dir.to_path_buf(),
            stem,
            source_path,
        };
        for (name, contents) in extra {
            out.write(&format!(".{name}"), contents)?;
        }
        Ok(out)
    }

    /// Writes `<dir>/<stem><suffix>`.
    fn write(&self, suffix: &str, contents: &str) -> Result<()> {
        write_file(&self.dir.join(format!("{}{suffix}", self.stem)), contents)
    }
}

/// Puts the runtime header into the debug directory unless an identical copy is there already.
/// The header is replaced atomically, because other compiles may be reading it concurrently.
fn write_header(dir: &Path) -> Result<()> {
    let path = dir.join("arrayjit.h");
    if fs::read(&path).is_ok_and(|old| old == RUNTIME_HEADER.as_bytes()) {
        return Ok(());
    }
    let err = |e: io::Error| Error::io(format!("writing {}", path.display()), e);
    let mut tmp = tempfile::Builder::new()
        .prefix(".arrayjit.h.")
        .tempfile_in(dir)
        .map_err(err)?;
    tmp.write_all(RUNTIME_HEADER.as_bytes()).map_err(err)?;
    tmp.persist(&path).map_err(|e| err(e.error))?;
    Ok(())
}

/// What running the compiler produced.
struct CompilerRun {
    /// The exit status.
    status: ExitStatus,
    /// Whether the timeout expired and the compiler's process group was killed.
    timed_out: bool,
    /// The compiler's standard output followed by its standard error.
    output: String,
}

/// Runs the compiler in `dir` and waits for it, killing it (and everything it started) when
/// the timeout expires.
fn run_compiler(
    config: &CompilerConfig,
    dir: &Path,
    src: &Path,
    out: &Path,
    command: &str,
) -> Result<CompilerRun> {
    // The compiler runs in `dir`, so a relative compiler path must be made absolute first.
    let program = if is_bare_name(&config.compiler) {
        config.compiler.clone()
    } else {
        std::path::absolute(&config.compiler).map_err(|e| {
            Error::io(
                format!("resolving compiler path {}", config.compiler.display()),
                e,
            )
        })?
    };

    // Output goes to unnamed files rather than pipes: no reader threads are needed, and a
    // process that outlives the compiler cannot keep us waiting for end-of-file.
    let capture =
        || tempfile::tempfile_in(dir).map_err(|e| Error::io("creating a compiler output file", e));
    let mut stdout = capture()?;
    let mut stderr = capture()?;
    let dup = |f: &File| {
        f.try_clone()
            .map_err(|e| Error::io("duplicating a compiler output file", e))
    };

    let mut cmd = Command::new(&program);
    cmd.args(config.os_args(src, out))
        .current_dir(dir)
        // The compiler's own intermediate files go into our directory and vanish with it.
        .env("TMPDIR", dir)
        .stdin(Stdio::null())
        .stdout(dup(&stdout)?)
        .stderr(dup(&stderr)?)
        // A process group of its own, so that a timeout can kill the compiler's children
        // (cc1, as, ld) too.
        .process_group(0);
    let mut child = cmd.spawn().map_err(|e| {
        let what = if e.kind() == io::ErrorKind::NotFound {
            if is_bare_name(&config.compiler) {
                "not found in PATH".to_string()
            } else {
                "no such file".to_string()
            }
        } else {
            format!("cannot be started: {e}")
        };
        Error::CompilerNotFound(format!(
            "{}: {what} (command: {command}; set ARRAYJIT_CC or CC to choose a C compiler)",
            config.compiler.display()
        ))
    })?;
    drop(cmd); // closes our copies of the child's output descriptors

    // A watchdog thread kills the compiler's process group when the timeout expires; this
    // thread blocks in wait() on the compiler itself.
    let pid = child.id();
    let timeout = config.timeout;
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let watchdog = thread::Builder::new()
        .name("arrayjit-cc-watchdog".into())
        .spawn(move || match done_rx.recv_timeout(timeout) {
            Err(RecvTimeoutError::Timeout) => {
                kill_process_group(pid);
                true
            }
            Ok(()) | Err(RecvTimeoutError::Disconnected) => false,
        });
    let watchdog = match watchdog {
        Ok(w) => w,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::io("starting the compiler watchdog thread", e));
        }
    };
    let status = child.wait();
    let _ = done_tx.send(());
    // The watchdog never panics; treat a panic as "did not kill".
    let killed = watchdog.join().unwrap_or(false);
    let status = status.map_err(|e| Error::io(format!("waiting for {command}"), e))?;

    let mut output = read_all(&mut stdout)?;
    let err_text = read_all(&mut stderr)?;
    if !output.is_empty() && !output.ends_with('\n') && !err_text.is_empty() {
        output.push('\n');
    }
    output.push_str(&err_text);

    Ok(CompilerRun {
        status,
        // A compiler that finished successfully just as the timeout expired still counts.
        timed_out: killed && !status.success(),
        output,
    })
}

/// Reads a captured output file from the start.
fn read_all(f: &mut File) -> Result<String> {
    let mut bytes = Vec::new();
    f.seek(SeekFrom::Start(0))
        .and_then(|_| f.read_to_end(&mut bytes))
        .map_err(|e| Error::io("reading the compiler's output", e))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Sends SIGKILL to the process group led by `pid`.
fn kill_process_group(pid: u32) {
    extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    const SIGKILL: i32 = 9;
    let Ok(pid) = i32::try_from(pid) else { return };
    if pid <= 0 {
        return;
    }
    // SAFETY: kill(2) has no memory-safety preconditions. `-pid` names the process group the
    // compiler leads (it was spawned with `process_group(0)`), so only the compiler and the
    // processes it started receive the signal. The group id cannot be reused while the
    // compiler is unreaped or any group member is alive; the only window is between the
    // compiler being reaped and the watchdog being told so, microseconds in which the kernel
    // would have to hand the same number to a new group leader.
    unsafe {
        kill(-pid, SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config_from(vars: &[(&str, &str)]) -> Result<CompilerConfig> {
        let vars: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        CompilerConfig::from_lookup(|n| vars.get(n).cloned(), || Ok(PathBuf::from("sh")))
    }

    #[test]
    fn defaults() {
        let c = config_from(&[]).unwrap();
        assert_eq!(c.compiler, PathBuf::from("sh"));
        assert_eq!(c.opt_level, "3");
        assert_eq!(c.arch_flags, vec!["-march=native"]);
        assert!(c.extra_flags.is_empty());
        assert_eq!(c.debug_dir, None);
        assert_eq!(c.timeout, Duration::from_secs(300));
        assert_eq!(c.temp_root, None);
    }

    #[test]
    fn variables_are_read() {
        let c = config_from(&[
            ("ARRAYJIT_CC", "/bin/sh"),
            ("CC", "/nonexistent"),
            ("ARRAYJIT_OPT_LEVEL", "2"),
            ("ARRAYJIT_ARCH_FLAGS", ""),
            ("ARRAYJIT_CFLAGS", " -g  -Wall "),
            ("ARRAYJIT_DEBUG_DIR", "/tmp/x"),
            ("ARRAYJIT_COMPILE_TIMEOUT", "7"),
        ])
        .unwrap();
        assert_eq!(c.compiler, PathBuf::from("/bin/sh"));
        assert_eq!(c.opt_level, "2");
        assert!(c.arch_flags.is_empty());
        assert_eq!(c.extra_flags, vec!["-g", "-Wall"]);
        assert_eq!(c.debug_dir, Some(PathBuf::from("/tmp/x")));
        assert_eq!(c.timeout, Duration::from_secs(7));

        let c = config_from(&[("CC", "sh"), ("ARRAYJIT_OPT_LEVEL", "-Os")]).unwrap();
        assert_eq!(c.compiler, PathBuf::from("sh"));
        assert_eq!(c.opt_level, "s");
    }

    #[test]
    fn bad_values() {
        let e = config_from(&[("ARRAYJIT_CC", "/nonexistent")]).unwrap_err();
        assert!(
            matches!(&e, Error::CompilerNotFound(m) if m.contains("ARRAYJIT_CC=/nonexistent: no such file")),
            "{e}"
        );
        let e = config_from(&[("CC", "no-such-compiler-xyz")]).unwrap_err();
        assert!(
            matches!(&e, Error::CompilerNotFound(m) if m.contains("CC=no-such-compiler-xyz: not found in PATH")),
            "{e}"
        );
        for (k, v) in [
            ("ARRAYJIT_OPT_LEVEL", "3; rm"),
            ("ARRAYJIT_COMPILE_TIMEOUT", "0"),
            ("ARRAYJIT_COMPILE_TIMEOUT", "soon"),
        ] {
            let e = config_from(&[(k, v)]).unwrap_err();
            assert!(matches!(&e, Error::Usage(m) if m.contains(k)), "{e}");
        }
        let e = CompilerConfig::from_lookup(
            |_| None,
            || Err(Error::CompilerNotFound("detection failed".into())),
        )
        .unwrap_err();
        assert!(matches!(e, Error::CompilerNotFound(_)));
    }

    #[test]
    fn args_and_quoting() {
        let c = config_from(&[("ARRAYJIT_CFLAGS", "-DX='a b'")]).unwrap();
        let args = c.args(Path::new("k.c"), Path::new("libk.so"));
        assert_eq!(
            args,
            [
                "-O3",
                "-march=native",
                "-DX='a",
                "b'",
                "-std=gnu11",
                "-shared",
                "-fPIC",
                "-I.",
                "-o",
                "libk.so",
                "k.c",
                "-lm"
            ]
        );
        let args = c.args(Path::new("/d/k.c"), Path::new("/d/libk.so"));
        assert!(args.contains(&"-I/d".to_string()));
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("-O3"), "-O3");
    }

    #[test]
    fn stems() {
        assert_eq!(sanitize_stem("ab/../c d"), "ab____c_d");
        assert_eq!(sanitize_stem(""), "kernel");
        assert_eq!(sanitize_stem(&"x".repeat(100)).len(), 64);
        assert_eq!(sanitize_stem("é"), "_");
        assert_eq!(sanitize_debug_name("../etc/passwd"), "_etc_passwd");
        assert_eq!(sanitize_debug_name("assignments.txt"), "assignments.txt");
    }

    #[test]
    fn detection_works() {
        // The cc crate's detection must not panic outside a build script.
        let p = detect_compiler(None).unwrap();
        assert!(!p.as_os_str().is_empty());
    }
}
