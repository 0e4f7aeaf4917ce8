//! TLS on the KV port: [`TlsConfig`] (where the certificate, key and client CA are),
//! loading them into a rustls server configuration, [`TlsReloader`] (SIGHUP swaps in a
//! freshly loaded certificate; a bad file keeps the old one), and mapping a verified
//! client certificate to a user by its Subject CN.
//!
//! Protocols: TLS 1.3 and TLS 1.2 only (rustls never speaks older versions), with the
//! `ring` crypto provider. The configuration a connection uses is the one current when it
//! was accepted: a reload affects only connections accepted after it.
//!
//! The handshake itself runs on the worker that serves the connection, as an ordinary
//! task bounded by [`TlsConfig::handshake_timeout`], so a client that connects and sends
//! nothing holds its connection slot for at most that long and never blocks a thread.

use crate::error::{FrontendError, Result};
use epkv_auth::UserStore;
use parking_lot::RwLock;
use rustls::RootCertStore;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The TLS port Couchbase Server uses for the data service (`kvSSL`).
pub const DEFAULT_TLS_PORT: u16 = 11207;

/// Whether clients must, may or must not present a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientAuth {
    /// No client certificates are asked for (the default); clients use SASL.
    #[default]
    None,
    /// A client may present a certificate signed by the CA; one that does is
    /// authenticated as the user its Subject CN names. Others use SASL.
    Optional,
    /// Every client must present a certificate signed by the CA that names a user.
    Mandatory,
}

impl ClientAuth {
    /// The setting's spelling: `none`, `optional` or `mandatory`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            ClientAuth::None => "none",
            ClientAuth::Optional => "optional",
            ClientAuth::Mandatory => "mandatory",
        }
    }
}

impl FromStr for ClientAuth {
    type Err = String;

    /// Parses `none`, `optional` (also Couchbase's `enable`) or `mandatory`.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "none" | "disable" | "disabled" => Ok(ClientAuth::None),
            "optional" | "enable" | "enabled" => Ok(ClientAuth::Optional),
            "mandatory" => Ok(ClientAuth::Mandatory),
            other => Err(format!(
                "unknown client certificate mode {other:?}: use none, optional or mandatory"
            )),
        }
    }
}

impl fmt::Display for ClientAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the TLS listener is and what it presents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// Port of the TLS listener, on the same address as the plain KV port; 0 picks a free
    /// port (see [`crate::Frontend::tls_local_addr`]). Default 11207.
    pub port: u16,
    /// PEM file with the server's certificate chain, leaf first.
    pub cert_path: PathBuf,
    /// PEM file with the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key_path: PathBuf,
    /// Client certificates: none (default), optional or mandatory.
    pub client_auth: ClientAuth,
    /// PEM file with the CA certificate(s) that sign client certificates; required when
    /// `client_auth` is not [`ClientAuth::None`].
    pub ca_path: Option<PathBuf>,
    /// How long a new connection may take to complete its handshake before it is closed.
    pub handshake_timeout: Duration,
}

impl TlsConfig {
    /// A configuration presenting `cert_path` / `key_path` on port 11207, without client
    /// certificates, with a 10 s handshake timeout.
    #[must_use]
    pub fn new(cert_path: impl Into<PathBuf>, key_path: impl Into<PathBuf>) -> Self {
        Self {
            port: DEFAULT_TLS_PORT,
            cert_path: cert_path.into(),
            key_path: key_path.into(),
            client_auth: ClientAuth::None,
            ca_path: None,
            handshake_timeout: Duration::from_secs(10),
        }
    }

    /// Checks the settings without reading the files.
    ///
    /// # Errors
    /// [`FrontendError::InvalidConfig`] when a path is empty, client certificates are
    /// asked for without a CA, or the handshake timeout is zero.
    pub fn validate(&self) -> Result<()> {
        if self.cert_path.as_os_str().is_empty() || self.key_path.as_os_str().is_empty() {
            return Err(FrontendError::InvalidConfig(
                "TLS needs both a certificate chain and a private key".into(),
            ));
        }
        let has_ca = self
            .ca_path
            .as_ref()
            .is_some_and(|p| !p.as_os_str().is_empty());
        if self.client_auth != ClientAuth::None && !has_ca {
            return Err(FrontendError::InvalidConfig(format!(
                "client certificates ({}) need a CA file to verify them",
                self.client_auth
            )));
        }
        if self.handshake_timeout.is_zero() {
            return Err(FrontendError::InvalidConfig(
                "the TLS handshake timeout must be positive".into(),
            ));
        }
        Ok(())
    }

