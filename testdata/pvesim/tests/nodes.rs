//! A cluster of several nodes (`SimConfig::nodes`): each answers under `/nodes/{node}/…`, a VM is
//! reached only through the node it lives on, a clone with `target` lands on the target when the
//! template's disks are on shared storage and is refused otherwise, and a single node behaves as
//! it always did.

mod common;

use std::time::Duration;

use common::{Api, LATENCY, encode, upid_node};
use pvesim::{RunState, SHARED_STORAGE, SimConfig, Simulator};
use serde_json::{Value, json};

const NEWID: u32 = 199_999;

fn two_nodes() -> SimConfig {
    SimConfig {
        nodes: vec!["pv1-1".into(), "pv1-2".into()],
        task_latency: LATENCY,
        agent_delay: Duration::ZERO,
        ..SimConfig::default()
    }
}

fn resource(resources: &Value, id: &str) -> Option<Value> {
    resources
        .as_array()?
        .iter()
        .find(|e| e["id"] == id)
        .cloned()
}

/// Clones 9001 (on pv1-1) to `newid` on `target` and waits; asserts the task ended OK.
async fn clone_to(api: &Api, newid: u32, target: &str) {
    let newid = newid.to_string();
    let form = [
        ("newid", newid.as_str()),
        ("name", "proxy-b"),
        ("full", "1"),
        ("target", target),
    ];
    let upid = api.post("/nodes/pv1-1/qemu/9001/clone", &form).await.upid();
    assert_eq!(api.wait_task(&upid).await["exitstatus"], "OK");
}

#[tokio::test]
async fn a_two_node_cluster_lists_both_nodes_and_its_shared_storage_once_per_node() {
    let api = Api::start_with(two_nodes()).await;
    let nodes = api.get("/nodes").await;
    let names: Vec<&Value> = nodes
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|n| &n["node"])
        .collect();
    assert_eq!(names, [&json!("pv1-1"), &json!("pv1-2")]);
    assert!(
        nodes
            .data()
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["status"] == "online")
    );

    let resources = api.get("/cluster/resources").await;
    for node in ["pv1-1", "pv1-2"] {
        let entry = resource(resources.data(), &format!("node/{node}")).unwrap();
        assert_eq!(entry["status"], "online", "{entry}");
        let shared = resource(
            resources.data(),
            &format!("storage/{node}/{SHARED_STORAGE}"),
        );
        assert_eq!(shared.unwrap()["shared"], 1, "{node}");
        let seeds = resource(resources.data(), &format!("storage/{node}/proxy-seeds")).unwrap();
        assert_eq!(seeds["shared"], 0, "each node has its own: {seeds}");
    }
    let template = resource(resources.data(), "qemu/9001").unwrap();
    assert_eq!(
        template["node"], "pv1-1",
        "the first node holds the templates"
    );
    let config = api.get("/nodes/pv1-1/qemu/9001/config").await;
    let scsi0 = config.data()["scsi0"].as_str().unwrap();
    assert!(
        scsi0.starts_with(&format!("{SHARED_STORAGE}:base-9001-disk-")),
        "{scsi0}"
    );

    let info = api.admin("GET", "info", "").await;
    assert_eq!(info.data()["nodes"], json!(["pv1-1", "pv1-2"]));
    assert_eq!(info.data()["node"], "pv1-1");
    assert_eq!(api.sim.nodes(), ["pv1-1", "pv1-2"]);
}

