//! Compiling, running and emitting a built program on the cc backend.

use crate::output::Printed;
use crate::program::build::{Built, PlanStep, ProgramError, MAX_EXECUTED_STEPS};
use crate::program::format::MergeDecl;
use crate::program::locate::json_path;
use crate::steps::{self, quote, Machine};
use arrayjit::backend::{
    backend_named, Backend, CcBackend, Config, Context, Device, MergeBuffer, MergeBufferUse,
    Routine,
};
use arrayjit::ir::Tnode;
use std::collections::HashSet;
use std::time::Instant;

/// The compiler backend of the CLI: reads of never-written tensors are warnings, printed on
/// stderr, not errors (strict reads are off).
fn cc() -> CcBackend {
    CcBackend::new().with_strict(false)
}

fn backend() -> CcBackend {
    let be = cc();
    be.initialize(Config::default());
    be
}

/// The compiler backend of a single-device run: its routines' parallel regions run on
/// `threads` threads (default: the machine's cores).
fn single_backend(threads: Option<usize>) -> CcBackend {
    let n = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let be = cc().with_threads(n);
    be.initialize(Config::default());
    be
}

/// Points a library error at the routine it names ([`arrayjit::Error::InRoutine`]); errors
/// naming several routines (a C compiler failure on a file holding them) are reported
/// without a place in the file, and errors naming none (a missing compiler) list every
/// routine.
fn attribute(built: &Built, err: arrayjit::Error, what: &str) -> ProgramError {
    if let arrayjit::Error::InRoutine { routine, source } = &err {
        if let Some(i) = built.routine_names.iter().position(|n| n == routine) {
            return ProgramError::at(json_path!["routines", i], format!("while {what}: {source}"));
        }
    }
    if matches!(err, arrayjit::Error::InRoutine { .. }) {
        return ProgramError::nowhere(format!("while {what}: {err}"));
    }
    let names: Vec<String> = built.routine_names.iter().map(|n| quote(n)).collect();
    ProgramError::nowhere(format!(
        "while {what} (routines {}): {err}",
        names.join(", ")
    ))
}

/// The C source of every routine as one batch, without running a compiler.
pub fn emit_c(built: &Built) -> Result<String, ProgramError> {
    let be = backend();
    be.generate_batch_source(
        Some(&built.routine_names),
        &built.bindings,
        &built.assignments,
    )
    .map_err(|e| attribute(built, e, "generating the C"))
}

fn set_bindings(r: &Routine, bindings: &[(String, i64)]) -> arrayjit::Result<()> {
    for (name, v) in bindings {
        r.bindings().set(name, *v)?;
    }
    Ok(())
}

/// The single device of the cc backend (everything synchronous).
struct Single<'a> {
    be: &'a CcBackend,
    ctx: &'a Context,
    routines: &'a [Routine],
    names: &'a [String],
}

impl Machine for Single<'_> {
    fn multi_device(&self) -> bool {
        false
    }
    fn routine_name(&self, routine: usize) -> &str {
        &self.names[routine]
    }
    fn run(&mut self, routine: usize, _: usize, bindings: &[(String, i64)]) -> Result<(), String> {
        let r = &self.routines[routine];
        set_bindings(r, bindings).map_err(|e| e.to_string())?;
        r.run().map_err(|e| e.to_string())
    }
    fn copy(
        &mut self,
        _: &(String, Tnode),
        _: usize,
        _: usize,
        _: MergeDecl,
    ) -> Result<(), String> {
        Err("copying between devices needs a multi-device program".into())
    }
    fn all_reduce(&mut self, _: &(String, Tnode), _: &[usize]) -> Result<(), String> {
        Err("all_reduce needs a multi-device program".into())
    }
    fn load_from_host(&mut self, tensor: &Tnode, _: usize) -> Result<(), String> {
        self.be
            .from_host(self.ctx, tensor)
            .map(drop)
            .map_err(|e| e.to_string())
    }
    fn store_to_host(&mut self, tensor: &Tnode, _: usize) -> Result<(), String> {
        self.be
            .to_host(self.ctx, tensor)
            .map(drop)
            .map_err(|e| e.to_string())
    }
    fn await_devices(&mut self, _: Option<usize>) -> Result<(), String> {
        Ok(())
    }
}

