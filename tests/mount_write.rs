//! Writes through a real FUSE mount: files stream into appendable objects (one generation,
//! one write stream), fsync and close make bytes durable, readers on the mount see what was
//! written, takeover across mounts fences the first writer, modification times set by
//! `rsync -a`, `tar -x` and `cp -p` are kept, and a read-only mount answers EROFS. (Writes that are not appends are staged: tests/mount_staging.rs.)

mod mount_support;
mod write_support;

use mount_support::Env;
use rapidfs::emulator::Faults;
use std::fs::OpenOptions;
use std::io::Write;
use std::time::{Duration, Instant};
use write_support::{bytes, chunk, chunks, client, crc_of, created, errno_of, meta, MIB};

const BUCKET: &str = "writes";

/// Writes `n` chunks of stream `seed` to `f` in 1 MiB writes, fsync every `sync_every` chunks.
fn write_chunks(f: &mut std::fs::File, seed: u64, n: usize, sync_every: usize) {
    for i in 0..n {
        f.write_all(&chunk(seed, i)).expect("write");
        if sync_every > 0 && (i + 1) % sync_every == 0 {
            f.sync_all().expect("fsync");
        }
    }
}

#[test]
fn a_written_file_is_an_unfinalized_object_with_every_byte() {
    let env = Env::new(BUCKET);
    let m = env.mount(BUCKET, &env.config());
    let c = client(&env.rt, &env.emu().endpoint());
    let mut f = std::fs::File::create(m.p("log.bin")).expect("create");
    let at_create = created(&env.rt, &c, BUCKET, "log.bin");
    assert_eq!(at_create.size, 0, "the object exists from create on");
    write_chunks(&mut f, 1, 8, 4);
    f.write_all(b"tail").expect("write");
    // stat on the mount shows the growing size before any fsync.
    assert_eq!(
        std::fs::metadata(m.p("log.bin")).expect("stat").len(),
        8 * MIB as u64 + 4
    );
    // A reader on the same mount reads what was written so far.
    let mut want = chunks(1, 8);
    want.extend_from_slice(b"tail");
    let got = std::fs::read(m.p("log.bin")).expect("read while open");
    assert!(got == want, "reader sees the bytes written so far");
    f.write_all(b"more").expect("write after a reader");
    drop(f);
    want.extend_from_slice(b"more");
    let after = meta(&env.rt, &c, BUCKET, "log.bin");
    assert_eq!(after.size, want.len() as u64, "close persisted everything");
    assert_eq!(after.generation, at_create.generation, "one generation");
    assert!(!after.finalized, "close leaves the object appendable");
    assert!(bytes(&env.rt, &c, BUCKET, "log.bin") == want);
    assert!(std::fs::read(m.p("log.bin")).expect("reread") == want);
    let st = env.emu().stats();
    assert_eq!(st.write_streams, 1, "one write stream for the file");
}

#[test]
fn a_256_mib_file_takes_one_stream_and_no_resends() {
    let env = Env::new(BUCKET);
    let m = env.mount(BUCKET, &env.config());
    let c = client(&env.rt, &env.emu().endpoint());
    env.emu().reset_stats();
    let mut f = std::fs::File::create(m.p("big.bin")).expect("create");
    write_chunks(&mut f, 2, 256, 0);
    // The create goes out with the first bytes sent, not at the open: the object exists
    // once they stream, and its close must keep that generation.
    let generation = created(&env.rt, &c, BUCKET, "big.bin").generation;
    drop(f);
    let got = meta(&env.rt, &c, BUCKET, "big.bin");
    assert_eq!(got.size, 256 * MIB as u64);
    assert_eq!(got.generation, generation, "one generation");
    assert_eq!(
        got.crc32c,
        Some(crc_of(2, 256)),
        "the object equals the source"
    );
    let st = env.emu().stats();
    assert_eq!(st.write_streams, 1, "one write stream: {st:?}");
    assert!(
        st.bytes_received <= 258 * MIB as u64,
        "received {} bytes for a 256 MiB file",
        st.bytes_received
    );
}

