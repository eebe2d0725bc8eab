//! The `arrayjit` command line; see [`arrayjit::cli`].

use std::panic;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // A bug must still end as `error: ...` and exit code 1, never as a bare panic message.
    panic::set_hook(Box::new(|info| {
        eprintln!("error: internal error: {info}");
    }));
    // SIGINT, SIGTERM and SIGHUP during a compile kill the compiler and remove its temporary
    // directory before the process exits (with 128 + the signal's number).
    if let Err(e) = arrayjit::compile::install_signal_cleanup() {
        eprintln!("warning: {e}");
    }
    let code = panic::catch_unwind(|| arrayjit::cli::main_with_args(args)).unwrap_or(1);
    std::process::exit(code);
}
