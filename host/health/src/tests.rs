use std::net::{Ipv4Addr, SocketAddr};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::*;
use egress_crd::{HttpConnectProbe, TcpProbe};

const SHORT: Duration = Duration::from_millis(300);
const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

async fn listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let address = listener.local_addr().unwrap();
    (listener, address)
}

/// A port nothing listens on: bound, then closed.
async fn closed_port() -> SocketAddr {
    listener().await.1
}

/// A proxy that accepts one connection, reads the request's head and sends `answer`; the task
/// returns the request it read.
async fn proxy_answering(answer: &'static [u8]) -> (SocketAddr, JoinHandle<String>) {
    let (listener, address) = listener().await;
    let served = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut byte = [0u8; 1];
        while !request.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap() == 1 {
            request.push(byte[0]);
        }
        let _ = stream.write_all(answer).await;
        String::from_utf8(request).unwrap()
    });
    (address, served)
}

/// A proxy that accepts and never answers, holding the connection until the client leaves.
async fn proxy_that_hangs() -> SocketAddr {
    let (listener, address) = listener().await;
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut sink = Vec::new();
        let _ = stream.read_to_end(&mut sink).await;
    });
    address
}

async fn connect_probe(address: SocketAddr) -> Result<(), ProbeFailure> {
    probe_http_connect(address, "example.com:443", SHORT).await
}

/// A check with a 1 s timeout (the least the schema allows) and the default numbers.
fn check(tcp: Option<u32>, connect: Option<(u32, &str)>) -> HealthCheck {
    HealthCheck {
        tcp: tcp.map(|port| TcpProbe { port }),
        http_connect: connect.map(|(port, target)| HttpConnectProbe {
            port,
            target: target.into(),
        }),
        period_seconds: 10,
        failure_threshold: 3,
        startup_seconds: 300,
        timeout_seconds: 1,
    }
}

#[tokio::test]
async fn tcp_passes_when_a_listener_accepts_and_fails_as_refused_on_a_closed_port() {
    let (_listener, open) = listener().await;
    assert_eq!(
        probe(&check(Some(open.port().into()), None), LOOPBACK).await,
        ProbeOutcome::Healthy
    );
    let closed = closed_port().await;
    let outcome = probe(&check(Some(closed.port().into()), None), LOOPBACK).await;
    assert_eq!(outcome, ProbeOutcome::Failed(ProbeFailure::Refused));
    assert_eq!(outcome.to_string(), "connection refused");
}

#[tokio::test]
async fn http_connect_sends_one_connect_and_passes_on_a_2xx() {
    let (address, served) = proxy_answering(b"HTTP/1.1 200 Connection established\r\n\r\n").await;
    let outcome = probe(
        &check(None, Some((address.port().into(), "example.com:443"))),
        LOOPBACK,
    )
    .await;
    assert_eq!(outcome, ProbeOutcome::Healthy);
    assert_eq!(
        served.await.unwrap(),
        "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"
    );
}

#[tokio::test]
async fn a_proxy_answering_another_2xx_with_headers_passes() {
    let (address, _served) =
        proxy_answering(b"HTTP/1.0 204 No Content\r\nVia: squid\r\nX-Pad: 1\r\n\r\n").await;
    assert_eq!(connect_probe(address).await, Ok(()));
}

#[tokio::test]
async fn http_connect_on_a_closed_port_is_refused() {
    assert_eq!(
        connect_probe(closed_port().await).await,
        Err(ProbeFailure::Refused)
    );
}

#[tokio::test]
async fn a_proxy_that_never_answers_times_out_though_tcp_passes() {
    let address = proxy_that_hangs().await;
    let failure = connect_probe(address).await.unwrap_err();
    assert_eq!(failure, ProbeFailure::AnswerTimedOut(SHORT));
    assert!(failure.to_string().starts_with("timed out"), "{failure}");
    assert_eq!(probe_tcp(address, SHORT).await, Ok(()));
}

