//! # hostile: a provider that attacks the host (TEST ONLY)
//!
//! The host's tests load it to prove the sandbox holds against a third party that means harm. It
//! **describes itself as `reference`**, another provider's name, to try to borrow that
//! provider's grant. Every operation but `describe` and `validate-config` runs the attack its
//! configuration names:
//!
//! | `attack` | what it does | answers |
//! |---|---|---|
//! | `reflect` | sends `method` (default GET) to `endpoint` + `path`, asking for `acceptEncoding` and `range` if given; decompresses a gzip or deflate answer | `permanent("HTTP <status> <content-encoding>: <body>")`, or `transient("transport: <code>")` |
//! | `headers` | builds `count` header lists of one `bytes`-long header each and keeps them all | `permanent("held <count>")`, or where it was refused |
//! | `requests` | sends `count` requests to `endpoint` without reading any answer, keeps them in flight, then waits for the first; each with an empty body resource, or with none if `bodyless` is true (the host sends those two kinds by different paths) | `permanent("sent <n>; refused: <code>")` |
//! | `spin-get` | sends one bodyless GET to `endpoint` and asks for its response with `get` up to `gets` times, never waiting on it | `permanent("answered after <n> gets: <status or code>")`, or `permanent("no answer after <gets> gets")` |
//! | `bodies` | opens `count` request bodies and writes into each until the host says to wait, keeping them all, never sending | `permanent("buffered <bytes> in <n>")` |
//! | `big-error` | answers an error of `mib` MiB | that error |
//! | `big-name` | answers a VM whose name is `mib` MiB | that VM |
//! | `aliases` | list-by-tag: `count` VMs whose names all point at one `mib` MiB string | those VMs |
//! | `log-flood` | logs `lines` lines | ok |
//! | `log-huge` | logs one message of `mib` MiB | ok |
//! | `upload` | POSTs an endless body to `endpoint` as fast as the host takes it | `permanent("uploaded <bytes>; <answer>")` |
//! | `download` | GETs `endpoint` and reads its body to the end or the first error | `permanent("downloaded <bytes>; <ending>")` |
//! | `log-inject` | logs a message, key and value carrying a newline, a forged line and a terminal escape | ok |
//!
//! With `"via": "exchange"`, `reflect` (which then also sends each `headers` pair, and with
//! `showHeaders` answers the response's headers after the body), `upload` (one whole body of
//! `bodyKib` KiB, 512 unless given, after another) and `download` (`times` whole GETs) go through
//! `egress:http-broker/exchange` instead of `wasi:http`; a failed exchange answers
//! `transport: <code>`, with ` (refused: <refusal>)` when the broker refused it.

use std::hint::black_box;

mod exchange;

use serde_json::Value;

wit_bindgen::generate!({
    path: "../../../wit/provider-v0.1.0",
    world: "provider-world",
    generate_all,
});

use egress::provider::log::{self, Field, Level};
use egress::provider::types::{
    Capability, CheckReason, CheckResult, CreateRequest, Description, Error, Instance,
    InstanceState,
};
use exports::egress::provider::provider::Guest;
use wasi::http::outgoing_handler;
use wasi::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};
use wasi::io::streams::StreamError;

/// A configuration value, or a permanent error naming the key.
fn field<'a>(config: &'a Value, key: &str) -> Result<&'a Value, Error> {
    config
        .get(key)
        .ok_or_else(|| Error::Permanent(format!("hostile: `{key}` is missing")))
}

fn number(config: &Value, key: &str) -> Result<u64, Error> {
    field(config, key)?
        .as_u64()
        .ok_or_else(|| Error::Permanent(format!("hostile: `{key}` must be a whole number")))
}

fn text<'a>(config: &'a Value, key: &str) -> Result<&'a str, Error> {
    field(config, key)?
        .as_str()
        .ok_or_else(|| Error::Permanent(format!("hostile: `{key}` must be a string")))
}

fn parse(config: &str) -> Result<Value, Error> {
    serde_json::from_str(config).map_err(|_| Error::Permanent("hostile: config is not JSON".into()))
}

