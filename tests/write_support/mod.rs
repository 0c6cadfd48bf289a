//! Shared helpers of the write tests: the source data written in 1 MiB chunks (generated, not
//! stored, so big files cost no test memory), and what the bucket holds, asked over the wire.
#![allow(dead_code)]

use rapidfs::config::GcsConfig;
use rapidfs::gcs::{Client, ObjectMeta};

pub const MIB: usize = 1024 * 1024;

/// Chunk `i` of the stream seeded with `seed` (1 MiB of pseudo-random bytes).
pub fn chunk(seed: u64, i: usize) -> Vec<u8> {
    let mut x = (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64 + 1)).wrapping_mul(31) | 1;
    let mut out = Vec::with_capacity(MIB);
    while out.len() < MIB {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// The first `n` chunks of the stream `seed`, concatenated.
pub fn chunks(seed: u64, n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| chunk(seed, i)).collect()
}

/// CRC32C of the first `n` chunks of stream `seed`, without holding them all.
pub fn crc_of(seed: u64, n: usize) -> u32 {
    (0..n).fold(0, |c, i| crc32c::crc32c_append(c, &chunk(seed, i)))
}

/// A client of the emulator at `endpoint`, on `rt`.
pub fn client(rt: &tokio::runtime::Runtime, endpoint: &str) -> Client {
    let cfg = GcsConfig {
        endpoint: endpoint.to_string(),
        ..GcsConfig::default()
    };
    rt.block_on(Client::connect(&cfg)).expect("client connects")
}

/// The object's metadata as the service has it.
pub fn meta(rt: &tokio::runtime::Runtime, c: &Client, bucket: &str, name: &str) -> ObjectMeta {
    rt.block_on(c.get_object(bucket, name))
        .unwrap_or_else(|e| panic!("get_object {name}: {e}"))
}

/// The metadata of an object a create through the mount has just sent: the create does not
/// wait for the service's answer, so the object appears a moment later, with nothing
/// written or flushed.
pub fn created(rt: &tokio::runtime::Runtime, c: &Client, bucket: &str, name: &str) -> ObjectMeta {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match rt.block_on(c.get_object(bucket, name)) {
            Ok(m) => return m,
            Err(e) if std::time::Instant::now() > deadline => panic!("{name} never created: {e}"),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
        }
    }
}

/// The object's bytes as the service has them.
pub fn bytes(rt: &tokio::runtime::Runtime, c: &Client, bucket: &str, name: &str) -> Vec<u8> {
    rt.block_on(async {
        let r = c.open_reader(bucket, name, None).await.expect("reader");
        let size = r.metadata().size;
        r.read(0, size).await.expect("read").to_vec()
    })
}

/// The errno of an I/O error (panics on success: the caller expects a failure).
pub fn errno_of<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}
