//! [`CompilerConfig`]: the compiler and its flags, read from the environment through one strict
//! parser (junk in any variable is an [`Error::Config`] naming the variable, its value and what
//! was expected).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::detect;
use super::programs::{find_in_path, is_bare_name, is_gcc, shell_quote, TARGET};
use crate::{Error, Result};

/// Default for `ARRAYJIT_OPT_LEVEL`.
const DEFAULT_OPT_LEVEL: &str = "3";
/// Default for `ARRAYJIT_ARCH_FLAGS`.
const DEFAULT_ARCH_FLAGS: &str = "-march=native";
/// Default for `ARRAYJIT_COMPILE_TIMEOUT`, in seconds.
const DEFAULT_TIMEOUT_SECS: u64 = 300;
/// Default for `ARRAYJIT_CACHE_MAX`: 1 GiB.
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 1 << 30;
/// What `ARRAYJIT_CACHE_MAX` may hold.
const CACHE_MAX_EXPECTED: &str = "a size in bytes: a whole number of at least 1, optionally \
     followed by K, M, G or T (powers of 1024, KiB... also accepted), such as 500M or 2G \
     (ARRAYJIT_CACHE=off turns the cache off)";
/// The optimization levels `ARRAYJIT_OPT_LEVEL` accepts (each used as `-O<level>`).
const OPT_LEVELS: [&str; 8] = ["0", "1", "2", "3", "s", "z", "g", "fast"];
/// What a boolean variable may hold (case-insensitive), as (word, value).
const BOOLEANS: [(&str, bool); 8] = [
    ("1", true),
    ("on", true),
    ("true", true),
    ("yes", true),
    ("0", false),
    ("off", false),
    ("false", false),
    ("no", false),
];
/// Flags after which the next word is the flag's argument rather than a flag of its own.
const FLAGS_WITH_ARGUMENT: [&str; 24] = [
    "-include",
    "-imacros",
    "-isystem",
    "-idirafter",
    "-iquote",
    "-iprefix",
    "-isysroot",
    "-I",
    "-D",
    "-U",
    "-L",
    "-l",
    "-x",
    "-B",
    "-Xlinker",
    "-Xassembler",
    "-Xpreprocessor",
    "-Xclang",
    "-mllvm",
    "-MF",
    "-MT",
    "-MQ",
    "--param",
    "-target",
];
/// Flags that would change what the compiler produces; the compile stage chooses that itself.
const FORBIDDEN_FLAGS: [&str; 4] = ["-o", "-c", "-S", "-E"];

/// Flags added for GCC (see [`CompilerConfig::from_env`]). `-fno-loop-interchange`: GCC 12.2
/// at `-O3` with `--param=max-completely-peel-times=1` interchanges
/// `for a { for b { o[b*5 + a*5 + s] = t[b]; } }`, whose iterations write the same cells in
/// an order that matters (an affine result entry `(a+b)` with `set`), and the last write
/// wins from the wrong iteration (`tests/affine.rs`, `regression_gcc12_loop_interchange`).
pub const GCC_WORKAROUND_FLAGS: [&str; 2] = ["-fno-tree-loop-if-convert", "-fno-loop-interchange"];

/// Flags always added for GCC, before the user's: at `-O3`, GCC completely peels every loop
/// with a small constant trip count, which made it spend seconds on the few hundred lines of
/// a training step (2.2 s against 0.26 s with this flag, measured on the moons gradient
/// routine) for no measurable speed: vectorization and everything else of `-O3` stay.
pub const GCC_SPEED_FLAGS: [&str; 1] = ["--param=max-completely-peel-times=1"];

/// Compiler settings, read from the environment ([`CompilerConfig::from_env`]) or built from
/// [`CompilerConfig::new`]; either way the setters below (one per field, by the field's name)
/// change them, for example
/// `CompilerConfig::from_env()?.opt_level("1").temp_root(Some(dir))`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompilerConfig {
    /// The C compiler: a path, or a bare program name looked up in `PATH`.
    pub compiler: PathBuf,
    /// The optimization level, passed as `-O<opt_level>` (e.g. `"3"`, `"2"`, `"s"`).
    pub opt_level: String,
    /// Target-architecture flags (default `-march=native`), passed after the optimization level.
    pub arch_flags: Vec<String>,
    /// Further flags, passed after the architecture flags.
    pub extra_flags: Vec<String>,
    /// Where to keep the source, command line and compiler output of every compile, if anywhere.
    pub debug_dir: Option<PathBuf>,
    /// Trace logging: generated routines append, on every run, each value their assignments
    /// store (with its indices) to `<trace_dir>/`[`trace_file_name`]`(routine)`, one whole
    /// line per value; the directory is created (mode 0700) when code is compiled if it is
    /// missing. For debugging tiny computations: tracing code is scalar (no vector kernels)
    /// and slow.
    ///
    /// [`trace_file_name`]: crate::codegen::trace_file_name
    pub trace_dir: Option<PathBuf>,
    /// How long the compiler may run before it (and every process it started) is killed.
    pub timeout: Duration,
    /// The directory in which private temporary directories are created;
    /// `None` means [`std::env::temp_dir`].
    pub temp_root: Option<PathBuf>,
    /// Where compiled shared objects are cached (`None`: no cache). See
    /// [`compile_and_load`](super::compile_and_load).
    pub cache_dir: Option<PathBuf>,
    /// The most bytes the compiled objects in [`cache_dir`](Self::cache_dir) may take: after
    /// storing an object, the least recently used ones are deleted until they fit (see
    /// [`CompileCache`](super::CompileCache)); an object larger than this is not stored.
    pub cache_max_bytes: u64,
    /// How many compiler processes one `compile_batch` of the cc backend may run at once
    /// (a batch is dealt out to that many files); `0` counts as `1`.
    pub compile_jobs: usize,
    /// Spell vector code with the instruction set's intrinsics (`<immintrin.h>`,
    /// `<arm_neon.h>`) instead of GCC/Clang vector extensions of the same width. Both give
    /// the same instructions; the intrinsics' headers add about 70 ms to every compile.
    pub intrinsics: bool,
    /// Contract bfloat16 (and fp8) operands into single-precision results with AVX512-BF16's
    /// dot products of pairs (`vdpbf16ps`) where the target has them, instead of converting
    /// the operands to `float` while packing and using the `float` kernel. Off by default:
    /// on the Sapphire Rapids machine measured, `vdpbf16ps` retired one instruction per 3.7
    /// cycles against two FMAs per cycle, so the pairs kernel ran a 1024³ product at 105
    /// GFLOP/s against 176 for the converting kernel; and the instruction flushes subnormal
    /// inputs and results to zero (SPEC's semantics chapter). CPUs with a full-rate
    /// instruction may gain from it.
    pub bf16_dot: bool,
    /// Bounds-checked code: every array access of the generated code checks its indices
    /// against the tensor's extents first; an access outside is
    /// [`Error::IndexOutOfBounds`] naming the routine, the tensor, the indices and the
    /// extents (the routine stops there, never crashes). Slower; checked code is cached
    /// apart from unchecked code (its C differs).
    pub checked: bool,
}

