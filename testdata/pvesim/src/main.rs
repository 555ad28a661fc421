//! `pvesim`: runs the Proxmox VE 9.2 simulator until killed, printing its URL, CA file, token
//! and nodes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use pvesim::{FaultRule, SimConfig, Simulator};

/// A Proxmox VE 9.2 API simulator over HTTPS.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8006")]
    listen: SocketAddr,
    /// Directory receiving ca.pem, token and limited-token.
    #[arg(long)]
    state_dir: PathBuf,
    /// The cluster's nodes, in order; the first holds the templates. Repeat the flag or separate
    /// names with commas: `--node pv1-1 --node pv1-2`, `--nodes pv1-1,pv1-2`. With several, the
    /// nodes share the storage `ceph-vms`.
    #[arg(
        long = "node",
        visible_alias = "nodes",
        value_delimiter = ',',
        default_value = "pv1-1"
    )]
    nodes: Vec<String>,
    /// The storage holding the templates' disks: `local-lvm` (the default on one node) or
    /// `ceph-vms` (the default on several: a clone to another node needs it).
    #[arg(long)]
    template_storage: Option<String>,
    /// How long each task runs, in milliseconds.
    #[arg(long, default_value_t = 50)]
    task_latency_ms: u64,
    /// How long after start the guest agent stays unavailable, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    agent_delay_ms: u64,
    /// A fault rule: `METHOD PATH TRIGGER ACTION`, e.g. `POST /nodes/*/qemu/*/clone nth=1 lock`.
    #[arg(long = "fault")]
    faults: Vec<FaultRule>,
    /// Seed for rate-triggered faults.
    #[arg(long, default_value_t = 0)]
    fault_seed: u64,
    /// Preload this many stopped VMs that are not the operator's (a cluster of that size).
    #[arg(long, default_value_t = 0)]
    other_vms: usize,
    /// Serve this many requests, then reset every connection.
    #[arg(long)]
    abort_after: Option<u64>,
    /// Give each VM a proxy service at this port: its agent reports an address of its own in
    /// 127.77.0.0/16, where the simulator listens while the VM runs and answers HTTP CONNECT.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    service_port: Option<u16>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = SimConfig {
        nodes: args.nodes,
        template_storage: args.template_storage,
        task_latency: Duration::from_millis(args.task_latency_ms),
        agent_delay: Duration::from_millis(args.agent_delay_ms),
        state_dir: Some(args.state_dir),
        listen: args.listen,
        fault_seed: args.fault_seed,
        service_port: args.service_port,
        ..SimConfig::default()
    };
    let sim = Simulator::start(config).await?;
    sim.state().add_other_vms(args.other_vms);
    for rule in args.faults {
        sim.faults().add(rule);
    }
    if let Some(n) = args.abort_after {
        sim.faults().abort_after(n);
    }
    println!("url: {}", sim.url());
    println!("ca-file: {}", sim.ca_file().display());
    println!("token: {}", sim.token());
    println!("nodes: {}", sim.nodes().join(","));
    tokio::signal::ctrl_c().await?;
    sim.shutdown();
    Ok(())
}
