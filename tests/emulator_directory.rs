//! The directory backend: an existing tree served as buckets, changes on disk noticed,
//! metadata surviving a restart (generations, unfinalized state), persisted size only for
//! fsynced bytes while it runs (after a restart, an unfinalized object is as long as its
//! file), folders as directories, and names that would escape the root refused.

mod emulator_support;

use bytes::Bytes;
use emulator_support::*;
use rapidfs::proto::control::{CreateFolderRequest, DeleteFolderRequest, RenameFolderRequest};
use rapidfs::proto::storage::storage_client::StorageClient;
use rapidfs::proto::storage::{
    DeleteObjectRequest, GetObjectRequest, ListObjectsRequest, MoveObjectRequest, Object,
};
use std::time::Duration;
use tonic::Code;

async fn get(
    c: &mut rapidfs::proto::storage::storage_client::StorageClient<tonic::transport::Channel>,
    bucket: &str,
    name: &str,
) -> Result<Object, tonic::Status> {
    c.get_object(routed(
        bucket,
        GetObjectRequest {
            bucket: bpath(bucket),
            object: name.into(),
            ..Default::default()
        },
    ))
    .await
    .map(|r| r.into_inner())
}

async fn names(
    c: &mut rapidfs::proto::storage::storage_client::StorageClient<tonic::transport::Channel>,
    bucket: &str,
) -> Vec<String> {
    c.list_objects(routed(
        bucket,
        ListObjectsRequest {
            parent: bpath(bucket),
            ..Default::default()
        },
    ))
    .await
    .unwrap()
    .into_inner()
    .objects
    .into_iter()
    .map(|o| o.name)
    .collect()
}

/// Moves `from` to `to` in bucket "b".
async fn move_in_b(
    c: &mut rapidfs::proto::storage::storage_client::StorageClient<tonic::transport::Channel>,
    from: &str,
    to: &str,
) -> Result<Object, tonic::Status> {
    c.move_object(routed(
        "b",
        MoveObjectRequest {
            bucket: bpath("b"),
            source_object: from.into(),
            destination_object: to.into(),
            ..Default::default()
        },
    ))
    .await
    .map(|r| r.into_inner())
}

/// What a lookup's probe of `name` in bucket "b" finds: (objects, prefixes).
async fn probe(
    c: &mut rapidfs::proto::storage::storage_client::StorageClient<tonic::transport::Channel>,
    name: &str,
) -> (Vec<String>, Vec<String>) {
    let r = c
        .list_objects(routed(
            "b",
            ListObjectsRequest {
                parent: bpath("b"),
                prefix: name.into(),
                delimiter: "/".into(),
                lexicographic_start: name.into(),
                lexicographic_end: format!("{name}0"),
                include_folders_as_prefixes: true,
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    (r.objects.into_iter().map(|o| o.name).collect(), r.prefixes)
}

#[tokio::test]
async fn serves_an_existing_tree_and_notices_changes_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("data/sub")).unwrap();
    std::fs::create_dir_all(dir.path().join(".hidden")).unwrap();
    std::fs::write(dir.path().join("data/a.txt"), b"alpha").unwrap();
    std::fs::write(dir.path().join("data/sub/b.bin"), pattern(3 << 20, 1)).unwrap();
    let emu = directory(dir.path()).await;
    let mut c = client(&emu).await;
    assert_eq!(names(&mut c, "data").await, ["a.txt", "sub/b.bin"]);
    assert_eq!(
        read_all(&mut c, "data", "sub/b.bin").await,
        pattern(3 << 20, 1)[..]
    );
    let e = get(&mut c, ".hidden", "x").await.unwrap_err();
    assert_eq!(
        e.code(),
        Code::InvalidArgument,
        "hidden directories are not buckets"
    );
    let g1 = get(&mut c, "data", "a.txt").await.unwrap().generation;
    assert_eq!(
        get(&mut c, "data", "a.txt").await.unwrap().generation,
        g1,
        "stable"
    );

    // Changed, added and removed behind the emulator's back.
    std::fs::write(dir.path().join("data/a.txt"), b"alpha, longer").unwrap();
    std::fs::write(dir.path().join("data/new.txt"), b"new").unwrap();
    std::fs::remove_file(dir.path().join("data/sub/b.bin")).unwrap();
    let o = get(&mut c, "data", "a.txt").await.unwrap();
    assert!(o.generation > g1, "a changed file is a new generation");
    assert_eq!(o.size, 13);
    assert_eq!(read_all(&mut c, "data", "a.txt").await, b"alpha, longer");
    assert_eq!(names(&mut c, "data").await, ["a.txt", "new.txt"]);
    assert_eq!(
        get(&mut c, "data", "sub/b.bin").await.unwrap_err().code(),
        Code::NotFound
    );
    // Same size, new mtime: a new generation too.
    let g2 = o.generation;
    tokio::time::sleep(Duration::from_millis(20)).await;
    std::fs::write(dir.path().join("data/a.txt"), b"ALPHA, LONGER").unwrap();
    assert!(get(&mut c, "data", "a.txt").await.unwrap().generation > g2);
    // The metadata directory is not a bucket and not listed.
    assert!(dir.path().join(".rapidfs-emulator").is_dir());
}

/// Drops from the journals under `root` every line that records `name` with a size above 0:
/// what a crash loses of the lines a flush writes without a sync.
fn forget_grown_records(root: &std::path::Path, name: &str) {
    let meta = root.join(".rapidfs-emulator/buckets");
    let mut dropped = 0;
    for entry in std::fs::read_dir(&meta).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "journal") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let kept: Vec<&str> = text
            .lines()
            .filter(|line| {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                let grown = v["name"] == name && v["record"]["size"].as_u64() > Some(0);
                dropped += grown as usize;
                !grown
            })
            .collect();
        std::fs::write(
            &path,
            kept.iter().map(|l| format!("{l}\n")).collect::<String>(),
        )
        .unwrap();
    }
    assert!(
        dropped > 0,
        "no grown record of {name} in {}",
        meta.display()
    );
}

