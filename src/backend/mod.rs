//! Backends: the cc no-device backend, contexts, buffers and routines, and
//! the device layer (multicore and sync backends, transfers, merge buffers).

pub mod buffer;
pub mod cc;
pub mod context;
pub mod counter;
pub mod device;
pub mod devices;
#[cfg(feature = "mpi")]
pub mod mpi;
mod reduce;
pub mod sexp;
pub mod task;

pub use buffer::{BufferPtr, DeviceBuffer};
pub use cc::{CcBackend, Code, CodeBatch, Config, MergeBuffer, Routine, Task};
pub use context::Context;
pub use counter::Progress;
pub use device::{Device, Event, PhysicalDevice};
pub use devices::{
    backend_by_name, Backend, MergeBufferUse, MulticoreBackend, SyncBackend, Transfer,
};
#[cfg(feature = "mpi")]
pub use mpi::MpiBackend;
