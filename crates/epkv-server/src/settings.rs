//! Every server setting, declared once in the `settings!` table below.
//!
//! The one declaration produces:
//! - [`Settings`], the resolved values the server runs with;
//! - [`SettingFlags`], one optional command-line flag per setting (`--max-connections`);
//! - the TOML file format read by `--config FILE` (the same names, written with dashes or
//!   underscores: `max-connections = 100` and `max_connections = 100` are the same key);
//! - [`SETTINGS`], the name / default / unit / help table printed by
//!   `epkv-server --print-settings` (markdown) and used by the docs.
//!
//! Precedence: a command-line flag beats the file, which beats the default. Defaults are
//! written as the text a user would type, and parsed with the same parser as the flags, so
//! the documented default is the real one.

use crate::bucket_list::{BucketList, CollectionList, Secret};
use crate::byte_size::ByteSize;
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!("unknown log format {other:?}: use text or json")),
        }
    }
}

impl<'de> serde::Deserialize<'de> for LogFormat {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What a memory-only bucket does at its quota (Couchbase's `ephemeral_full_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EphemeralPolicy(pub(crate) epkv_engine::EphemeralFullPolicy);

impl FromStr for EphemeralPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "auto-delete" => Ok(Self(epkv_engine::EphemeralFullPolicy::AutoDelete)),
            "fail-new-data" => Ok(Self(epkv_engine::EphemeralFullPolicy::FailNewData)),
            other => Err(format!(
                "unknown ephemeral full policy {other:?}: use auto-delete or fail-new-data"
            )),
        }
    }
}

