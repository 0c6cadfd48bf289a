//! Metadata through `fs` alone, against the in-process emulator: the stat and negative TTLs,
//! the kernel's forget, and namespace changes seen at once however long the TTLs.

mod fs_support;

use fs_support::{assert_no_entry, FsEnv};
use rapidfs::emulator::Faults;
use rapidfs::fs::{Errno, Kind, ROOT_INO};
use std::time::Duration;

const TTL: Duration = Duration::from_millis(300);

/// A name's answer is trusted for the TTLs; once they expired, a new version behind the
/// mount's back is a new inode with its own size (an inode stays with its generation).
#[test]
fn a_lookup_is_trusted_for_the_ttl_then_finds_the_new_version() {
    let env = FsEnv::new("b", |cfg| {
        cfg.fs.stat_ttl_ms = TTL.as_millis() as u64;
        cfg.fs.list_ttl_ms = TTL.as_millis() as u64;
    });
    env.put("f", b"abc");
    let fs = &env.fs;
    env.rt.block_on(async {
        let first = fs.lookup(ROOT_INO, "f").await.expect("f").attr;
        assert_eq!(first.size, 3);
        env.put("f", b"abcde");
        let calls = env.calls();
        assert_eq!(fs.lookup(ROOT_INO, "f").await.expect("f").attr.size, 3);
        assert_eq!(fs.getattr(first.ino).await.expect("getattr").size, 3);
        assert_eq!(env.calls(), calls, "answered from the caches");
        tokio::time::sleep(TTL + Duration::from_millis(100)).await;
        let now = fs.lookup(ROOT_INO, "f").await.expect("f").attr;
        assert_eq!(now.size, 5, "expired: fetched again");
        assert_ne!(now.ino, first.ino, "a new generation is a new inode");
        assert_eq!(fs.getattr(first.ino).await.expect("old").size, 3);
    });
}

#[test]
fn a_missing_name_stays_missing_for_the_negative_ttl_without_a_call() {
    let env = FsEnv::new("b", |cfg| {
        cfg.fs.list_ttl_ms = 0;
        cfg.fs.negative_ttl_ms = TTL.as_millis() as u64;
    });
    let fs = &env.fs;
    env.rt.block_on(async {
        assert_no_entry(fs, ROOT_INO, "g").await;
        env.put("g", b"now here");
        let calls = env.calls();
        assert_no_entry(fs, ROOT_INO, "g").await;
        assert_eq!(env.calls(), calls, "answered from the negative cache");
        tokio::time::sleep(TTL + Duration::from_millis(100)).await;
        assert_eq!(fs.lookup(ROOT_INO, "g").await.expect("found").attr.size, 8);
    });
}

#[test]
fn a_forgotten_inode_is_gone_and_a_new_lookup_makes_it_again() {
    let env = FsEnv::new("b", |_| {});
    env.put("f", b"abc");
    let fs = &env.fs;
    env.rt.block_on(async {
        let ino = fs.lookup(ROOT_INO, "f").await.expect("f").attr.ino;
        assert_eq!(fs.lookup(ROOT_INO, "f").await.expect("f").attr.ino, ino);
        fs.forget(ino, 1);
        assert!(fs.getattr(ino).await.is_ok(), "one lookup still held");
        fs.forget(ino, 1);
        assert_eq!(fs.getattr(ino).await.map(|_| ()), Err(Errno::ENOENT));
        let again = fs.lookup(ROOT_INO, "f").await.expect("f");
        assert_eq!(again.attr.size, 3);
        assert!(fs.getattr(again.attr.ino).await.is_ok());
    });
}

