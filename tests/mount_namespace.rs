//! The namespace through a real FUSE mount: unlink, rename (files with MoveObject, replacing
//! the target; directories with RenameFolder), mkdir -p, rmdir, rm -r, the attribute calls of
//! touch/chmod/chown, and the tools that use them all (tar -x, cp -r, rsync -a), each checked
//! against the bucket's listing and folders over the wire. One test runs on the emulator's
//! directory backend, where folders are directories on disk.

mod mount_support;
mod write_support;

use mount_support::{data, Env};
use rapidfs::emulator::{Emulator, EmulatorOptions, Faults};
use rapidfs::gcs::{Client, ListRequest};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use write_support::{bytes, client, errno_of};

const BUCKET: &str = "names";

/// Every object name under `prefix`, in order.
fn objects(env: &Env, c: &Client, prefix: &str) -> Vec<String> {
    let req = ListRequest {
        prefix: prefix.to_string(),
        ..Default::default()
    };
    let page = env.rt.block_on(c.list_page(BUCKET, &req)).expect("list");
    assert!(page.next_page_token.is_empty(), "one page is enough here");
    page.objects.into_iter().map(|o| o.name).collect()
}

fn folder(env: &Env, c: &Client, name: &str) -> bool {
    env.rt
        .block_on(c.folder_exists(BUCKET, name))
        .expect("get folder")
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("command runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn mv_replaces_a_file_and_the_bucket_shows_it() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "a", b"contents of a");
    env.put(BUCKET, "b", b"old b");
    let m = env.mount(BUCKET, &env.config());
    let c = client(&env.rt, &env.emu().endpoint());
    assert_eq!(std::fs::read(m.p("b")).expect("read b"), b"old b");
    run(Command::new("mv").arg(m.p("a")).arg(m.p("b")));
    assert_eq!(objects(&env, &c, ""), ["b"]);
    assert_eq!(bytes(&env.rt, &c, BUCKET, "b"), b"contents of a");
    assert_eq!(std::fs::read(m.p("b")).expect("read b"), b"contents of a");
    assert_eq!(errno_of(std::fs::metadata(m.p("a"))), libc::ENOENT);
    // Into a directory, and a file written on this mount, then read under its new name.
    std::fs::create_dir(m.p("d")).expect("mkdir");
    std::fs::write(m.p("new.txt"), b"written here").expect("write");
    std::fs::rename(m.p("new.txt"), m.p("d/moved.txt")).expect("rename");
    std::fs::rename(m.p("b"), m.p("d/b")).expect("rename into d");
    assert_eq!(objects(&env, &c, ""), ["d/b", "d/moved.txt"]);
    assert_eq!(
        std::fs::read(m.p("d/moved.txt")).expect("read"),
        b"written here"
    );
    assert_eq!(std::fs::read(m.p("d/b")).expect("read"), b"contents of a");
    // POSIX errors: a file over a directory, a directory over a file.
    std::fs::create_dir(m.p("e")).expect("mkdir");
    assert_eq!(
        errno_of(std::fs::rename(m.p("d/b"), m.p("e"))),
        libc::EISDIR
    );
    assert_eq!(
        errno_of(std::fs::rename(m.p("e"), m.p("d/b"))),
        libc::ENOTDIR
    );
    std::fs::remove_file(m.p("d/b")).expect("unlink");
    assert_eq!(objects(&env, &c, ""), ["d/moved.txt"]);
    assert_eq!(errno_of(std::fs::read(m.p("d/b"))), libc::ENOENT);
}

#[test]
fn mkdir_p_rmdir_and_directory_rename_show_in_the_bucket() {
    let env = Env::new(BUCKET);
    let m = env.mount(BUCKET, &env.config());
    let c = client(&env.rt, &env.emu().endpoint());
    run(Command::new("mkdir").arg("-p").arg(m.p("a/b/c")));
    for f in ["a/", "a/b/", "a/b/c/"] {
        assert!(folder(&env, &c, f), "folder {f}");
    }
    assert!(objects(&env, &c, "").is_empty(), "folders, no objects");
    // Empty directories stay visible, also to a mount that did not make them.
    let other = env.mount(BUCKET, &env.config());
    assert!(std::fs::metadata(other.p("a/b/c")).expect("stat").is_dir());
    let listed: Vec<String> = std::fs::read_dir(other.p("a/b"))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(listed, ["c"]);
    drop(other);
    assert_eq!(
        errno_of(std::fs::remove_dir(m.p("a/b"))),
        libc::ENOTEMPTY,
        "rmdir of a non-empty directory"
    );
    std::fs::remove_dir(m.p("a/b/c")).expect("rmdir of an empty directory");
    assert!(!folder(&env, &c, "a/b/c/"));
    assert_eq!(errno_of(std::fs::metadata(m.p("a/b/c"))), libc::ENOENT);
    // A directory with files and a sub-directory, renamed.
    std::fs::create_dir(m.p("a/b/sub")).expect("mkdir");
    std::fs::write(m.p("a/b/x.txt"), b"x").expect("write");
    std::fs::write(m.p("a/b/sub/y.txt"), b"y").expect("write");
    std::fs::rename(m.p("a/b"), m.p("moved")).expect("rename a directory");
    assert_eq!(objects(&env, &c, ""), ["moved/sub/y.txt", "moved/x.txt"]);
    assert!(folder(&env, &c, "moved/sub/"));
    assert!(!folder(&env, &c, "a/b/"));
    assert_eq!(std::fs::read(m.p("moved/sub/y.txt")).expect("read"), b"y");
    assert_eq!(errno_of(std::fs::metadata(m.p("a/b"))), libc::ENOENT);
    // Onto an empty directory it replaces it; onto a non-empty one it fails.
    std::fs::create_dir(m.p("empty")).expect("mkdir");
    std::fs::rename(m.p("moved"), m.p("empty")).expect("rename over an empty dir");
    assert_eq!(objects(&env, &c, ""), ["empty/sub/y.txt", "empty/x.txt"]);
    std::fs::create_dir(m.p("z")).expect("mkdir");
    assert_eq!(
        errno_of(std::fs::rename(m.p("z"), m.p("empty"))),
        libc::ENOTEMPTY
    );
}

/// A local tree with small, empty, larger and executable files, nested and empty directories.
fn source_tree(root: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for d in ["src/pkg/sub", "src/empty", "src/deep/a/b/c"] {
        std::fs::create_dir_all(root.join(d)).expect("mkdir");
    }
    std::fs::write(root.join("src/readme.txt"), b"hello\n").expect("write");
    std::fs::write(root.join("src/zero"), b"").expect("write");
    std::fs::write(root.join("src/pkg/big.bin"), data(9, 3 << 20)).expect("write");
    std::fs::write(root.join("src/pkg/sub/small.bin"), data(10, 5000)).expect("write");
    std::fs::write(root.join("src/deep/a/b/c/leaf"), b"leaf").expect("write");
    let run = root.join("src/run.sh");
    std::fs::write(&run, b"#!/bin/sh\necho hi\n").expect("write");
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// Relative path -> bytes (None for a directory) of everything under `root`.
fn tree(root: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("readdir") {
            let e = e.expect("entry");
            let rel = e
                .path()
                .strip_prefix(root)
                .expect("under root")
                .to_string_lossy()
                .into_owned();
            if e.file_type().expect("type").is_dir() {
                out.insert(rel, None);
                stack.push(e.path());
            } else {
                let bytes = std::fs::read(e.path())
                    .unwrap_or_else(|err| panic!("read {}: {err}", e.path().display()));
                out.insert(rel, Some(bytes));
            }
        }
    }
    out
}

/// The mount's copy under `prefix` equals the source, and the bucket holds exactly its files
/// as objects and its directories as folders.
fn same_tree(env: &Env, c: &Client, src: &Path, mnt: &Path, prefix: &str) {
    let want = tree(src);
    let got = tree(&mnt.join(prefix));
    let size =
        |t: &BTreeMap<String, Option<Vec<u8>>>, k: &str| t.get(k).map(|v| v.as_ref().map(Vec::len));
    let differ: Vec<_> = want
        .keys()
        .chain(got.keys().filter(|k| !want.contains_key(*k)))
        .filter(|k| want.get(*k) != got.get(*k))
        .map(|k| (k, size(&want, k), size(&got, k)))
        .collect();
    assert!(
        differ.is_empty(),
        "{prefix}: not the source's tree; (path, source size, mount size): {differ:?}"
    );
    let files: Vec<String> = want
        .iter()
        .filter(|(_, v)| v.is_some())
        .map(|(k, _)| format!("{prefix}/{k}"))
        .collect();
    assert_eq!(
        objects(env, c, &format!("{prefix}/")),
        files,
        "{prefix}: objects"
    );
    for (dir, _) in want.iter().filter(|(_, v)| v.is_none()) {
        assert!(
            folder(env, c, &format!("{prefix}/{dir}/")),
            "{prefix}/{dir}/ folder"
        );
    }
}

#[test]
fn tar_x_cp_r_rsync_a_and_rm_r_work_and_match_the_bucket() {
    let env = Env::new(BUCKET);
    let m = env.mount(BUCKET, &env.config());
    let c = client(&env.rt, &env.emu().endpoint());
    let tmp = tempfile::tempdir().expect("tempdir");
    source_tree(tmp.path());
    let src = tmp.path().join("src");
    let tarball = tmp.path().join("src.tar");
    run(Command::new("tar")
        .arg("-cf")
        .arg(&tarball)
        .arg("-C")
        .arg(&src)
        .arg("."));
    std::fs::create_dir(m.p("t")).expect("mkdir");
    run(Command::new("tar")
        .arg("-xf")
        .arg(&tarball)
        .arg("-C")
        .arg(m.p("t")));
    same_tree(&env, &c, &src, &m.path, "t");
    run(Command::new("cp").arg("-r").arg(&src).arg(m.p("c")));
    same_tree(&env, &c, &src, &m.path, "c");
    run(Command::new("rsync")
        .arg("-a")
        .arg(format!("{}/", src.display()))
        .arg(m.p("r")));
    same_tree(&env, &c, &src, &m.path, "r");
    // A second rsync finds nothing to do and still succeeds.
    run(Command::new("rsync")
        .arg("-a")
        .arg(format!("{}/", src.display()))
        .arg(m.p("r")));
    for t in ["t", "c", "r"] {
        run(Command::new("rm").arg("-r").arg(m.p(t)));
        assert!(
            objects(&env, &c, &format!("{t}/")).is_empty(),
            "{t}: no objects"
        );
        assert!(!folder(&env, &c, &format!("{t}/")), "{t}: no folder");
        assert_eq!(errno_of(std::fs::metadata(m.p(t))), libc::ENOENT);
    }
}

#[test]
fn touch_chmod_and_chown_answer_like_the_mount_options_say() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "f", b"data");
    let m = env.mount(BUCKET, &env.config());
    run(Command::new("touch")
        .arg("-d")
        .arg("2020-01-02 03:04:05")
        .arg(m.p("f")));
    run(Command::new("touch").arg(m.p("new")));
    run(Command::new("chmod").arg("600").arg(m.p("f")));
    // SAFETY: getuid and getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    run(Command::new("chown")
        .arg(format!("{uid}:{gid}"))
        .arg(m.p("f")));
    let out = Command::new("chown")
        .arg("12345")
        .arg(m.p("f"))
        .output()
        .expect("chown runs");
    assert!(!out.status.success(), "chown to another owner fails");
    let c = std::ffi::CString::new(m.p("f").as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid path; ownership change to an owner the mount does not have.
    let r = unsafe { libc::chown(c.as_ptr(), 12345, u32::MAX) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EPERM)
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    run(Command::new("cp")
        .arg("-p")
        .arg(m.p("f"))
        .arg(tmp.path().join("f")));
    run(Command::new("cp")
        .arg("-p")
        .arg(tmp.path().join("f"))
        .arg(m.p("g")));
    assert_eq!(std::fs::read(m.p("g")).expect("read"), b"data");
}

