//! The writer's state machine through `fs` alone, against the in-process emulator: a writer
//! fenced by another stays failed, the close of a file's only writing handle ends its
//! stream (and a dup writing on after it is fenced like the stream), a rewrite stages then uploads a new generation, a create
//! sent without waiting for its answer is made good by the first flush, files unlinked or
//! renamed while open go on writing, a handle closing late never shrinks the file, an fsync
//! through a reading handle covers what the writer wrote, and a directory's fsync fails
//! with a create in it that the service refused.

mod fs_support;

use fs_support::FsEnv;
use rapidfs::emulator::Faults;
use rapidfs::fs::{Errno, Fs, ROOT_INO};

/// Creates `name` in the root with 1,000 bytes of 1 made durable by fsync, its handle still
/// streaming: its inode and handle.
async fn created_with_a_thousand_bytes(fs: &Fs, name: &str) -> (u64, u64) {
    let (ino, fh) = written_a_thousand_bytes(fs, name).await;
    fs.fsync(ino, fh).await.expect("fsync");
    (ino, fh)
}

/// Creates `name` in the root with 1,000 bytes of 1 and closes a descriptor of it (which
/// ends its stream), its handle still open as a dup would keep it: its inode and handle.
async fn closed_with_a_thousand_bytes(fs: &Fs, name: &str) -> (u64, u64) {
    let (ino, fh) = written_a_thousand_bytes(fs, name).await;
    fs.flush(fh).await.expect("close flushes");
    (ino, fh)
}

/// The bytes of object `name` of bucket "b", as the service holds them.
async fn in_bucket(env: &FsEnv, name: &str) -> bytes::Bytes {
    let meta = env.client.get_object("b", name).await.expect("object");
    env.client
        .read_once("b", name, meta.generation, 0, meta.size)
        .await
        .expect("read")
}

/// Creates `name` in the root and writes 1,000 bytes of 1: its inode and handle.
async fn written_a_thousand_bytes(fs: &Fs, name: &str) -> (u64, u64) {
    let (e, opened) = fs
        .create(ROOT_INO, name, libc::O_WRONLY)
        .await
        .expect("create");
    fs.write(opened.fh, 0, vec![1u8; 1000].into())
        .await
        .expect("write");
    (e.attr.ino, opened.fh)
}

#[test]
fn a_writer_fenced_by_another_fails_and_stays_failed() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        let (_, fh) = created_with_a_thousand_bytes(fs, "f").await;
        let generation = env
            .client
            .get_object("b", "f")
            .await
            .expect("object")
            .generation;
        let mut other = env
            .client
            .open_appendable("b", "f", generation)
            .await
            .expect("another writer takes the object over");
        other
            .append(vec![2u8; 10].into())
            .await
            .expect("the other writer appends");
        other.flush().await.expect("the other writer persists");
        // Ours learns it was fenced at the latest when it next makes bytes durable.
        let ours = match fs.write(fh, 1000, vec![3u8; 100].into()).await {
            Ok(_) => fs.flush(fh).await,
            Err(e) => Err(e),
        };
        assert_eq!(ours, Err(Errno::EIO));
        assert_eq!(
            fs.flush(fh).await,
            Err(Errno::EIO),
            "a failed writer stays failed"
        );
        assert_eq!(
            fs.write(fh, 1100, vec![4u8; 1].into()).await.map(|_| ()),
            Err(Errno::EIO)
        );
        fs.release_write(fh).await;
        let meta = env.client.get_object("b", "f").await.expect("object");
        assert_eq!(
            meta.size, 1010,
            "the other writer's bytes, none of ours after it"
        );
    });
}

#[test]
fn a_rewrite_in_the_middle_uploads_a_new_generation_at_close() {
    let env = FsEnv::new("b", |_| {});
    env.put("f", &[7u8; 5000]);
    let ino = env.ino("f");
    let fs = &env.fs;
    env.rt.block_on(async {
        let before = env.client.get_object("b", "f").await.expect("f").generation;
        let opened = fs.open_write(ino, false).await.expect("open");
        fs.write(opened.fh, 100, vec![9u8; 10].into())
            .await
            .expect("write in the middle");
        let still = env.client.get_object("b", "f").await.expect("f");
        assert_eq!(
            still.generation, before,
            "staged: the object is untouched until close"
        );
        fs.flush(opened.fh).await.expect("close uploads");
        fs.release_write(opened.fh).await;
        let after = env.client.get_object("b", "f").await.expect("f");
        assert_ne!(after.generation, before);
        assert_eq!(after.size, 5000);
    });
}

