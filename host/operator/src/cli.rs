//! The command line.
//!
//! - `egress-operator run --local DIR`: the operator over a folder of manifests (local mode).
//! - `egress-operator run`: the operator in a Kubernetes cluster (in-cluster config or kubeconfig).
//! - `egress-operator get proxies|pools --local DIR`: what local mode knows of its Proxies and
//!   ProxyPools.
//! - `egress-operator crdgen [--out-dir DIR]`: the CRDs as YAML.
//! - `egress-operator provider inspect|call FILE`: one provider component, one operation;
//!   `inspect REF` pulls the component from a registry first.
//! - `egress-operator provider push FILE REF [--sign KEY]`, `provider pull REF [-o FILE]`: a provider as an OCI
//!   artifact in a registry ([`egress_distribution::oci`]).
//! - `egress-operator conformance FILE --config C --grants G`: the contract's rules against a
//!   provider and its backend ([`crate::conformance`]); exit 0 when no rule fails.
//!
//! Exit status: 0 on success, 1 when a provider operation answered a (classified) error (or, with
//! `run --exit-when-settled`, when a Proxy failed), 2 when the command could not run at all (bad
//! arguments, a file that is not a provider, a bad config). Errors are one line on stderr, never a
//! backtrace.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use egress_runtime::types::{CreateRequest, Operation, Request, Response, Tag};
use egress_runtime::{CallContext, Compilation, Provider, Runtime, RuntimeConfig};
use serde::Deserialize;

use crate::run_args::RunArgs;
use egress_capability_set::{Capabilities, GrantsFile};
use egress_distribution::oci::{
    DEFAULT_MAX_LAYER_BYTES, DockerConfig, RegistryClient, RegistryOptions,
};
use egress_distribution::signing::SigningKey;

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
    Provider(ProviderCommand),
    /// Run the contract's conformance rules against a provider component and the backend its
    /// config points at (docs/contract.md cites each rule's id). Exit 0 when no rule fails.
    Conformance(ConformanceArgs),
}

