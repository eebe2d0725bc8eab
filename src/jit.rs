//! The Rust-native entry point: one configured [`Jit`] value compiles code, gives devices
//! and their contexts, links code into routines and moves data, and cleans everything up
//! when dropped.
//!
//! ```
//! use arrayjit::ir::einsum::projections;
//! use arrayjit::ir::{Assignments, Bindings, Binop, Buffer, InitOp, Prec, Tnode};
//! use arrayjit::{Jit, JitConfig};
//!
//! # fn main() -> arrayjit::Result<()> {
//! let x = Tnode::with_init(&["x"], &[2, 3], Prec::Single, &InitOp::RangeOverOffsets)?;
//! let s = Tnode::hosted(&["s"], &[2], Prec::Single)?;
//! let none = Bindings::empty();
//! let row_sums = Assignments::AccumBinop {
//!     initialize_neutral: true,
//!     accum: Binop::Add,
//!     op: Binop::Mul,
//!     lhs: s.clone(),
//!     rhs1: Buffer::Node(x.clone()),
//!     rhs2: Buffer::Node(x.clone()),
//!     projections: projections("ij,ij->i", s.dims(), &[x.dims(), x.dims()], &none)?,
//! };
//! let jit = Jit::new(JitConfig::default())?;
//! let code = jit.compile("sum_of_squares", &none, &row_sums)?;
//! let device = jit.device()?;
//! let ctx = jit.context(&device)?;
//! let routine = jit.link(&ctx, &code)?;
//! jit.upload(routine.context(), &x)?;
//! routine.schedule()?;
//! jit.download(routine.context(), &s)?;
//! assert_eq!(s.host_values(), Some(vec![0. + 1. + 4., 9. + 16. + 25.]));
//! # Ok(())
//! # }
//! ```
//!
//! The seed's operations (OCANNL's `Backend` signature, by the same names) stay available
//! on [`Jit::backend`] and on the backends themselves ([`crate::backend`]).

use crate::backend::{
    Backend, CcBackend, Code, CodeBatch, Config, Context, Device, MulticoreBackend, Routine,
    SyncBackend,
};
pub use crate::compile::CompilerConfig;
use crate::error::{Error, Result};
use crate::ir::{Assignments, Bindings, Tnode};
use crate::optimize::Settings;
pub use crate::optimize::Settings as OptimizerSettings;

/// Everything configurable about a [`Jit`]: a plain value, built from
/// [`JitConfig::default`] or [`JitConfig::from_env`] and the setters below (one per field,
/// by the field's name), for example
/// `JitConfig::default().synchronous(true).checked(true)`.
///
/// ```
/// use arrayjit::optimize::Settings;
/// use arrayjit::JitConfig;
///
/// let config = JitConfig::default()
///     .optimizer(Settings::default().loop_opts(false))
///     .synchronous(true)
///     .checked(true);
/// assert!(config.synchronous && config.checked && !config.optimizer.loop_opts);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct JitConfig {
    /// The C compiler, its flags, the compile cache and the number of compile jobs; `None`:
    /// read from the environment at every compile (the variables documented in `docs/configuration.md`).
    pub compiler: Option<CompilerConfig>,
    /// The optimizer's knobs.
    pub optimizer: Settings,
    /// How many virtual devices [`Jit::suggested_devices`] suggests.
    pub devices: Config,
    /// Run every task on the calling thread (the sync backend, for debugging) instead of on
    /// a worker per device.
    pub synchronous: bool,
    /// Bounds-checked code: every array access checks its indices first, and an access out
    /// of bounds is [`Error::IndexOutOfBounds`] instead of a crash (see
    /// [`CompilerConfig::checked`]; either setting turns it on; `ARRAYJIT_CHECKED=1` sets
    /// the compiler configuration's).
    pub checked: bool,
    /// Threads per device for the parallel regions of routines (see
    /// [`MulticoreBackend`]): `None` (the default) uses the machine's cores, shared out
    /// among the devices in use (one device gets them all; data-parallel devices get
    /// disjoint shares); `Some(n)`: `n` threads per device, and `cores / n` physical devices.
    /// With `synchronous`, `None` means one thread. Results are the same bits for any number
    /// of threads.
    pub threads: Option<usize>,
    /// Strict reads: a routine run that reads a tensor nothing has written in its context
    /// (no routine, no upload, no copy) is [`Error::UnwrittenRead`] instead of silently reading
    /// zeros (see [`CcBackend::with_strict`]). Default: on in debug builds
    /// (`cfg!(debug_assertions)`), off in release builds, where it is a warning
    /// ([`Routine::warnings`]).
    pub strict: bool,
}

