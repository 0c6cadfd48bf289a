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
//! zero. The root is never forgotten.

use crate::gcs;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

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

/// What a file's object looked like when last fetched: its identity and times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjMeta {
    /// Object generation; a replaced object gets a new one.
    pub generation: i64,
    /// Object size in bytes (appends grow it without changing the generation).
    pub size: u64,
    /// Last update time of the object.
    pub mtime: SystemTime,
    /// Creation time of this generation.
    pub crtime: SystemTime,
}

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
            mtime: m.update_time,
            crtime: m.create_time,
        }
    }
}

/// One inode: fixed kind, a key that follows renames, changing state.
#[derive(Debug)]
pub struct Inode {
    /// Inode number given to the kernel.
    pub ino: u64,
    /// File or directory.
    pub kind: Kind,
    state: Mutex<InodeState>,
}

#[derive(Debug)]
struct InodeState {
    /// Object key (file) or prefix ending in `/` (directory; empty for the bucket root).
    /// Changes on rename: the kernel keeps using this inode under its new name. Shared with
    /// the table's index by key, so a name is stored once however many maps point at it.
    key: Arc<str>,
    lookups: u64,
    meta: Option<ObjMeta>,
    checked: Option<Instant>,
    page_cache_identity: Option<(i64, u64)>,
    /// The mount's open clock (bytes opened so far) at the last open.
    opened_at: u64,
    /// A symbolic link's target, once known.
    target: Option<Arc<str>>,
}

impl Inode {
    fn state(&self) -> MutexGuard<'_, InodeState> {
        // A poisoned lock only means another request panicked mid-update of plain data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The object key (file) or prefix ending in `/` (directory) this inode stands for now.
    pub fn key(&self) -> String {
        self.state().key.to_string()
    }

    /// A symbolic link's target, if known yet.
    pub fn target(&self) -> Option<Arc<str>> {
        self.state().target.clone()
    }

    /// Records a symbolic link's target, from its object's metadata or bytes.
    pub fn set_target(&self, target: Arc<str>) {
        self.state().target = Some(target);
    }

    /// The last fetched metadata and when it was fetched.
    pub fn meta(&self) -> (Option<ObjMeta>, Option<Instant>) {
        let s = self.state();
        (s.meta, s.checked)
    }

    /// Records freshly fetched metadata of the inode's generation and returns what the inode
    /// now holds: a newer generation belongs to a new inode (see `InodeTable::lookup`), so it
    /// only restarts the TTL here.
    pub fn refresh(&self, meta: ObjMeta) -> ObjMeta {
        let mut s = self.state();
        s.checked = Some(Instant::now());
        match s.meta {
            Some(old) if old.generation != meta.generation => old,
            _ => {
                s.meta = Some(meta);
                meta
            }
        }
    }

    /// Installs the metadata of a new generation written through this mount (a staged file
    /// uploaded over the old one): the kernel's page cache of this inode already holds the new
    /// bytes, since they were written through it.
    pub fn replace(&self, meta: ObjMeta) {
        let mut s = self.state();
        s.checked = Some(Instant::now());
        s.meta = Some(meta);
        s.page_cache_identity = Some(meta.identity());
    }

    /// True when the kernel's page cache was filled with this identity by an open at or
    /// after `since` on the mount's open clock (so reads may never reach the daemon). Pages of
    /// older opens are assumed evicted: the page cache cannot hold a dataset larger than memory.
    pub fn page_cache_holds(&self, identity: (i64, u64), since: u64) -> bool {
        let s = self.state();
        s.page_cache_identity == Some(identity) && s.opened_at >= since
    }

    /// Records the identity a new open will read, at `clock` on the mount's open clock, and
    /// says whether the kernel's page cache, filled under the previous open, holds the same
    /// bytes (FOPEN_KEEP_CACHE: if the kernel evicted them meanwhile, keeping costs nothing).
    pub fn note_open(&self, identity: (i64, u64), clock: u64) -> bool {
        let mut s = self.state();
        let keep = s.page_cache_identity == Some(identity);
        s.page_cache_identity = Some(identity);
        s.opened_at = clock;
        keep
    }
}

/// All inodes the kernel knows, by number and by key.
#[derive(Debug)]
pub struct InodeTable {
    tables: Mutex<Tables>,
}

/// The table's maps: SipHash, the standard one, was a tenth of a walk's daemon CPU (every
/// readdirplus entry is hashed twice); foldhash is seeded per process too.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

#[derive(Debug)]
struct Tables {
    by_ino: FastMap<u64, Arc<Inode>>,
    /// By key alone: a directory's key ends in `/` (or is the root's); a file's or a link's never does.
    by_key: FastMap<Arc<str>, u64>,
    next_ino: u64,
}

impl Tables {
    /// Gives back the room of forgotten inodes once the maps are mostly empty: a walk of a
    /// large bucket grows them to millions of slots, and the kernel may forget all of it.
    fn shrink_when_sparse(&mut self) {
        if self.by_ino.capacity() > 4 * self.by_ino.len() + 1024 {
            self.by_ino.shrink_to_fit();
            self.by_key.shrink_to_fit();
        }
    }
}

/// A file's or a link's key never ends in `/`; a directory's always does, or is the bucket
/// root's `""`.
fn key_fits_kind(key: &str, kind: Kind) -> bool {
    (kind == Kind::Dir) == (key.is_empty() || key.ends_with('/'))
}

