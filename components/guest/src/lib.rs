//! # egress-guest: what every Rust provider shares
//!
//! A provider component talks to its backend over `wasi:http` through the host's egress broker,
//! stamps `created-at` from the wall clock, waits on the monotonic clock and answers errors in the
//! contract's four classes. This crate is that plumbing, once, so a provider's own code is its
//! backend's rules and nothing else.
//!
//! 1. [`Endpoint::parse`] the backend URL from your configuration (`http(s)://host[:port][/base]`,
//!    no user info: the host injects credentials).
//! 2. Build a [`Request`] and [`send`] it: a body of at most [`STREAM_ABOVE`] (1 MiB) goes whole
//!    through the broker's exchange call (`egress:http-broker/exchange@0.2.0`, one call into the
//!    host per request); a larger one is streamed through `wasi:http` in pieces the host accepts
//!    (at most what `check-write` permits). The response body is read up to a cap, and an exact
//!    `Content-Length` is sent. The feature `wasi-http-only` sends everything through `wasi:http`,
//!    for a host that predates the exchange call.
//! 3. Or [`call`] it: a non-2xx status or no response comes back as a [`Problem`] of the
//!    contract's error class ([`ErrorClass::of_status`], [`TransportKind::class`]); [`get_json`]
//!    and [`post_json`] call and decode the JSON answer; and [`check`] answers a health request as
//!    a [`Health`] reason. [`contract_types!`] converts both into your bindings' `error` and
//!    `check-result`, so `?` works in every operation.
//! 4. [`time::now_rfc3339`] for `created-at`, [`time::sleep_ms`] to wait without spinning.
//! 5. The contract's ownership rules for a backend with key/value labels: the [`Mark`] as labels,
//!    [`adopt`] for `create`, [`deletable`] and [`unless_gone`] for `delete`, [`numeric_id`] for
//!    provider IDs.
//!
//! The crate binds WASI through [`wasip2`] (WASI 0.2.12) and the exchange call through its own
//! `wit_bindgen::generate!`, independently of the contract bindings a provider generates: the
//! component links every set to the same imports. It never sets `Authorization`.
//!
//! ```no_run
//! use egress_guest::{Endpoint, ErrorClass, Method, Request, send};
//!
//! let endpoint = Endpoint::parse("http://127.0.0.1:8080/api").unwrap();
//! let request = Request::new(Method::Get, &endpoint, "/items/a");
//! match send(&request) {
//!     Ok(response) if response.is_success() => {
//!         let item: serde_json::Value = response.json().unwrap();
//!         println!("{item}");
//!     }
//!     Ok(response) => println!("{:?}", ErrorClass::of_status(response.status)),
//!     Err(failure) => println!("{failure}"),
//! }
//! ```

mod contract;
mod endpoint;
mod errors;
mod http;
mod mark;
pub mod time;

/// The WASI 0.2 bindings underneath, for what this crate does not wrap.
pub use wasip2;

pub use contract::{
    Health, Problem, Reason, UrlConfig, call, check, config, get_json, post_json,
};
pub use endpoint::{Endpoint, Scheme};
pub use errors::{ErrorClass, TransportError, TransportKind};
pub use http::{
    ErrorCode, Failure, HeaderError, Method, Request, Response, STREAM_ABOVE, method_name,
    percent_encode, send,
};
pub use mark::{Mark, adopt, deletable, numeric_id, unless_gone};
