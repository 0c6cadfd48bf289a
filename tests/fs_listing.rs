//! Listings and lookups through `fs` alone, counted in the emulator's calls: what a close of
//! a written file invalidates, what a lookup in a directory too large to list costs, and a
//! listing that overtakes a create.

mod fs_support;

use fs_support::{assert_no_entry, FsEnv};
use rapidfs::fs::{Errno, Kind, ROOT_INO};

/// Closing a file that wrote gives its directory's cached listing the new size, and leaves
/// every other listing alone: lookups in both directories after it cost no call.
#[test]
fn closing_a_written_file_updates_only_its_directory_listing() {
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
        let new = fs.lookup(d1, "new").await.expect("new");
        assert_eq!(new.attr.size, 5, "the listing holds the size written");
        assert_eq!(env.calls().0, lists, "both listings answered");
    });
}

/// Creates 50 files one after another in `d/`, which holds `existing` files first, each name
/// looked up first as the kernel does before a create, removes one, and checks every name
/// and size; returns the ListObjects calls this cost.
fn create_fifty_and_check(env: &FsEnv, existing: usize) -> u64 {
    env.put("d/seed", b"x");
    for i in 0..existing {
        env.put(&format!("d/e{i:03}"), b"x");
    }
    let fs = &env.fs;
    env.rt.block_on(async {
        let d = fs.lookup(ROOT_INO, "d").await.expect("d").attr.ino;
        let (lists, _) = env.calls();
        for i in 0..50 {
            let name = format!("f{i:03}");
            assert_eq!(fs.lookup(d, &name).await.err(), Some(Errno::ENOENT));
            let (_, opened) = fs.create(d, &name, libc::O_WRONLY).await.expect("create");
            fs.write(opened.fh, 0, bytes::Bytes::from(vec![7u8; i + 1]))
                .await
                .expect("write");
            fs.flush(opened.fh).await.expect("flush");
            fs.release_write(opened.fh).await;
        }
        fs.unlink(d, "f007").await.expect("unlink");
        for i in 0..50 {
            let name = format!("f{i:03}");
            let found = fs.lookup(d, &name).await;
            if i == 7 {
                assert_eq!(found.err(), Some(Errno::ENOENT), "{name} was removed");
            } else {
                assert_eq!(found.expect(&name).attr.size, i as u64 + 1, "{name}");
            }
        }
        env.calls().0 - lists
    })
}

/// A directory that fits one listing page is listed once for all of it: each create adds
/// its file to the cached listing, each close its size, each unlink takes its name out
/// (dropping the listing instead cost a listing of the whole directory per file).
#[test]
fn creating_many_files_lists_their_directory_once() {
    let env = FsEnv::new("b", |_| {});
    let lists = create_fifty_and_check(&env, 0);
    assert!(lists <= 1, "listed once, not once per file: {lists}");
}

/// A directory that grows past a page while it is filled keeps its cached listing, edited
/// on every create (a copy of a few pages costs less than the probes it saves).
#[test]
fn a_directory_growing_past_a_page_keeps_its_listing() {
    let env = FsEnv::new("b", |cfg| cfg.fs.list_page_size = 8);
    let lists = create_fifty_and_check(&env, 0);
    assert!(lists <= 1, "listed once: {lists}");
}

/// A directory of a few pages from the start is probed by name at first, then listed whole
/// and answered from its listing, edited like a one-page one: the creates that follow cost
/// no probe each (about a hundred calls before, one per lookup), and every answer is still
/// right.
#[test]
fn a_directory_of_a_few_pages_being_filled_is_listed_not_probed_per_file() {
    let env = FsEnv::new("b", |cfg| cfg.fs.list_page_size = 8);
    let lists = create_fifty_and_check(&env, 30);
    assert!(lists <= 25, "16 probes and a listing of 6 pages: {lists}");
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
        assert_no_entry(fs, d, "nope").await;
        assert_eq!(env.calls(), (before.0 + 4, before.1));
        let before = env.calls();
        assert_eq!(fs.lookup(d, "y").await.expect("y").attr.kind, Kind::File);
        assert_eq!(env.calls(), (before.0 + 2, before.1 + 1));
    });
}