#[tokio::test]
async fn a_503_fails_naming_the_status() {
    let (address, _served) =
        proxy_answering(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n").await;
    let failure = connect_probe(address).await.unwrap_err();
    assert_eq!(failure, ProbeFailure::Status(503));
    assert_eq!(failure.to_string(), "answered 503 to CONNECT");
}

#[tokio::test]
async fn a_redirect_is_not_healthy() {
    let (address, _served) = proxy_answering(b"HTTP/1.1 302 Found\r\n\r\n").await;
    assert_eq!(connect_probe(address).await, Err(ProbeFailure::Status(302)));
}

#[tokio::test]
async fn garbage_is_a_malformed_answer() {
    for garbage in [
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n".as_slice(),
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 20x OK\r\n\r\n",
        b"HTTP/2 200\r\n\r\n",
    ] {
        let (address, _served) = proxy_answering(garbage).await;
        assert_eq!(
            connect_probe(address).await,
            Err(ProbeFailure::Malformed),
            "{}",
            String::from_utf8_lossy(garbage)
        );
    }
}

#[tokio::test]
async fn an_answer_cut_short_is_malformed_and_no_answer_at_all_is_closed() {
    let (address, _served) = proxy_answering(b"HTTP/1.1 200 Conn").await;
    assert_eq!(connect_probe(address).await, Err(ProbeFailure::Malformed));
    let (address, _served) = proxy_answering(b"").await;
    let failure = connect_probe(address).await.unwrap_err();
    assert_eq!(failure, ProbeFailure::Closed);
    assert_eq!(
        failure.to_string(),
        "closed the connection without answering"
    );
}

#[tokio::test]
async fn an_answer_longer_than_the_cap_is_refused_without_reading_it_all() {
    static ENDLESS_HEADER: [u8; 64 * 1024] = [b'a'; 64 * 1024];
    let (address, _served) = proxy_answering(&ENDLESS_HEADER).await;
    assert_eq!(connect_probe(address).await, Err(ProbeFailure::TooLong));
    // Headers that end just inside the cap still count.
    static LONG_BUT_ENDED: [u8; MAX_ANSWER_BYTES] = {
        let mut answer = [b'a'; MAX_ANSWER_BYTES];
        let status = b"HTTP/1.1 200 OK\r\nX: ";
        let mut at = 0;
        while at < status.len() {
            answer[at] = status[at];
            at += 1;
        }
        let end = MAX_ANSWER_BYTES - 4;
        answer[end] = b'\r';
        answer[end + 1] = b'\n';
        answer[end + 2] = b'\r';
        answer[end + 3] = b'\n';
        answer
    };
    let (address, _served) = proxy_answering(&LONG_BUT_ENDED).await;
    assert_eq!(connect_probe(address).await, Ok(()));
}

// ---------------------------------------------------------------- the verdict

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn failed() -> ProbeOutcome {
    ProbeOutcome::Failed(ProbeFailure::Status(503))
}

/// Threshold 3, period 10 s, startup 300 s.
fn tracked() -> (HealthCheck, VmHealth) {
    (check(Some(3128), None), VmHealth::new(at(0)))
}

#[test]
fn failures_inside_the_startup_grace_keep_a_vm_starting() {
    let (check, mut vm) = tracked();
    for second in (0..300).step_by(10) {
        assert_eq!(vm.record(&check, at(second), &failed()), &Verdict::Starting);
    }
    assert_eq!(vm.consecutive_failures(), 30);
}

#[test]
fn after_the_grace_the_threshold_of_failures_makes_it_unhealthy() {
    let (check, mut vm) = tracked();
    for second in [0, 100, 200, 290] {
        vm.record(&check, at(second), &failed());
    }
    let verdict = vm.record(&check, at(300), &failed()).clone();
    assert_eq!(
        verdict,
        Verdict::Unhealthy {
            since: at(300),
            reason: "5 probes in a row failed, the last: answered 503 to CONNECT".into()
        }
    );
}

#[test]
fn after_the_grace_fewer_failures_than_the_threshold_are_not_unhealthy_yet() {
    let (check, mut vm) = tracked();
    assert_eq!(vm.record(&check, at(400), &failed()), &Verdict::Starting);
    assert_eq!(vm.record(&check, at(410), &failed()), &Verdict::Starting);
    assert!(matches!(
        vm.record(&check, at(420), &failed()),
        Verdict::Unhealthy { .. }
    ));
}

#[test]
fn a_success_ends_the_grace_and_the_threshold_counts_from_there() {
    let (check, mut vm) = tracked();
    assert_eq!(
        vm.record(&check, at(20), &ProbeOutcome::Healthy),
        &Verdict::Healthy
    );
    assert_eq!(vm.record(&check, at(30), &failed()), &Verdict::Healthy);
    assert_eq!(vm.record(&check, at(40), &failed()), &Verdict::Healthy);
    assert_eq!(vm.consecutive_failures(), 2);
    assert!(matches!(
        vm.record(&check, at(50), &failed()),
        Verdict::Unhealthy { since, .. } if *since == at(50)
    ));
}

#[test]
fn unhealthy_keeps_its_since_and_one_success_makes_it_healthy_again() {
    let (check, mut vm) = tracked();
    vm.record(&check, at(10), &ProbeOutcome::Healthy);
    for second in [20, 30, 40, 50] {
        vm.record(&check, at(second), &failed());
    }
    let refused = ProbeOutcome::Failed(ProbeFailure::Refused);
    let Verdict::Unhealthy { since, reason } = vm.record(&check, at(60), &refused).clone() else {
        panic!("not unhealthy: {:?}", vm.verdict());
    };
    assert_eq!(since, at(40));
    assert_eq!(
        reason,
        "5 probes in a row failed, the last: connection refused"
    );
    assert_eq!(
        vm.record(&check, at(70), &ProbeOutcome::Healthy),
        &Verdict::Healthy
    );
    assert_eq!(vm.consecutive_failures(), 0);
    assert_eq!(vm.record(&check, at(80), &failed()), &Verdict::Healthy);
}

#[test]
fn the_first_probe_is_due_at_once_and_each_next_one_a_period_after_the_last() {
    let (check, mut vm) = tracked();
    assert_eq!(vm.next_probe_at(&check), at(0));
    assert!(vm.is_due(&check, at(0)));
    vm.record(&check, at(3), &failed());
    assert_eq!(vm.next_probe_at(&check), at(13));
    assert!(!vm.is_due(&check, at(12)));
    assert!(vm.is_due(&check, at(13)));
}

// ---------------------------------------------------------------- the prober

/// A TCP check of `port`: one failure is enough, no startup grace.
fn strict_tcp(port: u16) -> HealthCheck {
    HealthCheck {
        failure_threshold: 1,
        startup_seconds: 0,
        ..check(Some(u32::from(port)), None)
    }
}

#[tokio::test]
async fn the_prober_reports_each_change_of_verdict_once_and_only_when_due() {
    let (listener, address) = listener().await;
    let check = strict_tcp(address.port());
    let prober = Prober::default();
    assert_eq!(
        prober.watch("ns/a", "vm-1", LOOPBACK, &check, at(0), false),
        Verdict::Starting
    );
    // The service listens: healthy, a change.
    assert_eq!(prober.probe_due(at(0)).await, ["ns/a"]);
    assert_eq!(
        prober.watch("ns/a", "vm-1", LOOPBACK, &check, at(1), false),
        Verdict::Healthy
    );
    // Not due before periodSeconds: no probe, so a service that stopped is not seen yet.
    drop(listener);
    assert!(prober.probe_due(at(5)).await.is_empty());
    assert_eq!(
        prober.watch("ns/a", "vm-1", LOOPBACK, &check, at(5), false),
        Verdict::Healthy
    );
    // Due: refused, and one failure is the threshold.
    assert_eq!(prober.probe_due(at(10)).await, ["ns/a"]);
    let verdict = prober.watch("ns/a", "vm-1", LOOPBACK, &check, at(10), false);
    assert!(
        matches!(&verdict, Verdict::Unhealthy { since, reason } if *since == at(10) && reason.contains("connection refused")),
        "{verdict:?}"
    );
    // Still failing: the same verdict, no change reported.
    assert!(prober.probe_due(at(20)).await.is_empty());
}

#[tokio::test]
async fn another_vm_starts_afresh_and_a_forgotten_proxy_is_not_probed() {
    let port = closed_port().await.port();
    let check = strict_tcp(port);
    let prober = Prober::default();
    prober.watch("ns/a", "vm-1", LOOPBACK, &check, at(0), false);
    assert_eq!(prober.probe_due(at(0)).await, ["ns/a"]);
    assert!(matches!(
        prober.watch("ns/a", "vm-1", LOOPBACK, &check, at(1), false),
        Verdict::Unhealthy { .. }
    ));
    // The VM was replaced: its record starts again.
    assert_eq!(
        prober.watch("ns/a", "vm-2", LOOPBACK, &check, at(2), false),
        Verdict::Starting
    );
    assert_eq!(prober.probe_due(at(2)).await, ["ns/a"]);
    // So does a changed check.
    let other = strict_tcp(port.wrapping_add(1).max(1));
    assert_eq!(
        prober.watch("ns/a", "vm-2", LOOPBACK, &other, at(3), false),
        Verdict::Starting
    );
    assert_eq!(prober.len(), 1);
    prober.forget("ns/a");
    assert!(prober.is_empty());
    assert!(prober.probe_due(at(100)).await.is_empty());
}

#[tokio::test]
async fn a_vm_that_passed_before_a_restart_stays_healthy_until_its_first_probe_fails() {
    let check = strict_tcp(closed_port().await.port());
    let prober = Prober::default();
    assert_eq!(
        prober.watch("ns/a", "vm-1", LOOPBACK, &check, at(0), true),
        Verdict::Healthy
    );
    // Probed at once: refused, unhealthy.
    assert_eq!(prober.probe_due(at(0)).await, ["ns/a"]);
    assert!(matches!(
        prober.watch("ns/a", "vm-1", LOOPBACK, &check, at(1), true),
        Verdict::Unhealthy { .. }
    ));
    // A new VM never inherits it.
    assert_eq!(
        prober.watch("ns/a", "vm-2", LOOPBACK, &check, at(2), true),
        Verdict::Starting
    );
}
