//! Shared setup of the `fs` tests without a kernel: the mount tests' in-process emulator
//! (memory backend, 127.0.0.1:0) and an `Fs` over it, driven by direct calls as the FUSE
//! adapter would make them. No /dev/fuse, no mount.
#![allow(dead_code)]

#[path = "../mount_support/mod.rs"]
mod mount_support;

use mount_support::Env;
use rapidfs::config::Config;
use rapidfs::emulator::Emulator;
use rapidfs::fs::{Fs, ROOT_INO};
use rapidfs::gcs::Client;

/// Asserts that `name` in directory `parent` is not found (ENOENT).
pub async fn assert_no_entry(fs: &Fs, parent: u64, name: &str) {
    assert_eq!(
        fs.lookup(parent, name).await.map(|_| ()),
        Err(rapidfs::fs::Errno::ENOENT),
        "{name} is still found"
    );
}

/// The (name, kind) of every entry of directory `ino` after `.` and `..`.
pub async fn entries(fs: &Fs, ino: u64) -> Vec<(String, rapidfs::fs::Kind)> {
    let fh = fs.opendir(ino).expect("opendir");
    let mut out = Vec::new();
    fs.readdir(fh, 0, |it| {
        if it.name != "." && it.name != ".." {
            out.push((it.name.to_string(), it.kind));
        }
        false
    })
    .await
    .expect("readdir");
    fs.releasedir(fh);
    out
}

/// An emulator, a runtime and an `Fs` over one bucket of it.
pub struct FsEnv {
    env: Env,
    pub rt: tokio::runtime::Handle,
    pub fs: Fs,
    /// A client of the same emulator, for what the test does behind the filesystem's back.
    pub client: Client,
    pub bucket: String,
}

impl FsEnv {
    /// A memory emulator with `bucket`, and an `Fs` over it configured by `tweak`.
    pub fn new(bucket: &str, tweak: impl FnOnce(&mut Config)) -> FsEnv {
        let env = Env::new(bucket);
        let mut cfg = env.config();
        tweak(&mut cfg);
        let client = env.rt.block_on(Client::connect(&cfg.gcs)).expect("client");
        let fs = {
            let _guard = env.rt.enter();
            Fs::new(client.clone(), bucket, &cfg)
        };
        FsEnv {
            rt: env.rt.handle().clone(),
            env,
            fs,
            client,
            bucket: bucket.to_string(),
        }
    }

    /// The emulator, for its stats.
    pub fn emu(&self) -> &Emulator {
        self.env.emu()
    }

    /// Stores `data` as object `name`, behind the filesystem's back.
    pub fn put(&self, name: &str, data: &[u8]) {
        self.env.put(&self.bucket, name, data);
    }

    /// (ListObjects, GetObject) calls the emulator answered so far.
    pub fn calls(&self) -> (u64, u64) {
        let st = self.emu().stats();
        (st.list_calls, st.get_object_calls)
    }

    /// Creates `name` in directory `parent` and returns its handle, the service not having
    /// seen the file: a create goes out with the first message its writer sends.
    pub async fn create_unseen(&self, parent: u64, name: &str) -> u64 {
        let (_, opened) = self
            .fs
            .create(parent, name, libc::O_WRONLY)
            .await
            .expect("create");
        opened.fh
    }

    /// The inode of `name` in the root directory.
    pub fn ino(&self, name: &str) -> u64 {
        self.rt
            .block_on(self.fs.lookup(ROOT_INO, name))
            .unwrap_or_else(|e| panic!("lookup {name}: errno {}", e.0))
            .attr
            .ino
    }
}

/// `len` bytes of a pattern that differs by `seed` and at every offset near by.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
