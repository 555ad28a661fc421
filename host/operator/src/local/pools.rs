//! ProxyPools in local mode: each pass plans every pool ([`crate::pool::plan`]) over the Proxies
//! it made and carries the plan out in the store. A pool's Proxies have no manifest: they are
//! stored with a [`Membership`] and reconciled as any Proxy; deleting one runs the same finalizer
//! path (its VM goes, then its record). A pool whose manifest is gone deletes all its Proxies,
//! then itself.
//!
//! Under `spread`, a pool makes at most one Proxy a pass, and only once every sibling's VM has
//! reported its host: the planner's avoid-list is complete only when every sibling has landed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use tokio::time::Instant;

use crate::conditions;
use crate::crd::ProxyPool;
use crate::metrics::PoolCounts;
use crate::pool::{self, Member, Plan};
use crate::pool_members::placement;

use super::Local;
use super::manifests::PoolManifest;
use super::store::{Membership, PoolRecord, ProxyRecord};

impl Local {
    /// Plan every pool and carry its plan out; pools whose manifest is gone are wound down.
    pub(super) async fn reconcile_pools(&self) -> anyhow::Result<()> {
        let declared = self.snapshot.load().pools();
        let created = crate::now().0.to_string();
        for manifest in declared.values() {
            let (manifest, created) = (manifest.clone(), created.clone());
            self.store
                .run(move |store| {
                    let PoolManifest {
                        namespace,
                        name,
                        spec,
                    } = &manifest;
                    store.declare_pool(namespace, name, spec, &created)
                })
                .await?;
        }
        let pools = self.store.run(|store| store.pools()).await?;
        let proxies = self.store.run(|store| store.proxies()).await?;
        for record in pools {
            let members: Vec<&ProxyRecord> = proxies
                .iter()
                .filter(|proxy| {
                    proxy.namespace == record.namespace
                        && proxy
                            .membership
                            .as_ref()
                            .is_some_and(|membership| membership.pool == record.name)
                })
                .collect();
            if declared.contains_key(&record.key()) {
                self.carry_out(&record, &members).await?;
            } else {
                self.wind_down(&record, &members).await?;
            }
        }
        Ok(())
    }

    /// Plan pool `record` over `members` and do what the plan says.
    async fn carry_out(&self, record: &PoolRecord, members: &[&ProxyRecord]) -> anyhow::Result<()> {
        let now = crate::now();
        let planned: Vec<Member> = members.iter().map(|proxy| member(proxy)).collect();
        let plan = pool::plan(&pool_object(record), &planned, &now);
        let namespace = &record.namespace;
        for delete in &plan.delete {
            tracing::info!(pool = %record.key(), proxy = %delete.name, reason = delete.reason.as_str(), "deleting a Proxy of the pool");
            self.delete_member(namespace, &delete.name).await?;
        }
        for retry in &plan.retry {
            let (ns, name, placement) = (
                namespace.clone(),
                retry.name.clone(),
                placement(&retry.placement),
            );
            self.store
                .run(move |store| store.set_placement(&ns, &name, &placement))
                .await?;
            self.queue
                .schedule(&format!("{namespace}/{}", retry.name), Instant::now());
        }
        let spread = record.spec.spread.is_some();
        let unplaced = planned
            .iter()
            .any(|member| !member.deleting && member.host.is_none() && member.pending.is_none());
        let creates = if spread && unplaced {
            0
        } else if spread {
            1
        } else {
            plan.create.len()
        };
        for create in plan.create.iter().take(creates) {
            self.add_member(record, create).await?;
        }
        self.write_pool_status(record, plan).await
    }

