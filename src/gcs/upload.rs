//! Whole-object uploads of a local file (a staged file) or of bytes in memory (a symbolic
//! link) as a new generation: one `BidiWriteObject` stream with a plain (non-appendable)
//! `WriteObjectSpec` (custom metadata in its resource), data in CRC32C-checked chunks of
//! 2 MiB (a multiple of 256 KiB, as non-appendable uploads require), the whole-object CRC32C
//! on the `finish_write` message, and the final resource checked against what was sent.
//!
//! Why not an appendable object: an appendable object is live from its first message, so
//! replacing a file that way would show a truncated object until the upload ends, and leave
//! one behind if it failed. A plain upload becomes live only when it finishes, atomically, and
//! a generation precondition makes sure it replaces exactly the version the caller read.
//! A broken stream leaves nothing behind, so a retry starts over from the first byte; a
//! redirect's routing token goes with every later attempt.
//! Touches only its own stream and the file it is given (read only).

use super::retry::{self, Backoff};
use super::stream::{self, Requests};
use super::writer::{Fail, MAX_CHUNK, REDIRECT_TYPE};
use super::{object_url, Client, Error, ObjectMeta, Result};
use crate::proto::storage::{
    bidi_write_object_request::{Data, FirstMessage},
    bidi_write_object_response::WriteStatus,
    BidiWriteObjectRedirectedError, BidiWriteObjectRequest, ChecksummedData, ObjectChecksums,
    WriteObjectSpec,
};
use bytes::Bytes;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tonic::Status;

/// What an upload sends.
#[derive(Clone)]
enum Source {
    /// The first bytes (this many) of a local file.
    File(Arc<File>, u64),
    /// Bytes in memory.
    Bytes(Bytes),
}

impl Source {
    fn len(&self) -> u64 {
        match self {
            Source::File(_, len) => *len,
            Source::Bytes(b) => b.len() as u64,
        }
    }

    /// The `n` bytes at `offset`.
    async fn piece(&self, offset: u64, n: usize) -> Result<Bytes> {
        let f = match self {
            Source::Bytes(b) => return Ok(b.slice(offset as usize..offset as usize + n)),
            Source::File(f, _) => f.clone(),
        };
        tokio::task::spawn_blocking(move || -> std::io::Result<Bytes> {
            let mut buf = vec![0u8; n];
            f.read_exact_at(&mut buf, offset)?;
            Ok(Bytes::from(buf))
        })
        .await
        .map_err(|e| Error::Other(format!("staged file read failed: {e}")))?
        .map_err(|e| Error::Other(format!("staged file read failed: {e}")))
    }
}

impl Client {
    /// Uploads the first `len` bytes of `file` as a new finalized generation of `object`.
    /// `if_generation_match`: `Some(g)` replaces only generation `g`, `Some(0)` only creates,
    /// `None` replaces whatever is live. `PreconditionFailed` when the precondition fails (or
    /// the service refuses to replace the live object).
    pub async fn upload_file(
        &self,
        bucket: &str,
        object: &str,
        file: Arc<File>,
        len: u64,
        if_generation_match: Option<i64>,
    ) -> Result<ObjectMeta> {
        let source = Source::File(file, len);
        self.upload(bucket, object, source, HashMap::new(), if_generation_match)
            .await
    }

    /// Stores `data` with custom `metadata` as a new finalized generation of `object`, durable
    /// when this returns; `if_generation_match` as for `upload_file`.
    pub async fn put_object(
        &self,
        bucket: &str,
        object: &str,
        data: Bytes,
        metadata: HashMap<String, String>,
        if_generation_match: Option<i64>,
    ) -> Result<ObjectMeta> {
        let source = Source::Bytes(data);
        self.upload(bucket, object, source, metadata, if_generation_match)
            .await
    }

    async fn upload(
        &self,
        bucket: &str,
        object: &str,
        source: Source,
        metadata: HashMap<String, String>,
        if_generation_match: Option<i64>,
    ) -> Result<ObjectMeta> {
        let what = object_url(bucket, object);
        let mut backoff = Backoff::new(self.config());
        // A redirect names where the upload goes: its routing token rides on every later
        // attempt, as the appendable writer's does.
        let mut routing_token = None;
        loop {
            let attempt = self.try_upload(
                bucket,
                object,
                &source,
                &metadata,
                if_generation_match,
                routing_token.as_deref(),
            );
            let s = match attempt.await {
                Ok(meta) => return Ok(meta),
                Err(Fail::Fatal(e)) => return Err(e),
                Err(Fail::Stream(s)) => s,
            };
            let redirect =
                retry::redirect_detail::<BidiWriteObjectRedirectedError>(&s, REDIRECT_TYPE);
            if let Some(token) = redirect.as_ref().and_then(|r| r.routing_token.clone()) {
                routing_token = Some(token);
            }
            retry::retry_after(&mut backoff, &s, redirect.is_some(), &what).await?;
            tracing::debug!(object = %what, code = ?s.code(), msg = s.message(), "upload restarts");
        }
    }

