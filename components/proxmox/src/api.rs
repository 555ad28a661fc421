//! A thin Proxmox VE API client over the [`Io`] seam.
//!
//! Every success body is the envelope `{"data": …}`; an error is the HTTP status plus a message
//! (F1). The client never sets `Authorization`: the host's egress broker injects the API token and
//! verifies TLS. Request bodies are form-encoded, except the seed upload, which is multipart with
//! an exact `Content-Length` (F12). The `/` in a volume ID travels as `%2F`.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::config::Config;

/// Every API path hangs off this prefix.
pub const API_PREFIX: &str = "/api2/json";

/// The HTTP methods the provider uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Put,
    Delete,
}

/// One request, as the [`Io`] seam sends it to the configured `apiUrl`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub method: Method,
    /// Path and query, starting with [`API_PREFIX`].
    pub path: String,
    /// `Content-Type` of `body`, when there is a body.
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

/// One response: the status and the whole body. (`wasi:http` does not expose the reason phrase,
/// so F1's fallback to it becomes a fallback to the status.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Why a request got no response: the shared guest crate's kinds (unreachable, TLS, denied,
/// credentials unavailable, other).
pub use egress_guest::{TransportError, TransportKind};

/// Log levels of the host's `log` import.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
}

/// Everything the provider needs from outside: HTTP, clocks and logging. The component implements
/// it over `wasi:http`, `wasi:clocks` and the `log` import; tests implement it in memory.
pub trait Io {
    /// Send one request and read the whole response.
    fn send(&mut self, request: &Request) -> Result<Response, TransportError>;
    /// Wait without spinning.
    fn sleep_ms(&mut self, milliseconds: u64);
    /// Milliseconds on a monotonic clock, for budgets.
    fn monotonic_ms(&mut self) -> u64;
    /// Wall-clock now as RFC 3339 (for the ownership mark's `created-at`).
    fn now_rfc3339(&mut self) -> String;
    /// Emit one structured log line.
    fn log(&mut self, level: LogLevel, message: &str, fields: &[(&str, &str)]);
}

/// A failed API call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiError {
    /// The node answered with a non-2xx status; `message` is the body's trimmed `message`, or the
    /// status when the body has none (F1, F22: a 401 has an empty body).
    Http { status: u16, message: String },
    /// No response.
    Transport(TransportError),
    /// A 2xx answer whose body is not what the endpoint documents.
    Decode(String),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Http { status, message } => write!(f, "HTTP {status}: {message}"),
            ApiError::Transport(error) => write!(f, "request failed: {}", error.detail),
            ApiError::Decode(detail) => write!(f, "unexpected answer: {detail}"),
        }
    }
}

/// Most of a body that is not PVE-shaped kept in an error message.
const MAX_FOREIGN_BODY: usize = 300;

/// The error for a non-2xx `response` (F1): the trimmed body `message`, else the status. A body
/// that is not a PVE JSON envelope (a proxy's HTML page, another API's text) is kept, cut and on
/// one line, after the status: it is the only clue to what answered.
pub fn http_error(response: &Response) -> ApiError {
    let parsed = serde_json::from_slice::<Value>(&response.body).ok();
    let message = parsed.as_ref().and_then(pve_message).unwrap_or_else(|| {
        let status = format!("HTTP status {}", response.status);
        let text = String::from_utf8_lossy(&response.body);
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if parsed.is_some() || text.is_empty() {
            return status;
        }
        let mut cut = MAX_FOREIGN_BODY.min(text.len());
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let ellipsis = if cut < text.len() { "…" } else { "" };
        format!("{status}: {}{ellipsis}", &text[..cut])
    });
    ApiError::Http {
        status: response.status,
        message,
    }
}

/// The trimmed `message` of a PVE error body: the text the node also sends as the reason phrase
/// (F1), so a log line may carry it where it carries no body.
fn pve_message(body: &Value) -> Option<String> {
    body.get("message")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|message| !message.is_empty())
        .map(String::from)
}

