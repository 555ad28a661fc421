//! `egress-operator run`'s options, which both modes read: [`crate::kube_mode`] and
//! [`crate::local`].

use std::path::PathBuf;

use egress_runtime::Compilation;

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
    /// Seconds between looks at a Proxy that is fine (drift), and at each ProviderConfig.
    #[arg(long, default_value_t = 300)]
    pub resync_seconds: u64,
    /// Local mode: exit once every Proxy is Ready or failed (status 0 if all are Ready, 1 if not).
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
