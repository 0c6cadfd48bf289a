//! The bounds of the metadata, through `fs` alone: listings beyond `fs.metadata_cache_mb`
//! are dropped least recently used first and listed again when needed (never answering
//! wrong), and an inode the kernel forgot is gone.

mod fs_support;

use fs_support::FsEnv;
use rapidfs::fs::{Errno, Fs, ROOT_INO};

const DIRS: usize = 80;
const FILES: usize = 300;

/// The object name of file `f` in directory `d`, long enough that the listings of all
/// directories together outweigh 1 MiB; its content is its own name, so sizes differ.
fn name(d: usize, f: usize) -> String {
    format!("dir{d:03}/a_sample_file_with_a_long_name_{f:05}.bin")
}

/// Lists directory `d` through a handle and checks every name, then looks each one up and
/// checks its size; forgets every lookup again, as the kernel would.
async fn walk_dir(fs: &Fs, d: usize) {
    let dir = fs
        .lookup(ROOT_INO, &format!("dir{d:03}"))
        .await
        .expect("dir")
        .attr
        .ino;
    let fh = fs.opendir(dir).expect("opendir");
    let mut names = Vec::new();
    fs.readdir(fh, 0, |item| {
        names.push(item.name.to_string());
        false
    })
    .await
    .expect("readdir");
    fs.releasedir(fh);
    let want: Vec<String> = [".".to_string(), "..".to_string()]
        .into_iter()
        .chain((0..FILES).map(|f| name(d, f).split_once('/').unwrap().1.to_string()))
        .collect();
    assert_eq!(names, want, "listing of dir{d:03}");
    for f in 0..FILES {
        let full = name(d, f);
        let e = fs
            .lookup(dir, full.split_once('/').unwrap().1)
            .await
            .unwrap_or_else(|e| panic!("lookup {full}: errno {}", e.0));
        assert_eq!(e.attr.size, full.len() as u64, "{full}");
        fs.forget(e.attr.ino, 1);
    }
    fs.forget(dir, 1);
}

/// Under a 1 MiB cap, walking 80 directories of 300 files (about 1.9 MiB of listings) keeps
/// the cached listings under the cap, drops the oldest, and a second walk lists them again
/// and still finds every name and size; a missing name stays missing.
#[test]
fn listings_over_the_cap_are_dropped_and_listed_again_correctly() {
    let env = FsEnv::new("b", |cfg| cfg.fs.metadata_cache_mb = 1);
    for d in 0..DIRS {
        for f in 0..FILES {
            let n = name(d, f);
            env.put(&n, n.as_bytes());
        }
    }
    let fs = &env.fs;
    env.rt.block_on(async {
        for d in 0..DIRS {
            walk_dir(fs, d).await;
        }
        let usage = fs.metadata_usage();
        assert!(usage.listing_bytes <= 1 << 20, "{usage:?}");
        assert!(
            usage.listings < DIRS as u64,
            "some listings dropped: {usage:?}"
        );
        assert!(usage.listings > 0, "the cap still caches: {usage:?}");
        let (lists, _) = env.calls();
        for d in 0..DIRS {
            walk_dir(fs, d).await;
        }
        assert!(env.calls().0 > lists, "dropped listings were listed again");
        let dir = fs.lookup(ROOT_INO, "dir000").await.expect("dir").attr.ino;
        assert_eq!(fs.lookup(dir, "missing").await.err(), Some(Errno::ENOENT));
    });
}

/// The kernel's last forget of an inode removes it: its number answers ENOENT and the
/// table is back to the root alone; the name gets a fresh inode when looked up again.
#[test]
fn a_forgotten_inode_is_gone() {
    let env = FsEnv::new("b", |_| {});
    env.put("d/f", b"hello");
    let fs = &env.fs;
    env.rt.block_on(async {
        assert_eq!(fs.metadata_usage().inodes, 1, "the root alone");
        let d = fs.lookup(ROOT_INO, "d").await.expect("d").attr.ino;
        let f = fs.lookup(d, "f").await.expect("f").attr.ino;
        fs.lookup(d, "f").await.expect("f again");
        assert_eq!(fs.metadata_usage().inodes, 3);
        fs.forget(f, 1);
        assert!(fs.getattr(f).await.is_ok(), "one lookup still held");
        fs.forget(f, 1);
        fs.forget(d, 1);
        assert_eq!(fs.metadata_usage().inodes, 1, "only the root is left");
        assert_eq!(fs.getattr(f).await.err(), Some(Errno::ENOENT));
        assert_eq!(fs.getattr(d).await.err(), Some(Errno::ENOENT));
        let again = fs.lookup(ROOT_INO, "d").await.expect("d again").attr.ino;
        assert_eq!(fs.metadata_usage().inodes, 2, "a fresh inode");
        assert_eq!(again, d, "numbers follow names (plain readdir shows them)");
    });
}

/// The warm-up lists every directory of the tree (nested ones too) into the cache; a walk
/// with a lookup of every name then costs no call at all.
#[test]
fn warm_up_lists_the_tree_and_the_walk_after_it_makes_no_call() {
    let env = FsEnv::new("b", |_| {});
    for d in 0..4 {
        for f in 0..FILES {
            let n = name(d, f);
            env.put(&n, n.as_bytes());
        }
    }
    env.put("deep/er/still/leaf.txt", b"leaf");
    let fs = &env.fs;
    env.rt.block_on(async {
        let done = fs.warm_metadata().await;
        // The root, dir000..dir003, deep, deep/er, deep/er/still.
        assert_eq!(done.directories, 8, "{done:?}");
        assert_eq!(done.entries, 5 + 4 * FILES as u64 + 3, "{done:?}");
        assert!(!done.capped && done.failed == 0, "{done:?}");
        assert_eq!(fs.metadata_usage().listings, 8);
        let before = env.calls();
        for d in 0..4 {
            walk_dir(fs, d).await;
        }
        let mut ino = ROOT_INO;
        for part in ["deep", "er", "still", "leaf.txt"] {
            ino = fs.lookup(ino, part).await.expect(part).attr.ino;
        }
        assert_eq!(env.calls(), before, "every answer came from the warm-up");
    });
}

/// Under a 1 MiB cap the warm-up stops short of it instead of evicting what it listed (two
/// listings at a time, so that few are in flight when the cap is reached).
#[test]
fn warm_up_stops_at_the_cap() {
    let env = FsEnv::new("b", |cfg| {
        cfg.fs.metadata_cache_mb = 1;
        cfg.fs.parallel_list_workers = 2;
    });
    for d in 0..DIRS {
        for f in 0..FILES {
            let n = name(d, f);
            env.put(&n, n.as_bytes());
        }
    }
    let fs = &env.fs;
    env.rt.block_on(async {
        let done = fs.warm_metadata().await;
        assert!(done.capped, "{done:?}");
        assert!(done.directories < DIRS as u64, "{done:?}");
        let usage = fs.metadata_usage();
        assert!(usage.listing_bytes <= 1 << 20, "{usage:?}");
        walk_dir(fs, DIRS - 1).await;
    });
}