/// Unwrap the `{"data": …}` envelope of a 2xx response, or turn the response into an error.
pub fn data<T: DeserializeOwned>(response: &Response) -> Result<T, ApiError> {
    if !(200..300).contains(&response.status) {
        return Err(http_error(response));
    }
    #[derive(Deserialize)]
    struct Envelope<T> {
        data: T,
    }
    serde_json::from_slice::<Envelope<T>>(&response.body)
        .map(|envelope| envelope.data)
        .map_err(|error| ApiError::Decode(error.to_string()))
}

/// Percent-encode one path segment or form value: everything but RFC 3986 unreserved characters
/// becomes `%XX`, so a volume ID's `/` travels as `%2F` (Phase 4 record of every seed delete).
pub fn escape(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// `application/x-www-form-urlencoded` body of `pairs`, in order.
pub fn form(pairs: &[(&str, String)]) -> Vec<u8> {
    pairs
        .iter()
        .map(|(key, value)| format!("{}={}", escape(key), escape(value)))
        .collect::<Vec<_>>()
        .join("&")
        .into_bytes()
}

/// The boundary of the upload's multipart body. The seed is an ISO image, which never contains
/// this line (it is checked anyway in [`multipart_iso_upload`]).
const BOUNDARY: &str = "egress-operator-seed-5c0d1e9a7b3f";

/// The multipart body of an ISO upload (F12): the `content=iso` field first, then the file part
/// named `filename` carrying the target file name, with its own `Content-Type`. Returns the
/// content type (with boundary) and the body, whose length is the exact `Content-Length`.
pub fn multipart_iso_upload(file_name: &str, bytes: &[u8]) -> Result<(String, Vec<u8>), ApiError> {
    if bytes
        .windows(BOUNDARY.len())
        .any(|window| window == BOUNDARY.as_bytes())
    {
        return Err(ApiError::Decode(
            "the seed image contains the multipart boundary".into(),
        ));
    }
    if file_name.contains(['"', '\r', '\n']) {
        return Err(ApiError::Decode(format!(
            "file name {file_name:?} cannot go in a header"
        )));
    }
    let mut body = Vec::with_capacity(bytes.len() + 512);
    body.extend_from_slice(
        format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"content\"\r\n\r\niso\r\n\
             --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"filename\"; filename=\"{file_name}\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(bytes);
    body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    Ok((format!("multipart/form-data; boundary={BOUNDARY}"), body))
}

/// One entry of `GET /cluster/resources?type=vm` (F8). Most fields are optional: mid-clone the
/// entry has no name, `status: unknown` and `lock: clone`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Resource {
    pub vmid: u32,
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub node: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub lock: Option<String>,
    #[serde(default)]
    pub tags: Option<String>,
    #[serde(default, deserialize_with = "flag")]
    pub template: bool,
}

impl Resource {
    /// Whether this is a QEMU VM (the `type=vm` listing also returns containers).
    pub fn is_qemu(&self) -> bool {
        self.kind == "qemu"
    }

    /// Whether the tag list (`;`-separated, F9) holds `tag`.
    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags.as_deref().is_some_and(|tags| {
            tags.split([';', ',', ' '])
                .any(|t| t.eq_ignore_ascii_case(tag))
        })
    }
}

/// A VM's configuration: every key with its value as text (numbers come back as JSON numbers).
pub type VmConfig = BTreeMap<String, String>;

/// `GET …/status/current`, the fields the provider reads (F14).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct VmStatus {
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub qmpstatus: Option<String>,
    #[serde(default)]
    pub lock: Option<String>,
}

/// `GET /nodes/{node}/tasks/{upid}/status` (F16).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct TaskStatus {
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub exitstatus: Option<String>,
}

/// One interface of `agent/network-get-interfaces` (F21).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct AgentInterface {
    #[serde(default)]
    pub name: String,
    #[serde(rename = "ip-addresses", default)]
    pub ip_addresses: Vec<AgentAddress>,
}

/// One address of an agent interface.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct AgentAddress {
    #[serde(rename = "ip-address", default)]
    pub ip_address: String,
    #[serde(rename = "ip-address-type", default)]
    pub ip_address_type: String,
}

