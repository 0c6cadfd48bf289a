//! Writes that are not appends, through a real FUSE mount: they go to a local staged copy and
//! are uploaded as a new generation on fsync/close. Each case does the same operations on a
//! local file and on the mount and compares the bytes (the bucket's, over the wire); the old
//! object survives a full staging area and a server that refuses to replace unfinalized
//! objects; a write-only O_TRUNC open streams instead, past the staging limit; Python's zipfile and torch.save produce the same bytes as on a local directory;
//! an fsync through a read-only descriptor uploads what another one staged.

mod mount_support;
mod write_support;

use mount_support::{data, Env};
use rapidfs::emulator::Faults;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use write_support::{bytes, chunk, client, errno_of, meta, MIB};

const BUCKET: &str = "staging";

/// A config whose staging directory lives in `dir`, with `limit_mb` of staging.
fn config(env: &Env, dir: &Path, limit_mb: u64) -> rapidfs::config::Config {
    let mut cfg = env.config();
    cfg.write.staging_dir = dir.join("staging").display().to_string();
    cfg.write.staging_limit_mb = limit_mb;
    cfg
}

#[test]
fn a_streamed_100_mib_file_patched_at_offset_0_equals_the_local_file() {
    let env = Env::new(BUCKET);
    let tmp = tempfile::tempdir().expect("tempdir");
    let m = env.mount(BUCKET, &config(&env, tmp.path(), 1024));
    let c = client(&env.rt, &env.emu().endpoint());
    let local = tmp.path().join("local.bin");
    let patch = data(7, 4096);
    for path in [local.clone(), m.p("big.bin")] {
        let mut f = File::create(&path).expect("create");
        for i in 0..100 {
            f.write_all(&chunk(11, i)).expect("write");
        }
        f.write_at(&patch, 0).expect("pwrite 4 KiB at offset 0");
        drop(f);
    }
    let want = std::fs::read(&local).expect("local");
    let got = bytes(&env.rt, &c, BUCKET, "big.bin");
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the object equals the local file");
    assert!(std::fs::read(m.p("big.bin")).expect("read back") == want);
    let st = std::fs::metadata(m.p("big.bin")).expect("stat");
    assert_eq!(st.len(), 100 * MIB as u64);
    let o = meta(&env.rt, &c, BUCKET, "big.bin");
    assert!(o.finalized, "a staged upload is a finished object");
    assert_eq!(o.crc32c, Some(crc32c::crc32c(&want)));
}

/// fsync(2) through a descriptor opened only to read (what `sync FILE` does) uploads the
/// rewrite another descriptor staged: the whole file is durable when it returns.
#[test]
fn fsync_of_a_read_only_descriptor_uploads_what_another_one_staged() {
    let env = Env::new(BUCKET);
    let tmp = tempfile::tempdir().expect("tempdir");
    let m = env.mount(BUCKET, &config(&env, tmp.path(), 64));
    let c = client(&env.rt, &env.emu().endpoint());
    let mut w = File::create(m.p("f.bin")).expect("create");
    w.write_all(&data(3, 100_000)).expect("write");
    w.sync_all().expect("fsync");
    let r = File::open(m.p("f.bin")).expect("open to read");
    let patch = data(4, 1000);
    w.write_at(&patch, 0).expect("pwrite at offset 0: staged");
    r.sync_all().expect("fsync of the read-only descriptor");
    let mut want = data(3, 100_000);
    want[..1000].copy_from_slice(&patch);
    assert!(
        bytes(&env.rt, &c, BUCKET, "f.bin") == want,
        "the bucket holds the rewrite once fsync returned"
    );
    drop(r);
    drop(w);
}

/// Runs `edit` on a local copy and on the mount's copy of a file that starts as `initial`
/// (a finalized object, or one streamed through the mount), then compares the results.
fn same_as_local(name: &str, initial: &[u8], streamed: bool, edit: impl Fn(&Path)) {
    let env = Env::new(BUCKET);
    let tmp = tempfile::tempdir().expect("tempdir");
    if !streamed {
        env.put(BUCKET, name, initial);
    }
    let m = env.mount(BUCKET, &config(&env, tmp.path(), 64));
    if streamed {
        std::fs::write(m.p(name), initial).expect("stream the initial bytes");
    }
    let c = client(&env.rt, &env.emu().endpoint());
    let local = tmp.path().join(name);
    std::fs::write(&local, initial).expect("local");
    edit(&local);
    edit(&m.p(name));
    let want = std::fs::read(&local).expect("local");
    assert!(
        bytes(&env.rt, &c, BUCKET, name) == want,
        "{name}: the object equals the local file"
    );
    assert!(
        std::fs::read(m.p(name)).expect("read") == want,
        "{name}: read back"
    );
    assert_eq!(
        std::fs::metadata(m.p(name)).expect("stat").len(),
        want.len() as u64
    );
}