    async fn try_upload(
        &self,
        bucket: &str,
        object: &str,
        source: &Source,
        metadata: &HashMap<String, String>,
        if_generation_match: Option<i64>,
        routing_token: Option<&str>,
    ) -> std::result::Result<ObjectMeta, Fail> {
        let what = object_url(bucket, object);
        let len = source.len();
        let spec = WriteObjectSpec {
            object_size: i64::try_from(len).ok(),
            ..super::write_spec(bucket, object, if_generation_match, metadata.clone())
        };
        let first = BidiWriteObjectRequest {
            first_message: Some(FirstMessage::WriteObjectSpec(spec)),
            write_offset: 0,
            ..Default::default()
        };
        let cfg = self.config();
        let opened = tokio::time::timeout(
            Duration::from_millis(cfg.call_timeout_ms),
            stream::write(self.streams(), bucket, routing_token, &first),
        );
        let (tx, mut rx) = match opened.await {
            Ok(r) => r?,
            Err(_) => return Err(Status::deadline_exceeded("upload stream open timed out").into()),
        };
        let queued = Arc::new(AtomicU64::new(0));
        let producer = tokio::spawn(send(source.clone(), tx, queued.clone()));
        let wait = Duration::from_millis(cfg.call_timeout_ms + cfg.stall_timeout_ms);
        // The service answers once the last byte is in, however long the bytes take: only a
        // wait in which no byte was queued either is a stall.
        let answered = async {
            let mut seen = 0;
            loop {
                match tokio::time::timeout(wait, rx.message()).await {
                    Err(_) if queued.load(Ordering::Relaxed) != seen => {
                        seen = queued.load(Ordering::Relaxed);
                    }
                    Err(_) => return Err(Status::deadline_exceeded("upload: no answer")),
                    Ok(Ok(Some(r))) => {
                        if let Some(WriteStatus::Resource(o)) = r.write_status {
                            return Ok(o);
                        }
                    }
                    Ok(Ok(None)) => {
                        return Err(Status::unavailable("upload stream ended unfinished"))
                    }
                    Ok(Err(s)) => return Err(s),
                }
            }
        };
        let o = match answered.await {
            Ok(o) => o,
            Err(s) => {
                // The producer may wait for room that a stalled stream never gives. A local
                // read error that ended it first is ours: retrying will not help.
                producer.abort();
                if let Ok(Err(e)) = producer.await {
                    return Err(Fail::Fatal(e));
                }
                return Err(s.into());
            }
        };
        let crc = match producer.await {
            Ok(Ok(crc)) => crc,
            Ok(Err(e)) => return Err(Fail::Fatal(e)),
            Err(e) => {
                return Err(Fail::Fatal(Error::Other(format!(
                    "{what}: upload reader failed: {e}"
                ))))
            }
        };
        let meta = ObjectMeta::from(&o);
        if meta.size != len {
            return Err(Fail::Fatal(Error::Other(format!(
                "{what}: uploaded {len} bytes, the object has {}",
                meta.size
            ))));
        }
        if meta.crc32c.is_some_and(|c| c != crc) {
            return Err(Fail::Fatal(Error::Checksum(format!(
                "{what}: object crc32c {:08x}, we sent {crc:08x}",
                meta.crc32c.unwrap_or_default()
            ))));
        }
        Ok(meta)
    }
}

/// Sends the bytes of `source` as data messages, the last one with `finish_write` and the
/// whole-object CRC32C, counting in `queued` the bytes handed to the stream; returns that
/// CRC32C. Stops quietly when the stream goes away (the call reports why).
async fn send(
    source: Source,
    mut tx: Requests<BidiWriteObjectRequest>,
    queued: Arc<AtomicU64>,
) -> Result<u32> {
    let len = source.len();
    let mut crc = 0u32;
    let mut offset = 0u64;
    loop {
        let n = (len - offset).min(MAX_CHUNK as u64) as usize;
        let piece = source.piece(offset, n).await?;
        // Each byte's CRC is computed once: the piece's, folded into the object's.
        let piece_crc = super::crc32c(&piece);
        crc = super::crc32c_concat(crc, offset, piece_crc, piece.len());
        let last = offset + n as u64 == len;
        let msg = BidiWriteObjectRequest {
            write_offset: offset as i64,
            data: (!piece.is_empty()).then(|| {
                Data::ChecksummedData(ChecksummedData {
                    crc32c: Some(piece_crc),
                    content: piece,
                })
            }),
            finish_write: last,
            object_checksums: last.then_some(ObjectChecksums {
                crc32c: Some(crc),
                md5_hash: Bytes::new(),
            }),
            ..Default::default()
        };
        if tx.ready().await.is_err() || tx.send_write(msg, last).is_err() {
            return Ok(crc);
        }
        offset += n as u64;
        queued.store(offset, Ordering::Relaxed);
        if last {
            return Ok(crc);
        }
    }
}
