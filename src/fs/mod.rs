//! Filesystem semantics over `gcs`: inodes, directories, readers with read-ahead, errors to
//! errno. Never names fuser: `fuse/` translates kernel requests into calls on [`Fs`] and its
//! answers back.
//!
//! [`Fs`] holds three parts and the operations over them: the superblock (`superblock.rs`:
//! inodes, listings, negative entries, their TTLs; lookups; change events), the handle table
//! (`handles.rs`: each open handle's read side, writer or directory cursor), and the data
//! paths (`read.rs`, `write.rs`). Metadata caches, each with its TTL from `[fs]`: file
//! metadata on the inode (`stat_ttl_ms`), whole directory listings (`list_ttl_ms`, also
//! answering lookups in a listed directory), and names found missing (`negative_ttl_ms`). The
//! kernel's own entry and attribute caches get `kernel_entry_ttl_ms` and
//! `kernel_attr_ttl_ms`.

mod counters;
mod dir;
mod dir_changes;
mod error;
mod handles;
mod inode;
mod inode_alloc;
mod list_parallel;
mod listing;
mod names;
mod namespace;
mod pool;
mod prefetch;
mod read;
mod readdir;
mod reclaim;
mod removed_names;
mod seq;
mod staging;
mod superblock;
mod symlink;
mod unanswered;
mod warmup;
mod write;
mod write_budget;
mod write_ops;

pub use error::{Errno, FsResult};
pub use inode::{Kind, ROOT_INO};
pub use prefetch::{PrefetchStats, Progress};
pub use readdir::DirItem;
pub use superblock::MetadataUsage;
pub use warmup::WarmUp;
pub use write_ops::{Closer, Mtime, SetAttr};

use crate::config::Config;
use crate::gcs::{self, Client};
use bytes::Bytes;
use inode::{Inode, ObjMeta};
use list_parallel::list_request;
use read::{Handle as ReadSide, ReadPath};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// Size of a block as reported to `stat` (and the I/O size tools pick from it).
const BLKSIZE: u32 = 1024 * 1024;
/// Block size, size and free space reported to `statfs` (for `df`): a bucket has no fixed size.
const STATFS_BSIZE: u32 = 4096;
const STATFS_BLOCKS: u64 = (1 << 50) / STATFS_BSIZE as u64;
const STATFS_FILES: u64 = 1 << 32;

/// The attributes of one inode, in filesystem terms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// File, directory or symbolic link.
    pub kind: Kind,
    /// Size in bytes (a link's: its target's length).
    pub size: u64,
    /// Permission bits.
    pub perm: u16,
    /// Link count.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification (and access and change) time.
    pub mtime: SystemTime,
    /// Preferred I/O size.
    pub blksize: u32,
}

/// A looked-up name: its attributes and how long the kernel may keep them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Entry {
    /// The inode's attributes.
    pub attr: Attr,
    /// How long the kernel may trust the name -> inode answer.
    pub entry_ttl: Duration,
    /// How long the kernel may trust the attributes.
    pub attr_ttl: Duration,
}

/// An opened file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// The file handle number.
    pub fh: u64,
    /// The kernel's page cache of this file still holds the bytes of this version.
    pub keep_cache: bool,
}

/// Filesystem-wide figures for `statfs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    /// Total blocks.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Blocks available to unprivileged users.
    pub bavail: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Block size.
    pub bsize: u32,
    /// Longest name.
    pub namelen: u32,
    /// Fragment size.
    pub frsize: u32,
}

