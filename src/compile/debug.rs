//! The debug directory (`ARRAYJIT_DEBUG_DIR`): what one compile keeps there — the source
//! under a stem nobody has used yet, the runtime header, the command line, the compiler's
//! output and the caller's extra files.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::run::Captured;
use super::RUNTIME_HEADER;
use crate::{Error, Result};

/// File extensions the compile stage itself writes into the debug directory.
const RESERVED_EXTENSIONS: [&str; 3] = ["c", "cmd", "log"];

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

/// Sanitizes the debug file names and rejects reserved or duplicate ones.
pub(super) fn check_debug_files(files: &[DebugFile]) -> Result<Vec<(String, &str)>> {
    let mut out: Vec<(String, &str)> = Vec::with_capacity(files.len());
    for f in files {
        let name = sanitize_debug_name(&f.name);
        if RESERVED_EXTENSIONS.contains(&name.as_str()) {
            return Err(Error::DebugFileName {
                name: f.name.clone(),
                problem: "is reserved for the compile stage's own files".into(),
            });
        }
        if out.iter().any(|(n, _)| *n == name) {
            return Err(Error::DebugFileName {
                name: f.name.clone(),
                problem: "is given twice".into(),
            });
        }
        out.push((name, &f.contents));
    }
    Ok(out)
}

/// The files kept in the debug directory for one compile.
///
/// The debug directory may be shared with other users (a project directory, `/tmp/debug`), so
/// nothing there is ever opened by a name that someone else could have planted: every file of
/// a compile (`<stem>.c`, `.cmd`, `.log` and the extra files) is created exclusively
/// (`O_CREAT | O_EXCL`, plus `O_NOFOLLOW`) when the stem is claimed, and written later through
/// the descriptor kept here. A symbolic link or any other file already at one of these names
/// makes the stem taken, never followed or truncated. The runtime header `arrayjit.h`, shared
/// by all compiles, is only read if it is a regular file (opened without following links and
/// without blocking on a FIFO) and is replaced by a rename otherwise.
pub(super) struct DebugOutput {
    /// The debug directory.
    pub(super) dir: PathBuf,
    /// The stem claimed in it (the requested one, possibly with a numeric suffix).
    pub(super) stem: String,
    /// `<dir>/<stem>.c`.
    pub(super) source_path: PathBuf,
    /// `<stem>.cmd`, created when the stem was claimed.
    cmd: File,
    /// `<stem>.log`, created when the stem was claimed.
    log: File,
}

