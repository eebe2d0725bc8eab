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
//!
//! The stage is split by job:
//! - `config`: [`CompilerConfig`], read strictly from the environment;
//! - `detect`: the `cc` crate's compiler choice, remembered in the cache directory;
//! - `target`: [`Target`], what the compiler makes of the architecture flags;
//! - `speculate`: compiling for a guessed target while the target probe runs;
//! - `cache`: the compile cache (key, integrity check, storing);
//! - `debug`: what a compile keeps in the debug directory;
//! - `run`: running the compiler (timeout, process group, output tail);
//! - `cleanup`: the registry of active compiles and [`install_signal_cleanup`];
//! - `load`: [`LoadedLibrary`].

use std::borrow::Cow;
use std::fs;
use std::io::{self, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod cache;
mod cleanup;
mod config;
mod debug;
mod detect;
mod files;
mod load;
mod programs;
mod run;
mod sanitize;
mod speculate;
mod target;

pub use cache::{CacheFiles, CacheInfo, CompileCache};
pub use cleanup::install_signal_cleanup;
pub use config::{
    env_boolean, CompilerConfig, DEFAULT_CACHE_MAX_BYTES, GCC_SPEED_FLAGS, GCC_WORKAROUND_FLAGS,
};
pub use load::{EntryFn, LoadedLibrary};
pub use target::{Arch, CacheSizes, CompilerFamily, Features, Target};

use cache::{CacheEntry, Lookup, ObjectKey};
use cleanup::WorkDir;
pub use debug::DebugFile;
use debug::{check_debug_files, DebugOutput};
use load::open_library;
use run::{start_compiler, Captured, ProgramRun};
#[cfg(test)]
pub(crate) use speculate::force_guess;
pub(crate) use speculate::Speculation;
#[cfg(test)]
pub(crate) use speculate::TargetUse;
use speculate::Verdict;

use crate::{Error, Result};

/// The runtime header every generated C file includes as `"arrayjit.h"`.
const RUNTIME_HEADER: &str = include_str!("../../runtime_c/arrayjit.h");

/// Longest file stem kept from the caller's `file_stem`.
const MAX_STEM_LEN: usize = 64;
/// Stem used when the caller's `file_stem` sanitizes to nothing.
const FALLBACK_STEM: &str = "kernel";
/// Added (once) when the compiler produced assembly its own assembler rejects.
const AVX512_FALLBACK_FLAG: &str = "-mno-avx512f";
/// Added (once) when Clang crashed in its backend: Clang 14's SLP vectorizer makes it crash
/// ("Cannot emit physreg copy instruction") on some integer routines for AVX2 targets.
const CLANG_BACKEND_FALLBACK_FLAG: &str = "-fno-slp-vectorize";

/// Added to the flags of every compile whose target has AVX512-FP16 (see `target_and_flags`).
pub const NO_FP16_FLAG: &str = "-mno-avx512fp16";

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
/// With [`CompilerConfig::cache_dir`] set, the target is resolved first
/// ([`Target::resolve`], memoized) and the object is looked up in the cache under a key
/// covering the source, the runtime header, the command, the compiler's identity and the
/// target's fingerprint; the object key (the same without the target) is compiled into the
/// object and checked when an entry is used, and an entry that does not check out is deleted
/// and compiled again.
///
/// A compile error carries the tail of the compiler's output (at most 200 lines and 16 KiB);
/// when that is not all of it, the message names a file with all of it (the debug
/// directory's `<stem>.log`, else a kept `arrayjit-compile-<stem>-XXXXXX.log` in the
/// temporary root).
///
/// If the compiler fails inside its own assembler (GCC 12 can emit invalid AVX-512
/// assembly from valid C), the compile is retried once with `-mno-avx512f`; if Clang crashes
/// in its backend (Clang 14's SLP vectorizer, on some integer routines for AVX2), once with
/// `-fno-slp-vectorize`. If the compiler
/// was chosen by automatic detection and remembered in the cache directory, a failure makes
/// it check itself on a trivial library; if that fails too, the detection runs afresh, the
/// compile is retried if it finds another compiler, and otherwise the error names the file
/// that remembered it.
///
/// Errors: [`Error::CompilerNotFound`] if the compiler cannot be started,
/// [`Error::Compile`] if it fails (exits non-zero or is killed by a signal),
/// [`Error::CompileTimeout`] if it runs longer than [`CompilerConfig::timeout`] (it and every
/// process it started are killed), [`Error::TargetProbe`] if the target cannot be probed,
/// [`Error::Load`] if the object cannot be loaded, [`Error::Sanitizer`] if the flags ask for
/// a sanitizer whose runtime is not loaded in the process (checked before compiling, so that
/// loading cannot end the process), [`Error::Io`] for file-system failures
/// (including an unusable debug directory) and [`Error::Usage`] for bad `debug_files` names.
pub fn compile_and_load(
    config: &CompilerConfig,
    source: &str,
    file_stem: &str,
    debug_files: &[DebugFile],
) -> Result<Arc<LoadedLibrary>> {
    instrumented(config, file_stem, || {
        compile_and_load_uninstrumented(config, None, source, file_stem, debug_files)
    })?
    .ok_or_else(|| Error::Internal("a compile for the probed target was discarded".into()))
}

/// [`compile_and_load`] for `source` generated for `speculation`'s guess at the target, while
/// the target probe runs (see the `speculate` module): the compile starts at once, and when
/// the probe answers, `Ok(None)` if it disproves the guess (the compile is killed and
/// discarded; generate the code again for [`Target::resolve`]'s target and compile it with
/// [`compile_and_load`]). Otherwise as [`compile_and_load`], and the object is stored under
/// the key a compile for the probed target uses.
pub(crate) fn compile_and_load_speculative(
    config: &CompilerConfig,
    speculation: &Speculation,
    source: &str,
    file_stem: &str,
    debug_files: &[DebugFile],
) -> Result<Option<Arc<LoadedLibrary>>> {
    instrumented(config, file_stem, || {
        compile_and_load_uninstrumented(config, Some(speculation), source, file_stem, debug_files)
    })
}

/// Runs a compile, logging its outcome and duration.
fn instrumented(
    config: &CompilerConfig,
    file_stem: &str,
    compile: impl FnOnce() -> Result<Option<Arc<LoadedLibrary>>>,
) -> Result<Option<Arc<LoadedLibrary>>> {
    let start = std::time::Instant::now();
    let r = compile();
    let ms = start.elapsed().as_secs_f64() * 1e3;
    match &r {
        Ok(Some(lib)) if lib.from_cache() => {
            tracing::debug!(target: "arrayjit::compile", stem = file_stem, ms, "cache hit")
        }
        Ok(Some(_)) => tracing::info!(
            target: "arrayjit::compile",
            stem = file_stem,
            ms,
            compiler = %config.compiler.display(),
            "compiled (cache miss)"
        ),
        Ok(None) => tracing::debug!(
            target: "arrayjit::compile",
            stem = file_stem,
            ms,
            "the target probe disproved the guessed target: compile discarded"
        ),
        Err(e) => {
            // At info, not warn: the failure is also the returned error, which callers report.
            tracing::info!(target: "arrayjit::compile", stem = file_stem, ms, error = %e, "compile failed")
        }
    }
    r
}

/// What `config`'s flags mean, and the configuration to compile with: `config`, with
/// [`NO_FP16_FLAG`] added when its target has AVX512-FP16. Generated code never needs
/// half-precision instructions (half arrays are bit patterns converted by integer code, see
/// `runtime_c/arrayjit.h`), and compilers have been wrong with them enabled: GCC 12 dropped
/// roundings in vectorized half reductions, and Clang 14 crashes ("Cannot select ...
/// X86ISD::VZEXT_MOVL") on the integer conversions of some half programs. The target is the
/// probe of `config` itself (the flag is in the compile command, which the cache key holds
/// too). A probe that timed out is the error at once (the compiler hangs, and the compile
/// would only wait as long again); other probe failures are returned for the caller to
/// report if it needs the target.
fn target_and_flags(config: &CompilerConfig) -> Result<(Result<Target>, Cow<'_, CompilerConfig>)> {
    let target = match Target::resolve(config) {
        Err(e @ Error::CompileTimeout { .. }) => return Err(e),
        t => t,
    };
    let has_fp16 = target.as_ref().is_ok_and(|t| t.features.avx512fp16);
    Ok((target, flags_for(config, has_fp16)))
}

/// `config`, with [`NO_FP16_FLAG`] added when the target has AVX512-FP16 (`has_fp16`).
fn flags_for(config: &CompilerConfig, has_fp16: bool) -> Cow<'_, CompilerConfig> {
    if has_fp16 && !config.extra_flags.iter().any(|f| f == NO_FP16_FLAG) {
        let mut c = config.clone();
        c.extra_flags.push(NO_FP16_FLAG.to_string());
        Cow::Owned(c)
    } else {
        Cow::Borrowed(config)
    }
}

