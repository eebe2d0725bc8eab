#![doc = include_str!("../README.md")]
//!
//! The stages, one module each: [`ir`] (what the user writes) → [`lower`] (loop IR) →
//! [`optimize`] (tracing, inlining, simplification) → [`codegen`] (C text) → [`compile`]
//! (compiler, loading) → [`backend`] (contexts, routines).
#![warn(missing_docs)]

pub mod backend;
pub mod codegen;
pub mod compile;
pub mod error;
pub mod interp;
pub mod ir;
pub mod jit;
pub mod loops;
pub mod lower;
pub mod nn;
pub mod optimize;
pub mod target;

pub use error::{Error, Result};
pub use jit::{Jit, JitConfig};