/// What a stopping sidecar does: `sync_writes` (a regular sidecar's SIGTERM) makes appended
/// bytes durable but leaves a half-edited staged file to its close; `stop_writes` (the end)
/// makes everything durable, staged edits included, and refuses later writes.
#[test]
fn sync_persists_appends_only_and_stop_persists_all_then_refuses_writes() {
    let env = FsEnv::new("b", |_| {});
    env.put("edit.bin", &[7u8; 5000]);
    let ino = env.ino("edit.bin");
    let fs = &env.fs;
    env.rt.block_on(async {
        let (_, log) = fs
            .create(ROOT_INO, "log.bin", libc::O_WRONLY)
            .await
            .expect("create");
        fs.write(log.fh, 0, vec![1u8; 3000].into())
            .await
            .expect("append");
        let edit = fs.open_write(ino, false).await.expect("open");
        fs.write(edit.fh, 100, vec![9u8; 10].into())
            .await
            .expect("edit");
        let before = env
            .client
            .get_object("b", "edit.bin")
            .await
            .expect("f")
            .generation;

        fs.sync_writes().await;
        let log_meta = env.client.get_object("b", "log.bin").await.expect("log");
        assert_eq!(log_meta.size, 3000, "appended bytes are durable");
        let still = env.client.get_object("b", "edit.bin").await.expect("f");
        assert_eq!(
            still.generation, before,
            "a half-edited file is not published"
        );

        fs.stop_writes().await;
        let after = env.client.get_object("b", "edit.bin").await.expect("f");
        assert_ne!(after.generation, before, "stopping publishes the edit");
        assert_eq!(
            fs.write(log.fh, 3000, vec![2u8; 1].into())
                .await
                .map(|_| ()),
            Err(Errno::EIO),
            "writes are refused once stopped"
        );
        fs.release_write(log.fh).await;
        fs.release_write(edit.fh).await;
    });
}

/// `echo line >> f` twice: the first handle's stream may still be closing when the second
/// has appended and closed. The size the first stream reports last must not take the file
/// back to it (a reader would miss the second line).
#[test]
fn a_handle_closing_late_does_not_shrink_what_a_later_one_appended() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        // On a loaded machine the first close now and then ends within its first poll, and
        // then the order under test did not happen: a fresh file tries again.
        for attempt in 0..5 {
            let name = format!("a{attempt}.log");
            let (entry, created) = fs
                .create(ROOT_INO, &name, libc::O_WRONLY)
                .await
                .expect("create");
            let ino = entry.attr.ino;
            fs.write(created.fh, 0, b"one\n".to_vec().into())
                .await
                .expect("write");
            fs.flush(created.fh).await.expect("close flushes");
            fs.release_write(created.fh).await;

            // A second writing handle keeps the stream open past the first one's close(2):
            // the release of the last handle ends it.
            let first = fs.open_write(ino, false).await.expect("open");
            let also = fs.open_write(ino, false).await.expect("open");
            fs.write(first.fh, 4, b"two\n".to_vec().into())
                .await
                .expect("append");
            fs.flush(first.fh).await.expect("close flushes");
            fs.release_write(also.fh).await;
            let mut closing = Box::pin(fs.release_write(first.fh));
            if futures::poll!(closing.as_mut()).is_ready() {
                continue;
            }

            let second = fs.open_write(ino, false).await.expect("open again");
            fs.write(second.fh, 8, b"three\n".to_vec().into())
                .await
                .expect("append");
            fs.flush(second.fh).await.expect("close flushes");
            fs.release_write(second.fh).await;
            closing.await;

            assert_eq!(fs.getattr(ino).await.expect("stat").size, 14);
            let meta = env.client.get_object("b", &name).await.expect("object");
            assert_eq!(meta.size, 14);
            return;
        }
        panic!("the first stream's close never waited for the service");
    });
}

/// The close(2) of a file's only writing handle ends its stream, so the release that
/// follows has nothing left to wait for; a descriptor still open on that handle (a dup) that
/// writes on takes the object over, and every byte lands.
#[test]
fn the_close_of_the_only_writing_handle_ends_its_stream_and_a_dup_writes_on() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        let (ino, fh) = closed_with_a_thousand_bytes(fs, "f").await;
        let meta = env.client.get_object("b", "f").await.expect("object");
        assert_eq!(meta.size, 1000, "close returned before the bytes were in");
        // The dup writes on after the first descriptor's close.
        fs.write(fh, 1000, vec![2u8; 100].into())
            .await
            .expect("a write after the close");
        fs.flush(fh).await.expect("the dup's close flushes");
        assert!(
            futures::poll!(Box::pin(fs.release_write(fh))).is_ready(),
            "the release waited for the service: the close left the stream open"
        );
        let stored = in_bucket(&env, "f").await;
        let mut want = vec![1u8; 1000];
        want.extend_from_slice(&[2u8; 100]);
        assert!(
            stored[..] == want[..],
            "the bucket holds {} bytes",
            stored.len()
        );
        assert_eq!(fs.getattr(ino).await.expect("stat").size, 1100);
    });
}

