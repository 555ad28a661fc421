//! Each VM's proxy service (`--service-port`, [`SimConfig::service_port`](crate::SimConfig)):
//! what an operator's health probe reaches at the address the VM's guest agent reports.
//!
//! With the option, every VM's agent, on whichever node the VM lives, reports an address of its
//! own on loopback ([`service_ip`](crate::service_ip), in 127.77.0.0/16: Linux routes all of
//! 127/8 to `lo`, so binding needs no setup), and while the VM runs (`qmpstatus: running`) the simulator listens
//! there at the port: it accepts TCP and answers `CONNECT <target> HTTP/1.1` with
//! `HTTP/1.1 200 Connection established`, then closes (no tunnel is made). A VM that is stopped,
//! paused, suspended or otherwise stuck, or deleted, does not listen: a connection is refused.
//! The admin API breaks a VM's service without touching the VM ([`ServiceMode`]).
//!
//! The listeners follow the state the moment it changes: every release of the state's lock
//! opens or closes them ([`Services::follow`]), so a caller that sees a VM stopped also finds its
//! port closed, and one that sees a start task end finds it open.

use std::collections::BTreeMap;
use std::future::poll_fn;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::task::Poll;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::api::{Server, qemu_on_any_node_mut};
use crate::reply::ApiError;
use crate::state::{Guest, GuestKind, RunState};

/// How a running VM's service behaves, set through the admin API
/// (`POST /_sim/vms/{vmid}/service`) or [`Simulator::set_service`](crate::Simulator).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ServiceMode {
    /// Accepts TCP and answers `CONNECT` with 200 (the default).
    #[default]
    Ok,
    /// Does not listen: connections are refused, as when the proxy process is down.
    Refuse,
    /// Accepts TCP and never answers, as a wedged proxy.
    Hang,
    /// Answers `CONNECT` with `503 Service Unavailable`.
    Error,
}

impl ServiceMode {
    /// The mode a word of the admin API names: `ok`, `refuse`, `hang` or `error`.
    pub fn from_word(word: &str) -> Option<ServiceMode> {
        match word {
            "ok" => Some(ServiceMode::Ok),
            "refuse" => Some(ServiceMode::Refuse),
            "hang" => Some(ServiceMode::Hang),
            "error" => Some(ServiceMode::Error),
            _ => None,
        }
    }
}

/// The most of a request's head a service reads before giving up on it.
const MAX_REQUEST_HEAD: usize = 8192;

/// The services of every VM: their modes and the listeners open now.
pub(crate) struct Services {
    port: u16,
    runtime: tokio::runtime::Handle,
    modes: BTreeMap<u32, ServiceMode>,
    open: BTreeMap<u32, OpenService>,
}

/// A listening service. Dropping it closes the listener at once and ends its connections.
struct OpenService {
    address: IpAddr,
    listener: Arc<Mutex<Option<TcpListener>>>,
    mode: watch::Sender<ServiceMode>,
}