impl InodeTable {
    /// A table holding only the root, whose key is `root_key` (empty or ending in `/`).
    pub fn new(root_key: String) -> Self {
        let root_key: Arc<str> = root_key.into();
        let root = Arc::new(Inode {
            ino: ROOT_INO,
            kind: Kind::Dir,
            state: Mutex::new(InodeState {
                key: root_key.clone(),
                lookups: 1,
                meta: None,
                checked: None,
                page_cache_identity: None,
                opened_at: 0,
                target: None,
            }),
        });
        let mut by_ino = FastMap::default();
        by_ino.insert(ROOT_INO, root);
        let mut by_key = FastMap::default();
        by_key.insert(root_key, ROOT_INO);
        InodeTable {
            tables: Mutex::new(Tables {
                by_ino,
                by_key,
                next_ino: ROOT_INO + 1,
            }),
        }
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many inodes the kernel holds, the root included.
    pub fn len(&self) -> usize {
        self.tables().by_ino.len()
    }

    /// The inode with this number, if the kernel still holds it.
    pub fn get(&self, ino: u64) -> Option<Arc<Inode>> {
        self.tables().by_ino.get(&ino).cloned()
    }

    /// A stable number for `key` without taking a lookup (for plain readdir entries): the
    /// inode's number when it exists, else a hash outside the range of allocated numbers.
    pub fn peek_ino(&self, key: &str, kind: Kind) -> u64 {
        debug_assert!(key_fits_kind(key, kind), "{key:?} as {kind:?}");
        let t = self.tables();
        if let Some(ino) = t.by_key.get(key) {
            return *ino;
        }
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        h.finish() | (1 << 63)
    }

    /// Finds or creates the inode of `key` and counts one kernel lookup on it; `meta`, when
    /// given, refreshes a file's metadata, and a newer generation than the inode's, or another
    /// kind (a file replaced by a link), gets a new inode.
    pub fn lookup(&self, key: &str, kind: Kind, meta: Option<ObjMeta>) -> Arc<Inode> {
        debug_assert!(key_fits_kind(key, kind), "{key:?} as {kind:?}");
        let mut t = self.tables();
        let existing = t
            .by_key
            .get(key)
            .and_then(|ino| t.by_ino.get(ino))
            .filter(|inode| inode.kind == kind)
            .filter(|inode| match (inode.meta().0, meta) {
                (Some(old), Some(new)) => new.generation <= old.generation,
                _ => true,
            });
        let inode = match existing {
            Some(inode) => inode.clone(),
            None => {
                let ino = t.next_ino;
                t.next_ino += 1;
                let key: Arc<str> = key.into();
                let inode = Arc::new(Inode {
                    ino,
                    kind,
                    state: Mutex::new(InodeState {
                        key: key.clone(),
                        lookups: 0,
                        meta: None,
                        checked: None,
                        page_cache_identity: None,
                        opened_at: 0,
                        target: None,
                    }),
                });
                t.by_ino.insert(ino, inode.clone());
                t.by_key.insert(key, ino);
                inode
            }
        };
        inode.state().lookups += 1;
        if let Some(m) = meta {
            inode.refresh(m);
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
        let Some(inode) = t.by_ino.get(&ino).cloned() else {
            return false;
        };
        let gone = {
            let mut s = inode.state();
            s.lookups = s.lookups.saturating_sub(n);
            s.lookups == 0
        };
        if gone {
            t.by_ino.remove(&ino);
            let key = inode.state().key.clone();
            if t.by_key.get(&key) == Some(&ino) {
                t.by_key.remove(&key);
            }
            t.shrink_when_sparse();
        }
        gone
    }

    /// The inode of `key` if the kernel holds one, without counting a lookup.
    pub fn find(&self, key: &str, kind: Kind) -> Option<Arc<Inode>> {
        debug_assert!(key_fits_kind(key, kind), "{key:?} as {kind:?}");
        let t = self.tables();
        let ino = t.by_key.get(key)?;
        t.by_ino.get(ino).cloned()
    }

    /// After a rename of `from` to `to` (both files, or both directory prefixes ending in
    /// `/`): the inodes the kernel holds follow their objects, a directory's descendants
    /// with it. An inode held under `to` before (the replaced target) keeps its key but
    /// loses the name.
    pub fn rename(&self, from: &str, to: &str, kind: Kind) {
        debug_assert!(key_fits_kind(from, kind) && key_fits_kind(to, kind));
        let mut t = self.tables();
        let moved: Vec<(Arc<str>, u64)> = t
            .by_key
            .iter()
            .filter(|(k, _)| match kind {
                Kind::Dir => k.starts_with(from),
                Kind::File | Kind::Symlink => &***k == from,
            })
            .map(|(k, ino)| (k.clone(), *ino))
            .collect();
        if kind != Kind::Dir {
            t.by_key.remove(to);
        }
        for (old, ino) in moved {
            let new: Arc<str> = format!("{to}{}", &old[from.len()..]).into();
            t.by_key.remove(&old);
            t.by_key.insert(new.clone(), ino);
            if let Some(inode) = t.by_ino.get(&ino) {
                inode.state().key = new;
            }
        }
    }

    /// After `key` was deleted: the name no longer leads to the inode (a new object of the
    /// same name gets a new inode); the kernel may still hold the inode through open files.
    pub fn unlink(&self, key: &str, kind: Kind) {
        debug_assert!(key_fits_kind(key, kind), "{key:?} as {kind:?}");
        self.tables().by_key.remove(key);
    }
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

    fn meta(generation: i64, size: u64) -> ObjMeta {
        ObjMeta {
            generation,
            size,
            mtime: SystemTime::UNIX_EPOCH,
            crtime: SystemTime::UNIX_EPOCH,
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
            v1.refresh(meta(2, 5)),
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
