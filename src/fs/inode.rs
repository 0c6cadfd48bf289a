//! The inode table: one inode number per object key (files and symbolic links) or prefix
//! (directories), with the kernel's lookup count, each file's last known (generation, size)
//! identity, and each symbolic link's target once known.
//!
//! Keys of directories end in `/` and keys of files do not, so a file `a` and a directory `a/`
//! never share an inode. A file inode is pinned to one generation: when a lookup finds a
//! newer generation, the key gets a new inode, so the kernel's page cache of the old inode
//! (still used by handles opened before) never mixes bytes of two versions; appends (same
//! generation, larger size) keep the inode. A symbolic link is an object too (see
//! `gcs::Symlink`), pinned the same way, so its target never changes under its inode. An
//! inode lives while the kernel holds lookups on it; `forget` drops it when the count reaches
//! zero. The root is never forgotten. An inode is one allocation with its key inline
//! (`inode_alloc`); the table finds it by number, and by key through the number the key
//! hashes to.

use super::inode_alloc::Shared;
use crate::gcs;
use hashbrown::HashTable;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// Inode number of the mount's root directory.
pub const ROOT_INO: u64 = 1;

/// File, directory or symbolic link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file backed by one object.
    File,
    /// A directory: a prefix ending in `/`, explicit (a folder or marker object) or implicit.
    Dir,
    /// A symbolic link backed by one object its custom metadata marks as one.
    Symlink,
}

impl Kind {
    /// What object `m` stands for (a file or a symbolic link), with the link's target when
    /// the metadata gives it (else the object's bytes hold it).
    pub fn of_object(m: &gcs::ObjectMeta) -> (Kind, Option<Arc<str>>) {
        match &m.symlink {
            None => (Kind::File, None),
            Some(gcs::Symlink::Target(t)) => (Kind::Symlink, Some(Arc::from(t.as_str()))),
            Some(gcs::Symlink::InContent) => (Kind::Symlink, None),
        }
    }
}

/// A point in time as nanoseconds since the Unix epoch (years 1678 to 2262): 8 bytes where a
/// `SystemTime` takes 16, in every cached inode and listing entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnixNanos(i64);

impl UnixNanos {
    /// 1970-01-01 00:00:00 UTC.
    pub const EPOCH: UnixNanos = UnixNanos(0);
}

impl From<SystemTime> for UnixNanos {
    fn from(t: SystemTime) -> Self {
        let nanos = match t.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(after) => i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
            Err(before) => i64::try_from(before.duration().as_nanos()).map_or(i64::MIN, |n| -n),
        };
        UnixNanos(nanos)
    }
}

impl From<UnixNanos> for SystemTime {
    fn from(t: UnixNanos) -> Self {
        let magnitude = Duration::from_nanos(t.0.unsigned_abs());
        if t.0 >= 0 {
            SystemTime::UNIX_EPOCH + magnitude
        } else {
            SystemTime::UNIX_EPOCH - magnitude
        }
    }
}

/// What a file's object looked like when last fetched: its identity and times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjMeta {
    /// Object generation; a replaced object gets a new one.
    pub generation: i64,
    /// Object size in bytes (appends grow it without changing the generation).
    pub size: u64,
    /// The modification time its metadata records (see `gcs::ObjectMeta::mtime`), else its
    /// last update time. (Its creation time is not kept: Linux's FUSE has
    /// no field for it.)
    pub mtime: UnixNanos,
}

/// The generation of a file created through this mount whose create the service has not
/// answered yet (see `gcs::AppendWriter::create_unanswered`). Larger than any real one, so a
/// listing entry that still carries it never looks newer than the inode that learned the real
/// one; the first flush of the file learns it.
pub const PENDING_GENERATION: i64 = i64::MAX;

impl ObjMeta {
    /// (generation, size): what tells two versions of an object apart.
    pub fn identity(&self) -> (i64, u64) {
        (self.generation, self.size)
    }
}

impl From<&crate::gcs::ObjectMeta> for ObjMeta {
    fn from(m: &crate::gcs::ObjectMeta) -> Self {
        ObjMeta {
            generation: m.generation,
            size: m.size,
            mtime: m.mtime.unwrap_or(m.update_time).into(),
        }
    }
}

/// One inode: fixed number and kind (`ino`, `kind`), a key that follows renames, changing
/// state. A handle: clones share the inode.
pub type Inode = Shared<Mutex<InodeState>>;

