//! A directory's listing as the metadata cache keeps it: a bucket of millions of objects is
//! millions of cached entries, so a listing keeps its names in one buffer and each entry in
//! a 32-byte slot (where an entry with its own name allocation took about 130 bytes), sorted
//! by name, with the rare link targets apart. An edit (a create, a close, a removal) makes
//! a changed copy: readers keep the listing they hold. The entries are kept in chunks of at
//! most `CHUNK_MAX`, shared between copies, so that an edit copies one chunk and not the
//! whole directory: a create in a directory of 16,000 entries costs what one in a directory
//! of a few hundred does. Within a chunk, a removed name's bytes stay until removed names
//! outweigh the live ones.

use super::dir::ListedEntry;
use super::inode::{Kind, ObjMeta};
use std::sync::Arc;
use std::time::Instant;

/// Entries in one chunk of a new listing; a chunk that grows past `CHUNK_MAX` is split in
/// two. A chunk is copied whole by each edit in it, and the chunks' table by every edit:
/// a file created and closed is two edits. At 128 an edit copies up to 8 KiB of slots,
/// and the table of the largest listing that is edited (100,000 names, see the
/// superblock) about 12 KiB. At 512 (up to 32 KiB a copy) the daemon faulted in 1.5-2.1
/// fresh pages per small file written, against 0.2-0.3.
const CHUNK: usize = 128;
const CHUNK_MAX: usize = 2 * CHUNK;

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
    /// Non-empty chunks in name order: every name of one sorts before those of the next.
    chunks: Vec<Arc<Chunk>>,
    /// How many entries come before each chunk.
    starts: Vec<usize>,
    len: usize,
    /// When the listing was taken: it vouches for a name's absence only briefly.
    pub listed_at: Instant,
}

/// A run of consecutive entries of a listing.
#[derive(Debug, Default)]
struct Chunk {
    names: String,
    /// Sorted by name (byte order), names unique.
    slots: Vec<Slot>,
    /// The targets that links' metadata gives, by their slot's `name_at`, in its order.
    targets: Vec<(u32, Arc<str>)>,
    /// Bytes of `names` that belong to removed entries.
    dead_name_bytes: usize,
}

impl Listing {
    /// The listing of `entries` (sorted by name, names unique), taken at `listed_at`.
    pub fn new(entries: Vec<ListedEntry>, listed_at: Instant) -> Listing {
        let mut chunks = Vec::with_capacity(entries.len().div_ceil(CHUNK));
        for run in entries.chunks(CHUNK) {
            let mut c = Chunk {
                names: String::with_capacity(run.iter().map(|e| e.name.len()).sum()),
                slots: Vec::with_capacity(run.len()),
                ..Chunk::default()
            };
            for e in run {
                if let Some(slot) = c.slot_of(e) {
                    c.slots.push(slot);
                }
            }
            if !c.slots.is_empty() {
                chunks.push(Arc::new(c));
            }
        }
        Listing::of_chunks(chunks, listed_at)
    }

    fn of_chunks(chunks: Vec<Arc<Chunk>>, listed_at: Instant) -> Listing {
        let mut starts = Vec::with_capacity(chunks.len());
        let mut len = 0;
        for c in &chunks {
            starts.push(len);
            len += c.slots.len();
        }
        Listing {
            chunks,
            starts,
            len,
            listed_at,
        }
    }