    /// Reads the files and builds the rustls server configuration.
    ///
    /// # Errors
    /// [`FrontendError::Tls`] when a file cannot be read, holds no certificate or key, the
    /// key does not match the certificate, or the CA file holds no usable certificate.
    pub(crate) fn load(&self) -> Result<Arc<ServerConfig>> {
        self.validate()?;
        let chain = read_certs(&self.cert_path)?;
        let key_pem = read_file(&self.key_path)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| tls_error(&self.key_path, format!("no private key: {e}")))?;
        let provider = Arc::new(crypto_provider());
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| FrontendError::Tls(format!("TLS protocol versions: {e}")))?;
        let builder = match (self.client_auth, &self.ca_path) {
            (ClientAuth::None, _) | (_, None) => builder.with_no_client_auth(),
            (mode, Some(ca_path)) => {
                let mut roots = RootCertStore::empty();
                for cert in read_certs(ca_path)? {
                    roots
                        .add(cert)
                        .map_err(|e| tls_error(ca_path, format!("unusable CA certificate: {e}")))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                let verifier = if mode == ClientAuth::Optional {
                    verifier.allow_unauthenticated()
                } else {
                    verifier
                };
                let verifier = verifier
                    .build()
                    .map_err(|e| tls_error(ca_path, format!("client verifier: {e}")))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder.with_single_cert(chain, key).map_err(|e| {
            FrontendError::Tls(format!(
                "certificate {} with key {}: {e}",
                self.cert_path.display(),
                self.key_path.display()
            ))
        })?;
        let mut config = config;
        // The server picks from the client's offer in its own order (AES-128-GCM first).
        config.ignore_client_order = true;
        Ok(Arc::new(config))
    }
}

/// rustls' `ring` provider with the cipher suites in the server's order of preference:
/// AES-128-GCM, then AES-256-GCM, then ChaCha20-Poly1305, TLS 1.3 suites before TLS 1.2
/// ones. rustls' default order puts AES-256-GCM first; AES-128-GCM is as safe for this
/// use and cheaper per byte (fewer AES rounds), which is what a server encrypting every
/// reply spends its TLS time on. Couchbase SDKs (BoringSSL) offer it first themselves.
fn crypto_provider() -> rustls::crypto::CryptoProvider {
    use rustls::crypto::ring::cipher_suite as cs;
    rustls::crypto::CryptoProvider {
        cipher_suites: vec![
            cs::TLS13_AES_128_GCM_SHA256,
            cs::TLS13_AES_256_GCM_SHA384,
            cs::TLS13_CHACHA20_POLY1305_SHA256,
            cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        ],
        ..rustls::crypto::ring::default_provider()
    }
}

fn tls_error(path: &Path, message: String) -> FrontendError {
    FrontendError::Tls(format!("{}: {message}", path.display()))
}

fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| tls_error(path, format!("cannot read: {e}")))
}

/// Every certificate in a PEM file; at least one.
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = read_file(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| tls_error(path, format!("bad PEM: {e}")))?;
    if certs.is_empty() {
        return Err(tls_error(path, "no certificate in the file".into()));
    }
    Ok(certs)
}

/// The TLS configuration new connections get, and how to reload it.
///
/// Cheap to clone; every clone reloads the same listener's configuration. The server
/// calls [`TlsReloader::reload`] on SIGHUP.
#[derive(Clone)]
pub struct TlsReloader {
    inner: Arc<TlsState>,
}

struct TlsState {
    config: TlsConfig,
    current: RwLock<Arc<ServerConfig>>,
    /// Successful loads, the first included.
    generation: AtomicU64,
    /// Failed reloads.
    failures: AtomicU64,
}

impl fmt::Debug for TlsReloader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsReloader")
            .field("config", &self.inner.config)
            .field("generation", &self.generation())
            .field("failures", &self.failures())
            .finish_non_exhaustive()
    }
}

impl TlsReloader {
    /// Loads the files named by `config`.
    ///
    /// # Errors
    /// As [`TlsConfig::validate`], and [`FrontendError::Tls`] for a file that cannot be
    /// used.
    pub fn new(config: TlsConfig) -> Result<Self> {
        let current = config.load()?;
        Ok(Self {
            inner: Arc::new(TlsState {
                config,
                current: RwLock::new(current),
                generation: AtomicU64::new(1),
                failures: AtomicU64::new(0),
            }),
        })
    }

