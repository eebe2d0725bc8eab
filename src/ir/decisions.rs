//! The table of memory-mode decisions ([`MemoryModes`]) that the optimizer returns and a
//! backend keeps per session. A node's own declaration (made when it is built,
//! [`crate::ir::Tnode::builder`]) is where every decision starts; decisions only refine it,
//! never silently contradict it.

use super::modes::{provenance, HostedMode, MemoryMode, H_ANY};
use super::tnode::Tnode;
use crate::error::{Error, Result};
use std::collections::HashMap;

/// Memory-mode decisions about nodes, each with the provenance of the rule that made it. A
/// node without an entry is at its declaration ([`Tnode::declared_memory_mode`]).
#[derive(Clone, Debug, Default)]
pub struct MemoryModes {
    map: HashMap<Tnode, (MemoryMode, u32)>,
}

impl MemoryModes {
    /// An empty table.
    pub fn new() -> MemoryModes {
        MemoryModes::default()
    }

    /// The current mode of a node with its provenance: the table's decision, else the node's
    /// declaration.
    pub fn with_provenance(&self, tn: &Tnode) -> Option<(MemoryMode, u32)> {
        self.map
            .get(tn)
            .copied()
            .or_else(|| tn.declared_memory_mode())
    }

    /// The current mode of a node, if anything is decided or declared.
    pub fn get(&self, tn: &Tnode) -> Option<MemoryMode> {
        self.with_provenance(tn).map(|(m, _)| m)
    }

    /// Every node with a decision in the table.
    pub fn nodes(&self) -> impl Iterator<Item = &Tnode> {
        self.map.keys()
    }

    /// Refines the mode of a node. A decision that contradicts the current mode is an error
    /// naming the node, both modes and both provenances.
    pub fn refine(&mut self, tn: &Tnode, mode: MemoryMode, prov: u32) -> Result<()> {
        let new = match self.with_provenance(tn) {
            None => (mode, prov),
            Some((old, old_prov)) => {
                let meet = old.bits() & mode.bits();
                if meet == 0 {
                    return Err(Error::MemoryMode {
                        node: tn.name(),
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
        self.map.insert(tn.clone(), new);
        Ok(())
    }

    /// Applies every decision of `other` (an error on the first contradiction).
    pub fn merge(&mut self, other: &MemoryModes) -> Result<()> {
        let mut entries: Vec<(&Tnode, &(MemoryMode, u32))> = other.map.iter().collect();
        entries.sort_by_key(|(t, _)| t.id());
        for (tn, &(mode, prov)) in entries {
            self.refine(tn, mode, prov)?;
        }
        Ok(())
    }

    /// Decides a final (concrete) mode for a node still undecided or abstract at code
    /// generation: the most local mode compatible with what is known; a node with a host
    /// array becomes Hosted (Nonconstant unless a narrower hosted mode is known) unless its
    /// mode excludes hosting, in which case the host array only stages data for `from_host`.
    pub fn finalize(&mut self, tn: &Tnode) -> Result<MemoryMode> {
        let allows_hosted = self.get(tn).is_none_or(|m| m.bits() & H_ANY != 0);
        if tn.is_hosted() && allows_hosted {
            let mode = self.get(tn);
            if !matches!(mode, Some(MemoryMode::Hosted(_))) {
                let hosted = if mode == Some(MemoryMode::EffectivelyConstant) {
                    HostedMode::Constant
                } else {
                    HostedMode::Nonconstant
                };
                self.refine(tn, MemoryMode::Hosted(hosted), provenance::DEFAULTED)?;
            }
        }
        let mode = self.get(tn).unwrap_or(MemoryMode::Virtual).most_local();
        self.refine(tn, mode, provenance::DEFAULTED)?;
        Ok(self.get(tn).unwrap_or(mode))
    }

    /// Keeps only the decisions about the given nodes.
    pub fn retain(&mut self, keep: impl Fn(&Tnode) -> bool) {
        self.map.retain(|t, _| keep(t));
    }
}
