//! The `rapidfs mount` command as users run it: background and foreground mounts, signals,
//! `--emulator DIR`, bad input (one line, non-zero exit, nothing mounted), and the memory
//! bound of the daemon as its own process.

mod mount_support;

use mount_support::{data, is_mounted, sha, Env};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BUCKET: &str = "cli";

fn rapidfs() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rapidfs"))
}

/// `cmd` to be run as user and group 65534 (nobody), with no other groups.
fn nobody(cmd: &str) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", cmd]);
    c
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn unmount(path: &Path) {
    let st = Command::new("umount")
        .arg(path)
        .status()
        .expect("umount runs");
    assert!(st.success(), "umount {}", path.display());
}

/// Runs with a deadline; the command must fail with exactly one line on stderr.
fn fails_with_one_line(cmd: &mut Command, mnt: &Path, expect: &str) {
    let start = Instant::now();
    let out: Output = cmd.stdin(Stdio::null()).output().expect("rapidfs runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "must fail: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr:?}");
    assert!(stderr.starts_with("rapidfs: error: "), "{stderr}");
    assert!(
        stderr.contains(expect),
        "{stderr:?} should mention {expect:?}"
    );
    assert!(!is_mounted(mnt), "nothing left mounted");
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "failed fast enough"
    );
}

#[test]
fn bad_input_fails_with_one_clear_line() {
    let env = Env::new(BUCKET);
    let ep = env.emu().endpoint();
    let mnt = tempfile::tempdir().expect("tempdir");

    fails_with_one_line(
        rapidfs()
            .args(["mount", "no-such-bucket"])
            .arg(mnt.path())
            .args(["--endpoint", &ep]),
        mnt.path(),
        "not found",
    );
    fails_with_one_line(
        rapidfs().args([
            "mount",
            BUCKET,
            "/nonexistent/rapidfs-mnt",
            "--endpoint",
            &ep,
        ]),
        mnt.path(),
        "/nonexistent/rapidfs-mnt",
    );
    let full = tempfile::tempdir().expect("tempdir");
    std::fs::write(full.path().join("x"), b"x").expect("write");
    fails_with_one_line(
        rapidfs()
            .args(["mount", BUCKET])
            .arg(full.path())
            .args(["--endpoint", &ep]),
        full.path(),
        "not empty",
    );
    let cfg_dir = tempfile::tempdir().expect("tempdir");
    let bad = cfg_dir.path().join("bad.toml");
    std::fs::write(&bad, "[cache]\nmemory_mib = 12\n").expect("write");
    fails_with_one_line(
        rapidfs()
            .args(["mount", BUCKET])
            .arg(mnt.path())
            .arg("--config")
            .arg(&bad),
        mnt.path(),
        "memory_mib",
    );
    let quick = cfg_dir.path().join("quick.toml");
    std::fs::write(&quick, "[fs]\nmount_timeout_ms = 2000\n").expect("write");
    // Port 1 on loopback: nothing listens there.
    fails_with_one_line(
        rapidfs()
            .args(["mount", BUCKET])
            .arg(mnt.path())
            .args(["--endpoint", "http://127.0.0.1:1", "--config"])
            .arg(&quick),
        mnt.path(),
        "127.0.0.1:1",
    );
    fails_with_one_line(
        rapidfs()
            .args(["mount", BUCKET])
            .arg(mnt.path())
            .arg("--emulator")
            .arg(cfg_dir.path()),
        mnt.path(),
        "not found",
    );
    // Sizes that would overflow once turned into bytes, or that HTTP/2 cannot carry.
    fails_with_one_line(
        rapidfs().args(["mount", BUCKET]).arg(mnt.path()).args([
            "--endpoint",
            &ep,
            "--memory-mb",
            "18446744073709551615",
        ]),
        mnt.path(),
        "cache.memory_mb",
    );
    let window = mnt.path().with_extension("window.toml");
    std::fs::write(&window, "[gcs]\nconnection_window_kb = 2097152\n").expect("config");
    fails_with_one_line(
        rapidfs()
            .args(["mount", BUCKET])
            .arg(mnt.path())
            .args(["--endpoint", &ep, "--config"])
            .arg(&window),
        mnt.path(),
        "gcs.connection_window_kb",
    );
    let _ = std::fs::remove_file(&window);
    // The same checks in the foreground.
    fails_with_one_line(
        rapidfs()
            .args(["mount", "no-such-bucket", "--foreground"])
            .arg(mnt.path())
            .args(["--endpoint", &ep]),
        mnt.path(),
        "not found",
    );
}

