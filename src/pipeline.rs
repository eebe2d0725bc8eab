//! The pipeline driver: assignments go through the named [`Stage`]s **lower → optimize →
//! codegen → compile**, and a `Built` keeps what each stage produced (the optimized loop
//! IR of every routine, with the lowered one beside it, the generated C, the debug dumps, and
//! the loaded objects), in the manner of cranelift's `Context`. Backends only link and run
//! what comes out of here.
//!
//! A `Pipeline` holds what the stages are run with: the optimizer [`Settings`], the
//! compiler configuration (given, or read from the environment at every build), whether code
//! is bounds-checked, and the memory-mode decisions of every routine built so far (a routine
//! contradicting an earlier one is an error naming the node). The loop IR is verified after
//! lowering and between the optimizer's passes ([`crate::optimize`]).
//!
//! Where the C is compiled now and the compiler's target is not remembered yet, the stages
//! first run for a guess at the target while the target probe runs (see
//! `Speculation`); when the probe disproves the guess, codegen and compile run again for
//! the probed target.

use crate::codegen::{self, CodegenOptions, Generated, RoutineSignature};
use crate::compile::{self, CompilerConfig, DebugFile, EntryFn, LoadedLibrary, Speculation};
use crate::error::{Error, Result};
use crate::ir::{Assignments, Bindings, MemoryModes};
use crate::optimize::{self, Optimized, Settings};
use crate::target::VectorTarget;
use crate::{loops, lower};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The stages of the pipeline, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Assignments to the loop IR ([`crate::lower`]).
    Lower,
    /// The optimizer's passes ([`crate::optimize`]).
    Optimize,
    /// The loop IR to C ([`crate::codegen`]).
    Codegen,
    /// The C compiler, the compile cache and loading ([`crate::compile`]).
    Compile,
}

/// Chooses which entries of a batch to build: `occupancy(name, index)`.
pub type Occupancy<'a> = &'a dyn Fn(&str, usize) -> bool;

/// A compiled routine: the entry points of its parts, in order, and the libraries holding
/// them (kept loaded as long as the routine lives).
pub(crate) struct Compiled {
    pub(crate) libs: Vec<Arc<LoadedLibrary>>,
    pub(crate) sig: RoutineSignature,
    pub(crate) entries: Vec<EntryFn>,
}

/// Generated C whose compile was postponed (to the first link).
pub(crate) struct Generation {
    pub(crate) generated: Generated,
    pub(crate) dumps: Vec<DebugFile>,
}

/// One routine after the optimize stage.
pub(crate) struct Entry {
    pub(crate) name: String,
    pub(crate) optimized: Optimized,
}

/// What the stages produced for a batch of routines.
pub(crate) struct Built {
    /// One per routine given: `None` where the occupancy left it out.
    pub(crate) entries: Vec<Option<Entry>>,
    /// The C of the whole batch as one file (what `emit-c` prints).
    pub(crate) source: String,
    /// The compiled routines, one per included entry (`compile` stage run), or the
    /// generated code waiting for its compile.
    pub(crate) code: Compilation,
}

/// The last stage's output: compiled now, or postponed.
pub(crate) enum Compilation {
    /// The compile stage ran.
    Compiled(Vec<Compiled>),
    /// The compile stage is postponed ([`Pipeline::compile_postponed`]).
    Postponed(Box<Generation>),
}

/// What the stages run with; see the [module docs](self).
pub(crate) struct Pipeline {
    settings: Settings,
    compiler: Option<CompilerConfig>,
    checked: bool,
    modes: Mutex<MemoryModes>,
}

impl Pipeline {
    /// A pipeline with the given optimizer settings and compiler configuration (`None`: read
    /// from the environment at every build); `checked` asks for bounds-checked code whatever
    /// the configuration says.
    pub(crate) fn new(settings: Settings, compiler: Option<CompilerConfig>, checked: bool) -> Self {
        Pipeline {
            settings,
            compiler,
            checked,
            modes: Mutex::new(MemoryModes::new()),
        }
    }

