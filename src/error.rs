//! The library's error type.

use std::path::PathBuf;

/// Everything that can go wrong in arrayjit, with enough context to find the cause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A host array could not be created or filled.
    #[error("host array: {0}")]
    Ndarray(String),
    /// An einsum-style spec or a projection is malformed.
    #[error("bad spec {spec:?}: {msg}")]
    Spec {
        /// The spec as written.
        spec: String,
        /// What is wrong with it.
        msg: String,
    },
    /// An entry of an einsum-style spec term is malformed (e.g. an affine entry such as
    /// `(2*h+i-1)` with an unexpected character).
    #[error("bad spec {spec:?}: in term '{term}', at position {pos}: {msg}")]
    SpecEntry {
        /// The spec as written.
        spec: String,
        /// The term (operand) holding the entry, as written.
        term: String,
        /// The position (in characters from 0) of the offending character in the spec.
        pos: usize,
        /// What is wrong, naming the character.
        msg: String,
    },
    /// Two memory-mode decisions for a node contradict each other.
    #[error("memory mode conflict for tensor {node}: {msg}")]
    MemoryMode {
        /// The node's display name.
        node: String,
        /// The modes and provenances involved.
        msg: String,
    },
    /// An assignment is ill-formed (shapes, operands, merge buffer use).
    #[error("invalid assignment: {0}")]
    Assignment(String),
    /// The C compiler could not be found or started.
    #[error("C compiler not found: {0}")]
    CompilerNotFound(String),
    /// The C compiler rejected the generated code (or crashed).
    #[error("C compilation failed (command: {command}; source kept at {}):\n{output}", source_path.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "<not kept: set ARRAYJIT_DEBUG_DIR>".into()))]
    Compile {
        /// The full command line.
        command: String,
        /// The compiler's standard output and error.
        output: String,
        /// Where the source was kept, if it was.
        source_path: Option<PathBuf>,
    },
    /// The compiler did not finish within `ARRAYJIT_COMPILE_TIMEOUT`.
    #[error("C compilation timed out after {seconds}s (command: {command})")]
    CompileTimeout {
        /// The full command line.
        command: String,
        /// The timeout that expired.
        seconds: u64,
    },
    /// Asking the compiler what it makes of the architecture flags (its predefined macros,
    /// see `compile::Target::resolve`) failed.
    #[error("probing the C compiler's target failed (command: {command}):\n{output}")]
    TargetProbe {
        /// The probe's command line.
        command: String,
        /// The compiler's output (its tail, if it was long).
        output: String,
    },
    /// An environment variable holds a value arrayjit cannot use.
    #[error("environment variable {var}={value:?}: expected {expected}")]
    Config {
        /// The variable's name.
        var: String,
        /// Its value (non-UTF-8 bytes replaced).
        value: String,
        /// What the variable must hold.
        expected: String,
    },
    /// The compiler flags ask for a sanitizer (`-fsanitize=address`...) whose runtime is not
    /// loaded in this process, so a library compiled with them cannot be loaded (GCC's
    /// AddressSanitizer runtime would end the process). See "Sanitizers" in
    /// `docs/configuration.md`.
    #[error(
        "the compiler flags ask for {sanitizers}, but the sanitizer runtime is not loaded in \
         this process, so a library compiled with these flags cannot be loaded; run the \
         program with the runtime preloaded: {fix} <program> (see \"Sanitizers\" in \
         arrayjit's docs/configuration.md)"
    )]
    Sanitizer {
        /// The sanitizers whose runtimes are missing, with their flags.
        sanitizers: String,
        /// The environment to run the program with (`LD_PRELOAD=...`).
        fix: String,
    },
    /// A compiled library could not be loaded.
    #[error("loading compiled library {path}: {msg}")]
    Load {
        /// The library's path.
        path: PathBuf,
        /// The loader's message.
        msg: String,
    },
    /// A file or directory arrayjit would read, load or write through is not safe to use:
    /// another user owns it or could have written it (group or others may write it), or it
    /// is not the kind of file expected (a symbolic link, a FIFO, a device), or it is too
    /// large. The compile cache and the debug directory check their files this way (see "Trust"
    /// in `docs/configuration.md`).
    #[error("refusing {path}: {msg}")]
    UnsafeFile {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong with it (owner, mode, file type or size).
        msg: String,
    },
    /// A file-system operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The index tensor of a gather or scatter-add (SPEC section 9.4) does not have an
    /// integer precision.
    #[error("{statement} into {target}: index tensor {index} has precision {prec}, but an index needs an integer precision")]
    IndexPrecision {
        /// `gather` or `scatter_add`.
        statement: &'static str,
        /// The tensor written.
        target: String,
        /// The index tensor.
        index: String,
        /// Its precision.
        prec: String,
    },
    /// The dims of a gather or scatter-add (SPEC section 9.4) do not fit together.
    #[error("{statement} into {target}: {msg}")]
    GatherShape {
        /// `gather` or `scatter_add`.
        statement: &'static str,
        /// The tensor written.
        target: String,
        /// Which tensors and dims disagree.
        msg: String,
    },
    /// A routine, context or buffer was used incorrectly.
    #[error("{0}")]
    Usage(String),
    /// A tensor that needs a host array has none (build it with [`crate::ir::Tnode::hosted`]
    /// or [`crate::ir::Tnode::with_init`]).
    #[error("{what}tensor {tensor} is not hosted (it has no host array: build it with Tnode::hosted or Tnode::with_init)")]
    NotHosted {
        /// What needed it, followed by `": "`, or empty.
        what: String,
        /// The tensor's name.
        tensor: String,
    },
    /// A tensor is not in the context an operation needs it in.
    #[error("{what}: tensor {tensor} is not in context {context}{hint}")]
    NotInContext {
        /// What needed it.
        what: String,
        /// The tensor's name.
        tensor: String,
        /// The context's label.
        context: String,
        /// Why it may be missing (a sentence starting with `" ("` or `", "`), or empty.
        hint: String,
    },
    /// A context that belongs to no device (it comes from the no-device backend) was given
    /// where a device's context is needed.
    #[error(
        "{what}context {context} does not belong to a device (it comes from the no-device backend)"
    )]
    NoDevice {
        /// What needed it, followed by `": "`, or empty.
        what: String,
        /// The context's label.
        context: String,
    },
    /// A device ordinal beyond the backend's physical devices.
    #[error("backend {backend} has {count} physical devices; there is no device {ordinal}")]
    NoSuchDevice {
        /// The backend's name.
        backend: String,
        /// The ordinal asked for.
        ordinal: usize,
        /// How many physical devices it has.
        count: usize,
    },
    /// A backend name that is not one of `multicore`, `sync`, `mpi`.
    #[error("unknown backend {name:?}: expected multicore, sync or mpi")]
    UnknownBackend {
        /// The name given.
        name: String,
    },
    /// Dims a tensor cannot have.
    #[error("tensor {tensor}: dims {dims:?} {problem}")]
    Dims {
        /// The tensor's name.
        tensor: String,
        /// The dims given.
        dims: Vec<usize>,
        /// What is wrong with them.
        problem: String,
    },
    /// A wrong number of values, names or parts.
    #[error("{what}: {expected} expected, {got} given")]
    Count {
        /// What was counted.
        what: String,
        /// How many were expected.
        expected: usize,
        /// How many were given.
        got: usize,
    },
    /// A static index that the bindings do not hold.
    #[error("static index {name:?} is not bound here (the bindings hold {known})")]
    UnknownStaticIndex {
        /// The name asked for.
        name: String,
        /// The names the bindings hold, comma-separated.
        known: String,
    },
    /// The reference interpreter met code it cannot run (an index out of bounds or of no
    /// loop, a value read before it is set, a function it does not have).
    #[error("routine {routine}: {msg}")]
    Interpreter {
        /// The routine's name.
        routine: String,
        /// What went wrong.
        msg: String,
    },
    /// A routine read tensors that nothing has written in its context (no routine, and no
    /// copy from the host or another device): they would read as zeros. An error with strict
    /// reads ([`crate::backend::CcBackend::with_strict`], on by default in debug builds),
    /// else a warning ([`crate::backend::Routine::warnings`]).
    #[error("routine {routine} reads {tensors} that nothing has written in its context (all zeros): run the routine computing them first, or copy them from the host")]
    UnwrittenRead {
        /// The routine's name.
        routine: String,
        /// The tensors' names, comma-separated.
        tensors: String,
    },
    /// Generated code returned a failure status.
    #[error("routine {routine}: part {part} of its code failed (status {status})")]
    RoutineFailed {
        /// The routine's name.
        routine: String,
        /// Which part (from 1).
        part: usize,
        /// The status it returned.
        status: i32,
    },
    /// A debug file name that is reserved or given twice.
    #[error("debug file name {name:?} {problem}")]
    DebugFileName {
        /// The name.
        name: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A static index was bound to a value outside its range.
    #[error("routine {routine}: static index {index} = {value} is out of range 0..{limit}")]
    BindingOutOfRange {
        /// The routine's name.
        routine: String,
        /// The static index's name.
        index: String,
        /// The value it was given.
        value: i64,
        /// The exclusive upper bound.
        limit: usize,
    },
    /// Bounds-checked code (`ARRAYJIT_CHECKED`, [`CompilerConfig::checked`]) found an access
    /// outside a tensor: the routine stopped before it, without reading or writing anything
    /// more. For a vector access, the indices are those of its first element outside the
    /// tensor. (Only the first 16 axes are reported.)
    ///
    /// [`CompilerConfig::checked`]: crate::compile::CompilerConfig::checked
    #[error(
        "routine {routine}: index out of bounds: tensor {tensor} accessed at [{}] but its extents are [{}]",
        join(indices), join(extents)
    )]
    IndexOutOfBounds {
        /// The routine's name.
        routine: String,
        /// The tensor's name.
        tensor: String,
        /// The index value on every axis.
        indices: Vec<i64>,
        /// The extent of every axis.
        extents: Vec<usize>,
    },
    /// An error while optimizing, compiling or linking a routine, naming it (several names,
    /// comma-separated, when the C compiler failed on a file holding several routines).
    #[error("routine {routine}: {source}")]
    InRoutine {
        /// The routine's name (or names).
        routine: String,
        /// What went wrong.
        #[source]
        source: Box<Error>,
    },
    /// An optimizer pass produced loop IR that breaks its invariants (a bug in arrayjit;
    /// checked between passes in debug builds).
    #[error("internal error: after optimizer pass {pass}, routine {routine}: {msg}")]
    Verifier {
        /// The routine.
        routine: String,
        /// The pass after which the check failed.
        pass: &'static str,
        /// The violated invariant.
        msg: String,
    },
    /// A task scheduled on a device failed (returned an error or panicked).
    #[error("task {task:?} failed: {msg}")]
    Task {
        /// The task's description (e.g. `routine forward on multicore:0:1`).
        task: String,
        /// What went wrong.
        msg: String,
    },
    /// Memory for a host array, a device buffer, interpreter values or other data sized by
    /// the user could not be allocated (or its size does not fit in memory at all).
    #[error("out of memory: cannot allocate {bytes} bytes for {what}")]
    OutOfMemory {
        /// What the memory was for (e.g. `host array of tensor x`).
        what: String,
        /// How many bytes were requested (`usize::MAX` when the size itself overflows).
        bytes: usize,
    },
    /// A backend was used before `initialize` (or after `unsafe_cleanup`).
    #[error("backend {backend} is not initialized: call initialize first")]
    NotInitialized {
        /// The backend's name.
        backend: String,
    },
    /// A device (or its queue) released by `unsafe_cleanup` was used.
    #[error("device {device} was released by unsafe_cleanup")]
    Released {
        /// The device (or queue) name.
        device: String,
    },
    /// A copy between a buffer and host memory (or another buffer) of the wrong size.
    #[error("{what}: {bytes} bytes do not fit a buffer of {size} bytes")]
    BufferSize {
        /// The operation.
        what: &'static str,
        /// How many bytes were to be copied.
        bytes: usize,
        /// The size of the buffer that is too small.
        size: usize,
    },
    /// A precision name that is not one of the known ones.
    #[error("unknown precision {name:?} (known: {known})")]
    UnknownPrecision {
        /// The name as written.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// An operation name that is not one of the known ones.
    #[error("unknown operation {name:?} (known: {known})")]
    UnknownOp {
        /// The name as written.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// A bitwise or shift operation on a floating result or argument (SPEC 9.2: integer
    /// precisions only).
    #[error("operation {op} needs integer precisions, but tensor {tensor} is {prec}")]
    IntegerOnlyOp {
        /// The operation.
        op: String,
        /// The floating tensor.
        tensor: String,
        /// Its precision.
        prec: String,
    },
    /// Typed access to a host array of another precision.
    #[error("host array of precision {actual} accessed as {expected}")]
    PrecisionMismatch {
        /// The precision the access asked for.
        expected: String,
        /// The array's precision.
        actual: String,
    },
    /// A bug in arrayjit: an invariant did not hold. Please report it.
    #[error("internal error: {0}")]
    Internal(String),
    /// A context (or one it descends from) was finalized and then used.
    #[error("context {context} was finalized")]
    ContextFinalized {
        /// The finalized context's label and id.
        context: String,
    },
    /// `device_to_device` into a merge buffer for a node the destination context's routine
    /// does not read from it.
    #[error("device_to_device into context {context}: merge node mismatch, expected {}, actual tensor {actual}", expected.as_ref().map_or("none (its routine reads no merge buffer)".to_string(), |e| format!("tensor {e}")))]
    MergeNodeMismatch {
        /// The destination context.
        context: String,
        /// The node its routine reads from the merge buffer (none if it reads none).
        expected: Option<String>,
        /// The node being merged.
        actual: String,
    },
    /// A routine expected one node in the merge buffer but found another (or none).
    #[error(
        "routine {routine} expects tensor {expected} in the merge buffer, but it holds {found}"
    )]
    MergeBufferMismatch {
        /// The routine's name.
        routine: String,
        /// The node the routine reads.
        expected: String,
        /// What the merge buffer holds.
        found: String,
    },
    /// The `mpi` backend was asked for, but this build of arrayjit has no MPI support.
    #[error(
        "backend mpi: this binary was built without feature `mpi` (rebuild with \
         `cargo build --release --features mpi`, which needs an MPI installation such as \
         OpenMPI and libclang)"
    )]
    MpiNotBuilt,
    /// MPI failed on a rank, or was set up or used in a way it cannot work (e.g. an MPI
    /// library without the thread support the backend needs).
    #[error("MPI rank {rank}: {msg}")]
    Mpi {
        /// The rank (in `MPI_COMM_WORLD`) where it happened.
        rank: usize,
        /// What went wrong.
        msg: String,
    },
    /// The ranks of an SPMD job disagree where they must agree: they compiled different
    /// routines, or run different programs.
    #[error("MPI ranks differ in {what}: {detail}")]
    RankMismatch {
        /// What was compared (e.g. `the compiled batch (hash of its C source)`).
        what: String,
        /// Which ranks differ from which.
        detail: String,
    },
    /// An all-reduce was asked for with contexts that cannot take part in it.
    #[error("all_reduce of tensor {tensor}: {msg}")]
    AllReduce {
        /// The tensor reduced.
        tensor: String,
        /// What is wrong (naming the context or device).
        msg: String,
    },
    /// Something a model, a job or a fusion buffer needs was not given (e.g. a
    /// [`crate::parallel::Model`] without parameters).
    #[error("no {what}: {hint}")]
    Missing {
        /// What is missing (e.g. `parameters`).
        what: String,
        /// How to give it.
        hint: String,
    },
    /// A value outside what it may be: a setting of a training job (a batch of 0, devices
    /// that do not fit), a range, a size.
    #[error("{what} = {value}: expected {expected}")]
    Invalid {
        /// What was given (e.g. `Settings::batch`).
        what: String,
        /// The value given.
        value: String,
        /// What it must be.
        expected: String,
    },
    /// A gradient tensor whose dims differ from those of its parameter.
    #[error(
        "gradient {grad} has dims {grad_dims:?}, but its parameter {param} has dims {param_dims:?}"
    )]
    GradientDims {
        /// The parameter's name.
        param: String,
        /// Its dims.
        param_dims: Vec<usize>,
        /// The gradient's name.
        grad: String,
        /// Its dims.
        grad_dims: Vec<usize>,
    },
    /// Tensors that must share one precision (the parts of a fusion buffer: parameters,
    /// gradients and the loss of a model) do not.
    #[error("{what}: tensor {tensor} is {prec}, but {expected} is expected")]
    MixedPrecision {
        /// What the tensors form together.
        what: String,
        /// The tensor of another precision.
        tensor: String,
        /// Its precision.
        prec: String,
        /// The precision of the others.
        expected: String,
    },
    /// A batch that does not split evenly into the parts of a data-parallel step.
    #[error("a batch of {batch} samples cannot be split evenly into {parts} {into}")]
    BatchSplit {
        /// The batch size.
        batch: usize,
        /// The number of parts.
        parts: usize,
        /// What the parts are (`device slices`, `shards`).
        into: String,
    },
    /// A number of devices that cannot be spread evenly over the MPI ranks.
    #[error("{devices} devices cannot be spread evenly over {ranks} ranks (the number of devices is the total over all ranks)")]
    DeviceSpread {
        /// The number of devices (over all ranks).
        devices: usize,
        /// The number of ranks.
        ranks: usize,
    },
    /// A schedule of data-parallel training asked for where it cannot run.
    #[error("schedule {schedule} cannot run here: {reason}")]
    ScheduleUnavailable {
        /// The schedule asked for.
        schedule: String,
        /// Why not.
        reason: String,
    },
    /// An error in one part of a job (a transfer or routine of a training step), naming it.
    #[error("{job}: {source}")]
    InJob {
        /// The part of the job (e.g. `merge the gradients of multicore:1:0 into multicore:0:0`).
        job: String,
        /// What went wrong.
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// Wraps an error as coming from a routine (an error already naming one stays as is).
    pub fn in_routine(routine: &str, e: Error) -> Error {
        match e {
            e @ (Error::InRoutine { .. }
            | Error::BindingOutOfRange { .. }
            | Error::IndexOutOfBounds { .. }
            | Error::MergeBufferMismatch { .. }) => e,
            e => Error::InRoutine {
                routine: routine.to_string(),
                source: Box::new(e),
            },
        }
    }

    /// The error under any [`Error::InRoutine`] or [`Error::InJob`] wrapping.
    pub fn root(&self) -> &Error {
        match self {
            Error::InRoutine { source, .. } | Error::InJob { source, .. } => source.root(),
            e => e,
        }
    }

    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

/// The values separated by `, `.
fn join<T: std::fmt::Display>(values: &[T]) -> String {
    values
        .iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Shorthand for results with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