#[test]
fn a_write_stream_cut_every_5_mib_loses_nothing() {
    let env = Env::new(BUCKET);
    let m = env.mount(BUCKET, &env.config());
    let c = client(&env.rt, &env.emu().endpoint());
    env.emu().set_faults(Faults {
        cut_write_after_bytes: Some(5 * MIB as u64),
        ..Faults::default()
    });
    let mut f = std::fs::File::create(m.p("cut.bin")).expect("create");
    write_chunks(&mut f, 3, 48, 8);
    drop(f);
    env.emu().set_faults(Faults::default());
    let got = meta(&env.rt, &c, BUCKET, "cut.bin");
    assert_eq!(got.size, 48 * MIB as u64);
    assert!(
        bytes(&env.rt, &c, BUCKET, "cut.bin") == chunks(3, 48),
        "the object equals the source"
    );
    let st = env.emu().stats();
    assert!(
        st.write_streams > 5,
        "the stream was cut and resumed: {st:?}"
    );
}

#[test]
fn sixteen_writers_at_once() {
    let env = Env::new(BUCKET);
    let m = env.mount(BUCKET, &env.config());
    let c = client(&env.rt, &env.emu().endpoint());
    std::thread::scope(|s| {
        for w in 0..16u64 {
            let path = m.p(&format!("w{w:02}.bin"));
            s.spawn(move || {
                let mut f = std::fs::File::create(&path).expect("create");
                write_chunks(&mut f, 100 + w, 12, 4);
            });
        }
    });
    for w in 0..16u64 {
        let got = meta(&env.rt, &c, BUCKET, &format!("w{w:02}.bin"));
        assert_eq!(got.size, 12 * MIB as u64, "writer {w}");
        assert_eq!(got.crc32c, Some(crc_of(100 + w, 12)), "writer {w}");
    }
}

#[test]
fn takeover_across_mounts_fences_the_first_writer() {
    let env = Env::new(BUCKET);
    let a = env.mount(BUCKET, &env.config());
    let b = env.mount(BUCKET, &env.config());
    let c = client(&env.rt, &env.emu().endpoint());
    let mut fa = std::fs::File::create(a.p("shared.log")).expect("create on A");
    fa.write_all(&chunk(4, 0)).expect("write on A");
    fa.sync_all().expect("fsync on A");

    let mut fb = OpenOptions::new()
        .append(true)
        .open(b.p("shared.log"))
        .expect("open O_APPEND on B");
    fb.write_all(&chunk(5, 0)).expect("append on B takes over");
    fb.sync_all().expect("fsync on B");

    // A was fenced: its next write or, at the latest, its fsync fails with EIO.
    let late = fa.write_all(b"late bytes from A");
    if let Err(e) = &late {
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    }
    assert_eq!(errno_of(fa.sync_all()), libc::EIO, "fsync on fenced A");
    drop(fa);
    fb.write_all(&chunk(5, 1)).expect("B goes on");
    drop(fb);

    let mut want = chunk(4, 0);
    want.extend_from_slice(&chunk(5, 0));
    want.extend_from_slice(&chunk(5, 1));
    assert!(
        bytes(&env.rt, &c, BUCKET, "shared.log") == want,
        "A's bytes then B's, never mixed"
    );
    assert!(!meta(&env.rt, &c, BUCKET, "shared.log").finalized);
}

#[test]
fn reopening_with_o_append_continues_the_object() {
    let env = Env::new(BUCKET);
    let m = env.mount(BUCKET, &env.config());
    let c = client(&env.rt, &env.emu().endpoint());
    std::fs::write(m.p("a.log"), b"one\n").expect("write");
    let generation = meta(&env.rt, &c, BUCKET, "a.log").generation;
    for line in ["two\n", "three\n"] {
        let mut f = OpenOptions::new()
            .append(true)
            .open(m.p("a.log"))
            .expect("open O_APPEND");
        f.write_all(line.as_bytes()).expect("append");
    }
    assert_eq!(
        std::fs::read(m.p("a.log")).expect("read"),
        b"one\ntwo\nthree\n"
    );
    let got = meta(&env.rt, &c, BUCKET, "a.log");
    assert_eq!(got.generation, generation, "appends keep the generation");
    assert_eq!(got.size, 14);
}

