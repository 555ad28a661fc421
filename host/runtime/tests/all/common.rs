//! Shared helpers: locating test components, building runtimes, editing component bytes.

use std::path::PathBuf;

use egress_runtime::{Limits, Request, Runtime, RuntimeConfig};

pub use testkit::{component as component_path, component_bytes, sha256_hex};

/// A compile cache shared by the tests that do not test the cache: compiling once per test
/// binary run instead of once per test keeps the suite fast.
pub fn shared_cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("egress-runtime-tests-cache")
}

/// Limits with a small instance pool: many test runtimes live at once.
pub fn test_limits() -> Limits {
    Limits::default().max_concurrent_instances(16)
}

/// A runtime with `limits`, the shared cache and no egress.
pub fn runtime_with(limits: Limits) -> Runtime {
    let config = RuntimeConfig::default()
        .limits(limits)
        .cache_dir(Some(shared_cache_dir()));
    Runtime::new(config).expect("runtime builds")
}

/// A runtime with test limits.
pub fn runtime() -> Runtime {
    runtime_with(test_limits())
}

/// `component` with a custom section `name` carrying `payload` appended: the same component,
/// different bytes (and so a different digest).
pub fn with_custom_section(component: &[u8], name: &str, payload: &[u8]) -> Vec<u8> {
    let mut bytes = component.to_vec();
    use wasm_encoder::ComponentSection;
    wasm_encoder::CustomSection {
        name: name.into(),
        data: payload.into(),
    }
    .append_to_component(&mut bytes);
    bytes
}

/// A `get` of the reference provider's `ref/web`.
pub fn get_web() -> Request {
    Request::Get {
        config: "{}".into(),
        provider_id: "ref/web".into(),
    }
}

/// A `get` asking the `misbehave` component to misbehave as `mode` (`spin`, `grow`, `trap`, …).
pub fn misbehave(mode: &str) -> Request {
    Request::Get {
        config: format!(r#"{{"mode": "{mode}"}}"#),
        provider_id: "x".into(),
    }
}

/// A `get` asking the `hostile` component for `attack` (its config).
pub fn hostile_get(attack: serde_json::Value) -> Request {
    Request::Get {
        config: attack.to_string(),
        provider_id: "hostile/1".into(),
    }
}
