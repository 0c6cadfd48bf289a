//! `rapidfs gke-sidecar` under the GKE Cloud Storage FUSE CSI driver's protocol. The test
//! plays the node server as root: for each volume it opens /dev/fuse, mounts it on a
//! temporary directory with the node server's options, listens on
//! `<tmp>/.volumes/<volume>/socket` and sends the volume's JSON with the descriptor. The
//! sidecar runs as uid 65534 with no capabilities and /dev/fuse out of its reach, against the
//! in-process emulator: one process serves every volume with its own owner, modes and
//! `only-dir`; a missing bucket and a bad option fill only their volume's error file; SIGTERM
//! ends a native sidecar, and the exit file a regular one (which SIGTERM only makes flush),
//! each with exit 0 and the bytes of a still-open file in the bucket.

mod mount_support;
mod node_support;
mod write_support;

use mount_support::{data, sha, Env};
use node_support::{
    check_unprivileged, no_access_file, node_mount, send_fd, shared_dir, unprivileged, NodeMount,
    NOBODY,
};
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};
use write_support::{bytes, chunks, client, MIB};

/// How long the sidecar may take to serve its volumes or to stop.
const PATIENCE: Duration = Duration::from_secs(30);

/// A volume as the node server lays it out: its directory under `.volumes`, and the mount
/// whose descriptor it offers.
struct NodeVolume {
    dir: PathBuf,
    mnt: tempfile::TempDir,
    fuse: NodeMount,
    sender: Option<std::thread::JoinHandle<()>>,
}

impl NodeVolume {
    /// Mounts /dev/fuse for root (as the node server does), listens on the volume's socket,
    /// and sends `json` with the descriptor to the first client.
    fn offer(tmp: &Path, name: &str, json: &str) -> NodeVolume {
        let dir = tmp.join(".volumes").join(name);
        std::fs::create_dir_all(&dir).expect("volume dir");
        for d in [dir.as_path(), tmp.join(".volumes").as_path()] {
            std::os::unix::fs::chown(d, Some(NOBODY), Some(NOBODY)).expect("chown");
        }
        let mnt = tempfile::tempdir().expect("tempdir");
        let fuse = node_mount(mnt.path(), 0);
        let socket = dir.join("socket");
        let listener = UnixListener::bind(&socket).expect("listen");
        std::os::unix::fs::chown(&socket, Some(NOBODY), Some(NOBODY)).expect("chown");
        let raw = fuse.raw_fd();
        let json = json.as_bytes().to_vec();
        let sender = std::thread::spawn(move || send_fd(&listener, raw, &json));
        NodeVolume {
            dir,
            mnt,
            fuse,
            sender: Some(sender),
        }
    }

    /// Once the descriptor went out, the node keeps no copy of it.
    fn handed_over(&mut self) {
        if let Some(s) = self.sender.take() {
            s.join().expect("descriptor sent");
        }
        self.fuse.close_fd();
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.mnt.path().join(rel)
    }

    fn error(&self) -> String {
        std::fs::read_to_string(self.dir.join("error")).unwrap_or_default()
    }
}

/// The sidecar's surroundings: its emptyDirs, the /dev/fuse blocker, and its stdout log.
struct Pod {
    tmp: tempfile::TempDir,
    buffer: tempfile::TempDir,
    blocker: PathBuf,
    log: PathBuf,
}

impl Pod {
    fn new() -> Pod {
        let tmp = shared_dir();
        let buffer = shared_dir();
        std::os::unix::fs::chown(buffer.path(), Some(NOBODY), Some(NOBODY)).expect("chown");
        let blocker = no_access_file(tmp.path());
        let log = tmp.path().join("sidecar.log");
        Pod {
            tmp,
            buffer,
            blocker,
            log,
        }
    }

