//! Host-side domain types for the provider contract.
//!
//! The rest of the host (and the CLI, which prints these as JSON) uses these types, never the
//! `bindgen!` output: each served contract version converts into them in its own module
//! (`wit/since_v0_1_0.rs`, `wit/since_v0_2_0.rs`), so a new contract version does not ripple
//! through the host.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where a proxy VM is in its life, as the hypervisor reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum VmState {
    /// Being cloned, booted, or not yet reporting an address.
    Provisioning,
    /// Running and reachable at its addresses.
    Running,
    /// Stopped: a start (the provider's `create`) makes it running again.
    Stopped,
    /// Broken beyond repair: the operator replaces it.
    Failed,
    /// Paused or hibernated by a person: runs again when resumed; a start cannot fix it
    /// (contract 0.2.0 on; 0.1.0 providers say `stopped`).
    Paused,
}

impl VmState {
    /// The contract's word for it (`provisioning`, `running`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            VmState::Provisioning => "provisioning",
            VmState::Running => "running",
            VmState::Stopped => "stopped",
            VmState::Failed => "failed",
            VmState::Paused => "paused",
        }
    }
}

/// What `list-by-tag` found: the VMs on the hypervisors that answered, and the hypervisors that
/// did not (whose VMs are unknown, never gone). A 0.1.0 provider answers all or fails, so its
/// `unanswered` is empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Listing {
    /// The VMs carrying the tag on the hypervisors that answered.
    pub vms: Vec<Vm>,
    /// The hypervisors that did not answer, in the provider's own names.
    #[serde(default)]
    pub unanswered: Vec<String>,
}

/// A key/value label a provider stores on the VM so it can be found again.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tag {
    /// The label's key.
    pub key: String,
    /// The label's value.
    pub value: String,
}

/// What the operator asks a provider to create.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateRequest {
    /// The proxy's name; create is idempotent by this name.
    pub name: String,
    /// The Kubernetes UID of the Proxy, written on the VM as its ownership mark.
    pub uid: String,
    /// Labels to store on the VM, for list-by-tag.
    #[serde(default)]
    pub tags: Vec<Tag>,
    /// Cloud-init user-data for the VM's first boot.
    #[serde(default)]
    pub user_data: String,
    /// The provider's own configuration, as JSON.
    pub config: String,
    /// Where the VM should run, for a pool that spreads its VMs across hosts; `None` for a Proxy
    /// of its own. A 0.1.0 provider never sees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

/// A placement request: keep a new VM off the hosts its siblings use.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Hosts (the provider's names: Proxmox nodes, libvirt connections) the VM should not run on.
    #[serde(default)]
    pub avoid_hosts: Vec<String>,
    /// True: no VM rather than one on an avoided host (the provider answers `quota-exceeded`).
    #[serde(default)]
    pub required: bool,
}

/// One VM as the provider sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Vm {
    /// The provider's own ID for the VM (for example `pve1/123`).
    pub provider_id: String,
    /// The VM's name on the hypervisor.
    pub name: String,
    /// Where the VM is in its life.
    pub state: VmState,
    /// Addresses the proxy answers on, most preferred first; empty until known.
    pub addresses: Vec<String>,
    /// When create made the VM (RFC 3339), if the VM carries the mark.
    pub created_at: Option<String>,
    /// The Proxy UID from the VM's ownership mark; empty when the mark has no UID.
    pub uid: String,
    /// The host the VM runs on (a Proxmox node, a libvirt connection), when the provider says;
    /// always `None` from a 0.1.0 provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// How a failure should be handled by the caller: the retry class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ErrorClass {
    /// Retry later with backoff.
    Transient,
    /// Retrying cannot help until a person changes something.
    Permanent,
    /// The VM does not exist.
    NotFound,
    /// The hypervisor is out of room: retry much later.
    QuotaExceeded,
}

impl ErrorClass {
    /// The class as a stable lowercase label (`transient`, `not-found`, …) for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Transient => "transient",
            ErrorClass::Permanent => "permanent",
            ErrorClass::NotFound => "not-found",
            ErrorClass::QuotaExceeded => "quota-exceeded",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an operation failed, as the provider reports it. The class tells the operator what to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "class", content = "message")]
pub enum ProviderError {
    /// Retry later with backoff: a timeout, a lock, a 5xx, an unreachable host.
    Transient(String),
    /// Retrying cannot help until a person changes something.
    Permanent(String),
    /// The VM does not exist (delete treats this as done).
    NotFound(String),
    /// The hypervisor is out of room.
    QuotaExceeded(String),
}

impl ProviderError {
    /// The retry class of this error.
    pub fn class(&self) -> ErrorClass {
        match self {
            ProviderError::Transient(_) => ErrorClass::Transient,
            ProviderError::Permanent(_) => ErrorClass::Permanent,
            ProviderError::NotFound(_) => ErrorClass::NotFound,
            ProviderError::QuotaExceeded(_) => ErrorClass::QuotaExceeded,
        }
    }

