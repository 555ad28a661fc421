//! `egress-operator run`'s options, which both modes read: [`crate::kube_mode`] and
//! [`crate::local`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use egress_runtime::Compilation;

use crate::installation::Installation;
use crate::operator::Settings;
use crate::timing::Timing;

/// `run`'s options.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Local mode: reconcile the Proxy, ProviderConfig, Secret and ConfigMap manifests of this
    /// folder (state in DIR/.egress-operator/state.db) instead of a cluster's.
    #[arg(long, value_name = "DIR")]
    pub local: Option<PathBuf>,
    /// The provider components directory (`*.wasm`, hot-swapped). Defaults to DIR/components in
    /// local mode, /var/lib/egress-operator/components in a cluster.
    #[arg(long, value_name = "DIR")]
    pub components: Option<PathBuf>,
    /// Serve /healthz, /readyz and /metrics on this address (for example 0.0.0.0:8080).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,
    /// The operator's namespace, where Secret references without a namespace point. Defaults to
    /// $POD_NAMESPACE, else `default`.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub namespace: String,
    /// Seconds between looks at a Proxy that is fine (one `get` of its VM: the bound on noticing a
    /// VM that stopped), and at each ProviderConfig. A ProviderConfig's `resyncSeconds` overrides
    /// it for its Proxies.
    #[arg(long, default_value_t = 60)]
    pub resync_seconds: u64,
    /// Local mode: exit once every Proxy is Ready, failed or paused by a person (status 0 if all
    /// are Ready, 1 if not).
    #[arg(long)]
    pub exit_when_settled: bool,
    /// Local mode: print log lines only, no live table on stdout.
    #[arg(long)]
    pub no_table: bool,
    /// Where compiled components are cached; `none` for no cache.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// How a component missing from the cache is compiled: `tiered` serves it at once from
    /// Winch's code while Cranelift compiles it in the background; `optimized` waits for
    /// Cranelift; `baseline` uses Winch only.
    #[arg(long, value_enum, default_value_t = CompilationArg::Tiered)]
    pub compilation: CompilationArg,
    /// Kubernetes mode: this Pod's name, the holder of the leader lease. Defaults to $POD_NAME,
    /// else the host name.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// Where pulled provider images are cached by digest (served from there across restarts and
    /// registry outages). Defaults to DIR/.egress-operator/images in local mode,
    /// /var/cache/egress-operator/images in a cluster.
    #[arg(long, value_name = "DIR")]
    pub image_cache: Option<PathBuf>,
    /// Where the calls of ProviderConfigs that set `record` are recorded, a folder each.
    /// Defaults to `recordings` beside the image cache.
    #[arg(long, value_name = "DIR")]
    pub recordings_dir: Option<PathBuf>,
    /// The largest provider component the operator reads, from a file or pulled from a registry
    /// (bytes). A larger one is refused before it is read.
    #[arg(long, value_name = "BYTES", default_value_t = egress_runtime::DEFAULT_MAX_COMPONENT_BYTES)]
    pub max_component_bytes: u64,
    /// Serve images whose ProviderConfig names no signing key (`spec.component.signedBy`).
    /// Without it, every image must be signed by a key its ProviderConfig trusts.
    #[arg(long)]
    pub allow_unsigned_images: bool,
    /// A directory on a memory-backed filesystem (tmpfs) where SSH keys from Secrets are written
    /// for libvirt, 0600 in a private folder removed at exit. Defaults to $XDG_RUNTIME_DIR, else
    /// /dev/shm.
    #[arg(long, value_name = "DIR")]
    pub key_dir: Option<PathBuf>,
    /// Kubernetes mode: seconds the leader's Lease is valid after its last renewal: the bound on
    /// how long a leader that died unannounced (killed, its node lost) holds the others back. The
    /// leader renews it a third of this before it runs out.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(3..=3600))]
    pub lease_seconds: u64,
    /// Which installation this is, written on every VM it makes; its orphan sweep never deletes
    /// a VM of another. Defaults to `cluster-<UID of kube-system>` in a cluster, and in local
    /// mode to an identity made once and kept in the folder's state.
    #[arg(long, env = "EGRESS_INSTALLATION", value_name = "NAME", value_parser = parse_installation)]
    pub installation: Option<Installation>,
}

fn parse_installation(id: &str) -> Result<Installation, String> {
    Installation::new(id)
}

impl RunArgs {
    /// The settings the operator starts with, in either mode: `installation` is the mode's own
    /// unless `--installation` names one; `components` and `image_cache` are the mode's default
    /// directories.
    pub fn settings(
        &self,
        installation: Installation,
        components: &Path,
        image_cache: &Path,
    ) -> Settings {
        let mut settings = Settings::new(
            self.installation.clone().unwrap_or(installation),
            self.components
                .clone()
                .unwrap_or_else(|| components.to_owned()),
        );
        settings.namespace = self.namespace.clone();
        settings.listen = self.listen;
        settings.timing = Timing {
            resync: Duration::from_secs(self.resync_seconds.max(1)),
            ..Timing::default()
        };
        match &self.cache_dir {
            Some(dir) if dir.as_os_str() == "none" => settings.cache_dir = None,
            Some(dir) => settings.cache_dir = Some(dir.clone()),
            None => {}
        }
        settings.compilation = self.compilation.into();
        settings.key_dir = self.key_dir.clone();
        settings.images.cache_dir = self
            .image_cache
            .clone()
            .unwrap_or_else(|| image_cache.to_owned());
        settings.recordings_dir = (self.recordings_dir.clone())
            .unwrap_or_else(|| image_cache.with_file_name("recordings"));
        settings.images.max_component_bytes = self.max_component_bytes;
        settings.images.allow_unsigned = self.allow_unsigned_images;
        settings
    }
}

/// `--compilation`: [`Compilation`] on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CompilationArg {
    /// Winch first, Cranelift in the background.
    Tiered,
    /// Cranelift only.
    Optimized,
    /// Winch only.
    Baseline,
}

impl From<CompilationArg> for Compilation {
    fn from(arg: CompilationArg) -> Compilation {
        match arg {
            CompilationArg::Tiered => Compilation::Tiered,
            CompilationArg::Optimized => Compilation::Optimized,
            CompilationArg::Baseline => Compilation::Baseline,
        }
    }
}