/// A descriptor still open on a handle whose stream a close(2) ended is fenced like the
/// stream would have been: once another writer has appended, or finalized the object, its
/// next write is EIO and the object stays as the other writer left it.
#[test]
fn a_dup_after_the_close_is_fenced_by_a_writer_that_took_over() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        for (name, appends) in [("appended", 10usize), ("finalized", 0)] {
            let (_, fh) = closed_with_a_thousand_bytes(fs, name).await;
            let generation = env
                .client
                .get_object("b", name)
                .await
                .expect("object")
                .generation;
            let mut other = env
                .client
                .open_appendable("b", name, generation)
                .await
                .expect("another writer takes the object over");
            if appends > 0 {
                other
                    .append(vec![2u8; appends].into())
                    .await
                    .expect("append");
                other.flush().await.expect("persisted");
            } else {
                other.finalize().await.expect("finalized");
            }
            assert_eq!(
                fs.write(fh, 1000, vec![3u8; 100].into()).await,
                Err(Errno::EIO),
                "{name}"
            );
            fs.release_write(fh).await;
            let meta = env.client.get_object("b", name).await.expect("object");
            assert_eq!(
                (meta.size, meta.finalized),
                (1000 + appends as u64, appends == 0),
                "{name}: the other writer's object, none of our bytes after"
            );
        }
    });
}

/// A create without O_EXCL goes out without waiting for the service (its answer comes with
/// the first flush): whatever happens before that answer, a flushed file is in the bucket
/// with exactly its bytes, under the inode the kernel was given, and readable from it.
#[test]
fn a_create_not_yet_answered_is_made_good_by_the_first_flush() {
    let env = FsEnv::new("b", |_| {});
    env.put("old", b"the old bytes");
    let fs = &env.fs;
    env.rt.block_on(async {
        // Nothing written: close alone must leave the object (`touch`).
        let (e, empty) = fs
            .create(ROOT_INO, "empty", libc::O_WRONLY)
            .await
            .expect("create");
        assert_eq!(fs.getattr(e.attr.ino).await.expect("attr").size, 0);
        fs.flush(empty.fh).await.expect("flush");
        fs.release_write(empty.fh).await;
        assert_eq!(
            env.client
                .get_object("b", "empty")
                .await
                .expect("object")
                .size,
            0
        );

        // Replacing an object the mount knows, then reading the new bytes through the inode
        // the create gave (not the old version's).
        let old = fs.lookup(ROOT_INO, "old").await.expect("old").attr;
        let (e, w) = fs
            .create(ROOT_INO, "old", libc::O_RDWR)
            .await
            .expect("create");
        assert_ne!(e.attr.ino, old.ino, "a new version, a new inode");
        assert_eq!(e.attr.size, 0, "not the old version's size");
        fs.write(w.fh, 0, b"new".to_vec().into())
            .await
            .expect("write");
        fs.flush(w.fh).await.expect("flush");
        assert_eq!(
            fs.lookup(ROOT_INO, "old").await.expect("lookup").attr.ino,
            e.attr.ino
        );
        let r = fs.open(e.attr.ino, false, false).await.expect("open");
        assert_eq!(&fs.read(r.fh, 0, 100).await.expect("read")[..], b"new");
        fs.release(r.fh);
        fs.release_write(w.fh).await;

        // O_EXCL waits for the service, so it still answers EEXIST itself.
        let excl = fs
            .create(ROOT_INO, "old", libc::O_WRONLY | libc::O_EXCL)
            .await;
        assert_eq!(excl.err(), Some(Errno(libc::EEXIST)));

        // An unlink right after the create deletes what the create made.
        let (_, u) = fs
            .create(ROOT_INO, "gone", libc::O_WRONLY)
            .await
            .expect("create");
        fs.unlink(ROOT_INO, "gone").await.expect("unlink");
        fs.release_write(u.fh).await;
        assert!(
            env.client.get_object("b", "gone").await.is_err(),
            "deleted for good"
        );

        // Streams refused at their open: the create goes out again, then the bytes.
        let refused = env.emu().stats().faults_injected;
        env.emu().set_faults(Faults {
            unavailable_every: Some(2),
            ..Faults::default()
        });
        for n in 0..6u8 {
            let name = format!("f{n}");
            let (_, h) = fs
                .create(ROOT_INO, &name, libc::O_WRONLY)
                .await
                .expect("create");
            fs.write(h.fh, 0, vec![n; 1000 + usize::from(n)].into())
                .await
                .expect("write");
            fs.flush(h.fh).await.expect("flush");
            fs.release_write(h.fh).await;
        }
        env.emu().set_faults(Faults::default());
        assert!(
            env.emu().stats().faults_injected > refused,
            "some creates were refused"
        );
        for n in 0..6u8 {
            let name = format!("f{n}");
            let r = env
                .client
                .open_reader("b", &name, None)
                .await
                .expect("reader");
            assert_eq!(r.metadata().size, 1000 + u64::from(n), "{name}");
        }
    });
}

