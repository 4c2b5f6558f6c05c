//! Per-tenant byte quotas on each memory tier.

use std::collections::BTreeMap;

use crate::error::AllocError;
use crate::tenant::{TenantId, Tier};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Account {
    limit: Option<u64>,
    used: u64,
}

/// Byte limits and usage per `(tenant, tier)`.
///
/// A pair without a limit is unlimited, but its usage is still tracked so that a limit set
/// later, or a report, sees the truth. Usage only changes through [`charge`](Self::charge)
/// and [`credit`](Self::credit); allocators charge before they hand memory out and credit
/// when it comes back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuotaBook {
    accounts: BTreeMap<(TenantId, Tier), Account>,
}

impl QuotaBook {
    /// An empty book: every tenant unlimited, nothing used.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets (`Some`) or removes (`None`) the tenant's byte limit on `tier`.
    ///
    /// A limit below current usage is accepted: nothing is revoked, but further charges fail
    /// until usage drops below the limit.
    pub fn set_limit(&mut self, tenant: TenantId, tier: Tier, limit: Option<u64>) {
        let key = (tenant, tier);
        let acct = self.accounts.entry(key).or_default();
        acct.limit = limit;
        self.prune(key);
    }

    /// The tenant's byte limit on `tier` (`None` = unlimited).
    pub fn limit(&self, tenant: TenantId, tier: Tier) -> Option<u64> {
        self.accounts.get(&(tenant, tier)).and_then(|a| a.limit)
    }

    /// Bytes the tenant currently uses on `tier`.
    pub fn used(&self, tenant: TenantId, tier: Tier) -> u64 {
        self.accounts.get(&(tenant, tier)).map_or(0, |a| a.used)
    }

    /// Bytes the tenant may still charge on `tier` (`None` = unlimited). 0 when usage is at
    /// or above the limit.
    pub fn remaining(&self, tenant: TenantId, tier: Tier) -> Option<u64> {
        let acct = self.accounts.get(&(tenant, tier)).copied().unwrap_or_default();
        acct.limit.map(|l| l.saturating_sub(acct.used))
    }

    /// Whether [`charge`](Self::charge) with the same arguments would succeed.
    pub fn can_charge(&self, tenant: TenantId, tier: Tier, bytes: u64) -> bool {
        self.check(tenant, tier, bytes).is_ok()
    }

    /// Adds `bytes` to the tenant's usage on `tier`.
    ///
    /// Fails with [`QuotaExceeded`](AllocError::QuotaExceeded), leaving usage unchanged, if
    /// that would pass the limit. Usage that would overflow `u64` is refused the same way,
    /// reported against a limit of `u64::MAX` when the tenant has none.
    pub fn charge(&mut self, tenant: TenantId, tier: Tier, bytes: u64) -> Result<(), AllocError> {
        let new_used = self.check(tenant, tier, bytes)?;
        if bytes > 0 {
            self.accounts.entry((tenant, tier)).or_default().used = new_used;
        }
        Ok(())
    }

    /// Subtracts `bytes` from the tenant's usage on `tier`.
    ///
    /// Saturates at zero: crediting more than was charged is a caller bug, but accounting
    /// must never panic or wrap around to a huge usage that would lock the tenant out.
    pub fn credit(&mut self, tenant: TenantId, tier: Tier, bytes: u64) {
        let key = (tenant, tier);
        if let Some(acct) = self.accounts.get_mut(&key) {
            acct.used = acct.used.saturating_sub(bytes);
            self.prune(key);
        }
    }

