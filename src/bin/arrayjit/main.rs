//! The `arrayjit` command line: run program files and print their tensors, print the C they
//! compile to, time them, and look after the compile cache. The file format is described in
//! `docs/program-format.md`.
//!
//! ```text
//! arrayjit run FILE [--format json|table] [--interpret] [--threads N]
//! arrayjit emit-c FILE
//! arrayjit bench FILE [--warmup N] [--runs N] [--threads N]
//! arrayjit cache info|clear
//! arrayjit --help
//! ```
//!
//! # Exit codes and errors
//!
//! 0 on success; 2 for a usage error (unknown command or flag, missing file argument, a bad
//! flag value), with the message and the usage on stderr; 1 for any other error, as one line
//! `error: MESSAGE` on stderr (for program files `error: FILE:LINE:COL: CONTEXT: MESSAGE`,
//! see [`program`]). Errors are always printed in their `Display` form.
//!
//! # Running
//!
//! All routines are compiled as one batch and linked into one context on the cc backend; every
//! hosted tensor in that context is copied to the device, the `run` steps execute in order
//! (static-index values set in a step persist in that routine's cells for its later steps;
//! initially 0), and every hosted tensor is copied back. See [`output`] for what is printed.
//!
//! With `--interpret` nothing is compiled: the plan runs through the reference interpreter
//! ([`arrayjit::interp`]), one interpreter memory per device, and no C compiler is looked up
//! (see [`interpret`]). The output has the same format; values agree with the compiled run up
//! to rounding of intermediate results.
//!
//! The CLI uses only the library's public API.

mod exec;
mod interpret;
mod output;
mod program;
mod steps;

use std::io::Write;
use std::panic;
use std::process::ExitCode;

use arrayjit::compile::{CacheFiles, CompileCache};
use clap::{Parser, Subcommand, ValueEnum};

/// The largest `--runs` and `--warmup` of `arrayjit bench`.
const MAX_BENCH_COUNT: usize = 1_000_000;

/// Every form of the command line, for `--help` and usage errors.
const USAGE: &str = "\
arrayjit run FILE [--format json|table] [--interpret] [--threads N]
       arrayjit emit-c FILE
       arrayjit bench FILE [--warmup N] [--runs N] [--threads N]
       arrayjit cache info|clear
       arrayjit --help";

/// arrayjit: compile array programs to C, compile them with the system C compiler, run them.
///
/// The program file format is described in docs/program-format.md.
#[derive(Parser, Debug)]
#[command(
    name = "arrayjit",
    version,
    override_usage = USAGE,
    subcommand_required = true,
    arg_required_else_help = true,
    after_help = "Environment variables (ARRAYJIT_CC, ARRAYJIT_CFLAGS, ARRAYJIT_CACHE_DIR, \
                  ARRAYJIT_CACHE_MAX, ...) are described in docs/configuration.md."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Output format of `arrayjit run`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    /// One JSON object (the default).
    Json,
    /// Aligned tables for people.
    Table,
}

#[derive(Subcommand, Debug, PartialEq, Eq)]
enum Command {
    /// Run the program FILE and print its `print` tensors.
    ///
    /// json (the default) prints one JSON object on stdout.
    Run {
        /// The program file.
        #[arg(value_name = "FILE")]
        file: String,
        /// How to print the tensors.
        #[arg(long, value_enum, default_value_t = Format::Json)]
        format: Format,
        /// Run through the reference interpreter instead: no C compiler is needed or looked
        /// up, every index is bounds-checked, results agree up to rounding (slow; for
        /// debugging).
        #[arg(long)]
        interpret: bool,
        /// Threads per device for the routines' parallel regions (1 to 1024; default: the
        /// machine's cores, shared out among the devices of a multi-device program).
        #[arg(long, value_name = "N", conflicts_with = "interpret", value_parser = threads_count)]
        threads: Option<usize>,
    },
    /// Print the C source of all routines of FILE (no compiler needed).
    EmitC {
        /// The program file.
        #[arg(value_name = "FILE")]
        file: String,
    },
    /// Compile once, time the run steps.
    ///
    /// Prints JSON: compile_ms, runs, run_ms {median, min, max}; no compilation or host copies
    /// are timed.
    Bench {
        /// The program file.
        #[arg(value_name = "FILE")]
        file: String,
        /// Untimed executions of the run steps first (0 to 1000000).
        #[arg(long, value_name = "N", default_value_t = 3, allow_negative_numbers = true,
              value_parser = warmup_count)]
        warmup: usize,
        /// Timed executions (1 to 1000000).
        #[arg(long, value_name = "N", default_value_t = 10, allow_negative_numbers = true,
              value_parser = runs_count)]
        runs: usize,
        /// Threads per device for the routines' parallel regions (1 to 1024; default: the
        /// machine's cores, shared out among the devices of a multi-device program).
        #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = threads_count)]
        threads: Option<usize>,
    },
    /// Look after the compile cache (ARRAYJIT_CACHE_DIR, ARRAYJIT_CACHE_MAX).
    Cache {
        #[command(subcommand)]
        action: CacheAction,
    },
}

