//! Reads on a read-only mount, which the kernel sends without opening the file (the mount
//! answers `open` with ENOSYS), through `fs` alone: the bytes of the inode's generation, a
//! sequential reader's read-ahead kept from one request to the next, and a replaced object
//! read old (or stale) through its old inode and new through its new one.

mod fs_support;

use fs_support::{pattern, FsEnv};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

#[test]
fn a_sequential_reader_without_an_open_keeps_its_read_ahead() {
    let env = FsEnv::new("ro", |cfg| cfg.fs.read_only = true);
    let want = pattern(1, 8 * MIB);
    env.put("big.bin", &want);
    let ino = env.ino("big.bin");
    let fs = &env.fs;
    assert!(fs.skips_open(), "a read-only mount reads without opens");
    let before = env.emu().stats().ranges_requested;
    // The kernel's default read-ahead: 128 KiB requests, one after another. Each request
    // alone looks like a random read; only a scan state kept between them sees a sequential
    // reader and fetches whole blocks ahead of it.
    let step = 128 * KIB;
    env.rt.block_on(async {
        for offset in (0..want.len()).step_by(step) {
            let got = fs
                .read_unopened(ino, offset as u64, step as u32, false)
                .await
                .expect("read");
            assert!(got[..] == want[offset..offset + step], "bytes at {offset}");
        }
    });
    let ranges = env.emu().stats().ranges_requested - before;
    let requests = want.len() / step;
    assert!(
        ranges <= requests as u64 / 4,
        "{ranges} ranges fetched for {requests} sequential requests"
    );
}

#[test]
fn a_replaced_object_reads_old_through_its_old_inode_and_new_through_its_new_one() {
    let env = FsEnv::new("ro", |cfg| {
        cfg.fs.read_only = true;
        cfg.fs.stat_ttl_ms = 0;
        cfg.fs.list_ttl_ms = 0;
        cfg.fs.negative_ttl_ms = 0;
    });
    for (name, len) in [("small.bin", 100 * KIB), ("big.bin", 3 * MIB)] {
        let old = pattern(2, len);
        env.put(name, &old);
        let old_ino = env.ino(name);
        let fs = &env.fs;
        let read = |ino: u64| {
            env.rt
                .block_on(fs.read_unopened(ino, 0, len as u32, false))
                .map_err(|e| e.0)
        };
        assert!(read(old_ino).expect("old version") == old, "{name}");
        let new = pattern(3, len);
        env.put(name, &new);
        let new_ino = env.ino(name);
        assert_ne!(new_ino, old_ino, "{name}: a new generation is a new inode");
        // The old inode reads the old generation to the end: from what the cache still
        // holds of it, else ESTALE, since the service no longer has it. Never a new byte.
        match read(old_ino) {
            Ok(bytes) => assert!(bytes == old, "{name}: old inode, other bytes"),
            Err(errno) => assert_eq!(errno, libc::ESTALE, "{name} through its old inode"),
        }
        assert!(read(new_ino).expect("new version") == new, "{name}");
    }
}
