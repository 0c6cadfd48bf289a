//! Recycled buffers for the bytes of full-size FUSE writes. A write request's bytes must be
//! copied out of fuser's request buffer, and a buffer of a MiB is, to the allocator, a page
//! of its own: each one was mapped afresh and faulted in (a transparent huge page cleared)
//! on its first touch, a tenth of the daemon's CPU on a big sequential write. These buffers
//! go back to a free list when the service has persisted their bytes (the last `Bytes`
//! pointing into one is dropped) and are reused by the next write, their pages resident.
//! A full request is not always a whole MiB: one that starts inside a page (a cached write
//! at an offset off a page boundary, a direct write from a buffer that does not start on
//! one, as Python's `bytes` never do) carries up to a page less, and takes a buffer too.
//! The free ones are not charged to the write share: it bounds the bytes not yet persisted,
//! and the free list adds at most its own bound to that.

use bytes::Bytes;
use std::sync::{Arc, Mutex};

/// The kernel's page size (4 KiB on x86, up to 64 KiB on arm64): a full request that
/// starts inside a page is at most this much short.
fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system and touches no memory.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).unwrap_or(4096).max(1)
}

/// Free buffers of one size, shared by the writes of a mount.
pub(super) struct WriteBuffers {
    /// The size of a recycled buffer: a write of this many bytes, or less by under a page,
    /// takes one.
    size: usize,
    /// The kernel's page size (`page_size`).
    page: usize,
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
            page: page_size(),
            keep: keep_bytes / size,
            free: Mutex::new(Vec::new()),
        })
    }

    /// `data` copied into bytes of their own: into a recycled buffer when it is a full
    /// request, else into a fresh allocation.
    pub(super) fn copy(self: &Arc<Self>, data: &[u8]) -> Bytes {
        let full = data.len() <= self.size && data.len() + self.page > self.size;
        if !full || self.keep == 0 {
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

    /// A buffer of two of this machine's pages, and the page.
    fn sizes() -> (usize, usize) {
        (2 * page_size(), page_size())
    }

    #[test]
    fn a_full_request_reuses_the_buffer_its_predecessor_gave_back_even_a_page_short() {
        let (size, page) = sizes();
        let buffers = WriteBuffers::new(size, 2 * size);
        let first = buffers.copy(&vec![1; size]);
        let address = first.as_ptr();
        drop(first);
        let short = vec![2; size - page + 1];
        let second = buffers.copy(&short);
        assert_eq!(second.as_ptr(), address);
        assert_eq!(&second[..], &short[..]);
    }

    #[test]
    fn a_buffer_stays_on_loan_while_any_slice_of_it_lives() {
        let (size, _) = sizes();
        let buffers = WriteBuffers::new(size, 4 * size);
        let whole = buffers.copy(&vec![1; size]);
        let tail = whole.slice(size - 2..);
        drop(whole);
        assert!(buffers.free.lock().expect("free list").is_empty());
        let other = buffers.copy(&vec![2; size]);
        assert_eq!(&tail[..], &[1, 1]);
        drop(tail);
        drop(other);
        assert_eq!(buffers.free.lock().expect("free list").len(), 2);
    }

    #[test]
    fn a_request_a_page_short_or_more_is_copied_fresh_and_the_free_list_is_bounded() {
        let (size, page) = sizes();
        let buffers = WriteBuffers::new(size, 2 * size);
        let small = vec![3; size - page];
        assert_eq!(&buffers.copy(&small)[..], &small[..]);
        assert!(buffers.free.lock().expect("free list").is_empty());
        let loans: Vec<Bytes> = (0..3).map(|_| buffers.copy(&vec![4; size])).collect();
        drop(loans);
        assert_eq!(buffers.free.lock().expect("free list").len(), 2);
    }
}
