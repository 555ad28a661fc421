//! Copy-on-write disks against whole copies, on a real `libvirtd` (the lab's, started when none
//! answers): the libvirt provider's create time and the bytes each VM's disk takes in the pool,
//! in both `diskMode`s, taking turns in one run so both see the same load.
//!
//! The base image is qcow2: 1 GiB virtual, 256 MiB of data that does not compress (a cloud image's
//! order of size), imported once per pool before anything is timed. Each VM asks for a 10 GiB
//! disk. A create is the whole provider call (the VM is looked up, its pool surveyed, its disk
//! made, its seed uploaded, its domain defined and started, under TCG); the disk's bytes are
//! what its file takes on the pool's file system (`st_blocks`). Each VM is deleted after it is
//! measured. Beside it, the disk alone: the capability calls that make it, as the provider makes
//! them (one volume backed by the base; or that volume, a copy of it and its deletion).
//!
//! Run as root, with the components built (`just build-components`):
//! `cargo bench -p egress-capability-libvirt --bench disks` (`-- --rounds N`, 5 by default).
//! It prints a Markdown table: medians per mode, and full copy / copy-on-write ratios.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_capability_libvirt::bindings::egress::libvirt::libvirt::{
    HostConnection, HostStoragePool, HostVolume,
};
use egress_capability_libvirt::{LibvirtCapability, LibvirtCtxView, LibvirtGrant};
use egress_runtime::grant::{FilesOnly, GrantContext};
use egress_runtime::{
    CallContext, Capability, CreateRequest, Limits, Provider, Request, Response, Runtime,
    RuntimeConfig,
};
use kvmlab::{Ca, DirPool, ImageServer, TEST_BRIDGE, qemu_host};
use sha2::{Digest, Sha256};

/// The image's virtual size and the data in it.
const IMAGE_BYTES: usize = 1 << 30;
const DATA_BYTES: usize = 256 << 20;
/// Each VM's disk.
const DISK_GIB: u64 = 10;
const MODES: [&str; 2] = ["copyOnWrite", "fullCopy"];

/// A qcow2 image of [`IMAGE_BYTES`] whose first [`DATA_BYTES`] are xorshift output (nothing for
/// qemu-img to skip or compress) and the rest zeros.
fn image() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("image.raw");
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut bytes = Vec::with_capacity(DATA_BYTES);
    while bytes.len() < DATA_BYTES {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    std::fs::write(&raw, &bytes).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&raw).unwrap();
    file.set_len(IMAGE_BYTES as u64).unwrap();
    let qcow2 = dir.path().join("image.qcow2");
    let converted = std::process::Command::new("qemu-img")
        .args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&qcow2)
        .status()
        .expect("qemu-img runs");
    assert!(converted.success());
    std::fs::read(qcow2).unwrap()
}

async fn provider(capability: &LibvirtCapability) -> Arc<Provider> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../target/components/libvirt.wasm");
    assert!(
        path.exists(),
        "{} is missing: run `just build-components`",
        path.display()
    );
    let config = RuntimeConfig::default()
        .cache_dir(None)
        .limits(Limits::default().max_concurrent_instances(2))
        .capability(Arc::new(capability.clone()));
    Runtime::new(config)
        .unwrap()
        .load_file(&path)
        .await
        .unwrap()
}

/// One create of VM `name` in `config`; how long it took.
async fn create(provider: &Provider, config: &serde_json::Value, name: &str) -> Duration {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let uid = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let request = CreateRequest {
        name: name.into(),
        uid: format!("6c1f0a2e-0000-4000-8000-{uid:012x}"),
        tags: Vec::new(),
        user_data: "#cloud-config\n".into(),
        config: config.to_string(),
        placement: None,
    };
    let started = Instant::now();
    let answer = provider
        .call(Request::Create { request }, &CallContext::default())
        .await;
    let took = started.elapsed();
    assert!(matches!(answer, Ok(Response::Create(_))), "{answer:?}");
    took
}

async fn delete(provider: &Provider, config: &serde_json::Value, name: &str) {
    let request = Request::Delete {
        config: config.to_string(),
        provider_id: format!("system/{name}"),
    };
    let answer = provider.call(request, &CallContext::default()).await;
    assert!(matches!(answer, Ok(Response::Delete)), "{answer:?}");
}

/// The value of a capability call that must have succeeded.
fn ok<T, E: std::fmt::Debug>(outcome: wasmtime::Result<Result<T, E>>) -> T {
    outcome.expect("no trap").expect("the call succeeds")
}

