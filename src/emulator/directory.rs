//! The directory backend: every non-hidden sub-directory of the root is a bucket, every file
//! an object named by its relative path, every directory a folder. Files changed on disk
//! behind our back are noticed (a new size or mtime is a new generation) when their name or
//! their directory is looked at (a list of a name's prefix looks at that name). Object metadata
//! (generation, metageneration, finalized or not, CRC32C, persisted size, custom metadata)
//! lives under `ROOT/.rapidfs-emulator/buckets/`: a snapshot and a journal of the changes
//! since (see `journal.rs`), durable before the change is acknowledged, so it survives a
//! restart, at O(1) cost a change. A change's files, renames and journal line are made
//! durable together by one `syncfs(2)` (`sync_root`). An unfinalized object's persisted
//! size is its file's length: a flush syncs the file and journals the new size without a
//! sync of its own, and loading extends a record the journal lost to the file. New
//! generations are written beside the tree and renamed into place, so readers of the old
//! one keep their bytes. Touches only files under the root.

use super::content::{Content, Data, Segments, WriteState};
use super::journal::Journals;
use super::store::{micros, Backend, BucketState, CustomMetadata, Entry, Stamp, Store, Touched};
use super::tree::{bucket_dirs, walk};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tonic::Status;

/// The hidden directory holding metadata and temporary files.
const META_DIR: &str = ".rapidfs-emulator";

/// Objects as files under a root directory.
pub(crate) struct DirectoryBackend {
    root: PathBuf,
    tmp: PathBuf,
    tmp_counter: AtomicU64,
    journals: Journals,
    /// Held (an exclusive `flock`) for as long as this backend serves the root: a second
    /// emulator over it would clear the first one's temporary files and unlink the journals
    /// it appends to, so that what it acknowledged afterwards would not survive a restart.
    /// Also what `sync_root` syncs through (the temporary files renamed into the buckets
    /// share its filesystem, or the renames would fail).
    lock: File,
    /// Why a sync failed, if one did: the kernel reports a writeback error once, so what
    /// the disk holds is unknown from then on, and every change is refused until a restart
    /// reloads it (as databases stop after a failed fsync).
    sync_failed: Mutex<Option<String>>,
}

/// What the metadata file keeps of one object.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    generation: i64,
    metageneration: i64,
    /// Persisted (acknowledged) size; of an unfinalized object, at least that (its file's
    /// length is its size, see `load`).
    size: u64,
    crc32c: Option<u32>,
    /// Microseconds since the epoch; absent = unfinalized (appendable).
    finalized_us: Option<i64>,
    create_us: i64,
    update_us: i64,
    /// The file's size and mtime (ns) when last seen, for finalized objects.
    stamp: Option<(u64, i128)>,
    /// Custom metadata; absent when empty, as in files written before it was kept.
    #[serde(default, skip_serializing_if = "CustomMetadata::is_empty")]
    metadata: CustomMetadata,
    /// The inode number of an unfinalized object's file (`Entry::file_id`); absent for a
    /// finalized one, and in files written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    file_id: Option<u64>,
}

fn io_status(what: &str, path: &Path, e: io::Error) -> Status {
    let msg = format!("{what} {}: {e}", path.display());
    match e.kind() {
        io::ErrorKind::NotFound => Status::not_found(msg),
        io::ErrorKind::AlreadyExists => Status::already_exists(msg),
        io::ErrorKind::PermissionDenied => Status::permission_denied(msg),
        io::ErrorKind::DirectoryNotEmpty => Status::failed_precondition(msg),
        io::ErrorKind::IsADirectory | io::ErrorKind::NotADirectory => {
            Status::failed_precondition(msg)
        }
        _ => Status::internal(msg),
    }
}

fn from_us(us: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(us.max(0) as u64)
}

/// What the metadata keeps of live object `e`.
fn record_of(e: &Entry) -> Record {
    let st = e.content.state();
    Record {
        generation: e.content.generation,
        metageneration: e.metageneration,
        size: st.persisted,
        crc32c: st.crc_known.then_some(st.persisted_crc),
        finalized_us: st.finalized.map(micros),
        create_us: micros(e.create_time),
        update_us: micros(st.update_time),
        stamp: e.stamp,
        metadata: e.metadata.clone(),
        file_id: st.finalized.is_none().then_some(e.file_id).flatten(),
    }
}