#[derive(Deserialize)]
struct AgentResult {
    #[serde(default)]
    result: Vec<AgentInterface>,
}

/// `0`/`1` or `false`/`true`, absent as false.
fn flag<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    Ok(match Value::deserialize(deserializer)? {
        Value::Bool(value) => value,
        Value::Number(number) => number.as_u64() == Some(1),
        Value::String(text) => text == "1",
        _ => false,
    })
}

/// A config value as the provider reads it: a string as it is, a number or a flag written out,
/// nothing for a list, an object or `null`. Decoded straight from the answer's text, without the
/// `Value` tree a config of a hundred keys would otherwise be parsed into first.
struct ConfigText(Option<String>);

impl<'de> Deserialize<'de> for ConfigText {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;
        impl<'de> serde::de::Visitor<'de> for Text {
            type Value = ConfigText;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a config value")
            }
            fn visit_str<E>(self, text: &str) -> Result<ConfigText, E> {
                Ok(ConfigText(Some(text.to_owned())))
            }
            fn visit_string<E>(self, text: String) -> Result<ConfigText, E> {
                Ok(ConfigText(Some(text)))
            }
            fn visit_u64<E>(self, number: u64) -> Result<ConfigText, E> {
                Ok(ConfigText(Some(number.to_string())))
            }
            fn visit_i64<E>(self, number: i64) -> Result<ConfigText, E> {
                Ok(ConfigText(Some(number.to_string())))
            }
            fn visit_f64<E>(self, number: f64) -> Result<ConfigText, E> {
                // Written as serde_json writes it (`1.0`, not `1`).
                Ok(ConfigText(
                    serde_json::Number::from_f64(number).map(|number| number.to_string()),
                ))
            }
            fn visit_bool<E>(self, flag: bool) -> Result<ConfigText, E> {
                Ok(ConfigText(Some(u8::from(flag).to_string())))
            }
            fn visit_unit<E>(self) -> Result<ConfigText, E> {
                Ok(ConfigText(None))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<ConfigText, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(ConfigText(None))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ConfigText, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(ConfigText(None))
            }
        }
        deserializer.deserialize_any(Text)
    }
}

/// A decoded config object, every scalar as text.
fn config_from_texts(texts: BTreeMap<String, ConfigText>) -> VmConfig {
    texts
        .into_iter()
        .filter_map(|(key, ConfigText(text))| Some((key, text?)))
        .collect()
}

/// The UPID of an asynchronous call, or `None` when the call finished synchronously (`null`).
/// Older PVE answered resize with `null` (notes A1), so both are accepted.
fn optional_upid(response: &Response) -> Result<Option<String>, ApiError> {
    data::<Option<String>>(response)
}

/// The client: the configuration plus the [`Io`] it sends through. It counts requests, which
/// crash-consistency tests and logs use, and keeps the VM names it has seen, so each request's log
/// line names the VM it concerns (P4).
pub struct Pve<'a, I: Io> {
    pub io: &'a mut I,
    pub config: &'a Config,
    pub requests: u32,
    names: BTreeMap<u32, String>,
}

/// The node and VMID a request path names: `/nodes/{node}/…` and `/nodes/{node}/qemu/{vmid}/…`.
fn subject_of(path: &str) -> (Option<&str>, Option<u32>) {
    let mut segments = path.split(['/', '?']).skip(1);
    if segments.next() != Some("nodes") {
        return (None, None);
    }
    let node = segments.next();
    let vmid = match segments.next() {
        Some("qemu") => segments.next().and_then(|vmid| vmid.parse().ok()),
        _ => None,
    };
    (node, vmid)
}

impl<'a, I: Io> Pve<'a, I> {
    /// A client for `config` over `io`.
    pub fn new(io: &'a mut I, config: &'a Config) -> Self {
        Pve {
            io,
            config,
            requests: 0,
            names: BTreeMap::new(),
        }
    }

    /// Remember that VM `vmid` is called `name`, for the log lines of later requests.
    fn saw_name(&mut self, vmid: u32, name: Option<&str>) {
        if let Some(name) = name.filter(|name| !name.is_empty()) {
            self.names.insert(vmid, name.to_string());
        }
    }

