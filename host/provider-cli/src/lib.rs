//! # egress-provider-cli
//!
//! The provider author's commands, `egress-operator provider …` and `egress-operator
//! conformance`: one provider component, alone, without the operator's reconcilers.
//!
//! - `provider inspect FILE|REF`: its name, versions, exports, imports and requested
//!   capabilities; a reference is pulled into memory first;
//! - `provider call FILE OPERATION`: one operation, its result or its classified error as JSON,
//!   under the grants of a file (`egress_capability_set::GrantsFile`); `--record FILE` writes
//!   the call and its exchanges down, `--replay FILE` answers them from a recording
//!   ([`egress_tap`]);
//! - `provider push FILE REF [--sign KEY]`, `provider pull REF`: the component as an OCI artifact
//!   ([`egress_distribution`]);
//! - `conformance FILE --config C --grants G`: the contract's rules against the provider and its
//!   backend ([`egress_conformance`]); `--record DIR` tapes the run, `--replay DIR` runs it
//!   again from the tape with no backend.
//!
//! Exit status: 0 on success, 1 when the operation answered a classified error (or a rule
//! failed), 3 when a replay left its recording; an `Err` is the caller's to print (the binary
//! exits 2).

#![warn(missing_docs)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Subcommand;
use egress_capability_set::{Capabilities, GrantsFile};
use egress_conformance::Taping;
use egress_distribution::oci::{
    DEFAULT_MAX_LAYER_BYTES, DockerConfig, RegistryClient, RegistryOptions,
};
use egress_distribution::signing::SigningKey;
use egress_runtime::types::{CreateRequest, Operation, Request, Tag};
use egress_runtime::{CallContext, Compilation, Provider, Runtime, RuntimeConfig, Tap};
use egress_tap::{Bounds, RecordedProvider, Recorder, Recording, Replay, output_of};
use serde::Deserialize;

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
    /// Record the run into this folder (missing or empty): every provider call of each rule and
    /// every request of the suite's own, one recording each (docs/recordings.md).
    #[arg(long, value_name = "DIR", conflicts_with = "replay")]
    record: Option<PathBuf>,
    /// Replay the run recorded in this folder with no backend; the first step that differs from
    /// the recording fails its rule, named.
    #[arg(long, value_name = "DIR")]
    replay: Option<PathBuf>,
    /// Where the compiled component is cached.
    #[command(flatten)]
    cache: CacheArgs,
}