/// Locks `m`, poisoned or not: it holds plain data.
fn lock_unpoisoned<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn stamp_of(meta: &fs::Metadata) -> Stamp {
    (
        meta.len(),
        meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128,
    )
}

/// The CRC32C of bytes `from..to` of `file`, computed on from `crc`, that of its first `from`.
fn crc_on(file: &File, from: u64, to: u64, mut crc: u32) -> io::Result<u32> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; to.saturating_sub(from).min(1 << 20) as usize];
    let mut at = from;
    while at < to {
        let want = (to - at).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..want], at)?;
        crc = crate::gcs::crc32c_concat(crc, at, crate::gcs::crc32c(&buf[..want]), want);
        at += want as u64;
    }
    Ok(crc)
}

/// Makes the first `len` bytes of the file at `path` durable and returns their CRC32C,
/// computed on from `crc`, that of its first `from` bytes (unknown stays unknown).
fn adopt_tail(path: &Path, from: u64, crc: Option<u32>, len: u64) -> io::Result<Option<u32>> {
    let file = File::open(path)?;
    file.sync_data()?;
    crc.map(|crc| crc_on(&file, from, len, crc)).transpose()
}

/// Whether the file at `path` begins with the `len` bytes whose CRC32C is `crc`: a file
/// with another inode number that still holds them is the same object in a copied or
/// restored root, not a new file installed over it.
fn begins_with(path: &Path, len: u64, crc: Option<u32>) -> bool {
    let Some(crc) = crc else {
        return false;
    };
    File::open(path).and_then(|f| crc_on(&f, 0, len, 0)).ok() == Some(crc)
}

impl DirectoryBackend {
    /// Writes every record of `bucket` as a new snapshot, which starts a new journal.
    fn snapshot(&self, bucket: &str, state: &BucketState) -> Result<(), Status> {
        let records = state
            .objects
            .iter()
            .map(|(name, e)| (name.clone(), record_of(e)))
            .collect();
        self.journals.snapshot(bucket, records, &self.temp_path())
    }

