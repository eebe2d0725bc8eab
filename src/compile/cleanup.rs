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
//!
//! Nothing runs in a process killed with SIGKILL, so its next run cleans up: the first
//! temporary directory a process creates in a root removes the stale ones left there by
//! killed processes, first killing the compilers still running in them
//! ([`remove_stale_dirs`]). (A compiler is not tied to its parent's life with
//! `PR_SET_PDEATHSIG`: that needs a `pre_exec` hook, so `fork` instead of `posix_spawn` for
//! every compile, and reaches only the driver, not the `cc1`, `as` or `ld` it starts.)

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

/// A private temporary directory (`<root>/arrayjit-XXXXXX`, mode 0700), registered for signal
/// cleanup and removed when closed or dropped.
///
/// While it exists, the process holds an exclusive `flock` on the directory (through a
/// descriptor of it), released by the kernel however the process ends. A process killed
/// with SIGKILL cannot remove its directories, so the first directory a process creates in a
/// root first removes the stale ones there: see [`remove_stale_dirs`].
pub(super) struct WorkDir {
    id: u64,
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
    /// The directory, opened and locked (the lock goes with the descriptor).
    _lock: Option<fs::File>,
}

/// The prefix of the temporary directories' names; the rest is [`RANDOM_LEN`] letters and
/// digits.
const PREFIX: &str = "arrayjit-";
/// How many random characters follow [`PREFIX`] (`tempfile`'s default).
const RANDOM_LEN: usize = 6;

/// The file in a temporary directory saying that its process holds the directory's lock for
/// as long as it lives (written right after the lock is taken, before any compiler starts).
const LOCKED_MARKER: &str = ".arrayjit-locked";

/// A temporary directory without [`LOCKED_MARKER`] is only removed as stale if it has not been modified for this long
/// (and no process holds its lock). The lock alone says whether its process is alive; the age
/// also spares a directory whose process has not taken the lock yet, or an older arrayjit
/// that takes none (whose compiles are bounded by `ARRAYJIT_COMPILE_TIMEOUT`, 300 s by
/// default).
pub(super) const STALE_DIR_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

impl WorkDir {
    /// Creates and registers a fresh private directory in `root` (the first time in a
    /// process, after removing the stale directories in `root`).
    pub(super) fn create(root: &Path) -> Result<WorkDir> {
        remove_stale_dirs_once(root);
        let mut reg = registry();
        let dir = tempfile::Builder::new()
            .prefix(PREFIX)
            .rand_bytes(RANDOM_LEN)
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
        // Without the lock (a file system without flock), the age still protects it. With
        // it, a marker says so: a marked directory whose lock is free belongs to a process
        // that is gone (see `remove_stale_dirs`).
        let lock = lock_dir(&path).ok().flatten();
        if lock.is_some() {
            let _ = fs::File::options()
                .write(true)
                .create_new(true)
                .open(path.join(LOCKED_MARKER));
        }
        Ok(WorkDir {
            id,
            dir: Some(dir),
            path,
            _lock: lock,
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

/// Opens the directory `path` (not following a symbolic link) and takes an exclusive `flock`
/// on it without waiting: `Ok(None)` if another open file description holds it (a live
/// process using the directory).
fn lock_dir(path: &Path) -> io::Result<Option<fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let dir = fs::File::options()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)?;
    // SAFETY: flock(2) on a descriptor we own (it stays open for the call); no memory is
    // passed.
    let r = unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r == 0 {
        return Ok(Some(dir));
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(None)
    } else {
        Err(e)
    }
}

/// [`remove_stale_dirs`] in `root`, once per root and process.
fn remove_stale_dirs_once(root: &Path) {
    use std::collections::HashSet;
    static DONE: LazyLock<Mutex<HashSet<PathBuf>>> = LazyLock::new(Mutex::default);
    let first = DONE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(root.to_path_buf());
    if first {
        let removed = remove_stale_dirs(root, STALE_DIR_AGE);
        if removed > 0 {
            tracing::debug!(
                target: "arrayjit::compile",
                root = %root.display(),
                removed,
                "removed stale temporary directories of compiles that were killed"
            );
        }
    }
}

/// Removes the temporary directories in `root` that compiles killed before they could clean
/// up left behind: directories (not symbolic links) named `arrayjit-XXXXXX` (six letters or
/// digits), owned by this user, whose lock no process holds (see [`WorkDir`]), and either
/// marked as locked by their process ([`LOCKED_MARKER`]: that process is gone) or, without
/// the mark (a file system without `flock`, an older arrayjit), not modified for `min_age`.
/// Before a marked directory is removed, the processes of this user still running in it
/// (working directory inside it: the compiler driver and its `cc1`, `as`, `ld`, orphaned by
/// the kill) are killed with SIGKILL. Returns how many directories were removed. Anything else
/// (another user's directories, kept compiler logs `arrayjit-compile-*.log`, a directory in
/// use) is left alone; failures are ignored.
pub(super) fn remove_stale_dirs(root: &Path, min_age: std::time::Duration) -> usize {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = fs::read_dir(root) else {
        return 0;
    };
    let me = super::files::euid();
    let now = std::time::SystemTime::now();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
            continue;
        };
        if rest.len() != RANDOM_LEN || !rest.bytes().all(|b| b.is_ascii_alphanumeric()) {
            continue;
        }
        // `DirEntry::metadata` does not follow symbolic links.
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age >= min_age);
        if !meta.is_dir() || meta.uid() != me {
            continue;
        }
        let path = entry.path();
        // Held while removing, so that no process of ours can be using it meanwhile.
        let Ok(Some(_lock)) = lock_dir(&path) else {
            continue;
        };
        let marked = fs::symlink_metadata(path.join(LOCKED_MARKER)).is_ok_and(|m| m.is_file());
        if !marked && !old {
            continue;
        }
        if marked {
            kill_processes_in(&path, me);
        }
        if fs::remove_dir_all(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Kills (SIGKILL) this user's processes whose working directory is `dir` or below it: the
/// compilers an ended process left running there. Repeated until none is found (a driver
/// killed between two scans may have started one more step), at most a few times.
fn kill_processes_in(dir: &Path, me: u32) {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = fs::canonicalize(dir) else {
        return;
    };
    for _ in 0..5 {
        let Ok(procs) = fs::read_dir("/proc") else {
            return;
        };
        let mut killed = 0;
        for p in procs.flatten() {
            let Some(pid) = p
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<libc::pid_t>().ok())
            else {
                continue;
            };
            if pid == std::process::id() as libc::pid_t
                || !p.metadata().is_ok_and(|m| m.uid() == me)
            {
                continue;
            }
            let Ok(cwd) = fs::read_link(p.path().join("cwd")) else {
                continue;
            };
            if cwd.starts_with(&dir) {
                // SAFETY: kill(2) takes plain integers; `pid` is a process of this user
                // working in a directory of ours whose owner is gone.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                killed += 1;
            }
        }
        if killed == 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
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
