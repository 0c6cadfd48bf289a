//! A handle opened read-write reads back what it wrote, through `fs` alone (no kernel, so no
//! page cache to hide a wrong answer): bytes still streaming into the object, bytes past the
//! size the handle opened at, and the staged copy of a rewritten file. A handle that only
//! reads reads what was appended through this mount after it opened (`tail -f` of a log).

mod fs_support;

use fs_support::{pattern, FsEnv};
use rapidfs::fs::ROOT_INO;

const MIB: usize = 1024 * 1024;

#[test]
fn a_created_file_reads_back_its_streaming_appends() {
    let env = FsEnv::new("rw", |_| {});
    let fs = &env.fs;
    env.rt.block_on(async {
        let (_, opened) = fs
            .create(ROOT_INO, "new.bin", libc::O_RDWR)
            .await
            .expect("create");
        let fh = opened.fh;
        let first = pattern(1, MIB + 17);
        fs.write(fh, 0, first.clone().into()).await.expect("write");
        let got = fs.read(fh, 0, first.len() as u32).await.expect("read");
        assert!(
            got[..] == first[..],
            "read {} of {} bytes",
            got.len(),
            first.len()
        );
        let second = pattern(2, 300_000);
        fs.write(fh, first.len() as u64, second.clone().into())
            .await
            .expect("append");
        let got = fs.read(fh, MIB as u64, 300_017).await.expect("read across");
        let mut want = first[MIB..].to_vec();
        want.extend_from_slice(&second);
        assert!(
            got[..] == want[..],
            "read {} of {} bytes",
            got.len(),
            want.len()
        );
        let past_end = fs
            .read(fh, (first.len() + second.len()) as u64, 4096)
            .await
            .expect("read at the end");
        assert!(past_end.is_empty());
        fs.flush(fh).await.expect("close");
        fs.release_write(fh).await;
    });
}

#[test]
fn an_edited_file_reads_back_its_staged_bytes() {
    let env = FsEnv::new("rw", |_| {});
    env.put("old.bin", &pattern(3, 2 * MIB));
    let ino = env.ino("old.bin");
    let fs = &env.fs;
    env.rt.block_on(async {
        let opened = fs.open_write(ino, false).await.expect("open O_RDWR");
        let fh = opened.fh;
        let patch = pattern(4, 1000);
        fs.write(fh, 4096, patch.clone().into())
            .await
            .expect("write");
        let tail = pattern(5, 5000);
        fs.write(fh, 2 * MIB as u64, tail.clone().into())
            .await
            .expect("append");
        let got = fs.read(fh, 0, (2 * MIB + 5000) as u32).await.expect("read");
        let mut want = pattern(3, 2 * MIB);
        want[4096..5096].copy_from_slice(&patch);
        want.extend_from_slice(&tail);
        assert!(
            got[..] == want[..],
            "read {} of {} bytes",
            got.len(),
            want.len()
        );
        fs.flush(fh).await.expect("close");
        fs.release_write(fh).await;
    });
}

#[test]
fn a_taken_over_object_reads_back_the_appends_past_its_old_end() {
    let env = FsEnv::new("rw", |_| {});
    let fs = &env.fs;
    let first = pattern(6, 700_000);
    let more = pattern(7, MIB);
    env.rt.block_on(async {
        let (_, opened) = fs
            .create(ROOT_INO, "log.bin", libc::O_WRONLY)
            .await
            .expect("create");
        fs.write(opened.fh, 0, first.clone().into())
            .await
            .expect("write");
        fs.flush(opened.fh).await.expect("close");
        fs.release_write(opened.fh).await;
    });
    // The object stays appendable (unfinalized): an append at its end takes it over.
    let ino = env.ino("log.bin");
    env.rt.block_on(async {
        let opened = fs.open_write(ino, false).await.expect("open O_RDWR");
        let fh = opened.fh;
        fs.write(fh, first.len() as u64, more.clone().into())
            .await
            .expect("append");
        let got = fs
            .read(fh, 0, (first.len() + more.len()) as u32)
            .await
            .expect("read");
        let mut want = first.clone();
        want.extend_from_slice(&more);
        assert!(
            got[..] == want[..],
            "read {} of {} bytes",
            got.len(),
            want.len()
        );
        fs.flush(fh).await.expect("close");
        fs.release_write(fh).await;
    });
}

/// The kernel shares one inode between the writing and the reading descriptors, so it learns
/// the size the appends make and asks the reading handle for those bytes. A short answer
/// left zeros in its page cache where they are (`tail -f` of a log written through the same
/// mount showed the first line as NUL bytes).
#[test]
fn a_reading_handle_reads_what_was_appended_after_it_opened() {
    let env = FsEnv::new("rw", |_| {});
    let fs = &env.fs;
    let lines: Vec<Vec<u8>> = (0..3).map(|i| format!("line {i}\n").into_bytes()).collect();
    env.rt.block_on(async {
        let (entry, opened) = fs
            .create(ROOT_INO, "train.log", libc::O_WRONLY)
            .await
            .expect("create");
        let writer = opened.fh;
        let reader = fs
            .open(entry.attr.ino, false, false)
            .await
            .expect("open")
            .fh;
        let mut at = 0u64;
        let mut want = Vec::new();
        for line in &lines[..2] {
            fs.write(writer, at, line.clone().into())
                .await
                .expect("append");
            at += line.len() as u64;
            want.extend_from_slice(line);
            let got = fs.read(reader, 0, 4096).await.expect("read");
            assert_eq!(got[..], want[..], "while the writer streams");
        }
        fs.write(writer, at, lines[2].clone().into())
            .await
            .expect("append");
        want.extend_from_slice(&lines[2]);
        fs.flush(writer).await.expect("close");
        fs.release_write(writer).await;
        let got = fs.read(reader, 0, 4096).await.expect("read");
        assert_eq!(got[..], want[..], "once the writer closed");
        fs.release(reader);
    });
}
