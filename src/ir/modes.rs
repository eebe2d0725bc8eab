//! Memory modes: where a tensor node lives, as a lattice refined by decisions (the table of
//! decisions, [`crate::ir::MemoryModes`], is in `decisions.rs`).
//!
//! A node's own declaration (made when it is built, [`crate::ir::Tnode::builder`]) is where
//! every decision starts; decisions only refine it, never silently contradict it.

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

/// Where a node lives. Abstract modes are refined by later decisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
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
pub(super) const H_ANY: u8 = HC | HCH | HV | HN;

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

    pub(crate) fn bits(self) -> u8 {
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

    pub(crate) fn from_bits(b: u8) -> Option<MemoryMode> {
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
    /// Fusion: a slice-sized local replacing a local tensor that one fused loop uses one
    /// slice at a time.
    pub const FUSED: u32 = 21;
    /// The parallel pass: the partial results of a reduction split into blocks.
    pub const PARALLEL: u32 = 22;
}
