//! Counters, gauges and latency histograms of the daemon, served as Prometheus text on
//! `--metrics-addr`. Every series name lives here, so the layers that record (fuse, fs, gcs)
//! cannot drift apart; they call these functions and never name a metric themselves.
//! Recording is a few atomic operations: cheap enough for the read path.

use metrics::{counter, gauge, histogram, Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

/// Latency buckets in seconds: 10 µs to 10 s, enough resolution for sub-millisecond reads.
const LATENCY_BUCKETS: [f64; 16] = [
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.5, 1.0,
    10.0,
];

/// Installs the global recorder and serves `GET /metrics` on `addr`. Must run inside a tokio
/// runtime; the listener lives as long as the runtime.
pub fn serve(addr: SocketAddr) -> anyhow::Result<()> {
    builder()
        .with_http_listener(addr)
        .install()
        .map_err(|e| anyhow::anyhow!("cannot serve metrics on {addr}: {e}"))
}

/// How long one connection to a unix-socket metrics listener may last.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(30);

/// Installs the global recorder with no listener of its own, for callers that serve the text
/// themselves ([`serve_unix`]). Must run inside a tokio runtime.
pub fn install() -> anyhow::Result<PrometheusHandle> {
    let handle = builder()
        .install_recorder()
        .map_err(|e| anyhow::anyhow!("cannot install the metrics recorder: {e}"))?;
    // Without a listener of the exporter's own, nothing else drains the histograms.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// Serves `GET /metrics` (Prometheus text from `handle`) over HTTP/1.1 on a unix socket at
/// `path`, replacing a stale socket file there: how the GKE CSI driver's node server scrapes a
/// sidecar. Must run inside a tokio runtime; serves as long as it lives.
pub fn serve_unix(path: &Path, handle: PrometheusHandle) -> anyhow::Result<()> {
    use http_body_util::Full;
    use hyper::{body::Incoming, Request, Response, StatusCode};
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            anyhow::bail!("cannot replace {}: {e}", path.display())
        }
        _ => {}
    }
    let listener = tokio::net::UnixListener::bind(path)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", path.display()))?;
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                // Out of descriptors, say: pause rather than spin, and keep serving.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let handle = handle.clone();
            let answer = move |req: Request<Incoming>| {
                let response = if req.uri().path() == "/metrics" {
                    Response::new(Full::new(bytes::Bytes::from(handle.render())))
                } else {
                    let mut r = Response::new(Full::new(bytes::Bytes::from_static(b"not found\n")));
                    *r.status_mut() = StatusCode::NOT_FOUND;
                    r
                };
                async move { Ok::<_, std::convert::Infallible>(response) }
            };
            let connection = hyper::server::conn::http1::Builder::new().serve_connection(
                hyper_util::rt::TokioIo::new(stream),
                hyper::service::service_fn(answer),
            );
            // A scraper that connects and says nothing must not hold a task forever.
            tokio::spawn(tokio::time::timeout(SCRAPE_TIMEOUT, connection));
        }
    });
    Ok(())
}

/// The recorder's configuration (latency buckets); `serve` installs what it builds.
pub fn builder() -> PrometheusBuilder {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &LATENCY_BUCKETS)
        .expect("the latency bucket list is a non-empty constant")
}

/// Every FUSE operation that is recorded.
const FUSE_OPS: [&str; 25] = [
    "lookup",
    "getattr",
    "setattr",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "symlink",
    "readlink",
    "link",
    "rename",
    "open",
    "create",
    "read",
    "write",
    "flush",
    "release",
    "fsync",
    "fsyncdir",
    "opendir",
    "readdir",
    "readdirplus",
    "releasedir",
    "statfs",
    "access",
];

/// The series of one FUSE operation, registered once: recording then costs an atomic add and
/// a histogram push, with no key building or registry lookup per request.
struct OpSeries {
    requests: Counter,
    bytes: Counter,
    latency: Histogram,
}

/// The series of `op`, registered at first use: after `serve` installed the recorder, or
/// never recorded at all (no-op handles) when metrics are not served.
fn op_series(op: &str) -> Option<&'static OpSeries> {
    static SERIES: OnceLock<Vec<OpSeries>> = OnceLock::new();
    let i = FUSE_OPS.iter().position(|o| *o == op)?;
    let all = SERIES.get_or_init(|| {
        FUSE_OPS
            .iter()
            .map(|&op| OpSeries {
                requests: counter!("rapidfs_fuse_requests_total", "op" => op),
                bytes: if matches!(op, "read" | "write") {
                    counter!("rapidfs_fuse_bytes_total", "op" => op)
                } else {
                    Counter::noop()
                },
                latency: histogram!("rapidfs_fuse_latency_seconds", "op" => op),
            })
            .collect()
    });
    all.get(i)
}

