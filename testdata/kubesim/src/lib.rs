//! `kubesim`: a stateful stand-in for the Kubernetes API server over plain HTTP/1.1, so that
//! the operator's Kubernetes mode can be tested end to end with kube's real client, watches,
//! finalizers, server-side apply, Events and leader election, without a cluster.
//!
//! Objects of any kind are stored as JSON under one global resourceVersion counter, with the
//! server's rules for metadata (`uid`, `creationTimestamp`, `generation`, `managedFields`,
//! `deletionTimestamp`, `generateName`), optimistic concurrency, the `status` subresource,
//! finalizers, label and field selectors, watches replayed from history (410 Gone once it is
//! compacted), streaming lists, `CustomResourceDefinition` registration and the discovery
//! documents. Failures are `metav1.Status` bodies, so kube reports them as `Error::Api`.
//! For `kubectl` it also serves what a cluster serves a user: the OpenAPI documents built from
//! the CRD schemas (`kubectl apply` validates), `Table`s of a CRD's printer columns (`kubectl
//! get`), and one Event store seen through both `events.k8s.io/v1` and core `v1` (`kubectl
//! describe` lists what a `Recorder` published). The crate's README lists what is simplified.
//!
//! # Using it in a test
//!
//! 1. Start a server with [`KubeSim::start`]; it listens on `127.0.0.1` on a free port.
//! 2. Point a kube client at [`KubeSim::url`] (`kube::Config::new(url.parse()?)`), or write a
//!    kubeconfig with [`KubeSim::write_kubeconfig`] for a process under test.
//! 3. Create CRDs and objects through the client as against a cluster; read or seed state
//!    directly with [`KubeSim::get`] and [`KubeSim::put`].
//! 4. Break things on purpose: [`KubeSim::inject`] fails or drops the next requests that
//!    match, [`KubeSim::close_watches`] ends every open watch, [`KubeSim::compact`] makes
//!    resuming watches get 410 Gone. [`KubeSim::requests`] shows what the client sent.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use kubesim::{FaultAction, FaultRule, KubeSim};
//! use serde_json::json;
//!
//! let sim = KubeSim::start().await?;
//! // let client = kube::Client::try_from(kube::Config::new(sim.url().parse()?))?;
//! sim.put(json!({
//!     "apiVersion": "v1",
//!     "kind": "ConfigMap",
//!     "metadata": { "name": "settings", "namespace": "default" },
//!     "data": { "mode": "fast" },
//! }))?;
//! let stored = sim.get("/api/v1/namespaces/default/configmaps/settings")?;
//! assert_eq!(stored["metadata"]["generation"], 1);
//! // The next two writes of any ConfigMap answer 500.
//! sim.inject(FaultRule {
//!     method: "PUT".into(),
//!     path: "/api/v1/namespaces/*/configmaps/*".into(),
//!     times: 2,
//!     action: FaultAction::Status(500),
//! });
//! sim.close_watches();
//! sim.compact();
//! # Ok(()) }
//! ```
//!
//! Built in: core v1 Namespaces, Nodes, ConfigMaps, Secrets, Events, ServiceAccounts,
//! Services, Pods, PersistentVolumeClaims; apps/v1 Deployments, StatefulSets, DaemonSets;
//! batch/v1 Jobs; coordination.k8s.io/v1 Leases; events.k8s.io/v1 Events;
//! apiextensions.k8s.io/v1 CustomResourceDefinitions. Custom resources are served once their
//! CRD exists (or after [`KubeSim::register`]); paths of unknown kinds answer 404, as a real
//! server does before the CRD is installed. The namespaces `default`, `kube-system`,
//! `kube-public` and `kube-node-lease` exist from the start, and namespaced objects can only be
//! created in an existing namespace.

#![warn(missing_docs)]

mod api;
mod events;
mod faults;
mod fields;
mod openapi;
mod patch;
mod resource;
mod selector;
mod status;
mod store;
mod table;
mod time;
mod validation;
mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch as signal;

pub use faults::{FaultAction, FaultRule, RequestRecord};
pub use resource::ResourceType;