    /// The provider's message.
    pub fn message(&self) -> &str {
        match self {
            ProviderError::Transient(message)
            | ProviderError::Permanent(message)
            | ProviderError::NotFound(message)
            | ProviderError::QuotaExceeded(message) => message,
        }
    }
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.class(), self.message())
    }
}

impl std::error::Error for ProviderError {}

/// A host capability a contract 0.1.0 component declares it needs in `describe` (its closed
/// `enum capability`). Since 0.2.0 the host reads what a provider needs from its imports
/// ([`Provider::capabilities`](crate::Provider::capabilities)); a 0.1.0 declaration is only
/// compared with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DeclaredCapability {
    /// Outgoing HTTP through the host's egress broker.
    Http,
    /// The host's libvirt interface.
    Libvirt,
}

impl DeclaredCapability {
    /// The name of the host capability that serves it (`http`, `libvirt`), as
    /// [`crate::Capability::name`] says it.
    pub fn name(self) -> &'static str {
        match self {
            DeclaredCapability::Http => "http",
            DeclaredCapability::Libvirt => "libvirt",
        }
    }
}

/// What a provider says about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Description {
    /// The provider's name, as Proxy resources name it (for example `proxmox`).
    pub name: String,
    /// The provider's own version (semver).
    pub version: String,
    /// The contract version the provider was built against (`0.1.0`, `0.2.0`).
    pub contract_version: String,
    /// A JSON Schema for the provider's configuration.
    pub config_schema: String,
    /// What a 0.1.0 component declares it needs; empty from contract 0.2.0 on, which dropped
    /// the list. The host goes by the imports: see
    /// [`Provider::capabilities`](crate::Provider::capabilities).
    pub capabilities: Vec<DeclaredCapability>,
}

/// Machine-readable reason a check did not pass. Serialized in kebab-case
/// (`credentials-unavailable`), as the WIT, the errors and the docs spell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckReason {
    /// Everything the provider needs answered.
    Ok,
    /// The hypervisor could not be reached.
    Unreachable,
    /// The credentials were refused.
    Unauthorized,
    /// The credentials lack a privilege the provider needs.
    Forbidden,
    /// The hypervisor's TLS certificate did not verify.
    CertificateInvalid,
    /// The host could not read the credentials it injects.
    CredentialsUnavailable,
    /// The configuration is wrong.
    Misconfigured,
    /// Anything else; the message says what.
    Other,
}

impl CheckReason {
    /// The reason as the contract spells it (`certificate-invalid`).
    pub fn as_str(self) -> &'static str {
        match self {
            CheckReason::Ok => "ok",
            CheckReason::Unreachable => "unreachable",
            CheckReason::Unauthorized => "unauthorized",
            CheckReason::Forbidden => "forbidden",
            CheckReason::CertificateInvalid => "certificate-invalid",
            CheckReason::CredentialsUnavailable => "credentials-unavailable",
            CheckReason::Misconfigured => "misconfigured",
            CheckReason::Other => "other",
        }
    }
}

/// The outcome of `check`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckResult {
    /// Why the check passed or not.
    pub reason: CheckReason,
    /// Human-readable detail.
    pub message: String,
}

/// One operation of the provider contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Operation {
    /// `describe`
    Describe,
    /// `validate-config`
    ValidateConfig,
    /// `create`
    Create,
    /// `get`
    Get,
    /// `delete`
    Delete,
    /// `list-by-tag`
    ListByTag,
    /// `check`
    Check,
}

impl Operation {
    /// Every operation, in contract order.
    pub const ALL: [Operation; 7] = [
        Operation::Describe,
        Operation::ValidateConfig,
        Operation::Create,
        Operation::Get,
        Operation::Delete,
        Operation::ListByTag,
        Operation::Check,
    ];

    /// The operation's WIT name (`describe`, `validate-config`, `list-by-tag`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Describe => "describe",
            Operation::ValidateConfig => "validate-config",
            Operation::Create => "create",
            Operation::Get => "get",
            Operation::Delete => "delete",
            Operation::ListByTag => "list-by-tag",
            Operation::Check => "check",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An operation name that is not part of the contract.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown operation `{0}`: expected one of describe, validate-config, create, get, delete, list-by-tag, check"
)]
pub struct UnknownOperation(pub String);

impl FromStr for Operation {
    type Err = UnknownOperation;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Operation::ALL
            .into_iter()
            .find(|operation| operation.as_str() == name)
            .ok_or_else(|| UnknownOperation(name.to_owned()))
    }
}

