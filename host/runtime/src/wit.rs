//! Contract versions this host serves (the Zed `since_vX_Y_Z` pattern).
//!
//! Each released version of the `egress:provider` contract gets a sibling module that runs
//! `bindgen!` on that version's WIT and converts its types to and from the host's domain types
//! ([`crate::types`]). The rest of the host only sees domain types and [`latest`].

pub(crate) mod since_v0_1_0;

/// The newest contract version; what [`crate::Provider`] instantiates.
pub(crate) use since_v0_1_0 as latest;

/// The WIT package every provider exports its `provider` interface from.
pub const CONTRACT_PACKAGE: &str = "egress:provider";

/// Contract versions this host can serve, newest first.
pub const SUPPORTED: &[&str] = &[since_v0_1_0::VERSION];
