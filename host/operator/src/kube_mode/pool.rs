//! The ProxyPool controller: each pass carries out the pool planner's plan
//! ([`crate::pool::plan`]) as local mode does, on the API server.
//!
//! - A pool's members are the Proxies labelled with its name **and** controlled by it (owner
//!   reference, `controller: true`, `blockOwnerDeletion`), listed by a quorum read on each pass:
//!   a Proxy made in the last pass is always seen, never made twice.
//! - A new member is named `<pool>-<template hash>-` plus the API server's suffix
//!   (`generateName`), carries the template's labels and annotations, the pool's two labels and,
//!   with `spread`, its placement request in the annotation [`PLACEMENT_ANNOTATION`](crate::pool_members::PLACEMENT_ANNOTATION) (JSON, the
//!   contract's `Placement`), which the Proxy controller passes to the provider.
//! - Deletes, creates and retries are Events on the pool (`ScaledIn`, `RolledOut`,
//!   `Recreated`, `Remediated`, `Created`, `Placing`); the plan's status is written by
//!   server-side apply on `/status` when it changed, its counts gauged per pool.
//! - The Service and EndpointSlice of [`service`] publish the Ready members.
//! - The finalizer [`POOL_FINALIZER`] deletes the members (their own finalizer deletes each
//!   VM), the Service and the EndpointSlice before the pool goes: no garbage collector is
//!   needed for a pool deleted mid-rollout to leave nothing behind.

pub mod service;

use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use tokio::sync::oneshot;

use super::{Context, Error, retry_after, write_status};
use crate::Note;
use crate::crd::{Proxy, ProxyPool, ProxyPoolStatus, member_labels, pool_selector};
use crate::metrics::PoolCounts;
use crate::pool::{self, Member};
use crate::pool_members::{PLACEMENT_ANNOTATION, placement_json, placement_of};

/// The finalizer that winds a pool's members, Service and EndpointSlice down before it goes.
pub const POOL_FINALIZER: &str = "egress-operator.io/members";
/// The longest a pool waits between passes: its progress deadline and remediation are clocks.
const LONGEST_PASS: Duration = Duration::from_secs(30);

/// Run the ProxyPool controller until `stop` fires and the passes in flight finish. A member's
/// change (its status included) brings its pool back.
pub async fn controller(context: Arc<Context>, stop: oneshot::Receiver<()>) {
    let client = context.client.clone();
    Controller::new(
        Api::<ProxyPool>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(Api::<Proxy>::all(client), watcher::Config::default())
    .graceful_shutdown_on(stop.map(|_| ()))
    .run(reconcile, error_policy, context)
    .for_each(|result| super::log_pass("pool", result))
    .await;
}

/// One pass over one pool, through the finalizer helper.
pub async fn reconcile(pool: Arc<ProxyPool>, context: Arc<Context>) -> Result<Action, Error> {
    let namespace = pool.namespace().ok_or(Error::Unnamed("namespace"))?;
    let api: Api<ProxyPool> = Api::namespaced(context.client.clone(), &namespace);
    finalizer(&api, POOL_FINALIZER, pool, |event| async {
        let pass = Pass {
            pools: &api,
            context: &context,
        };
        match event {
            Finalizer::Apply(pool) => pass.carry_out(&pool).await,
            Finalizer::Cleanup(pool) => pass.wind_down(&pool).await,
        }
    })
    .await
    .map_err(|error| Error::Finalizer(Box::new(error)))
}

/// Count the failure and come back ([`retry_after`]).
pub fn error_policy(_pool: Arc<ProxyPool>, error: &Error, context: Arc<Context>) -> Action {
    retry_after("pool", error, &context)
}

/// What one pass over a pool works with.
struct Pass<'a> {
    pools: &'a Api<ProxyPool>,
    context: &'a Context,
}

