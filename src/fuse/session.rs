//! A mount's life: mounting (as root with the mount syscall, else through fusermount3) or
//! taking over a descriptor someone else mounted, serving it on a thread of its own, the
//! stop (writes made durable first), and unmounting, lazily when files are still open.

use super::driven::Driven;
use super::{fusermount, Driver, FuseAdapter};
use crate::fs::Fs;
use fuser::MountOption;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a stopping daemon waits for its FUSE thread after unmounting.
const THREAD_GRACE: Duration = Duration::from_secs(2);

/// How often the mount checks whether the kernel holds more inodes than the cap: a walk
/// creates some 100,000 a second.
const SHED_INTERVAL: Duration = Duration::from_millis(200);

/// Mount options for the kernel: read-only, `allow_other` and the user's `-o` list, and
/// `default_permissions` (the kernel checks modes) wherever a mode could refuse anything.
pub struct MountSettings {
    /// Shown as the filesystem source in `mount` and `df`.
    pub fsname: String,
    /// Mount with the kernel's read-only flag.
    pub read_only: bool,
    /// Let other users in (FUSE `allow_other`).
    pub allow_other: bool,
    /// Extra options, as given to `-o` (comma-separated, already split).
    pub extra: Vec<String>,
}

/// The fuser configuration for `settings`; `owner_may_do_all`: the modes rapidfs reports
/// give the user who mounts read and write on files and everything on directories
/// (`Fs::owner_may_do_all`).
///
/// Without `allow_other` the kernel lets only that user in, so a check of the modes could
/// refuse nothing (a file without an execute bit is still refused `exec`: the kernel checks
/// that in any case, and `access` asks `Fs::access`) and is left out. It was not free: every create,
/// unlink or rename in a directory drops the directory's attributes in the kernel, and the
/// next check in that directory asked for them again, a GETATTR per small file written.
fn mount_config(settings: &MountSettings, owner_may_do_all: bool) -> fuser::Config {
    let mut opts = vec![
        MountOption::FSName(settings.fsname.clone()),
        MountOption::Subtype("rapidfs".to_string()),
    ];
    let mut check_modes = !owner_may_do_all;
    let mut allow_other = settings.allow_other;
    let mut read_only = settings.read_only;
    // Safe defaults that an explicit option (mount.fuse3 passes `dev,suid`) may turn around.
    let (mut dev, mut suid, mut atime) = (
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoAtime,
    );
    for o in &settings.extra {
        match o.as_str() {
            "" => {}
            "default_permissions" => check_modes = true,
            "rw" => read_only = false,
            "ro" => read_only = true,
            "allow_other" => allow_other = true,
            "dev" => dev = MountOption::Dev,
            "nodev" => dev = MountOption::NoDev,
            "suid" => suid = MountOption::Suid,
            "nosuid" => suid = MountOption::NoSuid,
            "atime" => atime = MountOption::Atime,
            "noatime" => atime = MountOption::NoAtime,
            "auto_unmount" => opts.push(MountOption::AutoUnmount),
            "exec" => opts.push(MountOption::Exec),
            "noexec" => opts.push(MountOption::NoExec),
            "sync" => opts.push(MountOption::Sync),
            "async" => opts.push(MountOption::Async),
            "dirsync" => opts.push(MountOption::DirSync),
            other => opts.push(MountOption::CUSTOM(other.to_string())),
        }
    }
    if check_modes || allow_other {
        opts.push(MountOption::DefaultPermissions);
    }
    opts.extend([dev, suid, atime]);
    opts.push(if read_only {
        MountOption::RO
    } else {
        MountOption::RW
    });
    let mut cfg = fuser::Config::default();
    cfg.mount_options = opts;
    if allow_other {
        cfg.acl = fuser::SessionACL::All;
    }
    cfg
}

/// How a mount is undone: by fuser (mounted by the mount syscall as root), by
/// `fusermount3 -u` (mounted through the setuid helper), or not at all (a descriptor someone
/// else mounted: they unmount).
enum Unmounter {
    Session(fuser::SessionUnmounter, Mountpoint),
    Fusermount(Mountpoint),
    Nobody,
}

/// Where this daemon mounted, and the device its mount showed there once mounted.
struct Mountpoint {
    path: PathBuf,
    device: Option<String>,
}

impl Mountpoint {
    /// Just mounted on `path`.
    fn mounted(path: &Path) -> Mountpoint {
        Mountpoint {
            path: path.to_path_buf(),
            device: crate::mountinfo::device_on(path),
        }
    }

    /// Whether the mount visible on the path is still this one. Someone may have detached
    /// it (`fusermount3 -uz`) and mounted another there since: unmounting the path would
    /// then take theirs. (Not found once mounted: assumed ours, as before.)
    fn still_ours(&self) -> bool {
        self.device
            .as_ref()
            .is_none_or(|d| crate::mountinfo::device_on(&self.path).as_ref() == Some(d))
    }
}