    /// The optimizer settings.
    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The same pipeline generating bounds-checked code when `checked` (with false, the
    /// compiler configuration decides).
    pub(crate) fn set_checked(&mut self, checked: bool) {
        self.checked = checked;
    }

    /// The compiler configuration in effect: the one given, else the environment's.
    pub(crate) fn compiler_config(&self) -> Result<CompilerConfig> {
        match &self.compiler {
            Some(c) => Ok(c.clone()),
            None => CompilerConfig::from_env(),
        }
    }

    /// Every memory-mode decision of the routines built so far.
    pub(crate) fn modes(&self) -> MutexGuard<'_, MemoryModes> {
        self.modes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs every stage over `asgns` (the routines of one batch; only those `occupancy`
    /// includes): lower, optimize and codegen always, compile only when `compile_now` (else
    /// the generated code is kept for [`Pipeline::compile_postponed`]). Routine names come
    /// from `names`, else each routine's first block comment, else `routine<i>`.
    pub(crate) fn build(
        &self,
        compile_now: bool,
        names: Option<&[String]>,
        occupancy: Option<Occupancy<'_>>,
        bindings: &Bindings,
        asgns: &[Assignments],
    ) -> Result<Built> {
        self.for_target(compile_now, |cfg, target, speculation| {
            let options = self.codegen_options(cfg)?;
            let options = CodegenOptions {
                trace_dir: options.0.as_deref(),
                checked: options.1,
            };
            let (entries, generated, dumps) =
                self.to_c(names, occupancy, bindings, asgns, target, options)?;
            let source = generated.source();
            let code = if compile_now {
                match compile_generated(&generated, &dumps, cfg, speculation)? {
                    Some(c) => Compilation::Compiled(c),
                    None => return Ok(None),
                }
            } else {
                Compilation::Postponed(Box::new(Generation { generated, dumps }))
            };
            Ok(Some(Built {
                entries,
                source,
                code,
            }))
        })
    }

    /// The compile stage of code built with `compile_now` false.
    pub(crate) fn compile_postponed(&self, g: &Generation) -> Result<Vec<Compiled>> {
        compile_generated(&g.generated, &g.dumps, &self.compiler_config()?, None)?
            .ok_or_else(not_built)
    }

    /// The C of a batch, without compiling it (what `arrayjit emit-c` shows): the stages
    /// lower, optimize and codegen. Memory-mode decisions are recorded as by a build.
    /// Without a usable compiler configuration, the C is written for the portable target
    /// (GCC/Clang vector extensions).
    pub(crate) fn source(
        &self,
        names: Option<&[String]>,
        bindings: &Bindings,
        asgns: &[Assignments],
    ) -> Result<String> {
        let (cfg, target) = match self.compiler_config() {
            Ok(cfg) => {
                let t = vector_target(&cfg);
                (Some(cfg), t)
            }
            Err(_) => (None, VectorTarget::default()),
        };
        let options = CodegenOptions {
            trace_dir: cfg.as_ref().and_then(|c| c.trace_dir.as_deref()),
            checked: self.checked || cfg.as_ref().is_some_and(|c| c.checked),
        };
        let (_, generated, _) = self.to_c(names, None, bindings, asgns, &target, options)?;
        Ok(generated.source())
    }

    /// How code is generated under `cfg`: its trace directory (created if missing, see
    /// [`prepare_trace_dir`]) and bounds checks (the configuration's or the pipeline's).
    fn codegen_options(&self, cfg: &CompilerConfig) -> Result<(Option<PathBuf>, bool)> {
        let trace = cfg
            .trace_dir
            .as_deref()
            .map(prepare_trace_dir)
            .transpose()?;
        Ok((trace, cfg.checked || self.checked))
    }

    /// The stages lower and optimize for one routine. Traced code stays scalar, so that
    /// every stored value is logged.
    fn optimize_one(
        &self,
        name: &str,
        asgns: &Assignments,
        target: &VectorTarget,
        traced: bool,
    ) -> Result<Optimized> {
        let in_stage = |stage: Stage, e: Error| {
            tracing::debug!(target: "arrayjit::pipeline", routine = name, ?stage, "failed");
            Error::in_routine(name, e)
        };
        let code = lower::lower(asgns).map_err(|e| in_stage(Stage::Lower, e))?;
        let settings = Settings {
            target: if traced {
                None
            } else {
                self.settings.target.or(Some(*target))
            },
            ..self.settings.clone()
        };
        let known = self.modes().clone();
        let o = optimize::optimize_with(name, code, &settings, &known)
            .map_err(|e| in_stage(Stage::Optimize, e))?;
        self.modes()
            .merge(&o.modes)
            .map_err(|e| in_stage(Stage::Optimize, e))?;
        Ok(o)
    }

    /// The stages lower, optimize (each included routine) and codegen (the batch).
    #[allow(clippy::type_complexity)]
    fn to_c(
        &self,
        names: Option<&[String]>,
        occupancy: Option<Occupancy<'_>>,
        bindings: &Bindings,
        asgns: &[Assignments],
        target: &VectorTarget,
        options: CodegenOptions<'_>,
    ) -> Result<(Vec<Option<Entry>>, Generated, Vec<DebugFile>)> {
        let mut entries = vec![];
        let mut all_dumps = vec![];
        for (i, a) in asgns.iter().enumerate() {
            let name = routine_name(names.and_then(|n| n.get(i)).map(String::as_str), a, i);
            if occupancy.is_some_and(|occ| !occ(&name, i)) {
                entries.push(None);
                continue;
            }
            let optimized = self.optimize_one(&name, a, target, options.trace_dir.is_some())?;
            all_dumps.extend(dumps(&optimized, a, i));
            entries.push(Some(Entry { name, optimized }));
        }
        let included: Vec<(&Optimized, &Bindings)> = entries
            .iter()
            .flatten()
            .map(|e| (&e.optimized, bindings))
            .collect();
        let generated = codegen::generate(&included, target, options)?;
        Ok((entries, generated, all_dumps))
    }

    /// Runs `make(config, target, speculation)`. With `speculate` (code compiled now) and a
    /// target that is not remembered yet, first for a guess at the target while the target
    /// probe runs (see `Speculation`); `make` returns `None` when the probe disproved the
    /// guess, and then runs again for the probed target.
    fn for_target<T>(
        &self,
        speculate: bool,
        make: impl Fn(&CompilerConfig, &VectorTarget, Option<&Speculation>) -> Result<Option<T>>,
    ) -> Result<T> {
        let cfg = self.compiler_config()?;
        if let Some(s) = speculate.then(|| Speculation::start(&cfg)).flatten() {
            match make(&cfg, &s.vector_target(), Some(&s)) {
                Ok(Some(done)) => return Ok(done),
                Ok(None) => {}
                // An error of code generation for the guess only counts if the probe agrees
                // with the guess.
                Err(e) => {
                    if s.confirmed()? {
                        return Err(e);
                    }
                }
            }
        }
        let target = vector_target(&cfg);
        make(&cfg, &target, None)?.ok_or_else(not_built)
    }
}

/// What `cfg`'s compiler makes of its architecture flags, as code generation sees it (probed
/// once per process and memoized on disk). When the probe fails, code is written for the
/// portable target (GCC/Clang vector extensions) and the compile itself reports what is
/// wrong with the compiler.
fn vector_target(cfg: &CompilerConfig) -> VectorTarget {
    compile::Target::resolve(cfg)
        .map(|t| t.vector_target_for(cfg))
        .unwrap_or_default()
}

fn routine_name(name: Option<&str>, asgns: &Assignments, i: usize) -> String {
    name.map(str::to_string)
        .or_else(|| asgns.first_comment().map(str::to_string))
        .unwrap_or_else(|| format!("routine{i}"))
}

/// Readable dumps of a routine for the debug directory; `index` (the routine's position in
/// its batch) keeps the names unique when two routine names sanitize alike.
fn dumps(o: &Optimized, asgns: &Assignments, index: usize) -> Vec<DebugFile> {
    let stem = format!("r{index}_{}", codegen::sanitize_ident(&o.name));
    vec![
        DebugFile {
            name: format!("{stem}.assignments.txt"),
            contents: asgns.to_doc(),
        },
        DebugFile {
            name: format!("{stem}.unoptimized.ll.txt"),
            contents: loops::to_doc(&o.unoptimized),
        },
        DebugFile {
            name: format!("{stem}.optimized.ll.txt"),
            contents: loops::to_doc(&o.code),
        },
    ]
}

/// The compile stage: the generated code's parts are dealt out to files of similar weight
/// (see [`plan_files`]), compiled by up to `ARRAYJIT_COMPILE_JOBS` compiler processes at
/// once. Returns one compiled routine per signature, in order; `None` if the code was
/// generated for `speculation`'s guess at the target and the probe disproved it.
fn compile_generated(
    generated: &Generated,
    dumps: &[DebugFile],
    cfg: &CompilerConfig,
    speculation: Option<&Speculation>,
) -> Result<Option<Vec<Compiled>>> {
    let jobs = cfg.compile_jobs;
    let weights: Vec<usize> = generated.parts.iter().map(|p| p.weight).collect();
    let sizes: Vec<usize> = generated.parts.iter().map(|p| p.text.len()).collect();
    let files = plan_files(&weights, &sizes, jobs);
    let sources: Vec<(String, String)> = files
        .iter()
        .enumerate()
        .map(|(k, parts)| {
            let first = parts
                .first()
                .and_then(|&p| generated.parts.get(p))
                .and_then(|p| generated.sigs.get(p.routine))
                .map_or("routine", |s| s.name.as_str());
            let stem = if files.len() == 1 {
                first.to_string()
            } else {
                format!("{first}_f{}", k + 1)
            };
            (generated.file(parts), stem)
        })
        .collect();
    let libs = compile_files(cfg, speculation, &sources, dumps, jobs).map_err(|(k, e)| {
        // Name the routines of the file the compiler failed on.
        let mut names: Vec<&str> = vec![];
        for &p in &files[k] {
            let n = generated.parts[p].routine;
            if let Some(sig) = generated.sigs.get(n) {
                if !names.contains(&sig.name.as_str()) {
                    names.push(&sig.name);
                }
            }
        }
        Error::in_routine(&names.join(", "), e)
    })?;
    let Some(libs) = libs.into_iter().collect::<Option<Vec<_>>>() else {
        return Ok(None);
    };
    let mut lib_of_part = vec![0usize; generated.parts.len()];
    for (f, parts) in files.iter().enumerate() {
        for &p in parts {
            lib_of_part[p] = f;
        }
    }
    generated
        .sigs
        .iter()
        .enumerate()
        .map(|(r, sig)| {
            let mut entries = vec![];
            let mut used: Vec<Arc<LoadedLibrary>> = vec![];
            for (p, part) in generated.parts.iter().enumerate() {
                if part.routine != r {
                    continue;
                }
                let lib = &libs[lib_of_part[p]];
                entries.push(lib.entry(&part.entry)?);
                if !used.iter().any(|l| Arc::ptr_eq(l, lib)) {
                    used.push(lib.clone());
                }
            }
            Ok(Compiled {
                libs: used,
                sig: sig.clone(),
                entries,
            })
        })
        .collect::<Result<_>>()
        .map(Some)
}

/// The most loop-IR weight one compiled file should carry (about 16 parts): big programs
/// are compiled as many files of this size, `ARRAYJIT_COMPILE_JOBS` at a time, so that no
/// compiler run grows with the program.
const FILE_WEIGHT: usize = 16 * codegen::PART_WEIGHT;

/// Deals the parts out to files: as many files as [`FILE_WEIGHT`] of the parts' loop-IR
/// `weights` takes, rounded up to a whole multiple of the compile jobs (when there are enough
/// parts), so that the jobs finish together: 3 files on 2 jobs would take two rounds of the
/// compiler, 4 smaller ones take two rounds of half the size. The files are contiguous runs of
/// parts of similar C size (`sizes`, the parts' text), which is what the compiler's time
/// follows: a GEMM kernel's vector code is far more C per loop-IR node than a loop of scalar
/// statements, and balancing by nodes gave the big moons job's two files 58 and 24 KB of C
/// (a compile of 640 ms where balanced files took 460). Deterministic, so that unchanged code
/// hits the compile cache.
fn plan_files(weights: &[usize], sizes: &[usize], jobs: usize) -> Vec<Vec<usize>> {
    let n = weights.len();
    let total: usize = weights.iter().sum::<usize>().max(1);
    let jobs = jobs.max(1);
    let count = total
        .div_ceil(FILE_WEIGHT)
        .div_ceil(jobs)
        .saturating_mul(jobs)
        .min(n)
        .max(1);
    let total_size: usize = sizes.iter().sum::<usize>().max(1);
    let mut files: Vec<Vec<usize>> = vec![vec![]; count];
    let mut before = 0usize;
    for (i, &s) in sizes.iter().enumerate().take(n) {
        // The file where the part's middle falls (its start would give a file every part
        // that begins before the boundary, however far past it the part reaches).
        let middle = before.saturating_add(s / 2);
        let k = (middle.saturating_mul(count) / total_size).min(count - 1);
        files[k].push(i);
        before += s;
    }
    files.retain(|f| !f.is_empty());
    files
}

/// The trace directory as generated code uses it: created (with its parents, mode 0700) if
/// it does not exist, and made absolute (the code runs in whatever directory the process is
/// in then).
///
/// # Errors
///
/// [`Error::Io`] naming the directory when it cannot be created or resolved.
fn prepare_trace_dir(dir: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let what = || format!("trace directory {} (ARRAYJIT_TRACE_DIR)", dir.display());
    if !dir.is_dir() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| Error::io(format!("creating {}", what()), e))?;
    }
    std::path::absolute(dir).map_err(|e| Error::io(format!("resolving {}", what()), e))
}