fn compile_and_load_uninstrumented(
    config: &CompilerConfig,
    speculation: Option<&Speculation>,
    source: &str,
    file_stem: &str,
    debug_files: &[DebugFile],
) -> Result<Option<Arc<LoadedLibrary>>> {
    let err = match compile_for(config, speculation, source, file_stem, debug_files) {
        Ok(lib) => return Ok(lib),
        Err(e) => e,
    };
    let compiler_failed = matches!(
        err,
        Error::CompilerNotFound(_)
            | Error::Compile { .. }
            | Error::CompileTimeout { .. }
            | Error::TargetProbe { .. }
            | Error::Load { .. }
    );
    let Some(file) = compiler_failed
        .then(|| detect::remembered(&config.compiler))
        .flatten()
    else {
        return Err(err);
    };
    if speculation.is_some() {
        // The ordinary compile (for the probed target) looks into the failure, and reports
        // it with its own log: the one this attempt kept would be left behind unnamed.
        if let Some(log) = kept_log_of(&err) {
            let _ = fs::remove_file(log);
        }
        return Ok(None);
    }
    // Whose fault is it? A compiler that builds and loads a trivial library works: the failure
    // is the source's (or the flags'), and a fresh detection would not help.
    if compiler_works(config) {
        detect::confirm(&config.compiler);
        return Err(err);
    }
    match detect::redetect(&file) {
        Some(fresh) if fresh != config.compiler => {
            let retry = CompilerConfig {
                compiler: fresh,
                ..config.clone()
            };
            compile_for(&retry, None, source, file_stem, debug_files)
        }
        _ => Err(note_remembered(err, &file, &config.compiler)),
    }
}

