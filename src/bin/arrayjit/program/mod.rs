//! Program files: reading, parsing and building them into library objects (tensor nodes,
//! assignments, a run plan), with errors that point into the file. The format is described in
//! `docs/program-format.md`.
//!
//! # Errors
//!
//! Every error is one line `FILE:LINE:COL: CONTEXT: MESSAGE`, where CONTEXT says where in the
//! program the problem is (`tensor "x"`, `static index "row"`, `routine "forward", statement 2
//! (in block "y = relu(x @ w)")`, `run step 1.2` for the second step inside the repeat that is
//! run step 1, `print entry 3`; numbers count from 1). Syntax and type errors come from
//! serde_json (its line and column); semantic errors point at the offending value. Parts that
//! are unknown are left out (e.g. C compiler failures only name the routines).
//!
//! # Hosting rules
//!
//! A tensor with an `init` (even `"zeros"`) or that is printed gets a host array and is
//! hosted, unless `memory` says otherwise. An explicit `memory` is applied with provenance
//! [`provenance::USER`](arrayjit::ir::tnode::provenance::USER): `"hosted"` makes it Hosted
//! (Nonconstant) with a host array; `"on_device"` keeps it on the device, and a non-zero init
//! or being printed still gives it a host array that only stages `from_host` / `to_host`
//! copies; `"virtual"` and `"local"` forbid a non-zero init and printing (both are errors).
//! A tensor used by more than one routine is made Materialized (provenance
//! `SHARED_BY_ROUTINES`) so that it persists between them.
//!
//! This module uses only the library's public API (and serde_json), so that tests can include
//! it as it is (`tests/differential.rs` reads the program files it generates with it).

pub mod build;
pub mod decimal;
pub mod format;
pub mod locate;

use std::path::Path;

/// Renders a serde_json error as `FILE:LINE:COL: CONTEXT: MESSAGE`.
fn render_parse_error(file: &str, text: &str, e: &serde_json::Error) -> String {
    let full = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let msg = full
        .strip_suffix(&suffix)
        .unwrap_or(&full)
        .replace('`', "\"");
    if e.line() == 0 {
        return format!("{file}: {msg}");
    }
    // serde_json says column 0 before the first character of a line (e.g. an empty file);
    // columns shown count from 1.
    let column = e.column().max(1);
    let offset = locate::offset_of(text, e.line(), column);
    let root: Option<serde_json::Value> = serde_json::from_str(text).ok();
    let context = locate::describe(&locate::path_at(text, offset), root.as_ref());
    if context.is_empty() {
        format!("{file}:{}:{column}: {msg}", e.line())
    } else {
        format!("{file}:{}:{column}: {context}: {msg}", e.line())
    }
}

/// Renders a semantic error as `FILE:LINE:COL: CONTEXT: MESSAGE` (parts unknown left out).
pub fn render_program_error(file: &str, text: &str, e: &build::ProgramError) -> String {
    let root: Option<serde_json::Value> = serde_json::from_str(text).ok();
    let mut head = file.to_string();
    let mut context = String::new();
    if let Some(path) = &e.path {
        if let Some(off) = locate::find_value(text, path) {
            let (l, c) = locate::line_col(text, off);
            head = format!("{file}:{l}:{c}");
        }
        context = locate::describe(path, root.as_ref());
    }
    if context.is_empty() {
        format!("{head}: {}", e.msg)
    } else {
        format!("{head}: {context}: {}", e.msg)
    }
}

/// The largest program file `arrayjit` reads (`/dev/zero` as a program is an error, not an
/// endless read). Large data belongs in `{"file": ...}` inits.
pub const MAX_PROGRAM_BYTES: usize = 1 << 30;

/// Reads a program file: at most [`MAX_PROGRAM_BYTES`], allocating fallibly, UTF-8.
fn read_program(file: &str) -> Result<String, String> {
    use std::io::Read;
    let cannot = |e: &dyn std::fmt::Display| format!("cannot read {file}: {e}");
    let mut f = std::fs::File::open(file).map_err(|e| cannot(&e))?;
    let mut bytes: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 1 << 16];
    loop {
        let n = match f.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(cannot(&e)),
        };
        if bytes.len() + n > MAX_PROGRAM_BYTES {
            return Err(format!(
                "{file}: a program file may have at most {MAX_PROGRAM_BYTES} bytes (put large \
                 data in a {{\"file\": ...}} init)"
            ));
        }
        if bytes.try_reserve(n).is_err() {
            let e = arrayjit::Error::OutOfMemory {
                what: format!("the text of {file}"),
                bytes: bytes.len() + n,
            };
            return Err(cannot(&e));
        }
        bytes.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "{file}: the program is not UTF-8 text (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        )
    })
}

/// Reads, parses and builds a program file; returns the built program and the file's text
/// (for rendering later errors). `Err` is a rendered error message.
pub fn load(file: &str) -> Result<(build::Built, String), String> {
    let text = read_program(file)?;
    let prog: format::Program =
        serde_json::from_str(&text).map_err(|e| render_parse_error(file, &text, &e))?;
    let base = Path::new(file)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let built = build::build(&prog, &base).map_err(|e| render_program_error(file, &text, &e))?;
    Ok((built, text))
}
