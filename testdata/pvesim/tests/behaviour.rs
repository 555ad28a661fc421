//! Endpoint behaviour beyond the recorded facts, from the upstream-source notes.

mod common;

use common::{Api, encode};
use pvesim::RunState;
use serde_json::Value;

#[tokio::test]
async fn nextid_is_a_string_with_the_lowest_free_id_and_refuses_a_taken_one() {
    let api = Api::start().await;
    assert_eq!(
        api.get("/cluster/nextid").await.data(),
        &Value::String("100".into())
    );
    api.sim.state().add_lxc(100, "ct");
    assert_eq!(api.get("/cluster/nextid").await.data(), "101");
    let taken = api.get("/cluster/nextid?vmid=9001").await;
    assert_eq!(taken.status, 400);
    assert_eq!(taken.body["errors"]["vmid"], "VM 9001 already exists");
    assert_eq!(api.get("/cluster/nextid?vmid=4242").await.data(), "4242");
}

#[tokio::test]
async fn clone_gives_new_macs_drops_template_and_names_disks_for_the_target() {
    let api = Api::start().await;
    api.clone_template(199_999, &[]).await;
    let template = api
        .get("/nodes/pv1-1/qemu/9001/config")
        .await
        .data()
        .clone();
    let clone = api
        .get("/nodes/pv1-1/qemu/199999/config")
        .await
        .data()
        .clone();
    assert_ne!(template["net0"], clone["net0"]);
    assert!(
        clone["net0"]
            .as_str()
            .unwrap()
            .starts_with("virtio=BC:24:11:")
    );
    assert!(clone["net0"].as_str().unwrap().ends_with(",bridge=vmbr0"));
    assert!(clone.get("template").is_none());
    assert!(
        clone["scsi0"]
            .as_str()
            .unwrap()
            .starts_with("local-lvm:vm-199999-disk-")
    );
    assert_ne!(template["digest"], clone["digest"]);
    assert_eq!(clone["lock"], Value::Null);
}

#[tokio::test]
async fn clone_of_a_locked_source_is_refused() {
    let api = Api::start().await;
    api.sim.state().set_lock(9001, Some("backup"));
    let answer = api
        .post("/nodes/pv1-1/qemu/9001/clone", &[("newid", "199999")])
        .await;
    assert_eq!(
        (answer.status, answer.reason.as_str()),
        (500, "VM is locked (backup)")
    );
}

#[tokio::test]
async fn start_on_a_running_vm_fails_in_the_task_and_stop_on_stopped_is_ok() {
    let api = Api::start().await;
    api.clone_template(199_999, &[]).await;
    let stop = api
        .post("/nodes/pv1-1/qemu/199999/status/stop", &[])
        .await
        .upid();
    assert_eq!(api.wait_task(&stop).await["exitstatus"], "OK");
    let first = api
        .post("/nodes/pv1-1/qemu/199999/status/start", &[])
        .await
        .upid();
    assert_eq!(api.wait_task(&first).await["exitstatus"], "OK");
    let second = api
        .post("/nodes/pv1-1/qemu/199999/status/start", &[])
        .await
        .upid();
    assert_eq!(
        api.wait_task(&second).await["exitstatus"],
        "VM 199999 already running"
    );
}

#[tokio::test]
async fn destroy_refuses_a_running_vm_and_locks_destroyed_while_it_runs() {
    let api = Api::start().await;
    api.clone_template(199_999, &[]).await;
    api.sim.state().set_run_state(199_999, RunState::Running);
    let path = "/nodes/pv1-1/qemu/199999?purge=1&destroy-unreferenced-disks=1";
    let running = api.delete(path).await;
    assert_eq!(
        (running.status, running.reason.as_str()),
        (500, "VM 199999 is running - destroy failed")
    );
    api.sim.state().set_run_state(199_999, RunState::Stopped);
    let upid = api.delete(path).await.upid();
    assert!(upid.contains(":qmdestroy:199999:"));
    assert_eq!(
        api.get("/nodes/pv1-1/qemu/199999/config").await.data()["lock"],
        "destroyed"
    );
    assert_eq!(api.wait_task(&upid).await["exitstatus"], "OK");
    assert_eq!(api.get("/nodes/pv1-1/qemu/199999/config").await.status, 500);
    assert_eq!(
        api.get("/cluster/nextid?vmid=199999").await.status,
        200,
        "the VMID is free again"
    );
}

#[tokio::test]
async fn post_config_returns_a_qmconfig_upid_and_delete_removes_keys() {
    let api = Api::start().await;
    api.clone_template(199_999, &[]).await;
    let upid = api
        .post(
            "/nodes/pv1-1/qemu/199999/config",
            &[("cores", "4"), ("delete", "serial0,vga")],
        )
        .await
        .upid();
    assert!(upid.contains(":qmconfig:199999:"));
    assert_eq!(api.wait_task(&upid).await["exitstatus"], "OK");
    let config = api
        .get("/nodes/pv1-1/qemu/199999/config")
        .await
        .data()
        .clone();
    assert_eq!(config["cores"], 4);
    assert!(config.get("serial0").is_none() && config.get("vga").is_none());
}

