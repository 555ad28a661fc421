//! A hypervisor that never answers: a TCP listener that accepts and stays silent, dialed as
//! `qemu+tcp://`. libvirt's open blocks on it; the guest must get `timeout` at the per-call
//! timeout or the operation's deadline, whichever comes first, and a probe of several
//! connections must not wait on it for the others.

use std::time::{Duration, Instant};

use egress_capability_libvirt::bindings::egress::libvirt::libvirt::{Error, HostConnection};

use crate::support::*;

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

/// K33: `probe` dials every connection at once, so a hypervisor that never answers costs the
/// others nothing: the test driver behind the silent one answers, and the whole probe takes the
/// probe's timeout, not one per connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_dials_every_connection_at_once_and_a_silent_one_times_out_alone() {
    let (first, second) = (Silent::start().await, Silent::start().await);
    let node = TestNode::new();
    let mut grant = node.grant();
    let connections = grant["connections"].as_array_mut().unwrap();
    connections.push(first.connection("silent1", "images"));
    connections.push(second.connection("silent2", "images"));
    let capability = capability("kvm2", grant);
    let mut call = Call::new(&capability, "kvm2");
    let names = ["silent1", "node", "silent2", "ungranted"].map(String::from);
    let started = Instant::now();
    let answers = ok(bounded(HostConnection::probe(
        &mut call.view(),
        names.to_vec(),
        "images".into(),
        1000,
    ))
    .await);
    let took = started.elapsed();
    assert!(matches!(answers[0], Err(Error::Timeout)), "{answers:?}");
    let health = answers[1].as_ref().expect("the test driver answers");
    assert!(health.version.starts_with(char::is_numeric), "{health:?}");
    assert!(health.pool.capacity > 0, "{health:?}");
    assert!(matches!(answers[2], Err(Error::Timeout)), "{answers:?}");
    assert!(matches!(&answers[3], Err(Error::Denied(_))), "{answers:?}");
    assert!(took < Duration::from_millis(1900), "{took:?}");
    // A pool the connection does not grant is denied before any dial.
    let answers =
        ok(
            HostConnection::probe(&mut call.view(), vec!["node".into()], "other".into(), 1000)
                .await,
        );
    assert!(matches!(&answers[0], Err(Error::Denied(_))), "{answers:?}");
    let too_many = err(HostConnection::probe(
        &mut call.view(),
        vec!["node".into(); 65],
        "images".into(),
        1000,
    )
    .await);
    assert!(matches!(too_many, Error::Invalid(_)), "{too_many:?}");
}