impl<'de> serde::Deserialize<'de> for EphemeralPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What the item pager of a persistent bucket evicts (Couchbase's `eviction_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Eviction(pub(crate) epkv_engine::EvictionPolicy);

impl FromStr for Eviction {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "value" | "value-only" => Ok(Self(epkv_engine::EvictionPolicy::Value)),
            "full" | "full-eviction" => Ok(Self(epkv_engine::EvictionPolicy::Full)),
            other => Err(format!(
                "unknown eviction policy {other:?}: use value or full"
            )),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Eviction {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// An optional listener port (metrics, management): off (written as an empty string or
/// `off`) or a TCP port, 0 picking a free one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct OptionalPort(pub(crate) Option<u16>);

impl FromStr for OptionalPort {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "" | "off" => Ok(Self(None)),
            p => p
                .parse()
                .map(|p| Self(Some(p)))
                .map_err(|_| format!("invalid port {p:?}: use 0-65535 or off")),
        }
    }
}

impl<'de> serde::Deserialize<'de> for OptionalPort {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Port(u16),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Port(p) => Ok(Self(Some(p))),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Client certificates on the TLS port (`tls-client-auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TlsClientAuth(pub(crate) epkv_frontend::ClientAuth);

impl FromStr for TlsClientAuth {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(Self)
    }
}

impl<'de> serde::Deserialize<'de> for TlsClientAuth {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The shards' storage backend (`storage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Storage(pub(crate) epkv_engine::StorageBackend);

impl FromStr for Storage {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(Self)
    }
}

impl<'de> serde::Deserialize<'de> for Storage {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The cluster this node is in, from the cluster file (`--cluster`) and its index
/// (`--cluster-node`); `None` without a file.
///
/// # Errors
/// The file cannot be read or is invalid, or the index names no node.
pub(crate) fn cluster_topology(s: &Settings) -> Result<Option<epkv_cluster::Topology>, String> {
    if s.cluster.as_os_str().is_empty() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&s.cluster)
        .map_err(|e| format!("cannot read the cluster file {}: {e}", s.cluster.display()))?;
    let file = epkv_cluster::ClusterFile::parse(&text)?;
    std::fs::create_dir_all(&s.data_dir).map_err(|e| {
        format!(
            "cannot create the data directory {}: {e}",
            s.data_dir.display()
        )
    })?;
    epkv_cluster::Topology::new(file, s.cluster_node)?
        .with_state_file(s.data_dir.join("cluster-state.json"))
        .map(Some)
}

/// How this node joins an etcd cluster (`--etcd`): `None` without it. A cluster file
/// given too seeds a new cluster's topology; the replication credentials are the file's,
/// else the admin user's.
///
/// # Errors
/// The cluster file cannot be read or is invalid, or a wildcard bind address without
/// `advertise-host`.
pub(crate) fn etcd_join(s: &Settings) -> Result<Option<epkv_cluster::EtcdJoin>, String> {
    if s.etcd.trim().is_empty() {
        return Ok(None);
    }
    let endpoints: Vec<String> = s
        .etcd
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| {
            if e.contains("://") {
                e.to_owned()
            } else {
                format!("http://{e}")
            }
        })
        .collect();
    if s.cluster_name.is_empty() || s.cluster_name.contains('/') {
        return Err("--cluster-name must be non-empty and without '/'".into());
    }
    if s.advertise_host.is_empty() && s.bind.is_unspecified() && s.cluster.as_os_str().is_empty() {
        return Err(format!(
            "--etcd with bind {}: give --advertise-host, the address other nodes and clients reach this node at",
            s.bind
        ));
    }
    let seed = if s.cluster.as_os_str().is_empty() {
        None
    } else {
        let text = std::fs::read_to_string(&s.cluster)
            .map_err(|e| format!("cannot read the cluster file {}: {e}", s.cluster.display()))?;
        Some(epkv_cluster::ClusterFile::parse(&text)?)
    };
    let this = match &seed {
        Some(f) => Some(f.nodes.get(s.cluster_node).cloned().ok_or_else(|| {
            format!(
                "--cluster-node {}: the cluster file names nodes 0 to {}",
                s.cluster_node,
                f.nodes.len().saturating_sub(1)
            )
        })?),
        None => None,
    };
    let admin = (!s.admin_user.is_empty() && !s.admin_password.expose().is_empty())
        .then(|| (s.admin_user.clone(), s.admin_password.expose().to_owned()));
    let credentials = seed
        .as_ref()
        .and_then(|f| f.user.clone().zip(f.password.clone()))
        .or(admin);
    Ok(Some(epkv_cluster::EtcdJoin {
        settings: epkv_cluster::EtcdSettings {
            endpoints,
            cluster_name: s.cluster_name.clone(),
        },
        replicas: seed.as_ref().map_or(1, |f| f.replicas),
        this,
        seed,
        credentials,
    }))
}

/// Where this node is, as an etcd cluster started without a cluster file names it:
/// `advertise-host` (or the bind address) with the ports it listens on.
pub(crate) fn this_node(
    s: &Settings,
    kv: SocketAddr,
    mgmt: Option<SocketAddr>,
) -> epkv_cluster::NodeSpec {
    let host = if s.advertise_host.is_empty() {
        s.bind.to_string()
    } else {
        s.advertise_host.clone()
    };
    epkv_cluster::NodeSpec {
        host,
        port: kv.port(),
        mgmt_port: mgmt.map(|a| a.port()),
    }
}

/// The TLS listener's configuration from the settings: `None` without `tls-cert` and
/// `tls-key` (no TLS listener).
///
/// # Errors
/// Only one of `tls-cert` / `tls-key` given; `tls-client-auth` or `tls-ca` without them;
/// client certificates without `tls-ca`; a zero handshake timeout.
pub(crate) fn tls_config(s: &Settings) -> Result<Option<epkv_frontend::TlsConfig>, String> {
    let given = |p: &Path| !p.as_os_str().is_empty();
    let (cert, key) = (given(&s.tls_cert), given(&s.tls_key));
    if !cert && !key {
        if s.tls_client_auth.0 != epkv_frontend::ClientAuth::None || given(&s.tls_ca) {
            return Err(
                "tls-client-auth and tls-ca need TLS: give tls-cert and tls-key too".to_owned(),
            );
        }
        return Ok(None);
    }
    if cert != key {
        return Err(format!(
            "TLS needs both tls-cert and tls-key; only {} is given",
            if cert { "tls-cert" } else { "tls-key" }
        ));
    }
    let config = epkv_frontend::TlsConfig {
        port: s.tls_port,
        cert_path: s.tls_cert.clone(),
        key_path: s.tls_key.clone(),
        client_auth: s.tls_client_auth.0,
        ca_path: given(&s.tls_ca).then(|| s.tls_ca.clone()),
        handshake_timeout: std::time::Duration::from_secs(s.tls_handshake_timeout),
    };
    config.validate().map_err(|e| e.to_string())?;
    Ok(Some(config))
}

/// The HTTP listeners' connection limits from the settings.
///
/// # Errors
/// A zero limit or timeout.
pub(crate) fn http_limits(s: &Settings) -> Result<crate::http_limits::HttpLimits, String> {
    for (name, v) in [
        ("http-max-connections", s.http_max_connections as u64),
        (
            "http-max-connections-per-address",
            s.http_max_connections_per_address as u64,
        ),
        ("http-header-timeout", s.http_header_timeout),
        ("http-idle-timeout", s.http_idle_timeout),
    ] {
        if v == 0 {
            return Err(format!("{name} must be at least 1"));
        }
    }
    Ok(crate::http_limits::HttpLimits {
        max_connections: s.http_max_connections,
        max_per_address: s.http_max_connections_per_address,
        header_timeout: std::time::Duration::from_secs(s.http_header_timeout),
        idle_timeout: std::time::Duration::from_secs(s.http_idle_timeout),
    })
}

/// One row of the settings table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SettingInfo {
    /// The name, with underscores (the flag is the same with dashes).
    pub(crate) name: &'static str,
    /// The default, as text.
    pub(crate) default: &'static str,
    /// The unit or kind of value.
    pub(crate) unit: &'static str,
    /// What it does.
    pub(crate) help: &'static str,
}