/// Reads environment variables through one strict path: every accessor either returns a
/// usable value (or `None` for unset) or an [`Error::Config`] naming the variable, its value
/// and what was expected.
struct Env<F: Fn(&str) -> Option<OsString>> {
    get: F,
}

/// The boolean environment variable `var`: `1`/`on`/`true`/`yes` or `0`/`off`/`false`/`no`
/// (any case); `default` when unset or empty.
///
/// # Errors
///
/// [`Error::Config`] naming the variable, its value and what was expected, for any other
/// value.
pub fn env_boolean(var: &str, default: bool) -> Result<bool> {
    Env {
        get: |v: &str| std::env::var_os(v),
    }
    .boolean(var, default)
}

/// An [`Error::Config`].
fn config_error(var: &str, value: &OsStr, expected: impl Into<String>) -> Error {
    Error::Config {
        var: var.to_string(),
        value: value.to_string_lossy().into_owned(),
        expected: expected.into(),
    }
}

impl<F: Fn(&str) -> Option<OsString>> Env<F> {
    /// The raw value; the empty string counts as unset.
    fn raw(&self, var: &str) -> Option<OsString> {
        (self.get)(var).filter(|v| !v.is_empty())
    }

    /// The value as UTF-8 text, if set and non-empty.
    fn text(&self, var: &str, expected: &str) -> Result<Option<String>> {
        match self.raw(var) {
            None => Ok(None),
            Some(v) => v
                .into_string()
                .map(Some)
                .map_err(|v| config_error(var, &v, format!("{expected} (in valid UTF-8)"))),
        }
    }

    /// A path (any bytes), if set and non-empty.
    fn path(&self, var: &str) -> Option<PathBuf> {
        self.raw(var).map(PathBuf::from)
    }

    /// A boolean: `1`/`on`/`true`/`yes` or `0`/`off`/`false`/`no`, any case.
    fn boolean(&self, var: &str, default: bool) -> Result<bool> {
        let expected = "1, on, true or yes to enable; 0, off, false or no to disable";
        let Some(v) = self.text(var, expected)? else {
            return Ok(default);
        };
        let word = v.trim().to_ascii_lowercase();
        BOOLEANS
            .iter()
            .find(|(w, _)| *w == word)
            .map(|&(_, b)| b)
            .ok_or_else(|| config_error(var, OsStr::new(&v), expected))
    }

    /// Whitespace-separated compiler flags. `None` if the variable is unset; with
    /// `empty_is_none == false` an empty value is `Some(vec![])` (no flags).
    fn flags(&self, var: &str, empty_is_none: bool) -> Result<Option<Vec<String>>> {
        let expected = "compiler flags separated by whitespace, each starting with '-'";
        let value = match (self.get)(var) {
            None => return Ok(None),
            Some(v) if v.is_empty() && empty_is_none => return Ok(None),
            Some(v) => v,
        };
        let text = value
            .to_str()
            .ok_or_else(|| config_error(var, &value, format!("{expected} (in valid UTF-8)")))?;
        let words: Vec<String> = text.split_whitespace().map(str::to_string).collect();
        let mut wants_argument: Option<&str> = None;
        for w in &words {
            if wants_argument.take().is_some() {
                continue;
            }
            if FORBIDDEN_FLAGS.contains(&w.as_str()) {
                return Err(config_error(
                    var,
                    &value,
                    format!(
                        "{expected}, but not {w} (arrayjit chooses what the compiler produces)"
                    ),
                ));
            }
            if !w.starts_with('-') || w == "-" {
                return Err(config_error(
                    var,
                    &value,
                    format!("{expected} ({w:?} does not)"),
                ));
            }
            if let Some(f) = FLAGS_WITH_ARGUMENT.iter().find(|f| **f == w) {
                wants_argument = Some(f);
            }
        }
        if let Some(f) = wants_argument {
            return Err(config_error(
                var,
                &value,
                format!("{expected} ({f} needs an argument after it)"),
            ));
        }
        Ok(Some(words))
    }