/// A VM with `name`, for answers that must be a VM.
fn vm(name: String) -> Instance {
    Instance {
        provider_id: "hostile/1".into(),
        name,
        state: InstanceState::Running,
        addresses: Vec::new(),
        created_at: None,
        uid: String::new(),
    }
}

/// Run the attack `config` names; `Ok` carries a VM for the attacks that answer one.
fn attack(config: &str) -> Result<Instance, Error> {
    let config = parse(config)?;
    match text(&config, "attack")? {
        "reflect" if via_exchange(&config) => exchange::reflect(&config),
        "reflect" => reflect(&config),
        "headers" => hold_headers(number(&config, "count")?, number(&config, "bytes")?),
        "requests" => flood_requests(
            text(&config, "endpoint")?,
            number(&config, "count")?,
            config.get("bodyless").and_then(Value::as_bool) == Some(true),
        ),
        "upload" if via_exchange(&config) => exchange::upload(
            text(&config, "endpoint")?,
            config.get("bodyKib").and_then(Value::as_u64).unwrap_or(512) as usize,
        ),
        "upload" => upload(text(&config, "endpoint")?),
        "download" if via_exchange(&config) => exchange::download(
            text(&config, "endpoint")?,
            config.get("times").and_then(Value::as_u64).unwrap_or(1),
        ),
        "download" => download(text(&config, "endpoint")?),
        "spin-get" => spin_get(text(&config, "endpoint")?, number(&config, "gets")?),
        "bodies" => fill_bodies(number(&config, "count")?),
        "big-error" => Err(Error::Permanent("e".repeat(mib(&config)?))),
        "big-name" => Ok(vm("n".repeat(mib(&config)?))),
        "log-flood" => {
            for line in 0..number(&config, "lines")? {
                log::emit(Level::Info, &format!("flood line {line}"), &[]);
            }
            Ok(vm("flooded".into()))
        }
        "log-huge" => {
            log::emit(Level::Info, &"h".repeat(mib(&config)?), &[]);
            Ok(vm("logged".into()))
        }
        "log-inject" => {
            log::emit(
                Level::Warn,
                "innocent\n2026-11-30T00:00:00.000000Z  INFO egress_operator: FORGED line from the host",
                &[
                    Field {
                        key: "k\nFORGED=1".into(),
                        value: "\u{1b}[31mred\u{1b}[0m".into(),
                    },
                    Field {
                        key: "plain".into(),
                        value: "\u{1b}]0;retitled\u{7}".into(),
                    },
                ],
            );
            Ok(vm("injected".into()))
        }
        other => Err(Error::Permanent(format!(
            "hostile: unknown attack {other:?}"
        ))),
    }
}

/// Whether the attack goes through `egress:http-broker/exchange` (`"via": "exchange"`) rather
/// than `wasi:http`.
fn via_exchange(config: &Value) -> bool {
    config.get("via").and_then(Value::as_str) == Some("exchange")
}

fn mib(config: &Value) -> Result<usize, Error> {
    Ok(number(config, "mib")? as usize * (1 << 20))
}

/// The scheme and authority of `endpoint` (`https://host:port`).
fn scheme_and_authority(endpoint: &str) -> (Scheme, &str) {
    match endpoint.split_once("://") {
        Some(("http", authority)) => (Scheme::Http, authority),
        Some((_, authority)) => (Scheme::Https, authority),
        None => (Scheme::Https, endpoint),
    }
}

/// A request to `endpoint` (`https://host:port`) with `path`.
fn request(endpoint: &str, path: &str, method: Method, headers: Fields) -> OutgoingRequest {
    let (scheme, authority) = scheme_and_authority(endpoint);
    let outgoing = OutgoingRequest::new(headers);
    let _ = outgoing.set_method(&method);
    let _ = outgoing.set_scheme(Some(&scheme));
    let _ = outgoing.set_authority(Some(authority));
    let _ = outgoing.set_path_with_query(Some(path));
    outgoing
}

/// The configuration's `method` (default `GET`).
fn method(config: &Value) -> Method {
    match config.get("method").and_then(Value::as_str) {
        None | Some("GET") => Method::Get,
        Some("TRACE") => Method::Trace,
        Some(other) => Method::Other(other.to_owned()),
    }
}