/// Runs the plan on the single device of the cc backend.
fn execute(
    be: &CcBackend,
    ctx: &Context,
    steps: &[PlanStep],
    routines: &[Routine],
    names: &[String],
) -> Result<(), ProgramError> {
    steps::execute(
        &mut Single {
            be,
            ctx,
            routines,
            names,
        },
        steps,
    )
}

/// The device backend of a multi-device program, created before the program runs (for
/// `"backend": "mpi"` this initializes MPI), so that after an error the caller can print it
/// and stop the whole MPI job ([`Job::abort`]).
pub struct Job {
    be: Option<Box<dyn Backend>>,
    /// `--threads`: threads per device (`None`: a single device uses every core, several
    /// share them out).
    threads: Option<usize>,
}

impl Job {
    /// The backend of `built` (none for a single-device program), running routines on
    /// `threads` threads per device.
    pub fn new(built: &Built, threads: Option<usize>) -> Result<Job, ProgramError> {
        if built.devices.is_none() {
            return Ok(Job { be: None, threads });
        }
        let cc = match threads {
            Some(n) => cc().with_threads(n),
            None => cc(),
        };
        let be = backend_named(&built.backend, cc)
            .map_err(|e| ProgramError::nowhere(format!("choosing the backend: {e}")))?;
        Ok(Job {
            be: Some(be),
            threads,
        })
    }

    /// Under MPI, checks that every rank runs the same program file (`text`).
    pub fn check_same_program(&self, text: &str) -> Result<(), ProgramError> {
        match &self.be {
            Some(be) => be
                .check_ranks_agree("the program file", text.as_bytes())
                .map_err(|e| ProgramError::nowhere(e.to_string())),
            None => Ok(()),
        }
    }

    /// No backend: a single-device program, or one the interpreter simulates.
    pub fn none() -> Job {
        Job {
            be: None,
            threads: None,
        }
    }

    /// This process's rank (0 but under MPI).
    pub fn rank(&self) -> usize {
        self.be.as_ref().map_or(0, |b| b.rank())
    }

    /// The number of ranks (1 but under MPI).
    pub fn ranks(&self) -> usize {
        self.be.as_ref().map_or(1, |b| b.num_ranks())
    }

    /// Stops every rank of the MPI job (does nothing on the in-process backends).
    pub fn abort(&self) {
        if let Some(be) = &self.be {
            be.abort_job(1);
        }
    }

    fn backend(&self) -> Result<&dyn Backend, ProgramError> {
        self.be
            .as_deref()
            .ok_or_else(|| ProgramError::nowhere("a multi-device run without a device backend"))
    }
}

/// A multi-device run: the backend, every device's context and routines, and what each
/// device's pending work reads from other devices (so that the CLI never lets a device
/// overwrite a buffer another device still reads).
struct Devices<'a> {
    be: &'a dyn Backend,
    devices: Vec<Device>,
    contexts: Vec<Context>,
    routines: Vec<Vec<Routine>>,
    names: &'a [String],
    /// `readers[s]`: devices with scheduled copies that read device `s`'s buffers.
    readers: Vec<HashSet<usize>>,
    /// `streams_from[d]`: the device whose buffer `d`'s merge buffer points at (Streaming).
    streams_from: Vec<Option<usize>>,
    /// Time spent compiling the routines, in milliseconds.
    compile_ms: f64,
}

impl Devices<'_> {
    /// The context of a routine on device `d` that reads `tn` from the merge buffer; if there
    /// is none, the context of one that reads another node (so that the library reports the
    /// mismatch), or `None` when no routine there reads the merge buffer.
    fn merge_reader_context(&self, d: usize, tn: &Tnode) -> Option<&Context> {
        let rs = &self.routines[d];
        rs.iter()
            .find(|r| r.merge_node() == Some(tn))
            .or_else(|| rs.iter().find(|r| r.merge_node().is_some()))
            .map(|r| r.context())
    }

    fn await_device(&mut self, d: usize) -> arrayjit::Result<()> {
        self.be.await_device(&self.devices[d])?;
        for r in &mut self.readers {
            r.remove(&d);
        }
        Ok(())
    }

    /// Before device `s` overwrites its buffers: wait for every device still reading them.
    fn before_write(&mut self, s: usize) -> arrayjit::Result<()> {
        let mut waiting: Vec<usize> = self.readers[s].iter().copied().collect();
        waiting.extend((0..self.devices.len()).filter(|&d| self.streams_from[d] == Some(s)));
        waiting.sort();
        waiting.dedup();
        for d in waiting {
            self.await_device(d)?;
        }
        Ok(())
    }
}

