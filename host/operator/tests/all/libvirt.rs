//! The libvirt/KVM provider through the operator, on this machine's real `libvirtd` (`kvmlab`: a
//! dir pool, a DHCP network and a guest image that boots under qemu and asks for an address).
//!
//! - Local mode, the real binary over a folder: three Proxies end Running with addresses (the
//!   network's leases), on qcow2 disks cloned from the imported base; a removed manifest takes its
//!   domain, disk and seed; the ProviderConfig renamed keeps its domains (marks follow the grant's
//!   owner, not the identity); a domain paused by hand makes its Proxy Paused and, resumed by
//!   hand, Running again with no restart spent.
//! - Kubernetes mode against a real kube-apiserver (`cluster_support`), the operator as its
//!   ServiceAccount: the same through the API, a create killed at each of its
//!   capability calls and retried by a fresh operator ends with one domain, disk and seed.
//! - A grant that cannot be served is a condition with a reason on the ProviderConfig, and
//!   touches no domain.
//!
//! Every wait polls with a bound; nothing sleeps to synchronise.

use crate::cluster_support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use crate::local_support::{Folder, reason, running};
use egress_operator::conditions::{self, condition};
use egress_operator::crd::Phase;
use kvmlab::Lab;
use serde_json::json;

/// The ProviderConfig of the lab.
const PC: &str = "kvm-lab";
/// How long guests booting under TCG on a busy machine may take to answer with an address.
const BOOT_LIMIT: Duration = Duration::from_secs(420);

fn component() -> PathBuf {
    testkit::component("libvirt")
}

/// The ProviderConfig `name` over `lab` (JSON is YAML), the image CA from a ConfigMap.
fn provider_config(lab: &Lab, name: &str) -> String {
    json!({
        "apiVersion": "egress-operator.io/v1alpha1",
        "kind": "ProviderConfig",
        "metadata": {"name": name},
        "spec": {
            "component": {"file": "libvirt.wasm"},
            "config": lab.provider_config(),
            "grant": {"libvirt": lab.grant(json!({"caConfigMapRef": {"name": "kvm-lab-ca", "key": "ca.pem"}}))},
            "orphanSweep": {"mode": "Off"},
        },
    })
    .to_string()
}

/// The ConfigMap with the lab origin's CA.
fn ca_config_map(lab: &Lab) -> String {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "kvm-lab-ca"},
        "data": {"ca.pem": lab.ca.pem()},
    })
    .to_string()
}

fn proxy(name: &str, provider_config: &str) -> String {
    json!({
        "apiVersion": "egress-operator.io/v1alpha1", "kind": "Proxy",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "providerConfigRef": provider_config,
            "userData": {"inline": "#cloud-config\n"},
        },
    })
    .to_string()
}

