//! [`Target`]: what the compiler makes of the architecture flags, resolved once.
//!
//! The architecture flags (`-march=native` by default) are text; what they mean depends on
//! the machine the compiler runs on. [`Target::resolve`] asks the compiler: it runs
//! `<cc> <arch flags> <extra flags> -E -dM -x c /dev/null` (GCC and Clang both print their
//! predefined macros for it) and reads the architecture, the instruction-set features, the
//! compiler's family and version from the macros. The hash of the whole (sorted) macro dump is
//! the target's [`Target::fingerprint`], which goes into the compile cache's key, so that a
//! cache directory shared between machines (a home directory on a cluster's network file
//! system) never hands an object built for one CPU to another that lacks its instructions.
//!
//! The probe costs a compiler run (about 10–30 ms), so its result is kept: per process
//! (keyed by the compiler's identity and the flags) and, with a cache directory, in a file
//! `target-<hash>` there, keyed by the compiler's identity, the flags and — when a flag
//! mentions `native` — the CPU's identity (a hash of `/proc/cpuinfo`'s `model name`, `flags`,
//! `Features` and `CPU part` lines), so a cache hit in a fresh process runs no compiler. When
//! nothing is remembered, the first compile need not wait for the probe: see the `speculate`
//! module.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};

use super::cleanup::WorkDir;
use super::config::CompilerConfig;
use super::files::{hash_hex, read_memo, write_atomically};
use super::programs::{program_identity, shell_quote};
use super::run::run_compiler;
use crate::target::{Isa, VectorTarget};
use crate::{Error, Result};

/// The first line of a `target-*` memo file.
const MEMO_HEADER: &str = "arrayjit target probe, format 1";
/// Longest macro dump accepted from a compiler (real ones are 10–30 KiB).
const MAX_DUMP_BYTES: u64 = 4 << 20;

/// Default cache sizes when `/sys` does not tell (bytes).
const DEFAULT_L1D: usize = 32 * 1024;
const DEFAULT_L2: usize = 1024 * 1024;
const DEFAULT_L3: usize = 8 * 1024 * 1024;

/// The instruction-set architecture the compiler generates code for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    /// x86-64 (`__x86_64__`).
    X86_64,
    /// 64-bit Arm (`__aarch64__`).
    Aarch64,
    /// Anything else.
    Other,
}

/// The compiler's family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompilerFamily {
    /// GCC (`__GNUC__` without `__clang__`).
    Gcc,
    /// Clang or a Clang-based compiler (`__clang__`).
    Clang,
    /// Neither.
    Other,
}

/// Instruction-set features the compiler may use with the given flags (each from its
/// predefined macro).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Features {
    /// `__SSE2__`.
    pub sse2: bool,
    /// `__SSE4_1__`.
    pub sse4_1: bool,
    /// `__AVX__`.
    pub avx: bool,
    /// `__AVX2__`.
    pub avx2: bool,
    /// Fused multiply-add: `__FMA__` (x86) or `__ARM_FEATURE_FMA` (Arm).
    pub fma: bool,
    /// Half-precision conversions: `__F16C__`.
    pub f16c: bool,
    /// `__AVX512F__`.
    pub avx512f: bool,
    /// `__AVX512BW__`.
    pub avx512bw: bool,
    /// `__AVX512DQ__`.
    pub avx512dq: bool,
    /// `__AVX512VL__`.
    pub avx512vl: bool,
    /// Half-precision arithmetic in AVX-512: `__AVX512FP16__`.
    pub avx512fp16: bool,
    /// bfloat16 dot products in AVX-512 (`vdpbf16ps`): `__AVX512BF16__`.
    pub avx512bf16: bool,
    /// Advanced SIMD: `__ARM_NEON`.
    pub neon: bool,
    /// The Scalable Vector Extension: `__ARM_FEATURE_SVE`.
    pub sve: bool,
}

