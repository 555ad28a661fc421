//! Shared helpers: a reqwest client over real HTTPS (the run's CA, HTTP/1.1 only) and answers
//! with their status, reason phrase and JSON body.
#![allow(dead_code)] // each test binary uses a different subset

use std::time::Duration;

use pvesim::{SimConfig, Simulator};
use serde_json::Value;

/// Task latency in tests: long enough to observe a running task, short enough to stay quick.
pub const LATENCY: Duration = Duration::from_millis(40);

pub struct Api {
    pub sim: Simulator,
    pub client: reqwest::Client,
    auth: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub reason: String,
    /// `Value::Null` when the body is empty.
    pub body: Value,
    pub raw: Vec<u8>,
}

impl Answer {
    pub fn data(&self) -> &Value {
        &self.body["data"]
    }

    pub fn upid(&self) -> String {
        assert_eq!(self.status, 200, "expected a UPID, got {self:?}");
        self.data()
            .as_str()
            .expect("data is a UPID string")
            .to_string()
    }

    pub fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or_default()
    }
}

pub fn client_for(sim: &Simulator) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(sim.ca_pem().as_bytes()).unwrap();
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .http1_only()
        .build()
        .unwrap()
}

/// The node a UPID names: the one that ran the task.
pub fn upid_node(upid: &str) -> &str {
    upid.split(':').nth(1).expect("a UPID names its node")
}

pub fn encode(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, percent_encoding::NON_ALPHANUMERIC).to_string()
}

impl Api {
    pub async fn start() -> Api {
        Self::start_with(SimConfig {
            task_latency: LATENCY,
            ..SimConfig::default()
        })
        .await
    }

    pub async fn start_with(config: SimConfig) -> Api {
        let sim = Simulator::start(config).await.unwrap();
        let client = client_for(&sim);
        let auth = Some(sim.token_header());
        Api { sim, client, auth }
    }

