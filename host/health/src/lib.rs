//! # egress-health: the health of a proxy VM's own service
//!
//! Health of the proxy service in a Proxy's VM, beyond the hypervisor's word that the VM runs:
//! [`probe`] asks the service once, at the VM's address, as the Proxy's
//! [`HealthCheck`](egress_crd::HealthCheck) says; [`VmHealth`] turns the outcomes into a
//! verdict (`Starting`, `Healthy`, `Unhealthy`) and says when the next probe is due.
//!
//! The VM is not trusted: the probe reads at most [`MAX_ANSWER_BYTES`] of its answer, within the
//! check's timeout, and its words for a failure quote nothing the VM sent but a status code.
//! [`VmHealth`] does no I/O and reads no clock: the caller passes `now`. [`Prober`] holds the
//! VMs an operator probes, by Proxy, and probes those due, a bounded number at a time.

#![warn(missing_docs)]

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout_at};

use egress_crd::HealthCheck;

/// The most of a proxy's answer to `CONNECT` the probe reads: a status line and a few headers
/// fit many times over; a VM that sends more is not answering as a proxy.
pub const MAX_ANSWER_BYTES: usize = 4096;

/// What one probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The service answered as the check asks.
    Healthy,
    /// It did not, and why.
    Failed(ProbeFailure),
}

/// Why a probe failed, in words a person can read ([`fmt::Display`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeFailure {
    /// Nothing listens at the port: the connection was refused.
    Refused,
    /// The connection did not open within the timeout.
    ConnectTimedOut(Duration),
    /// The connection opened but failed otherwise (no route, reset): the system's words.
    ConnectFailed(String),
    /// The connection opened; no complete answer came within the timeout.
    AnswerTimedOut(Duration),
    /// The service closed the connection before answering anything.
    Closed,
    /// It answered `CONNECT` with a status other than 2xx.
    Status(u16),
    /// It answered something that is not an HTTP status line and headers.
    Malformed,
    /// It sent more than [`MAX_ANSWER_BYTES`] without ending its headers.
    TooLong,
}

impl fmt::Display for ProbeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeFailure::Refused => f.write_str("connection refused"),
            ProbeFailure::ConnectTimedOut(after) => {
                write!(f, "timed out connecting after {after:?}")
            }
            ProbeFailure::ConnectFailed(error) => write!(f, "could not connect: {error}"),
            ProbeFailure::AnswerTimedOut(after) => {
                write!(f, "timed out: no answer to CONNECT within {after:?}")
            }
            ProbeFailure::Closed => f.write_str("closed the connection without answering"),
            ProbeFailure::Status(code) => write!(f, "answered {code} to CONNECT"),
            ProbeFailure::Malformed => f.write_str("malformed answer: not an HTTP status line"),
            ProbeFailure::TooLong => write!(
                f,
                "malformed answer: more than {MAX_ANSWER_BYTES} bytes without the end of its headers"
            ),
        }
    }
}

impl fmt::Display for ProbeOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeOutcome::Healthy => f.write_str("healthy"),
            ProbeOutcome::Failed(failure) => failure.fmt(f),
        }
    }
}

/// Probes the service of the VM at `address` once, as `check` says, within its timeout: `tcp`
/// passes when a connection opens; `httpConnect` when the proxy answers
/// `CONNECT <target> HTTP/1.1` with a 2xx status. Of a check the schema refuses, one with both
/// probes runs `tcp`, one with neither fails as refused.
pub async fn probe(check: &HealthCheck, address: IpAddr) -> ProbeOutcome {
    let timeout = check.timeout();
    let outcome = match (&check.tcp, &check.http_connect) {
        (Some(tcp), _) => probe_tcp(socket(address, tcp.port), timeout).await,
        (None, Some(connect)) => {
            probe_http_connect(socket(address, connect.port), &connect.target, timeout).await
        }
        (None, None) => Err(ProbeFailure::Refused),
    };
    match outcome {
        Ok(()) => ProbeOutcome::Healthy,
        Err(failure) => ProbeOutcome::Failed(failure),
    }
}

/// A port the schema keeps in 1..=65535; one outside it becomes port 0, which refuses.
fn socket(address: IpAddr, port: u32) -> SocketAddr {
    SocketAddr::new(address, u16::try_from(port).unwrap_or(0))
}

async fn connect(address: SocketAddr, deadline: Instant) -> Result<TcpStream, ProbeFailure> {
    let timeout = deadline.saturating_duration_since(Instant::now());
    match timeout_at(deadline, TcpStream::connect(address)).await {
        Err(_elapsed) => Err(ProbeFailure::ConnectTimedOut(timeout)),
        Ok(Err(error)) if error.kind() == std::io::ErrorKind::ConnectionRefused => {
            Err(ProbeFailure::Refused)
        }
        Ok(Err(error)) => Err(ProbeFailure::ConnectFailed(error.kind().to_string())),
        Ok(Ok(stream)) => Ok(stream),
    }
}

async fn probe_tcp(address: SocketAddr, timeout: Duration) -> Result<(), ProbeFailure> {
    connect(address, Instant::now() + timeout).await.map(drop)
}

async fn probe_http_connect(
    address: SocketAddr,
    target: &str,
    timeout: Duration,
) -> Result<(), ProbeFailure> {
    let deadline = Instant::now() + timeout;
    let mut stream = connect(address, deadline).await?;
    let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    let head = timeout_at(deadline, async {
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|_| ProbeFailure::Closed)?;
        read_head(&mut stream).await
    })
    .await
    .map_err(|_elapsed| ProbeFailure::AnswerTimedOut(timeout))??;
    match status_code(&head)? {
        200..=299 => Ok(()),
        code => Err(ProbeFailure::Status(code)),
    }
}