    /// Send one request and log it at debug (P4: the predecessor logged every API call with its
    /// identifiers, and a seven-minute VLAN stall could only be read from such lines): method,
    /// path, node, the VM and its name when known, `extra` identifiers, then the HTTP status and
    /// Proxmox's error text (F1: also the reason phrase), or the transport failure, and the time
    /// taken. Never a body: the seed, the mark and form values stay out.
    fn call(
        &mut self,
        method: Method,
        path: String,
        body: Option<(String, Vec<u8>)>,
        extra: &[(&str, String)],
    ) -> Result<Response, ApiError> {
        let (content_type, body) = match body {
            Some((content_type, body)) => (Some(content_type), body),
            None => (None, Vec::new()),
        };
        let request = Request {
            method,
            path: format!("{API_PREFIX}{path}"),
            content_type,
            body,
        };
        self.requests += 1;
        let started = self.io.monotonic_ms();
        let sent = self.io.send(&request);
        let ms = self.io.monotonic_ms().saturating_sub(started).to_string();

        let (node, vmid) = subject_of(&path);
        let vmid_text = vmid.map(|vmid| vmid.to_string());
        let mut fields: Vec<(&str, &str)> = vec![("method", method_name(method)), ("path", &path)];
        fields.extend(node.map(|node| ("node", node)));
        fields.extend(vmid_text.as_deref().map(|vmid| ("vmid", vmid)));
        fields.extend(
            vmid.and_then(|vmid| self.names.get(&vmid))
                .map(|name| ("name", name.as_str())),
        );
        fields.extend(extra.iter().map(|(key, value)| (*key, value.as_str())));
        let status;
        let reason;
        let result = match sent {
            Ok(response) => {
                status = response.status.to_string();
                fields.push(("status", &status));
                if (200..300).contains(&response.status) {
                    reason = None;
                    Ok(response)
                } else {
                    reason = serde_json::from_slice::<Value>(&response.body)
                        .ok()
                        .as_ref()
                        .and_then(pve_message);
                    Err(http_error(&response))
                }
            }
            Err(transport) => {
                reason = Some(format!("no response: {}", transport.detail));
                Err(ApiError::Transport(transport))
            }
        };
        fields.extend(reason.as_deref().map(|reason| ("error", reason)));
        fields.push(("ms", &ms));
        self.io.log(LogLevel::Debug, "proxmox api call", &fields);
        result
    }

    fn get<T: DeserializeOwned>(&mut self, path: String) -> Result<T, ApiError> {
        let response = self.call(Method::Get, path, None, &[])?;
        data(&response)
    }

    fn send_form(
        &mut self,
        method: Method,
        path: String,
        pairs: &[(&str, String)],
    ) -> Result<Response, ApiError> {
        let body = Some(("application/x-www-form-urlencoded".to_string(), form(pairs)));
        self.call(method, path, body, &[])
    }

    fn vm_path(node: &str, vmid: u32) -> String {
        format!("/nodes/{}/qemu/{vmid}", escape(node))
    }

    /// `GET /version`.
    pub fn version(&mut self) -> Result<Value, ApiError> {
        self.get("/version".into())
    }

    /// `GET /nodes`: the node names.
    pub fn nodes(&mut self) -> Result<Vec<String>, ApiError> {
        #[derive(Deserialize)]
        struct Node {
            node: String,
        }
        Ok(self
            .get::<Vec<Node>>("/nodes".into())?
            .into_iter()
            .map(|n| n.node)
            .collect())
    }

    /// `GET /cluster/resources?type=vm` (F8).
    pub fn resources(&mut self) -> Result<Vec<Resource>, ApiError> {
        let entries: Vec<Resource> = self.get("/cluster/resources?type=vm".into())?;
        for entry in &entries {
            self.saw_name(entry.vmid, entry.name.as_deref());
        }
        Ok(entries)
    }