/// What must find a file at the service waits for its create's answer: a rename onto it (or
/// the create would land after the move and replace what was moved), the removal of its
/// directory (ENOTEMPTY, not a folder deleted under it), the rename of its directory (or it
/// would land under the old name), and an fsync of its directory.
#[test]
fn what_needs_a_created_file_at_the_service_waits_for_its_create() {
    let env = FsEnv::new("b", |_| {});
    env.put("g", b"moved bytes");
    let fs = &env.fs;
    env.rt.block_on(async {
        let f = env.create_unseen(ROOT_INO, "f").await;
        fs.rename(ROOT_INO, "g", ROOT_INO, "f", 0)
            .await
            .expect("rename onto the new file");
        fs.release_write(f).await;
        let r = env.client.open_reader("b", "f", None).await.expect("f");
        assert_eq!(
            r.metadata().size,
            11,
            "the moved object, not the later create"
        );

        let d = fs.mkdir(ROOT_INO, "d").await.expect("mkdir").attr.ino;
        let inner = env.create_unseen(d, "x").await;
        assert_eq!(fs.rmdir(ROOT_INO, "d").await, Err(Errno(libc::ENOTEMPTY)));
        fs.release_write(inner).await;

        let d2 = fs.mkdir(ROOT_INO, "d2").await.expect("mkdir").attr.ino;
        let y = env.create_unseen(d2, "y").await;
        fs.rename(ROOT_INO, "d2", ROOT_INO, "e2", 0)
            .await
            .expect("rename the directory");
        fs.release_write(y).await;
        assert!(
            env.client.get_object("b", "e2/y").await.is_ok(),
            "moved along"
        );
        assert!(
            env.client.get_object("b", "d2/y").await.is_err(),
            "not left behind"
        );

        let h = env.create_unseen(ROOT_INO, "h").await;
        fs.fsyncdir(ROOT_INO).await.expect("fsyncdir");
        assert!(
            env.client.get_object("b", "h").await.is_ok(),
            "in the service once its directory is synced"
        );
        fs.release_write(h).await;
    });
}

/// A file unlinked while open for writing goes on as POSIX has it: its handles write and read
/// a copy nobody else sees, their close succeeds, and no object comes back. A file renamed
/// while open goes on writing under its new name.
#[test]
fn an_open_file_unlinked_or_renamed_goes_on_writing() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        let (_, t) = fs
            .create(ROOT_INO, "tmp", libc::O_RDWR)
            .await
            .expect("create");
        fs.write(t.fh, 0, b"abc".to_vec().into())
            .await
            .expect("write");
        fs.unlink(ROOT_INO, "tmp").await.expect("unlink while open");
        fs.write(t.fh, 3, b"def".to_vec().into())
            .await
            .expect("write after unlink");
        assert_eq!(&fs.read(t.fh, 0, 100).await.expect("read")[..], b"abcdef");
        fs.flush(t.fh).await.expect("close after unlink");
        fs.release_write(t.fh).await;
        assert!(
            env.client.get_object("b", "tmp").await.is_err(),
            "gone for good"
        );

        let (_, a) = fs
            .create(ROOT_INO, "a", libc::O_WRONLY)
            .await
            .expect("create");
        fs.write(a.fh, 0, b"123".to_vec().into())
            .await
            .expect("write");
        fs.rename(ROOT_INO, "a", ROOT_INO, "b", 0)
            .await
            .expect("rename while open");
        fs.write(a.fh, 3, b"456".to_vec().into())
            .await
            .expect("write after rename");
        fs.flush(a.fh).await.expect("close after rename");
        fs.release_write(a.fh).await;
        let r = env.client.open_reader("b", "b", None).await.expect("b");
        assert_eq!(r.metadata().size, 6, "every byte under the new name");
        assert!(
            env.client.get_object("b", "a").await.is_err(),
            "nothing left behind"
        );
    });
}

/// fsync(2) covers the whole file, whichever handle asks: coreutils' `sync FILE` opens the
/// file read-only, and a rewrite staged by another handle must be in the bucket when it
/// returns.
#[test]
fn fsync_through_a_reading_handle_makes_what_the_file_s_writer_wrote_durable() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        let (ino, fh) = created_with_a_thousand_bytes(fs, "f").await;
        let reader = fs.open(ino, false, false).await.expect("open");
        // Not an append: staged, and in the bucket only after an fsync or the close.
        fs.write(fh, 0, vec![2u8; 10].into())
            .await
            .expect("rewrite");
        fs.fsync(ino, reader.fh)
            .await
            .expect("fsync of the reading handle");
        let stored = in_bucket(&env, "f").await;
        let mut want = vec![1u8; 1000];
        want[..10].copy_from_slice(&[2u8; 10]);
        assert!(
            stored[..] == want[..],
            "the bucket holds {} bytes starting {:?}, not the rewrite",
            stored.len(),
            &stored[..stored.len().min(12)]
        );
        fs.release(reader.fh);
        fs.release_write(fh).await;
    });
}

