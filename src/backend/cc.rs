//! The cc no-device backend: compiles with the system C compiler and runs routines
//! synchronously on the calling thread.

use super::buffer::{lock_all, lock_planned, plan_locks, BufferPtr, DeviceBuffer};
use super::context::Context;
use super::device::Device;
pub use super::task::{MergeBuffer, Task};
use super::task::{Runnable, StaticValues};
use super::team::{AjTeam, Team};
use crate::codegen::RoutineSignature;
use crate::compile::CompilerConfig;
use crate::error::{Error, Result};
use crate::ir::{
    check_static_value, Assignments, Bindings, MemoryMode, MemoryModes, Ndarray, RoutineBindings,
    Tnode,
};
use crate::optimize::{Optimized, Settings};
pub use crate::pipeline::Occupancy;
use crate::pipeline::{Compilation, Compiled, Generation, Pipeline};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// How many virtual devices a backend suggests (see the devices layer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Config {
    /// One virtual device per physical device.
    PhysicalDevicesOnly,
    /// Enough virtual devices to overlap copying with computing.
    ForParallelCopying,
    /// As many virtual devices as useful for parallelism.
    #[default]
    MostParallelDevices,
}

enum CodeState {
    Compiled(Arc<Compiled>),
    /// Compilation postponed to `link` (`shared: false`).
    Postponed(Box<Generation>),
}

/// A compiled (or ready-to-compile) routine, not yet linked into a context.
pub struct Code {
    source: String,
    name: String,
    bindings: Bindings,
    optimized: Optimized,
    state: CodeState,
}

/// Routines compiled together, with few compiler runs.
pub struct CodeBatch {
    source: String,
    bindings: Bindings,
    entries: Vec<Option<BatchEntry>>,
    /// One compiled routine per included entry, in order; filled by `compile_batch` with
    /// `shared: true`, else by the first `link_batch` (from `postponed`).
    compiled: Mutex<Option<Vec<Arc<Compiled>>>>,
    postponed: Option<Box<Generation>>,
}

/// One routine of a batch.
struct BatchEntry {
    name: String,
    optimized: Optimized,
}

/// A routine linked into a context. Clones share the routine's bindings and scratch memory:
/// a routine (and its clones) must not run concurrently with itself, which a device's queue
/// guarantees.
///
/// Cheap to clone: one reference count (a task holds a clone, made on the scheduling thread
/// and dropped on the device's).
#[derive(Clone)]
pub struct Routine(Arc<RoutineInner>);

struct RoutineInner {
    context: Context,
    name: Arc<str>,
    /// The description of its tasks: `routine NAME on DEVICE`.
    task_description: Arc<str>,
    bindings: RoutineBindings,
    compiled: Arc<Compiled>,
    buffers: Arc<Vec<BufferPtr>>,
    merge_buffer: MergeBuffer,
    device: Option<Device>,
    /// Whether the check for reads of never-written tensors passed or warned (it runs until
    /// then, once per linked routine).
    warned_unwritten: Arc<AtomicBool>,
    /// Whether reads of never-written tensors are an error ([`CcBackend::with_strict`]).
    strict: bool,
    /// The warnings of the runs so far ([`Routine::warnings`]).
    warnings: Arc<Mutex<Vec<String>>>,
    /// The context buffers with whether the code writes them (see `Routine::accesses`).
    accesses: Arc<[(BufferPtr, bool)]>,
    /// The buffers a run locks (its context buffers and scratch; see `lock_planned`).
    lock_plan: Arc<[(BufferPtr, bool)]>,
    /// The thread team running its parallel regions: its device's, or the no-device
    /// backend's (`None`: one thread).
    team: Option<Arc<Team>>,
}

