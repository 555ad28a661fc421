//! The host traits over libvirt's in-process test driver, each test on its own private node.

use egress_capability_libvirt::bindings::egress::libvirt::libvirt::{
    AddressSource, AddressType, DomainState, Error, HostConnection, HostDomain, HostStoragePool,
    HostVolume,
};
use egress_capability_libvirt::{Connection, LibvirtCapability};
use wasmtime::component::Resource;

use crate::support::*;

struct Setup {
    _node: TestNode,
    capability: LibvirtCapability,
    call: Call,
}

impl Setup {
    fn new() -> Self {
        let node = TestNode::new();
        let capability = capability("kvm2", node.grant());
        let call = Call::new(&capability, "kvm2");
        Self {
            _node: node,
            capability,
            call,
        }
    }

    async fn open(&mut self) -> Resource<Connection> {
        ok(self.call.view().open("node".into()).await)
    }
}

#[tokio::test]
async fn a_domain_is_defined_started_destroyed_and_undefined() {
    let mut setup = Setup::new();
    let connection = setup.open().await;
    let mut view = setup.call.view();
    let domain = ok(view
        .define_domain(
            Resource::new_borrow(connection.rep()),
            domain_xml("proxy-a", None),
        )
        .await);
    let name = HostDomain::name(&mut view, Resource::new_borrow(domain.rep()))
        .await
        .unwrap();
    assert_eq!(name, "proxy-a");
    let status = ok(view.status(Resource::new_borrow(domain.rep())).await);
    assert_eq!(status.state, DomainState::Shutoff);

    ok(view.start(Resource::new_borrow(domain.rep())).await);
    let status = ok(view.status(Resource::new_borrow(domain.rep())).await);
    assert_eq!(status.state, DomainState::Running);
    assert_eq!(status.reason, virt::sys::VIR_DOMAIN_RUNNING_BOOTED as i32);

    ok(view.destroy(Resource::new_borrow(domain.rep())).await);
    let status = ok(view.status(Resource::new_borrow(domain.rep())).await);
    assert_eq!(status.state, DomainState::Shutoff);
    assert_eq!(
        status.reason,
        virt::sys::VIR_DOMAIN_SHUTOFF_DESTROYED as i32
    );

    ok(view.undefine(Resource::new_borrow(domain.rep())).await);
    let gone = ok(view
        .lookup_domain(Resource::new_borrow(connection.rep()), "proxy-a".into())
        .await);
    assert!(gone.is_none());
    HostDomain::drop(&mut view, domain).await.unwrap();
    HostConnection::drop(&mut view, connection).await.unwrap();
    assert!(setup.call.table.is_empty());
}

#[tokio::test]
async fn lookup_by_name_and_uuid_finds_the_domain_or_answers_none() {
    let mut setup = Setup::new();
    let connection = setup.open().await;
    let mut view = setup.call.view();
    let borrow = || Resource::<Connection>::new_borrow(connection.rep());
    let defined = ok(view
        .define_domain(borrow(), domain_xml("proxy-a", None))
        .await);
    let uuid = view
        .uuid(Resource::new_borrow(defined.rep()))
        .await
        .unwrap();

    let by_name = ok(view.lookup_domain(borrow(), "proxy-a".into()).await).unwrap();
    assert_eq!(view.uuid(by_name).await.unwrap(), uuid);
    let by_uuid = ok(view.lookup_domain_by_uuid(borrow(), uuid.clone()).await).unwrap();
    assert_eq!(
        HostDomain::name(&mut view, by_uuid).await.unwrap(),
        "proxy-a"
    );

    assert!(ok(view.lookup_domain(borrow(), "proxy-b".into()).await).is_none());
    let absent = "00000000-0000-4000-8000-000000000000".to_owned();
    assert!(ok(view.lookup_domain_by_uuid(borrow(), absent).await).is_none());
}

