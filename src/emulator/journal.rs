//! The metadata of a directory-backed bucket at O(1) cost a change: a snapshot
//! (`BUCKET.json`, written atomically: temp file, fsync, rename, fsync of the directory) plus
//! an append-only journal of the records changed since (`BUCKET.EPOCH.journal`, one JSON line
//! a changed object, written without a sync: the caller makes it durable before the change is
//! acknowledged, see `DirectoryBackend::sync_root`; a line that only records what synced data
//! carries already is left for the next sync, or lost with a crash, in order either way).
//!
//! Loading reads the snapshot and replays the journal of the snapshot's epoch; a torn last
//! line was never acknowledged and is dropped. A journal that has grown past the bucket's
//! object count is folded into a new snapshot of a new epoch, so the folding, too, costs O(1)
//! a change on average. A journal of another epoch is stale (a crash between a snapshot and
//! its cleanup): ignored and removed.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use tonic::Status;

/// The least journal length that is folded into a snapshot, however small the bucket.
const FOLD_AT_LEAST: u64 = 4096;

/// A bucket's snapshot file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(bound(serialize = "R: Serialize", deserialize = "R: DeserializeOwned"))]
struct Snapshot<R> {
    /// The journal that continues this snapshot (absent in files written before journals).
    #[serde(default)]
    epoch: u64,
    objects: BTreeMap<String, R>,
}

/// One journal line: the record of `name` now, or `None` when it is gone.
#[derive(Debug, Serialize, Deserialize)]
#[serde(bound(serialize = "R: Serialize", deserialize = "R: DeserializeOwned"))]
struct Line<R> {
    name: String,
    record: Option<R>,
}

/// The journal a bucket appends to.
struct Open {
    epoch: u64,
    file: File,
    lines: u64,
}

/// Every bucket's snapshot and journal, under one directory.
pub(crate) struct Journals {
    dir: PathBuf,
    open: Mutex<HashMap<String, Open>>,
}

