//! SIGTERM while the mount is busy: the `rapidfs` daemon (its own process, memory-backed
//! emulator of this test) must flush, unmount, exit 0 and leave no mount in /proc/mounts,
//! whether a reader is in the middle of a 1 GiB file or a writer is streaming. Every byte
//! whose write(2) returned before the signal must be in the bucket: the write streams are cut
//! every 3.5 MiB, so bytes are only durable once the daemon resent and flushed them.

mod mount_support;
mod write_support;

use mount_support::Env;
use rapidfs::emulator::Faults;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use write_support::{bytes, chunk, client, MIB};

const BUCKET: &str = "signal";

fn in_proc_mounts(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").expect("/proc/mounts");
    let p = path.to_string_lossy();
    mounts
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(p.as_ref()))
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn daemon(env: &Env, mnt: &Path) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .args(["mount", BUCKET, "--foreground"])
        .arg(mnt)
        .args(["--endpoint", &env.emu().endpoint()])
        .stdin(Stdio::null())
        .spawn()
        .expect("rapidfs runs");
    wait_until("mounted", || in_proc_mounts(mnt));
    child
}

/// SIGTERM, then the daemon must exit 0 within 30 s (killed, its mount detached, and failed
/// otherwise).
fn terminate(mut child: Child, mnt: &Path) {
    // SAFETY: signalling our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            let _ = Command::new("umount").arg("-l").arg(mnt).status();
            panic!("the daemon did not stop within 30 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "exit after SIGTERM: {status}");
}

#[test]
fn sigterm_during_a_1_gib_read_unmounts_and_exits_0() {
    let env = Env::new(BUCKET);
    const SIZE: usize = 1 << 30;
    let mut big = vec![0u8; SIZE];
    for (i, c) in big.chunks_mut(MIB).enumerate().take(64) {
        c.copy_from_slice(&chunk(3, i));
    }
    env.emu()
        .put_object(BUCKET, "big.bin", bytes::Bytes::from(big))
        .expect("put 1 GiB");
    let mnt = tempfile::tempdir().expect("tempdir");
    let child = daemon(&env, mnt.path());
    let (at_64, go_on) = (mpsc::channel(), mpsc::channel::<()>());
    let path = mnt.path().join("big.bin");
    let reader = std::thread::spawn(move || {
        let mut f = std::fs::File::open(&path).expect("open");
        let mut buf = vec![0u8; MIB];
        for i in 0..64 {
            f.read_exact(&mut buf).expect("read");
            assert!(buf == chunk(3, i), "chunk {i} differs");
        }
        at_64.0.send(()).expect("main waits");
        // Keep the file open and mid-read while the daemon is told to stop.
        let _ = go_on.1.recv();
        let mut total = 64 * MIB;
        loop {
            match f.read(&mut buf) {
                Ok(0) | Err(_) => return total,
                Ok(n) => total += n,
            }
        }
    });
    at_64.1.recv().expect("reader got 64 MiB");
    terminate(child, mnt.path());
    go_on.0.send(()).expect("reader waits");
    let read = reader.join().expect("reader ends");
    assert!(read < SIZE, "the read should have been cut, read {read}");
    assert!(!in_proc_mounts(mnt.path()), "stale mount left behind");
}

#[test]
fn sigterm_during_a_write_keeps_every_acknowledged_byte() {
    let env = Env::new(BUCKET);
    env.emu().set_faults(Faults {
        cut_write_after_bytes: Some(7 * MIB as u64 / 2),
        ..Faults::default()
    });
    let mnt = tempfile::tempdir().expect("tempdir");
    let child = daemon(&env, mnt.path());
    let path = mnt.path().join("stream.bin");
    let (at_16, done) = (mpsc::channel(), mpsc::channel::<()>());
    let writer = std::thread::spawn(move || {
        let mut f = std::fs::File::create(&path).expect("create");
        let mut acked = 0usize;
        for i in 0.. {
            if i == 16 {
                at_16.0.send(()).expect("main waits");
            }
            // write(2) returning is the acknowledgement; a short write counts what it took.
            match f.write(&chunk(4, i)) {
                Ok(n) => acked += n,
                Err(_) => break,
            }
            if n_written_is_partial(acked) {
                break;
            }
        }
        drop(f);
        let _ = done.0.send(());
        acked
    });
    at_16.1.recv().expect("writer got 16 MiB through");
    terminate(child, mnt.path());
    let acked = writer.join().expect("writer ends");
    let _ = done.1.recv();
    assert!(!in_proc_mounts(mnt.path()), "stale mount left behind");
    assert!(acked >= 16 * MIB, "acked {acked}");
    let c = client(&env.rt, &env.emu().endpoint());
    let held = bytes(&env.rt, &c, BUCKET, "stream.bin");
    assert!(
        held.len() >= acked,
        "the bucket holds {} bytes, {acked} were acknowledged",
        held.len()
    );
    for (i, got) in held[..acked].chunks(MIB).enumerate() {
        assert!(got == &chunk(4, i)[..got.len()], "chunk {i} differs");
    }
}

/// A write that took only part of a chunk ends the stream (the next one would not append).
fn n_written_is_partial(acked: usize) -> bool {
    !acked.is_multiple_of(MIB)
}
