//! Tensor nodes: shared handles to arrays with a memory mode and an optional host array.

use super::ndarray::{numel, InitOp, Ndarray};
use super::prec::Prec;
use crate::error::{Error, Result};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// How a hosted node's host copy relates to its device copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HostedMode {
    /// Never changed by routines (inputs, parameters set from the host only).
    Constant,
    /// Changed by routines; the host copy is refreshed with `to_host`.
    ChangedOnDevices,
    /// Changed on the host between runs (e.g. data batches).
    Volatile,
    /// Not constant, otherwise unspecified.
    Nonconstant,
}

/// Where a node lives; see SPEC section 1. Abstract modes are refined by later decisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryMode {
    /// Never materialized: inlined per scalar where it is used.
    Virtual,
    /// Materialized only for the duration of one routine call.
    Local,
    /// Kept in the context across calls; mergeable across devices.
    OnDevice,
    /// Kept in the context and on the host.
    Hosted(HostedMode),
    /// Abstract: Local, OnDevice or Hosted.
    NeverVirtual,
    /// Abstract: Local or OnDevice.
    DeviceOnly,
    /// Abstract: OnDevice or Hosted.
    Materialized,
    /// Abstract: Hosted Constant or Virtual.
    EffectivelyConstant,
}

// Concrete modes as bits, so that refinement is set intersection.
const V: u8 = 1;
const L: u8 = 2;
const O: u8 = 4;
const HC: u8 = 8;
const HCH: u8 = 16;
const HV: u8 = 32;
const HN: u8 = 64;
const H_ANY: u8 = HC | HCH | HV | HN;

impl MemoryMode {
    const NAMED: [MemoryMode; 11] = [
        MemoryMode::Virtual,
        MemoryMode::Local,
        MemoryMode::OnDevice,
        MemoryMode::Hosted(HostedMode::Constant),
        MemoryMode::Hosted(HostedMode::ChangedOnDevices),
        MemoryMode::Hosted(HostedMode::Volatile),
        MemoryMode::Hosted(HostedMode::Nonconstant),
        MemoryMode::NeverVirtual,
        MemoryMode::DeviceOnly,
        MemoryMode::Materialized,
        MemoryMode::EffectivelyConstant,
    ];

    fn bits(self) -> u8 {
        match self {
            MemoryMode::Virtual => V,
            MemoryMode::Local => L,
            MemoryMode::OnDevice => O,
            MemoryMode::Hosted(HostedMode::Constant) => HC,
            MemoryMode::Hosted(HostedMode::ChangedOnDevices) => HCH,
            MemoryMode::Hosted(HostedMode::Volatile) => HV,
            MemoryMode::Hosted(HostedMode::Nonconstant) => HCH | HV | HN,
            MemoryMode::NeverVirtual => L | O | H_ANY,
            MemoryMode::DeviceOnly => L | O,
            MemoryMode::Materialized => O | H_ANY,
            MemoryMode::EffectivelyConstant => HC | V,
        }
    }

    fn from_bits(b: u8) -> Option<MemoryMode> {
        MemoryMode::NAMED.into_iter().find(|m| m.bits() == b)
    }

    /// Whether the mode is one of the concrete (final) modes.
    pub fn is_concrete(self) -> bool {
        matches!(
            self,
            MemoryMode::Virtual | MemoryMode::Local | MemoryMode::OnDevice | MemoryMode::Hosted(_)
        )
    }

    /// The most local concrete mode compatible with this one (undecided nodes become Virtual).
    pub fn most_local(self) -> MemoryMode {
        match self {
            MemoryMode::NeverVirtual | MemoryMode::DeviceOnly => MemoryMode::Local,
            MemoryMode::Materialized => MemoryMode::OnDevice,
            MemoryMode::EffectivelyConstant => MemoryMode::Virtual,
            m => m,
        }
    }

    /// Whether a node in this mode may be materialized.
    pub fn may_be_virtual(self) -> bool {
        self.bits() & V != 0
    }
}