/// Removing an empty directory (a marker object, as flat buckets have them) that hid an
/// object of the same name shows the object: the parent's listing is listed again, not
/// merely edited to lose the name.
#[test]
fn removing_a_directory_shows_the_object_it_hid() {
    let env = FsEnv::new("b", |_| {});
    env.put("d/x", b"hidden");
    env.put("d/x/", b"");
    let fs = &env.fs;
    env.rt.block_on(async {
        let d = fs.lookup(ROOT_INO, "d").await.expect("d").attr.ino;
        let x = fs.lookup(d, "x").await.expect("x");
        assert_eq!(x.attr.kind, Kind::Dir, "the folder wins");
        fs.rmdir(d, "x").await.expect("rmdir");
        let x = fs.lookup(d, "x").await.expect("the object shows");
        assert_eq!(x.attr.kind, Kind::File);
        assert_eq!(x.attr.size, 6);
    });
}

/// Puts objects `d/f0000`, `d/f0001`, ... (`n` of them, one byte each).
fn put_files_in_d(env: &FsEnv, n: usize) {
    for i in 0..n {
        env.put(&format!("d/f{i:04}"), b"x");
    }
}

/// An `FsEnv` of `page_size` names a listing page and a negative TTL of `negative_ttl_ms`,
/// whose directory `d` holds `files` objects (see `put_files_in_d`).
fn env_with_d(page_size: u32, negative_ttl_ms: u64, files: usize) -> FsEnv {
    let env = FsEnv::new("b", |cfg| {
        cfg.fs.list_page_size = page_size;
        cfg.fs.negative_ttl_ms = negative_ttl_ms;
    });
    put_files_in_d(&env, files);
    env
}

/// Waits (up to 10 s) until two listings are cached: the root's, then `d/`'s.
async fn background_listing_of_d(fs: &rapidfs::fs::Fs) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while fs.metadata_usage().listings < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "d/ was not listed: {:?}",
            fs.metadata_usage()
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// A large directory read file by file (a DataLoader over a flat folder) is listed whole in
/// the background after some name probes: from then on its lookups, of names present or
/// missing, are answered from the listing without a call, and rightly.
#[test]
fn a_large_directory_probed_many_times_is_listed_once_and_answers_from_memory() {
    const FILES: usize = 300;
    let env = FsEnv::new("b", |cfg| cfg.fs.list_page_size = 10);
    for i in 0..FILES {
        env.put(&format!("d/f{i:04}"), &vec![b'x'; i]);
    }
    let fs = &env.fs;
    env.rt.block_on(async {
        let d = fs.lookup(ROOT_INO, "d").await.expect("d").attr.ino;
        let lookup = |i: usize| async move {
            let e = fs.lookup(d, &format!("f{i:04}")).await.expect("file");
            assert_eq!(e.attr.size, i as u64, "f{i:04}");
        };
        for i in 0..150 {
            lookup(i).await;
        }
        // The root's listing, then d's, listed in the background.
        background_listing_of_d(fs).await;
        let before = env.calls();
        for i in 150..FILES {
            lookup(i).await;
        }
        assert_no_entry(fs, d, "f9999").await;
        assert_eq!(env.calls(), before, "answered from the listing");
    });
}

/// A directory of a few pages whose names are asked for too slowly to be listed by a lookup
/// (here a negative TTL of 1 ms: never 16 probes within one) is still listed in the
/// background after 128 probes, and answers from memory after.
#[test]
fn a_directory_of_a_few_pages_read_slowly_is_still_listed_in_the_background() {
    let env = env_with_d(10, 1, 100);
    let fs = &env.fs;
    env.rt.block_on(async {
        let d = fs.lookup(ROOT_INO, "d").await.expect("d").attr.ino;
        for i in 0..130 {
            fs.lookup(d, &format!("f{:04}", i % 100))
                .await
                .expect("file");
        }
        // The root's listing, then d's, listed in the background.
        background_listing_of_d(fs).await;
        let before = env.calls();
        for i in 0..100 {
            fs.lookup(d, &format!("f{i:04}")).await.expect("file");
        }
        assert_eq!(env.calls(), before, "answered from the listing");
    });
}

