//! The built-in emulator: the server side of the `google.storage.v2` wire, serving a local
//! directory (or memory) as buckets. Depends only on `crate::proto`; shares no state with the
//! client.
//!
//! Layout: `store` (the object model and API rules) over a backend (`memory` or
//! `directory`) holding `content` (one generation's bytes); the RPCs in `read`
//! (BidiReadObject), `write` (BidiWriteObject, with `write_burst` for an upload that comes in
//! whole), `unary`, `listing` and `control`, wired to the
//! generated traits in `service`; `faults`, `stats` and `wire` (shared call plumbing);
//! `auth` (optional TLS and bearer-token check).

mod auth;
mod bucket_names;
mod content;
mod control;
mod directory;

mod faults;
mod journal;
mod listing;
mod memory;
mod object_proto;
mod preconditions;
mod read;
mod read_wire;
mod service;
mod stats;
mod store;
mod tree;
mod unary;
mod wire;
mod write;
mod write_burst;

pub use auth::{Security, ServerTls};
pub use faults::Faults;
pub use stats::StatsSnapshot;

use crate::proto::control::storage_control_server::StorageControlServer;
use anyhow::Context;
use faults::FaultState;
use preconditions::Preconditions;
use stats::Stats;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use store::Store;

/// HTTP/2 flow-control windows: large, so one stream can carry GB/s over loopback.
const STREAM_WINDOW: u32 = 32 * 1024 * 1024;
/// The widest stream window the `flow_window_kib` fault takes: the default one (HTTP/2
/// allows under 2 GiB, and a connection gets four times a stream's).
pub const MAX_FLOW_WINDOW_KIB: u32 = STREAM_WINDOW / 1024;
const CONNECTION_WINDOW: u32 = 64 * 1024 * 1024;
/// Largest gRPC message accepted or sent (a 2 MiB chunk plus framing, with room to spare).
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// How long `Emulator::shutdown` lets open connections finish.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// How to run an emulator.
#[derive(Debug, Clone, Default)]
pub struct EmulatorOptions {
    /// Directory backend when `Some` and `!memory`; with `memory`, buckets preloaded from it.
    pub root: Option<PathBuf>,
    /// Memory backend.
    pub memory: bool,
    /// Zone reported by GetStorageLayout and GetBucket, e.g. "us-central1-a".
    pub zone: String,
    /// Faults injected from the start.
    pub faults: Faults,
}

/// The state every RPC handler shares (cheap to clone).
#[derive(Clone)]
pub(crate) struct Service {
    store: Arc<Store>,
    calls: wire::Calls,
    zone: String,
    tokens: Arc<auth::TokenCheck>,
}

impl Service {
    fn new(opts: &EmulatorOptions) -> anyhow::Result<Service> {
        let backend: Box<dyn store::Backend> = match (&opts.root, opts.memory) {
            (root, true) => {
                if let Some(r) = root {
                    check_root(r)?;
                }
                Box::new(memory::MemoryBackend::new(root.clone()))
            }
            (Some(root), false) => {
                check_root(root)?;
                Box::new(directory::DirectoryBackend::new(root.clone())?)
            }
            (None, false) => anyhow::bail!("no backend: give a root directory or choose memory"),
        };
        let zone = if opts.zone.is_empty() {
            "us-central1-a".to_string()
        } else {
            opts.zone.clone()
        };
        Ok(Service {
            store: Store::open(backend)?,
            calls: wire::Calls {
                stats: Arc::new(Stats::default()),
                faults: FaultState::new(opts.faults.clone()),
            },
            zone,
            tokens: Arc::default(),
        })
    }

    /// The bucket location: the zone's region in upper case ("us-central1-a" -> "US-CENTRAL1");
    /// the zone itself is in the custom placement's data locations.
    fn region(&self) -> String {
        let region = match self.zone.rsplit_once('-') {
            Some((r, z)) if z.len() == 1 => r,
            _ => self.zone.as_str(),
        };
        region.to_uppercase()
    }

    async fn run(
        self,
        listener: tokio::net::TcpListener,
        tls: Option<ServerTls>,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        use tonic::service::interceptor::InterceptedService;
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let check = auth::Interceptor {
            check: self.tokens.clone(),
            stats: self.calls.stats.clone(),
        };
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = &tls {
            builder = builder
                .tls_config(tls.config())
                .context("bad TLS certificate or key")?;
        }
        let (stream_window, connection_window) = match self.calls.faults.get().flow_window_kib {
            Some(kib) => {
                let stream = kib.clamp(1, MAX_FLOW_WINDOW_KIB) * 1024;
                (stream, stream * 4)
            }
            None => (STREAM_WINDOW, CONNECTION_WINDOW),
        };
        builder
            .initial_stream_window_size(stream_window)
            .initial_connection_window_size(connection_window)
            .max_frame_size(1024 * 1024 - 1)
            .add_service(InterceptedService::new(
                read_wire::StorageRoutes::new(self.clone(), MAX_MESSAGE),
                check.clone(),
            ))
            .add_service(InterceptedService::new(
                StorageControlServer::new(self),
                check,
            ))
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .context("the gRPC server failed")
    }
}