/// Provenance numbers of memory-mode decisions made by the library (for error messages).
pub mod provenance {
    /// Set by the user (or a program file) explicitly.
    pub const USER: u32 = 1;
    /// Node has a host array.
    pub const HOSTED: u32 = 2;
    /// Tracing: read before written in a routine (recurrent).
    pub const RECURRENT: u32 = 10;
    /// Tracing: never written in a routine (read-only).
    pub const READ_ONLY: u32 = 11;
    /// Tracing: a cell is read more often than allowed for inlining.
    pub const TOO_MANY_VISITS: u32 = 12;
    /// Virtualization: the computation could not be inlined.
    pub const NOT_INLINABLE: u32 = 13;
    /// Virtualization: inlined.
    pub const INLINED: u32 = 14;
    /// Cleanup: written in a routine and not consumed there, so it must persist.
    pub const OUTPUT: u32 = 15;
    /// Read through the merge buffer.
    pub const MERGE: u32 = 16;
    /// Defaulting at code generation.
    pub const DEFAULTED: u32 = 17;
    /// Used by more than one routine of a program.
    pub const SHARED_BY_ROUTINES: u32 = 18;
    /// Lowering: a snapshot of a node that an assignment reads at other cells than it
    /// writes (an in-place transpose or product), kept for the assignment's duration.
    pub const SNAPSHOT: u32 = 19;
    /// Kernel passes: packed operand panels and tile buffers of a GEMM kernel.
    pub const KERNEL: u32 = 20;
}

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

struct State {
    memory_mode: Option<(MemoryMode, u32)>,
    host: Option<Ndarray>,
}

struct Inner {
    id: usize,
    label: Vec<String>,
    dims: Vec<usize>,
    prec: Prec,
    state: Mutex<State>,
}

/// A tensor node: a cheap, thread-safe shared handle. Two nodes are equal iff their ids are.
#[derive(Clone)]
pub struct Tnode(Arc<Inner>);

