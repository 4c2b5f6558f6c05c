//! Where a local client's calls run: the agent's runtime, reached from the client's own thread, acting for the
//! client's tenant (`crate::agent::acting`), so that every call it makes, here or at other nodes, is held to that
//! tenant's regions.

use std::future::Future;

use tokio::runtime::Handle;
use vfabric_allocator::TenantId;

use crate::agent::acting;

/// The agent's runtime as one client's thread uses it.
pub(super) struct Runner {
    rt: Handle,
    tenant: Option<TenantId>,
}

impl Runner {
    /// Calls for a client of `tenant` (`None`: the node's operator) on `rt`.
    pub(super) fn new(rt: Handle, tenant: Option<TenantId>) -> Runner {
        Runner { rt, tenant }
    }

    /// Runs `work` to its end on this thread.
    pub(super) fn block_on<F: Future>(&self, work: F) -> F::Output {
        self.rt.block_on(acting::acting_for(self.tenant, work))
    }

    /// Starts `work` on the runtime, without waiting for it.
    pub(super) fn spawn<F>(&self, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.rt.spawn(acting::acting_for(self.tenant, work));
    }
}