#[test]
fn edits_that_are_not_appends_are_staged_and_match_a_local_file() {
    let initial = data(1, 3 * MIB + 123);
    // pwrite inside, then past the end (a hole), through one handle.
    same_as_local("inside.bin", &initial, false, |p| {
        let f = OpenOptions::new().write(true).open(p).expect("open");
        f.write_at(b"patched", 1000).expect("pwrite inside");
        f.write_at(b"tail", 4 * MIB as u64)
            .expect("pwrite past the end");
    });
    // Shorter, then longer, by ftruncate, then an append at the new end.
    same_as_local("cut.bin", &initial, true, |p| {
        let mut f = OpenOptions::new().append(true).open(p).expect("open");
        f.set_len(1000).expect("ftruncate shorter");
        f.set_len(5000).expect("ftruncate longer");
        f.write_all(b"appended").expect("append");
    });
    // truncate(2) by path, no handle open.
    same_as_local("path.bin", &initial, false, |p| {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::truncate(c.as_ptr(), 777) }, 0, "truncate");
    });
    // O_TRUNC of an existing object, then new bytes.
    same_as_local("trunc.bin", &initial, false, |p| {
        std::fs::write(p, b"new content").expect("O_TRUNC + write");
    });
    // An append to a finalized object.
    same_as_local("final.bin", &initial, false, |p| {
        let mut f = OpenOptions::new().append(true).open(p).expect("open");
        f.write_all(&data(2, 100_000))
            .expect("append to a finalized object");
    });
    // A read through the writing handle sees the staged bytes.
    same_as_local("rw.bin", &initial, true, |p| {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .expect("open");
        f.write_at(b"XYZ", 10).expect("pwrite");
        let mut back = [0u8; 5];
        f.read_exact_at(&mut back, 9).expect("read back");
        assert_eq!(&back[1..4], b"XYZ");
    });
}

#[test]
fn a_write_beyond_the_staging_limit_is_enospc_and_the_old_object_stays() {
    let env = Env::new(BUCKET);
    let tmp = tempfile::tempdir().expect("tempdir");
    let old = data(3, MIB);
    env.put(BUCKET, "old.bin", &old);
    let m = env.mount(BUCKET, &config(&env, tmp.path(), 2));
    let c = client(&env.rt, &env.emu().endpoint());
    let before = meta(&env.rt, &c, BUCKET, "old.bin");
    // Read-write: a write-only O_TRUNC open streams, staging nothing (the next test).
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .truncate(true)
        .open(m.p("old.bin"))
        .expect("open O_RDWR|O_TRUNC");
    let mut failed = None;
    for i in 0..3 {
        if let Err(e) = f.write_all(&chunk(4, i)) {
            failed = Some(e.raw_os_error());
            break;
        }
    }
    assert_eq!(
        failed,
        Some(Some(libc::ENOSPC)),
        "the third MiB does not fit"
    );
    assert_eq!(errno_of(f.sync_all()), libc::ENOSPC, "fsync reports it too");
    drop(f);
    let after = meta(&env.rt, &c, BUCKET, "old.bin");
    assert_eq!(after.generation, before.generation, "not replaced");
    assert!(
        bytes(&env.rt, &c, BUCKET, "old.bin") == old,
        "old bytes intact"
    );
    // The space came back: a file within the limit stages fine afterwards.
    let g = OpenOptions::new()
        .write(true)
        .open(m.p("old.bin"))
        .expect("open");
    g.write_at(b"ok", 0).expect("pwrite within the limit");
    drop(g);
    let mut want = old.clone();
    want[..2].copy_from_slice(b"ok");
    assert!(bytes(&env.rt, &c, BUCKET, "old.bin") == want);
}