#[tokio::test]
async fn restart_keeps_objects_generations_and_unfinalized_state() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    let data = pattern(3 << 20, 2);
    let (g_put, g_app, handle);
    {
        let emu = directory(dir.path()).await;
        g_put = emu
            .put_object("b", "done/x", Bytes::from_static(b"final"))
            .unwrap();
        let mut c = client(&emu).await;
        let mut w = open_write(&mut c, "b", create_msg("b", "log", Some(0)), true)
            .await
            .unwrap();
        let (o, h) = resource_of(w.first.as_ref().unwrap());
        g_app = o.generation;
        handle = h;
        w.tx.send(data_msg(0, data.slice(..2 << 20))).await.unwrap();
        // Not yet fsynced: not reported, not readable.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(get(&mut c, "b", "log").await.unwrap().size, 0);
        w.tx.send(lookup_msg(2 << 20)).await.unwrap();
        assert_eq!(
            persisted_of(&w.rx.message().await.unwrap().unwrap()),
            2 << 20
        );
        w.half_close();
        assert_eq!(
            persisted_of(&w.rx.message().await.unwrap().unwrap()),
            2 << 20
        );
        emu.shutdown().await;
    }
    // A flush journals the size it synced without a sync of its own: lose those lines, as a
    // crash before any later sync would, and the file alone must give the size back.
    forget_grown_records(dir.path(), "log");
    {
        let emu = directory(dir.path()).await;
        let mut c = client(&emu).await;
        let o = get(&mut c, "b", "done/x").await.unwrap();
        assert_eq!(o.generation, g_put);
        assert!(o.finalize_time.is_some());
        assert_eq!(o.checksums.unwrap().crc32c, Some(crc32c::crc32c(b"final")));
        let o = get(&mut c, "b", "log").await.unwrap();
        assert_eq!(o.generation, g_app);
        assert_eq!(o.size, 2 << 20);
        assert!(
            o.finalize_time.is_none(),
            "still unfinalized after a restart"
        );
        // The flush recorded no metadata: the size and checksum come from the file.
        assert_eq!(
            o.checksums.unwrap().crc32c,
            Some(crc32c::crc32c(&data[..2 << 20]))
        );
        assert_eq!(read_all(&mut c, "b", "log").await, data[..2 << 20]);
        // A reconnect with the old handle works after a restart; then finalize.
        let mut w = open_write(
            &mut c,
            "b",
            append_msg("b", "log", g_app, Some(handle), 2 << 20),
            true,
        )
        .await
        .unwrap();
        assert_eq!(resource_of(w.first.as_ref().unwrap()).0.size, 2 << 20);
        w.tx.send(data_msg(2 << 20, data.slice(2 << 20..)))
            .await
            .unwrap();
        w.tx.send(finish_msg(3 << 20, crc32c::crc32c(&data)))
            .await
            .unwrap();
        w.rx.message().await.unwrap().unwrap();
        emu.shutdown().await;
    }
    let emu = directory(dir.path()).await;
    let mut c = client(&emu).await;
    let o = get(&mut c, "b", "log").await.unwrap();
    assert_eq!((o.generation, o.size), (g_app, 3 << 20));
    assert!(o.finalize_time.is_some());
    assert_eq!(o.checksums.unwrap().crc32c, Some(crc32c::crc32c(&data)));
    assert_eq!(read_all(&mut c, "b", "log").await, data[..]);
    assert_eq!(std::fs::read(dir.path().join("b/log")).unwrap(), data[..]);
}

