//! Integration tests of the egress broker: direct calls over real TLS, then real provider
//! components through the runtime.

mod broker;
mod exchange;
mod grants;
mod hostile;
mod memory;
mod reflection;
mod refusals;
mod support;
mod through_runtime;