impl SettingInfo {
    /// The command-line flag for this setting.
    #[must_use]
    pub(crate) fn flag(&self) -> String {
        format!("--{}", self.name.replace('_', "-"))
    }
}

/// Why the settings could not be resolved.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SettingsError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The config file is not valid TOML or has a bad value or unknown key.
    #[error("config file {path}: {message}")]
    ParseFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A built-in default did not parse (a bug in the table; covered by a test).
    #[error("built-in default {value:?} of setting {name} does not parse: {message}")]
    BadDefault {
        /// The setting.
        name: &'static str,
        /// The default text.
        value: &'static str,
        /// The parser's complaint.
        message: String,
    },
}

/// Parses a default from the table.
fn parse_default<T: FromStr>(name: &'static str, value: &'static str) -> Result<T, SettingsError>
where
    T::Err: std::fmt::Display,
{
    value
        .parse()
        .map_err(|e: T::Err| SettingsError::BadDefault {
            name,
            value,
            message: e.to_string(),
        })
}

macro_rules! settings {
    ($(
        $name:ident : $ty:ty = $default:literal, unit = $unit:literal, help = $help:literal
            $(, clap($($attr:tt)*))? ;
    )*) => {
        /// The resolved settings the server runs with.
        #[derive(Debug, Clone, PartialEq)]
        pub(crate) struct Settings {
            $( #[doc = $help] pub(crate) $name: $ty, )*
        }

        /// One optional command-line flag per setting; `None` when not given.
        #[derive(Debug, Default, Clone, clap::Args)]
        pub(crate) struct SettingFlags {
            $(
                #[arg(long, value_name = $unit, help = $help $(, $($attr)*)?)]
                #[doc = $help]
                pub(crate) $name: Option<$ty>,
            )*
        }

        /// The TOML file: the same settings, every one optional.
        #[derive(Debug, Default, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct FileSettings {
            $( #[serde(default)] $name: Option<$ty>, )*
        }

        /// The settings table: every setting with its default, unit and help text.
        pub(crate) const SETTINGS: &[SettingInfo] = &[
            $( SettingInfo {
                name: stringify!($name),
                default: $default,
                unit: $unit,
                help: $help,
            }, )*
        ];

        impl Settings {
            /// The built-in defaults.
            ///
            /// # Errors
            /// Only if a default in the table does not parse, which a test rules out.
            pub(crate) fn defaults() -> Result<Self, SettingsError> {
                Ok(Self { $( $name: parse_default(stringify!($name), $default)?, )* })
            }

            /// Flags over file over defaults. Returns the settings and the names of those
            /// given explicitly (by a flag or the file).
            fn merge(
                flags: &SettingFlags,
                file: FileSettings,
            ) -> Result<(Self, BTreeSet<&'static str>), SettingsError> {
                let mut explicit = BTreeSet::new();
                let defaults = Self::defaults()?;
                let s = Self { $(
                    $name: match (flags.$name.clone(), file.$name) {
                        (Some(v), _) | (None, Some(v)) => {
                            explicit.insert(stringify!($name));
                            v
                        }
                        (None, None) => defaults.$name,
                    },
                )* };
                Ok((s, explicit))
            }
        }
    };
}

settings! {
    bind: IpAddr = "127.0.0.1", unit = "address",
        help = "IP address to listen on (0.0.0.0 for every interface)";
    port: u16 = "11210", unit = "port",
        help = "TCP port for memcached binary protocol clients (0 picks a free port)";
    threads: usize = "0", unit = "count",
        help = "Front-end worker threads; 0 means one per CPU core";
    auth_threads: usize = "0", unit = "count",
        help = "Threads that check SASL PLAIN passwords (a PBKDF2 derivation of milliseconds), so that failing logins never stall the front-end threads; 0 means half the CPU cores (at least 1). Failed attempts are also throttled per source address and per connection";
    buckets: BucketList = "", unit = "list",
        help = "Buckets to create besides `default` (which always exists): NAME, NAME=QUOTA, NAME/EVICTION or NAME=QUOTA/EVICTION, comma separated, e.g. travel,beer=256MiB,logs=1GiB/full. Each is its own engine with its own quota (memory-quota unless given), eviction policy (eviction-policy unless given) and directory DATA_DIR/NAME";
    collections: CollectionList = "", unit = "list",
        help = "Scopes and collections to create at startup when missing: BUCKET:SCOPE.COLLECTION or BUCKET:SCOPE.COLLECTION=MAXTTL (seconds), comma separated, e.g. travel:inventory.airline,travel:inventory.hotel=3600. Scopes are created as needed; existing ones are left as they are (a manifest changed at run time is kept across restarts)";
    memory_quota: ByteSize = "1GiB", unit = "bytes",
        help = "Memory quota of each bucket that does not set its own; accepts suffixes such as 512MiB or 2GiB";
    mem_high_wat: u8 = "85", unit = "percent",
        help = "High watermark, percent of each bucket's quota: past it the item pager frees memory (persistent buckets eject the values of persisted documents, read back from disk when needed) down to the low watermark";
    mem_low_wat: u8 = "75", unit = "percent",
        help = "Low watermark, percent of each bucket's quota: where the item pager stops (below mem-high-wat)";
    eviction_policy: Eviction = "value", unit = "policy",
        help = "What the item pager of a persistent bucket takes out of memory past the high watermark, for buckets that do not set their own: value (values only; keys and metadata stay, so absent keys never touch the disk) or full (whole documents; a per-vBucket bloom filter spares disk reads of absent keys)";
    ephemeral_full_policy: EphemeralPolicy = "auto-delete", unit = "policy",
        help = "With `--persistence false`, what a bucket does past its high watermark: auto-delete (the item pager deletes the least used documents) or fail-new-data (writes that do not fit answer ENOMEM)";
    data_dir: PathBuf = "./epkv-data", unit = "path",
        help = "Directory for the buckets' data, one subdirectory per bucket (created if missing)";
    users_file: PathBuf = "", unit = "path",
        help = "Users file (TOML, salted SCRAM verifiers; write it with `epkv-server user add`). With users configured, clients must authenticate with SASL and select a bucket they may use";
    admin_user: String = "", unit = "name",
        help = "Create a user with the admin role (every privilege on every bucket; with admin-password); also EPKV_ADMIN_USER",
        clap(env = "EPKV_ADMIN_USER");
    admin_password: Secret = "", unit = "password",
        help = "Password of admin-user, kept only as salted hashes in memory; also EPKV_ADMIN_PASSWORD",
        clap(env = "EPKV_ADMIN_PASSWORD", hide_env_values = true);
    audit_log: PathBuf = "", unit = "path",
        help = "Append security events to this file as JSON lines (created with mode 0600): REST authentication failures and privilege refusals, users created, changed and deleted, buckets created, dropped and flushed (see docs/auth.md); off unless set";
    metrics_port: OptionalPort = "", unit = "port",
        help = "Serve Prometheus metrics (text format) at http://BIND:PORT/metrics; off unless set, 0 picks a free port (the startup line names it). Same address and authentication as the KV port: with users configured, HTTP Basic auth with a user's password";
    mgmt_port: OptionalPort = "8091", unit = "port",
        help = "Serve the management REST subset the Couchbase SDKs and tools use (/pools, buckets, users; see docs/rest.md) at http://BIND:PORT, advertised to SDKs as `mgmt`; 0 picks a free port (the startup line names it), off turns it off. Same users and access as the KV port (HTTP Basic auth). When left at its default and 8091 is taken, the server starts without it and logs a warning";
    http_max_connections: usize = "256", unit = "count",
        help = "Most connections each HTTP listener (management, metrics) holds at once. When it is full, a new connection takes the slot of an idle or half-open one that has not yet been answered to valid credentials (the oldest of the address holding the most); only when every slot is trusted or inside a request is the new one closed at once";
    http_max_connections_per_address: usize = "16", unit = "count",
        help = "Most connections to each HTTP listener from one client address (an IPv6 client counts by its /64); more are closed at once";
    http_header_timeout: u64 = "2", unit = "seconds",
        help = "Close an HTTP connection that has not sent complete request headers within this time after it connected or began its next request";
    http_idle_timeout: u64 = "30", unit = "seconds",
        help = "Close a keep-alive HTTP connection idle this long between requests";
    cluster: PathBuf = "", unit = "path",
        help = "Cluster file (TOML: replicas, nodes in order as host and port; see docs/cluster.md). Every node of a static cluster is started with the same file and its own cluster-node; vBucket states, replication and the cluster map follow from it";
    cluster_node: usize = "0", unit = "index",
        help = "This node's index in the cluster file's node list (with cluster)";
    etcd: String = "", unit = "urls",
        help = "Comma-separated client URLs of the etcd cluster that holds this cluster's state (membership, vBucket maps, buckets, collections, users, auto-failover; see docs/cluster.md), e.g. http://127.0.0.1:2379. Off unless set: a single node, or the static cluster file";
    cluster_name: String = "default", unit = "name",
        help = "With etcd: the cluster's name (its keys live under /epkv/NAME/ in etcd, so several clusters can share one etcd)";
    advertise_host: String = "", unit = "host",
        help = "With etcd: the host name or IP address other nodes and clients reach this node at; defaults to bind (which must then not be a wildcard address). With a cluster file the file says it";
    tls_cert: PathBuf = "", unit = "path",
        help = "PEM file with the server's TLS certificate chain, leaf first. With tls-key it turns on a second listener serving the same protocol over TLS 1.2/1.3 on tls-port (same address as bind), advertised to Couchbase SDKs as kvSSL so that couchbases:// clients work. SIGHUP reloads the certificate and key from the same paths (new connections get them; a bad file keeps the old ones)";
    tls_key: PathBuf = "", unit = "path",
        help = "PEM file with the private key of tls-cert (PKCS#8, PKCS#1 or SEC1)";
    tls_port: u16 = "11207", unit = "port",
        help = "TCP port of the TLS listener, used when tls-cert and tls-key are given (0 picks a free port)";
    tls_client_auth: TlsClientAuth = "none", unit = "mode",
        help = "Client certificates on the TLS port: none, optional (a client may present one) or mandatory (every client must). A certificate signed by tls-ca authenticates the connection, without SASL, as the user its Subject CN names; one naming no user is refused";
    tls_ca: PathBuf = "", unit = "path",
        help = "PEM file with the CA certificate(s) that sign client certificates; needed with tls-client-auth optional or mandatory (reloaded by SIGHUP too)";
    tls_handshake_timeout: u64 = "10", unit = "seconds",
        help = "Close a TLS connection whose handshake has not completed within this time, so clients that connect and send nothing do not hold connections";
    max_connections: usize = "4096", unit = "count",
        help = "Most client connections at once; more are accepted and closed at once. Clamped to the open-file limit minus a reserve";
    idle_timeout: u64 = "0", unit = "seconds",
        help = "Close a connection with no traffic (nothing read or written) for this long; 0 never closes idle connections (as memcached)";
    max_packet_size: ByteSize = "20MiB", unit = "bytes",
        help = "Largest request packet (header + body) accepted; larger ones close the connection";
    output_buffer_limit: ByteSize = "2MiB", unit = "bytes",
        help = "Per-connection replies pending before the server stops reading from that client";
    persistence: bool = "true", unit = "bool",
        help = "Persist every bucket under DATA_DIR/NAME (per-vBucket files, a journal per shard, flusher tasks, warmup at start, final flush at shutdown). `--persistence false` runs memory-only, as a Couchbase ephemeral bucket: nothing is written to DATA_DIR, data is lost at exit, and the persist durability levels are refused",
        clap(num_args = 0..=1, default_missing_value = "true");
    journal: bool = "true", unit = "bool",
        help = "With persistence: make each flush batch durable with one append and one fdatasync of its shard's journal, however many vBuckets it touches (data files are synced at checkpoints). `--journal false` syncs every vBucket data file a batch touches instead, as KV-Engine does (slower; for comparison)",
        clap(num_args = 0..=1, default_missing_value = "true");
    storage: Storage = "auto", unit = "backend",
        help = "With persistence: how each shard stores documents. `log`: the write-once log (each document written once, into the shard's log files, with an in-memory index of every stored key, about 100 bytes each; cleaned oldest file first). `files`: a journal per shard, then per-vBucket data files a background applier writes (each document written twice; the index stays on disk: choose it, with full eviction, when the keys do not fit in memory). `auto`: what the data directory already holds, and the log for a new one. A directory holding one backend's files is refused by the other";
    fd_budget: usize = "0", unit = "count",
        help = "With persistence: most data files each bucket keeps open (least recently used ones are closed beyond it); 0 derives it from the open-file limit minus a reserve for connections";
    writer_threads: usize = "2", unit = "count",
        help = "With persistence: threads of each bucket's Writer group, which runs the shards' flushers and appliers (4 shards per bucket; at most this many flushers sync at once); 1 to 16";
    flush_delay: u64 = "50", unit = "milliseconds",
        help = "With persistence: at most how long a shard's flusher lets writes accumulate after the first one nobody waits on, so that one append and fdatasync carries many (less CPU per persisted item); the shards' flushes come due together on a grid of this period. Writes whose client waits for persistence (durable writes, PersistTo through OBSERVE or OBSERVE_SEQNO) flush at once; 0 flushes as soon as a write comes (KV-Engine's behaviour); 0 to 10000";
    compaction_fragmentation_percent: u8 = "30", unit = "percent",
        help = "With persistence: compact a vBucket's data file (on a background AuxIO task, checked every second, most fragmented first) once this share of it is garbage (overwritten or deleted versions, old index segments); 0 turns fragmentation compaction off (the hourly compaction still runs); 0 to 100";
    compaction_min_file_size: ByteSize = "256KiB", unit = "bytes",
        help = "With persistence: data files smaller than this are never compacted for fragmentation (each compaction has a fixed cost, a new file, an fsync and an unlink, which small files would pay again and again under overwrites; garbage in files below it is bounded by this size times the 1024 vBuckets)";
    compaction_rate: ByteSize = "64MiB", unit = "bytes per second",
        help = "With persistence: most bytes per second compactions write (they sleep between 1 MiB chunks), so that they leave the disk to the flushers and background fetches; while the flushers persist more bytes per second than this, fragmentation compaction may write as many as they do, so that it keeps up with the garbage overwrites leave; 0 is unlimited";
    range_scan_idle_timeout: u64 = "60000", unit = "milliseconds",
        help = "Close a range scan (RANGE_SCAN_CREATE) not continued for this long, releasing its keys; a later continue answers KEY_ENOENT. KV-Engine's watchdog is 60 s; at least 1",
        clap(value_parser = clap::value_parser!(u64).range(1..));
    flush_enabled: bool = "false", unit = "bool",
        help = "Allow FLUSH to remove every document (off by default, as in Couchbase)",
        clap(num_args = 0..=1, default_missing_value = "true");
    shutdown_timeout: u64 = "10", unit = "seconds",
        help = "On SIGINT/SIGTERM, how long to let connections flush their replies before closing them";
    log_level: String = "info", unit = "filter",
        help = "Log filter (error, warn, info, debug, trace, or tracing directives such as epkv_frontend=debug); RUST_LOG overrides the default but not an explicit value";
    log_format: LogFormat = "text", unit = "format",
        help = "Log line format on stderr: text or json";
}

/// The settings the server resolved, with where they came from.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    /// The values.
    pub(crate) settings: Settings,
    /// Names of the settings given explicitly by a flag or the file.
    pub(crate) explicit: BTreeSet<&'static str>,
}

