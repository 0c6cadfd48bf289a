//! The `rapidfs` binary as its own process: mounted in the foreground on a directory, ready
//! once the kernel lists the mount, and killed with SIGKILL (the mount detached after), for
//! the tests that crash the daemon and check what the bucket kept. A test that fails before
//! it ends its daemon leaves neither the process nor the mount behind, and a killed daemon's
//! control socket, which only a clean exit removes, goes with it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Whether `path` is a mountpoint now.
pub fn is_mounted(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let p = path.to_string_lossy();
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_ref()))
}

/// A daemon of this test. Dropped while it still runs (a test that failed half-way), it is
/// killed, reaped and its mount detached, so that no process or mount outlives the test.
pub struct Daemon {
    child: Option<Child>,
    mnt: PathBuf,
}

impl Daemon {
    /// The daemon's process id.
    pub fn id(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// SIGTERM (the daemon makes its writes durable and unmounts) and its exit status.
    pub fn terminate(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("a running daemon");
        // SAFETY: signalling our own child process.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        child.wait().expect("wait")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            let _ = std::fs::remove_file(rapidfs::control::socket_path(&self.mnt));
        }
    }
}

/// `rapidfs mount BUCKET MNT --foreground --endpoint ENDPOINT EXTRA...`, once live.
pub fn daemon(endpoint: &str, bucket: &str, mnt: &Path, extra: &[&str]) -> Daemon {
    let child = Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .args(["mount", bucket, "--foreground"])
        .arg(mnt)
        .args(["--endpoint", endpoint])
        .args(extra)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("rapidfs runs");
    let d = Daemon {
        child: Some(child),
        mnt: mnt.to_path_buf(),
    };
    let start = Instant::now();
    while !is_mounted(mnt) {
        assert!(start.elapsed() < Duration::from_secs(20), "daemon mounted");
        std::thread::sleep(Duration::from_millis(20));
    }
    d
}

/// SIGKILL, reap, and detach the dead mount.
pub fn kill(mut d: Daemon) {
    let mut child = d.child.take().expect("a running daemon");
    // SAFETY: signalling our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) }, 0);
    child.wait().expect("wait");
    let st = Command::new("umount")
        .arg("-l")
        .arg(&d.mnt)
        .status()
        .expect("umount runs");
    let _ = std::fs::remove_file(rapidfs::control::socket_path(&d.mnt));
    assert!(st.success(), "umount -l {}", d.mnt.display());
}