/// Uploads stored in one step (a mount's small files) are journaled as streamed ones are:
/// after a restart the half-closed one is still appendable at its size and checksum, the
/// finished one final, and both files hold their bytes.
#[tokio::test]
async fn uploads_stored_at_once_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    let (open, done) = (pattern(3_000, 1), pattern(2_000, 2));
    let mut stored = Vec::new();
    {
        let emu = directory(dir.path()).await;
        let mut c = client(&emu).await;
        for (base, data, finish) in [("d/open", &open, false), ("d/done", &done, true)] {
            let (name, answers) = upload_taken_whole(&emu, &mut c, base, data, finish).await;
            let generation = resource_of(&answers[0]).0.generation;
            stored.push((name, data, finish, generation));
        }
        emu.shutdown().await;
    }
    let emu = directory(dir.path()).await;
    let mut c = client(&emu).await;
    for (name, data, finalized, generation) in &stored {
        let (name, finalized, generation) = (name.as_str(), *finalized, *generation);
        let o = get(&mut c, "b", name).await.unwrap();
        assert_eq!(
            (o.generation, o.size),
            (generation, data.len() as i64),
            "{name}"
        );
        assert_eq!(o.finalize_time.is_some(), finalized, "{name}");
        assert_eq!(o.checksums.unwrap().crc32c, Some(crc32c::crc32c(data)));
        assert_eq!(read_all(&mut c, "b", name).await, data[..]);
        assert_eq!(
            std::fs::read(dir.path().join("b").join(name)).unwrap(),
            data[..]
        );
    }
}

/// Creates bucket "b" under `root` with an unfinalized object "log" holding the 9 bytes
/// "old bytes", stops its emulator, and returns the object's generation.
async fn unfinalized_log_then_stop(root: &std::path::Path) -> i64 {
    std::fs::create_dir(root.join("b")).unwrap();
    let emu = directory(root).await;
    let mut c = client(&emu).await;
    let mut w = open_write(&mut c, "b", create_msg("b", "log", Some(0)), true)
        .await
        .unwrap();
    let generation = resource_of(w.first.as_ref().unwrap()).0.generation;
    w.tx.send(data_msg(0, Bytes::from_static(b"old bytes")))
        .await
        .unwrap();
    w.tx.send(lookup_msg(9)).await.unwrap();
    assert_eq!(persisted_of(&w.rx.message().await.unwrap().unwrap()), 9);
    w.half_close();
    w.rx.message().await.unwrap().unwrap();
    emu.shutdown().await;
    generation
}

/// A put over an unfinalized object installs its new file before it journals the new
/// generation. After a crash between the two, the old record meets the new file: its bytes
/// are a new object, not the old object's tail under a checksum that no longer fits.
#[tokio::test]
async fn a_file_installed_over_an_unfinalized_object_is_not_taken_for_its_tail() {
    let dir = tempfile::tempdir().unwrap();
    let g_app = unfinalized_log_then_stop(dir.path()).await;
    // What the put left when the crash came: its file in place, its record never written.
    let new = b"the bytes of a new object, longer than the old";
    let staged = dir.path().join("staged");
    std::fs::write(&staged, new).unwrap();
    std::fs::rename(&staged, dir.path().join("b/log")).unwrap();
    let emu = directory(dir.path()).await;
    let mut c = client(&emu).await;
    let o = get(&mut c, "b", "log").await.unwrap();
    assert_ne!(o.generation, g_app, "the new bytes are a new generation");
    assert_eq!(o.size, new.len() as i64);
    let crc = o.checksums.and_then(|c| c.crc32c);
    assert!(
        crc.is_none_or(|c| c == crc32c::crc32c(new)),
        "a checksum, where given, is that of the bytes served"
    );
    assert_eq!(read_all(&mut c, "b", "log").await, new[..]);
}

