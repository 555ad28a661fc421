//! The `kubesim` binary: prints its URL, writes a kubeconfig kube can load.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Kills the child when the test ends, however it ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn binary_prints_its_url_and_writes_a_kubeconfig() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_kubesim"))
            .args(["--listen", "127.0.0.1:0", "--kubeconfig"])
            .arg(&kubeconfig)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let url_line = lines.next().unwrap().unwrap();
    let url = url_line.strip_prefix("url: ").expect("url line first");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert!(lines.next().unwrap().unwrap().starts_with("kubeconfig: "));

    let loaded = Kubeconfig::read_from(&kubeconfig).unwrap();
    let config = Config::from_custom_kubeconfig(loaded, &KubeConfigOptions::default())
        .await
        .unwrap();
    assert_eq!(config.cluster_url.to_string().trim_end_matches('/'), url);
    let client = Client::try_from(config).unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");
}
