//! The `rapidfs` binary as its own process: mounted in the foreground on a directory, ready
//! once the kernel lists the mount, and killed with SIGKILL (the mount detached after), for
//! the tests that crash the daemon and check what the bucket kept.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `path` is a mountpoint now.
pub fn is_mounted(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let p = path.to_string_lossy();
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_ref()))
}

/// `rapidfs mount BUCKET MNT --foreground --endpoint ENDPOINT EXTRA...`, once live.
pub fn daemon(endpoint: &str, bucket: &str, mnt: &Path, extra: &[&str]) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .args(["mount", bucket, "--foreground"])
        .arg(mnt)
        .args(["--endpoint", endpoint])
        .args(extra)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("rapidfs runs");
    let start = Instant::now();
    while !is_mounted(mnt) {
        assert!(start.elapsed() < Duration::from_secs(20), "daemon mounted");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// SIGKILL, reap, and detach the dead mount.
pub fn kill(mut child: Child, mnt: &Path) {
    // SAFETY: signalling our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) }, 0);
    child.wait().expect("wait");
    let st = Command::new("umount")
        .arg("-l")
        .arg(mnt)
        .status()
        .expect("umount runs");
    assert!(st.success(), "umount -l {}", mnt.display());
}
