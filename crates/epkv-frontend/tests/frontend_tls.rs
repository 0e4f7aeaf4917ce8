//! The TLS listener through the public API: `FrontendConfig::tls`, `Frontend::tls_local_addr`
//! and `Frontend::tls_reloader`, driven by a blocking rustls client with certificates made
//! by rcgen.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a test failure"
)]

mod common;

use common::{FakeEngine, set_req};
use epkv_frontend::{Frontend, FrontendConfig, FrontendError, TlsConfig};
use epkv_protocol::{Limits, Opcode, RequestBuilder, Response, response_frame_len};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "frontend test CA");
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Self { cert, key }
    }

    /// (certificate PEM, key PEM) for 127.0.0.1.
    fn server(&self, cn: &str) -> (String, String) {
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Writes the server's files; returns the TLS settings naming them.
fn write_files(dir: &tempfile::TempDir, (cert, key): &(String, String)) -> TlsConfig {
    let c: PathBuf = dir.path().join("cert.pem");
    let k: PathBuf = dir.path().join("key.pem");
    std::fs::write(&c, cert).unwrap();
    std::fs::write(&k, key).unwrap();
    TlsConfig {
        port: 0,
        ..TlsConfig::new(c, k)
    }
}

/// A running front end with TLS; stopped when dropped.
struct TlsServer {
    addr: SocketAddr,
    tls_addr: SocketAddr,
    reloader: epkv_frontend::TlsReloader,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<epkv_frontend::Result<()>>>,
}

impl TlsServer {
    fn start(tls: TlsConfig) -> Self {
        let config = FrontendConfig {
            tls: Some(tls),
            ..FrontendConfig::default()
        };
        let frontend = Frontend::bind(config, Arc::new(FakeEngine::default())).unwrap();
        let addr = frontend.local_addr();
        let tls_addr = frontend.tls_local_addr().expect("a TLS listener");
        let reloader = frontend.tls_reloader().expect("a reloader");
        let (tx, thread) = common::run_in_background(frontend);
        Self {
            addr,
            tls_addr,
            reloader,
            stop: Some(tx),
            thread: Some(thread),
        }
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

type TlsConn = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

fn connect(addr: SocketAddr, ca: &Ca) -> TlsConn {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.cert.pem().as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let conn =
        rustls::ClientConnection::new(Arc::new(config), ServerName::IpAddress(addr.ip().into()))
            .unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).unwrap();
    }
    s
}

fn presented_cn_is(s: &TlsConn, want: &str) -> bool {
    let der = &s.conn.peer_certificates().unwrap()[0];
    // The CN is in the DER as plain bytes; enough to tell two test certificates apart.
    der.windows(want.len()).any(|w| w == want.as_bytes())
}

/// Reads `count` responses; returns their (opcode, status, value length).
fn recv(s: &mut TlsConn, buf: &mut Vec<u8>, count: usize) -> Vec<(u8, u16, usize)> {
    let limits = Limits {
        max_packet_bytes: u32::MAX,
    };
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        if let Some(n) = response_frame_len(buf, &limits).unwrap() {
            let r = Response::parse(&buf[..n], &limits).unwrap();
            out.push((r.opcode, r.status, r.value.len()));
            buf.drain(..n);
            continue;
        }
        let mut chunk = [0u8; 64 * 1024];
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "closed with {} of {count} responses", out.len());
        buf.extend_from_slice(&chunk[..n]);
    }
    out
}

#[test]
fn the_tls_listener_serves_the_same_protocol_with_pipelines_larger_than_a_record() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let server = TlsServer::start(write_files(&dir, &ca.server("first")));
    assert_eq!(server.tls_addr.ip(), server.addr.ip());
    assert_ne!(server.tls_addr.port(), server.addr.port());

    let mut s = connect(server.tls_addr, &ca);
    assert!(presented_cn_is(&s, "first"));
    // The server's preference wins over rustls' client order (AES-256-GCM first).
    assert_eq!(
        s.conn.negotiated_cipher_suite().unwrap().suite(),
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
    );
    let value = vec![b'x'; 100 * 1024];
    s.write_all(&set_req(b"big", &value, 0)).unwrap();
    let mut buf = Vec::new();
    assert_eq!(recv(&mut s, &mut buf, 1)[0].1, 0);
    // 64 GETs of 100 KiB in one write: 6.4 MiB of replies, many TLS records, more than
    // the output buffer limit and the socket buffers.
    let mut batch = Vec::new();
    for _ in 0..64 {
        batch.extend_from_slice(
            &RequestBuilder::new(Opcode::Get)
                .key(b"big")
                .to_vec()
                .unwrap(),
        );
    }
    s.write_all(&batch).unwrap();
    let replies = recv(&mut s, &mut buf, 64);
    assert!(
        replies
            .iter()
            .all(|&(op, st, len)| op == 0x00 && st == 0 && len == value.len())
    );
    // QUIT: answered, then the server ends the TLS session.
    s.write_all(&RequestBuilder::new(Opcode::Quit).to_vec().unwrap())
        .unwrap();
    assert_eq!(recv(&mut s, &mut buf, 1)[0].0, Opcode::Quit.as_u8());
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty());
}

#[test]
fn the_reloader_swaps_the_certificate_for_new_connections_only() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let tls = write_files(&dir, &ca.server("first"));
    let server = TlsServer::start(tls.clone());
    let mut old = connect(server.tls_addr, &ca);
    assert_eq!(server.reloader.generation(), 1);

    write_files(&dir, &ca.server("second"));
    server.reloader.reload().unwrap();
    assert_eq!(server.reloader.generation(), 2);
    let fresh = connect(server.tls_addr, &ca);
    assert!(presented_cn_is(&fresh, "second"));

    // A key that does not parse: refused, the second certificate stays.
    std::fs::write(&tls.key_path, "garbage").unwrap();
    assert!(matches!(
        server.reloader.reload(),
        Err(FrontendError::Tls(_))
    ));
    assert_eq!(server.reloader.failures(), 1);
    assert!(presented_cn_is(&connect(server.tls_addr, &ca), "second"));

    // The connection made before the reload still works.
    let mut buf = Vec::new();
    old.write_all(&RequestBuilder::new(Opcode::Noop).to_vec().unwrap())
        .unwrap();
    assert_eq!(recv(&mut old, &mut buf, 1)[0].1, 0);
}

#[test]
fn bind_refuses_unusable_tls_files_and_without_tls_there_is_no_listener() {
    let dir = tempfile::tempdir().unwrap();
    let mut tls = write_files(&dir, &Ca::new().server("x"));
    std::fs::write(&tls.cert_path, "no certificate here").unwrap();
    let config = FrontendConfig {
        tls: Some(tls.clone()),
        ..FrontendConfig::default()
    };
    let e = Frontend::bind(config, Arc::new(FakeEngine::default())).unwrap_err();
    assert!(matches!(e, FrontendError::Tls(_)), "{e}");
    tls.cert_path = PathBuf::new();
    let config = FrontendConfig {
        tls: Some(tls),
        ..FrontendConfig::default()
    };
    assert!(matches!(
        Frontend::bind(config, Arc::new(FakeEngine::default())),
        Err(FrontendError::InvalidConfig(_))
    ));
    let plain = Frontend::bind(FrontendConfig::default(), Arc::new(FakeEngine::default())).unwrap();
    assert!(plain.tls_local_addr().is_none() && plain.tls_reloader().is_none());
}
