//! kube's watcher and reflector against the simulator: changes, forced closes, 410 and relists,
//! streaming lists, label-selected watches and metadata watches.

use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{
    DeleteParams, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event, watcher};
use kube::runtime::{WatchStreamExt, reflector};
use kube::{Api, Resource, ResourceExt};
use kubesim::{KubeSim, SimConfig};
use serde_json::json;
use tokio::sync::mpsc;

use crate::common::{configmap, eventually, start};

/// Runs a watcher stream in the background, describing each item as a short string.
fn describe<K, S>(stream: S) -> mpsc::UnboundedReceiver<String>
where
    K: Resource + Send + 'static,
    S: Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            let text = match item {
                Ok(Event::Init) => "init".to_string(),
                Ok(Event::InitApply(o)) => {
                    format!("init-apply {}", o.meta().name.clone().unwrap_or_default())
                }
                Ok(Event::InitDone) => "init-done".to_string(),
                Ok(Event::Apply(o)) => {
                    format!("apply {}", o.meta().name.clone().unwrap_or_default())
                }
                Ok(Event::Delete(o)) => {
                    format!("delete {}", o.meta().name.clone().unwrap_or_default())
                }
                Err(watcher::Error::WatchError(status)) => format!("error {}", status.code),
                Err(e) => format!("failed {e}"),
            };
            if tx.send(text).is_err() {
                return;
            }
        }
    });
    rx
}

async fn expect(rx: &mut mpsc::UnboundedReceiver<String>, wanted: &[&str]) {
    for want in wanted {
        let got = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {want:?}"))
            .expect("the watcher runs");
        assert_eq!(&got, want);
    }
}

/// (LIST requests, WATCH requests) sent for ConfigMaps in `default`.
fn list_and_watch_counts(sim: &KubeSim) -> (usize, usize) {
    let calls: Vec<_> = sim
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path == "/api/v1/namespaces/default/configmaps")
        .collect();
    let watches = calls
        .iter()
        .filter(|r| r.query.contains("watch=true"))
        .count();
    (calls.len() - watches, watches)
}

#[tokio::test]
async fn watcher_sees_changes_and_resumes_after_a_forced_close() {
    let (sim, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let pp = PostParams::default();
    api.create(&pp, &configmap("a", &[], &[])).await.unwrap();
    let mut rx = describe(watcher(api.clone(), watcher::Config::default()));
    expect(&mut rx, &["init", "init-apply a", "init-done"]).await;
    eventually("the watch is open", Duration::from_secs(5), || async {
        sim.open_watches() == 1
    })
    .await;

    api.create(&pp, &configmap("b", &[], &[])).await.unwrap();
    let patch = Patch::Merge(json!({ "data": { "k": "v" } }));
    api.patch("b", &PatchParams::default(), &patch)
        .await
        .unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();
    expect(&mut rx, &["apply b", "apply b", "delete b"]).await;

    sim.close_watches();
    api.create(&pp, &configmap("c", &[], &[])).await.unwrap();
    expect(&mut rx, &["apply c"]).await;
    let (lists, watches) = list_and_watch_counts(&sim);
    assert_eq!(
        (lists, watches),
        (1, 2),
        "resumed from its resourceVersion, no relist"
    );
    let resumed = sim
        .requests()
        .into_iter()
        .rfind(|r| r.query.contains("watch=true"))
        .unwrap();
    let version = resumed
        .query
        .split('&')
        .find(|p| p.starts_with("resourceVersion="));
    assert_ne!(
        version,
        Some("resourceVersion=0"),
        "resumed at a version, not from scratch"
    );
}

#[tokio::test]
async fn watcher_relists_after_410_gone() {
    let (sim, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    api.create(&pp, &configmap("a", &[], &[])).await.unwrap();
    let mut rx = describe(watcher(api.clone(), watcher::Config::default()));
    expect(&mut rx, &["init", "init-apply a", "init-done"]).await;

    // Move the resourceVersion past what the watcher has seen, then forget the history.
    let secrets: Api<Secret> = Api::namespaced(client, "default");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("s".into()),
            ..ObjectMeta::default()
        },
        ..Secret::default()
    };
    secrets.create(&pp, &secret).await.unwrap();
    sim.compact();
    sim.close_watches();
    expect(&mut rx, &["error 410", "init", "init-apply a", "init-done"]).await;
    api.create(&pp, &configmap("b", &[], &[])).await.unwrap();
    expect(&mut rx, &["apply b"]).await;
    assert_eq!(
        list_and_watch_counts(&sim).0,
        2,
        "listed again after the 410"
    );
}

