//! Speculating on the target: generating code and compiling while the target probe runs.
//!
//! The first compile on a machine (a fresh cache directory) has to ask the compiler what it
//! makes of the architecture flags ([`Target::resolve`], a compiler run of about 10 ms) before
//! code can be generated, because code generation depends on the target. [`Speculation::start`]
//! takes that probe off the critical path: when the target is not remembered, the
//! architecture flags are `-march=native` (the default), no extra flag starts with `-m` and no
//! debug directory is kept, it starts the probe on a background thread and guesses the target
//! from what the running CPU reports (`is_x86_feature_detected!`; x86-64 only). The caller
//! generates code for the guess ([`Speculation::vector_target`]) and compiles it at once
//! (`compile_and_load_speculative`), while the probe runs on another core.
//!
//! When the probe answers, the guess is compared with it on everything code generation and the
//! compile command take from the target ([`TargetUse`]: the [`VectorTarget`] and whether
//! `-mno-avx512fp16` is added). If they agree, the compile is exactly the one the probed
//! target leads to (same source, same command) and its object is used and stored under the
//! probed target's cache key (the key, with the target's fingerprint, is only computed once
//! the probe has answered; see the `cache` module). If they disagree, or the probe fails, the
//! compile is killed and its output discarded, and the caller generates and compiles again for
//! the probed target (the ordinary path, which also reports a failing probe). A probe that
//! timed out is the error at once, as on the ordinary path. Errors of the work for the guess
//! (code generation, the compile) are only reported once the probe has confirmed the guess
//! ([`Speculation::confirmed`]); otherwise the work is redone for the probed target. So a
//! wrong guess costs time, never correctness.

use std::sync::{Mutex, OnceLock};
use std::thread::{self, JoinHandle};

use super::config::CompilerConfig;
use super::target::Target;
use crate::target::VectorTarget;
use crate::{Error, Result};

/// What code generation and the compile command take from a [`Target`]: what a guess must
/// agree on with the probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TargetUse {
    /// The target as the optimizer and the C writer see it ([`Target::vector_target`]).
    pub vector: VectorTarget,
    /// Whether the target has AVX512-FP16 (then the compile adds `-mno-avx512fp16`).
    pub avx512fp16: bool,
}

impl TargetUse {
    /// What code generation and the compile command take from `target`.
    pub(crate) fn of(target: &Target, config: &CompilerConfig) -> TargetUse {
        TargetUse {
            vector: target.vector_target_for(config),
            avx512fp16: target.features.avx512fp16,
        }
    }
}

/// The probe's answer, as compiles waiting for it need it.
enum Answer {
    /// The probed target.
    Target(Target),
    /// The probe timed out: the compiler hangs.
    TimedOut { command: String, seconds: u64 },
    /// The probe failed otherwise (the ordinary path probes again and reports why).
    Failed,
}

/// What the probe says about a guess.
pub(super) enum Verdict {
    /// The guess agrees with the probed target.
    Confirmed(Target),
    /// The guess disagrees with the probed target, or the probe failed: discard the compile.
    Disproved,
}

/// A guess at the target, and the probe running in the background that will confirm or
/// disprove it. Dropping it waits for the probe (which the probe's own timeout bounds), so
/// the probe's process is always reaped.
pub(crate) struct Speculation {
    assumed: TargetUse,
    /// The configuration the guess was made for.
    config: CompilerConfig,
    /// The probe's thread, until a compile has waited for it.
    thread: Mutex<Option<JoinHandle<Result<Target>>>>,
    answer: OnceLock<Answer>,
}

#[cfg(test)]
thread_local! {
    /// A guess [`Speculation::start`] uses on this thread instead of the CPU's, regardless of
    /// the memo and the flags (tests only).
    static FORCED_GUESS: std::cell::Cell<Option<TargetUse>> = const { std::cell::Cell::new(None) };
}