/// The error for a compile without a speculation that reports a disproved guess (which
/// cannot happen).
fn not_built() -> Error {
    Error::Internal("a compile for the probed target was discarded".into())
}

/// Compiles and loads `(source, stem)` files with at most `jobs` compiler processes at once;
/// the debug dumps are kept with the first file. The first failure (in file order) is
/// returned. With a speculation, a file is `None` when the probe disproved the guess.
fn compile_files(
    cfg: &CompilerConfig,
    speculation: Option<&Speculation>,
    files: &[(String, String)],
    dumps: &[DebugFile],
    jobs: usize,
) -> std::result::Result<Vec<Option<Arc<LoadedLibrary>>>, (usize, Error)> {
    let compile_one = |k: usize| {
        let (src, stem) = &files[k];
        let dumps: &[DebugFile] = if k == 0 { dumps } else { &[] };
        match speculation {
            Some(s) => compile::compile_and_load_speculative(cfg, s, src, stem, dumps),
            None => compile::compile_and_load(cfg, src, stem, dumps).map(Some),
        }
        .map_err(|e| (k, e))
    };
    if files.len() <= 1 || jobs <= 1 {
        return (0..files.len()).map(compile_one).collect();
    }
    let next = AtomicUsize::new(0);
    type Loaded = std::result::Result<Option<Arc<LoadedLibrary>>, (usize, Error)>;
    let results: Mutex<Vec<Option<Loaded>>> = Mutex::new((0..files.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..jobs.min(files.len()) {
            scope.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::SeqCst);
                if k >= files.len() {
                    break;
                }
                let r = compile_one(k);
                let failed = r.is_err();
                if let Some(slot) = results.lock().unwrap_or_else(|p| p.into_inner()).get_mut(k) {
                    *slot = Some(r);
                }
                if failed {
                    // Stop handing out work: the batch fails anyway.
                    next.store(files.len(), Ordering::SeqCst);
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::with_capacity(files.len());
    for r in results {
        match r {
            Some(r) => out.push(r?),
            None => {
                return Err((
                    0,
                    Error::Internal("a compile job was skipped after another failed".into()),
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{plan_files, FILE_WEIGHT};

    #[test]
    fn files_are_a_multiple_of_the_jobs_and_bounded_in_weight() {
        let w = crate::codegen::PART_WEIGHT;
        // 40 full parts need 3 files of FILE_WEIGHT; on 2 jobs they become 4.
        let files = plan_files(&vec![w; 40], &vec![1000; 40], 2);
        assert_eq!(files.len(), 4);
        assert!(files.iter().all(|f| f.len() == 10), "{files:?}");
        // Every part once, in order.
        let flat: Vec<usize> = files.concat();
        assert_eq!(flat, (0..40).collect::<Vec<_>>());
        for jobs in 1..=5 {
            let files = plan_files(&vec![w; 40], &vec![1000; 40], jobs);
            assert_eq!(files.len() % jobs, 0, "{jobs} jobs: {} files", files.len());
            for f in &files {
                assert!(f.len() * w <= FILE_WEIGHT, "{jobs} jobs: {files:?}");
            }
        }
        // Fewer parts than jobs: one file a part; nothing: nothing.
        assert_eq!(plan_files(&[4, 4], &[10, 10], 8), vec![vec![0], vec![1]]);
        assert!(plan_files(&[], &[], 2).is_empty());
        assert_eq!(plan_files(&[5], &[10], 0), vec![vec![0]]);
        // Two files balanced by C size, not by weight: a heavy part of little weight first.
        let files = plan_files(
            &[w, w, w, w, w, w],
            &[9000, 1000, 1000, 1000, 1000, 1000],
            2,
        );
        assert_eq!(files, vec![vec![0], vec![1, 2, 3, 4, 5]]);
        // A part starting just before the middle but reaching far past it goes after it.
        let files = plan_files(&[w; 4], &[11000, 11000, 16000, 7000], 2);
        assert_eq!(files, vec![vec![0, 1], vec![2, 3]]);
    }
}
