//! Health and metrics over HTTP: `/healthz`, `/readyz` and `/metrics` on one port, for both
//! modes.
//!
//! - `/healthz` answers `200 ok` while the process serves at all (the liveness probe).
//! - `/readyz` answers `200` once [`Health::set_ready`] said so, else `503` with the reason
//!   (Kubernetes mode: caches synced and the leader election running, whether this replica leads
//!   or stands by).
//! - `/metrics` is [`Metrics::encode`] in the OpenMetrics text format.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use egress_telemetry::{metrics::Metrics, server::{Health, serve}};
//!
//! let health = Arc::new(Health::new(Metrics::default()));
//! tokio::spawn(serve("127.0.0.1:8080".parse()?, Arc::clone(&health)));
//! health.set_ready(Ok(()));
//! # Ok(()) }
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::metrics::Metrics;

/// The content type of `/metrics` (OpenMetrics text, as prometheus-client encodes it).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the endpoints report. Shared between the server and whoever runs the operator.
#[derive(Debug)]
pub struct Health {
    /// The series `/metrics` encodes (shared with the operator).
    metrics: Metrics,
    /// `Ok` when ready, else why not; written by the mode, read by `/readyz`.
    ready: Mutex<Result<(), String>>,
}

impl Health {
    /// Not ready yet ("starting").
    pub fn new(metrics: Metrics) -> Health {
        Health {
            metrics,
            ready: Mutex::new(Err("starting".into())),
        }
    }

    /// Ready, or not with a reason shown on `/readyz`.
    pub fn set_ready(&self, ready: Result<(), String>) {
        *self.ready.lock().unwrap_or_else(|p| p.into_inner()) = ready;
    }

    /// Whether `/readyz` answers 200, and its body.
    pub fn readiness(&self) -> Result<(), String> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Bind `addr` and serve the endpoints until the future is dropped.
pub async fn serve(addr: SocketAddr, health: Arc<Health>) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    serve_on(listener, health).await
}

/// Binds `--listen`'s address, if any, before anything starts: a port in use is an error at once,
/// not a log line later.
pub async fn bind(listen: Option<SocketAddr>) -> anyhow::Result<Option<TcpListener>> {
    match listen {
        Some(addr) => TcpListener::bind(addr)
            .await
            .map(Some)
            .with_context(|| format!("listening on {addr} (--listen)")),
        None => Ok(None),
    }
}

/// Serve the endpoints on `listener` in a task of their own, until it is aborted.
pub fn spawn(listener: TcpListener, health: Arc<Health>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(error) = serve_on(listener, health).await {
            tracing::error!("{error:#}");
        }
    })
}

/// Serve the endpoints on `listener` (bound by the caller, for example to port 0 in a test)
/// until the future is dropped.
pub async fn serve_on(listener: TcpListener, health: Arc<Health>) -> anyhow::Result<()> {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: keep serving the next one.
                tracing::warn!(%error, "accepting a health connection failed");
                continue;
            }
        };
        let health = Arc::clone(&health);
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let health = Arc::clone(&health);
                async move { Ok::<_, Infallible>(answer(&request, &health)) }
            });
            if let Err(error) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, "health connection ended");
            }
        });
    }
}

fn answer(request: &Request<Incoming>, health: &Health) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    };
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match request.uri().path() {
        "/healthz" | "/livez" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => match health.readiness() {
            Ok(()) => text(StatusCode::OK, "ok\n".into()),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
        "/metrics" => {
            let mut response = text(StatusCode::OK, health.metrics.encode());
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(METRICS_CONTENT_TYPE),
            );
            response
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn readyz_follows_the_mode_and_metrics_are_openmetrics() {
        let metrics = Metrics::default();
        metrics.reconciled("proxy", "success", std::time::Duration::from_millis(1));
        let health = Arc::new(Health::new(metrics));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_on(listener, Arc::clone(&health)));

        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        let waiting = get(addr, "/readyz").await;
        assert!(waiting.starts_with("HTTP/1.1 503"), "{waiting}");
        assert!(waiting.ends_with("starting\n"), "{waiting}");
        health.set_ready(Ok(()));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        let metrics = get(addr, "/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(
            metrics.contains(&format!("content-type: {METRICS_CONTENT_TYPE}")),
            "{metrics}"
        );
        assert!(metrics.contains(
            r#"controller_runtime_reconcile_total{controller="proxy",result="success"} 1"#
        ));
        assert!(metrics.trim_end().ends_with("# EOF"), "{metrics}");
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        server.abort();
    }
}
