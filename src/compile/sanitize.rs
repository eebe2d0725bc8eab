//! Sanitizers in the compiler flags (`ARRAYJIT_CFLAGS=-fsanitize=address`).
//!
//! A library compiled with a sanitizer needs the sanitizer's runtime in the process that loads
//! it, and most runtimes must be there from the start: loaded with `LD_PRELOAD` (or linked into
//! the program). Without it, GCC's AddressSanitizer runtime ends the whole process as soon as
//! the library is loaded ("ASan runtime does not come first in initial library list"), and the
//! others fail to load (`cannot allocate memory in static TLS block`, or `undefined symbol:
//! __tsan_init` with Clang). So before anything is compiled, [`check_runtimes`] looks for the
//! runtimes of AddressSanitizer, HWAddressSanitizer, ThreadSanitizer and MemorySanitizer in
//! the process and returns [`Error::Sanitizer`] saying how to preload them; and a load failure
//! that names a sanitizer's symbol or the static TLS block becomes the same error
//! ([`explain_load_error`]). (UndefinedBehaviorSanitizer and LeakSanitizer work without
//! preloading with some compilers — GCC's UBSan, Clang's LSan — so they are only explained
//! when loading fails.)
//!
//! The compiler itself must not run with a sanitizer runtime preloaded (its leaks would be
//! reported and fail the compile): [`compiler_preload`] removes them from the compiler's
//! `LD_PRELOAD`.

use std::ffi::{CString, OsString};

use super::cleanup::WorkDir;
use super::config::CompilerConfig;
use super::programs::is_gcc;
use super::run::{is_sanitizer_runtime, run_compiler};
use crate::{Error, Result};

/// A sanitizer with a runtime library.
struct Sanitizer {
    /// Its name in `-fsanitize=`.
    flag: &'static str,
    /// Its name for people.
    title: &'static str,
    /// A symbol its runtime defines.
    symbol: &'static str,
    /// Names of its shared runtime, GCC's first, for `<cc> -print-file-name=NAME`
    /// (`{arch}`: the architecture, as in Clang's `libclang_rt.asan-x86_64.so`).
    libraries: &'static [&'static str],
    /// Whether its runtime must be loaded before a library compiled with it, with every
    /// compiler (else only a failure to load is explained).
    always_needed: bool,
}

/// The sanitizers with runtimes, in the order their runtimes go in `LD_PRELOAD`.
const SANITIZERS: [Sanitizer; 6] = [
    Sanitizer {
        flag: "address",
        title: "AddressSanitizer",
        symbol: "__asan_init",
        libraries: &[
            "libasan.so",
            "libclang_rt.asan-{arch}.so",
            "libclang_rt.asan.so",
        ],
        always_needed: true,
    },
    Sanitizer {
        flag: "hwaddress",
        title: "HWAddressSanitizer",
        symbol: "__hwasan_init",
        libraries: &[
            "libhwasan.so",
            "libclang_rt.hwasan-{arch}.so",
            "libclang_rt.hwasan.so",
        ],
        always_needed: true,
    },
    Sanitizer {
        flag: "thread",
        title: "ThreadSanitizer",
        symbol: "__tsan_init",
        libraries: &[
            "libtsan.so",
            "libclang_rt.tsan-{arch}.so",
            "libclang_rt.tsan.so",
        ],
        always_needed: true,
    },
    Sanitizer {
        flag: "memory",
        title: "MemorySanitizer",
        symbol: "__msan_init",
        libraries: &["libclang_rt.msan-{arch}.so", "libclang_rt.msan.so"],
        always_needed: true,
    },
    Sanitizer {
        flag: "leak",
        title: "LeakSanitizer",
        // Defined by LeakSanitizer's runtime and by AddressSanitizer's, which includes it.
        symbol: "__lsan_do_leak_check",
        libraries: &[
            "liblsan.so",
            "libclang_rt.lsan-{arch}.so",
            "libclang_rt.lsan.so",
        ],
        always_needed: false,
    },
    Sanitizer {
        flag: "undefined",
        title: "UndefinedBehaviorSanitizer",
        symbol: "__ubsan_handle_add_overflow",
        libraries: &[
            "libubsan.so",
            "libclang_rt.ubsan_standalone-{arch}.so",
            "libclang_rt.ubsan_standalone.so",
        ],
        always_needed: false,
    },
];

