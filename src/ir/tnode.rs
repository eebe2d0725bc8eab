//! Tensor nodes: immutable, cheap, thread-safe descriptors of arrays (id, label, dims,
//! precision, the memory mode the user declared) with an optional host array.
//!
//! Nodes are never changed by compiling: the optimizer's decisions about where a node lives
//! are returned beside the code ([`crate::ir::MemoryModes`]), so compiling twice gives the same
//! result. Only the host array's *contents* change (by `to_host`, or by the user).

use super::ndarray::{numel, InitOp, Ndarray};
use super::prec::Prec;
use crate::error::{Error, Result};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub use super::modes::{provenance, HostedMode, MemoryMode};

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

struct Inner {
    id: usize,
    label: Vec<String>,
    dims: Vec<usize>,
    prec: Prec,
    /// The memory mode declared when the node was built (hosting declares Materialized).
    declared: Option<(MemoryMode, u32)>,
    host: Option<Mutex<Ndarray>>,
}

/// A tensor node: a cheap, thread-safe shared handle. Two nodes are equal iff their ids are.
#[derive(Clone)]
pub struct Tnode(Arc<Inner>);

/// Builds a [`Tnode`]: its memory mode and host array are fixed when it is built.
#[derive(Debug)]
pub struct TnodeBuilder {
    label: Vec<String>,
    dims: Vec<usize>,
    prec: Prec,
    mode: Option<(MemoryMode, u32)>,
    init: Option<InitOp>,
}

impl TnodeBuilder {
    /// Declares the node's memory mode (provenance [`provenance::USER`]).
    pub fn memory(self, mode: MemoryMode) -> TnodeBuilder {
        self.memory_with_provenance(mode, provenance::USER)
    }

    /// Declares the node's memory mode with a provenance (for library passes that create
    /// nodes, such as the kernel passes' packed buffers).
    pub fn memory_with_provenance(mut self, mode: MemoryMode, prov: u32) -> TnodeBuilder {
        self.mode = Some((mode, prov));
        self
    }

    /// Gives the node a host array created by `init` (the node is then hosted).
    pub fn init(mut self, init: InitOp) -> TnodeBuilder {
        self.init = Some(init);
        self
    }

    /// Gives the node a host array of zeros (the node is then hosted).
    pub fn hosted(self) -> TnodeBuilder {
        self.init(InitOp::Zeros)
    }

    /// Builds the node. Errors: empty or zero dims, a size beyond `isize::MAX` bytes, an
    /// init that does not fit the dims, a host array for a node declared `Virtual` or
    /// `Local`... (a declared mode that excludes being materialized).
    pub fn build(self) -> Result<Tnode> {
        let name = self.label.join(".");
        check_dims(&name, &self.dims, self.prec)?;
        let host = match &self.init {
            None => None,
            Some(init) => Some(Ndarray::create(self.prec, &self.dims, init).map_err(
                |e| match e {
                    Error::Ndarray(m) => Error::Ndarray(format!("tensor {name}: {m}")),
                    e => e,
                },
            )?),
        };
        let mut declared = self.mode;
        if host.is_some() {
            declared = Some(match declared {
                None => (MemoryMode::Materialized, provenance::HOSTED),
                Some((m, p)) => {
                    let meet = m.bits() & MemoryMode::Materialized.bits();
                    if meet == 0 {
                        return Err(Error::MemoryMode {
                            node: name,
                            msg: format!(
                                "it has a host array but is declared {m:?} (provenance {p}), \
                                 which is never materialized"
                            ),
                        });
                    }
                    (MemoryMode::from_bits(meet).unwrap_or(m), p)
                }
            });
        }
        Ok(Tnode(Arc::new(Inner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            label: self.label,
            dims: self.dims,
            prec: self.prec,
            declared,
            host: host.map(Mutex::new),
        })))
    }
}

/// Dims must be non-empty and positive, and the size in bytes must fit in `isize` (and hence
/// in the `int64_t` offsets of generated code).
fn check_dims(name: &str, dims: &[usize], prec: Prec) -> Result<()> {
    if dims.is_empty() || dims.contains(&0) {
        return Err(Error::Dims {
            tensor: name.to_string(),
            dims: dims.to_vec(),
            problem: "must be non-empty and every dim at least 1".into(),
        });
    }
    let bytes = dims
        .iter()
        .try_fold(prec.size_in_bytes(), |acc, &d| acc.checked_mul(d))
        .filter(|&b| b <= isize::MAX as usize);
    if bytes.is_none() {
        return Err(Error::Dims {
            tensor: name.to_string(),
            dims: dims.to_vec(),
            problem: format!(
                "of precision {prec} are too large (more than {} bytes)",
                isize::MAX
            ),
        });
    }
    Ok(())
}

impl Tnode {
    /// Starts building a node (see [`TnodeBuilder`]).
    pub fn builder(label: &[&str], dims: &[usize], prec: Prec) -> TnodeBuilder {
        TnodeBuilder {
            label: label.iter().map(|s| s.to_string()).collect(),
            dims: dims.to_vec(),
            prec,
            mode: None,
            init: None,
        }
    }

