//! Placement policy shared by every allocator in the crate.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Which free extent a request is carved from.
///
/// Named `"first-fit"` / `"best-fit"` in configuration files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fit {
    /// The lowest-addressed extent that is large enough. Keeps allocations packed towards
    /// low addresses, which leaves the high end free for large requests.
    #[default]
    FirstFit,
    /// The smallest extent that is large enough (lowest address among equals). Preserves
    /// large extents at the cost of leaving small slivers behind.
    BestFit,
}

impl fmt::Display for Fit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fit::FirstFit => "first-fit",
            Fit::BestFit => "best-fit",
        })
    }
}