/// fsync of a directory answers for the files created in it: a create the service refused
/// fails it, as it fails the file's own flush.
#[test]
fn fsync_of_a_directory_fails_when_a_create_in_it_was_refused() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        // An unfinalized appendable object, which the emulator can refuse to replace.
        let mut other = env
            .client
            .create_appendable("b", "f", None)
            .await
            .expect("create");
        other.append(vec![7u8; 10].into()).await.expect("append");
        other.flush().await.expect("persisted");
        env.emu().set_faults(Faults {
            refuse_replace_unfinalized: true,
            ..Faults::default()
        });
        // A create sent without waiting for its answer: it returns before the refusal.
        let (_, h) = fs
            .create(ROOT_INO, "f", libc::O_WRONLY)
            .await
            .expect("create");
        assert!(
            fs.fsyncdir(ROOT_INO).await.is_err(),
            "the refusal reaches fsync"
        );
        assert!(fs.flush(h.fh).await.is_err(), "and the file's own flush");
        fs.release_write(h.fh).await;
        env.emu().set_faults(Faults::default());
    });
}

/// Writes that keep coming through an open handle while its file is renamed each land
/// before or after the move: none is lost, and the writer goes on under the new name.
#[test]
fn writes_racing_a_rename_of_their_file_all_land_under_the_new_name() {
    let env = FsEnv::new("b", |_| {});
    let fs = env.fs.clone();
    let pieces = 40u64;
    env.rt.block_on(async {
        let (_, fh) = created_with_a_thousand_bytes(&fs, "f").await;
        // Every call takes a millisecond more: many writes come in while the move is on
        // its way.
        env.emu().set_faults(Faults {
            latency_us: 1000,
            ..Faults::default()
        });
        let writer = {
            let fs = fs.clone();
            tokio::spawn(async move {
                for k in 0..pieces {
                    fs.write(fh, 1000 + k * 100, vec![k as u8; 100].into())
                        .await?;
                    // Writes spread over the rename's calls, a millisecond each.
                    tokio::time::sleep(std::time::Duration::from_micros(300)).await;
                }
                Ok::<_, Errno>(())
            })
        };
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        fs.rename(ROOT_INO, "f", ROOT_INO, "g", 0)
            .await
            .expect("rename");
        writer
            .await
            .expect("the writer task")
            .expect("every write succeeds");
        fs.flush(fh).await.expect("flush under the new name");
        fs.release_write(fh).await;
        env.emu().set_faults(Faults::default());
        let stored = in_bucket(&env, "g").await;
        let mut want = vec![1u8; 1000];
        for k in 0..pieces {
            want.extend_from_slice(&[k as u8; 100]);
        }
        assert!(
            stored[..] == want[..],
            "g holds {} bytes, {} were written",
            stored.len(),
            want.len()
        );
    });
}

/// A file created and written here but not flushed yet is not at the service (its create
/// goes out with its first flush): its name and its attributes still come from this mount,
/// with stat and listing TTLs of 0, which would otherwise ask the service every time.
#[test]
fn a_created_file_not_yet_at_the_service_is_found_and_statted_here() {
    let env = FsEnv::new("b", |c| {
        c.fs.stat_ttl_ms = 0;
        c.fs.list_ttl_ms = 0;
    });
    let fs = &env.fs;
    env.rt.block_on(async {
        let (entry, h) = fs
            .create(ROOT_INO, "f", libc::O_WRONLY)
            .await
            .expect("create");
        fs.write(h.fh, 0, b"hello".to_vec().into())
            .await
            .expect("write");
        assert!(
            env.client.get_object("b", "f").await.is_err(),
            "not at the service yet"
        );
        assert_eq!(fs.getattr(entry.attr.ino).await.expect("getattr").size, 5);
        let found = fs.lookup(ROOT_INO, "f").await.expect("lookup");
        assert_eq!((found.attr.ino, found.attr.size), (entry.attr.ino, 5));
        fs.flush(h.fh).await.expect("flush");
        fs.release_write(h.fh).await;
        assert_eq!(env.client.get_object("b", "f").await.expect("f").size, 5);
    });
}

/// A file open for writing in a directory that is renamed goes on writing under the new
/// name, as after a rename of the file itself: the folder's move fenced its stream, and its
/// next flush failed (EIO) with half the bytes stored.
#[test]
fn a_file_open_for_writing_goes_on_when_its_directory_is_renamed() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        let d = fs.mkdir(ROOT_INO, "d").await.expect("mkdir").attr.ino;
        let (_, f) = fs.create(d, "f", libc::O_WRONLY).await.expect("create");
        // Unlinked while open: nothing of it moves, and its handle goes on all the same.
        let (_, tmp) = fs.create(d, "tmp", libc::O_RDWR).await.expect("create");
        fs.write(tmp.fh, 0, b"abc".to_vec().into())
            .await
            .expect("write");
        fs.unlink(d, "tmp").await.expect("unlink while open");
        let first = vec![1u8; 1 << 20];
        fs.write(f.fh, 0, first.clone().into())
            .await
            .expect("write");
        fs.rename(ROOT_INO, "d", ROOT_INO, "e", 0)
            .await
            .expect("rename the directory");
        fs.write(f.fh, 1 << 20, vec![2u8; 1 << 20].into())
            .await
            .expect("write after the rename");
        fs.flush(f.fh).await.expect("close after the rename");
        fs.release_write(f.fh).await;
        fs.write(tmp.fh, 3, b"def".to_vec().into())
            .await
            .expect("write to the unlinked file after the rename");
        assert_eq!(&fs.read(tmp.fh, 0, 100).await.expect("read")[..], b"abcdef");
        fs.flush(tmp.fh).await.expect("close of the unlinked file");
        fs.release_write(tmp.fh).await;
        assert!(env.client.get_object("b", "e/tmp").await.is_err());
        let stored = in_bucket(&env, "e/f").await;
        assert_eq!(stored.len(), 2 << 20, "every byte under the new name");
        assert!(stored[..1 << 20] == first[..] && stored[1 << 20..].iter().all(|&b| b == 2));
        assert!(
            env.client.get_object("b", "d/f").await.is_err(),
            "nothing left behind"
        );
    });
}

