//! One test (or more) per recorded fact F1–F23 the simulator reproduces, over real HTTPS.

mod common;

use std::time::Duration;

use common::{Api, LATENCY, encode};
use pvesim::{RunState, SimConfig};
use serde_json::{Value, json};

const NEWID: u32 = 199_999;

fn resource(resources: &Value, vmid: u32) -> Option<Value> {
    resources
        .as_array()?
        .iter()
        .find(|e| e["vmid"] == vmid)
        .cloned()
}

#[tokio::test]
async fn f1_error_text_is_in_reason_phrase_and_body_message() {
    let api = Api::start().await;
    let answer = api.get("/nodes/pv1-1/qemu/999999/status/current").await;
    assert_eq!(answer.status, 500);
    assert_eq!(
        answer.reason,
        "Configuration file 'nodes/pv1-1/qemu-server/999999.conf' does not exist"
    );
    assert_eq!(answer.message(), format!("{}\n", answer.reason));
    assert_eq!(answer.body["data"], Value::Null);

    let bad = api
        .put("/nodes/pv1-1/qemu/9001/config", &[("tags", "a b")])
        .await;
    assert_eq!(
        (bad.status, bad.reason.as_str()),
        (400, "Parameter verification failed.")
    );
    assert_eq!(bad.message(), "Parameter verification failed.\n");
    assert!(
        bad.body["errors"]["tags"].is_string(),
        "400 carries an errors map: {bad:?}"
    );
}

#[tokio::test]
async fn f1_unauthorized_has_reason_only_and_empty_body() {
    let api = Api::start().await;
    let answer = api.with_auth(None).send("GET", "/version", &[]).await;
    assert_eq!((answer.status, answer.reason.as_str()), (401, "No ticket"));
    assert!(
        answer.raw.is_empty(),
        "401 body must be empty, got {:?}",
        answer.raw
    );
}

#[tokio::test]
async fn f1_envelope_headers_match_pveproxy() {
    let api = Api::start().await;
    let response = api
        .client
        .get(format!("{}/api2/json/version", api.sim.url()))
        .header("Authorization", api.sim.token_header())
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["server"], "pve-api-daemon/3.0");
    assert_eq!(
        response.headers()["content-type"],
        "application/json;charset=UTF-8"
    );
    let body: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(
        body,
        json!({"data": {"release": "9.2", "version": "9.2.20", "repoid": "49318c671b82f31e"}})
    );
}

#[tokio::test]
async fn f2_missing_vm_same_text_for_config_status_and_delete() {
    let api = Api::start().await;
    let text = "Configuration file 'nodes/pv1-1/qemu-server/999999.conf' does not exist";
    for (method, path) in [
        ("GET", "/nodes/pv1-1/qemu/999999/config"),
        ("GET", "/nodes/pv1-1/qemu/999999/status/current"),
        (
            "DELETE",
            "/nodes/pv1-1/qemu/999999?purge=1&destroy-unreferenced-disks=1",
        ),
    ] {
        let answer = api.send(method, path, &[]).await;
        assert_eq!(
            (answer.status, answer.reason.as_str()),
            (500, text),
            "{method} {path}"
        );
    }
    // An LXC container at that VMID is still no QEMU VM.
    api.sim.state().add_lxc(555, "ct");
    let answer = api.get("/nodes/pv1-1/qemu/555/config").await;
    assert_eq!(
        answer.reason,
        "Configuration file 'nodes/pv1-1/qemu-server/555.conf' does not exist"
    );
}

