//! What the grant and the bounds refuse, each on its own.

use std::time::Instant;

use egress_capability_libvirt::bindings::egress::libvirt::libvirt::{
    Error, HostConnection, HostDomain, HostStoragePool,
};
use egress_capability_libvirt::{
    Connection, LibvirtCallCtx, LibvirtCtxView, MAX_DOMAIN_XML_BYTES, MAX_METADATA_BYTES,
};
use wasmtime::component::{Resource, ResourceTable};

use crate::support::*;

fn denied(error: Error) -> String {
    match error {
        Error::Denied(reason) => reason,
        other => panic!("expected denied, got {other:?}"),
    }
}

fn invalid(error: Error) -> String {
    match error {
        Error::Invalid(reason) => reason,
        other => panic!("expected invalid, got {other:?}"),
    }
}

async fn opened(node: &TestNode) -> (Call, Resource<Connection>) {
    let capability = capability("kvm2", node.grant());
    let mut call = Call::new(&capability, "kvm2");
    let connection = ok(call.view().open("node".into()).await);
    (call, connection)
}

#[tokio::test]
async fn an_ungranted_connection_name_is_denied() {
    let node = TestNode::new();
    let capability = capability("kvm2", node.grant());
    let mut call = Call::new(&capability, "kvm2");
    let reason = denied(err(call.view().open("hv9".into()).await));
    assert!(reason.contains("hv9"), "{reason}");
    let reason = denied(err(call.view().open_unpooled("hv9".into()).await));
    assert!(reason.contains("hv9"), "{reason}");
    assert!(call.table.is_empty());
}

#[tokio::test]
async fn a_provider_without_a_grant_is_denied() {
    let mut ctx = LibvirtCallCtx::ungranted(Instant::now() + std::time::Duration::from_secs(60));
    let mut table = ResourceTable::new();
    let mut view = LibvirtCtxView {
        ctx: &mut ctx,
        table: &mut table,
    };
    denied(err(view.open("node".into()).await));
}

#[tokio::test]
async fn an_ungranted_pool_is_denied() {
    let node = TestNode::new();
    let (mut call, connection) = opened(&node).await;
    let reason = denied(err(call
        .view()
        .storage_pool(connection, "other".into())
        .await));
    assert!(reason.contains("other"), "{reason}");
}

#[tokio::test]
async fn a_domain_on_an_ungranted_network_bridge_or_pool_is_denied() {
    let node = TestNode::new();
    let (mut call, connection) = opened(&node).await;
    let mut view = call.view();
    let borrow = || Resource::<Connection>::new_borrow(connection.rep());
    let on_network = domain_xml("a", None).replace("network='default'", "network='isolated'");
    assert!(denied(err(view.define_domain(borrow(), on_network).await)).contains("isolated"));
    let on_bridge = domain_xml("a", None).replace(
        "<interface type='network'><source network='default'/>",
        "<interface type='bridge'><source bridge='br1'/>",
    );
    assert!(denied(err(view.define_domain(borrow(), on_bridge).await)).contains("br1"));
    let in_pool = domain_xml("a", None).replace("pool='images'", "pool='other'");
    assert!(denied(err(view.define_domain(borrow(), in_pool).await)).contains("other"));
    let host_file = domain_xml("a", None).replace(
        "<disk type='volume' device='disk'><source pool='images' volume='base.qcow2'/>",
        "<disk type='file' device='disk'><source file='/etc/shadow'/>",
    );
    denied(err(view.define_domain(borrow(), host_file).await));
    let qemu_arguments = domain_xml("a", None).replace(
        "</devices>",
        "</devices><qemu:commandline xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'><qemu:arg value='-S'/></qemu:commandline>",
    );
    denied(err(view.define_domain(borrow(), qemu_arguments).await));
    let forged_mark = domain_xml(
        "a",
        Some(&format!(
            r#"<o:proxy xmlns:o="{}" uid="x"/>"#,
            namespace("other")
        )),
    );
    denied(err(view.define_domain(borrow(), forged_mark).await));
    // Nothing reached libvirt.
    assert!(ok(view.list_domains(borrow()).await).is_empty());
}

#[tokio::test]
async fn an_ungranted_image_origin_is_denied_without_a_request() {
    let node = TestNode::new();
    let mut grant = node.grant();
    // Port 9 (discard) on 127.0.0.1: nothing would answer a request.
    grant["images"] = serde_json::json!({
        "origins": ["https://127.0.0.1:9"],
        "caFile": "/nonexistent/ca.pem",
    });
    let capability = capability("kvm2", grant);
    let mut call = Call::new(&capability, "kvm2");
    let mut view = call.view();
    let connection = ok(view.open("node".into()).await);
    let pool = ok(view.storage_pool(connection, "images".into()).await);
    let borrow = || Resource::<egress_capability_libvirt::StoragePool>::new_borrow(pool.rep());
    let sha = "00".repeat(32);
    for url in [
        "https://images.example/base.qcow2",
        "https://127.0.0.1:8443/base.qcow2",
        "http://127.0.0.1:9/base.qcow2",
    ] {
        denied(err(view
            .import_image(borrow(), "base.qcow2".into(), url.into(), sha.clone())
            .await));
    }
    // No images grant at all.
    let (mut plain, connection) = opened(&node).await;
    let mut view = plain.view();
    let pool = ok(view.storage_pool(connection, "images".into()).await);
    let reason = denied(err(view
        .import_image(
            pool,
            "base.qcow2".into(),
            "https://127.0.0.1:9/x".into(),
            sha,
        )
        .await));
    assert!(reason.contains("import"), "{reason}");
}