    /// `GET …/config`.
    pub fn vm_config(&mut self, node: &str, vmid: u32) -> Result<VmConfig, ApiError> {
        let texts = self.get(format!("{}/config", Self::vm_path(node, vmid)))?;
        let config = config_from_texts(texts);
        self.saw_name(vmid, config.get("name").map(String::as_str));
        Ok(config)
    }

    /// `GET …/status/current`.
    pub fn vm_status(&mut self, node: &str, vmid: u32) -> Result<VmStatus, ApiError> {
        let status: VmStatus = self.get(format!("{}/status/current", Self::vm_path(node, vmid)))?;
        self.saw_name(vmid, status.name.as_deref());
        Ok(status)
    }

    /// `GET …/agent/network-get-interfaces` (F5, F21).
    pub fn agent_interfaces(
        &mut self,
        node: &str,
        vmid: u32,
    ) -> Result<Vec<AgentInterface>, ApiError> {
        let result: AgentResult = self.get(format!(
            "{}/agent/network-get-interfaces",
            Self::vm_path(node, vmid)
        ))?;
        Ok(result.result)
    }

    /// `POST …/clone` (F10, F11): a full clone with name and description (the ownership mark).
    pub fn clone_vm(
        &mut self,
        node: &str,
        template: u32,
        params: &[(&str, String)],
    ) -> Result<String, ApiError> {
        let param = |key: &str| {
            params
                .iter()
                .find(|(name, _)| *name == key)
                .map(|(_, value)| value.clone())
        };
        let (newid, newname) = (param("newid"), param("name"));
        if let Some(vmid) = newid.as_deref().and_then(|vmid| vmid.parse().ok()) {
            self.saw_name(vmid, newname.as_deref());
        }
        // The path names the template; the line also names the VM the clone makes.
        let extra: Vec<(&str, String)> = [("newid", newid), ("newname", newname)]
            .into_iter()
            .filter_map(|(key, value)| Some((key, value?)))
            .collect();
        let body = (
            "application/x-www-form-urlencoded".to_string(),
            form(params),
        );
        let response = self.call(
            Method::Post,
            format!("{}/clone", Self::vm_path(node, template)),
            Some(body),
            &extra,
        )?;
        data(&response)
    }

    /// `POST …/config`; `Some(upid)` when the write runs as a task.
    pub fn set_config(
        &mut self,
        node: &str,
        vmid: u32,
        params: &[(&str, String)],
    ) -> Result<Option<String>, ApiError> {
        let response = self.send_form(
            Method::Post,
            format!("{}/config", Self::vm_path(node, vmid)),
            params,
        )?;
        optional_upid(&response)
    }

    /// `PUT …/resize` (F20: a task on PVE 8 and later).
    pub fn resize(
        &mut self,
        node: &str,
        vmid: u32,
        disk: &str,
        size: String,
    ) -> Result<Option<String>, ApiError> {
        let params = [("disk", disk.to_string()), ("size", size)];
        let response = self.send_form(
            Method::Put,
            format!("{}/resize", Self::vm_path(node, vmid)),
            &params,
        )?;
        optional_upid(&response)
    }

    /// `POST …/status/start` or `…/status/stop`.
    pub fn vm_power(&mut self, node: &str, vmid: u32, action: &str) -> Result<String, ApiError> {
        let response = self.send_form(
            Method::Post,
            format!("{}/status/{action}", Self::vm_path(node, vmid)),
            &[],
        )?;
        data(&response)
    }

    /// `DELETE /nodes/{node}/qemu/{vmid}?purge=1&destroy-unreferenced-disks=1`.
    pub fn destroy(&mut self, node: &str, vmid: u32) -> Result<String, ApiError> {
        let path = format!(
            "{}?purge=1&destroy-unreferenced-disks=1",
            Self::vm_path(node, vmid)
        );
        let response = self.call(Method::Delete, path, None, &[])?;
        data(&response)
    }

    /// `POST /nodes/{node}/storage/{storage}/upload` (F12): multipart, overwriting any file of that
    /// name.
    pub fn upload_iso(
        &mut self,
        node: &str,
        storage: &str,
        file_name: &str,
        bytes: &[u8],
    ) -> Result<String, ApiError> {
        let body = multipart_iso_upload(file_name, bytes)?;
        let path = format!("/nodes/{}/storage/{}/upload", escape(node), escape(storage));
        let response = self.call(
            Method::Post,
            path,
            Some(body),
            &[("file", file_name.to_string())],
        )?;
        data(&response)
    }

