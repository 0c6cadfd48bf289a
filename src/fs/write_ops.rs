//! The writing operations of [`Fs`]: create, open for writing, write, flush/fsync, size
//! changes and the end of a writing handle. The writer state machine lives in `write.rs`;
//! this file only ties it to inodes, handles and the metadata caches.

use super::error::{log_err, Errno, FsResult};
use super::inode::{Kind, ObjMeta};
use super::write::EOPNOTSUPP;
use super::{lock, names, Attr, Entry, Fs, Opened};
use bytes::Bytes;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

impl Fs {
    fn writable(&self) -> FsResult<()> {
        if self.inner.read_only {
            return Err(Errno::EROFS);
        }
        Ok(())
    }

    /// Creates file `name` in directory `parent` as a new appendable object and opens it for
    /// writing (one write stream from here to the last release); counts one lookup.
    pub async fn create(&self, parent: u64, name: &str, flags: i32) -> FsResult<(Entry, Opened)> {
        self.writable()?;
        let dir = self.dir_inode(parent)?;
        if name.len() > names::NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if !names::is_visible(name) {
            return Err(Errno::EINVAL);
        }
        let i = &self.inner;
        let key = names::file_key(&dir.key, name);
        let exclusive = flags & libc::O_EXCL != 0;
        let w = i
            .client
            .create_appendable(&i.bucket, &key, exclusive.then_some(0))
            .await
            .map_err(|e| match e {
                crate::gcs::Error::PreconditionFailed(_) if exclusive => Errno(libc::EEXIST),
                e => log_err("create", &key, &e),
            })?;
        if let Some(c) = &i.negative {
            c.invalidate(&(parent, name.to_string()));
        }
        if let Some(c) = &i.listings {
            c.invalidate(&parent);
        }
        let now = SystemTime::now();
        let meta = ObjMeta {
            generation: w.generation(),
            size: 0,
            mtime: now,
            crtime: now,
        };
        let inode = i.inodes.lookup(&key, Kind::File, Some(meta));
        inode.note_open(meta.identity());
        let fh = i.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&i.files).insert(fh, Arc::new(i.reads.open(&key, &meta)));
        i.writes.attach_created(fh, &inode, w);
        Ok((
            self.entry(&inode),
            Opened {
                fh,
                keep_cache: false,
            },
        ))
    }

    /// Opens an existing file for writing (and reading): writes may only append at its end;
    /// the object is taken over at the first write.
    pub async fn open_write(&self, ino: u64) -> FsResult<Opened> {
        self.writable()?;
        let opened = self.open(ino, false).await?;
        let inode = self.inode(ino)?;
        let Some(meta) = inode.meta().0 else {
            return Err(Errno::EIO);
        };
        self.inner
            .writes
            .attach_existing(opened.fh, &inode, meta.generation, meta.size);
        Ok(Opened {
            fh: opened.fh,
            keep_cache: false,
        })
    }

    /// Writes `data` at `offset` of handle `fh`: a sequential append, else EOPNOTSUPP.
    pub async fn write(&self, fh: u64, offset: u64, data: Bytes) -> FsResult<u32> {
        self.writable()?;
        self.inner.writes.write(fh, offset, data).await
    }

    /// `close(2)` and `fsync(2)`: returns once the service persisted every byte written.
    pub async fn flush(&self, fh: u64) -> FsResult<()> {
        self.inner.writes.flush(fh).await
    }

    /// Ends handle `fh`: its read side at once, its write stream when it was the last.
    pub async fn release_write(&self, fh: u64) {
        self.release(fh);
        let wrote = self.inner.writes.release(fh).await;
        // Listings taken while the file grew hold an old size.
        if let (true, Some(c)) = (wrote, &self.inner.listings) {
            c.invalidate_all();
        }
    }

    /// `setattr`: a size change other than to the current size is not supported; mode,
    /// owner and times are fixed by the mount and silently kept.
    pub async fn setattr(&self, ino: u64, size: Option<u64>) -> FsResult<Attr> {
        let attr = self.getattr(ino).await?;
        if let Some(size) = size {
            self.writable()?;
            if size != attr.size {
                let key = self.inode(ino).map(|i| i.key.clone()).unwrap_or_default();
                tracing::warn!(
                    path = %key,
                    from = attr.size,
                    to = size,
                    "truncate not supported: files can only grow by appends"
                );
                return Err(EOPNOTSUPP);
            }
        }
        Ok(attr)
    }

    /// `access(2)` for writing: refused on a read-only mount.
    pub fn may_write(&self) -> FsResult<()> {
        self.writable()
    }
}
