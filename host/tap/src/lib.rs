//! What stands between a provider call and the egress broker: the broker as a provider's test
//! bench. Each is a [`Tap`](egress_runtime::Tap) set on one call's
//! [`CallContext`](egress_runtime::CallContext), so it sees every request the call makes, after
//! the runtime's budgets and before the broker's policy, and every answer after the broker's
//! redaction.
//!
//! - [`Recorder`]: a flight recorder. Every exchange of the call as the broker answered it
//!   (request line, headers, bodies, status, timings, the broker's refusals), with the call's
//!   input and output, as one [`Recording`]. It holds no secret: the guest never had the
//!   credential, which the broker injects after the tap, and answers are recorded after the
//!   broker redacted them. Bounded per body and per call ([`Bounds`]); [`RecordingDir`] keeps a
//!   rotated folder of them.
//! - [`Replay`]: the broker answers from a recording, with no backend at all. Requests are
//!   matched in order (the rule is in [`replay`]); the first that differs ends the replay with a
//!   [`Divergence`] naming it.
//! - [`Faults`]: a 500 or 503, a reset, a response that never comes, a body that stops, a TLS
//!   failure, for a chosen request or every n-th, against any backend.
//!
//! The format is documented in `docs/recordings.md` and versioned ([`VERSION`]).

#![warn(missing_docs)]

mod codes;
mod fault;
mod recorder;
mod recording;
pub mod replay;

pub use fault::{Fault, Faults, Which};
pub use recorder::{Bounds, Recorder, RecordingDir, output_of};
pub use recording::{
    Body, Exchange, FORMAT, RecordedError, RecordedProvider, RecordedRequest, RecordedResponse,
    Recording, RecordingError, Timing, VERSION,
};
pub use replay::{Divergence, Replay};
