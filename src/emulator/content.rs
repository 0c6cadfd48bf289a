//! The bytes and write state of one object generation: held in memory as immutable
//! `Bytes` segments (served without copying) or in a file of the directory backend.
//! Enforces one writer at a time (fencing by token) and tracks written vs persisted bytes.
//! Touches only its own data and, for files, the one file of the generation.

use bytes::Bytes;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::SystemTime;
use tonic::Status;

/// The largest chunk sent or accepted in one message.
pub(crate) const MAX_CHUNK: usize = 2 * 1024 * 1024;

/// Span of the pieces whose CRC32C a memory segment keeps: a chunk that is exactly one piece
/// is sent without computing its checksum again.
pub(crate) const CRC_PIECE: usize = 1024 * 1024;

/// Bytes of one generation in memory: a list of immutable segments, appended to in place.
#[derive(Debug, Default)]
pub(crate) struct Segments {
    segs: Vec<Bytes>,
    starts: Vec<u64>,
    /// Per segment, the CRC32C of each `CRC_PIECE` from its start (the last may be short).
    crcs: Vec<Vec<u32>>,
    len: u64,
}

impl Segments {
    /// One segment holding `data`.
    pub fn from_bytes(data: Bytes) -> Segments {
        let mut s = Segments::default();
        s.push(data);
        s
    }

    /// Appends a segment (kept as is: no copy).
    pub fn push(&mut self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        self.starts.push(self.len);
        self.len += data.len() as u64;
        self.crcs
            .push(data.chunks(CRC_PIECE).map(crate::gcs::crc32c).collect());
        self.segs.push(data);
    }

    /// Total length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Up to `max` bytes at `offset`, sliced without copying, and their CRC32C. Shorter at a
    /// segment edge, and from a piece edge no longer than the piece, whose checksum is kept.
    pub fn slice(&self, offset: u64, max: usize) -> (Bytes, u32) {
        if offset >= self.len || max == 0 {
            return (Bytes::new(), 0);
        }
        let i = self.starts.partition_point(|&s| s <= offset) - 1;
        let seg = &self.segs[i];
        let from = (offset - self.starts[i]) as usize;
        let piece_end = seg.len().min(from + CRC_PIECE);
        if from.is_multiple_of(CRC_PIECE) && from + max >= piece_end {
            return (seg.slice(from..piece_end), self.crcs[i][from / CRC_PIECE]);
        }
        let data = seg.slice(from..seg.len().min(from + max));
        let crc = crate::gcs::crc32c(&data);
        (data, crc)
    }

    /// The segments in order.
    pub fn iter(&self) -> impl Iterator<Item = &Bytes> {
        self.segs.iter()
    }

    /// CRC32C of all the bytes, from the pieces' (no pass over the data).
    pub fn crc(&self) -> u32 {
        let mut crc = 0;
        let mut len = 0u64;
        for (seg, crcs) in self.segs.iter().zip(&self.crcs) {
            for (piece, &piece_crc) in seg.chunks(CRC_PIECE).zip(crcs) {
                crc = crate::gcs::crc32c_concat(crc, len, piece_crc, piece.len());
                len += piece.len() as u64;
            }
        }
        crc
    }
}

/// Where a generation's bytes live.
#[derive(Debug, Clone)]
pub(crate) enum Data {
    /// In memory.
    Mem(Arc<RwLock<Segments>>),
    /// In a file of the directory backend.
    File(PathBuf),
}

