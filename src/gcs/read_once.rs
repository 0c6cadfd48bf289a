//! One range of one generation, read on a `BidiReadObject` stream of its own that asks for it
//! in its first message and is dropped as soon as the range is complete: the cheapest way to
//! fetch a small file whole. The caller's task drives the stream itself: no background task,
//! no channels, no read handle kept. It does not reconnect: any failure (a redirect, a cut, a
//! bad chunk) is returned, and the caller falls back to a `BidiReader`, which handles them.
//! Every chunk passes the same checks as on a `BidiReader` (CRC32C, offset, bounds).

use super::ranges::{joined, joined_to_keep, BadChunk, RangeTable};
use super::{bucket_path, object_url, retry, stream, Client, Error, Result};
use crate::proto::storage::{BidiReadObjectRequest, BidiReadObjectSpec, ReadRange};
use bytes::Bytes;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

impl Client {
    /// The bytes `[offset, offset + len)` of `object` at `generation`, which must lie inside
    /// the object; fewer is an error. They may be a slice of the buffer they were received
    /// in: for a caller that uses them and lets them go.
    pub async fn read_once(
        &self,
        bucket: &str,
        object: &str,
        generation: i64,
        offset: u64,
        len: u64,
    ) -> Result<Bytes> {
        let (parts, got) = self
            .read_once_parts(bucket, object, generation, offset, len)
            .await?;
        Ok(joined(parts, got))
    }

    /// As `read_once`, for a caller that keeps the bytes (a cache): a small result is copied
    /// out of its receive buffer rather than keep all of that alive.
    pub async fn read_once_to_keep(
        &self,
        bucket: &str,
        object: &str,
        generation: i64,
        offset: u64,
        len: u64,
    ) -> Result<Bytes> {
        let (parts, got) = self
            .read_once_parts(bucket, object, generation, offset, len)
            .await?;
        Ok(joined_to_keep(parts, got))
    }

    /// The range's chunks as they arrived, and their total length.
    async fn read_once_parts(
        &self,
        bucket: &str,
        object: &str,
        generation: i64,
        offset: u64,
        len: u64,
    ) -> Result<(Vec<Bytes>, usize)> {
        // A read_length of 0 asks the server for everything to the object's end.
        if len == 0 {
            return Ok((Vec::new(), 0));
        }
        let what = object_url(bucket, object);
        let (tx, mut chunks) = mpsc::unbounded_channel();
        let mut ranges = RangeTable::new(Arc::new(AtomicUsize::new(1)));
        let read_id = ranges.insert(offset, len, tx);
        let first = BidiReadObjectRequest {
            read_object_spec: Some(BidiReadObjectSpec {
                bucket: bucket_path(bucket),
                object: object.to_string(),
                generation,
                ..Default::default()
            }),
            read_ranges: vec![ReadRange {
                read_offset: offset as i64,
                read_length: len as i64,
                read_id,
            }],
        };
        // The request side stays open while the range is read (a half-close could end the
        // ranges still being served) and ends with `_requests`, when this call returns.
        let opening = stream::read(self.streams(), bucket, None, &first);
        let timeout = Duration::from_millis(self.config().call_timeout_ms);
        let stall = Duration::from_millis(self.config().stall_timeout_ms.max(1));
        let (_requests, mut responses) = match tokio::time::timeout(timeout, opening).await {
            Ok(Ok(opened)) => opened,
            Ok(Err(s)) => return Err(retry::map_status(&s, &what)),
            Err(_) => return Err(Error::Unavailable(format!("{what}: stream open timed out"))),
        };
        crate::metrics::stream("read", crate::metrics::StreamEvent::Opened);
        while !ranges.is_empty() {
            let resp = match tokio::time::timeout(stall, responses.message()).await {
                Ok(Ok(Some(resp))) => resp,
                Ok(Ok(None)) => {
                    return Err(Error::Unavailable(format!(
                        "{what}: the stream ended before the range did"
                    )))
                }
                Ok(Err(s)) => return Err(retry::map_status(&s, &what)),
                Err(_) => return Err(Error::Unavailable(format!("{what}: stream stalled"))),
            };
            if let Some(m) = &resp.metadata {
                if m.generation != generation {
                    return Err(Error::Unavailable(format!(
                        "{what}: generation {} served for {generation}",
                        m.generation
                    )));
                }
            }
            for d in resp.object_data_ranges {
                ranges
                    .on_chunk(d)
                    .map_err(|BadChunk(m)| Error::Unavailable(format!("{what}: {m}")))?;
            }
        }
        let mut parts = Vec::new();
        while let Ok(part) = chunks.try_recv() {
            parts.push(part?);
        }
        let got: usize = parts.iter().map(Bytes::len).sum();
        if got as u64 != len {
            return Err(Error::Unavailable(format!(
                "{what}: range [{offset}, {}) ended after {got} bytes",
                offset + len
            )));
        }
        Ok((parts, got))
    }
}
