//! Backends the conformance tests run providers against.
//!
//! [`Inventory`]: a small inventory service over real HTTP on loopback: the backend the reference provider's
//! endpoint mode talks to (`components/reference`: `POST /instances`, `GET|DELETE
//! /instances/<name>`, `GET /instances?tag=<key>=<value>`, `GET /health`), keeping the contract's
//! semantics on its side: create is idempotent by name and refuses another UID (409), a missing
//! instance is 404, list-by-tag filters by the tags a create sent.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

type Instances = Arc<Mutex<BTreeMap<String, Value>>>;

/// A running inventory; stops when dropped.
pub struct Inventory {
    origin: String,
    instances: Instances,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Inventory {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Inventory {
    pub async fn start() -> Inventory {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let instances = Instances::default();
        let shared = instances.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let instances = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let instances = instances.clone();
                        async move { Ok::<_, hyper::Error>(answer(&instances, request).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        Inventory {
            origin,
            instances,
            task,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// How many instances it holds.
    pub fn len(&self) -> usize {
        self.instances.lock().unwrap().len()
    }
}

async fn answer(
    instances: &Instances,
    request: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or_default().to_owned();
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut instances = instances.lock().unwrap();
    let name = path.strip_prefix("/instances/").map(decode);
    match (&method, path.as_str(), name) {
        (&Method::GET, "/health", _) => reply(StatusCode::OK, json!({"status": "ok"})),
        (&Method::POST, "/instances", _) => {
            let Ok(asked) = serde_json::from_slice::<Value>(&body) else {
                return reply(StatusCode::BAD_REQUEST, json!({"error": "not JSON"}));
            };
            let (Some(name), Some(uid)) = (asked["name"].as_str(), asked["uid"].as_str()) else {
                return reply(StatusCode::BAD_REQUEST, json!({"error": "name and uid"}));
            };
            match instances.get(name) {
                Some(existing) if existing["uid"] == uid => reply(StatusCode::OK, existing.clone()),
                Some(_) => reply(
                    StatusCode::CONFLICT,
                    json!({"error": format!("{name} belongs to another UID")}),
                ),
                None => {
                    let instance = json!({
                        "name": name, "uid": uid, "state": "running",
                        "addresses": ["192.0.2.10"], "createdAt": "2026-12-01T00:00:00Z",
                        "tags": asked.get("tags").cloned().unwrap_or(json!([])),
                    });
                    instances.insert(name.to_owned(), instance.clone());
                    reply(StatusCode::CREATED, instance)
                }
            }
        }
        (&Method::GET, "/instances", _) => {
            let wanted = query
                .strip_prefix("tag=")
                .and_then(|tag| tag.split_once('='))
                .map(|(key, value)| json!({"key": decode(key), "value": decode(value)}));
            let listed: Vec<Value> = instances
                .values()
                .filter(|instance| {
                    wanted.as_ref().is_some_and(|wanted| {
                        instance["tags"]
                            .as_array()
                            .is_some_and(|tags| tags.contains(wanted))
                    })
                })
                .cloned()
                .collect();
            reply(StatusCode::OK, Value::Array(listed))
        }
        (&Method::GET, _, Some(name)) => match instances.get(&name) {
            Some(instance) => reply(StatusCode::OK, instance.clone()),
            None => reply(StatusCode::NOT_FOUND, json!({"error": "no such instance"})),
        },
        (&Method::DELETE, _, Some(name)) => match instances.remove(&name) {
            Some(_) => reply(StatusCode::NO_CONTENT, Value::Null),
            None => reply(StatusCode::NOT_FOUND, json!({"error": "no such instance"})),
        },
        _ => reply(StatusCode::NOT_FOUND, json!({"error": "no such route"})),
    }
}

fn decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

fn reply(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let body = if body.is_null() {
        Bytes::new()
    } else {
        Bytes::from(body.to_string())
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response
}

/// The example provider's backend, `testdata/inventory/inventory.py` (the guide's toy inventory),
/// as a real process over HTTPS on loopback with a bearer token the broker injects; killed on
/// drop. It implements the test-backend hook `POST /_egress-test/stop`.
pub struct PythonInventory {
    child: std::process::Child,
    origin: String,
    files: tempfile::TempDir,
    token: String,
}

impl Drop for PythonInventory {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl PythonInventory {
    pub fn start() -> PythonInventory {
        use std::io::BufRead as _;
        let files = tempfile::tempdir().unwrap();
        let token = format!("inventory-{}", std::process::id());
        std::fs::write(files.path().join("token"), &token).unwrap();
        // A CA for this run, and the inventory's certificate for 127.0.0.1 signed by it.
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&leaf_key, &ca, &ca_key)
            .unwrap();
        std::fs::write(files.path().join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(files.path().join("cert.pem"), leaf.pem()).unwrap();
        std::fs::write(files.path().join("key.pem"), leaf_key.serialize_pem()).unwrap();
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/inventory/inventory.py");
        let file = |name: &str| files.path().join(name).to_str().unwrap().to_owned();
        let mut child = std::process::Command::new("python3")
            .arg(script)
            .args(["--token-file", &file("token")])
            .args([
                "--tls-cert",
                &file("cert.pem"),
                "--tls-key",
                &file("key.pem"),
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs the toy inventory");
        // Its first line, `url: https://127.0.0.1:PORT`, comes once it listens.
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let origin = line
            .trim()
            .strip_prefix("url: ")
            .unwrap_or_else(|| panic!("the inventory's first line is its url: {line:?}"))
            .to_owned();
        PythonInventory {
            child,
            origin,
            files,
            token,
        }
    }

    /// The example provider's config.
    pub fn config(&self) -> Value {
        json!({ "url": self.origin })
    }

    /// The grants document for `identity`: the origin, the bearer token from its file, the CA.
    pub fn grants(&self, identity: &str) -> Value {
        json!({"grants": {identity: {"http": {
            "origins": [self.origin],
            "credential": {
                "header": "Authorization", "format": "Bearer {secret}",
                "secretFile": self.files.path().join("token"),
            },
            "tls": {"caFile": self.files.path().join("ca.pem")},
        }}}})
    }

    /// The names of every VM it holds, asked over HTTPS with its token.
    pub async fn vm_names(&self) -> Vec<String> {
        let ca = std::fs::read(self.files.path().join("ca.pem")).unwrap();
        let client = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .build()
            .unwrap();
        let vms: Vec<Value> = client
            .get(format!("{}/vms", self.origin))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        vms.iter()
            .map(|vm| vm["name"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}
