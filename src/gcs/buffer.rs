//! The unpersisted bytes of an `AppendWriter`, free of any I/O: pieces of at most 2 MiB
//! covering [persisted, written), trimmed as the service reports progress, and sliced so a
//! resend after a reconnect starts exactly at the persisted size (no byte sent twice
//! that the service already has, none skipped).

use bytes::Bytes;
use std::collections::VecDeque;

/// Bytes appended but not yet reported persisted.
#[derive(Debug, Default)]
pub(crate) struct Unpersisted {
    pieces: VecDeque<(u64, Bytes)>,
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

    /// Adds `piece` at the end.
    pub(crate) fn push(&mut self, piece: Bytes) {
        if piece.is_empty() {
            return;
        }
        let len = piece.len() as u64;
        self.pieces.push_back((self.end, piece));
        self.end += len;
    }

    /// Drops everything below `persisted` (ignores offsets outside what is held).
    pub(crate) fn trim_to(&mut self, persisted: u64) {
        let persisted = persisted.min(self.end);
        if persisted <= self.start {
            return;
        }
        self.start = persisted;
        while let Some((off, piece)) = self.pieces.front_mut() {
            let piece_end = *off + piece.len() as u64;
            if piece_end <= persisted {
                self.pieces.pop_front();
            } else {
                if *off < persisted {
                    *piece = piece.slice((persisted - *off) as usize..);
                    *off = persisted;
                }
                break;
            }
        }
    }

    /// The held bytes from `offset` to the end of the piece that covers it.
    pub(crate) fn piece_from(&self, offset: u64) -> Option<Bytes> {
        if offset < self.start || offset >= self.end {
            return None;
        }
        let i = self.pieces.partition_point(|(off, _)| *off <= offset);
        let (off, piece) = self.pieces.get(i.checked_sub(1)?)?;
        Some(piece.slice((offset - off) as usize..))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf() -> Unpersisted {
        let mut b = Unpersisted::at(100);
        b.push(Bytes::from_static(b"abcd"));
        b.push(Bytes::new());
        b.push(Bytes::from_static(b"efgh"));
        b
    }

    #[test]
    fn resend_starts_exactly_at_the_persisted_offset() {
        let mut b = buf();
        assert_eq!(b.len(), 8);
        assert_eq!(b.piece_from(100).unwrap(), "abcd");
        assert_eq!(b.piece_from(102).unwrap(), "cd");
        assert_eq!(b.piece_from(104).unwrap(), "efgh");
        assert_eq!(b.piece_from(107).unwrap(), "h");
        assert!(b.piece_from(108).is_none());
        assert!(b.piece_from(99).is_none());
        b.trim_to(106);
        assert_eq!(b.len(), 2);
        assert_eq!(b.piece_from(106).unwrap(), "gh");
        assert!(b.piece_from(105).is_none());
    }

    #[test]
    fn trim_ignores_stale_and_excess_offsets() {
        let mut b = buf();
        b.trim_to(103);
        b.trim_to(101);
        assert_eq!(b.len(), 5);
        assert_eq!(b.piece_from(103).unwrap(), "d");
        b.trim_to(1_000);
        assert_eq!(b.len(), 0);
        assert!(b.piece_from(108).is_none());
        b.push(Bytes::from_static(b"ij"));
        assert_eq!(b.piece_from(108).unwrap(), "ij");
    }
}
