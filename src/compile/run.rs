//! Running the compiler: in a private directory, in a process group of its own (registered for
//! signal cleanup), with a timeout, its output captured in files of which only the tail is
//! ever read into memory.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;

use super::cleanup::{kill_process_group, spawn_registered, Group};
use super::config::CompilerConfig;
use super::programs::is_bare_name;
use crate::{Error, Result};

/// At most this many bytes of a compiler's output go into an error message.
pub(super) const TAIL_BYTES: u64 = 16 * 1024;
/// At most this many lines of a compiler's output go into an error message.
pub(super) const TAIL_LINES: usize = 200;

/// What running the compiler produced.
pub(super) struct ProgramRun {
    /// The exit status.
    pub status: ExitStatus,
    /// Whether the timeout expired and the compiler's process group was killed.
    pub timed_out: bool,
    /// Its standard output and error.
    pub output: Captured,
}

/// Runs `config`'s compiler with `args` in `dir` and waits for it, killing it (and everything
/// it started) when `config.timeout` expires. `command` is the command line for messages.
pub(super) fn run_compiler(
    config: &CompilerConfig,
    args: &[OsString],
    dir: &Path,
    command: &str,
) -> Result<ProgramRun> {
    start_compiler(config, args, dir, command)?.wait()
}

/// A compiler started by [`start_compiler`]: its process group is killed when the timeout
/// expires, and it is waited for by [`Running::wait`] or killed and reaped by
/// [`Running::kill`] (or when dropped).
pub(super) struct Running {
    child: Child,
    group: Option<Group>,
    /// Told when the compiler has exited (or is being killed); the watchdog then ends.
    done: Option<mpsc::Sender<()>>,
    /// The watchdog thread: true if it killed the compiler.
    watchdog: Option<thread::JoinHandle<bool>>,
    stdout: Option<File>,
    stderr: Option<File>,
    command: String,
}

/// Starts `config`'s compiler with `args` in `dir` (see [`run_compiler`]) and returns without
/// waiting for it.
pub(super) fn start_compiler(
    config: &CompilerConfig,
    args: &[OsString],
    dir: &Path,
    command: &str,
) -> Result<Running> {
    // The compiler runs in `dir`, so a relative compiler path must be made absolute first.
    let program = config.program()?;

    // Output goes to unnamed files rather than pipes: no reader threads are needed, a process
    // that outlives the compiler cannot keep us waiting for end-of-file, and any amount of
    // output costs disk space rather than memory.
    let capture =
        || tempfile::tempfile_in(dir).map_err(|e| Error::io("creating a compiler output file", e));
    let stdout = capture()?;
    let stderr = capture()?;
    let dup = |f: &File| {
        f.try_clone()
            .map_err(|e| Error::io("duplicating a compiler output file", e))
    };

    let mut cmd = Command::new(&program);
    cmd.args(args)
        .current_dir(dir)
        // The compiler's own intermediate files go into our directory and vanish with it.
        .env("TMPDIR", dir)
        .stdin(Stdio::null())
        .stdout(dup(&stdout)?)
        .stderr(dup(&stderr)?)
        // A process group of its own, so that a timeout or a signal can kill the compiler's
        // children (cc1, as, ld) too.
        .process_group(0);
    // A sanitizer runtime preloaded into this process (to load sanitized routines) must not
    // be preloaded into the compiler: it would report the compiler's leaks as errors.
    match compiler_preload(std::env::var_os("LD_PRELOAD").as_deref()) {
        Some(p) if p.is_empty() => {
            cmd.env_remove("LD_PRELOAD");
        }
        Some(p) => {
            cmd.env("LD_PRELOAD", p);
        }
        None => {}
    }
    let (mut child, group) = spawn_registered(&mut cmd).map_err(|e| {
        let what = if e.kind() == io::ErrorKind::NotFound {
            if is_bare_name(&config.compiler) {
                "not found in PATH".to_string()
            } else {
                "no such file".to_string()
            }
        } else {
            format!("cannot be started: {e}")
        };
        Error::CompilerNotFound(format!(
            "{}: {what} (command: {command}; set ARRAYJIT_CC or CC to choose a C compiler)",
            config.compiler.display()
        ))
    })?;
    drop(cmd); // closes our copies of the child's output descriptors

    // A watchdog thread kills the compiler's process group when the timeout expires; the
    // caller waits for the compiler itself.
    let pid = child.id() as i32;
    let timeout = config.timeout;
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let watchdog = thread::Builder::new()
        .name("arrayjit-cc-watchdog".into())
        .spawn(move || match done_rx.recv_timeout(timeout) {
            Err(RecvTimeoutError::Timeout) => {
                kill_process_group(pid);
                true
            }
            Ok(()) | Err(RecvTimeoutError::Disconnected) => false,
        });
    let watchdog = match watchdog {
        Ok(w) => w,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::io("starting the compiler watchdog thread", e));
        }
    };
    Ok(Running {
        child,
        group: Some(group),
        done: Some(done_tx),
        watchdog: Some(watchdog),
        stdout: Some(stdout),
        stderr: Some(stderr),
        command: command.to_string(),
    })
}

