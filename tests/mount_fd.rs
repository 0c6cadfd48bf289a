//! The GKE CSI conventions: this test plays the privileged node component. As root it opens
//! /dev/fuse and mounts it on a temporary directory with the mount(2) syscall, then hands the
//! descriptor to rapidfs running as uid 65534 with no capabilities, in a mount namespace
//! where /dev/fuse is an unreadable file: once as `/dev/fd/3`, once over `--fuse-fd-socket`.
//! Files read through the mount must match; SIGTERM must end rapidfs with exit 0 and leave
//! the unmounting to the node component.

mod mount_support;

use mount_support::{data, sha, Env};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const BUCKET: &str = "fdpass";
const NOBODY: u32 = 65534;

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL in path")
}

fn is_mounted(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let p = path.to_string_lossy();
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_ref()))
}

/// The node component's mount: unmounted (lazily) when dropped, so a failing test leaves
/// nothing behind.
struct NodeMount {
    fd: Option<OwnedFd>,
    dir: PathBuf,
}

impl NodeMount {
    fn raw_fd(&self) -> RawFd {
        self.fd.as_ref().map_or(-1, |f| f.as_raw_fd())
    }
}

impl Drop for NodeMount {
    fn drop(&mut self) {
        self.fd.take();
        // SAFETY: a valid path string; the kernel touches nothing else of ours.
        let rc = unsafe { libc::umount2(cstr(&self.dir).as_ptr(), libc::MNT_DETACH) };
        if rc != 0 && !std::thread::panicking() {
            panic!("umount: {}", std::io::Error::last_os_error());
        }
    }
}

/// What the node component does: open /dev/fuse and mount it for uid 65534.
fn node_mount(dir: &Path) -> NodeMount {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .expect("open /dev/fuse as root");
    let fd = OwnedFd::from(dev);
    let data = CString::new(format!(
        "fd={},rootmode=40000,user_id={NOBODY},group_id={NOBODY},allow_other",
        fd.as_raw_fd()
    ))
    .expect("data");
    let src = CString::new("fdpass-test").expect("src");
    let fstype = CString::new("fuse.rapidfs").expect("type");
    let target = cstr(dir);
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    assert_eq!(rc, 0, "mount(2): {}", std::io::Error::last_os_error());
    NodeMount {
        fd: Some(fd),
        dir: dir.to_path_buf(),
    }
}

/// A root-owned file of mode 000: bind-mounted over /dev/fuse in the daemon's namespace.
fn no_access_file(dir: &Path) -> PathBuf {
    let p = dir.join("no-fuse");
    std::fs::write(&p, b"").expect("write");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).expect("chmod");
    p
}

/// rapidfs as the unprivileged sidecar: a private mount namespace where /dev/fuse is
/// `blocker`, uid and gid 65534, no supplementary groups, no capabilities at all. `fd`, when
/// given, is inherited as descriptor 3.
fn sidecar(blocker: &Path, fd: Option<RawFd>, notify: &Path) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        env!("CARGO_BIN_EXE_rapidfs"),
    ]);
    cmd.env("NOTIFY_SOCKET", notify)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    let blocker = cstr(blocker);
    let dev_fuse = CString::new("/dev/fuse").expect("path");
    let root = CString::new("/").expect("path");
    // SAFETY: only async-signal-safe system calls on data prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0
                || libc::mount(
                    std::ptr::null(),
                    root.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                || libc::mount(
                    blocker.as_ptr(),
                    dev_fuse.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = fd {
                // dup2 clears close-on-exec on the copy; to 3 itself, clear it by hand.
                let ok = if fd == 3 {
                    libc::fcntl(3, libc::F_SETFD, 0) == 0
                } else {
                    libc::dup2(fd, 3) == 3
                };
                if !ok {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
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

/// The daemon really is unprivileged: uid 65534, no capabilities, and its /dev/fuse is the
/// unreadable blocker, not the device.
fn check_unprivileged(pid: u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    assert!(
        status
            .lines()
            .any(|l| l == "Uid:\t65534\t65534\t65534\t65534"),
        "{status}"
    );
    assert!(
        status.lines().any(|l| l == "CapEff:\t0000000000000000"),
        "{status}"
    );
    assert!(
        status.lines().any(|l| l == "CapPrm:\t0000000000000000"),
        "{status}"
    );
    let seen = std::fs::metadata(format!("/proc/{pid}/root/dev/fuse")).expect("stat");
    assert!(
        !seen.file_type().is_char_device() && seen.mode() & 0o777 == 0,
        "the sidecar can see the /dev/fuse device: {seen:?}"
    );
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

fn shared_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    d
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
        let fuse = node_mount(mnt.path());
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

/// Sends `fd` with SCM_RIGHTS to the first client of `listener`.
fn send_fd(listener: &UnixListener, fd: RawFd) {
    let (conn, _) = listener.accept().expect("accept");
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = [0u64; 4];
    // SAFETY: plain data; the pointers below outlive sendmsg.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is a size computation.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as _;
    // SAFETY: the control buffer is large enough for one descriptor, as sized above.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        assert_eq!(libc::sendmsg(conn.as_raw_fd(), &msg, 0), 1, "sendmsg");
    }
}

#[test]
fn fuse_fd_socket_serves_a_descriptor_received_over_a_socket() {
    let node = Node::new();
    let sock_path = node.work.path().join("fuse.sock");
    let listener = UnixListener::bind(&sock_path).expect("listen");
    std::fs::set_permissions(&sock_path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let raw = node.fuse.raw_fd();
    let sender = std::thread::spawn(move || send_fd(&listener, raw));
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
