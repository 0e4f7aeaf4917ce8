//! `epkv-pipeload`: a pipelined GET/SET load over plain TCP or TLS, to compare the two
//! against the same server in the same run (`cargo xtask bench tls`).
//!
//! Each connection is a tokio task that writes a batch of `depth` requests in one write
//! (a `get_fraction` mix of GETs and SETs of `value_bytes` values over `keys` pre-loaded
//! keys), reads the `depth` replies, and repeats until `secs` have passed. The batches are
//! encoded once at start and reused, so the client does the same work per operation in
//! both modes apart from the encryption (and, over TLS, a 64 KiB read buffer under
//! rustls, which reads at most 4 KiB per call, so both modes read a batch of replies in
//! about one system call). Over TLS the client trusts the CA given with
//! `--ca` and checks the server's name (`127.0.0.1`). The last line printed is
//! `pipeload-result: {json}` with the operations, seconds, errors and the mode.
//!
//! `epkv-pipeload certs DIR` writes a CA (`ca.pem`) and a server certificate for
//! 127.0.0.1/localhost (`server.pem`, `server.key`) made with rcgen, for the server.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use clap::{Parser, Subcommand, ValueEnum};
use epkv_executor::{Clock, SystemClock};
use epkv_protocol::{Opcode, RequestBuilder};
use epkv_types::{Vbid, vbucket_for_key};
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Plain text or TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// The KV port in clear text.
    Plain,
    /// The TLS port.
    Tls,
}

impl Mode {
    /// The name used in reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Tls => "tls",
        }
    }
}

/// Command line of `epkv-pipeload`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "epkv-pipeload",
    about = "Pipelined GET/SET load over plain TCP or TLS"
)]
pub struct PipeloadCli {
    /// What to do.
    #[command(subcommand)]
    pub command: PipeloadCommand,
}

/// `run` or `certs`.
#[derive(Debug, Clone, Subcommand)]
pub enum PipeloadCommand {
    /// Drive load at a server.
    Run(PipeloadOptions),
    /// Write ca.pem, server.pem and server.key (for 127.0.0.1/localhost) into DIR.
    Certs {
        /// Directory to write to (created if missing).
        dir: PathBuf,
    },
}

/// Options of `epkv-pipeload run`.
#[derive(Debug, Clone, clap::Args)]
pub struct PipeloadOptions {
    /// Server address (the KV port for plain, the TLS port for tls).
    #[arg(long)]
    pub addr: SocketAddr,
    /// Plain text or TLS.
    #[arg(long, value_enum)]
    pub mode: Mode,
    /// PEM CA certificate the client trusts (tls mode).
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// Concurrent connections.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Requests per batch (pipeline depth).
    #[arg(long, default_value_t = 32)]
    pub depth: usize,
    /// Fraction of GETs (the rest are SETs).
    #[arg(long, default_value_t = 0.9)]
    pub get_fraction: f64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 512)]
    pub value_bytes: usize,
    /// Keys (16 bytes each), SET once before the run.
    #[arg(long, default_value_t = 10_000)]
    pub keys: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 10)]
    pub secs: u64,
    /// Skip loading the keys (they are already there).
    #[arg(long)]
    pub no_populate: bool,
    /// Draw new random keys for every batch instead of reusing 64 batches encoded at
    /// start, so that a long run touches every key (the space benchmark: overwrites
    /// spread over the whole key space). Costs the client an encoding per request.
    #[arg(long)]
    pub fresh_keys: bool,
    /// Authenticate every connection as this user (SASL PLAIN), then select --bucket:
    /// the load then pays the server's per-request privilege check for that user.
    #[arg(long, requires = "password")]
    pub user: Option<String>,
    /// The password of --user.
    #[arg(long)]
    pub password: Option<String>,
    /// The bucket selected after authenticating.
    #[arg(long, default_value = "default")]
    pub bucket: String,
}

/// The outcome of a run.
#[derive(Debug, Clone, Copy)]
pub struct PipeloadResult {
    /// Replies received.
    pub ops: u64,
    /// Seconds measured.
    pub secs: f64,
    /// Replies with a status other than success.
    pub errors: u64,
}

impl PipeloadResult {
    /// The `pipeload-result` JSON.
    #[must_use]
    pub fn to_json(&self, opts: &PipeloadOptions) -> serde_json::Value {
        json!({
            "mode": opts.mode.name(),
            "connections": opts.connections,
            "depth": opts.depth,
            "get_fraction": opts.get_fraction,
            "value_bytes": opts.value_bytes,
            "ops": self.ops,
            "secs": self.secs,
            "ops_per_sec": self.ops as f64 / self.secs,
            "errors": self.errors,
        })
    }
}

