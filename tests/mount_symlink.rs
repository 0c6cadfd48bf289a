//! Symbolic links through a real FUSE mount: `ln -s`, readlink, lstat, listing, rename and
//! unlink of a link, the Hugging Face cache layout (`snapshots/REV/FILE -> ../../blobs/SHA`,
//! read through the link), a second mount of the bucket, links gcsfuse and gcloud storage
//! wrote, the object the bucket holds for a link, and the errnos of hard links and of a
//! read-only mount.

mod mount_support;
mod write_support;

use mount_support::{data, Env};
use rapidfs::proto::storage::storage_client::StorageClient;
use rapidfs::proto::storage::GetObjectRequest;
use std::collections::HashMap;
use std::os::unix::fs::symlink;
use std::path::Path;
use write_support::errno_of;

const BUCKET: &str = "links";

/// The custom metadata of object `name`, asked over the wire.
fn object_metadata(env: &Env, name: &str) -> HashMap<String, String> {
    env.rt.block_on(async {
        let mut c = StorageClient::connect(env.emu().endpoint())
            .await
            .expect("connect");
        let mut req = tonic::Request::new(GetObjectRequest {
            bucket: format!("projects/_/buckets/{BUCKET}"),
            object: name.to_string(),
            ..Default::default()
        });
        req.metadata_mut().insert(
            "x-goog-request-params",
            format!("bucket=projects/_/buckets/{BUCKET}")
                .parse()
                .expect("header"),
        );
        c.get_object(req).await.expect("get").into_inner().metadata
    })
}

