//! The only module that knows fuser: decode kernel requests, call `fs`, reply.
//!
//! Every request is polled once on the FUSE thread and moves to a tokio task only when it
//! has to wait (on the network, a lock, the memory budget), so no request waits behind
//! another's round trip. What `fs` can answer at once (a listed lookup, an open with fresh
//! metadata, a read of cached bytes, a write that fits its stream's window, a create that
//! does not wait for the service) is answered there: waking a runtime worker would cost more
//! than the answer. The tasks run on the runtime's workers, or, on a machine of few cores,
//! on the FUSE thread itself between requests (`Driver`, `driven.rs`). A read-only mount
//! tells the kernel not to send opens, flushes and releases of files at all (`skip_open`).
//! No filesystem logic lives here: only type conversions and the init negotiation;
//! `session.rs` mounts and unmounts, `fusermount.rs` speaks fusermount3 and receives passed
//! descriptors.

use crate::fs::{
    Attr, Closer, DirItem, Entry, Errno as FsErrno, Fs, FsResult, Kind, Mtime, Opened, SetAttr,
};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::runtime::{Handle, Runtime, RuntimeFlavor};

mod direct_writes;
mod driven;
mod fusermount;
mod session;
mod write_buffers;

use driven::Driven;
use write_buffers::WriteBuffers;

pub use fusermount::{receive_fd, receive_message};
pub use session::{MountSettings, Mounted};

/// Largest read and write request negotiated with the kernel.
const MAX_IO: u32 = 1024 * 1024;

/// Most bytes of free write buffers kept for reuse (see `write_buffers.rs`).
const KEEP_FREE_WRITE_BUFFERS: u64 = 16 << 20;

/// Background requests (read-ahead among them) the kernel may keep outstanding, per core:
/// a sequential reader's 16 MiB of kernel read-ahead is 16 requests of 1 MiB, and a core
/// serves a few such readers.
const BACKGROUND_PER_CORE: usize = 16;
/// The least background requests allowed, however few the cores: four sequential readers'
/// read-ahead (64 requests) stays under the congestion threshold (three quarters), past
/// which the kernel drops read-ahead and the readers wait on reads of their own instead.
/// At 64 (threshold 48) four readers of four 1 GiB files on 2 cores read 0.94x as fast
/// (medians of 8 alternated runs in two sets: 1.06x [0.96-1.31] for 128).
const MIN_BACKGROUND: usize = 128;

/// The runtime a mount's requests run on, and which thread drives it.
#[derive(Clone)]
pub enum Driver {
    /// A multi-threaded runtime, driven by its workers: a request that has to wait moves to
    /// one of them.
    Workers(Handle),
    /// A current-thread runtime that the FUSE thread drives itself between requests
    /// (`driven.rs`): nothing crosses threads. Nobody else may hold it in `block_on` while
    /// the mount serves, or the requests would run on that thread instead.
    FuseThread(Arc<Runtime>),
}

impl Driver {
    /// The FUSE thread for a current-thread runtime, the workers for any other.
    pub fn of(rt: &Arc<Runtime>) -> Driver {
        match rt.handle().runtime_flavor() {
            RuntimeFlavor::CurrentThread => Driver::FuseThread(rt.clone()),
            _ => Driver::Workers(rt.handle().clone()),
        }
    }
}

/// The fuser adapter: the filesystem plus the runtime its requests run on.
struct FuseAdapter {
    fs: Fs,
    rt: Handle,
    /// Set when the FUSE thread drives `rt` itself.
    driven: Option<Arc<Driven>>,
    /// The buffers that full-size writes' bytes are copied into.
    write_buffers: Arc<WriteBuffers>,
    /// Files are read without an open (`Fs::skips_open`, the kernel mount is read-only so the
    /// kernel refuses every open for writing itself, and the kernel said at `init` that it
    /// opens files itself when told to: one that does not would fail every open): `open` and
    /// `flush` answer ENOSYS, which the kernel remembers for the rest of the mount. Until
    /// `init`, whether the first two hold.
    skip_open: bool,
    /// Handles opened write-only bypass the page cache (`direct_writes.rs`). Set at `init`
    /// when the kernel keeps readers coherent with that.
    direct_writes: bool,
}

