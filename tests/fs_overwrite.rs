//! A write-only open with O_TRUNC of an existing file (`torch.save` over last epoch's
//! checkpoint), through `fs` alone against the in-process emulator: the new version streams
//! into an object beside the file's while the file keeps its old version, and replaces it
//! at the close; a reader, a write elsewhere, a rename or an unlink meanwhile each get what
//! they would from a staged rewrite, and nothing is left beside the file.

mod fs_support;

use fs_support::{assert_no_entry, entries, pattern, FsEnv};
use rapidfs::fs::{Errno, ROOT_INO};

/// The bytes of object `name` of bucket "b", as the service holds them.
async fn in_bucket(env: &FsEnv, name: &str) -> Vec<u8> {
    let meta = env.client.get_object("b", name).await.expect("object");
    env.client
        .read_once("b", name, meta.generation, 0, meta.size)
        .await
        .expect("read")
        .to_vec()
}

/// Every object name in bucket "b".
async fn names(env: &FsEnv) -> Vec<String> {
    let page = env
        .client
        .list_page("b", &rapidfs::gcs::ListRequest::default())
        .await
        .expect("list");
    page.objects.into_iter().map(|o| o.name).collect()
}

/// Writes `len` bytes of `pattern(seed, ..)` at `offset` through handle `fh`: the bytes.
async fn wrote(env: &FsEnv, fh: u64, offset: u64, seed: u8, len: usize) -> Vec<u8> {
    let bytes = pattern(seed, len);
    env.fs
        .write(fh, offset, bytes.clone().into())
        .await
        .expect("write");
    bytes
}

/// close(2) of handle `fh`, then its release.
async fn closed(env: &FsEnv, fh: u64) {
    env.fs.flush(fh).await.expect("close");
    env.fs.release_write(fh).await;
}

/// An environment whose bucket holds "f", 1,000 bytes: the bytes.
fn with_a_file() -> (FsEnv, Vec<u8>) {
    let env = FsEnv::new("b", |_| {});
    let old = pattern(1, 1000);
    env.put("f", &old);
    (env, old)
}

/// Reads handle `fh` whole (a file of at most 4 KiB) and checks it holds `want`, `when`.
async fn assert_reads(env: &FsEnv, fh: u64, want: &[u8], when: &str) {
    let got = env.fs.read(fh, 0, 4096).await.expect("read");
    assert_eq!(got[..], want[..], "{when}");
}

/// Opens the existing file `name` for reading: its inode and handle.
async fn opened_to_read(env: &FsEnv, name: &str) -> (u64, u64) {
    let ino = env
        .fs
        .lookup(ROOT_INO, name)
        .await
        .expect("lookup")
        .attr
        .ino;
    (ino, env.fs.open(ino, false, false).await.expect("open").fh)
}

/// Opens the existing file `name` write-only with O_TRUNC: its inode and handle.
async fn truncated(env: &FsEnv, name: &str) -> (u64, u64) {
    let ino = env
        .fs
        .lookup(ROOT_INO, name)
        .await
        .expect("lookup")
        .attr
        .ino;
    let opened = env
        .fs
        .open_write_only(ino, true)
        .await
        .expect("open O_WRONLY|O_TRUNC");
    (ino, opened.fh)
}