/// A root copied or restored elsewhere gives every file a new inode number: an unfinalized
/// object whose file still begins with its bytes stays the same object.
#[tokio::test]
async fn a_copied_unfinalized_object_stays_itself() {
    let dir = tempfile::tempdir().unwrap();
    let g_app = unfinalized_log_then_stop(dir.path()).await;
    // A copy of the file, with a tail written but never synced before the emulator stopped.
    let copied = b"old bytes and a tail";
    let staged = dir.path().join("staged");
    std::fs::write(&staged, copied).unwrap();
    std::fs::rename(&staged, dir.path().join("b/log")).unwrap();
    let emu = directory(dir.path()).await;
    let mut c = client(&emu).await;
    let o = get(&mut c, "b", "log").await.unwrap();
    assert_eq!(o.generation, g_app, "the same object");
    assert!(o.finalize_time.is_none(), "still unfinalized");
    assert_eq!(o.size, copied.len() as i64);
    assert_eq!(
        o.checksums.and_then(|c| c.crc32c),
        Some(crc32c::crc32c(copied))
    );
}

#[tokio::test]
async fn names_escaping_the_root_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    let emu = directory(dir.path()).await;
    emu.put_object("b", "ok", Bytes::from_static(b"x")).unwrap();
    let mut c = client(&emu).await;
    for bad in [
        "../escape",
        "a/../../escape",
        "/abs",
        "a//b",
        "a/./b",
        "trailing/",
        "nul\0",
    ] {
        let e = open_write(&mut c, "b", create_msg("b", bad, None), true)
            .await
            .err();
        assert_eq!(e.map(|e| e.code()), Some(Code::InvalidArgument), "{bad:?}");
        assert!(emu.put_object("b", bad, Bytes::new()).is_err());
    }
    let e = move_in_b(&mut c, "ok", "../../x").await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = get(&mut c, "..", "x").await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(!dir.path().join("escape").exists());
    assert!(!dir.path().parent().unwrap().join("escape").exists());
}

#[tokio::test]
async fn folders_are_directories_and_writes_replace_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    let emu = directory(dir.path()).await;
    let mut ctl = control(&emu).await;
    ctl.create_folder(routed(
        "b",
        CreateFolderRequest {
            parent: bpath("b"),
            folder_id: "x/y/".into(),
            recursive: true,
            ..Default::default()
        },
    ))
    .await
    .unwrap();
    assert!(dir.path().join("b/x/y").is_dir());
    emu.put_object("b", "x/y/f", Bytes::from_static(b"one"))
        .unwrap();
    ctl.rename_folder(routed(
        "b",
        RenameFolderRequest {
            name: format!("{}/folders/x/", bpath("b")),
            destination_folder_id: "z/".into(),
            ..Default::default()
        },
    ))
    .await
    .unwrap();
    assert_eq!(std::fs::read(dir.path().join("b/z/y/f")).unwrap(), b"one");
    let mut c = client(&emu).await;
    assert_eq!(read_all(&mut c, "b", "z/y/f").await, b"one");
    // A reader of the old generation keeps its bytes when the object is replaced.
    let mut s = open_read(&mut c, spec("b", "z/y/f"), vec![]).await.unwrap();
    emu.put_object("b", "z/y/f", Bytes::from_static(b"two!"))
        .unwrap();
    s.tx.send(rapidfs::proto::storage::BidiReadObjectRequest {
        read_object_spec: None,
        read_ranges: vec![range(1, 0, 0)],
    })
    .await
    .unwrap();
    let (got, _) = collect(&mut s, &[1]).await.unwrap();
    assert_eq!(got[&1], b"one");
    assert_eq!(read_all(&mut c, "b", "z/y/f").await, b"two!");
    c.delete_object(routed(
        "b",
        DeleteObjectRequest {
            bucket: bpath("b"),
            object: "z/y/f".into(),
            ..Default::default()
        },
    ))
    .await
    .unwrap();
    assert!(!dir.path().join("b/z/y/f").exists());
    ctl.delete_folder(routed(
        "b",
        DeleteFolderRequest {
            name: format!("{}/folders/z/y/", bpath("b")),
            ..Default::default()
        },
    ))
    .await
    .unwrap();
    assert!(!dir.path().join("b/z/y").exists());
    // An object where a folder is: refused.
    let e = open_write(&mut c, "b", create_msg("b", "z", None), true)
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::FailedPrecondition);
}