fn check_root(root: &std::path::Path) -> anyhow::Result<()> {
    let meta = std::fs::metadata(root)
        .with_context(|| format!("root directory {} is not usable", root.display()))?;
    anyhow::ensure!(meta.is_dir(), "root {} is not a directory", root.display());
    Ok(())
}

/// The same function the `rapidfs emulator` subcommand calls: serves `listener` until
/// `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    opts: EmulatorOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_secure(listener, opts, Security::default(), shutdown).await
}

/// `serve` with TLS and/or a bearer-token check.
pub async fn serve_secure(
    listener: tokio::net::TcpListener,
    opts: EmulatorOptions,
    security: Security,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let service = Service::new(&opts)?;
    for t in &security.tokens {
        service.tokens.allow(t, None);
    }
    service.run(listener, security.tls, shutdown).await
}

/// A running in-process emulator (tests, benchmarks, `mount --emulator`).
pub struct Emulator {
    addr: SocketAddr,
    service: Service,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    tls: bool,
}

impl Emulator {
    /// Binds `listen` (use "127.0.0.1:0" in tests) and serves until `shutdown()` or drop.
    pub async fn start(opts: EmulatorOptions, listen: SocketAddr) -> anyhow::Result<Emulator> {
        Emulator::start_secure(opts, listen, Security::default()).await
    }

    /// `start` with TLS (the endpoint becomes `https://`) and/or a bearer-token check.
    pub async fn start_secure(
        opts: EmulatorOptions,
        listen: SocketAddr,
        security: Security,
    ) -> anyhow::Result<Emulator> {
        let service = Service::new(&opts)?;
        for t in &security.tokens {
            service.tokens.allow(t, None);
        }
        let tls = security.tls.is_some();
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(service.clone().run(listener, security.tls, async move {
            let _ = stopped.await;
        }));
        Ok(Emulator {
            addr,
            service,
            stop: Some(stop),
            task: Some(task),
            tls,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// "http://127.0.0.1:PORT" ("https://" in TLS mode)
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Accepts the bearer `token` from now on, for `valid_for` (forever when `None`); from the
    /// first allowed token on, calls without a valid token are refused (UNAUTHENTICATED).
    pub fn allow_token(&self, token: &str, valid_for: Option<std::time::Duration>) {
        self.service.tokens.allow(token, valid_for)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.service.calls.stats.snapshot()
    }

    /// Sets every counter to zero.
    pub fn reset_stats(&self) {
        self.service.calls.stats.reset()
    }

    /// Changes the injected faults from now on (streams already open keep theirs).
    pub fn set_faults(&self, faults: Faults) {
        self.service.calls.faults.set(faults)
    }

    /// Test setup without going through the wire.
    pub fn create_bucket(&self, bucket: &str) -> anyhow::Result<()> {
        self.service
            .store
            .create_bucket(bucket)
            .map_err(|s| anyhow::anyhow!("create bucket {bucket:?}: {}", s.message()))
    }

    /// Creates (or replaces, new generation) a finalized object.
    pub fn put_object(&self, bucket: &str, name: &str, data: bytes::Bytes) -> anyhow::Result<i64> {
        self.put_object_with_metadata(bucket, name, data, &[])
    }

    /// `put_object` with custom metadata (`Object.metadata`), as other tools write it.
    pub fn put_object_with_metadata(
        &self,
        bucket: &str,
        name: &str,
        data: bytes::Bytes,
        metadata: &[(&str, &str)],
    ) -> anyhow::Result<i64> {
        let metadata = metadata
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.service
            .store
            .put(
                bucket,
                name,
                content::Segments::from_bytes(data),
                Preconditions::default(),
                metadata,
            )
            .map(|e| e.content.generation)
            .map_err(|s| anyhow::anyhow!("put {bucket}/{name}: {}", s.message()))
    }

    /// Stops serving and waits until the server has closed. A directory root stays locked
    /// (see `directory.rs`) while a client still holds a stream open on it: a restart over
    /// the same root in one process needs its clients' streams closed first.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(mut task) = self.task.take() {
            // Clients that keep idle connections open must not hold the shutdown forever.
            if tokio::time::timeout(SHUTDOWN_GRACE, &mut task)
                .await
                .is_err()
            {
                task.abort();
                let _ = task.await;
            }
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