    /// Reads the certificate, key and CA files again from the same paths. On success new
    /// connections get them (connections already open keep theirs); on failure nothing
    /// changes and the error says which file is wrong.
    ///
    /// Reads files: call it off the front end's threads (the server uses a blocking task).
    ///
    /// # Errors
    /// [`FrontendError::Tls`] when a file cannot be used; the previous configuration stays.
    pub fn reload(&self) -> Result<()> {
        let fresh = match self.inner.config.load() {
            Ok(fresh) => fresh,
            Err(e) => {
                self.inner.failures.fetch_add(1, Ordering::AcqRel);
                return Err(e);
            }
        };
        *self.inner.current.write() = fresh;
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// How many times a configuration was loaded successfully (1 after start).
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// How many reloads failed (each left the configuration as it was).
    #[must_use]
    pub fn failures(&self) -> u64 {
        self.inner.failures.load(Ordering::Acquire)
    }

    /// The settings this reloader reads.
    #[must_use]
    pub fn config(&self) -> &TlsConfig {
        &self.inner.config
    }

    /// The configuration for a connection accepted now.
    pub(crate) fn current(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.inner.current.read())
    }
}

/// Why a verified client certificate does not authenticate anyone.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CertUserError {
    /// The certificate does not parse or has no Subject CN.
    NoCommonName(String),
    /// The CN names no configured user.
    UnknownUser(String),
}

impl fmt::Display for CertUserError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CertUserError::NoCommonName(why) => write!(f, "no usable subject CN ({why})"),
            CertUserError::UnknownUser(cn) => write!(f, "subject CN {cn:?} is not a user"),
        }
    }
}