/// The data-cache sizes of the machine running this process, in bytes (from
/// `/sys/devices/system/cpu/cpu0/cache`; 32 KiB, 1 MiB and 8 MiB where it does not tell).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheSizes {
    /// The level-1 data cache (per core).
    pub l1d: usize,
    /// The level-2 cache.
    pub l2: usize,
    /// The level-3 cache (usually shared by the cores of a socket).
    pub l3: usize,
}

/// What the compiler generates code for with a configuration's flags: a plain value for code
/// generation to consult (vector width, registers, caches) and whose
/// [`fingerprint`](Target::fingerprint) keys the compile cache.
///
/// Obtained from [`Target::resolve`] (or, for a macro dump at hand,
/// [`Target::from_macro_dump`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The architecture.
    pub arch: Arch,
    /// The instruction-set features the compiler may use.
    pub features: Features,
    /// The widest vector of `f32` the instruction set offers, in bytes: 64 with AVX-512F, 32
    /// with AVX, 16 with SSE2 or NEON (or SVE at its guaranteed minimum; more when
    /// `-msve-vector-bits` fixes the length), else 4 (one scalar). Preferences such as GCC's
    /// `-mprefer-vector-width` do not show in the macros and are not taken into account.
    pub vector_bytes: usize,
    /// How many vector (or floating-point) registers the instruction set has: 32 with
    /// AVX-512 and on AArch64, 16 otherwise.
    pub vector_registers: usize,
    /// The compiler's family.
    pub compiler: CompilerFamily,
    /// The compiler's version (major, minor, patch): `__clang_major__`... for Clang,
    /// `__GNUC__`... for GCC, zeros otherwise.
    pub compiler_version: (u32, u32, u32),
    /// The host's data caches (not the compiler's view: read from this machine).
    pub caches: CacheSizes,
    /// A hash (64 hexadecimal digits, BLAKE3) of the compiler's whole predefined-macro dump, sorted:
    /// equal fingerprints mean the compiler sees the same target.
    pub fingerprint: String,
    /// The predefined macros, name (with parameters, for function-like macros) → value.
    macros: Arc<BTreeMap<String, String>>,
}

impl Target {
    /// What `config`'s compiler makes of `config`'s architecture and extra flags: runs
    /// `<cc> <arch flags> <extra flags> -E -dM -x c /dev/null` (in a private temporary
    /// directory, with the configuration's timeout) and reads the macros it prints. The answer
    /// is memoized per process and, with [`CompilerConfig::cache_dir`], on disk (see the
    /// module documentation), so only the first call on a machine runs the compiler.
    ///
    /// Errors: [`Error::CompilerNotFound`] if the compiler cannot be started,
    /// [`Error::CompileTimeout`] if it hangs, [`Error::TargetProbe`] if it fails or prints no
    /// macros (e.g. for an unknown `-march`), [`Error::Io`] if no temporary directory can be
    /// created.
    pub fn resolve(config: &CompilerConfig) -> Result<Target> {
        let memo = Memo::new(config);
        if let Some(t) = memo.recall() {
            return Ok(t);
        }
        let dump = probe(config)?;
        if let Some(d) = &memo.disk {
            d.write(&dump);
        }
        Ok(memo.remember(Target::from_macro_dump(&dump)?))
    }

    /// The target [`Target::resolve`] would return without running the compiler (remembered
    /// in this process or in the cache directory), if any.
    pub(super) fn remembered(config: &CompilerConfig) -> Option<Target> {
        Memo::new(config).recall()
    }