/// The checks of `-fsanitize=undefined` that can be asked for one by one.
const UNDEFINED_CHECKS: [&str; 34] = [
    "alignment",
    "array-bounds",
    "bool",
    "bounds",
    "bounds-strict",
    "builtin",
    "enum",
    "float-cast-overflow",
    "float-divide-by-zero",
    "function",
    "implicit-conversion",
    "implicit-integer-sign-change",
    "implicit-integer-truncation",
    "implicit-signed-integer-truncation",
    "implicit-unsigned-integer-truncation",
    "integer",
    "integer-divide-by-zero",
    "local-bounds",
    "nonnull-attribute",
    "null",
    "nullability",
    "nullability-arg",
    "nullability-assign",
    "nullability-return",
    "object-size",
    "pointer-overflow",
    "return",
    "returns-nonnull-attribute",
    "shift",
    "shift-base",
    "shift-exponent",
    "signed-integer-overflow",
    "unreachable",
    "vla-bound",
];

/// The sanitizers (indices into [`SANITIZERS`]) that `config`'s flags turn on and whose
/// runtime the compiled code calls: `-fsanitize=` lists, less `-fno-sanitize=` lists (later
/// flags win), UndefinedBehaviorSanitizer not when its checks trap
/// (`-fsanitize-undefined-trap-on-error`, `-fsanitize-trap`, `-fsanitize-trap=undefined`
/// or `=all`) or use the minimal runtime.
fn requested(config: &CompilerConfig) -> Vec<usize> {
    let mut on = [false; SANITIZERS.len()];
    let mut ub_runtime = true;
    let index = |name: &str| -> Vec<usize> {
        let name = if UNDEFINED_CHECKS.contains(&name) {
            "undefined"
        } else {
            name
        };
        if name == "all" {
            return (0..SANITIZERS.len()).collect();
        }
        SANITIZERS
            .iter()
            .position(|s| s.flag == name)
            .into_iter()
            .collect()
    };
    for flag in config.arch_flags.iter().chain(&config.extra_flags) {
        if let Some(list) = flag.strip_prefix("-fsanitize=") {
            for name in list.split(',') {
                // `-fsanitize=all` is not accepted by compilers; only `-fno-sanitize=all` is.
                if name != "all" {
                    for i in index(name) {
                        on[i] = true;
                    }
                }
            }
        } else if let Some(list) = flag.strip_prefix("-fno-sanitize=") {
            for name in list.split(',') {
                for i in index(name) {
                    on[i] = false;
                }
            }
        } else if flag == "-fsanitize-undefined-trap-on-error"
            || flag == "-fsanitize-trap"
            || flag == "-fsanitize-minimal-runtime"
            || flag
                .strip_prefix("-fsanitize-trap=")
                .is_some_and(|l| l.split(',').any(|n| n == "undefined" || n == "all"))
        {
            ub_runtime = false;
        }
    }
    if !ub_runtime {
        on[SANITIZERS.len() - 1] = false;
    }
    (0..SANITIZERS.len()).filter(|&i| on[i]).collect()
}

/// Whether `symbol` is defined in the process (`dlsym(RTLD_DEFAULT, ...)`).
fn defined(symbol: &str) -> bool {
    let Ok(name) = CString::new(symbol) else {
        return false;
    };
    // SAFETY: `name` is a NUL-terminated string that outlives the call; dlsym only looks the
    // symbol up (nothing is called or dereferenced).
    !unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }.is_null()
}

/// Fails with [`Error::Sanitizer`] when `config`'s flags ask for a sanitizer that needs its
/// runtime loaded first and the runtime is not in the process (see the module
/// documentation). Costs a `dlsym` per requested sanitizer; the compiler only runs (to find
/// the runtime's path for the message) on failure.
pub(super) fn check_runtimes(config: &CompilerConfig) -> Result<()> {
    let wanted = requested(config);
    if wanted
        .iter()
        .any(|&i| SANITIZERS[i].always_needed && !defined(SANITIZERS[i].symbol))
    {
        return Err(missing_runtime(config, &wanted));
    }
    Ok(())
}

