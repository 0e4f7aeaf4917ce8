//! `epkv-server`: the epkv key-value server.
//!
//! With no arguments it listens on 127.0.0.1:11210, creates the bucket `default`, persists
//! it under `./epkv-data/default` (warming it back up at the next start), and prints one
//! line saying how to connect:
//!
//! ```text
//! epkv listening on 127.0.0.1:11210 (buckets default, data ./epkv-data, no users: any credentials accepted on loopback)
//! ```
//!
//! `--persistence false` runs memory-only (a Couchbase ephemeral bucket): nothing is written
//! under `--data-dir`, documents are lost at exit, and the line says `memory only` instead
//! of the data directory.
//!
//! `--metrics-port PORT` also serves Prometheus metrics at `http://BIND:PORT/metrics`
//! (`metrics.rs`; the line then ends with `, metrics http://ADDR/metrics`).
//!
//! `--mgmt-port PORT` (default 8091, `off` to turn it off) serves the management REST
//! subset the Couchbase SDKs use (`mgmt/`, docs/rest.md; the line then says
//! `, mgmt http://ADDR`). Buckets and users created through it are kept in the data
//! directory (`bucket_manager.rs`, `users.rs`). `epkv-server bucket create|drop` call it
//! on a running server (`bucket_cli.rs`).
//!
//! Access: with no users configured and a loopback address, clients use every bucket
//! (`default` from the start) without authenticating, and SASL accepts any user name and
//! password, so Couchbase SDKs, which always authenticate, need no setup. `--admin-user`/`--admin-password` (or `EPKV_ADMIN_USER` /
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
mod bucket_cli;
mod bucket_list;
mod bucket_manager;
mod byte_size;
mod cluster_meta;
mod http_auth;
mod http_limits;
mod http_server;
mod metrics;
mod mgmt;
mod rlimit;
mod settings;
mod thp;
mod users;

