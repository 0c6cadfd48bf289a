//! The unpersisted bytes of an `AppendWriter`, free of any I/O: pieces of at most 2 MiB
//! covering [persisted, written), each with its CRC32C computed once when it was appended,
//! trimmed as the service reports progress, and sliced so a resend after a reconnect starts
//! exactly at the persisted size (no byte sent twice that the service already has, none
//! skipped).

use bytes::Bytes;
use std::collections::VecDeque;

/// Bytes appended but not yet reported persisted.
#[derive(Debug, Default)]
pub(crate) struct Unpersisted {
    /// Offset, bytes, and their CRC32C (None once the piece was cut by a trim).
    pieces: VecDeque<(u64, Bytes, Option<u32>)>,
    start: u64,
    end: u64,
}

impl Unpersisted {
    /// An empty buffer whose next byte is at `offset` (the object's current size).
    pub(crate) fn at(offset: u64) -> Self {
        Unpersisted {
            pieces: VecDeque::new(),
            start: offset,
            end: offset,
        }
    }

    /// Bytes held.
    pub(crate) fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Adds `piece`, whose CRC32C is `crc`, at the end.
    pub(crate) fn push(&mut self, piece: Bytes, crc: u32) {
        if piece.is_empty() {
            return;
        }
        let len = piece.len() as u64;
        self.pieces.push_back((self.end, piece, Some(crc)));
        self.end += len;
    }

    /// Drops everything below `persisted` (ignores offsets outside what is held).
    pub(crate) fn trim_to(&mut self, persisted: u64) {
        let persisted = persisted.min(self.end);
        if persisted <= self.start {
            return;
        }
        self.start = persisted;
        while let Some((off, piece, crc)) = self.pieces.front_mut() {
            let piece_end = *off + piece.len() as u64;
            if piece_end <= persisted {
                self.pieces.pop_front();
            } else {
                if *off < persisted {
                    *piece = piece.slice((persisted - *off) as usize..);
                    *off = persisted;
                    *crc = None;
                }
                break;
            }
        }
    }

    /// The held bytes from `offset` to the end of the piece that covers it, and their CRC32C
    /// (computed here only when a resend starts inside a piece).
    pub(crate) fn piece_from(&self, offset: u64) -> Option<(Bytes, u32)> {
        if offset < self.start || offset >= self.end {
            return None;
        }
        let i = self.pieces.partition_point(|(off, _, _)| *off <= offset);
        let (off, piece, crc) = self.pieces.get(i.checked_sub(1)?)?;
        let from = piece.slice((offset - off) as usize..);
        let crc = match crc {
            Some(c) if *off == offset => *c,
            _ => super::crc32c(&from),
        };
        Some((from, crc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf() -> Unpersisted {
        let mut b = Unpersisted::at(100);
        b.push(Bytes::from_static(b"abcd"), crate::gcs::crc32c(b"abcd"));
        b.push(Bytes::new(), 0);
        b.push(Bytes::from_static(b"efgh"), crate::gcs::crc32c(b"efgh"));
        b
    }

    #[test]
    fn resend_starts_exactly_at_the_persisted_offset() {
        let mut b = buf();
        assert_eq!(b.len(), 8);
        assert_eq!(b.piece_from(100).unwrap().0, "abcd");
        assert_eq!(b.piece_from(102).unwrap().0, "cd");
        assert_eq!(b.piece_from(104).unwrap().0, "efgh");
        assert_eq!(b.piece_from(107).unwrap().0, "h");
        assert!(b.piece_from(108).is_none());
        assert!(b.piece_from(99).is_none());
        b.trim_to(106);
        assert_eq!(b.len(), 2);
        assert_eq!(b.piece_from(106).unwrap().0, "gh");
        assert!(b.piece_from(105).is_none());
    }

    #[test]
    fn every_piece_sent_carries_the_crc32c_of_exactly_its_bytes() {
        let mut b = buf();
        for offset in 100..108 {
            let (piece, crc) = b.piece_from(offset).unwrap();
            assert_eq!(crc, crc32c::crc32c(&piece), "at {offset}");
        }
        b.trim_to(102);
        let (piece, crc) = b.piece_from(102).unwrap();
        assert_eq!((piece.as_ref(), crc), (&b"cd"[..], crc32c::crc32c(b"cd")));
    }

    #[test]
    fn trim_ignores_stale_and_excess_offsets() {
        let mut b = buf();
        b.trim_to(103);
        b.trim_to(101);
        assert_eq!(b.len(), 5);
        assert_eq!(b.piece_from(103).unwrap().0, "d");
        b.trim_to(1_000);
        assert_eq!(b.len(), 0);
        assert!(b.piece_from(108).is_none());
        b.push(Bytes::from_static(b"ij"), crate::gcs::crc32c(b"ij"));
        assert_eq!(b.piece_from(108).unwrap().0, "ij");
    }
}