/// One FUSE operation answered: its latency, the payload bytes it moved, and its errno
/// when it failed.
pub fn fuse_op(op: &'static str, elapsed: Duration, bytes: u64, errno: Option<i32>) {
    match op_series(op) {
        Some(s) => {
            s.requests.increment(1);
            if bytes > 0 {
                s.bytes.increment(bytes);
            }
            s.latency.record(elapsed.as_secs_f64());
        }
        None => {
            counter!("rapidfs_fuse_requests_total", "op" => op).increment(1);
            histogram!("rapidfs_fuse_latency_seconds", "op" => op).record(elapsed.as_secs_f64());
        }
    }
    if let Some(errno) = errno {
        counter!("rapidfs_fuse_errors_total", "op" => op, "errno" => errno_name(errno))
            .increment(1);
    }
}

/// The method of a gRPC path (`/google.storage.v2.Storage/GetObject` -> `GetObject`), as a
/// label with a bounded set of values.
pub fn grpc_method(path: &str) -> &'static str {
    const KNOWN: [&str; 13] = [
        "BidiReadObject",
        "BidiWriteObject",
        "GetObject",
        "ListObjects",
        "DeleteObject",
        "MoveObject",
        "GetBucket",
        "ReadObject",
        "WriteObject",
        "GetStorageLayout",
        "CreateFolder",
        "DeleteFolder",
        "RenameFolder",
    ];
    let name = path.rsplit('/').next().unwrap_or("");
    KNOWN
        .iter()
        .find(|k| **k == name)
        .copied()
        .unwrap_or("other")
}

/// One gRPC call (or stream open) finished with the given status code name.
pub fn grpc_call(method: &'static str, elapsed: Duration, code: &'static str) {
    counter!("rapidfs_grpc_calls_total", "method" => method, "code" => code).increment(1);
    histogram!("rapidfs_grpc_latency_seconds", "method" => method).record(elapsed.as_secs_f64());
}

/// What happened to a bidi stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEvent {
    /// A new stream was opened.
    Opened,
    /// A pooled stream served a new handle or range instead of opening one.
    Reused,
    /// A broken stream was reopened and its outstanding work resent.
    Reconnected,
}

impl StreamEvent {
    /// A write stream opened for the first time, or reopened after a break.
    pub fn from_reopen(reopen: bool) -> StreamEvent {
        if reopen {
            StreamEvent::Reconnected
        } else {
            StreamEvent::Opened
        }
    }
}

/// Counts a stream event for reads or writes (`kind` is "read" or "write").
pub fn stream(kind: &'static str, event: StreamEvent) {
    static SERIES: OnceLock<Vec<Counter>> = OnceLock::new();
    const EVENTS: [&str; 3] = ["opened", "reused", "reconnected"];
    let all = SERIES.get_or_init(|| {
        ["read", "write"]
            .iter()
            .flat_map(|&k| {
                EVENTS.map(|e| counter!("rapidfs_streams_total", "kind" => k, "event" => e))
            })
            .collect()
    });
    let e = match event {
        StreamEvent::Opened => 0,
        StreamEvent::Reused => 1,
        StreamEvent::Reconnected => 2,
    };
    let k = usize::from(kind == "write");
    if let Some(c) = all.get(k * EVENTS.len() + e) {
        c.increment(1);
    }
}

/// A block cache lookup that found (`hit`) or fetched `value`; hands `value` back.
pub fn cache_lookup<T>(hit: bool, value: T) -> T {
    static SERIES: OnceLock<[Counter; 2]> = OnceLock::new();
    let [hits, misses] = SERIES.get_or_init(|| {
        [
            counter!("rapidfs_cache_lookups_total", "result" => "hit"),
            counter!("rapidfs_cache_lookups_total", "result" => "miss"),
        ]
    });
    if hit { hits } else { misses }.increment(1);
    value
}

/// Bytes the daemon holds under its memory budget, next to the budget.
pub fn memory(in_use: u64, budget: u64) {
    gauge!("rapidfs_memory_in_use_bytes").set(in_use as f64);
    gauge!("rapidfs_memory_budget_bytes").set(budget as f64);
}

/// Every second, records the process's resident memory (what the budget promises to bound:
/// cache, read-ahead, write buffers and everything else) against `budget` bytes. Must run
/// inside a tokio runtime.
pub fn sample_memory(budget: u64) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            if let Some(rss) = resident_bytes() {
                memory(rss, budget);
            }
        }
    });
}

/// Resident set size from `/proc/self/statm` (second field, in pages).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// The name of a gRPC status code (`tonic::Code as i32`), for the `code` label.
pub fn grpc_code(code: i32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i))
        .copied()
        .unwrap_or("UNKNOWN")
}

/// The symbolic name of an errno, so dashboards read `ENOENT` rather than `2`.
fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::EEXIST => "EEXIST",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ENODATA => "ENODATA",
        libc::ENOTSUP => "ENOTSUP",
        libc::ESTALE => "ESTALE",
        libc::EINTR => "EINTR",
        libc::EAGAIN => "EAGAIN",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ELOOP => "ELOOP",
        libc::ENOSYS => "ENOSYS",
        _ => "other",
    }
}
