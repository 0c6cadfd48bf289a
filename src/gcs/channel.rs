//! Builds the tonic HTTP/2 connections of a `Client` (its unary calls; the bidi streams run
//! on `direct`'s): one tonic `Endpoint` per configured connection, with large flow-control windows (a single bidi read stream must be able to
//! fill a fast link), `TCP_NODELAY`, HTTP/2 keep-alive, 16 MiB frames; `https://` uses TLS
//! with the system's trust store plus an optional CA file (`gcs.ca_file`), and
//! `tls_connector` gives `direct` the same trust. Touches only the transports (credentials
//! are added on top, in `auth`).

use super::{Error, Result};
use crate::config::GcsConfig;
use std::time::Duration;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// Keep-alive pings find dead connections while a stream waits for data.
pub(super) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
pub(super) const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Largest HTTP/2 frame the server may send us, the protocol's largest: 16 KiB frames cost a
/// lot of per-frame work at GB/s, and a read response that arrives in one frame is decoded
/// in place, without a copy (see `read_stream`).
pub(super) const MAX_FRAME: u32 = (1 << 24) - 1;

/// Connects `cfg.connections` HTTP/2 connections to `cfg.endpoint`.
pub(crate) async fn connect(cfg: &GcsConfig) -> Result<Vec<Channel>> {
    let endpoint = endpoint(cfg)?;
    let mut channels = Vec::with_capacity(cfg.connections.max(1));
    for _ in 0..cfg.connections.max(1) {
        let ch = endpoint.connect().await.map_err(|e| {
            Error::Unavailable(format!(
                "cannot connect to {}: {}",
                cfg.endpoint,
                error_chain(&e)
            ))
        })?;
        channels.push(ch);
    }
    Ok(channels)
}

/// The endpoint description shared by every connection of the pool.
fn endpoint(cfg: &GcsConfig) -> Result<Endpoint> {
    let url = cfg.endpoint.trim_end_matches('/');
    let tls = url.starts_with("https://");
    if !tls && !url.starts_with("http://") {
        return Err(Error::InvalidArgument(format!(
            "endpoint {url}: must start with http:// or https://"
        )));
    }
    let mut ep = Endpoint::from_shared(url.to_string())
        .map_err(|e| Error::InvalidArgument(format!("endpoint {url}: {e}")))?;
    if tls {
        let mut tls = ClientTlsConfig::new().with_native_roots();
        if let Some(path) = &cfg.ca_file {
            let pem = std::fs::read(path)
                .map_err(|e| Error::InvalidArgument(format!("CA file {}: {e}", path.display())))?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        ep = ep
            .tls_config(tls)
            .map_err(|e| Error::InvalidArgument(format!("endpoint {url}: TLS: {e}")))?;
    }
    Ok(ep
        .connect_timeout(Duration::from_millis(cfg.connect_timeout_ms))
        .tcp_nodelay(true)
        .initial_stream_window_size(cfg.stream_window_kb.saturating_mul(1024))
        .initial_connection_window_size(cfg.connection_window_kb.saturating_mul(1024))
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .max_frame_size(MAX_FRAME))
}

/// The TLS connector of the directly driven connections (`direct`): the same trust as
/// `endpoint`'s (the system's roots plus `gcs.ca_file`), offering HTTP/2 only, for `host`
/// (a name, or an address without brackets).
pub(crate) fn tls_connector(
    cfg: &GcsConfig,
    host: &str,
) -> Result<(
    tokio_rustls::TlsConnector,
    rustls::pki_types::ServerName<'static>,
)> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    // Unreadable system certificates are skipped, as tonic's native roots do.
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    if let Some(path) = &cfg.ca_file {
        let pem = std::fs::read(path)
            .map_err(|e| Error::InvalidArgument(format!("CA file {}: {e}", path.display())))?;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert
                .map_err(|e| Error::InvalidArgument(format!("CA file {}: {e}", path.display())))?;
            roots
                .add(cert)
                .map_err(|e| Error::InvalidArgument(format!("CA file {}: {e}", path.display())))?;
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::InvalidArgument(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let name = ServerName::try_from(host)
        .map_err(|e| Error::InvalidArgument(format!("endpoint host {host}: {e}")))?
        .to_owned();
    Ok((
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls)),
        name,
    ))
}

/// A transport error with its causes on one line (tonic's Display hides the interesting part).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_unknown_schemes_with_a_clear_error() {
        let cfg = GcsConfig {
            endpoint: "ftp://x".into(),
            ..Default::default()
        };
        let e = endpoint(&cfg).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert!(e.to_string().contains("ftp://x"));
    }

    #[test]
    fn accepts_https_with_the_system_roots() {
        let cfg = GcsConfig {
            endpoint: "https://storage.googleapis.com".into(),
            ..Default::default()
        };
        assert!(endpoint(&cfg).is_ok());
    }

    #[test]
    fn accepts_plain_http() {
        let cfg = GcsConfig {
            endpoint: "http://127.0.0.1:9/".into(),
            ..Default::default()
        };
        assert!(endpoint(&cfg).is_ok());
    }
}