/// Creates `path` exclusively (failing if anything, even a dangling symbolic link, is there).
fn create_exclusive(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

impl DebugOutput {
    /// Creates `dir` if needed (mode 0700), claims a stem nobody has used there yet by
    /// creating all of its files exclusively, and writes the source, the runtime header and
    /// `extra`.
    pub(super) fn create(
        dir: &Path,
        stem: &str,
        source: &str,
        extra: &[(String, &str)],
    ) -> Result<Self> {
        let dir_err = |what: &str, e: io::Error| {
            Error::io(format!("debug directory {}: {what}", dir.display()), e)
        };
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| dir_err("cannot create it", e))?;

        let extensions: Vec<&str> = RESERVED_EXTENSIONS
            .iter()
            .copied()
            .chain(extra.iter().map(|(n, _)| n.as_str()))
            .collect();
        let mut claimed = None;
        'stems: for n in 0..100_000u32 {
            let candidate = if n == 0 {
                stem.to_string()
            } else {
                format!("{stem}_{n}")
            };
            // Skip stems whose companion files exist (left over from an older run) without
            // creating anything.
            if extensions.iter().any(|ext| {
                dir.join(format!("{candidate}.{ext}"))
                    .symlink_metadata()
                    .is_ok()
            }) {
                continue;
            }
            // Claim every file of the stem; if one appeared meanwhile, give the stem up.
            let mut files: Vec<(PathBuf, File)> = Vec::with_capacity(extensions.len());
            for ext in &extensions {
                let path = dir.join(format!("{candidate}.{ext}"));
                match create_exclusive(&path) {
                    Ok(f) => files.push((path, f)),
                    Err(e) => {
                        for (p, _) in &files {
                            let _ = fs::remove_file(p);
                        }
                        if e.kind() == io::ErrorKind::AlreadyExists
                            || e.raw_os_error() == Some(libc::ELOOP)
                        {
                            continue 'stems;
                        }
                        return Err(dir_err(&format!("cannot create {candidate}.{ext}"), e));
                    }
                }
            }
            claimed = Some((candidate, files));
            break;
        }
        let (stem, files) = claimed.ok_or_else(|| {
            dir_err(
                &format!("no free file name for {stem}.c"),
                io::Error::from(io::ErrorKind::AlreadyExists),
            )
        })?;
        // The files in the order of `extensions`: c, cmd, log, then the extra files.
        let mut files = files.into_iter();
        let mut take = || {
            files
                .next()
                .ok_or_else(|| Error::Internal("debug files missing".into()))
        };
        let (source_path, c) = take()?;
        let (_, cmd) = take()?;
        let (_, log) = take()?;
        write_to(&source_path, &c, source)?;
        c.sync_all()
            .map_err(|e| Error::io(format!("writing {}", source_path.display()), e))?;
        for (_, contents) in extra {
            let (path, file) = take()?;
            write_to(&path, &file, contents)?;
        }

        write_header(dir)?;
        Ok(DebugOutput {
            dir: dir.to_path_buf(),
            stem,
            source_path,
            cmd,
            log,
        })
    }

    /// Writes the command line into `<stem>.cmd`.
    pub(super) fn write_cmd(&self, contents: &str) -> Result<()> {
        write_to(&self.path("cmd"), &self.cmd, contents)
    }

    /// Writes a note (a cache hit) into `<stem>.log`.
    pub(super) fn write_log_note(&self, contents: &str) -> Result<()> {
        write_to(&self.log_path(), &self.log, contents)
    }

    /// `<dir>/<stem>.<ext>`.
    fn path(&self, ext: &str) -> PathBuf {
        self.dir.join(format!("{}.{ext}", self.stem))
    }

    /// `<dir>/<stem>.log`.
    pub(super) fn log_path(&self) -> PathBuf {
        self.path("log")
    }

    /// Writes the compiler's whole output (streamed, never held in memory) to `<stem>.log`,
    /// after `note` if there is one.
    pub(super) fn write_log(&self, note: Option<&str>, output: &Captured) -> Result<()> {
        let path = self.log_path();
        let err = |e: io::Error| Error::io(format!("writing {}", path.display()), e);
        let mut w = io::BufWriter::new(&self.log);
        if let Some(n) = note {
            writeln!(w, "[{n}]").map_err(err)?;
        }
        output.write_to(&mut w).map_err(err)?;
        w.flush().map_err(err)
    }
}

/// Writes `contents` through `file` (created for `path`), as an [`Error::Io`] naming the path.
fn write_to(path: &Path, mut file: &File, contents: &str) -> Result<()> {
    file.write_all(contents.as_bytes())
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// Puts the runtime header into the debug directory unless an identical copy is there already.
/// The header is replaced atomically, because other compiles may be reading it concurrently.
/// The existing file is only read if it is a regular file of the header's size (opened with
/// `O_NOFOLLOW | O_NONBLOCK`, so a FIFO or a link to a device is never read or waited on);
/// anything else at that name is replaced.
fn write_header(dir: &Path) -> Result<()> {
    let path = dir.join("arrayjit.h");
    let same = || -> io::Result<bool> {
        let mut f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&path)?;
        let meta = f.metadata()?;
        if !meta.is_file() || meta.len() != RUNTIME_HEADER.len() as u64 {
            return Ok(false);
        }
        let mut old = Vec::with_capacity(RUNTIME_HEADER.len());
        (&mut f)
            .take(RUNTIME_HEADER.len() as u64)
            .read_to_end(&mut old)?;
        Ok(old == RUNTIME_HEADER.as_bytes())
    };
    if same().unwrap_or(false) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_names() {
        assert_eq!(sanitize_debug_name("../etc/passwd"), "_etc_passwd");
        assert_eq!(sanitize_debug_name("assignments.txt"), "assignments.txt");
    }
}
