//! The command line.
//!
//! - `egress-operator run --local DIR`: the operator over a folder of manifests (local mode).
//! - `egress-operator run`: the operator in a Kubernetes cluster (in-cluster config or kubeconfig).
//! - `egress-operator get proxies|pools|providerconfigs --local DIR`: what local mode knows of
//!   its Proxies, ProxyPools and ProviderConfigs.
//! - `egress-operator crdgen [--out-dir DIR]`: the CRDs as YAML.
//! - `egress-operator provider inspect|call|push|pull …` and `egress-operator conformance …`: one
//!   provider component, alone ([`egress_provider_cli`]).
//!
//! Exit status: 0 on success, 1 when a provider operation answered a (classified) error (or, with
//! `run --exit-when-settled`, when a Proxy failed), 2 when the command could not run at all (bad
//! arguments, a file that is not a provider, a bad config). Errors are one line on stderr, never a
//! backtrace.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::run_args::RunArgs;

#[derive(Parser)]
#[command(
    name = "egress-operator",
    version,
    about = "Provision egress-proxy VMs through sandboxed provider components"
)]
struct Cli {
    /// How log lines on stderr are written: `text` for people, `json` (one object per line) for
    /// log collectors. `RUST_LOG` sets the level (default `warn`; `provider` commands also show
    /// the provider's own log lines at `info` and up, target `egress_runtime::guest`).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the operator: over a folder of manifests with --local, else in a Kubernetes cluster.
    Run(RunArgs),
    /// Show what local mode knows of its resources.
    #[command(subcommand)]
    Get(GetCommand),
    /// Print the CustomResourceDefinitions of Proxy and ProviderConfig as YAML.
    Crdgen {
        /// Write one file per CRD into this folder instead of printing them.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Work with one provider component: a file, or an artifact in an OCI registry.
    #[command(subcommand)]
    Provider(egress_provider_cli::ProviderCommand),
    /// Run the contract's conformance rules against a provider component and the backend its
    /// config points at (docs/contract.md cites each rule's id). Exit 0 when no rule fails.
    Conformance(egress_provider_cli::ConformanceArgs),
}

#[derive(Subcommand)]
enum GetCommand {
    /// The Proxies of a local-mode folder (a pool's among them).
    Proxies {
        /// The folder `run --local` reconciles.
        #[arg(long, value_name = "DIR")]
        local: PathBuf,
        /// `table`, `yaml` or `json`.
        #[arg(short = 'o', long, default_value = "table")]
        output: String,
    },
    /// The ProviderConfigs of a local-mode folder: what serves, why one is not Ready, its
    /// orphans.
    #[command(name = "providerconfigs", alias = "providerconfig")]
    ProviderConfigs {
        /// The folder `run --local` reconciles.
        #[arg(long, value_name = "DIR")]
        local: PathBuf,
        /// `table`, `yaml` or `json`.
        #[arg(short = 'o', long, default_value = "table")]
        output: String,
    },
    /// The ProxyPools of a local-mode folder.
    Pools {
        /// The folder `run --local` reconciles.
        #[arg(long, value_name = "DIR")]
        local: PathBuf,
        /// `table`, `yaml` or `json`.
        #[arg(short = 'o', long, default_value = "table")]
        output: String,
    },
}

/// Parses the command line, runs it and turns every failure into one line and an exit status.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let shown = match cli.command {
        Command::Run(_) => crate::logging::Default::Operator,
        Command::Provider(_) => crate::logging::Default::ProviderCli,
        _ => crate::logging::Default::Quiet,
    };
    let format = match cli.log_format {
        LogFormat::Text => crate::logging::Format::Text,
        LogFormat::Json => crate::logging::Format::Json,
    };
    crate::logging::init(format, shown);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return fail(&anyhow::Error::new(err).context("starting the async runtime")),
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(err) => fail(&err),
    }
}

fn fail(err: &anyhow::Error) -> ExitCode {
    // `{:#}` joins the context chain on one line.
    eprintln!("error: {err:#}");
    ExitCode::from(2)
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => match args.local.clone() {
            Some(dir) => crate::local::run(&dir, &args).await,
            None => crate::kube_mode::run(&args).await,
        },
        Command::Get(GetCommand::Pools { local, output }) => {
            crate::local::get_pools(&local, &output)
        }
        Command::Get(GetCommand::Proxies { local, output }) => {
            crate::local::get_proxies(&local, &output)
        }
        Command::Get(GetCommand::ProviderConfigs { local, output }) => {
            crate::local::get_provider_configs(&local, &output)
        }
        Command::Crdgen { out_dir } => crdgen(out_dir.as_deref()),
        Command::Provider(command) => egress_provider_cli::run(command).await,
        Command::Conformance(args) => egress_provider_cli::conformance(&args).await,
    }
}

fn crdgen(out_dir: Option<&Path>) -> anyhow::Result<ExitCode> {
    const HEADER: &str = "# Generated by `egress-operator crdgen`; do not edit.\n";
    for (file, yaml) in crate::crd::manifests()? {
        match out_dir {
            Some(dir) => std::fs::write(dir.join(file), format!("{HEADER}{yaml}"))
                .with_context(|| format!("writing {}", dir.join(file).display()))?,
            None => print!("---\n{HEADER}{yaml}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_runtime::Compilation;

    /// The settings `run` with `arguments` starts the operator with.
    fn run_settings(arguments: &[&str]) -> Result<crate::operator::Settings, clap::Error> {
        let cli = Cli::try_parse_from(["egress-operator", "run"].iter().chain(arguments))?;
        let Command::Run(args) = cli.command else {
            unreachable!("parsed as run")
        };
        Ok(args.settings(
            crate::installation::Installation::new("test").unwrap(),
            std::path::Path::new("/components"),
            std::path::Path::new("/images"),
        ))
    }

    #[test]
    fn compilation_is_tiered_unless_the_flag_says_otherwise() {
        let compilation = |arguments: &[&str]| run_settings(arguments).unwrap().compilation;
        assert_eq!(compilation(&[]), Compilation::Tiered);
        assert_eq!(
            compilation(&["--compilation", "optimized"]),
            Compilation::Optimized
        );
        assert_eq!(
            compilation(&["--compilation", "baseline"]),
            Compilation::Baseline
        );
        let unknown = run_settings(&["--compilation", "fast"]).err().unwrap();
        assert!(unknown.to_string().contains("tiered"), "{unknown}");
    }

    #[test]
    fn the_installation_is_the_modes_own_unless_the_flag_names_one() {
        let installation = |arguments: &[&str]| run_settings(arguments).map(|s| s.installation);
        assert_eq!(installation(&[]).unwrap().as_str(), "test");
        assert_eq!(
            installation(&["--installation", "prod-eu"])
                .unwrap()
                .as_str(),
            "prod-eu"
        );
        let refused = installation(&["--installation", "Prod EU"]).err().unwrap();
        assert!(refused.to_string().contains("lower-case"), "{refused}");
    }
}
