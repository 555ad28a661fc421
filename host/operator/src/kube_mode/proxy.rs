//! The Proxy controller: kube's finalizer helper around the one reconciler core.
//!
//! - A Proxy without the finalizer gets it first (and comes back on the watch event).
//! - A Proxy whose ProviderConfig a replica bound, but this one not yet (it has just started
//!   leading), is left as it is until the binding is here: its status stays as written.
//! - Otherwise its [`ProxyState`] and [`Resolved`] references go to
//!   [`ProxyReconciler::reconcile`](crate::proxy_reconciler::ProxyReconciler::reconcile); the status it returns
//!   is written by server-side apply on the status subresource with the field manager
//!   [`FIELD_MANAGER`] (only when it changed), its notes become Events, and its `next` becomes
//!   the controller's [`Action`].
//! - Deleting, an outcome other than `Finalized` keeps the finalizer: the cleanup "fails" with
//!   [`Error::CleanupPending`] and the error policy brings the Proxy back when asked.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use tokio::sync::oneshot;

use super::caches::{StoreObjects, Touched};
use super::{Context, Error, never_ending, retry_after, write_status};
use crate::conditions::NotReady;
use crate::crd::{FINALIZER, Proxy};
use crate::pool_members::{PLACEMENT_ANNOTATION, placement_of};
use crate::proxy_reconciler::{Next, ProxyState, Resolved};

/// Run the Proxy controller until `stop` fires and the reconciles in flight finish.
pub async fn controller(context: Arc<Context>, stop: oneshot::Receiver<()>) {
    let caches = context.caches.clone();
    // Subscribe before reading the store: nothing between the two is missed.
    let touches = caches.touches();
    let rebound = rebound_stream(context.rebound.subscribe());
    let initial = futures::stream::iter(caches.proxies.state());
    let mut seen = Seen::default();
    let own = initial
        .chain(touches.filter_map(|touched| async move {
            match touched {
                Touched::Proxy(proxy) => Some(proxy),
                _ => None,
            }
        }))
        .filter_map(move |proxy| {
            std::future::ready(seen.changed(&proxy).then(|| Ok((*proxy).clone())))
        });
    let related = {
        let caches = caches.clone();
        let touches = caches.touches();
        // The ProviderConfigs as the initial reconciles see them: their next status write is
        // not a change of spec (else a new leader would reconcile every Proxy twice).
        let mut generations: HashMap<String, i64> = caches
            .provider_configs
            .state()
            .iter()
            .map(|pc| (pc.name_any(), pc.metadata.generation.unwrap_or(0)))
            .collect();
        futures::stream::select(touches.map(Related::Touched), rebound.map(Related::Rebound))
            .flat_map(move |related| {
                futures::stream::iter(related_proxies(&caches, &mut generations, related))
            })
    };
    let related = futures::stream::select(related, probed(Arc::clone(&context)));
    Controller::for_stream(never_ending(own), caches.proxies.clone())
        .reconcile_on(never_ending(related))
        .graceful_shutdown_on(stop.map(|_| ()))
        .run(reconcile, error_policy, context)
        .for_each(|result| super::log_pass("proxy", result))
        .await;
}

/// The health checks due, probed every second: the Proxies whose verdict changed, to reconcile.
fn probed(context: Arc<Context>) -> impl futures::Stream<Item = ObjectRef<Proxy>> + Send {
    let mut tick = tokio::time::interval(PROBE_PASS);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    futures::stream::unfold(tick, move |mut tick| {
        let context = Arc::clone(&context);
        async move {
            tick.tick().await;
            let prober = context.operator.reconciler.prober();
            Some((prober.probe_due(crate::now().0).await, tick))
        }
    })
    .flat_map(|keys| {
        futures::stream::iter(keys.into_iter().filter_map(|key| {
            let (namespace, name) = key.split_once('/')?;
            Some(ObjectRef::new(name).within(namespace))
        }))
    })
}

/// How often the health checks due are probed.
const PROBE_PASS: Duration = Duration::from_secs(1);

enum Related {
    Touched(Touched),
    Rebound(String),
}