// `strict` follows `debug_assertions`: in release builds every field is its type's default,
// and clippy would have the impl derived, which would lose that.
#[allow(clippy::derivable_impls)]
impl Default for JitConfig {
    fn default() -> Self {
        JitConfig {
            compiler: None,
            optimizer: Settings::default(),
            devices: Config::default(),
            synchronous: false,
            checked: false,
            threads: None,
            strict: cfg!(debug_assertions),
        }
    }
}

impl JitConfig {
    /// The compiler configuration read once from the environment now, default otherwise.
    pub fn from_env() -> Result<JitConfig> {
        let compiler = CompilerConfig::from_env()?;
        Ok(JitConfig {
            checked: compiler.checked,
            compiler: Some(compiler),
            ..JitConfig::default()
        })
    }

    /// Sets [`compiler`](JitConfig::compiler).
    pub fn compiler(mut self, compiler: Option<CompilerConfig>) -> JitConfig {
        self.compiler = compiler;
        self
    }

    /// Sets [`optimizer`](JitConfig::optimizer).
    pub fn optimizer(mut self, optimizer: Settings) -> JitConfig {
        self.optimizer = optimizer;
        self
    }

    /// Sets [`devices`](JitConfig::devices).
    pub fn devices(mut self, devices: Config) -> JitConfig {
        self.devices = devices;
        self
    }

    /// Sets [`synchronous`](JitConfig::synchronous).
    pub fn synchronous(mut self, synchronous: bool) -> JitConfig {
        self.synchronous = synchronous;
        self
    }

    /// Sets [`checked`](JitConfig::checked).
    pub fn checked(mut self, checked: bool) -> JitConfig {
        self.checked = checked;
        self
    }

    /// Sets [`strict`](JitConfig::strict).
    pub fn strict(mut self, strict: bool) -> JitConfig {
        self.strict = strict;
        self
    }

    /// Sets [`threads`](JitConfig::threads).
    pub fn threads(mut self, threads: Option<usize>) -> JitConfig {
        self.threads = threads;
        self
    }
}

/// A configured just-in-time compiler and its devices. Dropping it stops and joins every
/// device worker.
pub struct Jit {
    backend: Box<dyn Backend>,
}

impl Jit {
    /// A JIT with the given configuration.
    pub fn new(config: JitConfig) -> Result<Jit> {
        let cc = match config.compiler {
            Some(c) => CcBackend::with_config(c, config.optimizer),
            None => CcBackend::with_settings(config.optimizer),
        }
        .with_checked(config.checked)
        .with_strict(config.strict);
        let cc = match config.threads {
            Some(n) => cc.with_threads(n),
            None => cc,
        };
        let backend: Box<dyn Backend> = if config.synchronous {
            Box::new(SyncBackend::with_cc(cc))
        } else {
            Box::new(MulticoreBackend::with_cc(cc))
        };
        backend.initialize(config.devices);
        Ok(Jit { backend })
    }

    /// A JIT configured from the environment ([`JitConfig::from_env`]).
    pub fn from_env() -> Result<Jit> {
        Jit::new(JitConfig::from_env()?)
    }

