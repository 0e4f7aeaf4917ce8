//! TLS on the KV port (issue 19): a real `epkv-server` with `--tls-cert`/`--tls-key`,
//! driven by a rustls client with certificates this module makes with rcgen (a CA, server
//! certificates for 127.0.0.1/localhost, an expired one, client certificates).
//!
//! Covered: GET/SET over TLS 1.3 and 1.2 and the `kvSSL` port in the cluster map; a client
//! trusting another CA and a client seeing an expired certificate fail the handshake, and
//! the server goes on serving; a memcached packet in clear text on the TLS port, and a
//! client that sends nothing, get their connection closed; SIGHUP swaps the certificate
//! under load without failing a request, and a bad file on reload keeps the old one;
//! client certificates authenticate as the user their CN names.

use crate::harness::{CLIENT_TIMEOUT, Server, TestDir, key, skip_if_external};
use epkv_client::{Client, ClientConfig, StoreOptions};
use epkv_protocol::{RequestBuilder, Status};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    date_time_ymd,
};
use rustls::RootCertStore;
use rustls::pki_types::ServerName;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

const ADMIN: (&str, &str) = ("Administrator", "password");

/// A certificate authority made for one test.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A PEM certificate and its PEM key.
struct Issued {
    cert: String,
    key: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    fn pem(&self) -> String {
        self.cert.pem()
    }