/// The mutable state of one generation, guarded by the content's lock.
#[derive(Debug, Clone)]
pub(crate) struct WriteState {
    /// The writer that owns the object now; 0 = none since start (any handle reconnects).
    pub token: u64,
    /// Bytes stored (persisted or not).
    pub written: u64,
    /// CRC32C of the `written` bytes.
    pub crc: u32,
    /// Bytes durable and visible to readers.
    pub persisted: u64,
    /// CRC32C of the `persisted` bytes.
    pub persisted_crc: u32,
    /// False for files found on disk, whose checksum was never computed.
    pub crc_known: bool,
    /// Set once finalized; unset = an appendable object still open to appends.
    pub finalized: Option<SystemTime>,
    /// Last change.
    pub update_time: SystemTime,
    /// Deleted or replaced: writers fail, new readers cannot find it.
    pub gone: bool,
    /// A sync of its file failed. The kernel reports a lost write once, so a later sync
    /// would pass over bytes that never reached the disk: none past `persisted` counts as
    /// persisted from then on.
    pub sync_failed: bool,
}

impl WriteState {
    /// A finalized generation of `len` bytes.
    pub fn finalized(len: u64, crc: Option<u32>, now: SystemTime) -> WriteState {
        WriteState {
            token: 0,
            written: len,
            crc: crc.unwrap_or(0),
            persisted: len,
            persisted_crc: crc.unwrap_or(0),
            crc_known: crc.is_some(),
            finalized: Some(now),
            update_time: now,
            gone: false,
            sync_failed: false,
        }
    }

    /// An empty appendable generation owned by writer `token`.
    pub fn appendable(token: u64, now: SystemTime) -> WriteState {
        WriteState {
            token,
            written: 0,
            crc: 0,
            persisted: 0,
            persisted_crc: 0,
            crc_known: true,
            finalized: None,
            update_time: now,
            gone: false,
            sync_failed: false,
        }
    }
}

/// One object generation: its bytes and its write state.
#[derive(Debug)]
pub(crate) struct Content {
    /// The generation number.
    pub generation: i64,
    /// Where the bytes are.
    pub data: Data,
    state: Mutex<WriteState>,
}

impl Content {
    /// A generation with the given bytes and state.
    pub fn new(generation: i64, data: Data, state: WriteState) -> Arc<Content> {
        Arc::new(Content {
            generation,
            data,
            state: Mutex::new(state),
        })
    }

    /// Locks the write state (a poisoned lock is still usable: the state is plain data).
    pub fn state(&self) -> MutexGuard<'_, WriteState> {
        match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Bytes readers may see now.
    pub fn persisted(&self) -> u64 {
        self.state().persisted
    }

    /// Opens the bytes for reading (a file stays readable even if replaced meanwhile).
    pub fn open_reader(&self) -> io::Result<ContentReader> {
        Ok(match &self.data {
            Data::Mem(segs) => ContentReader::Mem(segs.clone()),
            Data::File(path) => ContentReader::File(File::open(path)?),
        })
    }

    /// Opens the bytes for appending as writer `token`.
    pub fn open_writer(self: &Arc<Self>, token: u64) -> Result<ContentWriter, Status> {
        let file = match &self.data {
            Data::Mem(_) => None,
            Data::File(path) => Some(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(|e| Status::internal(format!("open {}: {e}", path.display())))?,
            ),
        };
        Ok(ContentWriter {
            content: self.clone(),
            token,
            file,
        })
    }
}

/// Up to `max` bytes of `file` at `offset`, fewer only at its end. Read into memory that is
/// not zeroed first: zeroing each buffer was a tenth of the emulator's CPU on a large read.
fn read_at_most(file: &File, offset: u64, max: usize) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(max);
    while buf.len() < max {
        let at = offset + buf.len() as u64;
        let at =
            libc::off_t::try_from(at).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let want = max - buf.len();
        let spare = buf.spare_capacity_mut();
        // SAFETY: pread writes at most `want` bytes, no more than the spare capacity holds,
        // which the vector owns and nothing else refers to.
        let n = unsafe { libc::pread(file.as_raw_fd(), spare.as_mut_ptr().cast(), want, at) };
        match n {
            0 => break,
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            // SAFETY: the `n` bytes after the length were just written by pread.
            n => unsafe { buf.set_len(buf.len() + n as usize) },
        }
    }
    Ok(buf)
}