/// What changes over an inode's life.
#[derive(Debug)]
pub struct InodeState {
    lookups: u64,
    /// The last fetched metadata, or generation 0 when none was: no object has generation
    /// 0 (the service's are positive), and an `Option` would cost 8 bytes more.
    meta: ObjMeta,
    /// When `meta` was last fetched, as `ticks` (0: never).
    checked: u64,
    /// What only opened files and links have, kept apart so that the millions of inodes a
    /// walk leaves behind stay small.
    extra: Option<Box<Extra>>,
}

#[derive(Debug, Default)]
struct Extra {
    page_cache_identity: Option<(i64, u64)>,
    /// The mount's open clock (bytes opened so far) at the last open.
    opened_at: u64,
    /// A symbolic link's target, once known.
    target: Option<Arc<str>>,
    /// The object key (file) or prefix ending in `/` (directory) after a rename, when it
    /// differs from the key the inode was created with: the kernel keeps using the inode
    /// under its new name.
    renamed_to: Option<Box<str>>,
}

/// The metadata of an inode nothing was fetched for yet.
const UNKNOWN: ObjMeta = ObjMeta {
    generation: 0,
    size: 0,
    mtime: UnixNanos::EPOCH,
};

impl InodeState {
    fn new(lookups: u64) -> Self {
        InodeState {
            lookups,
            meta: UNKNOWN,
            checked: 0,
            extra: None,
        }
    }

    fn meta(&self) -> Option<ObjMeta> {
        (self.meta.generation != 0).then_some(self.meta)
    }

    fn extra(&mut self) -> &mut Extra {
        self.extra.get_or_insert_with(Box::default)
    }

    fn page_cache_identity(&self) -> Option<(i64, u64)> {
        self.extra.as_ref().and_then(|e| e.page_cache_identity)
    }
}

/// Instants as 8 bytes: nanoseconds after the first instant the process asked for, plus one
/// so that 0 means "never".
fn ticks(at: Instant) -> u64 {
    let since = at.saturating_duration_since(*TICKS_EPOCH);
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX - 1) + 1
}

fn instant_of(ticks: u64) -> Option<Instant> {
    let after = ticks.checked_sub(1)?;
    Some(*TICKS_EPOCH + Duration::from_nanos(after))
}

static TICKS_EPOCH: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

impl Inode {
    fn state(&self) -> MutexGuard<'_, InodeState> {
        // A poisoned lock only means another request panicked mid-update of plain data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The object key (file) or prefix ending in `/` (directory; empty for the bucket root)
    /// this inode stands for now.
    pub fn key(&self) -> String {
        self.with_key(str::to_string)
    }

    /// `f` of the inode's key now, without a copy.
    fn with_key<T>(&self, f: impl FnOnce(&str) -> T) -> T {
        let s = self.state();
        match s.extra.as_ref().and_then(|e| e.renamed_to.as_deref()) {
            Some(renamed) => f(renamed),
            None => f(self.first_key()),
        }
    }

    /// Gives the inode its key after a rename.
    fn rename_to(&self, key: &str) {
        let mut s = self.state();
        if key == self.first_key() {
            if let Some(e) = s.extra.as_mut() {
                e.renamed_to = None;
            }
        } else {
            s.extra().renamed_to = Some(key.into());
        }
    }

    /// A symbolic link's target, if known yet.
    pub fn target(&self) -> Option<Arc<str>> {
        self.state().extra.as_ref().and_then(|e| e.target.clone())
    }

    /// Records a symbolic link's target, from its object's metadata or bytes.
    pub fn set_target(&self, target: Arc<str>) {
        self.state().extra().target = Some(target);
    }

    /// The last fetched metadata and when it was fetched.
    pub fn meta(&self) -> (Option<ObjMeta>, Option<Instant>) {
        let s = self.state();
        (s.meta(), instant_of(s.checked))
    }

    /// Records metadata of the inode's generation as the service told it at `as_of` (a
    /// listing's time, the start of a call) and returns what the inode now holds: a newer
    /// generation belongs to a new inode (see `InodeTable::lookup`), so it only restarts the
    /// TTL here. Nothing changes when the inode learned its own metadata later: a write through this mount notes
    /// the size it persisted, and a listing taken before that (the size 0 of a new file) must
    /// not take it back. The kernel would believe the reply and read the file as empty.
    pub fn refresh_as_of(&self, meta: ObjMeta, as_of: Instant) -> ObjMeta {
        let mut s = self.state();
        if let Some(known) = s.meta().filter(|_| s.checked > ticks(as_of)) {
            return known;
        }
        s.checked = ticks(Instant::now());
        match s.meta() {
            Some(old) if old.generation != meta.generation => old,
            old => {
                // A generation only grows: a smaller size is a stat that lags behind the
                // appends (the service's metadata of an unfinalized object can).
                let size = old.map_or(meta.size, |old| old.size.max(meta.size));
                s.meta = ObjMeta { size, ..meta };
                s.meta
            }
        }
    }

