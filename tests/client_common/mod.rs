//! Shared setup of the client tests: an in-process memory emulator on 127.0.0.1:0, a client
//! configured for fast retries, and deterministic test data.

#![allow(dead_code)]

use bytes::{Bytes, BytesMut};
use rapidfs::config::GcsConfig;
use rapidfs::emulator::{Emulator, EmulatorOptions, Faults};
use rapidfs::gcs::Client;

pub const BUCKET: &str = "bkt";
pub const MIB: usize = 1024 * 1024;

pub fn options(faults: Faults) -> EmulatorOptions {
    EmulatorOptions {
        root: None,
        memory: true,
        zone: "us-central1-a".to_string(),
        faults,
    }
}

/// A memory emulator with bucket `BUCKET`.
pub async fn emulator(faults: Faults) -> Emulator {
    let emu = Emulator::start(options(faults), "127.0.0.1:0".parse().unwrap())
        .await
        .expect("emulator starts");
    emu.create_bucket(BUCKET).expect("bucket");
    emu
}

/// Client settings for tests: quick backoff, generous deadline.
pub fn config(endpoint: String) -> GcsConfig {
    GcsConfig {
        endpoint,
        initial_backoff_ms: 1,
        max_backoff_ms: 20,
        retry_deadline_ms: 20_000,
        stall_timeout_ms: 5_000,
        ..GcsConfig::default()
    }
}

pub async fn client(emu: &Emulator) -> Client {
    Client::connect(&config(emu.endpoint()))
        .await
        .expect("client connects")
}

/// `len` bytes that differ at every offset modulo 1 MiB and carry their own position every
/// 4 KiB, so misplaced or repeated chunks are caught; cheap to build even for 1 GiB.
pub fn data(len: usize, seed: u64) -> Bytes {
    let mut block = vec![0u8; MIB.min(len.max(1))];
    let mut x = seed | 1;
    for c in block.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = c.len();
        c.copy_from_slice(&x.to_le_bytes()[..n]);
    }
    let mut out = BytesMut::with_capacity(len);
    while out.len() < len {
        let n = block.len().min(len - out.len());
        out.extend_from_slice(&block[..n]);
    }
    for pos in (0..len.saturating_sub(8)).step_by(4096) {
        out[pos..pos + 8].copy_from_slice(&(pos as u64 ^ seed).to_le_bytes());
    }
    out.freeze()
}