#[test]
fn namespace_changes_are_seen_at_once_whatever_the_ttls() {
    let env = FsEnv::new("b", |cfg| {
        let hour = 3_600_000;
        cfg.fs.stat_ttl_ms = hour;
        cfg.fs.list_ttl_ms = hour;
        cfg.fs.negative_ttl_ms = hour;
    });
    env.put("d/a", b"a");
    env.put("d/b", b"b");
    let fs = &env.fs;
    env.rt.block_on(async {
        let d = fs.lookup(ROOT_INO, "d").await.expect("d").attr.ino;
        assert!(fs.lookup(d, "a").await.is_ok());
        assert_no_entry(fs, d, "new").await;

        fs.unlink(d, "a").await.expect("unlink");
        assert_no_entry(fs, d, "a").await;

        let (_, opened) = fs.create(d, "new", libc::O_WRONLY).await.expect("create");
        fs.flush(opened.fh).await.expect("close");
        fs.release_write(opened.fh).await;
        assert_eq!(
            fs.lookup(d, "new").await.expect("created").attr.kind,
            Kind::File
        );

        fs.rename(d, "b", ROOT_INO, "moved", 0)
            .await
            .expect("rename");
        assert_no_entry(fs, d, "b").await;
        assert_eq!(
            fs.lookup(ROOT_INO, "moved").await.expect("moved").attr.size,
            1
        );

        fs.mkdir(ROOT_INO, "m").await.expect("mkdir");
        assert_eq!(
            fs.lookup(ROOT_INO, "m").await.expect("m").attr.kind,
            Kind::Dir
        );
        fs.rmdir(ROOT_INO, "m").await.expect("rmdir");
        assert_no_entry(fs, ROOT_INO, "m").await;
    });
}

/// A rename or an unlink the server carried out, whose answer was lost with its connection,
/// succeeds: the retry that finds the source gone tells it from a real failure.
#[test]
fn a_rename_or_unlink_whose_answer_was_lost_succeeds() {
    let env = FsEnv::new("b", |_| {});
    env.put("a", b"abc");
    env.put("c", b"c");
    let fs = &env.fs;
    env.emu().set_faults(rapidfs::emulator::Faults {
        lose_answer_every: Some(1),
        ..Default::default()
    });
    env.rt.block_on(async {
        fs.rename(ROOT_INO, "a", ROOT_INO, "b", 0)
            .await
            .expect("rename");
        assert_no_entry(fs, ROOT_INO, "a").await;
        assert_eq!(fs.lookup(ROOT_INO, "b").await.expect("b").attr.size, 3);
        fs.unlink(ROOT_INO, "c").await.expect("unlink");
        assert_no_entry(fs, ROOT_INO, "c").await;
    });
    assert!(env.emu().stats().faults_injected >= 2);
}

/// An empty directory that also has a marker object (`m/`, as other tools write one) goes
/// at the first `rmdir`: the marker would keep the folder from being deleted.
#[test]
fn an_empty_directory_with_a_marker_object_is_removed_at_once() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        env.client
            .create_folder(&env.bucket, "m/", false)
            .await
            .expect("folder");
        env.put("m/", b"");
        assert_eq!(
            fs.lookup(ROOT_INO, "m").await.expect("m").attr.kind,
            Kind::Dir
        );
        fs.rmdir(ROOT_INO, "m").await.expect("rmdir");
        assert_no_entry(fs, ROOT_INO, "m").await;
        assert!(!env
            .client
            .folder_exists(&env.bucket, "m/")
            .await
            .expect("folder asked"));
    });
}

/// A directory whose listing comes in pages shorter than asked for (the service may send
/// them) is not taken for empty because its first page holds only its marker object: its
/// rmdir is refused before anything is deleted.
#[test]
fn rmdir_reads_past_a_short_first_page() {
    let env = FsEnv::new("b", |_| {});
    env.put("m/", b"");
    env.put("m/x", b"x");
    let fs = &env.fs;
    env.rt.block_on(async {
        assert_eq!(
            fs.lookup(ROOT_INO, "m").await.expect("m").attr.kind,
            Kind::Dir
        );
        env.emu().set_faults(rapidfs::emulator::Faults {
            list_page_limit: Some(1),
            ..Default::default()
        });
        assert_eq!(fs.rmdir(ROOT_INO, "m").await, Err(Errno(libc::ENOTEMPTY)));
        env.emu().set_faults(rapidfs::emulator::Faults::default());
        env.client
            .get_object(&env.bucket, "m/")
            .await
            .expect("the marker is still there");
        assert_eq!(
            fs.lookup(ROOT_INO, "m").await.expect("m").attr.kind,
            Kind::Dir
        );
    });
}

