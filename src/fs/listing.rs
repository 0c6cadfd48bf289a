//! A directory's listing as the metadata cache keeps it: a bucket of millions of objects is
//! millions of cached entries, so a listing keeps its names in one buffer and each entry in
//! a 32-byte slot (where an entry with its own name allocation took about 130 bytes), sorted
//! by name, with the rare link targets apart. An edit (a create, a close, a removal) makes
//! a changed copy: readers keep the listing they hold. A removed name's bytes stay in the
//! buffer until removed names outweigh the live ones.

use super::dir::ListedEntry;
use super::inode::{Kind, ObjMeta};
use std::sync::Arc;
use std::time::Instant;

/// One entry as a listing stores it.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// Where the name starts in the listing's name bytes.
    name_at: u32,
    /// A visible name is at most `NAME_MAX` (255) bytes.
    name_len: u8,
    kind: Kind,
    /// A file's or link's metadata; a directory's is unused.
    meta: ObjMeta,
}

const NO_META: ObjMeta = ObjMeta {
    generation: 0,
    size: 0,
    mtime: super::inode::UnixNanos::EPOCH,
};

/// One entry of a listing, borrowed from it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EntryRef<'a> {
    /// The name inside the directory.
    pub name: &'a str,
    /// File, directory or symbolic link.
    pub kind: Kind,
    /// The object's metadata, for files and links.
    pub meta: Option<ObjMeta>,
    /// A link's target, when its object's metadata gives it.
    pub target: Option<&'a Arc<str>>,
}

impl EntryRef<'_> {
    /// The entry as an owned `ListedEntry`.
    pub fn to_owned(self) -> ListedEntry {
        ListedEntry {
            name: self.name.to_string(),
            kind: self.kind,
            meta: self.meta,
            target: self.target.cloned(),
        }
    }
}

/// A directory's visible entries, sorted by name.
#[derive(Debug)]
pub struct Listing {
    names: String,
    /// Sorted by name (byte order), names unique.
    slots: Vec<Slot>,
    /// The targets that links' metadata gives, by their slot's `name_at`, in its order
    /// (names are only ever appended).
    targets: Vec<(u32, Arc<str>)>,
    /// Bytes of `names` that belong to removed entries.
    dead_name_bytes: usize,
    /// When the listing was taken: it vouches for a name's absence only briefly.
    pub listed_at: Instant,
}

impl Listing {
    /// The listing of `entries` (sorted by name, names unique), taken at `listed_at`.
    pub fn new(entries: Vec<ListedEntry>, listed_at: Instant) -> Listing {
        let mut l = Listing {
            names: String::with_capacity(entries.iter().map(|e| e.name.len()).sum()),
            slots: Vec::with_capacity(entries.len()),
            targets: Vec::new(),
            dead_name_bytes: 0,
            listed_at,
        };
        for e in entries {
            match l.slot_of(&e) {
                Some(slot) => l.slots.push(slot),
                None => break,
            }
        }
        l
    }

    /// Appends `e`'s name (and target) and returns its slot, or None past 4 GiB of names
    /// (some 16 million entries of the longest names; no cache holds such a listing).
    fn slot_of(&mut self, e: &ListedEntry) -> Option<Slot> {
        let (name_at, name_len) = self.append_name(&e.name, e.target.as_ref())?;
        Some(Slot {
            name_at,
            name_len,
            kind: e.kind,
            meta: e.meta.unwrap_or(NO_META),
        })
    }

    /// Appends a name (and its link target) to the name bytes: where it starts and its
    /// length, or None past 4 GiB of names.
    fn append_name(&mut self, name: &str, target: Option<&Arc<str>>) -> Option<(u32, u8)> {
        let (Ok(name_at), Ok(name_len)) =
            (u32::try_from(self.names.len()), u8::try_from(name.len()))
        else {
            tracing::error!(
                entries = self.slots.len(),
                "directory listing cut at 4 GiB of names"
            );
            return None;
        };
        self.names.push_str(name);
        if let Some(t) = target {
            self.targets.push((name_at, t.clone()));
        }
        Some((name_at, name_len))
    }

