//! Whole-object writes: a local file (a staged copy) or bytes in memory (a symbolic link)
//! stored as a new generation of an object, replacing exactly the generation the caller
//! names.
//!
//! A zonal bucket takes only appendable objects, and an appendable object is live from its
//! first message: written in place, a new version would show truncated until its last byte
//! is in, and a failure would leave it so, with the old version gone. So the bytes go to an
//! appendable object of their own next to the target (`.rapidfs-upload-<random>` in the
//! same folder), which is finalized with its whole-object CRC32C checked, then moved onto
//! the target by `MoveObject`, atomically, under the caller's generation precondition.
//! Until the move the target keeps its old version; a failed write or move deletes the
//! aside object (but see `move_into_place` for a server that refuses to replace an
//! unfinalized object). The appendable writer resumes a broken stream from what the service
//! persisted, and follows redirects.
//! Touches only the two objects of an upload and the file it reads (read only).

use super::writer::{AppendWriter, MAX_CHUNK};
use super::{Client, Error, ObjectMeta, Result};
use bytes::Bytes;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// What an upload sends.
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
    /// a server refuses to replace the unfinalized object that is live, with `None`).
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
        let aside = aside_name(object);
        let written = self.write_aside(bucket, &aside, &source, metadata).await?;
        let meta = self
            .move_into_place(bucket, &aside, object, &written, if_generation_match)
            .await?;
        let crc_differs = matches!((meta.crc32c, written.crc32c), (Some(a), Some(b)) if a != b);
        if meta.size != written.size || crc_differs {
            return Err(Error::Other(format!(
                "{}: moved into place with {} bytes (crc32c {:08x?}), {} were written (crc32c {:08x?})",
                super::object_url(bucket, object),
                meta.size,
                meta.crc32c,
                written.size,
                written.crc32c
            )));
        }
        Ok(meta)
    }

    /// Writes `source` to the new object `aside` and finalizes it; deletes what it created
    /// when that fails. The create has no precondition: the name is random, so what a retry
    /// whose first attempt's answer was lost finds there is that attempt's empty object.
    async fn write_aside(
        &self,
        bucket: &str,
        aside: &str,
        source: &Source,
        metadata: HashMap<String, String>,
    ) -> Result<ObjectMeta> {
        let mut w = AppendWriter::create(self.clone(), bucket, aside, None, metadata).await?;
        let generation = w.generation();
        let written = async {
            let len = source.len();
            let mut offset = 0;
            while offset < len {
                let n = (len - offset).min(MAX_CHUNK as u64) as usize;
                w.append(source.piece(offset, n).await?).await?;
                offset += n as u64;
            }
            w.finalize().await
        }
        .await;
        if written.is_err() {
            self.discard(bucket, aside, generation).await;
        }
        written
    }

    /// A writer of a new appendable object beside `object` (see the module doc), created
    /// without waiting for the service's answer, as `create_appendable_unanswered` does: the
    /// new version of `object` that `move_into_place` puts there once it is written.
    pub fn create_aside_unanswered(&self, bucket: &str, object: &str) -> AppendWriter {
        AppendWriter::create_unanswered(self.clone(), bucket, &aside_name(object))
    }

    /// Moves the written `aside` object onto `object` under `if_generation_match`. A
    /// service may refuse to replace an unfinalized appendable object: where the generation
    /// to replace is that, it is deleted (that generation only) and the move made onto the
    /// free name. The aside object is deleted when the move fails, except after that delete,
    /// when it holds the only copy of the new version.
    pub async fn move_into_place(
        &self,
        bucket: &str,
        aside: &str,
        object: &str,
        written: &ObjectMeta,
        if_generation_match: Option<i64>,
    ) -> Result<ObjectMeta> {
        let e = match self
            .move_object(
                bucket,
                aside,
                object,
                Some(written.into()),
                if_generation_match,
            )
            .await
        {
            Ok(m) => return Ok(m),
            Err(e) => e,
        };
        let replaceable = match (&e, if_generation_match) {
            (Error::PreconditionFailed(_), Some(g)) if g > 0 => {
                self.live_unfinalized(bucket, object, g).await
            }
            _ => false,
        };
        if !replaceable {
            self.discard(bucket, aside, written.generation).await;
            return Err(e);
        }
        tracing::debug!(
            object,
            aside,
            "service refuses to replace an unfinalized object: delete it, then move"
        );
        // Should the move after the delete fail, the aside object is the only copy of the new
        // version: finalized first, it is kept by the cleanups of aside objects (`rmdir`,
        // `rapidfs unfinalized --delete-leftovers`), which take appendable ones for the
        // leftovers of an interrupted upload.
        if !written.finalized {
            let finalized = match self
                .open_appendable(bucket, aside, written.generation)
                .await
            {
                Ok(w) => w.finalize().await.map(|_| ()),
                Err(e) => Err(e),
            };
            if let Err(e) = finalized {
                self.discard(bucket, aside, written.generation).await;
                return Err(e);
            }
        }
        if let Err(e) = self
            .delete_object(bucket, object, if_generation_match)
            .await
        {
            self.discard(bucket, aside, written.generation).await;
            return Err(match e {
                Error::NotFound(why) => Error::PreconditionFailed(why),
                e => e,
            });
        }
        self.move_object(bucket, aside, object, Some(written.into()), Some(0))
            .await
            .map_err(|e| {
                tracing::error!(object, saved_as = aside, error = %e, "the new version could not be moved into place; it is kept under the aside name");
                // Not a precondition failure to the caller: the version it replaced is gone.
                Error::Other(format!(
                    "{}: the old version was deleted, the new one is kept as {aside}: {e}",
                    super::object_url(bucket, object)
                ))
            })
    }

    /// Whether the live object is generation `generation`, unfinalized.
    async fn live_unfinalized(&self, bucket: &str, object: &str, generation: i64) -> bool {
        self.get_object(bucket, object)
            .await
            .is_ok_and(|live| live.generation == generation && !live.finalized)
    }

    /// Deletes generation `generation` of the aside object `aside`, if it is still there
    /// (whatever is there when the generation is unknown, 0: the name is random, ours).
    pub async fn discard(&self, bucket: &str, aside: &str, generation: i64) {
        let generation = (generation > 0).then_some(generation);
        match self.delete_object(bucket, aside, generation).await {
            Ok(()) | Err(Error::NotFound(_)) => {}
            Err(e) => {
                tracing::warn!(object = aside, error = %e, "an unused upload object could not be deleted")
            }
        }
    }
}

/// How the last segment of an aside object's name begins; 16 hex digits follow.
const ASIDE_PREFIX: &str = ".rapidfs-upload-";

/// A new name for the bytes of an upload to `object`, in its folder.
fn aside_name(object: &str) -> String {
    let folder = object.rfind('/').map_or("", |i| &object[..=i]);
    format!("{folder}{ASIDE_PREFIX}{:016x}", rand::random::<u64>())
}

/// True when `name`, one segment of an object name, is that of an upload's aside object:
/// bytes on their way to another name, or left by an upload that never finished.
pub fn is_aside_name(name: &str) -> bool {
    name.strip_prefix(ASIDE_PREFIX)
        .is_some_and(|n| n.len() == 16 && n.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}
