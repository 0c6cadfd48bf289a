//! The writing operations of [`Fs`]: create, open for writing, write, flush/fsync, size
//! changes and the end of a writing handle. The writer state machine lives in `write.rs`;
//! this file only ties it to inodes, handles and the metadata caches.

use super::dir::ListedEntry;
use super::error::{log_err, Errno, FsResult};
use super::inode::{Inode, Kind, ObjMeta, PENDING_GENERATION};
use super::{lock, names, read, write, Attr, Entry, Fs, Opened};
use bytes::Bytes;
use std::sync::Arc;
use std::time::SystemTime;

/// What `setattr` asks to change, in filesystem terms.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SetAttr {
    /// New size (truncate or extend).
    pub size: Option<u64>,
    /// New permission bits.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New modification time.
    pub mtime: Option<Mtime>,
    /// The handle the change comes through, if any.
    pub fh: Option<u64>,
}

/// A modification time `setattr` sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mtime {
    /// A given time: `touch -d`, and what `rsync -a`, `tar -x` and `cp -p` copy.
    At(SystemTime),
    /// The present time: `touch`, `utime(2)` without times.
    Now,
}

/// Who a close or a write through a file handle comes from (`Fs::closer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closer {
    /// A thread of the process that opened the handle.
    Opener,
    /// Another process, which inherited a descriptor (a forked child).
    Other,
    /// A process this daemon cannot see (another pid namespace), or an opener whose thread
    /// is gone: answered as the old behaviour had it, an fsync.
    Unknown,
}

impl Fs {
    pub(super) fn writable(&self) -> FsResult<()> {
        if self.inner.read_only {
            return Err(Errno::EROFS);
        }
        Ok(())
    }

    /// Creates file `name` in directory `parent` as a new appendable object and opens it for
    /// writing (one write stream from here to its opener's close(2) or, with other writing
    /// handles open, the last release); counts one lookup.
    pub async fn create(&self, parent: u64, name: &str, flags: i32) -> FsResult<(Entry, Opened)> {
        self.writable()?;
        let dir = self.dir_inode(parent)?;
        Self::check_name(name)?;
        let i = &self.inner;
        let key = names::file_key(&dir.key(), name);
        Self::check_key(&key)?;
        // O_EXCL must answer EEXIST from create itself, so it waits for the service. Any
        // other create replaces whatever the name holds, and a create-write-close of a small
        // file is a round trip shorter when the answer is taken in by the first flush: until
        // then the inode's generation is PENDING_GENERATION, and everything that needs the
        // object (another open, a rename of it or onto it, unlink, its directory's fsync,
        // removal or rename) waits for the answer first.
        let exclusive = flags & libc::O_EXCL != 0;
        let created = if exclusive {
            i.client.create_appendable(&i.bucket, &key, Some(0)).await
        } else {
            Ok(i.client.create_appendable_unanswered(&i.bucket, &key))
        };
        let w = created.map_err(|e| match e {
            crate::gcs::Error::PreconditionFailed(_) if exclusive => Errno(libc::EEXIST),
            e => log_err("create", &key, &e),
        })?;
        let now = SystemTime::now().into();
        let meta = ObjMeta {
            generation: match w.generation() {
                0 => PENDING_GENERATION,
                g => g,
            },
            size: 0,
            mtime: now,
        };
        let inode = i.sb.created_file(&key, meta);
        i.sb.created(
            parent,
            ListedEntry {
                name: name.into(),
                kind: Kind::File,
                meta: Some(meta),
                target: None,
            },
        );
        inode.note_open(meta.identity(), i.prefetch.open_clock(0));
        let fh = i
            .handles
            .add_file(inode.clone(), Arc::new(i.reads.open(&key, &meta, false)));
        i.handles.set_writer(fh, i.writes.attach_created(&inode, w));
        Ok((
            self.entry(&inode),
            Opened {
                fh,
                keep_cache: false,
            },
        ))
    }

    /// Opens an existing file for writing (and reading): appends at its end stream into the
    /// object (taken over at the first write), anything else stages it; `truncate` (O_TRUNC)
    /// starts from an empty staged copy, the object staying as it was until fsync or close.
    pub async fn open_write(&self, ino: u64, truncate: bool) -> FsResult<Opened> {
        self.open_writing(ino, truncate, false).await
    }

    /// `open_write` of a handle that cannot read (O_WRONLY). With `truncate`, when no other
    /// handle writes the file, the new version streams into an object of its own beside
    /// the file's, which replaces it at fsync or close (as `torch.save` over last epoch's
    /// checkpoint needs: no staged copy, no upload left for the close); the object stays as
    /// it was until then, as with a staged copy.
    pub async fn open_write_only(&self, ino: u64, truncate: bool) -> FsResult<Opened> {
        self.open_writing(ino, truncate, true).await
    }

