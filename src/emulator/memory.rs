//! The memory backend: every generation's bytes are `Bytes` segments in RAM, so reads are
//! served without copying; any object name is allowed. Optionally preloaded from a directory
//! tree (read once at start, never written back). Touches no files except that preload.

use super::content::{Content, Data, Segments, WriteState};
use super::store::{add_parent_folders, Backend, BucketState, Entry, Stamp, Store, Touched};
use super::tree::{bucket_dirs, walk};
use bytes::Bytes;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;
use tonic::Status;

/// Objects in RAM.
pub(crate) struct MemoryBackend {
    preload: Option<PathBuf>,
}

impl MemoryBackend {
    /// An empty store, or one preloaded with the buckets under `preload`.
    pub fn new(preload: Option<PathBuf>) -> MemoryBackend {
        MemoryBackend { preload }
    }
}

impl Backend for MemoryBackend {
    fn check_name(&self, _name: &str) -> Result<(), Status> {
        Ok(())
    }

    fn load(&self, store: &Store) -> anyhow::Result<BTreeMap<String, BucketState>> {
        let mut out = BTreeMap::new();
        let Some(root) = &self.preload else {
            return Ok(out);
        };
        for bucket in bucket_dirs(root)? {
            let now = SystemTime::now();
            let mut state = BucketState::new(now);
            let (mut files, mut folders) = (Vec::new(), Vec::new());
            walk(&root.join(&bucket), "", &mut files, &mut folders)?;
            for f in folders {
                state.folders.insert(f, now);
            }
            for (name, path) in files {
                let bytes = Bytes::from(std::fs::read(&path)?);
                let crc = crate::gcs::crc32c(&bytes);
                let len = bytes.len() as u64;
                let content = Content::new(
                    store.next_generation(),
                    Data::Mem(Arc::new(RwLock::new(Segments::from_bytes(bytes)))),
                    WriteState::finalized(len, Some(crc), now),
                );
                add_parent_folders(&mut state, &name);
                state.objects.insert(
                    name,
                    Entry {
                        content,
                        metageneration: 1,
                        metadata: Default::default(),
                        create_time: now,
                        stamp: None,
                        file_id: None,
                    },
                );
            }
            out.insert(bucket, state);
        }
        Ok(out)
    }

    fn refresh(&self, _: &Store, _: &str, _: &mut BucketState, _: &str) -> Result<bool, Status> {
        Ok(false)
    }

    fn refresh_one(
        &self,
        _: &Store,
        _: &str,
        _: &mut BucketState,
        _: &str,
    ) -> Result<bool, Status> {
        Ok(false)
    }

    fn create_bucket(&self, _bucket: &str) -> Result<(), Status> {
        Ok(())
    }

    fn materialize(
        &self,
        _bucket: &str,
        _name: &str,
        segs: Arc<RwLock<Segments>>,
    ) -> Result<Data, Status> {
        Ok(Data::Mem(segs))
    }

    fn remove(&self, _bucket: &str, _name: &str) -> Result<(), Status> {
        Ok(())
    }

    fn rename(&self, _bucket: &str, _from: &str, _to: &str, data: &Data) -> Result<Data, Status> {
        Ok(data.clone())
    }

    fn create_folder(&self, _bucket: &str, _folder: &str) -> Result<(), Status> {
        Ok(())
    }

    fn delete_folder(&self, _bucket: &str, _folder: &str) -> Result<(), Status> {
        Ok(())
    }

    fn rename_folder(&self, _bucket: &str, _from: &str, _to: &str) -> Result<(), Status> {
        Ok(())
    }

    fn data_for(&self, _bucket: &str, _name: &str, old: &Data) -> Data {
        old.clone()
    }

    fn save(
        &self,
        _bucket: &str,
        _state: &BucketState,
        _touched: Touched<'_>,
    ) -> Result<(), Status> {
        Ok(())
    }

    fn stamp(&self, _data: &Data) -> Option<Stamp> {
        None
    }

    fn file_id(&self, _data: &Data) -> Option<u64> {
        None
    }
}
