//! The `arrayjit` command line: run program files and print their tensors, or print the C
//! they compile to. The file format is described in `README.md` ("The program format").
//!
//! ```text
//! arrayjit run FILE [--format json|table] [--interpret]
//! arrayjit emit-c FILE
//! arrayjit bench FILE [--warmup N] [--runs N]
//! arrayjit --help
//! ```
//!
//! # Exit codes and errors
//!
//! 0 on success; 2 for a usage error (unknown command or flag, missing file argument), with
//! the message and the usage text on stderr; 1 for any other error, as one line
//! `error: FILE:LINE:COL: CONTEXT: MESSAGE` on stderr, where CONTEXT says where in the program
//! the problem is (`tensor "x"`, `static index "row"`, `routine "forward", statement 2 (in
//! block "y = relu(x @ w)")`, `run step 1.2` for the second step inside the repeat that is
//! run step 1, `print entry 3`; numbers count from 1). Syntax and type errors come from
//! serde_json (its line and column); semantic errors point at the offending value. Parts that
//! are unknown are left out (e.g. C compiler failures only name the routines).
//!
//! # Hosting rules
//!
//! A tensor with an `init` (even `"zeros"`) or that is printed gets a host array and is
//! hosted, unless `memory` says otherwise. An explicit `memory` is applied with provenance
//! [`provenance::USER`](crate::ir::tnode::provenance::USER): `"hosted"` makes it Hosted
//! (Nonconstant) with a host array; `"on_device"` keeps it on the device, and a non-zero init
//! or being printed still gives it a host array that only stages `from_host` / `to_host`
//! copies; `"virtual"` and `"local"` forbid a non-zero init and printing (both are errors).
//! A tensor used by more than one routine is made Materialized (provenance
//! `SHARED_BY_ROUTINES`) so that it persists between them.
//!
//! # Running
//!
//! All routines are compiled as one batch and linked into one context on the cc backend; every
//! hosted tensor in that context is copied to the device, the `run` steps execute in order
//! (static-index values set in a step persist in that routine's cells for its later steps;
//! initially 0), and every hosted tensor is copied back. See [`output`] for what is printed.
//!
//! With `--interpret` nothing is compiled: the plan runs through the reference interpreter
//! ([`crate::interp`]), one interpreter memory per device, and no C compiler is looked up (see
//! [`interpret`]). The output has the same format; values agree with the compiled run up to
//! rounding of intermediate results.

pub mod build;
pub mod decimal;
pub mod exec;
pub mod interpret;
pub mod locate;
pub mod output;
pub mod program;

use std::io::Write;
use std::path::Path;

/// The largest `--runs` and `--warmup` of `arrayjit bench`.
pub const MAX_BENCH_COUNT: usize = 1_000_000;

/// The usage text.
pub const USAGE: &str = "\
arrayjit: compile array programs to C, compile them with the system C compiler, run them

Usage:
  arrayjit run FILE [--format json|table] [--interpret]
                                            run the program FILE and print its `print` tensors
                                            (json, the default: one JSON object on stdout);
                                            --interpret runs it through the reference
                                            interpreter instead: no C compiler is needed or
                                            looked up, every index is bounds-checked, results
                                            agree up to rounding (slow; for debugging)
  arrayjit emit-c FILE                      print the C source of all routines of FILE
  arrayjit bench FILE [--warmup N] [--runs N]
                                            compile once, time the run steps (JSON: compile_ms,
                                            run_ms median/min/max; no compilation or host copies;
                                            defaults 3 and 10, at most 1000000 each)
  arrayjit --help                           print this help

The program file format is described in README.md.
";

/// Output format of `arrayjit run`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One JSON object (the default).
    Json,
    /// Aligned tables for people.
    Table,
}