impl Unmounter {
    /// Unmounts; when files are still open (EBUSY) detaches the mount lazily instead, so no
    /// stale mount stays behind a daemon that stops. Says whether it had to detach.
    fn unmount(&mut self) -> std::io::Result<bool> {
        match self {
            Unmounter::Session(u, at) => match u.unmount() {
                Ok(()) => Ok(false),
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    if !at.still_ours() {
                        return Ok(false);
                    }
                    detach(&at.path).map(|()| true)
                }
                Err(e) => Err(e),
            },
            Unmounter::Fusermount(at) => {
                if !at.still_ours() {
                    return Ok(false);
                }
                match fusermount::unmount(&at.path, false) {
                    Ok(()) => Ok(false),
                    Err(_) => fusermount::unmount(&at.path, true).map(|()| true),
                }
            }
            Unmounter::Nobody => Ok(false),
        }
    }
}

/// `umount -l`: the mount leaves the tree now; open files keep it alive until they close.
fn detach(path: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a valid NUL-terminated path; umount2 touches no memory of ours.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A live mount served by its own thread; unmounted when dropped.
pub struct Mounted {
    unmounter: Unmounter,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    ended: Option<tokio::sync::oneshot::Receiver<()>>,
    /// Where the FUSE thread drives the runtime: its driver, and the standby thread, which
    /// stands by until the mount is finished.
    standby: Option<(Arc<Driven>, std::thread::JoinHandle<()>)>,
    fs: Fs,
    finished: bool,
}

impl Mounted {
    /// Mounts `fs` on `mountpoint` and starts serving it, each request on `driver`'s
    /// runtime. Returns once the kernel handshake is done: the mount is live.
    pub fn start(
        fs: Fs,
        driver: Driver,
        mountpoint: &Path,
        settings: &MountSettings,
    ) -> std::io::Result<Mounted> {
        let config = mount_config(settings, fs.owner_may_do_all());
        let kernel_read_only = config.mount_options.contains(&MountOption::RO);
        let (adapter, driven) = FuseAdapter::new(fs.clone(), driver, kernel_read_only);
        // SAFETY: geteuid cannot fail and touches no memory.
        let root = unsafe { libc::geteuid() } == 0;
        let (session, unmounter) = if root {
            // fuser's own mount(2) leaves the subtype to fusermount3, so the mount would show
            // as plain `fuse`; the kernel takes it as a mount option and then shows
            // `fuse.rapidfs`, which is how `umount -t`, `mount -a` and our commands find it.
            let mut config = config.clone();
            config
                .mount_options
                .push(MountOption::CUSTOM("subtype=rapidfs".to_string()));
            let mut session = fuser::Session::new(adapter, mountpoint, &config)?;
            let unmounter =
                Unmounter::Session(session.unmount_callable(), Mountpoint::mounted(mountpoint));
            (session, unmounter)
        } else {
            // fuser opens /dev/fuse itself first and gives up when it may not; an ordinary
            // user mounts through the setuid helper, as libfuse does.
            let fd = fusermount::mount(mountpoint, &config)?;
            let session = fuser::Session::from_fd(adapter, fd, config.acl, config.clone())?;
            (
                session,
                Unmounter::Fusermount(Mountpoint::mounted(mountpoint)),
            )
        };
        Self::run(session, unmounter, fs, driven)
    }

    /// Serves `fd`, a `/dev/fuse` descriptor already mounted by someone else (the GKE CSI
    /// driver, `mount.fuse3 -o drop_privileges`): no mount, no unmount, no kernel tuning.
    /// The kernel checks access as the mounter's options say, so every request is served.
    pub fn serve_fd(fs: Fs, driver: Driver, fd: OwnedFd) -> std::io::Result<Mounted> {
        // Whoever mounted the descriptor (the GKE CSI driver) mounted it read-only exactly
        // when the volume's options, which set `fs.read_only`, say so.
        let kernel_read_only = fs.skips_open();
        let (adapter, driven) = FuseAdapter::new(fs.clone(), driver, kernel_read_only);
        let config = fuser::Config::default();
        let session = fuser::Session::from_fd(adapter, fd, fuser::SessionACL::All, config)?;
        Self::run(session, Unmounter::Nobody, fs, driven)
    }

    fn run(
        session: fuser::Session<FuseAdapter>,
        unmounter: Unmounter,
        fs: Fs,
        driven: Option<Arc<Driven>>,
    ) -> std::io::Result<Mounted> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let serving = Arc::new(AtomicBool::new(true));
        // The standby outlives the session: whoever waits for its end (the daemon's main
        // thread, through a task) needs the runtime driven once the FUSE thread is gone.
        let standby = match driven {
            Some(driven) => {
                use std::os::fd::AsFd;
                driven.watch(session.as_fd().try_clone_to_owned()?)?;
                let standing_by = driven.clone();
                let thread = std::thread::Builder::new()
                    .name("rapidfs-standby".to_string())
                    .spawn(move || standing_by.stand_by())?;
                Some((driven, thread))
            }
            None => None,
        };
        let notifier = session.notifier();
        let still_serving = serving.clone();
        let over = standby.as_ref().map(|(driven, _)| driven.clone());
        let thread = std::thread::Builder::new()
            .name("fuse".to_string())
            .spawn(move || {
                let r = session.run();
                still_serving.store(false, Ordering::Release);
                let _ = tx.send(());
                if let Some(driven) = over {
                    driven.session_ended();
                }
                r
            })?;
        let shedder = fs.clone();
        std::thread::Builder::new()
            .name("rapidfs-shed".to_string())
            .spawn(move || shed_inodes(&shedder, &notifier, &serving))?;
        Ok(Mounted {
            unmounter,
            thread: Some(thread),
            ended: Some(rx),
            standby,
            fs,
            finished: false,
        })
    }

    /// Refuses writes from now on (EIO), waits for those in flight, and makes every byte
    /// written so far durable: what a stopping daemon does before it unmounts.
    pub async fn stop_writes(&self) {
        self.fs.stop_writes().await;
    }

    /// Makes every appended byte durable while the mount goes on serving (a rewritten file
    /// waits for its own close).
    pub async fn sync_writes(&self) {
        self.fs.sync_writes().await;
    }

    /// Resolves when the session ends (unmounted from outside, e.g. `fusermount3 -u`).
    /// Only the first call gets a live receiver.
    pub fn ended(&mut self) -> tokio::sync::oneshot::Receiver<()> {
        self.ended
            .take()
            .unwrap_or_else(|| tokio::sync::oneshot::channel().1)
    }

    /// Unmounts (if still mounted) and waits for the serving thread to finish.
    pub fn unmount(mut self) -> std::io::Result<()> {
        self.finish()
    }

    /// Unmounts, then waits a little for the serving thread: a lazily detached mount (files
    /// still open) or a descriptor mounted by someone else keeps it busy, and a stopping
    /// process need not wait for that.
    fn finish(&mut self) -> std::io::Result<()> {
        if std::mem::replace(&mut self.finished, true) {
            return Ok(());
        }
        let unmounted = self.unmounter.unmount();
        if let Ok(true) = unmounted {
            tracing::info!("files still open: mount detached lazily");
        }
        // A detached mount and a passed descriptor (nobody unmounts it here) keep the thread
        // busy until their files close or the process ends: no point waiting for it.
        let wait = if matches!(self.unmounter, Unmounter::Nobody) || matches!(unmounted, Ok(true)) {
            Duration::ZERO
        } else {
            THREAD_GRACE
        };
        let grace = Instant::now() + wait;
        while self.thread.as_ref().is_some_and(|t| !t.is_finished()) && Instant::now() < grace {
            std::thread::sleep(Duration::from_millis(5));
        }
        let joined = match self.thread.take_if(|t| t.is_finished()).map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(std::io::Error::other("the FUSE thread panicked")),
            None => Ok(()),
        };
        if let Some((driven, thread)) = self.standby.take() {
            driven.stop_standing_by();
            let _ = thread.join();
        }
        unmounted.map(|_| ()).and(joined)
    }
}

