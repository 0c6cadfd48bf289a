//! Modification times through `fs` alone, against the in-process emulator: a time set by
//! `utimes(2)` is recorded in the object's metadata where gcsfuse keeps it (at once on a
//! closed file, at the end of the writing on an open one, as `cp -p` and `tar -x` set it),
//! appends after it record the present time, a size change records none, and the times
//! gcsfuse and gcloud storage record are what a lookup shows.

mod fs_support;

use fs_support::FsEnv;
use rapidfs::fs::{SetAttr, ROOT_INO};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// 2020-01-02T03:04:05.5Z, as `touch -d` or a tarball would give it.
fn then() -> SystemTime {
    UNIX_EPOCH + Duration::new(1_577_934_245, 500_000_000)
}

fn set_mtime(mtime: SystemTime, fh: Option<u64>) -> SetAttr {
    SetAttr {
        size: None,
        mode: None,
        uid: None,
        gid: None,
        mtime: Some(mtime),
        fh,
    }
}

/// (name, mtime) of each entry of the root as `ls -l` lists them (readdirplus).
async fn listed_mtimes(fs: &rapidfs::fs::Fs) -> Vec<(String, SystemTime)> {
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
        let (e, opened) = fs
            .create(ROOT_INO, "copy", libc::O_WRONLY)
            .await
            .expect("create");
        fs.write(opened.fh, 0, vec![7u8; 1000].into())
            .await
            .expect("write");
        fs.setattr(e.attr.ino, set_mtime(then(), Some(opened.fh)))
            .await
            .expect("futimens");
        // Then fchown: its reply is what the kernel caches for the file.
        let chown = SetAttr {
            uid: Some(e.attr.uid),
            gid: Some(e.attr.gid),
            mtime: None,
            ..set_mtime(then(), Some(opened.fh))
        };
        let attr = fs.setattr(e.attr.ino, chown).await.expect("fchown");
        assert_eq!(attr.mtime, then(), "the time set, not the object's yet");
        fs.flush(opened.fh).await.expect("close");
        assert_eq!(recorded(&env, "copy").await, Some(then()));
        assert_eq!(fs.getattr(e.attr.ino).await.expect("stat").mtime, then());
        fs.release_write(opened.fh).await;
        assert_eq!(fs.getattr(e.attr.ino).await.expect("stat").mtime, then());
        let meta = env.client.get_object("b", "copy").await.expect("object");
        assert_eq!(meta.size, 1000, "the bytes are all there");
    });
}

#[test]
fn appending_after_a_recorded_time_records_the_present_one() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        let (e, opened) = fs
            .create(ROOT_INO, "log", libc::O_WRONLY)
            .await
            .expect("create");
        fs.write(opened.fh, 0, b"one\n".to_vec().into())
            .await
            .expect("write");
        fs.flush(opened.fh).await.expect("close");
        fs.release_write(opened.fh).await;
        let ino = e.attr.ino;
        fs.setattr(ino, set_mtime(then(), None))
            .await
            .expect("touch -d");
        assert_eq!(recorded(&env, "log").await, Some(then()));

        let before = SystemTime::now();
        let again = fs.open_write(ino, false).await.expect("open");
        fs.write(again.fh, 4, b"two\n".to_vec().into())
            .await
            .expect("append");
        fs.flush(again.fh).await.expect("close");
        fs.release_write(again.fh).await;
        let now = recorded(&env, "log").await.expect("a time");
        assert!(now >= before, "{now:?} is older than the append");
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
            ..set_mtime(SystemTime::now(), None)
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