#[derive(Subcommand, Debug, PartialEq, Eq)]
enum CacheAction {
    /// Where the cache is, how many files it holds and their size.
    Info,
    /// Delete the cache's files (only arrayjit's own; the directory stays).
    Clear,
}

/// A count from `min` to [`MAX_BENCH_COUNT`].
fn count(text: &str, min: usize) -> Result<usize, String> {
    text.parse::<usize>()
        .ok()
        .filter(|n| (min..=MAX_BENCH_COUNT).contains(n))
        .ok_or_else(|| format!("expected a whole number from {min} to {MAX_BENCH_COUNT}"))
}

fn warmup_count(text: &str) -> Result<usize, String> {
    count(text, 0)
}

fn runs_count(text: &str) -> Result<usize, String> {
    count(text, 1)
}

/// The most threads per device `--threads` takes.
const MAX_THREADS: usize = 1024;

fn threads_count(text: &str) -> Result<usize, String> {
    text.parse::<usize>()
        .ok()
        .filter(|n| (1..=MAX_THREADS).contains(n))
        .ok_or_else(|| format!("expected a whole number from 1 to {MAX_THREADS}"))
}

/// A size in bytes for people: `3565158 bytes (3.4 MiB)`.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = None;
    while value >= 1024.0 && unit.is_none_or(|u| u + 1 < UNITS.len()) {
        value /= 1024.0;
        unit = Some(unit.map_or(0, |u| u + 1));
    }
    match unit {
        None => format!("{bytes} bytes"),
        Some(u) => format!("{bytes} bytes ({value:.1} {})", UNITS[u]),
    }
}

/// `N files, SIZE`.
fn files(f: CacheFiles) -> String {
    let noun = if f.count == 1 { "file" } else { "files" };
    format!("{} {noun}, {}", f.count, size(f.bytes))
}

/// `arrayjit cache info|clear`.
fn cache(action: &CacheAction) -> Result<String, String> {
    let Some(cache) = CompileCache::from_env().map_err(|e| e.to_string())? else {
        return Ok(
            "the compile cache is off (ARRAYJIT_CACHE), or has no directory \
                   (ARRAYJIT_CACHE_DIR, XDG_CACHE_HOME and HOME are unset)\n"
                .to_string(),
        );
    };
    let dir = cache.dir().display();
    match action {
        CacheAction::Info => {
            let info = cache.info().map_err(|e| e.to_string())?;
            Ok(format!(
                "directory: {dir}\n\
                 compiled objects: {}; limit (ARRAYJIT_CACHE_MAX) {}\n\
                 remembered compilers and targets: {}\n\
                 temporary files: {}\n\
                 total: {}\n",
                files(info.objects),
                size(cache.max_bytes()),
                files(info.memos),
                files(info.temporary),
                files(info.total()),
            ))
        }
        CacheAction::Clear => {
            let removed = cache.clear().map_err(|e| e.to_string())?;
            Ok(format!("deleted {} from {dir}\n", files(removed)))
        }
    }
}

/// After an error on an MPI rank: prints it as `rank R: error: ...` and stops every rank of
/// the job (they would wait for this one); on a single process, returns the message.
fn stop_job(job: &exec::Job, msg: String) -> String {
    if job.ranks() > 1 {
        // One write, so that the lines of ranks failing at once do not interleave.
        let line = format!("rank {}: error: {msg}\n", job.rank());
        eprint!("{line}");
        job.abort();
    }
    msg
}

