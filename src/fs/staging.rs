//! The staging area: local files holding whole new versions of files that cannot be written
//! as appends (a write before the end, a truncation, O_TRUNC of an existing object, an
//! append to a finalized object). A staged file is filled from the object's current version
//! (streamed, never held in memory), edited in place, and uploaded as a new generation on
//! fsync or close (`gcs::Client::upload_file`).
//!
//! The directory comes from `write.staging_dir` and is created mode 0700 at first use; each
//! staged file is unlinked as soon as it is created, so nothing is left behind by a crash,
//! and named by the process and a process-wide count, so that no two mounts collide on a
//! name (the GKE sidecar serves several in one process; a name taken anyway is skipped). Every staged file counts its largest size against one
//! limit (`write.staging_limit_mb`, holes included, so the limit also bounds the disk it may
//! take); a write that would pass it fails with ENOSPC.
//!
//! Touches only files in its directory and the object it fills from (read only).

use super::error::{log_err, Errno, FsResult};
use crate::config::WriteConfig;
use crate::gcs::Client;
use bytes::Bytes;
use futures::StreamExt;
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The number in the next staged file's name, for every staging area of the process.
static NEXT_NAME: AtomicU64 = AtomicU64::new(0);

/// Out of staging space.
pub const ENOSPC: Errno = Errno(libc::ENOSPC);

/// The staging area of one mount.
pub struct Staging {
    shared: Arc<Shared>,
}

struct Shared {
    dir: PathBuf,
    limit: u64,
    /// Bytes of the limit held by live staged files.
    used: Mutex<u64>,
    /// Created at first use (so a mount that never stages never touches the disk).
    ready: OnceLock<Result<(), String>>,
}

/// The default staging directory: `$XDG_CACHE_HOME/rapidfs/staging`, else
/// `/var/tmp/rapidfs-UID/staging` (/var/tmp: meant for large files, not a RAM-backed /tmp).
fn default_dir() -> PathBuf {
    match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d).join("rapidfs").join("staging"),
        None => {
            // SAFETY: getuid cannot fail and touches no memory.
            let uid = unsafe { libc::getuid() };
            PathBuf::from(format!("/var/tmp/rapidfs-{uid}/staging"))
        }
    }
}

impl Staging {
    /// The staging area `cfg` describes; nothing is created yet.
    pub fn new(cfg: &WriteConfig) -> Staging {
        let dir = if cfg.staging_dir.is_empty() {
            default_dir()
        } else {
            PathBuf::from(&cfg.staging_dir)
        };
        Staging {
            shared: Arc::new(Shared {
                dir,
                limit: cfg.staging_limit_mb.saturating_mul(1024 * 1024),
                used: Mutex::new(0),
                ready: OnceLock::new(),
            }),
        }
    }

    /// A new empty staged file.
    pub fn create(&self) -> FsResult<StagedFile> {
        let s = &self.shared;
        let ready = s.ready.get_or_init(|| {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&s.dir)
                .map_err(|e| e.to_string())
        });
        if let Err(e) = ready {
            tracing::error!(dir = %s.dir.display(), error = %e, "cannot create the staging directory");
            return Err(Errno::EIO);
        }
        let file = loop {
            let n = NEXT_NAME.fetch_add(1, Ordering::Relaxed);
            let path = s.dir.join(format!("stage-{}-{n}", std::process::id()));
            let created = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .and_then(|f| std::fs::remove_file(&path).map(|()| f));
            match created {
                Ok(f) => break f,
                // Left by a crashed process of the same id between its create and unlink.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "cannot create a staging file");
                    return Err(Errno::EIO);
                }
            }
        };
        Ok(StagedFile {
            file: Arc::new(file),
            size: 0,
            held: 0,
            shared: s.clone(),
        })
    }
}

/// One staged file: its bytes on local disk, its logical size, its share of the limit.
pub struct StagedFile {
    file: Arc<File>,
    size: u64,
    held: u64,
    shared: Arc<Shared>,
}

impl StagedFile {
    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The open file, for the upload to read.
    pub fn file(&self) -> Arc<File> {
        self.file.clone()
    }

    /// Takes limit for a size of `size` bytes; ENOSPC (one log line) when it does not fit.
    fn reserve(&mut self, size: u64, path: &str) -> FsResult<()> {
        if size <= self.held {
            return Ok(());
        }
        let s = &self.shared;
        let mut used = s.used.lock().unwrap_or_else(|p| p.into_inner());
        let more = size - self.held;
        if *used + more > s.limit {
            tracing::error!(
                path,
                size,
                staged_elsewhere = *used - self.held,
                limit_mb = s.limit / (1024 * 1024),
                "staging area full (write.staging_limit_mb): the write fails with ENOSPC and the object is left as it was"
            );
            return Err(ENOSPC);
        }
        *used += more;
        self.held = size;
        Ok(())
    }