/// `reflect`'s answer: a compressed echo inflated in the guest's own memory, as an attacker does.
fn reflected(status: u16, encoding: &str, raw: Vec<u8>) -> Error {
    let plain = match encoding {
        "gzip" => gunzip(&raw).unwrap_or(raw),
        "deflate" => miniz_oxide::inflate::decompress_to_vec_zlib(&raw).unwrap_or(raw),
        _ => raw,
    };
    let body = String::from_utf8_lossy(&plain).into_owned();
    Error::Permanent(format!("HTTP {status} {encoding}: {body}"))
}

fn reflect(config: &Value) -> Result<Instance, Error> {
    let endpoint = text(config, "endpoint")?;
    let path = config.get("path").and_then(Value::as_str).unwrap_or("/");
    let method = method(config);
    let headers = Fields::new();
    if let Some(encoding) = config.get("acceptEncoding").and_then(Value::as_str) {
        headers
            .append("accept-encoding", encoding.as_bytes())
            .map_err(|error| Error::Permanent(format!("accept-encoding refused: {error:?}")))?;
    }
    if let Some(range) = config.get("range").and_then(Value::as_str) {
        headers
            .append("range", range.as_bytes())
            .map_err(|error| Error::Permanent(format!("range refused: {error:?}")))?;
    }
    let outgoing = request(endpoint, path, method, headers);
    let body = outgoing.body().expect("a new request has its body");
    let pending = outgoing_handler::handle(outgoing, None)
        .map_err(|code| Error::Transient(format!("transport: {code:?}")))?;
    OutgoingBody::finish(body, None)
        .map_err(|code| Error::Transient(format!("transport: {code:?}")))?;
    pending.subscribe().block();
    let response = match pending.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(code))) => return Err(Error::Transient(format!("transport: {code:?}"))),
        _ => return Err(Error::Transient("transport: no response".into())),
    };
    let status = response.status();
    let encoding = response
        .headers()
        .get("content-encoding")
        .first()
        .map(|value| String::from_utf8_lossy(value).into_owned())
        .unwrap_or_default();
    let incoming = response.consume().expect("the body is there once");
    let stream = incoming.stream().expect("the stream is there once");
    let mut raw = Vec::new();
    loop {
        match stream.blocking_read(64 * 1024) {
            Ok(chunk) => raw.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(error)) => {
                return Err(Error::Transient(format!(
                    "transport: {}",
                    error.to_debug_string()
                )));
            }
        }
    }
    Err(reflected(status, &encoding, raw))
}

/// The payload of a gzip member (RFC 1952), assuming no optional header fields but a name.
fn gunzip(data: &[u8]) -> Option<Vec<u8>> {
    if data.len() < 18 || data[0] != 0x1f || data[1] != 0x8b || data[2] != 8 {
        return None;
    }
    let flags = data[3];
    let mut at = 10;
    if flags & 0x04 != 0 {
        let extra = usize::from(u16::from_le_bytes([data[at], data[at + 1]]));
        at += 2 + extra;
    }
    for bit in [0x08, 0x10] {
        if flags & bit != 0 {
            at += data[at..].iter().position(|&b| b == 0)? + 1;
        }
    }
    if flags & 0x02 != 0 {
        at += 2;
    }
    miniz_oxide::inflate::decompress_to_vec(data.get(at..data.len() - 8)?).ok()
}

fn hold_headers(count: u64, bytes: u64) -> Result<Instance, Error> {
    let value = vec![b'v'; bytes as usize];
    let mut held = Vec::new();
    for index in 0..count {
        let fields = Fields::new();
        if let Err(error) = fields.append("x-fill", &value) {
            return Err(Error::Permanent(format!(
                "header list {index} refused: {error:?}"
            )));
        }
        held.push(fields);
    }
    black_box(&held);
    Err(Error::Permanent(format!("held {}", held.len())))
}

