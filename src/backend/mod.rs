//! Backends (SPEC section 7): the cc no-device backend, contexts, buffers and routines.

pub mod buffer;
pub mod cc;
pub mod context;

pub use buffer::{Buffer, BufferPtr};
pub use cc::{CcBackend, Code, CodeBatch, Config, MergeBuffer, Routine, Task};
pub use context::Context;