/// Makes [`Speculation::start`] on this thread speculate with `guess` (tests only).
#[cfg(test)]
pub(crate) fn force_guess(guess: Option<TargetUse>) {
    FORCED_GUESS.with(|g| g.set(guess));
}

impl Speculation {
    /// Starts the target probe in the background and guesses the target, when that can save
    /// time (see the module documentation); `None`: resolve the target as usual.
    pub(crate) fn start(config: &CompilerConfig) -> Option<Speculation> {
        #[cfg(test)]
        if let Some(guess) = FORCED_GUESS.with(std::cell::Cell::get) {
            return Speculation::with_guess(config, guess);
        }
        let guessable = config.arch_flags.len() == 1
            && config.arch_flags[0] == "-march=native"
            && !config.extra_flags.iter().any(|f| f.starts_with("-m"))
            && config.debug_dir.is_none();
        if !guessable || Target::remembered(config).is_some() {
            return None;
        }
        let guess = Target::from_macro_dump(&cpu_macros()?).ok()?;
        Speculation::with_guess(config, TargetUse::of(&guess, config))
    }

    /// Starts the target probe in the background (it remembers its answer like
    /// [`Target::resolve`]) with `assumed` as the guess; `None` if no thread can be started.
    pub(crate) fn with_guess(config: &CompilerConfig, assumed: TargetUse) -> Option<Speculation> {
        let cfg = config.clone();
        let thread = thread::Builder::new()
            .name("arrayjit-target-probe".into())
            .spawn(move || Target::resolve(&cfg))
            .ok()?;
        Some(Speculation {
            assumed,
            config: config.clone(),
            thread: Mutex::new(Some(thread)),
            answer: OnceLock::new(),
        })
    }

    /// The target to generate code for meanwhile: the guess.
    pub(crate) fn vector_target(&self) -> VectorTarget {
        self.assumed.vector
    }

    /// Whether the guess has AVX512-FP16 (the compile command depends on it).
    pub(super) fn avx512fp16(&self) -> bool {
        self.assumed.avx512fp16
    }

    /// Waits for the probe and compares its target with the guess. A probe that timed out
    /// is [`Error::CompileTimeout`].
    pub(super) fn verdict(&self) -> Result<Verdict> {
        match self.answer() {
            Answer::Target(t) if TargetUse::of(t, &self.config) == self.assumed => {
                Ok(Verdict::Confirmed(t.clone()))
            }
            Answer::TimedOut { command, seconds } => Err(Error::CompileTimeout {
                command: command.clone(),
                seconds: *seconds,
            }),
            Answer::Target(_) | Answer::Failed => Ok(Verdict::Disproved),
        }
    }

    /// Waits for the probe: whether it agrees with the guess. A probe that timed out is
    /// [`Error::CompileTimeout`].
    pub(crate) fn confirmed(&self) -> Result<bool> {
        Ok(matches!(self.verdict()?, Verdict::Confirmed(_)))
    }

    /// The probe's answer: the first caller joins the probe's thread, the others wait for it.
    fn answer(&self) -> &Answer {
        let mut thread = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(handle) = thread.take() {
            let answer = match handle.join() {
                Ok(Ok(t)) => Answer::Target(t),
                Ok(Err(Error::CompileTimeout { command, seconds })) => {
                    Answer::TimedOut { command, seconds }
                }
                Ok(Err(_)) | Err(_) => Answer::Failed,
            };
            let _ = self.answer.set(answer);
        }
        drop(thread);
        self.answer.get().unwrap_or(&Answer::Failed)
    }
}

impl Drop for Speculation {
    fn drop(&mut self) {
        let thread = self.thread.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(handle) = thread.take() {
            let _ = handle.join();
        }
    }
}