fn io_error(what: &str, path: &Path, e: io::Error) -> Status {
    Status::internal(format!("{what} {}: {e}", path.display()))
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Journals {
    /// The metadata kept in `dir` (which must exist).
    pub(crate) fn new(dir: PathBuf) -> Journals {
        Journals {
            dir,
            open: Mutex::new(HashMap::new()),
        }
    }

    fn snapshot_path(&self, bucket: &str) -> PathBuf {
        self.dir.join(format!("{bucket}.json"))
    }

    fn journal_path(&self, bucket: &str, epoch: u64) -> PathBuf {
        self.dir.join(format!("{bucket}.{epoch}.journal"))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Open>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The records of `bucket` as last acknowledged: its snapshot with its journal replayed.
    pub(crate) fn load<R>(&self, bucket: &str) -> anyhow::Result<BTreeMap<String, R>>
    where
        R: Serialize + DeserializeOwned,
    {
        let path = self.snapshot_path(bucket);
        let snapshot: Snapshot<R> = match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| anyhow::anyhow!("corrupt metadata file {}: {e}", path.display()))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Snapshot {
                epoch: 0,
                objects: BTreeMap::new(),
            },
            Err(e) => return Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
        };
        let mut objects = snapshot.objects;
        let journal = self.journal_path(bucket, snapshot.epoch);
        match fs::read(&journal) {
            Ok(bytes) => replay(&bytes, &mut objects),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(anyhow::anyhow!("cannot read {}: {e}", journal.display())),
        }
        Ok(objects)
    }

    /// Writes all `records` of `bucket` as a new snapshot and starts its journal afresh.
    pub(crate) fn snapshot<R: Serialize>(
        &self,
        bucket: &str,
        records: BTreeMap<String, R>,
        tmp: &Path,
    ) -> Result<(), Status> {
        let mut open = self.lock();
        let old = open.remove(bucket).map(|o| o.epoch);
        let epoch = match old {
            Some(e) => e + 1,
            None => self.epoch_on_disk(bucket) + 1,
        };
        let bytes = serde_json::to_vec(&Snapshot {
            epoch,
            objects: records,
        })
        .map_err(|e| Status::internal(format!("cannot encode metadata: {e}")))?;
        let write = || -> io::Result<()> {
            let mut f = File::create(tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()
        };
        // A snapshot that fails leaves no temporary file behind: on a full disk, each
        // later change tries again, and its leftovers would hold the space that frees.
        write().map_err(|e| {
            let _ = fs::remove_file(tmp);
            io_error("write", tmp, e)
        })?;
        let dest = self.snapshot_path(bucket);
        fs::rename(tmp, &dest).map_err(|e| {
            let _ = fs::remove_file(tmp);
            io_error("rename into", &dest, e)
        })?;
        let journal = self.journal_path(bucket, epoch);
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&journal)
            .map_err(|e| io_error("create", &journal, e))?;
        fsync_dir(&self.dir).map_err(|e| io_error("fsync", &self.dir, e))?;
        // The snapshot holds everything the older journals said.
        self.remove_stale_journals(bucket, epoch);
        open.insert(
            bucket.to_string(),
            Open {
                epoch,
                file,
                lines: 0,
            },
        );
        Ok(())
    }

    /// Appends the records of the changed objects (`None`: gone) to the journal of
    /// `bucket`, without a sync. True when the journal has grown past `objects` (the
    /// bucket's object count) and should be folded into a snapshot.
    pub(crate) fn append<R: Serialize>(
        &self,
        bucket: &str,
        changes: Vec<(String, Option<R>)>,
        objects: usize,
    ) -> Result<bool, Status> {
        let mut open = self.lock();
        let Some(j) = open.get_mut(bucket) else {
            // No journal yet: the caller writes a snapshot, which starts one.
            return Ok(true);
        };
        let mut text = Vec::new();
        let n = changes.len() as u64;
        for (name, record) in changes {
            serde_json::to_writer(&mut text, &Line { name, record })
                .map_err(|e| Status::internal(format!("cannot encode metadata: {e}")))?;
            text.push(b'\n');
        }
        if let Err(e) = j.file.write_all(&text) {
            // The change is already made in memory and is refused to the caller: it may have
            // taken effect, as after a lost answer. The journal is given up, never appended
            // to again, so a fragment at its end stays a torn last line that replay drops;
            // a snapshot of memory (the caller's next) holds the change, and its new epoch
            // leaves this journal stale. Appending on would have glued the next line to the
            // fragment (replay stops at the first line that does not parse).
            let path = self.journal_path(bucket, j.epoch);
            open.remove(bucket);
            return Err(io_error("append to", &path, e));
        }
        j.lines += n;
        Ok(j.lines > FOLD_AT_LEAST.max(objects as u64))
    }

    /// The epoch of the snapshot on disk (0 when there is none).
    fn epoch_on_disk(&self, bucket: &str) -> u64 {
        #[derive(Deserialize)]
        struct EpochOnly {
            #[serde(default)]
            epoch: u64,
        }
        fs::read(self.snapshot_path(bucket))
            .ok()
            .and_then(|b| serde_json::from_slice::<EpochOnly>(&b).ok())
            .map_or(0, |s| s.epoch)
    }

    /// Removes the journals of `bucket` other than the one of `epoch`.
    fn remove_stale_journals(&self, bucket: &str, epoch: u64) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let keep = format!("{bucket}.{epoch}.journal");
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let of_bucket = name
                .strip_prefix(bucket)
                .and_then(|rest| rest.strip_prefix('.'))
                .and_then(|rest| rest.strip_suffix(".journal"))
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
            if of_bucket && name != keep {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

/// Applies the complete lines of a journal to `objects`, in order. A last line without its
/// newline, or one that does not parse, was cut by a crash before it was acknowledged.
fn replay<R: DeserializeOwned>(bytes: &[u8], objects: &mut BTreeMap<String, R>) {
    let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    for raw in bytes[..complete]
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
    {
        let Ok(line) = serde_json::from_slice::<Line<R>>(raw) else {
            break;
        };
        match line.record {
            Some(r) => objects.insert(line.name, r),
            None => objects.remove(&line.name),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journals() -> (tempfile::TempDir, Journals) {
        let dir = tempfile::tempdir().expect("tempdir");
        let j = Journals::new(dir.path().to_path_buf());
        (dir, j)
    }

    #[test]
    fn changes_survive_a_reload_and_a_torn_last_line_is_dropped() {
        let (dir, j) = journals();
        let tmp = dir.path().join("tmp");
        j.snapshot("b", BTreeMap::from([("a".to_string(), 1u32)]), &tmp)
            .expect("snapshot");
        j.append("b", vec![("x".into(), Some(2u32)), ("a".into(), None)], 1)
            .expect("append");
        j.append("b", vec![("y".into(), Some(3u32))], 1)
            .expect("append");
        let loaded: BTreeMap<String, u32> =
            Journals::new(dir.path().into()).load("b").expect("load");
        assert_eq!(loaded, BTreeMap::from([("x".into(), 2), ("y".into(), 3)]));
        // A crash mid-append leaves a line without its newline: never acknowledged.
        let path = j.journal_path("b", 1);
        let mut f = OpenOptions::new().append(true).open(&path).expect("open");
        f.write_all(br#"{"name":"z","rec"#).expect("torn write");
        let loaded: BTreeMap<String, u32> =
            Journals::new(dir.path().into()).load("b").expect("load");
        assert_eq!(loaded.len(), 2, "{loaded:?}");
    }

    #[test]
    fn a_snapshot_starts_a_new_epoch_and_old_journals_never_replay_over_it() {
        let (dir, j) = journals();
        let tmp = dir.path().join("tmp");
        j.snapshot("b", BTreeMap::from([("a".to_string(), 1u32)]), &tmp)
            .expect("snapshot");
        j.append("b", vec![("a".into(), Some(2u32))], 1)
            .expect("append");
        // A stale journal of the next epoch's predecessor must not revert the snapshot.
        let stale = j.journal_path("b", 1);
        let kept = fs::read(&stale).expect("journal");
        j.snapshot("b", BTreeMap::from([("a".to_string(), 5u32)]), &tmp)
            .expect("snapshot");
        assert!(!stale.exists(), "the folded journal is removed");
        fs::write(&stale, kept).expect("a crash left it behind");
        let loaded: BTreeMap<String, u32> =
            Journals::new(dir.path().into()).load("b").expect("load");
        assert_eq!(loaded, BTreeMap::from([("a".into(), 5)]));
    }

    /// A tmpfs of `kib` KiB mounted over a fresh directory, unmounted when dropped: a disk
    /// that fills up, so that an append fails with part of its line written.
    struct SmallDisk(tempfile::TempDir);

    impl SmallDisk {
        fn new(kib: u32) -> SmallDisk {
            let dir = tempfile::tempdir().expect("tempdir");
            let mounted = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
                .arg(dir.path())
                .status()
                .expect("run mount");
            assert!(mounted.success(), "mounting a tmpfs needs root");
            SmallDisk(dir)
        }
    }

    impl Drop for SmallDisk {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg(self.0.path())
                .status();
        }
    }

    #[test]
    fn an_append_that_fails_gives_the_journal_up_for_a_snapshot() {
        let disk = SmallDisk::new(16);
        let dir = disk.0.path();
        let j = Journals::new(dir.to_path_buf());
        j.snapshot("b", BTreeMap::<String, String>::new(), &dir.join("tmp"))
            .expect("snapshot");
        let big = "x".repeat(5000);
        let mut acknowledged = BTreeMap::new();
        // Enough lines to fill the disk whatever the page size tmpfs rounds it up to.
        let failed = (0..64).find(|i| {
            let name = format!("o{i}");
            let ok = j
                .append("b", vec![(name.clone(), Some(big.clone()))], 1)
                .is_ok();
            if ok {
                acknowledged.insert(name, big.clone());
            }
            !ok
        });
        assert!(failed.is_some(), "the disk filled up");
        // A small change would still fit in the journal's last page, but must not follow
        // the fragment or the refused change: it asks for a snapshot instead.
        let fold = j
            .append("b", vec![("small".into(), Some("s".to_string()))], 1)
            .expect("a change without a journal asks for a snapshot");
        assert!(fold, "the next change writes a snapshot");
        let mut everything = acknowledged.clone();
        everything.insert("small".into(), "s".into());
        let tmp = dir.join("tmp");
        j.snapshot("b", everything, &tmp)
            .expect_err("no room for a snapshot");
        assert!(!tmp.exists(), "the failed snapshot's file is removed");
        let loaded: BTreeMap<String, String> =
            Journals::new(dir.to_path_buf()).load("b").expect("load");
        assert_eq!(
            loaded, acknowledged,
            "the fragment is dropped as a torn line"
        );
    }

    #[test]
    fn a_journal_longer_than_the_bucket_asks_to_be_folded() {
        let (dir, j) = journals();
        j.snapshot("b", BTreeMap::<String, u32>::new(), &dir.path().join("tmp"))
            .expect("snapshot");
        let mut fold = false;
        for i in 0..=FOLD_AT_LEAST {
            fold = j
                .append("b", vec![(format!("o{i}"), Some(1u32))], 10)
                .expect("append");
        }
        assert!(fold);
    }
}