/// Whether `config`'s compiler builds and loads a trivial shared object (no cache, no debug
/// directory).
fn compiler_works(config: &CompilerConfig) -> bool {
    let check = CompilerConfig {
        cache_dir: None,
        debug_dir: None,
        trace_dir: None,
        // A trivial library takes well under a second; do not wait long for a hung compiler.
        timeout: config.timeout.min(std::time::Duration::from_secs(30)),
        ..config.clone()
    };
    compile_for(
        &check,
        None,
        "int arrayjit_compiler_check(void) { return 0; }\n",
        "compiler_check",
        &[],
    )
    .is_ok()
}

/// Adds to a compiler failure that the compiler came from a `detected-cc-*` file.
fn note_remembered(err: Error, file: &Path, compiler: &Path) -> Error {
    let note = format!(
        "[the compiler {} was chosen by the cc crate's detection and remembered in {}; a fresh \
         detection chose it again]",
        compiler.display(),
        file.display()
    );
    match err {
        Error::CompilerNotFound(m) => Error::CompilerNotFound(format!("{m} {note}")),
        Error::Compile {
            command,
            output,
            source_path,
        } => Error::Compile {
            command,
            output: format!("{output}\n{note}"),
            source_path,
        },
        Error::CompileTimeout { command, seconds } => Error::CompileTimeout {
            command: format!("{command}; {note}"),
            seconds,
        },
        Error::TargetProbe { command, output } => Error::TargetProbe {
            command,
            output: format!("{output}\n{note}"),
        },
        Error::Load { path, msg } => Error::Load {
            path,
            msg: format!("{msg} {note}"),
        },
        other => other,
    }
}