impl Routine {
    /// The context the routine runs in (a child of the context it was linked into).
    pub fn context(&self) -> &Context {
        &self.0.context
    }
    /// The routine's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }
    /// What the runs so far warned about: the tensors a run read that nothing had written
    /// in the routine's context (they read as zeros). With strict reads
    /// ([`CcBackend::with_strict`], on by default in debug builds) such a run is an
    /// [`Error::UnwrittenRead`] instead.
    pub fn warnings(&self) -> Vec<String> {
        self.0
            .warnings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
    /// The static-index cells; set them before running.
    pub fn bindings(&self) -> &RoutineBindings {
        &self.0.bindings
    }
    /// The node the routine reads from the merge buffer, if any.
    pub fn merge_node(&self) -> Option<&Tnode> {
        self.0.compiled.sig.merge_node.as_ref()
    }
    /// The generated C signature.
    pub fn signature(&self) -> &RoutineSignature {
        &self.0.compiled.sig
    }

    /// The static-index values set now, without allocating (inline up to
    /// `StaticValues::INLINE`).
    fn current_values(&self) -> StaticValues {
        StaticValues::collect(self.0.bindings.iter_values())
    }

    /// Runs the routine now, on this thread, with the given static-index values (in the
    /// order of [`RoutineSignature::statics`]) **without checking them** against their
    /// limits, so that an out-of-range value reaches the generated code. Only for testing
    /// bounds-checked code: it is an error for a routine not compiled in checked mode
    /// ([`CompilerConfig::checked`]), whose code would access memory out of bounds.
    #[doc(hidden)]
    pub fn run_unchecked_statics_for_test(&self, values: &[i64]) -> Result<()> {
        let sig = &self.0.compiled.sig;
        if !sig.checked {
            return Err(Error::Usage(format!(
                "routine {}: run_unchecked_statics_for_test needs bounds-checked code",
                self.0.name
            )));
        }
        if values.len() != sig.statics.len() {
            return Err(Error::Count {
                what: format!("routine {}: static values", self.0.name),
                expected: sig.statics.len(),
                got: values.len(),
            });
        }
        self.0.run_values(values, false)
    }

    /// A task running the routine with the binding values current *now* (they are captured,
    /// so the caller may change them right after).
    pub fn task(&self) -> Task {
        let values = self.current_values();
        let work: Arc<dyn Runnable> = self.0.clone();
        Task::shared(self.0.task_description.clone(), work, values).with_accesses(self.accesses())
    }

    /// Schedules the routine with the binding values current now: on a device, enqueues it
    /// and returns at once (an earlier failure on the device is returned instead); on the
    /// no-device backend, runs it now.
    pub fn schedule(&self) -> Result<()> {
        match &self.0.device {
            Some(d) => d.schedule(self.task()),
            None => self.run(),
        }
    }

    /// The device the routine runs on, if it was linked by a device backend.
    pub fn device(&self) -> Option<&Device> {
        self.0.device.as_ref()
    }

    /// Runs the routine now, on this thread. On a device, it first waits for everything
    /// already scheduled there (transfers included), so that it sees their effects, and
    /// reports an earlier failure on the device instead of running. On a device of another
    /// process ([`Device::is_remote`]) it does nothing.
    pub fn run(&self) -> Result<()> {
        if let Some(d) = &self.0.device {
            d.await_idle()?;
            if d.is_remote() {
                // Another process (MPI rank) owns the device and runs the routine there.
                return Ok(());
            }
            d.wait_for_hazards(&self.accesses());
        }
        self.0.run_with(self.current_values().as_slice())
    }

    /// The context buffers a run reads (`false`) and writes (`true`), and on a device whose
    /// merge buffer a streaming merge points at another device's buffer, that buffer (read),
    /// for the device layer's hazard tracking.
    fn accesses(&self) -> Arc<[(BufferPtr, bool)]> {
        if self.0.compiled.sig.merge_node.is_some() {
            if let Some(src) = self.0.device.as_ref().and_then(Device::streamed) {
                let mut v = self.0.accesses.to_vec();
                v.push((src, false));
                return v.into();
            }
        }
        self.0.accesses.clone()
    }

    /// Runs the routine now, on this thread, without waiting for its device: for use inside
    /// a task running on the routine's own device (where [`Routine::run`] would wait for
    /// itself).
    pub fn run_in_task(&self) -> Result<()> {
        self.0.run_with(self.current_values().as_slice())
    }
}

impl Runnable for RoutineInner {
    fn check(&self) -> Result<()> {
        self.context.check_live()
    }

    fn run_with(&self, values: &[i64]) -> Result<()> {
        self.run_values(values, true)
    }
}

/// The record bounds-checked code fills on an out-of-bounds access: the C `aj_check_t` of
/// the runtime header (same layout, checked on both sides).
#[repr(C)]
struct CheckRecord {
    failed: i32,
    tensor: i32,
    naxes: i32,
    lanes: i32,
    indices: [i64; CHECK_MAX_AXES],
    extents: [i64; CHECK_MAX_AXES],
}

/// `AJ_CHECK_MAX_AXES` of the runtime header.
const CHECK_MAX_AXES: usize = 16;
/// `AJ_STATUS_NO_MEMORY` of the runtime header.
const AJ_STATUS_NO_MEMORY: i32 = 4;
const _: () = assert!(std::mem::size_of::<CheckRecord>() == 272);

impl CheckRecord {
    fn new() -> CheckRecord {
        CheckRecord {
            failed: 0,
            tensor: 0,
            naxes: 0,
            lanes: 0,
            indices: [0; CHECK_MAX_AXES],
            extents: [0; CHECK_MAX_AXES],
        }
    }