/// The predefined macros of the CPU's instruction-set features that [`TargetUse`] depends on,
/// as `cc -march=native -E -dM` prints them when the compiler knows the CPU.
#[cfg(target_arch = "x86_64")]
fn cpu_macros() -> Option<String> {
    let mut names = vec!["__x86_64__"];
    let features = [
        (is_x86_feature_detected!("sse2"), "__SSE2__"),
        (is_x86_feature_detected!("sse4.1"), "__SSE4_1__"),
        (is_x86_feature_detected!("avx"), "__AVX__"),
        (is_x86_feature_detected!("avx2"), "__AVX2__"),
        (is_x86_feature_detected!("fma"), "__FMA__"),
        (is_x86_feature_detected!("f16c"), "__F16C__"),
        (is_x86_feature_detected!("avx512f"), "__AVX512F__"),
        (is_x86_feature_detected!("avx512bw"), "__AVX512BW__"),
        (is_x86_feature_detected!("avx512dq"), "__AVX512DQ__"),
        (is_x86_feature_detected!("avx512vl"), "__AVX512VL__"),
        (avx512fp16(), "__AVX512FP16__"),
        (is_x86_feature_detected!("avx512bf16"), "__AVX512BF16__"),
    ];
    names.extend(features.iter().filter(|(on, _)| *on).map(|(_, name)| *name));
    Some(names.iter().map(|n| format!("#define {n} 1\n")).collect())
}

/// No guess elsewhere.
#[cfg(not(target_arch = "x86_64"))]
fn cpu_macros() -> Option<String> {
    None
}