    /// Takes the modification time of `meta`, the answer to a change of it, when the inode
    /// holds that generation: whatever else was fetched meanwhile, this answer is newer.
    pub fn note_mtime(&self, meta: &ObjMeta) {
        let mut s = self.state();
        if s.meta().is_some_and(|m| m.generation == meta.generation) {
            s.meta.mtime = meta.mtime;
        }
    }

    /// Records what a write through this mount made durable: the size, now as the mtime, and
    /// the generation when the inode had only `PENDING_GENERATION` (`generation` 0: not yet
    /// known to the writer).
    ///
    /// A generation only grows, so the larger size wins: the stream of a closed handle may
    /// report its last size after a handle opened since has appended more and fsynced it.
    /// A writer of another generation than the inode's was overtaken and reports nothing.
    pub fn note_written(&self, generation: i64, size: u64) {
        let mut s = self.state();
        if s.meta().is_none() {
            return;
        }
        if s.meta.generation == PENDING_GENERATION {
            if generation != 0 {
                s.meta.generation = generation;
            }
            s.meta.size = size;
        } else if generation == 0 || generation == s.meta.generation {
            s.meta.size = s.meta.size.max(size);
        } else {
            return;
        }
        s.meta.mtime = SystemTime::now().into();
        s.checked = ticks(Instant::now());
    }

    /// Forgets the metadata of a file whose create never reached the service, so the next
    /// look at it asks the service (and finds nothing).
    pub fn forget_pending(&self) {
        let mut s = self.state();
        if s.meta.generation == PENDING_GENERATION {
            s.meta = UNKNOWN;
            s.checked = 0;
        }
    }

    /// Installs the metadata of a new generation written through this mount (a staged file
    /// uploaded over the old one): the kernel's page cache of this inode already holds the new
    /// bytes, since they were written through it.
    pub fn replace(&self, meta: ObjMeta) {
        let mut s = self.state();
        s.checked = ticks(Instant::now());
        s.meta = meta;
        s.extra().page_cache_identity = Some(meta.identity());
    }

    /// True when the kernel's page cache was filled with this identity by an open at or
    /// after `since` on the mount's open clock (so reads may never reach the daemon). Pages of
    /// older opens are assumed evicted: the page cache cannot hold a dataset larger than memory.
    pub fn page_cache_holds(&self, identity: (i64, u64), since: u64) -> bool {
        let s = self.state();
        s.extra
            .as_ref()
            .is_some_and(|e| e.page_cache_identity == Some(identity) && e.opened_at >= since)
    }

    /// Records the identity a new open will read, at `clock` on the mount's open clock, and
    /// says whether the kernel's page cache, filled under the previous open, holds the same
    /// bytes (FOPEN_KEEP_CACHE: if the kernel evicted them meanwhile, keeping costs nothing).
    pub fn note_open(&self, identity: (i64, u64), clock: u64) -> bool {
        let mut s = self.state();
        let keep = s.page_cache_identity() == Some(identity);
        let e = s.extra();
        e.page_cache_identity = Some(identity);
        e.opened_at = clock;
        keep
    }
}

/// All inodes the kernel knows, by number and by key.
#[derive(Debug)]
pub struct InodeTable {
    tables: Mutex<Tables>,
}

/// One index holds every inode (8 bytes a slot): nearly every inode's number is the hash of
/// its key (`hashed_ino`), so a key is found by its number. The few named inodes whose number
/// is not their key's hash (renamed, or numbered past a collision or an older generation)
/// are indexed by key apart. An inode is named while its current key leads to it; a key
/// leads to at most one inode. Each inode's lock is only ever taken after the table's.
#[derive(Debug)]
struct Tables {
    by_ino: HashTable<Inode>,
    /// What the inodes take: each one's allocation and a share of the index.
    bytes: u64,
    /// Named inodes whose number is not `hashed_ino` of their current key, by key.
    odd_names: HashTable<Inode>,
    next_ino: u64,
    /// SipHash, the standard one, was a tenth of a walk's daemon CPU (every readdirplus entry
    /// is hashed); foldhash is seeded per process too.
    hasher: foldhash::fast::RandomState,
}

impl Tables {
    fn ino_hash(&self, ino: u64) -> u64 {
        self.hasher.hash_one(ino)
    }

