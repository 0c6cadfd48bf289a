//! Listings and lookups through `fs` alone, counted in the emulator's calls: what a close of
//! a written file invalidates, and what a lookup in a directory too large to list costs.

mod fs_support;

use fs_support::FsEnv;
use rapidfs::fs::{Errno, Kind, ROOT_INO};

/// Closing a file that wrote drops its own directory's cached listing (it holds an old
/// size) and no other: a lookup in another directory is still answered without a call.
#[test]
fn closing_a_written_file_drops_only_its_directory_listing() {
    let env = FsEnv::new("b", |_| {});
    env.put("d1/a", b"x");
    env.put("d2/b", b"x");
    let fs = &env.fs;
    env.rt.block_on(async {
        let d1 = fs.lookup(ROOT_INO, "d1").await.expect("d1").attr.ino;
        let d2 = fs.lookup(ROOT_INO, "d2").await.expect("d2").attr.ino;
        let (_, opened) = fs.create(d1, "new", libc::O_WRONLY).await.expect("create");
        // Listed after the create, as a reader would while the file grows.
        fs.lookup(d1, "a").await.expect("a");
        fs.lookup(d2, "b").await.expect("b");
        fs.write(opened.fh, 0, bytes::Bytes::from_static(b"hello"))
            .await
            .expect("write");
        fs.flush(opened.fh).await.expect("flush");
        fs.release_write(opened.fh).await;
        let (lists, _) = env.calls();
        fs.lookup(d2, "b").await.expect("b");
        assert_eq!(env.calls().0, lists, "d2's listing was dropped");
        let new = fs.lookup(d1, "new").await.expect("new");
        assert_eq!(new.attr.size, 5);
        assert_eq!(env.calls().0, lists + 1, "d1's listing was kept");
    });
}

/// In a directory too large to list, a lookup costs one ListObjects call: it finds a file,
/// a folder (which wins over an object of the same name), an empty folder and a missing
/// name. Only a name crowded by others sorting before its folder costs two more.
#[test]
fn a_lookup_in_a_large_directory_is_one_call() {
    let env = FsEnv::new("b", |cfg| cfg.fs.list_page_size = 2);
    for name in [
        "d/a",
        "d/b",
        "d/c",
        "d/both",
        "d/both/inner",
        "d/both.bak",
        "d/y",
    ] {
        env.put(name, b"x");
    }
    for i in 0..20 {
        env.put(&format!("d/y.{i:02}"), b"x");
    }
    let fs = &env.fs;
    env.rt.block_on(async {
        env.client
            .create_folder("b", "d/empty/", false)
            .await
            .expect("folder");
        let d = fs.lookup(ROOT_INO, "d").await.expect("d").attr.ino;
        // The first lookup lists one page, finds the directory large, then probes.
        let a = fs.lookup(d, "a").await.expect("a");
        assert_eq!((a.attr.kind, a.attr.size), (Kind::File, 1));
        let before = env.calls();
        assert_eq!(fs.lookup(d, "b").await.expect("b").attr.kind, Kind::File);
        assert_eq!(
            fs.lookup(d, "both").await.expect("both").attr.kind,
            Kind::Dir
        );
        assert_eq!(
            fs.lookup(d, "empty").await.expect("empty").attr.kind,
            Kind::Dir
        );
        assert_eq!(fs.lookup(d, "nope").await.map(|_| ()), Err(Errno::ENOENT));
        assert_eq!(env.calls(), (before.0 + 4, before.1));
        let before = env.calls();
        assert_eq!(fs.lookup(d, "y").await.expect("y").attr.kind, Kind::File);
        assert_eq!(env.calls(), (before.0 + 2, before.1 + 1));
    });
}