/// O_APPEND writes at the object's end even where the kernel's cached size is older: B's
/// kernel still holds the size it saw before A appended, and computes its offset from it.
#[test]
fn an_o_append_write_lands_after_what_another_mount_appended_since() {
    use std::os::unix::fs::FileExt;
    let env = Env::new(BUCKET);
    let a = env.mount(BUCKET, &env.config());
    let b = env.mount(BUCKET, &env.config());
    let c = client(&env.rt, &env.emu().endpoint());
    std::fs::write(a.p("a.log"), b"one\n").expect("write on A");
    assert_eq!(std::fs::read(b.p("a.log")).expect("read on B"), b"one\n");
    let append = |m: &mount_support::Mount, line: &str| {
        let mut f = OpenOptions::new()
            .append(true)
            .open(m.p("a.log"))
            .expect("open O_APPEND");
        f.write_all(line.as_bytes()).expect("append");
    };
    append(&a, "two\n");
    append(&b, "three\n");
    assert_eq!(bytes(&env.rt, &c, BUCKET, "a.log"), b"one\ntwo\nthree\n");
    let mut start = [0u8; 10];
    std::fs::File::open(b.p("a.log"))
        .expect("open on B")
        .read_exact_at(&mut start, 0)
        .expect("pread on B");
    assert_eq!(&start, b"one\ntwo\nth", "B's cached pages");
    append(&b, "four\n");
    assert_eq!(
        bytes(&env.rt, &c, BUCKET, "a.log"),
        b"one\ntwo\nthree\nfour\n"
    );
    assert_eq!(
        std::fs::read(b.p("a.log")).expect("read on B"),
        b"one\ntwo\nthree\nfour\n"
    );
}

/// B's kernel caches an O_APPEND write at the offset it chose; the bytes land at the
/// object's end past another mount's appends, and B's page cache of the file is dropped
/// (soon after the reply), so that a descriptor open on B reads what the object holds.
#[test]
fn the_page_cache_of_an_o_append_write_that_landed_elsewhere_is_dropped() {
    use std::os::unix::fs::FileExt;
    const PAGE: usize = 4096;
    let env = Env::new(BUCKET);
    let a = env.mount(BUCKET, &env.config());
    let b = env.mount(BUCKET, &env.config());
    let c = client(&env.rt, &env.emu().endpoint());
    std::fs::write(a.p("p.log"), vec![b'a'; PAGE]).expect("write on A");
    assert_eq!(
        std::fs::metadata(b.p("p.log")).expect("stat on B").len(),
        PAGE as u64
    );
    let mut on_a = OpenOptions::new()
        .append(true)
        .open(a.p("p.log"))
        .expect("open O_APPEND on A");
    on_a.write_all(&[b'b'; PAGE]).expect("append on A");
    drop(on_a);
    let mut on_b = OpenOptions::new()
        .read(true)
        .append(true)
        .open(b.p("p.log"))
        .expect("open O_APPEND on B");
    on_b.write_all(&[b'c'; PAGE]).expect("append on B");
    on_b.sync_all().expect("fsync on B");
    let mut want = vec![b'a'; PAGE];
    want.extend_from_slice(&[b'b'; PAGE]);
    want.extend_from_slice(&[b'c'; PAGE]);
    assert!(bytes(&env.rt, &c, BUCKET, "p.log") == want, "the object");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut second = vec![0u8; PAGE];
    loop {
        on_b.read_exact_at(&mut second, PAGE as u64)
            .expect("pread on B");
        if second == [b'b'; PAGE] || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        second == [b'b'; PAGE],
        "B's page cache still holds its write at its own offset"
    );
}