    fn key_hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    fn by_ino(&self, ino: u64) -> Option<&Inode> {
        self.by_ino.find(self.ino_hash(ino), |i| i.ino == ino)
    }

    fn by_key(&self, key: &str) -> Option<&Inode> {
        self.holder_and_named(key).1
    }

    /// The inode that holds number `hashed_ino(key)`, whatever its key, and the inode `key`
    /// leads to: one probe of the index for both when the key's inode is new.
    fn holder_and_named(&self, key: &str) -> (Option<&Inode>, Option<&Inode>) {
        let is_key = |i: &Inode| i.with_key(|k| k == key);
        let holder = self.by_ino(hashed_ino(key));
        let by_number = holder.filter(|i| i.is_named() && is_key(i));
        let named = by_number.or_else(|| self.odd_names.find(self.key_hash(key), |i| is_key(i)));
        (holder, named)
    }

    fn insert_by_ino(&mut self, inode: Inode) {
        self.bytes += inode_bytes(&inode);
        let hasher = self.hasher.clone();
        self.by_ino
            .insert_unique(self.ino_hash(inode.ino), inode, |i| hasher.hash_one(i.ino));
    }

    /// Makes `inode` the one its current key leads to, in place of any other.
    fn index_by_key(&mut self, inode: Inode) {
        let key = inode.key();
        self.unindex_key(&key);
        self.name(inode, &key);
    }

    /// Makes `inode` the one `key`, its current key, leads to; none does now.
    fn name(&mut self, inode: Inode, key: &str) {
        inode.set_named(true);
        if inode.ino != hashed_ino(key) {
            let hasher = self.hasher.clone();
            self.odd_names
                .insert_unique(self.key_hash(key), inode, |i| {
                    i.with_key(|k| hasher.hash_one(k))
                });
        }
    }

    /// The inode `key` leads to, which it then no longer does.
    fn unindex_key(&mut self, key: &str) -> Option<Inode> {
        let inode = self.by_key(key)?.clone();
        self.unname(&inode, key);
        Some(inode)
    }

    /// Marks `inode`, named by `key`, no longer named.
    fn unname(&mut self, inode: &Inode, key: &str) {
        inode.set_named(false);
        if inode.ino != hashed_ino(key) {
            let found = self
                .odd_names
                .find_entry(self.key_hash(key), |i| Inode::ptr_eq(i, inode));
            if let Ok(entry) = found {
                entry.remove();
            }
        }
    }

    /// Gives back the room of forgotten inodes once the index is mostly empty: a walk of a
    /// large bucket grows it to millions of slots, and the kernel may forget all of it.
    fn shrink_when_sparse(&mut self) {
        if self.by_ino.capacity() > 4 * self.by_ino.len() + 1024 {
            let hasher = self.hasher.clone();
            self.by_ino.shrink_to_fit(|i| hasher.hash_one(i.ino));
            self.odd_names
                .shrink_to_fit(|i| i.with_key(|k| hasher.hash_one(k)));
        }
    }
}

/// The index's share per inode: an 8-byte slot and a control byte, at a load between 7/16
/// and 7/8 (hashbrown doubles when full).
const INDEX_BYTES: u64 = 16;

/// What one inode takes: its allocation and its share of the index. (The extra state some
/// hold apart, an opened file's or a link's or a renamed inode's new key, is not counted.)
fn inode_bytes(inode: &Inode) -> u64 {
    inode.heap_bytes() + INDEX_BYTES
}

/// A file's or a link's key never ends in `/`; a directory's always does, or is the bucket
/// root's `""`.
fn key_fits_kind(key: &str, kind: Kind) -> bool {
    (kind == Kind::Dir) == (key.is_empty() || key.ends_with('/'))
}

/// The number a new inode of `key` gets when free: a hash of the key with the top bit set, so
/// it never meets the counted numbers given when it is taken. Plain readdir entries (past the
/// first reply of a large directory, `FUSE_READDIRPLUS_AUTO`) show it as `d_ino` before any
/// lookup, and `stat` shows the same number after one.
fn hashed_ino(key: &str) -> u64 {
    // A fixed seed: numbers stay the same for the mount's life, whichever table asks.
    foldhash::fast::FixedState::with_seed(0x7261_7069_6466_7321).hash_one(key) | (1 << 63)
}

