//! The broker behind the real runtime, with the real reference component
//! (`target/components/reference.wasm`, built by `just build-components`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use egress_runtime::types::{CheckReason, Response};
use egress_runtime::{CallContext, CallError, Provider, Request, Runtime, RuntimeConfig};
use memchr::memmem;
use wasmtime::{LinearMemory, MemoryCreator, MemoryType};

use crate::support::*;

const SECRET: &str = "pve-token-7d3c9a1e-5b2f-4e8d-a6c4-0f9e8d7c6b5a";
/// The provider's name, as the reference component's `describe` says.
const PROVIDER: &str = "reference";

fn component() -> PathBuf {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../target/components/reference.wasm");
    assert!(
        path.exists(),
        "{} is missing: run `just build-components` first",
        path.display()
    );
    path
}

/// Linear memories that keep a copy of their final contents when the instance drops them, so a
/// test can read every byte a guest ever had in memory (freed heap included).
#[derive(Clone, Default)]
struct SnapshotCreator {
    snapshots: Arc<Mutex<Vec<Vec<u8>>>>,
}

struct SnapshotMemory {
    base: *mut u8,
    /// Reserved and guard bytes, all mapped once; only `0..size` is readable and writable.
    mapped: usize,
    reserved: usize,
    size: usize,
    snapshots: Arc<Mutex<Vec<Vec<u8>>>>,
}

// SAFETY: the mapping is owned by this value alone; wasmtime serialises access to it.
unsafe impl Send for SnapshotMemory {}
// SAFETY: as above; `&self` methods only read plain fields.
unsafe impl Sync for SnapshotMemory {}

fn page_round(bytes: usize) -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    bytes.div_ceil(page) * page
}

// SAFETY: the memory is reserved whole up front (never moves), zero-filled by mmap, and the guard
// region after the reservation stays PROT_NONE as wasmtime requires.
unsafe impl LinearMemory for SnapshotMemory {
    fn byte_size(&self) -> usize {
        self.size
    }

    fn byte_capacity(&self) -> usize {
        self.reserved
    }

    fn grow_to(&mut self, new_size: usize) -> wasmtime::Result<()> {
        if new_size > self.reserved {
            return Err(wasmtime::format_err!(
                "cannot grow to {new_size} bytes past the reservation"
            ));
        }
        // SAFETY: the range lies inside our own mapping.
        let result = unsafe {
            libc::mprotect(
                self.base.cast(),
                page_round(new_size),
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        if result != 0 {
            return Err(wasmtime::format_err!(
                "mprotect: {}",
                std::io::Error::last_os_error()
            ));
        }
        self.size = new_size;
        Ok(())
    }

    fn as_ptr(&self) -> *mut u8 {
        self.base
    }
}

impl Drop for SnapshotMemory {
    fn drop(&mut self) {
        // SAFETY: `0..size` is mapped readable, and the instance using it is gone.
        let contents = unsafe { std::slice::from_raw_parts(self.base, self.size) }.to_vec();
        self.snapshots.lock().unwrap().push(contents);
        // SAFETY: unmapping exactly what `new_memory` mapped.
        unsafe { libc::munmap(self.base.cast(), self.mapped) };
    }
}

// SAFETY: see `LinearMemory for SnapshotMemory`.
unsafe impl MemoryCreator for SnapshotCreator {
    fn new_memory(
        &self,
        _ty: MemoryType,
        minimum: usize,
        maximum: Option<usize>,
        reserved_size_in_bytes: Option<usize>,
        guard_size_in_bytes: usize,
    ) -> Result<Box<dyn LinearMemory>, String> {
        let reserved = page_round(
            reserved_size_in_bytes
                .unwrap_or(maximum.unwrap_or(1 << 32))
                .max(minimum),
        );
        let mapped = reserved + guard_size_in_bytes;
        // SAFETY: a fresh anonymous mapping, inaccessible until `grow_to` opens it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        let mut memory = SnapshotMemory {
            base: base.cast(),
            mapped,
            reserved,
            size: 0,
            snapshots: self.snapshots.clone(),
        };
        if minimum > 0 {
            memory.grow_to(minimum).map_err(|error| error.to_string())?;
        }
        Ok(Box::new(memory))
    }
}

struct Setup {
    files: Files,
    server: Server,
}

impl Setup {
    /// A server answering instance reads; every answer also echoes the Authorization it got.
    async fn new() -> Self {
        let ca = Ca::new("egress runtime test CA");
        let files = Files::new();
        files.write("token", SECRET);
        files.write("ca.pem", &ca.pem());
        let server = Server::start(
            &ca,
            &["127.0.0.1"],
            Protocol::Http1,
            handler(|seen| {
                let echo = seen
                    .headers
                    .get("authorization")
                    .map_or("", |v| v.to_str().unwrap())
                    .to_owned();
                if seen.path_and_query == "/health" {
                    return Reply {
                        status: 401,
                        ..Reply::ok(&format!("authentication failed for {echo}"))
                    };
                }
                let name = seen
                    .path_and_query
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                Reply::ok(
                    &serde_json::json!({
                        "name": name, "state": "running", "addresses": ["192.0.2.7"],
                        "uid": "uid-1", "debug": { "youSent": echo },
                    })
                    .to_string(),
                )
            }),
        )
        .await;
        Self { files, server }
    }

