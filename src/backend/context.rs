//! Contexts: maps from nodes to buffers, related by descent.

use super::buffer::{BufferPtr, DeviceBuffer};
use super::device::Device;
use crate::error::{Error, Result};
use crate::ir::Tnode;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

static NEXT_CTX: AtomicUsize = AtomicUsize::new(1);

/// Whether any context was ever finalized in this process: until one is, `check_live` has
/// nothing to look for (the common case, checked on every routine run).
static ANY_FINALIZED: AtomicBool = AtomicBool::new(false);

struct Inner {
    id: usize,
    label: String,
    parent: Option<Context>,
    /// Emptied by `finalize`.
    buffers: RwLock<BTreeMap<Tnode, BufferPtr>>,
    finalized: AtomicBool,
    device: Option<Device>,
    /// The node that the routine whose linking made this context reads from the merge
    /// buffer (the seed's `expected_merge_node`; `None` for a root context).
    expected_merge_node: Option<Tnode>,
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
            buffers: RwLock::new(BTreeMap::new()),
            finalized: AtomicBool::new(false),
            device,
            expected_merge_node: None,
        }))
    }

    fn buffers(&self) -> RwLockReadGuard<'_, BTreeMap<Tnode, BufferPtr>> {
        self.0.buffers.read().unwrap_or_else(|p| p.into_inner())
    }

    /// A child context holding this context's buffers plus zero-filled ones for `nodes` that
    /// are missing, whose expected merge node is `merge_node`. A node of `nodes` listed in
    /// `from_prior` must already be here (it is not added); listed nodes the code does not
    /// use are not checked (as in the seed's `verify_prior_context`).
    pub fn extend(
        &self,
        nodes: &[Tnode],
        from_prior: &[Tnode],
        merge_node: Option<&Tnode>,
        what: &str,
    ) -> Result<Context> {
        self.check_live()?;
        let mut buffers = self.buffers().clone();
        for tn in from_prior {
            if nodes.contains(tn) && !buffers.contains_key(tn) {
                return Err(Error::NotInContext {
                    what: what.to_string(),
                    tensor: tn.name(),
                    context: self.0.label.to_string(),
                    hint: " (it is listed in from_prior_context)".into(),
                });
            }
        }
        for tn in nodes {
            if !buffers.contains_key(tn) {
                let what = || format!("the device buffer of tensor {}", tn.name());
                buffers.insert(tn.clone(), DeviceBuffer::new_for(tn.size_in_bytes(), what)?);
            }
        }
        Ok(self.child(buffers, merge_node.cloned()))
    }

    /// A child context with the same buffers whose expected merge node is `merge_node` (what
    /// `link_batch` returns: downstream of the batch, expecting what its input expected).
    pub(crate) fn with_expected_merge_node(&self, merge_node: Option<Tnode>) -> Result<Context> {
        self.check_live()?;
        let buffers = self.buffers().clone();
        Ok(self.child(buffers, merge_node))
    }

    fn child(&self, buffers: BTreeMap<Tnode, BufferPtr>, merge_node: Option<Tnode>) -> Context {
        Context(Arc::new(Inner {
            id: NEXT_CTX.fetch_add(1, Ordering::Relaxed),
            label: self.0.label.clone(),
            parent: Some(self.clone()),
            buffers: RwLock::new(buffers),
            finalized: AtomicBool::new(false),
            device: self.0.device.clone(),
            expected_merge_node: merge_node,
        }))
    }

    /// Fails ([`Error::ContextFinalized`]) if this context or one it descends from was
    /// finalized: their buffers are released, so nothing may use them any more.
    pub fn check_live(&self) -> Result<()> {
        if !ANY_FINALIZED.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut c = Some(self);
        while let Some(ctx) = c {
            if ctx.0.finalized.load(Ordering::SeqCst) {
                return Err(Error::ContextFinalized {
                    context: format!("{} (#{})", ctx.0.label, ctx.0.id),
                });
            }
            c = ctx.0.parent.as_ref();
        }
        Ok(())
    }

    /// The buffer of a node, if the context holds it.
    pub fn get_buffer(&self, tn: &Tnode) -> Option<BufferPtr> {
        self.buffers().get(tn).cloned()
    }

    /// Whether the context holds a buffer for the node.
    pub fn contains(&self, tn: &Tnode) -> bool {
        self.buffers().contains_key(tn)
    }

    /// The nodes held, by id (none once finalized).
    pub fn nodes(&self) -> Vec<Tnode> {
        self.buffers().keys().cloned().collect()
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

    /// The node the routine whose linking made this context reads from the merge buffer:
    /// the only node `device_to_device` may merge into this context.
    pub fn expected_merge_node(&self) -> Option<&Tnode> {
        self.0.expected_merge_node.as_ref()
    }

    /// Marks the context finalized and drops its buffers: from now on linking into it or a
    /// context derived from it, copying to or from it, and running or scheduling routines
    /// linked into it fail with [`Error::ContextFinalized`]. A buffer's memory is freed once
    /// no context and no routine holds it any more (the parent's buffers stay with the
    /// parent). Does not wait for devices: see `Backend::finalize`.
    pub fn finalize(&self) {
        ANY_FINALIZED.store(true, Ordering::SeqCst);
        self.0.finalized.store(true, Ordering::SeqCst);
        let released =
            std::mem::take(&mut *self.0.buffers.write().unwrap_or_else(|p| p.into_inner()));
        drop(released);
    }

    /// Whether `finalize` was called.
    pub fn is_finalized(&self) -> bool {
        self.0.finalized.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<String> = self.buffers().keys().map(|t| t.name()).collect();
        write!(
            f,
            "Context({} #{}: [{}])",
            self.0.label,
            self.0.id,
            nodes.join(", ")
        )
    }
}