#[tokio::test]
async fn list_shows_every_domain_with_the_providers_metadata_only() {
    let mut setup = Setup::new();
    let connection = setup.open().await;
    let mut view = setup.call.view();
    let borrow = || Resource::<Connection>::new_borrow(connection.rep());
    let mark = format!(
        r#"<egress:proxy xmlns:egress="{}" uid="u1"/>"#,
        namespace("egress-operator")
    );
    ok(view
        .define_domain(borrow(), domain_xml("marked", Some(&mark)))
        .await);
    let bare = ok(view.define_domain(borrow(), domain_xml("bare", None)).await);
    ok(view.start(bare).await);

    let mut listed = ok(view.list_domains(borrow()).await);
    listed.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed[0].name, "bare");
    assert_eq!(listed[0].status.state, DomainState::Running);
    assert_eq!(listed[0].metadata, None);
    assert_eq!(listed[1].name, "marked");
    assert_eq!(listed[1].status.state, DomainState::Shutoff);
    assert_eq!(listed[1].uuid.len(), 36);
    let metadata = listed[1].metadata.as_deref().unwrap();
    assert!(metadata.contains(r#"uid="u1""#), "{metadata}");
}

#[tokio::test]
async fn metadata_lives_in_the_owners_namespace_and_no_other_owner_can_see_it() {
    let node = TestNode::new();
    // Two providers granted the same node under two owners: they share the pooled connection,
    // so its state.
    let capability = capability("kvm2", node.grant());
    let mut other_grant = node.grant();
    other_grant["owner"] = "other-owner".into();
    let other_grant: egress_capability_libvirt::LibvirtGrant =
        serde_json::from_value(other_grant).unwrap();
    egress_runtime::Capability::set_grant(
        &capability,
        "other",
        &other_grant,
        &egress_runtime::grant::GrantContext {
            digests: &[],
            host: &egress_runtime::grant::FilesOnly,
        },
    )
    .unwrap();
    let mut kvm2 = Call::new(&capability, "kvm2");
    let mut other = Call::new(&capability, "other");

    let mut view = kvm2.view();
    let connection = ok(view.open("node".into()).await);
    let domain = ok(view
        .define_domain(
            Resource::new_borrow(connection.rep()),
            domain_xml("proxy-a", None),
        )
        .await);
    let borrow = || Resource::<egress_capability_libvirt::Domain>::new_borrow(domain.rep());
    assert_eq!(ok(view.metadata(borrow()).await), None);
    ok(view
        .set_metadata(
            borrow(),
            Some(r#"<proxy uid="u1" created="2026-09-16T13:37:00Z"/>"#.into()),
        )
        .await);
    let own = ok(view.metadata(borrow()).await).unwrap();
    assert!(own.contains(r#"uid="u1""#), "{own}");

    let mut seen_by_other = other.view();
    let theirs = ok(seen_by_other.open("node".into()).await);
    let same = ok(seen_by_other
        .lookup_domain(Resource::new_borrow(theirs.rep()), "proxy-a".into())
        .await)
    .unwrap();
    let same = || Resource::<egress_capability_libvirt::Domain>::new_borrow(same.rep());
    assert_eq!(ok(seen_by_other.metadata(same()).await), None);
    let listed = ok(seen_by_other
        .list_domains(Resource::new_borrow(theirs.rep()))
        .await);
    assert_eq!(listed[0].metadata, None);
    // The other provider writes its own element; the first one's is untouched.
    ok(seen_by_other
        .set_metadata(same(), Some(r#"<proxy uid="forged"/>"#.into()))
        .await);
    ok(seen_by_other.set_metadata(same(), None).await);

    let mut view = kvm2.view();
    let own = ok(view.metadata(borrow()).await).unwrap();
    assert!(own.contains(r#"uid="u1""#), "{own}");
    ok(view.set_metadata(borrow(), None).await);
    assert_eq!(ok(view.metadata(borrow()).await), None);
}

#[tokio::test]
async fn interface_addresses_come_from_the_network_of_a_running_domain() {
    let mut setup = Setup::new();
    let connection = setup.open().await;
    let mut view = setup.call.view();
    let domain = ok(view
        .define_domain(
            Resource::new_borrow(connection.rep()),
            domain_xml("proxy-a", None),
        )
        .await);
    let borrow = || Resource::<egress_capability_libvirt::Domain>::new_borrow(domain.rep());

    let stopped = err(view.interface_addresses(borrow()).await);
    match stopped {
        Error::Libvirt(error) => {
            assert_eq!(
                error.code,
                virt::sys::VIR_ERR_OPERATION_INVALID as i32,
                "{error:?}"
            )
        }
        other => panic!("{other:?}"),
    }

    ok(view.start(borrow()).await);
    let found = ok(view.interface_addresses(borrow()).await);
    // The test driver ignores the source: the agent answers.
    assert_eq!(found.source, AddressSource::Agent);
    assert_eq!(found.interfaces.len(), 1, "{found:?}");
    let interface = &found.interfaces[0];
    assert_eq!(interface.hwaddr.as_deref(), Some("52:54:00:00:00:01"));
    assert!(!interface.name.is_empty());
    let address = &interface.addresses[0];
    assert_eq!(address.type_, AddressType::Ipv4);
    assert!(address.address.starts_with("192.168.122."), "{address:?}");
    assert_eq!(address.prefix, 24);
}

#[tokio::test]
async fn undefine_uses_the_connections_flags() {
    let node = TestNode::new();
    // The default flags include nvram, which the test driver refuses: the host passes the
    // grant's flags as they are and never retries without them.
    let mut grant = node.grant();
    grant["connections"][0]
        .as_object_mut()
        .unwrap()
        .remove("undefineFlags");
    let capability = capability("kvm2", grant);
    let mut call = Call::new(&capability, "kvm2");
    let mut view = call.view();
    let connection = ok(view.open("node".into()).await);
    let domain = ok(view
        .define_domain(
            Resource::new_borrow(connection.rep()),
            domain_xml("proxy-a", None),
        )
        .await);
    match err(view.undefine(Resource::new_borrow(domain.rep())).await) {
        Error::Libvirt(error) => {
            assert_eq!(
                error.code,
                virt::sys::VIR_ERR_INVALID_ARG as i32,
                "{error:?}"
            );
            assert!(error.message.contains("unsupported flags"), "{error:?}");
        }
        other => panic!("{other:?}"),
    }

    // The node's own grant lists the flags the test driver accepts.
    let mut setup = Setup::new();
    let connection = setup.open().await;
    let mut view = setup.call.view();
    let domain = ok(view
        .define_domain(
            Resource::new_borrow(connection.rep()),
            domain_xml("proxy-a", None),
        )
        .await);
    ok(view.undefine(domain).await);
}

#[tokio::test]
async fn pool_info_and_volumes_create_clone_look_up_and_delete() {
    let mut setup = Setup::new();
    let connection = setup.open().await;
    let mut view = setup.call.view();
    let pool = ok(view
        .storage_pool(Resource::new_borrow(connection.rep()), "images".into())
        .await);
    let borrow = || Resource::<egress_capability_libvirt::StoragePool>::new_borrow(pool.rep());
    assert_eq!(
        HostStoragePool::name(&mut view, borrow()).await.unwrap(),
        "images"
    );
    let info = ok(HostStoragePool::info(&mut view, borrow()).await);
    // The test driver's pools are 100 GiB, whatever their XML says.
    assert_eq!(info.capacity, 100 * 1024 * 1024 * 1024);
    assert!(info.available <= info.capacity);

    let created = ok(view
        .create_volume(
            borrow(),
            "<volume><name>seed.iso</name><capacity unit='KiB'>512</capacity></volume>".into(),
        )
        .await);
    assert_eq!(
        HostVolume::name(&mut view, Resource::new_borrow(created.rep()))
            .await
            .unwrap(),
        "seed.iso"
    );
    let path = ok(view.path(Resource::new_borrow(created.rep())).await);
    assert_eq!(path, "/images/seed.iso");
    let volume_info = ok(HostVolume::info(&mut view, Resource::new_borrow(created.rep())).await);
    assert_eq!(volume_info.capacity, 512 * 1024);

    let base = ok(view.lookup_volume(borrow(), "base.qcow2".into()).await).unwrap();
    let clone = ok(view
        .clone_volume(
            borrow(),
            "<volume><name>proxy-a.qcow2</name><capacity unit='GiB'>1</capacity><target><format type='qcow2'/></target></volume>".into(),
            Resource::new_borrow(base.rep()),
        )
        .await);
    let found = ok(view.lookup_volume(borrow(), "proxy-a.qcow2".into()).await).unwrap();
    assert_eq!(ok(view.path(found).await), "/images/proxy-a.qcow2");

    let duplicate = err(view
        .create_volume(
            borrow(),
            "<volume><name>seed.iso</name><capacity>1</capacity></volume>".into(),
        )
        .await);
    assert!(matches!(duplicate, Error::Libvirt(_)), "{duplicate:?}");

    ok(view.delete(clone).await);
    assert!(ok(view.lookup_volume(borrow(), "proxy-a.qcow2".into()).await).is_none());
}

#[tokio::test]
async fn the_pool_shares_one_connection_and_unpooled_ones_are_fresh() {
    let mut setup = Setup::new();
    let first = setup.open().await;
    let second = setup.open().await;
    let mut view = setup.call.view();
    ok(view
        .define_domain(
            Resource::new_borrow(first.rep()),
            domain_xml("proxy-a", None),
        )
        .await);
    // Same URI, same pooled connection: the second handle sees the domain.
    assert!(ok(view.lookup_domain(second, "proxy-a".into()).await).is_some());
    // A fresh connection to a test-driver file gets a private state of its own.
    let fresh = ok(view.open_unpooled("node".into()).await);
    let version = ok(view.version(Resource::new_borrow(fresh.rep())).await);
    assert_eq!(version.split('.').count(), 3, "{version}");
    assert!(ok(view.lookup_domain(fresh, "proxy-a".into()).await).is_none());
    drop(setup.capability);
}

#[tokio::test]
async fn autostart_is_off_for_a_new_domain_and_set_autostart_turns_it_on_and_off() {
    let mut setup = Setup::new();
    let connection = setup.open().await;
    let mut view = setup.call.view();
    let domain = ok(view
        .define_domain(
            Resource::new_borrow(connection.rep()),
            domain_xml("proxy-a", None),
        )
        .await);
    let borrow = || Resource::<egress_capability_libvirt::Domain>::new_borrow(domain.rep());
    assert!(!ok(view.autostart(borrow()).await));

    ok(view.set_autostart(borrow(), true).await);
    assert!(ok(view.autostart(borrow()).await));
    // Setting the value it has is a success, and the domain is not started by it.
    ok(view.set_autostart(borrow(), true).await);
    assert!(ok(view.autostart(borrow()).await));
    assert_eq!(ok(view.status(borrow()).await).state, DomainState::Shutoff);
    // Another handle on the same domain reads the same value: it is the domain's, not the handle's.
    let again = ok(view
        .lookup_domain(Resource::new_borrow(connection.rep()), "proxy-a".into())
        .await)
    .unwrap();
    assert!(ok(view.autostart(again).await));

    ok(view.set_autostart(borrow(), false).await);
    assert!(!ok(view.autostart(borrow()).await));
}

#[tokio::test]
async fn set_autostart_past_the_operations_deadline_times_out_and_changes_nothing() {
    let mut setup = Setup::new();
    let connection = setup.open().await;
    let domain = ok(setup
        .call
        .view()
        .define_domain(connection, domain_xml("proxy-a", None))
        .await);
    // The same domain handed to a call whose operation is already over.
    let handle = setup.call.table.delete(domain).unwrap();
    let mut late = Call::until(&setup.capability, "kvm2", std::time::Instant::now());
    let domain = late.table.push(handle).unwrap();
    let mut view = late.view();
    let borrow = || Resource::<egress_capability_libvirt::Domain>::new_borrow(domain.rep());
    assert!(matches!(
        err(view.set_autostart(borrow(), true).await),
        Error::Timeout
    ));
    assert!(matches!(
        err(view.autostart(borrow()).await),
        Error::Timeout
    ));

    let connection = setup.open().await;
    let mut view = setup.call.view();
    let domain = ok(view.lookup_domain(connection, "proxy-a".into()).await).unwrap();
    assert!(!ok(view.autostart(domain).await));
}
