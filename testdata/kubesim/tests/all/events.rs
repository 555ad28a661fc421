//! Events published through kube's Recorder: a create, then a series patch.

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