/// The close(2) of a file's only descriptor ends its write stream; a dup still open writes
/// on (it takes the object over), in the order the bytes were written. A shell's redirection
/// closes the descriptor it opened before the command writes through its copy.
#[test]
fn a_dup_writes_on_after_the_first_descriptor_closes() {
    use std::os::fd::{AsRawFd, FromRawFd};
    let env = Env::new(BUCKET);
    let m = env.mount(BUCKET, &env.config());
    let c = client(&env.rt, &env.emu().endpoint());
    let mut f = std::fs::File::create(m.p("dup.log")).expect("create");
    // SAFETY: a fresh duplicate, owned from here on by `copy`.
    let mut copy = unsafe { std::fs::File::from_raw_fd(libc::dup(f.as_raw_fd())) };
    f.write_all(b"one\n").expect("write");
    drop(f);
    assert_eq!(
        bytes(&env.rt, &c, BUCKET, "dup.log"),
        b"one\n",
        "close returned before its bytes were in"
    );
    copy.write_all(b"two\n").expect("write through the dup");
    drop(copy);
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg("echo three >> dup.log && echo new > fresh.log")
        .current_dir(m.p(""))
        .status()
        .expect("sh");
    assert!(status.success());
    assert_eq!(bytes(&env.rt, &c, BUCKET, "dup.log"), b"one\ntwo\nthree\n");
    assert_eq!(bytes(&env.rt, &c, BUCKET, "fresh.log"), b"new\n");
    assert_eq!(
        std::fs::read(m.p("dup.log")).expect("read"),
        b"one\ntwo\nthree\n"
    );
}

/// `tail -f` of a log written through the same mount: a descriptor opened before the writes
/// reads each line as it lands. The kernel knows the file's new size from the writes and asks
/// that descriptor's handle for the bytes; a short answer left NUL bytes in their place.
#[test]
fn a_reader_opened_before_the_appends_reads_each_line_and_no_zeros() {
    use std::io::Read;
    let env = Env::new(BUCKET);
    let m = env.mount(BUCKET, &env.config());
    let mut log = std::fs::File::create(m.p("train.log")).expect("create");
    let mut tail = std::fs::File::open(m.p("train.log")).expect("open to read");
    let (mut written, mut seen) = (Vec::new(), Vec::new());
    for i in 0..20 {
        let line = format!("step {i} loss 0.{i:03}\n");
        log.write_all(line.as_bytes()).expect("append");
        written.extend_from_slice(line.as_bytes());
        let mut got = Vec::new();
        tail.read_to_end(&mut got).expect("read on");
        assert_eq!(
            String::from_utf8_lossy(&got),
            line,
            "the line just appended, alone"
        );
        seen.extend_from_slice(&got);
    }
    drop(log);
    assert_eq!(seen, written);
    assert_eq!(std::fs::read(m.p("train.log")).expect("reread"), written);
}

/// `cmd > train.log` run again while a `tail -f` of the last run's log is open: the tail,
/// which reads the shrunk file from its start, reads the new run's lines, as on a local disk,
/// not the old run's bytes at the new run's size.
#[test]
fn a_reader_opened_before_an_overwrite_reads_the_new_lines() {
    use std::io::{Read, Seek};
    let env = Env::new(BUCKET);
    let m = env.mount(BUCKET, &env.config());
    std::fs::write(m.p("run.log"), "old 0\nold 1\nold 2\nold 3\n").expect("first run");
    let mut tail = std::fs::File::open(m.p("run.log")).expect("open to read");
    let mut got = String::new();
    tail.read_to_string(&mut got).expect("read the first run");
    let mut log = std::fs::File::create(m.p("run.log")).expect("second run");
    log.write_all(b"new 0\nnew 1\n").expect("write");
    tail.rewind().expect("seek to the start");
    got.clear();
    tail.read_to_string(&mut got).expect("read the second run");
    assert_eq!(got, "new 0\nnew 1\n", "while the second run writes");
    log.write_all(b"new 2\n").expect("write");
    drop(log);
    tail.rewind().expect("seek to the start");
    got.clear();
    tail.read_to_string(&mut got).expect("read the second run");
    assert_eq!(got, "new 0\nnew 1\nnew 2\n", "once it closed");
}

