//! Local mode: in progress.

use std::path::Path;
use std::process::ExitCode;

use crate::cli::RunArgs;

/// Run local mode over `dir`.
pub async fn run(dir: &Path, args: &RunArgs) -> anyhow::Result<ExitCode> {
    let _ = (dir, args);
    anyhow::bail!("local mode is not built yet")
}

/// Print local mode's Proxies.
pub fn get_proxies(dir: &Path, output: &str) -> anyhow::Result<ExitCode> {
    let _ = (dir, output);
    anyhow::bail!("local mode is not built yet")
}