/// One call's inputs: the operation and its arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "operation",
    rename_all = "kebab-case",
    rename_all_fields = "camelCase"
)]
pub enum Request {
    /// Who the provider is and what it needs.
    Describe,
    /// Check a configuration without touching the hypervisor.
    ValidateConfig {
        /// The provider's configuration (JSON).
        config: String,
    },
    /// Make sure a VM exists and is starting.
    Create {
        /// What to create.
        request: CreateRequest,
    },
    /// Read one VM by its provider ID.
    Get {
        /// The provider's configuration (JSON).
        config: String,
        /// The VM's provider ID.
        provider_id: String,
    },
    /// Remove a VM and everything create made for it.
    Delete {
        /// The provider's configuration (JSON).
        config: String,
        /// The VM's provider ID.
        provider_id: String,
    },
    /// Every VM carrying the tag `key=value`.
    ListByTag {
        /// The provider's configuration (JSON).
        config: String,
        /// The tag's key.
        key: String,
        /// The tag's value.
        value: String,
    },
    /// Can the provider reach and use its hypervisor?
    Check {
        /// The provider's configuration (JSON).
        config: String,
    },
}

impl Request {
    /// The operation this request runs.
    pub fn operation(&self) -> Operation {
        match self {
            Request::Describe => Operation::Describe,
            Request::ValidateConfig { .. } => Operation::ValidateConfig,
            Request::Create { .. } => Operation::Create,
            Request::Get { .. } => Operation::Get,
            Request::Delete { .. } => Operation::Delete,
            Request::ListByTag { .. } => Operation::ListByTag,
            Request::Check { .. } => Operation::Check,
        }
    }
}

/// One call's successful output. A provider's own failure is `CallError::Provider`, not a
/// response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "operation", content = "result", rename_all = "kebab-case")]
pub enum Response {
    /// The provider's description.
    Describe(Description),
    /// The configuration is valid.
    ValidateConfig,
    /// The VM that exists now.
    Create(Vm),
    /// The VM as it is.
    Get(Vm),
    /// The VM is gone.
    Delete,
    /// The VMs carrying the tag, and the hypervisors that did not answer.
    ListByTag(Listing),
    /// The outcome of the check.
    Check(CheckResult),
}

impl Response {
    /// The operation this response answers.
    pub fn operation(&self) -> Operation {
        match self {
            Response::Describe(_) => Operation::Describe,
            Response::ValidateConfig => Operation::ValidateConfig,
            Response::Create(_) => Operation::Create,
            Response::Get(_) => Operation::Get,
            Response::Delete => Operation::Delete,
            Response::ListByTag(_) => Operation::ListByTag,
            Response::Check(_) => Operation::Check,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_reason_reads_as_its_serialized_name() {
        use CheckReason::*;
        let all = [Ok, Unreachable, Unauthorized, Forbidden, CertificateInvalid];
        let rest = [CredentialsUnavailable, Misconfigured, Other];
        for reason in all.into_iter().chain(rest) {
            assert_eq!(serde_json::json!(reason), reason.as_str());
        }
    }

    #[test]
    fn operation_names_round_trip_through_from_str() {
        for operation in Operation::ALL {
            assert_eq!(operation.as_str().parse::<Operation>(), Ok(operation));
        }
        assert_eq!("list-by-tag".parse::<Operation>(), Ok(Operation::ListByTag));
        let error = "listByTag".parse::<Operation>().unwrap_err();
        assert!(error.to_string().contains("`listByTag`"), "{error}");
    }

    #[test]
    fn request_json_is_tagged_by_operation_with_camel_case_fields() {
        let request = Request::Get {
            config: "{}".into(),
            provider_id: "pve1/100".into(),
        };
        let json = serde_json::to_value(&request).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"operation": "get", "config": "{}", "providerId": "pve1/100"})
        );
        assert_eq!(serde_json::from_value::<Request>(json).unwrap(), request);
        assert_eq!(request.operation(), Operation::Get);
    }

    #[test]
    fn response_json_carries_operation_and_result() {
        let response = Response::Check(CheckResult {
            reason: CheckReason::CertificateInvalid,
            message: "self-signed".into(),
        });
        let json = serde_json::to_value(&response).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"operation": "check", "result": {"reason": "certificate-invalid", "message": "self-signed"}})
        );
        assert_eq!(
            serde_json::to_value(Response::Delete).unwrap(),
            serde_json::json!({"operation": "delete"})
        );
    }

    #[test]
    fn provider_error_class_and_display() {
        let error = ProviderError::QuotaExceeded("no room on pve1".into());
        assert_eq!(error.class(), ErrorClass::QuotaExceeded);
        assert_eq!(error.to_string(), "quota-exceeded: no room on pve1");
        assert_eq!(
            ProviderError::NotFound("x".into()).class().as_str(),
            "not-found"
        );
    }
}