impl Resolved {
    /// Whether a setting was given explicitly.
    #[must_use]
    pub(crate) fn is_explicit(&self, name: &str) -> bool {
        self.explicit.contains(name)
    }
}

/// Resolves the settings from the flags and, if given, the TOML file.
///
/// # Errors
/// An unreadable file, invalid TOML, an unknown key or a bad value.
pub(crate) fn resolve(
    flags: &SettingFlags,
    config_file: Option<&Path>,
) -> Result<Resolved, SettingsError> {
    let file = match config_file {
        None => FileSettings::default(),
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| SettingsError::ReadFile {
                path: path.to_owned(),
                source,
            })?;
            parse_file(&text).map_err(|message| SettingsError::ParseFile {
                path: path.to_owned(),
                message,
            })?
        }
    };
    let (settings, explicit) = Settings::merge(flags, file)?;
    Ok(Resolved { settings, explicit })
}

/// Parses the TOML text of a config file, accepting dashes or underscores in key names.
fn parse_file(text: &str) -> Result<FileSettings, String> {
    let table: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    let mut normalized = toml::Table::new();
    for (key, value) in table {
        let name = key.replace('-', "_");
        if !SETTINGS.iter().any(|s| s.name == name) {
            let known: Vec<_> = SETTINGS.iter().map(|s| s.name.replace('_', "-")).collect();
            return Err(format!(
                "unknown setting {key:?}; known settings: {}",
                known.join(", ")
            ));
        }
        if normalized.insert(name, value).is_some() {
            return Err(format!(
                "setting {key:?} is given twice (with dashes and underscores)"
            ));
        }
    }
    toml::Value::Table(normalized)
        .try_into()
        .map_err(|e: toml::de::Error| e.to_string())
}

