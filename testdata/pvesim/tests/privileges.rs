//! F13, F17: tokens that lack a privilege. Every handler checks what its PVE 9 counterpart checks
//! and answers `403 Permission check failed (<path>, <privilege>)`, or, for a check PVE makes
//! inside a task, fails the task with that text.

mod common;

use common::{Api, LATENCY, encode};
use pvesim::{Acl, SEED_ROLE, SimConfig, operator_role_without};

const VM: u32 = 199_999;

/// A simulator whose main token holds the recorded role on `/` without `missing` (and the seed
/// role on `proxy-seeds`), and any `extra` ACLs.
async fn lacking(missing: &[&str], extra: Vec<Acl>) -> Api {
    let mut token_acls = vec![
        Acl::new("/", &operator_role_without(missing)),
        Acl::new("/storage/proxy-seeds", SEED_ROLE),
    ];
    token_acls.extend(extra);
    Api::start_with(SimConfig {
        task_latency: LATENCY,
        token_acls,
        ..SimConfig::default()
    })
    .await
}

/// A stopped VM of the template's shape at [`VM`], seeded outside the API.
fn seed_vm(api: &Api) {
    api.sim.state().add_qemu_vm(
        VM,
        &[
            ("name", "proxy-a"),
            ("boot", "order=scsi0"),
            ("scsi0", "local-lvm:vm-199999-disk-0,size=3G"),
            ("net0", "virtio=BC:24:11:EE:48:83,bridge=vmbr0"),
            ("agent", "1"),
        ],
    );
}

fn forbidden(path: &str, privilege: &str) -> String {
    format!("Permission check failed ({path}, {privilege})")
}

#[tokio::test]
async fn f17_the_default_tokens_keep_the_recorded_rights() {
    let api = Api::start().await;
    api.clone_template(VM, &[("storage", "local-lvm")]).await;
    let path = format!("/nodes/pv1-1/qemu/{VM}/config");
    let upid = api
        .post(
            &path,
            &[
                ("ide2", "proxy-seeds:iso/proxy-a-seed.iso,media=cdrom"),
                ("net0", "virtio=BC:24:11:EE:48:83,bridge=vmbr0,tag=4"),
                ("agent", "1"),
                ("tags", "proxy_operator"),
                ("cores", "2"),
            ],
        )
        .await
        .upid();
    assert_eq!(api.wait_task(&upid).await["exitstatus"], "OK");
    let limited = api.with_auth(Some(api.sim.limited_token_header()));
    assert_eq!(limited.send("GET", &path, &[]).await.status, 200);
}

/// F17: SDN.Use was held but never exercised in Phase 0. PVE checks it on every NIC a clone
/// copies, so a token without it cannot clone a template whose net0 is on a bridge.
#[tokio::test]
async fn f17_without_sdn_use_a_template_on_a_bridge_cannot_be_cloned() {
    let api = lacking(&["SDN.Use"], vec![]).await;
    let answer = api
        .post(
            "/nodes/pv1-1/qemu/9001/clone",
            &[("newid", "199999"), ("name", "proxy-a"), ("full", "1")],
        )
        .await;
    let expected = forbidden("/sdn/zones/localnetwork/vmbr0", "SDN.Use");
    assert_eq!(
        (answer.status, answer.reason.as_str()),
        (403, expected.as_str())
    );
    assert_eq!(answer.message(), format!("{expected}\n"));
    assert!(api.sim.state().guest(VM).is_none(), "nothing was made");
    let held = api
        .get(&format!(
            "/access/permissions?path={}",
            encode("/sdn/zones/localnetwork/vmbr0")
        ))
        .await;
    assert!(
        held.data()["/sdn/zones/localnetwork/vmbr0"]
            .get("SDN.Use")
            .is_none()
    );
}