#[test]
fn background_mount_returns_once_live_and_unmounts_cleanly() {
    let env = Env::new(BUCKET);
    let payload = data(1, 3 * 1024 * 1024 + 5);
    env.put(BUCKET, "dir/file.bin", &payload);
    let mnt = tempfile::tempdir().expect("tempdir");
    let out = rapidfs()
        .args(["mount", BUCKET])
        .arg(mnt.path())
        .args(["--endpoint", &env.emu().endpoint()])
        .stdin(Stdio::null())
        .output()
        .expect("rapidfs runs");
    assert!(
        out.status.success(),
        "mount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(is_mounted(mnt.path()), "live when the command returns");
    let got = std::fs::read(mnt.path().join("dir/file.bin")).expect("read");
    assert!(sha(&got) == sha(&payload));
    unmount(mnt.path());
    assert!(!is_mounted(mnt.path()));
}

#[test]
fn sigterm_unmounts_a_foreground_mount() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "a", b"hello");
    let mnt = tempfile::tempdir().expect("tempdir");
    let mut child = rapidfs()
        .args(["mount", BUCKET, "--foreground"])
        .arg(mnt.path())
        .args(["--endpoint", &env.emu().endpoint()])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("rapidfs runs");
    wait_until("mounted", || is_mounted(mnt.path()));
    assert_eq!(std::fs::read(mnt.path().join("a")).expect("read"), b"hello");
    // SAFETY: signalling our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().expect("wait");
    assert!(status.success(), "clean exit after SIGTERM: {status}");
    assert!(!is_mounted(mnt.path()));
}

/// The systemd unit is `Type=notify`: a foreground mount must say READY=1 on
/// `$NOTIFY_SOCKET` once the mount is live (not before), and STOPPING=1 on SIGTERM.
#[test]
fn foreground_mount_notifies_systemd_once_live() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "a", b"hello");
    let mnt = tempfile::tempdir().expect("tempdir");
    let sock_dir = tempfile::tempdir().expect("tempdir");
    let sock_path = sock_dir.path().join("notify");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).expect("bind");
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut child = rapidfs()
        .args(["mount", BUCKET, "--foreground"])
        .arg(mnt.path())
        .args(["--endpoint", &env.emu().endpoint()])
        .env("NOTIFY_SOCKET", &sock_path)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("rapidfs runs");
    let mut buf = [0u8; 256];
    let Ok(n) = sock.recv(&mut buf) else {
        // Stop the daemon first, so a failure here cannot leave a mount behind.
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = child.wait();
        panic!("no READY=1 on NOTIFY_SOCKET within 30 s");
    };
    assert_eq!(&buf[..n], b"READY=1\n");
    assert!(
        is_mounted(mnt.path()),
        "READY=1 came before the mount was live"
    );
    assert_eq!(std::fs::read(mnt.path().join("a")).expect("read"), b"hello");
    // SAFETY: signalling our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let n = sock.recv(&mut buf).expect("STOPPING=1");
    assert_eq!(&buf[..n], b"STOPPING=1\n");
    assert!(child.wait().expect("wait").success());
    assert!(!is_mounted(mnt.path()));
}