    /// A target from the output of `cc -E -dM` (lines `#define NAME VALUE`), with this
    /// machine's cache sizes. Errors ([`Error::TargetProbe`]) if the text holds no macro
    /// definitions at all.
    pub fn from_macro_dump(dump: &str) -> Result<Target> {
        let mut macros = BTreeMap::new();
        for line in dump.lines() {
            let Some(def) = line.trim_end().strip_prefix("#define ") else {
                continue;
            };
            let (name, value) = def.split_once(' ').unwrap_or((def, ""));
            if !name.is_empty() {
                macros.insert(name.to_string(), value.to_string());
            }
        }
        if macros.is_empty() {
            return Err(Error::TargetProbe {
                command: "(macro dump)".into(),
                output: "no `#define` lines: the compiler printed no predefined macros".into(),
            });
        }
        let on = |name: &str| macros.get(name).is_some_and(|v| v.trim() != "0");
        let number = |name: &str| {
            macros
                .get(name)
                .and_then(|v| v.trim().parse::<u32>().ok())
                .unwrap_or(0)
        };

        let arch = if on("__x86_64__") {
            Arch::X86_64
        } else if on("__aarch64__") {
            Arch::Aarch64
        } else {
            Arch::Other
        };
        let features = Features {
            sse2: on("__SSE2__"),
            sse4_1: on("__SSE4_1__"),
            avx: on("__AVX__"),
            avx2: on("__AVX2__"),
            fma: on("__FMA__") || on("__ARM_FEATURE_FMA"),
            f16c: on("__F16C__"),
            avx512f: on("__AVX512F__"),
            avx512bw: on("__AVX512BW__"),
            avx512dq: on("__AVX512DQ__"),
            avx512vl: on("__AVX512VL__"),
            avx512fp16: on("__AVX512FP16__"),
            avx512bf16: on("__AVX512BF16__"),
            neon: on("__ARM_NEON"),
            sve: on("__ARM_FEATURE_SVE"),
        };
        let sve_bytes = (number("__ARM_FEATURE_SVE_BITS") / 8) as usize;
        let vector_bytes = if features.avx512f {
            64
        } else if features.avx {
            32
        } else if features.sve && sve_bytes > 16 {
            sve_bytes
        } else if features.sse2 || features.neon || features.sve {
            16
        } else {
            4
        };
        let vector_registers = match arch {
            Arch::X86_64 if features.avx512f => 32,
            Arch::Aarch64 => 32,
            _ => 16,
        };
        let (compiler, compiler_version) = if on("__clang__") {
            (
                CompilerFamily::Clang,
                (
                    number("__clang_major__"),
                    number("__clang_minor__"),
                    number("__clang_patchlevel__"),
                ),
            )
        } else if on("__GNUC__") {
            (
                CompilerFamily::Gcc,
                (
                    number("__GNUC__"),
                    number("__GNUC_MINOR__"),
                    number("__GNUC_PATCHLEVEL__"),
                ),
            )
        } else {
            (CompilerFamily::Other, (0, 0, 0))
        };
        Ok(Target {
            arch,
            features,
            vector_bytes,
            vector_registers,
            compiler,
            compiler_version,
            caches: cache_sizes(),
            fingerprint: fingerprint(dump),
            macros: Arc::new(macros),
        })
    }

    /// The value of a predefined macro (`Some("")` for one defined empty), by name as the dump
    /// writes it (function-like macros with their parameters, e.g. `__has_include(STR)`).
    pub fn macro_value(&self, name: &str) -> Option<&str> {
        self.macros.get(name).map(String::as_str)
    }

    /// The target as the optimizer's kernel passes and the C writer see it: the widest vector
    /// instruction set the compiler may use (AVX-512F, AVX2, SSE2 or NEON; GCC/Clang vector
    /// extensions elsewhere), its width and registers, FMA, and this machine's caches; with
    /// `intrinsics`, vector code is spelled with the instruction set's intrinsics.
    /// [`VectorTarget::bf16_dot`] says whether the target has AVX512-BF16's dot products;
    /// [`Target::vector_target_for`] uses them only where the configuration asks.
    pub fn vector_target(&self, intrinsics: bool) -> VectorTarget {
        let f = &self.features;
        let isa = match self.arch {
            Arch::X86_64 if f.avx512f => Isa::Avx512,
            Arch::X86_64 if f.avx2 => Isa::Avx2,
            Arch::X86_64 if f.sse2 => Isa::Sse2,
            Arch::Aarch64 if f.neon => Isa::Neon,
            _ => Isa::Generic,
        };
        VectorTarget {
            isa,
            vector_bytes: self.vector_bytes,
            registers: self.vector_registers,
            fma: f.fma,
            bf16_dot: isa == Isa::Avx512 && self.vector_bytes == 64 && f.avx512bf16,
            int64_mul: isa == Isa::Avx512 && f.avx512dq,
            l1d_bytes: self.caches.l1d,
            l2_bytes: self.caches.l2,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            intrinsics,
        }
    }

