//! The object model shared by both backends: buckets, objects, generations,
//! metagenerations, folders, preconditions and writer ownership. The backend (memory or
//! directory) only stores bytes and metadata; every rule of the API lives here.
//! Touches the backend it was given and nothing else.

use super::bucket_names::check_bucket_name;
use super::content::{Content, ContentReader, ContentWriter, Data, Segments, WriteState};
use super::preconditions::Preconditions;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};
use tonic::Status;

/// How a file looked on disk when last seen: (size, mtime in ns). A finalized object whose
/// file no longer looks like this was changed behind our back: a new generation.
pub(crate) type Stamp = (u64, i128);

/// Which objects' metadata a change touched: a backend that keeps metadata saves only
/// those (O(1) a change), or everything when the change may have touched any.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Touched<'a> {
    /// These names, live or gone.
    Names(&'a [&'a str]),
    /// These unfinalized objects, grown by a flush whose synced bytes already carry the new
    /// size: their records need no sync of their own.
    Grown(&'a [&'a str]),
    /// Anything: a folder renamed, files found changed on disk.
    All,
}

/// An object's custom metadata (`Object.metadata`): key-value pairs its writer set.
pub(crate) type CustomMetadata = BTreeMap<String, String>;

/// The most bytes of keys and values an object's custom metadata may hold, as on GCS.
const MAX_CUSTOM_METADATA_BYTES: usize = 8 * 1024;

/// Refuses custom metadata larger than the service allows.
pub(crate) fn check_custom_metadata(metadata: &CustomMetadata) -> Result<(), Status> {
    let bytes: usize = metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_CUSTOM_METADATA_BYTES {
        return Err(Status::invalid_argument(format!(
            "custom metadata of {bytes} bytes exceeds the limit of {MAX_CUSTOM_METADATA_BYTES}"
        )));
    }
    Ok(())
}

/// One live object: its current generation plus metadata outside the bytes.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// The live generation.
    pub content: Arc<Content>,
    /// Bumped by metadata changes (a folder rename).
    pub metageneration: i64,
    /// The custom metadata its writer set; a move or rename keeps it.
    pub metadata: CustomMetadata,
    /// When this generation was created.
    pub create_time: SystemTime,
    /// How the file looked when last seen (directory backend only).
    pub stamp: Option<Stamp>,
    /// The `Backend::file_id` of an unfinalized object's bytes: a put over the object
    /// installs new bytes before it records them, and after a crash between the two, a
    /// restart must not take the new bytes for the old object's tail.
    pub file_id: Option<u64>,
}

/// One bucket: objects by name and folders ("a/b/") by name.
#[derive(Debug, Clone)]
pub(crate) struct BucketState {
    /// Live objects, sorted by name.
    pub objects: BTreeMap<String, Entry>,
    /// Folders (names end with '/'), with their creation time.
    pub folders: BTreeMap<String, SystemTime>,
    /// When the bucket was created (or found).
    pub create_time: SystemTime,
}

impl BucketState {
    /// An empty bucket.
    pub fn new(create_time: SystemTime) -> BucketState {
        BucketState {
            objects: BTreeMap::new(),
            folders: BTreeMap::new(),
            create_time,
        }
    }
}

