//! Range bookkeeping of a `BidiReader` session, free of any I/O: which ranges are
//! outstanding under which `read_id`, how far each has been delivered, what to ask for
//! after a reconnect (only the unfinished remainder), and the checks every incoming chunk
//! must pass (known id, CRC32C, expected next offset, inside the range).

use super::{Error, Result};
use crate::proto::storage::{ObjectRangeData, ReadRange};
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// A range's `len` bytes out of the chunks it arrived in: the chunk itself when there is one,
/// else one copy.
pub(crate) fn joined(mut chunks: Vec<Bytes>, len: usize) -> Bytes {
    if chunks.len() == 1 {
        return chunks.pop().unwrap_or_default();
    }
    let mut whole = BytesMut::with_capacity(len);
    for c in chunks {
        whole.extend_from_slice(&c);
    }
    whole.freeze()
}

/// Results smaller than this that a caller keeps are copied out of their receive buffer.
const OWN_COPY_BELOW: usize = 256 * 1024;

/// As `joined`, for bytes a caller keeps (a cache): one small chunk is copied, since as a
/// slice it would keep the whole receive buffer it arrived in alive (up to a frame's 16 MiB).
pub(crate) fn joined_to_keep(chunks: Vec<Bytes>, len: usize) -> Bytes {
    match chunks.as_slice() {
        [one] if len < OWN_COPY_BELOW => Bytes::copy_from_slice(one),
        _ => joined(chunks, len),
    }
}

/// Where a range's chunks go, in order; dropping the sender marks the range complete.
pub(crate) type Sink = mpsc::UnboundedSender<Result<Bytes>>;

struct Range {
    next: u64,
    end: u64,
    tx: Sink,
}

/// The outstanding ranges of one session. `in_flight` is shared with the callers, who count
/// a range in when they submit it; the table counts it out when it is done.
pub(crate) struct RangeTable {
    ranges: HashMap<i64, Range>,
    next_id: i64,
    in_flight: Arc<AtomicUsize>,
}

/// A chunk that must not be accepted: the stream is suspect and is reopened.
#[derive(Debug, PartialEq)]
pub(crate) struct BadChunk(pub(crate) String);

