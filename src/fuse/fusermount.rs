//! The unprivileged ways to a mounted `/dev/fuse`: mounting and unmounting through the setuid
//! `fusermount3` helper (its `_FUSE_COMMFD` protocol), and receiving a descriptor that a
//! privileged party mounted and passes over a unix socket with SCM_RIGHTS (fusermount3
//! itself, the GKE Cloud Storage FUSE CSI driver's node server).

use fuser::MountOption;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;

/// The longest message a descriptor comes with: what the GKE CSI driver's sidecar accepts.
const MESSAGE_LIMIT: usize = 5000;

/// How long a sender may pause inside its message before it is taken to be complete.
const MESSAGE_QUIET: std::time::Duration = std::time::Duration::from_millis(500);

/// How long a sender may take to send the descriptor at all: a peer that accepted the
/// connection and says nothing must not hang the daemon.
const MESSAGE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

fn option_string(o: &MountOption) -> String {
    match o {
        MountOption::FSName(n) => format!("fsname={n}"),
        MountOption::Subtype(t) => format!("subtype={t}"),
        MountOption::CUSTOM(c) => c.clone(),
        MountOption::AutoUnmount => "auto_unmount".into(),
        MountOption::DefaultPermissions => "default_permissions".into(),
        MountOption::Dev => "dev".into(),
        MountOption::NoDev => "nodev".into(),
        MountOption::Suid => "suid".into(),
        MountOption::NoSuid => "nosuid".into(),
        MountOption::RO => "ro".into(),
        MountOption::RW => "rw".into(),
        MountOption::Exec => "exec".into(),
        MountOption::NoExec => "noexec".into(),
        MountOption::Atime => "atime".into(),
        MountOption::NoAtime => "noatime".into(),
        MountOption::DirSync => "dirsync".into(),
        MountOption::Sync => "sync".into(),
        MountOption::Async => "async".into(),
    }
}

/// Runs `fusermount3 -o OPTIONS -- MOUNTPOINT` and receives the /dev/fuse descriptor it
/// passes back over a socket (the `_FUSE_COMMFD` protocol).
pub(super) fn mount(mountpoint: &Path, config: &fuser::Config) -> io::Result<OwnedFd> {
    let mut opts: Vec<String> = config.mount_options.iter().map(option_string).collect();
    if config.acl != fuser::SessionACL::Owner {
        opts.push("allow_other".into());
    }
    let (ours, theirs) = UnixStream::pair()?;
    // The helper must inherit its end: a dup carries no close-on-exec flag.
    // SAFETY: dup of a descriptor we own; the copy is closed below.
    let inherited = unsafe { libc::dup(theirs.as_raw_fd()) };
    if inherited < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `inherited` was just created and is owned by nothing else.
    let inherited = unsafe { OwnedFd::from_raw_fd(inherited) };
    let out = Command::new("fusermount3")
        .arg("-o")
        .arg(opts.join(","))
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", inherited.as_raw_fd().to_string())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run fusermount3: {e}")))?;
    drop(inherited);
    drop(theirs);
    if !out.status.success() {
        let msg = String::from_utf8_lossy(&out.stderr);
        return Err(io::Error::other(format!(
            "fusermount3 failed: {}",
            msg.trim().replace('\n', " ")
        )));
    }
    receive_fd(&ours)
}

/// `fusermount3 -u MOUNTPOINT` (with `-z`: detach lazily).
pub(super) fn unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    let out = Command::new("fusermount3")
        .arg("-u")
        .args(lazy.then_some("-z"))
        .arg("--")
        .arg(mountpoint)
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    let msg = String::from_utf8_lossy(&out.stderr);
    // Already unmounted from outside: nothing left to do.
    if msg.contains("not found") || msg.contains("not mounted") {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "fusermount3 -u failed: {}",
        msg.trim()
    )))
}

/// Receives one descriptor sent with SCM_RIGHTS over `sock`, with the one byte of payload
/// that fusermount3 sends alongside. The socket stays open: fusermount3 with `auto_unmount`
/// keeps its end until the mount goes away.
pub fn receive_fd(sock: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    receive_with_fd(sock, &mut byte).map(|(_, fd)| fd)
}

/// Connects to the unix socket at `path` and receives a descriptor and the whole message
/// sent with it, up to `MESSAGE_LIMIT` bytes, reading until the sender closes the connection
/// (the GKE CSI driver's node server sends its JSON and the descriptor in one `sendmsg`,
/// then closes). A sender silent for `MESSAGE_QUIET` after the first part is taken to have
/// said everything.
pub fn receive_message(path: &Path) -> io::Result<(Vec<u8>, OwnedFd)> {
    use std::io::Read;
    let sock = UnixStream::connect(path)?;
    let limit = MESSAGE_LIMIT;
    let mut message = vec![0u8; limit];
    sock.set_read_timeout(Some(MESSAGE_WAIT))?;
    let (mut len, fd) = receive_with_fd(&sock, &mut message)?;
    sock.set_read_timeout(Some(MESSAGE_QUIET))?;
    let mut reader = &sock;
    while len < limit {
        match reader.read(&mut message[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                break
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if len == limit && reader.read(&mut [0u8; 1]).is_ok_and(|n| n > 0) {
        return Err(io::Error::other(format!(
            "the message with the descriptor is longer than {limit} bytes"
        )));
    }
    message.truncate(len);
    Ok((message, fd))
}

/// One `recvmsg` into `buf` that must carry a descriptor; returns the bytes received with it.
fn receive_with_fd(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, OwnedFd)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // u64 words keep the control buffer aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; every pointer set below outlives the recvmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    let n = loop {
        // SAFETY: a valid socket and a message whose buffers we own.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // Every descriptor received is owned at once, so none leaks whatever happens next.
    let mut fds = Vec::new();
    // SAFETY: the CMSG macros walk the control buffer recvmsg filled and bounded; each
    // SCM_RIGHTS payload holds (cmsg_len - CMSG_LEN(0)) / sizeof(int) descriptors.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg) as *const libc::c_int;
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / std::mem::size_of::<libc::c_int>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other(
            "the descriptors passed over the socket did not fit",
        ));
    }
    let mut fds = fds.into_iter();
    match (fds.next(), fds.next()) {
        (Some(fd), None) => Ok((n, fd)),
        (None, _) => Err(io::Error::other("no descriptor was passed over the socket")),
        (Some(_), Some(_)) => Err(io::Error::other(
            "more than one descriptor was passed over the socket",
        )),
    }
}