/// Reads until the blank line that ends the headers, at most [`MAX_ANSWER_BYTES`].
async fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, ProbeFailure> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    loop {
        // One byte past the cap tells a long answer from one that fills it exactly.
        let room = (MAX_ANSWER_BYTES + 1 - head.len()).min(chunk.len());
        let read = match stream.read(&mut chunk[..room]).await {
            Ok(0) | Err(_) if head.is_empty() => return Err(ProbeFailure::Closed),
            Ok(0) | Err(_) => return Err(ProbeFailure::Malformed),
            Ok(read) => read,
        };
        head.extend_from_slice(&chunk[..read]);
        if let Some(end) = find(&head, b"\r\n\r\n") {
            head.truncate(end);
            return Ok(head);
        }
        if head.len() > MAX_ANSWER_BYTES {
            return Err(ProbeFailure::TooLong);
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// The status code of `HTTP/1.x SSS reason`, the head's first line.
fn status_code(head: &[u8]) -> Result<u16, ProbeFailure> {
    let line = head.split(|byte| *byte == b'\n').next().unwrap_or_default();
    let line = std::str::from_utf8(line).map_err(|_| ProbeFailure::Malformed)?;
    let mut words = line.trim_end_matches('\r').splitn(3, ' ');
    let version = words.next().unwrap_or_default();
    let code = words.next().unwrap_or_default();
    let well_formed = matches!(version, "HTTP/1.0" | "HTTP/1.1")
        && code.len() == 3
        && code.bytes().all(|byte| byte.is_ascii_digit());
    match code.parse::<u16>() {
        Ok(code) if well_formed && (100..=599).contains(&code) => Ok(code),
        _ => Err(ProbeFailure::Malformed),
    }
}

/// What the probes of one VM say about its service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No probe has passed yet, and the failures are inside the startup grace or, after it,
    /// fewer than `failureThreshold` in a row.
    Starting,
    /// The last probe passed, or fewer than `failureThreshold` have failed in a row since.
    Healthy,
    /// `failureThreshold` probes in a row failed, outside the startup grace.
    Unhealthy {
        /// When the verdict became unhealthy.
        since: Timestamp,
        /// The latest failure and how many in a row, for a condition's message.
        reason: String,
    },
}

/// The health of one VM's service: its consecutive failures, its startup grace and its verdict.
/// Pure: every method takes the time from the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmHealth {
    started: Timestamp,
    passed_once: bool,
    failures: u32,
    last_probe: Option<Timestamp>,
    verdict: Verdict,
}

impl VmHealth {
    /// A VM that started at `started` (its grace counts from then), not probed yet.
    pub fn new(started: Timestamp) -> VmHealth {
        VmHealth {
            started,
            passed_once: false,
            failures: 0,
            last_probe: None,
            verdict: Verdict::Starting,
        }
    }

    /// A VM whose service passed before this tracker existed (the operator restarted, its
    /// status says so): healthy until a probe says otherwise, and probed at once.
    pub fn resumed(now: Timestamp) -> VmHealth {
        VmHealth {
            passed_once: true,
            verdict: Verdict::Healthy,
            ..VmHealth::new(now)
        }
    }

    /// The verdict after the probes recorded so far.
    pub fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// Failed probes in a row, since the last that passed.
    pub fn consecutive_failures(&self) -> u32 {
        self.failures
    }

    /// Records a probe made at `now` and returns the verdict it leads to.
    pub fn record(
        &mut self,
        check: &HealthCheck,
        now: Timestamp,
        outcome: &ProbeOutcome,
    ) -> &Verdict {
        self.last_probe = Some(now);
        let failure = match outcome {
            ProbeOutcome::Healthy => {
                self.passed_once = true;
                self.failures = 0;
                self.verdict = Verdict::Healthy;
                return &self.verdict;
            }
            ProbeOutcome::Failed(failure) => failure,
        };
        self.failures = self.failures.saturating_add(1);
        let in_grace = !self.passed_once && now < self.started + seconds(check.startup_seconds);
        if !in_grace && self.failures >= check.failure_threshold {
            let reason = format!(
                "{} probes in a row failed, the last: {failure}",
                self.failures
            );
            self.verdict = match &self.verdict {
                Verdict::Unhealthy { since, .. } => Verdict::Unhealthy {
                    since: *since,
                    reason,
                },
                _ => Verdict::Unhealthy { since: now, reason },
            };
        }
        &self.verdict
    }

    /// When the next probe is due: at once for a VM not probed yet, else `periodSeconds` after
    /// the last.
    pub fn next_probe_at(&self, check: &HealthCheck) -> Timestamp {
        match self.last_probe {
            None => self.started,
            Some(last) => last + seconds(check.period_seconds),
        }
    }

    /// Whether a probe is due at `now`.
    pub fn is_due(&self, check: &HealthCheck, now: Timestamp) -> bool {
        now >= self.next_probe_at(check)
    }
}

fn seconds(seconds: u32) -> SignedDuration {
    SignedDuration::from_secs(i64::from(seconds))
}

mod prober;
pub use prober::{MAX_PROBES_IN_FLIGHT, Prober};

#[cfg(test)]
mod tests;