/// The mounted filesystem; cheap to clone (requests run concurrently on clones).
#[derive(Clone)]
pub struct Fs {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    bucket: String,
    uid: u32,
    gid: u32,
    file_mode: u16,
    dir_mode: u16,
    mounted_at: SystemTime,
    entry_ttl: Duration,
    attr_ttl: Duration,
    /// Inodes, listings, negative entries: everything known of names.
    sb: superblock::Superblock,
    reads: ReadPath,
    handles: handles::Handles,
    writes: write::Writes,
    read_only: bool,
    prefetch: prefetch::Prefetch,
    /// Files whose kernel page cache an O_APPEND write left wrong (see `Fs::append`).
    stale_pages: Mutex<std::collections::HashSet<u64>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means another request panicked mid-update of plain data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Fs {
    /// A filesystem over `bucket`, rooted at `fs.only_dir` when set.
    pub fn new(client: Client, bucket: &str, cfg: &Config) -> Fs {
        let ms = crate::config::ttl;
        let fs = &cfg.fs;
        // SAFETY: getuid and getgid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let (write_budget, read_cache) = write_budget::split_budget(&cfg.cache, &cfg.write);
        let reads = ReadPath::new(client.clone(), bucket, &cfg.read, &read_cache);
        Fs {
            inner: Arc::new(Inner {
                prefetch: prefetch::Prefetch::new(&cfg.read, reads.cache_bytes().0),
                reads,
                writes: write::Writes::new(client.clone(), bucket, &cfg.write, write_budget),
                read_only: fs.read_only,
                sb: superblock::Superblock::new(client.clone(), bucket, fs),
                client,
                bucket: bucket.to_string(),
                uid: fs.uid.unwrap_or(uid),
                gid: fs.gid.unwrap_or(gid),
                file_mode: (fs.file_mode & 0o7777) as u16,
                dir_mode: (fs.dir_mode & 0o7777) as u16,
                mounted_at: SystemTime::now(),
                entry_ttl: ms(fs.kernel_entry_ttl_ms),
                attr_ttl: ms(fs.kernel_attr_ttl_ms),
                handles: handles::Handles::new(),
                stale_pages: Mutex::default(),
            }),
        }
    }

    /// Checks that the bucket exists and answers: one listing call of the root, one entry.
    pub async fn check_bucket(&self) -> gcs::Result<()> {
        self.inner
            .client
            .list_page(
                &self.inner.bucket,
                &list_request(&self.inner.sb.root_key, 1),
            )
            .await
            .map(|_| ())
    }

    fn inode(&self, ino: u64) -> FsResult<Inode> {
        self.inner.sb.inode(ino)
    }

    fn dir_inode(&self, ino: u64) -> FsResult<Inode> {
        self.inner.sb.dir_inode(ino)
    }

    fn attr_of(&self, inode: &Inode, meta: Option<ObjMeta>) -> Attr {
        let i = &self.inner;
        match (inode.kind, meta) {
            (Kind::File, Some(m)) => {
                let written = i.writes.as_written(inode.ino);
                Attr {
                    ino: inode.ino,
                    kind: Kind::File,
                    size: written.map_or(
                        m.size,
                        |w| {
                            if w.exact {
                                w.size
                            } else {
                                w.size.max(m.size)
                            }
                        },
                    ),
                    perm: i.file_mode,
                    nlink: 1,
                    uid: i.uid,
                    gid: i.gid,
                    mtime: written.and_then(|w| w.mtime).unwrap_or(m.mtime.into()),
                    blksize: BLKSIZE,
                }
            }
            (Kind::Symlink, Some(m)) => Attr {
                ino: inode.ino,
                kind: Kind::Symlink,
                // A link's size is its target's length, whichever way its object holds it.
                size: inode.target().map_or(m.size, |t| t.len() as u64),
                perm: symlink::PERM,
                nlink: 1,
                uid: i.uid,
                gid: i.gid,
                mtime: m.mtime.into(),
                blksize: BLKSIZE,
            },
            (kind, _) => Attr {
                ino: inode.ino,
                kind,
                size: 0,
                perm: match kind {
                    Kind::Dir => i.dir_mode,
                    Kind::Symlink => symlink::PERM,
                    Kind::File => i.file_mode,
                },
                nlink: if kind == Kind::Dir { 2 } else { 1 },
                uid: i.uid,
                gid: i.gid,
                mtime: i.mounted_at,
                blksize: BLKSIZE,
            },
        }
    }

    fn entry(&self, inode: &Inode) -> Entry {
        Entry {
            attr: self.attr_of(inode, inode.meta().0),
            entry_ttl: self.inner.entry_ttl,
            attr_ttl: self.inner.attr_ttl,
        }
    }

    /// How long the kernel may trust attributes (for `getattr` replies).
    pub fn attr_ttl(&self) -> Duration {
        self.inner.attr_ttl
    }

    /// Resolves `name` in directory `parent`, counting one kernel lookup on the result.
    pub async fn lookup(&self, parent: u64, name: &str) -> FsResult<Entry> {
        let inode = self.inner.sb.lookup(parent, name).await?;
        Ok(self.entry(&inode))
    }

    /// `lookup` as far as the directory's cached listing answers it, with no call to make:
    /// what the FUSE thread can answer at once. `None`: ask `lookup`.
    pub fn lookup_cached(&self, parent: u64, name: &str) -> Option<FsResult<Entry>> {
        let found = self.inner.sb.lookup_cached(parent, name)?;
        Some(found.map(|inode| self.entry(&inode)))
    }

    /// The kernel dropped `n` lookups of `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        self.inner.sb.forget(ino, n);
    }

