//! A real FUSE mount whose FUSE thread drives the runtime itself (the daemon's way below 4
//! cores): reads by several threads at once, a big file read while small ones are, writes
//! made durable by fsync and close, listings, renames, the tasks of an idle mount, and the
//! end of the session told to the runtime after an unmount from outside.

mod mount_support;
mod write_support;

use mount_support::{data, read_file, sha, Env};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::time::Duration;

const MIB: usize = 1024 * 1024;
const BUCKET: &str = "driven";

/// 120 files of mixed sizes, one of 48 MiB; returns name -> bytes.
fn files(env: &Env) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for i in 0..120u64 {
        let size = match i % 5 {
            _ if i == 60 => 48 * MIB,
            0 => 0,
            1 => 4096,
            2 => MIB + 1,
            _ => 1000 + (i as usize * 7919) % (700 * 1024),
        };
        let name = format!("d{}/f{i:03}.bin", i % 3);
        let bytes = data(i, size);
        env.put(BUCKET, &name, &bytes);
        files.insert(name, bytes);
    }
    files
}

#[test]
fn four_readers_and_a_writer_on_a_mount_its_fuse_thread_drives() {
    let env = Env::new(BUCKET);
    let files = files(&env);
    let m = env.mount_driven(BUCKET, &env.config());

    std::thread::scope(|s| {
        for reader in 0..4 {
            let (m, files) = (&m, &files);
            s.spawn(move || {
                for (name, bytes) in files.iter().skip(reader).step_by(2) {
                    let got = read_file(&m.p(name));
                    assert_eq!(sha(&got), sha(bytes), "{name} as read by reader {reader}");
                }
            });
        }
        s.spawn(|| {
            let big = std::fs::File::open(m.p("d0/f060.bin")).expect("open the big file");
            let want = &files["d0/f060.bin"];
            let mut buf = vec![0u8; 4096];
            for i in 0..300u64 {
                let off = (i * 7_654_321) % (want.len() as u64 - 4096);
                big.read_exact_at(&mut buf, off).expect("pread");
                assert_eq!(
                    &buf[..],
                    &want[off as usize..off as usize + 4096],
                    "at {off}"
                );
            }
        });
    });

    let written = data(1000, 3 * MIB + 5);
    let mut f = std::fs::File::create(m.p("d1/new.bin")).expect("create");
    f.write_all(&written).expect("write");
    f.sync_all().expect("fsync");
    drop(f);
    let client = write_support::client(&env.rt, &env.emu().endpoint());
    let stored = write_support::bytes(&env.rt, &client, BUCKET, "d1/new.bin");
    assert_eq!(
        sha(&stored),
        sha(&written),
        "the bucket holds what fsync acknowledged"
    );

    std::fs::rename(m.p("d1/new.bin"), m.p("d2/moved.bin")).expect("rename");
    let mut listed: Vec<String> = std::fs::read_dir(m.p("d2"))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    listed.sort();
    let mut want: Vec<String> = files
        .keys()
        .filter_map(|n| n.strip_prefix("d2/").map(str::to_string))
        .chain(["moved.bin".to_string()])
        .collect();
    want.sort();
    assert_eq!(listed, want);
    assert_eq!(read_file(&m.p("d2/moved.bin")), written);
    m.unmount();
}

#[test]
fn an_idle_mount_driven_by_its_fuse_thread_still_runs_its_tasks() {
    let env = Env::new(BUCKET);
    let m = env.mount_driven(BUCKET, &env.config());
    // Nothing touches the mount: no request gives the FUSE thread a turn, and the task must
    // run anyway, as a signal's or an upload's does on an idle daemon.
    let (sent, received) = mpsc::channel();
    let rt = m.runtime.as_ref().expect("the mount's own runtime");
    rt.spawn(async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let _ = sent.send(());
    });
    received
        .recv_timeout(Duration::from_secs(30))
        .expect("the idle mount's runtime ran the task");
    m.unmount();
}

/// The kernel hands over the forgets it has queued in one request: the whole batch is taken
/// in at once, also when no request follows to end a turn (an idle mount after a walk).
#[test]
fn a_batch_of_forgets_is_taken_in_whole_while_the_mount_idles() {
    let env = Env::new(BUCKET);
    let files = 2_000;
    for i in 0..files {
        env.put(BUCKET, &format!("many/f{i:04}"), b"x");
    }
    let m = env.mount_driven(BUCKET, &env.config());
    for i in 0..files {
        std::fs::metadata(m.p(&format!("many/f{i:04}"))).expect("stat");
    }
    assert!(m.fs.metadata_usage().inodes > files);
    // The kernel lets go of every inode nobody uses, and queues a forget for each.
    std::fs::write("/proc/sys/vm/drop_caches", "2").expect("drop_caches (the tests run as root)");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut held = m.fs.metadata_usage().inodes;
    while held > 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        held = m.fs.metadata_usage().inodes;
    }
    assert!(
        held <= 2,
        "{held} inodes still held 10 s after the kernel let go of them"
    );
    m.unmount();
}

#[test]
fn an_unmount_from_outside_reaches_the_runtime_after_the_fuse_thread_is_gone() {
    let env = Env::new(BUCKET);
    let mut m = env.mount_driven(BUCKET, &env.config());
    let ended = m.ended();
    let (sent, received) = mpsc::channel();
    let rt = m.runtime.clone().expect("the mount's own runtime");
    // The daemon's main thread waits for the end this way: a task, and a channel out.
    rt.spawn(async move {
        if ended.await.is_ok() {
            let _ = sent.send(());
        }
    });
    let st = std::process::Command::new("umount")
        .arg(&m.path)
        .status()
        .expect("umount runs");
    assert!(st.success(), "umount {}", m.path.display());
    received
        .recv_timeout(Duration::from_secs(30))
        .expect("the session's end reached the task");
    m.unmount();
}