fn spin_get(endpoint: &str, gets: u64) -> Result<Instance, Error> {
    let outgoing = request(endpoint, "/api2/json/spin", Method::Get, Fields::new());
    let future = outgoing_handler::handle(outgoing, None)
        .map_err(|code| Error::Transient(format!("transport: {code:?}")))?;
    for asked in 1..=gets {
        let answer = match future.get() {
            None => continue,
            Some(Ok(Ok(response))) => format!("HTTP {}", response.status()),
            Some(Ok(Err(code))) => format!("{code:?}"),
            Some(Err(())) => "taken".into(),
        };
        return Err(Error::Permanent(format!(
            "answered after {asked} gets: {answer}"
        )));
    }
    Err(Error::Permanent(format!("no answer after {gets} gets")))
}

fn flood_requests(endpoint: &str, count: u64, bodyless: bool) -> Result<Instance, Error> {
    let mut pending = Vec::new();
    for index in 0..count {
        let outgoing = request(
            endpoint,
            &format!("/api2/json/flood/{index}"),
            Method::Get,
            Fields::new(),
        );
        let body = (!bodyless).then(|| outgoing.body().expect("a new request has its body"));
        match outgoing_handler::handle(outgoing, None) {
            Ok(future) => {
                if let Some(body) = body {
                    let _ = OutgoingBody::finish(body, None);
                }
                pending.push(future);
            }
            Err(code) => {
                return Err(Error::Permanent(format!(
                    "sent {}; refused: {code:?}",
                    pending.len()
                )));
            }
        }
    }
    // Wait on the first request, which is really in flight, so the rest stay open meanwhile.
    if let Some(first) = pending.first() {
        first.subscribe().block();
    }
    // A refusal may come back on the response future rather than from `handle`.
    for future in &pending {
        if let Some(Ok(Err(code))) = future.get() {
            return Err(Error::Permanent(format!(
                "sent {}; refused: {code:?}",
                pending.len()
            )));
        }
    }
    Err(Error::Permanent(format!("sent {}", pending.len())))
}

/// POSTs an endless body to `endpoint`, as fast as the host takes it; answers how much went
/// out before a write failed.
fn upload(endpoint: &str) -> Result<Instance, Error> {
    let outgoing = request(endpoint, "/upload", Method::Post, Fields::new());
    let body = outgoing.body().expect("a new request has its body");
    let future = outgoing_handler::handle(outgoing, None)
        .map_err(|code| Error::Permanent(format!("refused: {code:?}")))?;
    let stream = body.write().expect("the stream is there once");
    let chunk = vec![b'u'; 64 * 1024];
    let mut sent = 0u64;
    loop {
        let allowed = match stream.check_write() {
            Ok(0) => {
                stream.subscribe().block();
                continue;
            }
            Ok(allowed) => allowed,
            Err(_) => break,
        };
        let size = (allowed as usize).min(chunk.len());
        if stream.write(&chunk[..size]).is_err() {
            break;
        }
        sent += size as u64;
    }
    drop(stream);
    let _ = OutgoingBody::finish(body, None);
    future.subscribe().block();
    let answer = match future.get() {
        Some(Ok(Ok(response))) => format!("HTTP {}", response.status()),
        Some(Ok(Err(code))) => format!("{code:?}"),
        _ => "no answer".into(),
    };
    Err(Error::Permanent(format!("uploaded {sent}; {answer}")))
}

/// GETs `endpoint` and reads its body to the end or the first error; answers how much came in.
fn download(endpoint: &str) -> Result<Instance, Error> {
    let outgoing = request(endpoint, "/download", Method::Get, Fields::new());
    let future = outgoing_handler::handle(outgoing, None)
        .map_err(|code| Error::Permanent(format!("refused: {code:?}")))?;
    future.subscribe().block();
    let response = match future.get() {
        Some(Ok(Ok(response))) => response,
        other => return Err(Error::Permanent(format!("no response: {other:?}"))),
    };
    let body = response.consume().expect("the body is there once");
    let stream = body.stream().expect("the stream is there once");
    let mut received = 0u64;
    let ending = loop {
        match stream.blocking_read(1 << 20) {
            Ok(chunk) => received += chunk.len() as u64,
            Err(StreamError::Closed) => break "closed".to_owned(),
            Err(StreamError::LastOperationFailed(error)) => break error.to_debug_string(),
        }
    };
    Err(Error::Permanent(format!("downloaded {received}; {ending}")))
}

