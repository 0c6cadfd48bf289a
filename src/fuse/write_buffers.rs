//! Recycled buffers for the bytes of full-size FUSE writes. A write request's bytes must be
//! copied out of fuser's request buffer, and a buffer of a MiB is, to the allocator, a page
//! of its own: each one was mapped afresh and faulted in (a transparent huge page cleared)
//! on its first touch, a tenth of the daemon's CPU on a big sequential write. These buffers
//! go back to a free list when the service has persisted their bytes (the last `Bytes`
//! pointing into one is dropped) and are reused by the next write, their pages resident.
//! The free ones are not charged to the write share: it bounds the bytes not yet persisted,
//! and the free list adds at most its own bound to that.

use bytes::Bytes;
use std::sync::{Arc, Mutex};

/// Free buffers of one size, shared by the writes of a mount.
pub(super) struct WriteBuffers {
    /// The size of a recycled buffer: a write of exactly this many bytes takes one.
    size: usize,
    /// Most free buffers kept; one more given back is freed.
    keep: usize,
    /// Buffers whose bytes were persisted, each of capacity `size`.
    free: Mutex<Vec<Vec<u8>>>,
}

impl WriteBuffers {
    /// Recycles buffers of `size` bytes, keeping up to `keep_bytes` of free ones.
    pub(super) fn new(size: usize, keep_bytes: usize) -> Arc<WriteBuffers> {
        Arc::new(WriteBuffers {
            size,
            keep: keep_bytes / size,
            free: Mutex::new(Vec::new()),
        })
    }

    /// `data` copied into bytes of their own: into a recycled buffer when it is of the
    /// recycled size, else into a fresh allocation.
    pub(super) fn copy(self: &Arc<Self>, data: &[u8]) -> Bytes {
        if data.len() != self.size || self.keep == 0 {
            return Bytes::copy_from_slice(data);
        }
        let mut buf = self
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(self.size));
        buf.clear();
        buf.extend_from_slice(data);
        Bytes::from_owner(Recycled {
            buf,
            home: self.clone(),
        })
    }

    fn give_back(&self, buf: Vec<u8>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < self.keep {
            free.push(buf);
        }
    }
}

/// A buffer on loan to one write's bytes; back to its free list when they are dropped.
struct Recycled {
    buf: Vec<u8>,
    home: Arc<WriteBuffers>,
}

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        self.home.give_back(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_size_write_reuses_the_buffer_its_predecessor_gave_back() {
        let buffers = WriteBuffers::new(8, 16);
        let first = buffers.copy(b"abcdefgh");
        let address = first.as_ptr();
        assert_eq!(&first[..], b"abcdefgh");
        drop(first);
        let second = buffers.copy(b"ijklmnop");
        assert_eq!(second.as_ptr(), address);
        assert_eq!(&second[..], b"ijklmnop");
    }

    #[test]
    fn a_buffer_stays_on_loan_while_any_slice_of_it_lives() {
        let buffers = WriteBuffers::new(4, 16);
        let whole = buffers.copy(b"abcd");
        let tail = whole.slice(2..);
        drop(whole);
        assert!(buffers.free.lock().expect("free list").is_empty());
        let other = buffers.copy(b"wxyz");
        assert_eq!(&tail[..], b"cd");
        drop(tail);
        drop(other);
        assert_eq!(buffers.free.lock().expect("free list").len(), 2);
    }

    #[test]
    fn other_sizes_are_copied_fresh_and_the_free_list_is_bounded() {
        let buffers = WriteBuffers::new(4, 8);
        assert_eq!(&buffers.copy(b"abc")[..], b"abc");
        assert!(buffers.free.lock().expect("free list").is_empty());
        let loans: Vec<Bytes> = (0..3).map(|_| buffers.copy(b"abcd")).collect();
        drop(loans);
        assert_eq!(buffers.free.lock().expect("free list").len(), 2);
    }
}
