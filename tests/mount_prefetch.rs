//! The control socket and prefetch through real FUSE mounts of the in-process emulator:
//! the socket's protocol (info, stats, bad requests), hinted prefetch that is used and never
//! serves stale or mixed bytes, and the one-round-trip read of a cold small file.

mod mount_support;

use mount_support::{data, Env};
use rapidfs::config::Config;
use rapidfs::control::{ControlServer, Info};
use rapidfs::fs::Fs;
use rapidfs::fuse::{Driver, MountSettings, Mounted};
use rapidfs::gcs::Client;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

const BUCKET: &str = "pf";

/// A live mount with its control socket; both go on drop.
struct Live {
    path: PathBuf,
    control: Option<ControlServer>,
    mounted: Option<Mounted>,
    _dir: tempfile::TempDir,
}

impl Live {
    fn p(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    fn socket(&self) -> PathBuf {
        self.control.as_ref().expect("control").path().to_path_buf()
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(m) = self.mounted.take() {
            let _ = m.unmount();
        }
        self.control.take();
    }
}

fn mount(env: &Env, cfg: &Config) -> Live {
    let dir = tempfile::Builder::new()
        .prefix("rapidfs-pf-")
        .tempdir()
        .expect("tempdir");
    let path = dir.path().canonicalize().expect("canonical");
    let fs = env.rt.block_on(async {
        let client = Client::connect(&cfg.gcs).await.expect("client connects");
        let fs = Fs::new(client, BUCKET, cfg);
        fs.check_bucket().await.expect("bucket answers");
        fs
    });
    let settings = MountSettings {
        fsname: format!("rapidfs:{BUCKET}"),
        read_only: cfg.fs.read_only,
        allow_other: false,
        extra: vec![],
    };
    let mounted = Mounted::start(
        fs.clone(),
        Driver::Workers(env.rt.handle().clone()),
        &path,
        &settings,
    )
    .unwrap_or_else(|e| panic!("FUSE mount on {} failed: {e}", path.display()));
    let info = Info {
        bucket: BUCKET.to_string(),
        endpoint: cfg.gcs.endpoint.clone(),
        prefix: cfg.fs.only_dir.clone().unwrap_or_default(),
        mountpoint: path.clone(),
    };
    let control = {
        let _guard = env.rt.enter();
        ControlServer::start(fs, info).expect("control socket starts")
    };
    Live {
        path,
        control: Some(control),
        mounted: Some(mounted),
        _dir: dir,
    }
}

/// A client connection to a control socket.
struct Ctl {
    w: UnixStream,
    r: BufReader<UnixStream>,
}

impl Ctl {
    fn connect(path: &Path) -> Ctl {
        let w = UnixStream::connect(path).expect("connect to the control socket");
        w.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let r = BufReader::new(w.try_clone().expect("clone"));
        Ctl { w, r }
    }

    fn send_raw(&mut self, line: &str) {
        self.w.write_all(line.as_bytes()).expect("write");
        self.w.write_all(b"\n").expect("write");
    }

    fn line(&mut self) -> Value {
        let mut s = String::new();
        self.r.read_line(&mut s).expect("a reply line in time");
        serde_json::from_str(&s).unwrap_or_else(|e| panic!("reply {s:?} is not JSON: {e}"))
    }

