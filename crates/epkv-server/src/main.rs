//! `epkv-server`: the epkv key-value server.
//!
//! With no arguments it listens on 127.0.0.1:11210, creates the bucket `default`, persists
//! it under `./epkv-data/default` (warming it back up at the next start), and prints one
//! line saying how to connect:
//!
//! ```text
//! epkv listening on 127.0.0.1:11210 (buckets default, data ./epkv-data, no authentication)
//! ```
//!
//! `--persistence false` runs memory-only (a Couchbase ephemeral bucket): nothing is written
//! under `--data-dir`, documents are lost at exit, and the line says `memory only` instead
//! of the data directory.
//!
//! `--metrics-port PORT` also serves Prometheus metrics at `http://BIND:PORT/metrics`
//! (`metrics.rs`; the line then ends with `, metrics http://ADDR/metrics`).
//!
//! Access: with no users configured and a loopback address, clients use `default` without
//! authenticating. `--admin-user`/`--admin-password` (or `EPKV_ADMIN_USER` /
//! `EPKV_ADMIN_PASSWORD`) and `--users-file` (written by `epkv-server user add`) configure
//! users; then clients authenticate with SASL and select a bucket they may use.
//!
//! Every setting is declared once in `settings.rs` and can be given as a flag
//! (`--max-connections 100`) or in a TOML file (`--config epkv.toml`, same names with
//! dashes or underscores); flags win over the file. `epkv-server --print-settings` prints
//! the table. Logs go to stderr (`--log-level`, `--log-format`, `RUST_LOG`).
//!
//! TLS: `--tls-cert` and `--tls-key` turn on a second listener (`--tls-port`, 11207 by
//! default) serving the same protocol over TLS; the line then ends with `tls HOST:PORT`,
//! and SIGHUP reloads the certificate and key from the same paths (a bad file keeps the
//! old ones and logs an error). Without TLS, SIGHUP keeps its default action.
//!
//! This binary is thin: it resolves the settings, sets up logging, builds the bucket
//! (`epkv-engine`) and hands it to the front end (`epkv-frontend`), then waits for
//! SIGINT/SIGTERM and shuts down gracefully (exit code 0). A second signal exits at once.

mod alloc;
mod bucket_list;
mod byte_size;
mod metrics;
mod rlimit;
mod settings;
mod thp;
mod users;

use anyhow::{Context, Result, bail};
use bucket_list::BucketSpec;
use clap::Parser;
use epkv_engine::{Bucket, BucketConfig, EngineClock};
use epkv_executor::{OffsetClock, SystemClock};
use epkv_frontend::{
    Buckets, DEFAULT_BUCKET, Frontend, FrontendConfig, FrontendError, TlsReloader,
};
use settings::{LogFormat, Resolved, SettingFlags, Settings};
use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc malloc (see `alloc.rs` for why and how it is called).
#[global_allocator]
static GLOBAL: alloc::EpkvAlloc = alloc::EpkvAlloc;

/// Command line: one flag per setting plus a few actions.
#[derive(Debug, Parser)]
#[command(
    name = "epkv-server",
    version,
    args_override_self = true,
    about = "epkv: a memory-first key-value server speaking the memcached binary protocol",
    after_help = "Every setting can also be given in the TOML file named by --config, with the \
                  same name (dashes or underscores). Flags win over the file."
)]
struct Cli {
    #[command(flatten)]
    settings: SettingFlags,
    /// TOML file with settings (keys as the flags without `--`, e.g. `max-connections = 100`)
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print the settings table (markdown) and exit
    #[arg(long)]
    print_settings: bool,
    /// Testing mode: ADJUST_TIMEOFDAY may shift the server clock (for test suites only)
    #[arg(long, hide = true)]
    testing: bool,
    /// Testing mode: no flusher tasks, so nothing is persisted until shutdown (to test
    /// durability timeouts; needs --testing)
    #[arg(long, hide = true, requires = "testing")]
    testing_manual_flush: bool,
    #[command(subcommand)]
    command: Option<CliCommand>,
}