#[tokio::test]
async fn streaming_list_watcher_gets_initial_events_then_changes() {
    let (sim, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let pp = PostParams::default();
    api.create(&pp, &configmap("a", &[], &[])).await.unwrap();
    let config = watcher::Config::default().streaming_lists();
    let mut rx = describe(watcher(api.clone(), config));
    expect(&mut rx, &["init", "init-apply a", "init-done"]).await;
    api.create(&pp, &configmap("b", &[], &[])).await.unwrap();
    expect(&mut rx, &["apply b"]).await;
    let (lists, watches) = list_and_watch_counts(&sim);
    assert_eq!((lists, watches), (0, 1));
    assert!(
        sim.requests()
            .iter()
            .any(|r| r.query.contains("sendInitialEvents=true"))
    );
}

#[tokio::test]
async fn reflector_follows_a_label_selected_set() {
    let (_sim, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let pp = PostParams::default();
    api.create(&pp, &configmap("web", &[("app", "web")], &[]))
        .await
        .unwrap();
    api.create(&pp, &configmap("db", &[("app", "db")], &[]))
        .await
        .unwrap();
    let (store, writer) = reflector::store();
    let config = watcher::Config::default().labels("app=web");
    let stream = reflector(writer, watcher(api.clone(), config)).default_backoff();
    tokio::spawn(stream.for_each(|_| async {}));
    store.wait_until_ready().await.unwrap();
    let names = || {
        let mut names: Vec<String> = store.state().iter().map(|o| o.name_any()).collect();
        names.sort();
        names
    };
    assert_eq!(names(), ["web"]);

    api.create(&pp, &configmap("web2", &[("app", "web")], &[]))
        .await
        .unwrap();
    let relabel = Patch::Merge(json!({ "metadata": { "labels": { "app": "web" } } }));
    api.patch("db", &PatchParams::default(), &relabel)
        .await
        .unwrap();
    eventually("web2 and db enter", Duration::from_secs(5), || async {
        names() == ["db", "web", "web2"]
    })
    .await;
    let leave = Patch::Merge(json!({ "metadata": { "labels": { "app": null } } }));
    api.patch("web", &PatchParams::default(), &leave)
        .await
        .unwrap();
    api.delete("web2", &DeleteParams::default()).await.unwrap();
    eventually("web leaves, web2 goes", Duration::from_secs(5), || async {
        names() == ["db"]
    })
    .await;
}

#[tokio::test]
async fn metadata_watcher_sees_partial_objects() {
    let (_sim, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    api.create(&pp, &configmap("a", &[], &[("k", "v")]))
        .await
        .unwrap();
    let partial: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(client, "default");
    let mut rx = describe(watcher(partial, watcher::Config::default()));
    expect(&mut rx, &["init", "init-apply a", "init-done"]).await;
    api.delete("a", &DeleteParams::default()).await.unwrap();
    expect(&mut rx, &["delete a"]).await;
}

#[tokio::test]
async fn raw_watches_end_at_their_timeout_and_get_bookmarks() {
    let sim = KubeSim::start_with(SimConfig {
        bookmark_interval: Duration::from_millis(100),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let config = kube::Config::new(sim.url().parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let api: Api<ConfigMap> = Api::all(client.clone());
    let params = WatchParams::default().timeout(1);
    let started = std::time::Instant::now();
    let events: Vec<_> = api
        .watch(&params, &sim.resource_version().to_string())
        .await
        .unwrap()
        .collect()
        .await;
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "ended by its timeout"
    );
    assert!(!events.is_empty());
    assert!(
        events
            .iter()
            .all(|e| matches!(e, Ok(WatchEvent::Bookmark(_)))),
        "{events:?}"
    );

    // A cluster-wide watch sees every namespace; one from before the compaction gets 410.
    let before = sim.resource_version().to_string();
    crate::common::namespace(&client, "second").await;
    let second: Api<ConfigMap> = Api::namespaced(client, "second");
    second
        .create(&PostParams::default(), &configmap("x", &[], &[]))
        .await
        .unwrap();
    let params = WatchParams::default().timeout(1).disable_bookmarks();
    let seen: Vec<_> = api.watch(&params, &before).await.unwrap().collect().await;
    assert!(matches!(&seen[..], [Ok(WatchEvent::Added(cm))] if cm.name_any() == "x"));
    sim.compact();
    let gone: Vec<_> = api.watch(&params, &before).await.unwrap().collect().await;
    assert!(
        matches!(&gone[..], [Ok(WatchEvent::Error(status))] if status.code == 410 && status.reason == "Expired"),
        "{gone:?}"
    );
}