#[tokio::test]
async fn listing_shows_directories_as_prefixes_and_empty_ones_as_folders() {
    let dir = tempfile::tempdir().unwrap();
    for d in ["b/a/deep", "b/empty", "b/c"] {
        std::fs::create_dir_all(dir.path().join(d)).unwrap();
    }
    std::fs::write(dir.path().join("b/a/deep/f"), b"1").unwrap();
    std::fs::write(dir.path().join("b/c/g"), b"2").unwrap();
    std::fs::write(dir.path().join("b/top"), b"3").unwrap();
    let emu = directory(dir.path()).await;
    let mut c = client(&emu).await;
    let list = |folders: bool, prefix: &str| ListObjectsRequest {
        parent: bpath("b"),
        prefix: prefix.into(),
        delimiter: "/".into(),
        include_folders_as_prefixes: folders,
        ..Default::default()
    };
    let r = c
        .list_objects(routed("b", list(false, "")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.prefixes, ["a/", "c/"]);
    assert_eq!(
        r.objects
            .iter()
            .map(|o| o.name.as_str())
            .collect::<Vec<_>>(),
        ["top"]
    );
    let r = c
        .list_objects(routed("b", list(true, "")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.prefixes, ["a/", "c/", "empty/"]);
    // A directory made on disk later shows up; one removed disappears.
    std::fs::create_dir(dir.path().join("b/later")).unwrap();
    std::fs::remove_dir(dir.path().join("b/empty")).unwrap();
    let r = c
        .list_objects(routed("b", list(true, "")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.prefixes, ["a/", "c/", "later/"]);
    let r = c
        .list_objects(routed("b", list(true, "a/")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.prefixes, ["a/deep/"]);
}

/// A lookup's probe (a name as the prefix, the range of that name and what is below it, as
/// `rapidfs mount` sends) sees that name as a file or a directory made on disk behind the
/// emulator's back, without reading the rest of the directory; the other names that start
/// with it show up when the directory is listed. A prefix below a file, or one that climbs
/// out of the bucket, finds nothing (and no error).
#[tokio::test]
async fn a_name_probe_looks_at_that_name_on_disk_and_never_outside_the_bucket() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("b")).unwrap();
    std::fs::create_dir_all(dir.path().join("other")).unwrap();
    std::fs::write(dir.path().join("other/secret"), b"s").unwrap();
    let emu = directory(dir.path()).await;
    let mut c = client(&emu).await;
    assert_eq!(probe(&mut c, "f").await, (vec![], vec![]));

    std::fs::write(dir.path().join("b/f"), b"file").unwrap();
    std::fs::write(dir.path().join("b/f.bak"), b"other").unwrap();
    std::fs::create_dir_all(dir.path().join("b/d/e")).unwrap();
    assert_eq!(probe(&mut c, "f").await, (vec!["f".to_string()], vec![]));
    assert_eq!(probe(&mut c, "d").await, (vec![], vec!["d/".to_string()]));
    std::fs::remove_file(dir.path().join("b/f")).unwrap();
    assert_eq!(
        probe(&mut c, "f").await,
        (vec![], vec![]),
        "gone from disk, gone"
    );
    assert_eq!(
        names(&mut c, "b").await,
        ["f.bak"],
        "listed with its directory"
    );
    for below_a_file in ["f.bak/", "f.bak/x"] {
        assert_eq!(probe(&mut c, below_a_file).await, (vec![], vec![]));
    }

    for outside in ["../other/secret", "..", "d/../../other/s"] {
        assert_eq!(probe(&mut c, outside).await, (vec![], vec![]), "{outside}");
    }
    assert_eq!(names(&mut c, "b").await, ["f.bak"]);
}

/// Every object the emulator acknowledged survives a SIGKILL of its process, finalized or
/// still appendable: each change's metadata is in the bucket's journal, fdatasync'd, before
/// the answer leaves, and an appendable object's size is in its synced file.
#[tokio::test]
async fn a_killed_emulator_keeps_every_acknowledged_object() {
    use rapidfs::config::GcsConfig;
    use rapidfs::gcs::Client;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let args = ["--root", root.as_str(), "--listen", "127.0.0.1:0"];
    let connect = |endpoint: String| async move {
        let cfg = GcsConfig {
            endpoint,
            ..GcsConfig::default()
        };
        Client::connect(&cfg).await.unwrap()
    };
    let mut emu = spawn_emulator(&args);
    let c = connect(emu.endpoint.clone()).await;
    let mut sizes = Vec::new();
    for i in 0..200usize {
        let name = format!("ckpt/shard-{i:03}");
        let mut w = c.create_appendable("b", &name, Some(0)).await.unwrap();
        w.append(pattern(1000 + i, i as u8)).await.unwrap();
        let meta = w.finalize().await.unwrap();
        sizes.push((name, meta.size, meta.generation));
    }
    // Small files as a mount uploads them, each whole in one piece (stored in one step).
    let mut raw = StorageClient::connect(emu.endpoint.clone()).await.unwrap();
    let mut whole = Vec::new();
    for i in 0..100usize {
        let name = format!("small/f-{i:03}");
        let data = pattern(2000 + i, i as u8);
        let msgs = whole_upload_msgs("b", &name, &data, i % 2 == 0);
        let answers = upload_at_once(&mut raw, "b", msgs).await.unwrap();
        let generation = resource_of(&answers[0]).0.generation;
        whole.push((name, data, generation, i % 2 == 0));
    }
    let mut open = c.create_appendable("b", "log", Some(0)).await.unwrap();
    open.append(pattern(3 << 20, 9)).await.unwrap();
    assert_eq!(open.flush().await.unwrap(), 3 << 20);
    // SAFETY: signalling our own child.
    assert_eq!(
        unsafe { libc::kill(emu.child.id() as i32, libc::SIGKILL) },
        0
    );
    emu.child.wait().unwrap();
    drop(open);
    drop(c);

    let emu = spawn_emulator(&args);
    let c = connect(emu.endpoint.clone()).await;
    for (name, size, generation) in &sizes {
        let m = c.get_object("b", name).await.unwrap();
        assert_eq!(
            (m.size, m.generation, m.finalized),
            (*size, *generation, true),
            "{name}"
        );
    }
    let mut raw = StorageClient::connect(emu.endpoint.clone()).await.unwrap();
    for (name, data, generation, finished) in &whole {
        let m = c.get_object("b", name).await.unwrap();
        assert_eq!(
            (m.size, m.generation, m.finalized),
            (data.len() as u64, *generation, *finished),
            "{name}"
        );
        assert_eq!(read_all(&mut raw, "b", name).await, data[..], "{name}");
    }
    let log = c.get_object("b", "log").await.unwrap();
    assert_eq!((log.size, log.finalized), (3 << 20, false));
}

/// The epoch of bucket `bucket`'s metadata snapshot under `root`: a new one means the whole
/// bucket's metadata was written again.
fn snapshot_epoch(root: &std::path::Path, bucket: &str) -> u64 {
    let path = root.join(format!(".rapidfs-emulator/buckets/{bucket}.json"));
    let snapshot: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    snapshot["epoch"].as_u64().unwrap()
}

#[tokio::test]
async fn a_move_looks_at_its_two_names_only() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    let emu = directory(dir.path()).await;
    emu.put_object("b", "from", Bytes::from_static(b"moved"))
        .unwrap();
    let epoch = snapshot_epoch(dir.path(), "b");
    // A file put there behind the emulator's back, elsewhere in the bucket: a move that
    // walked the whole bucket found it and wrote every record again.
    std::fs::create_dir(dir.path().join("b/elsewhere")).unwrap();
    std::fs::write(dir.path().join("b/elsewhere/new"), b"unseen").unwrap();
    let mut c = client(&emu).await;
    move_in_b(&mut c, "from", "to").await.unwrap();
    assert_eq!(read_all(&mut c, "b", "to").await, b"moved"[..]);
    assert_eq!(snapshot_epoch(dir.path(), "b"), epoch);
    assert_eq!(names(&mut c, "b").await, ["elsewhere/new", "to"]);
}

#[tokio::test]
async fn a_move_onto_a_directory_made_on_disk_is_refused_and_keeps_its_source() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    let emu = directory(dir.path()).await;
    emu.put_object("b", "from", Bytes::from_static(b"kept"))
        .unwrap();
    std::fs::create_dir(dir.path().join("b/to")).unwrap();
    let mut c = client(&emu).await;
    let e = move_in_b(&mut c, "from", "to").await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert_eq!(std::fs::read(dir.path().join("b/from")).unwrap(), b"kept");
    assert_eq!(read_all(&mut c, "b", "from").await, b"kept"[..]);
}

#[tokio::test]
async fn a_folder_name_with_an_empty_segment_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    let emu = directory(dir.path()).await;
    let mut ctl = control(&emu).await;
    for bad in ["a//", "a//b/", "a/b//"] {
        let e = ctl
            .create_folder(routed(
                "b",
                CreateFolderRequest {
                    parent: bpath("b"),
                    folder_id: bad.into(),
                    recursive: true,
                    ..Default::default()
                },
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad:?}: {e}");
    }
}