/// A write-only O_TRUNC open (`open(path, "wb")`, `torch.save` over last epoch's file) of an
/// existing file streams the new version beside the old one instead of staging it: a file
/// far past the staging limit replaces the old one, which stays until the close.
#[test]
fn a_write_only_truncating_open_streams_past_the_staging_limit() {
    let env = Env::new(BUCKET);
    let tmp = tempfile::tempdir().expect("tempdir");
    let old = data(3, MIB);
    env.put(BUCKET, "old.bin", &old);
    let m = env.mount(BUCKET, &config(&env, tmp.path(), 2));
    let c = client(&env.rt, &env.emu().endpoint());
    // What `open(path, "wb")` does to an existing file: O_WRONLY|O_CREAT|O_TRUNC.
    let mut f = File::create(m.p("old.bin")).expect("open O_WRONLY|O_TRUNC");
    let mut want = Vec::new();
    for i in 0..8 {
        let piece = chunk(4, i);
        f.write_all(&piece).expect("write");
        want.extend_from_slice(&piece);
    }
    assert!(
        bytes(&env.rt, &c, BUCKET, "old.bin") == old,
        "the old version stays until the close"
    );
    drop(f);
    assert!(bytes(&env.rt, &c, BUCKET, "old.bin") == want);
    assert!(std::fs::read(m.p("old.bin")).expect("read back") == want);
    let names: Vec<String> = std::fs::read_dir(m.p(""))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["old.bin"], "nothing left beside it");
}

#[test]
fn a_server_that_refuses_to_replace_unfinalized_objects_still_gets_the_new_version() {
    let env = Env::new(BUCKET);
    let tmp = tempfile::tempdir().expect("tempdir");
    let m = env.mount(BUCKET, &config(&env, tmp.path(), 64));
    let c = client(&env.rt, &env.emu().endpoint());
    std::fs::create_dir(m.p("d")).expect("mkdir");
    std::fs::write(m.p("d/log.bin"), data(5, 200_000)).expect("streamed, unfinalized");
    assert!(!meta(&env.rt, &c, BUCKET, "d/log.bin").finalized);
    env.emu().set_faults(Faults {
        refuse_replace_unfinalized: true,
        ..Faults::default()
    });
    let f = OpenOptions::new()
        .write(true)
        .open(m.p("d/log.bin"))
        .expect("open");
    f.write_at(b"HEADER", 0).expect("pwrite");
    drop(f);
    let mut want = data(5, 200_000);
    want[..6].copy_from_slice(b"HEADER");
    assert!(bytes(&env.rt, &c, BUCKET, "d/log.bin") == want);
    assert!(meta(&env.rt, &c, BUCKET, "d/log.bin").finalized);
    let names: Vec<String> = std::fs::read_dir(m.p("d"))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["log.bin"], "no temporary object left behind");
    assert!(
        env.emu().stats().faults_injected >= 1,
        "the refusal happened"
    );
}

/// Python writes a zip archive (entries streamed, so zipfile seeks back to patch their
/// headers) and a torch checkpoint into the directory it is given.
const PY_WRITE: &str = r#"
import sys, zipfile, torch
d = sys.argv[1]
with zipfile.ZipFile(d + "/archive.zip", "w", compression=zipfile.ZIP_DEFLATED) as z:
    for i in range(20):
        info = zipfile.ZipInfo(f"dir/file{i}.txt", date_time=(2024, 1, 2, 3, 4, 5))
        with z.open(info, "w") as f:
            for j in range(50):
                f.write(f"line {j} of file {i}\n".encode() * (i + 1))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
torch.save(model.state_dict(), d + "/model.pt")
"#;

const PY_CHECK: &str = r#"
import sys, zipfile, torch
d = sys.argv[1]
with zipfile.ZipFile(d + "/archive.zip") as z:
    assert z.testzip() is None
    assert len(z.namelist()) == 20
sd = torch.load(d + "/model.pt")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
for k, v in model.state_dict().items():
    assert torch.equal(sd[k], v), k
print("ok")
"#;

fn python(script: &str, dir: &Path) {
    let py = std::env::var("RAPIDFS_PYTHON")
        .expect("RAPIDFS_PYTHON (run the tests through tests/run.sh)");
    let out = Command::new(py)
        .arg("-c")
        .arg(script)
        .arg(dir)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn zipfile_and_torch_save_write_the_same_bytes_as_on_a_local_directory() {
    let env = Env::new(BUCKET);
    let tmp = tempfile::tempdir().expect("tempdir");
    let m = env.mount(BUCKET, &config(&env, tmp.path(), 64));
    let c = client(&env.rt, &env.emu().endpoint());
    let local = tmp.path().join("local");
    std::fs::create_dir(&local).expect("mkdir");
    python(PY_WRITE, &local);
    python(PY_WRITE, &m.path);
    for name in ["archive.zip", "model.pt"] {
        let want = std::fs::read(local.join(name)).expect("local");
        assert!(
            bytes(&env.rt, &c, BUCKET, name) == want,
            "{name}: the object equals the local file"
        );
    }
    python(PY_CHECK, &m.path);
}
