//! Names and metadata through a real FUSE mount: large listings, implicit directories, the
//! name rules, ownership and modes, `--only-dir`, TTLs, replaced objects, refused writes.

mod mount_support;

use mount_support::{data, read_file, Env};
use std::collections::BTreeSet;
use std::ffi::CString;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirEntryExt, MetadataExt, PermissionsExt};
use std::time::Duration;

const BUCKET: &str = "names";

fn names(dir: &std::path::Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn ten_thousand_objects_list_completely_with_sizes() {
    let env = Env::new(BUCKET);
    for i in 0..10_000usize {
        env.put(BUCKET, &format!("many/f{i:05}"), &vec![b'x'; i % 777]);
    }
    let m = env.mount(BUCKET, &env.config());
    env.emu().reset_stats();
    let mut seen = 0;
    for e in std::fs::read_dir(m.p("many")).expect("read_dir") {
        let e = e.expect("entry");
        let name = e.file_name().to_string_lossy().into_owned();
        let i: usize = name[1..].parse().expect("numbered name");
        assert_eq!(
            e.metadata().expect("stat").len(),
            (i % 777) as u64,
            "{name}"
        );
        seen += 1;
    }
    assert_eq!(seen, 10_000);
    let s = env.emu().stats();
    // Ten pages; past `parallel_list_threshold` the parallel listing adds a few probes and
    // split ranges, but nothing per entry.
    assert!(
        s.list_calls <= 50 && s.get_object_calls <= 2,
        "listing took {} list and {} get calls",
        s.list_calls,
        s.get_object_calls
    );
}

#[test]
fn a_walk_of_a_large_directory_leaves_no_inode_per_file() {
    let env = Env::new(BUCKET);
    for i in 0..20_000usize {
        env.put(BUCKET, &format!("walk/f{i:05}"), b"x");
    }
    let m = env.mount(BUCKET, &env.config());
    let mut kinds = 0;
    for e in std::fs::read_dir(m.p("walk")).expect("read_dir") {
        kinds += e.expect("entry").file_type().expect("d_type").is_file() as usize;
    }
    assert_eq!(kinds, 20_000);
    let held = m.fs.metadata_usage().inodes;
    // Only the first reply of the directory read (1 MiB) carries attributes.
    assert!(held < 10_000, "a walk by names left {held} inodes");
    let stat = std::fs::metadata(m.p("walk/f19999")).expect("stat after the walk");
    assert_eq!(stat.len(), 1);
    let listed = std::fs::read_dir(m.p("walk"))
        .expect("read_dir")
        .map(|e| e.expect("entry"))
        .find(|e| e.file_name() == "f19999")
        .expect("listed");
    assert_eq!(listed.ino(), stat.ino(), "d_ino and st_ino agree");
}

/// Under a 1 MiB metadata cap (some 9,000 inodes of these names, fewer beside their
/// listings), a walk that stats 12,000 files has the kernel drop the least recently looked
/// up until the daemon's inodes and listings together take no more than the cap; every file
/// then still stats and reads right (looked up again).
#[test]
fn the_kernel_lets_go_of_inodes_over_the_cap() {
    let env = Env::new(BUCKET);
    let (dirs, files) = (12, 1_000);
    for d in 0..dirs {
        for f in 0..files {
            env.put(BUCKET, &format!("cap/d{d:02}/f{f:04}"), &vec![b'x'; f % 97]);
        }
    }
    let mut cfg = env.config();
    cfg.fs.metadata_cache_mb = 1;
    let m = env.mount(BUCKET, &cfg);
    let stat_all = || {
        for d in 0..dirs {
            for e in std::fs::read_dir(m.p(&format!("cap/d{d:02}"))).expect("read_dir") {
                let e = e.expect("entry");
                let f: usize = e.file_name().to_string_lossy()[1..].parse().expect("name");
                assert_eq!(e.metadata().expect("stat").len(), (f % 97) as u64);
            }
        }
    };
    stat_all();
    let cap = 1 << 20;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut held = m.fs.metadata_usage();
    while held.inode_bytes + held.listing_bytes > cap && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        held = m.fs.metadata_usage();
    }
    assert!(
        held.inode_bytes + held.listing_bytes <= cap,
        "the kernel still holds {held:?}, cap {cap} bytes"
    );
    assert!(held.inodes < 12_000, "some were let go of: {held:?}");
    stat_all();
    assert_eq!(read_file(&m.p("cap/d00/f0096")), vec![b'x'; 96]);
}