/// One compile as documented at [`compile_and_load`], without the re-detection; with a
/// speculation, as documented at [`compile_and_load_speculative`] (`Ok(None)`: the guess was
/// disproved). Without one, the result is always `Some`.
fn compile_for(
    config: &CompilerConfig,
    speculation: Option<&Speculation>,
    source: &str,
    file_stem: &str,
    debug_files_in: &[DebugFile],
) -> Result<Option<Arc<LoadedLibrary>>> {
    // A cache directory that is not this user's alone is not used: the compile runs without
    // the cache (`cache::trusted_dir` logs a warning saying why).
    let without_cache;
    let config = match &config.cache_dir {
        Some(dir) if !files::trusted_dir(dir) => {
            without_cache = CompilerConfig {
                cache_dir: None,
                ..config.clone()
            };
            &without_cache
        }
        _ => config,
    };
    // The target and the flags: probed (or remembered), or from the guess until the probe
    // answers (the target then comes with the verdict, below).
    let (mut target, config) = match speculation {
        None => {
            let (t, c) = target_and_flags(config)?;
            (Some(t), c)
        }
        Some(s) => (None, flags_for(config, s.avx512fp16())),
    };
    let config = &*config;
    let stem = sanitize_stem(file_stem);
    let debug_files = check_debug_files(debug_files_in)?;
    // Before anything is compiled or loaded: loading a library instrumented for a sanitizer
    // whose runtime is missing could end the process.
    sanitize::check_runtimes(config)?;

    // Keep the source (and the other debug files) before compiling, so that they survive a
    // compiler crash or hang.
    let debug = match &config.debug_dir {
        Some(dir) => Some(DebugOutput::create(dir, &stem, source, &debug_files)?),
        None => None,
    };
    let stem = debug.as_ref().map_or(stem, |d| d.stem.clone());
    let debug_source = || debug.as_ref().map(|d| d.source_path.clone());

    let src_name = PathBuf::from(format!("{stem}.c"));
    let lib_name = PathBuf::from(format!("lib{stem}.so"));
    let command = config.command_line(&src_name, &lib_name);
    if let Some(d) = &debug {
        d.write_cmd(&format!("{command}\n"))?;
    }

    // The compile cache (see the `cache` module): the object key is known now, the entry's key
    // once the target is.
    let object = match &config.cache_dir {
        Some(_) => ObjectKey::new(config, source, &command),
        None => None,
    };
    let marker = object.as_ref().map(ObjectKey::marker);
    let entry_for = |object: Option<ObjectKey>, target: Option<Result<Target>>| {
        let (Some(dir), Some(target)) = (&config.cache_dir, target) else {
            return Ok(None);
        };
        let target = target?;
        Ok(object.map(|o| CacheEntry::new(dir, config, o, &target)))
    };
    let hit = |e: &CacheEntry, note: &mut Option<String>| -> Result<Option<Arc<LoadedLibrary>>> {
        match e.lookup() {
            Lookup::Hit(lib) => {
                if let Some(d) = &debug {
                    d.write_log_note(&format!("[cache hit: {}]\n", e.path.display()))?;
                }
                Ok(Some(Arc::new(LoadedLibrary {
                    lib,
                    name: stem.clone(),
                    path: e.path.clone(),
                    debug_source: debug_source(),
                    from_cache: true,
                })))
            }
            Lookup::Miss => Ok(None),
            Lookup::Discarded(why) => {
                *note = Some(format!("{why}: deleted, compiling again"));
                Ok(None)
            }
        }
    };
    let mut cache_note = None;
    let mut entry = None;
    let mut object = object;
    if speculation.is_none() {
        entry = entry_for(object.take(), target.take())?;
        if let Some(e) = &entry {
            if let Some(lib) = hit(e, &mut cache_note)? {
                return Ok(Some(lib));
            }
        }
    }

    let root = config.temp_root.clone().unwrap_or_else(std::env::temp_dir);
    let tmp = WorkDir::create(&root)?;
    let compiled_source: Cow<str> = match &marker {
        Some(m) => Cow::Owned(format!("{source}{m}")),
        None => Cow::Borrowed(source),
    };
    write_file(&tmp.path().join(&src_name), &compiled_source)?;
    write_file(&tmp.path().join("arrayjit.h"), RUNTIME_HEADER)?;

    let running = start_compiler(
        config,
        &config.os_args(&src_name, &lib_name),
        tmp.path(),
        &command,
    )?;
    if let Some(s) = speculation {
        // Dropping `running` on an early return kills and reaps the compiler.
        match s.verdict()? {
            Verdict::Disproved => {
                running.kill();
                tmp.close()?;
                return Ok(None);
            }
            Verdict::Confirmed(t) => {
                entry = entry_for(object.take(), Some(Ok(t)))?;
                if let Some(e) = &entry {
                    if let Some(lib) = hit(e, &mut cache_note)? {
                        running.kill();
                        tmp.close()?;
                        return Ok(Some(lib));
                    }
                }
            }
        }
    }
    let run = running.wait()?;
    if let Some(d) = &debug {
        d.write_log(cache_note.as_deref(), &run.output)?;
    }
    if run.timed_out {
        return Err(Error::CompileTimeout {
            command,
            seconds: config.timeout.as_secs_f64().ceil() as u64,
        });
    }
    if !run.status.success() {
        // GCC 12 sometimes emits invalid AVX-512 assembly from valid C (e.g. the mnemonic
        // `vinsert<i128vldq>`, which the assembler rejects). That is the compiler's bug, not
        // the program's: retry once without AVX-512 (the target is known by now).
        if !config.extra_flags.iter().any(|f| f == AVX512_FALLBACK_FLAG)
            && run.output.contains(b"Assembler messages")?
        {
            let mut retry = config.clone();
            retry.extra_flags.push(AVX512_FALLBACK_FLAG.to_string());
            tmp.close()?;
            return compile_for(&retry, None, source, file_stem, debug_files_in);
        }
        // The same for Clang crashing in its backend (an internal error, not the program's).
        if !config
            .extra_flags
            .iter()
            .any(|f| f == CLANG_BACKEND_FALLBACK_FLAG)
            && run.output.contains(b"error in backend")?
        {
            let mut retry = config.clone();
            retry
                .extra_flags
                .push(CLANG_BACKEND_FALLBACK_FLAG.to_string());
            tmp.close()?;
            return compile_for(&retry, None, source, file_stem, debug_files_in);
        }
        let output = failure_output(&run, &stem, &root, debug.as_ref())?;
        return Err(Error::Compile {
            command,
            output,
            source_path: debug_source(),
        });
    }

    let lib_path = tmp.path().join(&lib_name);
    // The path is unique to this compile (a fresh temporary directory), so dlopen cannot hand
    // back a stale library loaded earlier from the same path.
    let lib = open_library(&lib_path).map_err(|e| sanitize::explain_load_error(config, e))?;
    if let Some(e) = &entry {
        e.store(&lib_path);
    }
    tmp.close()?;

    Ok(Some(Arc::new(LoadedLibrary {
        lib,
        name: stem,
        path: lib_path,
        debug_source: debug_source(),
        from_cache: false,
    })))
}