/// The lab's volumes that belong to VM `vm`.
fn volumes_of(lab: &Lab, vm: &str) -> BTreeSet<String> {
    lab.pool
        .volumes()
        .into_iter()
        .filter(|volume| volume.starts_with(vm))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_proxies_run_on_libvirtd_a_removed_manifest_takes_its_vm_and_a_rename_keeps_them() {
    let lab = Lab::start(None).await;
    let mut folder = Folder::new(&[component()]);
    folder.write("providerconfig.yaml", &provider_config(&lab, PC));
    folder.write("ca.yaml", &ca_config_map(&lab));
    for name in ["a", "b", "c"] {
        folder.write(&format!("proxy-{name}.yaml"), &proxy(name, PC));
    }
    folder.start();
    folder.wait_until(
        "three proxies running with addresses",
        BOOT_LIMIT,
        |proxies| proxies.len() == 3 && proxies.iter().all(running),
    );
    let records = folder.proxies();
    let vms: Vec<String> = records
        .iter()
        .map(|record| record.status.vm_name.clone().expect("a VM name"))
        .collect();
    let mut domains: Vec<String> = lab.domains().into_iter().map(|(name, _)| name).collect();
    domains.sort();
    let mut expected = vms.clone();
    expected.sort();
    assert_eq!(domains, expected, "one domain per Proxy");
    for record in &records {
        let address = &record.status.addresses[0];
        let subnet = lab.network.gateway.trim_end_matches(".1");
        assert!(
            address.starts_with(subnet),
            "{address} is on the lab's network"
        );
    }
    for vm in &vms {
        assert_eq!(
            volumes_of(&lab, vm),
            BTreeSet::from([format!("{vm}.qcow2"), format!("{vm}-seed.iso")])
        );
        // qcow2, the default format, end to end: the disk cloned from the imported base is qcow2.
        let disk = std::fs::read(lab.pool.path(&format!("{vm}.qcow2"))).unwrap();
        assert_eq!(&disk[..4], b"QFI\xfb", "{vm}'s disk is qcow2");
    }
    let base = format!("egress-base-{}.qcow2", &lab.image.sha256[..16]);
    assert!(
        lab.pool.volumes().contains(&base),
        "{:?}",
        lab.pool.volumes()
    );

    // Issue 32, the state table on libvirt: a domain a person paused makes its Proxy Paused, no
    // restart spent; resumed by hand, it is Running again with no change to any object.
    let paused = folder
        .proxy("default/b")
        .unwrap()
        .proxy
        .status
        .vm_name
        .unwrap();
    lab.set_paused(&paused, true);
    folder.wait_until("proxy b Paused", BOOT_LIMIT, |proxies| {
        proxies.iter().any(|record| {
            record.status.vm_name.as_deref() == Some(paused.as_str())
                && record.status.phase == Some(Phase::Paused)
                && reason(record, conditions::READY) == "VMPaused"
        })
    });
    lab.set_paused(&paused, false);
    folder.wait_until("proxy b Running again", BOOT_LIMIT, |proxies| {
        proxies.len() == 3 && proxies.iter().all(running)
    });
    let b = folder.proxy("default/b").unwrap();
    assert_eq!(b.status.restarts, 0, "no restart spent on a paused domain");
    assert_eq!(
        b.status.vm_name.as_deref(),
        Some(paused.as_str()),
        "the same VM"
    );

    // A removed manifest: its domain, disk and seed go; the others stay.
    let gone = folder
        .proxy("default/a")
        .unwrap()
        .proxy
        .status
        .vm_name
        .unwrap();
    folder.remove("proxy-a.yaml");
    folder.wait_until("proxy a forgotten", BOOT_LIMIT, |proxies| {
        proxies.len() == 2
    });
    assert!(lab.domains().iter().all(|(name, _)| *name != gone));
    assert!(
        volumes_of(&lab, &gone).is_empty(),
        "{:?}",
        lab.pool.volumes()
    );
    assert_eq!(lab.domains().len(), 2);

    // The ProviderConfig renamed (a new one, the Proxies pointed at it, the old one gone): the
    // marks follow the grant's owner, so its domains are still its own, found and kept running.
    let before: Vec<(String, bool)> = lab.domains();
    folder.write(
        "providerconfig-renamed.yaml",
        &provider_config(&lab, "kvm-renamed"),
    );
    for name in ["b", "c"] {
        folder.write(&format!("proxy-{name}.yaml"), &proxy(name, "kvm-renamed"));
    }
    folder.remove("providerconfig.yaml");
    folder.wait_until(
        "the proxies served by the renamed ProviderConfig",
        BOOT_LIMIT,
        |proxies| {
            proxies.len() == 2
                && proxies.iter().all(|record| {
                    running(record)
                        && record
                            .status
                            .provider
                            .as_ref()
                            .is_some_and(|provider| provider.provider_config == "kvm-renamed")
                })
        },
    );
    let mut after = lab.domains();
    after.sort();
    let mut before = before;
    before.sort();
    assert_eq!(after, before, "the same domains, none made or lost");
    for record in folder.proxies() {
        assert_eq!(record.status.phase, Some(Phase::Running));
        assert_eq!(reason(&record, conditions::READY), "Running", "{record:?}");
    }
    folder.kill();
}

/// A grant naming a Secret that does not exist, a key that is not a key, and a pool that does not
/// exist: each a condition with a reason on its ProviderConfig, its Proxy made nothing, and the
/// good ProviderConfig beside them unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_cannot_be_served_is_a_condition_and_makes_no_vm() {
    let lab = Lab::start(None).await;
    let mut folder = Folder::new(&[component()]);
    folder.write("ca.yaml", &ca_config_map(&lab));
    folder.write(
        "secret.yaml",
        &json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "not-a-key"},
            "stringData": {"id": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5 a public key, not a private one"},
        })
        .to_string(),
    );
    let with_grant = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        let mut pc: serde_json::Value = serde_json::from_str(&provider_config(&lab, name)).unwrap();
        edit(&mut pc["spec"]);
        pc.to_string()
    };
    let ssh = |reference: serde_json::Value| {
        move |spec: &mut serde_json::Value| {
            let connection = &mut spec["grant"]["libvirt"]["connections"][0];
            connection["uri"] = json!("qemu+libssh2://egress@127.0.0.1:1/system");
            connection["sshKeySecretRef"] = reference.clone();
        }
    };
    folder.write(
        "missing-secret.yaml",
        &with_grant(
            "missing-secret",
            &ssh(json!({"name": "nowhere", "key": "id"})),
        ),
    );
    folder.write(
        "bad-key.yaml",
        &with_grant("bad-key", &ssh(json!({"name": "not-a-key", "key": "id"}))),
    );
    // A key that is a key, to a host that does not answer.
    let keys = tempfile::tempdir().unwrap();
    let made = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(keys.path().join("id"))
        .status()
        .expect("ssh-keygen (apt-get install openssh-client)");
    assert!(made.success());
    folder.write(
        "ssh-secret.yaml",
        &json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "lab-ssh"},
            "stringData": {
                "id": std::fs::read_to_string(keys.path().join("id")).unwrap(),
                "known_hosts": "[127.0.0.1]:1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyOfNobody\n",
            },
        })
        .to_string(),
    );
    folder.write(
        "unreachable.yaml",
        &with_grant("unreachable", &|spec| {
            ssh(json!({"name": "lab-ssh", "key": "id"}))(spec);
            spec["grant"]["libvirt"]["connections"][0]["knownHostsSecretRef"] =
                json!({"name": "lab-ssh", "key": "known_hosts"});
        }),
    );
    folder.write(
        "ungranted.yaml",
        &with_grant("ungranted", &|spec| spec["grant"] = json!({})),
    );
    folder.write(
        "no-pool.yaml",
        &with_grant("no-pool", &|spec| {
            spec["config"]["pool"] = json!("no-such-pool");
            spec["grant"]["libvirt"]["connections"][0]["pools"] = json!(["no-such-pool"]);
        }),
    );
    folder.write("providerconfig.yaml", &provider_config(&lab, PC));
    for (proxy_name, pc) in [
        ("m", "missing-secret"),
        ("k", "bad-key"),
        ("u", "unreachable"),
        ("p", "no-pool"),
        ("n", "ungranted"),
        ("g", PC),
    ] {
        folder.write(&format!("proxy-{proxy_name}.yaml"), &proxy(proxy_name, pc));
    }
    // SSH keys from Secrets go to a memory-backed folder of the test's own.
    let key_base = tempfile::tempdir_in("/dev/shm").unwrap();
    folder.start_with(&["--key-dir", key_base.path().to_str().unwrap()]);
    let store = folder.dir.path().join(".egress-operator/state.db");
    let ready = |name: &str| -> Option<(String, String, String)> {
        let store = egress_operator::local::store::Store::open_read_only(&store).ok()?;
        let record = store
            .configs()
            .ok()?
            .into_iter()
            .find(|record| record.name == name)?;
        let ready = condition(&record.status.conditions, conditions::READY)?;
        Some((
            ready.status.clone(),
            ready.reason.clone(),
            ready.message.clone(),
        ))
    };
    folder.wait_until("the good proxy running", BOOT_LIMIT, |proxies| {
        proxies
            .iter()
            .any(|record| record.name == "g" && running(record))
    });
    for (name, expected_reason, words) in [
        (
            "missing-secret",
            "InvalidGrant",
            "Secret default/nowhere does not exist",
        ),
        ("bad-key", "InvalidGrant", "not an SSH private key"),
        ("unreachable", "Unreachable", "connection lab"),
        ("no-pool", "Misconfigured", "no-such-pool"),
        ("ungranted", "CapabilityNotGranted", "spec.grant.libvirt"),
    ] {
        let (status, reason, message) = ready(name).unwrap_or_default();
        assert_eq!(status, "False", "{name}: {message}");
        assert_eq!(reason, expected_reason, "{name}: {message}");
        assert!(message.contains(words), "{name}: {message}");
        assert!(
            !message.contains("AAAAC3Nz"),
            "{name} shows the Secret: {message}"
        );
    }
    // A Proxy of a ProviderConfig whose grant is refused waits with that reason; it is not
    // called into a capability that would deny it and latched as a permanent failure.
    let waiting =
        |proxies: &[egress_operator::local::store::ProxyRecord], proxy_name: &str, reason: &str| {
            proxies.iter().any(|record| {
                record.name == proxy_name
                    && condition(&record.status.conditions, conditions::READY)
                        .is_some_and(|ready| ready.reason == reason)
            })
        };
    folder.wait_until(
        "the refused ProviderConfigs' Proxies waiting",
        Duration::from_secs(120),
        |proxies| {
            waiting(proxies, "k", "InvalidGrant") && waiting(proxies, "n", "CapabilityNotGranted")
        },
    );
    // Only the good Proxy has a VM.
    assert_eq!(lab.domains().len(), 1, "{:?}", lab.domains());
    // The key was written 0600 to the operator's private folder, and goes when it exits.
    let written: Vec<_> = std::fs::read_dir(key_base.path())
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(written.len(), 1, "one folder, the operator's");
    let stopped = folder.stop_with(libc::SIGINT);
    assert!(
        stopped.is_some_and(|status| status.success()),
        "{stopped:?}"
    );
    assert_eq!(
        std::fs::read_dir(key_base.path()).unwrap().count(),
        0,
        "the key folder outlived the operator"
    );
}

