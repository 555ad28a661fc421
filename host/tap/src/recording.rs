//! The recording format, version [`VERSION`]: one JSON document per provider call. The call
//! (who ran, which operation, its input and output) and, in the order they were sent, its
//! exchanges as the broker answered them. Documented in `docs/recordings.md`.

use std::path::Path;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What every recording says it is.
pub const FORMAT: &str = "egress-recording";
/// The version of the format this build writes and reads.
pub const VERSION: u32 = 1;

/// One provider call and every exchange it made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Recording {
    /// Always [`FORMAT`].
    pub format: String,
    /// The format's version, [`VERSION`].
    pub version: u32,
    /// The provider that made the call.
    pub provider: RecordedProvider,
    /// The operation (`create`, `get`, …).
    pub operation: String,
    /// The call's input, as the runtime's `Request` serialises.
    pub input: Value,
    /// Its output: `{"response": …}` or `{"error": {"class", "message"}}`.
    pub output: Value,
    /// Every request of the call, in the order sent.
    pub exchanges: Vec<Exchange>,
    /// Every time the guest read the wall clock, in order: nanoseconds since the Unix epoch. A
    /// replay gives the guest these same times, so what it writes of them (a `created-at` in a
    /// request body) is what it wrote when recorded.
    #[serde(default)]
    pub clock: Vec<u64>,
}

/// Who made the call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordedProvider {
    /// The host-assigned identity it ran as.
    pub identity: String,
    /// The name it describes itself with.
    pub name: String,
    /// The contract version it implements.
    pub contract: String,
    /// The component's digest, `sha256:<hex>`.
    pub digest: String,
}

/// One request and what came back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Exchange {
    /// The request as the guest sent it (the broker adds the credential after: it is not here).
    pub request: RecordedRequest,
    /// The response as the guest received it, redacted; absent when the request failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<RecordedResponse>,
    /// Why the request failed; absent when a response came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RecordedError>,
    /// When, in milliseconds from the call's start.
    pub timing: Timing,
}

/// A request line, headers and body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordedRequest {
    /// The method.
    pub method: String,
    /// The URL the guest asked for.
    pub uri: String,
    /// The guest's headers, in order, as `[name, value]`.
    pub headers: Vec<[String; 2]>,
    /// The body sent.
    pub body: Body,
}

/// A status, headers and body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordedResponse {
    /// The status code.
    pub status: u16,
    /// The headers, in order, as `[name, value]`.
    pub headers: Vec<[String; 2]>,
    /// The body received.
    pub body: Body,
    /// The error that ended the body early, as a `wasi:http` error code name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_error: Option<String>,
}

/// A request that got no response.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordedError {
    /// The `wasi:http` error code's WIT name (`connection-refused`, `HTTP-request-denied`, …).
    pub code: String,
    /// An `internal-error`'s detail (`credentials-unavailable`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The broker's refusal as a 0.2.0 guest reads it (`denied`, `ca-invalid`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
}

/// Milliseconds from the call's start.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Timing {
    /// When the guest sent the request.
    pub sent_ms: u64,
    /// When the response's head (or the error) came back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_ms: Option<u64>,
    /// When the response's body ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
}

/// A body: UTF-8 text as `text`, anything else as `base64`; `truncated` when the recorder kept
/// only its first bytes ([`Bounds`](crate::Bounds)).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Body {
    /// The body, when it is UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The body, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
    /// Only the first bytes were kept.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

impl Body {
    /// `bytes` as a recorded body.
    pub fn of(bytes: Vec<u8>, truncated: bool) -> Body {
        match String::from_utf8(bytes) {
            Ok(text) if text.is_empty() => Body {
                truncated,
                ..Body::default()
            },
            Ok(text) => Body {
                text: Some(text),
                base64: None,
                truncated,
            },
            Err(bytes) => Body {
                text: None,
                base64: Some(base64::engine::general_purpose::STANDARD.encode(bytes.as_bytes())),
                truncated,
            },
        }
    }

    /// The body's bytes; `None` when its base64 is not base64.
    pub fn bytes(&self) -> Option<Vec<u8>> {
        match (&self.text, &self.base64) {
            (Some(text), None) => Some(text.clone().into_bytes()),
            (None, Some(encoded)) => base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .ok(),
            (None, None) => Some(Vec::new()),
            (Some(_), Some(_)) => None,
        }
    }
}