    /// Gives back limit beyond `size` bytes.
    fn shrink(&mut self, size: u64) {
        if size < self.held {
            let mut used = self.shared.used.lock().unwrap_or_else(|p| p.into_inner());
            *used = used.saturating_sub(self.held - size);
            self.held = size;
        }
    }

    /// Writes `data` at `offset` (growing the file as needed).
    pub async fn write_at(&mut self, offset: u64, data: Bytes, path: &str) -> FsResult<()> {
        let end = offset + data.len() as u64;
        self.reserve(end, path)?;
        let f = self.file.clone();
        let written = tokio::task::spawn_blocking(move || f.write_all_at(&data, offset)).await;
        match written {
            Ok(Ok(())) => {
                self.size = self.size.max(end);
                Ok(())
            }
            Ok(Err(e)) => Err(local_err(path, &e)),
            Err(e) => {
                tracing::error!(path, error = %e, "staging write task failed");
                Err(Errno::EIO)
            }
        }
    }

    /// Cuts or extends (with zeros) the file to `size` bytes.
    pub async fn set_len(&mut self, size: u64, path: &str) -> FsResult<()> {
        self.reserve(size, path)?;
        let f = self.file.clone();
        match tokio::task::spawn_blocking(move || f.set_len(size)).await {
            Ok(Ok(())) => {
                self.size = size;
                self.shrink(size);
                Ok(())
            }
            Ok(Err(e)) => Err(local_err(path, &e)),
            Err(_) => Err(Errno::EIO),
        }
    }

    /// Up to `len` bytes at `offset` (fewer at the end of the file).
    pub async fn read_at(&self, offset: u64, len: u64) -> FsResult<Bytes> {
        let len = len.min(self.size.saturating_sub(offset)) as usize;
        if len == 0 {
            return Ok(Bytes::new());
        }
        let f = self.file.clone();
        let read = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; len];
            f.read_exact_at(&mut buf, offset).map(|()| Bytes::from(buf))
        })
        .await;
        match read {
            Ok(Ok(b)) => Ok(b),
            Ok(Err(e)) => Err(local_err("staged file", &e)),
            Err(_) => Err(Errno::EIO),
        }
    }

    /// Fills the file with generation `generation` of `key`, up to `upto` bytes (all of it
    /// when `None`), streamed chunk by chunk. The object's size is the one its read stream
    /// reports: a stat of an unfinalized object can lag behind its appends, its read stream
    /// serves them all. The generation must still exist (ESTALE otherwise).
    pub async fn fill(
        &mut self,
        client: &Client,
        bucket: &str,
        key: &str,
        generation: i64,
        upto: Option<u64>,
    ) -> FsResult<()> {
        if upto == Some(0) {
            return Ok(());
        }
        let reader = client
            .open_reader(bucket, key, Some(generation))
            .await
            .map_err(|e| match e {
                crate::gcs::Error::NotFound(_) => Errno::ESTALE,
                e => log_err("stage", key, &e),
            })?;
        let size = reader.metadata().size;
        let len = upto.map_or(size, |upto| upto.min(size));
        self.reserve(len, key)?;
        let mut chunks = Box::pin(reader.read_stream(0, len));
        let mut offset = 0u64;
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| log_err("stage", key, &e))?;
            let n = chunk.len() as u64;
            self.write_at(offset, chunk, key).await?;
            offset += n;
        }
        if offset != len {
            tracing::warn!(
                path = key,
                got = offset,
                want = len,
                "object shorter than expected while staging"
            );
            return Err(Errno::ESTALE);
        }
        Ok(())
    }
}

fn local_err(path: &str, e: &std::io::Error) -> Errno {
    let code = e.raw_os_error().unwrap_or(libc::EIO);
    tracing::error!(path, error = %e, "staging file I/O failed");
    // A full local disk is the same condition as a full staging area for the caller.
    Errno(if code == libc::ENOSPC {
        libc::ENOSPC
    } else {
        libc::EIO
    })
}

impl Drop for StagedFile {
    fn drop(&mut self) {
        self.shrink(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_staging_areas_of_one_process_never_collide_on_a_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = WriteConfig {
            staging_dir: dir.path().to_string_lossy().into_owned(),
            ..WriteConfig::default()
        };
        // Names another area of this process could hold at this moment (between its
        // create and its unlink), or a crashed process of the same id left behind.
        for n in 0..16 {
            let taken = dir.path().join(format!("stage-{}-{n}", std::process::id()));
            std::fs::write(taken, b"").expect("leftover");
        }
        let (a, b) = (Staging::new(&cfg), Staging::new(&cfg));
        for area in [&a, &b, &a, &b] {
            area.create().expect("a staged file");
        }
    }
}
