//! The GKE CSI node component, played by a test running as root: it opens /dev/fuse, mounts
//! it with mount(2) as the node server does, and hands the descriptor to rapidfs running as
//! uid 65534 with no capabilities, in a mount namespace where /dev/fuse is unreadable.
#![allow(dead_code)]

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The uid and gid of the unprivileged sidecar.
pub const NOBODY: u32 = 65534;

pub fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL in path")
}

pub fn is_mounted(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let p = path.to_string_lossy();
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_ref()))
}

/// The node component's mount: unmounted (lazily) when dropped, so a failing test leaves
/// nothing behind.
pub struct NodeMount {
    fd: Option<OwnedFd>,
    dir: PathBuf,
}

impl NodeMount {
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_ref().map_or(-1, |f| f.as_raw_fd())
    }

    /// Closes the node's copy of the descriptor once it was handed over, as the node server
    /// does: the mount then lives only as long as its server.
    pub fn close_fd(&mut self) {
        self.fd.take();
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

/// What the node component does: open /dev/fuse and mount it on `dir` for `user_id`, with
/// the GKE node server's options.
pub fn node_mount(dir: &Path, user_id: u32) -> NodeMount {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .expect("open /dev/fuse as root");
    let fd = OwnedFd::from(dev);
    let data = CString::new(format!(
        "fd={},rootmode=40000,user_id={user_id},group_id={user_id},allow_other,default_permissions",
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
pub fn no_access_file(dir: &Path) -> PathBuf {
    let p = dir.join("no-fuse");
    std::fs::write(&p, b"").expect("write");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).expect("chmod");
    p
}

/// rapidfs as the unprivileged sidecar: a private mount namespace where /dev/fuse is
/// `blocker`, uid and gid 65534, no supplementary groups, no capabilities at all. `fd`, when
/// given, is inherited as descriptor 3.
pub fn unprivileged(blocker: &Path, fd: Option<RawFd>) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        env!("CARGO_BIN_EXE_rapidfs"),
    ]);
    cmd.stdin(Stdio::null()).stderr(Stdio::inherit());
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

/// The daemon really is unprivileged: uid 65534, no capabilities, and its /dev/fuse is the
/// unreadable blocker, not the device.
pub fn check_unprivileged(pid: u32) {
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

/// A temporary directory uid 65534 can enter.
pub fn shared_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    d
}

/// Sends `payload` (not empty) with `fd` (SCM_RIGHTS) to the first client of `listener` in
/// one `sendmsg`, then closes the connection: the GKE node server's way.
pub fn send_fd(listener: &UnixListener, fd: RawFd, payload: &[u8]) {
    // Polled with a deadline: a sidecar that dies before connecting fails the test, not hangs it.
    listener.set_nonblocking(true).expect("nonblocking");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let conn = loop {
        match listener.accept() {
            Ok((conn, _)) => break conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(std::time::Instant::now() < deadline, "nobody connected");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    conn.set_nonblocking(false).expect("blocking");
    let mut data = payload.to_vec();
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
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
        let sent = libc::sendmsg(conn.as_raw_fd(), &msg, 0);
        assert_eq!(sent, data.len() as isize, "sendmsg");
    }
}