/// A recording that cannot be read or used, naming the file and, where it is one, the exchange.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordingError {
    /// The file could not be read or written.
    #[error("recording {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// It is not a recording (truncated, not JSON, a field missing or unknown).
    #[error("recording {path} is not a recording: {reason}")]
    Malformed {
        /// The file.
        path: String,
        /// What is wrong, with its line and column.
        reason: String,
    },
    /// Another format or version.
    #[error(
        "recording {path} is {format} version {version}; this build reads {FORMAT} version {VERSION}"
    )]
    Version {
        /// The file.
        path: String,
        /// What it says it is.
        format: String,
        /// Its version.
        version: u32,
    },
    /// One exchange is not usable.
    #[error("recording {path}: exchange {index} ({request}): {reason}")]
    Exchange {
        /// The file.
        path: String,
        /// The exchange's number, from 1.
        index: usize,
        /// Its request line.
        request: String,
        /// What is wrong.
        reason: String,
    },
    /// It was made by another provider or contract version than the one replaying it.
    #[error("recording {path} was made by {recorded}; this is {replaying}")]
    OtherProvider {
        /// The file.
        path: String,
        /// Who made it (name, contract).
        recorded: String,
        /// Who is replaying it.
        replaying: String,
    },
}

impl Recording {
    /// Reads and checks the recording at `path`: its format and version, and that every
    /// exchange can be answered (a status, a known error code, decodable bodies).
    pub fn read(path: &Path) -> Result<Recording, RecordingError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| RecordingError::Io {
            path: shown.clone(),
            source,
        })?;
        Recording::parse(&text, &shown)
    }

    /// [`Recording::read`] of `text`, reported as file `path`.
    pub fn parse(text: &str, path: &str) -> Result<Recording, RecordingError> {
        let value: Value =
            serde_json::from_str(text).map_err(|error| RecordingError::Malformed {
                path: path.to_owned(),
                reason: error.to_string(),
            })?;
        let format = value["format"].as_str().unwrap_or_default().to_owned();
        let version = value["version"].as_u64().unwrap_or_default();
        if format != FORMAT || version != u64::from(VERSION) {
            return Err(RecordingError::Version {
                path: path.to_owned(),
                format,
                version: u32::try_from(version).unwrap_or(u32::MAX),
            });
        }
        let recording: Recording =
            serde_json::from_value(value).map_err(|error| RecordingError::Malformed {
                path: path.to_owned(),
                reason: error.to_string(),
            })?;
        for (index, exchange) in recording.exchanges.iter().enumerate() {
            if let Some(reason) = exchange.problem() {
                return Err(RecordingError::Exchange {
                    path: path.to_owned(),
                    index: index + 1,
                    request: exchange.request.line(),
                    reason,
                });
            }
        }
        Ok(recording)
    }

    /// Writes it to `path`, pretty-printed (a recording is read by people too).
    pub fn write(&self, path: &Path) -> Result<(), RecordingError> {
        let text = serde_json::to_string_pretty(self).expect("a recording serialises");
        std::fs::write(path, text + "\n").map_err(|source| RecordingError::Io {
            path: path.display().to_string(),
            source,
        })
    }
}

impl Exchange {
    /// Why a replay could not give this exchange back, if it could not.
    fn problem(&self) -> Option<String> {
        let bodies = std::iter::once(&self.request.body)
            .chain(self.response.as_ref().map(|response| &response.body));
        if bodies.into_iter().any(|body| body.bytes().is_none()) {
            return Some("a body is neither text nor base64".into());
        }
        match (&self.response, &self.error) {
            (Some(response), None) => {
                if !(100..=599).contains(&response.status) {
                    return Some(format!("status {} is not an HTTP status", response.status));
                }
                let known = response
                    .body_error
                    .as_deref()
                    .is_none_or(|code| crate::codes::parse(code, None).is_some());
                (!known).then(|| "its body error is not a wasi:http error code".into())
            }
            (None, Some(error)) => {
                if crate::codes::parse(&error.code, None).is_none() {
                    return Some(format!("{:?} is not a wasi:http error code", error.code));
                }
                let unknown = error
                    .refusal
                    .as_deref()
                    .is_some_and(|name| egress_runtime::Refusal::named(name).is_none());
                unknown
                    .then(|| format!("refusal {:?} is not one the broker reports", error.refusal))
            }
            _ => Some("it needs exactly one of a response and an error".into()),
        }
    }
}

impl RecordedRequest {
    /// `METHOD uri`.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.uri)
    }
}