    async fn open_writing(&self, ino: u64, truncate: bool, write_only: bool) -> FsResult<Opened> {
        self.writable()?;
        let opened = self.open(ino, false, false).await?;
        let known = self.inode(ino).map(|inode| {
            let meta = inode.meta().0;
            (inode, meta)
        });
        let (inode, meta) = match known {
            Ok((inode, Some(meta))) => (inode, meta),
            Ok((_, None)) | Err(_) => {
                self.release(opened.fh);
                return Err(Errno::EIO);
            }
        };
        let (fw, alone) = self
            .inner
            .writes
            .attach_existing(&inode, meta.generation, meta.size);
        self.inner.handles.set_writer(opened.fh, fw.clone());
        // Its own writer's staged copy, if any, is read as the writer's.
        self.inner.handles.set_rewrite(opened.fh, None);
        if !alone {
            // Joining a writer that streams a new version beside the file: that version goes
            // in place first, and this handle reads it.
            let placed = self.inner.writes.place_for_new_handle(&fw).await;
            let fresh = placed.and_then(|()| inode.meta().0.ok_or(Errno::EIO));
            match fresh {
                Ok(m) if m.generation != meta.generation => {
                    let read = Arc::new(self.inner.reads.open(&inode.key(), &m, false));
                    if let Some(old) = self.inner.handles.replace_read_side(opened.fh, read) {
                        self.inner.reads.release(&old);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    self.release_write(opened.fh).await;
                    return Err(e);
                }
            }
        }
        // A handle that reads would read the object, which keeps the old version.
        let streamed =
            truncate && write_only && alone && self.inner.writes.replace_truncated(&fw).await;
        if truncate && !streamed {
            if let Err(e) = self.inner.writes.set_size(&fw, 0).await {
                self.release_write(opened.fh).await;
                return Err(e);
            }
        }
        Ok(Opened {
            fh: opened.fh,
            keep_cache: false,
        })
    }

    /// Waits for the service to answer the create of `inode`, if it has not yet (see
    /// `create`): what follows must find the object there. A create that failed leaves
    /// nothing to find: its errno, which a caller that only needs the service to have
    /// answered may ignore.
    pub(super) async fn settle_created(&self, inode: &Inode) -> FsResult<()> {
        if inode
            .meta()
            .0
            .is_some_and(|m| m.generation == PENDING_GENERATION)
        {
            return self.inner.writes.settle(inode.ino).await;
        }
        Ok(())
    }

    /// `settle_created` for every file created in directory `dkey` or below it; the first
    /// errno of a create that failed.
    pub(super) async fn settle_created_under(&self, dkey: &str) -> FsResult<()> {
        let mut first = Ok(());
        for inode in self.inner.sb.pending_under(dkey) {
            let settled = self.settle_created(&inode).await;
            first = first.and(settled);
        }
        first
    }

    /// `fsync` of directory `ino`: the files created in it are in the service when it returns
    /// Ok (their bytes are each file's own fsync's business), and a create that failed fails
    /// it.
    pub async fn fsyncdir(&self, ino: u64) -> FsResult<()> {
        let dir = self.dir_inode(ino)?;
        self.settle_created_under(&dir.key()).await
    }

    /// Writes `data` at `offset` of handle `fh`: appends stream, anything else is staged.
    pub async fn write(&self, fh: u64, offset: u64, data: Bytes) -> FsResult<u32> {
        self.writable()?;
        let fw = self.inner.handles.writer(fh).ok_or(Errno::EBADF)?;
        let (written, _) = self.inner.writes.write(&fw, Some(offset), data).await?;
        Ok(written)
    }

    /// Writes `data` at the end of handle `fh`'s file as its writer knows it (the object's,
    /// learnt at the takeover, or the staged copy's), whatever size the caller last saw: an
    /// O_APPEND write, for which the kernel chose `offset`. Where the bytes went elsewhere,
    /// the kernel's cached pages of the file hold them at `offset`: the file is listed in
    /// `pages_to_drop`.
    pub async fn append(&self, fh: u64, offset: u64, data: Bytes) -> FsResult<u32> {
        self.writable()?;
        let fw = self.inner.handles.writer(fh).ok_or(Errno::EBADF)?;
        let (written, at) = self.inner.writes.write(&fw, None, data).await?;
        if at != offset {
            lock(&self.inner.stale_pages).insert(fw.written().0.ino);
        }
        Ok(written)
    }

    /// The files whose pages in the kernel's cache may hold bytes where the object does not
    /// (see `append`), each listed once: the FUSE session asks the kernel to drop them.
    pub fn pages_to_drop(&self) -> Vec<u64> {
        lock(&self.inner.stale_pages).drain().collect()
    }

    /// Handle `fh`, writing through `fw` and reading past the size its read side opened at,
    /// may be reading its own appends, which exist only in its write stream until persisted:
    /// they are made durable, and the handle reads on from the size the object has now (a
    /// handle that does not write: `grown`). `None`: the writer turned staged meanwhile, so
    /// the bytes are in its staged copy.
    pub(super) async fn catch_up(
        &self,
        fh: u64,
        fw: &write::FileWriter,
        handle: Arc<read::Handle>,
    ) -> FsResult<Option<Arc<read::Handle>>> {
        let i = &self.inner;
        let (inode, written) = fw.written();
        if written <= handle.size() {
            return Ok(Some(handle));
        }
        if !i.writes.persist_appends(fw).await? {
            return Ok(None);
        }
        let Some(meta) = inode.meta().0 else {
            return Ok(Some(handle));
        };
        let fresh = Arc::new(i.reads.open(&inode.key(), &meta, handle.direct()));
        if let Some(old) = i.handles.replace_read_side(fh, fresh.clone()) {
            i.reads.release(&old);
        }
        Ok(Some(fresh))
    }

    /// Handle `fh` of `inode`, which neither writes nor reads a rewrite, about to read. The
    /// kernel keeps one inode for every descriptor of the file and learns from this mount's
    /// writes what it holds, so the handle reads what this mount wrote over the version it
    /// opened: a new version streamed beside the file is placed, as for a reader opening
    /// now (`Writes::ready_for_reader`); a staged rewrite is read from its copy (`Some`,
    /// noted on the handle); a generation placed or uploaded since is read instead of the
    /// one the handle opened. An inode's generation changes only through this mount (its
    /// writes and renames): another mount's new version of the name is a new inode here. A
    /// writer's failure is its writer's to report: the handle reads on at what the inode
    /// holds.
    pub(super) async fn follow(
        &self,
        fh: u64,
        inode: &Inode,
        handle: Arc<read::Handle>,
    ) -> (Arc<read::Handle>, Option<Arc<write::FileWriter>>) {
        let i = &self.inner;
        let moved = inode
            .meta()
            .0
            .is_some_and(|m| m.generation != handle.object().1);
        if !moved && !i.writes.rewrites(inode.ino) {
            return (handle, None);
        }
        if let Ok(Some(fw)) = i.writes.ready_for_reader(inode.ino).await {
            i.handles.set_rewrite(fh, Some(fw.clone()));
            return (handle, Some(fw));
        }
        match inode.meta().0 {
            Some(meta) if meta.generation != handle.object().1 => {
                (self.reread(fh, inode, &meta, handle), None)
            }
            _ => (handle, None),
        }
    }

    /// Handle `fh` of `inode`, which does not write, asked for bytes past the size its read
    /// side opened at. The kernel shares one inode between every descriptor of the file, so
    /// it asks for what appends through this mount (or a fresher stat) told it is there, and
    /// a short answer would leave zeros in its page cache where those bytes are. The handle
    /// reads on at the size its version has now: this mount's streamed appends are made
    /// durable first. A new generation is `follow`'s to take, and a writer's failure is its
    /// writer's to report.
    pub(super) async fn grown(
        &self,
        fh: u64,
        inode: &Inode,
        handle: Arc<read::Handle>,
    ) -> Arc<read::Handle> {
        let i = &self.inner;
        if let Some(fw) = i.writes.writer_of(inode.ino) {
            if fw.written().1 > handle.size() {
                let _ = i.writes.persist_appends(&fw).await;
            }
        }
        match inode.meta().0 {
            Some(meta) if meta.generation == handle.object().1 && meta.size > handle.size() => {
                self.reread(fh, inode, &meta, handle)
            }
            _ => handle,
        }
    }

    /// Handle `fh` reads `inode`'s version `meta` from now on instead of through `seen`:
    /// the read side it reads through. A rename's repointing that replaced `seen`
    /// meanwhile wins over this one.
    fn reread(
        &self,
        fh: u64,
        inode: &Inode,
        meta: &ObjMeta,
        seen: Arc<read::Handle>,
    ) -> Arc<read::Handle> {
        let i = &self.inner;
        let fresh = Arc::new(i.reads.open(&inode.key(), meta, seen.direct()));
        match i.handles.swap_read_side(fh, &seen, fresh.clone()) {
            Ok(old) => {
                i.reads.release(&old);
                fresh
            }
            Err(current) => {
                i.reads.release(&fresh);
                current.unwrap_or(seen)
            }
        }
    }

    /// Refuses writes from now on (EIO), waits for those in flight, and makes every byte
    /// written so far durable: what a stopping daemon does before it unmounts.
    pub async fn stop_writes(&self) {
        self.inner.writes.stop().await;
    }

    /// Makes every appended byte durable while writes go on (a sidecar told to stop that must
    /// keep serving until its pod's other containers end). Rewritten (staged) files are
    /// uploaded at their own fsync or close, never half-edited.
    pub async fn sync_writes(&self) {
        self.inner.writes.persist_all_appends().await;
    }

    /// Notes that process (thread) `pid` opened file handle `fh`: see `closer`. Pid 0 (the
    /// opener is outside the daemon's pid namespace) says nothing, and is not noted.
    pub fn note_opener(&self, fh: u64, pid: u32) {
        if pid != 0 {
            self.inner.handles.set_opener(fh, pid);
        }
    }

    /// Who closes file handle `fh` (or writes through it): thread `pid` of the opener's
    /// process, of another process, or of one this daemon cannot tell.
    pub fn closer(&self, fh: u64, pid: u32) -> Closer {
        let Some(opener) = self.inner.handles.opener(fh) else {
            return Closer::Unknown;
        };
        if pid == opener {
            return Closer::Opener;
        }
        if pid == 0 {
            return Closer::Unknown;
        }
        let proc = std::path::Path::new("/proc");
        if proc.join(format!("{pid}/task/{opener}")).exists() {
            Closer::Opener
        } else if proc.join(opener.to_string()).exists() {
            Closer::Other
        } else {
            // The opening thread is gone (or /proc hides it): its process is not known.
            Closer::Unknown
        }
    }

    /// A write through file handle `fh` by thread `pid`: one from the opener's process shows
    /// it still holds a descriptor, whatever it closed before (a shell redirection's child
    /// closes the descriptor it opened once it has a copy on its standard output).
    pub fn note_write_by(&self, fh: u64, pid: u32) {
        if self.inner.handles.opener_closed(fh) && self.closer(fh, pid) == Closer::Opener {
            self.inner.handles.set_opener_closed(fh, false);
        }
    }

    /// `close(2)` by the handle's opener: returns once the service persisted every byte
    /// written through `fh`; the close of a file's only writing handle ends its stream.
    pub async fn flush(&self, fh: u64) -> FsResult<()> {
        self.inner.handles.set_opener_closed(fh, true);
        match self.inner.handles.writer(fh) {
            Some(fw) => self.inner.writes.closing(&fw).await,
            None => Ok(()),
        }
    }

    /// `close(2)` of handle `fh` by a process other than its opener's (`Closer::Other`).
    /// While the opener writes, it leaves what the opener writes as it is
    /// (`Writes::flush_inherited`). Once the opener has closed a descriptor and not written
    /// since, the writing may have been left to that process
    /// (`subprocess.Popen(cmd, stdout=open(path, "wb"))`), or the opener may hold a copy it
    /// only passes on (a shell loop redirected to the file runs one command after another):
    /// answered as an fsync, which puts what was written in the bucket without ending the
    /// stream the next command goes on with.
    pub async fn flush_inherited(&self, fh: u64) -> FsResult<()> {
        let Some(fw) = self.inner.handles.writer(fh) else {
            return Ok(());
        };
        if self.inner.handles.opener_closed(fh) {
            self.inner.writes.flush(&fw).await
        } else {
            self.inner.writes.flush_inherited(&fw).await
        }
    }

    /// `fsync(2)` of handle `fh` on file `ino`: returns once the service persisted every byte
    /// written to the file, through any handle. A handle that only reads still covers what
    /// the file's writers wrote (coreutils' `sync FILE` opens the file read-only).
    pub async fn fsync(&self, ino: u64, fh: u64) -> FsResult<()> {
        match self.inner.handles.writer(fh) {
            Some(fw) => self.inner.writes.flush(&fw).await,
            None => self.inner.writes.settle(ino).await,
        }
    }

    /// Ends handle `fh`: its read side at once, its write stream when it was the last and no
    /// close(2) ended it already.
    pub async fn release_write(&self, fh: u64) {
        let Some((read, writer)) = self.inner.handles.remove_file(fh) else {
            return;
        };
        self.inner.reads.release(&read);
        // The listing of the file's directory, taken while it grew, holds an old size.
        if let Some(fw) = writer {
            let inode = self.inner.writes.release(fw).await;
            self.inner.sb.written(&inode);
        }
    }

    /// `setattr`. A size change goes through the file's writer (staging it); without an
    /// open writing handle, through a writer of its own that uploads at once.
    ///
    /// Owner and modes are fixed by the mount (`fs.uid`, `fs.gid`, `fs.file_mode`,
    /// `fs.dir_mode`): objects carry none. A chown to the mount's owner and group succeeds (it
    /// changes nothing), any other owner is EPERM. A chmod succeeds and changes nothing, as on
    /// gcsfuse: `tar -x`, `rsync -a` and `cp -p` set the modes of their sources, and failing
    /// them for every executable or private file would break them for no safety gained (the
    /// mount's modes are what the kernel enforces). A file's modification time is recorded
    /// in its object (`keep_mtime`); its access time is not kept (the mount is `noatime`).
    pub async fn setattr(&self, ino: u64, set: SetAttr) -> FsResult<Attr> {
        let i = &self.inner;
        if set.uid.is_some_and(|u| u != i.uid) || set.gid.is_some_and(|g| g != i.gid) {
            return Err(Errno(libc::EPERM));
        }
        if set.size.is_some() || set.mode.is_some() || set.mtime.is_some() || set.uid.is_some() {
            self.writable()?;
        }
        if let Some(size) = set.size {
            self.resize(ino, set.fh, size).await?;
        }
        // A size change comes with the kernel's "now" as the mtime: the new version has it
        // already, as its update time.
        if let Some(mtime) = set.mtime.filter(|_| set.size.is_none()) {
            self.keep_mtime(ino, mtime).await?;
        }
        let mut attr = self.getattr(ino).await?;
        attr.mtime = match set.mtime {
            Some(Mtime::At(t)) => t,
            Some(Mtime::Now) => SystemTime::now(),
            None => attr.mtime,
        };
        Ok(attr)
    }

    /// Records file `ino`'s new modification time in its object (see `Writes::set_mtime`),
    /// as gcsfuse does, so that `rsync -a`, `make` and a second mount see it. A directory's
    /// or a link's is accepted and not kept: folders carry no metadata, and a link's is
    /// its target's to gcsfuse.
    ///
    /// A directory rename under way moves the object without waiting for this (only a
    /// writer is held still by one): the time then goes to the old name, is refused, and
    /// is logged as not kept.
    async fn keep_mtime(&self, ino: u64, mtime: Mtime) -> FsResult<()> {
        let inode = self.inode(ino)?;
        if inode.kind != Kind::File {
            return Ok(());
        }
        let writes = &self.inner.writes;
        match writes.writer_for_mtime(ino) {
            Some(fw) => writes.set_mtime(&fw, mtime).await,
            None => {
                let meta = self.inner.sb.fresh_meta(&inode).await?;
                writes.record_mtime(&inode, meta.generation, mtime).await;
            }
        }
        self.inner.sb.written(&inode);
        Ok(())
    }

    async fn resize(&self, ino: u64, fh: Option<u64>, size: u64) -> FsResult<()> {
        let inode = self.inode(ino)?;
        match inode.kind {
            Kind::File => {}
            Kind::Dir => return Err(Errno::EISDIR),
            // The kernel truncates a link's target; a link itself has no size to set.
            Kind::Symlink => return Err(Errno::EINVAL),
        }
        let writes = &self.inner.writes;
        let own = fh.and_then(|fh| self.inner.handles.writer(fh));
        if let Some(fw) = own.filter(|_| writes.is_writing(ino)) {
            match writes.set_size(&fw, size).await {
                Err(Errno::EBADF) => {}
                done => return done,
            }
        }
        // truncate(2) by path, or through a handle that does not write. When the file has a
        // writer, the size change joins it and is uploaded with its writes (at their fsync or
        // close: uploading now would publish a half-written file); else a writer of our own
        // uploads at once. Which of the two is known where the writer is joined or started:
        // asked before, the last writing handle could close in between, leaving the change
        // to an upload whose failure nobody hears.
        let meta = self.inner.sb.fresh_meta(&inode).await?;
        let (fw, ours) = writes.attach_existing(&inode, meta.generation, meta.size);
        let resized = async {
            writes.set_size(&fw, size).await?;
            if ours {
                writes.flush(&fw).await?;
            }
            Ok(())
        }
        .await;
        writes.release(fw).await;
        self.inner.sb.written(&inode);
        resized
    }

    /// `access(2)` for writing: refused on a read-only mount.
    pub fn may_write(&self) -> FsResult<()> {
        self.writable()
    }
}