/// The Proxies a touch of another object concerns.
fn related_proxies(
    caches: &super::Caches,
    generations: &mut HashMap<String, i64>,
    related: Related,
) -> Vec<ObjectRef<Proxy>> {
    let of_provider_config = |name: &str| {
        caches
            .proxies
            .state()
            .iter()
            .filter(|proxy| proxy.spec.provider_config_ref == name)
            .map(|proxy| ObjectRef::from_obj(proxy.as_ref()))
            .collect::<Vec<_>>()
    };
    match related {
        Related::Rebound(name) => of_provider_config(&name),
        Related::Touched(Touched::ProviderConfig(pc)) => {
            // Its spec, not its status, concerns the Proxies.
            let generation = pc.metadata.generation.unwrap_or(0);
            match generations.insert(pc.name_any(), generation) {
                Some(before) if before == generation => Vec::new(),
                _ => of_provider_config(&pc.name_any()),
            }
        }
        Related::Touched(Touched::ProviderConfigGone(name)) => {
            generations.remove(&name);
            of_provider_config(&name)
        }
        Related::Touched(Touched::Secret { namespace, name }) => {
            user_data_of(caches, &namespace, |user_data| {
                user_data
                    .secret_key_ref
                    .as_ref()
                    .is_some_and(|key| key.name == name)
            })
        }
        Related::Touched(Touched::ConfigMap { namespace, name }) => {
            user_data_of(caches, &namespace, |user_data| {
                user_data
                    .config_map_key_ref
                    .as_ref()
                    .is_some_and(|key| key.name == name)
            })
        }
        Related::Touched(Touched::Relisted) => caches
            .proxies
            .state()
            .iter()
            .map(|proxy| ObjectRef::from_obj(proxy.as_ref()))
            .collect(),
        Related::Touched(Touched::Proxy(_)) => Vec::new(),
    }
}

fn user_data_of(
    caches: &super::Caches,
    namespace: &str,
    names: impl Fn(&crate::crd::UserData) -> bool,
) -> Vec<ObjectRef<Proxy>> {
    caches
        .proxies
        .state()
        .iter()
        .filter(|proxy| proxy.namespace().as_deref() == Some(namespace))
        .filter(|proxy| proxy.spec.user_data.as_ref().is_some_and(&names))
        .map(|proxy| ObjectRef::from_obj(proxy.as_ref()))
        .collect()
}