/// Phase 0: `bridge=vmbr0,tag=4` is checked on the VLAN's own path. SDN.Use granted on vmbr0
/// without propagation lets the untagged template be cloned, and refuses the tagged net0.
#[tokio::test]
async fn f17_a_vlan_tag_needs_sdn_use_on_its_own_path() {
    let api = lacking(
        &["SDN.Use"],
        vec![Acl::here_only(
            "/sdn/zones/localnetwork/vmbr0",
            &["SDN.Use"],
        )],
    )
    .await;
    api.clone_template(VM, &[]).await;
    let path = format!("/nodes/pv1-1/qemu/{VM}/config");
    let tagged = [("net0", "virtio=BC:24:11:EE:48:83,bridge=vmbr0,tag=4")];
    for method in ["POST", "PUT"] {
        let answer = api.send(method, &path, &tagged).await;
        assert_eq!(
            (answer.status, answer.reason.as_str()),
            (
                403,
                forbidden("/sdn/zones/localnetwork/vmbr0/4", "SDN.Use").as_str()
            ),
            "{method}"
        );
    }
    let net0 = api.sim.state().guest(VM).unwrap().config["net0"].clone();
    assert!(!net0.contains("tag="), "{net0}");
    // Untagged on the same bridge is allowed.
    let untagged = [("net0", "virtio=BC:24:11:EE:48:83,bridge=vmbr0")];
    assert_eq!(api.put(&path, &untagged).await.status, 200);
}

/// The privilege taken away, method, path, form, and the path the 403 names.
type Row<'a> = (&'a str, &'a str, String, Vec<(&'a str, &'a str)>, String);

/// Each call checks its privilege on its path before it acts.
#[tokio::test]
async fn f17_each_call_is_refused_without_its_privilege() {
    let vm = format!("/vms/{VM}");
    let node_vm = format!("/nodes/pv1-1/qemu/{VM}");
    let rows: Vec<Row> = vec![
        (
            "VM.Audit",
            "GET",
            format!("{node_vm}/config"),
            vec![],
            vm.clone(),
        ),
        (
            "VM.Audit",
            "GET",
            format!("{node_vm}/status/current"),
            vec![],
            vm.clone(),
        ),
        (
            "VM.Config.Options",
            "PUT",
            format!("{node_vm}/config"),
            vec![("onboot", "1")],
            vm.clone(),
        ),
        (
            "VM.Config.Network",
            "POST",
            format!("{node_vm}/config"),
            vec![("net0", "virtio=BC:24:11:EE:48:83,bridge=vmbr1")],
            vm.clone(),
        ),
        (
            "VM.Config.CPU",
            "PUT",
            format!("{node_vm}/config"),
            vec![("cores", "2")],
            vm.clone(),
        ),
        (
            "VM.Config.Memory",
            "PUT",
            format!("{node_vm}/config"),
            vec![("memory", "1024")],
            vm.clone(),
        ),
        (
            "VM.Config.Disk",
            "PUT",
            format!("{node_vm}/resize"),
            vec![("disk", "scsi0"), ("size", "8G")],
            vm.clone(),
        ),
        (
            "VM.PowerMgmt",
            "POST",
            format!("{node_vm}/status/start"),
            vec![],
            vm.clone(),
        ),
        (
            "VM.GuestAgent.Audit",
            "GET",
            format!("{node_vm}/agent/network-get-interfaces"),
            vec![],
            vm.clone(),
        ),
        ("VM.Allocate", "DELETE", node_vm.clone(), vec![], vm.clone()),
        (
            "VM.Clone",
            "POST",
            "/nodes/pv1-1/qemu/9001/clone".into(),
            vec![("newid", "199998"), ("name", "proxy-b")],
            "/vms/9001".into(),
        ),
        (
            "Datastore.AllocateSpace",
            "POST",
            "/nodes/pv1-1/qemu/9001/clone".into(),
            vec![
                ("newid", "199998"),
                ("name", "proxy-b"),
                ("storage", "local-lvm"),
            ],
            "/storage/local-lvm".into(),
        ),
    ];
    for (privilege, method, path, form, refused_on) in rows {
        let api = lacking(&[privilege], vec![]).await;
        seed_vm(&api);
        let before = api.sim.state().guest(VM).unwrap().config;
        let answer = api.send(method, &path, &form).await;
        assert_eq!(
            (answer.status, answer.reason.as_str()),
            (403, forbidden(&refused_on, privilege).as_str()),
            "{privilege}: {method} {path}"
        );
        assert_eq!(
            api.sim.state().guest(VM).unwrap().config,
            before,
            "{privilege}"
        );
        assert!(api.sim.state().guest(199_998).is_none(), "{privilege}");
    }
}