    /// A size in bytes of at least 1: a whole number with an optional binary suffix (`K`,
    /// `M`, `G`, `T` or `KiB`, `MiB`, `GiB`, `TiB`, any case; `B` for bytes).
    fn size(&self, var: &str, expected: &str) -> Result<Option<u64>> {
        let Some(v) = self.text(var, expected)? else {
            return Ok(None);
        };
        parse_size(v.trim())
            .map(Some)
            .ok_or_else(|| config_error(var, OsStr::new(&v), expected))
    }

    /// The compile cache's directory (`None` when `ARRAYJIT_CACHE` is off or no directory
    /// is known) and its size limit.
    fn cache(&self) -> Result<(Option<PathBuf>, u64)> {
        let cache_on = self.boolean("ARRAYJIT_CACHE", true)?;
        let max = self
            .size("ARRAYJIT_CACHE_MAX", CACHE_MAX_EXPECTED)?
            .unwrap_or(DEFAULT_CACHE_MAX_BYTES);
        let dir = if cache_on {
            self.path("ARRAYJIT_CACHE_DIR")
                .or_else(|| {
                    // The XDG specification says to ignore a relative XDG_CACHE_HOME.
                    self.path("XDG_CACHE_HOME")
                        .filter(|d| d.is_absolute())
                        .map(|d| d.join("arrayjit"))
                })
                .or_else(|| self.path("HOME").map(|h| h.join(".cache/arrayjit")))
        } else {
            None
        };
        Ok((dir, max))
    }

    /// A whole number of at least 1.
    fn positive_count(&self, var: &str, expected: &str) -> Result<Option<usize>> {
        let Some(v) = self.text(var, expected)? else {
            return Ok(None);
        };
        match v.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(Some(n)),
            _ => Err(config_error(var, OsStr::new(&v), expected)),
        }
    }
}

/// Parses `ARRAYJIT_CACHE_MAX`'s syntax (see [`Env::size`]); `None` for anything else, zero
/// and sizes beyond `u64`.
fn parse_size(text: &str) -> Option<u64> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, suffix) = text.split_at(digits);
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        _ => return None,
    };
    let n: u64 = number.parse().ok()?;
    let bytes = n.checked_mul(1u64 << shift)?;
    (bytes > 0).then_some(bytes)
}

/// The compile cache's settings from the environment: the directory (`None` when
/// `ARRAYJIT_CACHE` is off or neither `ARRAYJIT_CACHE_DIR`, `XDG_CACHE_HOME` nor `HOME`
/// gives one) and `ARRAYJIT_CACHE_MAX`, parsed as by [`CompilerConfig::from_env`].
pub(super) fn cache_settings(
    get: impl Fn(&str) -> Option<OsString>,
) -> Result<(Option<PathBuf>, u64)> {
    Env { get }.cache()
}

/// The flags always added for a GCC `compiler` ([`GCC_SPEED_FLAGS`], and with
/// `workaround_on` [`GCC_WORKAROUND_FLAGS`] first); none for another compiler.
fn gcc_flags(compiler: &Path, workaround_on: bool) -> Vec<String> {
    let gcc = is_gcc(compiler);
    let mut flags: Vec<String> = if workaround_on && gcc {
        GCC_WORKAROUND_FLAGS.iter().map(|f| f.to_string()).collect()
    } else {
        Vec::new()
    };
    if gcc {
        flags.extend(GCC_SPEED_FLAGS.iter().map(|f| f.to_string()));
    }
    flags
}

impl CompilerConfig {
    /// The configuration [`CompilerConfig::from_env`] reads from an empty environment, with
    /// `compiler` as the compiler: `-O3 -march=native`, for GCC its workaround and speed
    /// flags ([`GCC_WORKAROUND_FLAGS`], [`GCC_SPEED_FLAGS`]) as extra flags, no debug or
    /// trace directory, a 300 s timeout, the system's temporary directory, no compile cache
    /// (its size limit [`DEFAULT_CACHE_MAX_BYTES`]), one compile job per available core,
    /// vector extensions rather than intrinsics, unchecked code. Reads no environment
    /// variable; the compiler is not checked until code is compiled.
    ///
    /// ```
    /// use arrayjit::compile::CompilerConfig;
    /// use std::time::Duration;
    ///
    /// let config = CompilerConfig::new("clang")
    ///     .opt_level("2")
    ///     .arch_flags(vec!["-march=x86-64-v2".into()])
    ///     .timeout(Duration::from_secs(60))
    ///     .compile_jobs(1);
    /// assert_eq!(config.compiler.to_str(), Some("clang"));
    /// assert_eq!(config.opt_level, "2");
    /// assert!(config.extra_flags.is_empty()); // not GCC: no workaround flags
    /// assert_eq!(config.cache_dir, None);
    /// ```
    pub fn new(compiler: impl Into<PathBuf>) -> CompilerConfig {
        let compiler = compiler.into();
        CompilerConfig {
            extra_flags: gcc_flags(&compiler, true),
            compiler,
            opt_level: DEFAULT_OPT_LEVEL.to_string(),
            arch_flags: vec![DEFAULT_ARCH_FLAGS.to_string()],
            debug_dir: None,
            trace_dir: None,
            timeout: Duration::from_secs(DEFAULT_TIMEOUT_SECS),
            temp_root: None,
            cache_dir: None,
            cache_max_bytes: DEFAULT_CACHE_MAX_BYTES,
            compile_jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
            intrinsics: false,
            bf16_dot: false,
            checked: false,
        }
    }

    /// Sets [`compiler`](CompilerConfig::compiler) (the extra flags stay as they are).
    pub fn compiler(mut self, compiler: impl Into<PathBuf>) -> CompilerConfig {
        self.compiler = compiler.into();
        self
    }

    /// Sets [`opt_level`](CompilerConfig::opt_level).
    pub fn opt_level(mut self, opt_level: impl Into<String>) -> CompilerConfig {
        self.opt_level = opt_level.into();
        self
    }

