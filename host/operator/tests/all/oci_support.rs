//! A real registry for the OCI tests: Debian's `docker-registry` (the CNCF distribution registry,
//! 2.8) on a free loopback port, over TLS with a CA made for the run (or plain HTTP when a test
//! asks), behind htpasswd basic auth. Stopped on drop.

// Each test binary that includes this module uses a part of it.

use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};

/// The user the registry lets in.
pub const USER: &str = "publisher";
/// That user's password.
pub const PASSWORD: &str = "correct-horse-battery-staple";

/// A running `docker-registry serve`, its files in a temporary folder.
pub struct Registry {
    child: Child,
    dir: tempfile::TempDir,
    /// `127.0.0.1:PORT`.
    pub host: String,
    /// The CA that signed the registry's certificate (PEM).
    pub ca_file: PathBuf,
    /// A docker config JSON with the right credentials for this registry.
    pub auth_file: PathBuf,
}

/// The registry binary, or a failure that says how to get it: never a silent skip.
fn registry_binary() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("docker-registry"))
            .find(|path| path.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "docker-registry is not installed: `just setup` installs it (the Debian package \
             docker-registry, the CNCF distribution registry the OCI tests run)"
        )
    })
}

impl Registry {
    /// Starts a registry over TLS and waits until it accepts connections.
    pub fn start() -> Registry {
        Registry::start_with(true)
    }

    /// Starts a registry speaking plain HTTP, as one on a laptop may.
    pub fn start_plain_http() -> Registry {
        Registry::start_with(false)
    }