/// A directory of more than 100 pages is listed by a lookup once, to learn that it is that
/// large, and keeps its probes after: one call a lookup, past the list TTL while it is in
/// use, and past the 128 probes after which a smaller one is listed in the background.
#[test]
fn a_directory_past_a_hundred_pages_is_tried_once_then_probed() {
    let env = FsEnv::new("b", |cfg| {
        cfg.fs.list_page_size = 2;
        cfg.fs.list_ttl_ms = 1_000;
    });
    put_files_in_d(&env, 250);
    let fs = &env.fs;
    env.rt.block_on(async {
        let d = fs.lookup(ROOT_INO, "d").await.expect("d").attr.ino;
        let before = env.calls();
        for i in 0..50 {
            fs.lookup(d, &format!("f{i:04}")).await.expect("file");
        }
        // One page finds it large, 100 pages find it past 100, and a probe per lookup.
        assert_eq!(env.calls().0, before.0 + 1 + 100 + 50);
        for _ in 0..3 {
            tokio::time::sleep(std::time::Duration::from_millis(400)).await;
            let before = env.calls();
            for i in 50..100 {
                fs.lookup(d, &format!("f{i:04}")).await.expect("file");
            }
            assert_eq!(env.calls().0, before.0 + 50, "one probe a lookup");
        }
    });
}

/// A directory listed by a lookup is listed again by one only after as many probes within a
/// negative TTL as that listing took pages: a listing never costs more calls than the
/// probes made before it (16 probes before each listing of 30 pages cost twice the calls).
#[test]
fn a_directory_is_listed_again_after_as_many_probes_as_it_has_pages() {
    let env = env_with_d(2, 3_000, 60);
    let fs = &env.fs;
    env.rt.block_on(async {
        let d = fs.lookup(ROOT_INO, "d").await.expect("d").attr.ino;
        let missing = |prefix: &'static str, i: usize| format!("{prefix}{i:03}");
        let before = env.calls().0;
        for i in 0..17 {
            let found = fs.lookup(d, &missing("x", i)).await;
            assert_eq!(found.err(), Some(Errno::ENOENT));
        }
        // One page finds it large, 16 probes, then the 17th lookup lists its 30 pages.
        assert_eq!(env.calls().0, before + 1 + 16 + 30);
        // Past the negative TTL the listing no longer vouches for missing names.
        tokio::time::sleep(std::time::Duration::from_millis(3_100)).await;
        let before = env.calls().0;
        for i in 0..30 {
            let found = fs.lookup(d, &missing("y", i)).await;
            assert_eq!(found.err(), Some(Errno::ENOENT));
        }
        assert_eq!(env.calls().0, before + 30, "30 probes, no listing yet");
        let found = fs.lookup(d, &missing("y", 30)).await;
        assert_eq!(found.err(), Some(Errno::ENOENT));
        assert_eq!(
            env.calls().0,
            before + 30 + 30,
            "then a listing of 30 pages"
        );
    });
}

/// A directory of more pages than a probe-started listing may take keeps its probes: no
/// listing of it is cached however many names are looked up.
#[test]
fn a_directory_past_the_listing_pages_stays_probed() {
    const FILES: usize = 300;
    // 150 pages of 2, past the 100 a listing started by probes may take.
    let env = FsEnv::new("b", |cfg| cfg.fs.list_page_size = 2);
    put_files_in_d(&env, FILES);
    let fs = &env.fs;
    env.rt.block_on(async {
        let d = fs.lookup(ROOT_INO, "d").await.expect("d").attr.ino;
        for i in 0..FILES {
            fs.lookup(d, &format!("f{i:04}")).await.expect("file");
        }
        // Time for a listing of all 150 pages, had one started.
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        assert_eq!(fs.metadata_usage().listings, 1, "only the root's listing");
        let before = env.calls();
        fs.lookup(d, "f0007").await.expect("file");
        assert_eq!(env.calls().0, before.0 + 1, "still one probe per lookup");
    });
}