#[tokio::test]
async fn a_malformed_checksum_is_invalid_before_any_request() {
    let node = TestNode::new();
    let mut grant = node.grant();
    grant["images"] = serde_json::json!({
        "origins": ["https://127.0.0.1:9"],
        "caFile": "/nonexistent/ca.pem",
    });
    let capability = capability("kvm2", grant);
    let mut call = Call::new(&capability, "kvm2");
    let mut view = call.view();
    let connection = ok(view.open("node".into()).await);
    let pool = ok(view.storage_pool(connection, "images".into()).await);
    let reason = invalid(err(view
        .import_image(
            pool,
            "base.qcow2".into(),
            "https://127.0.0.1:9/x".into(),
            "abc".into(),
        )
        .await));
    assert!(reason.contains("sha256"), "{reason}");
}

#[tokio::test]
async fn oversized_or_nul_bearing_inputs_are_invalid() {
    let node = TestNode::new();
    let (mut call, connection) = opened(&node).await;
    let mut view = call.view();
    let borrow = || Resource::<Connection>::new_borrow(connection.rep());

    invalid(err(view.lookup_domain(borrow(), "x".repeat(256)).await));
    invalid(err(view.lookup_domain(borrow(), "a\0b".into()).await));
    invalid(err(view
        .lookup_domain_by_uuid(borrow(), "not-a-uuid".into())
        .await));
    invalid(err(HostConnection::storage_pool(
        &mut view,
        borrow(),
        "a/b".into(),
    )
    .await));

    let padding = format!(
        "<description>{}</description>",
        "x".repeat(MAX_DOMAIN_XML_BYTES)
    );
    let huge = domain_xml("a", None).replace("<vcpu>", &format!("{padding}<vcpu>"));
    let reason = invalid(err(view.define_domain(borrow(), huge).await));
    assert!(reason.contains("more than"), "{reason}");

    let domain = ok(view.define_domain(borrow(), domain_xml("a", None)).await);
    let big = format!("<proxy note='{}'/>", "x".repeat(MAX_METADATA_BYTES));
    invalid(err(view
        .set_metadata(Resource::new_borrow(domain.rep()), Some(big))
        .await));
    invalid(err(view
        .set_metadata(Resource::new_borrow(domain.rep()), Some("<a/><b/>".into()))
        .await));

    let pool = ok(view.storage_pool(borrow(), "images".into()).await);
    let long_volume = format!(
        "<volume><name>{}</name><capacity>1</capacity><target><format type='raw'/></target>{}</volume>",
        "v",
        "<!-- -->".repeat(4096)
    );
    invalid(err(view
        .create_volume(Resource::new_borrow(pool.rep()), long_volume)
        .await));
    invalid(err(HostStoragePool::lookup_volume(
        &mut view,
        pool,
        "..".into(),
    )
    .await));
    let _ = HostDomain::status(&mut view, domain).await;
}

/// A copy-on-write volume's backing store is a volume of a granted pool, named by pool and
/// volume and resolved by the host: a path, a pool the connection does not grant, a volume that
/// does not exist, or one that is backed itself is refused, naming what was asked for.
#[tokio::test]
async fn a_backing_store_outside_the_granted_pools_volumes_is_refused_naming_it() {
    let node = TestNode::new();
    let (mut call, connection) = opened(&node).await;
    let mut view = call.view();
    let images = ok(view.storage_pool(connection, "images".into()).await);
    let pool = || Resource::<egress_capability_libvirt::StoragePool>::new_borrow(images.rep());
    let overlay = |name: &str, store: &str| {
        format!(
            "<volume><name>{name}</name><capacity unit='GiB'>2</capacity><target><format type='qcow2'/></target><backingStore>{store}</backingStore></volume>"
        )
    };
    let reason = denied(err(view
        .create_volume(pool(), overlay("a.qcow2", "<path>/etc/shadow</path>"))
        .await));
    assert!(reason.contains("not <path>"), "{reason}");
    let reason = denied(err(view
        .create_volume(
            pool(),
            overlay("a.qcow2", "<source pool='other' volume='x.qcow2'/>"),
        )
        .await));
    assert!(
        reason.contains("backing store other/x.qcow2") && reason.contains("not granted"),
        "{reason}"
    );
    match err(view
        .create_volume(
            pool(),
            overlay("a.qcow2", "<source pool='images' volume='nope.qcow2'/>"),
        )
        .await)
    {
        Error::Libvirt(libvirt) => {
            assert_eq!(libvirt.code, 50, "{libvirt:?}");
            assert!(
                libvirt.message.contains("backing store images/nope.qcow2"),
                "{libvirt:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Backed by the base: allowed, and the host wrote the base's path and format.
    ok(view
        .create_volume(
            pool(),
            overlay("a.qcow2", "<source pool='images' volume='base.qcow2'/>"),
        )
        .await);
    let reason = denied(err(view
        .create_volume(
            pool(),
            overlay("b.qcow2", "<source pool='images' volume='a.qcow2'/>"),
        )
        .await));
    assert!(
        reason.contains("images/a.qcow2 is itself backed"),
        "{reason}"
    );
    assert!(ok(view.lookup_volume(pool(), "b.qcow2".into()).await).is_none());
}