/// Actions other than serving.
#[derive(Debug, clap::Subcommand)]
enum CliCommand {
    /// Manage the users file (`--users-file`)
    #[command(subcommand)]
    User(users::UserCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.print_settings {
        print!("{}", settings::markdown_table());
        return ExitCode::SUCCESS;
    }
    let result = match cli.command {
        Some(CliCommand::User(cmd)) => users::run(cmd),
        None => run(cli),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("epkv-server: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let resolved = settings::resolve(&cli.settings, cli.config.as_deref())?;
    init_logging(&resolved)?;
    thp::disable_for_process();
    let s = &resolved.settings;

    let threads = match s.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let max_connections = rlimit::clamp_connections(s.max_connections, threads);
    let max_packet_size = u32::try_from(s.max_packet_size.bytes())
        .ok()
        .filter(|&n| n >= FrontendConfig::MIN_PACKET_SIZE)
        .with_context(|| {
            format!(
                "max-packet-size must be between {} bytes and 4GiB, not {}",
                FrontendConfig::MIN_PACKET_SIZE,
                s.max_packet_size
            )
        })?;
    let output_buffer_limit = usize::try_from(s.output_buffer_limit.bytes())
        .ok()
        .filter(|&n| n > 0)
        .context("output-buffer-limit must be positive")?;

    let engine_clock = if cli.testing {
        tracing::warn!("testing mode: ADJUST_TIMEOFDAY can shift the server clock");
        EngineClock::Testing(OffsetClock::new())
    } else {
        EngineClock::System
    };
    if cli.testing_manual_flush {
        tracing::warn!("testing mode: no flusher; writes are persisted only at shutdown");
    }
    let (buckets, engines) = build_buckets(s, &engine_clock, cli.testing_manual_flush)?;
    let users = Arc::new(users::configured_users(s)?);
    let tls = settings::tls_config(s).map_err(anyhow::Error::msg)?;

    let config = FrontendConfig {
        bind: SocketAddr::new(s.bind, s.port),
        threads,
        max_connections,
        idle_timeout: (s.idle_timeout > 0).then(|| Duration::from_secs(s.idle_timeout)),
        max_packet_size,
        output_buffer_limit,
        testing: cli.testing,
        shutdown_timeout: Duration::from_secs(s.shutdown_timeout),
        version: epkv_frontend::wire_version(env!("CARGO_PKG_VERSION")),
        clock: Arc::new(SystemClock),
        users: Arc::clone(&users),
        auth_threads: if s.auth_threads == 0 {
            FrontendConfig::default().auth_threads
        } else {
            s.auth_threads
        },
        tls,
    };
    let frontend = Frontend::bind_buckets(config, buckets).map_err(explain_bind_error)?;
    let addr = frontend.local_addr();
    let metrics = match s.metrics_port.0 {
        None => None,
        Some(port) => {
            let metrics_addr = SocketAddr::new(s.bind, port);
            let access = metrics::Access::new(
                Arc::clone(&users),
                users.is_empty() && addr.ip().is_loopback(),
                Arc::new(SystemClock),
            );
            let open = access.is_open();
            if !open && users.is_empty() {
                tracing::warn!(
                    "no users configured and not listening on loopback: every metrics request \
                     is refused (401); configure --admin-user/--admin-password or --users-file"
                );
            }
            let sources = metrics::Sources {
                buckets: engines,
                frontend: frontend.stats(),
            };
            let endpoint = metrics::MetricsEndpoint::bind(metrics_addr, sources, access)
                .with_context(|| {
                    format!(
                        "cannot listen for metrics on {metrics_addr}; choose another --metrics-port"
                    )
                })?;
            tracing::info!(
                addr = %endpoint.local_addr(),
                authentication = !open,
                "Prometheus metrics at http://{}/metrics",
                endpoint.local_addr()
            );
            Some(endpoint)
        }
    };
    let tls_addr = frontend.tls_local_addr();

    let bucket_names = bucket_names(s);
    tracing::info!(
        %addr,
        buckets = %bucket_names,
        users = users.len(),
        data_dir = %s.data_dir.display(),
        threads,
        max_connections,
        memory_quota = %s.memory_quota,
        flush_enabled = s.flush_enabled,
        persistence = s.persistence,
        tls = %tls_addr.map_or_else(|| "off".to_owned(), |a| a.to_string()),
        "epkv-server {} started",
        env!("CARGO_PKG_VERSION")
    );
    if !s.persistence {
        tracing::warn!(
            "persistence is off (--persistence false): documents live in memory only and are \
             lost at exit; the persist durability levels are refused"
        );
    }
    if users.is_empty() && addr.ip().is_loopback() {
        tracing::info!(
            "no users configured: clients on this loopback address use bucket \"default\" \
             without authenticating"
        );
    } else if users.is_empty() {
        tracing::warn!(
            %addr,
            "no users configured and not listening on loopback: no client can use any bucket; \
             configure --admin-user/--admin-password or --users-file"
        );
    }
    if !addr.ip().is_loopback() && tls_addr.is_none() {
        tracing::warn!(
            %addr,
            "listening beyond loopback without TLS: data and PLAIN passwords cross the network \
             in clear text; configure --tls-cert and --tls-key"
        );
    }
    // The one line on stdout: how to connect. Tests read the addresses from it.
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "epkv listening on {addr} (buckets {bucket_names}, {}, {}{}{})",
        if s.persistence {
            format!("data {}", s.data_dir.display())
        } else {
            "memory only".to_owned()
        },
        if users.is_empty() {
            "no authentication".to_owned()
        } else {
            format!("{} users", users.len())
        },
        match &metrics {
            Some(m) => format!(", metrics http://{}/metrics", m.local_addr()),
            None => String::new(),
        },
        tls_addr.map_or_else(String::new, |a| format!(", tls {a}"))
    )
    .and_then(|()| stdout.flush())
    .context("cannot write to stdout")?;
    drop(stdout);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("epkv-acceptor")
        .build()
        .context("cannot start the acceptor runtime")?;
    let reloader = frontend.tls_reloader();
    runtime.block_on(async {
        let shutdown = shutdown_signal().context("cannot install signal handlers")?;
        if let Some(m) = metrics {
            m.spawn().context("cannot serve metrics")?;
        }
        if let Some(reloader) = reloader {
            let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                .context("cannot install the SIGHUP handler")?;
            tokio::spawn(reload_on_sighup(hup, reloader));
        }
        frontend
            .run_until(shutdown)
            .await
            .context("front end failed")
    })?;
    tracing::info!("epkv-server stopped");
    Ok(())
}

/// The bucket names, `default` first, comma separated.
fn bucket_names(s: &Settings) -> String {
    let mut names = vec![DEFAULT_BUCKET];
    names.extend(
        s.buckets
            .0
            .iter()
            .map(|b| b.name.as_str())
            .filter(|n| *n != DEFAULT_BUCKET),
    );
    names.join(",")
}

/// Creates `default` and every configured bucket, each with its own engine, quota and
/// (when persistent) data directory `DATA_DIR/NAME`; memory-only buckets create no
/// directory. All share the engine clock, so ADJUST_TIMEOFDAY moves them together.
/// Returns them for the front end and, by name, as buckets (for the metrics).
fn build_buckets(
    s: &Settings,
    clock: &EngineClock,
    manual_flush: bool,
) -> Result<(Buckets, metrics::NamedBuckets)> {
    let mut specs = vec![BucketSpec {
        name: DEFAULT_BUCKET.to_owned(),
        quota: None,
        eviction: None,
    }];
    for b in &s.buckets.0 {
        match specs.iter_mut().find(|d| d.name == b.name) {
            Some(existing) => {
                existing.quota = b.quota;
                existing.eviction = b.eviction;
            }
            None => specs.push(b.clone()),
        }
    }
    let mut buckets = Buckets::new();
    let mut engines = Vec::new();
    for spec in specs {
        let dir = s.data_dir.join(&spec.name);
        if s.persistence {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create data directory {}", dir.display()))?;
        }
        let quota = spec.quota.unwrap_or(s.memory_quota);
        let config = BucketConfig {
            name: spec.name.clone(),
            memory_quota_bytes: quota.bytes(),
            mem_high_wat_percent: s.mem_high_wat,
            mem_low_wat_percent: s.mem_low_wat,
            ephemeral_full_policy: s.ephemeral_full_policy.0,
            eviction_policy: spec.eviction.unwrap_or(s.eviction_policy).0,
            flush_enabled: s.flush_enabled,
            persistence: s.persistence.then(|| epkv_engine::PersistenceConfig {
                flusher: if manual_flush {
                    epkv_engine::FlusherMode::Manual
                } else {
                    epkv_engine::FlusherMode::Tasks
                },
                journal: if s.journal {
                    epkv_engine::JournalMode::On
                } else {
                    epkv_engine::JournalMode::Off
                },
                fd_budget: (s.fd_budget > 0).then_some(s.fd_budget),
                writer_threads: s.writer_threads,
                ..epkv_engine::PersistenceConfig::new(&dir)
            }),
            ..BucketConfig::default()
        };
        let bucket = Bucket::new(config, clock.clone())
            .with_context(|| format!("cannot create bucket {:?}", spec.name))?;
        tracing::info!(bucket = %spec.name, memory_quota = %quota, persistent = s.persistence, data_dir = %dir.display(), "bucket created");
        buckets.insert(
            &spec.name,
            Arc::clone(&bucket) as Arc<dyn epkv_engine_api::Engine>,
        )?;
        engines.push((spec.name, bucket));
    }
    Ok((buckets, engines))
}

/// Resolves on the first SIGINT or SIGTERM; a second one exits at once.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received; shutting down"),
            _ = int.recv() => tracing::info!("SIGINT received; shutting down"),
        }
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            eprintln!("epkv-server: second signal received; exiting without waiting");
            std::process::exit(130);
        });
    })
}

