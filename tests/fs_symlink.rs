//! Symbolic links through `fs` alone, against the in-process emulator: symlink, readlink,
//! getattr, readdir, rename and unlink of a link, links other tools wrote (gcsfuse before
//! 3.9: an empty object with `gcsfuse_symlink_target`; gcloud storage and Storage Transfer
//! Service: the target as the bytes, marked `goog-reserved-file-is-symlink: true`), a second
//! filesystem over the same bucket, and the errnos of what is not supported.

mod fs_support;

use bytes::Bytes;
use fs_support::{assert_no_entry, entries, FsEnv};
use rapidfs::config::Config;
use rapidfs::fs::{Errno, Fs, Kind, ROOT_INO};
use rapidfs::gcs::Symlink;

#[test]
fn a_link_is_made_read_listed_renamed_and_removed() {
    let env = FsEnv::new("b", |_| {});
    env.put("blobs/sha1", b"the blob");
    let fs = &env.fs;
    env.rt.block_on(async {
        let snap = fs.mkdir(ROOT_INO, "snap").await.expect("mkdir").attr.ino;
        let e = fs
            .symlink(snap, "model.bin", "../blobs/sha1")
            .await
            .expect("symlink");
        assert_eq!((e.attr.kind, e.attr.size), (Kind::Symlink, 13));
        assert_eq!(e.attr.perm, 0o777);
        assert_eq!(
            &*fs.readlink(e.attr.ino).await.expect("readlink"),
            "../blobs/sha1"
        );

        // Stored the way gcsfuse 3.9 stores it: the target as the bytes, marked as a link.
        let o = env
            .client
            .get_object("b", "snap/model.bin")
            .await
            .expect("object");
        assert_eq!(o.symlink, Some(Symlink::Target("../blobs/sha1".into())));
        assert_eq!(o.size, 13);
        assert!(o.finalized, "durable and complete when symlink returned");

        assert_eq!(
            fs.symlink(snap, "model.bin", "other").await.map(|_| ()),
            Err(Errno(libc::EEXIST))
        );
        assert_eq!(
            fs.symlink(ROOT_INO, "snap", "other").await.map(|_| ()),
            Err(Errno(libc::EEXIST)),
            "a directory of that name"
        );
        let a = fs.getattr(e.attr.ino).await.expect("getattr");
        assert_eq!((a.kind, a.size), (Kind::Symlink, 13));
        assert_eq!(
            entries(fs, snap).await,
            [("model.bin".to_string(), Kind::Symlink)]
        );

        // A link is not opened (the kernel follows it) and has no size of its own to set.
        assert_eq!(
            fs.open(e.attr.ino, false, false).await,
            Err(Errno(libc::ELOOP))
        );
        let blob = fs.lookup(ROOT_INO, "blobs").await.expect("blobs").attr.ino;
        let blob = fs.lookup(blob, "sha1").await.expect("sha1").attr.ino;
        assert_eq!(fs.readlink(blob).await, Err(Errno::EINVAL));
        assert_eq!(fs.link_refusal(), Errno(libc::EPERM));

        fs.rename(snap, "model.bin", ROOT_INO, "last.ckpt", 0)
            .await
            .expect("rename");
        assert_no_entry(fs, snap, "model.bin").await;
        let moved = fs.lookup(ROOT_INO, "last.ckpt").await.expect("moved");
        assert_eq!(moved.attr.kind, Kind::Symlink);
        assert_eq!(
            &*fs.readlink(moved.attr.ino).await.expect("target"),
            "../blobs/sha1"
        );
        let o = env
            .client
            .get_object("b", "last.ckpt")
            .await
            .expect("object");
        assert_eq!(o.symlink, Some(Symlink::Target("../blobs/sha1".into())));

        // A link replaces a file by rename, and a file a link.
        fs.symlink(ROOT_INO, "l2", "blobs/sha1").await.expect("l2");
        let f = fs
            .create(ROOT_INO, "plain", libc::O_WRONLY)
            .await
            .expect("create");
        fs.flush(f.1.fh).await.expect("flush");
        fs.release_write(f.1.fh).await;
        fs.rename(ROOT_INO, "l2", ROOT_INO, "plain", 0)
            .await
            .expect("link over file");
        let p = fs.lookup(ROOT_INO, "plain").await.expect("plain");
        assert_eq!(p.attr.kind, Kind::Symlink);

        fs.unlink(ROOT_INO, "last.ckpt").await.expect("unlink");
        assert_no_entry(fs, ROOT_INO, "last.ckpt").await;
        assert!(matches!(
            env.client.get_object("b", "last.ckpt").await,
            Err(rapidfs::gcs::Error::NotFound(_))
        ));
        let blob = env
            .client
            .get_object("b", "blobs/sha1")
            .await
            .expect("blob");
        assert_eq!(blob.size, 8, "the target is untouched");
    });
}

