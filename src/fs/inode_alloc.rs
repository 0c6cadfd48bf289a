//! The memory of one inode: a shared handle to a single heap allocation that holds the
//! inode's fixed head (number, kind, reference count, whether its key leads to it), its
//! changing state, and the key it was created with, inline.
//!
//! Why not `Inode` with a `Box<str>` key: a walk of a large bucket leaves an inode per
//! object, and two allocations with `Arc`'s two 64-bit counters and a fat key pointer cost
//! 160 bytes for a 28-byte key (chunks of 112 and 48); this one costs 112. Nor
//! `triomphe::ThinArc`: its 64-bit count and length take 8 bytes more, which at such keys is
//! the next malloc size class. A handle is one pointer, so the index slots that hold
//! inodes stay 8 bytes.

use super::inode::Kind;
use std::alloc::{self, Layout};
use std::marker::PhantomData;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::{self, AtomicBool, AtomicU32, Ordering};

/// The start of an inode's allocation; the key's bytes follow it.
#[repr(C)]
pub struct Head<S> {
    refs: AtomicU32,
    key_len: u16,
    /// File, directory or symbolic link.
    pub kind: Kind,
    /// Whether the inode's current key leads to it (the inode table's business).
    named: AtomicBool,
    /// Inode number given to the kernel.
    pub ino: u64,
    /// What changes over the inode's life.
    pub state: S,
}

/// A counted reference to an inode's allocation (see the module doc).
pub struct Shared<S> {
    ptr: NonNull<Head<S>>,
    _owns: PhantomData<Head<S>>,
}

// SAFETY: a `Shared` is a reference-counted pointer like `Arc`: the count is atomic, and the
// head is only ever reached through `&`, so sharing it needs `S: Sync` and handing the last
// reference (which drops `S`) to another thread needs `S: Send`.
unsafe impl<S: Send + Sync> Send for Shared<S> {}
// SAFETY: as above.
unsafe impl<S: Send + Sync> Sync for Shared<S> {}

/// The layout of an allocation with a key of `len` bytes.
fn layout<S>(len: usize) -> Layout {
    let size = std::mem::size_of::<Head<S>>() + len;
    // Keys are at most u16::MAX bytes (see `Shared::new`), far from isize::MAX.
    Layout::from_size_align(size, std::mem::align_of::<Head<S>>())
        .unwrap_or_else(|_| unreachable!("a {size}-byte inode"))
}

impl<S> Shared<S> {
    /// A new inode `ino` of `kind` and `key`, with `state`. Keys are at most 1,024 bytes
    /// (the service's limit; the kernel's paths are at most 4,096): a longer one is a bug.
    pub fn new(ino: u64, kind: Kind, key: &str, state: S) -> Self {
        let key_len = u16::try_from(key.len()).expect("an inode key longer than 64 KiB");
        let layout = layout::<S>(key.len());
        // SAFETY: the layout is not zero-sized (it holds a head).
        let raw = unsafe { alloc::alloc(layout) }.cast::<Head<S>>();
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        // SAFETY: `raw` is a fresh allocation of `layout`: room for the head, then the key.
        unsafe {
            raw.write(Head {
                refs: AtomicU32::new(1),
                key_len,
                kind,
                named: AtomicBool::new(false),
                ino,
                state,
            });
            std::ptr::copy_nonoverlapping(key.as_ptr(), key_bytes(raw), key.len());
        }
        Shared {
            ptr,
            _owns: PhantomData,
        }
    }

    fn head(&self) -> &Head<S> {
        // SAFETY: the allocation lives while this reference counts in it.
        unsafe { self.ptr.as_ref() }
    }

    /// The key the inode was created with.
    pub fn first_key(&self) -> &str {
        let len = usize::from(self.head().key_len);
        // SAFETY: `new` copied `len` bytes of a `str` there, and they never change.
        unsafe {
            let bytes = std::slice::from_raw_parts(key_bytes(self.ptr.as_ptr()), len);
            std::str::from_utf8_unchecked(bytes)
        }
    }

    /// Whether the inode's current key leads to it.
    pub fn is_named(&self) -> bool {
        self.head().named.load(Ordering::Relaxed)
    }

    /// Marks whether the inode's current key leads to it (under the inode table's lock).
    pub fn set_named(&self, named: bool) {
        self.head().named.store(named, Ordering::Relaxed);
    }

