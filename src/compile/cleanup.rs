//! The process-global registry of active compiles (the private temporary directories and the
//! compilers' process groups), and the opt-in signal handling that cleans them up.
//!
//! Every temporary directory the compile stage creates and every compiler (or target probe)
//! it starts is registered here while it exists. The registry's lock is held while a
//! directory is created or removed and while a compiler is started, so there is never a
//! directory or a process the registry does not know about. [`install_signal_cleanup`]
//! starts a thread that, on SIGINT, SIGTERM or SIGHUP, takes the lock (and keeps it, so
//! nothing new can start), kills every registered process group, removes every registered
//! directory and exits with 128 + the signal number. The library never installs signal
//! handlers by itself: a program opts in (the `arrayjit` CLI and the `moons` example do).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{LazyLock, Mutex, MutexGuard, OnceLock};

use crate::{Error, Result};

/// What is active right now.
#[derive(Default)]
struct Registry {
    /// The id given to the next registration.
    next_id: u64,
    /// Temporary directories, by registration id.
    dirs: HashMap<u64, PathBuf>,
    /// Process groups (led by a compiler we started), by registration id.
    groups: HashMap<u64, i32>,
}

impl Registry {
    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);

fn registry() -> MutexGuard<'static, Registry> {
    // Every update is a single map operation, so a poisoned lock still holds consistent data.
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// A private temporary directory (`<root>/arrayjit-XXXXXX`), registered for signal cleanup
/// and removed when closed or dropped.
pub(super) struct WorkDir {
    id: u64,
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl WorkDir {
    /// Creates and registers a fresh private directory in `root`.
    pub(super) fn create(root: &Path) -> Result<WorkDir> {
        let mut reg = registry();
        let dir = tempfile::Builder::new()
            .prefix("arrayjit-")
            .tempdir_in(root)
            .map_err(|e| {
                Error::io(
                    format!("creating a temporary directory in {}", root.display()),
                    e,
                )
            })?;
        let id = reg.id();
        let path = dir.path().to_path_buf();
        reg.dirs.insert(id, path.clone());
        Ok(WorkDir {
            id,
            dir: Some(dir),
            path,
        })
    }

    /// The directory.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the directory, reporting a failure.
    pub(super) fn close(mut self) -> Result<()> {
        let mut reg = registry();
        reg.dirs.remove(&self.id);
        match self.dir.take() {
            Some(d) => d.close().map_err(|e| {
                Error::io(
                    format!("removing temporary directory {}", self.path.display()),
                    e,
                )
            }),
            None => Ok(()),
        }
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Some(d) = self.dir.take() {
            let mut reg = registry();
            reg.dirs.remove(&self.id);
            drop(d);
        }
    }
}

/// A started compiler whose process group is registered for signal cleanup until
/// [`Group::unregister`] (or drop).
pub(super) struct Group {
    id: u64,
}

impl Group {
    /// Forgets the group; call it before the compiler is reaped, so that the group id cannot
    /// have been reused when a signal handler kills the registered groups.
    pub(super) fn unregister(self) {}
}

impl Drop for Group {
    fn drop(&mut self) {
        registry().groups.remove(&self.id);
    }
}

/// Starts `cmd` (which must be set up with `process_group(0)`, so that the child leads a
/// process group of its own) and registers its group, both under the registry's lock.
pub(super) fn spawn_registered(cmd: &mut Command) -> io::Result<(Child, Group)> {
    let mut reg = registry();
    let child = cmd.spawn()?;
    let id = reg.id();
    match i32::try_from(child.id()) {
        Ok(pid) if pid > 0 => {
            reg.groups.insert(id, pid);
        }
        _ => {}
    }
    Ok((child, Group { id }))
}

/// Sends SIGKILL to the process group led by `pid`.
pub(super) fn kill_process_group(pid: i32) {
    if pid <= 0 {
        return;
    }
    // SAFETY: kill(2) has no memory-safety preconditions. `-pid` names the process group a
    // compiler we started leads (it was spawned with `process_group(0)`), so only that
    // compiler and the processes it started receive the signal. The group id cannot have
    // been reused: callers only kill groups whose leader has not been reaped yet (the
    // compile stage waits with WNOWAIT and unregisters before reaping).
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
    }
}

/// Kills every registered process group, removes every registered directory and exits with
/// 128 + `signal`. The registry stays locked until the process is gone, so no compile can
/// start a process or create a directory in between.
fn clean_up_and_exit(signal: i32) -> ! {
    let reg = registry();
    for &pid in reg.groups.values() {
        kill_process_group(pid);
    }
    for dir in reg.dirs.values() {
        let _ = fs::remove_dir_all(dir);
    }
    std::process::exit(128 + signal);
}

/// Installs process-wide handling of SIGINT, SIGTERM and SIGHUP: a dedicated thread that,
/// on the first of these signals, kills every C compiler the compile stage is running (with
/// the processes they started), removes the compile stage's temporary directories and exits
/// the process with status 128 + the signal's number (130, 143, 129).
///
/// The library never calls this by itself: a program that wants the cleanup opts in, once,
/// early in `main` (calling it again does nothing). Without it, these signals keep their
/// previous disposition (by default they end the process at once, leaving a running compiler
/// and its temporary directory behind).
///
/// Errors: [`Error::Io`] if the handlers or the thread cannot be set up.
pub fn install_signal_cleanup() -> Result<()> {
    static INSTALLED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
            let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
                .map_err(|e| format!("installing signal handlers: {e}"))?;
            std::thread::Builder::new()
                .name("arrayjit-signals".into())
                .spawn(move || {
                    if let Some(sig) = signals.forever().next() {
                        clean_up_and_exit(sig);
                    }
                })
                .map(|_| ())
                .map_err(|e| format!("starting the signal-handling thread: {e}"))
        })
        .clone()
        .map_err(|msg| Error::io(msg, io::Error::other("signal cleanup not installed")))
}