    /// Sends `req` and returns the final reply (after any progress lines).
    fn call(&mut self, req: Value) -> Value {
        self.send_raw(&req.to_string());
        loop {
            let v = self.line();
            if v.get("ok").is_some() || v.get("error").is_some() {
                return v;
            }
        }
    }
}

/// `rapidfs mount BUCKET MNT --foreground --endpoint ... EXTRA...` as its own process, and
/// its control socket once it is there (the mount is live then).
fn spawn_daemon(env: &Env, mnt: &Path, extra: &[&str]) -> (std::process::Child, PathBuf) {
    let daemon = std::process::Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .args(["mount", BUCKET])
        .arg(mnt)
        .args(["--foreground", "--endpoint", &env.emu().endpoint()])
        .args(extra)
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("rapidfs mount starts");
    let sock = rapidfs::control::socket_path(mnt);
    let start = std::time::Instant::now();
    // The control socket may come up before the kernel mount does: a path under `mnt` read
    // in between is the empty directory beneath.
    while !sock.exists() || !mount_support::is_mounted(mnt) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no control socket at {} or no mount",
            sock.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (daemon, sock)
}

#[test]
fn control_socket_answers_info_and_stats_and_rejects_bad_requests() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "a.txt", b"alpha");
    let mut cfg = env.config();
    cfg.fs.read_only = true;
    let m = mount(&env, &cfg);
    let sock = m.socket();
    assert_eq!(sock, rapidfs::control::socket_path(&m.path));
    assert!(!sock.starts_with(&m.path), "outside the mounted tree");
    let mode = std::fs::metadata(&sock)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
    let dir_mode = std::fs::metadata(sock.parent().expect("dir"))
        .expect("dir")
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o777, 0o700, "directory mode {dir_mode:o}");
    let names: Vec<_> = std::fs::read_dir(&m.path)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec!["a.txt"], "nothing added to the namespace");

    let mut c = Ctl::connect(&sock);
    let info = c.call(json!({"op": "info"}));
    assert_eq!(info["ok"], true, "{info}");
    assert_eq!(info["bucket"], BUCKET);
    assert_eq!(info["endpoint"], cfg.gcs.endpoint.as_str());
    assert_eq!(info["prefix"], "");
    assert_eq!(info["mountpoint"], m.path.to_str().expect("utf8"));

    for bad in [
        "{not json",
        "[1,2]",
        "{\"op\":\"fly\"}",
        "{\"op\":\"hint\"}",
        "{\"op\":\"hint\",\"paths\":[1]}",
        "{\"op\":\"hint\",\"paths\":[\"../../etc/passwd\"]}",
        "{\"op\":\"prefetch\",\"paths\":[\"/elsewhere/x\"]}",
        "{\"op\":\"prefetch\",\"paths\":[\"missing.bin\"]}",
        "\u{1}\u{2}",
    ] {
        c.send_raw(bad);
        let v = c.line();
        let msg = v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{bad:?} -> {v}"));
        assert!(!msg.is_empty() && v.get("ok").is_none(), "{bad:?} -> {v}");
    }
    // The connection is still usable after errors.
    let stats = c.call(json!({"op": "stats"}));
    assert_eq!(stats["ok"], true, "{stats}");
    assert!(stats["cache_capacity"].as_u64().expect("capacity") > 0);
    let hint =
        c.call(json!({"op": "hint", "paths": ["a.txt", format!("{}/a.txt", m.path.display())]}));
    assert_eq!(hint["hinted"], 2, "{hint}");
    assert_eq!(std::fs::read(m.p("a.txt")).expect("read"), b"alpha");

    drop(c);
    drop(m);
    assert!(!sock.exists(), "socket removed at unmount");
}

/// Emulator counters for reading `n` cold 128 KiB files: one stream open carrying the range,
/// no second exchange.
#[test]
fn a_cold_small_file_costs_one_stream_and_no_extra_calls() {
    let env = Env::new(BUCKET);
    let n = 20;
    for i in 0..n {
        env.put(BUCKET, &format!("s/f{i:03}"), &data(i, 128 * 1024));
    }
    let mut cfg = env.config();
    cfg.read.prefetch_dir_order = false;
    let m = mount(&env, &cfg);
    // Listing fills the metadata caches; what follows is reads only.
    assert_eq!(std::fs::read_dir(m.p("s")).expect("ls").count(), n as usize);
    env.emu().reset_stats();
    for i in 0..n {
        let got = std::fs::read(m.p(&format!("s/f{i:03}"))).expect("read");
        assert_eq!(got, data(i, 128 * 1024));
    }
    let st = env.emu().stats();
    assert_eq!(st.read_streams, n, "{st:?}");
    assert_eq!(st.calls, n, "one call (the stream) per file: {st:?}");
    assert_eq!(st.ranges_requested, n, "{st:?}");
    assert_eq!(st.bytes_sent, n * 128 * 1024, "{st:?}");
}