    /// The error this record describes, for routine `name` whose tensor table is `table`.
    fn to_error(&self, name: &str, table: &[Tnode]) -> Error {
        let Some(tn) = usize::try_from(self.tensor).ok().and_then(|t| table.get(t)) else {
            return Error::Internal(format!(
                "routine {name}: checked code reported tensor {} of a table of {}",
                self.tensor,
                table.len()
            ));
        };
        let n = usize::try_from(self.naxes)
            .unwrap_or(0)
            .min(CHECK_MAX_AXES)
            .min(tn.dims().len());
        Error::IndexOutOfBounds {
            routine: name.to_string(),
            tensor: tn.name(),
            indices: self.indices[..n].to_vec(),
            extents: tn.dims()[..n].to_vec(),
        }
    }
}

impl RoutineInner {
    /// Runs the routine with `values` for its static indices, checked against their limits
    /// unless `check_statics` is false (only for bounds-checked code, see
    /// [`Routine::run_unchecked_statics_for_test`]).
    fn run_values(&self, values: &[i64], check_statics: bool) -> Result<()> {
        self.context.check_live()?;
        let sig = &self.compiled.sig;
        if check_statics || !sig.checked {
            for ((s, &v), limit) in sig.statics.iter().zip(values).zip(&sig.static_limits) {
                check_static_value(&self.name, s, v, *limit)?;
            }
        }
        // The merge buffer's cell stays locked for the run (only this device's tasks set it),
        // so the run borrows the buffer instead of cloning its handle.
        let cell = sig.merge_node.as_ref().map(|_| self.merge_buffer.lock());
        let merge: Option<&DeviceBuffer> = match (&sig.merge_node, cell.as_deref()) {
            (Some(expected), Some(held)) => match held {
                Some((buf, tn)) if tn == expected && buf.size() >= expected.size_in_bytes() => {
                    Some(&**buf)
                }
                other => {
                    return Err(Error::MergeBufferMismatch {
                        routine: self.name.to_string(),
                        expected: expected.name(),
                        found: match other {
                            Some((_, tn)) if tn == expected => {
                                format!("{} with a buffer too small", tn.name())
                            }
                            Some((_, tn)) => tn.name(),
                            None => "nothing".into(),
                        },
                    })
                }
            },
            _ => None,
        };
        // Every buffer the code touches is locked for the whole run: exclusively where it
        // writes (context buffers it stores to, and its scratch), shared where it only reads.
        // The plan is made at link; the merge buffer, which can change between runs, joins it
        // here (on the stack for the usual routine).
        let _access = match merge {
            None => lock_planned(&self.lock_plan),
            Some(m) => {
                let n = self.lock_plan.len() + 1;
                let mut stack: [(&DeviceBuffer, bool); 16] = [(m, false); 16];
                let mut heap: Vec<(&DeviceBuffer, bool)>;
                let locks: &mut [(&DeviceBuffer, bool)] = if n <= stack.len() {
                    for (slot, (b, w)) in stack.iter_mut().zip(self.lock_plan.iter()) {
                        *slot = (&**b, *w);
                    }
                    &mut stack[..n]
                } else {
                    heap = self.lock_plan.iter().map(|(b, w)| (&**b, *w)).collect();
                    heap.push((m, false));
                    &mut heap
                };
                lock_all(locks)
            }
        };
        if !self.warned_unwritten.load(Ordering::Relaxed) {
            self.check_unwritten_reads()?;
        }
        // The buffer table, on the stack for the usual routine; checked code finds its check
        // record after the buffers.
        let mut record = CheckRecord::new();
        let record_ptr = (&mut record as *mut CheckRecord).cast::<u8>();
        let extra = sig.checked.then_some(record_ptr);
        let n = self.buffers.len() + usize::from(sig.checked);
        let mut table = [std::ptr::null_mut::<u8>(); 32];
        let mut heap: Vec<*mut u8>;
        let ptrs: &[*mut u8] = if n <= table.len() {
            let all = self.buffers.iter().map(|b| b.as_ptr()).chain(extra);
            for (slot, p) in table.iter_mut().zip(all) {
                *slot = p;
            }
            &table[..n]
        } else {
            heap = self.buffers.iter().map(|b| b.as_ptr()).collect();
            heap.extend(extra);
            &heap
        };
        let merge_ptr = merge.map_or(std::ptr::null(), |b| b.as_ptr() as *const u8);
        let team = self.team.as_ref().map_or_else(AjTeam::single, |t| t.view());
        let _ = &self.compiled.libs;
        for (part, entry) in self.compiled.entries.iter().enumerate() {
            // SAFETY: every part's entry point was generated for this routine's tables:
            // `ptrs` holds one live buffer per node of `sig.buffers` followed by one per
            // `sig.scratch`, each of the node's full size (allocated at link); `values` has
            // one entry per static index, each checked above against the extents it indexes;
            // the merge buffer, if read, holds the expected node and is large enough (checked
            // above). The libraries stay loaded while `self.compiled` lives. Checked code
            // (`sig.checked`) also gets a pointer to `record`, a live `aj_check_t` of the
            // same layout, as the table's last entry, and checks every access itself, so
            // that static values need not be checked for it.
            // `team` is a live `aj_team_t` whose state (the team) `self.team` keeps alive.
            let status = unsafe { entry(ptrs.as_ptr(), values.as_ptr(), merge_ptr, team.as_ptr()) };
            if sig.checked && record.failed != 0 {
                // The code stopped at the access: what it wrote before stays written.
                for (b, &w) in self.buffers.iter().zip(&sig.writes) {
                    if w {
                        b.mark_written();
                    }
                }
                return Err(record.to_error(&self.name, &sig.check_tensors));
            }
            if status == AJ_STATUS_NO_MEMORY {
                return Err(Error::OutOfMemory {
                    what: format!(
                        "scratch memory of a thread running routine {} (its parallel regions' \
                         private arrays)",
                        self.name
                    ),
                    bytes: self.team.as_ref().map_or(0, |t| t.failed_bytes() as usize),
                });
            }
            if status != 0 {
                return Err(Error::RoutineFailed {
                    routine: self.name.to_string(),
                    part: part + 1,
                    status,
                });
            }
        }
        for (b, &w) in self.buffers.iter().zip(&sig.writes) {
            if w {
                b.mark_written();
            }
        }
        Ok(())
    }
}

impl RoutineInner {
    /// Checks the tensors the routine reads that nothing has written in its context: they
    /// read as zeros, which usually means a producer routine was not run first, or a tensor
    /// meant as an input was not copied from the host. With strict reads that is
    /// [`Error::UnwrittenRead`] (checked again at the next run); otherwise a warning, once per
    /// linked routine, through `tracing` and [`Routine::warnings`].
    fn check_unwritten_reads(&self) -> Result<()> {
        let sig = &self.compiled.sig;
        let unwritten: Vec<String> = sig
            .buffers
            .iter()
            .zip(&sig.writes)
            .zip(self.buffers.iter())
            .filter(|((_, &w), b)| !w && !b.was_written())
            .map(|((tn, _), _)| tn.name())
            .collect();
        if !unwritten.is_empty() {
            let e = Error::UnwrittenRead {
                routine: self.name.to_string(),
                tensors: unwritten.join(", "),
            };
            if self.strict {
                return Err(e);
            }
            tracing::warn!(
                target: "arrayjit::backend",
                routine = %self.name,
                tensors = %unwritten.join(", "),
                "{e}"
            );
            self.warnings
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(e.to_string());
        }
        self.warned_unwritten.store(true, Ordering::Relaxed);
        Ok(())
    }
}

impl fmt::Debug for Routine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Routine({} in {:?})", self.0.name, self.0.context)
    }
}

