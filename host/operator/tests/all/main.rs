//! The operator's tests: one binary, so that its support is compiled and linked once.
//!
//! Each module is what a user or a cluster does with the operator, against real parts: the
//! `egress-operator` binary ([`cli`], [`local_mode`], [`recovery`]), the Proxmox provider through
//! the runtime and broker to `pvesim` ([`proxmox`], [`python_proxmox`]), the conformance suite
//! ([`conformance`]), the example provider ([`example_inventory`]), providers as OCI images in a
//! real registry ([`oci`], [`images`]), a real kube-apiserver and etcd ([`kube_mode`],
//! [`kubectl`]), a real `libvirtd` ([`libvirt`]) and the manifests of `deploy/` ([`deploy`]).
//! The `*_support` modules are what they share.

mod cli;
mod conformance;
mod conformance_tape;
mod deploy;
mod example_inventory;
mod example_python;
mod images;
mod kube_mode;
mod kube_pools;
mod kubectl;
mod libvirt;
mod local_mode;
mod oci;
mod pools;
mod proxmox;
mod python_proxmox;
mod recordings;
mod recovery;

mod cluster_support;
mod conformance_support;
mod local_support;
mod metrics_support;
mod oci_support;
mod proxmox_support;