    /// Sets [`arch_flags`](CompilerConfig::arch_flags).
    pub fn arch_flags(mut self, arch_flags: Vec<String>) -> CompilerConfig {
        self.arch_flags = arch_flags;
        self
    }

    /// Sets [`extra_flags`](CompilerConfig::extra_flags) (replacing any GCC flags).
    pub fn extra_flags(mut self, extra_flags: Vec<String>) -> CompilerConfig {
        self.extra_flags = extra_flags;
        self
    }

    /// Sets [`debug_dir`](CompilerConfig::debug_dir).
    pub fn debug_dir(mut self, debug_dir: Option<PathBuf>) -> CompilerConfig {
        self.debug_dir = debug_dir;
        self
    }

    /// Sets [`trace_dir`](CompilerConfig::trace_dir).
    pub fn trace_dir(mut self, trace_dir: Option<PathBuf>) -> CompilerConfig {
        self.trace_dir = trace_dir;
        self
    }

    /// Sets [`timeout`](CompilerConfig::timeout).
    pub fn timeout(mut self, timeout: Duration) -> CompilerConfig {
        self.timeout = timeout;
        self
    }

    /// Sets [`temp_root`](CompilerConfig::temp_root).
    pub fn temp_root(mut self, temp_root: Option<PathBuf>) -> CompilerConfig {
        self.temp_root = temp_root;
        self
    }

    /// Sets [`cache_dir`](CompilerConfig::cache_dir).
    pub fn cache_dir(mut self, cache_dir: Option<PathBuf>) -> CompilerConfig {
        self.cache_dir = cache_dir;
        self
    }

    /// Sets [`cache_max_bytes`](CompilerConfig::cache_max_bytes).
    pub fn cache_max_bytes(mut self, cache_max_bytes: u64) -> CompilerConfig {
        self.cache_max_bytes = cache_max_bytes;
        self
    }

    /// Sets [`compile_jobs`](CompilerConfig::compile_jobs).
    pub fn compile_jobs(mut self, compile_jobs: usize) -> CompilerConfig {
        self.compile_jobs = compile_jobs;
        self
    }

    /// Sets [`intrinsics`](CompilerConfig::intrinsics).
    pub fn intrinsics(mut self, intrinsics: bool) -> CompilerConfig {
        self.intrinsics = intrinsics;
        self
    }

    /// Sets [`bf16_dot`](CompilerConfig::bf16_dot).
    pub fn bf16_dot(mut self, bf16_dot: bool) -> CompilerConfig {
        self.bf16_dot = bf16_dot;
        self
    }

    /// Sets [`checked`](CompilerConfig::checked).
    pub fn checked(mut self, checked: bool) -> CompilerConfig {
        self.checked = checked;
        self
    }

    /// Reads the compiler settings from the environment. Every variable is parsed strictly: a
    /// value that cannot be used is [`Error::Config`] naming the variable, its value and what
    /// was expected. Apart from `ARRAYJIT_ARCH_FLAGS`, a variable set to the empty string
    /// counts as unset.
    ///
    /// - the compiler: `ARRAYJIT_CC`, else `CC`, else the `cc` crate's choice for the target the
    ///   crate was built for (remembered in the cache directory, see `docs/configuration.md`). The value
    ///   must name a single program (a path, or a name found in `PATH`); flags go in
    ///   `ARRAYJIT_CFLAGS`. A compiler that cannot be found is [`Error::CompilerNotFound`],
    ///   naming the variable it came from; a value that is not found and contains whitespace
    ///   (`CC="gcc -m32"`) is [`Error::Config`];
    /// - `ARRAYJIT_OPT_LEVEL`: `0`, `1`, `2`, `3`, `s`, `z`, `g` or `fast`, optionally written
    ///   with its `-O` (default `3`);
    /// - `ARRAYJIT_ARCH_FLAGS`: whitespace-separated architecture flags (default
    ///   `-march=native`; set it to an empty string for none);
    /// - `ARRAYJIT_CFLAGS`: whitespace-separated extra flags (default none); with GCC,
    ///   [`GCC_WORKAROUND_FLAGS`] come first unless `ARRAYJIT_GCC_WORKAROUND` is off. Flags in
    ///   both variables must start with `-` (a separate argument may follow a flag that takes
    ///   one, such as `-include FILE`); `-o`, `-c`, `-S` and `-E` are rejected;
    /// - `ARRAYJIT_GCC_WORKAROUND`: a boolean (`1`/`on`/`true`/`yes`, `0`/`off`/`false`/`no`),
    ///   default on;
    /// - `ARRAYJIT_DEBUG_DIR`: a directory in which to keep sources, commands and logs;
    /// - `ARRAYJIT_TRACE_DIR`: a directory for trace logs (see [`CompilerConfig::trace_dir`]);
    /// - `ARRAYJIT_COMPILE_TIMEOUT`: the compile timeout, a positive number of seconds
    ///   (default 300);
    /// - `ARRAYJIT_CACHE_DIR`: the compile cache (default `$XDG_CACHE_HOME/arrayjit`, else
    ///   `$HOME/.cache/arrayjit`); `ARRAYJIT_CACHE`, a boolean (default on), turns it off;
    ///   `ARRAYJIT_CACHE_MAX`: the most bytes its compiled objects may take, a whole number
    ///   with an optional `K`, `M`, `G` or `T` suffix (powers of 1024; default `1G`);
    /// - `ARRAYJIT_COMPILE_JOBS`: how many compiler processes a batch may use, a whole number
    ///   of at least 1 (default: the machine's available parallelism);
    /// - `ARRAYJIT_INTRINSICS`: a boolean (default off): spell vector code with intrinsics
    ///   instead of vector extensions (see [`CompilerConfig::intrinsics`]).
    /// - `ARRAYJIT_BF16_DOT`: a boolean (default off): bfloat16 contractions with AVX512-BF16's
    ///   dot products where the target has them (see [`CompilerConfig::bf16_dot`]).
    /// - `ARRAYJIT_CHECKED`: a boolean (default off): bounds-checked code (see
    ///   [`CompilerConfig::checked`]).
    pub fn from_env() -> Result<CompilerConfig> {
        Self::from_lookup(|name| std::env::var_os(name), detect::detect_compiler)
    }

