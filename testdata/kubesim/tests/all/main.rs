//! kubesim driven only through kube 5's real client (and, for the binary, a kubeconfig).

mod binary;
mod common;
mod crd;
mod crud;
mod events;
mod faults;
mod finalizer;
mod lease;
mod select;
mod watch;