/// The cc no-device backend.
pub struct CcBackend {
    initialized: AtomicBool,
    config: Mutex<Config>,
    /// What compiles: the stages lower → optimize → codegen → compile with the optimizer
    /// settings, the compiler configuration (`None`: read from the environment at every
    /// compile, [`CompilerConfig::from_env`]), bounds checks, and the memory-mode decisions
    /// of every routine compiled so far (nodes themselves are never changed: each routine
    /// starts from them, and a routine contradicting an earlier one is an error naming the
    /// node).
    pipeline: Pipeline,
    /// Whether a run reading tensors that nothing has written is an error
    /// ([`CcBackend::with_strict`]).
    strict: bool,
    /// Threads per device ([`CcBackend::with_threads`]; `None`: the backend decides).
    threads: Option<usize>,
    /// The team of routines linked without a device (created at the first such link).
    team: OnceLock<Option<Arc<Team>>>,
}

impl Default for CcBackend {
    fn default() -> Self {
        CcBackend::new()
    }
}

impl CcBackend {
    /// A backend with default optimizer settings (not yet initialized).
    pub fn new() -> CcBackend {
        CcBackend::with_settings(Settings::default())
    }

    /// The backend generating bounds-checked code ([`CompilerConfig::checked`]) when
    /// `checked` is true, whatever the compiler configuration says (with false, the
    /// configuration decides).
    pub fn with_checked(mut self, checked: bool) -> CcBackend {
        self.pipeline.set_checked(checked);
        self
    }

    /// The backend with strict reads on or off: with strict reads, a run of a routine that
    /// reads a tensor nothing has written in its context (neither a routine, nor a copy from
    /// the host or another device) is [`Error::UnwrittenRead`] instead of reading zeros; off,
    /// it is a warning ([`Routine::warnings`] and `tracing`). On by default in debug builds
    /// (`cfg!(debug_assertions)`), off in release builds.
    pub fn with_strict(self, strict: bool) -> CcBackend {
        CcBackend { strict, ..self }
    }

    /// The backend running routines' parallel regions on `threads` threads (at least 1):
    /// those linked without a device on a team of the calling thread and `threads - 1`
    /// helper threads (pinned to the first cores the process may use, unless
    /// `ARRAYJIT_PIN_WORKERS=0`), and, for the device backends built on it
    /// ([`MulticoreBackend::with_cc`](super::MulticoreBackend::with_cc), ...), that many
    /// threads per device. Without it, routines linked without a device run on one thread, and
    /// the device backends choose (see their documentation). Results are the same bits for
    /// any number of threads.
    pub fn with_threads(self, threads: usize) -> CcBackend {
        CcBackend {
            threads: Some(threads.max(1)),
            team: OnceLock::new(),
            ..self
        }
    }

    /// The threads per device set by [`CcBackend::with_threads`], if any.
    pub fn threads(&self) -> Option<usize> {
        self.threads
    }