    /// Starts `rapidfs gke-sidecar --v=5` as the webhook would, unprivileged.
    fn start(&self, endpoint: &str, native: bool) -> Child {
        let stdout = std::fs::File::create(&self.log).expect("log file");
        let mut cmd = unprivileged(&self.blocker, None);
        cmd.args(["gke-sidecar", "--v=5", "--endpoint", endpoint])
            .env("RAPIDFS_GKE_TMP", self.tmp.path())
            .env("RAPIDFS_GKE_BUFFER", self.buffer.path())
            .env_remove("RUST_LOG")
            .stdout(stdout);
        if native {
            cmd.env("NATIVE_SIDECAR", "TRUE");
        } else {
            cmd.env_remove("NATIVE_SIDECAR");
        }
        cmd.spawn().expect("the sidecar starts")
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log says `served` volumes are served (stopping the sidecar and
    /// failing if it does not get there).
    fn wait_serving(&self, child: &mut Child, served: usize) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let log = self.log_text();
            if log.lines().any(|l| l.contains("waiting for SIGTERM")) {
                let n = log.lines().filter(|l| l.contains("\"serving\"")).count();
                if n == served {
                    return;
                }
                stop(child);
                panic!("{n} volumes served, not {served}: {log}");
            }
            if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
                stop(child);
                panic!("the sidecar did not get to serving: {log}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Waits for the sidecar to exit on its own.
fn wait_exit(child: &mut Child) -> ExitStatus {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            stop(child);
            panic!("the sidecar did not exit");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `GET /metrics` over the volume's metrics.sock.
fn scrape(sock: &Path) -> String {
    let mut conn = UnixStream::connect(sock).expect("connect to metrics.sock");
    conn.set_read_timeout(Some(PATIENCE)).expect("timeout");
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .expect("request");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).expect("response");
    answer
}

/// Writes `n` MiB to `path` and returns the file still open: bytes the kernel acknowledged
/// that no close or fsync has made durable yet.
fn write_and_keep_open(path: &Path, seed: u64, n: usize) -> std::fs::File {
    let mut f = std::fs::File::create(path).expect("create through the sidecar");
    f.write_all(&chunks(seed, n)).expect("write");
    f
}

#[test]
fn one_sidecar_serves_each_volume_as_its_options_say_and_fails_only_the_broken_ones() {
    let env = Env::new("gke-a");
    env.emu().create_bucket("gke-b").expect("bucket");
    let x = data(7, 3 * MIB + 5);
    env.put("gke-a", "train/x.bin", &x);
    env.put("gke-a", "other/y.bin", b"outside only-dir");
    env.put("gke-b", "b.txt", b"volume b");
    let pod = Pod::new();
    let mut volumes = vec![
        NodeVolume::offer(
            pod.tmp.path(),
            "vol-a",
            r#"{"bucketName":"gke-a","options":["dir-mode=750","file-mode=640","gid=3000","implicit-dirs","only-dir=train","uid=1000"]}"#,
        ),
        NodeVolume::offer(
            pod.tmp.path(),
            "vol-b",
            r#"{"bucketName":"gke-b","options":["file-cache:max-size-mb:0","gid=4000","metadata-cache:ttl-secs:-1","uid=2000"]}"#,
        ),
        NodeVolume::offer(
            pod.tmp.path(),
            "vol-bad-option",
            r#"{"bucketName":"gke-b","options":["no-such-flag"]}"#,
        ),
        NodeVolume::offer(
            pod.tmp.path(),
            "vol-missing",
            r#"{"bucketName":"no-such-bucket","options":["implicit-dirs"]}"#,
        ),
    ];
    let mut child = pod.start(&env.emu().endpoint(), true);
    for v in &mut volumes {
        v.handed_over();
    }
    pod.wait_serving(&mut child, 2);
    check_unprivileged(child.id());
    let [a, b, bad, missing] = &volumes[..] else {
        unreachable!("four volumes")
    };

    let root = std::fs::metadata(a.mnt.path()).expect("stat vol-a");
    assert_eq!(
        (root.uid(), root.gid(), root.mode() & 0o7777),
        (1000, 3000, 0o750)
    );
    let file = std::fs::metadata(a.p("x.bin")).expect("stat x.bin");
    assert_eq!(
        (file.uid(), file.gid(), file.mode() & 0o7777),
        (1000, 3000, 0o640)
    );
    assert!(sha(&std::fs::read(a.p("x.bin")).expect("read")) == sha(&x));
    assert!(
        !a.p("other").exists(),
        "only-dir hides the rest of the bucket"
    );
    let file = std::fs::metadata(b.p("b.txt")).expect("stat b.txt");
    assert_eq!(
        (file.uid(), file.gid(), file.mode() & 0o7777),
        (2000, 4000, 0o644)
    );
    assert_eq!(std::fs::read(b.p("b.txt")).expect("read"), b"volume b");

    assert_eq!(a.error(), "");
    assert_eq!(b.error(), "");
    let e = missing.error();
    assert!(
        e.contains("bucket doesn't exist") && e.contains("no-such-bucket"),
        "{e}"
    );
    let e = bad.error();
    assert!(
        e.contains("Incorrect Usage") && e.contains("unknown flag: --no-such-flag"),
        "{e}"
    );
    for v in &volumes {
        assert!(!v.dir.join("socket").exists(), "the used socket is removed");
    }

    let metrics = scrape(&a.dir.join("metrics.sock"));
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(metrics.contains("rapidfs_fuse_requests_total"), "{metrics}");
    assert!(
        !b.dir.join("metrics.sock").exists(),
        "the process's metrics are served once, not once per volume"
    );

    let open = write_and_keep_open(&b.p("ckpt.bin"), 3, 3);
    // SAFETY: signalling our own child (setpriv execs rapidfs in place).
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = wait_exit(&mut child);
    assert!(status.success(), "exit after SIGTERM: {status}");
    drop(open);
    let c = client(&env.rt, &env.emu().endpoint());
    assert!(
        bytes(&env.rt, &c, "gke-b", "ckpt.bin") == chunks(3, 3),
        "every byte written before SIGTERM is in the bucket"
    );

    let log = pod.log_text();
    for line in log.lines() {
        let parsed: Result<serde_json::Value, _> = serde_json::from_str(line);
        assert!(parsed.is_ok(), "not a JSON log line: {line}");
    }
    assert!(log.contains("option accepted without effect"), "{log}");
}

#[test]
fn a_regular_sidecar_serves_on_after_sigterm_and_ends_at_the_exit_file() {
    let env = Env::new("gke-exit");
    let pod = Pod::new();
    let mut volume = NodeVolume::offer(
        pod.tmp.path(),
        "data",
        r#"{"bucketName":"gke-exit","options":["disable-metrics-for-gke:true"]}"#,
    );
    let mut child = pod.start(&env.emu().endpoint(), false);
    volume.handed_over();
    pod.wait_serving(&mut child, 1);
    assert!(
        !volume.dir.join("metrics.sock").exists(),
        "metrics were turned off"
    );
    let open = write_and_keep_open(&volume.p("out.bin"), 9, 2);
    let c = client(&env.rt, &env.emu().endpoint());
    // A regular sidecar gets SIGTERM with the other containers: it makes their writes
    // durable and serves on until the exit file appears.
    // SAFETY: signalling our own child (setpriv execs rapidfs in place).
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + PATIENCE;
    while !pod.log_text().contains("serving on until the exit file") {
        assert!(
            Instant::now() < deadline,
            "no word of SIGTERM: {}",
            pod.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "still serving"
    );
    assert!(
        bytes(&env.rt, &c, "gke-exit", "out.bin") == chunks(9, 2),
        "the bytes of the open file are durable after SIGTERM"
    );
    std::fs::write(volume.p("after-sigterm.txt"), b"still served").expect("write after SIGTERM");
    let exit_file = pod.tmp.path().join(".volumes/exit");
    std::fs::write(&exit_file, b"").expect("exit file");
    std::os::unix::fs::chown(&exit_file, Some(NOBODY), Some(NOBODY)).expect("chown");
    let status = wait_exit(&mut child);
    assert!(status.success(), "exit after the exit file: {status}");
    drop(open);
    assert!(bytes(&env.rt, &c, "gke-exit", "out.bin") == chunks(9, 2));
    assert_eq!(
        bytes(&env.rt, &c, "gke-exit", "after-sigterm.txt"),
        b"still served"
    );
    assert!(!exit_file.exists(), "the exit file is taken away");
    assert_eq!(volume.error(), "");
}
