//! A per-object pool of `BidiReadObject` streams, pinned to one generation and shared by all
//! handles that opened that generation.
//!
//! The pool starts with one stream, opened at the first read with that read's range in its
//! first message (one round trip for a cold small file), and grows (up to a size-based
//! limit) only when every stream already has several ranges outstanding. Broken streams are
//! dropped and replaced on the next read. A large object's pool outlives its handles for a
//! while (see `read.rs`), so reopening the file finds its streams warm.

use crate::gcs::{self, BidiReader, Client};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A stream with this many ranges outstanding is busy enough to justify another stream.
const BUSY_RANGES: usize = 4;

/// The streams of one (object, generation).
pub struct StreamPool {
    client: Client,
    bucket: Arc<str>,
    key: String,
    generation: i64,
    max_streams: usize,
    readers: tokio::sync::Mutex<Vec<BidiReader>>,
    growing: AtomicBool,
}

impl StreamPool {
    /// An empty pool; no stream is opened until the first read.
    pub fn new(
        client: Client,
        bucket: Arc<str>,
        key: String,
        generation: i64,
        max_streams: usize,
    ) -> Self {
        StreamPool {
            client,
            bucket,
            key,
            generation,
            max_streams: max_streams.max(1),
            readers: tokio::sync::Mutex::new(Vec::new()),
            growing: AtomicBool::new(false),
        }
    }

    /// The least loaded healthy stream that reaches byte `end`, opening one if needed.
    async fn reader(self: &Arc<Self>, end: u64) -> gcs::Result<BidiReader> {
        let mut readers = self.readers.lock().await;
        // A stream sees the object as it was at its open: an appendable object that has grown
        // since needs a new one.
        readers.retain(|r| !r.is_broken() && r.metadata().size >= end);
        let Some(best) = readers.iter().min_by_key(|r| r.in_flight()).cloned() else {
            let r = self
                .client
                .open_reader(&self.bucket, &self.key, Some(self.generation))
                .await?;
            readers.push(r.clone());
            return Ok(r);
        };
        if best.in_flight() >= BUSY_RANGES
            && readers.len() < self.max_streams
            && !self.growing.swap(true, Ordering::AcqRel)
        {
            // Grow in the background: this read goes on the existing stream right away.
            let pool = self.clone();
            tokio::spawn(async move {
                match pool
                    .client
                    .open_reader(&pool.bucket, &pool.key, Some(pool.generation))
                    .await
                {
                    Ok(r) => pool.readers.lock().await.push(r),
                    Err(e) => {
                        tracing::debug!(key = %pool.key, error = %e, "extra stream not opened")
                    }
                }
                pool.growing.store(false, Ordering::Release);
            });
        }
        Ok(best)
    }

    /// Reads `[offset, offset + len)` (the caller clips it to the object), retrying once on a
    /// fresh stream if the one used broke for good. Fewer bytes than asked is an error: a
    /// reader must never see a silently shortened file.
    pub async fn read(self: &Arc<Self>, offset: u64, len: u64) -> gcs::Result<bytes::Bytes> {
        let data = match self.cold_read(offset, len).await? {
            Some(pending) => pending.bytes().await?,
            None => self.warm_read(offset, len).await?,
        };
        if data.len() as u64 != len {
            return Err(gcs::Error::Other(format!(
                "short read of {}: {} of {len} bytes at {offset}",
                self.key,
                data.len()
            )));
        }
        Ok(data)
    }

    /// When the pool has no usable stream, opens one whose first message already asks for
    /// `[offset, offset + len)`: a cold small file costs one round trip, not two.
    async fn cold_read(
        self: &Arc<Self>,
        offset: u64,
        len: u64,
    ) -> gcs::Result<Option<gcs::PendingRead>> {
        let mut readers = self.readers.lock().await;
        readers.retain(|r| !r.is_broken() && r.metadata().size >= offset + len);
        if !readers.is_empty() {
            return Ok(None);
        }
        let (r, pending) = self
            .client
            .open_reader_reading(&self.bucket, &self.key, Some(self.generation), offset, len)
            .await?;
        readers.push(r);
        Ok(Some(pending))
    }

    /// A read on the least loaded open stream, retried once on a fresh one if it broke.
    async fn warm_read(self: &Arc<Self>, offset: u64, len: u64) -> gcs::Result<bytes::Bytes> {
        let end = offset + len;
        let r = self.reader(end).await?;
        let data = match r.read(offset, len).await {
            Ok(d) => d,
            Err(e) if r.is_broken() => {
                tracing::debug!(key = %self.key, error = %e, "stream broke; retrying on a new one");
                self.reader(end).await?.read(offset, len).await?
            }
            Err(e) => return Err(e),
        };
        Ok(data)
    }
}