    /// How many entries the directory has.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The entries in name order, from the `skip`th on (at no cost for the ones skipped:
    /// readdir resumes a large directory at an offset many times).
    pub fn iter_from(&self, skip: usize) -> impl Iterator<Item = EntryRef<'_>> {
        let first = self
            .starts
            .partition_point(|&s| s <= skip)
            .saturating_sub(1);
        let within = skip.saturating_sub(self.starts.get(first).copied().unwrap_or(0));
        self.chunks
            .iter()
            .skip(first)
            .enumerate()
            .flat_map(move |(i, c)| {
                let from = if i == 0 { within.min(c.slots.len()) } else { 0 };
                c.slots[from..].iter().map(|s| c.entry(s))
            })
    }

    /// The entries in name order.
    pub fn iter(&self) -> impl Iterator<Item = EntryRef<'_>> {
        self.iter_from(0)
    }

    /// The chunk that holds `name`, or where it would go: the first whose last name is not
    /// below it, else the last.
    fn chunk_for(&self, name: &str) -> usize {
        let after = self.chunks.partition_point(|c| c.last_name() < name);
        after.min(self.chunks.len().saturating_sub(1))
    }

    /// Where `name` is (Ok) or would go (Err) in name order.
    pub fn position(&self, name: &str) -> Result<usize, usize> {
        if self.chunks.is_empty() {
            return Err(0);
        }
        let c = self.chunk_for(name);
        let start = self.starts[c];
        match self.chunks[c].position(name) {
            Ok(i) => Ok(start + i),
            Err(i) => Err(start + i),
        }
    }

    /// The entry called `name`, if the directory holds one.
    pub fn find(&self, name: &str) -> Option<EntryRef<'_>> {
        let c = self.chunks.get(self.chunk_for(name))?;
        c.position(name).ok().map(|i| c.entry(&c.slots[i]))
    }

    /// The bytes the listing holds on the heap, as the cache weighs it (chunks shared with
    /// other copies of the listing are counted in each).
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of::<Listing>()
            + self.chunks.capacity() * std::mem::size_of::<Arc<Chunk>>()
            + self.starts.capacity() * std::mem::size_of::<usize>()
            + self.chunks.iter().map(|c| c.heap_bytes()).sum::<usize>()
    }

    /// A copy with `entry` in place of the entry of its name, or added; as old as this one.
    /// Only the chunk that the name falls in is copied.
    pub fn with(&self, entry: &ListedEntry) -> Listing {
        if self.chunks.is_empty() {
            return Listing::new(vec![entry.clone()], self.listed_at);
        }
        let c = self.chunk_for(&entry.name);
        let edited = self.chunks[c].with(entry);
        let mut chunks = self.chunks.clone();
        if edited.slots.len() > CHUNK_MAX {
            let (low, high) = edited.split();
            chunks.splice(c..=c, [Arc::new(low), Arc::new(high)]);
        } else {
            chunks[c] = Arc::new(edited);
        }
        Listing::of_chunks(chunks, self.listed_at)
    }

    /// A copy without the entry called `name`; as old as this one.
    pub fn without(&self, name: &str) -> Listing {
        let c = self.chunk_for(name);
        let mut chunks = self.chunks.clone();
        if let Some(chunk) = self.chunks.get(c) {
            if chunk.position(name).is_ok() {
                let edited = chunk.without(name);
                if edited.slots.is_empty() {
                    chunks.remove(c);
                } else {
                    chunks[c] = Arc::new(edited);
                }
            }
        }
        Listing::of_chunks(chunks, self.listed_at)
    }
}

impl Chunk {
    /// Appends `e`'s name (and target) and returns its slot; None for a name longer than a
    /// visible one can be, which no listing holds.
    fn slot_of(&mut self, e: &ListedEntry) -> Option<Slot> {
        let name_len = u8::try_from(e.name.len()).ok()?;
        let name_at = self.append_name(&e.name, e.target.as_ref());
        Some(Slot {
            name_at,
            name_len,
            kind: e.kind,
            meta: e.meta.unwrap_or(NO_META),
        })
    }