mod kube {
    //! Kubernetes mode against a real kube-apiserver, in this process: the operator as
    //! `run_with` runs it, authenticated as its ServiceAccount.

    use std::path::PathBuf;
    use std::process::ExitCode;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use std::collections::BTreeSet;
    use std::sync::Mutex;

    use egress_operator::conditions::{self, condition};
    use egress_operator::crd::{POOL_LABEL, ProviderConfig, Proxy, ProxyPool};
    use egress_operator::kube_mode::{self, Options};
    use egress_operator::operator::{Operator, Settings};
    use egress_operator::timing::Timing;
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::ResourceExt;
    use kube::api::{DeleteParams, PostParams};
    use kube::api::{ListParams, Patch, PatchParams};
    use kube::runtime::watcher;
    use kube::{Api, Client};
    use kvmlab::Lab;
    use serde::de::DeserializeOwned;
    use serde_json::json;
    use tokio::sync::oneshot;

    use super::cluster_support::{Cluster, OPERATOR_NAMESPACE};
    use super::{BOOT_LIMIT, PC, ca_config_map, component, provider_config, proxy, volumes_of};

    const NAMESPACE: &str = "default";

    /// A cluster with the CRDs and RBAC, the lab's CA and its ProviderConfig.
    pub struct World {
        _cluster: Cluster,
        pub client: Client,
        operator_client: Client,
        pub lab: Lab,
        components: tempfile::TempDir,
    }

