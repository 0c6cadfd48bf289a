//! The GKE CSI conventions: this test plays the privileged node component. As root it opens
//! /dev/fuse and mounts it on a temporary directory with the mount(2) syscall, then hands the
//! descriptor to rapidfs running as uid 65534 with no capabilities, in a mount namespace
//! where /dev/fuse is an unreadable file: once as `/dev/fd/3`, once over `--fuse-fd-socket`.
//! Files read through the mount must match; SIGTERM must end rapidfs with exit 0 and leave
//! the unmounting to the node component.

mod mount_support;
mod node_support;

use mount_support::{data, sha, Env};
use node_support::{
    check_unprivileged, is_mounted, no_access_file, node_mount, send_fd, shared_dir, unprivileged,
    NodeMount, NOBODY,
};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

const BUCKET: &str = "fdpass";

/// rapidfs as the unprivileged sidecar, told where to report readiness.
fn sidecar(blocker: &Path, fd: Option<RawFd>, notify: &Path) -> Command {
    let mut cmd = unprivileged(blocker, fd);
    cmd.env("NOTIFY_SOCKET", notify);
    cmd
}

/// A NOTIFY_SOCKET the unprivileged daemon may send to.
fn notify_socket(dir: &Path) -> (UnixDatagram, PathBuf) {
    let path = dir.join("notify");
    let sock = UnixDatagram::bind(&path).expect("bind notify socket");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    (sock, path)
}

/// Waits for READY=1; on failure stops the daemon first so nothing hangs.
fn wait_ready(sock: &UnixDatagram, child: &mut Child) {
    let mut buf = [0u8; 64];
    match sock.recv(&mut buf) {
        Ok(n) if &buf[..n] == b"READY=1\n" => {}
        other => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("no READY=1 from the sidecar: {other:?}");
        }
    }
}

/// The files read through the mount match, then SIGTERM ends the daemon with exit 0 while
/// the mount stays for the node component to remove.
fn serve_and_stop(mnt: &Path, files: &[(String, Vec<u8>)], mut child: Child) {
    for (name, want) in files {
        let got = std::fs::read(mnt.join(name)).expect("read through the passed descriptor");
        assert!(sha(&got) == sha(want), "{name} differs");
    }
    let listed = std::fs::read_dir(mnt.join("dir")).expect("readdir").count();
    assert_eq!(listed, files.len() - 1);
    // SAFETY: signalling our own child (setpriv execs rapidfs in place).
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().expect("wait");
    assert!(status.success(), "exit after SIGTERM: {status}");
    assert!(is_mounted(mnt), "the sidecar must not unmount (it may not)");
}

fn put_files(env: &Env) -> Vec<(String, Vec<u8>)> {
    let files: Vec<(String, Vec<u8>)> = vec![
        ("top.bin".to_string(), data(1, 3 * 1024 * 1024 + 11)),
        ("dir/a.txt".to_string(), b"hello from the sidecar".to_vec()),
        ("dir/b.bin".to_string(), data(2, 200_000)),
    ];
    for (n, d) in &files {
        env.put(BUCKET, n, d);
    }
    files
}

#[test]
fn the_binary_runs_as_uid_65534() {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_rapidfs"))
        .arg("--version")
        .output()
        .expect("setpriv runs");
    assert!(
        out.status.success(),
        "uid 65534 cannot run {} (every directory on its path must be searchable): {}",
        env!("CARGO_BIN_EXE_rapidfs"),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One node and its sidecar's surroundings: the bucket with its files, the node component's
/// mount, and a directory uid 65534 can reach holding the /dev/fuse blocker and the
/// sd_notify socket.
struct Node {
    env: Env,
    files: Vec<(String, Vec<u8>)>,
    mnt: tempfile::TempDir,
    work: tempfile::TempDir,
    blocker: PathBuf,
    notify: UnixDatagram,
    notify_path: PathBuf,
    fuse: NodeMount,
}

impl Node {
    fn new() -> Node {
        let env = Env::new(BUCKET);
        let files = put_files(&env);
        let mnt = tempfile::tempdir().expect("tempdir");
        let work = shared_dir();
        let blocker = no_access_file(work.path());
        let (notify, notify_path) = notify_socket(work.path());
        let fuse = node_mount(mnt.path(), NOBODY);
        Node {
            env,
            files,
            mnt,
            work,
            blocker,
            notify,
            notify_path,
            fuse,
        }
    }

    /// Reads every file through the sidecar's mount, stops the sidecar, and unmounts as the
    /// node component does.
    fn serve_and_unmount(self, child: Child) {
        serve_and_stop(self.mnt.path(), &self.files, child);
        drop(self.fuse);
        assert!(!is_mounted(self.mnt.path()));
    }
}

#[test]
fn dev_fd_n_serves_a_descriptor_mounted_by_root() {
    let node = Node::new();
    let mut child = sidecar(&node.blocker, Some(node.fuse.raw_fd()), &node.notify_path)
        .args(["mount", BUCKET, "/dev/fd/3", "--foreground", "--endpoint"])
        .arg(node.env.emu().endpoint())
        .spawn()
        .expect("sidecar starts");
    wait_ready(&node.notify, &mut child);
    check_unprivileged(child.id());
    node.serve_and_unmount(child);
}

#[test]
fn fuse_fd_socket_serves_a_descriptor_received_over_a_socket() {
    let node = Node::new();
    let sock_path = node.work.path().join("fuse.sock");
    let listener = UnixListener::bind(&sock_path).expect("listen");
    std::fs::set_permissions(&sock_path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let raw = node.fuse.raw_fd();
    // The GKE node server's message: JSON sent with the descriptor, read whole by rapidfs.
    let message = br#"{"bucketName":"fdpass","options":["implicit-dirs","uid=65534"]}"#;
    let sender = std::thread::spawn(move || send_fd(&listener, raw, message));
    let mut child = sidecar(&node.blocker, None, &node.notify_path)
        .args(["mount", BUCKET, "--fuse-fd-socket"])
        .arg(&sock_path)
        .args(["--foreground", "--endpoint"])
        .arg(node.env.emu().endpoint())
        .spawn()
        .expect("sidecar starts");
    sender.join().expect("descriptor sent");
    wait_ready(&node.notify, &mut child);
    check_unprivileged(child.id());
    let fds: Vec<PathBuf> = std::fs::read_dir(format!("/proc/{}/fd", child.id()))
        .expect("fds")
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .collect();
    assert!(
        fds.iter().any(|l| l == Path::new("/dev/fuse")),
        "the sidecar holds the received /dev/fuse: {fds:?}"
    );
    node.serve_and_unmount(child);
}

#[test]
fn a_descriptor_that_is_not_dev_fuse_is_refused() {
    let file = tempfile::tempfile().expect("tempfile");
    // SAFETY: a fresh duplicate owned by this function.
    let dup = unsafe { OwnedFd::from_raw_fd(libc::dup(file.as_raw_fd())) };
    let out = Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .args(["mount", BUCKET])
        .arg(format!("/dev/fd/{}", dup.as_raw_fd()))
        .args(["--endpoint", "http://127.0.0.1:1"])
        .output()
        .expect("rapidfs runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("not a /dev/fuse descriptor"), "{stderr}");
    let out = Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .args([
            "mount",
            BUCKET,
            "--fuse-fd-socket",
            "/nonexistent/rapidfs.sock",
        ])
        .output()
        .expect("rapidfs runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("/nonexistent/rapidfs.sock"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
}
