//! Events published through kube's Recorder (a create, then a series patch), and the one Event
//! store seen through both `events.k8s.io/v1` and core `v1`.

use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, ObjectReference};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Resource};

use crate::common::{configmap, start};

#[tokio::test]
async fn recorder_creates_then_patches_a_series() {
    let (sim, client) = start().await;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm = configmaps
        .create(&PostParams::default(), &configmap("subject", &[], &[]))
        .await
        .unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "kubesim-test".into(),
            instance: Some("pod-0".into()),
        },
    );
    let event = Event {
        type_: EventType::Normal,
        reason: "Provisioned".into(),
        note: Some("proxy VM is up".into()),
        action: "Provision".into(),
        secondary: None,
    };
    let reference = cm.object_ref(&());
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();

    let events: Api<K8sEvent> = Api::namespaced(client, "default");
    let listed = events.list(&Default::default()).await.unwrap().items;
    assert_eq!(listed.len(), 1, "the repeat is a series on the same Event");
    let stored = &listed[0];
    assert_eq!(stored.reason.as_deref(), Some("Provisioned"));
    assert_eq!(stored.note.as_deref(), Some("proxy VM is up"));
    assert_eq!(stored.reporting_controller.as_deref(), Some("kubesim-test"));
    assert_eq!(
        stored.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("subject")
    );
    assert_eq!(stored.series.as_ref().map(|s| s.count), Some(2));

    let calls: Vec<(String, Option<String>)> = sim
        .requests()
        .into_iter()
        .filter(|r| {
            r.path
                .starts_with("/apis/events.k8s.io/v1/namespaces/default/events")
        })
        .map(|r| (r.method, r.content_type))
        .collect();
    assert_eq!(calls[0].0, "POST");
    assert_eq!(
        calls[1],
        (
            "PATCH".to_string(),
            Some("application/merge-patch+json".to_string())
        )
    );
}

#[tokio::test]
async fn core_events_are_stored_and_selected_by_involved_object() {
    let (_sim, client) = start().await;
    let events: Api<CoreEvent> = Api::namespaced(client, "default");
    for (name, subject) in [("e1", "a"), ("e2", "b")] {
        let event = CoreEvent {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                kind: Some("ConfigMap".into()),
                name: Some(subject.into()),
                namespace: Some("default".into()),
                ..ObjectReference::default()
            },
            reason: Some("Seen".into()),
            ..CoreEvent::default()
        };
        events.create(&PostParams::default(), &event).await.unwrap();
    }
    let about_b =
        ListParams::default().fields("involvedObject.name=b,involvedObject.kind=ConfigMap");
    let found = events.list(&about_b).await.unwrap().items;
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].metadata.name.as_deref(), Some("e2"));
}

/// A Proxy-like subject and a Recorder that publishes one Event about it (through
/// `events.k8s.io/v1`, as the operator does).
async fn record_about_subject(client: &kube::Client) -> ConfigMap {
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm = configmaps
        .create(&PostParams::default(), &configmap("subject", &[], &[]))
        .await
        .unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "kubesim-test".into(),
            instance: Some("pod-0".into()),
        },
    );
    let event = Event {
        type_: EventType::Warning,
        reason: "Failed".into(),
        note: Some("the VM stopped".into()),
        action: "Check".into(),
        secondary: None,
    };
    recorder.publish(&event, &cm.object_ref(&())).await.unwrap();
    cm
}