/// A file open for writing that a rename replaces goes on as after an unlink: its handle
/// writes and closes without error, and nothing it does reaches the bucket or the name,
/// which now holds the renamed file (its release put its own, older metadata in the
/// directory's listing under that name).
#[test]
fn a_file_replaced_by_a_rename_while_open_goes_on_writing() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        let d = fs.mkdir(ROOT_INO, "d").await.expect("mkdir").attr.ino;
        let (_, old) = fs.create(d, "b", libc::O_WRONLY).await.expect("create");
        fs.write(old.fh, 0, b"old content".to_vec().into())
            .await
            .expect("write");
        let (new, a) = fs.create(d, "a", libc::O_WRONLY).await.expect("create");
        fs.write(a.fh, 0, b"new".to_vec().into())
            .await
            .expect("write");
        fs.flush(a.fh).await.expect("close");
        fs.release_write(a.fh).await;
        fs.rename(d, "a", d, "b", 0).await.expect("rename over");
        // Listed again, then the kernel forgets the renamed file's inode: a later lookup of
        // "b" makes a new one from the listing.
        let renamed = fs.lookup(d, "b").await.expect("b");
        fs.forget(renamed.attr.ino, 1);
        fs.forget(new.attr.ino, 1);
        fs.write(old.fh, 11, b", more".to_vec().into())
            .await
            .expect("write to the replaced file");
        fs.flush(old.fh).await.expect("close of the replaced file");
        fs.release_write(old.fh).await;
        assert_eq!(&in_bucket(&env, "d/b").await[..], b"new");
        let b = fs.lookup(d, "b").await.expect("b");
        assert_eq!(b.attr.size, 3, "the renamed file's size");
        let opened = fs.open(b.attr.ino, false, false).await.expect("open");
        assert_eq!(&fs.read(opened.fh, 0, 100).await.expect("read")[..], b"new");
        fs.release(opened.fh);
    });
}

/// A rename of a file being rewritten moves the object as it was: the rewrite replaces it at
/// the close, never half-edited (a rename once uploaded the staged copy as it stood).
#[test]
fn a_rename_moves_a_file_being_rewritten_as_it_was() {
    let env = FsEnv::new("b", |_| {});
    env.put("f", b"0123456789");
    let fs = &env.fs;
    env.rt.block_on(async {
        let ino = fs.lookup(ROOT_INO, "f").await.expect("f").attr.ino;
        let w = fs.open_write(ino, true).await.expect("open with O_TRUNC");
        fs.write(w.fh, 0, b"abc".to_vec().into())
            .await
            .expect("write");
        fs.rename(ROOT_INO, "f", ROOT_INO, "g", 0)
            .await
            .expect("rename while rewritten");
        assert_eq!(&in_bucket(&env, "g").await[..], b"0123456789");
        fs.flush(w.fh).await.expect("close");
        fs.release_write(w.fh).await;
        assert_eq!(&in_bucket(&env, "g").await[..], b"abc");
    });
}

/// A reader that opens a file being rewritten reads the rewrite as it stands, from its staged
/// copy, and the object stays as it was until the rewrite's close (the open uploaded the
/// copy half-edited, which a crash would then have left in place of the old version).
#[test]
fn a_reader_of_a_file_being_rewritten_reads_the_rewrite_and_uploads_nothing() {
    let env = FsEnv::new("b", |_| {});
    env.put("f", b"0123456789");
    let fs = &env.fs;
    env.rt.block_on(async {
        let ino = fs.lookup(ROOT_INO, "f").await.expect("f").attr.ino;
        let w = fs.open_write(ino, true).await.expect("open with O_TRUNC");
        fs.write(w.fh, 0, b"abc".to_vec().into())
            .await
            .expect("write");
        let r = fs.open(ino, false, false).await.expect("open to read");
        assert_eq!(&fs.read(r.fh, 0, 100).await.expect("read")[..], b"abc");
        assert_eq!(&in_bucket(&env, "f").await[..], b"0123456789");
        fs.write(w.fh, 3, b"def".to_vec().into())
            .await
            .expect("write");
        fs.flush(w.fh).await.expect("close");
        fs.release_write(w.fh).await;
        assert_eq!(&in_bucket(&env, "f").await[..], b"abcdef");
        assert_eq!(&fs.read(r.fh, 0, 100).await.expect("read")[..], b"abcdef");
        fs.release(r.fh);
    });
}

