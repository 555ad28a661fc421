//! Real TLS servers on 127.0.0.1 for the broker tests: rcgen CAs and leaves, hyper 1 servers
//! over tokio-rustls that record what they received and answer as each test scripts.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Empty};
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;

use egress_capability_http::{Broker, HttpGrant};
use egress_runtime::Capability as _;
use egress_runtime::egress::{CallSite, Egress, EgressBody, EgressError};
use egress_runtime::grant::{FilesOnly, GrantContext, GrantError};

/// A certificate authority made for one test run.
pub struct Ca {
    certificate: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let certificate = params.self_signed(&key).unwrap();
        Self { certificate, key }
    }

    pub fn pem(&self) -> String {
        self.certificate.pem()
    }

    /// A leaf for these subject alternative names (IPs or DNS names).
    pub fn leaf(&self, names: &[&str]) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        self.leaf_with(names, |_| {})
    }

    /// A leaf for `names` that expired in 2020.
    pub fn expired_leaf(
        &self,
        names: &[&str],
    ) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        self.leaf_with(names, |params| {
            params.not_before = rcgen::date_time_ymd(2019, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 1, 1);
        })
    }

    fn leaf_with(
        &self,
        names: &[&str],
        adjust: impl FnOnce(&mut CertificateParams),
    ) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        adjust(&mut params);
        let key = KeyPair::generate().unwrap();
        let leaf = params
            .signed_by(&key, &self.certificate, &self.key)
            .unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (vec![leaf.der().clone()], key)
    }
}

/// What a server received.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path_and_query: String,
    pub headers: HeaderMap,
    pub version: Version,
    /// The request body, whole.
    pub body: Vec<u8>,
}

/// How a server answers.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// Sent as these chunks, `chunk_delay` apart, with no Content-Length.
    pub chunks: Vec<Vec<u8>>,
    /// Sent with a Content-Length instead, when set.
    pub whole: Option<Vec<u8>>,
    pub headers_delay: Duration,
    pub chunk_delay: Duration,
}

impl Reply {
    pub fn ok(body: &str) -> Self {
        Self {
            status: 200,
            headers: vec![("content-type".into(), "application/json".into())],
            chunks: Vec::new(),
            whole: Some(body.as_bytes().to_vec()),
            headers_delay: Duration::ZERO,
            chunk_delay: Duration::ZERO,
        }
    }

    pub fn chunked(chunks: Vec<Vec<u8>>) -> Self {
        Self {
            whole: None,
            chunks,
            ..Self::ok("")
        }
    }
}

pub type Handler = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    /// ALPN h2 only, HTTP/2 only.
    H2Only,
}

pub struct Server {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    /// A TLS server presenting a leaf of `ca` for `names`.
    pub async fn start(ca: &Ca, names: &[&str], protocol: Protocol, handler: Handler) -> Self {
        let (chain, key) = ca.leaf(names);
        Self::presenting(chain, key, protocol, handler).await
    }

    /// A TLS server presenting `chain`.
    pub async fn presenting(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        protocol: Protocol,
        handler: Handler,
    ) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        config.alpn_protocols = match protocol {
            Protocol::Http1 => vec![b"http/1.1".to_vec()],
            Protocol::H2Only => vec![b"h2".to_vec()],
        };
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let handler = handler.clone();
                let recorded = recorded.clone();
                tokio::spawn(async move {
                    // A failed handshake is what some tests are about; nothing to serve.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = service_fn(move |request: Request<Incoming>| {
                        let handler = handler.clone();
                        let recorded = recorded.clone();
                        async move {
                            Ok::<_, std::convert::Infallible>(
                                answer(request, &handler, &recorded).await,
                            )
                        }
                    });
                    let io = TokioIo::new(tls);
                    let _ = match protocol {
                        Protocol::Http1 => {
                            hyper::server::conn::http1::Builder::new()
                                .serve_connection(io, service)
                                .await
                        }
                        Protocol::H2Only => {
                            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                                .serve_connection(io, service)
                                .await
                        }
                    };
                });
            }
        });
        Self { addr, seen, task }
    }

    pub fn origin(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn answer(
    request: Request<Incoming>,
    handler: &Handler,
    recorded: &Mutex<Vec<Seen>>,
) -> Response<ScriptedBody> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|collected| collected.to_bytes().to_vec())
        .unwrap_or_default();
    let seen = Seen {
        path_and_query: parts
            .uri
            .path_and_query()
            .map_or("/".into(), |p| p.to_string()),
        headers: parts.headers,
        version: parts.version,
        body,
    };
    let reply = handler(&seen);
    recorded.lock().unwrap().push(seen);
    tokio::time::sleep(reply.headers_delay).await;
    let mut response = Response::builder().status(StatusCode::from_u16(reply.status).unwrap());
    for (name, value) in &reply.headers {
        response = response.header(name, value);
    }
    let body = match reply.whole {
        Some(whole) => ScriptedBody::new(vec![whole], Duration::ZERO, true),
        None => ScriptedBody::new(reply.chunks, reply.chunk_delay, false),
    };
    response.body(body).unwrap()
}

