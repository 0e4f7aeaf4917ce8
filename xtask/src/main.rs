//! Project automation for epkv, run as `cargo xtask <command>` (aliased in
//! `.cargo/config.toml`). This is the only place CI logic lives: `.ci/run` calls
//! `cargo xtask ci`, and every step it runs can be run on its own.
//!
//! It is not part of the server: nothing depends on it, and it may depend on anything.
//! Commands: `ci`, `deps`, `check-layers`, `memcapable`, `pytest`, `fuzz-smoke`, `bench
//! frontend|persistence|memory|auth|metrics|subdoc|tls|space|cluster|elastic|rebalance|<micro>`.
//! See CONTRIBUTING.md and docs/testing.md.

mod bench_auth;
mod bench_cluster;
mod bench_collections;
mod bench_elastic;
mod bench_flusher;
mod bench_frontend;
mod bench_memory;
mod bench_metrics;
mod bench_micro;
mod bench_persistence;
mod bench_pipelined;
mod bench_rebalance;
mod bench_space;
mod bench_subdoc;
mod bench_tls;
mod ci;
mod cluster_client;
mod deps;
mod fuzz;
mod layers;
mod memcapable;
mod process;
mod python;
mod util;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "epkv project automation")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the whole test suite (what .ci/run runs); installs its own dependencies.
    Ci(ci::CiOptions),
    /// Install what the tests need (apt packages, .venv, cargo-fuzz); idempotent.
    Deps {
        /// Leave out the nightly/cargo-fuzz check.
        #[arg(long)]
        no_fuzz: bool,
    },
    /// Check that workspace crates depend only on what house-style 9.1 allows.
    CheckLayers,
    /// Run memccapable -b (libmemcached) against a fresh server; all 27 tests must pass.
    Memcapable {
        /// Which server to start.
        #[arg(long, value_enum, default_value = "epkv")]
        against: memcapable::Target,
        /// Cargo profile of the epkv-server binary.
        #[arg(long, default_value = "debug")]
        profile: String,
        /// Test a server that is already running at HOST:PORT instead.
        #[arg(long)]
        addr: Option<String>,
    },
    /// Run the Python client tests (tests/python) against `target/<profile>/epkv-server`.
    Pytest {
        /// Cargo profile of the epkv-server binary.
        #[arg(long, default_value = "debug")]
        profile: String,
        /// Extra pytest arguments (after --).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Fuzz each decoder target briefly with cargo-fuzz (nightly).
    FuzzSmoke {
        /// Seconds per target.
        #[arg(long, default_value_t = 30)]
        secs: u64,
    },
    /// Benchmarks that compare epkv with its peers: `frontend`, `persistence`, `memory`,
    /// `auth`, `tls`, or any bench in crates/epkv-bench/benches (`cargo xtask bench
    /// executor --quick`).
    Bench {
        #[command(subcommand)]
        which: BenchCmd,
    },
}