/// A reader of a rewrite that fails (here: it outgrew the staging limit) gets the rewrite's
/// error, not the old version's bytes where the edit's were.
#[test]
fn a_reader_of_a_rewrite_that_failed_gets_its_error() {
    let env = FsEnv::new("b", |cfg| cfg.write.staging_limit_mb = 1);
    env.put("f", b"0123456789");
    let fs = &env.fs;
    env.rt.block_on(async {
        let ino = fs.lookup(ROOT_INO, "f").await.expect("f").attr.ino;
        let w = fs.open_write(ino, true).await.expect("open with O_TRUNC");
        fs.write(w.fh, 0, b"abc".to_vec().into())
            .await
            .expect("write");
        let r = fs.open(ino, false, false).await.expect("open to read");
        assert_eq!(&fs.read(r.fh, 0, 100).await.expect("read")[..], b"abc");
        let too_much = fs.write(w.fh, 3, vec![7u8; 2 << 20].into()).await;
        assert_eq!(too_much.err(), Some(Errno(libc::ENOSPC)));
        assert_eq!(fs.read(r.fh, 0, 100).await, Err(Errno(libc::ENOSPC)));
        fs.release_write(w.fh).await;
        fs.release(r.fh);
        assert_eq!(&in_bucket(&env, "f").await[..], b"0123456789");
    });
}

/// A truncate by path to the size a new file already has, while its create is still on its
/// way (it leaves with the first flush), keeps the file in the listings fetched meanwhile:
/// it took the file out of those that add such files, and a lookup answered ENOENT.
#[test]
fn a_truncate_before_a_create_is_answered_keeps_the_file_listed() {
    let env = FsEnv::new("b", |cfg| {
        cfg.fs.list_ttl_ms = 0;
        cfg.fs.stat_ttl_ms = 0;
        cfg.fs.negative_ttl_ms = 0;
    });
    let fs = &env.fs;
    env.rt.block_on(async {
        let (e, h) = fs
            .create(ROOT_INO, "f", libc::O_WRONLY)
            .await
            .expect("create");
        fs.write(h.fh, 0, vec![5u8; 10].into())
            .await
            .expect("write");
        let same = rapidfs::fs::SetAttr {
            size: Some(10),
            ..Default::default()
        };
        fs.setattr(e.attr.ino, same)
            .await
            .expect("truncate by path");
        let found = fs.lookup(ROOT_INO, "f").await.expect("listed");
        assert_eq!((found.attr.ino, found.attr.size), (e.attr.ino, 10));
        fs.flush(h.fh).await.expect("close");
        fs.release_write(h.fh).await;
        assert_eq!(in_bucket(&env, "f").await.len(), 10);
    });
}

/// An unfinalized object of 1,000 bytes of 7 written by another client, whose stat then
/// lags behind its appends (it says 0 bytes, as the service's metadata can), opened for
/// writing: its inode and handle.
async fn opened_with_a_lagging_stat(env: &FsEnv, name: &str) -> (u64, u64) {
    let mut other = env
        .client
        .create_appendable("b", name, None)
        .await
        .expect("create");
    other.append(vec![7u8; 1000].into()).await.expect("append");
    other.close().await.expect("closed unfinalized");
    env.emu().set_faults(Faults {
        stale_unfinalized_size: true,
        ..Faults::default()
    });
    let ino = env.fs.lookup(ROOT_INO, name).await.expect("found").attr.ino;
    let h = env.fs.open_write(ino, false).await.expect("open");
    (ino, h.fh)
}

/// Closes handle `fh` (which uploads what it staged) and ends the lagging stat.
async fn closed_and_stat_exact(env: &FsEnv, fh: u64) {
    env.fs.flush(fh).await.expect("close uploads");
    env.fs.release_write(fh).await;
    env.emu().set_faults(Faults::default());
}

/// A rewrite of an unfinalized object whose stat lags behind its appends stages the whole
/// object, as its read stream reports it: the lagging size would have cut it short.
#[test]
fn a_rewrite_keeps_the_bytes_a_lagging_stat_leaves_out() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        let (_, fh) = opened_with_a_lagging_stat(&env, "f").await;
        fs.write(fh, 10, vec![2u8; 10].into())
            .await
            .expect("rewrite");
        closed_and_stat_exact(&env, fh).await;
        let mut want = vec![7u8; 1000];
        want[10..20].copy_from_slice(&[2u8; 10]);
        assert!(
            in_bucket(&env, "f").await[..] == want[..],
            "the rewrite lost what the stat left out"
        );
    });
}

