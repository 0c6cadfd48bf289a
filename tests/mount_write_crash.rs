//! Durability across a daemon crash, and the daemon's memory while writing: the `rapidfs`
//! binary (its own process) mounts the emulator of this test; it is killed with SIGKILL right
//! after `fsync` or `close` returns, and the bucket must hold every acknowledged byte (or,
//! killed halfway through an overwrite, the old version).
//!
//! Over loopback the emulator receives bytes almost as soon as they are handed to the stream,
//! so a daemon that answered fsync without waiting would mostly get away with it. The crash
//! tests therefore cut the write stream every 3.5 MiB: each stream keeps 3 MiB and drops the
//! message that crosses the limit, so the last MiB of the 64 MiB file is dropped and must be
//! resent on a new stream before fsync or close may return.

mod daemon_support;
mod mount_support;
mod write_support;

use daemon_support::{kill, Daemon};
use mount_support::Env;
use rapidfs::emulator::Faults;
use std::io::Write;
use std::path::Path;
use write_support::{bytes, chunk, chunks, client, meta, MIB};

const BUCKET: &str = "crash";

/// The daemon in the foreground on `mnt`, once its mount is live.
fn daemon(env: &Env, mnt: &Path, extra: &[&str]) -> Daemon {
    daemon_support::daemon(&env.emu().endpoint(), BUCKET, mnt, extra)
}

fn cut_every_3_5_mib() -> Faults {
    Faults {
        cut_write_after_bytes: Some(7 * MIB as u64 / 2),
        ..Faults::default()
    }
}

#[test]
fn sigkill_right_after_fsync_loses_no_fsynced_byte() {
    let env = Env::new(BUCKET);
    let c = client(&env.rt, &env.emu().endpoint());
    let mnt = tempfile::tempdir().expect("tempdir");
    env.emu().set_faults(cut_every_3_5_mib());
    let child = daemon(&env, mnt.path(), &[]);
    let mut f = std::fs::File::create(mnt.path().join("ckpt.bin")).expect("create");
    for i in 0..64 {
        f.write_all(&chunk(1, i)).expect("write");
        if (i + 1) % 4 == 0 {
            f.sync_all().expect("fsync");
        }
    }
    kill(child);
    drop(f);
    let got = meta(&env.rt, &c, BUCKET, "ckpt.bin");
    assert_eq!(got.size, 64 * MIB as u64, "every fsynced byte");
    assert!(
        bytes(&env.rt, &c, BUCKET, "ckpt.bin") == chunks(1, 64),
        "exactly the bytes written"
    );
}

#[test]
fn sigkill_with_unsynced_bytes_keeps_the_fsynced_prefix_and_no_garbage() {
    let env = Env::new(BUCKET);
    let c = client(&env.rt, &env.emu().endpoint());
    let mnt = tempfile::tempdir().expect("tempdir");
    env.emu().set_faults(cut_every_3_5_mib());
    let child = daemon(&env, mnt.path(), &[]);
    let mut f = std::fs::File::create(mnt.path().join("half.bin")).expect("create");
    for i in 0..42 {
        f.write_all(&chunk(2, i)).expect("write");
        if (i + 1) % 4 == 0 {
            f.sync_all().expect("fsync");
        }
    }
    // Chunks 40 and 41 were written after the last fsync: they may or may not have landed.
    kill(child);
    drop(f);
    let got = bytes(&env.rt, &c, BUCKET, "half.bin");
    assert!(got.len() >= 40 * MIB, "every fsynced byte: {}", got.len());
    let source = chunks(2, 42);
    assert!(
        got[..] == source[..got.len()],
        "nothing but the source, in order"
    );
}

#[test]
fn sigkill_right_after_close_loses_nothing() {
    let env = Env::new(BUCKET);
    let c = client(&env.rt, &env.emu().endpoint());
    let mnt = tempfile::tempdir().expect("tempdir");
    env.emu().set_faults(cut_every_3_5_mib());
    let child = daemon(&env, mnt.path(), &[]);
    let mut f = std::fs::File::create(mnt.path().join("closed.bin")).expect("create");
    for i in 0..64 {
        f.write_all(&chunk(3, i)).expect("write");
    }
    drop(f);
    kill(child);
    let got = meta(&env.rt, &c, BUCKET, "closed.bin");
    assert_eq!(got.size, 64 * MIB as u64, "every closed byte");
    assert!(bytes(&env.rt, &c, BUCKET, "closed.bin") == chunks(3, 64));
}

/// `torch.save` over last epoch's file, killed halfway: the file keeps its old version (the
/// new one streams beside it until the close).
#[test]
fn sigkill_halfway_through_an_overwrite_keeps_the_old_version() {
    let env = Env::new(BUCKET);
    let c = client(&env.rt, &env.emu().endpoint());
    let mnt = tempfile::tempdir().expect("tempdir");
    let old = chunks(4, 8);
    env.put(BUCKET, "last.pt", &old);
    let child = daemon(&env, mnt.path(), &[]);
    let mut f = std::fs::File::create(mnt.path().join("last.pt")).expect("open over it");
    for i in 0..16 {
        f.write_all(&chunk(5, i)).expect("write");
    }
    kill(child);
    drop(f);
    assert!(
        bytes(&env.rt, &c, BUCKET, "last.pt") == old,
        "the old version, whole"
    );
}

/// The same overwrite, closed before the kill (its streams cut every 3.5 MiB): the close
/// returned only once the new version was in place, whole.
#[test]
fn sigkill_right_after_the_close_of_an_overwrite_loses_nothing() {
    let env = Env::new(BUCKET);
    let c = client(&env.rt, &env.emu().endpoint());
    let mnt = tempfile::tempdir().expect("tempdir");
    env.put(BUCKET, "last.pt", &chunks(4, 8));
    env.emu().set_faults(cut_every_3_5_mib());
    let child = daemon(&env, mnt.path(), &[]);
    let mut f = std::fs::File::create(mnt.path().join("last.pt")).expect("open over it");
    for i in 0..32 {
        f.write_all(&chunk(6, i)).expect("write");
    }
    drop(f);
    kill(child);
    assert!(bytes(&env.rt, &c, BUCKET, "last.pt") == chunks(6, 32));
}

fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

#[test]
fn sixteen_writers_of_256_mib_stay_within_the_memory_budget() {
    let env = Env::new(BUCKET);
    let c = client(&env.rt, &env.emu().endpoint());
    let mnt = tempfile::tempdir().expect("tempdir");
    let child = daemon(&env, mnt.path(), &["--memory-mb", "128"]);
    let one = chunk(9, 0);
    std::thread::scope(|s| {
        for w in 0..16 {
            let path = mnt.path().join(format!("w{w:02}.bin"));
            let one = &one;
            s.spawn(move || {
                let mut f = std::fs::File::create(&path).expect("create");
                for _ in 0..256 {
                    f.write_all(one).expect("write");
                }
            });
        }
    });
    let hwm_mib = vm_hwm_kib(child.id()) / 1024;
    assert!(child.terminate().success());
    let crc = (0..256).fold(0, |c, _| crc32c::crc32c_append(c, &one));
    for w in 0..16 {
        let got = meta(&env.rt, &c, BUCKET, &format!("w{w:02}.bin"));
        assert_eq!(got.size, 256 * MIB as u64, "writer {w}");
        assert_eq!(got.crc32c, Some(crc), "writer {w}");
    }
    eprintln!("daemon VmHWM {hwm_mib} MiB (budget 128 MiB)");
    assert!(
        hwm_mib < 128 + 64,
        "daemon peak RSS {hwm_mib} MiB with a 128 MiB budget"
    );
}
