//! The HTTP/2 connections the bidi read and write streams run on, driven through `h2` itself
//! rather than through tonic's `Channel`. A stream open goes from the caller straight to the
//! connection's task, and every request message the caller sends is handed to that task
//! directly: tonic's channel passes each open through a buffer task first, and hyper pumps a
//! streaming request body through a task of its own, so every small file paid two more
//! thread hand-offs per call. Each connection of the pool is dialled on first use and again after it
//! fails (the next open finds it closed); keep-alive pings close one that stops answering.
//! TLS for `https://` endpoints uses the system's trust store plus `gcs.ca_file`, as
//! `channel` does. Touches only the sockets and the credentials (`auth`).

use super::auth::Auth;
use super::channel::{KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT, MAX_FRAME};
use super::{Error, Result};
use crate::config::GcsConfig;
use bytes::Bytes;
use h2::client::SendRequest;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tonic::Status;

/// Bytes a stream may have queued in h2 before a writer's `ready` waits: eight 2 MiB data
/// messages, the queue the writers had before. The data in it is the writer's own buffers,
/// shared (`stream::write_frame`), not copies. At h2's default of 400 KiB a writer waited
/// for the socket after every message, and a `torch.save` through the mount ran at 0.88x.
const SEND_BUFFER: usize = 16 << 20;

/// A pool of directly driven HTTP/2 connections to one endpoint; cheap to share.
pub(crate) struct Pool {
    target: Target,
    slots: Vec<tokio::sync::Mutex<Option<SendRequest<Bytes>>>>,
    next: AtomicUsize,
    auth: Auth,
    window: u32,
    connection_window: u32,
    connect_timeout: Duration,
}

/// Where the connections go, and how.
struct Target {
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    /// The host to dial: a name, or an address (an IPv6 one without its brackets).
    host: String,
    port: u16,
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    )>,
}

impl Pool {
    /// A pool of `cfg.connections` connections to `cfg.endpoint`, none dialled yet.
    pub(crate) fn new(cfg: &GcsConfig, auth: Auth) -> Result<Pool> {
        Ok(Pool {
            target: target(cfg)?,
            slots: (0..cfg.connections.max(1))
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
            next: AtomicUsize::new(0),
            auth,
            window: clamp_window(cfg.stream_window_kb),
            connection_window: clamp_window(cfg.connection_window_kb),
            connect_timeout: Duration::from_millis(cfg.connect_timeout_ms.max(1)),
        })
    }

    /// Opens a call of `path` on the next connection (round robin), with the credentials and
    /// `headers` on it. Resolves once the connection has room for another stream and the
    /// request is queued on it; the response headers come with the returned future.
    pub(crate) async fn open(
        &self,
        path: &'static str,
        headers: http::HeaderMap,
    ) -> std::result::Result<(h2::client::ResponseFuture, h2::SendStream<Bytes>), Status> {
        let uri = http::Uri::builder()
            .scheme(self.target.scheme.clone())
            .authority(self.target.authority.clone())
            .path_and_query(path)
            .build()
            .map_err(|e| Status::internal(format!("request URI: {e}")))?;
        let mut req = http::Request::builder()
            .method(http::Method::POST)
            .uri(uri)
            .body(())
            .map_err(|e| Status::internal(format!("request: {e}")))?;
        *req.headers_mut() = headers;
        req.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        req.headers_mut()
            .insert(http::header::TE, http::HeaderValue::from_static("trailers"));
        self.auth.add_headers(req.headers_mut()).await?;
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let mut sender = self.ready(slot).await?;
        sender
            .send_request(req, false)
            .map_err(|e| Status::unavailable(format!("stream open: {e}")))
    }

