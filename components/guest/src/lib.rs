//! # egress-guest: what every Rust provider shares
//!
//! A provider component talks to its backend over `wasi:http` through the host's egress broker,
//! stamps `created-at` from the wall clock, waits on the monotonic clock and answers errors in the
//! contract's four classes. This crate is that plumbing, once, so a provider's own code is its
//! backend's rules and nothing else.
//!
//! 1. [`Endpoint::parse`] the backend URL from your configuration (`http(s)://host[:port][/base]`,
//!    no user info: the host injects credentials).
//! 2. Build a [`Request`] and [`send`] it: the body is written in pieces the host accepts (at most
//!    what `check-write` permits, never more than 4,096 bytes per `blocking-write-and-flush`), the
//!    response body is read in large reads up to a cap, and an exact `Content-Length` is sent.
//! 3. Or [`call`] it: a non-2xx status or no response comes back as a [`Problem`] of the
//!    contract's error class ([`ErrorClass::of_status`], [`TransportKind::class`]); and [`check`]
//!    answers a health request as a [`Health`] reason. [`contract_types!`] converts both into
//!    your bindings' `error` and `check-result`, so `?` works in every operation.
//! 4. [`time::now_rfc3339`] for `created-at`, [`time::sleep_ms`] to wait without spinning.
//!
//! The crate binds WASI through [`wasip2`] (WASI 0.2.12), independently of the contract bindings a
//! provider generates with `wit_bindgen::generate!`: the component links both sets to the same
//! imports. It never sets `Authorization`.
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
pub mod time;

/// The WASI 0.2 bindings underneath, for what this crate does not wrap.
pub use wasip2;

pub use contract::{Health, Problem, Reason, call, check, config, get_json};
pub use endpoint::{Endpoint, Scheme};
pub use errors::{ErrorClass, TransportError, TransportKind};
pub use http::{
    ErrorCode, Failure, HeaderError, Method, Request, Response, method_name, percent_encode, send,
};