#[tokio::test]
async fn f17_without_vm_allocate_on_the_new_vmid_the_clone_names_no_path() {
    let api = lacking(&["VM.Allocate"], vec![]).await;
    let answer = api
        .post(
            "/nodes/pv1-1/qemu/9001/clone",
            &[("newid", "199999"), ("name", "proxy-a")],
        )
        .await;
    // An `or` of VM.Allocate on the VMID and on a pool: PVE's refusal names neither.
    assert_eq!(
        (answer.status, answer.reason.as_str()),
        (403, "Permission check failed")
    );
}

#[tokio::test]
async fn f17_without_vm_audit_the_listing_leaves_the_vms_out() {
    let api = lacking(&["VM.Audit"], vec![]).await;
    seed_vm(&api);
    let listing = api.get("/cluster/resources?type=vm").await;
    assert_eq!(listing.status, 200);
    assert_eq!(listing.data().as_array().unwrap().len(), 0, "{listing:?}");
    // A grant on one VM shows that one.
    let api = lacking(&["VM.Audit"], vec![Acl::new("/vms/9001", &["VM.Audit"])]).await;
    let listing = api.get("/cluster/resources?type=vm").await;
    let vmids: Vec<&serde_json::Value> = listing
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["vmid"])
        .collect();
    assert_eq!(vmids, [9001]);
}

/// Checks PVE makes inside the task: the config task checks a drive's VM.Config.CDROM, the resize
/// task the disk storage's Datastore.AllocateSpace. The call is accepted; its task fails with the
/// permission text, and nothing changes.
#[tokio::test]
async fn f17_checks_made_inside_a_task_fail_the_task() {
    let api = lacking(&["VM.Config.CDROM"], vec![]).await;
    seed_vm(&api);
    let upid = api
        .post(
            &format!("/nodes/pv1-1/qemu/{VM}/config"),
            &[
                ("ide2", "proxy-seeds:iso/proxy-a-seed.iso,media=cdrom"),
                ("agent", "1"),
            ],
        )
        .await
        .upid();
    let status = api.wait_task(&upid).await;
    assert_eq!(
        status["exitstatus"],
        forbidden(&format!("/vms/{VM}"), "VM.Config.CDROM")
    );
    assert!(
        !api.sim
            .state()
            .guest(VM)
            .unwrap()
            .config
            .contains_key("ide2")
    );
    // PUT runs the same checks synchronously: the 403 itself.
    let answer = api
        .put(
            &format!("/nodes/pv1-1/qemu/{VM}/config"),
            &[("ide2", "proxy-seeds:iso/proxy-a-seed.iso,media=cdrom")],
        )
        .await;
    assert_eq!(answer.status, 403, "{answer:?}");

    let api = lacking(&["Datastore.AllocateSpace"], vec![]).await;
    seed_vm(&api);
    let upid = api
        .put(
            &format!("/nodes/pv1-1/qemu/{VM}/resize"),
            &[("disk", "scsi0"), ("size", "8G")],
        )
        .await
        .upid();
    let status = api.wait_task(&upid).await;
    assert_eq!(
        status["exitstatus"],
        forbidden("/storage/local-lvm", "Datastore.AllocateSpace")
    );
    let scsi0 = api.sim.state().guest(VM).unwrap().config["scsi0"].clone();
    assert!(scsi0.ends_with("size=3G"), "{scsi0}");
}

#[tokio::test]
async fn f12_f17_uploads_and_storage_reads_need_their_datastore_privileges() {
    let api = lacking(&["Datastore.AllocateTemplate"], vec![]).await;
    let answer = api.upload("local", "proxy-a-seed.iso", b"seed").await;
    assert_eq!(
        (answer.status, answer.reason.as_str()),
        (
            403,
            forbidden("/storage/local", "Datastore.AllocateTemplate").as_str()
        )
    );
    // The seed role on proxy-seeds repeats it (the Phase 0 ACL caveat).
    assert_eq!(
        api.upload("proxy-seeds", "proxy-a-seed.iso", b"seed")
            .await
            .status,
        200
    );

    let api = lacking(&["Datastore.Audit", "Datastore.AllocateSpace"], vec![]).await;
    let answer = api.get("/nodes/pv1-1/storage/local-lvm/status").await;
    assert_eq!(
        (answer.status, answer.reason.as_str()),
        (
            403,
            forbidden(
                "/storage/local-lvm",
                "Datastore.Audit|Datastore.AllocateSpace"
            )
            .as_str()
        )
    );
}
