//! `kubesim`: runs the Kubernetes API-server stand-in until interrupted, printing its URL.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use kubesim::{KubeSim, SimConfig};

/// A stateful Kubernetes API-server stand-in over plain HTTP, for tests.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Also write a kubeconfig reaching the server to this file.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// How many changes watches can resume from.
    #[arg(long, default_value_t = 100_000)]
    history_limit: usize,
    /// Interval between watch bookmarks, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    bookmark_interval_ms: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let sim = KubeSim::start_with(SimConfig {
        listen: args.listen,
        history_limit: args.history_limit,
        bookmark_interval: Duration::from_millis(args.bookmark_interval_ms),
        ..SimConfig::default()
    })
    .await?;
    println!("url: {}", sim.url());
    if let Some(path) = &args.kubeconfig {
        sim.write_kubeconfig(path)?;
        println!("kubeconfig: {}", path.display());
    }
    tokio::signal::ctrl_c().await?;
    Ok(())
}
