//! What every RPC handler shares: call accounting (stats, routing header, injected
//! UNAVAILABLE, latency), statuses with `google.rpc.Status` details, handles, and the
//! outgoing message queue that adds latency without capping throughput.
//! Touches the stats and fault state it is given.

use super::faults::FaultState;
use super::stats::{add, Stats};
use prost::Message;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

/// The routing header name.
const ROUTING_HEADER: &str = "x-goog-request-params";

/// Decodes `%XX` escapes (some clients encode the header's values).
fn percent_decode(s: &str) -> String {
    fn hex(c: u8) -> Option<u8> {
        (c as char).to_digit(16).map(|d| d as u8)
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The `key=value` pairs of the routing header, decoded.
pub(crate) fn routing_params(meta: &MetadataMap) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for v in meta.get_all(ROUTING_HEADER) {
        let Ok(v) = v.to_str() else { continue };
        for pair in v.split('&') {
            if let Some((k, val)) = pair.split_once('=') {
                out.push((percent_decode(k), percent_decode(val)));
            }
        }
    }
    out
}

/// The routing token of the header, if any.
pub(crate) fn header_routing_token(meta: &MetadataMap) -> Option<String> {
    routing_params(meta)
        .into_iter()
        .find(|(k, _)| k == "routing_token")
        .map(|(_, v)| v)
}

/// Accounting shared by every call.
#[derive(Clone)]
pub(crate) struct Calls {
    /// Counters.
    pub stats: std::sync::Arc<Stats>,
    /// Fault settings.
    pub faults: std::sync::Arc<FaultState>,
}

impl Calls {
    /// Counts a call, checks its routing header against `bucket` (a full
    /// `projects/_/buckets/NAME`) under `key`, and injects UNAVAILABLE if it is due.
    pub fn begin(&self, meta: &MetadataMap, key: &str, bucket: &str) -> Result<(), Status> {
        let routed = routing_params(meta)
            .iter()
            .any(|(k, v)| k == key && v == bucket);
        self.begin_checked(routed)
    }

    /// Counts a call whose routing header was (or was not) found correct, and injects
    /// UNAVAILABLE if it is due.
    pub fn begin_checked(&self, routed: bool) -> Result<(), Status> {
        add(&self.stats.calls, 1);
        if !routed {
            add(&self.stats.missing_routing_header, 1);
            tracing::debug!("call without a correct x-goog-request-params header");
        }
        if self.faults.call_fails() {
            add(&self.stats.faults_injected, 1);
            return Err(Status::unavailable(
                "injected fault: every k-th call fails with UNAVAILABLE (unavailable_every)",
            ));
        }
        Ok(())
    }

    /// The answer of a unary call that made its change: UNAVAILABLE instead, when one is
    /// due to be lost (`Faults::lose_answer_every`).
    pub fn answer<T>(&self, answer: T) -> Result<T, Status> {
        if self.faults.answer_lost() {
            add(&self.stats.faults_injected, 1);
            return Err(Status::unavailable(
                "injected fault: the change was made, its answer lost (lose_answer_every)",
            ));
        }
        Ok(answer)
    }

    /// Waits out the injected latency of a unary call.
    pub async fn delay(&self) {
        if let Some(d) = self.faults.latency() {
            add(&self.stats.delays_injected, 1);
            tokio::time::sleep(d).await;
        }
    }
}

/// A status whose `grpc-status-details-bin` holds a `google.rpc.Status` with one detail.
pub(crate) fn status_with_detail<M: Message>(
    code: Code,
    message: String,
    type_name: &str,
    detail: &M,
) -> Status {
    let rpc = crate::proto::rpc::Status {
        code: code as i32,
        message: message.clone(),
        details: vec![prost_types::Any {
            type_url: format!("type.googleapis.com/{type_name}"),
            value: detail.encode_to_vec(),
        }],
    };
    Status::with_details(code, message, rpc.encode_to_vec().into())
}

/// An opaque handle: a tag plus numbers.
pub(crate) fn encode_handle(tag: &str, parts: &[u64]) -> bytes::Bytes {
    let mut s = tag.to_string();
    for p in parts {
        s.push(':');
        s.push_str(&p.to_string());
    }
    bytes::Bytes::from(s)
}

/// The numbers of a handle made by `encode_handle` with the same tag.
pub(crate) fn decode_handle(tag: &str, handle: &[u8]) -> Result<Vec<u64>, Status> {
    let bad = || Status::invalid_argument("malformed handle: not one this server issued");
    let s = std::str::from_utf8(handle).map_err(|_| bad())?;
    let mut it = s.split(':');
    if it.next() != Some(tag) {
        return Err(bad());
    }
    it.map(|p| p.parse::<u64>().map_err(|_| bad())).collect()
}

/// The sending side of a response stream; with latency, each message is held until its
/// own send time plus the latency, while later messages keep queueing behind it.
pub(crate) struct Outbox<T> {
    direct: Option<mpsc::Sender<Result<T, Status>>>,
    delayed: Option<mpsc::Sender<(Instant, Result<T, Status>)>>,
}

/// Messages queued per stream without latency (enough to keep the socket busy).
const DIRECT_DEPTH: usize = 4;
/// Messages in flight per stream behind an injected latency.
const DELAYED_DEPTH: usize = 64;

impl<T: Send + 'static> Outbox<T> {
    /// A queue and the response stream it feeds.
    pub fn new(latency: Option<Duration>) -> (Outbox<T>, ReceiverStream<Result<T, Status>>) {
        let (tx, rx) = mpsc::channel(DIRECT_DEPTH);
        match latency {
            None => (
                Outbox {
                    direct: Some(tx),
                    delayed: None,
                },
                ReceiverStream::new(rx),
            ),
            Some(lat) => {
                let (dtx, mut drx) = mpsc::channel::<(Instant, Result<T, Status>)>(DELAYED_DEPTH);
                tokio::spawn(async move {
                    while let Some((at, item)) = drx.recv().await {
                        tokio::time::sleep_until(at + lat).await;
                        if tx.send(item).await.is_err() {
                            break;
                        }
                    }
                });
                (
                    Outbox {
                        direct: None,
                        delayed: Some(dtx),
                    },
                    ReceiverStream::new(rx),
                )
            }
        }
    }

    /// Resolves once the client has gone. Behind an injected latency that is known only
    /// when a queued message finds it gone: with nothing queued, this waits until the
    /// emulator stops.
    pub async fn closed(&self) {
        if let Some(tx) = &self.direct {
            tx.closed().await;
        } else if let Some(tx) = &self.delayed {
            tx.closed().await;
        }
    }

    /// Queues one message; false when the client has gone.
    pub async fn send(&self, item: Result<T, Status>) -> bool {
        if let Some(tx) = &self.direct {
            return tx.send(item).await.is_ok();
        }
        if let Some(tx) = &self.delayed {
            return tx.send((Instant::now(), item)).await.is_ok();
        }
        false
    }
}
