//! Which tenant a local client acts as, and what that tenant may ask. The Unix socket's peer credentials decide
//! who a client is: the agent's own user is the node's operator (any tenant, every call); a user a
//! `[[tenant]]` lists in `uids` acts as that tenant only; anyone else is refused at the door. A tenant's client
//! allocates and reserves only under its own name, touches only its own tenant's regions (at this node, checked
//! here; at other nodes, by their homes, as its calls go there acting for its tenant: `crate::agent::acting`; a
//! handle of another tenant's region and a handle naming none get the same answer, so it learns nothing about
//! the others), and cannot make the operator's calls: mapping the node's memory (which would show it every
//! tenant's pages), acquires through that mapping, migrations, and the node's figures.

use vfabric_allocator::TenantId;

use crate::agent::shared::Agent;
use crate::config::TenantSection;
use crate::directory::RegionHandle as Region;
use crate::error::FabricError;
use crate::proto::message::{Message, WireRegion};

/// Who a local client is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Caller {
    /// The agent's own user: any tenant, every call.
    Operator,
    /// A user a `[[tenant]]` lists: that tenant only.
    Tenant(TenantId),
}

/// Who the client of Unix user `uid` is to an agent running as `agent_uid`; `None` for a user the agent does
/// not serve.
pub(super) fn caller_of(uid: u32, agent_uid: u32, tenants: &[TenantSection]) -> Option<Caller> {
    if uid == agent_uid {
        return Some(Caller::Operator);
    }
    tenants.iter().find(|t| t.uids.contains(&uid)).map(|t| Caller::Tenant(TenantId(t.id)))
}

/// Whether any tenant admits users other than the agent's (the socket must then let them connect).
pub(super) fn admits_others(tenants: &[TenantSection]) -> bool {
    tenants.iter().any(|t| !t.uids.is_empty())
}

/// What a message needs of a tenant's client.
enum Need<'a> {
    /// Nothing: pings, plain allocations (charged to its tenant, here: `server.rs`), its own leases and
    /// reservations (held in its session).
    Nothing,
    /// Its tenant's name where the message names one (0, the default, stands for its own).
    OwnName(&'a mut u32),
    /// A region of its tenant at this node.
    OwnRegion(&'a WireRegion),
    /// The operator's call.
    Operator(&'static str),
}

fn need(msg: &mut Message) -> Need<'_> {
    match msg {
        Message::AllocWith { tenant, .. } | Message::Reserve { tenant, .. } => Need::OwnName(tenant),
        Message::Free { region }
        | Message::Prefetch { region, .. }
        | Message::WriteBack { region, .. }
        | Message::Write { region, .. }
        | Message::Read { region, .. } => Need::OwnRegion(region),
        Message::Attach => Need::Operator("mapping the node's memory"),
        Message::AcquireMapped { .. } => Need::Operator("an acquire through the node's mapped memory"),
        Message::Migrate { .. } => Need::Operator("a migration"),
        Message::Stats => Need::Operator("the node's figures"),
        Message::Status { .. } => Need::Operator("the node's status"),
        _ => Need::Nothing,
    }
}

impl Agent {
    /// Checks a tenant's client's message (and names the tenant on its allocations and reservations): `Err` is
    /// the refusal to answer with.
    pub(super) fn authorise(&self, tenant: TenantId, msg: &mut Message) -> Result<(), FabricError> {
        match need(msg) {
            Need::Nothing => Ok(()),
            Need::OwnName(name) if *name == 0 || *name == tenant.0 => {
                *name = tenant.0;
                Ok(())
            }
            Need::OwnName(name) => {
                Err(FabricError::PermissionDenied(format!("tenant {} cannot act for tenant {name}", tenant.0)))
            }
            Need::OwnRegion(region) => {
                let r = Region::from(region);
                // Another node's region: its home checks it (the call goes there acting for the tenant).
                if !self.is_me(r.addr.node().0) {
                    return Ok(());
                }
                if self.fabric().tenant_of(&r).ok() == Some(tenant) {
                    Ok(())
                } else {
                    Err(FabricError::PermissionDenied(format!("no region of tenant {} at {r}", tenant.0)))
                }
            }
            Need::Operator(what) => Err(FabricError::PermissionDenied(format!("{what} is for the node's operator"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(id: u32, uids: &[u32]) -> TenantSection {
        TenantSection { id, gpu: None, host: None, storage: None, uids: uids.to_vec() }
    }

    #[test]
    fn credentials_decide_who_a_client_is() {
        let tenants = [tenant(3, &[1001, 1002]), tenant(4, &[]), tenant(5, &[1003])];
        assert_eq!(caller_of(1000, 1000, &tenants), Some(Caller::Operator));
        assert_eq!(caller_of(1002, 1000, &tenants), Some(Caller::Tenant(TenantId(3))));
        assert_eq!(caller_of(1003, 1000, &tenants), Some(Caller::Tenant(TenantId(5))));
        assert_eq!(caller_of(0, 1000, &tenants), None, "root is not the operator of another user's agent");
        assert_eq!(caller_of(65534, 1000, &tenants), None);
        assert!(admits_others(&tenants) && !admits_others(&[tenant(4, &[])]));
    }

    #[test]
    fn a_tenant_names_only_itself_and_leaves_the_operators_calls_alone() {
        let mut own = Message::Reserve { device: vfabric_allocator::Location::Host.into(), bytes: 1, tenant: 0 };
        assert!(matches!(need(&mut own), Need::OwnName(t) if *t == 0));
        for m in [Message::Attach, Message::Stats] {
            let mut m = m;
            assert!(matches!(need(&mut m), Need::Operator(_)), "{m:?}");
        }
        assert!(matches!(need(&mut Message::Ping { nonce: 1 }), Need::Nothing));
    }
}