/// An O_APPEND write to an unfinalized object whose stat lags behind its appends lands at
/// the object's end, which the takeover learns, not at the size the stat reported: there it
/// would have overwritten the bytes the stat left out.
#[test]
fn an_append_goes_past_what_a_lagging_stat_leaves_out() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        let (ino, fh) = opened_with_a_lagging_stat(&env, "f").await;
        // The offsets a kernel that took the stat's size would choose.
        fs.append(fh, 0, vec![2u8; 10].into())
            .await
            .expect("append");
        fs.append(fh, 10, vec![3u8; 5].into())
            .await
            .expect("append");
        assert_eq!(
            fs.pages_to_drop(),
            [ino],
            "the kernel cached them elsewhere"
        );
        closed_and_stat_exact(&env, fh).await;
        let mut want = vec![7u8; 1000];
        want.extend_from_slice(&[2u8; 10]);
        want.extend_from_slice(&[3u8; 5]);
        assert!(
            in_bucket(&env, "f").await[..] == want[..],
            "the append did not land at the object's end"
        );
    });
}

/// A truncate of an unfinalized object to the size its lagging stat reports is carried
/// out: the object is longer than that.
#[test]
fn a_truncate_to_a_lagging_stat_s_size_is_carried_out() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        let (ino, fh) = opened_with_a_lagging_stat(&env, "f").await;
        fs.setattr(
            ino,
            rapidfs::fs::SetAttr {
                size: Some(0),
                fh: Some(fh),
                ..Default::default()
            },
        )
        .await
        .expect("truncate");
        closed_and_stat_exact(&env, fh).await;
        assert_eq!(in_bucket(&env, "f").await.len(), 0, "not truncated");
    });
}

/// A file written here keeps its size when the service's stat of it lags behind (the
/// stat TTL is 0, so every getattr asks), and a dup that writes on after a close is not
/// taken for overtaken by another writer because of it.
#[test]
fn a_lagging_stat_neither_shrinks_a_file_written_here_nor_fences_its_writer() {
    let env = FsEnv::new("b", |cfg| cfg.fs.stat_ttl_ms = 0);
    let fs = &env.fs;
    env.rt.block_on(async {
        let (ino, fh) = closed_with_a_thousand_bytes(fs, "f").await;
        env.emu().set_faults(Faults {
            stale_unfinalized_size: true,
            ..Faults::default()
        });
        assert_eq!(fs.getattr(ino).await.expect("getattr").size, 1000);
        fs.write(fh, 1000, vec![3u8; 100].into())
            .await
            .expect("the dup writes on");
        fs.flush(fh).await.expect("close");
        fs.release_write(fh).await;
        assert_eq!(fs.getattr(ino).await.expect("getattr").size, 1100);
        env.emu().set_faults(Faults::default());
        let mut want = vec![1u8; 1000];
        want.extend_from_slice(&[3u8; 100]);
        assert!(in_bucket(&env, "f").await[..] == want[..]);
    });
}

/// An open file unlinked long ago (`tempfile.TemporaryFile`, created with `O_EXCL`) still
/// has its attributes: once the stat TTL is over, asking the service for the name it no
/// longer has would answer ENOENT, and `fstat` or a seek to its end would fail.
#[test]
fn an_open_unlinked_file_keeps_its_attributes_past_the_stat_ttl() {
    let env = FsEnv::new("b", |cfg| cfg.fs.stat_ttl_ms = 1);
    let fs = &env.fs;
    env.rt.block_on(async {
        let (e, t) = fs
            .create(ROOT_INO, "tmp", libc::O_RDWR | libc::O_EXCL)
            .await
            .expect("create");
        fs.write(t.fh, 0, b"abc".to_vec().into())
            .await
            .expect("write");
        fs.unlink(ROOT_INO, "tmp").await.expect("unlink while open");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        assert_eq!(fs.getattr(e.attr.ino).await.expect("getattr").size, 3);
        fs.write(t.fh, 3, b"def".to_vec().into())
            .await
            .expect("write after unlink");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        assert_eq!(fs.getattr(e.attr.ino).await.expect("getattr").size, 6);
        fs.flush(t.fh).await.expect("close after unlink");
        fs.release_write(t.fh).await;
    });
}

/// With `write.finalize_on_close`, the close(2) of a file's only writing handle finalizes it
/// before it returns (the release after it is sent without waiting, too late for a reader
/// that the closer tells to go on), and a dup that writes after it rewrites the finalized
/// object through a staged copy.
#[test]
fn finalize_on_close_finalizes_at_the_close_and_a_dup_rewrites_after_it() {
    let env = FsEnv::new("b", |cfg| cfg.write.finalize_on_close = true);
    let fs = &env.fs;
    env.rt.block_on(async {
        let (_, fh) = closed_with_a_thousand_bytes(fs, "f").await;
        let meta = env.client.get_object("b", "f").await.expect("f");
        assert!(meta.finalized, "finalized by the close");
        assert_eq!(meta.size, 1000);
        fs.write(fh, 1000, vec![3u8; 100].into())
            .await
            .expect("the dup writes on");
        fs.flush(fh).await.expect("close");
        fs.release_write(fh).await;
        let mut want = vec![1u8; 1000];
        want.extend_from_slice(&[3u8; 100]);
        assert!(in_bucket(&env, "f").await[..] == want[..]);
    });
}