use crate::api::{ApiRequest, Reply};
use crate::fields::Operation;
use crate::status::ApiError;
use crate::store::{Store, Target, Write};

/// Why the simulator could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listening socket could not be opened.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A kubeconfig could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The API refused a direct read or write, as it would have answered a client.
    #[error("{reason} ({code}): {message}")]
    Api {
        /// HTTP status code.
        code: u16,
        /// The Status reason, e.g. `NotFound`.
        reason: String,
        /// The Status message.
        message: String,
    },
}

impl From<ApiError> for Error {
    fn from(e: ApiError) -> Self {
        Error::Api {
            code: e.code,
            reason: e.reason.to_string(),
            message: e.message,
        }
    }
}

/// How to run a simulator.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Address to listen on. Defaults to `127.0.0.1:0`, a free port.
    pub listen: SocketAddr,
    /// How many changes the history keeps for watches to resume from; older ones are compacted
    /// away as new ones come. Defaults to 100 000.
    pub history_limit: usize,
    /// How often a watch that asked for bookmarks gets one. Defaults to 10 seconds (the real
    /// server: about a minute).
    pub bookmark_interval: Duration,
    /// The `gitVersion` `/version` reports. Defaults to `v1.34.0`.
    pub kubernetes_version: String,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            history_limit: 100_000,
            bookmark_interval: Duration::from_secs(10),
            kubernetes_version: "v1.34.0".to_string(),
        }
    }
}

/// Locks a mutex, carrying on after a panic elsewhere (the state stays consistent: every
/// operation validates before it changes anything).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the server's tasks share; one per simulator.
pub(crate) struct Shared {
    store: Mutex<Store>,
    /// The resourceVersion after the latest change; watches wait on it.
    changed: signal::Sender<u64>,
    /// Bumped to end every open watch.
    close_watches: signal::Sender<u64>,
    open_watches: AtomicUsize,
    faults: faults::Faults,
    requests: Mutex<Vec<RequestRecord>>,
    addr: SocketAddr,
    bookmark_interval: Duration,
    kubernetes_version: String,
}

impl Shared {
    fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    /// Runs a write against the store, then wakes the watches.
    fn mutate<T>(&self, f: impl FnOnce(&mut Store) -> Result<T, ApiError>) -> Result<T, ApiError> {
        let (result, rv) = {
            let mut store = self.store();
            let result = f(&mut store);
            (result, store.resource_version())
        };
        self.changed.send_if_modified(|last| {
            let moved = *last != rv;
            *last = rv;
            moved
        });
        result
    }

    fn version_info(&self) -> Value {
        let version = self.kubernetes_version.trim_start_matches('v');
        let mut parts = version.split('.');
        json!({
            "major": parts.next().unwrap_or("1"),
            "minor": parts.next().unwrap_or("34"),
            "gitVersion": format!("v{version}"),
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": "2025-01-01T00:00:00Z",
            "goVersion": "go1.24.0",
            "compiler": "gc",
            "platform": "linux/amd64",
        })
    }
}

/// A running simulator. Dropping it stops the server and ends its connections.
pub struct KubeSim {
    shared: Arc<Shared>,
    url: String,
    shutdown: signal::Sender<bool>,
}

