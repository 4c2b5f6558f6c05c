//! Tenants and memory tiers: the names that quotas, allocators and their errors all use, so they live apart
//! from each of them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Identifies a tenant (a job or user sharing the fabric). Tenant 0 is the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TenantId(pub u32);

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A memory tier. Named `"gpu"`, `"host"`, `"nvme"` in configuration files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Device memory of a GPU.
    Gpu,
    /// Host DRAM.
    Host,
    /// NVMe storage used as the slowest tier.
    Nvme,
}

impl Tier {
    /// Every tier, fastest first.
    pub const ALL: [Tier; 3] = [Tier::Gpu, Tier::Host, Tier::Nvme];
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::Gpu => "gpu",
            Tier::Host => "host",
            Tier::Nvme => "nvme",
        })
    }
}