/// `conformance`'s options.
#[derive(clap::Args, Debug)]
pub struct ConformanceArgs {
    /// The provider component (`.wasm`).
    file: PathBuf,
    /// The provider's configuration (a JSON file) for a backend the run may create and delete
    /// VMs on.
    #[arg(long)]
    config: PathBuf,
    /// Grants (YAML, see docs/operations.md): under the provider's identity, its `http` and
    /// `libvirt` grants.
    #[arg(long)]
    grants: PathBuf,
    /// The identity the provider runs as; defaults to the file's name without `.wasm`.
    #[arg(long)]
    identity: Option<String>,
    /// Run only this rule (for example `create.idempotent`).
    #[arg(long, value_name = "RULE")]
    only: Option<String>,
    /// Also write the results as JUnit XML to this file.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
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

#[derive(Subcommand)]
enum ProviderCommand {
    /// Print a provider's name, versions, exports, imports and requested capabilities.
    Inspect {
        /// The provider component: a file (an existing path, or a name ending in `.wasm`), or
        /// an artifact reference `REGISTRY/REPOSITORY:TAG` or `…@sha256:DIGEST`, pulled into
        /// memory first.
        target: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        registry: RegistryArgs,
        /// The largest component layer to download, in bytes.
        #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_LAYER_BYTES)]
        max_layer_bytes: u64,
    },
    /// Push a provider component to a registry as a wasm OCI artifact (config
    /// `application/vnd.wasm.config.v0+json`, one `application/wasm` layer); print `REF@sha256:…`.
    Push {
        /// The provider component (`.wasm`).
        file: PathBuf,
        /// Where to push it: `REGISTRY/REPOSITORY:TAG`.
        reference: String,
        /// Sign the pushed digest with this key, as `cosign sign --key` does (the signature is
        /// stored beside the artifact as `sha256-<hex>.sig`): an ECDSA P-256 private key, PEM
        /// PKCS#8, unencrypted (`openssl genpkey -algorithm EC -pkeyopt
        /// ec_paramgen_curve:P-256`).
        #[arg(long, value_name = "KEY")]
        sign: Option<PathBuf>,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Pull a provider component from a registry, checking its media types, size and digests;
    /// print the reference pinned by digest.
    Pull {
        /// `REGISTRY/REPOSITORY:TAG` or `REGISTRY/REPOSITORY@sha256:DIGEST`.
        reference: String,
        /// The file to write; defaults to the repository's last name with `.wasm`, here.
        #[arg(short = 'o', long, value_name = "FILE")]
        output: Option<PathBuf>,
        #[command(flatten)]
        registry: RegistryArgs,
        /// The largest component layer to download, in bytes.
        #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_LAYER_BYTES)]
        max_layer_bytes: u64,
    },
    /// Run one operation and print its result, or its classified error, as JSON.
    Call {
        /// The provider component (`.wasm`).
        file: PathBuf,
        /// describe, validate-config, create, get, delete, list-by-tag or check.
        operation: String,
        /// The provider's configuration (a JSON file). Defaults to `{}`.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Grants (YAML, see docs/operations.md), keyed by provider identity: each identity's
        /// `http` grant (the origins it may reach, the credential the host injects) and
        /// `libvirt` grant (docs/providers/libvirt.md), the same documents as a
        /// ProviderConfig's `spec.grant`, with files in place of Secrets. Without it every
        /// outgoing request and every libvirt call is denied.
        #[arg(long)]
        grants: Option<PathBuf>,
        /// The identity the provider runs as, which the grants file names. Defaults to the file's
        /// name without `.wasm`; never taken from what the component says about itself.
        #[arg(long)]
        identity: Option<String>,
        /// The operation's input as JSON: create `{"name","uid","tags":[{"key","value"}],"userData"}`,
        /// get/delete `{"providerId"}`, list-by-tag `{"key","value"}`.
        #[arg(long)]
        input: Option<String>,
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
        Command::Crdgen { out_dir } => crdgen(out_dir.as_deref()),
        Command::Provider(ProviderCommand::Inspect {
            target,
            json,
            registry,
            max_layer_bytes,
        }) => inspect(&target, json, &registry, max_layer_bytes).await,
        Command::Provider(ProviderCommand::Push {
            file,
            reference,
            sign,
            registry,
        }) => push(&file, &reference, sign.as_deref(), &registry).await,
        Command::Provider(ProviderCommand::Pull {
            reference,
            output,
            registry,
            max_layer_bytes,
        }) => pull(&reference, output.as_deref(), &registry, max_layer_bytes).await,
        Command::Conformance(args) => conformance(&args).await,
        Command::Provider(ProviderCommand::Call {
            file,
            operation,
            config,
            grants,
            identity,
            input,
        }) => {
            call(
                &file,
                &operation,
                config.as_deref(),
                grants.as_deref(),
                identity.as_deref(),
                input.as_deref(),
            )
            .await
        }
    }
}

/// The runtime of a `provider` command.
fn provider_runtime(capabilities: &Capabilities) -> anyhow::Result<Runtime> {
    // One call and exit: tiering would only start a background compile the exit throws away.
    // Cranelift's code is cached, so the next run loads it.
    let config = capabilities.serve(RuntimeConfig::default().compilation(Compilation::Optimized));
    Ok(Runtime::new(config)?)
}

async fn load(
    file: &Path,
    identity: Option<&str>,
    capabilities: &Capabilities,
) -> anyhow::Result<Arc<Provider>> {
    let runtime = provider_runtime(capabilities)?;
    Ok(match identity {
        None => runtime.load_file(file).await?,
        Some(identity) => {
            let bytes = tokio::fs::read(file)
                .await
                .with_context(|| format!("reading {}", file.display()))?;
            runtime.load_bytes(identity, &bytes, file).await?
        }
    })
}

/// `--auth-file`, `--ca-file` and `--plain-http`: how `push`, `pull` and `inspect REF` reach
/// the registry.
#[derive(clap::Args, Debug)]
struct RegistryArgs {
    /// Registry credentials: a docker config JSON, `{"auths": {"HOST:PORT": {"auth":
    /// base64(USER:PASSWORD)}}}` (the content of a `kubernetes.io/dockerconfigjson` Secret).
    /// Without it the registry is asked anonymously.
    #[arg(long, value_name = "PATH")]
    auth_file: Option<PathBuf>,
    /// Trust this CA (PEM) for the registry's certificate, beside the public web PKI roots.
    #[arg(long, value_name = "PATH")]
    ca_file: Option<PathBuf>,
    /// Speak plain HTTP to the reference's registry (never TLS, never to another registry).
    #[arg(long)]
    plain_http: bool,
}

impl RegistryArgs {
    fn client(&self, reference: &str, max_layer_bytes: u64) -> anyhow::Result<RegistryClient> {
        let mut options = RegistryOptions {
            max_layer_bytes,
            ..RegistryOptions::default()
        };
        if let Some(path) = &self.auth_file {
            options.credentials = DockerConfig::read(path)?;
        }
        if let Some(path) = &self.ca_file {
            options = options.with_ca_file(path)?;
        }
        if self.plain_http {
            options.plain_http = vec![egress_distribution::oci::registry_of(reference)?];
        }
        Ok(RegistryClient::new(options)?)
    }
}

async fn push(
    file: &Path,
    reference: &str,
    sign: Option<&Path>,
    registry: &RegistryArgs,
) -> anyhow::Result<ExitCode> {
    // A bad key is found before anything is pushed.
    let key = match sign {
        Some(path) => {
            let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            Some(SigningKey::from_pem(&pem, &path.display().to_string())?)
        }
        None => None,
    };
    let runtime = provider_runtime(&Capabilities::new())?;
    let bytes = runtime.read_component(file).await?;
    // Pushing what the operator would refuse helps no one: load it first, under the identity
    // `inspect REF` gives it.
    let identity = egress_distribution::oci::repository_name(reference)?;
    runtime.load_bytes(&identity, &bytes, file).await?;
    let client = registry.client(reference, DEFAULT_MAX_LAYER_BYTES)?;
    let digest = client.push(file, bytes, reference).await?;
    if let Some(key) = &key {
        client.sign(reference, &digest, key).await?;
    }
    println!("{reference}@{digest}");
    Ok(ExitCode::SUCCESS)
}

async fn pull(
    reference: &str,
    output: Option<&Path>,
    registry: &RegistryArgs,
    max_layer_bytes: u64,
) -> anyhow::Result<ExitCode> {
    let client = registry.client(reference, max_layer_bytes)?;
    let pulled = client.pull(reference).await?;
    let output = match output {
        Some(path) => path.to_owned(),
        None => PathBuf::from(format!(
            "{}.wasm",
            egress_distribution::oci::repository_name(reference)?
        )),
    };
    // Written beside, then renamed: a components folder being watched never sees half a file.
    let partial = output.with_file_name(format!(
        ".{}.part",
        output.file_name().unwrap_or_default().to_string_lossy()
    ));
    std::fs::write(&partial, &pulled.bytes)
        .with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, &output)
        .with_context(|| format!("renaming {} to {}", partial.display(), output.display()))?;
    println!(
        "{}",
        egress_distribution::oci::pinned(reference, &pulled.manifest_digest)?
    );
    Ok(ExitCode::SUCCESS)
}

/// `inspect`'s argument names a file rather than an artifact reference.
fn names_a_file(target: &str) -> bool {
    target.ends_with(".wasm") || Path::new(target).exists()
}

async fn inspect(
    target: &str,
    json: bool,
    registry: &RegistryArgs,
    max_layer_bytes: u64,
) -> anyhow::Result<ExitCode> {
    // No grants: a provider importing a capability loads and is described, and every use of it
    // is denied.
    let provider = if names_a_file(target) {
        load(Path::new(target), None, &Capabilities::new()).await?
    } else {
        let pulled = registry
            .client(target, max_layer_bytes)?
            .pull(target)
            .await?;
        // The identity a file named after the repository would have (`…/proxmox:1` → `proxmox`).
        let identity = egress_distribution::oci::repository_name(target)?;
        provider_runtime(&Capabilities::new())?
            .load_bytes(&identity, &pulled.bytes, Path::new(target))
            .await?
    };
    let description = provider.description();
    if json {
        let report = serde_json::json!({
            "identity": provider.identity(),
            "name": description.name,
            "version": description.version,
            "contractVersion": provider.contract_version().to_string(),
            "digest": provider.component_digest().hex(),
            "capabilities": provider.capabilities(),
            "exports": provider.exports(),
            "imports": provider.imports(),
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    print_inspected(&provider);
    Ok(ExitCode::SUCCESS)
}

/// What `provider inspect` prints of `provider` without `--json`.
fn print_inspected(provider: &Provider) {
    let description = provider.description();
    println!("identity:         {}", provider.identity());
    println!("name:             {}", description.name);
    println!("version:          {}", description.version);
    // Both read from the component itself (its export and its imports), not from `describe`.
    println!("contract version: {}", provider.contract_version());
    println!("digest:           {}", provider.component_digest());
    let capabilities = provider.capabilities();
    println!(
        "capabilities:     {}",
        if capabilities.is_empty() {
            "none".to_owned()
        } else {
            capabilities.join(", ")
        }
    );
    println!("exports:");
    for export in provider.exports() {
        println!("  {export}");
    }
    println!("imports:");
    for import in provider.imports() {
        println!("  {import}");
    }
}

/// The `--input` of create.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CreateInput {
    name: String,
    uid: String,
    #[serde(default)]
    tags: Vec<Tag>,
    #[serde(default)]
    user_data: String,
}

/// The `--input` of get and delete.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct IdInput {
    provider_id: String,
}

/// The `--input` of list-by-tag.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TagInput {
    key: String,
    value: String,
}

async fn call(
    file: &Path,
    operation: &str,
    config: Option<&Path>,
    grants: Option<&Path>,
    identity: Option<&str>,
    input: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let operation: Operation = operation.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    let config = match config {
        Some(path) => read_config(path)?,
        None => "{}".to_owned(),
    };
    let request = build_request(operation, config, input)?;
    let capabilities = Capabilities::new();
    if let Some(path) = grants {
        GrantsFile::read(path)?
            .grant(&capabilities)
            .with_context(|| format!("grants {}", path.display()))?;
    }
    let provider = load(file, identity, &capabilities).await?;
    let context = CallContext { subject: None };
    match provider.call(request, &context).await {
        Ok(response) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&response_json(&response)?)?
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            let report = serde_json::json!({ "error": { "class": err.class().as_str(), "message": err.to_string() } });
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(ExitCode::from(1))
        }
    }
}