/// A hint over class folders nobody has looked up yet costs one listing per folder, no
/// per-file metadata call: the listings that size the prefetches then answer the reader's
/// lookups too, so reading the epoch adds no call but the streams the prefetch already made.
#[test]
fn a_hint_lists_each_folder_once_and_its_listings_answer_the_lookups() {
    let env = Env::new(BUCKET);
    let (folders, per) = (3u64, 20u64);
    let name = |i: u64| format!("h/c{}/img{i:03}.jpg", i % folders);
    for i in 0..folders * per {
        env.put(BUCKET, &name(i), &data(900 + i, 20_000 + i as usize * 100));
    }
    let m = mount(&env, &env.config());
    let mut ctl = Ctl::connect(&m.socket());
    env.emu().reset_stats();
    let order: Vec<u64> = (0..folders * per)
        .map(|k| (k * 7 + 3) % (folders * per))
        .collect();
    let paths: Vec<String> = order.iter().map(|&i| name(i)).collect();
    assert_eq!(ctl.call(json!({"op": "hint", "paths": paths}))["ok"], true);
    let start = std::time::Instant::now();
    loop {
        let st = ctl.call(json!({"op": "stats"}));
        if st["prefetch_fetched"].as_u64() == Some(folders * per) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "prefetch stalled: {st}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let prefetched = env.emu().stats();
    assert_eq!(prefetched.get_object_calls, 0, "{prefetched:?}");
    assert_eq!(prefetched.list_calls, folders, "{prefetched:?}");
    for &i in &order {
        let got = std::fs::read(m.p(&name(i))).expect("read");
        assert!(
            got == data(900 + i, 20_000 + i as usize * 100),
            "{}",
            name(i)
        );
    }
    let st = env.emu().stats();
    assert_eq!(st.get_object_calls, 0, "{st:?}");
    // The root and `h/` are listed for the kernel's lookups of `h` and of each folder.
    assert_eq!(st.list_calls, folders + 2, "{st:?}");
    assert_eq!(st.read_streams, folders * per, "{st:?}");
}

/// A small file read whole keeps no stream open once its last handle is closed: a warm
/// stream would save its next reader nothing, and thousands of idle ones cost both ends CPU.
#[test]
fn a_small_files_stream_closes_with_its_last_handle() {
    let env = Env::new(BUCKET);
    let n = 20;
    for i in 0..n {
        env.put(BUCKET, &format!("closing/f{i:03}"), &data(700 + i, 50_000));
    }
    let mut cfg = env.config();
    cfg.read.prefetch_dir_order = false;
    let m = mount(&env, &cfg);
    for i in 0..n {
        let got = std::fs::read(m.p(&format!("closing/f{i:03}"))).expect("read");
        assert!(got == data(700 + i, 50_000), "f{i:03}");
    }
    let start = std::time::Instant::now();
    loop {
        let st = env.emu().stats();
        assert_eq!(st.read_streams, n, "{st:?}");
        if st.read_streams_ended == n {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "streams left open after every handle closed: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Content of version `v` of file `i`: sizes alternate so some versions share a size (a mix
/// of two same-size versions would go unnoticed by a length check alone).
fn version(i: u64, v: u64) -> Vec<u8> {
    let size = 40 * 1024 + ((i + v) % 2) as usize * 24 * 1024;
    data(i * 1000 + v, size)
}

/// Objects replaced through the emulator while hinted epochs read them: every read returns
/// exactly one version's full content, with the size stat reported, and once the metadata
/// TTL has passed, the newest version. A third of the files never change, so that some
/// prefetched bytes are always served whatever the timing: the first epoch reads after its
/// prefetches settle, and every unchanged file is then read from them.
#[test]
fn hinted_prefetch_never_serves_stale_or_mixed_bytes_while_objects_change() {
    let env = Env::new(BUCKET);
    let files = 48u64;
    let name = |i: u64| format!("e/f{i:03}");
    for i in 0..files {
        env.put(BUCKET, &name(i), &version(i, 0));
    }
    let mut cfg = env.config();
    let ttl = 300;
    cfg.fs.stat_ttl_ms = ttl;
    cfg.fs.list_ttl_ms = ttl;
    cfg.fs.kernel_entry_ttl_ms = ttl;
    cfg.fs.kernel_attr_ttl_ms = ttl;
    cfg.fs.negative_ttl_ms = ttl;
    let m = mount(&env, &cfg);
    let latest: Vec<std::sync::atomic::AtomicU64> = (0..files)
        .map(|_| std::sync::atomic::AtomicU64::new(0))
        .collect();
    // Digests of every version of each file, recorded before that version is stored.
    let written: Vec<std::sync::Mutex<std::collections::HashSet<[u8; 32]>>> = (0..files)
        .map(|i| std::sync::Mutex::new([mount_support::sha(&version(i, 0))].into()))
        .collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut ctl = Ctl::connect(&m.socket());
    let mut stale = 0;
    std::thread::scope(|s| {
        s.spawn(|| {
            // Replace objects, some with a new size, some with the same size; files with
            // i % 3 == 0 stay as they are.
            let mut v = 1;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for i in (1 + v % 2..files).step_by(3) {
                    let bytes = version(i, v);
                    written[i as usize]
                        .lock()
                        .expect("lock")
                        .insert(mount_support::sha(&bytes));
                    env.put(BUCKET, &name(i), &bytes);
                    latest[i as usize].store(v, std::sync::atomic::Ordering::Relaxed);
                }
                v += 1;
                std::thread::sleep(Duration::from_millis(25));
            }
        });
        // However the reads end (a failed assertion too), the replacing thread stops.
        let _stop = StopOnDrop(&stop);
        for epoch in 0..8u64 {
            let order: Vec<u64> = (0..files).map(|k| (k * 7 + epoch * 5) % files).collect();
            let hint = ctl.call(
                json!({"op": "hint", "paths": order.iter().map(|&i| name(i)).collect::<Vec<_>>()}),
            );
            assert_eq!(hint["ok"], true, "{hint}");
            if epoch == 0 {
                settle(&mut ctl);
            }
            for &i in &order {
                use std::io::Read;
                // A version replaced between open and read cannot be fetched any more: the
                // read fails with ESTALE (never other bytes), and an open after the metadata
                // TTL finds the new version.
                let (got, before, after) = (0..40)
                    .find_map(|_| {
                        let mut f = std::fs::File::open(m.p(&name(i))).expect("open");
                        let before = f.metadata().expect("fstat").len();
                        let mut got = Vec::new();
                        match f.read_to_end(&mut got) {
                            Ok(_) => Some((got, before, f.metadata().expect("fstat").len())),
                            Err(e) if e.raw_os_error() == Some(libc::ESTALE) => {
                                stale += 1;
                                std::thread::sleep(Duration::from_millis(50));
                                None
                            }
                            Err(e) => panic!("{}: {e}", name(i)),
                        }
                    })
                    .expect("a read succeeds within 2 s of opens");
                let known = written[i as usize]
                    .lock()
                    .expect("lock")
                    .contains(&mount_support::sha(&got));
                assert!(known, "{}: {} bytes match no version", name(i), got.len());
                if before == after {
                    assert_eq!(got.len() as u64, before, "{}: size stat reported", name(i));
                }
            }
        }
    });
    std::thread::sleep(Duration::from_millis(ttl * 2 + 100));
    for i in 0..files {
        let newest = latest[i as usize].load(std::sync::atomic::Ordering::Relaxed);
        let got = std::fs::read(m.p(&name(i))).expect("read");
        assert!(
            got == version(i, newest),
            "{}: not the newest version after the TTL",
            name(i)
        );
    }
    let stats = ctl.call(json!({"op": "stats"}));
    let unchanged = files.div_ceil(3);
    assert!(
        stats["prefetch_used"].as_u64().expect("used") >= unchanged,
        "{stats}"
    );
    eprintln!("reads that met a replaced version (ESTALE, reopened): {stale}; {stats}");
}

/// Waits until every prefetch issued so far has ended, one way or another.
fn settle(ctl: &mut Ctl) {
    let start = std::time::Instant::now();
    loop {
        let st = ctl.call(json!({"op": "stats"}));
        let n = |k: &str| st[k].as_u64().expect(k);
        let ended = n("prefetch_fetched")
            + n("prefetch_failed")
            + n("prefetch_present")
            + n("prefetch_skipped_large");
        if ended >= n("prefetch_issued") {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "prefetch stalled: {st}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A hinted epoch after the kernel dropped the last epoch's pages (a dataset larger than the
/// page cache; here `posix_fadvise(DONTNEED)` drops them) is prefetched again when the files
/// were opened longer ago than `read.prefetch_page_cache_mb` of opens, and every file loaded
/// is then read from the prefetched bytes. With the default (half the machine's memory) the
/// same files count as held by the page cache and are not loaded again.
#[test]
fn a_later_epoch_prefetches_again_what_the_page_cache_cannot_hold() {
    use std::os::fd::AsRawFd;
    let env = Env::new(BUCKET);
    // Small enough for the kernel to read each whole in one request, so that a read drops
    // it from the block cache and the next epoch's reads find only what is loaded again.
    let (files, size) = (40u64, 100 * 1024);
    let paths: Vec<String> = (0..files).map(|i| format!("pc/f{i:03}")).collect();
    for (i, p) in paths.iter().enumerate() {
        env.put(BUCKET, p, &data(3000 + i as u64, size));
    }
    for (span_mb, loaded_again) in [(1, true), (0, false)] {
        let mut cfg = env.config();
        cfg.read.prefetch_dir_order = false;
        cfg.read.prefetch_page_cache_mb = span_mb;
        let m = mount(&env, &cfg);
        let mut ctl = Ctl::connect(&m.socket());
        let mut issued = Vec::new();
        let mut used = Vec::new();
        for _epoch in 0..2 {
            let hint = ctl.call(json!({"op": "hint", "paths": paths}));
            assert_eq!(hint["ok"], true, "{hint}");
            settle(&mut ctl);
            for (i, p) in paths.iter().enumerate() {
                use std::io::Read;
                let mut f = std::fs::File::open(m.p(p)).expect("open");
                let mut got = Vec::new();
                f.read_to_end(&mut got).expect("read");
                assert!(got == data(3000 + i as u64, size), "{p}");
                // SAFETY: an advice call on an open descriptor.
                let r =
                    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
                assert_eq!(r, 0, "fadvise");
            }
            let st = ctl.call(json!({"op": "stats"}));
            issued.push(st["prefetch_issued"].as_u64().expect("issued"));
            used.push(st["prefetch_used"].as_u64().expect("used"));
        }
        assert_eq!(
            (issued[0], used[0]),
            (files, files),
            "first epoch, span {span_mb} MiB"
        );
        let (again, used_again) = (issued[1] - issued[0], used[1] - used[0]);
        if loaded_again {
            // The files opened more than 1 MiB of opens before the second hint.
            let total = files * size as u64;
            let old = (1..=files)
                .filter(|k| k * (size as u64) < total - (1 << 20))
                .count() as u64;
            assert_eq!(again, old, "span {span_mb} MiB");
            assert_eq!(
                used_again, again,
                "every file loaded again is read from its load"
            );
        } else {
            assert_eq!(
                again, 0,
                "default span: the page cache counts as holding them"
            );
        }
    }
}

/// `rapidfs prefetch DIR` loads a directory tree through the socket: reading it afterwards
/// costs no read stream and no byte from the emulator. A path outside any rapidfs mount is
/// one line of error and a non-zero exit.
#[test]
fn prefetch_command_warms_a_prefix_and_refuses_paths_outside_a_mount() {
    let env = Env::new(BUCKET);
    let mut want = Vec::new();
    for i in 0..30u64 {
        let name = format!("warm/sub{}/f{i:02}", i % 3);
        let bytes = data(500 + i, 10_000 + i as usize * 3000);
        env.put(BUCKET, &name, &bytes);
        want.push((name, bytes));
    }
    let big = data(9, 3 * 1024 * 1024 + 17);
    env.put(BUCKET, "warm/big.bin", &big);
    env.put(BUCKET, "cold/other", b"not loaded");
    let m = mount(&env, &env.config());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .arg("prefetch")
        .arg(m.p("warm"))
        .env_remove(rapidfs::control::SOCKET_ENV)
        .output()
        .expect("rapidfs prefetch runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("prefetched 31 files"), "{stdout}");
    let before = env.emu().stats();
    for (name, bytes) in &want {
        assert_eq!(&std::fs::read(m.p(name)).expect("read"), bytes, "{name}");
    }
    assert_eq!(std::fs::read(m.p("warm/big.bin")).expect("read"), big);
    let after = env.emu().stats();
    assert_eq!(after.read_streams, before.read_streams, "{after:?}");
    assert_eq!(after.bytes_sent, before.bytes_sent, "{after:?}");

    let outside = tempfile::tempdir().expect("tempdir");
    for bad in [outside.path().to_path_buf(), m.p("no/such/file")] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_rapidfs"))
            .arg("prefetch")
            .arg(&bad)
            .output()
            .expect("rapidfs prefetch runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
        assert!(stderr.starts_with("rapidfs: error: "), "{stderr}");
    }
}

/// The Python sampler helper with torch's DataLoader (0, 2 and 4 workers): every index once
/// per epoch, right bytes, hinted files really prefetched and read (a plain sampler gets
/// none), and a missing socket is one warning, not a failure. Needs RAPIDFS_PYTHON (see
/// tests/setup.sh); fails loudly without it.
#[test]
fn python_sampler_helper_hints_each_epoch_and_its_prefetches_are_used() {
    use mount_support::sha;
    let python = std::env::var("RAPIDFS_PYTHON").unwrap_or_else(|_| {
        panic!("RAPIDFS_PYTHON is not set: run `source tests/setup.sh` (tests/run.sh does)")
    });
    let env = Env::new(BUCKET);
    let mut lines = String::new();
    for i in 0..240u64 {
        let set = ["plain", "w0", "w2", "w4"][i as usize % 4];
        let name = format!("ds/{set}/c{}/img{i:04}.jpg", i % 3);
        let bytes = data(7000 + i, 20_000 + ((i * 7919) % 90) as usize * 1024);
        env.put(BUCKET, &name, &bytes);
        let hex: String = sha(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        lines.push_str(&format!("{name} {hex}\n"));
    }
    let mut cfg = env.config();
    cfg.read.prefetch_dir_order = false;
    let m = mount(&env, &cfg);
    let dir = env!("CARGO_MANIFEST_DIR");
    let mut child = std::process::Command::new(python)
        .arg(format!("{dir}/tests/python/sampler_prefetch.py"))
        .env("MNT", &m.path)
        .env("PYTHONPATH", format!("{dir}/python"))
        .env_remove(rapidfs::control::SOCKET_ENV)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(lines.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("ok"),
        "python failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let phase = |name: &str| -> Value {
        stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["phase"] == name)
            .unwrap_or_else(|| panic!("no {name} stats in {stdout}"))
    };
    let (plain, hinted) = (phase("plain"), phase("hinted"));
    assert_eq!(plain["prefetch_issued"], 0, "no hint, no prefetch: {plain}");
    let used = hinted["prefetch_used"].as_u64().expect("used");
    // Three hinted runs of 60 new files each (their second epochs are served by the kernel's
    // page cache); a reader may overtake the prefetcher at the very start of a run.
    assert!(used >= 120, "hinted prefetches used: {hinted}");
    assert_eq!(hinted["prefetch_evicted_unused"], 0, "{hinted}");
    assert_eq!(hinted["prefetch_failed"], 0, "{hinted}");
}

/// Peak resident memory of process `pid`, sampled every 10 ms until `stop` is set, in bytes.
fn sample_rss(pid: u32, stop: &std::sync::atomic::AtomicBool) -> u64 {
    let mut peak = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        peak = peak.max(kb * 1024);
        std::thread::sleep(Duration::from_millis(10));
    }
    peak
}

/// A daemon (`rapidfs mount --foreground`, its own process) with a 64 MiB budget reads a
/// hinted epoch of a dataset four times the budget with two readers: its resident memory
/// stays under the budget plus 64 MiB, the emulator sends under 1.1x the dataset, and the
/// readers mostly find their files prefetched.
#[test]
fn hinted_epoch_over_four_times_the_budget_stays_in_budget_and_fetches_once() {
    const MIB: u64 = 1024 * 1024;
    let budget_mb = 64;
    let env = Env::new(BUCKET);
    let mut sizes = Vec::new();
    let mut total = 0u64;
    let mut i = 0u64;
    while total < 4 * budget_mb * MIB {
        let size = 60_000 + ((i * 7919) % 100) as usize * 1000;
        env.put(BUCKET, &format!("big/f{i:05}"), &data(i, size));
        sizes.push(size);
        total += size as u64;
        i += 1;
    }
    let files = sizes.len() as u64;
    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().canonicalize().expect("canonical");
    let budget = budget_mb.to_string();
    let (mut daemon, sock) = spawn_daemon(&env, &mnt, &["--memory-mb", &budget]);
    let listed = std::fs::read_dir(mnt.join("big")).expect("ls").count() as u64;
    assert_eq!(listed, files);
    env.emu().reset_stats();
    let order: Vec<u64> = (0..files).map(|k| (k * 7919 + 13) % files).collect();
    let mut ctl = Ctl::connect(&sock);
    let paths: Vec<String> = order.iter().map(|i| format!("big/f{i:05}")).collect();
    assert_eq!(ctl.call(json!({"op": "hint", "paths": paths}))["ok"], true);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let peak = std::thread::scope(|s| {
        let sampler = s.spawn(|| sample_rss(daemon.id(), &stop));
        let _stop = StopOnDrop(&stop);
        // Two readers take batches of 16 in turn, as DataLoader workers do.
        let readers: Vec<_> = (0..2)
            .map(|w| {
                let (order, sizes, mnt) = (&order, &sizes, &mnt);
                s.spawn(move || {
                    for batch in order.chunks(16).skip(w).step_by(2) {
                        for &i in batch {
                            let got =
                                std::fs::read(mnt.join(format!("big/f{i:05}"))).expect("read");
                            assert!(got == data(i, sizes[i as usize]), "f{i:05}: wrong bytes");
                        }
                    }
                })
            })
            .collect();
        for r in readers {
            r.join().expect("reader");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        sampler.join().expect("sampler")
    });
    let emu = env.emu().stats();
    let stats = ctl.call(json!({"op": "stats"}));
    drop(ctl);
    let _ = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .status();
    let _ = daemon.wait();
    eprintln!(
        "dataset {} MiB in {files} files, budget {budget_mb} MiB: peak RSS {} MiB, sent {:.3}x, {stats}",
        total / MIB,
        peak / MIB,
        emu.bytes_sent as f64 / total as f64
    );
    assert!(peak > 0, "RSS was sampled");
    assert!(
        peak < (budget_mb + 64) * MIB,
        "peak RSS {} MiB over budget {budget_mb} MiB + 64",
        peak / MIB
    );
    assert!(
        (emu.bytes_sent as f64) < 1.1 * total as f64,
        "fetched {} of a {total}-byte dataset: {emu:?} {stats}",
        emu.bytes_sent
    );
    let used = stats["prefetch_used"].as_u64().expect("used");
    assert!(
        used * 2 > files,
        "most reads found their file prefetched: {stats}"
    );
}

/// Reading a directory's files in listing order (as `cat dir/*` or `tar` do) prefetches the
/// files after them without any hint; a shuffled order does not.
#[test]
fn reading_a_directory_in_listing_order_prefetches_the_next_files() {
    let env = Env::new(BUCKET);
    for i in 0..40u64 {
        env.put(BUCKET, &format!("seq/f{i:03}"), &data(300 + i, 30_000));
        env.put(BUCKET, &format!("shuf/f{i:03}"), &data(400 + i, 30_000));
        env.put(BUCKET, &format!("pairs/f{i:03}"), &data(500 + i, 30_000));
    }
    let m = mount(&env, &env.config());
    let mut ctl = Ctl::connect(&m.socket());
    let mut names: Vec<_> = std::fs::read_dir(m.p("shuf"))
        .expect("ls")
        .map(|e| e.expect("entry").path())
        .collect();
    names.sort();
    let order: Vec<usize> = (0..names.len())
        .map(|k| (k * 17 + 5) % names.len())
        .collect();
    for &k in &order {
        assert_eq!(std::fs::read(&names[k]).expect("read").len(), 30_000);
    }
    // A shuffled epoch puts two neighbours together now and then: that alone starts nothing.
    let pairs: Vec<_> = [(10, 11), (30, 31), (3, 4), (22, 23)]
        .iter()
        .flat_map(|&(a, b)| [a, b])
        .map(|k| m.p(&format!("pairs/f{k:03}")))
        .collect();
    let _ = std::fs::read_dir(m.p("pairs")).expect("ls").count();
    for p in &pairs {
        assert_eq!(std::fs::read(p).expect("read").len(), 30_000);
    }
    let shuffled = ctl.call(json!({"op": "stats"}));
    assert_eq!(shuffled["prefetch_issued"], 0, "{shuffled}");

    let mut names: Vec<_> = std::fs::read_dir(m.p("seq"))
        .expect("ls")
        .map(|e| e.expect("entry").path())
        .collect();
    names.sort();
    for (i, p) in names.iter().enumerate() {
        assert_eq!(
            std::fs::read(p).expect("read"),
            data(300 + i as u64, 30_000)
        );
    }
    let st = ctl.call(json!({"op": "stats"}));
    assert!(
        st["prefetch_dir_order"].as_u64().expect("dir") >= 30,
        "{st}"
    );
    assert!(st["prefetch_used"].as_u64().expect("used") >= 20, "{st}");
}

/// A client that asks for a warm-up and hangs up at once harms nothing: the mount still reads,
/// and the next client's warm-up completes.
#[test]
fn a_client_leaving_mid_prefetch_harms_nothing() {
    let env = Env::new(BUCKET);
    for i in 0..200u64 {
        env.put(BUCKET, &format!("w/f{i:03}"), &data(600 + i, 50_000));
    }
    let m = mount(&env, &env.config());
    for _ in 0..5 {
        let mut c = Ctl::connect(&m.socket());
        c.send_raw(&json!({"op": "prefetch", "paths": ["w"]}).to_string());
        drop(c);
    }
    assert_eq!(
        std::fs::read(m.p("w/f007")).expect("read"),
        data(607, 50_000)
    );
    let mut c = Ctl::connect(&m.socket());
    let done = c.call(json!({"op": "prefetch", "paths": ["w"]}));
    assert_eq!(done["ok"], true, "{done}");
    assert_eq!(done["done"], 200, "{done}");
    assert_eq!(done["failed"], 0, "{done}");
    for i in (0..200u64).step_by(37) {
        assert_eq!(
            std::fs::read(m.p(&format!("w/f{i:03}"))).expect("read"),
            data(600 + i, 50_000)
        );
    }
}

/// `-o profile=aiml-training` (as fstab passes it) turns on the metadata warm-up: the daemon
/// lists every directory into its cache on its own after mounting, while the mount already
/// answers, and a walk after it costs the service no listing call.
#[test]
fn the_training_profile_warms_the_metadata_up_at_mount() {
    let env = Env::new(BUCKET);
    for d in 0..3 {
        for f in 0..20 {
            env.put(BUCKET, &format!("train/c{d}/s{f:03}.jpg"), b"jpeg");
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().canonicalize().expect("canonical");
    let (mut daemon, sock) = spawn_daemon(&env, &mnt, &["-o", "profile=aiml-training"]);
    let start = std::time::Instant::now();
    let mut ctl = Ctl::connect(&sock);
    // The root, train, train/c0..c2.
    let listed = loop {
        let st = ctl.call(json!({"op": "stats"}));
        let listings = st["metadata"]["listings"].as_u64().expect("listings");
        if listings >= 5 || start.elapsed() > Duration::from_secs(20) {
            break listings;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(listed, 5, "every directory listed by the warm-up");
    let lists = env.emu().stats().list_calls;
    let mut files = 0;
    for d in 0..3 {
        for e in std::fs::read_dir(mnt.join(format!("train/c{d}"))).expect("ls") {
            let e = e.expect("entry");
            assert_eq!(e.metadata().expect("stat").len(), 4);
            files += 1;
        }
    }
    assert_eq!(files, 60);
    assert_eq!(
        env.emu().stats().list_calls,
        lists,
        "the walk listed nothing"
    );
    drop(ctl);
    let _ = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .status();
    let _ = daemon.wait();
}