impl std::fmt::Debug for KubeSim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSim")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl KubeSim {
    /// Starts a simulator with the default [`SimConfig`].
    pub async fn start() -> Result<KubeSim, Error> {
        Self::start_with(SimConfig::default()).await
    }

    /// Starts a simulator.
    pub async fn start_with(config: SimConfig) -> Result<KubeSim, Error> {
        let bind = |source| Error::Bind {
            addr: config.listen,
            source,
        };
        let listener = TcpListener::bind(config.listen).await.map_err(bind)?;
        let addr = listener.local_addr().map_err(bind)?;
        let store = Store::new(config.history_limit);
        let (changed, _) = signal::channel(store.resource_version());
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            changed,
            close_watches: signal::channel(0).0,
            open_watches: AtomicUsize::new(0),
            faults: faults::Faults::default(),
            requests: Mutex::new(Vec::new()),
            addr,
            bookmark_interval: config.bookmark_interval.max(Duration::from_millis(10)),
            kubernetes_version: config.kubernetes_version,
        });
        let (shutdown, shutdown_rx) = signal::channel(false);
        tokio::spawn(accept_loop(listener, shared.clone(), shutdown_rx));
        Ok(KubeSim {
            shared,
            url: format!("http://{addr}"),
            shutdown,
        })
    }

    /// `http://127.0.0.1:PORT`, the cluster URL for a client.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A kubeconfig (YAML) whose current context reaches this server without credentials, in
    /// namespace `default`.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kubesim\n  cluster:\n    server: {}\n\
             users:\n- name: kubesim\n  user: {{}}\ncontexts:\n- name: kubesim\n  context:\n    \
             cluster: kubesim\n    user: kubesim\n    namespace: default\n\
             current-context: kubesim\n",
            self.url
        )
    }

    /// Writes [`KubeSim::kubeconfig`] to `path`, for a process under test (`KUBECONFIG`).
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), Error> {
        std::fs::write(path, self.kubeconfig()).map_err(|source| Error::Write {
            path: path.to_path_buf(),
            source,
        })
    }

    /// What a GET of `path` (object, list or discovery path, query allowed) answers, read
    /// directly: the object or list, or [`Error::Api`] with the Status a client would get.
    pub fn get(&self, path: &str) -> Result<Value, Error> {
        let (path, query) = path.split_once('?').unwrap_or((path, ""));
        let request = ApiRequest {
            method: "GET",
            path,
            query,
            content_type: None,
            accept: None,
            user_agent: None,
            body: &[],
        };
        match api::handle(&self.shared, &request) {
            Reply::Json(200, value) => Ok(value),
            Reply::Json(_, status) => Err(Error::Api {
                code: status["code"]
                    .as_u64()
                    .and_then(|c| u16::try_from(c).ok())
                    .unwrap_or(500),
                reason: status["reason"].as_str().unwrap_or_default().to_string(),
                message: status["message"].as_str().unwrap_or_default().to_string(),
            }),
            Reply::Text(text) => Ok(Value::String(text.to_string())),
            Reply::Bytes(..) => Err(ApiError::bad_request("get reads JSON only").into()),
            Reply::Watch(_) => Err(ApiError::bad_request("get cannot watch").into()),
        }
    }

    /// Creates or replaces an object directly, as field manager `kubesim`: its `apiVersion`,
    /// `kind`, `metadata.name` (and `metadata.namespace` for a namespaced kind) say which. A
    /// replace ignores `resourceVersion`; `.status` is kept as given for either. Watches see
    /// the change. Returns the stored object.
    pub fn put(&self, object: Value) -> Result<Value, Error> {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let kind = object["kind"].as_str().unwrap_or_default();
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let namespace = object["metadata"]["namespace"].as_str().map(str::to_string);
        let rt = self
            .shared
            .store()
            .registry
            .by_kind(group, kind)
            .cloned()
            .ok_or_else(|| ApiError::bad_request(format!("no kind {kind} in {api_version}")))?;
        if name.is_empty() {
            return Err(ApiError::bad_request("put needs metadata.name").into());
        }
        let target = |status| Target {
            rt: &rt,
            version,
            namespace: namespace.as_deref(),
            name: &name,
            status,
            manager: "kubesim",
        };
        let exists = self
            .shared
            .store()
            .get(&rt, version, namespace.as_deref(), &name)
            .is_ok();
        let mut body = object.clone();
        if let Some(meta) = body["metadata"].as_object_mut() {
            meta.remove("resourceVersion");
        }
        let mut stored = if exists {
            self.shared
                .mutate(|s| s.write(&target(false), Write::Replace(body)))?
                .0
        } else {
            self.shared
                .mutate(|s| s.create(&target(false), body, Operation::Update))?
        };
        if rt.status_subresource
            && let Some(status) = object.get("status")
        {
            let body = json!({ "status": status });
            stored = self
                .shared
                .mutate(|s| s.write(&target(true), Write::Replace(body)))?
                .0;
        }
        Ok(stored)
    }

    /// Serves a kind without a CRD (or replaces how one is served).
    pub fn register(&self, resource: ResourceType) {
        self.shared.store().registry.register(resource);
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.shared.requests).clone()
    }

    /// Forgets the requests received so far.
    pub fn clear_requests(&self) {
        lock(&self.shared.requests).clear();
    }

    /// Adds a fault rule; rules are tried in the order added.
    pub fn inject(&self, rule: FaultRule) {
        self.shared.faults.add(rule);
    }

    /// Ends every watch open now, cleanly (as when an API server restarts its watch cache).
    /// Clients resume from the last resourceVersion they saw.
    pub fn close_watches(&self) {
        self.shared.close_watches.send_modify(|n| *n += 1);
    }

    /// How many watch streams are open.
    pub fn open_watches(&self) -> usize {
        self.shared.open_watches.load(Ordering::SeqCst)
    }

    /// Drops all history: a watch resuming from any resourceVersion before now gets an
    /// `ERROR` event with a 410 Status and must list again.
    pub fn compact(&self) {
        self.shared.store().compact();
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store().resource_version()
    }
}