/// Runs a command; `Ok` is what to print on stdout, `Err` a rendered error message.
fn execute(cmd: &Command) -> Result<String, String> {
    use program::render_program_error as render;
    match cmd {
        Command::EmitC { file } => {
            let (built, text) = program::load(file)?;
            exec::emit_c(&built).map_err(|e| render(file, &text, &e))
        }
        Command::Bench {
            file,
            warmup,
            runs,
            threads,
        } => {
            let (built, text) = program::load(file)?;
            let job = exec::Job::new(&built, *threads).map_err(|e| render(file, &text, &e))?;
            job.check_same_program(&text)
                .map_err(|e| stop_job(&job, render(file, &text, &e)))?;
            let result = exec::bench(&built, &job, *warmup, *runs)
                .map_err(|e| render(file, &text, &e))
                .map_err(|msg| stop_job(&job, msg))?;
            Ok(if job.rank() == 0 {
                result.to_json()
            } else {
                String::new()
            })
        }
        Command::Run {
            file,
            format,
            interpret,
            threads,
        } => {
            let (built, text) = program::load(file)?;
            // The interpreter simulates the devices in this process (MPI or not).
            let job = if *interpret {
                exec::Job::none()
            } else {
                exec::Job::new(&built, *threads).map_err(|e| render(file, &text, &e))?
            };
            job.check_same_program(&text)
                .map_err(|e| stop_job(&job, render(file, &text, &e)))?;
            let result = if *interpret {
                interpret::run(&built)
            } else {
                exec::run(&built, &job)
            }
            .map_err(|e| render(file, &text, &e))
            .map_err(|msg| stop_job(&job, msg))?;
            if job.rank() != 0 {
                // Every rank computes the same; only rank 0 prints.
                return Ok(String::new());
            }
            let printed = result.printed();
            match format {
                Format::Json => output::to_json(&printed),
                Format::Table => output::to_table(&printed),
            }
            .map_err(|e| format!("{file}: {e}"))
        }
        Command::Cache { action } => cache(action),
    }
}

/// Runs the command line `args` (with the program name first), writing results to `out` and
/// messages to `err`; returns the exit code: 0 success, 1 error, 2 usage error.
fn run_with_io(
    args: impl IntoIterator<Item = std::ffi::OsString>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // `--help` and `--version`: on stdout, code 0.
            let _ = e.print();
            return 0;
        }
        Err(e) => {
            // A usage error: the message and the usage on stderr, code 2.
            let mut text = e.render().to_string();
            if !text.contains("Usage:") {
                let tail = text.rfind("\nFor more information").unwrap_or(text.len());
                text.insert_str(tail, &format!("\nUsage: {USAGE}\n"));
            }
            let _ = write!(err, "{text}");
            return 2;
        }
    };
    match execute(&cli.command) {
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

/// The library's diagnostics (`tracing`) on stderr, at the level `ARRAYJIT_LOG` names
/// (`off`, `error`, `warn` — the default —, `info`, `debug` or `trace`). An unknown level is
/// reported and the default used.
fn init_logging() {
    let level = match std::env::var("ARRAYJIT_LOG") {
        Err(_) => Some(tracing::Level::WARN),
        Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
            "off" | "0" => None,
            "error" => Some(tracing::Level::ERROR),
            "" | "warn" => Some(tracing::Level::WARN),
            "info" => Some(tracing::Level::INFO),
            "debug" => Some(tracing::Level::DEBUG),
            "trace" => Some(tracing::Level::TRACE),
            _ => {
                eprintln!(
                    "warning: ARRAYJIT_LOG={v:?}: expected off, error, warn, info, debug or trace; using warn"
                );
                Some(tracing::Level::WARN)
            }
        },
    };
    if let Some(level) = level {
        let _ = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_writer(std::io::stderr)
            .with_target(false)
            .without_time()
            .try_init();
    }
}