    /// Whether both are the same inode.
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        a.ptr == b.ptr
    }

    /// The heap the allocation takes: glibc's chunk for it, the size asked for plus an
    /// 8-byte header, in steps of 16 bytes, at least 32.
    pub fn heap_bytes(&self) -> u64 {
        let asked = layout::<S>(usize::from(self.head().key_len)).size();
        ((asked + 8).next_multiple_of(16).max(32)) as u64
    }
}

/// Where the key's bytes start: right after the head (bytes need no alignment). Derived
/// from the allocation's own pointer, whose provenance covers the key.
fn key_bytes<S>(head: *mut Head<S>) -> *mut u8 {
    // SAFETY: the allocation extends past the head by the key's length.
    unsafe { head.cast::<u8>().add(std::mem::size_of::<Head<S>>()) }
}

impl<S> Deref for Shared<S> {
    type Target = Head<S>;

    fn deref(&self) -> &Head<S> {
        self.head()
    }
}

impl<S> Clone for Shared<S> {
    fn clone(&self) -> Self {
        // As `Arc`: a new reference is made from an existing one, so no ordering is needed.
        let before = self.head().refs.fetch_add(1, Ordering::Relaxed);
        if before > i32::MAX as u32 {
            // Two billion references to one inode can only be a leak; wrapping would free it
            // while in use.
            std::process::abort();
        }
        Shared {
            ptr: self.ptr,
            _owns: PhantomData,
        }
    }
}

impl<S> Drop for Shared<S> {
    fn drop(&mut self) {
        if self.head().refs.fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        // As `Arc`: every other reference's uses happen before the free.
        atomic::fence(Ordering::Acquire);
        let layout = layout::<S>(usize::from(self.head().key_len));
        // SAFETY: this was the last reference: nothing else reaches the allocation.
        unsafe {
            std::ptr::drop_in_place(self.ptr.as_ptr());
            alloc::dealloc(self.ptr.as_ptr().cast(), layout);
        }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Shared<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inode")
            .field("ino", &self.ino)
            .field("kind", &self.kind)
            .field("first_key", &self.first_key())
            .field("named", &self.is_named())
            .field("state", &self.state)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// Counts its drops.
    #[derive(Debug)]
    struct Dropped(Arc<AtomicUsize>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn keys_of_any_length_come_back_and_the_state_drops_once() {
        for key in ["", "a", "dir00001/sample_00000001.jpg", &"k/".repeat(512)] {
            let drops = Arc::new(AtomicUsize::new(0));
            let a = Shared::new(7, Kind::File, key, Dropped(drops.clone()));
            let b = a.clone();
            drop(a);
            assert_eq!(b.first_key(), key);
            assert_eq!((b.ino, b.kind), (7, Kind::File));
            assert_eq!(drops.load(Ordering::SeqCst), 0, "b still holds it");
            drop(b);
            assert_eq!(drops.load(Ordering::SeqCst), 1);
        }
    }

    #[test]
    fn threads_share_and_drop_an_inode() {
        let drops = Arc::new(AtomicUsize::new(0));
        let inode = Shared::new(9, Kind::Dir, "d/", Dropped(drops.clone()));
        std::thread::scope(|s| {
            for _ in 0..4 {
                let mine = inode.clone();
                s.spawn(move || {
                    for _ in 0..10_000 {
                        let c = mine.clone();
                        assert_eq!(c.first_key(), "d/");
                    }
                });
            }
        });
        assert!(!inode.is_named());
        inode.set_named(true);
        assert!(inode.is_named());
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        drop(inode);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn an_inode_with_its_head_fits_a_small_malloc_chunk() {
        // The head of an inode's allocation (number, kind, counts, and a 56-byte locked
        // state) is 72 bytes: with a 28-byte key and malloc's 8-byte header, 112.
        assert_eq!(std::mem::size_of::<Head<std::sync::Mutex<[u64; 6]>>>(), 72);
        assert_eq!(std::mem::size_of::<Shared<()>>(), 8);
        let inode = Shared::new(2, Kind::File, "dir00001/sample_00000001.jpg", [0u64; 7]);
        assert_eq!(inode.heap_bytes(), 112);
    }
}