/// While the session serves: asks the kernel to drop the dentries of the inodes over the cap
/// and of names whose version is gone (see `Fs::inodes_to_shed`), and the cached pages of
/// files an O_APPEND write left wrong (see `Fs::pages_to_drop`). Off the FUSE thread: the
/// kernel handles a notification under the directory's lock, or waits for the locks of the
/// pages it drops, which a request in flight may hold.
fn shed_inodes(fs: &Fs, notifier: &fuser::Notifier, serving: &AtomicBool) {
    while serving.load(Ordering::Acquire) {
        std::thread::sleep(SHED_INTERVAL);
        for (parent, name) in fs.inodes_to_shed() {
            // ENOENT: the kernel dropped it already; any other error ends with the session.
            let _ = notifier.inval_entry(fuser::INodeNo(parent), std::ffi::OsStr::new(&name));
        }
        for ino in fs.pages_to_drop() {
            // Offset 0, length 0: every page, and the attributes.
            let _ = notifier.inval_inode(fuser::INodeNo(ino), 0, 0);
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            tracing::warn!(error = %e, "unmount failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checks_modes(allow_other: bool, extra: &[&str], owner_may_do_all: bool) -> bool {
        let settings = MountSettings {
            fsname: "b".to_string(),
            read_only: false,
            allow_other,
            extra: extra.iter().map(|o| o.to_string()).collect(),
        };
        mount_config(&settings, owner_may_do_all)
            .mount_options
            .contains(&MountOption::DefaultPermissions)
    }

    #[test]
    fn modes_are_checked_wherever_they_could_refuse_someone() {
        assert!(
            !checks_modes(false, &[], true),
            "the owner alone, allowed all"
        );
        assert!(!checks_modes(false, &["rw", "nosuid"], true));
        assert!(
            checks_modes(false, &[], false),
            "modes that refuse the owner"
        );
        assert!(checks_modes(true, &[], true), "other users let in");
        assert!(checks_modes(false, &["allow_other"], true));
        assert!(
            checks_modes(false, &["default_permissions"], true),
            "asked for"
        );
    }
}