    /// `DELETE /nodes/{node}/storage/{storage}/content/{volid}` (F13); the volume ID's `/` is `%2F`.
    pub fn delete_volume(
        &mut self,
        node: &str,
        storage: &str,
        volid: &str,
    ) -> Result<Option<String>, ApiError> {
        let path = format!(
            "/nodes/{}/storage/{}/content/{}",
            escape(node),
            escape(storage),
            escape(volid)
        );
        let response = self.call(Method::Delete, path, None, &[("volid", volid.to_string())])?;
        optional_upid(&response)
    }

    /// `GET /nodes/{node}/storage/{storage}/status`.
    pub fn storage_status(&mut self, node: &str, storage: &str) -> Result<Value, ApiError> {
        self.get(format!(
            "/nodes/{}/storage/{}/status",
            escape(node),
            escape(storage)
        ))
    }

    /// `GET /access/permissions?path=…`: the token's privileges at `path`.
    pub fn permissions(
        &mut self,
        path: &str,
    ) -> Result<BTreeMap<String, BTreeMap<String, Value>>, ApiError> {
        self.get(format!("/access/permissions?path={}", escape(path)))
    }

    /// `GET /nodes/{node}/tasks/{upid}/status` (F16).
    pub fn task_status(&mut self, node: &str, upid: &str) -> Result<TaskStatus, ApiError> {
        self.get(format!(
            "/nodes/{}/tasks/{}/status",
            escape(node),
            escape(upid)
        ))
    }
}