/// Turns a failure to load a library compiled with `config` into [`Error::Sanitizer`] when
/// the flags ask for a sanitizer and the failure is the missing runtime's (an undefined
/// sanitizer symbol, or no room in the static TLS block for the runtime loaded late).
pub(super) fn explain_load_error(config: &CompilerConfig, err: Error) -> Error {
    let Error::Load { msg, .. } = &err else {
        return err;
    };
    let wanted = requested(config);
    let sanitizer_symbol = [
        "__asan_",
        "__hwasan_",
        "__tsan_",
        "__msan_",
        "__lsan_",
        "__ubsan_",
    ]
    .iter()
    .any(|p| msg.contains(&format!("undefined symbol: {p}")));
    let late_runtime = msg.contains("static TLS block")
        && msg
            .split(|c: char| c.is_whitespace() || c == ':')
            .any(|word| is_sanitizer_runtime(word.as_bytes()));
    let missing = wanted.iter().any(|&i| !defined(SANITIZERS[i].symbol));
    if !wanted.is_empty() && missing && (sanitizer_symbol || late_runtime) {
        missing_runtime(config, &wanted)
    } else {
        err
    }
}

/// The error for sanitizers `wanted` (some of whose runtimes are missing), with the command
/// prefix that preloads their runtimes.
fn missing_runtime(config: &CompilerConfig, wanted: &[usize]) -> Error {
    let missing: Vec<&Sanitizer> = wanted
        .iter()
        .map(|&i| &SANITIZERS[i])
        .filter(|s| !defined(s.symbol))
        .collect();
    let names: Vec<String> = missing
        .iter()
        .map(|s| format!("{} (-fsanitize={})", s.title, s.flag))
        .collect();
    // Every requested runtime, so that the preloaded ones come first and in order.
    let preload: Vec<String> = wanted
        .iter()
        .map(|&i| &SANITIZERS[i])
        // AddressSanitizer's runtime includes LeakSanitizer.
        .filter(|s| !(s.flag == "leak" && wanted.contains(&0)))
        .map(|s| {
            runtime_path(config, s).unwrap_or_else(|| {
                format!(
                    "$({} -print-file-name={})",
                    config.compiler.display(),
                    s.libraries[0].replace("{arch}", std::env::consts::ARCH)
                )
            })
        })
        .collect();
    let mut fix = format!("LD_PRELOAD=\"{}\"", preload.join(" "));
    if wanted.contains(&0) {
        // The program itself is not instrumented: leak reports at its exit would be noise.
        fix.push_str(" ASAN_OPTIONS=detect_leaks=0");
    }
    Error::Sanitizer {
        sanitizers: names.join(" and "),
        fix,
    }
}