/// Where bytes and metadata are kept: memory, or a directory tree.
pub(crate) trait Backend: Send + Sync {
    /// Refuses object names this backend cannot hold.
    fn check_name(&self, name: &str) -> Result<(), Status>;
    /// Every bucket and its objects at start.
    fn load(&self, store: &Store) -> anyhow::Result<BTreeMap<String, BucketState>>;
    /// Brings the index of `bucket` under `prefix` in line with what is stored; returns
    /// true when it changed something.
    fn refresh(
        &self,
        store: &Store,
        bucket: &str,
        state: &mut BucketState,
        prefix: &str,
    ) -> Result<bool, Status>;
    /// Like `refresh`, for the one object `name`.
    fn refresh_one(
        &self,
        store: &Store,
        bucket: &str,
        state: &mut BucketState,
        name: &str,
    ) -> Result<bool, Status>;
    /// Makes room for a new bucket.
    fn create_bucket(&self, bucket: &str) -> Result<(), Status>;
    /// Stores complete bytes as the new generation of `name` (replacing the old).
    fn materialize(
        &self,
        bucket: &str,
        name: &str,
        segs: Arc<RwLock<Segments>>,
    ) -> Result<Data, Status>;
    /// Removes the stored bytes of `name`.
    fn remove(&self, bucket: &str, name: &str) -> Result<(), Status>;
    /// Moves the stored bytes of `from` to `to`; returns their new place.
    fn rename(&self, bucket: &str, from: &str, to: &str, data: &Data) -> Result<Data, Status>;
    /// Creates a folder ("a/b/").
    fn create_folder(&self, bucket: &str, folder: &str) -> Result<(), Status>;
    /// Removes an empty folder.
    fn delete_folder(&self, bucket: &str, folder: &str) -> Result<(), Status>;
    /// Renames a folder and everything under it.
    fn rename_folder(&self, bucket: &str, from: &str, to: &str) -> Result<(), Status>;
    /// Where the bytes of `name` live after a folder rename.
    fn data_for(&self, bucket: &str, name: &str, old: &Data) -> Data;
    /// Writes the metadata of `bucket` durably: of the objects `touched` names, or of all.
    /// What the calls above stored since the last `save` is made durable with it (the
    /// directory backend syncs them all at once here), so a change is acknowledged only
    /// after its `save`.
    fn save(&self, bucket: &str, state: &BucketState, touched: Touched<'_>) -> Result<(), Status>;
    /// Refuses every change once the backend can no longer tell what its storage holds
    /// (a failed disk sync); a restart reloads it.
    fn check_healthy(&self) -> Result<(), Status> {
        Ok(())
    }
    /// How the stored bytes look now (size, mtime), if the backend can tell.
    fn stamp(&self, data: &Data) -> Option<Stamp>;
    /// What tells the stored bytes apart from bytes stored anew under the same name (a
    /// file's inode number), if the backend can tell.
    fn file_id(&self, data: &Data) -> Option<u64>;
}

/// Microseconds since the epoch.
pub(crate) fn micros(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// The object store: every bucket's index behind one lock, the backend behind it.
pub(crate) struct Store {
    backend: Box<dyn Backend>,
    buckets: Mutex<BTreeMap<String, BucketState>>,
    last_generation: AtomicI64,
    last_token: AtomicU64,
}

impl Store {
    /// A store over `backend`, loaded from it.
    pub fn open(backend: Box<dyn Backend>) -> anyhow::Result<Arc<Store>> {
        let store = Store {
            backend,
            buckets: Mutex::new(BTreeMap::new()),
            last_generation: AtomicI64::new(0),
            last_token: AtomicU64::new(0),
        };
        let loaded = store.backend.load(&store)?;
        let max_gen = loaded
            .values()
            .flat_map(|b| b.objects.values().map(|e| e.content.generation))
            .max()
            .unwrap_or(0);
        store.last_generation.fetch_max(max_gen, Ordering::Relaxed);
        *store.lock() = loaded;
        Ok(Arc::new(store))
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, BucketState>> {
        match self.buckets.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// A new generation number: the time in microseconds, strictly increasing.
    pub fn next_generation(&self) -> i64 {
        let now = micros(SystemTime::now());
        let mut last = self.last_generation.load(Ordering::Relaxed);
        loop {
            let next = now.max(last + 1);
            match self.last_generation.compare_exchange(
                last,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return next,
                Err(actual) => last = actual,
            }
        }
    }

    /// A new writer token (never 0).
    pub fn next_token(&self) -> u64 {
        let base = self.last_token.fetch_add(1, Ordering::Relaxed) + 1;
        base ^ (rand::random::<u64>() << 20) | 1 << 63
    }

    /// Refuses names the service refuses (`check_service_name`) and those the backend
    /// cannot hold.
    pub fn check_name(&self, name: &str) -> Result<(), Status> {
        check_service_name(name)?;
        self.backend.check_name(name)
    }

    /// `check_name` for folder `folder` (which ends in `/`): the service's rules count the
    /// slash in a folder's name, the backend holds it without.
    fn check_new_folder(&self, folder: &str) -> Result<(), Status> {
        check_service_name(folder)?;
        self.backend.check_name(folder.trim_end_matches('/'))
    }

    /// Runs `f` on the bucket's state, refreshed for `prefix` (or one object) first.
    /// Refuses a change once the backend can no longer tell what its storage holds: a
    /// writer checks before its bytes or its finish count as stored.
    pub fn check_healthy(&self) -> Result<(), Status> {
        self.backend.check_healthy()
    }

    fn with_bucket<T>(
        &self,
        bucket: &str,
        refresh: Refresh<'_>,
        f: impl FnOnce(&mut BucketState) -> Result<T, Status>,
    ) -> Result<T, Status> {
        let mut all = self.lock();
        let state = all
            .get_mut(bucket)
            .ok_or_else(|| Status::not_found(format!("bucket {bucket:?} does not exist")))?;
        let changed = self.refresh(bucket, state, refresh)?;
        if changed {
            self.backend.save(bucket, state, Touched::All)?;
        }
        f(state)
    }

    /// Runs `f` on the bucket's state and, if it succeeded, saves the metadata of the
    /// objects it `touched` (of all of them when the refresh before it changed any).
    fn mutate<T>(
        &self,
        bucket: &str,
        refresh: Refresh<'_>,
        touched: Touched<'_>,
        f: impl FnOnce(&mut BucketState) -> Result<T, Status>,
    ) -> Result<T, Status> {
        let mut all = self.lock();
        // Under the lock: a sync fails only inside a `save`, which holds it too.
        self.backend.check_healthy()?;
        let state = all
            .get_mut(bucket)
            .ok_or_else(|| Status::not_found(format!("bucket {bucket:?} does not exist")))?;
        let refreshed = self.refresh(bucket, state, refresh)?;
        let out = f(state)?;
        let touched = if refreshed { Touched::All } else { touched };
        self.backend.save(bucket, state, touched)?;
        Ok(out)
    }

    /// Brings `state` in line with what the backend holds under `refresh`; true when that
    /// changed it.
    fn refresh(
        &self,
        bucket: &str,
        state: &mut BucketState,
        refresh: Refresh<'_>,
    ) -> Result<bool, Status> {
        Ok(match refresh {
            Refresh::None => false,
            Refresh::Prefix(p) => self.backend.refresh(self, bucket, state, p)?,
            Refresh::One(n) => self.backend.refresh_one(self, bucket, state, n)?,
            Refresh::Two(a, b) => {
                let a = self.backend.refresh_one(self, bucket, state, a)?;
                self.backend.refresh_one(self, bucket, state, b)? || a
            }
        })
    }

    /// The bucket's creation time, if it exists.
    pub fn bucket(&self, bucket: &str) -> Result<SystemTime, Status> {
        self.with_bucket(bucket, Refresh::None, |b| Ok(b.create_time))
    }

    /// Creates a bucket (no-op if it exists).
    pub fn create_bucket(&self, bucket: &str) -> Result<(), Status> {
        check_bucket_name(bucket)?;
        let mut all = self.lock();
        self.backend.check_healthy()?;
        if !all.contains_key(bucket) {
            self.backend.create_bucket(bucket)?;
            let state = BucketState::new(SystemTime::now());
            self.backend.save(bucket, &state, Touched::All)?;
            all.insert(bucket.to_string(), state);
        }
        Ok(())
    }

    /// The live object (generation 0) or the given generation if it is the live one.
    pub fn get(&self, bucket: &str, name: &str, generation: i64) -> Result<Entry, Status> {
        self.with_bucket(bucket, Refresh::One(name), |b| {
            Ok(entry_of(b, bucket, name, generation)?.clone())
        })
    }

    /// As `get`, with the entry's bytes opened for reading while no change can come
    /// between: a new generation replaces its file under the same path, and one opened
    /// after the lookup would serve the new generation's bytes as the old one's.
    pub(crate) fn open_for_read(
        &self,
        bucket: &str,
        name: &str,
        generation: i64,
    ) -> Result<(Entry, ContentReader), Status> {
        self.with_bucket(bucket, Refresh::One(name), |b| {
            let e = entry_of(b, bucket, name, generation)?;
            let reader = e
                .content
                .open_reader()
                .map_err(|err| Status::internal(format!("cannot open {name:?}: {err}")))?;
            Ok((e.clone(), reader))
        })
    }

    /// A snapshot of the bucket for listing, refreshed under `prefix`.
    pub fn snapshot_for_list<T>(
        &self,
        bucket: &str,
        prefix: &str,
        f: impl FnOnce(&BucketState) -> T,
    ) -> Result<T, Status> {
        self.with_bucket(bucket, Refresh::Prefix(prefix), |b| Ok(f(b)))
    }

    /// Creates a new appendable generation holding `initial` (persisted), with `metadata`,
    /// owned by a new writer.
    pub fn create_appendable(
        &self,
        bucket: &str,
        name: &str,
        pre: Preconditions,
        metadata: CustomMetadata,
        initial: Segments,
    ) -> Result<(Entry, ContentWriter), Status> {
        self.check_name(name)?;
        check_custom_metadata(&metadata)?;
        let (len, crc) = (initial.len(), initial.crc());
        self.mutate(bucket, Refresh::One(name), Touched::Names(&[name]), |b| {
            pre.check(live(b, name))?;
            check_not_folder(b, name)?;
            let data = self
                .backend
                .materialize(bucket, name, Arc::new(RwLock::new(initial)))?;
            let file_id = self.backend.file_id(&data);
            let now = SystemTime::now();
            let token = self.next_token();
            let mut state = WriteState::appendable(token, now);
            (state.written, state.persisted) = (len, len);
            (state.crc, state.persisted_crc) = (crc, crc);
            let content = Content::new(self.next_generation(), data, state);
            // Opened before the index changes, so that a writer that cannot open leaves it
            // as it was.
            let writer = content.open_writer(token)?;
            let entry = Entry {
                content,
                metageneration: 1,
                metadata,
                create_time: now,
                stamp: None,
                file_id,
            };
            replace(b, name, entry.clone());
            add_parent_folders(b, name);
            Ok((entry, writer))
        })
    }

    /// Stores complete bytes, with `metadata`, as a new finalized generation.
    pub fn put(
        &self,
        bucket: &str,
        name: &str,
        segs: Segments,
        pre: Preconditions,
        metadata: CustomMetadata,
    ) -> Result<Entry, Status> {
        self.check_name(name)?;
        check_custom_metadata(&metadata)?;
        let len = segs.len();
        let crc = segs.crc();
        let segs = Arc::new(RwLock::new(segs));
        self.mutate(bucket, Refresh::One(name), Touched::Names(&[name]), |b| {
            pre.check(live(b, name))?;
            check_not_folder(b, name)?;
            let data = self.backend.materialize(bucket, name, segs)?;
            let now = SystemTime::now();
            let stamp = self.backend.stamp(&data);
            let content = Content::new(
                self.next_generation(),
                data,
                WriteState::finalized(len, Some(crc), now),
            );
            let entry = Entry {
                content,
                metageneration: 1,
                metadata,
                create_time: now,
                stamp,
                file_id: None,
            };
            replace(b, name, entry.clone());
            add_parent_folders(b, name);
            Ok(entry)
        })
    }

    /// Takes over (no handle) or reconnects (the current handle) to an unfinalized object.
    pub fn open_appendable(
        &self,
        bucket: &str,
        name: &str,
        generation: i64,
        handle_token: Option<u64>,
        pre: Preconditions,
    ) -> Result<(Entry, ContentWriter), Status> {
        self.check_name(name)?;
        self.check_healthy()?;
        self.with_bucket(bucket, Refresh::One(name), |b| {
            let e = b.objects.get(name).ok_or_else(|| not_found(bucket, name))?;
            if e.content.generation != generation {
                return Err(Status::not_found(format!(
                    "object {name:?} in bucket {bucket:?} has no generation {generation} (live: {})",
                    e.content.generation
                )));
            }
            let mut st = e.content.state();
            if st.finalized.is_some() {
                return Err(Status::failed_precondition(format!(
                    "object {name:?} generation {generation} is finalized; appending to it is not allowed"
                )));
            }
            let token = match handle_token {
                Some(t) if st.token == 0 || st.token == t => t,
                Some(_) => {
                    return Err(Status::failed_precondition(
                        "stale write handle: another writer took over this object (takeover by a newer AppendObjectSpec)",
                    ))
                }
                None => {
                    pre.check(Some((e.content.generation, e.metageneration)))?;
                    self.next_token()
                }
            };
            st.token = token;
            drop(st);
            let mut writer = e.content.open_writer(token)?;
            // Whatever an earlier stream left unsynced becomes durable before we report sizes.
            writer.sync()?;
            Ok((e.clone(), writer))
        })
    }

    /// Records the new size of unfinalized `name` after a writer synced its bytes, without
    /// a sync of the record: the bytes carry the size (a directory-backed object's file
    /// length, see `directory.rs`), so that a small file costs the disk one sync less.
    pub fn grown(&self, bucket: &str, name: &str) -> Result<(), Status> {
        self.mutate(bucket, Refresh::None, Touched::Grown(&[name]), |_| Ok(()))
    }

    /// Records durable metadata after a writer finalized `name`.
    pub fn persist(&self, bucket: &str, name: &str, content: &Arc<Content>) -> Result<(), Status> {
        self.mutate(bucket, Refresh::None, Touched::Names(&[name]), |b| {
            if let Some(e) = b.objects.get_mut(name) {
                if Arc::ptr_eq(&e.content, content) {
                    e.stamp = self.backend.stamp(&content.data);
                }
            }
            Ok(())
        })
    }

    /// Deletes the live object (or the given generation if it is live).
    pub fn delete(
        &self,
        bucket: &str,
        name: &str,
        generation: i64,
        pre: Preconditions,
    ) -> Result<(), Status> {
        self.mutate(bucket, Refresh::One(name), Touched::Names(&[name]), |b| {
            let e = b.objects.get(name).ok_or_else(|| not_found(bucket, name))?;
            if generation != 0 && e.content.generation != generation {
                return Err(Status::not_found(format!(
                    "object {name:?} has no generation {generation} (live: {})",
                    e.content.generation
                )));
            }
            pre.check(Some((e.content.generation, e.metageneration)))?;
            self.backend.remove(bucket, name)?;
            if let Some(old) = b.objects.remove(name) {
                old.content.state().gone = true;
            }
            Ok(())
        })
    }

    /// Sets the custom metadata of the live object (or of `generation`, when it is the live
    /// one) for UpdateObject: `metadata` replaces it whole, or, with `keys`, sets only those
    /// keys. A metadata change bumps the metageneration and the update time, and keeps the
    /// bytes and the generation, as on the service.
    pub fn update_metadata(
        &self,
        bucket: &str,
        name: &str,
        generation: i64,
        metadata: CustomMetadata,
        keys: Option<&[String]>,
        pre: Preconditions,
    ) -> Result<Entry, Status> {
        self.mutate(bucket, Refresh::One(name), Touched::Names(&[name]), |b| {
            let e = b
                .objects
                .get_mut(name)
                .ok_or_else(|| not_found(bucket, name))?;
            if generation != 0 && e.content.generation != generation {
                return Err(Status::not_found(format!(
                    "object {name:?} has no generation {generation} (live: {})",
                    e.content.generation
                )));
            }
            pre.check(Some((e.content.generation, e.metageneration)))?;
            let mut updated = match keys {
                None => CustomMetadata::new(),
                Some(_) => e.metadata.clone(),
            };
            updated.extend(
                metadata
                    .into_iter()
                    .filter(|(k, _)| keys.is_none_or(|keys| keys.contains(k))),
            );
            check_custom_metadata(&updated)?;
            e.metadata = updated;
            e.metageneration += 1;
            e.content.state().update_time = SystemTime::now();
            Ok(e.clone())
        })
    }

    /// Renames one object atomically: the destination is created anew (a new generation,
    /// metageneration 1) with the source's bytes and metadata, as the service documents.
    pub fn move_object(
        &self,
        bucket: &str,
        from: &str,
        to: &str,
        src: Preconditions,
        dst: Preconditions,
    ) -> Result<Entry, Status> {
        self.check_name(to)?;
        // Only the two names are looked at on disk: a walk of the whole bucket made every
        // rename cost as much as the bucket holds.
        self.mutate(
            bucket,
            Refresh::Two(from, to),
            Touched::Names(&[from, to]),
            |b| {
                let e = b.objects.get(from).ok_or_else(|| not_found(bucket, from))?;
                src.check(Some((e.content.generation, e.metageneration)))?;
                dst.check(live(b, to))?;
                check_not_folder(b, to)?;
                if from == to {
                    return Ok(e.clone());
                }
                let data = self.backend.rename(bucket, from, to, &e.content.data)?;
                let entry = relocate(b, from, data, Some(self.next_generation()))?;
                replace(b, to, entry.clone());
                add_parent_folders(b, to);
                Ok(entry)
            },
        )
    }

    /// Creates a folder ("a/b/"), with its parents when `recursive`.
    pub fn create_folder(
        &self,
        bucket: &str,
        folder: &str,
        recursive: bool,
    ) -> Result<SystemTime, Status> {
        check_folder_name(folder)?;
        self.check_new_folder(folder)?;
        self.mutate(bucket, Refresh::Prefix(folder), Touched::Names(&[]), |b| {
            if b.folders.contains_key(folder) {
                return Err(Status::already_exists(format!(
                    "folder {folder:?} already exists"
                )));
            }
            if b.objects.contains_key(folder.trim_end_matches('/')) {
                return Err(Status::failed_precondition(format!(
                    "an object named {:?} is in the way of folder {folder:?}",
                    folder.trim_end_matches('/')
                )));
            }
            if let Some(parent) = parent_folder(folder) {
                if !recursive && !b.folders.contains_key(parent) {
                    return Err(Status::failed_precondition(format!(
                        "the parent folder {parent:?} does not exist (set recursive to create it)"
                    )));
                }
            }
            self.backend.create_folder(bucket, folder)?;
            let now = SystemTime::now();
            add_parent_folders(b, folder);
            b.folders.insert(folder.to_string(), now);
            Ok(now)
        })
    }

    /// A folder's creation time.
    pub fn get_folder(&self, bucket: &str, folder: &str) -> Result<SystemTime, Status> {
        check_folder_name(folder)?;
        self.with_bucket(bucket, Refresh::Prefix(folder), |b| {
            b.folders
                .get(folder)
                .copied()
                .ok_or_else(|| Status::not_found(format!("folder {folder:?} does not exist")))
        })
    }

    /// Deletes an empty folder.
    pub fn delete_folder(&self, bucket: &str, folder: &str) -> Result<(), Status> {
        check_folder_name(folder)?;
        self.mutate(bucket, Refresh::Prefix(folder), Touched::Names(&[]), |b| {
            if !b.folders.contains_key(folder) {
                return Err(Status::not_found(format!(
                    "folder {folder:?} does not exist"
                )));
            }
            let busy = b
                .objects
                .range(folder.to_string()..)
                .next()
                .is_some_and(|(k, _)| k.starts_with(folder))
                || b.folders
                    .range(folder.to_string()..)
                    .nth(1)
                    .is_some_and(|(k, _)| k.starts_with(folder));
            if busy {
                return Err(Status::failed_precondition(format!(
                    "folder {folder:?} is not empty"
                )));
            }
            self.backend.delete_folder(bucket, folder)?;
            b.folders.remove(folder);
            Ok(())
        })
    }

    /// Why renaming folder `from` to `to` would be refused, if it would.
    pub fn check_rename_folder(&self, bucket: &str, from: &str, to: &str) -> Result<(), Status> {
        check_folder_name(from)?;
        check_folder_name(to)?;
        self.check_new_folder(to)?;
        self.with_bucket(bucket, Refresh::Prefix(""), |b| {
            rename_folder_refused(b, from, to)
        })
    }

    /// Renames a folder with everything under it.
    pub fn rename_folder(&self, bucket: &str, from: &str, to: &str) -> Result<SystemTime, Status> {
        check_folder_name(from)?;
        check_folder_name(to)?;
        self.check_new_folder(to)?;
        self.mutate(bucket, Refresh::Prefix(""), Touched::All, |b| {
            rename_folder_refused(b, from, to)?;
            self.backend.rename_folder(bucket, from, to)?;
            let names: Vec<String> = b
                .objects
                .range(from.to_string()..)
                .take_while(|(k, _)| k.starts_with(from))
                .map(|(k, _)| k.clone())
                .collect();
            for name in names {
                let new_name = format!("{to}{}", &name[from.len()..]);
                let data = b
                    .objects
                    .get(&name)
                    .map(|e| self.backend.data_for(bucket, &new_name, &e.content.data));
                if let Some(data) = data {
                    let entry = relocate(b, &name, data, None)?;
                    b.objects.insert(new_name, entry);
                }
            }
            let folders: Vec<(String, SystemTime)> = b
                .folders
                .range(from.to_string()..)
                .take_while(|(k, _)| k.starts_with(from))
                .map(|(k, t)| (k.clone(), *t))
                .collect();
            for (f, t) in folders {
                b.folders.remove(&f);
                b.folders.insert(format!("{to}{}", &f[from.len()..]), t);
            }
            add_parent_folders(b, to);
            Ok(SystemTime::now())
        })
    }
}

/// What of a bucket is looked at in the backend before a call: nothing, a prefix, or names.
enum Refresh<'a> {
    None,
    Prefix(&'a str),
    One(&'a str),
    /// Two names: a move's source and destination.
    Two(&'a str, &'a str),
}

/// The refusal of a rename of folder `from` to `to`: the source missing, the destination
/// taken, or a move into itself.
/// Refuses what the service's naming rules refuse in a bucket with a hierarchical namespace:
/// object names of 1 to 1,024 bytes, with no carriage return or line feed, not `.` or `..`,
/// not under `.well-known/acme-challenge/`; folder names (up to the last `/`) of at most 512
/// bytes; at most 50 folder levels (slashes).
fn check_service_name(name: &str) -> Result<(), Status> {
    let refused = |why: String| {
        Err(Status::invalid_argument(format!(
            "object name {name:?}: {why}"
        )))
    };
    if name.is_empty() {
        return Err(Status::invalid_argument("the object name is empty"));
    }
    if name.len() > 1024 {
        return refused(format!("{} bytes long; the limit is 1024", name.len()));
    }
    if name.contains(['\r', '\n']) {
        return refused("object names cannot contain carriage returns or line feeds".into());
    }
    if name == "." || name == ".." || name.starts_with(".well-known/acme-challenge/") {
        return refused("not allowed".into());
    }
    let folder = name.rfind('/').map_or(0, |i| i + 1);
    if folder > 512 {
        return refused(format!("a folder name of {folder} bytes; the limit is 512"));
    }
    if name.matches('/').count() > 50 {
        return refused("more than 50 folder levels".into());
    }
    Ok(())
}

fn rename_folder_refused(b: &BucketState, from: &str, to: &str) -> Result<(), Status> {
    if !b.folders.contains_key(from) {
        return Err(Status::not_found(format!("folder {from:?} does not exist")));
    }
    if b.folders.contains_key(to) || b.objects.contains_key(to.trim_end_matches('/')) {
        return Err(Status::already_exists(format!(
            "destination {to:?} already exists"
        )));
    }
    if to.starts_with(from) {
        return Err(Status::invalid_argument(format!(
            "cannot move folder {from:?} into itself"
        )));
    }
    // Every name under the folder gets the new prefix: none may break the naming rules.
    let under = |k: &&String| k.starts_with(from);
    for name in b
        .objects
        .keys()
        .filter(under)
        .chain(b.folders.keys().filter(under))
    {
        check_service_name(&format!("{to}{}", &name[from.len()..]))?;
    }
    Ok(())
}

fn not_found(bucket: &str, name: &str) -> Status {
    Status::not_found(format!("object {name:?} not found in bucket {bucket:?}"))
}

fn live(b: &BucketState, name: &str) -> Option<(i64, i64)> {
    b.objects
        .get(name)
        .map(|e| (e.content.generation, e.metageneration))
}

fn check_not_folder(b: &BucketState, name: &str) -> Result<(), Status> {
    if b.folders.contains_key(&format!("{name}/")) {
        return Err(Status::failed_precondition(format!(
            "a folder {name:?}/ is in the way of object {name:?}"
        )));
    }
    Ok(())
}

fn check_folder_name(folder: &str) -> Result<(), Status> {
    // "a//" would pass the object-name check as "a" once its slashes are trimmed, and name a
    // folder that no path on disk or in a listing ever matches.
    if folder.len() < 2
        || !folder.ends_with('/')
        || folder.starts_with('/')
        || folder.contains("//")
    {
        return Err(Status::invalid_argument(format!(
            "invalid folder {folder:?}: expected a name like \"a/b/\""
        )));
    }
    Ok(())
}

/// The folder holding `name` ("a/b/c" -> "a/b/"), if any.
fn parent_folder(name: &str) -> Option<&str> {
    let trimmed = name.strip_suffix('/').unwrap_or(name);
    trimmed.rfind('/').map(|i| &name[..=i])
}

/// Hierarchical namespace: writing "a/b/c" makes the folders "a/" and "a/b/".
pub(crate) fn add_parent_folders(b: &mut BucketState, name: &str) {
    let mut cur = name;
    while let Some(p) = parent_folder(cur) {
        if b.folders.contains_key(p) {
            break;
        }
        b.folders.insert(p.to_string(), SystemTime::now());
        cur = p;
    }
}

/// Installs `entry` as the live object, retiring the generation it replaces.
fn replace(b: &mut BucketState, name: &str, entry: Entry) {
    if let Some(old) = b.objects.insert(name.to_string(), entry) {
        old.content.state().gone = true;
    }
}

/// The live entry of `name`, or its `generation` when that is not 0 and still live.
fn entry_of<'a>(
    b: &'a BucketState,
    bucket: &str,
    name: &str,
    generation: i64,
) -> Result<&'a Entry, Status> {
    let e = b.objects.get(name).ok_or_else(|| not_found(bucket, name))?;
    if generation != 0 && e.content.generation != generation {
        return Err(Status::not_found(format!(
            "object {name:?} in bucket {bucket:?} has no generation {generation} (live: {})",
            e.content.generation
        )));
    }
    Ok(e)
}

/// Takes `name` out of the index and returns it rebuilt over `data`, its old writer fenced.
/// A folder rename keeps the generation and bumps the metageneration (`renewed` None); a
/// moved object is created anew, as the service documents for MoveObject: generation
/// `renewed`, metageneration 1, fresh create and update times, the same bytes and metadata.
fn relocate(
    b: &mut BucketState,
    name: &str,
    data: Data,
    renewed: Option<i64>,
) -> Result<Entry, Status> {
    let old = b
        .objects
        .remove(name)
        .ok_or_else(|| Status::not_found(format!("object {name:?} vanished")))?;
    let mut st = old.content.state();
    let mut state = WriteState {
        token: 0,
        ..st.clone()
    };
    st.gone = true;
    drop(st);
    let (generation, metageneration, create_time) = match renewed {
        Some(generation) => {
            let now = SystemTime::now();
            state.update_time = now;
            if state.finalized.is_some() {
                state.finalized = Some(now);
            }
            (generation, 1, now)
        }
        None => (
            old.content.generation,
            old.metageneration + 1,
            old.create_time,
        ),
    };
    Ok(Entry {
        content: Content::new(generation, data, state),
        metageneration,
        metadata: old.metadata,
        create_time,
        stamp: old.stamp,
        file_id: old.file_id,
    })
}
