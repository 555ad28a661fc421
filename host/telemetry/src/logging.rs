//! The operator's log lines: which are shown, and a level per ProviderConfig for its provider's
//! own lines, changed while the operator runs.
//!
//! Lines go to stderr, as text (colours only at a terminal) or JSON. What is shown is
//! `RUST_LOG` when it is set, else the command's default ([`Default`]); to that, each
//! ProviderConfig whose spec names a `logLevel` adds one directive for the lines of its
//! provider's calls (inside the call's `provider_call` span, whose `provider` field is the
//! ProviderConfig's name: the provider's own lines and the host's for it), so one provider can be
//! turned up to `debug` without the rest (a level only adds: a line the operator's
//! own filter shows is shown whatever the provider's level).

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Registry, reload};

use tracing::Level;

/// What a command shows when `RUST_LOG` is unset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Default {
    /// The operator (`run`): its own lines and each provider's from `info` up, so every
    /// reconcile's outcome and every provider call's outcome are seen.
    Operator,
    /// A person trying one provider (`provider …`): warnings, and the provider's own lines from
    /// `info` up.
    ProviderCli,
    /// Everything else: warnings only.
    Quiet,
}

impl Default {
    fn directives(self) -> &'static str {
        match self {
            Default::Operator => {
                "warn,egress_operator=info,egress_runtime=info,egress_capability_http=info,\
                 egress_capability_libvirt=info"
            }
            Default::ProviderCli => "warn,egress_runtime::guest=info",
            Default::Quiet => "warn",
        }
    }
}

/// The text or JSON lines on stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Human-readable.
    Text,
    /// One JSON object per line.
    Json,
}

struct Filter {
    base: String,
    providers: BTreeMap<String, Level>,
    handle: reload::Handle<EnvFilter, Registry>,
}

static FILTER: OnceLock<Mutex<Filter>> = OnceLock::new();

/// Install the subscriber (once per process; later calls do nothing).
pub fn init(format: Format, default: Default) {
    use std::io::IsTerminal;
    let base = std::env::var("RUST_LOG")
        .ok()
        .filter(|value| EnvFilter::try_new(value).is_ok())
        .unwrap_or_else(|| default.directives().to_owned());
    let (filter, handle) = reload::Layer::new(EnvFilter::new(&base));
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let installed = match format {
        Format::Text => tracing_subscriber::registry()
            .with(filter)
            .with(lines.with_ansi(std::io::stderr().is_terminal()))
            .try_init(),
        Format::Json => tracing_subscriber::registry()
            .with(filter)
            .with(lines.json())
            .try_init(),
    };
    if installed.is_ok() {
        let _ = FILTER.set(Mutex::new(Filter {
            base,
            providers: BTreeMap::new(),
            handle,
        }));
    }
}

/// Show ProviderConfig `name`'s provider lines from `level` up (`None`: as the others). Does
/// nothing where [`init`] did not run (tests, embedders with their own subscriber).
pub fn set_provider_level(name: &str, level: Option<Level>) {
    let Some(filter) = FILTER.get() else {
        return;
    };
    let mut filter = filter
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let changed = match level {
        Some(level) => filter.providers.insert(name.to_owned(), level) != Some(level),
        None => filter.providers.remove(name).is_some(),
    };
    if changed {
        let directives = directives(&filter.base, &filter.providers);
        if let Err(error) = filter.handle.reload(EnvFilter::new(directives)) {
            tracing::warn!(%error, "changing the log filter failed");
        }
    }
}

/// `base` and one directive per ProviderConfig level.
fn directives(base: &str, providers: &BTreeMap<String, Level>) -> String {
    let mut directives = base.to_owned();
    for (name, level) in providers {
        // Every line of that provider's calls, its own and the host's for it (the broker's
        // requests): a span directive's target would name the span's, not the lines'. A
        // ProviderConfig's name is a DNS subdomain: no character a directive gives meaning to.
        directives.push_str(&format!(
            ",[provider_call{{provider={name}}}]={}",
            level.as_str().to_ascii_lowercase()
        ));
    }
    directives
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_provider_level_is_a_directive_on_its_calls_lines() {
        let providers = BTreeMap::from([
            ("pve-lab".to_owned(), Level::DEBUG),
            ("kvm".to_owned(), Level::TRACE),
        ]);
        let text = directives("warn", &providers);
        assert_eq!(
            text,
            "warn,[provider_call{provider=kvm}]=trace,[provider_call{provider=pve-lab}]=debug"
        );
        EnvFilter::try_new(&text).expect("a filter EnvFilter accepts");
    }

    /// The directive selects the lines of one provider's calls, at its level, and no other's.
    #[test]
    fn a_provider_level_shows_that_providers_debug_lines_only() {
        use std::sync::Arc;
        #[derive(Clone, Default)]
        struct Lines(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let providers = BTreeMap::from([("pve-lab".to_owned(), Level::DEBUG)]);
        let subscriber = tracing_subscriber::registry()
            .with(EnvFilter::new(directives(
                "warn,egress_runtime=info",
                &providers,
            )))
            .with(tracing_subscriber::fmt::layer().with_writer(move || writer.clone()));
        tracing::subscriber::with_default(subscriber, || {
            for provider in ["pve-lab", "other"] {
                let span = tracing::info_span!(target: "egress_runtime::provider", "provider_call", provider = %provider);
                let _entered = span.enter();
                tracing::debug!(target: "egress_runtime::guest", "a request of {provider}");
                tracing::info!(target: "egress_runtime::guest", "the outcome of {provider}");
            }
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("a request of pve-lab"), "{text}");
        assert!(text.contains("the outcome of pve-lab"), "{text}");
        assert!(!text.contains("a request of other"), "{text}");
        assert!(text.contains("the outcome of other"), "{text}");
    }
}