/// The compiler's output for a compile error: its tail, with a pointer to a file holding all
/// of it when the tail is not everything, and a note on how the compiler ended where the
/// output does not say.
fn failure_output(
    run: &ProgramRun,
    stem: &str,
    root: &Path,
    debug: Option<&DebugOutput>,
) -> Result<String> {
    let tail = run.output.tail()?;
    let mut output = if tail.omitted == 0 {
        tail.text
    } else {
        let total = run.output.len()?;
        let kept = match debug {
            Some(d) => Ok(d.log_path()),
            None => keep_log(root, stem, &run.output),
        };
        let place = match kept {
            Ok(p) => format!("{KEPT_LOG_MARK}{}", p.display()),
            Err(e) => format!("it could not be kept: {e}"),
        };
        format!(
            "[the compiler printed {total} bytes; the first {} are omitted here, {place}]\n{}",
            tail.omitted, tail.text
        )
    };
    match (run.status.code(), run.status.signal()) {
        (_, Some(sig)) => output.push_str(&format!("\n[compiler terminated by signal {sig}]")),
        (Some(code), _) if output.trim().is_empty() => output.push_str(&format!(
            "[compiler exited with status {code} and printed nothing]"
        )),
        _ => {}
    }
    Ok(output)
}

/// The log a compile error's output says it kept in the temporary root (see
/// [`failure_output`]), if any.
fn kept_log_of(err: &Error) -> Option<PathBuf> {
    let Error::Compile { output, .. } = err else {
        return None;
    };
    let rest = output.split(KEPT_LOG_MARK).nth(1)?;
    let path = PathBuf::from(rest.split(']').next()?);
    let name = path.file_name()?.to_str()?;
    (name.starts_with("arrayjit-compile-") && name.ends_with(".log")).then_some(path)
}