#[tokio::test]
async fn config_digest_mismatch_is_refused() {
    let api = Api::start().await;
    let answer = api
        .put(
            "/nodes/pv1-1/qemu/9001/config",
            &[("cores", "4"), ("digest", "0000")],
        )
        .await;
    assert_eq!(answer.status, 500);
    assert_eq!(
        answer.reason,
        "detected modified configuration - file changed by other user? Try again."
    );
}

#[tokio::test]
async fn unknown_parameters_are_400_and_unknown_paths_501() {
    let api = Api::start().await;
    let unknown = api
        .post(
            "/nodes/pv1-1/qemu/9001/clone",
            &[("newid", "199999"), ("colour", "red")],
        )
        .await;
    assert_eq!(unknown.status, 400);
    assert_eq!(
        unknown.body["errors"]["colour"],
        "property is not defined in schema and the schema does not allow additional properties"
    );
    let missing = api.post("/nodes/pv1-1/qemu/9001/clone", &[]).await;
    assert_eq!(
        missing.body["errors"]["newid"],
        "property is missing and it is not optional"
    );
    let nowhere = api.get("/nodes/pv1-1/lxc").await;
    assert_eq!(
        (nowhere.status, nowhere.reason.as_str()),
        (
            501,
            "Method 'GET /api2/json/nodes/pv1-1/lxc' not implemented"
        )
    );
    let other_node = api.get("/nodes/pv9/qemu/9001/config").await;
    assert_eq!(other_node.status, 500);
}

#[tokio::test]
async fn volid_with_escaped_slash_and_content_listing_of_images() {
    let api = Api::start().await;
    let images = api.get("/nodes/pv1-1/storage/local-lvm/content").await;
    let volids: Vec<&str> = images
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["volid"].as_str().unwrap())
        .collect();
    assert!(volids.contains(&"local-lvm:base-9001-disk-1"), "{volids:?}");
    api.sim.state().add_volume("proxy-seeds:iso/x.iso", b"x");
    let path = format!(
        "/nodes/pv1-1/storage/proxy-seeds/content/{}",
        encode("proxy-seeds:iso/x.iso")
    );
    assert!(path.contains("%2F"));
    api.wait_task(&api.delete(&path).await.upid()).await;
    assert!(api.sim.state().volumes("proxy-seeds").is_empty());
}

#[tokio::test]
async fn upload_to_a_storage_without_iso_content_is_refused() {
    let api = Api::start().await;
    let answer = api.upload("local-lvm", "s.iso", b"x").await;
    assert_eq!(
        (answer.status, answer.reason.as_str()),
        (500, "storage 'local-lvm' does not support 'iso' content")
    );
}

#[tokio::test]
async fn nodes_lists_the_one_node_online() {
    let api = Api::start().await;
    let nodes = api.get("/nodes").await;
    assert_eq!(nodes.status, 200);
    let list = nodes.data().as_array().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["node"], "pv1-1");
    assert_eq!(list[0]["status"], "online");
    assert_eq!(list[0]["type"], "node");
    assert_eq!(api.post("/nodes", &[]).await.status, 501);
}

#[tokio::test]
async fn storage_status_reports_content_and_space_and_refuses_unknown_storage() {
    let api = Api::start().await;
    let seeds = api.get("/nodes/pv1-1/storage/proxy-seeds/status").await;
    assert_eq!(seeds.status, 200, "{seeds:?}");
    let data = seeds.data();
    assert_eq!(
        (data["type"].as_str(), data["content"].as_str()),
        (Some("dir"), Some("iso"))
    );
    assert_eq!(
        (data["active"].as_u64(), data["enabled"].as_u64()),
        (Some(1), Some(1))
    );
    let (total, used, avail) = (
        data["total"].as_u64().unwrap(),
        data["used"].as_u64().unwrap(),
        data["avail"].as_u64().unwrap(),
    );
    assert_eq!((used, total - used), (0, avail));

    api.sim
        .state()
        .add_volume("proxy-seeds:iso/a.iso", &[0; 4096]);
    let after = api.get("/nodes/pv1-1/storage/proxy-seeds/status").await;
    assert_eq!(after.data()["used"], 4096);
    assert_eq!(after.data()["avail"].as_u64(), Some(total - 4096));

    let lvm = api.get("/nodes/pv1-1/storage/local-lvm/status").await;
    assert_eq!(lvm.data()["content"], "images,rootdir");
    assert!(
        lvm.data()["used"].as_u64().unwrap() >= 3 << 30,
        "the templates' disks count: {:?}",
        lvm.data()
    );

    // Not captured: the text PVE::Storage::storage_config dies with.
    let missing = api.get("/nodes/pv1-1/storage/nowhere/status").await;
    assert_eq!(
        (missing.status, missing.reason.as_str()),
        (500, "storage 'nowhere' does not exist")
    );
    let other_node = api.get("/nodes/pv9/storage/proxy-seeds/status").await;
    assert_eq!(other_node.status, 500);
}
