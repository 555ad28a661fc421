//! An HTTPS origin of the lab's own: a CA made for it, and a server of fixed files on 127.0.0.1.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// A certificate authority made for one origin.
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

    /// Its certificate, PEM.
    pub fn pem(&self) -> String {
        self.certificate.pem()
    }

    /// Writes its certificate to `path`.
    pub fn write_pem(&self, path: &Path) {
        std::fs::write(path, self.certificate.pem()).unwrap();
    }
}

/// An HTTPS server on 127.0.0.1 answering each path from a fixed table (404 otherwise), with a
/// leaf of its CA for `127.0.0.1`. It counts the requests it served; a gated one sends half of
/// each body, then waits for [`ImageServer::open_gate`].
pub struct ImageServer {
    pub addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    gate: Arc<tokio::sync::watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ImageServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ImageServer {
    pub async fn start(ca: &Ca, files: HashMap<String, Vec<u8>>) -> Self {
        Self::serve(ca, files, true).await
    }

    /// A server that holds every body half-sent until [`ImageServer::open_gate`].
    pub async fn gated(ca: &Ca, files: HashMap<String, Vec<u8>>) -> Self {
        Self::serve(ca, files, false).await
    }

    async fn serve(ca: &Ca, files: HashMap<String, Vec<u8>>, open: bool) -> Self {
        let params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        let key = KeyPair::generate().unwrap();
        let leaf = params.signed_by(&key, &ca.certificate, &ca.key).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone()], key)
            .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let files = Arc::new(
            files
                .into_iter()
                .map(|(path, body)| (path, Bytes::from(body)))
                .collect::<HashMap<_, _>>(),
        );
        let requests = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::watch::Sender::new(open));
        let (counted, opened) = (Arc::clone(&requests), Arc::clone(&gate));
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, files) = (acceptor.clone(), files.clone());
                let (counted, opened) = (Arc::clone(&counted), Arc::clone(&opened));
                tokio::spawn(async move {
                    // A refused handshake is what some tests are about.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service =
                        service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                            counted.fetch_add(1, Ordering::SeqCst);
                            let found = files.get(request.uri().path()).cloned();
                            let gate = opened.subscribe();
                            async move {
                                let response = match found {
                                    Some(body) => hyper::Response::builder()
                                        .header("content-length", body.len())
                                        .body(gated_body(body, gate))
                                        .unwrap(),
                                    None => hyper::Response::builder()
                                        .status(404)
                                        .body(gated_body(Bytes::from_static(b"not found"), gate))
                                        .unwrap(),
                                };
                                Ok::<_, std::convert::Infallible>(response)
                            }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            requests,
            gate,
            task,
        }
    }

    pub fn origin(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    /// Requests served so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Lets every held body finish.
    pub fn open_gate(&self) {
        self.gate.send_replace(true);
    }
}

/// A response body's frames.
type Frames = std::pin::Pin<
    Box<
        dyn futures::Stream<Item = Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>
            + Send,
    >,
>;

/// `body`: its first half at once, the rest once `gate` holds `true`.
fn gated_body(
    body: Bytes,
    gate: tokio::sync::watch::Receiver<bool>,
) -> http_body_util::StreamBody<Frames> {
    let half = body.len() / 2;
    let parts = vec![body.slice(..half), body.slice(half..)];
    let stream = futures::stream::unfold(
        (parts.into_iter().enumerate(), gate),
        |(mut parts, mut gate)| async move {
            let (index, part) = parts.next()?;
            if index == 1 {
                let _ = gate.wait_for(|open| *open).await;
            }
            Some((Ok(hyper::body::Frame::data(part)), (parts, gate)))
        },
    );
    http_body_util::StreamBody::new(Box::pin(stream))
}