    /// [`CompilerConfig::from_env`] with the environment and the fallback compiler detection
    /// (given the cache directory) supplied by the caller, so that the parsing can be tested
    /// without touching the process environment.
    pub(super) fn from_lookup(
        get: impl Fn(&str) -> Option<OsString>,
        detect: impl FnOnce(Option<&Path>) -> Result<PathBuf>,
    ) -> Result<CompilerConfig> {
        let env = Env { get };

        let opt_level = match env.text(
            "ARRAYJIT_OPT_LEVEL",
            "an optimization level: 0, 1, 2, 3, s, z, g or fast",
        )? {
            Some(v) => {
                let level = v.trim();
                let level = level.strip_prefix("-O").unwrap_or(level);
                if !OPT_LEVELS.contains(&level) {
                    return Err(config_error(
                        "ARRAYJIT_OPT_LEVEL",
                        OsStr::new(&v),
                        "an optimization level: 0, 1, 2, 3, s, z, g or fast (optionally with -O)",
                    ));
                }
                level.to_string()
            }
            None => DEFAULT_OPT_LEVEL.to_string(),
        };

        let arch_flags = env
            .flags("ARRAYJIT_ARCH_FLAGS", false)?
            .unwrap_or_else(|| vec![DEFAULT_ARCH_FLAGS.to_string()]);
        let cflags = env.flags("ARRAYJIT_CFLAGS", true)?.unwrap_or_default();
        let workaround_on = env.boolean("ARRAYJIT_GCC_WORKAROUND", true)?;
        let intrinsics = env.boolean("ARRAYJIT_INTRINSICS", false)?;
        let checked = env.boolean("ARRAYJIT_CHECKED", false)?;
        let bf16_dot = env.boolean("ARRAYJIT_BF16_DOT", false)?;
        let debug_dir = env.path("ARRAYJIT_DEBUG_DIR");
        let trace_dir = env.path("ARRAYJIT_TRACE_DIR");

        let timeout_expected = "a positive number of seconds, such as 300 or 2.5";
        let timeout = match env.text("ARRAYJIT_COMPILE_TIMEOUT", timeout_expected)? {
            Some(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|s| *s > 0.0)
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .ok_or_else(|| {
                    config_error("ARRAYJIT_COMPILE_TIMEOUT", OsStr::new(&v), timeout_expected)
                })?,
            None => Duration::from_secs(DEFAULT_TIMEOUT_SECS),
        };

        let (cache_dir, cache_max_bytes) = env.cache()?;

        let compile_jobs = env
            .positive_count(
                "ARRAYJIT_COMPILE_JOBS",
                "a whole number of compiler processes, at least 1",
            )?
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));

        let compiler = if let Some(cc) = env.raw("ARRAYJIT_CC") {
            check_compiler(Path::new(&cc), "ARRAYJIT_CC")?
        } else if let Some(cc) = env.raw("CC") {
            check_compiler(Path::new(&cc), "CC")?
        } else {
            let detected = detect(cache_dir.as_deref())?;
            check_compiler(
                &detected,
                &format!("the cc crate's choice for target {TARGET}"),
            )?
        };

        // GCC 12 miscompiles some if-converted, vectorized loops with conditional selects
        // (wrong values, even reads past a buffer; reproductions in tests/differential.rs,
        // `regression_gcc12_vectorizer_wrong_code`), so with GCC those loops are not
        // if-converted unless ARRAYJIT_GCC_WORKAROUND is off; nor are loops interchanged
        // (see GCC_WORKAROUND_FLAGS).
        let mut extra_flags = gcc_flags(&compiler, workaround_on);
        extra_flags.extend(cflags);

        Ok(CompilerConfig {
            compiler,
            opt_level,
            arch_flags,
            extra_flags,
            debug_dir,
            trace_dir,
            timeout,
            temp_root: None,
            cache_dir,
            cache_max_bytes,
            compile_jobs,
            intrinsics,
            bf16_dot,
            checked,
        })
    }

    /// The full argument list used for a compile (for display and for cache keys), without
    /// the compiler itself:
    /// `-O<level> <arch flags> <extra flags> -std=gnu11 -shared -fPIC -I<dir of src> -o <out> <src> -lm`.
    ///
    /// Paths that are not valid UTF-8 are converted lossily;
    /// [`compile_and_load`](super::compile_and_load) always passes UTF-8 (relative) paths.
    pub fn args(&self, src: &Path, out: &Path) -> Vec<String> {
        self.os_args(src, out)
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    /// The whole command line (compiler and [`CompilerConfig::args`]), quoted for a POSIX shell.
    pub fn command_line(&self, src: &Path, out: &Path) -> String {
        let mut words = vec![shell_quote(&self.compiler.to_string_lossy())];
        words.extend(self.args(src, out).iter().map(|a| shell_quote(a)));
        words.join(" ")
    }

    /// [`CompilerConfig::args`] without the lossy conversion, for running the compiler.
    pub(super) fn os_args(&self, src: &Path, out: &Path) -> Vec<OsString> {
        let include_dir = match src.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let mut args: Vec<OsString> = Vec::new();
        args.push(format!("-O{}", self.opt_level).into());
        args.extend(self.arch_flags.iter().map(OsString::from));
        args.extend(self.extra_flags.iter().map(OsString::from));
        for flag in ["-std=gnu11", "-shared", "-fPIC"] {
            args.push(flag.into());
        }
        let mut include = OsString::from("-I");
        include.push(include_dir);
        args.push(include);
        args.push("-o".into());
        args.push(out.into());
        args.push(src.into());
        args.push("-lm".into());
        args
    }

    /// The compiler as a program to start from another working directory: a bare name stays
    /// (it is looked up in `PATH`), a relative path is made absolute.
    pub(super) fn program(&self) -> Result<PathBuf> {
        if is_bare_name(&self.compiler) {
            Ok(self.compiler.clone())
        } else {
            std::path::absolute(&self.compiler).map_err(|e| {
                Error::io(
                    format!("resolving compiler path {}", self.compiler.display()),
                    e,
                )
            })
        }
    }
}

