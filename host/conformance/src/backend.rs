//! The backend, when it is `pvesim`: its admin API (`/_sim/…`, see testdata/pvesim) reached
//! through the broker under the provider's own grant, so the suite never reads the credential: the
//! broker injects it, verifies TLS, and the simulator authenticates the admin API with the same
//! token as its Proxmox API.

use bytes::Bytes;
use egress_capability_http::Broker;
use egress_runtime::Digest;
use egress_runtime::egress::{CallSite, Egress, EgressBody};
use http_body_util::{BodyExt, Full};
use serde_json::Value;

/// The label the broker logs and counts the suite's own requests under.
const OPERATION: &str = "conformance";

/// A `pvesim` behind one of the grant's origins.
pub(crate) struct Pvesim {
    broker: Broker,
    site: CallSite,
    origin: String,
}

impl Pvesim {
    /// The first origin that answers `GET /_sim/info` as pvesim, if any.
    pub(crate) async fn detect(
        broker: &Broker,
        identity: &str,
        digest: Digest,
        origins: &[String],
    ) -> Option<Pvesim> {
        for origin in origins {
            let candidate = Pvesim {
                broker: broker.clone(),
                site: CallSite {
                    provider: identity.into(),
                    digest: digest.hex().into(),
                    operation: OPERATION,
                },
                origin: origin.trim_end_matches('/').to_owned(),
            };
            if let Ok(info) = candidate.request("GET", "info", "").await
                && info["simulator"] == "pvesim"
            {
                return Some(candidate);
            }
        }
        None
    }

    /// Adds fault rules, in pvesim's `--fault` syntax.
    pub(crate) async fn add_faults(&self, rules: &[&str]) -> Result<(), String> {
        self.request("POST", "faults", &rules.join("\n"))
            .await
            .map(drop)
    }

    /// Removes every fault rule.
    pub(crate) async fn clear_faults(&self) -> Result<(), String> {
        self.request("DELETE", "faults", "").await.map(drop)
    }

    /// How many QEMU VMs are named `name`.
    pub(crate) async fn vms_named(&self, name: &str) -> Result<usize, String> {
        let vms = self.request("GET", "vms", "").await?;
        Ok(vms
            .as_array()
            .map_or(0, |vms| vms.iter().filter(|vm| vm["name"] == name).count()))
    }

    /// Stops the QEMU VM named `name` as `qm stop` on the node would (outside the provider's
    /// API), so the suite can see what the provider makes of a VM of its own that stopped.
    pub(crate) async fn stop_vm_named(&self, name: &str) -> Result<(), String> {
        let vms = self.request("GET", "vms", "").await?;
        let vmid = vms
            .as_array()
            .and_then(|vms| vms.iter().find(|vm| vm["name"] == name))
            .and_then(|vm| vm["vmid"].as_u64())
            .ok_or_else(|| format!("pvesim holds no VM named {name}"))?;
        self.request("POST", &format!("vms/{vmid}/stop"), "")
            .await
            .map(drop)
    }

    /// One admin request; the answer's `data`.
    async fn request(&self, method: &str, route: &str, body: &str) -> Result<Value, String> {
        let uri = format!("{}/_sim/{route}", self.origin);
        let authority = uri
            .parse::<http::Uri>()
            .ok()
            .and_then(|uri| uri.authority().map(|a| a.as_str().to_owned()))
            .unwrap_or_default();
        let body: EgressBody = Full::new(Bytes::from(body.to_owned()))
            .map_err(|never| match never {})
            .boxed_unsync();
        let request = http::Request::builder()
            .method(method)
            .uri(&uri)
            .header(http::header::HOST, authority)
            .body(body)
            .map_err(|error| format!("{method} {uri}: {error}"))?;
        let response = self
            .broker
            .send(&self.site, request, None)
            .await
            .map_err(|error| format!("{method} {uri}: {error}"))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|error| format!("{method} {uri}: {error}"))?
            .to_bytes();
        if !status.is_success() {
            return Err(format!(
                "{method} {uri} answered {status}: {}",
                String::from_utf8_lossy(&body)
            ));
        }
        let answer: Value = serde_json::from_slice(&body)
            .map_err(|error| format!("{method} {uri}: not JSON: {error}"))?;
        Ok(answer["data"].clone())
    }
}