#[tokio::test]
async fn an_unknown_node_is_refused_in_a_path_and_as_a_clone_target() {
    let api = Api::start_with(two_nodes()).await;
    let lookup = "hostname lookup 'pv9' failed - failed to get address info for: pv9: Name or \
                  service not known";
    for path in [
        "/nodes/pv9/qemu/9001/config",
        "/nodes/pv9/storage/proxy-seeds/status",
    ] {
        let answer = api.get(path).await;
        assert_eq!(
            (answer.status, answer.reason.as_str()),
            (500, lookup),
            "{path}"
        );
    }
    let clone = api
        .post(
            "/nodes/pv1-1/qemu/9001/clone",
            &[("newid", "199999"), ("target", "pv9")],
        )
        .await;
    assert_eq!(
        (clone.status, clone.reason.as_str()),
        (500, "no such cluster node 'pv9'")
    );
    assert!(api.sim.state().guest(NEWID).is_none(), "nothing made");
    assert!(api.sim.state().tasks().is_empty(), "no task started");
}

#[tokio::test]
async fn a_clone_onto_the_second_node_lives_there_once_its_task_ends() {
    // Long enough to see the clone in flight, as the F8 test does.
    let api = Api::start_with(SimConfig {
        task_latency: Duration::from_millis(200),
        ..two_nodes()
    })
    .await;
    let upid = api
        .post(
            "/nodes/pv1-1/qemu/9001/clone",
            &[
                ("newid", "199999"),
                ("name", "proxy-b"),
                ("target", "pv1-2"),
            ],
        )
        .await
        .upid();
    assert_eq!(
        upid_node(&upid),
        "pv1-1",
        "the node the URL names runs the clone"
    );
    // F8, and qemu-server's clone: the temporary conf is the source node's until the task
    // renames it into the target's directory.
    let resources = api.get("/cluster/resources?type=vm").await;
    let entry = resource(resources.data(), "qemu/199999").unwrap();
    assert_eq!(
        (&entry["node"], &entry["lock"]),
        (&json!("pv1-1"), &json!("clone"))
    );

    assert_eq!(api.wait_task(&upid).await["exitstatus"], "OK");
    let elsewhere = api.task_status_on("pv1-2", &upid).await;
    assert_eq!(elsewhere.status, 400, "another node has no such task");
    assert_eq!(elsewhere.body["errors"]["upid"], "no such task");
    let resources = api.get("/cluster/resources?type=vm").await;
    let entry = resource(resources.data(), "qemu/199999").unwrap();
    assert_eq!(
        (&entry["node"], &entry["name"]),
        (&json!("pv1-2"), &json!("proxy-b"))
    );
    assert_eq!(api.sim.state().guest(NEWID).unwrap().node, "pv1-2");
    let config = api.get("/nodes/pv1-2/qemu/199999/config").await;
    assert_eq!(config.status, 200, "{config:?}");
    // A template clones linked by default: the new disk is a child of the base, on its storage.
    let scsi0 = config.data()["scsi0"].as_str().unwrap();
    let linked = format!("{SHARED_STORAGE}:base-9001-disk-1/vm-199999-disk-");
    assert!(scsi0.starts_with(&linked), "{scsi0}");
}

#[tokio::test]
async fn f3_a_start_queued_behind_a_cross_node_clone_fails_once_the_conf_has_moved() {
    let api = Api::start_with(SimConfig {
        task_latency: Duration::from_millis(200),
        ..two_nodes()
    })
    .await;
    let clone = api
        .post(
            "/nodes/pv1-1/qemu/9001/clone",
            &[("newid", "199999"), ("target", "pv1-2")],
        )
        .await
        .upid();
    // Mid-clone the conf is pv1-1's: the target does not know the VM yet ...
    let early = api.post("/nodes/pv1-2/qemu/199999/status/start", &[]).await;
    assert_eq!(
        (early.status, early.reason.as_str()),
        (
            500,
            "Configuration file 'nodes/pv1-2/qemu-server/199999.conf' does not exist"
        )
    );
    // ... and the source node queues a start behind the clone's lock (F3), whose worker then
    // finds the conf gone to pv1-2.
    let queued = api
        .post("/nodes/pv1-1/qemu/199999/status/start", &[])
        .await
        .upid();
    assert_eq!(api.wait_task(&clone).await["exitstatus"], "OK");
    assert_eq!(
        api.wait_task(&queued).await["exitstatus"],
        "Configuration file 'nodes/pv1-1/qemu-server/199999.conf' does not exist"
    );
    assert_eq!(
        api.sim.state().guest(NEWID).unwrap().run_state,
        RunState::Stopped
    );
}

