//! `vfabric-bench`: vfabric's benchmark harness. Every figure is measured beside its baseline in the same
//! invocation and reported as a ratio to it.

mod baselines;
mod common;
mod compressed_tier;
mod compression;
mod lease_routes;
mod local;
mod lossy;
mod metrics_cost;
mod migrate;
mod packed_tier;
mod pager;
mod region_codecs;
mod remote;
mod report;
mod rig;
mod stats;
mod status;
mod storage;
mod storage_gpu;
mod sweep;
mod sweep_cases;
mod sweep_cluster;
mod sweep_peer;
mod throughput;
mod tiers;
mod trace;
mod walk;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "vfabric-bench",
    version,
    about = "vfabric's benchmark harness: every figure beside its baseline, from the same run"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Pages moved GPU->GPU, GPU<->host and both ways at once, per engine, beside a plain copy of the same bytes.
    Migrate(migrate::MigrateArgs),
    /// A region several times a GPU's budget walked by acquire/release (in order and at random) beside the same
    /// walk kept resident; resident acquire latency; directory memory per page; compaction of a fragmented arena.
    Pager(pager::PagerArgs),
    /// Pages between two agents over QUIC (mutual TLS, checksummed), writes and reads, beside iperf3 TCP on the
    /// same path; remote read latency.
    Remote(remote::RemoteArgs),
    /// A node's agent and local clients in processes of their own: acquire/release latency of a resident page
    /// and pages handed between two processes of one GPU, beside the same in the agent's process.
    Local(local::LocalArgs),
    /// The storage tier's file I/O beside fio (O_DIRECT, io_uring, same path, depth and block size), and the
    /// codecs' (LZ4, zstd) ratio and speed on pages of training data.
    Storage(storage::StorageArgs),
    /// The lossy codecs (fp8, int8 with a scale per 256 values) on pages of training data, packed by the GPU
    /// into host memory and expanded back, beside a plain copy of the same pages: ratio, GB/s, error over the
    /// declared bound.
    Lossy(lossy::LossyArgs),
    /// A PyTorch allocator trace replayed through the fabric's tensor pool, beside the trace's own caching
    /// allocator: peak reserved / peak allocated.
    Trace(trace::TraceArgs),
    /// How long an agent serving many regions takes to answer `vfabric status` and a Prometheus scrape, beside
    /// a ping on the same socket.
    Status(status::StatusArgs),
    /// Block size x batch x batches in flight x read/write between two locations: two of this node's (the
    /// fabric's mover, beside a plain copy) or this node's host memory and a peer's host or GPU (QUIC, beside
    /// iperf3 TCP), as nixlbench and Mooncake's transfer-engine bench measure.
    Sweep(sweep::SweepArgs),
    /// Leases of a peer's pages onto this node's GPU by each route (QUIC through host memory, an NCCL channel GPU
    /// to GPU), beside NCCL's own send/recv of the same bytes; one end of two agents in processes of their own.
    LeaseRoutes(lease_routes::LeaseRoutesArgs),
}

fn main() -> ExitCode {
    vfabric::logging::init();
    let command_line = std::env::args().collect::<Vec<_>>().join(" ");
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Migrate(args) => migrate::run(args, &command_line).map(|_| ()),
        Command::Pager(args) => pager::run(args, &command_line),
        Command::Remote(args) => remote::run(args, &command_line),
        Command::Local(args) => local::run(args, &command_line),
        Command::Storage(args) => storage::run(args, &command_line),
        Command::Lossy(args) => lossy::run(args, &command_line),
        Command::Trace(args) => trace::run(args, &command_line),
        Command::Status(args) => status::run(args, &command_line),
        Command::Sweep(args) => sweep::run(args, &command_line),
        Command::LeaseRoutes(args) => lease_routes::run(args, &command_line),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