/// The end of a request's turn on the FUSE thread: when dropped, and the FUSE thread drives
/// the runtime, it runs the runtime until the next request (`Driven::until_next_request`).
/// Every request takes one first, so that no way out of a request skips it; only a forget
/// hands the runtime to the standby thread instead (see `forget`).
struct Turn<'a>(Option<&'a Driven>);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        // A callback that panics ends the FUSE thread: no turn holds its unwinding up until
        // the next request (the standby drives the runtime once the thread is gone).
        if std::thread::panicking() {
            return;
        }
        if let Some(driven) = self.0 {
            driven.until_next_request();
        }
    }
}

/// FUSE `max_background` and `congestion_threshold` for a machine of `cores` cores: 16
/// requests a core, at least `MIN_BACKGROUND`. Past the congestion threshold (three
/// quarters) the kernel drops read-ahead rather than queue it. Measured against gcsfuse's
/// formula (twice the cores, at least 12) on a 2-core machine: 1.25x the sequential read,
/// 1.14x four readers, 1.20x a safetensors load, the same small-file and random-read figures.
fn background_limits(cores: usize) -> (u16, u16) {
    let background =
        u16::try_from((cores * BACKGROUND_PER_CORE).max(MIN_BACKGROUND)).unwrap_or(u16::MAX);
    (background, background / 4 * 3)
}

/// Records one answered request in the metrics (latency, bytes moved, errno) and hands the
/// result back untouched.
fn metered<T>(
    op: &'static str,
    start: Instant,
    result: FsResult<T>,
    bytes: impl FnOnce(&T) -> u64,
) -> FsResult<T> {
    let (n, err) = match &result {
        Ok(v) => (bytes(v), None),
        Err(e) => (0, Some(e.0)),
    };
    crate::metrics::fuse_op(op, start.elapsed(), n, err);
    result
}

/// The byte count of a reply that moves no payload.
fn nothing<T>(_: &T) -> u64 {
    0
}

/// Records a request that cannot fail.
fn counted(op: &'static str, start: Instant) {
    crate::metrics::fuse_op(op, start.elapsed(), 0, None);
}

/// Records a request answered ENOSYS, which the kernel remembers: it never sends that
/// operation again on this mount (see `FuseAdapter::skip_open`).
fn not_sent_again(op: &'static str) -> Errno {
    crate::metrics::fuse_op(op, Duration::ZERO, 0, Some(libc::ENOSYS));
    Errno::ENOSYS
}

fn errno(e: FsErrno) -> Errno {
    Errno::from_i32(e.0)
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.mtime,
        mtime: a.mtime,
        ctime: a.mtime,
        // Sent to macOS only: Linux's FUSE has no creation time.
        crtime: a.mtime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: a.blksize,
        flags: 0,
    }
}

impl FuseAdapter {
    /// The adapter of `fs` on `driver`, and its `Driven` when the FUSE thread drives.
    fn new(fs: Fs, driver: Driver, kernel_read_only: bool) -> (FuseAdapter, Option<Arc<Driven>>) {
        let (rt, driven) = match driver {
            Driver::Workers(rt) => (rt, None),
            Driver::FuseThread(rt) => (rt.handle().clone(), Some(Arc::new(Driven::new(rt)))),
        };
        // A sequential writer's buffers come back a lookup's worth at a time (half its
        // stream's window, `gcs.write_buffer_kb`: 16 MiB by default); the free ones stay
        // within half the write share. A kernel that refuses 1 MiB writes (`init` settles
        // for less) sends none of that size, and nothing is recycled.
        let keep_free = (fs.write_budget_bytes() / 2).min(KEEP_FREE_WRITE_BUFFERS) as usize;
        let adapter = FuseAdapter {
            skip_open: fs.skips_open() && kernel_read_only,
            fs,
            rt,
            driven: driven.clone(),
            write_buffers: WriteBuffers::new(MAX_IO as usize, keep_free),
            direct_writes: false,
        };
        (adapter, driven)
    }