#[test]
fn links_other_tools_wrote_are_links_here() {
    // Lookups by name (no cached listings) and through a listing both tell links apart.
    for list_ttl_ms in [0, 60_000] {
        let env = FsEnv::new("b", |cfg| cfg.fs.list_ttl_ms = list_ttl_ms);
        let emu = env.emu();
        emu.put_object_with_metadata(
            "b",
            "d/legacy",
            Bytes::new(),
            &[("gcsfuse_symlink_target", "../a/b")],
        )
        .expect("put");
        emu.put_object_with_metadata(
            "b",
            "d/standard",
            Bytes::from_static(b"x/y/z"),
            &[("goog-reserved-file-is-symlink", "true")],
        )
        .expect("put");
        emu.put_object_with_metadata(
            "b",
            "d/not-a-link",
            Bytes::from_static(b"data"),
            &[("goog-reserved-file-is-symlink", "false")],
        )
        .expect("put");
        let fs = &env.fs;
        env.rt.block_on(async {
            let d = fs.lookup(ROOT_INO, "d").await.expect("d").attr.ino;
            let legacy = fs.lookup(d, "legacy").await.expect("legacy").attr;
            assert_eq!((legacy.kind, legacy.size), (Kind::Symlink, 6));
            assert_eq!(&*fs.readlink(legacy.ino).await.expect("target"), "../a/b");
            let standard = fs.lookup(d, "standard").await.expect("standard").attr;
            assert_eq!((standard.kind, standard.size), (Kind::Symlink, 5));
            assert_eq!(&*fs.readlink(standard.ino).await.expect("target"), "x/y/z");
            let plain = fs.lookup(d, "not-a-link").await.expect("plain").attr;
            assert_eq!(plain.kind, Kind::File);
            assert_eq!(
                entries(fs, d).await,
                [
                    ("legacy".to_string(), Kind::Symlink),
                    ("not-a-link".to_string(), Kind::File),
                    ("standard".to_string(), Kind::Symlink),
                ]
            );
        });
    }
}

#[test]
fn a_second_filesystem_over_the_bucket_sees_the_link() {
    let env = FsEnv::new("b", |_| {});
    env.rt.block_on(async {
        env.fs
            .symlink(ROOT_INO, "latest", "runs/42")
            .await
            .expect("symlink");
        let mut cfg = Config::default();
        cfg.gcs.endpoint = env.emu().endpoint();
        let other = Fs::new(env.client.clone(), "b", &cfg);
        let e = other.lookup(ROOT_INO, "latest").await.expect("latest");
        assert_eq!((e.attr.kind, e.attr.size), (Kind::Symlink, 7));
        assert_eq!(
            &*other.readlink(e.attr.ino).await.expect("target"),
            "runs/42"
        );
    });
}

#[test]
fn a_read_only_mount_refuses_links_with_erofs() {
    let env = FsEnv::new("b", |cfg| cfg.fs.read_only = true);
    env.rt.block_on(async {
        assert_eq!(
            env.fs.symlink(ROOT_INO, "l", "t").await.map(|_| ()),
            Err(Errno::EROFS)
        );
    });
    assert_eq!(env.fs.link_refusal(), Errno::EROFS);
}

#[test]
fn targets_too_long_or_empty_are_refused() {
    let env = FsEnv::new("b", |_| {});
    env.rt.block_on(async {
        let long = "a".repeat(4096);
        assert_eq!(
            env.fs.symlink(ROOT_INO, "l", &long).await.map(|_| ()),
            Err(Errno::ENAMETOOLONG)
        );
        assert_eq!(
            env.fs.symlink(ROOT_INO, "l", "").await.map(|_| ()),
            Err(Errno::ENOENT)
        );
        let longest = "a".repeat(4095);
        let e = env
            .fs
            .symlink(ROOT_INO, "l", &longest)
            .await
            .expect("4095 bytes");
        assert_eq!(e.attr.size, 4095);
    });
}