    fn runtime(&self, config: RuntimeConfig) -> Runtime {
        let grant = proxmox_grant(
            &self.server.origin(),
            &self.files.path("token"),
            &self.files.path("ca.pem"),
        );
        Runtime::new(config.cache_dir(None), Arc::new(broker(PROVIDER, grant))).unwrap()
    }

    fn config(&self) -> String {
        serde_json::json!({ "endpoint": self.server.origin() }).to_string()
    }
}

async fn get(provider: &Provider, config: &str, name: &str) -> Result<Response, CallError> {
    let request = Request::Get {
        config: config.to_owned(),
        provider_id: format!("ref/{name}"),
    };
    provider.call(request, &CallContext::default()).await
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    memmem::find(haystack, needle.as_bytes()).is_some()
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_memory_never_holds_the_secret() {
    let setup = Setup::new().await;
    let creator = SnapshotCreator::default();
    let runtime = setup.runtime(RuntimeConfig::default().memory_creator(Arc::new(creator.clone())));
    let provider = runtime.load_file(&component()).await.unwrap();
    creator.snapshots.lock().unwrap().clear();

    let config = setup.config();
    for name in ["scan-marker-one", "scan-marker-two", "scan-marker-three"] {
        let response = get(&provider, &config, name).await.unwrap();
        assert!(
            matches!(response, Response::Get(ref instance) if instance.name == name),
            "{response:?}"
        );
    }
    let check = provider
        .call(
            Request::Check {
                config: config.clone(),
            },
            &CallContext::default(),
        )
        .await
        .unwrap();
    let Response::Check(check) = check else {
        panic!("{check:?}")
    };

    let seen = setup.server.seen();
    assert_eq!(seen.len(), 4);
    assert!(
        seen.iter()
            .all(|s| s.headers["authorization"] == format!("PVEAPIToken={SECRET}").as_str())
    );

    let snapshots = creator.snapshots.lock().unwrap().clone();
    assert!(
        snapshots.len() >= 4,
        "one memory per call at least, got {}",
        snapshots.len()
    );
    // The scan sees what the guest handled: the names it asked for are in its memory.
    for marker in ["scan-marker-one", "scan-marker-two", "scan-marker-three"] {
        assert!(
            snapshots.iter().any(|memory| contains(memory, marker)),
            "{marker} not found: the scan reads nothing"
        );
    }
    let header_value = format!("PVEAPIToken={SECRET}");
    let needles = [
        SECRET.to_owned(),
        STANDARD.encode(SECRET).trim_end_matches('=').to_owned(),
        URL_SAFE_NO_PAD.encode(SECRET),
        STANDARD
            .encode(&header_value)
            .trim_end_matches('=')
            .to_owned(),
    ];
    for (index, memory) in snapshots.iter().enumerate() {
        for needle in &needles {
            assert!(
                !contains(memory, needle),
                "memory {index} ({} bytes) holds the secret in some form",
                memory.len()
            );
        }
    }
    // The 401 body quoted the token; the provider's message quotes the redacted body.
    assert_eq!(check.reason, CheckReason::Unauthorized, "{check:?}");
    assert!(
        check.message.contains("[redacted]") && !check.message.contains(SECRET),
        "{}",
        check.message
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_reaching_another_origin_or_setting_authorization_is_refused() {
    let setup = Setup::new().await;
    let runtime = setup.runtime(RuntimeConfig::default());
    let provider = runtime.load_file(&component()).await.unwrap();
    let port = setup.server.addr.port();

    for endpoint in [
        format!("https://localhost:{port}"),
        format!("https://127.0.0.1:{}", port.wrapping_add(1)),
        format!("http://127.0.0.1:{port}"),
    ] {
        let config = serde_json::json!({ "endpoint": endpoint }).to_string();
        let result = get(&provider, &config, "vm").await;
        assert!(
            matches!(result, Err(CallError::Provider(_))),
            "{endpoint}: {result:?}"
        );
    }

    let config = serde_json::json!({ "endpoint": setup.server.origin(), "debugSendAuthorization": "Bearer guest" }).to_string();
    let result = get(&provider, &config, "vm").await;
    match result {
        Err(CallError::Provider(error)) => {
            assert!(error.message().contains("authorization"), "{error:?}")
        }
        other => panic!("{other:?}"),
    }
    assert!(setup.server.seen().is_empty(), "nothing reached the server");

    // The same provider and grant do reach the granted origin.
    get(&provider, &setup.config(), "vm").await.unwrap();
    assert_eq!(setup.server.seen().len(), 1);
}