/// The user a verified client certificate (DER) authenticates, by its Subject CN as
/// Couchbase's `subject.cn` path: the CN must be the name of a user in `users`.
pub(crate) fn user_for_certificate(
    der: &[u8],
    users: &UserStore,
) -> std::result::Result<String, CertUserError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| CertUserError::NoCommonName(e.to_string()))?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .ok_or_else(|| CertUserError::NoCommonName("no CN attribute".into()))?
        .as_str()
        .map_err(|e| CertUserError::NoCommonName(e.to_string()))?;
    if users.contains(cn) {
        Ok(cn.to_owned())
    } else {
        Err(CertUserError::UnknownUser(cn.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

    struct Files {
        dir: tempfile::TempDir,
    }

    impl Files {
        fn new() -> Self {
            Self {
                dir: tempfile::tempdir().unwrap(),
            }
        }

        fn write(&self, name: &str, text: &str) -> PathBuf {
            let p = self.dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        }
    }

    /// A CA, and a function making leaf certificates it signs.
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
                .push(DnType::CommonName, "epkv test CA");
            let key = KeyPair::generate().unwrap();
            let cert = params.self_signed(&key).unwrap();
            Self { cert, key }
        }

        fn leaf(&self, cn: &str) -> (String, String) {
            let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
            params.distinguished_name.push(DnType::CommonName, cn);
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
            (cert.pem(), key.serialize_pem())
        }
    }

    fn config(files: &Files, cert: &str, key: &str) -> TlsConfig {
        TlsConfig::new(files.write("cert.pem", cert), files.write("key.pem", key))
    }

    #[test]
    fn client_auth_parses_its_three_modes_and_couchbase_spellings() {
        assert_eq!("none".parse(), Ok(ClientAuth::None));
        assert_eq!("Optional".parse(), Ok(ClientAuth::Optional));
        assert_eq!("enable".parse(), Ok(ClientAuth::Optional));
        assert_eq!("mandatory".parse(), Ok(ClientAuth::Mandatory));
        assert!("sometimes".parse::<ClientAuth>().is_err());
        for m in [
            ClientAuth::None,
            ClientAuth::Optional,
            ClientAuth::Mandatory,
        ] {
            assert_eq!(m.to_string().parse(), Ok(m));
        }
    }

    #[test]
    fn validate_wants_both_files_a_ca_for_client_certs_and_a_timeout() {
        let ok = TlsConfig::new("c.pem", "k.pem");
        ok.validate().unwrap();
        assert_eq!(ok.port, DEFAULT_TLS_PORT);
        assert!(TlsConfig::new("", "k.pem").validate().is_err());
        assert!(TlsConfig::new("c.pem", "").validate().is_err());
        let no_ca = TlsConfig {
            client_auth: ClientAuth::Mandatory,
            ..ok.clone()
        };
        assert!(no_ca.validate().is_err());
        let with_ca = TlsConfig {
            ca_path: Some("ca.pem".into()),
            ..no_ca
        };
        with_ca.validate().unwrap();
        let zero = TlsConfig {
            handshake_timeout: Duration::ZERO,
            ..ok
        };
        assert!(zero.validate().is_err());
    }

    #[test]
    fn the_server_prefers_aes_128_gcm_and_offers_every_default_suite() {
        let ours = crypto_provider();
        let default = rustls::crypto::ring::default_provider();
        assert_eq!(
            ours.cipher_suites[0].suite(),
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
        );
        let mut a: Vec<_> = ours.cipher_suites.iter().map(|s| s.suite()).collect();
        let mut b: Vec<_> = default.cipher_suites.iter().map(|s| s.suite()).collect();
        a.sort_by_key(|s| u16::from(*s));
        b.sort_by_key(|s| u16::from(*s));
        assert_eq!(a, b, "the same suites, in another order");
    }

    #[test]
    fn loads_a_matching_certificate_and_key() {
        let files = Files::new();
        let (cert, key) = Ca::new().leaf("server");
        config(&files, &cert, &key).load().unwrap();
    }

    #[test]
    fn refuses_missing_empty_mismatched_and_garbage_files() {
        let files = Files::new();
        let ca = Ca::new();
        let (cert, key) = ca.leaf("server");
        let (_, other_key) = ca.leaf("other");
        let missing = TlsConfig::new(files.dir.path().join("nope.pem"), "k.pem");
        let e = missing.load().unwrap_err().to_string();
        assert!(e.contains("nope.pem") && e.contains("cannot read"), "{e}");
        let e = config(&files, "", &key).load().unwrap_err().to_string();
        assert!(e.contains("no certificate"), "{e}");
        let e = config(&files, &cert, "garbage")
            .load()
            .unwrap_err()
            .to_string();
        assert!(e.contains("no private key"), "{e}");
        let e = config(&files, &cert, &other_key)
            .load()
            .unwrap_err()
            .to_string();
        assert!(e.contains("with key"), "a key of another certificate: {e}");
    }

    #[test]
    fn reload_swaps_in_new_files_and_keeps_the_old_config_on_a_bad_one() {
        let files = Files::new();
        let ca = Ca::new();
        let (cert1, key1) = ca.leaf("one");
        let reloader = TlsReloader::new(config(&files, &cert1, &key1)).unwrap();
        assert_eq!(reloader.generation(), 1);
        let first = reloader.current();

        // A broken key: the reload fails and the first configuration stays in use.
        files.write("key.pem", "not a key");
        assert!(reloader.reload().is_err());
        assert_eq!((reloader.generation(), reloader.failures()), (1, 1));
        assert!(Arc::ptr_eq(&first, &reloader.current()));

        // New, matching files: the next connections get them.
        let (cert2, key2) = ca.leaf("two");
        files.write("cert.pem", &cert2);
        files.write("key.pem", &key2);
        reloader.reload().unwrap();
        assert_eq!(reloader.generation(), 2);
        assert!(!Arc::ptr_eq(&first, &reloader.current()));
        // A clone reloads the same state.
        let clone = reloader.clone();
        clone.reload().unwrap();
        assert_eq!(reloader.generation(), 3);
    }

    #[test]
    fn client_cert_modes_need_a_usable_ca() {
        let files = Files::new();
        let ca = Ca::new();
        let (cert, key) = ca.leaf("server");
        let ca_path = files.write("ca.pem", &ca.cert.pem());
        for mode in [ClientAuth::Optional, ClientAuth::Mandatory] {
            let c = TlsConfig {
                client_auth: mode,
                ca_path: Some(ca_path.clone()),
                ..config(&files, &cert, &key)
            };
            c.load().unwrap();
        }
        let bad_ca = TlsConfig {
            client_auth: ClientAuth::Mandatory,
            ca_path: Some(files.write("bad-ca.pem", "nothing here")),
            ..config(&files, &cert, &key)
        };
        assert!(bad_ca.load().is_err());
    }

    #[test]
    fn certificate_maps_to_the_user_its_cn_names() {
        let ca = Ca::new();
        let mut users = UserStore::empty().with_iterations(10);
        users
            .insert_with_password("alice", "pw", epkv_auth::BucketAccess::All)
            .unwrap();
        let der = |cn: &str| {
            let (pem, _) = ca.leaf(cn);
            CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
        };
        assert_eq!(
            user_for_certificate(&der("alice"), &users),
            Ok("alice".to_owned())
        );
        assert_eq!(
            user_for_certificate(&der("mallory"), &users),
            Err(CertUserError::UnknownUser("mallory".into()))
        );
        assert!(matches!(
            user_for_certificate(b"not der", &users),
            Err(CertUserError::NoCommonName(_))
        ));
    }
}
