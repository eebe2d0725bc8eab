//! The input side: precisions, host arrays, tensor nodes, indexing and projections,
//! the operation table, and assignments.

#[doc(hidden)]
pub mod assignments;
pub mod build;
#[doc(hidden)]
pub mod decisions;
pub mod einsum;
pub mod indexing;
#[doc(hidden)]
pub mod modes;
pub mod ndarray;
pub mod ops;
#[doc(hidden)]
pub mod prec;
pub mod random;
#[doc(hidden)]
pub mod tnode;

pub use assignments::{Assignments, Buffer, FetchOp};
pub use decisions::MemoryModes;
pub use half::{bf16, f16};
pub use indexing::{
    check_static_value, AxisIndex, Bindings, LinearIndex, Projections, RoutineBindings,
    StaticSymbol, Symbol,
};
pub use modes::{HostedMode, MemoryMode};
pub use ndarray::{InitOp, Ndarray};
pub use ops::{Binop, IntCtx, Ternop, Unop};
pub use prec::{Compute, Fp8, Prec};
pub use tnode::{Tnode, TnodeBuilder};