/// A response body sent as scripted chunks with a pause before each.
pub struct ScriptedBody {
    chunks: VecDeque<Bytes>,
    delay: Duration,
    pause: Option<Pin<Box<Sleep>>>,
    exact_length: Option<u64>,
}

impl ScriptedBody {
    fn new(chunks: Vec<Vec<u8>>, delay: Duration, exact: bool) -> Self {
        let length = chunks.iter().map(|c| c.len() as u64).sum();
        Self {
            chunks: chunks.into_iter().map(Bytes::from).collect(),
            delay,
            pause: None,
            exact_length: exact.then_some(length),
        }
    }
}

impl Body for ScriptedBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.chunks.is_empty() {
            return Poll::Ready(None);
        }
        if !self.delay.is_zero() {
            let delay = self.delay;
            let pause = self
                .pause
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(delay)));
            std::task::ready!(pause.as_mut().poll(cx));
            self.pause = None;
        }
        Poll::Ready(self.chunks.pop_front().map(|chunk| Ok(Frame::data(chunk))))
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self.exact_length {
            Some(length) => hyper::body::SizeHint::with_exact(length),
            None => hyper::body::SizeHint::default(),
        }
    }
}

/// Files a grant points at.
pub struct Files {
    pub dir: tempfile::TempDir,
}

impl Files {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, contents).unwrap();
        path
    }
}

/// The grant the tests start from: one origin, a token injected as Proxmox does, the CA.
pub fn proxmox_grant(origin: &str, token_file: &Path, ca_file: &Path) -> serde_json::Value {
    serde_json::json!({
        "origins": [origin],
        "credential": {
            "header": "Authorization",
            "format": "PVEAPIToken={secret}",
            "secretFile": token_file,
        },
        "tls": { "caFile": ca_file, "http1Only": true },
        "timeouts": { "connectMs": 2000, "firstByteMs": 5000, "totalMs": 10000 },
    })
}

/// A broker granting `provider` the grant `grant` (a test's document, which may carry a
/// `digest`: the host's pin beside the document).
pub fn broker(provider: &str, grant: serde_json::Value) -> Broker {
    try_broker(provider, grant).unwrap()
}

/// [`broker`], or why the grant is refused.
pub fn try_broker(provider: &str, mut grant: serde_json::Value) -> Result<Broker, GrantError> {
    let digests: Vec<String> = grant
        .as_object_mut()
        .and_then(|grant| grant.remove("digest"))
        .and_then(|digest| digest.as_str().map(str::to_owned))
        .into_iter()
        .collect();
    let grant: HttpGrant = serde_json::from_value(grant).unwrap();
    let broker = Broker::new();
    broker.set_grant(
        provider,
        &grant,
        &GrantContext {
            digests: &digests,
            host: &FilesOnly,
        },
    )?;
    Ok(broker)
}

pub fn site(provider: &str) -> CallSite {
    CallSite {
        provider: Arc::from(provider),
        digest: Arc::from(""),
        operation: "get",
    }
}

pub fn get(uri: &str, headers: &[(&str, &str)]) -> Request<EgressBody> {
    let mut request = Request::builder().method("GET").uri(uri);
    // As wasi:http does: Host is the URL's authority.
    if let Some(authority) = uri
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.authority().cloned())
    {
        request = request.header(http::header::HOST, authority.as_str());
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request
        .body(
            Empty::<Bytes>::new()
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
        .unwrap()
}

/// A response as the guest would read it.
#[derive(Debug)]
pub struct Received {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Received {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends through the broker and reads the whole body, as a guest would.
pub async fn send(
    broker: &Broker,
    provider: &str,
    request: Request<EgressBody>,
) -> Result<Received, EgressError> {
    let response = broker.send(&site(provider), request, None).await?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await?.to_bytes().to_vec();
    Ok(Received {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

pub fn handler(f: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Handler {
    Arc::new(f)
}

/// A TLS server that answers every request with the same raw bytes (status line, headers and
/// body as written), for answers a well-behaved HTTP library would not produce, such as a
/// transfer coding other than chunked. It counts the requests it read.
pub struct RawServer {
    pub addr: SocketAddr,
    requests: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawServer {
    pub async fn start(ca: &Ca, raw: Vec<u8>) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (chain, key) = ca.leaf(&["127.0.0.1"]);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = requests.clone();
        let raw = Arc::new(raw);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, counted, raw) = (acceptor.clone(), counted.clone(), raw.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match tls.read(&mut byte).await {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let _ = tls.write_all(&raw).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        Self {
            addr,
            requests,
            task,
        }
    }

    pub fn origin(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    pub fn requests(&self) -> usize {
        self.requests.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// `bytes` gzip-compressed, as a server answering `Accept-Encoding: gzip` sends them.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}
