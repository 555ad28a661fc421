//! `kvmlab`: runs a lab (see the library) until interrupted, printing what a libvirt provider
//! needs of it; on exit its domains, pool and network go.

use std::path::PathBuf;

use clap::Parser;
use kvmlab::Lab;

/// A KVM host on the real libvirtd: a dir pool, a DHCP network, a guest image over HTTPS.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Directory receiving the origin's CA (DIR/ca.pem). The pool is a temporary folder of its
    /// own: qemu runs as its own user and must reach every folder above a volume, which a clone
    /// in a private home directory does not let it.
    #[arg(long)]
    state_dir: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.state_dir)?;
    let lab = Lab::start(None).await;
    let ca = args.state_dir.join("ca.pem");
    lab.ca.write_pem(&ca);
    println!("pool: {}", lab.pool.name);
    println!("pool-dir: {}", lab.pool.dir().display());
    println!("network: {}", lab.network.name);
    println!("image-url: {}", lab.image_url());
    println!("image-sha256: {}", lab.image.sha256);
    println!("ca: {}", ca.display());
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    drop(lab);
    Ok(())
}