    impl World {
        pub async fn start() -> World {
            let lab = Lab::start(None).await;
            let cluster = Cluster::start().await;
            let client = cluster.admin.clone();
            let operator_client = cluster.operator_client().await;
            let mut ca: serde_json::Value = serde_json::from_str(&ca_config_map(&lab)).unwrap();
            ca["metadata"]["namespace"] = NAMESPACE.into();
            Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
                .create(&PostParams::default(), &serde_json::from_value(ca).unwrap())
                .await
                .unwrap();
            let pc: ProviderConfig = serde_json::from_str(&provider_config(&lab, PC)).unwrap();
            Api::<ProviderConfig>::all(client.clone())
                .create(&PostParams::default(), &pc)
                .await
                .unwrap();
            let components = tempfile::tempdir().unwrap();
            std::fs::copy(component(), components.path().join("libvirt.wasm")).unwrap();
            World {
                _cluster: cluster,
                client,
                operator_client,
                lab,
                components,
            }
        }

        pub fn proxies(&self) -> Api<Proxy> {
            Api::namespaced(self.client.clone(), NAMESPACE)
        }

        pub async fn create_proxy(&self, name: &str) {
            let mut manifest: serde_json::Value = serde_json::from_str(&proxy(name, PC)).unwrap();
            manifest["metadata"]["namespace"] = NAMESPACE.into();
            let manifest: Proxy = serde_json::from_value(manifest).unwrap();
            self.proxies()
                .create(&PostParams::default(), &manifest)
                .await
                .unwrap();
        }