/// The names and whether each is a link, of directory `dir`, as `read_dir` reports them.
fn listing(dir: &Path) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| {
            let e = e.expect("entry");
            let link = e.file_type().expect("file type").is_symlink();
            (e.file_name().into_string().expect("utf-8"), link)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn the_hugging_face_cache_layout_works_through_links() {
    let env = Env::new(BUCKET);
    let m = env.mount(BUCKET, &env.config());
    let repo = m.p("models--org--tiny");
    let blob = data(7, 300_000);
    std::fs::create_dir_all(repo.join("blobs")).expect("mkdir blobs");
    std::fs::create_dir_all(repo.join("snapshots/rev1")).expect("mkdir snapshots");
    std::fs::write(repo.join("blobs/0123abcd"), &blob).expect("write blob");
    let file = repo.join("snapshots/rev1/model.safetensors");
    symlink("../../blobs/0123abcd", &file).expect("ln -s");

    assert_eq!(
        std::fs::read_link(&file).expect("readlink"),
        Path::new("../../blobs/0123abcd")
    );
    let l = std::fs::symlink_metadata(&file).expect("lstat");
    assert!(l.file_type().is_symlink());
    assert_eq!(l.len(), "../../blobs/0123abcd".len() as u64);
    assert_eq!(
        std::fs::metadata(&file).expect("stat").len(),
        blob.len() as u64
    );
    assert_eq!(std::fs::read(&file).expect("read through the link"), blob);
    assert_eq!(
        listing(&repo.join("snapshots/rev1")),
        [("model.safetensors".to_string(), true)]
    );
    // A link to a directory, followed by path walks through it.
    symlink("snapshots/rev1", repo.join("current")).expect("ln -s dir");
    assert_eq!(
        std::fs::read(repo.join("current/model.safetensors")).expect("read via two links"),
        blob
    );

    // The bucket holds the link the way gcsfuse 3.9 writes one.
    let md = object_metadata(&env, "models--org--tiny/snapshots/rev1/model.safetensors");
    assert_eq!(
        md.get("gcsfuse_symlink_target").map(String::as_str),
        Some("../../blobs/0123abcd")
    );
    assert_eq!(
        md.get("goog-reserved-file-is-symlink").map(String::as_str),
        Some("true")
    );

    // A second mount of the bucket, with caches of its own, sees the same links.
    let other = env.mount(BUCKET, &env.config());
    let repo2 = other.p("models--org--tiny");
    assert_eq!(
        listing(&repo2),
        [
            ("blobs".to_string(), false),
            ("current".to_string(), true),
            ("snapshots".to_string(), false),
        ]
    );
    let file2 = repo2.join("snapshots/rev1/model.safetensors");
    assert!(std::fs::symlink_metadata(&file2)
        .expect("lstat")
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read(&file2).expect("read through the link"), blob);
    assert_eq!(
        std::fs::read(repo2.join("current/model.safetensors")).expect("read"),
        blob
    );
}

#[test]
fn a_link_is_renamed_and_unlinked_and_hard_links_are_refused() {
    let env = Env::new(BUCKET);
    let m = env.mount(BUCKET, &env.config());
    std::fs::write(m.p("epoch=2.ckpt"), b"weights").expect("write");
    symlink("epoch=2.ckpt", m.p("last.ckpt")).expect("ln -s");
    assert_eq!(
        errno_of(symlink("elsewhere", m.p("last.ckpt"))),
        libc::EEXIST
    );

    std::fs::create_dir(m.p("keep")).expect("mkdir");
    std::fs::rename(m.p("last.ckpt"), m.p("keep/last.ckpt")).expect("mv link");
    assert_eq!(
        errno_of(std::fs::symlink_metadata(m.p("last.ckpt"))),
        libc::ENOENT
    );
    let moved = m.p("keep/last.ckpt");
    assert!(std::fs::symlink_metadata(&moved)
        .expect("lstat")
        .file_type()
        .is_symlink());
    assert_eq!(
        std::fs::read_link(&moved).expect("readlink"),
        Path::new("epoch=2.ckpt")
    );
    // Relative to its new directory, the target is missing now: a dangling link.
    assert_eq!(errno_of(std::fs::read(&moved)), libc::ENOENT);
    // `ln -sf`: a new link replaces the old one by rename.
    symlink("../epoch=2.ckpt", m.p("keep/tmp-link")).expect("ln -s");
    std::fs::rename(m.p("keep/tmp-link"), &moved).expect("replace link");
    assert_eq!(std::fs::read(&moved).expect("read"), b"weights");

    assert_eq!(
        errno_of(std::fs::hard_link(m.p("epoch=2.ckpt"), m.p("hard"))),
        libc::EPERM
    );

    std::fs::remove_file(&moved).expect("unlink the link");
    assert_eq!(errno_of(std::fs::symlink_metadata(&moved)), libc::ENOENT);
    assert_eq!(
        std::fs::read(m.p("epoch=2.ckpt")).expect("target untouched"),
        b"weights"
    );
    assert_eq!(listing(&m.p("keep")), []);
}

#[test]
fn links_gcsfuse_and_gcloud_wrote_are_followed_and_a_read_only_mount_refuses_new_ones() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "data/real.txt", b"real bytes");
    let emu = env.emu();
    // gcsfuse before 3.9: an empty object, the target in `gcsfuse_symlink_target`.
    emu.put_object_with_metadata(
        BUCKET,
        "data/old-gcsfuse",
        bytes::Bytes::new(),
        &[("gcsfuse_symlink_target", "real.txt")],
    )
    .expect("put");
    // gcloud storage and Storage Transfer Service: the target as the bytes, marked.
    emu.put_object_with_metadata(
        BUCKET,
        "data/gcloud",
        bytes::Bytes::from_static(b"real.txt"),
        &[("goog-reserved-file-is-symlink", "true")],
    )
    .expect("put");
    let mut cfg = env.config();
    cfg.fs.read_only = true;
    let m = env.mount(BUCKET, &cfg);
    for name in ["old-gcsfuse", "gcloud"] {
        let p = m.p(&format!("data/{name}"));
        assert_eq!(
            std::fs::read_link(&p).expect("readlink"),
            Path::new("real.txt")
        );
        assert_eq!(std::fs::read(&p).expect("follow"), b"real bytes");
        assert_eq!(std::fs::symlink_metadata(&p).expect("lstat").len(), 8);
    }
    assert_eq!(
        listing(&m.p("data")),
        [
            ("gcloud".to_string(), true),
            ("old-gcsfuse".to_string(), true),
            ("real.txt".to_string(), false),
        ]
    );
    assert_eq!(errno_of(symlink("real.txt", m.p("data/new"))), libc::EROFS);
    assert_eq!(
        errno_of(std::fs::hard_link(m.p("data/real.txt"), m.p("data/hard"))),
        libc::EROFS
    );
}