#[test]
fn the_directory_backend_keeps_folders_as_directories_on_disk() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime");
    let root = tempfile::tempdir().expect("tempdir");
    let opts = EmulatorOptions {
        root: Some(root.path().to_path_buf()),
        memory: false,
        zone: "us-central1-a".to_string(),
        faults: Faults::default(),
    };
    let emu = rt
        .block_on(Emulator::start(opts, "127.0.0.1:0".parse().expect("addr")))
        .expect("emulator starts");
    emu.create_bucket(BUCKET).expect("bucket");
    let env = Env { rt, emu: Some(emu) };
    let m = env.mount(BUCKET, &env.config());
    let disk = root.path().join(BUCKET);
    run(Command::new("mkdir").arg("-p").arg(m.p("a/b/c")));
    assert!(disk.join("a/b/c").is_dir(), "a folder is a directory");
    std::fs::write(m.p("a/b/f.txt"), b"file").expect("write");
    std::fs::rename(m.p("a/b"), m.p("a/renamed")).expect("rename dir");
    assert!(disk.join("a/renamed/c").is_dir());
    assert_eq!(
        std::fs::read(disk.join("a/renamed/f.txt")).expect("on disk"),
        b"file"
    );
    assert!(!disk.join("a/b").exists());
    std::fs::rename(m.p("a/renamed/f.txt"), m.p("a/g.txt")).expect("mv file");
    assert_eq!(
        std::fs::read(disk.join("a/g.txt")).expect("on disk"),
        b"file"
    );
    assert_eq!(errno_of(std::fs::remove_dir(m.p("a"))), libc::ENOTEMPTY);
    run(Command::new("rm").arg("-r").arg(m.p("a")));
    assert!(
        !disk.join("a").exists(),
        "rm -r removed the directories too"
    );
    // An empty directory made on disk (behind the emulator's back) shows in the mount.
    std::fs::create_dir(disk.join("made_on_disk")).expect("mkdir on disk");
    let other = env.mount(BUCKET, &env.config());
    assert!(std::fs::metadata(other.p("made_on_disk"))
        .expect("stat")
        .is_dir());
}