#[test]
fn the_new_version_streams_beside_the_old_one_which_it_replaces_at_the_close() {
    let (env, old) = with_a_file();
    let fs = &env.fs;
    env.rt.block_on(async {
        let (ino, fh) = truncated(&env, "f").await;
        assert_eq!(fs.getattr(ino).await.expect("stat").size, 0, "truncated");
        let new = pattern(2, 3 << 20);
        let before = env.emu().stats().bytes_received;
        for (i, piece) in new.chunks(1 << 20).enumerate() {
            fs.write(fh, (i << 20) as u64, piece.to_vec().into())
                .await
                .expect("write");
        }
        // The bytes stream out as they are written, not at the close: the service takes
        // them in while the handle stays open.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while env.emu().stats().bytes_received - before < 2 << 20 {
            assert!(
                std::time::Instant::now() < deadline,
                "only {} bytes reached the service before the close",
                env.emu().stats().bytes_received - before
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(in_bucket(&env, "f").await, old, "the old version stays");
        assert_eq!(fs.getattr(ino).await.expect("stat").size, 3 << 20);
        fs.flush(fh).await.expect("close");
        assert!(in_bucket(&env, "f").await == new);
        fs.release_write(fh).await;
        assert_eq!(names(&env).await, ["f"]);
    });
}

#[test]
fn closed_without_a_write_the_file_is_empty() {
    let (env, _) = with_a_file();
    env.rt.block_on(async {
        let (_, fh) = truncated(&env, "f").await;
        closed(&env, fh).await;
        assert!(in_bucket(&env, "f").await.is_empty());
        assert_eq!(names(&env).await, ["f"]);
    });
}

/// A write that is not an append (`zipfile` patching its headers) or a size change moves
/// what was streamed into a staged copy: the file keeps its old version until the close,
/// then ends as written, and nothing is left beside it.
#[test]
fn a_write_before_the_end_or_a_size_change_stages_and_keeps_the_old_version() {
    let (env, old) = with_a_file();
    let fs = &env.fs;
    env.rt.block_on(async {
        let (_, fh) = truncated(&env, "f").await;
        let mut want = wrote(&env, fh, 0, 2, 100).await;
        fs.write(fh, 10, b"XY".to_vec().into())
            .await
            .expect("write back");
        want[10..12].copy_from_slice(b"XY");
        assert_eq!(in_bucket(&env, "f").await, old, "the old version stays");
        assert_eq!(
            names(&env).await,
            ["f"],
            "the streamed bytes went to the copy"
        );
        closed(&env, fh).await;
        assert_eq!(in_bucket(&env, "f").await, want);

        let (ino, fh) = truncated(&env, "f").await;
        let mut want = wrote(&env, fh, 0, 3, 100).await;
        fs.setattr(
            ino,
            rapidfs::fs::SetAttr {
                size: Some(60),
                fh: Some(fh),
                ..Default::default()
            },
        )
        .await
        .expect("ftruncate");
        want.truncate(60);
        assert_eq!(
            in_bucket(&env, "f").await.len(),
            100,
            "the last version stays"
        );
        closed(&env, fh).await;
        assert_eq!(in_bucket(&env, "f").await, want);
        assert_eq!(names(&env).await, ["f"]);
    });
}

/// A reader that opens the file meanwhile reads what was written (POSIX has the truncation
/// happen at the open); the writer goes on appending after it.
#[test]
fn a_reader_opening_meanwhile_reads_the_new_bytes_and_the_writer_goes_on() {
    let (env, _) = with_a_file();
    let fs = &env.fs;
    env.rt.block_on(async {
        let (ino, fh) = truncated(&env, "f").await;
        let first = wrote(&env, fh, 0, 2, 100).await;
        let r = fs.open(ino, false, false).await.expect("open to read");
        assert_eq!(&fs.read(r.fh, 0, 1000).await.expect("read")[..], &first[..]);
        fs.release(r.fh);
        let second = wrote(&env, fh, 100, 3, 100).await;
        closed(&env, fh).await;
        assert_eq!(in_bucket(&env, "f").await, [first, second].concat());
        assert_eq!(names(&env).await, ["f"]);
    });
}

/// Another client replaced the file meanwhile: the close fails (ESTALE), the other client's
/// version stays, and the new version is not left beside it.
#[test]
fn a_file_replaced_meanwhile_is_not_overwritten() {
    let (env, _) = with_a_file();
    let fs = &env.fs;
    env.rt.block_on(async {
        let (_, fh) = truncated(&env, "f").await;
        wrote(&env, fh, 0, 2, 100).await;
        env.put("f", b"theirs");
        assert_eq!(fs.flush(fh).await, Err(Errno::ESTALE));
        fs.release_write(fh).await;
        assert_eq!(in_bucket(&env, "f").await, b"theirs");
        assert_eq!(names(&env).await, ["f"]);
    });
}

/// A rename while the new version streams moves the file with what was written, and the
/// writer goes on under the new name.
#[test]
fn a_rename_meanwhile_moves_the_new_version() {
    let (env, _) = with_a_file();
    let fs = &env.fs;
    env.rt.block_on(async {
        let (_, fh) = truncated(&env, "f").await;
        let first = wrote(&env, fh, 0, 2, 100).await;
        fs.rename(ROOT_INO, "f", ROOT_INO, "g", 0)
            .await
            .expect("rename");
        let second = wrote(&env, fh, 100, 3, 100).await;
        closed(&env, fh).await;
        assert_no_entry(fs, ROOT_INO, "f").await;
        assert_eq!(in_bucket(&env, "g").await, [first, second].concat());
        assert_eq!(names(&env).await, ["g"]);
    });
}

/// An unlink while the new version streams removes the file; its handle writes on into a
/// copy nobody will see (POSIX), and nothing is left in the bucket.
#[test]
fn an_unlink_meanwhile_leaves_nothing() {
    let (env, _) = with_a_file();
    let fs = &env.fs;
    env.rt.block_on(async {
        let (_, fh) = truncated(&env, "f").await;
        wrote(&env, fh, 0, 2, 100).await;
        fs.unlink(ROOT_INO, "f").await.expect("unlink");
        wrote(&env, fh, 100, 3, 100).await;
        closed(&env, fh).await;
        assert_no_entry(fs, ROOT_INO, "f").await;
        assert!(names(&env).await.is_empty());
    });
}

/// A regular sidecar's SIGTERM (`sync_writes`) makes the streamed bytes durable beside the
/// file but does not publish the new version half-written: the file keeps its old version
/// until the close.
#[test]
fn sync_writes_does_not_publish_a_half_written_new_version() {
    let (env, old) = with_a_file();
    let fs = &env.fs;
    env.rt.block_on(async {
        let (_, fh) = truncated(&env, "f").await;
        let new = wrote(&env, fh, 0, 2, 5000).await;
        fs.sync_writes().await;
        assert_eq!(in_bucket(&env, "f").await, old);
        closed(&env, fh).await;
        assert_eq!(in_bucket(&env, "f").await, new);
    });
}

/// A second handle that opens the file for writing and reading while its new version
/// streams beside it reads that version: it is put in place first.
#[test]
fn a_handle_joining_the_writer_reads_the_new_version() {
    let (env, _) = with_a_file();
    let fs = &env.fs;
    env.rt.block_on(async {
        let (ino, a) = truncated(&env, "f").await;
        let first = wrote(&env, a, 0, 2, 100).await;
        let b = fs.open_write(ino, false).await.expect("open O_RDWR").fh;
        assert_eq!(&fs.read(b, 0, 1000).await.expect("read")[..], &first[..]);
        let second = wrote(&env, a, 100, 3, 100).await;
        fs.flush(a).await.expect("close a");
        fs.release_write(a).await;
        fs.flush(b).await.expect("close b");
        fs.release_write(b).await;
        assert_eq!(in_bucket(&env, "f").await, [first, second].concat());
        assert_eq!(names(&env).await, ["f"]);
    });
}

/// The file this mount wrote last epoch is an unfinalized appendable object; a server that
/// refuses to replace one gets the old generation deleted, then the new version moved in.
#[test]
fn an_unfinalized_file_is_replaced_even_where_the_server_refuses_to_replace_it() {
    let env = FsEnv::new("b", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        let (_, opened) = fs
            .create(ROOT_INO, "f", libc::O_WRONLY)
            .await
            .expect("create");
        fs.write(opened.fh, 0, pattern(1, 1000).into())
            .await
            .expect("write");
        fs.flush(opened.fh).await.expect("close");
        fs.release_write(opened.fh).await;
        let before = env.client.get_object("b", "f").await.expect("f");
        assert!(!before.finalized);
        env.emu().set_faults(rapidfs::emulator::Faults {
            refuse_replace_unfinalized: true,
            ..Default::default()
        });
        let (_, fh) = truncated(&env, "f").await;
        let new = wrote(&env, fh, 0, 2, 3000).await;
        closed(&env, fh).await;
        assert!(
            env.emu().stats().faults_injected >= 1,
            "the move was refused"
        );
        env.emu().set_faults(rapidfs::emulator::Faults::default());
        assert_eq!(in_bucket(&env, "f").await, new);
        assert_eq!(names(&env).await, ["f"]);
    });
}