    /// A backend over `root` (which must exist).
    pub fn new(root: PathBuf) -> anyhow::Result<DirectoryBackend> {
        let meta = root.join(META_DIR);
        let tmp = meta.join("tmp");
        fs::create_dir_all(meta.join("buckets"))
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", meta.display()))?;
        let lock_path = meta.join("lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", lock_path.display()))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                anyhow::bail!("{} is served by another emulator already", root.display())
            }
            Err(fs::TryLockError::Error(e)) => {
                anyhow::bail!("cannot lock {}: {e}", lock_path.display())
            }
        }
        // Leftovers of a crash were never acknowledged.
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir_all(&tmp)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", tmp.display()))?;
        Ok(DirectoryBackend {
            journals: Journals::new(meta.join("buckets")),
            root,
            tmp,
            tmp_counter: AtomicU64::new(0),
            lock,
            sync_failed: Mutex::new(None),
        })
    }

    fn path(&self, bucket: &str, name: &str) -> PathBuf {
        self.root.join(bucket).join(name)
    }

    /// Makes everything written under the root durable: the change's files, renames and
    /// removals and its journal line, in one `syncfs(2)`, where a sync of each (the
    /// temporary file, the directory it was renamed into, the journal) cost a small file
    /// three disk flushes. It flushes whatever else is dirty on that filesystem too, so
    /// the root is best on a filesystem of its own when other work writes heavily there.
    fn sync_root(&self) -> Result<(), Status> {
        // SAFETY: syncfs reads no memory; the descriptor is open for as long as `self`.
        if unsafe { libc::syncfs(self.lock.as_raw_fd()) } == 0 {
            return Ok(());
        }
        let e = io_status(
            "sync the filesystem of",
            &self.root,
            io::Error::last_os_error(),
        );
        tracing::error!("{}; refusing every change until a restart", e.message());
        *lock_unpoisoned(&self.sync_failed) = Some(e.message().to_string());
        Err(e)
    }

    fn temp_path(&self) -> PathBuf {
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        self.tmp.join(format!("{}-{n}", std::process::id()))
    }

    /// Creates the parent directories of `path` (folders of the bucket).
    fn make_parents(&self, path: &Path) -> Result<(), Status> {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| io_status("create directory", parent, e))?;
        }
        Ok(())
    }

    /// Renames `from` (a finished temporary file, or a moved object's file) onto `dest`;
    /// the change's `save` makes it durable. A directory in the way refuses it and leaves
    /// `from` where it is.
    fn install(&self, from: &Path, dest: &Path) -> Result<(), Status> {
        self.make_parents(dest)?;
        if dest.is_dir() {
            return Err(Status::failed_precondition(format!(
                "{} is a directory (a folder is in the way)",
                dest.display()
            )));
        }
        fs::rename(from, dest).map_err(|e| io_status("rename into", dest, e))
    }

    /// `install`s the temporary file `tmp`, which is removed if it cannot be.
    fn install_temporary(&self, tmp: &Path, dest: &Path) -> Result<(), Status> {
        let installed = self.install(tmp, dest);
        if installed.is_err() {
            let _ = fs::remove_file(tmp);
        }
        installed
    }

    /// A finalized entry for a file found on disk (its checksum is not computed).
    fn found_entry(&self, store: &Store, path: PathBuf, meta: &fs::Metadata) -> Entry {
        let now = SystemTime::now();
        let mtime = meta.modified().unwrap_or(now);
        Entry {
            content: Content::new(
                store.next_generation(),
                Data::File(path),
                WriteState::finalized(meta.len(), None, mtime),
            ),
            metageneration: 1,
            metadata: CustomMetadata::new(),
            create_time: mtime,
            stamp: Some(stamp_of(meta)),
            file_id: None,
        }
    }

    /// Brings the entry of `name` in line with the file seen; true when it changed.
    fn reconcile_file(
        &self,
        store: &Store,
        state: &mut BucketState,
        name: &str,
        path: PathBuf,
        meta: &fs::Metadata,
    ) -> bool {
        let seen = stamp_of(meta);
        if let Some(e) = state.objects.get_mut(name) {
            let finalized = e.content.state().finalized.is_some();
            // Unfinalized objects belong to their writer: their files change under us by design.
            if !finalized || e.stamp == Some(seen) {
                return false;
            }
            if e.stamp.is_none() {
                e.stamp = Some(seen);
                return true;
            }
        }
        let entry = self.found_entry(store, path, meta);
        if let Some(old) = state.objects.insert(name.to_string(), entry) {
            old.content.state().gone = true;
        }
        true
    }

    fn forget(state: &mut BucketState, name: &str) -> bool {
        match state.objects.remove(name) {
            Some(old) => {
                old.content.state().gone = true;
                true
            }
            None => false,
        }
    }
}

/// The directory to walk for `prefix` ("a/b/c" -> "a/b/") and its relative name.
fn walk_base(prefix: &str) -> &str {
    match prefix.rfind('/') {
        Some(i) => &prefix[..=i],
        None => "",
    }
}

impl Backend for DirectoryBackend {
    fn check_name(&self, name: &str) -> Result<(), Status> {
        let refuse = |why: &str| {
            Err(Status::invalid_argument(format!(
                "object name {name:?} cannot be stored in the directory backend: {why}"
            )))
        };
        if name.contains('\0') {
            return refuse("it contains NUL");
        }
        if name.starts_with('/') {
            return refuse("it is an absolute path");
        }
        for seg in name.split('/') {
            match seg {
                "" => return refuse("it has an empty path segment"),
                "." | ".." => return refuse("it has a '.' or '..' segment"),
                s if s.len() > 255 => return refuse("a path segment is longer than 255 bytes"),
                _ => {}
            }
        }
        Ok(())
    }

