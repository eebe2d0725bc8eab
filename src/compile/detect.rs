//! Finding a C compiler when neither `ARRAYJIT_CC` nor `CC` names one: the `cc` crate's
//! choice for the target the crate was built for (on Unix, `cc` from `PATH`, found without
//! running it; otherwise the crate is asked).
//!
//! The crate's detection runs the compiler, so the answer is kept for the
//! process and, with a cache directory, in a file `detected-cc-<hash>` there (the hash covers
//! the target and `PATH`). The file has a fixed, validated format:
//!
//! ```text
//! arrayjit detected C compiler, format 1
//! target x86_64-unknown-linux-gnu
//! path /usr/bin/cc
//! identity /usr/bin/x86_64-linux-gnu-gcc-12 1234567 1700000000 0
//! ```
//!
//! (`identity`: the resolved path, size and modification time of the compiler). A file that
//! does not have exactly this form, names another target, or whose identity no longer matches
//! the compiler on disk is ignored and rewritten by a fresh detection. When a compile with a
//! compiler read from such a file fails and the compiler cannot build a trivial library
//! either, [`redetect`] runs a fresh detection; the caller retries if it finds another
//! compiler, and otherwise names the file in the error.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};

use super::files::{hash_hex, read_memo, trusted_dir, write_atomically};
use super::programs::{find_in_path, program_identity, TARGET};
use crate::{Error, Result};

/// The first line of a `detected-cc-*` file.
const HEADER: &str = "arrayjit detected C compiler, format 1";

/// What this process knows about a detection.
#[derive(Clone, Debug)]
struct Detected {
    /// The compiler.
    path: PathBuf,
    /// The file it was read from, while no fresh detection in this process confirmed it.
    remembered_in: Option<PathBuf>,
}

/// The process's detections, by the file that remembers them (`None`: no cache directory).
/// Failures are kept as their messages, so a failing detection is not repeated for every
/// compile.
type Memo = HashMap<Option<PathBuf>, std::result::Result<Detected, String>>;

fn memo() -> std::sync::MutexGuard<'static, Memo> {
    static MEMO: LazyLock<Mutex<Memo>> = LazyLock::new(|| Mutex::new(HashMap::new()));
    // The memo holds plain data and is never left half-updated, so a poisoned lock is usable.
    MEMO.lock().unwrap_or_else(|e| e.into_inner())
}

/// The file in `cache_dir` that remembers the detection for this target and `PATH`.
pub(super) fn memo_file(cache_dir: &Path) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let key = hash_hex(&[b"detected-cc", TARGET.as_bytes(), path.as_encoded_bytes()]);
    cache_dir.join(format!("detected-cc-{key}"))
}

/// The compiler the `cc` crate chooses for the crate's target, remembered as described in the
/// module documentation.
pub(super) fn detect_compiler(cache_dir: Option<&Path>) -> Result<PathBuf> {
    // An untrusted cache directory (see `cache::trusted_dir`, which warns) remembers nothing.
    let file = cache_dir.filter(|d| trusted_dir(d)).map(memo_file);
    let mut memo = memo();
    let entry = memo.entry(file.clone()).or_insert_with(|| {
        if let Some(f) = &file {
            if let Some(path) = read_memo_file(f) {
                return Ok(Detected {
                    path,
                    remembered_in: Some(f.clone()),
                });
            }
        }
        let path = detect_now().map_err(|e| e.to_string())?;
        if let Some(f) = &file {
            write_memo_file(f, &path);
        }
        Ok(Detected {
            path,
            remembered_in: None,
        })
    });
    entry
        .clone()
        .map(|d| d.path)
        .map_err(|msg| match msg.strip_prefix("C compiler not found: ") {
            Some(m) => Error::CompilerNotFound(m.to_string()),
            None => Error::CompilerNotFound(msg),
        })
}

/// The file `compiler` was read from, if this process took it from a `detected-cc-*` file
/// and no fresh detection has confirmed it since.
pub(super) fn remembered(compiler: &Path) -> Option<PathBuf> {
    memo().values().find_map(|d| match d {
        Ok(d) if d.path == compiler => d.remembered_in.clone(),
        _ => None,
    })
}

/// Records that `compiler` works (it built a trivial library), so that failures with it are
/// no longer blamed on the file that remembered it.
pub(super) fn confirm(compiler: &Path) {
    for d in memo().values_mut().flatten() {
        if d.path == compiler {
            d.remembered_in = None;
        }
    }
}