    fn issue(&self, cn: &str, purpose: ExtendedKeyUsagePurpose, expired: bool) -> Issued {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![purpose];
        if expired {
            params.not_before = date_time_ymd(2000, 1, 1);
            params.not_after = date_time_ymd(2001, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        Issued {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    fn server(&self, cn: &str) -> Issued {
        self.issue(cn, ExtendedKeyUsagePurpose::ServerAuth, false)
    }

    fn client(&self, cn: &str) -> Issued {
        self.issue(cn, ExtendedKeyUsagePurpose::ClientAuth, false)
    }
}

/// Certificate files in a directory of the test's own.
struct Files {
    dir: TestDir,
}

impl Files {
    fn new() -> Files {
        let dir = TestDir::new();
        std::fs::create_dir_all(dir.path()).unwrap();
        Files { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `text` to `name` atomically (a temporary file renamed over it), as a
    /// certificate rotation does.
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        let tmp = self.path(&format!("{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path
    }

    fn write_server(&self, issued: &Issued) -> (PathBuf, PathBuf) {
        (
            self.write("server.pem", &issued.cert),
            self.write("server.key", &issued.key),
        )
    }
}

fn arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A server with TLS on a free port, presenting `cert`/`key`, plus `extra` flags.
fn tls_server(cert: &Path, key: &Path, extra: &[&str]) -> Server {
    let mut args = vec![
        "--tls-port",
        "0",
        "--tls-cert",
        arg(cert),
        "--tls-key",
        arg(key),
    ];
    args.extend_from_slice(extra);
    Server::spawn(&args)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls client configuration trusting `ca_pem`, speaking `versions`, presenting
/// `identity` if given.
fn client_config_with(
    ca_pem: &str,
    identity: Option<&Issued>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        Some(id) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(id.cert.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(id.key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

fn client_config(ca_pem: &str, identity: Option<&Issued>) -> Arc<rustls::ClientConfig> {
    client_config_with(ca_pem, identity, rustls::DEFAULT_VERSIONS)
}

/// Connects and completes a TLS handshake with the server named 127.0.0.1.
async fn tls_connect(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::IpAddress(addr.ip().into());
    tokio::time::timeout(
        CLIENT_TIMEOUT,
        TlsConnector::from(Arc::clone(config)).connect(name, tcp),
    )
    .await
    .expect("the handshake finishes or fails in time")
}

fn client_over(stream: TlsStream<TcpStream>) -> Client<TlsStream<TcpStream>> {
    Client::from_stream(
        stream,
        ClientConfig {
            timeout: Some(CLIENT_TIMEOUT),
            ..ClientConfig::default()
        },
    )
}

async fn tls_client(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
) -> Client<TlsStream<TcpStream>> {
    client_over(tls_connect(addr, config).await.expect("TLS handshake"))
}

/// The leaf certificate the server presented.
fn presented(stream: &TlsStream<TcpStream>) -> Vec<u8> {
    stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn der_of(issued: &Issued) -> Vec<u8> {
    CertificateDer::from_pem_slice(issued.cert.as_bytes())
        .unwrap()
        .to_vec()
}

/// The rustls error behind a failed handshake, as text.
fn handshake_error(e: &std::io::Error) -> String {
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(r) => format!("{r:?}"),
        None => format!("{e:?}"),
    }
}

async fn stats(c: &mut Client) -> HashMap<String, String> {
    c.stat("").await.unwrap().into_iter().collect()
}

/// Polls the default STAT group until `name` reaches at least `want` (bounded).
async fn wait_stat_at_least(server: &Server, name: &str, want: u64) {
    let mut c = server.client().await;
    for _ in 0..3000 {
        let v: u64 = stats(&mut c).await[name].parse().unwrap();
        if v >= want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("STAT {name} did not reach {want}");
}

async fn assert_get_set<S>(c: &mut Client<S>, name: &str)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let k = key(name);
    c.set(&k, b"over tls", StoreOptions::new())
        .await
        .unwrap()
        .into_result()
        .unwrap();
    let got = c.get(&k).await.unwrap().into_result().unwrap();
    assert_eq!(&got.value[..], b"over tls");
}

#[tokio::test]
async fn get_and_set_over_tls_13_and_12_and_the_map_advertises_kv_ssl() {
    if skip_if_external("get_and_set_over_tls_13_and_12_and_the_map_advertises_kv_ssl") {
        return;
    }
    let files = Files::new();
    let ca = Ca::new("epkv test CA");
    let (cert, key_path) = files.write_server(&ca.server("epkv"));
    let server = tls_server(&cert, &key_path, &[]);
    let tls_addr = server.tls_addr();
    assert_eq!(
        tls_addr.ip(),
        server.addr.ip(),
        "same address as the KV port"
    );
    assert_ne!(tls_addr.port(), server.addr.port());

    for (versions, want) in [
        (
            &[&rustls::version::TLS13][..],
            rustls::ProtocolVersion::TLSv1_3,
        ),
        (
            &[&rustls::version::TLS12][..],
            rustls::ProtocolVersion::TLSv1_2,
        ),
    ] {
        let config = client_config_with(&ca.pem(), None, versions);
        let stream = tls_connect(tls_addr, &config).await.unwrap();
        assert_eq!(stream.get_ref().1.protocol_version(), Some(want));
        let mut c = client_over(stream);
        assert_get_set(&mut c, &format!("tls-{want:?}")).await;
        // A pipeline larger than one TLS record each way.
        for i in 0..200u32 {
            c.queue(RequestBuilder::new(epkv_protocol::Opcode::Noop).opaque(i))
                .unwrap();
        }
        let replies = c.flush_and_recv(200).await.unwrap();
        assert!(replies.iter().all(|r| r.status() == Some(Status::Success)));
    }

    // The cluster map names both ports (and the management port), on either listener.
    let want = format!(
        "\"services\":{{\"kv\":{},\"kvSSL\":{},\"mgmt\":{}}}",
        server.addr.port(),
        tls_addr.port(),
        server.mgmt_addr().port()
    );
    let mut plain = server.client().await;
    let map = plain.get_cluster_config(None).await.unwrap();
    let map = String::from_utf8(map.value.to_vec()).unwrap();
    assert!(map.contains(&want), "{map}");
    let mut secure = tls_client(tls_addr, &client_config(&ca.pem(), None)).await;
    let map = secure.get_cluster_config(None).await.unwrap();
    let map = String::from_utf8(map.value.to_vec()).unwrap();
    assert!(map.contains(&want), "{map}");
    // A document written over TLS is the same document in clear text.
    assert_eq!(
        &plain
            .get(&key("tls-TLSv1_3"))
            .await
            .unwrap()
            .into_result()
            .unwrap()
            .value[..],
        b"over tls"
    );
    let s = stats(&mut plain).await;
    assert!(s["total_tls_connections"].parse::<u64>().unwrap() >= 3);
    assert_eq!(s["tls_cert_loads"], "1");
}

#[tokio::test]
async fn without_tls_the_map_has_no_kv_ssl_and_the_line_no_tls_address() {
    if skip_if_external("without_tls_the_map_has_no_kv_ssl_and_the_line_no_tls_address") {
        return;
    }
    let server = Server::spawn(&[]);
    assert_eq!(crate::harness::parse_tls_addr(&server.listening_line), None);
    let mut c = server.client().await;
    let map = c.get_cluster_config(None).await.unwrap();
    assert!(!String::from_utf8_lossy(&map.value).contains("kvSSL"));
}

#[tokio::test]
async fn a_client_trusting_another_ca_fails_the_handshake_and_the_server_goes_on() {
    if skip_if_external("a_client_trusting_another_ca_fails_the_handshake_and_the_server_goes_on") {
        return;
    }
    let files = Files::new();
    let ca = Ca::new("epkv test CA");
    let other = Ca::new("some other CA");
    let (cert, key_path) = files.write_server(&ca.server("epkv"));
    let server = tls_server(&cert, &key_path, &[]);

    let e = tls_connect(server.tls_addr(), &client_config(&other.pem(), None))
        .await
        .expect_err("an unknown issuer is refused");
    let why = handshake_error(&e);
    assert!(why.contains("UnknownIssuer"), "{why}");
    wait_stat_at_least(&server, "tls_handshake_failures", 1).await;

    let mut c = tls_client(server.tls_addr(), &client_config(&ca.pem(), None)).await;
    assert_get_set(&mut c, "after-wrong-ca").await;
}

#[tokio::test]
async fn an_expired_certificate_is_refused_by_the_client() {
    if skip_if_external("an_expired_certificate_is_refused_by_the_client") {
        return;
    }
    let files = Files::new();
    let ca = Ca::new("epkv test CA");
    let expired = ca.issue("epkv", ExtendedKeyUsagePurpose::ServerAuth, true);
    let (cert, key_path) = files.write_server(&expired);
    let server = tls_server(&cert, &key_path, &[]);

    let e = tls_connect(server.tls_addr(), &client_config(&ca.pem(), None))
        .await
        .expect_err("an expired certificate is refused");
    let why = handshake_error(&e);
    assert!(why.contains("Expired"), "{why}");
    // The plain port is unaffected.
    let mut c = server.client().await;
    assert_get_set(&mut c, "expired-plain").await;
}

/// Reads until the server closes the connection (bounded); returns what it sent.
async fn read_until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(CLIENT_TIMEOUT, s.read(&mut buf))
            .await
            .expect("the server closes the connection")
        {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("read: {e}"),
        }
    }
}

#[tokio::test]
async fn clear_text_on_the_tls_port_and_silent_clients_are_closed() {
    if skip_if_external("clear_text_on_the_tls_port_and_silent_clients_are_closed") {
        return;
    }
    let files = Files::new();
    let ca = Ca::new("epkv test CA");
    let (cert, key_path) = files.write_server(&ca.server("epkv"));
    let server = tls_server(&cert, &key_path, &["--tls-handshake-timeout", "1"]);

    // A memcached GET in clear text: never answered as one, and closed.
    let mut raw = TcpStream::connect(server.tls_addr()).await.unwrap();
    let mut packet = bytes::BytesMut::new();
    RequestBuilder::new(epkv_protocol::Opcode::Get)
        .key(b"k")
        .encode(&mut packet)
        .unwrap();
    raw.write_all(&packet).await.unwrap();
    let got = read_until_closed(&mut raw).await;
    assert_ne!(got.first(), Some(&0x81), "no memcached reply: {got:?}");

    // A client that connects and sends nothing is closed after the handshake timeout.
    let mut silent = TcpStream::connect(server.tls_addr()).await.unwrap();
    let got = read_until_closed(&mut silent).await;
    assert!(got.is_empty(), "{got:?}");
    wait_stat_at_least(&server, "tls_handshake_failures", 2).await;

    // Both ports still serve.
    let mut c = tls_client(server.tls_addr(), &client_config(&ca.pem(), None)).await;
    assert_get_set(&mut c, "after-clear-text").await;
    let mut p = server.client().await;
    assert_get_set(&mut p, "after-clear-text-plain").await;
    let s = stats(&mut p).await;
    assert_eq!(s["curr_connections"], "2", "{s:?}");
}

/// Counters of the load that runs while the certificate is replaced.
#[derive(Default)]
struct Load {
    stop: AtomicBool,
    requests: AtomicU64,
    handshakes: AtomicU64,
    failures: AtomicU64,
}

/// One connection doing SET+GET round trips, and fresh connections each doing a
/// handshake and a GET, until told to stop. Every failure is counted.
async fn run_load(addr: SocketAddr, config: Arc<rustls::ClientConfig>, load: Arc<Load>) {
    let mut long = tls_client(addr, &config).await;
    let k = key("reload-load");
    let mut i = 0u64;
    while !load.stop.load(Ordering::Relaxed) {
        i += 1;
        let ok = long
            .set(&k, &i.to_be_bytes(), StoreOptions::new())
            .await
            .is_ok_and(|r| r.is_success())
            && long
                .get(&k)
                .await
                .is_ok_and(|r| r.is_success() && r.value[..] == i.to_be_bytes());
        if ok {
            load.requests.fetch_add(2, Ordering::Relaxed);
        } else {
            load.failures.fetch_add(1, Ordering::Relaxed);
        }
        if i.is_multiple_of(8) {
            let fresh = async {
                let mut c = client_over(tls_connect(addr, &config).await.ok()?);
                c.get(&k).await.ok().filter(|r| r.is_success())
            };
            match fresh.await {
                Some(_) => load.handshakes.fetch_add(1, Ordering::Relaxed),
                None => load.failures.fetch_add(1, Ordering::Relaxed),
            };
        }
    }
}

/// Handshakes until the server presents `want` (bounded).
async fn wait_presented(addr: SocketAddr, config: &Arc<rustls::ClientConfig>, want: &[u8]) {
    for _ in 0..3000 {
        let s = tls_connect(addr, config).await.unwrap();
        if presented(&s) == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the server never presented the new certificate");
}

#[tokio::test]
async fn sighup_reloads_the_certificate_under_load_without_failing_a_request() {
    if skip_if_external("sighup_reloads_the_certificate_under_load_without_failing_a_request") {
        return;
    }
    let files = Files::new();
    let ca = Ca::new("epkv test CA");
    let first = ca.server("epkv-first");
    let second = ca.server("epkv-second");
    let (cert, key_path) = files.write_server(&first);
    let server = tls_server(&cert, &key_path, &[]);
    let addr = server.tls_addr();
    let config = client_config(&ca.pem(), None);

    let kept = tls_connect(addr, &config).await.unwrap();
    assert_eq!(presented(&kept), der_of(&first));
    let mut kept = client_over(kept);

    let load = Arc::new(Load::default());
    let loader = tokio::spawn(run_load(addr, Arc::clone(&config), Arc::clone(&load)));
    while load.handshakes.load(Ordering::Relaxed) < 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Rotate: new files at the same paths, then SIGHUP.
    files.write_server(&second);
    server.signal("HUP");
    wait_presented(addr, &config, &der_of(&second)).await;
    let seen = load.handshakes.load(Ordering::Relaxed);
    while load.handshakes.load(Ordering::Relaxed) < seen + 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // A bad key on the next reload: refused, and the second certificate stays.
    files.write("server.key", "-----BEGIN PRIVATE KEY-----\nbroken\n");
    server.signal("HUP");
    wait_stat_at_least(&server, "tls_cert_load_failures", 1).await;
    let s = tls_connect(addr, &config).await.unwrap();
    assert_eq!(presented(&s), der_of(&second));

    load.stop.store(true, Ordering::Relaxed);
    loader.await.unwrap();
    assert_eq!(
        load.failures.load(Ordering::Relaxed),
        0,
        "no request failed"
    );
    assert!(load.requests.load(Ordering::Relaxed) > 0);

    // The connection opened before the reloads still works, on its first certificate.
    assert_get_set(&mut kept, "reload-kept").await;
    let mut plain = server.client().await;
    let s = stats(&mut plain).await;
    assert_eq!(s["tls_cert_loads"], "2", "{s:?}");
    assert_eq!(s["tls_cert_load_failures"], "1", "{s:?}");
}

#[tokio::test]
async fn a_client_certificate_authenticates_as_the_user_its_cn_names() {
    if skip_if_external("a_client_certificate_authenticates_as_the_user_its_cn_names") {
        return;
    }
    let files = Files::new();
    let ca = Ca::new("epkv test CA");
    let clients_ca = Ca::new("epkv clients CA");
    let (cert, key_path) = files.write_server(&ca.server("epkv"));
    let ca_path = files.write("clients-ca.pem", &clients_ca.pem());
    let server = tls_server(
        &cert,
        &key_path,
        &[
            "--admin-user",
            ADMIN.0,
            "--admin-password",
            ADMIN.1,
            "--tls-client-auth",
            "optional",
            "--tls-ca",
            arg(&ca_path),
        ],
    );
    let addr = server.tls_addr();

    // CN=Administrator: authenticated without SASL.
    let admin = clients_ca.client(ADMIN.0);
    let mut c = tls_client(addr, &client_config(&ca.pem(), Some(&admin))).await;
    c.select_bucket("default")
        .await
        .unwrap()
        .into_result()
        .unwrap();
    assert_get_set(&mut c, "client-cert").await;

    // No certificate (optional mode): SASL as usual.
    let mut c = tls_client(addr, &client_config(&ca.pem(), None)).await;
    assert_ne!(
        c.select_bucket("default").await.unwrap().status(),
        Some(Status::Success)
    );
    c.auth_plain(ADMIN.0, ADMIN.1).await.unwrap();
    c.select_bucket("default")
        .await
        .unwrap()
        .into_result()
        .unwrap();

    // A CN that names no user: the connection is closed.
    let nobody = clients_ca.client("nobody");
    let mut c = tls_client(addr, &client_config(&ca.pem(), Some(&nobody))).await;
    assert!(c.select_bucket("default").await.is_err(), "closed");

    // A certificate from another CA fails the handshake (seen by the client at its
    // first read under TLS 1.3).
    let stranger = ca.client(ADMIN.0);
    let refused = match tls_connect(addr, &client_config(&ca.pem(), Some(&stranger))).await {
        Err(_) => true,
        Ok(s) => client_over(s).select_bucket("default").await.is_err(),
    };
    assert!(refused);
}

#[tokio::test]
async fn mandatory_client_certificates_refuse_clients_without_one() {
    if skip_if_external("mandatory_client_certificates_refuse_clients_without_one") {
        return;
    }
    let files = Files::new();
    let ca = Ca::new("epkv test CA");
    let (cert, key_path) = files.write_server(&ca.server("epkv"));
    let ca_path = files.write("ca.pem", &ca.pem());
    let server = tls_server(
        &cert,
        &key_path,
        &[
            "--admin-user",
            ADMIN.0,
            "--admin-password",
            ADMIN.1,
            "--tls-client-auth",
            "mandatory",
            "--tls-ca",
            arg(&ca_path),
        ],
    );
    let addr = server.tls_addr();
    let refused = match tls_connect(addr, &client_config(&ca.pem(), None)).await {
        Err(_) => true,
        Ok(s) => client_over(s).select_bucket("default").await.is_err(),
    };
    assert!(refused, "no certificate, no connection");
    let admin = ca.client(ADMIN.0);
    let mut c = tls_client(addr, &client_config(&ca.pem(), Some(&admin))).await;
    c.select_bucket("default")
        .await
        .unwrap()
        .into_result()
        .unwrap();
    assert_get_set(&mut c, "mandatory").await;
}

#[tokio::test]
async fn half_a_tls_configuration_is_refused_at_start() {
    if skip_if_external("half_a_tls_configuration_is_refused_at_start") {
        return;
    }
    let files = Files::new();
    let ca = Ca::new("epkv test CA");
    let (cert, _) = files.write_server(&ca.server("epkv"));
    let (status, stderr) = Server::spawn_exact_expecting_failure(&[
        "--port",
        "0",
        "--tls-port",
        "0",
        "--tls-cert",
        arg(&cert),
    ]);
    assert!(!status.success());
    assert!(stderr.contains("tls-key"), "{stderr}");
    let garbage = files.write("garbage.pem", "not a key");
    let (status, stderr) = Server::spawn_exact_expecting_failure(&[
        "--port",
        "0",
        "--tls-port",
        "0",
        "--tls-cert",
        arg(&cert),
        "--tls-key",
        arg(&garbage),
    ]);
    assert!(!status.success());
    assert!(stderr.contains("garbage.pem"), "{stderr}");
}
