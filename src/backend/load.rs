//! What other processes keep busy right now: how many cores ([`busy_elsewhere`], which
//! [`Devices::Auto`] takes away from the cores it spreads devices over, see its
//! [documentation](crate::parallel#how-many-devices)), and which CPUs ([`busy_cpus`], which
//! the pinning of workers puts last).
//!
//! Devices in lockstep run at the speed of the slowest: a device whose core is shared with a
//! busy process gets about half of it, and every step waits for it. Measured on a 2-core
//! Sapphire Rapids VM with a busy loop on one core (`benches/moons_busy.py`): the default
//! moons job on two devices ran from 0.08× to 1.5× of one device, the median 0.94×; on one
//! device it kept its speed.
//!
//! [`Devices::Auto`]: crate::parallel::Devices::Auto

use std::path::Path;
use std::time::Duration;

/// Samples of the run queue, one per millisecond.
const SAMPLES: usize = 16;

/// The number of other processes' threads that are runnable in most of [`SAMPLES`] looks at
/// the run queue over about 20 ms: on Linux, the runnable entities of `/proc/loadavg` (an
/// instantaneous count, the fourth field) less this process's own runnable threads (state
/// `R` in `/proc/self/task/*/stat`, the calling thread included). The median of the samples:
/// a neighbour that keeps a core busy counts, one that runs now and then does not. 0 where
/// the files cannot be read (other systems).
pub(crate) fn busy_elsewhere() -> usize {
    let mut seen = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // This process's count first: a thread of ours that stops running in between is
        // then not taken for another process's (the samples' median absorbs the rest).
        let Some(own) = own_runnable() else { return 0 };
        let Some(all) = all_runnable() else { return 0 };
        seen.push(all.saturating_sub(own));
    }
    seen.sort_unstable();
    seen[SAMPLES / 2]
}

/// The runnable scheduling entities of the whole system: `R` of the `R/T` fourth field of
/// `/proc/loadavg`.
fn all_runnable() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    parse_loadavg(&text)
}

fn parse_loadavg(text: &str) -> Option<usize> {
    text.split_whitespace()
        .nth(3)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// This process's threads in state `R`.
fn own_runnable() -> Option<usize> {
    runnable_stats(Path::new("/proc/self/task")).map(|s| s.len())
}

/// The `stat` lines of the threads under `tasks` (a `/proc/<pid>/task` directory) that are
/// in state `R`; `None` when the directory cannot be read. A thread that ended since the
/// listing has no file: not runnable.
fn runnable_stats(tasks: &Path) -> Option<Vec<String>> {
    let tasks = std::fs::read_dir(tasks).ok()?;
    Some(
        tasks
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
            .filter(|stat| stat_state(stat) == Some('R'))
            .collect(),
    )
}

/// The CPUs on which a thread of another process is runnable now (one look: state `R` in
/// `/proc/<pid>/task/<tid>/stat`, and its field 39, the CPU it last ran on); empty where the
/// files cannot be read.
pub(crate) fn busy_cpus() -> Vec<usize> {
    let me = std::process::id().to_string();
    let mut cpus = vec![];
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return cpus;
    };
    for p in procs.flatten() {
        let name = p.file_name();
        let Some(pid) = name.to_str() else { continue };
        if pid == me || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        for stat in runnable_stats(&p.path().join("task")).unwrap_or_default() {
            if let Some(cpu) = stat_cpu(&stat) {
                if !cpus.contains(&cpu) {
                    cpus.push(cpu);
                }
            }
        }
    }
    cpus
}

/// The CPU a `stat` line's thread last ran on: field 39, the 37th after the state.
fn stat_cpu(stat: &str) -> Option<usize> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(36)?.parse().ok()
}

/// The state letter of a `stat` line: the first field after the command name, which is in
/// parentheses and may itself contain spaces and parentheses.
fn stat_state(stat: &str) -> Option<char> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_queue_and_thread_states_are_read_from_their_fields() {
        assert_eq!(parse_loadavg("1.04 1.83 2.11 3/345 26994\n"), Some(3));
        assert_eq!(parse_loadavg("1.04 1.83"), None);
        assert_eq!(stat_state("26994 (a (b) c) R 1 2 3"), Some('R'));
        assert_eq!(stat_state("17 (worker) S 1 2 3"), Some('S'));
        assert_eq!(stat_state("no parenthesis"), None);
        // Field 39 of a real line (a busy shell loop last on CPU 1).
        let line = "4242 (sh) R 1 4242 1 0 -1 4194304 95 0 0 0 312 0 0 0 20 0 1 0 94301 \
                    2797568 221 18446744073709551615 1 1 0 0 0 0 0 4 65538 0 0 0 17 1 0 0 0 \
                    0 0 0 0 0 0 0 0 0 0";
        assert_eq!(stat_cpu(line), Some(1));
        assert_eq!(stat_cpu("7 (x) S 1 2"), None);
    }

    /// A thread of this process spinning counts as this process's (so it is not taken for
    /// another process's work); a busy child process counts as another's. (Other tests of
    /// this binary start compilers beside this one, so the count of other processes' threads
    /// can only be bounded from below.)
    #[cfg(target_os = "linux")]
    #[test]
    fn a_busy_process_counts_and_this_process_s_own_threads_do_not() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let spinner = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        // This thread, reading, and the spinner.
        let own = own_runnable();
        stop.store(true, Ordering::Relaxed);
        spinner.join().unwrap();
        assert!(
            own.is_some_and(|n| n >= 2),
            "{own:?} runnable threads of ours"
        );
        let mut child = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let theirs = busy_elsewhere();
        let cpus = busy_cpus();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(theirs >= 1, "a busy child process not seen");
        assert!(!cpus.is_empty(), "no CPU seen busy");
    }
}
