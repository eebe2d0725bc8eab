//! Backends: the cc no-device backend, contexts, buffers and routines, and
//! the device layer (multicore and sync backends, transfers, merge buffers).

#[doc(hidden)]
pub mod buffer;
#[doc(hidden)]
pub mod cc;
#[doc(hidden)]
pub mod context;
#[doc(hidden)]
pub mod counter;
#[doc(hidden)]
pub mod device;
#[doc(hidden)]
pub mod devices;
pub(crate) mod load;
#[cfg(feature = "mpi")]
#[doc(hidden)]
pub mod mpi;
mod reduce;
#[doc(hidden)]
pub mod sexp;
#[doc(hidden)]
pub mod task;
pub mod team;

pub use buffer::{BufferPtr, DeviceBuffer};
pub use cc::{CcBackend, Code, CodeBatch, Config, MergeBuffer, Routine, Task};
pub use context::Context;
pub use counter::Progress;
pub use device::{Device, Event, PhysicalDevice};
pub use devices::{Backend, MergeBufferUse, MulticoreBackend, SyncBackend, Transfer};
#[cfg(feature = "mpi")]
pub use mpi::MpiBackend;
pub use team::Team;

use crate::error::{Error, Result};

/// A backend chosen by name: `multicore`, `sync`, or `mpi` ([`MpiBackend`], which
/// initializes MPI; without the cargo feature `mpi`, [`Error::MpiNotBuilt`]), compiling with
/// a default [`CcBackend`].
///
/// [`MpiBackend`]: https://docs.rs/arrayjit/latest/arrayjit/backend/mpi/struct.MpiBackend.html
pub fn backend_by_name(name: &str) -> Result<Box<dyn Backend>> {
    backend_named(name, CcBackend::new())
}

/// As [`backend_by_name`], compiling with a configured compiler backend `cc`.
pub fn backend_named(name: &str, cc: CcBackend) -> Result<Box<dyn Backend>> {
    match name {
        "multicore" => Ok(Box::new(MulticoreBackend::with_cc(cc))),
        "sync" => Ok(Box::new(SyncBackend::with_cc(cc))),
        #[cfg(feature = "mpi")]
        "mpi" => Ok(Box::new(mpi::MpiBackend::with_cc(cc)?)),
        #[cfg(not(feature = "mpi"))]
        "mpi" => {
            drop(cc);
            Err(Error::MpiNotBuilt)
        }
        other => Err(Error::UnknownBackend {
            name: other.to_string(),
        }),
    }
}