#[test]
fn emulator_dir_mount_serves_the_directory() {
    let root = tempfile::tempdir().expect("tempdir");
    let bucket_dir = root.path().join("demo");
    std::fs::create_dir_all(bucket_dir.join("images/cats")).expect("mkdir");
    let cat = data(2, 200_000);
    std::fs::write(bucket_dir.join("images/cats/1.jpg"), &cat).expect("write");
    std::fs::write(bucket_dir.join("README.txt"), b"demo").expect("write");
    let mnt = tempfile::tempdir().expect("tempdir");
    let out = rapidfs()
        .args(["mount", "demo"])
        .arg(mnt.path())
        .arg("--emulator")
        .arg(root.path())
        .stdin(Stdio::null())
        .output()
        .expect("rapidfs runs");
    assert!(
        out.status.success(),
        "mount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(mnt.path().join("README.txt")).expect("read"),
        b"demo"
    );
    assert!(std::fs::read(mnt.path().join("images/cats/1.jpg")).expect("read") == cat);
    unmount(mnt.path());
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
fn sixty_four_readers_stay_within_the_memory_budget() {
    let env = Env::new(BUCKET);
    let files: Vec<Vec<u8>> = (0..64).map(|i| data(500 + i, 8 * 1024 * 1024)).collect();
    for (i, f) in files.iter().enumerate() {
        env.put(BUCKET, &format!("big/{i:02}"), f);
    }
    let mnt = tempfile::tempdir().expect("tempdir");
    let mut child = rapidfs()
        .args(["mount", BUCKET, "--foreground", "--memory-mb", "128"])
        .arg(mnt.path())
        .args(["--endpoint", &env.emu().endpoint()])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("rapidfs runs");
    wait_until("mounted", || is_mounted(mnt.path()));
    std::thread::scope(|s| {
        for (i, want) in files.iter().enumerate() {
            let path = mnt.path().join(format!("big/{i:02}"));
            s.spawn(move || {
                let got = std::fs::read(&path).expect("read");
                assert!(sha(&got) == sha(want), "reader {i}");
            });
        }
    });
    let hwm_mib = vm_hwm_kib(child.id()) / 1024;
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().expect("wait");
    assert!(status.success());
    assert!(
        hwm_mib < 128 + 64,
        "daemon peak RSS {hwm_mib} MiB with a 128 MiB budget"
    );
    eprintln!("daemon VmHWM {hwm_mib} MiB (budget 128 MiB)");
}

#[test]
fn an_ordinary_user_mounts_through_fusermount3() {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata("/dev/fuse")
        .expect("/dev/fuse")
        .permissions()
        .mode();
    assert!(
        mode & 0o006 == 0o006,
        "/dev/fuse is {mode:o}: users cannot mount (tests/setup.sh makes it 0666 as on stock Debian)"
    );
    let env = Env::new(BUCKET);
    env.put(BUCKET, "u.txt", b"user mount");
    let mnt = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::chown(mnt.path(), Some(65534), Some(65534)).expect("chown");
    let mut child = nobody(env!("CARGO_BIN_EXE_rapidfs"))
        .args(["mount", BUCKET, "--foreground"])
        .arg(mnt.path())
        .args(["--endpoint", &env.emu().endpoint()])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("rapidfs runs as nobody");
    wait_until("mounted by nobody", || is_mounted(mnt.path()));
    let out = nobody("cat")
        .arg(mnt.path().join("u.txt"))
        .output()
        .expect("cat runs");
    assert_eq!(
        out.stdout,
        b"user mount",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SAFETY: signalling our own child process (setpriv execs rapidfs in place).
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().expect("wait");
    assert!(status.success(), "clean exit after SIGTERM: {status}");
    assert!(!is_mounted(mnt.path()), "fusermount3 -u ran");
}

/// An ordinary user's mount detached from outside (`fusermount3 -uz`) while a file in it is
/// open, and a new mount made on the same path: when that file closes, the old daemon's
/// session ends and it stops, leaving the new mount alone. It ran `fusermount3 -u` on the
/// path, which unmounted the new one.
#[test]
fn a_daemon_whose_mount_was_detached_leaves_the_next_mount_on_its_path_alone() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "u.txt", b"user mount");
    let mnt = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::chown(mnt.path(), Some(65534), Some(65534)).expect("chown");
    let mount = || {
        let child = nobody(env!("CARGO_BIN_EXE_rapidfs"))
            .args(["mount", BUCKET, "--foreground"])
            .arg(mnt.path())
            .args(["--endpoint", &env.emu().endpoint()])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("rapidfs runs as nobody");
        wait_until("mounted by nobody", || is_mounted(mnt.path()));
        child
    };
    let mut old = mount();
    let file = mnt.path().join("u.txt");
    let mut holder = nobody("bash")
        .args(["-c", "exec 3<\"$1\" && echo open && exec sleep 60", "-"])
        .arg(&file)
        .stdout(Stdio::piped())
        .spawn()
        .expect("a process holding a file open");
    let mut said = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().expect("stdout")),
        &mut said,
    )
    .expect("the holder speaks");
    assert_eq!(said, "open\n");
    let detached = nobody("fusermount3")
        .arg("-uz")
        .arg(mnt.path())
        .status()
        .expect("fusermount3 runs");
    assert!(detached.success());
    wait_until("the old mount detached", || !is_mounted(mnt.path()));
    let mut new = mount();
    holder.kill().expect("kill the holder");
    holder.wait().expect("wait");
    wait_until("the old daemon stopped", || {
        old.try_wait().expect("try_wait").is_some()
    });
    assert!(is_mounted(mnt.path()), "the new mount was unmounted");
    let out = nobody("cat").arg(&file).output().expect("cat runs");
    assert_eq!(out.stdout, b"user mount");
    // SAFETY: signalling our own child process (setpriv execs rapidfs in place).
    assert_eq!(unsafe { libc::kill(new.id() as i32, libc::SIGTERM) }, 0);
    assert!(new.wait().expect("wait").success());
    assert!(!is_mounted(mnt.path()), "the new daemon unmounted its own");
}