fn method_name(method: Method) -> &'static str {
    match method {
        Method::Get => "GET",
        Method::Post => "POST",
        Method::Put => "PUT",
        Method::Delete => "DELETE",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, body: &str) -> Response {
        Response {
            status,
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn f1_error_message_is_the_trimmed_body_message() {
        let error = http_error(&response(
            500,
            "{\"data\":null,\"message\":\"Configuration file 'nodes/pv1-1/qemu-server/999999.conf' does not exist\\n\"}",
        ));
        assert_eq!(
            error,
            ApiError::Http {
                status: 500,
                message: "Configuration file 'nodes/pv1-1/qemu-server/999999.conf' does not exist"
                    .into()
            }
        );
    }

    #[test]
    fn f1_f22_empty_401_body_falls_back_to_the_status() {
        for body in ["", "{\"data\":null}", "{\"message\":\"  \\n\"}", " \n "] {
            assert_eq!(
                http_error(&response(401, body)),
                ApiError::Http {
                    status: 401,
                    message: "HTTP status 401".into()
                },
                "{body:?}"
            );
        }
    }

    #[test]
    fn a_body_that_is_not_pve_shaped_is_kept_in_the_message() {
        let html = "<html>\n<body>502 Bad Gateway</body>\n</html>\n";
        assert_eq!(
            http_error(&response(502, html)),
            ApiError::Http {
                status: 502,
                message: "HTTP status 502: <html> <body>502 Bad Gateway</body> </html>".into()
            }
        );
        let ApiError::Http { message, .. } = http_error(&response(500, &"é".repeat(400))) else {
            panic!("an HTTP error")
        };
        assert!(message.starts_with("HTTP status 500: éé"), "{message}");
        assert!(message.ends_with('…') && message.len() < 340, "{message}");
    }

    #[test]
    fn envelope_is_unwrapped_and_errors_pass_through() {
        assert_eq!(
            data::<String>(&response(200, "{\"data\":\"UPID:x\"}")).unwrap(),
            "UPID:x"
        );
        assert!(matches!(
            data::<String>(&response(200, "{\"dat\":1}")),
            Err(ApiError::Decode(_))
        ));
        assert!(matches!(
            data::<String>(&response(403, "{\"message\":\"no\"}")),
            Err(ApiError::Http { status: 403, .. })
        ));
        assert_eq!(
            optional_upid(&response(200, "{\"data\":null}")).unwrap(),
            None
        );
    }

    #[test]
    fn volid_slash_is_escaped_as_2f() {
        assert_eq!(
            escape("proxy-seeds:iso/proxy-a-seed.iso"),
            "proxy-seeds%3Aiso%2Fproxy-a-seed.iso"
        );
        assert_eq!(escape("a b&c=d"), "a%20b%26c%3Dd");
    }

    #[test]
    fn form_bodies_are_urlencoded_in_order() {
        let body = form(&[
            ("ide2", "proxy-seeds:iso/x-seed.iso,media=cdrom".into()),
            ("agent", "1".into()),
        ]);
        assert_eq!(
            String::from_utf8(body).unwrap(),
            "ide2=proxy-seeds%3Aiso%2Fx-seed.iso%2Cmedia%3Dcdrom&agent=1"
        );
    }

    #[test]
    fn f12_upload_is_content_iso_then_the_filename_file_part() {
        let (content_type, body) = multipart_iso_upload("proxy-a-seed.iso", b"ISO-BYTES").unwrap();
        let boundary = content_type
            .strip_prefix("multipart/form-data; boundary=")
            .unwrap();
        let text = String::from_utf8(body.clone()).unwrap();
        let content_at = text
            .find("name=\"content\"\r\n\r\niso\r\n")
            .expect("content field");
        let file_at = text
            .find("name=\"filename\"; filename=\"proxy-a-seed.iso\"\r\nContent-Type: application/octet-stream\r\n\r\nISO-BYTES\r\n")
            .expect("file part with its content type");
        assert!(
            content_at < file_at,
            "content=iso must come before the file part"
        );
        assert!(text.starts_with(&format!("--{boundary}\r\n")));
        assert!(text.ends_with(&format!("\r\n--{boundary}--\r\n")));
    }

    #[test]
    fn upload_refuses_a_payload_holding_the_boundary_or_a_bad_name() {
        assert!(multipart_iso_upload("a.iso", BOUNDARY.as_bytes()).is_err());
        assert!(multipart_iso_upload("a\".iso", b"x").is_err());
    }

    #[test]
    fn f8_resources_decode_mid_clone_entries_and_flags() {
        let entries: Vec<Resource> = serde_json::from_str(
            r#"[{"type":"qemu","vmid":199999,"id":"qemu/199999","node":"pv1-1","lock":"clone","status":"unknown"},
                {"type":"qemu","vmid":9001,"node":"pv1-1","name":"debian-13-template","status":"stopped","template":1,"tags":"a;proxy_operator"},
                {"type":"lxc","vmid":200,"node":"pv1-1","name":"ct","status":"running"}]"#,
        )
        .unwrap();
        assert_eq!(entries[0].name, None);
        assert_eq!(entries[0].lock.as_deref(), Some("clone"));
        assert!(
            entries[1].template
                && entries[1].has_tag("proxy_operator")
                && !entries[1].has_tag("proxy")
        );
        assert!(entries[0].is_qemu() && !entries[2].is_qemu());
    }

    #[test]
    fn config_scalars_become_text_and_the_rest_is_left_out() {
        let texts = serde_json::from_str(
            r#"{"cores": 2, "name": "x", "template": 1, "balloon": -1, "ratio": 1.0, "acpi": true,
                "digest": "ab", "x": null, "list": [1, {"a": 2}], "nested": {"b": [3]}}"#,
        )
        .unwrap();
        let config = config_from_texts(texts);
        let text = |key: &str| config.get(key).map(String::as_str);
        assert_eq!(text("cores"), Some("2"));
        assert_eq!(text("template"), Some("1"));
        assert_eq!(text("balloon"), Some("-1"));
        assert_eq!(text("ratio"), Some("1.0"));
        assert_eq!(text("acpi"), Some("1"));
        assert_eq!(text("name"), Some("x"));
        assert_eq!(config.len(), 7, "{config:?}");
        assert!(serde_json::from_str::<BTreeMap<String, ConfigText>>("[1]").is_err());
    }
}