        /// Polls until `check` holds of Proxy `name` (`None` when it is gone), at most `limit`.
        pub async fn until(
            &self,
            name: &str,
            what: &str,
            limit: Duration,
            check: impl Fn(Option<&Proxy>) -> bool,
        ) -> Option<Proxy> {
            let end = Instant::now() + limit;
            loop {
                let proxy = self.proxies().get_opt(name).await.unwrap();
                if check(proxy.as_ref()) {
                    return proxy;
                }
                assert!(
                    Instant::now() < end,
                    "{name}: not {what} within {limit:?}; last: {:#?}",
                    proxy.and_then(|proxy| proxy.status)
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }

        /// Polls until the ProviderConfig is Ready.
        pub async fn until_provider_ready(&self) {
            let end = Instant::now() + BOOT_LIMIT;
            loop {
                let pc = Api::<ProviderConfig>::all(self.client.clone())
                    .get(PC)
                    .await
                    .unwrap();
                let status = pc.status.unwrap_or_default();
                if condition(&status.conditions, conditions::READY)
                    .is_some_and(|ready| ready.status == "True")
                {
                    return;
                }
                assert!(Instant::now() < end, "{PC} never Ready: {status:#?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    pub fn running(proxy: Option<&Proxy>) -> bool {
        proxy
            .and_then(|proxy| proxy.status.as_ref())
            .is_some_and(|status| {
                format!("{:?}", status.phase) == "Some(Running)" && !status.addresses.is_empty()
            })
    }

    pub fn vm_name(proxy: Option<&Proxy>) -> Option<String> {
        proxy?.status.as_ref()?.vm_name.clone()
    }

    /// One operator running `run_with` in this process.
    pub struct Replica {
        pub operator: Arc<Operator>,
        stop: Option<oneshot::Sender<()>>,
        task: tokio::task::JoinHandle<anyhow::Result<ExitCode>>,
    }

    impl Replica {
        /// An operator over the world's components: short retries, and a resync longer than any
        /// test (the capability calls of a test are the Proxies' own).
        pub async fn start(world: &World, identity: &str) -> Replica {
            let mut settings = Settings::new(
                egress_operator::installation::Installation::new("test-cluster").unwrap(),
                world.components.path().to_path_buf(),
            );
            settings.namespace = NAMESPACE.into();
            settings.timing = Timing {
                resync: Duration::from_secs(3600),
                poll_min: Duration::from_millis(200),
                poll_max: Duration::from_secs(1),
                backoff_base: Duration::from_millis(100),
                backoff_max: Duration::from_secs(1),
                quota_retry: Duration::from_secs(2),
                not_ready_retry: Duration::from_millis(500),
            };
            settings.cache_dir =
                Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("libvirt-mode-cache"));
            let operator = Operator::start(settings)
                .await
                .expect("the operator starts");
            let mut options = Options::new(OPERATOR_NAMESPACE, identity);
            options.lease_seconds = 2;
            options.lease_grace_seconds = 1;
            options.shutdown_grace = Duration::from_secs(10);
            let (stop, stopped) = oneshot::channel::<()>();
            let task = tokio::spawn(kube_mode::run_with(
                world.operator_client.clone(),
                Arc::clone(&operator),
                options,
                async move {
                    let _ = stopped.await;
                },
            ));
            Replica {
                operator,
                stop: Some(stop),
                task,
            }
        }

        pub async fn stop(mut self) {
            if let Some(stop) = self.stop.take() {
                let _ = stop.send(());
            }
            let _ = tokio::time::timeout(Duration::from_secs(60), self.task).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn through_kubernetes_mode_three_proxies_run_and_a_deleted_one_takes_its_vm() {
        let world = World::start().await;
        let replica = Replica::start(&world, "libvirt-e2e").await;
        for name in ["a", "b", "c"] {
            world.create_proxy(name).await;
        }
        let mut vms = Vec::new();
        for name in ["a", "b", "c"] {
            let proxy = world
                .until(name, "running with an address", BOOT_LIMIT, running)
                .await;
            vms.push(vm_name(proxy.as_ref()).expect("a VM name"));
        }
        let mut domains: Vec<String> = world
            .lab
            .domains()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        domains.sort();
        let mut expected = vms.clone();
        expected.sort();
        assert_eq!(domains, expected);

        world
            .proxies()
            .delete("a", &DeleteParams::default())
            .await
            .unwrap();
        world
            .until("a", "gone through its finalizer", BOOT_LIMIT, |proxy| {
                proxy.is_none()
            })
            .await;
        assert!(world.lab.domains().iter().all(|(name, _)| *name != vms[0]));
        assert!(volumes_of(&world.lab, &vms[0]).is_empty());
        assert_eq!(world.lab.domains().len(), 2);
        replica.stop().await;
    }

    /// Issue 34, the Service on real guest addresses (pvesim's are loopback, which the API
    /// server refuses in an EndpointSlice): a pool of two on the lab, health-checked at the
    /// guest's own listener, publishes both guests' addresses. One guest's link is cut: its
    /// Proxy turns unready at the first failed probe, and its address leaves the slice within
    /// one probe period of that, while the other guest's address stays listed throughout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_pools_endpoint_slice_lists_its_guests_and_drops_a_cut_one_within_a_probe_period() {
        const POOL: &str = "edge";
        const PERIOD: u64 = 3;
        let world = World::start().await;
        let replica = Replica::start(&world, "libvirt-pool").await;
        let pool = json!({
            "apiVersion": "egress-operator.io/v1alpha1", "kind": "ProxyPool",
            "metadata": {"name": POOL, "namespace": NAMESPACE},
            "spec": {"replicas": 2, "template": {"spec": {
                "providerConfigRef": PC,
                "userData": {"inline": "#cloud-config\n"},
                "healthCheck": {
                    "tcp": {"port": 3128}, "periodSeconds": PERIOD, "timeoutSeconds": 1,
                    "failureThreshold": 1, "startupSeconds": BOOT_LIMIT.as_secs(),
                },
            }}},
        });
        Api::<ProxyPool>::namespaced(world.client.clone(), NAMESPACE)
            .patch(POOL, &PatchParams::apply("test"), &Patch::Apply(pool))
            .await
            .unwrap();

        let slices = Api::<EndpointSlice>::namespaced(world.client.clone(), NAMESPACE);
        let listed = |slice: &EndpointSlice| -> BTreeSet<String> {
            let endpoints = slice.endpoints.iter().flatten();
            endpoints.flat_map(|e| e.addresses.clone()).collect()
        };
        let members = Api::<Proxy>::namespaced(world.client.clone(), NAMESPACE);
        let by_pool = ListParams::default().labels(&format!("{POOL_LABEL}={POOL}"));
        let end = Instant::now() + BOOT_LIMIT;
        let (members_then, addresses) = loop {
            let members_now = members.list(&by_pool).await.unwrap().items;
            let published = slices.get_opt(POOL).await.unwrap().map(|s| listed(&s));
            let addresses: BTreeSet<String> = members_now.iter().filter_map(address).collect();
            if members_now.len() == 2
                && addresses.len() == 2
                && published == Some(addresses.clone())
            {
                break (members_now, addresses);
            }
            assert!(
                Instant::now() < end,
                "never both published: {published:?} {addresses:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert!(
            addresses.iter().all(|a| !a.starts_with("127.")),
            "the lab's guests are not on loopback: {addresses:?}"
        );

        // From here on, when the test sees each slice and each change of the cut member.
        let cut = members_then[0].clone();
        let (cut_name, cut_address) = (cut.name_any(), address(&cut).unwrap());
        let kept_address = address(&members_then[1]).unwrap();
        let seen_slices = record(slices.clone(), &format!("metadata.name={POOL}"), listed);
        let seen_cut = record(
            members.clone(),
            &format!("metadata.name={cut_name}"),
            |p: &Proxy| (ready(p), address(p)),
        );
        let vm = vm_name(Some(&cut)).expect("a VM name");
        world.lab.set_link(&vm, false);

        let end = Instant::now() + BOOT_LIMIT;
        let (unready_at, dropped_at) = loop {
            let unready = seen_cut
                .0
                .lock()
                .unwrap()
                .iter()
                .find(|(_, (ready, _))| !ready)
                .map(|(at, _)| *at);
            let dropped = seen_slices
                .0
                .lock()
                .unwrap()
                .iter()
                .find(|(_, listed)| !listed.contains(&cut_address))
                .map(|(at, _)| *at);
            if let (Some(unready), Some(dropped)) = (unready, dropped) {
                break (unready, dropped);
            }
            // Fails within a few periods of the unready verdict, not at the boot limit: a
            // slice that keeps an unready guest would be seen only once recovery replaced it.
            let listed_too_long =
                unready.is_some_and(|at| at.elapsed() > 3 * Duration::from_secs(PERIOD));
            assert!(
                Instant::now() < end && !listed_too_long,
                "{cut_name} never dropped: unready at {unready:?}, dropped at {dropped:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let lag = dropped_at.saturating_duration_since(unready_at);
        assert!(
            lag <= Duration::from_secs(PERIOD),
            "the slice dropped {cut_address} {lag:?} after its Proxy turned unready"
        );
        // Dropped for its verdict: the member still stood, its address in its status.
        let cut_seen = seen_cut.0.lock().unwrap().clone();
        let cut_then = cut_seen.iter().rev().find(|(at, _)| *at <= dropped_at);
        assert!(
            cut_then.is_some_and(|(_, (_, address))| address.as_ref() == Some(&cut_address)),
            "{cut_name} still held {cut_address} when the slice dropped it: {cut_seen:?}"
        );
        let slices_seen = seen_slices.0.lock().unwrap().clone();
        assert!(
            slices_seen
                .iter()
                .all(|(_, listed)| listed.contains(&kept_address)),
            "the healthy guest {kept_address} stayed listed: {slices_seen:?}"
        );
        seen_slices.1.abort();
        seen_cut.1.abort();
        replica.stop().await;
    }

    /// A member's publishable address: the first IPv4 one of its status.
    fn address(proxy: &Proxy) -> Option<String> {
        let status = proxy.status.as_ref()?;
        (status.addresses.iter())
            .find(|a| a.parse::<std::net::Ipv4Addr>().is_ok())
            .cloned()
    }

    /// Whether a Proxy is Ready and not being deleted.
    fn ready(proxy: &Proxy) -> bool {
        let conditions = proxy.status.as_ref().map(|status| &status.conditions[..]);
        proxy.metadata.deletion_timestamp.is_none()
            && condition(conditions.unwrap_or_default(), conditions::READY)
                .is_some_and(|ready| ready.status == "True")
    }

    /// Every state of the objects `fields` selects that the watch delivers from now on, as
    /// `view` sees it, with when it arrived; a deleted object is seen as its last state's
    /// default (`view` of nothing).
    #[allow(clippy::type_complexity)]
    fn record<K, V>(
        api: Api<K>,
        fields: &str,
        view: impl Fn(&K) -> V + Send + 'static,
    ) -> (Arc<Mutex<Vec<(Instant, V)>>>, tokio::task::JoinHandle<()>)
    where
        K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
        V: Default + Send + 'static,
    {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stream = watcher::watcher(api, watcher::Config::default().fields(fields));
        let recorded = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let state = match event {
                    Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                        view(&object)
                    }
                    Ok(watcher::Event::Delete(_)) => V::default(),
                    _ => continue,
                };
                recorded.lock().unwrap().push((Instant::now(), state));
            }
        });
        (seen, task)
    }

    /// The operator killed at each libvirt capability call of a create (the call traps as if the
    /// host had died there, and the replica stops), then a fresh one takes over: one domain, one
    /// disk and one seed per Proxy, whatever call it died at.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_create_killed_at_each_capability_call_ends_with_one_domain_disk_and_seed() {
        let world = World::start().await;
        let mut cut = 0;
        loop {
            let name = format!("k{cut}");
            let replica = Replica::start(&world, "dying").await;
            world.until_provider_ready().await;
            let libvirt = Arc::clone(&replica.operator.capabilities.libvirt);
            libvirt.cut_after(Some(cut));
            world.create_proxy(&name).await;
            let proxy = world
                .until(&name, "made or cut", BOOT_LIMIT, |proxy| {
                    libvirt.cut_fired() || vm_name(proxy).is_some() && super::provisioned(proxy)
                })
                .await;
            // A create that answered was not cut (a later get may have been).
            let finished = super::provisioned(proxy.as_ref());
            replica.stop().await;
            if !finished {
                // A host that dies at the cut records nothing of the call it was making: the
                // replica here lived on long enough to write the trap into the status.
                world
                    .proxies()
                    .patch_status(
                        &name,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(serde_json::json!({"status": null})),
                    )
                    .await
                    .unwrap();
            }
            let fresh = Replica::start(&world, "fresh").await;
            let proxy = world
                .until(
                    &name,
                    "made by the fresh operator",
                    BOOT_LIMIT,
                    super::provisioned,
                )
                .await;
            let vm = vm_name(proxy.as_ref()).expect("a VM name");
            let named: Vec<_> = world
                .lab
                .domains()
                .into_iter()
                .filter(|(domain, _)| *domain == vm)
                .collect();
            assert_eq!(named.len(), 1, "cut after {cut} calls: {named:?}");
            assert_eq!(
                volumes_of(&world.lab, &vm),
                std::collections::BTreeSet::from([format!("{vm}.qcow2"), format!("{vm}-seed.iso")]),
                "cut after {cut} calls"
            );
            assert!(
                !world
                    .lab
                    .pool
                    .volumes()
                    .iter()
                    .any(|volume| volume.ends_with(".importing")),
                "cut after {cut} calls: {:?}",
                world.lab.pool.volumes()
            );
            world
                .proxies()
                .delete(&name, &DeleteParams::default())
                .await
                .unwrap();
            world
                .until(&name, "gone", BOOT_LIMIT, |proxy| proxy.is_none())
                .await;
            fresh.stop().await;
            if finished {
                assert!(
                    cut > 5,
                    "the sweep ended after {cut} cuts: too few to be a create"
                );
                break;
            }
            cut += 1;
        }
    }
}

/// Whether a Proxy's VM exists and was started: its create answered.
fn provisioned(proxy: Option<&egress_operator::crd::Proxy>) -> bool {
    proxy
        .and_then(|proxy| proxy.status.as_ref())
        .is_some_and(|status| status.provider_id.is_some())
}

/// `egress-operator conformance` on `libvirt.wasm` over the lab, as a provider author runs it
/// (a grants file with files, no Secrets): the rules that need pvesim's faults skip with their
/// reason, every other one passes, and the run leaves no domain behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_passes_every_rule_that_applies_on_libvirtd() {
    use egress_conformance::{self as conformance, Options, Outcome};
    let lab = Lab::start(None).await;
    let files = tempfile::tempdir().unwrap();
    let ca = files.path().join("ca.pem");
    lab.ca.write_pem(&ca);
    let grants = json!({"grants": {"libvirt": {"libvirt": lab.grant(json!({"caFile": ca}))}}});
    let report = conformance::run(&Options {
        file: component(),
        config: lab.provider_config().to_string(),
        grants: grants.to_string(),
        identity: None,
        only: None,
        runtime: egress_runtime::RuntimeConfig::default().cache_dir(Some(
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("libvirt-conformance-cache"),
        )),
        taping: None,
    })
    .await
    .expect("the suite runs");
    println!("{}", report.text());
    assert_eq!(report.failed(), 0, "{}", report.text());
    // No HTTP grant: no test-backend hook to stop a domain with, no HTTP broker to fault.
    let skipped: Vec<&str> = report
        .rules
        .iter()
        .filter(|rule| {
            matches!(&rule.outcome, Outcome::Skip(why)
                if why.contains("needs the test-backend hook POST /_egress-test/stop")
                    || why.contains("faults are injected at the HTTP broker"))
        })
        .map(|rule| rule.id)
        .collect();
    assert_eq!(
        skipped,
        [
            "create.starts-stopped",
            "faults.server-error-transient",
            "faults.lock-transient",
            "faults.check-hung-endpoint"
        ],
        "{}",
        report.text()
    );
    assert_eq!(report.skipped(), skipped.len(), "{}", report.text());
    assert!(report.passed() >= 10, "{}", report.text());
    assert!(lab.domains().is_empty(), "{:?}", lab.domains());
}