/// A parsed command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// `arrayjit run FILE [--format F] [--interpret]`
    Run {
        /// The program file.
        file: String,
        /// The output format.
        format: Format,
        /// Run through the reference interpreter instead of compiling.
        interpret: bool,
    },
    /// `arrayjit emit-c FILE`
    EmitC {
        /// The program file.
        file: String,
    },
    /// `arrayjit bench FILE [--warmup N] [--runs N]`
    Bench {
        /// The program file.
        file: String,
        /// Untimed executions of the run steps first (default 3).
        warmup: usize,
        /// Timed executions (default 10).
        runs: usize,
    },
    /// `arrayjit --help`
    Help,
}

/// Parses the arguments (without the program name). `Err` is a usage error message.
pub fn parse_args(args: &[String]) -> Result<Command, String> {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        return Ok(Command::Help);
    }
    let Some(cmd) = args.first() else {
        return Err("no command given".into());
    };
    let cmd = cmd.as_str();
    if cmd == "help" {
        return Ok(Command::Help);
    }
    if cmd != "run" && cmd != "emit-c" && cmd != "bench" {
        return Err(format!("unknown command {cmd:?}"));
    }
    let mut file: Option<String> = None;
    let mut format: Option<Format> = None;
    let mut warmup: Option<usize> = None;
    let mut runs: Option<usize> = None;
    let mut interpret = false;
    let mut rest = args[1..].iter();
    while let Some(a) = rest.next() {
        if a == "--interpret" {
            if cmd != "run" {
                return Err(format!(
                    "{cmd} does not take --interpret (only run does: it never compiles)"
                ));
            }
            if interpret {
                return Err("--interpret given twice".into());
            }
            interpret = true;
            continue;
        }
        let count_flag = ["--warmup", "--runs"]
            .into_iter()
            .find(|f| a == f || a.starts_with(&format!("{f}=")));
        if let Some(flag) = count_flag {
            if cmd != "bench" {
                return Err(format!("{cmd} does not take {flag}"));
            }
            let v = match a.strip_prefix(&format!("{flag}=")) {
                Some(v) => v.to_string(),
                None => rest
                    .next()
                    .ok_or_else(|| format!("{flag} needs a number"))?
                    .clone(),
            };
            let n: usize = v
                .parse()
                .ok()
                .filter(|&n| n <= MAX_BENCH_COUNT)
                .ok_or_else(|| {
                    format!("{flag} needs a number from 0 to {MAX_BENCH_COUNT}, got {v:?}")
                })?;
            let slot = if flag == "--warmup" {
                &mut warmup
            } else {
                &mut runs
            };
            if slot.replace(n).is_some() {
                return Err(format!("{flag} given twice"));
            }
            continue;
        }
        let value = if a == "--format" {
            Some(
                rest.next()
                    .ok_or_else(|| "--format needs a value: json or table".to_string())?
                    .clone(),
            )
        } else {
            a.strip_prefix("--format=").map(str::to_string)
        };
        if let Some(v) = value {
            if cmd != "run" {
                return Err(format!("{cmd} does not take --format"));
            }
            if format.is_some() {
                return Err("--format given twice".into());
            }
            format = Some(match v.as_str() {
                "json" => Format::Json,
                "table" => Format::Table,
                other => return Err(format!("unknown format {other:?}: expected json or table")),
            });
        } else if a.starts_with('-') && a.len() > 1 {
            return Err(format!("unknown flag {a:?}"));
        } else if file.is_some() {
            return Err(format!(
                "unexpected argument {a:?}: only one FILE is allowed"
            ));
        } else {
            file = Some(a.clone());
        }
    }
    let file = file.ok_or_else(|| format!("{cmd} needs a program FILE"))?;
    Ok(match cmd {
        "run" => Command::Run {
            file,
            format: format.unwrap_or(Format::Json),
            interpret,
        },
        "bench" => {
            let runs = runs.unwrap_or(10);
            if runs == 0 {
                return Err(format!(
                    "--runs must be at least 1 (and at most {MAX_BENCH_COUNT})"
                ));
            }
            Command::Bench {
                file,
                warmup: warmup.unwrap_or(3),
                runs,
            }
        }
        _ => Command::EmitC { file },
    })
}

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
fn render_program_error(file: &str, text: &str, e: &build::ProgramError) -> String {
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
            let e = crate::Error::OutOfMemory {
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
    let prog: program::Program =
        serde_json::from_str(&text).map_err(|e| render_parse_error(file, &text, &e))?;
    let base = Path::new(file)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let built = build::build(&prog, &base).map_err(|e| render_program_error(file, &text, &e))?;
    Ok((built, text))
}

/// Runs a command; `Ok` is what to print on stdout, `Err` a rendered error message.
fn execute(cmd: &Command) -> Result<String, String> {
    match cmd {
        Command::Help => Ok(USAGE.to_string()),
        Command::EmitC { file } => {
            let (built, text) = load(file)?;
            exec::emit_c(&built).map_err(|e| render_program_error(file, &text, &e))
        }
        Command::Bench { file, warmup, runs } => {
            let (built, text) = load(file)?;
            let result = exec::bench(&built, *warmup, *runs)
                .map_err(|e| render_program_error(file, &text, &e))?;
            Ok(result.to_json())
        }
        Command::Run {
            file,
            format,
            interpret,
        } => {
            let (built, text) = load(file)?;
            let result = if *interpret {
                interpret::run(&built)
            } else {
                exec::run(&built)
            }
            .map_err(|e| render_program_error(file, &text, &e))?;
            let printed = result.printed();
            match format {
                Format::Json => output::to_json(&printed),
                Format::Table => output::to_table(&printed),
            }
            .map_err(|e| format!("{file}: {e}"))
        }
    }
}

/// Runs the command line `args` (without the program name), writing results to `out` and
/// messages to `err`; returns the exit code: 0 success, 1 error, 2 usage error.
pub fn run_with_io(args: &[String], out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let cmd = match parse_args(args) {
        Ok(c) => c,
        Err(msg) => {
            let _ = write!(err, "error: {msg}\n\n{USAGE}");
            return 2;
        }
    };
    match execute(&cmd) {
        Ok(text) => match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
            Ok(()) => 0,
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
            Err(e) => {
                let _ = writeln!(err, "error: writing the output: {e}");
                1
            }
        },
        Err(msg) => {
            let _ = writeln!(err, "error: {msg}");
            1
        }
    }
}