    /// The target code is generated for under `config`: [`Target::vector_target`] with the
    /// configuration's [`intrinsics`](CompilerConfig::intrinsics), and the dot products of
    /// bfloat16 pairs only with [`bf16_dot`](CompilerConfig::bf16_dot).
    pub fn vector_target_for(&self, config: &CompilerConfig) -> VectorTarget {
        let v = self.vector_target(config.intrinsics);
        let dot = v.bf16_dot && config.bf16_dot;
        v.bf16_dot(dot)
    }

    /// How many `f32` fit in the widest vector ([`Target::vector_bytes`] / 4).
    pub fn f32_lanes(&self) -> usize {
        self.vector_bytes / 4
    }
}

/// Where one configuration's probe is remembered: per process (keyed by the compiler's
/// identity, its path and the flags) and, with a cache directory, on disk.
struct Memo {
    /// The per-process key; `None` without a compiler identity (the compiler cannot be found):
    /// then nothing is remembered, and the probe reports the missing compiler.
    key: Option<String>,
    disk: Option<DiskMemo>,
}

/// The targets resolved in this process, by [`Memo::key`].
static MEMO: LazyLock<Mutex<HashMap<String, Target>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

impl Memo {
    fn new(config: &CompilerConfig) -> Memo {
        let identity = program_identity(&config.compiler);
        let flags: Vec<&str> = config
            .arch_flags
            .iter()
            .chain(&config.extra_flags)
            .map(String::as_str)
            .collect();
        let key = identity
            .as_ref()
            .map(|id| format!("{id}\0{}\0{}", config.compiler.display(), flags.join("\0")));
        let disk = match (&identity, &config.cache_dir) {
            (Some(id), Some(dir)) => Some(DiskMemo::new(dir, id, config, &flags)),
            _ => None,
        };
        Memo { key, disk }
    }

    /// The remembered target: this process's, else the cache directory's (then remembered in
    /// the process too).
    fn recall(&self) -> Option<Target> {
        let key = self.key.as_ref()?;
        if let Some(t) = MEMO.lock().unwrap_or_else(|e| e.into_inner()).get(key) {
            return Some(t.clone());
        }
        let dump = self.disk.as_ref()?.read()?;
        Some(self.remember(Target::from_macro_dump(&dump).ok()?))
    }

    /// Remembers a target in the process (the caller writes the disk memo).
    fn remember(&self, target: Target) -> Target {
        if let Some(key) = &self.key {
            MEMO.lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key.clone(), target.clone());
        }
        target
    }
}

/// The hash of a macro dump's sorted, trimmed, non-empty lines, as 64 hexadecimal digits.
fn fingerprint(dump: &str) -> String {
    let mut lines: Vec<&str> = dump
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect();
    lines.sort_unstable();
    lines.dedup();
    let joined = lines.join("\n");
    hash_hex(&[b"macros", joined.as_bytes()])
}