    /// The seed-named operations (`compile`, `link`, `device_to_device`, ...) of the backend
    /// underneath.
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// Compiles a routine now (it can then be linked into any context).
    pub fn compile(&self, name: &str, bindings: &Bindings, code: &Assignments) -> Result<Code> {
        self.backend.compile(true, Some(name), bindings, code)
    }

    /// Compiles several routines with few compiler runs.
    pub fn compile_batch(
        &self,
        names: &[&str],
        bindings: &Bindings,
        code: &[Assignments],
    ) -> Result<CodeBatch> {
        if names.len() != code.len() {
            return Err(Error::Count {
                what: format!("compile_batch: names for {} routines", code.len()),
                expected: code.len(),
                got: names.len(),
            });
        }
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        self.backend
            .compile_batch(true, Some(&names), None, bindings, code)
    }

    /// How many devices the configuration suggests (over all physical devices).
    pub fn suggested_devices(&self) -> Result<usize> {
        let mut n = 0;
        for ordinal in 0..self.backend.num_physical_devices() {
            let p = self.backend.get_device(ordinal)?;
            n += self.backend.suggested_num_virtual_devices(&p);
        }
        Ok(n.max(1))
    }

    /// A new virtual device, on the physical device (core) with the fewest so far.
    pub fn device(&self) -> Result<Device> {
        Ok(self.devices(1)?.remove(0))
    }

    /// `n` new virtual devices, dealt round-robin over the physical devices.
    pub fn devices(&self, n: usize) -> Result<Vec<Device>> {
        let physical = self.backend.num_physical_devices().max(1);
        (0..n)
            .map(|i| {
                let p = self.backend.get_device(i % physical)?;
                self.backend.new_virtual_device(&p)
            })
            .collect()
    }

    /// A new empty context on a device.
    pub fn context(&self, device: &Device) -> Result<Context> {
        self.backend.init(device)
    }

    /// Links compiled code into a context: the routine's context is a child of `ctx` holding
    /// buffers for every node the code keeps in the context.
    pub fn link(&self, ctx: &Context, code: &Code) -> Result<Routine> {
        self.backend.link(&[], ctx, code)
    }

    /// Links every routine of a batch; returns the context downstream of all of them.
    pub fn link_batch(
        &self,
        ctx: &Context,
        batch: &CodeBatch,
    ) -> Result<(Context, Vec<Option<Routine>>)> {
        self.backend.link_batch(&[], ctx, batch)
    }

    /// Copies a hosted tensor's host array into its buffer in the context (scheduled on the
    /// context's device, after what was scheduled before). An error when the tensor is not
    /// hosted or not in the context.
    pub fn upload(&self, ctx: &Context, tn: &Tnode) -> Result<()> {
        self.check_transfer(ctx, tn, "upload")?;
        self.backend.from_host(ctx, tn).map(|_| ())
    }

    /// Waits for the context's device, then copies the tensor's buffer into its host array.
    /// An error when the tensor is not hosted or not in the context.
    pub fn download(&self, ctx: &Context, tn: &Tnode) -> Result<()> {
        self.check_transfer(ctx, tn, "download")?;
        let device = self.backend.get_ctx_device(ctx)?;
        self.backend.to_host(ctx, tn)?;
        self.backend.await_device(&device)
    }

    /// Waits until every task scheduled on the device has run; returns the first failure.
    pub fn sync(&self, device: &Device) -> Result<()> {
        self.backend.await_device(device)
    }

    fn check_transfer(&self, ctx: &Context, tn: &Tnode, what: &str) -> Result<()> {
        if !tn.is_hosted() {
            return Err(Error::NotHosted {
                what: format!("{what}: "),
                tensor: tn.name(),
            });
        }
        if !ctx.contains(tn) {
            return Err(Error::NotInContext {
                what: what.to_string(),
                tensor: tn.name(),
                context: ctx.label().to_string(),
                hint: " (no linked routine keeps it in the context)".into(),
            });
        }
        Ok(())
    }
}

impl Drop for Jit {
    fn drop(&mut self) {
        self.backend.unsafe_cleanup();
    }
}