#[tokio::test]
async fn f3_start_while_clone_locked_is_accepted_and_runs_after_the_clone() {
    let api = Api::start_with(SimConfig {
        task_latency: Duration::from_millis(150),
        ..SimConfig::default()
    })
    .await;
    let clone = api
        .post(
            "/nodes/pv1-1/qemu/9001/clone",
            &[("newid", "199999"), ("name", "proxy-a"), ("full", "1")],
        )
        .await
        .upid();
    let start = api.post("/nodes/pv1-1/qemu/199999/status/start", &[]).await;
    assert_eq!(
        start.status, 200,
        "start while clone-locked must be accepted: {start:?}"
    );
    let start = start.upid();
    let clone_done = api.wait_task(&clone).await;
    assert_eq!(clone_done["exitstatus"], "OK");
    let start_done = api.wait_task(&start).await;
    assert_eq!(start_done["exitstatus"], "OK");
    let log = api.sim.state().task(&start).unwrap().log;
    assert_eq!(
        log[..2],
        ["trying to acquire lock...".to_string(), " OK".to_string()]
    );
    assert_eq!(
        api.sim.state().guest(NEWID).unwrap().run_state,
        RunState::Running
    );
}

#[tokio::test]
async fn f4_clone_onto_taken_vmid_is_sync_500() {
    let api = Api::start().await;
    api.clone_template(NEWID, &[]).await;
    let tasks_before = api.sim.state().tasks().len();
    let answer = api
        .post(
            "/nodes/pv1-1/qemu/9001/clone",
            &[("newid", "199999"), ("name", "proxy-b")],
        )
        .await;
    assert_eq!(
        (answer.status, answer.reason.as_str()),
        (
            500,
            "unable to create VM 199999: config file already exists"
        )
    );
    assert_eq!(
        api.sim.state().tasks().len(),
        tasks_before,
        "no task is started"
    );
}

#[tokio::test]
async fn f5_agent_has_three_distinct_errors_then_answers() {
    let api = Api::start_with(SimConfig {
        task_latency: LATENCY,
        agent_delay: Duration::from_millis(300),
        ..SimConfig::default()
    })
    .await;
    api.clone_template(NEWID, &[]).await;
    let agent = "/nodes/pv1-1/qemu/199999/agent/network-get-interfaces";
    let stopped = api.get(agent).await;
    assert_eq!(
        (stopped.status, stopped.reason.as_str()),
        (500, "VM 199999 is not running")
    );

    let start = api
        .post("/nodes/pv1-1/qemu/199999/status/start", &[])
        .await
        .upid();
    api.wait_task(&start).await;
    let booting = api.get(agent).await;
    assert_eq!(
        (booting.status, booting.reason.as_str()),
        (500, "QEMU guest agent is not running")
    );

    tokio::time::sleep(Duration::from_millis(320)).await;
    assert_eq!(api.get(agent).await.status, 200);

    api.put("/nodes/pv1-1/qemu/199999/config", &[("delete", "agent")])
        .await;
    let unconfigured = api.get(agent).await;
    assert_eq!(
        (unconfigured.status, unconfigured.reason.as_str()),
        (500, "No QEMU guest agent configured")
    );
}