    /// Appends a name (and its link target) to the name bytes; where it starts. A chunk's
    /// names (at most `CHUNK_MAX` live ones of up to 255 bytes, and as many removed) stay
    /// far below 4 GiB.
    fn append_name(&mut self, name: &str, target: Option<&Arc<str>>) -> u32 {
        let name_at = self.names.len() as u32;
        self.names.push_str(name);
        if let Some(t) = target {
            self.targets.push((name_at, t.clone()));
        }
        name_at
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

    /// The last name in name order (a chunk of a listing is never empty).
    fn last_name(&self) -> &str {
        self.slots.last().map_or("", |s| self.name(s))
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.slots.binary_search_by(|s| self.name(s).cmp(name))
    }

    fn heap_bytes(&self) -> usize {
        std::mem::size_of::<Chunk>()
            + self.names.capacity()
            + self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.targets.capacity() * std::mem::size_of::<(u32, Arc<str>)>()
    }

    /// A copy with `entry` in place of the entry of its name, or added.
    fn with(&self, entry: &ListedEntry) -> Chunk {
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

    /// A copy without the entry called `name`. The name's bytes stay behind until removed
    /// names outweigh the live ones, when the copy is compacted.
    fn without(&self, name: &str) -> Chunk {
        let Ok(at) = self.position(name) else {
            return self.copy();
        };
        let removed = self.slots[at];
        if self.dead_name_bytes + removed.name_len as usize > self.names.len() / 2 {
            let slots = self.slots[..at].iter().chain(&self.slots[at + 1..]);
            return self.compacted(slots, self.slots.len());
        }
        let mut copy = self.copy();
        copy.slots.remove(at);
        copy.set_target(removed.name_at, None);
        copy.dead_name_bytes += removed.name_len as usize;
        copy
    }

    /// A copy of the buffers as they are, with room for the one entry `with` adds.
    fn copy(&self) -> Chunk {
        let mut names = String::with_capacity(self.names.len() + 256);
        names.push_str(&self.names);
        let mut slots = Vec::with_capacity(self.slots.len() + 1);
        slots.extend_from_slice(&self.slots);
        Chunk {
            names,
            slots,
            targets: self.targets.clone(),
            dead_name_bytes: self.dead_name_bytes,
        }
    }

    /// Two compact halves of an overfull chunk.
    fn split(&self) -> (Chunk, Chunk) {
        let half = self.slots.len() / 2;
        (
            self.compacted(self.slots[..half].iter(), half),
            self.compacted(self.slots[half..].iter(), self.slots.len() - half),
        )
    }

    /// A compact chunk (only its live names' bytes) of `slots` of this one.
    fn compacted<'a>(&self, slots: impl Iterator<Item = &'a Slot>, count: usize) -> Chunk {
        let mut copy = Chunk {
            names: String::with_capacity(self.names.len() - self.dead_name_bytes),
            slots: Vec::with_capacity(count),
            ..Chunk::default()
        };
        for s in slots {
            let e = self.entry(s);
            let name_at = copy.append_name(e.name, e.target);
            copy.slots.push(Slot { name_at, ..*s });
        }
        copy
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
            churned.chunks[0].names.len() <= 2 * 4,
            "removed names are compacted away once they outweigh the live ones: {:?}",
            churned.chunks[0].names
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
        let targets: usize = l.chunks.iter().map(|c| c.targets.len()).sum();
        assert_eq!(targets, 1, "a removed link's target is dropped");
        let compacted = l.without("m").without("c");
        assert_eq!(names(&compacted), ["a"]);
        assert_eq!(target_of(&compacted, "a").as_deref(), Some("z"));
    }

    #[test]
    fn an_edit_copies_one_chunk_and_shares_the_rest() {
        let entries: Vec<_> = (0..10 * CHUNK)
            .map(|i| file(&format!("f{i:06}"), 1))
            .collect();
        let l = Listing::new(entries, Instant::now());
        assert_eq!(l.chunks.len(), 10);
        let shared = |a: &Listing, b: &Listing| {
            a.chunks
                .iter()
                .filter(|c| b.chunks.iter().any(|d| Arc::ptr_eq(c, d)))
                .count()
        };
        let added = l.with(&file("f000100x", 2));
        assert_eq!(shared(&l, &added), 9);
        assert_eq!(added.len(), 10 * CHUNK + 1);
        let (kept, gone) = (
            format!("f{:06}", 8 * CHUNK),
            format!("f{:06}", 8 * CHUNK + 1),
        );
        let replaced = added.with(&file(&kept, 3));
        assert_eq!(shared(&added, &replaced), 9);
        assert_eq!(replaced.len(), added.len());
        let removed = replaced.without(&gone);
        assert_eq!(shared(&replaced, &removed), 9);
        assert_eq!(removed.len(), added.len() - 1);
        assert_eq!(
            removed.find(&kept).and_then(|e| e.meta).map(|m| m.size),
            Some(3)
        );
    }

    #[test]
    fn edits_agree_with_a_sorted_map_across_chunk_splits_and_removals() {
        let mut model = std::collections::BTreeMap::new();
        let mut l = Listing::new(vec![], Instant::now());
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for step in 0..6000 {
            let name = format!("n{:05}", next(4000));
            // Mostly additions, so that chunks fill, split, and some empty again.
            if next(4) == 0 {
                model.remove(&name);
                l = l.without(&name);
            } else {
                model.insert(name.clone(), step);
                l = l.with(&file(&name, step));
            }
            assert_eq!(l.len(), model.len());
            if step % 500 != 499 {
                continue;
            }
            let listed: Vec<_> = l
                .iter()
                .map(|e| (e.name.to_string(), e.meta.unwrap().size))
                .collect();
            let wanted: Vec<_> = model.iter().map(|(n, s)| (n.clone(), *s)).collect();
            assert_eq!(listed, wanted);
            for c in &l.chunks {
                assert!(!c.slots.is_empty() && c.slots.len() <= CHUNK_MAX);
            }
            let keys: Vec<&String> = model.keys().collect();
            for probe in 0..50 {
                let name = format!("n{:05}", next(4100));
                let wanted = keys.binary_search(&&name);
                assert_eq!(l.position(&name), wanted, "{name}");
                assert_eq!(l.find(&name).map(|e| e.name), wanted.ok().map(|_| &*name));
                let skip = (probe * 97) % (keys.len() + 2);
                let from: Vec<_> = l.iter_from(skip).map(|e| e.name.to_string()).collect();
                let wanted: Vec<_> = keys.iter().skip(skip).map(|k| k.to_string()).collect();
                assert_eq!(from, wanted, "from {skip}");
            }
        }
        assert!(l.chunks.len() > 2, "the test went past one chunk");
    }

    #[test]
    fn a_chunk_emptied_by_removals_leaves_the_listing() {
        let entries: Vec<_> = (0..=CHUNK).map(|i| file(&format!("f{i:04}"), 1)).collect();
        let l = Listing::new(entries, Instant::now());
        assert_eq!(l.chunks.len(), 2);
        let last = format!("f{CHUNK:04}");
        let l = l.without(&last);
        assert_eq!((l.chunks.len(), l.len()), (1, CHUNK));
        assert!(l.find(&last).is_none());
        assert_eq!(l.iter_from(CHUNK - 1).count(), 1);
        let l = l.with(&file(&last, 2)).with(&file("a", 3));
        assert_eq!(l.position(&last), Ok(CHUNK + 1));
        assert_eq!(l.iter().next().map(|e| e.name), Some("a"));
    }
}
