//! CustomResourceDefinitions, custom resources, discovery and the status subresource.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, CustomResource, CustomResourceExt, Discovery, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::common::{api_code, start};

/// A namespaced kind with a status subresource.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "kubesim.test",
    version = "v1alpha1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus"
)]
pub struct WidgetSpec {
    pub size: u32,
}

/// What a controller reports about a Widget.
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
pub struct WidgetStatus {
    pub ready: bool,
}

/// A cluster-scoped kind without status.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, JsonSchema)]
#[kube(group = "kubesim.test", version = "v1", kind = "Gadget")]
pub struct GadgetSpec {
    pub color: String,
}

/// Installs a CRD and waits until it is Established, as an operator would.
pub async fn install(client: &Client, crd: CustomResourceDefinition) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.name_any();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let established = await_condition(crds, &name, conditions::is_crd_established());
    tokio::time::timeout(Duration::from_secs(5), established)
        .await
        .expect("established in time")
        .unwrap();
}

#[tokio::test]
async fn custom_resources_are_served_once_their_crd_exists() {
    let (_sim, client) = start().await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), "default");
    let widget = Widget::new("w", WidgetSpec { size: 1 });
    assert_eq!(
        api_code(widgets.create(&PostParams::default(), &widget).await).0,
        404,
        "no CRD yet"
    );
    install(&client, Widget::crd()).await;
    install(&client, Gadget::crd()).await;

    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    assert!(discovery.has_group("kubesim.test"));
    assert!(discovery.has_group("coordination.k8s.io"));
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, "v1.34.0");

    let created = widgets
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
    assert_eq!(created.spec.size, 1);
    assert_eq!(
        widgets.list(&Default::default()).await.unwrap().items.len(),
        1
    );

    let gadgets: Api<Gadget> = Api::all(client.clone());
    let gadget = Gadget::new(
        "g",
        GadgetSpec {
            color: "red".into(),
        },
    );
    let stored = gadgets
        .create(&PostParams::default(), &gadget)
        .await
        .unwrap();
    assert_eq!(stored.metadata.namespace, None, "cluster-scoped");
    assert_eq!(gadgets.get("g").await.unwrap().spec.color, "red");

    // Deleting the CRD takes its objects with it.
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    crds.delete("widgets.kubesim.test", &Default::default())
        .await
        .unwrap();
    assert_eq!(api_code(widgets.get("w").await).0, 404);
}

#[tokio::test]
async fn status_is_written_only_through_its_subresource() {
    let (sim, client) = start().await;
    install(&client, Widget::crd()).await;
    let widgets: Api<Widget> = Api::namespaced(client, "default");
    let mut widget = Widget::new("w", WidgetSpec { size: 1 });
    widget.status = Some(WidgetStatus { ready: true });
    let created = widgets
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
    assert!(created.status.is_none(), "status is dropped on create");

    let status = Patch::Apply(json!({
        "apiVersion": "kubesim.test/v1alpha1",
        "kind": "Widget",
        "status": { "ready": true },
    }));
    let applied = widgets
        .patch_status("w", &PatchParams::apply("widget-controller"), &status)
        .await
        .unwrap();
    assert!(applied.status.as_ref().unwrap().ready);
    assert_eq!(
        applied.metadata.generation,
        Some(1),
        "status does not bump generation"
    );
    let entry = applied
        .managed_fields()
        .iter()
        .find(|m| m.manager.as_deref() == Some("widget-controller"))
        .cloned()
        .expect("the applier is recorded");
    assert_eq!(entry.operation.as_deref(), Some("Apply"));
    assert_eq!(entry.subresource.as_deref(), Some("status"));
    let stored = sim
        .get("/apis/kubesim.test/v1alpha1/namespaces/default/widgets/w")
        .unwrap();
    assert_eq!(stored["status"]["ready"], true);

    // A write of the main resource leaves status alone but bumps generation for spec.
    let mut edited = widgets.get("w").await.unwrap();
    edited.spec.size = 2;
    edited.status = Some(WidgetStatus { ready: false });
    let replaced = widgets
        .replace("w", &PostParams::default(), &edited)
        .await
        .unwrap();
    assert!(replaced.status.unwrap().ready, "status kept");
    assert_eq!(replaced.metadata.generation, Some(2));
    assert_eq!(replaced.spec.size, 2);

    // The status subresource ignores spec.
    let mut via_status = widgets.get_status("w").await.unwrap();
    via_status.spec.size = 7;
    via_status.status = Some(WidgetStatus { ready: false });
    let after = widgets
        .replace_status("w", &PostParams::default(), &via_status)
        .await
        .unwrap();
    assert_eq!(after.spec.size, 2);
    assert!(!after.status.unwrap().ready);
    assert_eq!(after.metadata.generation, Some(2));
}