fn main() -> ExitCode {
    // A bug must still end as `error: ...` and exit code 1, never as a bare panic message.
    panic::set_hook(Box::new(|info| {
        eprintln!("error: internal error: {info}");
    }));
    // SIGINT, SIGTERM and SIGHUP during a compile kill the compiler and remove its temporary
    // directory before the process exits (with 128 + the signal's number).
    if let Err(e) = arrayjit::compile::install_signal_cleanup() {
        eprintln!("warning: {e}");
    }
    init_logging();
    let code = panic::catch_unwind(|| {
        let stdout = std::io::stdout();
        let stderr = std::io::stderr();
        run_with_io(std::env::args_os(), &mut stdout.lock(), &mut stderr.lock())
    })
    .unwrap_or(1);
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(a: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("arrayjit").chain(a.iter().copied())).map(|c| c.command)
    }

    #[test]
    fn the_command_line_is_described_consistently() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_command_lines() {
        let run = |format, interpret| Command::Run {
            file: "p.json".into(),
            format,
            interpret,
            threads: None,
        };
        assert_eq!(parse(&["run", "p.json"]).unwrap(), run(Format::Json, false));
        assert_eq!(
            parse(&["run", "--format", "table", "p.json"]).unwrap(),
            run(Format::Table, false)
        );
        assert_eq!(
            parse(&["run", "--interpret", "p.json", "--format=table"]).unwrap(),
            run(Format::Table, true)
        );
        assert_eq!(
            parse(&["emit-c", "p.json"]).unwrap(),
            Command::EmitC {
                file: "p.json".into()
            }
        );
        assert_eq!(
            parse(&["bench", "p.json", "--runs=1000000", "--warmup", "0"]).unwrap(),
            Command::Bench {
                file: "p.json".into(),
                warmup: 0,
                runs: 1_000_000,
                threads: None,
            }
        );
        assert_eq!(
            parse(&["bench", "p.json", "--threads", "3"]).unwrap(),
            Command::Bench {
                file: "p.json".into(),
                warmup: 3,
                runs: 10,
                threads: Some(3),
            }
        );
        assert_eq!(
            parse(&["run", "--threads=2", "p.json"]).unwrap(),
            Command::Run {
                file: "p.json".into(),
                format: Format::Json,
                interpret: false,
                threads: Some(2),
            }
        );
        assert_eq!(
            parse(&["bench", "p.json"]).unwrap(),
            Command::Bench {
                file: "p.json".into(),
                warmup: 3,
                runs: 10,
                threads: None,
            }
        );
        assert_eq!(
            parse(&["cache", "info"]).unwrap(),
            Command::Cache {
                action: CacheAction::Info
            }
        );
        assert_eq!(
            parse(&["cache", "clear"]).unwrap(),
            Command::Cache {
                action: CacheAction::Clear
            }
        );
        for bad in [
            &[][..],
            &["frob", "p.json"],
            &["run", "--fast", "p.json"],
            &["run", "--format=xml", "p.json"],
            &["run", "--format", "json", "--format", "table", "p.json"],
            &["emit-c", "--format=json", "p.json"],
            &["emit-c", "a.json", "b.json"],
            &["run"],
            &["run", "--interpret", "--interpret", "p.json"],
            &["emit-c", "--interpret", "p.json"],
            &["bench", "p.json", "--interpret"],
            &["bench", "p.json", "--runs", "0"],
            &["bench", "p.json", "--runs", "-1"],
            &["bench", "p.json", "--warmup", "1000001"],
            &["bench", "p.json", "--runs", "10", "--runs", "10"],
            &["bench", "p.json", "--threads", "0"],
            &["bench", "p.json", "--threads", "-2"],
            &["bench", "p.json", "--threads", "1025"],
            &["run", "p.json", "--threads", "two"],
            &["run", "p.json", "--interpret", "--threads", "2"],
            &["emit-c", "p.json", "--threads", "2"],
            &["cache"],
            &["cache", "purge"],
            &["cache", "info", "extra"],
        ] {
            let e = parse(bad).expect_err(&format!("{bad:?} was accepted"));
            assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
        }
        assert_eq!(parse(&["--help"]).unwrap_err().exit_code(), 0);
        assert_eq!(parse(&["run", "--help"]).unwrap_err().exit_code(), 0);
    }

    #[test]
    fn sizes_for_people() {
        assert_eq!(size(0), "0 bytes");
        assert_eq!(size(1023), "1023 bytes");
        assert_eq!(size(1536), "1536 bytes (1.5 KiB)");
        assert_eq!(size(1 << 30), "1073741824 bytes (1.0 GiB)");
        assert_eq!(size(1 << 50), "1125899906842624 bytes (1024.0 TiB)");
        assert_eq!(files(CacheFiles { count: 1, bytes: 2 }), "1 file, 2 bytes");
    }
}