    /// A new node without a host array and with an undecided memory mode.
    ///
    /// Dims must be non-empty and positive; a scalar has dims `[1]`.
    pub fn new(label: &[&str], dims: &[usize], prec: Prec) -> Result<Tnode> {
        Tnode::builder(label, dims, prec).build()
    }

    /// A new hosted node whose host array is created by `init`.
    pub fn with_init(label: &[&str], dims: &[usize], prec: Prec, init: &InitOp) -> Result<Tnode> {
        Tnode::builder(label, dims, prec).init(init.clone()).build()
    }

    /// A new hosted node whose host array holds zeros (an output to read back).
    pub fn hosted(label: &[&str], dims: &[usize], prec: Prec) -> Result<Tnode> {
        Tnode::builder(label, dims, prec).hosted().build()
    }

    /// The memory mode declared when the node was built, with its provenance (a hosted node
    /// is at least Materialized).
    pub fn declared_memory_mode(&self) -> Option<(MemoryMode, u32)> {
        self.0.declared
    }

    fn host(&self) -> Option<MutexGuard<'_, Ndarray>> {
        self.0
            .host
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The unique id.
    pub fn id(&self) -> usize {
        self.0.id
    }

    /// The label (for display and for naming in generated code).
    pub fn label(&self) -> &[String] {
        &self.0.label
    }

    /// A display name: the label joined with `.`, or `n<id>` when the label is empty.
    pub fn name(&self) -> String {
        if self.0.label.is_empty() {
            format!("n{}", self.0.id)
        } else {
            self.0.label.join(".")
        }
    }

    /// The dims.
    pub fn dims(&self) -> &[usize] {
        &self.0.dims
    }

    /// Number of cells.
    pub fn numel(&self) -> usize {
        numel(&self.0.dims)
    }

    /// The precision.
    pub fn prec(&self) -> Prec {
        self.0.prec
    }

    /// Size of the array in bytes.
    pub fn size_in_bytes(&self) -> usize {
        self.numel() * self.0.prec.size_in_bytes()
    }

    /// Whether the node has a host array.
    pub fn is_hosted(&self) -> bool {
        self.0.host.is_some()
    }

    /// Runs `f` on the host array, if any.
    pub fn with_host<R>(&self, f: impl FnOnce(&Ndarray) -> R) -> Option<R> {
        self.host().map(|a| f(&a))
    }

    /// Runs `f` on the host array, mutably, if any.
    pub fn with_host_mut<R>(&self, f: impl FnOnce(&mut Ndarray) -> R) -> Option<R> {
        self.host().map(|mut a| f(&mut a))
    }

    /// A copy of the host array's values as `f64`, if hosted.
    pub fn host_values(&self) -> Option<Vec<f64>> {
        self.with_host(|a| a.to_f64_vec())
    }

    /// Overwrites the host array's values; an error if not hosted or the length differs.
    pub fn set_host_values(&self, values: &[f64]) -> Result<()> {
        self.with_host_mut(|a| a.set_values(values))
            .unwrap_or_else(|| Err(self.not_hosted()))
    }
}

impl Tnode {
    fn not_hosted(&self) -> Error {
        Error::NotHosted {
            what: String::new(),
            tensor: self.name(),
        }
    }

    /// A copy of the host array in its element type (`u8`, `u16`, `i32`, `u32`, `i64`, `u64`,
    /// `f16`, `bf16`, [`crate::ir::Fp8`], `f32`, `f64`); [`Error::PrecisionMismatch`] when `T` is
    /// not the tensor's element type.
    pub fn host_to_vec<T: crate::ir::ndarray::Element>(&self) -> Result<Vec<T>> {
        self.with_host(|a| a.to_vec::<T>())
            .unwrap_or_else(|| Err(self.not_hosted()))
    }

    /// Overwrites the host array with values of its element type, exactly;
    /// [`Error::PrecisionMismatch`] when `T` is not its element type, an error when the
    /// length differs or the tensor is not hosted.
    pub fn set_host_slice<T: crate::ir::ndarray::Element>(&self, values: &[T]) -> Result<()> {
        let name = self.name();
        self.with_host_mut(|a| {
            let dst = a.as_mut_slice::<T>()?;
            if dst.len() != values.len() {
                return Err(Error::Count {
                    what: format!("the values of tensor {name}"),
                    expected: dst.len(),
                    got: values.len(),
                });
            }
            dst.copy_from_slice(values);
            Ok(())
        })
        .unwrap_or_else(|| Err(self.not_hosted()))
    }
}

impl PartialEq for Tnode {
    fn eq(&self, other: &Self) -> bool {
        self.0.id == other.0.id
    }
}
impl Eq for Tnode {}
impl Hash for Tnode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.id.hash(state)
    }
}
impl PartialOrd for Tnode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Tnode {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.id.cmp(&other.0.id)
    }
}

impl fmt::Debug for Tnode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.name(), self.0.id)
    }
}

impl fmt::Display for Tnode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}
