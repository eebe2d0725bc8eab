//! The `arrayjit` command line; see [`arrayjit::cli`].

use std::panic;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // A bug must still end as `error: ...` and exit code 1, never as a bare panic message.
    panic::set_hook(Box::new(|info| {
        eprintln!("error: internal error: {info}");
    }));
    let code = panic::catch_unwind(|| arrayjit::cli::main_with_args(args)).unwrap_or(1);
    std::process::exit(code);
}
