//! Programs this module runs (the C compiler): finding them in `PATH` like the shell,
//! identifying them (path, size and modification time) so that an upgrade changes cache keys,
//! and quoting their command lines for people.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

/// The target triple the crate was built for (recorded by `build.rs`).
pub(super) const TARGET: &str = env!("ARRAYJIT_TARGET");

/// Whether the compiler is GCC (its resolved file name says so: `gcc`, `gcc-12`,
/// `x86_64-linux-gnu-gcc-12`, or `cc` pointing at one of those).
pub(super) fn is_gcc(compiler: &Path) -> bool {
    resolve_program(compiler)
        .and_then(|p| fs::canonicalize(p).ok())
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .is_some_and(|n| n.contains("gcc"))
}

/// The file a compiler setting names: a bare name looked up in `PATH`, else the path itself.
pub(super) fn resolve_program(compiler: &Path) -> Option<PathBuf> {
    if is_bare_name(compiler) {
        find_in_path(compiler.as_os_str())
    } else {
        Some(compiler.to_path_buf())
    }
}

/// A program's identity: its resolved path (symlinks followed, bare names looked up in
/// `PATH`) with the file's size and modification time (seconds and nanoseconds), so that
/// upgrading or replacing the program changes it. A `stat`, not a process. `None` if the
/// program cannot be resolved.
pub(super) fn program_identity(compiler: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let real = fs::canonicalize(resolve_program(compiler)?).ok()?;
    let meta = fs::metadata(&real).ok()?;
    Some(format!(
        "{} {} {} {}",
        real.display(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec()
    ))
}

/// Whether `p` is a program name to be looked up in `PATH` (no directory part).
pub(super) fn is_bare_name(p: &Path) -> bool {
    p.components().count() == 1 && !p.as_os_str().as_encoded_bytes().contains(&b'/')
}

/// Looks `name` up in `PATH` like the shell does (first regular file with an execute bit).
pub(super) fn find_in_path(name: &OsStr) -> Option<PathBuf> {
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
pub(super) fn shell_quote(word: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_./=+,:@%".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}