/// `cmd > file` opens, hands the descriptor over (dup2) and closes the opener's: that close
/// writes nothing yet, and the new version is put in place when the last one goes.
#[test]
fn a_close_before_any_write_leaves_the_writing_to_a_dup() {
    let (env, old) = with_a_file();
    let fs = &env.fs;
    env.rt.block_on(async {
        let (_, fh) = truncated(&env, "f").await;
        fs.flush(fh).await.expect("the opener's close");
        assert_eq!(in_bucket(&env, "f").await, old, "nothing placed yet");
        let new = wrote(&env, fh, 0, 2, 3000).await;
        fs.release_write(fh).await;
        assert_eq!(in_bucket(&env, "f").await, new);
        assert_eq!(names(&env).await, ["f"]);
    });
}

/// Another process's close of an inherited descriptor (a shell redirection's child, after
/// the opener closed without writing) is what ends the writing: it places the new version.
/// While the opener still writes, such a close only makes the new version durable beside it,
/// and leaves a staged rewrite unpublished.
#[test]
fn an_inherited_descriptor_s_close_places_only_once_the_opener_closed() {
    let (env, old) = with_a_file();
    let fs = &env.fs;
    env.rt.block_on(async {
        let (_, fh) = truncated(&env, "f").await;
        let first = wrote(&env, fh, 0, 2, 3000).await;
        fs.flush_inherited(fh).await.expect("a child's close");
        assert_eq!(in_bucket(&env, "f").await, old, "the opener still writes");
        assert_eq!(names(&env).await.len(), 2, "the new version waits beside");
        let rest = wrote(&env, fh, 3000, 3, 1000).await;
        closed(&env, fh).await;
        assert!(in_bucket(&env, "f").await == [first, rest].concat());

        let (_, fh) = truncated(&env, "f").await;
        fs.flush(fh)
            .await
            .expect("the opener's close, before any write");
        let new = wrote(&env, fh, 0, 4, 2000).await;
        fs.flush_inherited(fh).await.expect("the child's close");
        assert_eq!(in_bucket(&env, "f").await, new);
        fs.release_write(fh).await;
        assert_eq!(names(&env).await, ["f"]);

        // A rewrite staged (`zipfile` patching a header) is not uploaded half-edited either.
        let (_, fh) = truncated(&env, "f").await;
        let mut edited = wrote(&env, fh, 0, 5, 100).await;
        fs.write(fh, 0, b"PK".to_vec().into())
            .await
            .expect("write back");
        edited[..2].copy_from_slice(b"PK");
        fs.flush_inherited(fh).await.expect("a child's close");
        assert_eq!(in_bucket(&env, "f").await, new, "the opener still writes");
        closed(&env, fh).await;
        assert_eq!(in_bucket(&env, "f").await, edited);
    });
}

