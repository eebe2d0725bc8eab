//! arrayjit: compiles n-dimensional array computations to native code through C.
#![warn(missing_docs)]

pub mod error;
pub mod ir;

pub use error::{Error, Result};
