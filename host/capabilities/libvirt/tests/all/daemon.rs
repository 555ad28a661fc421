//! Uploads and image imports against a real `libvirtd` (the test driver cannot stream), each
//! test on a dir pool of its own in a temporary folder, checking the bytes that land there.

use std::collections::HashMap;

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
    call: Call,
    image: Vec<u8>,
}

impl Images {
    /// A pool, an HTTPS origin serving `/base.qcow2` (3 MiB and a bit) with a CA the grant
    /// trusts, and a call granted both, importing at most `max_bytes`.
    async fn new(max_bytes: u64) -> Self {
        let pool = DirPool::new();
        let files = tempfile::tempdir().unwrap();
        let ca = Ca::new("image CA");
        ca.write_pem(&files.path().join("ca.pem"));
        let image = pattern(3 * 1024 * 1024 + 77, 3);
        let server = ImageServer::start(
            &ca,
            HashMap::from([("/base.qcow2".to_owned(), image.clone())]),
        )
        .await;
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
        let images = pool_of(&mut self.call, &self.pool).await;
        ok(self
            .call
            .view()
            .lookup_volume(images, "base.qcow2".into())
            .await)
        .is_some()
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
