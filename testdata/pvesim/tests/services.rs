//! Each VM's proxy service (`SimConfig::service_port`, `--service-port`): at the address its agent
//! reports, open while the VM runs, and broken on demand through the admin API.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{Api, LATENCY};
use pvesim::{ServiceMode, SimConfig, guest_ip, service_ip};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

fn vm_path(vmid: u32, rest: &str) -> String {
    format!("/nodes/pv1-1/qemu/{vmid}/{rest}")
}

/// A port number free on loopback now; each test takes its own, so simulators running side by
/// side in this binary never share a service address and port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn with_services() -> (Api, u16) {
    let port = free_port();
    let api = Api::start_with(SimConfig {
        task_latency: LATENCY,
        agent_delay: Duration::ZERO,
        service_port: Some(port),
        ..SimConfig::default()
    })
    .await;
    (api, port)
}

async fn run_task(api: &Api, vmid: u32, action: &str) {
    let upid = api
        .post(&vm_path(vmid, &format!("status/{action}")), &[])
        .await
        .upid();
    assert_eq!(api.wait_task(&upid).await["exitstatus"], "OK", "{action}");
}

/// The ens18 address the agent reports.
async fn agent_address(api: &Api, vmid: u32) -> String {
    let answer = api
        .get(&vm_path(vmid, "agent/network-get-interfaces"))
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let ens18 = &answer.data()["result"][1];
    assert_eq!(ens18["name"], "ens18");
    ens18["ip-addresses"][0]["ip-address"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Connects and sends `CONNECT`; the answer's text (up to the service closing), or the error.
async fn ask(address: SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(address).await?;
    stream
        .write_all(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        .await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    Ok(answer)
}

fn refused(answer: std::io::Result<String>) -> bool {
    answer.is_err_and(|error| error.kind() == std::io::ErrorKind::ConnectionRefused)
}

const ESTABLISHED: &str = "HTTP/1.1 200 Connection established\r\n\r\n";

async fn set_service(api: &Api, vmid: u32, word: &str) {
    let answer = api
        .admin(
            "POST",
            &format!("vms/{vmid}/service"),
            &format!(r#"{{"service": "{word}"}}"#),
        )
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
}

#[tokio::test]
async fn a_started_vms_service_answers_connect_at_the_address_its_agent_reports() {
    let (api, port) = with_services().await;
    let vmid = 310;
    api.clone_template(vmid, &[]).await;
    let service: SocketAddr = format!("{}:{port}", service_ip(vmid)).parse().unwrap();
    assert!(
        refused(ask(service).await),
        "a stopped VM's service is closed"
    );

    run_task(&api, vmid, "start").await;
    assert_eq!(agent_address(&api, vmid).await, service_ip(vmid));
    assert_eq!(ask(service).await.unwrap(), ESTABLISHED);
    let info = api.admin("GET", "info", "").await;
    assert_eq!(info.data()["servicePort"], port);
}

#[tokio::test]
async fn stopping_pausing_or_deleting_the_vm_closes_its_service() {
    let (api, port) = with_services().await;
    let vmid = 311;
    let service: SocketAddr = format!("{}:{port}", service_ip(vmid)).parse().unwrap();
    api.clone_template(vmid, &[]).await;
    run_task(&api, vmid, "start").await;
    assert_eq!(ask(service).await.unwrap(), ESTABLISHED);

    run_task(&api, vmid, "suspend").await;
    assert!(refused(ask(service).await), "paused");
    run_task(&api, vmid, "resume").await;
    assert_eq!(ask(service).await.unwrap(), ESTABLISHED, "resumed");

    let answer = api.admin("POST", &format!("vms/{vmid}/stop"), "").await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(refused(ask(service).await), "qm stop");

    run_task(&api, vmid, "start").await;
    assert_eq!(ask(service).await.unwrap(), ESTABLISHED, "started again");
    run_task(&api, vmid, "stop").await;
    assert!(refused(ask(service).await), "stopped through the API");

    let upid = api
        .delete(&format!("/nodes/pv1-1/qemu/{vmid}"))
        .await
        .upid();
    assert_eq!(api.wait_task(&upid).await["exitstatus"], "OK");
    assert!(refused(ask(service).await), "deleted");
}

#[tokio::test]
async fn each_service_mode_does_what_it_says_and_ok_restores_it() {
    let (api, port) = with_services().await;
    let vmid = 312;
    let service: SocketAddr = format!("{}:{port}", service_ip(vmid)).parse().unwrap();
    api.clone_template(vmid, &[]).await;
    run_task(&api, vmid, "start").await;

    set_service(&api, vmid, "refuse").await;
    assert!(refused(ask(service).await), "refuse");

    set_service(&api, vmid, "hang").await;
    let mut stream = TcpStream::connect(service).await.expect("hang accepts");
    stream
        .write_all(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        .await
        .unwrap();
    let mut byte = [0u8; 1];
    let waited = tokio::time::timeout(Duration::from_millis(200), stream.read(&mut byte)).await;
    assert!(waited.is_err(), "hang answered: {waited:?}");

    set_service(&api, vmid, "error").await;
    assert_eq!(
        ask(service).await.unwrap(),
        "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
    );

    set_service(&api, vmid, "ok").await;
    assert_eq!(ask(service).await.unwrap(), ESTABLISHED);

    // In-process, the same.
    api.sim.set_service(vmid, ServiceMode::Refuse).unwrap();
    assert!(refused(ask(service).await), "refuse, in-process");
}

#[tokio::test]
async fn a_mode_set_while_the_vm_is_stopped_holds_when_it_starts() {
    let (api, port) = with_services().await;
    let vmid = 313;
    let service: SocketAddr = format!("{}:{port}", service_ip(vmid)).parse().unwrap();
    api.clone_template(vmid, &[]).await;
    set_service(&api, vmid, "error").await;
    run_task(&api, vmid, "start").await;
    assert!(ask(service).await.unwrap().starts_with("HTTP/1.1 503 "));
}

#[tokio::test]
async fn a_vm_on_the_second_node_serves_as_one_on_the_first() {
    let port = free_port();
    let api = Api::start_with(SimConfig {
        nodes: vec!["pv1-1".into(), "pv1-2".into()],
        task_latency: LATENCY,
        agent_delay: Duration::ZERO,
        service_port: Some(port),
        ..SimConfig::default()
    })
    .await;
    let vmid = 320;
    let clone = api
        .post(
            "/nodes/pv1-1/qemu/9001/clone",
            &[("newid", "320"), ("full", "1"), ("target", "pv1-2")],
        )
        .await
        .upid();
    assert_eq!(api.wait_task(&clone).await["exitstatus"], "OK");
    let on_b = |rest: &str| format!("/nodes/pv1-2/qemu/{vmid}/{rest}");
    let start = api.post(&on_b("status/start"), &[]).await.upid();
    assert_eq!(api.wait_task(&start).await["exitstatus"], "OK");
    let agent = api.get(&on_b("agent/network-get-interfaces")).await;
    assert_eq!(
        agent.data()["result"][1]["ip-addresses"][0]["ip-address"],
        service_ip(vmid)
    );
    let service: SocketAddr = format!("{}:{port}", service_ip(vmid)).parse().unwrap();
    assert_eq!(ask(service).await.unwrap(), ESTABLISHED);
    // The admin API names VMs by VMID alone: it reaches this one on pv1-2.
    set_service(&api, vmid, "error").await;
    assert!(ask(service).await.unwrap().starts_with("HTTP/1.1 503 "));
    let stop = api.admin("POST", &format!("vms/{vmid}/stop"), "").await;
    assert_eq!(stop.status, 200, "{stop:?}");
    assert!(refused(ask(service).await), "qm stop on pv1-2");
}

#[tokio::test]
async fn bad_service_requests_are_refused_with_reasons() {
    let (api, _port) = with_services().await;
    let vmid = 314;
    api.clone_template(vmid, &[]).await;
    let answer = api
        .admin(
            "POST",
            &format!("vms/{vmid}/service"),
            r#"{"service": "slow"}"#,
        )
        .await;
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(
        answer.message().contains("ok, refuse, hang or error"),
        "{answer:?}"
    );
    let answer = api
        .admin("POST", "vms/399/service", r#"{"service": "ok"}"#)
        .await;
    assert_eq!(
        (answer.status, answer.reason.as_str()),
        (
            500,
            "Configuration file 'nodes/pv1-1/qemu-server/399.conf' does not exist"
        ),
        "F2's text"
    );
}

#[tokio::test]
async fn without_a_service_port_the_agent_reports_its_usual_address_and_nothing_serves() {
    let api = Api::start_with(SimConfig {
        task_latency: LATENCY,
        agent_delay: Duration::ZERO,
        ..SimConfig::default()
    })
    .await;
    let vmid = 315;
    api.clone_template(vmid, &[]).await;
    run_task(&api, vmid, "start").await;
    assert_eq!(agent_address(&api, vmid).await, guest_ip(vmid));
    let answer = api
        .admin(
            "POST",
            &format!("vms/{vmid}/service"),
            r#"{"service": "ok"}"#,
        )
        .await;
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(answer.message().contains("--service-port"), "{answer:?}");
    let info = api.admin("GET", "info", "").await;
    assert!(info.data().get("servicePort").is_none(), "{info:?}");
}
