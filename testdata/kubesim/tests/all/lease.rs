//! Leader election with kube-lease-manager: two managers on one Lease.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;

use crate::common::{eventually, start};

async fn manager(client: &Client, lease: &str, identity: &str) -> LeaseManager {
    LeaseManagerBuilder::new(client.clone(), lease)
        .with_namespace("default")
        .with_identity(identity)
        .with_duration(2)
        .with_grace(1)
        .build()
        .await
        .unwrap()
}

fn leads(rx: &watch::Receiver<bool>) -> bool {
    *rx.borrow()
}

async fn holder(api: &Api<Lease>, name: &str) -> Option<String> {
    api.get(name).await.unwrap().spec?.holder_identity
}

/// Starts managers `a` and `b`, waits for one to lead, and checks over a few renewals that
/// the other never does. Returns (leader, follower) receivers and tasks, leader first.
async fn elect(
    client: &Client,
    lease: &str,
) -> [(
    watch::Receiver<bool>,
    tokio::task::JoinHandle<kube_lease_manager::Result<LeaseManager>>,
    &'static str,
); 2] {
    let (rx_a, task_a) = manager(client, lease, "a").await.watch().await;
    let (rx_b, task_b) = manager(client, lease, "b").await.watch().await;
    eventually("someone leads", Duration::from_secs(10), || async {
        leads(&rx_a) || leads(&rx_b)
    })
    .await;
    let api: Api<Lease> = Api::namespaced(client.clone(), "default");
    let first_renewal = api.get(lease).await.unwrap().spec.unwrap().renew_time;
    // Watch the pair across more than a lease duration: one leader, renewing, all along.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert!(!(leads(&rx_a) && leads(&rx_b)), "two leaders");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let later = api.get(lease).await.unwrap().spec.unwrap();
    assert_ne!(later.renew_time, first_renewal, "the leader renews");
    let a = (rx_a, task_a, "a");
    let b = (rx_b, task_b, "b");
    let [leader, follower] = if leads(&a.0) { [a, b] } else { [b, a] };
    assert!(leads(&leader.0) && !leads(&follower.0));
    assert_eq!(holder(&api, lease).await.as_deref(), Some(leader.2));
    [leader, follower]
}

#[tokio::test]
async fn leadership_moves_when_the_leader_releases() {
    let (_sim, client) = start().await;
    let [
        (leader_rx, leader_task, _),
        (follower_rx, _follower_task, follower),
    ] = elect(&client, "release").await;
    // Dropping the receiver makes the manager release the lease and stop.
    drop(leader_rx);
    leader_task.await.unwrap().unwrap();
    eventually(
        "the follower takes over",
        Duration::from_secs(10),
        || async { leads(&follower_rx) },
    )
    .await;
    let api: Api<Lease> = Api::namespaced(client, "default");
    assert_eq!(holder(&api, "release").await.as_deref(), Some(follower));
}

#[tokio::test]
async fn leadership_moves_when_the_leaders_lease_expires() {
    let (_sim, client) = start().await;
    let [
        (_leader_rx, leader_task, leader),
        (follower_rx, _follower_task, follower),
    ] = elect(&client, "expire").await;
    // A leader that dies without releasing: its lease runs out after 2 s.
    leader_task.abort();
    let api: Api<Lease> = Api::namespaced(client, "default");
    assert_eq!(holder(&api, "expire").await.as_deref(), Some(leader));
    eventually(
        "the follower takes over",
        Duration::from_secs(15),
        || async { leads(&follower_rx) },
    )
    .await;
    let spec = api.get("expire").await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(follower));
    assert!(spec.lease_transitions.unwrap_or(0) >= 2);
}