    /// The team of routines linked without a device.
    fn no_device_team(&self) -> Option<Arc<Team>> {
        self.team
            .get_or_init(|| {
                let n = self.threads.unwrap_or(1);
                (n > 1).then(|| {
                    let team = Team::new("arrayjit-cc", n);
                    let pin =
                        crate::compile::env_boolean("ARRAYJIT_PIN_WORKERS", true).unwrap_or(true);
                    let cores: Vec<Option<usize>> = (0..n)
                        .map(|k| {
                            if pin {
                                super::device::allowed_core(k)
                            } else {
                                None
                            }
                        })
                        .collect();
                    team.set_cores(&cores);
                    team
                })
            })
            .clone()
    }

    /// A backend with the given optimizer settings (e.g. optimization off).
    pub fn with_settings(settings: Settings) -> CcBackend {
        CcBackend {
            initialized: AtomicBool::new(false),
            config: Mutex::new(Config::default()),
            pipeline: Pipeline::new(settings, None, false),
            strict: cfg!(debug_assertions),
            threads: None,
            team: OnceLock::new(),
        }
    }

    /// A backend with a given compiler configuration (compiler, flags, cache, jobs...) and
    /// optimizer settings: nothing is read from the environment. Two backends can use
    /// different compilers or caches side by side.
    pub fn with_config(compiler: CompilerConfig, settings: Settings) -> CcBackend {
        CcBackend {
            initialized: AtomicBool::new(false),
            config: Mutex::new(Config::default()),
            pipeline: Pipeline::new(settings, Some(compiler), false),
            strict: cfg!(debug_assertions),
            threads: None,
            team: OnceLock::new(),
        }
    }

    /// The optimizer settings used by `compile`.
    pub fn settings(&self) -> &Settings {
        self.pipeline.settings()
    }

    /// The compiler configuration in effect: the one given, else the environment's.
    pub fn compiler_config(&self) -> Result<CompilerConfig> {
        self.pipeline.compiler_config()
    }

    /// Initializes the backend before first use or after `unsafe_cleanup`. Does nothing if it
    /// is already initialized.
    pub fn initialize(&self, config: Config) {
        if !self.initialized.swap(true, Ordering::SeqCst) {
            *self.config.lock().unwrap_or_else(|p| p.into_inner()) = config;
        }
    }

    /// Whether `initialize` was called (and not undone by `unsafe_cleanup`).
    pub fn is_initialized(&self) -> bool {
        self.initialized.load(Ordering::SeqCst)
    }