impl Tnode {
    /// A new node without a host array and with an undecided memory mode.
    ///
    /// Dims must be non-empty and positive; a scalar has dims `[1]`.
    pub fn new(label: &[&str], dims: &[usize], prec: Prec) -> Result<Tnode> {
        if dims.is_empty() || dims.contains(&0) {
            return Err(Error::Usage(format!(
                "tensor {}: dims {dims:?} must be non-empty and every dim at least 1",
                label.join(".")
            )));
        }
        // Sizes and offsets are computed in usize here and int64_t in C: the size in bytes
        // must fit in isize (and hence in int64_t).
        let bytes = dims
            .iter()
            .try_fold(prec.size_in_bytes(), |acc, &d| acc.checked_mul(d))
            .filter(|&b| b <= isize::MAX as usize);
        if bytes.is_none() {
            return Err(Error::Usage(format!(
                "tensor {}: dims {dims:?} of precision {prec} are too large (more than {} bytes)",
                label.join("."),
                isize::MAX
            )));
        }
        Ok(Tnode(Arc::new(Inner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            label: label.iter().map(|s| s.to_string()).collect(),
            dims: dims.to_vec(),
            prec,
            state: Mutex::new(State {
                memory_mode: None,
                host: None,
            }),
        })))
    }

    /// A new hosted node whose host array is created by `init`.
    pub fn with_init(label: &[&str], dims: &[usize], prec: Prec, init: &InitOp) -> Result<Tnode> {
        let tn = Tnode::new(label, dims, prec)?;
        let arr = Ndarray::create(prec, dims, init).map_err(|e| match e {
            Error::Ndarray(m) => Error::Ndarray(format!("tensor {}: {m}", tn.name())),
            e => e,
        })?;
        tn.set_host(arr)?;
        Ok(tn)
    }

    /// Gives the node a host array (zeros if it has none yet) and refines its mode to Hosted.
    pub fn ensure_hosted(&self) -> Result<()> {
        if !self.is_hosted() {
            self.set_host(Ndarray::zeros(self.prec(), self.dims()))?;
        }
        Ok(())
    }

    fn set_host(&self, arr: Ndarray) -> Result<()> {
        if arr.dims() != self.dims() || arr.prec() != self.prec() {
            return Err(Error::Usage(format!(
                "tensor {}: host array {:?} {} does not match node {:?} {}",
                self.name(),
                arr.dims(),
                arr.prec(),
                self.dims(),
                self.prec()
            )));
        }
        self.lock().host = Some(arr);
        self.update_memory_mode(MemoryMode::Materialized, provenance::HOSTED)
    }

    /// Decides a final (concrete) memory mode for a node still undecided or abstract at code
    /// generation: the most local mode compatible with what is known; a node with a host array
    /// becomes Hosted (Nonconstant unless a narrower hosted mode is known) unless its mode
    /// excludes hosting, in which case the host array only stages data for `from_host`.
    pub fn finalize_memory_mode(&self) -> Result<MemoryMode> {
        let allows_hosted = self.memory_mode().is_none_or(|m| m.bits() & H_ANY != 0);
        if self.is_hosted() && allows_hosted {
            let mode = self.memory_mode();
            if !matches!(mode, Some(MemoryMode::Hosted(_))) {
                let hosted = if mode == Some(MemoryMode::EffectivelyConstant) {
                    HostedMode::Constant
                } else {
                    HostedMode::Nonconstant
                };
                self.update_memory_mode(MemoryMode::Hosted(hosted), provenance::DEFAULTED)?;
            }
        }
        let mode = self
            .memory_mode()
            .unwrap_or(MemoryMode::Virtual)
            .most_local();
        self.update_memory_mode(mode, provenance::DEFAULTED)?;
        Ok(self.memory_mode().unwrap_or(mode))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(|p| p.into_inner())
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

    /// The current memory mode, if decided.
    pub fn memory_mode(&self) -> Option<MemoryMode> {
        self.lock().memory_mode.map(|(m, _)| m)
    }

    /// The current memory mode with the provenance of the decision.
    pub fn memory_mode_with_provenance(&self) -> Option<(MemoryMode, u32)> {
        self.lock().memory_mode
    }

    /// Refines the memory mode. A decision that contradicts the current mode is an error
    /// naming the node, both modes and both provenances.
    pub fn update_memory_mode(&self, mode: MemoryMode, prov: u32) -> Result<()> {
        let mut st = self.lock();
        let new = match st.memory_mode {
            None => (mode, prov),
            Some((old, old_prov)) => {
                let meet = old.bits() & mode.bits();
                if meet == 0 {
                    drop(st);
                    return Err(Error::MemoryMode {
                        node: self.name(),
                        msg: format!(
                            "cannot make it {mode:?} (provenance {prov}): it is already {old:?} (provenance {old_prov})"
                        ),
                    });
                }
                if meet == old.bits() {
                    (old, old_prov)
                } else {
                    (MemoryMode::from_bits(meet).unwrap_or(mode), prov)
                }
            }
        };
        st.memory_mode = Some(new);
        Ok(())
    }

    /// Whether the node has a host array.
    pub fn is_hosted(&self) -> bool {
        self.lock().host.is_some()
    }

    /// Runs `f` on the host array, if any.
    pub fn with_host<R>(&self, f: impl FnOnce(&Ndarray) -> R) -> Option<R> {
        self.lock().host.as_ref().map(f)
    }

    /// Runs `f` on the host array, mutably, if any.
    pub fn with_host_mut<R>(&self, f: impl FnOnce(&mut Ndarray) -> R) -> Option<R> {
        self.lock().host.as_mut().map(f)
    }

    /// A copy of the host array's values as `f64`, if hosted.
    pub fn host_values(&self) -> Option<Vec<f64>> {
        self.with_host(|a| a.to_f64_vec())
    }

    /// Overwrites the host array's values; an error if not hosted or the length differs.
    pub fn set_host_values(&self, values: &[f64]) -> Result<()> {
        self.with_host_mut(|a| a.set_values(values))
            .unwrap_or_else(|| {
                Err(Error::Usage(format!(
                    "tensor {} is not hosted",
                    self.name()
                )))
            })
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