/// `rename(RENAME_NOREPLACE)` of a file replaced behind the mount's back (its generation
/// known here is gone) onto a free name moves it: only a taken destination is EEXIST.
#[test]
fn a_noreplace_rename_of_a_file_replaced_elsewhere_moves_it() {
    let env = FsEnv::new("b", |_| {});
    env.put("x", b"a");
    env.put("z", b"zzz");
    env.put("taken", b"t");
    let fs = &env.fs;
    env.rt.block_on(async {
        fs.lookup(ROOT_INO, "x").await.expect("x");
        fs.lookup(ROOT_INO, "z").await.expect("z");
        env.put("x", b"bb");
        env.put("z", b"zz");
        assert_eq!(
            fs.rename(ROOT_INO, "x", ROOT_INO, "y", libc::RENAME_NOREPLACE)
                .await,
            Ok(())
        );
        assert_eq!(fs.lookup(ROOT_INO, "y").await.expect("y").attr.size, 2);
        assert_eq!(
            fs.rename(ROOT_INO, "z", ROOT_INO, "taken", libc::RENAME_NOREPLACE)
                .await,
            Err(Errno(libc::EEXIST))
        );
    });
}

/// An `unlink` or `rmdir` of a name deleted behind the mount's back answers ENOENT and takes
/// the name out of the caches: it is not listed or found again for the TTLs.
#[test]
fn removing_a_name_already_gone_forgets_it() {
    let env = FsEnv::new("b", |_| {});
    env.put("x", b"x");
    let fs = &env.fs;
    env.rt.block_on(async {
        fs.mkdir(ROOT_INO, "d").await.expect("mkdir");
        fs.lookup(ROOT_INO, "x").await.expect("x");
        env.client
            .delete_object(&env.bucket, "x", None)
            .await
            .expect("deleted elsewhere");
        env.client
            .delete_folder(&env.bucket, "d/")
            .await
            .expect("deleted elsewhere");
        assert_eq!(fs.unlink(ROOT_INO, "x").await, Err(Errno::ENOENT));
        assert_eq!(fs.rmdir(ROOT_INO, "d").await, Err(Errno::ENOENT));
        for name in ["x", "d"] {
            assert_eq!(
                fs.lookup(ROOT_INO, name).await.map(|_| ()),
                Err(Errno::ENOENT),
                "{name} still found"
            );
        }
    });
}

/// A file open for reading reads on after it, or its directory, is renamed through the
/// mount: the moved object is the same bytes under another name (and, for a file, a new
/// generation), and POSIX leaves open descriptors alone.
#[test]
fn an_open_file_reads_on_after_a_rename_of_it_or_its_directory() {
    let env = FsEnv::new("b", |_| {});
    env.put("a", b"0123456789");
    env.put("d/f", b"abcdef");
    let fs = &env.fs;
    env.rt.block_on(async {
        let a = fs.lookup(ROOT_INO, "a").await.expect("a").attr.ino;
        let d = fs.lookup(ROOT_INO, "d").await.expect("d").attr.ino;
        let f = fs.lookup(d, "f").await.expect("f").attr.ino;
        let ha = fs.open(a, false, false).await.expect("open a").fh;
        let hf = fs.open(f, false, false).await.expect("open f").fh;
        fs.rename(ROOT_INO, "a", ROOT_INO, "b", 0)
            .await
            .expect("rename a");
        fs.rename(ROOT_INO, "d", ROOT_INO, "e", 0)
            .await
            .expect("rename d");
        assert_eq!(
            &fs.read(ha, 0, 100).await.expect("read a")[..],
            b"0123456789"
        );
        assert_eq!(&fs.read(hf, 0, 100).await.expect("read f")[..], b"abcdef");
        fs.release(ha);
        fs.release(hf);
    });
}