#[tokio::test]
async fn a_vm_on_the_second_node_is_operated_only_through_it() {
    let api = Api::start_with(two_nodes()).await;
    clone_to(&api, NEWID, "pv1-2").await;
    // F2: through pv1-1 the VM does not exist, whatever is asked of it.
    let missing = "Configuration file 'nodes/pv1-1/qemu-server/199999.conf' does not exist";
    for (method, rest, form) in [
        ("GET", "config", &[][..]),
        ("PUT", "config", &[("cores", "4")][..]),
        ("POST", "config", &[("cores", "4")][..]),
        ("GET", "status/current", &[][..]),
        ("POST", "status/start", &[][..]),
        ("POST", "status/stop", &[][..]),
        ("PUT", "resize", &[("disk", "scsi0"), ("size", "8G")][..]),
        ("GET", "agent/network-get-interfaces", &[][..]),
        ("DELETE", "", &[][..]),
    ] {
        let path = format!("/nodes/pv1-1/qemu/199999/{rest}");
        let answer = api.send(method, path.trim_end_matches('/'), form).await;
        assert_eq!(
            (answer.status, answer.reason.as_str()),
            (500, missing),
            "{method} {rest}"
        );
    }

    let on_b = |rest: &str| format!("/nodes/pv1-2/qemu/199999/{rest}");
    let start = api.post(&on_b("status/start"), &[]).await.upid();
    assert_eq!(upid_node(&start), "pv1-2", "its node runs its tasks");
    assert_eq!(api.wait_task(&start).await["node"], "pv1-2");
    let agent = api.get(&on_b("agent/network-get-interfaces")).await;
    assert_eq!(agent.status, 200, "{agent:?}");
    assert_eq!(
        api.get(&on_b("status/current")).await.data()["status"],
        "running"
    );
    api.put(&on_b("config"), &[("cores", "4")]).await;
    assert_eq!(api.get(&on_b("config")).await.data()["cores"], 4);
    let stop = api.post(&on_b("status/stop"), &[]).await.upid();
    assert_eq!(api.wait_task(&stop).await["exitstatus"], "OK");
    let destroy = api.delete("/nodes/pv1-2/qemu/199999").await.upid();
    assert_eq!(api.wait_task(&destroy).await["exitstatus"], "OK");
    assert!(
        api.sim.state().guest(NEWID).is_none(),
        "destroyed through its node"
    );
}

#[tokio::test]
async fn a_cross_node_clone_of_a_template_on_local_storage_is_refused_up_front() {
    let api = Api::start_with(SimConfig {
        template_storage: Some("local-lvm".into()),
        ..two_nodes()
    })
    .await;
    let refused = api
        .post(
            "/nodes/pv1-1/qemu/9001/clone",
            &[("newid", "199999"), ("full", "1"), ("target", "pv1-2")],
        )
        .await;
    assert_eq!(
        (refused.status, refused.reason.as_str()),
        (
            500,
            "can't clone VM to node 'pv1-2' (VM uses local storage)"
        )
    );
    assert!(api.sim.state().guest(NEWID).is_none(), "nothing made");
    assert!(api.sim.state().tasks().is_empty(), "no task started");
    // qemu-server drops a target naming the node that runs the clone.
    clone_to(&api, NEWID, "pv1-1").await;
    assert_eq!(api.sim.state().guest(NEWID).unwrap().node, "pv1-1");
}