async fn conformance(args: &ConformanceArgs) -> anyhow::Result<ExitCode> {
    let grants = std::fs::read_to_string(&args.grants)
        .with_context(|| format!("reading grants {}", args.grants.display()))?;
    let options = egress_conformance::Options {
        file: args.file.clone(),
        config: read_config(&args.config)?,
        grants,
        identity: args.identity.clone(),
        only: args.only.clone(),
        // A run of a few dozen calls: the same reasoning as `load`.
        runtime: RuntimeConfig::default().compilation(Compilation::Optimized),
    };
    let report = egress_conformance::run(&options).await?;
    print!("{}", report.text());
    if let Some(path) = &args.junit {
        std::fs::write(path, report.junit())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(if report.failed() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The CRDs, one YAML document each, by file name.
pub fn crds() -> anyhow::Result<Vec<(&'static str, String)>> {
    use kube::CustomResourceExt;
    let yaml = |crd| -> anyhow::Result<String> {
        let mut crd = serde_json::to_value(crd)?;
        kubernetes_formats(&mut crd);
        Ok(yaml_1_1_safe(&serde_norway::to_string(&crd)?))
    };
    Ok(vec![
        (
            "proxies.egress-operator.io.yaml",
            yaml(crate::crd::Proxy::crd())?,
        ),
        (
            "proxypools.egress-operator.io.yaml",
            yaml(crate::crd::ProxyPool::crd())?,
        ),
        (
            "providerconfigs.egress-operator.io.yaml",
            yaml(crate::crd::ProviderConfig::crd())?,
        ),
    ])
}

/// Rust's unsigned integer formats (`uint32`, …) as the OpenAPI ones Kubernetes knows: a real API
/// server warns of every format it does not recognise on each apply of the CRD. The `minimum: 0`
/// beside them keeps them unsigned.
fn kubernetes_formats(schema: &mut serde_json::Value) {
    match schema {
        serde_json::Value::Object(fields) => {
            if let Some(format) = fields.get_mut("format") {
                match format.as_str() {
                    Some("uint8" | "uint16" | "uint32") => *format = "int32".into(),
                    Some("uint64" | "uint") => *format = "int64".into(),
                    _ => {}
                }
            }
            fields.values_mut().for_each(kubernetes_formats);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(kubernetes_formats),
        _ => {}
    }
}

/// `yaml` (YAML 1.2, as serde writes it) with every plain scalar that YAML 1.1, and not 1.2,
/// reads as a boolean quoted (`true` and `false` are booleans in both, and serde quotes them when
/// they are strings). kubectl reads YAML 1.1: an enum value `Off` written plain reached a real API server as
/// `false`, and the CRD then refused the value it documents.
fn yaml_1_1_safe(yaml: &str) -> String {
    const BOOLEANS: &[&str] = &[
        "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off", "Off",
        "OFF",
    ];
    let mut out = String::with_capacity(yaml.len() + 16);
    for line in yaml.lines() {
        let (head, scalar) = match line.rsplit_once(": ") {
            Some((head, scalar)) => (format!("{head}: "), scalar),
            None => match line.trim_start().strip_prefix("- ") {
                Some(scalar) => (line[..line.len() - scalar.len()].to_owned(), scalar),
                None => (String::new(), line),
            },
        };
        if !head.is_empty() && BOOLEANS.contains(&scalar) {
            out.push_str(&format!("{head}'{scalar}'\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn crdgen(out_dir: Option<&Path>) -> anyhow::Result<ExitCode> {
    const HEADER: &str = "# Generated by `egress-operator crdgen`; do not edit.\n";
    for (file, yaml) in crds()? {
        match out_dir {
            Some(dir) => std::fs::write(dir.join(file), format!("{HEADER}{yaml}"))
                .with_context(|| format!("writing {}", dir.join(file).display()))?,
            None => print!("---\n{HEADER}{yaml}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn read_config(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config {}", path.display()))?;
    // Parse here so a typo is reported against the file, not deep inside the provider.
    let value: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("config {} is not valid JSON", path.display()))?;
    if !value.is_object() {
        bail!("config {} must be a JSON object", path.display());
    }
    Ok(text)
}

fn parse_input<T: serde::de::DeserializeOwned>(
    operation: Operation,
    input: Option<&str>,
) -> anyhow::Result<T> {
    let Some(input) = input else {
        bail!("{} needs --input", operation.as_str())
    };
    serde_json::from_str(input)
        .with_context(|| format!("--input for {} is not what it takes", operation.as_str()))
}

fn build_request(
    operation: Operation,
    config: String,
    input: Option<&str>,
) -> anyhow::Result<Request> {
    Ok(match operation {
        Operation::Describe => Request::Describe,
        Operation::ValidateConfig => Request::ValidateConfig { config },
        Operation::Create => {
            let input: CreateInput = parse_input(operation, input)?;
            Request::Create {
                request: CreateRequest {
                    name: input.name,
                    uid: input.uid,
                    tags: input.tags,
                    user_data: input.user_data,
                    config,
                    placement: None,
                },
            }
        }
        Operation::Get => {
            let input: IdInput = parse_input(operation, input)?;
            Request::Get {
                config,
                provider_id: input.provider_id,
            }
        }
        Operation::Delete => {
            let input: IdInput = parse_input(operation, input)?;
            Request::Delete {
                config,
                provider_id: input.provider_id,
            }
        }
        Operation::ListByTag => {
            let input: TagInput = parse_input(operation, input)?;
            Request::ListByTag {
                config,
                key: input.key,
                value: input.value,
            }
        }
        Operation::Check => Request::Check { config },
    })
}

fn response_json(response: &Response) -> anyhow::Result<serde_json::Value> {
    Ok(serde_json::to_value(response)?)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn words_yaml_1_1_reads_as_booleans_are_quoted_in_the_crds() {
        assert_eq!(
            yaml_1_1_safe("enum:\n- Delete\n- Off\ndefault: Off\nkeep: true\nx: Offline\n"),
            "enum:\n- Delete\n- 'Off'\ndefault: 'Off'\nkeep: true\nx: Offline\n"
        );
        for (_, yaml) in crds().unwrap() {
            assert!(!yaml.lines().any(|line| line.ends_with("- Off")), "{yaml}");
            assert!(!yaml.contains("format: uint"), "{yaml}");
        }
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
