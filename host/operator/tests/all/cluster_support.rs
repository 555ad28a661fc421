//! A real Kubernetes control plane (`testdata/controlplane`: etcd and kube-apiserver) set up as
//! `kubectl apply -k deploy/` sets up a cluster for the operator: the CRDs of `deploy/crds/`, the
//! namespace and the RBAC of `deploy/`. The tests act as an admin; the operator acts as the
//! ServiceAccount `deploy/rbac.yaml` binds, never as an admin, so every test also proves the role
//! is enough.

// Each test binary that includes this module uses a part of it.

use std::path::PathBuf;

use controlplane::ControlPlane;
use kube::Client;

/// The operator's namespace and ServiceAccount, as `deploy/` names them.
pub const OPERATOR_NAMESPACE: &str = "egress-operator";
pub const SERVICE_ACCOUNT: &str = "egress-operator";

pub fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// A control plane with the operator's CRDs, namespace and RBAC.
pub struct Cluster {
    pub plane: ControlPlane,
    /// An admin's client: what the tests act with.
    pub admin: Client,
}

impl Cluster {
    /// With `deploy/rbac.yaml` as it is.
    pub async fn start() -> Cluster {
        let rbac = std::fs::read_to_string(deploy().join("rbac.yaml")).unwrap();
        Cluster::start_with_rbac(&rbac).await
    }

    /// With `rbac` (a changed copy of `deploy/rbac.yaml`) in place of it.
    pub async fn start_with_rbac(rbac: &str) -> Cluster {
        let plane = ControlPlane::start()
            .await
            .expect("the control plane starts");
        let files = tempfile::tempdir().unwrap();
        let rbac_file = files.path().join("rbac.yaml");
        std::fs::write(&rbac_file, rbac).unwrap();
        let deploy = deploy();
        let path = |name: &str| deploy.join(name).display().to_string();
        plane
            .kubectl_ok(&[
                "apply",
                "--server-side",
                "-f",
                &path("crds"),
                "-f",
                &path("namespace.yaml"),
                "-f",
                rbac_file.to_str().unwrap(),
            ])
            .await;
        plane
            .kubectl_ok(&[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/proxies.egress-operator.io",
                "crd/providerconfigs.egress-operator.io",
                "crd/proxypools.egress-operator.io",
            ])
            .await;
        let admin = plane.client();
        Cluster { plane, admin }
    }

    /// A client as the operator's ServiceAccount (a token from a TokenRequest).
    pub async fn operator_client(&self) -> Client {
        let token = self.operator_token().await;
        self.plane.client_with_token(&token).await.unwrap()
    }

    /// A token of the operator's ServiceAccount.
    pub async fn operator_token(&self) -> String {
        self.plane
            .service_account_token(OPERATOR_NAMESPACE, SERVICE_ACCOUNT)
            .await
            .expect("a token for the operator's ServiceAccount")
    }
}
