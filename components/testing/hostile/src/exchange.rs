//! The attacks again through `egress:http-broker/exchange`, a whole request per call into the
//! host, so the host's tests hold both ways out of the sandbox to the same promises.

use serde_json::Value;

use crate::egress::provider::types::{Error, Instance};
use crate::wasi::http::types::Method;

mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit/http-broker",
        world: "egress:http-broker/imports",
        with: {
            "wasi:http/types@0.2.12": crate::wasi::http::types,
            "wasi:io/error@0.2.12": crate::wasi::io::error,
            "wasi:io/poll@0.2.12": crate::wasi::io::poll,
            "wasi:io/streams@0.2.12": crate::wasi::io::streams,
            "wasi:clocks/monotonic-clock@0.2.12": crate::wasi::clocks::monotonic_clock,
        },
    });
}

use bindings::egress::http_broker::exchange::{self, ExchangeError, Request, Response};

/// A request to `endpoint` (`https://host:port`) with `path`.
fn request(endpoint: &str, path: &str, method: Method) -> Request {
    let (scheme, authority) = crate::scheme_and_authority(endpoint);
    Request {
        method,
        scheme,
        authority: authority.to_owned(),
        path_with_query: path.to_owned(),
        headers: Vec::new(),
        body: Vec::new(),
    }
}

/// The guest's words for a failed exchange, as the `wasi:http` attacks word theirs.
fn failure(error: ExchangeError) -> String {
    match error {
        ExchangeError::Failed(failure) => match failure.refusal {
            Some(refusal) => format!("transport: {:?} (refused: {refusal:?})", failure.code),
            None => format!("transport: {:?}", failure.code),
        },
        ExchangeError::HeaderForbidden(name) => format!("header forbidden: {name}"),
        ExchangeError::HeaderInvalid(name) => format!("header invalid: {name}"),
    }
}

fn send(request: &Request, max_response_bytes: u64) -> Result<Response, Error> {
    exchange::send(request, max_response_bytes).map_err(|error| Error::Transient(failure(error)))
}

/// `reflect`, sent whole: any header the configuration names (`headers`: `[[name, value]]`),
/// besides `acceptEncoding` and `range`; with `showHeaders`, the answer's headers follow the body.
pub fn reflect(config: &Value) -> Result<Instance, Error> {
    let endpoint = crate::text(config, "endpoint")?;
    let path = config.get("path").and_then(Value::as_str).unwrap_or("/");
    let mut outgoing = request(endpoint, path, crate::method(config));
    for (key, name) in [("acceptEncoding", "accept-encoding"), ("range", "range")] {
        if let Some(value) = config.get(key).and_then(Value::as_str) {
            outgoing
                .headers
                .push((name.into(), value.as_bytes().to_vec()));
        }
    }
    for pair in config
        .get("headers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let (Some(name), Some(value)) = (pair[0].as_str(), pair[1].as_str()) {
            outgoing
                .headers
                .push((name.into(), value.as_bytes().to_vec()));
        }
    }
    let mut response = send(&outgoing, 16 << 20)?;
    // With `showHeaders`, the answer's headers follow its body, a line each.
    if config.get("showHeaders").and_then(Value::as_bool) == Some(true) {
        for (name, value) in &response.headers {
            let line = format!("\n{name}: {}", String::from_utf8_lossy(value));
            response.body.extend_from_slice(line.as_bytes());
        }
    }
    let encoding = response
        .headers
        .iter()
        .find(|(name, _)| name == "content-encoding")
        .map(|(_, value)| String::from_utf8_lossy(value).into_owned())
        .unwrap_or_default();
    Err(crate::reflected(response.status, &encoding, response.body))
}

/// POSTs bodies of `body_kib` KiB to `endpoint`, one exchange after another, until one fails;
/// answers how much went out before.
pub fn upload(endpoint: &str, body_kib: usize) -> Result<Instance, Error> {
    let mut outgoing = request(endpoint, "/upload", Method::Post);
    outgoing.body = vec![b'u'; body_kib << 10];
    let mut sent = 0u64;
    loop {
        match exchange::send(&outgoing, 1 << 20) {
            Ok(_) => sent += outgoing.body.len() as u64,
            Err(error) => {
                return Err(Error::Permanent(format!(
                    "uploaded {sent}; {}",
                    failure(error)
                )));
            }
        }
    }
}

/// GETs `endpoint` whole `times` times; answers how much came in before the first failure.
pub fn download(endpoint: &str, times: u64) -> Result<Instance, Error> {
    let outgoing = request(endpoint, "/download", Method::Get);
    let mut received = 0u64;
    for _ in 0..times {
        match exchange::send(&outgoing, 64 << 20) {
            Ok(response) => received += response.body.len() as u64,
            Err(error) => {
                return Err(Error::Permanent(format!(
                    "downloaded {received}; {}",
                    failure(error)
                )));
            }
        }
    }
    Err(Error::Permanent(format!("downloaded {received}; closed")))
}