fn fill_bodies(count: u64) -> Result<Instance, Error> {
    let chunk = vec![b'b'; 4096];
    let mut held = Vec::new();
    let mut buffered = 0u64;
    for _ in 0..count {
        let outgoing = OutgoingRequest::new(Fields::new());
        let body = outgoing.body().expect("a new request has its body");
        let stream = body.write().expect("the stream is there once");
        // Write until the host stops accepting without blocking: what it buffers for us.
        while let Ok(allowed) = stream.check_write() {
            if allowed == 0 {
                break;
            }
            let size = (allowed as usize).min(chunk.len());
            if stream.write(&chunk[..size]).is_err() {
                break;
            }
            buffered += size as u64;
        }
        // Children before parents when they are dropped: the stream, the body, the request.
        held.push((stream, body, outgoing));
    }
    black_box(&held);
    Err(Error::Permanent(format!(
        "buffered {buffered} in {}",
        held.len()
    )))
}

/// `count` VMs whose names are one `mib` MiB buffer, shared: the lowered list points every
/// name at the same bytes, so the guest spends the memory once and asks the host to copy it
/// `count` times.
fn aliases(count: u64, mib: usize) -> Vec<Instance> {
    let mut shared = std::mem::ManuallyDrop::new(vec![b'a'; mib].into_boxed_slice());
    let (pointer, length) = (shared.as_mut_ptr(), shared.len());
    (0..count)
        .map(|_| {
            // SAFETY: deliberately unsound (every `String` claims the same allocation) — this
            // component exists to hand the host aliased strings. The buffer is never freed by
            // anyone but the canonical ABI's post-return, after the host has lifted the result.
            let name = unsafe { String::from_raw_parts(pointer, length, length) };
            vm(name)
        })
        .collect()
}

struct Hostile;

impl Guest for Hostile {
    fn describe() -> Description {
        Description {
            // Another provider's name: a host that grants by described name is fooled.
            name: "reference".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            contract_version: "0.1.0".to_string(),
            config_schema: r#"{"type":"object","required":["attack"]}"#.to_string(),
            capabilities: vec![Capability::Http],
        }
    }

    fn validate_config(config: String) -> Result<(), Error> {
        parse(&config).map(drop)
    }

    fn create(request: CreateRequest) -> Result<Instance, Error> {
        attack(&request.config)
    }

    fn get(config: String, _provider_id: String) -> Result<Instance, Error> {
        attack(&config)
    }

    fn delete(config: String, _provider_id: String) -> Result<(), Error> {
        attack(&config).map(drop)
    }

    fn list_by_tag(config: String, _key: String, _value: String) -> Result<Vec<Instance>, Error> {
        let parsed = parse(&config)?;
        if text(&parsed, "attack")? == "aliases" {
            return Ok(aliases(number(&parsed, "count")?, mib(&parsed)?));
        }
        attack(&config).map(|vm| vec![vm])
    }

    fn check(config: String) -> CheckResult {
        let message = match attack(&config) {
            Ok(vm) => vm.name,
            Err(Error::Transient(message) | Error::Permanent(message)) => message,
            Err(Error::NotFound(message) | Error::QuotaExceeded(message)) => message,
        };
        CheckResult {
            reason: CheckReason::Other,
            message,
        }
    }
}

// Only the component exports these functions (see misbehave).
#[cfg(target_arch = "wasm32")]
export!(Hostile);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gunzip_reads_what_a_server_compresses() {
        // `printf 'hello hello hello' | gzip -n` (no name, no time).
        let compressed = [
            0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0xcb, 0x48, 0xcd, 0xc9,
            0xc9, 0x57, 0xc8, 0x40, 0x90, 0x00, 0x80, 0x88, 0xf9, 0xe5, 0x11, 0x00, 0x00, 0x00,
        ];
        assert_eq!(gunzip(&compressed).unwrap(), b"hello hello hello");
        assert_eq!(gunzip(b"not gzip at all, clearly"), None);
    }
}
