//! Files this module writes and reads: content hashes, atomic writes, and files and
//! directories that must be private to this user (owned by them, writable by nobody else)
//! before they are trusted (the compile cache, memos of probes).

use crate::{Error, Result};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A stable hash of `parts` as 64 hexadecimal digits: BLAKE3 (256 bits) over the parts, each
/// preceded by its length, so that moving bytes from one part to the next changes the hash.
/// Cache keys and the names of the files remembered in the cache directory are such hashes;
/// a cached object is loaded and run, so its key must not collide by accident or design.
pub(super) fn hash_hex(parts: &[&[u8]]) -> String {
    let mut h = blake3::Hasher::new();
    for part in parts {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.finalize().to_hex().to_string()
}

/// Writes a small file atomically (temporary file of mode 0600 + rename) into the cache
/// directory, if that is trusted (`trusted_dir`, which creates it with mode 0700);
/// failures are ignored (used for memo files, which only save time).
pub(super) fn write_atomically(dest: &Path, contents: &str) {
    let Some(dir) = dest.parent() else { return };
    if !trusted_dir(dir) {
        return;
    }
    let Ok(mut tmp) = tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir) else {
        return;
    };
    if tmp.write_all(contents.as_bytes()).is_ok() {
        let _ = tmp.persist(dest);
    }
}

/// The effective user id of this process.
pub(super) fn euid() -> u32 {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Why the file described by `meta` is not a private regular file (or, with `dir`, directory)
/// of this user: not of that type, owned by another user, or writable by group or others.
/// `None` if it is one.
fn not_private(meta: &fs::Metadata, dir: bool) -> Option<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let ft = meta.file_type();
    let kind = if ft.is_dir() {
        "a directory"
    } else if ft.is_file() {
        "a regular file"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else {
        "a special file"
    };
    let wanted = if dir { ft.is_dir() } else { ft.is_file() };
    if !wanted {
        let expected = if dir { "a directory" } else { "a regular file" };
        return Some(format!("it is {kind}, not {expected}"));
    }
    let me = euid();
    if meta.uid() != me {
        return Some(format!(
            "it is owned by uid {}, not by this user (uid {me})",
            meta.uid()
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Some(format!(
            "its mode is {mode:04o}: {} can write to it",
            if mode & 0o020 != 0 && mode & 0o002 != 0 {
                "group and others"
            } else if mode & 0o020 != 0 {
                "its group"
            } else {
                "others"
            }
        ));
    }
    None
}

/// Opens `path` for reading without following a symbolic link and without blocking (on a
/// FIFO), and checks the opened file: a regular file of this user that group and others
/// cannot write, of at most `max_bytes`. `Ok(None)`: there is no such file.
///
/// The checks are made on the opened descriptor (`fstat`), and the caller reads through it,
/// so the file checked is the file read (renaming another file into place afterwards does
/// not change what the descriptor refers to).
pub(super) fn open_private(path: &Path, max_bytes: u64) -> Result<Option<fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let unsafe_file = |msg: String| Error::UnsafeFile {
        path: path.to_path_buf(),
        msg,
    };
    let file = match fs::File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        // O_NOFOLLOW on a symbolic link.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(unsafe_file(
                "it is a symbolic link, not a regular file".into(),
            ))
        }
        // A socket cannot be opened at all.
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            return Err(unsafe_file("it is a socket, not a regular file".into()))
        }
        Err(e) => return Err(Error::io(format!("opening {}", path.display()), e)),
    };
    let meta = file
        .metadata()
        .map_err(|e| Error::io(format!("examining {}", path.display()), e))?;
    if let Some(msg) = not_private(&meta, false) {
        return Err(unsafe_file(msg));
    }
    if meta.len() > max_bytes {
        return Err(unsafe_file(format!(
            "it holds {} bytes, more than the {max_bytes} a valid file can have",
            meta.len()
        )));
    }
    Ok(Some(file))
}

/// Reads the file `open_private` opened, at most `max_bytes` of it.
pub(super) fn read_all(path: &Path, file: &fs::File, max_bytes: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    if bytes.len() as u64 > max_bytes {
        return Err(Error::UnsafeFile {
            path: path.to_path_buf(),
            msg: format!("it grew beyond {max_bytes} bytes while it was read"),
        });
    }
    Ok(bytes)
}

/// A memo file of the cache directory (`detected-cc-*`, `target-*`) as text, if it exists,
/// the directory is trusted ([`trusted_dir`]) and the file passes [`open_private`]'s checks
/// with at most `max_bytes`. A file that exists but is refused is logged as a warning (it is
/// rewritten by the caller's fresh answer).
pub(super) fn read_memo(path: &Path, max_bytes: u64) -> Option<String> {
    if !path.parent().is_some_and(trusted_dir) {
        return None;
    }
    let read = open_private(path, max_bytes)
        .and_then(|f| f.map(|f| read_all(path, &f, max_bytes)).transpose());
    match read {
        Ok(Some(bytes)) => String::from_utf8(bytes).ok(),
        Ok(None) => None,
        Err(e) => {
            if matches!(e, Error::UnsafeFile { .. }) {
                tracing::warn!(target: "arrayjit::compile", "compile cache: {e}; ignoring it");
            }
            None
        }
    }
}

/// Creates `dir` (and missing parents) with mode 0700 if it does not exist, then checks that
/// it can hold the cache: see the rules above. The error names the directory and what is
/// wrong with it.
pub(super) fn check_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::io(format!("creating the directory {}", dir.display()), e))?;
    // The directory itself may be reached through a symbolic link (a cache directory moved
    // to another disk); the directory it names is the one checked.
    let meta = fs::metadata(dir)
        .map_err(|e| Error::io(format!("examining the directory {}", dir.display()), e))?;
    if let Some(msg) = not_private(&meta, true) {
        return Err(Error::UnsafeFile {
            path: dir.to_path_buf(),
            msg,
        });
    }
    // The directories above it, as written and as resolved: one that group or others can
    // write without the sticky bit lets another user replace the cache directory.
    let absolute = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let resolved = fs::canonicalize(dir).unwrap_or_else(|_| absolute.clone());
    for chain in [&absolute, &resolved] {
        for parent in chain.ancestors().skip(1) {
            let Ok(meta) = fs::metadata(parent) else {
                continue;
            };
            let mode = meta.mode() & 0o7777;
            if mode & 0o022 != 0 && mode & 0o1000 == 0 {
                return Err(Error::UnsafeFile {
                    path: dir.to_path_buf(),
                    msg: format!(
                        "the directory {} above it has mode {mode:04o}: others can write to \
                         it (and it has no sticky bit), so they could replace the cache \
                         directory",
                        parent.display()
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Whether the cache directory `dir` may be used ([`check_private_dir`]); if not, a warning
/// saying why and that the cache is not used is logged, once per directory and process.
pub(super) fn trusted_dir(dir: &Path) -> bool {
    use std::collections::HashSet;
    use std::sync::{LazyLock, Mutex};
    static WARNED: LazyLock<Mutex<HashSet<PathBuf>>> = LazyLock::new(Mutex::default);
    match check_private_dir(dir) {
        Ok(()) => true,
        Err(e) => {
            let first = WARNED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(dir.to_path_buf());
            if first {
                tracing::warn!(
                    target: "arrayjit::compile",
                    "compile cache not used: {e} (compiling without the cache; use a directory \
                     only you can write, e.g. `chmod 700` it, or set ARRAYJIT_CACHE_DIR)"
                );
            }
            false
        }
    }
}