#[test]
fn implicit_directories_and_the_name_rules() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "a/b/c.txt", b"deep");
    env.put(BUCKET, "x", b"shadowed object");
    env.put(BUCKET, "x/y", b"inside x");
    env.put(BUCKET, "empty/", b"");
    for odd in ["odd//double", "odd/./dot", "odd/../up", "odd/ok"] {
        env.put(BUCKET, odd, b"o");
    }
    env.put(BUCKET, &format!("odd/{}", "n".repeat(256)), b"long");
    env.put(BUCKET, &format!("odd/{}", "n".repeat(255)), b"longest");

    // Lookups by path first, on a mount that has listed nothing yet.
    let m = env.mount(BUCKET, &env.config());
    assert_eq!(std::fs::read(m.p("a/b/c.txt")).expect("read"), b"deep");
    assert!(std::fs::metadata(m.p("a/b")).expect("stat").is_dir());
    assert!(
        std::fs::metadata(m.p("x")).expect("stat").is_dir(),
        "directory wins"
    );
    assert_eq!(std::fs::read(m.p("x/y")).expect("read"), b"inside x");
    assert!(std::fs::metadata(m.p("nope")).is_err());
    m.unmount();

    let m = env.mount(BUCKET, &env.config());
    let root = names(&m.path);
    assert_eq!(
        root,
        ["a", "empty", "odd", "x"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    assert!(
        std::fs::metadata(m.p("x")).expect("stat").is_dir(),
        "directory wins"
    );
    assert!(names(&m.p("empty")).is_empty());
    assert_eq!(
        names(&m.p("odd")),
        ["ok".to_string(), "n".repeat(255)].into_iter().collect()
    );
    assert_eq!(names(&m.p("a")), ["b".to_string()].into_iter().collect());
}

#[test]
fn ownership_modes_and_only_dir() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "top.txt", b"top");
    env.put(BUCKET, "sub/inner.txt", b"inner");
    env.put(BUCKET, "sub/deeper/z", b"z");
    let mut cfg = env.config();
    cfg.fs.uid = Some(1234);
    cfg.fs.gid = Some(5678);
    cfg.fs.file_mode = 0o640;
    cfg.fs.dir_mode = 0o750;
    cfg.fs.only_dir = Some("/sub/".to_string());
    let m = env.mount(BUCKET, &cfg);
    assert_eq!(
        names(&m.path),
        ["deeper", "inner.txt"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    let f = std::fs::metadata(m.p("inner.txt")).expect("stat");
    assert_eq!((f.uid(), f.gid()), (1234, 5678));
    assert_eq!(f.permissions().mode() & 0o7777, 0o640);
    let d = std::fs::metadata(m.p("deeper")).expect("stat");
    assert_eq!(d.permissions().mode() & 0o7777, 0o750);
    assert!(std::fs::metadata(m.p("top.txt")).is_err());
}

/// The kernel's super options of the mount on `path`, from /proc/self/mountinfo.
fn super_options(path: &std::path::Path) -> String {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let p = path.to_string_lossy();
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(p.as_ref()))
        .unwrap_or_else(|| panic!("{p} is not mounted"));
    let (_, after) = line.split_once(" - ").expect("separator");
    after.split(' ').nth(2).unwrap_or("").to_string()
}

/// The kernel checks modes only where a mode could refuse the one user it lets in (the
/// owner, without `allow_other`): not with the default modes, yes with files the owner may
/// not write. Either way a file without an execute bit is neither executed nor said to be
/// executable.
#[test]
fn modes_are_checked_by_the_kernel_only_where_they_could_refuse_the_owner() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "tool", b"#!/bin/sh\nexit 0\n");
    for (file_mode, checked) in [(0o644, false), (0o444, true)] {
        let mut cfg = env.config();
        cfg.fs.file_mode = file_mode;
        let m = env.mount(BUCKET, &cfg);
        let opts = super_options(&m.path);
        assert_eq!(
            opts.split(',').any(|o| o == "default_permissions"),
            checked,
            "file mode {file_mode:o}: {opts}"
        );
        let err = std::process::Command::new(m.p("tool"))
            .status()
            .expect_err("a file without an execute bit runs");
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
        // `test -x` agrees: the kernel answers `access` itself where it checks modes, and
        // asks the daemon where it does not.
        let tool = CString::new(m.p("tool").into_os_string().into_encoded_bytes()).expect("path");
        // SAFETY: a NUL-terminated path that outlives the call.
        let runs = unsafe { libc::access(tool.as_ptr(), libc::X_OK) };
        let errno = std::io::Error::last_os_error().raw_os_error();
        assert_eq!(
            (runs, errno),
            (-1, Some(libc::EACCES)),
            "file mode {file_mode:o}"
        );
        // SAFETY: as above.
        assert_eq!(unsafe { libc::access(tool.as_ptr(), libc::R_OK) }, 0);
    }
}