/// Runs the probe and returns the compiler's macro dump.
fn probe(config: &CompilerConfig) -> Result<String> {
    let mut args: Vec<OsString> = config
        .arch_flags
        .iter()
        .chain(&config.extra_flags)
        .map(OsString::from)
        .collect();
    for a in ["-E", "-dM", "-x", "c", "/dev/null"] {
        args.push(a.into());
    }
    let command = std::iter::once(config.compiler.to_string_lossy().into_owned())
        .chain(args.iter().map(|a| a.to_string_lossy().into_owned()))
        .map(|w| shell_quote(&w))
        .collect::<Vec<_>>()
        .join(" ");
    let root = config.temp_root.clone().unwrap_or_else(std::env::temp_dir);
    let dir = WorkDir::create(&root)?;
    let run = run_compiler(config, &args, dir.path(), &command)?;
    let result = if run.timed_out {
        Err(Error::CompileTimeout {
            command,
            seconds: config.timeout.as_secs_f64().ceil() as u64,
        })
    } else if !run.status.success() {
        let tail = run.output.tail()?;
        let mut output = tail.text;
        if tail.omitted > 0 {
            output.insert_str(0, &format!("[{} earlier bytes omitted]\n", tail.omitted));
        }
        if output.trim().is_empty() {
            output = format!("[the compiler failed ({}) and printed nothing]", run.status);
        }
        Err(Error::TargetProbe { command, output })
    } else {
        match run.output.stdout_text(MAX_DUMP_BYTES)? {
            Some(dump) if dump.contains("#define ") => Ok(dump),
            Some(_) => Err(Error::TargetProbe {
                command,
                output: "the compiler succeeded but printed no predefined macros".into(),
            }),
            None => Err(Error::TargetProbe {
                command,
                output: format!("the compiler printed more than {MAX_DUMP_BYTES} bytes"),
            }),
        }
    };
    dir.close()?;
    result
}

/// The on-disk memo of one probe: `<cache dir>/target-<key>`, holding
/// `arrayjit target probe, format 1`, `key <key>`, `fingerprint <fingerprint>` and the dump.
struct DiskMemo {
    file: PathBuf,
    key: String,
}

impl DiskMemo {
    fn new(dir: &Path, identity: &str, config: &CompilerConfig, flags: &[&str]) -> DiskMemo {
        let native = flags.iter().any(|f| f.contains("native"));
        let cpu = if native { cpu_identity() } else { "" };
        let key = hash_hex(&[
            b"target-probe",
            identity.as_bytes(),
            config.compiler.as_os_str().as_encoded_bytes(),
            flags.join("\0").as_bytes(),
            cpu.as_bytes(),
        ]);
        DiskMemo {
            file: dir.join(format!("target-{key}")),
            key,
        }
    }

    /// The remembered dump, if the file is valid: the header, this key, and a dump whose
    /// fingerprint is the recorded one (a truncated or edited file does not validate).
    fn read(&self) -> Option<String> {
        // Only a file of this user's that nobody else can write (`cache::read_memo`).
        let text = read_memo(&self.file, MAX_DUMP_BYTES + 4096)?;
        let rest = text.strip_prefix(MEMO_HEADER)?.strip_prefix('\n')?;
        let (key_line, rest) = rest.split_once('\n')?;
        let (fp_line, dump) = rest.split_once('\n')?;
        if key_line.strip_prefix("key ")? != self.key {
            return None;
        }
        let fp = fp_line.strip_prefix("fingerprint ")?;
        (dump.contains("#define ") && fingerprint(dump) == fp).then(|| dump.to_string())
    }

    /// Remembers a dump (atomically; failures only cost the memo).
    fn write(&self, dump: &str) {
        write_atomically(
            &self.file,
            &format!(
                "{MEMO_HEADER}\nkey {}\nfingerprint {}\n{dump}",
                self.key,
                fingerprint(dump)
            ),
        );
    }
}

/// The CPU's identity: a hash of the distinct `model name`, `flags`, `Features` and
/// `CPU part` lines of `/proc/cpuinfo` (empty if it cannot be read). Read once per process.
fn cpu_identity() -> &'static str {
    static CPU: OnceLock<String> = OnceLock::new();
    CPU.get_or_init(|| {
        let Ok(text) = fs::read_to_string("/proc/cpuinfo") else {
            return String::new();
        };
        let mut lines: Vec<&str> = text
            .lines()
            .filter(|l| {
                let key = l.split(':').next().unwrap_or("").trim();
                matches!(key, "model name" | "flags" | "Features" | "CPU part")
            })
            .collect();
        lines.sort_unstable();
        lines.dedup();
        hash_hex(&[b"cpu", lines.join("\n").as_bytes()])
    })
}

