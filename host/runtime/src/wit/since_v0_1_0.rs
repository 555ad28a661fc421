//! Contract `egress:provider@0.1.0`: bindings and conversions to the host's domain types.

use crate::types;

/// The contract version these bindings implement.
pub(crate) const VERSION: &str = "0.1.0";

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "provider-world",
    exports: { default: async },
    with: {
        // Reuse wasmtime's own WASI bindings so their host implementations serve our world.
        "wasi:http": wasmtime_wasi_http::p2::bindings::http,
        "wasi:io": wasmtime_wasi::p2::bindings::io,
        "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
        "wasi:random": wasmtime_wasi::p2::bindings::random,
    },
});

use egress::provider::types as wit;

/// The name this version gives the contract's `log` interface.
const LOG_INTERFACE: &str = "egress:provider/log@0.1.0";

/// Add this version's own host interface (`log`) to `linker`. WASI comes from wasmtime-wasi.
///
/// `log` is defined by hand (`crate::log`) rather than through the bindings: the bindings would
/// lift a guest's whole message into the host before the host could cut it.
pub(crate) fn add_to_linker(
    linker: &mut wasmtime::component::Linker<crate::state::HostState>,
) -> wasmtime::Result<()> {
    crate::log::add_to_linker(linker, LOG_INTERFACE)
}

/// Run `request` on an instance of this version's bindings.
pub(crate) async fn call(
    bindings: &ProviderWorld,
    store: &mut wasmtime::Store<crate::state::HostState>,
    request: types::Request,
) -> wasmtime::Result<Result<types::Response, types::ProviderError>> {
    use types::{Request, Response};
    let guest = bindings.egress_provider_provider();
    Ok(match request {
        Request::Describe => Ok(Response::Describe(
            guest.call_describe(&mut *store).await?.into(),
        )),
        Request::ValidateConfig { config } => guest
            .call_validate_config(&mut *store, &config)
            .await?
            .map(|()| Response::ValidateConfig)
            .map_err(Into::into),
        Request::Create { request } => guest
            .call_create(&mut *store, &request.into())
            .await?
            .map(|instance| Response::Create(instance.into()))
            .map_err(Into::into),
        Request::Get {
            config,
            provider_id,
        } => guest
            .call_get(&mut *store, &config, &provider_id)
            .await?
            .map(|instance| Response::Get(instance.into()))
            .map_err(Into::into),
        Request::Delete {
            config,
            provider_id,
        } => guest
            .call_delete(&mut *store, &config, &provider_id)
            .await?
            .map(|()| Response::Delete)
            .map_err(Into::into),
        Request::ListByTag { config, key, value } => guest
            .call_list_by_tag(&mut *store, &config, &key, &value)
            .await?
            .map(|instances| Response::ListByTag(instances.into_iter().map(Into::into).collect()))
            .map_err(Into::into),
        Request::Check { config } => Ok(Response::Check(
            guest.call_check(&mut *store, &config).await?.into(),
        )),
    })
}

impl From<wit::InstanceState> for types::InstanceState {
    fn from(state: wit::InstanceState) -> Self {
        match state {
            wit::InstanceState::Provisioning => types::InstanceState::Provisioning,
            wit::InstanceState::Running => types::InstanceState::Running,
            wit::InstanceState::Stopped => types::InstanceState::Stopped,
            wit::InstanceState::Failed => types::InstanceState::Failed,
        }
    }
}

impl From<types::Tag> for wit::Tag {
    fn from(tag: types::Tag) -> Self {
        wit::Tag {
            key: tag.key,
            value: tag.value,
        }
    }
}

impl From<types::CreateRequest> for wit::CreateRequest {
    fn from(request: types::CreateRequest) -> Self {
        wit::CreateRequest {
            name: request.name,
            uid: request.uid,
            tags: request.tags.into_iter().map(Into::into).collect(),
            user_data: request.user_data,
            config: request.config,
        }
    }
}

impl From<wit::Instance> for types::Instance {
    fn from(instance: wit::Instance) -> Self {
        types::Instance {
            provider_id: instance.provider_id,
            name: instance.name,
            state: instance.state.into(),
            addresses: instance.addresses,
            created_at: instance.created_at,
            uid: instance.uid,
        }
    }
}

impl From<wit::Error> for types::ProviderError {
    fn from(error: wit::Error) -> Self {
        match error {
            wit::Error::Transient(message) => types::ProviderError::Transient(message),
            wit::Error::Permanent(message) => types::ProviderError::Permanent(message),
            wit::Error::NotFound(message) => types::ProviderError::NotFound(message),
            wit::Error::QuotaExceeded(message) => types::ProviderError::QuotaExceeded(message),
        }
    }
}

impl From<wit::Capability> for types::Capability {
    fn from(capability: wit::Capability) -> Self {
        match capability {
            wit::Capability::Http => types::Capability::Http,
            wit::Capability::Libvirt => types::Capability::Libvirt,
        }
    }
}

impl From<wit::Description> for types::Description {
    fn from(description: wit::Description) -> Self {
        types::Description {
            name: description.name,
            version: description.version,
            contract_version: description.contract_version,
            config_schema: description.config_schema,
            capabilities: description
                .capabilities
                .into_iter()
                .map(Into::into)
                .collect(),
        }
    }
}

impl From<wit::CheckReason> for types::CheckReason {
    fn from(reason: wit::CheckReason) -> Self {
        match reason {
            wit::CheckReason::Ok => types::CheckReason::Ok,
            wit::CheckReason::Unreachable => types::CheckReason::Unreachable,
            wit::CheckReason::Unauthorized => types::CheckReason::Unauthorized,
            wit::CheckReason::Forbidden => types::CheckReason::Forbidden,
            wit::CheckReason::CertificateInvalid => types::CheckReason::CertificateInvalid,
            wit::CheckReason::CredentialsUnavailable => types::CheckReason::CredentialsUnavailable,
            wit::CheckReason::Misconfigured => types::CheckReason::Misconfigured,
            wit::CheckReason::Other => types::CheckReason::Other,
        }
    }
}

impl From<wit::CheckResult> for types::CheckResult {
    fn from(result: wit::CheckResult) -> Self {
        types::CheckResult {
            reason: result.reason.into(),
            message: result.message,
        }
    }
}