/// The path of `s`'s shared runtime as `config`'s compiler finds it
/// (`<cc> -print-file-name=NAME` prints a path it found, or NAME itself).
fn runtime_path(config: &CompilerConfig, s: &Sanitizer) -> Option<String> {
    let root = config.temp_root.clone().unwrap_or_else(std::env::temp_dir);
    let dir = WorkDir::create(&root).ok()?;
    let mut found = None;
    // Clang finds GCC's runtimes too, but its code needs its own: ask for its names first.
    let mut names: Vec<&str> = s.libraries.to_vec();
    if !is_gcc(&config.compiler) {
        names.sort_by_key(|n| !n.starts_with("libclang_rt."));
    }
    for name in names {
        let name = name.replace("{arch}", std::env::consts::ARCH);
        let arg = OsString::from(format!("-print-file-name={name}"));
        let command = format!("{} {}", config.compiler.display(), arg.to_string_lossy());
        let quick = CompilerConfig {
            timeout: config.timeout.min(std::time::Duration::from_secs(30)),
            ..config.clone()
        };
        let Ok(run) = run_compiler(&quick, &[arg], dir.path(), &command) else {
            continue;
        };
        let text = run
            .output
            .stdout_text(4096)
            .ok()
            .flatten()
            .unwrap_or_default();
        let path = text.trim();
        if run.status.success() && path.starts_with('/') && std::path::Path::new(path).exists() {
            found = Some(path.to_string());
            break;
        }
    }
    let _ = dir.close();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(flags: &[&str]) -> CompilerConfig {
        CompilerConfig {
            compiler: "cc".into(),
            opt_level: "3".into(),
            arch_flags: vec![],
            extra_flags: flags.iter().map(|f| f.to_string()).collect(),
            debug_dir: None,
            trace_dir: None,
            timeout: std::time::Duration::from_secs(60),
            temp_root: None,
            cache_dir: None,
            cache_max_bytes: 1 << 30,
            compile_jobs: 1,
            intrinsics: false,
            bf16_dot: false,
            checked: false,
        }
    }

    fn flags_of(flags: &[&str]) -> Vec<&'static str> {
        requested(&config(flags))
            .into_iter()
            .map(|i| SANITIZERS[i].flag)
            .collect()
    }

    #[test]
    fn sanitizers_are_read_from_the_flags() {
        assert!(flags_of(&["-g", "-O1", "-fsanitize-recover=all"]).is_empty());
        assert_eq!(flags_of(&["-fsanitize=address"]), ["address"]);
        assert_eq!(
            flags_of(&["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]),
            ["address", "undefined"]
        );
        assert_eq!(
            flags_of(&["-fsanitize=undefined", "-fsanitize=thread"]),
            ["thread", "undefined"]
        );
        assert_eq!(
            flags_of(&["-fsanitize=signed-integer-overflow"]),
            ["undefined"]
        );
        assert!(flags_of(&["-fsanitize=address", "-fno-sanitize=address"]).is_empty());
        assert!(flags_of(&["-fsanitize=address,leak", "-fno-sanitize=all"]).is_empty());
        assert_eq!(
            flags_of(&["-fno-sanitize=all", "-fsanitize=leak"]),
            ["leak"]
        );
        assert!(flags_of(&["-fsanitize=undefined", "-fsanitize-trap=undefined"]).is_empty());
        assert!(
            flags_of(&["-fsanitize=undefined", "-fsanitize-undefined-trap-on-error"]).is_empty()
        );
        assert!(flags_of(&["-fsanitize=bounds", "-fsanitize-minimal-runtime"]).is_empty());
        assert_eq!(
            flags_of(&["-fsanitize=fuzzer-no-link,bogus"]),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn missing_runtimes_are_an_error_that_says_what_to_preload() {
        // This test process has no sanitizer runtime loaded.
        assert!(!defined("__asan_init"));
        assert!(defined("malloc"));
        check_runtimes(&config(&["-fsanitize=undefined"])).unwrap();
        check_runtimes(&config(&["-fsanitize=leak"])).unwrap();
        check_runtimes(&config(&[])).unwrap();
        let cc = super::super::detect::detect_compiler(None).unwrap();
        let cfg = CompilerConfig {
            compiler: cc,
            ..config(&["-fsanitize=address,undefined"])
        };
        let e = check_runtimes(&cfg).unwrap_err();
        assert!(matches!(e, Error::Sanitizer { .. }), "{e:?}");
        let msg = e.to_string();
        for part in [
            "AddressSanitizer (-fsanitize=address)",
            "LD_PRELOAD=\"",
            "ASAN_OPTIONS=detect_leaks=0",
        ] {
            assert!(msg.contains(part), "{part:?} not in {msg}");
        }
        // Both runtimes are preloaded, AddressSanitizer's first.
        let preload = msg.split("LD_PRELOAD=\"").nth(1).unwrap();
        let asan = preload.find("asan").unwrap();
        assert!(preload[asan..].contains("ubsan"), "{msg}");
    }

    #[test]
    fn load_failures_of_sanitized_code_are_explained() {
        let load = |msg: &str| Error::Load {
            path: "/tmp/x/liba.so".into(),
            msg: msg.into(),
        };
        let cfg = config(&["-fsanitize=undefined"]);
        let e = explain_load_error(
            &cfg,
            load("/tmp/x/liba.so: undefined symbol: __ubsan_handle_pointer_overflow"),
        );
        let msg = e.to_string();
        assert!(
            msg.contains("UndefinedBehaviorSanitizer (-fsanitize=undefined)"),
            "{msg}"
        );
        assert!(msg.contains("LD_PRELOAD="), "{msg}");
        let e = explain_load_error(
            &config(&["-fsanitize=leak"]),
            load("/lib/x86_64-linux-gnu/liblsan.so.0: cannot allocate memory in static TLS block"),
        );
        assert!(e.to_string().contains("LeakSanitizer"), "{e}");
        // Other failures, and flags without sanitizers, stay as they are.
        let e = explain_load_error(&cfg, load("undefined symbol: my_function"));
        assert!(matches!(e, Error::Load { .. }), "{e}");
        let e = explain_load_error(&config(&[]), load("undefined symbol: __asan_report_load4"));
        assert!(matches!(e, Error::Load { .. }), "{e}");
    }
}