/// Whether the CPU (and the operating system) support AVX512-FP16: AVX-512F is usable and
/// CPUID leaf 7 reports AVX512-FP16 (EDX bit 23). (`is_x86_feature_detected!("avx512fp16")`
/// needs a newer Rust than the crate's minimum.)
#[cfg(target_arch = "x86_64")]
fn avx512fp16() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    if !is_x86_feature_detected!("avx512f") {
        return false;
    }
    // SAFETY: CPUID exists on every x86-64 CPU; leaf 7 is only read when the CPU reports it
    // (leaf 0's EAX is the highest leaf). (The functions are safe in newer Rust versions.)
    #[allow(unused_unsafe)]
    unsafe {
        __cpuid(0).eax >= 7 && __cpuid_count(7, 0).edx & (1 << 23) != 0
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::{Duration, Instant};

    use super::super::{compile_and_load, compile_and_load_speculative};
    use super::*;

    const DOUBLER: &str = "#include \"arrayjit.h\"\n\
        int f(void *const *b, const int64_t *s, const void *m, const void *t) {\n\
          (void)m;\n\
          ((double *)b[0])[0] = s[0] * 2.0;\n\
          return 0;\n\
        }\n";

    /// The system compiler with `-march=native`, its cache in `cache` and its temporary
    /// files under `root`.
    fn config(root: &Path, cache: &Path) -> CompilerConfig {
        let base = CompilerConfig::from_env().expect("a C compiler is needed for these tests");
        CompilerConfig {
            opt_level: "1".into(),
            arch_flags: vec!["-march=native".into()],
            extra_flags: vec![],
            debug_dir: None,
            trace_dir: None,
            timeout: Duration::from_secs(120),
            temp_root: Some(root.to_path_buf()),
            cache_dir: Some(cache.to_path_buf()),
            intrinsics: false,
            ..base
        }
    }

    fn doubled(lib: &super::super::LoadedLibrary, s: i64) -> f64 {
        let f = lib.entry("f").unwrap();
        let mut out = [0.0f64];
        let buffers = [out.as_mut_ptr() as *mut u8];
        // SAFETY: DOUBLER's `f` writes one double into buffers[0] and reads statics[0]; its
        // library is alive (borrowed).
        unsafe {
            f(
                buffers.as_ptr(),
                [s].as_ptr(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        out[0]
    }

    /// The `.so` entries of a cache directory.
    fn objects(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".so"))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    fn empty(dir: &Path) -> bool {
        std::fs::read_dir(dir).unwrap().next().is_none()
    }

    /// A guess that agrees with the probe: the speculative compile is used, and stored under
    /// the key an ordinary compile uses (which then hits it).
    #[test]
    fn a_confirmed_guess_is_stored_under_the_probed_key() {
        let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let cfg = config(root.path(), cache.path());
        let probed = Target::resolve(&cfg).unwrap();
        let s = Speculation::with_guess(&cfg, TargetUse::of(&probed, &cfg)).unwrap();
        assert_eq!(s.vector_target(), probed.vector_target_for(&cfg));
        let lib = compile_and_load_speculative(&cfg, &s, DOUBLER, "doubler", &[])
            .unwrap()
            .expect("the guess agrees with the probe");
        assert!(!lib.from_cache());
        assert_eq!(doubled(&lib, 21), 42.0);
        let stored = objects(cache.path());
        assert_eq!(stored.len(), 1);
        let again = compile_and_load(&cfg, DOUBLER, "doubler", &[]).unwrap();
        assert!(again.from_cache(), "the ordinary compile missed the entry");
        assert_eq!(doubled(&again, 5), 10.0);
        assert_eq!(objects(cache.path()), stored);
        assert!(empty(root.path()));
    }

    /// A guess that disagrees with the probe (on the vector target or on AVX512-FP16): the
    /// compile is discarded, nothing is stored, nothing is left behind.
    #[test]
    fn a_disproved_guess_is_discarded() {
        let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let cfg = config(root.path(), cache.path());
        let probed = TargetUse::of(&Target::resolve(&cfg).unwrap(), &cfg);
        let wrong_width = TargetUse {
            vector: VectorTarget {
                vector_bytes: 8,
                ..probed.vector
            },
            ..probed
        };
        let wrong_fp16 = TargetUse {
            avx512fp16: !probed.avx512fp16,
            ..probed
        };
        for guess in [wrong_width, wrong_fp16] {
            let s = Speculation::with_guess(&cfg, guess).unwrap();
            let r = compile_and_load_speculative(&cfg, &s, DOUBLER, "doubler", &[]).unwrap();
            assert!(r.is_none(), "a disproved guess was used ({guess:?})");
            assert!(objects(cache.path()).is_empty());
            assert!(empty(root.path()));
        }
        let lib = compile_and_load(&cfg, DOUBLER, "doubler", &[]).unwrap();
        assert!(!lib.from_cache());
        assert_eq!(doubled(&lib, 4), 8.0);
    }

    /// A probe that hangs is the timeout error, and the speculative compile (which hangs
    /// too) is killed: nothing waits longer than the timeout, nothing is left behind.
    #[test]
    fn a_hanging_probe_is_a_timeout_and_the_compile_is_killed() {
        use std::os::unix::fs::PermissionsExt;
        let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let bin = tempfile::tempdir().unwrap();
        let script = bin.path().join("hang-cc");
        std::fs::write(&script, "#!/bin/sh\nexec sleep 60\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cfg = CompilerConfig {
            compiler: script,
            timeout: Duration::from_secs(1),
            ..config(root.path(), cache.path())
        };
        let guess = TargetUse {
            vector: VectorTarget::default(),
            avx512fp16: false,
        };
        let start = Instant::now();
        let s = Speculation::with_guess(&cfg, guess).unwrap();
        let e = compile_and_load_speculative(&cfg, &s, DOUBLER, "doubler", &[]).unwrap_err();
        assert!(matches!(e, Error::CompileTimeout { seconds: 1, .. }), "{e}");
        drop(s);
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
        assert!(empty(root.path()));
    }

    /// The CPU's guess is a target of this machine's architecture (the probe decides whether
    /// it is the compiler's).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_cpu_guess_reads_the_cpu() {
        let t = Target::from_macro_dump(&cpu_macros().unwrap()).unwrap();
        assert_eq!(t.arch, super::super::Arch::X86_64);
        assert_eq!(t.features.sse2, is_x86_feature_detected!("sse2"));
        assert_eq!(t.features.avx512f, is_x86_feature_detected!("avx512f"));
        assert!(!t.features.avx512fp16 || t.features.avx512f);
    }
}
