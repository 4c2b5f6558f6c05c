//! Calls made for a tenant: who a call acts for travels with it, from a tenant's local client through its
//! node's agent to the home of the region it names, where the home checks it (its own tenants' regions only).
//!
//! Within an agent the tenant is a task-local value ([`acting_for`]), set where a tenant's call enters (a tenant's
//! local client, [`crate::agent::Agent::acting_for`], a peer's `OnBehalf` frame) and carried onto whatever task
//! or thread the call moves to ([`carry`]); a call to a peer then opens its stream with `OnBehalf`. A call
//! without one acts for the node's operator: every region, every call. Peers are trusted to say whom they act
//! for (their certificates make them nodes of the cluster, which act for their own tenants' clients).

use std::future::Future;

use vfabric_allocator::TenantId;

use crate::directory::RegionHandle as Region;
use crate::error::FabricError;

tokio::task_local! {
    static ACTING_FOR: Option<TenantId>;
}

/// The tenant the current call acts for, if any (`None`: the node's operator).
pub(crate) fn tenant() -> Option<TenantId> {
    ACTING_FOR.try_with(|t| *t).ok().flatten()
}

/// Runs `work` acting for `tenant` (for the operator when `None`).
pub(crate) async fn acting_for<F: Future>(tenant: Option<TenantId>, work: F) -> F::Output {
    match tenant {
        Some(t) => ACTING_FOR.scope(Some(t), work).await,
        None => work.await,
    }
}

/// Runs `work` as the node itself, for no tenant, whoever the current call acts for: the fabric's own calls
/// made on a tenant's behalf (a replicated region's standby copies, their writes, a failover), which are the
/// operator's to make.
pub(crate) async fn as_node<F: Future>(work: F) -> F::Output {
    ACTING_FOR.scope(None, work).await
}

/// `work`, acting for whom the current call acts for, wherever it is run (another task, a lane's thread).
pub(crate) fn carry<F: Future>(work: F) -> impl Future<Output = F::Output> {
    acting_for(tenant(), work)
}

/// Whether the current call may touch `region`, whose tenant is `owner` (`None`: no such region here): the
/// operator may touch any; a tenant only its own, and is told nothing else (a region of another tenant and no
/// region are refused alike).
pub(crate) fn may_touch(region: &Region, owner: Option<TenantId>) -> Result<(), FabricError> {
    match tenant() {
        None => Ok(()),
        Some(t) if owner == Some(t) => Ok(()),
        Some(t) => Err(FabricError::PermissionDenied(format!("no region of tenant {} at {region}", t.0))),
    }
}

/// Refuses `what` (one of the operator's calls) to a call made for a tenant.
pub(crate) fn operator_only(what: &str) -> Result<(), FabricError> {
    match tenant() {
        None => Ok(()),
        Some(t) => Err(FabricError::PermissionDenied(format!("{what} is for the operator, not tenant {}", t.0))),
    }
}