/// Checks that `compiler` (which came from `origin`) exists: a path must name a file, a bare
/// name must be found in `PATH`. Relative paths are made absolute, because the compiler runs
/// in another working directory. Returns the compiler as it should be stored in the config.
pub(super) fn check_compiler(compiler: &Path, origin: &str) -> Result<PathBuf> {
    let shown = || format!("{origin}={}", compiler.display());
    let found = if is_bare_name(compiler) {
        find_in_path(compiler.as_os_str()).is_some()
    } else {
        compiler.is_file()
    };
    if !found {
        // A value that looks like a command with flags is a malformed setting rather than a
        // missing compiler (but only if no such file exists: paths may contain spaces).
        if compiler.to_string_lossy().contains(char::is_whitespace)
            && matches!(origin, "ARRAYJIT_CC" | "CC")
        {
            return Err(config_error(
                origin,
                compiler.as_os_str(),
                "a single program (a path, or a name found in PATH); put flags in ARRAYJIT_CFLAGS",
            ));
        }
        let what = if is_bare_name(compiler) {
            "not found in PATH"
        } else {
            "no such file"
        };
        return Err(Error::CompilerNotFound(format!("{}: {what}", shown())));
    }
    if is_bare_name(compiler) {
        Ok(compiler.to_path_buf())
    } else {
        std::path::absolute(compiler).map_err(|e| Error::io(shown(), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config_from(vars: &[(&str, &str)]) -> Result<CompilerConfig> {
        let vars: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        CompilerConfig::from_lookup(|n| vars.get(n).cloned(), |_| Ok(PathBuf::from("sh")))
    }

    /// Asserts that `vars` give exactly this [`Error::Config`].
    fn assert_config_error(vars: &[(&str, &str)], var: &str, value: &str, expected: &str) {
        match config_from(vars) {
            Err(Error::Config {
                var: v,
                value: val,
                expected: exp,
            }) => {
                assert_eq!((v.as_str(), val.as_str()), (var, value), "{vars:?}");
                assert_eq!(exp, expected, "{vars:?}");
            }
            other => panic!("{vars:?}: expected a Config error, got {other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let c = config_from(&[("HOME", "/home/u")]).unwrap();
        assert_eq!(c.compiler, PathBuf::from("sh"));
        assert_eq!(c.opt_level, "3");
        assert_eq!(c.arch_flags, vec!["-march=native"]);
        assert!(c.extra_flags.is_empty());
        assert_eq!(c.debug_dir, None);
        assert_eq!(c.timeout, Duration::from_secs(300));
        assert_eq!(c.temp_root, None);
        assert_eq!(c.cache_dir, Some(PathBuf::from("/home/u/.cache/arrayjit")));
        assert_eq!(c.cache_max_bytes, 1 << 30);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(c.compile_jobs, cores);
    }

    #[test]
    fn variables_are_read() {
        let c = config_from(&[
            ("ARRAYJIT_CC", "/bin/sh"),
            ("CC", "/nonexistent"),
            ("ARRAYJIT_OPT_LEVEL", "2"),
            ("ARRAYJIT_ARCH_FLAGS", ""),
            ("ARRAYJIT_CFLAGS", " -g  -Wall -include stdio.h "),
            ("ARRAYJIT_DEBUG_DIR", "/tmp/x"),
            ("ARRAYJIT_COMPILE_TIMEOUT", "7"),
            ("ARRAYJIT_COMPILE_JOBS", " 3 "),
            ("ARRAYJIT_CACHE_DIR", "/c"),
            ("ARRAYJIT_CACHE", "Yes"),
        ])
        .unwrap();
        assert_eq!(c.compiler, PathBuf::from("/bin/sh"));
        assert_eq!(c.opt_level, "2");
        assert!(c.arch_flags.is_empty());
        assert_eq!(c.extra_flags, vec!["-g", "-Wall", "-include", "stdio.h"]);
        assert_eq!(c.debug_dir, Some(PathBuf::from("/tmp/x")));
        assert_eq!(c.timeout, Duration::from_secs(7));
        assert_eq!(c.compile_jobs, 3);
        assert_eq!(c.cache_dir, Some(PathBuf::from("/c")));

        let c = config_from(&[("CC", "sh"), ("ARRAYJIT_OPT_LEVEL", "-Os")]).unwrap();
        assert_eq!(c.compiler, PathBuf::from("sh"));
        assert_eq!(c.opt_level, "s");

        // Cache location and switch.
        let c = config_from(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]).unwrap();
        assert_eq!(c.cache_dir, Some(PathBuf::from("/x/arrayjit")));
        let c = config_from(&[("XDG_CACHE_HOME", "rel"), ("HOME", "/h")]).unwrap();
        assert_eq!(c.cache_dir, Some(PathBuf::from("/h/.cache/arrayjit")));
        for off in ["0", "off", "FALSE", "no"] {
            let c = config_from(&[("ARRAYJIT_CACHE", off), ("ARRAYJIT_CACHE_DIR", "/c")]).unwrap();
            assert_eq!(c.cache_dir, None, "{off}");
        }
        // Empty counts as unset.
        let c = config_from(&[
            ("ARRAYJIT_CACHE", ""),
            ("ARRAYJIT_COMPILE_JOBS", ""),
            ("ARRAYJIT_CACHE_MAX", ""),
        ])
        .unwrap();
        assert!(c.compile_jobs >= 1);
        assert_eq!(c.cache_max_bytes, DEFAULT_CACHE_MAX_BYTES);
    }

    #[test]
    fn checked_is_a_strict_boolean() {
        assert!(!config_from(&[]).unwrap().checked);
        for on in ["1", "on", "TRUE", " yes "] {
            assert!(
                config_from(&[("ARRAYJIT_CHECKED", on)]).unwrap().checked,
                "{on}"
            );
        }
        for off in ["0", "off", "False", "no", ""] {
            assert!(
                !config_from(&[("ARRAYJIT_CHECKED", off)]).unwrap().checked,
                "{off}"
            );
        }
        assert_config_error(
            &[("ARRAYJIT_CHECKED", "2")],
            "ARRAYJIT_CHECKED",
            "2",
            "1, on, true or yes to enable; 0, off, false or no to disable",
        );
    }

    #[test]
    fn bf16_dot_is_an_opt_in_boolean() {
        assert!(!config_from(&[]).unwrap().bf16_dot);
        assert!(!CompilerConfig::new("cc").bf16_dot);
        assert!(config_from(&[("ARRAYJIT_BF16_DOT", "1")]).unwrap().bf16_dot);
        assert!(
            !config_from(&[("ARRAYJIT_BF16_DOT", "off")])
                .unwrap()
                .bf16_dot
        );
        assert_config_error(
            &[("ARRAYJIT_BF16_DOT", "maybe")],
            "ARRAYJIT_BF16_DOT",
            "maybe",
            "1, on, true or yes to enable; 0, off, false or no to disable",
        );
    }

    #[test]
    fn cache_sizes() {
        for (text, bytes) in [
            ("1", 1u64),
            ("4096", 4096),
            ("4096B", 4096),
            ("500M", 500 << 20),
            ("500m", 500 << 20),
            ("500MiB", 500 << 20),
            ("2G", 2 << 30),
            ("2gib", 2 << 30),
            ("64K", 64 << 10),
            ("3T", 3 << 40),
            (" 2G ", 2 << 30),
            ("16777215T", 16777215 << 40),
        ] {
            let c = config_from(&[("ARRAYJIT_CACHE_MAX", text)]).unwrap();
            assert_eq!(c.cache_max_bytes, bytes, "{text:?}");
        }
        // The limit is read (strictly) even when the cache is off.
        let (dir, max) =
            cache_settings(|n| (n == "ARRAYJIT_CACHE_MAX").then(|| "1M".into())).unwrap();
        assert_eq!((dir, max), (None, 1 << 20));
        for junk in [
            "0",
            "0G",
            "-1",
            "1.5G",
            "2 G",
            "500MB",
            "2GB",
            "1e9",
            "G",
            "M1",
            "lots",
            "1P",
            "16777216T",
            "18446744073709551616",
            "0x10",
        ] {
            assert_config_error(
                &[("ARRAYJIT_CACHE_MAX", junk), ("ARRAYJIT_CACHE", "off")],
                "ARRAYJIT_CACHE_MAX",
                junk,
                CACHE_MAX_EXPECTED,
            );
        }
    }

    #[test]
    fn gcc_workaround_switch() {
        let with = |v: &str| {
            let vars: HashMap<String, OsString> = [("ARRAYJIT_GCC_WORKAROUND", v)]
                .iter()
                .map(|(k, v)| (k.to_string(), OsString::from(v)))
                .collect();
            CompilerConfig::from_lookup(|n| vars.get(n).cloned(), |_| Ok(PathBuf::from("gcc")))
        };
        let gcc_found = find_in_path(OsStr::new("gcc")).is_some();
        if gcc_found {
            let both: Vec<&str> = GCC_WORKAROUND_FLAGS
                .iter()
                .chain(&GCC_SPEED_FLAGS)
                .copied()
                .collect();
            assert_eq!(with("").unwrap().extra_flags, both);
            assert_eq!(with("on").unwrap().extra_flags, both);
            assert_eq!(with("0").unwrap().extra_flags, GCC_SPEED_FLAGS);
            assert_eq!(with("off").unwrap().extra_flags, GCC_SPEED_FLAGS);
        }
    }

    #[test]
    fn junk_is_a_config_error_naming_variable_value_and_expectation() {
        let boolean = "1, on, true or yes to enable; 0, off, false or no to disable";
        let flags = "compiler flags separated by whitespace, each starting with '-'";
        let cases: &[(&str, &str, String)] = &[
            ("ARRAYJIT_CACHE", "maybe", boolean.into()),
            ("ARRAYJIT_GCC_WORKAROUND", "sometimes", boolean.into()),
            (
                "ARRAYJIT_COMPILE_JOBS",
                "lots",
                "a whole number of compiler processes, at least 1".into(),
            ),
            (
                "ARRAYJIT_COMPILE_JOBS",
                "0",
                "a whole number of compiler processes, at least 1".into(),
            ),
            (
                "ARRAYJIT_COMPILE_JOBS",
                "-2",
                "a whole number of compiler processes, at least 1".into(),
            ),
            (
                "ARRAYJIT_OPT_LEVEL",
                "3; rm",
                "an optimization level: 0, 1, 2, 3, s, z, g or fast (optionally with -O)".into(),
            ),
            (
                "ARRAYJIT_OPT_LEVEL",
                "lots",
                "an optimization level: 0, 1, 2, 3, s, z, g or fast (optionally with -O)".into(),
            ),
            (
                "ARRAYJIT_COMPILE_TIMEOUT",
                "0",
                "a positive number of seconds, such as 300 or 2.5".into(),
            ),
            (
                "ARRAYJIT_COMPILE_TIMEOUT",
                "soon",
                "a positive number of seconds, such as 300 or 2.5".into(),
            ),
            (
                "ARRAYJIT_COMPILE_TIMEOUT",
                "inf",
                "a positive number of seconds, such as 300 or 2.5".into(),
            ),
            (
                "ARRAYJIT_ARCH_FLAGS",
                "native",
                format!("{flags} (\"native\" does not)"),
            ),
            (
                "ARRAYJIT_CFLAGS",
                "-O2 fast",
                format!("{flags} (\"fast\" does not)"),
            ),
            (
                "ARRAYJIT_CFLAGS",
                "-g -o x",
                format!("{flags}, but not -o (arrayjit chooses what the compiler produces)"),
            ),
            (
                "ARRAYJIT_CFLAGS",
                "-g -include",
                format!("{flags} (-include needs an argument after it)"),
            ),
            (
                "ARRAYJIT_CC",
                "gcc -m32",
                "a single program (a path, or a name found in PATH); put flags in ARRAYJIT_CFLAGS"
                    .into(),
            ),
            (
                "CC",
                "no-such-cc --flag",
                "a single program (a path, or a name found in PATH); put flags in ARRAYJIT_CFLAGS"
                    .into(),
            ),
        ];
        for (var, value, expected) in cases {
            assert_config_error(&[(var, value)], var, value, expected);
        }
        // The message names all three.
        let e = config_from(&[("ARRAYJIT_CACHE", "maybe")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("environment variable ARRAYJIT_CACHE=\"maybe\": expected {boolean}")
        );
    }

    #[test]
    fn non_utf8_values() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![b'3', 0xff]);
        let vars: HashMap<String, OsString> = [("ARRAYJIT_OPT_LEVEL".to_string(), bad)]
            .into_iter()
            .collect();
        let e =
            CompilerConfig::from_lookup(|n| vars.get(n).cloned(), |_| Ok("sh".into())).unwrap_err();
        assert!(
            matches!(&e, Error::Config { var, value, expected }
                if var == "ARRAYJIT_OPT_LEVEL" && value == "3\u{fffd}" && expected.ends_with("(in valid UTF-8)")),
            "{e:?}"
        );
    }

    #[test]
    fn missing_compilers() {
        let e = config_from(&[("ARRAYJIT_CC", "/nonexistent")]).unwrap_err();
        assert!(
            matches!(&e, Error::CompilerNotFound(m) if m == "ARRAYJIT_CC=/nonexistent: no such file"),
            "{e}"
        );
        let e = config_from(&[("CC", "no-such-compiler-xyz")]).unwrap_err();
        assert!(
            matches!(&e, Error::CompilerNotFound(m) if m == "CC=no-such-compiler-xyz: not found in PATH"),
            "{e}"
        );
        let e = CompilerConfig::from_lookup(
            |_| None,
            |_| Err(Error::CompilerNotFound("detection failed".into())),
        )
        .unwrap_err();
        assert!(matches!(e, Error::CompilerNotFound(_)));
    }

    #[test]
    fn args_and_quoting() {
        let c = config_from(&[("ARRAYJIT_CFLAGS", "-DX='a b'")]);
        // A quoted space splits the value, and `b'` is not a flag.
        assert!(matches!(c, Err(Error::Config { .. })), "{c:?}");
        let c = config_from(&[("ARRAYJIT_CFLAGS", "-DX='a'")]).unwrap();
        let args = c.args(Path::new("k.c"), Path::new("libk.so"));
        assert_eq!(
            args,
            [
                "-O3",
                "-march=native",
                "-DX='a'",
                "-std=gnu11",
                "-shared",
                "-fPIC",
                "-I.",
                "-o",
                "libk.so",
                "k.c",
                "-lm"
            ]
        );
        let args = c.args(Path::new("/d/k.c"), Path::new("/d/libk.so"));
        assert!(args.contains(&"-I/d".to_string()));
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("-O3"), "-O3");
    }

    /// `CompilerConfig::new(cc)` is what `from_env` reads from an empty environment whose
    /// compiler is `cc`: the same flags (GCC's workaround and speed flags for GCC only), the
    /// same defaults for everything else.
    #[test]
    fn new_is_from_env_in_an_empty_environment() {
        let mut seen = 0;
        for cc in ["gcc", "clang", "sh"] {
            if find_in_path(OsStr::new(cc)).is_none() {
                continue;
            }
            seen += 1;
            let from_env = CompilerConfig::from_lookup(
                |n| (n == "ARRAYJIT_CC").then(|| cc.into()),
                |_| unreachable!("ARRAYJIT_CC is set"),
            )
            .unwrap();
            assert_eq!(CompilerConfig::new(cc), from_env, "{cc}");
            assert_eq!(
                from_env.extra_flags.iter().any(|f| f == GCC_SPEED_FLAGS[0]),
                cc == "gcc",
                "{cc}: {from_env:?}"
            );
        }
        assert!(seen > 0, "none of gcc, clang, sh in PATH");
    }
}