#[tokio::test]
async fn f7_config_write_while_clone_locked_is_500() {
    let api = Api::start_with(SimConfig {
        task_latency: Duration::from_millis(200),
        ..SimConfig::default()
    })
    .await;
    let clone = api
        .post(
            "/nodes/pv1-1/qemu/9001/clone",
            &[("newid", "199999"), ("name", "proxy-a")],
        )
        .await
        .upid();
    for method in ["PUT", "POST"] {
        let answer = api
            .send(method, "/nodes/pv1-1/qemu/199999/config", &[("cores", "4")])
            .await;
        assert_eq!(
            (answer.status, answer.reason.as_str()),
            (500, "VM is locked (clone)"),
            "{method}"
        );
    }
    let config = api.get("/nodes/pv1-1/qemu/199999/config").await;
    assert_eq!(config.data()["lock"], "clone");
    api.wait_task(&clone).await;
    assert_eq!(
        api.put("/nodes/pv1-1/qemu/199999/config", &[("cores", "4")])
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn f8_mid_clone_entry_is_nameless_and_unknown() {
    let api = Api::start_with(SimConfig {
        task_latency: Duration::from_millis(200),
        ..SimConfig::default()
    })
    .await;
    let clone = api
        .post(
            "/nodes/pv1-1/qemu/9001/clone",
            &[("newid", "199999"), ("name", "proxy-a")],
        )
        .await
        .upid();
    let resources = api.get("/cluster/resources?type=vm").await;
    let entry = resource(resources.data(), NEWID).unwrap();
    assert_eq!(
        entry,
        json!({"id": "qemu/199999", "type": "qemu", "vmid": 199999, "node": "pv1-1", "lock": "clone", "status": "unknown"})
    );
    let status = api.get("/nodes/pv1-1/qemu/199999/status/current").await;
    assert_eq!(status.data()["lock"], "clone");

    api.wait_task(&clone).await;
    let resources = api.get("/cluster/resources?type=vm").await;
    let entry = resource(resources.data(), NEWID).unwrap();
    assert_eq!(entry["name"], "proxy-a");
    assert_eq!(entry["status"], "stopped");
    assert!(
        entry.get("lock").is_none(),
        "lock appears only when set: {entry}"
    );
    for key in ["maxcpu", "maxmem", "maxdisk", "uptime", "template"] {
        assert!(entry.get(key).is_some(), "missing {key}: {entry}");
    }
    // qemu and lxc both appear with type=vm.
    api.sim.state().add_lxc(300, "ct-1");
    let resources = api.get("/cluster/resources?type=vm").await;
    assert_eq!(resource(resources.data(), 300).unwrap()["type"], "lxc");
}

#[tokio::test]
async fn f9_tags_keep_hyphens_fold_case_and_refuse_space_or_bang() {
    let api = Api::start().await;
    api.clone_template(NEWID, &[]).await;
    let path = "/nodes/pv1-1/qemu/199999/config";
    assert_eq!(
        api.put(path, &[("tags", "Proxy_Operator;egress-proxy")])
            .await
            .status,
        200
    );
    assert_eq!(
        api.get(path).await.data()["tags"],
        "egress-proxy;proxy_operator"
    );
    for bad in ["proxy operator", "proxy!"] {
        let answer = api.put(path, &[("tags", bad)]).await;
        assert_eq!(answer.status, 400, "{bad}");
        assert_eq!(
            answer.body["errors"]["tags"],
            "invalid format - invalid characters in tag\n"
        );
    }
}

#[tokio::test]
async fn f10_clone_description_survives_verbatim_with_newlines() {
    let api = Api::start().await;
    let description = "egress-operator\nuid: 0b9f7c1e-1111-4222-8333-944455556666\n\nwritten-at-create: 2026-09-18T15:02:00Z";
    api.clone_template(NEWID, &[("description", description)])
        .await;
    let config = api.get("/nodes/pv1-1/qemu/199999/config").await;
    assert_eq!(config.data()["description"], description);
    assert_eq!(config.data()["name"], "proxy-reconaaaaaaaaaaa");
}

#[tokio::test]
async fn f11_clone_meta_is_copied_from_the_template() {
    let api = Api::start().await;
    api.clone_template(NEWID, &[]).await;
    let clone = api.get("/nodes/pv1-1/qemu/199999/config").await;
    let template = api.get("/nodes/pv1-1/qemu/9001/config").await;
    assert_eq!(
        clone.data()["meta"],
        "creation-qemu=11.0.3,ctime=1790145676"
    );
    assert_eq!(clone.data()["meta"], template.data()["meta"]);
}

#[tokio::test]
async fn f12_upload_overwrites_silently_and_refuses_a_wrong_extension() {
    let api = Api::start().await;
    for bytes in [&b"first seed"[..], &b"second seed, longer"[..]] {
        let upid = api
            .upload("proxy-seeds", "proxy-a-seed.iso", bytes)
            .await
            .upid();
        assert!(
            upid.contains(":imgcopy::"),
            "imgcopy with an empty id: {upid}"
        );
        assert_eq!(api.wait_task(&upid).await["exitstatus"], "OK");
    }
    assert_eq!(
        api.sim
            .state()
            .volume("proxy-seeds:iso/proxy-a-seed.iso")
            .unwrap(),
        b"second seed, longer"
    );
    let listed = api.get("/nodes/pv1-1/storage/proxy-seeds/content").await;
    assert_eq!(listed.data().as_array().unwrap().len(), 1);
    assert_eq!(
        listed.data()[0]["volid"],
        "proxy-seeds:iso/proxy-a-seed.iso"
    );

    let bad = api
        .upload("proxy-seeds", "proxy-a-seed.img.txt", b"x")
        .await;
    assert_eq!(
        (bad.status, bad.reason.as_str()),
        (400, "Parameter verification failed.")
    );
    assert_eq!(bad.body["errors"]["filename"], "wrong file extension");
}

#[tokio::test]
async fn f13_volume_delete_is_a_task_and_a_missing_volume_still_ends_ok() {
    let api = Api::start().await;
    api.sim.state().add_volume("proxy-seeds:iso/a.iso", b"seed");
    let path = format!(
        "/nodes/pv1-1/storage/proxy-seeds/content/{}",
        encode("proxy-seeds:iso/a.iso")
    );
    for round in 0..2 {
        let upid = api.delete(&path).await.upid();
        assert!(upid.contains(":imgdel:"), "{upid}");
        let status = api.wait_task(&upid).await;
        assert_eq!(status["exitstatus"], "OK", "round {round}");
    }
    assert!(api.sim.state().volume("proxy-seeds:iso/a.iso").is_none());
    let second = api.sim.state().tasks().last().unwrap().log.clone();
    assert_eq!(
        second,
        [
            "disk image 'proxy-seeds:iso/a.iso' does not exist",
            "Removed volume 'proxy-seeds:iso/a.iso'"
        ]
    );
    // The main token holds Datastore.Allocate on proxy-seeds only (F13's capture was on local).
    let forbidden = api
        .delete(&format!(
            "/nodes/pv1-1/storage/local/content/{}",
            encode("local:iso/x.iso")
        ))
        .await;
    assert_eq!(
        (forbidden.status, forbidden.reason.as_str()),
        (
            403,
            "Permission check failed (/storage/local, Datastore.Allocate)"
        )
    );
}

#[tokio::test]
async fn f14_paused_is_running_with_qmpstatus_paused_but_plain_running_in_resources() {
    let api = Api::start().await;
    api.clone_template(NEWID, &[]).await;
    let stopped = api.get("/nodes/pv1-1/qemu/199999/status/current").await;
    assert_eq!(
        (
            stopped.data()["status"].as_str(),
            stopped.data()["qmpstatus"].as_str()
        ),
        (Some("stopped"), Some("stopped"))
    );
    let suspend_stopped = api
        .post("/nodes/pv1-1/qemu/199999/status/suspend", &[])
        .await;
    assert_eq!(
        (suspend_stopped.status, suspend_stopped.reason.as_str()),
        (500, "VM 199999 not running")
    );

    api.wait_task(
        &api.post("/nodes/pv1-1/qemu/199999/status/start", &[])
            .await
            .upid(),
    )
    .await;
    api.wait_task(
        &api.post("/nodes/pv1-1/qemu/199999/status/suspend", &[])
            .await
            .upid(),
    )
    .await;
    let paused = api.get("/nodes/pv1-1/qemu/199999/status/current").await;
    assert_eq!(paused.data()["status"], "running");
    assert_eq!(paused.data()["qmpstatus"], "paused");
    let resources = api.get("/cluster/resources?type=vm").await;
    assert_eq!(
        resource(resources.data(), NEWID).unwrap()["status"],
        "running"
    );

    api.wait_task(
        &api.post("/nodes/pv1-1/qemu/199999/status/resume", &[])
            .await
            .upid(),
    )
    .await;
    assert_eq!(
        api.get("/nodes/pv1-1/qemu/199999/status/current")
            .await
            .data()["qmpstatus"],
        "running"
    );
}

#[tokio::test]
async fn f15_clone_onto_storage_without_images_is_400_and_leaves_no_vm() {
    let api = Api::start().await;
    let answer = api
        .post(
            "/nodes/pv1-1/qemu/9001/clone",
            &[
                ("newid", "199999"),
                ("name", "proxy-a"),
                ("full", "1"),
                ("storage", "local"),
            ],
        )
        .await;
    assert_eq!(
        (answer.status, answer.reason.as_str()),
        (400, "Parameter verification failed.")
    );
    assert_eq!(
        answer.body["errors"]["storage"],
        "storage 'local' does not support vm images"
    );
    assert!(api.sim.state().guest(NEWID).is_none());
}

#[tokio::test]
async fn f16_task_status_has_the_recorded_fields() {
    let api = Api::start().await;
    let upid = api
        .post(
            "/nodes/pv1-1/qemu/9001/clone",
            &[("newid", "199999"), ("name", "proxy-a")],
        )
        .await
        .upid();
    let running = api.task_status(&upid).await;
    assert_eq!(running.data()["status"], "running");
    assert!(
        running.data().get("exitstatus").is_none(),
        "no exitstatus while running"
    );
    let done = api.wait_task(&upid).await;
    let mut keys: Vec<&str> = done
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "exitstatus",
            "id",
            "node",
            "pid",
            "pstart",
            "starttime",
            "status",
            "tokenid",
            "type",
            "upid",
            "user"
        ]
    );
    assert_eq!(done["type"], "qmclone");
    assert_eq!(done["id"], "9001", "clone's task id is the source VMID");
    assert_eq!(
        (done["user"].as_str(), done["tokenid"].as_str()),
        (Some("egress@pve"), Some("operator"))
    );
    assert_eq!(done["upid"], upid.as_str());
    // The exact UPID layout, trailing colon included; the user carries the token id.
    let fields: Vec<&str> = upid.split(':').collect();
    assert_eq!(fields.len(), 9, "{upid}");
    assert_eq!(
        (
            fields[0], fields[1], fields[5], fields[6], fields[7], fields[8]
        ),
        (
            "UPID",
            "pv1-1",
            "qmclone",
            "9001",
            "egress@pve!operator",
            ""
        )
    );
    for hex in &fields[2..5] {
        assert!(
            hex.len() == 8
                && hex
                    .chars()
                    .all(|c| c.is_ascii_digit() || ('A'..='F').contains(&c)),
            "{hex}"
        );
    }
    let unknown = api.task_status(&upid.replace("qmclone", "qmstart")).await;
    assert_eq!(unknown.body["errors"]["upid"], "no such task");
}