/// Writes `ca.pem`, `server.pem` and `server.key` into `dir`.
///
/// # Errors
/// When a certificate cannot be made or a file written.
pub fn write_certs(dir: &Path) -> Result<(), String> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    };
    let e = |e: rcgen::Error| e.to_string();
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(e)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "epkv bench CA");
    let ca_key = KeyPair::generate().map_err(e)?;
    let ca_cert = ca.self_signed(&ca_key).map_err(e)?;
    let mut leaf =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).map_err(e)?;
    leaf.distinguished_name.push(DnType::CommonName, "epkv");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(e)?;
    let cert = leaf.signed_by(&key, &ca_cert, &ca_key).map_err(e)?;
    for (name, text) in [
        ("ca.pem", ca_cert.pem()),
        ("server.pem", cert.pem()),
        ("server.key", key.serialize_pem()),
    ] {
        std::fs::write(dir.join(name), text).map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(())
}

/// A 16-byte key.
fn key_of(i: usize) -> Vec<u8> {
    format!("pipeload-{i:07}").into_bytes()
}

/// Encodes one request into `buf`.
fn encode(buf: &mut BytesMut, get: bool, key: &[u8], value: &[u8]) -> Result<(), String> {
    let vb: Vbid = vbucket_for_key(key, epkv_types::NUM_VBUCKETS);
    let b = if get {
        RequestBuilder::new(Opcode::Get).key(key)
    } else {
        RequestBuilder::new(Opcode::Set)
            .key(key)
            .extras(&[0; 8])
            .value(value)
    };
    b.vbucket(vb).encode(buf).map_err(|e| e.to_string())
}

/// Batches of `depth` requests of the mix, encoded once.
fn batches(opts: &PipeloadOptions, seed: u64) -> Result<Vec<BytesMut>, String> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let value = vec![b'v'; opts.value_bytes];
    (0..64)
        .map(|_| {
            let mut buf = BytesMut::new();
            for _ in 0..opts.depth {
                let key = key_of(rng.gen_range(0..opts.keys.max(1)));
                encode(&mut buf, rng.gen_bool(opts.get_fraction), &key, &value)?;
            }
            Ok(buf)
        })
        .collect()
}

/// Reads replies until `count` have arrived; returns how many were not successes.
async fn read_replies<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut BytesMut,
    mut count: usize,
) -> Result<u64, String> {
    let mut errors = 0;
    while count > 0 {
        while buf.len() >= 24 {
            let body = u32::from_be_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
            if buf.len() < 24 + body {
                break;
            }
            if buf[0] != 0x81 {
                return Err(format!("not a response: magic {:#x}", buf[0]));
            }
            if buf[6] != 0 || buf[7] != 0 {
                errors += 1;
            }
            let _ = buf.split_to(24 + body);
            count -= 1;
            if count == 0 {
                return Ok(errors);
            }
        }
        buf.reserve(64 * 1024);
        if s.read_buf(buf).await.map_err(|e| e.to_string())? == 0 {
            return Err("server closed the connection".into());
        }
    }
    Ok(errors)
}

async fn connect(
    opts: &PipeloadOptions,
    tls: Option<&tokio_rustls::TlsConnector>,
) -> Result<Box<dyn Stream>, String> {
    let tcp = TcpStream::connect(opts.addr)
        .await
        .map_err(|e| format!("connect {}: {e}", opts.addr))?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut s: Box<dyn Stream> = match tls {
        None => Box::new(tcp),
        Some(c) => {
            let name = rustls::pki_types::ServerName::IpAddress(opts.addr.ip().into());
            // rustls reads at most 4 KiB of records per call; a read buffer under it
            // lets one system call fetch a whole batch of replies, as the plain client's
            // 64 KiB reads do.
            let tcp = tokio::io::BufReader::with_capacity(64 * 1024, tcp);
            let s = c
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS handshake: {e}"))?;
            Box::new(s)
        }
    };
    // clap takes --user only with --password.
    if let (Some(user), Some(password)) = (&opts.user, &opts.password) {
        let plain = format!("\0{user}\0{password}");
        let mut buf = BytesMut::new();
        for req in [
            RequestBuilder::new(Opcode::SaslAuth)
                .key(b"PLAIN")
                .value(plain.as_bytes()),
            RequestBuilder::new(Opcode::SelectBucket).key(opts.bucket.as_bytes()),
        ] {
            buf.extend_from_slice(&req.to_vec().map_err(|e| e.to_string())?);
        }
        s.write_all(&buf).await.map_err(|e| e.to_string())?;
        let mut rbuf = BytesMut::new();
        if read_replies(&mut s, &mut rbuf, 2).await? != 0 {
            return Err(format!(
                "cannot authenticate as {user:?} and select bucket {:?}",
                opts.bucket
            ));
        }
    }
    Ok(s)
}

/// A connection's stream, plain or TLS.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

