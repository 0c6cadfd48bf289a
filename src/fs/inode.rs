//! The inode table: one inode number per object key (files) or prefix (directories), with the
//! kernel's lookup count, and each file's last known (generation, size) identity.
//!
//! Keys of directories end in `/` and keys of files do not, so a file `a` and a directory `a/`
//! never share an inode. An inode lives while the kernel holds lookups on it; `forget` drops
//! it when the count reaches zero. The root is never forgotten.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

/// Inode number of the mount's root directory.
pub const ROOT_INO: u64 = 1;

/// File or directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file backed by one object.
    File,
    /// A directory: a prefix ending in `/`, explicit (a folder or marker object) or implicit.
    Dir,
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

/// One inode: fixed key and kind, changing state.
#[derive(Debug)]
pub struct Inode {
    /// Inode number given to the kernel.
    pub ino: u64,
    /// Object key (file) or prefix ending in `/` (directory; empty for the bucket root).
    pub key: String,
    /// File or directory.
    pub kind: Kind,
    state: Mutex<InodeState>,
}

#[derive(Debug)]
struct InodeState {
    lookups: u64,
    meta: Option<ObjMeta>,
    checked: Option<Instant>,
    page_cache_identity: Option<(i64, u64)>,
}

impl Inode {
    fn state(&self) -> MutexGuard<'_, InodeState> {
        // A poisoned lock only means another request panicked mid-update of plain data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last fetched metadata and when it was fetched.
    pub fn meta(&self) -> (Option<ObjMeta>, Option<Instant>) {
        let s = self.state();
        (s.meta, s.checked)
    }

    /// Records freshly fetched metadata.
    pub fn set_meta(&self, meta: ObjMeta) {
        let mut s = self.state();
        s.meta = Some(meta);
        s.checked = Some(Instant::now());
    }

    /// Records the identity a new open will read and says whether the kernel's page cache,
    /// filled under the previous open, still holds the same bytes (FOPEN_KEEP_CACHE).
    pub fn note_open(&self, identity: (i64, u64)) -> bool {
        let mut s = self.state();
        let keep = s.page_cache_identity == Some(identity);
        s.page_cache_identity = Some(identity);
        keep
    }
}

/// All inodes the kernel knows, by number and by key.
#[derive(Debug)]
pub struct InodeTable {
    tables: Mutex<Tables>,
}

#[derive(Debug)]
struct Tables {
    by_ino: HashMap<u64, Arc<Inode>>,
    by_key: HashMap<(String, bool), u64>,
    next_ino: u64,
}

impl InodeTable {
    /// A table holding only the root, whose key is `root_key` (empty or ending in `/`).
    pub fn new(root_key: String) -> Self {
        let root = Arc::new(Inode {
            ino: ROOT_INO,
            key: root_key.clone(),
            kind: Kind::Dir,
            state: Mutex::new(InodeState {
                lookups: 1,
                meta: None,
                checked: None,
                page_cache_identity: None,
            }),
        });
        let mut by_ino = HashMap::new();
        by_ino.insert(ROOT_INO, root);
        let mut by_key = HashMap::new();
        by_key.insert((root_key, true), ROOT_INO);
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

    /// The inode with this number, if the kernel still holds it.
    pub fn get(&self, ino: u64) -> Option<Arc<Inode>> {
        self.tables().by_ino.get(&ino).cloned()
    }

    /// A stable number for `key` without taking a lookup (for plain readdir entries): the
    /// inode's number when it exists, else a hash outside the range of allocated numbers.
    pub fn peek_ino(&self, key: &str, kind: Kind) -> u64 {
        let t = self.tables();
        if let Some(ino) = t.by_key.get(&(key.to_string(), kind == Kind::Dir)) {
            return *ino;
        }
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        h.finish() | (1 << 63)
    }

    /// Finds or creates the inode of `key` and counts one kernel lookup on it; `meta`, when
    /// given, refreshes a file's metadata.
    pub fn lookup(&self, key: &str, kind: Kind, meta: Option<ObjMeta>) -> Arc<Inode> {
        let mut t = self.tables();
        let map_key = (key.to_string(), kind == Kind::Dir);
        let inode = match t.by_key.get(&map_key).and_then(|ino| t.by_ino.get(ino)) {
            Some(inode) => inode.clone(),
            None => {
                let ino = t.next_ino;
                t.next_ino += 1;
                let inode = Arc::new(Inode {
                    ino,
                    key: key.to_string(),
                    kind,
                    state: Mutex::new(InodeState {
                        lookups: 0,
                        meta: None,
                        checked: None,
                        page_cache_identity: None,
                    }),
                });
                t.by_ino.insert(ino, inode.clone());
                t.by_key.insert(map_key, ino);
                inode
            }
        };
        {
            let mut s = inode.state();
            s.lookups += 1;
            if let Some(m) = meta {
                s.meta = Some(m);
                s.checked = Some(Instant::now());
            }
        }
        inode
    }

    /// The kernel dropped `n` lookups on `ino`; the inode goes when none are left.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let mut t = self.tables();
        let Some(inode) = t.by_ino.get(&ino).cloned() else {
            return;
        };
        let gone = {
            let mut s = inode.state();
            s.lookups = s.lookups.saturating_sub(n);
            s.lookups == 0
        };
        if gone {
            t.by_ino.remove(&ino);
            t.by_key
                .remove(&(inode.key.clone(), inode.kind == Kind::Dir));
        }
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

    #[test]
    fn keep_cache_only_for_the_same_identity() {
        let t = InodeTable::new(String::new());
        let a = t.lookup("a", Kind::File, None);
        assert!(!a.note_open((1, 10)));
        assert!(a.note_open((1, 10)));
        assert!(!a.note_open((2, 10)));
        assert!(!a.note_open((2, 11)));
    }
}