#[tokio::test]
async fn an_event_recorded_through_events_k8s_io_is_a_core_event_as_describe_lists_them() {
    let (_sim, client) = start().await;
    let cm = record_about_subject(&client).await;
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    // What `kubectl describe` asks for.
    let selector = format!(
        "involvedObject.kind=ConfigMap,involvedObject.uid={},involvedObject.name=subject,involvedObject.namespace=default",
        cm.metadata.uid.as_deref().unwrap()
    );
    let found = core
        .list(&ListParams::default().fields(&selector))
        .await
        .unwrap()
        .items;
    assert_eq!(found.len(), 1);
    let event = &found[0];
    assert_eq!(event.message.as_deref(), Some("the VM stopped"));
    assert_eq!(event.reason.as_deref(), Some("Failed"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.action.as_deref(), Some("Check"));
    assert_eq!(event.reporting_component.as_deref(), Some("kubesim-test"));
    assert_eq!(event.reporting_instance.as_deref(), Some("pod-0"));
    assert_eq!(event.involved_object.name.as_deref(), Some("subject"));
    assert!(event.event_time.is_some());

    // One object: the same name, uid and resourceVersion through both APIs.
    let name = event.metadata.name.clone().unwrap();
    let k8s: Api<K8sEvent> = Api::namespaced(client.clone(), "default");
    let same = k8s.get(&name).await.unwrap();
    assert_eq!(same.metadata.uid, event.metadata.uid);
    assert_eq!(
        same.metadata.resource_version,
        event.metadata.resource_version
    );
    let other = ListParams::default().fields("involvedObject.name=someone-else");
    assert!(core.list(&other).await.unwrap().items.is_empty());
}

#[tokio::test]
async fn a_core_event_is_an_events_k8s_io_event_and_deletes_through_either() {
    let (_sim, client) = start().await;
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let event: CoreEvent = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "old-style"},
        "involvedObject": {"kind": "ConfigMap", "name": "subject", "namespace": "default"},
        "message": "pulled", "reason": "Pulled", "type": "Normal",
        "source": {"component": "kubelet", "host": "node-1"}, "count": 3,
        "firstTimestamp": "2025-01-01T00:00:00Z", "lastTimestamp": "2025-01-01T00:01:00Z",
    }))
    .unwrap();
    core.create(&PostParams::default(), &event).await.unwrap();
    let by_source = ListParams::default().fields("source=kubelet");
    assert_eq!(core.list(&by_source).await.unwrap().items.len(), 1);

    let k8s: Api<K8sEvent> = Api::namespaced(client.clone(), "default");
    let about = ListParams::default().fields("regarding.name=subject");
    let seen = k8s.list(&about).await.unwrap().items;
    assert_eq!(seen.len(), 1);
    let seen = &seen[0];
    assert_eq!(seen.note.as_deref(), Some("pulled"));
    assert_eq!(seen.deprecated_count, Some(3));
    assert_eq!(
        seen.deprecated_source
            .as_ref()
            .and_then(|s| s.component.as_deref()),
        Some("kubelet")
    );
    assert!(seen.deprecated_first_timestamp.is_some());
    assert_eq!(
        seen.regarding.as_ref().and_then(|r| r.kind.as_deref()),
        Some("ConfigMap")
    );

    // A merge patch through events.k8s.io names its fields; core sees the change.
    k8s.patch(
        "old-style",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"note": "pulled again", "deprecatedCount": 4})),
    )
    .await
    .unwrap();
    let now = core.get("old-style").await.unwrap();
    assert_eq!(
        (now.message.as_deref(), now.count),
        (Some("pulled again"), Some(4))
    );

    k8s.delete("old-style", &Default::default()).await.unwrap();
    assert!(core.get_opt("old-style").await.unwrap().is_none());
}

#[tokio::test]
async fn a_watch_of_core_events_sees_events_recorded_through_events_k8s_io() {
    use futures::TryStreamExt;
    use kube::api::WatchEvent;
    use kube::api::WatchParams;

    let (_sim, client) = start().await;
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let stream = core
        .watch(&WatchParams::default().timeout(5), "0")
        .await
        .unwrap();
    let mut stream = Box::pin(stream);
    record_about_subject(&client).await;
    let first = tokio::time::timeout(std::time::Duration::from_secs(5), stream.try_next())
        .await
        .expect("an event in time")
        .unwrap();
    match first {
        Some(WatchEvent::Added(event)) => {
            assert_eq!(event.message.as_deref(), Some("the VM stopped"));
            assert_eq!(event.involved_object.name.as_deref(), Some("subject"));
        }
        other => panic!("expected ADDED, got {other:?}"),
    }
}
