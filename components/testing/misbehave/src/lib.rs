//! # misbehave: a provider that breaks the rules on purpose (TEST ONLY)
//!
//! The host's tests use it to prove that a bad provider cannot hurt the operator: fuel or epoch
//! limits stop `spin`, memory limits stop `grow`, traps and panics become errors, and `sleep`
//! keeps a call in flight (for hot-swap and cancellation tests).
//!
//! Configuration: `{"mode": "<mode>"}` plus `"ms": <milliseconds>` for `sleep`. Every operation
//! except `describe` and `validate-config` does the mode:
//!
//! | mode    | what the operation does                                                   |
//! |---------|---------------------------------------------------------------------------|
//! | `ok`    | answers normally: a running `misbehave/<name>` instance, `[]`, check ok   |
//! | `spin`  | loops on the CPU forever, calling no import                               |
//! | `grow`  | allocates and touches memory without bound                                |
//! | `trap`  | executes `unreachable`                                                    |
//! | `panic` | panics with "misbehave: deliberate panic" (wasm has no unwinding: a trap) |
//! | `sleep` | waits `ms` milliseconds on the monotonic clock, then answers like `ok`    |
//!
//! A configuration that does not parse answers `permanent` (check: `misconfigured`).

use std::hint::black_box;

use serde_json::Value;

wit_bindgen::generate!({
    path: "../../../wit/provider-v0.1.0",
    world: "provider-world",
    generate_all,
});

use egress::provider::types::{
    CheckReason, CheckResult, CreateRequest, Description, Error, Instance, InstanceState,
};
use exports::egress::provider::provider::Guest;
use wasi::clocks::monotonic_clock;

/// What the configuration asks every operation to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Ok,
    Spin,
    Grow,
    Trap,
    Panic,
    Sleep { ms: u64 },
}

impl Mode {
    fn parse(config: &str) -> Result<Mode, String> {
        let invalid = |why: &str| format!("invalid misbehave configuration: {why}");
        let value: Value = serde_json::from_str(config).map_err(|_| invalid("not JSON"))?;
        let mode = value
            .get("mode")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("`mode` must be one of ok, spin, grow, trap, panic, sleep"))?;
        Ok(match mode {
            "ok" => Mode::Ok,
            "spin" => Mode::Spin,
            "grow" => Mode::Grow,
            "trap" => Mode::Trap,
            "panic" => Mode::Panic,
            "sleep" => Mode::Sleep {
                ms: value
                    .get("ms")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| invalid("mode `sleep` needs `ms`, a whole number"))?,
            },
            _ => {
                return Err(invalid(
                    "`mode` must be one of ok, spin, grow, trap, panic, sleep",
                ));
            }
        })
    }

    /// Misbehave as asked; returns only for `ok` and `sleep`.
    fn act(self) {
        match self {
            Mode::Ok => {}
            Mode::Spin => spin(),
            Mode::Grow => grow(),
            Mode::Trap => trap(),
            Mode::Panic => panic!("misbehave: deliberate panic"),
            Mode::Sleep { ms } => {
                monotonic_clock::subscribe_duration(ms.saturating_mul(1_000_000)).block();
            }
        }
    }
}

/// Burn CPU forever without calling any import, so only fuel or epoch interruption can stop it.
fn spin() -> ! {
    let mut counter = 0u64;
    loop {
        counter = black_box(counter.wrapping_add(1));
    }
}

/// Allocate 1 MiB chunks forever, writing to every page so the memory is really used.
fn grow() -> ! {
    const CHUNK: usize = 1 << 20;
    const PAGE: usize = 4096;
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut chunk = vec![0u8; CHUNK];
        for offset in (0..CHUNK).step_by(PAGE) {
            chunk[offset] = 1;
        }
        chunks.push(black_box(chunk));
    }
}

/// A wasm `unreachable` instruction: the purest trap there is.
fn trap() -> ! {
    #[cfg(target_arch = "wasm32")]
    core::arch::wasm32::unreachable();
    // Only so the crate builds for the host too; the component is always wasm32.
    #[cfg(not(target_arch = "wasm32"))]
    std::process::abort();
}

/// Parse the configuration and misbehave; a bad configuration is a permanent error.
fn misbehave(config: &str) -> Result<(), Error> {
    Mode::parse(config).map_err(Error::Permanent)?.act();
    Ok(())
}

fn running(name: &str, uid: &str) -> Instance {
    Instance {
        provider_id: format!("misbehave/{name}"),
        name: name.to_string(),
        state: InstanceState::Running,
        addresses: vec!["198.51.100.1".to_string()],
        created_at: None,
        uid: uid.to_string(),
    }
}

struct Misbehave;

impl Guest for Misbehave {
    fn describe() -> Description {
        Description {
            name: "misbehave".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            contract_version: "0.1.0".to_string(),
            config_schema: include_str!("config.schema.json").to_string(),
            capabilities: Vec::new(),
        }
    }

    fn validate_config(config: String) -> Result<(), Error> {
        Mode::parse(&config).map(|_| ()).map_err(Error::Permanent)
    }

    fn create(request: CreateRequest) -> Result<Instance, Error> {
        misbehave(&request.config)?;
        Ok(running(&request.name, &request.uid))
    }

    fn get(config: String, provider_id: String) -> Result<Instance, Error> {
        misbehave(&config)?;
        let name = provider_id
            .strip_prefix("misbehave/")
            .unwrap_or(&provider_id);
        Ok(running(name, ""))
    }

    fn delete(config: String, _provider_id: String) -> Result<(), Error> {
        misbehave(&config)
    }

    fn list_by_tag(config: String, _key: String, _value: String) -> Result<Vec<Instance>, Error> {
        misbehave(&config)?;
        Ok(Vec::new())
    }

    fn check(config: String) -> CheckResult {
        match Mode::parse(&config) {
            Ok(mode) => {
                mode.act();
                CheckResult {
                    reason: CheckReason::Ok,
                    message: "behaving".to_string(),
                }
            }
            Err(message) => CheckResult {
                reason: CheckReason::Misconfigured,
                message,
            },
        }
    }
}

// Only the component exports these functions. A host build (for unit tests) leaves them out:
// export names like `egress:provider/provider@0.1.0#create` are not valid native symbols.
#[cfg(target_arch = "wasm32")]
export!(Misbehave);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_mode() {
        let cases = [
            (r#"{"mode":"ok"}"#, Mode::Ok),
            (r#"{"mode":"spin"}"#, Mode::Spin),
            (r#"{"mode":"grow"}"#, Mode::Grow),
            (r#"{"mode":"trap"}"#, Mode::Trap),
            (r#"{"mode":"panic"}"#, Mode::Panic),
            (r#"{"mode":"sleep","ms":250}"#, Mode::Sleep { ms: 250 }),
        ];
        for (config, mode) in cases {
            assert_eq!(Mode::parse(config), Ok(mode), "{config}");
        }
    }

    #[test]
    fn rejects_unknown_or_incomplete_modes() {
        for config in [
            "{}",
            r#"{"mode":"explode"}"#,
            r#"{"mode":"sleep"}"#,
            r#"{"mode":"sleep","ms":-1}"#,
            "x",
        ] {
            let error = Mode::parse(config).expect_err(config);
            assert!(
                error.starts_with("invalid misbehave configuration"),
                "{error}"
            );
        }
    }
}