impl Machine for Devices<'_> {
    fn multi_device(&self) -> bool {
        true
    }
    fn routine_name(&self, routine: usize) -> &str {
        &self.names[routine]
    }
    fn run(
        &mut self,
        routine: usize,
        device: usize,
        bindings: &[(String, i64)],
    ) -> Result<(), String> {
        let go = |this: &mut Self| -> arrayjit::Result<()> {
            this.before_write(device)?;
            let r = this.routines[device][routine].clone();
            if r.merge_node().is_some() {
                if let Some(s) = this.streams_from[device] {
                    // The merge buffer is another device's buffer: let it settle.
                    this.await_device(s)?;
                }
            }
            set_bindings(&r, bindings)?;
            r.schedule()
        };
        go(self).map_err(|e| e.to_string())
    }
    fn copy(
        &mut self,
        tensor: &(String, Tnode),
        from: usize,
        to: usize,
        merge: MergeDecl,
    ) -> Result<(), String> {
        let mode = match merge {
            MergeDecl::No => MergeBufferUse::No,
            MergeDecl::Streaming => MergeBufferUse::Streaming,
            MergeDecl::Copy => MergeBufferUse::Copy,
        };
        // The source must be done computing; the destination's own buffer is written by the
        // copy.
        self.await_device(from).map_err(|e| e.to_string())?;
        if mode == MergeBufferUse::No {
            self.before_write(to).map_err(|e| e.to_string())?;
        }
        // Into a merge buffer, the destination is the context of the routine that reads the
        // tensor from it (the library checks that it expects it). When no routine on the
        // device reads anything from the merge buffer, the merge could never be observed, so
        // it is not made.
        let dst = match mode {
            MergeBufferUse::No => Some(&self.contexts[to]),
            _ => self.merge_reader_context(to, &tensor.1),
        };
        let copied = match dst {
            Some(dst) => self
                .be
                .device_to_device(&tensor.1, mode, dst, &self.contexts[from])
                .map_err(|e| e.to_string())?,
            None => self.contexts[from].contains(&tensor.1),
        };
        if !copied {
            return Err(format!(
                "tensor {} is not on device {to} (no routine there uses it)",
                quote(&tensor.0)
            ));
        }
        if mode == MergeBufferUse::Streaming {
            self.streams_from[to] = Some(from);
        } else {
            if mode == MergeBufferUse::Copy {
                self.streams_from[to] = None;
            }
            self.readers[from].insert(to);
        }
        Ok(())
    }
    fn load_from_host(&mut self, tensor: &Tnode, device: usize) -> Result<(), String> {
        self.before_write(device).map_err(|e| e.to_string())?;
        self.be
            .from_host(&self.contexts[device], tensor)
            .map(drop)
            .map_err(|e| e.to_string())
    }
    fn store_to_host(&mut self, tensor: &Tnode, device: usize) -> Result<(), String> {
        self.be
            .to_host(&self.contexts[device], tensor)
            .map_err(|e| e.to_string())?;
        self.await_device(device).map_err(|e| e.to_string())
    }
    fn await_devices(&mut self, device: Option<usize>) -> Result<(), String> {
        let all: Vec<usize> = match device {
            Some(d) => vec![d],
            None => (0..self.devices.len()).collect(),
        };
        for d in all {
            self.await_device(d).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
    fn all_reduce(&mut self, tensor: &(String, Tnode), devices: &[usize]) -> Result<(), String> {
        let go = |this: &mut Self| -> arrayjit::Result<()> {
            // The sum overwrites every listed device's buffer of the tensor.
            for &d in devices {
                this.before_write(d)?;
            }
            let ctxs: Vec<Context> = devices.iter().map(|&d| this.contexts[d].clone()).collect();
            this.be.all_reduce(std::slice::from_ref(&tensor.1), &ctxs)
        };
        go(self).map_err(|e| e.to_string())
    }
}

/// The printed tensors' host values, in print order.
pub(crate) fn collect_printed(built: &Built) -> Result<Vec<PrintedTensor>, ProgramError> {
    built
        .print
        .iter()
        .map(|(name, tn)| {
            let what = format!("the printed values of tensor {}", quote(name));
            let values = tn
                .with_host(|a| a.try_to_f64_vec(&what))
                .ok_or_else(|| {
                    ProgramError::nowhere(format!("tensor {} has no host array", quote(name)))
                })?
                .map_err(|e| ProgramError::nowhere(e.to_string()))?;
            // Integer cells exactly (an int64 above 2^53 keeps every digit).
            let ints: Vec<i128> = tn
                .with_host(|a| (0..a.len()).filter_map(|i| a.get_int(i)).collect())
                .unwrap_or_default();
            Ok((name.clone(), tn.dims().to_vec(), tn.prec(), values, ints))
        })
        .collect()
}

/// A multi-device run: every routine is linked on every device (device `i` on physical
/// device [`Backend::placement`]: a block of consecutive devices per core in process, and
/// per rank under MPI), hosted tensors are copied to every device first, the plan's steps are scheduled, and
/// at the end every device is awaited and hosted tensors are copied back from device 0.
fn run_devices(built: &Built, job: &Job, n: usize) -> Result<RunResult, ProgramError> {
    let mut run = prepare_devices(built, job.backend()?, n)?;
    let result = steps::execute(&mut run, &built.plan).and_then(|()| {
        for d in 0..n {
            run.await_device(d)
                .map_err(|e| ProgramError::nowhere(format!("device {d}: {e}")))?;
        }
        for (name, tn) in &built.tensors {
            if tn.is_hosted() {
                run.be.to_host(&run.contexts[0], tn).map_err(|e| {
                    ProgramError::nowhere(format!(
                        "copying tensor {} to the host: {e}",
                        quote(name)
                    ))
                })?;
            }
        }
        run.await_device(0)
            .map_err(|e| ProgramError::nowhere(format!("device 0: {e}")))
    });
    run.be.unsafe_cleanup();
    result?;
    Ok(RunResult {
        tensors: collect_printed(built)?,
    })
}

/// Creates the devices, compiles every routine once, links them on every device and copies
/// hosted tensors to every device.
fn prepare_devices<'a>(
    built: &'a Built,
    be: &'a dyn Backend,
    n: usize,
) -> Result<Devices<'a>, ProgramError> {
    let lib = |what: &'static str| {
        move |e: arrayjit::Error| ProgramError::nowhere(format!("{what}: {e}"))
    };
    be.initialize(Config::default());
    let mut devices = vec![];
    for i in 0..n {
        let p = be
            .get_device(be.placement(i, n))
            .map_err(lib("creating devices"))?;
        devices.push(be.new_virtual_device(&p).map_err(lib("creating devices"))?);
    }
    let mut contexts = vec![];
    let mut routines = vec![];
    let start = Instant::now();
    let batch = if built.assignments.is_empty() {
        None
    } else {
        Some(
            be.compile_batch(
                true,
                Some(&built.routine_names),
                None,
                &built.bindings,
                &built.assignments,
            )
            .map_err(|e| attribute(built, e, "compiling"))?,
        )
    };
    let compile_ms = start.elapsed().as_secs_f64() * 1e3;
    for d in &devices {
        let ctx = be.init(d).map_err(lib("initializing a device"))?;
        let (ctx, rs) = match &batch {
            None => (ctx, vec![]),
            Some(b) => {
                let (ctx, rs) = be
                    .link_batch(&[], &ctx, b)
                    .map_err(lib("linking the routines"))?;
                (ctx, rs.into_iter().flatten().collect())
            }
        };
        for (name, tn) in &built.tensors {
            if tn.is_hosted() {
                be.from_host(&ctx, tn).map_err(|e| {
                    ProgramError::nowhere(format!(
                        "copying tensor {} to the devices: {e}",
                        quote(name)
                    ))
                })?;
            }
        }
        contexts.push(ctx);
        routines.push(rs);
    }
    Ok(Devices {
        be,
        devices,
        contexts,
        routines,
        names: &built.routine_names,
        readers: vec![HashSet::new(); n],
        streams_from: vec![None; n],
        compile_ms,
    })
}