    /// The names whose dentries the kernel should drop, (parent inode, name): those whose
    /// version a read found gone from the bucket, and, when the kernel holds more inodes
    /// than `fs.metadata_cache_mb` allows, the least recently looked up. The FUSE session
    /// sends them as `FUSE_NOTIFY_INVAL_ENTRY`, and the kernel's forgets then free the
    /// inodes.
    pub fn inodes_to_shed(&self) -> Vec<(u64, String)> {
        self.inner.sb.inodes_to_shed()
    }

    /// What the mount's metadata holds now (inodes, cached listings).
    pub fn metadata_usage(&self) -> MetadataUsage {
        self.inner.sb.usage()
    }

    /// Attributes of `ino`.
    pub async fn getattr(&self, ino: u64) -> FsResult<Attr> {
        let inode = self.inode(ino)?;
        let meta = match inode.kind {
            Kind::File | Kind::Symlink => Some(self.inner.sb.fresh_meta(&inode).await?),
            Kind::Dir => None,
        };
        Ok(self.attr_of(&inode, meta))
    }

    /// The mount's kernel read-ahead, in bytes, as the kernel reports it after mounting.
    pub fn set_kernel_read_ahead(&self, bytes: u64) {
        self.inner.reads.set_kernel_read_ahead(bytes);
    }

    /// Opens a file for reading (`open_write` opens for writing); `direct`: with `O_DIRECT`,
    /// which the kernel reads nothing ahead for. A file being written through this mount has
    /// its streamed bytes made durable first, so the reader sees them all; a file being
    /// rewritten is read from the rewrite's staged copy while it lasts.
    pub async fn open(&self, ino: u64, write: bool, direct: bool) -> FsResult<Opened> {
        if write {
            return Err(Errno::EROFS);
        }
        let inode = self.inode(ino)?;
        match inode.kind {
            Kind::File => {}
            Kind::Dir => return Err(Errno::EISDIR),
            // The kernel follows links itself and opens their targets: this is O_NOFOLLOW.
            Kind::Symlink => return Err(Errno(libc::ELOOP)),
        }
        // Bytes written through this mount must be in the service before a reader opens,
        // or, while the file is rewritten, read from the rewrite's staged copy.
        let rewrite = self.inner.writes.ready_for_reader(ino).await?;
        let meta = self.inner.sb.fresh_meta(&inode).await?;
        let mut opened = self.open_at(&inode, &meta, direct);
        if rewrite.is_some() {
            opened.keep_cache = false;
            self.inner.handles.set_rewrite(opened.fh, rewrite);
        }
        Ok(opened)
    }

