//! Shared setup of the mount tests: an in-process emulator (memory backend, 127.0.0.1:0) and
//! real FUSE mounts of it in temporary directories. A mount that fails fails the test.
#![allow(dead_code)]

use rapidfs::config::Config;
use rapidfs::emulator::{Emulator, EmulatorOptions, Faults};
use rapidfs::fs::Fs;
use rapidfs::fuse::{Driver, MountSettings, Mounted};
use rapidfs::gcs::Client;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::runtime::Runtime;

/// A running emulator and the runtime it (and the mounts) run on.
pub struct Env {
    pub rt: tokio::runtime::Runtime,
    pub emu: Option<Emulator>,
}

impl Env {
    /// A memory-backed emulator with `bucket` created.
    pub fn new(bucket: &str) -> Env {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
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
        Env { rt, emu: Some(emu) }
    }

    pub fn emu(&self) -> &Emulator {
        self.emu.as_ref().expect("emulator running")
    }

    pub fn put(&self, bucket: &str, name: &str, data: &[u8]) -> i64 {
        self.emu()
            .put_object(bucket, name, bytes::Bytes::copy_from_slice(data))
            .expect("put_object")
    }

    /// A config pointing at this emulator, with the given tweaks applied by the caller.
    pub fn config(&self) -> Config {
        let mut cfg = Config::default();
        cfg.gcs.endpoint = self.emu().endpoint();
        cfg
    }

    /// Mounts `bucket` with `cfg` in a fresh temporary directory.
    pub fn mount(&self, bucket: &str, cfg: &Config) -> Mount {
        self.mount_on(bucket, cfg, None)
    }

    /// Mounts `bucket` with `cfg` on a current-thread runtime of the mount's own, which its
    /// FUSE thread drives: what the daemon does on fewer than 4 cores.
    pub fn mount_driven(&self, bucket: &str, cfg: &Config) -> Mount {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        self.mount_on(bucket, cfg, Some(Arc::new(rt)))
    }

    /// Mounts `bucket` on `own` (driven by the FUSE thread) when given, else on the
    /// environment's worker runtime.
    fn mount_on(&self, bucket: &str, cfg: &Config, own: Option<Arc<Runtime>>) -> Mount {
        let dir = tempfile::Builder::new()
            .prefix("rapidfs-mnt-")
            .tempdir()
            .expect("tempdir");
        let rt = own.as_deref().unwrap_or(&self.rt);
        let fs = rt.block_on(async {
            let client = Client::connect(&cfg.gcs).await.expect("client connects");
            let fs = Fs::new(client, bucket, cfg);
            fs.check_bucket().await.expect("bucket answers");
            fs
        });
        let settings = MountSettings {
            fsname: format!("rapidfs:{bucket}"),
            read_only: cfg.fs.read_only,
            allow_other: false,
            extra: vec![],
        };
        let driver = match &own {
            Some(rt) => Driver::FuseThread(rt.clone()),
            None => Driver::Workers(self.rt.handle().clone()),
        };
        let mounted = Mounted::start(fs.clone(), driver, dir.path(), &settings)
            .unwrap_or_else(|e| panic!("FUSE mount on {} failed: {e}", dir.path().display()));
        Mount {
            path: dir.path().to_path_buf(),
            fs,
            mounted: Some(mounted),
            runtime: own,
            _dir: dir,
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(emu) = self.emu.take() {
            self.rt.block_on(emu.shutdown());
        }
    }
}

/// A live mount; unmounted on drop.
pub struct Mount {
    pub path: PathBuf,
    /// The mounted filesystem, for what only the daemon knows (its inodes).
    pub fs: Fs,
    mounted: Option<Mounted>,
    /// The mount's own runtime, when its FUSE thread drives one (`Env::mount_driven`).
    pub runtime: Option<Arc<Runtime>>,
    _dir: tempfile::TempDir,
}

impl Mount {
    pub fn p(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    /// Resolves when the session ends (see `Mounted::ended`).
    pub fn ended(&mut self) -> tokio::sync::oneshot::Receiver<()> {
        self.mounted.as_mut().expect("mounted").ended()
    }

    pub fn unmount(mut self) {
        if let Some(m) = self.mounted.take() {
            m.unmount().expect("unmount");
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(m) = self.mounted.take() {
            let _ = m.unmount();
        }
    }
}

/// Whether a filesystem is mounted on `path` (as /proc/self/mountinfo spells it).
pub fn is_mounted(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let p = path.to_string_lossy();
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_ref()))
}

pub fn sha(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// Deterministic pseudo-random bytes (xorshift), fast enough for hundreds of MiB.
pub fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Reads a whole file with 1 MiB reads, as `dd bs=1M` would.
pub fn read_file(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}