#[tokio::test]
async fn f17_limited_token_gets_403_on_seed_delete() {
    let api = Api::start().await;
    api.sim.state().add_volume("proxy-seeds:iso/a.iso", b"seed");
    let path = format!(
        "/nodes/pv1-1/storage/proxy-seeds/content/{}",
        encode("proxy-seeds:iso/a.iso")
    );
    let limited = api.with_auth(Some(api.sim.limited_token_header()));
    let answer = limited.send("DELETE", &path, &[]).await;
    assert_eq!(
        (answer.status, answer.reason.as_str()),
        (
            403,
            "Permission check failed (/storage/proxy-seeds, Datastore.Allocate)"
        )
    );
    assert_eq!(
        answer.message(),
        "Permission check failed (/storage/proxy-seeds, Datastore.Allocate)\n"
    );
    assert!(api.sim.state().volume("proxy-seeds:iso/a.iso").is_some());
    // Everything else the role covers still works for it.
    assert_eq!(
        limited
            .send("GET", "/cluster/resources?type=vm", &[])
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn f13_f17_permissions_show_datastore_allocate_on_the_seed_storage_only() {
    let api = Api::start().await;
    let at = |path: &str| format!("/access/permissions?path={}", encode(path));
    let seeds = api.get(&at("/storage/proxy-seeds")).await;
    assert_eq!(seeds.status, 200, "{seeds:?}");
    let held = &seeds.data()["/storage/proxy-seeds"];
    // The Phase 0 ACL caveat: the specific role repeats what uploads need beside Allocate.
    for privilege in [
        "Datastore.Allocate",
        "Datastore.AllocateTemplate",
        "Datastore.AllocateSpace",
        "Datastore.Audit",
    ] {
        assert_eq!(held[privilege], 1, "{privilege} on proxy-seeds: {held}");
    }
    let local = api.get(&at("/storage/local")).await;
    let held = &local.data()["/storage/local"];
    assert!(held.get("Datastore.Allocate").is_none(), "{held}");
    assert_eq!(held["Datastore.AllocateTemplate"], 1);
    assert_eq!(held["VM.Clone"], 1, "the role on / is inherited: {held}");

    let limited = api.with_auth(Some(api.sim.limited_token_header()));
    let answer = limited.send("GET", &at("/storage/proxy-seeds"), &[]).await;
    assert_eq!(answer.status, 200);
    let held = &answer.data()["/storage/proxy-seeds"];
    assert!(held.get("Datastore.Allocate").is_none(), "{held}");
    assert_eq!(held["Datastore.AllocateTemplate"], 1);

    let every = api.get("/access/permissions").await;
    let paths: Vec<&String> = every.data().as_object().unwrap().keys().collect();
    assert_eq!(paths, ["/", "/storage/proxy-seeds"]);
    let unknown = api.get("/access/permissions?colour=red").await;
    assert_eq!(unknown.status, 400);
    let anonymous = api.with_auth(None).send("GET", &at("/"), &[]).await;
    assert_eq!(anonymous.status, 401);
}

#[tokio::test]
async fn f18_alpn_negotiates_http1_even_when_h2_is_offered() {
    let api = Api::start().await;
    let mut roots = rustls::RootCertStore::empty();
    let ca = rustls_pemfile::certs(&mut api.sim.ca_pem().as_bytes())
        .next()
        .unwrap()
        .unwrap();
    roots.add(ca).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let address = api.sim.url().trim_start_matches("https://").to_string();
    let tcp = tokio::net::TcpStream::connect(&address).await.unwrap();
    let tls = connector
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
}

#[tokio::test]
async fn f19_template_shapes_and_ide2_joins_the_boot_order() {
    let api = Api::start().await;
    let debian = api.get("/nodes/pv1-1/qemu/9001/config").await;
    let d = debian.data();
    assert_eq!(
        (d["name"].as_str(), d["boot"].as_str(), d["agent"].as_str()),
        (Some("debian-13-template"), Some("order=scsi0"), Some("1"))
    );
    assert_eq!(
        (
            d["bios"].as_str(),
            d["machine"].as_str(),
            d["template"].as_i64()
        ),
        (Some("ovmf"), Some("q35"), Some(1))
    );
    assert!(
        d["scsi0"].as_str().unwrap().starts_with("local-lvm:")
            && d["scsi0"].as_str().unwrap().contains("size=")
    );
    assert!(d.get("ide2").is_none(), "ide2 is free on 9001");
    assert!(!d["net0"].as_str().unwrap().contains("tag="));
    let ubuntu = api.get("/nodes/pv1-1/qemu/9000/config").await;
    assert!(
        ubuntu.data()["ide2"]
            .as_str()
            .unwrap()
            .contains("cloudinit")
    );
    assert!(ubuntu.data()["net0"].as_str().unwrap().ends_with("tag=4"));

    api.clone_template(NEWID, &[]).await;
    let path = "/nodes/pv1-1/qemu/199999/config";
    let set = api
        .put(
            path,
            &[
                ("ide2", "proxy-seeds:iso/proxy-a-seed.iso,media=cdrom"),
                ("cores", "2"),
            ],
        )
        .await;
    assert_eq!(
        (set.status, set.data()),
        (200, &Value::Null),
        "PUT config returns null"
    );
    assert_eq!(api.get(path).await.data()["boot"], "order=scsi0;ide2");
}

#[tokio::test]
async fn f20_resize_is_a_task_same_size_ok_and_shrink_fails_inside() {
    let api = Api::start().await;
    api.clone_template(NEWID, &[]).await;
    let resize = |size: &'static str| {
        let api = &api;
        async move {
            let upid = api
                .put(
                    "/nodes/pv1-1/qemu/199999/resize",
                    &[("disk", "scsi0"), ("size", size)],
                )
                .await
                .upid();
            assert!(upid.contains(":resize:199999:"), "{upid}");
            api.wait_task(&upid).await["exitstatus"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    assert_eq!(resize("8G").await, "OK");
    assert_eq!(resize("8G").await, "OK", "same size is an OK no-op");
    assert_eq!(resize("+512M").await, "OK");
    assert_eq!(resize("4G").await, "shrinking disks is not supported");
    let config = api.get("/nodes/pv1-1/qemu/199999/config").await;
    assert!(
        config.data()["scsi0"]
            .as_str()
            .unwrap()
            .ends_with(",size=8704M"),
        "{}",
        config.data()["scsi0"]
    );
    let bad = api
        .put(
            "/nodes/pv1-1/qemu/199999/resize",
            &[("disk", "scsi0"), ("size", "big")],
        )
        .await;
    assert_eq!(bad.status, 400);
}

#[tokio::test]
async fn f21_agent_reports_lo_and_ens18_with_net0_mac() {
    let api = Api::start_with(SimConfig {
        task_latency: LATENCY,
        agent_delay: Duration::ZERO,
        ..SimConfig::default()
    })
    .await;
    api.clone_template(NEWID, &[]).await;
    api.wait_task(
        &api.post("/nodes/pv1-1/qemu/199999/status/start", &[])
            .await
            .upid(),
    )
    .await;
    let net0 = api.get("/nodes/pv1-1/qemu/199999/config").await.data()["net0"]
        .as_str()
        .unwrap()
        .to_string();
    let mac = net0
        .trim_start_matches("virtio=")
        .split(',')
        .next()
        .unwrap()
        .to_ascii_lowercase();
    let answer = api
        .get("/nodes/pv1-1/qemu/199999/agent/network-get-interfaces")
        .await;
    let result = &answer.data()["result"];
    assert_eq!(result[0]["name"], "lo");
    assert_eq!(result[1]["name"], "ens18");
    assert_eq!(result[1]["hardware-address"], mac.as_str());
    assert_eq!(
        result[1]["ip-addresses"],
        json!([{"ip-address": pvesim::guest_ip(199999), "ip-address-type": "ipv4", "prefix": 24}])
    );
}

#[tokio::test]
async fn f22_wrong_secret_and_unknown_token_fail_auth_missing_header_is_no_ticket() {
    let api = Api::start().await;
    let (id, _secret) = api.sim.token().split_once('=').unwrap();
    for header in [
        format!("PVEAPIToken={id}=00000000-0000-0000-0000-000000000000"),
        format!(
            "PVEAPIToken=egress@pve!nobody={}",
            api.sim.token().split_once('=').unwrap().1
        ),
    ] {
        let answer = api
            .with_auth(Some(header))
            .send("GET", "/version", &[])
            .await;
        assert_eq!(
            (answer.status, answer.reason.as_str()),
            (401, "Authentication failed!")
        );
        assert!(answer.raw.is_empty());
    }
    let none = api.with_auth(None).send("GET", "/version", &[]).await;
    assert_eq!((none.status, none.reason.as_str()), (401, "No ticket"));
}

#[tokio::test]
async fn f23_upload_is_staged_under_var_tmp_then_copied() {
    let api = Api::start().await;
    let upid = api.upload("proxy-seeds", "s.iso", b"seed").await.upid();
    api.wait_task(&upid).await;
    let log = api.sim.state().task(&upid).unwrap().log;
    assert!(
        log[0].starts_with("starting file import from: /var/tmp/pveupload-"),
        "{log:?}"
    );
    assert!(
        log.iter()
            .any(|l| l.starts_with("command: cp -- /var/tmp/pveupload-")),
        "{log:?}"
    );
}