/// Makes a 10 GiB disk `name` as `mode` does, through the capability alone; how long it took.
/// Then deletes it.
async fn disk_alone(
    capability: &LibvirtCapability,
    pool: &str,
    base: &str,
    mode: &str,
    name: &str,
) -> Duration {
    let mut ctx = capability
        .prepare_for("libvirt", "", Instant::now() + Duration::from_secs(900))
        .unwrap();
    let mut table = wasmtime::component::ResourceTable::new();
    let mut view = LibvirtCtxView {
        ctx: &mut ctx,
        table: &mut table,
    };
    let connection = ok(view.open("system".into()).await);
    let images = ok(view.storage_pool(connection, pool.into()).await);
    let borrow = || wasmtime::component::Resource::new_borrow(images.rep());
    let capacity = DISK_GIB << 30;
    let overlay = |name: &str| {
        format!(
            "<volume><name>{name}</name><capacity unit='bytes'>{capacity}</capacity><allocation unit='bytes'>0</allocation><target><format type='qcow2'/></target><backingStore><source pool='{pool}' volume='{base}'/></backingStore></volume>"
        )
    };
    let started = Instant::now();
    let disk = if mode == "copyOnWrite" {
        ok(view.create_volume(borrow(), overlay(name)).await)
    } else {
        let creating = ok(view
            .create_volume(borrow(), overlay(&format!("{name}.creating")))
            .await);
        let copy = format!(
            "<volume><name>{name}</name><capacity unit='bytes'>{capacity}</capacity><target><format type='qcow2'/></target></volume>"
        );
        let disk = ok(view
            .clone_volume(
                borrow(),
                copy,
                wasmtime::component::Resource::new_borrow(creating.rep()),
            )
            .await);
        ok(view.delete(creating).await);
        disk
    };
    let took = started.elapsed();
    ok(view.delete(disk).await);
    took
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[middle - 1] + values[middle]) / 2.0
    } else {
        values[middle]
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: usize = std::env::args()
        .skip_while(|argument| argument != "--rounds")
        .nth(1)
        .map_or(5, |value| value.parse().expect("--rounds N"));
    qemu_host();
    let pool = DirPool::new();
    let ca = Ca::new("images");
    let ca_dir = tempfile::tempdir().unwrap();
    let ca_file = ca_dir.path().join("ca.pem");
    ca.write_pem(&ca_file);
    let image = image();
    let sha256 = hex::encode(Sha256::digest(&image));
    let server = ImageServer::start(&ca, HashMap::from([("/base.qcow2".to_owned(), image)])).await;
    let mut grant = pool.grant();
    grant["connections"][0]["bridges"] = serde_json::json!([TEST_BRIDGE]);
    grant["timeouts"]["callMs"] = serde_json::json!(600_000);
    grant["images"] = serde_json::json!({ "origins": [server.origin()], "caFile": ca_file });
    let grant: LibvirtGrant = serde_json::from_value(grant).unwrap();
    let capability = LibvirtCapability::new();
    let context = GrantContext {
        digests: &[],
        host: &FilesOnly,
    };
    capability.set_grant("libvirt", &grant, &context).unwrap();
    let provider = provider(&capability).await;
    let config = |mode: &str| {
        serde_json::json!({
            "connections": ["system"],
            "pool": pool.name,
            "bridge": TEST_BRIDGE,
            "image": { "url": format!("{}/base.qcow2", server.origin()), "sha256": sha256 },
            "domainType": "qemu",
            "memoryMiB": 64,
            "diskGiB": DISK_GIB,
            "installGuestAgent": false,
            "diskMode": mode,
        })
    };

    // The import, and a first create in each mode, are not timed.
    for mode in MODES {
        let name = format!("bench-warm-{mode}");
        create(&provider, &config(mode), &name).await;
        delete(&provider, &config(mode), &name).await;
    }
    let base = format!("egress-base-{}.qcow2", &sha256[..16]);
    let mut seconds: [Vec<f64>; 2] = Default::default();
    let mut disk_seconds: [Vec<f64>; 2] = Default::default();
    let mut bytes: [Vec<f64>; 2] = Default::default();
    for round in 0..rounds {
        // Each mode goes first in every other round.
        let order = if round.is_multiple_of(2) {
            [0, 1]
        } else {
            [1, 0]
        };
        for index in order {
            let mode = MODES[index];
            let name = format!("bench-{round}-{mode}");
            let took = create(&provider, &config(mode), &name).await;
            let used = std::fs::metadata(pool.path(&format!("{name}.qcow2")))
                .unwrap()
                .blocks()
                * 512;
            delete(&provider, &config(mode), &name).await;
            let alone = disk_alone(&capability, &pool.name, &base, mode, &name).await;
            seconds[index].push(took.as_secs_f64());
            disk_seconds[index].push(alone.as_secs_f64());
            bytes[index].push(used as f64);
            eprintln!("round {round}: {mode}: create {took:?}, disk alone {alone:?}, {used} bytes");
        }
    }
    let [cow_s, full_s] = seconds.map(|mut values| median(&mut values));
    let [cow_d, full_d] = disk_seconds.map(|mut values| median(&mut values));
    let [cow_b, full_b] = bytes.map(|mut values| median(&mut values));
    println!(
        "{rounds} rounds; image {} MiB virtual, {} MiB of data (qcow2); disks {DISK_GIB} GiB\n",
        IMAGE_BYTES >> 20,
        DATA_BYTES >> 20
    );
    println!("| per VM (median) | copyOnWrite | fullCopy | fullCopy / copyOnWrite |");
    println!("|---|---|---|---|");
    println!(
        "| create | {:.2} s | {:.2} s | {:.1} |",
        cow_s,
        full_s,
        full_s / cow_s
    );
    println!(
        "| the disk alone | {:.3} s | {:.3} s | {:.0} |",
        cow_d,
        full_d,
        full_d / cow_d
    );
    println!(
        "| disk bytes in the pool | {:.2} MiB | {:.2} MiB | {:.0} |",
        cow_b / f64::from(1 << 20),
        full_b / f64::from(1 << 20),
        full_b / cow_b
    );
}