#[derive(Debug, Subcommand)]
enum BenchCmd {
    /// epkv-server vs memcached under memaslap --binary (ops/s and server CPU per op).
    Frontend(bench_frontend::FrontendOptions),
    /// PersistToMajority SET latency under 1..2000 connections (epkv-fight), with the disk floor.
    Persistence(bench_persistence::PersistenceOptions),
    /// Memory (issue 18): RSS per item vs memcached and Redis, writes past the quota,
    /// cold background fetches vs raw reads of the disk.
    Memory(bench_memory::MemoryOptions),
    /// A victim's latency under storms of failing SASL PLAIN logins (issue 19).
    Auth(bench_auth::AuthOptions),
    /// Sub-document reads and changes against a full GET and GET + CAS SET (issue 20).
    Subdoc(bench_subdoc::SubdocOptions),
    /// A named collection against the default one, and the drop of a large collection
    /// (issue 21).
    Collections(bench_collections::CollectionsOptions),
    /// The persistence path's CPU per persisted item at 1k, 10k, 50k and the highest
    /// SET rates (issue 22).
    Flusher(bench_flusher::FlusherOptions),
    /// Prometheus scrape (issue 19): server CPU per scrape with 1024 vBuckets, every
    /// task's histograms and 1,000 connections, and the exposition's size.
    Metrics(bench_metrics::MetricsOptions),
    /// Pipelined 90/10 GET/SET over TLS vs plain text, epkv against itself (issue 19).
    Tls(bench_tls::TlsOptions),
    /// Data directory over live bytes under random overwrites, fragmentation compaction
    /// on vs off (issue 22).
    Space(bench_space::SpaceOptions),
    /// Two nodes with one replica (issue 23): replication throughput and lag against no
    /// replica, and seed 001's PersistToMajority run on two nodes.
    Cluster(bench_cluster::ClusterOptions),
    /// The etcd cluster (issue 14): failover time, metadata latency, the steady state's
    /// cost and etcd's traffic at idle.
    Elastic(bench_elastic::ElasticOptions),
    /// Rebalance (issue 15): 2 → 3 nodes under a paced 90/10 load; its speed against a
    /// raw DCP backfill, the load's latency against a quiet run, the takeover pause.
    Rebalance(bench_rebalance::RebalanceOptions),
    /// Any other name runs the epkv-bench bench of that name:
    /// `cargo xtask bench executor --quick` is
    /// `cargo bench -p epkv-bench --bench executor -- --quick`.
    #[command(external_subcommand)]
    Micro(Vec<String>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Ci(opts) => ci::ci(&opts),
        Cmd::Deps { no_fuzz } => deps::deps(deps::DepsOptions {
            fuzz: !no_fuzz,
            python: true,
        }),
        Cmd::CheckLayers => layers::check_layers(),
        Cmd::Memcapable {
            against,
            profile,
            addr,
        } => memcapable::memcapable(against, &profile, addr.as_deref()),
        Cmd::Pytest { profile, args } => python::pytest(&profile, &args),
        Cmd::FuzzSmoke { secs } => fuzz::fuzz_smoke(secs),
        Cmd::Bench {
            which: BenchCmd::Frontend(opts),
        } => bench_frontend::bench_frontend(&opts),
        Cmd::Bench {
            which: BenchCmd::Persistence(opts),
        } => bench_persistence::bench_persistence(&opts),
        Cmd::Bench {
            which: BenchCmd::Cluster(opts),
        } => bench_cluster::bench_cluster(&opts),
        Cmd::Bench {
            which: BenchCmd::Elastic(opts),
        } => bench_elastic::bench_elastic(&opts),
        Cmd::Bench {
            which: BenchCmd::Rebalance(opts),
        } => bench_rebalance::bench_rebalance(&opts),
        Cmd::Bench {
            which: BenchCmd::Memory(opts),
        } => bench_memory::bench_memory(&opts),
        Cmd::Bench {
            which: BenchCmd::Auth(opts),
        } => bench_auth::bench_auth(&opts),
        Cmd::Bench {
            which: BenchCmd::Subdoc(opts),
        } => bench_subdoc::bench_subdoc(&opts),
        Cmd::Bench {
            which: BenchCmd::Collections(opts),
        } => bench_collections::bench_collections(&opts),
        Cmd::Bench {
            which: BenchCmd::Flusher(opts),
        } => bench_flusher::bench_flusher(&opts),
        Cmd::Bench {
            which: BenchCmd::Metrics(opts),
        } => bench_metrics::bench_metrics(&opts),
        Cmd::Bench {
            which: BenchCmd::Tls(opts),
        } => bench_tls::bench_tls(&opts),
        Cmd::Bench {
            which: BenchCmd::Space(opts),
        } => bench_space::bench_space(&opts),
        Cmd::Bench {
            which: BenchCmd::Micro(args),
        } => bench_micro::bench_micro(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