    fn entry(&self, s: &Slot) -> EntryRef<'_> {
        EntryRef {
            name: self.name(s),
            kind: s.kind,
            meta: (s.kind != Kind::Dir).then_some(s.meta),
            target: self
                .targets
                .binary_search_by_key(&s.name_at, |(at, _)| *at)
                .ok()
                .map(|i| &self.targets[i].1),
        }
    }

    fn name(&self, s: &Slot) -> &str {
        let at = s.name_at as usize;
        &self.names[at..at + s.name_len as usize]
    }

    /// How many entries the directory has.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// The entries in name order, from the `skip`th on (at no cost for the ones skipped:
    /// readdir resumes a large directory at an offset many times).
    pub fn iter_from(&self, skip: usize) -> impl Iterator<Item = EntryRef<'_>> {
        let from = skip.min(self.slots.len());
        self.slots[from..].iter().map(|s| self.entry(s))
    }

    /// The entries in name order.
    pub fn iter(&self) -> impl Iterator<Item = EntryRef<'_>> {
        self.iter_from(0)
    }

    /// Where `name` is (Ok) or would go (Err) in name order.
    pub fn position(&self, name: &str) -> Result<usize, usize> {
        self.slots.binary_search_by(|s| self.name(s).cmp(name))
    }

    /// The entry called `name`, if the directory holds one.
    pub fn find(&self, name: &str) -> Option<EntryRef<'_>> {
        self.position(name).ok().map(|i| self.entry(&self.slots[i]))
    }

    /// The bytes the listing holds on the heap, as the cache weighs it.
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of::<Listing>()
            + self.names.capacity()
            + self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.targets.capacity() * std::mem::size_of::<(u32, Arc<str>)>()
    }

    /// A copy with `entry` in place of the entry of its name, or added; as old as this one.
    /// The copy is a copy of the buffers as they are (a create in a directory of thousands
    /// of entries is a memcpy, not a rebuild of every entry), with the one entry changed.
    pub fn with(&self, entry: &ListedEntry) -> Listing {
        let mut copy = self.copy();
        match copy.position(&entry.name) {
            Ok(at) => {
                let name_at = copy.slots[at].name_at;
                copy.slots[at].kind = entry.kind;
                copy.slots[at].meta = entry.meta.unwrap_or(NO_META);
                copy.set_target(name_at, entry.target.as_ref());
            }
            Err(at) => {
                if let Some(slot) = copy.slot_of(entry) {
                    copy.slots.insert(at, slot);
                }
            }
        }
        copy
    }

    /// A copy without the entry called `name`; as old as this one. The name's bytes stay
    /// behind until removed names outweigh the live ones, when the copy is compacted.
    pub fn without(&self, name: &str) -> Listing {
        let Ok(at) = self.position(name) else {
            return self.copy();
        };
        let removed = self.slots[at];
        if self.dead_name_bytes + removed.name_len as usize > self.names.len() / 2 {
            return self.compacted_without(at);
        }
        let mut copy = self.copy();
        copy.slots.remove(at);
        copy.set_target(removed.name_at, None);
        copy.dead_name_bytes += removed.name_len as usize;
        copy
    }

    /// A copy of the buffers as they are, with room for the one entry `with` adds.
    fn copy(&self) -> Listing {
        let mut names = String::with_capacity(self.names.len() + 256);
        names.push_str(&self.names);
        let mut slots = Vec::with_capacity(self.slots.len() + 1);
        slots.extend_from_slice(&self.slots);
        Listing {
            names,
            slots,
            targets: self.targets.clone(),
            dead_name_bytes: self.dead_name_bytes,
            listed_at: self.listed_at,
        }
    }

    /// Makes `target` the link target of the entry whose name starts at `name_at`.
    fn set_target(&mut self, name_at: u32, target: Option<&Arc<str>>) {
        match (
            self.targets.binary_search_by_key(&name_at, |(at, _)| *at),
            target,
        ) {
            (Ok(i), Some(t)) => self.targets[i].1 = t.clone(),
            (Ok(i), None) => {
                self.targets.remove(i);
            }
            (Err(i), Some(t)) => self.targets.insert(i, (name_at, t.clone())),
            (Err(_), None) => {}
        }
    }

    /// A compact copy (only live names' bytes) of every entry but the `skip`th.
    fn compacted_without(&self, skip: usize) -> Listing {
        let mut copy = Listing {
            names: String::with_capacity(self.names.len() - self.dead_name_bytes + 256),
            slots: Vec::with_capacity(self.slots.len()),
            targets: Vec::new(),
            dead_name_bytes: 0,
            listed_at: self.listed_at,
        };
        for (i, s) in self.slots.iter().enumerate() {
            if i == skip {
                continue;
            }
            let e = self.entry(s);
            if let Some((name_at, _)) = copy.append_name(e.name, e.target) {
                copy.slots.push(Slot { name_at, ..*s });
            }
        }
        copy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, size: u64) -> ListedEntry {
        ListedEntry {
            name: name.to_string(),
            kind: Kind::File,
            meta: Some(ObjMeta { size, ..NO_META }),
            target: None,
        }
    }

    fn names(l: &Listing) -> Vec<&str> {
        l.iter().map(|e| e.name).collect()
    }

    #[test]
    fn a_slot_is_32_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 32);
    }

    #[test]
    fn entries_keep_names_kinds_metadata_and_targets() {
        let link = ListedEntry {
            name: "l".into(),
            kind: Kind::Symlink,
            meta: Some(NO_META),
            target: Some(Arc::from("../t")),
        };
        let dir = ListedEntry {
            name: "d".into(),
            kind: Kind::Dir,
            meta: None,
            target: None,
        };
        let l = Listing::new(vec![file("a", 1), dir, link, file("z", 9)], Instant::now());
        assert_eq!(names(&l), ["a", "d", "l", "z"]);
        assert_eq!(l.find("a").and_then(|e| e.meta).map(|m| m.size), Some(1));
        assert_eq!(
            l.find("d").map(|e| (e.kind, e.meta)),
            Some((Kind::Dir, None))
        );
        assert_eq!(
            l.find("l").and_then(|e| e.target).map(|t| &**t),
            Some("../t")
        );
        assert_eq!(l.find("z").and_then(|e| e.target), None);
        assert!(l.find("b").is_none());
        assert_eq!(
            names(&Listing::new(vec![], Instant::now())),
            Vec::<&str>::new()
        );
        let from: Vec<_> = l.iter_from(2).map(|e| e.name).collect();
        assert_eq!(from, ["l", "z"]);
        assert_eq!(l.iter_from(99).count(), 0);
    }

    #[test]
    fn edits_are_copies_that_stay_sorted_and_compact() {
        let l = Listing::new(vec![file("b", 1), file("d", 2)], Instant::now());
        let added = l.with(&file("c", 3)).with(&file("a", 0));
        assert_eq!(names(&added), ["a", "b", "c", "d"]);
        assert_eq!(names(&l), ["b", "d"], "the original is untouched");
        let replaced = added.with(&file("c", 30));
        assert_eq!(
            replaced.find("c").and_then(|e| e.meta).map(|m| m.size),
            Some(30)
        );
        assert_eq!(replaced.len(), 4);
        let mut churned = replaced;
        for i in 0..1000 {
            churned = churned
                .with(&file(&format!("tmp{i}"), 1))
                .without(&format!("tmp{i}"));
        }
        assert_eq!(names(&churned), ["a", "b", "c", "d"]);
        assert!(
            churned.names.len() <= 2 * 4,
            "removed names are compacted away once they outweigh the live ones: {:?}",
            churned.names
        );
        assert_eq!(churned.without("nope").len(), 4);
    }

    #[test]
    fn link_targets_follow_their_entries_through_edits() {
        let link = |name: &str, target: &str| ListedEntry {
            name: name.into(),
            kind: Kind::Symlink,
            meta: Some(NO_META),
            target: Some(Arc::from(target)),
        };
        let target_of = |l: &Listing, name: &str| l.find(name).and_then(|e| e.target).cloned();
        let l = Listing::new(vec![file("a", 1), link("m", "x")], Instant::now());
        let l = l.with(&link("b", "y")).with(&link("a", "z"));
        assert_eq!(
            target_of(&l, "a").as_deref(),
            Some("z"),
            "a file became a link"
        );
        assert_eq!(target_of(&l, "b").as_deref(), Some("y"));
        let l = l.with(&file("m", 2)).with(&link("b", "w"));
        assert_eq!(target_of(&l, "m"), None, "a link became a file");
        assert_eq!(target_of(&l, "b").as_deref(), Some("w"));
        let l = l.without("b").with(&file("c", 3));
        assert_eq!(names(&l), ["a", "c", "m"]);
        assert_eq!(target_of(&l, "a").as_deref(), Some("z"));
        assert_eq!(target_of(&l, "c"), None);
        assert_eq!(l.targets.len(), 1, "a removed link's target is dropped");
        let compacted = l.without("m").without("c");
        assert_eq!(names(&compacted), ["a"]);
        assert_eq!(target_of(&compacted, "a").as_deref(), Some("z"));
    }
}
