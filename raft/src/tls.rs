//! Mutual TLS for Raft's HTTP messages: every control node presents a certificate of the
//! group's CA and accepts only peers that present one too, so the shared secret never travels
//! in cleartext and a process without the group's certificate cannot even finish a handshake.
//!
//! Certificates come from PEM files (`--raft-tls-ca`, `--raft-tls-cert`, `--raft-tls-key`),
//! as cert-manager or a secret mount writes them; they are read once at start. Each node's
//! certificate must name the address its peers dial (the host of its `--peers` entry: a DNS
//! name, or an IP address) in its subjectAltName, and be usable for both server and client
//! authentication. TLS 1.3 only, on ring (the crypto provider the rest of the tree uses).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// Where a node's TLS material is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The group's CA certificate(s), PEM: peers' certificates must chain to one.
    pub ca: PathBuf,
    /// This node's certificate chain, PEM.
    pub cert: PathBuf,
    /// This node's private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Why the TLS material cannot be used; names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("the raft TLS configuration: {0}")]
    Config(String),
}

fn file_error(path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File { path: path.display().to_string(), reason: reason.to_string() }
}

/// The group's TLS: the acceptor a node serves with and the connector it dials with.
#[derive(Clone)]
pub struct Tls {
    pub(crate) acceptor: tokio_rustls::TlsAcceptor,
    pub(crate) connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls { .. }")
    }
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no certificate (a PEM \"CERTIFICATE\" block) in it"));
    }
    Ok(certs)
}

impl Tls {
    /// Reads the files and builds both sides. Each error names the file or what is wrong.
    pub fn load(files: &TlsFiles) -> Result<Tls, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for ca in certificates(&files.ca)? {
            roots.add(ca).map_err(|e| file_error(&files.ca, format!("not a usable CA certificate: {e}")))?;
        }
        let roots = Arc::new(roots);
        let chain = certificates(&files.cert)?;
        let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| file_error(&files.key, e))?;
        let config = |e: rustls::Error| TlsError::Config(e.to_string());
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| file_error(&files.ca, e))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(config)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| file_error(&files.cert, format!("does not go with {}: {e}", files.key.display())))?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(config)?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| file_error(&files.cert, e))?;
        Ok(Tls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
        })
    }
}

/// The name a peer at `addr` (`HOST:PORT`) must present: its host, a DNS name or an IP.
pub(crate) fn server_name(addr: &str) -> Result<ServerName<'static>, String> {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string()).map_err(|e| format!("{addr}: {host:?} is not a name TLS can check: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_address_names_the_host_its_certificate_must_carry() {
        assert_eq!(server_name("127.0.0.1:7101").expect("ip"), ServerName::try_from("127.0.0.1").expect("ip"));
        assert_eq!(
            server_name("dovetail-0.dovetail-raft.dovetail.svc:7000").expect("dns"),
            ServerName::try_from("dovetail-0.dovetail-raft.dovetail.svc").expect("dns")
        );
        assert!(server_name("[::1]:7000").is_ok());
    }

    #[test]
    fn missing_or_empty_files_are_named() {
        let dir = tempfile::tempdir().expect("dir");
        let empty = dir.path().join("ca.pem");
        std::fs::write(&empty, "").expect("write");
        let files = TlsFiles { ca: empty.clone(), cert: dir.path().join("nope.pem"), key: dir.path().join("key.pem") };
        match Tls::load(&files) {
            Err(TlsError::File { path, reason }) => {
                assert_eq!(path, empty.display().to_string());
                assert!(reason.contains("no certificate"), "{reason}");
            }
            other => panic!("expected the empty CA file named, got {other:?}"),
        }
    }
}