/// A directory rename that the service answers with an operation not done yet (as it does
/// for a large folder) is waited for: `rename` returns once the service has moved the
/// folder, and its files read under their new names.
#[test]
fn a_directory_rename_the_service_finishes_later_is_waited_for() {
    let env = FsEnv::new("b", |_| {});
    env.put("d/f", b"abcdef");
    env.put("d/e/g", b"xyz");
    let pending = Duration::from_millis(300);
    env.emu().set_faults(Faults {
        rename_folder_pending_ms: Some(pending.as_millis() as u64),
        ..Faults::default()
    });
    let fs = &env.fs;
    env.rt.block_on(async {
        fs.lookup(ROOT_INO, "d").await.expect("d");
        let started = std::time::Instant::now();
        fs.rename(ROOT_INO, "d", ROOT_INO, "moved", 0)
            .await
            .expect("rename");
        assert!(
            started.elapsed() >= pending,
            "rename returned after {:?}, before the service had moved the folder",
            started.elapsed()
        );
        assert_no_entry(fs, ROOT_INO, "d").await;
        let moved = fs.lookup(ROOT_INO, "moved").await.expect("moved").attr.ino;
        let e = fs.lookup(moved, "e").await.expect("moved/e").attr.ino;
        let g = fs.lookup(e, "g").await.expect("moved/e/g").attr.ino;
        let h = fs.open(g, false, false).await.expect("open").fh;
        assert_eq!(&fs.read(h, 0, 100).await.expect("read")[..], b"xyz");
        fs.release(h);
        assert_eq!(
            env.client
                .get_object("b", "moved/f")
                .await
                .expect("moved/f")
                .size,
            6
        );
    });
    assert_eq!(env.emu().stats().faults_injected, 1);
}

/// A new name the service's naming rules refuse is refused at once, with a local errno, and
/// nothing reaches the service: the create of a file answers before the service does, so
/// before, its refusal came only at the close (EIO), after the name had been listed.
#[test]
fn names_the_service_would_refuse_are_refused_at_once() {
    let env = FsEnv::new("b", |_| {});
    env.put("f", b"abc");
    let fs = &env.fs;
    let calls = || {
        let st = env.emu().stats();
        (st.calls, st.write_streams)
    };
    env.rt.block_on(async {
        let well_known = fs
            .mkdir(ROOT_INO, ".well-known")
            .await
            .expect("mkdir")
            .attr
            .ino;
        // A bucket with a hierarchical namespace holds folder names of up to 512 bytes...
        let mut long = ROOT_INO;
        for c in ['p', 'q'] {
            long = fs
                .mkdir(long, &c.to_string().repeat(250))
                .await
                .expect("mkdir")
                .attr
                .ino;
        }
        let full = fs
            .mkdir(long, &"r".repeat(9))
            .await
            .expect("512 bytes")
            .attr
            .ino;
        // ...and 50 folder levels.
        let mut deep = ROOT_INO;
        for _ in 0..50 {
            deep = fs.mkdir(deep, "d").await.expect("mkdir").attr.ino;
        }
        let before = calls();
        let einval = Some(Errno::EINVAL);
        let too_long = Some(Errno::ENAMETOOLONG);
        assert_eq!(
            fs.create(ROOT_INO, "a\nb", libc::O_WRONLY).await.err(),
            einval
        );
        assert_eq!(fs.mkdir(ROOT_INO, "a\rb").await.err(), einval);
        assert_eq!(fs.symlink(ROOT_INO, "l\n", "f").await.err(), einval);
        assert_eq!(
            fs.rename(ROOT_INO, "f", ROOT_INO, "g\n", 0).await.err(),
            einval
        );
        assert_eq!(fs.mkdir(well_known, "acme-challenge").await.err(), einval);
        assert_eq!(fs.mkdir(long, &"s".repeat(10)).await.err(), too_long);
        assert_eq!(fs.mkdir(full, "u").await.err(), too_long);
        assert_eq!(fs.mkdir(deep, "d").await.err(), too_long);
        assert_eq!(calls(), before, "refused without a call");
        // A file's own name (up to 255 bytes) may take its key past 512 bytes.
        let name = "t".repeat(255);
        fs.rename(ROOT_INO, "f", full, &name, 0)
            .await
            .expect("rename");
        assert_eq!(fs.lookup(full, &name).await.expect("moved").attr.size, 3);
    });
}