    fn start_with(tls: bool) -> Registry {
        let binary = registry_binary();
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);

        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let leaf_key = KeyPair::generate().unwrap();
        let mut leaf_params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        leaf_params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key).unwrap();
        std::fs::write(path("ca.pem"), ca.pem()).unwrap();
        std::fs::write(path("cert.pem"), leaf.pem()).unwrap();
        std::fs::write(path("key.pem"), leaf_key.serialize_pem()).unwrap();

        // The lowest bcrypt cost: the registry checks it on every request.
        let hash = bcrypt::hash(PASSWORD, 4).unwrap();
        std::fs::write(path("htpasswd"), format!("{USER}:{hash}\n")).unwrap();

        // A free port, released just before the registry takes it.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let host = format!("127.0.0.1:{port}");
        let tls_section = if tls {
            format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                path("cert.pem").display(),
                path("key.pem").display()
            )
        } else {
            String::new()
        };
        let config = format!(
            "version: 0.1\n\
             log:\n  level: warn\n  accesslog:\n    disabled: true\n\
             storage:\n  filesystem:\n    rootdirectory: {storage}\n\
             http:\n  addr: {host}\n  secret: egress-operator-tests\n{tls_section}\
             auth:\n  htpasswd:\n    realm: egress-operator-tests\n    path: {htpasswd}\n",
            storage = path("storage").display(),
            htpasswd = path("htpasswd").display(),
        );
        std::fs::write(path("config.yml"), config).unwrap();
        let log = std::fs::File::create(path("registry.log")).unwrap();
        let child = Command::new(binary)
            .arg("serve")
            .arg(path("config.yml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("docker-registry starts");
        let mut registry = Registry {
            child,
            ca_file: path("ca.pem"),
            auth_file: path("auth.json"),
            host,
            dir,
        };
        registry.write_auth_file("auth.json", USER, PASSWORD);
        registry.wait_until_listening();
        registry
    }

    fn wait_until_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if TcpStream::connect(&self.host).is_ok() {
                return;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("docker-registry exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry did not listen on {} within 30 s:\n{}",
                self.host,
                self.log()
            );
            // Polling a port: nothing to wait on but the next attempt.
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the registry logged, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// `REGISTRY/repository_and_tag`.
    pub fn reference(&self, repository_and_tag: &str) -> String {
        format!("{}/{repository_and_tag}", self.host)
    }

    /// A docker config JSON in the registry's folder with `user` and `password` for this
    /// registry, as a `kubernetes.io/dockerconfigjson` Secret holds it.
    pub fn write_auth_file(&self, name: &str, user: &str, password: &str) -> PathBuf {
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        let path = self.dir.path().join(name);
        std::fs::write(
            &path,
            serde_json::json!({ "auths": { self.host.clone(): { "auth": auth } } }).to_string(),
        )
        .unwrap();
        path
    }

    /// Where the registry keeps the blob `digest` (`sha256:…`) on disk: tests tamper with it to
    /// play a registry that serves other bytes than it was given.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// The manifest of `repository:tag` as the registry's HTTP API serves it, asking for an OCI
    /// image manifest with basic auth.
    pub async fn manifest(&self, repository: &str, tag: &str) -> serde_json::Value {
        let response = self
            .http()
            .get(format!(
                "https://{}/v2/{repository}/manifests/{tag}",
                self.host
            ))
            .header("Accept", "application/vnd.oci.image.manifest.v1+json")
            .basic_auth(USER, Some(PASSWORD))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{}", response.status());
        response.json().await.unwrap()
    }

    /// The blob `digest` of `repository`, over the registry's HTTP API.
    pub async fn blob(&self, repository: &str, digest: &str) -> Vec<u8> {
        let response = self
            .http()
            .get(format!(
                "https://{}/v2/{repository}/blobs/{digest}",
                self.host
            ))
            .basic_auth(USER, Some(PASSWORD))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{}", response.status());
        response.bytes().await.unwrap().to_vec()
    }

    fn http(&self) -> reqwest::Client {
        let ca = std::fs::read(&self.ca_file).unwrap();
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .build()
            .unwrap()
    }

    /// Pushes an OCI image-like artifact (a tar layer, an image config), as another tool would,
    /// to `repository_and_tag`; returns its reference pinned by digest.
    pub async fn push_not_wasm(&self, repository_and_tag: &str) -> String {
        let reference = self.reference(repository_and_tag);
        let parsed: oci_client::Reference = reference.parse().unwrap();
        let (client, auth) = self.oci_client();
        let layer = oci_client::client::ImageLayer::new(
            b"not a tarball, but labelled as one".to_vec(),
            "application/vnd.oci.image.layer.v1.tar+gzip".to_owned(),
            None,
        );
        let config = oci_client::client::Config::new(
            br#"{"architecture":"amd64","os":"linux"}"#.to_vec(),
            "application/vnd.oci.image.config.v1+json".to_owned(),
            None,
        );
        client
            .push(&parsed, &[layer], config, &auth, None)
            .await
            .unwrap();
        let digest = client.fetch_manifest_digest(&parsed, &auth).await.unwrap();
        format!("{reference}@{digest}")
    }

    /// An oci-client client trusting this registry's CA, with its credentials: for the tests
    /// that push what our CLI never would.
    pub fn oci_client(&self) -> (oci_client::Client, oci_client::secrets::RegistryAuth) {
        let config = oci_client::client::ClientConfig {
            extra_root_certificates: vec![oci_client::client::Certificate {
                encoding: oci_client::client::CertificateEncoding::Pem,
                data: std::fs::read(&self.ca_file).unwrap(),
            }],
            ..Default::default()
        };
        (
            oci_client::Client::try_from(config).unwrap(),
            oci_client::secrets::RegistryAuth::Basic(USER.into(), PASSWORD.into()),
        )
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub use testkit::component;

/// Runs `egress-operator ARGS` with a private compile cache.
pub fn run(args: &[&str]) -> Output {
    let cache = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_egress-operator"))
        .args(args)
        .env("XDG_CACHE_HOME", cache.path())
        .output()
        .expect("the binary runs")
}

/// Runs `egress-operator ARGS` with the registry's CA and credentials.
pub fn run_against(registry: &Registry, args: &[&str]) -> Output {
    let mut all: Vec<&str> = args.to_vec();
    all.extend([
        "--ca-file",
        path_str(&registry.ca_file),
        "--auth-file",
        path_str(&registry.auth_file),
    ]);
    run(&all)
}

/// A path as a `&str` argument.
pub fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// The command's stdout.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The command's stderr.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