fn tls_connector(ca: &Path) -> Result<tokio_rustls::TlsConnector, String> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let pem = std::fs::read(ca).map_err(|e| format!("{}: {e}", ca.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// Runs the load: populates the keys unless told not to, then drives every connection
/// for `secs`.
///
/// # Errors
/// A connection or handshake that fails, or a reply that is not a response.
pub async fn run(opts: &PipeloadOptions) -> Result<PipeloadResult, String> {
    let tls = match opts.mode {
        Mode::Plain => None,
        Mode::Tls => Some(tls_connector(
            opts.ca.as_deref().ok_or("--ca is needed in tls mode")?,
        )?),
    };
    if !opts.no_populate {
        let mut s = connect(opts, tls.as_ref()).await?;
        let value = vec![b'v'; opts.value_bytes];
        let mut rbuf = BytesMut::new();
        for chunk in (0..opts.keys).collect::<Vec<_>>().chunks(256) {
            let mut buf = BytesMut::new();
            for &i in chunk {
                encode(&mut buf, false, &key_of(i), &value)?;
            }
            s.write_all(&buf).await.map_err(|e| e.to_string())?;
            read_replies(&mut s, &mut rbuf, chunk.len()).await?;
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(opts.connections);
    for c in 0..opts.connections {
        let mut s = connect(opts, tls.as_ref()).await?;
        let batches = batches(opts, c as u64)?;
        let (stop, ops, errors) = (Arc::clone(&stop), Arc::clone(&ops), Arc::clone(&errors));
        let depth = opts.depth;
        let fresh = opts.fresh_keys.then(|| {
            let o = opts.clone();
            let rng = rand::rngs::StdRng::seed_from_u64(1_000 + c as u64);
            (o, rng, BytesMut::new())
        });
        tasks.push(tokio::spawn(async move {
            let mut rbuf = BytesMut::with_capacity(64 * 1024);
            let (mut n, mut bad) = (0u64, 0u64);
            let mut i = 0usize;
            let mut fresh = fresh;
            while !stop.load(Ordering::Relaxed) {
                let batch = match fresh.as_mut() {
                    Some((o, rng, buf)) => {
                        buf.clear();
                        let value = vec![b'v'; o.value_bytes];
                        for _ in 0..depth {
                            let key = key_of(rng.gen_range(0..o.keys.max(1)));
                            encode(buf, rng.gen_bool(o.get_fraction), &key, &value)?;
                        }
                        &buf[..]
                    }
                    None => &batches[i % batches.len()][..],
                };
                s.write_all(batch).await.map_err(|e| e.to_string())?;
                s.flush().await.map_err(|e| e.to_string())?;
                bad += read_replies(&mut s, &mut rbuf, depth).await?;
                n += depth as u64;
                i += 1;
            }
            ops.fetch_add(n, Ordering::Relaxed);
            errors.fetch_add(bad, Ordering::Relaxed);
            Ok::<(), String>(())
        }));
    }
    let clock = SystemClock;
    let t0 = clock.now();
    tokio::time::sleep(Duration::from_secs(opts.secs)).await;
    stop.store(true, Ordering::Relaxed);
    let secs = clock.now().saturating_duration_since(t0).as_secs_f64();
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(PipeloadResult {
        ops: ops.load(Ordering::Relaxed),
        secs,
        errors: errors.load(Ordering::Relaxed),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> PipeloadOptions {
        PipeloadOptions {
            addr: "127.0.0.1:1".parse().unwrap(),
            mode: Mode::Plain,
            ca: None,
            connections: 1,
            depth: 10,
            get_fraction: 0.9,
            value_bytes: 32,
            keys: 100,
            secs: 1,
            no_populate: false,
            fresh_keys: false,
            user: None,
            password: None,
            bucket: "default".into(),
        }
    }

    #[test]
    fn batches_hold_depth_requests_of_the_mix() {
        let o = opts();
        let b = batches(&o, 1).unwrap();
        assert_eq!(b.len(), 64);
        let (mut gets, mut total) = (0, 0);
        for buf in &b {
            let mut at = 0;
            while at < buf.len() {
                let body = u32::from_be_bytes(buf[at + 8..at + 12].try_into().unwrap()) as usize;
                if buf[at + 1] == Opcode::Get.as_u8() {
                    gets += 1;
                }
                total += 1;
                at += 24 + body;
            }
        }
        assert_eq!(total, 64 * o.depth);
        assert!(gets > total / 2 && gets < total, "{gets} of {total}");
    }

    #[tokio::test]
    async fn replies_are_counted_across_reads() {
        let mut reply = vec![0u8; 24];
        reply[0] = 0x81;
        let mut miss = reply.clone();
        miss[7] = 1;
        let mut wire = Vec::new();
        wire.extend_from_slice(&reply);
        wire.extend_from_slice(&miss);
        wire.extend_from_slice(&reply);
        let mut rd = &wire[..];
        let mut buf = BytesMut::new();
        assert_eq!(read_replies(&mut rd, &mut buf, 3).await, Ok(1));
    }

    #[test]
    fn certs_are_written() {
        let dir = tempfile::tempdir().unwrap();
        write_certs(dir.path()).unwrap();
        for f in ["ca.pem", "server.pem", "server.key"] {
            assert!(dir.path().join(f).is_file(), "{f}");
        }
    }
}