impl Drop for KubeSim {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        self.close_watches();
    }
}

type ResponseBody = BoxBody<Bytes, std::convert::Infallible>;

/// The service error that makes hyper close the connection without answering.
#[derive(Debug, thiserror::Error)]
#[error("connection dropped by an injected fault")]
struct Dropped;

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: signal::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((tcp, _peer)) = accepted else { continue };
        let shared = shared.clone();
        let mut shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| serve(shared.clone(), request));
            let connection = http1::Builder::new().serve_connection(TokioIo::new(tcp), service);
            tokio::select! {
                _ = connection => {}
                _ = shutdown.changed() => {}
            }
        });
    }
}

fn json_response(code: u16, body: &Value) -> Response<ResponseBody> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *response.status_mut() =
        hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn fault_status(code: u16) -> Value {
    let reason = match code {
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    };
    let mut status = ApiError::internal(format!("injected fault: {code} {reason}")).to_status();
    status["code"] = json!(code);
    status["reason"] = json!(reason);
    status
}

async fn serve(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<ResponseBody>, Dropped> {
    let (parts, body) = request.into_parts();
    let header = |name: hyper::header::HeaderName| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let mut record = RequestRecord {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().unwrap_or_default().to_string(),
        content_type: header(hyper::header::CONTENT_TYPE),
        status: 0,
    };
    let response = match shared.faults.take(&record.method, &record.path) {
        Some(FaultAction::Drop) => None,
        Some(FaultAction::Status(code)) => Some(json_response(code, &fault_status(code))),
        None => Some(respond(&shared, &parts, body, &record).await),
    };
    record.status = response.as_ref().map_or(0, |r| r.status().as_u16());
    tracing::debug!(method = %record.method, path = %record.path, query = %record.query, status = record.status, "request");
    lock(&shared.requests).push(record);
    response.ok_or(Dropped)
}

async fn respond(
    shared: &Arc<Shared>,
    parts: &hyper::http::request::Parts,
    body: Incoming,
    record: &RequestRecord,
) -> Response<ResponseBody> {
    let body = match Limited::new(body, api::MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            return json_response(413, &ApiError::too_large(api::MAX_BODY).to_status());
        }
        Err(e) => {
            return json_response(
                400,
                &ApiError::bad_request(format!("reading the body: {e}")).to_status(),
            );
        }
    };
    let header =
        |name: hyper::header::HeaderName| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let request = ApiRequest {
        method: &record.method,
        path: &record.path,
        query: &record.query,
        content_type: header(hyper::header::CONTENT_TYPE),
        accept: header(hyper::header::ACCEPT),
        user_agent: header(hyper::header::USER_AGENT),
        body: &body,
    };
    match api::handle(shared, &request) {
        Reply::Json(code, value) => json_response(code, &value),
        Reply::Text(text) => Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed()),
        Reply::Bytes(content_type, bytes) => {
            let mut response = Response::new(Full::new(Bytes::from(bytes)).boxed());
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(content_type),
            );
            response
        }
        Reply::Watch(watch) => {
            let mut response = Response::new(watch::stream(shared.clone(), *watch).boxed());
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            response
        }
    }
}
