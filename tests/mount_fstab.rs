//! rapidfs under mount(8): `mount -t fuse.TYPE`, through `mount.fuse3` (which runs `TYPE` from
//! the default PATH) and through a `mount.fuse.TYPE` helper name; `umount` ends the daemon;
//! `mount -a` on an fstab file of our own (never /etc/fstab) with `nofail` lines.
//!
//! The helper names are unique to this process (`rapidfs-tPID...`) and removed afterwards,
//! so nothing clashes with an installed rapidfs or with tests running in parallel.

mod mount_support;

use mount_support::{data, is_mounted, sha, Env};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const BUCKET: &str = "fstab";

/// A symlink to the rapidfs binary, removed on drop.
struct Link(PathBuf);

impl Link {
    fn new(path: PathBuf) -> Link {
        let _ = std::fs::remove_file(&path);
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_rapidfs"), &path)
            .unwrap_or_else(|e| panic!("symlink {}: {e}", path.display()));
        Link(path)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The name mount.fuse3 runs for type `fuse.NAME`: found in sh's default PATH
/// (mount(8) passes helpers no PATH at all), so it goes in /usr/local/bin.
fn program_link(tag: &str) -> (String, Link) {
    let name = format!("rapidfs-t{}-{tag}", std::process::id());
    let link = Link::new(Path::new("/usr/local/bin").join(&name));
    (format!("fuse.{name}"), link)
}

/// mount(8) runs /sbin/mount.fuse.NAME itself, before falling back to mount.fuse3.
fn helper_link(tag: &str) -> (String, Link) {
    let name = format!("rapidfs-t{}-{tag}", std::process::id());
    let link = Link::new(Path::new("/sbin").join(format!("mount.fuse.{name}")));
    (format!("fuse.{name}"), link)
}

/// The pid of the rapidfs daemon started as `fstype` serving `mnt` (its command line names
/// both).
fn daemon_pid(fstype: &str, mnt: &Path) -> Option<u32> {
    let name = fstype.trim_start_matches("fuse.");
    let want = mnt.to_string_lossy().into_owned();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        (args[0].contains(name) && args.contains(&want)).then_some(pid)
    })
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

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().expect("command runs");
    eprintln!(
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn gone(pid: u32) -> bool {
    // A zombie has exited too (the daemon's parent is init, which reaps it).
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z "))
}

/// `umount DIR` must end the daemon: its pid disappears.
fn umount_ends_daemon(fstype: &str, mnt: &Path) {
    let pid = daemon_pid(fstype, mnt).expect("a daemon serves the mount");
    assert!(run(Command::new("umount").arg(mnt)).status.success());
    assert!(!is_mounted(mnt));
    wait_until("daemon exits after umount", || gone(pid));
}

/// Mounts with `-t TYPE` and options as fstab users write them, checks what the options
/// mean (owner, mode, read-only) and the bytes, then unmounts with umount.
fn mount_t(fstype: &str, env: &Env, payload: &[u8], extra: &str) {
    let mnt = tempfile::tempdir().expect("tempdir");
    let opts = format!(
        "ro,allow_other,endpoint={},uid=1234,gid=2345,file_mode=600,dir_mode=700,implicit_dirs,_netdev,x-systemd.automount,comment=rapidfs{extra}",
        env.emu().endpoint()
    );
    let out = run(Command::new("mount")
        .args(["-t", fstype, BUCKET])
        .arg(mnt.path())
        .args(["-o", &opts]));
    assert!(out.status.success(), "mount -t {fstype} failed");
    assert!(is_mounted(mnt.path()));
    let file = mnt.path().join("data/blob.bin");
    let got = std::fs::read(&file).expect("read through the mount");
    assert!(sha(&got) == sha(payload), "bytes differ");
    let meta = std::fs::metadata(&file).expect("stat");
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (1234, 2345, 0o600)
    );
    let dir = std::fs::metadata(mnt.path().join("data")).expect("stat dir");
    assert_eq!(dir.mode() & 0o7777, 0o700);
    let err = std::fs::write(mnt.path().join("new"), b"x").expect_err("ro mount");
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    umount_ends_daemon(fstype, mnt.path());
}

#[test]
fn mount_t_through_mount_fuse3_serves_and_umount_ends_the_daemon() {
    let env = Env::new(BUCKET);
    let payload = data(7, 2 * 1024 * 1024 + 3);
    env.put(BUCKET, "data/blob.bin", &payload);
    let (fstype, _link) = program_link("a");
    mount_t(&fstype, &env, &payload, "");
}

#[test]
fn mount_t_through_a_mount_fuse_helper_name() {
    let env = Env::new(BUCKET);
    let payload = data(8, 1024 * 1024 + 7);
    env.put(BUCKET, "data/blob.bin", &payload);
    let (fstype, _link) = helper_link("b");
    // Through the helper name rapidfs sees nofail and user themselves.
    mount_t(&fstype, &env, &payload, ",nofail,users");
}

#[test]
fn unknown_mount_option_is_one_clear_line() {
    let env = Env::new(BUCKET);
    let (fstype, _link) = helper_link("c");
    let mnt = tempfile::tempdir().expect("tempdir");
    let opts = format!("endpoint={},frobnicate=3", env.emu().endpoint());
    let out = run(Command::new("mount")
        .args(["-t", &fstype, BUCKET])
        .arg(mnt.path())
        .args(["-o", &opts]));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown mount option 'frobnicate=3'"),
        "{stderr}"
    );
    assert!(!is_mounted(mnt.path()));
}