/// A printed tensor: name, dims, precision, values, and for integer precisions the exact
/// values (empty otherwise).
pub type PrintedTensor = (String, Vec<usize>, arrayjit::ir::Prec, Vec<f64>, Vec<i128>);

/// The values of the printed tensors after a run.
pub struct RunResult {
    /// (name, dims, precision, values) per printed tensor, in print order.
    pub tensors: Vec<PrintedTensor>,
}

impl RunResult {
    /// Views for the printers.
    pub fn printed(&self) -> Vec<Printed<'_>> {
        self.tensors
            .iter()
            .map(|(name, dims, prec, values, ints)| Printed {
                name,
                dims,
                prec: *prec,
                values,
                ints,
            })
            .collect()
    }
}

/// Compiles all routines as one batch, links them into one context, copies hosted tensors to
/// the device, runs the plan, copies hosted tensors back and collects the printed tensors.
///
/// A printed tensor that does not live in the context (no routine materializes it, e.g. it is
/// used by no routine, or only read where the backend reads host data directly) prints its
/// host values, i.e. its init.
pub fn run(built: &Built, job: &Job) -> Result<RunResult, ProgramError> {
    if let Some(n) = built.devices {
        return run_devices(built, job, n);
    }
    let (be, ctx, routines, _) = prepare_single(built, job.threads)?;
    execute(&be, &ctx, &built.plan, &routines, &built.routine_names)?;
    for (name, tn) in &built.tensors {
        if tn.is_hosted() {
            be.to_host(&ctx, tn).map_err(|e| {
                ProgramError::nowhere(format!("copying tensor {} to the host: {e}", quote(name)))
            })?;
        }
    }
    let tensors = collect_printed(built)?;
    Ok(RunResult { tensors })
}