/// The settings table as markdown (`epkv-server --print-settings`).
#[must_use]
pub(crate) fn markdown_table() -> String {
    let mut out = String::from("| setting (flag / TOML key) | default | unit | description |\n");
    out.push_str("|---|---|---|---|\n");
    for s in SETTINGS {
        out.push_str(&format!(
            "| `{}` / `{}` | `{}` | {} | {} |\n",
            s.flag(),
            s.name,
            s.default,
            s.unit,
            s.help
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct TestCli {
        #[command(flatten)]
        flags: SettingFlags,
    }

    fn flags(args: &[&str]) -> SettingFlags {
        let mut argv = vec!["epkv-server"];
        argv.extend_from_slice(args);
        TestCli::try_parse_from(argv).unwrap().flags
    }

    #[test]
    fn every_default_parses() {
        let d = Settings::defaults().unwrap();
        assert_eq!(d.port, 11210);
        assert_eq!(d.bind, IpAddr::from([127, 0, 0, 1]));
        assert_eq!(d.buckets, BucketList::default());
        assert!(d.users_file.as_os_str().is_empty());
        assert!(d.admin_user.is_empty() && d.admin_password.expose().is_empty());
        assert_eq!(d.data_dir, PathBuf::from("./epkv-data"));
        assert!(d.persistence, "persistent by default");
        assert_eq!(d.max_packet_size, ByteSize(20 << 20));
        assert!(!d.flush_enabled);
        assert_eq!(d.idle_timeout, 0);
        assert_eq!(
            d.metrics_port,
            OptionalPort(None),
            "metrics are off by default"
        );
        assert_eq!(
            d.mgmt_port,
            OptionalPort(Some(8091)),
            "management on Couchbase's port"
        );
        assert_eq!(
            flags(&["--mgmt-port", "off"]).mgmt_port,
            Some(OptionalPort(None))
        );
    }

    #[test]
    fn metrics_port_comes_from_a_flag_or_the_file() {
        assert_eq!(
            flags(&["--metrics-port", "0"]).metrics_port,
            Some(OptionalPort(Some(0)))
        );
        let (s, _) =
            Settings::merge(&flags(&[]), parse_file("metrics-port = 9091\n").unwrap()).unwrap();
        assert_eq!(s.metrics_port, OptionalPort(Some(9091)));
        let (s, _) =
            Settings::merge(&flags(&[]), parse_file("metrics_port = \"off\"\n").unwrap()).unwrap();
        assert_eq!(s.metrics_port, OptionalPort(None));
        assert!(parse_file("metrics-port = 70000").is_err());
        assert!(parse_file("metrics-port = \"x\"").is_err());
    }

    #[test]
    fn flags_override_file_which_overrides_defaults() {
        let file =
            parse_file("port = 2000\nmax-connections = 7\nmemory_quota = \"256MiB\"\n").unwrap();
        let (s, explicit) = Settings::merge(&flags(&["--port", "3000"]), file).unwrap();
        assert_eq!(s.port, 3000);
        assert_eq!(s.max_connections, 7);
        assert_eq!(s.memory_quota, ByteSize(256 << 20));
        assert_eq!(s.threads, 0);
        assert!(explicit.contains("port") && explicit.contains("max_connections"));
        assert!(!explicit.contains("threads"));
    }

    #[test]
    fn bool_flag_works_with_and_without_a_value() {
        let (s, _) = Settings::merge(
            &flags(&["--flush-enabled", "--port", "0"]),
            FileSettings::default(),
        )
        .unwrap();
        assert!(s.flush_enabled);
        assert_eq!(s.port, 0);
        let (s, _) =
            Settings::merge(&flags(&["--flush-enabled=false"]), FileSettings::default()).unwrap();
        assert!(!s.flush_enabled);
        let (s, _) =
            Settings::merge(&flags(&["--persistence", "false"]), FileSettings::default()).unwrap();
        assert!(!s.persistence, "memory-only with --persistence false");
        let file = parse_file("persistence = false\n").unwrap();
        let (s, _) = Settings::merge(&flags(&[]), file).unwrap();
        assert!(!s.persistence, "memory-only from the file");
    }

    #[test]
    fn file_rejects_unknown_and_duplicate_keys_and_bad_values() {
        assert!(
            parse_file("nope = 1")
                .unwrap_err()
                .contains("unknown setting")
        );
        assert!(
            parse_file("max-connections = 1\nmax_connections = 2")
                .unwrap_err()
                .contains("twice")
        );
        assert!(parse_file("port = \"abc\"").is_err());
        assert!(parse_file("port = 70000").is_err());
        assert!(parse_file("memory-quota = \"5 parsecs\"").is_err());
    }

    #[test]
    fn sizes_accept_numbers_and_suffixes_on_the_command_line() {
        let f = flags(&["--memory-quota", "512MiB", "--max-packet-size", "1048576"]);
        assert_eq!(f.memory_quota, Some(ByteSize(512 << 20)));
        assert_eq!(f.max_packet_size, Some(ByteSize(1 << 20)));
    }

    #[test]
    fn buckets_and_admin_come_from_flags_or_the_file() {
        let file = parse_file(
            "buckets = \"travel,beer=64MiB\"\nadmin-user = \"root\"\nadmin_password = \"pw\"\n",
        )
        .unwrap();
        let (s, _) = Settings::merge(&flags(&[]), file).unwrap();
        assert_eq!(s.buckets.0.len(), 2);
        assert_eq!(s.admin_user, "root");
        assert_eq!(s.admin_password.expose(), "pw");
        assert!(
            !format!("{s:?}").contains("\"pw\""),
            "the password is redacted"
        );
        let f = flags(&["--buckets", "a", "--admin-password", "x"]);
        assert_eq!(f.buckets.unwrap().0[0].name, "a");
        assert!(parse_file("buckets = \"bad/name\"").is_err());
    }

    #[test]
    fn tls_is_off_without_files_and_on_with_both() {
        let tls = |args: &[&str]| {
            let (s, _) = Settings::merge(&flags(args), FileSettings::default()).unwrap();
            tls_config(&s)
        };
        assert_eq!(tls(&[]), Ok(None));
        let on = tls(&["--tls-cert", "c.pem", "--tls-key", "k.pem"])
            .unwrap()
            .unwrap();
        assert_eq!(on.port, 11207);
        assert_eq!(on.cert_path, PathBuf::from("c.pem"));
        assert_eq!(on.client_auth, epkv_frontend::ClientAuth::None);
        assert_eq!(on.ca_path, None);
        assert_eq!(on.handshake_timeout, std::time::Duration::from_secs(10));
        let custom = tls(&[
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--tls-port",
            "0",
            "--tls-client-auth",
            "mandatory",
            "--tls-ca",
            "ca.pem",
            "--tls-handshake-timeout",
            "3",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(custom.port, 0);
        assert_eq!(custom.client_auth, epkv_frontend::ClientAuth::Mandatory);
        assert_eq!(custom.ca_path, Some(PathBuf::from("ca.pem")));
        assert_eq!(custom.handshake_timeout, std::time::Duration::from_secs(3));
    }

    #[test]
    fn tls_refuses_half_configurations() {
        let tls = |args: &[&str]| {
            let (s, _) = Settings::merge(&flags(args), FileSettings::default()).unwrap();
            tls_config(&s)
        };
        assert!(
            tls(&["--tls-cert", "c.pem"])
                .unwrap_err()
                .contains("tls-key")
        );
        assert!(
            tls(&["--tls-key", "k.pem"])
                .unwrap_err()
                .contains("tls-cert")
        );
        assert!(tls(&["--tls-ca", "ca.pem"]).is_err());
        assert!(tls(&["--tls-client-auth", "optional"]).is_err());
        let both = ["--tls-cert", "c.pem", "--tls-key", "k.pem"];
        let mut no_ca = both.to_vec();
        no_ca.extend(["--tls-client-auth", "optional"]);
        assert!(tls(&no_ca).unwrap_err().contains("CA"));
        let mut zero = both.to_vec();
        zero.extend(["--tls-handshake-timeout", "0"]);
        assert!(tls(&zero).is_err());
        let mut bad = vec!["epkv-server"];
        bad.extend(["--tls-client-auth", "sometimes"]);
        assert!(TestCli::try_parse_from(bad).is_err());
    }

    #[test]
    fn tls_settings_come_from_the_file_too() {
        let file = parse_file(
            "tls-cert = \"/etc/epkv/chain.pem\"\ntls_key = \"/etc/epkv/key.pem\"\n\
             tls-port = 11300\ntls-client-auth = \"optional\"\ntls-ca = \"/etc/epkv/ca.pem\"\n",
        )
        .unwrap();
        let (s, _) = Settings::merge(&flags(&[]), file).unwrap();
        let c = tls_config(&s).unwrap().unwrap();
        assert_eq!(c.port, 11300);
        assert_eq!(c.key_path, PathBuf::from("/etc/epkv/key.pem"));
        assert_eq!(c.client_auth, epkv_frontend::ClientAuth::Optional);
        assert!(parse_file("tls-client-auth = \"maybe\"").is_err());
    }

    #[test]
    fn http_limits_default_and_come_from_flags_or_the_file() {
        let d = Settings::defaults().unwrap();
        assert_eq!(
            http_limits(&d).unwrap(),
            crate::http_limits::HttpLimits::default()
        );
        let file =
            parse_file("http-max-connections-per-address = 4\nhttp_idle_timeout = 5\n").unwrap();
        let (s, _) = Settings::merge(
            &flags(&["--http-header-timeout", "1", "--http-max-connections", "10"]),
            file,
        )
        .unwrap();
        let l = http_limits(&s).unwrap();
        assert_eq!(l.max_connections, 10);
        assert_eq!(l.max_per_address, 4);
        assert_eq!(l.header_timeout, std::time::Duration::from_secs(1));
        assert_eq!(l.idle_timeout, std::time::Duration::from_secs(5));
        let (zero, _) = Settings::merge(
            &flags(&["--http-header-timeout", "0"]),
            FileSettings::default(),
        )
        .unwrap();
        assert!(
            http_limits(&zero)
                .unwrap_err()
                .contains("http-header-timeout")
        );
    }

    #[test]
    fn markdown_table_lists_every_setting() {
        let t = markdown_table();
        for s in SETTINGS {
            assert!(t.contains(&s.flag()), "{}", s.name);
        }
        assert_eq!(t.lines().count(), SETTINGS.len() + 2);
    }
}