/// This machine's cache sizes (read once per process).
fn cache_sizes() -> CacheSizes {
    static SIZES: OnceLock<CacheSizes> = OnceLock::new();
    *SIZES.get_or_init(|| cache_sizes_in(Path::new("/sys/devices/system/cpu/cpu0/cache")))
}

/// The cache sizes described in `dir/index*/{level,type,size}`, with defaults for what is
/// missing.
fn cache_sizes_in(dir: &Path) -> CacheSizes {
    let mut sizes = CacheSizes {
        l1d: 0,
        l2: 0,
        l3: 0,
    };
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if !e.file_name().to_string_lossy().starts_with("index") {
                continue;
            }
            let read = |f: &str| {
                fs::read_to_string(e.path().join(f))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default()
            };
            let (level, kind) = (read("level"), read("type"));
            let Some(size) = parse_cache_size(&read("size")) else {
                continue;
            };
            let data = kind == "Data" || kind == "Unified";
            let slot = match level.as_str() {
                "1" if data => &mut sizes.l1d,
                "2" if data => &mut sizes.l2,
                "3" if data => &mut sizes.l3,
                _ => continue,
            };
            *slot = (*slot).max(size);
        }
    }
    let or = |v: usize, d: usize| if v == 0 { d } else { v };
    CacheSizes {
        l1d: or(sizes.l1d, DEFAULT_L1D),
        l2: or(sizes.l2, DEFAULT_L2),
        l3: or(sizes.l3, DEFAULT_L3),
    }
}