#[tokio::test]
async fn a_cross_node_clone_onto_a_storage_of_each_nodes_own_is_refused_up_front() {
    let api = Api::start_with(two_nodes()).await;
    let clone = |storage: &'static str| {
        let api = &api;
        async move {
            api.post(
                "/nodes/pv1-1/qemu/9001/clone",
                &[
                    ("newid", "199999"),
                    ("full", "1"),
                    ("storage", storage),
                    ("target", "pv1-2"),
                ],
            )
            .await
        }
    };
    let refused = clone("local-lvm").await;
    assert_eq!(
        (refused.status, refused.reason.as_str()),
        (500, "can't clone to non-shared storage 'local-lvm'")
    );
    assert!(api.sim.state().guest(NEWID).is_none(), "nothing made");
    let upid = clone(SHARED_STORAGE).await.upid();
    assert_eq!(api.wait_task(&upid).await["exitstatus"], "OK");
    assert_eq!(api.sim.state().guest(NEWID).unwrap().node, "pv1-2");
}

#[tokio::test]
async fn a_seed_uploaded_through_a_node_is_on_that_nodes_storage_only() {
    let api = Api::start_with(two_nodes()).await;
    let volid = "proxy-seeds:iso/proxy-b-seed.iso";
    let upload = api
        .upload_on("pv1-2", "proxy-seeds", "proxy-b-seed.iso", b"seed")
        .await;
    let upid = upload.upid();
    assert_eq!(upid_node(&upid), "pv1-2");
    assert_eq!(api.wait_task(&upid).await["exitstatus"], "OK");
    let log = api.sim.state().task(&upid).unwrap().log;
    assert!(log.contains(&"target node: pv1-2".to_string()), "{log:?}");
    let content = |node: &str| {
        let path = format!("/nodes/{node}/storage/proxy-seeds/content");
        let api = &api;
        async move {
            let answer = api.get(&path).await;
            let volids: Vec<Value> = answer
                .data()
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["volid"].clone())
                .collect();
            volids
        }
    };
    assert_eq!(content("pv1-2").await, [json!(volid)]);
    assert!(
        content("pv1-1").await.is_empty(),
        "pv1-1's own storage holds none"
    );

    // The seed attaches to a VM on pv1-2 (the provider's config write, F19).
    clone_to(&api, NEWID, "pv1-2").await;
    let attach = api
        .put(
            "/nodes/pv1-2/qemu/199999/config",
            &[("ide2", &format!("{volid},media=cdrom"))],
        )
        .await;
    assert_eq!(attach.status, 200, "{attach:?}");

    // F13: a delete through pv1-1 finds nothing there and still ends OK; pv1-2's copy stays.
    let delete = |node: &str| {
        format!(
            "/nodes/{node}/storage/proxy-seeds/content/{}",
            encode(volid)
        )
    };
    let upid = api.delete(&delete("pv1-1")).await.upid();
    assert_eq!(api.wait_task(&upid).await["exitstatus"], "OK");
    assert_eq!(content("pv1-2").await, [json!(volid)]);
    // F13/F17: the limited token lacks Datastore.Allocate on proxy-seeds on every node.
    let limited = api.with_auth(Some(api.sim.limited_token_header()));
    let forbidden = limited.send("DELETE", &delete("pv1-2"), &[]).await;
    assert_eq!(
        (forbidden.status, forbidden.reason.as_str()),
        (
            403,
            "Permission check failed (/storage/proxy-seeds, Datastore.Allocate)"
        )
    );
    let upid = api.delete(&delete("pv1-2")).await.upid();
    assert_eq!(upid_node(&upid), "pv1-2");
    assert_eq!(api.wait_task(&upid).await["exitstatus"], "OK");
    assert!(content("pv1-2").await.is_empty());
}