    fn load(&self, store: &Store) -> anyhow::Result<BTreeMap<String, BucketState>> {
        let mut out = BTreeMap::new();
        for bucket in bucket_dirs(&self.root)? {
            let records: BTreeMap<String, Record> = self.journals.load(&bucket)?;
            let now = SystemTime::now();
            let mut state = BucketState::new(now);
            let (mut files, mut folders) = (Vec::new(), Vec::new());
            walk(&self.root.join(&bucket), "", &mut files, &mut folders)?;
            for f in folders {
                state.folders.insert(f, now);
            }
            for (name, path) in files {
                let meta = fs::metadata(&path)?;
                let Some(rec) = records.get(&name) else {
                    let e = self.found_entry(store, path, &meta);
                    state.objects.insert(name, e);
                    continue;
                };
                let unfinalized = rec.finalized_us.is_none();
                let same = rec.stamp == Some(stamp_of(&meta));
                // A file other than the unfinalized object's own was installed under its
                // name by a put whose record a crash lost: its bytes are not this object's.
                // A root copied or restored elsewhere gives every file a new inode number,
                // so a file that still begins with the object's bytes is kept.
                let replaced = unfinalized
                    && rec.file_id.is_some_and(|f| f != meta.ino())
                    && meta.len() >= rec.size
                    && !begins_with(&path, rec.size, rec.crc32c);
                if replaced {
                    tracing::warn!(path = %path.display(), "an unfinalized object's file was replaced by other bytes; they are served as a new object");
                }
                if !unfinalized && !same || unfinalized && (replaced || meta.len() < rec.size) {
                    let e = self.found_entry(store, path, &meta);
                    state.objects.insert(name, e);
                    continue;
                }
                // An unfinalized object grew past its record: its file is its size (a flush's
                // record is written without a sync, and may be lost with a crash). Bytes
                // written but not yet synced when the emulator stopped count as persisted,
                // as a service may persist more than it acknowledged (a writer takes over
                // from the size it is told): they are synced here before anyone is told.
                let (size, crc, updated) = if unfinalized && meta.len() > rec.size {
                    let crc = adopt_tail(&path, rec.size, rec.crc32c, meta.len())?;
                    let mtime = meta.modified().map_or(0, micros);
                    (meta.len(), crc, rec.update_us.max(mtime))
                } else {
                    (rec.size, rec.crc32c, rec.update_us)
                };
                let mut ws = WriteState::finalized(size, crc, from_us(updated));
                ws.finalized = rec.finalized_us.map(from_us);
                state.objects.insert(
                    name,
                    Entry {
                        content: Content::new(rec.generation, Data::File(path), ws),
                        metageneration: rec.metageneration,
                        metadata: rec.metadata.clone(),
                        create_time: from_us(rec.create_us),
                        stamp: rec.stamp,
                        file_id: unfinalized.then_some(meta.ino()),
                    },
                );
            }
            self.save(&bucket, &state, Touched::All)
                .map_err(|s| anyhow::anyhow!("{}", s.message()))?;
            out.insert(bucket, state);
        }
        Ok(out)
    }