/// Runs a fresh detection for the compiler remembered in `file`, rewrites the file and the
/// process's memo with the answer, and returns it (`None` if the detection failed).
pub(super) fn redetect(file: &Path) -> Option<PathBuf> {
    let path = detect_now().ok()?;
    write_memo_file(file, &path);
    memo().insert(
        Some(file.to_path_buf()),
        Ok(Detected {
            path: path.clone(),
            remembered_in: None,
        }),
    );
    Some(path)
}

/// Reads a `detected-cc-*` file; `None` unless it is exactly in the documented format, for
/// this target, and the compiler it names is still the same file.
///
/// The file names a program that is run, so it is only read if the cache directory and the
/// file are this user's alone (see [`read_memo`]): a file another user owns or could have
/// written is ignored with a warning, and the compiler detected afresh.
fn read_memo_file(file: &Path) -> Option<PathBuf> {
    // A valid file is a few hundred bytes; never read a huge one.
    let text = read_memo(file, 64 * 1024)?;
    let mut lines = text.strip_suffix('\n')?.split('\n');
    if lines.next()? != HEADER {
        return None;
    }
    if lines.next()?.strip_prefix("target ")? != TARGET {
        return None;
    }
    let path = PathBuf::from(lines.next()?.strip_prefix("path ")?);
    let identity = lines.next()?.strip_prefix("identity ")?;
    if lines.next().is_some() || path.as_os_str().is_empty() {
        return None;
    }
    (program_identity(&path)? == identity).then_some(path)
}

/// Writes a `detected-cc-*` file (atomically; failures only cost the memo).
fn write_memo_file(file: &Path, compiler: &Path) {
    let (Some(path), Some(identity)) = (compiler.to_str(), program_identity(compiler)) else {
        return;
    };
    if path.contains('\n') {
        return;
    }
    write_atomically(
        file,
        &format!("{HEADER}\ntarget {TARGET}\npath {path}\nidentity {identity}\n"),
    );
}

/// Detects the compiler now: the `cc` crate's default on Unix targets, `cc` from `PATH`, is
/// looked up without running anything (the crate would run the compiler twice to learn its
/// family, about 9 ms); the crate decides when one of its own variables is set or `cc` is not
/// on `PATH`.
fn detect_now() -> Result<PathBuf> {
    let crate_vars = [
        format!("CC_{TARGET}"),
        format!("CC_{}", TARGET.replace('-', "_")),
        "TARGET_CC".to_string(),
        "HOST_CC".to_string(),
    ];
    if cfg!(unix)
        && !crate_vars.iter().any(|v| std::env::var_os(v).is_some())
        && find_in_path(std::ffi::OsStr::new("cc")).is_some()
    {
        return Ok(PathBuf::from("cc"));
    }
    detect_with_the_cc_crate()
}

/// Asks the `cc` crate.
fn detect_with_the_cc_crate() -> Result<PathBuf> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn detection_works_and_is_remembered_in_a_valid_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = detect_compiler(Some(dir.path())).unwrap();
        assert!(!p.as_os_str().is_empty());
        assert_eq!(read_memo_file(&memo_file(dir.path())), Some(p.clone()));
        // Without a cache directory too (the cc crate must not panic outside a build script).
        assert_eq!(detect_compiler(None).unwrap(), p);
    }

    #[test]
    fn invalid_memo_files_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("detected-cc-x");
        let good = |path: &str| {
            format!(
                "{HEADER}\ntarget {TARGET}\npath {path}\nidentity {}\n",
                program_identity(Path::new(path)).unwrap()
            )
        };
        fs::write(&f, good("/bin/sh")).unwrap();
        assert_eq!(read_memo_file(&f), Some(PathBuf::from("/bin/sh")));
        for bad in [
            "false".to_string(),
            "false\n".to_string(),
            String::new(),
            "/nonexistent/cc\n".to_string(),
            good("/bin/sh").replace("format 1", "format 2"),
            good("/bin/sh").replace(TARGET, "riscv64gc-unknown-linux-gnu"),
            good("/bin/sh").replace("identity /", "identity /x"),
            format!("{}extra\n", good("/bin/sh")),
            good("/bin/sh").trim_end().to_string(),
            format!(
                "{HEADER}\ntarget {TARGET}\npath /nonexistent/cc\nidentity /nonexistent/cc 1 2 3\n"
            ),
        ] {
            fs::write(&f, &bad).unwrap();
            assert_eq!(read_memo_file(&f), None, "{bad:?}");
        }
        fs::write(&f, [0u8, 0xff, 0xfe, b'\n', 7]).unwrap();
        assert_eq!(read_memo_file(&f), None);
        fs::remove_file(&f).unwrap();
        fs::create_dir(&f).unwrap();
        assert_eq!(read_memo_file(&f), None);
    }
}