#[tokio::test]
async fn a_reboot_stops_and_starts_only_the_guests_of_its_node() {
    let api = Api::start_with(two_nodes()).await;
    // On pv1-1 one VM runs and one is stopped; on pv1-2 one runs. All start on boot.
    let (running_a, stopped_a, on_b) = (NEWID, NEWID + 1, NEWID + 2);
    clone_to(&api, running_a, "pv1-1").await;
    clone_to(&api, stopped_a, "pv1-1").await;
    clone_to(&api, on_b, "pv1-2").await;
    for (node, vmid) in [("pv1-1", running_a), ("pv1-2", on_b)] {
        let path = format!("/nodes/{node}/qemu/{vmid}/status/start");
        let upid = api.post(&path, &[]).await.upid();
        assert_eq!(api.wait_task(&upid).await["exitstatus"], "OK");
    }
    for vmid in [running_a, stopped_a, on_b] {
        assert!(api.sim.state().set_config(vmid, "onboot", Some("1")));
    }
    let reboot = api.sim.reboot_node("pv1-2", true).unwrap();
    assert_eq!(reboot.stopped, [on_b]);
    let startall = reboot.startall.unwrap();
    assert_eq!(
        upid_node(&startall),
        "pv1-2",
        "the rebooted node's own task"
    );
    assert_eq!(api.wait_task(&startall).await["exitstatus"], "OK");
    assert_eq!(
        api.sim.state().task(&startall).unwrap().log,
        [format!("Starting VM {on_b}")],
        "it starts its own guests only"
    );
    let run_state = |vmid| api.sim.state().guest(vmid).unwrap().run_state;
    assert_eq!(run_state(running_a), RunState::Running, "pv1-1 ran on");
    assert_eq!(
        run_state(stopped_a),
        RunState::Stopped,
        "not pv1-2's to start"
    );
    assert_eq!(run_state(on_b), RunState::Running, "started by startall");
}

#[tokio::test]
async fn one_node_by_default_holding_the_templates_on_local_lvm_without_a_shared_storage() {
    let api = Api::start().await;
    assert_eq!(api.sim.nodes(), ["pv1-1"]);
    let resources = api.get("/cluster/resources?type=storage").await;
    let storages: Vec<&Value> = resources
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["id"])
        .collect();
    assert_eq!(
        storages,
        [
            &json!("storage/pv1-1/local"),
            &json!("storage/pv1-1/local-lvm"),
            &json!("storage/pv1-1/proxy-seeds")
        ]
    );
    let config = api.get("/nodes/pv1-1/qemu/9001/config").await;
    assert_eq!(
        config.data()["scsi0"],
        "local-lvm:base-9001-disk-1,iothread=1,size=3G",
        "F19"
    );
    let other = api
        .post(
            "/nodes/pv1-1/qemu/9001/clone",
            &[("newid", "199999"), ("target", "pv1-2")],
        )
        .await;
    assert_eq!(
        (other.status, other.reason.as_str()),
        (500, "no such cluster node 'pv1-2'")
    );
}

#[tokio::test]
async fn a_cluster_without_a_node_with_a_bad_or_repeated_name_or_a_diskless_template_storage_is_refused()
 {
    let nodes = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    for (config, why) in [
        (
            SimConfig {
                nodes: nodes(&[]),
                ..SimConfig::default()
            },
            "at least one node",
        ),
        (
            SimConfig {
                nodes: nodes(&["pv1-1", "pv 2"]),
                ..SimConfig::default()
            },
            "\"pv 2\"",
        ),
        (
            SimConfig {
                nodes: nodes(&["pv1-1", "-pv"]),
                ..SimConfig::default()
            },
            "\"-pv\"",
        ),
        (
            SimConfig {
                nodes: nodes(&["pv1-1", "pv1-1"]),
                ..SimConfig::default()
            },
            "twice",
        ),
        (
            SimConfig {
                template_storage: Some("proxy-seeds".into()),
                ..SimConfig::default()
            },
            "holds no VM disks",
        ),
        (
            SimConfig {
                template_storage: Some(SHARED_STORAGE.into()),
                ..SimConfig::default()
            },
            "holds no VM disks",
        ),
    ] {
        let error = Simulator::start(config).await.unwrap_err().to_string();
        assert!(error.contains(why), "{why}: {error}");
    }
}