    /// `open` for reading when nothing needs a call or a wait (no write of the file pending
    /// through this mount, its metadata fresh): what the FUSE thread can answer at once.
    /// `None`: ask `open`. Must run inside the runtime (prefetch may start).
    pub fn open_cached(&self, ino: u64, direct: bool) -> Option<Opened> {
        let inode = self.inode(ino).ok()?;
        if inode.kind != Kind::File || self.inner.writes.is_writing(ino) {
            return None;
        }
        let meta = self.inner.sb.cached_meta(&inode)?;
        Some(self.open_at(&inode, &meta, direct))
    }

    /// A reading handle of `inode` pinned to the version `meta` describes.
    fn open_at(&self, inode: &Inode, meta: &ObjMeta, direct: bool) -> Opened {
        let clock = self.inner.prefetch.open_clock(meta.size);
        let keep_cache = inode.note_open(meta.identity(), clock);
        let key = inode.key();
        let handle = Arc::new(self.inner.reads.open(&key, meta, direct));
        self.prefetch_on_open(&key);
        let fh = self.inner.handles.add_file(inode.clone(), handle);
        Opened { fh, keep_cache }
    }

    /// Whether the modes reported give the user who mounted (the only user the kernel lets in
    /// without `allow_other`) all a mode check could: see `modes_give_all`.
    pub fn owner_may_do_all(&self) -> bool {
        let i = &self.inner;
        // SAFETY: getuid cannot fail and touches no memory.
        let mounter = unsafe { libc::getuid() };
        modes_give_all(i.uid, mounter, i.file_mode, i.dir_mode)
    }

    /// True on a read-only mount: the kernel is told not to open files (FUSE `no_open`), so a
    /// file read costs no open and no release, and reads come without a handle
    /// (`read_unopened`). Nothing is lost: an inode reads one generation (a newer one is a
    /// new inode), as a handle would, and the kernel keeps the page cache of an inode whose
    /// size it sees unchanged, as an open would have let it.
    pub fn skips_open(&self) -> bool {
        self.inner.read_only
    }

    /// Reads up to `size` bytes at `offset` of file `ino`, which the kernel did not open
    /// (`skips_open`), for process `reader`; `direct`: it opened the file with `O_DIRECT`.
    ///
    /// Reads what the inode knows of its version, with no call: the kernel asks for no byte
    /// past the size it was told, which came from the same metadata, and refreshes that
    /// (a `getattr`) as its attribute TTL says. A read through the page cache at offset 0
    /// counts as the file's open for prefetch; a file the page cache still holds sends no
    /// read, and needs no prefetch.
    pub async fn read_unopened(
        &self,
        ino: u64,
        offset: u64,
        size: u32,
        direct: bool,
        reader: u32,
    ) -> FsResult<Bytes> {
        let inode = self.inode(ino)?;
        match inode.kind {
            Kind::File => {}
            Kind::Dir => return Err(Errno::EISDIR),
            Kind::Symlink => return Err(Errno(libc::ELOOP)),
        }
        let meta = match inode.meta().0 {
            Some(meta) => meta,
            None => match self.inner.sb.fresh_meta(&inode).await {
                Err(Errno::ENOENT) => return Err(Errno::ESTALE),
                other => other?,
            },
        };
        let key = inode.key();
        if offset == 0 && !direct {
            inode.note_open(meta.identity(), self.inner.prefetch.open_clock(meta.size));
            self.prefetch_on_open(&key);
        }
        let handle = self.inner.reads.unopened(&key, &meta, direct, reader);
        self.read_version(&inode, &handle, offset, size).await
    }

    /// Reads through `handle` of `inode`, whose generation may be gone: then stale, not
    /// missing, and the name is found anew at the next open (`Superblock::version_gone`).
    async fn read_version(
        &self,
        inode: &Inode,
        handle: &ReadSide,
        offset: u64,
        size: u32,
    ) -> FsResult<Bytes> {
        match self.inner.reads.read(handle, offset, u64::from(size)).await {
            Err(Errno::ENOENT) => {
                self.inner.sb.version_gone(inode, handle.object().1);
                Err(Errno::ESTALE)
            }
            other => other,
        }
    }