/// A directory renamed to a longer name would take a folder under it past the service's 512
/// bytes: the service refuses the whole rename (EINVAL), and nothing moves.
#[test]
fn a_directory_rename_that_would_make_a_folder_name_too_long_moves_nothing() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        let a = fs.mkdir(ROOT_INO, "a").await.expect("mkdir").attr.ino;
        let (b, c) = ("b".repeat(250), "c".repeat(200));
        let b_ino = fs.mkdir(a, &b).await.expect("mkdir").attr.ino;
        let c_ino = fs.mkdir(b_ino, &c).await.expect("mkdir").attr.ino;
        let (_, opened) = fs.create(c_ino, "f", libc::O_WRONLY).await.expect("create");
        fs.flush(opened.fh).await.expect("close");
        fs.release_write(opened.fh).await;
        // "a/b.../c.../" is 454 bytes; with "z" * 60 in place of "a" it would be 513.
        let renamed = fs.rename(ROOT_INO, "a", ROOT_INO, &"z".repeat(60), 0).await;
        assert_eq!(renamed.err(), Some(Errno::EINVAL));
        assert!(fs.lookup(c_ino, "f").await.is_ok(), "nothing moved");
        let shorter = "z".repeat(59);
        fs.rename(ROOT_INO, "a", ROOT_INO, &shorter, 0)
            .await
            .expect("512 bytes");
        let z = fs.lookup(ROOT_INO, &shorter).await.expect("z").attr.ino;
        let b_moved = fs.lookup(z, &b).await.expect("b").attr.ino;
        let c_moved = fs.lookup(b_moved, &c).await.expect("c").attr.ino;
        assert!(fs.lookup(c_moved, "f").await.is_ok());
    });
}

/// A read of a version replaced behind the mount's back fails with ESTALE, and the name is
/// then found anew (the kernel is asked to let go of it), though the TTLs would still trust
/// the old answer: the next lookup finds the new version as a new inode.
#[test]
fn a_read_that_finds_its_version_gone_lets_the_name_be_found_anew() {
    let env = FsEnv::new("b", |_| {});
    env.put("f", b"old");
    let fs = &env.fs;
    let old = env.ino("f");
    env.rt.block_on(async {
        let fh = fs.open(old, false, false).await.expect("open").fh;
        env.put("f", b"the new one");
        assert_eq!(fs.read(fh, 0, 100).await, Err(Errno::ESTALE));
        fs.release(fh);
        assert!(
            fs.inodes_to_shed().contains(&(ROOT_INO, "f".to_string())),
            "the kernel is asked to drop the name"
        );
        let now = fs.lookup(ROOT_INO, "f").await.expect("lookup").attr;
        assert_ne!(now.ino, old, "the new version is a new inode");
        let fh = fs.open(now.ino, false, false).await.expect("open").fh;
        assert_eq!(
            &fs.read(fh, 0, 100).await.expect("read")[..],
            b"the new one"
        );
        fs.release(fh);
    });
}