/// mount.fuse3's `drop_privileges`: it mounts /dev/fuse itself and runs rapidfs with no
/// capabilities on `/dev/fd/N`; umount ends the daemon.
#[test]
fn drop_privileges_serves_dev_fd_from_mount_fuse3() {
    let env = Env::new(BUCKET);
    let payload = data(9, 512 * 1024);
    env.put(BUCKET, "p.bin", &payload);
    let (fstype, _link) = program_link("d");
    let mnt = tempfile::tempdir().expect("tempdir");
    let opts = format!("drop_privileges,endpoint={}", env.emu().endpoint());
    let out = run(Command::new("mount")
        .args(["-t", &fstype, BUCKET])
        .arg(mnt.path())
        .args(["-o", &opts]));
    assert!(out.status.success(), "mount -o drop_privileges failed");
    let got = std::fs::read(mnt.path().join("p.bin")).expect("read");
    assert!(sha(&got) == sha(&payload));
    let pid = daemon_pid(&fstype, Path::new("/dev/fd/3")).expect("daemon on /dev/fd/3");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    assert!(
        status.lines().any(|l| l == "CapEff:\t0000000000000000"),
        "the daemon kept capabilities: {status}"
    );
    assert!(run(Command::new("umount").arg(mnt.path())).status.success());
    wait_until("daemon exits after umount", || gone(pid));
}

/// `mount -a` over our own fstab: a good `nofail` line mounts, a `nofail` line for a bucket
/// that does not exist does not fail the run, a `noauto` line is left alone.
#[test]
fn mount_all_with_nofail_lines() {
    let env = Env::new(BUCKET);
    let payload = data(10, 300_000);
    env.put(BUCKET, "f.bin", &payload);
    let (fstype, _link) = helper_link("e");
    let good = tempfile::tempdir().expect("tempdir");
    let missing = tempfile::tempdir().expect("tempdir");
    let manual = tempfile::tempdir().expect("tempdir");
    let ep = env.emu().endpoint();
    let fstab_dir = tempfile::tempdir().expect("tempdir");
    let fstab = fstab_dir.path().join("fstab");
    let opts = format!("_netdev,nofail,x-systemd.automount,endpoint={ep}");
    std::fs::write(
        &fstab,
        format!(
            "# rapidfs test fstab\n\
             {BUCKET} {} {fstype} {opts},ro 0 0\n\
             no-such-bucket {} {fstype} {opts} 0 0\n\
             {BUCKET} {} {fstype} noauto,endpoint={ep} 0 0\n",
            good.path().display(),
            missing.path().display(),
            manual.path().display(),
        ),
    )
    .expect("write fstab");
    let out = run(Command::new("mount").arg("-a").arg("-T").arg(&fstab));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mount -a failed: {stderr}");
    assert!(
        stderr.contains("no-such-bucket"),
        "the failure is told: {stderr}"
    );
    assert!(is_mounted(good.path()));
    assert!(!is_mounted(missing.path()));
    assert!(!is_mounted(manual.path()), "noauto line was mounted");
    let got = std::fs::read(good.path().join("f.bin")).expect("read");
    assert!(sha(&got) == sha(&payload));
    // The noauto line mounts by its mountpoint alone, as `mount /mnt/x` does with fstab.
    let out = run(Command::new("mount")
        .arg("-T")
        .arg(&fstab)
        .arg(manual.path()));
    assert!(out.status.success());
    assert!(std::fs::read(manual.path().join("f.bin")).is_ok_and(|g| sha(&g) == sha(&payload)));
    umount_ends_daemon(&fstype, manual.path());
    umount_ends_daemon(&fstype, good.path());
}
