//! The retry policy shared by every call and stream: which statuses are worth retrying,
//! how redirects are recognised (ABORTED with a `Bidi*ObjectRedirectedError` in the
//! `google.rpc.Status` details), jittered exponential backoff, and the total deadline after
//! which the caller gets `Error::Unavailable`. Also maps final statuses to `Error`.

use super::{Error, Result};
use crate::config::GcsConfig;
use crate::proto::rpc;
use prost::Message;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;
use tonic::{Code, Status};

/// Type URL prefix of the `Any` messages in status details.
const TYPE_PREFIX: &str = "type.googleapis.com/";

/// Transient statuses: the same request may well succeed on another attempt.
pub(crate) fn is_retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::Internal | Code::ResourceExhausted | Code::DeadlineExceeded
    )
}

/// A status worth another attempt: a transient code, or a broken connection. tonic reports
/// those with the transport error as the status's source, not as a server's answer: UNKNOWN
/// for a connection that failed, CANCELLED for a stream the peer reset (a server going away
/// resets its streams with CANCEL).
pub(crate) fn is_transient(s: &Status) -> bool {
    let from_transport = std::error::Error::source(s).is_some();
    is_retryable(s.code())
        || (matches!(s.code(), Code::Unknown | Code::Cancelled) && from_transport)
}

/// The typed detail `M` (full proto name `type_name`) of an ABORTED status, if it has one.
pub(crate) fn redirect_detail<M: Message + Default>(status: &Status, type_name: &str) -> Option<M> {
    if status.code() != Code::Aborted || status.details().is_empty() {
        return None;
    }
    let st = rpc::Status::decode(status.details()).ok()?;
    st.details
        .iter()
        .find(|any| any.type_url.strip_prefix(TYPE_PREFIX) == Some(type_name))
        .and_then(|any| M::decode(any.value.as_slice()).ok())
}

/// The error a caller sees for a final (non-retried) status about `what`.
pub(crate) fn map_status(status: &Status, what: &str) -> Error {
    let msg = format!("{what}: {}", status.message());
    match status.code() {
        Code::NotFound => Error::NotFound(msg),
        Code::FailedPrecondition => Error::PreconditionFailed(msg),
        Code::OutOfRange => Error::OutOfRange(msg),
        Code::InvalidArgument => Error::InvalidArgument(msg),
        Code::PermissionDenied | Code::Unauthenticated => Error::PermissionDenied(msg),
        Code::AlreadyExists => Error::AlreadyExists(msg),
        Code::DataLoss => Error::Checksum(msg),
        _ if is_transient(status) => Error::Unavailable(format!("{msg} ({:?})", status.code())),
        c => Error::Other(format!("{msg} ({c:?})")),
    }
}

/// Jittered exponential backoff under a total deadline that restarts on progress.
#[derive(Debug)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    total: Duration,
    next: Duration,
    deadline: Instant,
}

impl Backoff {
    /// A fresh policy from the configuration.
    pub(crate) fn new(cfg: &GcsConfig) -> Self {
        Self::with(
            Duration::from_millis(cfg.initial_backoff_ms),
            Duration::from_millis(cfg.max_backoff_ms),
            Duration::from_millis(cfg.retry_deadline_ms),
        )
    }

    fn with(initial: Duration, max: Duration, total: Duration) -> Self {
        Backoff {
            initial,
            max: max.max(initial),
            total,
            next: initial,
            deadline: Instant::now() + total,
        }
    }

    /// Progress was made: the next failure starts the schedule and the deadline afresh.
    pub(crate) fn reset(&mut self) {
        self.next = self.initial;
        self.deadline = Instant::now() + self.total;
    }

    /// When the current attempt series must give up.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The pause before the next attempt (uniform in [d/2, d], d doubling up to max), or
    /// `None` when even that pause would end past the deadline.
    pub(crate) fn next_delay(&mut self) -> Option<Duration> {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        let half = d / 2;
        let jitter = if half.is_zero() {
            Duration::ZERO
        } else {
            Duration::from_nanos(rand::random_range(0..=half.as_nanos() as u64))
        };
        let pause = half + jitter;
        (Instant::now() + pause < self.deadline).then_some(pause)
    }

