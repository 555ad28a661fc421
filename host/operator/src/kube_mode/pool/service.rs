//! A pool's Service and EndpointSlice ([`crate::pool::publish`]) applied on each pass. A
//! template without a health check has no port to publish: no Service, and `Serving=False`
//! (`NoHealthCheck`) says so. A Service of the pool's name that the pool does not own is left
//! alone (`ServiceNameTaken`).

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};

use super::{controlled_by, owner};
use crate::conditions;
use crate::crd::{FIELD_MANAGER, Proxy, ProxyPool};
use crate::kube_mode::{Context, Error};
use crate::pool::publish::{self, SERVING};

/// The `Serving` condition a pass found.
pub struct Serving {
    ok: bool,
    reason: &'static str,
    message: String,
}

impl Serving {
    /// The Service or EndpointSlice could not be written: why.
    pub fn failed(error: &Error) -> Serving {
        let message = format!("the Service could not be published: {error}");
        Serving {
            ok: false,
            reason: "PublishFailed",
            message,
        }
    }

    /// Set it in a pool's `conditions`, keeping its transition time while its status holds.
    pub fn set(&self, conditions: &mut Vec<Condition>, generation: Option<i64>) {
        let now = crate::now();
        let (ok, reason, message) = (self.ok, self.reason, &self.message);
        conditions::set_condition(conditions, SERVING, ok, reason, message, generation, &now);
    }
}

/// Bring the pool's Service and EndpointSlice in step with its `members`.
pub async fn publish(
    context: &Context,
    pool: &ProxyPool,
    members: &[Proxy],
) -> Result<Serving, Error> {
    let Some(port) = publish::service_port(pool) else {
        unpublish(context, pool).await?;
        return Ok(Serving {
            ok: false,
            reason: "NoHealthCheck",
            message: "the template has no health check, so no port to publish: no Service".into(),
        });
    };
    let (services, slices) = apis(context, pool);
    let (name, uid) = (pool.name_any(), pool.uid().ok_or(Error::Unnamed("uid"))?);
    if let Some(taken) = services.get_opt(&name).await?
        && !controlled_by(&taken.metadata, &uid)
    {
        return Ok(Serving {
            ok: false,
            reason: "ServiceNameTaken",
            message: format!("Service {name} exists and is not the pool's: nothing published"),
        });
    }
    let owner = serde_json::to_value(owner(pool)).unwrap_or_default();
    let published = publish::published(&name, &owner, port, members);
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    (services.patch(&name, &apply, &Patch::Apply(published.service))).await?;
    (slices.patch(&name, &apply, &Patch::Apply(published.slice))).await?;
    let (listed, ready) = (published.listed, published.ready);
    Ok(Serving {
        ok: true,
        reason: "EndpointsPublished",
        message: format!("Service {name} lists {listed} of {ready} Ready members on port {port}"),
    })
}

/// Delete the pool's Service and EndpointSlice, if they are the pool's.
pub async fn unpublish(context: &Context, pool: &ProxyPool) -> Result<(), Error> {
    let (services, slices) = apis(context, pool);
    let (name, uid) = (pool.name_any(), pool.uid().ok_or(Error::Unnamed("uid"))?);
    delete_owned(&services, &name, &uid).await?;
    delete_owned(&slices, &name, &uid).await
}

fn apis(context: &Context, pool: &ProxyPool) -> (Api<Service>, Api<EndpointSlice>) {
    let namespace = pool.namespace().unwrap_or_default();
    let client = &context.client;
    (
        Api::namespaced(client.clone(), &namespace),
        Api::namespaced(client.clone(), &namespace),
    )
}

/// Delete object `name` if the object of `uid` controls it.
async fn delete_owned<K>(api: &Api<K>, name: &str, uid: &str) -> Result<(), Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let Some(object) = api.get_opt(name).await? else {
        return Ok(());
    };
    if !controlled_by(object.meta(), uid) {
        return Ok(());
    }
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error.into()),
    }
}