use anyhow::{Context, Result, bail};
use bucket_manager::BucketManager;
use clap::Parser;
use epkv_auth::UserDirectory;
use epkv_engine::EngineClock;
use epkv_executor::{OffsetClock, SystemClock};
use epkv_frontend::{Frontend, FrontendConfig, FrontendError, TlsReloader};
use settings::{LogFormat, Resolved, SettingFlags};
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
    /// Create or drop a bucket on a running server, through its management REST API
    #[command(subcommand)]
    Bucket(bucket_cli::BucketCommand),
    /// Create or drop a scope on a running server
    #[command(subcommand)]
    Scope(bucket_cli::ScopeCommand),
    /// Create or drop a collection on a running server
    #[command(subcommand)]
    Collection(bucket_cli::CollectionCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.print_settings {
        print!("{}", settings::markdown_table());
        return ExitCode::SUCCESS;
    }
    let result = match cli.command {
        Some(CliCommand::User(cmd)) => users::run(cmd),
        Some(CliCommand::Bucket(cmd)) => bucket_cli::run(&cmd),
        Some(CliCommand::Scope(cmd)) => bucket_cli::run_scope(&cmd),
        Some(CliCommand::Collection(cmd)) => bucket_cli::run_collection(&cmd),
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
    let manager = Arc::new(BucketManager::start(
        s,
        &engine_clock,
        cli.testing_manual_flush,
    )?);
    let start_users = users::configured_users(s)?;
    let users = UserDirectory::new(start_users.live.clone());
    let tls = settings::tls_config(s).map_err(anyhow::Error::msg)?;
    let http_limits = settings::http_limits(s).map_err(anyhow::Error::msg)?;
    let mgmt_counters = Arc::new(http_limits::HttpCounters::default());
    let metrics_counters = Arc::new(http_limits::HttpCounters::default());
    let mgmt_listener = bind_mgmt(&resolved, http_limits, Arc::clone(&mgmt_counters))?;

    // The cluster map, replication and failover (a single node without --cluster): the
    // front end asks it for the map, the management API changes it.
    let served = manager.buckets().clone();
    let served: epkv_cluster::BucketList = Arc::new(move || served.iter().collect());
    let cluster = match settings::etcd_join(s).map_err(anyhow::Error::msg)? {
        Some(join) => epkv_cluster::Cluster::with_etcd(join, served),
        None => epkv_cluster::Cluster::new(
            settings::cluster_topology(s).map_err(anyhow::Error::msg)?,
            served,
        ),
    };
    let audit = if s.audit_log.as_os_str().is_empty() {
        epkv_auth::AuditLog::disabled()
    } else {
        let wall = SystemClock;
        epkv_auth::AuditLog::open(
            &s.audit_log,
            Arc::new(move || epkv_executor::Clock::unix_time(&wall)),
        )
        .with_context(|| format!("cannot open the audit log {}", s.audit_log.display()))?
    };
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
        users: users.clone(),
        mgmt_port: mgmt_listener.as_ref().map(|l| l.local_addr().port()),
        auth_threads: if s.auth_threads == 0 {
            FrontendConfig::default().auth_threads
        } else {
            s.auth_threads
        },
        tls,
        cluster: Some(Arc::clone(&cluster) as Arc<dyn epkv_engine_api::ClusterView>),
        audit: audit.clone(),
    };
    let frontend =
        Frontend::bind_buckets(config, manager.buckets().clone()).map_err(explain_bind_error)?;
    let addr = frontend.local_addr();
    let access = Arc::new(http_auth::Access::new(
        users.clone(),
        frontend.handle().is_open(),
        Arc::new(SystemClock),
        audit.clone(),
    ));
    let user_count = users.current().len();
    let metrics = match s.metrics_port.0 {
        None => None,
        Some(port) => {
            let metrics_addr = SocketAddr::new(s.bind, port);
            let open = access.is_open();
            if !open && user_count == 0 {
                tracing::warn!(
                    "no users configured and not listening on loopback: every metrics request \
                     is refused (401); configure --admin-user/--admin-password or --users-file"
                );
            }
            let sources = metrics::Sources {
                buckets: Arc::clone(&manager),
                frontend: frontend.stats(),
                http: vec![
                    ("mgmt", Arc::clone(&mgmt_counters)),
                    ("metrics", Arc::clone(&metrics_counters)),
                ],
                cluster: Arc::clone(&cluster),
            };
            let endpoint = metrics::MetricsEndpoint::bind(
                metrics_addr,
                sources,
                Arc::clone(&access),
                http_limits,
                Arc::clone(&metrics_counters),
            )
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
    let mgmt_addr = mgmt_listener
        .as_ref()
        .map(http_server::HttpListener::local_addr);
    let user_admin = Arc::new(mgmt::UserAdmin::new(
        users.clone(),
        start_users.saved,
        start_users.path,
        start_users.admin,
    ));
    let mgmt = mgmt_listener.map(|listener| {
        let state = mgmt::Mgmt::new(
            Arc::clone(&access),
            Arc::clone(&manager),
            Arc::clone(&user_admin),
            frontend.handle(),
            Arc::clone(&cluster),
            epkv_frontend::wire_version(env!("CARGO_PKG_VERSION")),
            Arc::new(SystemClock),
        )
        .with_testing(cli.testing);
        (state, listener)
    });
    if let Some(a) = mgmt_addr {
        tracing::info!(addr = %a, "management REST API at http://{a}");
    }

    let bucket_names = manager.names().join(",");
    tracing::info!(
        %addr,
        buckets = %bucket_names,
        users = user_count,
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
    if user_count == 0 && addr.ip().is_loopback() {
        tracing::info!(
            "no users configured: clients on this loopback address use every bucket, \
             without authenticating or with any user name and password (Couchbase SDKs \
             always authenticate)"
        );
    } else if user_count == 0 {
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
        "epkv listening on {addr} (buckets {bucket_names}, {}, {}{}{}{})",
        if s.persistence {
            format!("data {}", s.data_dir.display())
        } else {
            "memory only".to_owned()
        },
        if user_count == 0 && addr.ip().is_loopback() {
            "no users: any credentials accepted on loopback".to_owned()
        } else if user_count == 0 {
            "no users: every login refused".to_owned()
        } else {
            format!("{user_count} users")
        },
        match &metrics {
            Some(m) => format!(", metrics http://{}/metrics", m.local_addr()),
            None => String::new(),
        },
        mgmt_addr.map_or_else(String::new, |a| format!(", mgmt http://{a}")),
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
        // A cluster node takes its vBuckets' states from the map before it serves
        // (clients wait in the listen backlog meanwhile).
        cluster
            .start(Some(settings::this_node(s, addr, mgmt_addr)))
            .await
            .map_err(anyhow::Error::msg)?;
        // With --etcd, buckets, collections and users are the cluster's: seeded from or
        // reconciled to etcd before the management API serves.
        let meta = match (cluster.etcd(), cluster.node_id(), cluster.coordinator()) {
            (Some(etcd), Some(id), Some(coord)) => {
                let served = Arc::clone(&cluster);
                let forget = Arc::clone(&access);
                let local = cluster_meta::Local {
                    buckets: Arc::clone(&manager),
                    users: Arc::clone(&user_admin),
                    buckets_changed: Box::new(move || served.buckets_changed()),
                    users_changed: Box::new(move || forget.forget()),
                };
                let meta =
                    cluster_meta::ClusterMeta::start(etcd, id, local, cluster_meta::WAIT_FOR_NODES)
                        .await
                        .map_err(|e| {
                            anyhow::anyhow!("cannot load the cluster's metadata from etcd: {e}")
                        })?;
                tokio::spawn(cluster_meta::register_on_new_leases(
                    Arc::downgrade(&meta),
                    coord.registrations(),
                ));
                tracing::info!(
                    node = meta.node_id(),
                    revision = meta.applied_revision(),
                    "following the cluster's metadata in etcd"
                );
                Some(meta)
            }
            _ => None,
        };
        if let Some((state, listener)) = mgmt {
            let state = match &meta {
                Some(m) => state.with_meta(Arc::clone(m)),
                None => state,
            };
            state
                .spawn(listener)
                .context("cannot serve the management API")?;
        }
        frontend
            .run_until(shutdown)
            .await
            .context("front end failed")
    })?;
    tracing::info!("epkv-server stopped");
    Ok(())
}

/// Binds the management port: `None` when it is off, or when it was left at its default
/// and that port is taken (logged; the server runs without it). An explicit port that
/// cannot be bound is an error.
fn bind_mgmt(
    resolved: &Resolved,
    limits: http_limits::HttpLimits,
    counters: Arc<http_limits::HttpCounters>,
) -> Result<Option<http_server::HttpListener>> {
    let s = &resolved.settings;
    let Some(port) = s.mgmt_port.0 else {
        return Ok(None);
    };
    let addr = SocketAddr::new(s.bind, port);
    match http_server::HttpListener::bind(addr, limits, counters) {
        Ok(l) => Ok(Some(l)),
        Err(e) if !resolved.is_explicit("mgmt_port") => {
            tracing::warn!(%addr, error = %e, "cannot listen on the default management port; running without the management REST API (set --mgmt-port to another port, or off)");
            Ok(None)
        }
        Err(e) => Err(e).with_context(|| {
            format!("cannot listen for the management API on {addr}; choose another --mgmt-port")
        }),
    }
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