#[test]
fn replaced_object_shows_after_the_ttl_and_an_open_handle_never_mixes() {
    let env = Env::new(BUCKET);
    let mib = 1024 * 1024;
    env.put(BUCKET, "r.bin", &vec![b'A'; 8 * mib]);
    let mut cfg = env.config();
    cfg.fs.stat_ttl_ms = 300;
    cfg.fs.list_ttl_ms = 300;
    cfg.fs.negative_ttl_ms = 300;
    cfg.fs.kernel_attr_ttl_ms = 300;
    cfg.fs.kernel_entry_ttl_ms = 300;
    // Small kernel read-ahead so the old handle really goes back to the service.
    cfg.read.kernel_read_ahead_kb = 0;
    let m = env.mount(BUCKET, &cfg);

    let mut old = std::fs::File::open(m.p("r.bin")).expect("open");
    let mut head = vec![0u8; 64 * 1024];
    old.read_exact(&mut head).expect("read head");
    assert!(head.iter().all(|&b| b == b'A'));

    env.put(BUCKET, "r.bin", &vec![b'B'; 3 * mib]);
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(
        std::fs::metadata(m.p("r.bin")).expect("stat").len(),
        3 * mib as u64,
        "new size after the TTL"
    );
    let fresh = read_file(&m.p("r.bin"));
    assert_eq!(fresh.len(), 3 * mib);
    assert!(
        fresh.iter().all(|&b| b == b'B'),
        "a new open reads the new version"
    );

    // The old handle reads the old version or fails; it never returns B bytes.
    let mut rest = Vec::new();
    match old.read_to_end(&mut rest) {
        Ok(_) => assert!(
            rest.iter().all(|&b| b == b'A'),
            "old handle returned bytes of the new version"
        ),
        Err(e) => assert!(
            matches!(e.raw_os_error(), Some(libc::ESTALE) | Some(libc::EIO)),
            "old handle failed with {e}"
        ),
    }

    // A name created after a miss appears once the negative TTL has passed.
    assert!(std::fs::metadata(m.p("late")).is_err());
    env.put(BUCKET, "late", &data(9, 10));
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(
        std::fs::metadata(m.p("late")).expect("late appears").len(),
        10
    );
}

#[test]
fn writes_are_refused_and_xattrs_and_statfs_answer() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "f", b"data");
    // Writes on a read-write mount are tested in mount_write.rs.
    let mut cfg = env.config();
    cfg.fs.read_only = true;
    let m = env.mount(BUCKET, &cfg);
    let err = std::fs::write(m.p("new"), b"x").expect_err("create refused");
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    let err = std::fs::create_dir(m.p("d")).expect_err("mkdir refused");
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    let err = std::fs::OpenOptions::new()
        .write(true)
        .open(m.p("f"))
        .expect_err("open for writing refused");
    assert!(
        matches!(err.raw_os_error(), Some(libc::EROFS) | Some(libc::EACCES)),
        "{err}"
    );
    assert_eq!(std::fs::read(m.p("f")).expect("read"), b"data");

    // Objects carry no extended attributes: every xattr call answers EOPNOTSUPP, the second
    // one from the kernel's memory of the first (so a write costs no GETXATTR round trip).
    let path = CString::new(m.p("f").as_os_str().as_encoded_bytes()).expect("path");
    let name = CString::new("user.test").expect("name");
    let mut buf = [0u8; 64];
    for _ in 0..2 {
        // SAFETY: valid C strings and a buffer of the stated length.
        let r = unsafe {
            libc::getxattr(
                path.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        assert_eq!(r, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EOPNOTSUPP)
        );
        // SAFETY: as above.
        let r = unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        assert_eq!(r, -1, "no xattrs listed");
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EOPNOTSUPP)
        );
    }
    // Python asks this of every file it opens; the daemon answers it without a log line.
    let file = std::fs::File::open(m.p("f")).expect("open");
    // SAFETY: a termios of plain integers is valid zeroed.
    let mut tio: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open and TCGETS fills the termios we own.
    let r = unsafe { libc::tcgetattr(file.as_raw_fd(), &mut tio) };
    assert_eq!(r, -1, "not a terminal");
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOTTY)
    );
    drop(file);

    let root = CString::new(m.path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: statvfs fills the struct we own.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(root.as_ptr(), &mut st) }, 0);
    assert!(st.f_blocks > 0 && st.f_bavail > 0 && st.f_bsize > 0);
    assert_eq!(st.f_namemax, 255);
}

/// With the `aiml-checkpointing` profile, a file another mount (another node) creates shows
/// up in this mount's listing of the directory within a second, not the default listing TTL
/// of a minute: an evaluator polls the checkpoint directory for new ones.
#[test]
fn with_the_checkpointing_profile_another_mount_s_new_file_is_listed_within_a_second() {
    use rapidfs::config::Config;
    use rapidfs::profiles::Profile;
    use std::time::Instant;
    let env = Env::new(BUCKET);
    let mut cfg =
        Config::parse_with_profile("", Some(Profile::AimlCheckpointing)).expect("profile");
    cfg.gcs.endpoint = env.emu().endpoint();
    let a = env.mount(BUCKET, &cfg);
    let b = env.mount(BUCKET, &cfg);
    std::fs::create_dir(a.p("ckpts")).expect("mkdir");
    std::fs::write(a.p("ckpts/step-1.pt"), b"1").expect("write");
    // How long until B's listing of the directory holds `name`.
    let until_listed = |name: &str| {
        let start = Instant::now();
        loop {
            let names: BTreeSet<String> = std::fs::read_dir(b.p("ckpts"))
                .expect("list")
                .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
                .collect();
            if names.contains(name) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < Duration::from_secs(3),
                "B's listing still lacks {name} after 3 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // The first listing of the directory on B, while it holds one checkpoint.
    until_listed("step-1.pt");
    std::fs::write(a.p("ckpts/step-2.pt"), b"2").expect("write");
    until_listed("step-2.pt");
}