/// Runs the command line `args` (without the program name) on the process's stdout and
/// stderr; returns the exit code (see [`run_with_io`]).
pub fn main_with_args(args: Vec<String>) -> i32 {
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    run_with_io(&args, &mut stdout.lock(), &mut stderr.lock())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_command_lines() {
        assert_eq!(
            parse_args(&args(&["run", "p.json"])),
            Ok(Command::Run {
                file: "p.json".into(),
                format: Format::Json,
                interpret: false,
            })
        );
        assert_eq!(
            parse_args(&args(&["run", "--format", "table", "p.json"])),
            Ok(Command::Run {
                file: "p.json".into(),
                format: Format::Table,
                interpret: false,
            })
        );
        assert_eq!(
            parse_args(&args(&["emit-c", "p.json"])),
            Ok(Command::EmitC {
                file: "p.json".into()
            })
        );
        assert_eq!(parse_args(&args(&["--help"])), Ok(Command::Help));
        assert!(parse_args(&args(&[])).is_err());
        assert!(parse_args(&args(&["frob", "p.json"])).is_err());
        assert!(parse_args(&args(&["run", "--fast", "p.json"])).is_err());
        assert!(parse_args(&args(&["run", "--format=xml", "p.json"])).is_err());
        assert!(parse_args(&args(&["emit-c", "--format=json", "p.json"])).is_err());
        assert!(parse_args(&args(&["run"])).is_err());
        assert_eq!(
            parse_args(&args(&["run", "--interpret", "p.json", "--format=table"])),
            Ok(Command::Run {
                file: "p.json".into(),
                format: Format::Table,
                interpret: true,
            })
        );
        assert!(parse_args(&args(&["run", "--interpret", "--interpret", "p.json"])).is_err());
        assert!(parse_args(&args(&["emit-c", "--interpret", "p.json"])).is_err());
        assert!(parse_args(&args(&["bench", "p.json", "--interpret"])).is_err());
    }
}