    /// This request's turn: see `Turn`.
    fn turn(&self) -> Turn<'_> {
        Turn(self.driven.as_deref())
    }

    /// Runs `answer` (the whole of a request's answer) on the calling FUSE thread until it
    /// first has to wait, and from there as a task of the runtime, which polls it afresh. A
    /// request that need not wait is answered without a task, and with worker threads
    /// without a hand-off between threads: two context switches and a wake-up, which cost
    /// more than most answers (a small file's write, create, getattr).
    fn answer_soon(&self, answer: impl Future<Output = ()> + Send + 'static) {
        if let Some(driven) = &self.driven {
            return driven.answer(answer);
        }
        let mut answer = Box::pin(answer);
        let _runtime = self.rt.enter();
        let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
        if answer.as_mut().poll(&mut cx).is_pending() {
            self.rt.spawn(answer);
        }
    }
}

/// Answers a request through `answer_soon`, the shape of every request that may wait:
/// `call` (an `FsResult` future over the filesystem bound to `fs`) runs, is recorded in the
/// metrics as `op`, and `ok` answers its value, or the reply carries the errno.
macro_rules! answer {
    ($adapter:expr, $op:expr, $reply:ident, |$fs:ident| $call:expr, |$value:pat_param| $ok:expr) => {{
        let t0 = Instant::now();
        let $fs = $adapter.fs.clone();
        $adapter.answer_soon(async move {
            let result = $call.await;
            match metered($op, t0, result, nothing) {
                Ok($value) => $ok,
                Err(e) => $reply.error(errno(e)),
            }
        });
    }};
}