/// `48K`, `2048K`, `32M`, `1G` or a plain number of bytes.
fn parse_cache_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, ""),
    };
    let n: usize = digits.parse().ok()?;
    let mult = match unit.trim() {
        "" => 1,
        "K" | "KB" | "KiB" => 1 << 10,
        "M" | "MB" | "MiB" => 1 << 20,
        "G" | "GB" | "GiB" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult).filter(|&v| v > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const X86: &str = "#define __x86_64__ 1\n#define __SSE2__ 1\n#define __AVX__ 1\n\
                       #define __AVX2__ 1\n#define __FMA__ 1\n#define __GNUC__ 12\n\
                       #define __GNUC_MINOR__ 2\n#define __GNUC_PATCHLEVEL__ 0\n\
                       #define __has_include(STR) __has_include__(STR)\n";

    #[test]
    fn macro_dumps_are_read() {
        let t = Target::from_macro_dump(X86).unwrap();
        assert_eq!(t.arch, Arch::X86_64);
        assert!(t.features.avx2 && t.features.fma && !t.features.avx512f);
        assert_eq!(
            (t.vector_bytes, t.f32_lanes(), t.vector_registers),
            (32, 8, 16)
        );
        assert_eq!(t.compiler, CompilerFamily::Gcc);
        assert_eq!(t.compiler_version, (12, 2, 0));
        assert_eq!(t.macro_value("__AVX__"), Some("1"));
        assert_eq!(
            t.macro_value("__has_include(STR)"),
            Some("__has_include__(STR)")
        );
        assert_eq!(t.fingerprint.len(), 64);
        // The order of the lines does not matter; their content does.
        let reversed: String = X86.lines().rev().map(|l| format!("{l}\n")).collect();
        assert_eq!(
            Target::from_macro_dump(&reversed).unwrap().fingerprint,
            t.fingerprint
        );
        let more = format!("{X86}#define __AVX512F__ 1\n");
        let t2 = Target::from_macro_dump(&more).unwrap();
        assert_ne!(t2.fingerprint, t.fingerprint);
        assert_eq!((t2.vector_bytes, t2.vector_registers), (64, 32));

        let arm = "#define __aarch64__ 1\n#define __ARM_NEON 1\n#define __ARM_FEATURE_FMA 1\n\
                   #define __ARM_FEATURE_SVE 1\n#define __ARM_FEATURE_SVE_BITS 512\n\
                   #define __clang__ 1\n#define __GNUC__ 4\n#define __clang_major__ 17\n\
                   #define __clang_minor__ 0\n#define __clang_patchlevel__ 6\n";
        let t = Target::from_macro_dump(arm).unwrap();
        assert_eq!(t.arch, Arch::Aarch64);
        assert!(t.features.neon && t.features.sve && t.features.fma);
        assert_eq!((t.vector_bytes, t.vector_registers), (64, 32));
        assert_eq!(t.compiler, CompilerFamily::Clang);
        assert_eq!(t.compiler_version, (17, 0, 6));

        let t = Target::from_macro_dump("#define __riscv 1\n").unwrap();
        assert_eq!((t.arch, t.vector_bytes), (Arch::Other, 4));
        assert_eq!(t.compiler, CompilerFamily::Other);

        for junk in ["", "hello\n", "\0\u{1}"] {
            assert!(matches!(
                Target::from_macro_dump(junk),
                Err(Error::TargetProbe { .. })
            ));
        }
    }

    #[test]
    fn cache_sizes_from_sysfs_layout() {
        let dir = tempfile::tempdir().unwrap();
        let mk = |i: usize, level: &str, kind: &str, size: &str| {
            let d = dir.path().join(format!("index{i}"));
            fs::create_dir(&d).unwrap();
            fs::write(d.join("level"), format!("{level}\n")).unwrap();
            fs::write(d.join("type"), format!("{kind}\n")).unwrap();
            fs::write(d.join("size"), format!("{size}\n")).unwrap();
        };
        mk(0, "1", "Data", "48K");
        mk(1, "1", "Instruction", "32K");
        mk(2, "2", "Unified", "2048K");
        let s = cache_sizes_in(dir.path());
        assert_eq!((s.l1d, s.l2, s.l3), (48 << 10, 2 << 20, DEFAULT_L3));
        mk(3, "3", "Unified", "junk");
        assert_eq!(cache_sizes_in(dir.path()).l3, DEFAULT_L3);
        mk(4, "3", "Unified", "105M");
        assert_eq!(cache_sizes_in(dir.path()).l3, 105 << 20);
        let none = cache_sizes_in(&dir.path().join("missing"));
        assert_eq!(
            (none.l1d, none.l2, none.l3),
            (DEFAULT_L1D, DEFAULT_L2, DEFAULT_L3)
        );
        assert_eq!(parse_cache_size("12"), Some(12));
        assert_eq!(parse_cache_size("0K"), None);
        assert_eq!(parse_cache_size("1T"), None);
        assert_eq!(parse_cache_size(""), None);
    }

    #[test]
    fn memo_files_validate() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = CompilerConfig {
            compiler: "sh".into(),
            opt_level: "3".into(),
            arch_flags: vec!["-march=native".into()],
            extra_flags: vec![],
            debug_dir: None,
            trace_dir: None,
            timeout: std::time::Duration::from_secs(1),
            temp_root: None,
            cache_dir: None,
            cache_max_bytes: super::super::config::DEFAULT_CACHE_MAX_BYTES,
            compile_jobs: 1,
            intrinsics: false,
            bf16_dot: false,
            checked: false,
        };
        let memo = DiskMemo::new(dir.path(), "id", &cfg, &["-march=native"]);
        assert_eq!(memo.read(), None);
        memo.write(X86);
        assert_eq!(memo.read().as_deref(), Some(X86));
        let text = fs::read_to_string(&memo.file).unwrap();
        for bad in [
            text.replace("__AVX2__", "__AVX3__"),
            text[..text.len() - 10].to_string(),
            text.replace("format 1", "format 0"),
            "false".to_string(),
            String::new(),
        ] {
            fs::write(&memo.file, bad).unwrap();
            assert_eq!(memo.read(), None);
        }
        // Another key is another file.
        let other = DiskMemo::new(dir.path(), "id", &cfg, &["-march=x86-64-v2"]);
        assert_ne!(other.file, memo.file);
    }
}
