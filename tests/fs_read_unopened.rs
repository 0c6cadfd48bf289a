//! Reads on a read-only mount, which the kernel sends without opening the file (the mount
//! answers `open` with ENOSYS), through `fs` alone: the bytes of the inode's generation, a
//! sequential reader's read-ahead kept from one request to the next (per reader), and a replaced object
//! read old (or stale) through its old inode and new through its new one.

mod fs_support;

use fs_support::{pattern, FsEnv};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

#[test]
fn sequential_readers_without_an_open_keep_their_read_ahead() {
    let env = FsEnv::new("ro", |cfg| cfg.fs.read_only = true);
    let want = pattern(1, 40 * MIB);
    env.put("big.bin", &want);
    let ino = env.ino("big.bin");
    let fs = &env.fs;
    assert!(fs.skips_open(), "a read-only mount reads without opens");
    let before = env.emu().stats();
    // Two processes read 2 MiB each, at the start and 24 MiB further (past what a scan state
    // takes for the kernel's reordering), each with the kernel's default read-ahead: 128 KiB
    // requests one after another, the two readers' requests interleaved. Each request alone
    // looks like a random read; only a scan state kept per reader between requests sees two
    // sequential readers and fetches whole blocks ahead of each.
    let step = 128 * KIB;
    let (span, second) = (2 * MIB, 24 * MIB);
    env.rt.block_on(async {
        for offset in (0..span).step_by(step) {
            for (reader, start) in [(101, 0), (102, second)] {
                let at = start + offset;
                let got = fs
                    .read_unopened(ino, at as u64, step as u32, false, reader)
                    .await
                    .expect("read");
                assert!(got[..] == want[at..at + step], "bytes at {at}");
            }
        }
    });
    // A random read fetches its own 128 KiB; a scan fetches whole blocks (1 MiB) and reads
    // ahead, so that the service sees few ranges, each large.
    let after = env.emu().stats();
    let ranges = after.ranges_requested - before.ranges_requested;
    let bytes = after.bytes_requested - before.bytes_requested;
    assert!(
        ranges > 0 && bytes / ranges >= (MIB / 2) as u64,
        "{ranges} ranges of {bytes} bytes in all fetched for two sequential readers"
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
                .block_on(fs.read_unopened(ino, 0, len as u32, false, 1))
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
