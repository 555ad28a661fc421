//! LIST with label and field selectors, across namespaces, with paging parameters ignored.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};

use crate::common::{api_code, configmap, namespace, start};

async fn names(api: &Api<ConfigMap>, params: &ListParams) -> Vec<String> {
    api.list(params)
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect()
}

#[tokio::test]
async fn list_filters_by_labels_and_fields() {
    let (sim, client) = start().await;
    namespace(&client, "other").await;
    let default: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let other: Api<ConfigMap> = Api::namespaced(client.clone(), "other");
    let pp = PostParams::default();
    default
        .create(
            &pp,
            &configmap("web-front", &[("app", "web"), ("tier", "front")], &[]),
        )
        .await
        .unwrap();
    default
        .create(
            &pp,
            &configmap("web-back", &[("app", "web"), ("tier", "back")], &[]),
        )
        .await
        .unwrap();
    default
        .create(&pp, &configmap("plain", &[], &[]))
        .await
        .unwrap();
    other
        .create(&pp, &configmap("elsewhere", &[("app", "web")], &[]))
        .await
        .unwrap();

    let labels = |s: &str| ListParams::default().labels(s);
    assert_eq!(
        names(&default, &labels("app=web")).await,
        ["web-back", "web-front"]
    );
    assert_eq!(
        names(&default, &labels("tier in (front,middle)")).await,
        ["web-front"]
    );
    assert_eq!(
        names(&default, &labels("tier notin (front)")).await,
        ["plain", "web-back"]
    );
    assert_eq!(
        names(&default, &labels("app")).await,
        ["web-back", "web-front"]
    );
    assert_eq!(names(&default, &labels("!app")).await, ["plain"]);
    assert_eq!(
        names(&default, &labels("app=web,tier!=back")).await,
        ["web-front"]
    );
    let by_name = ListParams::default().fields("metadata.name=plain");
    assert_eq!(names(&default, &by_name).await, ["plain"]);

    let everywhere: Api<ConfigMap> = Api::all(client);
    let all_web = names(&everywhere, &labels("app=web")).await;
    assert_eq!(
        all_web,
        ["web-back", "web-front", "elsewhere"],
        "namespace, then name order"
    );
    let in_other = ListParams::default().fields("metadata.namespace=other");
    assert_eq!(names(&everywhere, &in_other).await, ["elsewhere"]);

    // Paging is not implemented: limit is ignored and no continue token is returned.
    let page = default.list(&ListParams::default().limit(1)).await.unwrap();
    assert_eq!(page.items.len(), 3);
    assert!(page.metadata.continue_.is_none());
    assert_eq!(
        page.metadata.resource_version.unwrap(),
        sim.resource_version().to_string()
    );

    let unsupported = ListParams::default().fields("data.x=1");
    assert_eq!(
        api_code(default.list(&unsupported).await),
        (400, "BadRequest".into())
    );

    let deleted = default
        .delete_collection(&DeleteParams::default(), &labels("tier"))
        .await
        .unwrap()
        .left()
        .expect("the list of what was deleted");
    assert_eq!(deleted.items.len(), 2);
    assert_eq!(names(&default, &ListParams::default()).await, ["plain"]);
}
