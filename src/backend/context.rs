//! Contexts: maps from nodes to buffers, related by descent.

use super::buffer::{Buffer, BufferPtr};
use super::device::Device;
use crate::error::{Error, Result};
use crate::ir::Tnode;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

static NEXT_CTX: AtomicUsize = AtomicUsize::new(1);

struct Inner {
    id: usize,
    label: String,
    parent: Option<Context>,
    buffers: BTreeMap<Tnode, BufferPtr>,
    finalized: AtomicBool,
    device: Option<Device>,
    /// Nodes that routines linked into this context (or its ancestors) read from the merge
    /// buffer.
    merge_nodes: Vec<Tnode>,
}

/// A context: the buffers of the nodes that live on a device. Linking a routine returns a
/// child context that shares every buffer of its parent and adds zero-filled buffers for the
/// routine's nodes that were missing. Cheap to clone.
#[derive(Clone)]
pub struct Context(Arc<Inner>);

impl Context {
    /// A root context with no buffers.
    pub fn root(label: &str, device: Option<Device>) -> Context {
        Context(Arc::new(Inner {
            id: NEXT_CTX.fetch_add(1, Ordering::Relaxed),
            label: label.to_string(),
            parent: None,
            buffers: BTreeMap::new(),
            finalized: AtomicBool::new(false),
            device,
            merge_nodes: vec![],
        }))
    }

    /// A child context holding this context's buffers plus zero-filled ones for `nodes` that
    /// are missing. Every node in `from_prior` must already be here.
    pub fn extend(
        &self,
        nodes: &[Tnode],
        from_prior: &[Tnode],
        merge_node: Option<&Tnode>,
        what: &str,
    ) -> Result<Context> {
        self.check_live()?;
        for tn in from_prior {
            if !self.0.buffers.contains_key(tn) {
                return Err(Error::Usage(format!(
                    "{what}: tensor {} is listed in from_prior_context but context {} does not hold it",
                    tn.name(),
                    self.0.label
                )));
            }
        }
        let mut merge_nodes = self.0.merge_nodes.clone();
        if let Some(m) = merge_node {
            if !merge_nodes.contains(m) {
                merge_nodes.push(m.clone());
            }
        }
        let mut buffers = self.0.buffers.clone();
        for tn in nodes {
            if !buffers.contains_key(tn) {
                let what = || format!("the device buffer of tensor {}", tn.name());
                buffers.insert(tn.clone(), Buffer::new_for(tn.size_in_bytes(), what)?);
            }
        }
        Ok(Context(Arc::new(Inner {
            id: NEXT_CTX.fetch_add(1, Ordering::Relaxed),
            label: self.0.label.clone(),
            parent: Some(self.clone()),
            buffers,
            finalized: AtomicBool::new(false),
            device: self.0.device.clone(),
            merge_nodes,
        })))
    }

    fn check_live(&self) -> Result<()> {
        if self.0.finalized.load(Ordering::SeqCst) {
            return Err(Error::Usage(format!(
                "context {} (#{}) was finalized",
                self.0.label, self.0.id
            )));
        }
        Ok(())
    }

    /// The buffer of a node, if the context holds it.
    pub fn get_buffer(&self, tn: &Tnode) -> Option<BufferPtr> {
        self.0.buffers.get(tn).cloned()
    }

    /// Whether the context holds a buffer for the node.
    pub fn contains(&self, tn: &Tnode) -> bool {
        self.0.buffers.contains_key(tn)
    }

    /// The nodes held, by id.
    pub fn nodes(&self) -> impl Iterator<Item = &Tnode> {
        self.0.buffers.keys()
    }

    /// The label given at `init`.
    pub fn label(&self) -> &str {
        &self.0.label
    }

    /// A unique id.
    pub fn id(&self) -> usize {
        self.0.id
    }

    /// The parent context, if any.
    pub fn parent(&self) -> Option<&Context> {
        self.0.parent.as_ref()
    }

    /// The virtual device the context belongs to (`None` on the no-device backend).
    pub fn device(&self) -> Option<&Device> {
        self.0.device.as_ref()
    }

    /// The nodes that routines linked into this context read from the merge buffer.
    pub fn merge_nodes(&self) -> &[Tnode] {
        &self.0.merge_nodes
    }

    /// Marks the context finalized; later links into it fail. Buffers are freed when the last
    /// context or routine using them is dropped.
    pub fn finalize(&self) {
        self.0.finalized.store(true, Ordering::SeqCst);
    }

    /// Whether `finalize` was called.
    pub fn is_finalized(&self) -> bool {
        self.0.finalized.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<String> = self.0.buffers.keys().map(|t| t.name()).collect();
        write!(
            f,
            "Context({} #{}: [{}])",
            self.0.label,
            self.0.id,
            nodes.join(", ")
        )
    }
}