    /// The configuration given to `initialize`.
    pub fn config(&self) -> Config {
        *self.config.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_initialized(&self) -> Result<()> {
        if self.is_initialized() {
            Ok(())
        } else {
            Err(Error::NotInitialized {
                backend: "cc".into(),
            })
        }
    }

    /// A new root context.
    pub fn init(&self, label: &str) -> Result<Context> {
        self.check_initialized()?;
        Ok(Context::root(label, None))
    }

    /// Finalizes the context: releases its buffers; later uses of it fail (see
    /// [`Context::finalize`]).
    pub fn finalize(&self, ctx: &Context) {
        ctx.finalize()
    }

    /// A zero-filled buffer of at least `size_in_bytes`; reuses `old_buffer` when it is big
    /// enough.
    pub fn alloc_buffer(
        &self,
        old_buffer: Option<(BufferPtr, usize)>,
        size_in_bytes: usize,
    ) -> Result<BufferPtr> {
        match old_buffer {
            Some((b, old_size)) if old_size >= size_in_bytes && b.size() >= size_in_bytes => Ok(b),
            _ => DeviceBuffer::new(size_in_bytes),
        }
    }

    /// The memory mode decided for a node by the routines compiled so far (or its
    /// declaration).
    pub fn memory_mode(&self, tn: &Tnode) -> Option<MemoryMode> {
        self.pipeline.modes().get(tn)
    }

    /// Every memory-mode decision of the routines compiled so far.
    pub fn memory_modes(&self) -> MemoryModes {
        self.pipeline.modes().clone()
    }

    /// Compiles one routine. With `shared: true` the C is compiled now and the code can be
    /// linked into any number of contexts; with `shared: false` compilation is postponed to
    /// `link`. The name defaults to the first block comment.
    pub fn compile(
        &self,
        shared: bool,
        name: Option<&str>,
        bindings: &Bindings,
        asgns: &Assignments,
    ) -> Result<Code> {
        self.check_initialized()?;
        let names = name.map(|n| [n.to_string()]);
        let built = self.pipeline.build(
            shared,
            names.as_ref().map(|n| &n[..]),
            None,
            bindings,
            std::slice::from_ref(asgns),
        )?;
        let entry = built
            .entries
            .into_iter()
            .next()
            .flatten()
            .ok_or_else(|| Error::Internal("no routine was generated".into()))?;
        let state = match built.code {
            Compilation::Compiled(mut c) => CodeState::Compiled(Arc::new(
                c.pop()
                    .ok_or_else(|| Error::Internal("no routine was compiled".into()))?,
            )),
            Compilation::Postponed(g) => CodeState::Postponed(g),
        };
        Ok(Code {
            source: built.source,
            name: entry.name,
            bindings: bindings.clone(),
            optimized: entry.optimized,
            state,
        })
    }

    /// Lowers, optimizes and prints the C of a batch without compiling it (what
    /// `arrayjit emit-c` shows). Memory-mode decisions are recorded on the nodes as by
    /// `compile_batch`.
    pub fn generate_batch_source(
        &self,
        names: Option<&[String]>,
        bindings: &Bindings,
        asgns: &[Assignments],
    ) -> Result<String> {
        self.pipeline.source(names, bindings, asgns)
    }

    /// Compiles many routines with few compiler runs. Only entries for which
    /// `occupancy(name, index)` is true are included; the others are `None` in the batch.
    ///
    /// Routines are split into parts of bounded size, and the parts are dealt out to files
    /// of similar size compiled by up to `ARRAYJIT_COMPILE_JOBS` parallel compiler processes
    /// (default: the machine's available parallelism). [`CodeBatch::source`] shows the whole
    /// batch as one file.
    ///
    /// With `shared: true` the C is compiled now; with `shared: false` (as the seed allows)
    /// compiling is postponed to the first `link_batch`, whose compiled routines later links
    /// reuse. Lowering and optimizing happen now either way, so their errors come from here.
    pub fn compile_batch(
        &self,
        shared: bool,
        names: Option<&[String]>,
        occupancy: Option<Occupancy<'_>>,
        bindings: &Bindings,
        asgns: &[Assignments],
    ) -> Result<CodeBatch> {
        self.check_initialized()?;
        let built = self
            .pipeline
            .build(shared, names, occupancy, bindings, asgns)?;
        let entries = built
            .entries
            .into_iter()
            .map(|e| {
                e.map(|e| BatchEntry {
                    name: e.name,
                    optimized: e.optimized,
                })
            })
            .collect();
        let (compiled, postponed) = match built.code {
            Compilation::Compiled(c) => (Some(c.into_iter().map(Arc::new).collect()), None),
            Compilation::Postponed(g) => (None, Some(g)),
        };
        Ok(CodeBatch {
            source: built.source,
            bindings: bindings.clone(),
            entries,
            compiled: Mutex::new(compiled),
            postponed,
        })
    }

    /// The compiled routines of a batch (one per included entry): compiles a postponed batch
    /// on first use.
    fn batch_compiled(&self, batch: &CodeBatch) -> Result<Vec<Arc<Compiled>>> {
        let mut slot = batch.compiled.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = &*slot {
            return Ok(c.clone());
        }
        let p = batch
            .postponed
            .as_ref()
            .ok_or_else(|| Error::Internal("a batch with neither code nor compiled code".into()))?;
        let compiled: Vec<Arc<Compiled>> = self
            .pipeline
            .compile_postponed(p)?
            .into_iter()
            .map(Arc::new)
            .collect();
        *slot = Some(compiled.clone());
        Ok(compiled)
    }

    /// The node a compiled routine reads from the merge buffer, if any.
    pub fn expected_merge_node(&self, code: &Code) -> Option<Tnode> {
        code.optimized.merge_node.clone()
    }

    /// The merge nodes of every entry of a batch.
    pub fn expected_merge_nodes(&self, batch: &CodeBatch) -> Vec<Option<Tnode>> {
        batch
            .entries
            .iter()
            .map(|e| e.as_ref().and_then(|e| e.optimized.merge_node.clone()))
            .collect()
    }

    fn make_routine(
        &self,
        name: &str,
        bindings: &Bindings,
        compiled: Arc<Compiled>,
        ctx: &Context,
        from_prior: &[Tnode],
        merge_buffer: &MergeBuffer,
    ) -> Result<Routine> {
        let ctx = ctx.extend(
            &compiled.sig.buffers,
            from_prior,
            compiled.sig.merge_node.as_ref(),
            &format!("linking routine {name}"),
        )?;
        let buffers = compiled
            .sig
            .buffers
            .iter()
            .map(|tn| {
                ctx.get_buffer(tn).ok_or_else(|| Error::NotInContext {
                    what: format!("linking routine {name}"),
                    tensor: tn.name(),
                    context: ctx.label().to_string(),
                    hint: String::new(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // Large local arrays: scratch owned by this routine, allocated once here.
        let mut buffers = buffers;
        for tn in &compiled.sig.scratch {
            buffers.push(DeviceBuffer::new(tn.size_in_bytes())?);
        }
        let accesses: Arc<[(BufferPtr, bool)]> = buffers
            .iter()
            .zip(&compiled.sig.writes)
            .map(|(b, &w)| (b.clone(), w))
            .collect();
        // Context buffers as the code uses them. The scratch buffers belong to this routine
        // alone (allocated just above, never handed out): only runs of the routine and its
        // clones touch them, so holding the first one's exclusive lock keeps every other run
        // out of all of them, for one lock instead of one per scratch buffer.
        let lock_plan = plan_locks(
            accesses
                .iter()
                .cloned()
                .chain(buffers[accesses.len()..].first().map(|b| (b.clone(), true)))
                .collect(),
        );
        tracing::debug!(
            target: "arrayjit::backend",
            routine = name,
            context = ctx.label(),
            buffers = buffers.len(),
            "linked"
        );
        let strict = self.strict;
        let on = ctx
            .device()
            .map(|d| format!(" on {}", d.name()))
            .unwrap_or_default();
        let team = match ctx.device() {
            Some(d) => d.team().cloned(),
            None => self.no_device_team(),
        };
        Ok(Routine(Arc::new(RoutineInner {
            team,
            task_description: format!("routine {name}{on}").into(),
            device: ctx.device().cloned(),
            context: ctx,
            name: name.into(),
            bindings: RoutineBindings::for_routine(
                bindings,
                name,
                compiled.sig.static_limits.clone(),
            ),
            compiled,
            buffers: Arc::new(buffers),
            merge_buffer: merge_buffer.clone(),
            warned_unwritten: Arc::default(),
            strict,
            warnings: Arc::default(),
            lock_plan,
            accesses,
        })))
    }

    /// Links compiled code into a context: returns the routine, whose context is a child of
    /// `ctx` with zero-filled buffers for the routine's nodes that `ctx` lacked. Every node in
    /// `from_prior_context` must already be in `ctx`.
    pub fn link(
        &self,
        from_prior_context: &[Tnode],
        merge_buffer: &MergeBuffer,
        ctx: &Context,
        code: &Code,
    ) -> Result<Routine> {
        self.check_initialized()?;
        let compiled = match &code.state {
            CodeState::Compiled(c) => c.clone(),
            CodeState::Postponed(p) => Arc::new(
                self.pipeline
                    .compile_postponed(p)?
                    .pop()
                    .ok_or_else(|| Error::Internal("no routine was compiled".into()))?,
            ),
        };
        self.make_routine(
            &code.name,
            &code.bindings,
            compiled,
            ctx,
            from_prior_context,
            merge_buffer,
        )
        .map_err(|e| Error::in_routine(&code.name, e))
    }

    /// Links every routine of a batch; the returned context is downstream of all of them.
    pub fn link_batch(
        &self,
        from_prior_context: &[Tnode],
        merge_buffer: &MergeBuffer,
        ctx: &Context,
        batch: &CodeBatch,
    ) -> Result<(Context, Vec<Option<Routine>>)> {
        self.check_initialized()?;
        let mut compiled = self.batch_compiled(batch)?.into_iter();
        let start = ctx;
        let mut ctx = ctx.clone();
        let mut out = vec![];
        for e in &batch.entries {
            match e {
                None => out.push(None),
                Some(e) => {
                    let c = compiled
                        .next()
                        .ok_or_else(|| Error::Internal("a batch entry was not compiled".into()))?;
                    let r = self
                        .make_routine(
                            &e.name,
                            &batch.bindings,
                            c,
                            &ctx,
                            from_prior_context,
                            merge_buffer,
                        )
                        .map_err(|err| Error::in_routine(&e.name, err))?;
                    ctx = r.context().clone();
                    out.push(Some(r));
                }
            }
        }
        // As in the seed: the context downstream of the batch expects what the context
        // linked into expected.
        let ctx = ctx.with_expected_merge_node(start.expected_merge_node().cloned())?;
        Ok((ctx, out))
    }

    /// Releases everything; the backend must be initialized again before use.
    pub fn unsafe_cleanup(&self) {
        self.initialized.store(false, Ordering::SeqCst);
    }

    /// Copies `tn`'s buffer in `src` into `dst`. Errors: [`Error::ContextFinalized`] when
    /// `src` was finalized.
    pub fn to_buffer(&self, tn: &Tnode, dst: &BufferPtr, src: &Context) -> Result<()> {
        src.check_live()?;
        let b = src.get_buffer(tn).ok_or_else(|| Error::NotInContext {
            what: "to_buffer".into(),
            tensor: tn.name(),
            context: src.label().to_string(),
            hint: String::new(),
        })?;
        dst.copy_from(&b, tn.size_in_bytes())
    }

    /// Copies a host array into a buffer.
    pub fn host_to_buffer(&self, src: &Ndarray, dst: &BufferPtr) -> Result<()> {
        dst.write_ndarray(src)
    }

    /// Copies a buffer into a host array.
    pub fn buffer_to_host(&self, dst: &mut Ndarray, src: &BufferPtr) -> Result<()> {
        src.read_ndarray(dst)
    }

    /// The buffer of `tn` in `ctx`, if any.
    pub fn get_buffer(&self, tn: &Tnode, ctx: &Context) -> Option<BufferPtr> {
        ctx.get_buffer(tn)
    }

    /// If the node is hosted and in the context, copies host → context and returns true.
    pub fn from_host(&self, ctx: &Context, tn: &Tnode) -> Result<bool> {
        tracing::trace!(target: "arrayjit::backend", tensor = %tn, context = ctx.label(), "from_host");
        ctx.check_live()?;
        match ctx.get_buffer(tn) {
            Some(b) => match tn.with_host(|a| b.write_ndarray(a)) {
                Some(r) => r.map(|_| true),
                None => Ok(false),
            },
            None => Ok(false),
        }
    }

    /// If the node is hosted and in the context, copies context → host and returns true.
    pub fn to_host(&self, ctx: &Context, tn: &Tnode) -> Result<bool> {
        tracing::trace!(target: "arrayjit::backend", tensor = %tn, context = ctx.label(), "to_host");
        ctx.check_live()?;
        match ctx.get_buffer(tn) {
            Some(b) => match tn.with_host_mut(|a| b.read_ndarray(a)) {
                Some(r) => r.map(|_| true),
                None => Ok(false),
            },
            None => Ok(false),
        }
    }
}

impl Code {
    /// The routine's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The optimized routine body.
    pub fn optimized(&self) -> &Optimized {
        &self.optimized
    }
    /// Whether the C is compiled already (`shared: true`) or postponed to `link`.
    pub fn is_compiled(&self) -> bool {
        matches!(self.state, CodeState::Compiled(_))
    }
    /// The generated C source.
    pub fn source(&self) -> &str {
        &self.source
    }
}

impl CodeBatch {
    /// The generated C source of the whole batch.
    pub fn source(&self) -> &str {
        &self.source
    }
    /// The optimized bodies of the included routines (`None` for excluded entries).
    pub fn optimized(&self) -> Vec<Option<&Optimized>> {
        self.entries
            .iter()
            .map(|e| e.as_ref().map(|e| &e.optimized))
            .collect()
    }
    /// The names of the included routines (`None` for excluded entries).
    pub fn names(&self) -> Vec<Option<&str>> {
        self.entries
            .iter()
            .map(|e| e.as_ref().map(|e| e.name.as_str()))
            .collect()
    }
}

impl fmt::Debug for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            CodeState::Compiled(_) => "compiled",
            CodeState::Postponed(_) => "postponed",
        };
        write!(f, "Code({}, {state})", self.name)
    }
}

impl fmt::Debug for CodeBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CodeBatch({:?})", self.names())
    }
}

#[cfg(test)]
mod tests {
    use crate::compile::{self, CompilerConfig, TargetUse};
    use crate::ir::einsum::projections;
    use crate::ir::{Assignments, Bindings, Binop, Buffer, InitOp, Prec, Tnode};
    use crate::target::{Isa, VectorTarget};
    use crate::{Jit, JitConfig};