/// Forks a child that runs `child` (async-signal-safe calls only) and exits: its pid.
fn fork_then(child: impl FnOnce()) -> libc::pid_t {
    // SAFETY: the child runs only what its caller vouches is async-signal-safe, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        child();
        // SAFETY: ends the forked child without running the parent's exit handlers.
        unsafe { libc::_exit(0) };
    }
    pid
}

/// Waits for the forked child `pid` to exit.
fn waited(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: waits for a child of ours.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
}

/// A forked child's exit closes its copies of the parent's descriptors, and the kernel
/// sends a flush for each: the parent's stream must go on (no takeover for its next write),
/// and every byte land.
#[test]
fn a_child_exiting_leaves_its_parent_s_stream_open() {
    let env = Env::new(BUCKET);
    let m = env.mount(BUCKET, &env.config());
    let c = client(&env.rt, &env.emu().endpoint());
    env.emu().reset_stats();
    let mut f = std::fs::File::create(m.p("parent.log")).expect("create");
    f.write_all(b"one\n").expect("write");
    waited(fork_then(|| {}));
    f.write_all(b"two\n").expect("write after the child's exit");
    drop(f);
    assert_eq!(bytes(&env.rt, &c, BUCKET, "parent.log"), b"one\ntwo\n");
    let st = env.emu().stats();
    assert_eq!(
        st.write_streams, 1,
        "the child's exit ended the stream: {st:?}"
    );
}