/// Compiles and links every routine on the cc backend and copies hosted tensors to the
/// device; returns the backend, the context, the routines and the compile time in ms.
fn prepare_single(
    built: &Built,
    threads: Option<usize>,
) -> Result<(CcBackend, Context, Vec<Routine>, f64), ProgramError> {
    let be = single_backend(threads);
    let lib = |what: &'static str| {
        move |e: arrayjit::Error| ProgramError::nowhere(format!("{what}: {e}"))
    };
    let mut routines = vec![];
    let ctx = be
        .init("arrayjit")
        .map_err(lib("initializing the backend"))?;
    let start = Instant::now();
    let mut compile_ms = 0.0;
    let ctx = if built.assignments.is_empty() {
        ctx
    } else {
        let batch = be
            .compile_batch(
                true,
                Some(&built.routine_names),
                None,
                &built.bindings,
                &built.assignments,
            )
            .map_err(|e| attribute(built, e, "compiling"))?;
        compile_ms = start.elapsed().as_secs_f64() * 1e3;
        let (ctx, linked) = be
            .link_batch(&[], &MergeBuffer::new(), &ctx, &batch)
            .map_err(lib("linking the routines"))?;
        for (name, r) in built.routine_names.iter().zip(linked) {
            routines.push(r.ok_or_else(|| {
                ProgramError::nowhere(format!("routine {} was not linked", quote(name)))
            })?);
        }
        ctx
    };
    for (name, tn) in &built.tensors {
        if tn.is_hosted() {
            be.from_host(&ctx, tn).map_err(|e| {
                ProgramError::nowhere(format!("copying tensor {} to the device: {e}", quote(name)))
            })?;
        }
    }
    Ok((be, ctx, routines, compile_ms))
}

/// Timings of `arrayjit bench`.
#[derive(Clone, Debug)]
pub struct BenchResult {
    /// Compiling and linking every routine, in milliseconds.
    pub compile_ms: f64,
    /// The time of each timed execution of the run steps, in milliseconds.
    pub run_ms: Vec<f64>,
    /// The CPU time the calling thread spent in each timed execution, in milliseconds (only
    /// for single-device programs, whose routines run on that thread): unlike wall-clock
    /// time it does not count time spent descheduled, so it is steadier on a busy machine.
    pub cpu_ms: Vec<f64>,
}

/// Median, min and max of some timings (zeros when there are none).
fn stats(v: &[f64]) -> (f64, f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let median = if v.is_empty() {
        0.0
    } else if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    let min = v.first().copied().unwrap_or(0.0);
    let max = v.last().copied().unwrap_or(0.0);
    (median, min, max)
}