impl Pass<'_> {
    /// Plan the pool over its members and do what the plan says.
    async fn carry_out(&self, pool: &ProxyPool) -> Result<Action, Error> {
        let proxies = self.members(pool).await?;
        let members: Vec<Member> = proxies.iter().map(member).collect();
        let plan = pool::plan(pool, &members, &crate::now());
        for delete in &plan.delete {
            self.delete(pool, &delete.name, delete.reason.as_str())
                .await?;
        }
        for retry in &plan.retry {
            self.place_again(pool, retry).await?;
        }
        let creates = pool::creates_now(pool.spec.spread.is_some(), &members, plan.create.len());
        for create in plan.create.iter().take(creates) {
            self.create(pool, create).await?;
        }
        // A Service that cannot be published still leaves the pool's status written.
        let (serving, failed) = match service::publish(self.context, pool, &proxies).await {
            Ok(serving) => (serving, None),
            Err(error) => (service::Serving::failed(&error), Some(error)),
        };
        self.write_status(pool, plan.status, serving).await?;
        if let Some(error) = failed {
            return Err(error);
        }
        let resync = self.context.operator.reconciler.timing().resync;
        Ok(Action::requeue(resync.min(LONGEST_PASS)))
    }

    /// The pool is being deleted: its members go (each VM by the Proxy's own finalizer), then
    /// its Service and EndpointSlice; the finalizer stays until no member is left.
    async fn wind_down(&self, pool: &ProxyPool) -> Result<Action, Error> {
        let members = self.members(pool).await?;
        for proxy in members
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
        {
            self.delete(pool, &proxy.name_any(), "PoolDeleted").await?;
        }
        service::unpublish(self.context, pool).await?;
        let (namespace, name) = (pool.namespace().unwrap_or_default(), pool.name_any());
        self.context.operator.metrics.pool_gone(&namespace, &name);
        if members.is_empty() {
            return Ok(Action::await_change());
        }
        Err(Error::CleanupPending(
            self.context.operator.reconciler.timing().not_ready_retry,
        ))
    }

    /// The Proxies labelled with the pool's name that it controls, as the API server has them
    /// now.
    async fn members(&self, pool: &ProxyPool) -> Result<Vec<Proxy>, Error> {
        let uid = pool.uid().ok_or(Error::Unnamed("uid"))?;
        let selector = pool_selector(&pool.name_any());
        let listed = proxies(self.context, pool)
            .list(&ListParams::default().labels(&selector))
            .await?;
        Ok(listed
            .items
            .into_iter()
            .filter(|proxy| controlled_by(&proxy.metadata, &uid))
            .collect())
    }

    /// Delete member `name` (gone already is fine); an Event with `reason` on the pool.
    async fn delete(&self, pool: &ProxyPool, name: &str, reason: &str) -> Result<(), Error> {
        match proxies(self.context, pool)
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(error) => return Err(error.into()),
        }
        let note = Note::normal(reason, format!("deleting Proxy {name}"));
        self.context.record(&[note], &pool.object_ref(&())).await;
        Ok(())
    }

    /// Make one member of the current template.
    async fn create(&self, pool: &ProxyPool, create: &pool::Create) -> Result<(), Error> {
        let template = &pool.spec.template;
        let mut annotations = template
            .metadata
            .as_ref()
            .map(|metadata| metadata.annotations.clone())
            .unwrap_or_default();
        if let Some(request) = &create.placement {
            annotations.insert(PLACEMENT_ANNOTATION.into(), placement_json(request));
        }
        let name = pool.name_any();
        let proxy = Proxy {
            metadata: ObjectMeta {
                generate_name: Some(format!("{name}-{}-", create.template_hash)),
                namespace: pool.namespace(),
                labels: Some(member_labels(&name, template)),
                annotations: Some(annotations).filter(|a| !a.is_empty()),
                owner_references: owner(pool).map(|owner| vec![owner]),
                ..ObjectMeta::default()
            },
            spec: template.spec.clone(),
            status: None,
        };
        let made = proxies(self.context, pool)
            .create(&PostParams::default(), &proxy)
            .await?;
        let note = Note::normal("Created", format!("made Proxy {}", made.name_any()));
        self.context.record(&[note], &pool.object_ref(&())).await;
        Ok(())
    }

    /// Ask again to place a pending member, with the hosts to avoid as of now. The changed
    /// annotation brings it back to the Proxy controller; unchanged, its own retry does.
    async fn place_again(&self, pool: &ProxyPool, retry: &pool::Retry) -> Result<(), Error> {
        let api = proxies(self.context, pool);
        let Some(proxy) = api.get_opt(&retry.name).await? else {
            return Ok(());
        };
        let wanted = placement_json(&retry.placement);
        if proxy.annotations().get(PLACEMENT_ANNOTATION) == Some(&wanted) {
            return Ok(());
        }
        let patch =
            serde_json::json!({"metadata": {"annotations": {PLACEMENT_ANNOTATION: wanted}}});
        api.patch(&retry.name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        let note = Note::normal("Placing", format!("placing Proxy {} again", retry.name));
        self.context.record(&[note], &pool.object_ref(&())).await;
        Ok(())
    }

    /// Write the plan's status, with the Service's condition, when it changed; gauge its counts.
    async fn write_status(
        &self,
        pool: &ProxyPool,
        mut status: ProxyPoolStatus,
        serving: service::Serving,
    ) -> Result<(), Error> {
        serving.set(&mut status.conditions, pool.metadata.generation);
        let counts = PoolCounts {
            desired: pool.spec.replicas.into(),
            current: status.replicas.into(),
            ready: status.ready_replicas.into(),
            updated: status.updated_replicas.into(),
        };
        let namespace = pool.namespace().unwrap_or_default();
        (self.context.operator.metrics).pool_counts(&namespace, &pool.name_any(), counts);
        if pool.status.as_ref() != Some(&status) {
            write_status(self.pools, &pool.name_any(), &status).await?;
        }
        Ok(())
    }
}

/// The Proxies of the pool's namespace.
fn proxies(context: &Context, pool: &ProxyPool) -> Api<Proxy> {
    let namespace = pool.namespace().unwrap_or_default();
    Api::namespaced(context.client.clone(), &namespace)
}

/// The pool as its objects' controller; `blockOwnerDeletion`: a foreground deletion of the pool
/// waits for them.
pub(crate) fn owner(pool: &ProxyPool) -> Option<OwnerReference> {
    let mut owner = pool.controller_owner_ref(&())?;
    owner.block_owner_deletion = Some(true);
    Some(owner)
}

/// Whether `metadata`'s controller owner reference is the object of `uid`.
pub(crate) fn controlled_by(metadata: &ObjectMeta, uid: &str) -> bool {
    metadata
        .owner_references
        .iter()
        .flatten()
        .any(|owner| owner.controller == Some(true) && owner.uid == uid)
}

/// What the planner needs to know of a member.
fn member(proxy: &Proxy) -> Member {
    let required = placement_of(proxy).is_some_and(|placement| placement.required);
    let hash = proxy.labels().get(crate::crd::TEMPLATE_HASH_LABEL).cloned();
    pool::member(
        &proxy.name_any(),
        hash.unwrap_or_default(),
        (proxy.metadata.creation_timestamp.clone()).unwrap_or_else(crate::now),
        proxy.metadata.deletion_timestamp.is_some(),
        &proxy.status.clone().unwrap_or_default(),
        required,
    )
}