    /// A sender on connection `slot` that can open a stream now: the live one, or a new
    /// connection when there is none or it has closed.
    async fn ready(&self, slot: usize) -> std::result::Result<SendRequest<Bytes>, Status> {
        let mut held = self.slots[slot].lock().await;
        if let Some(sender) = held.clone() {
            match sender.ready().await {
                Ok(ready) => return Ok(ready),
                Err(_) => *held = None,
            }
        }
        // Boxed: dialling (TCP, TLS, the HTTP/2 handshake) has kilobytes of state, which
        // would otherwise be part of every stream open's future, and be copied with it into
        // every task that opens a stream, though a connection is dialled only now and then.
        let sender = tokio::time::timeout(self.connect_timeout, Box::pin(self.connect()))
            .await
            .map_err(|_| {
                Status::unavailable(format!(
                    "cannot connect to {}: no answer within {} ms",
                    self.target.authority,
                    self.connect_timeout.as_millis()
                ))
            })??;
        *held = Some(sender.clone());
        sender
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("new connection: {e}")))
    }

    /// Dials one connection and starts the task that drives it.
    async fn connect(&self) -> std::result::Result<SendRequest<Bytes>, Status> {
        let unreachable = |e: &dyn std::fmt::Display| {
            Status::unavailable(format!("cannot connect to {}: {e}", self.target.authority))
        };
        let tcp = TcpStream::connect((self.target.host.as_str(), self.target.port))
            .await
            .map_err(|e| unreachable(&e))?;
        let _ = tcp.set_nodelay(true);
        match &self.target.tls {
            None => self.handshake(tcp).await,
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|e| unreachable(&e))?;
                self.handshake(tls).await
            }
        }
    }

    /// The HTTP/2 handshake on `io`; the connection is then driven by a task of its own,
    /// which ends when the connection does or stops answering pings.
    async fn handshake<T>(&self, io: T) -> std::result::Result<SendRequest<Bytes>, Status>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, mut connection) = h2::client::Builder::new()
            .initial_window_size(self.window)
            .initial_connection_window_size(self.connection_window)
            .max_frame_size(MAX_FRAME)
            .enable_push(false)
            .max_send_buffer_size(SEND_BUFFER)
            .handshake::<_, Bytes>(io)
            .await
            .map_err(|e| {
                Status::unavailable(format!("HTTP/2 with {}: {e}", self.target.authority))
            })?;
        let pings = connection.ping_pong();
        tokio::spawn(async move {
            tokio::select! {
                _ = connection => {}
                _ = keep_alive(pings) => {}
            }
        });
        Ok(sender)
    }
}

/// Pings every `KEEPALIVE_INTERVAL`; returns when a pong is late or the connection is gone.
async fn keep_alive(pings: Option<h2::PingPong>) {
    let Some(mut pings) = pings else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(KEEPALIVE_INTERVAL).await;
        match tokio::time::timeout(KEEPALIVE_TIMEOUT, pings.ping(h2::Ping::opaque())).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
    }
}

/// HTTP/2 windows are at most 2^31 - 1 bytes.
fn clamp_window(kb: u32) -> u32 {
    kb.saturating_mul(1024).min((1 << 31) - 1)
}

/// The endpoint's scheme, authority and, for `https://`, the TLS connector.
fn target(cfg: &GcsConfig) -> Result<Target> {
    let url = cfg.endpoint.trim_end_matches('/');
    let uri: http::Uri = url
        .parse()
        .map_err(|e| Error::InvalidArgument(format!("endpoint {url}: {e}")))?;
    let (Some(scheme), Some(authority)) = (uri.scheme().cloned(), uri.authority().cloned()) else {
        return Err(Error::InvalidArgument(format!(
            "endpoint {url}: must start with http:// or https://"
        )));
    };
    let host = authority.host();
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let (tls, default_port) = if scheme == http::uri::Scheme::HTTPS {
        (Some(super::channel::tls_connector(cfg, &host)?), 443)
    } else if scheme == http::uri::Scheme::HTTP {
        (None, 80)
    } else {
        return Err(Error::InvalidArgument(format!(
            "endpoint {url}: must start with http:// or https://"
        )));
    };
    Ok(Target {
        port: authority.port_u16().unwrap_or(default_port),
        scheme,
        authority,
        host,
        tls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(endpoint: &str) -> GcsConfig {
        GcsConfig {
            endpoint: endpoint.into(),
            ..Default::default()
        }
    }

    #[test]
    fn targets_name_the_host_and_port_to_dial() {
        let t = target(&cfg("http://127.0.0.1:8080/")).unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.tls.is_none()),
            ("127.0.0.1", 8080, true)
        );
        let t = target(&cfg("http://[::1]:9000")).unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 9000));
        let t = target(&cfg("https://storage.googleapis.com")).unwrap();
        assert_eq!((t.host.as_str(), t.port), ("storage.googleapis.com", 443));
        assert!(t.tls.is_some());
    }

    #[test]
    fn other_schemes_are_refused_with_the_endpoint_named() {
        for bad in ["ftp://x", "127.0.0.1:80", "x"] {
            let e = target(&cfg(bad)).err().expect(bad).to_string();
            assert!(e.contains(bad), "{e}");
        }
    }
}