    /// A new Proxy of pool `record`, named after it as a ReplicaSet names its Pods.
    async fn add_member(&self, record: &PoolRecord, create: &pool::Create) -> anyhow::Result<()> {
        let short = &create.template_hash[..create.template_hash.len().min(5)];
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..5];
        let name = format!("{}-{short}-{suffix}", record.name);
        let membership = Membership {
            pool: record.name.clone(),
            template_hash: create.template_hash.clone(),
            placement: create.placement.as_ref().map(placement),
        };
        let spec = record.spec.template.spec.clone();
        let (namespace, key) = (
            record.namespace.clone(),
            format!("{}/{name}", record.namespace),
        );
        let created = crate::now().0.to_string();
        tracing::info!(pool = %record.key(), proxy = %key, "making a Proxy of the pool");
        self.store
            .run(move |store| store.add_member(&namespace, &name, &spec, &membership, &created))
            .await?;
        self.queue.schedule(&key, Instant::now());
        Ok(())
    }

    /// Start deleting Proxy `namespace/name` of a pool: its VM goes, then its record.
    async fn delete_member(&self, namespace: &str, name: &str) -> anyhow::Result<()> {
        let (ns, n) = (namespace.to_owned(), name.to_owned());
        if self
            .store
            .run(move |store| store.mark_deleting(&ns, &n))
            .await?
        {
            self.queue
                .schedule(&format!("{namespace}/{name}"), Instant::now());
        }
        Ok(())
    }

    /// A pool whose manifest is gone: its Proxies are deleted, then the pool once none remain.
    async fn wind_down(&self, record: &PoolRecord, members: &[&ProxyRecord]) -> anyhow::Result<()> {
        for proxy in members {
            self.delete_member(&proxy.namespace, &proxy.name).await?;
        }
        if members.is_empty() {
            let (namespace, name) = (record.namespace.clone(), record.name.clone());
            self.store
                .run(move |store| store.remove_pool(&namespace, &name))
                .await?;
            (self.operator.metrics).pool_gone(&record.namespace, &record.name);
            tracing::info!(pool = %record.key(), "ProxyPool removed with its Proxies");
        }
        Ok(())
    }

    /// Gauge the plan's counts; store its status when it changed, with a log line for each
    /// condition that moved.
    async fn write_pool_status(&self, record: &PoolRecord, plan: Plan) -> anyhow::Result<()> {
        // The planner keeps a condition's transition time while its status holds.
        let status = plan.status;
        let counts = PoolCounts {
            desired: record.spec.replicas.into(),
            current: status.replicas.into(),
            ready: status.ready_replicas.into(),
            updated: status.updated_replicas.into(),
        };
        (self.operator.metrics).pool_counts(&record.namespace, &record.name, counts);
        if status == record.status {
            return Ok(());
        }
        for condition in &status.conditions {
            let before = conditions::condition(&record.status.conditions, &condition.type_);
            if before.is_none_or(|before| before.reason != condition.reason) {
                tracing::info!(pool = %record.key(), condition = %condition.type_, status = %condition.status, reason = %condition.reason, "{}", condition.message);
            }
        }
        let (namespace, name) = (record.namespace.clone(), record.name.clone());
        self.store
            .run(move |store| store.write_pool_status(&namespace, &name, &status))
            .await?;
        Ok(())
    }
}

/// The pool as the planner reads it: the stored spec, status and identity.
fn pool_object(record: &PoolRecord) -> ProxyPool {
    let mut pool = ProxyPool::new(&record.name, record.spec.clone());
    pool.metadata = ObjectMeta {
        name: Some(record.name.clone()),
        namespace: Some(record.namespace.clone()),
        uid: Some(record.uid.clone()),
        generation: Some(record.generation),
        creation_timestamp: record.created.parse().ok().map(Time),
        ..ObjectMeta::default()
    };
    pool.status = Some(record.status.clone());
    pool
}

/// What the planner needs to know of a pool's Proxy.
fn member(proxy: &ProxyRecord) -> Member {
    let membership = proxy.membership.clone().unwrap_or_default();
    let created = proxy
        .created
        .parse()
        .map(Time)
        .unwrap_or_else(|_| crate::now());
    let required = membership.placement.as_ref().is_some_and(|p| p.required);
    pool::member(
        &proxy.name,
        membership.template_hash,
        created,
        proxy.deleting,
        &proxy.status,
        required,
    )
}

/// `egress-operator get pools --local DIR`: what local mode knows of its ProxyPools.
pub fn get_pools(dir: &std::path::Path, output: &str) -> anyhow::Result<std::process::ExitCode> {
    let records = super::open_state(dir)?.pools()?;
    let objects = records
        .iter()
        .map(|record| {
            let identity = [
                &record.namespace,
                &record.name,
                &record.uid,
                &record.created,
            ];
            let body = (&record.spec, &record.status);
            super::listed("ProxyPool", identity, record.generation, body)
        })
        .collect();
    super::print_objects(output, objects, || {
        let line = |cells: [&str; 7]| {
            let [
                namespace,
                name,
                desired,
                ready,
                updated,
                available,
                progressing,
            ] = cells;
            println!(
                "{namespace:<12} {name:<20} {desired:<8} {ready:<6} {updated:<11} {available:<10} {progressing}"
            );
        };
        line([
            "NAMESPACE",
            "NAME",
            "DESIRED",
            "READY",
            "UP-TO-DATE",
            "AVAILABLE",
            "PROGRESSING",
        ]);
        for record in &records {
            let status = &record.status;
            let progressing = conditions::condition(&status.conditions, pool::PROGRESSING)
                .map_or("-", |progressing| progressing.reason.as_str());
            let count = |n: i32| n.to_string();
            line([
                &record.namespace,
                &record.name,
                &count(record.spec.replicas),
                &count(status.ready_replicas),
                &count(status.updated_replicas),
                &count(status.available_replicas),
                progressing,
            ]);
        }
    })
}