impl Running {
    /// Waits for the compiler to exit (or be killed by the watchdog) and reaps it.
    pub(super) fn wait(mut self) -> Result<ProgramRun> {
        // Wait for the compiler to exit without reaping it, so that its process group id stays
        // ours until the watchdog and the signal registry have let go of it.
        if let Err(e) = wait_exited(self.child.id() as i32) {
            self.kill_and_reap();
            return Err(Error::io(format!("waiting for {}", self.command), e));
        }
        let killed = self.stop_watchdog();
        if let Some(g) = self.group.take() {
            g.unregister();
        }
        let status = self
            .child
            .wait()
            .map_err(|e| Error::io(format!("waiting for {}", self.command), e))?;
        let (Some(stdout), Some(stderr)) = (self.stdout.take(), self.stderr.take()) else {
            return Err(Error::Internal("a compiler run waited for twice".into()));
        };
        Ok(ProgramRun {
            status,
            // A compiler that finished successfully just as the timeout expired still counts.
            timed_out: killed && !status.success(),
            output: Captured { stdout, stderr },
        })
    }

    /// Kills the compiler and every process it started, and reaps it.
    pub(super) fn kill(mut self) {
        self.kill_and_reap();
    }

    /// Ends the watchdog (if it is still running); whether it killed the compiler.
    fn stop_watchdog(&mut self) -> bool {
        drop(self.done.take());
        // The watchdog never panics; treat a panic as "did not kill".
        self.watchdog
            .take()
            .is_some_and(|w| w.join().unwrap_or(false))
    }