    /// Reads up to `size` bytes at `offset` of open file `fh`, from the version it opened,
    /// grown by what was appended to it since, or from what this mount wrote over it since
    /// (`follow`); a rewrite's staged copy while it lasts, then the version it left.
    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Bytes> {
        let sides = self.inner.handles.file(fh).ok_or(Errno::EBADF)?;
        let mut handle = sides.read;
        let mut rewrite = sides.rewrite;
        if sides.writer.is_none() && rewrite.is_none() {
            (handle, rewrite) = self.follow(fh, &sides.inode, handle).await;
        }
        if let Some(fw) = rewrite {
            if let Some(got) = self.inner.writes.read_rewrite(&fw, offset, size).await {
                return got;
            }
            // The rewrite is over: on with the version there is now.
            handle = self
                .reopen_after_rewrite(fh, &fw.written().0, handle.direct())
                .await?;
        }
        let writer = sides.writer;
        if let Some(fw) = &writer {
            if let Some(staged) = self.inner.writes.read_staged(fw, offset, size).await {
                return staged;
            }
        }
        if offset.saturating_add(u64::from(size)) > handle.size() {
            handle = match writer {
                Some(fw) => match self.catch_up(fh, &fw, handle).await? {
                    Some(h) => h,
                    // The writer turned staged meanwhile: its staged copy holds the bytes.
                    None => {
                        let staged = self.inner.writes.read_staged(&fw, offset, size).await;
                        return staged.unwrap_or(Err(Errno::EIO));
                    }
                },
                None => self.grown(fh, &sides.inode, handle).await,
            };
        }
        self.read_version(&sides.inode, &handle, offset, size).await
    }

    /// Reading handle `fh` of `inode`, opened while the file was rewritten, reads the
    /// file's version now that the rewrite is over: its new read side.
    async fn reopen_after_rewrite(
        &self,
        fh: u64,
        inode: &Inode,
        direct: bool,
    ) -> FsResult<Arc<ReadSide>> {
        let meta = match self.inner.sb.fresh_meta(inode).await {
            // Deleted elsewhere before this mount knew its metadata: the file is gone.
            Err(Errno::ENOENT) => return Err(Errno::ESTALE),
            other => other?,
        };
        let fresh = Arc::new(self.inner.reads.open(&inode.key(), &meta, direct));
        if let Some(old) = self.inner.handles.replace_read_side(fh, fresh.clone()) {
            self.inner.reads.release(&old);
        }
        self.inner.handles.set_rewrite(fh, None);
        Ok(fresh)
    }

    /// The write share of the memory budget: what all writers together may hold
    /// unpersisted, in bytes.
    pub fn write_budget_bytes(&self) -> u64 {
        self.inner.writes.budget_bytes()
    }

    /// True when handle `fh` writes (its close and release may have a stream to end).
    pub fn is_writer(&self, fh: u64) -> bool {
        self.inner.handles.writer(fh).is_some()
    }

    /// Closes reading handle `fh`; its streams stay warm a while. A writing handle may have
    /// a stream to end: it closes with `release_write`.
    pub fn release(&self, fh: u64) {
        if self.is_writer(fh) {
            return;
        }
        if let Some((read, _)) = self.inner.handles.remove_file(fh) {
            self.inner.reads.release(&read);
        }
    }

    /// Figures for `df`: a bucket has no fixed size, so a large constant, all free.
    pub fn statfs(&self) -> StatFs {
        StatFs {
            blocks: STATFS_BLOCKS,
            bfree: STATFS_BLOCKS,
            bavail: STATFS_BLOCKS,
            files: STATFS_FILES,
            ffree: STATFS_FILES,
            bsize: STATFS_BSIZE,
            namelen: names::NAME_MAX as u32,
            frsize: STATFS_BSIZE,
        }
    }

