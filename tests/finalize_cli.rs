//! `rapidfs unfinalized` and `rapidfs finalize` against a real crash: the `rapidfs` binary
//! mounts the emulator of this test, writes and fsyncs a file, and is killed with SIGKILL;
//! the object it leaves is unfinalized. The BUCKET form and the MOUNTPOINT/PATH forms (on a
//! new mount, which tells its bucket and endpoint through its control socket) list it,
//! finalize makes it a finished object with the same bytes.

mod daemon_support;
mod mount_support;
mod write_support;

use daemon_support::{kill, Daemon};
use mount_support::Env;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};
use write_support::{bytes, chunks, client, meta, MIB};

const BUCKET: &str = "fin";

fn daemon(env: &Env, mnt: &Path) -> Daemon {
    daemon_support::daemon(&env.emu().endpoint(), BUCKET, mnt, &[])
}

fn rapidfs(env: &Env, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .args(args)
        .args(["--endpoint", &env.emu().endpoint()])
        .output()
        .expect("rapidfs runs")
}

/// Without `--endpoint`: the mount's control socket must tell it.
fn rapidfs_in_mount(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .args(args)
        .output()
        .expect("rapidfs runs")
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn an_object_left_by_a_killed_writer_is_listed_and_finalized() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "done.bin", b"finalized already");
    let c = client(&env.rt, &env.emu().endpoint());
    let mnt = tempfile::tempdir().expect("tempdir");
    let d = daemon(&env, mnt.path());
    std::fs::create_dir(mnt.path().join("ckpt")).expect("mkdir");
    let mut f = std::fs::File::create(mnt.path().join("ckpt/log.bin")).expect("create");
    f.write_all(&chunks(1, 3)).expect("write");
    f.sync_all().expect("fsync");
    kill(d);
    drop(f);
    assert!(!meta(&env.rt, &c, BUCKET, "ckpt/log.bin").finalized);

    let listed = stdout(&rapidfs(&env, &["unfinalized", BUCKET]));
    assert_eq!(listed, format!("gs://{BUCKET}/ckpt/log.bin\t{}\n", 3 * MIB));
    // Piped into a `head` that has gone: it ends quietly, as a shell shows SIGPIPE.
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let piped = Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .args(["unfinalized", BUCKET, "--endpoint", &env.emu().endpoint()])
        .stdout(writer)
        .output()
        .expect("rapidfs runs");
    assert_eq!(piped.status.code(), Some(128 + libc::SIGPIPE));
    assert_eq!(String::from_utf8_lossy(&piped.stderr), "");

    let d = daemon(&env, mnt.path());
    let mp = mnt.path().to_str().expect("utf-8");
    let file = format!("{mp}/ckpt/log.bin");
    let listed = stdout(&rapidfs_in_mount(&["unfinalized", mp]));
    assert_eq!(listed, format!("{file}\t{}\n", 3 * MIB));
    // A directory inside the mount lists its own objects, shown at their paths.
    let dir = format!("{mp}/ckpt");
    let listed = stdout(&rapidfs_in_mount(&["unfinalized", &dir]));
    assert_eq!(listed, format!("{file}\t{}\n", 3 * MIB));
    let done = stdout(&rapidfs_in_mount(&["finalize", &file]));
    assert_eq!(done, format!("finalized {file} ({} bytes)\n", 3 * MIB));
    let m = meta(&env.rt, &c, BUCKET, "ckpt/log.bin");
    assert!(m.finalized);
    assert_eq!(m.size, 3 * MIB as u64);
    assert!(bytes(&env.rt, &c, BUCKET, "ckpt/log.bin") == chunks(1, 3));
    assert_eq!(stdout(&rapidfs_in_mount(&["unfinalized", mp])), "");
    let again = stdout(&rapidfs(
        &env,
        &["finalize", &format!("gs://{BUCKET}/done.bin")],
    ));
    assert_eq!(
        again,
        format!("gs://{BUCKET}/done.bin was already finalized\n")
    );
    assert!(d.terminate().success());
}

#[test]
fn bad_targets_fail_with_one_line() {
    let env = Env::new(BUCKET);
    for args in [
        &["finalize", "gs://fin/missing"][..],
        &["unfinalized", "/no/such/dir"][..],
        &["finalize", "/tmp"][..],
    ] {
        let o = rapidfs(&env, args);
        assert!(!o.status.success(), "{args:?} fails");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("rapidfs: error:"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// What `rapidfs unfinalized` says on stderr.
fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn what_a_killed_overwrite_left_is_counted_listed_and_deleted() {
    let env = Env::new(BUCKET);
    let old = chunks(2, 1);
    env.put(BUCKET, "ckpt/last.pt", &old);
    let c = client(&env.rt, &env.emu().endpoint());
    let mnt = tempfile::tempdir().expect("tempdir");
    let d = daemon(&env, mnt.path());
    // `torch.save` over last epoch's file: write-only with O_TRUNC streams the new version
    // into an object beside the file, which only the close puts in its place.
    let mut f = std::fs::File::create(mnt.path().join("ckpt/last.pt")).expect("open");
    f.write_all(&chunks(3, 3)).expect("write");
    let names = || {
        let page = env
            .rt
            .block_on(c.list_page(BUCKET, &rapidfs::gcs::ListRequest::default()))
            .expect("list");
        page.objects.into_iter().map(|o| o.name).collect::<Vec<_>>()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let aside = loop {
        if let Some(n) = names().into_iter().find(|n| n != "ckpt/last.pt") {
            break n;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no object beside the file"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    kill(d);
    drop(f);
    assert!(bytes(&env.rt, &c, BUCKET, "ckpt/last.pt") == old);

    let o = rapidfs(&env, &["unfinalized", BUCKET]);
    assert_eq!(stdout(&o), "", "no file is left unfinalized");
    assert!(
        stderr(&o).contains("1 more object of rewrites in progress or interrupted"),
        "{}",
        stderr(&o)
    );
    let listed = stdout(&rapidfs(&env, &["unfinalized", BUCKET, "--leftovers"]));
    let fields: Vec<&str> = listed.trim_end().split('\t').collect();
    assert_eq!(fields[0], format!("gs://{BUCKET}/{aside}"), "{listed}");
    assert_eq!(fields[3], "appendable", "{listed}");
    // A day has not gone by: the default age keeps it.
    let kept = stdout(&rapidfs(
        &env,
        &["unfinalized", BUCKET, "--delete-leftovers"],
    ));
    assert_eq!(kept, "");
    assert_eq!(names().len(), 2);
    let deleted = stdout(&rapidfs(
        &env,
        &[
            "unfinalized",
            BUCKET,
            "--delete-leftovers",
            "--older-than-hours",
            "0",
        ],
    ));
    assert!(
        deleted.starts_with(&format!("deleted gs://{BUCKET}/{aside} (")),
        "{deleted}"
    );
    assert_eq!(names(), ["ckpt/last.pt"]);
    assert!(bytes(&env.rt, &c, BUCKET, "ckpt/last.pt") == old);
}