    /// Every `(tenant, tier)` with a limit or non-zero usage, as `(tenant, tier, limit,
    /// used)`, in tenant then tier order.
    pub fn iter(&self) -> impl Iterator<Item = (TenantId, Tier, Option<u64>, u64)> + '_ {
        self.accounts.iter().map(|(&(t, tier), a)| (t, tier, a.limit, a.used))
    }

    /// The usage after charging `bytes`, or the error `charge` would return.
    fn check(&self, tenant: TenantId, tier: Tier, bytes: u64) -> Result<u64, AllocError> {
        let acct = self.accounts.get(&(tenant, tier)).copied().unwrap_or_default();
        let limit = acct.limit.unwrap_or(u64::MAX);
        match acct.used.checked_add(bytes) {
            Some(new_used) if new_used <= limit => Ok(new_used),
            _ => Err(AllocError::QuotaExceeded { tenant, tier, limit, used: acct.used, requested: bytes }),
        }
    }

    /// Drops an account that carries no information, so the book does not grow with every
    /// tenant that ever touched it.
    fn prune(&mut self, key: (TenantId, Tier)) {
        if self.accounts.get(&key).is_some_and(|a| a.limit.is_none() && a.used == 0) {
            self.accounts.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: TenantId = TenantId(1);

    #[test]
    fn unlimited_tenants_are_tracked() {
        let mut q = QuotaBook::new();
        assert_eq!(q.limit(T, Tier::Gpu), None);
        assert_eq!(q.remaining(T, Tier::Gpu), None);
        q.charge(T, Tier::Gpu, 100).unwrap();
        assert_eq!(q.used(T, Tier::Gpu), 100);
        assert_eq!(q.used(T, Tier::Host), 0);
        assert_eq!(q.used(TenantId(2), Tier::Gpu), 0);
        q.credit(T, Tier::Gpu, 40);
        assert_eq!(q.used(T, Tier::Gpu), 60);
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![(T, Tier::Gpu, None, 60)]);
    }

    #[test]
    fn limits_are_enforced_exactly() {
        let mut q = QuotaBook::new();
        q.set_limit(T, Tier::Gpu, Some(100));
        assert!(q.can_charge(T, Tier::Gpu, 100));
        assert!(!q.can_charge(T, Tier::Gpu, 101));
        q.charge(T, Tier::Gpu, 60).unwrap();
        assert_eq!(q.remaining(T, Tier::Gpu), Some(40));
        assert_eq!(
            q.charge(T, Tier::Gpu, 41),
            Err(AllocError::QuotaExceeded { tenant: T, tier: Tier::Gpu, limit: 100, used: 60, requested: 41 })
        );
        assert_eq!(q.used(T, Tier::Gpu), 60);
        q.charge(T, Tier::Gpu, 40).unwrap();
        assert_eq!(q.remaining(T, Tier::Gpu), Some(0));
        // Other tiers are independent.
        q.charge(T, Tier::Host, 1000).unwrap();
    }

    #[test]
    fn zero_limit_allows_only_zero() {
        let mut q = QuotaBook::new();
        q.set_limit(T, Tier::Nvme, Some(0));
        assert!(q.charge(T, Tier::Nvme, 1).is_err());
        q.charge(T, Tier::Nvme, 0).unwrap();
        assert_eq!(q.used(T, Tier::Nvme), 0);
    }

    #[test]
    fn limit_below_usage_blocks_further_charges() {
        let mut q = QuotaBook::new();
        q.charge(T, Tier::Gpu, 100).unwrap();
        q.set_limit(T, Tier::Gpu, Some(50));
        assert_eq!(q.used(T, Tier::Gpu), 100);
        assert_eq!(q.remaining(T, Tier::Gpu), Some(0));
        assert!(q.charge(T, Tier::Gpu, 1).is_err());
        q.set_limit(T, Tier::Gpu, None);
        q.charge(T, Tier::Gpu, 1).unwrap();
    }

    #[test]
    fn credit_saturates_and_prunes() {
        let mut q = QuotaBook::new();
        q.charge(T, Tier::Gpu, 10).unwrap();
        q.credit(T, Tier::Gpu, 100);
        assert_eq!(q.used(T, Tier::Gpu), 0);
        assert_eq!(q.iter().count(), 0);
        q.credit(TenantId(9), Tier::Host, 5);
        assert_eq!(q.iter().count(), 0);
        q.set_limit(T, Tier::Gpu, Some(5));
        q.set_limit(T, Tier::Gpu, None);
        assert_eq!(q, QuotaBook::new());
    }

    #[test]
    fn overflow_is_refused() {
        let mut q = QuotaBook::new();
        q.charge(T, Tier::Gpu, u64::MAX).unwrap();
        assert_eq!(
            q.charge(T, Tier::Gpu, 1),
            Err(AllocError::QuotaExceeded {
                tenant: T,
                tier: Tier::Gpu,
                limit: u64::MAX,
                used: u64::MAX,
                requested: 1
            })
        );
    }

    #[test]
    fn display() {
        assert_eq!(TenantId(4).to_string(), "4");
        assert_eq!(TenantId::default(), TenantId(0));
        let names: Vec<_> = Tier::ALL.iter().map(|t| t.to_string()).collect();
        assert_eq!(names, ["gpu", "host", "nvme"]);
    }
}
