//! Integration tests of the libvirt capability: the host traits called directly on a
//! `LibvirtCtxView` over a real `ResourceTable`, against libvirt's test driver (a private node
//! per test) and a real `libvirtd` (started once when not running), plus an HTTPS image origin.

mod daemon;
mod denials;
mod provider;
mod runtime;
mod ssh;
mod support;
mod test_driver;
mod timeouts;
