//! Modification times through `fs` alone, against the in-process emulator: a time set by
//! `utimes(2)` is recorded in the object's metadata where gcsfuse keeps it (at once on a
//! closed file, at the end of the writing on an open one, as `cp -p` and `tar -x` set it,
//! whoever ends it), writes after it and appends drop it, `touch` makes the update time the
//! mtime again (and records nothing on a file being written), a size change records none,
//! and the times gcsfuse and gcloud storage record are what a lookup shows.

mod fs_support;

use fs_support::FsEnv;
use rapidfs::fs::{Fs, Mtime, SetAttr, ROOT_INO};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// 2020-01-02T03:04:05.5Z, as `touch -d` or a tarball would give it.
fn then() -> SystemTime {
    UNIX_EPOCH + Duration::new(1_577_934_245, 500_000_000)
}

fn set_mtime(mtime: SystemTime, fh: Option<u64>) -> SetAttr {
    SetAttr {
        mtime: Some(Mtime::At(mtime)),
        ..touch(fh)
    }
}

/// `touch`: the present time.
fn touch(fh: Option<u64>) -> SetAttr {
    SetAttr {
        size: None,
        mode: None,
        uid: None,
        gid: None,
        mtime: Some(Mtime::Now),
        fh,
    }
}

/// Creates `name` in the root and writes `data` through it: its inode and handle.
async fn created(fs: &Fs, name: &str, data: &[u8]) -> (u64, u64) {
    let (e, opened) = fs
        .create(ROOT_INO, name, libc::O_WRONLY)
        .await
        .expect("create");
    if !data.is_empty() {
        fs.write(opened.fh, 0, data.to_vec().into())
            .await
            .expect("write");
    }
    (e.attr.ino, opened.fh)
}

/// An `Fs` over a bucket holding "f" of `data` with `then()` recorded as its time: the
/// environment and the file's inode.
fn f_with_a_recorded_time(data: &[u8]) -> (FsEnv, u64) {
    let env = FsEnv::new("b", |_| {});
    env.put("f", data);
    let ino = env.ino("f");
    env.rt.block_on(async {
        env.fs
            .setattr(ino, set_mtime(then(), None))
            .await
            .expect("touch -d");
        assert_eq!(recorded(&env, "f").await, Some(then()));
    });
    (env, ino)
}

/// A log of one line written through the mount (an appendable object, which appends stream
/// into) with `then()` recorded as its time, reopened to append: its inode and new handle.
async fn log_with_a_recorded_time_reopened(env: &FsEnv) -> (u64, u64) {
    let fs = &env.fs;
    let (ino, fh) = created(fs, "log", b"one\n").await;
    closed(fs, fh).await;
    fs.setattr(ino, set_mtime(then(), None))
        .await
        .expect("touch -d");
    assert_eq!(recorded(env, "log").await, Some(then()));
    let again = fs.open_write(ino, false).await.expect("open");
    (ino, again.fh)
}

/// `close(2)` of handle `fh`, and its release.
async fn closed(fs: &Fs, fh: u64) {
    fs.flush(fh).await.expect("close");
    fs.release_write(fh).await;
}

/// (name, mtime) of each entry of the root as `ls -l` lists them (readdirplus).
async fn listed_mtimes(fs: &Fs) -> Vec<(String, SystemTime)> {
    let fh = fs.opendir(ROOT_INO).expect("opendir");
    let mut out = Vec::new();
    fs.readdirplus(fh, 0, |item, entry| {
        if item.name != "." && item.name != ".." {
            out.push((item.name.to_string(), entry.attr.mtime));
        }
        false
    })
    .await
    .expect("readdirplus");
    fs.releasedir(fh);
    out
}

/// The modification time the service's metadata of `name` gives, if any.
async fn recorded(env: &FsEnv, name: &str) -> Option<SystemTime> {
    env.client
        .get_object("b", name)
        .await
        .expect("object")
        .mtime
}

#[test]
fn a_time_set_on_a_closed_file_is_recorded_in_its_object() {
    let env = FsEnv::new("b", |_| {});
    env.put("f", b"abc");
    let fs = &env.fs;
    let ino = env.ino("f");
    env.rt.block_on(async {
        let attr = fs
            .setattr(ino, set_mtime(then(), None))
            .await
            .expect("utimes");
        assert_eq!(attr.mtime, then());
        assert_eq!(recorded(&env, "f").await, Some(then()));
        assert_eq!(fs.getattr(ino).await.expect("stat").mtime, then());
        assert_eq!(listed_mtimes(fs).await, vec![("f".to_string(), then())]);
    });
}

