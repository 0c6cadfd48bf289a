//! Symbolic links of [`Fs`]: `symlink`, `readlink`, and the answer to `link` (hard links).
//!
//! A link is one object, stored the way gcsfuse 3.9 stores it, so that a bucket written by
//! either is read by the other and by gcloud storage: the object's bytes are the target, and
//! its custom metadata says `goog-reserved-file-is-symlink: true` (the key gcloud storage and
//! Storage Transfer Service use) and `gcsfuse_symlink_target: TARGET` (the key every gcsfuse
//! reads; before 3.9 it wrote only that one, on an empty object). Listings carry the metadata,
//! so a directory's links show as links without a call each; a link whose metadata lacks the
//! target (written by gcloud storage) is read once, at its first `readlink`.
//!
//! Touches the client and the superblock; no kernel types.

use super::dir::ListedEntry;
use super::error::{log_err, Errno, FsResult};
use super::inode::{Kind, ObjMeta};
use super::{names, Entry, Fs};
use crate::gcs::{self, Symlink};
use bytes::Bytes;
use std::sync::Arc;

/// The permission bits of every link, as on Linux: a link's own bits are never checked.
pub(super) const PERM: u16 = 0o777;

/// The longest target: what `readlink` can return (PATH_MAX less its NUL), and gcsfuse's
/// limit too.
const MAX_TARGET: usize = libc::PATH_MAX as usize - 1;

impl Fs {
    /// `symlink(2)`: creates link `name` in `parent` pointing to `target`, durable when this
    /// returns; counts one lookup. EEXIST when the name exists, ENAMETOOLONG for a target
    /// past PATH_MAX.
    pub async fn symlink(&self, parent: u64, name: &str, target: &str) -> FsResult<Entry> {
        self.writable()?;
        Self::check_name(name)?;
        if target.is_empty() {
            return Err(Errno::ENOENT);
        }
        if target.len() > MAX_TARGET {
            return Err(Errno::ENAMETOOLONG);
        }
        let dir = self.dir_inode(parent)?;
        let key = names::file_key(&dir.key(), name);
        Self::check_key(&key)?;
        // A directory of that name would win over the link's object and hide it.
        if self.existing(parent, name).await?.is_some() {
            return Err(Errno(libc::EEXIST));
        }
        let i = &self.inner;
        let data = Bytes::copy_from_slice(target.as_bytes());
        let meta = i
            .client
            .put_object(&i.bucket, &key, data, Symlink::metadata(target), Some(0))
            .await
            .map_err(|e| match e {
                gcs::Error::PreconditionFailed(_) => Errno(libc::EEXIST),
                e => log_err("symlink", &key, &e),
            })?;
        let meta = ObjMeta::from(&meta);
        let target: Arc<str> = Arc::from(target);
        i.sb.created(
            parent,
            ListedEntry {
                name: name.into(),
                kind: Kind::Symlink,
                meta: Some(meta),
                target: Some(target.clone()),
            },
        );
        let inode = i.sb.found(&key, Kind::Symlink, Some(meta));
        inode.set_target(target);
        Ok(self.entry(&inode))
    }

    /// `readlink(2)`: the target of link `ino`; EINVAL when it is not a link.
    pub async fn readlink(&self, ino: u64) -> FsResult<Arc<str>> {
        let inode = self.inode(ino)?;
        if inode.kind != Kind::Symlink {
            return Err(Errno::EINVAL);
        }
        if let Some(target) = inode.target() {
            return Ok(target);
        }
        // Marked by `goog-reserved-file-is-symlink` alone: the object's bytes are the target.
        let key = inode.key();
        let meta = self.inner.sb.fresh_meta(&inode).await?;
        if meta.size > MAX_TARGET as u64 {
            tracing::warn!(
                object = key,
                size = meta.size,
                "a symlink's object is larger than a target may be"
            );
            return Err(Errno::EIO);
        }
        let bytes = self.read_whole(&key, &meta).await?;
        let target: Arc<str> = match std::str::from_utf8(&bytes) {
            Ok(t) => Arc::from(t),
            Err(_) => {
                tracing::warn!(object = key, "a symlink's target is not UTF-8");
                return Err(Errno::EIO);
            }
        };
        inode.set_target(target.clone());
        Ok(target)
    }

    /// The bytes of the generation `meta` describes of small object `key`: one read on a
    /// stream of its own, or, when that fails, on a stream that reconnects.
    async fn read_whole(&self, key: &str, meta: &ObjMeta) -> FsResult<Bytes> {
        let i = &self.inner;
        if meta.size == 0 {
            return Ok(Bytes::new());
        }
        let once = i
            .client
            .read_once(&i.bucket, key, meta.generation, 0, meta.size)
            .await;
        if let Ok(bytes) = once {
            return Ok(bytes);
        }
        let read = async {
            let reader = i
                .client
                .open_reader(&i.bucket, key, Some(meta.generation))
                .await?;
            reader.read(0, meta.size).await
        };
        read.await.map_err(|e| log_err("readlink", key, &e))
    }

    /// The answer to `link(2)`: EPERM, what link(2) answers on a filesystem without hard
    /// links (an object has one name); EROFS on a read-only mount.
    pub fn link_refusal(&self) -> Errno {
        self.writable().err().unwrap_or(Errno(libc::EPERM))
    }
}
