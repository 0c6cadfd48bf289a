//! Shared setup of the `fs` tests without a kernel: the in-process emulator (memory backend,
//! 127.0.0.1:0) and an `Fs` over it, driven by direct calls as the FUSE adapter would make
//! them. No /dev/fuse, no mount.
#![allow(dead_code)]

use rapidfs::config::Config;
use rapidfs::emulator::{Emulator, EmulatorOptions, Faults};
use rapidfs::fs::{Fs, ROOT_INO};
use rapidfs::gcs::Client;

/// An emulator, a runtime and an `Fs` over one bucket of it.
pub struct FsEnv {
    pub rt: tokio::runtime::Runtime,
    pub emu: Emulator,
    pub fs: Fs,
    /// A client of the same emulator, for what the test does behind the filesystem's back.
    pub client: Client,
    pub bucket: String,
}

impl FsEnv {
    /// A memory emulator with `bucket`, and an `Fs` over it configured by `tweak`.
    pub fn new(bucket: &str, tweak: impl FnOnce(&mut Config)) -> FsEnv {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let opts = EmulatorOptions {
            root: None,
            memory: true,
            zone: "us-central1-a".to_string(),
            faults: Faults::default(),
        };
        let emu = rt
            .block_on(Emulator::start(opts, "127.0.0.1:0".parse().expect("addr")))
            .expect("emulator starts");
        emu.create_bucket(bucket).expect("bucket");
        let mut cfg = Config::default();
        cfg.gcs.endpoint = emu.endpoint();
        tweak(&mut cfg);
        let client = rt.block_on(Client::connect(&cfg.gcs)).expect("client");
        let fs = {
            let _guard = rt.enter();
            Fs::new(client.clone(), bucket, &cfg)
        };
        FsEnv {
            rt,
            emu,
            fs,
            client,
            bucket: bucket.to_string(),
        }
    }

    /// Stores `data` as object `name`, behind the filesystem's back.
    pub fn put(&self, name: &str, data: &[u8]) {
        self.emu
            .put_object(&self.bucket, name, bytes::Bytes::copy_from_slice(data))
            .expect("put_object");
    }

    /// (ListObjects, GetObject) calls the emulator answered so far.
    pub fn calls(&self) -> (u64, u64) {
        let st = self.emu.stats();
        (st.list_calls, st.get_object_calls)
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