/// What [`failure_output`] writes before the path of a kept log.
const KEPT_LOG_MARK: &str = "all of it is in ";

/// Keeps a compiler's whole output in `<root>/arrayjit-compile-<stem>-XXXXXX.log`.
fn keep_log(root: &Path, stem: &str, output: &Captured) -> Result<PathBuf> {
    let err = |e: io::Error| {
        Error::io(
            format!("keeping the compiler's output in {}", root.display()),
            e,
        )
    };
    let file = tempfile::Builder::new()
        .prefix(&format!("arrayjit-compile-{stem}-"))
        .suffix(".log")
        .tempfile_in(root)
        .map_err(err)?;
    {
        let mut w = io::BufWriter::new(file.as_file());
        output.write_to(&mut w).map_err(err)?;
        w.flush().map_err(err)?;
    }
    let (_, path) = file.keep().map_err(|e| err(e.error))?;
    Ok(path)
}

/// Writes `contents` to `path`, as an [`Error::Io`] naming the path on failure.
fn write_file(path: &Path, contents: &str) -> Result<()> {
    fs::write(path, contents).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stems() {
        assert_eq!(sanitize_stem("ab/../c d"), "ab____c_d");
        assert_eq!(sanitize_stem(""), "kernel");
        assert_eq!(sanitize_stem(&"x".repeat(100)).len(), 64);
        assert_eq!(sanitize_stem("é"), "_");
    }

    #[test]
    fn hashes_are_blake3_of_length_prefixed_parts() {
        use super::files::hash_hex;
        let h = hash_hex(&[b"ab", b"c"]);
        assert_eq!(h.len(), 64);
        assert!(h
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(h, hash_hex(&[b"ab", b"c"]));
        // Moving a byte from one part to the next changes the hash.
        assert_ne!(h, hash_hex(&[b"a", b"bc"]));
        assert_ne!(hash_hex(&[b""]), hash_hex(&[]));
        // BLAKE3 itself: 2 + 1 bytes of lengths (little-endian u64) and contents.
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&2u64.to_le_bytes());
        bytes.extend_from_slice(b"ab");
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(b"c");
        assert_eq!(h, blake3::hash(&bytes).to_hex().as_str());
    }
}
