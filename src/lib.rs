//! arrayjit compiles computations over n-dimensional arrays to native code through C.
//!
//! A computation is a set of *assignments* ([`ir::Assignments`]) over *tensor nodes*
//! ([`ir::Tnode`]) with einsum-style index specs (`"ij,jk->ik"`). arrayjit lowers them to a
//! loop IR ([`lower`], [`loops`]), optimizes it ([`optimize`]: fusion, inlining of
//! intermediate tensors, loop interchange, packed GEMM kernels for contractions and
//! convolutions), prints readable C ([`codegen`]), compiles it with the system C compiler and
//! loads the shared object ([`compile`]: compiler detection, flags, the compile cache), and
//! runs it as *routines* on *contexts* that hold each device's buffers ([`backend`]). A worker
//! thread per core runs each device's queue, so data-parallel training runs across cores, with
//! merge buffers to add gradients up ([`parallel`] trains any model data-parallel; [`nn`] has
//! the building blocks and the two-moons demo's model).
//! [`interp`] is a reference interpreter of the loop IR, used to test the compiled code.
//!
//! The guide is in the repository's `docs/` directory: `docs/getting-started.md`,
//! `docs/concepts.md`, `docs/program-format.md` (the `arrayjit` command's JSON files),
//! `docs/configuration.md` (every environment variable, [`JitConfig`] and
//! [`compile::CompilerConfig`]), `docs/devices.md`, `docs/mpi.md`, `docs/generated-c.md`
//! (reading the C, debugging), `docs/semantics.md` and `docs/performance.md`; its table of
//! contents is `docs/README.md`.
//!
//! # Computing with a [`Jit`]
//!
//! One configured [`Jit`] compiles code, gives devices and contexts, links code into routines
//! and moves data between the host and the devices. `y = x @ w`, then the row sums of
//! `relu(y)`:
//!
//! ```
//! use arrayjit::ir::build::relu;
//! use arrayjit::ir::{Assignments, Bindings, MemoryMode, Prec, Tnode};
//! use arrayjit::{Jit, JitConfig};
//!
//! # fn main() -> arrayjit::Result<()> {
//! let x = Tnode::hosted(&["x"], &[2, 3], Prec::Single)?;
//! let w = Tnode::hosted(&["w"], &[3, 2], Prec::Single)?;
//! let y = Tnode::new(&["y"], &[2, 2], Prec::Single)?; // an intermediate
//! let s = Tnode::hosted(&["s"], &[2], Prec::Single)?;
//! x.set_host_slice(&[1f32, 2., 3., 4., 5., 6.])?;
//! w.set_host_slice(&[1f32, 0., 0., 1., 1., -1.])?;
//! let none = Bindings::empty();
//! let code = Assignments::seq([
//!     y.assign((&x * &w).sum("ij,jk->ik"))?, // y = x @ w
//!     s.assign(relu(&y).sum("ik->i"))?,      // s = the row sums of relu(y)
//! ]);
//! let jit = Jit::new(JitConfig::default())?;
//! let compiled = jit.compile("forward", &none, &code)?;
//! let device = jit.device()?;
//! let routine = jit.link(&jit.context(&device)?, &compiled)?;
//! jit.upload(routine.context(), &x)?;
//! jit.upload(routine.context(), &w)?;
//! routine.schedule()?; // on the device's worker thread; `routine.run()` runs it here and now
//! jit.download(routine.context(), &s)?; // waits for the device, then copies
//! assert_eq!(s.host_to_vec::<f32>()?, vec![4.0, 10.0]);
//!
//! // The optimizer's decisions come back with the code: y was inlined into the sum, so it
//! // has no array in the generated C.
//! assert_eq!(compiled.optimized().memory_mode(&y), Some(MemoryMode::Virtual));
//! assert!(compiled.source().contains("/* inlined y */"));
//! # Ok(())
//! # }
//! ```
//!
//! # The backend layer: devices, contexts and merge buffers
//!
//! Underneath, the operations of the API the project started from (OCANNL's `Backend`
//! signature) keep their names on the [`backend::Backend`] trait (`compile_batch`,
//! `link_batch`, `from_host`, `to_host`, `device_to_device`, `await_device`, ...),
//! implemented by [`backend::MulticoreBackend`] (a worker thread per core),
//! [`backend::SyncBackend`] (everything on the calling thread) and, with the `mpi` feature,
//! `backend::MpiBackend`; [`backend::CcBackend`] is the device-less layer below them and
//! [`Jit::backend`] gives the one under a `Jit`. Two devices each take their row of a batch,
//! and device 1's row is added into device 0's through device 0's merge buffer:
//!
//! ```
//! use arrayjit::backend::{Backend, Config, MergeBufferUse, MulticoreBackend};
//! use arrayjit::ir::{Assignments, Bindings, Binop, Buffer, FetchOp, InitOp, Prec};
//! use arrayjit::ir::{Projections, StaticSymbol, Tnode};
//!
//! # fn main() -> arrayjit::Result<()> {
//! let backend = MulticoreBackend::new();
//! backend.initialize(Config::default());
//! let cores = backend.num_physical_devices();
//! let mut devices = vec![];
//! for i in 0..2 {
//!     devices.push(backend.new_virtual_device(&backend.get_device(i % cores)?)?);
//! }
//! // batch = [[0, 1, 2], [3, 4, 5]]; each device's g is its row (static index `row`).
//! let row = StaticSymbol::new("row", Some(2));
//! let bindings = Bindings(vec![row.clone()]);
//! let batch = Tnode::with_init(&["batch"], &[2, 3], Prec::Single, &InitOp::RangeOverOffsets)?;
//! let g = Tnode::hosted(&["g"], &[3], Prec::Single)?;
//! let take_row = Assignments::Fetch {
//!     array: g.clone(),
//!     fetch_op: FetchOp::Slice { batch_idx: row.clone(), sliced: batch.clone() },
//! };
//! // g = g + (the g in this device's merge buffer)
//! let merge = Assignments::AccumBinop {
//!     initialize_neutral: false, accum: Binop::Add, op: Binop::Arg2, lhs: g.clone(),
//!     rhs1: Buffer::Node(g.clone()), rhs2: Buffer::MergeBuffer(g.clone()),
//!     projections: Projections::pointwise(&[3], 2),
//! };
//! let names = ["take_row".to_string(), "merge".to_string()];
//! let code = backend.compile_batch(true, Some(&names), None, &bindings, &[take_row, merge])?;
//! let mut linked = vec![];
//! for (i, device) in devices.iter().enumerate() {
//!     let (ctx, routines) = backend.link_batch(&[], &backend.init(device)?, &code)?;
//!     assert!(backend.from_host(&ctx, &batch)?);
//!     let take_row = routines[0].clone().expect("in the batch");
//!     take_row.bindings().set("row", i as i64)?;
//!     take_row.schedule()?;
//!     linked.push((ctx, routines[1].clone().expect("in the batch")));
//! }
//! // Copy device 1's g into device 0's merge buffer (after device 1 computed it), then add.
//! backend.await_device(&devices[1])?;
//! let merge0 = &linked[0].1;
//! backend.device_to_device(&g, MergeBufferUse::Copy, merge0.context(), &linked[1].0)?;
//! merge0.schedule()?;
//! backend.to_host(merge0.context(), &g)?;
//! backend.await_device(&devices[0])?;
//! assert_eq!(g.host_to_vec::<f32>()?, vec![3.0, 5.0, 7.0]);
//! # Ok(())
//! # }
//! ```
//!
//! # Typed host data
//!
//! Host arrays ([`ir::Ndarray`]) hold one precision ([`ir::Prec`]: byte, 16-, 32- and 64-bit
//! integers, fp8, half, bfloat16, single, double) and are read and written in their element
//! type: [`ir::Ndarray::as_slice`] and [`ir::Ndarray::as_mut_slice`] without a copy,
//! [`ir::Tnode::host_to_vec`] and [`ir::Tnode::set_host_slice`] with one; another element
//! type is [`Error::PrecisionMismatch`]. Integer statements compute exactly, wrapping like C's
//! unsigned types:
//!
//! ```
//! use arrayjit::ir::{Assignments, Bindings, Binop, Buffer, InitOp, Ndarray, Prec, Projections, Tnode};
//! use arrayjit::{Error, Jit, JitConfig};
//!
//! # fn main() -> arrayjit::Result<()> {
//! let offsets = Ndarray::create(Prec::Int32, &[2, 2], &InitOp::RangeOverOffsets)?;
//! assert_eq!(offsets.as_slice::<i32>()?, &[0, 1, 2, 3]);
//! assert!(matches!(offsets.as_slice::<f32>(), Err(Error::PrecisionMismatch { .. })));
//!
//! let x = Tnode::hosted(&["x"], &[3], Prec::Byte)?;
//! let y = Tnode::hosted(&["y"], &[3], Prec::Byte)?;
//! x.set_host_slice(&[200u8, 1, 255])?;
//! y.set_host_slice(&[100u8, 2, 1])?;
//! let z = Tnode::hosted(&["z"], &[3], Prec::Byte)?;
//! let add = Assignments::AccumBinop {
//!     initialize_neutral: true,
//!     accum: Binop::Arg2, // overwrite: z = x + y
//!     op: Binop::Add,
//!     lhs: z.clone(),
//!     rhs1: Buffer::Node(x.clone()),
//!     rhs2: Buffer::Node(y.clone()),
//!     projections: Projections::pointwise(&[3], 2),
//! };
//! let jit = Jit::new(JitConfig::default())?;
//! let code = jit.compile("add_bytes", &Bindings::empty(), &add)?;
//! let routine = jit.link(&jit.context(&jit.device()?)?, &code)?;
//! jit.upload(routine.context(), &x)?;
//! jit.upload(routine.context(), &y)?;
//! routine.schedule()?;
//! jit.download(routine.context(), &z)?;
//! assert_eq!(z.host_to_vec::<u8>()?, vec![44, 3, 0]); // modulo 256
//! let first = z.with_host(|h| h.as_slice::<u8>().map(|s| s[0])).expect("z is hosted")?;
//! assert_eq!(first, 44);
//! # Ok(())
//! # }
//! ```
//!
//! # Modules
//!
//! The public API: [`ir`] (what the user writes: precisions, host arrays, tensor nodes,
//! indexing, einsum specs, the operation table, assignments, and the [`ir::build`] builder),
//! [`jit`] (the configured entry point: [`Jit`], [`JitConfig`], [`CompilerConfig`],
//! [`OptimizerSettings`]), [`backend`] (the seed's backend layer: contexts, routines, devices,
//! transfers, merge buffers), [`nn`] (layers and losses as assignments), [`parallel`]
//! (data-parallel training of any model), [`target`] (the CPU's vector instructions) and
//! [`error`] (the one error type).
//!
//! The stages behind them, one module each, are internal (hidden from these docs and not
//! covered by semantic versioning; the CLI and the tests reach them): `lower` (assignments to
//! the loop IR of `loops`) → `optimize` → `codegen` (C text) → `compile` (compiler, flags,
//! cache, loading), driven by `pipeline`; `interp` interprets the loop IR.
//!
//! # Features
//!
//! - `cli` (default): the `arrayjit` command line (`src/bin/arrayjit`); turn default features
//!   off for the library alone.
//! - `mpi`: the MPI backend, on the system MPI.
#![warn(missing_docs)]

pub mod backend;
#[doc(hidden)]
pub mod codegen;
#[doc(hidden)]
pub mod compile;
pub mod error;
#[doc(hidden)]
pub mod interp;
pub mod ir;
pub mod jit;
#[doc(hidden)]
pub mod loops;
#[doc(hidden)]
pub mod lower;
pub mod nn;
#[doc(hidden)]
pub mod optimize;
pub mod parallel;
#[doc(hidden)]
pub mod pipeline;
pub mod target;

pub use error::{Error, Result};
pub use jit::{CompilerConfig, Jit, JitConfig, OptimizerSettings};

/// The Rust examples of the README and of the `docs/` chapters, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The Rust examples of `docs/concepts.md`, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/concepts.md")]
pub struct ConceptsDoctests;

/// The Rust example of `docs/devices.md`, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../docs/devices.md")]
pub struct DevicesDoctests;