#[test]
fn a_time_set_while_writing_is_recorded_once_the_writing_ends() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        // `cp -p`: create, write, futimens on the open descriptor, close.
        let (ino, opened) = created(fs, "copy", &[7u8; 1000]).await;
        let attr = fs
            .setattr(ino, set_mtime(then(), Some(opened)))
            .await
            .expect("futimens");
        // Then fchown: its reply is what the kernel caches for the file.
        let chown = SetAttr {
            uid: Some(attr.uid),
            gid: Some(attr.gid),
            mtime: None,
            ..set_mtime(then(), Some(opened))
        };
        let attr = fs.setattr(ino, chown).await.expect("fchown");
        assert_eq!(attr.mtime, then(), "the time set, not the object's yet");
        fs.flush(opened).await.expect("close");
        assert_eq!(recorded(&env, "copy").await, Some(then()));
        assert_eq!(fs.getattr(ino).await.expect("stat").mtime, then());
        fs.release_write(opened).await;
        assert_eq!(fs.getattr(ino).await.expect("stat").mtime, then());
        let meta = env.client.get_object("b", "copy").await.expect("object");
        assert_eq!(meta.size, 1000, "the bytes are all there");
    });
}

#[test]
fn appending_after_a_recorded_time_drops_it() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        let before = SystemTime::now();
        let (ino, again) = log_with_a_recorded_time_reopened(&env).await;
        fs.write(again, 4, b"two\n".to_vec().into())
            .await
            .expect("append");
        closed(fs, again).await;
        // Dropped: the update time, the append's, is the mtime again.
        let meta = env.client.get_object("b", "log").await.expect("object");
        assert_eq!(meta.mtime, None);
        assert!(meta.update_time >= before);
        assert!(fs.getattr(ino).await.expect("stat").mtime >= before);
    });
}

#[test]
fn a_size_change_records_no_time() {
    let env = FsEnv::new("b", |_| {});
    env.put("f", b"abcdef");
    let fs = &env.fs;
    let ino = env.ino("f");
    env.rt.block_on(async {
        // truncate(2): the kernel sends "now" with the size.
        let set = SetAttr {
            size: Some(2),
            ..touch(None)
        };
        assert_eq!(fs.setattr(ino, set).await.expect("truncate").size, 2);
        assert_eq!(recorded(&env, "f").await, None);
    });
}

#[test]
fn the_times_gcsfuse_and_gcloud_record_are_what_a_lookup_shows() {
    let env = FsEnv::new("b", |_| {});
    let put = |name: &str, key: &str, value: &str| {
        env.emu()
            .put_object_with_metadata("b", name, b"x".to_vec().into(), &[(key, value)])
            .expect("put");
    };
    put("by-gcsfuse", "gcsfuse_mtime", "2020-01-02T03:04:05.5Z");
    put("by-gcloud", "goog-reserved-file-mtime", "1577934245");
    put("plain", "other", "1");
    let fs = &env.fs;
    env.rt.block_on(async {
        let mtime = |name: &'static str| async move {
            fs.lookup(ROOT_INO, name).await.expect("lookup").attr.mtime
        };
        assert_eq!(mtime("by-gcsfuse").await, then());
        assert_eq!(
            mtime("by-gcloud").await,
            UNIX_EPOCH + Duration::from_secs(1_577_934_245)
        );
        let plain = env.client.get_object("b", "plain").await.expect("plain");
        assert_eq!(mtime("plain").await, plain.update_time);
    });
}

#[test]
fn touch_makes_the_present_time_the_mtime_and_drops_a_recorded_one() {
    let (env, ino) = f_with_a_recorded_time(b"abc");
    let fs = &env.fs;
    env.rt.block_on(async {
        let before = SystemTime::now();
        fs.setattr(ino, touch(None)).await.expect("touch");
        let meta = env.client.get_object("b", "f").await.expect("object");
        assert_eq!(meta.mtime, None);
        assert!(
            meta.update_time >= before,
            "the update moved the update time"
        );
        assert!(fs.getattr(ino).await.expect("stat").mtime >= before);
    });
}