/// Reloads the TLS certificate and key on every SIGHUP, reading the files on a blocking
/// thread. A failed reload keeps the previous certificate and logs an error.
async fn reload_on_sighup(mut hup: tokio::signal::unix::Signal, reloader: TlsReloader) {
    while hup.recv().await.is_some() {
        let r = reloader.clone();
        match tokio::task::spawn_blocking(move || r.reload()).await {
            Ok(Ok(())) => tracing::info!(
                cert = %reloader.config().cert_path.display(),
                loads = reloader.generation(),
                "SIGHUP: TLS certificate and key reloaded; new connections use them"
            ),
            Ok(Err(e)) => tracing::error!(
                error = %e,
                "SIGHUP: TLS certificate not reloaded; keeping the previous one"
            ),
            Err(e) => tracing::error!(error = %e, "SIGHUP: the TLS reload task failed"),
        }
    }
}

/// Turns a bind failure into one line that says what to do.
fn explain_bind_error(e: FrontendError) -> anyhow::Error {
    let FrontendError::Bind { addr, source } = &e else {
        return e.into();
    };
    let hint = match source.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            "{addr} is already in use (is another epkv-server or memcached running?); \
             choose another port with --port (or --tls-port for the TLS listener)"
        ),
        std::io::ErrorKind::PermissionDenied if addr.port() < 1024 => format!(
            "permission denied listening on {addr}: ports below 1024 need root or \
             CAP_NET_BIND_SERVICE; use a port of 1024 or more (the default is 11210)"
        ),
        std::io::ErrorKind::PermissionDenied => format!("permission denied listening on {addr}"),
        std::io::ErrorKind::AddrNotAvailable => format!(
            "{} is not an address of this machine; check --bind",
            addr.ip()
        ),
        _ => return e.into(),
    };
    anyhow::anyhow!(hint)
}

/// Logs to stderr. An explicit `log-level` wins; otherwise `RUST_LOG` if set; otherwise
/// the default level.
fn init_logging(resolved: &Resolved) -> Result<()> {
    let s = &resolved.settings;
    let from_env = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let directives = match from_env {
        Some(env) if !resolved.is_explicit("log_level") => env,
        _ => s.log_level.clone(),
    };
    let filter = EnvFilter::try_new(&directives)
        .with_context(|| format!("invalid log filter {directives:?}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let installed = match s.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    if let Err(e) = installed {
        bail!("cannot install the logger: {e}");
    }
    Ok(())
}