fn rebound_stream(
    receiver: tokio::sync::broadcast::Receiver<String>,
) -> impl futures::Stream<Item = String> + Send + 'static {
    futures::stream::unfold(receiver, |mut receiver| async move {
        loop {
            match receiver.recv().await {
                Ok(name) => return Some((name, receiver)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

/// Which Proxies changed in a way a reconcile cares about: their spec (generation), their
/// finalizers, their deletion or their pool's placement request. Their own status writes are
/// not news.
#[derive(Default)]
pub(crate) struct Seen(HashMap<String, SeenKey>);

type SeenKey = (i64, bool, Vec<String>, Option<String>);

impl Seen {
    pub(crate) fn changed(&mut self, proxy: &Proxy) -> bool {
        let key = (
            proxy.metadata.generation.unwrap_or(0),
            proxy.metadata.deletion_timestamp.is_some(),
            proxy.finalizers().to_vec(),
            proxy.annotations().get(PLACEMENT_ANNOTATION).cloned(),
        );
        let uid = proxy.uid().unwrap_or_else(|| proxy.name_any());
        if key.1 && key.2.is_empty() {
            // Gone for good.
            self.0.remove(&uid);
            return false;
        }
        self.0.insert(uid, key.clone()).as_ref() != Some(&key)
    }
}

/// One reconcile of one Proxy, through the finalizer helper.
pub async fn reconcile(proxy: Arc<Proxy>, context: Arc<Context>) -> Result<Action, Error> {
    let namespace = proxy.namespace().ok_or(Error::Unnamed("namespace"))?;
    let api: Api<Proxy> = Api::namespaced(context.client.clone(), &namespace);
    finalizer(&api, FINALIZER, proxy, |event| async {
        match event {
            Finalizer::Apply(proxy) => reconcile_once(&api, &proxy, &context, false).await,
            Finalizer::Cleanup(proxy) => reconcile_once(&api, &proxy, &context, true).await,
        }
    })
    .await
    .map_err(|error| Error::Finalizer(Box::new(error)))
}

/// Count the failure and come back ([`retry_after`]).
pub fn error_policy(_proxy: Arc<Proxy>, error: &Error, context: Arc<Context>) -> Action {
    retry_after("proxy", error, &context)
}

async fn reconcile_once(
    api: &Api<Proxy>,
    proxy: &Proxy,
    context: &Context,
    deleting: bool,
) -> Result<Action, Error> {
    let state = proxy_state(proxy, deleting)?;
    if not_bound_here_yet(proxy, context) {
        // Just leading: the status stays as the last leader wrote it until the binding is here
        // (its rebound brings the Proxy back); the retry covers a bind that fails here.
        let wait = context.operator.reconciler.timing().backoff_base;
        return match deleting {
            false => Ok(Action::requeue(wait)),
            true => Err(Error::CleanupPending(wait)),
        };
    }
    let resolved = resolve(proxy, &state.namespace, context);
    let outcome = context
        .operator
        .reconciler
        .reconcile(&state, resolved)
        .await;
    let finalized = outcome.next == Next::Finalized;
    // A finalized Proxy is about to go: its status no longer matters.
    if !finalized && outcome.status != state.status {
        write_status(api, &state.name, &outcome.status).await?;
    }
    context.record(&outcome.notes, &proxy.object_ref(&())).await;
    let timing = context.operator.reconciler.timing();
    match (outcome.next, deleting) {
        (Next::Finalized, _) => Ok(Action::await_change()),
        (Next::After(wait), false) => Ok(Action::requeue(wait)),
        (Next::AwaitChange, false) => Ok(Action::await_change()),
        // The finalizer stays until the VM is gone.
        (Next::After(wait), true) => Err(Error::CleanupPending(wait)),
        (Next::AwaitChange, true) => Err(Error::CleanupPending(timing.not_ready_retry)),
    }
}

/// The Proxy as the reconciler sees it.
pub fn proxy_state(proxy: &Proxy, deleting: bool) -> Result<ProxyState, Error> {
    Ok(ProxyState {
        namespace: proxy.namespace().ok_or(Error::Unnamed("namespace"))?,
        name: proxy.metadata.name.clone().ok_or(Error::Unnamed("name"))?,
        uid: proxy.uid().ok_or(Error::Unnamed("uid"))?,
        generation: proxy.metadata.generation.unwrap_or(0),
        spec: proxy.spec.clone(),
        status: proxy.status.clone().unwrap_or_default(),
        deleting,
        placement: placement_of(proxy),
        pooled: proxy
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|owner| owner.kind == "ProxyPool" && owner.controller == Some(true)),
    })
}

/// Whether the Proxy's ProviderConfig has a provider serving by its status (a replica bound it)
/// but none bound in this replica yet, as just after it started leading. Reconciling then would
/// write `ProviderNotReady` over the Proxy's status and `Ready` back once bound: two status
/// writes and an Event per Proxy on every restart or failover, and a Ready that flaps.
fn not_bound_here_yet(proxy: &Proxy, context: &Context) -> bool {
    let name = &proxy.spec.provider_config_ref;
    let served = context.caches.provider_config(name).is_some_and(|pc| {
        pc.status
            .as_ref()
            .is_some_and(|status| status.loaded.is_some())
    });
    // A refusal is this replica's own answer, not skipped; a load that fails here clears
    // `loaded` in the status, which ends the skip.
    served
        && matches!(
            context.operator.providers.binding(name),
            Err(NotReady {
                reason: NO_BINDING,
                ..
            })
        )
}

/// The reason [`ProviderSet::binding`](crate::bindings::ProviderSet::binding) gives while a
/// ProviderConfig has no binding in this process.
const NO_BINDING: &str = "ProviderNotReady";

/// Its ProviderConfig's binding and its user-data, from the caches.
pub fn resolve(proxy: &Proxy, namespace: &str, context: &Context) -> Resolved {
    let declared = (context.caches)
        .provider_config(&proxy.spec.provider_config_ref)
        .is_some();
    Resolved::lookup(
        &proxy.spec,
        namespace,
        declared,
        &context.operator.providers,
        &StoreObjects(&context.caches),
    )
}

#[cfg(test)]
mod tests {
    use kube::runtime::watcher::Event;
    use serde_json::json;

    use super::super::caches::{Caches, Writers};
    use super::super::fixtures::{ProxyFixture, Scenario, TestContext, timeout_after_1s};
    use super::*;
    use crate::crd::{
        ComponentRef, LoadedComponent, ProviderConfig, ProviderConfigSpec, ProviderConfigStatus,
    };

    /// The test's context over caches holding only ProviderConfig `other`, unbound in this
    /// process, with `status`.
    fn with_unbound_provider_config(
        test: &TestContext,
        status: ProviderConfigStatus,
    ) -> (Arc<Context>, Writers) {
        let mut pc = ProviderConfig::new(
            "other",
            ProviderConfigSpec {
                component: ComponentRef {
                    file: "reference.wasm".into(),
                    ..ComponentRef::default()
                },
                ..ProviderConfigSpec::default()
            },
        );
        pc.metadata.generation = Some(1);
        pc.status = Some(status);
        let (caches, mut writers) = Caches::detached();
        writers
            .provider_configs
            .apply_watcher_event(&Event::Apply(pc));
        let context = Arc::new(Context {
            client: test.context.client.clone(),
            operator: Arc::clone(&test.context.operator),
            caches,
            recorder: test.context.recorder.clone(),
            rebound: tokio::sync::broadcast::channel(4).0,
        });
        (context, writers)
    }

    /// Just after a restart or failover, a Proxy whose ProviderConfig a replica bound (its status
    /// names the component serving it) is left as it is until this replica has bound it too: no
    /// status write, no Event, no provider call; the finalizer stays on a deleting one.
    #[tokio::test]
    async fn a_new_leader_leaves_a_proxy_alone_until_it_has_bound_its_provider_config() {
        let test = TestContext::new().await;
        let served = ProviderConfigStatus {
            loaded: Some(LoadedComponent {
                file: "reference.wasm".into(),
                ..LoadedComponent::default()
            }),
            ..ProviderConfigStatus::default()
        };
        let (context, _writers) = with_unbound_provider_config(&test, served);
        let backoff = context.operator.reconciler.timing().backoff_base;
        // The mock answers nothing: any API call would hang past the timeout.
        let proxy = Proxy::test()
            .finalized()
            .with_vm("ref/proxy-abc")
            .naming("other");
        let action = tokio::time::timeout(
            Duration::from_secs(1),
            reconcile(Arc::new(proxy.clone()), Arc::clone(&context)),
        )
        .await
        .expect("no API call")
        .expect("reconciled");
        assert_eq!(action, Action::requeue(backoff));
        let error = tokio::time::timeout(
            Duration::from_secs(1),
            reconcile(Arc::new(proxy.deleting()), Arc::clone(&context)),
        )
        .await
        .expect("no API call")
        .expect_err("the finalizer stays");
        assert_eq!(error.metric_label(), "cleanuppending");
        let metrics = &context.operator.metrics;
        assert_eq!(metrics.calls("other", "get", "ok"), 0);
        assert_eq!(metrics.calls("other", "delete", "ok"), 0);
    }

    /// A ProviderConfig no replica has bound yet (a new one) is not waited for: its Proxies say
    /// why they are not Ready.
    #[tokio::test]
    async fn a_proxy_of_a_provider_config_never_bound_says_it_is_not_ready() {
        let test = TestContext::new().await;
        let (context, _writers) =
            with_unbound_provider_config(&test, ProviderConfigStatus::default());
        let mocks = test.verifier.run(Scenario::StatusApplied(
            |status| {
                let ready = status["conditions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|c| c["type"] == "Ready")
                    .unwrap();
                assert_eq!(ready["status"], "False");
                assert_eq!(ready["reason"], json!(NO_BINDING));
            },
            &[],
        ));
        let proxy = Proxy::test().finalized().naming("other");
        reconcile(Arc::new(proxy), context)
            .await
            .expect("reconciled");
        timeout_after_1s(mocks).await;
    }
}