/// `--cache-dir`: where a command that compiles the component keeps the compiled code.
#[derive(clap::Args, Debug, Clone)]
pub struct CacheArgs {
    /// Where compiled components are cached (`none`: compile every time, write nothing).
    /// Default `$XDG_CACHE_HOME/egress-operator`, else `~/.cache/egress-operator`.
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

impl CacheArgs {
    /// The folder to cache in, if any.
    fn dir(&self) -> Option<PathBuf> {
        match &self.cache_dir {
            Some(dir) if dir.as_os_str() == "none" => None,
            Some(dir) => Some(dir.clone()),
            None => egress_runtime::default_cache_dir(),
        }
    }
}

/// `provider call`'s options.
#[derive(clap::Args, Debug)]
pub struct CallArgs {
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
    /// Write the call (its input, output and every exchange as the broker answered it,
    /// redacted) to this file: docs/recordings.md.
    #[arg(long, value_name = "FILE", conflicts_with = "replay")]
    record: Option<PathBuf>,
    /// Answer the call's requests from this recording instead of the backend: no grant and no
    /// backend needed. Exits 3 naming the first request that differs from the recording, or
    /// when the output differs from the recorded one.
    #[arg(long, value_name = "FILE")]
    replay: Option<PathBuf>,
    /// Where the compiled component is cached.
    #[command(flatten)]
    cache: CacheArgs,
}

/// `egress-operator provider …`.
#[derive(Subcommand, Debug)]
pub enum ProviderCommand {
    /// Print a provider's name, versions, exports, imports and requested capabilities.
    Inspect {
        /// The provider component: a file (an existing path, or a name ending in `.wasm`), or
        /// an artifact reference `REGISTRY/REPOSITORY:TAG` or `…@sha256:DIGEST`, pulled into
        /// memory first.
        target: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// How to reach the registry.
        #[command(flatten)]
        registry: RegistryArgs,
        /// The largest component layer to download, in bytes.
        #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_LAYER_BYTES)]
        max_layer_bytes: u64,
        /// Where the compiled component is cached.
        #[command(flatten)]
        cache: CacheArgs,
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
        /// How to reach the registry.
        #[command(flatten)]
        registry: RegistryArgs,
        /// Where the compiled component is cached (push compiles it to check it).
        #[command(flatten)]
        cache: CacheArgs,
    },
    /// Pull a provider component from a registry, checking its media types, size and digests;
    /// print the reference pinned by digest.
    Pull {
        /// `REGISTRY/REPOSITORY:TAG` or `REGISTRY/REPOSITORY@sha256:DIGEST`.
        reference: String,
        /// The file to write; defaults to the repository's last name with `.wasm`, here.
        #[arg(short = 'o', long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// How to reach the registry.
        #[command(flatten)]
        registry: RegistryArgs,
        /// The largest component layer to download, in bytes.
        #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_LAYER_BYTES)]
        max_layer_bytes: u64,
    },
    /// Run one operation and print its result, or its classified error, as JSON.
    Call(CallArgs),
}

/// Run one `provider` command.
pub async fn run(command: ProviderCommand) -> anyhow::Result<ExitCode> {
    match command {
        ProviderCommand::Inspect {
            target,
            json,
            registry,
            max_layer_bytes,
            cache,
        } => inspect(&target, json, &registry, max_layer_bytes, &cache).await,
        ProviderCommand::Push {
            file,
            reference,
            sign,
            registry,
            cache,
        } => push(&file, &reference, sign.as_deref(), &registry, &cache).await,
        ProviderCommand::Pull {
            reference,
            output,
            registry,
            max_layer_bytes,
        } => pull(&reference, output.as_deref(), &registry, max_layer_bytes).await,
        ProviderCommand::Call(args) => call(&args).await,
    }
}

/// The runtime of a `provider` command.
fn provider_runtime(capabilities: &Capabilities, cache: &CacheArgs) -> anyhow::Result<Runtime> {
    // One call and exit: tiering would only start a background compile the exit throws away.
    // Cranelift's code is cached, so the next run loads it.
    let config = RuntimeConfig::default()
        .compilation(Compilation::Optimized)
        .cache_dir(cache.dir());
    let config = capabilities.serve(config);
    Ok(Runtime::new(config)?)
}

async fn load(
    file: &Path,
    identity: Option<&str>,
    capabilities: &Capabilities,
    cache: &CacheArgs,
) -> anyhow::Result<Arc<Provider>> {
    let runtime = provider_runtime(capabilities, cache)?;
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
pub struct RegistryArgs {
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
    cache: &CacheArgs,
) -> anyhow::Result<ExitCode> {
    // A bad key is found before anything is pushed.
    let key = match sign {
        Some(path) => {
            let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            Some(SigningKey::from_pem(&pem, &path.display().to_string())?)
        }
        None => None,
    };
    let runtime = provider_runtime(&Capabilities::new(), cache)?;
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
    cache: &CacheArgs,
) -> anyhow::Result<ExitCode> {
    // No grants: a provider importing a capability loads and is described, and every use of it
    // is denied.
    let provider = if names_a_file(target) {
        load(Path::new(target), None, &Capabilities::new(), cache).await?
    } else {
        let pulled = registry
            .client(target, max_layer_bytes)?
            .pull(target)
            .await?;
        // The identity a file named after the repository would have (`…/proxmox:1` → `proxmox`).
        let identity = egress_distribution::oci::repository_name(target)?;
        provider_runtime(&Capabilities::new(), cache)?
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

async fn call(args: &CallArgs) -> anyhow::Result<ExitCode> {
    let operation: Operation = args.operation.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    let config = match &args.config {
        Some(path) => read_config(path)?,
        None => "{}".to_owned(),
    };
    let request = build_request(operation, config, args.input.as_deref())?;
    let capabilities = Capabilities::new();
    if let Some(path) = &args.grants {
        GrantsFile::read(path)?
            .grant(&capabilities)
            .with_context(|| format!("grants {}", path.display()))?;
    }
    let provider = load(
        &args.file,
        args.identity.as_deref(),
        &capabilities,
        &args.cache,
    )
    .await?;
    let recorder = (args.record.as_ref()).map(|_| Recorder::new(Bounds::default()));
    let replay = (args.replay.as_deref())
        .map(|path| replay_of(path, &provider))
        .transpose()?;
    let recording_tap = recorder.clone().map(|recorder| recorder as Arc<dyn Tap>);
    let tap = recording_tap.or_else(|| replay.clone().map(|replay| replay as Arc<dyn Tap>));
    let context = CallContext {
        tap,
        ..CallContext::default()
    };
    let result = provider.call(request.clone(), &context).await;
    let output = output_of(&result);
    let printed = match &result {
        Ok(_) => &output["response"],
        Err(_) => &output,
    };
    println!("{}", serde_json::to_string_pretty(printed)?);
    if let (Some(recorder), Some(path)) = (&recorder, &args.record) {
        let input = serde_json::to_value(&request)?;
        let recorded = RecordedProvider::of(&provider);
        let recording = recorder.finish(recorded, operation.as_str(), input, output.clone());
        recording.write(path)?;
        eprintln!(
            "recorded {} exchanges in {}",
            recording.exchanges.len(),
            path.display()
        );
    }
    if let Some(replay) = &replay
        && !replayed_the_recording(replay, &output)
    {
        return Ok(ExitCode::from(3));
    }
    Ok(if result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The replay of the recording at `path` for `provider`.
fn replay_of(path: &Path, provider: &Provider) -> anyhow::Result<Arc<Replay>> {
    let recording = Recording::read(path)?;
    let source = path.display().to_string();
    Ok(Replay::new(recording, &source, provider.description())?)
}

/// Whether the call kept to `replay`'s recording and gave its `output`; says why not, or how
/// much matched, on stderr.
fn replayed_the_recording(replay: &Replay, output: &serde_json::Value) -> bool {
    if let Err(divergence) = replay.verdict() {
        eprintln!("{divergence}");
        return false;
    }
    let recorded = &replay.recording().output;
    if recorded != output {
        eprintln!(
            "replay: every request matched the recording, but the output differs\n  recorded: {recorded}\n  replayed: {output}"
        );
        return false;
    }
    let exchanges = replay.recording().exchanges.len();
    eprintln!("replay: {exchanges} exchanges matched and the output is the recorded one");
    true
}

/// Run `conformance`: the report on stdout (and as JUnit XML with `--junit`).
pub async fn conformance(args: &ConformanceArgs) -> anyhow::Result<ExitCode> {
    let grants = std::fs::read_to_string(&args.grants)
        .with_context(|| format!("reading grants {}", args.grants.display()))?;
    let options = egress_conformance::Options {
        file: args.file.clone(),
        config: read_config(&args.config)?,
        grants,
        identity: args.identity.clone(),
        only: args.only.clone(),
        // A run of a few dozen calls: the same reasoning as `load`.
        runtime: RuntimeConfig::default()
            .compilation(Compilation::Optimized)
            .cache_dir(args.cache.dir()),
        taping: match (&args.record, &args.replay) {
            (Some(dir), _) => Some(Taping::Record(dir.clone())),
            (None, Some(dir)) => Some(Taping::Replay(dir.clone())),
            (None, None) => None,
        },
    };
    let report = egress_conformance::run(&options).await?;
    print!("{}", report.text());
    if let Some(path) = &args.junit {
        std::fs::write(path, report.junit())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(if report.diverged() > 0 {
        ExitCode::from(3)
    } else if report.failed() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
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