/// The CPU time the calling thread has used so far, in milliseconds.
fn thread_cpu_ms() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID is supported on
    // every platform the crate builds for (Linux, macOS); on failure `ts` stays zero.
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
    }
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 * 1e-6
}

impl BenchResult {
    /// One JSON object: `{"compile_ms", "runs", "run_ms": {"median", "min", "max"}}`, plus
    /// `"cpu_ms": {"median", "min", "max"}` for single-device programs.
    pub fn to_json(&self) -> String {
        let (median, min, max) = stats(&self.run_ms);
        let cpu = if self.cpu_ms.is_empty() {
            String::new()
        } else {
            let (median, min, max) = stats(&self.cpu_ms);
            format!(
                ", \"cpu_ms\": {{\"median\": {median:.6}, \"min\": {min:.6}, \"max\": {max:.6}}}"
            )
        };
        format!(
            "{{\"compile_ms\": {:.3}, \"runs\": {}, \"run_ms\": {{\"median\": {median:.6}, \"min\": {min:.6}, \"max\": {max:.6}}}{cpu}}}\n",
            self.compile_ms,
            self.run_ms.len()
        )
    }
}

/// Compiles the program once, copies hosted tensors to the device(s), then executes its run
/// steps `warmup` times untimed and `runs` times timed (each timing covers the steps and, on
/// several devices, awaiting them; not compilation or the initial host copies).
///
/// All executions together may execute at most [`MAX_EXECUTED_STEPS`] run steps; more is an
/// error naming `--runs` (checked before anything is compiled).
pub fn bench(
    built: &Built,
    job: &Job,
    warmup: usize,
    runs: usize,
) -> Result<BenchResult, ProgramError> {
    let rounds = warmup.checked_add(runs).ok_or_else(|| {
        ProgramError::nowhere(format!("--warmup {warmup} plus --runs {runs} overflows"))
    })?;
    let total = (rounds as u64).checked_mul(built.executed_steps);
    if total.is_none_or(|t| t > MAX_EXECUTED_STEPS) {
        return Err(ProgramError::nowhere(format!(
            "--runs {runs} with --warmup {warmup}: {rounds} executions of the run steps \
             ({} steps each) execute more than {MAX_EXECUTED_STEPS} steps, the limit",
            built.executed_steps
        )));
    }
    let mut run_ms: Vec<f64> = Vec::new();
    if run_ms.try_reserve_exact(runs).is_err() {
        return Err(ProgramError::nowhere(
            arrayjit::Error::OutOfMemory {
                what: format!("the timings of --runs {runs}"),
                bytes: runs.saturating_mul(8),
            }
            .to_string(),
        ));
    }
    if let Some(n) = built.devices {
        let mut devices = prepare_devices(built, job.backend()?, n)?;
        let compile_ms = devices.compile_ms;
        let result = (|| {
            for i in 0..rounds {
                let t = Instant::now();
                steps::execute(&mut devices, &built.plan)?;
                for d in 0..n {
                    devices
                        .await_device(d)
                        .map_err(|e| ProgramError::nowhere(format!("device {d}: {e}")))?;
                }
                if i >= warmup {
                    run_ms.push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
            Ok(())
        })();
        devices.be.unsafe_cleanup();
        result?;
        return Ok(BenchResult {
            compile_ms,
            run_ms,
            cpu_ms: vec![],
        });
    }
    let mut cpu_ms: Vec<f64> = Vec::new();
    if cpu_ms.try_reserve_exact(runs).is_err() {
        return Err(ProgramError::nowhere(
            arrayjit::Error::OutOfMemory {
                what: format!("the timings of --runs {runs}"),
                bytes: runs.saturating_mul(8),
            }
            .to_string(),
        ));
    }
    let (be, ctx, routines, compile_ms) = prepare_single(built, job.threads)?;
    for i in 0..rounds {
        let (t, c) = (Instant::now(), thread_cpu_ms());
        execute(&be, &ctx, &built.plan, &routines, &built.routine_names)?;
        if i >= warmup {
            run_ms.push(t.elapsed().as_secs_f64() * 1e3);
            cpu_ms.push(thread_cpu_ms() - c);
        }
    }
    Ok(BenchResult {
        compile_ms,
        run_ms,
        cpu_ms,
    })
}