    /// `access(2)`, which the kernel asks only where it checks no modes itself (see
    /// `owner_may_do_all`), for the one user it lets in: existence, writing unless the mount
    /// is read-only, and running a file only when its mode has an execute bit, as the kernel
    /// decides `exec` itself.
    pub fn access(&self, ino: u64, want_write: bool, want_exec: bool) -> FsResult<()> {
        let inode = self.inode(ino)?;
        if want_exec && inode.kind == Kind::File && self.inner.file_mode & 0o111 == 0 {
            return Err(Errno(libc::EACCES));
        }
        if want_write {
            return self.may_write();
        }
        Ok(())
    }
}

/// Whether files of mode `file_mode` and directories of mode `dir_mode`, owned by `owner`,
/// give user `mounter` all that a check of the modes could: read and write on files, running
/// a file exactly when any execute bit is set (the rule the kernel applies to `exec` with or
/// without a mode check, and `access` here), everything on directories.
fn modes_give_all(owner: u32, mounter: u32, file_mode: u16, dir_mode: u16) -> bool {
    let runs_as_exec_decides = file_mode & 0o111 == 0 || file_mode & 0o100 != 0;
    owner == mounter
        && file_mode & 0o600 == 0o600
        && runs_as_exec_decides
        && dir_mode & 0o700 == 0o700
}

impl std::fmt::Debug for Fs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fs")
            .field("bucket", &self.inner.bucket)
            .finish_non_exhaustive()
    }
}

/// A memory-backed emulator on a free loopback port holding `objects` in bucket "b", with
/// `latency_us` per response, and a default config pointed at it: the unit tests' server.
#[cfg(test)]
pub(crate) async fn test_emulator(
    objects: &[(&str, Bytes)],
    latency_us: u64,
) -> (crate::emulator::Emulator, Config) {
    use crate::emulator::{Emulator, EmulatorOptions, Faults};
    let opts = EmulatorOptions {
        memory: true,
        faults: Faults {
            latency_us,
            ..Faults::default()
        },
        ..EmulatorOptions::default()
    };
    let emu = Emulator::start(opts, "127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("emulator starts");
    emu.create_bucket("b").expect("bucket");
    for (name, bytes) in objects {
        emu.put_object("b", name, bytes.clone()).expect("put");
    }
    let mut cfg = Config::default();
    cfg.gcs.endpoint = emu.endpoint();
    (emu, cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller that arrives just after a listing call ended (the prefetcher found no listing
    /// a moment before) takes the cached listing: the folder is listed once, not twice.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_whole_listing_once_cached_is_not_listed_again() {
        let x = Bytes::from_static(b"x");
        let (emu, cfg) = test_emulator(&[("d/a", x.clone()), ("d/b", x)], 0).await;
        let fs = Fs::new(Client::connect(&cfg.gcs).await.expect("client"), "b", &cfg);
        let first = fs.inner.sb.whole_listing("d/").await.expect("listed");
        let again = fs.inner.sb.whole_listing("d/").await.expect("listed");
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(emu.stats().list_calls, 1);
    }

    #[test]
    fn the_mounter_is_given_all_only_by_its_own_full_modes() {
        assert!(modes_give_all(1000, 1000, 0o644, 0o755));
        assert!(modes_give_all(0, 0, 0o600, 0o700));
        assert!(
            modes_give_all(1000, 1000, 0o755, 0o700),
            "runs as exec decides"
        );
        assert!(!modes_give_all(1234, 1000, 0o644, 0o755), "another owner");
        assert!(
            !modes_give_all(1000, 1000, 0o444, 0o755),
            "files not writable"
        );
        assert!(
            !modes_give_all(1000, 1000, 0o645, 0o755),
            "others may run, the owner not"
        );
        assert!(
            !modes_give_all(1000, 1000, 0o644, 0o600),
            "directories not searchable"
        );
    }
}