/// A create without O_EXCL goes out with the file's first flush, so a listing asked for
/// before then comes back without the file; the listing still shows it.
#[test]
fn a_listing_that_overtakes_a_create_still_shows_the_file() {
    let env = FsEnv::new("b", |_| {});
    env.put("d/a", b"x");
    let fs = &env.fs;
    env.rt.block_on(async {
        let d = fs.lookup(ROOT_INO, "d").await.expect("d").attr.ino;
        let new = env.create_unseen(d, "new").await;
        let (lists, _) = env.calls();
        fs.lookup(d, "a").await.expect("a");
        assert_eq!(env.calls().0, lists + 1, "d was listed");
        assert!(
            env.client.get_object("b", "d/new").await.is_err(),
            "the service has not seen the create"
        );
        assert_eq!(fs.lookup(d, "new").await.expect("listed").attr.size, 0);
        fs.write(new, 0, bytes::Bytes::from_static(b"hi"))
            .await
            .expect("write");
        fs.flush(new).await.expect("flush");
        fs.release_write(new).await;
        let made = env.client.get_object("b", "d/new").await.expect("created");
        assert_eq!(made.size, 2);
        assert_eq!(fs.lookup(d, "new").await.expect("new").attr.size, 2);
    });
}

/// Names `a` to `e` read through one directory handle with readdirplus: the first call
/// takes `.`, `..` and `a`; `between` runs; a second call takes the rest. Every name listed.
async fn readdirplus_around(
    env: &FsEnv,
    between: impl std::future::Future<Output = ()>,
) -> Vec<String> {
    let fs = &env.fs;
    let fh = fs.opendir(ROOT_INO).expect("opendir");
    let mut names = Vec::new();
    let mut next = 0;
    fs.readdirplus(fh, 0, |item, _| {
        if names.len() == 3 {
            return true;
        }
        names.push(item.name.to_string());
        next = item.offset;
        false
    })
    .await
    .expect("first page");
    assert_eq!(names, [".", "..", "a"]);
    between.await;
    fs.readdirplus(fh, next, |item, _| {
        names.push(item.name.to_string());
        false
    })
    .await
    .expect("the rest");
    fs.releasedir(fh);
    names
}

/// An ls -l whose directory read takes several calls while a name in the directory is
/// unlinked: the handle's listing, taken at the first call, does not give the unlinked name
/// an inode again, which the kernel would then keep for the entry TTL. Whether or not the
/// directory's listing is cached (a list TTL of 0 keeps none).
#[test]
fn readdirplus_does_not_bring_back_a_name_unlinked_meanwhile() {
    for list_ttl_ms in [60_000, 0] {
        let env = FsEnv::new("b", |c| c.fs.list_ttl_ms = list_ttl_ms);
        for name in ["a", "b", "c", "d", "e"] {
            env.put(name, b"x");
        }
        let fs = &env.fs;
        env.rt.block_on(async {
            let names = readdirplus_around(&env, async {
                fs.unlink(ROOT_INO, "d").await.expect("unlink");
            })
            .await;
            assert_eq!(
                names,
                [".", "..", "a", "b", "c", "e"],
                "list TTL {list_ttl_ms}"
            );
            assert_no_entry(fs, ROOT_INO, "d").await;
        });
    }
}

/// A name renamed away between two readdirplus calls of one handle is left out like an
/// unlinked one, and a name unlinked and then created again is listed.
#[test]
fn readdirplus_leaves_out_a_name_renamed_away_but_lists_one_made_again() {
    let env = FsEnv::new("b", |_| {});
    for name in ["a", "b", "c", "d", "e"] {
        env.put(name, b"x");
    }
    let fs = &env.fs;
    env.rt.block_on(async {
        let names = readdirplus_around(&env, async {
            fs.rename(ROOT_INO, "b", ROOT_INO, "z", 0)
                .await
                .expect("rename");
            fs.unlink(ROOT_INO, "d").await.expect("unlink");
            let (_, made) = fs
                .create(ROOT_INO, "d", libc::O_WRONLY)
                .await
                .expect("create again");
            fs.flush(made.fh).await.expect("close");
            fs.release_write(made.fh).await;
        })
        .await;
        assert_eq!(names, [".", "..", "a", "c", "d", "e"]);
    });
}