    fn refresh(
        &self,
        store: &Store,
        bucket: &str,
        state: &mut BucketState,
        prefix: &str,
    ) -> Result<bool, Status> {
        // Nothing this backend could have stored lies under such a prefix, and its path
        // could lead out of the bucket.
        if !prefix.is_empty() && self.check_name(prefix.trim_end_matches('/')).is_err() {
            return Ok(false);
        }
        let base = walk_base(prefix);
        let dir = self.root.join(bucket).join(base);
        let rest = &prefix[base.len()..];
        let (mut files, mut folders) = (Vec::new(), Vec::new());
        if rest.is_empty() {
            walk(&dir, base, &mut files, &mut folders).map_err(|e| io_status("list", &dir, e))?;
            if !base.is_empty() && dir.is_dir() {
                folders.push(base.to_string());
            }
        } else {
            // A name's prefix (a lookup's probe) looks at that name alone, as a file or a
            // directory: reading the whole directory to find the other names that start
            // with it cost a walk of every entry per create in a directory of many files.
            // Those other names are looked at when their directory is listed.
            let path = dir.join(rest);
            match fs::metadata(&path) {
                Ok(m) if m.is_file() => files.push((prefix.to_string(), path)),
                Ok(m) if m.is_dir() => {
                    let below = format!("{prefix}/");
                    walk(&path, &below, &mut files, &mut folders)
                        .map_err(|e| io_status("list", &path, e))?;
                    folders.push(below);
                }
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                    ) => {}
                // Not "gone": an object must not be forgotten for a failed look.
                Err(e) => return Err(io_status("stat", &path, e)),
            }
        }
        let looked_at = |k: &str| {
            k.starts_with(prefix)
                && (rest.is_empty()
                    || k.len() == prefix.len()
                    || k[prefix.len()..].starts_with('/'))
        };
        let mut changed = false;
        let mut seen = HashSet::new();
        for (name, path) in files {
            if !name.starts_with(prefix) {
                continue;
            }
            let Ok(meta) = fs::metadata(&path) else {
                continue;
            };
            changed |= self.reconcile_file(store, state, &name, path, &meta);
            seen.insert(name);
        }
        let stale: Vec<String> = state
            .objects
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter(|(k, _)| looked_at(k) && !seen.contains(*k))
            .map(|(k, _)| k.clone())
            .collect();
        for name in stale {
            changed |= Self::forget(state, &name);
        }
        let found: HashSet<String> = folders
            .into_iter()
            .filter(|f| f.starts_with(prefix))
            .collect();
        let gone: Vec<String> = state
            .folders
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter(|(k, _)| looked_at(k) && !found.contains(*k))
            .map(|(k, _)| k.clone())
            .collect();
        for f in gone {
            state.folders.remove(&f);
        }
        for f in found {
            state.folders.entry(f).or_insert_with(SystemTime::now);
        }
        Ok(changed)
    }

    fn refresh_one(
        &self,
        store: &Store,
        bucket: &str,
        state: &mut BucketState,
        name: &str,
    ) -> Result<bool, Status> {
        if self.check_name(name).is_err() {
            return Ok(false);
        }
        let path = self.path(bucket, name);
        match fs::metadata(&path) {
            Ok(meta) if meta.is_file() => Ok(self.reconcile_file(store, state, name, path, &meta)),
            Ok(_) => Ok(Self::forget(state, name)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Self::forget(state, name)),
            Err(e) => Err(io_status("stat", &path, e)),
        }
    }

    fn create_bucket(&self, bucket: &str) -> Result<(), Status> {
        let dir = self.root.join(bucket);
        fs::create_dir_all(&dir).map_err(|e| io_status("create bucket directory", &dir, e))
    }

    fn materialize(
        &self,
        bucket: &str,
        name: &str,
        segs: Arc<RwLock<Segments>>,
    ) -> Result<Data, Status> {
        let tmp = self.temp_path();
        let dest = self.path(bucket, name);
        // A rename over a file must not reach the disk before the bytes it puts there: a
        // crash in between would leave the name with neither version, and the old one may
        // be acknowledged. A new name risks no acknowledged object (a crash can leave it
        // empty, found as a new object), so its bytes wait for the change's one sync.
        let replaces =
            !matches!(fs::symlink_metadata(&dest), Err(e) if e.kind() == io::ErrorKind::NotFound);
        let write = || -> io::Result<()> {
            let mut f = File::create(&tmp)?;
            let segs = match segs.read() {
                Ok(s) => s,
                Err(poisoned) => poisoned.into_inner(),
            };
            for s in segs.iter() {
                f.write_all(s)?;
            }
            if replaces && segs.len() > 0 {
                f.sync_data()?;
            }
            Ok(())
        };
        write().map_err(|e| io_status("write", &tmp, e))?;
        self.install_temporary(&tmp, &dest)?;
        Ok(Data::File(dest))
    }

    fn remove(&self, bucket: &str, name: &str) -> Result<(), Status> {
        let path = self.path(bucket, name);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_status("remove", &path, e)),
        }
    }

    fn rename(&self, bucket: &str, from: &str, to: &str, _data: &Data) -> Result<Data, Status> {
        let src = self.path(bucket, from);
        let dest = self.path(bucket, to);
        self.install(&src, &dest)?;
        Ok(Data::File(dest))
    }

    fn create_folder(&self, bucket: &str, folder: &str) -> Result<(), Status> {
        let dir = self.path(bucket, folder.trim_end_matches('/'));
        fs::create_dir_all(&dir).map_err(|e| io_status("create folder", &dir, e))
    }

    fn delete_folder(&self, bucket: &str, folder: &str) -> Result<(), Status> {
        let dir = self.path(bucket, folder.trim_end_matches('/'));
        fs::remove_dir(&dir).map_err(|e| io_status("remove folder", &dir, e))
    }

    fn rename_folder(&self, bucket: &str, from: &str, to: &str) -> Result<(), Status> {
        let src = self.path(bucket, from.trim_end_matches('/'));
        let dest = self.path(bucket, to.trim_end_matches('/'));
        self.make_parents(&dest)?;
        fs::rename(&src, &dest).map_err(|e| io_status("rename folder to", &dest, e))
    }

    fn data_for(&self, bucket: &str, name: &str, _old: &Data) -> Data {
        Data::File(self.path(bucket, name))
    }

    fn save(&self, bucket: &str, state: &BucketState, touched: Touched<'_>) -> Result<(), Status> {
        self.check_healthy()?;
        let (names, durable) = match touched {
            Touched::Names(names) => (Some(names), true),
            Touched::Grown(names) => (Some(names), false),
            Touched::All => (None, true),
        };
        let saved = match names {
            Some(names) => {
                let changes = names
                    .iter()
                    .map(|n| (n.to_string(), state.objects.get(*n).map(record_of)))
                    .collect();
                match self.journals.append(bucket, changes, state.objects.len()) {
                    Ok(false) => Ok(()),
                    Ok(true) => self.snapshot(bucket, state),
                    // The change is made in memory and the journal given up: a snapshot of
                    // memory now holds it, so it can still be acknowledged, and keeps a
                    // restart from finding the moved or written file without its record.
                    Err(e) => self.snapshot(bucket, state).map_err(|_| e),
                }
            }
            None => self.snapshot(bucket, state),
        };
        saved?;
        if durable {
            self.sync_root()?;
        }
        Ok(())
    }

    fn check_healthy(&self) -> Result<(), Status> {
        match &*lock_unpoisoned(&self.sync_failed) {
            None => Ok(()),
            Some(why) => Err(Status::internal(format!(
                "{why}: what the disk holds is unknown, so no change is accepted until the emulator restarts"
            ))),
        }
    }

    fn stamp(&self, data: &Data) -> Option<Stamp> {
        match data {
            Data::File(path) => fs::metadata(path).ok().map(|m| stamp_of(&m)),
            Data::Mem(_) => None,
        }
    }

    fn file_id(&self, data: &Data) -> Option<u64> {
        match data {
            Data::File(path) => fs::metadata(path).ok().map(|m| m.ino()),
            Data::Mem(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{DirectoryBackend, Record};

    #[test]
    fn a_root_is_served_by_one_emulator_at_a_time() {
        let root = tempfile::tempdir().expect("tempdir");
        let first = DirectoryBackend::new(root.path().to_path_buf()).expect("first");
        let err = DirectoryBackend::new(root.path().to_path_buf())
            .err()
            .expect("a second backend over the same root is refused");
        assert!(
            err.to_string().contains("served by another emulator"),
            "{err}"
        );
        drop(first);
        DirectoryBackend::new(root.path().to_path_buf())
            .expect("free again once the first is gone");
    }

    #[test]
    fn records_written_before_custom_metadata_was_kept_still_load() {
        let old = r#"{"generation":5,"metageneration":1,"size":3,"crc32c":null,
            "finalized_us":1,"create_us":1,"update_us":1,"stamp":null}"#;
        let r: Record = serde_json::from_str(old).expect("an old record loads");
        assert!(r.metadata.is_empty());
        let again = serde_json::to_string(&r).expect("encodes");
        assert!(!again.contains("metadata"), "empty metadata is not written");
    }
}