#[test]
fn touch_of_a_file_being_created_costs_no_update() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        let (ino, opened) = created(fs, "new", b"").await;
        fs.setattr(ino, touch(Some(opened))).await.expect("touch");
        closed(fs, opened).await;
        let meta = env.client.get_object("b", "new").await.expect("object");
        assert_eq!((meta.mtime, meta.metageneration), (None, 1));
    });
}

/// `cp -p` over an existing file where the opener's close cannot be told apart (the GKE
/// sidecar): the flush comes as an fsync, and the last release ends the writing.
#[test]
fn a_time_set_during_an_overwrite_is_recorded_whoever_ends_it() {
    let env = FsEnv::new("b", |_| {});
    env.put("f", b"old bytes");
    let fs = &env.fs;
    let ino = env.ino("f");
    env.rt.block_on(async {
        let opened = fs.open_write_only(ino, true).await.expect("open O_TRUNC");
        fs.write(opened.fh, 0, b"new".to_vec().into())
            .await
            .expect("write");
        fs.setattr(ino, set_mtime(then(), Some(opened.fh)))
            .await
            .expect("futimens");
        fs.fsync(ino, opened.fh).await.expect("flush as fsync");
        fs.release_write(opened.fh).await;
        let meta = env.client.get_object("b", "f").await.expect("object");
        assert_eq!((meta.size, meta.mtime), (3, Some(then())));
    });
}

#[test]
fn a_write_after_the_time_was_set_drops_it() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        let (ino, opened) = created(fs, "f", b"one").await;
        fs.setattr(ino, set_mtime(then(), Some(opened)))
            .await
            .expect("futimens");
        fs.write(opened, 3, b"two".to_vec().into())
            .await
            .expect("write after");
        closed(fs, opened).await;
        assert_eq!(recorded(&env, "f").await, None);
        assert!(fs.getattr(ino).await.expect("stat").mtime > then());
    });
}

/// A rewrite uploads a new version, which carries no recorded time: the mtime is its own.
#[test]
fn a_rewrite_of_a_file_with_a_recorded_time_shows_the_new_version_s_time() {
    let (env, ino) = f_with_a_recorded_time(b"abcdef");
    let fs = &env.fs;
    env.rt.block_on(async {
        let before = SystemTime::now();
        let opened = fs.open_write(ino, false).await.expect("open");
        fs.write(opened.fh, 1, b"X".to_vec().into())
            .await
            .expect("write in the middle");
        closed(fs, opened.fh).await;
        assert_eq!(recorded(&env, "f").await, None);
        assert!(fs.getattr(ino).await.expect("stat").mtime >= before);
    });
}

/// `cp -p` of an empty file: nothing written, so the stream stays open past the close and
/// the last release ends it, recording the time.
#[test]
fn a_time_set_on_an_empty_new_file_is_recorded_at_its_release() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        let (ino, opened) = created(fs, "empty", b"").await;
        fs.setattr(ino, set_mtime(then(), Some(opened)))
            .await
            .expect("futimens");
        closed(fs, opened).await;
        assert_eq!(recorded(&env, "empty").await, Some(then()));
        assert_eq!(fs.getattr(ino).await.expect("stat").mtime, then());
    });
}

#[test]
fn touch_during_a_write_drops_the_time_set_before_it() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        let (ino, opened) = created(fs, "f", b"one").await;
        fs.setattr(ino, set_mtime(then(), Some(opened)))
            .await
            .expect("futimens");
        fs.setattr(ino, touch(Some(opened))).await.expect("touch");
        closed(fs, opened).await;
        assert_eq!(recorded(&env, "f").await, None);
    });
}

/// Appends drop the time their stream saw recorded, and only that one: a time another mount
/// recorded meanwhile stands.
#[test]
fn appends_leave_a_time_recorded_meanwhile_by_another_mount() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    let later = then() + Duration::from_secs(3600);
    env.rt.block_on(async {
        let (_, opened) = log_with_a_recorded_time_reopened(&env).await;
        fs.write(opened, 4, b"two\n".to_vec().into())
            .await
            .expect("append");
        let generation = env
            .client
            .get_object("b", "log")
            .await
            .expect("object")
            .generation;
        env.client
            .set_mtime("b", "log", generation, later)
            .await
            .expect("another mount's touch -d");
        closed(fs, opened).await;
        assert_eq!(recorded(&env, "log").await, Some(later));
    });
}
