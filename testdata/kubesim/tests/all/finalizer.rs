//! Finalizers and deletion: kube's finalizer helper under a real Controller, the server's
//! rules for deleting objects, and garbage collection of dependents.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{self, Event as Finalizer, finalizer};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::common::{api_code, configmap, eventually, namespace, start};

const FINALIZER: &str = "kubesim.test/cleanup";

struct Context {
    client: Client,
    cleaned: Mutex<Vec<String>>,
}

async fn reconcile(
    cm: Arc<ConfigMap>,
    ctx: Arc<Context>,
) -> Result<Action, finalizer::Error<Infallible>> {
    let api: Api<ConfigMap> =
        Api::namespaced(ctx.client.clone(), &cm.namespace().unwrap_or_default());
    finalizer(&api, FINALIZER, cm, |event| async move {
        if let Finalizer::Cleanup(cm) = event {
            ctx.cleaned.lock().unwrap().push(cm.name_any());
        }
        Ok::<_, Infallible>(Action::await_change())
    })
    .await
}

fn error_policy(
    _cm: Arc<ConfigMap>,
    _error: &finalizer::Error<Infallible>,
    _ctx: Arc<Context>,
) -> Action {
    Action::requeue(Duration::from_millis(50))
}

async fn next_event<S>(events: &mut S) -> WatchEvent<ConfigMap>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin,
{
    tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("an event in time")
        .expect("the watch stays open")
        .unwrap()
}

#[tokio::test]
async fn controller_finalizer_holds_deletion_until_cleanup() {
    let (_sim, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let ctx = Arc::new(Context {
        client: client.clone(),
        cleaned: Mutex::new(Vec::new()),
    });
    let controller = Controller::new(api.clone(), watcher::Config::default())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|_| async {});
    tokio::spawn(controller);

    api.create(&PostParams::default(), &configmap("guarded", &[], &[]))
        .await
        .unwrap();
    eventually(
        "the controller adds its finalizer",
        Duration::from_secs(10),
        || async { api.get("guarded").await.unwrap().finalizers() == [FINALIZER] },
    )
    .await;

    let from = api
        .get("guarded")
        .await
        .unwrap()
        .resource_version()
        .unwrap();
    let mut events = api
        .watch(&WatchParams::default(), &from)
        .await
        .unwrap()
        .boxed();
    let answer = api
        .delete("guarded", &DeleteParams::default())
        .await
        .unwrap();
    let pending = answer
        .left()
        .expect("held by the finalizer: the object comes back");
    assert!(pending.metadata.deletion_timestamp.is_some());

    match next_event(&mut events).await {
        WatchEvent::Modified(cm) => {
            assert!(cm.metadata.deletion_timestamp.is_some());
            assert_eq!(cm.metadata.deletion_grace_period_seconds, Some(0));
            assert_eq!(cm.finalizers(), [FINALIZER]);
        }
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    match next_event(&mut events).await {
        WatchEvent::Deleted(cm) => assert!(cm.finalizers().is_empty()),
        other => panic!("expected DELETED, got {other:?}"),
    }
    assert_eq!(api_code(api.get("guarded").await).0, 404);
    assert_eq!(*ctx.cleaned.lock().unwrap(), ["guarded"]);
}

#[tokio::test]
async fn deleting_objects_follow_the_servers_rules() {
    let (_sim, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut held = configmap("held", &[], &[]);
    held.metadata.finalizers = Some(vec!["a.test/x".into()]);
    api.create(&PostParams::default(), &held).await.unwrap();
    api.delete("held", &DeleteParams::default()).await.unwrap();
    let deleting = api.get("held").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());

    let more = Patch::Merge(json!({ "metadata": { "finalizers": ["a.test/x", "b.test/y"] } }));
    assert_eq!(
        api_code(api.patch("held", &PatchParams::default(), &more).await),
        (422, "Invalid".into()),
        "no new finalizers once deleting"
    );
    let none = Patch::Merge(json!({ "metadata": { "finalizers": null } }));
    let last = api
        .patch("held", &PatchParams::default(), &none)
        .await
        .unwrap();
    assert!(last.finalizers().is_empty());
    assert_eq!(
        api_code(api.get("held").await).0,
        404,
        "gone with its last finalizer"
    );
    assert_eq!(
        api_code(api.delete("held", &DeleteParams::default()).await).0,
        404
    );
}

#[tokio::test]
async fn dependents_are_collected_unless_orphaned() {
    let (_sim, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let pp = PostParams::default();
    for (owner, dependent, policy) in [
        ("owner1", "dep1", DeleteParams::background()),
        ("owner2", "dep2", DeleteParams::orphan()),
    ] {
        let owner_cm = api.create(&pp, &configmap(owner, &[], &[])).await.unwrap();
        let mut dep = configmap(dependent, &[], &[]);
        dep.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: owner.into(),
            uid: owner_cm.uid().unwrap(),
            ..OwnerReference::default()
        }]);
        api.create(&pp, &dep).await.unwrap();
        api.delete(owner, &policy).await.unwrap();
    }
    eventually("dep1 collected", Duration::from_secs(5), || async {
        api.get_opt("dep1").await.unwrap().is_none()
    })
    .await;
    assert!(api.get_opt("dep2").await.unwrap().is_some(), "orphaned");
}

#[tokio::test]
async fn a_namespace_goes_once_its_contents_are_gone() {
    let (_sim, client) = start().await;
    namespace(&client, "doomed").await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let api: Api<ConfigMap> = Api::namespaced(client, "doomed");
    let pp = PostParams::default();
    let mut held = configmap("held", &[], &[]);
    held.metadata.finalizers = Some(vec!["a.test/x".into()]);
    api.create(&pp, &held).await.unwrap();
    api.create(&pp, &configmap("free", &[], &[])).await.unwrap();

    namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    let terminating = namespaces.get("doomed").await.unwrap();
    assert_eq!(
        terminating.status.unwrap().phase.as_deref(),
        Some("Terminating")
    );
    assert!(
        api.get_opt("free").await.unwrap().is_none(),
        "contents are deleted"
    );
    assert!(
        api.get("held")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    assert_eq!(
        api_code(api.create(&pp, &configmap("late", &[], &[])).await),
        (403, "Forbidden".into())
    );

    let none = Patch::Merge(json!({ "metadata": { "finalizers": null } }));
    api.patch("held", &PatchParams::default(), &none)
        .await
        .unwrap();
    assert!(namespaces.get_opt("doomed").await.unwrap().is_none());
}