    /// The same simulator, seen with another Authorization header (or none).
    pub fn with_auth(&self, auth: Option<String>) -> ApiAs<'_> {
        ApiAs { api: self, auth }
    }

    pub async fn send(&self, method: &str, path: &str, form: &[(&str, &str)]) -> Answer {
        self.try_send(method, path, form)
            .await
            .expect("request failed at transport level")
    }

    pub async fn try_send(
        &self,
        method: &str,
        path: &str,
        form: &[(&str, &str)],
    ) -> reqwest::Result<Answer> {
        send_as(self, self.auth.as_deref(), method, path, form).await
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send("GET", path, &[]).await
    }

    pub async fn post(&self, path: &str, form: &[(&str, &str)]) -> Answer {
        self.send("POST", path, form).await
    }

    pub async fn put(&self, path: &str, form: &[(&str, &str)]) -> Answer {
        self.send("PUT", path, form).await
    }

    pub async fn delete(&self, path: &str) -> Answer {
        self.send("DELETE", path, &[]).await
    }

    /// The task's status from the node that ran it, as its UPID names it.
    pub async fn task_status(&self, upid: &str) -> Answer {
        self.task_status_on(upid_node(upid), upid).await
    }

    /// The task's status as `node` answers it.
    pub async fn task_status_on(&self, node: &str, upid: &str) -> Answer {
        self.get(&format!("/nodes/{node}/tasks/{}/status", encode(upid)))
            .await
    }

    /// Polls a task until it has stopped; returns its status object.
    pub async fn wait_task(&self, upid: &str) -> Value {
        for _ in 0..2000 {
            let answer = self.task_status(upid).await;
            assert_eq!(answer.status, 200, "task status: {answer:?}");
            if answer.data()["status"] == "stopped" {
                return answer.data().clone();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("task {upid} never stopped");
    }

    /// Clones 9001 to `newid` and waits; asserts the task ended OK.
    pub async fn clone_template(&self, newid: u32, extra: &[(&str, &str)]) {
        let newid = newid.to_string();
        let mut form = vec![
            ("newid", newid.as_str()),
            ("name", "proxy-reconaaaaaaaaaaa"),
            ("full", "1"),
        ];
        form.extend_from_slice(extra);
        let upid = self
            .post("/nodes/pv1-1/qemu/9001/clone", &form)
            .await
            .upid();
        let status = self.wait_task(&upid).await;
        assert_eq!(status["exitstatus"], "OK", "clone: {status}");
    }

    /// An admin request (`/_sim/{route}`) with the main token.
    pub async fn admin(&self, method: &str, route: &str, body: &str) -> Answer {
        admin_as(self, self.auth.as_deref(), method, route, body).await
    }

    /// Polls `condition` every 5 ms until it holds; panics naming `what` after 5 s.
    pub async fn eventually<F, Fut>(&self, what: &str, mut condition: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !condition().await {
            assert!(tokio::time::Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Uploads `bytes` as `filename` with content=iso, through pv1-1.
    pub async fn upload(&self, storage: &str, filename: &str, bytes: &[u8]) -> Answer {
        self.upload_on("pv1-1", storage, filename, bytes).await
    }

    /// Uploads `bytes` as `filename` with content=iso, through `node`.
    pub async fn upload_on(
        &self,
        node: &str,
        storage: &str,
        filename: &str,
        bytes: &[u8],
    ) -> Answer {
        let part = reqwest::multipart::Part::bytes(bytes.to_vec())
            .file_name(filename.to_string())
            .mime_str("application/octet-stream")
            .unwrap();
        let form = reqwest::multipart::Form::new()
            .text("content", "iso")
            .part("filename", part);
        let url = format!(
            "{}/api2/json/nodes/{node}/storage/{storage}/upload",
            self.sim.url()
        );
        let mut request = self.client.post(url).multipart(form);
        if let Some(auth) = &self.auth {
            request = request.header("Authorization", auth);
        }
        answer(request.send().await.unwrap()).await
    }
}

pub struct ApiAs<'a> {
    api: &'a Api,
    auth: Option<String>,
}

impl ApiAs<'_> {
    pub async fn send(&self, method: &str, path: &str, form: &[(&str, &str)]) -> Answer {
        send_as(self.api, self.auth.as_deref(), method, path, form)
            .await
            .unwrap()
    }
}

/// An admin request (`/_sim/{route}`) with `auth` as the Authorization header, if any.
pub async fn admin_as(
    api: &Api,
    auth: Option<&str>,
    method: &str,
    route: &str,
    body: &str,
) -> Answer {
    let url = format!("{}/_sim/{route}", api.sim.url());
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = api.client.request(method, url).body(body.to_string());
    if let Some(auth) = auth {
        request = request.header("Authorization", auth);
    }
    answer(request.send().await.unwrap()).await
}

async fn send_as(
    api: &Api,
    auth: Option<&str>,
    method: &str,
    path: &str,
    form: &[(&str, &str)],
) -> reqwest::Result<Answer> {
    let url = format!("{}/api2/json{path}", api.sim.url());
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = api.client.request(method, url);
    if let Some(auth) = auth {
        request = request.header("Authorization", auth);
    }
    if !form.is_empty() {
        request = request.form(form);
    }
    Ok(answer(request.send().await?).await)
}

pub async fn answer(response: reqwest::Response) -> Answer {
    let status = response.status().as_u16();
    // hyper keeps a non-canonical reason phrase as an extension; a canonical one is implied.
    let reason = response
        .extensions()
        .get::<hyper::ext::ReasonPhrase>()
        .map(|r| String::from_utf8_lossy(r.as_bytes()).into_owned())
        .unwrap_or_else(|| {
            response
                .status()
                .canonical_reason()
                .unwrap_or_default()
                .to_string()
        });
    let raw = response.bytes().await.unwrap().to_vec();
    let body = if raw.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&raw).unwrap()
    };
    Answer {
        status,
        reason,
        body,
        raw,
    }
}