    /// Compiles, runs and checks row sums of squares with `cfg`.
    fn row_sums(cfg: &CompilerConfig) {
        let x = Tnode::with_init(&["x"], &[2, 3], Prec::Single, &InitOp::RangeOverOffsets).unwrap();
        let s = Tnode::hosted(&["s"], &[2], Prec::Single).unwrap();
        let none = Bindings::empty();
        let code = Assignments::AccumBinop {
            initialize_neutral: true,
            accum: Binop::Add,
            op: Binop::Mul,
            lhs: s.clone(),
            rhs1: Buffer::Node(x.clone()),
            rhs2: Buffer::Node(x.clone()),
            projections: projections("ij,ij->i", s.dims(), &[x.dims(), x.dims()], &none).unwrap(),
        };
        let jit = Jit::new(JitConfig {
            compiler: Some(cfg.clone()),
            synchronous: true,
            ..JitConfig::default()
        })
        .unwrap();
        let code = jit.compile("sum_of_squares", &none, &code).unwrap();
        let device = jit.device().unwrap();
        let ctx = jit.context(&device).unwrap();
        let routine = jit.link(&ctx, &code).unwrap();
        jit.upload(routine.context(), &x).unwrap();
        routine.schedule().unwrap();
        jit.download(routine.context(), &s).unwrap();
        assert_eq!(s.host_values(), Some(vec![5.0, 50.0]));
    }