/// An open handle on a generation's bytes for one read stream.
#[derive(Debug)]
pub(crate) enum ContentReader {
    /// Memory segments, sliced without copying.
    Mem(Arc<RwLock<Segments>>),
    /// A file opened at stream start.
    File(File),
}

impl ContentReader {
    /// Up to `max` bytes at `offset` (shorter at a segment edge, a checksum piece's edge or
    /// the end of the data) and their CRC32C.
    pub fn read(&self, offset: u64, max: usize) -> io::Result<(Bytes, u32)> {
        match self {
            ContentReader::Mem(segs) => Ok(match segs.read() {
                Ok(s) => s.slice(offset, max),
                Err(poisoned) => poisoned.into_inner().slice(offset, max),
            }),
            ContentReader::File(file) => {
                let buf = read_at_most(file, offset, max)?;
                let crc = crate::gcs::crc32c(&buf);
                Ok((Bytes::from(buf), crc))
            }
        }
    }
}

/// The error a fenced, finalized or vanished generation gives a writer.
pub(crate) fn check_writable(state: &WriteState, token: u64) -> Result<(), Status> {
    if state.gone {
        return Err(Status::failed_precondition(
            "the object was deleted or replaced by a newer generation while being written",
        ));
    }
    if state.token != token {
        return Err(Status::failed_precondition(
            "stale write handle: another writer took over this object (takeover by a newer AppendObjectSpec)",
        ));
    }
    if state.finalized.is_some() {
        return Err(Status::failed_precondition(
            "the object is finalized; appending to it is not allowed",
        ));
    }
    Ok(())
}

/// Starts the disk's write of `len` bytes at `offset` of `file` without waiting for it, so
/// that the next sync waits only for what is still in flight: the sync of a flush (every
/// 16 MiB of a big upload by default) otherwise wrote all of it while the stream's only
/// thread waited, about 6 ms a flush (a 512 MiB upload through a mount ran 10% faster
/// without that wait). Best effort: the sync still makes every byte durable, and since
/// `SYNC_FILE_RANGE_WRITE` alone does not take the file's writeback errors, the sync still
/// reports each one.
fn start_writeback(file: &File, offset: u64, len: usize) {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: an open descriptor and plain integers; the call reads and writes no memory.
    unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE) };
}

/// The writing side of one generation for one write stream.
#[derive(Debug)]
pub(crate) struct ContentWriter {
    /// The generation written.
    pub content: Arc<Content>,
    /// This writer's fencing token.
    pub token: u64,
    file: Option<File>,
}

impl ContentWriter {
    /// Fails if this writer was fenced or the object finalized or gone.
    pub fn check(&self) -> Result<(), Status> {
        check_writable(&self.content.state(), self.token)
    }

    /// Appends `data` found at `offset`; the part below what is already stored is skipped
    /// unchecked. `crc` is the CRC32C of `data` when the caller has checked it already, so
    /// that no byte is summed twice. Memory data is persisted at once; file data when `sync`
    /// runs.
    pub fn append(&mut self, offset: u64, data: Bytes, crc: Option<u32>) -> Result<(), Status> {
        let mut st = self.content.state();
        check_writable(&st, self.token)?;
        if offset > st.written {
            return Err(Status::invalid_argument(format!(
                "write_offset {offset} is beyond the object's current size {}",
                st.written
            )));
        }
        let skip = (st.written - offset).min(data.len() as u64) as usize;
        let new = data.slice(skip..);
        if new.is_empty() {
            return Ok(());
        }
        let new_crc = match crc {
            Some(c) if skip == 0 => c,
            _ => crate::gcs::crc32c(&new),
        };
        match (&self.content.data, &self.file) {
            (Data::Mem(segs), _) => {
                // A decoded chunk shares (and keeps alive) the whole receive buffer it was
                // sliced from; one copy at write time keeps memory equal to the object size.
                let owned = Bytes::copy_from_slice(&new);
                match segs.write() {
                    Ok(mut s) => s.push(owned),
                    Err(poisoned) => poisoned.into_inner().push(owned),
                }
                st.persisted_crc =
                    crate::gcs::crc32c_concat(st.persisted_crc, st.persisted, new_crc, new.len());
                st.persisted += new.len() as u64;
            }
            (Data::File(path), Some(file)) => {
                file.write_all_at(&new, st.written)
                    .map_err(|e| Status::internal(format!("write {}: {e}", path.display())))?;
                start_writeback(file, st.written, new.len());
            }
            (Data::File(path), None) => {
                return Err(Status::internal(format!(
                    "{} is not open for writing",
                    path.display()
                )))
            }
        }
        st.crc = crate::gcs::crc32c_concat(st.crc, st.written, new_crc, new.len());
        st.written += new.len() as u64;
        st.update_time = SystemTime::now();
        Ok(())
    }