#[test]
fn the_object_streamed_beside_a_file_is_neither_listed_nor_found_nor_creatable() {
    let (env, _) = with_a_file();
    let fs = &env.fs;
    env.rt.block_on(async {
        let (_, fh) = truncated(&env, "f").await;
        let new = wrote(&env, fh, 0, 2, 1 << 20).await;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let aside = loop {
            if let Some(n) = names(&env).await.into_iter().find(|n| n != "f") {
                break n;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no object beside the file"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        };
        assert!(aside.starts_with(".rapidfs-upload-"), "{aside}");
        assert_eq!(
            entries(fs, ROOT_INO).await,
            [("f".to_string(), rapidfs::fs::Kind::File)]
        );
        assert_no_entry(fs, ROOT_INO, &aside).await;
        assert_eq!(
            fs.create(ROOT_INO, &aside, libc::O_WRONLY).await.err(),
            Some(Errno::EINVAL)
        );
        assert_eq!(fs.mkdir(ROOT_INO, &aside).await.err(), Some(Errno::EINVAL));
        closed(&env, fh).await;
        assert!(in_bucket(&env, "f").await == new);
        assert_eq!(names(&env).await, ["f"]);
    });
}

#[test]
fn rmdir_of_a_directory_that_shows_empty_deletes_what_an_upload_left_in_it() {
    let env = FsEnv::new("b", |_| {});
    env.put("e/.rapidfs-upload-fedcba9876543210", b"another");
    env.put("e/kept", b"a file");
    // A finalized one may be the only copy of a file (see `move_into_place`): kept.
    env.put("f/.rapidfs-upload-00000000000000ff", b"moved nowhere");
    let fs = &env.fs;
    env.rt.block_on(async {
        // The new version of a file whose daemon was killed mid-upload: appendable.
        let mut w = env
            .client
            .create_appendable("b", "d/.rapidfs-upload-0123456789abcdef", Some(0))
            .await
            .expect("create");
        w.append(b"half a checkpoint".to_vec().into())
            .await
            .expect("append");
        w.close().await.expect("close");
        let d = fs.lookup(ROOT_INO, "d").await.expect("d").attr.ino;
        assert!(entries(fs, d).await.is_empty());
        fs.rmdir(ROOT_INO, "d").await.expect("rmdir of d");
        assert_no_entry(fs, ROOT_INO, "d").await;
        assert_eq!(
            fs.rmdir(ROOT_INO, "e").await.err(),
            Some(Errno(libc::ENOTEMPTY))
        );
        assert_eq!(
            fs.rmdir(ROOT_INO, "f").await.err(),
            Some(Errno(libc::ENOTEMPTY))
        );
        assert_eq!(
            names(&env).await,
            [
                "e/.rapidfs-upload-fedcba9876543210",
                "e/kept",
                "f/.rapidfs-upload-00000000000000ff"
            ],
            "only d's leftover is deleted"
        );
    });
}

/// A descriptor opened for reading before the file was overwritten through this mount reads
/// the file as the kernel, which keeps one inode for both, knows it: the new bytes, not the
/// old version's at the new size (`cmd > train.log` run again under a `tail -f`).
#[test]
fn a_reader_opened_before_an_overwrite_reads_the_new_version() {
    let (env, _) = with_a_file();
    let fs = &env.fs;
    env.rt.block_on(async {
        let (_, reader) = opened_to_read(&env, "f").await;
        let (_, fh) = truncated(&env, "f").await;
        let new = wrote(&env, fh, 0, 2, 300).await;
        assert_reads(&env, reader, &new, "while the new version is written").await;
        let more = wrote(&env, fh, 300, 3, 200).await;
        closed(&env, fh).await;
        let mut all = new.clone();
        all.extend_from_slice(&more);
        assert_reads(&env, reader, &all, "once it is closed").await;
        assert_eq!(in_bucket(&env, "f").await, all);
        fs.release(reader);
    });
}

/// The same for a rewrite in place (a write before the end stages the file): the reader
/// reads the staged bytes while the rewrite lasts, then the version it uploaded.
#[test]
fn a_reader_opened_before_a_rewrite_reads_the_rewritten_bytes() {
    let (env, old) = with_a_file();
    let fs = &env.fs;
    env.rt.block_on(async {
        let (ino, reader) = opened_to_read(&env, "f").await;
        let fh = fs.open_write(ino, false).await.expect("open O_RDWR").fh;
        let patch = wrote(&env, fh, 100, 4, 50).await;
        let mut want = old.clone();
        want[100..150].copy_from_slice(&patch);
        assert_reads(&env, reader, &want, "while the rewrite lasts").await;
        closed(&env, fh).await;
        assert_reads(&env, reader, &want, "once it is uploaded").await;
        fs.release(reader);
    });
}

/// A read that comes while the writer is busy placing the new version (an fsync in flight)
/// waits for it and reads what it placed: taking the busy writer for an idle one read the
/// old version, which the kernel would then keep.
#[test]
fn a_reader_waits_for_a_new_version_being_placed() {
    let (env, _) = with_a_file();
    let fs = &env.fs;
    env.rt.block_on(async {
        let (ino, reader) = opened_to_read(&env, "f").await;
        let (_, fh) = truncated(&env, "f").await;
        let new = wrote(&env, fh, 0, 2, 300).await;
        env.emu().set_faults(rapidfs::emulator::Faults {
            latency_us: 100_000,
            ..Default::default()
        });
        let placing = tokio::spawn({
            let fs = fs.clone();
            async move { fs.fsync(ino, fh).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        assert!(!placing.is_finished(), "the fsync is still placing");
        let got = fs.read(reader, 0, 4096).await.expect("read");
        env.emu().set_faults(rapidfs::emulator::Faults::default());
        placing.await.expect("join").expect("fsync");
        assert_eq!(got[..], new[..]);
        closed(&env, fh).await;
        fs.release(reader);
    });
}
