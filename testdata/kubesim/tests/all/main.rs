//! kubesim driven only through kube 5's real client (and, for the binary, a kubeconfig; for
//! `kubectl.rs`, the `kubectl` on PATH).

mod binary;
mod common;
mod crd;
mod crud;
mod events;
mod faults;
mod finalizer;
mod kubectl;
mod lease;
mod openapi;
mod select;
mod table;
mod validation;
mod watch;