    /// Sleeps for the next pause; `false` when the deadline leaves no room for another attempt.
    pub(crate) async fn wait(&mut self) -> bool {
        match self.next_delay() {
            Some(d) => {
                tokio::time::sleep(d).await;
                true
            }
            None => false,
        }
    }
}

/// The one retry decision of every call and stream after a failed attempt: `Ok` to try
/// again, after the backoff's pause (none after a redirect, whose routing token the caller
/// took), or the error to end with: the status mapped when it is not transient,
/// `Unavailable` once the deadline leaves no room for another attempt.
pub(crate) async fn retry_after(
    backoff: &mut Backoff,
    status: &Status,
    redirected: bool,
    what: &str,
) -> Result<()> {
    if redirected {
        if Instant::now() < backoff.deadline() {
            return Ok(());
        }
    } else if !is_transient(status) {
        return Err(map_status(status, what));
    } else if backoff.wait().await {
        return Ok(());
    }
    Err(Error::Unavailable(format!(
        "{what}: no progress for {}ms, giving up: {} ({:?})",
        backoff.total.as_millis(),
        status.message(),
        status.code()
    )))
}

/// Runs one unary call with per-attempt deadline `cfg.call_timeout_ms`, retrying transient
/// failures with backoff until `cfg.retry_deadline_ms`. `what` names the target in errors.
pub(crate) async fn unary<T, F, Fut>(cfg: &GcsConfig, what: &str, mut call: F) -> Result<T>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = std::result::Result<T, Status>>,
{
    let per_call = Duration::from_millis(cfg.call_timeout_ms);
    let mut backoff = Backoff::new(cfg);
    let mut attempt = 0u32;
    loop {
        let status = match tokio::time::timeout(per_call, call(attempt)).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(s)) => s,
            Err(_) => Status::deadline_exceeded(format!("no answer within {per_call:?}")),
        };
        attempt += 1;
        retry_after(&mut backoff, &status, false, what).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::storage::{BidiReadHandle, BidiReadObjectRedirectedError};

    #[test]
    fn classification() {
        for c in [
            Code::Unavailable,
            Code::Internal,
            Code::ResourceExhausted,
            Code::DeadlineExceeded,
        ] {
            assert!(is_retryable(c), "{c:?}");
        }
        for c in [
            Code::NotFound,
            Code::FailedPrecondition,
            Code::InvalidArgument,
            Code::Aborted,
            Code::OutOfRange,
        ] {
            assert!(!is_retryable(c), "{c:?}");
        }
        assert!(matches!(
            map_status(&Status::not_found("x"), "gs://b/o"),
            Error::NotFound(m) if m.contains("gs://b/o")
        ));
        assert!(matches!(
            map_status(&Status::unavailable("x"), "o"),
            Error::Unavailable(_)
        ));
    }

    #[test]
    fn a_stream_reset_by_the_peer_is_transient_a_cancel_answered_is_not() {
        let mut reset = Status::cancelled("operation was canceled");
        reset.set_source(std::sync::Arc::new(std::io::Error::other(
            "RST_STREAM CANCEL",
        )));
        assert!(is_transient(&reset));
        assert!(!is_transient(&Status::cancelled("the server said so")));
    }

    #[tokio::test]
    async fn one_decision_after_every_failed_attempt() {
        let ms = Duration::from_millis;
        let mut b = Backoff::with(ms(1), ms(2), ms(50));
        let transient = Status::unavailable("busy");
        assert!(retry_after(&mut b, &transient, false, "o").await.is_ok());
        assert!(matches!(
            retry_after(&mut b, &Status::not_found("gone"), false, "o").await,
            Err(Error::NotFound(_))
        ));
        let moved = Status::aborted("moved");
        assert!(
            retry_after(&mut b, &moved, true, "o").await.is_ok(),
            "a redirect: at once"
        );
        tokio::time::sleep(ms(60)).await;
        for redirected in [false, true] {
            assert!(matches!(
                retry_after(&mut b, &transient, redirected, "o").await,
                Err(Error::Unavailable(m)) if m.contains("giving up")
            ));
        }
    }

    fn aborted_with(type_url: &str, value: Vec<u8>) -> Status {
        let st = rpc::Status {
            code: Code::Aborted as i32,
            message: "moved".into(),
            details: vec![prost_types::Any {
                type_url: type_url.into(),
                value,
            }],
        };
        Status::with_details(Code::Aborted, "moved", st.encode_to_vec().into())
    }

    #[test]
    fn decodes_read_redirect_from_details() {
        let e = BidiReadObjectRedirectedError {
            read_handle: Some(BidiReadHandle {
                handle: bytes::Bytes::from_static(b"h"),
            }),
            routing_token: Some("tok".into()),
        };
        let s = aborted_with(
            "type.googleapis.com/google.storage.v2.BidiReadObjectRedirectedError",
            e.encode_to_vec(),
        );
        let got: BidiReadObjectRedirectedError =
            redirect_detail(&s, "google.storage.v2.BidiReadObjectRedirectedError").unwrap();
        assert_eq!(got, e);
        // Another type, or a non-ABORTED status, is not a redirect.
        assert!(redirect_detail::<BidiReadObjectRedirectedError>(
            &s,
            "google.storage.v2.BidiWriteObjectRedirectedError"
        )
        .is_none());
        assert!(redirect_detail::<BidiReadObjectRedirectedError>(
            &Status::unavailable("x"),
            "google.storage.v2.BidiReadObjectRedirectedError"
        )
        .is_none());
    }

    #[test]
    fn backoff_doubles_with_jitter_caps_and_respects_the_deadline() {
        let mut b = Backoff::with(
            Duration::from_millis(10),
            Duration::from_millis(40),
            Duration::from_secs(60),
        );
        let d: Vec<_> = (0..5).map(|_| b.next_delay().unwrap()).collect();
        let bounds = [(5, 10), (10, 20), (20, 40), (20, 40), (20, 40)];
        for (got, (lo, hi)) in d.iter().zip(bounds) {
            assert!(
                *got >= Duration::from_millis(lo) && *got <= Duration::from_millis(hi),
                "{got:?} not in [{lo},{hi}]ms"
            );
        }
        b.reset();
        assert!(b.next_delay().unwrap() <= Duration::from_millis(10));

        let mut short = Backoff::with(
            Duration::from_millis(100),
            Duration::from_millis(100),
            Duration::from_millis(10),
        );
        assert!(short.next_delay().is_none());
    }

    #[tokio::test]
    async fn unary_retries_transient_then_succeeds_and_stops_on_final() {
        let cfg = GcsConfig {
            initial_backoff_ms: 1,
            max_backoff_ms: 2,
            ..Default::default()
        };
        let got = unary(&cfg, "x", |attempt| async move {
            if attempt < 3 {
                Err(Status::unavailable("flaky"))
            } else {
                Ok(attempt)
            }
        })
        .await
        .unwrap();
        assert_eq!(got, 3);

        let mut calls = 0;
        let e = unary(&cfg, "gs://b/o", |_| {
            calls += 1;
            async { Err::<(), _>(Status::not_found("gone")) }
        })
        .await
        .unwrap_err();
        assert_eq!(calls, 1);
        assert!(matches!(e, Error::NotFound(_)));
    }

    #[tokio::test]
    async fn unary_gives_up_at_the_deadline_with_unavailable() {
        let cfg = GcsConfig {
            initial_backoff_ms: 5,
            max_backoff_ms: 10,
            retry_deadline_ms: 100,
            ..Default::default()
        };
        let start = std::time::Instant::now();
        let e = unary(&cfg, "gs://b/o", |_| async {
            Err::<(), _>(Status::unavailable("down"))
        })
        .await
        .unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(2));
        assert!(
            matches!(&e, Error::Unavailable(m) if m.contains("gs://b/o") && m.contains("down")),
            "{e}"
        );
    }
}