impl InodeTable {
    /// A table holding only the root, whose key is `root_key` (empty or ending in `/`).
    pub fn new(root_key: String) -> Self {
        let root = Inode::new(ROOT_INO, Kind::Dir, &root_key, state(1));
        let mut tables = Tables {
            by_ino: HashTable::new(),
            bytes: 0,
            odd_names: HashTable::new(),
            next_ino: ROOT_INO + 1,
            hasher: foldhash::fast::RandomState::default(),
        };
        tables.insert_by_ino(root.clone());
        tables.index_by_key(root);
        InodeTable {
            tables: Mutex::new(tables),
        }
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many inodes the kernel holds, the root included.
    pub fn len(&self) -> usize {
        self.tables().by_ino.len()
    }

    /// The memory those inodes take, as `inode_bytes` estimates it.
    pub fn bytes(&self) -> u64 {
        self.tables().bytes
    }

    /// The inode with this number, if the kernel still holds it.
    pub fn get(&self, ino: u64) -> Option<Inode> {
        self.tables().by_ino(ino).cloned()
    }

    /// A stable number for `key` without taking a lookup (for plain readdir entries): the
    /// inode's number when it exists, else the number a lookup will most likely give it.
    pub fn peek_ino(&self, key: &str, kind: Kind) -> u64 {
        debug_assert!(key_fits_kind(key, kind), "{key:?} as {kind:?}");
        let t = self.tables();
        t.by_key(key).map_or_else(|| hashed_ino(key), |i| i.ino)
    }

    /// Finds or creates the inode of `key` and counts one kernel lookup on it; `meta`, when
    /// given, refreshes a file's metadata, and a newer generation than the inode's, or another
    /// kind (a file replaced by a link), gets a new inode.
    pub fn lookup(&self, key: &str, kind: Kind, meta: Option<ObjMeta>) -> Inode {
        self.lookup_as_of(key, kind, meta, Instant::now())
    }

    /// `lookup` with metadata as of `as_of` (see `Inode::refresh_as_of`).
    pub fn lookup_as_of(
        &self,
        key: &str,
        kind: Kind,
        meta: Option<ObjMeta>,
        as_of: Instant,
    ) -> Inode {
        self.find_or_make(key, kind, meta, as_of, false)
    }

    /// The inode of a file just created through this mount as `meta` describes: always a new
    /// one (any older inode of the key keeps its generation and page cache), counted once.
    pub fn created(&self, key: &str, meta: ObjMeta) -> Inode {
        self.find_or_make(key, Kind::File, Some(meta), Instant::now(), true)
    }

    fn find_or_make(
        &self,
        key: &str,
        kind: Kind,
        meta: Option<ObjMeta>,
        as_of: Instant,
        new: bool,
    ) -> Inode {
        debug_assert!(key_fits_kind(key, kind), "{key:?} as {kind:?}");
        let mut t = self.tables();
        let (holder, named) = t.holder_and_named(key);
        let number_free = holder.is_none();
        let named = named.cloned();
        // A listing taken while a create was unanswered carries PENDING_GENERATION: that is
        // the inode the create made, not a newer version.
        let existing = named
            .as_ref()
            .filter(|_| !new)
            .filter(|inode| inode.kind == kind)
            .filter(|inode| match (inode.meta().0, meta) {
                (Some(old), Some(new)) => {
                    new.generation <= old.generation || new.generation == PENDING_GENERATION
                }
                _ => true,
            });
        let inode = match existing {
            Some(inode) => inode.clone(),
            None => {
                if let Some(older) = &named {
                    t.unname(older, key);
                }
                // The number plain readdir showed, unless an inode holds it (an older
                // generation of the key, or a hash collision).
                let ino = if number_free {
                    hashed_ino(key)
                } else {
                    t.next_ino += 1;
                    t.next_ino - 1
                };
                let inode = Inode::new(ino, kind, key, state(0));
                t.insert_by_ino(inode.clone());
                t.name(inode.clone(), key);
                inode
            }
        };
        inode.state().lookups += 1;
        if let Some(m) = meta {
            inode.refresh_as_of(m, as_of);
        }
        inode
    }

    /// The kernel dropped `n` lookups on `ino`; the inode goes when none are left, and the
    /// answer says whether it went.
    pub fn forget(&self, ino: u64, n: u64) -> bool {
        if ino == ROOT_INO {
            return false;
        }
        let mut t = self.tables();
        let hash = t.ino_hash(ino);
        let Ok(found) = t.by_ino.find_entry(hash, |i| i.ino == ino) else {
            return false;
        };
        let gone = {
            let mut s = found.get().state();
            s.lookups = s.lookups.saturating_sub(n);
            s.lookups == 0
        };
        if gone {
            let (inode, _) = found.remove();
            t.bytes -= inode_bytes(&inode);
            if inode.is_named() {
                t.unname(&inode, &inode.key());
            }
            t.shrink_when_sparse();
        }
        gone
    }

    /// The keys of up to `n` files and links looked up least recently (oldest first): the
    /// ones to ask the kernel to let go of when it holds more inodes than the cap.
    pub fn least_recent_files(&self, n: usize) -> Vec<String> {
        let t = self.tables();
        // A bounded max-heap of (last lookup, number): the newest of the kept is on top.
        let mut oldest = std::collections::BinaryHeap::with_capacity(n + 1);
        for inode in t.by_ino.iter().filter(|i| i.kind != Kind::Dir) {
            oldest.push((inode.state().checked, inode.ino));
            if oldest.len() > n {
                oldest.pop();
            }
        }
        oldest
            .into_sorted_vec()
            .into_iter()
            .filter_map(|(_, ino)| t.by_ino(ino).map(Inode::key))
            .collect()
    }

    /// The inode of `key` if the kernel holds one, without counting a lookup.
    pub fn find(&self, key: &str, kind: Kind) -> Option<Inode> {
        debug_assert!(key_fits_kind(key, kind), "{key:?} as {kind:?}");
        self.tables().by_key(key).cloned()
    }

    /// After a rename of `from` to `to` (both files, or both directory prefixes ending in
    /// `/`): the inodes the kernel holds follow their objects, a directory's descendants
    /// with it. An inode held under `to` before (the replaced target) keeps its key but
    /// loses the name.
    pub fn rename(&self, from: &str, to: &str, kind: Kind) {
        debug_assert!(key_fits_kind(from, kind) && key_fits_kind(to, kind));
        let mut t = self.tables();
        let moved: Vec<String> = match kind {
            Kind::Dir => t
                .by_ino
                .iter()
                .filter(|i| i.is_named() && i.with_key(|k| k.starts_with(from)))
                .map(Inode::key)
                .collect(),
            Kind::File | Kind::Symlink => vec![from.to_string()],
        };
        if kind != Kind::Dir {
            t.unindex_key(to);
        }
        for old in moved {
            let Some(inode) = t.unindex_key(&old) else {
                continue;
            };
            inode.rename_to(&format!("{to}{}", &old[from.len()..]));
            t.index_by_key(inode);
        }
    }

    /// After `key` was deleted: the name no longer leads to the inode (a new object of the
    /// same name gets a new inode); the kernel may still hold the inode through open files.
    pub fn unlink(&self, key: &str, kind: Kind) {
        debug_assert!(key_fits_kind(key, kind), "{key:?} as {kind:?}");
        self.tables().unindex_key(key);
    }
}

/// The state of a new inode with `lookups` kernel lookups.
fn state(lookups: u64) -> Mutex<InodeState> {
    Mutex::new(InodeState::new(lookups))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_are_counted_and_forgotten() {
        let t = InodeTable::new(String::new());
        let a = t.lookup("a", Kind::File, None);
        let a2 = t.lookup("a", Kind::File, None);
        assert_eq!(a.ino, a2.ino);
        let d = t.lookup("a/", Kind::Dir, None);
        assert_ne!(a.ino, d.ino, "file a and directory a/ are different inodes");
        t.forget(a.ino, 1);
        assert!(t.get(a.ino).is_some());
        t.forget(a.ino, 1);
        assert!(t.get(a.ino).is_none());
        t.forget(ROOT_INO, 5);
        assert!(t.get(ROOT_INO).is_some());
    }

    #[test]
    fn an_inode_stays_small() {
        // Its allocation's head is 72 bytes with this state (see `inode_alloc`): a walk of a
        // million files leaves a million of them.
        assert_eq!(std::mem::size_of::<InodeState>(), 48);
        assert_eq!(std::mem::size_of::<ObjMeta>(), 24);
    }

    #[test]
    fn keys_lead_to_their_inodes_through_renames_unlinks_and_forgets() {
        let t = InodeTable::new(String::new());
        let d = t.lookup("d/", Kind::Dir, None);
        let a = t.lookup("d/a", Kind::File, Some(meta(1, 1)));
        t.rename("d/a", "d/b", Kind::File);
        assert_eq!(a.key(), "d/b");
        assert_eq!(t.find("d/b", Kind::File).map(|i| i.ino), Some(a.ino));
        assert!(t.find("d/a", Kind::File).is_none());
        let new_a = t.lookup("d/a", Kind::File, Some(meta(2, 1)));
        assert_ne!(new_a.ino, a.ino, "the old number is still held");
        assert_eq!(t.peek_ino("d/a", Kind::File), new_a.ino);

        t.rename("d/", "e/", Kind::Dir);
        assert_eq!(
            (d.key(), a.key(), new_a.key()),
            ("e/".into(), "e/b".into(), "e/a".into())
        );
        assert_eq!(t.find("e/b", Kind::File).map(|i| i.ino), Some(a.ino));
        assert_eq!(t.find("e/a", Kind::File).map(|i| i.ino), Some(new_a.ino));
        assert!(t.find("d/b", Kind::File).is_none() && t.find("d/", Kind::Dir).is_none());
        t.rename("e/", "d/", Kind::Dir);
        assert_eq!(t.find("d/", Kind::Dir).map(|i| i.ino), Some(d.ino));
        assert_eq!(d.key(), "d/");

        let c = t.lookup("d/c", Kind::File, Some(meta(1, 1)));
        t.unlink("d/c", Kind::File);
        assert!(t.find("d/c", Kind::File).is_none());
        assert_eq!(
            t.get(c.ino).map(|i| i.key()),
            Some("d/c".into()),
            "still held"
        );
        let c2 = t.lookup("d/c", Kind::File, Some(meta(1, 1)));
        assert_ne!(c2.ino, c.ino);
        assert_eq!(t.find("d/c", Kind::File).map(|i| i.ino), Some(c2.ino));

        for gone in [&a, &new_a, &c, &c2] {
            assert!(t.forget(gone.ino, 1));
            assert!(t.get(gone.ino).is_none());
        }
        assert!(t.find("d/b", Kind::File).is_none() && t.find("d/c", Kind::File).is_none());
        assert_eq!(
            t.tables().odd_names.len(),
            1,
            "forgotten inodes leave no name behind (the root's number is 1, not its key's hash)"
        );
        assert_eq!(t.len(), 2, "the root and d/");
        let root = t.get(ROOT_INO).expect("root");
        assert_eq!(
            t.bytes(),
            inode_bytes(&root) + inode_bytes(&d),
            "counted out as in"
        );
    }

    #[test]
    fn times_keep_their_nanoseconds_both_sides_of_the_epoch() {
        let epoch = SystemTime::UNIX_EPOCH;
        for t in [
            epoch,
            epoch + Duration::new(1_764_000_000, 123_456_789),
            epoch - Duration::new(86_400, 1),
        ] {
            assert_eq!(SystemTime::from(UnixNanos::from(t)), t);
        }
        assert_eq!(instant_of(0), None);
        let now = Instant::now();
        assert_eq!(instant_of(ticks(now)), Some(now));
    }

    #[test]
    fn a_new_inode_gets_the_number_plain_readdir_showed() {
        let t = InodeTable::new(String::new());
        let shown = t.peek_ino("d/f", Kind::File);
        let v1 = t.lookup("d/f", Kind::File, Some(meta(1, 10)));
        assert_eq!(v1.ino, shown);
        assert_eq!(t.peek_ino("d/f", Kind::File), v1.ino);
        let v2 = t.lookup("d/f", Kind::File, Some(meta(2, 10)));
        assert_ne!(
            v2.ino, v1.ino,
            "the number is taken by the older generation"
        );
        assert_eq!(t.peek_ino("d/f", Kind::File), v2.ino);
        t.forget(v1.ino, 1);
        t.forget(v2.ino, 1);
        assert_eq!(t.lookup("d/f", Kind::File, None).ino, shown);
    }

    fn meta(generation: i64, size: u64) -> ObjMeta {
        ObjMeta {
            generation,
            size,
            mtime: SystemTime::UNIX_EPOCH.into(),
        }
    }

    #[test]
    fn a_new_generation_is_a_new_inode_and_appends_are_not() {
        let t = InodeTable::new(String::new());
        let v1 = t.lookup("f", Kind::File, Some(meta(1, 10)));
        let grown = t.lookup("f", Kind::File, Some(meta(1, 20)));
        assert_eq!(v1.ino, grown.ino);
        assert_eq!(v1.meta().0.map(|m| m.size), Some(20));
        let v2 = t.lookup("f", Kind::File, Some(meta(2, 5)));
        assert_ne!(v1.ino, v2.ino);
        assert_eq!(
            v1.refresh_as_of(meta(2, 5), Instant::now()),
            meta(1, 20),
            "old inode stays pinned"
        );
        let stale_listing = t.lookup("f", Kind::File, Some(meta(1, 20)));
        assert_eq!(
            stale_listing.ino, v2.ino,
            "an older listing does not go back"
        );
        t.forget(v1.ino, 2);
        assert_eq!(t.lookup("f", Kind::File, None).ino, v2.ino);
    }

    #[test]
    fn metadata_older_than_the_inode_does_not_take_it_back() {
        let t = InodeTable::new(String::new());
        let created = t.lookup("f", Kind::File, Some(meta(1, 0)));
        let listed_at = Instant::now();
        std::thread::sleep(Duration::from_millis(1));
        created.note_written(1, 18);
        let again = t.lookup_as_of("f", Kind::File, Some(meta(1, 0)), listed_at);
        assert_eq!(
            again.meta().0.map(|m| m.identity()),
            Some((1, 18)),
            "a listing from before the write"
        );
        assert_eq!(
            again.refresh_as_of(meta(1, 30), Instant::now()),
            meta(1, 30)
        );
    }

    #[test]
    fn a_late_report_of_an_older_append_does_not_shrink_the_file() {
        let t = InodeTable::new(String::new());
        let f = t.lookup("f", Kind::File, Some(meta(3, 8)));
        f.note_written(3, 14);
        f.note_written(3, 8);
        assert_eq!(f.meta().0.map(|m| m.identity()), Some((3, 14)));
        f.note_written(2, 20);
        assert_eq!(
            f.meta().0.map(|m| m.identity()),
            Some((3, 14)),
            "a writer of an overtaken generation"
        );
    }

    #[test]
    fn a_file_created_unanswered_learns_its_generation_and_keeps_its_inode() {
        let t = InodeTable::new(String::new());
        let created = t.created("f", meta(PENDING_GENERATION, 0));
        let fetched = t.lookup("f", Kind::File, Some(meta(7, 0)));
        assert_eq!(
            fetched.ino, created.ino,
            "the object is not newer than the create"
        );
        assert_eq!(
            created.meta().0.map(|m| m.generation),
            Some(PENDING_GENERATION)
        );
        created.note_written(7, 12);
        assert_eq!(created.meta().0.map(|m| m.identity()), Some((7, 12)));
        let listed = t.lookup("f", Kind::File, Some(meta(PENDING_GENERATION, 0)));
        assert_eq!(listed.ino, created.ino, "a listing taken before the flush");
        assert_eq!(created.meta().0.map(|m| m.identity()), Some((7, 12)));
        created.forget_pending();
        assert!(created.meta().0.is_some(), "a learned generation stays");

        let recreated = t.created("f", meta(PENDING_GENERATION, 0));
        assert_ne!(recreated.ino, created.ino, "a create over a known version");
        assert_eq!(
            recreated.meta().0.map(|m| m.identity()),
            Some((PENDING_GENERATION, 0))
        );
        assert_eq!(created.meta().0.map(|m| m.identity()), Some((7, 12)));

        let failed = t.created("g", meta(PENDING_GENERATION, 0));
        failed.forget_pending();
        assert_eq!(failed.meta(), (None, None), "a create never answered");
    }

    #[test]
    fn a_link_in_place_of_a_file_is_a_new_inode_that_keeps_its_target() {
        let t = InodeTable::new(String::new());
        let file = t.lookup("x", Kind::File, Some(meta(1, 10)));
        let link = t.lookup("x", Kind::Symlink, Some(meta(1, 0)));
        assert_ne!(file.ino, link.ino);
        assert_eq!(link.target(), None);
        link.set_target(Arc::from("../y"));
        let again = t.lookup("x", Kind::Symlink, None);
        assert_eq!(again.ino, link.ino);
        assert_eq!(again.target().as_deref(), Some("../y"));
    }

    #[test]
    fn keep_cache_only_for_the_same_identity() {
        let t = InodeTable::new(String::new());
        let a = t.lookup("a", Kind::File, None);
        assert!(!a.note_open((1, 10), 0));
        assert!(a.note_open((1, 10), 0));
        assert!(!a.note_open((2, 10), 0));
        assert!(!a.note_open((2, 11), 0));
    }

    #[test]
    fn the_page_cache_holds_only_recent_opens_of_the_same_identity() {
        let t = InodeTable::new(String::new());
        let a = t.lookup("a", Kind::File, None);
        assert!(!a.page_cache_holds((1, 10), 0), "never opened");
        a.note_open((1, 10), 500);
        assert!(a.page_cache_holds((1, 10), 500));
        assert!(!a.page_cache_holds((1, 10), 501), "opened too long ago");
        assert!(!a.page_cache_holds((2, 10), 0), "another version");
    }
}
