//! A hypervisor that never answers: a TCP listener that accepts and stays silent, dialed as
//! `qemu+tcp://`. libvirt's open blocks on it; the guest must get `timeout` at the per-call
//! timeout or the operation's deadline, whichever comes first.

use std::time::{Duration, Instant};

use egress_capability_libvirt::bindings::egress::libvirt::libvirt::{Error, HostConnection};
use tokio::net::TcpListener;

use crate::support::*;

/// Accepts connections and holds them open without a byte; dropping it closes them (which
/// releases the blocked libvirt threads).
struct Silent {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Silent {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        Self { port, task }
    }

    fn grant(&self, call_ms: u64) -> serde_json::Value {
        serde_json::json!({
            "connections": [{
                "name": "hung",
                "uri": format!("qemu+tcp://127.0.0.1:{}/system", self.port),
            }],
            "timeouts": { "callMs": call_ms },
        })
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The call's outcome, failing the test if the host let it run 10 s (the bound the host broke).
async fn bounded<T>(call: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the host did not time the call out")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_hypervisor_times_out_at_the_call_timeout() {
    let silent = Silent::start().await;
    let capability = capability("kvm2", silent.grant(300));
    let mut call = Call::new(&capability, "kvm2");
    let started = Instant::now();
    let error = err(bounded(call.view().open("hung".into())).await);
    let took = started.elapsed();
    assert!(matches!(error, Error::Timeout), "{error:?}");
    assert!(took >= Duration::from_millis(250), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operation_deadline_cuts_a_longer_call_timeout_short() {
    let silent = Silent::start().await;
    let capability = capability("kvm2", silent.grant(120_000));
    let mut call = Call::until(
        &capability,
        "kvm2",
        Instant::now() + Duration::from_millis(300),
    );
    let started = Instant::now();
    let error = err(bounded(call.view().open_unpooled("hung".into())).await);
    assert!(matches!(error, Error::Timeout), "{error:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_passed_deadline_times_out_without_calling_libvirt() {
    let node = TestNode::new();
    let capability = capability("kvm2", node.grant());
    let mut call = Call::until(&capability, "kvm2", Instant::now());
    let error = err(call.view().open("node".into()).await);
    assert!(matches!(error, Error::Timeout), "{error:?}");
}
