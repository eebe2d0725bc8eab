//! The debug directory (`ARRAYJIT_DEBUG_DIR`): what one compile keeps there — the source
//! under a stem nobody has used yet, the runtime header, the command line, the compiler's
//! output and the caller's extra files.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::run::Captured;
use super::{write_file, RUNTIME_HEADER};
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

/// The files kept in the debug directory for one compile.
pub(super) struct DebugOutput {
    /// The debug directory.
    pub(super) dir: PathBuf,
    /// The stem claimed in it (the requested one, possibly with a numeric suffix).
    pub(super) stem: String,
    /// `<dir>/<stem>.c`.
    pub(super) source_path: PathBuf,
}

impl DebugOutput {
    /// Creates `dir` if needed, claims a stem nobody has used there yet by creating
    /// `<stem>.c` exclusively, and writes the source, the runtime header and `extra`.
    pub(super) fn create(
        dir: &Path,
        stem: &str,
        source: &str,
        extra: &[(String, &str)],
    ) -> Result<Self> {
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
    pub(super) fn write(&self, suffix: &str, contents: &str) -> Result<()> {
        write_file(&self.dir.join(format!("{}{suffix}", self.stem)), contents)
    }

    /// `<dir>/<stem>.log`.
    pub(super) fn log_path(&self) -> PathBuf {
        self.dir.join(format!("{}.log", self.stem))
    }

    /// Writes the compiler's whole output (streamed, never held in memory) to `<stem>.log`,
    /// after `note` if there is one.
    pub(super) fn write_log(&self, note: Option<&str>, output: &Captured) -> Result<()> {
        let path = self.log_path();
        let err = |e: io::Error| Error::io(format!("writing {}", path.display()), e);
        let mut w = io::BufWriter::new(File::create(&path).map_err(err)?);
        if let Some(n) = note {
            writeln!(w, "[{n}]").map_err(err)?;
        }
        output.write_to(&mut w).map_err(err)?;
        w.flush().map_err(err)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_names() {
        assert_eq!(sanitize_debug_name("../etc/passwd"), "_etc_passwd");
        assert_eq!(sanitize_debug_name("assignments.txt"), "assignments.txt");
    }
}