/// The open reply's flags: keep the page cache when it still holds this version; a reading
/// handle has nothing to flush, so spare each close() of it a round trip (a DataLoader closes
/// one file per sample).
fn open_flags(o: &Opened, write: bool) -> FopenFlags {
    let mut flags = FopenFlags::empty();
    if o.keep_cache {
        flags |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    if !write {
        flags |= FopenFlags::FOPEN_NOFLUSH;
    }
    flags
}

/// Adds one `readdirplus` entry to `reply`; true when its buffer is full.
fn add_plus(reply: &mut ReplyDirectoryPlus, it: &DirItem, e: &Entry) -> bool {
    reply.add(
        INodeNo(it.ino),
        it.offset,
        it.name,
        &e.entry_ttl,
        &file_attr(&e.attr),
        Generation(0),
    )
}

/// Answers a request that names an entry (lookup, mkdir, mknod, symlink) with its attributes.
fn reply_entry(reply: ReplyEntry, e: &Entry) {
    reply.entry_with_ttls(
        &e.attr_ttl,
        &e.entry_ttl,
        &file_attr(&e.attr),
        Generation(0),
    );
}

/// Object names are UTF-8: a name that is not cannot exist in the bucket.
fn utf8(name: &OsStr) -> Option<String> {
    name.to_str().map(str::to_string)
}

impl FuseAdapter {
    /// `unlink` and `rmdir`: one name of a directory removed by `call`, answered with
    /// success or an errno.
    fn remove<F, Fut>(
        &self,
        op: &'static str,
        parent: INodeNo,
        name: &OsStr,
        reply: ReplyEmpty,
        call: F,
    ) where
        F: FnOnce(Fs, u64, String) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = FsResult<()>> + Send,
    {
        let Some(name) = utf8(name) else {
            return reply.error(Errno::ENOENT);
        };
        answer!(self, op, reply, |fs| call(fs, parent.0, name), |()| reply
            .ok());
    }
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        for cap in [
            InitFlags::FUSE_ASYNC_READ,
            InitFlags::FUSE_DO_READDIRPLUS,
            // Attributes (and so an inode the kernel holds) in the first reply of a directory
            // read, up to the reader's buffer (glibc's is the directory's 1 MiB block: some
            // 6,000 entries), and in later replies only after a lookup in the directory.
            // Listing a directory of a million names leaves no million inodes; `ls -l` of it
            // pays a lookup per name past the first reply (answered from the cached listing).
            InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_MAX_PAGES,
            // A link's inode never changes its target (a new target is a new generation, so
            // a new inode): the kernel may keep it, and a path through a link costs no call.
            InitFlags::FUSE_CACHE_SYMLINKS,
            // O_TRUNC comes with the open instead of as a size change after it: a write-only
            // open of an existing file can then stream its new version (`open_write_only`).
            InitFlags::FUSE_ATOMIC_O_TRUNC,
        ] {
            if let Err(missing) = config.add_capabilities(cap) {
                tracing::debug!(?missing, "kernel lacks a FUSE capability");
            }
        }
        self.skip_open = self.skip_open
            && config
                .capabilities()
                .contains(InitFlags::FUSE_NO_OPEN_SUPPORT);
        self.direct_writes =
            direct_writes::kernel_allows(config.capabilities(), &direct_writes::running_release());
        if let Err(max) = config.set_max_write(MAX_IO) {
            let _ = config.set_max_write(max);
        }
        if let Err(max) = config.set_max_readahead(MAX_IO) {
            let _ = config.set_max_readahead(max);
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (background, congestion) = background_limits(cores);
        let _ = config.set_max_background(background);
        let _ = config.set_congestion_threshold(congestion);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _turn = self.turn();
        let Some(name) = utf8(name) else {
            return reply.error(Errno::ENOENT);
        };
        let t0 = Instant::now();
        // Answered from a cached listing here, without waking a runtime worker: on a busy
        // machine the hand-off costs more than the lookup.
        if let Some(found) = self.fs.lookup_cached(parent.0, &name) {
            return match metered("lookup", t0, found, nothing) {
                Ok(e) => reply_entry(reply, &e),
                Err(e) => reply.error(errno(e)),
            };
        }
        answer!(
            self,
            "lookup",
            reply,
            |fs| fs.lookup(parent.0, &name),
            |e| { reply_entry(reply, &e) }
        );
    }

    // No turn: fuser calls this for each inode of a batch of forgets (its `batch_forget`,
    // whose argument type this crate cannot name), and a turn lasts until the next request,
    // which an idle mount never sends: the rest of the batch stayed held. The standby thread
    // drives the runtime instead, from now until the next request's turn.
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
        if let Some(driven) = &self.driven {
            driven.hand_over();
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _turn = self.turn();
        answer!(self, "getattr", reply, |fs| fs.getattr(ino.0), |a| {
            reply.attr(&fs.attr_ttl(), &file_attr(&a))
        });
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _turn = self.turn();
        let set = SetAttr {
            size,
            mode,
            uid,
            gid,
            mtime: mtime.map(|t| match t {
                TimeOrNow::SpecificTime(t) => Mtime::At(t),
                TimeOrNow::Now => Mtime::Now,
            }),
            fh: fh.map(|f| f.0),
        };
        answer!(self, "setattr", reply, |fs| fs.setattr(ino.0, set), |a| {
            reply.attr(&fs.attr_ttl(), &file_attr(&a))
        });
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        let _turn = self.turn();
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let Some(name) = utf8(name) else {
            return reply.error(Errno::EINVAL);
        };
        answer!(
            self,
            "mknod",
            reply,
            |fs| fs.create(parent.0, &name, libc::O_EXCL),
            |(e, o)| {
                fs.release_write(o.fh).await;
                reply_entry(reply, &e)
            }
        );
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let _turn = self.turn();
        let Some(name) = utf8(name) else {
            return reply.error(Errno::EINVAL);
        };
        answer!(self, "mkdir", reply, |fs| fs.mkdir(parent.0, &name), |e| {
            reply_entry(reply, &e)
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _turn = self.turn();
        self.remove(
            "unlink",
            parent,
            name,
            reply,
            |fs, parent, name| async move { fs.unlink(parent, &name).await },
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _turn = self.turn();
        self.remove(
            "rmdir",
            parent,
            name,
            reply,
            |fs, parent, name| async move { fs.rmdir(parent, &name).await },
        );
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _turn = self.turn();
        answer!(self, "readlink", reply, |fs| fs.readlink(ino.0), |t| {
            reply.data(t.as_bytes())
        });
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _turn = self.turn();
        // Object names and metadata are UTF-8: a name or target that is not cannot be stored.
        let (Some(name), Some(target)) = (utf8(link_name), target.to_str().map(str::to_string))
        else {
            return reply.error(Errno::EINVAL);
        };
        answer!(
            self,
            "symlink",
            reply,
            |fs| fs.symlink(parent.0, &name, &target),
            |e| reply_entry(reply, &e)
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turn();
        let (Some(name), Some(newname)) = (utf8(name), utf8(newname)) else {
            return reply.error(Errno::EINVAL);
        };
        answer!(
            self,
            "rename",
            reply,
            |fs| fs.rename(parent.0, &name, newparent.0, &newname, flags.bits()),
            |()| reply.ok()
        );
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _turn = self.turn();
        let t0 = Instant::now();
        let refused = self.fs.link_refusal();
        crate::metrics::fuse_op("link", t0.elapsed(), 0, Some(refused.0));
        reply.error(errno(refused));
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _turn = self.turn();
        if self.skip_open {
            // The kernel opens this file and every later one itself (FUSE `no_open`). A
            // read-only mount's kernel refuses every open for writing before asking.
            return reply.error(not_sent_again("open"));
        }
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY
            || flags.0 & (libc::O_TRUNC | libc::O_APPEND) != 0;
        let write_only = flags.acc_mode() == OpenAccMode::O_WRONLY;
        let truncate = flags.0 & libc::O_TRUNC != 0;
        let direct = flags.0 & libc::O_DIRECT != 0;
        let t0 = Instant::now();
        if !write {
            let cached = match &self.driven {
                Some(driven) => driven.at_once(|| self.fs.open_cached(ino.0, direct)),
                None => {
                    let _runtime = self.rt.enter();
                    self.fs.open_cached(ino.0, direct)
                }
            };
            if let Some(o) = cached {
                counted("open", t0);
                return reply.opened(FileHandle(o.fh), open_flags(&o, false));
            }
        }
        let pid = req.pid();
        let uncached = direct_writes::write_only_flags(self.direct_writes, flags.0);
        answer!(
            self,
            "open",
            reply,
            |fs| async {
                if write && write_only {
                    fs.open_write_only(ino.0, truncate).await
                } else if write {
                    fs.open_write(ino.0, truncate).await
                } else {
                    fs.open(ino.0, false, direct).await
                }
            },
            |o| {
                fs.note_opener(o.fh, pid);
                reply.opened(FileHandle(o.fh), open_flags(&o, write) | uncached)
            }
        );
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _turn = self.turn();
        let t0 = Instant::now();
        let fs = self.fs.clone();
        let (unopened, direct) = (self.skip_open, flags.0 & libc::O_DIRECT != 0);
        let reader = req.pid();
        self.answer_soon(async move {
            let read = if unopened {
                fs.read_unopened(ino.0, offset, size, direct, reader).await
            } else {
                fs.read(fh.0, offset, size).await
            };
            match metered("read", t0, read, |d| d.len() as u64) {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _turn = self.turn();
        let t0 = Instant::now();
        self.fs.note_write_by(fh.0, req.pid());
        let data = self.write_buffers.copy(data);
        let fs = self.fs.clone();
        // The kernel's offset for an O_APPEND write is the size it last saw, which another
        // mount's appends may have left behind: the write goes to the end the file's writer
        // knows instead, and the pages the kernel cached at its own offset are dropped soon
        // after the reply (`Fs::pages_to_drop`).
        let append = flags.0 & libc::O_APPEND != 0;
        self.answer_soon(async move {
            let written = if append {
                fs.append(fh.0, offset, data).await
            } else {
                fs.write(fh.0, offset, data).await
            };
            match metered("write", t0, written, |n| u64::from(*n)) {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turn();
        if self.skip_open {
            // Nothing is written on a read-only mount: the kernel stops sending flushes.
            return reply.error(not_sent_again("flush"));
        }
        // Each close(2) is answered once every byte written through `fh` is persisted. A
        // reading handle has nothing to persist: answered here, without waking a runtime
        // worker, since every close of every file read sends a flush.
        if !self.fs.is_writer(fh.0) {
            counted("flush", Instant::now());
            return reply.ok();
        }
        match self.fs.closer(fh.0, req.pid()) {
            Closer::Opener => {
                answer!(self, "flush", reply, |fs| fs.flush(fh.0), |()| reply.ok())
            }
            Closer::Other => answer!(self, "flush", reply, |fs| fs.flush_inherited(fh.0), |()| {
                reply.ok()
            }),
            Closer::Unknown => {
                answer!(self, "flush", reply, |fs| fs.fsync(ino.0, fh.0), |()| {
                    reply.ok()
                })
            }
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turn();
        let t0 = Instant::now();
        if !self.fs.is_writer(fh.0) {
            self.fs.release(fh.0);
            counted("release", t0);
            return reply.ok();
        }
        let fs = self.fs.clone();
        self.answer_soon(async move {
            fs.release_write(fh.0).await;
            counted("release", t0);
            reply.ok();
        });
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turn();
        answer!(self, "fsync", reply, |fs| fs.fsync(ino.0, fh.0), |()| reply
            .ok());
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _turn = self.turn();
        match metered("opendir", Instant::now(), self.fs.opendir(ino.0), nothing) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _turn = self.turn();
        // A listing at hand is answered here: a large directory is read a page at a time,
        // and waking a runtime worker for every page costs more than the page.
        let t0 = Instant::now();
        let at_hand = self.fs.readdir_at_hand(fh.0, offset, |it| {
            reply.add(INodeNo(it.ino), it.offset, file_type(it.kind), it.name)
        });
        if let Some(done) = at_hand {
            return match metered("readdir", t0, done, nothing) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(e)),
            };
        }
        answer!(
            self,
            "readdir",
            reply,
            |fs| fs.readdir(fh.0, offset, |it| {
                reply.add(INodeNo(it.ino), it.offset, file_type(it.kind), it.name)
            }),
            |()| reply.ok()
        );
    }

    fn readdirplus(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _turn = self.turn();
        let t0 = Instant::now();
        let at_hand = self
            .fs
            .readdirplus_at_hand(fh.0, offset, |it, e| add_plus(&mut reply, it, e));
        if let Some(done) = at_hand {
            return match metered("readdirplus", t0, done, nothing) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(e)),
            };
        }
        answer!(
            self,
            "readdirplus",
            reply,
            |fs| fs.readdirplus(fh.0, offset, |it, e| add_plus(&mut reply, it, e)),
            |()| reply.ok()
        );
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turn();
        self.fs.releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turn();
        answer!(self, "fsyncdir", reply, |fs| fs.fsyncdir(ino.0), |()| reply
            .ok());
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _turn = self.turn();
        let t0 = Instant::now();
        let s = self.fs.statfs();
        counted("statfs", t0);
        reply.statfs(
            s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
        );
    }

    // Objects carry no extended attributes. ENOSYS (rather than ENODATA or ENOTSUP) makes the
    // kernel remember that and answer every later xattr call itself: otherwise each write()
    // costs a GETXATTR round trip (the kernel asks for `security.capability` before every
    // write to a file system without SB_NOSEC), and `ls -l` one per name. Callers see
    // EOPNOTSUPP, as on gcsfuse and mountpoint-s3.
    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turn();
        reply.error(Errno::ENOSYS);
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        let _turn = self.turn();
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        let _turn = self.turn();
        reply.error(Errno::ENOSYS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        let _turn = self.turn();
        reply.error(Errno::ENOSYS);
    }

    // Every Python `open` asks whether the file is a terminal (TCGETS), and the kernel asks
    // again each time (it remembers no ENOSYS for ioctl): answered here with what the kernel
    // would turn ENOSYS into, without fuser's warning line in the log for each file opened.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        let _turn = self.turn();
        reply.error(Errno::ENOTTY);
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _turn = self.turn();
        let t0 = Instant::now();
        let allowed = self.fs.access(
            ino.0,
            mask.contains(AccessFlags::W_OK),
            mask.contains(AccessFlags::X_OK),
        );
        match metered("access", t0, allowed, nothing) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _turn = self.turn();
        let Some(name) = utf8(name) else {
            return reply.error(Errno::EINVAL);
        };
        let pid = req.pid();
        let uncached = direct_writes::write_only_flags(self.direct_writes, flags);
        answer!(
            self,
            "create",
            reply,
            |fs| fs.create(parent.0, &name, flags),
            |(e, o)| {
                fs.note_opener(o.fh, pid);
                reply.created(
                    &e.entry_ttl,
                    &file_attr(&e.attr),
                    Generation(0),
                    FileHandle(o.fh),
                    uncached,
                )
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::background_limits;

    #[test]
    fn the_background_queue_follows_the_cores() {
        assert_eq!(background_limits(1), (128, 96));
        assert_eq!(background_limits(2), (128, 96));
        assert_eq!(background_limits(8), (128, 96));
        assert_eq!(background_limits(16), (256, 192));
        assert_eq!(background_limits(96), (1536, 1152));
        assert_eq!(background_limits(1 << 20).0, u16::MAX);
    }
}