    /// A guess the probe disproves makes the backend generate and compile again for the
    /// probed target: correct results, and only the probed target's object in the cache,
    /// which an ordinary compile then hits (the cache holds nothing more).
    #[test]
    fn a_disproved_guess_compiles_again_for_the_probed_target() {
        let cache = tempfile::tempdir().unwrap();
        let base = CompilerConfig::from_env().expect("a C compiler is needed for this test");
        let cfg = CompilerConfig {
            arch_flags: vec!["-march=native".into()],
            debug_dir: None,
            trace_dir: None,
            cache_dir: Some(cache.path().to_path_buf()),
            ..base
        };
        let objects = || {
            std::fs::read_dir(cache.path())
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .path()
                        .extension()
                        .is_some_and(|x| x == "so")
                })
                .count()
        };
        let wrong = TargetUse {
            vector: VectorTarget {
                isa: Isa::Generic,
                vector_bytes: 8,
                ..VectorTarget::default()
            },
            avx512fp16: false,
        };
        compile::force_guess(Some(wrong));
        row_sums(&cfg);
        compile::force_guess(None);
        assert_eq!(objects(), 1);
        row_sums(&cfg);
        assert_eq!(
            objects(),
            1,
            "the ordinary compile did not hit the stored object"
        );
    }
}