    /// Makes everything written durable: the bytes, and with them (the file's length, in a
    /// directory-backed bucket) the persisted size. True when the persisted size moved.
    pub fn sync(&mut self) -> Result<bool, Status> {
        // Only this writer appends, so nothing written since the last sync means the bytes
        // are durable already: a stream that ends right after a flush (every small file
        // closed after its data) skipped a disk sync per file.
        let synced = {
            let st = self.content.state();
            st.persisted == st.written
        };
        if synced {
            return Ok(false);
        }
        if let (Some(file), Data::File(path)) = (&self.file, &self.content.data) {
            let failed = |why: &dyn std::fmt::Display| {
                Status::internal(format!("fsync {}: {why}", path.display()))
            };
            if self.content.state().sync_failed {
                return Err(failed(
                    &"an earlier sync failed, and what it lost is unknown",
                ));
            }
            if let Err(e) = file.sync_data() {
                self.content.state().sync_failed = true;
                return Err(failed(&e));
            }
        }
        let mut st = self.content.state();
        let moved = st.persisted != st.written;
        st.persisted = st.written;
        st.persisted_crc = st.crc;
        Ok(moved)
    }

    /// Syncs, checks the whole-object CRC32C if given, and finalizes.
    pub fn finalize(&mut self, expected_crc: Option<u32>) -> Result<(), Status> {
        self.check()?;
        self.sync()?;
        let mut st = self.content.state();
        check_writable(&st, self.token)?;
        if let Some(expected) = expected_crc {
            if expected != st.crc {
                return Err(Status::invalid_argument(format!(
                    "object crc32c mismatch: the client sent {expected:#010x}, the {} stored bytes have {:#010x}",
                    st.written, st.crc
                )));
            }
        }
        let now = SystemTime::now();
        st.finalized = Some(now);
        st.update_time = now;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{Segments, CRC_PIECE};
    use bytes::Bytes;

    #[test]
    fn segments_know_the_crc_of_all_their_bytes_and_of_each_slice() {
        let mut s = Segments::default();
        let mut all = Vec::new();
        for (i, len) in [3, CRC_PIECE * 5 / 2, CRC_PIECE, 7].into_iter().enumerate() {
            let seg: Vec<u8> = (0..len).map(|j| (j * 31 + i * 7) as u8).collect();
            all.extend_from_slice(&seg);
            s.push(Bytes::from(seg));
        }
        assert_eq!(s.crc(), crc32c::crc32c(&all));
        for (offset, max) in [
            (0, 3),
            (3, CRC_PIECE),
            (5, 4096),
            (3 + CRC_PIECE, CRC_PIECE),
        ] {
            let (data, crc) = s.slice(offset as u64, max);
            assert_eq!(&data[..], &all[offset..offset + data.len()]);
            assert_eq!(crc, crc32c::crc32c(&data), "at {offset}");
        }
        assert_eq!(Segments::default().crc(), 0);
    }
}
