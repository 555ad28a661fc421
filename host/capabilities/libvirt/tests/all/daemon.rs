//! Uploads and image imports against a real `libvirtd` (the test driver cannot stream), each
//! test on a dir pool of its own in a temporary folder, checking the bytes that land there.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use egress_capability_libvirt::bindings::egress::libvirt::libvirt::{
    Error, HostConnection, HostStoragePool, HostVolume, HostVolumeUpload,
};
use egress_capability_libvirt::{MAX_CHUNK_BYTES, StoragePool};
use sha2::{Digest, Sha256};
use wasmtime::component::Resource;

use crate::support::*;

async fn pool_of(call: &mut Call, pool: &DirPool) -> Resource<StoragePool> {
    let mut view = call.view();
    let connection = ok(view.open("system".into()).await);
    ok(view.storage_pool(connection, pool.name.clone()).await)
}

fn volume_xml(name: &str) -> String {
    format!(
        "<volume><name>{name}</name><capacity unit='bytes'>0</capacity><target><format type='raw'/></target></volume>"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_in_chunks_lands_in_the_pools_folder() {
    let pool = DirPool::new();
    let capability = capability("kvm2", pool.grant());
    let mut call = Call::new(&capability, "kvm2");
    let images = pool_of(&mut call, &pool).await;
    let mut view = call.view();
    let volume = ok(view.create_volume(images, volume_xml("seed.iso")).await);
    let upload = ok(view.upload(Resource::new_borrow(volume.rep())).await);
    let bytes = pattern(MAX_CHUNK_BYTES * 2 + 12_345, 7);
    for chunk in bytes.chunks(MAX_CHUNK_BYTES) {
        ok(view
            .write(Resource::new_borrow(upload.rep()), chunk.to_vec())
            .await);
    }
    let written = ok(view.finish(upload).await);
    assert_eq!(written, bytes.len() as u64);
    assert_eq!(std::fs::read(pool.path("seed.iso")).unwrap(), bytes);
    assert!(ok(view.path(volume).await).ends_with("/seed.iso"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_chunk_or_an_upload_past_the_grant_is_refused() {
    let pool = DirPool::new();
    let mut grant = pool.grant();
    grant["maxUploadBytes"] = serde_json::json!(1000);
    let capability = capability("kvm2", grant);
    let mut call = Call::new(&capability, "kvm2");
    let images = pool_of(&mut call, &pool).await;
    let mut view = call.view();
    let volume = ok(view.create_volume(images, volume_xml("seed.iso")).await);
    let upload = ok(view.upload(volume).await);
    let borrow = || Resource::<egress_capability_libvirt::VolumeUpload>::new_borrow(upload.rep());
    match err(view.write(borrow(), vec![0; MAX_CHUNK_BYTES + 1]).await) {
        Error::Invalid(reason) => assert!(reason.contains("chunk"), "{reason}"),
        other => panic!("{other:?}"),
    }
    ok(view.write(borrow(), vec![1; 600]).await);
    match err(view.write(borrow(), vec![2; 600]).await) {
        Error::Invalid(reason) => assert!(reason.contains("maxUploadBytes"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(ok(view.finish(upload).await), 600);
    assert_eq!(std::fs::read(pool.path("seed.iso")).unwrap(), vec![1; 600]);
}

struct Images {
    pool: DirPool,
    _files: tempfile::TempDir,
    server: ImageServer,
    capability: egress_capability_libvirt::LibvirtCapability,
    call: Call,
    image: Vec<u8>,
}

impl Images {
    /// A pool, an HTTPS origin serving `/base.qcow2` (3 MiB and a bit) with a CA the grant
    /// trusts, and a call granted both, importing at most `max_bytes`.
    async fn new(max_bytes: u64) -> Self {
        Self::serving(max_bytes, pattern(3 * 1024 * 1024 + 77, 3), false).await
    }

    /// [`Images::new`] serving `image`, held half-sent until the server's gate opens when
    /// `gated`.
    async fn serving(max_bytes: u64, image: Vec<u8>, gated: bool) -> Self {
        let pool = DirPool::new();
        let files = tempfile::tempdir().unwrap();
        let ca = Ca::new("image CA");
        ca.write_pem(&files.path().join("ca.pem"));
        let table = HashMap::from([
            ("/base.qcow2".to_owned(), image.clone()),
            ("/other.qcow2".to_owned(), image.clone()),
            ("/third.qcow2".to_owned(), image.clone()),
        ]);
        let server = if gated {
            ImageServer::gated(&ca, table).await
        } else {
            ImageServer::start(&ca, table).await
        };
        let mut grant = pool.grant();
        grant["images"] = serde_json::json!({
            "origins": [server.origin()],
            "caFile": files.path().join("ca.pem"),
            "maxBytes": max_bytes,
        });
        let capability = capability("kvm2", grant);
        let call = Call::new(&capability, "kvm2");
        Self {
            pool,
            _files: files,
            server,
            capability,
            call,
            image,
        }
    }

    fn sha256(&self) -> String {
        hex::encode(Sha256::digest(&self.image))
    }

    async fn import(
        &mut self,
        path: &str,
        sha256: String,
    ) -> Result<Resource<egress_capability_libvirt::Volume>, Error> {
        let images = pool_of(&mut self.call, &self.pool).await;
        let url = format!("{}{path}", self.server.origin());
        match self
            .call
            .view()
            .import_image(images, "base.qcow2".into(), url, sha256)
            .await
        {
            Ok(outcome) => outcome,
            Err(trap) => panic!("the call trapped: {trap:?}"),
        }
    }

    async fn volume_exists(&mut self) -> bool {
        self.exists("base.qcow2").await
    }

    async fn exists(&mut self, name: &str) -> bool {
        let images = pool_of(&mut self.call, &self.pool).await;
        ok(self.call.view().lookup_volume(images, name.into()).await).is_some()
    }

    /// An import of `path` into `name` in a call of its own that ends at `deadline`.
    async fn import_until(
        &self,
        deadline: Instant,
        path: &str,
        name: &str,
    ) -> Result<Resource<egress_capability_libvirt::Volume>, Error> {
        let mut call = Call::until(&self.capability, "kvm2", deadline);
        let images = pool_of(&mut call, &self.pool).await;
        let url = format!("{}{path}", self.server.origin());
        call.view()
            .import_image(images, name.into(), url, self.sha256())
            .await
            .expect("the call does not trap")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_is_streamed_from_a_granted_origin_into_a_new_volume() {
    let mut setup = Images::new(64 * 1024 * 1024).await;
    let sha256 = setup.sha256();
    let volume = setup.import("/base.qcow2", sha256).await.unwrap();
    assert_eq!(
        std::fs::read(setup.pool.path("base.qcow2")).unwrap(),
        setup.image
    );
    let mut view = setup.call.view();
    assert_eq!(
        HostVolume::name(&mut view, volume).await.unwrap(),
        "base.qcow2"
    );
    assert!(setup.volume_exists().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_checksum_is_refused_and_the_volume_deleted() {
    let mut setup = Images::new(64 * 1024 * 1024).await;
    let mut wrong = setup.sha256().into_bytes();
    wrong[0] = if wrong[0] == b'0' { b'1' } else { b'0' };
    let error = setup
        .import("/base.qcow2", String::from_utf8(wrong).unwrap())
        .await
        .unwrap_err();
    match error {
        Error::ChecksumMismatch(message) => {
            assert!(message.contains(&setup.sha256()), "{message}")
        }
        other => panic!("{other:?}"),
    }
    assert!(!setup.volume_exists().await);
    assert!(!setup.pool.path("base.qcow2").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_is_a_permanent_download_error_and_makes_no_volume() {
    let mut setup = Images::new(64 * 1024 * 1024).await;
    let sha256 = setup.sha256();
    match setup.import("/nope.qcow2", sha256).await.unwrap_err() {
        Error::Download(error) => {
            assert_eq!(error.status, Some(404));
            assert!(!error.retryable);
        }
        other => panic!("{other:?}"),
    }
    assert!(!setup.volume_exists().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_larger_than_the_grant_allows_is_refused() {
    let mut setup = Images::new(1024 * 1024).await;
    let sha256 = setup.sha256();
    match setup.import("/base.qcow2", sha256).await.unwrap_err() {
        Error::Download(error) => {
            assert!(error.message.contains("maxBytes"), "{error:?}");
            assert!(!error.retryable);
        }
        other => panic!("{other:?}"),
    }
    assert!(!setup.volume_exists().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_with_a_certificate_from_another_ca_fails_tls() {
    let mut setup = Images::new(64 * 1024 * 1024).await;
    Ca::new("another CA").write_pem(&setup._files.path().join("ca.pem"));
    let sha256 = setup.sha256();
    match setup.import("/base.qcow2", sha256).await.unwrap_err() {
        Error::Download(error) => {
            assert!(!error.retryable, "{error:?}");
            assert!(error.message.contains("TLS"), "{error:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!setup.volume_exists().await);
}

/// The partial-import fix: while the bytes stream in, the base is only `<name>.importing`; a
/// create beside the import (or after a crash in the middle of it) never finds a partial base
/// under the final name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_volume_appears_under_its_name_only_once_verified() {
    let mut setup = Images::serving(64 * 1024 * 1024, pattern(3 * 1024 * 1024 + 77, 5), true).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    let importing = {
        let (capability, pool) = (setup.capability.clone(), setup.pool.name.clone());
        let (url, sha256) = (
            format!("{}/base.qcow2", setup.server.origin()),
            setup.sha256(),
        );
        tokio::spawn(async move {
            let mut call = Call::until(&capability, "kvm2", deadline);
            let connection = ok(call.view().open("system".into()).await);
            let images = ok(call.view().storage_pool(connection, pool).await);
            call.view()
                .import_image(images, "base.qcow2".into(), url, sha256)
                .await
                .expect("the call does not trap")
                .map(drop)
        })
    };
    // Half the image has been sent, and the server holds the rest.
    wait_for(Duration::from_secs(60), "the temporary volume", || {
        setup.pool.path("base.qcow2.importing").exists()
    });
    assert!(
        !setup.exists("base.qcow2").await,
        "a partial base is visible"
    );
    assert!(!setup.pool.path("base.qcow2").exists());
    setup.server.open_gate();
    importing.await.unwrap().unwrap();
    assert_eq!(
        std::fs::read(setup.pool.path("base.qcow2")).unwrap(),
        setup.image
    );
    assert!(!setup.exists("base.qcow2.importing").await);
    assert!(!setup.pool.path("base.qcow2.importing").exists());
}

/// What an import that died left (the host killed mid-download) is deleted, and the next import
/// writes the base from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_dead_import_left_is_replaced_by_the_next_one() {
    let mut setup = Images::new(64 * 1024 * 1024).await;
    let images = pool_of(&mut setup.call, &setup.pool).await;
    let mut view = setup.call.view();
    let stale = ok(view
        .create_volume(images, volume_xml("base.qcow2.importing"))
        .await);
    let upload = ok(view.upload(stale).await);
    ok(view
        .write(
            Resource::new_borrow(upload.rep()),
            b"half an image".to_vec(),
        )
        .await);
    ok(view.finish(upload).await);
    let sha256 = setup.sha256();
    setup.import("/base.qcow2", sha256).await.unwrap();
    assert_eq!(
        std::fs::read(setup.pool.path("base.qcow2")).unwrap(),
        setup.image
    );
    assert!(!setup.pool.path("base.qcow2.importing").exists());
}

/// A download outlives the create deadline that cut it: the next call waits for the same job,
/// which the origin served once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_goes_on_past_the_call_that_started_it() {
    let mut setup = Images::serving(64 * 1024 * 1024, pattern(2 * 1024 * 1024, 9), true).await;
    let cut = setup
        .import_until(
            Instant::now() + Duration::from_secs(2),
            "/base.qcow2",
            "base.qcow2",
        )
        .await;
    assert!(matches!(cut, Err(Error::Timeout)), "{cut:?}");
    assert!(!setup.exists("base.qcow2").await);
    setup.server.open_gate();
    setup
        .import_until(
            Instant::now() + Duration::from_secs(120),
            "/base.qcow2",
            "base.qcow2",
        )
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(setup.pool.path("base.qcow2")).unwrap(),
        setup.image
    );
    assert_eq!(
        setup.server.requests(),
        1,
        "the retry restarted the download"
    );
}

/// What one provider can keep the host busy with is bounded: two imports at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_runs_at_most_two_imports_at_once() {
    let setup = Images::serving(64 * 1024 * 1024, pattern(1024 * 1024, 4), true).await;
    let soon = || Instant::now() + Duration::from_secs(1);
    for (path, name) in [("/base.qcow2", "a.qcow2"), ("/other.qcow2", "b.qcow2")] {
        let held = setup.import_until(soon(), path, name).await;
        assert!(matches!(held, Err(Error::Timeout)), "{held:?}");
    }
    match setup.import_until(soon(), "/third.qcow2", "c.qcow2").await {
        Err(Error::Download(error)) => {
            assert!(
                error.retryable && error.message.contains("at once"),
                "{error:?}"
            )
        }
        other => panic!("{other:?}"),
    }
    // The same volume joins its job rather than counting twice.
    let joined = setup.import_until(soon(), "/base.qcow2", "a.qcow2").await;
    assert!(matches!(joined, Err(Error::Timeout)), "{joined:?}");
    setup.server.open_gate();
}

/// qcow2, the default format, keeps its format through the import: libvirt reads the format in
/// the bytes, and the published base is qcow2 too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_qcow2_image_stays_qcow2() {
    let scratch = tempfile::tempdir().unwrap();
    let source = scratch.path().join("image.qcow2");
    let made = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&source)
        .arg("16M")
        .status()
        .expect("qemu-img runs (apt-get install qemu-utils)");
    assert!(made.success());
    let mut setup = Images::serving(64 * 1024 * 1024, std::fs::read(&source).unwrap(), false).await;
    let sha256 = setup.sha256();
    setup.import("/base.qcow2", sha256).await.unwrap();
    let published = std::fs::read(setup.pool.path("base.qcow2")).unwrap();
    assert_eq!(&published[..4], b"QFI\xfb", "the base is qcow2");
    let info = std::process::Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(setup.pool.path("base.qcow2"))
        .output()
        .unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(info["format"], "qcow2");
    assert_eq!(info["virtual-size"], 16 * 1024 * 1024);
}

/// Copy-on-write on a real libvirtd: a qcow2 volume backed by a granted pool's volume, made at
/// the size asked in one call, reads the base's bytes and holds almost none of its own; the host
/// wrote the base's path and format into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_on_write_volume_reads_its_base_at_the_size_asked() {
    let pool = DirPool::new();
    let scratch = tempfile::tempdir().unwrap();
    let raw = scratch.path().join("base.raw");
    std::fs::write(&raw, pattern(4 * 1024 * 1024, 11)).unwrap();
    let base = pool.path("base.qcow2");
    let converted = std::process::Command::new("qemu-img")
        .args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&base)
        .status()
        .expect("qemu-img runs");
    assert!(converted.success());
    {
        let mut connect = virt::connect::Connect::open(Some(SYSTEM_URI)).unwrap();
        virt::storage_pool::StoragePool::lookup_by_name(&connect, &pool.name)
            .unwrap()
            .refresh(0)
            .unwrap();
        connect.close().unwrap();
    }
    let capability = capability("kvm2", pool.grant());
    let mut call = Call::new(&capability, "kvm2");
    let images = pool_of(&mut call, &pool).await;
    ok(call
        .view()
        .create_volume(
            images,
            format!(
                "<volume><name>disk.qcow2</name><capacity unit='GiB'>1</capacity><target><format type='qcow2'/></target><backingStore><source pool='{}' volume='base.qcow2'/></backingStore></volume>",
                pool.name
            ),
        )
        .await);
    let disk = pool.path("disk.qcow2");
    let info = std::process::Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(&disk)
        .output()
        .unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(info["format"], "qcow2", "{info}");
    assert_eq!(info["virtual-size"], 1u64 << 30, "{info}");
    assert_eq!(info["backing-filename"], base.to_str().unwrap(), "{info}");
    assert_eq!(info["backing-filename-format"], "qcow2", "{info}");
    assert!(info["actual-size"].as_u64().unwrap() < 1 << 20, "{info}");
    let compared = std::process::Command::new("qemu-img")
        .args(["compare", "-q"])
        .arg(&raw)
        .arg(&disk)
        .status()
        .unwrap();
    assert!(compared.success(), "the disk reads the base's bytes");
}

/// `prune-images` removes the unused images of the pool named by the prefix, and nothing else:
/// not a volume another volume is backed by, not an import's temporary volume, not a volume
/// outside the prefix; and nothing at all for a grant that cannot import images.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruning_removes_only_unused_images_and_only_for_a_grant_that_imports() {
    let pool = DirPool::new();
    let mut grant = pool.grant();
    grant["images"] = serde_json::json!({
        "origins": ["https://images.invalid"],
        "caFile": "/nonexistent/ca.pem",
        "unusedRetentionMs": 0,
    });
    let importing = capability("kvm2", grant);
    let not_importing = capability("other", pool.grant());
    let mut call = Call::new(&importing, "kvm2");
    let images = pool_of(&mut call, &pool).await;
    let mut view = call.view();
    let borrow = || Resource::<StoragePool>::new_borrow(images.rep());
    for name in [
        "egress-base-unused.raw",
        "egress-base-backing.raw",
        "egress-base-half.raw.importing",
        "other.raw",
    ] {
        ok(view.create_volume(borrow(), volume_xml(name)).await);
    }
    ok(view
        .create_volume(
            borrow(),
            format!(
                "<volume><name>disk.qcow2</name><capacity unit='MiB'>16</capacity><target><format type='qcow2'/></target><backingStore><source pool='{}' volume='egress-base-backing.raw'/></backingStore></volume>",
                pool.name
            ),
        )
        .await);
    let all = pool.volumes();

    let mut other_call = Call::new(&not_importing, "other");
    let other_images = pool_of(&mut other_call, &pool).await;
    let removed = ok(other_call
        .view()
        .prune_images(other_images, "egress-base-".into())
        .await);
    assert!(removed.is_empty(), "{removed:?}");
    assert_eq!(pool.volumes(), all);

    let invalid = err(view.prune_images(borrow(), String::new()).await);
    assert!(matches!(invalid, Error::Invalid(_)), "{invalid:?}");
    let removed = ok(view.prune_images(borrow(), "egress-base-".into()).await);
    assert_eq!(removed, ["egress-base-unused.raw"]);
    let mut left = all;
    left.remove("egress-base-unused.raw");
    assert_eq!(pool.volumes(), left);
    // Once its disk is gone, the backing image goes too.
    let disk = ok(view.lookup_volume(borrow(), "disk.qcow2".into()).await).unwrap();
    ok(view.delete(disk).await);
    let removed = ok(view.prune_images(borrow(), "egress-base-".into()).await);
    assert_eq!(removed, ["egress-base-backing.raw"]);
}
