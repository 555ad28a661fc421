//! # egress-ownership: whose VM is it
//!
//! The operator deletes a VM only when it is provably this installation's and this Proxy's.
//! What proves it lives here, apart from the reconcilers that rely on it:
//!
//! - [`installation`]: an installation's name (a cluster, a local-mode folder), written into
//!   every VM it makes, so several installations can share a hypervisor;
//! - [`marks`]: the ownership mark on a VM (the Proxy's UID, the tags naming the installation,
//!   the ProviderConfig and the Proxy) and the VM's name derived from the UID.

#![warn(missing_docs)]

pub mod installation;
pub mod marks;
