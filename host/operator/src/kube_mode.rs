//! Kubernetes mode: in progress.

use std::process::ExitCode;

use crate::cli::RunArgs;

/// Run the operator against a cluster.
pub async fn run(args: &RunArgs) -> anyhow::Result<ExitCode> {
    let _ = args;
    anyhow::bail!("Kubernetes mode is not built yet")
}