#[test]
fn finalize_on_close_leaves_finalized_objects() {
    let env = Env::new(BUCKET);
    let mut cfg = env.config();
    cfg.write.finalize_on_close = true;
    let m = env.mount(BUCKET, &cfg);
    let c = client(&env.rt, &env.emu().endpoint());
    let mut f = std::fs::File::create(m.p("ckpt.pt")).expect("create");
    write_chunks(&mut f, 6, 3, 0);
    drop(f);
    // release (which finalizes) runs after close(2) returns: wait for it a little.
    let start = Instant::now();
    let got = loop {
        let got = meta(&env.rt, &c, BUCKET, "ckpt.pt");
        if got.finalized || start.elapsed() > Duration::from_secs(10) {
            break got;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(got.finalized, "finalized after the last close");
    assert_eq!(got.size, 3 * MIB as u64);
    assert_eq!(got.crc32c, Some(crc_of(6, 3)));
}

/// Runs `cmd` through `sh -c`, failing the test with its output when it fails.
fn sh(cmd: &str) -> String {
    let out = std::process::Command::new("sh")
        .args(["-c", cmd])
        .output()
        .expect("sh runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    assert!(
        out.status.success(),
        "{cmd}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn mtime_secs(path: &std::path::Path) -> i64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .mtime()
}

/// The copies users make onto a mount keep their sources' modification times, on the mount
/// and on the next one: `rsync -a` sets them after the close, `tar -x` and `cp -p` on the
/// open descriptor before it (and `cp -p` then chowns it). A second `rsync -a` then finds
/// every file up to date and sends no bytes.
#[test]
fn copies_keep_their_sources_modification_times() {
    let env = Env::new(BUCKET);
    let cfg = env.config();
    let m = env.mount(BUCKET, &cfg);
    let src = tempfile::tempdir().expect("tempdir");
    let s = src.path().display().to_string();
    sh(&format!(
        "mkdir -p {s}/d && head -c 3000 /dev/urandom > {s}/d/a && echo b > {s}/b && \
         touch -d '2020-01-02 03:04:05' {s}/d/a && touch -d '2011-11-11 11:11:11' {s}/b"
    ));
    let mnt = m.p("").display().to_string();
    sh(&format!("rsync -a {s}/ {mnt}/rs/"));
    sh(&format!(
        "mkdir {mnt}/tar && tar -C {s} -cf - . | tar -C {mnt}/tar -xf -"
    ));
    sh(&format!("cp -p {s}/d/a {mnt}/cp"));
    let want_a = mtime_secs(&src.path().join("d/a"));
    let want_b = mtime_secs(&src.path().join("b"));
    let check = |root: &std::path::Path, when: &str| {
        for (rel, want) in [
            ("rs/d/a", want_a),
            ("rs/b", want_b),
            ("tar/d/a", want_a),
            ("tar/b", want_b),
            ("cp", want_a),
        ] {
            assert_eq!(mtime_secs(&root.join(rel)), want, "{rel} {when}");
        }
    };
    check(&m.p(""), "on the mount that wrote them");
    let other = env.mount(BUCKET, &cfg);
    check(&other.p(""), "on another mount");
    let again = sh(&format!("rsync -ai {s}/ {mnt}/rs/"));
    assert!(
        !again.lines().any(|l| l.starts_with(">f")),
        "rsync sent files again:\n{again}"
    );
}

#[test]
fn a_read_only_mount_refuses_every_write_with_erofs() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "a", b"data");
    let mut cfg = env.config();
    cfg.fs.read_only = true;
    let m = env.mount(BUCKET, &cfg);
    assert_eq!(errno_of(std::fs::File::create(m.p("new"))), libc::EROFS);
    assert_eq!(
        errno_of(OpenOptions::new().append(true).open(m.p("a"))),
        libc::EROFS
    );
    assert_eq!(
        errno_of(OpenOptions::new().write(true).open(m.p("a"))),
        libc::EROFS
    );
    assert_eq!(errno_of(std::fs::write(m.p("a"), b"x")), libc::EROFS);
    assert_eq!(std::fs::read(m.p("a")).expect("reads still work"), b"data");
}

#[test]
fn another_mount_sees_every_fsynced_byte() {
    let env = Env::new(BUCKET);
    let a = env.mount(BUCKET, &env.config());
    let b = env.mount(BUCKET, &env.config());
    let mut f = std::fs::File::create(a.p("stream.log")).expect("create");
    write_chunks(&mut f, 7, 4, 0);
    f.sync_all().expect("fsync");
    assert!(
        std::fs::read(b.p("stream.log")).expect("read on B") == chunks(7, 4),
        "B reads everything A fsynced, while A keeps the file open"
    );
    drop(f);
}

/// A checkpoint another mount replaces (a temporary file renamed over it, as `torch.save`
/// savers do) while this mount still knows its old version (stat and entry TTLs of 60 s):
/// an open of the name reads the old version, which is gone, and fails with ESTALE; the
/// name is then found anew, so a retry moments later reads the new version. It failed for
/// the whole TTL before (1,175 failures over 60 s on a rig).
#[test]
fn a_reader_on_another_mount_finds_a_replaced_checkpoint_after_one_failure() {
    use std::time::{Duration, Instant};
    let env = Env::new(BUCKET);
    let a = env.mount(BUCKET, &env.config());
    let b = env.mount(BUCKET, &env.config());
    std::fs::write(a.p("latest.pt"), chunk(1, 0)).expect("write v1");
    assert_eq!(
        std::fs::metadata(b.p("latest.pt"))
            .expect("B sees v1")
            .len(),
        MIB as u64
    );
    std::fs::write(a.p("latest.pt.tmp"), chunks(2, 2)).expect("write v2");
    std::fs::rename(a.p("latest.pt.tmp"), a.p("latest.pt")).expect("replace");
    let start = Instant::now();
    let mut failures = 0;
    let got = loop {
        match std::fs::read(b.p("latest.pt")) {
            Ok(got) => break got,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
                failures += 1;
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "still ESTALE after {failures} tries"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    assert!(
        failures >= 1,
        "B never opened the version it knew, which is gone"
    );
    assert!(got == chunks(2, 2), "B reads the new version whole");
}

/// A reader on another mount that keeps its descriptor open (TensorBoard on another machine
/// polling the event files a training job appends) reads what was appended once a stat has
/// shown it the larger size; its handle answered an empty read for those bytes.
#[test]
fn a_reader_on_another_mount_reads_on_what_was_appended_after_it_opened() {
    use std::io::Read;
    let env = Env::new(BUCKET);
    let a = env.mount(BUCKET, &env.config());
    let mut fresh = env.config();
    fresh.fs.stat_ttl_ms = 0;
    fresh.fs.kernel_attr_ttl_ms = 0;
    let b = env.mount(BUCKET, &fresh);
    let mut f = std::fs::File::create(a.p("events.log")).expect("create");
    f.write_all(b"first\n").expect("write");
    f.sync_all().expect("fsync");
    let mut reader = std::fs::File::open(b.p("events.log")).expect("open on B");
    let mut got = String::new();
    reader.read_to_string(&mut got).expect("read on B");
    assert_eq!(got, "first\n");
    f.write_all(b"second\n").expect("write");
    f.sync_all().expect("fsync");
    let grown = std::fs::metadata(b.p("events.log"))
        .expect("stat on B")
        .len();
    assert_eq!(grown, 13, "B sees the new size");
    got.clear();
    reader.read_to_string(&mut got).expect("read on");
    assert_eq!(got, "second\n", "B reads on from where it was");
}

#[test]
fn an_idle_writer_cannot_starve_the_others_of_write_budget() {
    let env = Env::new(BUCKET);
    let mut cfg = env.config();
    // 16 MiB in all, so the write share is its 4 MiB floor.
    cfg.cache.memory_mb = 16;
    let m = env.mount(BUCKET, &cfg);
    let c = client(&env.rt, &env.emu().endpoint());
    let mut idle = std::fs::File::create(m.p("idle.bin")).expect("create");
    write_chunks(&mut idle, 10, 4, 0);
    // `idle` now holds the whole write budget in unpersisted bytes, and stays open.
    // The busy writer is a child process: if it starved, it can be killed out of its
    // write(2) (a thread of this process stuck on this process's mount could not be).
    let mut dd = std::process::Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", m.p("busy.bin").display()))
        .args(["bs=1M", "count=16", "status=none"])
        .spawn()
        .expect("dd runs");
    let start = Instant::now();
    let status = loop {
        if let Some(st) = dd.try_wait().expect("wait") {
            break Some(st);
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = dd.kill();
            let _ = dd.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let status = status.expect("the busy writer finishes while the idle one holds its file open");
    assert!(status.success(), "dd: {status}");
    let zeros = vec![0u8; 16 * MIB];
    assert_eq!(
        meta(&env.rt, &c, BUCKET, "busy.bin").crc32c,
        Some(crc32c::crc32c(&zeros))
    );
    assert_eq!(
        meta(&env.rt, &c, BUCKET, "idle.bin").size,
        4 * MIB as u64,
        "the idle writer's bytes were made durable to free the budget"
    );
    drop(idle);
}

/// A forked child's exit during an overwrite (`torch.save` over last.pt while the process
/// starts a subprocess) flushes the new version beside the file, but does not put it in
/// place half-written: the file keeps its old version until the parent's close.
#[test]
fn a_child_exiting_during_an_overwrite_leaves_the_old_version_to_the_parent_s_close() {
    let env = Env::new(BUCKET);
    let old = b"the old version".to_vec();
    env.put(BUCKET, "last.pt", &old);
    let m = env.mount(BUCKET, &env.config());
    let c = client(&env.rt, &env.emu().endpoint());
    let mut f = std::fs::File::create(m.p("last.pt")).expect("open over it");
    f.write_all(&chunks(7, 2)).expect("write");
    waited(fork_then(|| {}));
    assert_eq!(
        bytes(&env.rt, &c, BUCKET, "last.pt"),
        old,
        "the child's exit published the new version half-written"
    );
    f.write_all(&chunk(7, 2))
        .expect("write after the child's exit");
    drop(f);
    assert!(bytes(&env.rt, &c, BUCKET, "last.pt") == chunks(7, 3));
}

/// `subprocess.Popen(cmd, stdout=open(path, "wb"))` over an existing file: the opener closes
/// its descriptor before the child writes, so the child's exit is answered as an fsync, which
/// puts the new version in place before the parent's wait returns.
#[test]
fn a_child_left_the_writing_by_its_opener_places_the_new_version_at_its_exit() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "out.txt", b"the old version");
    let m = env.mount(BUCKET, &env.config());
    let c = client(&env.rt, &env.emu().endpoint());
    let f = std::fs::File::create(m.p("out.txt")).expect("open over it");
    let mut go = [0 as libc::c_int; 2];
    // SAFETY: creates a pipe into an array of two descriptors.
    assert_eq!(unsafe { libc::pipe(go.as_mut_ptr()) }, 0);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    let new = b"written by the child";
    let child = fork_then(|| {
        let mut byte = 0u8;
        // SAFETY: read and write are async-signal-safe; the buffers are ours.
        unsafe {
            libc::read(go[0], (&mut byte as *mut u8).cast(), 1);
            libc::write(fd, new.as_ptr().cast(), new.len());
        }
    });
    drop(f);
    // SAFETY: writes one byte to the pipe just made.
    assert_eq!(unsafe { libc::write(go[1], b"g".as_ptr().cast(), 1) }, 1);
    waited(child);
    assert_eq!(bytes(&env.rt, &c, BUCKET, "out.txt"), new);
    // SAFETY: closes the pipe's descriptors, ours.
    unsafe {
        libc::close(go[0]);
        libc::close(go[1]);
    }
}

/// A shell's `{ ...; } > file` over an existing file: the shell closes the descriptor it
/// opened once it has a copy on its standard output, then writes through that copy, so a
/// subshell's exit in between is another process's close, which publishes nothing. (The
/// signals to the test go through subshells: a redirection of the shell's own standard
/// output saves and restores it with a dup whose close is the shell's close.)
#[test]
fn a_subshell_s_exit_in_a_redirected_block_leaves_the_old_version_to_the_block_s_end() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "out.txt", b"the old version");
    let m = env.mount(BUCKET, &env.config());
    let c = client(&env.rt, &env.emu().endpoint());
    let fifos = tempfile::tempdir().expect("tempdir");
    let (ready, go) = (fifos.path().join("ready"), fifos.path().join("go"));
    for p in [&ready, &go] {
        let path = std::ffi::CString::new(p.to_str().expect("utf-8")).expect("path");
        // SAFETY: makes a FIFO at a path of our temporary directory.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    }
    let script = format!(
        "{{ printf one; (exit 0); (echo > {r}); (read x < {g}); printf two; }} > {out}",
        r = ready.display(),
        g = go.display(),
        out = m.p("out.txt").display()
    );
    /// The shell, killed if the test fails while it waits on a FIFO.
    struct Shell(std::process::Child);
    impl Drop for Shell {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut sh = Shell(
        std::process::Command::new("bash")
            .arg("-c")
            .arg(&script)
            .spawn()
            .expect("bash"),
    );
    std::fs::read(&ready).expect("the subshell has exited");
    assert_eq!(
        bytes(&env.rt, &c, BUCKET, "out.txt"),
        b"the old version",
        "the subshell's exit published the block's output half-written"
    );
    std::fs::write(&go, b"\n").expect("go on");
    assert!(sh.0.wait().expect("bash").success());
    assert_eq!(bytes(&env.rt, &c, BUCKET, "out.txt"), b"onetwo");
}

/// A shell loop redirected to a file hands the shell's copy of the descriptor from command
/// to command: each command's exit puts its bytes in the bucket but leaves the stream open
/// for the next, so the loop costs one stream, not one takeover per command.
#[test]
fn a_redirected_shell_loop_writes_through_one_stream() {
    let env = Env::new(BUCKET);
    let m = env.mount(BUCKET, &env.config());
    let c = client(&env.rt, &env.emu().endpoint());
    env.emu().reset_stats();
    let script = format!(
        "for i in 1 2 3 4; do /bin/echo line $i; done > {}",
        m.p("loop.log").display()
    );
    let ok = std::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .status()
        .expect("bash");
    assert!(ok.success());
    assert_eq!(
        bytes(&env.rt, &c, BUCKET, "loop.log"),
        b"line 1\nline 2\nline 3\nline 4\n"
    );
    let st = env.emu().stats();
    assert_eq!(
        st.write_streams, 1,
        "a command's exit ended the stream: {st:?}"
    );
}