impl RangeTable {
    pub(crate) fn new(in_flight: Arc<AtomicUsize>) -> Self {
        RangeTable {
            ranges: HashMap::new(),
            next_id: 1,
            in_flight,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Registers [offset, offset+len) under a fresh read_id (never reused, so late chunks of
    /// finished ranges cannot be mistaken for new ones).
    pub(crate) fn insert(&mut self, offset: u64, len: u64, tx: Sink) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        self.ranges.insert(
            id,
            Range {
                next: offset,
                end: offset + len,
                tx,
            },
        );
        id
    }

    /// The still-missing part of `id`, as the wire asks for it.
    pub(crate) fn remainder(&self, id: i64) -> Option<ReadRange> {
        let r = self.ranges.get(&id)?;
        Some(ReadRange {
            read_offset: r.next as i64,
            read_length: (r.end - r.next) as i64,
            read_id: id,
        })
    }

    /// All outstanding ids, oldest first.
    pub(crate) fn ids(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self.ranges.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    pub(crate) fn contains(&self, id: i64) -> bool {
        self.ranges.contains_key(&id)
    }

    /// Forgets ranges whose caller went away.
    pub(crate) fn prune_cancelled(&mut self) {
        let before = self.ranges.len();
        self.ranges.retain(|_, r| !r.tx.is_closed());
        self.in_flight
            .fetch_sub(before - self.ranges.len(), Ordering::Relaxed);
    }

    /// Takes one chunk: checks, delivers, completes. Returns the payload bytes accepted.
    /// Chunks of unknown or finished read_ids are ignored (a trailing empty chunk after
    /// range_end is normal).
    pub(crate) fn on_chunk(&mut self, d: ObjectRangeData) -> std::result::Result<u64, BadChunk> {
        let Some(rr) = d.read_range else {
            return Ok(0);
        };
        let id = rr.read_id;
        let Some(range) = self.ranges.get_mut(&id) else {
            return Ok(0);
        };
        let data = d.checksummed_data.unwrap_or_default();
        let content = data.content;
        let len = content.len() as u64;
        if len > 0 {
            if let Some(want) = data.crc32c {
                let got = super::crc32c(&content);
                if got != want {
                    return Err(BadChunk(format!(
                        "checksum mismatch in read_id {id} at offset {}: got {got:08x}, want {want:08x}",
                        rr.read_offset
                    )));
                }
            }
            if rr.read_offset != range.next as i64 || range.next + len > range.end {
                return Err(BadChunk(format!(
                    "chunk [{}, +{len}) of read_id {id} does not continue at {} (end {})",
                    rr.read_offset, range.next, range.end
                )));
            }
            range.next += len;
            if range.tx.send(Ok(content)).is_err() {
                self.finish(id);
                return Ok(len);
            }
        }
        if range.next == range.end {
            self.finish(id);
        } else if d.range_end {
            let msg = format!("server ended range at {} before {}", range.next, range.end);
            let _ = range.tx.send(Err(Error::Other(msg)));
            self.finish(id);
        }
        Ok(len)
    }

    /// Done with `id`: dropping its sender tells the caller the range is complete.
    fn finish(&mut self, id: i64) {
        if self.ranges.remove(&id).is_some() {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Fails every outstanding range with `e`.
    pub(crate) fn fail_all(&mut self, e: &Error) {
        for (_, r) in self.ranges.drain() {
            let _ = r.tx.send(Err(e.clone()));
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::storage::ChecksummedData;

    /// The allocation a lone `Bytes` keeps alive, once nothing else shares it.
    fn holds(b: Bytes) -> usize {
        b.try_into_mut().map_or(usize::MAX, |m| m.capacity())
    }

    #[test]
    fn a_small_chunk_kept_is_copied_out_of_its_receive_buffer() {
        let received = |len| Bytes::from(vec![5u8; 4 << 20]).slice(..len);
        assert_eq!(holds(joined(vec![received(100_000)], 100_000)), 4 << 20);
        assert_eq!(
            holds(joined_to_keep(vec![received(100_000)], 100_000)),
            100_000
        );
        // A large one is worth its buffer's slack more than a copy.
        assert_eq!(
            holds(joined_to_keep(vec![received(1 << 20)], 1 << 20)),
            4 << 20
        );
    }

    #[test]
    fn the_chunk_checksum_is_crc32c() {
        let data: Vec<u8> = (0..(1u32 << 20) + 13)
            .map(|i| (i * 7 % 253) as u8)
            .collect();
        for len in [0, 1, 7, 64, 4099, 1 << 20, data.len()] {
            assert_eq!(
                crate::gcs::crc32c(&data[..len]),
                crc32c::crc32c(&data[..len]),
                "{len} bytes"
            );
        }
    }

    fn chunk(id: i64, offset: i64, data: &'static [u8], crc: bool, end: bool) -> ObjectRangeData {
        ObjectRangeData {
            checksummed_data: Some(ChecksummedData {
                content: Bytes::from_static(data),
                crc32c: crc.then(|| crc32c::crc32c(data)),
            }),
            read_range: Some(ReadRange {
                read_offset: offset,
                read_length: data.len() as i64,
                read_id: id,
            }),
            range_end: end,
        }
    }

    fn table() -> (RangeTable, Arc<AtomicUsize>) {
        let n = Arc::new(AtomicUsize::new(0));
        (RangeTable::new(n.clone()), n)
    }

    fn drain(rx: &mut mpsc::UnboundedReceiver<Result<Bytes>>) -> Vec<u8> {
        let mut v = Vec::new();
        while let Ok(c) = rx.try_recv() {
            v.extend_from_slice(&c.unwrap());
        }
        v
    }

    #[test]
    fn delivers_in_order_and_completes_at_the_end() {
        let (mut t, n) = table();
        let (tx, mut rx) = mpsc::unbounded_channel();
        n.fetch_add(1, Ordering::Relaxed);
        let id = t.insert(10, 6, tx);
        assert_eq!(t.on_chunk(chunk(id, 10, b"abc", true, false)), Ok(3));
        assert_eq!(t.remainder(id).unwrap().read_offset, 13);
        assert_eq!(t.remainder(id).unwrap().read_length, 3);
        assert_eq!(t.on_chunk(chunk(id, 13, b"def", false, false)), Ok(3));
        assert!(t.is_empty(), "complete once all bytes arrived");
        assert_eq!(n.load(Ordering::Relaxed), 0);
        assert_eq!(drain(&mut rx), b"abcdef");
        assert!(rx.is_closed() || rx.try_recv().is_err());
        // The trailing empty chunk with range_end for a finished id is ignored.
        assert_eq!(t.on_chunk(chunk(id, 16, b"", false, true)), Ok(0));
    }

    #[test]
    fn rejects_bad_crc_and_wrong_offsets_without_delivering() {
        let (mut t, _) = table();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let id = t.insert(0, 10, tx);
        let mut bad = chunk(id, 0, b"abcd", true, false);
        bad.checksummed_data.as_mut().unwrap().crc32c = Some(1);
        assert!(t.on_chunk(bad).is_err());
        assert!(t.on_chunk(chunk(id, 2, b"cd", true, false)).is_err());
        assert!(
            t.on_chunk(chunk(id, 0, b"0123456789ab", true, false))
                .is_err(),
            "past the end"
        );
        assert!(drain(&mut rx).is_empty());
        assert_eq!(t.remainder(id).unwrap().read_offset, 0);
    }

    #[test]
    fn ignores_unknown_ids_and_reports_early_range_end() {
        let (mut t, _) = table();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let id = t.insert(0, 10, tx);
        assert_eq!(t.on_chunk(chunk(id + 7, 0, b"zz", true, false)), Ok(0));
        assert_eq!(t.on_chunk(chunk(id, 0, b"ab", true, true)), Ok(2));
        assert!(t.is_empty());
        assert_eq!(rx.try_recv().unwrap().unwrap(), Bytes::from_static(b"ab"));
        assert!(rx.try_recv().unwrap().is_err());
    }

    #[test]
    fn cancelled_callers_are_pruned_and_ids_never_repeat() {
        let (mut t, n) = table();
        let (tx, rx) = mpsc::unbounded_channel();
        n.fetch_add(2, Ordering::Relaxed);
        let a = t.insert(0, 4, tx);
        let (tx2, _rx2) = mpsc::unbounded_channel();
        let b = t.insert(0, 4, tx2);
        drop(rx);
        t.prune_cancelled();
        assert!(!t.contains(a) && t.contains(b));
        assert_eq!(n.load(Ordering::Relaxed), 1);
        let (tx3, _rx3) = mpsc::unbounded_channel();
        assert!(t.insert(0, 1, tx3) > b);
        assert_eq!(t.ids().len(), 2);
        t.fail_all(&Error::Unavailable("x".into()));
        assert!(t.is_empty());
    }
}