    /// Kills and reaps the compiler unless it was reaped already (its group is then gone).
    fn kill_and_reap(&mut self) {
        if self.group.is_none() {
            return;
        }
        // The leader is not reaped yet, so its process group id is still ours.
        kill_process_group(self.child.id() as i32);
        let _ = wait_exited(self.child.id() as i32);
        self.stop_watchdog();
        if let Some(g) = self.group.take() {
            g.unregister();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    /// A compiler neither waited for nor killed (an early return) is killed and reaped.
    fn drop(&mut self) {
        self.kill_and_reap();
    }
}

/// Blocks until the child `pid` has exited, leaving it unreaped (`waitid` with `WNOWAIT`).
fn wait_exited(pid: i32) -> io::Result<()> {
    let Ok(id) = libc::id_t::try_from(pid) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    loop {
        // SAFETY: an all-zero `siginfo_t` is a valid value of that plain C struct, and waitid
        // only writes into the struct we pass; `id` is our own unreaped child.
        let r = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PID, id, &mut info, libc::WEXITED | libc::WNOWAIT)
        };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A compiler's captured standard output and error (unnamed files). Read as one stream: the
/// standard output, a newline if it did not end with one and there is error output, then the
/// standard error.
pub(super) struct Captured {
    stdout: File,
    stderr: File,
}

/// The end of a captured output.
pub(super) struct Tail {
    /// The last lines (at most [`TAIL_LINES`] lines and [`TAIL_BYTES`] bytes; whole lines
    /// unless one line is longer than that), non-UTF-8 bytes replaced.
    pub text: String,
    /// How many bytes before `text` were left out (0: `text` is everything).
    pub omitted: u64,
}

impl Captured {
    fn len_of(f: &File) -> io::Result<u64> {
        f.metadata().map(|m| m.len())
    }

    /// The byte at `pos` of `f`.
    fn byte_at(mut f: &File, pos: u64) -> io::Result<u8> {
        let mut b = [0u8];
        f.seek(SeekFrom::Start(pos))?;
        f.read_exact(&mut b)?;
        Ok(b[0])
    }

    /// The three parts of the stream: (stdout length, separator, stderr length).
    fn layout(&self) -> io::Result<(u64, &'static [u8], u64)> {
        let out = Self::len_of(&self.stdout)?;
        let err = Self::len_of(&self.stderr)?;
        let sep: &[u8] = if out > 0 && err > 0 && Self::byte_at(&self.stdout, out - 1)? != b'\n' {
            b"\n"
        } else {
            b""
        };
        Ok((out, sep, err))
    }

    /// The stream's total length in bytes.
    pub(super) fn len(&self) -> Result<u64> {
        let (out, sep, err) = self.layout().map_err(read_err)?;
        Ok(out + sep.len() as u64 + err)
    }

    /// Reads bytes `from..` of `f` (to its end) into `buf`.
    fn read_from(mut f: &File, from: u64, buf: &mut Vec<u8>) -> io::Result<()> {
        f.seek(SeekFrom::Start(from))?;
        f.read_to_end(buf)?;
        Ok(())
    }

    /// The stream's tail, reading at most [`TAIL_BYTES`] of it.
    pub(super) fn tail(&self) -> Result<Tail> {
        self.tail_limited(TAIL_BYTES, TAIL_LINES)
    }

    /// Bytes `from..` of the stream.
    fn read_stream_from(&self, from: u64) -> io::Result<Vec<u8>> {
        let (out, sep, err) = self.layout()?;
        let total = out + sep.len() as u64 + err;
        let mut bytes = Vec::with_capacity(total.saturating_sub(from) as usize);
        // The stream is stdout [0, out), the separator [out, out + sep), then stderr.
        if from < out {
            Self::read_from(&self.stdout, from, &mut bytes)?;
            bytes.truncate((out - from) as usize);
        }
        for (i, b) in sep.iter().enumerate() {
            if out + i as u64 >= from {
                bytes.push(*b);
            }
        }
        let err_start = out + sep.len() as u64;
        Self::read_from(&self.stderr, from.saturating_sub(err_start), &mut bytes)?;
        bytes.truncate(total.saturating_sub(from) as usize);
        Ok(bytes)
    }

    fn tail_limited(&self, max_bytes: u64, max_lines: usize) -> Result<Tail> {
        let total = self.len()?;
        // The first byte that may be kept, and the one before it (to know whether `start`
        // begins a line).
        let start = total.saturating_sub(max_bytes);
        let read_start = start.saturating_sub(1);
        let bytes = self.read_stream_from(read_start).map_err(read_err)?;
        let mut skip = (start - read_start) as usize;
        // Started in the middle of a line: drop its rest (unless it is the only line).
        if start > 0 && bytes.first() != Some(&b'\n') {
            if let Some(nl) = bytes[skip..].iter().position(|&b| b == b'\n') {
                if skip + nl + 1 < bytes.len() {
                    skip += nl + 1;
                }
            }
        }
        // At most `max_lines` lines (a final newline does not start another one).
        let body = &bytes[skip..];
        let newlines: Vec<usize> = body
            .iter()
            .enumerate()
            .filter(|(i, &b)| b == b'\n' && i + 1 < body.len())
            .map(|(i, _)| i)
            .collect();
        if max_lines > 0 && newlines.len() >= max_lines {
            skip += newlines[newlines.len() - max_lines] + 1;
        }
        Ok(Tail {
            text: String::from_utf8_lossy(&bytes[skip..]).into_owned(),
            omitted: read_start + skip as u64,
        })
    }

    /// Copies the whole stream into `w` (without holding it in memory).
    pub(super) fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let (_, sep, _) = self.layout()?;
        let mut out = &self.stdout;
        out.seek(SeekFrom::Start(0))?;
        io::copy(&mut out, w)?;
        w.write_all(sep)?;
        let mut err = &self.stderr;
        err.seek(SeekFrom::Start(0))?;
        io::copy(&mut err, w)?;
        Ok(())
    }

    /// Whether the stream contains `needle` (read in chunks, never whole).
    pub(super) fn contains(&self, needle: &[u8]) -> Result<bool> {
        const CHUNK: usize = 1 << 16;
        if needle.is_empty() {
            return Ok(true);
        }
        for f in [&self.stdout, &self.stderr] {
            let mut f = f;
            f.seek(SeekFrom::Start(0)).map_err(read_err)?;
            let mut buf = vec![0u8; CHUNK + needle.len()];
            let mut kept = 0usize;
            loop {
                let n = f.read(&mut buf[kept..]).map_err(read_err)?;
                if n == 0 {
                    break;
                }
                let filled = kept + n;
                if buf[..filled].windows(needle.len()).any(|w| w == needle) {
                    return Ok(true);
                }
                // Keep the last needle.len() - 1 bytes, in case the needle straddles chunks.
                kept = (needle.len() - 1).min(filled);
                buf.copy_within(filled - kept..filled, 0);
            }
        }
        Ok(false)
    }

    /// The standard output alone, if it is at most `limit` bytes.
    pub(super) fn stdout_text(&self, limit: u64) -> Result<Option<String>> {
        let len = Self::len_of(&self.stdout).map_err(read_err)?;
        if len > limit {
            return Ok(None);
        }
        let mut bytes = Vec::new();
        Self::read_from(&self.stdout, 0, &mut bytes).map_err(read_err)?;
        Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
    }
}

fn read_err(e: io::Error) -> Error {
    Error::io("reading the compiler's output", e)
}

/// Whether a file in `LD_PRELOAD` is a sanitizer runtime.
pub(super) fn is_sanitizer_runtime(path: &[u8]) -> bool {
    let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    let name = String::from_utf8_lossy(name);
    ["libasan", "libhwasan", "libtsan", "liblsan", "libubsan"]
        .iter()
        .any(|p| name.starts_with(p))
        || (name.starts_with("libclang_rt.") && name.contains("san"))
}

/// The `LD_PRELOAD` to give the compiler when `preload` (the process's) preloads sanitizer
/// runtimes: the same without them (`Some(empty)`: unset it). `None`: leave it as it is.
pub(super) fn compiler_preload(preload: Option<&OsStr>) -> Option<OsString> {
    let bytes = preload?.as_bytes();
    // ld.so separates LD_PRELOAD entries by spaces or colons.
    let entries: Vec<&[u8]> = bytes
        .split(|&b| b == b' ' || b == b':')
        .filter(|e| !e.is_empty())
        .collect();
    if !entries.iter().any(|e| is_sanitizer_runtime(e)) {
        return None;
    }
    let kept: Vec<&[u8]> = entries
        .into_iter()
        .filter(|e| !is_sanitizer_runtime(e))
        .collect();
    Some(OsString::from_vec(kept.join(&b' ')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(out: &[u8], err: &[u8]) -> Captured {
        let mk = |b: &[u8]| {
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(b).unwrap();
            f
        };
        Captured {
            stdout: mk(out),
            stderr: mk(err),
        }
    }

    fn all(c: &Captured) -> Vec<u8> {
        let mut v = Vec::new();
        c.write_to(&mut v).unwrap();
        v
    }

    #[test]
    fn small_output_is_whole() {
        let c = captured(b"out", b"err\n");
        assert_eq!(all(&c), b"out\nerr\n");
        assert_eq!(c.len().unwrap(), 8);
        let t = c.tail().unwrap();
        assert_eq!((t.text.as_str(), t.omitted), ("out\nerr\n", 0));
        let c = captured(b"out\n", b"");
        assert_eq!(c.tail().unwrap().text, "out\n");
        let c = captured(b"", b"");
        assert_eq!(c.tail().unwrap().text, "");
        assert!(c.contains(b"").unwrap());
        assert!(!c.contains(b"x").unwrap());
    }

    #[test]
    fn tail_keeps_whole_last_lines() {
        let out: String = (0..10).map(|i| format!("o{i}\n")).collect();
        let err: String = (0..10).map(|i| format!("e{i}\n")).collect();
        let c = captured(out.as_bytes(), err.as_bytes());
        // By lines.
        let t = c.tail_limited(1000, 3).unwrap();
        assert_eq!(t.text, "e7\ne8\ne9\n");
        assert_eq!(t.omitted, 60 - 9);
        // By bytes: 10 bytes start inside "e6\n"... and the partial line is dropped.
        let t = c.tail_limited(10, 100).unwrap();
        assert_eq!(t.text, "e7\ne8\ne9\n");
        assert_eq!(t.omitted, 51);
        // Across the stdout/stderr boundary.
        let t = c.tail_limited(1000, 11).unwrap();
        assert_eq!(t.text, format!("o9\n{err}"));
        // One huge line: its end is kept.
        let c = captured(b"", &[b'x'; 100]);
        let t = c.tail_limited(10, 5).unwrap();
        assert_eq!((t.text.as_str(), t.omitted), ("xxxxxxxxxx", 90));
        // The separator when stdout does not end with a newline.
        let c = captured(b"a\nb", b"c\n");
        assert_eq!(c.tail_limited(4, 10).unwrap().text, "b\nc\n");
        assert_eq!(c.tail_limited(3, 10).unwrap().text, "c\n");
    }

    #[test]
    fn contains_finds_needles_across_chunks() {
        let mut big = vec![b'.'; (1 << 16) - 3];
        big.extend_from_slice(b"Assembler messages");
        let c = captured(b"", &big);
        assert!(c.contains(b"Assembler messages").unwrap());
        assert!(!c.contains(b"Assembler messagez").unwrap());
        let c = captured(b"in stdout", b"");
        assert!(c.contains(b"stdout").unwrap());
    }

    #[test]
    fn the_compiler_runs_without_preloaded_sanitizer_runtimes() {
        let p = |s: &str| compiler_preload(Some(std::ffi::OsStr::new(s)));
        assert_eq!(compiler_preload(None), None);
        assert_eq!(p("/usr/lib/libfaketime.so"), None);
        assert_eq!(
            p("/usr/lib/gcc/x86_64-linux-gnu/12/libasan.so /usr/lib/gcc/x86_64-linux-gnu/12/libubsan.so"),
            Some(OsString::new())
        );
        assert_eq!(
            p("/usr/lib/libfaketime.so:/usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.asan-x86_64.so libother.so"),
            Some(OsString::from("/usr/lib/libfaketime.so libother.so"))
        );
        assert_eq!(p("libtsan.so.2"), Some(OsString::new()));
    }
}