impl Drop for OpenService {
    fn drop(&mut self) {
        // Closed here rather than when the accept task next runs: the caller that stopped the
        // VM must find the port refusing when its call returns.
        drop(lock(&self.listener).take());
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Services {
    /// Services at `port`, their tasks on the runtime of the caller (the simulator's).
    pub(crate) fn new(port: u16) -> Services {
        Services {
            port,
            runtime: tokio::runtime::Handle::current(),
            modes: BTreeMap::new(),
            open: BTreeMap::new(),
        }
    }

    /// The port every VM's service listens at.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Opens the service of every running VM whose mode is not `refuse`, at the address its
    /// agent reports, and closes every other; forgets the modes of VMs that are gone.
    pub(crate) fn follow(&mut self, guests: &BTreeMap<u32, Guest>) {
        self.modes.retain(|vmid, _| guests.contains_key(vmid));
        let wanted: BTreeMap<u32, (IpAddr, ServiceMode)> = guests
            .iter()
            .filter(|(_, guest)| {
                guest.kind == GuestKind::Qemu
                    && guest.run == RunState::Running
                    && !guest.placeholder
            })
            .filter_map(|(vmid, guest)| {
                let mode = self.modes.get(vmid).copied().unwrap_or_default();
                let address = guest.guest_ip.parse().ok()?;
                (mode != ServiceMode::Refuse).then_some((*vmid, (address, mode)))
            })
            .collect();
        self.open.retain(|vmid, open| {
            wanted
                .get(vmid)
                .is_some_and(|(address, _)| *address == open.address)
        });
        for (vmid, (address, mode)) in wanted {
            match self.open.get(&vmid) {
                Some(open) => {
                    open.mode
                        .send_if_modified(|current| std::mem::replace(current, mode) != mode);
                }
                // An address that cannot be bound (another process holds it, or a test set a
                // guest address that is not local) leaves that VM's service closed.
                None => {
                    if let Some(open) = self.listen(address, mode) {
                        self.open.insert(vmid, open);
                    }
                }
            }
        }
    }

    fn listen(&self, address: IpAddr, mode: ServiceMode) -> Option<OpenService> {
        let listener = std::net::TcpListener::bind((address, self.port)).ok()?;
        listener.set_nonblocking(true).ok()?;
        let _runtime = self.runtime.enter();
        let listener = Arc::new(Mutex::new(Some(TcpListener::from_std(listener).ok()?)));
        let (mode, modes) = watch::channel(mode);
        self.runtime.spawn(accept_loop(listener.clone(), modes));
        Some(OpenService {
            address,
            listener,
            mode,
        })
    }
}

/// Sets VM `vmid`'s service mode, whichever node it lives on; its listener follows when the
/// state's lock is released.
pub(crate) fn set_mode(server: &Server, vmid: u32, mode: ServiceMode) -> Result<(), ApiError> {
    let mut inner = server.state.lock();
    qemu_on_any_node_mut(&mut inner, vmid)?;
    let services = inner.services.as_mut().ok_or_else(|| {
        ApiError::new(
            400,
            "pvesim runs without a service port (--service-port): VMs have no service",
        )
    })?;
    services.modes.insert(vmid, mode);
    Ok(())
}

/// Accepts until the listener is closed or its service is dropped.
async fn accept_loop(
    listener: Arc<Mutex<Option<TcpListener>>>,
    mut modes: watch::Receiver<ServiceMode>,
) {
    loop {
        let accept = poll_fn(|context| match &*lock(&listener) {
            Some(listener) => listener.poll_accept(context).map(Some),
            None => Poll::Ready(None),
        });
        let accepted = tokio::select! {
            changed = modes.changed() => match changed {
                Ok(()) => continue,
                Err(_dropped) => return,
            },
            accepted = accept => accepted,
        };
        match accepted {
            None => return,
            Some(Ok((stream, _peer))) => {
                tokio::spawn(serve(stream, modes.clone()));
            }
            Some(Err(_)) => continue,
        }
    }
}

/// Serves one connection in the mode set when it arrived, until it is done or the VM's service
/// closes (the VM stopped).
async fn serve(stream: TcpStream, mut modes: watch::Receiver<ServiceMode>) {
    let mode = *modes.borrow_and_update();
    let closed = async { while modes.changed().await.is_ok() {} };
    tokio::select! {
        () = answer(stream, mode) => {}
        () = closed => {}
    }
}

async fn answer(mut stream: TcpStream, mode: ServiceMode) {
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|window| window == b"\r\n\r\n") {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            // A wedged proxy takes the request in and never answers.
            Ok(_) if mode == ServiceMode::Hang => {}
            Ok(read) => head.extend_from_slice(&chunk[..read]),
        }
        if head.len() > MAX_REQUEST_HEAD {
            return;
        }
    }
    let reply: &[u8] = match mode {
        _ if !head.starts_with(b"CONNECT ") => {
            b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n"
        }
        ServiceMode::Error => b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
        _ => b"HTTP/1.1 200 Connection established\r\n\r\n",
    };
    let _ = stream.write_all(reply).await;
    let _ = stream.shutdown().await;
}
